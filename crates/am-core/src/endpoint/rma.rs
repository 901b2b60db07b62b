//! One-sided operations: puts, gets and remote atomics, and the operation slots that track
//! those sent as messages.

use std::sync::Arc;
use std::task::{ready, Poll};

use super::state::{Detached, Endpoint, OpSlot};
use crate::atomic::{Atomic, AtomicOp, AtomicWord, Cmp, Signal};
use crate::error::{AmError, SendError};
use crate::handler::Threading;
use crate::op::{Op, Outcome, Raw, State};
use crate::protocol::{push_region_entry, SystemMsg, REGION_ENTRY_LEN};
use crate::rma::Regions;
use crate::transport::{Remote, Rma, RmaRequests, SharedBytes, Sink, Source, Transport, Tx};
use crate::types::Rank;

impl<H: Threading> Endpoint<H> {
    /// Starts a put of `data` into `dest`'s segment at `offset` ([`crate::endpoint::start::Put`]),
    /// after the posted atomics ([`Endpoint::atomic_nbi`]). Where the NIC writes peers' memory
    /// itself ([`Rma::Put`](crate::transport::Rma::Put)) the bytes are placed now and the handle is
    /// complete ([`Op::is_ready`]); a put to this rank is a copy into `t`'s segment; otherwise the
    /// put goes as AM Longs that [`Endpoint::put_step`] sends. `Pending`: nothing was done yet
    /// (posted atomics or the NIC wait for the device, or for credits): make progress and call
    /// again.
    pub fn put_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        dest: Rank,
        offset: usize,
        data: &[u8],
    ) -> Poll<Result<Op<()>, AmError>> {
        if let Err(e) = self.check_rma(dest, offset, data.len()) {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        if !ready!(self.write_now(t, dest, offset, data))? {
            let (index, gen) = self.alloc_op(dest, offset, data.len(), Vec::new());
            return Poll::Ready(Ok(self.slot_op(index, gen)));
        }
        Poll::Ready(Ok(Op::ready(Raw::Unit)))
    }

    /// Writes `data` into a checked range of `dest`'s segment where no message is needed
    /// (this rank's segment, or a NIC that writes peers' memory): whether it did.
    // Inlined: out of line, its large result costs a put 36 instructions.
    #[inline(always)]
    pub(super) fn write_now<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        dest: Rank,
        offset: usize,
        data: &[u8],
    ) -> Poll<Result<bool, AmError>> {
        if dest == self.rank {
            return Poll::Ready(match t.segment().write(offset, data) {
                Ok(()) => Ok(true),
                Err(_) => Err(self.out_of_bounds(offset as u64, data.len() as u64)),
            });
        }
        if !t.info().capabilities.put {
            return Poll::Ready(Ok(false));
        }
        ready!(self.nic_rma(|| t.put(dest, offset, data)))?;
        Poll::Ready(Ok(true))
    }

    /// Starts a put from this rank's own segment ([`crate::endpoint::start::PutFromSegment`]):
    /// `len` bytes at `local` here to `offset` of `dest`'s segment, after the posted atomics. Where
    /// the NIC writes peers' memory ([`Source::Own`](crate::transport::Source::Own)) or `dest` is
    /// this rank, it is one copy between the segments, complete now. Otherwise the range is read
    /// into `bounce` and goes as a put of it ([`Endpoint::put_step`] with `bounce`). Either range
    /// outside the segment is an error, and nothing is written.
    pub fn put_from_segment_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        dest: Rank,
        offset: usize,
        local: usize,
        len: usize,
        bounce: &mut Vec<u8>,
    ) -> Poll<Result<Op<()>, AmError>> {
        if let Err(e) = self
            .check_rma(dest, offset, len)
            .and_then(|()| self.check_segment(local as u64, len as u64))
        {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        if dest == self.rank {
            if copy_here(t, local, offset, len).is_err() {
                return Poll::Ready(Err(self.out_of_bounds(offset as u64, len as u64)));
            }
        } else if t.info().capabilities.put {
            ready!(self.nic_rma(|| t.put_own(dest, offset, local, len)))?;
        } else {
            bounce.resize(len, 0);
            if t.segment().read(local, bounce).is_err() {
                return Poll::Ready(Err(self.out_of_bounds(local as u64, len as u64)));
            }
            let (index, gen) = self.alloc_op(dest, offset, len, Vec::new());
            return Poll::Ready(Ok(self.slot_op(index, gen)));
        }
        Poll::Ready(Ok(Op::ready(Raw::Unit)))
    }

    /// Starts a get into this rank's own segment ([`crate::endpoint::start::GetIntoSegment`]):
    /// `len` bytes at `offset` of `src`'s segment to `local` here, after the posted atomics. Where
    /// the NIC reads peers' memory ([`Sink::Own`](crate::transport::Sink::Own)) or `src` is this
    /// rank, it is one copy between the segments and `None` comes back: done. Otherwise the get of
    /// the bytes, whose outcome the caller writes at `local`. Either range outside the segment is
    /// an error.
    pub fn get_into_segment_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        src: Rank,
        offset: usize,
        local: usize,
        len: usize,
    ) -> Poll<Result<Option<Op<Vec<u8>>>, AmError>> {
        if let Err(e) = self
            .check_rma(src, offset, len)
            .and_then(|()| self.check_segment(local as u64, len as u64))
        {
            return Poll::Ready(Err(e));
        }
        if src != self.rank && !t.info().capabilities.get {
            return self.get_start(t, src, offset, len).map_ok(Some);
        }
        ready!(self.apply_posted(t))?;
        if src == self.rank {
            if copy_here(t, offset, local, len).is_err() {
                return Poll::Ready(Err(self.out_of_bounds(offset as u64, len as u64)));
            }
        } else {
            ready!(self.nic_rma(|| t.get_own(src, offset, local, len)))?;
        }
        Poll::Ready(Ok(None))
    }

    /// Starts a put-with-signal ([`crate::endpoint::start::PutSignal`]): `data` into `dest`'s
    /// segment at `offset`, then `signal` applied to the `u64` at `signal_at` there, after the data
    /// and never before it; complete once the signal was applied. Where the NIC writes peers'
    /// memory the data is placed now, and the signal too where the NIC applies atomics
    /// ([`Rma::Atomic`](crate::transport::Rma::Atomic)); what is left travels as messages (the
    /// data's AM Longs, then the signal, or a load of the signal word that wakes a target asleep in
    /// [`crate::Node::wait_word`]) that [`Endpoint::put_signal_step`] sends. `Pending` as
    /// [`Endpoint::put_start`].
    pub fn put_signal_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        dest: Rank,
        offset: usize,
        data: &[u8],
        signal_at: usize,
        signal: Signal,
    ) -> Poll<Result<Op<()>, AmError>> {
        let atomic = signal.atomic();
        if let Err(e) = self
            .check_rma(dest, offset, data.len())
            .and_then(|()| self.check_atomic(dest, signal_at, &atomic))
        {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        if dest == self.rank {
            if t.segment().write(offset, data).is_err() {
                return Poll::Ready(Err(self.out_of_bounds(offset as u64, data.len() as u64)));
            }
            return Poll::Ready(
                self.apply_here(t.segment(), signal_at, atomic)
                    .map(|_| Op::ready(Raw::Unit)),
            );
        }
        let caps = t.info().capabilities;
        if !caps.put {
            let (index, gen) = self.alloc_op(dest, offset, data.len() + 1, Vec::new());
            self.ops[index as usize].signal = Some((signal_at, atomic));
            return Poll::Ready(Ok(self.slot_op(index, gen)));
        }
        ready!(self.nic_rma(|| t.put(dest, offset, data)))?;
        // The data is in place: the signal follows it. Where the NIC applies atomics it
        // applies this one too (one agent for every atomic on the word), and a load of the
        // word is the message that wakes the target; a busy NIC makes the caller start
        // again, writing the same bytes again.
        let sent = if caps.atomics {
            match t.atomic(dest, signal_at, atomic) {
                Ok(_) => Atomic::from(AtomicOp::Load::<u64>),
                Err(SendError::Busy) => return Poll::Pending,
                Err(e) => return Poll::Ready(Err(self.nic_failed(e))),
            }
        } else {
            atomic
        };
        let (index, gen) = self.alloc_op(dest, offset, 1, Vec::new());
        self.ops[index as usize].signal = Some((signal_at, sent));
        self.ops[index as usize].placed = true;
        if caps.atomics {
            // Data and signal are in place: the operation is complete once the wake-up is
            // sent, and nobody waits for its answer (a load is not ordered with anything,
            // so later puts need not wait for it either). Without a credit now, the
            // handle sends it.
            if let Poll::Ready(Ok(())) = self.op_step(t, index, gen, Some(&[])) {
                self.detach_op(index, gen, Detached::Dropped);
                return Poll::Ready(Ok(Op::ready(Raw::Unit)));
            }
        }
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// A step of sending a put-with-signal, as [`Endpoint::put_step`]: the data's chunks
    /// that were not placed when it started, then the signal. `data` must be what
    /// [`Endpoint::put_signal_start`] was given.
    pub fn put_signal_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        op: &Op<()>,
        data: &[u8],
    ) -> Poll<Result<(), AmError>> {
        match self.slot_of(op) {
            Ok(Some((index, gen))) => self.op_step(tx, index, gen, Some(data)),
            Ok(None) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// A step of [`crate::Node::wait_word`]: ready once the `u64` at `offset` of this rank's
    /// segment compares with `value` as `cmp` says (read with a sequentially consistent
    /// load: what was written before a signal that made it hold is visible after). An
    /// offset outside the segment or not 8-aligned is an error. A wait nobody can end
    /// fails: once a peer is lost ([`AmError::PeerLost`]), or every other rank has gone.
    pub fn word_step<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        offset: usize,
        cmp: Cmp,
        value: u64,
    ) -> Poll<Result<(), AmError>> {
        let load = Atomic::from(AtomicOp::Load::<u64>);
        if let Err(e) = self.check_word(offset, &load) {
            return Poll::Ready(Err(e));
        }
        let word = match self.apply_here(t.segment(), offset, load) {
            Ok(w) => w,
            Err(e) => return Poll::Ready(Err(e)),
        };
        if cmp.holds(word, value) {
            return Poll::Ready(Ok(()));
        }
        if self.gone_count() > 0 {
            if let Some(e) = self.nobody_to_signal() {
                return Poll::Ready(Err(e));
            }
        }
        Poll::Pending
    }

    /// Why a wait on a word of this rank's may never end: a lost peer, or every other rank
    /// gone (the first one's error).
    #[cold]
    fn nobody_to_signal(&self) -> Option<AmError> {
        let mut first = None;
        let mut gone = 0;
        for p in (0..self.size).filter(|&p| p != self.rank) {
            if let Poll::Ready(e) = self.waiting_for(p) {
                if matches!(e, AmError::PeerLost(_)) {
                    return Some(e);
                }
                gone += 1;
                first.get_or_insert(e);
            }
        }
        (gone + 1 >= self.size).then_some(first).flatten()
    }

    /// Starts a strided or indexed put ([`crate::endpoint::start::PutRegions`]): `data` into
    /// `dest`'s segment region by region (`regions`: offset and length pairs, in the order of
    /// `data`). Where the NIC writes peers' memory it is done now
    /// ([`Remote::Regions`](crate::transport::Remote::Regions): as few NIC operations as it can);
    /// otherwise the regions go packed into as few system Mediums as they fit (a system message of
    /// its own) that [`Endpoint::put_regions_step`] sends. Regions whose lengths do not add up to
    /// the data's are [`AmError::InvalidRegions`]; one outside the segment is an error too, and
    /// nothing is written. `Pending` as [`Endpoint::put_start`].
    pub fn put_regions_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        dest: Rank,
        regions: Regions<'_>,
        data: &[u8],
    ) -> Poll<Result<Op<()>, AmError>> {
        if let Err(e) = self.check_regions(dest, regions, data.len()) {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        if dest == self.rank {
            // Checked: the data matches the regions, all inside the segment.
            let seg = t.segment();
            for (offset, bytes) in regions.pieces(data)? {
                if seg.write(offset, bytes).is_err() {
                    return Poll::Ready(Err(self.out_of_bounds(offset as u64, bytes.len() as u64)));
                }
            }
            return Poll::Ready(Ok(Op::ready(Raw::Unit)));
        }
        if !t.info().capabilities.put {
            let (index, gen) = self.alloc_op(dest, 0, data.len(), Vec::new());
            self.ops[index as usize].regions.extend(regions.iter());
            return Poll::Ready(Ok(self.slot_op(index, gen)));
        }
        ready!(self.nic_rma(|| t
            .rma(Rma::Put {
                dest,
                to: Remote::Regions(regions),
                from: Source::Bytes(data),
            })
            .map(drop)))?;
        Poll::Ready(Ok(Op::ready(Raw::Unit)))
    }

    /// Starts a strided or indexed get ([`crate::endpoint::start::GetRegions`]): the regions of
    /// `src`'s segment, in order, into a new `Vec`. Where the NIC reads peers' memory
    /// ([`Remote::Regions`](crate::transport::Remote::Regions)) or `src` is this rank, they are
    /// read now; otherwise [`Endpoint::get_step`] sends one request per region (per Medium of a
    /// larger one), whose answers land at their place in the `Vec`. Checked as
    /// [`Endpoint::put_regions_start`]; `Pending` as [`Endpoint::put_start`].
    pub fn get_regions_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        src: Rank,
        regions: Regions<'_>,
    ) -> Poll<Result<Op<Vec<u8>>, AmError>> {
        let Some(len) = regions.total() else {
            return Poll::Ready(Err(AmError::InvalidRegions(
                "the regions' lengths overflow",
            )));
        };
        if let Err(e) = self.check_regions(src, regions, len) {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        let mut data = vec![0; len];
        if src == self.rank {
            // Checked: the data matches the regions, all inside the segment.
            let seg = t.segment();
            for (offset, into) in regions.pieces_mut(&mut data)? {
                if seg.read(offset, into).is_err() {
                    return Poll::Ready(Err(self.out_of_bounds(offset as u64, into.len() as u64)));
                }
            }
            return Poll::Ready(Ok(Op::ready(Raw::Bytes(data))));
        }
        if !t.info().capabilities.get {
            let (index, gen) = self.alloc_op(src, 0, len, data);
            self.ops[index as usize].regions.extend(regions.iter());
            return Poll::Ready(Ok(self.slot_op(index, gen)));
        }
        ready!(self.nic_rma(|| t
            .rma(Rma::Get {
                src,
                from: Remote::Regions(regions),
                into: Sink::Bytes(&mut data),
            })
            .map(drop)))?;
        Poll::Ready(Ok(Op::ready(Raw::Bytes(data))))
    }

    /// The region of slot `index` that holds byte `at` of its data (its index, and how far
    /// into it `at` is), from the slot's cursor, which it leaves there: sends go forward, so
    /// a transfer's lookups cost one pass over its regions in all. Past the last region:
    /// the regions' count and 0.
    fn seek_region(&mut self, index: u32, at: usize) -> (usize, usize) {
        let slot = &mut self.ops[index as usize];
        let (mut r, mut pos) = slot.cursor;
        if at < pos {
            (r, pos) = (0, 0);
        }
        while let Some(&(_, len)) = slot.regions.get(r) {
            if at < pos + len {
                break;
            }
            pos += len;
            r += 1;
        }
        slot.cursor = (r, pos);
        (r, at - pos)
    }

    /// The region of slot `index` that holds byte `at` of its data: its offset in the peer's
    /// segment at that byte, and the bytes left in it.
    fn region_at(&mut self, index: u32, at: usize) -> Option<(usize, usize)> {
        let (r, skip) = self.seek_region(index, at);
        let &(offset, len) = self.ops[index as usize].regions.get(r)?;
        Some((offset + skip, len - skip))
    }

    /// Checks a strided or indexed transfer before anything is done: the rank, every region
    /// inside the segment (the span from the lowest to the end of the highest, so a strided
    /// one in two comparisons), their lengths adding up to `len`, and `peer` not gone.
    fn check_regions(&self, peer: Rank, regions: Regions<'_>, len: usize) -> Result<(), AmError> {
        self.check_rma(peer, 0, 0)?;
        if regions.total() != Some(len) {
            return Err(AmError::InvalidRegions(
                "the regions' lengths do not add up to the data's",
            ));
        }
        match regions.span() {
            Some((lo, hi)) => self.check_segment(lo as u64, (hi - lo) as u64),
            None => Err(self.out_of_bounds(u64::MAX, 0)),
        }
    }

    /// A step of sending a strided or indexed put, as [`Endpoint::put_step`]: the system
    /// Mediums that credits allow. `data` must be what [`Endpoint::put_regions_start`] was
    /// given.
    pub fn put_regions_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        op: &Op<()>,
        data: &[u8],
    ) -> Poll<Result<(), AmError>> {
        self.put_step(tx, op, data)
    }

    /// The next [`SystemMsg::PutRegions`] of slot `index` from byte `at` of its data: as
    /// many regions (the first and last perhaps in part) as fit in one Medium, as entries
    /// then bytes in `out`; how many data bytes and regions it holds.
    fn pack_regions(
        &mut self,
        index: u32,
        at: usize,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> (usize, u32) {
        let room = self.limits.max_medium.max(REGION_ENTRY_LEN + 1);
        let (mut r, mut skip) = self.seek_region(index, at);
        let regions = &self.ops[index as usize].regions;
        out.clear();
        // Entries first, then the bytes they describe: consecutive bytes of `data` from `at`.
        let (mut n, mut count, mut used) = (0, 0, 0);
        while r < regions.len() {
            let (offset, len) = regions[r];
            let left = len - skip;
            if left == 0 {
                r += 1;
                skip = 0;
                continue;
            }
            let fits = room.saturating_sub(used + REGION_ENTRY_LEN).min(left);
            if fits == 0 {
                break;
            }
            push_region_entry(out, (offset + skip) as u64, fits as u32);
            (n, count, used) = (n + fits, count + 1, used + REGION_ENTRY_LEN + fits);
            if fits < left {
                break;
            }
            r += 1;
            skip = 0;
        }
        out.extend_from_slice(&data[at..at + n]);
        (n, count)
    }

    /// A put or get the NIC does itself (`rma`, checked): `Pending` while the device is busy
    /// or posted atomics sent as messages are unanswered (the NIC's write or read may
    /// overtake a message: a transport with RMA but atomics by messages).
    // Inlined: out of line, its result goes through memory, which costs a put tens of
    // instructions.
    #[inline(always)]
    pub(super) fn nic_rma(
        &mut self,
        rma: impl FnOnce() -> Result<(), SendError>,
    ) -> Poll<Result<(), AmError>> {
        if self.detached_in_flight > 0 {
            return Poll::Pending;
        }
        match rma() {
            Ok(()) => Poll::Ready(Ok(())),
            Err(SendError::Busy) => Poll::Pending,
            Err(e) => Poll::Ready(Err(self.nic_failed(e))),
        }
    }

    /// A step of sending a put: sends the chunks that credits allow; ready once all are
    /// sent. `data` must be what [`Endpoint::put_start`] was given. After an error nothing
    /// more is sent: the handle, dropped, lets the chunks already out complete.
    pub fn put_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        op: &Op<()>,
        data: &[u8],
    ) -> Poll<Result<(), AmError>> {
        match self.slot_of(op) {
            Ok(Some((index, gen))) => self.op_step(tx, index, gen, Some(data)),
            Ok(None) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// The handle of an operation in the table.
    pub(super) fn slot_op<U: Outcome>(&self, index: u32, gen: u32) -> Op<U> {
        Op::new(State::Slot {
            index,
            gen,
            table: self.orphans.clone(),
        })
    }

    /// The table slot a handle names: `None` for one complete when started, an error for
    /// one of another endpoint or already completed.
    pub(super) fn slot_of<U: Outcome>(&self, op: &Op<U>) -> Result<Option<(u32, u32)>, AmError> {
        match &op.state {
            State::Ready(_) => Ok(None),
            State::Slot { index, gen, table } if Arc::ptr_eq(table, &self.orphans) => {
                Ok(Some((*index, *gen)))
            }
            State::Slot { .. } => Err(AmError::ForeignHandle),
            _ => Err(AmError::StaleHandle),
        }
    }

    /// Starts a get of `len` bytes at `offset` of `src`'s segment
    /// ([`crate::endpoint::start::Get`]), after the posted atomics. Where the NIC reads peers'
    /// memory itself ([`Rma::Get`](crate::transport::Rma::Get)) or `src` is this rank, the bytes
    /// are read now and the handle is complete; otherwise [`Endpoint::get_step`] sends the requests
    /// that `src`'s progress answers. `Pending` as [`Endpoint::put_start`].
    pub fn get_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        src: Rank,
        offset: usize,
        len: usize,
    ) -> Poll<Result<Op<Vec<u8>>, AmError>> {
        // Checked before the bytes are allocated.
        if let Err(e) = self.check_rma(src, offset, len) {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        let mut data = vec![0; len];
        match self.read_now(t, src, offset, &mut data) {
            Poll::Ready(Ok(true)) => Poll::Ready(Ok(Op::ready(Raw::Bytes(data)))),
            Poll::Ready(Ok(false)) => {
                let (index, gen) = self.alloc_op(src, offset, len, data);
                Poll::Ready(Ok(self.slot_op(index, gen)))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Starts a get into `dst`, a buffer of the caller's ([`crate::endpoint::start::GetInto`],
    /// which gives the handle `dst` to fill), as [`Endpoint::get_start`]: a handle complete when
    /// started once the bytes are in `dst`; otherwise the get by messages, whose bytes its
    /// completion copies into `dst`.
    pub fn get_into_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        src: Rank,
        offset: usize,
        dst: &mut [u8],
    ) -> Poll<Result<Op<()>, AmError>> {
        if let Err(e) = self.check_rma(src, offset, dst.len()) {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        match ready!(self.read_now(t, src, offset, dst))? {
            true => Poll::Ready(Ok(Op::ready(Raw::Unit))),
            false => {
                let (index, gen) = self.alloc_op(src, offset, dst.len(), vec![0; dst.len()]);
                Poll::Ready(Ok(self.slot_op(index, gen)))
            }
        }
    }

    /// Reads a checked range of `src`'s segment into `dst` where no message is needed (this
    /// rank's segment, or a NIC that reads peers' memory): whether it did.
    pub(super) fn read_now<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        src: Rank,
        offset: usize,
        dst: &mut [u8],
    ) -> Poll<Result<bool, AmError>> {
        if src == self.rank {
            return Poll::Ready(match t.segment().read(offset, dst) {
                Ok(()) => Ok(true),
                Err(_) => Err(self.out_of_bounds(offset as u64, dst.len() as u64)),
            });
        }
        if !t.info().capabilities.get {
            return Poll::Ready(Ok(false));
        }
        ready!(self.nic_rma(|| t.get(src, offset, dst)))?;
        Poll::Ready(Ok(true))
    }

    /// A step of sending a get's requests, as [`Endpoint::put_step`] (a get into a new
    /// `Vec` or into a caller's buffer).
    pub fn get_step<U: Outcome>(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        op: &Op<U>,
    ) -> Poll<Result<(), AmError>> {
        match self.slot_of(op) {
            Ok(Some((index, gen))) => self.op_step(tx, index, gen, None),
            Ok(None) => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    /// Checks a put or get of `len` bytes at `offset` of `peer`'s segment before anything is
    /// done: the rank, the range inside the segment, and `peer` not gone.
    pub fn check_rma(&self, peer: Rank, offset: usize, len: usize) -> Result<(), AmError> {
        self.check_rank(peer)?;
        self.check_segment(offset as u64, len as u64)?;
        match self.waiting_for(peer) {
            Poll::Ready(e) => Err(e),
            Poll::Pending => Ok(()),
        }
    }

    /// Checks an atomic on the word at `offset` of `dest`'s segment before anything is done:
    /// the rank, the operation defined on the word's type, the word inside the segment and
    /// aligned to its width, and `dest` not gone.
    pub fn check_atomic(&self, dest: Rank, offset: usize, atomic: &Atomic) -> Result<(), AmError> {
        self.check_rank(dest)?;
        self.check_word(offset, atomic)?;
        match self.waiting_for(dest) {
            Poll::Ready(e) => Err(e),
            Poll::Pending => Ok(()),
        }
    }

    /// The word of `atomic` at `offset` of a segment (every rank's is as long as this one's):
    /// inside it, aligned to its width, and the operation defined on its type.
    fn check_word(&self, offset: usize, atomic: &Atomic) -> Result<(), AmError> {
        self.check_word_in(offset, atomic, self.seg_len)
    }

    /// Starts a remote atomic on the word at `offset` of `dest`'s segment
    /// ([`crate::endpoint::start::Atomic`]), after the posted atomics. Where the NIC applies
    /// atomics itself ([`Rma::Atomic`](crate::transport::Rma::Atomic)) or `dest` is this rank, it
    /// is applied now and the handle holds the old value; otherwise [`Endpoint::atomic_step`] sends
    /// it as a system message that `dest`'s progress applies. `Pending` as [`Endpoint::put_start`].
    pub fn atomic_start<T: Transport + ?Sized, W: AtomicWord + Outcome>(
        &mut self,
        t: &mut T,
        dest: Rank,
        offset: usize,
        op: AtomicOp<W>,
    ) -> Poll<Result<Op<W>, AmError>> {
        let atomic = Atomic::from(op);
        if let Err(e) = self.check_atomic(dest, offset, &atomic) {
            return Poll::Ready(Err(e));
        }
        ready!(self.apply_posted(t))?;
        if dest == self.rank {
            return Poll::Ready(
                self.apply_here(t.segment(), offset, atomic)
                    .map(|old| Op::ready(Raw::Word(old))),
            );
        }
        if !t.info().capabilities.atomics {
            let (index, gen) = self.alloc_atomic(dest, offset, atomic);
            return Poll::Ready(Ok(self.slot_op(index, gen)));
        }
        match t.atomic(dest, offset, atomic) {
            Ok(old) => Poll::Ready(Ok(Op::ready(Raw::Word(old)))),
            Err(SendError::Busy) => Poll::Pending,
            Err(e) => Poll::Ready(Err(self.nic_failed(e))),
        }
    }

    /// Applies a checked atomic to this rank's own segment: the word's old value.
    pub(super) fn apply_here(
        &self,
        segment: SharedBytes<'_>,
        offset: usize,
        atomic: Atomic,
    ) -> Result<u64, AmError> {
        let ours = segment.slice_or_empty(0, self.seg_len.min(segment.len()));
        atomic
            .apply(ours, offset)
            .map_err(|_| self.out_of_bounds(offset as u64, atomic.width().bytes() as u64))
    }

    /// An operation slot for an atomic sent as a system message.
    pub(super) fn alloc_atomic(&mut self, dest: Rank, offset: usize, atomic: Atomic) -> (u32, u32) {
        let (index, gen) = self.alloc_op(dest, offset, 1, Vec::new());
        self.ops[index as usize].atomic = Some(atomic);
        (index, gen)
    }

    /// A step of sending an atomic, as [`Endpoint::put_step`]: ready once it is sent (at
    /// once if it was applied when started).
    pub fn atomic_step<W: AtomicWord + Outcome>(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        op: &Op<W>,
    ) -> Poll<Result<(), AmError>> {
        self.get_step(tx, op)
    }

    /// Leaves an operation slot to complete with nobody waiting for its result: freed when
    /// its last answer comes (or now, if nothing is out or all came), after `how` says what
    /// to count meanwhile.
    pub(super) fn detach_op(&mut self, index: u32, gen: u32, how: Detached) {
        let Some(slot) = self.op(index, gen) else {
            return;
        };
        slot.waker = None;
        // Nobody steps a detached operation: what was not sent never will be.
        slot.len = slot.sent;
        slot.detached = how;
        match how {
            Detached::Posted => self.detached_in_flight += 1,
            Detached::Implicit => self.nbi_in_flight += 1,
            Detached::No | Detached::Dropped => {}
        }
        self.settle(index);
    }

    /// What an operation slot whose answers changed does next: once every chunk is sent and
    /// answered, its waiter is woken, or (detached) it is freed, counted out, and (in the
    /// implicit set) its error kept for the set.
    pub(super) fn settle(&mut self, index: u32) {
        let slot = &mut self.ops[index as usize];
        if !slot.live || slot.outstanding > 0 || slot.sent < slot.len {
            return;
        }
        match slot.detached {
            Detached::No => {
                if let Some(w) = slot.waker.take() {
                    w.wake();
                    self.woken += 1;
                }
            }
            Detached::Posted => {
                self.detached_in_flight = self.detached_in_flight.saturating_sub(1);
                let _ = self.finish_op(index);
            }
            Detached::Dropped => {
                let _ = self.finish_op(index);
            }
            Detached::Implicit => {
                self.nbi_in_flight = self.nbi_in_flight.saturating_sub(1);
                if let Err(e) = self.finish_op(index) {
                    self.nbi_error.get_or_insert(e);
                }
            }
        }
    }

    pub(super) fn out_of_bounds(&self, offset: u64, len: u64) -> AmError {
        AmError::SegmentOutOfBounds {
            offset,
            len,
            size: self.seg_len,
        }
    }

    /// Sends a put's (`data`) or a get's chunks until all are out or one is refused.
    pub(super) fn op_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        index: u32,
        gen: u32,
        data: Option<&[u8]>,
    ) -> Poll<Result<(), AmError>> {
        let Some(slot) = self.op(index, gen) else {
            return Poll::Ready(Err(AmError::StaleHandle));
        };
        let (peer, offset, signal, seg) = (slot.peer, slot.offset, slot.signal, slot.seg);
        // A put-with-signal's signal is its last unit, after the data (none left to send
        // where the NIC placed it). Counted from the units it started with: a failure cuts
        // `len` short, and the step then reports that failure.
        let data = if slot.placed {
            data.map(|_| &[][..])
        } else {
            data
        };
        let data_len = slot.total.saturating_sub(usize::from(signal.is_some()));
        if data.is_some_and(|d| d.len() != data_len) {
            return Poll::Ready(Err(AmError::StaleHandle));
        }
        // A created segment's bytes go in system Mediums; segment 0's puts in Longs.
        let chunk = match data {
            Some(_) if seg == 0 => self.limits.max_long,
            _ => self.limits.max_medium,
        }
        .max(1);
        loop {
            let slot = &self.ops[index as usize];
            let at = slot.sent;
            if at >= slot.len {
                // All sent, or cut short by a peer's loss or departure.
                return Poll::Ready(match &slot.error {
                    Some(e) => Err(e.clone()),
                    None => Ok(()),
                });
            }
            let n = chunk.min(slot.len - at);
            let step = match (data, slot.atomic) {
                (Some(_), _) if at == data_len => {
                    // Sent after every chunk of the data: a transport delivers one pair's
                    // messages in order, so the target applies it after the data landed.
                    let Some((signal_at, atomic)) = signal else {
                        return Poll::Ready(Err(AmError::StaleHandle));
                    };
                    let msg = SystemMsg::Atomic {
                        op: index,
                        offset: signal_at as u64,
                        atomic,
                    };
                    let step = self.system_step(tx, peer, msg, &[], None);
                    ready!(self.note_sent(index, at, 1, step))?;
                    continue;
                }
                (None, Some(atomic)) => {
                    let (op, offset) = (index, offset as u64);
                    // A created segment's id travels in the payload.
                    let id = seg.to_le_bytes();
                    let (msg, payload) = match seg {
                        0 => (SystemMsg::Atomic { op, offset, atomic }, &[][..]),
                        _ => (SystemMsg::AtomicAt { op, offset, atomic }, &id[..]),
                    };
                    self.system_step(tx, peer, msg, payload, None)
                }
                (Some(d), _) if !self.ops[index as usize].regions.is_empty() => {
                    let mut payload = std::mem::take(&mut self.scratch_regions);
                    let (n, count) = self.pack_regions(index, at, d, &mut payload);
                    let msg = SystemMsg::PutRegions { op: index, count };
                    let step = self.system_step(tx, peer, msg, &payload, None);
                    self.scratch_regions = payload;
                    ready!(self.note_sent(index, at, n, step))?;
                    continue;
                }
                (Some(d), _) => {
                    let n = n.min(data_len - at);
                    // Segment 0's bytes land as a Long's; a created segment's go in a Medium.
                    let (put, long_offset) = match seg {
                        0 => (SystemMsg::Put { op: index }, Some(offset + at)),
                        _ => {
                            let offset = (offset + at) as u64;
                            (
                                SystemMsg::PutAt {
                                    op: index,
                                    seg,
                                    offset,
                                },
                                None,
                            )
                        }
                    };
                    let step = self.system_step(tx, peer, put, &d[at..at + n], long_offset);
                    ready!(self.note_sent(index, at, n, step))?;
                    continue;
                }
                (None, None) => {
                    // A strided or indexed get asks for one region (or one Medium of it) at a
                    // time; a plain one for the next chunk of its range.
                    let (from, n) = if self.ops[index as usize].regions.is_empty() {
                        (offset + at, n)
                    } else {
                        match self.region_at(index, at) {
                            Some((from, left)) => (from, n.min(left)),
                            None => return Poll::Ready(Err(AmError::StaleHandle)),
                        }
                    };
                    let get = if seg != 0 {
                        SystemMsg::GetAt {
                            op: index,
                            seg,
                            offset: from as u64,
                            len: n as u32,
                            at: at as u64,
                        }
                    } else {
                        SystemMsg::Get {
                            op: index,
                            offset: from as u64,
                            len: n as u32,
                            at: at as u64,
                        }
                    };
                    let step = self.system_step(tx, peer, get, &[], None);
                    ready!(self.note_sent(index, at, n, step))?;
                    continue;
                }
            };
            ready!(self.note_sent(index, at, n, step))?;
        }
    }

    /// Counts a unit of `n` sent at `at` of an operation, or stops it: `Pending` to try
    /// again later, or its error (nothing more goes out; what is out is still waited for).
    fn note_sent(
        &mut self,
        index: u32,
        at: usize,
        n: usize,
        step: Poll<Result<(), AmError>>,
    ) -> Poll<Result<(), AmError>> {
        let slot = &mut self.ops[index as usize];
        match step {
            Poll::Ready(Ok(())) => {
                slot.outstanding += 1;
                slot.sent = at + n;
                Poll::Ready(Ok(()))
            }
            Poll::Pending => Poll::Pending,
            Poll::Ready(Err(e)) => {
                slot.len = at;
                slot.error.get_or_insert_with(|| e.clone());
                Poll::Ready(Err(e))
            }
        }
    }

    pub(super) fn op_done(&self, index: u32, gen: u32) -> bool {
        self.ops
            .get(index as usize)
            .filter(|s| s.live && s.gen == gen)
            .is_none_or(|s| s.outstanding == 0 && s.sent >= s.len)
    }

    /// Completes an operation of the table: a get's data, an atomic's old value, or the
    /// operation's error. A stale handle is [`AmError::StaleHandle`].
    pub(super) fn poll_slot(&mut self, index: u32, gen: u32) -> Poll<Result<Raw, AmError>> {
        match self.op(index, gen) {
            None => Poll::Ready(Err(AmError::StaleHandle)),
            Some(s) if s.outstanding == 0 && s.sent >= s.len => Poll::Ready(self.finish_op(index)),
            Some(_) => Poll::Pending,
        }
    }

    pub(super) fn live_op(&mut self, index: u32, peer: Rank) -> Option<&mut OpSlot> {
        self.ops
            .get_mut(index as usize)
            .filter(|s| s.live && s.peer == peer && s.outstanding > 0)
    }

    /// Allocates a put/get slot (after freeing the slots of handles dropped since the last
    /// look, so the table holds only what is in flight).
    pub(super) fn alloc_op(
        &mut self,
        peer: Rank,
        offset: usize,
        len: usize,
        data: Vec<u8>,
    ) -> (u32, u32) {
        self.adopt_orphans();
        let index = match self.free_ops.pop() {
            Some(i) => i,
            None => {
                self.ops.push(OpSlot::default());
                (self.ops.len() - 1) as u32
            }
        };
        let slot = &mut self.ops[index as usize];
        slot.gen = slot.gen.wrapping_add(1);
        slot.live = true;
        slot.peer = peer;
        slot.offset = offset;
        slot.len = len;
        slot.sent = 0;
        slot.outstanding = 0;
        slot.error = None;
        slot.data = data;
        slot.atomic = None;
        slot.signal = None;
        slot.regions.clear();
        slot.cursor = (0, 0);
        slot.total = len;
        slot.placed = false;
        slot.seg = 0;
        slot.word = 0;
        slot.detached = Detached::No;
        slot.waker = None;
        (index, slot.gen)
    }

    /// The slot of a handle, if it is still the same operation.
    pub(super) fn op(&mut self, index: u32, gen: u32) -> Option<&mut OpSlot> {
        self.ops
            .get_mut(index as usize)
            .filter(|s| s.live && s.gen == gen)
    }

    /// Frees a completed slot and returns its result.
    pub(super) fn finish_op(&mut self, index: u32) -> Result<Raw, AmError> {
        let slot = &mut self.ops[index as usize];
        slot.live = false;
        slot.waker = None;
        let raw = match (slot.atomic, slot.team.take()) {
            (Some(_), _) => Raw::Word(slot.word),
            (None, Some(team)) => Raw::Team(team),
            (None, None) => Raw::Bytes(std::mem::take(&mut slot.data)),
        };
        let err = slot.error.take();
        self.free_ops.push(index);
        match err {
            Some(e) => Err(e),
            None => Ok(raw),
        }
    }
}

/// Copies `len` bytes at `from` of this rank's segment to `to` (a put or get between
/// segments whose peer is this rank), as `memmove` where they overlap.
pub(super) fn copy_here<T: Transport + ?Sized>(
    t: &T,
    from: usize,
    to: usize,
    len: usize,
) -> Result<(), am_shm::ShmError> {
    let own = t.segment();
    own.copy_from(to, own.slice(from, len)?)
}
