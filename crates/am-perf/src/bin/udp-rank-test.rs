//! One rank of a udp job, for the multi-process tests: `exit DIR`, the
//! [`am_perf::rank::exit_scenario`] that the shared-memory NICs' rank tests also run.
#![forbid(unsafe_code)]

use std::path::PathBuf;

use am_core::{Config, Handlers, Node};
use am_perf::rank;
use transport_udp::{Udp, UdpConfig};

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() -> Res {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("exit") => {
            // Before anything else, so the launcher's SIGTERM cannot end us early.
            rank::ignore_sigterm()?;
            let dir = PathBuf::from(args.get(1).ok_or("exit DIR")?);
            let mut job = am_launch::JobInfo::from_env()?;
            let udp = Udp::connect(&mut job, 1 << 20, UdpConfig::from_env()?)?;
            let node = Node::new(udp, Handlers::local(), Config::from_env()?)?;
            rank::exit_scenario(node, &dir)
        }
        _ => Err("usage: udp-rank-test exit DIR".into()),
    }
}
