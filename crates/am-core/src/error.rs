//! Errors of the AM core. Each says who is at fault: the caller (a wrong argument), a peer
//! (it broke the protocol), or the job (a peer died, the transport failed).

use std::fmt;
use std::sync::Arc;

use crate::team::TeamId;
use crate::types::{AmKind, Category, HandlerId, Rank, Route};
use crate::wire::WireError;

/// An error from an AM operation (request, reply, poll, put/get, barrier).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AmError {
    /// The rank is not part of the job.
    #[error("rank {rank} is outside the job (size {size})")]
    InvalidRank {
        /// The rank asked for.
        rank: Rank,
        /// The job size.
        size: u32,
    },
    /// More than 16 arguments.
    #[error("{0} arguments given, at most 16 allowed")]
    TooManyArgs(usize),
    /// A payload larger than the transport's limit for this kind.
    #[error("{kind:?} payload of {len} bytes exceeds the transport's limit of {max}")]
    PayloadTooLarge {
        /// Medium or Long.
        kind: AmKind,
        /// Bytes given.
        len: usize,
        /// The limit (`max_medium` or `max_long`).
        max: usize,
    },
    /// An access outside the registered segment.
    #[error("segment access [{offset}, {offset}+{len}) is outside the {size}-byte segment")]
    SegmentOutOfBounds {
        /// Offset asked for.
        offset: u64,
        /// Bytes asked for.
        len: u64,
        /// The segment's size.
        size: usize,
    },
    /// An access through a block reaches past the block: a symmetric block
    /// ([`crate::symmetric::Symmetric::on`], [`crate::symmetric::Symmetric::at`],
    /// [`crate::symmetric::Symmetric::range`]) or a range of a published segment
    /// ([`crate::segment::RemoteSegment::range`]). Nothing was done. The block is
    /// `block_len` bytes at `block_offset` of segment `segment` (of `rank`, where the access
    /// names a rank); `offset` and `len` are the range asked for, from the block's start.
    /// (A plain offset, as [`crate::Node::put`] takes, names no block: only the segment's
    /// end bounds it, [`AmError::SegmentOutOfBounds`].)
    ///
    /// Boxed, so that every result carrying an `AmError` stays as small as before it.
    #[error("{0}")]
    OutOfBlock(Box<BlockBounds>),
    /// A remote atomic's word is not aligned to its width.
    #[error("atomic on offset {offset}: not aligned to its {align}-byte word")]
    Misaligned {
        /// Offset asked for.
        offset: u64,
        /// The word's width (its alignment).
        align: usize,
    },
    /// The handler id is not registered with this category and kind.
    #[error("handler {handler:?} is not registered as a {category:?} {kind:?} handler")]
    NotRegistered {
        /// The id used.
        handler: HandlerId,
        /// What the call needed.
        category: Category,
        /// What the call needed.
        kind: AmKind,
    },
    /// The node was closed ([`crate::Node::close`], [`crate::AsyncNode::close`]): what was
    /// still in flight, and everything started after, fails with this.
    #[error("the node was closed")]
    NodeClosed,
    /// A typed message ([`crate::typed`]) was refused by its target, or its answer did not
    /// decode: nothing ran at the target, except for an answer that did not decode.
    #[error("rank {peer} refused a typed message: {reason}")]
    TypedRefused {
        /// The target.
        peer: Rank,
        /// What went wrong.
        reason: crate::typed::Refusal,
    },
    /// A typed message whose type this rank does not register ([`crate::Handlers::typed`]):
    /// every rank registers the same types, so the target would not know it either.
    #[error("typed message {0} is not registered here: register it with `Handlers::typed`")]
    TypedNotRegistered(&'static str),
    /// A typed message or answer larger than [`crate::typed::MAX_LEN`] encoded.
    #[error("typed value of {len} bytes is larger than the largest typed value ({max})")]
    TypedTooLarge {
        /// Its encoded length.
        len: usize,
        /// The largest typed value.
        max: usize,
    },
    /// A typed message's value could not be written in the wire format: a sequence or map
    /// whose length serde does not know in advance, or its `Serialize` impl's own error.
    #[error("typed message {name} could not be encoded: {reason}")]
    TypedUnencodable {
        /// The value's type.
        name: &'static str,
        /// The encoder's error.
        reason: String,
    },
    /// A call named a handler that was not registered with `Handlers::callable`.
    #[error("handler {0:?} is not callable: register it with `Handlers::callable` to call it")]
    NotCallable(HandlerId),
    /// A peer broke the protocol. The offending message was dropped; the job can go on.
    #[error("rank {peer} misbehaved: {what}")]
    PeerMisbehaved {
        /// The sender.
        peer: Rank,
        /// What it did.
        what: Misbehavior,
    },
    /// A peer is gone (died or left); operations involving it fail.
    #[error("rank {0} was lost")]
    PeerLost(Rank),
    /// A peer left the job cleanly (its program ended), and this call waited for something
    /// only it could send (a barrier arrival, a credit, a put's or get's reply).
    #[error("rank {0} has left the job, and this call waited for it")]
    PeerDeparted(Rank),
    /// The job is being torn down (a rank panicked or aborted).
    #[error("the job was aborted")]
    JobAborted,
    /// The operation handle does not belong to a pending operation.
    #[error("unknown or already completed operation handle")]
    StaleHandle,
    /// The operation handle was made by another node (another endpoint: another rank's, or
    /// another of this process's endpoints): only the node that started an operation waits
    /// for it or tests it ([`crate::op`]). A wait that refuses it drops the handle, so the
    /// operation completes detached on its own node; a test leaves it to the caller.
    #[error("the operation was started on another node: wait for it or test it on the node that started it")]
    ForeignHandle,
    /// Another failure of the NIC (its error, and what caused it, as the source).
    #[error(transparent)]
    Transport(TransportError),
    /// A collective named a team this node does not have (a [`crate::team::Team`] of
    /// another node).
    #[error("team {0} is not one of this node's")]
    UnknownTeam(TeamId),
    /// The members of `team` disagree on a collective: they started different collectives
    /// under the same sequence number (a barrier where this rank started an all-gather), or
    /// gave another root, length, element type or reduction. `what` says which, with both
    /// values: `peer`'s, and `agrees`'s. Every collective on a team must be started by every
    /// member, in the same order, with the same root, sizes and reduction. The member that
    /// finds the disagreement tells the others, with both values: the collective fails on
    /// every member still in it, and every later one on the team fails with this error on
    /// every member.
    ///
    /// # Which rank is named
    /// Each member names the rank that differs from *its own* values, against the
    /// lowest-ranked member it knows to agree with it:
    ///
    /// - `agrees` is the lowest-ranked member known here to hold this member's value of
    ///   what differs (this member itself, if it knows of no lower one), and `peer` a member
    ///   that holds another value.
    /// - The member that finds the disagreement knows its own value and the one that came
    ///   from `peer`: it names `peer` and itself. A member told of it (the finder's rank and
    ///   value, and `peer`'s) compares them with its own collective of that sequence: if it
    ///   holds `peer`'s value it names the finder as the one that differs, against the lower
    ///   of `peer` and itself; if it holds the finder's, it names `peer`, against the lower
    ///   of the finder and itself; if neither, or if it has not started that collective
    ///   yet (or the lengths are of steps it cannot compare), it repeats the finder's
    ///   words.
    /// - In a collective in segment 0 ([`crate::Node::team_all_reduce_in_segment`]) every
    ///   member sees every member's arguments: `peer` is the lowest-ranked member whose
    ///   arguments differ from this member's, `agrees` the lowest-ranked that holds them.
    ///
    /// So where rank 0 passes 2 elements and ranks 1 to 3 pass 1, ranks 1 to 3 are told
    /// that rank 0 differs from rank 1 (8 bytes against 4), and rank 0 that rank 1 differs
    /// from it (4 bytes against 8): every member learns both values, and the members that
    /// agree with each other name the one that does not.
    #[error("{}", mismatch_words(*team, *peer, *agrees, what))]
    CollectiveMismatch {
        /// The team.
        team: TeamId,
        /// The member whose values differ from this member's (see above).
        peer: Rank,
        /// The lowest-ranked member known here to hold this member's values (this member,
        /// if none lower is known).
        agrees: Rank,
        /// What differs, with `peer`'s value and `agrees`'s (boxed, so that every result
        /// carrying an `AmError` stays as small as before it).
        what: Box<Disagreement>,
    },
    /// A member of `team` could not do its part of a collective in segment 0
    /// ([`crate::endpoint::start::TeamAllReduceInSegment`],
    /// [`crate::endpoint::start::TeamBroadcastInSegment`]):
    /// one of the puts or gets that move its share failed (its NIC refused it). In an
    /// all-reduce every member's destination then lacks `peer`'s block of the result; in a
    /// broadcast `peer`'s own destination lacks the root's bytes. The collective fails on
    /// every member, so that none goes on as if it had succeeded: each member whose own
    /// part failed gets its own error, every other one this. (Where `peer` was lost or
    /// departed, the collective fails with [`AmError::PeerLost`] or
    /// [`AmError::PeerDeparted`] instead.)
    #[error("rank {peer} could not do its part of the collective on team {team}")]
    MemberFailed {
        /// The team.
        team: TeamId,
        /// The member whose part failed (the highest in team order, where several did).
        peer: Rank,
    },
    /// A collective's arguments no member could match: a root outside the team, a bitwise
    /// reduction over a floating-point type, data given by a member that is not a
    /// broadcast's root.
    #[error("invalid collective: {0}")]
    InvalidCollective(&'static str),
    /// An atomic no word could take: a bitwise operation (and, or, xor) on a float.
    #[error("invalid atomic: {0}")]
    InvalidAtomic(&'static str),
    /// A strided or indexed transfer whose regions do not describe its data: lengths that
    /// do not add up to the data's, a block of 0 bytes, data not a whole number of blocks.
    #[error("invalid regions: {0}")]
    InvalidRegions(&'static str),
    /// No range of the symmetric heap fits a block of `len` bytes on every member of the
    /// team ([`crate::Node::alloc_symmetric`]); the same error on every member. The heap has
    /// `size` bytes (`AM_SYMMETRIC_SIZE`, [`crate::Config::symmetric_size`]).
    #[error("no room for {len} bytes in the symmetric heap of {size} bytes on every member (AM_SYMMETRIC_SIZE)")]
    OutOfSymmetricHeap {
        /// The bytes asked for.
        len: usize,
        /// This member's heap.
        size: usize,
    },
    /// The members of a team have symmetric heaps of different sizes (`AM_SYMMETRIC_SIZE`
    /// or [`crate::Config::symmetric_size`] differ): no allocation on it succeeds, on any
    /// member.
    #[error("the team's symmetric heaps differ: {smallest} to {largest} bytes")]
    SymmetricHeapMismatch {
        /// The smallest member heap.
        smallest: u64,
        /// The largest.
        largest: u64,
    },
    /// A free of a block that is not allocated here ([`crate::Node::free_symmetric`]):
    /// freed already, or of another node.
    #[error("the symmetric block at {offset} ({len} bytes) is not allocated here")]
    NotSymmetric {
        /// The block's offset.
        offset: usize,
        /// Its length.
        len: usize,
    },
    /// `rank` holds no segment `id` that this rank may use ([`crate::segment`]): it was
    /// never published here, it was freed, or `rank` refused the operation because it freed
    /// the segment while the operation was on its way (a put over messages may have written
    /// its first pieces); or, from a publication or free, member `rank` named a segment it
    /// does not hold.
    #[error("rank {rank} has no segment {id} published here")]
    UnknownSegment {
        /// The segment's owner.
        rank: Rank,
        /// Its id there.
        id: crate::types::SegmentId,
    },
    /// A segment could not be created ([`crate::Node::create_segment`]): no memory, no
    /// file descriptor, or every id of the endpoint used.
    #[error("a segment of {len} bytes could not be created: {why}")]
    SegmentNotCreated {
        /// The bytes asked for.
        len: usize,
        /// What failed.
        why: String,
    },
    /// An async driver of [`crate::AsyncNode`] (its tokio `drive` and `run`, and their
    /// spinning kin) was started where it cannot run: no tokio runtime, or one built without
    /// what the driver needs ([`RuntimeError`]).
    #[error(transparent)]
    Runtime(RuntimeError),
}

/// An access through a block that reaches past the block ([`AmError::OutOfBlock`]): the
/// block is `block_len` bytes at `block_offset` of segment `segment` (of `rank`, where the
/// access names a rank); `offset` and `len` are the range asked for, from the block's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockBounds {
    /// The block's owner, where the access names one.
    pub rank: Option<Rank>,
    /// The segment the block is in (segment 0 for a symmetric block).
    pub segment: crate::types::SegmentId,
    /// Where the block starts in its segment.
    pub block_offset: usize,
    /// The block's length.
    pub block_len: usize,
    /// The offset asked for, from the block's start.
    pub offset: u64,
    /// The bytes asked for.
    pub len: u64,
}

impl std::fmt::Display for BlockBounds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let BlockBounds {
            rank,
            segment,
            block_offset,
            block_len,
            offset,
            len,
        } = self;
        write!(
            f,
            "[{offset}, {offset}+{len}) is outside the {block_len}-byte block at offset \
             {block_offset} of "
        )?;
        if let Some(r) = rank {
            write!(f, "rank {r}'s ")?;
        }
        write!(f, "segment {segment}")
    }
}

