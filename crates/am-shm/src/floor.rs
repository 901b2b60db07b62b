//! The raw floors the benchmarks compare against: what two processes (or threads) sharing a
//! segment can do with no protocol at all.
//!
//! - [`cacheline_pingpong`]: one 64-bit word on one cache line, written alternately by two
//!   ranks; one round trip per iteration.
//! - [`two_line_pingpong`]: each rank writes a word on a line the *other* polls and polls
//!   a line of its own, as every remote-write-only design must (the request and the reply
//!   travel on different lines). The least any of the simulated NICs can do per round trip.
//! - [`copy_bandwidth`]: one rank copies `bytes` into a shared segment and publishes a stamp;
//!   the other acknowledges on a second line. Bytes per second at the copying rank.
//! - [`copy_stream_bandwidth`]: the same copies back to back, announced once at the end: the
//!   floor of one-sided put and get bandwidth.
//! - [`ring_flood`]: a single-producer ring of [`RING_SLOTS`] messages of one cache line each
//!   (a payload word, then the stamp that publishes it, as an AM Short's slot travels), the
//!   consumer publishing its head every quarter ring. Messages per second: the floor of a
//!   one-way flood.
//!
//! Both spin (they are floors); a peer that makes no progress for 10 s is an error, not a hang.
//!
//! The ping-pongs take their round trips on [`LINES`] different lines in turn, a page apart:
//! on a mesh the time depends on which L3 slice a line's address hashes to (the same line
//! always alike, two lines possibly far apart: BENCHMARKS.md, "The floors"), so one line is
//! a lottery, while an AM's traffic, like these, spans many lines.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::{Segment, CACHE_LINE};

const STALL: Duration = Duration::from_secs(10);

/// How many lines (or pairs of lines) a ping-pong floor spreads its round trips over.
pub const LINES: usize = 16;
/// Bytes between two of those lines: a page and a line, so each is on its own page.
const LINE_STRIDE: usize = 4096 + 64;

/// Round trips of block `b` of [`LINES`] when `iters` are split between them.
fn block_iters(iters: usize, b: usize) -> usize {
    iters / LINES + usize::from(b < iters % LINES)
}

fn spin_until(word: &AtomicU64, value: u64) -> io::Result<()> {
    spin_while(word, |v| v != value).map(drop)
}

/// Spins while `waiting(word)`, yielding now and then; returns the value that ended the wait.
/// A peer that makes no progress for [`STALL`] is an error.
fn spin_while(word: &AtomicU64, waiting: impl Fn(u64) -> bool) -> io::Result<u64> {
    let mut n = 0u32;
    let mut since: Option<Instant> = None;
    loop {
        let v = word.load(Ordering::Acquire);
        if !waiting(v) {
            return Ok(v);
        }
        std::hint::spin_loop();
        n = n.wrapping_add(1);
        if n.is_multiple_of(1 << 16) {
            let start = *since.get_or_insert_with(Instant::now);
            if start.elapsed() > STALL {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "floor: peer stalled",
                ));
            }
            std::thread::yield_now();
        }
    }
}

/// Rank 0 creates, `fence`, rank 1 maps, `fence`, rank 0 unlinks (nothing left behind).
/// Only ranks 0 and 1 take part.
fn rendezvous(
    job_id: &str,
    rank: u32,
    name: &str,
    words: usize,
    bytes: usize,
    fence: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<Segment> {
    if rank > 1 {
        return Err(bad_rank(rank));
    }
    let mut seg = if rank == 0 {
        Some(Segment::create(job_id, name, words, bytes)?)
    } else {
        None
    };
    fence()?;
    let mut seg = match seg.take() {
        Some(s) => s,
        None => Segment::attach(job_id, name, words, bytes)?,
    };
    fence()?;
    seg.unlink()?;
    Ok(seg)
}

fn bad_rank(rank: u32) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("floor: rank {rank} is not 0 or 1"),
    )
}

