//! The operation model ([`am_core::op`]): one handle for every operation, that a blocking
//! caller waits on, a poller tests, a batch completes together, and that never leaks when
//! dropped; the same operations on every driver. Over Loopback without its own puts, gets
//! and atomics, so that every operation waits for answers in the node's table.

mod by_messages;
mod watchdog;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use am_core::{
    AmError, AmKind, AsyncNode, AtomicOp, Config, HandlerId, Handlers, Loopback, Node, Op, Reply,
    SharedNode, TryRequestError,
};
use by_messages::NoDirectRma;
use watchdog::within;

const SQUARE: HandlerId = HandlerId(1);
const HIT: HandlerId = HandlerId(2);
const LIMIT: Duration = Duration::from_secs(120);

fn handlers() -> Handlers {
    let mut h = Handlers::new();
    h.callable(SQUARE, "square", |msg, call| {
        let x = msg.args()[0];
        let _ = call.reply(&[x.wrapping_mul(x)], &[]);
    })
    .expect("register");
    h.request(HIT, "hit", AmKind::Short, |_, _| {})
        .expect("register");
    h
}

/// Two Loopback ranks whose one-sided operations travel as messages.
fn by_messages() -> Vec<NoDirectRma> {
    Loopback::cluster(2, Default::default())
        .into_iter()
        .map(NoDirectRma)
        .collect()
}

/// Two ranks over Loopback whose one-sided operations travel as messages, each running `f`
/// on its started node, under a watchdog.
fn pair<R: Send + 'static>(f: fn(Node<NoDirectRma>) -> R) -> Vec<R> {
    within(LIMIT, move || {
        am_core::run_ranks(by_messages(), |t| {
            f(Node::new(t, handlers(), Config::default()).expect("start"))
        })
    })
}

const N: usize = 10_000;

/// Catches: a handle dropped before completion that keeps its slot (no `Drop`, or a detached
/// slot never freed when its last answer comes), a dropped call never closed, a dropped
/// barrier that is never finished (or is taken for the next one), and a table that a storm
/// of detached operations leaves unusable.
#[test]
fn dropped_handles_of_every_kind_leak_nothing() {
    pair(|mut node| {
        let peer = 1 - node.rank();
        let mut buf = [0u8; 64];
        for i in 0..N {
            drop(node.put_nb(peer, (i % 64) * 64, &[i as u8; 64]).unwrap());
            drop(node.get_nb(peer, 0, 64).unwrap());
            drop(node.get_into_nb(peer, 64, &mut buf).unwrap());
            drop(
                node.atomic_nb(peer, 8192, AtomicOp::FetchAdd(1u64))
                    .unwrap(),
            );
            drop(node.call_nb(peer, SQUARE, &[i as u32], &[]).unwrap());
            drop(node.barrier_nb().unwrap());
        }
        // Every dropped operation completes: the atomics all landed, the barriers were all
        // left (one more meets the peer's), and nothing is left in the table.
        node.barrier().unwrap();
        node.quiesce().unwrap();
        node.barrier().unwrap();
        assert_eq!(node.segment().load_u64(8192).unwrap(), N as u64);
        assert_eq!(node.ops_in_flight(), 0, "rank {}", node.rank());
        // And 10,000 more of each succeed.
        for i in 0..N {
            let x = i as u32;
            node.put(peer, 4096, &x.to_le_bytes()).unwrap();
            let back = node.get(peer, 4096, 4).unwrap();
            assert_eq!(back, x.to_le_bytes());
            assert_eq!(
                node.get_into(peer, 4096, &mut buf[..4]).unwrap(),
                x.to_le_bytes()
            );
            let old: u64 = node.atomic(peer, 8200, AtomicOp::FetchAdd(1u64)).unwrap();
            assert_eq!(old, i as u64);
            assert_eq!(
                node.call(peer, SQUARE, &[x], &[]).unwrap().args,
                [x.wrapping_mul(x)]
            );
            node.barrier().unwrap();
        }
        assert_eq!(node.ops_in_flight(), 0);
        node.barrier().unwrap();
    });
}

