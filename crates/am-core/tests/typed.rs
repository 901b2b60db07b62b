//! Typed active messages ([`am_core::typed`]): values of several serde shapes round trip on
//! every driver (blocking, handles, `SharedNode`, `AsyncNode`), posts run at the target,
//! refusals name the peer, and start-up refuses ranks whose types differ, naming the type.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use am_core::future::block_on;
use am_core::typed::{Am, AmContext, Answer, Refusal};
use am_core::{
    run_ranks, AmError, AsyncNode, Config, Handlers, Loopback, LoopbackConfig, Node, SharedNode,
    StartError, Transport,
};
use proptest::prelude::*;
use serde::{Deserialize, Serialize};

mod watchdog;
use watchdog::within;

const LIMIT: Duration = Duration::from_secs(60);

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
enum Shape {
    Unit,
    Pair(i32, String),
    Named {
        depth: u8,
        inner: Option<Box<Shape>>,
    },
}

/// A value of several serde shapes: the target answers with it, reversed where it can be.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Echo {
    words: Vec<u64>,
    name: String,
    map: BTreeMap<String, Vec<u8>>,
    shape: Shape,
    flag: bool,
    ratio: f64,
}

impl Am for Echo {
    type Reply = (u32, Echo);
    fn exec(mut self, cx: &mut AmContext) -> (u32, Echo) {
        self.words.reverse();
        (cx.src(), self)
    }
}

/// A 32-byte value with a `u64` answer.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
struct Sum([u64; 4]);

impl Am for Sum {
    type Reply = u64;
    fn exec(self, _: &mut AmContext) -> u64 {
        self.0.iter().sum()
    }
}

/// Posted: the target adds it to a counter its registration holds.
#[derive(Serialize, Deserialize, Debug)]
struct Add(u64);

impl Am for Add {
    type Reply = ();
    fn exec(self, _: &mut AmContext) {}
}

/// Registered only where a test says.
#[derive(Serialize, Deserialize, Debug)]
struct Extra;

impl Am for Extra {
    type Reply = ();
    fn exec(self, _: &mut AmContext) {}
}

fn handlers(total: Arc<AtomicU64>) -> Handlers {
    let mut h = Handlers::new();
    h.typed::<Echo>().expect("register");
    h.typed::<Sum>().expect("register");
    h.typed_with::<Add>(move |a, _| {
        total.fetch_add(a.0, Ordering::Relaxed);
    })
    .expect("register");
    h
}

fn echo(i: u64) -> Echo {
    Echo {
        words: (0..i).collect(),
        name: format!("echo {i}"),
        map: (0..i % 4)
            .map(|k| (k.to_string(), vec![k as u8; k as usize]))
            .collect(),
        shape: Shape::Named {
            depth: i as u8,
            inner: Some(Box::new(Shape::Pair(-(i as i32), "x".repeat(i as usize)))),
        },
        flag: i.is_multiple_of(2),
        ratio: i as f64 / 3.0,
    }
}

fn reversed(mut e: Echo) -> Echo {
    e.words.reverse();
    e
}

/// Catches a typed call whose answer is decoded as the wrong type or paired with another
/// call's, a post that never runs, and a handle that the blocking driver never completes.
#[test]
fn typed_calls_and_posts_on_the_blocking_driver() {
    within(LIMIT, || {
        run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let total = Arc::new(AtomicU64::new(0));
            let mut node = Node::new(t, handlers(total.clone()), Config::default()).unwrap();
            let me = node.rank();
            let peer = 1 - me;
            for i in 0..20 {
                let (src, back) = node.call_typed(peer, echo(i)).expect("call");
                assert_eq!((src, back), (me, reversed(echo(i))));
            }
            let ops: Vec<_> = (0..16u64)
                .map(|i| node.call_typed_nb(peer, Sum([i, i, i, 1])).expect("call"))
                .collect();
            let sums = node.wait_all(ops).expect("answers");
            assert_eq!(sums, (0..16u64).map(|i| 3 * i + 1).collect::<Vec<_>>());
            for i in 1..=10 {
                node.post_typed(peer, Add(i)).expect("post");
            }
            node.barrier().expect("barrier");
            // Posts go before the barrier's request on the same pair: run by now.
            assert_eq!(total.load(Ordering::Relaxed), 55);
            // An unregistered type is refused here, and nothing is sent.
            match node.call_typed(peer, Extra) {
                Err(AmError::TypedNotRegistered(name)) => assert!(name.ends_with("Extra")),
                other => panic!("an unregistered type: {other:?}"),
            }
            // A value larger than a Medium goes in parts, and so does its answer.
            let big = Echo {
                words: vec![u64::MAX; node.max_medium()],
                ..echo(1)
            };
            assert_eq!(node.call_typed(peer, big.clone()).unwrap().1, big);
            node.barrier().expect("barrier");
        });
    });
}