/// What the members of a team disagree on in a collective
/// ([`AmError::CollectiveMismatch`]): each variant holds the value of the member that differs
/// (`peer`) and of the member that agrees with the one reporting (`agrees`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Disagreement {
    /// They started different collectives under the same sequence number.
    Kind {
        /// The collective `peer` started ("barrier", "all-gather", "all-reduce", ...).
        peer: &'static str,
        /// The one `agrees` started.
        agrees: &'static str,
    },
    /// They gave different roots (team ranks).
    Root {
        /// `peer`'s root.
        peer: u32,
        /// `agrees`'s root.
        agrees: u32,
    },
    /// They gave different lengths: the bytes of a step of the collective (a block, a
    /// vector, or the part of one a step carries), or of a collective in segment 0.
    Length {
        /// `peer`'s bytes.
        peer: u64,
        /// `agrees`'s bytes.
        agrees: u64,
    },
    /// Their lengths cut into different numbers of chunks (`max_medium` bytes each): they
    /// gave different lengths.
    Chunks {
        /// The chunks `peer` had left from the chunk that disagreed.
        peer: u32,
        /// The chunks `agrees` had left.
        agrees: u32,
    },
    /// They reduced different element types.
    ElementType {
        /// `peer`'s element type ("u32", "f64", ...).
        peer: &'static str,
        /// `agrees`'s.
        agrees: &'static str,
    },
    /// They gave different reductions (`None`: no reduction).
    Operation {
        /// `peer`'s.
        peer: Option<crate::types::ReduceOp>,
        /// `agrees`'s.
        agrees: Option<crate::types::ReduceOp>,
    },
    /// They chose different all-reduce algorithms (`Config::all_reduce`, or its `Auto`
    /// choice by length: which differs where the lengths do).
    Algorithm {
        /// `peer`'s ("recursive doubling" or "ring").
        peer: &'static str,
        /// `agrees`'s.
        agrees: &'static str,
    },
    /// The same step of the collective came from two members, and the steps do not say
    /// what differs.
    Steps,
}

