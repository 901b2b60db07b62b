//! The barrier: a dissemination barrier over system messages.

use std::task::{ready, Poll};

use super::state::{BarrierAt, Endpoint};
use crate::error::AmError;
use crate::handler::Threading;
use crate::protocol::SystemMsg;
use crate::transport::Transport;

impl<H: Threading> Endpoint<H> {
    /// A step of a barrier ([`crate::Node::barrier`]): a dissemination barrier, ⌈log2 N⌉
    /// rounds of one request each. The first step of a barrier starts it; steps after an
    /// error resume it where it stopped (the other ranks are still in it), sending nothing
    /// twice. Ready once every rank has entered this barrier. A barrier starts once this
    /// rank's posted atomics are applied and those sent as messages answered, so every rank
    /// leaving it sees them.
    pub fn barrier_step(&mut self, t: &mut (impl Transport + ?Sized)) -> Poll<Result<(), AmError>> {
        let mut at = match self.barrier {
            Some(at) => at,
            None => {
                // What this rank posted is applied at its targets before it enters: posted
                // atomics sent as messages must have been answered, since a barrier
                // message to a third rank may overtake one.
                ready!(self.apply_posted(t))?;
                if self.detached_in_flight > 0 {
                    return Poll::Pending;
                }
                let epoch = self.barrier_epoch;
                self.barrier_epoch += 1;
                BarrierAt {
                    epoch,
                    round: 0,
                    sent: false,
                }
            }
        };
        let size = self.size;
        let result = loop {
            let Some(distance) = 1u32.checked_shl(u32::from(at.round)).filter(|&d| d < size) else {
                self.barrier = None;
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
