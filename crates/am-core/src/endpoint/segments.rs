//! Segments as values ([`crate::segment`]): creating them, publishing and freeing them on a
//! team (collectives whose completion changes what this rank knows), and the puts, gets and
//! atomics that name one.

use std::task::{ready, Poll};

use super::coll::{Args, Data};
use super::Endpoint;
use crate::atomic::{Atomic, AtomicOp, AtomicWord, Refused};
use crate::error::AmError;
use crate::handler::Threading;
use crate::op::{Op, Outcome, Raw};
use crate::protocol::CollectiveKind;
use crate::reply::segment_range;
use crate::segment::{
    free_block, publish_block, Reach, RemoteSegment, SegOp, SegStep, SegmentId, CONTROL_WORDS,
};
use crate::team::Team;
use crate::transport::{KeyedRequests, OwnRange, Remote, RmaRequests, SharedBytes, Transport};
use crate::types::{AmKind, Rank};

/// The offset in a created segment's registration (which starts at its control words) of
/// `len` bytes at byte `offset` of a segment of `size` bytes (checked already: an offset
/// past what the registration can address is out of bounds all the same).
fn rma_offset(offset: usize, len: usize, size: usize) -> Result<usize, AmError> {
    offset
        .checked_add(CONTROL_WORDS)
        .ok_or(AmError::SegmentOutOfBounds {
            offset: offset as u64,
            len: len as u64,
            size,
        })
}

/// Checks `len` bytes at `offset` of segment `id` of `rank`, whose size is `size` (`None`:
/// not known here): the size, if the segment is known and the range inside it.
fn check_in_segment(
    rank: Rank,
    id: SegmentId,
    size: Option<usize>,
    offset: usize,
    len: usize,
) -> Result<usize, AmError> {
    let size = size.ok_or(AmError::UnknownSegment { rank, id })?;
    match segment_range(offset as u64, len as u64, size) {
        Some(_) => Ok(size),
        None => Err(AmError::SegmentOutOfBounds {
            offset: offset as u64,
            len: len as u64,
            size,
        }),
    }
}

/// The bytes of this rank's segment that `own` stands for ([`Endpoint::own_handle`]): the
/// created segment's byte area, or `t`'s segment 0 for `None`.
fn own_byte_area<'a, T: Transport + ?Sized>(
    own: &'a Option<am_shm::Segment>,
    t: &'a T,
) -> SharedBytes<'a> {
    own.as_ref().map_or_else(|| t.segment(), |s| s.byte_area())
}

impl<H: Threading> Endpoint<H> {
    /// Creates a segment of `len` bytes bound to this endpoint, all zero
    /// ([`crate::Node::create_segment`]): its id, never reused.
    pub fn create_segment(&mut self, len: usize) -> Result<SegmentId, AmError> {
        self.segments.create(len)
    }