/// Catches: `wait_some` returning an operation twice or never, taking out one that is not
/// complete, or returning nothing (spinning) while some are complete.
#[test]
fn wait_some_over_1000_puts_returns_each_exactly_once() {
    pair(|mut node| {
        let peer = 1 - node.rank();
        let me = node.rank() as u8;
        let mut ops: Vec<Option<Op<()>>> = (0..1000)
            .map(|i| Some(node.put_nb(peer, i * 8, &[me + 1; 8]).unwrap()))
            .collect();
        let mut seen = vec![0u32; ops.len()];
        let mut rounds = 0;
        while ops.iter().any(Option::is_some) {
            let done = node.wait_some(&mut ops).unwrap();
            assert!(!done.is_empty(), "wait_some returned with nothing complete");
            for (i, r) in done {
                r.unwrap();
                seen[i] += 1;
            }
            rounds += 1;
        }
        assert!(seen.iter().all(|&n| n == 1), "each exactly once");
        assert!(node.wait_some::<()>(&mut []).unwrap().is_empty());
        assert_eq!(node.ops_in_flight(), 0);
        node.barrier().unwrap();
        let mut back = vec![0u8; 8000];
        node.segment().read(0, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == (1 - me) + 1));
        rounds
    });
}

/// Catches: `wait_nbi` returning while puts of the set are still in flight, losing one of
/// them, or leaving their slots in the table.
#[test]
fn an_implicit_region_of_1000_puts_completes_with_one_wait() {
    pair(|mut node| {
        let peer = 1 - node.rank();
        for i in 0..1000usize {
            node.put_nbi(peer, i * 4, &(i as u32).to_le_bytes())
                .unwrap();
        }
        assert!(node.ops_in_flight() > 0, "credits let puts be in flight");
        node.wait_nbi().unwrap();
        // No poll in between: the wait itself left nothing in flight.
        assert_eq!(node.ops_in_flight(), 0);
        // Posted atomics are in the set too.
        node.atomic_nbi(peer, 8192, AtomicOp::FetchAdd(5u64))
            .unwrap();
        node.wait_nbi().unwrap();
        assert_eq!(node.ops_in_flight(), 0);
        node.barrier().unwrap();
        for i in 0..1000usize {
            let mut w = [0u8; 4];
            node.segment().read(i * 4, &mut w).unwrap();
            assert_eq!(u32::from_le_bytes(w), i as u32);
        }
        assert_eq!(node.segment().load_u64(8192).unwrap(), 5);
        node.barrier().unwrap();
    });
}

/// Catches: a test that never sees completion, `wait_all` losing an outcome or its order,
/// `test_some` taking out what is not complete, and an implicit put's error vanishing.
#[test]
fn test_wait_all_and_test_some_agree() {
    pair(|mut node| {
        let peer = 1 - node.rank();
        let get = node.get_nb(peer, 0, 16).unwrap();
        while !node.test(&get).unwrap() {}
        assert_eq!(node.wait(get).unwrap(), [0; 16]);
        let calls: Vec<Op<Reply>> = (0..50u32)
            .map(|x| node.call_nb(peer, SQUARE, &[x], &[]).unwrap())
            .collect();
        let answers = node.wait_all(calls).unwrap();
        let squares: Vec<u32> = answers.iter().map(|r| r.args[0]).collect();
        assert_eq!(squares, (0..50u32).map(|x| x * x).collect::<Vec<_>>());
        let mut atomics: Vec<Option<Op<u64>>> = (0..20)
            .map(|_| Some(node.atomic_nb(peer, 64, AtomicOp::FetchAdd(1u64)).unwrap()))
            .collect();
        let mut olds = Vec::new();
        while atomics.iter().any(Option::is_some) {
            for (i, r) in node.test_some(&mut atomics).unwrap() {
                assert!(atomics[i].is_none());
                olds.push(r.unwrap());
            }
        }
        olds.sort_unstable();
        assert_eq!(olds, (0..20).collect::<Vec<u64>>());
        // A put outside the segment fails when it starts, on every form.
        let past = node.segment().len();
        assert!(matches!(
            node.put_nbi(peer, past, &[1]),
            Err(AmError::SegmentOutOfBounds { .. })
        ));
        node.wait_nbi().unwrap();
        node.barrier().unwrap();
    });
}

/// Catches: a barrier handle whose drop makes the next barrier resume it (this rank then
/// one barrier behind its peer, which hangs), or one never finished without its handle.
#[test]
fn a_dropped_barrier_still_completes_and_the_next_is_a_new_one() {
    pair(|mut node| {
        if node.rank() == 0 {
            drop(node.barrier_nb().unwrap());
            node.barrier().unwrap();
        } else {
            node.barrier().unwrap();
            node.barrier().unwrap();
        }
        // Aligned: each rank's third barrier meets the other's, and a put before it is
        // seen after it.
        let peer = 1 - node.rank();
        node.put(peer, 0, &[node.rank() as u8 + 7]).unwrap();
        node.barrier().unwrap();
        let mut b = [0u8];
        node.segment().read(0, &mut b).unwrap();
        assert_eq!(b[0], peer as u8 + 7);
        node.barrier().unwrap();
    });
}

