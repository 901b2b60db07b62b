//! Strided puts: one `put_strided` of `--blocks` blocks of `--block` bytes, a row apart in
//! the target's segment (a column of a row-major array: a halo), beside the same blocks as
//! separate puts, measured in the same job from rank 0 to rank 1.
//!
//! ```text
//! cargo run --release --example strided -- [--transport T] [--blocks 1024] [--block 64]
//!     [--reps N] [--json]
//! ```
//!
//! Rows (median time per whole transfer over `--reps`, after a warm-up):
//! - `puts`: one blocking `put` per block;
//! - `puts_nbi`: one `put_nbi` per block, then `wait_nbi` (the separate puts at their best);
//! - `put_strided`: one call.
//!
//! Each row carries `speedup` = the `puts` row's time / its own. Rank 1 waits in a barrier,
//! polling (transports without RMA need its progress).

use std::time::Instant;

use amnet::{AnyTransport, Config, Handlers, JobOptions, Local, Node, Transport, TransportKind};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "One strided put against the same blocks as separate puts")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Blocks per transfer
    #[arg(long, default_value_t = 1024)]
    blocks: usize,
    /// Bytes per block
    #[arg(long, default_value_t = 64)]
    block: usize,
    /// Timed transfers per row
    #[arg(long, default_value_t = 200)]
    reps: usize,
    /// One JSON object per line instead of a table
    #[arg(long)]
    json: bool,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Rank 0's median time of `one` in µs over `reps` (after `reps / 10` untimed).
fn timed(
    node: &mut Node<AnyTransport, Local>,
    reps: usize,
    mut one: impl FnMut(&mut Node<AnyTransport, Local>) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    node.barrier()?;
    let mut us = Vec::with_capacity(reps);
    if node.rank() == 0 {
        for i in 0..reps + reps / 10 {
            let t0 = Instant::now();
            one(node)?;
            if i >= reps / 10 {
                us.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    node.barrier()?;
    Ok(median(us))
}

fn rank_main(transport: AnyTransport, args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(transport.size() >= 2, "strided needs 2 ranks");
    let name = transport.info().name;
    let size = transport.size();
    let mut node = Node::new(
        transport,
        Handlers::local(),
        Config::from_env_for_ranks(size)?,
    )?;
    let stride = 2 * args.block;
    let data = vec![0x5a; args.blocks * args.block];
    let (blocks, block) = (args.blocks, args.block);
    let puts = timed(&mut node, args.reps, |node| {
        for (i, b) in data.chunks(block).enumerate() {
            node.put(1, i * stride, b)?;
        }
        Ok(())
    })?;
    let nbi = timed(&mut node, args.reps, |node| {
        for (i, b) in data.chunks(block).enumerate() {
            node.put_nbi(1, i * stride, b)?;
        }
        node.wait_nbi()?;
        Ok(())
    })?;
    let strided = timed(&mut node, args.reps, |node| {
        node.put_strided(1, 0, stride, block, &data)?;
        Ok(())
    })?;
    if node.rank() == 0 {
        for (row, us) in [("puts", puts), ("puts_nbi", nbi), ("put_strided", strided)] {
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "transport": name, "row": row, "blocks": blocks, "block": block,
                        "reps": args.reps, "us_p50": us, "speedup": puts / us,
                    })
                );
            } else {
                println!(
                    "{name:<9} {row:<12} {blocks} x {block} B  {us:>10.2} us  x{:.1}",
                    puts / us
                );
            }
        }
    }
    node.barrier()?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.reps > 0 && args.block > 0,
        "--reps and --block must be at least 1"
    );
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(2)
        .segment_size((2 * args.blocks * args.block).max(JobOptions::default().segment_size))
        .prefix_output(!args.json);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
