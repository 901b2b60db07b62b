//! Dynamic credit redistribution with one hot pair among quiet peers: the target lends its bank
//! to the peer that floods it, and when another peer becomes the hot one the credits move there,
//! taken back from the peer that went quiet. Each phase runs until its state is reached (with a
//! bound on messages), so the outcome does not depend on scheduling.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use am_core::*;

const RANKS: u32 = 6;
const TARGET: Rank = 0;
const INITIAL: u32 = 2;
const BANK: u32 = 32;
/// Held credits that count as "the hot pair got a loan".
const HOT: u32 = 16;
/// No phase may need more requests than this.
const BOUND: usize = 200_000;
const REQ: HandlerId = HandlerId(1);

#[derive(Debug, Default, Clone, PartialEq)]
struct Seen {
    held_after_phase1: Vec<u32>,
    held_after_phase2: Vec<u32>,
}

fn held(node: &Node<Loopback>) -> u32 {
    node.credit_policy().held(TARGET)
}

/// Requests one at a time, each waited for: a quiet peer that never stalls.
fn quiet_request(node: &mut Node<Loopback>) {
    node.request_short(TARGET, REQ, &[1]).unwrap();
    node.quiesce().unwrap();
}

#[test]
fn credits_follow_the_hot_pair() {
    let transports = Loopback::cluster(RANKS, LoopbackConfig::default());
    let phase2_done = AtomicBool::new(false);
    let target_view = Mutex::new(None);
    let seen = run_ranks(transports, |t| {
        let mut handlers = Handlers::new();
        handlers
            .request(REQ, "req", AmKind::Short, |_msg, _token| {})
            .unwrap();
        let config = Config {
            credits: Credits::Dynamic {
                initial: INITIAL,
                bank: BANK,
            },
            wait_mode: WaitMode::SpinThenYield,
            ..Config::default()
        };
        let mut node = Node::new(t, handlers, config).unwrap();
        let me = node.rank();
        let mut seen = Seen::default();

        // Phase 1: rank 1 floods the target; ranks 2.. send now and then.
        match me {
            TARGET => {}
            1 => {
                let mut sent = 0;
                while held(&node) < HOT {
                    node.request_short(TARGET, REQ, &[sent as u32]).unwrap();
                    sent += 1;
                    assert!(
                        sent < BOUND,
                        "rank 1 never got a loan: holds {}",
                        held(&node)
                    );
                }
            }
            _ => {
                for _ in 0..20 {
                    quiet_request(&mut node);
                }
            }
        }
        node.barrier().unwrap();
        if me != TARGET {
            // The barrier's own requests hold credits too, and their replies may still be on
            // the way with a grant other than 1: read the books once they have landed.
            node.quiesce().unwrap();
            seen.held_after_phase1.push(held(&node));
        }
        node.barrier().unwrap();

        // Phase 2: rank 2 becomes the hot one and rank 1 goes quiet; the target takes the
        // loan back from rank 1 as rank 2 asks for more.
        match me {
            TARGET => {}
            1 => {
                let mut sent = 0;
                while held(&node) > INITIAL {
                    quiet_request(&mut node);
                    sent += 1;
                    assert!(sent < BOUND, "rank 1 kept its loan: holds {}", held(&node));
                }
                phase2_done.store(true, Ordering::Release);
            }
            2 => {
                let mut sent = 0;
                while held(&node) < HOT || !phase2_done.load(Ordering::Acquire) {
                    node.request_short(TARGET, REQ, &[sent as u32]).unwrap();
                    sent += 1;
                    assert!(
                        sent < BOUND,
                        "rank 2 never got a loan: holds {}",
                        held(&node)
                    );
                }
            }
            _ => {
                for _ in 0..20 {
                    quiet_request(&mut node);
                }
            }
        }
        node.quiesce().unwrap();
        node.barrier().unwrap();
        if me != TARGET {
            node.quiesce().unwrap();
            seen.held_after_phase2.push(held(&node));
        } else {
            let p = node.credit_policy();
            let lent: Vec<u32> = (0..RANKS).map(|r| p.lent_to(r).unwrap()).collect();
            *target_view.lock().unwrap() = Some((lent, p.banked().unwrap()));
        }
        node.barrier().unwrap();
        seen
    });

    // Rank 1 held a loan after phase 1, quiet peers only their initial credits.
    assert!(seen[1].held_after_phase1[0] >= HOT, "{seen:?}");
    for s in &seen[3..] {
        assert_eq!(s.held_after_phase1[0], INITIAL, "{seen:?}");
        assert_eq!(s.held_after_phase2[0], INITIAL, "{seen:?}");
    }
    // After phase 2 the loan sits with rank 2, and rank 1 is back to its initial credits.
    assert_eq!(seen[1].held_after_phase2[0], INITIAL, "{seen:?}");
    assert!(seen[2].held_after_phase2[0] >= HOT, "{seen:?}");
    // The target's books agree with the senders' and nothing was created or lost.
    let (lent, banked) = target_view.into_inner().unwrap().unwrap();
    for r in 1..RANKS as usize {
        assert_eq!(lent[r], seen[r].held_after_phase2[0], "rank {r}: {lent:?}");
    }
    let loans: u32 = lent.iter().map(|l| l - INITIAL).sum();
    assert_eq!(loans + banked, BANK, "lent {lent:?} banked {banked}");
}
