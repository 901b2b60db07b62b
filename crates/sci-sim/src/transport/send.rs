//! Sending: writing a message into the receiver's command slots (PIO, or the DMA engine for
//! large payloads), publishing it, and ringing the receiver.

use super::*;

/// A shared-memory access of this NIC's own layout that failed (its cause kept as the
/// source).
#[cold]
pub(super) fn sci_err(e: am_shm::ShmError) -> SendError {
    SendError::device_from("sci: a shared-memory access out of the layout", e)
}

/// Writes the body of the slot at `base` as [`Slots::write`] lays it out (`[stamp][len]
/// [flags][head][payload]`, see [`am_shm::stamp`]), without its slice of parts: one run of
/// whole-word stores on every send's path (the slot is ours until the reply frees it, so
/// the padding of its last word is too). The caller has checked the length against the
/// slot's capacity; publishing (the stamp) is a separate step.
#[inline(always)]
pub(super) fn write_slot(
    to: &Imported,
    base: usize,
    flags: u32,
    head: &[u8],
    payload: Payload<'_>,
) -> Result<(), am_shm::ShmError> {
    let len = (head.len() + payload.len()) as u32;
    let mut hdr = [0u8; 8];
    hdr[..4].copy_from_slice(&len.to_le_bytes());
    hdr[4..].copy_from_slice(&flags.to_le_bytes());
    let at = base + SLOT_HEADER - hdr.len();
    match payload {
        // A Short (or a Long's head): a few words, stored without gathering parts.
        Payload::Private([]) => to.write_words_padded(at, &[u64::from_ne_bytes(hdr)], head)?,
        Payload::Private(p) => to.write_padded(at, &[&hdr, head, p])?,
        // An echoed payload: straight from the receive slot into the peer's (one pass).
        Payload::Shared(s) => to.write_padded_then(at, &[&hdr, head], s)?,
    };
    Ok(())
}

/// Where a Long's payload of `len` bytes at `off` of the target's AM segment lands in its
/// byte area; `None` when there is nothing to place, or it runs past the segment (then the
/// header goes alone and the target rejects it).
#[inline]
pub(super) fn long_at(layout: &Layout, off: usize, len: usize) -> Option<usize> {
    off.checked_add(len)
        .filter(|&end| end <= layout.segment && len != 0)
        .map(|_| layout.segment_base() + off)
}

/// A Long's payload written into `to` at `at` by PIO stores.
pub(super) fn write_payload(
    to: &Imported,
    at: usize,
    payload: Payload<'_>,
) -> Result<(), SendError> {
    match payload {
        Payload::Private(p) => to.write(at, p),
        Payload::Shared(s) => to.write_from(at, s),
    }
    .map_err(sci_err)
}

/// [`TxState::publish`] for a caller that holds the destination's state `to` already; the
/// destination's segment is looked up in `peers` only to ring it. `takes`: the take counts
/// in our word area, or `None` to ring always.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn publish_to(
    fence: AsymmetricFence,
    ringer: &Ringer,
    peers: &[Imported],
    wakers: &Arc<Wakers>,
    takes: Option<&WordRun>,
    dest: usize,
    to: &mut Dest,
    slot: usize,
) -> Result<(), SendError> {
    let stamp = to.send_seq;
    to.send_seq += 1;
    // Message-ready flag after the data, message-exist flag after the ready flag.
    to.out.publish(slot, stamp).map_err(sci_err)?;
    if let Some(takes) = takes {
        // Our ready flag before our read of `dest`'s take count, against its take, count
        // write and heavy fence before it scans: either we see the new count and ring, or
        // its scan sees our flag. An unchanged count means our ringer bit is still set there, so
        // the write (a line `dest` polls, pulled away by an atomic) is skipped. The light
        // side: a `SeqCst` fence here would wait, on every message, for the slot's lines to
        // leave our store buffer, while the heavy side runs only when a receiver takes
        // (BENCHMARKS.md, "sci's sender without a fence per message").
        fence.light();
        // Our own memory: the sender never reads a peer's (SCI's remote writes only).
        // `taken_ix` is in the run by construction; were it not, we would ring. Our first
        // message to `dest` rings whatever the count says: until `dest` has heard from us it
        // does not look at our slots when it has nothing else to do (`Sci::liveness_tick`),
        // so a forged count must not keep it from hearing of us.
        let taken = takes.load(to.taken_ix);
        if taken == Some(to.rung) && stamp != 1 {
            return Ok(());
        }
        to.rung = taken.unwrap_or(u64::MAX);
    }
    ring(peers, wakers, dest, ringer)
}

