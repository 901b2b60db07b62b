//! The event queue: a [claimed ring](am_shm::claim) of event slots (status word first),
//! the events, and the producer's side (a wire's claim of a slot in the name of its rank,
//! the sender record that vouches for it, the publication and the doorbell). The owner reads
//! it in [`NiOwner`](super::NiOwner). See the [module docs](super#event-queue).

use super::die;
use super::layout::{
    corrupt, short_run, Line, MeIndex, NiError, Nic, Parts, ACTIVE, DOORBELL, NO_ME, NPT, Q_HEAD,
    Q_TAIL, REC_EQ, REC_LM,
};
use am_shm::claim::{self, Claimant, Laps};
use am_shm::sync::{fence, AtomicU64, Ordering};
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

/// A claimed event slot, and whether its owner must be woken once it is published.
#[derive(Debug, Clone, Copy)]
pub(super) struct Claim {
    pub(super) seq: u64,
    pub(super) ring: bool,
}

/// The claims of one initiator in one NI during one operation, and its sender record
/// there: written before each claim, cleared (after every claimed slot was published) when
/// the operation ends, also on an error path (`Drop`).
pub(super) struct Claimer<'n, 'a> {
    nic: &'n Nic<'a>,
    pub(super) rank: u32,
    rec: &'a [AtomicU64; 2],
    /// The lowest ticket recorded as claimable, if recorded.
    pub(super) eq_from: Option<u64>,
    /// The value stored in the record's locally managed word (0: none).
    pub(super) lm: u64,
    /// The operation's own event slot, until published.
    pub(super) slot: Option<Claim>,
    /// The rank "died" here: nothing more is written (see [`die`]).
    pub(super) dead: die::Dead,
}

impl<'n, 'a> Claimer<'n, 'a> {
    #[inline(always)]
    pub(super) fn new(nic: &'n Nic<'a>, rank: u32) -> Result<Claimer<'n, 'a>, NiError> {
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
            dead: die::Dead::new(),
        })
    }

    /// Records that ticket `t` and later ones may be claimed (before claiming `t`).
    #[inline(always)]
    pub(super) fn record_eq(&mut self, t: u64) {
        if self.eq_from.is_none_or(|from| t < from) {
            // Relaxed: the claim's compare-and-swap (SeqCst) orders it before the claim.
            self.rec[REC_EQ].store(claim::record(t), Ordering::Relaxed);
            self.eq_from = Some(t);
        }
    }

    /// Records that space of locally managed entry `idx` may be claimed (before the claim;
    /// the claim is a `Release` read-modify-write, so an owner that sees its effect sees
    /// this too).
    #[inline(always)]
    pub(super) fn record_lm(&mut self, idx: MeIndex) {
        let v = ACTIVE | (idx as u64 + 1);
        if self.lm != v {
            self.rec[REC_LM].store(v, Ordering::Release);
            self.lm = v;
        }
    }

    /// Dies at `step` if a test says so (nothing more is written); no code outside the
    /// tests (see [`die`]).
    #[inline(always)]
    pub(super) fn dies_at(&mut self, step: die::Step) -> Result<(), NiError> {
        if die::here(step) {
            self.dead.set();
            return Err(died(step));
        }
        Ok(())
    }
}

/// The error of an operation whose rank died at `step` (a test's).
#[cold]
fn died(step: die::Step) -> NiError {
    NiError::Invalid(format!("died at {step:?} (test)"))
}

impl Claimant for Claimer<'_, '_> {
    type Error = NiError;

    #[inline(always)]
    fn claimer(&self) -> u32 {
        self.rank
    }

    #[inline(always)]
    fn record(&mut self, t: u64) -> Result<(), NiError> {
        self.record_eq(t);
        self.dies_at(die::Step::Recorded)
    }
}

/// The event slots as the claimed ring sees them: each slot's first word is its status.
impl claim::Slots for Parts<'_> {
    type Error = NiError;

    #[inline(always)]
    fn laps(&self) -> Laps {
        self.eq_laps()
    }

    #[inline(always)]
    fn status(&self, t: u64) -> Result<&AtomicU64, NiError> {
        Ok(&self.slot(t)?[0])
    }
}

impl Claimer<'_, '_> {
    /// An error path after the claim of event slot `s`: the slot must not stay claimed.
    #[cold]
    #[inline(never)]
    pub(super) fn give_back(&self, s: Claim) {
        let _ = self
            .nic
            .eq_publish(s, &Event::new(EventKind::Dropped, self.rank, 0));
    }
}

