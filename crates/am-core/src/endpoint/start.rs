//! Operations' definitions: how each starts on an [`Endpoint`] and is sent until it is
//! locally complete ([`Start`]), and the one list from which every driver writes its
//! methods (see [`crate::op`] for the names and the handle they return).

use std::borrow::Cow;
use std::task::{ready, Poll};

use super::Endpoint;
use crate::atomic::{AtomicOp, AtomicWord};
use crate::call::Reply;
use crate::error::AmError;
use crate::handler::Threading;
use crate::op::{Op, Outcome};
use crate::reduce::{Element, ReduceOp};
use crate::team::Team;
use crate::transport::Transport;
use crate::types::{AmKind, HandlerId, Rank};

/// An operation's definition: how it starts on an [`Endpoint`], and how it is sent until it
/// is locally complete. Every driver's `x` and `x_nb` are these two steps, taken until ready
/// with progress in between, then (for `x`) the wait for its [`Op`]; a driver of one's own
/// does the same (see the [module docs](crate::endpoint)).
///
/// Both steps are re-entrant: `Pending` means nothing was lost, make progress and call again.
pub trait Start {
    /// What the operation completes with.
    type Output: Outcome;

    /// Starts the operation: `Pending` while it cannot start yet (posted atomics or the
    /// device wait), an error if it never can (nothing was done then).
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Self::Output>, AmError>>;

    /// Sends what the operation still has to send (chunks waiting for credits): ready once
    /// it is locally complete. After an error nothing more is sent; the handle, dropped,
    /// lets what was sent complete.
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<Self::Output>,
    ) -> Poll<Result<(), AmError>> {
        let _ = (ep, t, op);
        Poll::Ready(Ok(()))
    }
}

/// A put: `data` into `dest`'s segment at `offset`. Where the transport reaches the target's memory
/// ([`Rma::Put`](crate::transport::Rma::Put)) it is one copy into it, complete when started,
/// whether or not the target polls; elsewhere it goes as AM Longs that the target's progress
/// acknowledges. A put to this rank is a copy into its own segment. A range outside the segment is
/// an error when it starts, and nothing is written.
///
/// Puts are not ordered with this rank's AMs or with each other; a later request to the
/// target, a barrier or a quiesce after the completion publishes them.
#[derive(Debug, Clone, Copy)]
pub struct Put<'a> {
    /// The target.
    pub dest: Rank,
    /// Where in its segment.
    pub offset: usize,
    /// The bytes.
    pub data: &'a [u8],
}

impl Start for Put<'_> {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.put_start(t, self.dest, self.offset, self.data)
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        ep.put_step(t, op, self.data)
    }
}

/// A strided or indexed put: `data` into `dest`'s segment region by region, in one call
/// (GASNet-EX's VIS `gex_VIS_IndexedPut`/`StridedPut`, OpenSHMEM's `shmem_iput`, Chapel's
/// `put_strd`). Where the transport reaches the target's memory it is one copy per region
/// ([`Remote::Regions`](crate::transport::Remote::Regions)), complete when started; elsewhere the
/// regions go packed into as few system Mediums as they fit, each written whole by the target's
/// progress. Regions outside the segment, or whose lengths do not describe `data`, are an error
/// when it starts, and nothing is written. Made by [`PutRegions::indexed`] or
/// [`PutRegions::strided`].
#[derive(Debug, Clone, Copy)]
pub struct PutRegions<'a> {
    dest: Rank,
    regions: Result<crate::rma::Regions<'a>, &'static str>,
    data: &'a [u8],
}

impl<'a> PutRegions<'a> {
    /// `data` into the regions (offset, length) of `dest`'s segment, in order: the lengths
    /// add up to `data.len()`.
    pub fn indexed(dest: Rank, regions: &'a [(usize, usize)], data: &'a [u8]) -> Self {
        PutRegions {
            dest,
            regions: Ok(crate::rma::Regions::Indexed(regions)),
            data,
        }
    }

    /// `data`, blocks of `block` bytes, into `dest`'s segment one every `stride` bytes from
    /// `offset` (a column of a row-major 2-D array: `block` the element, `stride` the row):
    /// `data.len()` is a whole number of blocks.
    pub fn strided(dest: Rank, offset: usize, stride: usize, block: usize, data: &'a [u8]) -> Self {
        let regions = if block == 0 {
            Err("a block of 0 bytes")
        } else if !data.len().is_multiple_of(block) {
            Err("the data is not a whole number of blocks")
        } else {
            Ok(crate::rma::Regions::Strided {
                offset,
                stride,
                block,
                count: data.len() / block,
            })
        };
        PutRegions {
            dest,
            regions,
            data,
        }
    }
}

impl Start for PutRegions<'_> {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        match self.regions {
            Ok(r) => ep.put_regions_start(t, self.dest, r, self.data),
            Err(why) => Poll::Ready(Err(AmError::InvalidRegions(why))),
        }
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        ep.put_regions_step(t, op, self.data)
    }
}

/// A strided or indexed get: regions of `src`'s segment, in order, into a new `Vec`, in one call
/// (GASNet-EX's VIS gets, OpenSHMEM's `shmem_iget`). Where the transport reaches the source's
/// memory it is one copy per region ([`Remote::Regions`](crate::transport::Remote::Regions)),
/// complete when started; elsewhere one request per region (per Medium of a larger one), answered
/// by the source's progress. Regions outside the segment are an error when it starts. Made by
/// [`GetRegions::indexed`] or [`GetRegions::strided`].
#[derive(Debug, Clone, Copy)]
pub struct GetRegions<'a> {
    src: Rank,
    regions: Result<crate::rma::Regions<'a>, &'static str>,
}

impl<'a> GetRegions<'a> {
    /// The regions (offset, length) of `src`'s segment, in order.
    pub fn indexed(src: Rank, regions: &'a [(usize, usize)]) -> Self {
        GetRegions {
            src,
            regions: Ok(crate::rma::Regions::Indexed(regions)),
        }
    }

    /// `count` blocks of `block` bytes of `src`'s segment, one every `stride` bytes from
    /// `offset` (a column of a row-major array).
    pub fn strided(src: Rank, offset: usize, stride: usize, block: usize, count: usize) -> Self {
        let regions = if block == 0 {
            Err("a block of 0 bytes")
        } else {
            Ok(crate::rma::Regions::Strided {
                offset,
                stride,
                block,
                count,
            })
        };
        GetRegions { src, regions }
    }
}

impl Start for GetRegions<'_> {
    type Output = Vec<u8>;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Vec<u8>>, AmError>> {
        match self.regions {
            Ok(r) => ep.get_regions_start(t, self.src, r),
            Err(why) => Poll::Ready(Err(AmError::InvalidRegions(why))),
        }
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<Vec<u8>>,
    ) -> Poll<Result<(), AmError>> {
        ep.get_step(t, op)
    }
}

/// A put-with-signal (OpenSHMEM's `shmem_put_signal`): `data` into `dest`'s segment at
/// `offset`, then `signal` applied to the `u64` word at `signal_at` there, never before the
/// data is in place, so that a target that sees the signal ([`crate::Node::wait_word`]) reads
/// the data. Complete once the signal was applied. Where the transport reaches the target's
/// memory the data (and, where it applies atomics, the signal) is written when it starts and
/// one message follows that wakes a target asleep in `wait_word` (`AM_WAIT=block`, an async
/// driver); elsewhere the data's AM Longs are followed by the signal as a message the
/// target's progress applies. A range outside the segment, or a signal word misaligned or
/// outside it, is an error when it starts, and nothing is written.
#[derive(Debug, Clone, Copy)]
pub struct PutSignal<'a> {
    /// The target.
    pub dest: Rank,
    /// Where the data goes in its segment.
    pub offset: usize,
    /// The bytes.
    pub data: &'a [u8],
    /// The signal word's offset in its segment (8-aligned).
    pub signal_at: usize,
    /// What is done to the signal word.
    pub signal: crate::atomic::Signal,
}

impl Start for PutSignal<'_> {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.put_signal_start(
            t,
            self.dest,
            self.offset,
            self.data,
            self.signal_at,
            self.signal,
        )
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        ep.put_signal_step(t, op, self.data)
    }
}

/// A get: `len` bytes at `offset` of `src`'s segment, into a new `Vec`. Where the transport reaches
/// the target's memory ([`Rma::Get`](crate::transport::Rma::Get)) or `src` is this rank, the bytes
/// are read when it starts, with no help from `src`; elsewhere `src`'s progress answers system
/// messages for them. A range outside the segment is an error when it starts.
#[derive(Debug, Clone, Copy)]
pub struct Get {
    /// The rank read from.
    pub src: Rank,
    /// Where in its segment.
    pub offset: usize,
    /// How many bytes.
    pub len: usize,
}

impl Start for Get {
    type Output = Vec<u8>;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Vec<u8>>, AmError>> {
        ep.get_start(t, self.src, self.offset, self.len)
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<Vec<u8>>,
    ) -> Poll<Result<(), AmError>> {
        ep.get_step(t, op)
    }
}

/// A put from this rank's own segment: `len` bytes at `local` of it to `offset` of `dest`'s
/// segment, with no slice of the caller's in between (GASNet-EX's puts from a bound segment,
/// OpenSHMEM's `shmem_putmem` from symmetric memory). Where the transport writes peers' memory
/// ([`Source::Own`](crate::transport::Source::Own)) it is one copy from mapping to mapping,
/// complete when it starts; elsewhere the range is read into a buffer of the operation's and goes
/// as [`Put`] does. Either range outside the segment is an error when it starts, and nothing is
/// written. The source range is read when the operation starts (at its end over messages): writes
/// to it meanwhile may or may not be seen.
#[derive(Debug, Clone)]
pub struct PutFromSegment {
    /// The target.
    pub dest: Rank,
    /// Where in its segment.
    pub offset: usize,
    /// Where in this rank's segment the bytes are.
    pub local: usize,
    /// How many.
    pub len: usize,
    /// The bytes, where they go as messages.
    bounce: Vec<u8>,
}

impl PutFromSegment {
    /// `len` bytes at `local` of this rank's segment to `offset` of `dest`'s.
    pub fn new(dest: Rank, offset: usize, local: usize, len: usize) -> PutFromSegment {
        PutFromSegment {
            dest,
            offset,
            local,
            len,
            bounce: Vec::new(),
        }
    }
}

impl Start for PutFromSegment {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.put_from_segment_start(
            t,
            self.dest,
            self.offset,
            self.local,
            self.len,
            &mut self.bounce,
        )
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        ep.put_step(t, op, &self.bounce)
    }
}

/// A get into this rank's own segment: `len` bytes at `offset` of `src`'s segment to
/// `local` of this rank's, with no buffer of the caller's in between. Where the transport
/// reads peers' memory ([`Sink::Own`](crate::transport::Sink::Own)) it is one copy from mapping to
/// mapping, complete when it starts; elsewhere the bytes come as [`Get`]'s do and are
/// written at `local` when they have all come, which the operation's sending step waits
/// for (so over messages its `_nb` form returns once they are in place). Either range
/// outside the segment is an error when it starts, and nothing is written.
#[derive(Debug)]
pub struct GetIntoSegment {
    /// The source.
    pub src: Rank,
    /// Where in its segment.
    pub offset: usize,
    /// Where in this rank's segment the bytes go.
    pub local: usize,
    /// How many.
    pub len: usize,
    /// The get over messages, until its bytes are written.
    by_messages: Option<Op<Vec<u8>>>,
}

