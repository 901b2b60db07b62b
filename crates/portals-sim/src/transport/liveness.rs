//! Liveness: a peer that died or left, and buffers that stopped draining, noticed while
//! nothing arrives.

use super::*;

impl Portals {
    /// Rank `r` is lost: what was in flight with it is forgotten, a claim of it at the head
    /// of the queue is skipped, and buffers it had claimed space in are re-linked once the
    /// rest is read.
    pub(super) fn forget(&mut self, r: usize) -> Result<(), TransportError> {
        self.tx.forget(r);
        self.liveness.mark_lost(r);
        self.owner
            .eq_unblock(&self.own, &self.tx.lost)
            .map_err(ni_fault)?;
        self.retry_buffers()
    }
}

impl Portals {
    /// The idle path (every so many empty polls, and each wait): publish the head, end a
    /// wait at the queue's head that cannot end (a lost or forged claim, a corrupt word, a
    /// hole), retry exhausted buffers, re-enable flow control; and after a while without
    /// progress, check every word walkers read and that every peer is alive. Does all of it
    /// whatever fails; returns the first error.
    pub(super) fn idle_tick(&mut self) -> Result<(), TransportError> {
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
        // Room made by the head published above (a full event queue), or a request the
        // look after enabling the entry missed.
        self.ring_room();
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
    pub(super) fn blame(&mut self, e: TransportError) -> TransportError {
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
    pub(super) fn check_buffers(&mut self) -> Result<(), TransportError> {
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
    pub(super) fn declare_lost(&mut self, r: usize) -> Result<(), TransportError> {
        self.forget(r)
    }
}
