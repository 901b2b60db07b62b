//! [`Node`]: one rank of a job, driving the protocol [`Endpoint`] with a [`Transport`].

use std::task::Poll;
use std::time::{Duration, Instant};

use crate::atomic::{AtomicOp, AtomicWord};
use crate::config::{Config, WaitMode};
use crate::credit::{CreditPolicy, Policy};
use crate::endpoint::{AtomicHandle, Endpoint, GetHandle, Polled, PutHandle};
use crate::error::{AmError, StartError, TryRequestError};
use crate::handler::{Handlers, Sendable, Threading};
use crate::transport::{Armed, Capabilities, Limits, Transport};
use crate::types::{AmKind, HandlerId, Rank};

/// One rank of a job: the handler table, credits and progress engine over a transport.
///
/// Handlers run only inside [`Node::poll`] and inside the blocking calls, which poll while they
/// wait, on the thread that calls them. A rank that never polls never runs handlers, so
/// replies to its peers stall.
///
/// A node built on [`Handlers::new`] (`Send` handlers) is `Send` whenever its transport is
/// (every transport of this workspace is): it may move to another thread between calls. One
/// built on [`Handlers::local`] stays on its thread ([`Threading`]). A node is not `Sync`
/// in either case: one thread at a time drives it, through `&mut`.
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
///     let mut handlers = Handlers::local();
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
pub struct Node<T: Transport, H: Threading = Sendable> {
    pub(crate) transport: T,
    pub(crate) ep: Endpoint<H>,
    pub(crate) config: Config,
}

/// How long a dropping node waits for the replies to its last requests.
const QUIESCE_LIMIT: Duration = Duration::from_secs(30);

/// A get into a buffer of the caller's in flight ([`Node::get_into_nb`]): the buffer is
/// borrowed until [`Node::wait_get_into`] fills it.
#[derive(Debug)]
#[must_use = "the buffer holds the get's bytes only once waited for"]
pub struct GetIntoHandle<'b> {
    dst: &'b mut [u8],
    /// The get by messages still to complete; `None` once the bytes are in `dst`.
    pending: Option<GetHandle>,
}

impl<T: Transport, H: Threading> Node<T, H> {
    /// Starts a node with the credit policy of `config` ([`crate::Credits`]).
    ///
    /// This is collective: every rank must call it. It checks that every rank registered the
    /// same handler table and segment size, and fails on all ranks with a clear error otherwise.
    /// [`Node::config`]'s credits are then the ones in force: those `config` chose, or the
    /// transport's own ([`Transport::default_credits`]).
    pub fn new(transport: T, handlers: Handlers<H>, config: Config) -> Result<Self, StartError> {
        let (config, policy) = Self::policy(&transport, config)?;
        Self::start(transport, handlers, config, policy)
    }

    /// The credit policy `config` asks for, or the transport's own, on `transport`; and
    /// `config` naming the credits in force.
    fn policy(transport: &T, config: Config) -> Result<(Config, Policy), StartError> {
        let credits = config
            .credits
            .unwrap_or_else(|| transport.default_credits());
        let policy = credits
            .build(transport.size(), transport.limits().max_credits)
            .map_err(|why| StartError::Config(format!("{} transport: {why}", transport.name())))?;
        let config = Config {
            credits: Some(credits),
            ..config
        };
        Ok((config, policy))
    }

    /// Starts a node with a custom credit policy. Collective, like [`Node::new`].
    pub fn with_credit_policy(
        transport: T,
        handlers: Handlers<H>,
        config: Config,
        credits: Box<dyn CreditPolicy + Send>,
    ) -> Result<Self, StartError> {
        Self::start(transport, handlers, config, Policy::Custom(credits))
    }