impl Drop for Claimer<'_, '_> {
    #[inline(always)]
    fn drop(&mut self) {
        if self.dead.get() {
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

impl<'a> Nic<'a> {
    /// Rings the NI's doorbell if its owner announced that it may sleep. (Posting an event
    /// does this by itself.)
    #[inline]
    pub fn ring(&self) -> Result<(), NiError> {
        // Against the owner's announcement and fence (see `NiOwner::announce_wait`): what
        // the caller published before is ordered before this load.
        fence(Ordering::SeqCst);
        if self.parts().q()?[0].load(Ordering::SeqCst) != 0 {
            self.rang(self.seg.doorbell(DOORBELL)?.ring());
        }
        Ok(())
    }

    /// Claims an event slot for `cl`; `None` if the queue is full: the claimed ring's claim
    /// ([`claim::claim_next`]), blind (a publication carries no meta data, so the previous
    /// lap's status is known without a load), then a load of the waiting word.
    ///
    /// The successful claim is `SeqCst` and is followed by a `SeqCst` load of the waiting
    /// word: the store-buffering pair of [`NiOwner::announce_wait`] (waiting word stored,
    /// a `SeqCst` fence, then the head slot's status loaded). In the single order `S` of
    /// `SeqCst` operations and fences (C++20 [atomics.order]): if the owner's load missed
    /// our claim, its fence precedes our CAS in `S` (rule 4.3), so precedes our load, which
    /// then cannot miss the waiting word stored before that fence (rule 4.2): we see it and
    /// ring after publishing (the owner cleared the doorbell's flag before its store, which
    /// our load synchronizes with, so the ring is not lost). Otherwise the owner sees the
    /// claim and does not sleep. On x86 the CAS is a locked instruction anyway and the load
    /// a plain one: no fence on this, the hot side. loom treats `SeqCst` accesses as
    /// `AcqRel` (it models only `SeqCst` fences), so under `cfg(loom)` the same order is
    /// written with a fence between the two.
    #[inline(always)]
    pub(super) fn eq_reserve(&self, cl: &mut Claimer<'_, 'a>) -> Result<Option<Claim>, NiError> {
        // The waiting word, head and tail in one checked run (the doorbell is before it).
        let parts = self.parts();
        let q = parts.q()?;
        let (head_w, tail_w) = (&q[Q_HEAD], &q[Q_TAIL]);
        let mut cursor = tail_w.load(Ordering::Relaxed);
        // Acquire: the owner read the slot we are about to reuse before publishing head.
        let mut head = head_w.load(Ordering::Acquire);
        let laps = parts.eq_laps();
        let t = cursor;
        // The usual claim: the slot at the tail hint, inside the window, claimed on the first
        // try; anything else is the walk's.
        let claimed = t.wrapping_sub(head) < laps.slots() && {
            let word = &parts.slot(t)?[0];
            cl.record(t)?;
            claim::try_slot(&laps, word, t, laps.usual_free(t), cl.rank).is_ok()
        };
        let t = if claimed {
            // Release: an owner that sees the hint past `t` sees the claim.
            tail_w.store(t.wrapping_add(1), Ordering::Release);
            t
        } else {
            match claim::claim_next::<_, _, true>(
                parts,
                tail_w,
                head_w,
                &mut head,
                &mut cursor,
                cl,
            )? {
                Some(t) => t,
                None => return Ok(None),
            }
        };
        #[cfg(loom)]
        fence(Ordering::SeqCst);
        let ring = q[0].load(Ordering::SeqCst) != 0;
        cl.dies_at(die::Step::SlotClaimed)?;
        Ok(Some(Claim { seq: t, ring }))
    }

    /// Writes `ev` into the claimed slot and publishes it (and rings, if the claim says so).
    pub(super) fn eq_publish(&self, claim: Claim, ev: &Event) -> Result<(), NiError> {
        self.eq_publish_words(claim, ev.words())
    }

    /// [`eq_publish`](Self::eq_publish) of an event's words: the hot path builds them in
    /// registers, stores the line's seven words and publishes with one more.
    #[inline(always)]
    pub(super) fn eq_publish_words(&self, claim: Claim, words: [u64; 7]) -> Result<(), NiError> {
        let parts = self.parts();
        let slot = parts.slot(claim.seq)?;
        for (w, v) in slot[1..].iter().zip(words) {
            w.store(v, Ordering::Relaxed);
        }
        slot[0].store(parts.eq_laps().published(claim.seq, 0), Ordering::Release);
        if claim.ring {
            self.ring_claimed()?;
        }
        Ok(())
    }

    /// After the publication (Release inside): a woken owner finds the event.
    #[cold]
    #[inline(never)]
    fn ring_claimed(&self) -> Result<(), NiError> {
        self.rang(self.seg.doorbell(DOORBELL)?.ring());
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
    pub(super) fn post_with(&self, cl: &mut Claimer<'_, 'a>, ev: &Event) -> Result<bool, NiError> {
        match self.eq_reserve(cl)? {
            Some(c) => self.eq_publish(c, ev).map(|()| true),
            None => Ok(false),
        }
    }
}

/// A slot as its owner reads it: the status, and if it is `published` (the status of the
/// ticket's publication), a private copy of the event's words (checked by the caller, never
/// re-read).
#[inline(always)]
pub(super) fn read_slot(slot: &Line, published: u64) -> (u64, Option<[u64; 7]>) {
    let v = slot[0].load(Ordering::Acquire);
    if v != published {
        return (v, None);
    }
    (
        v,
        Some(std::array::from_fn(|i| slot[i + 1].load(Ordering::Relaxed))),
    )
}

/// What [`NiOwner::eq_unblock`](super::NiOwner::eq_unblock) found at the head of the event queue.
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
