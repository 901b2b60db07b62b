//! Several threads on one node, and a thread that keeps it progressing.
//!
//! [`SharedNode`] is GASNet-EX's PAR mode on one endpoint: a [`Node`] of `Send` handlers
//! behind a lock, which any number of threads of the rank hold in turn. Every call takes the
//! lock for its own duration; a blocking call gives it back between its polls, so threads
//! that wait never keep the others from sending or polling. The lock is eventually fair: a
//! thread that takes it again as soon as it gives it back does not keep a thread asleep
//! waiting for it from it for long, which gets it at the first release after at most about
//! a millisecond (half that on average) beyond the hold under way. Handlers run on
//! whichever thread polls, under the lock.
//!
//! [`ProgressThread`] polls a shared node whenever no other thread holds it, so that a rank
//! whose threads compute without calling into the library still serves its peers' requests
//! (GASNet's progress threads, UCX's progress in a helper thread).
//!
//! A node that only one thread drives needs neither: [`Node`] itself moves between threads.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use std::task::Poll;

use parking_lot::{Mutex, MutexGuard};

use crate::config::WaitMode;
use crate::endpoint::start::Start;
use crate::endpoint::Endpoint;
use crate::error::{AmError, TryRequestError};
use crate::handler::Sendable;
use crate::node::Node;
use crate::op::{Completed, Op, Outcome};
use crate::transport::Transport;
use crate::types::Rank;

/// Messages a blocking call handles under the lock before it gives the node to another
/// thread; also the turns with nothing to do before a shared node's waits slow down.
const SLICE: u32 = 64;

/// A node that several threads of its rank drive at once (see the [module docs](self)).
/// Cloning it shares the same node.
///
/// ```
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::sync::Arc;
/// use amnet::{AmKind, Config, HandlerId, Handlers, Loopback, Node, SharedNode};
///
/// const HIT: HandlerId = HandlerId(1);
///
/// fn main() {
///     amnet::run_ranks(Loopback::cluster(2, Default::default()), |transport| {
///         let hits = Arc::new(AtomicU32::new(0));
///         let h = hits.clone();
///         let mut handlers = Handlers::new();
///         handlers.request(HIT, "hit", AmKind::Short, move |_, _| {
///             h.fetch_add(1, Ordering::Relaxed);
///         }).unwrap();
///         let node = SharedNode::new(Node::new(transport, handlers, Config::default()).unwrap());
///         let peer = 1 - node.rank();
///         std::thread::scope(|s| {
///             for _ in 0..2 {
///                 let node = node.clone();
///                 s.spawn(move || {
///                     for _ in 0..100 {
///                         node.request_short(peer, HIT, &[]).unwrap();
///                     }
///                 });
///             }
///         });
///         node.wait_until(|| hits.load(Ordering::Relaxed) == 200).unwrap();
///         node.barrier().unwrap();
///     });
/// }
/// ```
pub struct SharedNode<T: Transport> {
    node: Arc<Mutex<Node<T, Sendable>>>,
    rank: Rank,
    size: u32,
    wait_mode: WaitMode,
    /// The async typed handlers' tasks, polled after each poll, outside the lock.
    tasks: Option<<Sendable as crate::handler::Threading>::Tasks>,
}

impl<T: Transport> Clone for SharedNode<T> {
    fn clone(&self) -> Self {
        SharedNode {
            node: self.node.clone(),
            rank: self.rank,
            size: self.size,
            wait_mode: self.wait_mode,
            tasks: self.tasks.clone(),
        }
    }
}

impl<T: Transport> std::fmt::Debug for SharedNode<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedNode")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .finish()
    }
}

/// A [`SharedNode`]'s node, held by this thread until the guard drops
/// ([`SharedNode::lock`]). Like `std`'s lock guards, it stays on the thread that took it.
#[must_use = "the node is given back at once if the guard is not kept"]
#[clippy::has_significant_drop]
pub struct NodeGuard<'a, T: Transport>(
    MutexGuard<'a, Node<T, Sendable>>,
    // Not `Send` whatever features the lock's crate is built with.
    std::marker::PhantomData<std::sync::MutexGuard<'a, ()>>,
);

