//! [`Portals`]: the NIC of one rank with the GASNet Portals conduit's AM mapping, as an
//! `am_core::Transport`.
//!
//! The rank's exported byte area and the match bits of an AM are in [`crate::layout`].
//! Header data: the first two arguments of an inline Short (a Short or empty Medium whose head
//! is at most 16 bytes); other messages carry their whole head (and Medium payload) as data.
//!
//! Everything an event says is a peer's word: it is copied out of the queue, and checked
//! (the sender in the job, the tag, the send slot, the range inside the buffer or slot it
//! names, the offsets and header data the AM mapping writes) before anything is lent;
//! what fails is dropped and reported as `PeerMisbehaved`. Deposited messages are lent where
//! they landed, as a view (`Received::Shared`); an inline Short is rebuilt in private
//! memory (`Received::Private`).

use std::os::fd::BorrowedFd;
use std::time::Duration;

use am_core::transport::{NicInfo, OwnRange, Remote, Rma, RmaDone, Sink, Source};
use am_core::{
    Armed, Delivery, Limits, Outgoing, Payload, Rank, Received, Route, SendError, SharedBytes,
    Transport, TransportError, Tx,
};
use am_nic::wake::{Wake, Wakers};
use am_nic::{Liveness, LIVENESS_AFTER};
use am_shm::{Imported, Segment};

pub use crate::layout::Layout;
use crate::layout::{AM_TAG, KIND_LONG, KIND_SHIFT};
use crate::ni::{
    self, Drained, EventKind, MeIndex, MeOptions, MeSeen, MeSpec, NiError, NiFail, NiOwner, NiRuns,
    Nic, Outcome, PutArgs, PT_REPLY, PT_REQUEST, PT_SEGMENT,
};
use crate::{PortalsConfig, PortalsError};

/// A send slot not in use.
const FREE: u32 = u32::MAX;
/// Events that deliver nothing (refusals, unlinks) one poll handles at most before it
/// returns: a peer that keeps being refused cannot hold a poll.
const MAX_SILENT_EVENTS: u32 = 64;
/// Every this many refusal events (`Dropped`, `PtDisabled`) the owner checks the words
/// walkers read (a corrupt list makes every put refused).
const VERIFY_EVERY_REFUSALS: u64 = 64;
/// Waits in a row that yield to a live claimer mid-put before they sleep (it does not ring
/// an owner that announced itself after its claim).
const IN_FLIGHT_YIELDS: u32 = 8;
/// The sleep of a wait behind a claimer mid-put (bounded: a dead one is found by liveness).
const IN_FLIGHT_SLEEP: Duration = Duration::from_millis(1);

/// A peer's NI memory, mapped with full access (its NIC's view), and a writer's view of it.
struct Peer {
    seg: Segment,
    imp: Imported,
    /// The runs of its NI this rank's wire reaches, cut once.
    runs: NiRuns,
    /// Its request and reply portals' match entries, as this rank's wire last read and
    /// checked them.
    seen: MeSeen,
}

impl Peer {
    fn new(seg: Segment, layout: &Layout) -> Result<Peer, PortalsError> {
        Ok(Peer {
            runs: NiRuns::new(&seg, &layout.ni)?,
            seen: MeSeen::new(&layout.ni),
            imp: seg.import(),
            seg,
        })
    }
}

/// Flow-control counters of one rank (see [`Portals::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Puts this rank's wire had refused because a target's request portal entry was
    /// disabled, its event queue full or its NI memory corrupt (each was sent again later).
    pub refused: u64,
    /// `PtDisabled` events this rank's NI received (its request entry ran out of room).
    pub disabled: u64,
    /// Request buffers this rank re-linked after draining them.
    pub relinked: u64,
}

