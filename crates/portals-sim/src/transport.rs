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

use am_core::{
    Armed, Capabilities, Delivery, Limits, Outgoing, Payload, Rank, Received, Route, SendError,
    SharedBytes, Transport, TransportError, Tx,
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

impl TxState {
    #[inline(always)]
    fn nic(&self, dest: usize) -> Nic<'_> {
        let p = &self.peers[dest];
        let wake = (&self.wakers, dest as Rank);
        Nic::with_runs(&p.seg, &p.imp, &self.layout.ni, &p.runs, wake)
    }

    /// A put's error: a corrupt word in the target's NI memory (another peer's doing, which
    /// its owner repairs when it next looks) is back-pressure; anything else is reported.
    #[cold]
    fn put_err(&mut self, e: NiError) -> SendError {
        match e {
            NiError::Corrupt { .. } => {
                self.stats.refused += 1;
                SendError::Busy
            }
            other => SendError::device_from("portals: a put failed", other),
        }
    }

    #[inline(always)]
    fn send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let d = dest as usize;
        if d >= self.peers.len() {
            return Err(SendError::InvalidRank(dest));
        }
        if self.lost[d] {
            return Err(SendError::PeerLost(dest));
        }
        if msg.head.len() < am_core::wire::BASE_HEADER_LEN {
            return Err(SendError::device(
                "portals: a head shorter than the AM header",
            ));
        }
        if msg.long_offset.is_some() {
            return self.send_long(dest, msg);
        }
        if msg.len() > self.config.max_message {
            return Err(SendError::TooLarge(msg.len()));
        }
        match msg.reply_to {
            None => self.send_request(dest, msg),
            Some(route) => self.send_reply(dest, route, msg),
        }
    }

    /// A request (not a Long): it takes a free send slot, which its reply frees.
    #[inline(always)]
    fn send_request(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let slot = *self.free_slots.last().ok_or_else(|| SendError::Busy)?;
        self.put_message(dest, slot, false, msg)?;
        self.free_slots.pop();
        self.slot_dest[slot as usize] = dest;
        self.in_flight[dest as usize].push(slot);
        Ok(())
    }

    /// A reply (not a Long): to the requester's send slot, which its request's route names.
    #[inline(always)]
    fn send_reply(
        &mut self,
        dest: Rank,
        route: Route,
        msg: &Outgoing<'_>,
    ) -> Result<(), SendError> {
        let slot = self.owed_slot(dest, route)?;
        self.put_message(dest, slot, true, msg)?;
        self.owed[dest as usize].answer_through(slot);
        Ok(())
    }

    /// The send slot of the request `route` answers, if `dest` is owed a reply there.
    #[inline(always)]
    fn owed_slot(&self, dest: Rank, route: Route) -> Result<u16, SendError> {
        match route
            .get()
            .checked_sub(1)
            .and_then(|k| u16::try_from(k).ok())
        {
            Some(k) if self.owed[dest as usize].contains(k) => Ok(k),
            _ => Err(SendError::NoRequestToAnswer(route)),
        }
    }

    /// A Long: its payload into the target's segment first, then its header (out of line:
    /// the path of Shorts and Mediums stays small).
    #[inline(never)]
    fn send_long(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let Some(off) = msg.long_offset else {
            return Err(SendError::device("portals: a Long without an offset"));
        };
        let head = msg.head;
        if head.len() > self.config.max_message {
            return Err(SendError::TooLarge(head.len()));
        }
        if msg.payload.len() > self.config.max_long {
            return Err(SendError::TooLarge(msg.payload.len()));
        }
        let is_reply = msg.is_reply();
        let slot = match msg.reply_to {
            Some(route) => self.owed_slot(dest, route)?,
            None => *self.free_slots.last().ok_or_else(|| SendError::Busy)?,
        };
        let (payload, shared): (&[u8], _) = match msg.payload {
            Payload::Private(p) => (p, None),
            Payload::Shared(s) => (&[], Some(s)),
        };
        self.place_long(dest, off, payload, shared, is_reply)?;
        self.put_message(dest, slot, is_reply, msg)?;
        let d = dest as usize;
        if is_reply {
            self.owed[d].answer_through(slot);
        } else {
            self.free_slots.pop();
            self.slot_dest[slot as usize] = dest;
            self.in_flight[d].push(slot);
        }
        Ok(())
    }

    /// Puts AM `msg` (its head, and its payload unless it is a Long, whose payload was
    /// placed already) into `dest`'s request portal (`is_reply` false) or reply portal (into
    /// send slot `slot`), with `slot` in its match bits. `Ok` once it was deposited where
    /// its target takes it.
    #[inline(always)]
    fn put_message(
        &mut self,
        dest: Rank,
        slot: u16,
        is_reply: bool,
        msg: &Outgoing<'_>,
    ) -> Result<(), SendError> {
        // A shared payload (an echo) goes to the NI as such: the deposit moves it straight
        // from where it was received.
        let (payload, shared): (&[u8], _) = match msg.payload {
            Payload::Private(p) => (p, None),
            Payload::Shared(s) => (&[], Some(s)),
        };
        let long = msg.long_offset.is_some();
        let head = msg.head;
        let mut first4 = [0u8; 4];
        first4.copy_from_slice(&head[..4]);
        let match_bits = u32::from_le_bytes(first4) as u64 | (slot as u64) << 32 | AM_TAG << 48;
        let inline = !long && msg.payload.is_empty() && head.len() <= 16 && head[4..8] == [0; 4];
        let mut hdr = [0u8; 8];
        let parts: [&[u8]; 2] = [head, payload];
        // The message's data, and its shared tail: none for an inline header or for a Long
        // (whose payload is in the segment already).
        let (data, tail): (&[&[u8]], _) = if inline {
            // At most two argument words: a short byte loop, not a `memcpy` call.
            for (d, s) in hdr.iter_mut().zip(&head[8..]) {
                *d = *s;
            }
            (&[], None)
        } else if long {
            (&parts[..1], None)
        } else {
            (&parts, shared)
        };
        let args = PutArgs {
            pt: if is_reply { PT_REPLY } else { PT_REQUEST },
            match_bits,
            hdr_data: u64::from_le_bytes(hdr),
            remote_offset: if is_reply {
                slot as u64 * self.layout.slot_bytes as u64
            } else {
                0
            },
            data,
            shared: tail,
            ack: false,
            send_event: false,
            // The send slot is the request's, reserved for this reply.
            pad: is_reply,
        };
        let msg_len = if long { head.len() } else { msg.len() };
        let p = &mut self.peers[dest as usize];
        let wake = (&self.wakers, dest as Rank);
        let nic = Nic::with_runs(&p.seg, &p.imp, &self.layout.ni, &p.runs, wake);
        let done = nic.put_seen(&mut p.seen, self.rank, &args);
        match done.map_err(|e| self.put_err(e))? {
            Outcome::Done { me, start }
                if !data.is_empty() && !self.landed(is_reply, slot, me, start, msg_len) =>
            {
                // The target's entry was corrupt (another peer's doing): the deposit went
                // where its target will not take it (it drops the event, and repairs the
                // entry). Not sent, then: the core sends it again, after a walk that reads
                // the entries afresh (the corrupt field may be back before the repair).
                self.peers[dest as usize].seen.forget();
                self.stats.refused += 1;
                Err(SendError::Busy)
            }
            Outcome::Done { .. } => Ok(()),
            // The target's NIC refused it: nothing was deposited; the core sends it again.
            Outcome::Refused(NiFail::PtDisabled | NiFail::EqFull) => {
                self.stats.refused += 1;
                Err(SendError::Busy)
            }
            Outcome::Refused(f) => {
                // Perhaps by a kept entry a peer had corrupted: the next walk reads afresh.
                self.peers[dest as usize].seen.forget();
                Err(SendError::device(format!(
                    "portals: rank {dest} matched no entry for {} (send slot {slot}): {f:?}",
                    if is_reply { "a reply" } else { "a request" }
                )))
            }
        }
    }

    /// A Long's payload, put into `dest`'s segment entry before its header goes (out of
    /// line: the message path of Shorts and Mediums stays small).
    #[inline(never)]
    fn place_long(
        &mut self,
        dest: Rank,
        off: usize,
        payload: &[u8],
        shared: Option<SharedBytes<'_>>,
        is_reply: bool,
    ) -> Result<(), SendError> {
        let d = dest as usize;
        // Do not move the payload for a header the target would refuse now.
        let enabled = self.nic(d).pt_enabled(PT_REQUEST);
        if !is_reply && !enabled.map_err(|e| self.put_err(e))? {
            self.stats.refused += 1;
            return Err(SendError::Busy);
        }
        let len = shared.map_or(payload.len(), |s| s.len());
        // Out of the target's segment: the header goes alone and the target rejects it.
        let fits = off
            .checked_add(len)
            .is_some_and(|end| end <= self.layout.segment);
        if fits && len != 0 {
            let data: &[&[u8]] = &[payload];
            let args = PutArgs {
                pt: PT_SEGMENT,
                match_bits: 0,
                hdr_data: 0,
                remote_offset: off as u64,
                data,
                shared,
                ack: false,
                send_event: false,
                pad: false,
            };
            let done = self.nic(d).put(self.rank, None, &args);
            if let Outcome::Refused(f) = done.map_err(|e| self.put_err(e))? {
                return Err(SendError::device(format!(
                    "portals: rank {dest}'s segment entry refused a Long payload: {f:?}"
                )));
            }
        }
        Ok(())
    }

    /// Whether a deposit in entry `me` at `start` is where the target takes it (every rank
    /// lays out its NI alike, so the sender knows): a request inside a request buffer, at a
    /// claim boundary; a reply at its send slot. What the target checks of it (`locate`).
    #[inline(always)]
    fn landed(&self, is_reply: bool, slot: u16, me: MeIndex, start: u64, len: usize) -> bool {
        let l = &self.layout;
        if is_reply {
            return me == self.reply_me
                && start == (l.send_base() + slot as usize * l.slot_bytes) as u64;
        }
        let Some(i) = self.buffer_mes.iter().position(|&b| b == me) else {
            return false;
        };
        let lo = l.request_buffer(i) as u64;
        start >= lo
            && (start - lo).is_multiple_of(ni::LM_ALIGN as u64)
            && start
                .checked_add(len as u64)
                .is_some_and(|end| end <= lo + l.request_buffer_bytes as u64)
    }

    /// Forgets what was in flight with a lost peer, so its send slots serve the others.
    fn forget(&mut self, peer: usize) {
        if let Some(l) = self.lost.get_mut(peer) {
            *l = true;
        }
        if let Some(o) = self.owed.get_mut(peer) {
            o.clear();
        }
        if let Some(f) = self.in_flight.get_mut(peer) {
            f.clear();
        }
        for (s, d) in self.slot_dest.iter_mut().enumerate() {
            if *d == peer as u32 {
                *d = FREE;
                self.free_slots.push(s as u16);
            }
        }
    }
}