/// Catches a typed call that only the blocking driver completes (a future never woken by
/// its answer) and a shared node whose threads get each other's answers.
#[test]
fn typed_calls_on_the_shared_and_async_drivers() {
    within(LIMIT, || {
        run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let node =
                SharedNode::new(Node::new(t, handlers(Arc::default()), Config::default()).unwrap());
            let peer = 1 - node.rank();
            std::thread::scope(|s| {
                for th in 0..2u64 {
                    let node = node.clone();
                    s.spawn(move || {
                        for i in 0..50 {
                            let v = [th, i, 0, 0];
                            assert_eq!(node.call_typed(peer, Sum(v)).unwrap(), th + i);
                        }
                    });
                }
            });
            node.barrier().unwrap();
        });
        run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let node =
                AsyncNode::new(Node::new(t, handlers(Arc::default()), Config::default()).unwrap());
            let peer = 1 - node.rank();
            block_on(&node, async {
                // Larger than a Medium both ways, beside small calls.
                let big = Echo {
                    words: (0..40_000).collect(),
                    ..echo(3)
                };
                let far = node.call_typed(peer, big.clone());
                let calls: Vec<_> = (0..8).map(|i| node.call_typed(peer, echo(i))).collect();
                for (i, c) in calls.into_iter().enumerate() {
                    assert_eq!(c.await.unwrap().1, reversed(echo(i as u64)));
                }
                assert_eq!(far.await.unwrap().1, reversed(big));
                let h = node.call_typed_nb(peer, Sum([1, 2, 3, 4])).await.unwrap();
                assert_eq!(node.wait(h).await.unwrap(), 10);
                node.post_typed(peer, Add(1)).await.unwrap();
                node.barrier().await.unwrap();
            });
        });
    });
}

/// Catches start-up that lets two ranks with different typed messages run (their values
/// would be decoded as the wrong types), and an error that does not say which type.
#[test]
fn ranks_with_different_types_do_not_start() {
    within(LIMIT, || {
        let errors = run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let mut h = handlers(Arc::default());
            if t.rank() == 1 {
                h.typed::<Extra>().unwrap();
            }
            Node::new(t, h, Config::default()).err()
        });
        for (rank, e) in errors.into_iter().enumerate() {
            match e {
                Some(StartError::TypedMismatch { rank: 1, name }) => {
                    // Rank 1 registers `Extra`, rank 0 does not know it.
                    if rank == 1 {
                        assert!(name.is_some_and(|n| n.ends_with("Extra")), "{name:?}");
                    }
                }
                other => panic!("rank {rank}: {other:?}"),
            }
        }
    });
}

/// Catches a start-up check that compares typed messages one way only (the types a rank
/// registers that rank 0 lacks, not those rank 0 registers that the rank lacks): rank 0
/// and rank 1 register `Extra`, rank 2 does not, and no rank starts (with that bug they
/// fail as a handler table mismatch instead). Every rank is told that rank 2 differs; the
/// ranks that register `Extra` name it, rank 2 (which does not know the type's name) names
/// none. Also catches a name looked up only among the types the other rank lacks.
#[test]
fn a_type_only_rank_0_registers_is_refused_too() {
    within(LIMIT, || {
        let errors = run_ranks(Loopback::cluster(3, Default::default()), |t| {
            let mut h = handlers(Arc::default());
            if t.rank() != 2 {
                h.typed::<Extra>().unwrap();
            }
            Node::new(t, h, Config::default()).err()
        });
        for (rank, e) in errors.into_iter().enumerate() {
            match e {
                Some(StartError::TypedMismatch { rank: 2, name }) => {
                    if rank == 2 {
                        assert_eq!(name, None, "rank 2 does not know the type");
                    } else {
                        assert!(
                            name.is_some_and(|n| n.ends_with("::Extra")),
                            "rank {rank}: {name:?}"
                        );
                    }
                }
                other => panic!("rank {rank}: {other:?}"),
            }
        }
    });
}

/// A message of elements that occupy no bytes on the wire.
#[derive(Serialize, Deserialize, Debug)]
struct Units(Vec<()>);

impl Am for Units {
    type Reply = u64;
    fn exec(self, _: &mut AmContext) -> u64 {
        self.0.len() as u64
    }
}

