//! Collectives: latency of barrier, broadcast, reduce, all-reduce, gather and all-gather on
//! the world team, beside the AM Short round trip they are built from, measured in the same
//! job.
//!
//! ```text
//! cargo run --release --example collectives -- [--transport T] [--ranks N]
//!     [--ops barrier,allreduce,...] [--sizes 8,64,512] [--iters N] [--json]
//! ```
//!
//! Every rank runs `--iters` collectives back to back after a warm-up; a row's latency is
//! the time per collective, averaged over the iterations and then over the ranks (as the
//! OSU micro-benchmarks report theirs), and rank 0's median of single collectives. Sizes
//! are bytes per member (8 bytes: one `u64`, summed for the reductions); one above the
//! transport's `max_medium` runs in chunks. The roots of broadcast, reduce and gather
//! rotate with the iteration.
//!
//! Each job also times the AM Short round trip between ranks 0 and 1 (the others wait in a
//! barrier), and `Node::barrier`, the world barrier of the endpoint: rows carry
//! `rounds` = ⌈log2 ranks⌉, `am_rtt_us` and `ratio_to_rounds` = latency / (rounds ×
//! round trip); the `barrier` row also `ratio_to_node_barrier`. Rows with bytes also carry
//! `mb_s` (bytes per member over the mean latency) and, beside it, `put_mb_s`: rank 0's
//! blocking puts of the same size to rank 1 in the same job, and `ratio_to_put`.
//!
//! `alloc` times `alloc_symmetric` of the row's bytes on the world (its `ratio_to_barrier`
//! is against the `barrier` row's collective, timed in the same job): the blocks stay
//! allocated until the row ends (freed untimed), in a symmetric heap sized for them.
//! `segment` times `create_segment` of the row's bytes and its `publish_segment` on the
//! world, as the `alloc` row (the segments are freed, untimed, when the row ends).
//!
//! `broadcast-seg` and `allreduce-seg` are the collectives in segment 0
//! (`team_broadcast_in_segment`, `team_all_reduce_in_segment` of `u64` sums): the source
//! at offset 0 of each member's segment and the destination just after it, both filled
//! once per row.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use amnet::{
    AmKind, AnyTransport, Config, HandlerId, Handlers, JobOptions, Local, Node, ReduceOp,
    Transport, TransportKind,
};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Collective latency on the world team, beside the AM round trip")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Ranks to start when not under a launcher
    #[arg(long, default_value_t = 2)]
    ranks: u32,
    /// Collectives to time
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "barrier,allreduce,broadcast,reduce,gather,allgather",
        value_parser = ["barrier", "allreduce", "broadcast", "reduce", "gather", "allgather", "alloc", "segment", "broadcast-seg", "allreduce-seg"]
    )]
    ops: Vec<String>,
    /// Bytes per member (barrier has none)
    #[arg(long, value_delimiter = ',', default_value = "8")]
    sizes: Vec<usize>,
    /// Timed collectives per row
    #[arg(long, default_value_t = 10_000)]
    iters: usize,
    /// Untimed collectives first
    #[arg(long, default_value_t = 1_000)]
    warmup: usize,
    /// One JSON object per line instead of a table
    #[arg(long)]
    json: bool,
}

const PING: HandlerId = HandlerId(1);
const PONG: HandlerId = HandlerId(2);

