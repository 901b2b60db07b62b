//! A node of `Send` handlers moves to another thread between calls and goes on there: its
//! handlers run on the thread that polls it, with what they captured.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use am_core::{run_ranks, AmKind, Config, HandlerId, Handlers, Loopback, LoopbackConfig, Node};

const PING: HandlerId = HandlerId(1);
const PONG: HandlerId = HandlerId(2);

/// Runs `f` on its own thread; panics if it has not finished within `limit` (the thread is
/// then left behind, and dies with the process).
fn within<R: Send + 'static>(limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(r)) => r,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(e) => panic!("the job did not finish within {limit:?} ({e}): a rank hangs"),
    }
}

#[test]
fn a_node_moves_to_another_thread_and_goes_on() {
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let pongs = Arc::new(AtomicU32::new(0));
            let ran_on = Arc::new(std::sync::Mutex::new(Vec::new()));
            let mut handlers = Handlers::new();
            let on = ran_on.clone();
            handlers
                .request(PING, "ping", AmKind::Short, move |msg, token| {
                    on.lock().unwrap().push(std::thread::current().id());
                    let _ = token.reply_short(PONG, &[msg.args()[0] + 1]);
                })
                .unwrap();
            let seen = pongs.clone();
            handlers
                .reply(PONG, "pong", AmKind::Short, move |msg| {
                    seen.store(msg.args()[0], Ordering::Release);
                })
                .unwrap();
            let mut node = Node::new(t, handlers, Config::default()).unwrap();
            // One round trip here, then the node moves to a new thread for ten more.
            let round = |node: &mut Node<Loopback>, i: u32| {
                if node.rank() == 0 {
                    node.request_short(1, PING, &[i]).unwrap();
                    node.wait_until(|| pongs.load(Ordering::Acquire) == i + 1)
                        .unwrap();
                }
                node.barrier().unwrap();
            };
            round(&mut node, 10);
            let here = std::thread::current().id();
            let (node, there) = std::thread::scope(|s| {
                s.spawn(move || {
                    for i in 0..10 {
                        round(&mut node, 100 * i);
                    }
                    (node, std::thread::current().id())
                })
                .join()
                .unwrap()
            });
            if node.rank() == 1 {
                let ran = ran_on.lock().unwrap();
                assert_eq!(ran.len(), 11);
                assert_eq!(ran[0], here, "the first request on the first thread");
                assert!(
                    ran[1..].iter().all(|&id| id == there),
                    "then on the new one"
                );
            }
            drop(node);
        });
    });
}
