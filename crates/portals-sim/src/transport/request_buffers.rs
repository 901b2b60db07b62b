//! The request buffers: match list entries that a full buffer unlinks (flow control refuses
//! the puts that find none), relinked once the receiver has read what they took in.

use super::*;
use am_shm::sync::{fence, Ordering};

impl Portals {
    /// Request buffer `b`'s offset went past its end (an `Unlink` event said so, saying
    /// `used` bytes were claimed in it, or the owner saw it): out of the match list, and
    /// re-linked once drained. An `Unlink` about a buffer whose offset is not past its end is
    /// ignored (nothing to do); a `used` no walker could have written is reported after the
    /// buffer was handled.
    pub(super) fn note_exhausted(
        &mut self,
        b: usize,
        used: Option<u64>,
    ) -> Result<(), TransportError> {
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
    pub(super) fn try_relink(&mut self, b: usize) -> Result<(), TransportError> {
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
    pub(super) fn retry_buffers(&mut self) -> Result<(), TransportError> {
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
    pub(super) fn maybe_enable(&mut self) -> Result<(), TransportError> {
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
                let enabled = self
                    .owner
                    .pt_enable(&self.own, PT_REQUEST)
                    .map_err(ni_fault);
                // After the entry's store: a sender that asked for room before this look is
                // rung; one that asks after it sees the entry enabled (`want_room`).
                fence(Ordering::SeqCst);
                self.ring_room();
                return first.and(enabled);
            }
            if let Err(e) = self.note_exhausted(b, None) {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// Rings up to `room_per_ring` of the ranks that asked for room (their bits in the room
    /// waiter words; [`am_nic::room::ring_waiters`]) if any asked and the request entry is
    /// enabled: a sender asleep in [`Transport::wait`] wakes and sends again, one armed on
    /// its wake socket is woken through it. The words are the peers' to write: a bit that
    /// names no other rank of the job is dropped, and a forged one costs its rank a spurious
    /// wake-up.
    pub(super) fn ring_room(&mut self) {
        let geo = self.tx.layout.ni;
        if self.own.load_word(geo.room()).unwrap_or(0) == 0 {
            return;
        }
        self.ring_room_waiters();
    }

    #[cold]
    #[inline(never)]
    fn ring_room_waiters(&mut self) {
        if !matches!(
            self.owner.pt_state(&self.own, PT_REQUEST),
            Ok(ni::PT_ENABLED)
        ) {
            // Rung when the entry is enabled again.
            return;
        }
        let geo = self.tx.layout.ni;
        let tx = &self.tx;
        am_nic::room::ring_waiters(
            &self.own,
            geo.room(),
            |w| geo.room_waiter(w),
            geo.ranks() as usize,
            tx.rank as usize,
            self.room_per_ring,
            &mut self.room_next,
            |c| {
                let _ = tx.nic(c).ring();
            },
        );
    }

    /// A refusal event (`Dropped`, `PtDisabled`): every so often, check the words walkers
    /// read (a corrupt one makes every put refused, and this owner busy with the refusals).
    pub(super) fn on_refusal(&mut self) -> Result<(), TransportError> {
        self.refusals += 1;
        if self.refusals % VERIFY_EVERY_REFUSALS == 1 {
            self.owner.verify(&self.own).map_err(ni_fault)?;
        }
        Ok(())
    }
}
