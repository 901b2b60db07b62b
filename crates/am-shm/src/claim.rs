//! The claimed ring: a ring of fixed-size slots that producers of several processes claim
//! slot by slot, each claim naming its claimer, read by its one owner in ticket order. Both
//! rings of this kind are built on it: EXTOLL VELO's mailbox ([`crate::mailbox`], status
//! word last in its slot) and the Portals event queue (portals-sim, status word first).
//!
//! Ticket `t` uses slot `t % slots` in lap `t / slots`. A slot's **status word** holds:
//!
//! ```text
//! bits  0..30   stamp: (lap + 1) mod 2^30 of the lap that last wrote it (0 in zeroed memory)
//! bits 30..32   state: CLAIMED, PUBLISHED or SKIPPED
//! bits 32..64   PUBLISHED: the producer's meta data (VELO: source, length, flags; 0 if none)
//!               CLAIMED, SKIPPED: the claimer ([`OWNER`] when the owner skipped it)
//! ```
//!
//! - **free**: a status whose stamp is the previous lap's, whatever its state, is free for
//!   ticket `t` ([`Laps::is_free`]); one whose stamp is this lap's is taken
//!   ([`Laps::is_taken`]); any other stamp is behind the ring or corrupt, never claimed over.
//! - **claim**: a producer takes ticket `t` with one compare-and-swap of its slot's status
//!   from a free value to `CLAIMED(lap, claimer)` ([`try_slot`]): the claim and its claimer
//!   are one atomic step, so the owner can always tell whose a claimed slot is. The slot
//!   must also have been consumed: `t < head + slots`, with `head` the owner's published
//!   head. The tail word is only a hint of where to start (moved past each claim by a plain
//!   store): a corrupt tail costs a walk, never an overwrite ([`claim_next`]).
//! - **record**: each claimer has a record word in the owner's memory that only it writes,
//!   `ACTIVE | t` with the lowest ticket it may claim ([`record`]), stored before its first
//!   claim and cleared once its claims are published. A `CLAIMED` status whose claimer's
//!   record does not vouch for it ([`vouches`]) was not written by that claimer.
//! - **publish**: the producer writes the slot's other words, then stores the status
//!   `PUBLISHED(lap, meta)` with `Release`; the owner loads its next ticket's status with
//!   `Acquire`, copies the words out and stores its head with `Release` (in batches), so a
//!   producer's `Acquire` of the head orders its overwrite after the owner's reads.
//! - **take-over**: the owner never waits for ever at its head. A slot claimed by a dead
//!   claimer, or by one whose record does not vouch for it, or holding a status no lap could
//!   have written, is marked `SKIPPED` by the owner with a compare-and-swap ([`take_over`],
//!   [`repair`]), so the next lap finds it free and a producer that published meanwhile
//!   keeps its publication; a free slot below later claims (a hole a corrupt tail left) is
//!   skipped the same way ([`fill_holes`]).
//!
//! Zeroed memory is a valid empty ring. The ring's storage (where each slot's status word
//! lies) is its user's: a [`Slots`] gives the status word of a ticket, and a [`Claimant`]
//! keeps the record of the claims it makes.
//!
//! Orderings: a successful claim is `SeqCst`. On x86 every compare-and-swap is a locked
//! instruction whatever its ordering; the order matters to an owner that announces that it
//! sleeps and then loads its head's status after a `SeqCst` fence: a producer that loads the
//! owner's waiting word with `SeqCst` after its claim cannot miss the announcement while the
//! owner misses the claim (the store-buffering pair, C++20 [atomics.order]).

use crate::sync::{AtomicU64, Ordering};
use crate::ShmError;

/// Bits of the status word that hold the stamp.
pub const STAMP_BITS: u32 = 30;
const STAMP_MASK: u64 = (1 << STAMP_BITS) - 1;
const STATE_MASK: u64 = 3 << STAMP_BITS;
const CLAIMED: u64 = 1 << STAMP_BITS;
const PUBLISHED: u64 = 2 << STAMP_BITS;
const SKIPPED: u64 = 3 << STAMP_BITS;
/// A claimer's record while it holds (or is taking) claims: `ACTIVE | lowest ticket`.
pub const ACTIVE: u64 = 1 << 63;
/// The claimer id the owner writes into a status it takes over.
pub const OWNER: u32 = u32::MAX;
/// Failed compare-and-swaps (or walks restarted) before a claim reports "no room": another
/// claimer keeps changing that status, which a sane one would have taken long before.
pub(crate) const CAS_RETRIES: u32 = 1 << 10;

