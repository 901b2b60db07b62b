//! The conformance suite every transport runs.
//!
//! Each check takes a factory that makes the transports of a job (`ranks`, segment size) whose
//! endpoints can each be driven from its own thread, runs a small job on them and panics on any
//! deviation. A transport crate instantiates the whole suite with one macro:
//!
//! ```text
//! fn cluster(ranks: u32, segment_size: usize) -> Vec<MyTransport> { ... }
//! am_core::conformance_tests!(cluster);
//! ```
//!
//! What it covers: per-pair ordering, back-pressure through `try_` requests, size limits and
//! argument errors, every AM kind at boundary sizes (0, 1, max-1, max), request floods in both
//! directions with one credit (no deadlock), requests whose handler does not reply, put/get, remote
//! atomics, barriers, teams and collectives, messages to self, many ranks all-to-all, and the
//! start-up table check. [`atomics_need_no_target_progress`] is for the transports that apply
//! atomics themselves; they call it beside the macro.

use crate::handler::Local;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::transport::readable;
use crate::{
    run_ranks, AmError, AmKind, Config, HandlerId, Handlers, Node, Rank, StartError, Transport,
    TryRequestError, WaitMode,
};

/// Segment size the suite asks for unless a check needs another.
pub const SEGMENT: usize = 1 << 20;

fn config(credits: u32) -> Config {
    Config {
        credits: Some(crate::Credits::Static(credits)),
        wait_mode: WaitMode::Block,
        ..Config::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

const REQ_SHORT: HandlerId = HandlerId(10);
const REQ_MEDIUM: HandlerId = HandlerId(11);
const REQ_LONG: HandlerId = HandlerId(12);
/// Echo the payload where it was received ([`crate::Msg::payload_ref`]): the transport copies
/// it straight from its receive buffer (Medium) or the segment (Long) into the reply.
const REQ_MEDIUM_REF: HandlerId = HandlerId(13);
const REQ_LONG_REF: HandlerId = HandlerId(14);
/// Tries a reply the replier must refuse, and keeps what it got: by its argument, a Long
/// past the end of the requester's segment (0), a Short with too many arguments (1), a Short
/// to a request handler (2) or to a Medium reply handler (3).
const REQ_LONG_OOB: HandlerId = HandlerId(15);
const REP_SHORT: HandlerId = HandlerId(20);
const REP_MEDIUM: HandlerId = HandlerId(21);
const REP_LONG: HandlerId = HandlerId(22);
const REQ_NOREPLY: HandlerId = HandlerId(30);

/// Offset where echoed Long replies land, clear of where requests land.
const REPLY_AREA: usize = SEGMENT / 2;

/// What the echo handlers saw.
#[derive(Default)]
struct Seen {
    requests: Cell<u64>,
    replies: Cell<u64>,
    noreply: Cell<u64>,
    last_args: RefCell<Vec<u32>>,
    last_payload: RefCell<Vec<u8>>,
    order: RefCell<Vec<(u32, u32)>>,
    /// What [`REQ_LONG_OOB`]'s replies returned, by its argument.
    bad_replies: RefCell<Vec<(u32, Result<(), AmError>)>>,
}

impl Seen {
    /// The first argument of every request from `src`, in arrival order.
    fn order_from(&self, src: Rank) -> Vec<u32> {
        self.order
            .borrow()
            .iter()
            .filter(|&&(s, _)| s == src)
            .map(|&(_, q)| q)
            .collect()
    }
}

/// Echo handlers: each request kind replies with the same kind, arguments and payload.
fn echo_handlers(seen: &Rc<Seen>) -> Handlers<Local> {
    let mut h = Handlers::local();
    let s = seen.clone();
    h.request(REQ_SHORT, "req_short", AmKind::Short, move |msg, token| {
        s.requests.set(s.requests.get() + 1);
        if let Some(&seq) = msg.args().first() {
            s.order.borrow_mut().push((msg.src(), seq));
        }
        token
            .reply_short(REP_SHORT, msg.args())
            .expect("reply_short");
    })
    .expect("register");
    let s = seen.clone();
    h.request(
        REQ_MEDIUM,
        "req_medium",
        AmKind::Medium,
        move |msg, token| {
            s.requests.set(s.requests.get() + 1);
            if let Some(&seq) = msg.args().first() {
                s.order.borrow_mut().push((msg.src(), seq));
            }
            token
                .reply_medium(REP_MEDIUM, msg.args(), msg.payload())
                .expect("reply_medium");
        },
    )
    .expect("register");
    let s = seen.clone();
    h.request(
        REQ_MEDIUM_REF,
        "req_medium_ref",
        AmKind::Medium,
        move |msg, token| {
            s.requests.set(s.requests.get() + 1);
            token
                .reply_medium(REP_MEDIUM, msg.args(), msg.payload_ref())
                .expect("reply_medium from the received payload");
        },
    )
    .expect("register");
    let s = seen.clone();
    h.request(
        REQ_LONG_REF,
        "req_long_ref",
        AmKind::Long,
        move |msg, token| {
            s.requests.set(s.requests.get() + 1);
            token
                .reply_long(REP_LONG, msg.args(), msg.payload_ref(), REPLY_AREA)
                .expect("reply_long from the segment");
        },
    )
    .expect("register");
    let s = seen.clone();
    h.request(
        REQ_LONG_OOB,
        "req_long_oob",
        AmKind::Short,
        move |msg, token| {
            let which = msg.args().first().copied().unwrap_or(0);
            let r = match which {
                0 => {
                    let past_the_end = msg.segment().len() - 2;
                    token.reply_long(REP_LONG, &[], &[1, 2, 3], past_the_end)
                }
                1 => token.reply_short(REP_SHORT, &[0; crate::wire::MAX_ARGS + 1]),
                2 => token.reply_short(REQ_SHORT, &[]),
                _ => token.reply_short(REP_MEDIUM, &[7]),
            };
            s.bad_replies.borrow_mut().push((which, r));
        },
    )
    .expect("register");
    let s = seen.clone();
    h.request(REQ_LONG, "req_long", AmKind::Long, move |msg, token| {
        s.requests.set(s.requests.get() + 1);
        assert_eq!(
            msg.long_offset(),
            Some(msg.args()[0] as usize),
            "Long payload at the offset the sender chose"
        );
        let payload = msg.payload().to_vec();
        token
            .reply_long(REP_LONG, msg.args(), &payload, REPLY_AREA)
            .expect("reply_long");
    })
    .expect("register");
    for (id, kind, name) in [
        (REP_SHORT, AmKind::Short, "rep_short"),
        (REP_MEDIUM, AmKind::Medium, "rep_medium"),
        (REP_LONG, AmKind::Long, "rep_long"),
    ] {
        let s = seen.clone();
        h.reply(id, name, kind, move |msg| {
            s.replies.set(s.replies.get() + 1);
            *s.last_args.borrow_mut() = msg.args().to_vec();
            *s.last_payload.borrow_mut() = msg.payload().to_vec();
        })
        .expect("register");
    }
    let s = seen.clone();
    h.request(
        REQ_NOREPLY,
        "req_noreply",
        AmKind::Short,
        move |_msg, _token| {
            s.noreply.set(s.noreply.get() + 1);
        },
    )
    .expect("register");
    h
}

/// How long a conformance case may take before its watchdog ends the process: far more than
/// any case needs natively (seconds); Miri runs are slower. `AM_TEST_WATCHDOG_SECS` overrides.
fn watchdog_limit() -> std::time::Duration {
    let secs = std::env::var("AM_TEST_WATCHDOG_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(miri) { 3600 } else { 120 });
    std::time::Duration::from_secs(secs)
}

/// [`run_ranks`] under a watchdog: a case whose ranks have not all returned within 120 s
/// (3,600 under Miri; `AM_TEST_WATCHDOG_SECS` overrides) ends the process with a message
/// naming it, so a bug that makes a rank wait for ever fails the suite instead of hanging
/// it. For a transport's own multi-rank tests beside the suite, too.
pub fn run_watched<T: Send, R: Send>(
    case: &str,
    transports: Vec<T>,
    f: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let limit = watchdog_limit();
    let case = case.to_owned();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(limit) {
            // Straight to stderr: the test harness's capture would die with the process.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "conformance: {case} did not finish in {limit:?}: a rank waits for ever"
            );
            std::process::abort();
        }
    });
    let results = run_ranks(transports, f);
    // Ends the watchdog (also on a panic, which drops `done` while unwinding).
    drop(done);
    results
}

fn start<T: Transport>(t: T, credits: u32) -> (Node<T, Local>, Rc<Seen>) {
    let seen = Rc::new(Seen::default());
    let node = Node::new(t, echo_handlers(&seen), config(credits)).expect("node start");
    (node, seen)
}

fn wait_replies<T: Transport>(node: &mut Node<T, Local>, seen: &Seen, n: u64) {
    node.wait_until(|| seen.replies.get() >= n)
        .expect("replies");
}

/// Start-up ends with every credit home; every argument count 0..=16 round-trips intact,
/// including to self.
pub fn short_all_arg_counts<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    run_watched("short_all_arg_counts", make(2, SEGMENT), |t| {
        let (mut node, seen) = start(t, 4);
        let peer = 1 - node.rank();
        assert_eq!(
            node.credits_available(peer),
            4,
            "credits home after start-up"
        );
        let mut expected = 0;
        for dest in [peer, node.rank()] {
            for n in 0..=node.max_args() {
                let args: Vec<u32> = (0..n as u32).map(|i| i * 0x0101_0101 + dest).collect();
                node.request_short(dest, REQ_SHORT, &args).expect("request");
                expected += 1;
                wait_replies(&mut node, &seen, expected);
                assert_eq!(*seen.last_args.borrow(), args);
            }
        }
        node.barrier().expect("barrier");
    });
}

/// Medium payloads of 0, 1, 9, max-1 and max bytes arrive intact both ways, to the peer and
/// to self, echoed from a private copy and straight from the receive buffer.
pub fn medium_boundary_sizes<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    run_watched("medium_boundary_sizes", make(2, SEGMENT), |t| {
        let (mut node, seen) = start(t, 4);
        let peer = 1 - node.rank();
        let max = node.max_medium();
        let mut expected = 0;
        for dest in [peer, node.rank()] {
            for handler in [REQ_MEDIUM, REQ_MEDIUM_REF] {
                for len in [0, 1, 9, max - 1, max] {
                    let data = pattern(len, node.rank() as u8 ^ handler.0);
                    node.request_medium(dest, handler, &[len as u32], &data)
                        .expect("request");
                    expected += 1;
                    wait_replies(&mut node, &seen, expected);
                    assert_eq!(*seen.last_args.borrow(), [len as u32]);
                    assert!(
                        *seen.last_payload.borrow() == data,
                        "medium of {len} bytes to {dest} by {handler:?}"
                    );
                }
            }
        }
        node.barrier().expect("barrier");
    });
}

/// Long payloads of 0, 1, max-1 and max bytes land in the target segment before its handler
/// runs, and a Long reply lands in the requester's segment, sent from a private copy or
/// straight from the target's segment.
pub fn long_boundary_sizes<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    run_watched("long_boundary_sizes", make(2, SEGMENT), |t| {
        let (mut node, seen) = start(t, 4);
        let peer = 1 - node.rank();
        let max = node.max_long().min(REPLY_AREA - 64);
        let mut expected = 0;
        for handler in [REQ_LONG, REQ_LONG_REF] {
            for len in [0, 1, max - 1, max] {
                let data = pattern(len, (7 + node.rank() as u8) ^ handler.0);
                // Odd offsets for the echo from the segment: an unaligned source.
                let offset = 8 * node.rank() as usize + (handler == REQ_LONG_REF) as usize * 3;
                node.request_long(peer, handler, &[offset as u32], &data, offset)
                    .expect("request");
                expected += 1;
                wait_replies(&mut node, &seen, expected);
                assert!(*seen.last_payload.borrow() == data, "long of {len} bytes");
                assert!(
                    node.segment().slice(REPLY_AREA, len).unwrap().to_vec() == data[..],
                    "Long reply in the requester's segment ({handler:?})"
                );
            }
        }
        node.barrier().expect("barrier");
    });
}

