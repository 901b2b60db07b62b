//! The protocol state of one rank, without I/O: decoding, dispatch to handlers, tokens, credits,
//! replies the device refused, and the state of barriers, put/get and start-up.
//!
//! [`crate::Node`] drives it with a transport; tests can drive it with any [`Tx`].

use std::collections::{HashMap, VecDeque};
use std::ops::Range;

use crate::credit::CreditPolicy;
use crate::error::{AmError, Misbehavior};
use std::cell::{Cell, OnceCell};

use crate::handler::{AmKind, Category, HandlerFn, HandlerId, Handlers, Msg, ReplyPath, Token};
use crate::protocol::{HelloVerdict, SystemMsg, HELLO_SIGNATURE_LEN};
use crate::transport::{
    Delivery, Limits, Outgoing, Payload, Received, Route, SendError, SharedBytes, TransportError,
    Tx,
};
use crate::wire::{self, Header, BASE_HEADER_LEN, MAX_ARGS, MAX_HEAD_LEN};
use crate::Rank;

/// Opcodes of core-internal (system) messages.
/// A reply the device refused; sent again by the next poll, in order.
pub(crate) struct PendingReply {
    dest: Rank,
    /// The route of the request it answers.
    route: Route,
    head_len: usize,
    long_offset: Option<usize>,
    bytes: Vec<u8>,
}

/// A put or get in flight.
#[derive(Default)]
pub(crate) struct OpSlot {
    pub gen: u32,
    /// The rank the put or get targets: its replies are the only ones accepted.
    pub peer: Rank,
    pub live: bool,
    pub outstanding: u32,
    pub error: Option<AmError>,
    pub data: Vec<u8>,
}

/// Start-up handshake state.
#[derive(Default)]
pub(crate) struct Hello {
    /// Rank 0: how many HELLOs arrived.
    pub received: u32,
    /// Rank 0: the first mismatch seen.
    pub mismatch: Option<HelloVerdict>,
    /// Other ranks: rank 0's verdict.
    pub result: Option<HelloVerdict>,
}

/// Where an interrupted barrier stopped: its epoch, its round, and whether that round's
/// message went out.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BarrierAt {
    pub epoch: u64,
    pub round: u8,
    pub sent: bool,
}

pub(crate) struct Endpoint {
    pub rank: Rank,
    pub size: u32,
    pub limits: Limits,
    pub seg_len: usize,
    pub handlers: Handlers,
    pub credits: Box<dyn CreditPolicy>,
    pub pending: VecDeque<PendingReply>,
    pub ops: Vec<OpSlot>,
    pub free_ops: Vec<u32>,
    pub barrier_epoch: u64,
    /// A barrier that returned an error, to resume.
    pub barrier_resume: Option<BarrierAt>,
    pub barrier_arrivals: HashMap<(u64, u8), u32>,
    pub hello: Hello,
    pub hello_digest: u64,
    /// Our handler table's signature ([`Handlers::signature`]), which rank 0 compares.
    pub hello_signature: [u16; 256],
    pub exit_requested: Option<i32>,
    /// Peers the transport reported lost: requests to them fail at once, their operations
    /// fail, and nobody waits for their replies any more.
    pub lost: Vec<bool>,
    /// Peers that left the job cleanly (their transport said so).
    pub departed: Vec<bool>,
    /// Private memory a handler's `Msg::payload` copies a shared payload into (reused).
    pub scratch: Vec<u8>,
}

fn misbehaved(peer: Rank, what: Misbehavior) -> AmError {
    AmError::PeerMisbehaved { peer, what }
}

#[cold]
fn unknown_handler(src: Rank, hdr: &Header) -> AmError {
    misbehaved(
        src,
        Misbehavior::UnknownHandler {
            handler: HandlerId(hdr.handler),
            category: hdr.category,
            kind: hdr.kind,
        },
    )
}

fn send_err(e: SendError) -> AmError {
    AmError::from(TransportError::from(e))
}

/// Checks that `[offset, offset + len)` lies in a segment of `size` bytes.
pub(crate) fn segment_range(offset: u64, len: u64, size: usize) -> Option<Range<usize>> {
    let end = offset.checked_add(len)?;
    if end > size as u64 {
        return None;
    }
    Some(offset as usize..end as usize)
}