impl Tx for TxState {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.send(dest, msg)
    }
}

impl Tx for Portals {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.tx.send(dest, msg)
    }
}

/// A rank's NI as its start-up made it: the owner, its request buffers and its reply entry.
type Initialized = (NiOwner, Vec<RequestBuffer>, MeIndex);

/// Creates and initializes a rank's NI memory: portal entries, request buffers, the reply and
/// segment entries.
fn init_ni(seg: &Segment, layout: &Layout) -> Result<Initialized, PortalsError> {
    let mut owner = NiOwner::new(layout.ni, seg, [true, false, false, false])?;
    let mut buffers = Vec::with_capacity(layout.request_buffers);
    for i in 0..layout.request_buffers {
        let spec = MeSpec {
            match_bits: AM_TAG << 48,
            ignore_bits: (1 << 48) - 1,
            start: layout.request_buffer(i),
            length: layout.request_buffer_bytes,
            options: MeOptions {
                put: true,
                manage_local: true,
                ..MeOptions::default()
            },
        };
        let me = owner.me_append(seg, PT_REQUEST, spec)?;
        buffers.push(RequestBuffer {
            me,
            start: spec.start,
            len: spec.length,
            consumed: 0,
            exhausted: false,
            used: None,
            high: 0,
        });
    }
    let reply_me = owner.me_append(
        seg,
        PT_REPLY,
        MeSpec {
            match_bits: AM_TAG << 48,
            ignore_bits: (1 << 48) - 1,
            start: layout.send_base(),
            length: layout.send_slots * layout.slot_bytes,
            options: MeOptions {
                put: true,
                ..MeOptions::default()
            },
        },
    )?;
    owner.me_append(
        seg,
        PT_SEGMENT,
        MeSpec {
            match_bits: 0,
            ignore_bits: 0,
            start: layout.segment_base(),
            length: layout.segment,
            options: MeOptions {
                put: true,
                get: true,
                event_disable: true,
                ..MeOptions::default()
            },
        },
    )?;
    Ok((owner, buffers, reply_me))
}

