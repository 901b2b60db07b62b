//! Whole jobs on Loopback: a rank that panics aborts the job (the others' barrier fails with
//! `AmError::JobAborted` instead of hanging, and `run_ranks` re-raises the panic), and 8 ranks
//! doing all-to-all Medium requests with one credit per peer run out of credit and recover
//! without losing or duplicating anything.

use am_core::Local;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use am_core::{
    run_ranks, AmError, AmKind, Config, HandlerId, Handlers, Loopback, LoopbackConfig, Node, Rank,
    Transport, TryRequestError, WaitMode,
};

/// Bound on a whole job: a rank that hangs fails the test instead of hanging it.
const LIMIT: Duration = Duration::from_secs(20);

/// Runs `f` on its own thread and returns its result, or its panic as `Err`; panics if it has
/// not finished within `limit` (the thread is then left behind, and dies with the process).
fn within<R: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> R + Send + 'static,
) -> std::thread::Result<R> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(r) => r,
        Err(e) => panic!("the job did not finish within {limit:?} ({e}): a rank hangs"),
    }
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "<non-string panic payload>".to_owned()
    }
}

fn config(credits: u32) -> Config {
    Config::default()
        .credits(am_core::Credits::Static(credits))
        .wait_mode(WaitMode::Block)
}

/// Sets a flag if the thread holding it panics, so that a rank waiting for it stops waiting.
struct FlagOnPanic<'a>(&'a AtomicBool);

impl Drop for FlagOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.store(true, Ordering::SeqCst);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// (a) A rank panics while the others wait in a barrier.

const PANIC_MESSAGE: &str = "rank 2 gives up on purpose";

#[test]
fn a_panicking_rank_aborts_the_others_barrier() {
    let outcome = within(LIMIT, || {
        let ready = AtomicUsize::new(0);
        let someone_panicked = AtomicBool::new(false);
        let aborted = AtomicUsize::new(0);
        let unexpected = Mutex::new(Vec::<String>::new());
        let job = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_ranks(Loopback::cluster(4, LoopbackConfig::default()), |t| {
                let _flag = FlagOnPanic(&someone_panicked);
                let mut node = Node::new(t, Handlers::local(), config(8)).expect("start");
                let me = node.rank();
                if me == 2 {
                    // Panic only once the three others are (about to be) in the barrier, so
                    // that it is the barrier, not the start-up, that must notice.
                    let deadline = Instant::now() + LIMIT;
                    while ready.load(Ordering::SeqCst) < 3 {
                        if someone_panicked.load(Ordering::SeqCst) {
                            return;
                        }
                        assert!(Instant::now() < deadline, "rank 2: the others never came");
                        std::thread::yield_now();
                    }
                    panic!("{}", PANIC_MESSAGE);
                }
                ready.fetch_add(1, Ordering::SeqCst);
                match node.barrier() {
                    Err(AmError::JobAborted) => {
                        aborted.fetch_add(1, Ordering::SeqCst);
                    }
                    other => unexpected
                        .lock()
                        .unwrap()
                        .push(format!("rank {me}: barrier returned {other:?}")),
                }
                // And every later call fails the same way rather than blocking.
                match node.barrier() {
                    Err(AmError::JobAborted) => {}
                    other => unexpected
                        .lock()
                        .unwrap()
                        .push(format!("rank {me}: second barrier returned {other:?}")),
                }
            })
        }));
        (
            job.map(|_| ()),
            aborted.into_inner(),
            unexpected.into_inner().unwrap(),
        )
    });
    let (job, aborted, unexpected) = outcome.expect("the test's own job thread");
    let payload = job.expect_err("run_ranks re-raises the panic of rank 2");
    assert_eq!(panic_message(&*payload), PANIC_MESSAGE);
    assert!(unexpected.is_empty(), "{unexpected:#?}");
    assert_eq!(aborted, 3, "ranks 0, 1 and 3 saw the job aborted");
}

// ---------------------------------------------------------------------------------------------
// (b) 8 ranks, all-to-all, one credit per peer.

const RANKS: u32 = 8;
const PER_PEER: u32 = 200;
const PAYLOAD: usize = 48;

const REQ_MEDIUM: HandlerId = HandlerId(1);
const REP_MEDIUM: HandlerId = HandlerId(2);
const REQ_SHORT: HandlerId = HandlerId(3);
const REP_SHORT: HandlerId = HandlerId(4);

fn payload(src: Rank, dest: Rank, seq: u32) -> Vec<u8> {
    (0..PAYLOAD)
        .map(|i| (i as u32 ^ seq.wrapping_mul(2_654_435_761) ^ (src << 4) ^ dest) as u8)
        .collect()
}

/// What one rank's handlers saw.
struct Seen {
    me: Rank,
    /// Medium requests received, per source (also the next sequence number expected).
    requests: RefCell<Vec<u32>>,
    /// Medium replies received, per target.
    replies: RefCell<Vec<u32>>,
    short_requests: Cell<u32>,
    short_replies: Cell<u32>,
}