/// Copies an accepted Long payload carried inline into its place in the segment.
#[inline(always)]
fn place(
    segment: SharedBytes<'_>,
    long: &Option<Range<usize>>,
    inline: Option<Payload<'_>>,
) -> Result<(), AmError> {
    if let (Some(r), Some(data)) = (long, inline) {
        match data {
            Payload::Private(b) => segment.write(r.start, b),
            Payload::Shared(s) => segment.copy_from(r.start, s),
        }
        .map_err(shm_err)?;
    }
    Ok(())
}

/// A failed copy of bytes the checks above already bounded: a transport's own fault.
#[cold]
fn shm_err(e: am_shm::ShmError) -> AmError {
    AmError::Transport(TransportError::Io(e.to_string()))
}

/// The reply path lent to a request handler: at most one reply, to the requester only.
struct ReplySink<'a> {
    src: Rank,
    /// The route of the request being answered: every reply carries it back.
    route: Route,
    grant: u8,
    tx: &'a mut dyn Tx,
    pending: &'a mut VecDeque<PendingReply>,
    meta: &'a [Option<(Category, AmKind)>; 256],
    limits: &'a Limits,
    /// Bytes of every rank's segment (equal on all ranks, checked at start-up): a Long
    /// reply's range is checked here, before it leaves.
    seg_len: usize,
    replied: bool,
    error: Option<AmError>,
}

impl<'a> ReplySink<'a> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        src: Rank,
        route: Route,
        grant: u8,
        tx: &'a mut dyn Tx,
        pending: &'a mut VecDeque<PendingReply>,
        meta: &'a [Option<(Category, AmKind)>; 256],
        limits: &'a Limits,
        seg_len: usize,
    ) -> Self {
        ReplySink {
            src,
            route,
            grant,
            tx,
            pending,
            meta,
            limits,
            seg_len,
            replied: false,
            error: None,
        }
    }

    fn send(
        &mut self,
        system: bool,
        kind: AmKind,
        handler: u8,
        args: &[u32],
        payload: Payload<'_>,
        long_offset: Option<usize>,
    ) -> Result<(), AmError> {
        let header = Header {
            category: Category::Reply,
            kind,
            system,
            handler,
            nargs: args.len() as u8,
            credit: self.grant,
            payload_len: payload.len() as u32,
            long_offset: long_offset.unwrap_or(0) as u64,
        };
        let mut head = [0u8; MAX_HEAD_LEN];
        let n = header.encode(args, &mut head);
        self.replied = true;
        // Replies to one peer leave in order: once one waits, the later ones queue behind it.
        if self.pending.is_empty() {
            let out = Outgoing {
                head: &head[..n],
                payload,
                long_offset,
                reply_to: Some(self.route),
            };
            match self.tx.try_send(self.src, &out) {
                Ok(()) => return Ok(()),
                Err(SendError::Busy) => {}
                Err(e) => {
                    let e = send_err(e);
                    self.error = Some(e.clone());
                    return Err(e);
                }
            }
        }
        let mut bytes = Vec::with_capacity(n + payload.len());
        bytes.extend_from_slice(&head[..n]);
        payload.append_to(&mut bytes);
        self.pending.push_back(PendingReply {
            dest: self.src,
            route: self.route,
            head_len: n,
            long_offset,
            bytes,
        });
        Ok(())
    }

    /// After the handler: the implicit empty reply if it sent none (it returns the request's
    /// credit), and the first send error.
    #[inline]
    fn finish(mut self) -> Result<(), AmError> {
        if !self.replied {
            self.system(SystemMsg::Ack, Payload::EMPTY);
        }
        match self.error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Sends a system reply. Errors are recorded in `self.error` and reported by the poll
    /// that ran the handler.
    fn system(&mut self, msg: SystemMsg, payload: Payload<'_>) {
        let w = msg.encode();
        debug_assert_eq!(w.category, Category::Reply);
        let _ = self.send(true, w.kind, w.opcode, w.args(), payload, None);
    }
}

impl ReplyPath for ReplySink<'_> {
    fn reply(
        &mut self,
        kind: AmKind,
        handler: HandlerId,
        args: &[u32],
        payload: Payload<'_>,
        long_offset: Option<usize>,
    ) -> Result<(), AmError> {
        check_message(self.limits, kind, args, payload.len())?;
        if self.meta[handler.0 as usize] != Some((Category::Reply, kind)) {
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
            if segment_range(offset as u64, len, self.seg_len).is_none() {
                return Err(AmError::SegmentOutOfBounds {
                    offset: offset as u64,
                    len,
                    size: self.seg_len,
                });
            }
        }
        self.send(false, kind, handler.0, args, payload, long_offset)
    }
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

