//! Typed calls: the round trip of `call_typed` with a 32-byte struct and a `u64` answer,
//! beside the raw `Node::call` carrying the same bytes, measured in the same job between
//! ranks 0 and 1.
//!
//! ```text
//! cargo run --release --example typed -- [--transport T] [--iters N] [--warmup N] [--json]
//!     [--bulk BYTES] [--bulk-iters N]
//! ```
//!
//! Rows, each the median of `--iters` round trips after a warm-up, in turn in rounds of
//! 1,000 so that both see the same moments of a noisy machine:
//! - `raw_call`: `call(1, SUM, &[], &bytes)` with the struct's 32 bytes, its handler
//!   summing them as four `u64`s and answering the sum's 8 bytes.
//! - `typed_call`: `call_typed(1, Sum([a, b, c, d]))`, answered with a `u64`.
//!
//! The `typed_call` row carries `ratio_to_raw` and the struct's encoded length.
//!
//! With `--bulk BYTES` (default 1 MiB, 0 for none), two more rows, in turn the same way
//! (`--bulk-iters` of each):
//! - `msg_bulk`: am-msg's raw transfer of `BYTES` (rank 1 posts a receive into its segment,
//!   rank 0 sends, rank 1 answers with an empty message): the transport's own protocol for
//!   large messages, eager or rendezvous as am-msg chooses.
//! - `typed_bulk`: `call_typed(1, Bulk(bytes))`, a `serde_bytes::ByteBuf` of `BYTES`
//!   answered with its length: the value moves by rendezvous where the transport's peers
//!   map each other's memory (loopback, sci, extoll, portals), in parts of the largest AM
//!   Medium elsewhere or with `AM_TYPED_RENDEZVOUS=0`.
//!
//! The `typed_bulk` row carries `ratio_to_raw`, to `msg_bulk`.

use std::time::Instant;

use amnet::am_msg::{Messenger, MsgConfig};
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
    /// Bytes of the bulk rows (0: none)
    #[arg(long, default_value_t = 1 << 20)]
    bulk: usize,
    /// Timed round trips per bulk row
    #[arg(long, default_value_t = 200)]
    bulk_iters: usize,
}

/// Bytes to count: `serde_bytes` writes them as one byte string, where a plain `Vec<u8>`
/// would go element by element.
#[derive(Serialize, Deserialize, Debug)]
struct Bulk(serde_bytes::ByteBuf);

impl Am for Bulk {
    type Reply = u64;
    fn exec(self, _: &mut AmContext) -> u64 {
        self.0.len() as u64
    }
}

/// The am-msg tag of the bulk data and of its empty answer.
const DATA: u64 = 1;
const DONE: u64 = 2;

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
    let name = transport.info().name;
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
    h.typed::<Bulk>()?;
    let msg = Messenger::new(&mut h, HandlerId(100), MsgConfig::from_env()?)?;
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
    let bulk = if args.bulk > 0 {
        Some(bulk_rows(&mut node, &msg, args)?)
    } else {
        None
    };
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
        if let Some((m, t)) = bulk {
            let (m, t) = (median(m), median(t));
            let bytes = args.bulk;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"transport": name, "row": "msg_bulk", "bytes": bytes,
                        "iters": args.bulk_iters, "rtt_us_p50": m})
                );
                println!(
                    "{}",
                    serde_json::json!({"transport": name, "row": "typed_bulk", "bytes": bytes,
                        "iters": args.bulk_iters, "rtt_us_p50": t, "ratio_to_raw": t / m})
                );
            } else {
                println!("{name:<9} msg_bulk   {bytes} B {m:>10.1} µs");
                println!("{name:<9} typed_bulk {bytes} B {t:>10.1} µs  x{:.2}", t / m);
            }
        }
    }
    Ok(())
}

/// The bulk rows' round trips on rank 0, in turn: am-msg's, then the typed call's.
type Times = (Vec<f64>, Vec<f64>);

fn bulk_rows(
    node: &mut Node<AnyTransport, Local>,
    msg: &Messenger,
    args: &Args,
) -> anyhow::Result<Times> {
    let len = args.bulk;
    anyhow::ensure!(
        node.segment().len() >= len,
        "--bulk {len} needs a segment of as many bytes (AM_SEGMENT_SIZE)"
    );
    let data: std::sync::Arc<[u8]> = vec![0x5a; len].into();
    let (mut raw, mut typed) = (Vec::new(), Vec::new());
    let warmup = (args.bulk_iters / 10).max(1);
    for i in 0..warmup + args.bulk_iters {
        let timed = i >= warmup;
        if node.rank() == 0 {
            let t0 = Instant::now();
            let done = msg.post_recv(node, Some(1), DONE, 0, 0)?;
            let s = msg.send(node, 1, DATA, data.clone())?;
            msg.wait_send(node, s)?;
            msg.wait_recv(node, done)?;
            let us = t0.elapsed().as_secs_f64() * 1e6;
            if timed {
                raw.push(us);
            }
            let value = Bulk(serde_bytes::ByteBuf::from(data.to_vec()));
            let t0 = Instant::now();
            let n = node.call_typed(1, value)?;
            let us = t0.elapsed().as_secs_f64() * 1e6;
            anyhow::ensure!(n == len as u64, "typed bulk: wrong length {n}");
            if timed {
                typed.push(us);
            }
        } else if node.rank() == 1 {
            let r = msg.post_recv(node, Some(0), DATA, 0, len)?;
            let info = msg.wait_recv(node, r)?;
            anyhow::ensure!(info.len == len, "msg bulk: wrong length {}", info.len);
            let s = msg.send(node, 0, DONE, Vec::new())?;
            msg.wait_send(node, s)?;
        }
        // The typed call is served by rank 1's progress: it waits in the barrier.
        node.barrier()?;
    }
    Ok((raw, typed))
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
