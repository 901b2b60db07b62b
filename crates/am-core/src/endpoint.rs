//! The AM protocol of one rank, without I/O: [`Endpoint`].
//!
//! An endpoint holds everything a rank knows about the protocol (handlers, credits, replies
//! the device refused, start-up, barriers, puts and gets) and does no I/O of its own: every
//! method that sends takes the sender ([`Tx`]) as an argument, and every method that would
//! wait instead returns [`Poll::Pending`], so the caller decides how to wait. Messages that
//! arrive are given to [`Endpoint::handle`]. There is no clock in here either.
//!
//! [`crate::Node`] is the driver this workspace uses: it polls a [`crate::Transport`], feeds
//! each delivery to `handle`, and between polls calls the step methods until they are ready,
//! waiting as its [`crate::WaitMode`] says. Anyone writing a driver of their own (an event
//! loop, a test harness that delivers messages in a chosen order) does the same:
//!
//! ```
//! use std::task::Poll;
//! use am_core::endpoint::Endpoint;
//! use am_core::{Handlers, Limits, StaticCredits, Outgoing, SendError, Tx};
//!
//! /// A sender that keeps what it is given (a real driver hands it to a NIC).
//! struct Outbox(Vec<(u32, Vec<u8>)>);
//! impl Tx for Outbox {
//!     fn try_send(&mut self, dest: u32, m: &Outgoing<'_>) -> Result<(), SendError> {
//!         let mut bytes = m.head.to_vec();
//!         m.payload.append_to(&mut bytes);
//!         self.0.push((dest, bytes));
//!         Ok(())
//!     }
//! }
//!
//! let limits = Limits { max_args: 16, max_medium: 1024, max_long: 4096, max_credits: 8 };
//! let credits = Box::new(StaticCredits::new(2, 8));
//! let mut ep = Endpoint::new(1, 2, limits, 4096, Handlers::new(), credits);
//! let mut out = Outbox(Vec::new());
//! // Rank 1 starts by telling rank 0 its handler table, then waits for the verdict.
//! assert!(ep.start_step(&mut out).is_pending());
//! assert_eq!(out.0.len(), 1);
//! assert_eq!(out.0[0].0, 0);
//! ```

use std::cell::{Cell, OnceCell};
use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::task::Poll;

use std::marker::PhantomData;

use crate::atomic::{Atomic, AtomicOp, AtomicWord, Refused};
use crate::credit::{CreditPolicy, Policy};
use crate::error::{send_err, shm_err, AmError, Misbehavior, StartError};
use crate::handler::{HandlerFn, Handlers, Msg};
use crate::protocol::{opcode, HelloVerdict, SystemMsg, HELLO_SIGNATURE_LEN};
use crate::reply::{
    check_message, encode_acks, refuse_request, segment_range, Owed, OwedAcks, Replies, ReplySink,
    Token,
};
use crate::transport::{
    Delivery, Limits, Outgoing, Payload, Received, Route, SendError, SharedBytes, Tx,
};
use crate::types::{AmKind, Category, HandlerId, Rank};
use crate::wire::{self, Header, BASE_HEADER_LEN, MAX_ARGS, MAX_HEAD_LEN};

/// [`Endpoint`]'s per-peer gone flags: reported lost, and left the job cleanly.
const LOST: u8 = 1;
const DEPARTED: u8 = 2;

/// A put or get in flight.
#[derive(Default)]
struct OpSlot {
    gen: u32,
    /// The rank the put or get targets: its replies are the only ones accepted.
    peer: Rank,
    live: bool,
    /// Where in the peer's segment the operation starts.
    offset: usize,
    /// Bytes the operation moves, and how many of them have been asked for so far.
    len: usize,
    sent: usize,
    /// Chunks sent and not yet answered.
    outstanding: u32,
    error: Option<AmError>,
    data: Vec<u8>,
    /// A remote atomic (one message; its old value lands in `data`) rather than a put or get.
    atomic: Option<Atomic>,
    /// Nobody waits for it ([`Endpoint::detach_atomic`]): freed when its reply comes.
    detached: bool,
}

/// A non-blocking put in flight: complete it with [`crate::Node::wait_put`] (or, driving an
/// [`Endpoint`] yourself, [`Endpoint::put_step`] then [`Endpoint::poll_put`]).
#[derive(Debug)]
#[must_use = "a put is complete only once waited for"]
pub struct PutHandle {
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

/// A non-blocking get in flight: complete it with [`crate::Node::wait_get`] (or
/// [`Endpoint::get_step`] then [`Endpoint::poll_get`]).
#[derive(Debug)]
#[must_use = "a get's data arrives only once waited for"]
pub struct GetHandle {
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

/// A remote atomic in flight: complete it with [`crate::Node::wait_atomic`] (or
/// [`Endpoint::atomic_step`] then [`Endpoint::poll_atomic`]). One the transport applied
/// itself, or on this rank, is complete when made.
#[derive(Debug)]
#[must_use = "an atomic's old value arrives only once waited for"]
pub struct AtomicHandle<W: AtomicWord> {
    pub(crate) state: AtomicState,
    width: PhantomData<W>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum AtomicState {
    /// Applied: the word's old value.
    Done(u64),
    /// Sent as a system message: its operation slot.
    Op { index: u32, gen: u32 },
}

impl<W: AtomicWord> AtomicHandle<W> {
    /// Whether the atomic was applied when it was made (by the transport, on the target's
    /// memory, or on this rank): waiting for it then needs no message.
    pub fn is_applied(&self) -> bool {
        matches!(self.state, AtomicState::Done(_))
    }

