//! Hand-off: the round trip of a put-with-signal to a rank waiting on its signal word,
//! beside an AM Short round trip and a plain put whose target polls the word, measured in
//! the same job between ranks 0 and 1.
//!
//! ```text
//! cargo run --release --example handoff -- [--transport T] [--bytes N] [--iters N] [--json]
//! ```
//!
//! Three rows, each the median of `--iters` round trips after a warm-up:
//! - `am_short`: rank 0 sends an AM Short request, rank 1's handler replies.
//! - `put_poll`: each rank puts `--bytes` and then a sequence number into the other's
//!   segment with two plain puts, and polls its own word (`Node::poll` in a loop) until the
//!   other's number is there: what a user wrote before `put_signal`.
//! - `put_signal`: each rank hands `--bytes` off with `put_signal(.., Signal::Set(n))` and
//!   waits in `wait_word(.., Cmp::Eq, n)`: in `AM_WAIT=block` it sleeps until the signal
//!   wakes it.
//!
//! Rows carry `ratio_to_am_short` and `ratio_to_put_poll` (medians of the same job). Run it
//! with `AM_WAIT=block` and both ranks on one core (`taskset -c 0`) to see the sleeping
//! waiter; `put_poll` then spins through its time slices and is not comparable.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use amnet::{
    AmKind, AnyTransport, Cmp, Config, HandlerId, Handlers, JobOptions, Local, Node, Signal,
    Transport, TransportKind,
};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Put-with-signal hand-off round trip, beside an AM round trip and put-and-poll")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Bytes handed off each way
    #[arg(long, default_value_t = 8)]
    bytes: usize,
    /// Timed round trips per row
    #[arg(long, default_value_t = 10_000)]
    iters: usize,
    /// Untimed round trips first
    #[arg(long, default_value_t = 1_000)]
    warmup: usize,
    /// Skip the put-and-poll row (it spins: pointless with both ranks on one core)
    #[arg(long)]
    no_poll: bool,
    /// One JSON object per line instead of a table
    #[arg(long)]
    json: bool,
}

const PING: HandlerId = HandlerId(1);
const PONG: HandlerId = HandlerId(2);
/// The signal word; the data follows it.
const WORD: usize = 0;
const DATA: usize = 64;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Rank 0's round trips of `one` (a send and the wait for the answer), in µs; rank 1 runs
/// `answer` as often. `n` counts from 1 across the rows, so that no row sees the last one's
/// word.
fn timed(
    node: &mut Node<AnyTransport, Local>,
    args: &Args,
    n: &mut u64,
    mut one: impl FnMut(&mut Node<AnyTransport, Local>, u64) -> anyhow::Result<()>,
    mut answer: impl FnMut(&mut Node<AnyTransport, Local>, u64) -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    node.barrier()?;
    let mut rtt = Vec::with_capacity(args.iters);
    for i in 0..args.warmup + args.iters {
        *n += 1;
        if node.rank() == 0 {
            let t0 = Instant::now();
            one(node, *n)?;
            if i >= args.warmup {
                rtt.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        } else if node.rank() == 1 {
            answer(node, *n)?;
        }
    }
    node.barrier()?;
    Ok(median(rtt))
}

/// Polls until this rank's signal word holds `n`.
fn poll_for(node: &mut Node<AnyTransport, Local>, n: u64) -> anyhow::Result<()> {
    while node.segment().load_u64(WORD)? != n {
        node.poll()?;
    }
    Ok(())
}

fn rank_main(transport: AnyTransport, args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(transport.size() >= 2, "handoff needs at least 2 ranks");
    let name = transport.info().name;
    let size = transport.size();
    let pongs = Rc::new(Cell::new(0u64));
    let pings = Rc::new(Cell::new(0u64));
    let mut h = Handlers::local();
    let q = pings.clone();
    h.request(PING, "ping", AmKind::Short, move |msg, token| {
        q.set(q.get() + 1);
        let _ = token.reply_short(PONG, msg.args());
    })?;
    let p = pongs.clone();
    h.reply(PONG, "pong", AmKind::Short, move |_| p.set(p.get() + 1))?;
    let mut node = Node::new(transport, h, Config::from_env_for_ranks(size)?)?;
    let data = vec![0x5a; args.bytes];
    let peer = 1 - node.rank().min(1);
    let mut n = 0;

    let am = timed(
        &mut node,
        args,
        &mut n,
        |node, _| {
            let want = pongs.get() + 1;
            node.request_short(1, PING, &[])?;
            node.wait_until(|| pongs.get() == want)?;
            Ok(())
        },
        {
            // Rank 1 answers in its handler; here it waits until it has answered one more.
            let mut answered = 0;
            move |node, _| {
                answered += 1;
                node.wait_until(|| pings.get() >= answered)?;
                Ok(())
            }
        },
    )?;
    let poll = if args.no_poll {
        f64::NAN
    } else {
        let go = |node: &mut Node<AnyTransport, Local>, n: u64| -> anyhow::Result<()> {
            node.put(peer, DATA, &data)?;
            node.put(peer, WORD, &n.to_le_bytes())?;
            Ok(())
        };
        timed(
            &mut node,
            args,
            &mut n,
            |node, n| {
                go(node, n)?;
                poll_for(node, n)
            },
            |node, n| {
                poll_for(node, n)?;
                go(node, n)
            },
        )?
    };
    let signal = timed(
        &mut node,
        args,
        &mut n,
        |node, n| {
            node.put_signal(peer, DATA, &data, WORD, Signal::Set(n))?;
            node.wait_word(WORD, Cmp::Eq, n)?;
            Ok(())
        },
        |node, n| {
            node.wait_word(WORD, Cmp::Eq, n)?;
            node.put_signal(peer, DATA, &data, WORD, Signal::Set(n))?;
            Ok(())
        },
    )?;
    if node.rank() == 0 {
        let wait = std::env::var("AM_WAIT").unwrap_or_else(|_| "default".into());
        for (row, us) in [("am_short", am), ("put_poll", poll), ("put_signal", signal)] {
            if us.is_nan() {
                continue;
            }
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "transport": name, "row": row, "bytes": args.bytes,
                        "wait": wait, "iters": args.iters, "rtt_us_p50": us,
                        "ratio_to_am_short": us / am,
                        "ratio_to_put_poll": if poll.is_nan() { None } else { Some(us / poll) },
                    })
                );
            } else {
                println!(
                    "{name:<9} {row:<11} {:>7} B  {us:>10.3} us  x{:.2} AM Short  x{:.2} put-poll",
                    args.bytes,
                    us / am,
                    us / poll
                );
            }
        }
    }
    node.barrier()?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.iters > 0, "--iters must be at least 1");
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(2)
        .segment_size((DATA + args.bytes).max(JobOptions::default().segment_size))
        .prefix_output(!args.json);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
