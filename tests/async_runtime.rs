//! What an [`AsyncNode`] asks of its tokio runtime: its drivers (`drive`, `run`) fail in
//! words on a runtime they cannot sleep on (I/O or timers not enabled, or no runtime at all)
//! rather than panic inside tokio; and calls awaited on a runtime where no driver runs make
//! progress themselves and sleep while they wait, not spin.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use amnet::{
    run_ranks, AmError, AsyncNode, Config, HandlerId, Handlers, Loopback, LoopbackConfig, Node,
    RuntimeError, Transport,
};

mod common;
use common::within;

const SQUARE: HandlerId = HandlerId(1);

fn handlers() -> Handlers {
    let mut h = Handlers::new();
    h.callable(SQUARE, "square", |msg, call| {
        let x = msg.args()[0];
        call.reply(&[x * x], &[]).expect("answer");
    })
    .expect("register");
    h
}

/// A node of a job of one rank.
fn alone() -> AsyncNode<Loopback> {
    let t = Loopback::cluster(1, LoopbackConfig::default()).remove(0);
    AsyncNode::new(Node::new(t, handlers(), Config::default()).expect("start"))
}

/// Catches issue 77's panic inside the library: `drive` and `run` on a current-thread
/// runtime built without `enable_io()` panicked in tokio's `AsyncFd`. They return
/// `AmError::Runtime(RuntimeError::IoDisabled)` instead, whose message names what to enable,
/// and `run` does not poll its future; `run_spinning`, which sleeps on nothing, still runs.
#[test]
fn drivers_fail_in_words_on_a_runtime_without_io() {
    within(Duration::from_secs(60), || {
        let node = alone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        let e = rt.block_on(node.drive()).expect_err("drive without I/O");
        assert_eq!(e, AmError::Runtime(RuntimeError::IoDisabled));
        let said = e.to_string();
        assert!(
            said.contains("enable_io()") && said.contains("enable_all()"),
            "{said}"
        );
        let mut polled = false;
        let e = rt
            .block_on(node.run(async { polled = true }))
            .expect_err("run without I/O");
        assert_eq!(e, AmError::Runtime(RuntimeError::IoDisabled));
        assert!(
            !polled,
            "run polled its future on a runtime it cannot drive"
        );
        let answer = rt
            .block_on(node.run_spinning(node.call(0, SQUARE, &[3], &[])))
            .expect("run_spinning needs no I/O");
        assert_eq!(answer.expect("call").args, [9]);
    });
}

/// Catches a driver that panics inside tokio on a runtime built with I/O but without
/// `enable_time()` (its sleeps' bound, a `tokio::time::sleep`): `drive`, `run` and
/// `run_spinning` fail with `RuntimeError::TimeDisabled`, which names what to enable.
#[test]
fn drivers_fail_in_words_on_a_runtime_without_timers() {
    within(Duration::from_secs(60), || {
        let node = alone();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .expect("runtime");
        let timers = AmError::Runtime(RuntimeError::TimeDisabled);
        assert_eq!(rt.block_on(node.drive()), Err(timers.clone()));
        assert_eq!(rt.block_on(node.run(async {})), Err(timers.clone()));
        assert_eq!(
            rt.block_on(node.run_spinning(async {})),
            Err(timers.clone())
        );
        assert!(timers.to_string().contains("enable_time()"), "{timers}");
    });
}

/// Catches a driver that panics inside tokio ("there is no reactor running") when it is
/// polled by another executor: `drive` fails with `RuntimeError::NoRuntime`.
#[test]
fn a_driver_outside_a_tokio_runtime_fails_in_words() {
    within(Duration::from_secs(60), || {
        let node = alone();
        let e = amnet::future::block_on(&node, node.drive()).expect_err("no runtime");
        assert_eq!(e, AmError::Runtime(RuntimeError::NoRuntime));
        assert!(e.to_string().contains("tokio runtime"), "{e}");
    });
}

/// Counts the polls of the future it wraps.
struct Counted<F> {
    fut: Pin<Box<F>>,
    polls: u64,
}

impl<F: Future> Future for Counted<F> {
    type Output = (F::Output, u64);
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.polls += 1;
        let polls = self.polls;
        self.fut.as_mut().poll(cx).map(|out| (out, polls))
    }
}

fn counted<F: Future>(fut: F) -> Counted<F> {
    Counted {
        fut: Box::pin(fut),
        polls: 0,
    }
}

/// Catches issue 77's spinning wait: two calls awaited together on a tokio runtime with no
/// driver task, to a rank that answers half a second later, were polled (and made rounds of
/// progress) over and over, each round waking the other, at about 65% of a core. Asleep on
/// the node's wake descriptor, they are polled a bounded number of times: `Config::spin_polls`
/// rounds, then about twice per sleep of at most 10 ms; the bound allows one poll per
/// millisecond of waiting, five times that, and counts polls, not CPU time.
#[test]
fn calls_awaited_without_a_driver_sleep_under_tokio() {
    const LATE: Duration = Duration::from_millis(500);
    const SPIN: u32 = 16;
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let config = Config::default().spin_polls(SPIN);
            if t.rank() == 1 {
                let mut node = Node::new(t, handlers(), config).expect("start");
                std::thread::sleep(LATE);
                node.barrier().expect("barrier");
                return;
            }
            let node = AsyncNode::new(Node::new(t, handlers(), config).expect("start"));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let t0 = Instant::now();
                let ((three, polls3), (four, polls4)) = tokio::join!(
                    counted(node.call(1, SQUARE, &[3], &[])),
                    counted(node.call(1, SQUARE, &[4], &[])),
                );
                let waited = t0.elapsed();
                assert_eq!(three.expect("call").args, [9]);
                assert_eq!(four.expect("call").args, [16]);
                let allowed = u64::from(SPIN) + 16 + waited.as_millis() as u64;
                for polls in [polls3, polls4] {
                    assert!(
                        polls <= allowed,
                        "a call was polled {polls} times in {waited:?} without a driver \
                         (at most {allowed} if it sleeps)"
                    );
                }
                node.barrier().await.expect("barrier");
            });
        });
    });
}
