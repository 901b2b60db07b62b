//! A small AM program for the ofi transport's multi-process tests, run by
//! `am_launch::Launcher` or any other launcher, or outside one with `--ranks N`, which
//! self-launches; the provider comes from `FI_PROVIDER` (or `AM_OFI_PROVIDER`), as for every
//! program on this transport. Built with am-perf's `ofi` feature.
//!
//! - `ofi-rank-test alltoall ROUNDS`: every rank sends ROUNDS Medium requests to every rank,
//!   checks the echoes, puts 64 KiB into the next rank's segment and checks it, then meets
//!   the others at a barrier.
//! - `ofi-rank-test selfrt am|medium|flood|call|typed N`: one rank's round trips to itself
//!   (`Ofi::cluster(1, ..)`, for callgrind; `am_perf::am::self_round_trips`).
//! - `ofi-rank-test rma put|get|atomic N`: rank 0's blocking puts, gets or fetching adds of 8
//!   bytes into rank 1's segment, two ranks of one job as threads (`Ofi::cluster`; for
//!   callgrind with `--toggle-collect`, `am_perf::am::rma_ops`). Rank 1 waits in a barrier
//!   meanwhile, blocking by default (`AM_WAIT` chooses): its blocking wait still makes the
//!   progress a provider with manual progress needs at the target, and a spinning rank 1
//!   would take turns with rank 0 under valgrind, which counts rank 0's spinning for a
//!   completion meanwhile (about 370,000 instructions per get over tcp, against 17,000).
//! - `ofi-rank-test mismatch` (3 ranks): rank 1 asks for a larger segment; every rank must
//!   fail start-up with the typed segment-size mismatch.
//! - `ofi-rank-test pending DIR panic|abort|exit|kill` (2 ranks): rank 1 dies that way
//!   while the other has calls and a barrier pending on it; each must fail with a typed error
//!   ([`am_perf::rank::pending_scenario`]).
//! - `ofi-rank-test exit DIR` (4 ranks): rank 2 calls `exit(7)`; the others must end with 7
//!   within 2 s ([`am_perf::rank::exit_scenario`]).
//! - `ofi-rank-test kill DIR`: after a barrier, rank 1 kills itself with SIGKILL; the others
//!   report `PeerLost` at their next barrier ([`am_perf::rank::kill_scenario`]) and exit
//!   with code 3.
//! - `ofi-rank-test kill-anywhere DIR DELAY_US` (3 ranks): the last rank is killed DELAY_US
//!   into a flood of mixed-size echoes; the survivors notice, make a full exchange, write
//!   `DIR/ok-<rank>` and exit with code 3 ([`am_perf::rank::kill_anywhere`]).

use std::cell::Cell;
use std::rc::Rc;

use am_core::{Config, Node};
use am_perf::rank;
use transport_ofi::{Ofi, OfiConfig, OfiTransportError};

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() -> Res {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("alltoall");
    if mode == "selfrt" {
        // One rank, round trips to itself: see am_perf::am::self_round_trips.
        let what = args.get(1).map_or("am", String::as_str);
        let iters: usize = args.get(2).map_or(Ok(100_000), |s| s.parse())?;
        let nic = Ofi::cluster(1, 1 << 16, OfiConfig::from_env()?)?
            .pop()
            .ok_or("no rank")?;
        let ns = am_perf::am::self_round_trips(nic, what, iters)?;
        println!("selfrt {what}: {ns:.1} ns per round trip");
        return Ok(());
    }
    if mode == "rma" {
        // Two ranks as threads, rank 0 measures: see am_perf::am::rma_ops.
        let what = args.get(1).map_or("put", String::as_str);
        let iters: usize = args.get(2).map_or(Ok(100_000), |s| s.parse())?;
        let wait = match std::env::var("AM_WAIT") {
            Ok(w) => w.parse()?,
            Err(_) => am_core::WaitMode::Block,
        };
        let nics = Ofi::cluster(2, 1 << 16, OfiConfig::from_env()?)?;
        let ns = am_perf::am::rma_ops(nics, what, iters, wait)?;
        println!("rma {what}: {ns:.1} ns per operation");
        return Ok(());
    }
    if rank::is_failure_scenario(mode) {
        // Registered before anything else, so the launcher's SIGTERM cannot end us early;
        // after libfabric's libraries' own handlers are gone, or ours would chain to them.
        transport_ofi::unhook_signals();
        rank::ignore_sigterm()?;
    }
    rank::self_launch_if_asked(&args, "ofi")?;
    let mut job = am_launch::JobInfo::from_env()?;
    if mode == "mismatch" {
        let segment = rank::mismatched_segment(job.rank);
        let got = match Ofi::connect(&mut job, segment, OfiConfig::from_env()?) {
            Err(OfiTransportError::SegmentSizeMismatch { rank, ours, theirs }) => {
                Some((rank, ours as u64, theirs as u64))
            }
            Err(e) => return Err(e.into()),
            Ok(_) => None,
        };
        return rank::expect_segment_mismatch(got);
    }
    let ofi = Ofi::connect(&mut job, 1 << 20, OfiConfig::from_env()?)?;
    let echoes = Rc::new(Cell::new(0u64));
    let mut h = rank::echo_handlers(&echoes)?;
    let exchanged = rank::exchange_counters(&mut h, mode)?;
    let mut node = Node::new(ofi, h, Config::from_env()?)?;
    if rank::is_failure_scenario(mode) {
        return rank::failure_scenario(mode, &args, node, job, &exchanged);
    }
    let (me, n) = (node.rank(), node.size());
    match mode {
        "alltoall" => {
            let rounds: u32 = args.get(1).map_or(Ok(20), |s| s.parse())?;
            let max = node.max_medium();
            rank::echo_rounds(&mut node, &echoes, rounds, |round, peer| {
                (round as usize * 37 + peer as usize * 101) % (max + 1)
            })?;
            rank::put_ring(
                &mut node,
                |r| r as usize * 65536,
                |r| (0..65536).map(|i| (i as u32 * 7 + r) as u8).collect(),
            )?;
            println!("rank {me}/{n}: ok on {}", node.transport().provider());
        }
        other => return Err(format!("unknown mode {other:?}").into()),
    }
    drop(node);
    drop(job);
    Ok(())
}
