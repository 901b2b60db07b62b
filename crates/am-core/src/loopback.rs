//! [`Loopback`]: ranks as threads of one process, for tests and for measuring the core alone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use am_shm::sync::{fence, Ordering as ShmOrdering};
use am_shm::{futex_wait, futex_wake, Imported, Segment, CACHE_LINE};

use crate::transport::{
    Delivery, Limits, Outgoing, Payload, Received, Route, SendError, SharedBytes, Transport,
    TransportError, Tx,
};
use crate::Rank;

/// Settings of a [`Loopback`] cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopbackConfig {
    /// Messages one sender can have waiting in one receiver's queue (each ordered pair of
    /// ranks has its own ring); a full ring is device back-pressure ([`SendError::Busy`]).
    pub capacity: usize,
    /// Bytes of each rank's segment.
    pub segment_size: usize,
    /// Largest AM Medium payload.
    pub max_medium: usize,
    /// Largest AM Long payload per message.
    pub max_long: usize,
}

impl Default for LoopbackConfig {
    fn default() -> Self {
        LoopbackConfig {
            capacity: 1024,
            segment_size: 1 << 20,
            max_medium: 64 << 10,
            max_long: 1 << 20,
        }
    }
}

struct Shared {
    /// Set when a rank's transport is dropped by a panic: the job is over.
    aborted: AtomicBool,
    /// Transports dropped so far, and when each rank's was (1 for the first, 0 while alive):
    /// a rank that fails drops its transport before its peers can notice it is gone.
    departures: AtomicU64,
    departed: Box<[AtomicU64]>,
    /// Each rank's receive rings (its inbox), shared by all ranks.
    inboxes: Box<[Segment]>,
}

impl Shared {
    /// Wakes every rank sleeping in [`Transport::wait`] (after an abort or a departure).
    fn wake_all(&self) {
        for inbox in self.inboxes.iter() {
            if let Ok(word) = inbox.word32(sleeping_at(self.inboxes.len())) {
                word.store(0, ShmOrdering::Release);
                futex_wake(word, i32::MAX);
            }
        }
    }
}

/// The ring of one ordered pair of ranks: a single-producer, single-consumer byte ring in the
/// receiver's inbox (the same view types as the shared-memory NICs' segments, over heap
/// memory). A record is one header word (its stamp, its length, whether a Long payload was
/// placed) and the message, padded to a word; a record that would cross the end of the ring
/// is preceded by a wrap record and starts again at the ring's beginning.
///
/// The header is stored last, with `Release`, and the receiver polls the header word where
/// the next record will start: one line carries both the message and its publication, as in
/// SCI's stamped slots. Before a header is published, the word where the record after it
/// will start is zeroed, so that word holds only zero or that next record's header (never
/// stale bytes of an older lap); the stamp (the record's number) checks it. The receiver
/// publishes its head (bytes and records consumed) after the handler returned, so a record is
/// lent to the handler where it lies and is written again only after that.
///
/// Inbox word area: per sender `s`, the head (bytes, then records) on line `s`; then the
/// sleeping word. Byte area: the rings, one per sender.
const LEN_MASK: u64 = u32::MAX as u64;
/// Record flag: the Long payload is already in the target's segment.
const PLACED: u64 = 1 << 32;
/// Record flag: nothing here; the next record starts at the ring's beginning.
const WRAP: u64 = 1 << 33;
const STAMP_SHIFT: u32 = 34;
/// Stamps run from 1 to this (never 0: a zeroed word is "nothing yet").
const STAMP_MAX: u64 = (1 << (64 - STAMP_SHIFT)) - 1;
/// Bytes of a record's header word.
const RECORD_HEADER: usize = 8;

/// The stamp of record number `n` (from 0) of a ring.
#[inline]
fn stamp(n: u64) -> u64 {
    (n % STAMP_MAX + 1) << STAMP_SHIFT
}

fn head_at(sender: usize) -> usize {
    sender * CACHE_LINE
}

/// The receiver's sleeping word (1 while it sleeps in [`Transport::wait`]), on the line after
/// every sender's.
fn sleeping_at(ranks: usize) -> usize {
    ranks * CACHE_LINE
}