/// Where this rank rings every peer: its bit in the same ringer word of each peer's segment
/// (see [`crate::layout::ringer_bit`]), and that word's tag on the message-exist flag.
pub(super) struct Ringer {
    at: usize,
    bit: u64,
    tag: u32,
}

impl Ringer {
    pub(super) fn of(layout: &Layout, rank: usize) -> Ringer {
        let (w, bit) = crate::layout::ringer_bit(rank);
        Ringer {
            at: layout.ringer_word(w),
            bit,
            tag: am_shm::doorbell::tag(w),
        }
    }
}

/// Rings `dest`'s message-exist flag (off the path of a steady exchange): our ringer bit
/// first, then the flag with our ringer word's tag, so that a receiver that sees the tag
/// finds the bit (both are `SeqCst` read-modify-writes); and wakes it on its wake socket if
/// it is armed there.
#[inline(never)]
pub(super) fn ring(
    peers: &[Imported],
    wakers: &Arc<Wakers>,
    dest: usize,
    ringer: &Ringer,
) -> Result<(), SendError> {
    let Some(peer) = peers.get(dest) else {
        return Err(SendError::PeerLost(dest as Rank));
    };
    peer.fetch_or_word(ringer.at, ringer.bit).map_err(sci_err)?;
    let rung = peer.ring_tagged(MEF, ringer.tag).map_err(sci_err)?;
    if rung == Rung::Armed {
        wakers.wake(dest as Rank);
    }
    Ok(())
}

/// Writes `msg` (no Long) into `slot` of `out` with `flags`, if it goes there by PIO without
/// staging; `false`, with nothing written, for `TxState::send` (a message too large for a
/// slot, which the writer refuses, or "1 copy, 1 transfer").
#[inline(always)]
pub(super) fn write_small(
    out: &SlotWriter,
    medium: MediumStrategy,
    slot: usize,
    flags: u32,
    msg: &Outgoing<'_>,
) -> bool {
    let written = match msg.payload {
        Payload::Private([]) => out.write(slot, flags, &[msg.head]),
        payload => match write_medium(out, medium, slot, flags, msg.head, payload) {
            Some(written) => written,
            None => return false,
        },
    };
    // Not `is_ok()`: dropping the whole result, `Ok` too, is an out-of-line call here.
    match written {
        Ok(()) => true,
        Err(e) => {
            drop(e);
            false
        }
    }
}

/// A Medium's slot by "0 copy, 2 transfers": header and head, then the payload straight
/// from where it is. `None` for "1 copy, 1 transfer", which `TxState::send` stages. Inlined:
/// as a call it sets up its many arguments on every Medium, and inlined it adds nothing to a
/// Short's path.
#[inline(always)]
pub(super) fn write_medium(
    out: &SlotWriter,
    medium: MediumStrategy,
    slot: usize,
    flags: u32,
    head: &[u8],
    payload: Payload<'_>,
) -> Option<Result<(), am_shm::ShmError>> {
    match (payload, medium) {
        (Payload::Private(p), MediumStrategy::TwoTransfers) => {
            Some(out.write(slot, flags, &[head, p]))
        }
        (Payload::Shared(s), MediumStrategy::TwoTransfers) => {
            Some(out.write_then(slot, flags, &[head], s))
        }
        (_, MediumStrategy::OneCopy) => None,
    }
}

impl TxState {
    /// Publishes `slot` at `dest` and rings its message-exist flag unless its ringer words
    /// still carry our bit. `own` is this rank's segment (`None`: always ring).
    #[inline]
    pub(super) fn publish(
        &mut self,
        own: Option<&Segment>,
        dest: usize,
        slot: usize,
    ) -> Result<(), SendError> {
        let Some(to) = self.dests.get_mut(dest) else {
            return Err(SendError::PeerLost(dest as Rank));
        };
        let takes = own.map(|_| &self.takes);
        publish_to(
            self.fence,
            &self.ringer,
            &self.peers,
            &self.wakers,
            takes,
            dest,
            to,
            slot,
        )
    }