    /// The bytes of this rank's segment `id`: segment 0 is `t`'s; `None` for an id this rank
    /// never created or freed.
    pub fn segment_at<'a, T: Transport + ?Sized>(
        &'a self,
        t: &'a T,
        id: SegmentId,
    ) -> Option<SharedBytes<'a>> {
        match id {
            SegmentId::ZERO => Some(t.segment()),
            id => self.segments.own_bytes(id.get()),
        }
    }

    /// The length of this rank's segment `id`, if it holds one.
    fn own_segment_len(&self, id: SegmentId) -> Option<usize> {
        match id {
            SegmentId::ZERO => Some(self.seg_len),
            id => self.segments.own_len(id),
        }
    }

    /// Segment collectives whose slot completed without passing through
    /// [`Endpoint::segment_end`] (a failure that ends slots wholesale) are forgotten.
    fn tidy_segment_ops(&mut self) {
        let ops = std::mem::take(&mut self.teams.seg_ops);
        self.teams.seg_ops = ops
            .into_iter()
            .filter(|s| self.slot_pending(s.index, s.gen))
            .collect();
    }

    /// Starts a publication of this rank's segment `id` on `team`
    /// ([`crate::endpoint::start::PublishSegment`]): an all-gather of every member's id,
    /// length and key, which completes with every member's [`RemoteSegment`] in team order.
    /// A segment this rank does not hold still takes part, refused: the publication then
    /// fails on every member with [`AmError::UnknownSegment`] naming this rank, rather than
    /// leaving the others waiting.
    pub fn publish_segment_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        id: SegmentId,
    ) -> Poll<Result<Op<Vec<RemoteSegment>>, AmError>> {
        let reach = Reach::of(t.info().capabilities);
        let map_key = match reach {
            Reach::Map => self.segments.own_key(id),
            Reach::Rma | Reach::Messages => None,
        };
        let rma_key = match reach {
            Reach::Rma => self.segments.own_rma_key(t, id),
            Reach::Map | Reach::Messages => None,
        };
        let key = match (&map_key, &rma_key) {
            (Some(k), _) => Some(k.as_published()),
            (None, Some(k)) => Some((&k[..], 0)),
            (None, None) => None,
        };
        let published = self.own_segment_len(id).map(|len| (len, key));
        let block = publish_block(id, published);
        self.segment_collective(t, team, &block, SegStep::Publish { reach })
    }

    /// Starts a free of this rank's segment `id` on `team`
    /// ([`crate::endpoint::start::FreeSegment`]): an all-gather of every member's freed id,
    /// after which this rank's is unmapped and every member's forgotten here. A member that
    /// published segment 0 frees it as nothing (it stays). A segment this rank does not
    /// hold takes part refused, as in a publication: every member fails, and nothing is
    /// freed anywhere.
    pub fn free_segment_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        id: SegmentId,
    ) -> Poll<Result<Op<()>, AmError>> {
        let refused = id != SegmentId::ZERO && self.segments.own_len(id).is_none();
        let block = free_block(id, refused);
        self.segment_collective(t, team, &block, SegStep::Free(id))
    }

    fn segment_collective<T: Transport + ?Sized, U: Outcome>(
        &mut self,
        t: &mut T,
        team: &Team,
        block: &[u8],
        step: SegStep,
    ) -> Poll<Result<Op<U>, AmError>> {
        self.tidy_segment_ops();
        let args = Args {
            kind: match step {
                SegStep::Publish { .. } => CollectiveKind::PublishSegment,
                SegStep::Free(_) => CollectiveKind::FreeSegment,
            },
            root: 0,
            red: None,
            data: Data::Borrowed(block),
            heap: None,
            seg: Some((team.members().to_vec(), step)),
        };
        let (index, gen) = ready!(self.collective_start(t, team, args))?;
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// The segment collective `op` completed with `outcome` (every member's block): applied
    /// to what this rank knows, and the operation's outcome.
    pub(super) fn segment_end(
        &mut self,
        op: SegOp,
        outcome: Result<Vec<u8>, AmError>,
    ) -> Result<Vec<u8>, AmError> {
        let blocks = outcome?;
        match op.step {
            SegStep::Publish { reach } => {
                self.segments
                    .published(self.rank, &op.members, &blocks, reach)
            }
            SegStep::Free(id) => self
                .segments
                .freed(&op.members, &blocks, id)
                .map(|()| Vec::new()),
        }
    }

    /// Ends the transport's registrations of this rank's segments whose free retired them
    /// ([`crate::segment::Segments::freed`]). Every poll calls it (a free completes as a
    /// message is handled); until then, or until the transport closes, the registration
    /// stays.
    #[cold]
    pub(super) fn retire_segments<T: Transport + ?Sized>(&mut self, t: &mut T) {
        for id in std::mem::take(&mut self.segments.retired) {
            t.registration(crate::transport::Registration::Deregister { id });
        }
    }

    /// Checks an operation on `len` bytes at `offset` of `remote` before anything is done:
    /// the segment still known here, the range inside it, and its owner not gone.
    fn check_remote(
        &self,
        remote: &RemoteSegment,
        offset: usize,
        len: usize,
    ) -> Result<usize, AmError> {
        let (rank, id) = (remote.rank(), remote.id());
        self.check_rank(rank)?;
        let known = match id {
            SegmentId::ZERO => Some(self.seg_len),
            _ if rank == self.rank => self.segments.own_len(id),
            _ => self.segments.known_len(rank, id),
        };
        let size = check_in_segment(rank, id, known, offset, len)?;
        match self.waiting_for(rank) {
            Poll::Ready(e) => Err(e),
            Poll::Pending => Ok(size),
        }
    }

    /// Starts a put of `data` at `offset` of `remote` ([`crate::endpoint::start::PutTo`]):
    /// on segment 0 the put of [`Endpoint::put_start`]; on this rank's own segment, or a
    /// peer's that this rank maps, a copy, complete now; on a peer's that its transport
    /// registered ([`crate::Capabilities::rma_segments`]) the transport's put, complete now;
    /// otherwise system Mediums that the owner's progress writes ([`Endpoint::put_step`]
    /// sends them).
    pub fn put_to_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        remote: &RemoteSegment,
        offset: usize,
        data: &[u8],
    ) -> Poll<Result<Op<()>, AmError>> {
        // A block's range, checked against the block: the whole segment's from here on.
        let (whole, offset) = match remote.resolve(offset, data.len()) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let remote = &whole;
        let (rank, id) = (remote.rank(), remote.id());
        if id == SegmentId::ZERO {
            return self.put_start(t, rank, offset, data);
        }
        if let Err(e) = self.check_remote(remote, offset, data.len()) {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        // Nothing to move: done, on every path alike (no message, no mapping).
        if data.is_empty() {
            return Poll::Ready(Ok(Op::ready(Raw::Unit)));
        }
        if let Some(view) = self.reachable(rank, id) {
            let put = view.and_then(|v| Ok(crate::rma::put_into(rank, v, offset, data)?));
            return Poll::Ready(put.map(|()| Op::ready(Raw::Unit)));
        }
        if let Some(key) = self.segments.rma_key(rank, id) {
            let at = rma_offset(offset, data.len(), remote.len())?;
            let put = || t.put_keyed(rank, key.bytes(), at, data).map(|w| ((), w));
            ready!(self.keyed_rma(rank, id, put))?;
            return Poll::Ready(Ok(Op::ready(Raw::Unit)));
        }
        let (index, gen) = self.alloc_op(rank, offset, data.len(), Vec::new());
        self.ops[index as usize].seg = id.get();
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// Starts a Long request into `remote`, a created segment
    /// ([`crate::endpoint::start::LongTo`]): checks the request (its target, a handler
    /// registered as a Long request, the arguments) and the range, then starts the put of
    /// its payload ([`Endpoint::put_to_start`]). Once that put is complete,
    /// [`Endpoint::long_in_segment_step`] sends the request's head.
    #[allow(clippy::too_many_arguments)]
    pub fn long_to_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        remote: &RemoteSegment,
        offset: usize,
        handler: crate::types::HandlerId,
        args: &[u32],
        payload: &[u8],
    ) -> Poll<Result<Op<()>, AmError>> {
        // The payload goes by put, so the transport's largest Long does not bound it; the
        // head's length field does.
        let checked = self
            .check_request(remote.rank(), AmKind::Long, handler, args, 0, None)
            .and_then(|()| match u32::try_from(payload.len()) {
                Ok(_) => Ok(()),
                Err(_) => Err(AmError::PayloadTooLarge {
                    kind: AmKind::Long,
                    len: payload.len(),
                    max: u32::MAX as usize,
                }),
            });
        if let Err(e) = checked {
            return Poll::Ready(Err(e));
        }
        self.put_to_start(t, remote, offset, payload)
    }

    /// Starts a get of `len` bytes at `offset` of `remote`
    /// ([`crate::endpoint::start::GetFrom`]), as [`Endpoint::put_to_start`]: the get of
    /// [`Endpoint::get_start`] on segment 0, a copy from this rank's own segment or a mapped
    /// one, the transport's get from a registered one, system messages otherwise
    /// ([`Endpoint::get_step`]).
    pub fn get_from_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        remote: &RemoteSegment,
        offset: usize,
        len: usize,
    ) -> Poll<Result<Op<Vec<u8>>, AmError>> {
        // A block's range, checked against the block: the whole segment's from here on.
        let (whole, offset) = match remote.resolve(offset, len) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let remote = &whole;
        let (rank, id) = (remote.rank(), remote.id());
        if id == SegmentId::ZERO {
            return self.get_start(t, rank, offset, len);
        }
        // Checked before the bytes are allocated.
        if let Err(e) = self.check_remote(remote, offset, len) {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        let mut data = vec![0; len];
        if len == 0 {
            return Poll::Ready(Ok(Op::ready(Raw::Bytes(data))));
        }
        if let Some(view) = self.reachable(rank, id) {
            let get = view.and_then(|v| Ok(crate::rma::get_from(rank, v, offset, &mut data)?));
            return Poll::Ready(get.map(|()| Op::ready(Raw::Bytes(data))));
        }
        if let Some(key) = self.segments.rma_key(rank, id) {
            let at = rma_offset(offset, len, remote.len())?;
            let get = || {
                t.get_keyed(rank, key.bytes(), at, &mut data)
                    .map(|w| ((), w))
            };
            ready!(self.keyed_rma(rank, id, get))?;
            return Poll::Ready(Ok(Op::ready(Raw::Bytes(data))));
        }
        let (index, gen) = self.alloc_op(rank, offset, len, data);
        self.ops[index as usize].seg = id.get();
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// Starts a get into `dst`, a buffer of the caller's, from `offset` of `remote`
    /// ([`crate::endpoint::start::GetFromInto`]), as [`Endpoint::get_from_start`]: a handle
    /// complete when started once the bytes are in `dst` (segment 0 through a NIC that reads
    /// peers' memory, this rank's own segment, a mapped one, a registered one), otherwise
    /// the get by messages,
    /// whose completion copies its bytes into `dst`.
    pub fn get_from_into_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        remote: &RemoteSegment,
        offset: usize,
        dst: &mut [u8],
    ) -> Poll<Result<Op<()>, AmError>> {
        // A block's range, checked against the block: the whole segment's from here on.
        let (whole, offset) = match remote.resolve(offset, dst.len()) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let remote = &whole;
        let (rank, id) = (remote.rank(), remote.id());
        if id == SegmentId::ZERO {
            return self.get_into_start(t, rank, offset, dst);
        }
        if let Err(e) = self.check_remote(remote, offset, dst.len()) {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        if dst.is_empty() {
            return Poll::Ready(Ok(Op::ready(Raw::Unit)));
        }
        if let Some(view) = self.reachable(rank, id) {
            let read = view.and_then(|v| Ok(crate::rma::get_from(rank, v, offset, dst)?));
            return Poll::Ready(read.map(|()| Op::ready(Raw::Unit)));
        }
        if let Some(key) = self.segments.rma_key(rank, id) {
            let at = rma_offset(offset, dst.len(), remote.len())?;
            let get = || t.get_keyed(rank, key.bytes(), at, dst).map(|w| ((), w));
            ready!(self.keyed_rma(rank, id, get))?;
            return Poll::Ready(Ok(Op::ready(Raw::Unit)));
        }
        let (index, gen) = self.alloc_op(rank, offset, dst.len(), vec![0; dst.len()]);
        self.ops[index as usize].seg = id.get();
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// Checks `len` bytes at `offset` of this rank's own segment `id`: held here, and the
    /// range inside it.
    fn check_own(&self, id: SegmentId, offset: usize, len: usize) -> Result<(), AmError> {
        check_in_segment(self.rank, id, self.own_segment_len(id), offset, len).map(|_| ())
    }

    /// Another handle on this rank's created segment `id`, so that its bytes are read or
    /// written while the transport is borrowed too; `None` for segment 0 (the transport's).
    fn own_handle(&self, id: SegmentId) -> Result<Option<am_shm::Segment>, AmError> {
        match id {
            SegmentId::ZERO => Ok(None),
            id => match self.segments.own_share(id) {
                Some(seg) => Ok(Some(seg)),
                None => Err(AmError::UnknownSegment {
                    rank: self.rank,
                    id,
                }),
            },
        }
    }

    /// Starts a put from a range of one of this rank's segments to a published one
    /// ([`crate::endpoint::start::PutToFromSegment`]): `len` bytes at `at` of this rank's segment
    /// `local` to `offset` of `remote`, with no slice of the caller's in between. Both on segment
    /// 0, it is [`Endpoint::put_from_segment_start`]. Otherwise one copy from mapping to mapping
    /// where this rank reaches the target's memory (its own segments, a peer's it maps, a peer's
    /// segment 0 where the transport copies from a created segment itself:
    /// [`Source::Segment`](crate::transport::Source::Segment)); a created segment's range to a
    /// registered segment goes by [`Remote::Keyed`](crate::transport::Remote::Keyed), which may
    /// write straight from it; elsewhere the range is read into `bounce`, which goes by the
    /// transport's RMA on a registered segment
    /// ([`Remote::Keyed`](crate::transport::Remote::Keyed)), or as the messages of
    /// [`Endpoint::put_step`]. Either range outside its segment, or a segment not held or published
    /// here, is an error, and nothing is written.
    #[allow(clippy::too_many_arguments)]
    pub fn put_to_from_segment_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        remote: &RemoteSegment,
        offset: usize,
        local: SegmentId,
        at: usize,
        len: usize,
        bounce: &mut Vec<u8>,
    ) -> Poll<Result<Op<()>, AmError>> {
        // A block's range, checked against the block: the whole segment's from here on.
        let (whole, offset) = match remote.resolve(offset, len) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let remote = &whole;
        let (rank, id) = (remote.rank(), remote.id());
        if local == SegmentId::ZERO && id == SegmentId::ZERO {
            return self.put_from_segment_start(t, rank, offset, at, len, bounce);
        }
        let checked = self
            .check_remote(remote, offset, len)
            .and_then(|_| self.check_own(local, at, len));
        if let Err(e) = checked {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        if len == 0 {
            return Poll::Ready(Ok(Op::ready(Raw::Unit)));
        }
        let own = self.own_handle(local)?;
        match (&own, id) {
            (Some(seg), SegmentId::ZERO) => {
                // From a created segment to a segment 0.
                let from = seg.byte_area();
                if rank == self.rank {
                    crate::rma::copy_to(rank, t.segment(), offset, from, at, len)?;
                    return Poll::Ready(Ok(Op::ready(Raw::Unit)));
                }
                if t.info().capabilities.put {
                    let src = OwnRange::new(local, at, crate::rma::own_slice(from, at, len)?);
                    ready!(self.nic_rma(|| t.put_from(rank, Remote::At(offset), src).map(drop)))?;
                    return Poll::Ready(Ok(Op::ready(Raw::Unit)));
                }
                bounce.resize(len, 0);
                crate::rma::get_from(self.rank, from, at, bounce)?;
                let (index, gen) = self.alloc_op(rank, offset, len, Vec::new());
                return Poll::Ready(Ok(self.slot_op(index, gen)));
            }
            _ => {
                // To a created segment, from either kind.
                let from = own_byte_area(&own, t);
                if let Some(view) = self.reachable(rank, id) {
                    crate::rma::copy_to(rank, view?, offset, from, at, len)?;
                    return Poll::Ready(Ok(Op::ready(Raw::Unit)));
                }
                // A created segment's range goes to a registered one as it is, for a NIC
                // that registered this segment too to write straight from it; segment 0's
                // bytes borrow the transport, so they go through `bounce`.
                if let (Some(seg), Some(key)) = (&own, self.segments.rma_key(rank, id)) {
                    let to = rma_offset(offset, len, remote.len())?;
                    let src =
                        OwnRange::new(local, at, crate::rma::own_slice(seg.byte_area(), at, len)?);
                    let put = || {
                        t.put_from(
                            rank,
                            Remote::Keyed {
                                key: key.bytes(),
                                offset: to,
                            },
                            src,
                        )
                        .map(|w| ((), w))
                    };
                    ready!(self.keyed_rma(rank, id, put))?;
                    return Poll::Ready(Ok(Op::ready(Raw::Unit)));
                }
                bounce.resize(len, 0);
                crate::rma::get_from(self.rank, from, at, bounce)?;
            }
        }
        // The bytes are in `bounce`: the rest is a put of them (by RMA to a registered
        // segment, or messages that the operation's sending step sends from `bounce`).
        self.put_to_start(t, remote, offset, bounce)
    }

    /// Starts a get from a published segment into a range of one of this rank's
    /// ([`crate::endpoint::start::GetFromIntoSegment`]): `len` bytes at `offset` of `remote` to
    /// `at` of this rank's segment `local`, as [`Endpoint::put_to_from_segment_start`]: both on
    /// segment 0, it is [`Endpoint::get_into_segment_start`]; one copy from mapping to mapping
    /// where this rank reaches the source's memory
    /// ([`Sink::Segment`](crate::transport::Sink::Segment)), or the transport's RMA into a buffer
    /// copied into place; `None` comes back: done. Otherwise the get by messages, whose bytes the
    /// caller writes at `at` of `local` once they have come.
    #[allow(clippy::too_many_arguments)]
    pub fn get_from_into_segment_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        remote: &RemoteSegment,
        offset: usize,
        local: SegmentId,
        at: usize,
        len: usize,
    ) -> Poll<Result<Option<Op<Vec<u8>>>, AmError>> {
        // A block's range, checked against the block: the whole segment's from here on.
        let (whole, offset) = match remote.resolve(offset, len) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let remote = &whole;
        let (rank, id) = (remote.rank(), remote.id());
        if local == SegmentId::ZERO && id == SegmentId::ZERO {
            return self.get_into_segment_start(t, rank, offset, at, len);
        }
        let checked = self
            .check_remote(remote, offset, len)
            .and_then(|_| self.check_own(local, at, len));
        if let Err(e) = checked {
            return Poll::Ready(Err(e));
        }
        if id == SegmentId::ZERO && rank != self.rank && !t.info().capabilities.get {
            return self.get_start(t, rank, offset, len).map_ok(Some);
        }
        ready!(self.apply_posted(t))?;
        if len == 0 {
            return Poll::Ready(Ok(None));
        }
        let own = self.own_handle(local)?;
        if let (Some(seg), SegmentId::ZERO) = (&own, id) {
            // From a segment 0 to a created segment.
            let to = seg.byte_area();
            if rank == self.rank {
                crate::rma::copy_from(rank, t.segment(), offset, to, at, len)?;
            } else {
                let dst = OwnRange::new(local, at, crate::rma::own_slice(to, at, len)?);
                ready!(self.nic_rma(|| t.get_into(rank, Remote::At(offset), dst).map(drop)))?;
            }
            return Poll::Ready(Ok(None));
        }
        // From a created segment, to either kind.
        if let Some(view) = self.reachable(rank, id) {
            let to = own_byte_area(&own, t);
            crate::rma::copy_from(rank, view?, offset, to, at, len)?;
            return Poll::Ready(Ok(None));
        }
        if let Some(key) = self.segments.rma_key(rank, id) {
            let mut data = vec![0; len];
            let from = rma_offset(offset, len, remote.len())?;
            let get = || {
                t.get_keyed(rank, key.bytes(), from, &mut data)
                    .map(|w| ((), w))
            };
            ready!(self.keyed_rma(rank, id, get))?;
            let to = own_byte_area(&own, t);
            crate::rma::put_into(self.rank, to, at, &data)?;
            return Poll::Ready(Ok(None));
        }
        self.get_from_start(t, remote, offset, len).map_ok(Some)
    }

    /// Starts an atomic on the word at `offset` of `remote`
    /// ([`crate::endpoint::start::AtomicAt`]), as [`Endpoint::put_to_start`]: the atomic of
    /// [`Endpoint::atomic_start`] on segment 0, applied now on this rank's own segment or a
    /// mapped one, by the transport on a registered one where it applies atomics, a system
    /// message that the owner's progress applies otherwise.
    pub fn atomic_at_start<T: Transport + ?Sized, W: AtomicWord + Outcome>(
        &mut self,
        t: &mut T,
        remote: &RemoteSegment,
        offset: usize,
        op: AtomicOp<W>,
    ) -> Poll<Result<Op<W>, AmError>> {
        // A block's range, checked against the block: the whole segment's from here on.
        let atomic = Atomic::from(op);
        let width = atomic.width().bytes();
        let (whole, offset) = match remote.resolve(offset, width) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let remote = &whole;
        let (rank, id) = (remote.rank(), remote.id());
        if id == SegmentId::ZERO {
            return self.atomic_start(t, rank, offset, op);
        }
        let size = match self.check_remote(remote, offset, width) {
            Ok(size) => size,
            Err(e) => return Poll::Ready(Err(e)),
        };
        if let Err(e) = self.check_word_in(offset, &atomic, size) {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        if let Some(view) = self.reachable(rank, id) {
            let applied = view.and_then(|v| Ok(atomic.apply_to(rank, v, offset)?));
            return Poll::Ready(applied.map(|old| Op::ready(Raw::Word(old))));
        }
        // Where the transport applies atomics itself; otherwise the owner's progress does,
        // as on segment 0.
        let key = match t.info().capabilities.atomics {
            true => self.segments.rma_key(rank, id),
            false => None,
        };
        if let Some(key) = key {
            let at = rma_offset(offset, width, size)?;
            let apply = || t.atomic_keyed(rank, key.bytes(), at, atomic);
            let old = ready!(self.keyed_rma(rank, id, apply))?;
            return Poll::Ready(Ok(Op::ready(Raw::Word(old))));
        }
        let (index, gen) = self.alloc_atomic(rank, offset, atomic);
        self.ops[index as usize].seg = id.get();
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// An atomic's word at `offset` of a segment of `size` bytes: aligned, inside, and the
    /// operation defined on its type.
    pub(super) fn check_word_in(
        &self,
        offset: usize,
        atomic: &Atomic,
        size: usize,
    ) -> Result<(), AmError> {
        let width = atomic.width().bytes();
        match atomic.check(offset, size) {
            Ok(()) => Ok(()),
            Err(Refused::OutOfBounds) => Err(AmError::SegmentOutOfBounds {
                offset: offset as u64,
                len: width as u64,
                size,
            }),
            Err(Refused::Misaligned) => Err(AmError::Misaligned {
                offset: offset as u64,
                align: width,
            }),
            Err(_) => Err(AmError::InvalidAtomic(
                "a bitwise operation on a floating-point word",
            )),
        }
    }

    /// One operation on `rank`'s segment `id` by the transport's RMA (`rma`: its outcome and
    /// the segment's freed word, which the transport reads beside it, as a peer that maps
    /// the segment loads it): an operation that runs after the owner freed the segment (on
    /// a team without this rank, which still knows it) fails with
    /// [`AmError::UnknownSegment`], what it wrote landing in memory nobody reads (its owner
    /// keeps such a segment registered). `Pending` as [`Endpoint::put_start`].
    fn keyed_rma<R>(
        &mut self,
        rank: crate::types::Rank,
        id: SegmentId,
        rma: impl FnOnce() -> Result<(R, u64), crate::error::SendError>,
    ) -> Poll<Result<R, AmError>> {
        if self.detached_in_flight > 0 {
            return Poll::Pending;
        }
        match rma() {
            Ok((r, 0)) => Poll::Ready(Ok(r)),
            Ok(_) => Poll::Ready(Err(AmError::UnknownSegment { rank, id })),
            Err(crate::error::SendError::Busy) => Poll::Pending,
            Err(e) => Poll::Ready(Err(self.nic_failed(e))),
        }
    }

    /// Where this rank reaches `rank`'s created segment `id` itself, with no message: its
    /// own segment's bytes, or its mapping of a peer's ([`crate::segment::Segments::mapped`]);
    /// `None` where messages reach it; [`AmError::UnknownSegment`] where it is gone.
    fn reachable(
        &mut self,
        rank: crate::types::Rank,
        id: SegmentId,
    ) -> Option<Result<SharedBytes<'_>, AmError>> {
        let gone = AmError::UnknownSegment { rank, id };
        if rank == self.rank {
            return Some(self.segments.own_bytes(id.get()).ok_or(gone));
        }
        self.segments.mapped(rank, id).map(|m| m.map_err(|()| gone))
    }
}
