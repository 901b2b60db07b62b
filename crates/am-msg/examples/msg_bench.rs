//! Measures the message layer on every transport (ranks as two threads of this process):
//! - eager vs rendezvous one-way latency by size, to choose each transport's eager threshold;
//! - sender- vs receiver-initiated rendezvous latency at 64 KiB and 1 MiB;
//! - bandwidth at 1, 16 and 64 MiB against the raw copy floor of this machine.
//!
//! Run with `AM_WAIT=spin` under the timing wrapper:
//! `cargo run --release -p am-msg --example msg_bench -- [transports...] [--quick]`.

use am_core::Local;
use std::time::{Duration, Instant};

use am_core::{Config, HandlerId, Handlers, Node, Transport};
use am_msg::{Messenger, MsgConfig, Rendezvous};

/// Three messengers in one handler table: same node, different protocols.
struct Modes {
    eager: Messenger,
    sender: Messenger,
    receiver: Messenger,
}

fn modes(handlers: &mut Handlers<Local>) -> Modes {
    Modes {
        eager: Messenger::new(
            handlers,
            HandlerId(100),
            MsgConfig::default()
                .eager_threshold(Some(usize::MAX))
                .rendezvous(Rendezvous::Sender),
        )
        .expect("eager messenger"),
        sender: Messenger::new(
            handlers,
            HandlerId(120),
            MsgConfig::default()
                .eager_threshold(Some(0))
                .rendezvous(Rendezvous::Sender),
        )
        .expect("sender messenger"),
        receiver: Messenger::new(
            handlers,
            HandlerId(140),
            MsgConfig::default()
                .eager_threshold(Some(0))
                .rendezvous(Rendezvous::Receiver),
        )
        .expect("receiver messenger"),
    }
}

/// One-way latency (half a round trip) of `len`-byte messages with `m`; rank 1's receive
/// for each round is posted before rank 0 sends (so receiver-initiated can write at once).
/// Median of 5 batches. Rank 0 returns the figure, rank 1 `None`.
fn pingpong<T: Transport>(
    m: &Messenger,
    node: &mut Node<T, Local>,
    len: usize,
    iters: usize,
) -> Option<Duration> {
    let me = node.rank();
    let peer = 1 - me;
    let data: std::sync::Arc<[u8]> = vec![5u8; len].into();
    let mut batches = Vec::new();
    for _ in 0..5 {
        node.barrier().expect("barrier");
        let mut r = Some(m.post_recv(node, Some(peer), 0, 0, len).expect("post"));
        let t = Instant::now();
        for i in 0..iters {
            if me == 0 {
                let s = m.send(node, peer, 0, data.clone()).expect("send");
                m.wait_recv(node, r.take().expect("posted")).expect("recv");
                if i + 1 < iters {
                    r = Some(m.post_recv(node, Some(peer), 0, 0, len).expect("post"));
                }
                m.wait_send(node, s).expect("send done");
            } else {
                m.wait_recv(node, r.take().expect("posted")).expect("recv");
                if i + 1 < iters {
                    r = Some(m.post_recv(node, Some(peer), 0, 0, len).expect("post"));
                }
                let s = m.send(node, peer, 0, data.clone()).expect("send");
                m.wait_send(node, s).expect("send done");
            }
        }
        batches.push(t.elapsed() / (2 * iters as u32));
    }
    batches.sort();
    (me == 0).then(|| batches[2])
}

/// Bytes per second of `len`-byte messages, one at a time, each acknowledged by a 0-byte
/// eager message. Median of 3 batches.
fn bandwidth<T: Transport>(
    m: &Modes,
    node: &mut Node<T, Local>,
    len: usize,
    iters: usize,
) -> Option<f64> {
    let me = node.rank();
    let data: std::sync::Arc<[u8]> = vec![9u8; len].into();
    let mut rates = Vec::new();
    for _ in 0..3 {
        node.barrier().expect("barrier");
        let t = Instant::now();
        for _ in 0..iters {
            if me == 0 {
                let ack = m.eager.post_recv(node, Some(1), 1, 0, 0).expect("post");
                let s = m.receiver.send(node, 1, 0, data.clone()).expect("send");
                m.receiver.wait_send(node, s).expect("sent");
                m.eager.wait_recv(node, ack).expect("ack");
            } else {
                let r = m
                    .receiver
                    .post_recv(node, Some(0), 0, 0, len)
                    .expect("post");
                m.receiver.wait_recv(node, r).expect("recv");
                let s = m.eager.send(node, 0, 1, Vec::new()).expect("ack");
                m.eager.wait_send(node, s).expect("ack sent");
            }
        }
        rates.push((len * iters) as f64 / t.elapsed().as_secs_f64());
    }
    rates.sort_by(f64::total_cmp);
    (me == 0).then(|| rates[1])
}

fn us(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e6)
}