impl Endpoint {
    /// Records that `peer` is gone: fails its operations in flight and drops the replies still
    /// queued for it. Returns false if it was already known.
    pub fn mark_lost(&mut self, peer: Rank) -> bool {
        let Some(flag) = self.lost.get_mut(peer as usize) else {
            return false;
        };
        if std::mem::replace(flag, true) {
            return false;
        }
        self.fail_ops_with(peer, AmError::PeerLost(peer));
        self.pending.retain(|p| p.dest != peer);
        true
    }

    /// Ends the puts and gets in flight with `peer` with `error` (nothing more comes).
    fn fail_ops_with(&mut self, peer: Rank, error: AmError) {
        for slot in self.ops.iter_mut().filter(|s| s.live && s.peer == peer) {
            if slot.outstanding > 0 {
                slot.outstanding = 0;
                slot.error.get_or_insert_with(|| error.clone());
            }
        }
    }

    /// True if `peer` was reported lost.
    #[inline]
    pub fn is_lost(&self, peer: Rank) -> bool {
        self.lost.get(peer as usize).copied().unwrap_or(false)
    }

    /// Records that `peer` left the job cleanly: its puts and gets still waiting for replies
    /// fail (nothing more will come from it). Returns false if it was already known.
    pub fn mark_departed(&mut self, peer: Rank) -> bool {
        let Some(flag) = self.departed.get_mut(peer as usize) else {
            return false;
        };
        if std::mem::replace(flag, true) {
            return false;
        }
        self.fail_ops_with(peer, AmError::PeerDeparted(peer));
        true
    }

    /// True if `peer` left the job cleanly.
    #[inline]
    pub fn is_departed(&self, peer: Rank) -> bool {
        self.departed.get(peer as usize).copied().unwrap_or(false)
    }

    /// Nothing this rank waits for: no queued replies and no requests in flight to live peers.
    pub fn is_quiet(&self) -> bool {
        self.pending.is_empty()
            && (0..self.size)
                .all(|p| self.is_lost(p) || self.is_departed(p) || self.credits.outstanding(p) == 0)
    }

    /// Sends the replies the device refused earlier, in order, until it refuses again.
    pub fn flush_pending(&mut self, tx: &mut dyn Tx) -> Result<(), AmError> {
        while let Some(p) = self.pending.front() {
            let out = Outgoing {
                head: &p.bytes[..p.head_len],
                payload: Payload::Private(&p.bytes[p.head_len..]),
                long_offset: p.long_offset,
                reply_to: Some(p.route),
            };
            match tx.try_send(p.dest, &out) {
                Ok(()) => {
                    self.pending.pop_front();
                }
                Err(SendError::Busy) => return Ok(()),
                Err(SendError::PeerLost(peer)) => {
                    self.mark_lost(peer);
                    return Err(AmError::PeerLost(peer));
                }
                Err(SendError::PeerDeparted(peer)) => {
                    // Nobody is left to read the reply.
                    self.pending.pop_front();
                    self.mark_departed(peer);
                    return Err(AmError::PeerDeparted(peer));
                }
                Err(e) => {
                    self.pending.pop_front();
                    return Err(send_err(e));
                }
            }
        }
        Ok(())
    }

