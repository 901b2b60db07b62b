//! [`Sci`]: the NIC of one rank, as an `am_core::Transport`.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

use am_core::{
    Armed, Capabilities, Delivery, Limits, Outgoing, Payload, Rank, Received, Route, SendError,
    Transport, TransportError, Tx,
};
use am_nic::wake::{Wake, Wakers};
use am_nic::{Liveness, LIVENESS_AFTER};
use am_shm::mailbox::{Inbox, Port, Seen};
use am_shm::stamp::{SlotReader, SlotWriter, Slots, SLOT_HEADER};
use am_shm::sync::AsymmetricFence;
use am_shm::{Imported, Rung, Segment, SharedBytes, WordRun};

use crate::dma::{DmaEngine, Job, QUEUE_DEPTH};
use crate::layout::{answers, answers_flag, Layout, ABORT, BANK_REPLY, LONE, MEF, PLACED};
use crate::{MediumStrategy, SciConfig, SciError};

/// Polls a receiver may make while it leaves its message-exist flag set after the work queue
/// drained, before it clears the flag: clearing it on every message would make the next
/// sender ring it again, an atomic on a line the receiver polls. A take costs a `membarrier`
/// (an interrupt of every core running a registered process, see `TxState::fence`), so it
/// waits for an idle stretch many polls long.
const STALE_POLLS: u32 = 16384;

/// The sending half: message location status, sequence numbers, the DMA queue. Lent to
/// handlers during `poll_recv` (with publication deferred until the handler returns, so the
/// slot it reads is not handed back early).
struct TxState {
    rank: usize,
    /// Where we ring every peer.
    ringer: Ringer,
    layout: Layout,
    config: SciConfig,
    /// Our command segment (at every peer).
    chan: Slots,
    /// Every rank's departed word and take count in our word area (see
    /// [`Layout::departed_words`]), checked once: the take count a send reads is one compare
    /// from its index.
    takes: WordRun,
    /// Imported segments, by rank (our own included, for messages to self).
    peers: Vec<Imported>,
    /// Wakes a peer whose message-exist flag said it sleeps on its wake socket.
    wakers: Arc<Wakers>,
    /// Per destination (the same index as `peers`).
    dests: Vec<Dest>,
    /// Per sender: the next stamp and the slots its next message can be in (here rather than
    /// beside the work queue, because a request that restarts at slot 0 moves where its
    /// reply will be; see [`Dest::next_req`]).
    recv: Vec<Expect>,
    /// Between a publication and the read of the take count (the light side, no fence
    /// instruction where the kernel has `membarrier`), and between a take and its scan (the
    /// heavy side, a barrier on every sender's running threads): see [`publish_to`].
    fence: AsymmetricFence,
    /// Inside `poll_recv`: publish after the handler returns.
    deferring: bool,
    deferred: Vec<(usize, usize)>,
    /// "1 copy, 1 transfer" staging buffer.
    staging: Vec<u8>,
    dma: Dma,
    /// With a bank ([`crate::SciConfig::bank`]): every message goes through it, and none of
    /// the per-sender state above is used.
    bank: Option<BankTx>,
}

/// Bytes of a bank message's header, before its AM bytes: length (`u32`), then slot flags
/// (`u32`: [`PLACED`], [`BANK_REPLY`] and, for a reply, how many requests it answers).
const BANK_HEADER: usize = 8;

/// The sending half of the bank: a port on each peer's bank, and per peer what a reply
/// answers. A sender's messages to one peer take that peer's bank slots in ticket order, so
/// they arrive in send order, and a reply answers the oldest requests still unanswered: one
/// count per direction is all the bookkeeping a reply needs.
struct BankTx {
    /// Our port on each rank's bank (ours too, for messages to self).
    ports: Vec<Port>,
    /// Each bank's head as we last read it (reloaded when it looks full).
    heads: Vec<u64>,
    /// Per peer: our requests it has not answered yet.
    outstanding: Vec<u64>,
    /// Per peer: the requests it sent us, counted from 1 (a request's count is its route).
    received: Vec<u64>,
    /// Per peer: the count of the last request we answered.
    answered: Vec<u64>,
}

/// What a receiver expects of one sender: its next message carries stamp `seq` and is in
/// `req` (its next request slot) or `rep` (the reply slot of our oldest unanswered request),
/// as both sides take slots in turn; or, once we have answered all its requests and the last
/// carried [`LONE`], in its request slot 0 (a lone request after a lone one restarts there,
/// see [`Dest::next_req`]).
#[derive(Clone, Copy)]
struct Expect {
    seq: u64,
    req: usize,
    rep: usize,
    /// The sender's slot 0 in [`Sci::inbox`]: its slot `k` is `base + k` there.
    base: usize,
    /// Its last request taken carried [`LONE`]: once we have answered it, its next request
    /// may restart at slot 0.
    lone: bool,
}

impl Expect {
    fn new(base: usize, p: usize) -> Expect {
        Expect {
            seq: 1,
            req: 0,
            rep: p,
            base,
            lone: false,
        }
    }

    /// After the message in `slot` (of a channel with `p` request slots) with slot flags
    /// `flags` was taken. A reply answers 1 ..= p requests (see [`answered_by`]): the next
    /// one goes to the reply slot of the request after them.
    #[inline]
    fn advance(&mut self, slot: usize, p: usize, flags: u32) {
        self.seq += 1;
        // In turn among its kind, without a division: `slot - p + answers < 2 * p`
        // (`answers <= p`).
        if slot < p {
            self.req = next_request_slot(slot, p);
            self.lone = flags & LONE != 0;
        } else {
            let k = slot - p + answered_by(flags, slot, p);
            self.rep = p + if k >= p { k - p } else { k };
        }
    }
}

/// Where else than `e.req` sender `c`'s next request can be: its request slot 0, once we
/// have answered all its requests (`to`, our bookkeeping of `c`) and the last was [`LONE`],
/// since it then restarts there if it has none outstanding when it sends (see
/// [`Dest::next_req`]); `None` if that is `e.req` anyway, we still owe it replies, or its
/// last request was sent while others were outstanding.
#[inline(always)]
fn restart_slot(e: &Expect, to: Option<&Dest>) -> Option<usize> {
    (e.lone && e.req != 0 && to.is_some_and(|to| to.awaiting_reply == 0)).then_some(0)
}

/// A lone request went to `dest`'s request slot 0 (see [`Dest::next_req`]): its reply comes
/// to the paired reply slot.
#[inline(always)]
fn restarted(recv: &mut [Expect], dest: usize, p: usize) {
    if let Some(e) = recv.get_mut(dest) {
        e.rep = p;
    }
}

/// How many requests the message in `slot` (of a channel with `p` request slots) answers,
/// from its slot flags: 1 for a request, at most `p` (a peer can write any flags, which the
/// delivery checks against our requests).
#[inline(always)]
fn answered_by(flags: u32, slot: usize, p: usize) -> usize {
    if slot < p {
        1
    } else {
        // `answers` is at least 1; not `clamp`, which is not inlined here.
        answers(flags).min(p)
    }
}

