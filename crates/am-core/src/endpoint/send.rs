//! Sending requests: the checks a request passes, one attempt or one step of a blocking send,
//! the job's exit, and the replies and implicit replies the device refused earlier.

use std::task::Poll;

use super::state::{Endpoint, ENDED, LOST};
use crate::credit::CreditPolicy;
use crate::error::AmError;
use crate::handler::HandlerFn;
use crate::handler::Threading;
use crate::protocol::SystemMsg;
use crate::reply::{check_message, encode_acks, segment_range};
use crate::transport::{Outgoing, Payload, SendError, Transport, Tx};
use crate::types::{AmKind, Category, HandlerId, Rank};
use crate::wire::{Header, MAX_ARGS, MAX_HEAD_LEN};

impl<H: Threading> Endpoint<H> {
    /// Checks a request before it is sent: a valid rank that is not lost, the transport's
    /// limits, a handler registered as a request of this kind, and a Long's range within
    /// the segment.
    pub fn check_request(
        &self,
        dest: Rank,
        kind: AmKind,
        handler: HandlerId,
        args: &[u32],
        payload_len: usize,
        long_offset: Option<usize>,
    ) -> Result<(), AmError> {
        match self.gone_as.get(dest as usize) {
            None => {
                return Err(AmError::InvalidRank {
                    rank: dest,
                    size: self.size,
                })
            }
            Some(g) if g & (LOST | ENDED) != 0 => return Err(self.gone_error(dest, *g)),
            Some(_) => {}
        }
        check_message(&self.limits, kind, args, payload_len)?;
        if !matches!(self.handlers.fns[handler.0 as usize], Some(HandlerFn::Request(k, _)) if k == kind)
        {
            return Err(AmError::NotRegistered {
                handler,
                category: Category::Request,
                kind,
            });
        }
        if let Some(offset) = long_offset {
            self.check_segment(offset as u64, payload_len as u64)?;
        }
        Ok(())
    }

    pub(super) fn check_rank(&self, rank: Rank) -> Result<(), AmError> {
        if rank >= self.size {
            return Err(AmError::InvalidRank {
                rank,
                size: self.size,
            });
        }
        Ok(())
    }

    pub(super) fn check_segment(&self, offset: u64, len: u64) -> Result<(), AmError> {
        // Segment sizes agree across ranks (checked at start-up), so the local size bounds
        // every target's segment.
        match segment_range(offset, len, self.seg_len) {
            Some(_) => Ok(()),
            None => Err(AmError::SegmentOutOfBounds {
                offset,
                len,
                size: self.seg_len,
            }),
        }
    }

