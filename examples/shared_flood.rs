//! Message rate of several threads sharing one node ([`amnet::SharedNode`]) against one
//! thread per rank, in the same run: each rank floods the other with AM Short requests, by
//! one thread on a plain [`amnet::Node`], then by `--threads` threads on a shared one; the
//! rounds alternate the two, and rank 0 prints the median aggregate rates and their ratio.
//!
//! ```text
//! AM_WAIT=yield cargo run --release --example shared_flood -- --transport sci --threads 2
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use amnet::{
    AmKind, Config, HandlerId, Handlers, JobOptions, Node, SharedNode, Transport, TransportKind,
};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Aggregate AM Short flood: threads sharing one node against one thread per rank")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Threads per rank on the shared node
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Requests each rank sends per flood
    #[arg(long, default_value_t = 200_000)]
    flood: u64,
    /// Rounds (each measures both ways once)
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

const SINK: HandlerId = HandlerId(1);

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rank_main(t: amnet::AnyTransport, args: &Args) -> anyhow::Result<()> {
    let got = Arc::new(AtomicU64::new(0));
    let mut handlers = Handlers::new();
    let g = got.clone();
    handlers.request(SINK, "sink", AmKind::Short, move |_, _| {
        g.fetch_add(1, Ordering::Relaxed);
    })?;
    let mut node = Node::new(t, handlers, Config::from_env()?)?;
    anyhow::ensure!(node.size() == 2, "run with 2 ranks");
    let peer = 1 - node.rank();
    let n = args.flood;
    let threads = args.threads.max(1);
    let (mut single, mut shared) = (Vec::new(), Vec::new());
    let mut expected = 0;
    for round in 0..args.rounds {
        for shared_turn in [round % 2 == 1, round % 2 == 0] {
            node.barrier()?;
            // Counted from the start: the peer's flood may begin, and be handled here, while
            // this rank is still in the barrier.
            expected += n;
            let want = expected;
            let t0 = Instant::now();
            if shared_turn {
                let sn = SharedNode::new(node);
                std::thread::scope(|s| -> anyhow::Result<()> {
                    let senders: Vec<_> = (0..threads)
                        .map(|k| {
                            let sn = sn.clone();
                            let count = n / u64::from(threads)
                                + u64::from(u64::from(k) < n % u64::from(threads));
                            s.spawn(move || -> Result<(), amnet::AmError> {
                                for i in 0..count {
                                    sn.request_short(peer, SINK, &[i as u32])?;
                                }
                                Ok(())
                            })
                        })
                        .collect();
                    for h in senders {
                        h.join().expect("a sender panicked")?;
                    }
                    Ok(())
                })?;
                sn.wait_until(|| got.load(Ordering::Relaxed) >= want)?;
                node = sn.into_inner().expect("every sender's share was dropped");
            } else {
                for i in 0..n {
                    node.request_short(peer, SINK, &[i as u32])?;
                }
                node.wait_until(|| got.load(Ordering::Relaxed) >= want)?;
            }
            let rate = 2.0 * n as f64 / t0.elapsed().as_secs_f64() / 1e6;
            if shared_turn {
                &mut shared
            } else {
                &mut single
            }
            .push(rate);
        }
    }
    node.barrier()?;
    // Every request of every flood arrived once: none lost (the waits would not have ended),
    // none doubled.
    let sent = 2 * args.rounds as u64 * n;
    anyhow::ensure!(
        got.load(Ordering::Relaxed) == sent,
        "rank {} handled {} requests of {sent}",
        node.rank(),
        got.load(Ordering::Relaxed)
    );
    if node.rank() == 0 {
        let (one, many) = (median(&mut single), median(&mut shared));
        println!(
            "{{\"transport\":\"{}\",\"threads\":{threads},\"single_msgs_per_s\":{:.3e},\"shared_msgs_per_s\":{:.3e},\"shared_to_single\":{:.3}}}",
            node.transport().info().name,
            one * 1e6,
            many * 1e6,
            many / one
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(2)
        .prefix_output(false);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