impl<T: Transport> std::ops::Deref for NodeGuard<'_, T> {
    type Target = Node<T, Sendable>;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl<T: Transport> std::ops::DerefMut for NodeGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl<T: Transport> std::fmt::Debug for NodeGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeGuard")
            .field("rank", &self.0.rank())
            .finish()
    }
}

impl<T: Transport> SharedNode<T> {
    /// Shares `node` between the threads that get a clone of the result.
    pub fn new(mut node: Node<T, Sendable>) -> Self {
        SharedNode {
            tasks: node.hand_over_tasks(),
            rank: node.rank(),
            size: node.size(),
            wait_mode: node.config().wait_mode,
            node: Arc::new(Mutex::new(node)),
        }
    }

    /// The node back, if this is the last share of it (every clone dropped); the share
    /// itself otherwise.
    pub fn into_inner(self) -> Result<Node<T, Sendable>, Self> {
        let SharedNode {
            node,
            rank,
            size,
            wait_mode,
            tasks,
        } = self;
        match Arc::try_unwrap(node) {
            Ok(m) => {
                let mut node = m.into_inner();
                // Alone again, it polls its tasks itself.
                node.runs_tasks = true;
                Ok(node)
            }
            Err(node) => Err(SharedNode {
                node,
                rank,
                size,
                wait_mode,
                tasks,
            }),
        }
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Ranks in the job.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The node, for any call of [`Node`], held until the guard drops: a blocking call made
    /// through it holds the node for its whole wait (the methods of this type do not).
    ///
    /// A handler that panicked while another thread held the node does not make the node
    /// unusable here: the job's abort follows from the panic itself.
    pub fn lock(&self) -> NodeGuard<'_, T> {
        NodeGuard(self.node.lock(), std::marker::PhantomData)
    }

