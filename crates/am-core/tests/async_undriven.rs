//! Futures of an [`AsyncNode`] that no driver serves (no `drive`, `run` or progress thread)
//! make progress themselves, and sleep while nothing comes: under a plain executor, which
//! polls a future only when it is woken, a call whose answer is late is polled a bounded
//! number of times, not once per turn of a spinning loop. The bound counts polls, not time:
//! a slow machine polls less, never more. (The same under tokio is the facade's,
//! `tests/async_runtime.rs`.)

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use am_core::{
    run_ranks, AsyncNode, Config, HandlerId, Handlers, Loopback, LoopbackConfig, Node, Transport,
};

mod watchdog;
use watchdog::within;

const SQUARE: HandlerId = HandlerId(1);

/// How long the answering rank leaves its node alone before it serves the call.
const LATE: Duration = Duration::from_millis(500);

/// Idle rounds an undriven future spins before it sleeps (`Config::spin_polls`).
const SPIN: u32 = 16;

/// Wakes the executor's thread.
struct Unpark {
    thread: std::thread::Thread,
    woken: AtomicBool,
}

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.thread.unpark();
    }
}

/// A plain executor (as `futures::executor::block_on`): polls `fut`, then parks the thread
/// until its waker is woken; makes no progress of its own. The output, and how many times
/// `fut` was polled.
fn block_on_counting<F: Future>(fut: F) -> (F::Output, u64) {
    let unpark = Arc::new(Unpark {
        thread: std::thread::current(),
        woken: AtomicBool::new(false),
    });
    let waker = Waker::from(unpark.clone());
    let mut cx = Context::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    let mut polls = 0u64;
    loop {
        polls += 1;
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return (out, polls);
        }
        while !unpark.woken.swap(false, Ordering::AcqRel) {
            std::thread::park();
        }
    }
}

fn handlers() -> Handlers {
    let mut h = Handlers::new();
    h.callable(SQUARE, "square", |msg, call| {
        let x = msg.args()[0];
        call.reply(&[x * x], &[]).expect("answer");
    })
    .expect("register");
    h
}

/// Catches the undriven future that spins while it waits (issue 77: a call awaited without
/// a driver used about 65% of a core): it woke itself after every round of progress, so a
/// plain executor polled it tens of thousands of times while the answer was late. Asleep,
/// armed on the node's wake descriptor, it is polled `SPIN` times and then about twice per
/// sleep of at most 10 ms; the bound allows one poll per millisecond of waiting, five times
/// that. Also checks that the answer, once it comes, wakes the sleeping call.
#[test]
fn an_undriven_call_sleeps_while_its_answer_is_late() {
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let config = Config::default().spin_polls(SPIN);
            if t.rank() == 1 {
                let mut node = Node::new(t, handlers(), config).expect("start");
                std::thread::sleep(LATE);
                // Serves the call meanwhile.
                node.barrier().expect("barrier");
                return;
            }
            let node = AsyncNode::new(Node::new(t, handlers(), config).expect("start"));
            let t0 = Instant::now();
            let (answer, polls) = block_on_counting(node.call(1, SQUARE, &[7], &[]));
            let waited = t0.elapsed();
            assert_eq!(answer.expect("call").args, [49]);
            let allowed = u64::from(SPIN) + 16 + waited.as_millis() as u64;
            assert!(
                polls <= allowed,
                "the call was polled {polls} times in {waited:?} without a driver \
                 (at most {allowed} if it sleeps)"
            );
            let (barrier, _) = block_on_counting(node.barrier());
            barrier.expect("barrier");
        });
    });
}