/// Wrong arguments are typed errors that send nothing.
pub fn size_limits_and_bad_arguments<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    run_watched("size_limits_and_bad_arguments", make(2, SEGMENT), |t| {
        let (mut node, seen) = start(t, 4);
        let peer = 1 - node.rank();
        let too_many = vec![0u32; node.max_args() + 1];
        assert!(matches!(
            node.request_short(peer, REQ_SHORT, &too_many),
            Err(AmError::TooManyArgs(17))
        ));
        let big = vec![0u8; node.max_medium() + 1];
        assert!(matches!(
            node.request_medium(peer, REQ_MEDIUM, &[], &big),
            Err(AmError::PayloadTooLarge { .. })
        ));
        let seg = node.segment().len();
        assert!(matches!(
            node.request_long(peer, REQ_LONG, &[0], &[1, 2, 3], seg - 2),
            Err(AmError::SegmentOutOfBounds { .. })
        ));
        assert!(matches!(
            node.request_long(peer, REQ_LONG, &[0], &[], usize::MAX),
            Err(AmError::SegmentOutOfBounds { .. })
        ));
        assert!(matches!(
            node.request_short(peer, HandlerId(200), &[]),
            Err(AmError::NotRegistered { .. })
        ));
        assert!(matches!(
            node.request_short(peer, REP_SHORT, &[]),
            Err(AmError::NotRegistered { .. })
        ));
        assert!(matches!(
            node.request_medium(peer, REQ_SHORT, &[], &[]),
            Err(AmError::NotRegistered { .. })
        ));
        assert!(matches!(
            node.request_short(node.size(), REQ_SHORT, &[]),
            Err(AmError::InvalidRank { .. })
        ));
        assert!(matches!(
            node.put(peer, seg - 1, &[1, 2]),
            Err(AmError::SegmentOutOfBounds { .. })
        ));
        assert!(matches!(
            node.get(peer, seg, 1),
            Err(AmError::SegmentOutOfBounds { .. })
        ));
        node.barrier().expect("barrier");
        assert_eq!(seen.requests.get(), 0, "nothing was sent");
        // A Long reply out of the requester's segment, and Short replies with too many
        // arguments or to a handler that is not a Short reply, are refused at the replier;
        // the requester gets its credit back (the implicit reply) and no error.
        for which in 0..4 {
            node.request_short(peer, REQ_LONG_OOB, &[which])
                .expect("request");
        }
        node.quiesce().expect("the credits come back");
        assert_eq!(node.credits_available(peer), 4, "every credit home");
        node.barrier().expect("barrier");
        let got = seen.bad_replies.borrow();
        assert_eq!(
            got.iter().map(|(w, _)| *w).collect::<Vec<_>>(),
            [0, 1, 2, 3]
        );
        assert!(
            matches!(got[0].1, Err(AmError::SegmentOutOfBounds { .. }))
                && matches!(got[1].1, Err(AmError::TooManyArgs(17)))
                && matches!(got[2].1, Err(AmError::NotRegistered { .. }))
                && matches!(got[3].1, Err(AmError::NotRegistered { .. })),
            "{got:?}"
        );
        drop(got);
        assert_eq!(seen.replies.get(), 0, "no reply handler ran");
        node.barrier().expect("barrier");
    });
}

/// Requests from one rank to another run in the order they were sent, whatever their kind.
pub fn per_pair_ordering<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    const N: u32 = 2000;
    run_watched("per_pair_ordering", make(2, SEGMENT), |t| {
        let (mut node, seen) = start(t, 8);
        let peer = 1 - node.rank();
        for seq in 0..N {
            if seq % 3 == 0 {
                node.request_medium(peer, REQ_MEDIUM, &[seq], &pattern(seq as usize % 300, 1))
                    .expect("request");
            } else {
                node.request_short(peer, REQ_SHORT, &[seq])
                    .expect("request");
            }
        }
        wait_replies(&mut node, &seen, N as u64);
        node.wait_until(|| seen.requests.get() == N as u64)
            .expect("requests");
        let order = seen.order.borrow();
        assert!(order.iter().all(|&(src, _)| src == peer));
        let seqs: Vec<u32> = order.iter().map(|&(_, s)| s).collect();
        assert_eq!(seqs, (0..N).collect::<Vec<_>>(), "per-pair FIFO");
        drop(order);
        node.barrier().expect("barrier");
    });
}

/// A one-way signal between rank threads that fails loudly instead of hanging if the signalling
/// rank panicked first.
#[derive(Default)]
struct Gate(AtomicUsize);

const GATE_OPEN: usize = 1;
const GATE_POISONED: usize = 2;

impl Gate {
    fn open(&self) {
        self.0.store(GATE_OPEN, Ordering::SeqCst);
    }
    fn is_open(&self) -> bool {
        match self.0.load(Ordering::SeqCst) {
            GATE_OPEN => true,
            GATE_POISONED => panic!("the other rank panicked"),
            _ => false,
        }
    }
    /// Waits without polling the node (the point is to keep a rank from receiving).
    fn wait(&self) {
        while !self.is_open() {
            std::thread::yield_now();
        }
    }
}

/// Poisons the gates when the rank holding it panics.
struct PoisonOnPanic<'a>(&'a [&'a Gate]);

impl Drop for PoisonOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for g in self.0 {
                g.0.store(GATE_POISONED, Ordering::SeqCst);
            }
        }
    }
}

/// With the target not polling, `try_` requests report `WouldBlock` once credits (or device
/// space) run out, and nothing is dropped; once the target polls, every request runs exactly
/// once and the credits come back.
pub fn back_pressure<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    const CREDITS: u32 = 3;
    let quiet = [Gate::default(), Gate::default()];
    let go = Gate::default();
    let sent = AtomicUsize::new(0);
    run_watched("back_pressure", make(2, SEGMENT), |t| {
        let (mut node, seen) = start(t, CREDITS);
        let me = node.rank() as usize;
        let _poison = PoisonOnPanic(&[&quiet[0], &quiet[1], &go]);
        // Drain start-up traffic on both sides: each rank has all its replies, and keeps
        // polling until the other has all of its own.
        node.quiesce().expect("quiesce");
        quiet[me].open();
        node.wait_until(|| quiet[1 - me].is_open()).expect("poll");
        if me == 0 {
            let mut n = 0;
            let data = pattern(100, 3);
            loop {
                match node.try_request_medium(1, REQ_MEDIUM, &[n], &data) {
                    Ok(()) => n += 1,
                    Err(TryRequestError::WouldBlock) => break,
                    Err(e) => panic!("try_request: {e}"),
                }
                assert!(n <= CREDITS, "more requests accepted than credits");
            }
            assert!(n >= 1, "the first request fits an idle device");
            sent.store(n as usize, Ordering::SeqCst);
            go.open();
            wait_replies(&mut node, &seen, n as u64);
            assert_eq!(node.credits_available(1), CREDITS);
            node.try_request_medium(1, REQ_MEDIUM, &[n], &data)
                .expect("credit is back");
            wait_replies(&mut node, &seen, n as u64 + 1);
        } else {
            go.wait();
            let n = sent.load(Ordering::SeqCst) as u64;
            node.wait_until(|| seen.requests.get() == n + 1)
                .expect("requests");
            let seqs: Vec<u32> = seen.order.borrow().iter().map(|&(_, s)| s).collect();
            assert_eq!(
                seqs,
                (0..=n as u32).collect::<Vec<_>>(),
                "each exactly once"
            );
        }
        node.barrier().expect("barrier");
    });
}

/// Both ranks flood each other with one credit each: no deadlock, nothing lost.
pub fn flood_both_ways_one_credit<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    const N: u64 = 3000;
    run_watched("flood_both_ways_one_credit", make(2, SEGMENT), |t| {
        let (mut node, seen) = start(t, 1);
        let peer = 1 - node.rank();
        let data = pattern(64, 9);
        for i in 0..N {
            if i % 2 == 0 {
                node.request_short(peer, REQ_SHORT, &[i as u32])
                    .expect("request");
            } else {
                node.request_medium(peer, REQ_MEDIUM, &[i as u32], &data)
                    .expect("request");
            }
        }
        wait_replies(&mut node, &seen, N);
        node.wait_until(|| seen.requests.get() == N)
            .expect("requests");
        node.barrier().expect("barrier");
    });
}

/// Handlers that do not reply still give the credit back (implicit empty reply).
pub fn no_reply_returns_credit<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    const N: u64 = 500;
    run_watched("no_reply_returns_credit", make(2, SEGMENT), |t| {
        let (mut node, seen) = start(t, 1);
        let peer = 1 - node.rank();
        for i in 0..N {
            node.request_short(peer, REQ_NOREPLY, &[i as u32])
                .expect("request");
        }
        node.quiesce().expect("quiesce");
        assert_eq!(node.credits_available(peer), 1);
        node.wait_until(|| seen.noreply.get() == N)
            .expect("requests");
        assert_eq!(seen.replies.get(), 0, "no reply handler ran");
        node.barrier().expect("barrier");
    });
}

/// Set by a rank once it is done, or has panicked (when the guard of [`DoneFlag::guard`] is
/// dropped), for a rank that must not poll meanwhile: it waits for the flag, not its node.
#[derive(Default)]
struct DoneFlag(std::sync::atomic::AtomicBool);

impl DoneFlag {
    fn guard(&self) -> impl Drop + '_ {
        struct Guard<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        Guard(&self.0)
    }

    fn wait(&self) {
        while !self.0.load(Ordering::Acquire) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Arming ([`Node::arm`]): a rank armed on its wake descriptor is woken by the first request
/// sent to it, and handles it once disarmed; a rank that arms with a message waiting is told
/// to poll instead; and, where the descriptor is the NIC's own (not a socket that every
/// datagram reaches, as udp's), messages to a rank that is not armed never make it readable.
/// A transport without a descriptor has nothing to check.
pub fn arming_wakes_the_rank<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    let quiet = [Gate::default(), Gate::default()];
    let armed = Gate::default();
    let second = Gate::default();
    let unarmed = Gate::default();
    run_watched("arming_wakes_the_rank", make(2, SEGMENT), |t| {
        let (mut node, seen) = start(t, 4);
        let me = node.rank() as usize;
        let _poison = PoisonOnPanic(&[&quiet[0], &quiet[1], &armed, &second, &unarmed]);
        if node.wake_fd().expect("wake fd").is_none() {
            return;
        }
        // Whether a sent message is in the target's memory when the send returns, and the
        // descriptor the NIC's own (rather than a socket or a completion queue's, which
        // messages reach in their time and whether or not its rank armed).
        let nic_owned = !matches!(node.transport().info().name, "udp" | "ofi");
        // Start-up traffic drained on both sides, so that nothing else wakes rank 1.
        node.quiesce().expect("quiesce");
        quiet[me].open();
        node.wait_until(|| quiet[1 - me].is_open()).expect("poll");
        if me == 0 {
            armed.wait();
            node.request_short(1, REQ_SHORT, &[7]).expect("request");
            wait_replies(&mut node, &seen, 1);
            node.request_short(1, REQ_SHORT, &[8]).expect("request");
            second.open();
            wait_replies(&mut node, &seen, 2);
            for i in 0..8 {
                node.request_short(1, REQ_SHORT, &[9 + i]).expect("request");
            }
            wait_replies(&mut node, &seen, 10);
            unarmed.open();
        } else {
            while node.arm().expect("arm") == crate::Armed::Ready {
                node.poll().expect("poll");
            }
            armed.open();
            let fd = node.wake_fd().expect("wake fd").expect("still there");
            assert!(
                readable(fd, watchdog_limit()).expect("poll"),
                "the request woke the armed rank"
            );
            node.disarm();
            node.wait_until(|| seen.requests.get() == 1)
                .expect("requests");
            // The second request waits unread: arming says so.
            second.wait();
            let arming = node.arm().expect("arm");
            assert!(!nic_owned || arming == crate::Armed::Ready, "{arming:?}");
            node.disarm();
            node.wait_until(|| seen.requests.get() == 2)
                .expect("requests");
            // Not armed: these sleep on the futex, and the descriptor stays quiet.
            node.wait_until(|| seen.requests.get() == 10 && unarmed.is_open())
                .expect("requests");
            let fd = node.wake_fd().expect("wake fd").expect("still there");
            assert!(
                !nic_owned || !readable(fd, std::time::Duration::ZERO).expect("poll"),
                "messages to a rank not armed woke its descriptor"
            );
            let order: Vec<u32> = seen.order_from(0);
            assert_eq!(order, (7..17).collect::<Vec<_>>(), "each exactly once");
        }
        node.barrier().expect("barrier");
    });
}

/// Put and get, blocking and not, to peers and to self, across chunk boundaries.
pub fn put_get<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    run_watched("put_get", make(3, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        let me = node.rank();
        let n = node.size();
        let len = (node.max_medium() + node.max_long()).min(SEGMENT / 8) + 3;
        // Each rank writes its block into every rank's segment (self included).
        for dest in 0..n {
            let data = pattern(len, me as u8);
            node.put(dest, me as usize * len, &data).expect("put");
        }
        let handles: Vec<_> = (0..n)
            .map(|dest| {
                node.put_nb(dest, (n + me) as usize * len, &pattern(len, 100 + me as u8))
                    .expect("put_nb")
            })
            .collect();
        for h in handles {
            node.wait(h).expect("wait for a put");
        }
        node.barrier().expect("barrier");
        for src in 0..n {
            for writer in 0..n {
                let got = node.get(src, writer as usize * len, len).expect("get");
                assert!(got == pattern(len, writer as u8), "get {src}/{writer}");
            }
            let h = node
                .get_nb(src, (n + me) as usize * len, len)
                .expect("get_nb");
            assert!(node.wait(h).expect("wait for a get") == pattern(len, 100 + me as u8));
        }
        assert!(node.get(me, 0, 0).expect("empty get").is_empty());
        // Gets into the caller's buffers, one per rank, all in flight at once.
        let mut bufs = vec![vec![0u8; len]; n as usize];
        let handles: Vec<_> = bufs
            .iter_mut()
            .enumerate()
            .map(|(src, buf)| {
                node.get_into_nb(src as Rank, me as usize * len, buf)
                    .expect("get_into_nb")
            })
            .collect();
        for h in handles {
            node.wait(h).expect("wait for a get into a buffer");
        }
        for buf in &bufs {
            assert!(*buf == pattern(len, me as u8), "get_into_nb");
        }
        node.barrier().expect("barrier");
    });
}

