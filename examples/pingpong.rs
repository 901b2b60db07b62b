//! Ping-pong: AM round-trip latency and flood message rate, per AM kind and payload size.
//!
//! ```text
//! cargo run --release --example pingpong -- [--transport T] [--ranks N] [--kind short|medium|long|all]
//!     [--sizes 0,8,64,512,4096,65536] [--iters N] [--json]
//! ```
//!
//! Rank 0 sends a request to rank 1, whose handler replies with the same kind and size; the
//! round trip is timed per iteration after a warm-up, and the median and 99th percentile are
//! reported. The flood rate is one-way requests per second with many in flight (handlers that
//! do not reply; the credits come back through the core's implicit replies). Other ranks idle.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use amnet::{AmKind, Config, HandlerId, Handlers, JobOptions, Node, Transport, TransportKind};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "AM round-trip latency and message rate between rank 0 and rank 1")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Ranks to start when not under a launcher
    #[arg(long, default_value_t = 2)]
    ranks: u32,
    /// AM kind to measure
    #[arg(long, default_value = "all", value_parser = ["short", "medium", "long", "all"])]
    kind: String,
    /// Payload sizes in bytes for Medium and Long (capped at the transport's limits)
    #[arg(long, value_delimiter = ',', default_value = "0,8,64,512,4096,65536")]
    sizes: Vec<usize>,
    /// Timed round trips per size
    #[arg(long, default_value_t = 10_000)]
    iters: usize,
    /// Untimed round trips first
    #[arg(long, default_value_t = 1_000)]
    warmup: usize,
    /// One-way messages for the flood rate
    #[arg(long, default_value_t = 50_000)]
    flood: usize,
    /// One JSON object per line instead of a table
    #[arg(long)]
    json: bool,
}

const PING: [HandlerId; 3] = [HandlerId(1), HandlerId(2), HandlerId(3)];
const PONG: [HandlerId; 3] = [HandlerId(4), HandlerId(5), HandlerId(6)];
const SINK: [HandlerId; 3] = [HandlerId(7), HandlerId(8), HandlerId(9)];
const KINDS: [AmKind; 3] = [AmKind::Short, AmKind::Medium, AmKind::Long];

fn kind_name(k: AmKind) -> &'static str {
    match k {
        AmKind::Short => "short",
        AmKind::Medium => "medium",
        AmKind::Long => "long",
    }
}

fn handlers(pongs: &Rc<Cell<u64>>) -> anyhow::Result<Handlers> {
    let mut h = Handlers::new();
    for (i, kind) in KINDS.into_iter().enumerate() {
        let pong = PONG[i];
        h.request(PING[i], "ping", kind, move |msg, token| {
            let _ = match kind {
                AmKind::Short => token.reply_short(pong, msg.args()),
                AmKind::Medium => token.reply_medium(pong, msg.args(), msg.payload()),
                AmKind::Long => {
                    let len = msg.payload().len();
                    let data = &msg.segment()[..len];
                    token.reply_long(pong, msg.args(), data, 0)
                }
            };
        })?;
        let p = pongs.clone();
        h.reply(pong, "pong", kind, move |_| p.set(p.get() + 1))?;
        h.request(SINK[i], "sink", kind, |_, _| {})?;
    }
    Ok(h)
}

struct Row {
    kind: AmKind,
    bytes: usize,
    p50: f64,
    p99: f64,
    msgs_per_s: f64,
}

fn send<T: Transport>(
    node: &mut Node<T>,
    kind: AmKind,
    id: HandlerId,
    payload: &[u8],
) -> anyhow::Result<()> {
    match kind {
        AmKind::Short => node.request_short(1, id, &[])?,
        AmKind::Medium => node.request_medium(1, id, &[], payload)?,
        AmKind::Long => node.request_long(1, id, &[], payload, 0)?,
    }
    Ok(())
}

fn measure<T: Transport>(
    node: &mut Node<T>,
    pongs: &Cell<u64>,
    kind: AmKind,
    bytes: usize,
    args: &Args,
) -> anyhow::Result<Row> {
    let i = kind as usize;
    let payload = vec![0x5a; bytes];
    let mut rtt = Vec::with_capacity(args.iters);
    for iter in 0..args.warmup + args.iters {
        let want = pongs.get() + 1;
        let t0 = Instant::now();
        send(node, kind, PING[i], &payload)?;
        node.wait_until(|| pongs.get() == want)?;
        if iter >= args.warmup {
            rtt.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    rtt.sort_by(f64::total_cmp);
    let pct = |p: f64| rtt[((rtt.len() - 1) as f64 * p).round() as usize];
    let t0 = Instant::now();
    for _ in 0..args.flood {
        send(node, kind, SINK[i], &payload)?;
    }
    node.quiesce()?;
    let msgs_per_s = args.flood as f64 / t0.elapsed().as_secs_f64();
    Ok(Row {
        kind,
        bytes,
        p50: pct(0.5),
        p99: pct(0.99),
        msgs_per_s,
    })
}

fn rank_main(transport: amnet::AnyTransport, args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(transport.size() >= 2, "pingpong needs at least 2 ranks");
    let name = transport.name();
    let pongs = Rc::new(Cell::new(0u64));
    let mut node = Node::new(transport, handlers(&pongs)?, Config::from_env()?)?;
    let limits = node.limits();
    let seg = node.segment().len();
    let mut plan = Vec::new();
    for kind in KINDS {
        if args.kind != "all" && args.kind != kind_name(kind) {
            continue;
        }
        let max = match kind {
            AmKind::Short => {
                plan.push((kind, 0));
                continue;
            }
            AmKind::Medium => limits.max_medium,
            AmKind::Long => limits.max_long.min(seg),
        };
        for &s in &args.sizes {
            if s <= max {
                plan.push((kind, s));
            }
        }
    }
    if node.rank() == 0 && !args.json {
        println!(
            "# {name}, {} ranks, {} iterations after {} warm-up, flood of {}",
            node.size(),
            args.iters,
            args.warmup,
            args.flood
        );
        println!(
            "{:<10} {:<7} {:>9} {:>12} {:>12} {:>14}",
            "transport", "kind", "bytes", "rtt_p50_us", "rtt_p99_us", "msgs_per_s"
        );
    }
    for (kind, bytes) in plan {
        node.barrier()?;
        if node.rank() == 0 {
            let row = measure(&mut node, &pongs, kind, bytes, args)?;
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "transport": name, "kind": kind_name(row.kind), "bytes": row.bytes,
                        "iters": args.iters, "rtt_us_p50": row.p50, "rtt_us_p99": row.p99,
                        "msgs_per_s": row.msgs_per_s, "ranks": node.size(),
                    })
                );
            } else {
                println!(
                    "{:<10} {:<7} {:>9} {:>12.3} {:>12.3} {:>14.0}",
                    name,
                    kind_name(row.kind),
                    row.bytes,
                    row.p50,
                    row.p99,
                    row.msgs_per_s
                );
            }
        }
        node.barrier()?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.iters > 0, "--iters must be at least 1");
    let opts = JobOptions {
        transport: args.transport,
        ranks: args.ranks,
        ..JobOptions::default()
    };
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
