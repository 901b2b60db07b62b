//! The reply path: the one-shot [`Token`] a request handler gets, the reply sink behind it
//! (at most one reply, to the requester only, checked as a request is), the replies the
//! device refused (sent again in order), and the implicit replies owed where the transport
//! lets one empty reply answer several requests.

use std::collections::VecDeque;
use std::fmt;
use std::ops::Range;

use crate::error::AmError;
use crate::protocol::SystemMsg;
use crate::transport::{Limits, Outgoing, Payload, Route, SendError, Tx};
use crate::types::{AmKind, Category, HandlerId, Rank};
use crate::wire::{Header, MAX_ARGS, MAX_HEAD_LEN};

/// The right to send one reply to the requester: GASNet's token.
///
/// Each `reply_*` method consumes the token: one reply compiles,
///
/// ```
/// # use amnet::{Token, HandlerId};
/// fn handler(token: Token<'_>) {
///     token.reply_short(HandlerId(1), &[]).unwrap();
/// }
///
/// fn main() {
/// }
/// ```
///
/// and a second does not (use of a moved value):
///
/// ```compile_fail,E0382
/// # use amnet::{Token, HandlerId};
/// fn handler(token: Token<'_>) {
///     token.reply_short(HandlerId(1), &[]).unwrap();
///     token.reply_short(HandlerId(1), &[]).unwrap();
/// }
/// ```
///
/// A request handler that drops its token without replying is fine: the core sends an implicit
/// empty reply so the requester gets its credit back.
pub struct Token<'a> {
    pub(crate) src: Rank,
    pub(crate) sink: &'a mut ReplySink<'a>,
}

impl Token<'_> {
    /// The requester: the only rank this token can reply to.
    #[inline]
    pub fn src(&self) -> Rank {
        self.src
    }

    /// Replies with an AM Short to the requester's reply handler `handler`.
    #[inline]
    pub fn reply_short(self, handler: HandlerId, args: &[u32]) -> Result<(), AmError> {
        self.sink
            .reply(AmKind::Short, handler, args, Payload::EMPTY, None)
    }

    /// Replies with an AM Medium (payload up to `max_medium`): private bytes, or
    /// [`crate::Msg::payload_ref`] to echo the request's payload with a single copy.
    #[inline]
    pub fn reply_medium<'p>(
        self,
        handler: HandlerId,
        args: &[u32],
        payload: impl Into<Payload<'p>>,
    ) -> Result<(), AmError> {
        self.sink
            .reply(AmKind::Medium, handler, args, payload.into(), None)
    }

    /// Replies with an AM Long whose payload lands at `offset` in the requester's segment.
    #[inline]
    pub fn reply_long<'p>(
        self,
        handler: HandlerId,
        args: &[u32],
        payload: impl Into<Payload<'p>>,
        offset: usize,
    ) -> Result<(), AmError> {
        self.sink
            .reply(AmKind::Long, handler, args, payload.into(), Some(offset))
    }
}

impl fmt::Debug for Token<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Token").field("src", &self.src).finish()
    }
}

/// A reply the device refused; sent again by the next [`Endpoint::flush`], in order.
pub(crate) struct PendingReply {
    pub(crate) dest: Rank,
    /// The route of the request it answers.
    pub(crate) route: Route,
    pub(crate) head_len: usize,
    pub(crate) long_offset: Option<usize>,
    pub(crate) bytes: Vec<u8>,
}

/// Checks that `[offset, offset + len)` lies in a segment of `size` bytes.
pub(crate) fn segment_range(offset: u64, len: u64, size: usize) -> Option<Range<usize>> {
    let end = offset.checked_add(len)?;
    if end > size as u64 {
        return None;
    }
    Some(offset as usize..end as usize)
}

/// Implicit replies owed and not yet sent, where the transport lets one empty reply answer
/// several requests ([`crate::Capabilities::acks_coalesce`]): per peer, the requests whose
/// handlers sent no reply, the credits their replies grant, and the route of the latest.
#[derive(Debug)]
pub(crate) struct OwedAcks {
    pub(crate) per_peer: Vec<Owed>,
    /// Peers owed something.
    pub(crate) owed: u32,
}

