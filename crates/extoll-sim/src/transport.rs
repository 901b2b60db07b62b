//! [`Extoll`]: the NIC of one rank, as an `am_core::Transport`.
//!
//! Everything a peer can write into this rank's segment is read once into a local and checked
//! there (status words, packet meta, RMA Medium tails, notifications, acks, claim records,
//! head, departed and abort words). What breaks the protocol is dropped and reported as
//! [`TransportError::PeerMisbehaved`], naming the peer where the word says who wrote it;
//! nothing a peer writes can make a receiver wait in silence: a wait that can no longer end
//! (a claim nobody vouches for, a packet waiting for an RMA Medium that was never sent, a hole
//! left by a corrupt tail) is found by the checks of a stalled queue, every
//! [`LIVENESS_AFTER`] at most, and ended.

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use am_core::{
    Armed, Capabilities, Delivery, Limits, Outgoing, Payload, Rank, Received, Route, SendError,
    SharedBytes, Transport, TransportError, Tx,
};
use am_nic::wake::{Wake, Wakers};
use am_shm::mailbox::{Inbox, Port, Ring, Seen, STATUS_LEN};
use am_shm::{Imported, Rung, Segment, ShmError};

use crate::layout::{
    mailbox_claimer, notes_claimer, notes_claimer_of, Layout, CLAIM_MAILBOX, CLAIM_NOTES, DOORBELL,
    RMA_BUF,
};
use crate::rma::{self, kind, Data, Job, Note, PeerMap, Reserved, RmaEngine, NOTIFY_PATIENCE};
use crate::velo::{
    self, FrameError, Meta, Reassembler, FIRST, LAST, PLACED, RMA_BEFORE_MOD, RMA_WAIT,
};
use crate::{ExtollConfig, ExtollError, MediumPath, RmaError, MAX_MEDIUM};

/// A queue whose head has not moved for this long is checked for waits that cannot end, and
/// the peers for liveness.
const LIVENESS_AFTER: Duration = Duration::from_millis(100);
/// Polls between two looks at the clock.
const IDLE_POLLS_PER_TICK: u32 = 1024;
/// The largest message over VELO or in an RMA buffer: head plus Medium payload.
const MAX_MSG: usize = am_core::wire::MAX_HEAD_LEN + MAX_MEDIUM;
/// The most VELO packets of one message (64-byte packets).
const MAX_PACKETS: usize = MAX_MSG.div_ceil(64 - STATUS_LEN);
/// Bytes of an RMA buffer's tail.
const TAIL: usize = 8;
/// Errors kept for the next polls (found off the delivery path, or while sending).
const MAX_FAULTS: usize = 64;
/// A piggybacked acknowledgement this far behind ours (mod 2^16) or more is an old one, not
/// one ahead of what we sent.
const STALE_ACK: u64 = 1 << 15;

/// A user RMA operation in flight ([`Extoll::rma_put`], [`Extoll::rma_get`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RmaOp {
    id: u64,
    peer: Rank,
}

/// The marker of the `k`-th RMA Medium of a connection (never 0, so a zeroed buffer is never
/// taken for a message): the lap of its buffer per connection, or with a pool, `k` itself
/// (a pool buffer has no laps of one sender's).
fn marker(k: u64, l: &Layout) -> u64 {
    if l.rma_pool > 0 {
        k % 0xffff + 1
    } else {
        (k / l.rma_buffers as u64 + 1) & 0xffff
    }
}

/// The value of a pool buffer's claim word while rank `s` holds it for its `k`-th RMA Medium
/// to that receiver (never 0, which is free): the receiver checks a notification against it,
/// and its idle sweep frees a claim whose Medium was delivered already.
fn pool_claim(s: usize, k: u64) -> u64 {
    1 << 63 | (s as u64) << 32 | (k & 0xffff_ffff)
}

/// An RMA Medium's notification value with a pool: `k` below [`POOL_INDEX_SHIFT`], its pool
/// buffer above.
const POOL_INDEX_SHIFT: u32 = 48;

fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

/// A shared-memory access of this NIC's own layout that failed (its cause kept as the
/// source).
#[cold]
fn shm(e: ShmError) -> SendError {
    SendError::device_from("extoll: a shared-memory access out of the layout", e)
}

/// A failure of this rank's own device (its cause kept as the source).
#[cold]
fn io(e: impl std::error::Error + Send + Sync + 'static) -> TransportError {
    TransportError::device_from("extoll: the device failed", e)
}

/// A peer broke the protocol: `peer` where the word says who.
fn misbehaved(peer: Option<usize>, what: impl std::fmt::Display) -> TransportError {
    TransportError::PeerMisbehaved {
        peer: peer.map(|p| p as Rank),
        what: format!("extoll: {what}"),
    }
}

/// The AM segment: a view of the byte area after the queues and receive buffers.
fn am_segment<'a>(seg: &'a Segment, l: &Layout) -> SharedBytes<'a> {
    seg.view(l.segment_base(), l.segment).unwrap_or_else(|_| {
        let all = seg.byte_area();
        all.slice(0, 0).unwrap_or(all)
    })
}

/// How many slots past the tail a streaming sender takes for writing: far enough that the
/// owner has read that slot, near enough that the line is still ours when the claim comes.
const PREFETCH_AHEAD: u64 = 8;

/// [`TxState::last_sent_to`] when nothing was sent since the last poll.
const NOT_STREAMING: usize = usize::MAX;

/// Rings the doorbell of a peer's segment `seg`, leaving no tag (the VELO mailbox is shared
/// by every sender); [`Rung::Armed`]: the peer sleeps armed on its wake socket, and the
/// caller wakes it ([`TxState::wake`]).
#[inline(always)]
fn ring_doorbell(seg: &Segment) -> Result<Rung, SendError> {
    Ok(seg.doorbell(DOORBELL).map_err(shm)?.ring_tagged_lazy(0))
}

/// What a rank keeps per destination to send to it: one lookup on the send path.
struct Dest {
    /// Our port on its VELO mailbox (its words and slots checked once, at start).
    port: Port,
    /// Our main thread's port on its notification queue (immediate puts' completer
    /// notifications; checked once, at start).
    notes: Port,
    /// VELO messages sent to it.
    velo_sent: u64,
    /// RMA Mediums sent to it.
    rma_sent: u64,
    /// Declared lost: nothing more is sent to it, its claims are skipped.
    lost: bool,
}

/// The sending half, lent to handlers during `poll_recv`.
struct TxState {
    rank: usize,
    layout: Layout,
    config: ExtollConfig,
    /// The Medium path in use (switchable at run time, for measurements).
    medium: Cell<MediumPath>,
    peers: Arc<Vec<PeerMap>>,
    /// Per destination: its port, counters and whether it is lost.
    dests: Vec<Dest>,
    /// Payload bytes of a VELO packet.
    cap: usize,
    /// Where our RMA Medium receive buffers start in every peer's segment (`layout.rx(rank,
    /// 0)`, computed once: buffer `i` is `RMA_BUF` bytes further per index).
    rx_ours: usize,
    /// With a pool: where its buffers start in every segment (`layout.pool(0)`), and per
    /// destination, the buffer its next claim tries first (after the last one we took).
    pool_at: usize,
    pool_hint: Vec<usize>,
    pids: Vec<Option<nix::unistd::Pid>>,
    /// Each destination's mailbox head as last read.
    mailbox_head: Vec<u64>,
    /// The destination of the last one-packet VELO message sent since the last poll
    /// ([`NOT_STREAMING`]: none): a second one to the same rank means requests stream to it
    /// (a flood), not a lone round trip or one message to each of several peers.
    last_sent_to: usize,
    /// RMA Mediums acknowledged (freed receive buffers), per destination.
    rma_acked: Vec<u64>,
    /// RMA Mediums consumed per source, and the count last acknowledged to it.
    rma_consumed: Vec<u64>,
    rma_ack_sent: Vec<u64>,
    /// Each notification queue's head as last read (ours included), for immediate puts.
    note_heads: Vec<u64>,
    engine: Option<RmaEngine>,
    /// How long the engine's thread waits for room in a live peer's notification queue.
    engine_patience: Duration,
    /// Jobs queued to the engine's thread, and their requester notifications seen (all done
    /// when equal).
    jobs: u64,
    jobs_done: u64,
    next_op: u64,
    /// Errors found outside `poll_recv`'s delivery path, returned by the next polls.
    faults: VecDeque<TransportError>,
    /// The tickets of a message's packets (reused).
    tickets: Vec<u64>,
}

/// How far the first packet of a message may go now: per-source order across both paths,
/// and a Long after its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Ready,
    /// An RMA Medium sent before it is still to be delivered.
    WaitRma,
    /// Its Long payload's completer notification has not arrived.
    WaitLong,
    /// It says `ahead` RMA Mediums were sent before it, more than may be in flight.
    RmaAhead(u64),
    /// `RMA_WAIT` on a message that is not a placed Long.
    WaitUnplaced,
}

/// What an RMA Medium's tail says, read once ([`Extoll::rma_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RmaState {
    /// No Medium from that source is waiting.
    None,
    /// The next one is deliverable; its tail.
    Ready(u64),
    /// The next one waits for VELO messages sent before it.
    WaitsVelo,
    /// Its tail's marker does not match the notification.
    BadMarker(u64),
    /// Its tail's length is out of range.
    BadLength(usize),
}

/// What a taken-over slot turned into ([`Extoll::take_over`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// Skipped: consume it.
    Skipped,
    /// Its claimer published it meanwhile: deliver it.
    Published,
    /// It keeps changing (someone keeps writing it): try later.
    Neither,
}

/// When each queue's head last moved, and when the stalled-queue checks last ran.
struct Watch {
    mailbox: u64,
    mailbox_since: Instant,
    notes: u64,
    notes_since: Instant,
    last_check: Option<Instant>,
}