/// Catches a target that runs (or panics on) a message whose bytes are not its type, or
/// whose id it does not register: a raw call of the reserved handler with forged arguments
/// and payloads is answered with a refusal, and the typed call after it works. Also one
/// that loops over a forged count of elements that occupy no bytes (the watchdog fails it).
#[test]
fn forged_typed_messages_are_refused() {
    within(LIMIT, || {
        run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let mut h = handlers(Arc::default());
            h.typed::<Units>().unwrap();
            let reserved = (0..=255u8)
                .map(am_core::HandlerId)
                .find(|&id| h.info(id).is_some_and(|i| i.name == "amnet: typed call"))
                .expect("the reserved handler");
            let mut node = Node::new(t, h, Config::default()).unwrap();
            let peer = 1 - node.rank();
            let id = am_core::typed::type_id::<Sum>();
            let words = [id as u32, (id >> 32) as u32];
            let units = am_core::typed::type_id::<Units>();
            let units = [units as u32, (units >> 32) as u32];
            let good = wire_sum();
            for (args, payload, status) in [
                (&words[..], &good[..good.len() - 1], 2u32),
                (&words[..], &[good.clone(), vec![0]].concat()[..], 2),
                (&words[..1], &good[..], 2),
                (&[words[0] ^ 1, words[1]][..], &good[..], 1),
                (&words[..], &[0xff, 0xff, 0xff, 0xff, 0x3f][..], 2),
                // The last piece of a value whose parts never came.
                (&[words[0], words[1], 77][..], &good[..], 2),
                // 2^62 units, in eight bytes.
                (&units[..], &(1u64 << 62).to_le_bytes()[..], 2),
            ] {
                let r = node.call(peer, reserved, args, payload).expect("call");
                assert_eq!(r.args, [status], "{args:?} {payload:?}");
            }
            assert_eq!(node.call_typed(peer, Sum([1, 1, 1, 1])).unwrap(), 4);
            assert_eq!(node.call_typed(peer, Units(vec![(); 1000])).unwrap(), 1000);
            node.barrier().unwrap();
        });
    });
}

/// Bytes posted: the target adds them up into the counter its registration holds.
#[derive(Serialize, Deserialize, Debug)]
struct Bulk(Vec<u8>);

impl Am for Bulk {
    type Reply = ();
    fn exec(self, _: &mut AmContext) {}
}

/// [`handlers`], and `Bulk` posts adding their bytes to `total` too.
fn bulk_handlers(total: Arc<AtomicU64>) -> Handlers {
    let mut h = handlers(total.clone());
    h.typed_with::<Bulk>(move |b, _| {
        let s: u64 = b.0.iter().map(|&x| u64::from(x)).sum();
        total.fetch_add(s, Ordering::Relaxed);
    })
    .unwrap();
    h
}

/// A transport whose Mediums are small, so that values of a few KiB go in many parts.
fn small_mediums() -> LoopbackConfig {
    LoopbackConfig::new().max_medium(200).capacity(16)
}

/// Catches parts joined in the wrong order or with a piece lost or doubled at a boundary
/// (values of one byte either side of a multiple of the Medium), parts of several values in
/// flight at once mixed up, an answer in parts paired with the wrong call, and a post in
/// parts that never runs; on a transport whose device refuses (a ring of 16) long before a
/// value is out, so that sending parts waits for credit and the device in the middle.
#[test]
fn values_larger_than_a_medium_go_in_parts() {
    within(LIMIT, || {
        run_ranks(Loopback::cluster(2, small_mediums()), |t| {
            let total = Arc::new(AtomicU64::new(0));
            let h = bulk_handlers(total.clone());
            let mut node = Node::new(t, h, Config::default()).unwrap();
            let me = node.rank();
            let peer = 1 - me;
            let max = node.max_medium();
            assert_eq!(max, 200);
            // An `Echo` of `n` words of 0x7f encodes each in one byte.
            let sized = |n: usize| Echo {
                words: vec![0x7f; n],
                name: String::new(),
                map: BTreeMap::new(),
                shape: Shape::Unit,
                flag: true,
                ratio: 0.5,
            };
            let base = am_core::typed::encoded_len(&sized(0)).unwrap();
            for len in [
                max - 1,
                max,
                max + 1,
                2 * max - 1,
                2 * max,
                2 * max + 1,
                10_000,
            ] {
                // Words past 127 take two varint bytes (the vector's length too).
                let v = sized(len.saturating_sub(base + 2));
                let got = node.call_typed(peer, v.clone()).expect("call");
                assert_eq!(got, (me, v), "value of about {len} bytes");
            }
            // Several in flight at once, to this peer and to this rank itself.
            let ops: Vec<_> = (0..6u64)
                .map(|i| {
                    let dest = if i % 2 == 0 { peer } else { me };
                    let v = Echo {
                        words: (i..i + 700).collect(),
                        ..echo(i)
                    };
                    (node.call_typed_nb(dest, v.clone()).expect("call"), v)
                })
                .collect();
            for (op, v) in ops {
                assert_eq!(node.wait(op).expect("answer").1, reversed(v));
            }
            // Posts in parts run at the target.
            for i in 1..=5u8 {
                node.post_typed(peer, Bulk(vec![i; 1_000])).expect("post");
            }
            node.barrier().unwrap();
            assert_eq!(total.load(Ordering::Relaxed), 15_000);
            node.barrier().unwrap();
        });
    });
}