/// Puts from this rank's segment and gets into it (`put_from_segment`,
/// `get_into_segment`, blocking and `_nb`), to a peer and to self, from 0 bytes to several
/// Long chunks, unaligned and at both ends of the segment, overlapping ranges on self;
/// ranges past either segment's end are errors at the initiator that write nothing.
/// Catches a transport's segment-to-segment copy that reads or writes the wrong range,
/// and a bounce path (over messages) that loses or misplaces a chunk.
pub fn segment_to_segment<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    run_watched("segment_to_segment", make(2, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        let me = node.rank();
        if me == 0 {
            let big = 3 * node.max_medium() + 5;
            let cases = [
                (0, 0, 0),
                (5, 9, 1),
                (3, 100, 13),
                (64, 4096, 4099),
                (SEGMENT - 77, 77, 77),
                (1000, SEGMENT - big, big),
                (SEGMENT, SEGMENT, 0),
            ];
            for dest in [1, 0] {
                for (k, &(offset, local, len)) in cases.iter().enumerate() {
                    let data = pattern(len, 11 * k as u8 + dest as u8);
                    node.segment().write(local, &data).expect("write");
                    if k % 2 == 0 {
                        node.put_from_segment(dest, offset, local, len)
                            .expect("put");
                    } else {
                        let h = node
                            .put_from_segment_nb(dest, offset, local, len)
                            .expect("put");
                        node.wait(h).expect("wait for a put");
                    }
                    assert!(
                        node.get(dest, offset, len).expect("get") == data,
                        "{len} at {offset}"
                    );
                    // Back into a place here that no case's ranges reach.
                    let back = SEGMENT / 2 - 100_000;
                    node.segment().fill(back, len, 0x99).expect("fill");
                    if k % 2 == 0 {
                        node.get_into_segment(dest, offset, back, len).expect("get");
                    } else {
                        let h = node
                            .get_into_segment_nb(dest, offset, back, len)
                            .expect("get");
                        node.wait(h).expect("wait for a get");
                    }
                    let mut got = vec![0u8; len];
                    node.segment().read(back, &mut got).expect("read");
                    assert!(got == data, "{len} bytes back from {offset} of rank {dest}");
                }
                let before = node.get(dest, 0, 16).expect("get");
                for (offset, local, len) in
                    [(SEGMENT - 3, 0, 4), (0, SEGMENT - 3, 4), (0, usize::MAX, 1)]
                {
                    match node.put_from_segment(dest, offset, local, len) {
                        Err(AmError::SegmentOutOfBounds { .. }) => {}
                        other => panic!("a put of {len} from {local} to {offset}: {other:?}"),
                    }
                    match node.get_into_segment(dest, local, offset, len) {
                        Err(AmError::SegmentOutOfBounds { .. }) => {}
                        other => panic!("a get of {len} from {local} to {offset}: {other:?}"),
                    }
                }
                assert_eq!(node.get(dest, 0, 16).expect("get"), before);
            }
            // Overlapping ranges of one segment move as by `memmove`.
            let data = pattern(1000, 0x42);
            node.segment().write(0, &data).expect("write");
            node.put_from_segment(0, 100, 0, 1000).expect("put");
            assert!(
                node.get(0, 100, 1000).expect("get") == data,
                "an overlapping copy"
            );
        }
        node.barrier().expect("barrier");
    });
}

/// Segments created and published as the job runs ([`crate::segment`]): three ranks create
/// segments of different lengths and publish them on the world team; each puts (empty,
/// unaligned, several Mediums long, blocking and `_nb`) into the next rank's, reads it back,
/// adds to words of rank 0's, and reaches its own through its [`crate::RemoteSegment`];
/// segment 0 published gives the same bytes as [`Node::put`]. Ranges past a segment's
/// published length are errors that write nothing; after the collective free, the freed
/// segments are unknown to every member and to their owner's [`Node::segment_at`].
/// Catches a put landing in segment 0 instead of the created segment, a multi-Medium put or
/// get resumed at the wrong byte, lengths or ids swapped between members by the
/// publication, and a free that leaves a segment reachable.
pub fn segments_as_values<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    use crate::atomic::AtomicOp;
    use crate::segment::SegmentId;
    const RANKS: u32 = 3;
    run_watched("segments_as_values", make(RANKS, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        let me = node.rank();
        let world = node.world_team();
        let mm = node.max_medium().min(16 << 10);
        let len_of = |r: u32| 3 * mm + 1000 * (r as usize + 1) + 5;
        let mine = node.create_segment(len_of(me)).expect("create");
        assert_ne!(mine, SegmentId::ZERO);
        let seg = node.segment_at(mine).expect("its bytes");
        assert_eq!(seg.len(), len_of(me));
        assert!(seg.load_u64(0).expect("load") == 0, "a new segment is zero");
        let peers = node.publish_segment(&world, mine).expect("publish");
        assert_eq!(peers.len(), RANKS as usize);
        for (r, p) in peers.iter().enumerate() {
            assert_eq!((p.rank(), p.len()), (r as u32, len_of(r as u32)), "{p:?}");
        }
        assert_eq!(peers[me as usize].id(), mine);
        let next = peers[((me + 1) % RANKS) as usize];
        let prev = (me + RANKS - 1) % RANKS;
        let big = pattern(2 * mm + 7, me as u8 + 1);
        node.put_to(&next, 3, &big).expect("put");
        let h = node.put_to_nb(&next, next.len() - 5, &[9; 5]).expect("put");
        node.wait(h).expect("wait for a put");
        node.put_to(&next, 0, &[]).expect("an empty put");
        for (offset, len) in [(next.len() - 4, 5), (next.len() + 1, 0), (usize::MAX, 1)] {
            match node.put_to(&next, offset, &vec![0xee; len]) {
                Err(AmError::SegmentOutOfBounds { size, .. }) if size == next.len() => {}
                other => panic!("a put of {len} at {offset}: {other:?}"),
            }
            match node.get_from(&next, offset, len) {
                Err(AmError::SegmentOutOfBounds { size, .. }) if size == next.len() => {}
                other => panic!("a get of {len} at {offset}: {other:?}"),
            }
        }
        // Every rank adds to two words of rank 0's segment, past every put's bytes.
        let word = (3 + big.len() + 7) & !7;
        let zero = peers[0];
        node.atomic_at(&zero, word, AtomicOp::FetchAdd(1u64))
            .expect("fetch-add");
        let h = node
            .atomic_at_nb(&zero, word + 8, AtomicOp::FetchAdd(0.5f64))
            .expect("fetch-add");
        node.wait(h).expect("wait for a fetch-add");
        match node.atomic_at(&zero, zero.len() - 4, AtomicOp::FetchAdd(1u64)) {
            Err(AmError::SegmentOutOfBounds { .. }) => {}
            other => panic!("an atomic past the end: {other:?}"),
        }
        // Its own segment, through the remote key.
        let own = peers[me as usize];
        node.put_to(&own, 2 * mm + 100, b"self")
            .expect("put to self");
        assert_eq!(node.get_from(&own, 2 * mm + 100, 4).expect("get"), b"self");
        node.team_barrier(&world).expect("barrier");

        let seg = node.segment_at(mine).expect("its bytes");
        let mut got = vec![0u8; big.len()];
        seg.read(3, &mut got).expect("read");
        assert!(
            got == pattern(big.len(), prev as u8 + 1),
            "rank {prev}'s put"
        );
        seg.read(len_of(me) - 5, &mut got[..5]).expect("read");
        assert_eq!(&got[..5], &[9; 5]);
        assert!(
            node.segment().load_u64(word).expect("load") == 0,
            "segment 0 untouched"
        );
        assert!(node.get_from(&next, 3, big.len()).expect("get") == big);
        let h = node.get_from_nb(&next, 0, 3).expect("get");
        assert_eq!(node.wait(h).expect("wait for a get"), [0, 0, 0]);
        let mut into = vec![0x55u8; big.len() + 2];
        node.get_from_into(&next, 3, &mut into[1..big.len() + 1])
            .expect("get into");
        assert!(
            into[1..big.len() + 1] == big[..] && into[0] == 0x55 && into[big.len() + 1] == 0x55
        );
        let mut tail = [0u8; 5];
        let h = node
            .get_from_into_nb(&next, next.len() - 5, &mut tail)
            .expect("get into");
        assert_eq!(node.wait(h).expect("wait for a get"), &[9; 5]);
        match node.get_from_into(&next, next.len() - 4, &mut tail) {
            Err(AmError::SegmentOutOfBounds { .. }) => assert_eq!(tail, [9; 5], "left as it was"),
            other => panic!("a get into past the end: {other:?}"),
        }
        if me == 0 {
            let seg = node.segment_at(mine).expect("its bytes");
            assert_eq!(seg.load_u64(word).expect("load"), u64::from(RANKS));
            let halves = f64::from_bits(seg.load_u64(word + 8).expect("load"));
            assert_eq!(halves, 0.5 * f64::from(RANKS));
        }
        // Segment 0 published is segment 0.
        let zeros = node
            .publish_segment(&world, SegmentId::ZERO)
            .expect("publish segment 0");
        let right = zeros[((me + 1) % RANKS) as usize];
        assert_eq!((right.id(), right.len()), (SegmentId::ZERO, SEGMENT));
        node.put_to(&right, 40, &[me as u8 + 7; 8]).expect("put");
        assert_eq!(
            node.get(right.rank(), 40, 8).expect("get"),
            [me as u8 + 7; 8]
        );
        node.team_barrier(&world).expect("barrier");

        node.free_segment(&world, mine).expect("free");
        assert!(
            node.segment_at(mine).is_none(),
            "a freed segment's bytes are gone"
        );
        for p in [next, own] {
            match node.put_to(&p, 0, b"x") {
                Err(AmError::UnknownSegment { rank, id }) if (rank, id) == (p.rank(), p.id()) => {}
                other => panic!("a put to freed {p:?}: {other:?}"),
            }
            match node.get_from(&p, 0, 1) {
                Err(AmError::UnknownSegment { .. }) => {}
                other => panic!("a get from freed {p:?}: {other:?}"),
            }
        }
        // Freeing it again fails on every member, naming the first that does not hold
        // what it named; segment 0 is freed as nothing.
        match node.free_segment(&world, mine) {
            Err(AmError::UnknownSegment { rank: 0, id }) if id == mine || me != 0 => {}
            other => panic!("freeing {mine} again: {other:?}"),
        }
        node.free_segment(&world, SegmentId::ZERO)
            .expect("segment 0, freed as nothing");
        assert!(node.get(right.rank(), 40, 8).is_ok(), "segment 0 stays");
        // One member publishing a segment it no longer holds fails the publication on
        // every member, rather than leaving them waiting for it.
        let id = if me == 1 { mine } else { SegmentId::ZERO };
        match node.publish_segment(&world, id) {
            Err(AmError::UnknownSegment { rank: 1, .. }) => {}
            other => panic!("a publication with rank 1's freed segment: {other:?}"),
        }
        // A segment freed on a team without the peer (its owner alone) is refused by its
        // owner: the peer's operations fail naming it, and write nothing.
        let again = node.create_segment(64).expect("create");
        assert!(again != mine, "ids are not reused");
        let peers = node.publish_segment(&world, again).expect("publish");
        let alone = node
            .split(&world, Some(me), 0)
            .expect("split")
            .expect("a team of one");
        node.free_segment(&alone, again).expect("free alone");
        node.team_barrier(&world).expect("barrier");
        let next = peers[((me + 1) % RANKS) as usize];
        let refused = |r: Result<_, AmError>| match r {
            Err(AmError::UnknownSegment { rank, id }) if (rank, id) == (next.rank(), next.id()) => {
            }
            other => panic!("an operation on {next:?} freed by its owner: {other:?}"),
        };
        refused(node.put_to(&next, 0, &[1; 8]).map(|_| ()));
        refused(node.get_from(&next, 0, 8).map(|_| ()));
        refused(
            node.atomic_at(&next, 0, AtomicOp::FetchAdd(1u32))
                .map(|_| ()),
        );
        // Nothing to move is done on every path alike, even there.
        node.put_to(&next, 0, &[]).expect("an empty put");
        // A publication on one member against an all-gather of as many bytes on the others
        // is a mismatch, not bytes taken for segments.
        let copy = node
            .split(&world, Some(0), 0)
            .expect("split")
            .expect("a copy of the world");
        let r = if me == 0 {
            node.publish_segment(&copy, SegmentId::ZERO).map(drop)
        } else {
            node.team_all_gather(&copy, &[0xab; 64]).map(drop)
        };
        match r {
            Err(AmError::CollectiveMismatch { .. }) => {}
            other => panic!("a publication against an all-gather: {other:?}"),
        }
        node.barrier().expect("barrier");
    });
}

