//! Match entries: their options and words, the seqlock a walker reads them under and the
//! owner writes them under, what a wire keeps of entries it has checked ([`MeSeen`]), and
//! the walk of a portal's match list (matching, use-once entries, locally managed space).
//! See the [module docs](super#match-lists-and-locally-managed-offsets).

use super::die;
use super::eq::{Claimer, Event, EventKind, NiFail};
use super::layout::{
    corrupt, Line, MeIndex, MeLines, NiError, NiGeometry, Nic, LINE_WORDS, ME_NEXT, NPT,
    PT_DISABLED, PT_ENABLED, PT_FLOWCTRL,
};
use am_shm::sync::{fence, AtomicU64, Ordering};
pub(super) const ME_FREE: u64 = 0;
pub(super) const ME_LINKED: u64 = 1;
pub(super) const ME_UNLINKED: u64 = 2;
pub(super) const ME_WRITING: u64 = 3;
/// `used` word of an LM entry that still has room.
pub(super) const NOT_USED: u64 = u64::MAX;

/// Longest match-list walk before the walker gives up (a list the owner keeps re-linking).
pub(super) fn walk_limit(max_me: u32) -> u32 {
    2 * max_me + 4
}

/// Locally managed offsets are claimed in units of this many bytes.
pub const LM_ALIGN: usize = 8;

/// Rounds a message length up to the locally managed claim unit.
#[inline]
pub fn lm_len(len: usize) -> usize {
    len.div_ceil(LM_ALIGN) * LM_ALIGN
}

/// Options of a match entry, all off by default: `MeOptions::default().put(true).use_once(true)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
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
pub(super) const OPT_PUT: u64 = 1;
pub(super) const OPT_GET: u64 = 2;
pub(super) const OPT_USE_ONCE: u64 = 4;
pub(super) const OPT_MANAGE_LOCAL: u64 = 8;
pub(super) const OPT_EVENT_DISABLE: u64 = 16;

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

impl MeOptions {
    /// No option set, as [`MeOptions::default`]; set them with the setters below.
    pub fn new() -> MeOptions {
        MeOptions::default()
    }

    /// Accepting puts.
    #[must_use]
    pub fn put(mut self, put: bool) -> MeOptions {
        self.put = put;
        self
    }

    /// Accepting gets.
    #[must_use]
    pub fn get(mut self, get: bool) -> MeOptions {
        self.get = get;
        self
    }

    /// Unlinked by the first operation that matches it.
    #[must_use]
    pub fn use_once(mut self, use_once: bool) -> MeOptions {
        self.use_once = use_once;
        self
    }

    /// With locally managed offsets.
    #[must_use]
    pub fn manage_local(mut self, manage_local: bool) -> MeOptions {
        self.manage_local = manage_local;
        self
    }

    /// With no `Put`/`Get` event on success.
    #[must_use]
    pub fn event_disable(mut self, event_disable: bool) -> MeOptions {
        self.event_disable = event_disable;
        self
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
    pub(super) fn words(&self, pt: u8) -> [u64; 5] {
        [
            self.match_bits,
            self.ignore_bits,
            self.options.encode(pt),
            self.start as u64,
            self.length as u64,
        ]
    }
}

/// A match entry read consistently (its options word raw: the walk tests bits).
pub(super) struct MeRecord<'a> {
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
pub(super) struct Seen {
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
pub(super) trait SeenEntries {
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
pub(super) enum Walked {
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
    pub(super) fn pt_state(&self, pt: u8) -> Result<(u64, u64), NiError> {
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
    pub(super) fn walk<S: SeenEntries>(
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
}

/// The seqlock's write side, by the owner: entry line `l` rewritten from `spec` (portal
/// `pt`) in generation `g`, ending in state word `state`. Walkers that see `WRITING`, or a
/// state word that changed while they read ([`Nic::read_me`]), skip the entry.
#[inline]
pub(super) fn write_entry(l: &Line, g: u64, pt: u8, spec: &MeSpec, state: u64) {
    l[0].store(g << 8 | ME_WRITING, Ordering::Relaxed);
    fence(Ordering::Release);
    for (w, v) in l[1..6].iter().zip(spec.words(pt)) {
        w.store(v, Ordering::Relaxed);
    }
    l[0].store(state, Ordering::Release);
}
