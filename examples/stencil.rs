//! A 2-D Jacobi stencil: the grid's columns split among the ranks, halos exchanged with
//! strided puts and handed off with put-with-signal, checked against a sequential run.
//!
//! ```text
//! cargo run --release --example stencil -- [--transport T] [--ranks N] [--rows 256]
//!     [--cols 256] [--iters 200] [--json]
//! ```
//!
//! The grid (`--rows` x `--cols` `f64`s, row-major, the top row held at 1.0, the other edges at
//! 0.0, an uneven pattern inside) is cut into blocks of columns, one per rank. Each rank keeps two
//! copies of its block, with a halo column on each side, in its segment (iteration `t` reads copy
//! `t % 2` and writes the other). After computing an iteration it writes its edge columns into its
//! neighbours' halo columns of the copy they read next: one `put_strided` each (a column of a
//! row-major array is one `f64` every row), then an empty `put_signal` that adds 1 to the
//! neighbour's counter; before the next iteration it waits in `wait_word` until both neighbours'
//! counters say so. In `AM_WAIT=block` a rank sleeps there until the signal wakes it. A neighbour
//! writes the copy this rank reads only after this rank's own signal of the iteration before, sent
//! after this rank read that copy: the halos never overwrite what is being read.
//!
//! At the end every rank compares its block with a sequential run of the whole grid (the
//! same operations in the same order: equal bit for bit) and rank 0 prints the time per
//! iteration; a difference is an error.

use std::time::Instant;

use amnet::{
    AnyTransport, Cmp, Config, Handlers, JobOptions, Node, Signal, Transport, TransportKind,
};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "2-D Jacobi stencil with strided halo puts and put-with-signal hand-offs")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Ranks to start when not under a launcher
    #[arg(long, default_value_t = 2)]
    ranks: u32,
    /// Grid rows
    #[arg(long, default_value_t = 256)]
    rows: usize,
    /// Grid columns (at least one per rank)
    #[arg(long, default_value_t = 256)]
    cols: usize,
    /// Iterations
    #[arg(long, default_value_t = 200)]
    iters: usize,
    /// One JSON object instead of a line of text
    #[arg(long)]
    json: bool,
}

/// The segment's layout: two counters (signals from the left and right neighbours), then
/// the two copies of the block.
const LEFT_COUNT: usize = 0;
const RIGHT_COUNT: usize = 8;
const GRID: usize = 64;

/// One Jacobi step of the whole grid `a` (`rows` x `cols`) into `b`: the edges stay.
fn step(a: &[f64], b: &mut [f64], rows: usize, cols: usize) {
    for r in 1..rows - 1 {
        for c in 1..cols - 1 {
            let i = r * cols + c;
            b[i] = 0.25 * (a[i - cols] + a[i + cols] + a[i - 1] + a[i + 1]);
        }
    }
}

/// The grid at the start: the top row 1.0, an uneven pattern inside (so that a halo from
/// the wrong column, row or iteration changes the result), the other edges 0.0.
fn initial(rows: usize, cols: usize) -> Vec<f64> {
    let mut g = vec![0.0; rows * cols];
    for r in 1..rows - 1 {
        for c in 1..cols - 1 {
            g[r * cols + c] = ((r * 7 + c * 13) % 17) as f64 / 17.0;
        }
    }
    g[..cols].fill(1.0);
    g
}