/// The sending half, lent to handlers during `poll_recv`.
struct TxState {
    rank: u32,
    /// Wakes a peer whose doorbell said it sleeps armed on its wake socket.
    wakers: Wakers,
    layout: Layout,
    /// `layout.segment_base()`, computed once.
    seg_base: usize,
    config: PortalsConfig,
    peers: Vec<Peer>,
    /// Free send slots (a stack: the slot just freed is warm in the cache).
    free_slots: Vec<u16>,
    /// Destination of the request holding each send slot, or `FREE`.
    slot_dest: Vec<u32>,
    /// Per destination: the send slots of our requests to it, in the order they went. A
    /// reply answers the request whose slot it lands in and every earlier one still here
    /// (a coalesced implicit reply answers several: replies come in request order).
    in_flight: Vec<SlotFifo>,
    /// Per peer: the send slots of its requests we still owe a reply, in arrival order (the
    /// core answers one peer's requests in order).
    owed: Vec<Owed>,
    lost: Vec<bool>,
    stats: Stats,
    /// The match entry of each request buffer, and of the send slots, at every rank (every
    /// rank's NI is initialized alike).
    buffer_mes: Vec<MeIndex>,
    reply_me: MeIndex,
    /// The peer this rank last asked to ring it when it has room (a put to it was refused
    /// for room), until a wait finds the request rung.
    room_wanted: Option<usize>,
    /// A put refused for room found the entry enabled again when it looked once more after
    /// asking: the next wait returns at once.
    retry_now: bool,
}

/// Send slots in the order their requests went or came, taken from the front: a vector and
/// the index of its first live entry, emptied whenever it drains (in a round trip, at every
/// reply) and compacted when half of it is dead, so a push and a pop cost a few instructions
/// and the memory stays bounded by the slots in flight.
#[derive(Debug, Default)]
struct SlotFifo {
    slots: Vec<u16>,
    head: usize,
}

impl SlotFifo {
    #[inline(always)]
    fn push(&mut self, slot: u16) {
        if self.head > 0 && self.head * 2 >= self.slots.len() {
            self.slots.drain(..self.head);
            self.head = 0;
        }
        self.slots.push(slot);
    }

    /// Takes the slots up to and including `slot` from the front, calling `each` on them; if
    /// `slot` is not there, all of them.
    #[inline(always)]
    fn pop_through(&mut self, slot: u16, mut each: impl FnMut(u16)) {
        while let Some(&s) = self.slots.get(self.head) {
            self.head += 1;
            each(s);
            if s == slot {
                break;
            }
        }
        if self.head == self.slots.len() {
            self.clear();
        }
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.head = 0;
    }
}

/// A peer's send slots whose request we have not answered yet: one bit per slot (a rank's
/// send slots), so a lookup never searches, and the same slots in arrival order, so a reply
/// answers its request and the earlier ones still owed. A request's send slot is its route.
#[derive(Debug)]
struct Owed {
    bits: Box<[u64]>,
    order: SlotFifo,
}

impl Owed {
    fn new(send_slots: usize) -> Owed {
        Owed {
            bits: vec![0; send_slots.div_ceil(64)].into_boxed_slice(),
            order: SlotFifo::default(),
        }
    }

    /// The reply routed to the request in `slot` went: it answered that request and the
    /// ones before it still owed.
    #[inline(always)]
    fn answer_through(&mut self, slot: u16) {
        let bits = &mut self.bits;
        self.order.pop_through(slot, |s| {
            if let Some(w) = bits.get_mut(s as usize / 64) {
                *w &= !(1 << (s % 64));
            }
        });
    }

    /// Records a request in `slot`; `false` if the slot is not a send slot or its last
    /// request is still unanswered (the peer broke the protocol).
    #[inline(always)]
    fn insert(&mut self, slot: u16) -> bool {
        let (w, b) = (slot as usize / 64, slot % 64);
        match self.bits.get_mut(w) {
            Some(word) if *word & 1 << b == 0 => {
                *word |= 1 << b;
                self.order.push(slot);
                true
            }
            _ => false,
        }
    }

    /// Whether a request in `slot` awaits our reply.
    #[inline]
    fn contains(&self, slot: u16) -> bool {
        self.bits
            .get(slot as usize / 64)
            .is_some_and(|w| w & 1 << (slot % 64) != 0)
    }

    fn clear(&mut self) {
        self.bits.iter_mut().for_each(|w| *w = 0);
        self.order.clear();
    }
}