/// One rank's EXTOLL NIC. See the [crate docs](crate).
pub struct Extoll {
    seg: Segment,
    own: Imported,
    /// Our VELO mailbox and notification queue, as their owner reaches them (checked once).
    inbox: Inbox,
    notes: Inbox,
    /// Mailbox tickets consumed before the head is told in passing (a quarter mailbox).
    head_batch: u64,
    /// Where each source's RMA Medium receive buffers start in our segment (`layout.rx(s,
    /// 0)`, computed once).
    rx_from: Vec<usize>,
    tx: TxState,
    /// Next mailbox ticket, next notification ticket, and the heads last published.
    head: u64,
    note_head: u64,
    head_told: u64,
    note_told: u64,
    reasm: Reassembler,
    velo_delivered: Vec<u64>,
    rma_delivered: Vec<u64>,
    rma_landed: Vec<u64>,
    rma_pending: u64,
    /// With a pool: per source, the pool buffers of its notified RMA Mediums not yet
    /// delivered, in order.
    pool_bufs: Vec<VecDeque<u32>>,
    long_landed: Vec<u64>,
    long_used: Vec<u64>,
    put_landed: Vec<u64>,
    /// User operations in flight, done, and failed (with the requester notification's kind).
    user_pending: HashSet<u64>,
    user_done: HashSet<u64>,
    user_failed: HashMap<u64, u32>,
    rr: usize,
    /// The last poll found the mailbox head waiting for an RMA landing.
    rma_stall: bool,
    polls: u32,
    /// Peers' lives (pids, departed words): `am_nic`'s check, run by the stalled-queue checks.
    liveness: am_nic::Liveness,
    watch: Watch,
    /// Where an event loop sleeps between `arm` and `disarm`.
    wake: Wake,
}

impl TxState {
    /// Wakes `d`, whose doorbell said it sleeps armed on its wake socket (off the send path).
    #[cold]
    #[inline(never)]
    fn wake(&self, d: usize) {
        if let Some(peer) = self.peers.get(d) {
            peer.wakers.wake(peer.rank);
        }
    }

    #[inline(always)]
    fn cap(&self) -> usize {
        self.cap
    }

    /// Keeps an error for the next poll (bounded: a peer that keeps misbehaving costs no
    /// memory).
    fn fault(&mut self, e: TransportError) {
        if self.faults.len() < MAX_FAULTS {
            self.faults.push_back(e);
        }
    }

    fn engine(&mut self) -> Result<&RmaEngine, SendError> {
        if self.engine.is_none() {
            let e = RmaEngine::start(
                self.rank,
                self.layout,
                self.peers.clone(),
                self.pids.clone(),
                self.engine_patience,
            )
            .map_err(|e| SendError::device_from("extoll: starting the RMA engine", e))?;
            self.engine = Some(e);
        }
        self.engine
            .as_ref()
            .ok_or_else(|| SendError::device("extoll: no RMA engine"))
    }

    fn submit(&mut self, job: Job) -> Result<(), SendError> {
        if !self.engine()?.submit(job) {
            return Err(SendError::device("extoll: the RMA engine stopped"));
        }
        self.jobs += 1;
        Ok(())
    }

    /// Claims `out.len()` mailbox slots at `d`, all or none, or reports back-pressure. The
    /// claims name us, and our record in `d`'s segment vouches for them until
    /// [`finish_claim`](Self::finish_claim) releases it.
    #[inline(always)]
    fn claim(&mut self, d: usize, out: &mut [u64]) -> Result<(), SendError> {
        match self.dests[d]
            .port
            .try_claim(out.len(), &mut self.mailbox_head[d], out)
        {
            Ok(true) => Ok(()),
            Ok(false) => Err(SendError::Busy),
            Err(e) => Err(self.corrupt_mailbox(d, e)),
        }
    }

    /// A claim at `d` failed on a corrupt ring: the cached head only grows, so a corrupt head
    /// word must not poison it.
    #[cold]
    fn corrupt_mailbox(&mut self, d: usize, e: ShmError) -> SendError {
        self.mailbox_head[d] = 0;
        shm(e)
    }

    /// A message's packets at `d` are all published: counted, and `d`'s doorbell rung.
    #[inline(always)]
    fn announce(&mut self, d: usize) -> Result<(), SendError> {
        let dst = &mut self.dests[d];
        dst.velo_sent += 1;
        if ring_doorbell(dst.port.segment())? == Rung::Armed {
            self.wake(d);
        }
        Ok(())
    }

    /// The reused ticket buffer, holding `n` zeros (give it back to `self.tickets`): an array
    /// for the largest message would be kilobytes of stack to zero on every send.
    fn take_tickets(&mut self, n: usize) -> Vec<u64> {
        let mut t = std::mem::take(&mut self.tickets);
        t.clear();
        t.resize(n, 0);
        t
    }

    /// Ends a claim at `d` whose slots are published (`r` is `Ok`) or not (then `unpublished`
    /// are skipped, so that no claim stays open): releases the record and rings the doorbell.
    #[inline(always)]
    fn finish_claim(
        &mut self,
        d: usize,
        unpublished: &[u64],
        r: Result<(), ShmError>,
    ) -> Result<(), SendError> {
        let port = &self.dests[d].port;
        if r.is_err() {
            for &t in unpublished {
                port.skip(t);
            }
        }
        port.release();
        r.map_err(shm)?;
        self.announce(d)
    }