/// What a ticket's status says ([`Laps::look`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Nobody has claimed it yet.
    Empty,
    /// Claimed by this claimer, not yet published.
    Claimed(u32),
    /// Published with this meta data.
    Published(u32),
    /// Given up by this claimer (or taken over by the [`OWNER`]): nothing to deliver.
    Skipped(u32),
}

/// The lap arithmetic of a ring of `slots` slots: which slot and lap a ticket has, and the
/// status values of a ticket. A shift and a mask for power-of-two rings (a division costs
/// more than the rest of a one-slot claim).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Laps {
    slots: u64,
    /// `log2(slots)` for a power-of-two ring, [`NOT_POW2`] otherwise.
    shift: u32,
}

/// [`Laps::shift`] of a ring whose slot count is not a power of two.
const NOT_POW2: u32 = u32::MAX;

/// The stamp of lap `lap`.
#[inline(always)]
fn stamp(lap: u64) -> u64 {
    lap.wrapping_add(1) & STAMP_MASK
}

impl Laps {
    /// The laps of a ring of `slots` slots; `None` for an empty ring.
    pub const fn new(slots: u64) -> Option<Laps> {
        if slots == 0 {
            return None;
        }
        let shift = if slots.is_power_of_two() {
            slots.trailing_zeros()
        } else {
            NOT_POW2
        };
        Some(Laps { slots, shift })
    }

    /// Number of slots.
    #[inline(always)]
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// `(lap, slot)` of ticket `t`.
    #[inline(always)]
    pub fn split(&self, t: u64) -> (u64, usize) {
        if self.shift != NOT_POW2 {
            (t >> self.shift, (t & (self.slots - 1)) as usize)
        } else {
            // `slots >= 1` (checked by `new`).
            let n = self.slots.max(1);
            (t / n, (t % n) as usize)
        }
    }

    /// The status of ticket `t` claimed by `claimer`.
    #[inline(always)]
    pub fn claimed(&self, t: u64, claimer: u32) -> u64 {
        Laps::claimed_in(self.split(t).0, claimer)
    }

    /// [`claimed`](Self::claimed) of a ticket of lap `lap`.
    #[inline(always)]
    fn claimed_in(lap: u64, claimer: u32) -> u64 {
        (claimer as u64) << 32 | CLAIMED | stamp(lap)
    }

    /// The status of ticket `t` published with `meta`.
    #[inline(always)]
    pub fn published(&self, t: u64, meta: u32) -> u64 {
        (meta as u64) << 32 | Laps::published_low(self.split(t).0) as u64
    }

    /// The status of ticket `t` skipped by `claimer`.
    #[inline(always)]
    pub fn skipped(&self, t: u64, claimer: u32) -> u64 {
        (claimer as u64) << 32 | SKIPPED | stamp(self.split(t).0)
    }

    /// The low half (stamp and state) of a publication in lap `lap`: an owner that keeps its
    /// head's lap compares a status's low half with it, with no shift or mask per look.
    #[inline(always)]
    pub fn published_low(lap: u64) -> u32 {
        (PUBLISHED | stamp(lap)) as u32
    }

    /// Whether status `st` is free in lap `lap` ([`is_free`](Self::is_free) of a ticket of
    /// that lap).
    #[inline(always)]
    pub fn is_free_in(st: u64, lap: u64) -> bool {
        st & STAMP_MASK == lap & STAMP_MASK
    }

    /// Whether status `st` was written in lap `lap`.
    #[inline(always)]
    fn is_taken_in(st: u64, lap: u64) -> bool {
        st & STAMP_MASK == stamp(lap)
    }

    /// [`usual_free`](Self::usual_free) of a ticket of lap `lap`.
    #[inline(always)]
    fn usual_free_in(lap: u64) -> u64 {
        // The previous lap's stamp is `lap mod 2^30`; in lap 0, zeroed memory (no branch:
        // all ones or all zeros as the mask).
        (PUBLISHED | lap & STAMP_MASK) & ((lap != 0) as u64).wrapping_neg()
    }

