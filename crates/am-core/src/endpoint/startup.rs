//! Start-up: every rank tells rank 0 its handler table and segment size, rank 0 tells everyone
//! whether they agree.

use std::task::Poll;

use super::state::{Endpoint, Startup};
use crate::error::StartError;
use crate::handler::Threading;
use crate::protocol::{HelloVerdict, SystemMsg};
use crate::transport::Tx;
use crate::types::HandlerId;

impl<H: Threading> Endpoint<H> {
    /// A step of start-up (collective; [`crate::Node::new`]): every rank tells rank 0 its
    /// handler table and segment size, rank 0 tells everyone whether they agree. Ready with
    /// the verdict; a mismatch is reported on every rank. No user request may be sent
    /// before it is ready with `Ok`.
    pub fn start_step(&mut self, tx: &mut (impl Tx + ?Sized)) -> Poll<Result<(), StartError>> {
        loop {
            match self.startup {
                Startup::SendHello => {
                    let hello = SystemMsg::Hello {
                        digest: self.hello_digest,
                        segment_len: self.seg_len as u64,
                    };
                    // The entries up to the highest registered id, as many as a Medium
                    // carries.
                    let sig = &self.hello_signature;
                    let used = sig.iter().rposition(|&h| h != 0).map_or(0, |i| i + 1);
                    let signature: Vec<u8> = sig[..used.min(self.limits.max_medium / 2)]
                        .iter()
                        .flat_map(|h| h.to_le_bytes())
                        .collect();
                    match self.system_step(tx, 0, hello, &signature, None) {
                        Poll::Ready(Ok(())) => self.startup = Startup::AwaitVerdict,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Startup::AwaitVerdict => match self.hello.result {
                    Some(v) => self.startup = Startup::Done(v),
                    None => return self.waiting_for(0).map(|e| Err(e.into())),
                },
                Startup::Collect => {
                    if self.hello.received < self.size - 1 {
                        // A rank that has not said hello and is gone will never say it.
                        return match (1..self.size).find(|&r| self.is_gone(r)) {
                            Some(r) => self.waiting_for(r).map(|e| Err(e.into())),
                            None => Poll::Pending,
                        };
                    }
                    let verdict = self.hello.mismatch.unwrap_or(HelloVerdict::Ok);
                    self.startup = Startup::Verdicts { next: 1, verdict };
                }
                Startup::Verdicts { next, verdict } => {
                    if next == self.size {
                        self.startup = match verdict {
                            HelloVerdict::Ok => Startup::CreditsHome,
                            v => Startup::Done(v),
                        };
                        continue;
                    }
                    match self.system_step(tx, next, SystemMsg::HelloVerdict(verdict), &[], None) {
                        Poll::Ready(Ok(())) => {
                            self.startup = Startup::Verdicts {
                                next: next + 1,
                                verdict,
                            }
                        }
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Startup::CreditsHome => {
                    // Start-up ends with every credit home: the verdicts' implicit replies.
                    if !self.is_quiet() {
                        return Poll::Pending;
                    }
                    self.startup = Startup::Done(HelloVerdict::Ok);
                }
                Startup::Done(verdict) => {
                    return Poll::Ready(match verdict {
                        HelloVerdict::Ok => Ok(()),
                        HelloVerdict::SegmentMismatch { rank, ours, theirs } => {
                            Err(StartError::SegmentSizeMismatch { rank, ours, theirs })
                        }
                        HelloVerdict::TableMismatch {
                            rank,
                            ours,
                            theirs,
                            handler,
                        } => Err(StartError::HandlerTableMismatch {
                            rank,
                            ours,
                            theirs,
                            handler: handler.map(HandlerId),
                        }),
                    })
                }
            }
        }
    }
}
