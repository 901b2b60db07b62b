//! The tasks of async typed handlers ([`crate::Handlers::typed_async`]): each message's
//! future, polled by the node's driver outside its lock (so that the task may use the
//! node), woken by whatever it awaits.
//!
//! A handler runs inside progress and must not wait; an async one returns a future, which
//! is kept here and polled once at once and then each time it is woken, by the driver of
//! the node the table was given to: [`crate::AsyncNode`]'s (after each round of progress,
//! and its tokio driver, asleep, wakes for it), [`crate::SharedNode`]'s after each poll,
//! and a blocking [`crate::Node`]'s polls and waits.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

/// What a driver does with a table's tasks, whichever its threading.
#[doc(hidden)]
pub trait TaskQueue: Clone + Default + 'static {
    /// Polls the tasks woken since the last run, each once: whether any was. Nothing woken
    /// costs one atomic load.
    fn run(&self) -> bool;
    /// Whether a task was woken and waits to be polled.
    fn woken(&self) -> bool;
    /// `Ready` if a task waits to be polled; otherwise `cx`'s waker is woken when one is.
    fn poll_woken(&self, cx: &mut Context<'_>) -> Poll<()>;
    /// How many tasks are not finished.
    fn len(&self) -> usize;
    /// Drops every task (its node closes): their calls are not answered.
    fn clear(&self);
}

/// The tasks of async typed handlers, of futures `F` (`Send` or not, with the table).
#[doc(hidden)]
pub struct Tasks<F: ?Sized> {
    /// The tasks not finished, by index (`None`: free, or being polled).
    slots: Mutex<Slots<F>>,
    /// What the tasks' wakers tell.
    ready: Arc<Ready>,
    /// Held by the thread polling the tasks: one at a time, so that a task woken while it
    /// is out of its slot being polled is polled again by the next run, not skipped by a
    /// concurrent one that finds its slot empty.
    running: Mutex<()>,
}

struct Slots<F: ?Sized> {
    tasks: Vec<Option<Pin<Box<F>>>>,
    free: Vec<usize>,
    live: usize,
    /// How many times the tasks were cleared: a task polled across a clear is dropped,
    /// not put back in a slot that is no longer its own.
    cleared: u64,
}

/// The tasks woken since the last run, shared with their wakers (which may be on any
/// thread).
#[derive(Default)]
struct Ready {
    woken: Mutex<Vec<usize>>,
    any: AtomicBool,
    /// The drivers asleep waiting for a task to wake ([`TaskQueue::poll_woken`]).
    drivers: Mutex<Vec<Waker>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while the lock was held left the lists whole: go on with them.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Ready {
    fn wake(&self, index: usize) {
        lock(&self.woken).push(index);
        self.any.store(true, Ordering::Release);
        for w in std::mem::take(&mut *lock(&self.drivers)) {
            w.wake();
        }
    }
}

/// One task's waker, made for one poll of it: the task is queued once however often it is
/// woken until it is polled again.
struct TaskWaker {
    index: usize,
    ready: Arc<Ready>,
    queued: AtomicBool,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.queued.swap(true, Ordering::AcqRel) {
            self.ready.wake(self.index);
        }
    }
}

impl<F: ?Sized> Default for Tasks<F> {
    fn default() -> Self {
        Tasks {
            slots: Mutex::new(Slots {
                tasks: Vec::new(),
                free: Vec::new(),
                live: 0,
                cleared: 0,
            }),
            ready: Arc::default(),
            running: Mutex::new(()),
        }
    }
}

impl<F: ?Sized> std::fmt::Debug for Tasks<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tasks")
            .field("live", &lock(&self.slots).live)
            .finish()
    }
}

impl<F: Future<Output = ()> + ?Sized> Tasks<F> {
    /// Keeps `task`, to be polled at the driver's next run.
    pub(crate) fn spawn(&self, task: Pin<Box<F>>) {
        let index = {
            let mut s = lock(&self.slots);
            s.live += 1;
            match s.free.pop() {
                Some(i) => {
                    s.tasks[i] = Some(task);
                    i
                }
                None => {
                    s.tasks.push(Some(task));
                    s.tasks.len() - 1
                }
            }
        };
        self.ready.wake(index);
    }

    fn run_woken(&self) -> bool {
        // Nothing woken, the usual case: one load, no lock.
        if !self.ready.any.load(Ordering::Acquire) {
            return false;
        }
        let _running = match self.running.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            // Another thread runs them now, and will poll what was woken meanwhile.
            Err(std::sync::TryLockError::WouldBlock) => return false,
        };
        if !self.ready.any.swap(false, Ordering::AcqRel) {
            return false;
        }
        let woken = std::mem::take(&mut *lock(&self.ready.woken));
        for index in woken {
            // Taken out while it is polled: it may spawn, or wake itself, meanwhile.
            let (task, cleared) = {
                let mut s = lock(&self.slots);
                let task = s.tasks.get_mut(index).and_then(Option::take);
                (task, s.cleared)
            };
            // Finished, or cleared: nothing to poll.
            let Some(mut task) = task else {
                continue;
            };
            let waker = Waker::from(Arc::new(TaskWaker {
                index,
                ready: self.ready.clone(),
                queued: AtomicBool::new(false),
            }));
            let done = task
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_ready();
            let mut s = lock(&self.slots);
            if s.cleared != cleared {
                drop(s);
                drop(task);
            } else if done {
                s.free.push(index);
                s.live -= 1;
            } else {
                s.tasks[index] = Some(task);
            }
        }
        true
    }

    fn poll_woken_here(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.ready.any.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        {
            let mut drivers = lock(&self.ready.drivers);
            if !drivers.iter().any(|w| w.will_wake(cx.waker())) {
                drivers.push(cx.waker().clone());
            }
        }
        // Woken between the check and the registration: not missed.
        if self.ready.any.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        Poll::Pending
    }
}