/// The words of [`AmError::CollectiveMismatch`].
fn mismatch_words(team: TeamId, peer: Rank, agrees: Rank, what: &Disagreement) -> String {
    let on = format!("collective mismatch on team {team}");
    match *what {
        Disagreement::Kind { peer: p, agrees: a } => {
            format!("{on}: rank {peer} started a {p} where rank {agrees} started a {a}")
        }
        Disagreement::Root { peer: p, agrees: a } => {
            format!("{on}: rank {peer} gave root {p} where rank {agrees} gave root {a}")
        }
        Disagreement::Length { peer: p, agrees: a } => format!(
            "{on}: rank {peer} gave a length of {p} bytes where rank {agrees} gave {a} bytes"
        ),
        Disagreement::Chunks { peer: p, agrees: a } => format!(
            "{on}: rank {peer} gave another length than rank {agrees} ({p} chunks left against {a})"
        ),
        Disagreement::ElementType { peer: p, agrees: a } => format!(
            "{on}: rank {peer} reduced elements of {p} where rank {agrees} reduced {a}"
        ),
        Disagreement::Operation { peer: p, agrees: a } => {
            let name = |o: Option<crate::types::ReduceOp>| match o {
                Some(o) => format!("{o:?}"),
                None => "no reduction".to_owned(),
            };
            format!(
                "{on}: rank {peer} gave operation {} where rank {agrees} gave {}",
                name(p),
                name(a)
            )
        }
        Disagreement::Algorithm { peer: p, agrees: a } => format!(
            "{on}: rank {peer} ran the {p} all-reduce where rank {agrees} ran the {a} one (`Config::all_reduce`, or lengths that differ)"
        ),
        Disagreement::Steps => format!(
            "{on}: rank {peer} started another collective than rank {agrees} under the same sequence"
        ),
    }
}

