//! A rank that leaves the job with a request of ours unhandled: the wait for its reply fails
//! with `PeerDeparted` instead of waiting for ever, once; later waits for other peers go on.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

use am_core::*;

const PING: HandlerId = HandlerId(1);
const PONG: HandlerId = HandlerId(2);

/// Ends the test process if the test runs past `limit`: a wait that never ends fails.
fn watchdog(limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("still running after {limit:?}: a wait on a departed peer never ended");
        std::process::exit(101);
    });
}

#[test]
fn a_wait_for_a_reply_from_a_rank_that_left_fails() {
    watchdog(Duration::from_secs(60));
    let (sent_tx, sent_rx) = mpsc::channel::<()>();
    let (quiet_tx, quiet_rx) = mpsc::channel::<()>();
    let (sent_rx, sent_tx) = (Mutex::new(sent_rx), Mutex::new(sent_tx));
    let (quiet_rx, quiet_tx) = (Mutex::new(quiet_rx), Mutex::new(quiet_tx));
    let results = run_ranks(Loopback::cluster(3, LoopbackConfig::default()), |t| {
        let pongs = Rc::new(Cell::new(0u32));
        let seen = pongs.clone();
        let pings = Rc::new(Cell::new(0u32));
        let served = pings.clone();
        let mut h = Handlers::local();
        h.request(PING, "ping", AmKind::Short, move |m, t| {
            served.set(served.get() + 1);
            let _ = t.reply_short(PONG, &[m.args()[0]]);
        })
        .unwrap();
        h.reply(PONG, "pong", AmKind::Short, move |_| {
            seen.set(seen.get() + 1)
        })
        .unwrap();
        let mut node = Node::new(t, h, Config::default()).unwrap();
        node.barrier().unwrap();
        match node.rank() {
            0 => {
                quiet_rx.lock().unwrap().recv().unwrap();
                node.request_short(1, PING, &[1]).unwrap();
                sent_tx.lock().unwrap().send(()).unwrap();
                // Rank 1 leaves without handling it: the reply never comes.
                let first = node.wait_until(|| pongs.get() == 1);
                // Reported once: a wait for a live peer's reply goes on.
                node.request_short(2, PING, &[2]).unwrap();
                let second = node.wait_until(|| pongs.get() == 1);
                Some((first, second))
            }
            1 => {
                // Quiet first (the barrier's credits home), then no more polling: the
                // request waits in its queue, and a quiet node drops without polling.
                node.quiesce().unwrap();
                quiet_tx.lock().unwrap().send(()).unwrap();
                sent_rx.lock().unwrap().recv().unwrap();
                drop(node);
                None
            }
            _ => {
                // Serves rank 0's second request, then leaves (its reply is out).
                node.wait_until(|| pings.get() == 1).unwrap();
                None
            }
        }
    });
    let (first, second) = results[0].clone().expect("rank 0's result");
    assert_eq!(first, Err(AmError::PeerDeparted(1)));
    assert_eq!(second, Ok(()));
}
