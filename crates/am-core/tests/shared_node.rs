//! Nodes and threads: a node of `Send` handlers moves to another thread between calls and
//! goes on there; several threads on one node ([`SharedNode`]) deliver every message of a
//! flood exactly once; a rank whose only thread does not poll still answers its peers while
//! a progress thread ([`ProgressThread`]) runs.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use am_core::{
    run_ranks, AmKind, Config, HandlerId, Handlers, Loopback, LoopbackConfig, Node, ProgressThread,
    SharedNode, WaitMode,
};

mod watchdog;
use watchdog::within;

const HIT: HandlerId = HandlerId(1);
const ASK: HandlerId = HandlerId(2);
const ANSWER: HandlerId = HandlerId(3);
const PING: HandlerId = HandlerId(4);
const PONG: HandlerId = HandlerId(5);

/// Threads per rank, and messages each of them sends to the other rank.
const THREADS: u32 = 4;
const EACH: u32 = 2000;

/// Two ranks, four threads each sending to the other rank on one shared node (the credits
/// run out many times over: the senders poll for them in turn): every (thread, sequence)
/// arrives once, with its payload; nothing is lost or doubled, whatever the wait mode (with
/// `Block`, no thread sleeps in the transport while it holds the node).
#[test]
fn threads_flooding_one_node_deliver_every_message_once() {
    for wait in [WaitMode::Spin, WaitMode::SpinThenYield, WaitMode::Block] {
        within(Duration::from_secs(120), move || {
            run_ranks(Loopback::cluster(2, LoopbackConfig::default()), move |t| {
                let seen: Arc<Vec<AtomicU8>> =
                    Arc::new((0..THREADS * EACH).map(|_| AtomicU8::new(0)).collect());
                let bad = Arc::new(AtomicU32::new(0));
                let mut handlers = Handlers::new();
                let (s, b) = (seen.clone(), bad.clone());
                handlers
                    .request(HIT, "hit", AmKind::Medium, move |msg, _| {
                        let (th, i) = (msg.args()[0], msg.args()[1]);
                        let want = (th * EACH + i).to_le_bytes();
                        if th >= THREADS || i >= EACH || msg.payload() != want {
                            b.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                        s[(th * EACH + i) as usize].fetch_add(1, Ordering::Relaxed);
                    })
                    .unwrap();
                let config = Config::default().wait_mode(wait);
                let node = SharedNode::new(Node::new(t, handlers, config).unwrap());
                let peer = 1 - node.rank();
                std::thread::scope(|sc| {
                    for th in 0..THREADS {
                        let node = node.clone();
                        sc.spawn(move || {
                            for i in 0..EACH {
                                let payload = (th * EACH + i).to_le_bytes();
                                node.request_medium(peer, HIT, &[th, i], &payload).unwrap();
                            }
                        });
                    }
                });
                let all = || seen.iter().all(|c| c.load(Ordering::Relaxed) > 0);
                node.wait_until(all).unwrap();
                node.barrier().unwrap();
                assert_eq!(bad.load(Ordering::Relaxed), 0, "{wait:?}: a wrong message");
                let twice = seen
                    .iter()
                    .filter(|c| c.load(Ordering::Relaxed) > 1)
                    .count();
                assert_eq!(twice, 0, "{wait:?}: messages delivered twice");
            });
        });
    }
}

/// Rank 1's only thread never polls (it waits on an atomic the handlers set); its progress
/// thread runs the handlers, so rank 0's requests are answered. The progress thread stops
/// cleanly, with no error, and the ranks meet in a barrier after.
#[test]
fn a_progress_thread_serves_a_rank_that_does_not_poll() {
    const ASKS: u32 = 500;
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let asked = Arc::new(AtomicU32::new(0));
            let answers = Arc::new(AtomicU32::new(0));
            let mut handlers = Handlers::new();
            let a = asked.clone();
            handlers
                .request(ASK, "ask", AmKind::Short, move |msg, token| {
                    a.fetch_add(1, Ordering::Release);
                    let _ = token.reply_short(ANSWER, &[msg.args()[0] * 2]);
                })
                .unwrap();
            let n = answers.clone();
            handlers
                .reply(ANSWER, "answer", AmKind::Short, move |msg| {
                    assert_eq!(msg.args()[0] % 2, 0);
                    n.fetch_add(1, Ordering::Release);
                })
                .unwrap();
            let node = SharedNode::new(Node::new(t, handlers, Config::default()).unwrap());
            assert_eq!(node.limits(), node.lock().limits());
            if node.rank() == 0 {
                for i in 0..ASKS {
                    node.request_short(1, ASK, &[i]).unwrap();
                }
                node.wait_until(|| answers.load(Ordering::Acquire) == ASKS)
                    .unwrap();
            } else {
                let progress = ProgressThread::spawn(node.clone()).unwrap();
                // "Compute": never call into the library until every request was served.
                let done = AtomicBool::new(false);
                while !done.load(Ordering::Relaxed) {
                    done.store(asked.load(Ordering::Acquire) == ASKS, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(100));
                }
                progress.stop().unwrap();
            }
            node.barrier().unwrap();
        });
    });
}

