//! Futures: [`AsyncNode`], a node shared by the tasks of an async runtime, whose every
//! operation (a request, a call awaiting its answer, put, get, atomics, barrier, quiesce) is
//! a `Future`, woken by progress.
//!
//! Progress is made by a driver: something that calls [`AsyncNode::progress`] when there may
//! be work, and between times sleeps on the node's wake descriptor ([`AsyncNode::arm`],
//! [`AsyncNode::wake_fd`], [`AsyncNode::disarm`]). With the `tokio` feature,
//! `AsyncNode::drive` is that driver on `tokio::io::unix::AsyncFd` and
//! `AsyncNode::run` runs a future beside it; any other event loop can do the same with the
//! three calls above. The futures are runtime-agnostic.
//!
//! Each operation is the protocol's own step ([`crate::endpoint::Endpoint`]), taken once per
//! poll of its future: a step that cannot finish yet (no credit, a reply still to come)
//! leaves the future's waker with the node, and the driver wakes every such waker after each
//! round of progress.
//!
//! Handlers run inside [`AsyncNode::progress`], with the node locked: a handler must not use
//! the `AsyncNode` (it replies through its token, or sends what it must from the task that
//! awaits its effect). Dropping an operation's future before it completes gives up waiting,
//! not the operation: a call's late answer is dropped, and a put, get or atomic whose
//! messages went out completes (or fails) unobserved.
//!
//! # With tokio
//! A program on the facade needs these `Cargo.toml` lines (`cargo add --path ../amnet
//! --features tokio`, `cargo add tokio --features rt,macros`):
//!
//! ```toml
//! amnet = { version = "0.1.0", path = "../amnet", features = ["tokio"] }
//! tokio = { version = "1", features = ["rt", "macros"] }
//! ```
//!
//! The same table of handlers serves blocking and async callers. `run` makes progress for
//! the future it runs; spawned tasks (a `LocalSet`) may call concurrently while it does.
//! Under `amnet::run_job`, `rank` takes an `amnet::AnyTransport` and the job's
//! `Config::from_env()` (`examples/async_service.rs`: a key-value service on calls).
//!
//! ```
//! use amnet::{AsyncNode, Config, HandlerId, Handlers, Loopback, Node};
//!
//! const SQUARE: HandlerId = HandlerId(1);
//!
//! # #[cfg(feature = "tokio")]
//! #[tokio::main(flavor = "current_thread")]
//! async fn rank(t: Loopback) -> Result<(), Box<dyn std::error::Error>> {
//!     let mut handlers = Handlers::new();
//!     handlers.callable(SQUARE, "square", |msg, call| {
//!         let x = msg.args()[0];
//!         let _ = call.reply(&[x * x], &[]);
//!     })?;
//!     let node = AsyncNode::new(Node::new(t, handlers, Config::default())?);
//!     let peer = (node.rank() + 1) % node.size();
//!     let squares = node
//!         .run(async {
//!             let mut squares = Vec::new();
//!             for x in 0..4 {
//!                 squares.push(node.call(peer, SQUARE, &[x], &[]).await?.args[0]);
//!             }
//!             node.barrier().await?;
//!             Ok::<_, amnet::AmError>(squares)
//!         })
//!         .await??;
//!     assert_eq!(squares, [0, 1, 4, 9]);
//!     Ok(())
//! }
//!
//! # #[cfg(feature = "tokio")]
//! fn main() {
//!     amnet::run_ranks(Loopback::cluster(2, Default::default()), |t| rank(t).unwrap());
//! }
//! # #[cfg(not(feature = "tokio"))]
//! # fn main() {}
//! ```

use std::future::poll_fn;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use std::future::Future;

use crate::call::Calls;
use crate::endpoint::start::Start;
use crate::endpoint::Endpoint;
use crate::error::{AmError, TryRequestError};
use crate::handler::{Sendable, Threading};
use crate::node::Node;
use crate::op::{Completed, Op, Outcome};
use crate::transport::{Armed, Transport};
use crate::types::{AmKind, HandlerId, Rank};

/// A node shared by the tasks of an async runtime (see the [module docs](self)). Cloning it
/// is cheap: every clone is the same node. It is `Send` and `Sync` when its node is `Send`
/// (a table of `Send` handlers over a `Send` transport), so it may be driven from a
/// multi-threaded runtime; a node on [`crate::Handlers::local`] stays on its thread (a
/// tokio `LocalSet`, or a current-thread runtime).
///
/// ```
/// use amnet::{AsyncNode, Config, HandlerId, Handlers, Loopback, Node};
/// const DOUBLE: HandlerId = HandlerId(1);
///
/// fn main() {
///     amnet::run_ranks(Loopback::cluster(2, Default::default()), |t| {
///         let mut handlers = Handlers::new();
///         handlers.callable(DOUBLE, "double", |msg, call| {
///             let _ = call.reply(&[2 * msg.args()[0]], &[]);
///         }).unwrap();
///         let node = AsyncNode::new(Node::new(t, handlers, Config::default()).unwrap());
///         let peer = 1 - node.rank();
///         // Any executor will do; here a minimal one, with progress made by hand.
///         let answer = amnet::future::block_on(&node, node.call(peer, DOUBLE, &[21], &[]));
///         assert_eq!(answer.unwrap().args, [42]);
///         amnet::future::block_on(&node, node.barrier()).unwrap();
///     });
/// }
/// ```
pub struct AsyncNode<T: Transport, H: Threading = Sendable> {
    inner: Arc<Inner<T, H>>,
}

struct Inner<T: Transport, H: Threading> {
    state: Mutex<State<T, H>>,
    /// The table's calls in flight (`None`: no callable handler), outside the node's lock:
    /// a call's future waits on it without taking the node.
    calls: Option<Arc<Calls>>,
    rank: Rank,
    size: u32,
    /// How many times [`AsyncNode::stop`] was called: a driver returns once it changes (read
    /// on every round, so outside the lock).
    stops: std::sync::atomic::AtomicU64,
    /// Drivers running now ([`AsyncNode::driving`]): with none, futures make progress
    /// themselves.
    driving: Arc<std::sync::atomic::AtomicU32>,
    /// The async typed handlers' tasks, polled after each round of progress, outside the
    /// lock ([`crate::Handlers::typed_async`]).
    tasks: Option<H::Tasks>,
    /// The sleep of futures that no driver serves ([`AsyncNode::undriven`]).
    nap: Nap,
}