fn pad(len: usize) -> usize {
    len.next_multiple_of(8)
}

/// What a sender keeps about its ring at one destination.
struct DestRing {
    /// The destination's inbox (its head is read from here), and a writer's view of it.
    inbox: Segment,
    inbox_w: Imported,
    /// The destination's segment, for Long payloads placed by the sender.
    segment: Imported,
    /// Bytes and records written, where the next record goes in the ring, and the head as
    /// last read.
    tail: u64,
    pos: usize,
    sent: u64,
    head: u64,
    consumed: u64,
}

/// The sending half: one ring at each destination rank.
struct LoopbackTx {
    rank: Rank,
    dests: Vec<DestRing>,
    ring_bytes: usize,
    capacity: u64,
    shared: Arc<Shared>,
}

impl LoopbackTx {
    #[cold]
    fn gone(&self, dest: Rank) -> SendError {
        if self.shared.aborted.load(Ordering::Relaxed) {
            SendError::JobAborted
        } else {
            SendError::PeerDeparted(dest)
        }
    }
}

impl LoopbackTx {
    /// `dest`'s segment, for remote atomics: an error once `dest` has left.
    fn peer_segment(&self, dest: Rank) -> Result<SharedBytes<'_>, SendError> {
        let Some(to) = self.dests.get(dest as usize) else {
            return Err(SendError::InvalidRank(dest));
        };
        if self.shared.departed[dest as usize].load(Ordering::Relaxed) != 0 {
            return Err(self.gone(dest));
        }
        Ok(to.segment.byte_area())
    }
}

impl Tx for LoopbackTx {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let me = self.rank as usize;
        let ranks = self.dests.len();
        let r = self.ring_bytes as u64;
        let Some(to) = self.dests.get_mut(dest as usize) else {
            return Err(SendError::InvalidRank(dest));
        };
        if self.shared.departed[dest as usize].load(Ordering::Relaxed) != 0 {
            return Err(self.gone(dest));
        }
        // A Long payload goes straight into the target's segment; only the head travels (out
        // of the segment, the head alone: the target rejects it).
        let place = msg.long_offset.filter(|&off| {
            off.checked_add(msg.payload.len())
                .is_some_and(|end| end <= to.segment.bytes_len())
        });
        let body = match msg.long_offset {
            None => msg.len(),
            Some(_) => msg.head.len(),
        };
        let need = RECORD_HEADER + pad(body);
        if need > self.ring_bytes / 2 {
            return Err(SendError::TooLarge(msg.len()));
        }
        let pos = to.pos;
        let skip = if pos + need > self.ring_bytes {
            self.ring_bytes - pos
        } else {
            0
        };
        // The record, and the word after it that is zeroed (see the ring's docs). A wrap
        // record does not count against the capacity.
        let span = (skip + need + RECORD_HEADER) as u64;
        let full = |to: &DestRing| {
            to.sent + 1 - to.consumed > self.capacity || to.tail + span - to.head > r
        };
        if full(to) {
            let line = to.inbox.words(head_at(me), 2).map_err(io)?;
            to.head = line[0].load(ShmOrdering::Acquire);
            to.consumed = line[1].load(ShmOrdering::Acquire);
            if full(to) {
                return Err(SendError::Busy);
            }
        }
        let base = me * self.ring_bytes;
        if skip > 0 {
            // The record goes at the beginning: zero its header word, then say so.
            to.inbox_w.store_slot_word(base, 0).map_err(io)?;
            let wrap = stamp(to.sent) | WRAP;
            to.inbox_w.store_slot_word(base + pos, wrap).map_err(io)?;
            to.sent += 1;
        }
        // After a wrap, the record starts at the beginning.
        let start = if skip > 0 { 0 } else { pos };
        let at = base + start;
        let mut word = stamp(to.sent) | body as u64;
        if let Some(off) = place {
            if !msg.payload.is_empty() {
                match msg.payload {
                    Payload::Private(p) => to.segment.write(off, p),
                    Payload::Shared(s) => to.segment.write_from(off, s),
                }
                .map_err(io)?;
            }
            word |= PLACED;
        }
        let data = at + RECORD_HEADER;
        match (msg.long_offset, msg.payload) {
            // A Short, or a Long's head: a few words, stored without gathering parts.
            (Some(_), _) | (None, Payload::Private([])) => {
                to.inbox_w.write_words_padded(data, &[], msg.head)
            }
            (None, Payload::Private(p)) => to.inbox_w.write_padded(data, &[msg.head, p]),
            (None, Payload::Shared(s)) => to.inbox_w.write_padded_then(data, &[msg.head], s),
        }
        .map_err(io)?;
        let after = match start + need {
            a if a == self.ring_bytes => 0,
            a => a,
        };
        let next = base + after;
        to.inbox_w.store_slot_word(next, 0).map_err(io)?;
        to.inbox_w.store_slot_word(at, word).map_err(io)?;
        to.tail += (skip + need) as u64;
        to.pos = after;
        to.sent += 1;
        // Against a receiver going to sleep: it announces that, fences and looks at every
        // tail again before it sleeps; we fence and look at its word after our tail.
        fence(ShmOrdering::SeqCst);
        let sleeping = to.inbox.word32(sleeping_at(ranks)).map_err(io)?;
        if sleeping.load(ShmOrdering::Relaxed) != 0 && sleeping.swap(0, ShmOrdering::AcqRel) != 0 {
            futex_wake(sleeping, 1);
        }
        Ok(())
    }
}