/// A `Send` table's tasks.
pub(crate) type SendTasks = Arc<Tasks<dyn Future<Output = ()> + Send>>;
/// A table's tasks that need not be `Send`.
pub(crate) type LocalTasks = std::rc::Rc<Tasks<dyn Future<Output = ()>>>;

macro_rules! task_queue {
    ($t:ty) => {
        impl TaskQueue for $t {
            fn run(&self) -> bool {
                self.run_woken()
            }
            #[inline]
            fn woken(&self) -> bool {
                self.ready.any.load(Ordering::Acquire)
            }
            fn poll_woken(&self, cx: &mut Context<'_>) -> Poll<()> {
                self.poll_woken_here(cx)
            }
            fn len(&self) -> usize {
                lock(&self.slots).live
            }
            fn clear(&self) {
                let tasks = {
                    let mut s = lock(&self.slots);
                    s.free.clear();
                    s.live = 0;
                    s.cleared += 1;
                    std::mem::take(&mut s.tasks)
                };
                lock(&self.ready.woken).clear();
                // Dropped outside the lock: a task's drop may reach its node.
                drop(tasks);
            }
        }
    };
}
task_queue!(SendTasks);
task_queue!(LocalTasks);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_runs_when_spawned_and_again_only_when_woken() {
        // Catches a task never polled, polled again with nothing woken (a driver spinning
        // on it), lost after it returned pending, or kept after it finished.
        let tasks = SendTasks::default();
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let waker: Arc<Mutex<Option<Waker>>> = Arc::default();
        let (p, w) = (polls.clone(), waker.clone());
        tasks.spawn(Box::pin(std::future::poll_fn(move |cx| {
            let n = p.fetch_add(1, Ordering::Relaxed);
            if n == 2 {
                return Poll::Ready(());
            }
            *lock(&w) = Some(cx.waker().clone());
            Poll::Pending
        })));
        assert!(tasks.woken());
        assert!(tasks.run());
        assert_eq!(polls.load(Ordering::Relaxed), 1);
        assert!(!tasks.run(), "nothing woken");
        assert_eq!(tasks.len(), 1);
        let noop = &mut Context::from_waker(Waker::noop());
        assert!(tasks.poll_woken(noop).is_pending());
        lock(&waker).take().unwrap().wake();
        assert!(tasks.poll_woken(noop).is_ready());
        assert!(tasks.run());
        lock(&waker).take().unwrap().wake_by_ref();
        assert!(tasks.run());
        assert_eq!(polls.load(Ordering::Relaxed), 3);
        assert_eq!(tasks.len(), 0, "finished");
    }

    #[test]
    fn a_task_woken_while_polled_is_polled_again_whoever_runs_meanwhile() {
        // Catches a wake lost to a second thread running the tasks while the first polls
        // the task (it found the slot empty and dropped the wake), and a task cleared while
        // it is polled put back in a slot no longer its own.
        let tasks = SendTasks::default();
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (p, t) = (polls.clone(), tasks.clone());
        tasks.spawn(Box::pin(std::future::poll_fn(move |cx| {
            if p.fetch_add(1, Ordering::Relaxed) == 1 {
                return Poll::Ready(());
            }
            cx.waker().wake_by_ref();
            // Another thread runs the tasks while this one is being polled.
            let t = t.clone();
            let ran = std::thread::spawn(move || t.run()).join().unwrap();
            assert!(!ran, "one runner at a time");
            Poll::Pending
        })));
        assert!(tasks.run());
        assert_eq!(polls.load(Ordering::Relaxed), 1);
        assert!(tasks.run(), "the wake during the poll is kept");
        assert_eq!(polls.load(Ordering::Relaxed), 2);
        assert_eq!(tasks.len(), 0);
        // Cleared while polled: dropped, not put back.
        let t = tasks.clone();
        tasks.spawn(Box::pin(std::future::poll_fn(move |_| {
            t.clear();
            Poll::<()>::Pending
        })));
        assert!(tasks.run());
        assert_eq!(tasks.len(), 0);
        tasks.spawn(Box::pin(async {}));
        assert!(tasks.run());
        assert_eq!(tasks.len(), 0, "slots usable after a clear");
    }

    #[test]
    fn a_driver_asleep_is_woken_by_a_task() {
        // Catches a task woken from another thread while the driver sleeps on
        // `poll_woken`, with the driver never told.
        let tasks = SendTasks::default();
        let flag = Arc::new(AtomicBool::new(false));
        struct Flag(Arc<AtomicBool>);
        impl Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::Release);
            }
        }
        let driver = Waker::from(Arc::new(Flag(flag.clone())));
        assert!(tasks
            .poll_woken(&mut Context::from_waker(&driver))
            .is_pending());
        let t = tasks.clone();
        std::thread::spawn(move || t.spawn(Box::pin(async {})))
            .join()
            .unwrap();
        assert!(flag.load(Ordering::Acquire));
        assert!(tasks.run());
        assert_eq!(tasks.len(), 0);
    }
}