/// One request receive buffer as its owner tracks it.
#[derive(Debug, Clone, Copy)]
struct RequestBuffer {
    me: MeIndex,
    start: usize,
    len: usize,
    /// Bytes (in claim units) of messages handled since the entry was last linked: only a
    /// hint of when to try a re-link (the re-link itself is decided by
    /// [`NiOwner::lm_drained`]).
    consumed: u64,
    /// Its offset went past its end; it is out of the match list until re-linked.
    exhausted: bool,
    /// The bytes claimed in it, as its unlink said (checked for plausibility), if known.
    used: Option<u64>,
    /// The end of the furthest message read from it since it was linked (its offset cannot
    /// be below: claims only move it up).
    high: u64,
}

/// One rank's Portals NIC. See the [crate docs](crate).
pub struct Portals {
    own: Segment,
    owner: NiOwner,
    tx: TxState,
    buffers: Vec<RequestBuffer>,
    /// The entry on the reply portal (all send slots).
    reply_me: MeIndex,
    /// Head of an inline message, rebuilt from match bits and header data.
    scratch: [u8; 16],
    liveness: Liveness,
    /// Refusal events seen (see [`VERIFY_EVERY_REFUSALS`]).
    refusals: u64,
    /// Waits in a row behind a claimer mid-put.
    in_flight_waits: u32,
    /// Some request buffer is exhausted and not re-linked yet.
    stuck: bool,
    /// Peers found departed by a liveness check, reported one per poll.
    departures: std::collections::VecDeque<Rank>,
    /// Where an event loop sleeps between `arm` and `disarm`.
    wake: Wake,
    /// The room waiter word to look at first (after the last one rung).
    room_next: usize,
    /// Waiters rung for room at a time: the largest messages a re-linked buffer holds.
    room_per_ring: usize,
}

/// A failure of this rank's own device (its cause kept as the source).
#[cold]
fn io(e: impl std::error::Error + Send + Sync + 'static) -> TransportError {
    TransportError::device_from("portals: the device failed", e)
}

fn misbehaved(peer: Option<usize>, what: impl std::fmt::Display) -> TransportError {
    TransportError::PeerMisbehaved {
        peer: peer.map(|p| p as Rank),
        what: format!("portals: {what}"),
    }
}

/// An error of the NI: a corrupt word is a peer's doing (which one, its word does not say).
#[cold]
fn ni_fault(e: NiError) -> TransportError {
    match e {
        NiError::Corrupt { .. } => misbehaved(None, e),
        other => io(other),
    }
}

/// A rank's NI as its start-up made it: the owner, its request buffers and its reply entry.
type Initialized = (NiOwner, Vec<RequestBuffer>, MeIndex);

/// `Put` events of an AM, accepted, on the request and on the reply portal: the low half of
/// the event's first word (kind, failure, portal, a zero byte; see `Event::words`).
const PUT_REQUEST: u32 = EventKind::Put as u32 | (PT_REQUEST as u32) << 16;
const PUT_REPLY: u32 = EventKind::Put as u32 | (PT_REPLY as u32) << 16;

/// An AM event from `src` that the mapping never writes (`what` is wrong).
#[cold]
#[inline(never)]
fn bad_event(w: &[u64; 7], src: usize, what: &str) -> TransportError {
    match ni::Event::from_words(*w) {
        Ok(ev) => misbehaved(Some(src), format_args!("a bad {what} (event {ev:?})")),
        Err(_) => misbehaved(Some(src), format_args!("a bad {what} (event {w:x?})")),
    }
}

/// The arguments of a put into a peer's segment entry at `offset`: `data`, then `shared`
/// (a range of this rank's own segment), with no event asked for.
fn segment_put<'a>(
    offset: usize,
    data: &'a [&'a [u8]],
    shared: Option<SharedBytes<'a>>,
) -> PutArgs<'a> {
    PutArgs {
        pt: PT_SEGMENT,
        match_bits: 0,
        hdr_data: 0,
        remote_offset: offset as u64,
        data,
        shared,
        ack: false,
        send_event: false,
        pad: false,
    }
}

impl Portals {
    /// What a put or get (`what`) of `len` bytes at `offset` of `peer`'s segment entry came
    /// to.
    fn rma_done(
        &mut self,
        done: Result<Outcome, NiError>,
        what: &str,
        peer: Rank,
        offset: usize,
        len: usize,
    ) -> Result<(), SendError> {
        match done {
            Ok(Outcome::Done { .. }) => Ok(()),
            Ok(Outcome::Refused(f)) => Err(SendError::device(format!(
                "portals: rank {peer}'s segment entry refused a {what} of {len} bytes at {offset}: {f:?}"
            ))),
            Err(e) => Err(self.tx.put_err(e)),
        }
    }
}