fn run<T: Transport + Send>(name: &str, transports: Vec<T>, quick: bool, big: bool) {
    let out = am_core::run_ranks(transports, |t| {
        let mut handlers = Handlers::local();
        let m = modes(&mut handlers);
        let mut node = Node::new(t, handlers, Config::from_env().expect("config")).expect("node");
        let mut lines = Vec::new();
        let mm = node.max_medium();
        let lat_iters = |len: usize| {
            let base = if quick { 50 } else { 400 };
            (base * 4096 / (len + 4096)).max(8)
        };
        // Eager vs rendezvous by size, up to max_medium.
        let mut sizes: Vec<usize> = (7..=16)
            .flat_map(|p| [1usize << p, 3 << (p - 1)])
            .filter(|&s| s < mm)
            .collect();
        sizes.sort();
        sizes.push(mm);
        // Warm-up: first touches of the rings and segments, lazily started engines.
        for mode in [&m.eager, &m.sender, &m.receiver] {
            pingpong(mode, &mut node, 1024, 200);
        }
        let mut crossover = None;
        let mut last_eager = 0;
        for &len in &sizes {
            let e = pingpong(&m.eager, &mut node, len, lat_iters(len));
            let s = pingpong(&m.sender, &mut node, len, lat_iters(len));
            let r = pingpong(&m.receiver, &mut node, len, lat_iters(len));
            if let (Some(e), Some(s), Some(r)) = (e, s, r) {
                if s < e {
                    crossover.get_or_insert(len);
                } else if crossover.is_none() {
                    last_eager = len;
                }
                lines.push(format!(
                    "{name}\tlatency\t{len}\teager {}\trndv-sender {}\trndv-receiver {}",
                    us(e),
                    us(s),
                    us(r)
                ));
            }
        }
        if node.rank() == 0 {
            lines.push(format!(
                "{name}\tthreshold\tmax_medium {mm}\tlargest size before sender-initiated rendezvous beats eager: {}",
                crossover.map_or(format!("{mm} (eager wins up to max_medium)"), |_| last_eager.to_string())
            ));
        }
        for len in [64 << 10, 1 << 20] {
            let iters = if quick { 20 } else { 100 }.min(lat_iters(len).max(20));
            let s = pingpong(&m.sender, &mut node, len, iters);
            let r = pingpong(&m.receiver, &mut node, len, iters);
            if let (Some(s), Some(r)) = (s, r) {
                lines.push(format!(
                    "{name}\trndv\t{len}\tsender-initiated {} us\treceiver-initiated {} us\tratio {:.2}",
                    us(s),
                    us(r),
                    r.as_secs_f64() / s.as_secs_f64()
                ));
            }
        }
        if big {
            for len in [1 << 20, 16 << 20, 64 << 20] {
                let iters = ((if quick { 64 } else { 512 } << 20) / len).max(2);
                if let Some(bw) = bandwidth(&m, &mut node, len, iters) {
                    lines.push(format!("{name}\tbandwidth\t{len}\t{:.0} MB/s", bw / 1e6));
                }
            }
        }
        node.barrier().expect("barrier");
        lines
    });
    for l in out.into_iter().flatten() {
        println!("{l}");
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut names: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .map(|s| s.as_str())
        .collect();
    if names.is_empty() {
        names = vec!["loopback", "sci", "extoll", "portals", "udp"];
    }
    let seg = (64 << 20) + (1 << 20);
    for &len in &[1usize << 20, 16 << 20, 64 << 20] {
        let iters = ((if quick { 64 } else { 512 } << 20) / len).max(2);
        let mut v: Vec<f64> = (0..3)
            .map(|_| am_shm::floor::copy_bandwidth_threads(len, iters))
            .collect::<Result<_, _>>()?;
        v.sort_by(f64::total_cmp);
        println!("floor\tcopy\t{len}\t{:.0} MB/s", v[1] / 1e6);
    }
    for name in names {
        match name {
            "loopback" => run(
                name,
                am_core::Loopback::cluster(2, am_core::LoopbackConfig::default().segment_size(seg)),
                quick,
                true,
            ),
            "sci" => run(
                name,
                sci_sim::Sci::cluster(2, seg, sci_sim::SciConfig::from_env()?)?,
                quick,
                true,
            ),
            "extoll" => run(
                name,
                extoll_sim::Extoll::cluster(2, seg, extoll_sim::ExtollConfig::from_env()?)?,
                quick,
                true,
            ),
            "portals" => run(
                name,
                portals_sim::Portals::cluster(2, seg, portals_sim::PortalsConfig::from_env()?)?,
                quick,
                true,
            ),
            "udp" => run(
                name,
                transport_udp::Udp::cluster(2, seg, transport_udp::UdpConfig::from_env()?)?,
                quick,
                false,
            ),
            other => anyhow::bail!("unknown transport {other}"),
        }
    }
    Ok(())
}