/// The longest sleep of futures that no driver serves, whatever the transport allows: how
/// soon the sleeping thread sees its node dropped ([`crate::ProgressThread::ARMED_SLEEP`]'s).
pub(crate) const NAP_LONGEST: std::time::Duration = std::time::Duration::from_millis(10);

/// Where futures that no driver serves sleep once progress finds nothing to do
/// ([`AsyncNode::undriven`]): the node armed, a thread of its own (`amnet-nap-<rank>`,
/// started at the first sleep) waits on a duplicate of the wake descriptor, then wakes them.
/// No reactor is needed: a future so woken runs under any executor. Dropping it (with the
/// node) ends the thread within [`NAP_LONGEST`].
struct Nap(Arc<NapShared>);

struct NapShared {
    state: Mutex<NapState>,
    /// Tells the thread a sleep begins, or the node is gone.
    begun: std::sync::Condvar,
}

#[derive(Default)]
struct NapState {
    /// Rounds of progress in a row that found nothing to do.
    idle: u32,
    phase: NapPhase,
    /// How long this sleep lasts at most (`Asleep`).
    within: std::time::Duration,
    /// The futures to wake when it ends.
    wakers: Vec<Waker>,
    /// The thread runs (`Some(true)`), or cannot (`Some(false)`: the transport has no wake
    /// descriptor, or no thread could start): futures then spin, as before there was one.
    thread: Option<bool>,
    /// The node is gone: the thread returns.
    closed: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq, Debug)]
enum NapPhase {
    /// Futures make progress when polled.
    #[default]
    Awake,
    /// The node is armed and the thread sleeps on its descriptor.
    Asleep,
    /// The thread woke: the node is still armed, for the next future polled to disarm.
    Ended,
}

impl Nap {
    fn new() -> Nap {
        Nap(Arc::new(NapShared {
            state: Mutex::new(NapState::default()),
            begun: std::sync::Condvar::new(),
        }))
    }

    fn lock(&self) -> MutexGuard<'_, NapState> {
        self.0.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The thread: sleeps on `fd` for each sleep begun, then wakes its futures.
    fn sleep_on(shared: &NapShared, fd: &OwnedFd) {
        use std::os::fd::AsFd;
        let lock = || shared.state.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = lock();
        loop {
            while st.phase != NapPhase::Asleep && !st.closed {
                st = shared.begun.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            if st.closed {
                return;
            }
            let within = st.within;
            drop(st);
            // An error of `poll` ends the sleep early: the next round finds out what there is.
            let _ = crate::transport::any_readable(&[fd.as_fd()], within);
            st = lock();
            st.phase = NapPhase::Ended;
            let wakers = std::mem::take(&mut st.wakers);
            drop(st);
            for w in wakers {
                w.wake();
            }
            st = lock();
        }
    }
}

impl Drop for Nap {
    fn drop(&mut self) {
        self.lock().closed = true;
        self.0.begun.notify_all();
    }
}

struct State<T: Transport, H: Threading> {
    node: Node<T, H>,
    /// Futures whose step could not finish: woken after each round of progress.
    waiters: Vec<Waker>,
    /// Drivers waiting in their sleep, woken by [`AsyncNode::stop`].
    drivers: Vec<Waker>,
}

impl<T: Transport, H: Threading> State<T, H> {
    /// Leaves `waker` to be woken after the next round of progress (once).
    fn park(&mut self, waker: &Waker) {
        if !self.waiters.iter().any(|w| w.will_wake(waker)) {
            self.waiters.push(waker.clone());
        }
    }
}

/// A driver of an [`AsyncNode`] counted as running, until dropped (its futures then leave
/// their progress to it).
#[derive(Debug)]
pub struct Driving(Arc<std::sync::atomic::AtomicU32>);

impl Drop for Driving {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Errors that concern one peer: the operations waiting on that peer fail with them, and a
/// driver goes on serving the others.
fn concerns_one_peer(e: &AmError) -> bool {
    matches!(
        e,
        AmError::PeerLost(_) | AmError::PeerDeparted(_) | AmError::PeerMisbehaved { .. }
    )
}

/// An [`AsyncNode`] handle that does not keep it alive ([`AsyncNode::downgrade`]).
pub struct WeakAsyncNode<T: Transport, H: Threading = Sendable>(std::sync::Weak<Inner<T, H>>);

impl<T: Transport, H: Threading> WeakAsyncNode<T, H> {
    /// The node, unless every [`AsyncNode`] of it was dropped.
    pub fn upgrade(&self) -> Option<AsyncNode<T, H>> {
        self.0.upgrade().map(|inner| AsyncNode { inner })
    }
}

impl<T: Transport, H: Threading> Clone for WeakAsyncNode<T, H> {
    fn clone(&self) -> Self {
        WeakAsyncNode(self.0.clone())
    }
}

impl<T: Transport, H: Threading> std::fmt::Debug for WeakAsyncNode<T, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WeakAsyncNode")
    }
}

impl<T: Transport, H: Threading> Clone for AsyncNode<T, H> {
    fn clone(&self) -> Self {
        AsyncNode {
            inner: self.inner.clone(),
        }
    }
}

impl<T: Transport, H: Threading> std::fmt::Debug for AsyncNode<T, H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncNode")
            .field("rank", &self.inner.rank)
            .field("size", &self.inner.size)
            .finish()
    }
}

