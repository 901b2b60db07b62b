//! The AM protocol on the deterministic cluster harness (`harness`): start-up, barriers,
//! put/get, exit, abort, departures, credits and misbehaving peers, each over many seeded
//! interleavings of the pairs, with no thread and no clock.

mod harness;

use am_core::Local;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::task::Poll;

use am_core::protocol::{opcode, SystemMsg};
use am_core::wire::{Header, MAX_HEAD_LEN};
use am_core::{AmError, AmKind, Category, HandlerId, Handlers, Misbehavior, Rank, StartError};
use harness::{Cluster, Shape};

/// Seeds per scenario: each is one interleaving of the pairs.
const SEEDS: u64 = 40;

const PING: HandlerId = HandlerId(1);
const PONG: HandlerId = HandlerId(2);
const SINK: HandlerId = HandlerId(3);
const EXTRA: HandlerId = HandlerId(40);

/// What a rank's handlers saw.
#[derive(Default)]
struct Seen {
    pongs: Cell<u32>,
    last_pong: Cell<u32>,
    sunk: RefCell<Vec<(Rank, u32)>>,
}

/// PING (Short) answers PONG with its argument + 1; SINK (Short) replies nothing.
fn handlers(seen: &Rc<Seen>) -> Handlers<Local> {
    let mut h = Handlers::local();
    h.request(PING, "ping", AmKind::Short, |m, t| {
        let _ = t.reply_short(PONG, &[m.args()[0] + 1]);
    })
    .unwrap();
    let s = seen.clone();
    h.reply(PONG, "pong", AmKind::Short, move |m| {
        s.pongs.set(s.pongs.get() + 1);
        s.last_pong.set(m.args()[0]);
    })
    .unwrap();
    let s = seen.clone();
    h.request(SINK, "sink", AmKind::Short, move |m, _t| {
        s.sunk.borrow_mut().push((m.src(), m.args()[0]))
    })
    .unwrap();
    h
}

/// A cluster whose ranks share the handler table, with what each rank saw.
fn cluster(shape: Shape, seed: u64) -> (Cluster, Vec<Rc<Seen>>) {
    let seen: Vec<Rc<Seen>> = (0..shape.ranks).map(|_| Rc::default()).collect();
    let c = Cluster::started(shape, seed, |r| handlers(&seen[r as usize]));
    (c, seen)
}

fn ready<T>(p: Poll<T>) -> T {
    match p {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("not ready"),
    }
}

// ---------------------------------------------------------------------------------------------
// Start-up

#[test]
fn start_up_ends_with_every_credit_home_on_every_rank() {
    for seed in 0..SEEDS {
        let shape = Shape::new(5);
        let (c, _) = cluster(shape, seed);
        assert!(!c.in_flight(), "seed {seed}: start-up left messages behind");
        for node in &c.nodes {
            assert!(node.ep.is_quiet());
            for peer in 0..shape.ranks {
                assert_eq!(
                    node.ep.credits().available(peer),
                    shape.credits,
                    "seed {seed}: rank {} toward {peer}",
                    node.ep.rank()
                );
            }
        }
    }
}