    /// The status most often free for ticket `t`: zeroed memory in lap 0, the previous lap's
    /// publication with meta data 0 after it. A ring whose producers publish no meta data
    /// claims from it without loading the status first ([`claim_next`] with `BLIND`).
    #[inline(always)]
    pub fn usual_free(&self, t: u64) -> u64 {
        Laps::usual_free_in(self.split(t).0)
    }

    /// Whether status `st` is free for ticket `t` (last written in the previous lap).
    #[inline(always)]
    pub fn is_free(&self, st: u64, t: u64) -> bool {
        Laps::is_free_in(st, self.split(t).0)
    }

    /// Whether status `st` was written in ticket `t`'s lap (claimed, published or skipped).
    #[inline(always)]
    pub fn is_taken(&self, st: u64, t: u64) -> bool {
        Laps::is_taken_in(st, self.split(t).0)
    }

    /// What status `st` says of ticket `t`; an error for a status no lap could have written
    /// there (see [`repair`]).
    #[inline(always)]
    pub fn look(&self, st: u64, t: u64) -> Result<Seen, ShmError> {
        let who = (st >> 32) as u32;
        let lap = self.split(t).0;
        if Laps::is_taken_in(st, lap) {
            match st & STATE_MASK {
                PUBLISHED => Ok(Seen::Published(who)),
                CLAIMED => Ok(Seen::Claimed(who)),
                SKIPPED => Ok(Seen::Skipped(who)),
                _ => Err(corrupt(st)),
            }
        } else if Laps::is_free_in(st, lap) {
            Ok(Seen::Empty)
        } else {
            Err(corrupt(st))
        }
    }
}

/// The error for a copy of the head ahead of the head word.
#[cold]
fn corrupt_head(head: u64) -> ShmError {
    ShmError::Corrupt {
        what: "claimed ring head",
        value: head,
    }
}

/// The error for a status word no claimer wrote.
#[cold]
fn corrupt(st: u64) -> ShmError {
    ShmError::Corrupt {
        what: "claimed ring slot status",
        value: st,
    }
}

/// A claimer's record value while it may claim ticket `t` and later ones.
#[inline(always)]
pub const fn record(t: u64) -> u64 {
    ACTIVE | (t & !ACTIVE)
}

/// Whether record value `rec` vouches for a claim of ticket `t`: `ACTIVE`, from a ticket at
/// or below it.
#[inline(always)]
pub fn vouches(rec: u64, t: u64) -> bool {
    rec & ACTIVE != 0 && rec & !ACTIVE <= t
}

/// One claim's try of ticket `t` whose status word is `word` and believed to hold the free
/// value `seen`: the compare-and-swap to `CLAIMED(t, claimer)`. `Err` holds the status found
/// instead (`Acquire`), for the caller to classify.
#[inline(always)]
pub fn try_slot(laps: &Laps, word: &AtomicU64, t: u64, seen: u64, claimer: u32) -> Result<(), u64> {
    try_lap(word, laps.split(t).0, seen, claimer)
}

/// [`try_slot`] of a ticket of lap `lap`.
#[inline(always)]
fn try_lap(word: &AtomicU64, lap: u64, seen: u64, claimer: u32) -> Result<(), u64> {
    let claimed = Laps::claimed_in(lap, claimer);
    word.compare_exchange(seen, claimed, Ordering::SeqCst, Ordering::Acquire)
        .map(|_| ())
}

/// Where a claimed ring's words are: its user's layout.
pub trait Slots {
    /// The error of an access to the ring's memory (a [`ShmError`] converts into it).
    type Error: From<ShmError>;
    /// The ring's lap arithmetic.
    fn laps(&self) -> Laps;
    /// The status word of ticket `t`'s slot.
    fn status(&self, t: u64) -> Result<&AtomicU64, Self::Error>;
}

/// A producer taking claims: who it is, and its record.
pub trait Claimant {
    /// The error of a claim (the ring's errors convert into it).
    type Error;
    /// The id written into the claims.
    fn claimer(&self) -> u32;
    /// Called before the compare-and-swap that claims ticket `t`: the record must vouch for
    /// `t` by then (store [`record`]`(t)` unless a lower ticket is recorded already).
    fn record(&mut self, t: u64) -> Result<(), Self::Error>;
}

