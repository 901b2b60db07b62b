//! Several endpoints per process ([`amnet::run_job_endpoints`]) against as many processes,
//! judged as LCI judges threads: `--pairs N` pairs of endpoints flood each other with AM Short
//! requests, once as N threads in each of two processes (one endpoint each) and once as 2N
//! processes of one endpoint, and the aggregate message rates of the two are compared.
//!
//! Two more: the N pairs as threads against one pair alone (`--compare one-pair`), and the
//! round trip of one pair while each process holds a second endpoint that is open and idle
//! (its thread asleep in a barrier), against one endpoint per process (`--compare idle`).
//!
//! ```text
//! AM_WAIT=yield cargo run --release --example endpoint_flood -- --transport sci --compare pairs
//! AM_WAIT=yield cargo run --release --example endpoint_flood -- --transport sci --compare one-pair
//! cargo run --release --example endpoint_flood -- --transport sci --compare idle
//! ```
//!
//! `--compare` runs the jobs in turn (one layout, then the other, `--jobs` times each) and
//! prints the medians and the ratio as one JSON line; without it, one job runs with
//! `--layout` and rank 0 prints its figures.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use amnet::{
    AmKind, AnyTransport, Config, EndpointLayout, HandlerId, Handlers, JobOptions, Node,
    TransportKind, WaitMode,
};
use clap::{Parser, ValueEnum};