impl GetIntoSegment {
    /// `len` bytes at `offset` of `src`'s segment to `local` of this rank's.
    pub fn new(src: Rank, offset: usize, local: usize, len: usize) -> GetIntoSegment {
        GetIntoSegment {
            src,
            offset,
            local,
            len,
            by_messages: None,
        }
    }
}

impl Start for GetIntoSegment {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        self.by_messages =
            ready!(ep.get_into_segment_start(t, self.src, self.offset, self.local, self.len))?;
        Poll::Ready(Ok(Op::ready(crate::op::Raw::Unit)))
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        let _ = op;
        write_got(
            ep,
            t,
            &mut self.by_messages,
            crate::segment::SegmentId::ZERO,
            self.local,
        )
    }
}

/// A put between segments named by id and offset: `len` bytes at `local_offset` of this rank's
/// segment `local` (0 or one it created) to `offset` of a published segment, with no slice of the
/// caller's in between, so that no borrow of a segment's bytes spans the call. Both on segment 0 it
/// is a [`PutFromSegment`]. Where this rank reaches the target's memory (its own segments, a peer's
/// it maps, and a peer's segment 0 where the transport copies from a created segment itself,
/// [`Source::Segment`](crate::transport::Source::Segment): loopback, sci, extoll, portals, and ofi
/// from a published created segment, by RMA straight from its registration) it is one copy from
/// mapping to mapping, complete when it starts; elsewhere the range is read into a buffer of the
/// operation's when it starts and goes as [`PutTo`] does. The source range is read when the
/// operation starts: writes to it afterwards are not seen. An unknown or freed segment on either
/// side is [`crate::AmError::UnknownSegment`], either range outside its segment
/// [`crate::AmError::SegmentOutOfBounds`], both when it starts, with nothing written.
#[derive(Debug, Clone)]
pub struct PutToFromSegment {
    /// The target segment.
    pub remote: crate::segment::RemoteSegment,
    /// Where in it.
    pub offset: usize,
    /// The source: one of this rank's segments.
    pub local: crate::segment::SegmentId,
    /// Where in it the bytes are.
    pub local_offset: usize,
    /// How many.
    pub len: usize,
    /// The bytes, where they go as messages or from a buffer.
    bounce: Vec<u8>,
}

impl PutToFromSegment {
    /// `len` bytes at `local_offset` of this rank's segment `local` to `offset` of `remote`.
    pub fn new(
        remote: &crate::segment::RemoteSegment,
        offset: usize,
        local: crate::segment::SegmentId,
        local_offset: usize,
        len: usize,
    ) -> Self {
        PutToFromSegment {
            remote: *remote,
            offset,
            local,
            local_offset,
            len,
            bounce: Vec::new(),
        }
    }
}

impl Start for PutToFromSegment {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.put_to_from_segment_start(
            t,
            &self.remote,
            self.offset,
            self.local,
            self.local_offset,
            self.len,
            &mut self.bounce,
        )
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        ep.put_step(t, op, &self.bounce)
    }
}

/// A get between segments named by id and offset: `len` bytes at `offset` of a published segment to
/// `local_offset` of this rank's segment `local` (0 or one it created), with no buffer of the
/// caller's in between. Both on segment 0 it is a [`GetIntoSegment`]. Where this rank reaches the
/// source's memory (as [`PutToFromSegment`]; [`Sink::Segment`](crate::transport::Sink::Segment)) it
/// is one copy from mapping to mapping; through a registered segment the transport's RMA into a
/// buffer, then a copy into place; both complete when it starts. Elsewhere the bytes come as
/// [`GetFrom`]'s do and are written at `local_offset` when they have all come, which the
/// operation's sending step waits for (so over messages its `_nb` form returns once they are in
/// place); a `local` freed meanwhile is [`crate::AmError::UnknownSegment`] naming this rank.
/// Checked as [`PutToFromSegment`].
#[derive(Debug)]
pub struct GetFromIntoSegment {
    /// The source segment.
    pub remote: crate::segment::RemoteSegment,
    /// Where in it.
    pub offset: usize,
    /// The destination: one of this rank's segments.
    pub local: crate::segment::SegmentId,
    /// Where in it the bytes go.
    pub local_offset: usize,
    /// How many.
    pub len: usize,
    /// The get over messages, until its bytes are written.
    by_messages: Option<Op<Vec<u8>>>,
}

impl GetFromIntoSegment {
    /// `len` bytes at `offset` of `remote` to `local_offset` of this rank's segment `local`.
    pub fn new(
        remote: &crate::segment::RemoteSegment,
        offset: usize,
        local: crate::segment::SegmentId,
        local_offset: usize,
        len: usize,
    ) -> Self {
        GetFromIntoSegment {
            remote: *remote,
            offset,
            local,
            local_offset,
            len,
            by_messages: None,
        }
    }
}

impl Start for GetFromIntoSegment {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        self.by_messages = ready!(ep.get_from_into_segment_start(
            t,
            &self.remote,
            self.offset,
            self.local,
            self.local_offset,
            self.len
        ))?;
        Poll::Ready(Ok(Op::ready(crate::op::Raw::Unit)))
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        let _ = op;
        write_got(ep, t, &mut self.by_messages, self.local, self.local_offset)
    }
}

/// The sending step of a get into one of this rank's segments: the get by messages (if
/// any) sent and completed, then its bytes written at `at` of segment `into` (one freed
/// meanwhile is [`AmError::UnknownSegment`] naming this rank).
fn write_got<H: Threading, T: Transport + ?Sized>(
    ep: &mut Endpoint<H>,
    t: &mut T,
    by_messages: &mut Option<Op<Vec<u8>>>,
    into: crate::segment::SegmentId,
    at: usize,
) -> Poll<Result<(), AmError>> {
    let Some(get) = by_messages.as_mut() else {
        return Poll::Ready(Ok(()));
    };
    ready!(ep.get_step(t, get))?;
    let bytes = ready!(ep.poll_op(t, get, None))?;
    *by_messages = None;
    let gone = AmError::UnknownSegment {
        rank: ep.rank(),
        id: into,
    };
    let to = ep.segment_at(t, into).ok_or(gone)?;
    crate::rma::put_into(ep.rank(), to, at, &bytes).map_err(AmError::from)?;
    Poll::Ready(Ok(()))
}

/// A get into a buffer of the caller's (OpenSHMEM's `shmem_getmem_nbi`): `dst.len()` bytes at
/// `offset` of `src`'s segment. The handle holds `dst` until it completes, and gives it back
/// filled. Where the transport reaches the target's memory the bytes are in `dst` when it
/// starts; elsewhere they are copied there on completion. A range outside the segment is an
/// error when it starts, and `dst` is left as it was.
#[derive(Debug)]
pub struct GetInto<'b> {
    /// The rank read from.
    pub src: Rank,
    /// Where in its segment.
    pub offset: usize,
    /// The buffer, until the handle takes it.
    pub dst: Option<&'b mut [u8]>,
}

impl<'b> Start for GetInto<'b> {
    type Output = &'b mut [u8];
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<&'b mut [u8]>, AmError>> {
        let Some(dst) = self.dst.as_deref_mut() else {
            return Poll::Ready(Err(AmError::StaleHandle));
        };
        let op = ready!(ep.get_into_start(t, self.src, self.offset, dst))?;
        let dst = self.dst.take().ok_or(AmError::StaleHandle)?;
        Poll::Ready(Ok(op.filling(dst)))
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<&'b mut [u8]>,
    ) -> Poll<Result<(), AmError>> {
        ep.get_step(t, op)
    }
}

/// A remote atomic on the aligned word (`u32`, `u64`, `i32`, `i64`, `f32` or `f64`) at `offset` of
/// `dest`'s segment ([`AtomicOp`]; see [`crate::atomic`] for the ordering), completing with the
/// word's old value. Where the transport reaches the target's memory (the shared-memory NICs and
/// [`crate::Loopback`]) it is one atomic instruction on the target's word, done when it starts,
/// whether or not the target polls; elsewhere it travels as a system message that the target's
/// progress applies. A word outside the segment or misaligned, or a bitwise operation on a float,
/// is an error when it starts, and nothing is done.
#[derive(Debug, Clone, Copy)]
pub struct Atomic<W: AtomicWord> {
    /// The target.
    pub dest: Rank,
    /// The word's offset in its segment.
    pub offset: usize,
    /// What to do to it.
    pub op: AtomicOp<W>,
}

impl<W: AtomicWord + Outcome> Start for Atomic<W> {
    type Output = W;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<W>, AmError>> {
        ep.atomic_start(t, self.dest, self.offset, self.op)
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<W>,
    ) -> Poll<Result<(), AmError>> {
        ep.atomic_step(t, op)
    }
}

/// A call: `handler` on `dest` (registered with [`crate::Handlers::callable`]) with `args`
/// (at most 15) and `payload` (at most the largest AM Medium), completing with the arguments
/// and payload it answered with ([`Reply`]), with no reply handler of the caller's. It fails
/// as a request does, and with the peer's loss or departure if it goes before it answers.
/// Dropping its handle gives the call up: a late answer is dropped.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    dest: Rank,
    handler: HandlerId,
    /// The request's arguments, kept inline (a call's are few) so that an owned call
    /// allocates nothing: the call's number (filled when it starts), then the caller's.
    /// `len` counts both; more than fit is refused when the call starts.
    words: [u32; crate::wire::MAX_ARGS],
    len: usize,
    payload: Cow<'a, [u8]>,
}

impl<'a> Call<'a> {
    /// A call of `handler` on `dest` with `args` and `payload` (borrowed until it starts).
    pub fn new(dest: Rank, handler: HandlerId, args: &[u32], payload: &'a [u8]) -> Call<'a> {
        let mut words = [0; crate::wire::MAX_ARGS];
        if let Some(rest) = words.get_mut(1..=args.len()) {
            rest.copy_from_slice(args);
        }
        Call {
            dest,
            handler,
            words,
            len: args.len() + 1,
            payload: Cow::Borrowed(payload),
        }
    }

    /// The same call owning its payload (for a future that outlives it).
    pub fn into_owned(self) -> Call<'static> {
        Call {
            dest: self.dest,
            handler: self.handler,
            words: self.words,
            len: self.len,
            payload: Cow::Owned(self.payload.into_owned()),
        }
    }
}

/// A typed value on its way to `dest` ([`crate::typed`]), the part [`TypedCall`],
/// [`PostTyped`] and [`AnswerTyped`] share: encoded when made, unless it is longer than
/// [`LATE_FROM`](crate::typed::LATE_FROM) bytes: such a value is encoded
/// when it starts ([`Outbound::encode_late`]), straight into the staging segment where it
/// moves by rendezvous. A value larger than the transport's largest Medium and not moved so
/// leaves as parts ahead of the message that carries its last piece
/// ([`crate::typed::Transit`]).
struct Outbound {
    dest: Rank,
    /// The value's type, for diagnostics.
    name: &'static str,
    /// The value's bytes (empty while it is to be encoded when it starts, or once encoded
    /// into the staging segment), or why it could not be encoded.
    bytes: Result<Vec<u8>, AmError>,
    /// Once started: the message's handler, the part handler, the message's words (the
    /// caller's, then the parts' stream if any, or the rendezvous' release word and mark)
    /// and how many there are.
    site: Option<(HandlerId, HandlerId, [u32; 5], usize)>,
    /// Bytes sent ahead as parts.
    sent: usize,
    /// While parts have left but not the message that ends them: where the stream's cancel
    /// is queued if this is dropped (the target would hold them for ever).
    half_sent: Option<std::sync::Arc<crate::typed::Transit>>,
    /// A value moved by rendezvous ([`crate::typed::staging`]), until its descriptor
    /// leaves: freed if this is dropped first.
    staged: Option<Box<Staging>>,
}