impl Portals {
    /// `PtlPut` into the target's segment entry ([`Nic::put`]), with no event there (the
    /// entry disables them): the deposit is done when this returns, which stands for the
    /// `Ack` a real initiator would wait for.
    fn put_bytes(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<(), SendError> {
        let d = self.reachable(dest)?;
        let pieces = [data];
        let args = segment_put(offset, &pieces, None);
        let done = self.tx.nic(d).put(self.tx.rank, None, &args);
        self.rma_done(done, "put", dest, offset, data.len())
    }

    /// `PtlPut` to the target's segment entry whose data is this rank's own segment range
    /// (the memory descriptor over the segment): one copy from mapping to mapping.
    fn put_own(
        &mut self,
        dest: Rank,
        offset: usize,
        local: usize,
        len: usize,
    ) -> Result<(), SendError> {
        let d = self.reachable(dest)?;
        let from = am_core::rma::own_slice(self.segment(), local, len)?;
        let args = segment_put(offset, &[], Some(from));
        let done = self.tx.nic(d).put(self.tx.rank, None, &args);
        self.rma_done(done, "put", dest, offset, len)
    }

    /// `PtlGet` from the target's segment entry into this rank's own segment range (a
    /// memory descriptor over the segment, [`Nic::get_shared`]): one copy from mapping to
    /// mapping, done when this returns.
    fn get_own(
        &mut self,
        src: Rank,
        offset: usize,
        local: usize,
        len: usize,
    ) -> Result<(), SendError> {
        let d = self.reachable(src)?;
        let into = am_core::rma::own_slice(self.segment(), local, len)?;
        let done =
            self.tx
                .nic(d)
                .get_shared(self.tx.rank, None, PT_SEGMENT, 0, offset as u64, into);
        self.rma_done(done, "get", src, offset, len)
    }

    /// `PtlPut` from a memory descriptor over the created segment's range, as
    /// [`Portals::put_own`].
    fn put_segment(
        &mut self,
        dest: Rank,
        offset: usize,
        src: OwnRange<'_>,
    ) -> Result<(), SendError> {
        let d = self.reachable(dest)?;
        let len = src.bytes.len();
        let args = segment_put(offset, &[], Some(src.bytes));
        let done = self.tx.nic(d).put(self.tx.rank, None, &args);
        self.rma_done(done, "put", dest, offset, len)
    }

    /// `PtlGet` into a memory descriptor over the created segment's range, as
    /// [`Portals::get_own`].
    fn get_segment(
        &mut self,
        src: Rank,
        offset: usize,
        dst: OwnRange<'_>,
    ) -> Result<(), SendError> {
        let d = self.reachable(src)?;
        let len = dst.bytes.len();
        let done =
            self.tx
                .nic(d)
                .get_shared(self.tx.rank, None, PT_SEGMENT, 0, offset as u64, dst.bytes);
        self.rma_done(done, "get", src, offset, len)
    }

    /// `PtlGet` from the target's segment entry ([`Nic::get`]) straight into `dst` (the
    /// seed's "get into a temporary MD" when the local side is outside the segment): done
    /// when this returns, which stands for the `Reply` event.
    fn get_bytes(&mut self, src: Rank, offset: usize, dst: &mut [u8]) -> Result<(), SendError> {
        let d = self.reachable(src)?;
        let len = dst.len();
        let done = self
            .tx
            .nic(d)
            .get(self.tx.rank, None, PT_SEGMENT, 0, offset as u64, dst);
        self.rma_done(done, "get", src, offset, len)
    }

    /// Through the target's segment entry, as Portals' fetching atomics: the NIC performs
    /// it on the target's memory ([`Nic::atomic`]) with no event there, so the target need
    /// not poll.
    fn atomic(
        &mut self,
        dest: Rank,
        offset: usize,
        atomic: am_core::atomic::Atomic,
    ) -> Result<u64, SendError> {
        let d = self.reachable(dest)?;
        let me = self.tx.rank;
        match self
            .tx
            .nic(d)
            .atomic(me, PT_SEGMENT, 0, offset as u64, &atomic)
        {
            Ok((Outcome::Done { .. }, old)) => Ok(old),
            Ok((Outcome::Refused(f), _)) => Err(SendError::device(format!(
                "portals: rank {dest}'s segment entry refused an atomic at {offset}: {f:?}"
            ))),
            Err(e) => Err(self.tx.put_err(e)),
        }
    }

    /// Each through the segment entry ([`Nic::atomic`]), after a prefetch of its word where
    /// the entry maps it (its start is the segment's, as set up): a hint, without walking the
    /// match list, which only the atomic itself does. In chunks of 16, each prefetched whole
    /// before its atomics run: an atomic here also reads the target's NI lines, which wait
    /// behind every prefetch still outstanding, so the window of prefetches is kept as short
    /// as a chunk (BENCHMARKS.md, "Posted atomics in batches of 64").
    fn atomics(&mut self, batch: &[am_core::atomic::Posted]) -> am_core::atomic::Batch {
        const CHUNK: usize = 16;
        let mut at_index = 0;
        am_core::atomic::each_posted(batch, |p| {
            if at_index % CHUNK == 0 {
                for q in batch[at_index..].iter().take(CHUNK) {
                    if let (Some(peer), Some(at)) = (
                        self.tx.peers.get(q.dest as usize),
                        self.tx.seg_base.checked_add(q.offset),
                    ) {
                        peer.imp.byte_area().prefetch(at);
                    }
                }
            }
            at_index += 1;
            self.atomic(p.dest, p.offset, p.atomic)?;
            Ok(())
        })
    }
}

impl Transport for Portals {
    fn rank(&self) -> Rank {
        self.tx.rank
    }

