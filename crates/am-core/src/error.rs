//! Errors of the AM core. Each says who is at fault: the caller (a wrong argument), a peer
//! (it broke the protocol), or the job (a peer died, the transport failed).

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
    /// Another transport failure.
    #[error("transport: {0}")]
    Transport(TransportError),
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
    /// A core-internal message with an unknown opcode or wrong arguments.
    #[error("bad system message (opcode {0})")]
    BadSystemMessage(u8),
    /// It corrupted what its NIC hands over (a length, stamp or count in shared memory, a
    /// datagram), as the transport found.
    #[error("{0}")]
    Nic(String),
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

/// Why a send did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SendError {
    /// The device has no room now (ring full, no free slot). Nothing was sent; try again later.
    #[error("device busy")]
    Busy,
    /// The destination is gone.
    #[error("rank {0} was lost")]
    PeerLost(Rank),
    /// The destination left the job cleanly: nothing it receives will be handled.
    #[error("rank {0} has left the job")]
    PeerDeparted(Rank),
    /// The message is larger than the transport can carry.
    #[error("message of {0} bytes too large for the transport")]
    TooLarge(usize),
    /// The job is being torn down.
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
    /// The device failed (its engine stopped, its memory could not be reached): nothing the
    /// caller can retry.
    #[error("{0}")]
    Other(String),
}

/// A transport failure outside a send.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// A peer is gone.
    #[error("rank {0} was lost")]
    PeerLost(Rank),
    /// A peer ended its part of the job cleanly (closed its transport): reported once per
    /// peer. Not a failure of the job, but nothing will come from it any more.
    #[error("rank {0} has left the job")]
    PeerDeparted(Rank),
    /// The device had no room, where the caller could not wait for it (a send from a path
    /// that cannot retry). Nothing was sent.
    #[error("device busy")]
    Busy,
    /// The job is being torn down (a rank panicked or the launcher aborted it).
    #[error("the job was aborted")]
    JobAborted,
    /// The message is larger than the transport can carry.
    #[error("message of {0} bytes too large for the transport")]
    TooLarge(usize),
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
    /// See [`SendError::InvalidRank`].
    #[error("rank {0} is not a rank of this job")]
    InvalidRank(Rank),
    /// See [`SendError::NoRequestToAnswer`].
    #[error("a reply routed to {0:?}, which names no request to answer")]
    NoRequestToAnswer(Route),
    /// See [`SendError::Unsupported`].
    #[error("the NIC does no {0} of its own")]
    Unsupported(&'static str),
    /// An I/O or device failure.
    #[error("{0}")]
    Io(String),
}

impl From<SendError> for TransportError {
    fn from(e: SendError) -> Self {
        match e {
            SendError::PeerLost(r) => TransportError::PeerLost(r),
            SendError::PeerDeparted(r) => TransportError::PeerDeparted(r),
            SendError::JobAborted => TransportError::JobAborted,
            SendError::TooLarge(n) => TransportError::TooLarge(n),
            SendError::Busy => TransportError::Busy,
            SendError::InvalidRank(r) => TransportError::InvalidRank(r),
            SendError::NoRequestToAnswer(r) => TransportError::NoRequestToAnswer(r),
            SendError::Unsupported(what) => TransportError::Unsupported(what),
            SendError::Other(s) => TransportError::Io(s),
        }
    }
}

/// A send error as the AM error it becomes.
pub(crate) fn send_err(e: SendError) -> AmError {
    AmError::from(TransportError::from(e))
}

/// A failed copy of bytes the checks already bounded: a transport's own fault.
#[cold]
pub(crate) fn shm_err(e: am_shm::ShmError) -> AmError {
    AmError::Transport(TransportError::Io(e.to_string()))
}
