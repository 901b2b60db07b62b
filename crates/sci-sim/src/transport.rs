//! [`Sci`]: the NIC of one rank, as an `am_core::Transport`.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

use am_core::{
    transport::{NicInfo, Rma, RmaDone},
    Armed, Delivery, Limits, Outgoing, Payload, Rank, Received, Route, SendError, Transport,
    TransportError, Tx,
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
    /// `layout.bank_room()` with a bank, computed once: looked at on every consume.
    bank_room_at: usize,
    /// The room waiter word to look at first (after the last one rung).
    room_next: usize,
    /// Where an event loop sleeps between `arm` and `disarm`.
    wake: Wake,
    /// Our bank, read in ticket order; `None` without one.
    bank: Option<Inbox>,
}

impl Transport for Sci {
    fn rank(&self) -> Rank {
        self.tx.rank as Rank
    }

    fn size(&self) -> u32 {
        self.tx.layout.ranks as u32
    }

    /// Puts, gets and atomics on the peers' imported segments. A Long's payload sent by PIO
    /// stores is in the target's memory when `try_send` returns; one sent by DMA lands later.
    /// A reply may answer several requests of its peer: it lands in the reply slot paired
    /// with the oldest, and its slot flags say how many it answers, so the requester frees
    /// all their slots (message location status) and looks for the next reply after them.
    /// With a bank, every Long goes by PIO, and a reply answers the oldest unanswered
    /// requests, its flags saying how many. The credits are those this rank's receive
    /// memory was laid out for ([`SciConfig::credits`]).
    #[inline]
    fn info(&self) -> NicInfo {
        let mut info = NicInfo::new("sci", self.limits());
        info.credits = self.tx.config.credits;
        let caps = &mut info.capabilities;
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
        // Every rank is a process of this host: created segments are memory files peers map.
        caps.map_segments = true;
        info
    }

    fn segment(&self) -> SharedBytes<'_> {
        self.am_segment()
    }

    /// Remote writes into the target's imported segment (PIO stores, as an AM Long's
    /// payload goes) and remote reads of it, in the target's memory when this returns, with
    /// no message and no help from the target; copies between a segment of this rank and
    /// the target's go from mapping to mapping. The AM protocol here keeps to remote writes
    /// and local reads, because an SCI read stalls the CPU for a round trip per transaction,
    /// where a write is posted and the CPU goes on; a get is the exception, since its only
    /// write-based alternative is to ask the target's progress to write the bytes back (AM
    /// Mediums, one round trip each), which a one-sided get must not need. Atomics are SCI's
    /// lock transactions (IEEE 1596 fetch-and-add, compare-and-swap, swap), which the
    /// responder's memory performs: one atomic instruction on the target's mapped word.
    #[inline(always)]
    fn rma(&mut self, request: Rma<'_>) -> Result<RmaDone, SendError> {
        am_core::rma::mapped(self, request)
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

impl Sci {
    /// Size limits: a message fills a slot of the mailbox, or of the bank.
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
}

impl am_core::rma::MappedPeers for Sci {
    #[inline]
    fn peer_segment(&self, rank: Rank) -> Result<SharedBytes<'_>, SendError> {
        Sci::peer_segment(self, rank)
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

mod bank;
mod liveness;
mod recv;
mod send;
mod setup;

use send::*;

#[cfg(test)]
mod tests;

#[cfg(test)]
mod hostile;

#[cfg(all(test, not(miri)))]
mod touched;
