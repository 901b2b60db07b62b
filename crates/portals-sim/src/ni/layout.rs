//! Where everything of one rank's NI lies in its segment (the picture is in the
//! [module docs](super)), the errors, and the views a NIC reaches it through: [`Nic`] (one
//! rank's NI as a wire sees it) cut into [`Parts`], or into [`NiRuns`] kept from start-up.
//! The leaf of `ni`: it imports no other module of it.

use am_shm::claim::Laps;
use am_shm::sync::AtomicU64;

use am_nic::wake::Wakers;
use am_shm::{Imported, Rung, Segment, ShmError, WordRun, CACHE_LINE};

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
pub(super) const PT_BASE: usize = 2 * CACHE_LINE;
pub(super) const ME_BYTES: usize = 2 * CACHE_LINE;
/// Offset of an entry's `next` link (word 6 of its first line).
pub(super) const ME_NEXT: usize = 48;
pub(super) const EVENT_BYTES: usize = CACHE_LINE;
/// Words per cache line: a match entry's first line, an event slot, a portal entry.
pub(super) const LINE_WORDS: usize = CACHE_LINE / 8;
pub(super) type Line = [AtomicU64; LINE_WORDS];

/// A sender record in use (the claimed ring's: `ACTIVE | lowest ticket`).
pub(crate) const ACTIVE: u64 = am_shm::claim::ACTIVE;
/// Word of a sender record: the event-queue claim.
pub(super) const REC_EQ: usize = 0;
/// Word of a sender record: the locally managed entry.
pub(super) const REC_LM: usize = 1;

/// The cache line at byte `off` of `seg`'s word area, bounds-checked once for all its words.
#[inline(always)]
pub(super) fn line(seg: &Segment, off: usize) -> Result<&Line, NiError> {
    words(seg, off)
}

/// `N` words from byte `off` of `seg`'s word area as an array: one bounds check, and none
/// at each index.
#[inline(always)]
pub(super) fn words<const N: usize>(seg: &Segment, off: usize) -> Result<&[AtomicU64; N], NiError> {
    match seg.words(off, N)?.try_into() {
        Ok(a) => Ok(a),
        Err(_) => Err(short_run(off)),
    }
}

#[cold]
pub(super) fn short_run(off: usize) -> NiError {
    NiError::Invalid(format!("a run of words at {off}"))
}

/// Word offsets in the run from `WAITING` that `Nic::eq_reserve` reads.
pub(super) const Q_HEAD: usize = (EQ_HEAD - WAITING) / 8;
pub(super) const Q_TAIL: usize = (EQ_TAIL - WAITING) / 8;
pub(super) const Q_WORDS: usize = Q_TAIL + 1;

pub(crate) const PT_ENABLED: u64 = 1;
pub(crate) const PT_DISABLED: u64 = 2;
/// Portal-entry option: flow control (an entry with no room disables the portal entry).
pub(super) const PT_FLOWCTRL: u64 = 1;

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
pub(super) fn bad_rank(r: u32, ranks: u32) -> NiError {
    NiError::Invalid(format!("rank {r} of a job of {ranks}"))
}

#[cold]
pub(super) fn corrupt(what: &'static str, value: u64) -> NiError {
    NiError::Corrupt { what, value }
}

