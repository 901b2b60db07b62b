//! [`Node`]: one rank of a job, driving the protocol [`Endpoint`] with a [`Transport`].

use std::task::Poll;
use std::time::{Duration, Instant};

use crate::config::{Config, WaitMode};
use crate::credit::{CreditPolicy, Policy};
use crate::endpoint::start::Start;
use crate::endpoint::{Endpoint, Polled};
use crate::error::{AmError, StartError, TryRequestError};
use crate::handler::{Handlers, Sendable, Threading};
use crate::op::{Completed, Op, Outcome};
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
/// use amnet::{AmKind, Config, HandlerId, Handlers, Loopback, Node};
///
/// const PING: HandlerId = HandlerId(1);
/// const PONG: HandlerId = HandlerId(2);
///
/// fn main() {
///     let transports = Loopback::cluster(2, Default::default());
///     amnet::run_ranks(transports, |transport| {
///         let pongs = Rc::new(Cell::new(0u32));
///         let seen = pongs.clone();
///         let mut handlers = Handlers::local();
///         handlers.request(PING, "ping", AmKind::Short, |msg, token| {
///             let _ = token.reply_short(PONG, &[msg.args()[0] + 1]);
///         }).unwrap();
///         handlers.reply(PONG, "pong", AmKind::Short, move |msg| seen.set(msg.args()[0])).unwrap();
///         let mut node = Node::new(transport, handlers, Config::default()).unwrap();
///         if node.rank() == 0 {
///             node.request_short(1, PING, &[41]).unwrap();
///             node.wait_until(|| pongs.get() == 42).unwrap();
///         }
///         node.barrier().unwrap();
///     });
/// }
/// ```
pub struct Node<T: Transport, H: Threading = Sendable> {
    pub(crate) transport: T,
    pub(crate) ep: Endpoint<H>,
    pub(crate) config: Config,
    /// Whether this node polls its async typed handlers' tasks itself, in its polls and
    /// waits ([`Node::run_tasks`]); not while a shared driver ([`crate::SharedNode`],
    /// [`crate::AsyncNode`]) holds it, which polls them outside its lock.
    pub(crate) runs_tasks: bool,
}

impl<T: Transport, H: Threading> Node<T, H> {
    /// Starts a node with the credit policy of `config` ([`crate::Credits`]).
    ///
    /// This is collective: every rank must call it. It checks that every rank registered the
    /// same handler table and segment size, and fails on all ranks with a clear error otherwise.
    /// [`Node::config`]'s credits are then the ones in force: those `config` chose, or the
    /// transport's own ([`crate::transport::NicInfo::credits`]).
    pub fn new(transport: T, handlers: Handlers<H>, config: Config) -> Result<Self, StartError> {
        let (config, policy) = Self::policy(&transport, config)?;
        Self::start(transport, handlers, config, policy)
    }

    /// The credit policy `config` asks for, or the transport's own, on `transport`; and
    /// `config` naming the credits in force.
    fn policy(transport: &T, config: Config) -> Result<(Config, Policy), StartError> {
        let info = transport.info();
        let credits = config.credits.unwrap_or(info.credits);
        let policy = credits
            .build(transport.size(), info.limits.max_credits)
            .map_err(|why| StartError::Config(format!("{} transport: {why}", info.name)))?;
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
            nodes.push(Self::unstarted(transport, handlers, config, policy)?);
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
        let mut node = Self::unstarted(transport, handlers, config, credits)?;
        let mut idle = 0;
        while !node.start_step()? {
            node.progress(&mut idle)?;
        }
        Ok(node)
    }

    fn unstarted(
        transport: T,
        handlers: Handlers<H>,
        config: Config,
        credits: Policy,
    ) -> Result<Self, StartError> {
        let info = transport.info();
        let mut ep = Endpoint::with_policy(
            transport.rank(),
            transport.size(),
            info,
            transport.segment().len(),
            handlers,
            credits,
        );
        ep.set_all_reduce(config.all_reduce);
        let maps = info.capabilities.map_segments;
        ep.set_typed_rendezvous(maps, config.typed_rendezvous);
        ep.set_symmetric_size(config.symmetric_size)
            .map_err(|e| StartError::Config(e.to_string()))?;
        Ok(Node {
            transport,
            ep,
            config,
            runs_tasks: true,
        })
    }