/// A value staged for a rendezvous, where to free it, and whether it was encoded straight
/// into the staging segment (its bytes are only there).
type Staging = (
    std::sync::Arc<crate::typed::Transit>,
    crate::typed::staging::Staged,
    bool,
);

impl Drop for Outbound {
    fn drop(&mut self) {
        if let (Some(transit), Some((_, _, words, n))) = (self.half_sent.take(), &self.site) {
            transit.cancel(self.dest, words[*n - 1]);
        }
        self.unstage();
        if let Ok(bytes) = &mut self.bytes {
            if bytes.capacity() >= crate::typed::staging::RENDEZVOUS_MIN {
                crate::typed::recycle(std::mem::take(bytes));
            }
        }
    }
}

impl std::fmt::Debug for Outbound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbound")
            .field("dest", &self.dest)
            .field("type", &self.name)
            .field("len", &self.bytes.as_ref().map(Vec::len))
            .field("staged", &self.staged.as_ref().map(|s| s.1.len()))
            .finish()
    }
}

type TypedHandlers<'a> = (
    HandlerId,
    HandlerId,
    HandlerId,
    HandlerId,
    &'a crate::typed::Transit,
);

/// The typed handlers of `ep`'s table (call, post, part, answer) and its shared state.
fn typed_handlers<'a, H: Threading>(
    ep: &'a Endpoint<H>,
    name: &'static str,
) -> Result<TypedHandlers<'a>, AmError> {
    match &ep.handlers.typed_site {
        Some(s) => Ok((s.call, s.post, s.part, s.answer, &s.transit)),
        None => Err(AmError::TypedNotRegistered(name)),
    }
}

/// The id words of `M`, if this rank registers it.
fn typed_id<M: crate::typed::Am, H: Threading>(ep: &Endpoint<H>) -> Result<[u32; 2], AmError> {
    let id = crate::typed::type_id::<M>();
    if ep.handlers.typed.contains_key(&id) {
        Ok(crate::typed::id_words(id))
    } else {
        Err(AmError::TypedNotRegistered(std::any::type_name::<M>()))
    }
}

impl Outbound {
    /// `value` to `dest`, and whether it is still to be encoded ([`Outbound::encode_late`]).
    fn new<T: serde::Serialize>(dest: Rank, value: &T) -> (Self, bool) {
        let (bytes, late) = match crate::typed::encoded_small(value) {
            Ok(Some(bytes)) => (Ok(bytes), false),
            Ok(None) => (Ok(Vec::new()), true),
            Err(e) => (Err(e), false),
        };
        let out = Outbound {
            dest,
            name: std::any::type_name::<T>(),
            bytes,
            site: None,
            sent: 0,
            half_sent: None,
            staged: None,
        };
        (out, late)
    }

    /// Encodes `value`, longer than a small value, as it starts on `ep`, once
    /// ([`crate::typed::Transit::encode_late`]): straight into this rank's staging segment
    /// where it will move by rendezvous (a value longer than a Medium, on a transport that
    /// maps segments, with room for it), else into a private buffer.
    #[cold]
    #[inline(never)]
    fn encode_late<T: serde::Serialize, H: Threading>(&mut self, ep: &Endpoint<H>, value: &T) {
        let Some(site) = &ep.handlers.typed_site else {
            self.bytes = crate::typed::encoded(value);
            return;
        };
        let transit = &site.transit;
        match transit.encode_late(self.dest, value, ep.limits.max_medium) {
            Ok(crate::typed::Late::Bytes(bytes)) => self.bytes = Ok(bytes),
            Ok(crate::typed::Late::Staged(staged)) => {
                self.staged = Some(Box::new((transit.clone(), staged, true)));
            }
            Err(e) => self.bytes = Err(e),
        }
    }

    #[inline]
    fn unstage(&mut self) {
        if self.staged.is_some() {
            self.unstage_cold();
        }
    }

    #[cold]
    fn unstage_cold(&mut self) {
        if let Some(s) = self.staged.take() {
            s.0.unstage(&s.1);
        }
    }

    /// Checks the value against the bounds and fixes its message: `handler` with `words`,
    /// then the parts' stream if it goes in parts, or the release word and the mark of a
    /// rendezvous if it moves so. The length of the last piece (or of the rendezvous'
    /// descriptor), which the message carries.
    fn prepare<H: Threading>(
        &mut self,
        ep: &Endpoint<H>,
        handler: HandlerId,
        words: &[u32],
    ) -> Result<usize, AmError> {
        let (_, _, part, _, transit) = typed_handlers(ep, self.name)?;
        let mut all = [0; 5];
        all[..words.len()].copy_from_slice(words);
        let mut n = words.len();
        if let Some(s) = self.staged.as_ref().filter(|s| s.2) {
            all[n..n + 2].copy_from_slice(&[s.1.slot, crate::typed::staging::RENDEZVOUS]);
            self.site = Some((handler, part, all, n + 2));
            return Ok(s.1.desc.len());
        }
        let len = self.bytes.as_ref().map_err(Clone::clone)?.len();
        if len > crate::typed::MAX_LEN {
            return Err(AmError::TypedTooLarge {
                len,
                max: crate::typed::MAX_LEN,
            });
        }
        let max = ep.limits.max_medium.max(1);
        self.unstage();
        use crate::typed::staging::{RENDEZVOUS_MAX, RENDEZVOUS_MIN};
        if len > max && (RENDEZVOUS_MIN..=RENDEZVOUS_MAX).contains(&len) {
            if let Some((slot, desc)) = self.stage(ep) {
                all[n..n + 2].copy_from_slice(&[slot, crate::typed::staging::RENDEZVOUS]);
                self.site = Some((handler, part, all, n + 2));
                return Ok(desc);
            }
        }
        let ahead = crate::typed::ahead_of_last(len, max);
        if ahead > 0 {
            let (first, k) = crate::typed::part_words(0, 0, len);
            ep.check_request(self.dest, AmKind::Medium, part, &first[..k], max, None)?;
            all[n] = transit.next_stream();
            n += 1;
        }
        self.site = Some((handler, part, all, n));
        Ok(len - ahead)
    }

    /// Stages the value for a rendezvous ([`crate::typed::staging`]), if the transport
    /// allows and the staging segment has room: its release word and the length of its
    /// descriptor.
    #[cold]
    fn stage<H: Threading>(&mut self, ep: &Endpoint<H>) -> Option<(u32, usize)> {
        let transit = &ep.handlers.typed_site.as_ref()?.transit;
        let staged = transit.stage(self.dest, self.bytes.as_ref().ok()?)?;
        let s = self
            .staged
            .insert(Box::new((transit.clone(), staged, false)));
        Some((s.1.slot, s.1.desc.len()))
    }

    /// A step of sending the parts ahead of the last piece: `Ready(Ok)` with the message's
    /// handler, words and last piece once all have left.
    fn send_parts<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<LastPiece<'_>, AmError>> {
        let (Some((handler, part, words, n)), Ok(bytes)) = (&self.site, &self.bytes) else {
            return Poll::Ready(Err(AmError::StaleHandle));
        };
        if let Some(s) = &self.staged {
            return Poll::Ready(Ok((*handler, &words[..*n], &s.1.desc)));
        }
        let max = ep.limits.max_medium.max(1);
        let len = bytes.len();
        let ahead = crate::typed::ahead_of_last(len, max);
        while self.sent < ahead {
            let piece = &bytes[self.sent..self.sent + max];
            let (args, k) = crate::typed::part_words(words[*n - 1], (self.sent / max) as u32, len);
            let kind = AmKind::Medium;
            ready!(ep.request_step(t, self.dest, kind, *part, &args[..k], piece, None))?;
            if self.sent == 0 {
                self.half_sent = ep.handlers.typed_site.as_ref().map(|s| s.transit.clone());
            }
            self.sent += max;
        }
        Poll::Ready(Ok((*handler, &words[..*n], &bytes[ahead..])))
    }

    /// The message that ends the value has left: nothing to cancel, and a staged value is
    /// its target's until it releases it.
    #[inline]
    fn sent_all(&mut self) {
        self.half_sent = None;
        if self.staged.is_some() {
            self.staged = None;
        }
    }
}

/// The message that ends a typed value: its handler, words and last piece.
type LastPiece<'a> = (HandlerId, &'a [u32], &'a [u8]);

/// A typed call ([`crate::typed`]): `msg` encoded when it is made (one longer than 64 KiB when it
/// starts, so that it can be encoded straight into the memory it moves from), sent to `dest` as a
/// call of the table's reserved typed-call handler, completing with the answer decoded as an
/// `M::Reply` (its handle an `Op<Typed<M::Reply>>`). A type this rank does not register, or a value
/// larger than [`crate::typed::MAX_LEN`], is an error when it starts, and nothing is sent.
pub struct TypedCall<M: crate::typed::Am>(Outbound, Option<M>);

impl<M: crate::typed::Am> std::fmt::Debug for TypedCall<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TypedCall").field(&self.0).finish()
    }
}

impl<M: crate::typed::Am> TypedCall<M> {
    /// A call of `msg` on `dest`.
    pub fn new(dest: Rank, msg: M) -> Self {
        let (out, late) = Outbound::new(dest, &msg);
        TypedCall(out, late.then_some(msg))
    }
}

impl<M: crate::typed::Am> Start for TypedCall<M> {
    type Output = crate::typed::Typed<M::Reply>;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        _t: &mut T,
    ) -> Poll<Result<Op<Self::Output>, AmError>> {
        let out = &mut self.0;
        let (call, ..) = typed_handlers(ep, out.name)?;
        let [lo, hi] = typed_id::<M, H>(ep)?;
        if let Some(msg) = self.1.take() {
            out.encode_late(ep, &msg);
        }
        // The call's number goes first: `call_start` fills it in.
        let last = out.prepare(ep, call, &[0, lo, hi])?;
        let Some((call, _, words, n)) = out.site.as_mut() else {
            return Poll::Ready(Err(AmError::StaleHandle));
        };
        let mut op = ep.call_start(out.dest, *call, &mut words[..*n], last)?;
        Poll::Ready(Ok(Op {
            state: op.take_state(),
            held: Some(out.dest),
        }))
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<Self::Output>,
    ) -> Poll<Result<(), AmError>> {
        let (handler, words, last) = ready!(self.0.send_parts(ep, t))?;
        ready!(ep.call_step(t, op, handler, words, last))?;
        self.0.sent_all();
        Poll::Ready(Ok(()))
    }
}

/// A typed message with no answer ([`crate::typed`]): `msg` encoded as [`TypedCall`]'s, sent to
/// `dest` as a request of the table's reserved typed-post handler; locally complete once
/// sent. Checked as [`TypedCall`]. Nobody is told of a value its target refuses (one that
/// does not decode, or an unknown type): it is dropped there; a [`TypedCall`] says why.
pub struct PostTyped<M: crate::typed::Am>(Outbound, Option<M>);

impl<M: crate::typed::Am> std::fmt::Debug for PostTyped<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PostTyped").field(&self.0).finish()
    }
}

impl<M: crate::typed::Am> PostTyped<M> {
    /// A post of `msg` to `dest`.
    pub fn new(dest: Rank, msg: M) -> Self {
        let (out, late) = Outbound::new(dest, &msg);
        PostTyped(out, late.then_some(msg))
    }
}