    /// One attempt to send a user request already checked by [`Endpoint::check_request`],
    /// after the posted atomics ([`Endpoint::apply_posted`]): `Ok(false)` if they or the
    /// request wait for the device or a credit (the request was not sent).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn try_request(
        &mut self,
        t: &mut (impl Transport + ?Sized),
        dest: Rank,
        kind: AmKind,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Result<bool, AmError> {
        match self.apply_posted(t) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => return Ok(false),
        }
        self.try_send(t, dest, false, kind, handler.0, args, payload, long_offset)
    }

    /// A step of a blocking send of a checked user request, after the posted atomics: fails
    /// at once if `dest` was lost or has left, `Pending` while out of credit or the device
    /// is busy.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn request_step(
        &mut self,
        t: &mut (impl Transport + ?Sized),
        dest: Rank,
        kind: AmKind,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Poll<Result<(), AmError>> {
        if !self.posted.is_empty() {
            match self.apply_queued(t) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
        }
        self.send_step(t, dest, false, kind, handler.0, args, payload, long_offset)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn send_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        dest: Rank,
        system: bool,
        kind: AmKind,
        handler: u8,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Poll<Result<(), AmError>> {
        if let Poll::Ready(gone) = self.waiting_for(dest) {
            return Poll::Ready(Err(gone));
        }
        as_step(self.try_send(tx, dest, system, kind, handler, args, payload, long_offset))
    }

    pub(super) fn system_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        dest: Rank,
        msg: SystemMsg,
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Poll<Result<(), AmError>> {
        let w = msg.encode();
        debug_assert_eq!(w.category, Category::Request);
        self.send_step(
            tx,
            dest,
            true,
            w.kind,
            w.opcode,
            w.args(),
            payload,
            long_offset,
        )
    }

    /// Sends a collective's step ([`SystemMsg::Collective`]) with its bytes: as a Short
    /// whose arguments after the step's own carry them where they are whole words and fit
    /// (none, a barrier's; 8 bytes, a small all-reduce's), else as a Medium. On every NIC a
    /// Short is the cheaper; on those that move a Medium's payload apart from its head, one
    /// transfer fewer.
    pub(super) fn collective_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        dest: Rank,
        msg: SystemMsg,
        payload: &[u8],
    ) -> Poll<Result<(), AmError>> {
        let w = msg.encode();
        let head = w.args();
        if payload.is_empty() {
            return self.send_step(tx, dest, true, AmKind::Short, w.opcode, head, &[], None);
        }
        let n = head.len() + payload.len() / 4;
        if !payload.len().is_multiple_of(4) || n > MAX_ARGS.min(self.limits.max_args) {
            return self.send_step(tx, dest, true, w.kind, w.opcode, head, payload, None);
        }
        let mut words = [0u32; MAX_ARGS];
        words[..head.len()].copy_from_slice(head);
        for (word, b) in words[head.len()..n].iter_mut().zip(payload.chunks_exact(4)) {
            *word = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
        self.send_step(
            tx,
            dest,
            true,
            AmKind::Short,
            w.opcode,
            &words[..n],
            &[],
            None,
        )
    }

    /// One attempt: takes a credit, encodes the head and offers it to the device.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn try_send(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        dest: Rank,
        system: bool,
        kind: AmKind,
        handler: u8,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Result<bool, AmError> {
        if !self.credits.try_acquire(dest) {
            self.credit_waits += 1;
            return Ok(false);
        }
        let header = Header {
            category: Category::Request,
            kind,
            system,
            handler,
            nargs: args.len() as u8,
            credit: self.credits.request_hint(dest),
            payload_len: payload.len() as u32,
            long_offset: long_offset.unwrap_or(0) as u64,
        };
        self.offer(tx, dest, &header, false, args, payload, long_offset)
    }

    /// Offers a request whose credit is taken to the device (`in_segment`: the head of a Long
    /// into a created segment); gives the credit back if it is not sent.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn offer(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        dest: Rank,
        header: &Header,
        in_segment: bool,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Result<bool, AmError> {
        let mut head = [0u8; MAX_HEAD_LEN];
        let n = if in_segment {
            header.encode_in_segment(args, &mut head)
        } else {
            header.encode(args, &mut head)
        };
        let out = Outgoing {
            head: &head[..n],
            payload: Payload::Private(payload),
            long_offset,
            reply_to: None,
        };
        match tx.try_send(dest, &out) {
            Ok(()) => Ok(true),
            Err(SendError::Busy) => {
                self.credits.cancel(dest);
                self.replies.refused += 1;
                Ok(false)
            }
            Err(e) => {
                self.credits.cancel(dest);
                Err(self.nic_failed(e))
            }
        }
    }

    /// A step of sending the head of a Long into `dest`'s created segment `seg`, whose `len`
    /// bytes at `offset` its initiator has written ([`crate::endpoint::start::LongTo`]): a
    /// message that carries the segment's id in the payload's place. Checked by
    /// [`Endpoint::long_to_start`].
    #[allow(clippy::too_many_arguments)]
    pub fn long_in_segment_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        dest: Rank,
        handler: HandlerId,
        args: &[u32],
        seg: u32,
        offset: usize,
        len: usize,
    ) -> Poll<Result<(), AmError>> {
        if let Poll::Ready(gone) = self.waiting_for(dest) {
            return Poll::Ready(Err(gone));
        }
        if !self.credits.try_acquire(dest) {
            self.credit_waits += 1;
            return Poll::Pending;
        }
        let header = Header {
            category: Category::Request,
            kind: AmKind::Long,
            system: false,
            handler: handler.0,
            nargs: args.len() as u8,
            credit: self.credits.request_hint(dest),
            payload_len: len as u32,
            long_offset: offset as u64,
        };
        as_step(self.offer(tx, dest, &header, true, args, &seg.to_le_bytes(), None))
    }

    /// A send-side error of the NIC, a message's or an operation the NIC does itself:
    /// recorded as a poll's would be (a lost target is marked so, an error that ends the
    /// node ends the endpoint), and returned. A departed target is not marked here: what it
    /// sent before it left may still wait to be received, and the waits it answers must see
    /// it; the transport's poll reports the departure after those messages.
    #[cold]
    pub(super) fn nic_failed(&mut self, e: SendError) -> AmError {
        if let SendError::PeerLost(peer) = e {
            self.mark_lost(peer);
        }
        let e = AmError::from(e);
        if e.ends_node() {
            self.end(e.clone());
        }
        e
    }

    /// One attempt to tell `dest` that the job ends with `code` ([`crate::Node::exit`]):
    /// `Ok(false)` if out of credit or the device is busy.
    pub fn try_exit(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        dest: Rank,
        code: i32,
    ) -> Result<bool, AmError> {
        let w = SystemMsg::Exit { code }.encode();
        self.try_send(tx, dest, true, w.kind, w.opcode, w.args(), &[], None)
    }

    /// Sends the replies the device refused earlier, in order, until it refuses again. A
    /// driver calls it before each poll.
    #[inline]
    pub fn flush(&mut self, tx: &mut (impl Tx + ?Sized)) -> Result<(), AmError> {
        if self.replies.pending.is_empty() {
            return Ok(());
        }
        self.flush_pending(tx)
    }

    #[cold]
    #[inline(never)]
    pub(super) fn flush_pending(&mut self, tx: &mut (impl Tx + ?Sized)) -> Result<(), AmError> {
        while let Some(p) = self.replies.pending.front() {
            let out = Outgoing {
                head: &p.bytes[..p.head_len],
                payload: Payload::Private(&p.bytes[p.head_len..]),
                long_offset: p.long_offset,
                reply_to: Some(p.route),
            };
            match tx.try_send(p.dest, &out) {
                Ok(()) => {
                    self.replies.pending.pop_front();
                }
                Err(SendError::Busy) => {
                    self.replies.refused += 1;
                    return Ok(());
                }
                Err(SendError::PeerLost(peer)) => {
                    self.mark_lost(peer);
                    return Err(AmError::PeerLost(peer));
                }
                Err(SendError::PeerDeparted(_)) => {
                    // Nobody is left to read the reply: dropped. The departure is the poll's
                    // to report, after what the peer sent before it left (see `nic_failed`).
                    self.replies.pending.pop_front();
                }
                Err(e) => {
                    self.replies.pending.pop_front();
                    return Err(AmError::from(e));
                }
            }
        }
        Ok(())
    }

    /// Sends the implicit replies owed (one system message of acknowledgements per peer), after the queued
    /// replies and only once none is left; stops at the first the device refuses.
    #[cold]
    #[inline(never)]
    pub fn flush_acks(&mut self, tx: &mut (impl Tx + ?Sized)) -> Result<(), AmError> {
        if !self.replies.pending.is_empty() {
            return self.flush(tx);
        }
        let Some(acks) = self.replies.acks.as_mut() else {
            return Ok(());
        };
        for peer in 0..self.size {
            let owed = acks.per_peer[peer as usize];
            if owed.count == 0 {
                continue;
            }
            let mut head = [0u8; MAX_HEAD_LEN];
            let n = encode_acks(&owed, &mut head);
            let out = Outgoing {
                head: &head[..n],
                payload: Payload::EMPTY,
                long_offset: None,
                reply_to: Some(owed.route),
            };
            match tx.try_send(peer, &out) {
                Ok(()) => acks.forget(peer),
                Err(SendError::Busy) => {
                    self.replies.refused += 1;
                    return Ok(());
                }
                // Nobody is left to read them (see `nic_failed`).
                Err(SendError::PeerDeparted(_)) => acks.forget(peer),
                Err(e) => {
                    acks.forget(peer);
                    return Err(self.nic_failed(e));
                }
            }
        }
        Ok(())
    }
}

/// One attempt's outcome as a step of a blocking send: sent, `Pending` (out of credit or the
/// device busy: nothing was sent), or failed.
#[inline(always)]
fn as_step(sent: Result<bool, AmError>) -> Poll<Result<(), AmError>> {
    match sent {
        Ok(true) => Poll::Ready(Ok(())),
        Ok(false) => Poll::Pending,
        Err(e) => Poll::Ready(Err(e)),
    }
}
