//! The Transport trait: what the core needs from a NIC.
//!
//! The trait is deliberately small. A transport moves whole AM messages (the core's encoded head
//! plus a payload) between ranks, reports device back-pressure as [`SendError::Busy`], and owns
//! the rank's registered segment, because on shared-memory and RDMA NICs peers write into it
//! directly. Flow control (credits) is *not* the transport's business: it lives in the core.
//!
//! How each kind of NIC maps onto it:
//! - message NICs (EXTOLL VELO packets, UDP datagrams) send `head ++ payload`, fragmenting and
//!   reassembling as they must, and deliver it with `payload_placed = false`; the core copies a
//!   Long payload into the segment;
//! - NICs with remote writes (SCI PIO/DMA, EXTOLL RMA, Portals put) write a Long payload straight
//!   into the target's segment at `long_offset`, then deliver the head alone with
//!   `payload_placed = true`, only once the data is in place;
//! - receive lends the message where it is: [`Transport::poll_recv`] hands the core the
//!   message in the transport's own buffer for the duration of the handler, together with the
//!   local segment and a sender for the reply (smoltcp's RxToken/TxToken). A buffer in memory
//!   that peers may write (a ring slot, a command segment) is lent as [`SharedBytes`]
//!   ([`Received::Shared`]), never as `&[u8]`: the core copies the head out and checks the
//!   copy, and a handler copies the payload out only if it reads it. Private memory (a
//!   reassembly buffer, a datagram) is lent as `&[u8]` ([`Received::Private`]);
//! - replies are routed by the transport: a request arrives with a [`Route`] of the
//!   transport's choosing ([`Delivery::route`]: sci's request slot, portals' send slot), and
//!   its one reply leaves with it ([`Outgoing::reply_to`]), so no transport reads the core's
//!   header to pair them.
//!
//! - one-sided memory is one request that describes it ([`Transport::rma`] with an [`Rma`]:
//!   the operation, the peer's memory, this rank's), for a NIC that claims it in its
//!   [`Capabilities`]; the core does the rest by messages. A NIC that maps its peers'
//!   segments says how once ([`crate::rma::MappedPeers`]) and answers every request with
//!   [`crate::rma::mapped`], where the copies between mappings are written.
//!
//! The segment is [`SharedBytes`] too: peers write it at any time (puts, Long payloads), so
//! it is reached only by copies and atomics, by the core, by handlers and by users alike.
//!
//! Every transport must deliver messages to self (`dest == rank()`), and deliver the messages
//! of one sender to one receiver in the order they were sent.

use std::os::fd::BorrowedFd;
use std::time::Duration;

pub use am_shm::SharedBytes;

use crate::atomic::{Atomic, Batch, Posted};
use crate::credit::Credits;
pub use crate::error::{NicError, SendError, TransportError};
use crate::types::Rank;
pub use crate::types::Route;

/// Size limits of a transport, queryable through [`crate::Node::limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most 32-bit arguments per AM (16 on every transport of this workspace).
    pub max_args: usize,
    /// The largest AM Medium payload.
    pub max_medium: usize,
    /// The largest AM Long payload in one message.
    pub max_long: usize,
    /// The most credits (outstanding requests) per peer the transport's receive space allows.
    pub max_credits: u32,
}

/// A payload to send: bytes in private memory, or a view of memory peers may write (a
/// received payload that a handler echoes or forwards, a range of the local segment), which
/// the transport copies once, straight to where it goes.
///
/// Converts from `&[u8]`, `&Vec<u8>`, `&[u8; N]` and [`SharedBytes`]; a handler passes
/// [`crate::Msg::payload_ref`] to reply with the payload it received without copying it twice.
#[derive(Debug, Clone, Copy)]
pub enum Payload<'a> {
    /// Private bytes.
    Private(&'a [u8]),
    /// Bytes peers may write: copied by the transport, never lent as `&[u8]`.
    Shared(SharedBytes<'a>),
}

impl<'a> Payload<'a> {
    /// No payload.
    pub const EMPTY: Payload<'static> = Payload::Private(&[]);

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            Payload::Private(b) => b.len(),
            Payload::Shared(s) => s.len(),
        }
    }

    /// True if there are no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the bytes to `out`.
    #[inline]
    pub fn append_to(&self, out: &mut Vec<u8>) {
        match self {
            Payload::Private(b) => out.extend_from_slice(b),
            Payload::Shared(s) => {
                let at = out.len();
                out.resize(at + s.len(), 0);
                // In bounds: `out[at..]` is exactly `s.len()` long.
                let _ = s.read(0, &mut out[at..]);
            }
        }
    }

    /// The bytes as a private slice: borrowed if they are private, else copied into
    /// `scratch` (cleared first). For transports that need the bytes in one piece.
    #[inline]
    pub fn to_private<'s>(&self, scratch: &'s mut Vec<u8>) -> &'s [u8]
    where
        'a: 's,
    {
        match *self {
            Payload::Private(b) => b,
            Payload::Shared(s) => {
                s.read_into(scratch);
                scratch
            }
        }
    }
}

impl<'a> From<&'a [u8]> for Payload<'a> {
    #[inline]
    fn from(b: &'a [u8]) -> Payload<'a> {
        Payload::Private(b)
    }
}

impl<'a> From<&'a Vec<u8>> for Payload<'a> {
    #[inline]
    fn from(b: &'a Vec<u8>) -> Payload<'a> {
        Payload::Private(b)
    }
}

impl<'a, const N: usize> From<&'a [u8; N]> for Payload<'a> {
    #[inline]
    fn from(b: &'a [u8; N]) -> Payload<'a> {
        Payload::Private(b)
    }
}