/// Claims the next free ticket at or after the walk's `cursor` (start it at the tail hint)
/// for `c`, and moves `cursor` past it: its ticket, or `None` if the ring has no free slot
/// now. `head` is the producer's copy of the owner's head (at most the head word's value;
/// 0 or a stale copy is fine, reloaded with `Acquire` when it says "full").
///
/// `BLIND`: the first try of each slot is a compare-and-swap from [`Laps::usual_free`],
/// with no load first (a ring whose producers publish no meta data, where that is what the
/// previous lap left); otherwise the status is loaded and checked first.
///
/// A status neither free nor taken (behind the ring, or corrupt) is never claimed over: if
/// the owner's head moved on meanwhile, the walk goes on from there, otherwise at the next
/// ticket. A tail hint past every claim is put back at the head. An error: the ring's
/// memory could not be reached, a ticket past the last one there is, or a `head` ahead of
/// the head word (start the copy over).
#[inline(always)]
pub fn claim_next<S: Slots, C: Claimant<Error = S::Error>, const BLIND: bool>(
    ring: &S,
    tail: &AtomicU64,
    head_word: &AtomicU64,
    head: &mut u64,
    cursor: &mut u64,
    c: &mut C,
) -> Result<Option<u64>, S::Error> {
    let laps = ring.laps();
    let slots = laps.slots();
    let mut retries = 0;
    loop {
        if *cursor < *head {
            *cursor = *head;
        }
        if *cursor - *head >= slots {
            // The owner's head only grows: a smaller value is stale or corrupt.
            *head = (*head).max(head_word.load(Ordering::Acquire));
            if *cursor < *head {
                continue;
            }
            if *cursor - *head >= slots {
                if full(ring, &laps, *head, *cursor)? {
                    return Ok(None);
                }
                // A hint no claim produced: put the tail back at the head, unless someone
                // moved it meanwhile.
                let _ = tail.compare_exchange(*cursor, *head, Ordering::Relaxed, Ordering::Relaxed);
                *cursor = *head;
                retries += 1;
                if retries > CAS_RETRIES {
                    return Ok(None);
                }
                continue;
            }
        }
        let t = *cursor;
        // No ring reaches the last ticket there is: a corrupt tail and head sent us there,
        // and stepping past it would wrap below the head (for ever).
        let Some(next) = t.checked_add(1) else {
            return Err(ShmError::Corrupt {
                what: "claimed ring ticket",
                value: t,
            }
            .into());
        };
        let word = ring.status(t)?;
        let lap = laps.split(t).0;
        let mut st = if BLIND {
            Laps::usual_free_in(lap)
        } else {
            word.load(Ordering::Acquire)
        };
        // A blind first try needs no look at what it is sure of.
        let mut sure = BLIND;
        loop {
            if sure {
                sure = false;
            } else if Laps::is_taken_in(st, lap) {
                // Taken this lap by someone: the next one.
                *cursor = next;
                break;
            } else if !Laps::is_free_in(st, lap) {
                // Neither this lap's nor the previous one's, never claimed over: we fell
                // behind (the ring moved on while we looked: the head tells, and the walk
                // goes on from there), or a status no claimer wrote (the owner repairs it
                // when its head gets there: the next ticket), or our copy of the head is
                // ahead of the head word, which only grows (a corrupt head read before, or
                // a head word rewound): an error, so the caller starts its copy over.
                let h = head_word.load(Ordering::Acquire);
                retries += 1;
                if h < *head {
                    return Err(corrupt_head(*head).into());
                }
                if h > *head && retries <= CAS_RETRIES {
                    *head = h;
                    *cursor = (*cursor).max(tail.load(Ordering::Relaxed));
                } else {
                    *cursor = next;
                }
                break;
            }
            // Free: consumed (t < head + slots) and last written in the previous lap. The
            // record first, so the owner never sees our claim without it.
            c.record(t)?;
            match try_lap(word, lap, st, c.claimer()) {
                Ok(()) => {
                    // Advance the hint past `t`: a plain store, not a read-modify-write.
                    // Racing claimers may leave it a few slots behind the newest claim,
                    // which costs the next claimer a walk over taken slots, never a claim
                    // (the status decides).
                    if tail.load(Ordering::Relaxed) <= t {
                        tail.store(next, Ordering::Release);
                    }
                    *cursor = next;
                    return Ok(Some(t));
                }
                Err(found) => {
                    st = found;
                    retries += 1;
                    if retries > CAS_RETRIES {
                        return Ok(None);
                    }
                }
            }
        }
    }
}

