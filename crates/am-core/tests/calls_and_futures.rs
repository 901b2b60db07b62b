//! Calls and futures: [`Node::call`] and [`AsyncNode::call`] resolve with their handler's
//! answer (and with nothing when it does not answer), many calls in flight resolve each with
//! its own answer, and every operation of an [`AsyncNode`] completes under the
//! runtime-agnostic `block_on`. (The tokio driver's tests are the facade's, `tests/async_node.rs`.)

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use am_core::future::block_on;
use am_core::{
    run_ranks, AmError, AsyncNode, AtomicOp, Config, HandlerId, Handlers, Loopback, LoopbackConfig,
    Node, RegisterError,
};

mod watchdog;
use watchdog::within;

const SQUARE: HandlerId = HandlerId(1);
const SILENT: HandlerId = HandlerId(2);
const STORE: HandlerId = HandlerId(3);
const FETCH: HandlerId = HandlerId(4);

/// A key-value shard per rank: `STORE` keeps the payload under the first argument and
/// answers whether the key was new; `FETCH` answers with the value (and 1), or 0.
fn kv_handlers() -> Handlers<am_core::Local> {
    let shard: Rc<RefCell<HashMap<u32, Vec<u8>>>> = Rc::default();
    let mut h = Handlers::local();
    h.callable(SQUARE, "square", |msg, call| {
        let x = msg.args()[0];
        let payload: Vec<u8> = msg.payload().iter().rev().copied().collect();
        call.reply(&[x * x, msg.src()], &payload).expect("answer");
    })
    .expect("register");
    h.callable(SILENT, "silent", |_, _| {}).expect("register");
    let s = shard.clone();
    h.callable(STORE, "store", move |msg, call| {
        let new = s.borrow_mut().insert(msg.args()[0], msg.payload().to_vec());
        call.reply(&[u32::from(new.is_none())], &[])
            .expect("answer");
    })
    .expect("register");
    h.callable(FETCH, "fetch", move |msg, call| {
        let shard = shard.borrow();
        let r = match shard.get(&msg.args()[0]) {
            Some(v) => call.reply(&[1], v.as_slice()),
            None => call.reply(&[0], &[]),
        };
        r.expect("answer");
    })
    .expect("register");
    h
}

/// A blocking call returns its handler's answer; a handler that does not answer answers
/// with nothing; 15 arguments fit beside the call's number, 16 do not; the answers go to
/// a reply handler the table reserved at the highest free id.
#[test]
fn blocking_calls_return_their_answers() {
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let handlers = kv_handlers();
            let reserved = handlers
                .info(HandlerId(255))
                .expect("reserved")
                .name
                .clone();
            assert_eq!(reserved, "amnet: call reply");
            let mut node = Node::new(t, handlers, Config::default()).expect("start");
            let peer = 1 - node.rank();
            let r = node.call(peer, SQUARE, &[9], b"abc").expect("call");
            assert_eq!(
                (r.args, r.payload),
                (vec![81, node.rank()], b"cba".to_vec())
            );
            let r = node.call(peer, SILENT, &[], &[]).expect("silent call");
            assert!(r.args.is_empty() && r.payload.is_empty());
            assert!(node.call(peer, SQUARE, &[3; 15], &[]).is_ok());
            assert_eq!(
                node.call(peer, SQUARE, &[3; 16], &[]),
                Err(AmError::TooManyArgs(17))
            );
            // To self too.
            let me = node.rank();
            assert_eq!(
                node.call(me, SQUARE, &[4], &[]).expect("self").args,
                [16, me]
            );
            node.barrier().expect("barrier");
        });
    });
}

/// A table without a callable handler has nothing to call; a full table has no id left
/// for the answers.
#[test]
fn calls_need_a_callable_table() {
    run_ranks(Loopback::cluster(1, LoopbackConfig::default()), |t| {
        let mut node = Node::new(t, Handlers::new(), Config::default()).expect("start");
        assert!(matches!(
            node.call(0, SQUARE, &[], &[]),
            Err(AmError::NotCallable(SQUARE))
        ));
    });
    // A plain Medium request handler beside a callable one: a call to it would reach a
    // handler that never answers, and wait for ever; it is refused before sending, in the
    // words of the registration the user has to make.
    run_ranks(Loopback::cluster(1, LoopbackConfig::default()), |t| {
        let mut h = Handlers::new();
        h.callable(SQUARE, "square", |_, _| {}).expect("register");
        let plain = HandlerId(9);
        h.request(plain, "plain", am_core::AmKind::Medium, |_, _| {})
            .expect("register");
        let mut node = Node::new(t, h, Config::default()).expect("start");
        let err = node.call(0, plain, &[], &[]).expect_err("not callable");
        assert!(matches!(err, AmError::NotCallable(id) if id == plain));
        assert!(err.to_string().contains("Handlers::callable"), "{err}");
        assert_eq!(node.ops_in_flight(), 0, "nothing was opened");
    });
    let mut h = Handlers::new();
    for i in 0..=255u8 {
        h.reply(
            HandlerId(i),
            &format!("r{i}"),
            am_core::AmKind::Short,
            |_| {},
        )
        .expect("register");
    }
    assert_eq!(
        h.callable(SQUARE, "square", |_, _| {}),
        Err(RegisterError::Full)
    );
}

