//! An aborted job fails everything pending, on every driver: a rank panics while another has
//! calls in flight (some sent, some still waiting for a credit) and a barrier entered; every
//! one of them completes with `AmError::JobAborted`, every later operation fails at once,
//! and the node's operation table is empty afterwards.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use am_core::{
    run_ranks, AmError, AsyncNode, Config, Credits, HandlerId, Handlers, Loopback, LoopbackConfig,
    Node, ProgressThread, Reply, SharedNode, WaitMode,
};

mod watchdog;
use watchdog::within;

const SQUARE: HandlerId = HandlerId(1);
/// Calls rank 1 has in flight when rank 0 panics: more than its credits, so that some wait
/// for a credit that never comes.
const CALLS: usize = 50;
const CREDITS: u32 = 8;
const LIMIT: Duration = Duration::from_secs(20);

/// A future of the job's, boxed so that several kinds wait in one set.
type Boxed<T> = Pin<Box<dyn Future<Output = T> + Send>>;

fn handlers() -> Handlers {
    let mut h = Handlers::new();
    h.callable(SQUARE, "square", |msg, call| {
        let x = msg.args()[0];
        let _ = call.reply(&[x * x], &[]);
    })
    .expect("register");
    h
}

fn config() -> Config {
    Config::default()
        .credits(Credits::Static(CREDITS))
        .wait_mode(WaitMode::Block)
}

const GIVE_UP: &str = "rank 0 gives up on purpose";

/// Runs a job of two Loopback ranks: rank 0 never polls, waits until `ready` is set, then
/// panics (which aborts the job); rank 1 runs `caller` with `ready` to set once its calls
/// are in flight. Returns once both ranks ended; rank 0's panic is expected, `caller`'s
/// (a failed assertion) is re-raised.
fn job(caller: impl Fn(Node<Loopback>, &AtomicBool) + Sync + Send + 'static) {
    within(LIMIT, move || {
        let ready = AtomicBool::new(false);
        let outcome = std::sync::Mutex::new(None);
        let job = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
                let node = Node::new(t, handlers(), config()).expect("start");
                if node.rank() == 0 {
                    let deadline = Instant::now() + LIMIT;
                    while !ready.load(Ordering::SeqCst) {
                        assert!(Instant::now() < deadline, "rank 1 never got its calls out");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    // Let the last calls reach their wait for a credit.
                    std::thread::sleep(Duration::from_millis(50));
                    panic!("{GIVE_UP}");
                }
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    caller(node, &ready);
                }));
                // Unblocks rank 0 if the caller failed before it was ready.
                ready.store(true, Ordering::SeqCst);
                *outcome.lock().unwrap() = Some(r);
            })
        }));
        match outcome.into_inner().unwrap() {
            Some(Ok(())) => {}
            Some(Err(p)) => std::panic::resume_unwind(p),
            None => panic!("rank 1 never finished"),
        }
        let p = job.expect_err("rank 0's panic is re-raised by run_ranks");
        assert_eq!(
            p.downcast_ref::<String>().map(String::as_str),
            Some(GIVE_UP)
        );
    });
}

/// Polls every future of `futures` until all are ready, waking on their wakers; fails the
/// test (rather than hanging) if one is still pending after `limit`.
fn join_all<T>(
    mut futures: Vec<Pin<Box<dyn Future<Output = T> + Send>>>,
    limit: Duration,
) -> Vec<T> {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut out: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    let deadline = Instant::now() + limit;
    loop {
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                    *o = Some(v);
                }
            }
        }
        let left = out.iter().filter(|o| o.is_none()).count();
        if left == 0 {
            return out.into_iter().map(Option::unwrap).collect();
        }
        assert!(
            Instant::now() < deadline,
            "{left} futures still pending {limit:?} after the job was aborted"
        );
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