#[derive(Parser, Debug, Clone)]
#[command(about = "Endpoints as threads of a process against endpoints as processes")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Pairs of endpoints that flood each other (`--test flood`)
    #[arg(long, default_value_t = 2)]
    pairs: u32,
    /// One job: its endpoints as threads of two processes, or as processes
    #[arg(long, value_enum, default_value = "threads")]
    layout: Layout,
    /// One job's test
    #[arg(long, value_enum, default_value = "flood")]
    test: Test,
    /// With `--test rt` and `--layout threads`: endpoints per process beyond the measuring
    /// one, open and idle
    #[arg(long, default_value_t = 0)]
    idle: u32,
    /// Run both sides of a comparison in turn, `--jobs` jobs each
    #[arg(long, value_enum)]
    compare: Option<Compare>,
    /// Jobs of each side with `--compare`
    #[arg(long, default_value_t = 3)]
    jobs: usize,
    /// Requests each endpoint sends per flood
    #[arg(long, default_value_t = 200_000)]
    flood: u64,
    /// Round trips per round (`--test rt`)
    #[arg(long, default_value_t = 20_000)]
    iters: u64,
    /// Rounds in a job; a job's figure is their median
    #[arg(long, default_value_t = 5)]
    rounds: usize,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Layout {
    /// Two processes of `--pairs` endpoints, one thread each
    Threads,
    /// `2 × --pairs` processes of one endpoint
    Processes,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Test {
    /// Every pair floods both ways; the aggregate rate of the job
    Flood,
    /// One pair's round trips (the other endpoints idle)
    Rt,
}

impl Test {
    /// The name of the test's figure in its JSON line.
    fn key(self) -> &'static str {
        match self {
            Test::Flood => "msgs_per_s",
            Test::Rt => "rt_us",
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
enum Compare {
    /// `--pairs` pairs flooding: threads against processes
    Pairs,
    /// `--pairs` pairs flooding as threads against one pair
    OnePair,
    /// One pair's round trip: a second endpoint open and idle against none
    Idle,
}

const SINK: HandlerId = HandlerId(1);
const PING: HandlerId = HandlerId(2);
const PONG: HandlerId = HandlerId(3);

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One endpoint's part. `me` and `partner` are ranks of the job the transports see; `active`
/// says whether this endpoint measures (an idle one only enters the barriers, asleep).
fn endpoint_main(
    t: AnyTransport,
    partner: u32,
    active: bool,
    args: &Args,
) -> anyhow::Result<Option<f64>> {
    let got = Arc::new(AtomicU64::new(0));
    let strays = Arc::new(AtomicU64::new(0));
    let mut handlers = Handlers::new();
    let (g, stray) = (got.clone(), strays.clone());
    handlers.request(SINK, "sink", AmKind::Short, move |msg, _| {
        // Only the partner floods this endpoint: anything else was misaddressed.
        if msg.src() == partner {
            g.fetch_add(1, Ordering::Relaxed);
        } else {
            stray.fetch_add(1, Ordering::Relaxed);
        }
    })?;
    handlers.request(PING, "ping", AmKind::Short, |_, token| {
        token.reply_short(PONG, &[]).expect("pong");
    })?;
    let g = got.clone();
    handlers.reply(PONG, "pong", AmKind::Short, move |_| {
        g.fetch_add(1, Ordering::Relaxed);
    })?;
    let mut node = Node::new(t, handlers, Config::from_env()?)?;
    if !active {
        // Open and idle: asleep in the barriers the measuring endpoints enter.
        node.set_wait_mode(WaitMode::Block);
    }
    let leader = node.rank() < partner;
    let mut figures = Vec::new();
    for round in 1..=args.rounds as u64 {
        node.barrier()?;
        let t0 = Instant::now();
        if active {
            match args.test {
                Test::Flood => {
                    // Counted from the start: the partner's flood may begin while this
                    // endpoint is still in the barrier.
                    let want = round * args.flood;
                    for i in 0..args.flood {
                        node.request_short(partner, SINK, &[i as u32])?;
                    }
                    node.wait_until(|| got.load(Ordering::Relaxed) >= want)?;
                }
                Test::Rt if leader => {
                    for _ in 0..args.iters {
                        let want = got.load(Ordering::Relaxed) + 1;
                        node.request_short(partner, PING, &[])?;
                        node.wait_until(|| got.load(Ordering::Relaxed) >= want)?;
                    }
                }
                Test::Rt => {}
            }
        }
        node.barrier()?;
        let secs = t0.elapsed().as_secs_f64();
        figures.push(match args.test {
            // Messages of the whole job per second: every pair, both ways.
            Test::Flood => 2.0 * f64::from(args.pairs) * args.flood as f64 / secs,
            Test::Rt => secs / args.iters as f64 * 1e6,
        });
    }
    anyhow::ensure!(
        strays.load(Ordering::Relaxed) == 0,
        "endpoint {} got {} requests from endpoints other than {partner}",
        node.rank(),
        strays.load(Ordering::Relaxed)
    );
    if active && args.test == Test::Flood {
        let sent = args.rounds as u64 * args.flood;
        anyhow::ensure!(
            got.load(Ordering::Relaxed) == sent,
            "endpoint {} handled {} requests of {sent}",
            node.rank(),
            got.load(Ordering::Relaxed)
        );
    }
    Ok((node.rank() == 0).then(|| median(&mut figures)))
}

fn report(args: &Args, figure: f64) {
    let value = match args.test {
        Test::Flood => format!("{figure:.4e}"),
        Test::Rt => format!("{figure:.4}"),
    };
    println!(
        "{{\"transport\":\"{}\",\"layout\":\"{:?}\",\"pairs\":{},\"idle\":{},\"{}\":{value}}}",
        args.transport.name(),
        args.layout,
        args.pairs,
        args.idle,
        args.test.key()
    );
}

/// One job of `args.layout`.
fn job(args: &Args) -> anyhow::Result<i32> {
    let (processes, per_process, active) = match (args.layout, args.test) {
        (Layout::Threads, Test::Flood) => (2, args.pairs, args.pairs),
        (Layout::Processes, Test::Flood) => (2 * args.pairs, 1, 1),
        (Layout::Threads, Test::Rt) => (2, 1 + args.idle, 1),
        (Layout::Processes, Test::Rt) => (2, 1, 1),
    };
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(processes)
        .prefix_output(false);
    let code = amnet::run_job_endpoints(&opts, per_process, |endpoints| {
        let layout = endpoints.layout();
        let process = endpoints.process();
        std::thread::scope(|s| -> anyhow::Result<()> {
            let threads: Vec<_> = endpoints
                .into_transports()
                .into_iter()
                .enumerate()
                .map(|(e, t)| {
                    let e = e as u32;
                    let (partner, is_active) = partner_of(layout, process, e, active);
                    std::thread::Builder::new()
                        .name(format!("endpoint-{e}"))
                        .spawn_scoped(s, move || endpoint_main(t, partner, is_active, args))
                })
                .collect::<Result<_, _>>()?;
            for t in threads {
                if let Some(figure) = t.join().expect("an endpoint's thread panicked")? {
                    report(args, figure);
                }
            }
            Ok(())
        })
    })?;
    Ok(code)
}

/// The endpoint a rank's endpoint exchanges with, and whether it is one of the measuring ones.
fn partner_of(layout: EndpointLayout, process: u32, e: u32, active: u32) -> (u32, bool) {
    if layout.per_process() == 1 {
        // Processes paired in turn: 0 with 1, 2 with 3, ...
        (process ^ 1, true)
    } else {
        // The same endpoint of the other process.
        (layout.rank(1 - process, e), e < active)
    }
}

/// Both sides of a comparison, in turn, each a job of its own (this program again).
fn compare(args: &Args, what: Compare) -> anyhow::Result<()> {
    // Each side: layout, test, idle endpoints, pairs.
    let sides: [(Layout, Test, u32, u32); 2] = match what {
        Compare::Pairs => [
            (Layout::Threads, Test::Flood, 0, args.pairs),
            (Layout::Processes, Test::Flood, 0, args.pairs),
        ],
        Compare::OnePair => [
            (Layout::Threads, Test::Flood, 0, args.pairs),
            (Layout::Threads, Test::Flood, 0, 1),
        ],
        Compare::Idle => [
            (Layout::Threads, Test::Rt, 1, 1),
            (Layout::Threads, Test::Rt, 0, 1),
        ],
    };
    let mut figures = [Vec::new(), Vec::new()];
    let mut ratios = Vec::new();
    for round in 0..args.jobs {
        let mut pair = [0.0; 2];
        // A B, then B A: neither side always runs first.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let (layout, test, idle, pairs) = sides[side];
            let out = Command::new(std::env::current_exe()?)
                .args(["--transport", args.transport.name()])
                .args(["--pairs", &pairs.to_string()])
                .args(["--layout", &format!("{layout:?}").to_lowercase()])
                .args(["--test", &format!("{test:?}").to_lowercase()])
                .args(["--idle", &idle.to_string()])
                .args(["--flood", &args.flood.to_string()])
                .args(["--iters", &args.iters.to_string()])
                .args(["--rounds", &args.rounds.to_string()])
                .output()?;
            anyhow::ensure!(
                out.status.success(),
                "{layout:?} job failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line = String::from_utf8(out.stdout)?;
            let row: serde_json::Value =
                serde_json::from_str(line.trim()).map_err(|e| anyhow::anyhow!("{e}: {line:?}"))?;
            let key = test.key();
            pair[side] = row[key]
                .as_f64()
                .ok_or_else(|| anyhow::anyhow!("no {key}: {row}"))?;
            figures[side].push(pair[side]);
        }
        ratios.push(pair[0] / pair[1]);
    }
    let names = match what {
        Compare::Pairs => ["threads_msgs_per_s", "processes_msgs_per_s"],
        Compare::OnePair => ["pairs_msgs_per_s", "one_pair_msgs_per_s"],
        Compare::Idle => ["idle_endpoint_rt_us", "one_endpoint_rt_us"],
    };
    let ratio_list: Vec<String> = ratios.iter().map(|r| format!("{r:.3}")).collect();
    println!(
        "{{\"transport\":\"{}\",\"compare\":\"{:?}\",\"pairs\":{},\"{}\":{:.4e},\"{}\":{:.4e},\"ratios\":[{}],\"median_ratio\":{:.3}}}",
        args.transport.name(),
        what,
        args.pairs,
        names[0],
        median(&mut figures[0]),
        names[1],
        median(&mut figures[1]),
        ratio_list.join(","),
        median(&mut ratios)
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.pairs > 0, "--pairs must be at least 1");
    if let Some(what) = args.compare {
        return compare(&args, what);
    }
    let code = job(&args)?;
    std::process::exit(code);
}