    /// An atomic already applied (by the transport, or to this rank's segment), whose word
    /// held `old`.
    pub fn applied(old: u64) -> AtomicHandle<W> {
        AtomicHandle {
            state: AtomicState::Done(old),
            width: PhantomData,
        }
    }
}

/// Start-up handshake: everyone tells rank 0 its table digest and segment size, rank 0
/// tells everyone the verdict.
#[derive(Debug, Clone, Copy)]
enum Startup {
    /// Not a rank 0: its HELLO has not gone out yet.
    SendHello,
    /// Not a rank 0: waits for rank 0's verdict.
    AwaitVerdict,
    /// Rank 0: waits for every other rank's HELLO.
    Collect,
    /// Rank 0: sends the verdict to ranks `next..size`.
    Verdicts { next: Rank, verdict: HelloVerdict },
    /// Rank 0, all agree: waits until the verdicts' implicit replies have brought every
    /// credit home.
    CreditsHome,
    /// Over, with this verdict.
    Done(HelloVerdict),
}

/// What start-up has heard.
#[derive(Default)]
struct Hello {
    /// Rank 0: how many HELLOs arrived.
    received: u32,
    /// Rank 0: the first mismatch seen.
    mismatch: Option<HelloVerdict>,
    /// Other ranks: rank 0's verdict.
    result: Option<HelloVerdict>,
}

/// Where a barrier stands: its epoch, its round, and whether that round's message went out.
#[derive(Debug, Clone, Copy)]
struct BarrierAt {
    epoch: u64,
    round: u8,
    sent: bool,
}

/// The AM protocol state of one rank (see the [module docs](self)).
pub struct Endpoint {
    rank: Rank,
    size: u32,
    limits: Limits,
    seg_len: usize,
    handlers: Handlers,
    credits: Policy,
    /// Replies waiting for the device, implicit replies owed, and what the running handler's
    /// replies did.
    replies: Replies,
    ops: Vec<OpSlot>,
    free_ops: Vec<u32>,
    startup: Startup,
    barrier_epoch: u64,
    /// The barrier in progress (also one that returned an error, to resume).
    barrier: Option<BarrierAt>,
    barrier_arrivals: HashMap<(u64, u8), u32>,
    hello: Hello,
    hello_digest: u64,
    /// Our handler table's signature ([`Handlers::signature`]), which rank 0 compares.
    hello_signature: [u16; 256],
    exit_requested: Option<i32>,
    /// Per peer, whether the transport reported it lost ([`LOST`]: requests to it fail at
    /// once, its operations fail, and nobody waits for its replies any more) or gone from
    /// the job cleanly ([`DEPARTED`]); one byte, so a send looks once.
    gone_as: Vec<u8>,
    /// How many peers were marked lost or departed so far.
    gone: u32,
    /// Gone peers whose unanswered requests a wait has already been failed for.
    unanswered_reported: Vec<bool>,
    /// Private memory a handler's `Msg::payload` copies a shared payload into (reused).
    scratch: Vec<u8>,
    /// Detached atomics whose reply has not come ([`Endpoint::posted_in_flight`]).
    detached_in_flight: u32,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("startup", &self.startup)
            .field("quiet", &self.is_quiet())
            .finish_non_exhaustive()
    }
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

/// The `nargs` arguments after a message's first word (a decoded user Short or Medium, so
/// they are present), copied out into `out`.
#[inline(always)]
fn args_after_word<'o>(
    bytes: Received<'_>,
    nargs: u8,
    out: &'o mut [u32; MAX_ARGS],
) -> Result<&'o [u32], AmError> {
    let n = (nargs as usize).min(MAX_ARGS);
    if n > 0 {
        let mut raw = [0u8; 4 * MAX_ARGS];
        let raw = &mut raw[..4 * n];
        match bytes {
            Received::Shared(s) => s.read(BASE_HEADER_LEN, raw).map_err(shm_err)?,
            Received::Private(b) => raw.copy_from_slice(
                b.get(BASE_HEADER_LEN..BASE_HEADER_LEN + 4 * n)
                    .ok_or_else(|| {
                        shm_err(am_shm::ShmError::OutOfBounds {
                            offset: BASE_HEADER_LEN,
                            len: 4 * n,
                            area: b.len(),
                        })
                    })?,
            ),
        }
        for (a, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
            *a = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
    Ok(&out[..n])
}

/// The payload of a message after its `head_len` bytes of head, where it lies.
#[inline(always)]
fn body_after(bytes: Received<'_>, head_len: usize) -> Result<Payload<'_>, AmError> {
    Ok(match bytes {
        Received::Shared(s) => Payload::Shared(s.slice_from(head_len).map_err(shm_err)?),
        Received::Private(b) => Payload::Private(b.get(head_len..).unwrap_or(&[])),
    })
}

impl Endpoint {
    /// The protocol state of rank `rank` of `size`, over a transport with `limits` and a
    /// segment of `segment_len` bytes. Start it with [`Endpoint::start_step`] before any
    /// other send.
    pub fn new(
        rank: Rank,
        size: u32,
        limits: Limits,
        segment_len: usize,
        handlers: Handlers,
        credits: Box<dyn CreditPolicy>,
    ) -> Endpoint {
        Self::with_policy(
            rank,
            size,
            limits,
            segment_len,
            handlers,
            Policy::Custom(credits),
        )
    }

    /// [`Endpoint::new`] with a policy built by [`crate::Credits`] (the static one unboxed).
    pub(crate) fn with_policy(
        rank: Rank,
        size: u32,
        limits: Limits,
        segment_len: usize,
        handlers: Handlers,
        credits: Policy,
    ) -> Endpoint {
        let hello_digest = handlers.digest();
        let hello_signature = handlers.signature();
        let meta = handlers.registrations();
        Endpoint {
            rank,
            size,
            limits,
            seg_len: segment_len,
            handlers,
            credits,
            replies: Replies {
                pending: VecDeque::new(),
                acks: None,
                replied: false,
                error: None,
                meta,
                limits,
                seg_len: segment_len,
            },
            ops: Vec::new(),
            free_ops: Vec::new(),
            startup: if size <= 1 {
                Startup::Done(HelloVerdict::Ok)
            } else if rank == 0 {
                Startup::Collect
            } else {
                Startup::SendHello
            },
            barrier_epoch: 0,
            barrier: None,
            barrier_arrivals: HashMap::new(),
            hello: Hello::default(),
            hello_digest,
            hello_signature,
            exit_requested: None,
            gone_as: vec![0; size as usize],
            gone: 0,
            unanswered_reported: vec![false; size as usize],
            scratch: Vec::new(),
            detached_in_flight: 0,
        }
    }

    /// Whether one empty reply may answer several requests of a peer
    /// ([`crate::Transport::acks_coalesce`]; off by default). On, the requests whose handlers
    /// sent no reply are answered by one [`SystemMsg::Acks`] per peer when half the credits
    /// a peer starts with are owed to it, and the rest by [`Endpoint::flush_acks`], which a
    /// driver calls when a poll finds nothing.
    pub fn set_acks_coalesce(&mut self, on: bool) {
        self.replies.acks = on.then(|| OwedAcks {
            per_peer: vec![Owed::default(); self.size as usize],
            owed: 0,
            batch: (self.credits.held(self.rank) / 2).max(1),
        });
    }

    /// Whether implicit replies are owed and not yet sent (see [`Endpoint::flush_acks`]).
    #[inline]
    pub fn acks_owed(&self) -> bool {
        self.replies.acks.as_ref().is_some_and(|a| a.owed > 0)
    }

    /// Sends the implicit replies owed (one [`SystemMsg::Acks`] per peer), after the queued
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
                Err(SendError::Busy) => return Ok(()),
                Err(e) => {
                    acks.forget(peer);
                    return self.send_failed(e).map(drop);
                }
            }
        }
        Ok(())
    }