    /// Starts the nodes of several endpoints of this process from this one thread (each of
    /// [`Node::new`] alone would wait for the others' start-up, which only this thread
    /// drives), with the credit policy of `config` for each. Collective, like [`Node::new`]:
    /// every rank of the job starts its node, by `new` or here. The nodes come back in the
    /// order of `parts`.
    pub fn start_all(
        parts: impl IntoIterator<Item = (T, Handlers<H>)>,
        config: Config,
    ) -> Result<Vec<Self>, StartError> {
        let mut nodes = Vec::new();
        for (transport, handlers) in parts {
            let (config, policy) = Self::policy(&transport, config.clone())?;
            nodes.push(Self::unstarted(transport, handlers, config, policy));
        }
        let mut started = vec![false; nodes.len()];
        let mut idle = 0u32;
        while started.contains(&false) {
            let mut progressed = false;
            for (node, started) in nodes.iter_mut().zip(started.iter_mut()) {
                if !*started && node.start_step()? {
                    *started = true;
                    progressed = true;
                }
                // A started node still polls: the others' start-ups may wait for what only
                // its progress sends (an answer held back, a retransmission).
                progressed |= node.poll_once()?;
            }
            idle = if progressed {
                0
            } else {
                idle.saturating_add(1)
            };
            if idle > nodes.len() as u32 * 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        Ok(nodes)
    }

    fn start(
        transport: T,
        handlers: Handlers<H>,
        config: Config,
        credits: Policy,
    ) -> Result<Self, StartError> {
        let mut node = Self::unstarted(transport, handlers, config, credits);
        let mut idle = 0;
        while !node.start_step()? {
            node.progress(&mut idle)?;
        }
        Ok(node)
    }

    fn unstarted(transport: T, handlers: Handlers<H>, config: Config, credits: Policy) -> Self {
        let ep = Endpoint::with_policy(
            transport.rank(),
            transport.size(),
            transport.limits(),
            transport.segment().len(),
            handlers,
            credits,
        );
        Node {
            transport,
            ep,
            config,
        }
    }

    /// One step of start-up (no rank sends a user message before it has heard that all
    /// agree): whether it is over.
    fn start_step(&mut self) -> Result<bool, StartError> {
        match self.ep.start_step(&mut self.transport) {
            Poll::Ready(r) => {
                r?;
                // After start-up, which ends with every credit home.
                let coalesce = self.transport.capabilities().acks_coalesce;
                self.ep.set_acks_coalesce(coalesce);
                Ok(true)
            }
            Poll::Pending => Ok(false),
        }
    }

    /// This rank.
    #[inline]
    pub fn rank(&self) -> Rank {
        self.ep.rank()
    }

    /// Number of ranks.
    #[inline]
    pub fn size(&self) -> u32 {
        self.ep.size()
    }

    /// The transport's size limits (`max_args`, `max_medium`, `max_long`).
    #[inline]
    pub fn limits(&self) -> Limits {
        self.ep.limits()
    }

    /// The most arguments per AM.
    pub fn max_args(&self) -> usize {
        self.ep.limits().max_args
    }

    /// The largest AM Medium payload.
    pub fn max_medium(&self) -> usize {
        self.ep.limits().max_medium
    }

    /// The largest AM Long payload.
    pub fn max_long(&self) -> usize {
        self.ep.limits().max_long
    }

    /// The configuration the node runs with.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Waits as `mode` says from now on (a runtime that spins through a phase of fine-grained
    /// traffic and sleeps through a phase of computation).
    pub fn set_wait_mode(&mut self, mode: WaitMode) {
        self.config.wait_mode = mode;
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

    /// The transport, mutably: for what a transport offers beyond [`Transport`] (a floor
    /// measured on the same endpoint, a statistic that resets). Messages sent or received
    /// through it behind the node's back are not counted in the node's credits and replies:
    /// use the node for those.
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    /// The protocol state this node drives (see [`crate::endpoint`]).
    pub fn endpoint(&self) -> &Endpoint<H> {
        &self.ep
    }

    /// What the transport's NIC does itself ([`Transport::capabilities`]).
    pub fn capabilities(&self) -> Capabilities {
        self.transport.capabilities()
    }

    /// Whether a Long of `len` bytes has landed in the target's segment once a request for it
    /// was sent ([`Capabilities::long_placed_on_send`]).
    pub fn long_placed_on_send(&self, len: usize) -> bool {
        self.transport.capabilities().long_placed_on_send(len)
    }

    /// Credits available now for requests to `peer`.
    pub fn credits_available(&self, peer: Rank) -> u32 {
        self.ep.credits().available(peer)
    }

    /// The credit policy, to inspect (for example [`CreditPolicy::held`] and
    /// [`CreditPolicy::banked`]).
    pub fn credit_policy(&self) -> &dyn CreditPolicy {
        self.ep.credits()
    }

    /// Runs handlers for the messages that have arrived and resends replies the device refused.
    /// Returns how many messages were handled.
    ///
    /// An error names its cause; the message that caused it is dropped and polling can go on
    /// (for example after [`AmError::PeerMisbehaved`]).
    pub fn poll(&mut self) -> Result<usize, AmError> {
        // A rank that only polls may wait on what its posted atomics cause.
        if let Poll::Ready(Err(e)) = self.ep.apply_posted(&mut self.transport) {
            return Err(e);
        }
        // Bounded, so a flood from one peer cannot starve the caller.
        self.poll_up_to(64)
    }

    fn poll_up_to(&mut self, max: usize) -> Result<usize, AmError> {
        let mut handled = 0;
        while handled < max && self.poll_once()? {
            handled += 1;
        }
        if handled == max {
            // Stopped with more to handle: what the handlers sent leaves now all the same.
            self.transport.flush();
        }
        Ok(handled)
    }

    /// Handles at most one message (after the replies the device refused): whether one was.
    /// A peer's exit ends this process here.
    #[inline]
    fn poll_once(&mut self) -> Result<bool, AmError> {
        match self.ep.poll_one(&mut self.transport)? {
            Polled::Idle => Ok(false),
            Polled::Handled => Ok(true),
            Polled::Exit(code) => self.terminate(code),
        }
    }

    /// The file descriptor an event loop watches between [`Node::arm`] and [`Node::disarm`]
    /// ([`Transport::wake_fd`]): valid while the node lives. `None` if the transport has
    /// none; a driver then polls without sleeping.
    pub fn wake_fd(&mut self) -> Result<Option<std::os::fd::BorrowedFd<'_>>, AmError> {
        self.transport.wake_fd().map_err(AmError::from)
    }

    /// Prepares to sleep on [`Node::wake_fd`] (UCX's `ucp_worker_arm`): [`Armed::Ready`] if
    /// there is work for a poll now, else [`Armed::Sleep`] with the longest the sleep may
    /// last. Call it after a [`Node::poll`] that handled nothing; after the sleep (the fd
    /// readable, or the time up) call [`Node::disarm`] and poll again. An armed node costs
    /// its peers one wake-up per sleep, never one per message.
    ///
    /// Sends this node holds back (replies the device refused while a peer's queue was full,
    /// posted atomics) shorten the sleep to [`Config::block_timeout`]: a peer that makes room
    /// does not wake this rank.
    pub fn arm(&mut self) -> Result<Armed, AmError> {
        match self.transport.arm() {
            Ok(Armed::Sleep(within)) if self.ep.sends_held() => {
                Ok(Armed::Sleep(within.min(self.config.block_timeout)))
            }
            Ok(armed) => Ok(armed),
            Err(e) => {
                self.transport.disarm();
                match self.ep.absorb(e.into()) {
                    Some(e) => Err(e),
                    None => Ok(Armed::Ready),
                }
            }
        }
    }

    /// Ends a sleep begun by [`Node::arm`] ([`Transport::disarm`]).
    pub fn disarm(&mut self) {
        self.transport.disarm();
    }

    /// Polls until `done()` is true, waiting between polls as the wait mode says.
    ///
    /// Fails with [`AmError::PeerDeparted`] or [`AmError::PeerLost`] if a peer this rank
    /// still awaits replies from has left the job or died (those replies will never come),
    /// rather than waiting for ever; once per such peer, so a later wait for other peers
    /// goes on.
    pub fn wait_until(&mut self, mut done: impl FnMut() -> bool) -> Result<(), AmError> {
        self.drive(|ep, t| ep.apply_posted(t))?;
        let mut idle = 0;
        let mut checked = 0;
        let mut polled = false;
        while !done() {
            self.check_gone(&mut checked)?;
            self.progress(&mut idle)?;
            polled = true;
        }
        if polled {
            self.transport.flush();
        }
        Ok(())
    }

    /// A wait's check for peers gone while replies from them are owed: fails once per such
    /// peer. `checked` is how many gone peers the wait has looked at so far (start at 0:
    /// with none gone there is nothing to look at), so the scan runs only when one more went.
    #[inline]
    fn check_gone(&mut self, checked: &mut u32) -> Result<(), AmError> {
        let gone = self.ep.gone_count();
        if gone != *checked {
            *checked = gone;
            if let Some(e) = self.ep.take_unanswerable() {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Up to `polls` polls with no wait in between, ending early once `done()` is true or a
    /// poll finds nothing: whether `done()` is true, and how many messages were handled. A
    /// peer gone while replies from it are owed fails it, as in [`Node::wait_until`]
    /// (`checked` carries that check from one call of a wait to the next). For drivers that
    /// wait elsewhere ([`crate::SharedNode`], between its turns at the node).
    pub(crate) fn poll_until(
        &mut self,
        done: &mut impl FnMut() -> bool,
        polls: u32,
        checked: &mut u32,
    ) -> Result<(bool, u32), AmError> {
        if let Poll::Ready(Err(e)) = self.ep.apply_posted(&mut self.transport) {
            return Err(e);
        }
        let mut handled = 0;
        while !done() {
            self.check_gone(checked)?;
            if handled == polls {
                // The node goes back with work left: what the handlers sent leaves now.
                self.transport.flush();
                return Ok((false, handled));
            }
            if !self.poll_once()? {
                return Ok((false, handled));
            }
            handled += 1;
        }
        if handled > 0 {
            self.transport.flush();
        }
        Ok((true, handled))
    }

    /// Runs a step of the endpoint until it is ready, making progress in between.
    #[inline(always)]
    fn drive<R>(
        &mut self,
        mut step: impl FnMut(&mut Endpoint<H>, &mut T) -> Poll<Result<R, AmError>>,
    ) -> Result<R, AmError> {
        let mut idle = 0;
        loop {
            if let Poll::Ready(r) = step(&mut self.ep, &mut self.transport) {
                return r;
            }
            self.progress(&mut idle)?;
        }
    }

    /// [`Node::drive`] of a wait for completion (an operation's answer, the quiet): once it
    /// is over, what the handlers run meanwhile sent leaves ([`Transport::flush`]) rather than
    /// waiting for the caller's next poll. Sends are driven without it, so that a stream of
    /// them, waiting only for credits, keeps packing.
    fn drive_to_completion<R>(
        &mut self,
        step: impl FnMut(&mut Endpoint<H>, &mut T) -> Poll<Result<R, AmError>>,
    ) -> Result<R, AmError> {
        let r = self.drive(step);
        self.transport.flush();
        r
    }

    /// One step of a blocking loop: handles at most one message, so the caller re-checks its
    /// condition (a reply arrived, a credit came back) as soon as it may hold, without a
    /// further empty poll on the critical path; waits as the wait mode says if nothing came.
    #[inline]
    fn progress(&mut self, idle: &mut u32) -> Result<(), AmError> {
        match self.poll_once() {
            Ok(true) => {
                *idle = 0;
                Ok(())
            }
            Ok(false) => self.idle(idle),
            Err(e) => Err(e),
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
                    if let Some(e) = self.ep.absorb(e.into()) {
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends a checked request, polling while out of credit or the device is busy. Always
    /// inlined: each request kind then keeps its constants, and the round trip its speed.
    #[inline(always)]
    fn send_blocking(
        &mut self,
        dest: Rank,
        kind: AmKind,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Result<(), AmError> {
        self.ep
            .check_request(dest, kind, handler, args, payload.len(), long_offset)?;
        self.drive(|ep, t| ep.request_step(t, dest, kind, handler, args, payload, long_offset))
    }

    /// Sends an AM Short request; polls while out of credit or the device is busy.
    #[inline]
    pub fn request_short(
        &mut self,
        dest: Rank,
        handler: HandlerId,
        args: &[u32],
    ) -> Result<(), AmError> {
        self.send_blocking(dest, AmKind::Short, handler, args, &[], None)
    }

    /// Sends an AM Medium request (payload up to [`Node::max_medium`]).
    pub fn request_medium(
        &mut self,
        dest: Rank,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
    ) -> Result<(), AmError> {
        self.send_blocking(dest, AmKind::Medium, handler, args, payload, None)
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
        self.send_blocking(dest, AmKind::Long, handler, args, payload, Some(offset))
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
        self.ep
            .check_request(dest, kind, handler, args, payload.len(), long_offset)?;
        let sent = self.ep.try_request(
            &mut self.transport,
            dest,
            kind,
            handler,
            args,
            payload,
            long_offset,
        )?;
        if sent {
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

    /// Calls `handler` on `dest` (registered with [`Handlers::callable`]) with `args` (at
    /// most 15) and `payload` (at most [`Node::max_medium`]), and waits for its answer: the
    /// arguments and payload it replied with ([`Reply`](crate::Reply)), with no reply handler
    /// of the caller's. Fails like a request, and with the peer's loss or departure if it
    /// goes before it answers.
    ///
    /// ```
    /// use am_core::{Config, HandlerId, Handlers, Loopback, Node};
    /// const SQUARE: HandlerId = HandlerId(1);
    /// am_core::run_ranks(Loopback::cluster(2, Default::default()), |t| {
    ///     let mut handlers = Handlers::new();
    ///     handlers.callable(SQUARE, "square", |msg, call| {
    ///         let x = msg.args()[0];
    ///         let _ = call.reply(&[x * x], &[]);
    ///     }).unwrap();
    ///     let mut node = Node::new(t, handlers, Config::default()).unwrap();
    ///     let peer = 1 - node.rank();
    ///     assert_eq!(node.call(peer, SQUARE, &[7], &[]).unwrap().args, [49]);
    ///     node.barrier().unwrap();
    /// });
    /// ```
    pub fn call(
        &mut self,
        dest: Rank,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
    ) -> Result<crate::Reply, AmError> {
        let (calls, number, words) = self.ep.open_call(dest, handler, args)?;
        let words = &words[..=args.len()];
        if let Err(e) = self.request_medium(dest, handler, words, payload) {
            calls.close(number);
            return Err(e);
        }
        let mut got = None;
        let waited = self.wait_until(|| {
            got = calls.take(number);
            got.is_some()
        });
        match (waited, got) {
            (_, Some(r)) => r,
            (Err(e), None) => {
                calls.close(number);
                Err(e)
            }
            (Ok(()), None) => Err(AmError::StaleHandle),
        }
    }

    /// Waits until every rank has called `barrier` as often as this one (a dissemination
    /// barrier over AMs: ⌈log2 N⌉ rounds of one request each).
    ///
    /// A barrier that returned an error can be called again: it resumes where it stopped
    /// (the other ranks are still in it), sending nothing twice. After an error that lasts
    /// (a lost peer, an aborted job) the retry fails the same way.
    pub fn barrier(&mut self) -> Result<(), AmError> {
        self.drive(|ep, t| ep.barrier_step(t))
    }

    /// Starts writing `data` into `dest`'s segment at `offset`. When this returns, `data` may
    /// be reused (local completion); the handle says when the bytes are in the target's
    /// segment (remote completion: [`Node::test_put`], [`Node::wait_put`]).
    ///
    /// Where the transport reaches the target's memory (the shared-memory NICs and
    /// [`crate::Loopback`]: [`Transport::put`]) the put is one copy into it, remotely
    /// complete when this returns, whether or not the target polls. Elsewhere it goes as AM
    /// Longs (polling for credit if needed) that the target's progress acknowledges. A put
    /// to this rank is a copy into its own segment. A range outside the segment is an error
    /// here, and nothing is written.
    ///
    /// Puts are not ordered with this rank's AMs or with each other; a later request to the
    /// target, a barrier or [`Node::quiesce`] after the completion publishes them.
    pub fn put_nb(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<PutHandle, AmError> {
        let h = self.drive(|ep, t| ep.put_start(t, dest, offset, data))?;
        match self.drive(|ep, t| ep.put_step(t, &h, data)) {
            Ok(()) => Ok(h),
            Err(e) => {
                self.abandon(h.index, h.gen);
                Err(e)
            }
        }
    }

    /// Sends the requests of a get by messages (none if it is complete already).
    fn get_sent(&mut self, h: GetHandle) -> Result<GetHandle, AmError> {
        match self.drive(|ep, t| ep.get_step(t, &h)) {
            Ok(()) => Ok(h),
            Err(e) => {
                self.abandon(h.index, h.gen);
                Err(e)
            }
        }
    }

    /// Starts reading `len` bytes at `offset` of `src`'s segment; [`Node::wait_get`] gives
    /// them. Where the transport reaches the target's memory ([`Transport::get`]) the bytes
    /// are read here, with no help from `src`, and the handle is complete; elsewhere `src`'s
    /// progress answers system messages for them. [`Node::get_into`] reads into a buffer of
    /// the caller's.
    pub fn get_nb(&mut self, src: Rank, offset: usize, len: usize) -> Result<GetHandle, AmError> {
        let h = self.drive(|ep, t| ep.get_start(t, src, offset, len))?;
        self.get_sent(h)
    }

    /// Completes an operation that failed part-way: waits for the chunks already sent, so no
    /// late reply lands in a reused slot.
    fn abandon(&mut self, index: u32, gen: u32) {
        let _ = self.wait_op(index, gen);
    }

    fn wait_op(&mut self, index: u32, gen: u32) -> Result<Vec<u8>, AmError> {
        self.drive_to_completion(|ep, _| ep.poll_op(index, gen))
    }

    /// True once a put has completed remotely (polls once).
    pub fn test_put(&mut self, handle: &PutHandle) -> Result<bool, AmError> {
        self.poll()?;
        Ok(self.ep.put_done(handle))
    }

    /// True once a get's data is here, for [`Node::wait_get`] to return at once (polls once).
    pub fn test_get(&mut self, handle: &GetHandle) -> Result<bool, AmError> {
        self.poll()?;
        Ok(self.ep.get_done(handle))
    }

    /// Waits until a put has landed in the target's segment.
    pub fn wait_put(&mut self, handle: PutHandle) -> Result<(), AmError> {
        self.wait_op(handle.index, handle.gen).map(|_| ())
    }

    /// Waits for a get and returns its data.
    pub fn wait_get(&mut self, handle: GetHandle) -> Result<Vec<u8>, AmError> {
        self.wait_op(handle.index, handle.gen)
    }

    /// Writes `data` into `dest`'s segment at `offset` and waits until it is there
    /// ([`Node::put_nb`]).
    pub fn put(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<(), AmError> {
        let h = self.put_nb(dest, offset, data)?;
        self.wait_put(h)
    }

    /// Reads `dst.len()` bytes at `offset` of `src`'s segment into `dst` and waits for them
    /// (see [`Node::get_nb`]): on the shared-memory NICs and loopback one copy from the
    /// target's memory, which the target does not take part in. A range outside the segment
    /// is an error, and `dst` is left as it was.
    pub fn get_into(&mut self, src: Rank, offset: usize, dst: &mut [u8]) -> Result<(), AmError> {
        let handle = self.get_into_nb(src, offset, dst)?;
        self.wait_get_into(handle)
    }

    /// Starts reading `dst.len()` bytes at `offset` of `src`'s segment into `dst`
    /// (OpenSHMEM's `shmem_getmem_nbi`): `dst` stays borrowed by the handle until
    /// [`Node::wait_get_into`], so several gets can be in flight into buffers of the caller's.
    /// Where the transport reaches the target's memory the bytes are in `dst` when this
    /// returns; elsewhere they are copied there by the wait. Errors as [`Node::get_into`].
    pub fn get_into_nb<'b>(
        &mut self,
        src: Rank,
        offset: usize,
        dst: &'b mut [u8],
    ) -> Result<GetIntoHandle<'b>, AmError> {
        let pending = match self.drive(|ep, t| ep.get_into_start(t, src, offset, dst))? {
            None => None,
            Some(h) => Some(self.get_sent(h)?),
        };
        Ok(GetIntoHandle { dst, pending })
    }

    /// True once a [`Node::get_into_nb`]'s bytes can be had without waiting (polls once).
    pub fn test_get_into(&mut self, handle: &GetIntoHandle<'_>) -> Result<bool, AmError> {
        match &handle.pending {
            None => Ok(true),
            Some(h) => self.test_get(h),
        }
    }

    /// Waits for a [`Node::get_into_nb`]: its buffer then holds the bytes (and is the
    /// caller's again).
    pub fn wait_get_into(&mut self, handle: GetIntoHandle<'_>) -> Result<(), AmError> {
        if let Some(h) = handle.pending {
            let data = self.wait_get(h)?;
            handle.dst.copy_from_slice(&data);
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` of `src`'s segment into a new `Vec` ([`Node::get_into`]).
    pub fn get(&mut self, src: Rank, offset: usize, len: usize) -> Result<Vec<u8>, AmError> {
        let h = self.get_nb(src, offset, len)?;
        self.wait_get(h)
    }

    /// Starts a remote atomic on the aligned `u32` or `u64` word at `offset` of `dest`'s
    /// segment ([`AtomicOp`]; see [`crate::atomic`] for the ordering). Where the transport
    /// reaches the target's memory (the shared-memory NICs and [`crate::Loopback`]) the atomic
    /// is one atomic instruction on the target's word, done when this returns, whether or not
    /// the target polls; elsewhere it travels as a system message that the target's progress
    /// applies. A word outside the segment or misaligned is an error here, and nothing is
    /// done.
    pub fn atomic_nb<W: AtomicWord>(
        &mut self,
        dest: Rank,
        offset: usize,
        op: AtomicOp<W>,
    ) -> Result<AtomicHandle<W>, AmError> {
        let h = self.drive(|ep, t| ep.atomic_start(t, dest, offset, op))?;
        match self.drive(|ep, t| ep.atomic_step(t, &h)) {
            Ok(()) => Ok(h),
            Err(e) => {
                let _ = self.wait_atomic(h);
                Err(e)
            }
        }
    }

    /// Posts a non-fetching remote atomic (OpenSHMEM's `shmem_atomic_xor` and kin; see
    /// [`Node::atomic_nb`] for the rest): it takes effect by the next [`Node::quiesce`] or
    /// [`Node::barrier`] at the latest (every rank leaving the barrier sees it), and before
    /// any later request, put, get or atomic of this rank to the same target, in the order
    /// posted. Where the transport applies atomics itself, posted ones
    /// go to it in batches of 64 ([`Transport::atomics`]) whose words it fetches first, so
    /// that a stream of them to random words keeps several memory misses in flight
    /// (RandomAccess `--mode atomic`); elsewhere they go out as messages nobody waits for,
    /// one per target for the (up to 64) atomics queued for it. Errors (a lost target) may
    /// come from the call that applies them.
    pub fn atomic_post<W: AtomicWord>(
        &mut self,
        dest: Rank,
        offset: usize,
        op: AtomicOp<W>,
    ) -> Result<(), AmError> {
        self.drive(|ep, t| ep.atomic_post(t, dest, offset, op))
    }

    /// Waits for an atomic: the word's old value.
    pub fn wait_atomic<W: AtomicWord>(&mut self, handle: AtomicHandle<W>) -> Result<W, AmError> {
        self.drive_to_completion(|ep, _| ep.poll_atomic(&handle))
    }

    /// Applies a remote atomic ([`Node::atomic_nb`]) and returns the word's old value:
    /// `node.atomic(1, 64, AtomicOp::FetchAdd(1u64))?`.
    pub fn atomic<W: AtomicWord>(
        &mut self,
        dest: Rank,
        offset: usize,
        op: AtomicOp<W>,
    ) -> Result<W, AmError> {
        let h = self.atomic_nb(dest, offset, op)?;
        self.wait_atomic(h)
    }

    /// Waits until every request this rank sent has been answered and every refused reply has
    /// gone out. Run before dropping a node so that peers are not left without their replies.
    ///
    /// It is also the fence of one-sided operations (OpenSHMEM's `shmem_quiet`): posted atomics
    /// are applied first, and the puts, gets and atomics that travel as messages are remotely
    /// complete when it returns (those the transport does itself are complete when started).
    pub fn quiesce(&mut self) -> Result<(), AmError> {
        self.drive_to_completion(|ep, t| ep.quiesce_step(t))
    }

    /// Ends the whole job with `code` (GASNet's `gasnet_exit`): tells every other rank, which
    /// exits with the same code at its next poll, then exits this process.
    ///
    /// With ranks as threads ([`crate::Loopback`]) this ends the whole process at once.
    pub fn exit(mut self, code: i32) -> ! {
        let _ = self.drive(|ep, t| ep.apply_posted(t));
        let deadline = Instant::now() + Duration::from_secs(1);
        for r in 0..self.ep.size() {
            if r == self.ep.rank() {
                continue;
            }
            // Best effort and bounded: a dead or stuck peer must not keep this rank alive.
            while Instant::now() < deadline {
                match self.ep.try_exit(&mut self.transport, r, code) {
                    Ok(true) | Err(_) => break,
                    Ok(false) => {
                        // Deliveries free the credit; another rank's exit changes nothing now.
                        // (A receive step of its own: `poll_once` keeps the only call of the
                        // endpoint's, which is then inlined whole into the blocking loops.)
                        let _ = self.ep.flush(&mut self.transport);
                        let ep = &mut self.ep;
                        let _ = self
                            .transport
                            .poll_recv(|d, segment, tx| ep.handle(d, segment, tx));
                        std::thread::yield_now();
                    }
                }
            }
        }
        self.terminate(code)
    }

    fn terminate(&mut self, code: i32) -> ! {
        let _ = self.ep.flush(&mut self.transport);
        // The implicit replies still owed too: a peer may wait on those credits to end.
        let _ = self.ep.flush_acks(&mut self.transport);
        self.transport.close();
        std::process::exit(code)
    }
}

impl<T: Transport, H: Threading> Drop for Node<T, H> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        // Posted atomics take effect before the rank leaves (a lost target is no reason to
        // stop the others').
        let _ = self.drive(|ep, t| ep.apply_posted(t));
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

impl<T: Transport, H: Threading> std::fmt::Debug for Node<T, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("transport", &self.transport.name())
            .field("rank", &self.ep.rank())
            .field("size", &self.ep.size())
            .finish()
    }
}
