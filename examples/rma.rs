//! RMA bandwidth: blocking put into and get from rank 1's segment, per size, beside the raw
//! copy floor measured in the same job.
//!
//! ```text
//! cargo run --release --example rma -- [--transport T] [--ranks N]
//!     [--sizes 4096,65536,1048576] [--bytes 16777216] [--reps 5] [--json] [--baseline]
//! ```
//!
//! Rank 0 times `--bytes` worth of `Node::put` of one size into rank 1's segment, then as many
//! `Node::get_into` from it, then the same from and into its own segment (`put_from_segment`,
//! `get_into_segment`: rows `put_seg` and `get_seg`), then puts into and gets from a segment rank 1
//! created and published as the job runs (`put_to`, `get_from_into`: rows `put_to` and `get_from`)
//! and AM Long requests whose payload lands there (`request_long_to`, row `long_to`: each a
//! `put_to` and then the request's head, timed until every handler ran), then between rank 0's
//! created segment and rank 1's (`put_to_from_segment`, `get_from_into_segment`: rows `seg_to` and
//! `seg_from`), `--reps` times, and reports the median bytes per second of each. Other ranks (rank
//! 1 too) wait in a barrier meanwhile, polling, so transports that serve RMA with messages (udp)
//! are measured as well; on the shared-memory NICs and loopback each put and get is one copy that
//! rank 1 takes no part in.
//!
//! `--baseline` also measures, in each repetition and between the same two ranks, the raw
//! floor: `am_shm::floor::copy_stream_bandwidth`, rank 0 copying the same bytes as many
//! times into a segment it shares with rank 1, back to back, and announcing the end once
//! (between rank threads on loopback). Rows then carry `floor_bytes_per_s` and `ratio` =
//! RMA / floor (medians). As with the puts and gets, the same bytes are copied each time
//! and rank 1 does not touch them meanwhile, so sizes that fit a cache measure it. UDP has
//! no copy floor; without `AM_JOB_ID` (a launcher that does not set it) the shared-memory
//! NICs have none either, which is said on stderr. On `ofi` the floor is libfabric's own:
//! the same pipelined `fi_write`s a put makes, from the registered staging buffers without
//! the copy into them (`transport_ofi::Ofi::raw_put_bandwidth`).

use amnet::Local;
use std::time::Instant;

use amnet::{AnyTransport, Config, Handlers, JobOptions, Node, Transport, TransportKind};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "RMA put and get bandwidth from rank 0 to rank 1's segment")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Ranks to start when not under a launcher
    #[arg(long, default_value_t = 2)]
    ranks: u32,
    /// Bytes per put or get
    #[arg(long, value_delimiter = ',', default_value = "4096,65536,1048576")]
    sizes: Vec<usize>,
    /// Bytes moved per timed repetition (at least one operation)
    #[arg(long, default_value_t = 16 << 20)]
    bytes: usize,
    /// Timed repetitions per size; medians are reported
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// One JSON object per line instead of a table
    #[arg(long)]
    json: bool,
    /// Also measure the raw copy floor in each repetition and print the ratio to it
    #[arg(long)]
    baseline: bool,
}

/// The median of samples (sorted here).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Rank 0's bytes per second over `ops` blocking puts (or gets) of `buf` at offset 0 of
/// rank 1's segment; rank 1 and the others wait in the barrier that follows.
fn timed(
    node: &mut Node<AnyTransport, Local>,
    get: bool,
    buf: &mut [u8],
    ops: usize,
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    for _ in 0..ops {
        if get {
            node.get_into(1, 0, buf)?;
        } else {
            node.put(1, 0, buf)?;
        }
    }
    Ok(buf.len() as f64 * ops as f64 / t0.elapsed().as_secs_f64().max(1e-12))
}

/// As [`timed`], segment to segment: `ops` puts of `size` bytes at offset 0 of rank 0's
/// segment to offset 0 of rank 1's (or gets back into it).
fn timed_seg(
    node: &mut Node<AnyTransport, Local>,
    get: bool,
    size: usize,
    ops: usize,
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    for _ in 0..ops {
        if get {
            node.get_into_segment(1, 0, 0, size)?;
        } else {
            node.put_from_segment(1, 0, 0, size)?;
        }
    }
    Ok(size as f64 * ops as f64 / t0.elapsed().as_secs_f64().max(1e-12))
}