impl<T: Transport, H: Threading> AsyncNode<T, H> {
    /// Shares `node` with async tasks.
    pub fn new(mut node: Node<T, H>) -> AsyncNode<T, H> {
        let calls = node.ep.calls();
        let tasks = node.hand_over_tasks();
        let (rank, size) = (node.rank(), node.size());
        AsyncNode {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    node,
                    waiters: Vec::new(),
                    drivers: Vec::new(),
                }),
                calls,
                rank,
                size,
                stops: std::sync::atomic::AtomicU64::new(0),
                driving: Arc::default(),
                tasks,
                nap: Nap::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T, H>> {
        // A panic while the lock was held (a handler's) leaves the node as the protocol left
        // it between two steps: go on with it, as a single-threaded node would.
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.inner.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> u32 {
        self.inner.size
    }

    /// Runs `f` on the node (locked meanwhile): for what has no method of its own here (its
    /// segment, configuration, credits). `f` must not use this `AsyncNode`.
    pub fn with<R>(&self, f: impl FnOnce(&mut Node<T, H>) -> R) -> R {
        f(&mut self.lock().node)
    }

    /// Takes `step` once per poll until it is ready; a step not ready leaves the waker.
    async fn step<R>(
        &self,
        mut step: impl FnMut(&mut Endpoint<H>, &mut T) -> Poll<Result<R, AmError>>,
    ) -> Result<R, AmError> {
        poll_fn(|cx| {
            {
                let mut st = self.lock();
                let st = &mut *st;
                if let Poll::Ready(r) = step(&mut st.node.ep, &mut st.node.transport) {
                    return Poll::Ready(r);
                }
                st.park(cx.waker());
            }
            self.undriven(cx)
        })
        .await
    }

    /// What a future whose step is not ready does next: with a driver running (or a
    /// [`crate::ProgressThread`]), waits to be woken; with none, makes a round of progress
    /// itself, so that a future never waits for progress nobody makes. While rounds find
    /// messages, and for [`crate::Config::spin_polls`] rounds in a row after they stop, it
    /// asks to be polled again at once (spinning); then it sleeps as the drivers do, the node
    /// armed on its wake descriptor, until a message comes or the transport's timers are due
    /// (at most [`NAP_LONGEST`] at a time): a thread of the node's waits on the descriptor
    /// and wakes it, so that no reactor is needed. A node of [`crate::WaitMode::Spin`], or
    /// over a transport without a wake descriptor, spins throughout. An error that ends the
    /// node ends the future then (one that concerns a single peer has failed what waited on
    /// that peer).
    fn undriven<R>(&self, cx: &mut std::task::Context<'_>) -> Poll<Result<R, AmError>> {
        if self
            .inner
            .driving
            .load(std::sync::atomic::Ordering::Acquire)
            != 0
        {
            return Poll::Pending;
        }
        if self.napping(cx) {
            return Poll::Pending;
        }
        let idle = match self.progress_waking() {
            Ok((handled, _, local)) => handled == 0 && !local,
            Err(e) if concerns_one_peer(&e) => false,
            Err(e) => return Poll::Ready(Err(e)),
        };
        match self.nap(idle, cx) {
            Ok(true) => {}
            Ok(false) => cx.waker().wake_by_ref(),
            Err(e) => return Poll::Ready(Err(e)),
        }
        Poll::Pending
    }

    /// Before an undriven round of progress: whether the node sleeps ([`Nap`]), the waker
    /// then left to be woken when the sleep ends. A sleep that has ended is ended here (the
    /// node disarmed); one under way goes on, unless an async handler's task was woken
    /// (which a round of progress runs).
    fn napping(&self, cx: &mut std::task::Context<'_>) -> bool {
        let mut nap = self.inner.nap.lock();
        match nap.phase {
            NapPhase::Awake => false,
            NapPhase::Ended => {
                self.disarm();
                nap.phase = NapPhase::Awake;
                false
            }
            NapPhase::Asleep => {
                if self.poll_tasks_woken(cx).is_ready() {
                    return false;
                }
                if !nap.wakers.iter().any(|w| w.will_wake(cx.waker())) {
                    nap.wakers.push(cx.waker().clone());
                }
                true
            }
        }
    }

    /// After an undriven round of progress that found nothing to do (`idle`) or something:
    /// whether the future sleeps ([`Nap`]; its waker is then left with the sleep), or asks
    /// to be polled again at once.
    fn nap(&self, idle: bool, cx: &mut std::task::Context<'_>) -> Result<bool, AmError> {
        let mut nap = self.inner.nap.lock();
        if !idle {
            nap.idle = 0;
            return Ok(false);
        }
        nap.idle = nap.idle.saturating_add(1);
        if nap.phase != NapPhase::Awake || nap.thread == Some(false) {
            return Ok(false);
        }
        let (wait_mode, spin_polls) = self.with(|n| (n.config.wait_mode, n.config.spin_polls));
        if nap.idle <= spin_polls || wait_mode == crate::config::WaitMode::Spin {
            return Ok(false);
        }
        if self.poll_tasks_woken(cx).is_ready() {
            return Ok(false);
        }
        if nap.thread.is_none() {
            nap.thread = Some(self.start_nap_thread());
            if nap.thread == Some(false) {
                return Ok(false);
            }
        }
        match self.arm() {
            // Work now, or a peer lost (what waited on it has failed): another round.
            Ok(Armed::Ready) => Ok(false),
            Err(e) if concerns_one_peer(&e) => Ok(false),
            Err(e) => Err(e),
            Ok(Armed::Sleep(within)) => {
                nap.within = within.min(NAP_LONGEST);
                nap.phase = NapPhase::Asleep;
                nap.wakers.push(cx.waker().clone());
                drop(nap);
                self.inner.nap.0.begun.notify_all();
                Ok(true)
            }
        }
    }

    /// `Ready` once an async typed handler's task is woken (it waits to be polled);
    /// otherwise `cx` is woken when one is. Never ready for a node without them.
    fn poll_tasks_woken(&self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        match &self.inner.tasks {
            Some(tasks) => crate::typed::tasks::TaskQueue::poll_woken(tasks, cx),
            None => Poll::Pending,
        }
    }

    /// Starts the thread that sleeps for undriven futures ([`Nap`]): whether it runs.
    fn start_nap_thread(&self) -> bool {
        let Ok(Some(fd)) = self.wake_fd() else {
            return false;
        };
        let shared = self.inner.nap.0.clone();
        std::thread::Builder::new()
            .name(format!("amnet-nap-{}", self.rank()))
            .spawn(move || Nap::sleep_on(&shared, &fd))
            .is_ok()
    }

    /// Counts a driver as running until the guard drops: futures then leave their progress
    /// to it.
    pub(crate) fn driving(&self) -> Driving {
        self.inner
            .driving
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Driving(self.inner.driving.clone())
    }

    pub(crate) async fn request(
        &self,
        dest: Rank,
        kind: AmKind,
        handler: HandlerId,
        args: &[u32],
        payload: &[u8],
        long_offset: Option<usize>,
    ) -> Result<(), AmError> {
        // Checked once, in the first step: checked and, where a credit and the device allow,
        // sent under one lock.
        let mut checked = false;
        self.step(|ep, t| {
            if !checked {
                ep.check_request(dest, kind, handler, args, payload.len(), long_offset)?;
                checked = true;
            }
            ep.request_step(t, dest, kind, handler, args, payload, long_offset)
        })
        .await
    }

    /// Starts an operation ([`Start`]): its start and send steps, each taken once per poll
    /// until ready. After an error of the send step its handle is dropped, so what was sent
    /// completes detached.
    pub(crate) async fn start_op<S: Start>(&self, mut op: S) -> Result<Op<S::Output>, AmError> {
        let mut started = self.step(|ep, t| op.start(ep, t)).await?;
        self.step(|ep, t| op.send(ep, t, &mut started)).await?;
        Ok(started)
    }

    /// Resolves with an operation's outcome (see [`crate::op`]): the operation's completion
    /// wakes the task, which leaves its waker in the node's table of operations (a call's in
    /// its table of calls, which the future reads without taking the node). The future owns
    /// the handle: dropping it detaches the operation.
    pub fn wait<U: Outcome>(&self, op: Op<U>) -> impl Future<Output = Result<U::Value, AmError>> {
        let node = self.clone();
        async move { node.complete(op).await }
    }

    pub(crate) async fn complete<U: Outcome>(&self, mut op: Op<U>) -> Result<U::Value, AmError> {
        // Another node's call is in another table of calls: refused before that table is read
        // (its answer would never come here, or be another node's). The rest is checked by
        // the node (`Endpoint::poll_op`).
        if op.is_foreign_call(self.inner.calls.as_ref()) {
            return Err(AmError::ForeignHandle);
        }
        poll_fn(|cx| {
            match op.poll_call(Some(cx.waker())) {
                Some(Poll::Ready(answer)) => return Poll::Ready(answer),
                Some(Poll::Pending) => return self.undriven(cx),
                None => {}
            }
            {
                let mut st = self.lock();
                let st = &mut *st;
                let polled = st
                    .node
                    .ep
                    .poll_op(&mut st.node.transport, &mut op, Some(cx.waker()));
                if polled.is_ready() {
                    return polled;
                }
                if op.is_barrier() {
                    // A barrier goes on by sends of its own: woken after each round of
                    // progress.
                    st.park(cx.waker());
                }
            }
            self.undriven(cx)
        })
        .await
    }

    /// Whether an operation is complete, so that [`AsyncNode::wait`] resolves at once (looks
    /// only: progress is the driver's). An operation another node started is
    /// [`AmError::ForeignHandle`], as with [`Node::test`] (see [`crate::op`]).
    pub fn test<U: Outcome>(&self, op: &Op<U>) -> Result<bool, AmError> {
        if op.is_ready() {
            return Ok(true);
        }
        self.lock().node.ep.test_op(op)
    }

    /// Resolves once `done()` is true ([`Node::wait_until`]): `done` is asked again after
    /// each round of progress (whose handlers are what make it true), with the node locked,
    /// so it must not use this `AsyncNode`. Fails, as [`Node::wait_until`] does, if a peer
    /// this rank still awaits replies from has left the job or died.
    pub async fn wait_until(&self, mut done: impl FnMut() -> bool) -> Result<(), AmError> {
        self.step(|ep, t| {
            std::task::ready!(ep.apply_posted(t))?;
            if done() {
                return Poll::Ready(Ok(()));
            }
            match ep.gone_count() {
                0 => Poll::Pending,
                _ => ep
                    .take_unanswerable()
                    .map_or(Poll::Pending, |e| Poll::Ready(Err(e))),
            }
        })
        .await
    }

    /// Resolves once every operation of `ops` is complete (a batch completes together): their
    /// outcomes in order, or the first error once all have completed.
    pub async fn wait_all<U: Outcome>(
        &self,
        ops: impl IntoIterator<Item = Op<U>>,
    ) -> Result<Vec<U::Value>, AmError> {
        let mut all = crate::op::AllOf::new();
        for op in ops {
            all.push(self.complete(op).await);
        }
        all.finish()
    }

    /// Resolves once at least one operation of `ops` is complete (at once if `ops` holds
    /// none), with every one that is, taken out of `ops`: their positions and outcomes, in
    /// order ([`crate::Node::wait_some`]).
    pub async fn wait_some<U: Outcome>(
        &self,
        ops: &mut [Option<Op<U>>],
    ) -> Result<Completed<U>, AmError> {
        poll_fn(|cx| {
            {
                let mut st = self.lock();
                let st = &mut *st;
                let t = &mut st.node.transport;
                if let Poll::Ready(done) = st.node.ep.wait_some_step(t, ops, Some(cx.waker())) {
                    return Poll::Ready(Ok(done));
                }
                if ops.iter().flatten().any(Op::is_barrier) {
                    st.park(cx.waker());
                }
            }
            self.undriven(cx)
        })
        .await
    }

    /// Completes every operation of `ops` that is complete now and takes it out of `ops`
    /// ([`crate::Node::test_some`]; looks only: progress is the driver's). Each operation's
    /// own error is in its outcome (another node's is [`AmError::ForeignHandle`]); the
    /// call itself, which makes no progress, does not fail.
    pub fn test_some<U: Outcome>(
        &self,
        ops: &mut [Option<Op<U>>],
    ) -> Result<Completed<U>, AmError> {
        let mut st = self.lock();
        let st = &mut *st;
        Ok(st.node.ep.take_complete(&mut st.node.transport, ops, None))
    }

    /// One round of progress, what a driver does when woken: runs the handlers of the
    /// messages that arrived (at most 64), fails the calls waiting on peers that left or
    /// died, and wakes every future waiting for progress. How many messages were handled.
    ///
    /// An error names its cause, as [`Node::poll`]'s; one that concerns a single peer (its
    /// loss, its departure, its misbehaviour) has already failed what waited on that peer,
    /// and progress goes on.
    pub fn progress(&self) -> Result<usize, AmError> {
        self.progress_waking().map(|(handled, ..)| handled)
    }

    /// [`AsyncNode::progress`] unless another thread is making progress on the node now
    /// (`None`: that thread makes it meanwhile).
    pub fn try_progress(&self) -> Result<Option<usize>, AmError> {
        if let Err(std::sync::TryLockError::WouldBlock) = self.inner.state.try_lock() {
            return Ok(None);
        }
        self.progress().map(Some)
    }

    /// [`AsyncNode::try_progress`] for a progress thread: the messages handled, and one more
    /// if the node has work left that no message announces
    /// ([`crate::endpoint::Endpoint::has_local_work`]).
    pub(crate) fn try_progress_serving(&self) -> Result<Option<usize>, AmError> {
        if let Err(std::sync::TryLockError::WouldBlock) = self.inner.state.try_lock() {
            return Ok(None);
        }
        let (handled, _, local) = self.progress_waking()?;
        Ok(Some(handled + usize::from(local)))
    }

    /// [`AsyncNode::progress`], whether it woke a future (a driver that woke none need not
    /// let the runtime run before its next round), and whether the node has work left that
    /// no message announces (counted as woken too).
    fn progress_waking(&self) -> Result<(usize, bool, bool), AmError> {
        let answered = self.inner.calls.as_ref().map_or(0, |c| c.answered());
        let mut st = self.lock();
        let woken = st.node.ep.woken();
        // A peer lost or gone fails what waited on it inside the poll (the endpoint's
        // operations and calls), waking their tasks.
        let polled = st.node.poll();
        // A move in segment 0 part-way through counts as woken: the driver polls again
        // rather than sleep.
        let local = st.node.ep.has_local_work();
        let mut woke = st.node.ep.woken() != woken || local;
        let waiters = std::mem::take(&mut st.waiters);
        drop(st);
        woke |= !waiters.is_empty();
        for w in waiters {
            w.wake();
        }
        woke |= self.inner.calls.as_ref().map_or(0, |c| c.answered()) != answered;
        // Outside the lock: a task may use this node.
        if let Some(tasks) = &self.inner.tasks {
            woke |= crate::typed::tasks::TaskQueue::run(tasks);
        }
        polled.map(|handled| (handled, woke, local))
    }

    /// Prepares the driver's sleep on [`AsyncNode::wake_fd`] ([`Node::arm`]). While futures
    /// wait for progress, the sleep lasts at most [`crate::Config::block_timeout`]: what they
    /// wait for (room in a peer's queue) may come without a message.
    pub fn arm(&self) -> Result<Armed, AmError> {
        let mut st = self.lock();
        match st.node.arm()? {
            Armed::Sleep(within) if !st.waiters.is_empty() => {
                Ok(Armed::Sleep(within.min(st.node.config.block_timeout)))
            }
            armed => Ok(armed),
        }
    }

    /// Ends the driver's sleep ([`Node::disarm`]).
    pub fn disarm(&self) {
        self.lock().node.disarm();
    }

    /// A descriptor of the node's own for an event loop to watch ([`Node::wake_fd`]; a
    /// duplicate, so it outlives the lock). `None` if the transport has none.
    pub fn wake_fd(&self) -> Result<Option<OwnedFd>, AmError> {
        let mut st = self.lock();
        match st.node.wake_fd()? {
            None => Ok(None),
            Some(fd) => fd.try_clone_to_owned().map(Some).map_err(|e| {
                AmError::Transport(crate::error::NicError::device_from(
                    "duplicating the wake descriptor",
                    e,
                ))
            }),
        }
    }

    /// Closes the node without blocking the task's thread ([`Node::close`]): resolves once
    /// what the node owes and is owed has gone, or after [`crate::Config::close_timeout`],
    /// waiting for the driver's rounds of progress meanwhile (or making them itself without
    /// a driver). The node is then ended: futures still pending, and every operation
    /// started after, fail with [`AmError::NodeClosed`]; the drivers return `Ok`. The
    /// transport is closed when the last clone of the `AsyncNode` drops (that drop then
    /// waits for nothing).
    pub async fn close(&self) -> Result<(), AmError> {
        let deadline = std::time::Instant::now() + self.with(|n| n.config.close_timeout);
        let settled = self
            .step(|ep, t| {
                if ep.close_step(t).is_ready() || std::time::Instant::now() >= deadline {
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending
            })
            .await;
        let waiters = {
            let mut st = self.lock();
            st.node.transport.flush();
            st.node.ep.end(AmError::NodeClosed);
            std::mem::take(&mut st.waiters)
        };
        for w in waiters {
            w.wake();
        }
        // Its async handlers' tasks end with it (outside the lock: one may hold a handle).
        if let Some(tasks) = &self.inner.tasks {
            crate::typed::tasks::TaskQueue::clear(tasks);
        }
        self.stop();
        match settled {
            Err(AmError::NodeClosed) => Ok(()),
            other => other,
        }
    }

    /// A handle that does not keep the node alive ([`WeakAsyncNode::upgrade`]): what the
    /// code of an async typed handler ([`crate::Handlers::typed_async`]) holds to reach its
    /// node, since the node holds that code (a strong handle there would keep the node
    /// from ever dropping).
    pub fn downgrade(&self) -> WeakAsyncNode<T, H> {
        WeakAsyncNode(Arc::downgrade(&self.inner))
    }

    /// Asks the drivers running now to return (`AsyncNode::drive`); a driver started
    /// afterwards runs until the next `stop`.
    pub fn stop(&self) {
        let mut st = self.lock();
        self.inner
            .stops
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        for w in st.drivers.drain(..) {
            w.wake();
        }
    }

    /// Whether [`AsyncNode::stop`] was called since `since` ([`AsyncNode::stops`]); if not,
    /// `cx` is woken when it is.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    fn poll_stopped(&self, since: u64, cx: &mut std::task::Context<'_>) -> Poll<()> {
        let mut st = self.lock();
        if self.stops() != since {
            return Poll::Ready(());
        }
        if !st.drivers.iter().any(|w| w.will_wake(cx.waker())) {
            st.drivers.push(cx.waker().clone());
        }
        Poll::Pending
    }

    /// How many times [`AsyncNode::stop`] was called.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    fn stops(&self) -> u64 {
        self.inner.stops.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Takes the node back once no other clone of this `AsyncNode` is left (`Err(self)`
    /// otherwise).
    pub fn into_node(self) -> Result<Node<T, H>, AsyncNode<T, H>> {
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => {
                let mut node = inner
                    .state
                    .into_inner()
                    .unwrap_or_else(|p| p.into_inner())
                    .node;
                // Alone again, it polls its tasks itself.
                node.runs_tasks = true;
                Ok(node)
            }
            Err(inner) => Err(AsyncNode { inner }),
        }
    }
}

/// Runs `fut` to completion on the calling thread, making progress on `node` between its
/// polls (spinning, then yielding): an executor for tests and examples without a runtime.
pub fn block_on<T: Transport, H: Threading, F: std::future::Future>(
    node: &AsyncNode<T, H>,
    fut: F,
) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    let mut cx = std::task::Context::from_waker(Waker::noop());
    let mut idle = 0u32;
    loop {
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        match node.progress() {
            Ok(0) | Err(_) => {
                idle += 1;
                if idle > 64 {
                    std::thread::yield_now();
                }
            }
            Ok(_) => idle = 0,
        }
    }
}