/// Puts and gets between segments named by id and offset (`put_to_from_segment`,
/// `get_from_into_segment`, blocking and `_nb`): from and into a created segment and segment
/// 0 here, to and from a peer's created segment, its segment 0, and this rank's own, from 0
/// bytes to several Mediums, unaligned and at the segments' ends; an unknown local segment,
/// and ranges past either side's length, are errors at the initiator that write nothing.
/// Catches a copy that reads the wrong local segment (segment 0 for a created one), a
/// range misplaced on either side, a bounce path that loses a chunk, and a check made
/// against the wrong segment's length.
pub fn segments_by_id_and_offset<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    use crate::segment::SegmentId;
    const RANKS: u32 = 3;
    run_watched("segments_by_id_and_offset", make(RANKS, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        let me = node.rank();
        let world = node.world_team();
        let mm = node.max_medium().min(16 << 10);
        let len = 12 * mm + 96;
        let third = len / 3;
        let mine = node.create_segment(len).expect("create");
        let peers = node.publish_segment(&world, mine).expect("publish");
        let zeros = node
            .publish_segment(&world, SegmentId::ZERO)
            .expect("publish segment 0");
        let next = ((me + 1) % RANKS) as usize;
        let big = 3 * mm + 5;
        // (offset in the target, offset in the local range, length), each in a third of
        // `len` bytes: a peer's segments get the first third from this rank (their own
        // puts write the second), and the local ranges are in the last.
        let cases = [
            (0, 0, 0),
            (5, 9, 1),
            (3, 100, 13),
            (64, 1, big),
            (third - 77, third - 77, 77),
        ];
        let targets = [
            peers[next],
            zeros[next],
            peers[me as usize],
            zeros[me as usize],
        ];
        let mut k = 0u8;
        for target in targets {
            for local in [mine, SegmentId::ZERO] {
                for &(offset, at, n) in &cases {
                    k = k.wrapping_add(1);
                    let at = 2 * third + at;
                    let offset = offset + if target.rank() == me { third } else { 0 };
                    let data = pattern(n, k.wrapping_mul(3) ^ (me as u8) << 6);
                    node.segment_at(local)
                        .expect("local bytes")
                        .write(at, &data)
                        .expect("write");
                    if k.is_multiple_of(2) {
                        node.put_to_from_segment(&target, offset, local, at, n)
                            .expect("put");
                    } else {
                        let h = node
                            .put_to_from_segment_nb(&target, offset, local, at, n)
                            .expect("put");
                        node.wait(h).expect("wait for a put");
                    }
                    let what = format!("{n} bytes from {local:?}@{at} to {target:?}@{offset}");
                    assert!(
                        node.get_from(&target, offset, n).expect("get") == data,
                        "{what}"
                    );
                    node.segment_at(local)
                        .expect("local bytes")
                        .fill(at, n, 0x99)
                        .expect("fill");
                    if k.is_multiple_of(3) {
                        let h = node
                            .get_from_into_segment_nb(&target, offset, local, at, n)
                            .expect("get");
                        node.wait(h).expect("wait for a get");
                    } else {
                        node.get_from_into_segment(&target, offset, local, at, n)
                            .expect("get");
                    }
                    let mut got = vec![0u8; n];
                    node.segment_at(local)
                        .expect("local bytes")
                        .read(at, &mut got)
                        .expect("read");
                    assert!(got == data, "back: {what}");
                }
            }
        }
        // Every member is done writing (into its own segment too) before the bytes that
        // the refused operations must leave as they were are read.
        node.team_barrier(&world).expect("barrier");
        // Refused before anything is sent, on every kind of target: the bytes at both ends
        // of each stay as they were.
        let unknown = SegmentId::new(u32::MAX - 1);
        let ends = |node: &mut Node<T, Local>, target: &crate::RemoteSegment| {
            let at = target.len() - 16;
            [
                node.get_from(target, 0, 16).expect("get"),
                node.get_from(target, at, 16).expect("get"),
            ]
        };
        for target in [
            peers[next],
            zeros[next],
            peers[me as usize],
            zeros[me as usize],
        ] {
            let before = ends(&mut node, &target);
            for (offset, local, at, n, size) in [
                (0, mine, len - 3, 4, len),
                (0, mine, usize::MAX, 1, len),
                (target.len() - 3, mine, 0, 4, target.len()),
                (0, SegmentId::ZERO, SEGMENT - 3, 4, SEGMENT),
            ] {
                match node.put_to_from_segment(&target, offset, local, at, n) {
                    Err(AmError::SegmentOutOfBounds { size: s, .. }) if s == size => {}
                    other => panic!("a put of {n} from {local:?}@{at} to {offset}: {other:?}"),
                }
                match node.get_from_into_segment(&target, offset, local, at, n) {
                    Err(AmError::SegmentOutOfBounds { size: s, .. }) if s == size => {}
                    other => panic!("a get of {n} from {offset} to {local:?}@{at}: {other:?}"),
                }
            }
            match node.put_to_from_segment(&target, 0, unknown, 0, 1) {
                Err(AmError::UnknownSegment { rank, id }) if (rank, id) == (me, unknown) => {}
                other => panic!("a put from an unknown segment: {other:?}"),
            }
            match node.get_from_into_segment(&target, 0, unknown, 0, 1) {
                Err(AmError::UnknownSegment { rank, id }) if (rank, id) == (me, unknown) => {}
                other => panic!("a get into an unknown segment: {other:?}"),
            }
            assert_eq!(ends(&mut node, &target), before, "{target:?}");
        }
        node.team_barrier(&world).expect("barrier");
        node.free_segment(&world, mine).expect("free");
        match node.put_to_from_segment(&zeros[next], 0, mine, 0, 1) {
            Err(AmError::UnknownSegment { rank, id }) if (rank, id) == (me, mine) => {}
            other => panic!("a put from a freed segment: {other:?}"),
        }
        node.barrier().expect("barrier");
    });
}

/// Long requests into published segments (`request_long_to`): the payload is in the named
/// segment, whole, when the handler runs there (and only then the handler runs), the handler
/// is told which segment; to a peer, to itself and to segment 0, blocking and as a handle, with
/// payloads of several Mediums; checked ranges, handlers and freed segments fail at the
/// initiator with nothing sent.
pub fn long_into_created_segments<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    use crate::segment::SegmentId;
    const RANKS: u32 = 3;
    const LONG_TO: HandlerId = HandlerId(40);
    const SHORT: HandlerId = HandlerId(41);
    // (source, segment, offset, whether the payload was whole when the handler ran).
    type Ran = Rc<RefCell<Vec<(Rank, Option<SegmentId>, Option<usize>, bool)>>>;
    run_watched("long_into_created_segments", make(RANKS, SEGMENT), |t| {
        let ran: Ran = Rc::default();
        let mut h = Handlers::local();
        let r = ran.clone();
        h.request(LONG_TO, "long_to", AmKind::Long, move |msg, _token| {
            // The payload is `pattern(len, seed)`, its length and seed in the arguments.
            let (len, seed) = (msg.args()[0] as usize, msg.args()[1] as u8);
            let whole = msg.payload() == pattern(len, seed).as_slice();
            r.borrow_mut()
                .push((msg.src(), msg.long_segment(), msg.long_offset(), whole));
        })
        .expect("register");
        h.request(SHORT, "short", AmKind::Short, |_msg, _token| {})
            .expect("register");
        let mut node = Node::new(t, h, config(4)).expect("node start");
        let me = node.rank();
        let world = node.world_team();
        let mm = node.max_medium().min(16 << 10);
        let mine = node.create_segment(4 * mm + 64).expect("create");
        let peers = node.publish_segment(&world, mine).expect("publish");
        let zeros = node
            .publish_segment(&world, SegmentId::ZERO)
            .expect("publish segment 0");
        let next = peers[((me + 1) % RANKS) as usize];
        let own = peers[me as usize];
        let big = pattern(2 * mm + 7, me as u8 + 1);
        let args = |data: &[u8], seed: u8| [data.len() as u32, u32::from(seed)];
        node.request_long_to(&next, 5, LONG_TO, &args(&big, me as u8 + 1), &big)
            .expect("a Long into the next rank's segment");
        let small = pattern(100, me as u8 + 50);
        let h = node
            .request_long_to_nb(
                &next,
                next.len() - 100,
                LONG_TO,
                &args(&small, me as u8 + 50),
                &small,
            )
            .expect("a Long as a handle");
        node.wait(h).expect("wait for it");
        node.request_long_to(
            &own,
            2 * mm + 200,
            LONG_TO,
            &args(&small, me as u8 + 50),
            &small,
        )
        .expect("a Long into its own segment");
        let right = zeros[((me + 1) % RANKS) as usize];
        node.request_long_to(&right, 64, LONG_TO, &args(&small, me as u8 + 50), &small)
            .expect("a Long into segment 0");
        node.request_long_to(&next, 0, LONG_TO, &args(&[], 0), &[])
            .expect("an empty Long");

        // Checked at the initiator, nothing sent.
        match node.request_long_to(&next, next.len() - 99, LONG_TO, &args(&small, 1), &small) {
            Err(AmError::SegmentOutOfBounds { size, .. }) if size == next.len() => {}
            other => panic!("a Long past the segment's end: {other:?}"),
        }
        match node.request_long_to(&next, 0, SHORT, &[], &small) {
            Err(AmError::NotRegistered { handler, .. }) if handler == SHORT => {}
            other => panic!("a Long to a Short handler: {other:?}"),
        }
        let prev = (me + RANKS - 1) % RANKS;
        let expected = 5;
        node.wait_until(|| ran.borrow().len() >= expected)
            .expect("every Long ran");
        let mut got = ran.borrow().clone();
        got.sort_by_key(|&(src, seg, off, _)| (src, seg, off));
        let mut want = vec![
            (prev, Some(mine), Some(0), true),
            (prev, Some(mine), Some(5), true),
            (prev, Some(mine), Some(own.len() - 100), true),
            (prev, Some(SegmentId::ZERO), Some(64), true),
            (me, Some(mine), Some(2 * mm + 200), true),
        ];
        want.sort_by_key(|&(src, seg, off, _)| (src, seg, off));
        assert_eq!(got, want, "the Longs that ran here");
        let seg = node.segment_at(mine).expect("its bytes");
        let mut landed = vec![0u8; 2 * mm + 7];
        seg.read(5, &mut landed).expect("read");
        assert!(
            landed == pattern(2 * mm + 7, prev as u8 + 1),
            "rank {prev}'s payload stays"
        );
        node.team_barrier(&world).expect("barrier");

        node.free_segment(&world, mine).expect("free");
        match node.request_long_to(&next, 0, LONG_TO, &args(&small, 1), &small) {
            Err(AmError::UnknownSegment { rank, id }) if (rank, id) == (next.rank(), next.id()) => {
            }
            other => panic!("a Long into a freed segment: {other:?}"),
        }
        node.barrier().expect("barrier");
        assert_eq!(ran.borrow().len(), expected, "nothing more ran");
    });
}

/// Put and get of 0 and 1 bytes, unaligned, and at both ends of the segment, to a peer and
/// to self, checked with `get_into`, `get` and `get_nb`; a range past the end is an error at
/// the initiator and writes nothing (nor fills the caller's buffer).
pub fn rma_sizes_and_edges<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    run_watched("rma_sizes_and_edges", make(2, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        let me = node.rank();
        if me == 0 {
            let cases = [
                (0, 0),
                (5, 1),
                (3, 13),
                (8, 64),
                (1, 4099),
                (SEGMENT - 1, 1),
                (SEGMENT - 77, 77),
                (SEGMENT, 0),
            ];
            for dest in [1, 0] {
                for (k, &(offset, len)) in cases.iter().enumerate() {
                    let data = pattern(len, 7 * k as u8 + dest as u8);
                    node.put(dest, offset, &data).expect("put");
                    let mut back = vec![0u8; len];
                    node.get_into(dest, offset, &mut back).expect("get_into");
                    assert!(back == data, "{len} bytes at {offset} of rank {dest}");
                    assert!(node.get(dest, offset, len).expect("get") == data);
                    let h = node.put_nb(dest, offset, &data).expect("put_nb");
                    node.wait(h).expect("wait for a put");
                    let h = node.get_nb(dest, offset, len).expect("get_nb");
                    assert!(node.wait(h).expect("wait for a get") == data);
                }
                let before = node.get(dest, SEGMENT - 3, 3).expect("get");
                for (offset, len) in [(SEGMENT - 3, 4), (SEGMENT + 1, 0), (usize::MAX, 1)] {
                    match node.put(dest, offset, &vec![0xff; len]) {
                        Err(AmError::SegmentOutOfBounds { .. }) => {}
                        other => panic!("a put of {len} at {offset} of rank {dest}: {other:?}"),
                    }
                    let mut buf = vec![0x99; len];
                    match node.get_into(dest, offset, &mut buf) {
                        Err(AmError::SegmentOutOfBounds { .. }) => {}
                        other => panic!("a get of {len} at {offset} of rank {dest}: {other:?}"),
                    }
                    assert!(buf.iter().all(|&b| b == 0x99), "a refused get wrote");
                }
                assert_eq!(node.get(dest, SEGMENT - 3, 3).expect("get"), before);
                // Checked before anything is allocated for the bytes.
                for (offset, len) in [(0, usize::MAX), (SEGMENT - 3, 4), (1, SEGMENT)] {
                    match node.get(dest, offset, len) {
                        Err(AmError::SegmentOutOfBounds { .. }) => {}
                        other => panic!("a get of {len} at {offset} of rank {dest}: {other:?}"),
                    }
                    match node.get_nb(dest, offset, len) {
                        Err(AmError::SegmentOutOfBounds { .. }) => {}
                        other => panic!("a get_nb of {len} at {offset} of {dest}: {other:?}"),
                    }
                }
            }
        }
        node.barrier().expect("barrier");
        // What rank 0 put last at the end of our segment is there for us too.
        let mut end = vec![0u8; 77];
        node.segment().read(SEGMENT - 77, &mut end).expect("read");
        assert!(
            end == pattern(77, 7 * 6 + me as u8),
            "rank {me}: the last put"
        );
        node.barrier().expect("barrier");
    });
}

