//! Credit-based flow control: how many requests a rank may have outstanding to each peer.
//!
//! A request takes one credit; its reply (explicit, or the implicit empty one the core sends when
//! a handler does not reply) carries a credit byte back. Because every request has receive space
//! reserved at its target, no message is ever dropped for lack of space: a sender out of credit
//! polls (blocking API) or gets [`crate::TryRequestError::WouldBlock`] (`try_` API).
//!
//! The policy is pluggable. [`StaticCredits`] gives every peer the same fixed number; a dynamic
//! policy can steer credits by using the credit byte: the requester's hint on requests, and the
//! number of credits granted back on replies (1 returns the one used, 0 withholds it, more lends).

use crate::Rank;

/// A flow-control policy. The core calls it on every request and reply.
pub trait CreditPolicy {
    /// Takes one credit for a request to `peer`; `false` if there is none.
    fn try_acquire(&mut self, peer: Rank) -> bool;
    /// Gives back a credit taken by [`CreditPolicy::try_acquire`] whose request was not sent.
    fn cancel(&mut self, peer: Rank);
    /// A reply from `peer` arrived carrying credit byte `granted`. Returns `false` if no request
    /// to `peer` was outstanding (the peer misbehaved); the state is then unchanged.
    fn on_reply(&mut self, peer: Rank, granted: u8) -> bool;
    /// The credit byte for a request to `peer`.
    fn request_hint(&mut self, peer: Rank) -> u8 {
        let _ = peer;
        0
    }
    /// Target side: the credit byte to put on the reply to a request from `peer` that carried
    /// `hint`. The default returns the one credit the request used.
    fn reply_grant(&mut self, peer: Rank, hint: u8) -> u8 {
        let _ = (peer, hint);
        1
    }
    /// Credits available now for requests to `peer`.
    fn available(&self, peer: Rank) -> u32;
    /// Requests to `peer` whose reply has not arrived.
    fn outstanding(&self, peer: Rank) -> u32;
}

/// The same fixed number of credits for every peer (GASNet's static partitioning).
#[derive(Debug, Clone)]
pub struct StaticCredits {
    available: Vec<u32>,
    outstanding: Vec<u32>,
}

impl StaticCredits {
    /// `per_peer` credits toward each of `ranks` ranks (self included).
    ///
    /// # Panics
    /// If `per_peer` is 0 or above 255 (the reply's credit byte must be able to return them).
    pub fn new(ranks: u32, per_peer: u32) -> Self {
        assert!(
            (1..=255).contains(&per_peer),
            "credits per peer must be in 1..=255, got {per_peer}"
        );
        StaticCredits {
            available: vec![per_peer; ranks as usize],
            outstanding: vec![0; ranks as usize],
        }
    }
}

impl CreditPolicy for StaticCredits {
    #[inline]
    fn try_acquire(&mut self, peer: Rank) -> bool {
        let a = &mut self.available[peer as usize];
        if *a == 0 {
            return false;
        }
        *a -= 1;
        self.outstanding[peer as usize] += 1;
        true
    }

    #[inline]
    fn cancel(&mut self, peer: Rank) {
        self.available[peer as usize] += 1;
        self.outstanding[peer as usize] -= 1;
    }

    #[inline]
    fn on_reply(&mut self, peer: Rank, granted: u8) -> bool {
        let o = &mut self.outstanding[peer as usize];
        if *o == 0 {
            return false;
        }
        *o -= 1;
        self.available[peer as usize] += granted as u32;
        true
    }

    fn available(&self, peer: Rank) -> u32 {
        self.available[peer as usize]
    }

    fn outstanding(&self, peer: Rank) -> u32 {
        self.outstanding[peer as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(u32),
        Cancel(u32),
        Reply(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..3).prop_map(Op::Acquire),
            (0u32..3).prop_map(Op::Cancel),
            (0u32..3).prop_map(Op::Reply),
        ]
    }

    proptest! {
        // Against a reference model: credits are conserved, never negative, and a reply with
        // nothing outstanding is refused without changing anything.
        #[test]
        fn static_credits_match_model(per_peer in 1u32..5, ops in proptest::collection::vec(op(), 0..200)) {
            let mut policy = StaticCredits::new(3, per_peer);
            let mut in_flight = [0u32; 3];
            for op in ops {
                match op {
                    Op::Acquire(p) => {
                        let ok = policy.try_acquire(p);
                        prop_assert_eq!(ok, in_flight[p as usize] < per_peer);
                        if ok { in_flight[p as usize] += 1; }
                    }
                    Op::Cancel(p) => {
                        if in_flight[p as usize] > 0 {
                            policy.cancel(p);
                            in_flight[p as usize] -= 1;
                        }
                    }
                    Op::Reply(p) => {
                        let ok = policy.on_reply(p, 1);
                        prop_assert_eq!(ok, in_flight[p as usize] > 0);
                        if ok { in_flight[p as usize] -= 1; }
                    }
                }
                for p in 0..3u32 {
                    prop_assert_eq!(policy.outstanding(p), in_flight[p as usize]);
                    prop_assert_eq!(policy.available(p) + policy.outstanding(p), per_peer);
                }
            }
        }
    }
}