/// Answered later: the code hands the message and its answer out of the handler.
#[derive(Serialize, Deserialize, Debug)]
struct Later(u64);

impl Am for Later {
    type Reply = Vec<u64>;
    fn exec(self, _: &mut AmContext) -> Vec<u64> {
        (0..self.0).collect()
    }
}

/// A table whose `Later` messages go out of their handler over a channel, with their
/// answers.
fn deferring(tx: std::sync::mpsc::Sender<(Later, Answer<Vec<u64>>)>) -> Handlers {
    let mut h = handlers(Arc::default());
    h.typed_deferred::<Later>(move |m, cx, answer| {
        assert_eq!(answer.src(), cx.src());
        tx.send((m, answer)).expect("the rank's queue");
    })
    .unwrap();
    h
}

/// Catches a deferred answer that never reaches its caller (or reaches another call), one
/// too large for a Medium that is lost (in parts, or one long enough to be encoded when it
/// starts, into the staging segment), an answer dropped unsent that leaves its caller
/// waiting for ever (it must fail with `Abandoned`), and a post of a deferred type whose
/// answer goes somewhere; on the blocking driver, answered from the rank's own loop.
#[test]
fn deferred_answers_on_the_blocking_driver() {
    within(LIMIT, || {
        run_ranks(Loopback::cluster(2, small_mediums()), |t| {
            let (tx, rx) = std::sync::mpsc::channel();
            let mut node = Node::new(t, deferring(tx), Config::default()).unwrap();
            let me = node.rank();
            if me == 0 {
                // 3 words fit one Medium; 100 do not (the small transport's is 200 bytes).
                let small = node.call_typed_nb(1, Later(3)).unwrap();
                let large = node.call_typed_nb(1, Later(100)).unwrap();
                let staged = node.call_typed_nb(1, Later(10_000)).unwrap();
                let dropped = node.call_typed_nb(1, Later(0)).unwrap();
                assert_eq!(node.wait(small).unwrap(), vec![0, 1, 2]);
                assert_eq!(node.wait(large).unwrap(), (0..100).collect::<Vec<_>>());
                assert_eq!(node.wait(staged).unwrap(), (0..10_000).collect::<Vec<_>>());
                match node.wait(dropped) {
                    Err(AmError::TypedRefused {
                        peer: 1,
                        reason: Refusal::Abandoned,
                    }) => {}
                    other => panic!("an abandoned answer: {other:?}"),
                }
                node.post_typed(1, Later(5)).unwrap();
            } else {
                let mut served = 0;
                while served < 5 {
                    node.poll().unwrap();
                    while let Ok((m, answer)) = rx.try_recv() {
                        served += 1;
                        match m.0 {
                            0 => drop(answer),
                            5 => {
                                assert!(!answer.is_call(), "a post's answer");
                                node.answer_typed(answer, vec![]).unwrap();
                            }
                            n => node.answer_typed(answer, (0..n).collect()).unwrap(),
                        }
                    }
                }
            }
            node.barrier().unwrap();
        });
    });
}

/// An answer given to the node of another endpoint of the process (here the caller's own
/// node, the ranks being threads) still reaches its call, small (encoded when made) and
/// large (encoded when it starts): it leaves from the endpoint the call came to. Catches
/// an answer sent from the wrong endpoint, which its caller takes for no call of its own
/// and drops, leaving the call waiting for ever.
#[test]
fn an_answer_given_to_another_endpoints_node_reaches_its_call() {
    within(LIMIT, || {
        let (tx, rx) = std::sync::mpsc::channel();
        let rx = std::sync::Mutex::new(rx);
        let answered = std::sync::atomic::AtomicBool::new(false);
        run_ranks(Loopback::cluster(2, small_mediums()), |t| {
            let mut node = Node::new(t, deferring(tx.clone()), Config::default()).unwrap();
            if node.rank() == 0 {
                let rx = rx.lock().unwrap();
                for n in [3, 10_000] {
                    let call = node.call_typed_nb(1, Later(n)).unwrap();
                    let answer = loop {
                        node.poll().unwrap();
                        if let Ok((m, answer)) = rx.try_recv() {
                            assert_eq!(m.0, n);
                            break answer;
                        }
                    };
                    assert_eq!(answer.src(), 0);
                    node.answer_typed(answer, (0..n).rev().collect()).unwrap();
                    assert_eq!(node.wait(call).unwrap(), (0..n).rev().collect::<Vec<_>>());
                }
                answered.store(true, Ordering::Release);
            } else {
                while !answered.load(Ordering::Acquire) {
                    node.poll().unwrap();
                }
            }
            node.barrier().unwrap();
        });
    });
}