/// Catches: a driver without one of the operations (`SharedNode` had no put, get, atomic or
/// call), or one whose waits hold the node so that another thread's operations stall.
#[test]
fn a_shared_node_has_every_operation_and_threads_share_it() {
    within(LIMIT, || {
        am_core::run_ranks(by_messages(), |t| {
            let node = SharedNode::new(Node::new(t, handlers(), Config::default()).unwrap());
            let peer = 1 - node.rank();
            std::thread::scope(|s| {
                for th in 0..2u32 {
                    let node = node.clone();
                    s.spawn(move || {
                        for i in 0..200u32 {
                            let at = (th as usize * 200 + i as usize) * 4;
                            node.put(peer, at, &i.to_le_bytes()).unwrap();
                            assert_eq!(node.get(peer, at, 4).unwrap(), i.to_le_bytes());
                            let r = node.call(peer, SQUARE, &[i], &[]).unwrap();
                            assert_eq!(r.args, [i * i]);
                            let _: u64 = node.atomic(peer, 4096, AtomicOp::FetchAdd(1)).unwrap();
                            let op = node.atomic_nb(peer, 4104, AtomicOp::FetchAdd(1u64));
                            node.wait(op.unwrap()).unwrap();
                            node.request_short(peer, HIT, &[]).unwrap();
                            match node.try_request_short(peer, HIT, &[]) {
                                Ok(()) | Err(TryRequestError::WouldBlock) => {}
                                Err(e) => panic!("{e}"),
                            }
                        }
                        node.put_nbi(peer, 8192 + th as usize * 8, &[1; 8]).unwrap();
                        node.wait_nbi().unwrap();
                    });
                }
            });
            node.quiesce().unwrap();
            node.barrier().unwrap();
            assert_eq!(node.lock().segment().load_u64(4096).unwrap(), 400);
            assert_eq!(node.lock().segment().load_u64(4104).unwrap(), 400);
            assert_eq!(node.ops_in_flight(), 0);
            node.barrier().unwrap();
        });
    });
}

