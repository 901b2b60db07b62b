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
                    let payload = hello_payload(
                        &self.hello_signature,
                        &self.hello_typed,
                        self.limits.max_medium,
                    );
                    match self.system_step(tx, 0, hello, &payload, None) {
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
                        HelloVerdict::TypedMismatch { rank, ours, theirs } => {
                            let name = |id: Option<u64>| {
                                id.and_then(|id| self.handlers.typed.get(&id)).copied()
                            };
                            Err(StartError::TypedMismatch {
                                rank,
                                name: name(ours).or(name(theirs)),
                            })
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

/// A hello's payload: the signature's entries up to the highest registered id, then the
/// typed messages' count and ids, as many as a Medium of `max` bytes carries (a difference
/// beyond what it carries goes unnamed).
fn hello_payload(sig: &[u16; 256], typed: &[u64], max: usize) -> Vec<u8> {
    let used = sig.iter().rposition(|&h| h != 0).map_or(0, |i| i + 1);
    let used = used.min(max.saturating_sub(6) / 2);
    let mut out = Vec::with_capacity(max.min(6 + 2 * used + 8 * typed.len()));
    out.extend_from_slice(&(used as u16).to_le_bytes());
    out.extend(sig[..used].iter().flat_map(|h| h.to_le_bytes()));
    out.extend_from_slice(&(typed.len() as u32).to_le_bytes());
    let room = max.saturating_sub(out.len()) / 8;
    out.extend(typed.iter().take(room).flat_map(|id| id.to_le_bytes()));
    out
}

/// A hello's payload read back: the signature's entries and the typed ids it carries, with
/// whether those are all of the sender's; `None` if it is not one.
pub(super) fn parse_hello(b: &[u8]) -> Option<(Vec<u16>, Vec<u64>, bool)> {
    let (n, rest) = b.split_first_chunk::<2>()?;
    let n = usize::from(u16::from_le_bytes(*n));
    if 2 * n > crate::protocol::HELLO_SIGNATURE_LEN {
        return None;
    }
    let (sig, rest) = rest.split_at_checked(2 * n)?;
    let (m, ids) = rest.split_first_chunk::<4>()?;
    let m = u32::from_le_bytes(*m) as usize;
    if ids.len() % 8 != 0 || ids.len() / 8 > m {
        return None;
    }
    let sig = sig
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect();
    let ids: Vec<u64> = ids
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
        .collect();
    let whole = ids.len() == m;
    Some((sig, ids, whole))
}
