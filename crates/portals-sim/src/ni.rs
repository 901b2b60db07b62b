//! The Portals network interface of one rank, in that rank's shared memory.
//!
//! Everything a Portals NIC keeps at the target lives in the target's exported segment, so
//! that the **wire** (the initiator's process, see the [crate docs](crate)) can do the
//! target NIC's work on it: walk the match list, claim space, deposit, post the event.
//!
//! ```text
//! word area (atomics only)
//!   line 0            EQ doorbell (futex word), then the words a producer reads to claim
//!                     a slot, on this one line: the waiting word (the owner may sleep), the
//!                     EQ head (published by the owner, lazily: every quarter ring, and idle)
//!                     and the EQ tail (a hint of the next free ticket, stored by producers)
//!   line 1            abort word (a rank that panicked sets it)
//!   NPT lines         portal table: state (enabled/disabled), list head, options
//!   departed words    one per rank, set by a rank that ends cleanly
//!   ranks lines       sender records, one line per rank, written only by that rank as an
//!                     initiator: word 0 its event-queue claim (ACTIVE | the lowest ticket it
//!                     may claim), word 1 the locally managed entry it may be claiming space
//!                     in (ACTIVE | index + 1)
//!   max_me × 2 lines  match entries: line 0 = state+generation, match bits, ignore bits,
//!                     options, start, length, next; line 1 = locally managed offset, used
//!   eq_capacity lines event queue slots: sequence word, then the event's seven words
//! byte area
//!   whatever the owner describes with match entries (receive buffers, segment, ...)
//! ```
//!
//! # Event queue
//! Ticket `t` uses slot `t % eq_capacity`. A slot's sequence word holds, for ticket `t`:
//!
//! ```text
//! free       t + 1 - eq_capacity  (what the previous lap left; 0 in zeroed memory, lap 0)
//! CLAIMED    bit 63 | claimer << 31 | (t + 1) mod 2^31
//! published  t + 1
//! ```
//!
//! A producer (any rank's wire) **claims** ticket `t` with one compare-and-swap of the
//! slot's sequence word from its free value, which it computes without a load, to
//! `CLAIMED(t, claimer)`: the claim and its claimer are one atomic step. It first checks
//! `t < head + eq_capacity` against the owner's published head (so the slot's previous
//! event was read), and before its first claim it stores `ACTIVE | t` into its sender
//! record, so that the owner can tell a claim that rank really holds from a sequence word
//! forged in its name. It then stores the event's words and **publishes** with a `Release`
//! store of `t + 1`; the owner reads slots in ticket order. The tail word is only a hint of
//! where to start (a producer that finds a slot taken moves on to the next), so a stale or
//! corrupt tail costs a walk, never an overwrite.
//!
//! The owner never waits for ever at its head ([`NiOwner::eq_unblock`]): a slot `CLAIMED`
//! by a rank that was lost, by a rank that is not in the job, or by one whose record does
//! not vouch for the claim is taken over (a compare-and-swap to its published value, so
//! the next lap finds it free) and skipped; a sequence word no producer writes is repaired
//! the same way and reported; a free slot below claimed ones (a hole, left by a corrupt
//! tail) is skipped.
//!
//! A producer rings the doorbell only if the owner announced that it may sleep (see
//! [`NiOwner::announce_wait`]): a spinning owner costs its producers no atomic on its lines
//! and no fence beyond the claim.
//!
//! # Match lists and locally managed offsets
//! Match entries are read under a seqlock (state word before and after), so a walker never
//! acts on a torn entry; use-once entries are taken with a CAS of their state, locally
//! managed space with a `fetch_add` of the entry's offset. The owner rewrites an entry only
//! under a new state word (a new generation), so a rank's wire keeps what it read and
//! checked of each entry with the state word it was read under, and while that word is
//! unchanged reads only it (see `MeSeen`). Only the owner changes the list
//! structure; a walker that races a re-link may end its walk early, which at worst disables
//! the portal entry spuriously (the initiator then sends again after the owner re-enables
//! it: nothing is lost).
//!
//! A walker that wants an event reserves its event slot **before** it takes any space
//! (reserve-first), so that a full event queue refuses the put with no side effect at the
//! target (no space claimed, no use-once entry taken); and before it claims locally managed
//! space it stores the entry into its sender record (released after its event is
//! published). That makes every claim attributable: the owner re-links an exhausted buffer
//! ([`NiOwner::lm_drained`]) once no live rank's record names it while that rank holds a
//! claimed slot, and no event about it is waiting in the queue. Bytes a dead rank claimed
//! are then simply never read; no count of bytes written by peers (`used`, an event's
//! length) decides a re-link.

use am_shm::sync::{fence, AtomicU64, Ordering};

use am_shm::{Imported, Segment, SharedBytes, ShmError, WordRun, CACHE_LINE};

/// Portal table entries per NI.
pub const NPT: usize = 4;
/// Portal index of the AM request receive buffers.
pub const PT_REQUEST: u8 = 0;
/// Portal index of the send slots (where replies land).
pub const PT_REPLY: u8 = 1;
/// Portal index of the registered segment (Long payloads).
pub const PT_SEGMENT: u8 = 2;
/// Portal index left to raw users of the NI.
pub const PT_USER: u8 = 3;

pub(crate) const DOORBELL: usize = 0;
/// Nonzero while the owner may sleep on the doorbell (beside it: read with the ring's line).
pub(crate) const WAITING: usize = 8;
/// Offset of the abort word.
pub const ABORT: usize = CACHE_LINE;
/// The head and the tail, on the waiting word's line: a claim reads one line of them (the
/// owner writes the head only every quarter ring, the waiting word only to sleep).
pub(crate) const EQ_HEAD: usize = 16;
pub(crate) const EQ_TAIL: usize = 24;
const PT_BASE: usize = 2 * CACHE_LINE;
const ME_BYTES: usize = 2 * CACHE_LINE;
/// Offset of an entry's `next` link (word 6 of its first line).
const ME_NEXT: usize = 48;
const EVENT_BYTES: usize = CACHE_LINE;
/// Words per cache line: a match entry's first line, an event slot, a portal entry.
const LINE_WORDS: usize = CACHE_LINE / 8;
type Line = [AtomicU64; LINE_WORDS];

/// A sender record (or a slot sequence word) in use.
pub(crate) const ACTIVE: u64 = 1 << 63;
/// Word of a sender record: the event-queue claim.
const REC_EQ: usize = 0;
/// Word of a sender record: the locally managed entry.
const REC_LM: usize = 1;

/// Bit 63 of a slot's sequence word: claimed, not yet published.
const SEQ_CLAIMED: u64 = 1 << 63;
/// Bits of the ticket kept in a `CLAIMED` sequence word (below the claimer).
const SEQ_TICKET_BITS: u32 = 31;
const SEQ_TICKET_MASK: u64 = (1 << SEQ_TICKET_BITS) - 1;

/// The sequence word of published ticket `t` (also the free value of ticket `t + capacity`).
#[inline(always)]
pub(crate) fn seq_published(t: u64) -> u64 {
    t.wrapping_add(1) & !SEQ_CLAIMED
}

/// The sequence word of ticket `t`'s slot while it is free for `t`.
#[inline(always)]
pub(crate) fn seq_free(t: u64, cap: u64) -> u64 {
    if t < cap {
        0
    } else {
        seq_published(t - cap)
    }
}

/// The sequence word of ticket `t` claimed by `claimer`.
#[inline(always)]
pub(crate) fn seq_claimed(t: u64, claimer: u32) -> u64 {
    SEQ_CLAIMED | (claimer as u64) << SEQ_TICKET_BITS | (t.wrapping_add(1) & SEQ_TICKET_MASK)
}

/// Whether `v` is ticket `t`'s `CLAIMED` value (by anyone).
#[inline(always)]
fn seq_is_claimed(v: u64, t: u64) -> bool {
    v & SEQ_CLAIMED != 0 && (v ^ t.wrapping_add(1)) & SEQ_TICKET_MASK == 0
}

/// What a slot's sequence word says about ticket `t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SlotState {
    /// Free: nobody claimed ticket `t` yet.
    Empty,
    /// Claimed by this rank, not yet published.
    Claimed(u32),
    /// Published: the event can be read.
    Published,
    /// A value no producer writes for ticket `t` (a corrupt word).
    Corrupt(u64),
}

#[inline(always)]
fn seq_state(v: u64, t: u64, cap: u64) -> SlotState {
    if v == seq_published(t) {
        SlotState::Published
    } else if v == seq_free(t, cap) {
        SlotState::Empty
    } else if seq_is_claimed(v, t) {
        SlotState::Claimed(((v & !SEQ_CLAIMED) >> SEQ_TICKET_BITS) as u32)
    } else {
        SlotState::Corrupt(v)
    }
}

/// The cache line at byte `off` of `seg`'s word area, bounds-checked once for all its words.
#[inline(always)]
fn line(seg: &Segment, off: usize) -> Result<&Line, NiError> {
    words(seg, off)
}

/// `N` words from byte `off` of `seg`'s word area as an array: one bounds check, and none
/// at each index.
#[inline(always)]
fn words<const N: usize>(seg: &Segment, off: usize) -> Result<&[AtomicU64; N], NiError> {
    match seg.words(off, N)?.try_into() {
        Ok(a) => Ok(a),
        Err(_) => Err(short_run(off)),
    }
}

#[cold]
fn short_run(off: usize) -> NiError {
    NiError::Invalid(format!("a run of words at {off}"))
}

/// Word offsets in the run from `WAITING` that `Nic::eq_reserve` reads.
const Q_HEAD: usize = (EQ_HEAD - WAITING) / 8;
const Q_TAIL: usize = (EQ_TAIL - WAITING) / 8;
const Q_WORDS: usize = Q_TAIL + 1;

pub(crate) const PT_ENABLED: u64 = 1;
pub(crate) const PT_DISABLED: u64 = 2;
/// Portal-entry option: flow control (an entry with no room disables the portal entry).
const PT_FLOWCTRL: u64 = 1;

const ME_FREE: u64 = 0;
const ME_LINKED: u64 = 1;
const ME_UNLINKED: u64 = 2;
const ME_WRITING: u64 = 3;
/// `used` word of an LM entry that still has room.
const NOT_USED: u64 = u64::MAX;

/// Longest match-list walk before the walker gives up (a list the owner keeps re-linking).
fn walk_limit(max_me: u32) -> u32 {
    2 * max_me + 4
}

/// Locally managed offsets are claimed in units of this many bytes.
pub const LM_ALIGN: usize = 8;

/// Rounds a message length up to the locally managed claim unit.
#[inline]
pub fn lm_len(len: usize) -> usize {
    len.div_ceil(LM_ALIGN) * LM_ALIGN
}

/// Why an NI operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NiError {
    /// A word read from shared memory is out of range (a corrupt or hostile segment).
    #[error("corrupt NI field {what}: {value:#x}")]
    Corrupt {
        /// The field.
        what: &'static str,
        /// The value read.
        value: u64,
    },
    /// A shared-memory access failed (out of bounds). Boxed: keeps the hot path's results small.
    #[error("shared memory: {0}")]
    Shm(Box<ShmError>),
    /// An invalid argument from the caller (portal index, range, ...).
    #[error("invalid NI argument: {0}")]
    Invalid(String),
    /// No free match-entry record.
    #[error("no free match entry (all {0} in use)")]
    NoFreeEntry(u32),
}

impl From<ShmError> for NiError {
    #[cold]
    fn from(e: ShmError) -> Self {
        NiError::Shm(Box::new(e))
    }
}

#[cold]
fn bad_rank(r: u32, ranks: u32) -> NiError {
    NiError::Invalid(format!("rank {r} of a job of {ranks}"))
}

#[cold]
fn corrupt(what: &'static str, value: u64) -> NiError {
    NiError::Corrupt { what, value }
}

/// The geometry of one rank's NI memory; every rank of a job uses the same. Made by
/// [`NiGeometry::new`], which checks it and computes the offsets once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NiGeometry {
    ranks: u32,
    max_me: u32,
    eq_capacity: u32,
    bytes: usize,
    rec_base: usize,
    me_base: usize,
    eq_base: usize,
    /// The same three, in lines from the portal table.
    rec_line: usize,
    me_line: usize,
    eq_line: usize,
}

impl NiGeometry {
    /// `ranks` ranks (a departed word and a sender record each), `max_me` match-entry
    /// records (1..=65536), `eq_capacity` event-queue slots (a power of two, 8..=2^22) and a
    /// byte area of `bytes`.
    pub fn new(
        ranks: u32,
        max_me: u32,
        eq_capacity: u32,
        bytes: usize,
    ) -> Result<NiGeometry, NiError> {
        if !eq_capacity.is_power_of_two() || !(8..=1 << 22).contains(&eq_capacity) {
            return Err(NiError::Invalid(format!(
                "event queue of {eq_capacity} slots (a power of two, 8..=2^22)"
            )));
        }
        if max_me == 0 || max_me > 1 << 16 {
            return Err(NiError::Invalid(format!(
                "{max_me} match entries (1..=65536)"
            )));
        }
        if ranks == 0 || ranks > 1 << 24 {
            return Err(NiError::Invalid(format!("{ranks} ranks (1..=2^24)")));
        }
        let departed_base = PT_BASE + NPT * CACHE_LINE;
        let rec_base = departed_base + (ranks as usize * 8).div_ceil(CACHE_LINE) * CACHE_LINE;
        let me_base = rec_base + ranks as usize * CACHE_LINE;
        let eq_base = me_base + max_me as usize * ME_BYTES;
        let line = |off: usize| (off - PT_BASE) / CACHE_LINE;
        Ok(NiGeometry {
            ranks,
            max_me,
            eq_capacity,
            bytes,
            rec_base,
            me_base,
            eq_base,
            rec_line: line(rec_base),
            me_line: line(me_base),
            eq_line: line(eq_base),
        })
    }

    /// Ranks of the job.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// Match-entry records.
    pub fn max_me(&self) -> u32 {
        self.max_me
    }

    /// Event-queue slots.
    pub fn eq_capacity(&self) -> u32 {
        self.eq_capacity
    }

    /// Bytes of the byte area.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Bytes of the word area.
    pub fn words_len(&self) -> usize {
        self.eq_base + self.eq_capacity as usize * EVENT_BYTES
    }

    /// Bytes of the event queue (part of the word area).
    pub fn eq_bytes(&self) -> usize {
        self.eq_capacity as usize * EVENT_BYTES
    }

    /// Offset of rank `r`'s departed word.
    pub fn departed(&self, r: usize) -> usize {
        PT_BASE + NPT * CACHE_LINE + 8 * r
    }

    /// Offset of rank `r`'s sender record (a cache line only `r` writes).
    #[inline]
    pub fn record(&self, r: u32) -> Result<usize, NiError> {
        if r >= self.ranks {
            return Err(bad_rank(r, self.ranks));
        }
        Ok(self.rec_base + r as usize * CACHE_LINE)
    }

    pub(crate) fn pt(&self, pt: u8) -> Result<usize, NiError> {
        if pt as usize >= NPT {
            return Err(NiError::Invalid(format!("portal index {pt} (0..{NPT})")));
        }
        Ok(PT_BASE + pt as usize * CACHE_LINE)
    }

    pub(crate) fn me(&self, idx: u32) -> Result<usize, NiError> {
        if idx >= self.max_me {
            return Err(corrupt("match entry index", idx as u64));
        }
        Ok(self.me_base + idx as usize * ME_BYTES)
    }

    /// Offset of the slot of ticket `seq`.
    pub fn eq_slot(&self, seq: u64) -> usize {
        self.eq_base + (seq & (self.eq_capacity as u64 - 1)) as usize * EVENT_BYTES
    }
}

/// Options of a match entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MeOptions {
    /// Accepts puts.
    pub put: bool,
    /// Accepts gets.
    pub get: bool,
    /// Unlinked by the first operation that matches it (an `Unlink` event follows).
    pub use_once: bool,
    /// Locally managed offset: incoming puts are packed back to back (in [`LM_ALIGN`] units)
    /// and the initiator's offset is ignored; a put that does not fit unlinks the entry
    /// (`Unlink` event with the bytes used) and goes on to the next entry. Such an entry
    /// posts events (it cannot be combined with `event_disable`): its owner re-links it by
    /// them.
    pub manage_local: bool,
    /// No `Put`/`Get` event on success (the AM segment: the header message notifies).
    pub event_disable: bool,
}

