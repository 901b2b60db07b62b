//! Typed calls: the round trip of `call_typed` with a 32-byte struct and a `u64` answer,
//! beside the raw `Node::call` carrying the same bytes, measured in the same job between
//! ranks 0 and 1.
//!
//! ```text
//! cargo run --release --example typed -- [--transport T] [--iters N] [--warmup N] [--json]
//! ```
//!
//! Rows, each the median of `--iters` round trips after a warm-up, in turn in rounds of
//! 1,000 so that both see the same moments of a noisy machine:
//! - `raw_call`: `call(1, SUM, &[], &bytes)` with the struct's 32 bytes, its handler
//!   summing them as four `u64`s and answering the sum's 8 bytes.
//! - `typed_call`: `call_typed(1, Sum([a, b, c, d]))`, answered with a `u64`.
//!
//! The `typed_call` row carries `ratio_to_raw` and the struct's encoded length.

use std::time::Instant;

use amnet::typed::{Am, AmContext, Shape};
use amnet::{
    AnyTransport, Config, HandlerId, Handlers, JobOptions, Local, Node, Transport, TransportKind,
};
use clap::Parser;
use serde::{Deserialize, Serialize};

#[derive(Parser, Debug)]
#[command(about = "Typed call round trip beside a raw call with the same bytes")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Timed round trips per row
    #[arg(long, default_value_t = 20_000)]
    iters: usize,
    /// Untimed round trips first
    #[arg(long, default_value_t = 2_000)]
    warmup: usize,
    /// One JSON object per line instead of a table
    #[arg(long)]
    json: bool,
}

const SUM: HandlerId = HandlerId(1);

/// Four words to add up: 32 bytes, whose values need all their bytes.
#[derive(Serialize, Deserialize, Shape, Debug, Clone, Copy)]
struct Sum([u64; 4]);

impl Am for Sum {
    type Reply = u64;
    const SHAPE: u64 = <Self as Shape>::SHAPE;
    fn exec(self, _: &mut AmContext) -> u64 {
        self.0.iter().fold(0u64, |a, &w| a.wrapping_add(w))
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn rank_main(transport: AnyTransport, args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(transport.size() >= 2, "typed needs at least 2 ranks");
    let name = transport.name();
    let size = transport.size();
    let mut h = Handlers::local();
    h.callable(SUM, "sum", |msg, call| {
        let sum = msg
            .payload()
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .fold(0u64, u64::wrapping_add);
        let _ = call.reply(&[], &sum.to_le_bytes()[..]);
    })?;
    h.typed::<Sum>()?;
    let mut node: Node<AnyTransport, Local> =
        Node::new(transport, h, Config::from_env_for_ranks(size)?)?;
    let words = [u64::MAX - 1, u64::MAX - 2, u64::MAX - 3, u64::MAX - 4];
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let want = words.iter().fold(0u64, |a, &w| a.wrapping_add(w));
    let (mut raw, mut typed) = (Vec::new(), Vec::new());
    node.barrier()?;
    if node.rank() == 0 {
        let mut left = args.warmup + args.iters;
        let mut done = 0;
        while left > 0 {
            let n = left.min(1000);
            for _ in 0..n {
                let t0 = Instant::now();
                let r = node.call(1, SUM, &[], &bytes)?;
                let us = t0.elapsed().as_secs_f64() * 1e6;
                anyhow::ensure!(r.payload == want.to_le_bytes(), "raw call: wrong sum");
                if done >= args.warmup {
                    raw.push(us);
                }
                let t0 = Instant::now();
                let sum = node.call_typed(1, Sum(words))?;
                let us = t0.elapsed().as_secs_f64() * 1e6;
                anyhow::ensure!(sum == want, "typed call: wrong sum");
                if done >= args.warmup {
                    typed.push(us);
                }
                done += 1;
            }
            left -= n;
        }
    }
    node.barrier()?;
    if node.rank() == 0 {
        let (r, t) = (median(raw), median(typed));
        let encoded = amnet::typed::encoded_len(&Sum(words))?;
        if args.json {
            println!(
                "{}",
                serde_json::json!({"transport": name, "row": "raw_call", "bytes": bytes.len(),
                    "iters": args.iters, "rtt_us_p50": r})
            );
            println!(
                "{}",
                serde_json::json!({"transport": name, "row": "typed_call", "bytes": encoded,
                    "iters": args.iters, "rtt_us_p50": t, "ratio_to_raw": t / r})
            );
        } else {
            println!("{name:<9} raw_call   {:>3} B {r:>8.3} µs", bytes.len());
            println!(
                "{name:<9} typed_call {encoded:>3} B {t:>8.3} µs  x{:.2}",
                t / r
            );
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.iters > 0, "--iters must be at least 1");
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(2)
        .prefix_output(!args.json);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