/// For transports that put and get themselves ([`Rma::Put`](crate::transport::Rma::Put),
/// [`Rma::Get`](crate::transport::Rma::Get); the shared-memory NICs and loopback): rank 1 never
/// polls while rank 0 puts into its segment and gets from it, blocking and not, and each put is
/// remotely complete at its first test.
pub fn rma_needs_no_target_progress<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    const HALF: usize = SEGMENT / 2;
    let done = DoneFlag::default();
    run_watched("rma_needs_no_target_progress", make(2, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        if node.rank() == 1 {
            node.segment()
                .write(HALF, &pattern(HALF, 9))
                .expect("write");
        }
        node.barrier().expect("barrier");
        if node.rank() == 1 {
            // Not a poll until rank 0 is done (or gave up).
            done.wait();
            let mut got = vec![0u8; HALF];
            node.segment().read(0, &mut got).expect("read");
            assert!(got == pattern(HALF, 3), "rank 0's puts");
        } else {
            let _done = done.guard();
            // Non-blocking first: a transport that did not do them itself fails here at once
            // instead of waiting on a rank that does not poll.
            let h = node.put_nb(1, 0, &pattern(HALF, 2)).expect("put_nb");
            assert_eq!(
                node.test(&h),
                Ok(true),
                "the transport did not put by itself"
            );
            node.wait(h).expect("wait for a put");
            let h = node.get_nb(1, HALF + 5, 1000).expect("get_nb");
            assert_eq!(
                node.test(&h),
                Ok(true),
                "the transport did not get by itself"
            );
            assert!(node.wait(h).expect("wait for a get")[..] == pattern(HALF, 9)[5..1005]);
            let mut buf = [0u8; 100];
            let h = node
                .get_into_nb(1, HALF + 7, &mut buf)
                .expect("get_into_nb");
            assert_eq!(node.test(&h), Ok(true), "get_into_nb by itself");
            node.wait(h).expect("wait for a get into a buffer");
            assert!(buf[..] == pattern(HALF, 9)[7..107]);
            node.put(1, 0, &pattern(HALF, 3)).expect("put");
            let mut got = vec![0u8; HALF];
            node.get_into(1, HALF, &mut got).expect("get_into");
            assert!(got == pattern(HALF, 9), "get_into");
        }
        node.barrier().expect("barrier");
    });
}

/// For transports that put, get and apply atomics themselves: once a rank has left the job
/// (its transport closed), the NIC refuses all three toward it with `PeerDeparted`, before
/// any poll of the core has heard of the departure.
pub fn rma_to_a_departed_rank_is_refused<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    use crate::transport::SendError;
    let left = std::sync::Barrier::new(2);
    run_watched(
        "rma_to_a_departed_rank_is_refused",
        make(2, SEGMENT),
        |mut t| {
            if t.rank() == 1 {
                // Gone for good: closed, and dropped (loopback departs when dropped).
                t.close();
                drop(t);
                left.wait();
                return;
            }
            left.wait();
            use crate::transport::RmaRequests;
            let gone = |r: Result<(), SendError>| matches!(r, Err(SendError::PeerDeparted(1)));
            assert!(gone(t.put(1, 0, &[1])), "put");
            assert!(gone(t.get(1, 0, &mut [0])), "get");
            let add = crate::atomic::Atomic::from(crate::AtomicOp::FetchAdd(1u64));
            let r = t.atomic(1, 0, add);
            assert!(
                matches!(r, Err(SendError::PeerDeparted(1))),
                "atomic: {r:?}"
            );
            let posted = [crate::atomic::Posted {
                dest: 1,
                offset: 0,
                atomic: add,
            }];
            let mut batch = crate::atomic::Batch::default();
            t.rma(crate::transport::Rma::Atomics {
                batch: &posted,
                outcome: &mut batch,
            })
            .expect("a batch reports its refusals in its outcome");
            assert!(
                batch.done == 1 && matches!(batch.error, Some(SendError::PeerDeparted(1))),
                "atomics: {batch:?}"
            );
            // This rank's own segment is still its own.
            assert_eq!(t.put(0, 0, &[1]), Ok(()));
        },
    );
}

/// No rank leaves barrier k before every rank has entered it.
pub fn barriers<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    const RANKS: u32 = 5;
    const ROUNDS: usize = 50;
    let entered = AtomicUsize::new(0);
    run_watched("barriers", make(RANKS, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 2);
        for k in 0..ROUNDS {
            entered.fetch_add(1, Ordering::SeqCst);
            node.barrier().expect("barrier");
            assert!(
                entered.load(Ordering::SeqCst) >= (k + 1) * RANKS as usize,
                "left barrier {k} early"
            );
        }
    });
}

/// Teams and collectives over the transport: 5 ranks split by parity (3 and 2), then on the
/// world and on each half, with 2 credits so that steps wait for credits: barriers,
/// broadcasts of `max_medium` bytes from every root, reductions to every root and to all
/// of a vector of `max_medium / 8` `u64`s, gathers, all-gathers, and several of them in
/// flight at once on both teams, completed in reverse; every outcome checked. Catches a
/// transport whose system Mediums at the size limit, or whose ordering between a pair,
/// the collective engine relies on differently from loopback.
pub fn team_collectives<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    use crate::reduce::ReduceOp;
    const RANKS: u32 = 5;
    const ROUNDS: u32 = 4;
    run_watched("team_collectives", make(RANKS, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 2);
        let me = node.rank();
        let world = node.world_team();
        let half = node
            .split(&world, Some(me % 2), 0)
            .expect("split")
            .expect("a team");
        let max = node.max_medium();
        let words = max / 8;
        for team in [&world, &half] {
            let n = team.size();
            let members = team.members().to_vec();
            for round in 0..ROUNDS {
                node.team_barrier(team).expect("barrier");
                let root = round % n;
                let bytes = pattern(max, root as u8 ^ round as u8);
                let data = if team.rank() == root {
                    &bytes[..]
                } else {
                    &[][..]
                };
                assert_eq!(
                    node.team_broadcast(team, root, data).expect("broadcast"),
                    bytes
                );
                let v: Vec<u64> = (0..words as u64).map(|i| i * u64::from(me + 1)).collect();
                let sum: u64 = members.iter().map(|&m| u64::from(m + 1)).sum();
                let want: Vec<u64> = (0..words as u64).map(|i| i * sum).collect();
                let all = node
                    .team_all_reduce(team, ReduceOp::Sum, &v)
                    .expect("all-reduce");
                assert_eq!(all, want, "all-reduce of {n}");
                let one = node
                    .team_reduce(team, root, ReduceOp::Sum, &v)
                    .expect("reduce");
                assert_eq!(
                    one,
                    if team.rank() == root {
                        want
                    } else {
                        Vec::new()
                    }
                );
                let block = [me as u8, round as u8, 0xa5];
                let gathered: Vec<u8> = members
                    .iter()
                    .flat_map(|&m| [m as u8, round as u8, 0xa5])
                    .collect();
                let got = node.team_gather(team, root, &block).expect("gather");
                let root_gets = if team.rank() == root {
                    gathered.clone()
                } else {
                    Vec::new()
                };
                assert_eq!(got, root_gets);
                assert_eq!(
                    node.team_all_gather(team, &block).expect("all-gather"),
                    gathered
                );
            }
        }
        // More than one step carries: chunks of whole elements (an odd count of words, a
        // block and a broadcast that end in a short chunk), several of them in flight.
        for team in [&world, &half] {
            let n = team.size();
            let members = team.members().to_vec();
            let root = 1 % n;
            let bytes = pattern(2 * max + 7, 0x5a ^ n as u8);
            let data = if team.rank() == root {
                &bytes[..]
            } else {
                &[][..]
            };
            let b = node.team_broadcast_nb(team, root, data).expect("start");
            let v: Vec<u64> = (0..2 * words as u64 + 3)
                .map(|i| i ^ u64::from(me))
                .collect();
            let want: Vec<u64> = (0..2 * words as u64 + 3)
                .map(|i| members.iter().map(|&m| i ^ u64::from(m)).max().unwrap_or(0))
                .collect();
            let r = node
                .team_all_reduce_nb(team, ReduceOp::Max, &v)
                .expect("start");
            let block = pattern(max + 5, me as u8);
            let gathered: Vec<u8> = members
                .iter()
                .flat_map(|&m| pattern(max + 5, m as u8))
                .collect();
            let g = node.team_all_gather_nb(team, &block).expect("start");
            let one = node.team_gather_nb(team, root, &block).expect("start");
            assert_eq!(node.wait(one).expect("gather"), {
                if team.rank() == root {
                    gathered.clone()
                } else {
                    Vec::new()
                }
            });
            assert_eq!(node.wait(g).expect("all-gather"), gathered);
            assert_eq!(node.wait(r).expect("all-reduce"), want);
            assert_eq!(node.wait(b).expect("broadcast"), bytes);
        }
        // In flight at once on both teams, completed in reverse.
        let a = node
            .team_all_reduce_nb(&world, ReduceOp::Max, &[me])
            .expect("start");
        let b = node.team_barrier_nb(&half).expect("start");
        let c = node.team_all_gather_nb(&half, &[me as u8]).expect("start");
        let d = node
            .team_all_reduce_nb(&half, ReduceOp::Min, &[i64::from(me)])
            .expect("start");
        assert_eq!(node.wait(d).expect("min"), [i64::from(me % 2)]);
        let c = node.wait(c).expect("all-gather");
        assert_eq!(
            c,
            half.members().iter().map(|&m| m as u8).collect::<Vec<_>>()
        );
        node.wait(b).expect("barrier");
        assert_eq!(node.wait(a).expect("max"), [RANKS - 1]);
        drop(half);
        node.team_barrier(&world).expect("barrier");
        assert_eq!(node.endpoint().collectives_in_flight(), 0);
    });
}

/// 8 ranks, each sending requests to every rank (itself included) at once.
pub fn many_ranks_all_to_all<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    const RANKS: u32 = 8;
    const PER_PEER: u64 = 100;
    run_watched("many_ranks_all_to_all", make(RANKS, SEGMENT), |t| {
        let (mut node, seen) = start(t, 2);
        let me = node.rank();
        let data = pattern(40, me as u8);
        for i in 0..PER_PEER {
            for k in 0..RANKS {
                let dest = (me + k) % RANKS;
                if i % 2 == 0 {
                    node.request_short(dest, REQ_SHORT, &[i as u32])
                        .expect("request");
                } else {
                    node.request_medium(dest, REQ_MEDIUM, &[i as u32], &data)
                        .expect("request");
                }
            }
        }
        let total = PER_PEER * RANKS as u64;
        wait_replies(&mut node, &seen, total);
        node.wait_until(|| seen.requests.get() == total)
            .expect("requests");
        for src in 0..RANKS {
            let from = seen.order_from(src);
            assert_eq!(from, (0..PER_PEER as u32).collect::<Vec<_>>(), "from {src}");
        }
        node.barrier().expect("barrier");
    });
}

/// Dynamic credits over the transport: every rank floods rank 0 with 1 initial credit and a bank
/// of 6 there; requests arrive in order, and rank 0's books balance when all is done.
pub fn dynamic_credits_flood<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    const RANKS: u32 = 4;
    const PER_RANK: u32 = 300;
    const BANK: u32 = 6;
    run_watched("dynamic_credits_flood", make(RANKS, SEGMENT), |t| {
        let seen = Rc::new(Seen::default());
        let config = Config {
            credits: Some(crate::Credits::Dynamic {
                initial: 1,
                bank: BANK,
            }),
            ..config(1)
        };
        let mut node = Node::new(t, echo_handlers(&seen), config).expect("node start");
        let me = node.rank();
        if me != 0 {
            let data = pattern(24, me as u8);
            for i in 0..PER_RANK {
                if i % 3 == 0 {
                    node.request_medium(0, REQ_MEDIUM, &[i], &data)
                        .expect("request");
                } else {
                    node.request_short(0, REQ_SHORT, &[i]).expect("request");
                }
            }
            wait_replies(&mut node, &seen, PER_RANK as u64);
            let held = node.credit_policy().held(0);
            assert!(held >= 1, "held {held}");
        } else {
            let total = PER_RANK as u64 * (RANKS as u64 - 1);
            node.wait_until(|| seen.requests.get() == total)
                .expect("requests");
            for src in 1..RANKS {
                let from = seen.order_from(src);
                assert_eq!(from, (0..PER_RANK).collect::<Vec<_>>(), "from {src}");
            }
        }
        node.quiesce().expect("quiesce");
        node.barrier().expect("barrier");
        if me == 0 {
            let p = node.credit_policy();
            let loans: u32 = (0..RANKS).map(|r| p.lent_to(r).expect("lent") - 1).sum();
            assert_eq!(loans + p.banked().expect("banked"), BANK);
        }
        node.barrier().expect("barrier");
    });
}