    /// [`send`](Self::send) of an AM Short or Medium (no Long; a Medium's payload by "0 copy,
    /// 2 transfers"), request or reply, to a peer not lost, with no DMA in flight (so none
    /// pending to any peer): the same slot, written and published the same way, with one
    /// look-up of the destination and without the branches for Longs and the DMA engine.
    /// `own` is `None` exactly while deferring (from a handler), as for `send`. `None`:
    /// anything else (or a message too large for a slot), for `send`.
    #[inline(always)]
    pub(super) fn send_small(
        &mut self,
        own: Option<&Segment>,
        dest: Rank,
        msg: &Outgoing<'_>,
    ) -> Option<Result<(), SendError>> {
        debug_assert_eq!(own.is_none(), self.deferring);
        if msg.long_offset.is_some() || !self.dma.queue.is_empty() {
            return None;
        }
        let p = self.config.slots;
        let d = dest as usize;
        let to = self.dests.get_mut(d)?;
        if to.lost {
            return None;
        }
        // Per-pair order: nothing overtakes a message not yet published.
        if own.is_none() && self.deferred.iter().any(|&(x, _)| x == d) {
            return Some(Err(SendError::Busy));
        }
        // As in `send`: a request takes the next request slot; a reply goes to the reply slot
        // paired with the oldest request it answers. Two paths, each with only its own state
        // live across the write. A write refused (for its length) is left to `send`, which
        // reports it (`TooLarge`).
        let slot = match msg.reply_to {
            None => {
                let Some(slot) = to.request_slot() else {
                    return Some(Err(SendError::Busy));
                };
                if !write_small(&to.out, self.config.medium, slot.index, slot.flags, msg) {
                    return None;
                }
                if to.took_request(slot, p) {
                    restarted(&mut self.recv, d, p);
                }
                slot.index
            }
            Some(route) => {
                let k = match usize::try_from(route.get().wrapping_sub(1)) {
                    Ok(k) if k < p => k,
                    _ => return Some(Err(SendError::NoRequestToAnswer(route))),
                };
                let first = to.answer_next;
                let (answering, mask) = if k == first {
                    (0, 1 << k)
                } else {
                    let n = if k > first { k - first } else { k + p - first } + 1;
                    (answers_flag(n), cyclic_mask(first, n, p))
                };
                if to.awaiting_reply & mask != mask {
                    return Some(Err(SendError::NoRequestToAnswer(route)));
                }
                if !write_small(&to.out, self.config.medium, p + first, answering, msg) {
                    return None;
                }
                to.awaiting_reply &= !mask;
                to.answer_next = next_request_slot(k, p);
                p + first
            }
        };
        if own.is_none() {
            self.deferred.push((d, slot));
            return Some(Ok(()));
        }
        let takes = own.map(|_| &self.takes);
        Some(publish_to(
            self.fence,
            &self.ringer,
            &self.peers,
            &self.wakers,
            takes,
            d,
            to,
            slot,
        ))
    }

    /// Publishes the headers of Longs whose DMA finished.
    pub(super) fn progress_dma(&mut self, own: &Segment) -> Result<(), SendError> {
        while !self.dma.queue.is_empty() {
            let Some(engine) = &self.dma.engine else {
                break;
            };
            let Ok(buf) = engine.done.try_recv() else {
                break;
            };
            self.dma.free.push(buf);
            if let Some((dest, slot)) = self.dma.queue.pop_front() {
                if let Some(to) = self.dests.get_mut(dest) {
                    to.dma_pending -= 1;
                }
                self.publish(Some(own), dest, slot)?;
            }
        }
        Ok(())
    }