/// What one peer is owed: one [`SystemMsg::Acks`] answers it, routed as its latest request
/// (a transport that pairs replies with requests answers the earlier ones with it).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Owed {
    pub(crate) count: u32,
    pub(crate) granted: u32,
    pub(crate) route: Route,
    /// A peer owed this many is answered at once (half the credits it holds toward this
    /// rank), so that it keeps requests in flight while this rank is busy; the rest go when
    /// a poll finds nothing more to do. Kept when what is owed is taken.
    pub(crate) batch: u32,
}

impl Owed {
    /// What is owed now, leaving nothing owed (and the batch as it is).
    #[inline(always)]
    fn take(&mut self) -> Owed {
        let owed = *self;
        self.count = 0;
        self.granted = 0;
        owed
    }
}

impl OwedAcks {
    /// Nothing owed to any of `size` peers, each answered in batches of `batch`.
    pub(crate) fn new(size: u32, batch: u32) -> OwedAcks {
        let none = Owed {
            batch: batch.max(1),
            ..Owed::default()
        };
        OwedAcks {
            per_peer: vec![none; size as usize],
            owed: 0,
        }
    }

    /// Owes `src` the reply to one more request, which came with `route`, granting `grant`:
    /// what to send now, if its batch is full.
    #[inline(always)]
    pub(crate) fn owe(&mut self, src: Rank, grant: u8, route: Route) -> Option<Owed> {
        let e = &mut self.per_peer[src as usize];
        if e.count == 0 {
            self.owed += 1;
        }
        e.count += 1;
        e.granted += u32::from(grant);
        e.route = route;
        if e.count < e.batch {
            return None;
        }
        self.owed -= 1;
        Some(e.take())
    }

    /// `peer` holds `lent` credits toward this rank (a lending policy's count): its implicit
    /// replies go in batches of half that, as a static peer's go in batches of half its
    /// credits. Batches of half the initial credits would answer a peer that borrowed many
    /// one request at a time.
    pub(crate) fn lent(&mut self, peer: Rank, lent: u32) {
        if let Some(e) = self.per_peer.get_mut(peer as usize) {
            e.batch = (lent / 2).max(1);
        }
    }

    /// Takes what is owed to `peer`, if anything (it is answered now).
    #[inline]
    pub(crate) fn take(&mut self, peer: Rank) -> Option<Owed> {
        let e = self.per_peer.get_mut(peer as usize)?;
        if e.count == 0 {
            return None;
        }
        self.owed -= 1;
        Some(e.take())
    }

    /// Forgets what is owed to `peer` (it is gone).
    pub(crate) fn forget(&mut self, peer: Rank) {
        let _ = self.take(peer);
    }
}

/// The header of a reply (or of an implicit one) to a request.
#[inline(always)]
pub(crate) fn reply_header(
    system: bool,
    kind: AmKind,
    handler: u8,
    args: &[u32],
    credit: u8,
    payload_len: usize,
    long_offset: Option<usize>,
) -> Header {
    Header {
        category: Category::Reply,
        kind,
        system,
        handler,
        nargs: args.len() as u8,
        credit,
        payload_len: payload_len as u32,
        long_offset: long_offset.unwrap_or(0) as u64,
    }
}

/// Encodes the [`SystemMsg::Acks`] that answers what `owed` counts into `head`; returns its
/// length. Its header grants nothing: the grants travel in its arguments.
pub(crate) fn encode_acks(owed: &Owed, head: &mut [u8; MAX_HEAD_LEN]) -> usize {
    let w = SystemMsg::Acks {
        count: owed.count,
        granted: owed.granted,
    }
    .encode();
    debug_assert_eq!(w.category, Category::Reply);
    reply_header(true, w.kind, w.opcode, w.args(), 0, 0, None).encode(w.args(), head)
}