    fn size(&self) -> u32 {
        self.tx.layout.ranks
    }

    /// `portals`, its limits, the credits its receive buffers were sized for
    /// ([`PortalsConfig::credits`]), and what it does itself.
    ///
    /// Puts, gets and atomics through the peers' segment entries. The initiator's process
    /// performs the segment entry's deposit before the header goes: a Long has landed once
    /// `try_send` returned. A reply may answer several requests of its peer: it lands in the
    /// send slot of the latest, and the requester frees that slot and those of its earlier
    /// requests to the replier (replies come in request order).
    #[inline]
    fn info(&self) -> NicInfo {
        let limits = Limits {
            max_args: am_core::wire::MAX_ARGS,
            max_medium: self.tx.config.max_message - am_core::wire::MAX_HEAD_LEN,
            max_long: self.tx.config.max_long,
            max_credits: self.tx.config.credits.max_per_peer().min(255),
        };
        let mut info = NicInfo::new("portals", limits);
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

    /// Puts and gets of segment 0 through the peers' segment entries, each one `PtlPut` or
    /// `PtlGet` ([`Nic::put`], [`Nic::get`], [`Nic::get_shared`]), and atomics as Portals'
    /// fetching atomics ([`Nic::atomic`]); the shapes it does not move itself (regions, one
    /// region at a time) by [`am_core::rma::by_pieces`]. Registered segments
    /// ([`Remote::Keyed`]) it does not have.
    #[inline]
    fn rma(&mut self, request: Rma<'_>) -> Result<RmaDone, SendError> {
        match request {
            Rma::Put {
                dest,
                to: Remote::At(offset),
                from: Source::Bytes(data),
            } => self
                .put_bytes(dest, offset, data)
                .map(|()| RmaDone::moved()),
            Rma::Put {
                dest,
                to: Remote::At(offset),
                from: Source::Own { offset: local, len },
            } => self
                .put_own(dest, offset, local, len)
                .map(|()| RmaDone::moved()),
            Rma::Put {
                dest,
                to: Remote::At(offset),
                from: Source::Segment(range),
            } => self
                .put_segment(dest, offset, range)
                .map(|()| RmaDone::moved()),
            Rma::Get {
                src,
                from: Remote::At(offset),
                into: Sink::Bytes(dst),
            } => self.get_bytes(src, offset, dst).map(|()| RmaDone::moved()),
            Rma::Get {
                src,
                from: Remote::At(offset),
                into: Sink::Own { offset: local, len },
            } => self
                .get_own(src, offset, local, len)
                .map(|()| RmaDone::moved()),
            Rma::Get {
                src,
                from: Remote::At(offset),
                into: Sink::Segment(range),
            } => self
                .get_segment(src, offset, range)
                .map(|()| RmaDone::moved()),
            Rma::Atomic {
                dest,
                at: Remote::At(offset),
                atomic,
            } => self.atomic(dest, offset, atomic).map(RmaDone::old),
            Rma::Atomics { batch, outcome } => {
                *outcome = self.atomics(batch);
                Ok(RmaDone::moved())
            }
            Rma::Put {
                to: Remote::Keyed { .. },
                ..
            }
            | Rma::Get {
                from: Remote::Keyed { .. },
                ..
            }
            | Rma::Atomic {
                at: Remote::Keyed { .. },
                ..
            } => Err(SendError::Unsupported(
                "portals: RMA on registered segments",
            )),
            request => am_core::rma::by_pieces(self, request),
        }
    }

    fn segment(&self) -> SharedBytes<'_> {
        self.am_segment().unwrap_or_else(|_| {
            self.own
                .byte_area()
                .slice(0, 0)
                .unwrap_or(self.own.byte_area())
        })
    }