/// What the tokio runtime an [`crate::AsyncNode`] driver was started on lacks
/// ([`AmError::Runtime`]): the driver sleeps on the node's wake descriptor in the runtime's
/// I/O driver, with its timers as the sleep's bound. A runtime built by
/// `tokio::runtime::Builder::new_current_thread().enable_all()` (what `#[tokio::main]`
/// builds) has both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The driver was polled outside a tokio runtime.
    #[error(
        "AsyncNode's tokio driver must run inside a tokio runtime, and none is running here: \
         await it in a task of one (`#[tokio::main]`, `Runtime::block_on`)"
    )]
    NoRuntime,
    /// The runtime was built without its I/O driver.
    #[error(
        "the tokio runtime has I/O disabled, and AsyncNode's driver sleeps on the node's wake \
         descriptor there: build the runtime with `enable_io()` or `enable_all()` \
         (`tokio::runtime::Builder::new_current_thread().enable_all().build()`)"
    )]
    IoDisabled,
    /// The runtime was built without its timers.
    #[error(
        "the tokio runtime has timers disabled, and AsyncNode's driver bounds its sleeps with \
         them: build the runtime with `enable_time()` or `enable_all()` \
         (`tokio::runtime::Builder::new_current_thread().enable_all().build()`)"
    )]
    TimeDisabled,
}