    /// Writes and publishes `head ++ payload` as packets into the `claimed` tickets
    /// `ticket(0)`, `ticket(1)`, ... (one per packet, as many as the message takes), straight
    /// from where the payload is (a shared one included, with no private copy), then ends
    /// the claim ([`finish_claim`](Self::finish_claim)): on an error the rest are skipped.
    fn emit(
        &mut self,
        d: usize,
        claimed: usize,
        ticket: impl Fn(usize) -> u64,
        head: &[u8],
        payload: Payload<'_>,
        flags: u32,
    ) -> Result<(), SendError> {
        let cap = self.cap;
        let hl = head.len();
        let total = hl + payload.len();
        let n = velo::packets(total, cap);
        let dst = &self.dests[d];
        let port = &dst.port;
        let rma_before = (dst.rma_sent % RMA_BEFORE_MOD) as u32;
        let mut published = 0;
        let mut r = if claimed == n {
            Ok(())
        } else {
            Err(ShmError::OutOfBounds {
                offset: 0,
                len: n,
                area: claimed,
            })
        };
        if r.is_ok() {
            for i in 0..n {
                // Packet i holds bytes [start, end) of head ++ payload; end > start but
                // for an empty message (n == 1, then 0 bytes).
                let (start, end) = (i * cap, ((i + 1) * cap).min(total));
                let h = &head[start.min(hl)..end.min(hl)];
                let (a, b) = (start.saturating_sub(hl), end.saturating_sub(hl));
                let mut f = if i == 0 { FIRST | flags } else { 0 };
                if i + 1 == n {
                    f |= LAST;
                }
                let meta = Meta {
                    src: self.rank as u32,
                    len: end - start.min(end),
                    flags: f,
                    rma_before,
                }
                .encode();
                let t = ticket(i);
                let w = match payload {
                    Payload::Private(p) => port.write_two(t, h, &p[a..b], meta),
                    Payload::Shared(s) => s
                        .slice(a, b - a)
                        .and_then(|s| port.write_then(t, &[h], s, meta)),
                };
                match w {
                    Ok(()) => published = i + 1,
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
        }
        if r.is_err() {
            let rest: Vec<u64> = (published..claimed).map(ticket).collect();
            return self.finish_claim(d, &rest, r);
        }
        self.finish_claim(d, &[], r)
    }

    fn send_velo(
        &mut self,
        d: usize,
        head: &[u8],
        payload: Payload<'_>,
        flags: u32,
    ) -> Result<(), SendError> {
        let total = head.len() + payload.len();
        if total <= self.cap() {
            return self.send_packet(d, head, payload, flags);
        }
        self.send_packets(d, head, payload, flags)
    }

    /// The several-packet case of [`send_velo`](Self::send_velo): claims all, then writes
    /// and publishes each.
    #[inline(never)]
    fn send_packets(
        &mut self,
        d: usize,
        head: &[u8],
        payload: Payload<'_>,
        flags: u32,
    ) -> Result<(), SendError> {
        let total = head.len() + payload.len();
        let n = velo::packets(total, self.cap());
        if n > MAX_PACKETS {
            return Err(SendError::TooLarge(total));
        }
        // The usual claim: a run of consecutive slots at the tail, no ticket list.
        if let Some(t0) = self.dests[d].port.claim_run(n, self.mailbox_head[d]) {
            return self.emit(d, n, |i| t0 + i as u64, head, payload, flags);
        }
        let mut t = self.take_tickets(n);
        let r = self
            .claim(d, &mut t)
            .and_then(|()| self.emit(d, n, |i| t[i], head, payload, flags));
        self.tickets = t;
        r
    }

    /// The one-packet case of [`send_velo`](Self::send_velo) (every Short, small Mediums):
    /// claim, write, publish, all in the slot's one cache line, then release the claim.
    #[inline]
    fn send_packet(
        &mut self,
        d: usize,
        head: &[u8],
        payload: Payload<'_>,
        flags: u32,
    ) -> Result<(), SendError> {
        let dst = &mut self.dests[d];
        let meta = Meta {
            src: self.rank as u32,
            len: head.len() + payload.len(),
            flags: FIRST | LAST | flags,
            rma_before: (dst.rma_sent % RMA_BEFORE_MOD) as u32,
        }
        .encode();
        let cached = &mut self.mailbox_head[d];
        // Claim, write, publish and release in one step, on the port's checked slots.
        let sent = match payload {
            Payload::Private(p) => dst.port.send(cached, head, p, meta),
            // An echo: straight from where it was received into the peer's slot.
            Payload::Shared(s) => dst.port.send_then(cached, &[head], s, meta),
        };
        match sent {
            Ok(true) => {
                dst.velo_sent += 1;
                // Streaming: take a line we will write soon. Not for a lone round trip,
                // where that transfer would share the path with the message.
                if self.last_sent_to == d {
                    dst.port.prefetch_ahead(PREFETCH_AHEAD);
                }
                self.last_sent_to = d;
                if ring_doorbell(dst.port.segment())? == Rung::Armed {
                    self.wake(d);
                }
                Ok(())
            }
            Ok(false) => Err(SendError::Busy),
            Err(e) => Err(self.corrupt_mailbox(d, e)),
        }
    }

    /// Reserves the completer's notification slot of an immediate put to `dest`, or reports
    /// back-pressure.
    fn reserve(&mut self, dest: usize) -> Result<Reserved, SendError> {
        let port = &self.dests[dest].notes;
        Reserved::claim(port, &mut self.note_heads[dest])
            .map_err(shm)?
            .ok_or_else(|| SendError::Busy)
    }

    /// Claims a free buffer of `d`'s pool for our `k`-th RMA Medium to it (a compare-and-swap
    /// on its claim word, the RMA unit's atomic), trying them in turn from after the last one
    /// we took; `None` if every one is held.
    fn claim_pool(&mut self, d: usize, k: u64) -> Result<Option<usize>, SendError> {
        let p = self.layout.rma_pool;
        let seg = &self.peers[d].seg;
        let v = pool_claim(self.rank, k);
        let start = self.pool_hint[d];
        for j in 0..p {
            let i = (start + j) % p;
            let w = seg.word(self.layout.pool_claim(i)).map_err(shm)?;
            // Acquire: the receiver's release of the buffer (after reading it) is before our
            // writes into it.
            if w.load(Ordering::Relaxed) == 0
                && w.compare_exchange(0, v, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                self.pool_hint[d] = (i + 1) % p;
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// Gives back pool buffer `i` of `d`, claimed for our `k`-th RMA Medium and not used.
    fn unclaim_pool(&self, d: usize, i: usize, k: u64) {
        if let Ok(w) = self.peers[d].seg.word(self.layout.pool_claim(i)) {
            let _ = w.compare_exchange(
                pool_claim(self.rank, k),
                0,
                Ordering::Release,
                Ordering::Relaxed,
            );
        }
    }

    /// How many RMA Mediums to `d` are in flight (sent, not acknowledged), after reading its
    /// acknowledgement word (one load, checked in the copy).
    #[inline(always)]
    fn rma_in_flight(&mut self, d: usize) -> Result<u64, SendError> {
        let at = self.layout.ack(d);
        let word = self.peers[self.rank].seg.load_word(at).map_err(shm)?;
        let sent = self.dests[d].rma_sent;
        if word > sent {
            // More acknowledged than sent: ignored, and put back to what we know.
            let _ = self.peers[self.rank].imp.store_word(at, self.rma_acked[d]);
            self.fault(misbehaved(
                Some(d),
                format!("acknowledged {word} RMA Mediums, {sent} were sent"),
            ));
        } else if word > self.rma_acked[d] {
            self.rma_acked[d] = word;
        }
        Ok(sent - self.rma_acked[d])
    }

    /// pscom's RMA plugin: one put of the message into `d`'s receive buffer of the next index
    /// (message at the end, the tail last), by the engine as the doorbell is rung.
    fn send_rma_medium(
        &mut self,
        d: usize,
        head: &[u8],
        payload: Payload<'_>,
    ) -> Result<(), SendError> {
        if self.layout.rma_pool > 0 {
            return self.send_pool_medium(d, head, payload);
        }
        let b = self.layout.rma_buffers as u64;
        if self.rma_in_flight(d)? >= b {
            return Err(SendError::Busy);
        }
        let slots = self.reserve(d)?;
        let k = self.dests[d].rma_sent;
        // `k % b < rma_buffers`: `rx(rank, idx)` without its saturating arithmetic.
        let rx = self.rx_ours + (k % b) as usize * RMA_BUF;
        self.put_medium(d, rx, k, k, slots, head, payload);
        Ok(())
    }

    /// [`send_rma_medium`](Self::send_rma_medium) with a pool: into a buffer of `d`'s pool
    /// claimed first; with none free, or this sender's share of the pool in flight, the
    /// Medium goes over VELO instead.
    #[inline(never)]
    fn send_pool_medium(
        &mut self,
        d: usize,
        head: &[u8],
        payload: Payload<'_>,
    ) -> Result<(), SendError> {
        if self.rma_in_flight(d)? >= self.layout.rma_flight() as u64 {
            return self.send_velo(d, head, payload, 0);
        }
        let k = self.dests[d].rma_sent;
        let Some(i) = self.claim_pool(d, k)? else {
            return self.send_velo(d, head, payload, 0);
        };
        let slots = match self.reserve(d) {
            Ok(slots) => slots,
            Err(e) => {
                self.unclaim_pool(d, i, k);
                return Err(e);
            }
        };
        // `i < rma_pool`: `pool(i)` without its saturating arithmetic.
        let rx = self.pool_at + i * RMA_BUF;
        self.put_medium(
            d,
            rx,
            k,
            k | (i as u64) << POOL_INDEX_SHIFT,
            slots,
            head,
            payload,
        );
        Ok(())
    }

    /// The put of `d`'s `k`-th RMA Medium into the buffer at `rx` (message at the end, the
    /// tail last) and its completer notification with `value`, by the engine as the doorbell
    /// is rung.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn put_medium(
        &mut self,
        d: usize,
        rx: usize,
        k: u64,
        value: u64,
        slots: Reserved,
        head: &[u8],
        payload: Payload<'_>,
    ) {
        let total = head.len() + payload.len();
        let start = RMA_BUF - TAIL - align8(total);
        let tail = marker(k, &self.layout)
            | (total as u64) << 16
            | (self.dests[d].velo_sent & 0xffff) << 32
            | (self.rma_consumed[d] & 0xffff) << 48;
        let private_parts: [&[u8]; 2];
        let data = match payload {
            Payload::Private(p) => {
                private_parts = [head, p];
                Data::Padded(rx + start, &private_parts, None)
            }
            // An echo: straight from where it was received into the peer's buffer.
            Payload::Shared(s) => Data::Padded(rx + start, std::slice::from_ref(&head), Some(s)),
        };
        rma::put_immediate(
            &self.peers[d],
            &self.dests[d].notes,
            self.rank,
            data,
            Some((rx + RMA_BUF - TAIL, tail)),
            slots,
            Note {
                kind: kind::MEDIUM_LANDED,
                value,
            },
        );
        self.dests[d].rma_sent += 1;
        // The tail carried our acknowledgement of d's buffers.
        self.rma_ack_sent[d] = self.rma_consumed[d];
    }

    /// AM Long: the payload put by the engine straight into `d`'s segment as the doorbell is
    /// rung, then the header over VELO (flagged "wait for the completer notification").
    fn send_long(&mut self, d: usize, msg: &Outgoing<'_>, off: usize) -> Result<(), SendError> {
        if msg.payload.len() > self.config.max_long {
            return Err(SendError::TooLarge(msg.payload.len()));
        }
        if msg.head.len() > MAX_MSG {
            return Err(SendError::TooLarge(msg.head.len()));
        }
        let fits = off
            .checked_add(msg.payload.len())
            .is_some_and(|end| end <= self.layout.segment);
        if msg.payload.is_empty() || !fits {
            // Nothing to move (or out of the target's segment, which the target rejects).
            return self.send_velo(d, msg.head, Payload::EMPTY, PLACED);
        }
        let slots = self.reserve(d)?;
        // The header's slots before the put: once the payload is sent, the header must follow.
        let n = velo::packets(msg.head.len(), self.cap());
        let mut t = self.take_tickets(n);
        if let Err(e) = self.claim(d, &mut t) {
            self.tickets = t;
            slots.cancel(&self.dests[d].notes);
            return Err(e);
        }
        rma::put_immediate(
            &self.peers[d],
            &self.dests[d].notes,
            self.rank,
            Data::Exact(self.layout.segment_base() + off, msg.payload),
            None,
            slots,
            Note {
                kind: kind::LONG_LANDED,
                value: msg.payload.len() as u64,
            },
        );
        let r = self.emit(d, n, |i| t[i], msg.head, Payload::EMPTY, PLACED | RMA_WAIT);
        self.tickets = t;
        r
    }

    #[inline]
    fn send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let d = dest as usize;
        match self.dests.get(d) {
            None => return Err(SendError::InvalidRank(dest)),
            Some(dst) if dst.lost => return Err(SendError::PeerLost(dest)),
            Some(_) => {}
        }
        // One packet over VELO (every Short, small Mediums): the common case first.
        let velo = msg.payload.is_empty() || !self.medium.get().by_rma(msg.payload.len());
        if msg.long_offset.is_none() && msg.len() <= self.cap && velo {
            return self.send_packet(d, msg.head, msg.payload, 0);
        }
        self.send_other(d, msg)
    }

    /// Everything but a one-packet VELO message: a Long, a Medium by RMA buffer or in
    /// several packets, or one too large.
    #[inline(never)]
    fn send_other(&mut self, d: usize, msg: &Outgoing<'_>) -> Result<(), SendError> {
        if let Some(off) = msg.long_offset {
            return self.send_long(d, msg, off);
        }
        if msg.len() > MAX_MSG {
            return Err(SendError::TooLarge(msg.len()));
        }
        if !msg.payload.is_empty() && self.medium.get().by_rma(msg.payload.len()) {
            self.send_rma_medium(d, msg.head, msg.payload)
        } else {
            self.send_velo(d, msg.head, msg.payload, 0)
        }
    }
}

impl Tx for TxState {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.send(dest, msg)
    }
}

impl Tx for Extoll {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.tx.send(dest, msg)
    }
}

impl Extoll {
    fn new(
        job: String,
        rank: usize,
        layout: Layout,
        config: ExtollConfig,
        seg: Segment,
        peers: Arc<Vec<PeerMap>>,
        pids: Vec<Option<nix::unistd::Pid>>,
    ) -> Result<Extoll, ExtollError> {
        let n = layout.ranks;
        let own = seg.import();
        let now = Instant::now();
        let mailbox = layout.mailbox();
        let notes = layout.notifications();
        let dests = peers
            .iter()
            .map(|p| {
                let record = layout.claims(rank, CLAIM_MAILBOX);
                let note_record = layout.claims(rank, CLAIM_NOTES);
                Ok(Dest {
                    port: mailbox.port(&p.seg, mailbox_claimer(rank), record)?,
                    notes: notes.port(&p.seg, notes_claimer(rank, false), note_record)?,
                    velo_sent: 0,
                    rma_sent: 0,
                    lost: false,
                })
            })
            .collect::<Result<Vec<_>, ShmError>>()?;
        Ok(Extoll {
            inbox: mailbox.inbox(&seg)?,
            notes: layout.notifications().inbox(&seg)?,
            head_batch: layout.mailbox_slots as u64 / 4,
            rx_from: (0..n).map(|s| layout.rx(s, 0)).collect(),
            seg,
            own,
            tx: TxState {
                rank,
                layout,
                config,
                medium: Cell::new(config.medium),
                peers,
                dests,
                cap: config.packet_size - STATUS_LEN,
                rx_ours: layout.rx(rank, 0),
                pool_at: layout.pool(0),
                pool_hint: vec![0; if layout.rma_pool > 0 { n } else { 0 }],
                pids: pids.clone(),
                mailbox_head: vec![0; n],
                last_sent_to: NOT_STREAMING,
                rma_acked: vec![0; n],
                rma_consumed: vec![0; n],
                rma_ack_sent: vec![0; n],
                note_heads: vec![0; n],
                engine: None,
                engine_patience: NOTIFY_PATIENCE,
                jobs: 0,
                jobs_done: 0,
                next_op: 0,
                faults: VecDeque::new(),
                tickets: Vec::with_capacity(MAX_PACKETS),
            },
            head: 0,
            note_head: 0,
            head_told: 0,
            note_told: 0,
            reasm: Reassembler::new(n, config.packet_size - STATUS_LEN, MAX_MSG),
            velo_delivered: vec![0; n],
            rma_delivered: vec![0; n],
            rma_landed: vec![0; n],
            rma_pending: 0,
            pool_bufs: vec![VecDeque::new(); if layout.rma_pool > 0 { n } else { 0 }],
            long_landed: vec![0; n],
            long_used: vec![0; n],
            put_landed: vec![0; n],
            user_pending: HashSet::new(),
            user_done: HashSet::new(),
            user_failed: HashMap::new(),
            rr: 0,
            rma_stall: false,
            polls: 0,
            liveness: am_nic::Liveness::new(pids),
            watch: Watch {
                mailbox: 0,
                mailbox_since: now,
                notes: 0,
                notes_since: now,
                last_check: None,
            },
            wake: Wake::new("extoll", &job, rank as Rank),
        })
    }