/// Bits of an entry's options word (see [`MeOptions::encode`]).
const OPT_PUT: u64 = 1;
const OPT_GET: u64 = 2;
const OPT_USE_ONCE: u64 = 4;
const OPT_MANAGE_LOCAL: u64 = 8;
const OPT_EVENT_DISABLE: u64 = 16;

impl MeOptions {
    fn encode(&self, pt: u8) -> u64 {
        let bit = |on: bool, b: u64| if on { b } else { 0 };
        bit(self.put, OPT_PUT)
            | bit(self.get, OPT_GET)
            | bit(self.use_once, OPT_USE_ONCE)
            | bit(self.manage_local, OPT_MANAGE_LOCAL)
            | bit(self.event_disable, OPT_EVENT_DISABLE)
            | (pt as u64) << 8
    }
}

/// A match entry as its owner appends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MeSpec {
    /// Match bits.
    pub match_bits: u64,
    /// Bits of the incoming match bits that are not compared.
    pub ignore_bits: u64,
    /// Start of the entry's memory in the byte area.
    pub start: usize,
    /// Length of the entry's memory.
    pub length: usize,
    /// Options.
    pub options: MeOptions,
}

impl MeSpec {
    /// The five words of the entry's first line after its state, as walkers read them.
    fn words(&self, pt: u8) -> [u64; 5] {
        [
            self.match_bits,
            self.ignore_bits,
            self.options.encode(pt),
            self.start as u64,
            self.length as u64,
        ]
    }
}

/// Type of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum EventKind {
    /// Target: a put was deposited.
    Put = 1,
    /// Target: a get read this NI's memory.
    Get = 2,
    /// Initiator: the put left (its memory descriptor may be reused).
    Send = 3,
    /// Initiator: the target accepted (or, with `fail`, refused) the put.
    Ack = 4,
    /// Initiator: a get's data arrived.
    Reply = 5,
    /// Target: a use-once entry was consumed, or a locally managed one ran out of space
    /// (`used` bytes were claimed in it).
    Unlink = 6,
    /// Target: a put found no room and flow control disabled the portal entry.
    PtDisabled = 7,
    /// Target: a reserved slot whose put was refused (nothing to do).
    Dropped = 8,
    /// Target: an atomic read and wrote this NI's memory.
    Atomic = 9,
}

impl EventKind {
    fn from_u8(b: u8) -> Option<EventKind> {
        Some(match b {
            1 => EventKind::Put,
            2 => EventKind::Get,
            3 => EventKind::Send,
            4 => EventKind::Ack,
            5 => EventKind::Reply,
            6 => EventKind::Unlink,
            7 => EventKind::PtDisabled,
            8 => EventKind::Dropped,
            9 => EventKind::Atomic,
            _ => return None,
        })
    }
}

/// Why the target refused an operation (Portals' `ni_fail_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NiFail {
    /// Accepted.
    Ok = 0,
    /// The portal entry is disabled (flow control): send again after it is re-enabled.
    PtDisabled = 1,
    /// No entry matched (and the portal entry has no flow control).
    NoMatch = 2,
    /// The target's event queue has no free slot: nothing happened, send again.
    EqFull = 3,
}

impl NiFail {
    fn from_u8(b: u8) -> Option<NiFail> {
        Some(match b {
            0 => NiFail::Ok,
            1 => NiFail::PtDisabled,
            2 => NiFail::NoMatch,
            3 => NiFail::EqFull,
            _ => return None,
        })
    }
}

/// Index of a match-entry record.
pub type MeIndex = u32;
/// `Event::me` when the event concerns no entry.
pub const NO_ME: MeIndex = u32::MAX;

/// An event, as read from an event queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Type.
    pub kind: EventKind,
    /// Failure (for `Ack`; `Ok` otherwise).
    pub fail: NiFail,
    /// Portal index.
    pub pt: u8,
    /// The initiating rank.
    pub initiator: u32,
    /// Match bits of the operation.
    pub match_bits: u64,
    /// Header data of a put.
    pub hdr_data: u64,
    /// Where the data is in this NI's byte area (target events), 0 otherwise.
    pub start: u64,
    /// Bytes moved.
    pub mlength: u32,
    /// The match entry, or [`NO_ME`].
    pub me: MeIndex,
    /// The offset the initiator asked for.
    pub remote_offset: u64,
    /// `Unlink` of a locally managed entry: bytes claimed in it.
    pub used: u64,
}

impl Event {
    pub(crate) fn new(kind: EventKind, initiator: u32, pt: u8) -> Event {
        Event {
            kind,
            fail: NiFail::Ok,
            pt,
            initiator,
            match_bits: 0,
            hdr_data: 0,
            start: 0,
            mlength: 0,
            me: NO_ME,
            remote_offset: 0,
            used: 0,
        }
    }

    pub(crate) fn words(&self) -> [u64; 7] {
        [
            self.kind as u64
                | (self.fail as u64) << 8
                | (self.pt as u64) << 16
                | (self.initiator as u64) << 32,
            self.match_bits,
            self.hdr_data,
            self.start,
            self.mlength as u64 | (self.me as u64) << 32,
            self.remote_offset,
            self.used,
        ]
    }

    /// Decodes a private copy of an event's words (never the shared original).
    #[inline]
    pub(crate) fn from_words(w: [u64; 7]) -> Result<Event, NiError> {
        let Some(kind) = EventKind::from_u8(w[0] as u8) else {
            return Err(corrupt("event kind", w[0]));
        };
        let Some(fail) = NiFail::from_u8((w[0] >> 8) as u8) else {
            return Err(corrupt("event failure", w[0]));
        };
        let pt = (w[0] >> 16) as u8;
        if pt as usize >= NPT || (w[0] >> 24) as u8 != 0 {
            return Err(corrupt("event portal index", w[0]));
        }
        Ok(Event {
            kind,
            fail,
            pt,
            initiator: (w[0] >> 32) as u32,
            match_bits: w[1],
            hdr_data: w[2],
            start: w[3],
            mlength: w[4] as u32,
            me: (w[4] >> 32) as u32,
            remote_offset: w[5],
            used: w[6],
        })
    }
}

/// A put, as the initiator describes it (its memory descriptor is `data`, gathered).
#[derive(Debug, Clone, Copy)]
pub struct PutArgs<'a> {
    /// Portal index at the target.
    pub pt: u8,
    /// Match bits.
    pub match_bits: u64,
    /// Header data (64 bits delivered in the target's event).
    pub hdr_data: u64,
    /// Offset in the matched entry (ignored by locally managed entries).
    pub remote_offset: u64,
    /// The data, in pieces sent back to back.
    pub data: &'a [&'a [u8]],
    /// Bytes in shared memory sent after `data` (a received payload echoed or forwarded):
    /// they move straight from where they lie, with no private copy in between.
    pub shared: Option<SharedBytes<'a>>,
    /// Ask for an `Ack` event at the initiator.
    pub ack: bool,
    /// Ask for a `Send` event at the initiator.
    pub send_event: bool,
    /// The initiator owns the target's bytes from its offset up to the next 8-byte boundary
    /// past its data (a slot reserved for it, such as a send slot its reply goes to): the
    /// deposit is then made of whole-word stores, zero-padded, with no read-modify-write of
    /// a shared word. Used only where the padded run is 8-aligned and stays inside the
    /// matched entry. (Space claimed in a locally managed entry is always the initiator's,
    /// whole units of [`LM_ALIGN`] bytes.)
    pub pad: bool,
}

/// What became of an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Matched entry `me`; the data is at `start` of the target's byte area.
    Done {
        /// The entry.
        me: MeIndex,
        /// Where the data landed (put) or was read from (get).
        start: u64,
    },
    /// Refused; nothing was deposited.
    Refused(NiFail),
}

/// One rank's NI memory as a NIC sees it: the owner's own view, or a peer's mapped with full
/// access ([`Segment::share`], or its owner's handle mapped by `am_nic::connect`). `imp`
/// must be a writer's view of `seg`.
#[derive(Clone, Copy)]
pub struct Nic<'a> {
    seg: &'a Segment,
    imp: &'a Imported,
    geo: &'a NiGeometry,
    /// The word area's parts (empty where the segment is smaller than the geometry: every
    /// access there is then an error).
    parts: Parts<'a>,
}

/// A match entry's two lines: the entry, then its locally managed offset and `used` word.
type MeLines = [AtomicU64; 2 * LINE_WORDS];

/// An NI's word area as a walker reaches it: the waiting word, head and tail, and every line
/// from the portal table on, cut by [`Nic::new`] (checked against the segment) or from kept
/// runs ([`Nic::with_runs`]); an access is then one index, at a line the geometry gives, with
/// no alignment check.
#[derive(Clone, Copy)]
struct Parts<'a> {
    /// The waiting word, the head and the tail (the run from `WAITING`).
    q: &'a [AtomicU64],
    /// Every line from the portal table on (portal entries, departed words, sender
    /// records, match entries, event slots), at the lines the geometry gives.
    lines: &'a [Line],
    geo: &'a NiGeometry,
}

impl<'a> Parts<'a> {
    /// The parts of the NI of geometry `geo` in `seg`, checked here; a part the segment does
    /// not hold is empty (its accesses are errors).
    fn new(seg: &'a Segment, geo: &'a NiGeometry) -> Parts<'a> {
        Parts {
            q: seg.words(WAITING, Q_WORDS).unwrap_or(&[]),
            lines: seg
                .words(PT_BASE, (geo.words_len() - PT_BASE) / 8)
                .unwrap_or(&[])
                .as_chunks()
                .0,
            geo,
        }
    }

    /// The parts of runs cut at start-up: no check at all (an index into each is the only
    /// one, where it is used).
    #[inline(always)]
    fn of(runs: &'a NiRuns, geo: &'a NiGeometry) -> Parts<'a> {
        Parts {
            q: runs.q.words(),
            lines: runs.lines.words().as_chunks().0,
            geo,
        }
    }

    /// The waiting word, the head and the tail.
    #[inline(always)]
    fn q(&self) -> Result<&'a [AtomicU64; Q_WORDS], NiError> {
        match self.q.first_chunk() {
            Some(q) => Ok(q),
            None => Err(short_run(WAITING)),
        }
    }

    #[inline(always)]
    fn line(&self, i: usize) -> Result<&'a Line, NiError> {
        match self.lines.get(i) {
            Some(l) => Ok(l),
            None => Err(short_run(i)),
        }
    }

    /// The slot of ticket `t` (masked: the queue's length is a power of two).
    #[inline(always)]
    fn slot(&self, t: u64) -> Result<&'a Line, NiError> {
        self.line(self.geo.eq_line + (t as usize & (self.geo.eq_capacity as usize - 1)))
    }

    /// Portal entry `pt`'s line.
    #[inline(always)]
    fn pt(&self, pt: u8) -> Result<&'a Line, NiError> {
        if pt as usize >= NPT {
            return Err(bad_pt(pt));
        }
        self.line(pt as usize)
    }

    /// Match entry `idx` (an index beyond the geometry is a corrupt one).
    #[inline(always)]
    fn me(&self, idx: MeIndex) -> Result<&'a MeLines, NiError> {
        if idx >= self.geo.max_me {
            return Err(corrupt("match entry index", idx as u64));
        }
        let i = self.geo.me_line + 2 * idx as usize;
        match self.lines.get(i..i + 2) {
            Some(l) => l.as_flattened().try_into().map_err(|_| short_run(i)),
            None => Err(short_run(i)),
        }
    }

    /// Rank `r`'s sender record (one line per rank of the job).
    #[inline(always)]
    fn record(&self, r: u32) -> Result<&'a Line, NiError> {
        if r >= self.geo.ranks {
            return Err(bad_rank(r, self.geo.ranks));
        }
        self.line(self.geo.rec_line + r as usize)
    }
}

/// The runs of one NI's word area that a wire reaches on every operation (see [`Nic`]),
/// checked and cut once, when a peer's memory is mapped: a [`Nic`] made
/// [`with`](Nic::with_runs) them reaches every word with one index (at a line the geometry
/// gives) and no further check.
#[derive(Debug, Clone)]
pub struct NiRuns {
    q: WordRun,
    lines: WordRun,
}

impl NiRuns {
    /// The runs of the NI of geometry `geo` in `seg`.
    pub fn new(seg: &Segment, geo: &NiGeometry) -> Result<NiRuns, NiError> {
        Ok(NiRuns {
            q: seg.word_run(WAITING, Q_WORDS)?,
            lines: seg.word_run(PT_BASE, (geo.words_len() - PT_BASE) / 8)?,
        })
    }
}

#[cold]
fn bad_pt(pt: u8) -> NiError {
    NiError::Invalid(format!("portal index {pt} (0..{NPT})"))
}

/// A claimed event slot, and whether its owner must be woken once it is published.
#[derive(Debug, Clone, Copy)]
struct Claim {
    seq: u64,
    ring: bool,
}

/// The claims of one initiator in one NI during one operation, and its sender record
/// there: written before each claim, cleared (after every claimed slot was published) when
/// the operation ends, also on an error path (`Drop`).
struct Claimer<'n, 'a> {
    nic: &'n Nic<'a>,
    rank: u32,
    rec: &'a [AtomicU64; 2],
    /// The lowest ticket recorded as claimable, if recorded.
    eq_from: Option<u64>,
    /// The value stored in the record's locally managed word (0: none).
    lm: u64,
    /// The operation's own event slot, until published.
    slot: Option<Claim>,
    /// Test hook: the rank "died" here, nothing more is written.
    #[cfg(test)]
    dead: bool,
}

impl<'n, 'a> Claimer<'n, 'a> {
    #[inline(always)]
    fn new(nic: &'n Nic<'a>, rank: u32) -> Result<Claimer<'n, 'a>, NiError> {
        // One line per rank of the job: the index is the rank check.
        let Some(rec) = nic.parts().record(rank)?.first_chunk::<2>() else {
            return Err(short_run(0));
        };
        Ok(Claimer {
            nic,
            rank,
            rec,
            eq_from: None,
            lm: 0,
            slot: None,
            #[cfg(test)]
            dead: false,
        })
    }

    /// Records that ticket `t` and later ones may be claimed (before claiming `t`).
    #[inline(always)]
    fn record_eq(&mut self, t: u64) {
        if self.eq_from.is_none_or(|from| t < from) {
            // Relaxed: the claim's compare-and-swap (SeqCst) orders it before the claim.
            self.rec[REC_EQ].store(ACTIVE | (t & !ACTIVE), Ordering::Relaxed);
            self.eq_from = Some(t);
        }
    }

    /// Records that space of locally managed entry `idx` may be claimed (before the claim;
    /// the claim is a `Release` read-modify-write, so an owner that sees its effect sees
    /// this too).
    #[inline(always)]
    fn record_lm(&mut self, idx: MeIndex) {
        let v = ACTIVE | (idx as u64 + 1);
        if self.lm != v {
            self.rec[REC_LM].store(v, Ordering::Release);
            self.lm = v;
        }
    }

    /// Test hook: dies at `step` if the test says so (nothing more is written).
    #[cfg(test)]
    fn dies_at(&mut self, step: die::Step) -> Result<(), NiError> {
        if die::here(step) {
            self.dead = true;
            return Err(NiError::Invalid(format!("died at {step:?} (test)")));
        }
        Ok(())
    }
}

impl Claimer<'_, '_> {
    /// An error path after the claim of event slot `s`: the slot must not stay claimed.
    #[cold]
    #[inline(never)]
    fn give_back(&self, s: Claim) {
        let _ = self
            .nic
            .eq_publish(s, &Event::new(EventKind::Dropped, self.rank, 0));
    }
}

impl Drop for Claimer<'_, '_> {
    #[inline(always)]
    fn drop(&mut self) {
        #[cfg(test)]
        if self.dead {
            return;
        }
        if let Some(s) = self.slot.take() {
            self.give_back(s);
        }
        // Release: after the publications, which an owner that reads the cleared record
        // then sees.
        if self.eq_from.is_some() {
            self.rec[REC_EQ].store(0, Ordering::Release);
        }
        if self.lm != 0 {
            self.rec[REC_LM].store(0, Ordering::Release);
        }
    }
}

/// Test hooks: a rank that dies at a chosen step of a put (it stops writing there).
#[cfg(test)]
pub(crate) mod die {
    use std::cell::Cell;

