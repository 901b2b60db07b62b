//! A small AM program for the multi-process tests and measurements, run by
//! `am_launch::Launcher` (or self-launched with `--ranks N`).
//!
//! - `portals-rank-test alltoall ROUNDS`: every rank sends ROUNDS Medium requests (sizes up
//!   to the Medium limit) to every rank, one Long request per round, checks the echoes, puts
//!   64 KiB into the next rank's segment, then meets the others at a barrier. With
//!   `PORTALS_REQUEST_BUFFER_BYTES` small, this is the "entry disabled, resend" test: it
//!   prints the flow-control counters, and with `--expect-flow-control` fails if this rank
//!   saw no refusal and no disabled entry.
//! - `portals-rank-test kill DIR`: rank 1 dies by SIGKILL after a barrier; the others write
//!   `DIR/lost-<rank>` (`<lost rank> <µs since the epoch>`) on `PeerLost` and exit with 3.
//! - `portals-rank-test perf [ITERS]` (2 ranks): the raw two-process floors (am_shm::floor)
//!   and, in the same run, the NIC alone (Short round trip through `Transport`), AM Short and
//!   Medium round trips and Long 1 MiB bandwidth; rank 0 prints medians and ratios.
//! - `portals-rank-test hot [COUNT] [SIZE]`: rank 0 floods rank 1 with COUNT requests (AM
//!   Short if SIZE is 0, else Medium of SIZE bytes) five times and prints the median rate;
//!   run it under `AM_CREDITS=8` and `AM_CREDITS=dynamic` for the hot-pair comparison.
//! - `portals-rank-test memory`: no job; prints the receive memory per rank for 16, 256 and
//!   1024 ranks under static (`AM_CREDITS`, default 8) and dynamic credits, computed by the
//!   code that sizes the real buffers.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use am_core::{AmError, AmKind, Config, Credits, HandlerId, Handlers, Node};
use portals_sim::{Portals, PortalsConfig};

const ECHO: HandlerId = HandlerId(1);
const ECHO_REPLY: HandlerId = HandlerId(2);
const LONG: HandlerId = HandlerId(3);
const LONG_REPLY: HandlerId = HandlerId(4);

type Res = Result<(), Box<dyn std::error::Error>>;

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

fn pattern(len: usize, key: u32) -> Vec<u8> {
    (0..len).map(|i| (i as u32 ^ key) as u8).collect()
}

fn main() -> Res {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("alltoall");
    if mode == "memory" {
        return memory();
    }
    if mode == "local" {
        return local(&args);
    }
    if mode == "kill" {
        // Registered before anything else, so the launcher's SIGTERM cannot end us early.
        signal_hook::flag::register(
            signal_hook::consts::SIGTERM,
            std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        )?;
    }
    if !am_launch::JobInfo::is_launched() {
        if let Some(i) = args.iter().position(|a| a == "--ranks") {
            let n: u32 = args.get(i + 1).ok_or("--ranks N")?.parse()?;
            std::process::exit(am_launch::self_launch(n, Some("portals"))?);
        }
    }
    let mut job = am_launch::JobInfo::from_env()?;
    match mode {
        "perf" => perf(job, &args),
        "hot" => hot(job, &args),
        _ => {
            let portals = Portals::connect(&mut job, 1 << 20, PortalsConfig::from_env()?)?;
            let r = echo_job(portals, mode, &args);
            drop(job);
            r
        }
    }
}