impl<'a> From<SharedBytes<'a>> for Payload<'a> {
    #[inline]
    fn from(s: SharedBytes<'a>) -> Payload<'a> {
        Payload::Shared(s)
    }
}

/// A message to send: the core's encoded head (header + arguments) and the payload.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    /// Header and arguments, as encoded by [`crate::wire::Header::encode`].
    pub head: &'a [u8],
    /// The payload (Medium, Long), possibly empty; possibly in shared memory (a reply that
    /// echoes what it received), which a transport copies straight to its destination.
    pub payload: Payload<'a>,
    /// For Long: where the payload goes in the target's segment. Transports with remote writes
    /// place it there before delivering `head`.
    pub long_offset: Option<usize>,
    /// `None` for a request; for a reply, the [`Delivery::route`] of the request it answers
    /// (each request is answered exactly once, explicitly or by the core's implicit reply).
    pub reply_to: Option<Route>,
}

impl<'a> Outgoing<'a> {
    /// A Short or Medium message: `head` then `payload`, no Long offset.
    #[inline]
    pub fn new(head: &'a [u8], payload: &'a [u8]) -> Outgoing<'a> {
        Outgoing {
            head,
            payload: Payload::Private(payload),
            long_offset: None,
            reply_to: None,
        }
    }

    /// True for a reply (it carries the route of the request it answers).
    #[inline]
    pub fn is_reply(&self) -> bool {
        self.reply_to.is_some()
    }

    /// Length of head plus payload: the size of the message on a message NIC.
    #[inline]
    pub fn len(&self) -> usize {
        self.head.len() + self.payload.len()
    }

    /// True if there is neither head nor payload (never the case for core messages).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A received message, lent by the transport.
#[derive(Debug, Clone, Copy)]
pub struct Delivery<'a> {
    /// The sender.
    pub src: Rank,
    /// Head, followed by the payload unless `payload_placed`.
    pub bytes: Received<'a>,
    /// The Long payload was already written into the segment by the transport.
    pub payload_placed: bool,
    /// For a request, what its reply must carry back ([`Outgoing::reply_to`]); ignored for
    /// a reply.
    pub route: Route,
}

/// Where a received message's bytes are.
#[derive(Debug, Clone, Copy)]
pub enum Received<'a> {
    /// In the transport's private memory, which no peer can write.
    Private(&'a [u8]),
    /// In memory that peers may write (a slot of a shared ring): read only by copies.
    Shared(SharedBytes<'a>),
}

impl Received<'_> {
    /// Number of bytes.
    #[inline]
    pub fn len(&self) -> usize {
        match self {
            Received::Private(b) => b.len(),
            Received::Shared(s) => s.len(),
        }
    }

    /// True if there are none.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A private copy of the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        match self {
            Received::Private(b) => b.to_vec(),
            Received::Shared(s) => s.to_vec(),
        }
    }
}

/// What a NIC does itself beyond moving messages ([`NicInfo::capabilities`]): the core
/// uses each of these where the NIC has it and does the rest by messages.
///
/// Grows with the NICs: build it from [`Capabilities::default`] (nothing) and set what the
/// NIC has.
///
/// ```
/// # use amnet::Capabilities;
///
/// fn main() {
///     let mut caps = Capabilities::default();
///     caps.put = true;
///     caps.long_placed_below = usize::MAX;
///     assert!(caps.long_placed_on_send(1 << 20) && !caps.get);
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Capabilities {
    /// It writes into peers' segments without their attention ([`Rma::Put`]).
    pub put: bool,
    /// It reads peers' segments without their attention ([`Rma::Get`]).
    pub get: bool,
    /// It applies remote atomics on peers' words without their attention
    /// ([`Rma::Atomic`], [`Rma::Atomics`]).
    pub atomics: bool,
    /// Long payloads shorter than this many bytes are already in the target's segment when
    /// [`Tx::try_send`] returns `Ok` for them (PIO stores, a put the engine finished at
    /// once): layers above use it for write-based completion, knowing that the data has
    /// landed without a message from the target. 0: none is; `usize::MAX`: every one is.
    pub long_placed_below: usize,
    /// One empty reply may return the credits of several requests from one peer
    /// (a system message of acknowledgements). The core then answers the requests whose
    /// handlers sent no reply with one message per peer and batch. Such a reply carries the
    /// [`Route`] of the latest request it answers, and the core keeps replies to a peer in
    /// the order of its requests, so a transport that pairs replies with requests (sci's
    /// reply slots) takes it as the answer to that request and every earlier one still
    /// unanswered.
    pub acks_coalesce: bool,
    /// Its peers are processes of this host that map each other's memory files: a segment
    /// a peer creates and publishes ([`crate::Node::create_segment`]) is mapped here, and
    /// puts, gets and atomics on it are copies and atomic instructions by this rank, with
    /// no message. Otherwise they go by the NIC's RMA where it registers segments
    /// ([`Capabilities::rma_segments`]), else as messages that the owner's progress applies.
    pub map_segments: bool,
    /// It registers created segments for peers' RMA ([`Registration::Register`]):
    /// a segment's publication carries the key blob it returns, and puts, gets and (where
    /// [`Capabilities::atomics`] is set) atomics on a peer's segment that published one go
    /// as [`Rma`] requests on [`Remote::Keyed`], with no message for the owner's progress.
    /// Used where [`Capabilities::map_segments`] is not.
    pub rma_segments: bool,
}