fn rank_main(transport: AnyTransport, args: &Args) -> anyhow::Result<()> {
    let name = transport.info().name;
    let (rows, cols) = (args.rows, args.cols);
    let size = transport.size() as usize;
    let mut node = Node::new(
        transport,
        Handlers::local(),
        Config::from_env_for_ranks(size as u32)?,
    )?;
    let me = node.rank() as usize;
    // This rank's columns [first, first + mine), and its block with a halo on each side.
    let first = cols * me / size;
    let mine = cols * (me + 1) / size - first;
    // Rank `r`'s block width (halos included), and where its copy `p` starts in its segment.
    let width_of = |r: usize| cols * (r + 1) / size - cols * r / size + 2;
    let copy_of = |r: usize, p: usize| GRID + p * rows * width_of(r) * 8;
    let width = width_of(me);
    let copy_bytes = rows * width * 8;
    let copy_at = |p: usize| copy_of(me, p);
    let left = (me > 0).then(|| me - 1);
    let right = (me + 1 < size).then(|| me + 1);

    // Copy 0 holds the initial block, halos included; copy 1 its edges (which stay).
    let start = initial(rows, cols);
    let mut block = vec![0.0f64; rows * width];
    for r in 0..rows {
        for c in 0..width {
            let g = (first + c).checked_sub(1).filter(|&g| g < cols);
            block[r * width + c] = g.map_or(0.0, |g| start[r * cols + g]);
        }
    }
    let bytes = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for p in 0..2 {
        node.segment().write(copy_at(p), &bytes(&block))?;
    }
    node.barrier()?;

    let t0 = Instant::now();
    let mut next = block.clone();
    let mut raw = vec![0u8; copy_bytes];
    for t in 0..args.iters {
        let (p, q) = (t % 2, 1 - t % 2);
        // Both neighbours' halos of iteration t - 1 are in copy p.
        let want = t as u64;
        if left.is_some() {
            node.wait_word(LEFT_COUNT, Cmp::Ge, want)?;
        }
        if right.is_some() {
            node.wait_word(RIGHT_COUNT, Cmp::Ge, want)?;
        }
        node.segment().read(copy_at(p), &mut raw)?;
        for (x, b) in block.iter_mut().zip(raw.chunks_exact(8)) {
            *x = f64::from_le_bytes(b.try_into()?);
        }
        // The grid's edge rows and the outermost columns stay as they are.
        next.copy_from_slice(&block);
        for r in 1..rows - 1 {
            for c in 1..width - 1 {
                let g = first + c - 1;
                if g == 0 || g == cols - 1 {
                    continue;
                }
                let i = r * width + c;
                next[i] =
                    0.25 * (block[i - width] + block[i + width] + block[i - 1] + block[i + 1]);
            }
        }
        // The interior only: a neighbour may have written this copy's halos already.
        for r in 0..rows {
            let row = &next[r * width + 1..(r + 1) * width - 1];
            node.segment()
                .write(copy_at(q) + (r * width + 1) * 8, &bytes(row))?;
        }
        // Edge columns into the neighbours' halo columns of copy q (one f64 a row: a
        // strided put), then the signal that they are there.
        let column = |c: usize| bytes(&(0..rows).map(|r| next[r * width + c]).collect::<Vec<_>>());
        if let Some(l) = left {
            let (their_row, halo) = (width_of(l) * 8, copy_of(l, q) + (width_of(l) - 1) * 8);
            node.put_strided(l as u32, halo, their_row, 8, &column(1))?;
            node.put_signal(l as u32, 0, &[], RIGHT_COUNT, Signal::Add(1))?;
        }
        if let Some(r) = right {
            node.put_strided(r as u32, copy_of(r, q), width_of(r) * 8, 8, &column(mine))?;
            node.put_signal(r as u32, 0, &[], LEFT_COUNT, Signal::Add(1))?;
        }
        std::mem::swap(&mut block, &mut next);
    }
    // The last iteration's halos must have landed before anyone leaves.
    node.barrier()?;
    let per_iter_us = t0.elapsed().as_secs_f64() * 1e6 / args.iters as f64;

    // The sequential run, and this rank's columns of it.
    let (mut a, mut b) = (start.clone(), start);
    for _ in 0..args.iters {
        step(&a, &mut b, rows, cols);
        std::mem::swap(&mut a, &mut b);
    }
    let last = copy_at(args.iters % 2);
    node.segment().read(last, &mut raw)?;
    let mut wrong = 0;
    for r in 0..rows {
        for c in 1..=mine {
            let at = (r * width + c) * 8;
            let got = f64::from_le_bytes(raw[at..at + 8].try_into()?);
            if got.to_bits() != a[r * cols + first + c - 1].to_bits() {
                wrong += 1;
            }
        }
    }
    anyhow::ensure!(
        wrong == 0,
        "rank {me}: {wrong} of {} values differ from the sequential run",
        rows * mine
    );
    node.barrier()?;
    if me == 0 {
        if args.json {
            println!(
                "{}",
                serde_json::json!({
                    "transport": name, "ranks": size, "rows": rows, "cols": cols,
                    "iters": args.iters, "us_per_iter": per_iter_us, "checked": true,
                })
            );
        } else {
            println!(
                "stencil: {name}, {size} ranks, {rows} x {cols}, {} iterations: \
                 {per_iter_us:.2} us per iteration, equal to the sequential run",
                args.iters
            );
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ranks = args.ranks as usize;
    anyhow::ensure!(
        args.rows >= 3 && args.cols >= ranks.max(3),
        "the grid is too small"
    );
    // The widest block's two copies.
    let width = args.cols.div_ceil(ranks) + 2;
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(args.ranks)
        .segment_size((GRID + 2 * args.rows * width * 8).max(JobOptions::default().segment_size))
        .prefix_output(!args.json);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
