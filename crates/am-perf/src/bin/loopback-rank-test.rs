//! Loopback's measurement program (threads, so only what one rank can do alone):
//!
//! - `loopback-rank-test selfrt nic|am|medium|flood N`: one rank's round trips to itself through
//!   the transport alone or through the AM core (for callgrind;
//!   `am_perf::am::self_round_trips`). On loopback the transport is a ring and little else,
//!   so `am` minus `nic` is the AM core's share of a round trip.

use am_core::{Loopback, LoopbackConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("selfrt") => {
            let what = args.get(1).map_or("am", String::as_str);
            let iters: usize = args.get(2).map_or(Ok(100_000), |s| s.parse())?;
            let nic = Loopback::cluster(1, LoopbackConfig::default())
                .pop()
                .ok_or("no rank")?;
            let ns = am_perf::am::self_round_trips(nic, what, iters)?;
            println!("selfrt {what}: {ns:.1} ns per round trip");
            Ok(())
        }
        _ => Err("usage: loopback-rank-test selfrt nic|am|medium|flood N".into()),
    }
}