    /// This rank.
    #[inline]
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Number of ranks.
    #[inline]
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The transport's size limits.
    #[inline]
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Bytes of this rank's segment (and, once start-up agreed, of every rank's).
    #[inline]
    pub fn segment_len(&self) -> usize {
        self.seg_len
    }

    /// The credit policy.
    #[inline]
    pub fn credits(&self) -> &dyn CreditPolicy {
        match &self.credits {
            Policy::Static(s) => s,
            Policy::Custom(c) => &**c,
        }
    }

    /// The exit code a peer asked the whole job to end with ([`SystemMsg::Exit`]): once set,
    /// the driver ends this rank's process with it.
    #[inline]
    pub fn exit_requested(&self) -> Option<i32> {
        self.exit_requested
    }

    /// Records what a poll's error says about a peer: a lost peer is marked lost (its
    /// operations fail), a departed one departed. Returns the error back, except for a
    /// departure, which is not an error of the poll that found it: only the calls that wait
    /// for that peer fail.
    pub fn absorb(&mut self, e: AmError) -> Option<AmError> {
        match e {
            AmError::PeerDeparted(peer) => {
                self.mark_departed(peer);
                None
            }
            AmError::PeerLost(peer) => {
                self.mark_lost(peer);
                Some(e)
            }
            e => Some(e),
        }
    }

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
            Some(g) if g & LOST != 0 => return Err(AmError::PeerLost(dest)),
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

    fn check_rank(&self, rank: Rank) -> Result<(), AmError> {
        if rank >= self.size {
            return Err(AmError::InvalidRank {
                rank,
                size: self.size,
            });
        }
        Ok(())
    }