/// Peers write a rank's segment while its handlers and its `Node` read and write the same
/// bytes: rank 0 puts into `[0, 64)` of rank 1's segment and sends it requests; rank 1's
/// handler reads that range and writes `[32, 96)`, and rank 1's own loop writes and reads
/// `[16, 48)` between polls. Every access goes through `SharedBytes`, so this is sound
/// (under Miri: no data race, no retag error), and every byte read is one somebody wrote.
pub fn segment_races_are_sound<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    const RACE: HandlerId = HandlerId(40);
    let rounds: u32 = if cfg!(miri) { 3 } else { 200 };
    let allowed = move |b: u8| b == 0 || b == 0xA1 || b == 0xB2 || (1..=rounds as u8).contains(&b);
    run_watched("segment_races_are_sound", make(2, 4096), move |t| {
        let handled = Rc::new(Cell::new(0u32));
        let mut h = Handlers::local();
        let count = handled.clone();
        h.request(RACE, "race", AmKind::Medium, move |msg, _token| {
            let seg = msg.segment();
            let mut seen = [0u8; 64];
            seg.read(0, &mut seen).expect("read");
            assert!(seen.iter().all(|&b| allowed(b)), "handler read {seen:?}");
            seg.write(32, &[0xA1; 64]).expect("write");
            assert!(msg.payload().iter().all(|&b| b == 7));
            count.set(count.get() + 1);
        })
        .expect("register");
        let mut node = Node::new(t, h, config(4)).expect("node");
        if node.rank() == 0 {
            for k in 1..=rounds {
                node.put(1, 0, &[k as u8; 64]).expect("put");
                node.request_medium(1, RACE, &[], &[7; 24])
                    .expect("request");
            }
            node.quiesce().expect("quiesce");
        } else {
            while handled.get() < rounds {
                node.segment().write(16, &[0xB2; 32]).expect("write");
                let mut seen = [0u8; 96];
                node.segment().read(0, &mut seen).expect("read");
                assert!(seen.iter().all(|&b| allowed(b)), "node read {seen:?}");
                node.poll().expect("poll");
            }
        }
        node.barrier().expect("barrier");
    });
}

/// Every atomic operation at both widths, on every rank's segment (its own included), at the
/// segment's first and last words: each returns the old value and leaves the model's value,
/// and a 32-bit one leaves the other half of its 8 bytes alone. A misaligned or out-of-segment
/// word, or a rank outside the job, is a typed error and changes nothing.
pub fn atomics_every_op_and_width<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    use crate::AtomicOp::*;
    run_watched("atomics_every_op_and_width", make(3, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        let (me, n) = (node.rank(), node.size());
        // Rank `me` works on 16 bytes of every segment: its block, and (rank 0) the last 16.
        let mut blocks = vec![me as usize * 64];
        if me == 0 {
            blocks.push(SEGMENT - 16);
        }
        for dest in 0..n {
            for &at in &blocks {
                let base = 0x1111_2222_3333_4444u64.wrapping_mul(u64::from(me) + 1);
                node.put(dest, at, &base.to_le_bytes()).expect("put");
                node.put(dest, at + 8, &[0xEE; 8]).expect("put");
                let a = |node: &mut Node<T, Local>, op| {
                    node.atomic::<u64>(dest, at, op).expect("atomic")
                };
                assert_eq!(a(&mut node, Load), base);
                assert_eq!(a(&mut node, FetchAdd(u64::MAX)), base);
                assert_eq!(a(&mut node, Xor(0xff)), base - 1);
                let v = (base - 1) ^ 0xff;
                assert_eq!(a(&mut node, And(!0xf0)), v);
                assert_eq!(a(&mut node, Or(1 << 63)), v & !0xf0);
                let v = (v & !0xf0) | 1 << 63;
                assert_eq!(
                    a(
                        &mut node,
                        CompareSwap {
                            current: v ^ 1,
                            new: 5
                        }
                    ),
                    v,
                    "fails"
                );
                assert_eq!(
                    a(&mut node, CompareSwap { current: v, new: 5 }),
                    v,
                    "succeeds"
                );
                assert_eq!(a(&mut node, Swap(6)), 5);
                assert_eq!(a(&mut node, Store(7)), 6);
                // Both halves of the next 8 bytes, by 32-bit atomics.
                let h = |node: &mut Node<T, Local>, off, op| {
                    node.atomic::<u32>(dest, at + off, op).expect("atomic")
                };
                assert_eq!(h(&mut node, 8, FetchAdd(0x12)), 0xEEEE_EEEE);
                assert_eq!(h(&mut node, 12, Swap(0xA5A5_0000)), 0xEEEE_EEEE);
                assert_eq!(
                    h(
                        &mut node,
                        8,
                        CompareSwap {
                            current: 0xEEEE_EF00,
                            new: 1
                        }
                    ),
                    0xEEEE_EF00
                );
                assert_eq!(h(&mut node, 12, And(0x0000_FFFF)), 0xA5A5_0000);
                assert_eq!(h(&mut node, 12, Or(0x10)), 0);
                assert_eq!(h(&mut node, 8, Xor(3)), 1);
                assert_eq!(h(&mut node, 8, Load), 2);
                let got = node.get(dest, at, 16).expect("get");
                let mut want = 7u64.to_le_bytes().to_vec();
                want.extend(2u32.to_le_bytes());
                want.extend(0x10u32.to_le_bytes());
                assert_eq!(got, want, "rank {me} on rank {dest} at {at}");
            }
            // Refused, typed, with nothing changed.
            let at = blocks[0];
            assert!(matches!(
                node.atomic(dest, at + 4, Swap(9u64)),
                Err(AmError::Misaligned { align: 8, .. })
            ));
            assert!(matches!(
                node.atomic(dest, at + 2, Swap(9u32)),
                Err(AmError::Misaligned { align: 4, .. })
            ));
            assert!(matches!(
                node.atomic(dest, SEGMENT - 4, Swap(9u64)),
                Err(AmError::SegmentOutOfBounds { .. })
            ));
            assert!(matches!(
                node.atomic(dest, usize::MAX - 3, Swap(9u32)),
                Err(AmError::SegmentOutOfBounds { .. })
            ));
            assert_eq!(node.get(dest, at, 8).expect("get"), 7u64.to_le_bytes());
        }
        assert!(matches!(
            node.atomic(n, 0, Load::<u64>),
            Err(AmError::InvalidRank { .. })
        ));
        node.barrier().expect("barrier");
    });
}

/// Every rank adds to the same words of rank 0's segment at once (a 64-bit word and both
/// halves of the next 8 bytes), blocking, non-blocking and posted (non-fetching): the totals
/// are the sequential sums, and the fetched old values are all different (each add saw the
/// one before it). A posted atomic is applied before a later get of the same rank.
pub fn atomics_from_all_ranks_add_up<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    const RANKS: u32 = 4;
    let per: u64 = if cfg!(miri) { 4 } else { 300 };
    let olds = std::sync::Mutex::new(Vec::new());
    run_watched("atomics_from_all_ranks_add_up", make(RANKS, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        let me = u64::from(node.rank());
        let mut mine = Vec::new();
        for k in 0..per {
            mine.push(
                node.atomic(0, 0, crate::AtomicOp::FetchAdd(1 << 40 | (me + 1)))
                    .expect("fetch-add"),
            );
            // Several in flight at once, to both 32-bit halves.
            let hs: Vec<_> = (0..2)
                .map(|half| {
                    node.atomic_nb(0, 8 + 4 * half, crate::AtomicOp::FetchAdd(k as u32 + 1))
                        .expect("atomic_nb")
                })
                .collect();
            for h in hs {
                node.wait(h).expect("wait for an atomic");
            }
            // Non-fetching, applied by the barrier at the latest.
            node.atomic_nbi(0, 16, crate::AtomicOp::FetchAdd(2u64))
                .expect("atomic_nbi");
        }
        // A posted one is applied before a later get of this rank from the same rank, its
        // own or another.
        let next = (node.rank() + 1) % node.size();
        for (dest, at) in [(node.rank(), 24), (next, 32 + 8 * me as usize)] {
            node.atomic_nbi(dest, at, crate::AtomicOp::Store(me + 7))
                .expect("atomic_nbi");
            assert_eq!(
                node.get(dest, at, 8).expect("get"),
                (me + 7).to_le_bytes(),
                "a get after a posted atomic to rank {dest}"
            );
        }
        olds.lock().unwrap().extend(mine);
        node.barrier().expect("barrier");
        if me == 0 {
            let sum: u64 = (1..=u64::from(RANKS)).sum();
            let want = u64::from(RANKS) * per * (1 << 40) + per * sum;
            assert_eq!(node.atomic(0, 0, crate::AtomicOp::Load::<u64>), Ok(want));
            assert_eq!(
                node.atomic(0, 16, crate::AtomicOp::Load::<u64>),
                Ok(2 * u64::from(RANKS) * per),
                "posted adds"
            );
            let halves = u64::from(RANKS) * per * (per + 1) / 2;
            assert_eq!(node.get(0, 8, 8).expect("get"), {
                let mut b = (halves as u32).to_le_bytes().to_vec();
                b.extend((halves as u32).to_le_bytes());
                b
            });
        }
        node.barrier().expect("barrier");
    });
    let mut olds = olds.into_inner().unwrap();
    olds.sort_unstable();
    olds.dedup();
    assert_eq!(
        olds.len() as u64,
        u64::from(RANKS) * per,
        "two adds saw the same value"
    );
}

/// Minimum, maximum, multiplication and addition on every word type (signed, unsigned and
/// float, both widths), on every rank's segment (its own included), from every rank; then
/// every rank at once adds `f64`s and `f32`s and takes `i64` minima on rank 0's words,
/// fetching, non-blocking and posted. Each returns the old value and leaves the model's;
/// the totals are exact (halves); a bitwise operation on a float is refused, typed, and
/// changes nothing. Catches a signed word compared as unsigned, a float added as bits, a
/// 32-bit result written to the wrong half, a compare-and-swap loop that loses an update.
pub fn atomics_on_every_word_type<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    use crate::AtomicOp::*;
    const RANKS: u32 = 3;
    let per: u32 = if cfg!(miri) { 3 } else { 100 };
    run_watched("atomics_on_every_word_type", make(RANKS, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        let (me, n) = (node.rank(), node.size());
        // Rank `me` works on 32 bytes of every segment, after those of the other cases.
        let at = me as usize * 64 + 16;
        for dest in 0..n {
            node.put(dest, at, &[0; 32]).expect("put");
            macro_rules! check {
                ($off:expr, $op:expr, $old:expr) => {
                    assert_eq!(
                        node.atomic(dest, at + $off, $op).expect("atomic"),
                        $old,
                        "{:?} on rank {dest}",
                        $op
                    )
                };
            }
            check!(0, Store(-5i64), 0);
            check!(0, Min(3i64), -5);
            check!(0, Min(-7i64), -5);
            check!(0, Max(-9i64), -7);
            check!(0, Max(2i64), -7);
            check!(0, Mul(-3i64), 2);
            check!(0, FetchAdd(10i64), -6);
            check!(8, Store(1.5f64), 0.0);
            check!(8, FetchAdd(0.25f64), 1.5);
            check!(8, Mul(-2.0f64), 1.75);
            check!(8, Min(-1.0f64), -3.5);
            check!(8, Max(8.0f64), -3.5);
            check!(
                8,
                CompareSwap {
                    current: 8.0f64,
                    new: 0.5
                },
                8.0
            );
            check!(16, Store(-1i32), 0);
            check!(16, Max(-2i32), -1);
            check!(16, Min(-3i32), -1);
            check!(16, Mul(5i32), -3);
            check!(20, FetchAdd(2.5f32), 0.0);
            check!(20, Min(1.0f32), 2.5);
            check!(20, Max(0.5f32), 1.0);
            check!(20, Mul(3.0f32), 1.0);
            // NaN and signed zeros: the word stays unless strictly beaten (FI_MIN/FI_MAX).
            let bits =
                |node: &mut Node<T, Local>| node.atomic(dest, at + 32, Load::<u32>).expect("load");
            check!(32, Store(0.0f32), 0.0);
            check!(32, Min(-0.0f32), 0.0);
            check!(32, Max(f32::NAN), 0.0);
            assert_eq!(bits(&mut node), 0, "+0.0 kept on rank {dest}");
            check!(32, Store(f32::NAN), 0.0);
            node.atomic(dest, at + 32, Min(1.0f32)).expect("min");
            node.atomic(dest, at + 32, Max(1.0f32)).expect("max");
            assert_eq!(
                bits(&mut node),
                f32::NAN.to_bits(),
                "NaN kept on rank {dest}"
            );
            node.atomic(dest, at + 32, Store(0.0f32)).expect("store");
            check!(24, Store(u64::MAX - 1), 0);
            check!(24, Max(3u64), u64::MAX - 1);
            check!(24, Min(3u64), u64::MAX - 1);
            check!(24, Mul(1u64 << 62), 3);
            assert!(matches!(
                node.atomic(dest, at + 8, Xor(1.0f64)),
                Err(AmError::InvalidAtomic(_))
            ));
            assert!(matches!(
                node.atomic_nbi(dest, at + 20, Or(1.0f32)),
                Err(AmError::InvalidAtomic(_))
            ));
            let mut want = 4i64.to_ne_bytes().to_vec();
            want.extend(0.5f64.to_ne_bytes());
            want.extend((-15i32).to_ne_bytes());
            want.extend(3.0f32.to_ne_bytes());
            want.extend((3u64 << 62).to_ne_bytes());
            assert_eq!(
                node.get(dest, at, 32).expect("get"),
                want,
                "rank {me} on rank {dest}"
            );
        }
        // All at once on rank 0's words past the blocks: 256 f64, 264 i64, 272 f32.
        node.barrier().expect("barrier");
        for k in 0..per {
            let low = -i64::from(me * per + k);
            match k % 3 {
                0 => {
                    node.atomic(0, 256, FetchAdd(0.5f64)).expect("f64 add");
                    node.atomic(0, 264, Min(low)).expect("i64 min");
                    node.atomic(0, 272, FetchAdd(1.5f32)).expect("f32 add");
                }
                1 => {
                    let d = node.atomic_nb(0, 256, FetchAdd(0.5f64)).expect("atomic_nb");
                    let f = node.atomic_nb(0, 272, FetchAdd(1.5f32)).expect("atomic_nb");
                    node.atomic_nbi(0, 264, Min(low)).expect("atomic_nbi");
                    node.wait(f).expect("wait for an atomic");
                    node.wait(d).expect("wait for an atomic");
                }
                _ => {
                    node.atomic_nbi(0, 256, FetchAdd(0.5f64))
                        .expect("atomic_nbi");
                    node.atomic_nbi(0, 264, Min(low)).expect("atomic_nbi");
                    node.atomic_nbi(0, 272, FetchAdd(1.5f32))
                        .expect("atomic_nbi");
                }
            }
        }
        node.barrier().expect("barrier");
        if me == 0 {
            let all = f64::from(RANKS * per);
            assert_eq!(node.atomic(0, 256, Load::<f64>), Ok(0.5 * all));
            assert_eq!(
                node.atomic(0, 264, Load::<i64>),
                Ok(-i64::from(RANKS * per - 1))
            );
            assert_eq!(node.atomic(0, 272, Load::<f32>), Ok(1.5 * all as f32));
        }
        node.barrier().expect("barrier");
    });
}