impl Capabilities {
    /// Whether a Long of `len` bytes has landed in the target's segment once its send
    /// returned `Ok` ([`Capabilities::long_placed_below`]).
    #[inline]
    pub fn long_placed_on_send(&self, len: usize) -> bool {
        len < self.long_placed_below
    }
}

/// What [`Transport::arm`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Armed {
    /// Work is there (or may be): poll rather than sleep. The transport has withdrawn its
    /// announcement, or keeps it until [`Transport::disarm`]; either way a driver polls next.
    Ready,
    /// Armed: anything a poll would act on from now makes [`Transport::wake_fd`] readable.
    /// Sleep until it is, or until this much time has passed (the transport's own timers:
    /// liveness checks, retransmission), then [`Transport::disarm`] and poll.
    Sleep(Duration),
}

/// Whether `fd` (a wake descriptor) becomes readable within `timeout` (rounded up to whole
/// milliseconds; zero looks without waiting).
#[cfg(feature = "conformance")]
pub(crate) fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> nix::Result<bool> {
    any_readable(&[fd], timeout)
}

/// Whether any of `fds` (wake descriptors) becomes readable within `timeout` (rounded up to
/// whole milliseconds).
pub(crate) fn any_readable(fds: &[BorrowedFd<'_>], timeout: Duration) -> nix::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
    let mut fds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
        .collect();
    let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
    poll(&mut fds, timeout).map(|n| n > 0)
}

/// The sending half of a transport. Also lent to handlers, so a reply can go out while the
/// request is still borrowed from the receive buffer.
pub trait Tx {
    /// Sends one message, or reports [`SendError::Busy`] if the device has no room now.
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError>;
}

/// What a NIC is, fixed for its life ([`Transport::info`]): its name, its size limits, the
/// credits it suits and what it does itself. The core asks for it where an operation's path
/// depends on it: a NIC answers the same on every call, and the constant answer of a concrete
/// NIC folds into each operation's path (no load, no branch left of it).
///
/// Grows with the NICs: build it with [`NicInfo::new`] and set the rest.
///
/// ```
/// use amnet::{Credits, Limits, NicInfo};
///
/// fn main() {
///     let limits = Limits { max_args: 16, max_medium: 1024, max_long: 1 << 20, max_credits: 64 };
///     let mut info = NicInfo::new("mynic", limits);
///     info.capabilities.put = true;
///     assert_eq!(info.credits, Credits::default());
/// }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct NicInfo {
    /// The transport's name as used by `--transport` (`loopback`, `sci`, ...).
    pub name: &'static str,
    /// Size limits.
    pub limits: Limits,
    /// The credits a job on this transport gets where its [`crate::Config`] chooses none
    /// (no `AM_CREDITS`, no [`crate::Config::credits`]): enough requests in flight per peer
    /// to cover the transport's round trip at its message rate. [`NicInfo::new`] gives 32
    /// static per peer ([`Credits::default`]), which suits a round trip of a microsecond or
    /// less.
    pub credits: Credits,
    /// What this NIC does itself beyond moving messages ([`Capabilities`]). The core never
    /// asks [`Transport::rma`] for what the NIC does not claim. [`NicInfo::new`] gives
    /// nothing, so the core does puts, gets and atomics by messages.
    pub capabilities: Capabilities,
}

impl NicInfo {
    /// A NIC named `name` with `limits`, the default credits and no capabilities.
    pub fn new(name: &'static str, limits: Limits) -> NicInfo {
        NicInfo {
            name,
            limits,
            credits: Credits::default(),
            capabilities: Capabilities::default(),
        }
    }
}

/// One one-sided request for a NIC to carry out ([`Transport::rma`]): a put, a get or an
/// atomic on a peer's memory, described by where it reaches there ([`Remote`]) and, for puts
/// and gets, which memory of this rank it moves ([`Source`], [`Sink`]).
///
/// The core has checked every rank, range, length and alignment before a request reaches a
/// NIC, and never sends one the NIC does not claim in its [`Capabilities`]: puts
/// ([`Capabilities::put`]), gets ([`Capabilities::get`]), atomics
/// ([`Capabilities::atomics`]); [`Remote::Keyed`] only where
/// [`Capabilities::rma_segments`] is set.
#[derive(Debug)]
#[non_exhaustive]
pub enum Rma<'a> {
    /// Copies `from` to `to` at `dest` without `dest`'s attention. Complete when
    /// [`Transport::rma`] returns `Ok`: the bytes are in the target's memory, which is both
    /// local completion (`from` may be reused) and remote completion.
    Put {
        /// The target.
        dest: Rank,
        /// Where the bytes go there.
        to: Remote<'a>,
        /// The bytes.
        from: Source<'a>,
    },
    /// Copies `from` at `src` into `into` without `src`'s attention: `Ok` once `into` holds
    /// the bytes.
    Get {
        /// The rank read.
        src: Rank,
        /// Where the bytes are there.
        from: Remote<'a>,
        /// Where they go here.
        into: Sink<'a>,
    },
    /// Applies `atomic` to the word `at` names at `dest` without `dest`'s attention: the
    /// word's old value in [`RmaDone::old`]. Shared-memory NICs do it with one atomic
    /// instruction on the target's mapped word ([`crate::atomic::Atomic::apply`] on a view
    /// of it). `at` is [`Remote::At`] or [`Remote::Keyed`].
    Atomic {
        /// The target.
        dest: Rank,
        /// The word.
        at: Remote<'a>,
        /// What to do with it.
        atomic: Atomic,
    },
    /// Applies the non-fetching atomics of a batch in segment 0 of their targets, in order,
    /// each as [`Rma::Atomic`] would, and writes what became of them to `outcome` (a
    /// [`Batch`]: how far it got, and the first refusal). A NIC that
    /// reaches the words itself fetches them all first, so that their cache misses overlap
    /// ([`crate::atomic::apply_batch`]). One refused for good does not stop the others; a
    /// busy device stops the batch, and the core polls and hands over the rest again. The
    /// core hands posted atomics on its own rank here with the rest, so such a NIC reaches
    /// its own segment too. The request itself returns `Ok` whatever `outcome` says.
    Atomics {
        /// The atomics, in order.
        batch: &'a [Posted],
        /// What became of them, written by the NIC.
        outcome: &'a mut Batch,
    },
}