fn echo_job(portals: Portals, mode: &str, args: &[String]) -> Res {
    let echoes = Rc::new(Cell::new(0u64));
    let mut h = Handlers::new();
    h.request(ECHO, "echo", AmKind::Medium, |m, tok| {
        let _ = tok.reply_medium(ECHO_REPLY, m.args(), m.payload());
    })?;
    let e = echoes.clone();
    h.reply(ECHO_REPLY, "echo_reply", AmKind::Medium, move |m| {
        assert_eq!(
            m.payload(),
            &pattern(m.payload().len(), m.args()[0])[..],
            "echoed payload"
        );
        e.set(e.get() + 1);
    })?;
    h.request(LONG, "long", AmKind::Long, |m, tok| {
        let ok = m.payload() == &pattern(m.payload().len(), m.args()[0])[..];
        let _ = tok.reply_short(LONG_REPLY, &[ok as u32]);
    })?;
    let longs = Rc::new(Cell::new(0u64));
    let l = longs.clone();
    h.reply(LONG_REPLY, "long_reply", AmKind::Short, move |m| {
        assert_eq!(m.args()[0], 1, "the Long payload arrived intact");
        l.set(l.get() + 1);
    })?;
    let mut node = Node::new(portals, h, Config::from_env()?)?;
    let (me, n) = (node.rank(), node.size());
    match mode {
        "alltoall" => {
            let rounds: u32 = args.get(1).map_or(Ok(20), |s| s.parse())?;
            let max = node.limits().max_medium;
            for round in 0..rounds {
                for peer in 0..n {
                    let key = round * 1000 + peer * 7 + me;
                    let len = (round as usize * 37 + peer as usize * 101) % (max + 1);
                    node.request_medium(peer, ECHO, &[key], &pattern(len, key))?;
                }
                // One Long per round into a per-sender area of a rank's segment; the area is
                // reused only after the previous Long's reply (GASNet's rule).
                let peer = (me + round + 1) % n;
                let key = round + 77;
                let len = 1 + (round as usize * 997) % 8192;
                node.request_long(peer, LONG, &[key], &pattern(len, key), me as usize * 8192)?;
                node.wait_until(|| longs.get() == round as u64 + 1)?;
            }
            let want = rounds as u64 * n as u64;
            node.wait_until(|| echoes.get() == want)?;
            node.barrier()?;
            let next = (me + 1) % n;
            let base = 512 * 1024;
            node.put(
                next,
                base + me as usize * 65536 % (512 * 1024),
                &pattern(65536, me),
            )?;
            node.barrier()?;
            let prev = (me + n - 1) % n;
            let at = base + prev as usize * 65536 % (512 * 1024);
            if node.segment()[at..at + 65536] != pattern(65536, prev)[..] {
                return Err(format!("rank {me}: the put from rank {prev} did not land").into());
            }
            node.barrier()?;
            let st = node.transport().stats();
            println!(
                "rank {me}/{n}: ok, {} echoes, {} Longs; flow control: {} puts refused and sent again, {} entry-disabled events, {} buffers re-linked",
                echoes.get(),
                longs.get(),
                st.refused,
                st.disabled,
                st.relinked
            );
            if args.iter().any(|a| a == "--expect-flow-control") && st.refused + st.disabled == 0 {
                return Err(format!("rank {me}: flow control was never exercised").into());
            }
        }
        "kill" => {
            let dir = std::path::PathBuf::from(args.get(1).ok_or("kill DIR")?);
            node.barrier()?;
            if me == 1 {
                std::fs::write(dir.join("victim"), now_us().to_string())?;
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL)?;
            }
            match node.barrier() {
                Err(AmError::PeerLost(r)) => {
                    std::fs::write(dir.join(format!("lost-{me}")), format!("{r} {}", now_us()))?;
                    drop(node);
                    std::process::exit(3);
                }
                other => return Err(format!("rank {me}: expected PeerLost, got {other:?}").into()),
            }
        }
        other => return Err(format!("unknown mode {other:?}").into()),
    }
    drop(node);
    Ok(())
}