    /// One step of start-up (no rank sends a user message before it has heard that all
    /// agree): whether it is over.
    fn start_step(&mut self) -> Result<bool, StartError> {
        match self.ep.start_step(&mut self.transport) {
            Poll::Ready(r) => {
                r?;
                // After start-up, which ends with every credit home.
                let coalesce = self.transport.info().capabilities.acks_coalesce;
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

    /// The world team: every rank of the job, in rank order, on which teams are split
    /// ([`Node::split`]) and collectives run ([`Node::team_barrier`],
    /// [`Node::team_all_gather`]; see [`crate::team`]).
    pub fn world_team(&self) -> crate::team::Team {
        self.ep.world_team()
    }

    /// Frees `team` here at once, whatever clones of it remain (their later collectives are
    /// [`AmError::UnknownTeam`]); its collectives in flight complete first. Dropping the last
    /// clone does the same. Local: the other members free theirs in their own time, and a
    /// step of theirs for the freed team is then refused. The world team cannot be freed.
    pub fn free_team(&mut self, team: crate::team::Team) -> Result<(), AmError> {
        self.ep.free_team(team)
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
    /// use amnet::{Config, Handlers, Loopback, LoopbackConfig, Node};
    ///
    /// fn main() {
    ///     let t = Loopback::cluster(1, LoopbackConfig::default()).remove(0);
    ///     let node = Node::new(t, Handlers::new(), Config::default()).unwrap();
    ///     let seg = node.segment();
    ///     seg.write(0, b"hello").unwrap();
    ///     seg.store_u64(8, 42).unwrap();
    ///     let mut back = [0u8; 5];
    ///     seg.read(0, &mut back).unwrap();
    ///     assert_eq!((&back, seg.load_u64(8).unwrap()), (b"hello", 42));
    /// }
    /// ```
    pub fn segment(&self) -> crate::transport::SharedBytes<'_> {
        self.transport.segment()
    }

    /// Creates a segment of `len` bytes bound to this rank, all zero, and gives its id
    /// ([`crate::segment`]): its bytes are [`Node::segment_at`]'s at once, and peers reach
    /// it once it is published ([`Node::publish_segment`]). Local, not collective; ids are
    /// never reused.
    ///
    /// ```
    /// use amnet::{run_ranks, Config, Handlers, Loopback, LoopbackConfig, Node};
    ///
    /// fn main() {
    ///     run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
    ///         let mut node = Node::new(t, Handlers::new(), Config::default()).unwrap();
    ///         let world = node.world_team();
    ///         let mine = node.create_segment(4096)?;
    ///         let peers = node.publish_segment(&world, mine)?;
    ///         let right = &peers[(node.rank() as usize + 1) % 2];
    ///         node.put_to(right, 64, &node.rank().to_le_bytes())?;
    ///         node.team_barrier(&world)?;
    ///         let mut from = [0u8; 4];
    ///         node.segment_at(mine).unwrap().read(64, &mut from).unwrap();
    ///         assert_eq!(u32::from_le_bytes(from), 1 - node.rank());
    ///         node.free_segment(&world, mine)?;
    ///         Ok::<(), amnet::AmError>(())
    ///     })
    ///     .into_iter()
    ///     .collect::<Result<Vec<()>, _>>()
    ///     .unwrap();
    /// }
    /// ```
    pub fn create_segment(&mut self, len: usize) -> Result<crate::segment::SegmentId, AmError> {
        self.ep.create_segment(len)
    }

    /// The bytes of this rank's segment `id` (segment 0 is [`Node::segment`]); `None` for
    /// one it never created or has freed.
    pub fn segment_at(
        &self,
        id: crate::segment::SegmentId,
    ) -> Option<crate::transport::SharedBytes<'_>> {
        self.ep.segment_at(&self.transport, id)
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

    /// What the transport's NIC does itself ([`crate::transport::NicInfo::capabilities`]).
    pub fn capabilities(&self) -> Capabilities {
        self.transport.info().capabilities
    }

    /// Whether a Long of `len` bytes has landed in the target's segment once a request for it
    /// was sent ([`Capabilities::long_placed_on_send`]).
    pub fn long_placed_on_send(&self, len: usize) -> bool {
        self.transport.info().capabilities.long_placed_on_send(len)
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
        // A rank that only polls may wait on what its posted atomics cause, or be in a
        // barrier whose handle it dropped.
        if let Poll::Ready(Err(e)) = self.ep.background_step(&mut self.transport) {
            return Err(e);
        }
        // Bounded, so a flood from one peer cannot starve the caller.
        let handled = self.poll_up_to(64);
        self.run_tasks();
        handled
    }

    /// Polls the async typed handlers' tasks woken since the last time
    /// ([`crate::Handlers::typed_async`]), where this node runs them itself.
    #[inline]
    fn run_tasks(&self) {
        use crate::typed::tasks::TaskQueue;
        if let (true, Some(tasks)) = (self.runs_tasks, self.ep.typed_tasks()) {
            tasks.run();
        }
    }

    /// The async typed handlers' tasks, for a shared driver that polls them outside its
    /// lock: from now on this node does not poll them itself.
    pub(crate) fn hand_over_tasks(&mut self) -> Option<H::Tasks> {
        self.runs_tasks = false;
        self.ep.typed_tasks().cloned()
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
        if self.ep.has_local_work() {
            return Ok(Armed::Ready);
        }
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
    /// peer; and the collectives in flight carried on. `checked` is the endpoint's changes
    /// the wait has looked at so far (start at 0: with none there is nothing to look at), so
    /// this runs only when a peer went or a collective's step came.
    #[inline]
    fn check_gone(&mut self, checked: &mut u32) -> Result<(), AmError> {
        let changes = self.ep.changes();
        if changes != *checked {
            *checked = changes;
            return self.changed();
        }
        Ok(())
    }

    /// [`Node::check_gone`] when something changed: out of the waits' loops.
    #[cold]
    #[inline(never)]
    fn changed(&mut self) -> Result<(), AmError> {
        // Collectives in flight go on while the caller waits for something else (their next
        // steps may be what the awaited message waits for).
        self.ep.carry_collectives(&mut self.transport);
        if self.ep.gone_count() > 0 {
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
                // As in a blocking wait's idle step.
                self.ep.carry_collectives(&mut self.transport);
                self.ep.carry_in_segment(&mut self.transport);
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
    #[inline(always)]
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
        // Collective steps and notices that waited for a credit go once it is back: the
        // wait may be for something else (a world barrier) that a member stuck without
        // them holds up. Not at every spin: a spinning wait is a message's critical path.
        if *idle >= self.config.spin_polls || idle.is_multiple_of(64) {
            self.ep.carry_collectives(&mut self.transport);
            // A move in segment 0 goes a step further, whatever this wait is for.
            self.ep.carry_in_segment(&mut self.transport);
            // Async handlers' tasks woken meanwhile: not at every spin either.
            self.run_tasks();
        }
        if *idle < self.config.spin_polls || self.config.wait_mode == WaitMode::Spin {
            std::hint::spin_loop();
            return Ok(());
        }
        if self.ep.has_local_work() {
            // That move has more to do: no sleep meanwhile.
            *idle = 0;
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
    pub(crate) fn send_blocking(
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

    pub(crate) fn try_request(
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

    /// Starts an operation ([`Start`]): its start and send steps, with progress in between,
    /// until it is locally complete. After an error of the send step its handle is dropped,
    /// so what was sent completes detached.
    fn start_op<S: Start>(&mut self, mut op: S) -> Result<Op<S::Output>, AmError> {
        let mut started = self.drive(|ep, t| op.start(ep, t))?;
        self.drive(|ep, t| op.send(ep, t, &mut started))?;
        Ok(started)
    }

    /// Waits for an operation and returns its outcome (see [`crate::op`]); one another node
    /// started is [`AmError::ForeignHandle`], and completes detached on its own node.
    pub fn wait<U: Outcome>(&mut self, mut op: Op<U>) -> Result<U::Value, AmError> {
        let r = self.drive_to_completion(|ep, t| ep.poll_op(t, &mut op, None));
        if r.is_err() {
            self.ep.interrupted(&op);
        }
        r
    }

    /// Whether an operation is complete, so that [`Node::wait`] returns at once; polls once
    /// first (unless it was complete when started). An operation another node started is
    /// [`AmError::ForeignHandle`] (see [`crate::op`]).
    pub fn test<U: Outcome>(&mut self, op: &Op<U>) -> Result<bool, AmError> {
        if op.is_ready() {
            return Ok(true);
        }
        if self.ep.owns(op) {
            self.poll()?;
        }
        self.ep.test_op(op)
    }

    /// Waits for every operation of `ops` (a batch completes together): their outcomes in
    /// order, or the first error once all have completed.
    pub fn wait_all<U: Outcome>(
        &mut self,
        ops: impl IntoIterator<Item = Op<U>>,
    ) -> Result<Vec<U::Value>, AmError> {
        let all: crate::op::AllOf<U::Value> = ops.into_iter().map(|op| self.wait(op)).collect();
        all.finish()
    }

    /// Waits until at least one operation of `ops` is complete (none if `ops` holds none),
    /// then completes every one that is and takes it out of `ops`: their positions and
    /// outcomes, in order (GASNet-EX's `gex_Event_WaitSome`). Each operation is returned
    /// once. An error of progress itself (not of an operation) leaves `ops` as it is.
    pub fn wait_some<U: Outcome>(
        &mut self,
        ops: &mut [Option<Op<U>>],
    ) -> Result<Completed<U>, AmError> {
        self.drive_to_completion(|ep, t| ep.wait_some_step(t, ops, None).map(Ok))
    }

    /// [`Node::wait_some`] without waiting: polls once, then completes and takes out every
    /// operation of `ops` that is complete (GASNet-EX's `gex_Event_TestSome`).
    pub fn test_some<U: Outcome>(
        &mut self,
        ops: &mut [Option<Op<U>>],
    ) -> Result<Completed<U>, AmError> {
        self.poll()?;
        Ok(self.ep.take_complete(&mut self.transport, ops, None))
    }

    /// Operations in flight in the node's table, whether a handle waits for them or not
    /// (those whose handle was dropped, the implicit set, posted atomics sent as messages):
    /// none once they have all completed.
    pub fn ops_in_flight(&mut self) -> usize {
        self.ep.ops_in_flight()
    }

    /// Ends the whole job with `code` (GASNet's `gasnet_exit`): tells every other rank, which
    /// exits with the same code at its next poll, then exits this process.
    ///
    /// With ranks as threads ([`crate::Loopback`]) this ends the whole process at once.
    pub fn exit(mut self, code: i32) -> ! {
        self.exit_in_place(code)
    }

    /// [`Node::exit`] of a node a shared driver holds.
    pub(crate) fn exit_in_place(&mut self, code: i32) -> ! {
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

impl<T: Transport, H: Threading> Node<T, H> {
    /// What the node has counted since it started ([`crate::Stats`]): late answers
    /// discarded, sends that waited for a credit or that the NIC refused, retransmissions.
    pub fn stats(&self) -> crate::Stats {
        let mut stats = self.ep.stats();
        let nic = self.transport.stats();
        stats.refused += nic.refused;
        stats.retransmissions += nic.retransmissions;
        stats
    }

    /// Closes the node: waits until what it owes and is owed has gone (its posted atomics
    /// applied, the replies and acknowledgements peers wait for sent, the replies to its
    /// requests in), for at most [`Config::close_timeout`], then ends it: anything still in
    /// flight fails with [`AmError::NodeClosed`], and the transport is closed as the node
    /// drops. The wait spins for [`Config::spin_polls`] empty polls, then sleeps in the
    /// transport ([`Transport::wait`]) between polls, whatever the wait mode: closing
    /// never keeps a core busy.
    ///
    /// Dropping a node closes it the same way; `close` says whether progress failed
    /// meanwhile (with an error that ends the node: the job aborted, the device failed).
    pub fn close(mut self) -> Result<(), AmError> {
        self.close_in_place()
    }

    pub(crate) fn close_in_place(&mut self) -> Result<(), AmError> {
        if let Some(tasks) = self.ep.typed_tasks() {
            // Its async handlers' tasks end with it.
            crate::typed::tasks::TaskQueue::clear(tasks);
        }
        if self.ep.ended().is_some() {
            return Ok(());
        }
        let deadline = Instant::now() + self.config.close_timeout;
        let mut idle = 0u32;
        let result = loop {
            if self.ep.close_step(&mut self.transport).is_ready() {
                break Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                break Ok(());
            }
            match self.poll_once() {
                Ok(true) => idle = 0,
                Ok(false) => {
                    idle = idle.saturating_add(1);
                    if idle < self.config.spin_polls {
                        std::hint::spin_loop();
                    } else if let Err(e) = self.transport.wait(
                        self.config
                            .block_timeout
                            .min(deadline.saturating_duration_since(now)),
                    ) {
                        match self.ep.absorb(e.into()) {
                            Some(e) if e.ends_node() => break Err(e),
                            _ => {}
                        }
                    }
                }
                Err(e) if e.ends_node() => break Err(e),
                // A misbehaving or lost peer does not stop the others' replies from mattering.
                Err(_) => {}
            }
        };
        self.transport.flush();
        self.ep.end(AmError::NodeClosed);
        result
    }
}

impl<T: Transport, H: Threading> Drop for Node<T, H> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let _ = self.close_in_place();
    }
}

impl<T: Transport, H: Threading> std::fmt::Debug for Node<T, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("transport", &self.transport.info().name)
            .field("rank", &self.ep.rank())
            .field("size", &self.ep.size())
            .finish()
    }
}

/// Writes the methods of a shared driver ([`crate::SharedNode`], [`crate::AsyncNode`]) that
/// are one call of [`Node`]'s with the node locked: the same arguments and result, by
/// construction. `$node` is the locked node (`$s` names `self` for it); `= $inner` calls
/// the node's `$inner` instead (one that takes `&mut self` where `Node`'s takes `self`).
macro_rules! locked_calls {
    (|$s:ident| $node:expr; $(
        $(#[$doc:meta])*
        fn $name:ident $([$($g:tt)*])? ($($arg:ident : $ty:ty),*) -> $ret:ty $(= $inner:ident)?;
    )*) => {$(
        #[doc = concat!("[`Node::", stringify!($name), "`], the node locked for the call.")]
        $(#[$doc])*
        pub fn $name $(<$($g)*>)? (&$s, $($arg: $ty),*) -> $ret {
            crate::node::locked_calls!(@call $node, $name $($inner)?, $($arg),*)
        }
    )*};
    (@call $node:expr, $name:ident, $($arg:ident),*) => { $node.$name($($arg),*) };
    (@call $node:expr, $name:ident $inner:ident, $($arg:ident),*) => { $node.$inner($($arg),*) };
}
pub(crate) use locked_calls;

/// Writes [`Node`]'s operations from [`crate::endpoint::start::operations`]: `x` is `x_nb` then
/// [`Node::wait`], `x_nb` is [`Start`] driven with progress in between.
macro_rules! node_operations {
    (op $(#[$doc:meta])*
        $name:ident [$($g:tt)*] ($($arg:ident : $ty:ty),*) -> $out:ty
            = $start:expr ; nb $nb:ident ; $own:ident ;) => {
        $(#[$doc])*
        #[doc = concat!("\n\nWaits until it completes, polling meanwhile; [`Node::",
            stringify!($nb), "`] starts it and returns its handle.")]
        pub fn $name<$($g)*>(&mut self, $($arg: $ty),*) -> Result<$out, AmError> {
            // Its start, as `$nb`'s (which would leave a type only a return names open).
            let op = self.start_op($start)?;
            self.wait(op)
        }

        $(#[$doc])*
        #[doc = concat!("\n\nStarts it and returns its handle once it is locally \
            complete (its buffers may be reused), polling while credits or the device \
            make it wait: [`Node::wait`], [`Node::test`] and their kin complete it; \
            [`Node::", stringify!($name), "`] waits for it.")]
        pub fn $nb<$($g)*>(&mut self, $($arg: $ty),*) -> Result<Op<$out>, AmError> {
            self.start_op($start)
        }
    };
    (typed $(#[$doc:meta])*
        $name:ident [$($g:tt)*] ($($arg:ident : $ty:ty),*) -> $val:ty, $out:ty
            = $start:expr ; nb $nb:ident ;) => {
        $(#[$doc])*
        #[doc = concat!("\n\nWaits until it completes, polling meanwhile; [`Node::",
            stringify!($nb), "`] starts it and returns its handle.")]
        pub fn $name<$($g)*>(&mut self, $($arg: $ty),*) -> Result<$val, AmError> {
            let op = self.$nb($($arg),*)?;
            self.wait(op)
        }

        $(#[$doc])*
        #[doc = concat!("\n\nStarts it and returns its handle once it is sent; [`Node::wait`] \
            and its kin complete it with the answer.")]
        pub fn $nb<$($g)*>(&mut self, $($arg: $ty),*) -> Result<Op<$out>, AmError> {
            self.start_op($start)
        }
    };
    (implicit $(#[$idoc:meta])*
        $iname:ident = $inb:ident ($($iarg:ident : $ity:ty),*) ;) => {
        $(#[$idoc])*
        pub fn $iname(&mut self, $($iarg: $ity),*) -> Result<(), AmError> {
            let op = self.$inb($($iarg),*)?;
            self.ep.implicit(op);
            Ok(())
        }
    };
    (post $(#[$pdoc:meta])*
        $pname:ident [$($pg:tt)*] ($($parg:ident : $pty:ty),*) = |$pep:ident, $pt:ident| $pstep:expr ;) => {
        $(#[$pdoc])*
        pub fn $pname<$($pg)*>(&mut self, $($parg: $pty),*) -> Result<(), AmError> {
            self.drive(|$pep, $pt| $pstep)
        }
    };
    (request $(#[$rdoc:meta])*
        $rname:ident, $rtry:ident ($($rarg:ident : $rty:ty),*) = ($($send:expr),*) ;) => {
        $(#[$rdoc])*
        #[doc = concat!("\n\nPolls while out of credit or the device is busy; [`Node::",
            stringify!($rtry), "`] never waits.")]
        #[inline]
        pub fn $rname(&mut self, $($rarg: $rty),*) -> Result<(), AmError> {
            self.send_blocking($($send),*)
        }

        $(#[$rdoc])*
        #[doc = concat!("\n\nOnly if a credit and device space are available now; \
            otherwise [`TryRequestError::WouldBlock`] and nothing was sent. Does not \
            poll; [`Node::", stringify!($rname), "`] waits for room.")]
        pub fn $rtry(&mut self, $($rarg: $rty),*) -> Result<(), TryRequestError> {
            self.try_request($($send),*)
        }
    };
    (wait $(#[$wdoc:meta])*
        $wname:ident ($($warg:ident : $wty:ty),*) = |$wep:ident, $wt:ident| $wstep:expr ;) => {
        $(#[$wdoc])*
        pub fn $wname(&mut self, $($warg: $wty),*) -> Result<(), AmError> {
            self.drive_to_completion(|$wep, $wt| $wstep)
        }
    };
}
impl<T: Transport, H: Threading> Node<T, H> {
    crate::endpoint::start::operations!(node_operations);
}
