//! Put-with-signal and `wait_word` on every driver: hand-offs between an `AsyncNode` under
//! the runtime-agnostic `block_on` and a `SharedNode` whose waits give the lock back, in
//! `AM_WAIT=block`; and a wait on a word that no rank is left to signal fails instead of
//! waiting for ever. (Every transport's own hand-offs are `conformance::put_signal_hands_off`.)

use std::sync::mpsc;
use std::time::Duration;

use am_core::future::block_on;
use am_core::*;

/// Ends the test process if the test runs past `limit`: a wait that never ends fails.
fn watchdog(limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("still running after {limit:?}: a wait for a signal never ended");
        std::process::exit(101);
    });
}

fn config() -> Config {
    Config::default().wait_mode(WaitMode::Block)
}

/// Rank 0 drives an `AsyncNode`, rank 1 a `SharedNode`; they pass 50 blocks back and forth,
/// each woken from its sleep by the other's signal, and each finds the block in place.
/// Catches a driver whose wait for a word never looks again after a signal's message (the
/// watchdog), or that looks before the data is in place.
#[test]
fn hand_offs_between_an_async_and_a_shared_node() {
    watchdog(Duration::from_secs(60));
    let rounds = 50u64;
    run_ranks(
        Loopback::cluster(2, LoopbackConfig::default().segment_size(1 << 16)),
        |t| {
            let node = Node::new(t, Handlers::new(), config()).expect("start");
            let block = |r: u64| [r as u8; 256];
            if node.rank() == 0 {
                let node = AsyncNode::new(node);
                for r in 1..=rounds {
                    block_on(
                        &node,
                        node.put_signal(1, 1024, &block(r), 0, Signal::Set(r)),
                    )
                    .expect("put_signal");
                    block_on(&node, node.wait_word(8, Cmp::Ge, r)).expect("wait_word");
                    let got = node.with(|n| n.get(0, 2048, 256)).expect("get");
                    assert_eq!(got, block(r + 100), "round {r}");
                }
                block_on(&node, node.barrier()).expect("barrier");
            } else {
                let node = SharedNode::new(node);
                for r in 1..=rounds {
                    node.wait_word(0, Cmp::Eq, r).expect("wait_word");
                    assert_eq!(node.get(1, 1024, 256).expect("get"), block(r), "round {r}");
                    node.put_signal(0, 2048, &block(r + 100), 8, Signal::Add(1))
                        .expect("put_signal");
                }
                node.barrier().expect("barrier");
            }
        },
    );
}

/// A wait on a word that no rank is left to signal: rank 1 leaves having signalled once,
/// and rank 0's wait for a second signal fails with `PeerDeparted(1)` (a job of two: nobody
/// else could signal). Catches a wait that sleeps for ever once the job has nobody to end it.
#[test]
fn a_wait_nobody_can_end_fails() {
    watchdog(Duration::from_secs(60));
    let (left_tx, left_rx) = mpsc::channel::<()>();
    let left_rx = std::sync::Mutex::new(left_rx);
    let left_tx = std::sync::Mutex::new(left_tx);
    let results = run_ranks(
        Loopback::cluster(2, LoopbackConfig::default().segment_size(1 << 16)),
        |t| {
            let mut node = Node::new(t, Handlers::new(), config()).expect("start");
            if node.rank() == 1 {
                node.put_signal(0, 64, &[1; 8], 0, Signal::Add(1))
                    .expect("put_signal");
                node.quiesce().expect("quiesce");
                drop(node);
                left_tx.lock().unwrap().send(()).unwrap();
                return None;
            }
            node.wait_word(0, Cmp::Eq, 1).expect("the first signal");
            // Polling (rank 1's signal completes once answered) until rank 1 has left.
            let left = left_rx.lock().unwrap();
            node.wait_until(|| left.try_recv().is_ok())
                .expect("rank 1 leaves");
            Some(node.wait_word(0, Cmp::Eq, 2))
        },
    );
    assert_eq!(results[0], Some(Err(AmError::PeerDeparted(1))));
}

/// A put-with-signal whose wake-up waits for a credit when its target leaves: it fails with
/// `PeerDeparted`, never a panic. With one credit, and rank 1 quiet and no longer polling
/// after the barrier, the barrier's credit is not home yet: the wake-up waits for it until
/// rank 1 has gone (or, if rank 1 left first, the NIC's put is refused): the same error
/// either way. Catches a put-with-signal to a departing target that fails with anything
/// else, or waits for ever (`endpoint_one_sided` drives the cut-short slot itself).
#[test]
fn a_put_signal_waiting_for_a_credit_fails_when_its_target_leaves() {
    watchdog(Duration::from_secs(60));
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let go_tx = std::sync::Mutex::new(go_tx);
    let go_rx = std::sync::Mutex::new(go_rx);
    let results = run_ranks(
        Loopback::cluster(2, LoopbackConfig::default().segment_size(1 << 16)),
        |t| {
            let config = Config::default().credits(Credits::Static(1));
            let mut node = Node::new(t, Handlers::new(), config).expect("start");
            node.barrier().expect("barrier");
            if node.rank() == 1 {
                node.quiesce().expect("quiesce");
                go_rx.lock().unwrap().recv().unwrap();
                std::thread::sleep(Duration::from_millis(20));
                drop(node);
                return None;
            }
            go_tx.lock().unwrap().send(()).unwrap();
            Some(node.put_signal(1, 64, &[2; 8], 0, Signal::Add(1)))
        },
    );
    assert_eq!(results[0], Some(Err(AmError::PeerDeparted(1))));
}