    /// Where an operation stops.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) enum Step {
        /// Its event-queue record written, no slot claimed.
        Recorded,
        /// An event slot claimed.
        SlotClaimed,
        /// Its record names a locally managed entry, no space claimed.
        LmRecorded,
        /// Space claimed, nothing deposited.
        LmClaimed,
        /// Deposited, the event not published.
        Deposited,
        /// Published, the records not cleared.
        Published,
    }

    /// Every step, in order.
    pub(crate) const STEPS: [Step; 6] = [
        Step::Recorded,
        Step::SlotClaimed,
        Step::LmRecorded,
        Step::LmClaimed,
        Step::Deposited,
        Step::Published,
    ];

    thread_local! {
        static AT: Cell<Option<Step>> = const { Cell::new(None) };
    }

    pub(crate) fn here(s: Step) -> bool {
        AT.with(|a| a.get() == Some(s))
    }

    /// Makes this thread's operations die at `s` (`None`: live).
    pub(crate) fn at(s: Option<Step>) {
        AT.with(|a| a.set(s));
    }
}

/// A match entry read consistently (its options word raw: the walk tests bits).
struct MeRecord<'a> {
    /// Both lines of the record.
    words: &'a [AtomicU64; 2 * LINE_WORDS],
    state: u64,
    match_bits: u64,
    ignore_bits: u64,
    options: u64,
    start: usize,
    length: usize,
}

/// The match entries a wire has read whole and checked in one NI, by entry, each with the
/// state word (generation and state) it was read under. A later walk that finds the same
/// state word takes the entry's fields from here: no second read of them and no second
/// check. The owner rewrites an entry's fields only under a new state word (appending,
/// unlinking and its repairs in [`NiOwner::verify`] each start a new generation), so under
/// an unchanged state word they are the fields checked then; a peer's stray write to a
/// field that leaves the state word alone is not acted on until the owner's check repairs
/// it (under a new generation), as a check of the fields would refuse it; and a wire whose
/// put went wrong forgets what it kept ([`MeSeen::forget`]), so a field written and put
/// back before the owner looked costs one misplaced deposit, not every later one. A
/// re-linked buffer starts a new generation too, so nothing is kept past one buffer cycle.
/// The `next` link is not kept (the owner relinks an entry's predecessor without a new
/// state word): a walk that goes past the entry reads and checks it.
#[derive(Debug, Clone)]
pub(crate) struct MeSeen(Vec<Seen>);

/// One entry of [`MeSeen`]: its first line's words after the state, as checked.
#[derive(Debug, Clone, Copy)]
struct Seen {
    state: u64,
    match_bits: u64,
    ignore_bits: u64,
    options: u64,
    start: usize,
    length: usize,
}

impl Seen {
    /// Nothing seen: a state word no linked entry has (its low byte is not `ME_LINKED`),
    /// and no option bit, so that even a state word forged to this value is an entry that
    /// takes nothing, as an unlinked one.
    const NONE: Seen = Seen {
        state: u64::MAX,
        match_bits: 0,
        ignore_bits: 0,
        options: 0,
        start: 0,
        length: 0,
    };
}

impl MeSeen {
    /// Room for the `max_me` entries of `geo`.
    pub(crate) fn new(geo: &NiGeometry) -> MeSeen {
        MeSeen(vec![Seen::NONE; geo.max_me as usize])
    }

    /// Forgets every entry kept: the next walk reads and checks them again. For a wire that
    /// met a corrupt entry (its deposit did not land where the owner takes it, or it was
    /// refused): a peer may have written a field and put it back before the owner's check,
    /// which then finds nothing to repair and starts no new generation.
    pub(crate) fn forget(&mut self) {
        self.0.fill(Seen::NONE);
    }
}

/// Where a walk keeps the entries it has read and checked (see [`MeSeen`]); `()` keeps none.
trait SeenEntries {
    /// Entry `idx` as read under state word `state`, if it was.
    fn seen(&self, idx: MeIndex, state: u64) -> Option<Seen>;
    /// Entry `idx` was read whole and checked as `seen`.
    fn keep(&mut self, idx: MeIndex, seen: Seen);
}

impl SeenEntries for () {
    #[inline(always)]
    fn seen(&self, _: MeIndex, _: u64) -> Option<Seen> {
        None
    }
    #[inline(always)]
    fn keep(&mut self, _: MeIndex, _: Seen) {}
}

impl SeenEntries for MeSeen {
    #[inline(always)]
    fn seen(&self, idx: MeIndex, state: u64) -> Option<Seen> {
        self.0
            .get(idx as usize)
            .filter(|e| e.state == state)
            .copied()
    }
    #[inline(always)]
    fn keep(&mut self, idx: MeIndex, seen: Seen) {
        if let Some(e) = self.0.get_mut(idx as usize) {
            *e = seen;
        }
    }
}

/// What a match-list walk found.
enum Walked {
    /// Entry `idx` matched; the data goes to (or comes from) `at` in the byte area.
    Found {
        idx: MeIndex,
        at: usize,
        /// The entry was use-once (the walk took it: an `Unlink` event is due).
        use_once: bool,
        /// Bytes from `at` the initiator owns (its locally managed claim, or the padded
        /// run it asked for), if whole words from an aligned `at`.
        owned: bool,
    },
    Refused(NiFail),
}

impl<'a> Nic<'a> {
    /// A view of the NI in `seg` (written through `imp`, a view of the same memory).
    pub fn new(seg: &'a Segment, imp: &'a Imported, geo: &'a NiGeometry) -> Nic<'a> {
        Nic {
            seg,
            imp,
            geo,
            parts: Parts::new(seg, geo),
        }
    }

    /// A view of the NI in `seg` (written through `imp`, a view of the same memory) through
    /// `runs`, its runs cut at start-up ([`NiRuns::new`] of `seg` and `geo`): what a rank's
    /// wire uses on every message.
    #[inline(always)]
    pub fn with_runs(
        seg: &'a Segment,
        imp: &'a Imported,
        geo: &'a NiGeometry,
        runs: &'a NiRuns,
    ) -> Nic<'a> {
        Nic {
            seg,
            imp,
            geo,
            parts: Parts::of(runs, geo),
        }
    }

