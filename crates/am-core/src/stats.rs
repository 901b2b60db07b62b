//! What a node counts that a user or a test may want to read: [`Stats`] ([`crate::Node::stats`])
//! and the NIC's part of it, [`NicStats`] ([`crate::Transport::stats`]).

/// Counters of a node since it started ([`crate::Node::stats`]): what it discarded, what
/// flow control held back, what the NIC sent again. Each is a count of events, never reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Answers to calls nobody waits for any more (the handle was dropped, the call failed
    /// when its peer was lost, the node closed): discarded as they came.
    pub late_answers: u64,
    /// Send attempts that found no credit for their target: each waited (a blocking send),
    /// or returned `WouldBlock` (a `try_` send), and nothing was lost.
    pub credit_waits: u64,
    /// Send attempts the NIC refused for lack of room (a ring, bank, mailbox or event queue
    /// full), each made again later: those the core saw, and those the NIC retried itself
    /// ([`NicStats::refused`]).
    pub refused: u64,
    /// Messages or fragments the NIC sent again after a loss ([`NicStats::retransmissions`];
    /// 0 on a NIC that loses nothing).
    pub retransmissions: u64,
    /// Typed values and answers this rank sent by rendezvous, from its staging segment
    /// ([`crate::typed`]); the others larger than a Medium went in parts.
    pub typed_staged: u64,
}

/// What a NIC counts of its own ([`crate::Transport::stats`]); the default counts nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NicStats {
    /// Sends the NIC refused for lack of room and retried itself, out of the core's sight
    /// (a refusal it returns as `Busy` the core counts already).
    pub refused: u64,
    /// Messages or fragments sent again after a loss (udp's retransmitted fragments).
    pub retransmissions: u64,
}

impl NicStats {
    /// A NIC's counters, for a transport outside this crate (the struct grows, so it has no
    /// public literal).
    pub fn new(refused: u64, retransmissions: u64) -> NicStats {
        NicStats {
            refused,
            retransmissions,
        }
    }
}