/// Whether a walk at `cursor`, `slots` past `head`, met a full ring: the last slot before it
/// is not free (a tail hint is the ticket after a claim; a status no lap writes is not
/// claimed over either). Otherwise the hint is past every claim a producer could have made
/// (corrupt). Out of line: a claim's path does not carry it.
#[cold]
#[inline(never)]
fn full<S: Slots>(ring: &S, laps: &Laps, head: u64, cursor: u64) -> Result<bool, S::Error> {
    if cursor - head != laps.slots() {
        return Ok(false);
    }
    let Some(last) = cursor.checked_sub(1).filter(|&b| b >= head) else {
        return Ok(false);
    };
    let st = ring.status(last)?.load(Ordering::Acquire);
    Ok(!laps.is_free(st, last))
}

/// The owner takes over ticket `t`, whose status it found to be `seen` (claimed by a claimer
/// that will never publish it, or corrupt): marks it skipped with a compare-and-swap, so
/// the next lap finds it free. False if the status changed meanwhile (its claimer published
/// after all): look again.
#[inline]
pub fn take_over(laps: &Laps, word: &AtomicU64, t: u64, seen: u64) -> bool {
    word.compare_exchange(
        seen,
        laps.skipped(t, OWNER),
        Ordering::AcqRel,
        Ordering::Acquire,
    )
    .is_ok()
}

/// The owner repairs ticket `t`, whose status [`Laps::look`] reported corrupt: marks it
/// skipped unless it is (now) this lap's publication. The caller then consumes the ticket.
#[inline]
pub fn repair(laps: &Laps, word: &AtomicU64, t: u64) {
    let st = word.load(Ordering::Acquire);
    if st & STATE_MASK != PUBLISHED || !laps.is_taken(st, t) {
        take_over(laps, word, t, st);
    }
}