#[test]
fn a_handler_table_mismatch_is_reported_on_every_rank() {
    for seed in 0..SEEDS {
        let seen = Rc::default();
        let mut c = Cluster::new(Shape::new(4), seed, |r| {
            let mut h = handlers(&seen);
            if r == 2 {
                h.request(EXTRA, "extra", AmKind::Short, |_, _| {}).unwrap();
            }
            h
        });
        let results = c.start();
        for (r, result) in results.into_iter().enumerate() {
            match result {
                Err(StartError::HandlerTableMismatch {
                    rank: 2, handler, ..
                }) => assert_eq!(handler, Some(EXTRA), "seed {seed} rank {r}"),
                other => panic!("seed {seed} rank {r}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_segment_size_mismatch_is_reported_on_every_rank_with_both_sizes() {
    for seed in 0..SEEDS {
        let shape = Shape::new(4);
        let seen = Rc::default();
        let mut c = Cluster::build(
            shape,
            seed,
            |_| handlers(&seen),
            |r| if r == 3 { 8192 } else { 4096 },
            |_| Box::new(am_core::StaticCredits::new(4, 4)),
        );
        for (r, result) in c.start().into_iter().enumerate() {
            assert_eq!(
                result,
                Err(StartError::SegmentSizeMismatch {
                    rank: 3,
                    ours: 4096,
                    theirs: 8192
                }),
                "seed {seed} rank {r}"
            );
        }
    }
}

#[test]
fn start_up_gets_through_a_busy_device() {
    for seed in 0..SEEDS {
        let seen = Rc::default();
        let mut c = Cluster::new(Shape::new(3), seed, |_| handlers(&seen));
        c.net.busy = vec![3, 2, 5];
        for r in c.start() {
            r.unwrap();
        }
        assert!(c.nodes.iter().all(|n| n.ep.is_quiet()));
    }
}

#[test]
fn no_rank_sends_a_user_request_before_it_has_the_verdict() {
    // Rank 1 has said hello but not heard back: start-up is still pending.
    let seen = Rc::default();
    let mut c = Cluster::new(Shape::new(2), 0, |_| handlers(&seen));
    let (ep, mut tx) = c.wire(1);
    assert!(ep.start_step(&mut tx).is_pending());
    assert!(ep.start_step(&mut tx).is_pending(), "hello goes out once");
    assert_eq!(c.net.sent.len(), 1);
    // Rank 0 leaves before answering: rank 1's start-up fails instead of waiting.
    c.depart(0);
    let (ep, mut tx) = c.wire(1);
    assert_eq!(
        ep.start_step(&mut tx),
        Poll::Ready(Err(StartError::Am(AmError::PeerDeparted(0))))
    );
}

// ---------------------------------------------------------------------------------------------
// Requests, replies, credits

#[test]
fn a_round_trip_returns_the_credit_and_runs_the_reply() {
    for seed in 0..SEEDS {
        let (mut c, seen) = cluster(Shape::new(3), seed);
        let (ep, mut tx) = c.wire(0);
        ep.check_request(2, AmKind::Short, PING, &[41], 0, None)
            .unwrap();
        assert!(ep
            .try_request(&mut tx, 2, AmKind::Short, PING, &[41], &[], None)
            .unwrap());
        assert_eq!(c.nodes[0].ep.credits().available(2), 3);
        c.settle();
        assert_eq!(seen[0].last_pong.get(), 42);
        assert_eq!(c.nodes[0].ep.credits().available(2), 4);
    }
}

/// A driver that catches a request handler's panic (after it replied) and polls on: the next
/// request, whose handler does not reply, still gets its implicit reply, so its credit comes
/// home. (Found in review: what a handler's replies did is kept in the endpoint, and the
/// panicking handler's "replied" made the next request pass for answered.)
#[test]
fn a_caught_panic_after_a_reply_does_not_answer_the_next_request() {
    const BOOM: HandlerId = HandlerId(7);
    let shape = Shape::new(2);
    let seen: Vec<Rc<Seen>> = (0..2).map(|_| Rc::default()).collect();
    let mut c = Cluster::started(shape, 0, |r| {
        let mut h = handlers(&seen[r as usize]);
        h.request(BOOM, "boom", AmKind::Short, |m, t| {
            let _ = t.reply_short(PONG, &[m.args()[0]]);
            panic!("a handler that panics after replying");
        })
        .unwrap();
        h
    });
    for (handler, arg) in [(BOOM, 1), (SINK, 2)] {
        let (ep, mut tx) = c.wire(0);
        assert!(ep
            .try_request(&mut tx, 1, AmKind::Short, handler, &[arg], &[], None)
            .unwrap());
        let caught =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| assert!(c.deliver_to(1))));
        assert_eq!(caught.is_err(), handler == BOOM);
    }
    c.settle();
    assert_eq!(seen[1].sunk.borrow().as_slice(), &[(0, 2)]);
    assert_eq!(seen[0].pongs.get(), 1);
    assert_eq!(
        c.nodes[0].ep.credits().available(1),
        shape.credits,
        "both credits home"
    );
}

#[test]
fn out_of_credit_a_request_waits_and_nothing_is_dropped() {
    for seed in 0..SEEDS {
        let shape = Shape {
            credits: 2,
            ..Shape::new(3)
        };
        let (mut c, seen) = cluster(shape, seed);
        // Ranks 1 and 2 each send 50 requests to rank 0 that it answers implicitly.
        sink_from_1_and_2(&mut c, 50);
        c.settle();
        let sunk = seen[0].sunk.borrow();
        for src in [1, 2] {
            let got: Vec<u32> = sunk.iter().filter(|s| s.0 == src).map(|s| s.1).collect();
            assert_eq!(
                got,
                (0..50).collect::<Vec<_>>(),
                "seed {seed}: from {src}, in order"
            );
        }
        assert!(c.nodes.iter().all(|n| n.ep.is_quiet()));
    }
}

/// Each of `senders` sends `n` Short requests to rank 0, as credits allow: its `i`-th to
/// handler and argument `request(i)`.
fn requests_to_0(
    c: &mut Cluster,
    senders: &[Rank],
    n: u32,
    request: impl Fn(u32) -> (HandlerId, u32),
) {
    let mut next = vec![0u32; c.size() as usize];
    c.drive(senders, |r, ep, tx| {
        let i = &mut next[r as usize];
        while *i < n {
            let (handler, arg) = request(*i);
            match ep.request_step(tx, 0, AmKind::Short, handler, &[arg], &[], None) {
                Poll::Ready(Ok(())) => *i += 1,
                Poll::Ready(Err(e)) => panic!("{e}"),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(())
    });
}

/// Ranks 1 and 2 each send `n` SINK requests to rank 0, numbered from 0, as credits allow.
fn sink_from_1_and_2(c: &mut Cluster, n: u32) {
    requests_to_0(c, &[1, 2], n, |i| (SINK, i));
}

/// Replies rank `r` has sent since the network's record was last cleared.
fn replies_from(c: &Cluster, r: Rank) -> usize {
    c.net
        .sent
        .iter()
        .filter(|&&(s, _, reply)| s == r && reply)
        .count()
}

/// A started cluster of `ranks` ranks with 8 credits per peer whose implicit replies are
/// coalesced, with nothing counted as sent yet.
fn coalescing_cluster(ranks: u32, seed: u64) -> (Cluster, Vec<Rc<Seen>>) {
    let shape = Shape {
        credits: 8,
        ..Shape::new(ranks)
    };
    let (mut c, seen) = cluster(shape, seed);
    for n in &mut c.nodes {
        n.ep.set_acks_coalesce(true);
    }
    c.net.sent.clear();
    (c, seen)
}

/// Under dynamic credits a hot sender borrows beyond the 2 it starts with, and the target
/// answers its requests in batches of half what it holds, not of half the 2 initial ones
/// (which would be one reply per request).
#[test]
fn implicit_replies_to_a_borrower_coalesce_by_its_loan() {
    for seed in 0..SEEDS {
        let shape = Shape::new(3);
        let seen: Vec<Rc<Seen>> = (0..shape.ranks).map(|_| Rc::default()).collect();
        let mut c = Cluster::build(
            shape,
            seed,
            |r| handlers(&seen[r as usize]),
            |_| shape.segment,
            |_| am_core::Credits::DYNAMIC.policy(shape.ranks, 64).unwrap(),
        );
        for r in c.start() {
            r.expect("start-up");
        }
        for n in &mut c.nodes {
            n.ep.set_acks_coalesce(true);
        }
        c.net.sent.clear();
        requests_to_0(&mut c, &[1], 400, |i| (SINK, i));
        c.settle();
        let got: Vec<u32> = seen[0].sunk.borrow().iter().map(|s| s.1).collect();
        assert_eq!(got, (0..400).collect::<Vec<_>>(), "seed {seed}");
        let held = c.nodes[1].ep.credits().held(0);
        assert!(held > 8, "seed {seed}: rank 1 borrowed only up to {held}");
        let replies = replies_from(&c, 0);
        assert!(
            replies < 100,
            "seed {seed}: {replies} replies for 400 requests"
        );
        assert!(c.nodes.iter().all(|n| n.ep.is_quiet()), "seed {seed}");
        assert!(c.nodes.iter().all(|n| n.errors.is_empty()), "seed {seed}");
    }
}

/// Where the transport allows it, the requests a handler answers with no reply are answered
/// together: fewer messages, the same credits home, nothing dropped or reordered, also when
/// the device refuses some of the coalesced replies.
#[test]
fn implicit_replies_coalesce_and_every_credit_comes_home() {
    for seed in 0..SEEDS {
        let (mut c, seen) = coalescing_cluster(3, seed);
        sink_from_1_and_2(&mut c, 50);
        c.net.busy[0] = 3;
        c.settle();
        let sunk = seen[0].sunk.borrow();
        for src in [1, 2] {
            let got: Vec<u32> = sunk.iter().filter(|s| s.0 == src).map(|s| s.1).collect();
            assert_eq!(got, (0..50).collect::<Vec<_>>(), "seed {seed}: from {src}");
            assert_eq!(
                c.nodes[src as usize].ep.credits().available(0),
                8,
                "seed {seed}"
            );
        }
        let replies = replies_from(&c, 0);
        // At least one per batch of 4 (half of 8 credits), far fewer than one per request.
        assert!(
            (26..100).contains(&replies),
            "seed {seed}: {replies} replies for 100"
        );
        assert!(c.nodes.iter().all(|n| n.ep.is_quiet()), "seed {seed}");
        assert!(c.nodes.iter().all(|n| n.errors.is_empty()), "seed {seed}");
    }
}

/// Coalesced implicit replies and explicit ones to the same requester leave in the order of
/// its requests: what earlier requests are owed goes before a reply to a later one, routed as
/// the latest it answers. The harness's network pairs replies with requests as sci's reply
/// slots do, so a reply routed to a request already answered fails the test (`settle`).
#[test]
fn coalesced_and_explicit_replies_keep_request_order() {
    for seed in 0..SEEDS {
        let (mut c, seen) = coalescing_cluster(2, seed);
        // Three requests answered by nobody, then one answered: 20 times.
        requests_to_0(&mut c, &[1], 80, |i| {
            if i % 4 == 3 {
                (PING, 1000 + i)
            } else {
                (SINK, i)
            }
        });
        c.settle();
        let sunk: Vec<u32> = seen[0].sunk.borrow().iter().map(|s| s.1).collect();
        let want: Vec<u32> = (0..80).filter(|i| i % 4 != 3).collect();
        assert_eq!(sunk, want, "seed {seed}");
        assert_eq!(seen[1].pongs.get(), 20, "seed {seed}");
        assert_eq!(c.nodes[1].ep.credits().available(0), 8, "seed {seed}");
        let replies = c.net.sent.iter().filter(|&&(s, _, r)| s == 0 && r).count();
        assert!(
            replies < 80,
            "seed {seed}: {replies} replies for 80 requests"
        );
        assert!(c.nodes.iter().all(|n| n.ep.is_quiet()), "seed {seed}");
        assert!(c.nodes.iter().all(|n| n.errors.is_empty()), "seed {seed}");
    }
}

#[test]
fn a_refused_reply_is_sent_again_in_order() {
    let (mut c, seen) = cluster(Shape::new(2), 1);
    for i in 0..3 {
        let (ep, mut tx) = c.wire(0);
        assert!(ep
            .try_request(&mut tx, 1, AmKind::Short, PING, &[i * 10], &[], None)
            .unwrap());
    }
    // Rank 1's device refuses its first two replies: they wait, and go out in order.
    c.net.busy[1] = 2;
    assert!(c.deliver_to(1));
    assert!(c.deliver_to(1));
    assert!(!c.nodes[1].ep.is_quiet(), "two replies wait");
    assert!(c.deliver_to(1));
    c.settle();
    let (ep, mut tx) = c.wire(1);
    ep.flush(&mut tx).unwrap();
    c.settle();
    assert_eq!(seen[0].pongs.get(), 3);
    assert_eq!(seen[0].last_pong.get(), 21);
    assert!(c.nodes.iter().all(|n| n.ep.is_quiet()));
}

/// Dynamic credits with one hot pair among quiet peers: the target (rank 0) lends its bank to
/// the peer that floods it, and when another peer becomes the hot one the loan moves there,
/// taken back from the peer that went quiet. Every phase runs until its state is reached.
#[test]
fn dynamic_credits_follow_the_hot_pair() {
    const RANKS: u32 = 6;
    const INITIAL: u32 = 2;
    const BANK: u32 = 32;
    /// Held credits that count as "the hot pair got a loan".
    const HOT: u32 = 16;
    /// Quiet requests per quiet rank and phase.
    const QUIET: u32 = 20;
    for seed in 0..10 {
        let shape = Shape::new(RANKS);
        let seen: Vec<Rc<Seen>> = (0..RANKS).map(|_| Rc::default()).collect();
        let policy = am_core::Credits::Dynamic {
            initial: INITIAL,
            bank: BANK,
        };
        let mut c = Cluster::build(
            shape,
            seed,
            |r| handlers(&seen[r as usize]),
            |_| 4096,
            |_| policy.policy(RANKS, shape.limits.max_credits).unwrap(),
        );
        for r in c.start() {
            r.unwrap();
        }
        let held = |c: &Cluster, r: Rank| c.nodes[r as usize].ep.credits().held(0);
        let senders: Vec<Rank> = (1..RANKS).collect();

        // Phase 1: rank 1 floods until it holds a loan; the others send one request at a
        // time, each answered before the next.
        let mut quiet = vec![(0u32, false); RANKS as usize];
        c.drive(&senders, |r, ep, tx| {
            if r == 1 {
                flood_until(ep, tx, |ep| ep.credits().held(0) >= HOT)
            } else {
                quiet_step(ep, tx, &mut quiet[r as usize], |n, _| n == QUIET)
            }
        });
        c.settle();
        assert!(held(&c, 1) >= HOT, "seed {seed}");
        for r in 2..RANKS {
            assert_eq!(held(&c, r), INITIAL, "seed {seed}: quiet rank {r}");
        }

        // Phase 2: rank 2 becomes the hot one and rank 1 goes quiet; the target takes the
        // loan back from rank 1 as rank 2 asks for more.
        let mut quiet = vec![(0u32, false); RANKS as usize];
        let rank1_done = Cell::new(false);
        c.drive(&senders, |r, ep, tx| match r {
            1 => {
                let p = quiet_step(ep, tx, &mut quiet[1], |_, ep| {
                    ep.credits().held(0) <= INITIAL
                });
                rank1_done.set(p.is_ready());
                p
            }
            2 => flood_until(ep, tx, |ep| ep.credits().held(0) >= HOT && rank1_done.get()),
            _ => quiet_step(ep, tx, &mut quiet[r as usize], |n, _| n == QUIET),
        });
        c.settle();
        assert_eq!(
            held(&c, 1),
            INITIAL,
            "seed {seed}: rank 1 gave its loan back"
        );
        assert!(held(&c, 2) >= HOT, "seed {seed}: rank 2 holds the loan");
        // The target's books agree with the senders' and nothing was created or lost.
        let books = c.nodes[0].ep.credits();
        let mut loans = 0;
        for r in 1..RANKS {
            assert_eq!(books.lent_to(r), Some(held(&c, r)), "seed {seed}: rank {r}");
            loans += held(&c, r) - INITIAL;
        }
        assert_eq!(loans + books.banked().unwrap(), BANK, "seed {seed}");
        assert!(c.nodes.iter().all(|n| n.ep.is_quiet()));
    }
}

/// Sends SINK requests to rank 0 as fast as credits allow until `enough`.
fn flood_until(
    ep: &mut am_core::Endpoint<am_core::Local>,
    tx: &mut harness::Wire<'_>,
    enough: impl Fn(&am_core::Endpoint<am_core::Local>) -> bool,
) -> Poll<()> {
    while !enough(ep) {
        match ep.request_step(tx, 0, AmKind::Short, SINK, &[0], &[], None) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) => panic!("{e}"),
            Poll::Pending => return Poll::Pending,
        }
    }
    Poll::Ready(())
}

/// One request to rank 0 at a time, each answered before the next, until `enough(sent, ep)`.
fn quiet_step(
    ep: &mut am_core::Endpoint<am_core::Local>,
    tx: &mut harness::Wire<'_>,
    (sent, waiting): &mut (u32, bool),
    enough: impl Fn(u32, &am_core::Endpoint<am_core::Local>) -> bool,
) -> Poll<()> {
    if *waiting {
        if !ep.is_quiet() {
            return Poll::Pending;
        }
        *waiting = false;
    }
    if enough(*sent, ep) {
        return Poll::Ready(());
    }
    match ep.request_step(tx, 0, AmKind::Short, SINK, &[*sent], &[], None) {
        Poll::Ready(Ok(())) => {
            *sent += 1;
            *waiting = true;
        }
        Poll::Ready(Err(e)) => panic!("{e}"),
        Poll::Pending => {}
    }
    Poll::Pending
}

// ---------------------------------------------------------------------------------------------
// Barrier

#[test]
fn nobody_leaves_a_barrier_before_the_last_rank_enters() {
    for seed in 0..SEEDS {
        for ranks in [2, 3, 5, 8] {
            let (mut c, _) = cluster(Shape::new(ranks), seed);
            let mut b = harness::Barriers::default();
            let late = ranks - 1;
            let early: Vec<Rank> = (0..late).collect();
            // The others enter and make every step they can: none may finish.
            for _ in 0..100 {
                for &r in &early {
                    let (ep, mut tx) = c.wire(r);
                    assert!(
                        b.step(r, ep, &mut tx).is_pending(),
                        "seed {seed}, {ranks} ranks: rank {r} left early"
                    );
                }
                if !c.deliver_one() {
                    break;
                }
            }
            // The late rank enters; two barriers in a row complete everywhere.
            for _ in 0..2 {
                c.drive_all(|r, ep, tx| b.step(r, ep, tx))
                    .into_iter()
                    .for_each(|r| r.unwrap());
            }
            c.settle();
            assert!(c.nodes.iter().all(|n| n.ep.is_quiet()));
        }
    }
}

#[test]
fn a_barrier_waiting_on_a_departed_rank_fails_and_so_does_its_retry() {
    for seed in 0..SEEDS {
        let (mut c, _) = cluster(Shape::new(4), seed);
        let mut b = harness::Barriers::default();
        // All four meet once; then rank 3 leaves and the others call barrier once more.
        c.drive_all(|r, ep, tx| b.step(r, ep, tx))
            .into_iter()
            .for_each(|r| r.unwrap());
        c.settle();
        c.depart(3);
        let results = c.drive(&[0, 1, 2], |r, ep, tx| match b.step(r, ep, tx) {
            // A rank that waits on a live rank keeps waiting; only the one waiting on 3 fails.
            Poll::Ready(r) => Poll::Ready(r),
            Poll::Pending if ep.is_departed(3) => Poll::Pending,
            Poll::Pending => unreachable!(),
        });
        // Rank 0's first round comes from rank 3: it fails with the departure.
        assert_eq!(
            results[0],
            Some(Err(AmError::PeerDeparted(3))),
            "seed {seed}"
        );
        let (ep, mut tx) = c.wire(0);
        assert_eq!(
            b.step(0, ep, &mut tx),
            Poll::Ready(Err(AmError::PeerDeparted(3))),
            "seed {seed}: the retry fails the same way"
        );
    }
}

#[test]
fn a_barrier_interrupted_by_a_busy_device_resumes_without_sending_twice() {
    for seed in 0..SEEDS {
        let (mut c, _) = cluster(Shape::new(4), seed);
        c.net.sent.clear();
        c.net.busy = vec![1, 2, 3, 1];
        let mut b = harness::Barriers::default();
        c.drive_all(|r, ep, tx| b.step(r, ep, tx))
            .into_iter()
            .for_each(|r| r.unwrap());
        c.settle();
        let requests = c.net.sent.iter().filter(|s| !s.2).count();
        // Two rounds of one request per rank.
        assert_eq!(requests, 8, "seed {seed}");
    }
}

// ---------------------------------------------------------------------------------------------
// Put and get

fn pattern(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ salt)
        .collect()
}

#[test]
fn put_then_get_moves_the_bytes_in_chunks() {
    for seed in 0..SEEDS {
        let shape = Shape {
            credits: 2,
            ..Shape::new(3)
        };
        let (mut c, _) = cluster(shape, seed);
        // 3000 bytes: three Long chunks of at most 1024 and twelve Medium get replies of
        // at most 256, more than the two credits allow at once.
        let data = pattern(3000, seed as u8);
        let (ep, mut tx) = c.wire(0);
        let mut put = ready(ep.put_start(&mut tx, 2, 77, &data)).unwrap();
        let res = c.drive(&[0], |_, ep, tx| ep.put_step(tx, &put, &data));
        res[0].clone().unwrap().unwrap();
        let res = c.drive(&[0], |_, ep, tx| ep.poll_op(tx, &mut put, None));
        res[0].clone().unwrap().unwrap();
        let mut back = vec![0; data.len()];
        c.nodes[2].segment.byte_area().read(77, &mut back).unwrap();
        assert_eq!(back, data, "seed {seed}: the put landed");

        let (ep, mut tx) = c.wire(0);
        let mut get = ready(ep.get_start(&mut tx, 2, 77, data.len())).unwrap();
        c.drive(&[0], |_, ep, tx| ep.get_step(tx, &get))[0]
            .clone()
            .unwrap()
            .unwrap();
        let got = c.drive(&[0], |_, ep, tx| ep.poll_op(tx, &mut get, None))[0]
            .clone()
            .unwrap()
            .unwrap();
        assert_eq!(got, data, "seed {seed}: the get read it back");
        c.settle();
        assert!(c.nodes.iter().all(|n| n.ep.is_quiet()));
    }
}

#[test]
fn put_and_get_outside_the_segment_fail_at_the_initiator_and_send_nothing() {
    let (mut c, _) = cluster(Shape::new(2), 0);
    c.net.sent.clear();
    let (ep, mut tx) = c.wire(0);
    let err = |offset, len| AmError::SegmentOutOfBounds {
        offset,
        len,
        size: 4096,
    };
    assert_eq!(
        ready(ep.put_start(&mut tx, 1, 4000, &[0; 97])).unwrap_err(),
        err(4000, 97)
    );
    assert_eq!(
        ready(ep.get_start(&mut tx, 1, u64::MAX as usize, 1)).unwrap_err(),
        err(u64::MAX, 1)
    );
    assert_eq!(
        ready(ep.put_start(&mut tx, 2, 0, &[1])).unwrap_err(),
        AmError::InvalidRank { rank: 2, size: 2 }
    );
    assert!(c.net.sent.is_empty());
}

#[test]
fn a_get_from_a_rank_that_dies_fails_with_peer_lost() {
    for seed in 0..SEEDS {
        let (mut c, _) = cluster(Shape::new(3), seed);
        let (ep, mut tx) = c.wire(0);
        let mut get = ready(ep.get_start(&mut tx, 1, 0, 2000)).unwrap();
        // Some of the get's requests go out, then rank 1 dies before answering.
        let (ep, mut tx) = c.wire(0);
        let _ = ep.get_step(&mut tx, &get);
        c.lose(1);
        let (ep, mut tx) = c.wire(0);
        assert_eq!(
            ep.get_step(&mut tx, &get),
            Poll::Ready(Err(AmError::PeerLost(1)))
        );
        assert_eq!(
            ready(ep.poll_op(&mut tx, &mut get, None)),
            Err(AmError::PeerLost(1)),
            "seed {seed}"
        );
    }
}

/// Rank 1 answers rank 0's get and leaves; before rank 0 has received the answer, a put
/// of rank 0's to rank 1 finds it gone. The put fails with `PeerDeparted`, the get still
/// completes with the bytes rank 1 sent before it left, and only the transport's report
/// (after those bytes) makes rank 1 departed. Catches a send that finds a peer gone and
/// fails the waits its messages still in flight would have ended (the README's teams
/// example failed its broadcast this way on a loaded machine).
#[test]
fn a_send_that_finds_a_peer_gone_fails_alone_until_the_poll_reports_it() {
    for seed in 0..SEEDS {
        let (mut c, _) = cluster(Shape::new(2), seed);
        let data = pattern(64, seed as u8);
        c.nodes[1].segment.byte_area().write(0, &data).unwrap();
        let (ep, mut tx) = c.wire(0);
        let mut get = ready(ep.get_start(&mut tx, 1, 0, data.len())).unwrap();
        c.drive(&[0], |_, ep, tx| ep.get_step(tx, &get))[0]
            .clone()
            .unwrap()
            .unwrap();
        // Rank 1 answers, and leaves.
        while c.deliver_to(1) {}
        c.leave_unreported(1);
        let (ep, mut tx) = c.wire(0);
        let put = match ep.put_start(&mut tx, 1, 0, &[7]) {
            Poll::Ready(Ok(put)) => c.drive(&[0], |_, ep, tx| ep.put_step(tx, &put, &[7]))[0]
                .clone()
                .unwrap(),
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => unreachable!("a credit is free"),
        };
        assert_eq!(put, Err(AmError::PeerDeparted(1)), "seed {seed}");
        assert!(
            !c.nodes[0].ep.is_departed(1),
            "seed {seed}: not reported yet"
        );
        let got = c.drive(&[0], |_, ep, tx| ep.poll_op(tx, &mut get, None))[0]
            .clone()
            .unwrap();
        assert_eq!(got, Ok(data), "seed {seed}: the answer sent before it left");
        c.report_departure(1);
        assert!(c.nodes[0].ep.is_departed(1));
    }
}

// ---------------------------------------------------------------------------------------------
// Exit and abort

#[test]
fn exit_from_one_rank_reaches_every_other_rank() {
    for seed in 0..SEEDS {
        let (mut c, _) = cluster(Shape::new(4), seed);
        for dest in [0, 1, 3] {
            let (ep, mut tx) = c.wire(2);
            assert!(ep.try_exit(&mut tx, dest, 7).unwrap());
        }
        c.settle();
        for r in [0, 1, 3] {
            assert_eq!(
                c.nodes[r].ep.exit_requested(),
                Some(7),
                "seed {seed} rank {r}"
            );
        }
        assert_eq!(c.nodes[2].ep.exit_requested(), None);
    }
}

#[test]
fn an_aborted_job_fails_every_send_and_every_retry() {
    let (mut c, _) = cluster(Shape::new(3), 0);
    c.net.aborted = true;
    let mut b = harness::Barriers::default();
    for _ in 0..2 {
        let (ep, mut tx) = c.wire(1);
        assert_eq!(
            b.step(1, ep, &mut tx),
            Poll::Ready(Err(AmError::JobAborted))
        );
    }
    let (ep, mut tx) = c.wire(1);
    assert_eq!(
        ep.request_step(&mut tx, 0, AmKind::Short, SINK, &[1], &[], None),
        Poll::Ready(Err(AmError::JobAborted))
    );
    assert_eq!(ep.credits().available(0), 4, "the credit was given back");
}

// ---------------------------------------------------------------------------------------------
// Misbehaving peers: raw bytes injected as rank 1

fn raw(h: Header, args: &[u32], payload: &[u8]) -> Vec<u8> {
    let h = Header {
        nargs: args.len() as u8,
        payload_len: payload.len() as u32,
        ..h
    };
    let mut head = [0u8; MAX_HEAD_LEN];
    let n = h.encode(args, &mut head);
    let mut bytes = head[..n].to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

fn header(category: Category, system: bool, kind: AmKind, handler: u8, credit: u8) -> Header {
    Header {
        category,
        kind,
        system,
        handler,
        nargs: 0,
        credit,
        payload_len: 0,
        long_offset: 0,
    }
}

/// The replies rank 0 sent to rank 1 (what a hand-driven peer reads), as system opcodes
/// (`None` for a user reply).
fn replies_to_1(c: &mut Cluster) -> Vec<Option<u8>> {
    c.take(0, 1)
        .into_iter()
        .map(|p| {
            assert!(p.reply);
            let h = Header::decode_prefix(&p.bytes, p.bytes.len(), true).unwrap();
            h.system.then_some(h.handler)
        })
        .collect()
}

#[test]
fn an_unknown_handler_is_reported_and_its_credit_still_returned() {
    let (mut c, seen) = cluster(Shape::new(2), 0);
    for (handler, kind) in [
        (99, AmKind::Short),
        (PING.0, AmKind::Medium),
        (PONG.0, AmKind::Short),
    ] {
        let bytes = raw(
            header(Category::Request, false, kind, handler, 0),
            &[1],
            &[],
        );
        c.inject(1, 0, bytes);
        assert!(c.deliver_to(0));
        assert_eq!(
            c.errors(0),
            [AmError::PeerMisbehaved {
                peer: 1,
                what: Misbehavior::UnknownHandler {
                    handler: HandlerId(handler),
                    category: Category::Request,
                    kind
                }
            }]
        );
        assert_eq!(
            replies_to_1(&mut c),
            [Some(opcode::ACK)],
            "the credit comes back"
        );
    }
    assert_eq!(seen[0].sunk.borrow().len(), 0);
}

#[test]
fn a_reply_without_a_request_leaves_the_credits_alone() {
    let (mut c, seen) = cluster(Shape::new(2), 0);
    for (system, handler, credit) in [
        (true, opcode::ACK, 1),
        (false, PONG.0, 1),
        (false, PONG.0, 255),
    ] {
        let bytes = raw(
            header(Category::Reply, system, AmKind::Short, handler, credit),
            &[5],
            &[],
        );
        c.inject(1, 0, bytes);
        assert!(c.deliver_to(0));
        assert_eq!(
            c.errors(0),
            [AmError::PeerMisbehaved {
                peer: 1,
                what: Misbehavior::ReplyWithoutRequest
            }]
        );
        assert_eq!(c.nodes[0].ep.credits().available(1), 4);
    }
    assert_eq!(seen[0].pongs.get(), 0, "no reply handler ran");
}

#[test]
fn a_put_outside_the_segment_is_refused_answered_and_leaves_the_segment_alone() {
    let (mut c, _) = cluster(Shape::new(2), 0);
    let put = SystemMsg::Put { op: 0 }.encode();
    let h = Header {
        long_offset: 4000,
        ..header(Category::Request, true, AmKind::Long, put.opcode, 0)
    };
    c.inject(1, 0, raw(h, put.args(), &[0xAB; 200]));
    assert!(c.deliver_to(0));
    assert!(matches!(
        c.errors(0)[..],
        [AmError::PeerMisbehaved {
            peer: 1,
            what: Misbehavior::OutOfSegment {
                offset: 4000,
                len: 200
            }
        }]
    ));
    // The initiator is told (PUT_DONE, not ok), so it does not hang.
    assert_eq!(replies_to_1(&mut c), [Some(opcode::PUT_DONE)]);
    let mut seg = vec![0xFF; 4096];
    c.nodes[0].segment.byte_area().read(0, &mut seg).unwrap();
    assert!(seg.iter().all(|&b| b == 0), "nothing written");
}

#[test]
fn system_messages_a_correct_peer_never_sends_are_reported() {
    let (mut c, _) = cluster(Shape::new(2), 0);
    let bad = [
        // HELLO to a rank that is not 0... rank 0 gets it from rank 1 after start-up: its
        // payload is not a signature.
        raw(
            header(Category::Request, true, AmKind::Medium, opcode::HELLO, 0),
            &[0, 0, 0, 0],
            &[1],
        ),
        // A barrier round past the last.
        raw(
            header(Category::Request, true, AmKind::Short, opcode::BARRIER, 0),
            &[0, 0, 99],
            &[],
        ),
        // An unknown opcode.
        raw(
            header(Category::Request, true, AmKind::Short, 200, 0),
            &[],
            &[],
        ),
        // A get larger than one reply carries.
        raw(
            header(Category::Request, true, AmKind::Short, opcode::GET, 0),
            &[0, 0, 0, 300, 0, 0],
            &[],
        ),
    ];
    for (i, b) in bad.into_iter().enumerate() {
        c.inject(1, 0, b);
        assert!(c.deliver_to(0));
        let errors = c.errors(0);
        assert!(
            matches!(errors[..], [AmError::PeerMisbehaved { peer: 1, .. }]),
            "#{i}: {errors:?}"
        );
        // Every request is still answered, so the peer's credit comes back.
        assert_eq!(replies_to_1(&mut c).len(), 1, "#{i}");
    }
    // Rank 0 still works.
    let (ep, mut tx) = c.wire(0);
    assert!(ep
        .try_request(&mut tx, 1, AmKind::Short, PING, &[1], &[], None)
        .unwrap());
    c.settle();
    assert!(c.nodes.iter().all(|n| n.ep.is_quiet()));
}

#[test]
fn a_reply_owed_by_a_rank_that_left_is_reported_once() {
    for seed in 0..SEEDS {
        let (mut c, _) = cluster(Shape::new(3), seed);
        // Rank 0 asks rank 1 and rank 2; rank 1 leaves before its request is handled.
        for dest in [1, 2] {
            let (ep, mut tx) = c.wire(0);
            assert!(ep
                .try_request(&mut tx, dest, AmKind::Short, PING, &[dest], &[], None)
                .unwrap());
        }
        assert_eq!(c.nodes[0].ep.take_unanswerable(), None, "nobody left yet");
        c.depart(1);
        c.settle();
        let ep = &mut c.nodes[0].ep;
        assert_eq!(ep.credits().outstanding(2), 0, "rank 2 answered");
        assert_eq!(
            ep.take_unanswerable(),
            Some(AmError::PeerDeparted(1)),
            "seed {seed}"
        );
        assert_eq!(ep.take_unanswerable(), None, "reported once");
    }
}

#[test]
fn a_reply_owed_by_a_rank_that_died_is_reported_as_lost() {
    let (mut c, _) = cluster(Shape::new(2), 0);
    let (ep, mut tx) = c.wire(0);
    assert!(ep
        .try_request(&mut tx, 1, AmKind::Short, PING, &[1], &[], None)
        .unwrap());
    c.lose(1);
    assert_eq!(
        c.nodes[0].ep.take_unanswerable(),
        Some(AmError::PeerLost(1))
    );
}