/// Starts a typed message sent as a request (a post, an answer): checks it, fixes its
/// words. Locally complete once sent.
fn start_request<H: Threading>(
    out: &mut Outbound,
    ep: &Endpoint<H>,
    handler: HandlerId,
    words: &[u32],
) -> Result<Op<()>, AmError> {
    let last = out.prepare(ep, handler, words)?;
    if let Some((h, _, words, n)) = &out.site {
        ep.check_request(out.dest, AmKind::Medium, *h, &words[..*n], last, None)?;
    }
    Ok(Op::ready(crate::op::Raw::Unit))
}

/// A step of sending a typed message started by [`start_request`].
fn send_request<H: Threading, T: Transport + ?Sized>(
    out: &mut Outbound,
    ep: &mut Endpoint<H>,
    t: &mut T,
) -> Poll<Result<(), AmError>> {
    let dest = out.dest;
    let (handler, words, last) = ready!(out.send_parts(ep, t))?;
    ready!(ep.request_step(t, dest, AmKind::Medium, handler, words, last, None))?;
    out.sent_all();
    Poll::Ready(Ok(()))
}

impl<M: crate::typed::Am> Start for PostTyped<M> {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        _t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        let (_, post, ..) = typed_handlers(ep, self.0.name)?;
        let id = typed_id::<M, H>(ep)?;
        if let Some(msg) = self.1.take() {
            self.0.encode_late(ep, &msg);
        }
        Poll::Ready(start_request(&mut self.0, ep, post, &id))
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        _op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        send_request(&mut self.0, ep, t)
    }
}

/// A typed call's answer given later ([`crate::typed::Answer`],
/// [`crate::Handlers::typed_deferred`]): `value` encoded as [`TypedCall`]'s, sent to the
/// caller as a request of the table's reserved typed-answer handler; locally complete once
/// sent. An answer made for a post goes nowhere and completes at once.
pub struct AnswerTyped<R> {
    answer: crate::typed::Answer<R>,
    out: Outbound,
    /// The value, while it is to be encoded when it starts ([`Outbound::encode_late`]).
    late: Option<R>,
}

impl<R> std::fmt::Debug for AnswerTyped<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("AnswerTyped").field(&self.out).finish()
    }
}

impl<R: serde::Serialize> AnswerTyped<R> {
    /// `answer` given `value`.
    pub fn new(answer: crate::typed::Answer<R>, value: R) -> Self {
        let (out, late) = Outbound::new(answer.dest, &value);
        let late = late.then_some(value);
        AnswerTyped { answer, out, late }
    }
}

impl<R: serde::Serialize> Start for AnswerTyped<R> {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        _t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        if !self.answer.is_call() {
            return Poll::Ready(Ok(Op::ready(crate::op::Raw::Unit)));
        }
        // Given to the node of another endpoint of this process, the answer leaves from the
        // endpoint its call came to, which the caller takes answers to that call from.
        let here =
            (ep.handlers.typed_site.as_ref()).is_some_and(|s| self.answer.came_to(&s.transit));
        if !here {
            let bytes = match self.late.take() {
                Some(value) => crate::typed::encoded(&value),
                None => std::mem::replace(&mut self.out.bytes, Ok(Vec::new())),
            };
            self.answer.queue_at_origin(bytes);
            return Poll::Ready(Ok(Op::ready(crate::op::Raw::Unit)));
        }
        let (.., answer, _) = typed_handlers(ep, self.out.name)?;
        let words = [self.answer.number, crate::typed::ANSWER_OK];
        if let Some(value) = self.late.take() {
            self.out.encode_late(ep, &value);
        }
        let started = start_request(&mut self.out, ep, answer, &words);
        if let Err(e) = &started {
            // The caller is told why, when the answer drops.
            self.answer.status = match e {
                AmError::TypedTooLarge { .. } => crate::typed::ANSWER_TOO_LARGE,
                AmError::TypedUnencodable { .. } => crate::typed::ANSWER_BAD,
                _ => crate::typed::ANSWER_ABANDONED,
            };
        }
        Poll::Ready(started)
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        _op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        let Some((_, _, words, n)) = self.out.site else {
            return Poll::Ready(Ok(()));
        };
        // Given up from here on (dropped, failed), the answer ends the stream its parts
        // started, and the caller is told.
        if n == 3 {
            self.answer.stream = Some(words[2]);
        }
        let sent = send_request(&mut self.out, ep, t);
        // Given up, the abandoned answer ends the stream: no cancel of it besides.
        self.out.half_sent = None;
        ready!(sent)?;
        // Sent: dropping the answer no longer abandons the call.
        self.answer.transit = None;
        Poll::Ready(Ok(()))
    }
}

impl Start for Call<'_> {
    type Output = Reply;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        _t: &mut T,
    ) -> Poll<Result<Op<Reply>, AmError>> {
        let Some(words) = self.words.get_mut(..self.len) else {
            return Poll::Ready(Err(AmError::TooManyArgs(self.len)));
        };
        Poll::Ready(ep.call_start(self.dest, self.handler, words, self.payload.len()))
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<Reply>,
    ) -> Poll<Result<(), AmError>> {
        let words = &self.words[..self.len.min(self.words.len())];
        ep.call_step(t, op, self.handler, words, &self.payload)
    }
}

/// A barrier: complete once every rank has entered it (a dissemination barrier over AMs:
/// ⌈log2 N⌉ rounds of one request each). It starts once this rank's posted atomics are
/// applied, so every rank leaving it sees them. A barrier whose wait returned an error is
/// resumed by the next barrier, which sends nothing twice (the other ranks are still in it);
/// after an error that lasts (a lost peer, an aborted job) the retry fails the same way.
#[derive(Debug, Clone, Copy, Default)]
pub struct Barrier;

impl Start for Barrier {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.barrier_start(t)
    }
}

/// A barrier on a team: complete once every member of `team` has entered it (a
/// dissemination barrier: ⌈log2 size⌉ rounds of one system message each, keyed by the team
/// and the barrier's sequence among the team's collectives). Collective over the team: every
/// member starts the team's collectives in the same order. It starts once this rank's posted
/// atomics are applied, as the world [`Barrier`]. A member lost or gone fails it
/// ([`crate::AmError::PeerLost`], [`crate::AmError::PeerDeparted`]), and every later
/// collective on the team.
#[derive(Debug, Clone)]
pub struct TeamBarrier {
    /// The team.
    pub team: Team,
}

impl TeamBarrier {
    /// A barrier on `team` (the handle cloned).
    pub fn new(team: &Team) -> TeamBarrier {
        TeamBarrier { team: team.clone() }
    }
}

impl Start for TeamBarrier {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.team_barrier_start(t, &self.team)
    }
}

/// A symmetric allocation on a team (OpenSHMEM's `shmem_malloc`): every member gets the
/// same block of its symmetric heap, at the same offset of segment 0
/// ([`crate::symmetric`]). One all-reduce of the team's proposals: where every member
/// proposed the same first free range, that one; otherwise above every member's highest
/// block. The heap is reserved when the job connects (`AM_SYMMETRIC_SIZE`): nothing is
/// mapped or registered. Collective over the team, as [`TeamBarrier`]; one symmetric
/// allocation or free runs at a time per endpoint (the next waits to start). No room on some
/// member is [`crate::AmError::OutOfSymmetricHeap`] on every member; heaps of different
/// sizes, [`crate::AmError::SymmetricHeapMismatch`].
#[derive(Debug, Clone)]
pub struct AllocSymmetric {
    /// The team.
    pub team: Team,
    /// The bytes asked for.
    pub len: usize,
}

impl AllocSymmetric {
    /// An allocation of `len` bytes on `team` (the handle cloned).
    pub fn new(team: &Team, len: usize) -> AllocSymmetric {
        AllocSymmetric {
            team: team.clone(),
            len,
        }
    }
}

impl Start for AllocSymmetric {
    type Output = crate::symmetric::Symmetric;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<crate::symmetric::Symmetric>, AmError>> {
        ep.alloc_symmetric_start(t, &self.team, self.len)
    }
}

/// A symmetric free on a team (OpenSHMEM's `shmem_free`): a barrier of the team, after
/// which the block is free here. A block not allocated here is
/// [`crate::AmError::NotSymmetric`] when it starts. Collective over the team that allocated
/// it, as [`AllocSymmetric`].
#[derive(Debug, Clone)]
pub struct FreeSymmetric {
    /// The team.
    pub team: Team,
    /// The block.
    pub block: crate::symmetric::Symmetric,
}

impl FreeSymmetric {
    /// A free of `block` on `team` (the handle cloned).
    pub fn new(team: &Team, block: crate::symmetric::Symmetric) -> FreeSymmetric {
        FreeSymmetric {
            team: team.clone(),
            block,
        }
    }
}

impl Start for FreeSymmetric {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.free_symmetric_start(t, &self.team, self.block)
    }
}

/// A publication of one of this rank's segments on a team ([`crate::segment`]; a remote
/// key exchange, as `gex_EP_PublishBoundSegment`): an all-gather of every member's segment
/// id and length, completing with every member's [`crate::RemoteSegment`] in team order,
/// which puts, gets and atomics then name. Collective over the team, as [`TeamBarrier`]:
/// every member publishes one of its segments (segment 0 included). A segment this rank
/// does not hold fails the publication on every member with
/// [`crate::AmError::UnknownSegment`] naming this rank.
#[derive(Debug, Clone)]
pub struct PublishSegment {
    /// The team.
    pub team: Team,
    /// This member's segment.
    pub id: crate::segment::SegmentId,
}

impl PublishSegment {
    /// A publication of segment `id` on `team` (the handle cloned).
    pub fn new(team: &Team, id: crate::segment::SegmentId) -> PublishSegment {
        PublishSegment {
            team: team.clone(),
            id,
        }
    }
}

impl Start for PublishSegment {
    type Output = Vec<crate::segment::RemoteSegment>;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Vec<crate::segment::RemoteSegment>>, AmError>> {
        ep.publish_segment_start(t, &self.team, self.id)
    }
}

/// A free of one of this rank's created segments on the team it was published on
/// ([`crate::segment`]): an all-gather of every member's freed id, after which this rank's
/// segment is unmapped and every member's freed one is unknown here. Collective over the
/// team, as [`TeamBarrier`]. Segment 0 is freed as nothing (for a member that published
/// it); a segment this rank does not hold fails the free on every member with
/// [`crate::AmError::UnknownSegment`] naming this rank, and nothing is freed.
#[derive(Debug, Clone)]
pub struct FreeSegment {
    /// The team.
    pub team: Team,
    /// This member's segment.
    pub id: crate::segment::SegmentId,
}

impl FreeSegment {
    /// A free of segment `id` on `team` (the handle cloned).
    pub fn new(team: &Team, id: crate::segment::SegmentId) -> FreeSegment {
        FreeSegment {
            team: team.clone(),
            id,
        }
    }
}

impl Start for FreeSegment {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.free_segment_start(t, &self.team, self.id)
    }
}

/// A put into a published segment ([`crate::segment`]): `data` at `offset` of `remote`. On
/// segment 0 it is a [`Put`]; on this rank's own segment a copy, complete when started;
/// elsewhere system Mediums that the owner's progress writes and acknowledges. An unknown
/// or freed segment is [`crate::AmError::UnknownSegment`], a range past its published
/// length [`crate::AmError::SegmentOutOfBounds`], past a block's end
/// ([`crate::symmetric::Symmetric::on`], [`crate::segment::RemoteSegment::range`])
/// [`crate::AmError::OutOfBlock`], all when it starts.
#[derive(Debug, Clone, Copy)]
pub struct PutTo<'a> {
    /// The segment.
    pub remote: crate::segment::RemoteSegment,
    /// Where in it.
    pub offset: usize,
    /// The bytes.
    pub data: &'a [u8],
}