/// Catches a deferred answer that the async driver never sends (a task that answers after
/// awaiting something else), and one given up half sent (its future dropped between
/// parts) that leaves its caller waiting for ever instead of failing with `Abandoned`.
#[test]
fn deferred_answers_from_a_task() {
    within(LIMIT, || {
        run_ranks(Loopback::cluster(2, small_mediums()), |t| {
            let (tx, rx) = std::sync::mpsc::channel();
            // In parts, not by rendezvous: the answer given up must be half sent.
            let config = Config::default().typed_rendezvous(false);
            let node = AsyncNode::new(Node::new(t, deferring(tx), config).unwrap());
            let me = node.rank();
            block_on(&node, async {
                if me == 0 {
                    let calls: Vec<_> =
                        (1..=4).map(|n| node.call_typed(1, Later(n * 30))).collect();
                    for (n, c) in (1..=4u64).zip(calls) {
                        assert_eq!(c.await.unwrap(), (0..n * 30).collect::<Vec<_>>());
                    }
                    // Its answer is given up half sent: the call fails, it does not hang.
                    match node.call_typed(1, Later(10_000)).await {
                        Err(AmError::TypedRefused {
                            peer: 1,
                            reason: Refusal::Abandoned,
                        }) => {}
                        other => panic!("an answer given up half sent: {other:?}"),
                    }
                } else {
                    let mut served = 0;
                    while served < 5 {
                        match rx.try_recv() {
                            Ok((m, answer)) if m.0 == 10_000 => {
                                served += 1;
                                // 400 parts: the first poll sends what credit allows, then
                                // the future is dropped.
                                let value: Vec<u64> = (0..m.0).collect();
                                let mut f = std::pin::pin!(node.answer_typed(answer, value));
                                let mut cx =
                                    std::task::Context::from_waker(std::task::Waker::noop());
                                assert!(f.as_mut().poll(&mut cx).is_pending());
                            }
                            Ok((m, answer)) => {
                                served += 1;
                                node.answer_typed(answer, (0..m.0).collect()).await.unwrap();
                            }
                            // Run the handlers here: nothing of this task's is in
                            // flight for the driver to progress.
                            Err(_) => {
                                node.progress().unwrap();
                            }
                        }
                    }
                }
                node.barrier().await.unwrap();
            });
        });
    });
}

/// `Sum([1, 2, 3, 4])` on the wire (each `u64` a little-endian word).
fn wire_sum() -> Vec<u8> {
    [1u64, 2, 3, 4]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    /// Catches a shape the encoding does not carry whole (a nested enum, a map, a string
    /// with any code point, an empty vector).
    #[test]
    fn arbitrary_values_round_trip(
        words in prop::collection::vec(any::<u64>(), 0..64),
        name in ".{0,40}",
        depth in any::<u8>(),
        ratio in any::<f64>().prop_filter("comparable", |r| !r.is_nan()),
    ) {
        let v = Echo {
            words,
            name: name.clone(),
            map: [(name, vec![depth; depth as usize % 17])].into_iter().collect(),
            shape: Shape::Named { depth, inner: Some(Box::new(Shape::Unit)) },
            flag: depth % 2 == 1,
            ratio,
        };
        let out = run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let mut node = Node::new(t, handlers(Arc::default()), Config::default()).unwrap();
            let r = if node.rank() == 0 { Some(node.call_typed(1, v.clone()).unwrap()) } else { None };
            node.barrier().unwrap();
            r
        });
        prop_assert_eq!(out[0].clone().map(|r| r.1), Some(reversed(v)));
    }
}

#[test]
fn refusal_says_what() {
    assert!(Refusal::UnknownType.to_string().contains("no such type"));
}

/// Types of one name (`std::any::type_name`) and different layouts: items of two blocks of
/// one function share their path, as types of one path do in two builds of a program.
mod same_name {
    use super::*;
    use am_core::typed::Shape;