    fn check_segment(&self, offset: u64, len: u64) -> Result<(), AmError> {
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

    /// One attempt to send a user request already checked by [`Endpoint::check_request`]:
    /// `Ok(false)` if out of credit or the device is busy (nothing was sent).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn try_request(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        dest: Rank,
        kind: AmKind,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Result<bool, AmError> {
        self.try_send(tx, dest, false, kind, handler.0, args, payload, long_offset)
    }

    /// A step of a blocking send of a checked user request: fails at once if `dest` was
    /// lost or has left, `Pending` while out of credit or the device is busy.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn request_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        dest: Rank,
        kind: AmKind,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Poll<Result<(), AmError>> {
        self.send_step(tx, dest, false, kind, handler.0, args, payload, long_offset)
    }

    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn send_step(
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
        match self.try_send(tx, dest, system, kind, handler, args, payload, long_offset) {
            Ok(true) => Poll::Ready(Ok(())),
            Ok(false) => Poll::Pending,
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn system_step(
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

    /// One attempt: takes a credit, encodes the head and offers it to the device.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn try_send(
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
        let mut head = [0u8; MAX_HEAD_LEN];
        let n = header.encode(args, &mut head);
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
                Ok(false)
            }
            Err(e) => {
                self.credits.cancel(dest);
                self.send_failed(e)
            }
        }
    }

    #[cold]
    fn send_failed(&mut self, e: SendError) -> Result<bool, AmError> {
        match e {
            SendError::PeerLost(peer) => {
                self.mark_lost(peer);
            }
            SendError::PeerDeparted(peer) => {
                self.mark_departed(peer);
            }
            _ => {}
        }
        Err(send_err(e))
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

    /// A step of start-up (collective; [`crate::Node::new`]): every rank tells rank 0 its
    /// handler table and segment size, rank 0 tells everyone whether they agree. Ready with
    /// the verdict; a mismatch is reported on every rank. No user request may be sent
    /// before it is ready with `Ok`.
    pub fn start_step(&mut self, tx: &mut (impl Tx + ?Sized)) -> Poll<Result<(), StartError>> {
        loop {
            match self.startup {
                Startup::SendHello => {
                    let hello = SystemMsg::Hello {
                        digest: self.hello_digest,
                        segment_len: self.seg_len as u64,
                    };
                    // The entries up to the highest registered id, as many as a Medium
                    // carries.
                    let sig = &self.hello_signature;
                    let used = sig.iter().rposition(|&h| h != 0).map_or(0, |i| i + 1);
                    let signature: Vec<u8> = sig[..used.min(self.limits.max_medium / 2)]
                        .iter()
                        .flat_map(|h| h.to_le_bytes())
                        .collect();
                    match self.system_step(tx, 0, hello, &signature, None) {
                        Poll::Ready(Ok(())) => self.startup = Startup::AwaitVerdict,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Startup::AwaitVerdict => match self.hello.result {
                    Some(v) => self.startup = Startup::Done(v),
                    None => return self.waiting_for(0).map(|e| Err(e.into())),
                },
                Startup::Collect => {
                    if self.hello.received < self.size - 1 {
                        // A rank that has not said hello and is gone will never say it.
                        return match (1..self.size).find(|&r| self.is_gone(r)) {
                            Some(r) => self.waiting_for(r).map(|e| Err(e.into())),
                            None => Poll::Pending,
                        };
                    }
                    let verdict = self.hello.mismatch.unwrap_or(HelloVerdict::Ok);
                    self.startup = Startup::Verdicts { next: 1, verdict };
                }
                Startup::Verdicts { next, verdict } => {
                    if next == self.size {
                        self.startup = match verdict {
                            HelloVerdict::Ok => Startup::CreditsHome,
                            v => Startup::Done(v),
                        };
                        continue;
                    }
                    match self.system_step(tx, next, SystemMsg::HelloVerdict(verdict), &[], None) {
                        Poll::Ready(Ok(())) => {
                            self.startup = Startup::Verdicts {
                                next: next + 1,
                                verdict,
                            }
                        }
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                        Poll::Pending => return Poll::Pending,
                    }
                }
                Startup::CreditsHome => {
                    // Start-up ends with every credit home: the verdicts' implicit replies.
                    if !self.is_quiet() {
                        return Poll::Pending;
                    }
                    self.startup = Startup::Done(HelloVerdict::Ok);
                }
                Startup::Done(verdict) => {
                    return Poll::Ready(match verdict {
                        HelloVerdict::Ok => Ok(()),
                        HelloVerdict::SegmentMismatch { rank, ours, theirs } => {
                            Err(StartError::SegmentSizeMismatch { rank, ours, theirs })
                        }
                        HelloVerdict::TableMismatch {
                            rank,
                            ours,
                            theirs,
                            handler,
                        } => Err(StartError::HandlerTableMismatch {
                            rank,
                            ours,
                            theirs,
                            handler: handler.map(HandlerId),
                        }),
                    })
                }
            }
        }
    }

    fn is_gone(&self, peer: Rank) -> bool {
        self.is_lost(peer) || self.is_departed(peer)
    }

    /// `Pending` while `peer` may still answer; otherwise the error that says why it won't.
    #[inline]
    fn waiting_for(&self, peer: Rank) -> Poll<AmError> {
        match self.gone_as.get(peer as usize).copied().unwrap_or(0) {
            0 => Poll::Pending,
            g if g & LOST != 0 => Poll::Ready(AmError::PeerLost(peer)),
            _ => Poll::Ready(AmError::PeerDeparted(peer)),
        }
    }

    /// A step of a barrier ([`crate::Node::barrier`]): a dissemination barrier, ⌈log2 N⌉
    /// rounds of one request each. The first step of a barrier starts it; steps after an
    /// error resume it where it stopped (the other ranks are still in it), sending nothing
    /// twice. Ready once every rank has entered this barrier.
    pub fn barrier_step(&mut self, tx: &mut (impl Tx + ?Sized)) -> Poll<Result<(), AmError>> {
        let mut at = match self.barrier {
            Some(at) => at,
            None => {
                let epoch = self.barrier_epoch;
                self.barrier_epoch += 1;
                BarrierAt {
                    epoch,
                    round: 0,
                    sent: false,
                }
            }
        };
        let size = self.size;
        let result = loop {
            let Some(distance) = 1u32.checked_shl(u32::from(at.round)).filter(|&d| d < size) else {
                self.barrier = None;
                return Poll::Ready(Ok(()));
            };
            let key = (at.epoch, at.round);
            if !at.sent {
                let to = (self.rank + distance) % size;
                let msg = SystemMsg::Barrier {
                    epoch: at.epoch,
                    round: at.round,
                };
                match self.system_step(tx, to, msg, &[], None) {
                    Poll::Ready(Ok(())) => at.sent = true,
                    other => break other,
                }
            }
            match self.barrier_arrivals.get_mut(&key) {
                Some(n) => {
                    *n -= 1;
                    if *n == 0 {
                        self.barrier_arrivals.remove(&key);
                    }
                    at.round += 1;
                    at.sent = false;
                }
                // This round's arrival comes from the rank `distance` before us.
                None => {
                    let from = (self.rank + size - distance % size) % size;
                    break self.waiting_for(from).map(Err);
                }
            }
        };
        self.barrier = Some(at);
        result
    }

    /// Starts a put of `data` into `dest`'s segment at `offset` ([`crate::Node::put_nb`]);
    /// a put to this rank is done at once, into `segment`. Send it with
    /// [`Endpoint::put_step`].
    pub fn put_start(
        &mut self,
        segment: SharedBytes<'_>,
        dest: Rank,
        offset: usize,
        data: &[u8],
    ) -> Result<PutHandle, AmError> {
        self.check_rma(dest, offset, data.len())?;
        if dest == self.rank {
            segment
                .write(offset, data)
                .map_err(|_| self.out_of_bounds(offset as u64, data.len() as u64))?;
            return Ok(self.put_placed(dest, offset, data.len()));
        }
        let (index, gen) = self.alloc_op(dest, offset, data.len(), Vec::new());
        Ok(PutHandle { index, gen })
    }

    /// A step of sending a put: sends the chunks that credits allow; ready once all are
    /// sent. `data` must be what [`Endpoint::put_start`] was given. After an error nothing
    /// more is sent: wait for the chunks already out with [`Endpoint::poll_put`].
    pub fn put_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        handle: &PutHandle,
        data: &[u8],
    ) -> Poll<Result<(), AmError>> {
        self.op_step(tx, handle.index, handle.gen, Some(data))
    }

    /// Starts a get of `len` bytes at `offset` of `src`'s segment ([`crate::Node::get_nb`]);
    /// a get from this rank is done at once, from `segment`. Send it with
    /// [`Endpoint::get_step`].
    pub fn get_start(
        &mut self,
        segment: SharedBytes<'_>,
        src: Rank,
        offset: usize,
        len: usize,
    ) -> Result<GetHandle, AmError> {
        self.check_rma(src, offset, len)?;
        let mut data = vec![0; len];
        if src == self.rank {
            segment
                .read(offset, &mut data)
                .map_err(|_| self.out_of_bounds(offset as u64, len as u64))?;
            return Ok(self.get_fetched(src, offset, data));
        }
        let (index, gen) = self.alloc_op(src, offset, len, data);
        Ok(GetHandle { index, gen })
    }

    /// A step of sending a get's requests, as [`Endpoint::put_step`].
    pub fn get_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        handle: &GetHandle,
    ) -> Poll<Result<(), AmError>> {
        self.op_step(tx, handle.index, handle.gen, None)
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

    /// The handle of a put the transport has already placed in `dest`'s segment
    /// ([`crate::Transport::put`]): complete.
    pub fn put_placed(&mut self, dest: Rank, offset: usize, len: usize) -> PutHandle {
        let (index, gen) = self.alloc_op(dest, offset, len, Vec::new());
        self.ops[index as usize].sent = len;
        PutHandle { index, gen }
    }

    /// The handle of a get whose `data` the transport has already fetched from `src`'s
    /// segment ([`crate::Transport::get`]): complete.
    pub fn get_fetched(&mut self, src: Rank, offset: usize, data: Vec<u8>) -> GetHandle {
        let len = data.len();
        let (index, gen) = self.alloc_op(src, offset, len, data);
        self.ops[index as usize].sent = len;
        GetHandle { index, gen }
    }

    /// Checks an atomic on the word at `offset` of `dest`'s segment before anything is done:
    /// the rank, the word inside the segment and aligned to its width, and `dest` not gone.
    pub fn check_atomic(&self, dest: Rank, offset: usize, atomic: &Atomic) -> Result<(), AmError> {
        self.check_rank(dest)?;
        let width = atomic.width().bytes();
        match atomic.check(offset, self.seg_len) {
            Ok(()) => {}
            Err(Refused::OutOfBounds) => {
                return Err(self.out_of_bounds(offset as u64, width as u64))
            }
            Err(Refused::Misaligned) => {
                return Err(AmError::Misaligned {
                    offset: offset as u64,
                    align: width,
                })
            }
        }
        match self.waiting_for(dest) {
            Poll::Ready(e) => Err(e),
            Poll::Pending => Ok(()),
        }
    }

    /// Starts an atomic that the transport does not apply itself ([`crate::Node::atomic_nb`]
    /// asks it first): one on this rank is applied at once, to `segment`; for another rank,
    /// send it with [`Endpoint::atomic_step`].
    pub fn atomic_start<W: AtomicWord>(
        &mut self,
        segment: SharedBytes<'_>,
        dest: Rank,
        offset: usize,
        op: AtomicOp<W>,
    ) -> Result<AtomicHandle<W>, AmError> {
        self.atomic_start_raw(segment, dest, offset, Atomic::from(op))
    }

    /// [`Endpoint::atomic_start`] of an [`Atomic`] as the transports see it; its handle
    /// gives the old value widened to 64 bits.
    pub fn atomic_start_raw<W: AtomicWord>(
        &mut self,
        segment: SharedBytes<'_>,
        dest: Rank,
        offset: usize,
        atomic: Atomic,
    ) -> Result<AtomicHandle<W>, AmError> {
        self.check_atomic(dest, offset, &atomic)?;
        if dest == self.rank {
            let ours = segment.slice_or_empty(0, self.seg_len.min(segment.len()));
            let old = atomic
                .apply(ours, offset)
                .map_err(|_| self.out_of_bounds(offset as u64, atomic.width().bytes() as u64))?;
            return Ok(AtomicHandle::applied(old));
        }
        let (index, gen) = self.alloc_op(dest, offset, 1, vec![0; 8]);
        self.ops[index as usize].atomic = Some(atomic);
        Ok(AtomicHandle {
            state: AtomicState::Op { index, gen },
            width: PhantomData,
        })
    }

    /// A step of sending an atomic, as [`Endpoint::put_step`]: ready once it is sent (at
    /// once if it was applied when started).
    pub fn atomic_step<W: AtomicWord>(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        handle: &AtomicHandle<W>,
    ) -> Poll<Result<(), AmError>> {
        match handle.state {
            AtomicState::Done(_) => Poll::Ready(Ok(())),
            AtomicState::Op { index, gen } => self.op_step(tx, index, gen, None),
        }
    }

    /// Lets an atomic complete with nobody waiting for its result (a non-fetching atomic,
    /// [`crate::Node::atomic_post`]): its operation slot is freed when the reply comes (or
    /// now, if it came). [`Endpoint::is_quiet`] still waits for it, by its credit.
    pub fn detach_atomic<W: AtomicWord>(&mut self, handle: AtomicHandle<W>) {
        if let AtomicState::Op { index, gen } = handle.state {
            let unsent = self.op(index, gen).is_some_and(|s| s.sent < s.len);
            if unsent || self.op_done(index, gen) {
                // Nothing out (or its reply in): nothing to wait for.
                if self.op(index, gen).is_some() {
                    let _ = self.finish_op(index);
                }
            } else if let Some(slot) = self.op(index, gen) {
                slot.detached = true;
                self.detached_in_flight += 1;
            }
        }
    }

    /// Detached atomics ([`Endpoint::detach_atomic`]) still waiting for their reply: a
    /// barrier waits for none to be left, so that what a rank posted is applied at its
    /// target before anyone leaves the barrier.
    pub fn posted_in_flight(&self) -> u32 {
        self.detached_in_flight
    }

    /// Completes an atomic once its result is back: the word's old value.
    pub fn poll_atomic<W: AtomicWord>(
        &mut self,
        handle: &AtomicHandle<W>,
    ) -> Poll<Result<W, AmError>> {
        match handle.state {
            AtomicState::Done(old) => Poll::Ready(Ok(W::narrow(old))),
            AtomicState::Op { index, gen } => {
                // Only an atomic's slot (a handle from another endpoint could name a get's).
                if self.op(index, gen).is_none_or(|s| s.atomic.is_none()) {
                    return Poll::Ready(Err(AmError::StaleHandle));
                }
                self.poll_op(index, gen).map(|r| {
                    r.and_then(|data| {
                        let old: [u8; 8] = data
                            .get(..8)
                            .and_then(|b| b.try_into().ok())
                            .ok_or(AmError::StaleHandle)?;
                        Ok(W::narrow(u64::from_le_bytes(old)))
                    })
                })
            }
        }
    }

    fn out_of_bounds(&self, offset: u64, len: u64) -> AmError {
        AmError::SegmentOutOfBounds {
            offset,
            len,
            size: self.seg_len,
        }
    }

    /// Sends a put's (`data`) or a get's chunks until all are out or one is refused.
    fn op_step(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        index: u32,
        gen: u32,
        data: Option<&[u8]>,
    ) -> Poll<Result<(), AmError>> {
        let Some(slot) = self.op(index, gen) else {
            return Poll::Ready(Err(AmError::StaleHandle));
        };
        let (peer, offset, len) = (slot.peer, slot.offset, slot.len);
        if data.is_some_and(|d| d.len() != len) {
            return Poll::Ready(Err(AmError::StaleHandle));
        }
        let chunk = match data {
            Some(_) => self.limits.max_long,
            None => self.limits.max_medium,
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
                (None, Some(atomic)) => {
                    let msg = SystemMsg::Atomic {
                        op: index,
                        offset: offset as u64,
                        atomic,
                    };
                    self.system_step(tx, peer, msg, &[], None)
                }
                (Some(d), _) => {
                    let put = SystemMsg::Put { op: index };
                    self.system_step(tx, peer, put, &d[at..at + n], Some(offset + at))
                }
                (None, None) => {
                    let get = SystemMsg::Get {
                        op: index,
                        offset: (offset + at) as u64,
                        len: n as u32,
                        at: at as u64,
                    };
                    self.system_step(tx, peer, get, &[], None)
                }
            };
            let slot = &mut self.ops[index as usize];
            match step {
                Poll::Ready(Ok(())) => {
                    slot.outstanding += 1;
                    slot.sent = at + n;
                }
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    // Nothing more goes out; what is out is still waited for.
                    slot.len = at;
                    slot.error.get_or_insert_with(|| e.clone());
                    return Poll::Ready(Err(e));
                }
            }
        }
    }

    /// True once a put has completed (or its handle is stale): every chunk was sent and
    /// has landed.
    pub fn put_done(&self, handle: &PutHandle) -> bool {
        self.op_done(handle.index, handle.gen)
    }

    /// True once every chunk of a get has arrived (or it failed): polling it is then ready.
    pub fn get_done(&self, handle: &GetHandle) -> bool {
        self.op_done(handle.index, handle.gen)
    }

    /// Completes a put once every chunk was sent and has landed in the target's segment.
    pub fn poll_put(&mut self, handle: &PutHandle) -> Poll<Result<(), AmError>> {
        self.poll_op(handle.index, handle.gen).map(|r| r.map(drop))
    }

    /// Completes a get once every chunk was sent and answered: its data.
    pub fn poll_get(&mut self, handle: &GetHandle) -> Poll<Result<Vec<u8>, AmError>> {
        self.poll_op(handle.index, handle.gen)
    }

    fn op_done(&self, index: u32, gen: u32) -> bool {
        self.ops
            .get(index as usize)
            .filter(|s| s.live && s.gen == gen)
            .is_none_or(|s| s.outstanding == 0 && s.sent >= s.len)
    }

    /// Completes an operation: a get's data (empty for a put) or the operation's error. A
    /// stale handle is [`AmError::StaleHandle`].
    pub(crate) fn poll_op(&mut self, index: u32, gen: u32) -> Poll<Result<Vec<u8>, AmError>> {
        match self.op(index, gen) {
            None => Poll::Ready(Err(AmError::StaleHandle)),
            Some(s) if s.outstanding == 0 && s.sent >= s.len => Poll::Ready(self.finish_op(index)),
            Some(_) => Poll::Pending,
        }
    }

    /// Sets `how` ([`LOST`] or [`DEPARTED`]) for `peer`: false if it was set already (or no
    /// such peer).
    fn mark_gone(&mut self, peer: Rank, how: u8) -> bool {
        match self.gone_as.get_mut(peer as usize) {
            Some(g) if *g & how == 0 => {
                *g |= how;
                true
            }
            _ => false,
        }
    }

    /// Records that `peer` is gone: fails its operations in flight and drops the replies still
    /// queued for it. Returns false if it was already known.
    pub fn mark_lost(&mut self, peer: Rank) -> bool {
        if !self.mark_gone(peer, LOST) {
            return false;
        }
        self.gone += 1;
        self.fail_ops_with(peer, AmError::PeerLost(peer));
        self.replies.pending.retain(|p| p.dest != peer);
        if let Some(acks) = self.replies.acks.as_mut() {
            acks.forget(peer);
        }
        true
    }

    /// Ends the puts, gets and atomics in flight with `peer` with `error` (nothing more
    /// comes); detached ones are freed.
    fn fail_ops_with(&mut self, peer: Rank, error: AmError) {
        let mut freed = Vec::new();
        for (i, slot) in self.ops.iter_mut().enumerate() {
            if !slot.live || slot.peer != peer {
                continue;
            }
            if slot.detached {
                freed.push(i as u32);
            } else if slot.outstanding > 0 || slot.sent < slot.len {
                slot.outstanding = 0;
                slot.len = slot.sent;
                slot.error.get_or_insert_with(|| error.clone());
            }
        }
        for i in freed {
            self.detached_in_flight = self.detached_in_flight.saturating_sub(1);
            let _ = self.finish_op(i);
        }
    }

    /// True if `peer` was reported lost.
    #[inline]
    pub fn is_lost(&self, peer: Rank) -> bool {
        self.gone_as
            .get(peer as usize)
            .is_some_and(|g| g & LOST != 0)
    }

    /// Records that `peer` left the job cleanly: its puts and gets still waiting for replies
    /// fail (nothing more will come from it). Returns false if it was already known.
    pub fn mark_departed(&mut self, peer: Rank) -> bool {
        if !self.mark_gone(peer, DEPARTED) {
            return false;
        }
        self.gone += 1;
        self.fail_ops_with(peer, AmError::PeerDeparted(peer));
        if let Some(acks) = self.replies.acks.as_mut() {
            acks.forget(peer);
        }
        true
    }

    /// True if `peer` left the job cleanly.
    #[inline]
    pub fn is_departed(&self, peer: Rank) -> bool {
        self.gone_as
            .get(peer as usize)
            .is_some_and(|g| g & DEPARTED != 0)
    }

    /// How many peers have been marked lost or departed: a driver that waits re-checks
    /// [`Endpoint::take_unanswerable`] when it changes.
    #[inline]
    pub fn gone_count(&self) -> u32 {
        self.gone
    }

    /// The first peer that is lost or has left while requests to it still await their
    /// replies, as the error a wait fails with: those replies will never come. Each such
    /// peer is reported once (later waits, which may wait for other peers, go on).
    pub fn take_unanswerable(&mut self) -> Option<AmError> {
        let peer = (0..self.size).find(|&p| {
            !self.unanswered_reported[p as usize]
                && self.credits.outstanding(p) > 0
                && self.is_gone(p)
        })?;
        self.unanswered_reported[peer as usize] = true;
        match self.waiting_for(peer) {
            Poll::Ready(e) => Some(e),
            Poll::Pending => None,
        }
    }

    /// Nothing this rank waits for: no queued replies and no requests in flight to live peers.
    pub fn is_quiet(&self) -> bool {
        self.replies.pending.is_empty()
            && !self.acks_owed()
            && (0..self.size)
                .all(|p| self.is_lost(p) || self.is_departed(p) || self.credits.outstanding(p) == 0)
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
    fn flush_pending(&mut self, tx: &mut (impl Tx + ?Sized)) -> Result<(), AmError> {
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
                Err(SendError::Busy) => return Ok(()),
                Err(SendError::PeerLost(peer)) => {
                    self.mark_lost(peer);
                    return Err(AmError::PeerLost(peer));
                }
                Err(SendError::PeerDeparted(peer)) => {
                    // Nobody is left to read the reply.
                    self.replies.pending.pop_front();
                    self.mark_departed(peer);
                    return Err(AmError::PeerDeparted(peer));
                }
                Err(e) => {
                    self.replies.pending.pop_front();
                    return Err(send_err(e));
                }
            }
        }
        Ok(())
    }

