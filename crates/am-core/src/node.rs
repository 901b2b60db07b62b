//! [`Node`]: one rank of a job, driving the protocol [`Endpoint`] with a [`Transport`].

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use crate::config::{Config, WaitMode};
use crate::credit::CreditPolicy;
use crate::endpoint::{check_message, segment_range, BarrierAt, Endpoint, Hello};
use crate::error::{AmError, StartError, TryRequestError};
use crate::handler::{AmKind, Category, HandlerId, Handlers};
use crate::protocol::{HelloVerdict, SystemMsg};
use crate::transport::{Limits, Outgoing, Payload, SendError, Transport, TransportError};
use crate::wire::{Header, MAX_HEAD_LEN};
use crate::Rank;

/// One rank of a job: the handler table, credits and progress engine over a transport.
///
/// Handlers run only inside [`Node::poll`] and inside the blocking calls, which poll while they
/// wait. A rank that never polls never runs handlers, so replies to its peers stall.
///
/// ```
/// use std::{cell::Cell, rc::Rc};
/// use am_core::{AmKind, Config, HandlerId, Handlers, Loopback, Node};
///
/// const PING: HandlerId = HandlerId(1);
/// const PONG: HandlerId = HandlerId(2);
/// let transports = Loopback::cluster(2, Default::default());
/// am_core::run_ranks(transports, |transport| {
///     let pongs = Rc::new(Cell::new(0u32));
///     let seen = pongs.clone();
///     let mut handlers = Handlers::new();
///     handlers.request(PING, "ping", AmKind::Short, |msg, token| {
///         let _ = token.reply_short(PONG, &[msg.args()[0] + 1]);
///     }).unwrap();
///     handlers.reply(PONG, "pong", AmKind::Short, move |msg| seen.set(msg.args()[0])).unwrap();
///     let mut node = Node::new(transport, handlers, Config::default()).unwrap();
///     if node.rank() == 0 {
///         node.request_short(1, PING, &[41]).unwrap();
///         node.wait_until(|| pongs.get() == 42).unwrap();
///     }
///     node.barrier().unwrap();
/// });
/// ```
pub struct Node<T: Transport> {
    transport: T,
    ep: Endpoint,
    config: Config,
}

/// A non-blocking put in flight. Complete it with [`Node::wait_put`].
#[derive(Debug)]
#[must_use = "a put is complete only once waited for"]
pub struct PutHandle {
    index: u32,
    gen: u32,
}

/// A non-blocking get in flight. Complete it with [`Node::wait_get`].
#[derive(Debug)]
#[must_use = "a get's data arrives only once waited for"]
pub struct GetHandle {
    index: u32,
    gen: u32,
}

/// How long a dropping node waits for the replies to its last requests.
const QUIESCE_LIMIT: Duration = Duration::from_secs(30);

impl<T: Transport> Node<T> {
    /// Starts a node with the credit policy of `config` ([`crate::Credits`]).
    ///
    /// This is collective: every rank must call it. It checks that every rank registered the
    /// same handler table and segment size, and fails on all ranks with a clear error otherwise.
    pub fn new(transport: T, handlers: Handlers, config: Config) -> Result<Self, StartError> {
        let limits = transport.limits();
        let policy = config
            .credits
            .policy(transport.size(), limits.max_credits)
            .map_err(|why| StartError::Config(format!("{} transport: {why}", transport.name())))?;
        Self::with_credit_policy(transport, handlers, config, policy)
    }