    /// Each rank's `Move`: rank 0's has a `u32` field, rank 1's a `u64` one; `derived`
    /// says whether their `Am::SHAPE` is `#[derive(Shape)]`'s or the default (none).
    fn register(rank: u32, h: &mut Handlers, derived: bool) -> &'static str {
        macro_rules! moves {
            ($ty:ty) => {{
                #[derive(Serialize, Deserialize, Shape)]
                struct Move {
                    to: $ty,
                }
                impl Am for Move {
                    type Reply = ();
                    const SHAPE: u64 = <Self as Shape>::SHAPE;
                    fn exec(self, _: &mut AmContext) {}
                }
                #[derive(Serialize, Deserialize)]
                struct Plain(Move);
                impl Am for Plain {
                    type Reply = ();
                    fn exec(self, _: &mut AmContext) {}
                }
                if derived {
                    h.typed::<Move>().unwrap();
                    std::any::type_name::<Move>()
                } else {
                    h.typed::<Plain>().unwrap();
                    std::any::type_name::<Plain>()
                }
            }};
        }
        if rank == 0 {
            moves!(u32)
        } else {
            moves!(u64)
        }
    }

    /// Catches a fingerprint that misses a field's type, or an id that ignores
    /// `Am::SHAPE`: ranks whose `Move` share a path but not a layout would start, and a
    /// `Move` one sends would be read as the other's.
    #[test]
    fn ranks_whose_same_named_types_differ_in_shape_do_not_start() {
        within(LIMIT, || {
            let out = run_ranks(Loopback::cluster(2, Default::default()), |t| {
                let mut h = Handlers::new();
                let name = register(t.rank(), &mut h, true);
                (name, Node::new(t, h, Config::default()).err())
            });
            assert_eq!(out[0].0, out[1].0, "the premise: one name");
            for (rank, (_, e)) in out.into_iter().enumerate() {
                match e {
                    Some(StartError::TypedMismatch { rank: 1, name }) => {
                        assert!(name.is_some_and(|n| n.ends_with("Move")), "{name:?}")
                    }
                    other => panic!("rank {rank}: {other:?}"),
                }
            }
        });
    }

    /// The control: with no fingerprint (`Am::SHAPE` left 0) the same two ranks start, so
    /// the test above fails by the fingerprint alone (not by a difference of names).
    #[test]
    fn without_a_fingerprint_the_name_alone_is_compared() {
        within(LIMIT, || {
            let out = run_ranks(Loopback::cluster(2, Default::default()), |t| {
                let mut h = Handlers::new();
                let name = register(t.rank(), &mut h, false);
                let mut node = Node::new(t, h, Config::default()).expect("start");
                node.barrier().unwrap();
                name
            });
            assert_eq!(out[0], out[1]);
        });
    }
}

/// Answered by an async handler ([`Handlers::typed_async`]).
#[derive(Serialize, Deserialize, Debug)]
struct Slow(u64);

impl Am for Slow {
    type Reply = u64;
    fn exec(self, _: &mut AmContext) -> u64 {
        unreachable!("registered async")
    }
}

/// A future that is pending until another thread, after `after`, wakes it: what an async
/// handler awaiting a timer, a channel or a disk sees.
fn woken_later<T: Send + 'static>(value: T, after: Duration) -> impl Future<Output = T> {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let waker: Arc<std::sync::Mutex<Option<std::task::Waker>>> = Arc::default();
    let w = waker.clone();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        let _ = tx.send(());
        if let Some(w) = w.lock().unwrap().take() {
            w.wake();
        }
    });
    let mut value = Some(value);
    std::future::poll_fn(move |cx| {
        *waker.lock().unwrap() = Some(cx.waker().clone());
        match rx.try_recv() {
            Ok(()) => std::task::Poll::Ready(value.take().expect("polled after ready")),
            Err(_) => std::task::Poll::Pending,
        }
    })
}

/// Catches an async handler's task that no driver polls (the caller waits for ever), one
/// polled only when a message comes (its wake from another thread lost), and an answer
/// given by a task that the endpoint never sends. Blocking nodes, each calling the other,
/// and the tasks' wakes coming from other threads while the nodes wait.
#[test]
fn async_handlers_answer_on_the_blocking_driver() {
    within(LIMIT, || {
        run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let mut h = Handlers::new();
            h.typed_async::<Slow, _>(|m, cx| {
                let src = u64::from(cx.src());
                woken_later(m.0 * 10 + src, Duration::from_millis(2))
            })
            .unwrap();
            let mut node = Node::new(t, h, Config::default()).unwrap();
            let peer = 1 - node.rank();
            let ops: Vec<_> = (0..8)
                .map(|i| node.call_typed_nb(peer, Slow(i)).unwrap())
                .collect();
            for (i, op) in (0..8u64).zip(ops) {
                let me = u64::from(node.rank());
                assert_eq!(node.wait(op).unwrap(), i * 10 + me);
            }
            assert_eq!(
                node.call_typed(peer, Slow(5)).unwrap(),
                50 + u64::from(node.rank())
            );
            node.barrier().unwrap();
        });
    });
}