    /// Handles one delivered message: runs its handler, sends the reply or the implicit one
    /// through `tx` (the transport's sender for this delivery). An error names the peer
    /// and what it did; the message is dropped and the endpoint goes on.
    #[inline]
    pub fn handle(
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
        let total = d.bytes.len();
        // The common case, a user Short or Medium: its header is one word read once (from
        // shared memory, so what is checked is what is used), its arguments copied out after
        // it, its payload lent where it lies; nothing to place.
        let word = match d.bytes {
            Received::Shared(s) => s
                .load_u64(0)
                .ok()
                .map(|w| u64::from_le_bytes(w.to_ne_bytes())),
            Received::Private(b) => b.first_chunk().map(|w| u64::from_le_bytes(*w)),
        };
        if let Some(hdr) = word.and_then(|w| Header::user_short(w, total)) {
            let n = hdr.nargs as usize;
            // Filled only when there are arguments: no zeroing on the argument-less path.
            let mut argbuf: [u32; MAX_ARGS];
            let args: &[u32] = if n == 0 {
                &[]
            } else {
                argbuf = [0u32; MAX_ARGS];
                let mut raw = [0u8; 4 * MAX_ARGS];
                let raw = &mut raw[..4 * n];
                match d.bytes {
                    Received::Shared(s) => s.read(BASE_HEADER_LEN, raw).map_err(shm_err)?,
                    // `total` is the header and exactly these arguments (checked). Inline
                    // rather than `args_after_word`: measured 14 instructions per round
                    // trip cheaper here.
                    Received::Private(b) => raw.copy_from_slice(&b[BASE_HEADER_LEN..total]),
                }
                for (a, b) in argbuf.iter_mut().zip(raw.chunks_exact(4)) {
                    *a = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                &argbuf[..n]
            };
            let grant = self.take_credits(src, &hdr, &[])?;
            return self.dispatch_user(
                src,
                route,
                &hdr,
                args,
                Payload::EMPTY,
                None,
                None,
                grant,
                segment,
                tx,
            );
        }
        if let Some(hdr) = word.and_then(|w| Header::user_medium(w, total)) {
            return self.handle_medium(src, route, &hdr, d.bytes, segment, tx);
        }
        // The head is parsed from private memory: a copy of it when the transport lends
        // shared memory, so what was checked is what is used (no double fetch).
        let mut copy = [0u8; MAX_HEAD_LEN];
        let head: &[u8] = match d.bytes {
            Received::Private(b) => b,
            Received::Shared(s) => {
                // The base header first (one word), then only as many bytes as it says the
                // head has; decode_prefix checks the copy either way.
                let n = total.min(BASE_HEADER_LEN);
                if n == BASE_HEADER_LEN {
                    // One word load (the common case: a slot starts word-aligned).
                    let word = s.load_u64(0).map_err(shm_err)?;
                    copy[..n].copy_from_slice(&word.to_ne_bytes());
                } else {
                    s.read(0, &mut copy[..n]).map_err(shm_err)?;
                }
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
        let body = body_after(d.bytes, hdr.head_len())?;
        let grant = self.take_credits(src, &hdr, args)?;
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
        self.dispatch_user(
            src,
            route,
            &hdr,
            args,
            payload,
            long,
            inline_long,
            grant,
            segment,
            tx,
        )
    }

    /// Credits first, whatever becomes of the message: a reply returns what its request
    /// took; a request learns what its reply (explicit or implicit) will grant.
    #[inline(always)]
    fn take_credits(&mut self, src: Rank, hdr: &Header, args: &[u32]) -> Result<u8, AmError> {
        match hdr.category {
            Category::Reply => {
                // ACKS answers as many requests as it says; malformed, it counts as one
                // reply, like any other, and its decoding reports it.
                let answered = match (hdr.system && hdr.handler == opcode::ACKS, args) {
                    (true, &[count, granted]) => self.credits.on_replies(src, count, granted),
                    _ => self.credits.on_reply(src, hdr.credit),
                };
                if !answered {
                    return Err(misbehaved(src, Misbehavior::ReplyWithoutRequest));
                }
                Ok(0)
            }
            Category::Request => Ok(self.credits.reply_grant(src, hdr.credit)),
        }
    }

    /// Runs the user handler of an accepted message (its credits taken), placing an inline
    /// Long payload first; a request's handler gets the reply path.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn dispatch_user(
        &mut self,
        src: Rank,
        route: Route,
        hdr: &Header,
        args: &[u32],
        payload: Payload<'_>,
        long: Option<Range<usize>>,
        inline_long: Option<Payload<'_>>,
        grant: u8,
        segment: SharedBytes<'_>,
        tx: &mut dyn Tx,
    ) -> Result<(), AmError> {
        let id = hdr.handler as usize;
        let long_offset = long.as_ref().map(|r| r.start);
        let Endpoint {
            handlers,
            replies,
            scratch,
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
                Some(HandlerFn::Reply(kind, f)) if *kind == hdr.kind => {
                    place(segment, &long, inline_long)?;
                    f(msg(scratch));
                    Ok(())
                }
                _ => Err(unknown_handler(src, hdr)),
            },
            Category::Request => {
                let f = match &mut handlers.fns[id] {
                    Some(HandlerFn::Request(kind, f)) if *kind == hdr.kind => f,
                    _ => {
                        let e = unknown_handler(src, hdr);
                        return refuse_request(replies, tx, src, route, grant, e);
                    }
                };
                if let Err(e) = place(segment, &long, inline_long) {
                    return refuse_request(replies, tx, src, route, grant, e);
                }
                // Afresh, also after a handler that panicked (a driver may catch it and poll
                // on): its reply must not pass for this one's.
                replies.replied = false;
                replies.error = None;
                let mut sink = ReplySink::new(src, route, grant, true, &mut *tx, replies);
                f(
                    msg(scratch),
                    Token {
                        src,
                        sink: &mut sink,
                    },
                );
                match (replies.replied, &replies.error, replies.acks.as_mut()) {
                    // Replied, and the reply went out or waits in order: nothing to finish.
                    (true, None, _) => {
                        replies.replied = false;
                        Ok(())
                    }
                    // No reply: one more owed to the requester, sent with others.
                    (false, None, Some(acks)) => match acks.owe(src, grant, route) {
                        None => Ok(()),
                        Some(owed) => {
                            ReplySink::new(src, route, grant, true, tx, replies).send_acks(&owed);
                            match replies.error.take() {
                                None => Ok(()),
                                Some(e) => Err(e),
                            }
                        }
                    },
                    _ => ReplySink::new(src, route, grant, true, tx, replies).finish(),
                }
            }
        }
    }

    /// [`handle`](Self::handle) of a user Medium whose head `hdr` was decoded from its first
    /// word: arguments copied out, the payload lent where it lies. Inlined: as a call of its
    /// own it cost a Medium round trip about 70 instructions more, and the Short's path
    /// nothing less (callgrind, `selfrt medium` against `selfrt am`).
    #[inline(always)]
    fn handle_medium(
        &mut self,
        src: Rank,
        route: Route,
        hdr: &Header,
        bytes: Received<'_>,
        segment: SharedBytes<'_>,
        tx: &mut dyn Tx,
    ) -> Result<(), AmError> {
        // Filled only when there are arguments, as for a Short.
        let mut argbuf: [u32; MAX_ARGS];
        let args: &[u32] = if hdr.nargs == 0 {
            &[]
        } else {
            argbuf = [0u32; MAX_ARGS];
            args_after_word(bytes, hdr.nargs, &mut argbuf)?
        };
        let payload = body_after(bytes, hdr.head_len())?;
        let grant = self.take_credits(src, hdr, args)?;
        self.dispatch_user(
            src, route, hdr, args, payload, None, None, grant, segment, tx,
        )
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
            let mut sink = ReplySink::new(src, route, grant, false, tx, &mut self.replies);
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
                let mut sink = ReplySink::new(src, route, grant, false, tx, &mut self.replies);
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
            SystemMsg::Ack | SystemMsg::Acks { .. } => Ok(()),
            SystemMsg::AtomicDone { op, old, ok } => {
                let slot = self
                    .live_op(op, src)
                    .filter(|s| s.atomic.is_some())
                    .ok_or_else(bad)?;
                slot.outstanding -= 1;
                if slot.detached {
                    // Its result is nobody's: the slot is free again (an error was checked
                    // away at the initiator, or is a loss reported anyway).
                    self.detached_in_flight = self.detached_in_flight.saturating_sub(1);
                    let _ = self.finish_op(op);
                    return Ok(());
                }
                if ok {
                    slot.data = old.to_le_bytes().to_vec();
                } else {
                    slot.error.get_or_insert(misbehaved(
                        src,
                        Misbehavior::OutOfSegment { offset: 0, len: 0 },
                    ));
                }
                Ok(())
            }
            SystemMsg::PutDone { op, ok } => {
                let slot = self
                    .live_op(op, src)
                    .filter(|s| s.atomic.is_none())
                    .ok_or_else(bad)?;
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
                let slot = self
                    .live_op(op, src)
                    .filter(|s| s.atomic.is_none())
                    .ok_or_else(bad)?;
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
    fn alloc_op(&mut self, peer: Rank, offset: usize, len: usize, data: Vec<u8>) -> (u32, u32) {
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
        slot.detached = false;
        (index, slot.gen)
    }

    /// The slot of a handle, if it is still the same operation.
    fn op(&mut self, index: u32, gen: u32) -> Option<&mut OpSlot> {
        self.ops
            .get_mut(index as usize)
            .filter(|s| s.live && s.gen == gen)
    }

    /// Frees a completed slot and returns its result.
    fn finish_op(&mut self, index: u32) -> Result<Vec<u8>, AmError> {
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
            let truncated = n / 2 >= (sink.out.limits.max_medium / 2).min(256);
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
            Some(r) if r.len() <= sink.out.limits.max_medium => {
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
        SystemMsg::Atomic { op, offset, atomic } => {
            let ours = segment.slice_or_empty(0, st.seg_len.min(segment.len()));
            let applied = usize::try_from(offset)
                .map_err(|_| Refused::OutOfBounds)
                .and_then(|o| atomic.apply(ours, o));
            let (old, ok) = applied.map_or((0, false), |old| (old, true));
            sink.system(SystemMsg::AtomicDone { op, old, ok }, Payload::EMPTY);
            if ok {
                Ok(())
            } else {
                let len = atomic.width().bytes() as u64;
                Err(misbehaved(src, Misbehavior::OutOfSegment { offset, len }))
            }
        }
        SystemMsg::Exit { code } => {
            *st.exit_requested = Some(code);
            Ok(())
        }
        SystemMsg::Ack
        | SystemMsg::Acks { .. }
        | SystemMsg::PutDone { .. }
        | SystemMsg::GetData { .. }
        | SystemMsg::AtomicDone { .. } => Err(bad()),
    }
}