fn memory() -> Res {
    let base = PortalsConfig::from_env()?;
    let st = match base.credits {
        Credits::Static(_) => base.credits,
        Credits::Dynamic { .. } => Credits::Static(8),
    };
    let dy = match base.credits {
        Credits::Dynamic { .. } => base.credits,
        Credits::Static(_) => Credits::DYNAMIC,
    };
    println!(
        "receive memory per rank (max message {} B, {} chained request buffers, {} send slots)",
        base.max_message, base.request_buffers, base.send_slots
    );
    println!("ranks  credits         budget  request buffers   event queue   send slots");
    for ranks in [16u32, 256, 1024] {
        for credits in [st, dy] {
            let c = PortalsConfig { credits, ..base };
            let m = c.memory(ranks);
            println!(
                "{ranks:>5}  {:<14} {:>7}  {:>11.2} MiB  {:>8.2} MiB  {:>7.2} MiB",
                credits.to_string(),
                credits.receive_budget(ranks),
                m.receive_buffers as f64 / (1 << 20) as f64,
                m.event_queue as f64 / (1 << 20) as f64,
                m.send_slots as f64 / (1 << 20) as f64,
            );
        }
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The NIC alone between the two processes, without the AM core: rank 0 sends a Short
/// request head and polls for the reply; rank 1 replies from inside its receive closure.
fn nic_only(p: &mut Portals, rank: u32, iters: usize) -> Result<f64, Box<dyn std::error::Error>> {
    use am_core::wire::{Header, MAX_HEAD_LEN};
    use am_core::{Category, Outgoing, Transport, Tx};
    let head = |category| {
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = Header {
            category,
            kind: AmKind::Short,
            system: false,
            handler: 1,
            nargs: 0,
            credit: 0,
            payload_len: 0,
            long_offset: 0,
        }
        .encode(&[], &mut h);
        (h, n)
    };
    fn out(head: &[u8]) -> Outgoing<'_> {
        Outgoing {
            head,
            payload: &[],
            long_offset: None,
        }
    }
    let mut v = Vec::with_capacity(iters);
    if rank == 0 {
        let (req, n) = head(Category::Request);
        for _ in 0..iters {
            let t = Instant::now();
            p.try_send(1, &out(&req[..n]))?;
            while p.poll_recv(|_, _, _| ())?.is_none() {}
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
    } else {
        let (rep, n) = head(Category::Reply);
        let mut got = 0;
        while got < iters {
            if let Some(r) = p.poll_recv(|_, _, tx| tx.try_send(0, &out(&rep[..n])))? {
                r?;
                got += 1;
            }
        }
    }
    Ok(median(v))
}

fn perf_handlers(count: &Rc<Cell<u64>>) -> Result<Handlers, am_core::RegisterError> {
    let mut h = Handlers::new();
    h.request(HandlerId(1), "s", AmKind::Short, |_m, t| {
        let _ = t.reply_short(HandlerId(2), &[]);
    })?;
    let c = count.clone();
    h.reply(HandlerId(2), "rs", AmKind::Short, move |_m| {
        c.set(c.get() + 1)
    })?;
    h.request(HandlerId(3), "m", AmKind::Medium, |m, t| {
        let _ = t.reply_medium(HandlerId(4), &[], m.payload());
    })?;
    let c = count.clone();
    h.reply(HandlerId(4), "rm", AmKind::Medium, move |_m| {
        c.set(c.get() + 1)
    })?;
    h.request(HandlerId(5), "l", AmKind::Long, |_m, _t| {})?;
    h.request(HandlerId(6), "hot_s", AmKind::Short, |_m, _t| {})?;
    h.request(HandlerId(7), "hot_m", AmKind::Medium, |_m, _t| {})?;
    Ok(h)
}

/// Two-process floors and AM numbers in one run (rank 0 prints).
fn perf(mut job: am_launch::JobInfo, args: &[String]) -> Res {
    let iters: usize = args
        .get(1)
        .filter(|a| !a.starts_with('-'))
        .map_or(Ok(20000), |s| s.parse())?;
    let (rank, id) = (job.rank, job.job_id.clone());
    let mut fence = || -> std::io::Result<()> {
        job.kvs
            .as_mut()
            .ok_or_else(|| std::io::Error::other("no kvs"))?
            .fence()
            .map_err(std::io::Error::other)
    };
    let floor_rtt = am_shm::floor::cacheline_pingpong(&id, rank, iters, &mut fence)?;
    let floor_bw = am_shm::floor::copy_bandwidth(&id, rank, 1 << 20, 200, &mut fence)?;
    let mut portals = Portals::connect(&mut job, 2 << 20, PortalsConfig::from_env()?)?;
    let nic_rtt = nic_only(&mut portals, rank, iters)?;
    let count = Rc::new(Cell::new(0u64));
    let mut node = Node::new(portals, perf_handlers(&count)?, Config::from_env()?)?;
    if rank == 0 {
        let medium = node.limits().max_medium;
        let data = vec![5u8; medium];
        let rtt = |node: &mut Node<Portals>, kind: u8| -> Result<f64, AmError> {
            let mut v = Vec::with_capacity(iters);
            for _ in 0..iters {
                let want = count.get() + 1;
                let t = Instant::now();
                if kind == 0 {
                    node.request_short(1, HandlerId(1), &[])?;
                } else {
                    node.request_medium(1, HandlerId(3), &[], &data)?;
                }
                node.wait_until(|| count.get() == want)?;
                v.push(t.elapsed().as_secs_f64() * 1e6);
            }
            Ok(median(v))
        };
        let short = rtt(&mut node, 0)?;
        let med = rtt(&mut node, 1)?;
        let big = vec![9u8; 1 << 20];
        let mut bws = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..40 {
                node.request_long(1, HandlerId(5), &[], &big, 0)?;
            }
            node.quiesce()?;
            bws.push(40.0 * (1u64 << 20) as f64 / t.elapsed().as_secs_f64());
        }
        let long = median(bws);
        let floor = median(floor_rtt.iter().map(|d| d.as_secs_f64() * 1e6).collect());
        println!("floor cache-line ping-pong (2 processes): {floor:.3} us");
        println!(
            "NIC only Short round trip (no AM core):   {nic_rtt:.3} us ({:.2}x floor)",
            nic_rtt / floor
        );
        println!(
            "AM Short round trip (portals):            {short:.3} us ({:.2}x floor)",
            short / floor
        );
        println!("AM Medium {medium} B round trip:             {med:.3} us");
        println!(
            "floor copy 1 MiB (2 processes):           {:.2} GB/s",
            floor_bw / 1e9
        );
        println!(
            "AM Long 1 MiB bandwidth:                  {:.2} GB/s ({:.0}% of floor)",
            long / 1e9,
            100.0 * long / floor_bw
        );
    }
    node.barrier()?;
    drop(node);
    drop(job);
    Ok(())
}

/// Hot pair: rank 0 floods rank 1 with requests; the rate is requests per second until the
/// last reply came back.
fn hot(mut job: am_launch::JobInfo, args: &[String]) -> Res {
    let count_arg: u64 = args.get(1).map_or(Ok(200_000), |s| s.parse())?;
    let size: usize = args.get(2).map_or(Ok(0), |s| s.parse())?;
    let config = PortalsConfig::from_env()?;
    let portals = Portals::connect(&mut job, 1 << 20, config)?;
    let receive = portals.receive_buffer_bytes();
    let count = Rc::new(Cell::new(0u64));
    let mut node = Node::new(portals, perf_handlers(&count)?, Config::from_env()?)?;
    if node.rank() == 0 {
        let data = vec![3u8; size];
        let mut rates = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..count_arg {
                if size == 0 {
                    node.request_short(1, HandlerId(6), &[])?;
                } else {
                    node.request_medium(1, HandlerId(7), &[], &data)?;
                }
            }
            node.quiesce()?;
            rates.push(count_arg as f64 / t.elapsed().as_secs_f64());
        }
        println!(
            "hot pair: {} {} requests, credits {}, held toward rank 1 at the end {}, receive buffers {} KiB/rank: {:.3} M requests/s (median of 5)",
            count_arg,
            if size == 0 { "AM Short".to_string() } else { format!("AM Medium {size} B") },
            config.credits,
            node.credit_policy().held(1),
            receive / 1024,
            median(rates) / 1e6
        );
    }
    node.barrier()?;
    drop(node);
    drop(job);
    Ok(())
}

