//! A small AM program for the multi-process tests, run by `am_launch::Launcher`.
//!
//! - `extoll-rank-test alltoall ROUNDS`: every rank sends ROUNDS Medium requests of 0..8192
//!   bytes (VELO and RMA-buffered, by the configured path) to every rank, checks the echoes,
//!   then one Long put of 64 KiB to the next rank, and checks the data after a barrier.
//! - `extoll-rank-test flood N`: ranks 1.. each fire N Medium requests of 1 KiB at rank 0,
//!   which does not poll until every sender has seen its mailbox full (back-pressure); rank 0
//!   then checks that every request ran exactly once, in order per sender.
//! - `extoll-rank-test mismatch` (3 ranks): rank 1 asks for a larger segment; every rank must
//!   fail start-up with the typed segment-size mismatch.
//! - `extoll-rank-test pending DIR panic|abort|exit|kill` (2 ranks): rank 1 dies that way
//!   while the other has calls and a barrier pending on it; each must fail with a typed error
//!   ([`am_perf::rank::pending_scenario`]).
//! - `extoll-rank-test exit DIR` (4 ranks): rank 2 calls `exit(7)`; the others must end with 7
//!   within 2 s ([`am_perf::rank::exit_scenario`]).
//! - `extoll-rank-test kill DIR`: after a barrier, rank 1 writes `DIR/victim` (time of death,
//!   µs since the epoch) and kills itself with SIGKILL; the others ignore SIGTERM, wait at a
//!   barrier, and on `PeerLost` write `DIR/lost-<rank>` (`<lost rank> <µs>`) and exit with 3.
//!   Rank 0 writes the job id to `DIR/job`.
//! - `extoll-rank-test inproc [ITERS]`: two ranks in one thread, taking turns: ITERS NIC-only
//!   Short round trips (a deterministic workload for `valgrind --tool=callgrind`; no
//!   launcher, no AM core, whose start needs both ranks running).
//! - `extoll-rank-test selfrt nic|am|medium|flood N`: one rank's round trips to itself through the NIC
//!   alone or through the AM core (for callgrind; `am_perf::am::self_round_trips`).
//! - `extoll-rank-test perf [ITERS]` (2 ranks; `--ranks 2` outside a launcher self-launches):
//!   in one run, the raw two-process floors (am_shm::floor), the NIC alone (a Short round trip
//!   without the AM core), AM Short, AM Medium round trips by size over VELO and over RMA
//!   buffers (with the crossover), Long 1 MiB bandwidth, and the one-lock-around-the-NIC cost;
//!   rank 0 prints.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use am_core::{AmKind, Config, HandlerId, Node};
use am_perf::nic::{self, ShortHeads};
use am_perf::rank;
use am_perf::{am, median, median_us};
use extoll_sim::{Extoll, ExtollConfig, MediumPath};

