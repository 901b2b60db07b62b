//! The state of a collective in segment 0 in flight ([`super`]), kept in the endpoint's
//! teams.

use crate::error::AmError;
use crate::reduce::Reduction;
use crate::team::{Team, TeamId};

/// Which collective.
#[derive(Debug, Clone)]
pub(in crate::endpoint) enum What {
    Broadcast { root: u32 },
    AllReduce { red: Reduction },
}

impl What {
    /// The words every member must agree on: which collective, its root, its reduction.
    pub(super) fn words(&self) -> [u64; 3] {
        match self {
            What::Broadcast { root } => [1, u64::from(*root), 0],
            What::AllReduce { red } => [2, 0, u64::from(red.word())],
        }
    }
}

/// Where a collective in segment 0 is.
#[derive(Debug)]
pub(in crate::endpoint) enum Part {
    /// The agreement, in operation slot `(index, gen)`.
    Agree(u32, u32),
    /// Agreed: every member's source and destination offsets, in team order. The direct
    /// move goes on from `next` (an all-reduce's chunk of this member's block; the bytes
    /// of a broadcast copied so far), or the engine's collective is still to start.
    Move {
        srcs: Vec<usize>,
        dests: Vec<usize>,
        next: usize,
        /// An all-reduce's chunk `next`, reduced and written into some members'
        /// destinations when the NIC was busy: the rest get these bytes, since a
        /// destination written may be a source (in place) that must not be reduced again.
        held: Option<Held>,
    },
    /// The engine's broadcast or all-reduce of the source's bytes, whose result goes into
    /// the destination.
    Engine(u32, u32),
    /// The all-reduce of every member's status after a direct move.
    Status(u32, u32),
}

/// A direct all-reduce's chunk part-way through its writes.
pub(in crate::endpoint) struct Held {
    /// The chunk's result.
    pub(super) acc: Vec<u8>,
    /// How many members' destinations (in team order) have it.
    pub(super) written: usize,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Held({} bytes, {} written)",
            self.acc.len(),
            self.written
        )
    }
}

/// A collective in segment 0 in flight.
#[derive(Debug)]
pub(in crate::endpoint) struct InSegment {
    /// The operation's own slot, completed when the last part completes.
    pub(super) index: u32,
    pub(super) gen: u32,
    pub(super) team: Team,
    pub(super) what: What,
    pub(super) src: usize,
    pub(super) dest: usize,
    pub(super) len: usize,
    pub(super) part: Part,
    /// What this member's direct move met, reported once the status after it completes.
    pub(super) failed: Option<AmError>,
}

impl InSegment {
    /// Whether the team's later collectives must wait to start: its last collective has
    /// not started yet.
    pub(super) fn gates(&self, id: TeamId) -> bool {
        self.team.id() == id && !matches!(self.part, Part::Engine(..) | Part::Status(..))
    }
}