    /// Starts a node with a custom credit policy. Collective, like [`Node::new`].
    pub fn with_credit_policy(
        transport: T,
        handlers: Handlers,
        config: Config,
        credits: Box<dyn CreditPolicy>,
    ) -> Result<Self, StartError> {
        let hello_digest = handlers.digest();
        let hello_signature = handlers.signature();
        let ep = Endpoint {
            rank: transport.rank(),
            size: transport.size(),
            limits: transport.limits(),
            seg_len: transport.segment().len(),
            handlers,
            credits,
            pending: VecDeque::new(),
            ops: Vec::new(),
            free_ops: Vec::new(),
            barrier_epoch: 0,
            barrier_resume: None,
            barrier_arrivals: HashMap::new(),
            hello: Hello::default(),
            hello_digest,
            hello_signature,
            exit_requested: None,
            lost: vec![false; transport.size() as usize],
            departed: vec![false; transport.size() as usize],
            scratch: Vec::new(),
        };
        let mut node = Node {
            transport,
            ep,
            config,
        };
        node.hello()?;
        Ok(node)
    }

    /// Exchanges table digests: everyone tells rank 0, rank 0 tells everyone the verdict. No rank
    /// sends a user message before it has heard that all tables agree.
    fn hello(&mut self) -> Result<(), StartError> {
        let size = self.ep.size;
        if size == 1 {
            return Ok(());
        }
        let verdict = if self.rank() == 0 {
            self.wait_until_ep(|ep| ep.hello.received == size - 1)?;
            let v = self.ep.hello.mismatch.unwrap_or(HelloVerdict::Ok);
            for r in 1..size {
                self.send_system(r, SystemMsg::HelloVerdict(v), &[], None)?;
            }
            if v == HelloVerdict::Ok {
                // Start-up ends with every credit home: the verdicts' implicit replies.
                self.wait_until_ep(|ep| ep.is_quiet())?;
            }
            v
        } else {
            let hello = SystemMsg::Hello {
                digest: self.ep.hello_digest,
                segment_len: self.ep.seg_len as u64,
            };
            // The entries up to the highest registered id, as many as a Medium carries.
            let sig = &self.ep.hello_signature;
            let used = sig.iter().rposition(|&h| h != 0).map_or(0, |i| i + 1);
            let signature: Vec<u8> = sig[..used.min(self.ep.limits.max_medium / 2)]
                .iter()
                .flat_map(|h| h.to_le_bytes())
                .collect();
            self.send_system(0, hello, &signature, None)?;
            self.wait_until_ep(|ep| ep.hello.result.is_some())?;
            self.ep.hello.result.unwrap_or(HelloVerdict::Ok)
        };
        match verdict {
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
        }
    }

    /// This rank.
    #[inline]
    pub fn rank(&self) -> Rank {
        self.ep.rank
    }

    /// Number of ranks.
    #[inline]
    pub fn size(&self) -> u32 {
        self.ep.size
    }

    /// The transport's size limits (`max_args`, `max_medium`, `max_long`).
    #[inline]
    pub fn limits(&self) -> Limits {
        self.ep.limits
    }

    /// The most arguments per AM.
    pub fn max_args(&self) -> usize {
        self.ep.limits.max_args
    }

    /// The largest AM Medium payload.
    pub fn max_medium(&self) -> usize {
        self.ep.limits.max_medium
    }

    /// The largest AM Long payload.
    pub fn max_long(&self) -> usize {
        self.ep.limits.max_long
    }

