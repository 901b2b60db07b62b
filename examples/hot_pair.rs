//! Seed 001's measure of a credit policy: in a job of many ranks, rank 0 floods rank 1 with
//! AM Short requests (the hot pair) while every other rank trickles requests to rank 1, one at
//! a time. Rank 1 counts each sender's requests and the job fails unless every one arrived
//! exactly once (and with `--payload N`, as AM Mediums of N bytes, each intact); rank 0
//! prints the hot pair's flood rate, the credits in force and how many it held toward rank 1
//! at the end.
//!
//! ```text
//! AM_CREDITS=32 cargo run --release --example hot_pair -- --transport sci --ranks 64
//! AM_CREDITS=dynamic cargo run --release --example hot_pair -- --transport sci --ranks 64
//! ```
//!
//! Static credits give the hot sender its share whatever the others do; dynamic ones start it
//! with 2 and lend it more from rank 1's bank as it stalls, so the rate under `dynamic`
//! against the rate under the static default is what lending recovers of what the smaller
//! receive memory gave up.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use amnet::{AmKind, Config, HandlerId, Handlers, JobOptions, Node, Transport, TransportKind};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "A hot pair's AM Short flood while the other ranks trickle to the same target")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Ranks to start when not under a launcher (at least 2)
    #[arg(long, default_value_t = 64)]
    ranks: u32,
    /// Requests rank 0 sends rank 1 per round
    #[arg(long, default_value_t = 100_000)]
    flood: u64,
    /// Requests each other rank sends rank 1 per round, one at a time
    #[arg(long, default_value_t = 20)]
    trickle: u64,
    /// Rounds; the rate printed is their median
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Payload bytes: 0 sends AM Shorts, more sends AM Mediums of that size
    #[arg(long, default_value_t = 0)]
    payload: usize,
}

const SINK: HandlerId = HandlerId(1);

/// The byte every payload from rank `src` is filled with.
fn pattern(src: u32) -> u8 {
    (src as u8).wrapping_add(1)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rank_main(t: amnet::AnyTransport, args: &Args) -> anyhow::Result<()> {
    let size = t.size();
    anyhow::ensure!(size >= 2, "run with at least 2 ranks");
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..size).map(|_| AtomicU64::new(0)).collect());
    // Requests whose payload is not what their sender wrote.
    let damaged = Arc::new(AtomicU64::new(0));
    let mut handlers = Handlers::new();
    let (c, d) = (counts.clone(), damaged.clone());
    let kind = if args.payload > 0 {
        AmKind::Medium
    } else {
        AmKind::Short
    };
    let want_len = args.payload;
    handlers.request(SINK, "sink", kind, move |m, _| {
        let fill = pattern(m.src());
        if m.payload().len() != want_len || m.payload().iter().any(|&b| b != fill) {
            d.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(n) = c.get(m.src() as usize) {
            n.fetch_add(1, Ordering::Relaxed);
        }
    })?;
    let payload = vec![pattern(t.rank()); args.payload];
    let mut node = Node::new(t, handlers, Config::from_env_for_ranks(size)?)?;
    let rank = node.rank();
    let mut rates = Vec::new();
    let send = |node: &mut Node<amnet::AnyTransport>, args: &[u32]| {
        if payload.is_empty() {
            node.request_short(1, SINK, args)
        } else {
            node.request_medium(1, SINK, args, &payload)
        }
    };
    for round in 0..args.rounds {
        node.barrier()?;
        match rank {
            0 => {
                let t0 = Instant::now();
                for i in 0..args.flood {
                    send(&mut node, &[i as u32])?;
                }
                node.quiesce()?;
                rates.push(args.flood as f64 / t0.elapsed().as_secs_f64());
            }
            1 => {}
            _ => {
                for i in 0..args.trickle {
                    send(&mut node, &[round as u32, i as u32])?;
                    node.quiesce()?;
                }
            }
        }
        node.barrier()?;
    }
    if rank == 1 {
        // Every request arrived (the senders' quiesce waited for each to be answered), none
        // twice, and each as its sender wrote it.
        let bad = damaged.load(Ordering::Relaxed);
        anyhow::ensure!(bad == 0, "rank 1 got {bad} requests with a damaged payload");
        let rounds = args.rounds as u64;
        for (src, n) in counts.iter().enumerate() {
            let want = match src {
                0 => rounds * args.flood,
                1 => 0,
                _ => rounds * args.trickle,
            };
            let got = n.load(Ordering::Relaxed);
            anyhow::ensure!(
                got == want,
                "rank 1 got {got} requests from rank {src}, not {want}"
            );
        }
    }
    node.barrier()?;
    if rank == 0 {
        println!(
            "{{\"transport\":\"{}\",\"ranks\":{size},\"credits\":\"{}\",\"flood\":{},\"hot_msgs_per_s\":{:.4e},\"held_toward_1\":{}}}",
            node.transport().info().name,
            node.config().credits.unwrap_or_default(),
            args.flood,
            median(&mut rates),
            node.credit_policy().held(1),
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(args.ranks)
        .prefix_output(false);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