#[cfg(feature = "tokio")]
mod driver {
    use super::*;
    use crate::error::RuntimeError;
    use std::future::Future;
    use std::time::Duration;
    use tokio::io::unix::AsyncFd;
    use tokio::io::Interest;

    impl<T: Transport, H: Threading> AsyncNode<T, H> {
        /// The driver on tokio: makes progress whenever there may be work and sleeps in
        /// between on the node's wake descriptor (`tokio::io::unix::AsyncFd`), armed
        /// ([`AsyncNode::arm`]), so an idle node uses no CPU and senders pay for the wake-up
        /// only while it sleeps. Returns after [`AsyncNode::stop`], or with an error that
        /// does not concern a single peer (the job aborted, the device failed).
        ///
        /// Spawn it beside the tasks that use the node (`tokio::task::spawn_local` on a
        /// `LocalSet` for a node of `Handlers::local`), or let `AsyncNode::run` do it.
        /// Needs a runtime with I/O and timers enabled (`Builder::enable_all()`, what
        /// `#[tokio::main]` builds): on one without, it fails at once with
        /// [`AmError::Runtime`], which says what to enable.
        pub async fn drive(&self) -> Result<(), AmError> {
            let _driving = self.driving();
            let fd = self.async_wake_fd()?;
            let started = self.stops();
            let spin_polls = self.with(|n| n.config().spin_polls);
            loop {
                if self.stops() != started {
                    return Ok(());
                }
                // As `AM_WAIT=block`: spin a while before sleeping (a reply in flight is
                // cheaper to wait for than a wake-up).
                if self.progress_spinning(spin_polls)? {
                    // Let the futures just woken run before the next round.
                    reschedule().await;
                    continue;
                }
                let within = match self.arm()? {
                    Armed::Ready => {
                        reschedule().await;
                        continue;
                    }
                    Armed::Sleep(within) => within,
                };
                match &fd {
                    Some(fd) => {
                        tokio::select! {
                            biased;
                            () = poll_fn(|cx| self.poll_stopped(started, cx)) => {}
                            () = poll_fn(|cx| self.poll_tasks_woken(cx)) => {}
                            ready = fd.readable() => {
                                if let Ok(mut guard) = ready {
                                    guard.clear_ready();
                                }
                            }
                            () = tokio::time::sleep(within) => {}
                        }
                    }
                    None => reschedule().await,
                }
                self.disarm();
            }
        }