/// Catches a task polled under the node's lock (a task that calls its own node then
/// deadlocks), one whose own call's answer never wakes it, and a node its tasks keep from
/// dropping: each rank's async handler calls the caller back before it answers, under
/// `block_on`, with a `Local` table (the future need not be `Send`).
#[test]
fn async_handlers_call_their_own_node_under_block_on() {
    within(LIMIT, || {
        run_ranks(Loopback::cluster(2, Default::default()), |t| {
            type Shared =
                std::rc::Rc<std::cell::OnceCell<am_core::WeakAsyncNode<Loopback, am_core::Local>>>;
            let slot: Shared = Default::default();
            let s = slot.clone();
            let mut h = Handlers::local();
            h.typed::<Sum>().unwrap();
            h.typed_async::<Slow, _>(move |m, cx| {
                let node = s
                    .get()
                    .and_then(|w| w.upgrade())
                    .expect("set before any call");
                let src = cx.src();
                async move {
                    let back = node.call_typed(src, Sum([m.0, 1, 2, 3])).await.unwrap();
                    back * 2
                }
            })
            .unwrap();
            let node = AsyncNode::new(Node::new(t, h, Config::default()).unwrap());
            // Weak: the node holds this code, and a strong handle in it would keep the
            // node from ever dropping.
            let _ = slot.set(node.downgrade());
            let peer = 1 - node.rank();
            block_on(&node, async {
                let calls: Vec<_> = (0..4).map(|i| node.call_typed(peer, Slow(i))).collect();
                for (i, c) in (0..4u64).zip(calls) {
                    assert_eq!(c.await.unwrap(), (i + 6) * 2);
                }
                node.barrier().await.unwrap();
            });
            let weak = node.downgrade();
            drop(node);
            assert!(weak.upgrade().is_none(), "the node dropped");
        });
    });
}

/// Catches a `SharedNode` whose tasks never run (its polls under the lock skip them, and no
/// one else polls them): a progress thread serves the async handler while the caller's
/// thread waits.
#[test]
fn async_handlers_answer_on_a_shared_node() {
    within(LIMIT, || {
        run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let mut h = Handlers::new();
            h.typed_async::<Slow, _>(|m, _| woken_later(m.0 + 1, Duration::from_millis(1)))
                .unwrap();
            let node = SharedNode::new(Node::new(t, h, Config::default()).unwrap());
            let progress = am_core::ProgressThread::spawn(node.clone()).unwrap();
            let peer = 1 - node.rank();
            for i in 0..4 {
                assert_eq!(node.call_typed(peer, Slow(i)).unwrap(), i + 1);
            }
            node.barrier().unwrap();
            progress.stop().unwrap();
        });
    });
}

/// Catches large values that silently go in parts where peers map each other's memory
/// (rendezvous never used), a staging segment whose regions are not reused once released
/// (more values in flight than release words, then more again), values mixed up between
/// regions, and rendezvous used when the configuration turns it off.
/// A value serde writes part of, then fails on: `.0` bytes first.
#[derive(Deserialize, Debug)]
struct Unwritable(usize);

impl Serialize for Unwritable {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error, SerializeTuple};
        let mut t = s.serialize_tuple(self.0 + 1)?;
        for _ in 0..self.0 {
            t.serialize_element(&7u8)?;
        }
        Err(S::Error::custom("no more"))
    }
}

impl Am for Unwritable {
    type Reply = ();
    fn exec(self, _: &mut AmContext) {}
}