fn handlers(seen: &Rc<Seen>) -> Handlers<Local> {
    let mut h = Handlers::local();
    let s = seen.clone();
    h.request(
        REQ_MEDIUM,
        "req_medium",
        AmKind::Medium,
        move |msg, token| {
            let src = msg.src();
            let seq = msg.args()[0];
            let mut requests = s.requests.borrow_mut();
            assert_eq!(seq, requests[src as usize], "rank {}: from {src}", s.me);
            assert!(msg.payload() == payload(src, s.me, seq), "payload intact");
            requests[src as usize] += 1;
            token
                .reply_medium(REP_MEDIUM, &[seq], msg.payload())
                .expect("reply");
        },
    )
    .unwrap();
    let s = seen.clone();
    h.reply(REP_MEDIUM, "rep_medium", AmKind::Medium, move |msg| {
        let dest = msg.src();
        let seq = msg.args()[0];
        let mut replies = s.replies.borrow_mut();
        assert_eq!(
            seq, replies[dest as usize],
            "rank {}: reply from {dest}",
            s.me
        );
        assert!(msg.payload() == payload(s.me, dest, seq), "echo intact");
        replies[dest as usize] += 1;
    })
    .unwrap();
    let s = seen.clone();
    h.request(REQ_SHORT, "req_short", AmKind::Short, move |msg, token| {
        s.short_requests.set(s.short_requests.get() + 1);
        token.reply_short(REP_SHORT, msg.args()).expect("reply");
    })
    .unwrap();
    let s = seen.clone();
    h.reply(REP_SHORT, "rep_short", AmKind::Short, move |_msg| {
        s.short_replies.set(s.short_replies.get() + 1);
    })
    .unwrap();
    h
}

/// Polls until the credit for `peer` is back.
fn poll_for_credit(node: &mut Node<Loopback, Local>, peer: Rank) {
    let deadline = Instant::now() + LIMIT;
    while node.credits_available(peer) == 0 {
        if node.poll().expect("poll") == 0 {
            std::thread::yield_now();
        }
        assert!(Instant::now() < deadline, "no credit for {peer} came back");
    }
}

#[test]
fn eight_ranks_all_to_all_with_one_credit() {
    let outcome = within(LIMIT, || {
        let would_block = AtomicUsize::new(0);
        let delivered = AtomicUsize::new(0);
        run_ranks(Loopback::cluster(RANKS, LoopbackConfig::default()), |t| {
            let me = t.rank();
            let seen = Rc::new(Seen {
                me,
                requests: RefCell::new(vec![0; RANKS as usize]),
                replies: RefCell::new(vec![0; RANKS as usize]),
                short_requests: Cell::new(0),
                short_replies: Cell::new(0),
            });
            let mut node = Node::new(t, handlers(&seen), config(1)).expect("start");

            // Exhaust the single credit toward one peer, see WouldBlock, poll, recover.
            let peer = (me + 1) % RANKS;
            poll_for_credit(&mut node, peer);
            node.try_request_short(peer, REQ_SHORT, &[me])
                .expect("one credit is there");
            assert_eq!(node.credits_available(peer), 0);
            match node.try_request_short(peer, REQ_SHORT, &[me]) {
                Err(TryRequestError::WouldBlock) => {
                    would_block.fetch_add(1, Ordering::SeqCst);
                }
                other => panic!("rank {me}: out of credit, try_request gave {other:?}"),
            }
            poll_for_credit(&mut node, peer);
            node.try_request_short(peer, REQ_SHORT, &[me])
                .expect("the credit came back after polling");

            // All-to-all: every round sends one request to each other rank, so every send
            // after the first round waits for the previous reply from that peer.
            for seq in 0..PER_PEER {
                for k in 1..RANKS {
                    let dest = (me + k) % RANKS;
                    node.request_medium(dest, REQ_MEDIUM, &[seq], &payload(me, dest, seq))
                        .expect("request");
                }
            }
            node.wait_until(|| {
                seen.short_replies.get() == 2
                    && seen
                        .replies
                        .borrow()
                        .iter()
                        .enumerate()
                        .all(|(r, &n)| n == if r as Rank == me { 0 } else { PER_PEER })
            })
            .expect("replies");
            // Everyone has all its replies, so every request to this rank has run.
            node.barrier().expect("barrier");
            let requests = seen.requests.borrow().clone();
            let want: Vec<u32> = (0..RANKS)
                .map(|r| if r == me { 0 } else { PER_PEER })
                .collect();
            assert_eq!(requests, want, "rank {me}: requests per source");
            assert_eq!(seen.short_requests.get(), 2, "rank {me}: short requests");
            assert_eq!(seen.short_replies.get(), 2);
            // Once the barrier's own requests are answered, every credit is back.
            node.quiesce().expect("quiesce");
            for p in (0..RANKS).filter(|&p| p != me) {
                assert_eq!(node.credits_available(p), 1, "rank {me}: credit for {p}");
            }
            delivered.fetch_add(requests.iter().sum::<u32>() as usize, Ordering::SeqCst);
            node.barrier().expect("final barrier");
        });
        (would_block.into_inner(), delivered.into_inner())
    });
    let (would_block, delivered) = match outcome {
        Ok(r) => r,
        Err(p) => std::panic::resume_unwind(p),
    };
    assert_eq!(would_block, RANKS as usize, "every rank saw WouldBlock");
    assert_eq!(
        delivered,
        (RANKS * (RANKS - 1) * PER_PEER) as usize,
        "each request ran exactly once"
    );
}