        /// A driver that never sleeps: progress, then yield to the runtime, again and again
        /// (the async `AM_WAIT=spin`). For latency when a core is to spare; returns as
        /// `AsyncNode::drive` does.
        pub async fn drive_spinning(&self) -> Result<(), AmError> {
            let _driving = self.driving();
            let started = self.stops();
            loop {
                if self.stops() != started {
                    return Ok(());
                }
                self.progress_spinning(SPIN_ROUNDS)?;
                reschedule().await;
            }
        }

        /// Rounds of progress until one wakes a future or `polls` in a row handle nothing,
        /// without leaving the task: whether a future was woken (the runtime should run it).
        /// Messages that wake nobody (requests this rank answers) keep it spinning. Fails with
        /// an error that does not concern a single peer.
        fn progress_spinning(&self, polls: u32) -> Result<bool, AmError> {
            let mut idle = 0;
            while idle < polls.max(1) {
                match self.progress_waking() {
                    Ok((_, true, _)) => return Ok(true),
                    Ok((0, false, _)) => {
                        idle += 1;
                        std::hint::spin_loop();
                    }
                    Ok((_, false, _)) => idle = 0,
                    Err(e) if concerns_one_peer(&e) => return Ok(true),
                    Err(e) => return Err(e),
                }
            }
            Ok(false)
        }