    fn layout_for(
        ranks: u32,
        segment_size: usize,
        c: &ExtollConfig,
    ) -> Result<Layout, ExtollError> {
        if ranks == 0 || ranks > 1 << 16 {
            return Err(ExtollError::Config("a job has 1..=65536 ranks".into()));
        }
        Layout::new(ranks as usize, c, segment_size).ok_or_else(|| {
            ExtollError::Config(format!(
                "{ranks} ranks with a segment of {segment_size} bytes overflow a segment's size"
            ))
        })
    }

    /// The transports of an in-process job of `ranks` ranks (one per thread), over heap
    /// memory that the threads share exactly as processes share a mapping (the same atomics,
    /// the same views), so Miri checks this code too.
    pub fn cluster(
        ranks: u32,
        segment_size: usize,
        config: ExtollConfig,
    ) -> Result<Vec<Extoll>, ExtollError> {
        config.validate()?;
        let layout = Self::layout_for(ranks, segment_size, &config)?;
        let segs = (0..ranks)
            .map(|_| Segment::heap(layout.words_len(), layout.bytes_len()))
            .collect::<Result<Vec<_>, _>>()?;
        // What a peer's NIC maps: full access for claims and gets, a writer for the rest.
        let job = am_nic::wake::in_process_job("extoll");
        let wakers = Arc::new(Wakers::new(&job, ranks));
        let peers: Arc<Vec<PeerMap>> = Arc::new(
            segs.iter()
                .enumerate()
                .map(|(r, s)| PeerMap {
                    seg: s.share(),
                    imp: s.import(),
                    rank: r as Rank,
                    wakers: wakers.clone(),
                })
                .collect(),
        );
        segs.into_iter()
            .enumerate()
            .map(|(r, seg)| {
                Extoll::new(
                    job.clone(),
                    r,
                    layout,
                    config,
                    seg,
                    peers.clone(),
                    vec![None; ranks as usize],
                )
            })
            .collect()
    }

    /// Starts this rank's NIC in a multi-process job: creates its segment (anonymous: no file
    /// is ever left behind), exchanges pids, geometry and segment handles through the
    /// launcher's key-value store, and maps every peer's segment (`am_nic::connect`).
    pub fn connect(
        job: &mut am_bootstrap::JobInfo,
        segment_size: usize,
        config: ExtollConfig,
    ) -> Result<Extoll, ExtollError> {
        config.validate()?;
        let layout = Self::layout_for(job.size, segment_size, &config)?;
        let geometry = format!(
            "{},{},{},{},{},{},{}",
            config.packet_size,
            config.mailbox_slots,
            config.notify_slots,
            layout.rma_buffers,
            config.rma_pool,
            config.max_long,
            segment_size
        );
        let joined = am_nic::connect(
            job,
            "extoll",
            layout.words_len(),
            layout.bytes_len(),
            segment_size,
            &geometry,
            |_| Ok(()),
        )?;
        // A peer's NIC maps it with full access (claims, gets) and writes through a writer.
        let wakers = Arc::new(Wakers::new(&job.job_id, job.size));
        let peers = joined
            .peers
            .into_iter()
            .enumerate()
            .map(|(r, seg)| PeerMap {
                imp: seg.import(),
                seg,
                rank: r as Rank,
                wakers: wakers.clone(),
            })
            .collect();
        Extoll::new(
            job.job_id.clone(),
            job.rank as usize,
            layout,
            config,
            joined.own,
            Arc::new(peers),
            joined.pids,
        )
    }

    /// The configuration in use.
    pub fn config(&self) -> &ExtollConfig {
        &self.tx.config
    }

    /// Switches the path of the Mediums this rank sends from now on (the receiver takes
    /// both; order per source holds across a switch).
    pub fn set_medium(&self, path: MediumPath) {
        self.tx.medium.set(path);
    }

    /// The segment geometry in use.
    pub fn layout(&self) -> &Layout {
        &self.tx.layout
    }

    fn check_region(&self, offset: usize, len: usize) -> Result<usize, RmaError> {
        let region = self.tx.layout.segment;
        if offset.checked_add(len).is_none_or(|end| end > region) {
            return Err(RmaError::OutOfBounds {
                offset,
                len,
                region,
            });
        }
        Ok(self.tx.layout.segment_base() + offset)
    }

    fn user_op(&mut self, dest: Rank, job: impl FnOnce(u64) -> Job) -> Result<RmaOp, RmaError> {
        let d = dest as usize;
        let departed =
            d != self.tx.rank && self.seg.load_word(self.tx.layout.departed(d)).unwrap_or(0) != 0;
        if d >= self.tx.peers.len() || self.tx.dests[d].lost || departed {
            return Err(RmaError::BadRank(dest));
        }
        let id = self.tx.next_op;
        self.tx.next_op += 1;
        self.tx.submit(job(id)).map_err(RmaError::Engine)?;
        self.user_pending.insert(id);
        Ok(RmaOp { id, peer: dest })
    }

    /// RMA put by the engine: `len` bytes of our AM segment at `src_offset` into `dest`'s AM
    /// segment at `dst_offset`. Complete (and the source reusable) once [`rma_test`](Self::rma_test)
    /// says so; the completer gets a notification ([`puts_landed`](Self::puts_landed)).
    pub fn rma_put(
        &mut self,
        dest: Rank,
        dst_offset: usize,
        src_offset: usize,
        len: usize,
    ) -> Result<RmaOp, RmaError> {
        let dst = self.check_region(dst_offset, len)?;
        let src = self.check_region(src_offset, len)?;
        self.user_op(dest, |op| Job::Put {
            dest: dest as usize,
            src,
            dst,
            len,
            op,
        })
    }

    /// RMA get by the engine: `len` bytes of `from`'s AM segment at `src_offset` into ours at
    /// `dst_offset`.
    pub fn rma_get(
        &mut self,
        from: Rank,
        src_offset: usize,
        dst_offset: usize,
        len: usize,
    ) -> Result<RmaOp, RmaError> {
        let src = self.check_region(src_offset, len)?;
        let dst = self.check_region(dst_offset, len)?;
        self.user_op(from, |op| Job::Get {
            from: from as usize,
            src,
            dst,
            len,
            op,
        })
    }

    /// Polls the notification queue; true once `op`'s requester notification arrived. A put
    /// whose target was lost before it could be notified is [`TransportError::PeerLost`]; one
    /// whose target never made room for the notification is [`TransportError::Device`] (the data
    /// landed in both cases, unannounced).
    pub fn rma_test(&mut self, op: RmaOp) -> Result<bool, TransportError> {
        self.drain_notes()?;
        if self.user_done.remove(&op.id) {
            return Ok(true);
        }
        match self.user_failed.remove(&op.id) {
            None => Ok(false),
            Some(kind::USER_LOST) => Err(TransportError::PeerLost(op.peer)),
            Some(_) => Err(TransportError::device(format!(
                "rank {}'s notification queue stayed full: RMA put {} landed unannounced",
                op.peer, op.id
            ))),
        }
    }

    /// How many user RMA puts from `src` landed in our segment (completer notifications).
    pub fn puts_landed(&self, src: Rank) -> u64 {
        self.put_landed.get(src as usize).copied().unwrap_or(0)
    }

    /// Repairs the slot of `ticket` in `ring` (a claim nobody will publish, or a corrupt
    /// status) and says what it is now: the owner consumes it only once it is skipped, so
    /// its head never passes a ticket nobody published or skipped.
    fn take_over(&self, ring: &Ring, ticket: u64) -> Result<Taken, TransportError> {
        ring.repair(&self.seg, ticket).map_err(io)?;
        Ok(match ring.look(&self.seg, ticket) {
            Ok(Seen::Skipped(_)) => Taken::Skipped,
            Ok(Seen::Published(_)) => Taken::Published,
            _ => Taken::Neither,
        })
    }

    /// Whether notification claimer `who` is a rank we lost.
    fn notes_claimer_lost(&self, who: u32) -> bool {
        let (r, _) = notes_claimer_of(who);
        self.tx.dests.get(r).is_some_and(|d| d.lost)
    }