/// Where a strided or indexed transfer's bytes go in the target's segment, region by region,
/// in the order of its data ([`crate::Node::put_strided`], [`crate::Node::put_indexed`],
/// [`Remote::Regions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Regions<'a> {
    /// `count` blocks of `block` bytes, one every `stride` bytes from `offset`.
    Strided {
        /// The first block's offset.
        offset: usize,
        /// Bytes from one block's start to the next's.
        stride: usize,
        /// Bytes per block.
        block: usize,
        /// Blocks.
        count: usize,
    },
    /// (offset, length) pairs.
    Indexed(&'a [(usize, usize)]),
}

impl<'a> Regions<'a> {
    /// The regions, in order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, usize)> + use<'a> {
        let (strided, indexed) = match *self {
            Regions::Strided {
                offset,
                stride,
                block,
                count,
            } => (Some((offset, stride, block, count)), &[][..]),
            Regions::Indexed(r) => (None, r),
        };
        let strided = strided
            .into_iter()
            .flat_map(|(offset, stride, block, count)| {
                (0..count).map(move |i| (offset.wrapping_add(i.wrapping_mul(stride)), block))
            });
        strided.chain(indexed.iter().copied())
    }

    /// Each region's offset with its bytes of `data`, in order. A `data` that does not hold
    /// exactly the regions' bytes is [`SendError::Device`] (the core checks it first).
    pub fn pieces<'d>(
        &self,
        data: &'d [u8],
    ) -> Result<impl Iterator<Item = (usize, &'d [u8])> + use<'a, 'd>, SendError> {
        self.fits(data.len())?;
        let mut rest = data;
        Ok(self.iter().map(move |(offset, len)| {
            let (bytes, after) = rest.split_at(len);
            rest = after;
            (offset, bytes)
        }))
    }

    /// [`Regions::pieces`] of a buffer to fill.
    pub fn pieces_mut<'d>(
        &self,
        dst: &'d mut [u8],
    ) -> Result<impl Iterator<Item = (usize, &'d mut [u8])> + use<'a, 'd>, SendError> {
        self.fits(dst.len())?;
        let mut rest = dst;
        Ok(self.iter().map(move |(offset, len)| {
            let (bytes, after) = std::mem::take(&mut rest).split_at_mut(len);
            rest = after;
            (offset, bytes)
        }))
    }

    /// Whether a buffer of `len` bytes holds exactly the regions' bytes.
    fn fits(&self, len: usize) -> Result<(), SendError> {
        if self.total() == Some(len) {
            Ok(())
        } else {
            Err(SendError::device(format!(
                "a transfer of {len} bytes into or out of regions of another total"
            )))
        }
    }

    /// How many regions.
    pub fn count(&self) -> usize {
        match *self {
            Regions::Strided { count, .. } => count,
            Regions::Indexed(r) => r.len(),
        }
    }

    /// The bytes of all regions, or `None` if they overflow.
    pub fn total(&self) -> Option<usize> {
        match *self {
            Regions::Strided { block, count, .. } => block.checked_mul(count),
            Regions::Indexed(r) => r.iter().try_fold(0usize, |a, &(_, n)| a.checked_add(n)),
        }
    }

    /// The lowest offset and the end of the highest region, or `None` if an end overflows
    /// (a strided transfer's regions lie between its first and last block; an empty one
    /// is `Some((0, 0))`).
    pub fn span(&self) -> Option<(usize, usize)> {
        match *self {
            Regions::Strided { count: 0, .. } => Some((0, 0)),
            Regions::Strided {
                offset,
                stride,
                block,
                count,
            } => {
                let last = (count - 1).checked_mul(stride)?.checked_add(offset)?;
                Some((offset, last.checked_add(block)?))
            }
            Regions::Indexed(r) => r
                .iter()
                .try_fold((usize::MAX, 0), |(lo, hi), &(o, n)| {
                    Some((lo.min(o), hi.max(o.checked_add(n)?)))
                })
                .map(|(lo, hi)| if r.is_empty() { (0, 0) } else { (lo, hi) }),
        }
    }
}

/// Where an [`Rma`] request reaches a peer's memory.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Remote<'a> {
    /// Segment 0, from this offset: as many bytes as the local side has (one word for an
    /// atomic).
    At(usize),
    /// Segment 0, region by region in order (a strided or indexed transfer), the regions'
    /// lengths adding up to the local side's, which is a slice ([`Source::Bytes`],
    /// [`Sink::Bytes`]). [`SendError::Busy`] may come after some regions were moved: the
    /// core asks again, and they are moved again (the same bytes).
    Regions(Regions<'a>),
    /// The registration a peer's key blob `key` names ([`Transport::registration`]), from
    /// `offset` (counted from the segment's word area). [`RmaDone::flag`] is the
    /// registration's first `u64` (its freed flag, where the core keeps it), read in flight
    /// beside the request, in no order with it. `key` came from the peer, untrusted: one
    /// this NIC cannot have made, or a range past what it names, is
    /// [`SendError::PeerMisbehaved`] naming the peer. The core has checked the range against
    /// the published length.
    Keyed {
        /// The peer's key blob.
        key: &'a [u8],
        /// Where in the registration.
        offset: usize,
    },
}