impl<'a> PutTo<'a> {
    /// A put of `data` at `offset` of `remote`.
    pub fn new(remote: &crate::segment::RemoteSegment, offset: usize, data: &'a [u8]) -> Self {
        PutTo {
            remote: *remote,
            offset,
            data,
        }
    }
}

impl Start for PutTo<'_> {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.put_to_start(t, &self.remote, self.offset, self.data)
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        ep.put_step(t, op, self.data)
    }
}

/// An AM Long request into a published segment ([`crate::segment`]): `payload` lands at
/// `offset` of `remote`, then `handler` runs at its owner, which finds the payload there
/// ([`crate::Msg::long_segment`], [`crate::Msg::long_offset`]). On segment 0 it is the Long
/// of `request_long`. On a created segment the payload goes first, as a [`PutTo`] (one
/// copy where the segment is mapped, system messages that the owner acknowledges
/// elsewhere), and the request's head follows once the put is complete, carrying the
/// segment's id: it is locally complete when the head is sent, and its payload is not
/// bounded by the transport's largest Long. An unknown or freed segment, a range past its
/// published length or a handler not registered as a Long request is an error when it
/// starts, and nothing is sent.
#[derive(Debug)]
pub struct LongTo<'a> {
    remote: crate::segment::RemoteSegment,
    offset: usize,
    handler: HandlerId,
    args: &'a [u32],
    payload: &'a [u8],
    /// The put of the payload, until it is complete.
    put: Option<Op<()>>,
}

impl<'a> LongTo<'a> {
    /// A Long request of `handler` with `args`, its `payload` at `offset` of `remote`.
    pub fn new(
        remote: &crate::segment::RemoteSegment,
        offset: usize,
        handler: HandlerId,
        args: &'a [u32],
        payload: &'a [u8],
    ) -> Self {
        LongTo {
            remote: *remote,
            offset,
            handler,
            args,
            payload,
            put: None,
        }
    }
}

impl Start for LongTo<'_> {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        // A block's range, checked against the block: the whole segment's from here on (a
        // second call finds it whole).
        (self.remote, self.offset) = self.remote.resolve(self.offset, self.payload.len())?;
        let (dest, id) = (self.remote.rank(), self.remote.id());
        if id == crate::segment::SegmentId::ZERO {
            let kind = crate::AmKind::Long;
            let (args, len) = (self.args, self.payload.len());
            if let Err(e) = ep.check_request(dest, kind, self.handler, args, len, Some(self.offset))
            {
                return Poll::Ready(Err(e));
            }
        } else {
            let put = ep.long_to_start(
                t,
                &self.remote,
                self.offset,
                self.handler,
                self.args,
                self.payload,
            );
            self.put = Some(ready!(put)?);
        }
        Poll::Ready(Ok(Op::ready(crate::op::Raw::Unit)))
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        let _ = op;
        let (dest, id) = (self.remote.rank(), self.remote.id());
        if id == crate::segment::SegmentId::ZERO {
            let kind = crate::AmKind::Long;
            let (args, data) = (self.args, self.payload);
            return ep.request_step(t, dest, kind, self.handler, args, data, Some(self.offset));
        }
        // The head goes only once the payload is where the handler will read it.
        if let Some(put) = self.put.as_mut() {
            ready!(ep.put_step(t, put, self.payload))?;
            ready!(ep.poll_op(t, put, None))?;
            self.put = None;
        }
        let (args, len) = (self.args, self.payload.len());
        ep.long_in_segment_step(t, dest, self.handler, args, id.get(), self.offset, len)
    }
}

/// A get from a published segment ([`crate::segment`]): `len` bytes at `offset` of
/// `remote` into a new `Vec`, as [`PutTo`] (a [`Get`] on segment 0).
#[derive(Debug, Clone, Copy)]
pub struct GetFrom {
    /// The segment.
    pub remote: crate::segment::RemoteSegment,
    /// Where in it.
    pub offset: usize,
    /// How many bytes.
    pub len: usize,
}

impl GetFrom {
    /// A get of `len` bytes at `offset` of `remote`.
    pub fn new(remote: &crate::segment::RemoteSegment, offset: usize, len: usize) -> Self {
        GetFrom {
            remote: *remote,
            offset,
            len,
        }
    }
}

impl Start for GetFrom {
    type Output = Vec<u8>;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Vec<u8>>, AmError>> {
        ep.get_from_start(t, &self.remote, self.offset, self.len)
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<Vec<u8>>,
    ) -> Poll<Result<(), AmError>> {
        ep.get_step(t, op)
    }
}

/// A get from a published segment into a buffer of the caller's ([`crate::segment`]):
/// `dst.len()` bytes at `offset` of `remote`, as [`GetInto`] (which it is on segment 0).
/// The handle holds `dst` until it completes, and gives it back filled.
#[derive(Debug)]
pub struct GetFromInto<'b> {
    /// The segment.
    pub remote: crate::segment::RemoteSegment,
    /// Where in it.
    pub offset: usize,
    /// The buffer, until the handle takes it.
    pub dst: Option<&'b mut [u8]>,
}

impl<'b> GetFromInto<'b> {
    /// A get of `dst.len()` bytes at `offset` of `remote` into `dst`.
    pub fn new(remote: &crate::segment::RemoteSegment, offset: usize, dst: &'b mut [u8]) -> Self {
        GetFromInto {
            remote: *remote,
            offset,
            dst: Some(dst),
        }
    }
}

impl<'b> Start for GetFromInto<'b> {
    type Output = &'b mut [u8];
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<&'b mut [u8]>, AmError>> {
        let Some(dst) = self.dst.as_deref_mut() else {
            return Poll::Ready(Err(AmError::StaleHandle));
        };
        let op = ready!(ep.get_from_into_start(t, &self.remote, self.offset, dst))?;
        let dst = self.dst.take().ok_or(AmError::StaleHandle)?;
        Poll::Ready(Ok(op.filling(dst)))
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<&'b mut [u8]>,
    ) -> Poll<Result<(), AmError>> {
        ep.get_step(t, op)
    }
}

/// An atomic on a word of a published segment ([`crate::segment`]), completing with its
/// old value, as [`PutTo`] (an [`Atomic`] on segment 0).
#[derive(Debug, Clone, Copy)]
pub struct AtomicAt<W: AtomicWord> {
    /// The segment.
    pub remote: crate::segment::RemoteSegment,
    /// The word's offset in it.
    pub offset: usize,
    /// What to do to it.
    pub op: AtomicOp<W>,
}

impl<W: AtomicWord> AtomicAt<W> {
    /// `op` on the word at `offset` of `remote`.
    pub fn new(remote: &crate::segment::RemoteSegment, offset: usize, op: AtomicOp<W>) -> Self {
        AtomicAt {
            remote: *remote,
            offset,
            op,
        }
    }
}

impl<W: AtomicWord + Outcome> Start for AtomicAt<W> {
    type Output = W;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<W>, AmError>> {
        ep.atomic_at_start(t, &self.remote, self.offset, self.op)
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<W>,
    ) -> Poll<Result<(), AmError>> {
        ep.atomic_step(t, op)
    }
}

/// An all-gather on a team: every member gives a block of the same length, and each
/// completes with all the blocks, in team order (a ring: size - 1 steps of one system Medium
/// each into the operation's own buffer; a block longer than the transport's `max_medium`
/// goes in chunks, one collective each). Collective
/// over the team, as [`TeamBarrier`]; members that give blocks of different lengths get
/// [`crate::AmError::CollectiveMismatch`].
#[derive(Debug, Clone)]
pub struct TeamAllGather<'a> {
    /// The team.
    pub team: Team,
    /// This member's block (borrowed until it starts).
    pub block: Cow<'a, [u8]>,
}

impl<'a> TeamAllGather<'a> {
    /// An all-gather of `block` on `team`.
    pub fn new(team: &Team, block: &'a [u8]) -> TeamAllGather<'a> {
        TeamAllGather {
            team: team.clone(),
            block: Cow::Borrowed(block),
        }
    }

    /// The same all-gather owning its block (for a future that outlives it).
    pub fn into_owned(self) -> TeamAllGather<'static> {
        TeamAllGather {
            team: self.team,
            block: Cow::Owned(self.block.into_owned()),
        }
    }
}

impl Start for TeamAllGather<'_> {
    type Output = Vec<u8>;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Vec<u8>>, AmError>> {
        ep.team_all_gather_start(t, &self.team, &self.block)
    }
}

/// A split of a team (MPI's `MPI_Comm_split`, GASNet-EX's `gex_TM_Split`): the members of
/// `parent` that give the same `color` form one new team, ordered by `key`, then by world
/// rank; a member that gives `None` gets no team. Collective over `parent` (an all-gather of
/// every member's color and key on it), completing with this rank's new team. The new team's
/// id is its first member's world rank and a serial that member never offered before.
#[derive(Debug, Clone)]
pub struct Split {
    /// The team split.
    pub parent: Team,
    /// This member's color (`None`: no team).
    pub color: Option<u32>,
    /// Where this member goes among those of its color.
    pub key: u32,
}

impl Split {
    /// A split of `parent` by `color` and `key`.
    pub fn new(parent: &Team, color: Option<u32>, key: u32) -> Split {
        Split {
            parent: parent.clone(),
            color,
            key,
        }
    }
}

impl Start for Split {
    type Output = Option<Team>;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Option<Team>>, AmError>> {
        ep.split_start(t, &self.parent, self.color, self.key)
    }
}

/// A broadcast on a team: every member completes with the bytes team rank `root` gave (the
/// other members give `&[]`), along a binomial tree of system Mediums: ⌈log2 size⌉ steps
/// from the root to the farthest member. More than the transport's `max_medium` goes in
/// chunks, whose count the others learn from the first: until then a member that is not the
/// root starts no further collective on the team (its start waits). Collective
/// over the team, as [`TeamBarrier`]; members that name different roots get
/// [`crate::AmError::CollectiveMismatch`].
#[derive(Debug, Clone)]
pub struct TeamBroadcast<'a> {
    /// The team.
    pub team: Team,
    /// The root's team rank.
    pub root: u32,
    /// The root's bytes (empty on the others; borrowed until it starts).
    pub data: Cow<'a, [u8]>,
}

impl<'a> TeamBroadcast<'a> {
    /// A broadcast of `data` from team rank `root` of `team`.
    pub fn new(team: &Team, root: u32, data: &'a [u8]) -> TeamBroadcast<'a> {
        TeamBroadcast {
            team: team.clone(),
            root,
            data: Cow::Borrowed(data),
        }
    }
}

impl Start for TeamBroadcast<'_> {
    type Output = Vec<u8>;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Vec<u8>>, AmError>> {
        ep.team_broadcast_start(t, &self.team, self.root, &self.data)
    }
}

/// A gather on a team: every member gives a block of the same length (longer than the
/// transport's `max_medium`: in chunks); team rank `root` completes with all of them in team order,
/// the others with an empty `Vec` once their block is sent. One system Medium from each
/// member to the root. Collective over the team, as [`TeamBarrier`].
#[derive(Debug, Clone)]
pub struct TeamGather<'a> {
    /// The team.
    pub team: Team,
    /// The root's team rank.
    pub root: u32,
    /// This member's block (borrowed until it starts).
    pub block: Cow<'a, [u8]>,
}