    /// Moves every notification to the counters it feeds. A corrupt one is consumed, and
    /// reported.
    fn drain_notes(&mut self) -> Result<(), TransportError> {
        let ring = self.tx.layout.notifications();
        let mut result = Ok(());
        loop {
            // Published: one load and a compare, the usual case; the value is one word.
            if let Some(meta) = self.notes.head_published() {
                let value = u64::from_le(self.notes.head_first_word());
                self.consume_note();
                if let Err(e) = self.take_note(meta, value) {
                    result = Err(e);
                    break;
                }
                continue;
            }
            if self.notes.head_is_empty() {
                break;
            }
            let t = self.note_head;
            match self.notes.look(t) {
                Ok(Seen::Published(meta)) => {
                    let mut v = [0u8; 8];
                    let read = self.notes.read_payload(t, &mut v);
                    self.consume_note();
                    let taken = read
                        .map_err(io)
                        .and_then(|()| self.take_note(meta, u64::from_le_bytes(v)));
                    if let Err(e) = taken {
                        result = Err(e);
                        break;
                    }
                }
                Ok(Seen::Skipped(_)) => self.consume_note(),
                Ok(Seen::Claimed(who)) if self.notes_claimer_lost(who) => {
                    // A dead rank's claim: nobody will publish it.
                    match self.take_over(&ring, t)? {
                        Taken::Skipped => self.consume_note(),
                        Taken::Published => {}
                        Taken::Neither => break,
                    }
                }
                Ok(Seen::Claimed(_) | Seen::Empty) => break,
                Err(e) => {
                    // A status no claimer writes: skipped, so the next lap finds it free.
                    if self.take_over(&ring, t)? == Taken::Skipped {
                        self.consume_note();
                    }
                    result = Err(misbehaved(None, format!("notification ticket {t}: {e}")));
                    break;
                }
            }
        }
        if self.note_told != self.note_head {
            self.note_told = self.note_head;
            self.notes.consumed(self.note_head);
        }
        result
    }

    /// One notification (already consumed): `meta` and `value` as read, checked here.
    fn take_note(&mut self, meta: u32, value: u64) -> Result<(), TransportError> {
        let l = self.tx.layout;
        let src = (meta & 0xffff) as usize;
        let k = meta >> 16;
        if src >= l.ranks {
            return Err(misbehaved(None, format!("a notification from rank {src}")));
        }
        match k {
            kind::LONG_LANDED if value <= self.tx.config.max_long as u64 => {
                self.long_landed[src] += 1
            }
            kind::MEDIUM_LANDED if self.medium_landed(src, value) => {}
            kind::PUT_LANDED if value <= l.segment as u64 => self.put_landed[src] += 1,
            kind::LONG_LANDED | kind::MEDIUM_LANDED | kind::PUT_LANDED => {
                return Err(misbehaved(
                    Some(src),
                    format!(
                        "notification {k} with value {value} (RMA Mediums landed {}, delivered {})",
                        self.rma_landed[src], self.rma_delivered[src]
                    ),
                ))
            }
            k if src != self.tx.rank => {
                return Err(misbehaved(
                    Some(src),
                    format!("requester notification {k} from rank {src}"),
                ))
            }
            kind::USER_DONE | kind::USER_LOST | kind::USER_UNNOTIFIED => {
                if !self.user_pending.remove(&value) {
                    // Written in our name: by whom, the word cannot say.
                    return Err(misbehaved(
                        None,
                        format!("completion of RMA operation {value}, which is not in flight"),
                    ));
                }
                self.tx.jobs_done += 1;
                if k == kind::USER_DONE {
                    self.user_done.insert(value);
                } else {
                    self.user_failed.insert(value, k);
                }
            }
            k => {
                return Err(misbehaved(
                    Some(src),
                    format!("unknown notification {k:#x} (value {value})"),
                ))
            }
        }
        Ok(())
    }

    /// An RMA Medium's completer notification from `src` with `value`: counted (true) if it
    /// is the next one `src` may have in flight, and with a pool, if it names a buffer of
    /// the pool that `src` holds for it.
    #[inline(always)]
    fn medium_landed(&mut self, src: usize, value: u64) -> bool {
        let l = &self.tx.layout;
        let landed = self.rma_landed[src];
        let room = landed - self.rma_delivered[src] < l.rma_flight() as u64;
        if l.rma_pool == 0 {
            if value != landed || !room {
                return false;
            }
        } else {
            let k = value & ((1 << POOL_INDEX_SHIFT) - 1);
            let i = (value >> POOL_INDEX_SHIFT) as usize;
            if k != landed || !room || i >= l.rma_pool {
                return false;
            }
            if self.seg.load_word(l.pool_claim(i)).ok() != Some(pool_claim(src, k)) {
                return false;
            }
            self.pool_bufs[src].push_back(i as u32);
        }
        self.rma_landed[src] += 1;
        self.rma_pending += 1;
        true
    }

    /// Where the buffer of the next RMA Medium from `s` starts (one that landed).
    #[inline]
    fn rma_buf(&self, s: usize) -> usize {
        let l = &self.tx.layout;
        if l.rma_pool > 0 {
            let i = self.pool_bufs[s].front().copied().unwrap_or(0) as usize;
            // `i < rma_pool` (checked as it landed): `pool(i)` without its saturating
            // arithmetic.
            self.tx.pool_at + i * RMA_BUF
        } else {
            let idx = (self.rma_delivered[s] % l.rma_buffers as u64) as usize;
            self.rx_from[s] + idx * RMA_BUF
        }
    }

    /// With a pool: frees the buffer of `s`'s RMA Medium just delivered or dropped (counted in
    /// `rma_delivered` already; a claim word someone rewrote meanwhile is left to the idle
    /// sweep). Part of [`rma_consumed`](Self::rma_consumed).
    #[inline(always)]
    fn release_pool(&mut self, s: usize) {
        if self.tx.layout.rma_pool > 0 {
            self.release_pool_buf(s);
        }
    }

    #[inline(never)]
    fn release_pool_buf(&mut self, s: usize) {
        let k = self.rma_delivered[s] - 1;
        if let Some(i) = self.pool_bufs[s].pop_front() {
            if let Ok(w) = self.seg.word(self.tx.layout.pool_claim(i as usize)) {
                // Release: our reads of the buffer are before the next claimer's writes.
                let _ =
                    w.compare_exchange(pool_claim(s, k), 0, Ordering::Release, Ordering::Relaxed);
            }
        }
    }

    /// With a pool, at the stalled-queue checks: frees what no Medium will free. A lost
    /// rank's claim not notified, once the notification queue was drained to empty
    /// (`notes_clear`: a notification it published before dying is then counted); a claim no
    /// sender writes, or one naming a Medium of its sender's outside the window that sender
    /// may have in flight (delivered already, or [`Layout::rma_flight`] or more past the
    /// delivered ones), reported. A claim inside a live sender's window is left: it may be in
    /// flight.
    fn sweep_pool(&mut self, notes_clear: bool) {
        let l = self.tx.layout;
        for i in 0..l.rma_pool {
            let Ok(w) = self.seg.word(l.pool_claim(i)) else {
                return;
            };
            let v = w.load(Ordering::Acquire);
            if v == 0 {
                continue;
            }
            let s = ((v >> 32) & 0x7fff_ffff) as usize;
            let known = v >> 63 == 1 && s < l.ranks;
            if known && self.pool_bufs[s].contains(&(i as u32)) {
                continue;
            }
            let lost = known && self.tx.dests[s].lost;
            if lost && !notes_clear {
                continue;
            }
            // An honest sender claims for its `k`-th Medium only while fewer than the window
            // are unacknowledged, and acknowledged ones were delivered: `k - delivered` (mod
            // 2^32) is below the window.
            let window = known
                && (v as u32).wrapping_sub(self.rma_delivered[s] as u32) < l.rma_flight() as u32;
            if !lost && window {
                continue;
            }
            let freed = w
                .compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
            if freed && !lost {
                self.tx.fault(misbehaved(
                    None,
                    format!(
                        "RMA Medium pool buffer {i} held by a claim no Medium will free ({v:#x})"
                    ),
                ));
            }
        }
    }

    /// Tells senders how far the mailbox was consumed: in batches of a quarter mailbox while
    /// busy, and whenever idle (so a sender waiting for room always gets it).
    #[inline(always)]
    fn tell_head(&mut self, idle: bool) {
        let due = self.head - self.head_told;
        if due > 0 && (idle || due >= self.head_batch) {
            self.head_told = self.head;
            self.inbox.consumed(self.head);
        }
    }

    /// Consumes the mailbox ticket at the head (published, or skipped).
    #[inline(always)]
    fn consume(&mut self) {
        self.head += 1;
        self.inbox.advance();
        debug_assert_eq!(self.head, self.inbox.head());
        self.tell_head(false)
    }

    /// Consumes the notification ticket at the head.
    #[inline(always)]
    fn consume_note(&mut self) {
        self.note_head += 1;
        self.notes.advance();
        debug_assert_eq!(self.note_head, self.notes.head());
    }

    /// Drops the message the packet at the mailbox head belongs to, and consumes the packet.
    /// A message from a source of the job counts as delivered for that source's order: what
    /// it sends next does not wait for it.
    fn refuse(&mut self, m: &Meta) {
        let s = m.src as usize;
        if s < self.tx.layout.ranks {
            self.reasm.refuse(m);
            if m.flags & FIRST != 0 {
                self.velo_delivered[s] += 1;
            }
        }
        self.consume()
    }

    /// Whether the first packet `m` of a message from `s` may be delivered now.
    #[inline]
    fn order(&self, s: usize, m: &Meta) -> Order {
        // Those RMA Mediums sent before it that are not delivered yet: at most as many as
        // `s` may have in flight (the buffers), whatever the delays.
        let ahead = (m.rma_before as u64).wrapping_sub(self.rma_delivered[s]) % RMA_BEFORE_MOD;
        if ahead > self.tx.layout.rma_flight() as u64 {
            return Order::RmaAhead(ahead);
        }
        let long = m.flags & RMA_WAIT != 0;
        if long && m.flags & PLACED == 0 {
            return Order::WaitUnplaced;
        }
        if ahead != 0 {
            return Order::WaitRma;
        }
        if long && self.long_landed[s] <= self.long_used[s] {
            return Order::WaitLong;
        }
        Order::Ready
    }

    /// The next RMA Medium from `s` as its tail says (one load; checked in the copy).
    #[inline]
    fn rma_state(&self, s: usize) -> Result<RmaState, TransportError> {
        let k = self.rma_delivered[s];
        if self.rma_landed[s] <= k {
            return Ok(RmaState::None);
        }
        let l = &self.tx.layout;
        let tail = self
            .seg
            .load_slot_word(self.rma_buf(s) + RMA_BUF - TAIL)
            .map_err(io)?;
        if tail & 0xffff != marker(k, l) {
            return Ok(RmaState::BadMarker(tail & 0xffff));
        }
        let len = ((tail >> 16) & 0xffff) as usize;
        if len > MAX_MSG {
            return Ok(RmaState::BadLength(len));
        }
        if (tail >> 32) & 0xffff != self.velo_delivered[s] & 0xffff {
            return Ok(RmaState::WaitsVelo);
        }
        Ok(RmaState::Ready(tail))
    }