/// As [`timed`], into and from `remote` (rank 1's created segment): `ops` puts of `buf` at
/// its offset 0, or gets from there into `buf` (`get_from_into`).
fn timed_remote(
    node: &mut Node<AnyTransport, Local>,
    remote: &amnet::RemoteSegment,
    get: bool,
    buf: &mut [u8],
    ops: usize,
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    for _ in 0..ops {
        if get {
            node.get_from_into(remote, 0, buf)?;
        } else {
            node.put_to(remote, 0, buf)?;
        }
    }
    Ok(buf.len() as f64 * ops as f64 / t0.elapsed().as_secs_f64().max(1e-12))
}

/// As [`timed_seg`], between created segments: `ops` puts of `size` bytes at offset 0 of
/// rank 0's segment `local` to offset 0 of `remote` (or gets back into it).
fn timed_seg_to(
    node: &mut Node<AnyTransport, Local>,
    remote: &amnet::RemoteSegment,
    local: amnet::SegmentId,
    get: bool,
    size: usize,
    ops: usize,
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    for _ in 0..ops {
        if get {
            node.get_from_into_segment(remote, 0, local, 0, size)?;
        } else {
            node.put_to_from_segment(remote, 0, local, 0, size)?;
        }
    }
    Ok(size as f64 * ops as f64 / t0.elapsed().as_secs_f64().max(1e-12))
}

/// The Long request handler of the `long_to` row: the payload is in place when it runs.
const LONG_TO: amnet::HandlerId = amnet::HandlerId(1);

/// As [`timed_remote`], `ops` AM Long requests whose payload `buf` lands at offset 0 of
/// `remote`, until every one has been answered (their handlers ran).
fn timed_long_to(
    node: &mut Node<AnyTransport, Local>,
    remote: &amnet::RemoteSegment,
    buf: &[u8],
    ops: usize,
) -> anyhow::Result<f64> {
    let t0 = Instant::now();
    for _ in 0..ops {
        node.request_long_to(remote, 0, LONG_TO, &[], buf)?;
    }
    node.quiesce()?;
    Ok(buf.len() as f64 * ops as f64 / t0.elapsed().as_secs_f64().max(1e-12))
}

/// The copy floor of `bytes`, `ops` times, between ranks 0 and 1 (both call it; the
/// others do not): bytes per second at rank 0, `None` elsewhere or without a floor.
fn floor(
    kind: TransportKind,
    node: &mut Node<AnyTransport, Local>,
    bytes: usize,
    ops: usize,
) -> anyhow::Result<Option<f64>> {
    let rank = node.rank();
    let bw = match kind {
        TransportKind::Loopback => {
            // The two rank threads need the same fresh segment (its stamps start at zero) for
            // each call: the first of them to make its n-th call makes the n-th segment.
            type Shared = (u64, Option<std::sync::Arc<am_shm::Segment>>);
            static SEG: std::sync::Mutex<Shared> = std::sync::Mutex::new((0, None));
            thread_local!(static CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) });
            let call = CALLS.with(|c| {
                c.set(c.get() + 1);
                c.get()
            });
            let seg = {
                let mut s = SEG.lock().map_err(|_| anyhow::anyhow!("floor lock"))?;
                if s.0 != call || s.1.is_none() {
                    *s = (
                        call,
                        Some(std::sync::Arc::new(am_shm::floor::copy_segment(bytes)?)),
                    );
                }
                s.1.clone()
            };
            let seg = seg.ok_or_else(|| anyhow::anyhow!("floor segment"))?;
            am_shm::floor::copy_stream_bandwidth_on(&seg, rank, bytes, ops)?
        }
        TransportKind::Sci | TransportKind::Extoll | TransportKind::Portals => {
            let Ok(job) = std::env::var("AM_JOB_ID") else {
                return Ok(None);
            };
            let mut fence = || node.barrier().map_err(std::io::Error::other);
            am_shm::floor::copy_stream_bandwidth(&job, rank, bytes, ops, &mut fence)?
        }
        TransportKind::Udp => return Ok(None),
        // libfabric's own writes, made as a put makes them without the copy into the
        // staging buffers; rank 1 polls in the next barrier meanwhile.
        #[cfg(feature = "ofi")]
        TransportKind::Ofi => match node.transport_mut() {
            AnyTransport::Ofi(t) if rank == 0 => t.raw_put_bandwidth(1, bytes, ops)?,
            _ => return Ok(None),
        },
        #[cfg(not(feature = "ofi"))]
        TransportKind::Ofi => return Ok(None),
    };
    Ok((rank == 0).then_some(bw))
}

