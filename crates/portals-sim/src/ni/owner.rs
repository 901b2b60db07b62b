//! The owner's side of its NI: its own copy of the match lists (appends, unlinks, the
//! re-link of locally managed buffers, the check and repair of the shared copy) and the
//! reading of its event queue (polls, take-overs of dead claimers' slots, the wait).

use super::eq::{read_slot, Event, EventKind, Unblocked};
use super::layout::Parts;
use super::layout::{
    corrupt, line, short_run, words, MeIndex, NiError, NiGeometry, ACTIVE, DOORBELL, EQ_HEAD,
    EQ_TAIL, LINE_WORDS, ME_NEXT, NPT, PT_DISABLED, PT_ENABLED, PT_FLOWCTRL, REC_EQ, REC_LM,
    WAITING,
};
use super::me::{write_entry, MeSpec, ME_FREE, ME_LINKED, ME_UNLINKED, NOT_USED};
use am_shm::claim::{self, Laps, Seen};
use am_shm::sync::{fence, AtomicU64, Ordering};
use am_shm::{Segment, WordRun, CACHE_LINE};
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
    /// The head's lap, and its status once published: a poll compares, with no lap
    /// arithmetic per look.
    head_lap: u64,
    head_pub: u64,
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
            head_lap: 0,
            head_pub: geo.eq_laps.published(0, 0),
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
        write_entry(l, self.generation[idx as usize], pt, spec, state);
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
            match self.geo.eq_laps.look(v, t) {
                // The frontier: no claim beyond it (holes come only from a corrupt tail).
                Ok(Seen::Empty) => break,
                Ok(Seen::Claimed(r)) => {
                    if walkers.contains(&r) {
                        return Ok(Drained::Busy);
                    }
                }
                Ok(Seen::Published(_)) => {
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
                Ok(Seen::Skipped(_)) | Err(_) => {}
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
        let v = seg.word(off)?.load(Ordering::Acquire);
        Ok(v == self.head_pub)
    }

    /// What the status of the next ticket says (for tests and diagnostics); an error for a
    /// status no producer writes.
    pub fn eq_head_state(&self, seg: &Segment) -> Result<Seen, NiError> {
        let v = seg
            .word(self.geo.eq_slot(self.head))?
            .load(Ordering::Acquire);
        Ok(self.geo.eq_laps.look(v, self.head)?)
    }

    /// The next ticket the owner reads.
    pub fn eq_head(&self) -> u64 {
        self.head
    }

    /// Takes the next event, if published. A status word no producer writes at the head
    /// is repaired, skipped and returned as `Corrupt` (the queue goes on); a corrupt event
    /// is consumed and returned as `Corrupt`.
    #[inline(always)]
    pub fn eq_poll(&mut self, seg: &Segment) -> Result<Option<Event>, NiError> {
        let slot = line(seg, self.geo.eq_slot(self.head))?;
        let read = read_slot(slot, self.head_pub);
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
        let read = read_slot(slot, self.head_pub);
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
            if Laps::is_free_in(v, self.head_lap) {
                return Ok(None);
            }
            if let Ok(Seen::Claimed(_)) = self.geo.eq_laps.look(v, self.head) {
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
        if self.head & (self.geo.eq_capacity as u64 - 1) == 0 {
            self.head_lap = self.head_lap.wrapping_add(1);
            self.head_pub = self.geo.eq_laps.published(self.head, 0);
        }
        if self.head.wrapping_sub(self.published) >= (self.geo.eq_capacity / 4) as u64 {
            self.eq_publish_head(seg)?;
        }
        Ok(())
    }

    /// The head slot holds `v`, a value no producer writes for this ticket: the owner takes
    /// it over (a compare-and-swap, so a value that changed meanwhile is kept), so the next
    /// lap finds it free, and skips it.
    #[cold]
    #[inline(never)]
    fn eq_repair(&mut self, seg: &Segment, v: u64) -> Result<(), NiError> {
        if !self.eq_take_over(seg, v)? {
            // Changed meanwhile: look again next time.
            return Ok(());
        }
        Err(corrupt("event queue slot status", v))
    }

    /// Takes over the slot of the head ticket, claimed (as `v`) by a claimer that will never
    /// publish it ([`claim::take_over`]), and skips it. False if it changed meanwhile (its
    /// claimer published after all).
    fn eq_take_over(&mut self, seg: &Segment, v: u64) -> Result<bool, NiError> {
        let t = self.head;
        let word = seg.word(self.geo.eq_slot(t))?;
        if !claim::take_over(&self.geo.eq_laps, word, t, v) {
            return Ok(false);
        }
        self.consumed(seg)?;
        Ok(true)
    }

    /// Whether rank `r`'s sender record vouches for a claim of ticket `t`.
    pub(super) fn vouches(&self, seg: &Segment, r: u32, t: u64) -> Result<bool, NiError> {
        let rec = seg.word(self.geo.record(r)? + 8 * REC_EQ)?;
        Ok(claim::vouches(rec.load(Ordering::Acquire), t))
    }

    /// Ends a wait at the head of the queue that cannot end by itself (see the module docs):
    /// a claim by a lost rank (`lost[r]`) is taken over and skipped
    /// ([`Unblocked::SkippedLost`]); a claim in the name of a rank outside the job or of one
    /// whose record does not vouch for it, a status word no producer writes, or a hole
    /// below later claims (a corrupt tail) is skipped too and returned as `Corrupt`; a
    /// genuine claim by a live rank is [`Unblocked::InFlight`]. A few loads; call it when
    /// idle, not per poll.
    pub fn eq_unblock(&mut self, seg: &Segment, lost: &[bool]) -> Result<Unblocked, NiError> {
        let laps = self.geo.eq_laps;
        let t = self.head;
        // The tail first (Acquire, against the producers' Release store after their claim):
        // a tail past `t` then means `t` was claimed, and a free `t` is a hole.
        let tail = seg.word(EQ_TAIL)?.load(Ordering::Acquire);
        let v = seg.word(self.geo.eq_slot(t))?.load(Ordering::Acquire);
        match laps.look(v, t) {
            Ok(Seen::Published(0)) => Ok(Unblocked::Clear),
            // A publication with meta data, a skip or a stamp no lap writes: no producer's.
            Ok(Seen::Published(_) | Seen::Skipped(_)) | Err(_) => {
                self.eq_repair(seg, v).map(|()| Unblocked::Clear)
            }
            Ok(Seen::Claimed(r)) => {
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
            Ok(Seen::Empty) => {
                if tail <= t {
                    return Ok(Unblocked::Clear);
                }
                // Claims past a free head: holes, skipped at once (reported once).
                let geo = self.geo;
                let parts = Parts::new(seg, &geo);
                let skipped = claim::fill_holes(&parts, self.head)?;
                for _ in 0..skipped {
                    self.consumed(seg)?;
                }
                if skipped > 0 {
                    return Err(corrupt("event queue tail (a hole below claims)", tail));
                }
                let now = seg.word(self.geo.eq_slot(t))?.load(Ordering::Acquire);
                if !laps.is_free(now, t) {
                    // Claimed meanwhile (a claimer that fills the hole first keeps it).
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
    /// load of the head slot's status word; against the producer's `SeqCst` claim and
    /// load of the waiting word (see `Nic::eq_reserve`) no claim can go unnoticed by both
    /// sides. The fence is on this side, the one about to sleep.
    pub fn announce_wait(&self, seg: &Segment) -> Result<bool, NiError> {
        seg.doorbell(DOORBELL)?.take();
        seg.word(WAITING)?.store(1, Ordering::Release);
        fence(Ordering::SeqCst);
        let v = seg
            .word(self.geo.eq_slot(self.head))?
            .load(Ordering::SeqCst);
        Ok(self.geo.eq_laps.is_free(v, self.head))
    }

    /// After a wait: producers stop ringing (a ring still in flight only wakes us early).
    pub fn end_wait(&self, seg: &Segment) -> Result<(), NiError> {
        seg.word(WAITING)?.store(0, Ordering::Relaxed);
        Ok(())
    }
}
