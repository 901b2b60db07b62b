//! Peers that are lost or have left the job: what fails, what is no longer waited for.

use std::task::Poll;

use super::state::{Endpoint, DEPARTED, ENDED, LOST};
use crate::credit::CreditPolicy;
use crate::error::AmError;
use crate::handler::Threading;
use crate::transport::Transport;
use crate::types::Rank;

impl<H: Threading> Endpoint<H> {
    /// Records what a poll's error says about a peer: a lost peer is marked lost (its
    /// operations fail), a departed one departed. Returns the error back, except for a
    /// departure, which is not an error of the poll that found it: only the calls that wait
    /// for that peer fail.
    pub fn absorb(&mut self, e: AmError) -> Option<AmError> {
        match e {
            AmError::PeerDeparted(peer) => {
                self.mark_departed(peer);
                None
            }
            AmError::PeerLost(peer) => {
                self.mark_lost(peer);
                Some(e)
            }
            e if e.ends_node() => {
                self.end(e.clone());
                Some(e)
            }
            e => Some(e),
        }
    }

    /// Ends the endpoint with `error` (the job aborted, the device failed, the node closed):
    /// every operation and call in flight completes with it now, its waiters woken, and
    /// every later one fails with it at once. Once only: a second end keeps the first error.
    #[cold]
    pub fn end(&mut self, error: AmError) {
        if self.ended.is_some() {
            return;
        }
        for g in &mut self.gone_as {
            *g |= ENDED;
        }
        self.fail_slots(|_| true, &error);
        // The collectives, whose slots just failed, are dropped at their next advance.
        self.teams.dirty = true;
        if let Some(site) = &self.handlers.calls {
            site.calls.fail_all(&error);
        }
        self.replies.pending.clear();
        self.ended = Some(error);
    }

    /// The endpoint's counters ([`crate::Stats`]), without the NIC's own.
    pub fn stats(&self) -> crate::Stats {
        crate::Stats {
            late_answers: self.handlers.calls.as_ref().map_or(0, |s| s.calls.late()),
            credit_waits: self.credit_waits,
            refused: self.replies.refused,
            typed_staged: self
                .handlers
                .typed_site
                .as_ref()
                .map_or(0, |s| s.transit.staged()),
            ..Default::default()
        }
    }

    /// The error that ended the endpoint ([`Endpoint::end`]), if it has ended.
    pub fn ended(&self) -> Option<&AmError> {
        self.ended.as_ref()
    }

    #[cold]
    #[inline(never)]
    pub(super) fn ended_error(&self) -> AmError {
        self.ended.clone().unwrap_or(AmError::JobAborted)
    }

    pub(super) fn is_gone(&self, peer: Rank) -> bool {
        self.is_lost(peer) || self.is_departed(peer)
    }

    /// `Pending` while `peer` may still answer; otherwise the error that says why it won't.
    #[inline]
    pub(super) fn waiting_for(&self, peer: Rank) -> Poll<AmError> {
        match self.gone_as.get(peer as usize).copied().unwrap_or(0) {
            0 => Poll::Pending,
            gone => Poll::Ready(self.gone_error(peer, gone)),
        }
    }

    /// Why `peer`, whose gone flags are `gone` (not 0), will not answer. Out of line: the
    /// sends that inline [`Endpoint::waiting_for`] keep only its test.
    #[cold]
    #[inline(never)]
    pub(super) fn gone_error(&self, peer: Rank, gone: u8) -> AmError {
        if gone & ENDED != 0 {
            self.ended_error()
        } else if gone & LOST != 0 {
            AmError::PeerLost(peer)
        } else {
            AmError::PeerDeparted(peer)
        }
    }

    /// Sets `how` ([`LOST`] or [`DEPARTED`]) for `peer`: false if it was set already (or no
    /// such peer).
    pub(super) fn mark_gone(&mut self, peer: Rank, how: u8) -> bool {
        match self.gone_as.get_mut(peer as usize) {
            Some(g) if *g & how == 0 => {
                *g |= how;
                true
            }
            _ => false,
        }
    }

    /// Records that `peer` is gone: fails its operations in flight and drops the replies still
    /// queued for it. Returns false if it was already known.
    pub fn mark_lost(&mut self, peer: Rank) -> bool {
        if !self.mark_gone(peer, LOST) {
            return false;
        }
        self.gone += 1;
        self.changes = self.changes.wrapping_add(1);
        self.fail_ops_with(peer, AmError::PeerLost(peer));
        self.fail_teams_with(peer, &AmError::PeerLost(peer), true);
        self.replies.pending.retain(|p| p.dest != peer);
        if let Some(acks) = self.replies.acks.as_mut() {
            acks.forget(peer);
        }
        true
    }

    /// Ends the puts, gets, atomics and calls in flight with `peer` with `error` (nothing
    /// more comes): their waiters are woken, detached ones freed.
    pub(super) fn fail_ops_with(&mut self, peer: Rank, error: AmError) {
        self.fail_slots(|p| p == peer, &error);
        if let Some(site) = &self.handlers.calls {
            site.calls.fail_to(peer, &error);
        }
        if let Some(site) = &self.handlers.typed_site {
            site.transit.forget(peer);
        }
    }

