//! Typed messages on the deterministic cluster (`harness`): what a rank does with typed
//! answers queued for a peer that is found lost while they are sent.

mod harness;

use std::cell::RefCell;
use std::rc::Rc;
use std::task::Poll;

use am_core::endpoint::start::{AnswerTyped, Start, TypedCall};
use am_core::typed::{Am, AmContext, Answer};
use am_core::{Handlers, Local};
use harness::{Cluster, Shape};
use serde::{Deserialize, Serialize};

/// Answered later, with `n` words (larger than the harness's Medium from 200 on).
#[derive(Serialize, Deserialize)]
struct Later(u64);

impl Am for Later {
    type Reply = Vec<u64>;
    fn exec(self, _: &mut AmContext) -> Vec<u64> {
        Vec::new()
    }
}

type Kept = Rc<RefCell<Vec<(u64, Answer<Vec<u64>>)>>>;

fn handlers(kept: &Kept) -> Handlers<Local> {
    let mut h = Handlers::local();
    let k = kept.clone();
    h.typed_deferred::<Later>(move |m, _cx, answer| k.borrow_mut().push((m.0, answer)))
        .expect("register");
    h
}

/// Catches a rank that deadlocks (or panics) when sending its queued typed answers finds
/// the caller lost: the send marks the peer lost, which forgets that peer's queued items,
/// while the queue is being sent. Both a dropped answer (its `Abandoned` status) and one
/// in parts are queued when rank 0 dies unreported; rank 1's polls must go on, drop both,
/// and leave nothing queued.
#[test]
fn queued_answers_to_a_peer_found_lost_while_sending_are_dropped() {
    let kept: Vec<Kept> = (0..2).map(|_| Kept::default()).collect();
    let mut c = Cluster::new(Shape::new(2), 7, |r| handlers(&kept[r as usize]));
    for r in c.start() {
        r.expect("start");
    }
    // Rank 0 calls twice; rank 1's code keeps both answers.
    let mut calls = [TypedCall::new(1, Later(3)), TypedCall::new(1, Later(500))];
    let mut ops = Vec::new();
    for call in &mut calls {
        let op = c.drive(&[0], |_, ep, tx| {
            let Poll::Ready(op) = call.start(ep, tx) else {
                return Poll::Pending;
            };
            let mut op = op.expect("started");
            match call.send(ep, tx, &mut op) {
                Poll::Ready(r) => Poll::Ready((r, op)),
                Poll::Pending => Poll::Pending,
            }
        });
        let (sent, op) = op.into_iter().next().flatten().expect("rank 0");
        sent.expect("sent");
        ops.push(op);
    }
    c.drive(&[1], |_, ep, tx| {
        let _ = ep.poll_one(tx);
        if kept[1].borrow().len() == 2 {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    });
    // Rank 0 dies; rank 1 is not told: its sends find out.
    c.net.lost[0] = true;
    let (small, large) = {
        let mut k = kept[1].borrow_mut();
        let large = k.pop().expect("the large call");
        let small = k.pop().expect("the small call");
        (small, large)
    };
    assert_eq!((small.0, large.0), (3, 500));
    drop(small.1);
    let (ep, mut tx) = c.wire(1);
    // The abandoned answer's send finds rank 0 lost.
    for _ in 0..10 {
        let _ = ep.poll_one(&mut tx);
    }
    assert!(ep.is_lost(0), "the send found rank 0 lost");
    assert!(!ep.sends_held(), "nothing left queued for the lost rank");
    // An answer in parts to the lost rank: refused at start, dropped, its abandonment not
    // sent either.
    let mut answer = AnswerTyped::new(large.1, (0..500).collect::<Vec<u64>>());
    assert!(matches!(answer.start(ep, &mut tx), Poll::Ready(Err(_))));
    drop(answer);
    for _ in 0..10 {
        let _ = ep.poll_one(&mut tx);
    }
    assert!(!ep.sends_held(), "nothing left queued for the lost rank");
    drop(ops);
}