    /// Handles one delivered message: runs its handler, sends the reply or the implicit one.
    #[inline]
    pub fn dispatch(
        &mut self,
        d: Delivery<'_>,
        segment: SharedBytes<'_>,
        tx: &mut dyn Tx,
    ) -> Result<(), AmError> {
        let src = d.src;
        let route = d.route;
        if src >= self.size {
            return Err(AmError::InvalidRank {
                rank: src,
                size: self.size,
            });
        }
        // The head is parsed from private memory: a copy of it when the transport lends
        // shared memory, so what was checked is what is used (no double fetch).
        let total = d.bytes.len();
        let mut copy = [0u8; MAX_HEAD_LEN];
        let head: &[u8] = match d.bytes {
            Received::Private(b) => b,
            Received::Shared(s) => {
                // The base header first (one word), then only as many bytes as it says the
                // head has; decode_prefix checks the copy either way.
                let n = total.min(BASE_HEADER_LEN);
                s.read(0, &mut copy[..n]).map_err(shm_err)?;
                let want = wire::head_len_hint(&copy[..n]).min(total);
                if want > n {
                    s.read(n, &mut copy[n..want]).map_err(shm_err)?;
                }
                &copy[..want.max(n)]
            }
        };
        let hdr = Header::decode_prefix(head, total, !d.payload_placed)
            .map_err(|e| misbehaved(src, Misbehavior::Malformed(e)))?;
        let mut argbuf = [0u32; MAX_ARGS];
        let args = hdr.read_args(head, &mut argbuf);
        let body = match d.bytes {
            Received::Private(b) => Payload::Private(b.get(hdr.head_len()..).unwrap_or(&[])),
            Received::Shared(s) => Payload::Shared(s.slice_from(hdr.head_len()).map_err(shm_err)?),
        };
        // Credits first, whatever becomes of the message: a reply returns what its request
        // took; a request learns what its reply (explicit or implicit) will grant.
        let grant = match hdr.category {
            Category::Reply => {
                if !self.credits.on_reply(src, hdr.credit) {
                    return Err(misbehaved(src, Misbehavior::ReplyWithoutRequest));
                }
                0
            }
            Category::Request => self.credits.reply_grant(src, hdr.credit),
        };
        // A Long payload carried inline is copied into the segment only once the message is
        // accepted, so a rejected message leaves the segment as it was.
        let (payload, long, inline_long) = match hdr.kind {
            AmKind::Short => (Payload::Private(&[]), None, None),
            AmKind::Medium => (body, None, None),
            AmKind::Long => {
                match segment_range(hdr.long_offset, hdr.payload_len as u64, segment.len()) {
                    Some(r) => (
                        Payload::Shared(segment.slice(r.start, r.len()).map_err(shm_err)?),
                        Some(r),
                        (!d.payload_placed).then_some(body),
                    ),
                    None => return self.out_of_segment(src, route, &hdr, args, grant, tx),
                }
            }
        };
        if hdr.system {
            return self.dispatch_system(
                src,
                route,
                &hdr,
                args,
                payload,
                segment,
                long,
                inline_long,
                grant,
                tx,
            );
        }
        let id = hdr.handler as usize;
        let long_offset = long.as_ref().map(|r| r.start);
        let Endpoint {
            handlers,
            pending,
            limits,
            scratch,
            seg_len,
            ..
        } = self;
        let msg = |scratch| Msg {
            src,
            handler: HandlerId(hdr.handler),
            args,
            payload,
            long: long_offset,
            segment,
            scratch: Cell::new(Some(scratch)),
            copied: OnceCell::new(),
        };
        match hdr.category {
            Category::Reply => match &mut handlers.fns[id] {
                Some(HandlerFn::Reply(f))
                    if handlers.meta[id] == Some((Category::Reply, hdr.kind)) =>
                {
                    place(segment, &long, inline_long)?;
                    f(msg(scratch));
                    Ok(())
                }
                _ => Err(unknown_handler(src, &hdr)),
            },
            Category::Request => {
                let Handlers { fns, meta, .. } = handlers;
                let mut sink =
                    ReplySink::new(src, route, grant, tx, pending, meta, limits, *seg_len);
                let result = match &mut fns[id] {
                    Some(HandlerFn::Request(f))
                        if sink.meta[id] == Some((Category::Request, hdr.kind)) =>
                    {
                        match place(segment, &long, inline_long) {
                            Ok(()) => {
                                f(
                                    msg(scratch),
                                    Token {
                                        src,
                                        path: &mut sink,
                                    },
                                );
                                Ok(())
                            }
                            Err(e) => Err(e),
                        }
                    }
                    _ => Err(unknown_handler(src, &hdr)),
                };
                sink.finish()?;
                result
            }
        }
    }

    /// A Long whose range lies outside this rank's segment: rejected, and a request is still
    /// answered (a put's initiator is told, so it does not hang).
    #[cold]
    #[inline(never)]
    fn out_of_segment(
        &mut self,
        src: Rank,
        route: Route,
        hdr: &Header,
        args: &[u32],
        grant: u8,
        tx: &mut dyn Tx,
    ) -> Result<(), AmError> {
        let rejected = misbehaved(
            src,
            Misbehavior::OutOfSegment {
                offset: hdr.long_offset,
                len: hdr.payload_len as u64,
            },
        );
        if hdr.category == Category::Request {
            let mut sink = ReplySink::new(
                src,
                route,
                grant,
                tx,
                &mut self.pending,
                &self.handlers.meta,
                &self.limits,
                self.seg_len,
            );
            if hdr.system {
                if let Ok(SystemMsg::Put { op }) =
                    SystemMsg::decode(hdr.category, hdr.kind, hdr.handler, args)
                {
                    // The initiator waits for this put: tell it, don't leave it hanging.
                    sink.system(SystemMsg::PutDone { op, ok: false }, Payload::EMPTY);
                }
            }
            sink.finish()?;
        }
        Err(rejected)
    }

