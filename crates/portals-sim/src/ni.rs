//! The Portals network interface of one rank, in that rank's shared memory.
//!
//! Everything a Portals NIC keeps at the target lives in the target's exported segment, so
//! that the **wire** (the initiator's process, see the [crate docs](crate)) can do the
//! target NIC's work on it: walk the match list, claim space, deposit, post the event.
//!
//! ```text
//! word area (atomics only)
//!   line 0            EQ doorbell (futex word), then the waiting word (the owner may sleep)
//!   line 1            abort word (a rank that panicked sets it)
//!   line 2            EQ head, published by the owner (lazily: every quarter ring, and idle)
//!   line 3            EQ tail, claimed by producers (CAS)
//!   NPT lines         portal table: state (enabled/disabled), list head, options
//!   departed words    one per rank, set by a rank that ends cleanly
//!   max_me × 2 lines  match entries: line 0 = state+generation, match bits, ignore bits,
//!                     options, start, length, next; line 1 = locally managed offset, used
//!   eq_capacity lines event queue slots: sequence word, then the event's seven words
//! byte area
//!   whatever the owner describes with match entries (receive buffers, segment, ...)
//! ```
//!
//! Concurrency. Producers (any rank's wire) claim an event slot with a CAS on the tail,
//! write the event words, and publish with a `Release` store of the slot's sequence word;
//! the owner reads slots in order. A producer rings the doorbell only if the owner announced
//! that it may sleep (see [`NiOwner::announce_wait`]): a spinning owner costs its producers
//! no atomic on its lines and no fence beyond the tail CAS. Match entries are read under a seqlock (state word
//! before and after), so a walker never acts on a torn entry; use-once entries are taken
//! with a CAS of their state, locally managed space with a `fetch_add` of the entry's
//! offset. Only the owner changes the list structure; a walker that races a re-link may
//! end its walk early, which at worst disables the portal entry spuriously (the initiator
//! then sends again after the owner re-enables it: nothing is lost).

use std::sync::atomic::{fence, AtomicU64, Ordering};

use am_shm::{Imported, Segment, ShmError, CACHE_LINE};

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

const DOORBELL: usize = 0;
/// Nonzero while the owner may sleep on the doorbell (beside it: read with the ring's line).
const WAITING: usize = 8;
/// Offset of the abort word.
pub const ABORT: usize = CACHE_LINE;
const EQ_HEAD: usize = 2 * CACHE_LINE;
const EQ_TAIL: usize = 3 * CACHE_LINE;
const PT_BASE: usize = 4 * CACHE_LINE;
const ME_BYTES: usize = 2 * CACHE_LINE;
/// Offset of an entry's `next` link (word 6 of its first line).
const ME_NEXT: usize = 48;
const EVENT_BYTES: usize = CACHE_LINE;
/// Words per cache line: a match entry's first line, an event slot, a portal entry.
const LINE_WORDS: usize = CACHE_LINE / 8;
type Line = [AtomicU64; LINE_WORDS];

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

const PT_ENABLED: u64 = 1;
const PT_DISABLED: u64 = 2;
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

/// The geometry of one rank's NI memory; every rank of a job uses the same. Made by
/// [`NiGeometry::new`], which checks it and computes the offsets once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NiGeometry {
    ranks: u32,
    max_me: u32,
    eq_capacity: u32,
    bytes: usize,
    me_base: usize,
    eq_base: usize,
}