    #[inline(always)]
    fn parts(&self) -> &Parts<'a> {
        &self.parts
    }

    /// Rings the NI's doorbell if its owner announced that it may sleep. (Posting an event
    /// does this by itself.)
    #[inline]
    pub fn ring(&self) -> Result<(), NiError> {
        // Against the owner's announcement and fence (see `NiOwner::announce_wait`): what
        // the caller published before is ordered before this load.
        fence(Ordering::SeqCst);
        if self.parts().q()?[0].load(Ordering::SeqCst) != 0 {
            self.seg.doorbell(DOORBELL)?.ring();
        }
        Ok(())
    }

    /// Claims an event slot for `cl`; `None` if the queue is full. See the module docs.
    ///
    /// The successful CAS is `SeqCst` and is followed by a `SeqCst` load of the waiting
    /// word: the store-buffering pair of [`NiOwner::announce_wait`] (waiting word stored,
    /// a `SeqCst` fence, then the head slot's sequence word loaded). In the single order `S`
    /// of `SeqCst` operations and fences (C++20 [atomics.order]): if the owner's load missed
    /// our claim, its fence precedes our CAS in `S` (rule 4.3), so precedes our load, which
    /// then cannot miss the waiting word stored before that fence (rule 4.2): we see it and
    /// ring after publishing (the owner cleared the doorbell's flag before its store, which
    /// our load synchronizes with, so the ring is not lost). Otherwise the owner sees the
    /// claim and does not sleep. On x86 the CAS is a locked instruction anyway and the load
    /// a plain one: no fence on this, the hot side. loom treats `SeqCst` accesses as
    /// `AcqRel` (it models only `SeqCst` fences), so under `cfg(loom)` the same order is
    /// written with a fence between the two.
    ///
    /// Cost against a claim by a compare-and-swap of the tail (the design before claims
    /// named their claimer): the compare-and-swap moved to the slot's line, which the
    /// producer writes next anyway (it takes that line a little earlier); the tail became a
    /// plain store; the record is one plain store to a line only this rank writes.
    #[inline(always)]
    fn eq_reserve(&self, cl: &mut Claimer<'_, 'a>) -> Result<Option<Claim>, NiError> {
        // The waiting word, head and tail in one checked run (the doorbell is before it).
        let parts = self.parts();
        let q = parts.q()?;
        let (head_w, tail_w) = (&q[Q_HEAD], &q[Q_TAIL]);
        let cap = self.geo.eq_capacity as u64;
        let mut t = tail_w.load(Ordering::Relaxed);
        // Acquire: the owner read the slot we are about to reuse before publishing head.
        let head = head_w.load(Ordering::Acquire);
        if t < head {
            // A hint behind what was consumed (stale or corrupt).
            t = head;
        }
        // Each step moves past a taken slot (a queue has `cap` of them), or goes back to the
        // head once. Wrapping arithmetic: `head` and `tail` are peers' words.
        for _ in 0..cap + 2 {
            if t.wrapping_sub(head) >= cap {
                match self.past_window(parts, head, t)? {
                    Some(from) => {
                        t = from;
                        continue;
                    }
                    None => return Ok(None),
                }
            }
            cl.record_eq(t);
            #[cfg(test)]
            cl.dies_at(die::Step::Recorded)?;
            let slot = parts.slot(t)?;
            if slot[0]
                .compare_exchange(
                    seq_free(t, cap),
                    seq_claimed(t, cl.rank),
                    Ordering::SeqCst,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                // Release: an owner that sees the hint past `t` sees the claim.
                tail_w.store(t.wrapping_add(1), Ordering::Release);
                #[cfg(loom)]
                fence(Ordering::SeqCst);
                let ring = q[0].load(Ordering::SeqCst) != 0;
                #[cfg(test)]
                cl.dies_at(die::Step::SlotClaimed)?;
                return Ok(Some(Claim { seq: t, ring }));
            }
            // Taken this lap (or a word no producer writes: never claimed over).
            t = t.wrapping_add(1);
        }
        Ok(None)
    }

    /// A claim's ticket `t` is past the window `head..head + cap`: the queue is full if the
    /// last ticket of the window is taken (a tail hint is the ticket after a claim), `None`;
    /// otherwise the hint is past every claim a producer could have made (corrupt), so the
    /// walk goes back to `head`. Out of line: a claim's path does not carry it.
    #[cold]
    #[inline(never)]
    fn past_window(&self, parts: &Parts<'a>, head: u64, t: u64) -> Result<Option<u64>, NiError> {
        let cap = self.geo.eq_capacity as u64;
        if t.wrapping_sub(head) == cap {
            let last = head.wrapping_add(cap - 1);
            if parts.slot(last)?[0].load(Ordering::Acquire) != seq_free(last, cap) {
                return Ok(None);
            }
        }
        Ok(Some(head))
    }

    /// Writes `ev` into the claimed slot and publishes it (and rings, if the claim says so).
    fn eq_publish(&self, claim: Claim, ev: &Event) -> Result<(), NiError> {
        self.eq_publish_words(claim, ev.words())
    }

    /// [`eq_publish`](Self::eq_publish) of an event's words: the hot path builds them in
    /// registers, stores the line's seven words and publishes with one more.
    #[inline(always)]
    fn eq_publish_words(&self, claim: Claim, words: [u64; 7]) -> Result<(), NiError> {
        let slot = self.parts().slot(claim.seq)?;
        for (w, v) in slot[1..].iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        slot[0].store(seq_published(claim.seq), Ordering::Release);
        if claim.ring {
            self.ring_claimed()?;
        }
        Ok(())
    }

    /// After the publication (Release inside): a woken owner finds the event.
    #[cold]
    #[inline(never)]
    fn ring_claimed(&self) -> Result<(), NiError> {
        self.seg.doorbell(DOORBELL)?.ring();
        Ok(())
    }

    /// Posts `ev` (claimed in the name of `ev.initiator`, which must be a rank of the job) if
    /// the queue has room; `false` if it had none (the event is lost, which only events
    /// whose information is also kept elsewhere may tolerate).
    pub fn try_post(&self, ev: &Event) -> Result<bool, NiError> {
        let mut cl = Claimer::new(self, ev.initiator)?;
        self.post_with(&mut cl, ev)
    }

    /// [`try_post`](Self::try_post) by `cl` during one of its operations.
    fn post_with(&self, cl: &mut Claimer<'_, 'a>, ev: &Event) -> Result<bool, NiError> {
        match self.eq_reserve(cl)? {
            Some(c) => self.eq_publish(c, ev).map(|()| true),
            None => Ok(false),
        }
    }

    /// Reads match entry `idx` (its lines `l`) under its seqlock; `Ok(None)` if it is not
    /// linked or changed meanwhile. Also returns its `next` link, checked (`None` when the
    /// entry came from `seen`: the walk reads the link if it goes on). Every field is a
    /// private copy, checked before use, once per state word of the entry (see [`MeSeen`]).
    #[inline(always)]
    fn read_me<S: SeenEntries>(
        &self,
        seen: &mut S,
        idx: MeIndex,
        l: &'a MeLines,
    ) -> Result<(Option<MeRecord<'a>>, Option<u64>), NiError> {
        let s1 = l[0].load(Ordering::Acquire);
        if let Some(e) = seen.seen(idx, s1) {
            let me = MeRecord {
                words: l,
                state: s1,
                match_bits: e.match_bits,
                ignore_bits: e.ignore_bits,
                options: e.options,
                start: e.start,
                length: e.length,
            };
            return Ok((Some(me), None));
        }
        let w: [u64; 6] = std::array::from_fn(|i| l[i + 1].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        let s2 = l[0].load(Ordering::Relaxed);
        let next = w[5];
        if next > self.geo.max_me as u64 {
            return Err(corrupt("match entry link", next));
        }
        if s1 != s2 || s1 & 0xFF != ME_LINKED {
            return Ok((None, Some(next)));
        }
        let options = w[2];
        if options & !0xFF1F != 0
            || (options >> 8) as usize >= NPT
            || options & (OPT_MANAGE_LOCAL | OPT_EVENT_DISABLE)
                == OPT_MANAGE_LOCAL | OPT_EVENT_DISABLE
        {
            return Err(corrupt("match entry options", options));
        }
        let (start, length) = (w[3], w[4]);
        if start
            .checked_add(length)
            .is_none_or(|end| end > self.geo.bytes as u64)
        {
            return Err(corrupt("match entry range", start));
        }
        let e = Seen {
            state: s1,
            match_bits: w[0],
            ignore_bits: w[1],
            options,
            start: start as usize,
            length: length as usize,
        };
        seen.keep(idx, e);
        let me = MeRecord {
            words: l,
            state: s1,
            match_bits: e.match_bits,
            ignore_bits: e.ignore_bits,
            options,
            start: e.start,
            length: e.length,
        };
        Ok((Some(me), Some(next)))
    }

    /// Entry `l`'s `next` link, read and checked (for a walk going past an entry that came
    /// from what it had seen).
    #[cold]
    #[inline(never)]
    fn link(&self, l: &MeLines) -> Result<u64, NiError> {
        let next = l[ME_NEXT / 8].load(Ordering::Acquire);
        if next > self.geo.max_me as u64 {
            return Err(corrupt("match entry link", next));
        }
        Ok(next)
    }

    #[inline(always)]
    fn pt_state(&self, pt: u8) -> Result<(u64, u64), NiError> {
        let l = self.parts().pt(pt)?;
        let state = l[0].load(Ordering::Acquire);
        let head = l[1].load(Ordering::Acquire);
        if head > self.geo.max_me as u64 {
            return Err(corrupt("portal list head", head));
        }
        Ok((state, head))
    }

    /// Walks portal `pt`'s match list for an operation of `len` bytes at `remote_offset`,
    /// reserves an event slot (into `cl.slot`) if the entry wants an event, and claims the
    /// matching entry's space. Returns the entry and the byte-area offset, or the failure.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn walk<S: SeenEntries>(
        &self,
        seen: &mut S,
        cl: &mut Claimer<'_, 'a>,
        pt: u8,
        match_bits: u64,
        len: usize,
        remote_offset: u64,
        is_get: bool,
        pad: bool,
    ) -> Result<Walked, NiError> {
        let (state, mut cur) = self.pt_state(pt)?;
        if state != PT_ENABLED {
            return Ok(Walked::Refused(NiFail::PtDisabled));
        }
        // The option bits this operation needs, and the entry's portal in the same word.
        let wants = if is_get { OPT_GET } else { OPT_PUT };
        let limit = walk_limit(self.geo.max_me);
        let mut steps = 0;
        while cur != 0 && steps < limit {
            steps += 1;
            let idx = (cur - 1) as MeIndex;
            let l = self.parts().me(idx)?;
            let (rec, next) = self.read_me(seen, idx, l)?;
            'entry: {
                let Some(me) = rec else { break 'entry };
                let opts = me.options;
                if (opts >> 8) as u8 != pt
                    || opts & wants == 0
                    || (match_bits ^ me.match_bits) & !me.ignore_bits != 0
                {
                    break 'entry;
                }
                let local = opts & OPT_MANAGE_LOCAL != 0;
                if !local
                    && remote_offset
                        .checked_add(len as u64)
                        .is_none_or(|end| end > me.length as u64)
                {
                    break 'entry;
                }
                // Reserve-first: a full queue refuses before any space is taken.
                if opts & OPT_EVENT_DISABLE == 0 && cl.slot.is_none() {
                    cl.slot = self.eq_reserve(cl)?;
                    if cl.slot.is_none() {
                        return Ok(Walked::Refused(NiFail::EqFull));
                    }
                }
                let use_once = opts & OPT_USE_ONCE != 0;
                if use_once {
                    let taken = (me.state & !0xFF) | ME_UNLINKED;
                    if me.words[0]
                        .compare_exchange(me.state, taken, Ordering::AcqRel, Ordering::Relaxed)
                        .is_err()
                    {
                        break 'entry;
                    }
                }
                let claim = lm_len(len) as u64;
                let (offset, owned) = if local && !is_get {
                    let counter = &me.words[LINE_WORDS];
                    let length = me.length as u64;
                    if claim == 0 {
                        if counter.load(Ordering::Acquire) > length {
                            break 'entry;
                        }
                        (0, false)
                    } else {
                        cl.record_lm(idx);
                        #[cfg(test)]
                        cl.dies_at(die::Step::LmRecorded)?;
                        let off = counter.fetch_add(claim, Ordering::AcqRel);
                        if off.checked_add(claim).is_none_or(|end| end > length) {
                            if off <= length {
                                // The first claim that does not fit unlinks the entry: it
                                // records how much was claimed, then tells the owner.
                                me.words[LINE_WORDS + 1].store(off, Ordering::Release);
                                let mut ev = Event::new(EventKind::Unlink, cl.rank, pt);
                                ev.me = idx;
                                ev.used = off;
                                self.post_with(cl, &ev)?;
                            }
                            break 'entry;
                        }
                        #[cfg(test)]
                        cl.dies_at(die::Step::LmClaimed)?;
                        (off, true)
                    }
                } else {
                    // The padded run stays inside the entry (its end is checked above).
                    let padded_fits = remote_offset
                        .checked_add(claim)
                        .is_some_and(|end| end <= me.length as u64);
                    (remote_offset, pad && padded_fits)
                };
                let at = me.start + offset as usize;
                return Ok(Walked::Found {
                    idx,
                    at,
                    use_once,
                    owned: owned && at.is_multiple_of(LM_ALIGN),
                });
            }
            cur = match next {
                Some(next) => next,
                None => self.link(l)?,
            };
        }
        self.no_match(cl, pt)
    }

    /// The walk found no entry: flow control disables the portal entry, if it has it.
    #[cold]
    #[inline(never)]
    fn no_match(&self, cl: &mut Claimer<'_, 'a>, pt: u8) -> Result<Walked, NiError> {
        let l = self.parts().pt(pt)?;
        if l[2].load(Ordering::Relaxed) & PT_FLOWCTRL != 0 {
            let won = l[0]
                .compare_exchange(PT_ENABLED, PT_DISABLED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
            if won {
                let ev = Event::new(EventKind::PtDisabled, cl.rank, pt);
                match cl.slot.take() {
                    Some(s) => self.eq_publish(s, &ev)?,
                    // The portal entry's state word says it too; the event is a courtesy.
                    None => {
                        self.post_with(cl, &ev)?;
                    }
                }
            }
            return Ok(Walked::Refused(NiFail::PtDisabled));
        }
        Ok(Walked::Refused(NiFail::NoMatch))
    }

    /// The wire for a put from `initiator` (a rank of the job, whose own NI is `own`, for
    /// `Send`/`Ack` events) into this NI: matching, claiming, depositing and the `Put`
    /// event, all done here as the target's NIC would. An initiator has one sender record
    /// per target: it runs one operation at a time into a given NI (as a rank's single
    /// thread does).
    #[inline(always)]
    pub fn put(
        &self,
        initiator: u32,
        own: Option<&Nic<'_>>,
        a: &PutArgs<'_>,
    ) -> Result<Outcome, NiError> {
        let len: usize =
            a.data.iter().map(|d| d.len()).sum::<usize>() + a.shared.map_or(0, |s| s.len());
        if len > u32::MAX as usize {
            return Err(NiError::Invalid(format!("a put of {len} bytes")));
        }
        let outcome = self.put_here(&mut (), initiator, a, len)?;
        if let Some(own) = own {
            let mut ev = Event::new(EventKind::Send, initiator, a.pt);
            ev.match_bits = a.match_bits;
            ev.mlength = len as u32;
            ev.remote_offset = a.remote_offset;
            if a.send_event {
                own.try_post(&ev)?;
            }
            if a.ack {
                ev.kind = EventKind::Ack;
                match outcome {
                    Outcome::Done { me, .. } => ev.me = me,
                    Outcome::Refused(f) => {
                        ev.fail = f;
                        ev.mlength = 0;
                    }
                }
                own.try_post(&ev)?;
            }
        }
        Ok(outcome)
    }

    /// [`put`](Self::put) by a wire that keeps the entries it has read and checked in
    /// `seen` (this NI's), with no event at the initiator.
    #[inline(always)]
    pub(crate) fn put_seen(
        &self,
        seen: &mut MeSeen,
        initiator: u32,
        a: &PutArgs<'_>,
    ) -> Result<Outcome, NiError> {
        let len: usize =
            a.data.iter().map(|d| d.len()).sum::<usize>() + a.shared.map_or(0, |s| s.len());
        if len > u32::MAX as usize {
            return Err(NiError::Invalid(format!("a put of {len} bytes")));
        }
        self.put_here(seen, initiator, a, len)
    }

    /// [`put`](Self::put)'s work in this NI, `len` bytes: its claimer's records are cleared
    /// when it returns (before any event at the initiator, which may be this NI).
    #[inline(always)]
    fn put_here<S: SeenEntries>(
        &self,
        seen: &mut S,
        initiator: u32,
        a: &PutArgs<'_>,
        len: usize,
    ) -> Result<Outcome, NiError> {
        let mut cl = Claimer::new(self, initiator)?;
        let found = self.walk(
            seen,
            &mut cl,
            a.pt,
            a.match_bits,
            len,
            a.remote_offset,
            false,
            a.pad,
        )?;
        let (idx, at, use_once, owned) = match found {
            Walked::Found {
                idx,
                at,
                use_once,
                owned,
            } => (idx, at, use_once, owned),
            Walked::Refused(fail) => {
                self.drop_reserved(&mut cl, initiator, a.pt)?;
                return Ok(Outcome::Refused(fail));
            }
        };
        // An empty put (an inline AM: the event is the message) moves nothing.
        if len != 0 {
            match (owned, a.shared) {
                // Whole words of space that is ours: no read-modify-write.
                (true, None) => {
                    self.imp.write_padded(at, a.data)?;
                }
                (true, Some(shared)) => {
                    self.imp.write_padded_then(at, a.data, shared)?;
                }
                (false, shared) => {
                    let mut o = at;
                    for d in a.data {
                        self.imp.write(o, d)?;
                        o += d.len();
                    }
                    if let Some(shared) = shared {
                        self.imp.write_from(o, shared)?;
                    }
                }
            }
        }
        #[cfg(test)]
        cl.dies_at(die::Step::Deposited)?;
        if let Some(s) = cl.slot.take() {
            // The `Put` event's words, built in place (see `Event::words`).
            let words = [
                EventKind::Put as u64 | (a.pt as u64) << 16 | (initiator as u64) << 32,
                a.match_bits,
                a.hdr_data,
                at as u64,
                len as u64 | (idx as u64) << 32,
                a.remote_offset,
                0,
            ];
            self.eq_publish_words(s, words)?;
        }
        if use_once {
            self.unlinked_once(&mut cl, initiator, a.pt, idx)?;
        }
        #[cfg(test)]
        cl.dies_at(die::Step::Published)?;
        Ok(Outcome::Done {
            me: idx,
            start: at as u64,
        })
    }

    /// The wire for a get from `initiator` out of this NI into `dst` (by copies): matching,
    /// the read, the `Get` event here and the `Reply` event at `own`.
    pub fn get(
        &self,
        initiator: u32,
        own: Option<&Nic<'_>>,
        pt: u8,
        match_bits: u64,
        remote_offset: u64,
        dst: &mut [u8],
    ) -> Result<Outcome, NiError> {
        if dst.len() > u32::MAX as usize {
            return Err(NiError::Invalid(format!("a get of {} bytes", dst.len())));
        }
        let mut cl = Claimer::new(self, initiator)?;
        let found = self.walk(
            &mut (),
            &mut cl,
            pt,
            match_bits,
            dst.len(),
            remote_offset,
            true,
            false,
        )?;
        let outcome = match found {
            Walked::Found {
                idx, at, use_once, ..
            } => {
                self.seg.read(at, dst)?;
                let mut ev = Event::new(EventKind::Get, initiator, pt);
                ev.match_bits = match_bits;
                ev.start = at as u64;
                ev.mlength = dst.len() as u32;
                ev.me = idx;
                ev.remote_offset = remote_offset;
                if let Some(s) = cl.slot.take() {
                    self.eq_publish(s, &ev)?;
                }
                if use_once {
                    self.unlinked_once(&mut cl, initiator, pt, idx)?;
                }
                drop(cl);
                if let Some(own) = own {
                    ev.kind = EventKind::Reply;
                    ev.start = 0;
                    own.try_post(&ev)?;
                }
                Outcome::Done {
                    me: idx,
                    start: at as u64,
                }
            }
            Walked::Refused(fail) => {
                self.drop_reserved(&mut cl, initiator, pt)?;
                drop(cl);
                if let Some(own) = own {
                    let mut ev = Event::new(EventKind::Reply, initiator, pt);
                    ev.fail = fail;
                    ev.match_bits = match_bits;
                    own.try_post(&ev)?;
                }
                Outcome::Refused(fail)
            }
        };
        Ok(outcome)
    }

    /// The wire for an atomic from `initiator` on this NI's memory (Portals'
    /// `PtlFetchAtomic`/`PtlSwap`): matching as a get (an entry that accepts gets, since
    /// every atomic here returns the word's old value), the atomic instruction on the word
    /// the entry maps `remote_offset` to, and an `Atomic` event unless the entry disables
    /// events. The old value, with the outcome.
    pub fn atomic(
        &self,
        initiator: u32,
        pt: u8,
        match_bits: u64,
        remote_offset: u64,
        atomic: &am_core::atomic::Atomic,
    ) -> Result<(Outcome, u64), NiError> {
        let mut cl = Claimer::new(self, initiator)?;
        let width = atomic.width().bytes();
        let found = self.walk(
            &mut (),
            &mut cl,
            pt,
            match_bits,
            width,
            remote_offset,
            true,
            false,
        )?;
        match found {
            Walked::Found {
                idx, at, use_once, ..
            } => {
                let old = atomic
                    .apply(self.imp.byte_area(), at)
                    .map_err(|e| NiError::Invalid(format!("an atomic at {at}: {e:?}")))?;
                let mut ev = Event::new(EventKind::Atomic, initiator, pt);
                ev.match_bits = match_bits;
                ev.start = at as u64;
                ev.mlength = width as u32;
                ev.me = idx;
                ev.remote_offset = remote_offset;
                if let Some(s) = cl.slot.take() {
                    self.eq_publish(s, &ev)?;
                }
                if use_once {
                    self.unlinked_once(&mut cl, initiator, pt, idx)?;
                }
                let done = Outcome::Done {
                    me: idx,
                    start: at as u64,
                };
                Ok((done, old))
            }
            Walked::Refused(fail) => {
                self.drop_reserved(&mut cl, initiator, pt)?;
                Ok((Outcome::Refused(fail), 0))
            }
        }
    }

    /// Use-once entry `me` was consumed by `initiator`'s operation on portal `pt`: its
    /// `Unlink` event, for the owner.
    #[inline(always)]
    fn unlinked_once(
        &self,
        cl: &mut Claimer<'_, 'a>,
        initiator: u32,
        pt: u8,
        me: MeIndex,
    ) -> Result<(), NiError> {
        let mut ev = Event::new(EventKind::Unlink, initiator, pt);
        ev.me = me;
        self.post_with(cl, &ev).map(drop)
    }

    /// `initiator`'s operation on portal `pt` was refused: the event slot it reserved, if
    /// any, is published as `Dropped` (the owner skips it).
    #[inline(always)]
    fn drop_reserved(
        &self,
        cl: &mut Claimer<'_, 'a>,
        initiator: u32,
        pt: u8,
    ) -> Result<(), NiError> {
        match cl.slot.take() {
            Some(s) => self.eq_publish(s, &Event::new(EventKind::Dropped, initiator, pt)),
            None => Ok(()),
        }
    }

    /// Is portal entry `pt` enabled?
    pub fn pt_enabled(&self, pt: u8) -> Result<bool, NiError> {
        Ok(self.pt_state(pt)?.0 == PT_ENABLED)
    }
}

/// Ticket `t`'s slot as its owner reads it: the sequence word, and if it says published, a
/// private copy of the event's words (checked by the caller, never re-read).
#[inline(always)]
fn read_slot(slot: &Line, t: u64) -> (u64, Option<[u64; 7]>) {
    let v = slot[0].load(Ordering::Acquire);
    if v != seq_published(t) {
        return (v, None);
    }
    (
        v,
        Some(std::array::from_fn(|i| slot[i + 1].load(Ordering::Relaxed))),
    )
}

/// What [`NiOwner::eq_unblock`] found at the head of the event queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Unblocked {
    /// Nothing that blocks: the head is free (nothing claimed) or published.
    Clear,
    /// A claim in flight by a live rank of the job that vouches for it: it will publish.
    InFlight(u32),
    /// A claim by a lost rank, taken over and skipped (nobody will publish it).
    SkippedLost(u32),
}

/// Whether an exhausted locally managed entry can be re-linked ([`NiOwner::lm_drained`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Drained {
    /// Its offset still leaves room: claims can still land in it.
    NotExhausted,
    /// A live rank may still be depositing in it, or an event about it is not read yet.
    Busy,
    /// Every byte claimed in it was read or belongs to a lost rank: re-link it.
    Yes,
}

/// The owner's side of its NI: appends and unlinks match entries, enables portal entries and
/// reads its event queue. Its local mirror of each match list is what it trusts; the shared
/// copy is what walkers read (and what [`verify`](Self::verify) repairs).
#[derive(Debug)]
pub struct NiOwner {
    geo: NiGeometry,
    flowctl: [bool; NPT],
    lists: [Vec<MeIndex>; NPT],
    specs: Vec<Option<(u8, MeSpec)>>,
    generation: Vec<u64>,
    free: Vec<MeIndex>,
    head: u64,
    published: u64,
    /// A value found in the head word that the owner had not published (reported by
    /// [`verify`](Self::verify)).
    head_fault: Option<u64>,
    /// The event queue's slots in the segment this owner was made with, cut once: the
    /// transport's poll reads them with no check beyond an index.
    eq: WordRun,
}

