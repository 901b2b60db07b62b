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
    transport::{NicInfo, Rma, RmaDone},
    Armed, Delivery, Limits, Outgoing, Payload, Rank, Received, Route, SendError, SharedBytes,
    Transport, TransportError, Tx,
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
    /// `layout.room()`, computed once: looked at every time the head is told.
    room_at: usize,
    /// Mailbox slots told free since room waiters were last rung: how many to ring.
    freed: u64,
    /// The room waiter word to look at first (after the last one rung).
    room_next: usize,
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

impl Transport for Extoll {
    fn rank(&self) -> Rank {
        self.tx.rank as Rank
    }

    fn size(&self) -> u32 {
        self.tx.layout.ranks as u32
    }

    /// Puts, gets and atomics on the peers' registered segments, done by the RMA unit. A
    /// Long's payload is an immediate put the engine runs when the doorbell is rung, before
    /// `try_send` returns. A reply is a VELO packet like any other: a request holds nothing
    /// that only its own reply frees, so one empty reply may answer several. The credits
    /// are those this rank's receive memory was laid out for ([`ExtollConfig::credits`]).
    #[inline]
    fn info(&self) -> NicInfo {
        let limits = Limits {
            max_args: am_core::wire::MAX_ARGS,
            max_medium: MAX_MEDIUM,
            max_long: self.tx.config.max_long,
            // The shared mailbox is bounded as a whole; back-pressure covers the rest.
            max_credits: 255,
        };
        let mut info = NicInfo::new("extoll", limits);
        info.credits = self.tx.config.credits;
        let caps = &mut info.capabilities;
        caps.put = true;
        caps.get = true;
        caps.atomics = true;
        caps.long_placed_below = usize::MAX;
        caps.acks_coalesce = true;
        // Every rank is a process of this host: created segments are memory files peers map.
        caps.map_segments = true;
        info
    }

    fn segment(&self) -> SharedBytes<'_> {
        am_segment(&self.seg, &self.tx.layout)
    }

    /// Immediate RMA on the peers' registered segments, mapped here: in this model the
    /// engine's transfer is the copy into (or out of) the target's registered segment made
    /// on this rank's thread, complete when this returns, the target notified of nothing (a
    /// put's notification would say only that, and the target was not asked to hear of it).
    /// The queued engine's gets, [`Extoll::rma_get`], land in this rank's own registered
    /// segment instead and report through the notification queue. An atomic is the NIC's
    /// read-modify-write on the target's memory, as its RMA unit writes a put there: one
    /// atomic instruction on the target's mapped word.
    #[inline(always)]
    fn rma(&mut self, request: Rma<'_>) -> Result<RmaDone, SendError> {
        am_core::rma::mapped(self, request)
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

impl am_core::rma::MappedPeers for Extoll {
    #[inline]
    fn peer_segment(&self, rank: Rank) -> Result<SharedBytes<'_>, SendError> {
        Extoll::peer_segment(self, rank)
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

mod liveness;
mod pool;
mod recv;
mod rma_path;
mod send;
mod setup;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod hostile;