    /// The configuration the node runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The local segment: what put, get and Long target on this rank. Peers write it at any
    /// time, so it is a view that reads and writes by copies and atomics
    /// ([`SharedBytes`](crate::transport::SharedBytes)), never a `&[u8]`.
    ///
    /// ```
    /// # let t = am_core::Loopback::cluster(1, am_core::LoopbackConfig::default()).remove(0);
    /// # let node = am_core::Node::new(t, am_core::Handlers::new(), am_core::Config::default()).unwrap();
    /// let seg = node.segment();
    /// seg.write(0, b"hello").unwrap();
    /// seg.store_u64(8, 42).unwrap();
    /// let mut back = [0u8; 5];
    /// seg.read(0, &mut back).unwrap();
    /// assert_eq!((&back, seg.load_u64(8).unwrap()), (b"hello", 42));
    /// ```
    pub fn segment(&self) -> crate::transport::SharedBytes<'_> {
        self.transport.segment()
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.transport
    }

    /// Whether a Long of `len` bytes has landed in the target's segment once a request for it
    /// was sent ([`Transport::long_placed_on_send`]).
    pub fn long_placed_on_send(&self, len: usize) -> bool {
        self.transport.long_placed_on_send(len)
    }

    /// Credits available now for requests to `peer`.
    pub fn credits_available(&self, peer: Rank) -> u32 {
        self.ep.credits.available(peer)
    }

    /// The credit policy, to inspect (for example [`CreditPolicy::held`] and
    /// [`CreditPolicy::banked`]).
    pub fn credit_policy(&self) -> &dyn CreditPolicy {
        &*self.ep.credits
    }

    /// Runs handlers for the messages that have arrived and resends replies the device refused.
    /// Returns how many messages were handled.
    ///
    /// An error names its cause; the message that caused it is dropped and polling can go on
    /// (for example after [`AmError::PeerMisbehaved`]).
    pub fn poll(&mut self) -> Result<usize, AmError> {
        // Bounded, so a flood from one peer cannot starve the caller.
        self.poll_up_to(64)
    }

    fn poll_up_to(&mut self, max: usize) -> Result<usize, AmError> {
        match self.poll_inner(max) {
            // A clean departure is not an error of this poll: only the calls that wait for
            // that peer fail (they check `Endpoint::is_departed`).
            Err(AmError::PeerDeparted(peer)) => {
                self.ep.mark_departed(peer);
                Ok(0)
            }
            r => r.inspect_err(|e| {
                if let AmError::PeerLost(peer) = e {
                    self.ep.mark_lost(*peer);
                }
            }),
        }
    }

    fn poll_inner(&mut self, max: usize) -> Result<usize, AmError> {
        if !self.ep.pending.is_empty() {
            self.ep.flush_pending(&mut self.transport)?;
        }
        let mut handled = 0;
        while handled < max {
            let ep = &mut self.ep;
            match self
                .transport
                .poll_recv(|d, segment, tx| ep.dispatch(d, segment, tx))?
            {
                None => break,
                Some(result) => {
                    handled += 1;
                    if let Some(code) = self.ep.exit_requested {
                        self.terminate(code);
                    }
                    result?;
                }
            }
        }
        Ok(handled)
    }

    /// Polls until `done()` is true, waiting between polls as the wait mode says.
    pub fn wait_until(&mut self, mut done: impl FnMut() -> bool) -> Result<(), AmError> {
        let mut idle = 0;
        while !done() {
            self.progress(&mut idle)?;
        }
        Ok(())
    }

    fn wait_until_ep(&mut self, mut done: impl FnMut(&Endpoint) -> bool) -> Result<(), AmError> {
        let mut idle = 0;
        while !done(&self.ep) {
            self.progress(&mut idle)?;
        }
        Ok(())
    }

    /// One step of every blocking loop: poll, and wait as the wait mode says if nothing came.
    #[inline]
    /// One step of a blocking loop: handles at most one message, so the caller re-checks its
    /// condition (a reply arrived, a credit came back) as soon as it may hold, without a
    /// further empty poll on the critical path.
    fn progress(&mut self, idle: &mut u32) -> Result<(), AmError> {
        if self.poll_up_to(1)? == 0 {
            self.idle(idle)
        } else {
            *idle = 0;
            Ok(())
        }
    }

    fn idle(&mut self, idle: &mut u32) -> Result<(), AmError> {
        *idle = idle.saturating_add(1);
        if *idle < self.config.spin_polls || self.config.wait_mode == WaitMode::Spin {
            std::hint::spin_loop();
            return Ok(());
        }
        match self.config.wait_mode {
            WaitMode::Spin => {}
            WaitMode::SpinThenYield => std::thread::yield_now(),
            WaitMode::Block => {
                if let Err(e) = self.transport.wait(self.config.block_timeout) {
                    // What the transport found while waiting counts as found by a poll.
                    match e {
                        TransportError::PeerDeparted(peer) => {
                            self.ep.mark_departed(peer);
                            return Ok(());
                        }
                        TransportError::PeerLost(peer) => {
                            self.ep.mark_lost(peer);
                        }
                        _ => {}
                    }
                    return Err(e.into());
                }
            }
        }
        Ok(())
    }

    fn check_request(
        &self,
        dest: Rank,
        kind: AmKind,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Result<(), AmError> {
        if dest >= self.ep.size {
            return Err(AmError::InvalidRank {
                rank: dest,
                size: self.ep.size,
            });
        }
        if self.ep.is_lost(dest) {
            return Err(AmError::PeerLost(dest));
        }
        check_message(&self.ep.limits, kind, args, payload.len())?;
        if self.ep.handlers.meta[handler.0 as usize] != Some((Category::Request, kind)) {
            return Err(AmError::NotRegistered {
                handler,
                category: Category::Request,
                kind,
            });
        }
        if let Some(offset) = long_offset {
            self.check_segment(offset as u64, payload.len() as u64)?;
        }
        Ok(())
    }

    fn out_of_bounds(&self, offset: usize, len: usize) -> AmError {
        AmError::SegmentOutOfBounds {
            offset: offset as u64,
            len: len as u64,
            size: self.transport.segment().len(),
        }
    }

    fn check_segment(&self, offset: u64, len: u64) -> Result<(), AmError> {
        // Segment sizes agree across ranks (checked at start-up), so the local size bounds
        // every target's segment.
        match segment_range(offset, len, self.ep.seg_len) {
            Some(_) => Ok(()),
            None => Err(AmError::SegmentOutOfBounds {
                offset,
                len,
                size: self.ep.seg_len,
            }),
        }
    }

    /// One attempt: `Ok(false)` if out of credit or the device is busy.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn try_send_request(
        &mut self,
        dest: Rank,
        system: bool,
        kind: AmKind,
        handler: u8,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Result<bool, AmError> {
        if !self.ep.credits.try_acquire(dest) {
            return Ok(false);
        }
        let header = Header {
            category: Category::Request,
            kind,
            system,
            handler,
            nargs: args.len() as u8,
            credit: self.ep.credits.request_hint(dest),
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
        match self.transport.try_send(dest, &out) {
            Ok(()) => Ok(true),
            Err(SendError::Busy) => {
                self.ep.credits.cancel(dest);
                Ok(false)
            }
            Err(e) => {
                self.ep.credits.cancel(dest);
                match e {
                    SendError::PeerLost(peer) => {
                        self.ep.mark_lost(peer);
                    }
                    SendError::PeerDeparted(peer) => {
                        self.ep.mark_departed(peer);
                    }
                    _ => {}
                }
                Err(AmError::from(TransportError::from(e)))
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn send_blocking(
        &mut self,
        dest: Rank,
        system: bool,
        kind: AmKind,
        handler: u8,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Result<(), AmError> {
        let mut idle = 0;
        loop {
            if self.ep.is_lost(dest) {
                return Err(AmError::PeerLost(dest));
            }
            if self.ep.is_departed(dest) {
                return Err(AmError::PeerDeparted(dest));
            }
            if self.try_send_request(dest, system, kind, handler, args, payload, long_offset)? {
                return Ok(());
            }
            self.progress(&mut idle)?;
        }
    }

    fn send_system(
        &mut self,
        dest: Rank,
        msg: SystemMsg,
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Result<(), AmError> {
        let w = msg.encode();
        debug_assert_eq!(w.category, Category::Request);
        self.send_blocking(dest, true, w.kind, w.opcode, w.args(), payload, long_offset)
    }

    /// Sends an AM Short request; polls while out of credit or the device is busy.
    #[inline]
    pub fn request_short(
        &mut self,
        dest: Rank,
        handler: HandlerId,
        args: &[u32],
    ) -> Result<(), AmError> {
        self.check_request(dest, AmKind::Short, handler, args, &[], None)?;
        self.send_blocking(dest, false, AmKind::Short, handler.0, args, &[], None)
    }

    /// Sends an AM Medium request (payload up to [`Node::max_medium`]).
    pub fn request_medium(
        &mut self,
        dest: Rank,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
    ) -> Result<(), AmError> {
        self.check_request(dest, AmKind::Medium, handler, args, payload, None)?;
        self.send_blocking(dest, false, AmKind::Medium, handler.0, args, payload, None)
    }

    /// Sends an AM Long request: `payload` lands at `offset` in `dest`'s segment, then the
    /// handler runs there.
    pub fn request_long(
        &mut self,
        dest: Rank,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
        offset: usize,
    ) -> Result<(), AmError> {
        self.check_request(dest, AmKind::Long, handler, args, payload, Some(offset))?;
        self.send_blocking(
            dest,
            false,
            AmKind::Long,
            handler.0,
            args,
            payload,
            Some(offset),
        )
    }

    fn try_request(
        &mut self,
        dest: Rank,
        kind: AmKind,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Result<(), TryRequestError> {
        self.check_request(dest, kind, handler, args, payload, long_offset)?;
        if self.try_send_request(dest, false, kind, handler.0, args, payload, long_offset)? {
            Ok(())
        } else {
            Err(TryRequestError::WouldBlock)
        }
    }

    /// Sends an AM Short request if a credit and device space are available now; otherwise
    /// [`TryRequestError::WouldBlock`] and nothing was sent. Does not poll.
    pub fn try_request_short(
        &mut self,
        dest: Rank,
        handler: HandlerId,
        args: &[u32],
    ) -> Result<(), TryRequestError> {
        self.try_request(dest, AmKind::Short, handler, args, &[], None)
    }

    /// Non-blocking AM Medium request, as [`Node::try_request_short`].
    pub fn try_request_medium(
        &mut self,
        dest: Rank,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
    ) -> Result<(), TryRequestError> {
        self.try_request(dest, AmKind::Medium, handler, args, payload, None)
    }

    /// Non-blocking AM Long request, as [`Node::try_request_short`].
    pub fn try_request_long(
        &mut self,
        dest: Rank,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
        offset: usize,
    ) -> Result<(), TryRequestError> {
        self.try_request(dest, AmKind::Long, handler, args, payload, Some(offset))
    }

    /// Waits until every rank has called `barrier` as often as this one (a dissemination
    /// barrier over AMs: ⌈log2 N⌉ rounds of one request each).
    ///
    /// A barrier that returned an error can be called again: it resumes where it stopped
    /// (the other ranks are still in it), sending nothing twice. After an error that lasts
    /// (a lost peer, an aborted job) the retry fails the same way.
    pub fn barrier(&mut self) -> Result<(), AmError> {
        let mut at = match self.ep.barrier_resume.take() {
            Some(at) => at,
            None => {
                let epoch = self.ep.barrier_epoch;
                self.ep.barrier_epoch += 1;
                BarrierAt {
                    epoch,
                    round: 0,
                    sent: false,
                }
            }
        };
        let size = self.ep.size;
        while let Some(distance) = 1u32.checked_shl(u32::from(at.round)).filter(|&d| d < size) {
            let to = (self.ep.rank + distance) % size;
            let (epoch, round) = (at.epoch, at.round);
            if !at.sent {
                if let Err(e) = self.send_system(to, SystemMsg::Barrier { epoch, round }, &[], None)
                {
                    self.ep.barrier_resume = Some(at);
                    return Err(e);
                }
                at.sent = true;
            }
            let key = (epoch, round);
            // This round's arrival comes from the rank `distance` before us.
            let from = (self.ep.rank + size - distance % size) % size;
            let waited = self
                .wait_until_ep(|ep| ep.barrier_arrivals.contains_key(&key) || ep.is_departed(from));
            let waited = waited.and_then(|()| {
                if self.ep.barrier_arrivals.contains_key(&key) {
                    Ok(())
                } else {
                    Err(AmError::PeerDeparted(from))
                }
            });
            if let Err(e) = waited {
                self.ep.barrier_resume = Some(at);
                return Err(e);
            }
            if let Some(n) = self.ep.barrier_arrivals.get_mut(&key) {
                *n -= 1;
                if *n == 0 {
                    self.ep.barrier_arrivals.remove(&key);
                }
            }
            at.round += 1;
            at.sent = false;
        }
        Ok(())
    }

    /// Starts writing `data` into `dest`'s segment at `offset`; returns at once (after polling
    /// for credit if needed). Local puts complete immediately.
    pub fn put_nb(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<PutHandle, AmError> {
        if dest >= self.ep.size {
            return Err(AmError::InvalidRank {
                rank: dest,
                size: self.ep.size,
            });
        }
        self.check_segment(offset as u64, data.len() as u64)?;
        if self.ep.is_lost(dest) {
            return Err(AmError::PeerLost(dest));
        }
        if self.ep.is_departed(dest) {
            return Err(AmError::PeerDeparted(dest));
        }
        let (index, gen) = self.ep.alloc_op(dest, Vec::new());
        if dest == self.ep.rank {
            self.transport
                .segment()
                .write(offset, data)
                .map_err(|_| self.out_of_bounds(offset, data.len()))?;
            return Ok(PutHandle { index, gen });
        }
        let chunk = self.ep.limits.max_long.max(1);
        for (i, part) in data.chunks(chunk).enumerate() {
            if let Some(slot) = self.ep.op(index, gen) {
                slot.outstanding += 1;
            }
            let at = offset + i * chunk;
            if let Err(e) = self.send_system(dest, SystemMsg::Put { op: index }, part, Some(at)) {
                if let Some(slot) = self.ep.op(index, gen) {
                    slot.outstanding -= 1;
                }
                self.abandon(index, gen);
                return Err(e);
            }
        }
        Ok(PutHandle { index, gen })
    }

    /// Starts reading `len` bytes at `offset` of `src`'s segment.
    pub fn get_nb(&mut self, src: Rank, offset: usize, len: usize) -> Result<GetHandle, AmError> {
        if src >= self.ep.size {
            return Err(AmError::InvalidRank {
                rank: src,
                size: self.ep.size,
            });
        }
        self.check_segment(offset as u64, len as u64)?;
        if self.ep.is_lost(src) {
            return Err(AmError::PeerLost(src));
        }
        if self.ep.is_departed(src) {
            return Err(AmError::PeerDeparted(src));
        }
        if src == self.ep.rank {
            let mut data = vec![0; len];
            self.transport
                .segment()
                .read(offset, &mut data)
                .map_err(|_| self.out_of_bounds(offset, len))?;
            let (index, gen) = self.ep.alloc_op(src, data);
            return Ok(GetHandle { index, gen });
        }
        let (index, gen) = self.ep.alloc_op(src, vec![0; len]);
        let chunk = self.ep.limits.max_medium.max(1);
        let mut at = 0;
        while at < len {
            let n = chunk.min(len - at);
            if let Some(slot) = self.ep.op(index, gen) {
                slot.outstanding += 1;
            }
            let get = SystemMsg::Get {
                op: index,
                offset: (offset + at) as u64,
                len: n as u32,
                at: at as u64,
            };
            if let Err(e) = self.send_system(src, get, &[], None) {
                if let Some(slot) = self.ep.op(index, gen) {
                    slot.outstanding -= 1;
                }
                self.abandon(index, gen);
                return Err(e);
            }
            at += n;
        }
        Ok(GetHandle { index, gen })
    }

    /// Completes an operation that failed part-way: waits for the chunks already sent, so no
    /// late reply lands in a reused slot.
    fn abandon(&mut self, index: u32, gen: u32) {
        let _ = self.wait_op(index, gen);
    }

    fn wait_op(&mut self, index: u32, gen: u32) -> Result<Vec<u8>, AmError> {
        let mut idle = 0;
        loop {
            match self.ep.op(index, gen) {
                None => return Err(AmError::StaleHandle),
                Some(slot) if slot.outstanding == 0 => return self.ep.finish_op(index),
                Some(_) => {}
            }
            self.progress(&mut idle)?;
        }
    }

    /// True once a put has completed remotely (polls once).
    pub fn test_put(&mut self, handle: &PutHandle) -> Result<bool, AmError> {
        self.poll()?;
        Ok(self
            .ep
            .op(handle.index, handle.gen)
            .is_none_or(|s| s.outstanding == 0))
    }

    /// Waits until a put has landed in the target's segment.
    pub fn wait_put(&mut self, handle: PutHandle) -> Result<(), AmError> {
        self.wait_op(handle.index, handle.gen).map(|_| ())
    }

    /// Waits for a get and returns its data.
    pub fn wait_get(&mut self, handle: GetHandle) -> Result<Vec<u8>, AmError> {
        self.wait_op(handle.index, handle.gen)
    }

    /// Writes `data` into `dest`'s segment at `offset` and waits until it is there.
    pub fn put(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<(), AmError> {
        let h = self.put_nb(dest, offset, data)?;
        self.wait_put(h)
    }

    /// Reads `len` bytes at `offset` of `src`'s segment.
    pub fn get(&mut self, src: Rank, offset: usize, len: usize) -> Result<Vec<u8>, AmError> {
        let h = self.get_nb(src, offset, len)?;
        self.wait_get(h)
    }

    /// Waits until every request this rank sent has been answered and every refused reply has
    /// gone out. Run before dropping a node so that peers are not left without their replies.
    pub fn quiesce(&mut self) -> Result<(), AmError> {
        self.wait_until_ep(|ep| ep.is_quiet())
    }

    /// Ends the whole job with `code` (GASNet's `gasnet_exit`): tells every other rank, which
    /// exits with the same code at its next poll, then exits this process.
    ///
    /// With ranks as threads ([`crate::Loopback`]) this ends the whole process at once.
    pub fn exit(mut self, code: i32) -> ! {
        let deadline = Instant::now() + Duration::from_secs(1);
        for r in 0..self.ep.size {
            if r == self.ep.rank {
                continue;
            }
            // Best effort and bounded: a dead or stuck peer must not keep this rank alive.
            let exit = SystemMsg::Exit { code }.encode();
            while Instant::now() < deadline {
                match self.try_send_request(r, true, exit.kind, exit.opcode, exit.args(), &[], None)
                {
                    Ok(true) | Err(_) => break,
                    Ok(false) => {
                        let _ = self.ep.flush_pending(&mut self.transport);
                        let ep = &mut self.ep;
                        let _ = self
                            .transport
                            .poll_recv(|d, segment, tx| ep.dispatch(d, segment, tx));
                        std::thread::yield_now();
                    }
                }
            }
        }
        self.terminate(code)
    }

    fn terminate(&mut self, code: i32) -> ! {
        let _ = self.ep.flush_pending(&mut self.transport);
        self.transport.close();
        std::process::exit(code)
    }
}

impl<T: Transport> Drop for Node<T> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        // Let peers get the replies they are owed and ours arrive, but never hang forever.
        let deadline = Instant::now() + QUIESCE_LIMIT;
        while Instant::now() < deadline && !self.ep.is_quiet() {
            match self.poll() {
                Ok(0) => std::thread::yield_now(),
                Ok(_) => {}
                // A misbehaving or lost peer does not stop the others' replies from mattering.
                Err(AmError::PeerMisbehaved { .. })
                | Err(AmError::PeerLost(_))
                | Err(AmError::PeerDeparted(_)) => {}
                Err(_) => return,
            }
        }
    }
}

impl<T: Transport> std::fmt::Debug for Node<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("transport", &self.transport.name())
            .field("rank", &self.ep.rank)
            .field("size", &self.ep.size)
            .finish()
    }
}
