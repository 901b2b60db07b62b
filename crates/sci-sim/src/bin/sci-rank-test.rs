//! A small AM program for the multi-process tests, run by `am_launch::Launcher`.
//!
//! - `sci-rank-test alltoall ROUNDS`: every rank sends ROUNDS Medium requests (and one Long
//!   put) to every rank, checks the echoes and the data, then meets the others at a barrier.
//! - `sci-rank-test perf [ITERS]` (2 ranks; `--ranks 2` outside a launcher self-launches):
//!   the raw two-process floors (am_shm::floor) and, in the same run, the NIC alone (a Short
//!   round trip through `Transport` without the AM core), AM Short and Medium
//!   1 KiB round trips and Long 1 MiB bandwidth; rank 0 prints medians. Set
//!   `SCI_SLOT_SIZE=1152` so a 1 KiB Medium fits a slot.
//! - `sci-rank-test kill DIR`: after a barrier, rank 1 writes `DIR/victim` (time of death, µs
//!   since the epoch) and kills itself with SIGKILL; the others ignore SIGTERM (so the
//!   launcher does not end them before they notice), wait at a barrier, and on `PeerLost`
//!   write `DIR/lost-<rank>` (`<lost rank> <µs since the epoch>`) and exit with code 3.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{SystemTime, UNIX_EPOCH};

use am_core::{AmError, AmKind, Config, HandlerId, Handlers, Node};
use sci_sim::{Sci, SciConfig};

const ECHO: HandlerId = HandlerId(1);
const ECHO_REPLY: HandlerId = HandlerId(2);

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() -> Res {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("alltoall");
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
            std::process::exit(am_launch::self_launch(n, Some("sci"))?);
        }
    }
    let mut job = am_launch::JobInfo::from_env()?;
    if mode == "perf" {
        return perf(job, &args);
    }
    let sci = Sci::connect(&mut job, 1 << 20, SciConfig::from_env()?)?;
    let echoes = Rc::new(Cell::new(0u64));
    let mut h = Handlers::new();
    h.request(ECHO, "echo", AmKind::Medium, |m, tok| {
        let _ = tok.reply_medium(ECHO_REPLY, m.args(), m.payload());
    })?;
    let e = echoes.clone();
    h.reply(ECHO_REPLY, "echo_reply", AmKind::Medium, move |m| {
        let expect: Vec<u8> = (0..m.payload().len())
            .map(|i| (i as u32 ^ m.args()[0]) as u8)
            .collect();
        assert_eq!(m.payload(), &expect[..], "echoed payload");
        e.set(e.get() + 1);
    })?;
    let mut node = Node::new(sci, h, Config::from_env()?)?;
    let (me, n) = (node.rank(), node.size());
    match mode {
        "alltoall" => {
            let rounds: u32 = args.get(1).map_or(Ok(20), |s| s.parse())?;
            for round in 0..rounds {
                for peer in 0..n {
                    let key = round * 1000 + peer;
                    let len = (round as usize * 37) % 900;
                    let data: Vec<u8> = (0..len).map(|i| (i as u32 ^ key) as u8).collect();
                    node.request_medium(peer, ECHO, &[key], &data)?;
                }
            }
            let want = rounds as u64 * n as u64;
            node.wait_until(|| echoes.get() == want)?;
            // A Long put of 64 KiB into the next rank's segment, at our own slot of it.
            let next = (me + 1) % n;
            let data: Vec<u8> = (0..65536).map(|i| (i as u32 * 7 + me) as u8).collect();
            node.put(next, me as usize * 65536, &data)?;
            node.barrier()?;
            let prev = (me + n - 1) % n;
            let want: Vec<u8> = (0..65536).map(|i| (i as u32 * 7 + prev) as u8).collect();
            let at = prev as usize * 65536;
            if node.segment()[at..at + 65536] != want[..] {
                return Err(format!("rank {me}: the put from rank {prev} did not land").into());
            }
            node.barrier()?;
            println!("rank {me}/{n}: ok");
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
                    drop(job);
                    std::process::exit(3);
                }
                other => return Err(format!("rank {me}: expected PeerLost, got {other:?}").into()),
            }
        }
        other => return Err(format!("unknown mode {other:?}").into()),
    }
    drop(node);
    drop(job);
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The NIC alone between the two processes, without the AM core: rank 0 sends a Short
/// request head and polls for the reply; rank 1 replies from inside its receive closure.
/// Rank 0 returns the median round trip in µs.
fn nic_only(sci: &mut Sci, rank: u32, iters: usize) -> Result<f64, Box<dyn std::error::Error>> {
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
            let t = std::time::Instant::now();
            sci.try_send(1, &out(&req[..n]))?;
            while sci.poll_recv(|_, _, _| ())?.is_none() {}
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
    } else {
        let (rep, n) = head(Category::Reply);
        let mut got = 0;
        while got < iters {
            let r = sci.poll_recv(|_, _, tx| tx.try_send(0, &out(&rep[..n])))?;
            if let Some(r) = r {
                r?;
                got += 1;
            }
        }
    }
    Ok(median(v))
}

/// Two-process floors and AM numbers in one run (rank 0 prints).
fn perf(mut job: am_launch::JobInfo, args: &[String]) -> Res {
    use std::time::Instant;
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
    let mut sci = Sci::connect(&mut job, 2 << 20, SciConfig::from_env()?)?;
    let nic_rtt = nic_only(&mut sci, rank, iters)?;
    let count = Rc::new(Cell::new(0u64));
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
    let mut node = Node::new(sci, h, Config::from_env()?)?;
    if rank == 0 {
        let medium = node.limits().max_medium.min(1024);
        let data = vec![5u8; medium];
        let rtt = |node: &mut Node<Sci>, kind: u8| -> Result<f64, AmError> {
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
            "AM Short round trip (sci, 2 processes):   {short:.3} us ({:.2}x floor)",
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
