//! Issue 5's fault tests on real sockets (127.0.0.1): 10% loss + 1% duplication + reordering
//! with 100 000 AMs per pair, most of them packed several to a datagram (over a thousand of
//! each fault, without a long test), and 4 credits per peer with a receiver paused for half
//! the peer timeout. Faults come from the transport's own datagram hook, the same one `AM_UDP_FAULTS`
//! sets for whole jobs.

use am_core::Local;
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use am_core::{AmKind, Config, HandlerId, Handlers, Node, WaitMode};
use transport_udp::config::parse_faults;
use transport_udp::{Udp, UdpConfig};

const SEQ: HandlerId = HandlerId(1);
const SEQ_MEDIUM: HandlerId = HandlerId(2);

/// What a receiver saw from its one peer: the next number expected, and how many arrived out
/// of order, twice, or corrupted.
#[derive(Default)]
struct Seen {
    next: Cell<u32>,
    bad: Cell<u32>,
}

fn handlers(seen: &Rc<Seen>) -> Handlers<Local> {
    let mut h = Handlers::local();
    for (id, kind) in [(SEQ, AmKind::Short), (SEQ_MEDIUM, AmKind::Medium)] {
        let s = seen.clone();
        h.request(id, "seq", kind, move |msg, _token| {
            let i = msg.args()[0];
            let payload_ok = msg.payload().iter().all(|&b| b == i as u8);
            if i == s.next.get() && payload_ok {
                s.next.set(i + 1);
            } else {
                s.bad.set(s.bad.get() + 1);
            }
        })
        .unwrap();
    }
    h
}

/// Every `MEDIUM_EVERY`-th message is a Medium of three fragments (reassembly under faults too).
const MEDIUM_EVERY: u32 = 64;

/// Both ranks send `n` numbered AMs to each other at once; each checks it got 0..n in order.
fn exchange(
    transports: Vec<Udp>,
    n: u32,
    credits: u32,
) -> Vec<(u32, u32, transport_udp::Stats, u64)> {
    am_core::run_ranks(transports, |t| {
        let seen = Rc::new(Seen::default());
        let config = Config::default().credits(am_core::Credits::Static(credits));
        let mut node = Node::new(t, handlers(&seen), config).unwrap();
        let peer = 1 - node.rank();
        let payload = vec![0u8; 3000];
        for i in 0..n {
            if i % MEDIUM_EVERY == MEDIUM_EVERY - 1 {
                let p: Vec<u8> = payload.iter().map(|_| i as u8).collect();
                node.request_medium(peer, SEQ_MEDIUM, &[i], &p).unwrap();
            } else {
                node.request_short(peer, SEQ, &[i]).unwrap();
            }
        }
        node.wait_until(|| seen.next.get() + seen.bad.get() >= n)
            .unwrap();
        node.barrier().unwrap();
        let t = node.transport();
        (
            seen.next.get(),
            seen.bad.get(),
            t.stats(),
            t.injected_drops(),
        )
    })
}

#[test]
fn loss_duplication_reordering_100k_per_pair_exactly_once_in_order() {
    // Each way: most messages packed, over 1000 datagrams dropped and retransmitted, and
    // duplicates caught as replays; the assertions below need over 1000 of the first two.
    const N: u32 = 100_000;
    let faults = parse_faults("drop=0.1,dup=0.01,delay=0.05,seed=7").unwrap();
    let config = UdpConfig::default().faults(Some(faults));
    let t0 = Instant::now();
    let results = exchange(Udp::cluster(2, 1 << 16, config).unwrap(), N, 64);
    for (rank, (next, bad, stats, dropped)) in results.iter().enumerate() {
        println!("rank {rank}: {stats:?}, injected drops {dropped}");
        assert_eq!((*next, *bad), (N, 0), "rank {rank}: exactly once, in order");
        // The hook really did drop and the protocol really did recover.
        assert!(
            *dropped > 1000 && stats.retransmits > 1000,
            "rank {rank}: {stats:?}"
        );
        // Packed datagrams, lost and retransmitted like any other.
        assert!(
            stats.packed_messages > u64::from(N) / 2,
            "rank {rank}: {stats:?}"
        );
        // Duplicated datagrams are caught as replays (same packet number), retransmissions
        // of what already arrived as duplicates; nothing else is refused.
        assert!(
            stats.dropped_replayed > 0 && stats.duplicates > 0,
            "rank {rank}: {stats:?}"
        );
        assert_eq!(
            stats.rejected(),
            stats.dropped_replayed,
            "rank {rank}: {stats:?}"
        );
    }
    println!("{N} AMs each way in {:?}", t0.elapsed());
}

#[test]
fn four_credits_receiver_paused_half_the_timeout_then_everything_delivered() {
    const N: u32 = 3000;
    const PAUSE_AFTER: u32 = 100;
    let timeout = Duration::from_millis(1000);
    let mut config = UdpConfig::default();
    config.engine.peer_timeout = timeout;
    let transports = Udp::cluster(2, 1 << 16, config).unwrap();
    let results = am_core::run_ranks(transports, |t| {
        let seen = Rc::new(Seen::default());
        let config = Config::default()
            .credits(am_core::Credits::Static(4))
            .wait_mode(WaitMode::Block);
        let mut node = Node::new(t, handlers(&seen), config).unwrap();
        let start = Instant::now();
        if node.rank() == 0 {
            // With 4 credits the sender stalls within 4 requests of the pause and must wait
            // it out: no PeerLost (the pause is half the timeout), nothing dropped.
            for i in 0..N {
                node.request_short(1, SEQ, &[i]).unwrap();
            }
        } else {
            node.wait_until(|| seen.next.get() >= PAUSE_AFTER).unwrap();
            // The pause itself: no polls, no acks, no credits returned.
            std::thread::sleep(timeout / 2);
            node.wait_until(|| seen.next.get() + seen.bad.get() >= N)
                .unwrap();
        }
        node.barrier().unwrap();
        (
            seen.next.get(),
            seen.bad.get(),
            start.elapsed(),
            node.transport().stats(),
        )
    });
    let (next, bad, _, stats) = &results[1];
    assert_eq!((*next, *bad), (N, 0), "exactly once, in order: {stats:?}");
    // The sender could not finish before the receiver resumed.
    let (_, _, sender_time, sender_stats) = &results[0];
    assert!(*sender_time >= timeout / 2, "{sender_time:?}");
    println!("sender: {sender_time:?}, {sender_stats:?}");
}