/// Catches a value serde fails to write that is sent anyway (cut, or as what was written
/// before the failure), or that panics; one that fails after the rendezvous' least size
/// (while it is encoded into the staging segment) and leaves its region staged; on a
/// transport whose peers map segments, as a call and a post.
#[test]
fn values_serde_cannot_write_fail_when_they_start() {
    within(LIMIT, || {
        run_ranks(Loopback::cluster(2, small_mediums()), |t| {
            let total = Arc::new(AtomicU64::new(0));
            let mut h = bulk_handlers(total.clone());
            h.typed::<Unwritable>().unwrap();
            let mut node = Node::new(t, h, Config::default()).unwrap();
            let peer = 1 - node.rank();
            let unwritable = |e: AmError| match e {
                AmError::TypedUnencodable { name, reason } => {
                    assert!(name.ends_with("Unwritable"), "{name}");
                    assert!(reason.contains("no more"), "{reason}");
                }
                other => panic!("not refused as unencodable: {other:?}"),
            };
            for n in [10, 100, 100_000, 5 << 20] {
                unwritable(node.call_typed(peer, Unwritable(n)).unwrap_err());
                unwritable(node.post_typed(peer, Unwritable(n)).unwrap_err());
            }
            assert_eq!(node.stats().typed_staged, 0);
            // Nothing was left staged: a value of the whole staging segment's size still is.
            node.post_typed(peer, Bulk(vec![1; 4 << 20])).unwrap();
            assert_eq!(node.stats().typed_staged, 1);
            node.barrier().unwrap();
            assert_eq!(total.load(Ordering::Relaxed), 4 << 20);
            node.barrier().unwrap();
        });
    });
}

/// Catches a value longer than the rendezvous' least size but within a Medium (encoded
/// when it starts, into the staging segment) that is lost, sent cut, or left staged: it goes
/// in one Medium, and nothing is staged.
#[test]
fn values_longer_than_the_rendezvous_least_but_within_a_medium_go_in_one() {
    within(LIMIT, || {
        run_ranks(Loopback::cluster(2, LoopbackConfig::new()), |t| {
            let total = Arc::new(AtomicU64::new(0));
            let mut node = Node::new(t, bulk_handlers(total.clone()), Config::default()).unwrap();
            let (me, peer) = (node.rank(), 1 - node.rank());
            assert!(node.max_medium() > 40_000);
            let v = Echo {
                words: (0..4_000u64).map(|w| w * 5).collect(),
                ..echo(4)
            };
            for _ in 0..3 {
                assert_eq!(
                    node.call_typed(peer, v.clone()).unwrap(),
                    (me, reversed(v.clone()))
                );
                node.post_typed(peer, Bulk(vec![3; 30_000])).unwrap();
            }
            node.barrier().unwrap();
            assert_eq!(total.load(Ordering::Relaxed), 3 * 3 * 30_000);
            assert_eq!(node.stats().typed_staged, 0);
            node.barrier().unwrap();
        });
    });
}

#[test]
fn large_values_move_by_rendezvous_where_peers_map() {
    within(LIMIT, || {
        for on in [true, false] {
            run_ranks(Loopback::cluster(2, small_mediums()), |t| {
                let total = Arc::new(AtomicU64::new(0));
                let h = bulk_handlers(total.clone());
                let config = Config::default().typed_rendezvous(on);
                let mut node = Node::new(t, h, config).unwrap();
                let (me, peer) = (node.rank(), 1 - node.rank());
                // Past a Medium and the rendezvous' least size, a few sizes, to the peer and to
                // itself; the last one longer than the first staging segment (encoded into
                // it, it overflows: it is staged from a private copy, in a larger one).
                for (i, n) in [3_000usize, 70_000, 1 << 17, 1 << 20]
                    .into_iter()
                    .enumerate()
                {
                    let v = Echo {
                        words: (0..n as u64).map(|w| w * 3 + i as u64).collect(),
                        ..echo(3)
                    };
                    for dest in [peer, me] {
                        assert_eq!(
                            node.call_typed(dest, v.clone()).unwrap(),
                            (me, reversed(v.clone()))
                        );
                    }
                }
                // More in flight than release words: the rest go in parts. Then, all
                // released (the peer ran them: it passed a barrier after them), as many
                // again are staged.
                for _round in 0..2 {
                    let ops: Vec<_> = (0..300u64)
                        .map(|i| {
                            let b = Bulk(vec![(i % 251) as u8; 17_000]);
                            node.post_typed_nb(peer, b).unwrap()
                        })
                        .collect();
                    for op in ops {
                        node.wait(op).unwrap();
                    }
                    node.barrier().unwrap();
                    node.barrier().unwrap();
                }
                node.barrier().unwrap();
                let want: u64 = 2 * (0..300u64).map(|i| (i % 251) * 17_000).sum::<u64>();
                assert_eq!(total.load(Ordering::Relaxed), want);
                let staged = node.stats().typed_staged;
                if on {
                    // The calls' values (their answers, too large for a reply, go as
                    // queued parts), and each round's posts while release words last.
                    assert!(staged >= 8 + 2 * 255, "staged {staged}");
                } else {
                    assert_eq!(staged, 0, "rendezvous off");
                }
                node.barrier().unwrap();
            });
        }
    });
}