/// A view out of range: the rings were laid out wrongly (a bug here, not a peer's doing).
#[cold]
fn io(e: am_shm::ShmError) -> SendError {
    SendError::Other(format!("loopback: {e}"))
}

/// The receiving half: this rank's inbox and where it is in each ring.
struct Inbox {
    rings: Segment,
    /// Per sender: bytes and records consumed.
    head: Vec<u64>,
    consumed: Vec<u64>,
    /// Per sender: where its next record starts in its ring.
    pos: Vec<usize>,
    /// The sender to look at first (round robin: a flood from one cannot starve the others).
    next: usize,
}

/// An in-process transport: each rank is a thread, messages move through a ring per ordered
/// pair of ranks in heap memory, read and written through the same sound views as the
/// shared-memory NICs' segments; a message is lent to its handler where it lies, and a Long
/// payload is written by the sender straight into the target's segment. A rank whose thread
/// panics aborts the job: the others get [`TransportError::JobAborted`] from their next poll
/// instead of waiting forever.
pub struct Loopback {
    tx: LoopbackTx,
    size: u32,
    inbox: Inbox,
    /// Peers whose departure this rank has reported, and how many.
    departures_reported: Vec<bool>,
    departures_count: u64,
    /// Heap memory reached through the same views as the shared-memory NICs' segments.
    segment: Segment,
    config: LoopbackConfig,
}

/// Ends a [`Loopback`] job from outside: every rank's next poll fails with
/// [`TransportError::JobAborted`]. What a launcher does to a job whose rank failed.
#[derive(Clone)]
pub struct AbortHandle(Arc<Shared>);

impl AbortHandle {
    /// Aborts the job.
    pub fn abort(&self) {
        self.0.aborted.store(true, Ordering::Relaxed);
        self.0.wake_all();
    }

    /// When `rank`'s transport was dropped, in the order of the job's drops (1 for the
    /// first); `None` while it lives. Of several ranks that failed, the one that left first
    /// is the cause: the others failed because it was gone.
    pub fn departure(&self, rank: Rank) -> Option<u64> {
        let seq = self.0.departed.get(rank as usize)?.load(Ordering::Acquire);
        (seq != 0).then_some(seq)
    }
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortHandle")
            .field("aborted", &self.0.aborted.load(Ordering::Relaxed))
            .finish()
    }
}

