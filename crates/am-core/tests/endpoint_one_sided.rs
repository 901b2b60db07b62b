//! The one-sided protocol inside [`Endpoint`], driven without `Node` on the deterministic
//! cluster: where the NIC reaches peers' memory it does puts, gets and atomics itself and no
//! message goes out; where it does not, they travel as messages; posted atomics are applied
//! before anything this rank starts later, and a barrier starts only once they are.

mod harness;

use am_core::Local;
use std::task::Poll;

use am_core::{AmError, AmKind, AtomicOp, HandlerId, Handlers, Signal};
use harness::{Cluster, Shape};

const SINK: HandlerId = HandlerId(3);

fn handlers() -> Handlers<Local> {
    let mut h = Handlers::local();
    h.request(SINK, "sink", AmKind::Short, |_, _| {}).unwrap();
    h
}

/// A started cluster whose NIC does one-sided operations itself (`rma`), or not.
fn cluster(ranks: u32, rma: bool) -> Cluster {
    let mut shape = Shape::new(ranks);
    shape.rma = rma;
    let mut c = Cluster::started(shape, 7, |_| handlers());
    c.net.sent.clear();
    c
}

fn ready<T>(p: Poll<T>) -> T {
    match p {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("not ready"),
    }
}

fn word(c: &Cluster, rank: usize, offset: usize) -> u64 {
    c.nodes[rank].segment.byte_area().load_u64(offset).unwrap()
}