/// What a misbehaving peer did.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Misbehavior {
    /// Its message did not decode.
    #[error("malformed message: {0}")]
    Malformed(#[from] WireError),
    /// It named a handler that is not registered, or registered with another category or kind.
    #[error("no {category:?} {kind:?} handler {handler:?}")]
    UnknownHandler {
        /// The id it named.
        handler: HandlerId,
        /// The category of its message.
        category: Category,
        /// The kind of its message.
        kind: AmKind,
    },
    /// It sent a reply although no request to it was outstanding.
    #[error("reply without a request")]
    ReplyWithoutRequest,
    /// Its Long payload or put/get falls outside this rank's segment.
    #[error("segment access [{offset}, {offset}+{len}) outside the segment")]
    OutOfSegment {
        /// Offset it named.
        offset: u64,
        /// Length it named.
        len: u64,
    },
    /// It sent a Long into a created segment this rank does not hold: never created, or
    /// freed while the Long was on its way (the program freed a segment still in use, or
    /// this rank freed it on a team without the sender, whose Long then passed its check).
    #[error("a Long into segment {id}, which this rank does not hold")]
    UnknownSegment {
        /// The segment it named.
        id: crate::types::SegmentId,
    },
    /// A core-internal message with an unknown opcode or wrong arguments.
    #[error("bad system message (opcode {0})")]
    BadSystemMessage(u8),
    /// It sent a step of a collective that no collective of this rank can take: for a team
    /// this rank does not have (never had, or freed) while no split that could make it is in
    /// flight here, a sequence number more than [`crate::endpoint::MAX_COLLECTIVES_IN_FLIGHT`]
    /// ahead of this rank's, a step its place in the team does not send to this rank, or a
    /// step it already sent.
    #[error(
        "collective step {step} of sequence {seq} on team {team} that this rank does not expect"
    )]
    StrayCollective {
        /// The team it named.
        team: TeamId,
        /// The sequence number it named.
        seq: u64,
        /// The step it named.
        step: u32,
    },
    /// It corrupted what its NIC hands over (a length, stamp or count in shared memory, a
    /// datagram), as the transport found.
    #[error("{0}")]
    Nic(String),
}

impl AmError {
    /// Whether the error ends the node, not one operation or one peer: the job was aborted,
    /// or the device failed. Every operation in flight then fails with it, and every later
    /// one at once ([`crate::Endpoint::end`]).
    pub fn ends_node(&self) -> bool {
        matches!(
            self,
            AmError::JobAborted | AmError::NodeClosed | AmError::Transport(NicError::Device(_))
        )
    }
}