    /// The node if no other thread holds it now.
    fn try_lock(&self) -> Option<NodeGuard<'_, T>> {
        self.node
            .try_lock()
            .map(|node| NodeGuard(node, std::marker::PhantomData))
    }

    /// [`Node::poll`], once the node is free; then the async typed handlers' tasks woken
    /// meanwhile run, outside the lock.
    pub fn poll(&self) -> Result<usize, AmError> {
        let polled = self.lock().poll();
        self.run_tasks();
        polled
    }

    /// Polls the async typed handlers' tasks woken since the last time.
    fn run_tasks(&self) {
        use crate::typed::tasks::TaskQueue;
        if let Some(tasks) = &self.tasks {
            tasks.run();
        }
    }

    /// [`Node::poll`] if no other thread holds the node now: `None` if one does (that thread
    /// makes the progress meanwhile).
    pub fn try_poll(&self) -> Result<Option<usize>, AmError> {
        self.try_poll_counting(false)
    }

    /// [`SharedNode::try_poll`]; with `local`, one more than the messages handled if the node
    /// has work left that no message announces (for the progress thread).
    fn try_poll_counting(&self, local: bool) -> Result<Option<usize>, AmError> {
        let polled = match self.try_lock() {
            Some(mut node) => node
                .poll()
                .map(|n| Some(n + usize::from(local && node.ep.has_local_work()))),
            None => return Ok(None),
        };
        self.run_tasks();
        polled
    }

    /// [`Node::wait_until`]: polls until `done()` is true, under the lock for at most a slice
    /// of polls at a time and never waiting while it holds it, so other threads send and poll
    /// meanwhile; between slices it waits as the node's wait mode says (with
    /// [`WaitMode::Block`], short sleeps). A peer this rank awaits replies from that is gone
    /// fails the wait, as with [`Node::wait_until`].
    pub fn wait_until(&self, mut done: impl FnMut() -> bool) -> Result<(), AmError> {
        let (mut idle, mut checked) = (0, 0);
        loop {
            let (finished, handled, moving) = {
                let mut node = self.lock();
                let (finished, handled) = node.poll_until(&mut done, SLICE, &mut checked)?;
                (finished, handled, node.ep.has_local_work())
            };
            if finished {
                return Ok(());
            }
            if handled > 0 || moving {
                idle = 0;
            }
            self.between(&mut idle);
        }
    }

    /// Takes `step` under the lock until it is ready; while it is not, polls once and gives
    /// the node to the other threads before the next try. Once it is ready, what the
    /// handlers run meanwhile sent leaves if `flush` (a wait for completion).
    fn drive<R>(
        &self,
        flush: bool,
        mut step: impl FnMut(&mut Endpoint<Sendable>, &mut T) -> Poll<Result<R, AmError>>,
    ) -> Result<R, AmError> {
        self.drive_node(flush, |node| step(&mut node.ep, &mut node.transport))
    }

    /// [`SharedNode::drive`] of a step of the node's own (a request's `try_` form).
    fn drive_node<R>(
        &self,
        flush: bool,
        mut step: impl FnMut(&mut Node<T, Sendable>) -> Poll<Result<R, AmError>>,
    ) -> Result<R, AmError> {
        let mut idle = 0;
        loop {
            {
                let mut node = self.lock();
                if let Poll::Ready(r) = step(&mut node) {
                    if flush {
                        node.transport.flush();
                    }
                    return r;
                }
                // A move in segment 0 that the poll took a step further goes on at the next
                // turn, not after a sleep.
                if node.poll()? > 0 || node.ep.has_local_work() {
                    idle = 0;
                }
            }
            self.between(&mut idle);
        }
    }

    /// Starts an operation ([`Start`]) as [`Node`] does, giving the node to the other
    /// threads between its steps.
    fn start_op<S: Start>(&self, mut op: S) -> Result<Op<S::Output>, AmError> {
        let mut started = self.drive(false, |ep, t| op.start(ep, t))?;
        self.drive(false, |ep, t| op.send(ep, t, &mut started))?;
        Ok(started)
    }

    /// [`Node::wait`], giving the node to the other threads between polls.
    pub fn wait<U: Outcome>(&self, mut op: Op<U>) -> Result<U::Value, AmError> {
        let r = self.drive(true, |ep, t| ep.poll_op(t, &mut op, None));
        if r.is_err() {
            self.lock().ep.interrupted(&op);
        }
        r
    }

    /// [`Node::test`].
    pub fn test<U: Outcome>(&self, op: &Op<U>) -> Result<bool, AmError> {
        if op.is_ready() {
            return Ok(true);
        }
        self.lock().test(op)
    }

    /// [`Node::wait_all`], giving the node to the other threads between polls.
    pub fn wait_all<U: Outcome>(
        &self,
        ops: impl IntoIterator<Item = Op<U>>,
    ) -> Result<Vec<U::Value>, AmError> {
        let all: crate::op::AllOf<U::Value> = ops.into_iter().map(|op| self.wait(op)).collect();
        all.finish()
    }

    /// [`Node::wait_some`], giving the node to the other threads between polls.
    pub fn wait_some<U: Outcome>(
        &self,
        ops: &mut [Option<Op<U>>],
    ) -> Result<Completed<U>, AmError> {
        self.drive(true, |ep, t| ep.wait_some_step(t, ops, None).map(Ok))
    }

    /// Between two turns at the node, never holding it: spins, then yields to the other
    /// threads; with [`WaitMode::Block`], after a while with nothing to do, sleeps for
    /// [`ProgressThread::IDLE_SLEEP`] at a time (no thread sleeps in the transport while it
    /// holds the node, which the others may need to send).
    fn between(&self, idle: &mut u32) {
        *idle = idle.saturating_add(1);
        self.run_tasks();
        match self.wait_mode {
            WaitMode::Spin if *idle < SLICE => std::hint::spin_loop(),
            WaitMode::Block if *idle >= SLICE => std::thread::sleep(ProgressThread::IDLE_SLEEP),
            _ => std::thread::yield_now(),
        }
    }
}

/// A thread that polls a [`SharedNode`] whenever no other thread holds it, until stopped: a
/// rank whose threads compute without polling still serves its peers (see the
/// [module docs](self)).
///
/// It spins while messages come, then yields, then sleeps armed on the node's wake
/// descriptor ([`Node::arm`]) until a message comes: an idle rank's progress thread uses no
/// CPU. (Over a transport without one, it sleeps for short whiles,
/// [`ProgressThread::IDLE_SLEEP`].) The first error a poll returns is kept (polling goes
/// on, as after any error of [`Node::poll`]) and returned by [`stop`](Self::stop).
#[derive(Debug)]
pub struct ProgressThread {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Option<AmError>>>,
}