/// Why start-up failed, in this crate's terms.
fn setup_error(e: am_nic::SetupError) -> PortalsError {
    match e {
        am_nic::SetupError::Shm(e) => PortalsError::Shm(e),
        am_nic::SetupError::Bootstrap(s) => PortalsError::Bootstrap(s),
        am_nic::SetupError::Config(s) => PortalsError::Config(s),
        am_nic::SetupError::Mismatch { rank, theirs, ours } => {
            PortalsError::Mismatch { rank, theirs, ours }
        }
        am_nic::SetupError::SegmentSizeMismatch { rank, ours, theirs } => {
            PortalsError::SegmentSizeMismatch { rank, ours, theirs }
        }
        other => PortalsError::Setup(other),
    }
}

impl Portals {
    /// `dest` as an index, for the operations the NIC does on its memory (put, get,
    /// atomics): a rank of the job, not known lost, and not departed (its departed word in
    /// our NI memory is set).
    fn reachable(&self, dest: Rank) -> Result<usize, SendError> {
        let d = dest as usize;
        if d >= self.tx.peers.len() {
            return Err(SendError::InvalidRank(dest));
        }
        if self.tx.lost[d] {
            return Err(SendError::PeerLost(dest));
        }
        let departed = self.tx.layout.ni.departed(d);
        if d != self.tx.rank as usize && self.own.load_word(departed).unwrap_or(0) != 0 {
            return Err(SendError::PeerDeparted(dest));
        }
        Ok(d)
    }