fn rank_main(transport: AnyTransport, args: &Args) -> anyhow::Result<()> {
    anyhow::ensure!(transport.size() >= 2, "rma needs at least 2 ranks");
    let name = transport.info().name;
    let kind: TransportKind = name.parse()?;
    let config = Config::from_env_for_ranks(transport.size())?;
    let mut handlers = Handlers::local();
    handlers.request(
        LONG_TO,
        "rma_long_to",
        amnet::AmKind::Long,
        |_msg, _token| {},
    )?;
    let mut node = Node::new(transport, handlers, config)?;
    let me = node.rank();
    let seg = node.segment().len();
    // Every rank creates a segment as large as the largest size and publishes it: rank 0
    // reaches rank 1's as a remote key.
    let world = node.world_team();
    let created = node.create_segment(args.sizes.iter().copied().max().unwrap_or(0))?;
    let remotes = node.publish_segment(&world, created)?;
    let remote = remotes[1];
    // The floor's fence is the AM barrier, which every rank joins: 2-rank jobs only.
    let shm = matches!(
        kind,
        TransportKind::Sci | TransportKind::Extoll | TransportKind::Portals
    );
    let with_floor = args.baseline
        && node.size() == 2
        && kind != TransportKind::Udp
        && (!shm || std::env::var_os("AM_JOB_ID").is_some());
    if me == 0 && args.baseline && !with_floor {
        eprintln!(
            "rma: no copy floor for {name} with {} ranks (udp has none; the shared-memory \
             NICs need 2 ranks and AM_JOB_ID)",
            node.size()
        );
    }
    if me == 0 && !args.json {
        println!(
            "# {name}, {} ranks, {} MiB per repetition, median of {}",
            node.size(),
            args.bytes >> 20,
            args.reps
        );
        print!(
            "{:<10} {:<7} {:>9} {:>8} {:>10}",
            "transport", "op", "bytes", "ops", "GB/s"
        );
        if with_floor {
            print!(" {:>10} {:>7}", "floor_GB/s", "ratio");
        }
        println!();
    }
    for &size in &args.sizes {
        if size > seg {
            if me == 0 {
                eprintln!("rma: skipping {size} bytes: the segment has {seg}");
            }
            continue;
        }
        let ops = (args.bytes / size.max(1)).max(1);
        let mut buf: Vec<u8> = (0..size).map(|i| i as u8).collect();
        // The segment-to-segment rows move the same bytes from rank 0's segment.
        node.segment().write(0, &buf)?;
        node.segment_at(created)
            .ok_or_else(|| anyhow::anyhow!("the created segment is gone"))?
            .write(0, &buf)?;
        let (mut puts, mut gets, mut floors) = (Vec::new(), Vec::new(), Vec::new());
        let (mut seg_puts, mut seg_gets) = (Vec::new(), Vec::new());
        let (mut to_puts, mut from_gets, mut longs) = (Vec::new(), Vec::new(), Vec::new());
        let (mut seg_tos, mut seg_froms) = (Vec::new(), Vec::new());
        // Warm-up (page faults, caches), then floor, put and get in turn in each repetition,
        // so that all three see the same moments of a noisy machine.
        for rep in 0..=args.reps {
            node.barrier()?;
            if with_floor && me < 2 {
                if let Some(bw) = floor(kind, &mut node, size, ops)? {
                    floors.push(bw);
                }
            }
            node.barrier()?;
            if me == 0 {
                puts.push(timed(&mut node, false, &mut buf, ops)?);
                gets.push(timed(&mut node, true, &mut buf, ops)?);
                seg_puts.push(timed_seg(&mut node, false, size, ops)?);
                seg_gets.push(timed_seg(&mut node, true, size, ops)?);
                to_puts.push(timed_remote(&mut node, &remote, false, &mut buf, ops)?);
                from_gets.push(timed_remote(&mut node, &remote, true, &mut buf, ops)?);
                longs.push(timed_long_to(&mut node, &remote, &buf, ops)?);
                seg_tos.push(timed_seg_to(&mut node, &remote, created, false, size, ops)?);
                seg_froms.push(timed_seg_to(&mut node, &remote, created, true, size, ops)?);
                if rep == 0 {
                    seg_tos.clear();
                    seg_froms.clear();
                    longs.clear();
                    to_puts.clear();
                    from_gets.clear();
                    puts.clear();
                    gets.clear();
                    seg_puts.clear();
                    seg_gets.clear();
                    floors.clear();
                }
            }
            node.barrier()?;
        }
        if me != 0 {
            continue;
        }
        // What was measured moved the bytes: rank 1's segment holds what the puts wrote,
        // and the gets read it back into `buf` unchanged.
        let want: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let mut own = vec![0u8; size];
        node.segment().read(0, &mut own)?;
        // The rows between created segments move the bytes too: rank 1's cleared, then
        // written from rank 0's; rank 0's cleared, then read back from rank 1's.
        let zeros = vec![0u8; size];
        node.put_to(&remote, 0, &zeros)?;
        node.put_to_from_segment(&remote, 0, created, 0, size)?;
        let created_there = node.get_from(&remote, 0, size)?;
        let mut created_here = vec![0u8; size];
        let gone = || anyhow::anyhow!("the created segment is gone");
        node.segment_at(created)
            .ok_or_else(gone)?
            .write(0, &zeros)?;
        node.get_from_into_segment(&remote, 0, created, 0, size)?;
        node.segment_at(created)
            .ok_or_else(gone)?
            .read(0, &mut created_here)?;
        anyhow::ensure!(
            buf == want
                && node.get(1, 0, size)? == want
                && own == want
                && created_here == want
                && created_there == want
                && node.get_from(&remote, 0, size)? == want,
            "{name}: {size}-byte puts and gets did not move the bytes"
        );
        let floor = (!floors.is_empty()).then(|| median(floors));
        for (op, samples) in [
            ("put", puts),
            ("get", gets),
            ("put_seg", seg_puts),
            ("get_seg", seg_gets),
            ("put_to", to_puts),
            ("get_from", from_gets),
            ("long_to", longs),
            ("seg_to", seg_tos),
            ("seg_from", seg_froms),
        ] {
            let bw = median(samples);
            let ratio = floor.filter(|&f| f > 0.0).map(|f| bw / f);
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({
                        "transport": name, "op": op, "bytes": size, "ops": ops,
                        "reps": args.reps, "ranks": node.size(), "bytes_per_s": bw,
                        "floor_bytes_per_s": floor, "ratio": ratio,
                    })
                );
            } else {
                print!("{name:<10} {op:<7} {size:>9} {ops:>8} {:>10.2}", bw / 1e9);
                if let (Some(f), Some(r)) = (floor, ratio) {
                    print!(" {:>10.2} {r:>7.2}", f / 1e9);
                }
                println!();
            }
        }
    }
    node.free_segment(&world, created)?;
    node.barrier()?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.reps > 0, "--reps must be at least 1");
    anyhow::ensure!(!args.sizes.is_empty(), "--sizes needs at least one size");
    let largest = args.sizes.iter().copied().max().unwrap_or(0);
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(args.ranks)
        .segment_size(largest.max(JobOptions::default().segment_size))
        .prefix_output(!args.json);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