    /// Ends every live operation slot whose peer `with` picks with `error` (what it still
    /// waited for will not come): its waiter is woken, a detached one freed.
    fn fail_slots(&mut self, with: impl Fn(Rank) -> bool, error: &AmError) {
        for i in 0..self.ops.len() {
            let slot = &mut self.ops[i];
            if !slot.live || !with(slot.peer) {
                continue;
            }
            if slot.outstanding > 0 || slot.sent < slot.len {
                slot.outstanding = 0;
                slot.len = slot.sent;
                slot.error.get_or_insert_with(|| error.clone());
            }
            self.settle(i as u32);
        }
    }

    /// True if `peer` was reported lost.
    #[inline]
    pub fn is_lost(&self, peer: Rank) -> bool {
        self.gone_as
            .get(peer as usize)
            .is_some_and(|g| g & LOST != 0)
    }

    /// Records that `peer` left the job cleanly: its puts and gets still waiting for replies
    /// fail (nothing more will come from it). Returns false if it was already known.
    pub fn mark_departed(&mut self, peer: Rank) -> bool {
        if !self.mark_gone(peer, DEPARTED) {
            return false;
        }
        self.gone += 1;
        self.changes = self.changes.wrapping_add(1);
        self.fail_ops_with(peer, AmError::PeerDeparted(peer));
        self.fail_teams_with(peer, &AmError::PeerDeparted(peer), false);
        if let Some(acks) = self.replies.acks.as_mut() {
            acks.forget(peer);
        }
        true
    }

    /// True if `peer` left the job cleanly.
    #[inline]
    pub fn is_departed(&self, peer: Rank) -> bool {
        self.gone_as
            .get(peer as usize)
            .is_some_and(|g| g & DEPARTED != 0)
    }

    /// How many peers have been marked lost or departed: a driver that waits re-checks
    /// [`Endpoint::take_unanswerable`] when it changes.
    #[inline]
    pub fn gone_count(&self) -> u32 {
        self.gone
    }

    /// Bumped when a peer goes and when a collective's step arrives: a blocking wait that
    /// polls no operation re-checks [`Endpoint::take_unanswerable`] and carries the
    /// collectives on when it changes, and pays one comparison per poll otherwise.
    #[inline]
    pub(crate) fn changes(&self) -> u32 {
        self.changes
    }

    /// The first peer that is lost or has left while requests to it still await their
    /// replies, as the error a wait fails with: those replies will never come. Each such
    /// peer is reported once (later waits, which may wait for other peers, go on).
    pub fn take_unanswerable(&mut self) -> Option<AmError> {
        let peer = (0..self.size).find(|&p| {
            !self.unanswered_reported[p as usize]
                && self.credits.outstanding(p) > 0
                && self.is_gone(p)
        })?;
        self.unanswered_reported[peer as usize] = true;
        match self.waiting_for(peer) {
            Poll::Ready(e) => Some(e),
            Poll::Pending => None,
        }
    }

    /// The calls in flight of this endpoint's handler table (`None`: no callable handler).
    pub(crate) fn calls(&self) -> Option<std::sync::Arc<crate::call::Calls>> {
        self.handlers.calls.as_ref().map(|s| s.calls.clone())
    }

    /// Sends this endpoint holds back for a later poll: replies the device refused, implicit
    /// replies owed, posted atomics not yet applied. A driver that sleeps on the transport
    /// alone must not sleep long while any is left (the device that refused them does not
    /// wake this rank when it has room again).
    pub fn sends_held(&self) -> bool {
        !self.replies.pending.is_empty()
            || self.acks_owed()
            || !self.posted.is_empty()
            || self.typed_queued()
    }

    /// Whether a poll has work to do that no message will announce: a collective in segment 0
    /// part-way through its direct move, which each advance takes a step further (see
    /// [`Endpoint::background_step`]). A driver must not sleep while it is: it polls again
    /// at once ([`crate::Node::arm`] says [`crate::Armed::Ready`]).
    #[inline]
    pub fn has_local_work(&self) -> bool {
        self.teams.moving
    }

    /// Whether typed messages queued what must still leave (answers, cancels).
    fn typed_queued(&self) -> bool {
        self.handlers
            .typed_site
            .as_ref()
            .is_some_and(|s| s.transit.has_queued())
    }

    /// A step of closing: ready once the posted atomics are applied (or can no longer be)
    /// and the endpoint is quiet ([`Endpoint::is_quiet`]), or once it has ended.
    pub fn close_step<T: Transport + ?Sized>(&mut self, t: &mut T) -> Poll<()> {
        if self.ended.is_some() {
            return Poll::Ready(());
        }
        // A lost target is no reason to keep the others' atomics back, nor to stop waiting.
        if self.apply_posted(t).is_pending() || !self.is_quiet() {
            return Poll::Pending;
        }
        Poll::Ready(())
    }

    /// Nothing this rank waits for: no queued replies and no requests in flight to live peers.
    pub fn is_quiet(&self) -> bool {
        self.replies.pending.is_empty()
            && !self.acks_owed()
            && !self.typed_queued()
            && (0..self.size)
                .all(|p| self.is_lost(p) || self.is_departed(p) || self.credits.outstanding(p) == 0)
    }
}