    #[allow(clippy::too_many_arguments)]
    fn new(
        job: String,
        rank: u32,
        layout: Layout,
        config: PortalsConfig,
        own: Segment,
        init: Initialized,
        peers: Vec<Peer>,
        pids: Vec<Option<nix::unistd::Pid>>,
    ) -> Portals {
        let (owner, buffers, reply_me) = init;
        let n = layout.ranks as usize;
        Portals {
            own,
            owner,
            tx: TxState {
                rank,
                wakers: Wakers::new(&job, layout.ranks),
                layout,
                seg_base: layout.segment_base(),
                config,
                peers,
                free_slots: (0..layout.send_slots as u16).rev().collect(),
                slot_dest: vec![FREE; layout.send_slots],
                in_flight: (0..n).map(|_| SlotFifo::default()).collect(),
                owed: (0..n).map(|_| Owed::new(layout.send_slots)).collect(),
                lost: vec![false; n],
                stats: Stats::default(),
                buffer_mes: buffers.iter().map(|b| b.me).collect(),
                reply_me,
            },
            buffers,
            reply_me,
            scratch: [0; 16],
            liveness: Liveness::new(pids),
            refusals: 0,
            in_flight_waits: 0,
            stuck: false,
            departures: std::collections::VecDeque::new(),
            wake: Wake::new("portals", &job, rank),
        }
    }

    /// The transports of an in-process job of `ranks` ranks (one per thread), over heap
    /// memory that the threads share exactly as processes share a mapping (the same atomics,
    /// the same views; each rank's NIC maps its peers with [`Segment::share`]), so Miri and
    /// loom check this code too.
    pub fn cluster(
        ranks: u32,
        segment_size: usize,
        config: PortalsConfig,
    ) -> Result<Vec<Portals>, PortalsError> {
        if ranks == 0 {
            return Err(PortalsError::Config("a job has at least one rank".into()));
        }
        let layout = Layout::new(ranks, segment_size, &config)?;
        let segs = (0..ranks)
            .map(|_| Segment::heap(layout.ni.words_len(), layout.ni.bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut out = Vec::with_capacity(ranks as usize);
        let job = am_nic::wake::in_process_job("portals");
        for (r, seg) in segs.iter().enumerate() {
            let init = init_ni(seg, &layout)?;
            let peers = segs
                .iter()
                .map(|s| Peer::new(s.share(), &layout))
                .collect::<Result<_, _>>()?;
            out.push(Portals::new(
                job.clone(),
                r as u32,
                layout,
                config,
                seg.share(),
                init,
                peers,
                vec![None; ranks as usize],
            ));
        }
        Ok(out)
    }

    /// Starts this rank's NIC in a multi-process job (`am_nic::connect`): creates its NI
    /// memory (anonymous: no file is ever left behind, whatever kills the job), initializes
    /// it, exchanges pids, geometry and segment handles through the launcher's key-value
    /// store, and maps every rank's NI with full access (its NIC's view).
    pub fn connect(
        job: &mut am_bootstrap::JobInfo,
        segment_size: usize,
        config: PortalsConfig,
    ) -> Result<Portals, PortalsError> {
        let layout = Layout::new(job.size, segment_size, &config)?;
        let rank = job.rank;
        let geometry = layout.fingerprint(&config);
        let mut made: Option<Result<Initialized, PortalsError>> = None;
        let joined = am_nic::connect(
            job,
            "portals",
            layout.ni.words_len(),
            layout.ni.bytes(),
            segment_size,
            &geometry,
            |seg| match init_ni(seg, &layout) {
                Ok(init) => {
                    made = Some(Ok(init));
                    Ok(())
                }
                Err(e) => {
                    made = Some(Err(e));
                    // Only stops `connect`: the typed error kept in `made` is the one returned.
                    Err(am_nic::SetupError::Config(
                        "the NI could not be set up".into(),
                    ))
                }
            },
        );
        let (init, joined) = match (made, joined) {
            (Some(Err(e)), _) => return Err(e),
            (_, Err(e)) => return Err(setup_error(e)),
            (Some(Ok(init)), Ok(joined)) => (init, joined),
            (None, Ok(_)) => unreachable!("am_nic::connect runs `init` before it can succeed"),
        };
        let peers = joined
            .peers
            .into_iter()
            .map(|seg| Peer::new(seg, &layout))
            .collect::<Result<_, _>>()?;
        Ok(Portals::new(
            job.job_id.clone(),
            rank,
            layout,
            config,
            joined.own,
            init,
            peers,
            joined.pids,
        ))
    }

    /// The configuration in use.
    pub fn config(&self) -> &PortalsConfig {
        &self.tx.config
    }

    /// The memory geometry in use.
    pub fn layout(&self) -> &Layout {
        &self.tx.layout
    }

    /// Bytes of this rank's request receive buffers (what the credit policy's budget costs).
    pub fn receive_buffer_bytes(&self) -> u64 {
        (self.tx.layout.request_buffers * self.tx.layout.request_buffer_bytes) as u64
    }

    /// Flow-control counters so far.
    pub fn stats(&self) -> Stats {
        self.tx.stats
    }

    /// This rank's NI: its memory as a NIC sees it, for raw puts and gets between ranks
    /// (`nic(r).put(...)` runs the wire into rank `r`).
    pub fn nic(&self, rank: Rank) -> Option<Nic<'_>> {
        (rank < self.tx.layout.ranks).then(|| self.tx.nic(rank as usize))
    }

    /// The AM segment: a view of this rank's byte area after the send slots.
    fn am_segment(&self) -> Result<SharedBytes<'_>, TransportError> {
        let l = &self.tx.layout;
        self.own.view(self.tx.seg_base, l.segment).map_err(io)
    }

