//! Ping-pong: AM round-trip latency and flood message rate, per AM kind and payload size.
//!
//! ```text
//! cargo run --release --example pingpong -- [--transport T] [--ranks N]
//!     [--kind short|medium|long|atomic|all]
//!     [--sizes 0,8,64,512,4096,65536] [--iters N] [--json] [--baseline]
//! ```
//!
//! Rank 0 sends a request to rank 1, whose handler replies with the same kind and size; the
//! round trip is timed per iteration after a warm-up, and the median and 99th percentile are
//! reported. Two flood rates, with many requests in flight: `msgs_per_s`, one-way requests
//! per second (handlers that do not reply; the credits come back through the core's implicit
//! replies, GASNet testam's "flood one-way Req"), and `replied_per_s`, requests per second
//! whose handlers reply as in the round trip (each counted once its reply arrived). Other
//! ranks wait in barriers.
//!
//! The `atomic` row (kind `atomic`, 8 bytes) times a remote fetch-and-add on a `u64` of rank
//! 1's segment instead: the median round trip of blocking ones, and the rate of non-blocking
//! ones with up to 64 in flight (both rate columns). On the shared-memory NICs and loopback
//! it is an atomic instruction on rank 1's word, which rank 1 does not handle at all. The
//! `atomic-f64` row does the same with an `f64` fetch-and-add (a compare-and-swap loop where
//! the CPU has no float add).
//!
//! AM Short carries no payload, so it is measured once (0 bytes); `--sizes` applies to Medium
//! and Long. A size above the transport's limit (AM Medium, or AM Long per message) is skipped
//! with a note on stderr.
//!
//! `--baseline` also measures, in the same job and between the same two ranks, the raw floor
//! of the transport: the same round trip with no library in between (on `loopback`, whose
//! ranks are threads, an atomic ping-pong on one cache line). Every row then carries the floor
//! and `ratio` = AM round trip / floor (medians). Transports without a floor yet say so on
//! stderr and leave those fields `null`. On the shared-memory transports it also measures the
//! flood's floor, one-line messages through a raw single-producer ring between the same two
//! ranks (`am_shm::floor::ring_flood`): `ring_floor_msgs_per_s`, and `flood_to_ring` =
//! `msgs_per_s` / that.

use amnet::Local;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use amnet::{
    AmKind, AnyTransport, AtomicOp, Config, HandlerId, Handlers, JobOptions, Node, Rank, Transport,
    TransportKind,
};
use clap::Parser;
use crossbeam_utils::CachePadded;

#[derive(Parser, Debug)]
#[command(about = "AM round-trip latency and message rate between rank 0 and rank 1")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Ranks to start when not under a launcher
    #[arg(long, default_value_t = 2)]
    ranks: u32,
    /// AM kind to measure, or `atomic` (remote fetch-and-add on a u64 of rank 1's segment)
    #[arg(long, default_value = "all", value_parser = ["short", "medium", "long", "atomic", "all"])]
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
    /// Requests per flood (one-way, then replied)
    #[arg(long, default_value_t = 50_000)]
    flood: usize,
    /// One JSON object per line instead of a table
    #[arg(long)]
    json: bool,
    /// Also measure the transport's raw floor and print the ratio to it
    #[arg(long)]
    baseline: bool,
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

fn handlers(pongs: &Rc<Cell<u64>>) -> anyhow::Result<Handlers<Local>> {
    let mut h = Handlers::local();
    for (i, kind) in KINDS.into_iter().enumerate() {
        let pong = PONG[i];
        // Echoes reply with the payload where it was received (the receive buffer, or for a
        // Long the segment): the transport copies it once, straight into the reply.
        h.request(PING[i], "ping", kind, move |msg, token| {
            let _ = match kind {
                AmKind::Short => token.reply_short(pong, msg.args()),
                AmKind::Medium => token.reply_medium(pong, msg.args(), msg.payload_ref()),
                AmKind::Long => token.reply_long(pong, msg.args(), msg.payload_ref(), 0),
            };
        })?;
        let p = pongs.clone();
        h.reply(pong, "pong", kind, move |_| p.set(p.get() + 1))?;
        h.request(SINK[i], "sink", kind, |_, _| {})?;
    }
    Ok(h)
}