impl NiGeometry {
    /// `ranks` ranks (one departed word each), `max_me` match-entry records (1..=65536),
    /// `eq_capacity` event-queue slots (a power of two, at least 8) and a byte area of `bytes`.
    pub fn new(
        ranks: u32,
        max_me: u32,
        eq_capacity: u32,
        bytes: usize,
    ) -> Result<NiGeometry, NiError> {
        if !eq_capacity.is_power_of_two() || eq_capacity < 8 {
            return Err(NiError::Invalid(format!(
                "event queue of {eq_capacity} slots (a power of two, at least 8)"
            )));
        }
        if max_me == 0 || max_me > 1 << 16 {
            return Err(NiError::Invalid(format!(
                "{max_me} match entries (1..=65536)"
            )));
        }
        let departed_base = PT_BASE + NPT * CACHE_LINE;
        let me_base = departed_base + (ranks as usize * 8).div_ceil(CACHE_LINE) * CACHE_LINE;
        let eq_base = me_base + max_me as usize * ME_BYTES;
        Ok(NiGeometry {
            ranks,
            max_me,
            eq_capacity,
            bytes,
            me_base,
            eq_base,
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

    fn pt(&self, pt: u8) -> Result<usize, NiError> {
        if pt as usize >= NPT {
            return Err(NiError::Invalid(format!("portal index {pt} (0..{NPT})")));
        }
        Ok(PT_BASE + pt as usize * CACHE_LINE)
    }

    fn me(&self, idx: u32) -> Result<usize, NiError> {
        if idx >= self.max_me {
            return Err(NiError::Corrupt {
                what: "match entry index",
                value: idx as u64,
            });
        }
        Ok(self.me_base + idx as usize * ME_BYTES)
    }

    fn eq_slot(&self, seq: u64) -> usize {
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
    /// (`Unlink` event with the bytes used) and goes on to the next entry.
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
    fn new(kind: EventKind, initiator: u32, pt: u8) -> Event {
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

    fn words(&self) -> [u64; 7] {
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

    #[inline]
    fn from_words(w: [u64; 7]) -> Result<Event, NiError> {
        let corrupt = |what| NiError::Corrupt { what, value: w[0] };
        let Some(kind) = EventKind::from_u8(w[0] as u8) else {
            return Err(corrupt("event kind"));
        };
        let Some(fail) = NiFail::from_u8((w[0] >> 8) as u8) else {
            return Err(corrupt("event failure"));
        };
        let pt = (w[0] >> 16) as u8;
        if pt as usize >= NPT || (w[0] >> 24) as u8 != 0 {
            return Err(corrupt("event portal index"));
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
    /// Ask for an `Ack` event at the initiator.
    pub ack: bool,
    /// Ask for a `Send` event at the initiator.
    pub send_event: bool,
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
/// access ([`am_shm::portal::attach_nic`]). `imp` must be a writer's view of `seg`.
#[derive(Clone, Copy)]
pub struct Nic<'a> {
    seg: &'a Segment,
    imp: &'a Imported,
    geo: &'a NiGeometry,
}

/// A claimed event slot, and whether its owner must be woken once it is published.
#[derive(Debug, Clone, Copy)]
struct Claim {
    seq: u64,
    ring: bool,
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

/// What a match-list walk found.
enum Walked {
    /// Entry `idx` matched; the data goes to (or comes from) `at` in the byte area.
    Found {
        idx: MeIndex,
        at: usize,
        /// The entry was use-once (the walk took it: an `Unlink` event is due).
        use_once: bool,
    },
    Refused(NiFail),
}

impl<'a> Nic<'a> {
    /// A view of the NI in `seg` (written through `imp`, a view of the same memory).
    pub fn new(seg: &'a Segment, imp: &'a Imported, geo: &'a NiGeometry) -> Nic<'a> {
        Nic { seg, imp, geo }
    }

    #[inline]
    fn word(&self, off: usize) -> Result<&'a AtomicU64, NiError> {
        Ok(self.seg.word(off)?)
    }

    /// Rings the NI's doorbell if its owner announced that it may sleep. (Posting an event
    /// does this by itself.)
    #[inline]
    pub fn ring(&self) -> Result<(), NiError> {
        if self.word(WAITING)?.load(Ordering::SeqCst) != 0 {
            self.seg.doorbell(DOORBELL)?.ring();
        }
        Ok(())
    }

    /// Claims an event slot; `None` if the queue is full.
    ///
    /// The successful CAS is `SeqCst` and is followed by a `SeqCst` load of the waiting
    /// word: the store-buffering pair of [`NiOwner::announce_wait`] (waiting word stored,
    /// then the tail loaded, both `SeqCst`). In the single order of `SeqCst` operations
    /// either our load follows the owner's store (we see it and ring after publishing; the
    /// owner cleared the doorbell's flag before its store, so the ring is not lost), or the
    /// owner's tail load follows our CAS (it sees the claim and does not sleep). On x86 the
    /// CAS is a locked instruction anyway and the load a plain one: no fence of its own.
    #[inline(always)]
    fn eq_reserve(&self) -> Result<Option<Claim>, NiError> {
        // The waiting word, head and tail in one checked run (the doorbell is before it).
        let q: &[AtomicU64; Q_WORDS] = words(self.seg, WAITING)?;
        let (head_w, tail_w) = (&q[Q_HEAD], &q[Q_TAIL]);
        let cap = self.geo.eq_capacity as u64;
        let mut tail = tail_w.load(Ordering::Relaxed);
        loop {
            // Acquire: the owner read the slot we are about to reuse before publishing head.
            let head = head_w.load(Ordering::Acquire);
            if tail.wrapping_sub(head) >= cap {
                return Ok(None);
            }
            match tail_w.compare_exchange_weak(
                tail,
                tail.wrapping_add(1),
                Ordering::SeqCst,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(t) => tail = t,
            }
        }
        let ring = q[0].load(Ordering::SeqCst) != 0;
        Ok(Some(Claim { seq: tail, ring }))
    }

    /// Writes `ev` into the claimed slot and publishes it (and rings, if the claim says so).
    fn eq_publish(&self, claim: Claim, ev: &Event) -> Result<(), NiError> {
        self.eq_publish_words(claim, ev.words())
    }

    /// [`eq_publish`](Self::eq_publish) of an event's words: the hot path builds them in
    /// registers, stores the line's seven words and publishes with one more.
    #[inline(always)]
    fn eq_publish_words(&self, claim: Claim, words: [u64; 7]) -> Result<(), NiError> {
        let slot = line(self.seg, self.geo.eq_slot(claim.seq))?;
        for (w, v) in slot[1..].iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        slot[0].store(claim.seq.wrapping_add(1), Ordering::Release);
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

    /// Posts `ev` if the queue has room; `false` if it had none (the event is lost, which
    /// only events whose information is also kept elsewhere may tolerate).
    pub fn try_post(&self, ev: &Event) -> Result<bool, NiError> {
        match self.eq_reserve()? {
            Some(c) => self.eq_publish(c, ev).map(|()| true),
            None => Ok(false),
        }
    }

    /// Reads match entry `idx` (both its lines, one bounds check) under its seqlock;
    /// `Ok(None)` if it is not linked or changed meanwhile. Also returns its `next` link.
    #[inline(always)]
    fn read_me(&self, idx: MeIndex) -> Result<(Option<MeRecord<'a>>, u64), NiError> {
        let l: &'a [AtomicU64; 2 * LINE_WORDS] = words(self.seg, self.geo.me(idx)?)?;
        let s1 = l[0].load(Ordering::Acquire);
        let w: [u64; 6] = std::array::from_fn(|i| l[i + 1].load(Ordering::Relaxed));
        fence(Ordering::Acquire);
        let s2 = l[0].load(Ordering::Relaxed);
        let next = w[5];
        if next > self.geo.max_me as u64 {
            return Err(NiError::Corrupt {
                what: "match entry link",
                value: next,
            });
        }
        if s1 != s2 || s1 & 0xFF != ME_LINKED {
            return Ok((None, next));
        }
        let options = w[2];
        if options & !0xFF1F != 0 || (options >> 8) as usize >= NPT {
            return Err(NiError::Corrupt {
                what: "match entry options",
                value: options,
            });
        }
        let (start, length) = (w[3], w[4]);
        if start
            .checked_add(length)
            .is_none_or(|end| end > self.geo.bytes as u64)
        {
            return Err(NiError::Corrupt {
                what: "match entry range",
                value: start,
            });
        }
        Ok((
            Some(MeRecord {
                words: l,
                state: s1,
                match_bits: w[0],
                ignore_bits: w[1],
                options,
                start: start as usize,
                length: length as usize,
            }),
            next,
        ))
    }

    #[inline(always)]
    fn pt_state(&self, pt: u8) -> Result<(u64, u64), NiError> {
        let l = line(self.seg, self.geo.pt(pt)?)?;
        let state = l[0].load(Ordering::Acquire);
        let head = l[1].load(Ordering::Acquire);
        if head > self.geo.max_me as u64 {
            return Err(NiError::Corrupt {
                what: "portal list head",
                value: head,
            });
        }
        Ok((state, head))
    }

    /// Walks portal `pt`'s match list for an operation of `len` bytes at `remote_offset`,
    /// claims the matching entry's space, and reserves an event slot if the entry wants an
    /// event. Returns the entry and the byte-area offset, or the failure.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn walk(
        &self,
        initiator: u32,
        pt: u8,
        match_bits: u64,
        len: usize,
        remote_offset: u64,
        is_get: bool,
        slot: &mut Option<Claim>,
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
            let (rec, next) = self.read_me(idx)?;
            cur = next;
            let Some(me) = rec else { continue };
            let opts = me.options;
            if (opts >> 8) as u8 != pt
                || opts & wants == 0
                || (match_bits ^ me.match_bits) & !me.ignore_bits != 0
            {
                continue;
            }
            let local = opts & OPT_MANAGE_LOCAL != 0;
            if !local
                && remote_offset
                    .checked_add(len as u64)
                    .is_none_or(|end| end > me.length as u64)
            {
                continue;
            }
            if opts & OPT_EVENT_DISABLE == 0 && slot.is_none() {
                *slot = self.eq_reserve()?;
                if slot.is_none() {
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
                    continue;
                }
            }
            let offset = if local && !is_get {
                let counter = &me.words[LINE_WORDS];
                let claim = lm_len(len) as u64;
                let length = me.length as u64;
                if claim == 0 {
                    if counter.load(Ordering::Acquire) > length {
                        continue;
                    }
                    0
                } else {
                    let off = counter.fetch_add(claim, Ordering::AcqRel);
                    if off.checked_add(claim).is_none_or(|end| end > length) {
                        if off <= length {
                            // The first claim that does not fit unlinks the entry: it records
                            // how much was claimed, then tells the owner.
                            me.words[LINE_WORDS + 1].store(off, Ordering::Release);
                            let mut ev = Event::new(EventKind::Unlink, initiator, pt);
                            ev.me = idx;
                            ev.used = off;
                            self.try_post(&ev)?;
                        }
                        continue;
                    }
                    off as usize
                }
            } else {
                remote_offset as usize
            };
            return Ok(Walked::Found {
                idx,
                at: me.start + offset,
                use_once,
            });
        }
        self.no_match(initiator, pt, slot)
    }

    /// The walk found no entry: flow control disables the portal entry, if it has it.
    #[cold]
    #[inline(never)]
    fn no_match(
        &self,
        initiator: u32,
        pt: u8,
        slot: &mut Option<Claim>,
    ) -> Result<Walked, NiError> {
        let base = self.geo.pt(pt)?;
        if self.word(base + 16)?.load(Ordering::Relaxed) & PT_FLOWCTRL != 0 {
            let won = self
                .word(base)?
                .compare_exchange(PT_ENABLED, PT_DISABLED, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
            if won {
                let ev = Event::new(EventKind::PtDisabled, initiator, pt);
                match slot.take() {
                    Some(s) => self.eq_publish(s, &ev)?,
                    // The portal entry's state word says it too; the event is a courtesy.
                    None => {
                        self.try_post(&ev)?;
                    }
                }
            }
            return Ok(Walked::Refused(NiFail::PtDisabled));
        }
        Ok(Walked::Refused(NiFail::NoMatch))
    }

    /// The wire for a put from `initiator` (whose own NI is `own`, for `Send`/`Ack` events)
    /// into this NI: matching, claiming, depositing and the `Put` event, all done here as the
    /// target's NIC would.
    #[inline(always)]
    pub fn put(
        &self,
        initiator: u32,
        own: Option<&Nic<'_>>,
        a: &PutArgs<'_>,
    ) -> Result<Outcome, NiError> {
        let len: usize = a.data.iter().map(|d| d.len()).sum();
        if len > u32::MAX as usize {
            return Err(NiError::Invalid(format!("a put of {len} bytes")));
        }
        let mut slot = None;
        let found = self.walk(
            initiator,
            a.pt,
            a.match_bits,
            len,
            a.remote_offset,
            false,
            &mut slot,
        )?;
        let outcome = match found {
            Walked::Found { idx, at, use_once } => {
                let mut o = at;
                for d in a.data {
                    self.imp.write(o, d)?;
                    o += d.len();
                }
                if let Some(s) = slot.take() {
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
                    let mut ev = Event::new(EventKind::Unlink, initiator, a.pt);
                    ev.me = idx;
                    self.try_post(&ev)?;
                }
                Outcome::Done {
                    me: idx,
                    start: at as u64,
                }
            }
            Walked::Refused(fail) => {
                if let Some(s) = slot.take() {
                    self.eq_publish(s, &Event::new(EventKind::Dropped, initiator, a.pt))?;
                }
                Outcome::Refused(fail)
            }
        };
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

    /// The wire for a get from `initiator` out of this NI into `dst`: matching, the read, the
    /// `Get` event here and the `Reply` event at `own`.
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
        let mut slot = None;
        let found = self.walk(
            initiator,
            pt,
            match_bits,
            dst.len(),
            remote_offset,
            true,
            &mut slot,
        )?;
        let outcome = match found {
            Walked::Found { idx, at, use_once } => {
                self.seg.read(at, dst)?;
                let mut ev = Event::new(EventKind::Get, initiator, pt);
                ev.match_bits = match_bits;
                ev.start = at as u64;
                ev.mlength = dst.len() as u32;
                ev.me = idx;
                ev.remote_offset = remote_offset;
                if let Some(s) = slot.take() {
                    self.eq_publish(s, &ev)?;
                }
                if use_once {
                    let mut u = Event::new(EventKind::Unlink, initiator, pt);
                    u.me = idx;
                    self.try_post(&u)?;
                }
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
                if let Some(s) = slot.take() {
                    self.eq_publish(s, &Event::new(EventKind::Dropped, initiator, pt))?;
                }
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

    /// Is portal entry `pt` enabled?
    pub fn pt_enabled(&self, pt: u8) -> Result<bool, NiError> {
        Ok(self.pt_state(pt)?.0 == PT_ENABLED)
    }
}

/// The owner's side of its NI: appends and unlinks match entries, enables portal entries and
/// reads its event queue. Its local mirror of each match list is what it trusts; the shared
/// copy is what walkers read.
#[derive(Debug)]
pub struct NiOwner {
    geo: NiGeometry,
    lists: [Vec<MeIndex>; NPT],
    specs: Vec<Option<(u8, MeSpec)>>,
    generation: Vec<u64>,
    free: Vec<MeIndex>,
    head: u64,
    published: u64,
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
            lists: Default::default(),
            specs: vec![None; geo.max_me as usize],
            generation: vec![0; geo.max_me as usize],
            free: (0..geo.max_me).rev().collect(),
            head: 0,
            published: 0,
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
        let idx = self
            .free
            .pop()
            .ok_or(NiError::NoFreeEntry(self.geo.max_me))?;
        let base = self.geo.me(idx)?;
        let g = self.generation[idx as usize] + 1;
        self.generation[idx as usize] = g;
        let state = seg.word(base)?;
        // Seqlock write: walkers that see WRITING, or a state that changed, skip the entry.
        state.store(g << 8 | ME_WRITING, Ordering::Relaxed);
        fence(Ordering::Release);
        let words = [
            spec.match_bits,
            spec.ignore_bits,
            spec.options.encode(pt),
            spec.start as u64,
            spec.length as u64,
        ];
        for (i, w) in words.iter().enumerate() {
            seg.word(base + 8 * (i + 1))?.store(*w, Ordering::Relaxed);
        }
        seg.word(base + CACHE_LINE)?.store(0, Ordering::Relaxed);
        seg.word(base + CACHE_LINE + 8)?
            .store(NOT_USED, Ordering::Relaxed);
        state.store(g << 8 | ME_LINKED, Ordering::Release);
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

    /// A locally managed entry that ran out of space: the bytes claimed in it, or `None` while
    /// it still has room.
    pub fn lm_used(&self, seg: &Segment, idx: MeIndex) -> Result<Option<u64>, NiError> {
        let used = seg
            .word(self.geo.me(idx)? + CACHE_LINE + 8)?
            .load(Ordering::Acquire);
        Ok((used != NOT_USED).then_some(used))
    }

    /// Bytes claimed so far in a locally managed entry (may exceed its length once full).
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

    /// Re-links a locally managed entry whose every message was consumed: offset back to 0,
    /// appended at the end of its match list (the seed's chained receive buffers).
    pub fn lm_relink(&mut self, seg: &Segment, idx: MeIndex) -> Result<(), NiError> {
        let (pt, _) = self
            .spec(idx)
            .ok_or_else(|| NiError::Invalid(format!("entry {idx}")))?;
        self.unlink_from_list(seg, pt, idx)?;
        let base = self.geo.me(idx)?;
        seg.word(base + CACHE_LINE + 8)?
            .store(NOT_USED, Ordering::Relaxed);
        seg.word(base + CACHE_LINE)?.store(0, Ordering::Release);
        self.link_at_tail(seg, pt, idx)
    }

    /// Re-enables portal entry `pt` after flow control disabled it.
    pub fn pt_enable(&self, seg: &Segment, pt: u8) -> Result<(), NiError> {
        seg.word(self.geo.pt(pt)?)?
            .store(PT_ENABLED, Ordering::Release);
        Ok(())
    }

    /// Is portal entry `pt` disabled?
    pub fn pt_disabled(&self, seg: &Segment, pt: u8) -> Result<bool, NiError> {
        Ok(seg.word(self.geo.pt(pt)?)?.load(Ordering::Acquire) != PT_ENABLED)
    }

    /// Is the next event published? (The idle poll: one load.)
    #[inline]
    pub fn eq_ready(&self, seg: &Segment) -> Result<bool, NiError> {
        let off = self.geo.eq_slot(self.head);
        Ok(seg.word(off)?.load(Ordering::Acquire) == self.head.wrapping_add(1))
    }

    /// Takes the next event, if published.
    #[inline(always)]
    pub fn eq_poll(&mut self, seg: &Segment) -> Result<Option<Event>, NiError> {
        let slot = line(seg, self.geo.eq_slot(self.head))?;
        if slot[0].load(Ordering::Acquire) != self.head.wrapping_add(1) {
            return Ok(None);
        }
        let w: [u64; 7] = std::array::from_fn(|i| slot[i + 1].load(Ordering::Relaxed));
        self.head = self.head.wrapping_add(1);
        if self.head.wrapping_sub(self.published) >= (self.geo.eq_capacity / 4) as u64 {
            self.eq_publish_head(seg)?;
        }
        Event::from_words(w).map(Some)
    }

    /// Publishes how far the queue was read, so producers may reuse those slots. Done every
    /// quarter ring by [`eq_poll`](Self::eq_poll); call it when idle, too.
    #[inline]
    pub fn eq_publish_head(&mut self, seg: &Segment) -> Result<(), NiError> {
        if self.published != self.head {
            seg.word(EQ_HEAD)?.store(self.head, Ordering::Release);
            self.published = self.head;
        }
        Ok(())
    }

    /// The doorbell producers ring after posting while the owner is announced waiting.
    pub fn doorbell<'s>(&self, seg: &'s Segment) -> Result<am_shm::Doorbell<'s>, NiError> {
        Ok(seg.doorbell(DOORBELL)?)
    }

    /// On the way to sleep: clears the doorbell, announces that producers must ring it, and
    /// says whether sleeping is safe (`false`: an event is claimed and not yet read, so
    /// poll instead). Follow with [`end_wait`](Self::end_wait) whatever the answer.
    ///
    /// The doorbell is cleared before the announcement: a producer that sees the
    /// announcement rings after it (its `SeqCst` load synchronizes with our `SeqCst` store),
    /// so its ring is not undone by our clear. The announcement is `SeqCst` and so is the
    /// tail load after it; against the producer's `SeqCst` claim and load of the waiting
    /// word (see `Nic::eq_reserve`) no claim can go unnoticed by both sides.
    pub fn announce_wait(&self, seg: &Segment) -> Result<bool, NiError> {
        seg.doorbell(DOORBELL)?.take();
        seg.word(WAITING)?.store(1, Ordering::SeqCst);
        let tail = seg.word(EQ_TAIL)?.load(Ordering::SeqCst);
        Ok(tail == self.head)
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
            let seg = Segment::heap(geo.words_len(), bytes);
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
            ack: false,
            send_event: false,
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
        assert_eq!(ni.seg.bytes(107, 2).unwrap(), b"xy");
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
        let claim = ni.nic().eq_reserve().unwrap().unwrap();
        assert!(!claim.ring, "not announced");
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
            let b = ni.seg.bytes(start as usize, len as usize).unwrap();
            assert!(b.iter().all(|&x| x == b[0]), "deposit intact");
            end = start + len as u64;
        }
    }

    proptest! {
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
}
