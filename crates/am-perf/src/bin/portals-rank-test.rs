//! A small AM program for the multi-process tests and measurements, run by
//! `am_launch::Launcher` (or self-launched with `--ranks N`).
//!
//! - `portals-rank-test alltoall ROUNDS`: every rank sends ROUNDS Medium requests (sizes up
//!   to the Medium limit) to every rank, one Long request per round, checks the echoes, puts
//!   64 KiB into the next rank's segment, then meets the others at a barrier. With
//!   `PORTALS_REQUEST_BUFFER_BYTES` small, this is the "entry disabled, resend" test: it
//!   prints the flow-control counters, and with `--expect-flow-control` fails if this rank
//!   saw no refusal and no disabled entry.
//! - `portals-rank-test mismatch` (3 ranks): rank 1 asks for a larger segment; every rank must
//!   fail start-up with the typed segment-size mismatch.
//! - `portals-rank-test pending DIR panic|abort|exit|kill` (2 ranks): rank 1 dies that way
//!   while the other has calls and a barrier pending on it; each must fail with a typed error
//!   ([`am_perf::rank::pending_scenario`]).
//! - `portals-rank-test exit DIR` (4 ranks): rank 2 calls `exit(7)`; the others must end with 7
//!   within 2 s ([`am_perf::rank::exit_scenario`]).
//! - `portals-rank-test kill DIR`: rank 1 dies by SIGKILL after a barrier; the others write
//!   `DIR/lost-<rank>` (`<lost rank> <µs since the epoch>`) on `PeerLost` and exit with 3.
//! - `portals-rank-test selfrt nic|am|medium|flood N`: one rank's round trips to itself through the NIC
//!   alone or through the AM core (for callgrind; `am_perf::am::self_round_trips`).
//! - `portals-rank-test perf [ITERS]` (2 ranks): the raw two-process floors (am_shm::floor)
//!   and, in the same run, the NIC alone (Short round trip through `Transport`), AM Short and
//!   Medium round trips and Long 1 MiB bandwidth; rank 0 prints medians and ratios.
//! - `portals-rank-test hot [COUNT] [SIZE]`: rank 0 floods rank 1 with COUNT requests (AM
//!   Short if SIZE is 0, else Medium of SIZE bytes) five times and prints the median rate;
//!   run it under `AM_CREDITS=8` and `AM_CREDITS=dynamic` for the hot-pair comparison.
//! - `portals-rank-test memory`: no job; prints the receive memory per rank for 16, 256 and
//!   1024 ranks under static (`AM_CREDITS`, default 32) and dynamic credits, computed by the
//!   code that sizes the real buffers.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use am_core::{AmKind, Config, Credits, HandlerId, Node};
use am_perf::rank::{self, pattern, ECHO};
use am_perf::{am, median};
use portals_sim::{Portals, PortalsConfig};

const LONG: HandlerId = HandlerId(3);
const LONG_REPLY: HandlerId = HandlerId(4);

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() -> Res {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("alltoall");
    if mode == "selfrt" {
        // One rank, round trips to itself (`selfrt nic|am|medium|flood N`): see am_perf::am::self_round_trips.
        let what = args.get(1).map_or("am", String::as_str);
        let iters: usize = args.get(2).map_or(Ok(100_000), |s| s.parse())?;
        let nic = Portals::cluster(1, 1 << 16, PortalsConfig::from_env()?)?
            .pop()
            .ok_or("no rank")?;
        let ns = am_perf::am::self_round_trips(nic, what, iters)?;
        println!("selfrt {what}: {ns:.1} ns per round trip");
        return Ok(());
    }
    if mode == "memory" {
        return memory();
    }
    if mode == "local" {
        return local(&args);
    }
    if rank::is_failure_scenario(mode) {
        // Registered before anything else, so the launcher's SIGTERM cannot end us early.
        rank::ignore_sigterm()?;
    }
    rank::self_launch_if_asked(&args, "portals")?;
    let mut job = am_launch::JobInfo::from_env()?;
    if mode == "stall" {
        // Rank 0 holds start-up back until the test says go, so the others sit in the NIC's
        // start-up with their segments created (the test kills one there).
        let dir = std::path::PathBuf::from(args.get(1).ok_or("stall DIR")?);
        rank::stall_before_start(&job, &dir)?;
    }
    if mode == "mismatch" {
        let segment = rank::mismatched_segment(job.rank);
        let got = match Portals::connect(&mut job, segment, PortalsConfig::from_env()?) {
            Err(portals_sim::PortalsError::SegmentSizeMismatch { rank, ours, theirs }) => {
                Some((rank, ours, theirs))
            }
            Err(e) => return Err(e.into()),
            Ok(_) => None,
        };
        return rank::expect_segment_mismatch(got);
    }
    match mode {
        "perf" => perf(job, &args),
        "hot" => hot(job, &args),
        _ => {
            let portals = Portals::connect(&mut job, 1 << 20, PortalsConfig::from_env()?)?;
            let r = echo_job(portals, &job.job_id, mode, &args);
            drop(job);
            r
        }
    }
}