impl<'a> TeamGather<'a> {
    /// A gather of every member's `block` to team rank `root` of `team`.
    pub fn new(team: &Team, root: u32, block: &'a [u8]) -> TeamGather<'a> {
        TeamGather {
            team: team.clone(),
            root,
            block: Cow::Borrowed(block),
        }
    }
}

impl Start for TeamGather<'_> {
    type Output = Vec<u8>;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Vec<u8>>, AmError>> {
        ep.team_gather_start(t, &self.team, self.root, &self.block)
    }
}

/// A reduction on a team: every member gives a vector of the same length (more bytes than
/// the transport's `max_medium`: in chunks of whole elements, each reduced on its own), and
/// the result, element by element `op` over the
/// members' vectors in team order ([`crate::reduce`]), goes to team rank `root`
/// (reduce-to-one: a binomial tree towards team rank 0, which forwards the result to a
/// root that is not it; the others complete with an empty `Vec`) or, with `root` `None`,
/// to every member (reduce-to-all: recursive doubling, ⌈log2 size⌉ exchanges, plus one step
/// before and after where the size is not a power of two; above `max_medium` bytes, a ring
/// of reduce-scatter then all-gather, as [`crate::AllReduceAlgorithm`] says and
/// `AM_ALLREDUCE` overrides; every member's result is the same, bit for bit, though a
/// floating-point sum's bits depend on the algorithm). Collective over the team, as
/// [`TeamBarrier`]; members that differ in root, element type, operation or length get
/// [`crate::AmError::CollectiveMismatch`].
#[derive(Debug, Clone)]
pub struct TeamReduce<E: Element> {
    /// The team.
    pub team: Team,
    /// The root's team rank; `None`: every member.
    pub root: Option<u32>,
    /// The operation.
    pub op: ReduceOp,
    /// This member's vector, as little-endian bytes.
    data: Vec<u8>,
    elem: std::marker::PhantomData<E>,
}

impl<E: Element> TeamReduce<E> {
    /// A reduction of `data` by `op` over `team`, to team rank `root` or (`None`) to all.
    pub fn new(team: &Team, root: Option<u32>, op: ReduceOp, data: &[E]) -> TeamReduce<E> {
        TeamReduce {
            team: team.clone(),
            root,
            op,
            data: crate::reduce::to_bytes(data),
            elem: std::marker::PhantomData,
        }
    }
}

impl<E: Element> Start for TeamReduce<E> {
    type Output = Vec<E>;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Vec<E>>, AmError>> {
        // Its bytes are taken once it starts: a started operation is not started again.
        ep.team_reduce_start_taking::<E, T>(t, &self.team, self.root, self.op, &mut self.data)
    }
}

/// A broadcast in segment 0 (OpenSHMEM's `shmem_broadcastmem`): `len` bytes at `src` of
/// team rank `root`'s segment 0 into `dest` of every member's (the root's too, unless its
/// `src` is its `dest`), moved straight between the segments rather than through `Vec`s.
/// Members may name different offsets (each learns the others'); a non-root's `src` is
/// not read. Where the NIC reads peers' memory (`Capabilities::get` and `put`: loopback,
/// sci, extoll, portals, ofi) every member copies the root's bytes into its destination
/// itself, between two collectives of the team (an all-gather of the members' arguments,
/// after which every member has entered, and an all-reduce of each member's status, after
/// which every copy is complete, or the broadcast fails on every member with
/// [`crate::AmError::MemberFailed`] where a member's NIC refused its copy); elsewhere the
/// bytes go as [`TeamBroadcast`]'s do and are written into the destination. For large
/// broadcasts: below some tens of KiB, [`TeamBroadcast`] is faster.
/// Collective over the team, as [`TeamBarrier`]; members that name different roots or
/// lengths get [`crate::AmError::CollectiveMismatch`]. Until it completes, the team's later
/// collectives here wait to start until its last collective has started.
#[derive(Debug, Clone)]
pub struct TeamBroadcastInSegment {
    /// The team.
    pub team: Team,
    /// The root's team rank.
    pub root: u32,
    /// Where the root's bytes are in its segment 0.
    pub src: usize,
    /// Where they go in every member's segment 0.
    pub dest: usize,
    /// How many.
    pub len: usize,
}

impl TeamBroadcastInSegment {
    /// A broadcast of `len` bytes at `src` of team rank `root`'s segment 0 into `dest` of
    /// every member's.
    pub fn new(team: &Team, root: u32, src: usize, dest: usize, len: usize) -> Self {
        TeamBroadcastInSegment {
            team: team.clone(),
            root,
            src,
            dest,
            len,
        }
    }
}

impl Start for TeamBroadcastInSegment {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.team_broadcast_in_segment_start(t, &self.team, self.root, self.src, self.dest, self.len)
    }
}

/// An all-reduce in segment 0 (OpenSHMEM's `shmem_sum_reduce` and kin on symmetric
/// memory): `count` elements of `E` at `src` of every member's segment 0, reduced element
/// by element by `op` in team order, into `dest` of every member's, the same bit for bit
/// everywhere. `src` and `dest` are the same range (in place) or do not overlap; members
/// may name different offsets. Where the NIC reads peers' memory (`Capabilities::get` and
/// `put`: loopback, sci, extoll, portals, ofi), member `r` reduces the `r`-th of `size`
/// blocks itself, reading every member's source and writing every member's destination,
/// a cache-sized chunk at a time, between an all-gather of the members' arguments and an
/// all-reduce of their status, as [`TeamBroadcastInSegment`] does; elsewhere the bytes go
/// as [`TeamReduce`]'s do and the result is written into the destination. Collective over
/// the team; members that differ in element type, operation or count get
/// [`crate::AmError::CollectiveMismatch`].
#[derive(Debug, Clone)]
pub struct TeamAllReduceInSegment<E: Element> {
    /// The team.
    pub team: Team,
    /// The operation.
    pub op: ReduceOp,
    /// Where this member's elements are in its segment 0.
    pub src: usize,
    /// Where the result goes in its segment 0.
    pub dest: usize,
    /// How many elements.
    pub count: usize,
    elem: std::marker::PhantomData<E>,
}

impl<E: Element> TeamAllReduceInSegment<E> {
    /// An all-reduce by `op` of `count` elements at `src` into `dest` on `team`.
    pub fn new(team: &Team, op: ReduceOp, src: usize, dest: usize, count: usize) -> Self {
        TeamAllReduceInSegment {
            team: team.clone(),
            op,
            src,
            dest,
            count,
            elem: std::marker::PhantomData,
        }
    }
}

impl<E: Element> Start for TeamAllReduceInSegment<E> {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.team_all_reduce_in_segment_start::<E, T>(
            t, &self.team, self.op, self.src, self.dest, self.count,
        )
    }
}