const SINK: HandlerId = HandlerId(3);

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() -> Res {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("alltoall");
    if mode == "selfrt" {
        // One rank, round trips to itself (`selfrt nic|am|medium|flood N`): see am_perf::am::self_round_trips.
        let what = args.get(1).map_or("am", String::as_str);
        let iters: usize = args.get(2).map_or(Ok(100_000), |s| s.parse())?;
        let nic = Extoll::cluster(1, 1 << 16, ExtollConfig::from_env()?)?
            .pop()
            .ok_or("no rank")?;
        let ns = am_perf::am::self_round_trips(nic, what, iters)?;
        println!("selfrt {what}: {ns:.1} ns per round trip");
        return Ok(());
    }
    if rank::is_failure_scenario(mode) {
        // Registered before anything else, so the launcher's SIGTERM cannot end us early.
        rank::ignore_sigterm()?;
    }
    if mode == "inproc" {
        return inproc(&args);
    }
    rank::self_launch_if_asked(&args, "extoll")?;
    let mut job = am_launch::JobInfo::from_env()?;
    if mode == "stall" {
        // Rank 0 holds start-up back until the test says go, so the others sit in the NIC's
        // start-up with their segments created (the test kills one there).
        let dir = std::path::PathBuf::from(args.get(1).ok_or("stall DIR")?);
        rank::stall_before_start(&job, &dir)?;
    }
    if mode == "mismatch" {
        let segment = rank::mismatched_segment(job.rank);
        let got = match Extoll::connect(&mut job, segment, ExtollConfig::from_env()?) {
            Err(extoll_sim::ExtollError::SegmentSizeMismatch { rank, ours, theirs }) => {
                Some((rank, ours, theirs))
            }
            Err(e) => return Err(e.into()),
            Ok(_) => None,
        };
        return rank::expect_segment_mismatch(got);
    }
    if mode == "perf" {
        return perf(job, &args);
    }
    let nic = Extoll::connect(&mut job, 1 << 20, ExtollConfig::from_env()?)?;
    let echoes = Rc::new(Cell::new(0u64));
    let sunk = Rc::new(std::cell::RefCell::new(Vec::<(u32, u32)>::new()));
    let mut h = rank::echo_handlers(&echoes)?;
    let s = sunk.clone();
    h.request(SINK, "sink", AmKind::Medium, move |m, _tok| {
        assert!(m.payload().iter().all(|&b| b == m.args()[1] as u8));
        s.borrow_mut().push((m.src(), m.args()[0]));
    })?;
    let exchanged = rank::exchange_counters(&mut h, mode)?;
    let mut node = Node::new(nic, h, Config::from_env()?)?;
    if rank::is_failure_scenario(mode) {
        return rank::failure_scenario(mode, &args, node, job, &exchanged);
    }
    let (me, n) = (node.rank(), node.size());
    match mode {
        "alltoall" => {
            let rounds: u32 = args.get(1).map_or(Ok(20), |s| s.parse())?;
            rank::echo_rounds(&mut node, &echoes, rounds, |round, peer| {
                (round as usize * 1237 + peer as usize * 301) % 8193
            })?;
            rank::put_ring(
                &mut node,
                |r| r as usize * 65536,
                |r| (0..65536).map(|i| (i as u32 * 7 + r) as u8).collect(),
            )?;
            println!("rank {me}/{n}: ok");
        }
        "flood" => {
            let per: u32 = args.get(1).map_or(Ok(200), |s| s.parse())?;
            let mailbox = node.transport().config().mailbox_slots;
            let payload_for = |k: u32| vec![(k % 251) as u8; 1024];
            node.barrier()?;
            if me == 0 {
                // Not polling: the senders must run into a full mailbox. Each tells us so by
                // a file, so the wait is for an event, not a guess of time.
                let dir = std::path::PathBuf::from(args.get(2).ok_or("flood N DIR")?);
                let deadline = Instant::now() + std::time::Duration::from_secs(20);
                while (1..n).any(|r| !dir.join(format!("busy-{r}")).exists()) {
                    if Instant::now() > deadline {
                        return Err("senders never saw a full mailbox".into());
                    }
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                let want = (n - 1) as usize * per as usize;
                node.wait_until(|| sunk.borrow().len() == want)?;
                for r in 1..n {
                    let seqs: Vec<u32> = sunk
                        .borrow()
                        .iter()
                        .filter(|&&(s, _)| s == r)
                        .map(|&(_, k)| k)
                        .collect();
                    if seqs != (0..per).collect::<Vec<_>>() {
                        return Err(format!("from rank {r}: {seqs:?}").into());
                    }
                }
                println!("rank 0: {want} requests, each once, in order (mailbox {mailbox})");
            } else {
                let dir = std::path::PathBuf::from(args.get(2).ok_or("flood N DIR")?);
                let mut k = 0;
                let mut told = false;
                while k < per {
                    match node.try_request_medium(0, SINK, &[k, k % 251], &payload_for(k)) {
                        Ok(()) => k += 1,
                        Err(am_core::TryRequestError::WouldBlock) => {
                            if !told {
                                std::fs::write(dir.join(format!("busy-{me}")), b"")?;
                                told = true;
                            }
                            node.poll()?;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                if !told {
                    return Err(format!("rank {me}: {per} requests never hit back-pressure").into());
                }
                node.quiesce()?;
            }
            node.barrier()?;
        }
        "stall" => {}
        other => return Err(format!("unknown mode {other:?}").into()),
    }
    drop(node);
    drop(job);
    Ok(())
}

/// The NIC alone between the two processes, without the AM core: rank 0 sends a Short
/// request head and polls for the reply; rank 1 replies from inside its receive closure.
/// `lock` puts the NIC behind a mutex taken per call (the seed's AMLOCK); with `contend`,
/// a second thread of rank 0 takes the same lock in a loop meanwhile. Rank 0 returns the
/// median round trip in µs.
fn nic_only(
    nic: Extoll,
    rank: u32,
    iters: usize,
    lock: bool,
    contend: bool,
) -> Result<(f64, Extoll), Box<dyn std::error::Error>> {
    use am_core::{Transport, Tx};
    use std::sync::{Arc, Mutex};
    let heads = ShortHeads::new();
    let shared = Arc::new(Mutex::new(nic));
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    // Replies seen by any thread of rank 0: whichever thread polls takes the message.
    let replies = Arc::new(AtomicUsize::new(0));
    let other = (rank == 0 && contend).then(|| {
        let (s, stop, replies) = (shared.clone(), stop.clone(), replies.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Another thread of the rank using the NIC: a poll under the lock.
                if let Ok(mut x) = s.lock() {
                    if let Ok(Some(())) = x.poll_recv(|_, _, _| ()) {
                        replies.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // std's Mutex is not fair: let the other thread in between our polls.
                std::thread::yield_now();
            }
        })
    });
    let mut v = Vec::with_capacity(iters);
    if rank == 0 {
        let mut plain = (!lock)
            .then(|| shared.lock().map_err(|_| "poisoned"))
            .transpose()?;
        for i in 0..iters {
            let t = Instant::now();
            match plain.as_deref_mut() {
                Some(x) => nic::round_trip(x, &heads)?,
                None => {
                    shared
                        .lock()
                        .map_err(|_| "poisoned")?
                        .try_send(1, &heads.request())?;
                    while replies.load(Ordering::Relaxed) <= i {
                        let mut x = shared.lock().map_err(|_| "poisoned")?;
                        if x.poll_recv(|_, _, _| ())?.is_some() {
                            replies.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
        drop(plain);
    } else {
        let mut x = shared.lock().map_err(|_| "poisoned")?;
        nic::reply_to(&mut *x, &heads, iters as u64)?;
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = other {
        let _ = t.join();
    }
    let nic = Arc::try_unwrap(shared)
        .map_err(|_| "NIC still shared")?
        .into_inner()
        .map_err(|_| "poisoned")?;
    Ok((median(v), nic))
}

/// Two-process floors and AM numbers in one run (rank 0 prints).
fn perf(mut job: am_launch::JobInfo, args: &[String]) -> Res {
    let iters = rank::iters_arg(args, 20000)?;
    let rank = job.rank;
    let floors = rank::Floors::measure(&mut job, iters)?;
    let nic = Extoll::connect(&mut job, 2 << 20, ExtollConfig::from_env()?)?;
    let (nic_rtt, nic) = nic_only(nic, rank, iters, false, false)?;
    let (lock_rtt, nic) = nic_only(nic, rank, iters, true, false)?;
    let (contend_rtt, nic) = nic_only(nic, rank, iters / 4, true, true)?;
    // Rank 1 must not send its first AM message (the core's hello) before rank 0's second
    // thread has stopped: that thread takes and drops whatever arrives, and a dropped hello
    // left both ranks waiting for each other for ever.
    rank::fence(&mut job)?;
    let count = Rc::new(Cell::new(0u64));
    let mut node = Node::new(nic, am::handlers(&count)?, Config::from_env()?)?;
    let sizes = [8usize, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];
    let short = if rank == 0 {
        median_us(iters, || am::short_round_trip(&mut node, &count))?
    } else {
        0.0
    };
    // Medium by size over each path; both ranks switch between barriers.
    let mut table = Vec::new();
    for path in [MediumPath::Velo, MediumPath::Rma] {
        node.transport().set_medium(path);
        node.barrier()?;
        let mut row = Vec::new();
        if rank == 0 {
            for &s in &sizes {
                let data = vec![5u8; s];
                let n = (iters / 4).max(100);
                row.push(median_us(n, || {
                    am::medium_round_trip(&mut node, &count, &data)
                })?);
            }
        }
        table.push(row);
        node.barrier()?;
    }
    node.transport()
        .set_medium(ExtollConfig::from_env()?.medium);
    node.barrier()?;
    if rank == 0 {
        let long = am::long_bandwidth(&mut node)?;
        let cfg = node.transport().config();
        println!(
            "config: packet {} B, mailbox {} slots, medium {:?}",
            cfg.packet_size, cfg.mailbox_slots, cfg.medium
        );
        floors.print_rtt();
        floors.print_rtt_vs("NIC only Short round trip (no AM core):", nic_rtt);
        println!(
            "  same, NIC behind one lock (AMLOCK):     {lock_rtt:.3} us; with a 2nd thread polling under it: {contend_rtt:.3} us"
        );
        floors.print_rtt_vs("AM Short round trip (extoll, 2 procs):", short);
        let seed = [2.8, 2.8, 3.5, 3.9, 4.9, 6.7];
        println!("Medium round trip by payload size (us); VELO half round trip next to the seed's VELO (2013 HW):");
        println!(
            "  size   VELO rtt   RMA rtt  faster  | VELO half   seed VELO half  (ratio to its 8 B)"
        );
        let mut crossover = None;
        for (i, &s) in sizes.iter().enumerate() {
            let (v, r) = (table[0][i], table[1][i]);
            if r < v && crossover.is_none() {
                crossover = Some(s);
            }
            if r >= v {
                crossover = None;
            }
            let seed_s = seed
                .get(i)
                .map(|x| format!("{x:.1} ({:.2}x)", x / seed[0]))
                .unwrap_or_else(|| "-".into());
            println!(
                "  {s:>5}  {v:>8.3}  {r:>8.3}  {:>5}   | {:>8.3} ({:.2}x)  {seed_s}",
                if r < v { "RMA" } else { "VELO" },
                v / 2.0,
                v / table[0][0],
            );
        }
        match crossover {
            Some(s) => println!("crossover: RMA faster from {s} B on"),
            None => println!("crossover: none (VELO faster at the largest size)"),
        }
        floors.print_copy();
        floors.print_bw_vs("AM Long 1 MiB bandwidth (RMA put):", long);
    }
    node.barrier()?;
    drop(node);
    drop(job);
    Ok(())
}

/// Two ranks in one thread, taking turns (see the module docs).
fn inproc(args: &[String]) -> Res {
    use am_core::{Transport, Tx};
    let iters: usize = args.get(1).map_or(Ok(100_000), |s| s.parse())?;
    let mut ranks = Extoll::cluster(2, 1 << 16, ExtollConfig::from_env()?)?;
    let mut b = ranks.pop().ok_or("rank 1")?;
    let mut a = ranks.pop().ok_or("rank 0")?;
    let heads = ShortHeads::new();
    let t = Instant::now();
    for _ in 0..iters {
        a.try_send(1, &heads.request())?;
        while b
            .poll_recv(|d, _, tx| tx.try_send(0, &heads.reply(d.route)))?
            .transpose()?
            .is_none()
        {}
        while a.poll_recv(|_, _, _| ())?.is_none() {}
    }
    let nic = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!("in one thread: NIC-only Short round trip {nic:.3} us");
    Ok(())
}