/// A round trip with no library in between, between ranks 0 and 1.
struct Floor {
    /// What was measured.
    what: &'static str,
    /// Rank 0: round trips in µs, sorted. Empty on rank 1.
    rtt_us: Vec<f64>,
    /// Shared-memory NICs, rank 0: the two-line ping-pong's round trips in µs, sorted; the
    /// least a design pays whose request and reply land on different lines, as theirs do.
    two_line_us: Vec<f64>,
    /// Rank 0: one-way messages per second through a raw single-producer ring of one-line
    /// messages between the two ranks (`am_shm::floor::ring_flood`), the floor of a flood;
    /// `None` where there is none (udp).
    ring_msgs_per_s: Option<f64>,
}

/// Messages the ring floor moves (at least): tens of milliseconds of a raw ring.
const RING_FLOOR_MESSAGES: usize = 1 << 21;

/// The raw floor of `kind`, measured between ranks 0 and 1: both call this (right after a
/// barrier), the other ranks do not. `None`: no floor for this transport yet.
///
/// This is the one place a transport's floor plugs in: shared-memory NICs (sci, extoll,
/// portals) call `am_shm::floor::cacheline_pingpong`, `two_line_pingpong` and `ring_flood`
/// between the rank processes, loopback the same between its rank threads, UDP a plain UDP
/// ping-pong; `node` gives access to the transport and to barriers.
fn floor(
    kind: TransportKind,
    node: &mut Node<AnyTransport, Local>,
    warmup: usize,
    iters: usize,
) -> anyhow::Result<Option<Floor>> {
    Ok(match kind {
        TransportKind::Loopback => {
            let rtt_us = thread_floor(node.rank(), warmup, iters);
            // The rank threads share one heap ring, made by whichever comes first.
            static RING: std::sync::OnceLock<am_shm::Segment> = std::sync::OnceLock::new();
            let seg = match RING.get() {
                Some(seg) => seg,
                None => {
                    let fresh = am_shm::floor::ring_segment()?;
                    RING.get_or_init(|| fresh)
                }
            };
            let ring = am_shm::floor::ring_flood_on(seg, node.rank(), RING_FLOOR_MESSAGES)?;
            Some(Floor {
                what: "atomic ping-pong on one cache line between the two rank threads",
                rtt_us,
                two_line_us: Vec::new(),
                ring_msgs_per_s: (node.rank() == 0).then_some(ring),
            })
        }
        TransportKind::Sci | TransportKind::Extoll | TransportKind::Portals => {
            shm_floor(node, warmup, iters)?
        }
        TransportKind::Udp => udp_floor(node, warmup, iters)?,
        // libfabric's own ping-pong over the same provider is `fi_pingpong -e rdm` (from
        // libfabric-bin), a program of its own: BENCHMARKS.md measures it beside this one.
        TransportKind::Ofi => None,
    })
}