/// The one list of the operations every driver offers: each entry is handed to the driver's
/// macro, which writes that driver's methods for it. `op`: an operation with a handle
/// (`name`, `nb` its non-blocking form, the [`Start`] that defines it, and whether an async
/// future `owns` its arguments or `borrows` them); `implicit`: a put started with `nb`, then
/// left to the implicit set; `post`: a step that posts; `request`: an AM request with its
/// `try_` form; `wait`: a wait for a condition of the endpoint's.
macro_rules! operations {
    ($driver:ident) => {
        $driver! { op
            /// Writes `data` into `dest`'s segment at `offset`
            /// ([`Put`](crate::endpoint::start::Put): one copy where the NIC reaches the target's
            /// memory, AM Longs elsewhere). The offset names no block, so only the segment's
            /// end bounds it: into a symmetric block, `put_to(&block.on(dest), i, data)` is
            /// checked against the block's end too ([`crate::AmError::OutOfBlock`]).
            put [] (dest: $crate::Rank, offset: usize, data: &[u8]) -> ()
                = $crate::endpoint::start::Put { dest, offset, data }; nb put_nb; borrows;
        }
        $driver! { op
            /// Writes `data` into the regions (offset, length) of `dest`'s segment, in
            /// order, in one call ([`PutRegions`](crate::endpoint::start::PutRegions):
            /// one copy per region where the NIC reaches the target's memory, as few
            /// messages as they fit in elsewhere).
            put_indexed [] (dest: $crate::Rank, regions: &[(usize, usize)], data: &[u8]) -> ()
                = $crate::endpoint::start::PutRegions::indexed(dest, regions, data); nb put_indexed_nb; borrows;
        }
        $driver! { op
            /// Writes `data`, blocks of `block` bytes, into `dest`'s segment one every
            /// `stride` bytes from `offset` (a column of a row-major array), in one call
            /// ([`PutRegions`](crate::endpoint::start::PutRegions)): `put_strided(1, col * 8,
            /// row_bytes, 8, &column)`.
            put_strided [] (dest: $crate::Rank, offset: usize, stride: usize, block: usize, data: &[u8]) -> ()
                = $crate::endpoint::start::PutRegions::strided(dest, offset, stride, block, data); nb put_strided_nb; borrows;
        }
        $driver! { op
            /// Reads the regions (offset, length) of `src`'s segment, in order, into a new
            /// `Vec`, in one call ([`GetRegions`](crate::endpoint::start::GetRegions)).
            get_indexed [] (src: $crate::Rank, regions: &[(usize, usize)]) -> Vec<u8>
                = $crate::endpoint::start::GetRegions::indexed(src, regions); nb get_indexed_nb; borrows;
        }
        $driver! { op
            /// Reads `count` blocks of `block` bytes of `src`'s segment, one every `stride`
            /// bytes from `offset` (a column of a row-major array), into a new `Vec`, in one
            /// call ([`GetRegions`](crate::endpoint::start::GetRegions)).
            get_strided [] (src: $crate::Rank, offset: usize, stride: usize, block: usize, count: usize) -> Vec<u8>
                = $crate::endpoint::start::GetRegions::strided(src, offset, stride, block, count); nb get_strided_nb; borrows;
        }
        $driver! { op
            /// Writes `data` into `dest`'s segment at `offset`, then applies `signal` to the
            /// `u64` at `signal_at` there, after the data
            /// ([`PutSignal`](crate::endpoint::start::PutSignal)): `put_signal(1, 0, &halo,
            /// 4096, Signal::Set(step))`, and the target's `wait_word(4096, Cmp::Ge, step)`.
            put_signal [] (dest: $crate::Rank, offset: usize, data: &[u8], signal_at: usize, signal: $crate::atomic::Signal) -> ()
                = $crate::endpoint::start::PutSignal { dest, offset, data, signal_at, signal }; nb put_signal_nb; borrows;
        }
        $driver! { op
            /// Copies `len` bytes at `local` of this rank's segment to `offset` of `dest`'s, with
            /// no slice in between ([`PutFromSegment`](crate::endpoint::start::PutFromSegment): one
            /// copy from mapping to mapping where the NIC writes peers' memory).
            put_from_segment [] (dest: $crate::Rank, offset: usize, local: usize, len: usize) -> ()
                = $crate::endpoint::start::PutFromSegment::new(dest, offset, local, len); nb put_from_segment_nb; owns;
        }
        $driver! { op
            /// Copies `len` bytes at `offset` of `src`'s segment to `local` of this rank's, with no
            /// buffer in between ([`GetIntoSegment`](crate::endpoint::start::GetIntoSegment): one
            /// copy from mapping to mapping where the NIC reads peers' memory).
            get_into_segment [] (src: $crate::Rank, offset: usize, local: usize, len: usize) -> ()
                = $crate::endpoint::start::GetIntoSegment::new(src, offset, local, len); nb get_into_segment_nb; owns;
        }
        $driver! { op
            /// Copies `len` bytes at `local_offset` of this rank's segment `local` to
            /// `offset` of a published segment, with no slice in between
            /// ([`PutToFromSegment`](crate::endpoint::start::PutToFromSegment): one copy
            /// from mapping to mapping where this rank reaches the target's memory, through
            /// a buffer elsewhere).
            put_to_from_segment [] (remote: &$crate::segment::RemoteSegment, offset: usize, local: $crate::segment::SegmentId, local_offset: usize, len: usize) -> ()
                = $crate::endpoint::start::PutToFromSegment::new(remote, offset, local, local_offset, len); nb put_to_from_segment_nb; owns;
        }
        $driver! { op
            /// Copies `len` bytes at `offset` of a published segment to `local_offset` of
            /// this rank's segment `local`, with no buffer in between
            /// ([`GetFromIntoSegment`](crate::endpoint::start::GetFromIntoSegment)).
            get_from_into_segment [] (remote: &$crate::segment::RemoteSegment, offset: usize, local: $crate::segment::SegmentId, local_offset: usize, len: usize) -> ()
                = $crate::endpoint::start::GetFromIntoSegment::new(remote, offset, local, local_offset, len); nb get_from_into_segment_nb; owns;
        }
        $driver! { op
            /// Reads `len` bytes at `offset` of `src`'s segment into a new `Vec`
            /// ([`Get`](crate::endpoint::start::Get)).
            get [] (src: $crate::Rank, offset: usize, len: usize) -> Vec<u8>
                = $crate::endpoint::start::Get { src, offset, len }; nb get_nb; owns;
        }
        $driver! { op
            /// Reads `dst.len()` bytes at `offset` of `src`'s segment into `dst`, and
            /// gives `dst` back filled ([`GetInto`](crate::endpoint::start::GetInto)).
            get_into ['b] (src: $crate::Rank, offset: usize, dst: &'b mut [u8]) -> &'b mut [u8]
                = $crate::endpoint::start::GetInto { src, offset, dst: Some(dst) }; nb get_into_nb; borrows;
        }
        $driver! { op
            /// Applies `op` to the word at `offset` of `dest`'s segment and completes with
            /// its old value ([`Atomic`](crate::endpoint::start::Atomic)):
            /// `atomic(1, 64, AtomicOp::FetchAdd(1u64))`.
            atomic [W: $crate::atomic::AtomicWord + $crate::op::Outcome<Value = W> + 'static]
                (dest: $crate::Rank, offset: usize, op: $crate::atomic::AtomicOp<W>) -> W
                = $crate::endpoint::start::Atomic { dest, offset, op }; nb atomic_nb; owns;
        }
        $driver! { op
            /// Calls `handler` on `dest` with `args` and `payload` and completes with its
            /// answer ([`Call`](crate::endpoint::start::Call)).
            call [] (dest: $crate::Rank, handler: $crate::HandlerId, args: &[u32], payload: &[u8]) -> $crate::Reply
                = $crate::endpoint::start::Call::new(dest, handler, args, payload); nb call_nb; owns;
        }
        $driver! { typed
            /// Sends the typed message `msg` to `dest`, where its code runs, and completes
            /// with its answer ([`TypedCall`](crate::endpoint::start::TypedCall),
            /// [`crate::typed`]): `let sq: u64 = call_typed(1, Square(12))?`.
            call_typed [M: $crate::typed::Am] (dest: $crate::Rank, msg: M) -> M::Reply, $crate::typed::Typed<M::Reply>
                = $crate::endpoint::start::TypedCall::new(dest, msg); nb call_typed_nb;
        }
        $driver! { op
            /// Answers a typed call whose code took its [`Answer`](crate::typed::Answer)
            /// ([`crate::Handlers::typed_deferred`]) with `value`
            /// ([`AnswerTyped`](crate::endpoint::start::AnswerTyped)): the caller's
            /// `call_typed` completes with it.
            answer_typed [R: serde::Serialize + 'static] (answer: $crate::typed::Answer<R>, value: R) -> ()
                = $crate::endpoint::start::AnswerTyped::new(answer, value); nb answer_typed_nb; owns;
        }
        $driver! { op
            /// Sends the typed message `msg` to `dest`, where its code runs, with no answer
            /// ([`PostTyped`](crate::endpoint::start::PostTyped)).
            post_typed [M: $crate::typed::Am] (dest: $crate::Rank, msg: M) -> ()
                = $crate::endpoint::start::PostTyped::new(dest, msg); nb post_typed_nb; owns;
        }
        $driver! { op
            /// Enters a barrier and completes once every rank has entered it as often as
            /// this one ([`Barrier`](crate::endpoint::start::Barrier)). Collective: one thread of
            /// each rank calls it.
            barrier [] () -> () = $crate::endpoint::start::Barrier; nb barrier_nb; owns;
        }
        $driver! { op
            /// Splits `parent` into teams ([`Split`](crate::endpoint::start::Split), MPI's
            /// `MPI_Comm_split`): members giving the same `color` form one team, ordered by
            /// `key`, then world rank; `None` gives no team. Collective over `parent`.
            split [] (parent: &$crate::team::Team, color: Option<u32>, key: u32) -> Option<$crate::team::Team>
                = $crate::endpoint::start::Split::new(parent, color, key); nb split_nb; owns;
        }
        $driver! { op
            /// Enters a barrier on `team` and completes once every member has entered it
            /// ([`TeamBarrier`](crate::endpoint::start::TeamBarrier)). Collective over the
            /// team: every member starts the team's collectives in the same order.
            team_barrier [] (team: &$crate::team::Team) -> ()
                = $crate::endpoint::start::TeamBarrier::new(team); nb team_barrier_nb; owns;
        }
        $driver! { op
            /// Allocates `len` bytes of the symmetric heap on every member of `team`, at the
            /// same offset of each member's segment 0
            /// ([`AllocSymmetric`](crate::endpoint::start::AllocSymmetric); OpenSHMEM's
            /// `shmem_malloc`): `let a = alloc_symmetric(&world, 4096)?`, then
            /// `put_to(&a.on(peer), 0, ..)`, checked against the block's end
            /// ([`Symmetric::on`](crate::symmetric::Symmetric::on)). Collective over the team.
            alloc_symmetric [] (team: &$crate::team::Team, len: usize) -> $crate::symmetric::Symmetric
                = $crate::endpoint::start::AllocSymmetric::new(team, len); nb alloc_symmetric_nb; owns;
        }
        $driver! { op
            /// Frees a block of the symmetric heap on every member of `team`, after a
            /// barrier of the team ([`FreeSymmetric`](crate::endpoint::start::FreeSymmetric);
            /// OpenSHMEM's `shmem_free`). Collective over the team that allocated it.
            free_symmetric [] (team: &$crate::team::Team, block: $crate::symmetric::Symmetric) -> ()
                = $crate::endpoint::start::FreeSymmetric::new(team, block); nb free_symmetric_nb; owns;
        }
        $driver! { op
            /// Publishes this rank's segment `id` on `team` and completes with every member's, in
            /// team order ([`PublishSegment`](crate::endpoint::start::PublishSegment)): `let peers
            /// = publish_segment(&world, node.create_segment(1 << 20)?)?`, then `put_to(&peers[1],
            /// 0, b"hello")`. Collective over the team.
            publish_segment [] (team: &$crate::team::Team, id: $crate::segment::SegmentId) -> Vec<$crate::segment::RemoteSegment>
                = $crate::endpoint::start::PublishSegment::new(team, id); nb publish_segment_nb; owns;
        }
        $driver! { op
            /// Frees this rank's segment `id`, published on `team`, and forgets every
            /// member's freed one ([`FreeSegment`](crate::endpoint::start::FreeSegment)).
            /// Collective over the team.
            free_segment [] (team: &$crate::team::Team, id: $crate::segment::SegmentId) -> ()
                = $crate::endpoint::start::FreeSegment::new(team, id); nb free_segment_nb; owns;
        }
        $driver! { op
            /// Sends an AM Long request whose payload lands at `offset` of a published
            /// segment, then runs `handler` at its owner
            /// ([`LongTo`](crate::endpoint::start::LongTo)).
            request_long_to [] (remote: &$crate::segment::RemoteSegment, offset: usize, handler: $crate::HandlerId, args: &[u32], payload: &[u8]) -> ()
                = $crate::endpoint::start::LongTo::new(remote, offset, handler, args, payload); nb request_long_to_nb; borrows;
        }
        $driver! { op
            /// Writes `data` at `offset` of a published segment, or of a block
            /// ([`PutTo`](crate::endpoint::start::PutTo)): a symmetric block on a member
            /// ([`Symmetric::on`](crate::symmetric::Symmetric::on)) or a range of a segment
            /// ([`RemoteSegment::range`](crate::segment::RemoteSegment::range)), whose end
            /// bounds it ([`crate::AmError::OutOfBlock`], nothing written).
            put_to [] (remote: &$crate::segment::RemoteSegment, offset: usize, data: &[u8]) -> ()
                = $crate::endpoint::start::PutTo::new(remote, offset, data); nb put_to_nb; borrows;
        }
        $driver! { op
            /// Reads `len` bytes at `offset` of a published segment, or of a block, into a
            /// new `Vec` ([`GetFrom`](crate::endpoint::start::GetFrom); a block's end bounds
            /// it, as `put_to`'s).
            get_from [] (remote: &$crate::segment::RemoteSegment, offset: usize, len: usize) -> Vec<u8>
                = $crate::endpoint::start::GetFrom::new(remote, offset, len); nb get_from_nb; owns;
        }
        $driver! { op
            /// Reads `dst.len()` bytes at `offset` of a published segment into `dst`, and
            /// gives `dst` back filled ([`GetFromInto`](crate::endpoint::start::GetFromInto)).
            get_from_into ['b] (remote: &$crate::segment::RemoteSegment, offset: usize, dst: &'b mut [u8]) -> &'b mut [u8]
                = $crate::endpoint::start::GetFromInto::new(remote, offset, dst); nb get_from_into_nb; borrows;
        }
        $driver! { op
            /// Applies `op` to the word at `offset` of a published segment, or of a block,
            /// and completes with its old value ([`AtomicAt`](crate::endpoint::start::AtomicAt);
            /// a block's end bounds it, as `put_to`'s).
            atomic_at [W: $crate::atomic::AtomicWord + $crate::op::Outcome<Value = W> + 'static]
                (remote: &$crate::segment::RemoteSegment, offset: usize, op: $crate::atomic::AtomicOp<W>) -> W
                = $crate::endpoint::start::AtomicAt::new(remote, offset, op); nb atomic_at_nb; owns;
        }
        $driver! { op
            /// Gathers every member's `block` (same length everywhere)
            /// and completes with all of them in team order
            /// ([`TeamAllGather`](crate::endpoint::start::TeamAllGather)). Collective over the
            /// team, as `team_barrier`.
            team_all_gather [] (team: &$crate::team::Team, block: &[u8]) -> Vec<u8>
                = $crate::endpoint::start::TeamAllGather::new(team, block); nb team_all_gather_nb; owns;
        }
        $driver! { op
            /// Broadcasts the bytes team rank `root` gives (the others give `&[]`) to every
            /// member of `team`, which completes with them
            /// ([`TeamBroadcast`](crate::endpoint::start::TeamBroadcast)). Collective over the
            /// team, as `team_barrier`.
            team_broadcast [] (team: &$crate::team::Team, root: u32, data: &[u8]) -> Vec<u8>
                = $crate::endpoint::start::TeamBroadcast::new(team, root, data); nb team_broadcast_nb; owns;
        }
        $driver! { op
            /// Gathers every member's `block` (same length everywhere) to team rank `root`,
            /// which completes with all of them in team order; the others with an empty `Vec`
            /// ([`TeamGather`](crate::endpoint::start::TeamGather)). Collective over the team.
            team_gather [] (team: &$crate::team::Team, root: u32, block: &[u8]) -> Vec<u8>
                = $crate::endpoint::start::TeamGather::new(team, root, block); nb team_gather_nb; owns;
        }
        $driver! { op
            /// Reduces every member's `data` element by element with `op`, in team order, to
            /// team rank `root`, which completes with the result; the others with an empty
            /// `Vec` ([`TeamReduce`](crate::endpoint::start::TeamReduce)): `team_reduce(&team,
            /// 0, ReduceOp::Sum, &[x])`. Collective over the team.
            team_reduce [E: $crate::reduce::Element]
                (team: &$crate::team::Team, root: u32, op: $crate::reduce::ReduceOp, data: &[E]) -> Vec<E>
                = $crate::endpoint::start::TeamReduce::new(team, Some(root), op, data); nb team_reduce_nb; owns;
        }
        $driver! { op
            /// Reduces every member's `data` element by element with `op`, in team order, and
            /// completes with the result on every member, the same bit for bit everywhere
            /// ([`TeamReduce`](crate::endpoint::start::TeamReduce) with no root):
            /// `team_all_reduce(&team, ReduceOp::Max, &[x])`. Collective over the team.
            team_all_reduce [E: $crate::reduce::Element]
                (team: &$crate::team::Team, op: $crate::reduce::ReduceOp, data: &[E]) -> Vec<E>
                = $crate::endpoint::start::TeamReduce::new(team, None, op, data); nb team_all_reduce_nb; owns;
        }
        $driver! { op
            /// Broadcasts `len` bytes at `src` of team rank `root`'s segment 0 into `dest` of
            /// every member's, straight between the segments
            /// ([`TeamBroadcastInSegment`](crate::endpoint::start::TeamBroadcastInSegment);
            /// OpenSHMEM's `shmem_broadcastmem`): `team_broadcast_in_segment(&world, 0,
            /// a.offset(), b.offset(), len)`. Collective over the team.
            team_broadcast_in_segment [] (team: &$crate::team::Team, root: u32, src: usize, dest: usize, len: usize) -> ()
                = $crate::endpoint::start::TeamBroadcastInSegment::new(team, root, src, dest, len); nb team_broadcast_in_segment_nb; owns;
        }
        $driver! { op
            /// Reduces `count` elements of `E` at `src` of every member's segment 0 by `op`,
            /// in team order, into `dest` of every member's, straight between the segments
            /// ([`TeamAllReduceInSegment`](crate::endpoint::start::TeamAllReduceInSegment);
            /// OpenSHMEM's `shmem_sum_reduce`): `team_all_reduce_in_segment::<f64>(&world,
            /// ReduceOp::Sum, a.offset(), b.offset(), n)`. Collective over the team.
            team_all_reduce_in_segment [E: $crate::reduce::Element]
                (team: &$crate::team::Team, op: $crate::reduce::ReduceOp, src: usize, dest: usize, count: usize) -> ()
                = $crate::endpoint::start::TeamAllReduceInSegment::<E>::new(team, op, src, dest, count); nb team_all_reduce_in_segment_nb; owns;
        }
        $driver! { implicit
            /// Starts a put inside the implicit set ([`Put`](crate::endpoint::start::Put)):
            /// `wait_nbi` completes it with the others.
            put_nbi = put_nb (dest: $crate::Rank, offset: usize, data: &[u8]);
        }
        $driver! { post
            /// Posts a non-fetching remote atomic inside the implicit set (OpenSHMEM's
            /// `shmem_atomic_xor` and kin; [`Atomic`](crate::endpoint::start::Atomic) for the
            /// rest): it takes effect by the next `wait_nbi`, `quiesce` or `barrier` at the
            /// latest (every rank leaving the barrier sees it), and before any later
            /// request, put, get or atomic of this rank to the same target, in the order
            /// posted. Where the transport applies atomics itself, posted ones go to it in
            /// batches of 64 ([`Rma::Atomics`](crate::transport::Rma::Atomics)) whose words
            /// it fetches first, so that a stream of them to random words keeps several
            /// memory misses in flight; elsewhere they go out as messages nobody waits for,
            /// one per target for the (up to 64) atomics queued for it. Errors (a lost
            /// target) may come from the call that applies them.
            atomic_nbi [W: $crate::atomic::AtomicWord]
                (dest: $crate::Rank, offset: usize, op: $crate::atomic::AtomicOp<W>)
                = |ep, t| ep.atomic_nbi(t, dest, offset, op);
        }
        $driver! { request
            /// Sends an AM Short request.
            request_short, try_request_short (dest: $crate::Rank, handler: $crate::HandlerId, args: &[u32])
                = (dest, $crate::AmKind::Short, handler, args, &[], None);
        }
        $driver! { request
            /// Sends an AM Medium request (payload up to the transport's `max_medium`).
            request_medium, try_request_medium
                (dest: $crate::Rank, handler: $crate::HandlerId, args: &[u32], payload: &[u8])
                = (dest, $crate::AmKind::Medium, handler, args, payload, None);
        }
        $driver! { request
            /// Sends an AM Long request: `payload` lands at `offset` in `dest`'s segment,
            /// then the handler runs there.
            request_long, try_request_long
                (dest: $crate::Rank, handler: $crate::HandlerId, args: &[u32], payload: &[u8], offset: usize)
                = (dest, $crate::AmKind::Long, handler, args, payload, Some(offset));
        }
        $driver! { wait
            /// Waits until every request this rank sent has been answered, every refused
            /// reply has gone out and every one-sided operation is remotely complete: the
            /// fence of one-sided operations (OpenSHMEM's `shmem_quiet`), and what to run
            /// before dropping a node so that peers are not left without their replies.
            quiesce () = |ep, t| ep.quiesce_step(t);
        }
        $driver! { wait
            /// Waits until the `u64` at `offset` of this rank's segment compares with
            /// `value` as `cmp` says (OpenSHMEM's `shmem_wait_until`), making progress
            /// meanwhile and sleeping as the wait mode says: a put-with-signal
            /// (`put_signal`) to this rank wakes it, on every transport. A word changed
            /// otherwise (a plain put or atomic by the NIC) is seen at the next progress. An
            /// offset misaligned or outside the segment is an error; so is a wait nobody can
            /// end (a peer lost, or every other rank gone).
            wait_word (offset: usize, cmp: $crate::atomic::Cmp, value: u64)
                = |ep, t| ep.word_step(t, offset, cmp, value);
        }
        $driver! { wait
            /// Waits until the implicit set is complete: every `x_nbi` operation and
            /// posted atomic of this rank (GASNet-EX's `gex_NBI_Wait`), without waiting
            /// for AM replies as `quiesce` does. Fails with the first error of the set.
            wait_nbi () = |ep, t| ep.nbi_step(t);
        }
    };
}
pub(crate) use operations;

/// A [`Start`] that a future may own whole: the async driver's `x` and `x_nb` of an operation
/// that `owns` its arguments take them by copy, so that the future is `'static` (it can be
/// boxed, stored and spawned).
pub(crate) trait Owned: Start {
    type Owned: Start<Output = Self::Output> + 'static;
    fn owned(self) -> Self::Owned;
}

impl Owned for Get {
    type Owned = Get;
    fn owned(self) -> Get {
        self
    }
}

impl<W: AtomicWord + Outcome + 'static> Owned for Atomic<W> {
    type Owned = Atomic<W>;
    fn owned(self) -> Atomic<W> {
        self
    }
}

impl Owned for Barrier {
    type Owned = Barrier;
    fn owned(self) -> Barrier {
        self
    }
}

impl Owned for Call<'_> {
    type Owned = Call<'static>;
    fn owned(self) -> Call<'static> {
        self.into_owned()
    }
}