/// The local memory a put reads ([`Rma::Put`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Source<'a> {
    /// The caller's bytes.
    Bytes(&'a [u8]),
    /// `len` bytes at `offset` of this rank's segment 0, which the transport holds
    /// ([`Transport::segment`]): checked by the core. A NIC that reaches both memories
    /// copies from one to the other in one pass (no buffer in between, and no Rust reference
    /// over either: peers may write them meanwhile).
    Own {
        /// Where the bytes start in segment 0.
        offset: usize,
        /// How many.
        len: usize,
    },
    /// All of a range of one of this rank's created segments: copied as [`Source::Own`]; a
    /// NIC that registered the segment writes straight from its memory.
    Segment(OwnRange<'a>),
}

/// The local memory a get writes ([`Rma::Get`]).
#[derive(Debug)]
#[non_exhaustive]
pub enum Sink<'a> {
    /// The caller's buffer, filled whole.
    Bytes(&'a mut [u8]),
    /// `len` bytes at `offset` of this rank's segment 0, filled as [`Source::Own`] is read.
    Own {
        /// Where the bytes go in segment 0.
        offset: usize,
        /// How many.
        len: usize,
    },
    /// All of a range of one of this rank's created segments, filled as
    /// [`Source::Segment`] is read.
    Segment(OwnRange<'a>),
}

impl Source<'_> {
    /// Bytes moved.
    pub fn len(&self) -> usize {
        match self {
            Source::Bytes(b) => b.len(),
            Source::Own { len, .. } => *len,
            Source::Segment(r) => r.bytes.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Sink<'_> {
    /// Bytes moved.
    pub fn len(&self) -> usize {
        match self {
            Sink::Bytes(b) => b.len(),
            Sink::Own { len, .. } => *len,
            Sink::Segment(r) => r.bytes.len(),
        }
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a NIC reports of an [`Rma`] request it carried out: two words, returned in
/// registers (a batch's outcome goes to [`Rma::Atomics`]'s `outcome` instead).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RmaDone {
    /// An atomic's: the word's old value.
    pub old: u64,
    /// A request on [`Remote::Keyed`]: the registration's first `u64`, read beside it.
    pub flag: u64,
}

impl RmaDone {
    /// A put or get done.
    pub fn moved() -> RmaDone {
        RmaDone::default()
    }

    /// An atomic done, its word's old value `old`.
    pub fn old(old: u64) -> RmaDone {
        RmaDone {
            old,
            ..RmaDone::default()
        }
    }

    /// A request on a registration done, with its first `u64` read beside it.
    pub fn keyed(old: u64, flag: u64) -> RmaDone {
        RmaDone {
            old,
            flag,
            ..RmaDone::default()
        }
    }
}

/// A change to the segments a NIC registers for peers' RMA ([`Transport::registration`]).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum Registration<'a> {
    /// Register all of `segment`, this rank's created segment `id` (its word area, then its
    /// byte area), for peers' RMA: the answer is the key blob peers reach it by (at most 40
    /// bytes), or `None` where it could not be registered (peers then reach it by messages).
    /// The NIC keeps the memory mapped while it is registered (a
    /// [`am_shm::Segment::share`]). The core registers a segment once, before its first
    /// publication, and ends the registration at once if the key is longer than 40 bytes.
    Register {
        /// The segment's id at this rank.
        id: u32,
        /// The segment.
        segment: &'a am_shm::Segment,
    },
    /// End the registration of segment `id` (none: nothing to do). The core asks once the
    /// segment's free completed on a team of every rank it was published to, none of which
    /// operates on it any more. The answer is `None`.
    Deregister {
        /// The segment's id at this rank.
        id: u32,
    },
}

/// A NIC as the core sees it. See the [module docs](self) for how NICs map onto it.
///
/// Messages go by [`Tx::try_send`] and [`Transport::poll_recv`]; one-sided memory by one
/// request that describes it ([`Transport::rma`]). A wrapper or an enum of transports
/// forwards what it does not change with [`forward_transport!`](crate::forward_transport).
pub trait Transport: Tx {
    /// This rank.
    fn rank(&self) -> Rank;
    /// Number of ranks in the job.
    fn size(&self) -> u32;
    /// What the NIC is: name, limits, credits, capabilities ([`NicInfo`]), the same on
    /// every call.
    fn info(&self) -> NicInfo;
    /// The local registered segment (peers may write it at any time: a view, never a slice).
    fn segment(&self) -> SharedBytes<'_>;
    /// Takes at most one incoming message and calls `f` with it, the local segment and a sender;
    /// returns `Ok(None)` when nothing is there. A transport that finds a corrupt message
    /// drops it and returns [`TransportError::PeerMisbehaved`]; the next call goes on.
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError>;
    /// Blocks until a message may have arrived or `timeout` passed (the `Block` wait mode).
    /// The default yields the CPU once.
    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        let _ = timeout;
        std::thread::yield_now();
        Ok(())
    }
    /// The file descriptor an event loop sleeps on between [`Transport::arm`] and
    /// [`Transport::disarm`] (a socket), made on the first call; the same on every call, so
    /// a duplicate (`try_clone_to_owned`) watches it for as long as the transport lives. On
    /// the shared-memory NICs and loopback it becomes readable only for a transport that
    /// armed, never per message otherwise; udp's is its socket. `None`: the transport has
    /// none, and a driver polls it without sleeping (the default, with [`Transport::arm`]
    /// always [`Armed::Ready`]).
    fn wake_fd(&mut self) -> Result<Option<BorrowedFd<'_>>, TransportError> {
        Ok(None)
    }
    /// Announces that the caller will sleep on [`Transport::wake_fd`] (UCX's
    /// `ucp_worker_arm`): [`Armed::Ready`] if a poll has work now, else
    /// [`Armed::Sleep`]. No wake-up is lost between a look that found nothing and the
    /// announcement: a message published before it is found, one after it wakes the fd.
    /// Senders pay for the wake-up only while the receiver is armed. Call it after a poll
    /// that found nothing, and [`Transport::disarm`] after the sleep.
    fn arm(&mut self) -> Result<Armed, TransportError> {
        Ok(Armed::Ready)
    }
    /// Withdraws [`Transport::arm`]'s announcement and consumes the wake-ups queued on the fd,
    /// so that it is readable again only after the next arming finds work. Harmless when not
    /// armed.
    fn disarm(&mut self) {}
    /// Sends now whatever the transport holds back to pack with later messages (udp's open
    /// datagram). The core calls it when a poll finds nothing (after the implicit replies it
    /// sends then), when a barrier, a quiesce, a wait for an operation or
    /// [`crate::Node::wait_until`] returns, and when a poll stops with messages left: so
    /// nothing its handlers or its protocol sent waits for the caller's next poll. What a
    /// blocking send sent, and what handlers sent while it waited for credits, may wait
    /// for that poll, to be packed with the sends after it. A transport that holds nothing
    /// back needs nothing here.
    fn flush(&mut self) {}
    /// What the NIC counts of its own ([`crate::NicStats`]: refusals it retried itself,
    /// retransmissions), which [`crate::Node::stats`] adds to the core's counts. The default
    /// counts nothing.
    fn stats(&self) -> crate::NicStats {
        crate::NicStats::default()
    }
    /// Carries out one one-sided request ([`Rma`]) that the NIC claims in its
    /// [`Capabilities`], complete when it returns `Ok`. A lost target is
    /// [`SendError::PeerLost`], a departed one [`SendError::PeerDeparted`]; a word or range
    /// the NIC still cannot reach is [`SendError::Device`]; [`SendError::Busy`] means
    /// nothing was done yet (the core polls and asks again). The default supports nothing.
    ///
    /// A NIC that maps its peers' segments into this process implements it with
    /// [`crate::rma::mapped`], where every copy between mappings is written once; one that
    /// moves only some shapes itself hands the rest to [`crate::rma::by_pieces`].
    fn rma(&mut self, request: Rma<'_>) -> Result<RmaDone, SendError> {
        let _ = request;
        Err(SendError::Unsupported("rma"))
    }
    /// Registers a created segment for peers' RMA, or ends a registration
    /// ([`Registration`]), for a NIC whose [`Capabilities::rma_segments`] is set. The
    /// default registers nothing.
    fn registration(&mut self, change: Registration<'_>) -> Option<Vec<u8>> {
        let _ = change;
        None
    }
    /// The process is about to end ([`crate::Node::exit`]): deliver what was already sent
    /// (bounded in time) and tell the peers this rank is leaving. Nothing is sent afterwards.
    /// The default does nothing: transports whose sends complete at once need no lingering.
    fn close(&mut self) {}
}

/// The requests the core makes of [`Transport::rma`], by shape: each builds its descriptor,
/// so that the core's call sites read as the operation they do.
pub(crate) trait RmaRequests: Transport {
    #[inline(always)]
    fn put(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<(), SendError> {
        self.rma(Rma::Put {
            dest,
            to: Remote::At(offset),
            from: Source::Bytes(data),
        })
        .map(drop)
    }
    #[inline(always)]
    fn get(&mut self, src: Rank, offset: usize, into: &mut [u8]) -> Result<(), SendError> {
        self.rma(Rma::Get {
            src,
            from: Remote::At(offset),
            into: Sink::Bytes(into),
        })
        .map(drop)
    }
    #[inline(always)]
    fn atomic(&mut self, dest: Rank, offset: usize, atomic: Atomic) -> Result<u64, SendError> {
        self.rma(Rma::Atomic {
            dest,
            at: Remote::At(offset),
            atomic,
        })
        .map(|d| d.old)
    }
    #[inline(always)]
    fn put_own(
        &mut self,
        dest: Rank,
        offset: usize,
        local: usize,
        len: usize,
    ) -> Result<(), SendError> {
        self.rma(Rma::Put {
            dest,
            to: Remote::At(offset),
            from: Source::Own { offset: local, len },
        })
        .map(drop)
    }
    #[inline(always)]
    fn get_own(
        &mut self,
        src: Rank,
        offset: usize,
        local: usize,
        len: usize,
    ) -> Result<(), SendError> {
        self.rma(Rma::Get {
            src,
            from: Remote::At(offset),
            into: Sink::Own { offset: local, len },
        })
        .map(drop)
    }
    #[inline(always)]
    fn put_from(
        &mut self,
        dest: Rank,
        to: Remote<'_>,
        from: OwnRange<'_>,
    ) -> Result<u64, SendError> {
        self.rma(Rma::Put {
            dest,
            to,
            from: Source::Segment(from),
        })
        .map(|d| d.flag)
    }
    #[inline(always)]
    fn get_into(
        &mut self,
        src: Rank,
        from: Remote<'_>,
        into: OwnRange<'_>,
    ) -> Result<u64, SendError> {
        self.rma(Rma::Get {
            src,
            from,
            into: Sink::Segment(into),
        })
        .map(|d| d.flag)
    }
}

impl<T: Transport + ?Sized> RmaRequests for T {}

/// Requests on a registration a peer's key names ([`Remote::Keyed`]), each with the
/// registration's first word read beside it.
pub(crate) trait KeyedRequests: Transport {
    #[inline]
    fn put_keyed(
        &mut self,
        dest: Rank,
        key: &[u8],
        offset: usize,
        data: &[u8],
    ) -> Result<u64, SendError> {
        self.rma(Rma::Put {
            dest,
            to: Remote::Keyed { key, offset },
            from: Source::Bytes(data),
        })
        .map(|d| d.flag)
    }
    #[inline]
    fn get_keyed(
        &mut self,
        src: Rank,
        key: &[u8],
        offset: usize,
        into: &mut [u8],
    ) -> Result<u64, SendError> {
        self.rma(Rma::Get {
            src,
            from: Remote::Keyed { key, offset },
            into: Sink::Bytes(into),
        })
        .map(|d| d.flag)
    }
    #[inline]
    fn atomic_keyed(
        &mut self,
        dest: Rank,
        key: &[u8],
        offset: usize,
        atomic: Atomic,
    ) -> Result<(u64, u64), SendError> {
        self.rma(Rma::Atomic {
            dest,
            at: Remote::Keyed { key, offset },
            atomic,
        })
        .map(|d| (d.old, d.flag))
    }
}

impl<T: Transport + ?Sized> KeyedRequests for T {}

/// Implements [`Transport`] (or [`Tx`]) methods by forwarding them to another transport: the
/// one forwarding written once, for wrappers (which write what they change and forward the
/// rest) and enums of transports (which forward everything).
///
/// Inside an `impl Transport for W` (or `impl Tx for W`) block, name the methods to forward
/// after how the inner transport is reached:
/// - `forward_transport!(field inner; rank, size, info)`: to the field `self.inner` (a
///   tuple struct's `0` too);
/// - `forward_transport!(via m; rank, size, info)`: through a macro `m!(self, t => expr)` of
///   yours that evaluates `expr` with `t` bound to the inner transport (an enum's `match`).
///
/// The names are those of [`Transport`]'s methods and [`Tx::try_send`].
///
/// ```
/// use amnet::{forward_transport, Loopback, LoopbackConfig, Outgoing, Rank, SendError};
/// use amnet::{Transport, Tx};
///
/// /// A transport that counts the messages it sends and forwards the rest.
/// struct Counting {
///     inner: Loopback,
///     sent: u64,
/// }
///
/// impl Tx for Counting {
///     fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
///         self.sent += 1;
///         self.inner.try_send(dest, msg)
///     }
/// }
///
/// impl Transport for Counting {
///     forward_transport!(field inner; rank, size, info, segment, poll_recv, wait, wake_fd,
///         arm, disarm, flush, stats, rma, registration, close);
/// }
///
/// fn main() {
///     let inner = Loopback::cluster(1, LoopbackConfig::default()).pop().unwrap();
///     let c = Counting { inner, sent: 0 };
///     assert_eq!((c.info().name, c.size(), c.sent), ("loopback", 1, 0));
/// }
/// ```
#[macro_export]
macro_rules! forward_transport {
    (field $f:tt; $($m:ident),* $(,)?) => {
        $( $crate::forward_transport!(@one (field $f) $m); )*
    };
    (via $via:ident; $($m:ident),* $(,)?) => {
        $( $crate::forward_transport!(@one (via $via) $m); )*
    };
    (@call (field $f:tt) $s:ident, $t:ident => $e:expr) => {{
        let $t = &mut $s.$f;
        $e
    }};
    (@ref (field $f:tt) $s:ident, $t:ident => $e:expr) => {{
        let $t = &$s.$f;
        $e
    }};
    (@call (via $via:ident) $s:ident, $t:ident => $e:expr) => {
        $via!($s, $t => $e)
    };
    (@ref (via $via:ident) $s:ident, $t:ident => $e:expr) => {
        $via!($s, $t => $e)
    };
    (@one $how:tt try_send) => {
        #[inline]
        fn try_send(
            &mut self,
            dest: $crate::Rank,
            msg: &$crate::transport::Outgoing<'_>,
        ) -> ::core::result::Result<(), $crate::SendError> {
            $crate::forward_transport!(@call $how self, t => $crate::Tx::try_send(t, dest, msg))
        }
    };
    (@one $how:tt rank) => {
        #[inline]
        fn rank(&self) -> $crate::Rank {
            $crate::forward_transport!(@ref $how self, t => $crate::Transport::rank(t))
        }
    };
    (@one $how:tt size) => {
        #[inline]
        fn size(&self) -> u32 {
            $crate::forward_transport!(@ref $how self, t => $crate::Transport::size(t))
        }
    };
    (@one $how:tt info) => {
        #[inline]
        fn info(&self) -> $crate::transport::NicInfo {
            $crate::forward_transport!(@ref $how self, t => $crate::Transport::info(t))
        }
    };
    (@one $how:tt segment) => {
        #[inline]
        fn segment(&self) -> $crate::SharedBytes<'_> {
            $crate::forward_transport!(@ref $how self, t => $crate::Transport::segment(t))
        }
    };
    (@one $how:tt poll_recv) => {
        #[inline]
        fn poll_recv<R>(
            &mut self,
            f: impl FnOnce(
                $crate::transport::Delivery<'_>,
                $crate::SharedBytes<'_>,
                &mut dyn $crate::Tx,
            ) -> R,
        ) -> ::core::result::Result<::core::option::Option<R>, $crate::TransportError> {
            $crate::forward_transport!(@call $how self, t => $crate::Transport::poll_recv(t, f))
        }
    };
    (@one $how:tt wait) => {
        fn wait(
            &mut self,
            timeout: ::std::time::Duration,
        ) -> ::core::result::Result<(), $crate::TransportError> {
            $crate::forward_transport!(@call $how self, t => $crate::Transport::wait(t, timeout))
        }
    };
    (@one $how:tt wake_fd) => {
        fn wake_fd(
            &mut self,
        ) -> ::core::result::Result<
            ::core::option::Option<::std::os::fd::BorrowedFd<'_>>,
            $crate::TransportError,
        > {
            $crate::forward_transport!(@call $how self, t => $crate::Transport::wake_fd(t))
        }
    };
    (@one $how:tt arm) => {
        fn arm(&mut self) -> ::core::result::Result<$crate::Armed, $crate::TransportError> {
            $crate::forward_transport!(@call $how self, t => $crate::Transport::arm(t))
        }
    };
    (@one $how:tt disarm) => {
        fn disarm(&mut self) {
            $crate::forward_transport!(@call $how self, t => $crate::Transport::disarm(t))
        }
    };
    (@one $how:tt flush) => {
        fn flush(&mut self) {
            $crate::forward_transport!(@call $how self, t => $crate::Transport::flush(t))
        }
    };
    (@one $how:tt stats) => {
        fn stats(&self) -> $crate::NicStats {
            $crate::forward_transport!(@ref $how self, t => $crate::Transport::stats(t))
        }
    };
    (@one $how:tt rma) => {
        #[inline(always)]
        fn rma(
            &mut self,
            request: $crate::transport::Rma<'_>,
        ) -> ::core::result::Result<$crate::transport::RmaDone, $crate::SendError> {
            $crate::forward_transport!(@call $how self, t => $crate::Transport::rma(t, request))
        }
    };
    (@one $how:tt registration) => {
        fn registration(
            &mut self,
            change: $crate::transport::Registration<'_>,
        ) -> ::core::option::Option<::std::vec::Vec<u8>> {
            $crate::forward_transport!(@call $how self, t => $crate::Transport::registration(t, change))
        }
    };
    (@one $how:tt close) => {
        fn close(&mut self) {
            $crate::forward_transport!(@call $how self, t => $crate::Transport::close(t))
        }
    };
}

/// A range of one of this rank's own created segments, as a transport reads or writes it
/// ([`Source::Segment`], [`Sink::Segment`]): the segment's id, where the range starts in its
/// bytes (for a NIC that registered the segment and names its memory by registration and
/// offset), and the range itself.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct OwnRange<'a> {
    /// The segment's id at this rank (never segment 0: that is [`Source::Own`]).
    pub id: crate::types::SegmentId,
    /// Where `bytes` starts in the segment's bytes (a created segment's byte area: a
    /// registration of the segment, [`Registration::Register`], starts at its word area,
    /// `offset` plus the word area's length into it). The core registers a segment only at
    /// its first publication: a transport may find none for an `id` never published.
    pub offset: usize,
    /// The range.
    pub bytes: SharedBytes<'a>,
}