impl NiOwner {
    /// Initializes the NI in `seg` (zeroed, of geometry `geo`): every portal entry enabled,
    /// with flow control where `flowctl` says.
    pub fn new(geo: NiGeometry, seg: &Segment, flowctl: [bool; NPT]) -> Result<NiOwner, NiError> {
        if seg.words_len() < geo.words_len() || seg.bytes_len() < geo.bytes {
            return Err(NiError::Invalid(
                "segment smaller than the NI geometry".into(),
            ));
        }
        for (pt, fc) in flowctl.iter().enumerate() {
            let base = geo.pt(pt as u8)?;
            seg.word(base + 16)?
                .store(if *fc { PT_FLOWCTRL } else { 0 }, Ordering::Relaxed);
            seg.word(base + 8)?.store(0, Ordering::Relaxed);
            seg.word(base)?.store(PT_ENABLED, Ordering::Release);
        }
        Ok(NiOwner {
            geo,
            flowctl,
            lists: Default::default(),
            specs: vec![None; geo.max_me as usize],
            generation: vec![0; geo.max_me as usize],
            free: (0..geo.max_me).rev().collect(),
            head: 0,
            published: 0,
            head_fault: None,
            eq: seg.word_run(geo.eq_base, geo.eq_capacity as usize * LINE_WORDS)?,
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> &NiGeometry {
        &self.geo
    }

    fn link_at_tail(&mut self, seg: &Segment, pt: u8, idx: MeIndex) -> Result<(), NiError> {
        let base = self.geo.me(idx)?;
        seg.word(base + ME_NEXT)?.store(0, Ordering::Relaxed);
        let link = idx as u64 + 1;
        match self.lists[pt as usize].last() {
            Some(&last) => seg
                .word(self.geo.me(last)? + ME_NEXT)?
                .store(link, Ordering::Release),
            None => seg
                .word(self.geo.pt(pt)? + 8)?
                .store(link, Ordering::Release),
        }
        self.lists[pt as usize].push(idx);
        Ok(())
    }

    fn unlink_from_list(&mut self, seg: &Segment, pt: u8, idx: MeIndex) -> Result<bool, NiError> {
        let list = &mut self.lists[pt as usize];
        let Some(pos) = list.iter().position(|&i| i == idx) else {
            return Ok(false);
        };
        // The successor as we linked it (the shared copy is not trusted).
        let succ = list.get(pos + 1).map_or(0, |&s| s as u64 + 1);
        let at = match pos {
            0 => self.geo.pt(pt)? + 8,
            p => self.geo.me(list[p - 1])? + ME_NEXT,
        };
        seg.word(at)?.store(succ, Ordering::Release);
        list.remove(pos);
        Ok(true)
    }

    /// Writes entry `idx`'s first line (from `spec`) under its seqlock, ending in `state`.
    fn write_me(
        &self,
        seg: &Segment,
        idx: MeIndex,
        pt: u8,
        spec: &MeSpec,
        state: u64,
    ) -> Result<(), NiError> {
        let l = line(seg, self.geo.me(idx)?)?;
        let g = self.generation[idx as usize];
        // Seqlock write: walkers that see WRITING, or a state that changed, skip the entry.
        l[0].store(g << 8 | ME_WRITING, Ordering::Relaxed);
        fence(Ordering::Release);
        for (w, v) in l[1..6].iter().zip(spec.words(pt)) {
            w.store(v, Ordering::Relaxed);
        }
        l[0].store(state, Ordering::Release);
        Ok(())
    }

    /// Appends a match entry to the end of portal `pt`'s match list.
    pub fn me_append(&mut self, seg: &Segment, pt: u8, spec: MeSpec) -> Result<MeIndex, NiError> {
        self.geo.pt(pt)?;
        if spec
            .start
            .checked_add(spec.length)
            .is_none_or(|e| e > self.geo.bytes)
        {
            return Err(NiError::Invalid(format!(
                "entry [{}, +{}) outside a byte area of {}",
                spec.start, spec.length, self.geo.bytes
            )));
        }
        if spec.options.manage_local && spec.options.event_disable {
            return Err(NiError::Invalid(
                "a locally managed entry posts events (its owner re-links it by them)".into(),
            ));
        }
        let idx = self
            .free
            .pop()
            .ok_or(NiError::NoFreeEntry(self.geo.max_me))?;
        let base = self.geo.me(idx)?;
        let g = self.generation[idx as usize] + 1;
        self.generation[idx as usize] = g;
        seg.word(base + CACHE_LINE)?.store(0, Ordering::Relaxed);
        seg.word(base + CACHE_LINE + 8)?
            .store(NOT_USED, Ordering::Relaxed);
        self.write_me(seg, idx, pt, &spec, g << 8 | ME_LINKED)?;
        self.specs[idx as usize] = Some((pt, spec));
        self.link_at_tail(seg, pt, idx)?;
        Ok(idx)
    }

    /// Unlinks entry `idx` (whether or not it is still linked) and frees its record.
    pub fn me_unlink(&mut self, seg: &Segment, idx: MeIndex) -> Result<(), NiError> {
        let Some((pt, _)) = self.specs.get(idx as usize).copied().flatten() else {
            return Err(NiError::Invalid(format!("entry {idx} is not in use")));
        };
        self.unlink_from_list(seg, pt, idx)?;
        let g = self.generation[idx as usize] + 1;
        self.generation[idx as usize] = g;
        seg.word(self.geo.me(idx)?)?
            .store(g << 8 | ME_FREE, Ordering::Release);
        self.specs[idx as usize] = None;
        self.free.push(idx);
        Ok(())
    }

    /// The spec and portal of entry `idx`, as appended.
    pub fn spec(&self, idx: MeIndex) -> Option<(u8, MeSpec)> {
        self.specs.get(idx as usize).copied().flatten()
    }

    /// Is entry `idx` in its portal's match list (as the owner linked it)?
    pub fn is_listed(&self, idx: MeIndex) -> bool {
        self.spec(idx)
            .is_some_and(|(pt, _)| self.lists[pt as usize].contains(&idx))
    }

    /// A locally managed entry that ran out of space: the `used` word (bytes claimed in it,
    /// as the walker whose claim did not fit wrote it: a peer's word, for the caller to
    /// check), or `None` while it still has room.
    pub fn lm_used(&self, seg: &Segment, idx: MeIndex) -> Result<Option<u64>, NiError> {
        let used = seg
            .word(self.geo.me(idx)? + CACHE_LINE + 8)?
            .load(Ordering::Acquire);
        Ok((used != NOT_USED).then_some(used))
    }

    /// Bytes claimed so far in a locally managed entry (may exceed its length once full; a
    /// peer's word).
    pub fn lm_claimed(&self, seg: &Segment, idx: MeIndex) -> Result<u64, NiError> {
        Ok(seg
            .word(self.geo.me(idx)? + CACHE_LINE)?
            .load(Ordering::Acquire))
    }

    /// Takes an exhausted locally managed entry out of its match list, keeping its record.
    pub fn lm_retire(&mut self, seg: &Segment, idx: MeIndex) -> Result<(), NiError> {
        let (pt, _) = self
            .spec(idx)
            .ok_or_else(|| NiError::Invalid(format!("entry {idx}")))?;
        self.unlink_from_list(seg, pt, idx)?;
        Ok(())
    }

    /// Whether exhausted locally managed entry `idx` can be re-linked: its offset is past
    /// its end (no claim can land in it any more); no live rank (`lost[r]` false) holds a
    /// claimed event slot while its sender record names the entry (a walker between its
    /// claim of space and its event); and no published event in the queue that the owner
    /// has not read concerns it. Then every byte claimed in it was read, or belongs to a
    /// lost rank. Decided from the claims themselves, never from a count of bytes a peer
    /// wrote (`used`, an event's length), so a corrupt count cannot make it re-link early.
    ///
    /// Costs a look at every rank's record and at the unread part of the queue: once per
    /// re-link, off the per-message path.
    pub fn lm_drained(
        &self,
        seg: &Segment,
        idx: MeIndex,
        lost: &[bool],
    ) -> Result<Drained, NiError> {
        let (pt, spec) = self
            .spec(idx)
            .filter(|(_, s)| s.options.manage_local)
            .ok_or_else(|| NiError::Invalid(format!("entry {idx} is not locally managed")))?;
        // Acquire: an owner that sees a claim's effect on the offset sees the claimer's
        // record, stored before it.
        if self.lm_claimed(seg, idx)? < spec.length as u64 {
            return Ok(Drained::NotExhausted);
        }
        let names_it = ACTIVE | (idx as u64 + 1);
        let mut walkers: Vec<u32> = Vec::new();
        for r in 0..self.geo.ranks {
            if lost.get(r as usize).copied().unwrap_or(false) {
                continue;
            }
            let rec: &[AtomicU64; 2] = words(seg, self.geo.record(r)?)?;
            if rec[REC_LM].load(Ordering::Acquire) == names_it
                && rec[REC_EQ].load(Ordering::Acquire) & ACTIVE != 0
            {
                walkers.push(r);
            }
        }
        let cap = self.geo.eq_capacity as u64;
        for k in 0..cap {
            let t = self.head.wrapping_add(k);
            let slot = line(seg, self.geo.eq_slot(t))?;
            let v = slot[0].load(Ordering::Acquire);
            match seq_state(v, t, cap) {
                // The frontier: no claim beyond it (holes come only from a corrupt tail).
                SlotState::Empty => break,
                SlotState::Claimed(r) => {
                    if walkers.contains(&r) {
                        return Ok(Drained::Busy);
                    }
                }
                SlotState::Published => {
                    let w0 = slot[1].load(Ordering::Relaxed);
                    let me = (slot[5].load(Ordering::Relaxed) >> 32) as u32;
                    let kind = w0 as u8;
                    let about_it = (kind == EventKind::Put as u8
                        || kind == EventKind::Unlink as u8)
                        && (w0 >> 16) as u8 == pt
                        && me == idx;
                    if about_it {
                        return Ok(Drained::Busy);
                    }
                }
                SlotState::Corrupt(_) => {}
            }
        }
        // A live rank whose record names the entry but holds no claimed slot has published
        // (its event was read) or its record is stale: not depositing.
        Ok(Drained::Yes)
    }

    /// Re-links a locally managed entry whose every message was consumed (see
    /// [`lm_drained`](Self::lm_drained)): offset back to 0, appended at the end of its match
    /// list (the seed's chained receive buffers).
    pub fn lm_relink(&mut self, seg: &Segment, idx: MeIndex) -> Result<(), NiError> {
        let (pt, spec) = self
            .spec(idx)
            .ok_or_else(|| NiError::Invalid(format!("entry {idx}")))?;
        self.unlink_from_list(seg, pt, idx)?;
        let base = self.geo.me(idx)?;
        seg.word(base + CACHE_LINE + 8)?
            .store(NOT_USED, Ordering::Relaxed);
        seg.word(base + CACHE_LINE)?.store(0, Ordering::Release);
        // Written again under a new generation: what wires kept of it (`MeSeen`) lives one
        // buffer cycle at most, and a field a peer changed is the owner's again.
        let g = self.generation[idx as usize] + 1;
        self.generation[idx as usize] = g;
        self.write_me(seg, idx, pt, &spec, g << 8 | ME_LINKED)?;
        self.link_at_tail(seg, pt, idx)
    }

    /// Pushes retired locally managed entry `idx`'s offset back past its end (it was seen
    /// there, and a store that is no claim moved it back): no claim can land in it any more.
    pub fn lm_exhaust(&self, seg: &Segment, idx: MeIndex) -> Result<(), NiError> {
        let (_, spec) = self
            .spec(idx)
            .ok_or_else(|| NiError::Invalid(format!("entry {idx}")))?;
        seg.word(self.geo.me(idx)? + CACHE_LINE)?
            .fetch_max(spec.length as u64, Ordering::AcqRel);
        Ok(())
    }

    /// Re-enables portal entry `pt` after flow control disabled it.
    pub fn pt_enable(&self, seg: &Segment, pt: u8) -> Result<(), NiError> {
        seg.word(self.geo.pt(pt)?)?
            .store(PT_ENABLED, Ordering::Release);
        Ok(())
    }

    /// The state word of portal entry `pt` (a peer's word: walkers disable it).
    pub fn pt_state(&self, seg: &Segment, pt: u8) -> Result<u64, NiError> {
        Ok(seg.word(self.geo.pt(pt)?)?.load(Ordering::Acquire))
    }

    /// Is portal entry `pt` disabled?
    pub fn pt_disabled(&self, seg: &Segment, pt: u8) -> Result<bool, NiError> {
        Ok(seg.word(self.geo.pt(pt)?)?.load(Ordering::Acquire) != PT_ENABLED)
    }

    /// Checks every word peers read to walk this NI (the event queue's head word, the
    /// portal table, the match entries in use) against the owner's own copy, and rewrites
    /// the ones that differ; the first difference found is returned as `Corrupt` (after all
    /// were repaired). Words walkers legitimately change (a portal entry's state between
    /// enabled and disabled, a use-once entry taken, locally managed offsets) are only
    /// checked for values no walker writes. Off the message path: when idle, or after a
    /// refusal.
    pub fn verify(&mut self, seg: &Segment) -> Result<(), NiError> {
        let mut first: Option<NiError> = None;
        let mut note = |what: &'static str, value: u64| {
            if first.is_none() {
                first = Some(corrupt(what, value));
            }
        };
        let head = seg.word(EQ_HEAD)?;
        let h = head.load(Ordering::Relaxed);
        if h != self.published {
            head.store(self.published, Ordering::Release);
            note("event queue head", h);
        }
        if let Some(h) = self.head_fault.take() {
            note("event queue head", h);
        }
        for pt in 0..NPT {
            let l = line(seg, self.geo.pt(pt as u8)?)?;
            let state = l[0].load(Ordering::Acquire);
            if state != PT_ENABLED && state != PT_DISABLED {
                // Flow control disables it again if there is no room.
                let _ =
                    l[0].compare_exchange(state, PT_ENABLED, Ordering::AcqRel, Ordering::Relaxed);
                note("portal entry state", state);
            }
            let want = self.lists[pt].first().map_or(0, |&i| i as u64 + 1);
            let got = l[1].load(Ordering::Relaxed);
            if got != want {
                l[1].store(want, Ordering::Release);
                note("portal list head", got);
            }
            let want = if self.flowctl[pt] { PT_FLOWCTRL } else { 0 };
            let got = l[2].load(Ordering::Relaxed);
            if got != want {
                l[2].store(want, Ordering::Release);
                note("portal entry options", got);
            }
        }
        for idx in 0..self.geo.max_me {
            let Some((pt, spec)) = self.spec(idx) else {
                continue;
            };
            let l: &[AtomicU64; 2 * LINE_WORDS] = words(seg, self.geo.me(idx)?)?;
            let g = self.generation[idx as usize];
            let state = l[0].load(Ordering::Acquire);
            let linked = g << 8 | ME_LINKED;
            let state_ok =
                state == linked || (spec.options.use_once && state == g << 8 | ME_UNLINKED);
            let list = &self.lists[pt as usize];
            let pos = list.iter().position(|&i| i == idx);
            let fields: [u64; 5] = std::array::from_fn(|i| l[i + 1].load(Ordering::Relaxed));
            let fields_ok = fields == spec.words(pt);
            if !state_ok || !fields_ok {
                let bad = if state_ok {
                    fields
                        .iter()
                        .zip(spec.words(pt))
                        .find(|(a, b)| **a != *b)
                        .map_or(0, |(a, _)| *a)
                } else {
                    state
                };
                // Rewritten under a new generation: what walkers kept of the entry (see
                // `MeSeen`) is stale now.
                let g = g + 1;
                self.generation[idx as usize] = g;
                let kept = if state_ok { state & 0xFF } else { ME_LINKED };
                self.write_me(seg, idx, pt, &spec, g << 8 | kept)?;
                note("match entry", bad);
            }
            if let Some(p) = pos {
                let want = list.get(p + 1).map_or(0, |&s| s as u64 + 1);
                let got = l[6].load(Ordering::Relaxed);
                if got != want {
                    l[6].store(want, Ordering::Release);
                    note("match entry link", got);
                }
            }
            if spec.options.manage_local {
                let used = l[LINE_WORDS + 1].load(Ordering::Relaxed);
                if used != NOT_USED && used > spec.length as u64 {
                    // Nothing decides by it (see `lm_drained`): back to "unknown".
                    let _ = l[LINE_WORDS + 1].compare_exchange(
                        used,
                        NOT_USED,
                        Ordering::AcqRel,
                        Ordering::Relaxed,
                    );
                    note("match entry used", used);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Is the next event published? (The idle poll: one load.)
    #[inline]
    pub fn eq_ready(&self, seg: &Segment) -> Result<bool, NiError> {
        let off = self.geo.eq_slot(self.head);
        Ok(seg.word(off)?.load(Ordering::Acquire) == seq_published(self.head))
    }

    /// What the sequence word of the next ticket says (for tests and diagnostics).
    pub fn eq_head_state(&self, seg: &Segment) -> Result<SlotState, NiError> {
        let v = seg
            .word(self.geo.eq_slot(self.head))?
            .load(Ordering::Acquire);
        Ok(seq_state(v, self.head, self.geo.eq_capacity as u64))
    }

    /// The next ticket the owner reads.
    pub fn eq_head(&self) -> u64 {
        self.head
    }

    /// Takes the next event, if published. A sequence word no producer writes at the head
    /// is repaired, skipped and returned as `Corrupt` (the queue goes on); a corrupt event
    /// is consumed and returned as `Corrupt`.
    #[inline(always)]
    pub fn eq_poll(&mut self, seg: &Segment) -> Result<Option<Event>, NiError> {
        let slot = line(seg, self.geo.eq_slot(self.head))?;
        let read = read_slot(slot, self.head);
        match self.eq_take(seg, read)? {
            Some(w) => Event::from_words(w).map(Some),
            None => Ok(None),
        }
    }

    /// [`eq_poll`](Self::eq_poll) without the decoding, through the queue's run cut at
    /// [`new`](Self::new) (`seg` must be the segment this owner was made with, or a share of
    /// it): the next event's words, a private copy the caller checks (all of them, as
    /// [`Event::from_words`] does, before any use).
    #[inline(always)]
    pub(crate) fn eq_poll_words(&mut self, seg: &Segment) -> Result<Option<[u64; 7]>, NiError> {
        let eq = self.eq.words().as_chunks::<LINE_WORDS>().0;
        let i = self.head as usize & (self.geo.eq_capacity as usize - 1);
        let Some(slot) = eq.get(i) else {
            return Err(short_run(i));
        };
        let read = read_slot(slot, self.head);
        self.eq_take(seg, read)
    }

    /// Takes ticket `head`'s event from its slot `slot`, if published (see
    /// [`eq_poll`](Self::eq_poll)).
    #[inline(always)]
    fn eq_take(
        &mut self,
        seg: &Segment,
        (v, w): (u64, Option<[u64; 7]>),
    ) -> Result<Option<[u64; 7]>, NiError> {
        let Some(w) = w else {
            if v == seq_free(self.head, self.geo.eq_capacity as u64) || seq_is_claimed(v, self.head)
            {
                return Ok(None);
            }
            return self.eq_repair(seg, v).map(|()| None);
        };
        self.consumed(seg)?;
        Ok(Some(w))
    }

    /// Ticket `head` is done (read or skipped): the next one; publishes the head every
    /// quarter ring.
    #[inline(always)]
    fn consumed(&mut self, seg: &Segment) -> Result<(), NiError> {
        self.head = self.head.wrapping_add(1);
        if self.head.wrapping_sub(self.published) >= (self.geo.eq_capacity / 4) as u64 {
            self.eq_publish_head(seg)?;
        }
        Ok(())
    }

    /// The head slot holds `v`, a value no producer writes for this ticket: mark it as
    /// published (a compare-and-swap, so a value that changed meanwhile is kept), so the
    /// next lap finds it free, and skip it.
    #[cold]
    #[inline(never)]
    fn eq_repair(&mut self, seg: &Segment, v: u64) -> Result<(), NiError> {
        let t = self.head;
        let word = seg.word(self.geo.eq_slot(t))?;
        if word
            .compare_exchange(v, seq_published(t), Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            // Changed meanwhile: look again next time.
            return Ok(());
        }
        self.consumed(seg)?;
        Err(corrupt("event queue sequence word", v))
    }

    /// Takes over the slot of the head ticket, claimed (as `v`) by a claimer that will never
    /// publish it: it is marked published (the next lap finds it free) and skipped. False
    /// if it changed meanwhile (its claimer published after all).
    fn eq_take_over(&mut self, seg: &Segment, v: u64) -> Result<bool, NiError> {
        let t = self.head;
        let word = seg.word(self.geo.eq_slot(t))?;
        if word
            .compare_exchange(v, seq_published(t), Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Ok(false);
        }
        self.consumed(seg)?;
        Ok(true)
    }

    /// Whether rank `r`'s sender record vouches for a claim of ticket `t`: `ACTIVE`, from a
    /// ticket at or below it.
    fn vouches(&self, seg: &Segment, r: u32, t: u64) -> Result<bool, NiError> {
        let rec = seg.word(self.geo.record(r)? + 8 * REC_EQ)?;
        let v = rec.load(Ordering::Acquire);
        Ok(v & ACTIVE != 0 && v & !ACTIVE <= t)
    }

    /// Ends a wait at the head of the queue that cannot end by itself (see the module docs):
    /// a claim by a lost rank (`lost[r]`) is taken over and skipped
    /// ([`Unblocked::SkippedLost`]); a claim in the name of a rank outside the job or of one
    /// whose record does not vouch for it, a sequence word no producer writes, or a hole
    /// below later claims (a corrupt tail) is skipped too and returned as `Corrupt`; a
    /// genuine claim by a live rank is [`Unblocked::InFlight`]. A few loads; call it when
    /// idle, not per poll.
    pub fn eq_unblock(&mut self, seg: &Segment, lost: &[bool]) -> Result<Unblocked, NiError> {
        let cap = self.geo.eq_capacity as u64;
        let t = self.head;
        // The tail first (Acquire, against the producers' Release store after their claim):
        // a tail past `t` then means `t` was claimed, and a free `t` is a hole.
        let tail = seg.word(EQ_TAIL)?.load(Ordering::Acquire);
        let v = seg.word(self.geo.eq_slot(t))?.load(Ordering::Acquire);
        match seq_state(v, t, cap) {
            SlotState::Published => Ok(Unblocked::Clear),
            SlotState::Corrupt(v) => self.eq_repair(seg, v).map(|()| Unblocked::Clear),
            SlotState::Claimed(r) => {
                let live = (r as usize) < lost.len() && r < self.geo.ranks && !lost[r as usize];
                if live && self.vouches(seg, r, t)? {
                    return Ok(Unblocked::InFlight(r));
                }
                if !self.eq_take_over(seg, v)? {
                    return Ok(Unblocked::Clear);
                }
                if r < self.geo.ranks && lost.get(r as usize).copied().unwrap_or(false) {
                    Ok(Unblocked::SkippedLost(r))
                } else {
                    Err(corrupt(
                        "event queue claim its claimer does not vouch for",
                        v,
                    ))
                }
            }
            SlotState::Empty => {
                if tail <= t {
                    return Ok(Unblocked::Clear);
                }
                // Claims past a free head: a hole, if a later slot of this lap is taken. The
                // free tickets up to it are skipped at once (reported once).
                let end = tail.min(t.saturating_add(cap));
                let mut taken = None;
                for u in t + 1..end {
                    let w = seg.word(self.geo.eq_slot(u))?.load(Ordering::Acquire);
                    if seq_state(w, u, cap) != SlotState::Empty {
                        taken = Some(u);
                        break;
                    }
                }
                if let Some(u) = taken {
                    let mut skipped = false;
                    while self.head < u {
                        let h = self.head;
                        let w = seg.word(self.geo.eq_slot(h))?.load(Ordering::Acquire);
                        if seq_state(w, h, cap) != SlotState::Empty || !self.eq_take_over(seg, w)? {
                            break;
                        }
                        skipped = true;
                    }
                    if skipped {
                        return Err(corrupt("event queue tail (a hole below claims)", tail));
                    }
                    return Ok(Unblocked::Clear);
                }
                // A tail past every claim: put it back (it is only a hint).
                let tw = seg.word(EQ_TAIL)?;
                let _ = tw.compare_exchange(tail, t, Ordering::AcqRel, Ordering::Relaxed);
                Err(corrupt("event queue tail", tail))
            }
        }
    }

    /// Publishes how far the queue was read, so producers may reuse those slots. Done every
    /// quarter ring by [`eq_poll`](Self::eq_poll); call it when idle, too.
    #[inline]
    pub fn eq_publish_head(&mut self, seg: &Segment) -> Result<(), NiError> {
        if self.published != self.head {
            let w = seg.word(EQ_HEAD)?;
            // Only the owner writes it: a value it did not publish is a peer's (reported by
            // `verify`; one load, of the line this store takes anyway).
            let found = w.load(Ordering::Relaxed);
            if found != self.published && self.head_fault.is_none() {
                self.head_fault = Some(found);
            }
            w.store(self.head, Ordering::Release);
            self.published = self.head;
        }
        Ok(())
    }

    /// The doorbell producers ring after posting while the owner is announced waiting.
    pub fn doorbell<'s>(&self, seg: &'s Segment) -> Result<am_shm::Doorbell<'s>, NiError> {
        Ok(seg.doorbell(DOORBELL)?)
    }

    /// On the way to sleep: clears the doorbell, announces that producers must ring it, and
    /// says whether sleeping is safe (`false`: the next ticket is claimed, published or
    /// corrupt, so poll instead). Follow with [`end_wait`](Self::end_wait) whatever the
    /// answer.
    ///
    /// The doorbell is cleared before the announcement: a producer that sees the
    /// announcement rings after it (its load synchronizes with our `Release` store), so its
    /// ring is not undone by our clear. A `SeqCst` fence separates the announcement from the
    /// load of the head slot's sequence word; against the producer's `SeqCst` claim and
    /// load of the waiting word (see `Nic::eq_reserve`) no claim can go unnoticed by both
    /// sides. The fence is on this side, the one about to sleep.
    pub fn announce_wait(&self, seg: &Segment) -> Result<bool, NiError> {
        seg.doorbell(DOORBELL)?.take();
        seg.word(WAITING)?.store(1, Ordering::Release);
        fence(Ordering::SeqCst);
        let v = seg
            .word(self.geo.eq_slot(self.head))?
            .load(Ordering::SeqCst);
        Ok(v == seq_free(self.head, self.geo.eq_capacity as u64))
    }

    /// After a wait: producers stop ringing (a ring still in flight only wakes us early).
    pub fn end_wait(&self, seg: &Segment) -> Result<(), NiError> {
        seg.word(WAITING)?.store(0, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn geo(bytes: usize) -> NiGeometry {
        NiGeometry::new(4, 16, 64, bytes).unwrap()
    }

    struct Ni {
        geo: NiGeometry,
        seg: Segment,
        imp: Imported,
        owner: NiOwner,
    }

    impl Ni {
        fn new(bytes: usize) -> Ni {
            let geo = geo(bytes);
            let seg = Segment::heap(geo.words_len(), bytes).unwrap();
            let imp = seg.import();
            let owner = NiOwner::new(geo, &seg, [true, false, false, false]).unwrap();
            Ni {
                geo,
                seg,
                imp,
                owner,
            }
        }
        fn nic(&self) -> Nic<'_> {
            Nic::new(&self.seg, &self.imp, &self.geo)
        }
        fn events(&mut self) -> Vec<Event> {
            let mut v = Vec::new();
            while let Some(e) = self.owner.eq_poll(&self.seg).unwrap() {
                v.push(e);
            }
            v
        }
    }

    fn put_args<'a>(pt: u8, mb: u64, off: u64, data: &'a [&'a [u8]]) -> PutArgs<'a> {
        PutArgs {
            pt,
            match_bits: mb,
            hdr_data: 0xABCD,
            remote_offset: off,
            data,
            shared: None,
            ack: false,
            send_event: false,
            pad: false,
        }
    }

    fn spec(mb: u64, ib: u64, start: usize, length: usize, options: MeOptions) -> MeSpec {
        MeSpec {
            match_bits: mb,
            ignore_bits: ib,
            start,
            length,
            options,
        }
    }

    const PUT: MeOptions = MeOptions {
        put: true,
        get: true,
        use_once: false,
        manage_local: false,
        event_disable: false,
    };

    #[test]
    fn match_bits_select_the_entry_and_ignore_bits_widen_it() {
        let mut ni = Ni::new(1024);
        let a = ni
            .owner
            .me_append(&ni.seg, PT_USER, spec(0x10, 0, 0, 100, PUT))
            .unwrap();
        let b = ni
            .owner
            .me_append(&ni.seg, PT_USER, spec(0x20, 0x0F, 100, 100, PUT))
            .unwrap();
        let nic = ni.nic();
        let d: &[&[u8]] = &[b"xy"];
        assert_eq!(
            nic.put(0, None, &put_args(PT_USER, 0x10, 5, d)).unwrap(),
            Outcome::Done { me: a, start: 5 }
        );
        assert_eq!(
            nic.put(1, None, &put_args(PT_USER, 0x2B, 7, d)).unwrap(),
            Outcome::Done { me: b, start: 107 }
        );
        assert_eq!(
            nic.put(1, None, &put_args(PT_USER, 0x30, 0, d)).unwrap(),
            Outcome::Refused(NiFail::NoMatch)
        );
        // Past the end of the entry: no truncation, no match.
        assert_eq!(
            nic.put(1, None, &put_args(PT_USER, 0x10, 99, d)).unwrap(),
            Outcome::Refused(NiFail::NoMatch)
        );
        let ev = ni.events();
        assert_eq!(ev.len(), 2);
        assert_eq!(
            (ev[0].kind, ev[0].me, ev[0].start, ev[0].mlength),
            (EventKind::Put, a, 5, 2)
        );
        assert_eq!(
            (ev[1].initiator, ev[1].match_bits, ev[1].hdr_data),
            (1, 0x2B, 0xABCD)
        );
        assert_eq!(ni.seg.view(107, 2).unwrap().to_vec(), b"xy");
    }

    /// A shared tail (an echoed payload) lands right after the private parts, padded or
    /// not, and counts in the event's length; the neighbours of an unpadded deposit keep
    /// their bytes.
    #[test]
    fn shared_bytes_follow_the_private_parts() {
        let mut ni = Ni::new(1024);
        let src = Ni::new(256);
        src.seg
            .view(0, 256)
            .unwrap()
            .write(0, &[0x5A; 256])
            .unwrap();
        src.seg
            .view(40, 11)
            .unwrap()
            .write(0, b"echoed-tail")
            .unwrap();
        let a = ni
            .owner
            .me_append(&ni.seg, PT_USER, spec(1, 0, 0, 512, PUT))
            .unwrap();
        ni.seg.view(0, 512).unwrap().fill(0, 512, 0xEE).unwrap();
        let nic = ni.nic();
        let d: &[&[u8]] = &[b"head"];
        for (off, pad) in [(16u64, true), (203, false)] {
            let args = PutArgs {
                shared: Some(src.seg.view(40, 11).unwrap()),
                pad,
                ..put_args(PT_USER, 1, off, d)
            };
            assert_eq!(
                nic.put(0, None, &args).unwrap(),
                Outcome::Done { me: a, start: off }
            );
            let at = off as usize;
            assert_eq!(ni.seg.view(at, 15).unwrap().to_vec(), b"headechoed-tail");
            let after = ni.seg.view(at + 15, 1).unwrap().to_vec()[0];
            // Padded: the rest of the last word is zeroed; unpadded: left as it was.
            assert_eq!(after, if pad { 0 } else { 0xEE }, "offset {off}");
            assert_eq!(ni.seg.view(at - 1, 1).unwrap().to_vec()[0], 0xEE);
        }
        let ev = ni.events();
        assert_eq!(
            ev.iter().map(|e| (e.start, e.mlength)).collect::<Vec<_>>(),
            [(16, 15), (203, 15)]
        );
    }

    #[test]
    fn use_once_entry_unlinks_with_an_event() {
        let mut ni = Ni::new(256);
        let once = MeOptions {
            use_once: true,
            ..PUT
        };
        let a = ni
            .owner
            .me_append(&ni.seg, PT_USER, spec(7, 0, 0, 64, once))
            .unwrap();
        let b = ni
            .owner
            .me_append(&ni.seg, PT_USER, spec(7, 0, 64, 64, once))
            .unwrap();
        let nic = ni.nic();
        let d: &[&[u8]] = &[b"1"];
        let r1 = nic.put(2, None, &put_args(PT_USER, 7, 0, d)).unwrap();
        let r2 = nic.put(2, None, &put_args(PT_USER, 7, 0, d)).unwrap();
        let r3 = nic.put(2, None, &put_args(PT_USER, 7, 0, d)).unwrap();
        assert_eq!(r1, Outcome::Done { me: a, start: 0 });
        assert_eq!(r2, Outcome::Done { me: b, start: 64 });
        assert_eq!(r3, Outcome::Refused(NiFail::NoMatch));
        let kinds: Vec<_> = ni.events().iter().map(|e| (e.kind, e.me)).collect();
        assert_eq!(
            kinds,
            [
                (EventKind::Put, a),
                (EventKind::Unlink, a),
                (EventKind::Put, b),
                (EventKind::Unlink, b)
            ]
        );
        ni.owner.me_unlink(&ni.seg, a).unwrap();
        ni.owner.me_unlink(&ni.seg, b).unwrap();
        assert!(ni.owner.me_unlink(&ni.seg, b).is_err());
    }

    #[test]
    fn ack_send_get_and_reply_events() {
        let mut tgt = Ni::new(256);
        let mut ini = Ni::new(64);
        tgt.owner
            .me_append(&tgt.seg, PT_USER, spec(1, 0, 0, 128, PUT))
            .unwrap();
        let d: &[&[u8]] = &[b"hello"];
        let args = PutArgs {
            ack: true,
            send_event: true,
            ..put_args(PT_USER, 1, 3, d)
        };
        tgt.nic().put(1, Some(&ini.nic()), &args).unwrap();
        let mut got = [0u8; 5];
        tgt.nic()
            .get(1, Some(&ini.nic()), PT_USER, 1, 3, &mut got)
            .unwrap();
        assert_eq!(&got, b"hello");
        let bad = PutArgs {
            ack: true,
            ..put_args(PT_USER, 9, 0, d)
        };
        tgt.nic().put(1, Some(&ini.nic()), &bad).unwrap();
        let i: Vec<_> = ini
            .events()
            .iter()
            .map(|e| (e.kind, e.fail, e.mlength))
            .collect();
        assert_eq!(
            i,
            [
                (EventKind::Send, NiFail::Ok, 5),
                (EventKind::Ack, NiFail::Ok, 5),
                (EventKind::Reply, NiFail::Ok, 5),
                (EventKind::Ack, NiFail::NoMatch, 0),
            ]
        );
        let t: Vec<_> = tgt.events().iter().map(|e| e.kind).collect();
        assert_eq!(t, [EventKind::Put, EventKind::Get]);
    }

    /// Locally managed offsets pack messages back to back; the claim that does not fit
    /// unlinks the entry (with the bytes used), the next entry takes it, and when none has
    /// room the portal entry is disabled until the owner re-enables it.
    #[test]
    fn locally_managed_packing_unlink_and_flow_control() {
        let mut ni = Ni::new(256);
        let lm = MeOptions {
            manage_local: true,
            ..PUT
        };
        let a = ni
            .owner
            .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 0, 32, lm))
            .unwrap();
        let b = ni
            .owner
            .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 32, 32, lm))
            .unwrap();
        let nic = ni.nic();
        let put = |n: usize| {
            let v = vec![n as u8; n];
            let d: &[&[u8]] = &[&v];
            nic.put(0, None, &put_args(PT_REQUEST, 5, 999, d)).unwrap()
        };
        assert_eq!(put(5), Outcome::Done { me: a, start: 0 });
        assert_eq!(put(9), Outcome::Done { me: a, start: 8 });
        assert_eq!(put(20), Outcome::Done { me: b, start: 32 });
        assert_eq!(
            put(0),
            Outcome::Done { me: b, start: 32 },
            "zero bytes fit anywhere"
        );
        assert_eq!(put(16), Outcome::Refused(NiFail::PtDisabled));
        assert_eq!(put(1), Outcome::Refused(NiFail::PtDisabled));
        let ev = ni.events();
        let kinds: Vec<_> = ev.iter().map(|e| (e.kind, e.me, e.used)).collect();
        assert_eq!(
            kinds,
            // A put's own event slot is claimed before the walk, so the unlink it causes
            // follows it in the queue.
            [
                (EventKind::Put, a, 0),
                (EventKind::Put, a, 0),
                (EventKind::Put, b, 0),
                (EventKind::Unlink, a, 24),
                (EventKind::Put, b, 0),
                (EventKind::PtDisabled, NO_ME, 0),
                (EventKind::Unlink, b, 24),
            ]
        );
        assert_eq!(ni.owner.lm_used(&ni.seg, a).unwrap(), Some(24));
        assert!(ni.owner.pt_disabled(&ni.seg, PT_REQUEST).unwrap());
        ni.owner.lm_relink(&ni.seg, a).unwrap();
        ni.owner.lm_retire(&ni.seg, b).unwrap();
        ni.owner.pt_enable(&ni.seg, PT_REQUEST).unwrap();
        let nic = ni.nic();
        let v = [7u8; 16];
        let d: &[&[u8]] = &[&v];
        assert_eq!(
            nic.put(0, None, &put_args(PT_REQUEST, 5, 0, d)).unwrap(),
            Outcome::Done { me: a, start: 0 }
        );
        assert_eq!(ni.owner.lm_used(&ni.seg, a).unwrap(), None);
        assert!(!ni.owner.is_listed(b));
    }

    #[test]
    fn a_full_event_queue_refuses_without_side_effects() {
        let mut ni = Ni::new(64);
        ni.owner
            .me_append(&ni.seg, PT_USER, spec(0, !0, 0, 64, PUT))
            .unwrap();
        let nic = ni.nic();
        let d: &[&[u8]] = &[b"z"];
        for _ in 0..64 {
            assert!(matches!(
                nic.put(0, None, &put_args(PT_USER, 0, 0, d)).unwrap(),
                Outcome::Done { .. }
            ));
        }
        assert_eq!(
            nic.put(0, None, &put_args(PT_USER, 0, 0, d)).unwrap(),
            Outcome::Refused(NiFail::EqFull)
        );
        assert_eq!(ni.events().len(), 64);
        ni.owner.eq_publish_head(&ni.seg).unwrap();
        assert!(matches!(
            ni.nic().put(0, None, &put_args(PT_USER, 0, 0, d)).unwrap(),
            Outcome::Done { .. }
        ));
    }

    /// Producers ring only an owner announced waiting, and a claimed slot, published or
    /// not, keeps the owner from sleeping.
    #[test]
    fn producers_ring_only_an_announced_waiter() {
        let mut ni = Ni::new(64);
        ni.owner
            .me_append(&ni.seg, PT_USER, spec(0, !0, 0, 64, PUT))
            .unwrap();
        let d: &[&[u8]] = &[b"z"];
        ni.nic().put(0, None, &put_args(PT_USER, 0, 0, d)).unwrap();
        let bell = ni.owner.doorbell(&ni.seg).unwrap();
        assert!(!bell.is_rung(), "a spinning owner is not rung");
        assert!(!ni.owner.announce_wait(&ni.seg).unwrap(), "an event unread");
        ni.owner.end_wait(&ni.seg).unwrap();
        assert_eq!(ni.events().len(), 1);
        assert!(ni.owner.announce_wait(&ni.seg).unwrap(), "nothing pending");
        ni.nic().put(0, None, &put_args(PT_USER, 0, 0, d)).unwrap();
        let bell = ni.owner.doorbell(&ni.seg).unwrap();
        assert!(bell.is_rung(), "an announced waiter is rung");
        ni.owner.end_wait(&ni.seg).unwrap();
        assert_eq!(ni.events().len(), 1);
        let nic = ni.nic();
        let mut cl = Claimer::new(&nic, 0).unwrap();
        let claim = nic.eq_reserve(&mut cl).unwrap().unwrap();
        assert!(!claim.ring, "not announced");
        drop(cl);
        assert!(
            !ni.owner.announce_wait(&ni.seg).unwrap(),
            "a claim not yet published"
        );
        ni.owner.end_wait(&ni.seg).unwrap();
    }

    /// Several initiators claim one locally managed entry at once: disjoint, packed ranges.
    #[test]
    fn concurrent_claims_pack_without_overlap() {
        let mut ni = Ni::new(4096);
        let lm = MeOptions {
            manage_local: true,
            ..PUT
        };
        ni.owner
            .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 0, 4096, lm))
            .unwrap();
        let per = if cfg!(miri) { 3 } else { 12 };
        let (seg, imp, geo) = (&ni.seg, &ni.imp, &ni.geo);
        std::thread::scope(|s| {
            for t in 0..3u8 {
                s.spawn(move || {
                    let nic = Nic::new(seg, imp, geo);
                    for i in 0..per {
                        let v = vec![t * 50 + i as u8; 8 + t as usize * 8];
                        let d: &[&[u8]] = &[&v];
                        let r = nic
                            .put(t as u32, None, &put_args(PT_REQUEST, 0, 0, d))
                            .unwrap();
                        assert!(matches!(r, Outcome::Done { .. }));
                    }
                });
            }
        });
        let ev = ni.events();
        assert_eq!(ev.len(), 3 * per as usize);
        let mut ranges: Vec<_> = ev.iter().map(|e| (e.start, e.mlength)).collect();
        ranges.sort_unstable();
        let mut end = 0;
        for (start, len) in ranges {
            assert_eq!(start, end, "back to back");
            let b = ni.seg.view(start as usize, len as usize).unwrap().to_vec();
            assert!(b.iter().all(|&x| x == b[0]), "deposit intact");
            end = start + len as u64;
        }
    }