/// The node's handlers run on whichever thread polls it: the first request on the thread
/// that made the node, the next ten on the one it moved to.
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

/// `SharedNode::close` while another thread waits for a call its peer never answers: the
/// close waits at most `close_timeout`, the waiting thread's call then fails with
/// `NodeClosed`, and a later operation fails at once. Catches a close that leaves the other
/// threads' operations pending for ever.
#[test]
fn closing_a_shared_node_fails_the_other_threads_operations() {
    within(Duration::from_secs(60), || {
        let closed = AtomicBool::new(false);
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let mut handlers = Handlers::new();
            handlers
                .callable(ASK, "ask", |_, call| {
                    let _ = call.reply(&[1], &[]);
                })
                .expect("register");
            let config = Config::default().close_timeout(Duration::from_millis(300));
            let mut node = Node::new(t, handlers, config).expect("start");
            node.barrier().expect("barrier");
            if node.rank() == 1 {
                while !closed.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                return;
            }
            let node = SharedNode::new(node);
            let op = node.call_nb(1, ASK, &[], &[]).expect("sent");
            std::thread::scope(|s| {
                let waiter = s.spawn(|| node.wait(op).map(|_| ()));
                std::thread::sleep(Duration::from_millis(50));
                assert_eq!(node.close(), Ok(()));
                let got = waiter.join().expect("waiter");
                assert_eq!(got, Err(am_core::AmError::NodeClosed));
            });
            assert_eq!(
                node.call(1, ASK, &[], &[]).map(|_| ()),
                Err(am_core::AmError::NodeClosed)
            );
            closed.store(true, Ordering::Release);
        });
    });
}

/// A thread that takes the node again as soon as it gives it back, holding it a while each
/// time (as a step of a long move in segment 0 does), does not keep another thread from the
/// node: the other gets it within a few of those holds. Catches a lock that is not
/// eventually fair (`std::sync::Mutex`, which lets the thread that unlocks take it again
/// before the waiter it woke runs) on a quiet machine, where the waiter then goes without
/// the node for all the holds; under load it may take the node between two holds, and such
/// a lock passes.
#[test]
fn a_thread_that_takes_the_node_again_at_once_does_not_starve_another() {
    const HOLDS: u32 = 200;
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(1, LoopbackConfig::default()), |t| {
            let node = SharedNode::new(Node::new(t, Handlers::new(), Config::default()).unwrap());
            let (holding, served) = (AtomicBool::new(false), AtomicBool::new(false));
            let holds = std::thread::scope(|s| {
                let hog = s.spawn(|| {
                    let mut holds = 0;
                    while holds < HOLDS && !served.load(Ordering::Acquire) {
                        let node = node.lock();
                        holding.store(true, Ordering::Release);
                        std::thread::sleep(Duration::from_millis(1));
                        drop(node);
                        holds += 1;
                    }
                    holds
                });
                while !holding.load(Ordering::Acquire) {
                    std::thread::yield_now();
                }
                let _ = node.lock().ops_in_flight();
                served.store(true, Ordering::Release);
                hog.join().expect("hog")
            });
            assert!(
                holds < HOLDS,
                "the other thread took the node again {holds} times in a row"
            );
        });
    });
}