/// Catches: async futures that borrow their small arguments (`Box::pin(node.call(peer, H,
/// &[i], &[]))` did not compile: the temporary `[i]` dies while the future lives), an async
/// driver without `get_into`, `try_` requests or the handle's waits, and an async wait on
/// an operation's completion that is never woken.
#[test]
fn async_futures_own_their_arguments_and_share_the_handle() {
    within(LIMIT, || {
        am_core::run_ranks(by_messages(), |t| {
            let node = AsyncNode::new(Node::new(t, handlers(), Config::default()).unwrap());
            let peer = 1 - node.rank();
            type Boxed = Pin<Box<dyn Future<Output = Result<Reply, AmError>> + Send>>;
            let calls: Vec<Boxed> = (0..10u32)
                .map(|i| Box::pin(node.call(peer, SQUARE, &[i], &[])) as Boxed)
                .collect();
            for (i, c) in calls.into_iter().enumerate() {
                let r = am_core::future::block_on(&node, c);
                assert_eq!(r.unwrap().args, [(i * i) as u32]);
            }
            let hits = Arc::new(AtomicU32::new(0));
            am_core::future::block_on(&node, async {
                node.put(peer, 0, &[node.rank() as u8 + 1; 32])
                    .await
                    .unwrap();
                let op = node
                    .atomic_nb(peer, 64, AtomicOp::FetchAdd(2u64))
                    .await
                    .unwrap();
                let _ = node.test(&op);
                assert_eq!(node.wait(op).await.unwrap(), 0);
                node.barrier().await.unwrap();
                let mut buf = [0u8; 32];
                let filled = node.get_into(node.rank(), 0, &mut buf).await.unwrap();
                assert_eq!(filled, [peer as u8 + 1; 32]);
                let ops: Vec<_> = [node.get_nb(peer, 0, 8).await.unwrap()].into();
                assert_eq!(
                    node.wait_all(ops).await.unwrap(),
                    [vec![node.rank() as u8 + 1; 8]]
                );
                let mut some = vec![Some(node.call_nb(peer, SQUARE, &[9], &[]).await.unwrap())];
                let done = node.wait_some(&mut some).await.unwrap();
                assert_eq!(done.len(), 1);
                match node.try_request_short(peer, HIT, &[]) {
                    Ok(()) => {
                        hits.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(TryRequestError::WouldBlock) => {}
                    Err(e) => panic!("{e}"),
                }
                node.put_nbi(peer, 128, &[3; 8]).await.unwrap();
                node.wait_nbi().await.unwrap();
                node.quiesce().await.unwrap();
                node.barrier().await.unwrap();
                assert_eq!(node.ops_in_flight(), 0);
            });
        });
    });
}

/// Catches: an async node whose futures wait silently for ever when no driver runs (a tokio
/// program that never spawned `drive()`), and a progress thread that serves only a
/// `SharedNode` (a rank whose tasks compute in `spawn_blocking` had none of its own).
#[test]
fn async_nodes_progress_without_a_driver_and_under_a_progress_thread() {
    within(LIMIT, || {
        am_core::run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let node = AsyncNode::new(Node::new(t, handlers(), Config::default()).unwrap());
            let peer = 1 - node.rank();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            // No driver: the futures make progress themselves while polled.
            let r = rt.block_on(node.call(peer, SQUARE, &[3], &[])).unwrap();
            assert_eq!(r.args, [9]);
            rt.block_on(node.barrier()).unwrap();
            // A progress thread serves the node: the tasks only await.
            let thread = am_core::ProgressThread::spawn(node.clone()).unwrap();
            let squares = rt.block_on(async {
                let tasks: Vec<_> = (0..8u32)
                    .map(|x| tokio::spawn(node.call(peer, SQUARE, &[x], &[])))
                    .collect();
                let mut out = Vec::new();
                for t in tasks {
                    out.push(t.await.unwrap().unwrap().args[0]);
                }
                node.barrier().await.unwrap();
                out
            });
            assert_eq!(squares, [0, 1, 4, 9, 16, 25, 36, 49]);
            thread.stop().unwrap();
        });
    });
}

/// Rank 0's and rank 1's nodes, both started from this one thread (two endpoints of one
/// process), and three operations of rank 0's that only its progress with rank 1's
/// completes: a put (a slot of rank 0's table of operations: it travels as messages), a call
/// and a barrier (which rank 1 has not entered).
struct Foreign {
    a: Node<NoDirectRma>,
    put: Op<()>,
    call: Op<Reply>,
    barrier: Op<()>,
}

fn foreign() -> (Foreign, Node<NoDirectRma>) {
    let parts = by_messages().into_iter().map(|t| (t, handlers()));
    let mut nodes = Node::start_all(parts, Config::default()).expect("start");
    let b = nodes.pop().unwrap();
    let mut a = nodes.pop().unwrap();
    let put = a.put_nb(1, 0, &[7; 64]).unwrap();
    let call = a.call_nb(1, SQUARE, &[3], &[]).unwrap();
    let barrier = a.barrier_nb().unwrap();
    assert!(
        !put.is_ready() && !barrier.is_ready(),
        "the premise: in flight"
    );
    (
        Foreign {
            a,
            put,
            call,
            barrier,
        },
        b,
    )
}

/// After rank 1 refused them: rank 0's operations, their handles dropped, complete on rank
/// 0 all the same (its put's slot and its call are freed, its barrier meets the one rank 1
/// has entered), with rank 1 polled by `b_step`, which says whether that barrier of rank 1's
/// is complete.
fn rank_0_goes_on(a: &mut Node<NoDirectRma>, mut b_step: impl FnMut() -> bool) {
    loop {
        a.poll().unwrap();
        if b_step() && a.ops_in_flight() == 0 {
            return;
        }
    }
}

/// How long a test of another node's handles may take: a node that waits for another's
/// operation waits for ever, and the watchdog says so.
const FOREIGN_LIMIT: Duration = Duration::from_secs(30);