        /// Runs `fut` and makes progress for it in the same task, and returns its output:
        /// `node.run(async { node.call(1, GET, &[key], &[]).await }).await`. Between polls
        /// of `fut` it drives as `AsyncNode::drive` does (spinning a while, then asleep,
        /// armed, on the wake descriptor); a message that wakes `fut` has it polled at once,
        /// in the same poll, with no trip through the runtime. Fails if progress fails with
        /// an error that does not concern a single peer, and at once, without polling `fut`,
        /// with [`AmError::Runtime`] on a runtime without I/O or timers enabled (see
        /// `AsyncNode::drive`).
        pub async fn run<F: Future>(&self, fut: F) -> Result<F::Output, AmError> {
            self.run_with(fut, true).await
        }

        /// [`AsyncNode::run`] that never sleeps (the async `AM_WAIT=spin`): it lets the
        /// runtime run other tasks every so often, and otherwise polls. Needs the runtime's
        /// timers ([`AmError::Runtime`] otherwise), not its I/O.
        pub async fn run_spinning<F: Future>(&self, fut: F) -> Result<F::Output, AmError> {
            self.run_with(fut, false).await
        }

        async fn run_with<F: Future>(&self, fut: F, sleep: bool) -> Result<F::Output, AmError> {
            let _driving = self.driving();
            let fd = if sleep { self.async_wake_fd()? } else { None };
            // `timer` below, whatever the transport.
            timers_enabled()?;
            let spin_polls = self.with(|n| n.config().spin_polls);
            let mut fut = std::pin::pin!(fut);
            let mut timer = std::pin::pin!(tokio::time::sleep(Duration::ZERO));
            let mut asleep = false;
            let mut rounds = 0u32;
            poll_fn(|cx| loop {
                if let Poll::Ready(out) = fut.as_mut().poll(cx) {
                    if asleep {
                        self.disarm();
                    }
                    return Poll::Ready(Ok(out));
                }
                if asleep {
                    let tasks = self.poll_tasks_woken(cx).is_ready();
                    let woken = tasks
                        || match &fd {
                            Some(fd) => match fd.poll_read_ready(cx) {
                                Poll::Ready(Ok(mut guard)) => {
                                    guard.clear_ready();
                                    true
                                }
                                Poll::Ready(Err(_)) => true,
                                Poll::Pending => false,
                            },
                            None => true,
                        };
                    if !woken && timer.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    self.disarm();
                    asleep = false;
                }
                let polls = if sleep { spin_polls } else { SPIN_ROUNDS };
                match self.progress_spinning(polls) {
                    Err(e) => return Poll::Ready(Err(e)),
                    // Something was woken: `fut` (polled next), or another task.
                    Ok(true) => {}
                    Ok(false) if sleep => match self.arm() {
                        Err(e) => return Poll::Ready(Err(e)),
                        Ok(Armed::Ready) => {}
                        Ok(Armed::Sleep(within)) => {
                            timer.as_mut().reset(tokio::time::Instant::now() + within);
                            asleep = true;
                            continue;
                        }
                    },
                    Ok(false) => {}
                }
                rounds += 1;
                if rounds.is_multiple_of(SPIN_ROUNDS) {
                    // Let the runtime's other tasks run.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            })
            .await
        }

        /// The wake descriptor, registered with the runtime's reactor (`None` if the
        /// transport has none): where a driver that sleeps starts. Fails, rather than let
        /// tokio panic, on a runtime without the timers that bound the sleep or the I/O
        /// driver it sleeps in ([`RuntimeError`]).
        fn async_wake_fd(&self) -> Result<Option<AsyncFd<OwnedFd>>, AmError> {
            let Some(fd) = self.wake_fd()? else {
                return Ok(None);
            };
            timers_enabled()?;
            // Tokio has no query for its I/O driver, and panics where a runtime has none
            // (`enable_io` not called): caught here, and said in words. The panic hook still
            // prints tokio's message first (and a program built with `panic = "abort"`
            // aborts there, as before).
            let registered = std::panic::catch_unwind(move || {
                // The safe constructor, deprecated because an arbitrary `AsRawFd` may close
                // or change its descriptor under the reactor; an `OwnedFd` (ours, a
                // duplicate) holds one open descriptor until the `AsyncFd` drops it, which is
                // what the replacement's safety contract asks.
                #[allow(deprecated)]
                AsyncFd::with_interest(fd, Interest::READABLE)
            })
            .map_err(|_| AmError::Runtime(RuntimeError::IoDisabled))?;
            registered
                .map(Some)
                .map_err(|e| device("registering the wake descriptor", e))
        }
    }

    /// Whether this thread runs in a tokio runtime with timers enabled, which a sleeping
    /// driver's bound needs ([`RuntimeError`]). Tokio has no query for its timers either, and
    /// panics where they are off: a sleep is made under `catch_unwind` (see
    /// `AsyncNode::async_wake_fd`).
    fn timers_enabled() -> Result<(), AmError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(AmError::Runtime(RuntimeError::NoRuntime));
        }
        std::panic::catch_unwind(|| drop(tokio::time::sleep(Duration::ZERO)))
            .map_err(|_| AmError::Runtime(RuntimeError::TimeDisabled))
    }

