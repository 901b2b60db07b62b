//! What an [`AsyncNode`] asks of its tokio runtime: its drivers (`drive`, `run`) fail in
//! words on a runtime they cannot sleep on (I/O or timers not enabled, or no runtime at all)
//! rather than panic inside tokio.

use std::time::Duration;

use amnet::{
    AmError, AsyncNode, Config, HandlerId, Handlers, Loopback, LoopbackConfig, Node, RuntimeError,
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