    /// A core-internal message (start-up, barrier, put/get, exit).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn dispatch_system(
        &mut self,
        src: Rank,
        route: Route,
        hdr: &Header,
        args: &[u32],
        payload: Payload<'_>,
        segment: SharedBytes<'_>,
        long: Option<Range<usize>>,
        inline_long: Option<Payload<'_>>,
        grant: u8,
        tx: &mut dyn Tx,
    ) -> Result<(), AmError> {
        match hdr.category {
            Category::Reply => self.system_reply(src, hdr, args, payload),
            Category::Request => {
                let mut sink = ReplySink::new(
                    src,
                    route,
                    grant,
                    tx,
                    &mut self.pending,
                    &self.handlers.meta,
                    &self.limits,
                    self.seg_len,
                );
                // Split borrows: the system state is disjoint from the sink's fields.
                let result = system_request(
                    &mut SystemState {
                        rank: self.rank,
                        seg_len: self.seg_len,
                        hello: &mut self.hello,
                        hello_digest: self.hello_digest,
                        hello_signature: &self.hello_signature,
                        barrier_arrivals: &mut self.barrier_arrivals,
                        exit_requested: &mut self.exit_requested,
                    },
                    &mut sink,
                    hdr,
                    args,
                    (segment, payload),
                    (&long, inline_long),
                );
                sink.finish()?;
                result
            }
        }
    }

    fn system_reply(
        &mut self,
        src: Rank,
        hdr: &Header,
        args: &[u32],
        medium: Payload<'_>,
    ) -> Result<(), AmError> {
        let bad = || misbehaved(src, Misbehavior::BadSystemMessage(hdr.handler));
        let msg = SystemMsg::decode(hdr.category, hdr.kind, hdr.handler, args)
            .map_err(|m| misbehaved(src, m))?;
        match msg {
            SystemMsg::Ack => Ok(()),
            SystemMsg::PutDone { op, ok } => {
                let slot = self.live_op(op, src).ok_or_else(bad)?;
                if !ok && slot.error.is_none() {
                    slot.error = Some(misbehaved(
                        src,
                        Misbehavior::OutOfSegment { offset: 0, len: 0 },
                    ));
                }
                slot.outstanding = slot.outstanding.saturating_sub(1);
                Ok(())
            }
            SystemMsg::GetData { op, at, ok } => {
                let slot = self.live_op(op, src).ok_or_else(bad)?;
                slot.outstanding = slot.outstanding.saturating_sub(1);
                if !ok {
                    if slot.error.is_none() {
                        slot.error = Some(misbehaved(
                            src,
                            Misbehavior::OutOfSegment { offset: 0, len: 0 },
                        ));
                    }
                    return Ok(());
                }
                match segment_range(at, medium.len() as u64, slot.data.len()) {
                    Some(r) => match medium {
                        Payload::Private(b) => {
                            slot.data[r].copy_from_slice(b);
                            Ok(())
                        }
                        Payload::Shared(s) => s.read(0, &mut slot.data[r]).map_err(shm_err),
                    },
                    None => Err(bad()),
                }
            }
            _ => Err(bad()),
        }
    }

    fn live_op(&mut self, index: u32, peer: Rank) -> Option<&mut OpSlot> {
        self.ops
            .get_mut(index as usize)
            .filter(|s| s.live && s.peer == peer && s.outstanding > 0)
    }

    /// Allocates a put/get slot.
    pub fn alloc_op(&mut self, peer: Rank, data: Vec<u8>) -> (u32, u32) {
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
        slot.outstanding = 0;
        slot.error = None;
        slot.data = data;
        (index, slot.gen)
    }

    /// The slot of a handle, if it is still the same operation.
    pub fn op(&mut self, index: u32, gen: u32) -> Option<&mut OpSlot> {
        self.ops
            .get_mut(index as usize)
            .filter(|s| s.live && s.gen == gen)
    }

    /// Frees a completed slot and returns its result.
    pub fn finish_op(&mut self, index: u32) -> Result<Vec<u8>, AmError> {
        let slot = &mut self.ops[index as usize];
        slot.live = false;
        let data = std::mem::take(&mut slot.data);
        let err = slot.error.take();
        self.free_ops.push(index);
        match err {
            Some(e) => Err(e),
            None => Ok(data),
        }
    }
}