fn echo_job(portals: Portals, job_id: &str, mode: &str, args: &[String]) -> Res {
    let echoes = Rc::new(Cell::new(0u64));
    let mut h = rank::echo_handlers(&echoes)?;
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
    let exchanged = rank::exchange_counters(&mut h, mode)?;
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
            let base = 512 * 1024;
            rank::put_ring(
                &mut node,
                |r| base + r as usize * 65536 % (512 * 1024),
                |r| pattern(65536, r),
            )?;
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
        "stall" => {}
        "kill-anywhere" => {
            let dir = std::path::PathBuf::from(args.get(1).ok_or("kill-anywhere DIR DELAY_US")?);
            let delay: u64 = args.get(2).ok_or("kill-anywhere DIR DELAY_US")?.parse()?;
            rank::kill_anywhere(&mut node, &exchanged, delay, &dir)?;
            drop(node);
            std::process::exit(3);
        }
        "exit" => {
            let dir = std::path::PathBuf::from(args.get(1).ok_or("exit DIR")?);
            return rank::exit_scenario(node, &dir);
        }
        "kill" => {
            let dir = std::path::PathBuf::from(args.get(1).ok_or("kill DIR")?);
            rank::kill_scenario(&mut node, job_id, &dir)?;
            drop(node);
            std::process::exit(3);
        }
        "pending" => {
            let dir = std::path::PathBuf::from(args.get(1).ok_or("pending DIR HOW")?);
            let how = args.get(2).ok_or("pending DIR HOW")?;
            rank::pending_scenario(&mut node, job_id, how, &dir)?;
            drop(node);
            std::process::exit(3);
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
        Credits::Dynamic { .. } => Credits::default(),
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
            let c = base.credits(credits);
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

/// Two-process floors and AM numbers in one run (rank 0 prints).
fn perf(mut job: am_launch::JobInfo, args: &[String]) -> Res {
    let iters = rank::iters_arg(args, 20000)?;
    let rank = job.rank;
    let floors = rank::Floors::measure(&mut job, iters)?;
    let mut portals = Portals::connect(&mut job, 2 << 20, PortalsConfig::from_env()?)?;
    let nic_rtt = am_perf::nic::rtt_us(&mut portals, rank, iters)?;
    let count = Rc::new(Cell::new(0u64));
    let mut node = Node::new(portals, am::handlers(&count)?, Config::from_env()?)?;
    if rank == 0 {
        let medium = node.limits().max_medium;
        let label = "AM Short round trip (portals):";
        rank::print_am_figures(&mut node, &count, iters, medium, &floors, nic_rtt, label)?;
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
    let mut node = Node::new(portals, am::handlers(&count)?, Config::from_env()?)?;
    if node.rank() == 0 {
        let data = vec![3u8; size];
        let mut rates = Vec::new();
        for _ in 0..5 {
            let t = am::stream(&mut node, count_arg, |n| {
                if size == 0 {
                    n.request_short(1, am::FLOOD_SHORT, &[])
                } else {
                    n.request_medium(1, am::FLOOD_MEDIUM, &[], &data)
                }
            })?;
            rates.push(count_arg as f64 / t.as_secs_f64());
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
    use am_core::{Transport, Tx};
    let iters: usize = args.get(1).map_or(Ok(2_000_000), |s| s.parse())?;
    let mut p = Portals::cluster(1, 4096, PortalsConfig::from_env()?)?
        .pop()
        .ok_or("no rank")?;
    let heads = am_perf::nic::ShortHeads::new();
    let t = Instant::now();
    for _ in 0..iters {
        p.try_send(0, &heads.request())?;
        p.poll_recv(|d, _, tx| tx.try_send(0, &heads.reply(d.route)))?
            .ok_or("no request")??;
        p.poll_recv(|_, _, _| ())?.ok_or("no reply")?;
    }
    println!(
        "local Short round trip through the NIC: {:.1} ns",
        t.elapsed().as_secs_f64() * 1e9 / iters as f64
    );
    Ok(())
}