/// The endpoint's side of replies: those the device refused (sent again in order), the
/// implicit replies owed where the transport coalesces them, and what the replies of the
/// handler running now did (kept here, not in its [`ReplySink`], which then needs no drop).
pub(crate) struct Replies {
    pub(crate) pending: VecDeque<PendingReply>,
    pub(crate) acks: Option<OwedAcks>,
    /// The running request handler sent its reply (false between handlers).
    pub(crate) replied: bool,
    /// The first error of the running handler's replies.
    pub(crate) error: Option<AmError>,
    /// What a reply is checked against before it leaves: the registration of each handler
    /// (a copy of the table's), the transport's limits, and the bytes of every rank's
    /// segment (equal on all ranks, checked at start-up), which bound a Long reply's range.
    pub(crate) meta: [Option<(Category, AmKind)>; 256],
    pub(crate) limits: Limits,
    pub(crate) seg_len: usize,
    /// Sends of replies and acknowledgements the device refused for lack of room (each
    /// queued or kept, and sent again later).
    pub(crate) refused: u64,
}

/// The reply path lent to a request handler: at most one reply, to the requester only.
pub(crate) struct ReplySink<'a> {
    pub(crate) src: Rank,
    /// The route of the request being answered: every reply carries it back.
    pub(crate) route: Route,
    pub(crate) grant: u8,
    /// Whether this request's own implicit reply may be owed (a user request) rather than
    /// sent at once (a system request, which the start-up and the barrier wait on).
    pub(crate) may_owe: bool,
    pub(crate) tx: &'a mut dyn Tx,
    /// What earlier requests of the requester are owed leaves before any reply to it, so
    /// replies leave in request order; and what replies are checked against.
    pub(crate) out: &'a mut Replies,
}

impl<'a> ReplySink<'a> {
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn new(
        src: Rank,
        route: Route,
        grant: u8,
        may_owe: bool,
        tx: &'a mut dyn Tx,
        out: &'a mut Replies,
    ) -> Self {
        ReplySink {
            src,
            route,
            grant,
            may_owe,
            tx,
            out,
        }
    }

    /// Sends this request's reply, after what earlier requests of the requester are owed.
    #[inline]
    pub(crate) fn send(
        &mut self,
        system: bool,
        kind: AmKind,
        handler: u8,
        args: &[u32],
        payload: Payload<'_>,
        long_offset: Option<usize>,
    ) -> Result<(), AmError> {
        if let Some(owed) = self.out.acks.as_mut().and_then(|a| a.take(self.src)) {
            self.send_acks(&owed);
        }
        self.out.replied = true;
        let header = reply_header(
            system,
            kind,
            handler,
            args,
            self.grant,
            payload.len(),
            long_offset,
        );
        let mut head = [0u8; MAX_HEAD_LEN];
        let n = header.encode(args, &mut head);
        self.send_head(&head[..n], payload, long_offset, self.route)
    }

    /// Answers the requests `owed` counts with one [`SystemMsg::Acks`], routed as the latest.
    #[cold]
    #[inline(never)]
    pub(crate) fn send_acks(&mut self, owed: &Owed) {
        let mut head = [0u8; MAX_HEAD_LEN];
        let n = encode_acks(owed, &mut head);
        let _ = self.send_head(&head[..n], Payload::EMPTY, None, owed.route);
    }

