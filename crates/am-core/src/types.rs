//! The words every other module speaks: ranks, handler ids, AM kinds and categories.

/// A rank: 0..size within a job (GASNet's `gasnet_node_t`).
pub type Rank = u32;

/// Index into the handler table (GASNet's handler index): 256 handlers per job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HandlerId(pub u8);

/// Whether a handler runs for requests or for replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Category {
    /// Runs at the target of a request; gets a [`Token`](crate::Token) that may reply once.
    Request = 0,
    /// Runs at the requester when the reply arrives; cannot send anything.
    Reply = 1,
}

/// The three GASNet AM kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum AmKind {
    /// Arguments only.
    Short = 0,
    /// Arguments and a payload delivered in a transport buffer (up to `max_medium`).
    Medium = 1,
    /// Arguments and a payload written into the target's segment before the handler runs.
    Long = 2,
}

/// Where a request came from, as its transport knows it (the slot its reply goes to, the
/// requester's send slot, ...): handed to the core with the request ([`crate::Delivery::route`])
/// and back to the transport with its reply ([`crate::Outgoing::reply_to`]), so the transport
/// pairs them without reading the core's header. Opaque to the core; a transport that
/// needs no pairing uses [`Route::NONE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Route(u64);

impl Route {
    /// No route: for transports whose replies need none.
    pub const NONE: Route = Route(0);

    /// A route the transport will recognise.
    #[inline]
    pub const fn new(value: u64) -> Route {
        Route(value)
    }

    /// The transport's value.
    #[inline]
    pub const fn get(self) -> u64 {
        self.0
    }
}

/// Which of a rank's segments: [`SegmentId::ZERO`] is the segment made when the job
/// connected; others come from [`crate::Node::create_segment`], numbered from 1 by each rank
/// and never reused while the endpoint lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentId(u32);

impl SegmentId {
    /// Segment 0: the one every rank has from the start ([`crate::Node::segment`]).
    pub const ZERO: SegmentId = SegmentId(0);

    /// The id's number (as the wire carries it).
    pub fn get(self) -> u32 {
        self.0
    }

    pub(crate) fn new(id: u32) -> SegmentId {
        SegmentId(id)
    }
}

impl std::fmt::Display for SegmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A reduction's operation, applied element by element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceOp {
    /// `a + b` (integers wrap).
    Sum,
    /// `a * b` (integers wrap).
    Product,
    /// The smaller (for floats, `f64::min`: a NaN loses to a number).
    Min,
    /// The larger (for floats, `f64::max`).
    Max,
    /// Bitwise and (integers only).
    And,
    /// Bitwise or (integers only).
    Or,
    /// Bitwise exclusive or (integers only).
    Xor,
    /// The user's operation registered under this id
    /// ([`crate::Handlers::reduction`], the same on every rank), over the element type it
    /// was registered for.
    User(ReduceId),
}

/// A user reduction's number, the same on every rank: [`crate::Handlers::reduction`]
/// registers an operation under it, and [`ReduceOp::User`] names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReduceId(pub u16);