/// UDP's floor: a plain busy-polled UDP ping-pong of 100-byte datagrams (an AM Short's size on
/// the wire) between the two rank processes, on the interface the transport binds.
fn udp_floor(
    node: &mut Node<AnyTransport, Local>,
    warmup: usize,
    iters: usize,
) -> anyhow::Result<Option<Floor>> {
    use std::net::{IpAddr, SocketAddr, UdpSocket};
    if node.size() != 2 {
        eprintln!("pingpong: no UDP floor: it needs exactly 2 ranks");
        return Ok(None);
    }
    let ip: IpAddr = std::env::var("AM_UDP_BIND")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(IpAddr::from([127, 0, 0, 1]));
    let socket = UdpSocket::bind(SocketAddr::new(ip, 0))?;
    socket.set_nonblocking(true)?;
    // Rank 1 tells rank 0 its port through the segment; rank 0 learns rank 1's from the ping.
    if node.rank() == 1 {
        let port = socket.local_addr()?.port();
        node.put(0, 0, &port.to_le_bytes())?;
    }
    node.barrier()?;
    let mut buf = [0u8; 100];
    let recv = |buf: &mut [u8]| -> std::io::Result<SocketAddr> {
        loop {
            match socket.recv_from(buf) {
                Ok((_, from)) => return Ok(from),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => return Err(e),
            }
        }
    };
    let mut rtt_us = Vec::with_capacity(iters);
    if node.rank() == 0 {
        let mut port = [0u8; 2];
        node.segment().read(0, &mut port)?;
        let port = u16::from_le_bytes(port);
        let peer = SocketAddr::new(ip, port);
        for i in 0..warmup + iters {
            let t0 = Instant::now();
            socket.send_to(&buf, peer)?;
            recv(&mut buf)?;
            if i >= warmup {
                rtt_us.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
    } else {
        for _ in 0..warmup + iters {
            let from = recv(&mut buf)?;
            socket.send_to(&buf, from)?;
        }
    }
    rtt_us.sort_by(f64::total_cmp);
    Ok(Some(Floor {
        what: "plain UDP ping-pong of 100-byte datagrams, busy-polled",
        rtt_us,
        two_line_us: Vec::new(),
        ring_msgs_per_s: None,
    }))
}

/// The shared-memory NICs' floor: a plain one-cache-line ping-pong between the two rank
/// processes over a segment of this job (`am_shm::floor`).
fn shm_floor(
    node: &mut Node<AnyTransport, Local>,
    warmup: usize,
    iters: usize,
) -> anyhow::Result<Option<Floor>> {
    // The fence is the AM barrier, which every rank joins: only a 2-rank job can use it here.
    let job = std::env::var("AM_JOB_ID").ok();
    let (Some(job), 2) = (job, node.size()) else {
        eprintln!("pingpong: no shared-memory floor: it needs 2 ranks started by amrun or --ranks");
        return Ok(None);
    };
    let rank = node.rank();
    let mut fence = || node.barrier().map_err(std::io::Error::other);
    let sorted_us = |times: Vec<std::time::Duration>| {
        let mut us: Vec<f64> = times
            .iter()
            .skip(warmup)
            .map(|d| d.as_secs_f64() * 1e6)
            .collect();
        us.sort_by(f64::total_cmp);
        us
    };
    let one = am_shm::floor::cacheline_pingpong(&job, rank, warmup + iters, &mut fence)?;
    let two = am_shm::floor::two_line_pingpong(&job, rank, warmup + iters, &mut fence)?;
    let ring = am_shm::floor::ring_flood(&job, rank, RING_FLOOR_MESSAGES, &mut fence)?;
    Ok(Some(Floor {
        what: "one-cache-line ping-pong between the two rank processes over shared memory",
        rtt_us: sorted_us(one),
        two_line_us: sorted_us(two),
        ring_msgs_per_s: (rank == 0).then_some(ring),
    }))
}

/// The one cache line the loopback floor bounces between rank threads: rank 0 makes it odd,
/// rank 1 makes it even again. Even at rest, so a second run starts from where the first ended.
static LINE: CachePadded<AtomicU64> = CachePadded::new(AtomicU64::new(0));

/// Spins until `ok(value)`; yields now and then so a descheduled partner can run.
#[inline]
fn spin_until(ok: impl Fn(u64) -> bool) -> u64 {
    let mut spins = 0u32;
    loop {
        let v = LINE.load(Ordering::Acquire);
        if ok(v) {
            return v;
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(1024) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn thread_floor(rank: Rank, warmup: usize, iters: usize) -> Vec<f64> {
    let mut rtt = Vec::with_capacity(if rank == 0 { iters } else { 0 });
    for i in 0..warmup + iters {
        if rank == 0 {
            let v = LINE.load(Ordering::Acquire);
            let t0 = Instant::now();
            LINE.store(v + 1, Ordering::Release);
            spin_until(|x| x == v + 2);
            if i >= warmup {
                rtt.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        } else {
            let v = spin_until(|x| x % 2 == 1);
            LINE.store(v + 1, Ordering::Release);
        }
    }
    rtt.sort_by(f64::total_cmp);
    rtt
}

/// The `p`-quantile of sorted samples.
fn quantile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The mean of the samples: finer than a quantile where the clock's steps (about 10 ns on
/// some machines) make every quantile fall on one of them, so a change of a few ns shows.
fn mean(samples: &[f64]) -> f64 {
    samples.iter().sum::<f64>() / samples.len().max(1) as f64
}

struct Row {
    kind: &'static str,
    bytes: usize,
    p50: f64,
    p99: f64,
    mean: f64,
    msgs_per_s: f64,
    replied_per_s: f64,
}

fn send<T: Transport>(
    node: &mut Node<T, Local>,
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

/// An `atomic` row: the median fetch-and-add round trip on a word of type `W` of rank 1's
/// segment (rank 1 sits in a barrier meanwhile, polling), and the rate of `--flood` of them
/// with as many in flight as the transport keeps (on shared memory each is done when issued).
/// `one` is the value added, exactly representable in `W` for every sum made here.
fn measure_atomic<T: Transport, W>(
    node: &mut Node<T, Local>,
    args: &Args,
    kind: &'static str,
    one: W,
    next: impl Fn(W) -> W,
) -> anyhow::Result<Row>
where
    W: amnet::AtomicWord + amnet::op::Outcome<Value = W> + 'static,
{
    let mut rtt = Vec::with_capacity(args.iters);
    let mut last: Option<W> = None;
    for iter in 0..args.warmup + args.iters {
        let t0 = Instant::now();
        let old = node.atomic(1, 0, AtomicOp::FetchAdd(one))?;
        if iter >= args.warmup {
            rtt.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        anyhow::ensure!(last.is_none_or(|l| old == next(l)), "fetch-and-add skipped");
        last = Some(old);
    }
    rtt.sort_by(f64::total_cmp);
    let t0 = Instant::now();
    let mut in_flight = std::collections::VecDeque::new();
    for _ in 0..args.flood {
        in_flight.push_back(node.atomic_nb(1, 8, AtomicOp::FetchAdd(one))?);
        if in_flight.len() >= 64 {
            if let Some(h) = in_flight.pop_front() {
                node.wait(h)?;
            }
        }
    }
    for h in in_flight {
        node.wait(h)?;
    }
    let per_s = args.flood as f64 / t0.elapsed().as_secs_f64();
    Ok(Row {
        kind,
        bytes: 8,
        p50: quantile(&rtt, 0.5),
        p99: quantile(&rtt, 0.99),
        mean: mean(&rtt),
        msgs_per_s: per_s,
        replied_per_s: per_s,
    })
}

fn measure<T: Transport>(
    node: &mut Node<T, Local>,
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
    let pct = |p: f64| quantile(&rtt, p);
    let t0 = Instant::now();
    for _ in 0..args.flood {
        send(node, kind, SINK[i], &payload)?;
    }
    node.quiesce()?;
    let msgs_per_s = args.flood as f64 / t0.elapsed().as_secs_f64();
    let want = pongs.get() + args.flood as u64;
    let t0 = Instant::now();
    for _ in 0..args.flood {
        send(node, kind, PING[i], &payload)?;
    }
    node.wait_until(|| pongs.get() == want)?;
    let replied_per_s = args.flood as f64 / t0.elapsed().as_secs_f64();
    Ok(Row {
        kind: kind_name(kind),
        bytes,
        p50: pct(0.5),
        p99: pct(0.99),
        mean: mean(&rtt),
        msgs_per_s,
        replied_per_s,
    })
}

fn rank_main(transport: AnyTransport, args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(transport.size() >= 2, "pingpong needs at least 2 ranks");
    let name = transport.info().name;
    let kind_of_transport: TransportKind = name.parse()?;
    let pongs = Rc::new(Cell::new(0u64));
    let size = transport.size();
    let mut node = Node::new(
        transport,
        handlers(&pongs)?,
        Config::from_env_for_ranks(size)?,
    )?;
    let me = node.rank();
    let limits = node.limits();
    let seg = node.segment().len();
    let mut plan = Vec::new();
    for kind in KINDS {
        if args.kind != "all" && args.kind != kind_name(kind) {
            continue;
        }
        let (max, what) = match kind {
            AmKind::Short => {
                plan.push((kind, 0));
                continue;
            }
            AmKind::Medium => (limits.max_medium, "AM Medium"),
            AmKind::Long if limits.max_long <= seg => (limits.max_long, "AM Long per message"),
            AmKind::Long => (seg, "the segment"),
        };
        for &s in &args.sizes {
            if s <= max {
                plan.push((kind, s));
            } else if me == 0 {
                eprintln!(
                    "pingpong: skipping {} of {s} bytes: {name} allows at most {max} bytes ({what})",
                    kind_name(kind)
                );
            }
        }
    }

    let mut base: Option<Floor> = None;
    if args.baseline {
        node.barrier()?;
        if me < 2 {
            base = floor(kind_of_transport, &mut node, args.warmup, args.iters)?;
        }
        node.barrier()?;
        if me == 0 {
            match &base {
                Some(f) if !args.json => {
                    println!(
                        "# floor: {}: p50 {:.3} us, p99 {:.3} us",
                        f.what,
                        quantile(&f.rtt_us, 0.5),
                        quantile(&f.rtt_us, 0.99)
                    );
                    if !f.two_line_us.is_empty() {
                        println!(
                            "# two-line floor: each rank writes a line the other polls, as \
                             the NICs must: p50 {:.3} us, p99 {:.3} us",
                            quantile(&f.two_line_us, 0.5),
                            quantile(&f.two_line_us, 0.99)
                        );
                    }
                    if let Some(r) = f.ring_msgs_per_s {
                        println!(
                            "# ring floor: one-line messages through a raw single-producer \
                             ring between the two ranks: {:.1} M/s",
                            r / 1e6
                        );
                    }
                }
                Some(_) => {}
                None => eprintln!("pingpong: no raw floor for {name} yet; --baseline ignored"),
            }
        }
    }
    let two_line = base
        .as_ref()
        .filter(|f| !f.two_line_us.is_empty())
        .map(|f| quantile(&f.two_line_us, 0.5));
    let ring = base.as_ref().and_then(|f| f.ring_msgs_per_s);
    let base = base
        .filter(|f| !f.rtt_us.is_empty())
        .map(|f| (f.what, quantile(&f.rtt_us, 0.5), quantile(&f.rtt_us, 0.99)));

    if me == 0 && !args.json {
        println!(
            "# {name}, {} ranks, {} iterations after {} warm-up, flood of {}",
            node.size(),
            args.iters,
            args.warmup,
            args.flood
        );
        print!(
            "{:<10} {:<10} {:>9} {:>12} {:>12} {:>14} {:>14}",
            "transport", "kind", "bytes", "rtt_p50_us", "rtt_p99_us", "msgs_per_s", "replied_per_s"
        );
        if base.is_some() {
            print!(" {:>12} {:>8}", "floor_p50_us", "ratio");
        }
        if two_line.is_some() {
            print!(" {:>12} {:>8}", "2line_p50_us", "ratio_2l");
        }
        println!();
    }
    let plan = plan.into_iter().map(Some);
    let atomics = if args.kind == "all" || args.kind == "atomic" {
        vec![None, None]
    } else {
        Vec::new()
    };
    let steps: Vec<_> = plan.chain(atomics).collect();
    let n_steps = steps.len();
    for (i, step) in steps.into_iter().enumerate() {
        node.barrier()?;
        if me == 0 {
            let row = match step {
                Some((kind, bytes)) => measure(&mut node, &pongs, kind, bytes, args)?,
                // The u64 row, then the f64 one on a word of its own.
                None if i + 1 < n_steps => {
                    measure_atomic(&mut node, args, "atomic", 1u64, |l| l + 1)?
                }
                None => {
                    node.put(1, 0, &[0; 16])?;
                    measure_atomic(&mut node, args, "atomic-f64", 1.0f64, |l| l + 1.0)?
                }
            };
            let ratio = base.map(|(_, p50, _)| row.p50 / p50);
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "transport": name, "kind": row.kind, "bytes": row.bytes,
                        "iters": args.iters, "rtt_us_p50": row.p50, "rtt_us_p99": row.p99,
                        "rtt_us_mean": row.mean,
                        "msgs_per_s": row.msgs_per_s, "replied_per_s": row.replied_per_s,
                        "ranks": node.size(),
                        "baseline": base.map(|b| b.0),
                        "baseline_rtt_us_p50": base.map(|b| b.1),
                        "baseline_rtt_us_p99": base.map(|b| b.2),
                        "ratio": ratio,
                        "two_line_rtt_us_p50": two_line,
                        "ratio_two_line": two_line.map(|t| row.p50 / t),
                        "ring_floor_msgs_per_s": ring,
                        "flood_to_ring": ring.map(|r| row.msgs_per_s / r),
                    })
                );
            } else {
                print!(
                    "{:<10} {:<10} {:>9} {:>12.3} {:>12.3} {:>14.0} {:>14.0}",
                    name, row.kind, row.bytes, row.p50, row.p99, row.msgs_per_s, row.replied_per_s
                );
                if let (Some((_, p50, _)), Some(r)) = (base, ratio) {
                    print!(" {p50:>12.3} {r:>8.2}");
                }
                if let Some(t) = two_line {
                    print!(" {t:>12.3} {:>8.2}", row.p50 / t);
                }
                println!();
            }
        }
        node.barrier()?;
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.iters > 0, "--iters must be at least 1");
    let largest = args.sizes.iter().copied().max().unwrap_or(0);
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(args.ranks)
        // Room for the largest Long asked for (the transport's own limit still applies).
        .segment_size(largest.max(JobOptions::default().segment_size))
        // One JSON object per line, unprefixed, even when the ranks are processes.
        .prefix_output(!args.json);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
