//! The wire's operations into a target's NI, as the target's NIC would do them: put, get
//! and atomic (matching through [`me`](super::me), events through [`eq`](super::eq)).

use super::die;
use super::eq::{Claimer, Event, EventKind, NiFail};
use super::layout::{MeIndex, NiError, Nic, PT_ENABLED};
use super::me::{MeSeen, SeenEntries, Walked};
use am_shm::{Segment, SharedBytes};
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
    /// whole units of [`LM_ALIGN`](super::LM_ALIGN) bytes.)
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

impl<'a> Nic<'a> {
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
        let len = dst.len();
        self.get_with(
            initiator,
            own,
            pt,
            match_bits,
            remote_offset,
            len,
            |seg, at| {
                seg.read(at, dst)?;
                Ok(())
            },
        )
    }

    /// [`Nic::get`] into shared memory, the initiator's own segment (a memory descriptor
    /// over it): one copy from this NI's memory to `dst`.
    pub fn get_shared(
        &self,
        initiator: u32,
        own: Option<&Nic<'_>>,
        pt: u8,
        match_bits: u64,
        remote_offset: u64,
        dst: SharedBytes<'_>,
    ) -> Result<Outcome, NiError> {
        let len = dst.len();
        self.get_with(
            initiator,
            own,
            pt,
            match_bits,
            remote_offset,
            len,
            |seg, at| {
                dst.copy_from(0, seg.byte_area().slice(at, len)?)?;
                Ok(())
            },
        )
    }

    /// [`Nic::get`] of `len` bytes, the read done by `land` (at the matched offset).
    #[allow(clippy::too_many_arguments)]
    fn get_with(
        &self,
        initiator: u32,
        own: Option<&Nic<'_>>,
        pt: u8,
        match_bits: u64,
        remote_offset: u64,
        len: usize,
        land: impl FnOnce(&Segment, usize) -> Result<(), NiError>,
    ) -> Result<Outcome, NiError> {
        if len > u32::MAX as usize {
            return Err(NiError::Invalid(format!("a get of {len} bytes")));
        }
        let mut cl = Claimer::new(self, initiator)?;
        let found = self.walk(
            &mut (),
            &mut cl,
            pt,
            match_bits,
            len,
            remote_offset,
            true,
            false,
        )?;
        let outcome = match found {
            Walked::Found {
                idx, at, use_once, ..
            } => {
                land(self.seg, at)?;
                let mut ev = Event::new(EventKind::Get, initiator, pt);
                ev.match_bits = match_bits;
                ev.start = at as u64;
                ev.mlength = len as u32;
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