    /// Sends `msg`; `own` (this rank's segment) is `None` only while deferring, inside
    /// `poll_recv`.
    pub(super) fn send(
        &mut self,
        own: Option<&Segment>,
        dest: Rank,
        msg: &Outgoing<'_>,
    ) -> Result<(), SendError> {
        let d = dest as usize;
        match self.dests.get(d) {
            None => return Err(SendError::InvalidRank(dest)),
            Some(to) if to.lost => return Err(SendError::PeerLost(dest)),
            Some(_) => {}
        }
        if let Some(own) = own.filter(|_| !self.deferring && !self.dma.queue.is_empty()) {
            self.progress_dma(own)?;
        }
        let (Some(to), Some(peer)) = (self.dests.get_mut(d), self.peers.get(d)) else {
            return Err(SendError::PeerLost(dest));
        };
        let use_dma = msg.long_offset.is_some() && msg.payload.len() >= self.config.dma_threshold;
        // Per-pair order: nothing overtakes a message not yet published.
        if (to.dma_pending > 0 && !use_dma)
            || (self.deferring && self.deferred.iter().any(|&(x, _)| x == d))
        {
            return Err(SendError::Busy);
        }
        let p = self.config.slots;
        // A reply goes to the reply slot paired with the oldest request it answers: the one
        // its route names (the request's slot) and, for a coalesced implicit reply, the
        // earlier ones still unanswered, which it answers too (the slot flags say how many).
        // For a reply, `answer_after` is the slot of the request after the last it answers.
        let (slot, answering, claim) = if let Some(route) = msg.reply_to {
            match route.get().checked_sub(1).map(usize::try_from) {
                Some(Ok(k)) if k < p => {
                    let first = to.answer_next;
                    let (answering, mask) = if k == first {
                        (0, 1 << k)
                    } else {
                        // A coalesced implicit reply (off the round trip's path).
                        let n = if k > first { k - first } else { k + p - first } + 1;
                        (answers_flag(n), cyclic_mask(first, n, p))
                    };
                    if to.awaiting_reply & mask != mask {
                        return Err(SendError::NoRequestToAnswer(route));
                    }
                    let claim = Claim::Reply {
                        answered: mask,
                        answer_after: next_request_slot(k, p),
                    };
                    (p + first, answering, claim)
                }
                _ => return Err(SendError::NoRequestToAnswer(route)),
            }
        } else {
            let r = to.request_slot().ok_or_else(|| SendError::Busy)?;
            (r.index, r.flags, Claim::Request(r))
        };
        let cap = self.chan.capacity();
        let base = self.chan.base(slot).map_err(sci_err)?;
        let mut via_dma = false;
        if let Some(off) = msg.long_offset {
            if msg.head.len() > cap {
                return Err(SendError::TooLarge(msg.len()));
            }
            if msg.payload.len() > self.config.max_long {
                return Err(SendError::TooLarge(msg.payload.len()));
            }
            if let Some(at) = long_at(&self.layout, off, msg.payload.len()) {
                if use_dma {
                    if self.dma.engine.is_none() {
                        let Some(own) = self.peers.get(self.rank).cloned() else {
                            return Err(SendError::device("sci: no own segment"));
                        };
                        let wakers = self.wakers.clone();
                        let rank = self.rank as Rank;
                        let engine = DmaEngine::start(own, move || wakers.wake(rank))
                            .map_err(|e| SendError::device_from("sci: starting DMA", e))?;
                        self.dma.engine = Some(engine);
                        self.dma.free = (0..QUEUE_DEPTH)
                            .map(|_| Vec::with_capacity(self.config.max_long))
                            .collect();
                    }
                    let Some(mut buf) = self.dma.free.pop() else {
                        return Err(SendError::Busy);
                    };
                    buf.clear();
                    msg.payload.append_to(&mut buf);
                    let job = Job {
                        target: peer.clone(),
                        offset: at,
                        buf,
                    };
                    let submitted = self.dma.engine.as_ref().is_some_and(|e| e.submit(job));
                    if !submitted {
                        return Err(SendError::device("sci: the DMA engine stopped"));
                    }
                    via_dma = true;
                } else {
                    write_payload(peer, at, msg.payload)?;
                }
            }
            write_slot(peer, base, PLACED | answering, msg.head, Payload::EMPTY)
                .map_err(sci_err)?;
        } else {
            if msg.len() > cap {
                return Err(SendError::TooLarge(msg.len()));
            }
            match self.config.medium {
                MediumStrategy::TwoTransfers => {
                    write_slot(peer, base, answering, msg.head, msg.payload)
                }
                MediumStrategy::OneCopy => {
                    self.staging.clear();
                    self.staging.extend_from_slice(msg.head);
                    msg.payload.append_to(&mut self.staging);
                    write_slot(peer, base, answering, &self.staging, Payload::EMPTY)
                }
            }
            .map_err(sci_err)?;
        }
        // Claimed: message location status, or the requests answered.
        match claim {
            Claim::Reply {
                answered,
                answer_after,
            } => {
                to.awaiting_reply &= !answered;
                to.answer_next = answer_after;
            }
            Claim::Request(r) => {
                if to.took_request(r, p) {
                    restarted(&mut self.recv, d, p);
                }
            }
        }
        if via_dma {
            self.dma.queue.push_back((d, slot));
            to.dma_pending += 1;
            Ok(())
        } else if self.deferring {
            self.deferred.push((d, slot));
            Ok(())
        } else {
            self.publish(own, d, slot)
        }
    }
}

impl Tx for TxState {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        if self.bank.is_some() {
            return self.send_bank(dest, msg);
        }
        if let Some(sent) = self.send_small(None, dest, msg) {
            return sent;
        }
        self.send(None, dest, msg)
    }
}

impl Tx for Sci {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        if self.tx.bank.is_some() {
            return self.tx.send_bank(dest, msg);
        }
        if let Some(sent) = self.tx.send_small(Some(&self.seg), dest, msg) {
            return sent;
        }
        self.tx.send(Some(&self.seg), dest, msg)
    }
}