    /// The tail of the next RMA Medium from `s`, if it landed and every VELO message sent
    /// before it was delivered. A corrupt tail is dropped and reported.
    #[inline]
    fn rma_next(&mut self, s: usize) -> Result<Option<u64>, TransportError> {
        match self.rma_state(s)? {
            RmaState::Ready(tail) => Ok(Some(tail)),
            RmaState::None | RmaState::WaitsVelo => Ok(None),
            RmaState::BadMarker(m) if self.tx.layout.rma_pool > 0 => {
                // Its sender holds the buffer for it, and the Medium is not there: dropped.
                let k = self.rma_delivered[s];
                self.drop_rma(s);
                Err(misbehaved(
                    Some(s),
                    format!("RMA Medium {k} notified but its tail marker is {m:#x}"),
                ))
            }
            RmaState::BadMarker(m) => {
                // No Medium behind the notification: drop the notification.
                self.rma_landed[s] -= 1;
                self.rma_pending -= 1;
                Err(misbehaved(
                    Some(s),
                    format!(
                        "RMA Medium {} notified but its tail marker is {m:#x}",
                        self.rma_delivered[s]
                    ),
                ))
            }
            RmaState::BadLength(len) => {
                let k = self.rma_delivered[s];
                self.drop_rma(s);
                Err(misbehaved(
                    Some(s),
                    format!("RMA Medium {k} of {len} bytes"),
                ))
            }
        }
    }

    /// Drops the next RMA Medium from `s` undelivered, freeing its buffer.
    fn drop_rma(&mut self, s: usize) {
        self.rma_delivered[s] += 1;
        self.rma_pending -= 1;
        self.rma_consumed(s);
    }

    /// Frees the buffer of `s`'s RMA Medium just delivered or dropped (counted in
    /// `rma_delivered` already): a pool buffer at once, one per connection by acknowledging
    /// it, lazily.
    fn rma_consumed(&mut self, s: usize) {
        self.release_pool(s);
        let tx = &mut self.tx;
        tx.rma_consumed[s] += 1;
        if tx.rma_consumed[s] - tx.rma_ack_sent[s] >= (tx.layout.rma_flight() as u64).div_ceil(2) {
            tx.rma_ack_sent[s] = tx.rma_consumed[s];
            let _ = tx.peers[s]
                .imp
                .store_word(tx.layout.ack(tx.rank), tx.rma_consumed[s]);
        }
    }