/// The async driver with a progress thread: the futures leave progress to it, so nothing
/// but the abort itself can end them. Catches futures left parked in the table of calls
/// (or waiting for a credit) when the job aborts: they never resolved.
#[test]
fn an_aborted_job_fails_every_pending_future() {
    job(|node, ready| {
        let node = AsyncNode::new(node);
        let progress = ProgressThread::spawn(node.clone()).expect("progress thread");
        let mut futures: Vec<Boxed<Result<Reply, AmError>>> = (0..CALLS as u32)
            .map(|i| Box::pin(node.call(0, SQUARE, &[i], &[])) as Pin<Box<_>>)
            .collect();
        // Every future started: the first CREDITS sent, the rest waiting for a credit.
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        for f in &mut futures {
            assert!(
                f.as_mut().poll(&mut cx).is_pending(),
                "rank 0 never answers"
            );
        }
        ready.store(true, Ordering::SeqCst);
        for r in join_all(futures, LIMIT / 4) {
            assert_eq!(r.map(|_| ()), Err(AmError::JobAborted));
        }
        // Later operations fail at once, the driver's too.
        let later: Vec<Result<Reply, AmError>> = join_all(
            vec![Box::pin(node.call(0, SQUARE, &[1], &[])) as Pin<Box<_>>],
            Duration::from_secs(2),
        );
        assert_eq!(later[0].as_ref().map(|_| ()), Err(&AmError::JobAborted));
        let barrier = join_all(
            vec![Box::pin(node.barrier()) as Boxed<_>],
            Duration::from_secs(2),
        );
        assert_eq!(barrier[0], Err(AmError::JobAborted));
        assert_eq!(
            node.with(|n| n.ops_in_flight()),
            0,
            "nothing left in flight"
        );
        assert_eq!(progress.stop(), Err(AmError::JobAborted));
    });
}

/// The blocking driver: handles of calls in flight complete with the abort (all of them, in
/// one `wait_all`), a call that waited for a credit returns it, and a put, a barrier and a
/// test afterwards fail at once. Holds the blocking driver to the contract the async one
/// broke: would catch a handle a `test` reports pending for ever after the abort, or an
/// operation started after it that waits.
#[test]
fn an_aborted_job_fails_every_pending_handle() {
    job(|mut node, ready| {
        let ops: Vec<_> = (0..CREDITS)
            .map(|i| node.call_nb(0, SQUARE, &[i], &[]).expect("sent"))
            .collect();
        ready.store(true, Ordering::SeqCst);
        // Out of credit: waits until the abort ends it.
        assert_eq!(
            node.call_nb(0, SQUARE, &[99], &[]).map(|_| ()),
            Err(AmError::JobAborted)
        );
        for op in &ops {
            assert_ne!(
                node.test(op),
                Ok(false),
                "a handle still pending after the abort"
            );
        }
        let all = node.wait_all(ops);
        assert_eq!(all.map(|_| ()), Err(AmError::JobAborted));
        assert_eq!(node.put(0, 0, &[1; 8]), Err(AmError::JobAborted));
        assert_eq!(node.barrier(), Err(AmError::JobAborted));
        assert_eq!(node.ops_in_flight(), 0);
    });
}

/// The shared driver, a thread waiting on each call: every waiter returns with the abort.
/// Would catch a waiter whose thread polls in vain (the lock held by another waiter that
/// returned with the error) and never sees its call fail.
#[test]
fn an_aborted_job_fails_every_shared_waiter() {
    job(|node, ready| {
        let node = SharedNode::new(node);
        let ops: Vec<_> = (0..CREDITS)
            .map(|i| node.call_nb(0, SQUARE, &[i], &[]).expect("sent"))
            .collect();
        std::thread::scope(|s| {
            let waiters: Vec<_> = ops
                .into_iter()
                .map(|op| {
                    let node = &node;
                    s.spawn(move || node.wait(op).map(|_| ()))
                })
                .collect();
            ready.store(true, Ordering::SeqCst);
            for w in waiters {
                assert_eq!(w.join().expect("waiter"), Err(AmError::JobAborted));
            }
        });
        assert_eq!(
            node.call(0, SQUARE, &[1], &[]).map(|_| ()),
            Err(AmError::JobAborted)
        );
        assert_eq!(node.ops_in_flight(), 0);
        // Closing an ended node waits for nothing: the abort stands.
        assert_eq!(node.close(), Ok(()));
        assert_eq!(node.barrier(), Err(AmError::JobAborted));
    });
}