    #[inline]
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        let mut silent = 0;
        let w = loop {
            let Some(w) = self.owner.eq_poll_words(&self.own).map_err(ni_fault)? else {
                if self.liveness.idle_poll() {
                    self.idle_tick()?;
                }
                // Found with the queue empty: everything the peer sent was delivered.
                if let Some(r) = self.departures.pop_front() {
                    return Err(TransportError::PeerDeparted(r));
                }
                return Ok(None);
            };
            // An accepted AM: kind, failure, portal and the byte after it in one compare.
            let low = w[0] as u32;
            if low == PUT_REQUEST || low == PUT_REPLY {
                break w;
            }
            if let Some(w) = self.other_event(w)? {
                break w;
            }
            silent += 1;
            if silent >= MAX_SILENT_EVENTS {
                return Ok(None);
            }
        };
        self.liveness.progress();
        self.in_flight_waits = 0;
        let initiator = (w[0] >> 32) as u32;
        let Some(src) = self.sender(initiator) else {
            return Err(misbehaved(
                None,
                format_args!("a Put event from rank {initiator}, outside the job"),
            ));
        };
        let is_request = (w[0] >> 16) as u8 == PT_REQUEST;
        let match_bits = w[1];
        let (at, len, buffer) = match self.locate(w, is_request, src) {
            Ok(found) => found,
            Err(e) => return Err(self.blame(e)),
        };
        let slot = (match_bits >> 32) as u16;
        let route = if is_request {
            if !self.tx.owed[src].insert(slot) {
                return Err(misbehaved(
                    Some(src),
                    format_args!(
                        "a request in send slot {slot}, not a send slot or not yet answered"
                    ),
                ));
            }
            // Its reply goes back to that send slot (slot + 1: no request has `NONE`).
            Route::new(u64::from(slot) + 1)
        } else {
            Route::NONE
        };
        if !is_request && self.tx.slot_dest.get(slot as usize) != Some(&(src as u32)) {
            return Err(misbehaved(
                Some(src),
                format_args!("a reply into send slot {slot}, which holds no request to it"),
            ));
        }
        let placed = (match_bits as u8 >> KIND_SHIFT) & 3 == KIND_LONG;
        let (seg_base, seg_len) = (self.tx.seg_base, self.tx.layout.segment);
        let segment = self.own.view(seg_base, seg_len).map_err(io)?;
        let bytes = match at {
            None => Received::Private(&self.scratch[..len]),
            // Checked in range by `locate`: lent where it landed, never copied here.
            Some(start) => Received::Shared(self.own.view(start, len).map_err(io)?),
        };
        let delivery = Delivery {
            src: src as Rank,
            bytes,
            payload_placed: placed,
            route,
        };
        let r = f(delivery, segment, &mut self.tx);
        if let (Some(b), Some(start)) = (buffer, at) {
            let rb = &mut self.buffers[b];
            let claim = ni::lm_len(len) as u64;
            rb.consumed = rb.consumed.saturating_add(claim);
            // In range (checked by `locate`): no overflow.
            rb.high = rb.high.max((start - rb.start) as u64 + claim);
            if rb.exhausted && rb.used.is_some_and(|u| rb.consumed >= u) {
                self.try_relink(b)?;
            }
        } else if !is_request {
            // The reply landed in its request's send slot: that slot and those of the
            // earlier requests it answered are free again.
            let TxState {
                in_flight,
                slot_dest,
                free_slots,
                ..
            } = &mut self.tx;
            if let Some(f) = in_flight.get_mut(src) {
                f.pop_through(slot, |s| {
                    if let Some(d) = slot_dest.get_mut(s as usize) {
                        *d = FREE;
                    }
                    free_slots.push(s);
                });
            }
        }
        Ok(Some(r))
    }