    /// Delivers the next RMA Medium from `s` (its tail, checked, is `tail`), lent from the
    /// receive buffer, then frees the buffer.
    fn deliver_rma<R>(
        &mut self,
        s: usize,
        tail: u64,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<R, TransportError> {
        let len = ((tail >> 16) & 0xffff) as usize;
        let at = self.rma_buf(s) + RMA_BUF - TAIL - align8(len);
        // Piggybacked ack: how many of our buffers s has consumed (mod 2^16).
        let acked = self.tx.rma_acked[s];
        let delta = (tail >> 48).wrapping_sub(acked) & 0xffff;
        if delta <= self.tx.dests[s].rma_sent - acked {
            self.tx.rma_acked[s] += delta;
        } else if delta < STALE_ACK {
            // Ahead of what we sent (an older ack is legitimate, and ignored).
            self.tx.fault(misbehaved(
                Some(s),
                format!(
                    "acknowledges {} RMA Mediums, {} were sent",
                    acked + delta,
                    self.tx.dests[s].rma_sent
                ),
            ));
        }
        self.rma_delivered[s] += 1;
        self.rma_pending -= 1;
        let bytes = match self.seg.view(at, len) {
            Ok(bytes) => bytes,
            Err(e) => {
                self.rma_consumed(s);
                return Err(io(e));
            }
        };
        let segment = am_segment(&self.seg, &self.tx.layout);
        let r = f(
            Delivery {
                src: s as Rank,
                bytes: Received::Shared(bytes),
                payload_placed: false,
                route: Route::NONE,
            },
            segment,
            &mut self.tx,
        );
        self.rma_consumed(s);
        Ok(r)
    }

    /// Counts a poll; every [`IDLE_POLLS_PER_TICK`]th looks at the clock.
    #[inline]
    fn count_poll(&mut self) {
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(IDLE_POLLS_PER_TICK) {
            self.tick(Instant::now());
        }
    }

    /// Runs the stalled-queue checks ([`check`](Self::check)) if a queue's head has not moved
    /// for [`LIVENESS_AFTER`], at most once per [`LIVENESS_AFTER`].
    fn tick(&mut self, now: Instant) {
        let w = &mut self.watch;
        if w.mailbox != self.head {
            w.mailbox = self.head;
            w.mailbox_since = now;
        }
        if w.notes != self.note_head {
            w.notes = self.note_head;
            w.notes_since = now;
        }
        let stalled = |since: Instant| now.duration_since(since) >= LIVENESS_AFTER;
        let mailbox = stalled(w.mailbox_since);
        let due = w
            .last_check
            .is_none_or(|c| now.duration_since(c) >= LIVENESS_AFTER);
        if (mailbox || stalled(w.notes_since)) && due {
            w.last_check = Some(now);
            self.check(mailbox);
        }
    }

    /// The checks of a stalled queue: our head words, and every wait at the queues' heads
    /// that can no longer end; with the mailbox stalled (`peers`), the abort word and the
    /// peers' liveness too (a look at each peer's process: not while VELO traffic flows).
    /// What they find becomes errors for the next polls.
    fn check(&mut self, peers: bool) {
        if peers {
            self.check_peers();
        }
        self.check_heads();
        let notes_clear = self.unblock_notes();
        self.unblock_mailbox();
        self.sweep_pool(notes_clear);
        self.tell_head(true);
    }

    /// Declares rank `r` lost: its partial message is dropped, its claims are skipped as the
    /// heads reach them, and the next poll reports it (once).
    fn declare_lost(&mut self, r: usize) {
        if !self.tx.dests[r].lost {
            self.tx.dests[r].lost = true;
            self.reasm.abandon(r as u32);
            self.tx.fault(TransportError::PeerLost(r as Rank));
        }
    }

    /// The abort word, and every peer that has not departed: still alive? (`am_nic`'s check;
    /// what it finds becomes errors for the next polls.)
    fn check_peers(&mut self) {
        match self
            .liveness
            .check_now(&self.seg, self.tx.layout.departed_words())
        {
            Err(e) => self.tx.fault(e),
            Ok(found) => {
                for e in found {
                    match e {
                        TransportError::PeerLost(r) => self.declare_lost(r as usize),
                        other => self.tx.fault(other),
                    }
                }
            }
        }
    }

    /// Our head words say what we told: a peer that rewrote one would keep senders from
    /// room (or send them laps ahead). Put back, reported.
    fn check_heads(&mut self) {
        let l = self.tx.layout;
        for (ring, told, what) in [
            (l.mailbox(), self.head_told, "VELO mailbox"),
            (l.notifications(), self.note_told, "notification queue"),
        ] {
            let word = self.seg.load_word(ring.head()).unwrap_or(told);
            if word != told {
                let _ = ring.consumed(&self.own, told);
                self.tx.fault(misbehaved(
                    None,
                    format!("{what} head word {word}, {told} was consumed"),
                ));
            }
        }
    }

    /// Ends the waits at the notification queue's head that cannot end: a claim by a lost
    /// rank, or by one whose record does not vouch for it, and holes. True if the queue is
    /// then empty (every notification published so far has been taken).
    fn unblock_notes(&mut self) -> bool {
        let l = self.tx.layout;
        let ring = l.notifications();
        for _ in 0..=l.notify_slots {
            if let Err(e) = self.drain_notes() {
                self.tx.fault(e);
                continue;
            }
            let t = self.note_head;
            match ring.look(&self.seg, t) {
                Ok(Seen::Claimed(who)) => {
                    let (r, q) = notes_claimer_of(who);
                    let known = r < l.ranks;
                    if known
                        && !self.tx.dests[r].lost
                        && ring.claim_is_genuine(&self.seg, t, l.claims(r, q))
                    {
                        // A live claimer at work.
                        return false;
                    }
                    if self.take_over(&ring, t).ok() != Some(Taken::Skipped) {
                        return false;
                    }
                    if !(known && self.tx.dests[r].lost) {
                        self.tx.fault(misbehaved(
                            None,
                            format!(
                                "notification ticket {t} claimed in the name of claimer {who}, \
                                 who does not vouch for it"
                            ),
                        ));
                    }
                }
                Ok(Seen::Empty) => match ring.fill_holes(&self.seg, t) {
                    Ok(n) if n > 0 => self.tx.fault(misbehaved(
                        None,
                        format!("{n} holes from notification ticket {t} (a corrupt tail or head)"),
                    )),
                    _ => return true,
                },
                // Published, skipped or corrupt: the next drain takes it.
                _ => {}
            }
        }
        false
    }

    /// Ends the waits at the mailbox's head that cannot end: a claim by a lost rank, or by
    /// one whose record does not vouch for it; a hole; a message waiting for an RMA Medium
    /// or a Long payload that was never sent; and RMA Mediums waiting for VELO messages that
    /// are not in the empty mailbox.
    fn unblock_mailbox(&mut self) {
        let l = self.tx.layout;
        let ring = l.mailbox();
        for _ in 0..=l.mailbox_slots {
            let t = self.head;
            match ring.look(&self.seg, t) {
                Ok(Seen::Claimed(who)) => {
                    let r = who as usize;
                    let known = r < l.ranks;
                    if known
                        && !self.tx.dests[r].lost
                        && ring.claim_is_genuine(&self.seg, t, l.claims(r, CLAIM_MAILBOX))
                    {
                        return;
                    }
                    let lost = known && self.tx.dests[r].lost;
                    if lost {
                        self.reasm.abandon(who);
                    }
                    match self.take_over(&ring, t) {
                        Ok(Taken::Skipped) => {
                            if !lost {
                                self.tx.fault(misbehaved(
                                    None,
                                    format!(
                                        "VELO mailbox ticket {t} claimed in the name of rank \
                                         {who}, who does not vouch for it"
                                    ),
                                ));
                            }
                            self.consume()
                        }
                        Ok(Taken::Published) => {}
                        _ => return,
                    }
                }
                Ok(Seen::Empty) => match ring.fill_holes(&self.seg, t) {
                    Ok(n) if n > 0 => {
                        let what = format!(
                            "{n} holes from VELO mailbox ticket {t} (a corrupt tail or head)"
                        );
                        self.tx.fault(misbehaved(None, what));
                    }
                    // No claim above the head: the mailbox is empty, unless a claimer
                    // took the head meanwhile (a message may then sit above it).
                    _ => {
                        if matches!(ring.look(&self.seg, t), Ok(Seen::Empty)) {
                            self.drop_stranded_rma();
                        }
                        return;
                    }
                },
                Ok(Seen::Skipped(_)) => self.consume(),
                Ok(Seen::Published(meta)) => {
                    let m = Meta::decode(meta);
                    let s = m.src as usize;
                    if self.reasm.check(&m).is_err()
                        || m.flags & FIRST == 0
                        || self.reasm.in_progress(m.src)
                    {
                        // The poll path takes it.
                        return;
                    }
                    if !matches!(self.order(s, &m), Order::WaitRma | Order::WaitLong) {
                        // The poll path takes it.
                        return;
                    }
                    // The completer notification it waits for was published before this
                    // packet, which we have seen: drained now (not before the look at the
                    // packet), a queue with nothing left in it has counted it, or it was
                    // never sent.
                    let clear = self.unblock_notes();
                    let never = match self.order(s, &m) {
                        // The Medium it waits for waits for VELO messages itself (a Medium
                        // sent before it waits for none sent after it), or was never notified.
                        Order::WaitRma => {
                            matches!(self.rma_state(s), Ok(RmaState::WaitsVelo))
                                || (clear && self.rma_landed[s] == self.rma_delivered[s])
                        }
                        Order::WaitLong => clear,
                        _ => return,
                    };
                    if !never {
                        return;
                    }
                    self.tx.fault(misbehaved(
                        Some(s),
                        format!(
                            "VELO message at ticket {t} waits for an RMA landing that was never \
                             notified (RMA Mediums before it: {} mod 32; delivered {}, landed {})",
                            m.rma_before, self.rma_delivered[s], self.rma_landed[s]
                        ),
                    ));
                    self.refuse(&m)
                }
                // A corrupt status: the poll path repairs it.
                Err(_) => return,
            }
        }
    }

    /// With the mailbox empty: an RMA Medium that waits for VELO messages sent before it
    /// waits for nothing (they were published before its notification, so they would be
    /// there). Dropped, reported.
    fn drop_stranded_rma(&mut self) {
        if self.rma_pending == 0 {
            return;
        }
        for s in 0..self.tx.layout.ranks {
            if let Ok(RmaState::WaitsVelo) = self.rma_state(s) {
                let k = self.rma_delivered[s];
                self.drop_rma(s);
                self.tx.fault(misbehaved(
                    Some(s),
                    format!(
                        "RMA Medium {k} waits for VELO messages that were never sent ({} \
                         delivered)",
                        self.velo_delivered[s]
                    ),
                ));
            }
        }
    }

    /// Whether a poll could make progress now (used before sleeping).
    /// Before a sleep: tells the head, takes the doorbell (senders ring again from then on),
    /// looks once more and checks liveness; whether there is still nothing to do.
    fn nothing_to_do(&mut self) -> Result<bool, TransportError> {
        if self.has_work()? {
            return Ok(false);
        }
        self.tell_head(true);
        let bell = self.seg.doorbell(DOORBELL).map_err(io)?;
        bell.take_tags();
        if self.has_work()? {
            return Ok(false);
        }
        self.tick(Instant::now());
        if let Some(e) = self.tx.faults.pop_front() {
            return Err(e);
        }
        Ok(!self.has_work()?)
    }

    fn has_work(&self) -> Result<bool, TransportError> {
        if !self.tx.faults.is_empty() {
            return Ok(true);
        }
        let l = &self.tx.layout;
        match l.notifications().look(&self.seg, self.note_head) {
            Ok(Seen::Empty) => {}
            Ok(Seen::Claimed(who)) if !self.notes_claimer_lost(who) => {}
            _ => return Ok(true),
        }
        match l.mailbox().look(&self.seg, self.head) {
            Ok(Seen::Empty) => {}
            Ok(Seen::Claimed(who)) => {
                if self.tx.dests.get(who as usize).is_some_and(|d| d.lost) {
                    return Ok(true);
                }
            }
            Ok(Seen::Published(meta)) => {
                let m = Meta::decode(meta);
                if self.reasm.check(&m).is_err()
                    || m.flags & FIRST == 0
                    || self.reasm.in_progress(m.src)
                {
                    return Ok(true);
                }
                match self.order(m.src as usize, &m) {
                    Order::WaitRma => {
                        if !matches!(
                            self.rma_state(m.src as usize)?,
                            RmaState::None | RmaState::WaitsVelo
                        ) {
                            return Ok(true);
                        }
                    }
                    Order::WaitLong => {}
                    _ => return Ok(true),
                }
            }
            _ => return Ok(true),
        }
        if self.rma_pending > 0 {
            for s in 0..l.ranks {
                if !matches!(self.rma_state(s)?, RmaState::None | RmaState::WaitsVelo) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// A message from the mailbox, if one is complete and may be delivered in order.
    fn poll_mailbox<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        loop {
            // Published: one load and a compare, the usual case.
            let meta = match self.inbox.head_published() {
                Some(meta) => meta,
                None => match self.head_unpublished()? {
                    Unpublished::Published(meta) => meta,
                    Unpublished::Again => continue,
                    Unpublished::Wait => return Ok(None),
                },
            };
            let m = Meta::decode(meta);
            if let Err(e) = self.reasm.check(&m) {
                return Err(self.refuse_frame(&m, e));
            }
            let s = m.src as usize;
            if m.flags & FIRST != 0 {
                if self.reasm.in_progress(m.src) {
                    return Err(self.interleaved(&m));
                }
                match self.order(s, &m) {
                    Order::Ready => {}
                    Order::WaitRma => {
                        return match self.rma_next(s)? {
                            Some(tail) => self.deliver_rma(s, tail, f).map(Some),
                            None => {
                                self.rma_stall = true;
                                Ok(None)
                            }
                        };
                    }
                    Order::WaitLong => {
                        self.rma_stall = true;
                        return Ok(None);
                    }
                    refused => return Err(self.refuse_order(&m, refused)),
                }
                if m.flags & LAST != 0 {
                    // One packet: lent straight from the mailbox slot (its length checked
                    // against the packet's above, and again by the ring).
                    let bytes = match self.inbox.head_payload(m.len) {
                        Ok(b) => b,
                        Err(e) => return Err(self.refuse_payload(&m, e)),
                    };
                    let r = f(
                        Delivery {
                            src: s as Rank,
                            bytes: Received::Shared(bytes),
                            payload_placed: m.flags & PLACED != 0,
                            route: Route::NONE,
                        },
                        am_segment(&self.seg, &self.tx.layout),
                        &mut self.tx,
                    );
                    self.consume();
                    self.velo_delivered[s] += 1;
                    if m.flags & RMA_WAIT != 0 {
                        self.long_used[s] += 1;
                    }
                    return Ok(Some(r));
                }
            }
            // Part of a message of several packets: copied into the source's reassembly
            // buffer (out of line: the one-packet path above is every Short's, and keeps the
            // registers; so do the rare cases, in the functions below).
            let Some((flags, buf)) = self.take_part(&m)? else {
                continue;
            };
            self.velo_delivered[s] += 1;
            if flags & RMA_WAIT != 0 {
                self.long_used[s] += 1;
            }
            let r = f(
                Delivery {
                    src: s as Rank,
                    bytes: Received::Private(&buf),
                    payload_placed: flags & PLACED != 0,
                    route: Route::NONE,
                },
                am_segment(&self.seg, &self.tx.layout),
                &mut self.tx,
            );
            self.reasm.recycle(buf);
            return Ok(Some(r));
        }
    }
}

impl Extoll {
    /// The next error kept for a poll.
    #[cold]
    #[inline(never)]
    fn next_fault(&mut self) -> Option<TransportError> {
        self.tx.faults.pop_front()
    }

    /// The notification queue's head is not empty: drained, unless a live claimer is still
    /// writing it.
    #[inline(never)]
    fn notes_waiting(&mut self) -> Result<(), TransportError> {
        // Published (the usual case): no second look before the drain's.
        if self.notes.head_published().is_none() {
            if let Ok(Seen::Claimed(who)) = self.notes.look(self.note_head) {
                if !self.notes_claimer_lost(who) {
                    return Ok(());
                }
            }
        }
        self.drain_notes()
    }

    /// A poll that found nothing: the head told, and the CPU given away when that helps.
    #[inline(never)]
    fn idle(&mut self) {
        self.tell_head(true);
        if self.rma_stall || self.tx.jobs > self.tx.jobs_done {
            // Waiting on an RMA engine (ours, or the sender's): give it the core. On a
            // machine with no spare core, a spinning rank would otherwise keep the engine
            // thread off the CPU for a whole scheduler slice.
            std::thread::yield_now();
        } else if self.polls.is_multiple_of(IDLE_POLLS_PER_TICK) {
            // Even a spinning rank gives the CPU away now and then (tens of µs without a
            // message): on an oversubscribed machine the peer it waits for may need it.
            std::thread::yield_now();
        }
    }
}

/// What [`Extoll::head_unpublished`] found at the mailbox head.
enum Unpublished {
    /// Published after all (between the two looks).
    Published(u32),
    /// A slot consumed (skipped, or a dead claimer's): look at the next.
    Again,
    /// Nothing to take now.
    Wait,
}

impl Extoll {
    /// The mailbox head is not (yet) a published packet: a skipped slot is consumed, a dead
    /// sender's claim taken over, a status no claimer writes repaired and reported.
    #[inline(never)]
    fn head_unpublished(&mut self) -> Result<Unpublished, TransportError> {
        let t = self.head;
        Ok(match self.inbox.look(t) {
            Ok(Seen::Published(meta)) => Unpublished::Published(meta),
            Ok(Seen::Skipped(_)) => {
                self.consume();
                Unpublished::Again
            }
            Ok(Seen::Claimed(who)) => {
                if !self.tx.dests.get(who as usize).is_some_and(|d| d.lost) {
                    return Ok(Unpublished::Wait);
                }
                // A dead sender's claim: nobody will publish it, and its message in progress
                // will never end.
                self.reasm.abandon(who);
                match self.take_over(&self.tx.layout.mailbox(), t)? {
                    Taken::Skipped => self.consume(),
                    Taken::Published => {}
                    Taken::Neither => return Ok(Unpublished::Wait),
                }
                Unpublished::Again
            }
            Ok(Seen::Empty) => Unpublished::Wait,
            Err(e) => {
                // A status no claimer writes: skipped, so the next lap's claimer finds the
                // slot free.
                if self.take_over(&self.tx.layout.mailbox(), t)? == Taken::Skipped {
                    self.consume();
                }
                return Err(misbehaved(None, format!("VELO mailbox ticket {t}: {e}")));
            }
        })
    }

    /// A packet whose meta breaks the framing (a source outside the job, or more data bytes
    /// than a packet holds: lending them would lend the neighbouring slots): refused.
    #[cold]
    #[inline(never)]
    fn refuse_frame(&mut self, m: &Meta, e: FrameError) -> TransportError {
        let peer = ((m.src as usize) < self.tx.layout.ranks).then_some(m.src as usize);
        self.refuse(m);
        misbehaved(peer, e)
    }

    /// A first packet while its source's previous message is unfinished: that one is
    /// dropped; this packet starts the next one, on the next poll.
    #[cold]
    #[inline(never)]
    fn interleaved(&mut self, m: &Meta) -> TransportError {
        let s = m.src as usize;
        self.reasm.abandon(m.src);
        self.velo_delivered[s] += 1;
        misbehaved(Some(s), FrameError::Interleaved(m.src))
    }

    /// A first packet whose order can never be met (`refused`): refused.
    #[cold]
    #[inline(never)]
    fn refuse_order(&mut self, m: &Meta, refused: Order) -> TransportError {
        let t = self.head;
        self.refuse(m);
        let why = match refused {
            Order::RmaAhead(n) => format!(
                "says {n} RMA Mediums sent before it are undelivered, more than the {} it may \
                 have in flight",
                self.tx.layout.rma_flight()
            ),
            _ => "waits for an RMA put, but is no placed Long".to_owned(),
        };
        misbehaved(
            Some(m.src as usize),
            format!("VELO message at ticket {t} {why}"),
        )
    }

    /// A packet whose length the slot does not hold (the meta check refuses it first).
    #[cold]
    #[inline(never)]
    fn refuse_payload(&mut self, m: &Meta, e: ShmError) -> TransportError {
        self.refuse(m);
        misbehaved(Some(m.src as usize), e)
    }
}

impl Extoll {
    /// Takes the packet `m` at the mailbox head, part of a message of several packets, into
    /// its source's reassembly buffer and consumes it: the message when it is complete.
    #[inline(never)]
    fn take_part(&mut self, m: &Meta) -> Result<Option<(u32, Vec<u8>)>, TransportError> {
        let s = m.src as usize;
        let pushed = match self.inbox.head_payload(m.len) {
            Ok(_) => {
                let inbox = &self.inbox;
                self.reasm.push_append(m, m.len, |buf| {
                    // The same length as the view just made: cannot fail.
                    let _ = inbox.head_append(m.len, buf);
                })
            }
            Err(e) => {
                self.refuse(m);
                return Err(misbehaved(Some(s), e));
            }
        };
        self.consume();
        match pushed {
            Ok(done) => Ok(done),
            Err(e) => {
                if matches!(e, FrameError::TooLong { .. }) {
                    // A message that was started: it counts for the order.
                    self.velo_delivered[s] += 1;
                }
                Err(misbehaved(Some(s), e))
            }
        }
    }
}

impl Extoll {
    /// `dest`'s AM segment, as this rank's mapping of it reaches it (remote atomics).
    fn peer_segment(&self, dest: Rank) -> Result<SharedBytes<'_>, SendError> {
        let d = dest as usize;
        let Some(peer) = self.tx.peers.get(d) else {
            return Err(SendError::InvalidRank(dest));
        };
        if self.tx.dests[d].lost {
            return Err(SendError::PeerLost(dest));
        }
        let l = &self.tx.layout;
        // A rank that left wrote its departed word here: nothing it owns is to be touched.
        if d != self.tx.rank && self.seg.load_word(l.departed(d)).unwrap_or(0) != 0 {
            return Err(SendError::PeerDeparted(dest));
        }
        peer.imp
            .byte_area()
            .slice(l.segment_base(), l.segment)
            .map_err(shm)
    }
}

impl Transport for Extoll {
    fn name(&self) -> &'static str {
        "extoll"
    }

    fn rank(&self) -> Rank {
        self.tx.rank as Rank
    }

    fn size(&self) -> u32 {
        self.tx.layout.ranks as u32
    }

    fn limits(&self) -> Limits {
        Limits {
            max_args: am_core::wire::MAX_ARGS,
            max_medium: MAX_MEDIUM,
            max_long: self.tx.config.max_long,
            // The shared mailbox is bounded as a whole; back-pressure covers the rest.
            max_credits: 255,
        }
    }

    fn segment(&self) -> SharedBytes<'_> {
        am_segment(&self.seg, &self.tx.layout)
    }