    proptest! {
        // Under Miri: no failure file (isolation has no working directory), and few cases.
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { ProptestConfig::default().cases },
            failure_persistence: if cfg!(miri) {
                None
            } else {
                ProptestConfig::default().failure_persistence
            },
            ..ProptestConfig::default()
        })]

        /// Matching follows (incoming ^ match) & !ignore == 0, whatever the bits.
        #[test]
        fn matching_rule(mb in any::<u64>(), ib in any::<u64>(), incoming in any::<u64>()) {
            let mut ni = Ni::new(64);
            ni.owner.me_append(&ni.seg, PT_USER, spec(mb, ib, 0, 64, PUT)).unwrap();
            let d: &[&[u8]] = &[b"q"];
            let r = ni.nic().put(0, None, &put_args(PT_USER, incoming, 0, d)).unwrap();
            let want = (incoming ^ mb) & !ib == 0;
            prop_assert_eq!(matches!(r, Outcome::Done { .. }), want);
        }

        /// Garbage in an entry's words or in the portal's list head is a typed error or a
        /// refusal, never a panic or an access outside the segment.
        #[test]
        fn corrupt_entry_fields_are_checked(word in 0usize..8, value in any::<u64>(), head in any::<u64>()) {
            let mut ni = Ni::new(128);
            let idx = ni.owner.me_append(&ni.seg, PT_USER, spec(0, !0, 0, 128, PUT)).unwrap();
            let base = ni.geo.me(idx).unwrap();
            if word != 0 {
                ni.seg.word(base + 8 * word).unwrap().store(value, Ordering::Relaxed);
            }
            let d: &[&[u8]] = &[b"abc"];
            let r = ni.nic().put(0, None, &put_args(PT_USER, 0, 10, d));
            if let Ok(Outcome::Done { start, .. }) = r {
                prop_assert!(start as usize + 3 <= 128);
            }
            ni.seg.word(ni.geo.pt(PT_USER).unwrap() + 8).unwrap().store(head, Ordering::Relaxed);
            let r = ni.nic().put(0, None, &put_args(PT_USER, 0, 10, d));
            if head > ni.geo.max_me as u64 {
                let corrupt = matches!(r, Err(NiError::Corrupt { .. }));
                prop_assert!(corrupt, "a bad list head is a typed error");
            }
        }

        /// Garbage event words are a typed error for that event; the queue moves on.
        #[test]
        fn corrupt_events_are_typed_errors(w0 in any::<u64>()) {
            let mut ni = Ni::new(64);
            let off = ni.geo.eq_slot(0);
            ni.seg.word(off + 8).unwrap().store(w0, Ordering::Relaxed);
            ni.seg.word(off).unwrap().store(1, Ordering::Release);
            match ni.owner.eq_poll(&ni.seg) {
                Ok(Some(e)) => prop_assert_eq!(e.kind as u8, w0 as u8),
                Ok(None) => prop_assert!(false, "the event was published"),
                Err(e) => {
                    let corrupt = matches!(e, NiError::Corrupt { .. });
                    prop_assert!(corrupt, "typed error");
                }
            }
            prop_assert_eq!(ni.owner.eq_poll(&ni.seg).unwrap(), None);
        }
    }

    /// The raw sequence word of ticket `t`'s slot.
    fn seq_word(ni: &Ni, t: u64) -> &AtomicU64 {
        ni.seg.word(ni.geo.eq_slot(t)).unwrap()
    }

    /// Claims the next ticket in the name of `rank` and leaves it unpublished (a rank that
    /// dies there, or is slow).
    fn claim_only(ni: &Ni, rank: u32) -> u64 {
        let nic = ni.nic();
        let mut cl = Claimer::new(&nic, rank).unwrap();
        let c = nic.eq_reserve(&mut cl).unwrap().unwrap();
        cl.dead = true; // keep the record as a live claimer's
        c.seq
    }

    fn user_entry(ni: &mut Ni) {
        ni.owner
            .me_append(&ni.seg, PT_USER, spec(0, !0, 0, 64, PUT))
            .unwrap();
    }

    /// A claim names its claimer in the sequence word, and the claimer's record vouches for
    /// it; publication clears the record.
    #[test]
    fn claims_name_their_claimer() {
        let mut ni = Ni::new(64);
        user_entry(&mut ni);
        let t = claim_only(&ni, 2);
        assert_eq!(t, 0);
        assert_eq!(seq_word(&ni, 0).load(Ordering::Relaxed), seq_claimed(0, 2));
        assert_eq!(
            ni.owner.eq_head_state(&ni.seg).unwrap(),
            SlotState::Claimed(2)
        );
        assert!(ni.owner.vouches(&ni.seg, 2, 0).unwrap());
        assert!(
            !ni.owner.vouches(&ni.seg, 1, 0).unwrap(),
            "another rank's record"
        );
        assert_eq!(
            ni.owner.eq_unblock(&ni.seg, &[false; 4]).unwrap(),
            Unblocked::InFlight(2)
        );
        // A put by rank 1 lands behind it; its record is cleared once it published.
        let d: &[&[u8]] = &[b"q"];
        ni.nic().put(1, None, &put_args(PT_USER, 0, 0, d)).unwrap();
        let rec = ni.seg.word(ni.geo.record(1).unwrap()).unwrap();
        assert_eq!(rec.load(Ordering::Relaxed), 0);
        assert_eq!(
            ni.owner.eq_poll(&ni.seg).unwrap(),
            None,
            "held by the claim"
        );
    }

    /// A claim by a rank that was lost is taken over and skipped; events behind it flow,
    /// and the slot is free again for the next lap.
    #[test]
    fn a_lost_claimers_slot_is_skipped() {
        let mut ni = Ni::new(64);
        user_entry(&mut ni);
        claim_only(&ni, 2);
        let d: &[&[u8]] = &[b"q"];
        ni.nic().put(1, None, &put_args(PT_USER, 0, 0, d)).unwrap();
        assert_eq!(ni.owner.eq_poll(&ni.seg).unwrap(), None);
        assert!(
            !ni.owner.announce_wait(&ni.seg).unwrap(),
            "a claim: do not sleep"
        );
        ni.owner.end_wait(&ni.seg).unwrap();
        let lost = [false, false, true, false];
        assert_eq!(
            ni.owner.eq_unblock(&ni.seg, &lost).unwrap(),
            Unblocked::SkippedLost(2)
        );
        let ev = ni.owner.eq_poll(&ni.seg).unwrap().unwrap();
        assert_eq!((ev.kind, ev.initiator), (EventKind::Put, 1));
        // Laps over the skipped slot: every event once, in order.
        for lap in 0..3u64 {
            for i in 0..64u64 {
                let mut a = put_args(PT_USER, 0, 0, d);
                a.hdr_data = lap << 32 | i;
                assert!(matches!(
                    ni.nic().put(1, None, &a).unwrap(),
                    Outcome::Done { .. }
                ));
                let ev = ni.owner.eq_poll(&ni.seg).unwrap().unwrap();
                assert_eq!(ev.hdr_data, lap << 32 | i);
                ni.owner.eq_publish_head(&ni.seg).unwrap();
            }
        }
    }

    /// A `CLAIMED` sequence word in the name of a rank whose record does not vouch for it,
    /// or of a rank outside the job, is skipped and reported; one whose record vouches is
    /// waited for until the record is cleared.
    #[test]
    fn a_forged_claim_is_skipped_and_reported() {
        for (claimer, record) in [(3u32, 0u64), (3, ACTIVE | 1), (99, 0), (u32::MAX >> 1, 0)] {
            let mut ni = Ni::new(64);
            user_entry(&mut ni);
            seq_word(&ni, 0).store(seq_claimed(0, claimer), Ordering::Release);
            if claimer < 4 {
                let rec = ni.seg.word(ni.geo.record(claimer).unwrap()).unwrap();
                rec.store(record, Ordering::Release);
            }
            let d: &[&[u8]] = &[b"q"];
            ni.nic().put(1, None, &put_args(PT_USER, 0, 0, d)).unwrap();
            assert_eq!(ni.owner.eq_poll(&ni.seg).unwrap(), None);
            let r = ni.owner.eq_unblock(&ni.seg, &[false; 4]);
            assert!(
                matches!(r, Err(NiError::Corrupt { .. })),
                "{claimer} {record:#x}: {r:?}"
            );
            let ev = ni.owner.eq_poll(&ni.seg).unwrap().unwrap();
            assert_eq!(ev.initiator, 1);
        }
        // A record that vouches (ACTIVE from ticket 0): a live claimer at work.
        let mut ni = Ni::new(64);
        user_entry(&mut ni);
        seq_word(&ni, 0).store(seq_claimed(0, 3), Ordering::Release);
        let rec = ni.seg.word(ni.geo.record(3).unwrap()).unwrap();
        rec.store(ACTIVE, Ordering::Release);
        assert_eq!(
            ni.owner.eq_unblock(&ni.seg, &[false; 4]).unwrap(),
            Unblocked::InFlight(3)
        );
        rec.store(0, Ordering::Release);
        assert!(ni.owner.eq_unblock(&ni.seg, &[false; 4]).is_err());
        assert_eq!(ni.owner.eq_head(), 1);
    }

    /// A sequence word no producer writes at the head is a typed error once, repaired (the
    /// slot is free for the next lap) and skipped; nothing published after it is lost.
    #[test]
    fn corrupt_sequence_words_are_repaired() {
        let cap = 64u64;
        for bad in [
            0xdead_beef,
            u64::MAX,
            seq_published(cap),
            seq_published(5),
            seq_claimed(cap, 1),
            SEQ_CLAIMED | 7,
        ] {
            let mut ni = Ni::new(64);
            user_entry(&mut ni);
            seq_word(&ni, 0).store(bad, Ordering::Release);
            let d: &[&[u8]] = &[b"q"];
            // The producer never claims over it: it takes ticket 1.
            ni.nic().put(1, None, &put_args(PT_USER, 0, 0, d)).unwrap();
            let r = ni.owner.eq_poll(&ni.seg);
            assert!(matches!(r, Err(NiError::Corrupt { .. })), "{bad:#x}: {r:?}");
            let ev = ni.owner.eq_poll(&ni.seg).unwrap().unwrap();
            assert_eq!(ev.initiator, 1, "{bad:#x}");
            ni.owner.eq_publish_head(&ni.seg).unwrap();
            // Two laps: the repaired slot is claimed again, every event read once.
            for i in 0..2 * cap {
                let mut a = put_args(PT_USER, 0, 0, d);
                a.hdr_data = i;
                ni.nic().put(1, None, &a).unwrap();
                let ev = ni.owner.eq_poll(&ni.seg).unwrap().unwrap();
                assert_eq!(ev.hdr_data, i, "{bad:#x}");
                ni.owner.eq_publish_head(&ni.seg).unwrap();
            }
        }
    }

    /// The tail word is a hint: any value costs producers a walk, never an overwrite of an
    /// unread event; a hint past a free head leaves a hole the owner skips (and reports),
    /// and a hint past every claim is put back.
    #[test]
    fn any_tail_costs_a_walk_never_an_overwrite() {
        let cap = 64u64;
        for tail in [0, 1, 2, 3, 5, 40, cap, cap + 1, cap + 3, 1 << 40, u64::MAX] {
            let mut ni = Ni::new(64);
            user_entry(&mut ni);
            let d: &[&[u8]] = &[b"q"];
            // Three unread events.
            for i in 0..3 {
                let mut a = put_args(PT_USER, 0, 0, d);
                a.hdr_data = 100 + i;
                ni.nic().put(1, None, &a).unwrap();
            }
            ni.seg.word(EQ_TAIL).unwrap().store(tail, Ordering::Relaxed);
            let mut a = put_args(PT_USER, 0, 0, d);
            a.hdr_data = 200;
            assert!(matches!(
                ni.nic().put(2, None, &a).unwrap(),
                Outcome::Done { .. }
            ));
            let mut seen = Vec::new();
            let mut errors = 0;
            for _ in 0..3 * cap {
                match ni.owner.eq_poll(&ni.seg) {
                    Ok(Some(ev)) => seen.push(ev.hdr_data),
                    Ok(None) => match ni.owner.eq_unblock(&ni.seg, &[false; 4]) {
                        Ok(Unblocked::Clear) if seen.len() == 4 => break,
                        Ok(_) => {}
                        Err(_) => errors += 1,
                    },
                    Err(e) => panic!("tail {tail}: {e}"),
                }
            }
            assert_eq!(seen, [100, 101, 102, 200], "tail {tail}");
            assert!(errors <= cap, "tail {tail}");
            // And the queue works on.
            ni.owner.eq_publish_head(&ni.seg).unwrap();
            for i in 0..cap {
                let mut a = put_args(PT_USER, 0, 0, d);
                a.hdr_data = i;
                ni.nic().put(1, None, &a).unwrap();
                let ev = ni.owner.eq_poll(&ni.seg).unwrap().unwrap();
                assert_eq!(ev.hdr_data, i, "tail {tail}");
                ni.owner.eq_publish_head(&ni.seg).unwrap();
            }
        }
    }

    /// A head word a peer rewrote: producers never overwrite an unread event (they refuse,
    /// or find the free tickets), and the owner's check repairs it.
    #[test]
    fn a_corrupt_head_word_is_repaired() {
        for head in [u64::MAX, 1 << 40, 200, 63] {
            let mut ni = Ni::new(64);
            user_entry(&mut ni);
            let d: &[&[u8]] = &[b"q"];
            let mut a = put_args(PT_USER, 0, 0, d);
            a.hdr_data = 1;
            ni.nic().put(1, None, &a).unwrap();
            ni.seg.word(EQ_HEAD).unwrap().store(head, Ordering::Release);
            a.hdr_data = 2;
            let early = ni.nic().put(1, None, &a).unwrap();
            assert!(matches!(
                ni.owner.verify(&ni.seg),
                Err(NiError::Corrupt { .. })
            ));
            assert!(ni.owner.verify(&ni.seg).is_ok(), "repaired");
            // The owner reads what is there (skipping, and reporting once, the hole a claim
            // beyond a forged head left).
            let mut got = Vec::new();
            let mut errors = 0;
            for _ in 0..200 {
                match ni.owner.eq_poll(&ni.seg).unwrap() {
                    Some(e) => got.push(e.hdr_data),
                    None => match ni.owner.eq_unblock(&ni.seg, &[false; 4]) {
                        Ok(Unblocked::Clear) => break,
                        Ok(other) => panic!("head {head}: {other:?}"),
                        Err(_) => errors += 1,
                    },
                }
            }
            assert!(errors <= 1, "head {head}: {errors} errors");
            ni.owner.eq_publish_head(&ni.seg).unwrap();
            a.hdr_data = 3;
            assert!(matches!(
                ni.nic().put(1, None, &a).unwrap(),
                Outcome::Done { .. }
            ));
            got.extend(ni.events().iter().map(|e| e.hdr_data));
            match early {
                Outcome::Done { .. } => assert_eq!(got, [1, 2, 3], "head {head}"),
                Outcome::Refused(f) => {
                    assert_eq!(f, NiFail::EqFull);
                    assert_eq!(got, [1, 3], "head {head}");
                }
            }
        }
    }

    /// `lm_drained`: an exhausted entry is re-linked only when no live walker that names it
    /// holds a claimed slot and no event about it is unread, whatever `used` says; a lost
    /// walker's bytes are written off.
    #[test]
    fn lm_drained_follows_the_claims_not_the_counts() {
        let lm = MeOptions {
            manage_local: true,
            ..PUT
        };
        for walker_lost in [false, true] {
            let mut ni = Ni::new(256);
            let a = ni
                .owner
                .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 0, 32, lm))
                .unwrap();
            ni.owner
                .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 32, 64, lm))
                .unwrap();
            // Rank 3 claims 16 bytes of entry `a` and stops before its event.
            let nic = ni.nic();
            let mut cl = Claimer::new(&nic, 3).unwrap();
            cl.slot = nic.eq_reserve(&mut cl).unwrap();
            cl.record_lm(a);
            let counter = ni.seg.word(ni.geo.me(a).unwrap() + CACHE_LINE).unwrap();
            assert_eq!(counter.fetch_add(16, Ordering::AcqRel), 0);
            cl.dead = true;
            drop(cl);
            // Rank 1 takes the other 16, and a third put does not fit (unlink, used 32).
            let v = [5u8; 16];
            let d: &[&[u8]] = &[&v];
            for _ in 0..2 {
                ni.nic()
                    .put(1, None, &put_args(PT_REQUEST, 0, 0, d))
                    .unwrap();
            }
            // A forged `used` of 0 changes nothing.
            ni.seg
                .word(ni.geo.me(a).unwrap() + CACHE_LINE + 8)
                .unwrap()
                .store(0, Ordering::Relaxed);
            let mut lost = [false; 4];
            assert_eq!(
                ni.owner.lm_drained(&ni.seg, a, &lost).unwrap(),
                Drained::Busy
            );
            lost[3] = walker_lost;
            assert_eq!(
                ni.owner.lm_drained(&ni.seg, a, &lost).unwrap(),
                Drained::Busy,
                "rank 1's event is unread"
            );
            if walker_lost {
                assert_eq!(
                    ni.owner.eq_unblock(&ni.seg, &lost).unwrap(),
                    Unblocked::SkippedLost(3)
                );
            } else {
                // It was only slow: it publishes after all.
                let nic = ni.nic();
                let mut cl = Claimer::new(&nic, 3).unwrap();
                cl.eq_from = Some(0);
                cl.lm = ACTIVE | (a as u64 + 1);
                let mut ev = Event::new(EventKind::Put, 3, PT_REQUEST);
                ev.me = a;
                ev.mlength = 16;
                nic.eq_publish(
                    Claim {
                        seq: 0,
                        ring: false,
                    },
                    &ev,
                )
                .unwrap();
            }
            let mut kinds = Vec::new();
            while let Some(e) = ni.owner.eq_poll(&ni.seg).unwrap() {
                kinds.push((e.kind, e.initiator));
            }
            // Rank 1's second put reserved its slot before its unlink's.
            let mut want = vec![
                (EventKind::Put, 1),
                (EventKind::Put, 1),
                (EventKind::Unlink, 1),
            ];
            if !walker_lost {
                want.insert(0, (EventKind::Put, 3));
            }
            assert_eq!(kinds, want);
            assert_eq!(
                ni.owner.lm_drained(&ni.seg, a, &lost).unwrap(),
                Drained::Yes
            );
            ni.owner.lm_relink(&ni.seg, a).unwrap();
            assert_eq!(
                ni.owner.lm_drained(&ni.seg, a, &lost).unwrap(),
                Drained::NotExhausted
            );
        }
    }

    /// Every word walkers read that differs from the owner's copy is repaired by `verify`
    /// (and reported); puts then match again.
    #[test]
    fn verify_repairs_the_portal_table_and_entries() {
        let lm = MeOptions {
            manage_local: true,
            ..PUT
        };
        type At = fn(&Ni) -> usize;
        let words: Vec<(&str, At, u64)> = vec![
            ("pt state", |ni| ni.geo.pt(PT_REQUEST).unwrap(), 77),
            ("pt head", |ni| ni.geo.pt(PT_REQUEST).unwrap() + 8, 5),
            ("pt head past", |ni| ni.geo.pt(PT_REQUEST).unwrap() + 8, 999),
            ("pt options", |ni| ni.geo.pt(PT_REQUEST).unwrap() + 16, 0),
            ("me state", |ni| ni.geo.me(0).unwrap(), 0x1234),
            ("me match", |ni| ni.geo.me(0).unwrap() + 8, 7),
            ("me ignore", |ni| ni.geo.me(0).unwrap() + 16, 0xF0),
            ("me options", |ni| ni.geo.me(0).unwrap() + 24, 0xFFFF),
            ("me start", |ni| ni.geo.me(0).unwrap() + 32, 1 << 40),
            ("me length", |ni| ni.geo.me(0).unwrap() + 40, 0),
            ("me next", |ni| ni.geo.me(0).unwrap() + 48, 9),
            ("me used", |ni| ni.geo.me(0).unwrap() + 72, 1 << 50),
        ];
        for (what, at, value) in words {
            let mut ni = Ni::new(256);
            ni.owner
                .me_append(&ni.seg, PT_REQUEST, spec(1, 0, 0, 64, lm))
                .unwrap();
            ni.owner
                .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 64, 64, lm))
                .unwrap();
            ni.seg
                .word(at(&ni))
                .unwrap()
                .store(value, Ordering::Release);
            let v = [1u8; 8];
            let d: &[&[u8]] = &[&v];
            // Whatever the walk does with it: a typed error or a refusal, never a panic.
            let _ = ni.nic().put(0, None, &put_args(PT_REQUEST, 1, 0, d));
            let r = ni.owner.verify(&ni.seg);
            assert!(matches!(r, Err(NiError::Corrupt { .. })), "{what}: {r:?}");
            assert!(ni.owner.verify(&ni.seg).is_ok(), "{what}: repaired");
            // (Flow control may have disabled the portal entry meanwhile.)
            ni.owner.pt_enable(&ni.seg, PT_REQUEST).unwrap();
            let got = ni
                .nic()
                .put(0, None, &put_args(PT_REQUEST, 1, 0, d))
                .unwrap();
            assert!(matches!(got, Outcome::Done { .. }), "{what}: {got:?}");
        }
    }

    /// A wire that keeps the entries it checked (`MeSeen`) acts on them only while their
    /// state word is unchanged: a field a peer rewrote under the same state word is not
    /// used (the owner's check repairs it under a new generation), a field read during a
    /// corruption is dropped with the repair, and an entry unlinked and appended again is
    /// read again.
    #[test]
    fn kept_entries_follow_the_state_word() {
        let mut ni = Ni::new(256);
        let a = ni
            .owner
            .me_append(&ni.seg, PT_USER, spec(0, !0, 0, 64, PUT))
            .unwrap();
        let mut seen = MeSeen::new(&ni.geo);
        let d: &[&[u8]] = &[b"abc"];
        let put = |ni: &Ni, seen: &mut MeSeen| {
            ni.nic()
                .put_seen(seen, 1, &put_args(PT_USER, 0, 8, d))
                .unwrap()
        };
        let start = ni.geo.me(a).unwrap() + 32;
        assert_eq!(put(&ni, &mut seen), Outcome::Done { me: a, start: 8 });
        // A stray write of the start under the same state word: the kept entry is used.
        ni.seg.word(start).unwrap().store(128, Ordering::Relaxed);
        assert_eq!(put(&ni, &mut seen), Outcome::Done { me: a, start: 8 });
        assert!(matches!(
            ni.owner.verify(&ni.seg),
            Err(NiError::Corrupt { .. })
        ));
        // A wire that first reads the entry during a corruption keeps the corrupt (but
        // in-range) start only until the repair.
        let mut late = MeSeen::new(&ni.geo);
        ni.seg.word(start).unwrap().store(128, Ordering::Relaxed);
        assert_eq!(put(&ni, &mut late), Outcome::Done { me: a, start: 136 });
        assert_eq!(put(&ni, &mut late), Outcome::Done { me: a, start: 136 });
        assert!(ni.owner.verify(&ni.seg).is_err());
        assert_eq!(put(&ni, &mut late), Outcome::Done { me: a, start: 8 });
        assert_eq!(put(&ni, &mut seen), Outcome::Done { me: a, start: 8 });
        // Unlinked and appended again elsewhere: a new state word, read again.
        ni.owner.me_unlink(&ni.seg, a).unwrap();
        let b = ni
            .owner
            .me_append(&ni.seg, PT_USER, spec(0, !0, 64, 64, PUT))
            .unwrap();
        assert_eq!(a, b, "the same record");
        assert_eq!(put(&ni, &mut seen), Outcome::Done { me: b, start: 72 });
        assert_eq!(ni.events().len(), 7);
    }

    /// A locally managed entry must post events (its owner re-links it by them).
    #[test]
    fn locally_managed_entries_post_events() {
        let mut ni = Ni::new(64);
        let bad = MeOptions {
            manage_local: true,
            event_disable: true,
            ..PUT
        };
        assert!(ni
            .owner
            .me_append(&ni.seg, PT_USER, spec(0, 0, 0, 64, bad))
            .is_err());
    }
}