/// Two-process ping-pong on one cache line. Ranks 0 and 1 of job `job_id` call it at the same
/// time; `fence` is a job-wide barrier. Rank 0 returns one round-trip time per iteration,
/// rank 1 an empty `Vec`.
pub fn cacheline_pingpong(
    job_id: &str,
    rank: u32,
    iters: usize,
    fence: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<Vec<Duration>> {
    let seg = rendezvous(
        job_id,
        rank,
        "floor-pingpong",
        LINES * LINE_STRIDE,
        0,
        fence,
    )?;
    pingpong_on(&seg, rank, iters)
}

/// Two-process ping-pong over two cache lines: rank 0 writes line 1 and polls line 0, rank 1
/// the other way round. Called like [`cacheline_pingpong`]; rank 0 returns one round-trip time
/// per iteration.
pub fn two_line_pingpong(
    job_id: &str,
    rank: u32,
    iters: usize,
    fence: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<Vec<Duration>> {
    let seg = rendezvous(
        job_id,
        rank,
        "floor-two-line",
        2 * LINES * LINE_STRIDE,
        0,
        fence,
    )?;
    two_line_on(&seg, rank, iters)
}

fn two_line_on(seg: &Segment, rank: u32, iters: usize) -> io::Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(if rank == 0 { iters } else { 0 });
    for b in 0..LINES {
        // Pair b: rank 0 polls line b of the first half, rank 1 line b of the second.
        let line = |r: usize| seg.word((r * LINES + b) * LINE_STRIDE);
        let polled = line(rank as usize).map_err(io::Error::from)?;
        let written = line(1 - rank as usize).map_err(io::Error::from)?;
        for i in 1..=block_iters(iters, b) as u64 {
            if rank == 0 {
                let t = Instant::now();
                written.store(i, Ordering::Release);
                spin_until(polled, i)?;
                times.push(t.elapsed());
            } else {
                spin_until(polled, i)?;
                written.store(i, Ordering::Release);
            }
        }
    }
    Ok(times)
}

fn pingpong_on(seg: &Segment, rank: u32, iters: usize) -> io::Result<Vec<Duration>> {
    let mut times = Vec::with_capacity(if rank == 0 { iters } else { 0 });
    for b in 0..LINES {
        let line = seg.word(b * LINE_STRIDE).map_err(io::Error::from)?;
        for i in 0..block_iters(iters, b) as u64 {
            if rank == 0 {
                let t = Instant::now();
                line.store(2 * i + 1, Ordering::Release);
                spin_until(line, 2 * i + 2)?;
                times.push(t.elapsed());
            } else {
                spin_until(line, 2 * i + 1)?;
                line.store(2 * i + 2, Ordering::Release);
            }
        }
    }
    Ok(times)
}

/// Raw cross-process copy bandwidth: rank 0 copies `bytes` into a segment shared with rank 1
/// and publishes a stamp, rank 1 acknowledges, `iters` times. Returns bytes per second at
/// rank 0 (0.0 at rank 1). The floor of a message's bandwidth, whose every copy is announced.
pub fn copy_bandwidth(
    job_id: &str,
    rank: u32,
    bytes: usize,
    iters: usize,
    fence: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<f64> {
    let seg = rendezvous(job_id, rank, "floor-copy", 128, bytes, fence)?;
    copy_on(&seg, rank, bytes, iters, Announce::EachCopy)
}

/// Raw cross-process copy streaming: rank 0 copies `bytes` into a segment shared with rank
/// 1 `iters` times back to back, then publishes one stamp that rank 1 acknowledges. Bytes
/// per second at rank 0 (0.0 at rank 1): the floor of one-sided put and get bandwidth,
/// whose copies need no announcement each.
pub fn copy_stream_bandwidth(
    job_id: &str,
    rank: u32,
    bytes: usize,
    iters: usize,
    fence: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<f64> {
    let seg = rendezvous(job_id, rank, "floor-stream", 128, bytes, fence)?;
    copy_on(&seg, rank, bytes, iters, Announce::Once)
}

/// [`copy_stream_bandwidth`] over `seg`, made by [`copy_segment`], between two threads that
/// are ranks 0 and 1 of one process (the loopback transport's): both call it at once, on a
/// fresh segment each time.
pub fn copy_stream_bandwidth_on(
    seg: &Segment,
    rank: u32,
    bytes: usize,
    iters: usize,
) -> io::Result<f64> {
    if rank > 1 {
        return Err(bad_rank(rank));
    }
    copy_on(seg, rank, bytes, iters, Announce::Once)
}

/// A fresh segment for [`copy_stream_bandwidth_on`] of up to `bytes` between threads of one
/// process: heap memory, nothing in `/dev/shm`.
pub fn copy_segment(bytes: usize) -> io::Result<Segment> {
    Segment::heap(128, bytes).map_err(io::Error::from)
}

/// When the copying rank publishes a stamp for the other to acknowledge.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Announce {
    EachCopy,
    Once,
}

fn copy_on(
    seg: &Segment,
    rank: u32,
    bytes: usize,
    iters: usize,
    announce: Announce,
) -> io::Result<f64> {
    let stamp = seg.word(0).map_err(io::Error::from)?;
    let ack = seg.word(64).map_err(io::Error::from)?;
    // Round 0 warms up (page faults) and is not timed; then one round per copy, or one for
    // all of them.
    let rounds = match announce {
        Announce::EachCopy => iters as u64,
        Announce::Once => 1,
    };
    if rank == 0 {
        let src: Vec<u8> = (0..bytes).map(|i| i as u8).collect();
        let copies = |n: usize| -> io::Result<()> {
            for _ in 0..n {
                // A plain copy: the floor is what the hardware does; rank 1 never reads it.
                seg.raw_write_unshared(0, &src).map_err(io::Error::from)?;
            }
            Ok(())
        };
        let mut start = Instant::now();
        for i in 0..=rounds {
            if i == 1 {
                start = Instant::now();
            }
            copies(if i == 0 || announce == Announce::EachCopy {
                1
            } else {
                iters
            })?;
            stamp.store(i + 1, Ordering::Release);
            spin_until(ack, i + 1)?;
        }
        let secs = start.elapsed().as_secs_f64().max(1e-12);
        Ok(bytes as f64 * iters as f64 / secs)
    } else {
        for i in 0..=rounds {
            spin_until(stamp, i + 1)?;
            ack.store(i + 1, Ordering::Release);
        }
        Ok(0.0)
    }
}

/// Slots of the [`ring_flood`] floor's ring (a cache line each).
pub const RING_SLOTS: usize = 256;
/// Messages the ring floor moves untimed before it starts the clock.
const RING_WARMUP: usize = 16 * RING_SLOTS;

/// Word-area bytes of the ring floor: the ring, then the consumer's head on a line of its own.
pub const RING_WORDS: usize = RING_SLOTS * CACHE_LINE + CACHE_LINE;

/// Two-process one-way flood through a raw single-producer ring: rank 0 sends `messages`
/// one-line messages to rank 1, which publishes its head every quarter ring. Called like
/// [`cacheline_pingpong`]; rank 0 returns messages per second (from its first timed send to
/// the head covering its last), rank 1 `0.0`.
pub fn ring_flood(
    job_id: &str,
    rank: u32,
    messages: usize,
    fence: &mut dyn FnMut() -> io::Result<()>,
) -> io::Result<f64> {
    let seg = rendezvous(job_id, rank, "floor-ring", RING_WORDS, 0, fence)?;
    ring_flood_on(&seg, rank, messages)
}

/// [`ring_flood`] over `seg`, whose word area holds at least [`RING_WORDS`] zeroed bytes
/// (a fresh segment): rank 0 (producer) and rank 1 (consumer) call it at the same time, in
/// two processes or two threads.
pub fn ring_flood_on(seg: &Segment, rank: u32, messages: usize) -> io::Result<f64> {
    if rank > 1 {
        return Err(bad_rank(rank));
    }
    // Slot i: its payload word, then its stamp word, on a line of its own.
    let word = |i: u64, k: usize| {
        seg.word((i as usize % RING_SLOTS) * CACHE_LINE + 8 * k)
            .map_err(io::Error::from)
    };
    let head = seg.word(RING_SLOTS * CACHE_LINE).map_err(io::Error::from)?;
    let total = (RING_WARMUP + messages) as u64;
    if rank == 0 {
        let mut start = Instant::now();
        let mut seen = 0u64;
        for i in 0..total {
            if i == RING_WARMUP as u64 {
                start = Instant::now();
            }
            if i - seen >= RING_SLOTS as u64 {
                // Full: wait until the consumer's head (it only grows) frees the slot i reuses.
                seen = spin_while(head, |h| h < i + 1 - RING_SLOTS as u64)?;
            }
            word(i, 0)?.store(!i, Ordering::Relaxed);
            word(i, 1)?.store(i + 1, Ordering::Release);
        }
        spin_while(head, |h| h < total)?;
        Ok(messages as f64 / start.elapsed().as_secs_f64().max(1e-12))
    } else {
        for i in 0..total {
            spin_until(word(i, 1)?, i + 1)?;
            if word(i, 0)?.load(Ordering::Relaxed) != !i {
                return Err(io::Error::other(
                    "floor: a ring message's payload is not its own",
                ));
            }
            if (i + 1) % (RING_SLOTS as u64 / 4) == 0 || i + 1 == total {
                head.store(i + 1, Ordering::Release);
            }
        }
        Ok(0.0)
    }
}

fn unique_job() -> String {
    use std::sync::atomic::AtomicUsize;
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "floor{}x{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn threads<R: Send>(
    f: impl Fn(&Segment, u32) -> io::Result<R> + Sync,
    words: usize,
    bytes: usize,
) -> io::Result<R> {
    let mut seg = Segment::create(&unique_job(), "floor", words, bytes)?;
    seg.unlink().map_err(io::Error::from)?;
    let (a, b) = std::thread::scope(|s| {
        let peer = s.spawn(|| f(&seg, 1));
        let mine = f(&seg, 0);
        (mine, peer.join())
    });
    b.map_err(|_| io::Error::other("floor thread panicked"))??;
    a
}

/// [`cacheline_pingpong`] between two threads of this process, over a `/dev/shm` segment.
pub fn cacheline_pingpong_threads(iters: usize) -> io::Result<Vec<Duration>> {
    threads(
        |seg, rank| pingpong_on(seg, rank, iters),
        LINES * LINE_STRIDE,
        0,
    )
}

/// [`two_line_pingpong`] between two threads of this process, over a `/dev/shm` segment.
pub fn two_line_pingpong_threads(iters: usize) -> io::Result<Vec<Duration>> {
    threads(
        |seg, rank| two_line_on(seg, rank, iters),
        2 * LINES * LINE_STRIDE,
        0,
    )
}

/// [`copy_bandwidth`] between two threads of this process, over a `/dev/shm` segment.
pub fn copy_bandwidth_threads(bytes: usize, iters: usize) -> io::Result<f64> {
    threads(
        |seg, rank| copy_on(seg, rank, bytes, iters, Announce::EachCopy),
        128,
        bytes,
    )
}

/// [`ring_flood`] between two threads of this process, over a `/dev/shm` segment.
pub fn ring_flood_threads(messages: usize) -> io::Result<f64> {
    threads(
        |seg, rank| ring_flood_on(seg, rank, messages),
        RING_WORDS,
        0,
    )
}

/// A fresh segment for [`ring_flood_on`] between threads that are ranks of one process
/// (the loopback transport's): heap memory, nothing in `/dev/shm`.
pub fn ring_segment() -> io::Result<Segment> {
    Segment::heap(RING_WORDS, 0).map_err(io::Error::from)
}

#[cfg(all(test, not(miri), not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn thread_floors_run() {
        let t = cacheline_pingpong_threads(1000).unwrap();
        assert_eq!(t.len(), 1000);
        assert_eq!(two_line_pingpong_threads(1000).unwrap().len(), 1000);
        // Fewer round trips than lines: the first blocks take one each.
        assert_eq!(cacheline_pingpong_threads(5).unwrap().len(), 5);
        assert_eq!(
            (0..LINES).map(|b| block_iters(1003, b)).sum::<usize>(),
            1003
        );
        assert!(copy_bandwidth_threads(1 << 16, 20).unwrap() > 0.0);
        let seg = copy_segment(1 << 16).unwrap();
        let (a, b) = std::thread::scope(|s| {
            let peer = s.spawn(|| copy_stream_bandwidth_on(&seg, 1, 1 << 16, 20).unwrap());
            (
                copy_stream_bandwidth_on(&seg, 0, 1 << 16, 20).unwrap(),
                peer.join().unwrap(),
            )
        });
        assert!(a > 0.0 && b == 0.0, "{a} {b}");
        // Many laps of the ring, and fewer messages than a ring.
        assert!(ring_flood_threads(10 * RING_SLOTS + 3).unwrap() > 0.0);
        assert!(ring_flood_threads(5).unwrap() > 0.0);
    }
}
