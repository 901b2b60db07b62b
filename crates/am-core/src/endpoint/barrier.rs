//! The barrier: a dissemination barrier over system messages.

use std::task::{ready, Poll};

use super::state::{BarrierAt, Endpoint};
use crate::error::AmError;
use crate::handler::Threading;
use crate::op::{Op, Raw, State};
use crate::protocol::SystemMsg;
use crate::transport::Transport;

impl<H: Threading> Endpoint<H> {
    /// Starts a barrier ([`crate::endpoint::start::Barrier`]): its handle, which
    /// [`Endpoint::poll_op`] completes. A barrier starts once this rank's posted atomics are
    /// applied and those sent as messages answered, so every rank leaving it sees them, and once
    /// the barrier before it is left (a handle dropped does not stop that one: it is carried on
    /// here). A barrier whose completion returned an error is resumed instead, sending nothing
    /// twice.
    pub fn barrier_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        if let Some(at) = self.barrier {
            if self.barrier_failed {
                self.barrier_failed = false;
                return Poll::Ready(Ok(Op::new(State::Barrier {
                    epoch: at.epoch,
                    table: self.orphans.clone(),
                })));
            }
            ready!(self.barrier_step(t))?;
        }
        // What this rank posted is applied at its targets before it enters: posted atomics
        // sent as messages must have been answered, since a barrier message to a third rank
        // may overtake one.
        ready!(self.apply_posted(t))?;
        if self.detached_in_flight > 0 {
            return Poll::Pending;
        }
        let epoch = self.barrier_epoch;
        self.barrier_epoch += 1;
        self.barrier = Some(BarrierAt {
            epoch,
            round: 0,
            sent: false,
        });
        // Entered now: its first round goes out if a credit allows.
        Poll::Ready(match self.barrier_step(t) {
            Poll::Ready(Ok(())) => Ok(Op::ready(Raw::Unit)),
            Poll::Ready(Err(e)) => {
                self.barrier_failed = true;
                Err(e)
            }
            Poll::Pending => Ok(Op::new(State::Barrier {
                epoch,
                table: self.orphans.clone(),
            })),
        })
    }

    /// A step of the barrier in progress, if any: a dissemination barrier, ⌈log2 N⌉ rounds
    /// of one request each; steps after an error resume it where it stopped. Ready once every
    /// rank has entered it (or with none in progress).
    pub(crate) fn barrier_step(
        &mut self,
        t: &mut (impl Transport + ?Sized),
    ) -> Poll<Result<(), AmError>> {
        let Some(mut at) = self.barrier else {
            return Poll::Ready(Ok(()));
        };
        let size = self.size;
        let result = loop {
            let Some(distance) = 1u32.checked_shl(u32::from(at.round)).filter(|&d| d < size) else {
                self.barrier = None;
                self.barriers_done = at.epoch + 1;
                // The last round's message may be held back to pack: the caller may not poll
                // again for a while, and the others wait for it.
                t.flush();
                return Poll::Ready(Ok(()));
            };
            let key = (at.epoch, at.round);
            if !at.sent {
                let to = (self.rank + distance) % size;
                let msg = SystemMsg::Barrier {
                    epoch: at.epoch,
                    round: at.round,
                };
                match self.system_step(t, to, msg, &[], None) {
                    Poll::Ready(Ok(())) => at.sent = true,
                    other => break other,
                }
            }
            // Nothing arrived yet is the usual case of a rank that waits (polling) while it
            // is sent to: no hash then.
            let arrived = if self.barrier_arrivals.is_empty() {
                None
            } else {
                self.barrier_arrivals.get_mut(&key)
            };
            match arrived {
                Some(n) => {
                    *n -= 1;
                    if *n == 0 {
                        self.barrier_arrivals.remove(&key);
                    }
                    at.round += 1;
                    at.sent = false;
                }
                // This round's arrival comes from the rank `distance` before us.
                None => {
                    let from = (self.rank + size - distance % size) % size;
                    break self.waiting_for(from).map(Err);
                }
            }
        };
        self.barrier = Some(at);
        result
    }
}