/// Catches a node that does not check whose an operation is (`Endpoint::owns`): rank 1's
/// `test` said rank 0's put complete (a slot not of its table looked complete), its `wait`
/// took its own barrier of the same epoch for rank 0's and returned at once, `wait_some`
/// gave `StaleHandle`, and `wait_all` of rank 0's call waited for ever (the answer goes to
/// rank 0's table, which only rank 0's progress fills). Each is `ForeignHandle` now, and
/// rank 0's operations, dropped, still complete on rank 0.
#[test]
fn a_node_refuses_another_nodes_handles() {
    within(FOREIGN_LIMIT, || {
        let (mut f, mut b) = foreign();
        assert_eq!(b.test(&f.put), Err(AmError::ForeignHandle));
        assert_eq!(b.test(&f.call), Err(AmError::ForeignHandle));
        assert_eq!(b.test(&f.barrier), Err(AmError::ForeignHandle));
        assert_eq!(b.wait(f.barrier), Err(AmError::ForeignHandle));
        let mut some = [None, Some(f.put)];
        let done = b.wait_some(&mut some).unwrap();
        assert!(
            matches!(done[..], [(1, Err(AmError::ForeignHandle))]),
            "{done:?}"
        );
        assert!(some.iter().all(Option::is_none));
        assert_eq!(b.wait_all([f.call]), Err(AmError::ForeignHandle));
        // Rank 1's own operations are its own.
        let mine = b.barrier_nb().unwrap();
        rank_0_goes_on(&mut f.a, || b.test(&mine).unwrap());
        b.wait(mine).unwrap();
        let mut landed = [0u8; 64];
        b.segment().read(0, &mut landed).unwrap();
        assert_eq!(landed, [7; 64], "rank 0's put, refused by rank 1, landed");
    });
}

/// [`a_node_refuses_another_nodes_handles`] on a `SharedNode` (its `test` takes the node's
/// own, its waits drive the endpoint's completion step): catches the same bugs there.
#[test]
fn a_shared_node_refuses_another_nodes_handles() {
    within(FOREIGN_LIMIT, || {
        let (mut f, b) = foreign();
        let b = SharedNode::new(b);
        assert_eq!(b.test(&f.put), Err(AmError::ForeignHandle));
        assert_eq!(b.test(&f.call), Err(AmError::ForeignHandle));
        assert_eq!(b.test(&f.barrier), Err(AmError::ForeignHandle));
        assert_eq!(b.wait(f.barrier), Err(AmError::ForeignHandle));
        let mut some = [Some(f.put)];
        let done = b.wait_some(&mut some).unwrap();
        assert!(
            matches!(done[..], [(0, Err(AmError::ForeignHandle))]),
            "{done:?}"
        );
        assert_eq!(b.wait_all([f.call]), Err(AmError::ForeignHandle));
        let mine = b.barrier_nb().unwrap();
        rank_0_goes_on(&mut f.a, || b.test(&mine).unwrap());
        b.wait(mine).unwrap();
    });
}

/// [`a_node_refuses_another_nodes_handles`] on an `AsyncNode` (its `test` and `test_some`
/// look only): catches the same bugs there, an async `test` that said another node's handle
/// complete, and a wait for another node's call that reads that node's table of calls
/// before asking whose the call is (it waited for ever).
#[test]
fn an_async_node_refuses_another_nodes_handles() {
    use am_core::future::block_on;
    within(FOREIGN_LIMIT, || {
        let (mut f, b) = foreign();
        let b = AsyncNode::new(b);
        assert_eq!(b.test(&f.put), Err(AmError::ForeignHandle));
        assert_eq!(b.test(&f.call), Err(AmError::ForeignHandle));
        assert_eq!(b.test(&f.barrier), Err(AmError::ForeignHandle));
        assert_eq!(block_on(&b, b.wait(f.barrier)), Err(AmError::ForeignHandle));
        let mut some = [Some(f.put)];
        let done = block_on(&b, b.wait_some(&mut some)).unwrap();
        assert!(
            matches!(done[..], [(0, Err(AmError::ForeignHandle))]),
            "{done:?}"
        );
        let mut some = [None, Some(f.a.put_nb(1, 64, &[8; 64]).unwrap())];
        let done = b.test_some(&mut some).unwrap();
        assert!(
            matches!(done[..], [(1, Err(AmError::ForeignHandle))]),
            "{done:?}"
        );
        assert!(some.iter().all(Option::is_none));
        assert_eq!(
            block_on(&b, b.wait_all([f.call])),
            Err(AmError::ForeignHandle)
        );
        let mine = block_on(&b, b.barrier_nb()).unwrap();
        rank_0_goes_on(&mut f.a, || {
            b.progress().unwrap();
            b.test(&mine).unwrap()
        });
        block_on(&b, b.wait(mine)).unwrap();
    });
}