impl<'a> OwnRange<'a> {
    /// `bytes`, which start at `offset` of segment `id`.
    pub fn new(id: crate::types::SegmentId, offset: usize, bytes: SharedBytes<'a>) -> Self {
        OwnRange { id, offset, bytes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NicErrorKind;
    use crate::AmError;

    /// A NIC error keeps its meaning (its kind and its peer) as a core error, and a device
    /// failure keeps its cause as the source: nothing a caller can act on becomes a string.
    #[test]
    fn nic_errors_stay_typed_and_keep_their_source() {
        use std::error::Error;
        let cases = [
            (NicError::Busy, NicErrorKind::Busy, None),
            (NicError::PeerLost(3), NicErrorKind::PeerLost, Some(3)),
            (
                NicError::PeerDeparted(4),
                NicErrorKind::PeerDeparted,
                Some(4),
            ),
            (NicError::JobAborted, NicErrorKind::JobAborted, None),
            (NicError::TooLarge(9), NicErrorKind::TooLarge, None),
            (NicError::InvalidRank(5), NicErrorKind::InvalidRank, Some(5)),
            (
                NicError::NoRequestToAnswer(Route::new(3)),
                NicErrorKind::NoRequestToAnswer,
                None,
            ),
            (NicError::device("x"), NicErrorKind::Device, None),
        ];
        for (e, kind, peer) in cases {
            assert_eq!((e.kind(), e.peer()), (kind, peer), "{e:?}");
        }
        assert_eq!(
            AmError::from(NicError::PeerDeparted(4)),
            AmError::PeerDeparted(4)
        );
        assert_eq!(AmError::from(NicError::PeerLost(2)), AmError::PeerLost(2));
        assert_eq!(
            AmError::from(NicError::Busy),
            AmError::Transport(NicError::Busy)
        );
        let seg = am_shm::Segment::heap(0, 8).unwrap();
        let cause = || seg.byte_area().read(4, &mut [0; 8]).unwrap_err();
        let e = AmError::from(NicError::device_from("reading the ring", cause()));
        assert_eq!(e.to_string(), "reading the ring");
        let source = e.source().expect("the cause is the source");
        assert_eq!(source.to_string(), cause().to_string());
    }
}