    /// An immediate RMA put (the doorbell carries the source, as an AM Long's payload goes;
    /// see the `rma` module): in this model the engine's transfer is the copy into the target's
    /// registered segment made on this rank's thread, so the put is complete when this
    /// returns. No notification: the requester's would say only that, and the target was
    /// not asked to hear of it.
    fn put(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<(), SendError> {
        am_core::rma::put_into(dest, self.peer_segment(dest)?, offset, data)
    }

    /// An immediate RMA get: the copy from the target's registered segment into the caller's
    /// buffer, made on this rank's thread, complete when this returns, the target notified
    /// of nothing. (The queued engine's gets, [`Extoll::rma_get`], land in this
    /// rank's own registered segment instead and report through the notification queue.)
    fn get(&mut self, src: Rank, offset: usize, dst: &mut [u8]) -> Result<(), SendError> {
        am_core::rma::get_from(src, self.peer_segment(src)?, offset, dst)
    }

    /// The NIC's read-modify-write on the target's memory, as its RMA unit writes a put
    /// there: one atomic instruction on the target's mapped word, with no notification and
    /// no help from the target.
    fn atomic(
        &mut self,
        dest: Rank,
        offset: usize,
        atomic: am_core::atomic::Atomic,
    ) -> Result<u64, SendError> {
        atomic.apply_to(dest, self.peer_segment(dest)?, offset)
    }

    fn atomics(&mut self, batch: &[am_core::atomic::Posted]) -> am_core::atomic::Batch {
        let applied = am_core::atomic::apply_batch(batch, |d| self.peer_segment(d));
        am_core::atomic::Batch::all(batch.len(), applied)
    }

    #[inline]
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        self.count_poll();
        self.tx.last_sent_to = NOT_STREAMING;
        if !self.tx.faults.is_empty() {
            if let Some(e) = self.next_fault() {
                return Err(e);
            }
        }
        if !self.notes.head_is_empty() {
            self.notes_waiting()?;
        }
        if self.rma_pending > 0 {
            // Round robin over the sources with a landed RMA Medium.
            let ranks = self.tx.layout.ranks;
            for i in 0..ranks {
                let s = (self.rr + i) % ranks;
                if let Some(tail) = self.rma_next(s)? {
                    self.rr = s + 1;
                    return self.deliver_rma(s, tail, f).map(Some);
                }
            }
        }
        self.rma_stall = false;
        match self.poll_mailbox(f)? {
            Some(r) => Ok(Some(r)),
            None => {
                self.idle();
                Ok(None)
            }
        }
    }

    /// The credits this rank's receive memory was laid out for ([`ExtollConfig::credits`]).
    fn default_credits(&self) -> am_core::Credits {
        self.tx.config.credits
    }

    /// Puts, gets and atomics on the peers' registered segments, done by the RMA unit. A
    /// Long's payload is an immediate put the engine runs when the doorbell is rung, before
    /// `try_send` returns. A reply is a VELO packet like any other: a request holds nothing
    /// that only its own reply frees, so one empty reply may answer several.
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.put = true;
        caps.get = true;
        caps.atomics = true;
        caps.long_placed_below = usize::MAX;
        caps.acks_coalesce = true;
        caps
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        if !self.nothing_to_do()? {
            return Ok(());
        }
        let bell = self.seg.doorbell(DOORBELL).map_err(io)?;
        bell.sleep(timeout.min(LIVENESS_AFTER));
        Ok(())
    }

    fn wake_fd(&mut self) -> Result<Option<BorrowedFd<'_>>, TransportError> {
        self.wake.fd().map(Some)
    }

    /// As `wait` up to its sleep, then the doorbell's `ARMED` bit: the first ring after it
    /// (a sender's VELO message, a notification from a peer's or our own RMA engine) wakes
    /// the socket.
    fn arm(&mut self) -> Result<Armed, TransportError> {
        self.wake.prepare()?;
        if !self.nothing_to_do()? {
            return Ok(Armed::Ready);
        }
        let bell = self.seg.doorbell(DOORBELL).map_err(io)?;
        Ok(self.wake.arm(&bell, LIVENESS_AFTER))
    }

    fn disarm(&mut self) {
        self.wake.disarm(self.seg.doorbell(DOORBELL).ok());
    }

    fn close(&mut self) {
        // Let the engine finish what was sent (bounded).
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.tx.jobs_done < self.tx.jobs && Instant::now() < deadline {
            // A corrupt notification was consumed and reported; go on draining.
            let _ = self.drain_notes();
            std::thread::yield_now();
        }
    }
}

impl Drop for Extoll {
    fn drop(&mut self) {
        self.close();
        // Stop the engine before saying goodbye.
        self.tx.engine = None;
        am_nic::control::depart(
            self.tx.peers.iter().map(|p| &p.imp),
            self.tx.rank,
            self.tx.layout.departed_words(),
        );
    }
}

impl std::fmt::Debug for Extoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extoll")
            .field("rank", &self.tx.rank)
            .field("layout", &self.tx.layout)
            .field("config", &self.tx.config)
            .finish()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod hostile;