impl From<TransportError> for AmError {
    fn from(e: TransportError) -> Self {
        match e {
            TransportError::PeerLost(r) => AmError::PeerLost(r),
            TransportError::PeerDeparted(r) => AmError::PeerDeparted(r),
            TransportError::JobAborted => AmError::JobAborted,
            TransportError::PeerMisbehaved {
                peer: Some(peer),
                what,
            } => AmError::PeerMisbehaved {
                peer,
                what: Misbehavior::Nic(what),
            },
            other => AmError::Transport(other),
        }
    }
}

/// Why a `try_` request did not go out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TryRequestError {
    /// No credit for that peer, or the device is full: nothing was sent, the payload (borrowed)
    /// is still the caller's. Poll and try again (GASNet's IMMEDIATE flag).
    #[error("would block: no credit or device full")]
    WouldBlock,
    /// Any other failure.
    #[error(transparent)]
    Failed(#[from] AmError),
}

/// Why a node could not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A rank registered a different handler table than rank 0.
    #[error("rank {rank} registered a different handler table than rank 0{}: every rank must register the same handlers (digests {theirs:#018x} and {ours:#018x})", match handler { Some(h) => format!(" (first difference: handler {})", h.0), None => String::new() })]
    HandlerTableMismatch {
        /// The first rank found to differ.
        rank: Rank,
        /// Rank 0's digest.
        ours: u64,
        /// That rank's digest.
        theirs: u64,
        /// The lowest handler id registered differently (or only on one of the two), when
        /// the table signatures tell.
        handler: Option<HandlerId>,
    },
    /// A rank registers typed messages ([`crate::Handlers::typed`]) that differ from rank
    /// 0's: a type one of them lacks, or the same type with a different shape.
    #[error("rank {rank} registers typed messages differently from rank 0{}: every rank must register the same types, of the same shape", match name { Some(n) => format!(" (first difference: {n})"), None => String::new() })]
    TypedMismatch {
        /// The first rank found to differ.
        rank: Rank,
        /// The type, where this rank registers it.
        name: Option<&'static str>,
    },
    /// A rank's segment size differs from rank 0's.
    #[error(
        "rank {rank} has a {theirs}-byte segment, rank 0 has {ours}: segment sizes must agree"
    )]
    SegmentSizeMismatch {
        /// The rank that differs.
        rank: Rank,
        /// Rank 0's size.
        ours: u64,
        /// That rank's size.
        theirs: u64,
    },
    /// The configuration asks for something the transport cannot do.
    #[error("bad configuration: {0}")]
    Config(String),
    /// Communication failed during start-up.
    #[error(transparent)]
    Am(#[from] AmError),
}

/// An error of a NIC, from a send or outside one: what went wrong ([`NicError::kind`]),
/// whom it concerns ([`NicError::peer`]), and for a device failure the error underneath
/// ([`std::error::Error::source`]), never flattened into a string.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NicError {
    /// The device has no room now (ring full, no free slot). Nothing was sent; try again later.
    #[error("device busy")]
    Busy,
    /// A peer is gone.
    #[error("rank {0} was lost")]
    PeerLost(Rank),
    /// A peer left the job cleanly (closed its transport): nothing it receives will be
    /// handled, and nothing will come from it any more. Not a failure of the job.
    #[error("rank {0} has left the job")]
    PeerDeparted(Rank),
    /// The message is larger than the transport can carry.
    #[error("message of {0} bytes too large for the transport")]
    TooLarge(usize),
    /// The job is being torn down (a rank panicked or the launcher aborted it).
    #[error("the job was aborted")]
    JobAborted,
    /// The destination is not a rank this transport can send to (outside the job).
    #[error("rank {0} is not a rank of this job")]
    InvalidRank(Rank),
    /// A reply's route ([`crate::Outgoing::reply_to`]) names no request this rank still owes an
    /// answer to: a driver bug (a second reply, or a route from another delivery).
    #[error("a reply routed to {0:?}, which names no request to answer")]
    NoRequestToAnswer(Route),
    /// The NIC was asked for an operation its [`crate::Capabilities`] do not claim: a bug of
    /// the caller, which should have done it by messages.
    #[error("the NIC does no {0} of its own")]
    Unsupported(&'static str),
    /// A peer wrote something into memory or onto the wire that its protocol never produces
    /// (a corrupt length, stamp, head, tail, count or event). What it wrote was dropped or
    /// refused and the transport keeps working; `peer` is `None` where the word does not say
    /// who wrote it (a word every peer may write).
    #[error("{}: {what}", match peer { Some(r) => format!("rank {r} misbehaved"), None => "a peer misbehaved".to_owned() })]
    PeerMisbehaved {
        /// The rank at fault, where it can be known.
        peer: Option<Rank>,
        /// What was wrong.
        what: String,
    },
    /// The device itself failed (its engine stopped, its memory or socket could not be
    /// reached): nothing the caller can retry.
    #[error(transparent)]
    Device(Box<DeviceError>),
}