/// Bits `start .. start + n` of a slot mask, counted modulo `p` (request slots in turn):
/// the requests a reply answers.
#[inline]
fn cyclic_mask(start: usize, n: usize, p: usize) -> u64 {
    let ones = |k: usize| 1u64.checked_shl(k as u32).map_or(u64::MAX, |b| b - 1);
    let first = n.min(p - start);
    (ones(first) << start) | ones(n - first)
}

/// The request slot after request slot `slot` (`< p`): request slots are taken in turn.
#[inline(always)]
fn next_request_slot(slot: usize, p: usize) -> usize {
    // Compare instead of `%`: no division on every message.
    if slot + 1 == p {
        0
    } else {
        slot + 1
    }
}

/// What a sender keeps per destination (one cache line's worth, read together).
struct Dest {
    /// Our command segment in that peer's segment, checked once (every slot we write there
    /// is then one compare from its index).
    out: SlotWriter,
    /// Which of our request slots at that peer are busy.
    mls: MessageLocationStatus,
    /// The request slot the next request takes while others are outstanding. Slots are taken
    /// in turn and freed in the same order (replies come in request order), so this one is
    /// free whenever any is, and the receiver knows where to look. A request sent with none
    /// outstanding, after one that was sent that way too ([`LONE`]), takes slot 0 instead
    /// (then the receiver has answered all the earlier ones, and looks there too): a run of
    /// round trips reuses one slot, whose lines stay warm in both caches, instead of cycling
    /// through all of them, whose lines have gone cold by their turn, the more of them the
    /// colder (BENCHMARKS.md, "sci's slot-0 restart"). A stream keeps to the slots in turn,
    /// where the receiver looks first.
    next_req: usize,
    /// Our last request to it was sent with none outstanding (it carried [`LONE`]).
    last_lone: bool,
    /// Next stamp.
    send_seq: u64,
    /// The destination's take count (see [`Layout::taken`]) as read when we last rang it;
    /// `u64::MAX` before the first ring (which rings whatever the count is).
    rung: u64,
    /// Where that count is in [`TxState::takes`] (from `Layout::taken`, computed once).
    taken_ix: usize,
    /// Longs to it that the DMA engine has not finished.
    dma_pending: u32,
    lost: bool,
    /// Its request slots whose request we have not answered yet (bit `k`: slot `k`): a reply
    /// must answer one of them, and a new request in one of them is a peer's misbehaviour.
    awaiting_reply: u64,
    /// Its oldest request we have not answered (the slot): our next reply to it goes to
    /// the paired reply slot, and answers that request and the later ones up to its route.
    answer_next: usize,
}

/// A request slot chosen by [`Dest::request_slot`], to be claimed by [`Dest::took_request`]
/// once the request is written.
#[derive(Clone, Copy)]
struct RequestSlot {
    index: usize,
    /// The slot flags: [`LONE`] if no other request to this peer is outstanding.
    flags: u32,
    /// A lone request after a lone one: it restarts at slot 0.
    restart: bool,
}

/// What a message written by [`TxState::send`] claims at its destination once written.
enum Claim {
    /// A request: the slot [`Dest::request_slot`] chose.
    Request(RequestSlot),
    /// A reply: it answers the requests whose slots are set in `answered`; the next reply
    /// to this peer answers the request in slot `answer_after`.
    Reply { answered: u64, answer_after: usize },
}

impl Dest {
    /// The request slot our next request to this peer takes (see [`Dest::next_req`]);
    /// `None` while that slot still holds a request.
    #[inline(always)]
    fn request_slot(&self) -> Option<RequestSlot> {
        let lone = self.mls.0 == 0;
        let restart = lone && self.last_lone;
        let index = if restart { 0 } else { self.next_req };
        if self.mls.is_busy(index) {
            return None;
        }
        let flags = if lone { LONE } else { 0 };
        Some(RequestSlot {
            index,
            flags,
            restart,
        })
    }

    /// The request was written to `slot.index` (`< p`): the slot is claimed and the next
    /// one chosen. Whether it restarted at slot 0, which the caller tells the receive side
    /// ([`restarted`]).
    #[inline(always)]
    fn took_request(&mut self, slot: RequestSlot, p: usize) -> bool {
        self.last_lone = slot.flags & LONE != 0;
        self.mls.take(slot.index);
        self.next_req = next_request_slot(slot.index, p);
        slot.restart
    }
}

/// The seed's **message location status** of one destination, at the sender: bit `k` set
/// while request slot `k` at that peer holds a request whose reply (or implicit ACK) has not
/// come back, so the slot may not be written.
#[derive(Debug, Default, Clone, Copy)]
struct MessageLocationStatus(u64);

impl MessageLocationStatus {
    #[inline]
    fn is_busy(&self, slot: usize) -> bool {
        self.0 & (1 << slot) != 0
    }

    #[inline]
    fn take(&mut self, slot: usize) {
        self.0 |= 1 << slot;
    }

    /// The reply to the requests in the slots of `mask` arrived.
    #[inline]
    fn free(&mut self, mask: u64) {
        self.0 &= !mask;
    }

    /// Whether every slot of `mask` is busy.
    #[inline]
    fn all_busy(&self, mask: u64) -> bool {
        self.0 & mask == mask
    }
}

struct Dma {
    engine: Option<DmaEngine>,
    /// Messages whose payload the engine is copying, in submit order: (dest, slot).
    queue: VecDeque<(usize, usize)>,
    free: Vec<Vec<u8>>,
}

/// A message found ready: sender `sender`'s slot `slot` of its command segment (request
/// slots first, then reply slots).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Ready {
    sender: usize,
    slot: usize,
}

/// The next message to deliver (see [`Sci::next_message`]).
#[derive(Clone, Copy)]
struct Next {
    ready: Ready,
    /// Taken where the hint points: its sender's [`Expect`] is not advanced yet, the delivery
    /// does it from the header it reads anyway. A message from the work queue or a look was
    /// advanced past when it was found.
    at_hint: bool,
}

/// The sender of the last message and whether it was a reply: a poll looks first where that
/// sender's next message of the same kind goes, then at its other slot.
#[derive(Clone, Copy)]
struct Hint {
    sender: usize,
    reply: bool,
}

/// One rank's SCI NIC. See the [crate docs](crate).
pub struct Sci {
    seg: Segment,
    /// Every sender's command segment in `seg`, one after another (sender `c`'s slot `k` is
    /// slot `c * 2 * slots + k`), checked once: a ready flag, a header or a body is then one
    /// compare from its index.
    inbox: SlotReader,
    tx: TxState,
    /// The seed's **work queue**: messages found ready, in per-sender order, so a poll takes
    /// the next one in constant time whatever the number of peers.
    work: VecDeque<Ready>,
    /// Scratch for one sender's message-ready flags during a scan.
    stamps: Vec<u64>,
    /// Scratch for the senders whose ringer bits a take cleared.
    rang: Vec<usize>,
    liveness: Liveness,
    /// Errors found by a liveness check beyond the one it returned, for the next polls.
    faults: VecDeque<TransportError>,
    /// Where a poll looks first (see [`Hint`]).
    hint: Hint,
    /// Takes of our message-exist flag that cleared ringer bits (see [`Layout::taken`]).
    takes: u64,
    /// Polls since the work queue drained with the message-exist flag left set.
    stale_polls: u32,
    /// Offset of the AM segment in our byte area (`Layout::segment_base`, computed once).
    am_base: usize,
    /// Where an event loop sleeps between `arm` and `disarm`.
    wake: Wake,
    /// Our bank, read in ticket order; `None` without one.
    bank: Option<Inbox>,
}