/// One rank, one thread: the NIC's software cost with every line in the cache (a Short
/// request and its reply through `Transport`, to self), in ns per round trip.
fn local(args: &[String]) -> Res {
    use am_core::wire::{Header, MAX_HEAD_LEN};
    use am_core::{Category, Outgoing, Transport, Tx};
    let iters: usize = args.get(1).map_or(Ok(2_000_000), |s| s.parse())?;
    let mut p = Portals::cluster(1, 4096, PortalsConfig::from_env()?)?
        .pop()
        .ok_or("no rank")?;
    let head = |category| {
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = Header {
            category,
            kind: AmKind::Short,
            system: false,
            handler: 1,
            nargs: 0,
            credit: 0,
            payload_len: 0,
            long_offset: 0,
        }
        .encode(&[], &mut h);
        (h, n)
    };
    let (req, n) = head(Category::Request);
    let (rep, rn) = head(Category::Reply);
    let out = |h: &[u8]| {
        Outgoing {
            head: h,
            payload: &[],
            long_offset: None,
        }
        .len()
    };
    let _ = out;
    let t = Instant::now();
    for _ in 0..iters {
        p.try_send(
            0,
            &Outgoing {
                head: &req[..n],
                payload: &[],
                long_offset: None,
            },
        )?;
        p.poll_recv(|_, _, tx| {
            tx.try_send(
                0,
                &Outgoing {
                    head: &rep[..rn],
                    payload: &[],
                    long_offset: None,
                },
            )
        })?
        .ok_or("no request")??;
        p.poll_recv(|_, _, _| ())?.ok_or("no reply")?;
    }
    println!(
        "local Short round trip through the NIC: {:.1} ns",
        t.elapsed().as_secs_f64() * 1e9 / iters as f64
    );
    Ok(())
}
