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
//! The segment is [`SharedBytes`] too: peers write it at any time (puts, Long payloads), so
//! it is reached only by copies and atomics, by the core, by handlers and by users alike.
//!
//! Every transport must deliver messages to self (`dest == rank()`), and deliver the messages
//! of one sender to one receiver in the order they were sent.

use std::os::fd::BorrowedFd;
use std::time::Duration;

pub use am_shm::SharedBytes;

use crate::atomic::{each_posted, Atomic, Batch, Posted};
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

/// What a NIC does itself beyond moving messages ([`Transport::capabilities`]): the core
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
    /// It writes into peers' segments without their attention ([`Transport::put`]).
    pub put: bool,
    /// It reads peers' segments without their attention ([`Transport::get`]).
    pub get: bool,
    /// It applies remote atomics on peers' words without their attention
    /// ([`Transport::atomic`], [`Transport::atomics`]).
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
    /// It registers created segments for peers' RMA ([`Transport::register_segment`]):
    /// a segment's publication carries the key blob it returns, and puts, gets and (where
    /// [`Capabilities::atomics`] is set) atomics on a peer's segment that published one go
    /// by [`Transport::put_at`], [`Transport::get_at`] and [`Transport::atomic_at`], with no
    /// message for the owner's progress. Used where [`Capabilities::map_segments`] is not.
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