/// The symmetric heap over the transport, 5 ranks with 64 KiB heaps: a block on the world
/// at one offset everywhere, written by puts and a fetch-add from every rank; blocks of
/// different sizes on the two halves of a split, then a world block that must land above
/// both on every member (its puts leave the halves' blocks intact); two allocations in
/// flight at once; a free and the same block again; running out, the same error on every
/// member, with the heap usable after; and a free of a block not allocated. Catches members
/// that disagree on a block's offset, an allocation over a live block where teams
/// allocated differently, and a heap a transport's segment does not reach.
pub fn symmetric_heap<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    use crate::atomic::AtomicOp;
    const RANKS: u32 = 5;
    const HEAP: usize = 64 << 10;
    run_watched("symmetric_heap", make(RANKS, SEGMENT), |t| {
        let mut node =
            Node::new(t, Handlers::local(), config(2).symmetric_size(HEAP)).expect("node start");
        let me = node.rank();
        let next = (me + 1) % RANKS;
        let world = node.world_team();
        assert_eq!(node.endpoint().symmetric_size(), HEAP);
        let a = node.alloc_symmetric(&world, 4096).expect("alloc");
        assert_eq!(
            a.offset(),
            SEGMENT - HEAP,
            "the first block starts the heap"
        );
        let offsets = node
            .team_all_gather(&world, &(a.offset() as u64).to_le_bytes())
            .expect("all-gather");
        assert!(
            offsets.chunks(8).all(|o| o == &offsets[..8]),
            "one offset everywhere"
        );
        // The block's first 4032 bytes by the previous rank's put, its last word by every
        // rank's fetch-add at rank 0.
        node.put(next, a.offset(), &pattern(4032, me as u8))
            .expect("put");
        // Through the block, checked against its end.
        node.atomic_at(&a.on(0), 4088, AtomicOp::FetchAdd(1u64))
            .expect("fetch-add");
        node.quiesce().expect("quiesce");
        node.team_barrier(&world).expect("barrier");
        let prev = (me + RANKS - 1) % RANKS;
        let mut mine = vec![0u8; 4032];
        node.segment().read(a.offset(), &mut mine).expect("read");
        assert_eq!(mine, pattern(4032, prev as u8), "rank {prev}'s put");
        if me == 0 {
            let adds = node
                .segment()
                .load_u64(a.at(4088).expect("in the block"))
                .expect("load");
            assert_eq!(adds, u64::from(RANKS), "every rank's fetch-add");
        }
        node.team_barrier(&world).expect("barrier");

        // The halves allocate differently; the next world block goes above both.
        let half = node
            .split(&world, Some(me % 2), 0)
            .expect("split")
            .expect("a team");
        let len = if me % 2 == 0 { 128 } else { 1000 };
        let b = node.alloc_symmetric(&half, len).expect("alloc on a half");
        node.segment()
            .write(b.offset(), &pattern(len, 0xb0))
            .expect("write");
        let c = node.alloc_symmetric(&world, 256).expect("alloc above both");
        assert!(c.offset() >= b.offset() + len, "{c:?} over {b:?}");
        node.put(next, c.offset(), &[0xcc; 256]).expect("put");
        node.quiesce().expect("quiesce");
        node.team_barrier(&world).expect("barrier");
        let mut back = vec![0u8; len];
        node.segment().read(b.offset(), &mut back).expect("read");
        assert_eq!(back, pattern(len, 0xb0), "the half's block is intact");

        // Two in flight; freed and allocated again at the same place.
        let d = node.alloc_symmetric_nb(&world, 64).expect("start");
        let e = node.alloc_symmetric_nb(&world, 64).expect("start");
        let (d, e) = (node.wait(d).expect("alloc"), node.wait(e).expect("alloc"));
        assert_ne!(d.offset(), e.offset());
        node.free_symmetric(&world, d).expect("free");
        // The halves' heaps differ: the block is above every member's highest, the same
        // on each.
        let d2 = node.alloc_symmetric(&world, 64).expect("alloc");
        let offsets = node
            .team_all_gather(&world, &(d2.offset() as u64).to_le_bytes())
            .expect("all-gather");
        assert!(
            offsets.chunks(8).all(|o| o == &offsets[..8]),
            "one offset everywhere"
        );

        // Running out is the same error everywhere, and the heap goes on.
        assert_eq!(
            node.alloc_symmetric(&world, HEAP),
            Err(AmError::OutOfSymmetricHeap {
                len: HEAP,
                size: HEAP
            })
        );
        assert_eq!(
            node.free_symmetric(&world, d2)
                .and(node.free_symmetric(&world, d2)),
            Err(AmError::NotSymmetric {
                offset: d2.offset(),
                len: 64
            })
        );
        for block in [e, c, a] {
            node.free_symmetric(&world, block).expect("free");
        }
        node.free_symmetric(&half, b).expect("free");
        // Emptied alike on every member: first fit again, at the heap's start.
        let again = node.alloc_symmetric(&world, 4096).expect("alloc");
        assert_eq!(again, a, "an emptied heap starts again at its start");
        let f = node.alloc_symmetric(&world, 64).expect("alloc");
        node.free_symmetric(&world, again).expect("free");
        assert_eq!(
            node.alloc_symmetric(&world, 64).map(|s| s.offset()),
            Ok(a.offset()),
            "the hole, by first fit"
        );
        node.free_symmetric(&world, f).expect("free");
        node.team_barrier(&world).expect("barrier");
    });
}

/// Put-with-signal hand-offs, blocking mode: the two ranks pass data of several sizes (none,
/// a word, several Long chunks) back and forth, each waiting in `wait_word` for the other's
/// signal and then finding the data in place; then each sends a burst of non-blocking
/// puts-with-signal that add to one counter, and finds all their data once the counter says
/// so; a put-with-signal to itself; misuse refused, typed, with nothing written. Catches a
/// signal applied before its data (a chunk still on its way), a waiter not woken by a
/// signal (the watchdog), a signal lost or applied twice, and a refused put-with-signal
/// that applied its signal.
pub fn put_signal_hands_off<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    use crate::{Cmp, Signal};
    // The hand-offs' data at DATA (up to 200 KB), the bursts' past it: a rank that has moved
    // on to its burst must not write where its peer still checks a hand-off.
    const DATA: usize = 4096;
    const BURST_AT: usize = SEGMENT / 2;
    const SELF_AT: usize = BURST_AT + 8 * DATA;
    run_watched("put_signal_hands_off", make(2, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        let (me, peer) = (node.rank(), 1 - node.rank());
        let sizes = [0, 8, 1000, 3 * node.max_medium().min(64 << 10) + 5];
        // Waits for round `round`'s signal, then finds `want` in place.
        let receive = |node: &mut Node<T, Local>, round: u64, want: &[u8]| {
            node.wait_word(0, Cmp::Eq, round)
                .expect("wait for the signal");
            let got = node.segment().to_vec();
            let len = want.len();
            let bad = got[DATA..DATA + len]
                .iter()
                .zip(want)
                .position(|(a, b)| a != b);
            assert!(
                bad.is_none(),
                "round {round}: byte {bad:?} of {len} differs"
            );
        };
        let mut round = 0u64;
        for &len in &sizes {
            for _ in 0..3 {
                round += 1;
                let mine = pattern(len, round as u8);
                let theirs = pattern(len, round as u8 ^ 0x5a);
                let (out, inn) = if me == 0 {
                    (&mine, &theirs)
                } else {
                    (&theirs, &mine)
                };
                if me == 1 {
                    receive(&mut node, round, inn);
                }
                node.put_signal(peer, DATA, out, 0, Signal::Set(round))
                    .expect("put_signal");
                if me == 0 {
                    receive(&mut node, round, inn);
                }
            }
        }
        // A burst adding to one counter, each with its own block.
        const BURST: usize = 20;
        let ops: Vec<_> = (0..BURST)
            .map(|i| {
                let block = pattern(100, (i + 7 * me as usize) as u8);
                node.put_signal_nb(peer, BURST_AT + 128 * i, &block, 8, Signal::Add(1))
                    .expect("put_signal_nb")
            })
            .collect();
        node.wait_all(ops).expect("wait for the burst");
        node.wait_word(8, Cmp::Ge, BURST as u64)
            .expect("wait for the counter");
        let seg = node.segment().to_vec();
        for i in 0..BURST {
            let at = BURST_AT + 128 * i;
            assert_eq!(
                seg[at..at + 100],
                pattern(100, (i + 7 * peer as usize) as u8)[..]
            );
        }
        assert_eq!(node.segment().load_u64(8).expect("load"), BURST as u64);
        // To itself: done when it returns.
        node.put_signal(me, SELF_AT, &[9; 16], 16, Signal::Add(5))
            .expect("put_signal to itself");
        node.wait_word(16, Cmp::Eq, 5).expect("wait");
        // Refused, typed, with nothing written.
        assert!(matches!(
            node.put_signal(peer, SELF_AT, &[1; 8], 20, Signal::Set(1)),
            Err(AmError::Misaligned { align: 8, .. })
        ));
        assert!(matches!(
            node.put_signal(peer, SEGMENT - 4, &[1; 8], 24, Signal::Set(1)),
            Err(AmError::SegmentOutOfBounds { .. })
        ));
        assert!(matches!(
            node.wait_word(12, Cmp::Eq, 0),
            Err(AmError::Misaligned { align: 8, .. })
        ));
        assert!(matches!(
            node.wait_word(SEGMENT, Cmp::Eq, 0),
            Err(AmError::SegmentOutOfBounds { .. })
        ));
        node.barrier().expect("barrier");
        assert_eq!(node.segment().load_u64(24).expect("load"), 0, "no signal");
        assert_eq!(node.get(me, SELF_AT, 8).expect("get"), [9; 8]);
        node.barrier().expect("barrier");
    });
}