impl ProgressThread {
    /// The longest sleep of an idle progress thread between two polls, over a transport
    /// without a wake descriptor.
    pub const IDLE_SLEEP: Duration = Duration::from_micros(50);

    /// The longest sleep of an idle progress thread armed on its node's wake descriptor
    /// (which a message ends at once): how soon it sees [`ProgressThread::stop`].
    pub const ARMED_SLEEP: Duration = Duration::from_millis(10);

    /// Starts a thread (named `amnet-progress-<rank>`) that polls `node`.
    pub fn spawn<N: Shared>(node: N) -> std::io::Result<Self> {
        Self::spawn_all(vec![node])
    }

    /// Starts a thread (named `amnet-progress-<rank>` after the first node's rank) that polls
    /// every node of `nodes` in turn, and sleeps armed on all their wake descriptors at once
    /// when none has work: one progress thread for all the endpoints of a process.
    pub fn spawn_all<N: Shared>(nodes: Vec<N>) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let name = match nodes.first() {
            Some(node) => format!("amnet-progress-{}", sealed::Serve::rank(node)),
            None => "amnet-progress".to_owned(),
        };
        let thread = std::thread::Builder::new()
            .name(name)
            .spawn(move || progress(&nodes, &stopped))?;
        Ok(ProgressThread {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it: the first error its polls returned, if any.
    pub fn stop(mut self) -> Result<(), AmError> {
        match self.halt() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn halt(&mut self) -> Option<AmError> {
        self.stop.store(true, Ordering::Release);
        let thread = self.thread.take()?;
        match thread.join() {
            Ok(e) => e,
            // A handler's panic: the job's abort follows from it; re-raise it here.
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

impl Drop for ProgressThread {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.halt();
        } else {
            self.stop.store(true, Ordering::Release);
        }
    }
}

/// The progress thread's loop.
fn progress<N: Shared>(nodes: &[N], stop: &AtomicBool) -> Option<AmError> {
    // An async node's futures leave their progress to this thread while it runs.
    let _serving: Vec<_> = nodes.iter().map(sealed::Serve::serving).collect();
    let mut first = None;
    let mut idle = 0u32;
    // The nodes' wake descriptors (duplicates: they outlive the locks), for the idle sleeps;
    // `None` if one has none.
    let wake: Option<Vec<OwnedFd>> = nodes.iter().map(sealed::Serve::wake_fd).collect();
    while !stop.load(Ordering::Acquire) {
        let mut handled = false;
        for node in nodes {
            match node.try_progress() {
                Ok(Some(n)) if n > 0 => handled = true,
                Ok(_) => {}
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        idle = if handled { 0 } else { idle.saturating_add(1) };
        if idle < SLICE {
            std::hint::spin_loop();
        } else if idle < 2 * SLICE {
            std::thread::yield_now();
        } else {
            match &wake {
                Some(fds) => sleep_armed(nodes, fds),
                None => std::thread::sleep(ProgressThread::IDLE_SLEEP),
            }
        }
    }
    first
}

/// The idle progress thread's sleep: arms the nodes and sleeps on their descriptors (without
/// the nodes' locks, which the rank's other threads may take meanwhile) until a message comes
/// to any, or for at most [`ProgressThread::ARMED_SLEEP`] (so that a stop is seen soon).
fn sleep_armed<N: Shared>(nodes: &[N], fds: &[OwnedFd]) {
    // Each guard is gone when its arming returns: the nodes are locked again below.
    let (armed, sleep) =
        crate::wait::arm_each(nodes.len(), ProgressThread::ARMED_SLEEP, |i| nodes[i].arm());
    // Work now, or an error the next poll reports: no sleep.
    if let Ok(Some(sleep)) = sleep {
        let fds: Vec<BorrowedFd<'_>> = fds.iter().map(AsFd::as_fd).collect();
        // An error ends the sleep early: the next polls find out what there is.
        let _ = crate::transport::any_readable(&fds, sleep);
    }
    for node in &nodes[..armed] {
        node.disarm();
    }
}

/// A driver that the threads of a rank share, which a [`ProgressThread`] serves:
/// [`SharedNode`], and an [`AsyncNode`](crate::AsyncNode) of `Send` handlers (whose futures
/// then leave their progress to the thread, as to a driver). Sealed.
pub trait Shared: sealed::Serve + Send + 'static {}

impl<T: Transport + Send + 'static> Shared for SharedNode<T> {}
impl<T: Transport + Send + 'static> Shared for crate::AsyncNode<T, Sendable> {}

pub(crate) mod sealed {
    use std::os::fd::OwnedFd;

    use crate::error::AmError;
    use crate::transport::Armed;

    /// What a progress thread does with a shared driver.
    pub trait Serve {
        /// The rank, for the thread's name.
        fn rank(&self) -> crate::types::Rank;
        /// A round of progress unless another thread holds the node: messages handled, and
        /// one more if the node has work left that no message announces
        /// ([`crate::endpoint::Endpoint::has_local_work`]), so that the thread goes on
        /// rather than sleep.
        fn try_progress(&self) -> Result<Option<usize>, AmError>;
        /// Arms the node for a sleep ([`crate::Node::arm`]).
        fn arm(&self) -> Result<Armed, AmError>;
        /// Ends the sleep.
        fn disarm(&self);
        /// A duplicate of the wake descriptor, if the transport has one.
        fn wake_fd(&self) -> Option<OwnedFd>;
        /// Counts the thread as the node's driver while the guard lives.
        fn serving(&self) -> Option<crate::future::Driving>;
    }
}

impl<T: Transport + Send + 'static> sealed::Serve for SharedNode<T> {
    fn rank(&self) -> Rank {
        self.rank
    }
    fn try_progress(&self) -> Result<Option<usize>, AmError> {
        self.try_poll_counting(true)
    }
    fn arm(&self) -> Result<crate::Armed, AmError> {
        self.lock().arm()
    }
    fn disarm(&self) {
        self.lock().disarm()
    }
    fn wake_fd(&self) -> Option<OwnedFd> {
        let mut node = self.lock();
        let fd = node.wake_fd().ok().flatten()?;
        fd.try_clone_to_owned().ok()
    }
    fn serving(&self) -> Option<crate::future::Driving> {
        None
    }
}

impl<T: Transport + Send + 'static> sealed::Serve for crate::AsyncNode<T, Sendable> {
    fn rank(&self) -> Rank {
        crate::AsyncNode::rank(self)
    }
    fn try_progress(&self) -> Result<Option<usize>, AmError> {
        self.try_progress_serving()
    }
    fn arm(&self) -> Result<crate::Armed, AmError> {
        crate::AsyncNode::arm(self)
    }
    fn disarm(&self) {
        crate::AsyncNode::disarm(self)
    }
    fn wake_fd(&self) -> Option<OwnedFd> {
        crate::AsyncNode::wake_fd(self).ok().flatten()
    }
    fn serving(&self) -> Option<crate::future::Driving> {
        Some(self.driving())
    }
}

/// Writes [`SharedNode`]'s operations from [`crate::endpoint::start::operations`]: those of
/// [`Node`], each step under the lock, the node given to the other threads between steps and polls.
macro_rules! shared_operations {
    (op $(#[$doc:meta])*
        $name:ident [$($g:tt)*] ($($arg:ident : $ty:ty),*) -> $out:ty
            = $start:expr ; nb $nb:ident ; $own:ident ;) => {
        $(#[$doc])*
        #[doc = concat!("\n\nWaits until it completes, giving the node to the other \
            threads between polls; [`SharedNode::", stringify!($nb), "`] returns its \
            handle.")]
        pub fn $name<$($g)*>(&self, $($arg: $ty),*) -> Result<$out, AmError> {
            // Its start, as `$nb`'s (which would leave a type only a return names open).
            let op = self.start_op($start)?;
            self.wait(op)
        }

        $(#[$doc])*
        #[doc = concat!("\n\nStarts it and returns its handle once it is locally \
            complete, giving the node to the other threads while credits or the \
            device make it wait: [`SharedNode::wait`] and its kin complete it; \
            [`SharedNode::", stringify!($name), "`] waits for it.")]
        pub fn $nb<$($g)*>(&self, $($arg: $ty),*) -> Result<Op<$out>, AmError> {
            self.start_op($start)
        }
    };
    (typed $(#[$doc:meta])*
        $name:ident [$($g:tt)*] ($($arg:ident : $ty:ty),*) -> $val:ty, $out:ty
            = $start:expr ; nb $nb:ident ;) => {
        $(#[$doc])*
        #[doc = concat!("\n\nWaits until it completes, giving the node to the other \
            threads between polls; [`SharedNode::", stringify!($nb), "`] returns its \
            handle.")]
        pub fn $name<$($g)*>(&self, $($arg: $ty),*) -> Result<$val, AmError> {
            let op = self.$nb($($arg),*)?;
            self.wait(op)
        }

        $(#[$doc])*
        #[doc = concat!("\n\nStarts it and returns its handle once it is sent: \
            [`SharedNode::wait`] and its kin complete it with the answer.")]
        pub fn $nb<$($g)*>(&self, $($arg: $ty),*) -> Result<Op<$out>, AmError> {
            self.start_op($start)
        }
    };
    (implicit $(#[$idoc:meta])*
        $iname:ident = $inb:ident ($($iarg:ident : $ity:ty),*) ;) => {
        $(#[$idoc])*
        pub fn $iname(&self, $($iarg: $ity),*) -> Result<(), AmError> {
            let op = self.$inb($($iarg),*)?;
            self.lock().ep.implicit(op);
            Ok(())
        }
    };
    (post $(#[$pdoc:meta])*
        $pname:ident [$($pg:tt)*] ($($parg:ident : $pty:ty),*) = |$pep:ident, $pt:ident| $pstep:expr ;) => {
        $(#[$pdoc])*
        pub fn $pname<$($pg)*>(&self, $($parg: $pty),*) -> Result<(), AmError> {
            self.drive(false, |$pep, $pt| $pstep)
        }
    };
    (request $(#[$rdoc:meta])*
        $rname:ident, $rtry:ident ($($rarg:ident : $rty:ty),*) = ($($send:expr),*) ;) => {
        $(#[$rdoc])*
        #[doc = concat!("\n\nGives the node to the other threads while out of credit; \
            [`SharedNode::", stringify!($rtry), "`] never waits.")]
        pub fn $rname(&self, $($rarg: $rty),*) -> Result<(), AmError> {
            self.drive_node(false, |node| match node.try_request($($send),*) {
                Ok(()) => Poll::Ready(Ok(())),
                Err(TryRequestError::WouldBlock) => Poll::Pending,
                Err(TryRequestError::Failed(e)) => Poll::Ready(Err(e)),
            })
        }

        $(#[$rdoc])*
        #[doc = concat!("\n\nOnly if a credit and device space are available now \
            ([`Node::", stringify!($rtry), "`]).")]
        pub fn $rtry(&self, $($rarg: $rty),*) -> Result<(), TryRequestError> {
            self.lock().try_request($($send),*)
        }
    };
    (wait $(#[$wdoc:meta])*
        $wname:ident ($($warg:ident : $wty:ty),*) = |$wep:ident, $wt:ident| $wstep:expr ;) => {
        $(#[$wdoc])*
        pub fn $wname(&self, $($warg: $wty),*) -> Result<(), AmError> {
            self.drive(true, |$wep, $wt| $wstep)
        }
    };
}
impl<T: Transport> SharedNode<T> {
    crate::endpoint::start::operations!(shared_operations);

    crate::node::locked_calls! { |self| self.lock();
        /// Its bytes are `lock().segment_at(id)`.
        fn create_segment(len: usize) -> Result<crate::segment::SegmentId, AmError>;
        fn world_team() -> crate::team::Team;
        fn free_team(team: crate::team::Team) -> Result<(), AmError>;
        fn test_some[U: Outcome](ops: &mut [Option<Op<U>>]) -> Result<Completed<U>, AmError>;
        fn ops_in_flight() -> usize;
        fn stats() -> crate::Stats;
        fn limits() -> crate::transport::Limits;
        /// The other threads, blocked on the node meanwhile, end with the process.
        fn exit(code: i32) -> ! = exit_in_place;
        /// The other threads' operations, pending or started after, then fail with
        /// [`AmError::NodeClosed`]. The transport closes when the last share drops (which
        /// then waits for nothing).
        fn close() -> Result<(), AmError> = close_in_place;
    }
}