/// A NIC as the core sees it. See the [module docs](self) for how NICs map onto it.
pub trait Transport: Tx {
    /// The transport's name as used by `--transport` (`loopback`, `sci`, ...).
    fn name(&self) -> &'static str;
    /// This rank.
    fn rank(&self) -> Rank;
    /// Number of ranks in the job.
    fn size(&self) -> u32;
    /// Size limits.
    fn limits(&self) -> Limits;
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
    /// armed, never per message otherwise; udp's is its socket. `None`: the transport has none, and a driver polls it without
    /// sleeping (the default, with [`Transport::arm`] always [`Armed::Ready`]).
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
    /// The credits a job on this transport gets where its [`crate::Config`] chooses none
    /// (no `AM_CREDITS`, no [`crate::Config::credits`]): enough requests in flight per peer to
    /// cover the transport's round trip at its message rate. The default, 32 static per
    /// peer ([`Credits::default`]), suits a round trip of a microsecond or less.
    fn default_credits(&self) -> Credits {
        Credits::default()
    }
    /// What this NIC does itself beyond moving messages ([`Capabilities`]). The core asks
    /// once per operation and never calls a method the NIC does not claim. The default:
    /// nothing, so the core does puts, gets and atomics by messages.
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    /// What the NIC counts of its own ([`crate::NicStats`]: refusals it retried itself,
    /// retransmissions), which [`crate::Node::stats`] adds to the core's counts. The default
    /// counts nothing.
    fn stats(&self) -> crate::NicStats {
        crate::NicStats::default()
    }
    /// Copies `data` into `dest`'s segment at `offset` without `dest`'s attention (one-sided
    /// RMA put), for a NIC whose [`Capabilities::put`] is set: once it returns `Ok`, the bytes
    /// are in the target's segment, which is both local completion (`data` may be reused)
    /// and remote completion. The core has checked the rank and the bounds, and does puts to
    /// its own rank itself. A lost target is [`SendError::PeerLost`], a departed one
    /// [`SendError::PeerDeparted`]; [`SendError::Busy`] means nothing was done yet (the core
    /// polls and asks again), as it does for [`Transport::get`] and [`Transport::atomic`].
    fn put(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<(), SendError> {
        let _ = (dest, offset, data);
        Err(SendError::Unsupported("put"))
    }
    /// Copies `data` into `dest`'s segment, region by region (`regions`, in order, their
    /// lengths adding up to `data.len()`: a strided or indexed put), for a NIC whose
    /// [`Capabilities::put`] is set, in as few NIC operations as it can:
    /// `Ok` once every region is in place, as [`Transport::put`]. The core has checked the
    /// rank, every region's bounds and the lengths. [`SendError::Busy`] may come after some
    /// regions were written: the core asks again, and they are written again (the same
    /// bytes). The default puts the regions one by one.
    fn put_regions(
        &mut self,
        dest: Rank,
        regions: crate::rma::Regions<'_>,
        data: &[u8],
    ) -> Result<(), SendError> {
        for (offset, bytes) in regions.pieces(data)? {
            self.put(dest, offset, bytes)?;
        }
        Ok(())
    }
    /// Reads `src`'s segment region by region (`regions`, in order, their lengths adding up to
    /// `dst.len()`: a strided or indexed get) into `dst`, for a NIC whose
    /// [`Capabilities::get`] is set: `Ok` once `dst` holds them all. Checked and failing as
    /// [`Transport::put_regions`]. The default gets the regions one by one.
    fn get_regions(
        &mut self,
        src: Rank,
        regions: crate::rma::Regions<'_>,
        dst: &mut [u8],
    ) -> Result<(), SendError> {
        for (offset, into) in regions.pieces_mut(dst)? {
            self.get(src, offset, into)?;
        }
        Ok(())
    }
    /// Copies `len` bytes at `local` of this rank's own segment to `offset` of `dest`'s, as
    /// [`Transport::put`] does with a slice: for a NIC whose [`Capabilities::put`] is set,
    /// complete when it returns. The core has checked both ranges. A NIC that reaches both
    /// segments copies from one to the other in one pass (no buffer in between, and no Rust
    /// reference over either: peers may write them meanwhile); the default reads the range
    /// into a buffer and puts that.
    fn put_from_segment(
        &mut self,
        dest: Rank,
        offset: usize,
        local: usize,
        len: usize,
    ) -> Result<(), SendError> {
        let mut bounce = vec![0u8; len];
        crate::rma::get_from(self.rank(), self.segment(), local, &mut bounce)?;
        self.put(dest, offset, &bounce)
    }
    /// Copies `len` bytes at `offset` of `src`'s segment to `local` of this rank's own, as
    /// [`Transport::get`] does into a slice: for a NIC whose [`Capabilities::get`] is set,
    /// complete when it returns. Checked, and by default through a buffer, as
    /// [`Transport::put_from_segment`].
    fn get_into_segment(
        &mut self,
        src: Rank,
        offset: usize,
        local: usize,
        len: usize,
    ) -> Result<(), SendError> {
        let mut bounce = vec![0u8; len];
        self.get(src, offset, &mut bounce)?;
        crate::rma::put_into(self.rank(), self.segment(), local, &bounce)
    }
    /// Copies all of `src`, a range of one of this rank's created segments, to `offset` of
    /// `dest`'s segment, as [`Transport::put_from_segment`] does from segment 0: for a NIC
    /// whose [`Capabilities::put`] is set, complete when it returns, checked by the core.
    /// A NIC that maps its peers' segments copies from one mapping to the other; the
    /// default reads the range into a buffer and puts that.
    fn put_from_own(
        &mut self,
        dest: Rank,
        offset: usize,
        src: OwnRange<'_>,
    ) -> Result<(), SendError> {
        through_bounce(self, src, Way::FromOwn, |t, bounce| {
            t.put(dest, offset, bounce)
        })
    }
    /// Copies `dst.bytes.len()` bytes at `offset` of `src`'s segment into `dst`, a range of
    /// one of this rank's created segments, as [`Transport::get_into_segment`] does into
    /// segment 0: for a NIC whose [`Capabilities::get`] is set, complete when it returns.
    /// The default gets the bytes into a buffer and writes them.
    fn get_into_own(
        &mut self,
        src: Rank,
        offset: usize,
        dst: OwnRange<'_>,
    ) -> Result<(), SendError> {
        through_bounce(self, dst, Way::IntoOwn, |t, bounce| {
            t.get(src, offset, bounce)
        })
    }
    /// Copies `dst.len()` bytes at `offset` of `src`'s segment into `dst` without `src`'s
    /// attention (one-sided RMA get), for a NIC whose [`Capabilities::get`] is set: `Ok` once
    /// `dst` holds them. Checked and failing as [`Transport::put`].
    fn get(&mut self, src: Rank, offset: usize, dst: &mut [u8]) -> Result<(), SendError> {
        let _ = (src, offset, dst);
        Err(SendError::Unsupported("get"))
    }
    /// Applies `atomic` to the word at `offset` of `dest`'s segment without `dest`'s
    /// attention, for a NIC whose [`Capabilities::atomics`] is set: the word's old value.
    /// Shared-memory NICs do it with one atomic instruction on the target's mapped word
    /// ([`crate::atomic::Atomic::apply`] on a view of it). The core has checked the rank,
    /// the bounds and the alignment. It applies a blocking or non-blocking atomic on its own
    /// rank itself, but hands posted ones on its own rank to [`Transport::atomics`] with the
    /// rest, so such a NIC reaches its own segment too. A word the NIC still cannot reach is
    /// [`SendError::Device`], a lost target [`SendError::PeerLost`].
    fn atomic(&mut self, dest: Rank, offset: usize, atomic: Atomic) -> Result<u64, SendError> {
        let _ = (dest, offset, atomic);
        Err(SendError::Unsupported("atomics"))
    }
    /// Applies the non-fetching atomics of `batch` in order, each as [`Transport::atomic`]
    /// would (the default does just that), for a NIC whose [`Capabilities::atomics`] is set.
    /// A NIC that reaches the words itself fetches them all first, so that their cache
    /// misses overlap ([`crate::atomic::apply_batch`]). One refused for good does not stop
    /// the others; a busy device stops the batch, and the core polls and hands over the rest
    /// again ([`crate::atomic::Batch`]).
    fn atomics(&mut self, batch: &[Posted]) -> Batch {
        each_posted(batch, |p| self.atomic(p.dest, p.offset, p.atomic).map(drop))
    }
    /// Registers all of `seg`, this rank's created segment `id` (its word area, then its byte
    /// area), for peers' RMA, for a NIC whose [`Capabilities::rma_segments`] is set: the key
    /// blob peers reach it by (at most 40 bytes), or `None` where it could not (peers then
    /// reach it by messages). The NIC keeps the memory mapped while it is registered (a
    /// [`am_shm::Segment::share`]). The core registers a segment once, before its first
    /// publication, and deregisters it at once if the key is longer than 40 bytes. The
    /// default registers nothing.
    fn register_segment(&mut self, id: u32, seg: &am_shm::Segment) -> Option<Vec<u8>> {
        let _ = (id, seg);
        None
    }
    /// Ends the registration of segment `id` ([`Transport::register_segment`]; none:
    /// nothing to do). The core calls it once the segment's free completed on a team of
    /// every rank it was published to, none of which operates on it any more.
    fn deregister_segment(&mut self, id: u32) {
        let _ = id;
    }
    /// Copies `data` to `offset` of the registration a peer's key blob `key` names at
    /// `dest` (offsets count from the segment's word area), as [`Transport::put`]: complete
    /// when it returns `Ok`, with the registration's first `u64` (its freed flag, where the
    /// core keeps it), read in flight beside the put, in no order with it. `key` came from
    /// the peer, untrusted: one this NIC cannot have made, or a range past what it names, is
    /// [`SendError::PeerMisbehaved`] naming `dest`. The core has checked the range against
    /// the published length.
    fn put_at(
        &mut self,
        dest: Rank,
        key: &[u8],
        offset: usize,
        data: &[u8],
    ) -> Result<u64, SendError> {
        let _ = (dest, key, offset, data);
        Err(SendError::Unsupported("put_at"))
    }
    /// Copies all of `src`, a range of one of this rank's created segments, to `offset` of
    /// the registration `key` names at `dest`, as [`Transport::put_at`] does with a slice
    /// (checked and failing the same way, with the registration's first `u64` read beside
    /// it): a NIC that registered `src`'s segment ([`Transport::register_segment`]) writes
    /// straight from its memory. The default reads the range into a buffer and puts that.
    fn put_at_from_own(
        &mut self,
        dest: Rank,
        key: &[u8],
        offset: usize,
        src: OwnRange<'_>,
    ) -> Result<u64, SendError> {
        through_bounce(self, src, Way::FromOwn, |t, bounce| {
            t.put_at(dest, key, offset, bounce)
        })
    }
    /// Copies `dst.len()` bytes at `offset` of the registration `key` names at `src` into
    /// `dst`, as [`Transport::get`], with the registration's first `u64` read beside it and
    /// checked, as [`Transport::put_at`].
    fn get_at(
        &mut self,
        src: Rank,
        key: &[u8],
        offset: usize,
        dst: &mut [u8],
    ) -> Result<u64, SendError> {
        let _ = (src, key, offset, dst);
        Err(SendError::Unsupported("get_at"))
    }
    /// Applies `atomic` to the word at `offset` of the registration `key` names at `dest`,
    /// as [`Transport::atomic`], checked as [`Transport::put_at`]: the word's old value, and
    /// the registration's first `u64` read beside it.
    fn atomic_at(
        &mut self,
        dest: Rank,
        key: &[u8],
        offset: usize,
        atomic: Atomic,
    ) -> Result<(u64, u64), SendError> {
        let _ = (dest, key, offset, atomic);
        Err(SendError::Unsupported("atomic_at"))
    }
    /// The process is about to end ([`crate::Node::exit`]): deliver what was already sent
    /// (bounded in time) and tell the peers this rank is leaving. Nothing is sent afterwards.
    /// The default does nothing: transports whose sends complete at once need no lingering.
    fn close(&mut self) {}
}

/// A range of one of this rank's own created segments, as a transport reads or writes it
/// ([`Transport::put_from_own`], [`Transport::get_into_own`]): the segment's id, where the
/// range starts in its bytes (for a NIC that registered the segment and names its memory
/// by registration and offset), and the range itself.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct OwnRange<'a> {
    /// The segment's id at this rank (never segment 0).
    pub id: crate::types::SegmentId,
    /// Where `bytes` starts in the segment's bytes (its byte area: a registration of the
    /// segment, [`Transport::register_segment`], starts at its word area, `offset` plus the
    /// word area's length into it). The core registers a segment only at its first
    /// publication: a transport may find none for an `id` never published.
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

/// Which way [`through_bounce`] moves the bytes of a created segment's range.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Read out of the range before the transfer: a put from it.
    FromOwn,
    /// Written into the range after the transfer: a get into it.
    IntoOwn,
}

/// The default of [`Transport::put_from_own`], [`Transport::get_into_own`] and
/// [`Transport::put_at_from_own`]: the transfer goes by a buffer of `range`'s length instead
/// of the range itself. `transfer` is the transport's transfer by slice (a put from the
/// buffer, or a get into it); the range is copied into the buffer before it
/// ([`Way::FromOwn`]), or the buffer into the range once it succeeded ([`Way::IntoOwn`]),
/// by [`crate::rma`]'s copies, which hold no Rust reference over the range (peers may write
/// it meanwhile).
fn through_bounce<T, R>(
    t: &mut T,
    range: OwnRange<'_>,
    way: Way,
    transfer: impl FnOnce(&mut T, &mut [u8]) -> Result<R, SendError>,
) -> Result<R, SendError>
where
    T: Transport + ?Sized,
{
    let mut bounce = vec![0u8; range.bytes.len()];
    if way == Way::FromOwn {
        crate::rma::get_from(t.rank(), range.bytes, 0, &mut bounce)?;
    }
    let done = transfer(t, &mut bounce)?;
    if way == Way::IntoOwn {
        crate::rma::put_into(t.rank(), range.bytes, 0, &bounce)?;
    }
    Ok(done)
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