struct SystemState<'a> {
    rank: Rank,
    seg_len: usize,
    hello: &'a mut Hello,
    hello_digest: u64,
    hello_signature: &'a [u16; 256],
    barrier_arrivals: &'a mut HashMap<(u64, u8), u32>,
    exit_requested: &'a mut Option<i32>,
}

fn system_request(
    st: &mut SystemState<'_>,
    sink: &mut ReplySink<'_>,
    hdr: &Header,
    args: &[u32],
    (segment, payload): (SharedBytes<'_>, Payload<'_>),
    (long, inline_long): (&Option<Range<usize>>, Option<Payload<'_>>),
) -> Result<(), AmError> {
    let src = sink.src;
    let bad = || misbehaved(src, Misbehavior::BadSystemMessage(hdr.handler));
    let msg = SystemMsg::decode(hdr.category, hdr.kind, hdr.handler, args)
        .map_err(|m| misbehaved(src, m))?;
    match msg {
        SystemMsg::Hello {
            digest,
            segment_len,
        } => {
            if st.rank != 0 {
                return Err(bad());
            }
            // Their signature up to their highest registered id (0 beyond), or fewer
            // entries if a Medium could not carry them all (then a difference beyond them
            // goes unnamed).
            let mut sig = [0u8; HELLO_SIGNATURE_LEN];
            let n = payload.len();
            if n > sig.len() || n % 2 != 0 {
                return Err(bad());
            }
            match payload {
                Payload::Private(b) => sig[..n].copy_from_slice(b),
                Payload::Shared(s) => s.read(0, &mut sig[..n]).map_err(shm_err)?,
            }
            let truncated = n / 2 >= (sink.limits.max_medium / 2).min(256);
            st.hello.received += 1;
            if st.hello.mismatch.is_none() {
                if digest != st.hello_digest {
                    // The lowest id whose signature entries differ (the copy is checked).
                    let entries = if truncated { n / 2 } else { 256 };
                    let handler = (0..entries)
                        .find(|&id| {
                            let theirs = u16::from_le_bytes([sig[2 * id], sig[2 * id + 1]]);
                            theirs != st.hello_signature[id]
                        })
                        .map(|id| id as u8);
                    st.hello.mismatch = Some(HelloVerdict::TableMismatch {
                        rank: src,
                        ours: st.hello_digest,
                        theirs: digest,
                        handler,
                    });
                } else if segment_len != st.seg_len as u64 {
                    st.hello.mismatch = Some(HelloVerdict::SegmentMismatch {
                        rank: src,
                        ours: st.seg_len as u64,
                        theirs: segment_len,
                    });
                }
            }
            Ok(())
        }
        SystemMsg::HelloVerdict(v) => {
            st.hello.result = Some(v);
            Ok(())
        }
        SystemMsg::Barrier { epoch, round } => {
            *st.barrier_arrivals.entry((epoch, round)).or_insert(0) += 1;
            Ok(())
        }
        SystemMsg::Put { op } => {
            place(segment, long, inline_long)?;
            sink.system(SystemMsg::PutDone { op, ok: true }, Payload::EMPTY);
            Ok(())
        }
        SystemMsg::Get {
            op,
            offset,
            len,
            at,
        } => match segment_range(offset, len as u64, st.seg_len.min(segment.len())) {
            Some(r) if r.len() <= sink.limits.max_medium => {
                // Straight from the segment: the transport copies the view once.
                let data = segment.slice(r.start, r.len()).map_err(shm_err)?;
                sink.system(
                    SystemMsg::GetData { op, at, ok: true },
                    Payload::Shared(data),
                );
                Ok(())
            }
            in_segment => {
                sink.system(SystemMsg::GetData { op, at, ok: false }, Payload::EMPTY);
                Err(match in_segment {
                    // In the segment but more than one reply can carry: not our protocol.
                    Some(_) => bad(),
                    None => misbehaved(
                        src,
                        Misbehavior::OutOfSegment {
                            offset,
                            len: len as u64,
                        },
                    ),
                })
            }
        },
        SystemMsg::Exit { code } => {
            *st.exit_requested = Some(code);
            Ok(())
        }
        SystemMsg::Ack | SystemMsg::PutDone { .. } | SystemMsg::GetData { .. } => Err(bad()),
    }
}