/// Many calls in flight at once (more than the credits), each resolving with its own answer,
/// then every other operation of an AsyncNode, under the runtime-agnostic `block_on`.
#[test]
fn futures_complete_under_any_executor() {
    within(Duration::from_secs(60), || {
        let config = LoopbackConfig::default().segment_size(1 << 16);
        run_ranks(Loopback::cluster(2, config), |t| {
            let config = Config::default().credits(am_core::Credits::Static(2));
            let node = AsyncNode::new(Node::new(t, kv_handlers(), config).expect("start"));
            let me = node.rank();
            let peer = 1 - me;
            let calls: Vec<_> = (0..20u32)
                .map(|i| {
                    let node = &node;
                    async move {
                        let key = me * 100 + i;
                        let stored = node.call(peer, STORE, &[key], &key.to_le_bytes()).await?;
                        let back = node.call(peer, FETCH, &[key], &[]).await?;
                        Ok::<_, AmError>((stored.args, back))
                    }
                })
                .collect();
            for (i, r) in block_on(&node, join_all(calls)).into_iter().enumerate() {
                let (stored, back) = r.expect("call");
                assert_eq!(stored, [1], "key {i} was new");
                assert_eq!(back.args, [1]);
                assert_eq!(back.payload, (me * 100 + i as u32).to_le_bytes());
            }
            block_on(&node, node.put(peer, 64 * me as usize, &[me as u8 + 1; 64])).expect("put");
            block_on(&node, node.barrier()).expect("barrier");
            let got = block_on(&node, node.get(peer, 64 * me as usize, 64)).expect("get");
            assert_eq!(got, [me as u8 + 1; 64], "what this rank put there");
            let old =
                block_on(&node, node.atomic(peer, 1024, AtomicOp::FetchAdd(1u64))).expect("atomic");
            assert!(old < 2);
            block_on(&node, node.atomic_nbi(peer, 1032, AtomicOp::Xor(5u64))).expect("post");
            // A plain request to a callable handler: a call with no caller, whose answer
            // (to call number 7, which this rank never opened) is dropped.
            block_on(&node, node.request_medium(peer, SQUARE, &[7, 3], &[])).expect("request");
            block_on(&node, node.quiesce()).expect("quiesce");
            block_on(&node, node.barrier()).expect("barrier");
            let seg = node.with(|n| n.segment().load_u64(1032).expect("word"));
            assert_eq!(seg, 5);
            let node = node.into_node().expect("the only handle");
            drop(node);
        });
    });
}

/// A call's future dropped before its answer (a cancelled task, a lost `select!`) closes
/// the call at once: nothing of it stays in the node's table, and its answer, when it comes,
/// is discarded as late. Rank 1 does not poll until rank 0 has dropped the future, so the
/// answer cannot come first. Catches the call's handle, which lives inside the future, not
/// dropped with it (the cancelled call then stayed in the table for good).
#[test]
fn a_dropped_call_future_closes_its_call() {
    within(Duration::from_secs(60), || {
        let handlers = || {
            let mut h = Handlers::new();
            h.callable(SQUARE, "square", |msg, call| {
                let x = msg.args()[0];
                let _ = call.reply(&[x * x], &[]);
            })
            .expect("register");
            h
        };
        let transports = Loopback::cluster(2, LoopbackConfig::default());
        let mut nodes = Node::start_all(
            transports.into_iter().map(|t| (t, handlers())),
            Config::default(),
        )
        .expect("start");
        let mut peer = nodes.pop().expect("rank 1");
        let node = AsyncNode::new(nodes.pop().expect("rank 0"));
        let mut call = Box::pin(node.call(1, SQUARE, &[3], &[]));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        assert!(
            std::future::Future::poll(call.as_mut(), &mut cx).is_pending(),
            "rank 1 has not polled"
        );
        assert_eq!(node.ops_in_flight(), 1, "sent, its answer awaited");
        drop(call);
        assert_eq!(node.ops_in_flight(), 0, "the call closed with its future");
        // Rank 1 answers; rank 0 discards the answer.
        while peer.poll().expect("rank 1 polls") == 0 {}
        while node.stats().late_answers == 0 {
            node.progress().expect("rank 0 polls");
        }
        assert_eq!(node.ops_in_flight(), 0);
        let node = node.into_node().expect("the only handle");
        std::thread::scope(|s| {
            s.spawn(|| node.close().expect("rank 0 closes"));
            s.spawn(|| peer.close().expect("rank 1 closes"));
        });
    });
}

/// The futures of `futures` polled together until all are ready, in order.
async fn join_all<F: std::future::Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futures.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|o| o.expect("ready")).collect()
}

/// The node's counters: the answer to a call whose handle was dropped is discarded and
/// counted, and a request that found no credit (one per peer) is counted as a wait. Catches
/// late answers vanishing unseen, and counters that never move.
#[test]
fn late_answers_and_credit_waits_are_counted() {
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let config = Config::default().credits(am_core::Credits::Static(1));
            let mut node = Node::new(t, kv_handlers(), config).expect("start");
            assert_eq!(node.stats(), am_core::Stats::default());
            if node.rank() == 0 {
                // Dropped before its answer: the answer comes, and is discarded.
                drop(node.call_nb(1, SQUARE, &[2], &[]).expect("sent"));
                // One credit: this call waits for the first one's answer (the credit).
                let r = node.call(1, SQUARE, &[3], &[]).expect("call");
                assert_eq!(r.args[0], 9);
                let stats = node.stats();
                assert_eq!(stats.late_answers, 1, "{stats:?}");
                assert!(stats.credit_waits >= 1, "{stats:?}");
                assert_eq!(stats.retransmissions, 0, "{stats:?}");
            }
            node.barrier().expect("barrier");
        });
    });
}