impl Owned for TeamBarrier {
    type Owned = TeamBarrier;
    fn owned(self) -> TeamBarrier {
        self
    }
}

impl Owned for PutFromSegment {
    type Owned = PutFromSegment;
    fn owned(self) -> PutFromSegment {
        self
    }
}

impl<M: crate::typed::Am> Owned for TypedCall<M> {
    type Owned = TypedCall<M>;
    fn owned(self) -> TypedCall<M> {
        self
    }
}

impl<R: serde::Serialize + 'static> Owned for AnswerTyped<R> {
    type Owned = AnswerTyped<R>;
    fn owned(self) -> AnswerTyped<R> {
        self
    }
}

impl<M: crate::typed::Am> Owned for PostTyped<M> {
    type Owned = PostTyped<M>;
    fn owned(self) -> PostTyped<M> {
        self
    }
}

impl Owned for PutToFromSegment {
    type Owned = PutToFromSegment;
    fn owned(self) -> PutToFromSegment {
        self
    }
}

impl Owned for GetFromIntoSegment {
    type Owned = GetFromIntoSegment;
    fn owned(self) -> GetFromIntoSegment {
        self
    }
}

impl Owned for GetIntoSegment {
    type Owned = GetIntoSegment;
    fn owned(self) -> GetIntoSegment {
        self
    }
}

impl Owned for AllocSymmetric {
    type Owned = AllocSymmetric;
    fn owned(self) -> AllocSymmetric {
        self
    }
}

impl Owned for FreeSymmetric {
    type Owned = FreeSymmetric;
    fn owned(self) -> FreeSymmetric {
        self
    }
}

impl Owned for TeamAllGather<'_> {
    type Owned = TeamAllGather<'static>;
    fn owned(self) -> TeamAllGather<'static> {
        self.into_owned()
    }
}

impl Owned for Split {
    type Owned = Split;
    fn owned(self) -> Split {
        self
    }
}

impl Owned for TeamBroadcast<'_> {
    type Owned = TeamBroadcast<'static>;
    fn owned(self) -> TeamBroadcast<'static> {
        TeamBroadcast {
            team: self.team,
            root: self.root,
            data: Cow::Owned(self.data.into_owned()),
        }
    }
}

impl Owned for TeamGather<'_> {
    type Owned = TeamGather<'static>;
    fn owned(self) -> TeamGather<'static> {
        TeamGather {
            team: self.team,
            root: self.root,
            block: Cow::Owned(self.block.into_owned()),
        }
    }
}

impl<E: Element> Owned for TeamReduce<E> {
    type Owned = TeamReduce<E>;
    fn owned(self) -> TeamReduce<E> {
        self
    }
}

impl Owned for TeamBroadcastInSegment {
    type Owned = TeamBroadcastInSegment;
    fn owned(self) -> TeamBroadcastInSegment {
        self
    }
}

impl<E: Element> Owned for TeamAllReduceInSegment<E> {
    type Owned = TeamAllReduceInSegment<E>;
    fn owned(self) -> TeamAllReduceInSegment<E> {
        self
    }
}

impl Owned for PublishSegment {
    type Owned = PublishSegment;
    fn owned(self) -> PublishSegment {
        self
    }
}

impl Owned for FreeSegment {
    type Owned = FreeSegment;
    fn owned(self) -> FreeSegment {
        self
    }
}

impl Owned for GetFrom {
    type Owned = GetFrom;
    fn owned(self) -> GetFrom {
        self
    }
}

impl<W: AtomicWord + Outcome + 'static> Owned for AtomicAt<W> {
    type Owned = AtomicAt<W>;
    fn owned(self) -> AtomicAt<W> {
        self
    }
}