/// A shared-memory access of this NIC's own layout that failed (its cause kept as the
/// source).
#[cold]
fn sci_err(e: am_shm::ShmError) -> SendError {
    SendError::device_from("sci: a shared-memory access out of the layout", e)
}

/// Writes the body of the slot at `base` as [`Slots::write`] lays it out (`[stamp][len]
/// [flags][head][payload]`, see [`am_shm::stamp`]), without its slice of parts: one run of
/// whole-word stores on every send's path (the slot is ours until the reply frees it, so
/// the padding of its last word is too). The caller has checked the length against the
/// slot's capacity; publishing (the stamp) is a separate step.
#[inline(always)]
fn write_slot(
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
fn long_at(layout: &Layout, off: usize, len: usize) -> Option<usize> {
    off.checked_add(len)
        .filter(|&end| end <= layout.segment && len != 0)
        .map(|_| layout.segment_base() + off)
}

/// A Long's payload written into `to` at `at` by PIO stores.
fn write_payload(to: &Imported, at: usize, payload: Payload<'_>) -> Result<(), SendError> {
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
fn publish_to(
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
struct Ringer {
    at: usize,
    bit: u64,
    tag: u32,
}

impl Ringer {
    fn of(layout: &Layout, rank: usize) -> Ringer {
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
fn ring(
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
fn write_small(
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
fn write_medium(
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
    fn publish(
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
    fn send_small(
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
    fn progress_dma(&mut self, own: &Segment) -> Result<(), SendError> {
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
    fn send(
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

impl TxState {
    /// Sends `msg` through `dest`'s bank: one slot claimed with a compare-and-swap on its
    /// status word (SCI's lock transaction), the header and the AM bytes stored, the status
    /// published; then `dest`'s message-exist flag rung if it is not set already. A Long's
    /// payload goes first, into `dest`'s AM segment by PIO. `Busy` while the bank is full.
    #[inline(never)]
    fn send_bank(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let d = dest as usize;
        match self.dests.get(d) {
            None => return Err(SendError::InvalidRank(dest)),
            Some(to) if to.lost => return Err(SendError::PeerLost(dest)),
            Some(_) => {}
        }
        let (Some(b), Some(peer)) = (self.bank.as_mut(), self.peers.get(d)) else {
            return Err(SendError::PeerLost(dest));
        };
        // A reply answers the oldest unanswered requests up to the one its route counts.
        let (mut flags, answers_up_to) = match msg.reply_to {
            None => (0, None),
            Some(route) => {
                let r = route.get();
                let first = b.answered[d] + 1;
                if r < first || r > b.received[d] || r - first >= 256 {
                    return Err(SendError::NoRequestToAnswer(route));
                }
                let n = (r - first + 1) as usize;
                (BANK_REPLY | answers_flag(n), Some(r))
            }
        };
        let mut payload = msg.payload;
        if let Some(off) = msg.long_offset {
            if payload.len() > self.config.max_long {
                return Err(SendError::TooLarge(payload.len()));
            }
            if let Some(at) = long_at(&self.layout, off, payload.len()) {
                write_payload(peer, at, payload)?;
            }
            flags |= PLACED;
            payload = Payload::EMPTY;
        }
        let port = &b.ports[d];
        let len = msg.head.len() + payload.len();
        if len > port.ring().capacity() - BANK_HEADER {
            return Err(SendError::TooLarge(len));
        }
        let mut hdr = [0u8; BANK_HEADER];
        hdr[..4].copy_from_slice(&(len as u32).to_le_bytes());
        hdr[4..].copy_from_slice(&flags.to_le_bytes());
        let head = &mut b.heads[d];
        let me = self.rank as u32;
        let sent = match payload {
            Payload::Private(p) => port.send_parts(head, &[&hdr, msg.head, p], me),
            Payload::Shared(s) => port.send_then(head, &[&hdr, msg.head], s, me),
        };
        if !sent.map_err(sci_err)? {
            return Err(SendError::Busy);
        }
        match answers_up_to {
            None => b.outstanding[d] += 1,
            Some(r) => b.answered[d] = r,
        }
        // The flag stays set while the receiver polls (it takes it only before it sleeps),
        // so a stream of messages reads it and writes nothing.
        let bell = port.segment().doorbell(MEF).map_err(sci_err)?;
        if bell.ring_tagged_lazy(0) == Rung::Armed {
            self.wakers.wake(dest);
        }
        Ok(())
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

impl Sci {
    fn new(
        job: String,
        rank: usize,
        layout: Layout,
        config: SciConfig,
        seg: Segment,
        peer_segments: &[Segment],
        pids: Vec<Option<nix::unistd::Pid>>,
    ) -> Result<Sci, SciError> {
        let n = layout.ranks;
        let peers: Vec<Imported> = peer_segments.iter().map(Segment::import).collect();
        let (bank_tx, bank) = match layout.bank_ring() {
            Some(ring) => {
                let record = layout.bank_record(rank);
                let ports = peer_segments
                    .iter()
                    .map(|p| ring.port(p, rank as u32, record))
                    .collect::<Result<Vec<_>, _>>()?;
                let tx = BankTx {
                    ports,
                    heads: vec![0; n],
                    outstanding: vec![0; n],
                    received: vec![0; n],
                    answered: vec![0; n],
                };
                (Some(tx), Some(ring.inbox(&seg)?))
            }
            None => (None, None),
        };
        let chan = layout.command_segment(rank);
        // The geometry was checked by `Layout::new` and every segment made with it, so these
        // checks do not fail; made once, they spare every message its offset checks.
        let inbox = layout.command_segments().reader(&seg)?;
        let lines = layout.departed_words();
        let takes_at = lines.base;
        let takes = seg.word_run(takes_at, n * lines.stride / 8)?;
        let outs = peers
            .iter()
            .map(|peer| chan.writer(peer))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Sci {
            seg,
            inbox,
            tx: TxState {
                rank,
                ringer: Ringer::of(&layout, rank),
                wakers: Arc::new(Wakers::new(&job, n as u32)),
                takes,
                layout,
                config,
                chan,
                peers,
                dests: outs
                    .into_iter()
                    .enumerate()
                    .map(|(d, out)| Dest {
                        out,
                        mls: MessageLocationStatus::default(),
                        next_req: 0,
                        send_seq: 1,
                        rung: u64::MAX,
                        taken_ix: (layout.taken(d) - takes_at) / 8,
                        dma_pending: 0,
                        lost: false,
                        awaiting_reply: 0,
                        answer_next: 0,
                        last_lone: false,
                    })
                    .collect(),
                recv: (0..n)
                    .map(|c| Expect::new(c * 2 * config.slots, config.slots))
                    .collect(),
                fence: AsymmetricFence::across_processes(),
                deferring: false,
                deferred: Vec::with_capacity(4),
                staging: Vec::with_capacity(config.slot_size),
                dma: Dma {
                    engine: None,
                    queue: VecDeque::with_capacity(QUEUE_DEPTH),
                    free: Vec::new(),
                },
                bank: bank_tx,
            },
            work: VecDeque::with_capacity(n * 2 * layout.slots),
            stamps: vec![0; 2 * config.slots],
            rang: Vec::new(),
            liveness: Liveness::new(pids),
            faults: VecDeque::new(),
            takes: 0,
            hint: Hint {
                sender: 0,
                reply: false,
            },
            stale_polls: 0,
            am_base: layout.segment_base(),
            wake: Wake::new("sci", &job, rank as Rank),
            bank,
        })
    }

    fn layout_for(ranks: u32, segment_size: usize, config: &SciConfig) -> Result<Layout, SciError> {
        let (r, size) = (ranks as usize, config.slot_size);
        let layout = if config.bank > 0 {
            Layout::with_bank(r, config.bank, size, segment_size)
        } else {
            Layout::new(r, config.slots, size, segment_size)
        };
        layout.ok_or_else(|| {
            SciError::Config(format!(
                "{ranks} ranks with a segment of {segment_size} bytes overflow a segment's size"
            ))
        })
    }

    /// The transports of an in-process job of `ranks` ranks (one per thread), over heap
    /// memory that the threads share exactly as processes share a mapping (the same atomics,
    /// the same views), so Miri and loom check this code too.
    pub fn cluster(
        ranks: u32,
        segment_size: usize,
        config: SciConfig,
    ) -> Result<Vec<Sci>, SciError> {
        config.validate()?;
        if ranks == 0 {
            return Err(SciError::Config("a job has at least one rank".into()));
        }
        let layout = Self::layout_for(ranks, segment_size, &config)?;
        let segs = (0..ranks)
            .map(|_| Segment::heap(layout.words_len(), layout.bytes_len()))
            .collect::<Result<Vec<_>, _>>()?;
        let shared: Vec<Segment> = segs.iter().map(Segment::share).collect();
        let job = am_nic::wake::in_process_job("sci");
        segs.into_iter()
            .enumerate()
            .map(|(r, seg)| {
                Sci::new(
                    job.clone(),
                    r,
                    layout,
                    config,
                    seg,
                    &shared,
                    vec![None; ranks as usize],
                )
            })
            .collect()
    }

    /// Starts this rank's NIC in a multi-process job: exports its segment (anonymous: no file
    /// is ever left behind), exchanges pids, geometry and segment handles through the
    /// launcher's key-value store, and imports every peer's segment (`am_nic::connect`).
    pub fn connect(
        job: &mut am_bootstrap::JobInfo,
        segment_size: usize,
        config: SciConfig,
    ) -> Result<Sci, SciError> {
        config.validate()?;
        let layout = Self::layout_for(job.size, segment_size, &config)?;
        let geometry = format!(
            "{},{},{},{}",
            config.slots, config.slot_size, segment_size, config.bank
        );
        let joined = am_nic::connect(
            job,
            "sci",
            layout.words_len(),
            layout.bytes_len(),
            segment_size,
            &geometry,
            |_| Ok(()),
        )?;
        // An imported segment is written, never read (SCI's remote writes, local reads);
        // a bank's claims and head are the exception (lock transactions).
        Sci::new(
            job.job_id.clone(),
            job.rank as usize,
            layout,
            config,
            joined.own,
            &joined.peers,
            joined.pids,
        )
    }

    /// `dest`'s AM segment, as this rank's mapping of it reaches it (remote atomics).
    fn peer_segment(&self, dest: Rank) -> Result<SharedBytes<'_>, SendError> {
        let d = dest as usize;
        let (Some(to), Some(peer)) = (self.tx.dests.get(d), self.tx.peers.get(d)) else {
            return Err(SendError::InvalidRank(dest));
        };
        if to.lost {
            return Err(SendError::PeerLost(dest));
        }
        let l = &self.tx.layout;
        // A rank that left wrote its departed word here: nothing it owns is to be touched.
        if d != self.tx.rank && self.seg.load_word(l.departed(d)).unwrap_or(0) != 0 {
            return Err(SendError::PeerDeparted(dest));
        }
        peer.byte_area()
            .slice(l.segment_base(), l.segment)
            .map_err(sci_err)
    }

    /// The AM segment: a view of this rank's exported memory after the command segments
    /// (in range by construction: the segment was made with this layout).
    fn am_segment(&self) -> SharedBytes<'_> {
        self.seg
            .byte_area()
            .slice_or_empty(self.am_base, self.tx.layout.segment)
    }

    /// The configuration in use.
    pub fn config(&self) -> &SciConfig {
        &self.tx.config
    }

    /// The segment geometry in use.
    pub fn layout(&self) -> &Layout {
        &self.tx.layout
    }

    /// Before a sleep: publishes finished DMA, takes the message-exist flag (never sleep on a
    /// flag left set) and checks liveness; whether there is still nothing to do.
    fn nothing_to_do(&mut self) -> Result<bool, TransportError> {
        if self.bank.is_some() {
            return self.bank_is_empty();
        }
        if !self.tx.dma.queue.is_empty() {
            self.tx.progress_dma(&self.seg)?;
        }
        if !self.work.is_empty() {
            return Ok(false);
        }
        self.take_exist_flag()?;
        if !self.work.is_empty() {
            return Ok(false);
        }
        self.liveness_tick()?;
        Ok(self.work.is_empty())
    }

    /// Takes the message-exist flag: clears it and the ringer bits of the words its tags
    /// name, tells the senders whose bits it cleared (a new take count written into each
    /// one's segment, so they ring again), and scans them.
    fn take_exist_flag(&mut self) -> Result<(), TransportError> {
        self.stale_polls = 0;
        let tags = self.seg.doorbell(MEF).map_err(sci_err)?.take_tags();
        if tags == 0 {
            return Ok(());
        }
        let mut rang = std::mem::take(&mut self.rang);
        rang.clear();
        let layout = self.tx.layout;
        let taken = for_each_ringer_word(&layout, tags, |w| {
            let bits = self.seg.take_word(layout.ringer_word(w))?;
            rang.extend(ringers_in(w, bits, layout.ranks));
            Ok(())
        });
        let mut fenced = true;
        let told = taken.and_then(|()| {
            if !rang.is_empty() {
                self.takes += 1;
                let at = layout.taken(self.tx.rank);
                for &c in &rang {
                    if let Some(peer) = self.tx.peers.get(c) {
                        peer.store_word(at, self.takes)?;
                    }
                }
                // The count before the scan, against the sender's ready flag before its read
                // of the count (see `publish_to`): a barrier on the senders' threads too, as
                // their side has no fence instruction.
                fenced = self.tx.fence.heavy();
            }
            Ok(())
        });
        let scanned = told.map_err(sci_err).and_then(|()| self.scan(&rang));
        self.rang = rang;
        scanned?;
        if !fenced {
            return Err(TransportError::device(
                "sci: membarrier failed: a sender's message may be found late",
            ));
        }
        Ok(())
    }

    /// Sender `c`'s ready messages, taken in stamp order (its [`Expect`] advanced past each)
    /// from the slots where each next one can be: the first one found goes to `first` if
    /// that is still empty, the others to the work queue.
    #[inline(always)]
    fn take_ready(&mut self, c: usize, first: &mut Option<Ready>) -> Result<(), TransportError> {
        let io = sci_err;
        let p = self.tx.config.slots;
        let TxState { recv, dests, .. } = &mut self.tx;
        let Some(e) = recv.get_mut(c) else {
            return Ok(());
        };
        // A reply comes only while a request of ours to `c` waits for one: otherwise its reply
        // slots are not read (nor their pages allocated, for a peer we never asked anything).
        let replies = dests.get(c).is_some_and(|to| to.mls.0 != 0);
        loop {
            let restart = restart_slot(e, dests.get(c));
            let slot = if self.inbox.stamp(e.base + e.req).map_err(io)? == e.seq {
                e.req
            } else if replies && self.inbox.stamp(e.base + e.rep).map_err(io)? == e.seq {
                e.rep
            } else {
                match restart {
                    Some(r) if self.inbox.stamp(e.base + r).map_err(io)? == e.seq => r,
                    _ => return Ok(()),
                }
            };
            // A reply's flags say how many requests it answers (where the next reply goes), a
            // request's whether it was sent lone.
            let flags = self.inbox.header(e.base + slot).map_err(io)?.flags;
            e.advance(slot, p, flags);
            let found = Ready { sender: c, slot };
            if first.is_none() {
                *first = Some(found);
            } else {
                self.work.push_back(found);
            }
        }
    }

    /// Scans the command segments of the senders in `senders` (those whose ringer bits a take
    /// cleared): reads the message-ready flags of the slots each one can have written, then
    /// moves the ready messages to the work queue in stamp order, and then the ones found in
    /// turn after them. After a take, so that a message a sender put where the protocol does
    /// not is still found.
    ///
    /// Slots are taken in turn from slot 0, so a sender that has sent fewer messages than
    /// there are slots of a kind has written none past its next one of that kind: those are
    /// not read, and their pages, which a read would allocate, stay untouched until it writes
    /// them. Nor are its reply slots while no request of ours to it waits for a reply.
    fn scan(&mut self, senders: &[usize]) -> Result<(), TransportError> {
        let io = sci_err;
        let p = self.tx.config.slots;
        for &c in senders {
            let replies = self.tx.dests.get(c).is_some_and(|to| to.mls.0 != 0);
            let Some(e) = self.tx.recv.get_mut(c) else {
                continue;
            };
            let (reqs, reps) = if e.seq > p as u64 {
                (p, p)
            } else {
                (e.req + 1, e.rep - p + 1)
            };
            let reps = if replies { reps } else { 0 };
            // One pass over the ready flags, then find the stamps in order locally. Reused
            // buffer: a fresh array per scan would cost a memset per poll.
            let stamps = &mut self.stamps;
            stamps.fill(0);
            for k in (0..reqs).chain(p..p + reps) {
                if let Some(s) = stamps.get_mut(k) {
                    *s = self.inbox.stamp(e.base + k).map_err(io)?;
                }
            }
            while let Some(slot) = stamps.iter().position(|&s| s == e.seq) {
                let flags = self.inbox.header(e.base + slot).map_err(io)?.flags;
                e.advance(slot, p, flags);
                self.work.push_back(Ready { sender: c, slot });
            }
            // The ones in turn after them, in slots not read above.
            self.queue_ready(c)?;
        }
        Ok(())
    }

    /// [`take_ready`](Self::take_ready) of sender `c` onto the end of the work queue, in
    /// stamp order, also when it fails part way (what it took is not lost).
    fn queue_ready(&mut self, c: usize) -> Result<(), TransportError> {
        let queued = self.work.len();
        let mut first = None;
        let taken = self.take_ready(c, &mut first);
        if let Some(found) = first {
            self.work.insert(queued, found);
        }
        taken
    }

    /// The next message to deliver: the work queue's head; else the last sender's next
    /// message, if the slot where its next message of the same kind goes carries it (or, with
    /// the flag rung, the slot of the other kind: an exchange both ways alternates them);
    /// else what a [`look`](Self::look) at the senders that rang finds. An idle poll reads
    /// two words of our own memory, the message-exist flag and that ready flag, whatever the
    /// number of peers; they are independent loads, so when both lines were written the
    /// misses overlap.
    #[inline(always)]
    fn next_message(&mut self) -> Result<Option<Next>, TransportError> {
        if let Some(ready) = self.work.pop_front() {
            return Ok(Some(Next {
                ready,
                at_hint: false,
            }));
        }
        let io = sci_err;
        let tags = self.seg.doorbell(MEF).map_err(io)?.peek_tags();
        // Taking a message here keeps per-sender order (the queue is empty and the stamp is
        // the next one) and leaves the flag as it is. A message elsewhere has its sender's
        // ringer bit set.
        let Hint { sender: c, reply } = self.hint;
        let Some(e) = self.tx.recv.get(c) else {
            return Err(TransportError::device("sci: bad hint"));
        };
        // With all its requests answered, `c`'s next request is likelier a lone one, restarted
        // at slot 0 (a round trip's) than one that crossed our last reply (in turn, left to
        // the look below).
        let req = restart_slot(e, self.tx.dests.get(c)).unwrap_or(e.req);
        let (same, other) = if reply { (e.rep, req) } else { (req, e.rep) };
        if self.inbox.stamp(e.base + same).map_err(io)? == e.seq {
            return Ok(Some(Next {
                ready: Ready {
                    sender: c,
                    slot: same,
                },
                at_hint: true,
            }));
        }
        if tags == 0 {
            if self.liveness.idle_poll() {
                self.liveness_tick()?;
            }
            return Ok(None);
        }
        if self.inbox.stamp(e.base + other).map_err(io)? == e.seq {
            return Ok(Some(Next {
                ready: Ready {
                    sender: c,
                    slot: other,
                },
                at_hint: true,
            }));
        }
        Ok(self.look(tags)?.map(|ready| Next {
            ready,
            at_hint: false,
        }))
    }

    /// [`next_message`](Self::next_message) past the hint with the message-exist flag set:
    /// takes the ready messages of the senders that rang (`tags`), looking only where each
    /// one's next message can be (see [`Expect`]): two flags per sender. The first one found
    /// is returned (a look runs only with the work queue empty, and would take it next), the
    /// others queued.
    ///
    /// The flag is left set while traffic flows: its senders send without ringing again (see
    /// `TxState::publish`), and the take, which makes the next one ring, stays off the
    /// delivery path. After a bounded number of fruitless looks it is taken, and the senders
    /// that rang since are scanned.
    #[inline(never)]
    fn look(&mut self, tags: u32) -> Result<Option<Ready>, TransportError> {
        if self.seg.load_word(ABORT).unwrap_or(0) != 0 {
            return Err(TransportError::JobAborted);
        }
        debug_assert!(self.work.is_empty());
        let layout = self.tx.layout;
        let mut first = None;
        // The senders whose ringer bits are set in the words the tags name; an untagged ring
        // (a departure, the DMA engine) names none.
        let walked = for_each_ringer_word(&layout, tags, |w| {
            let bits = self.seg.load_word(layout.ringer_word(w)).map_err(sci_err)?;
            for c in ringers_in(w, bits, layout.ranks) {
                self.take_ready(c, &mut first)?;
            }
            Ok(())
        });
        if let Err(e) = walked {
            // A message already taken is not lost with the look: it is next.
            if let Some(found) = first {
                self.work.push_front(found);
            }
            return Err(e);
        }
        if first.is_some() {
            return Ok(first);
        }
        self.stale_polls += 1;
        if self.stale_polls >= STALE_POLLS {
            self.take_exist_flag()?;
            return Ok(self.work.pop_front());
        }
        Ok(None)
    }

    /// After a while without progress: is every peer that has not departed still alive? And a
    /// look where the next message can be of every sender we have exchanged messages with or
    /// whose ringer bit is set: a peer that corrupted a take count (so its sender never rings)
    /// or our message-exist flag can delay such a message by this much, never strand it.
    /// Other senders are left alone, so that their command segments' pages stay untouched: a
    /// peer that wipes our ringer words after a sender's first ring, before we heard from it,
    /// and forges its take count, can strand that sender's messages (as any peer can
    /// overwrite them).
    fn liveness_tick(&mut self) -> Result<(), TransportError> {
        if !self.liveness.due() {
            return Ok(());
        }
        let layout = self.tx.layout;
        // With a bank there are no command segments to look at.
        let words = if self.bank.is_some() {
            0
        } else {
            layout.ringer_words()
        };
        for w in 0..words {
            // Senders whose ringer bits are set, whatever the flag's tags say (a peer may
            // have wiped them): one load per 64 senders.
            let bits = self.seg.load_word(layout.ringer_word(w)).unwrap_or(0);
            for c in w * 64..layout.ranks.min(w * 64 + 64) {
                let known = self.tx.recv.get(c).is_some_and(|e| e.seq > 1)
                    || self.tx.dests.get(c).is_some_and(|to| to.send_seq > 1);
                if known || bits & crate::layout::ringer_bit(c).1 != 0 {
                    self.queue_ready(c)?;
                }
            }
        }
        let found = self
            .liveness
            .check_now(&self.seg, self.tx.layout.departed_words())?;
        for e in &found {
            if let TransportError::PeerLost(r) = e {
                if let Some(to) = self.tx.dests.get_mut(*r as usize) {
                    to.lost = true;
                }
            }
        }
        if self.bank.is_some() {
            self.unblock_bank();
        }
        // One error per call; the others wait for the next polls.
        let mut found = found.into_iter();
        let first = found.next();
        self.faults.extend(found);
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Sci {
    /// [`Transport::poll_recv`] with a bank: the message at its head, if published. The
    /// header (length and flags, one word) is copied out and checked, the body lent as a
    /// view of the slot, which no sender claims again until the handler has returned and the
    /// head has moved past it. Out of line: the command segments' poll stays as it was.
    #[inline(never)]
    fn poll_bank<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        if let Some(e) = self.faults.pop_front() {
            return Err(e);
        }
        let Some(inbox) = self.bank.as_ref() else {
            return Ok(None);
        };
        let Some(meta) = inbox.head_published() else {
            self.bank_idle()?;
            return Ok(None);
        };
        let word = u64::from_le(inbox.head_first_word());
        let (len, flags) = (word as u32 as usize, (word >> 32) as u32);
        let src = meta as usize;
        let ranks = self.tx.layout.ranks;
        let bad = |what: String| TransportError::PeerMisbehaved {
            peer: (src < ranks).then_some(src as Rank),
            what: format!("sci: bank ticket {}: {what}", inbox.head()),
        };
        let Some(b) = self.tx.bank.as_mut().filter(|_| src < ranks) else {
            let e = bad(format!(
                "published in the name of rank {src}, not of the job"
            ));
            self.consume_bank();
            return Err(e);
        };
        let bytes = match inbox.head_payload(BANK_HEADER.saturating_add(len)) {
            Ok(all) => all.slice_or_empty(BANK_HEADER, len),
            Err(_) => {
                let e = bad(format!("a message of {len} bytes, past its slot"));
                self.consume_bank();
                return Err(e);
            }
        };
        let route = if flags & BANK_REPLY == 0 {
            b.received[src] += 1;
            Route::new(b.received[src])
        } else {
            // A reply answers our oldest requests to `src`: as many as its flags say, all of
            // them ours and unanswered.
            let n = answers(flags) as u64;
            if n > b.outstanding[src] {
                let e = bad(format!(
                    "a reply answers {n} requests, {} outstanding",
                    b.outstanding[src]
                ));
                self.consume_bank();
                return Err(e);
            }
            b.outstanding[src] -= n;
            Route::NONE
        };
        self.liveness.progress();
        let delivery = Delivery {
            src: src as Rank,
            bytes: Received::Shared(bytes),
            payload_placed: flags & PLACED != 0,
            route,
        };
        let segment = self
            .seg
            .byte_area()
            .slice_or_empty(self.am_base, self.tx.layout.segment);
        let r = f(delivery, segment, &mut self.tx);
        self.consume_bank();
        Ok(Some(r))
    }

    /// Moves the bank's head past its ticket and tells the senders (a store to our own word,
    /// which they read only when the bank looks full to them).
    fn consume_bank(&mut self) {
        if let Some(inbox) = self.bank.as_mut() {
            inbox.advance();
            inbox.consumed(inbox.head());
        }
    }

    /// The bank's head is not published: a slot its claimer gave up is consumed; a job
    /// abort or a stalled head is looked into now and then (the liveness tick).
    fn bank_idle(&mut self) -> Result<(), TransportError> {
        if self.bank_head_skipped() {
            self.consume_bank();
            return Ok(());
        }
        if self.seg.load_word(ABORT).unwrap_or(0) != 0 {
            return Err(TransportError::JobAborted);
        }
        if self.liveness.idle_poll() {
            self.liveness_tick()?;
        }
        Ok(())
    }

    /// Before a sleep with a bank: takes the message-exist flag (senders ring it again from
    /// then on) and looks at the head after the take, so a message published before it is
    /// found now and one published after it rings; whether there is still nothing to do.
    fn bank_is_empty(&mut self) -> Result<bool, TransportError> {
        self.seg.doorbell(MEF).map_err(sci_err)?.take_tags();
        if self.faults.is_empty() && self.bank_head_is_idle() {
            self.liveness_tick()?;
        }
        Ok(self.faults.is_empty() && self.bank_head_is_idle())
    }

    /// Whether the bank's head holds nothing to take now: empty, or claimed and not yet
    /// published.
    fn bank_head_is_idle(&self) -> bool {
        self.bank
            .as_ref()
            .is_none_or(|i| i.head_published().is_none())
            && !self.bank_head_skipped()
    }

    /// Whether the bank's head is a slot its claimer (or the owner) gave up.
    fn bank_head_skipped(&self) -> bool {
        self.bank
            .as_ref()
            .is_some_and(|i| matches!(i.look(i.head()), Ok(Seen::Skipped(_))))
    }

    /// The owner's take-over at the bank's head (from the liveness tick, as extoll's at its
    /// mailbox): a slot claimed by a rank we lost, or in the name of one whose record does
    /// not vouch for it, or with a status no lap could have written, is skipped; a run of
    /// holes below a later claim (a corrupt tail) is skipped too. A claim by a live rank that
    /// vouches for it is left: it is being written.
    fn unblock_bank(&mut self) {
        let l = self.tx.layout;
        let Some(ring) = self.bank.as_ref().map(|i| *i.ring()) else {
            return;
        };
        // The owner marks ticket `t` skipped with a compare-and-swap, so a status that
        // changed meanwhile (a publication) is kept; whether it is skipped now.
        let skip = |seg: &Segment, t: u64| {
            let _ = ring.repair(seg, t);
            matches!(ring.look(seg, t), Ok(Seen::Skipped(_)))
        };
        for _ in 0..=l.bank {
            let Some(t) = self.bank.as_ref().map(Inbox::head) else {
                return;
            };
            match ring.look(&self.seg, t) {
                Ok(Seen::Claimed(who)) => {
                    let r = who as usize;
                    let lost = self.tx.dests.get(r).is_some_and(|d| d.lost);
                    let vouched =
                        r < l.ranks && ring.claim_is_genuine(&self.seg, t, l.bank_record(r));
                    if vouched && !lost {
                        return;
                    }
                    if !skip(&self.seg, t) {
                        // Published meanwhile: the poll path takes it.
                        return;
                    }
                    if !lost {
                        self.faults.push_back(TransportError::PeerMisbehaved {
                            peer: None,
                            what: format!(
                                "sci: bank ticket {t} claimed in the name of rank {who}, who does not vouch for it"
                            ),
                        });
                    }
                    self.consume_bank();
                }
                Ok(Seen::Empty) => match ring.fill_holes(&self.seg, t) {
                    Ok(n) if n > 0 => {
                        self.faults.push_back(TransportError::PeerMisbehaved {
                            peer: None,
                            what: format!("sci: {n} holes from bank ticket {t} (a corrupt tail)"),
                        });
                    }
                    _ => return,
                },
                Ok(Seen::Skipped(_)) => self.consume_bank(),
                Ok(Seen::Published(_)) => return,
                Err(_) => {
                    // A status no lap could have written: skipped, and reported.
                    if !skip(&self.seg, t) {
                        return;
                    }
                    self.faults.push_back(TransportError::PeerMisbehaved {
                        peer: None,
                        what: format!("sci: bank ticket {t} held a corrupt status"),
                    });
                    self.consume_bank();
                }
            }
        }
    }
}

/// Calls `f` with every ringer word whose tag `tags` carries (word `w` has tag `w % TAGS`;
/// none for an untagged ring), stopping at its first error.
#[inline]
fn for_each_ringer_word<E>(
    layout: &Layout,
    tags: u32,
    mut f: impl FnMut(usize) -> Result<(), E>,
) -> Result<(), E> {
    let words = layout.ringer_words();
    let mut classes = am_shm::doorbell::ringers(tags);
    while classes != 0 {
        let mut w = classes.trailing_zeros() as usize;
        classes &= classes - 1;
        while w < words {
            f(w)?;
            w += am_shm::doorbell::TAGS;
        }
    }
    Ok(())
}

/// The senders whose bits are set in ringer word `w`, which holds `bits` (a peer can write
/// any bits: those of no rank are left out).
fn ringers_in(w: usize, mut bits: u64, ranks: usize) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        while bits != 0 {
            let c = w * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if c < ranks {
                return Some(c);
            }
        }
        None
    })
}

impl Transport for Sci {
    fn name(&self) -> &'static str {
        "sci"
    }

    fn rank(&self) -> Rank {
        self.tx.rank as Rank
    }

    fn size(&self) -> u32 {
        self.tx.layout.ranks as u32
    }

    fn limits(&self) -> Limits {
        let head = am_core::wire::BASE_HEADER_LEN + 4 * am_core::wire::MAX_ARGS;
        let c = &self.tx.config;
        if self.bank.is_some() {
            // A bank slot: its status word and the bank header besides the message. Credits
            // reserve no slot: a full bank is back-pressure.
            return Limits {
                max_args: am_core::wire::MAX_ARGS,
                max_medium: c.slot_size - am_shm::mailbox::STATUS_LEN - BANK_HEADER - head,
                max_long: c.max_long,
                max_credits: 255,
            };
        }
        Limits {
            max_args: am_core::wire::MAX_ARGS,
            max_medium: c.slot_size - am_shm::stamp::SLOT_HEADER - head,
            max_long: c.max_long,
            max_credits: c.slots as u32,
        }
    }

    fn segment(&self) -> SharedBytes<'_> {
        self.am_segment()
    }

    /// A remote write into the target's imported segment (PIO stores, as an AM Long's
    /// payload goes): in the target's memory when this returns, with no message and no help
    /// from the target.
    fn put(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<(), SendError> {
        am_core::rma::put_into(dest, self.peer_segment(dest)?, offset, data)
    }

    /// A remote read of the target's imported segment. The AM protocol here keeps to remote
    /// writes and local reads, because an SCI read stalls the CPU for a round trip per
    /// transaction, where a write is posted and the CPU goes on; a get is the exception,
    /// since its only write-based alternative is to ask the target's progress to write the
    /// bytes back (AM Mediums, one round trip each), which a one-sided get must not need. One
    /// read stream per get, the cost a real SCI card would pay once per transaction.
    fn get(&mut self, src: Rank, offset: usize, dst: &mut [u8]) -> Result<(), SendError> {
        am_core::rma::get_from(src, self.peer_segment(src)?, offset, dst)
    }

    /// SCI's lock transactions (IEEE 1596 fetch-and-add, compare-and-swap, swap), which the
    /// responder's memory performs: one atomic instruction on the target's mapped word, no
    /// message and no help from the target.
    fn atomic(
        &mut self,
        dest: Rank,
        offset: usize,
        atomic: am_core::atomic::Atomic,
    ) -> Result<u64, SendError> {
        atomic.apply_to(dest, self.peer_segment(dest)?, offset)
    }

    fn atomics(&mut self, batch: &[am_core::atomic::Posted]) -> am_core::atomic::Batch {
        let applied = am_core::atomic::apply_batch(batch, |d| self.peer_segment(d));
        am_core::atomic::Batch::all(batch.len(), applied)
    }

    #[inline]
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        if self.bank.is_some() {
            return self.poll_bank(f);
        }
        if !self.tx.dma.queue.is_empty() {
            self.tx.progress_dma(&self.seg)?;
        }
        if let Some(e) = self.faults.pop_front() {
            return Err(e);
        }
        let Some(Next {
            ready: Ready { sender: src, slot },
            at_hint,
        }) = self.next_message()?
        else {
            return Ok(None);
        };
        self.liveness.progress();
        self.stale_polls = 0;
        let p = self.tx.config.slots;
        self.hint = Hint {
            sender: src,
            reply: slot >= p,
        };
        let corrupt = |e: am_shm::ShmError| TransportError::PeerMisbehaved {
            peer: Some(src as Rank),
            what: format!("sci: a bad slot {slot}: {e}"),
        };
        // The header is copied out (one word, read once) and checked; the body is lent as a
        // view of the slot, which its sender rewrites only after our reply frees it (and a
        // peer that does not follow that protocol can only make the handler read garbage
        // bytes, by copies).
        let at = src * 2 * p + slot;
        let am_shm::stamp::SlotHeader { len, flags } = self.inbox.header(at).map_err(corrupt)?;
        if at_hint {
            if let Some(e) = self.tx.recv.get_mut(src) {
                e.advance(slot, p, flags);
            }
        }
        let bytes = self.inbox.body(at, len as usize).map_err(corrupt)?;
        let mut answered = 0u64;
        // A request's reply goes to the reply slot paired with its slot: that is its route
        // (slot + 1, so that no request has `Route::NONE`).
        let route = if slot < p {
            let fresh = self.tx.dests.get_mut(src).is_some_and(|to| {
                let was = to.awaiting_reply & 1 << slot != 0;
                if to.awaiting_reply == 0 {
                    // The oldest we have to answer (a lone request restarts at slot 0).
                    to.answer_next = slot;
                }
                to.awaiting_reply |= 1 << slot;
                !was
            });
            if !fresh {
                return Err(TransportError::PeerMisbehaved {
                    peer: Some(src as Rank),
                    what: format!("sci: a request in slot {slot}, whose last is not answered"),
                });
            }
            Route::new(slot as u64 + 1)
        } else {
            // A reply answers its request and, if it is a coalesced implicit reply, the ones
            // after it up to the count in its flags: all must be ours and unanswered.
            let n = answers(flags);
            let mask = if n == 1 {
                1 << (slot - p)
            } else {
                cyclic_mask(slot - p, n.min(p), p)
            };
            if n > p
                || !self
                    .tx
                    .dests
                    .get(src)
                    .is_some_and(|to| to.mls.all_busy(mask))
            {
                return Err(TransportError::PeerMisbehaved {
                    peer: Some(src as Rank),
                    what: format!(
                        "sci: a reply in slot {slot} answers {n} requests, not all outstanding"
                    ),
                });
            }
            answered = mask;
            Route::NONE
        };
        let segment = self
            .seg
            .byte_area()
            .slice_or_empty(self.am_base, self.tx.layout.segment);
        let delivery = Delivery {
            src: src as Rank,
            bytes: Received::Shared(bytes),
            payload_placed: flags & PLACED != 0,
            route,
        };
        self.tx.deferring = true;
        let r = f(delivery, segment, &mut self.tx);
        self.tx.deferring = false;
        if slot >= p {
            // The reply frees the slots of the requests it answers (message location status).
            let streaming = self.tx.dests.get_mut(src).is_some_and(|to| {
                to.mls.free(answered);
                to.mls.0 != 0 || answered.count_ones() > 1
            });
            // Their lines, which `src` has read, are ours to write next: while requests
            // stream to `src`, take them now, so that the fence after a later publication
            // waits for no line. Not for a lone round trip, where that transfer would share
            // the path with the next request's.
            if let Some(peer) = self
                .tx
                .dests
                .get(src)
                .map(|to| &to.out)
                .filter(|_| streaming)
            {
                let mut bits = answered;
                while bits != 0 {
                    let k = bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    peer.prefetch_for_write(k);
                }
            }
        }
        while let Some((d, s)) = self.tx.deferred.pop() {
            self.tx.publish(Some(&self.seg), d, s)?;
        }
        Ok(Some(r))
    }

    /// The credits this rank's receive memory was laid out for ([`SciConfig::credits`]).
    fn default_credits(&self) -> am_core::Credits {
        self.tx.config.credits
    }

    /// Puts, gets and atomics on the peers' imported segments. A Long's payload sent by PIO
    /// stores is in the target's memory when `try_send` returns; one sent by DMA lands later.
    /// A reply may answer several requests of its peer: it lands in the reply slot paired
    /// with the oldest, and its slot flags say how many it answers, so the requester frees
    /// all their slots (message location status) and looks for the next reply after them.
    /// With a bank, every Long goes by PIO, and a reply answers the oldest unanswered
    /// requests, its flags saying how many.
    fn capabilities(&self) -> Capabilities {
        let mut caps = Capabilities::default();
        caps.put = true;
        caps.get = true;
        caps.atomics = true;
        // With a bank, every Long's payload goes by PIO (a claim is never held open for the
        // DMA engine).
        caps.long_placed_below = if self.bank.is_some() {
            usize::MAX
        } else {
            self.tx.config.dma_threshold
        };
        caps.acks_coalesce = true;
        caps
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        if !self.nothing_to_do()? {
            return Ok(());
        }
        let bell = self.seg.doorbell(MEF).map_err(sci_err)?;
        bell.sleep(timeout.min(LIVENESS_AFTER));
        Ok(())
    }

    fn wake_fd(&mut self) -> Result<Option<BorrowedFd<'_>>, TransportError> {
        self.wake.fd().map(Some)
    }

    /// As `wait` up to its sleep, then the message-exist flag's `ARMED` bit: the first ring
    /// after it wakes the socket (the DMA engine's completions ring it too).
    fn arm(&mut self) -> Result<Armed, TransportError> {
        self.wake.prepare()?;
        if !self.nothing_to_do()? {
            return Ok(Armed::Ready);
        }
        let bell = self.seg.doorbell(MEF).map_err(sci_err)?;
        Ok(self.wake.arm(&bell, LIVENESS_AFTER))
    }

    fn disarm(&mut self) {
        self.wake.disarm(self.seg.doorbell(MEF).ok());
    }
}

impl Drop for Sci {
    fn drop(&mut self) {
        am_nic::control::depart(
            &self.tx.peers,
            self.tx.rank,
            self.tx.layout.departed_words(),
        );
    }
}

impl std::fmt::Debug for Sci {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sci")
            .field("rank", &self.tx.rank)
            .field("layout", &self.tx.layout)
            .field("config", &self.tx.config)
            .finish()
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod hostile;

#[cfg(test)]
mod bank;

#[cfg(all(test, not(miri)))]
mod touched;