    fn wake_fd(&mut self) -> Result<Option<BorrowedFd<'_>>, TransportError> {
        self.wake.fd().map(Some)
    }

    /// As `wait` up to its sleep, then the doorbell's `ARMED` bit: the first ring after it
    /// wakes the socket. Behind a claim in flight (whose producer may not ring) the sleep is
    /// short, as `wait`'s.
    fn arm(&mut self) -> Result<Armed, TransportError> {
        self.wake.prepare()?;
        if self.owner.eq_ready(&self.own).map_err(ni_fault)? {
            return Ok(Armed::Ready);
        }
        self.idle_tick()?;
        if self.owner.eq_ready(&self.own).map_err(ni_fault)? {
            return Ok(Armed::Ready);
        }
        // Producers ring only while we are announced (until `disarm`).
        let quiet = self.owner.announce_wait(&self.own).map_err(ni_fault)?;
        if self.tx.room_rung() {
            let _ = self.owner.end_wait(&self.own);
            return Ok(Armed::Ready);
        }
        let bell = self.owner.doorbell(&self.own).map_err(ni_fault)?;
        let within = if quiet {
            LIVENESS_AFTER
        } else {
            IN_FLIGHT_SLEEP
        };
        let armed = self.wake.arm(&bell, within);
        if armed == Armed::Ready || self.owner.eq_ready(&self.own).map_err(ni_fault)? {
            self.disarm();
            return Ok(Armed::Ready);
        }
        Ok(armed)
    }

    fn disarm(&mut self) {
        self.wake.disarm(self.owner.doorbell(&self.own).ok());
        let _ = self.owner.end_wait(&self.own);
    }

    /// Sleeps on the event queue's doorbell when nothing is claimed at its head; behind a
    /// claim in flight (a live rank mid-put, which may not ring), yields a few times and then
    /// sleeps briefly: never a busy loop, and a claimer that died there is found by the
    /// liveness check and skipped.
    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        if self.owner.eq_ready(&self.own).map_err(ni_fault)? {
            return Ok(());
        }
        self.idle_tick()?;
        if self.owner.eq_ready(&self.own).map_err(ni_fault)? {
            return Ok(());
        }
        // Producers ring only while we are announced; a claim the announcement raced with
        // (a producer mid-post) is a reason not to sleep long.
        let quiet = self.owner.announce_wait(&self.own).map_err(ni_fault)?;
        let bell = self.owner.doorbell(&self.own).map_err(ni_fault)?;
        if self.tx.room_rung() {
            // A peer this rank waits on for room has some: send again now.
        } else if quiet {
            self.in_flight_waits = 0;
            bell.sleep(timeout.min(LIVENESS_AFTER));
        } else if self.owner.eq_ready(&self.own).map_err(ni_fault)? {
            // Published meanwhile: poll.
        } else {
            self.in_flight_waits = self.in_flight_waits.saturating_add(1);
            if self.in_flight_waits <= IN_FLIGHT_YIELDS {
                am_shm::sync::yield_now();
            } else {
                bell.sleep(timeout.min(IN_FLIGHT_SLEEP));
            }
        }
        self.owner.end_wait(&self.own).map_err(ni_fault)
    }
}

impl Drop for Portals {
    fn drop(&mut self) {
        am_nic::control::depart(
            self.tx.peers.iter().map(|p| &p.imp),
            self.tx.rank as usize,
            self.tx.layout.departed(),
        );
    }
}

impl std::fmt::Debug for Portals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Portals")
            .field("rank", &self.tx.rank)
            .field("layout", &self.tx.layout)
            .field("config", &self.tx.config)
            .finish()
    }
}

mod liveness;
mod recv;
mod request_buffers;
mod send;
mod setup;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod hostile;