/// Strided and indexed puts on every rank's segment (its own included): 1,024 blocks of 64
/// bytes a row apart, indexed regions of many lengths (none, one byte, one larger than a
/// Medium, split across messages where they travel as messages), several in flight at once;
/// every byte lands where its region says and the gaps between regions keep their bytes,
/// and strided and indexed gets read them back in order.
/// Regions that do not describe the data, or one outside the segment, are refused with
/// nothing written. Catches a region's bytes taken from the wrong place in the data (a
/// region split across two messages resumed at the wrong byte), a gap overwritten, and a
/// refused put that wrote its first regions.
pub fn put_regions_land_in_place<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    run_watched("put_regions_land_in_place", make(2, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        let me = node.rank();
        // Rank `me` writes in its half of every segment.
        let base = me as usize * SEGMENT / 2;
        let big = node.max_medium() + 100;
        for dest in 0..node.size() {
            let gap = vec![0xEE; 320 * 1024];
            node.put(dest, base, &gap).expect("put");
            // A column: 1,024 blocks of 64 bytes, 128 bytes apart.
            let column = pattern(1024 * 64, 3 + me as u8);
            node.put_strided(dest, base, 128, 64, &column)
                .expect("put_strided");
            let got = node.get(dest, base, 1024 * 128).expect("get");
            for (i, row) in got.chunks(128).enumerate() {
                assert_eq!(
                    row[..64],
                    column[i * 64..(i + 1) * 64],
                    "block {i} on {dest}"
                );
                assert!(row[64..].iter().all(|&b| b == 0xEE), "gap {i} on {dest}");
            }
            // The same column back in one strided get, and the gaps in another.
            assert!(
                node.get_strided(dest, base, 128, 64, 1024)
                    .expect("get_strided")
                    == column,
                "strided get from {dest}"
            );
            let gaps = node
                .get_strided(dest, base + 64, 128, 64, 1024)
                .expect("get_strided");
            assert!(gaps.iter().all(|&b| b == 0xEE), "gaps from {dest}");
            // Indexed regions, several puts in flight.
            let at = base + 140 * 1024;
            let regions = [
                (at, 1),
                (at + 10, 0),
                (at + 20, big),
                (at + 40 + big, 7),
                (at + 8, 2),
            ];
            let total: usize = regions.iter().map(|r| r.1).sum();
            let data = pattern(total, 9 + me as u8);
            let second = [(at + 150_000, 5)];
            let ops = vec![
                node.put_indexed_nb(dest, &regions, &data)
                    .expect("put_indexed_nb"),
                node.put_indexed_nb(dest, &second, &data[..5])
                    .expect("put_indexed_nb"),
            ];
            node.wait_all(ops).expect("wait");
            let got = node.get(dest, at, 150_005).expect("get");
            let mut want = vec![0xEE; 150_005];
            let mut pos = 0;
            for &(o, n) in regions.iter().chain(&second) {
                let src = if o == at + 150_000 {
                    &data[..5]
                } else {
                    &data[pos..pos + n]
                };
                want[o - at..o - at + n].copy_from_slice(src);
                if o != at + 150_000 {
                    pos += n;
                }
            }
            assert!(got == want, "indexed regions on {dest}");
            // Read back region by region: the data in order.
            assert!(
                node.get_indexed(dest, &regions).expect("get_indexed") == data,
                "indexed get from {dest}"
            );
            // Refused, with nothing written.
            let untouched = base + 300 * 1024;
            assert!(matches!(
                node.put_indexed(dest, &[(untouched, 4), (untouched + 8, 4)], &[1; 7]),
                Err(AmError::InvalidRegions(_))
            ));
            assert!(matches!(
                node.put_indexed(dest, &[(untouched, 4), (SEGMENT - 2, 4)], &[1; 8]),
                Err(AmError::SegmentOutOfBounds { .. })
            ));
            assert!(matches!(
                node.put_strided(dest, untouched, 16, 0, &[1; 8]),
                Err(AmError::InvalidRegions(_))
            ));
            assert!(matches!(
                node.put_strided(dest, untouched, 16, 3, &[1; 8]),
                Err(AmError::InvalidRegions(_))
            ));
            assert!(matches!(
                node.get_strided(dest, SEGMENT - 60, 64, 8, 2),
                Err(AmError::SegmentOutOfBounds { .. })
            ));
            assert_eq!(node.get(dest, untouched, 16).expect("get"), [0xEE; 16]);
        }
        node.barrier().expect("barrier");
    });
}

/// For transports that apply atomics themselves ([`Rma::Atomic`](crate::transport::Rma::Atomic);
/// the shared-memory NICs and loopback): rank 1 never polls while rank 0 applies atomics to its
/// segment, blocking and non-blocking, and every one is complete when made. Then a posted store
/// from rank 0 reaches rank 1 while rank 0 only waits for what rank 1 does about it.
pub fn atomics_need_no_target_progress<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    let done = DoneFlag::default();
    run_watched("atomics_need_no_target_progress", make(2, SEGMENT), |t| {
        let (mut node, seen) = start(t, 4);
        node.barrier().expect("barrier");
        if node.rank() == 1 {
            // Not a poll until rank 0 is done (or gave up).
            done.wait();
            assert_eq!(node.segment().load_u64(64).expect("load"), 1000);
            // Now polling: rank 0's posted store shows up while it only waits for our
            // request (a posted atomic left queued would deadlock this).
            while node.segment().load_u64(72).expect("load") != 1 {
                node.poll().expect("poll");
            }
            node.request_short(0, REQ_SHORT, &[]).expect("request");
            wait_replies(&mut node, &seen, 1);
        } else {
            let _done = done.guard();
            for k in 0..1000u64 {
                let h = node
                    .atomic_nb(1, 64, crate::AtomicOp::FetchAdd(1u64))
                    .expect("atomic_nb");
                assert!(
                    h.is_ready(),
                    "the transport did not apply the atomic itself"
                );
                assert_eq!(node.wait(h), Ok(k));
            }
            drop(_done);
            node.atomic_nbi(1, 72, crate::AtomicOp::Store(1u64))
                .expect("atomic_nbi");
            node.wait_until(|| seen.requests.get() >= 1)
                .expect("rank 1's request");
        }
        node.barrier().expect("barrier");
    });
}

/// A rank with a different handler table makes every rank's start fail with a clear error.
pub fn handler_table_mismatch<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    let results = run_watched("handler_table_mismatch", make(3, SEGMENT), |t| {
        let seen = Rc::new(Seen::default());
        let mut handlers = echo_handlers(&seen);
        if t.rank() == 2 {
            handlers
                .request(HandlerId(99), "extra", AmKind::Short, |_, _| {})
                .expect("register");
        }
        Node::new(t, handlers, config(2)).map(|_| ())
    });
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Err(StartError::HandlerTableMismatch {
                rank: 2,
                handler: Some(HandlerId(99)),
                ..
            }) => {}
            other => panic!(
                "rank {rank}: expected a table mismatch naming rank 2 and handler 99, got {other:?}"
            ),
        }
    }
}

/// A rank that calls `barrier` once more than the others, after they left the job (their
/// transports closed), gets `PeerDeparted` naming one of them instead of waiting for ever;
/// so does a request to that rank.
pub fn barrier_after_the_others_left<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    run_watched("barrier_after_the_others_left", make(3, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 4);
        node.barrier().expect("barrier");
        if node.rank() != 0 {
            return;
        }
        let gone = match node.barrier() {
            Err(AmError::PeerDeparted(r)) if r != 0 => r,
            other => panic!("a barrier with everyone gone: {other:?}"),
        };
        match node.request_short(gone, REQ_SHORT, &[]) {
            Err(AmError::PeerDeparted(r)) if r == gone => {}
            other => panic!("a request to rank {gone}, gone: {other:?}"),
        }
    });
}

/// Collectives in segment 0 on the world of five and on each half: broadcasts from every
/// root and all-reduces (`u64` sums, in place and not, `f64` sums), with members naming
/// different offsets, lengths below one Medium, above it, above the direct all-reduce's
/// chunk and, for the broadcast, above a step of a direct move; one started `_nb` with a
/// team collective started behind it; bad arguments; members that disagree on the count.
/// Catches a member's block reduced or written at the wrong offset or from the wrong
/// member's source, a chunk or a broadcast's step boundary off by one, a collective started
/// behind one in segment 0 that overtakes it on some member (a hang or a mismatch), and a
/// disagreement taken for an answer.
pub fn collectives_in_segment<T: Transport + Send>(make: &dyn Fn(u32, usize) -> Vec<T>) {
    use crate::reduce::ReduceOp;
    const RANKS: u32 = 5;
    run_watched("collectives_in_segment", make(RANKS, SEGMENT), |t| {
        let (mut node, _seen) = start(t, 2);
        let me = node.rank();
        let world = node.world_team();
        let half = node
            .split(&world, Some(me % 2), 0)
            .expect("split")
            .expect("a team");
        let max = node.max_medium();
        // Offsets differ between members: each learns the others'.
        let src = 4096 + 64 * me as usize;
        let dest = SEGMENT / 2 + 8 * me as usize;
        for team in [&world, &half] {
            let n = team.size();
            let members = team.members().to_vec();
            // The longest is more than a step of a direct move (256 KiB), so a broadcast's
            // copy goes in pieces.
            for (round, len) in [100, 2 * max + 7, (300 << 10) + 24].into_iter().enumerate() {
                let root = round as u32 % n;
                let bytes = pattern(len, root as u8 ^ round as u8 ^ n as u8);
                node.segment().fill(dest, len, 0xee).expect("clear");
                if team.rank() == root {
                    node.segment().write(src, &bytes).expect("source");
                }
                node.team_broadcast_in_segment(team, root, src, dest, len)
                    .expect("broadcast");
                let mut got = vec![0u8; len];
                node.segment().read(dest, &mut got).expect("read");
                assert!(got == bytes, "broadcast of {len} from {root} on {n}");
                // All-reduce: word `i` of member `m` is `i * (m + 1)`.
                let words = len / 8;
                let v: Vec<u8> = (0..words as u64)
                    .flat_map(|i| (i * u64::from(me + 1)).to_le_bytes())
                    .collect();
                let sum: u64 = members.iter().map(|&m| u64::from(m + 1)).sum();
                let want: Vec<u8> = (0..words as u64)
                    .flat_map(|i| (i * sum).to_le_bytes())
                    .collect();
                for in_place in [false, true] {
                    let to = if in_place { src } else { dest };
                    node.segment().write(src, &v).expect("source");
                    node.team_all_reduce_in_segment::<u64>(team, ReduceOp::Sum, src, to, words)
                        .expect("all-reduce");
                    let mut got = vec![0u8; v.len()];
                    node.segment().read(to, &mut got).expect("read");
                    assert!(
                        got == want,
                        "all-reduce of {words} words on {n}, in place {in_place}"
                    );
                }
                // Floating-point sums: the same bits on every member.
                let f: Vec<u8> = (0..words)
                    .flat_map(|i| (1.0 / (i as f64 + f64::from(me) + 3.0)).to_le_bytes())
                    .collect();
                node.segment().write(src, &f).expect("source");
                node.team_all_reduce_in_segment::<f64>(team, ReduceOp::Sum, src, dest, words)
                    .expect("f64 all-reduce");
                let mut got = vec![0u8; f.len()];
                node.segment().read(dest, &mut got).expect("read");
                let first = node
                    .team_broadcast(team, 0, if team.rank() == 0 { &got } else { &[] })
                    .expect("broadcast");
                assert!(first == got, "f64 sums differ between members");
            }
            // One `_nb`, then a team collective started behind it, completed first.
            let words = 3 * max / 8 + 5;
            let v: Vec<u8> = (0..words as u64)
                .flat_map(|i| (i + u64::from(me)).to_le_bytes())
                .collect();
            node.segment().write(src, &v).expect("source");
            let op = node
                .team_all_reduce_in_segment_nb::<u64>(team, ReduceOp::Max, src, dest, words)
                .expect("start");
            let behind = node
                .team_all_reduce(team, ReduceOp::Min, &[u64::from(me)])
                .expect("all-reduce behind");
            assert_eq!(behind, [u64::from(members[0])]);
            node.wait(op).expect("all-reduce in segment");
            let top = u64::from(*members.iter().max().expect("members"));
            let mut got = vec![0u8; v.len()];
            node.segment().read(dest, &mut got).expect("read");
            assert!(got
                .chunks(8)
                .enumerate()
                .all(|(i, w)| w == (i as u64 + top).to_le_bytes()));
        }
        // Bad arguments, refused here before anything starts.
        assert!(matches!(
            node.team_all_reduce_in_segment::<u64>(&world, ReduceOp::Sum, src, src + 8, 4),
            Err(AmError::InvalidCollective(_))
        ));
        assert!(matches!(
            node.team_broadcast_in_segment(&world, 0, src, SEGMENT - 4, 8),
            Err(AmError::SegmentOutOfBounds { .. })
        ));
        assert!(matches!(
            node.team_broadcast_in_segment(&world, RANKS, src, dest, 8),
            Err(AmError::InvalidCollective(_))
        ));
        // Members that disagree on the count: a mismatch on every member.
        let spare = node
            .split(&world, Some(0), 0)
            .expect("split")
            .expect("a team");
        let count = if me == 2 { 9 } else { 8 };
        assert!(matches!(
            node.team_all_reduce_in_segment::<u64>(&spare, ReduceOp::Sum, src, dest, count),
            Err(AmError::CollectiveMismatch { .. })
        ));
        node.team_barrier(&world).expect("barrier");
    });
}

/// Instantiates the whole conformance suite as `#[test]` functions for a transport, given a
/// factory `fn(ranks: u32, segment_size: usize) -> Vec<T>`.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@ $make;
            short_all_arg_counts, medium_boundary_sizes, long_boundary_sizes,
            size_limits_and_bad_arguments, per_pair_ordering, back_pressure,
            flood_both_ways_one_credit, no_reply_returns_credit, put_get, barriers,
            many_ranks_all_to_all, dynamic_credits_flood, handler_table_mismatch,
            barrier_after_the_others_left, segment_races_are_sound,
            atomics_every_op_and_width, atomics_from_all_ranks_add_up, atomics_on_every_word_type,
            rma_sizes_and_edges,
            arming_wakes_the_rank, team_collectives, put_signal_hands_off,
            put_regions_land_in_place, symmetric_heap, segment_to_segment, segments_as_values,
            segments_by_id_and_offset, long_into_created_segments, collectives_in_segment);
    };
    (@ $make:expr; $($name:ident),*) => {
        $(
            #[test]
            fn $name() {
                $crate::conformance::$name(&$make);
            }
        )*
    };
}

/// Instantiates, as [`conformance_tests!`] does, the cases for transports that put, get and apply
/// atomics on the target's memory themselves ([`Rma::Put`](crate::transport::Rma::Put),
/// [`Rma::Get`](crate::transport::Rma::Get), [`Rma::Atomic`](crate::transport::Rma::Atomic): the
/// shared-memory NICs and loopback): the target never polls while they complete, and a departed
/// target is refused by the NIC.
#[macro_export]
macro_rules! nic_rma_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@ $make;
            atomics_need_no_target_progress, rma_needs_no_target_progress,
            rma_to_a_departed_rank_is_refused);
    };
}