/// The geometry of one rank's NI memory; every rank of a job uses the same. Made by
/// [`NiGeometry::new`], which checks it and computes the offsets once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NiGeometry {
    pub(super) ranks: u32,
    pub(super) max_me: u32,
    pub(super) eq_capacity: u32,
    /// The event queue's lap arithmetic (of `eq_capacity` slots).
    pub(super) eq_laps: Laps,
    pub(super) bytes: usize,
    pub(super) room: usize,
    pub(super) rec_base: usize,
    pub(super) me_base: usize,
    pub(super) eq_base: usize,
    /// The same three, in lines from the portal table.
    pub(super) rec_line: usize,
    pub(super) me_line: usize,
    pub(super) eq_line: usize,
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
        let eq_laps = Laps::new(eq_capacity as u64)
            .filter(|_| eq_capacity.is_power_of_two() && (8..=1 << 22).contains(&eq_capacity));
        let Some(eq_laps) = eq_laps else {
            return Err(NiError::Invalid(format!(
                "event queue of {eq_capacity} slots (a power of two, 8..=2^22)"
            )));
        };
        if max_me == 0 || max_me > 1 << 16 {
            return Err(NiError::Invalid(format!(
                "{max_me} match entries (1..=65536)"
            )));
        }
        if ranks == 0 || ranks > 1 << 24 {
            return Err(NiError::Invalid(format!("{ranks} ranks (1..=2^24)")));
        }
        let departed_base = PT_BASE + NPT * CACHE_LINE;
        let room = departed_base + (ranks as usize * 8).div_ceil(CACHE_LINE) * CACHE_LINE;
        let waiters = am_nic::room::waiter_words(ranks as usize) * 8;
        let rec_base = room + CACHE_LINE + waiters.div_ceil(CACHE_LINE) * CACHE_LINE;
        let me_base = rec_base + ranks as usize * CACHE_LINE;
        let eq_base = me_base + max_me as usize * ME_BYTES;
        let line = |off: usize| (off - PT_BASE) / CACHE_LINE;
        Ok(NiGeometry {
            ranks,
            max_me,
            eq_capacity,
            eq_laps,
            bytes,
            room,
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

    /// The event queue's lap arithmetic: the status values of its tickets.
    pub fn eq_laps(&self) -> &Laps {
        &self.eq_laps
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

    /// Offset of the room word: set by a rank whose put was refused for room (the request
    /// portal entry disabled, the event queue full), after its bit in the room waiter words;
    /// the owner looks at it when it re-enables the entry and when idle, and rings the
    /// waiters (`am_nic::room`). A line of its own: senders write it only when refused.
    pub fn room(&self) -> usize {
        self.room
    }

    /// Offset of room waiter word `w`: rank `r` waits for room with bit `r % 64` of word
    /// `r / 64` ([`am_nic::room::waiter_bit`]).
    pub fn room_waiter(&self, w: usize) -> usize {
        self.room + CACHE_LINE + 8 * w
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

/// Index of a match-entry record.
pub type MeIndex = u32;
/// `Event::me` when the event concerns no entry.
pub const NO_ME: MeIndex = u32::MAX;

/// One rank's NI memory as a NIC sees it: the owner's own view, or a peer's mapped with full
/// access ([`Segment::share`], or its owner's handle mapped by `am_nic::connect`). `imp`
/// must be a writer's view of `seg`.
#[derive(Clone, Copy)]
pub struct Nic<'a> {
    pub(super) seg: &'a Segment,
    pub(super) imp: &'a Imported,
    pub(super) geo: &'a NiGeometry,
    /// The word area's parts (empty where the segment is smaller than the geometry: every
    /// access there is then an error).
    pub(super) parts: Parts<'a>,
    /// What wakes the NI's owner when a ring finds it armed on its wake socket, and its rank
    /// (`None`: a view that only rings the futex).
    pub(super) wake: Option<(&'a Wakers, am_core::Rank)>,
}

/// A match entry's two lines: the entry, then its locally managed offset and `used` word.
pub(super) type MeLines = [AtomicU64; 2 * LINE_WORDS];

/// An NI's word area as a walker reaches it: the waiting word, head and tail, and every line
/// from the portal table on, cut by [`Nic::new`] (checked against the segment) or from kept
/// runs ([`Nic::with_runs`]); an access is then one index, at a line the geometry gives, with
/// no alignment check.
#[derive(Clone, Copy)]
pub(super) struct Parts<'a> {
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
    pub(super) fn new(seg: &'a Segment, geo: &'a NiGeometry) -> Parts<'a> {
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
    pub(super) fn q(&self) -> Result<&'a [AtomicU64; Q_WORDS], NiError> {
        match self.q.first_chunk() {
            Some(q) => Ok(q),
            None => Err(short_run(WAITING)),
        }
    }

    #[inline(always)]
    pub(super) fn line(&self, i: usize) -> Result<&'a Line, NiError> {
        match self.lines.get(i) {
            Some(l) => Ok(l),
            None => Err(short_run(i)),
        }
    }

    /// The event queue's lap arithmetic.
    #[inline(always)]
    pub(super) fn eq_laps(&self) -> Laps {
        self.geo.eq_laps
    }

    /// The slot of ticket `t` (masked: the queue's length is a power of two).
    #[inline(always)]
    pub(super) fn slot(&self, t: u64) -> Result<&'a Line, NiError> {
        self.line(self.geo.eq_line + (t as usize & (self.geo.eq_capacity as usize - 1)))
    }

    /// Portal entry `pt`'s line.
    #[inline(always)]
    pub(super) fn pt(&self, pt: u8) -> Result<&'a Line, NiError> {
        if pt as usize >= NPT {
            return Err(bad_pt(pt));
        }
        self.line(pt as usize)
    }

    /// Match entry `idx` (an index beyond the geometry is a corrupt one).
    #[inline(always)]
    pub(super) fn me(&self, idx: MeIndex) -> Result<&'a MeLines, NiError> {
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
    pub(super) fn record(&self, r: u32) -> Result<&'a Line, NiError> {
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
pub(super) fn bad_pt(pt: u8) -> NiError {
    NiError::Invalid(format!("portal index {pt} (0..{NPT})"))
}

impl<'a> Nic<'a> {
    /// A view of the NI in `seg` (written through `imp`, a view of the same memory), whose
    /// rings only wake an owner sleeping on the futex.
    pub fn new(seg: &'a Segment, imp: &'a Imported, geo: &'a NiGeometry) -> Nic<'a> {
        Nic {
            seg,
            imp,
            geo,
            parts: Parts::new(seg, geo),
            wake: None,
        }
    }

    /// After a ring of the doorbell: wakes the owner on its socket if the ring found it armed.
    #[inline(always)]
    pub(super) fn rang(&self, rung: Rung) {
        if let (Rung::Armed, Some((wakers, owner))) = (rung, self.wake) {
            wakers.wake(owner);
        }
    }

    /// A view of the NI in `seg` (written through `imp`, a view of the same memory) through
    /// `runs`, its runs cut at start-up ([`NiRuns::new`] of `seg` and `geo`): what a rank's
    /// wire uses on every message. Its rings wake the NI's owner through `wake` (the
    /// wakers, the owner's rank) when the owner sleeps armed on its wake socket.
    #[inline(always)]
    pub fn with_runs(
        seg: &'a Segment,
        imp: &'a Imported,
        geo: &'a NiGeometry,
        runs: &'a NiRuns,
        wake: (&'a Wakers, am_core::Rank),
    ) -> Nic<'a> {
        Nic {
            seg,
            imp,
            geo,
            parts: Parts::of(runs, geo),
            wake: Some(wake),
        }
    }

    #[inline(always)]
    pub(super) fn parts(&self) -> &Parts<'a> {
        &self.parts
    }
}