    /// Rounds of progress a spinning driver makes between two turns of the runtime.
    const SPIN_ROUNDS: u32 = 64;

    /// Lets the other tasks of the runtime run, then comes back: wakes this task and returns
    /// `Pending` once. (`tokio::task::yield_now` also polls the reactor before the task runs
    /// again, a system call per yield that a driver between two messages cannot afford; the
    /// runtime still polls it every few dozen tasks.)
    async fn reschedule() {
        let mut yielded = false;
        poll_fn(|cx| {
            if yielded {
                Poll::Ready(())
            } else {
                yielded = true;
                cx.waker().wake_by_ref();
                Poll::Pending
            }
        })
        .await
    }

    fn device(what: &'static str, e: std::io::Error) -> AmError {
        AmError::Transport(crate::error::NicError::device_from(what, e))
    }
}

/// One operation of [`AsyncNode`]: one that `owns` its arguments returns `'static` futures
/// (copies of its small arguments and a share of the node), one that `borrows` them (a put's
/// bytes, a buffer to read into) futures that borrow them.
macro_rules! async_op {
    (owns; $(#[$doc:meta])* $name:ident [$($g:tt)*] ($($arg:ident : $ty:ty),*) -> $out:ty
        = $start:expr ; nb $nb:ident ;) => {
        $(#[$doc])*
        #[doc = concat!("\n\nResolves once it completes; [`AsyncNode::", stringify!($nb),
            "`] resolves with its handle once it is started. The future owns what it needs \
            (it can be boxed, stored and spawned).")]
        pub fn $name<$($g)*>(&self, $($arg: $ty),*)
            -> impl Future<Output = Result<$out, AmError>> {
            let op = $crate::endpoint::start::Owned::owned($start);
            let node = self.clone();
            async move {
                let started = node.start_op(op).await?;
                node.complete(started).await
            }
        }

        $(#[$doc])*
        #[doc = concat!("\n\nResolves with its handle once it is locally complete: \
            [`AsyncNode::wait`] and its kin complete it; [`AsyncNode::", stringify!($name),
            "`] waits for it. The future owns what it needs.")]
        pub fn $nb<$($g)*>(&self, $($arg: $ty),*)
            -> impl Future<Output = Result<$crate::op::Op<$out>, AmError>> {
            let op = $crate::endpoint::start::Owned::owned($start);
            let node = self.clone();
            async move { node.start_op(op).await }
        }
    };
    (borrows; $(#[$doc:meta])* $name:ident [$($g:tt)*] ($($arg:ident : $ty:ty),*) -> $out:ty
        = $start:expr ; nb $nb:ident ;) => {
        $(#[$doc])*
        #[doc = concat!("\n\nResolves once it completes; [`AsyncNode::", stringify!($nb),
            "`] resolves with its handle once it is started. The future borrows the buffer.")]
        pub async fn $name<$($g)*>(&self, $($arg: $ty),*) -> Result<$out, AmError> {
            let started = self.start_op($start).await?;
            self.complete(started).await
        }

        $(#[$doc])*
        #[doc = concat!("\n\nResolves with its handle once it is locally complete (the \
            buffer may be reused, or is held by the handle): [`AsyncNode::wait`] and its kin \
            complete it; [`AsyncNode::", stringify!($name), "`] waits for it.")]
        pub async fn $nb<$($g)*>(&self, $($arg: $ty),*)
            -> Result<$crate::op::Op<$out>, AmError> {
            self.start_op($start).await
        }
    };
}

/// Writes [`AsyncNode`]'s operations from [`crate::endpoint::start::operations`] (see
/// [`async_op`]).
macro_rules! async_operations {
    (op $(#[$doc:meta])*
        $name:ident [$($g:tt)*] ($($arg:ident : $ty:ty),*) -> $out:ty
            = $start:expr ; nb $nb:ident ; $own:ident ;) => {
        async_op! { $own; $(#[$doc])* $name [$($g)*] ($($arg : $ty),*) -> $out
            = $start ; nb $nb ; }
    };
    (typed $(#[$doc:meta])*
        $name:ident [$($g:tt)*] ($($arg:ident : $ty:ty),*) -> $val:ty, $out:ty
            = $start:expr ; nb $nb:ident ;) => {
        $(#[$doc])*
        #[doc = concat!("\n\nResolves with the answer; [`AsyncNode::", stringify!($nb),
            "`] resolves with its handle once it is sent. The future owns what it needs.")]
        pub fn $name<$($g)*>(&self, $($arg: $ty),*)
            -> impl Future<Output = Result<$val, AmError>> {
            let op = $crate::endpoint::start::Owned::owned($start);
            let node = self.clone();
            async move {
                let started = node.start_op(op).await?;
                node.complete(started).await
            }
        }

        $(#[$doc])*
        #[doc = concat!("\n\nResolves with its handle once it is sent: [`AsyncNode::wait`] \
            and its kin complete it with the answer. The future owns what it needs.")]
        pub fn $nb<$($g)*>(&self, $($arg: $ty),*)
            -> impl Future<Output = Result<$crate::op::Op<$out>, AmError>> {
            let op = $crate::endpoint::start::Owned::owned($start);
            let node = self.clone();
            async move { node.start_op(op).await }
        }
    };
    (implicit $(#[$idoc:meta])*
        $iname:ident = $inb:ident ($($iarg:ident : $ity:ty),*) ;) => {
        $(#[$idoc])*
        pub async fn $iname(&self, $($iarg: $ity),*) -> Result<(), AmError> {
            let op = self.$inb($($iarg),*).await?;
            self.lock().node.ep.implicit(op);
            Ok(())
        }
    };
    (post $(#[$pdoc:meta])*
        $pname:ident [$($pg:tt)*] ($($parg:ident : $pty:ty),*) = |$pep:ident, $pt:ident| $pstep:expr ;) => {
        $(#[$pdoc])*
        pub async fn $pname<$($pg)*>(&self, $($parg: $pty),*) -> Result<(), AmError> {
            self.step(|$pep, $pt| $pstep).await
        }
    };
    (request $(#[$rdoc:meta])*
        $rname:ident, $rtry:ident ($($rarg:ident : $rty:ty),*) = ($($send:expr),*) ;) => {
        $(#[$rdoc])*
        #[doc = concat!("\n\nResolves once it is sent (a credit and the device \
            allowed); [`AsyncNode::", stringify!($rtry), "`] never waits.")]
        pub async fn $rname(&self, $($rarg: $rty),*) -> Result<(), AmError> {
            self.request($($send),*).await
        }

        $(#[$rdoc])*
        #[doc = concat!("\n\nOnly if a credit and device space are available now; \
            otherwise [`TryRequestError::WouldBlock`] and nothing was sent. Does not \
            poll; [`AsyncNode::", stringify!($rname), "`] waits for room.")]
        pub fn $rtry(&self, $($rarg: $rty),*) -> Result<(), TryRequestError> {
            self.lock().node.try_request($($send),*)
        }
    };
    (wait $(#[$wdoc:meta])*
        $wname:ident ($($warg:ident : $wty:ty),*) = |$wep:ident, $wt:ident| $wstep:expr ;) => {
        $(#[$wdoc])*
        pub fn $wname(&self, $($warg: $wty),*) -> impl Future<Output = Result<(), AmError>> {
            let node = self.clone();
            async move { node.step(|$wep, $wt| $wstep).await }
        }
    };
}
impl<T: Transport, H: Threading> AsyncNode<T, H> {
    crate::endpoint::start::operations!(async_operations);

    crate::node::locked_calls! { |self| self.lock().node;
        /// Its bytes are `with(|n| n.segment_at(id))`'s.
        fn create_segment(len: usize) -> Result<crate::segment::SegmentId, AmError>;
        fn world_team() -> crate::team::Team;
        fn free_team(team: crate::team::Team) -> Result<(), AmError>;
        fn ops_in_flight() -> usize;
        fn stats() -> crate::Stats;
        fn limits() -> crate::transport::Limits;
        /// It blocks the calling thread (for at most a second) while it tells the other
        /// ranks: the runtime's tasks end with the process.
        fn exit(code: i32) -> ! = exit_in_place;
    }
}