    fn buffer_of(&self, me: MeIndex) -> Option<usize> {
        self.buffers.iter().position(|b| b.me == me)
    }

    /// The sender of an event, if its word names a rank of the job.
    fn sender(&self, initiator: u32) -> Option<usize> {
        (initiator < self.tx.layout.ranks).then_some(initiator as usize)
    }

    /// Request buffer `b`'s offset went past its end (an `Unlink` event said so, saying
    /// `used` bytes were claimed in it, or the owner saw it): out of the match list, and
    /// re-linked once drained. An `Unlink` about a buffer whose offset is not past its end is
    /// ignored (nothing to do); a `used` no walker could have written is reported after the
    /// buffer was handled.
    fn note_exhausted(&mut self, b: usize, used: Option<u64>) -> Result<(), TransportError> {
        let rb = self.buffers[b];
        if rb.exhausted {
            return Ok(());
        }
        let claimed = self.owner.lm_claimed(&self.own, rb.me).map_err(ni_fault)?;
        if claimed < rb.len as u64 {
            return Ok(());
        }
        if self.owner.is_listed(rb.me) {
            self.owner.lm_retire(&self.own, rb.me).map_err(ni_fault)?;
        }
        let used = match used {
            Some(u) => Some(u),
            None => self.owner.lm_used(&self.own, rb.me).map_err(ni_fault)?,
        };
        // The first claim that did not fit (at most a whole message) started where the
        // claims that fit ended: `used` is a multiple of the claim unit, at most the length,
        // and within one message of it.
        let max_claim = ni::lm_len(self.tx.config.max_message) as u64;
        let len = rb.len as u64;
        let plausible = used.filter(|&u| {
            u % ni::LM_ALIGN as u64 == 0 && u <= len && u + max_claim > len && u <= claimed
        });
        let rb = &mut self.buffers[b];
        rb.exhausted = true;
        rb.used = plausible;
        self.stuck = true;
        if plausible.is_some_and(|u| rb.consumed >= u) {
            self.try_relink(b)?;
        }
        match used {
            Some(u) if plausible.is_none() => Err(misbehaved(
                None,
                format_args!(
                    "request buffer {b} unlinked with {u} bytes used (of {len}, {claimed} claimed)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Re-links exhausted request buffer `b` if [`NiOwner::lm_drained`] says every claim in
    /// it was read or belongs to a lost rank.
    fn try_relink(&mut self, b: usize) -> Result<(), TransportError> {
        let me = self.buffers[b].me;
        let drained = self
            .owner
            .lm_drained(&self.own, me, &self.tx.lost)
            .map_err(ni_fault)?;
        match drained {
            Drained::Busy => return Ok(()),
            Drained::NotExhausted => {
                // Its offset was seen past its end, and only a store that is no claim moves
                // it back: a peer rewound it. Push it past the end again, and look again.
                self.owner.lm_exhaust(&self.own, me).map_err(ni_fault)?;
                return Err(misbehaved(
                    None,
                    format_args!("request buffer {b}'s offset was rewound"),
                ));
            }
            Drained::Yes => {}
        }
        self.owner.lm_relink(&self.own, me).map_err(ni_fault)?;
        let rb = &mut self.buffers[b];
        rb.consumed = 0;
        rb.exhausted = false;
        rb.used = None;
        rb.high = 0;
        self.tx.stats.relinked += 1;
        self.stuck = self.buffers.iter().any(|b| b.exhausted);
        self.maybe_enable()
    }

    /// Tries every exhausted buffer again (when idle, or after a rank was lost).
    fn retry_buffers(&mut self) -> Result<(), TransportError> {
        let mut first = Ok(());
        for b in 0..self.buffers.len() {
            if self.buffers[b].exhausted {
                if let Err(e) = self.try_relink(b) {
                    first = first.and(Err(e));
                }
            }
        }
        first
    }

    /// Flow-control recovery: re-enables the request portal entry once a buffer has room.
    /// While it is disabled, a listed buffer whose offset is past its end (its `Unlink`
    /// event was skipped, the queue being full) is noted exhausted here.
    fn maybe_enable(&mut self) -> Result<(), TransportError> {
        let state = self
            .owner
            .pt_state(&self.own, PT_REQUEST)
            .map_err(ni_fault)?;
        if state == ni::PT_ENABLED {
            return Ok(());
        }
        let mut first = if state == ni::PT_DISABLED {
            Ok(())
        } else {
            // Neither enabled nor disabled: a peer's word (walkers refuse it, as disabled).
            Err(misbehaved(
                None,
                format_args!("request portal entry state {state:#x}"),
            ))
        };
        for b in 0..self.buffers.len() {
            let rb = self.buffers[b];
            if !self.owner.is_listed(rb.me) {
                continue;
            }
            let claimed = self.owner.lm_claimed(&self.own, rb.me).map_err(ni_fault)?;
            if claimed < rb.len as u64 {
                return first.and(
                    self.owner
                        .pt_enable(&self.own, PT_REQUEST)
                        .map_err(ni_fault),
                );
            }
            if let Err(e) = self.note_exhausted(b, None) {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// A refusal event (`Dropped`, `PtDisabled`): every so often, check the words walkers
    /// read (a corrupt one makes every put refused, and this owner busy with the refusals).
    fn on_refusal(&mut self) -> Result<(), TransportError> {
        self.refusals += 1;
        if self.refusals % VERIFY_EVERY_REFUSALS == 1 {
            self.owner.verify(&self.own).map_err(ni_fault)?;
        }
        Ok(())
    }

    /// Rank `r` is lost: what was in flight with it is forgotten, a claim of it at the head
    /// of the queue is skipped, and buffers it had claimed space in are re-linked once the
    /// rest is read.
    fn forget(&mut self, r: usize) -> Result<(), TransportError> {
        self.tx.forget(r);
        self.liveness.mark_lost(r);
        self.owner
            .eq_unblock(&self.own, &self.tx.lost)
            .map_err(ni_fault)?;
        self.retry_buffers()
    }

    /// The idle path (every so many empty polls, and each wait): publish the head, end a
    /// wait at the queue's head that cannot end (a lost or forged claim, a corrupt word, a
    /// hole), retry exhausted buffers, re-enable flow control; and after a while without
    /// progress, check every word walkers read and that every peer is alive. Does all of it
    /// whatever fails; returns the first error.
    fn idle_tick(&mut self) -> Result<(), TransportError> {
        let mut first = Ok(());
        let mut note = |r: Result<(), TransportError>| {
            if first.is_ok() {
                first = r;
            }
        };
        note(
            self.owner
                .eq_publish_head(&self.own)
                .map_err(ni_fault)
                .and_then(|()| {
                    self.owner
                        .eq_unblock(&self.own, &self.tx.lost)
                        .map(|_| ())
                        .map_err(ni_fault)
                }),
        );
        note(self.check_buffers());
        if self.stuck {
            note(self.retry_buffers());
        }
        note(self.maybe_enable());
        if self.liveness.due() {
            note(self.owner.verify(&self.own).map_err(ni_fault));
            let departed = self.tx.layout.departed();
            match self.liveness.check_now(&self.own, departed) {
                Ok(found) => {
                    let mut lost = None;
                    for e in found {
                        if let TransportError::PeerLost(r) = e {
                            note(self.forget(r as usize));
                            lost = lost.or(Some(e));
                        } else if let TransportError::PeerDeparted(r) = e {
                            self.departures.push_back(r);
                        } else {
                            // A corrupt abort or departed word, put back.
                            note(Err(e));
                        }
                    }
                    if let Some(e) = lost {
                        // The loss first: the caller must learn it.
                        first = Err(e);
                    }
                }
                Err(e) => first = Err(e),
            }
        }
        first
    }

    /// An event that does not fit the AM mapping, which names its initiator: unless the
    /// owner's words walkers read were corrupt (then the walker wrote where a corrupt entry
    /// told it, and the initiator is not at fault), which the check repairs.
    #[cold]
    fn blame(&mut self, e: TransportError) -> TransportError {
        match self.owner.verify(&self.own) {
            Ok(()) => e,
            Err(c) => misbehaved(None, format_args!("{c}; then {e}")),
        }
    }

    /// The idle look at the request buffers still linked: one whose offset went past its end
    /// without an `Unlink` event (none was posted, or the queue was full) is noted exhausted;
    /// one whose offset is below the end of a message read from it was rewound by a peer (a
    /// store that is no claim): reported, and pushed past its end so that no claim lands on
    /// messages again until it is re-linked.
    fn check_buffers(&mut self) -> Result<(), TransportError> {
        let mut first = Ok(());
        for b in 0..self.buffers.len() {
            let rb = self.buffers[b];
            if rb.exhausted || !self.owner.is_listed(rb.me) {
                continue;
            }
            let claimed = self.owner.lm_claimed(&self.own, rb.me).map_err(ni_fault)?;
            if claimed < rb.high {
                self.owner.lm_exhaust(&self.own, rb.me).map_err(ni_fault)?;
                first = first.and(Err(misbehaved(
                    None,
                    format_args!(
                        "request buffer {b}'s offset was rewound to {claimed} (read up to {})",
                        rb.high
                    ),
                )));
            }
            let claimed = self.owner.lm_claimed(&self.own, rb.me).map_err(ni_fault)?;
            if claimed >= rb.len as u64 {
                if let Err(e) = self.note_exhausted(b, None) {
                    first = first.and(Err(e));
                }
            }
        }
        first
    }

    /// A test's stand-in for liveness finding rank `r` dead (in-process ranks cannot die).
    #[cfg(test)]
    fn declare_lost(&mut self, r: usize) -> Result<(), TransportError> {
        self.forget(r)
    }

    /// An event other than an accepted AM `Put` (decoded and checked here): flow control's
    /// events are handled; a `Put` on the request or reply portal is returned for
    /// [`locate`](Self::locate) to refuse (it carries a failure); anything else is an error.
    #[cold]
    #[inline(never)]
    fn other_event(&mut self, w: [u64; 7]) -> Result<Option<[u64; 7]>, TransportError> {
        let ev = ni::Event::from_words(w).map_err(ni_fault)?;
        match (ev.kind, ev.pt) {
            (EventKind::Put, PT_REQUEST | PT_REPLY) => return Ok(Some(w)),
            (EventKind::Unlink, PT_REQUEST) => match self.buffer_of(ev.me) {
                Some(b) => self.note_exhausted(b, Some(ev.used))?,
                None => {
                    return Err(misbehaved(
                        self.sender(ev.initiator),
                        format_args!("an Unlink event for entry {}", ev.me),
                    ))
                }
            },
            (EventKind::PtDisabled, PT_REQUEST) => {
                self.tx.stats.disabled += 1;
                let checked = self.on_refusal();
                self.maybe_enable().and(checked)?
            }
            (EventKind::Dropped, _) => self.on_refusal()?,
            (k, pt) => {
                return Err(misbehaved(
                    self.sender(ev.initiator),
                    format_args!("an unexpected {k:?} event on portal {pt}"),
                ))
            }
        }
        Ok(None)
    }

    /// Checks the words `w` of an AM's `Put` event (on the request portal if `is_request`,
    /// else the reply portal) against what the mapping writes, and where its message is:
    /// `(Some(start), len, buffer)` deposited at `start` of the byte area (in request buffer
    /// `buffer`), or `(None, len, None)` rebuilt into `scratch`. The words are a private copy
    /// (see `Event::words` for their layout); each is checked before use.
    #[inline(always)]
    fn locate(
        &mut self,
        w: [u64; 7],
        is_request: bool,
        src: usize,
    ) -> Result<(Option<usize>, usize, Option<usize>), TransportError> {
        let l = &self.tx.layout;
        let [w0, match_bits, hdr_data, start, w4, remote_offset, used] = w;
        let (mlen, me) = (w4 as u32 as usize, (w4 >> 32) as MeIndex);
        if match_bits >> 48 != AM_TAG || (w0 >> 8) as u8 != NiFail::Ok as u8 || used != 0 {
            return Err(bad_event(&w, src, "event"));
        }
        let slot = (match_bits >> 32) as u16 as usize;
        if slot >= l.send_slots {
            return Err(bad_event(&w, src, "send slot"));
        }
        let want_offset = if is_request {
            0
        } else {
            slot as u64 * l.slot_bytes as u64
        };
        if remote_offset != want_offset {
            return Err(bad_event(&w, src, "remote offset"));
        }
        if mlen == 0 {
            // Inline: the head's first four bytes, no payload length, two arguments at most
            // (and nothing in the header data beyond them).
            let nargs = (match_bits >> 16) as u8 as usize;
            if nargs > 2 || (nargs < 2 && hdr_data >> (32 * nargs) != 0) {
                return Err(bad_event(&w, src, "inline message"));
            }
            self.scratch[..8].copy_from_slice(&(match_bits as u32 as u64).to_le_bytes());
            self.scratch[8..].copy_from_slice(&hdr_data.to_le_bytes());
            return Ok((None, 8 + 4 * nargs, None));
        }
        if hdr_data != 0 || mlen > self.tx.config.max_message {
            return Err(bad_event(&w, src, "message"));
        }
        let (lo, hi, buffer) = if is_request {
            let Some(b) = self.buffer_of(me) else {
                return Err(bad_event(&w, src, "request buffer"));
            };
            let rb = &self.buffers[b];
            (rb.start as u64, (rb.start + rb.len) as u64, Some(b))
        } else {
            if me != self.reply_me {
                return Err(bad_event(&w, src, "reply entry"));
            }
            let s = (l.send_base() + slot * l.slot_bytes) as u64;
            (s, s + l.slot_bytes as u64, None)
        };
        // Inside the buffer (or the send slot), at a claim boundary, with checked ends.
        let in_range = start >= lo
            && (start - lo).is_multiple_of(ni::LM_ALIGN as u64)
            && start.checked_add(mlen as u64).is_some_and(|end| end <= hi);
        if !in_range || (!is_request && start != lo) {
            return Err(bad_event(&w, src, "message range"));
        }
        Ok((Some(start as usize), mlen, buffer))
    }
}

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

impl Transport for Portals {
    fn name(&self) -> &'static str {
        "portals"
    }

    fn rank(&self) -> Rank {
        self.tx.rank
    }

    fn size(&self) -> u32 {
        self.tx.layout.ranks
    }

    fn limits(&self) -> Limits {
        Limits {
            max_args: am_core::wire::MAX_ARGS,
            max_medium: self.tx.config.max_message - am_core::wire::MAX_HEAD_LEN,
            max_long: self.tx.config.max_long,
            max_credits: self.tx.config.credits.max_per_peer().min(255),
        }
    }

    /// The credits the receive buffers were sized for ([`PortalsConfig::credits`]).
    fn default_credits(&self) -> am_core::Credits {
        self.tx.config.credits
    }

    /// `PtlPut` into the target's segment entry ([`Nic::put`]), with no event there (the
    /// entry disables them): the deposit is done when this returns, which stands for the
    /// `Ack` a real initiator would wait for.
    fn put(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<(), SendError> {
        let d = self.reachable(dest)?;
        let args = PutArgs {
            pt: PT_SEGMENT,
            match_bits: 0,
            hdr_data: 0,
            remote_offset: offset as u64,
            data: &[data],
            shared: None,
            ack: false,
            send_event: false,
            pad: false,
        };
        match self.tx.nic(d).put(self.tx.rank, None, &args) {
            Ok(Outcome::Done { .. }) => Ok(()),
            Ok(Outcome::Refused(f)) => Err(SendError::device(format!(
                "portals: rank {dest}'s segment entry refused a put of {} bytes at {offset}: {f:?}",
                data.len()
            ))),
            Err(e) => Err(self.tx.put_err(e)),
        }
    }

    /// `PtlGet` from the target's segment entry ([`Nic::get`]) straight into `dst` (the
    /// seed's "get into a temporary MD" when the local side is outside the segment): done
    /// when this returns, which stands for the `Reply` event.
    fn get(&mut self, src: Rank, offset: usize, dst: &mut [u8]) -> Result<(), SendError> {
        let d = self.reachable(src)?;
        let len = dst.len();
        match self
            .tx
            .nic(d)
            .get(self.tx.rank, None, PT_SEGMENT, 0, offset as u64, dst)
        {
            Ok(Outcome::Done { .. }) => Ok(()),
            Ok(Outcome::Refused(f)) => Err(SendError::device(format!(
                "portals: rank {src}'s segment entry refused a get of {len} bytes at {offset}: {f:?}"
            ))),
            Err(e) => Err(self.tx.put_err(e)),
        }
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

    /// Puts, gets and atomics through the peers' segment entries. The initiator's process
    /// performs the segment entry's deposit before the header goes: a Long has landed once
    /// `try_send` returned. A reply may answer several requests of its peer: it lands in the
    /// send slot of the latest, and the requester frees that slot and those of its earlier
    /// requests to the replier (replies come in request order).
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.put = true;
        caps.get = true;
        caps.atomics = true;
        caps.long_placed_below = usize::MAX;
        caps.acks_coalesce = true;
        caps
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
        if quiet {
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

#[cfg(test)]
mod tests;

#[cfg(test)]
mod hostile;
