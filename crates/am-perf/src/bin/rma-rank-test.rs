//! Rank 0's blocking one-sided operations of 8 bytes into rank 1's segment, for callgrind:
//!
//! - `rma-rank-test loopback|sci put|get|atomic N`: two ranks of an in-process job as threads
//!   (`Loopback::cluster(2, ..)`, `Sci::cluster(2, ..)`); rank 0 makes N blocking puts of 8
//!   bytes, gets of 8 bytes or fetching adds on a `u64` inside `am_perf::am::am_perf_measure`
//!   while rank 1 blocks in a barrier (`am_perf::am::rma_ops`). Count them with
//!   `valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*am_perf_measure*'`.
//!
//! A program of its own, not a mode of `loopback-rank-test` and `sci-rank-test`: in those,
//! a second caller of the transport's code changes what LTO inlines into their `selfrt`
//! loops, and their counts with it (loopback's AM Short round trip by about 40
//! instructions). ofi's is `ofi-rank-test rma`.

use am_core::{Loopback, LoopbackConfig, WaitMode};
use sci_sim::{Sci, SciConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let what = args.get(1).map_or("put", String::as_str);
    let iters: usize = args.get(2).map_or(Ok(100_000), |s| s.parse())?;
    let ns = match args.first().map(String::as_str) {
        Some("loopback") => {
            let nics = Loopback::cluster(2, LoopbackConfig::default());
            am_perf::am::rma_ops(nics, what, iters, WaitMode::Block)?
        }
        Some("sci") => {
            let nics = Sci::cluster(2, 1 << 16, SciConfig::from_env()?)?;
            am_perf::am::rma_ops(nics, what, iters, WaitMode::Block)?
        }
        _ => return Err("usage: rma-rank-test loopback|sci put|get|atomic N".into()),
    };
    println!("rma {what}: {ns:.1} ns per operation");
    Ok(())
}