impl Loopback {
    /// A handle that aborts this rank's whole job.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.tx.shared.clone())
    }

    /// Creates the transports of a job of `ranks` ranks; move each to its own thread.
    ///
    /// Each ordered pair of ranks gets a ring of twice the largest record (a Medium of
    /// `config.max_medium` bytes with its head), at least 64 bytes per message of
    /// `config.capacity`: `ranks * ranks` rings in all
    /// (128 KiB each with the defaults).
    ///
    /// # Panics
    /// If `ranks` is 0, `config.capacity` is 0, or the segments cannot be allocated.
    pub fn cluster(ranks: u32, config: LoopbackConfig) -> Vec<Loopback> {
        assert!(ranks > 0, "a job has at least one rank");
        assert!(
            config.capacity > 0,
            "a receive queue holds at least one message"
        );
        let n = ranks as usize;
        let largest = RECORD_HEADER + pad(crate::wire::MAX_HEAD_LEN + config.max_medium);
        let ring_bytes = (2 * largest)
            .max(config.capacity.saturating_mul(64))
            .next_multiple_of(8);
        let inboxes: Box<[Segment]> = (0..n)
            .map(|_| {
                Segment::heap(sleeping_at(n) + CACHE_LINE, n * ring_bytes)
                    .expect("loopback rings fit in memory")
            })
            .collect();
        let segments: Vec<Segment> = (0..n)
            .map(|_| {
                Segment::heap(0, config.segment_size)
                    .expect("a segment of config.segment_size bytes")
            })
            .collect();
        let shared = Arc::new(Shared {
            aborted: AtomicBool::new(false),
            departures: AtomicU64::new(0),
            departed: (0..ranks).map(|_| AtomicU64::new(0)).collect(),
            inboxes,
        });
        segments
            .iter()
            .enumerate()
            .map(|(rank, segment)| Loopback {
                tx: LoopbackTx {
                    rank: rank as Rank,
                    dests: (0..n)
                        .map(|d| DestRing {
                            inbox: shared.inboxes[d].share(),
                            inbox_w: shared.inboxes[d].import(),
                            segment: segments[d].import(),
                            tail: 0,
                            pos: 0,
                            sent: 0,
                            head: 0,
                            consumed: 0,
                        })
                        .collect(),
                    ring_bytes,
                    capacity: config.capacity as u64,
                    shared: shared.clone(),
                },
                size: ranks,
                inbox: Inbox {
                    rings: shared.inboxes[rank].share(),
                    head: vec![0; n],
                    consumed: vec![0; n],
                    pos: vec![0; n],
                    next: 0,
                },
                departures_reported: vec![false; n],
                departures_count: 0,
                segment: segment.share(),
                config,
            })
            .collect()
    }
}

impl Tx for Loopback {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.tx.try_send(dest, msg)
    }
}

/// A record this rank's inbox cannot hold: the rings are private to the job's threads, so
/// this is a bug of the sender in this file, reported rather than trusted.
#[cold]
fn bad_record(src: usize, what: String) -> TransportError {
    TransportError::PeerMisbehaved {
        peer: Some(src as Rank),
        what,
    }
}

impl Inbox {
    /// The first sender, from `next` on, whose ring holds a record, and that record's header
    /// word (loaded with `Acquire`: its bytes are visible).
    #[inline]
    fn ready(&mut self, ring_bytes: usize) -> Result<Option<(usize, u64)>, TransportError> {
        let n = self.head.len();
        for i in 0..n {
            let s = match self.next + i {
                s if s >= n => s - n,
                s => s,
            };
            let pos = self.pos[s];
            let word = self
                .rings
                .load_slot_word(s * ring_bytes + pos)
                .map_err(|e| bad_record(s, e.to_string()))?;
            if word == 0 {
                continue;
            }
            if word & !((1 << STAMP_SHIFT) - 1) != stamp(self.consumed[s]) {
                return Err(bad_record(
                    s,
                    format!(
                        "loopback record {word:#x} at {pos}, expected stamp {:#x}",
                        stamp(self.consumed[s])
                    ),
                ));
            }
            return Ok(Some((s, word)));
        }
        Ok(None)
    }

    /// After the record of `bytes` bytes from `s` was handled (the next one starts at `pos`
    /// of its ring): publishes the new head.
    #[inline]
    fn consume(&mut self, s: usize, bytes: u64, pos: usize) -> Result<(), TransportError> {
        self.head[s] += bytes;
        self.pos[s] = pos;
        self.consumed[s] += 1;
        self.next = s + 1;
        let line = self
            .rings
            .words(head_at(s), 2)
            .map_err(|e| bad_record(s, e.to_string()))?;
        line[1].store(self.consumed[s], ShmOrdering::Release);
        line[0].store(self.head[s], ShmOrdering::Release);
        Ok(())
    }
}