#[test]
fn a_nic_that_reaches_peers_does_puts_gets_and_atomics_itself() {
    let mut c = cluster(3, true);
    let data: Vec<u8> = (0..3000).map(|i| (i % 251) as u8).collect();
    let (ep, mut tx) = c.wire(0);
    let mut put = ready(ep.put_start(&mut tx, 2, 64, &data)).unwrap();
    assert!(
        ep.is_complete(&put) && put.is_ready(),
        "placed by the NIC: complete when started"
    );
    assert_eq!(ready(ep.put_step(&mut tx, &put, &data)), Ok(()));
    assert_eq!(ready(ep.poll_op(&mut tx, &mut put, None)), Ok(()));
    let mut get = ready(ep.get_start(&mut tx, 2, 64, data.len())).unwrap();
    assert_eq!(ready(ep.poll_op(&mut tx, &mut get, None)), Ok(data.clone()));
    let mut into = vec![0; 100];
    assert!(ready(ep.get_into_start(&mut tx, 2, 64, &mut into))
        .unwrap()
        .is_ready());
    assert_eq!(into, data[..100]);
    let mut atomic = ready(ep.atomic_start(&mut tx, 1, 8, AtomicOp::FetchAdd(5u64))).unwrap();
    assert!(atomic.is_ready());
    assert_eq!(ready(ep.poll_op(&mut tx, &mut atomic, None)), Ok(0));
    assert!(c.net.sent.is_empty(), "no message: {:?}", c.net.sent);
    let ops: Vec<_> = c.net.nic_ops.iter().map(|o| o.3).collect();
    assert_eq!(ops, ["put", "get", "get", "atomic"]);
    let mut back = vec![0; data.len()];
    c.nodes[2].segment.byte_area().read(64, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(word(&c, 1, 8), 5);
}

#[test]
fn without_such_a_nic_they_travel_as_messages() {
    let mut c = cluster(3, false);
    let (ep, mut tx) = c.wire(0);
    let put = ready(ep.put_start(&mut tx, 2, 64, &[7; 10])).unwrap();
    assert!(!ep.is_complete(&put));
    let mut atomic = ready(ep.atomic_start(&mut tx, 1, 8, AtomicOp::FetchAdd(5u64))).unwrap();
    assert!(!atomic.is_ready());
    assert!(c.net.sent.is_empty(), "nothing goes out before a step");
    c.drive(&[0], |_, ep, tx| ep.put_step(tx, &put, &[7; 10]))[0]
        .clone()
        .unwrap()
        .unwrap();
    c.drive(&[0], |_, ep, tx| ep.atomic_step(tx, &atomic))[0]
        .clone()
        .unwrap()
        .unwrap();
    let old = c.drive(&[0], |_, ep, tx| ep.poll_op(tx, &mut atomic, None))[0]
        .clone()
        .unwrap();
    assert_eq!(old, Ok(0));
    assert!(c.net.nic_ops.is_empty());
    assert_eq!(word(&c, 1, 8), 5);
    c.settle();
    assert!(c.nodes[0].ep.is_complete(&put));
}

#[test]
fn a_busy_nic_leaves_the_operation_unstarted_until_it_is_free() {
    let mut c = cluster(2, true);
    c.net.rma_busy[0] = 2;
    let (ep, mut tx) = c.wire(0);
    assert!(ep.put_start(&mut tx, 1, 0, &[9; 8]).is_pending());
    assert!(ep
        .atomic_start(&mut tx, 1, 0, AtomicOp::FetchAdd(1u64))
        .is_pending());
    assert_eq!(word(&c, 1, 0), 0, "nothing was done while busy");
    let (ep, mut tx) = c.wire(0);
    let put = ready(ep.put_start(&mut tx, 1, 0, &[9; 8])).unwrap();
    assert!(ep.is_complete(&put));
    assert_eq!(word(&c, 1, 0), u64::from_le_bytes([9; 8]));
}

#[test]
fn posted_atomics_reach_the_nic_in_one_batch_before_a_later_request() {
    let mut c = cluster(2, true);
    let (ep, mut tx) = c.wire(0);
    for i in 0..3 {
        ready(ep.atomic_nbi(&mut tx, 1, 8 * i, AtomicOp::FetchAdd(i as u64 + 1))).unwrap();
    }
    assert!(
        c.net.nic_ops.is_empty(),
        "posted: queued, not applied one by one"
    );
    let (ep, mut tx) = c.wire(0);
    ready(ep.request_step(&mut tx, 1, AmKind::Short, SINK, &[0], &[], None)).unwrap();
    let posted: Vec<_> = c.net.nic_ops.iter().map(|o| (o.0, o.3)).collect();
    assert_eq!(
        posted,
        [(0, "posted"); 3],
        "applied before the request went out"
    );
    assert_eq!(c.net.sent.len(), 1);
    assert_eq!((word(&c, 1, 0), word(&c, 1, 8), word(&c, 1, 16)), (1, 2, 3));
}

#[test]
fn a_full_posted_queue_behind_a_busy_nic_takes_no_more() {
    let mut c = cluster(2, true);
    c.net.rma_busy[0] = 2;
    let (ep, mut tx) = c.wire(0);
    for i in 0..64 {
        ready(ep.atomic_nbi(&mut tx, 1, 0, AtomicOp::FetchAdd(1u64))).unwrap_or_else(|e| {
            panic!("post {i}: {e}");
        });
    }
    // The 64th filled the batch and met a busy NIC; the 65th finds it busy again.
    assert!(ep
        .atomic_nbi(&mut tx, 1, 0, AtomicOp::FetchAdd(1u64))
        .is_pending());
    assert_eq!(word(&c, 1, 0), 0);
    let (ep, mut tx) = c.wire(0);
    ready(ep.atomic_nbi(&mut tx, 1, 0, AtomicOp::FetchAdd(1u64))).unwrap();
    assert_eq!(word(&c, 1, 0), 64, "the full batch, in one go");
    let (ep, mut tx) = c.wire(0);
    ready(ep.apply_posted(&mut tx)).unwrap();
    assert_eq!(word(&c, 1, 0), 65);
}

#[test]
fn posted_atomics_by_messages_go_first_and_a_barrier_waits_for_their_answers() {
    for seed in 0..20 {
        let mut c = Cluster::started(Shape::new(3), seed, |_| handlers());
        let mut b = harness::Barriers::default();
        c.net.sent.clear();
        let (ep, mut tx) = c.wire(0);
        ready(ep.atomic_nbi(&mut tx, 1, 0, AtomicOp::FetchAdd(3u64))).unwrap();
        ready(ep.atomic_nbi(&mut tx, 2, 8, AtomicOp::Store(9u64))).unwrap();
        assert!(
            c.net.sent.is_empty(),
            "queued, to go one message per target"
        );
        // Rank 0's barrier sends them first, and nothing else until both are answered; then
        // every rank leaving it sees them.
        let (ep, mut tx) = c.wire(0);
        assert!(b.step(0, ep, &mut tx).is_pending());
        assert_eq!(ep.posted_in_flight(), 2, "sent, answers awaited");
        assert_eq!(
            c.net.sent,
            [(0, 1, false), (0, 2, false)],
            "seed {seed}: no barrier message yet"
        );
        c.drive_all(|r, ep, tx| b.step(r, ep, tx))
            .into_iter()
            .for_each(|r| r.unwrap());
        assert_eq!((word(&c, 1, 0), word(&c, 2, 8)), (3, 9), "seed {seed}");
        assert_eq!(c.nodes[0].ep.posted_in_flight(), 0);
    }
}

#[test]
fn a_posted_atomic_to_a_lost_rank_fails_the_call_that_applies_it() {
    let mut c = cluster(3, true);
    let (ep, mut tx) = c.wire(0);
    ready(ep.atomic_nbi(&mut tx, 1, 0, AtomicOp::FetchAdd(1u64))).unwrap();
    ready(ep.atomic_nbi(&mut tx, 2, 0, AtomicOp::FetchAdd(1u64))).unwrap();
    c.net.lost[1] = true;
    let (ep, mut tx) = c.wire(0);
    assert_eq!(
        ready(ep.quiesce_step(&mut tx)),
        Err(AmError::PeerLost(1)),
        "reported once the queue is empty"
    );
    assert!(ep.is_lost(1));
    assert_eq!(word(&c, 2, 0), 1, "the others were applied");
    let (ep, mut tx) = c.wire(0);
    assert_eq!(ready(ep.quiesce_step(&mut tx)), Ok(()));
}

#[test]
fn posted_atomics_by_messages_share_one_message_per_target_in_their_order() {
    // Mediums that carry a whole batch of 64, and credits for every message.
    let mut shape = Shape::new(3);
    shape.limits.max_medium = 2048;
    shape.credits = 8;
    let mut c = Cluster::started(shape, 7, |_| handlers());
    c.net.sent.clear();
    let mut b = harness::Barriers::default();
    let (ep, mut tx) = c.wire(0);
    // Interleaved targets, and on each target's words an order that matters (a store, then
    // adds): 70 to rank 1, 20 to rank 2, 10 to rank 0 itself.
    for i in 0..100u64 {
        let (dest, word) = match i % 10 {
            0 => (0, 0),
            1 | 2 => (2, 8 * (i % 4) as usize),
            _ => (1, 8 * (i % 5) as usize),
        };
        let op = if i < 10 {
            AtomicOp::Store(1000)
        } else {
            AtomicOp::FetchAdd(i)
        };
        ready(ep.atomic_nbi(&mut tx, dest, word, op)).unwrap();
    }
    let (ep, mut tx) = c.wire(0);
    ready(ep.apply_posted(&mut tx)).unwrap();
    let mut to = [0; 3];
    for &(from, dest, reply) in &c.net.sent {
        assert_eq!((from, reply), (0, false));
        to[dest as usize] += 1;
    }
    // The 64th post filled the queue and sent it: 43 to rank 1 and 14 to rank 2 in one
    // message each (rank 0's own 7 applied here); `apply_posted` sent the other 27 and 6.
    assert_eq!(to, [0, 2, 2], "one message per target and queue");
    c.drive_all(|r, ep, tx| b.step(r, ep, tx))
        .into_iter()
        .for_each(|r| r.unwrap());
    // Replayed in order, word by word.
    let mut want = [[0u64; 5]; 3];
    for i in 0..100u64 {
        let (dest, w) = match i % 10 {
            0 => (0, 0),
            1 | 2 => (2, (i % 4) as usize),
            _ => (1, (i % 5) as usize),
        };
        if i < 10 {
            want[dest][w] = 1000;
        } else {
            want[dest][w] += i;
        }
    }
    for (rank, words) in want.iter().enumerate() {
        for (w, &v) in words.iter().enumerate() {
            assert_eq!(word(&c, rank, 8 * w), v, "rank {rank} word {w}");
        }
    }
    assert_eq!(c.nodes[0].ep.posted_in_flight(), 0);
}

/// More posted atomics to one target than one message holds (mediums of 256 bytes: 9 of
/// them): they go in as many messages as they need, each full but the last, and are applied
/// in their order. Catches the batch no longer capped per message: all of a target's atomics
/// then went in one message longer than a medium may be.
#[test]
fn posted_atomics_by_messages_to_one_target_are_split_at_what_a_message_holds() {
    let shape = Shape::new(2);
    let per_message = shape.limits.max_medium / am_core::protocol::ATOMIC_ENTRY_LEN;
    assert_eq!(per_message, 9, "the shape this test was written for");
    let mut c = Cluster::started(shape, 7, |_| handlers());
    c.net.sent.clear();
    let mut b = harness::Barriers::default();
    let (ep, mut tx) = c.wire(0);
    // 30 atomics on 4 words of rank 1, each word's first a store: their order matters.
    for i in 0..30u64 {
        let op = if i < 4 {
            AtomicOp::Store(1000 * (i + 1))
        } else {
            AtomicOp::FetchAdd(i)
        };
        ready(ep.atomic_nbi(&mut tx, 1, 8 * (i % 4) as usize, op)).unwrap();
    }
    assert!(c.net.sent.is_empty(), "queued, not sent yet");
    c.drive(&[0], |_, ep, tx| ep.apply_posted(tx))[0]
        .clone()
        .unwrap()
        .unwrap();
    assert_eq!(
        c.net.sent,
        [(0, 1, false); 4],
        "30 atomics in messages of at most 9"
    );
    c.drive_all(|r, ep, tx| b.step(r, ep, tx))
        .into_iter()
        .for_each(|r| r.unwrap());
    for w in 0..4u64 {
        let adds: u64 = (4..30).filter(|i| i % 4 == w).sum();
        assert_eq!(
            word(&c, 1, 8 * w as usize),
            1000 * (w + 1) + adds,
            "word {w}"
        );
    }
    assert_eq!(c.nodes[0].ep.posted_in_flight(), 0);
}

/// A put-with-signal by messages whose target departs before its first unit went out: its
/// next step reports the departure. Catches the slot's length arithmetic (data, then the
/// signal's unit) underflowing once the departure cut the operation to what was sent: a
/// subtraction overflow in debug builds, a stale-handle error in release.
#[test]
fn a_put_signal_cut_short_by_a_departure_fails_with_it() {
    let mut c = cluster(2, false);
    let (ep, mut tx) = c.wire(0);
    let data = [7u8; 10];
    let op = ready(ep.put_signal_start(&mut tx, 1, 64, &data, 0, Signal::Set(1))).unwrap();
    assert!(!ep.is_complete(&op));
    ep.mark_departed(1);
    assert_eq!(
        ready(ep.put_signal_step(&mut tx, &op, &data)),
        Err(AmError::PeerDeparted(1))
    );
    assert!(c.net.sent.is_empty(), "nothing went out");
}
