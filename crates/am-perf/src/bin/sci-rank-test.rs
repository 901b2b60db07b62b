//! A small AM program for the multi-process tests, run by `am_launch::Launcher`.
//!
//! - `sci-rank-test alltoall ROUNDS`: every rank sends ROUNDS Medium requests (and one Long
//!   put) to every rank, checks the echoes and the data, then meets the others at a barrier.
//! - `sci-rank-test selfrt nic|am|medium|flood N`: one rank's round trips to itself through the NIC
//!   alone or through the AM core (for callgrind; `am_perf::am::self_round_trips`).
//! - `sci-rank-test perf [ITERS]` (2 ranks; `--ranks 2` outside a launcher self-launches):
//!   the raw two-process floors (am_shm::floor) and, in the same run, the NIC alone (a Short
//!   round trip through `Transport` without the AM core), AM Short and Medium
//!   1 KiB round trips and Long 1 MiB bandwidth; rank 0 prints medians. Set
//!   `SCI_SLOT_SIZE=1152` so a 1 KiB Medium fits a slot.
//! - `sci-rank-test mismatch` (3 ranks): rank 1 asks for a larger segment; every rank must
//!   fail start-up with the typed segment-size mismatch.
//! - `sci-rank-test pending DIR panic|abort|exit|kill` (2 ranks): rank 1 dies that way
//!   while the other has calls and a barrier pending on it; each must fail with a typed error
//!   ([`am_perf::rank::pending_scenario`]).
//! - `sci-rank-test exit DIR` (4 ranks): rank 2 calls `exit(7)`; the others must end with 7
//!   within 2 s ([`am_perf::rank::exit_scenario`]).
//! - `sci-rank-test kill DIR`: after a barrier, rank 1 writes `DIR/victim` (time of death, µs
//!   since the epoch) and kills itself with SIGKILL; the others ignore SIGTERM (so the
//!   launcher does not end them before they notice), wait at a barrier, and on `PeerLost`
//!   write `DIR/lost-<rank>` (`<lost rank> <µs since the epoch>`) and exit with code 3.
//! - `sci-rank-test stall DIR`: each rank writes `DIR/pid-<rank>`; rank 0 then waits for
//!   `DIR/go` before starting its NIC, so the others wait in their NIC's start-up.
//! - `sci-rank-test kill-anywhere DIR DELAY_US` (3 ranks): the last rank is killed DELAY_US
//!   into a flood of mixed-size echoes; the survivors notice, make a full exchange, write
//!   `DIR/ok-<rank>` and exit with code 3 (`am_perf::rank::kill_anywhere`).

use std::cell::Cell;
use std::rc::Rc;

use am_core::{Config, Node};
use am_perf::rank;
use sci_sim::{Sci, SciConfig};

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() -> Res {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("alltoall");
    if mode == "selfrt" {
        // One rank, round trips to itself (`selfrt nic|am|medium|flood N`): see am_perf::am::self_round_trips.
        let what = args.get(1).map_or("am", String::as_str);
        let iters: usize = args.get(2).map_or(Ok(100_000), |s| s.parse())?;
        let nic = Sci::cluster(1, 1 << 16, SciConfig::from_env()?)?
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
    rank::self_launch_if_asked(&args, "sci")?;
    let mut job = am_launch::JobInfo::from_env()?;
    if mode == "stall" {
        // Rank 0 holds start-up back until the test says go, so the others sit in the NIC's
        // start-up with their segments created (the test kills one there).
        let dir = std::path::PathBuf::from(args.get(1).ok_or("stall DIR")?);
        rank::stall_before_start(&job, &dir)?;
    }
    if mode == "mismatch" {
        let segment = rank::mismatched_segment(job.rank);
        let got = match Sci::connect(&mut job, segment, SciConfig::from_env()?) {
            Err(sci_sim::SciError::SegmentSizeMismatch { rank, ours, theirs }) => {
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
    let sci = Sci::connect(&mut job, 1 << 20, SciConfig::from_env()?)?;
    let echoes = Rc::new(Cell::new(0u64));
    let mut h = rank::echo_handlers(&echoes)?;
    let exchanged = rank::exchange_counters(&mut h, mode)?;
    let mut node = Node::new(sci, h, Config::from_env()?)?;
    if rank::is_failure_scenario(mode) {
        return rank::failure_scenario(mode, &args, node, job, &exchanged);
    }
    let (me, n) = (node.rank(), node.size());
    match mode {
        "alltoall" => {
            let rounds: u32 = args.get(1).map_or(Ok(20), |s| s.parse())?;
            rank::echo_rounds(&mut node, &echoes, rounds, |round, _| {
                (round as usize * 37) % 900
            })?;
            // A Long put of 64 KiB into the next rank's segment, at our own slot of it.
            rank::put_ring(
                &mut node,
                |r| r as usize * 65536,
                |r| (0..65536).map(|i| (i as u32 * 7 + r) as u8).collect(),
            )?;
            println!("rank {me}/{n}: ok");
        }
        "stall" => {}
        other => return Err(format!("unknown mode {other:?}").into()),
    }
    drop(node);
    drop(job);
    Ok(())
}

/// Two-process floors and AM numbers in one run (rank 0 prints).
fn perf(mut job: am_launch::JobInfo, args: &[String]) -> Res {
    let iters = rank::iters_arg(args, 20000)?;
    let rank = job.rank;
    let floors = rank::Floors::measure(&mut job, iters)?;
    let mut sci = Sci::connect(&mut job, 2 << 20, SciConfig::from_env()?)?;
    let nic_rtt = am_perf::nic::rtt_us(&mut sci, rank, iters)?;
    let count = Rc::new(Cell::new(0u64));
    let mut node = Node::new(sci, am_perf::am::handlers(&count)?, Config::from_env()?)?;
    if rank == 0 {
        let medium = node.limits().max_medium.min(1024);
        let label = "AM Short round trip (sci, 2 processes):";
        rank::print_am_figures(&mut node, &count, iters, medium, &floors, nic_rtt, label)?;
    }
    node.barrier()?;
    drop(node);
    drop(job);
    Ok(())
}