impl Transport for Loopback {
    fn name(&self) -> &'static str {
        "loopback"
    }

    fn rank(&self) -> Rank {
        self.tx.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn limits(&self) -> Limits {
        Limits {
            max_args: crate::wire::MAX_ARGS,
            max_medium: self.config.max_medium,
            max_long: self.config.max_long,
            max_credits: u32::MAX,
        }
    }

    fn segment(&self) -> SharedBytes<'_> {
        self.segment.byte_area()
    }

    /// A copy into the target's segment: every rank's segment is memory of this process.
    fn put(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<bool, SendError> {
        crate::rma::put_into(dest, self.tx.peer_segment(dest)?, offset, data)
    }

    fn get(&mut self, src: Rank, offset: usize, dst: &mut [u8]) -> Result<bool, SendError> {
        crate::rma::get_from(src, self.tx.peer_segment(src)?, offset, dst)
    }

    /// An atomic instruction on the target's word: every rank's segment is memory of this
    /// process.
    fn atomic(
        &mut self,
        dest: Rank,
        offset: usize,
        atomic: crate::atomic::Atomic,
    ) -> Result<Option<u64>, SendError> {
        atomic
            .apply_to(dest, self.tx.peer_segment(dest)?, offset)
            .map(Some)
    }

    fn applies_atomics(&self, dest: Rank) -> bool {
        self.tx.peer_segment(dest).is_ok()
    }

    fn atomics(&mut self, batch: &[crate::atomic::Posted]) -> crate::atomic::Batch {
        let applied = crate::atomic::apply_batch(batch, |d| self.tx.peer_segment(d));
        crate::atomic::Batch::all(batch.len(), applied)
    }

    #[inline]
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        // Loaded before the rings are looked at: a departure counted here came after all of
        // that rank's sends, which its ring then holds.
        let departures = self.tx.shared.departures.load(Ordering::Acquire);
        let ring_bytes = self.tx.ring_bytes;
        loop {
            let Some((s, word)) = self.inbox.ready(ring_bytes)? else {
                if self.tx.shared.aborted.load(Ordering::Relaxed) {
                    return Err(TransportError::JobAborted);
                }
                if departures != self.departures_count {
                    if let Some(r) = self.departed_since(departures) {
                        return Err(TransportError::PeerDeparted(r));
                    }
                }
                return Ok(None);
            };
            let pos = self.inbox.pos[s];
            if word & WRAP != 0 {
                self.inbox.consume(s, (ring_bytes - pos) as u64, 0)?;
                continue;
            }
            let len = (word & LEN_MASK) as usize;
            let end = pos + RECORD_HEADER + pad(len);
            if end > ring_bytes {
                return Err(bad_record(
                    s,
                    format!("loopback record {word:#x} at {pos} of a {ring_bytes}-byte ring"),
                ));
            }
            let bytes = self
                .inbox
                .rings
                .byte_area()
                .slice(s * ring_bytes + pos + RECORD_HEADER, len)
                .map_err(|e| bad_record(s, e.to_string()))?;
            let delivery = Delivery {
                src: s as Rank,
                bytes: Received::Shared(bytes),
                payload_placed: word & PLACED != 0,
                route: Route::NONE,
            };
            let r = f(delivery, self.segment.byte_area(), &mut self.tx);
            self.inbox.consume(
                s,
                (end - pos) as u64,
                if end == ring_bytes { 0 } else { end },
            )?;
            return Ok(Some(r));
        }
    }

    /// A ring holds nothing per request: one empty reply can answer several.
    fn acks_coalesce(&self) -> bool {
        true
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let n = self.size as usize;
        let rings = self.inbox.rings.share();
        let word = rings
            .word32(sleeping_at(n))
            .map_err(|e| TransportError::Io(e.to_string()))?;
        // Announce, fence, look again: a sender that published before our look is seen by
        // it; one after it sees our word (it fences between its tail and its look) and
        // wakes us.
        word.store(1, ShmOrdering::Relaxed);
        fence(ShmOrdering::SeqCst);
        let departures = self.tx.shared.departures.load(Ordering::Acquire);
        let idle = self.inbox.ready(self.tx.ring_bytes)?.is_none()
            && !self.tx.shared.aborted.load(Ordering::Relaxed)
            && departures == self.departures_count;
        if idle {
            futex_wait(word, 1, Some(timeout));
        }
        word.store(0, ShmOrdering::Relaxed);
        Ok(())
    }
}

