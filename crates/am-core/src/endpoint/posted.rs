//! Posted (non-fetching) remote atomics: queued in order and applied together, by the NIC in
//! batches where it applies atomics itself, otherwise as system messages nobody waits for.
//! Every other operation of this rank (a request, a put, a get, an atomic, a barrier, a
//! quiesce) first waits until the queue is empty, which is what orders posted atomics before
//! it, whatever drives the endpoint.

use std::task::Poll;

use super::state::{Endpoint, POSTED_ATOMICS};
use crate::atomic::{Atomic, AtomicOp, AtomicWord, Posted};
use crate::error::AmError;
use crate::handler::Threading;
use crate::transport::Transport;
use crate::types::Rank;

impl<H: Threading> Endpoint<H> {
    /// Posts a non-fetching remote atomic ([`crate::Node::atomic_post`]): checked now, queued
    /// behind the atomics posted before it, and applied by the time any later operation of
    /// this rank goes out, or by [`Endpoint::apply_posted`]. A full queue (or one of the other
    /// path: NIC or messages) is applied first: `Pending` if it cannot be yet, and nothing was
    /// posted (make progress and call again). An atomic to a peer the NIC does not reach goes
    /// out at once if a credit allows. Errors of atomics applied in this call (a lost target)
    /// are returned here.
    pub fn atomic_post<T: Transport + ?Sized, W: AtomicWord>(
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
        let by_nic = t.capabilities().atomics;
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
        if self.posted.len() >= POSTED_ATOMICS || !by_nic {
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
            let batch = t.atomics(&self.posted);
            if let Some(e) = batch.error {
                let e = self.nic_failed(e);
                self.posted_refused.get_or_insert(e);
            }
            batch.done.min(self.posted.len())
        } else {
            let mut done = 0;
            while let Some(&p) = self.posted.get(done) {
                match self.post_by_message(t, p) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => {
                        self.posted_refused.get_or_insert(e);
                    }
                    Poll::Pending => break,
                }
                done += 1;
            }
            done
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
        match self.op_step(t, index, gen, None) {
            Poll::Ready(Ok(())) => {
                self.detach_op(index, gen);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => {
                let _ = self.finish_op(index);
                Poll::Ready(Err(e))
            }
            Poll::Pending => {
                let _ = self.finish_op(index);
                Poll::Pending
            }
        }
    }

    /// Posted atomics sent as messages ([`Endpoint::atomic_post`]) still waiting for their
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
