//! One rank of a udp job, for the multi-process tests: `exit DIR`, the
//! [`am_perf::rank::exit_scenario`] that the shared-memory NICs' rank tests also run, and
//! `pending DIR panic|abort|exit|kill` ([`am_perf::rank::pending_scenario`]). Run by a
//! launcher, or outside one with `--ranks N`, which self-launches.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use am_core::{Config, Handlers, Node};
use am_perf::rank;
use transport_udp::{Udp, UdpConfig};

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() -> Res {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|m| rank::is_failure_scenario(m)) {
        // Before anything else, so the launcher's SIGTERM cannot end us early.
        rank::ignore_sigterm()?;
    }
    rank::self_launch_if_asked(&args, "udp")?;
    match args.first().map(String::as_str) {
        Some("exit") => {
            let dir = PathBuf::from(args.get(1).ok_or("exit DIR")?);
            let mut job = am_launch::JobInfo::from_env()?;
            let udp = Udp::connect(&mut job, 1 << 20, UdpConfig::from_env()?)?;
            let node = Node::new(udp, Handlers::local(), Config::from_env()?)?;
            rank::exit_scenario(node, &dir)
        }
        Some("pending") => {
            let dir = PathBuf::from(args.get(1).ok_or("pending DIR HOW")?);
            let how = args.get(2).ok_or("pending DIR HOW")?;
            let mut job = am_launch::JobInfo::from_env()?;
            let udp = Udp::connect(&mut job, 1 << 20, UdpConfig::from_env()?)?;
            let echoes = std::rc::Rc::new(std::cell::Cell::new(0u64));
            let h = rank::echo_handlers(&echoes)?;
            let mut node = Node::new(udp, h, Config::from_env()?)?;
            rank::pending_scenario(&mut node, &job.job_id, how, &dir)?;
            drop(node);
            drop(job);
            std::process::exit(3);
        }
        _ => Err("usage: udp-rank-test exit DIR | pending DIR panic|abort|exit|kill".into()),
    }
}
