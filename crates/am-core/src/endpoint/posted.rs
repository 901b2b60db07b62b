//! Posted (non-fetching) remote atomics: queued in order and applied together, by the NIC in
//! batches where it applies atomics itself, otherwise as system messages nobody waits for,
//! one per target for all that the queue holds for it ([`SystemMsg::Atomics`]).
//! Every other operation of this rank (a request, a put, a get, an atomic, a barrier, a
//! quiesce) first waits until the queue is empty, which is what orders posted atomics before
//! it, whatever drives the endpoint.

use std::task::Poll;

use super::state::{Detached, Endpoint, POSTED_ATOMICS};
use crate::atomic::{Atomic, AtomicOp, AtomicWord, Posted};
use crate::error::AmError;
use crate::handler::Threading;
use crate::protocol::{push_atomic_entry, SystemMsg, ATOMIC_ENTRY_LEN, MAX_BATCH_ATOMICS};
use crate::transport::Transport;
use crate::types::Rank;

impl<H: Threading> Endpoint<H> {
    /// Posts a non-fetching remote atomic ([`crate::Node::atomic_nbi`]): checked now, queued
    /// behind the atomics posted before it, and applied by the time any later operation of
    /// this rank goes out, or by [`Endpoint::apply_posted`]. A full queue (or one of the other
    /// path: NIC or messages) is applied first: `Pending` if it cannot be yet, and nothing was
    /// posted (make progress and call again). Atomics that travel as messages wait in the
    /// queue too, so that each target gets those of a whole queue in one message. Errors of
    /// atomics applied in this call (a lost target) are returned here.
    pub fn atomic_nbi<T: Transport + ?Sized, W: AtomicWord>(
        &mut self,
        t: &mut T,
        dest: Rank,
        offset: usize,
        op: AtomicOp<W>,
    ) -> Poll<Result<(), AmError>> {
        let atomic = Atomic::from(op);
        if let Err(e) = self.check_atomic(dest, offset, &atomic) {
            return Poll::Ready(Err(e));
        }
        let by_nic = t.info().capabilities.atomics;
        if !self.posted.is_empty()
            && (self.posted.len() >= POSTED_ATOMICS || by_nic != self.posted_by_nic)
        {
            if let Poll::Ready(Err(e)) = self.apply_posted(t) {
                return Poll::Ready(Err(e));
            }
            if !self.posted.is_empty() {
                return Poll::Pending;
            }
        }
        self.posted_by_nic = by_nic;
        self.posted.push(Posted {
            dest,
            offset,
            atomic,
        });
        if self.posted.len() >= POSTED_ATOMICS {
            if let Poll::Ready(Err(e)) = self.apply_posted(t) {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Applies the posted atomics, in order: ready once none is left, with the first error
    /// of those refused (a lost target, which is marked lost); `Pending` while the device is
    /// busy or credits are out (the rest stay queued, in order). One test when none is
    /// posted: every operation's start calls it.
    #[inline(always)]
    pub fn apply_posted<T: Transport + ?Sized>(&mut self, t: &mut T) -> Poll<Result<(), AmError>> {
        if self.posted.is_empty() {
            return Poll::Ready(Ok(()));
        }
        self.apply_queued(t)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn apply_queued<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
    ) -> Poll<Result<(), AmError>> {
        let done = if self.posted_by_nic {
            let mut batch = crate::atomic::Batch::default();
            let request = crate::transport::Rma::Atomics {
                batch: &self.posted,
                outcome: &mut batch,
            };
            if let Err(e) = t.rma(request) {
                // The batch refused whole: nothing of it was done.
                batch = crate::atomic::Batch {
                    done: 0,
                    error: (!matches!(e, crate::error::SendError::Busy)).then_some(e),
                };
            }
            if let Some(e) = batch.error {
                let e = self.nic_failed(e);
                self.posted_refused.get_or_insert(e);
            }
            batch.done.min(self.posted.len())
        } else {
            self.post_by_messages(t);
            0
        };
        self.posted.drain(..done);
        if !self.posted.is_empty() {
            return Poll::Pending;
        }
        match self.posted_refused.take() {
            Some(e) => Poll::Ready(Err(e)),
            None => Poll::Ready(Ok(())),
        }
    }

    /// Sends the queued atomics as messages, each target's (in their order) in one
    /// [`SystemMsg::Atomics`] as far as one carries them, and applies this rank's own; what
    /// goes out or is applied leaves the queue. Stops at the first target out of credit or
    /// behind a busy device (its atomics and those after them stay queued, in order; those to
    /// other targets may have gone already, which no order between targets forbids).
    fn post_by_messages<T: Transport + ?Sized>(&mut self, t: &mut T) {
        let per_message =
            (self.limits.max_medium / ATOMIC_ENTRY_LEN).min(MAX_BATCH_ATOMICS as usize);
        while let Some(&first) = self.posted.first() {
            if first.dest == self.rank || per_message < 2 {
                match self.post_by_message(t, first) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => {
                        self.posted_refused.get_or_insert(e);
                    }
                    Poll::Pending => return,
                }
                self.posted.remove(0);
                continue;
            }
            let dest = first.dest;
            let mut batch = std::mem::take(&mut self.posted_batch);
            batch.clear();
            let mut count = 0u32;
            for p in self
                .posted
                .iter()
                .filter(|p| p.dest == dest)
                .take(per_message)
            {
                push_atomic_entry(&mut batch, p.offset as u64, &p.atomic);
                count += 1;
            }
            let sent = self.post_batch(t, dest, count, &batch, first.atomic);
            self.posted_batch = batch;
            match sent {
                Poll::Ready(r) => {
                    if let Err(e) = r {
                        self.posted_refused.get_or_insert(e);
                    }
                    let mut left = count;
                    self.posted.retain(|p| {
                        let taken = left > 0 && p.dest == dest;
                        left -= u32::from(taken);
                        !taken
                    });
                }
                Poll::Pending => return,
            }
        }
    }

    /// Sends `count` atomics to `dest` as one [`SystemMsg::Atomics`] with `payload`, its reply
    /// awaited by nobody (as [`Endpoint::post_by_message`]'s). `Pending`: out of credit or
    /// the device is busy, and nothing was sent.
    fn post_batch<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        dest: Rank,
        count: u32,
        payload: &[u8],
        first: Atomic,
    ) -> Poll<Result<(), AmError>> {
        let (index, gen) = self.alloc_atomic(dest, 0, first);
        let msg = SystemMsg::Atomics { op: index, count };
        let step = self.system_step(t, dest, msg, payload, None);
        if let Poll::Ready(Ok(())) = step {
            let slot = &mut self.ops[index as usize];
            slot.outstanding += 1;
            slot.sent = slot.len;
        }
        self.settle_posted(index, gen, step)
    }

    /// What sending a posted atomic (or a batch) leaves of its operation slot: sent, it is
    /// detached (freed when its reply comes); not sent, or refused, the slot is free again.
    fn settle_posted(
        &mut self,
        index: u32,
        gen: u32,
        step: Poll<Result<(), AmError>>,
    ) -> Poll<Result<(), AmError>> {
        match step {
            Poll::Ready(Ok(())) => self.detach_op(index, gen, Detached::Posted),
            _ => {
                let _ = self.finish_op(index);
            }
        }
        step
    }

    /// Sends one posted atomic as a system message whose reply nobody waits for (its slot is
    /// freed when the reply comes; [`Endpoint::posted_in_flight`] counts it until then), or
    /// applies it to this rank's segment. `Pending`: out of credit or the device is busy,
    /// and nothing was sent.
    fn post_by_message<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        p: Posted,
    ) -> Poll<Result<(), AmError>> {
        if p.dest == self.rank {
            return Poll::Ready(self.apply_here(t.segment(), p.offset, p.atomic).map(drop));
        }
        let (index, gen) = self.alloc_atomic(p.dest, p.offset, p.atomic);
        let step = self.op_step(t, index, gen, None);
        self.settle_posted(index, gen, step)
    }

    /// Posted atomics sent as messages ([`Endpoint::atomic_nbi`]) still waiting for their
    /// reply: a barrier waits for none to be left, so that what a rank posted is applied at
    /// its target before anyone leaves the barrier.
    pub fn posted_in_flight(&self) -> u32 {
        self.detached_in_flight
    }

    /// A step of [`crate::Node::quiesce`], the fence of one-sided operations (OpenSHMEM's
    /// `shmem_quiet`): ready once the posted atomics are applied and nothing this rank sent
    /// awaits its answer ([`Endpoint::is_quiet`]).
    pub fn quiesce_step<T: Transport + ?Sized>(&mut self, t: &mut T) -> Poll<Result<(), AmError>> {
        std::task::ready!(self.apply_posted(t))?;
        if self.is_quiet() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }
}