    #[inline(always)]
    fn send_head(
        &mut self,
        head: &[u8],
        payload: Payload<'_>,
        long_offset: Option<usize>,
        route: Route,
    ) -> Result<(), AmError> {
        // Replies to one peer leave in order: once one waits, the later ones queue behind it.
        if self.out.pending.is_empty() {
            let out = Outgoing {
                head,
                payload,
                long_offset,
                reply_to: Some(route),
            };
            match self.tx.try_send(self.src, &out) {
                Ok(()) => return Ok(()),
                Err(SendError::Busy) => self.out.refused += 1,
                Err(e) => return Err(self.failed(e)),
            }
        }
        self.queue(head, payload, long_offset, route);
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn failed(&mut self, e: SendError) -> AmError {
        let departed = matches!(e, SendError::PeerDeparted(_));
        let e = AmError::from(e);
        // A requester that left reads no reply: the handler hears it, the poll does not
        // (the departure is the transport's poll to report, after what the requester sent
        // before it left).
        if !departed {
            self.out.error.get_or_insert_with(|| e.clone());
        }
        e
    }

    /// The device refused the reply (or an earlier one waits): it waits in order.
    #[cold]
    #[inline(never)]
    fn queue(
        &mut self,
        head: &[u8],
        payload: Payload<'_>,
        long_offset: Option<usize>,
        route: Route,
    ) {
        let mut bytes = Vec::with_capacity(head.len() + payload.len());
        bytes.extend_from_slice(head);
        payload.append_to(&mut bytes);
        self.out.pending.push_back(PendingReply {
            dest: self.src,
            route,
            head_len: head.len(),
            long_offset,
            bytes,
        });
    }

    /// After the handler: the implicit empty reply if it sent none (it returns the request's
    /// credit), and the first send error.
    #[inline]
    pub(crate) fn finish(&mut self) -> Result<(), AmError> {
        if !self.out.replied {
            match self.out.acks.as_mut() {
                Some(acks) if self.may_owe => {
                    if let Some(owed) = acks.owe(self.src, self.grant, self.route) {
                        self.send_acks(&owed);
                    }
                }
                _ => self.system(SystemMsg::Ack, Payload::EMPTY),
            }
        }
        // Ready for the next handler.
        self.out.replied = false;
        match self.out.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends a system reply. Errors are recorded in `out.error` and reported by the poll
    /// that ran the handler.
    pub(crate) fn system(&mut self, msg: SystemMsg, payload: Payload<'_>) {
        let w = msg.encode();
        debug_assert_eq!(w.category, Category::Reply);
        let _ = self.send(true, w.kind, w.opcode, w.args(), payload, None);
    }
}

impl ReplySink<'_> {
    /// A request handler's reply ([`Token`]): checked here as a request is, then sent.
    #[inline]
    pub(crate) fn reply(
        &mut self,
        kind: AmKind,
        handler: HandlerId,
        args: &[u32],
        payload: Payload<'_>,
        long_offset: Option<usize>,
    ) -> Result<(), AmError> {
        check_message(&self.out.limits, kind, args, payload.len())?;
        if self.out.meta[handler.0 as usize] != Some((Category::Reply, kind)) {
            return Err(AmError::NotRegistered {
                handler,
                category: Category::Reply,
                kind,
            });
        }
        if let Some(offset) = long_offset {
            // As `request_long` checks: the requester's segment is as long as ours, and it
            // would take a reply outside it for misbehaviour.
            let len = payload.len() as u64;
            if segment_range(offset as u64, len, self.out.seg_len).is_none() {
                return Err(AmError::SegmentOutOfBounds {
                    offset: offset as u64,
                    len,
                    size: self.out.seg_len,
                });
            }
        }
        self.send(false, kind, handler.0, args, payload, long_offset)
    }
}

/// A request whose handler cannot run (unknown, or its Long could not be placed): still
/// answered, so the requester gets its credit back, and `e` reported.
#[cold]
#[inline(never)]
pub(crate) fn refuse_request(
    replies: &mut Replies,
    tx: &mut dyn Tx,
    src: Rank,
    route: Route,
    grant: u8,
    e: AmError,
) -> Result<(), AmError> {
    ReplySink::new(src, route, grant, true, tx, replies).finish()?;
    Err(e)
}

/// Checks arguments and payload size against the transport's limits.
pub(crate) fn check_message(
    limits: &Limits,
    kind: AmKind,
    args: &[u32],
    payload_len: usize,
) -> Result<(), AmError> {
    if args.len() > MAX_ARGS.min(limits.max_args) {
        return Err(AmError::TooManyArgs(args.len()));
    }
    let max = match kind {
        AmKind::Short => 0,
        AmKind::Medium => limits.max_medium,
        AmKind::Long => limits.max_long,
    };
    if payload_len > max {
        return Err(AmError::PayloadTooLarge {
            kind,
            len: payload_len,
            max,
        });
    }
    Ok(())
}