/// The owner's look past an `Empty` ticket `head` (when idle): if a later ticket of the
/// ring is this lap's, the free tickets from `head` up to it are holes no claimer will fill
/// (a corrupt tail hint sent the claims past them), so the owner marks each skipped with a
/// compare-and-swap (a claimer that takes one first keeps it, and the run ends there) and
/// returns how many it skipped; the caller then consumes them. One pass over up to a ring's
/// worth of slots, whatever the run's length (a hint a whole ring ahead leaves a ring's
/// worth of holes): call it when idle, not per poll.
pub fn fill_holes<S: Slots>(ring: &S, head: u64) -> Result<u64, S::Error> {
    let laps = ring.laps();
    if !laps.is_free(ring.status(head)?.load(Ordering::Acquire), head) {
        return Ok(0);
    }
    let mut above = None;
    for t in head + 1..head.saturating_add(laps.slots()) {
        if laps.is_taken(ring.status(t)?.load(Ordering::Acquire), t) {
            above = Some(t);
            break;
        }
    }
    let Some(above) = above else {
        return Ok(0);
    };
    let mut skipped = 0;
    for t in head..above {
        let word = ring.status(t)?;
        let prev = word.load(Ordering::Acquire);
        if !laps.is_free(prev, t) || !take_over(&laps, word, t, prev) {
            break;
        }
        skipped += 1;
    }
    Ok(skipped)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct Words(Vec<AtomicU64>, Laps);

    impl Slots for Words {
        type Error = ShmError;
        fn laps(&self) -> Laps {
            self.1
        }
        fn status(&self, t: u64) -> Result<&AtomicU64, ShmError> {
            Ok(&self.0[self.1.split(t).1])
        }
    }

    struct Rec(u32, u64);

    impl Claimant for Rec {
        type Error = ShmError;
        fn claimer(&self) -> u32 {
            self.0
        }
        fn record(&mut self, t: u64) -> Result<(), ShmError> {
            if self.1 == 0 || t < self.1 & !ACTIVE {
                self.1 = record(t);
            }
            Ok(())
        }
    }

    fn words(slots: u64) -> Words {
        let laps = Laps::new(slots).unwrap();
        Words((0..slots).map(|_| AtomicU64::new(0)).collect(), laps)
    }

    fn claim<const BLIND: bool>(
        r: &Words,
        tail: &AtomicU64,
        head: &AtomicU64,
        c: &mut Rec,
    ) -> Option<u64> {
        let (mut h, mut cur) = (0, tail.load(Ordering::Relaxed));
        claim_next::<_, _, BLIND>(r, tail, head, &mut h, &mut cur, c).unwrap()
    }

    #[test]
    fn blind_and_loading_claims_walk_the_same_laps() {
        for slots in [1u64, 3, 4] {
            let (a, b) = (words(slots), words(slots));
            let (ta, ha, tb, hb) = (
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
                AtomicU64::new(0),
            );
            for t in 0..4 * slots {
                let (mut ca, mut cb) = (Rec(7, 0), Rec(7, 0));
                assert_eq!(claim::<true>(&a, &ta, &ha, &mut ca), Some(t), "{slots}");
                assert_eq!(claim::<false>(&b, &tb, &hb, &mut cb), Some(t), "{slots}");
                assert!(vouches(ca.1, t) && vouches(cb.1, t));
                let laps = a.laps();
                assert_eq!(
                    laps.look(a.status(t).unwrap().load(Ordering::Relaxed), t)
                        .unwrap(),
                    Seen::Claimed(7)
                );
                // A full ring refuses, without claiming.
                if (t + 1) % slots == 0 {
                    assert_eq!(claim::<true>(&a, &ta, &ha, &mut Rec(8, 0)), None);
                    assert_eq!(claim::<false>(&b, &tb, &hb, &mut Rec(8, 0)), None);
                }
                // Publish (the blind ring with meta 0, the other with meta 5; one skipped),
                // and consume lap by lap.
                a.status(t)
                    .unwrap()
                    .store(laps.published(t, 0), Ordering::Release);
                let st = if t % 3 == 1 {
                    laps.skipped(t, 7)
                } else {
                    laps.published(t, 5)
                };
                b.status(t).unwrap().store(st, Ordering::Release);
                if (t + 1) % slots == 0 {
                    ha.store(t + 1, Ordering::Release);
                    hb.store(t + 1, Ordering::Release);
                }
            }
        }
    }

    #[test]
    fn a_skipped_slot_is_free_next_lap_even_for_a_blind_claim() {
        let r = words(2);
        let laps = r.laps();
        let (tail, head) = (AtomicU64::new(0), AtomicU64::new(0));
        assert_eq!(claim::<true>(&r, &tail, &head, &mut Rec(1, 0)), Some(0));
        assert!(take_over(
            &laps,
            r.status(0).unwrap(),
            0,
            laps.claimed(0, 1)
        ));
        assert_eq!(
            laps.look(r.status(0).unwrap().load(Ordering::Relaxed), 0)
                .unwrap(),
            Seen::Skipped(OWNER)
        );
        head.store(2, Ordering::Release);
        tail.store(2, Ordering::Relaxed);
        assert_eq!(claim::<true>(&r, &tail, &head, &mut Rec(1, 0)), Some(2));
    }

    #[test]
    fn corrupt_statuses_and_hints_are_never_claimed_over() {
        let r = words(4);
        let laps = r.laps();
        let (tail, head) = (AtomicU64::new(0), AtomicU64::new(0));
        // A status laps ahead: stepped over, untouched.
        let bad = laps.published(9, 0);
        r.status(0).unwrap().store(bad, Ordering::Relaxed);
        for (blind, want) in [(false, 1), (true, 2)] {
            let (mut h, mut cur) = (0, tail.load(Ordering::Relaxed));
            let got = if blind {
                claim_next::<_, _, true>(&r, &tail, &head, &mut h, &mut cur, &mut Rec(1, 0))
            } else {
                claim_next::<_, _, false>(&r, &tail, &head, &mut h, &mut cur, &mut Rec(1, 0))
            };
            assert_eq!(got.unwrap(), Some(want));
            assert_eq!(r.status(0).unwrap().load(Ordering::Relaxed), bad);
        }
        // Every other slot taken, the corrupt one never: the ring is full.
        r.status(3)
            .unwrap()
            .store(laps.claimed(3, 2), Ordering::Relaxed);
        tail.store(4, Ordering::Relaxed);
        assert_eq!(claim::<true>(&r, &tail, &head, &mut Rec(1, 0)), None);
        assert_eq!(claim::<false>(&r, &tail, &head, &mut Rec(1, 0)), None);
        // A copy of the head ahead of the head word (poisoned by a corrupt read): an error,
        // so the caller starts it over, never "full" for ever.
        let (mut h, mut cur) = (1 << 40, 0);
        let got = claim_next::<_, _, false>(&r, &tail, &head, &mut h, &mut cur, &mut Rec(1, 0));
        assert!(matches!(got, Err(ShmError::Corrupt { .. })), "{got:?}");
        assert!(laps.look(bad, 0).is_err());
        repair(&laps, r.status(0).unwrap(), 0);
        assert_eq!(
            laps.look(r.status(0).unwrap().load(Ordering::Relaxed), 0)
                .unwrap(),
            Seen::Skipped(OWNER)
        );
        // A tail hint past every claim goes back to the head.
        let r = words(4);
        let tail = AtomicU64::new(4);
        let head = AtomicU64::new(0);
        assert_eq!(claim::<true>(&r, &tail, &head, &mut Rec(1, 0)), Some(0));
    }

    #[test]
    fn a_hole_below_claims_is_filled_once() {
        let r = words(4);
        let laps = r.laps();
        assert_eq!(fill_holes(&r, 0).unwrap(), 0);
        r.status(2)
            .unwrap()
            .store(laps.claimed(2, 3), Ordering::Relaxed);
        // Both holes below the claim in one pass, and nothing past it.
        assert_eq!(fill_holes(&r, 0).unwrap(), 2);
        for t in 0..2 {
            assert_eq!(
                laps.look(r.status(t).unwrap().load(Ordering::Relaxed), t)
                    .unwrap(),
                Seen::Skipped(OWNER)
            );
        }
        assert_eq!(
            laps.look(r.status(3).unwrap().load(Ordering::Relaxed), 3)
                .unwrap(),
            Seen::Empty
        );
        assert_eq!(fill_holes(&r, 0).unwrap(), 0);
    }

    #[test]
    fn a_run_of_holes_ends_at_a_slot_a_claimer_took_first() {
        let r = words(8);
        let laps = r.laps();
        r.status(6)
            .unwrap()
            .store(laps.claimed(6, 3), Ordering::Relaxed);
        // A claimer took ticket 2 after the hint went past it: the run is 0 and 1.
        r.status(2)
            .unwrap()
            .store(laps.claimed(2, 4), Ordering::Relaxed);
        assert_eq!(fill_holes(&r, 0).unwrap(), 2);
        assert_eq!(
            laps.look(r.status(2).unwrap().load(Ordering::Relaxed), 2)
                .unwrap(),
            Seen::Claimed(4)
        );
        // From ticket 3, the next run.
        assert_eq!(fill_holes(&r, 3).unwrap(), 3);
    }

    /// Slots whose ticket `at` a claimer takes on the `nth` look at its status: between
    /// `fill_holes`' two passes when `nth` is 2.
    struct Racy {
        words: Words,
        at: u64,
        nth: std::cell::Cell<u32>,
        who: u32,
    }

    impl Slots for Racy {
        type Error = ShmError;
        fn laps(&self) -> Laps {
            self.words.laps()
        }
        fn status(&self, t: u64) -> Result<&AtomicU64, ShmError> {
            if t == self.at {
                let n = self.nth.get().saturating_sub(1);
                self.nth.set(n);
                if n == 0 {
                    let laps = self.words.laps();
                    self.words
                        .status(t)?
                        .store(laps.claimed(t, self.who), Ordering::Relaxed);
                }
            }
            self.words.status(t)
        }
    }

    #[test]
    fn a_hole_a_claimer_takes_between_the_passes_ends_the_run() {
        let r = Racy {
            words: words(8),
            at: 1,
            nth: std::cell::Cell::new(2),
            who: 4,
        };
        let laps = r.laps();
        r.words
            .status(3)
            .unwrap()
            .store(laps.claimed(3, 3), Ordering::Relaxed);
        // Ticket 1 is a hole in the first pass and the claimer's in the second: only ticket
        // 0 is skipped, and the claim is kept.
        assert_eq!(fill_holes(&r, 0).unwrap(), 1);
        assert_eq!(
            laps.look(r.words.status(1).unwrap().load(Ordering::Relaxed), 1)
                .unwrap(),
            Seen::Claimed(4)
        );
        assert_eq!(
            laps.look(r.words.status(2).unwrap().load(Ordering::Relaxed), 2)
                .unwrap(),
            Seen::Empty
        );
    }

    #[test]
    fn records_vouch_only_from_their_ticket() {
        assert!(vouches(record(5), 5) && vouches(record(5), 9));
        assert!(!vouches(record(5), 4) && !vouches(5, 5) && !vouches(0, 0));
    }
}