/// The kinds of [`NicError`], for matching on what happened without its details.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NicErrorKind {
    /// [`NicError::Busy`].
    Busy,
    /// [`NicError::PeerLost`].
    PeerLost,
    /// [`NicError::PeerDeparted`].
    PeerDeparted,
    /// [`NicError::TooLarge`].
    TooLarge,
    /// [`NicError::JobAborted`].
    JobAborted,
    /// [`NicError::InvalidRank`].
    InvalidRank,
    /// [`NicError::NoRequestToAnswer`].
    NoRequestToAnswer,
    /// [`NicError::Unsupported`].
    Unsupported,
    /// [`NicError::PeerMisbehaved`].
    PeerMisbehaved,
    /// [`NicError::Device`].
    Device,
}

impl NicError {
    /// What happened, without the details.
    pub fn kind(&self) -> NicErrorKind {
        match self {
            NicError::Busy => NicErrorKind::Busy,
            NicError::PeerLost(_) => NicErrorKind::PeerLost,
            NicError::PeerDeparted(_) => NicErrorKind::PeerDeparted,
            NicError::TooLarge(_) => NicErrorKind::TooLarge,
            NicError::JobAborted => NicErrorKind::JobAborted,
            NicError::InvalidRank(_) => NicErrorKind::InvalidRank,
            NicError::NoRequestToAnswer(_) => NicErrorKind::NoRequestToAnswer,
            NicError::Unsupported(_) => NicErrorKind::Unsupported,
            NicError::PeerMisbehaved { .. } => NicErrorKind::PeerMisbehaved,
            NicError::Device(_) => NicErrorKind::Device,
        }
    }

    /// The rank the error is about, where it names one.
    pub fn peer(&self) -> Option<Rank> {
        match self {
            NicError::PeerLost(r) | NicError::PeerDeparted(r) | NicError::InvalidRank(r) => {
                Some(*r)
            }
            NicError::PeerMisbehaved { peer, .. } => *peer,
            _ => None,
        }
    }

    /// A device failure described by `what`.
    #[cold]
    pub fn device(what: impl Into<String>) -> NicError {
        NicError::Device(Box::new(DeviceError {
            what: what.into(),
            source: None,
        }))
    }

    /// A device failure described by `what`, caused by `source` (kept as the error's
    /// [`source`](std::error::Error::source)).
    #[cold]
    pub fn device_from(
        what: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> NicError {
        NicError::Device(Box::new(DeviceError {
            what: what.into(),
            source: Some(Arc::new(source)),
        }))
    }
}

/// A failure of the device itself ([`NicError::Device`]): what failed, and the error
/// underneath, if any, as its [`source`](std::error::Error::source).
#[derive(Debug, Clone)]
pub struct DeviceError {
    what: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl DeviceError {
    /// What failed.
    pub fn what(&self) -> &str {
        &self.what
    }
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.what)
    }
}

impl std::error::Error for DeviceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Equal when they say the same: the same description, and sources that print the same.
impl PartialEq for DeviceError {
    fn eq(&self, other: &Self) -> bool {
        self.what == other.what
            && self.source.as_ref().map(|e| e.to_string())
                == other.source.as_ref().map(|e| e.to_string())
    }
}

impl Eq for DeviceError {}

/// Why a send did not happen: a [`NicError`] (the same type; the name says where it came
/// from).
pub type SendError = NicError;

/// A NIC's failure outside a send: a [`NicError`] (the same type).
pub type TransportError = NicError;

/// A failed copy of bytes the checks already bounded: a transport's own fault.
#[cold]
pub(crate) fn shm_err(e: am_shm::ShmError) -> AmError {
    AmError::Transport(NicError::device_from("a copy of checked bytes failed", e))
}