fn handlers(pongs: &Rc<Cell<u64>>) -> anyhow::Result<Handlers<Local>> {
    let mut h = Handlers::local();
    h.request(PING, "ping", AmKind::Short, |msg, token| {
        let _ = token.reply_short(PONG, msg.args());
    })?;
    let p = pongs.clone();
    h.reply(PONG, "pong", AmKind::Short, move |_| p.set(p.get() + 1))?;
    Ok(h)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Rank 0's median AM Short round trip to rank 1, in µs (NaN on the other ranks).
fn am_rtt(
    node: &mut Node<AnyTransport, Local>,
    pongs: &Cell<u64>,
    args: &Args,
) -> anyhow::Result<f64> {
    node.barrier()?;
    let mut rtt = Vec::new();
    if node.rank() == 0 {
        for i in 0..args.warmup + args.iters {
            let want = pongs.get() + 1;
            let t0 = Instant::now();
            node.request_short(1, PING, &[])?;
            node.wait_until(|| pongs.get() == want)?;
            if i >= args.warmup {
                rtt.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
    }
    node.barrier()?;
    Ok(median(rtt))
}

/// One member's inputs of `bytes`, made once per row: the allocation and first touch of a
/// large buffer would otherwise be timed with the collective.
struct Inputs {
    /// `bytes` rounded up to whole `u64`s, for the reductions.
    words: Vec<u64>,
    /// `bytes` for broadcast, gather and all-gather.
    block: Vec<u8>,
    /// The symmetric blocks the row allocated, freed when it ends.
    blocks: Vec<amnet::Symmetric>,
    /// The segments the row created and published, freed when it ends.
    segments: Vec<amnet::SegmentId>,
}

impl Inputs {
    fn new(me: u32, bytes: usize) -> Self {
        Inputs {
            words: vec![u64::from(me) + 1; bytes.div_ceil(8)],
            block: vec![me as u8; bytes],
            blocks: Vec::new(),
            segments: Vec::new(),
        }
    }
}

/// One collective of `op` on `inputs`, iteration `i`.
fn one(
    node: &mut Node<AnyTransport, Local>,
    world: &amnet::Team,
    op: &str,
    inputs: &mut Inputs,
    i: usize,
) -> anyhow::Result<()> {
    let me = world.rank();
    let n = world.size();
    let root = (i % n as usize) as u32;
    let Inputs {
        words,
        block,
        blocks,
        segments,
    } = inputs;
    match op {
        "barrier" => node.team_barrier(world)?,
        "alloc" => blocks.push(node.alloc_symmetric(world, block.len())?),
        "segment" => {
            let id = node.create_segment(block.len())?;
            node.publish_segment(world, id)?;
            segments.push(id);
        }
        "allreduce" => {
            node.team_all_reduce(world, ReduceOp::Sum, words)?;
        }
        "reduce" => {
            node.team_reduce(world, root, ReduceOp::Sum, words)?;
        }
        "broadcast" => {
            let data = if me == root { &block[..] } else { &[][..] };
            node.team_broadcast(world, root, data)?;
        }
        "gather" => {
            node.team_gather(world, root, block)?;
        }
        "allgather" => {
            node.team_all_gather(world, block)?;
        }
        "broadcast-seg" => {
            let len = block.len();
            node.team_broadcast_in_segment(world, root, 0, len, len)?;
        }
        "allreduce-seg" => {
            let len = words.len() * 8;
            node.team_all_reduce_in_segment::<u64>(world, ReduceOp::Sum, 0, len, words.len())?;
        }
        other => anyhow::bail!("unknown collective {other}"),
    }
    Ok(())
}

/// The mean latency over the ranks and rank 0's median, in µs.
fn timed(
    node: &mut Node<AnyTransport, Local>,
    world: &amnet::Team,
    op: &str,
    bytes: usize,
    args: &Args,
) -> anyhow::Result<(f64, f64)> {
    let mut each = Vec::with_capacity(args.iters);
    let mut inputs = Inputs::new(world.rank(), bytes);
    if op.ends_with("-seg") {
        // The source at 0, the destination after it, both first touched here.
        let len = inputs.words.len() * 8;
        node.segment().fill(0, len, world.rank() as u8 + 1)?;
        node.segment().fill(len, len, 0)?;
    }
    for i in 0..args.warmup {
        one(node, world, op, &mut inputs, i)?;
    }
    node.barrier()?;
    let t0 = Instant::now();
    for i in 0..args.iters {
        let t = Instant::now();
        one(node, world, op, &mut inputs, i)?;
        each.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mean = t0.elapsed().as_secs_f64() * 1e6 / args.iters as f64;
    for block in inputs.blocks.drain(..).rev() {
        node.free_symmetric(world, block)?;
    }
    for id in inputs.segments.drain(..) {
        node.free_segment(world, id)?;
    }
    // The ranks' means, averaged with the library's own all-reduce.
    let sum = node.team_all_reduce(world, ReduceOp::Sum, &[mean])?;
    Ok((sum[0] / f64::from(world.size()), median(each)))
}

/// Rank 0's bandwidth of blocking puts of `bytes` to rank 1, in MB/s (NaN elsewhere).
fn put_bandwidth(
    node: &mut Node<AnyTransport, Local>,
    bytes: usize,
    args: &Args,
) -> anyhow::Result<f64> {
    node.barrier()?;
    let mut mb_s = f64::NAN;
    if node.rank() == 0 {
        let data = vec![0x5au8; bytes];
        for _ in 0..args.warmup {
            node.put(1, 0, &data)?;
        }
        let t0 = Instant::now();
        for _ in 0..args.iters {
            node.put(1, 0, &data)?;
        }
        mb_s = (bytes * args.iters) as f64 / t0.elapsed().as_secs_f64() / 1e6;
    }
    node.barrier()?;
    Ok(mb_s)
}

/// `Node::barrier`'s mean latency over the ranks, in µs.
fn node_barrier(
    node: &mut Node<AnyTransport, Local>,
    world: &amnet::Team,
    args: &Args,
) -> anyhow::Result<f64> {
    for _ in 0..args.warmup {
        node.barrier()?;
    }
    let t0 = Instant::now();
    for _ in 0..args.iters {
        node.barrier()?;
    }
    let mean = t0.elapsed().as_secs_f64() * 1e6 / args.iters as f64;
    let sum = node.team_all_reduce(world, ReduceOp::Sum, &[mean])?;
    Ok(sum[0] / f64::from(world.size()))
}

fn rank_main(transport: AnyTransport, args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(transport.size() >= 2, "collectives needs at least 2 ranks");
    let name = transport.info().name;
    let size = transport.size();
    let pongs = Rc::new(Cell::new(0u64));
    let mut node = Node::new(
        transport,
        handlers(&pongs)?,
        Config::from_env_for_ranks(size)?.symmetric_size(heap_size(args)),
    )?;
    let me = node.rank();
    let world = node.world_team();
    let rounds = 32 - (size - 1).leading_zeros();
    let rtt = am_rtt(&mut node, &pongs, args)?;
    let node_barrier_us = node_barrier(&mut node, &world, args)?;
    if me == 0 && !args.json {
        println!(
            "# {name}, {size} ranks, {} collectives after {} warm-up; AM Short round trip \
             {rtt:.3} us, {rounds} rounds; Node::barrier {node_barrier_us:.3} us",
            args.iters, args.warmup
        );
        println!(
            "{:<10} {:<10} {:>8} {:>12} {:>12} {:>14}",
            "transport", "op", "bytes", "mean_us", "p50_us", "ratio_rounds"
        );
    }
    let mut team_barrier_us = None;
    for op in &args.ops {
        let sizes: Vec<usize> = if op == "barrier" {
            vec![0]
        } else {
            args.sizes.clone()
        };
        for bytes in sizes {
            node.barrier()?;
            let (mean, p50) = timed(&mut node, &world, op, bytes, args)?;
            let ratio = mean / (f64::from(rounds) * rtt);
            let to_barrier = (op == "barrier").then_some(mean / node_barrier_us);
            if op == "barrier" {
                team_barrier_us = Some(mean);
            }
            let alloc_to_barrier = team_barrier_us
                .filter(|_| op == "alloc" || op == "segment")
                .map(|b| mean / b);
            let (mb_s, put_mb_s) = if bytes > 0 && op != "alloc" && op != "segment" {
                let put = put_bandwidth(&mut node, bytes, args)?;
                (Some(bytes as f64 / mean), Some(put))
            } else {
                (None, None)
            };
            let to_put = mb_s.zip(put_mb_s).map(|(c, p)| c / p);
            if me == 0 {
                if args.json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "transport": name, "ranks": size, "op": op, "bytes": bytes,
                            "iters": args.iters, "mean_us": mean, "p50_us": p50,
                            "rounds": rounds, "am_rtt_us": rtt,
                            "ratio_to_rounds": ratio,
                            "node_barrier_us": node_barrier_us,
                            "ratio_to_node_barrier": to_barrier,
                            "ratio_to_barrier": alloc_to_barrier,
                            "mb_s": mb_s, "put_mb_s": put_mb_s, "ratio_to_put": to_put,
                        })
                    );
                } else {
                    print!("{name:<10} {op:<10} {bytes:>8} {mean:>12.3} {p50:>12.3} {ratio:>14.2}");
                    if let Some(b) = to_barrier {
                        print!("  (Node::barrier x{b:.3})");
                    }
                    if let Some(b) = alloc_to_barrier {
                        print!("  (team barrier x{b:.3})");
                    }
                    if let (Some(c), Some(p)) = (mb_s, put_mb_s) {
                        print!("  ({c:.1} MB/s, put {p:.1} MB/s: x{:.2})", c / p);
                    }
                    println!();
                }
            }
        }
    }
    node.barrier()?;
    Ok(())
}

/// The symmetric heap the `alloc` rows need: every block of the largest size, warm-up
/// included, at once.
fn heap_size(args: &Args) -> usize {
    if !args.ops.iter().any(|op| op == "alloc") {
        return 0;
    }
    let largest = args.sizes.iter().copied().max().unwrap_or(0);
    let block = largest.max(1).next_multiple_of(amnet::SYMMETRIC_ALIGN);
    (args.iters + args.warmup) * block
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.iters > 0, "--iters must be at least 1");
    let largest = args.sizes.iter().copied().max().unwrap_or(0);
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(args.ranks)
        .segment_size(
            (2 * largest.next_multiple_of(8)).max(JobOptions::default().segment_size)
                + heap_size(&args),
        )
        .prefix_output(!args.json);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