impl Loopback {
    /// A peer that departed among the first `departures` drops and was not reported yet
    /// (now marked reported).
    fn departed_since(&mut self, departures: u64) -> Option<Rank> {
        let me = self.tx.rank as usize;
        let shared = &self.tx.shared;
        let r = (0..self.departures_reported.len()).find(|&r| {
            let seq = shared.departed[r].load(Ordering::Acquire);
            r != me && !self.departures_reported[r] && seq != 0 && seq <= departures
        })?;
        self.departures_reported[r] = true;
        self.departures_count += 1;
        Some(r as Rank)
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        let shared = &self.tx.shared;
        if std::thread::panicking() {
            shared.aborted.store(true, Ordering::Relaxed);
        }
        let seq = shared.departures.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(d) = shared.departed.get(self.tx.rank as usize) {
            d.store(seq, Ordering::Release);
        }
        shared.wake_all();
    }
}

impl std::fmt::Debug for Loopback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loopback")
            .field("rank", &self.tx.rank)
            .field("size", &self.size)
            .field("config", &self.config)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn small(ranks: u32, capacity: usize) -> Vec<Loopback> {
        Loopback::cluster(
            ranks,
            LoopbackConfig {
                capacity,
                segment_size: 4096,
                max_medium: 200,
                max_long: 4096,
            },
        )
    }

    /// A message whose bytes say its number and length.
    fn message(k: usize, len: usize) -> Vec<u8> {
        (0..len).map(|i| (k * 31 + i) as u8).collect()
    }

    /// Polls `rx` once: the source and bytes of what it delivered.
    fn take(rx: &mut Loopback) -> Option<(Rank, Vec<u8>, bool)> {
        rx.poll_recv(|d, _, _| (d.src, d.bytes.to_vec(), d.payload_placed))
            .expect("a clean poll")
    }

    #[test]
    fn records_cross_the_ring_end_in_order_and_whole() {
        let mut t = small(2, 8);
        let (a, b) = t.split_at_mut(1);
        let (tx, rx) = (&mut a[0], &mut b[0]);
        let ring = tx.tx.ring_bytes;
        let mut sent = 0;
        let mut received = 0;
        let mut bytes = 0;
        // Lengths that leave every remainder before the ring's end, many laps over.
        while bytes < 6 * ring || received < sent {
            if sent - received < 5 && bytes < 6 * ring {
                let len = 8 + (sent * 37) % 200;
                let m = message(sent, len);
                match tx.try_send(1, &Outgoing::new(&m[..8], &m[8..])) {
                    Ok(()) => {
                        sent += 1;
                        bytes += len;
                        continue;
                    }
                    Err(SendError::Busy) => {}
                    Err(e) => panic!("send {sent}: {e}"),
                }
            }
            let (src, got, placed) = take(rx).expect("a record is waiting");
            assert_eq!((src, placed), (0, false));
            assert_eq!(
                got,
                message(received, 8 + (received * 37) % 200),
                "#{received}"
            );
            received += 1;
        }
        assert!(take(rx).is_none());
        assert!(
            bytes >= 6 * ring,
            "{sent} records, {bytes} bytes over a {ring}-byte ring"
        );
    }

    #[test]
    fn a_full_ring_is_busy_until_the_receiver_takes() {
        let mut t = small(2, 3);
        let (a, b) = t.split_at_mut(1);
        let (tx, rx) = (&mut a[0], &mut b[0]);
        let m = message(0, 16);
        for _ in 0..3 {
            tx.try_send(1, &Outgoing::new(&m[..8], &m[8..])).unwrap();
        }
        assert_eq!(
            tx.try_send(1, &Outgoing::new(&m[..8], &m[8..])),
            Err(SendError::Busy)
        );
        assert!(take(rx).is_some());
        tx.try_send(1, &Outgoing::new(&m[..8], &m[8..])).unwrap();
        assert_eq!((0..3).filter_map(|_| take(rx)).count(), 3);
        assert!(take(rx).is_none());
    }

    #[test]
    fn a_long_payload_is_placed_by_the_sender_and_one_outside_is_not() {
        let mut t = small(2, 8);
        let (a, b) = t.split_at_mut(1);
        let (tx, rx) = (&mut a[0], &mut b[0]);
        let head = [1u8; 16];
        let payload = message(3, 100);
        let long = |offset| Outgoing {
            head: &head,
            payload: Payload::Private(&payload),
            long_offset: Some(offset),
            reply_to: None,
        };
        tx.try_send(1, &long(64)).unwrap();
        let (_, got, placed) = take(rx).unwrap();
        assert_eq!((got, placed), (head.to_vec(), true));
        let mut seg = vec![0u8; 100];
        rx.segment().read(64, &mut seg).unwrap();
        assert_eq!(seg, payload);
        // Past the end: only the head travels, unplaced, and the segment is untouched.
        tx.try_send(1, &long(4096 - 50)).unwrap();
        let (_, got, placed) = take(rx).unwrap();
        assert_eq!((got, placed), (head.to_vec(), false));
        assert!(rx.segment().to_vec()[4000..].iter().all(|&b| b == 0));
    }

    /// Every corruption of the word the receiver polls is a typed error naming the sender,
    /// and nothing is delivered.
    #[test]
    fn a_corrupt_record_header_is_reported_not_trusted() {
        let ring = small(2, 8)[0].tx.ring_bytes as u64;
        for bad in [
            stamp(5) | 8,                 // the wrong stamp
            stamp(0) | (ring + 8),        // longer than the ring
            stamp(0) | (ring - 4),        // runs past the ring's end
            stamp(0) | 1 << 33 | 1 << 32, // a wrap that also says "placed": still a wrap
            u64::MAX,                     // everything set
        ] {
            let mut t = small(2, 8);
            let (a, b) = t.split_at_mut(1);
            let (tx, rx) = (&mut a[0], &mut b[0]);
            let m = message(0, 16);
            tx.try_send(1, &Outgoing::new(&m[..8], &m[8..])).unwrap();
            // Sender 0's ring starts at 0 of rank 1's inbox.
            tx.tx.dests[1].inbox_w.store_slot_word(0, bad).unwrap();
            match rx.poll_recv(|_, _, _| ()) {
                Err(TransportError::PeerMisbehaved { peer: Some(0), .. }) => {}
                // A wrap is a valid header: the receiver moves to the ring's start, where
                // nothing was published.
                Ok(None) if bad & WRAP != 0 && bad != u64::MAX => {}
                other => panic!("{bad:#x}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_sleeping_receiver_wakes_for_a_send() {
        let mut t = small(2, 8);
        let mut rx = t.pop().unwrap();
        let mut tx = t.pop().unwrap();
        let sender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            let m = message(1, 16);
            tx.try_send(1, &Outgoing::new(&m[..8], &m[8..])).unwrap();
            tx
        });
        let start = Instant::now();
        let limit = Duration::from_secs(60);
        let mut got = None;
        while got.is_none() && start.elapsed() < limit {
            rx.wait(Duration::from_secs(30)).unwrap();
            got = take(&mut rx);
        }
        // A lost wake-up would sleep the whole 30 s.
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{:?}",
            start.elapsed()
        );
        assert_eq!(got.map(|g| g.1), Some(message(1, 16)));
        drop(sender.join().unwrap());
    }

    #[test]
    fn sends_to_a_departed_rank_fail_and_its_departure_is_reported() {
        let mut t = small(2, 8);
        let gone = t.pop().unwrap();
        let mut me = t.pop().unwrap();
        drop(gone);
        let m = message(0, 16);
        assert_eq!(
            me.try_send(1, &Outgoing::new(&m[..8], &m[8..])),
            Err(SendError::PeerDeparted(1))
        );
        assert_eq!(
            me.poll_recv(|_, _, _| ()),
            Err(TransportError::PeerDeparted(1))
        );
        assert_eq!(me.poll_recv(|_, _, _| ()), Ok(None));
    }
}
