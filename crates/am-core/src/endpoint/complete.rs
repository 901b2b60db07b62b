//! Completing operations: the one test and the one completion step of every [`Op`], the
//! implicit set, the slots of dropped handles, and calls.

use std::sync::Arc;
use std::task::{ready, Poll, Waker};

use super::state::{Detached, Endpoint};
use crate::call::Reply;
use crate::error::AmError;
use crate::handler::Threading;
use crate::op::{Completed, Op, Outcome, Raw, State};
use crate::transport::Transport;
use crate::types::{AmKind, HandlerId, Rank};

impl<H: Threading> Endpoint<H> {
    /// The completion step of any operation: `Ready` with its outcome (the handle is then
    /// spent: a second poll is [`AmError::StaleHandle`]), or `Pending` while it is in flight,
    /// `waker` (if given) being woken when it completes. A barrier is carried on here (it may
    /// send); its waker is the driver's to wake after progress, as for any send that waits.
    /// An operation of another endpoint ([`Endpoint::owns`]) is [`AmError::ForeignHandle`].
    pub fn poll_op<U: Outcome, T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        op: &mut Op<U>,
        waker: Option<&Waker>,
    ) -> Poll<Result<U::Value, AmError>> {
        self.poll_op_carrying(t, op, waker, true)
    }

    /// [`Endpoint::poll_op`]; `carry` says whether the collectives in segment 0 go a step
    /// further first. Completing many operations at once carries them once, not once per
    /// operation: each step is a move of up to [`super::in_segment::MOVE_PER_STEP`] bytes,
    /// under a shared driver's lock.
    fn poll_op_carrying<U: Outcome, T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        op: &mut Op<U>,
        waker: Option<&Waker>,
        carry: bool,
    ) -> Poll<Result<U::Value, AmError>> {
        let raw = match &op.state {
            State::Spent => return Poll::Ready(Err(AmError::StaleHandle)),
            // Complete when started: its outcome is its own, whichever node takes it (the
            // common case of a put or an atomic, so checked before the owner).
            State::Ready(_) => match op.take_state() {
                State::Ready(r) => Ok(r),
                _ => Err(AmError::StaleHandle),
            },
            _ if !self.owns(op) => return Poll::Ready(Err(AmError::ForeignHandle)),
            State::Slot { .. } => {
                // The collective this may be, and those it shares progress with.
                self.carry_collectives(t);
                // A collective in segment 0 goes a step further (once per call: see
                // `take_complete`).
                if carry {
                    self.carry_in_segment(t);
                }
                let (index, gen) = match self.slot_of(op) {
                    Ok(Some(slot)) => slot,
                    _ => return Poll::Ready(Err(AmError::StaleHandle)),
                };
                match self.poll_slot(index, gen) {
                    Poll::Ready(r) => {
                        // Completed: nothing is left for the handle's drop to detach.
                        op.take_state();
                        r
                    }
                    Poll::Pending => {
                        if let (Some(w), Some(slot)) = (waker, self.op(index, gen)) {
                            if !slot.waker.as_ref().is_some_and(|o| o.will_wake(w)) {
                                slot.waker = Some(w.clone());
                            }
                        }
                        return Poll::Pending;
                    }
                }
            }
            &State::Call { dest, .. } => match op.poll_call(waker) {
                Some(Poll::Pending) => match self.waiting_for(dest) {
                    // Gone before it answered: the answer will never come.
                    Poll::Ready(e) => {
                        if let State::Call { number, calls, .. } = op.take_state() {
                            calls.close(number);
                        }
                        Err(e)
                    }
                    Poll::Pending => return Poll::Pending,
                },
                Some(Poll::Ready(r)) => return Poll::Ready(r),
                None => Err(AmError::StaleHandle),
            },
            &State::Barrier { epoch, .. } => {
                if self.barriers_done <= epoch {
                    match self.barrier_step(t) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(e)) => {
                            // The next barrier resumes this one.
                            self.barrier_failed = true;
                            op.take_state();
                            return Poll::Ready(Err(e));
                        }
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Ok(Raw::Unit)
            }
        };
        Poll::Ready(op.finish(raw))
    }

    /// A wait for `op` ended with an error of progress (a poll's, not the operation's): a
    /// barrier is then resumed by the next barrier, as one whose own step failed, rather than
    /// finished behind it.
    pub fn interrupted<U: Outcome>(&mut self, op: &Op<U>) {
        if let State::Barrier { epoch, .. } = op.state {
            // Another endpoint's barrier of the same epoch is not this one.
            if self.owns(op) && self.barrier.is_some_and(|at| at.epoch == epoch) {
                self.barrier_failed = true;
            }
        }
    }

    /// Whether an operation is complete: its completion step ([`Endpoint::poll_op`]) is then
    /// ready (as it is, with [`AmError::ForeignHandle`], for another endpoint's). Looks only
    /// (a barrier is carried on by polls and completion steps).
    pub fn is_complete<U: Outcome>(&self, op: &Op<U>) -> bool {
        if !self.owns(op) {
            return true;
        }
        match &op.state {
            State::Spent | State::Ready(_) => true,
            State::Slot { .. } => match self.slot_of(op) {
                Ok(Some((index, gen))) => self.op_done(index, gen),
                _ => true,
            },
            State::Call {
                number,
                dest,
                calls,
                ..
            } => calls.is_done(*number) || self.waiting_for(*dest).is_ready(),
            &State::Barrier { epoch, .. } => self.barriers_done > epoch,
        }
    }

    /// The test of every driver, without its poll: whether an operation of this endpoint's
    /// is complete ([`Endpoint::is_complete`]); another endpoint's is
    /// [`AmError::ForeignHandle`] (see [`Endpoint::owns`]).
    pub fn test_op<U: Outcome>(&self, op: &Op<U>) -> Result<bool, AmError> {
        if !self.owns(op) {
            return Err(AmError::ForeignHandle);
        }
        Ok(self.is_complete(op))
    }

    /// Whether `op` was started on this endpoint, or names nothing of any endpoint's (it
    /// was complete when started, or is spent): an operation in flight (a slot of the
    /// table, a call, a barrier) is completed only where it was started. Another endpoint's
    /// is refused with [`AmError::ForeignHandle`] by [`Endpoint::poll_op`], which would
    /// otherwise wait for what this endpoint's progress never ends (another's call), or
    /// take this endpoint's operation for it (a barrier of the same epoch). One pointer
    /// compared.
    pub fn owns<U: Outcome>(&self, op: &Op<U>) -> bool {
        match &op.state {
            State::Ready(_) | State::Spent => true,
            State::Slot { table, .. } | State::Barrier { table, .. } => {
                Arc::ptr_eq(table, &self.orphans)
            }
            State::Call { .. } => {
                !op.is_foreign_call(self.handlers.calls.as_ref().map(|s| &s.calls))
            }
        }
    }

    /// Completes every operation of `ops` that is complete, taking it out of the set: their
    /// positions in `ops` and outcomes, in order (GASNet-EX's `gex_Event_TestSome`). Each
    /// one still in flight keeps `waker` (if any), as [`Endpoint::poll_op`] does.
    pub fn take_complete<U: Outcome, T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        ops: &mut [Option<Op<U>>],
        waker: Option<&Waker>,
    ) -> Completed<U> {
        let mut done = Vec::new();
        self.carry_in_segment(t);
        for (i, slot) in ops.iter_mut().enumerate() {
            let Some(op) = slot else { continue };
            if let Poll::Ready(r) = self.poll_op_carrying(t, op, waker, false) {
                *slot = None;
                done.push((i, r));
            }
        }
        done
    }

    /// A step of waiting for some of `ops` (`wait_some`): ready, with those it completed
    /// ([`Endpoint::take_complete`]), once it completed one or `ops` holds none.
    pub fn wait_some_step<U: Outcome, T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        ops: &mut [Option<Op<U>>],
        waker: Option<&Waker>,
    ) -> Poll<Completed<U>> {
        let done = self.take_complete(t, ops, waker);
        if done.is_empty() && ops.iter().any(Option::is_some) {
            return Poll::Pending;
        }
        Poll::Ready(done)
    }

    /// Leaves `op` to the implicit set: it completes with nobody waiting for it, and
    /// [`Endpoint::nbi_step`] waits for it with the rest of the set (an error of it is the
    /// set's).
    pub fn implicit<U: Outcome>(&mut self, mut op: Op<U>) {
        if !self.owns(&op) {
            // Dropped: it completes detached on its own endpoint.
            return;
        }
        let slot = self.slot_of(&op);
        match op.take_state() {
            State::Slot { .. } => {
                if let Ok(Some((index, gen))) = slot {
                    self.detach_op(index, gen, Detached::Implicit);
                }
            }
            // Calls and barriers are not in the set: left, they complete detached.
            state => op.state = state,
        }
    }

    /// A step of waiting for the implicit set (`wait_nbi`): ready once the posted atomics are
    /// applied and every operation of the set is complete, with the set's first error since
    /// the last such wait.
    pub fn nbi_step<T: Transport + ?Sized>(&mut self, t: &mut T) -> Poll<Result<(), AmError>> {
        ready!(self.apply_posted(t))?;
        if self.detached_in_flight > 0 || self.nbi_in_flight > 0 {
            return Poll::Pending;
        }
        Poll::Ready(match self.nbi_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        })
    }

    /// Operations in flight, whether a handle waits for them or not (posted atomics sent as
    /// messages, the implicit set, operations whose handle was dropped), and calls not yet
    /// taken or given up: none once everything started has completed and been collected.
    pub fn ops_in_flight(&mut self) -> usize {
        self.adopt_orphans();
        let calls = self.handlers.calls.as_ref().map_or(0, |s| s.calls.len());
        self.ops.iter().filter(|s| s.live).count() + calls
    }

    /// Async waits woken by completions so far.
    pub fn woken(&self) -> u64 {
        self.woken
    }

    /// What a poll does besides handling messages: frees the slots of dropped handles whose
    /// operations completed and the teams whose last handle was dropped, advances the
    /// collectives in flight, applies the posted atomics and carries on a barrier in progress
    /// (whose handle may have been dropped: it completes all the same). A peer's stray
    /// collective step found outside a delivery is its error.
    pub fn background_step<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
    ) -> Poll<Result<(), AmError>> {
        self.adopt_orphans();
        self.adopt_team_drops();
        self.advance_collectives(t);
        self.carry_in_segment(t);
        if let Some(e) = self.take_stray() {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        if self.barrier.is_some() && !self.barrier_failed {
            // Its error is its waiter's, who sees it again on its own step.
            let _ = self.barrier_step(t);
        }
        Poll::Ready(Ok(()))
    }

    /// Detaches the slots of the handles dropped since the last look: freed now if complete,
    /// else when their last answer comes.
    pub(super) fn adopt_orphans(&mut self) {
        for (index, gen) in self.orphans.take() {
            self.detach_op(index, gen, Detached::Dropped);
        }
    }

    /// Opens a call ([`crate::endpoint::start::Call`]) after checking it as the request it
    /// will be: `words` are the request's arguments, the call's number first (its place is
    /// filled here) and then the caller's. Returns the call's handle; [`Endpoint::call_step`]
    /// sends the request. Fails if the table has no callable handler, or the request would
    /// be refused (nothing is opened then).
    pub fn call_start(
        &mut self,
        dest: Rank,
        handler: HandlerId,
        words: &mut [u32],
        payload_len: usize,
    ) -> Result<Op<Reply>, AmError> {
        let Some(site) = &self.handlers.calls else {
            return Err(AmError::NotCallable(handler));
        };
        if !self.handlers.is_callable(handler) {
            return Err(AmError::NotCallable(handler));
        }
        let calls = site.calls.clone();
        let Some(number) = words.first_mut() else {
            return Err(AmError::TooManyArgs(0));
        };
        *number = 0;
        self.check_request(dest, AmKind::Medium, handler, words, payload_len, None)?;
        // The table's count before the call is opened: its answer, or its failure, moves it,
        // so a blocking waiter's first look need not take the table's lock (nothing can end
        // a call whose request has not left yet).
        let seen = calls.ended();
        let number = calls.open(dest);
        words[0] = number;
        Ok(Op::new(State::Call {
            number,
            dest,
            calls,
            seen,
        }))
    }

    /// A step of sending a call's request (as [`Endpoint::request_step`]); `handler`, `words`
    /// and `payload` must be what [`Endpoint::call_start`] was given (`words` as it left it).
    pub fn call_step<T: Transport + ?Sized, U: Outcome>(
        &mut self,
        t: &mut T,
        op: &Op<U>,
        handler: HandlerId,
        words: &[u32],
        payload: &[u8],
    ) -> Poll<Result<(), AmError>> {
        let State::Call { dest, .. } = op.state else {
            return Poll::Ready(Err(AmError::StaleHandle));
        };
        self.request_step(t, dest, AmKind::Medium, handler, words, payload, None)
    }
}
