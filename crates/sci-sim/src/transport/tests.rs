//! The NIC's own behaviour: slots freed only by replies, order, slots taken in turn and the
//! restart at slot 0, the message-exist flag and the take count, and a property test over
//! arbitrary interleavings of sends, polls and takes. Heap clusters throughout, so Miri runs
//! them.

use super::*;
use am_core::wire::encode_head;
use am_core::wire::MAX_HEAD_LEN;
use am_core::{AmKind, Category};

/// The head of a `kind` message to handler 1 with the argument 42.
pub(super) fn head(c: Category, k: AmKind, payload: usize, buf: &mut [u8; MAX_HEAD_LEN]) -> usize {
    encode_head(c, k, 1, &[42], payload, buf)
}

pub(super) fn out<'a>(head: &'a [u8], payload: &'a [u8]) -> Outgoing<'a> {
    Outgoing::new(head, payload)
}

/// A reply to the request that came with `route`.
pub(super) fn reply<'a>(head: &'a [u8], payload: &'a [u8], route: Route) -> Outgoing<'a> {
    Outgoing {
        reply_to: Some(route),
        ..Outgoing::new(head, payload)
    }
}
use proptest::prelude::*;

pub(super) fn pair(slots: usize) -> (Sci, Sci) {
    pair_with(SciConfig {
        slots,
        ..SciConfig::default()
    })
}

pub(super) fn pair_with(config: SciConfig) -> (Sci, Sci) {
    let mut v = Sci::cluster(2, 4096, config).unwrap();
    let b = v.pop().unwrap();
    (v.pop().unwrap(), b)
}

#[test]
fn idle_poll_is_empty() {
    let (mut a, _b) = pair(2);
    assert!(a.poll_recv(|_, _, _| ()).unwrap().is_none());
}

/// Request slots stay busy until the reply lands in the paired reply slot.
#[test]
fn slots_free_only_on_reply_and_order_holds() {
    let (mut a, mut b) = pair(2);
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Medium, 3, &mut h);
    a.try_send(1, &out(&h[..n], b"one")).unwrap();
    a.try_send(1, &out(&h[..n], b"two")).unwrap();
    assert_eq!(a.try_send(1, &out(&h[..n], b"3")), Err(SendError::Busy));
    let mut r = [0u8; MAX_HEAD_LEN];
    let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
    for want in [&b"one"[..], b"two"] {
        let got = b
            .poll_recv(|d, _seg, tx| {
                assert_eq!(d.src, 0);
                assert_eq!(&d.bytes.to_vec()[n..], want);
                tx.try_send(0, &reply(&r[..rn], &[], d.route)).unwrap();
                // One unpublished reply per peer while the request is still lent.
                assert_eq!(
                    tx.try_send(0, &reply(&r[..rn], &[], d.route)),
                    Err(SendError::Busy)
                );
            })
            .unwrap();
        assert!(got.is_some());
    }
    assert_eq!(a.try_send(1, &out(&h[..n], b"3")), Err(SendError::Busy));
    assert!(a.poll_recv(|_, _, _| ()).unwrap().is_some());
    // One reply back: one slot free again.
    a.try_send(1, &out(&h[..n], b"3")).unwrap();
    assert_eq!(a.try_send(1, &out(&h[..n], b"4")), Err(SendError::Busy));
}

/// A coalesced implicit reply: one reply, routed as the latest of three requests, lands
/// in the reply slot of the oldest and frees all three request slots; the next reply is
/// found where the requester expects it (by the look at the two expected slots, without a
/// scan), and a reply routed to a request already answered is refused.
#[test]
fn one_reply_answers_the_earlier_unanswered_requests() {
    let (mut a, mut b) = pair(4);
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Short, 0, &mut h);
    let mut r = [0u8; MAX_HEAD_LEN];
    let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
    for _ in 0..3 {
        a.try_send(1, &out(&h[..n], &[])).unwrap();
    }
    let routes: Vec<Route> = (0..3)
        .map(|_| b.poll_recv(|d, _, _| d.route).unwrap().unwrap())
        .collect();
    assert_eq!(routes, [1, 2, 3].map(Route::new));
    b.try_send(0, &reply(&r[..rn], &[], routes[2])).unwrap();
    for route in &routes {
        assert_eq!(
            b.try_send(0, &reply(&r[..rn], &[], *route)),
            Err(SendError::NoRequestToAnswer(*route))
        );
    }
    // The reply is in the slot paired with the first request, saying it answers three.
    let chan = a.tx.layout.command_segment(1);
    let (flags, _, _) = chan.header(&a.seg, 4).unwrap();
    assert_eq!(answers(flags), 3);
    // Request 4, sent with the first three still outstanding, takes the next slot in
    // turn (3); then the reply frees slots 0-2, which the next three take in turn.
    a.try_send(1, &out(&h[..n], &[])).unwrap();
    assert!(a.poll_recv(|d, _, _| d.src).unwrap().is_some());
    for _ in 0..3 {
        a.try_send(1, &out(&h[..n], &[])).unwrap();
    }
    assert_eq!(a.try_send(1, &out(&h[..n], &[])), Err(SendError::Busy));
    // Request 4 went to slot 3; its reply goes to reply slot 3, where `a` looks next.
    let route = b.poll_recv(|d, _, _| d.route).unwrap().unwrap();
    assert_eq!(route, Route::new(4));
    b.try_send(0, &reply(&r[..rn], &[], route)).unwrap();
    assert_eq!(a.tx.recv[1].rep, 4 + 3);
    assert!(a.work.is_empty());
    let mut first = None;
    a.take_ready(1, &mut first).unwrap();
    assert_eq!(first, Some(Ready { sender: 1, slot: 7 }));
    assert!(a.work.is_empty(), "nothing else ready");
}

#[test]
fn reply_without_request_and_oversize_are_errors() {
    let (mut a, _b) = pair(2);
    let mut r = [0u8; MAX_HEAD_LEN];
    let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
    for route in [Route::NONE, Route::new(3), Route::new(u64::MAX)] {
        assert!(
            matches!(
                a.try_send(1, &reply(&r[..rn], &[], route)),
                Err(SendError::NoRequestToAnswer(r)) if r == route
            ),
            "{route:?}"
        );
    }
    let big = vec![0u8; 2000];
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Medium, big.len(), &mut h);
    assert_eq!(
        a.try_send(1, &out(&h[..n], &big)),
        Err(SendError::TooLarge(n + 2000))
    );
    assert_eq!(
        a.try_send(7, &out(&h[..n], &[])),
        Err(SendError::InvalidRank(7))
    );
}

/// `write_slot` lays a slot out as `am_shm::stamp::Slots` reads it.
#[test]
fn write_slot_matches_the_stamp_format() {
    let (a, b) = pair(2);
    let chan = a.tx.layout.command_segment(0);
    let peer = &a.tx.peers[1];
    let base = chan.base(3).unwrap();
    write_slot(peer, base, 7, b"head", b"payload".into()).unwrap();
    chan.publish(peer, 3, 9).unwrap();
    assert_eq!(chan.find(&b.seg, 9).unwrap(), Some(3));
    let (flags, body) = chan.body(&b.seg, 3).unwrap();
    assert_eq!((flags, body.to_vec()), (7, b"headpayload".to_vec()));
}

/// A sender rings only while the receiver's ringer words may lack its bit: after the first
/// ring, until the receiver takes the flag (and writes its take count back).
#[test]
fn message_exist_flag_is_rung_again_only_after_a_take() {
    let (mut a, mut b) = pair(4);
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Short, 0, &mut h);
    let tags = |b: &Sci| b.seg.doorbell(MEF).unwrap().peek_tags();
    a.try_send(1, &out(&h[..n], &[])).unwrap();
    assert_eq!(tags(&b), 1 | am_shm::doorbell::tag(0));
    assert_eq!(a.tx.dests[1].rung, 0);
    a.try_send(1, &out(&h[..n], &[])).unwrap();
    assert_eq!(a.tx.dests[1].rung, 0, "not rung again");
    // The take clears the flag, counts, and finds both messages.
    b.take_exist_flag().unwrap();
    assert_eq!(tags(&b), 0);
    assert_eq!(b.work.len(), 2);
    a.try_send(1, &out(&h[..n], &[])).unwrap();
    assert_eq!(
        tags(&b),
        1 | am_shm::doorbell::tag(0),
        "rung after the take"
    );
    assert_eq!(a.tx.dests[1].rung, 1);
    for _ in 0..3 {
        assert!(b.poll_recv(|d, _, _| d.src).unwrap().is_some());
    }
    assert!(b.poll_recv(|_, _, _| ()).unwrap().is_none());
}

/// A request sent with none outstanding after one sent that way too restarts at slot 0;
/// the others take slots in turn, and a slot comes back in the order it was taken. The
/// receiver finds each the first time it polls (a scan runs only after many fruitless
/// polls or a wait, neither of which happens here), and the requester its replies. On
/// both send paths: `send_small` (Shorts) and `send` (Mediums staged by "1 copy, 1
/// transfer", and Longs, copied or by the DMA engine).
#[test]
fn request_slots_are_taken_in_turn_and_a_lone_one_restarts() {
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Short, 0, &mut h);
    let short = out(&h[..n], &[]);
    let mut hm = [0u8; MAX_HEAD_LEN];
    let nm = head(Category::Request, AmKind::Medium, 4, &mut hm);
    let medium = out(&hm[..nm], b"four");
    let mut hl = [0u8; MAX_HEAD_LEN];
    let nl = head(Category::Request, AmKind::Long, 4, &mut hl);
    let long = Outgoing {
        long_offset: Some(0),
        ..out(&hl[..nl], b"long")
    };
    let four = |config: SciConfig| SciConfig { slots: 4, ..config };
    let cases = [
        ("Short", four(SciConfig::default()), &short),
        (
            "Medium, one copy",
            four(SciConfig {
                medium: MediumStrategy::OneCopy,
                ..SciConfig::default()
            }),
            &medium,
        ),
        (
            "Long, copied",
            four(SciConfig {
                dma_threshold: usize::MAX,
                ..SciConfig::default()
            }),
            &long,
        ),
        (
            "Long, by DMA",
            four(SciConfig {
                dma_threshold: 1,
                ..SciConfig::default()
            }),
            &long,
        ),
    ];
    for (what, config, msg) in cases {
        let (mut a, mut b) = pair_with(config);
        let mut r = [0u8; MAX_HEAD_LEN];
        let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
        let mut slots = Vec::new();
        let answer = |b: &mut Sci, slots: &mut Vec<u64>| {
            b.poll_recv(|d, _, tx| {
                slots.push(d.route.get() - 1);
                tx.try_send(0, &reply(&r[..rn], &[], d.route)).unwrap()
            })
            .unwrap()
            .unwrap_or_else(|| panic!("{what}: a request not found first time"));
        };
        // A Long by DMA is published once the engine is done: a bounded wait.
        let send = |a: &mut Sci| {
            a.try_send(1, msg).unwrap();
            let t = std::time::Instant::now();
            while !a.tx.dma.queue.is_empty() {
                assert!(t.elapsed() < Duration::from_secs(10), "{what}: DMA stuck");
                a.tx.progress_dma(&a.seg).unwrap();
                std::thread::yield_now();
            }
        };
        let replied = |a: &mut Sci| {
            a.poll_recv(|_, _, _| ())
                .unwrap()
                .unwrap_or_else(|| panic!("{what}: a reply not found first time"));
        };
        // Lone round trips: the first in turn (slot 0 here), then each in slot 0.
        for _ in 0..3 {
            send(&mut a);
            answer(&mut b, &mut slots);
            replied(&mut a);
        }
        // Three in flight, then their replies (the first restarts, after a lone one);
        // then two, the second sent before the first's reply is seen, in turn (the
        // first too: the last before it was not lone); then one alone in turn, and one
        // alone that restarts.
        for burst in [3, 2, 1, 1] {
            for _ in 0..burst {
                send(&mut a);
            }
            for _ in 0..burst {
                answer(&mut b, &mut slots);
            }
            for _ in 0..burst {
                replied(&mut a);
            }
        }
        assert_eq!(slots, [0, 0, 0, 0, 1, 2, 3, 0, 1, 0], "{what}");
        assert!(
            a.work.is_empty() && b.work.is_empty(),
            "{what}: nothing queued"
        );
        assert!(a.poll_recv(|_, _, _| ()).unwrap().is_none());
        assert!(b.poll_recv(|_, _, _| ()).unwrap().is_none());
    }
}

/// A request whose sender saw the reply to its last one after it sent restarts nowhere:
/// it is in the next slot in turn while the receiver, having answered everything, also
/// looks at slot 0, and still finds it there first time.
#[test]
fn a_request_crossing_the_last_reply_is_found_in_turn() {
    let (mut a, mut b) = pair(4);
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Short, 0, &mut h);
    let mut r = [0u8; MAX_HEAD_LEN];
    let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
    a.try_send(1, &out(&h[..n], &[])).unwrap();
    let route = b.poll_recv(|d, _, _| d.route).unwrap().unwrap();
    b.try_send(0, &reply(&r[..rn], &[], route)).unwrap();
    // `a` sends again before it sees the reply: slot 1, in turn.
    a.try_send(1, &out(&h[..n], &[])).unwrap();
    let route = b.poll_recv(|d, _, _| d.route).unwrap().unwrap();
    assert_eq!(route, Route::new(2));
    assert!(a.poll_recv(|_, _, _| ()).unwrap().is_some());
    b.try_send(0, &reply(&r[..rn], &[], route)).unwrap();
    assert!(a.poll_recv(|_, _, _| ()).unwrap().is_some());
    // Both answered, the last not lone: the next lone one goes in turn (slot 2), and
    // the lone one after it restarts at slot 0; each found first time.
    a.try_send(1, &out(&h[..n], &[])).unwrap();
    let route = b.poll_recv(|d, _, _| d.route).unwrap().unwrap();
    assert_eq!(route, Route::new(3));
    b.try_send(0, &reply(&r[..rn], &[], route)).unwrap();
    assert!(a.poll_recv(|_, _, _| ()).unwrap().is_some());
    a.try_send(1, &out(&h[..n], &[])).unwrap();
    assert_eq!(b.poll_recv(|d, _, _| d.route).unwrap(), Some(Route::new(1)));
    assert!(a.work.is_empty() && b.work.is_empty(), "nothing queued");
}

/// Ranks in the model test: with more than two, a sender is not always the hinted one.
const N: usize = 3;

#[derive(Debug, Clone, Copy)]
enum Op {
    /// Rank `.0` sends a Medium request to rank `.1`, carrying the pair's next number.
    Send(usize, usize),
    /// The same as an AM Short, the number in its argument (`Sci::try_send`'s Short path).
    Short(usize, usize),
    /// Rank `.0` polls once; a request is answered from inside the handler, which also
    /// sends a Short request on to the next rank (a deferred send) if `.1`.
    Poll(usize, bool),
    /// Rank `.0` takes its message-exist flag (as before it sleeps).
    Take(usize),
}

/// Whether the device took a send: `Busy` is no, any other error is the model's failure.
fn accepted(sent: Result<(), SendError>) -> Result<bool, SendError> {
    match sent {
        Ok(()) => Ok(true),
        Err(SendError::Busy) => Ok(false),
        Err(e) => Err(e),
    }
}

/// How many operations a case of `no_message_is_lost_or_repeated` has: fewer under Miri,
/// where an operation costs tens of milliseconds, but never so few that a pair's slots
/// (1 to 4) are unlikely to fill and wrap.
const MODEL_OPS: std::ops::Range<usize> = if cfg!(miri) { 40..80 } else { 1..300 };

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..N, 0..N).prop_map(|(a, b)| Op::Send(a, b)),
        (0..N, 0..N).prop_map(|(a, b)| Op::Short(a, b)),
        (0..N, any::<bool>()).prop_map(|(a, f)| Op::Poll(a, f)),
        (0..N).prop_map(Op::Take),
    ]
}

proptest! {
    /// Whatever the interleaving of sends (Mediums, Shorts on their own path, and
    /// Shorts sent from handlers), polls and takes, every request and reply is delivered
    /// exactly once and in the order sent: each message carries its number among the
    /// pair's messages of its kind and among all the pair's messages, requests and
    /// replies together, whatever path each took (a handler's reply and its forward to
    /// the same rank included). The hint, the two-slot look, the left-set flag and the
    /// take count lose nothing, repeat nothing and reorder nothing.
    #[test]
    fn no_message_is_lost_or_repeated(
        ops in proptest::collection::vec(op(), MODEL_OPS),
        slots in 1usize..=4,
    ) {
        let config = SciConfig { slots, ..SciConfig::default() };
        let mut ranks = Sci::cluster(N as u32, 4096, config).unwrap();
        // [from][to]: requests sent, and messages of any kind sent.
        let mut sent = [[0u32; N]; N];
        let mut any = [[0u32; N]; N];
        let mut got_req = [[0u32; N]; N];
        let mut got_rep = [[0u32; N]; N];
        let mut got_any = [[0u32; N]; N];
        // The two numbers, last in every message (a Medium's payload, a Short's arguments).
        let numbers = |b: &[u8]| {
            let at = b.len() - 8;
            let n = |i: usize| u32::from_le_bytes(b[at + i..at + i + 4].try_into().unwrap());
            (n(0), n(4))
        };
        let pair = |a: u32, b: u32| {
            let mut p = [0u8; 8];
            p[..4].copy_from_slice(&a.to_le_bytes());
            p[4..].copy_from_slice(&b.to_le_bytes());
            p
        };
        let fail = |e: SendError| TestCaseError::fail(format!("{e:?}"));
        let mut step = |ranks: &mut [Sci], op: Op| -> Result<(), TestCaseError> {
            match op {
                Op::Send(r, to) | Op::Short(r, to) => {
                    let mut h = [0u8; MAX_HEAD_LEN];
                    let (sent_rt, any_rt) = (sent[r][to], any[r][to]);
                    let taken = if let Op::Send(..) = op {
                        let n = head(Category::Request, AmKind::Medium, 8, &mut h);
                        let body = pair(sent_rt, any_rt);
                        ranks[r].try_send(to as Rank, &out(&h[..n], &body))
                    } else {
                        let numbers = [sent_rt, any_rt];
                        let n = encode_head(Category::Request, AmKind::Short, 1, &numbers, 0, &mut h);
                        ranks[r].try_send(to as Rank, &out(&h[..n], &[]))
                    };
                    if accepted(taken).map_err(fail)? {
                        sent[r][to] += 1;
                        any[r][to] += 1;
                    }
                }
                Op::Poll(r, forward) => {
                    let mut rh = [0u8; MAX_HEAD_LEN];
                    let rn = head(Category::Reply, AmKind::Medium, 8, &mut rh);
                    let next = (r + 1) % N;
                    let fnum = sent[r][next];
                    let row = any[r];
                    let got = ranks[r]
                        .poll_recv(|d, _, tx| {
                            let (seq, seq_any) = numbers(&d.bytes.to_vec());
                            let src = d.src as usize;
                            let is_reply = d.route == Route::NONE;
                            let mut row = row;
                            let mut forwarded = false;
                            let mut error = None;
                            if !is_reply {
                                let body = pair(seq, row[src]);
                                match tx.try_send(d.src, &reply(&rh[..rn], &body, d.route)) {
                                    Ok(()) => row[src] += 1,
                                    Err(e) => error = Some(e),
                                }
                                if forward && error.is_none() {
                                    let mut fh = [0u8; MAX_HEAD_LEN];
                                    let numbers = [fnum, row[next]];
                                    let n = encode_head(Category::Request, AmKind::Short, 1, &numbers, 0, &mut fh);
                                    match accepted(tx.try_send(next as Rank, &out(&fh[..n], &[]))) {
                                        Ok(true) => {
                                            forwarded = true;
                                            row[next] += 1;
                                        }
                                        Ok(false) => {}
                                        Err(e) => error = Some(e),
                                    }
                                }
                            }
                            (src, is_reply, seq, seq_any, forwarded, row, error)
                        })
                        .map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                    if let Some((src, reply, seq, seq_any, forwarded, row, error)) = got {
                        if let Some(e) = error {
                            return Err(TestCaseError::fail(format!("a handler's send: {e:?}")));
                        }
                        any[r] = row;
                        if forwarded {
                            sent[r][next] += 1;
                        }
                        // A reply to r's request to src; a request from src to r.
                        let want = if reply {
                            &mut got_rep[r][src]
                        } else {
                            &mut got_req[src][r]
                        };
                        prop_assert_eq!(seq, *want);
                        *want += 1;
                        prop_assert_eq!(seq_any, got_any[src][r], "order among all of {}->{}", src, r);
                        got_any[src][r] += 1;
                    }
                }
                Op::Take(r) => ranks[r]
                    .take_exist_flag()
                    .map_err(|e| TestCaseError::fail(format!("{e:?}")))?,
            }
            Ok(())
        };
        for &o in &ops {
            step(&mut ranks, o)?;
        }
        // Drain: everything sent arrives, replies included.
        for _ in 0..64 {
            for r in 0..N {
                step(&mut ranks, Op::Poll(r, false))?;
            }
        }
        prop_assert_eq!(got_req, sent);
        prop_assert_eq!(got_rep, sent);
        prop_assert_eq!(got_any, any);
    }
}

/// The sender's limits at their boundaries: a Medium (by either strategy) and a Long
/// head of exactly a slot's capacity and a Long payload of exactly `max_long` go out and
/// arrive whole; one to eight bytes more is `TooLarge`, and takes no slot and sends
/// nothing.
#[test]
fn send_lengths_at_and_just_past_the_limits() {
    for medium in [MediumStrategy::TwoTransfers, MediumStrategy::OneCopy] {
        send_lengths_at_and_just_past_the_limits_with(medium);
    }
}

fn send_lengths_at_and_just_past_the_limits_with(medium: MediumStrategy) {
    let (mut a, mut b) = pair_with(SciConfig {
        slots: 4,
        max_long: 2048,
        medium,
        ..SciConfig::default()
    });
    let cap = a.tx.layout.command_segment(0).capacity();
    let bytes: Vec<u8> = (0..cap.max(2048) + 8).map(|i| (i % 251) as u8).collect();
    let take = |b: &mut Sci| {
        for _ in 0..100 {
            let got = b.poll_recv(|d, _, _| (d.src, d.bytes.to_vec(), d.payload_placed));
            if let Some(got) = got.unwrap() {
                return got;
            }
            b.wait(Duration::from_millis(10)).unwrap();
        }
        panic!("nothing arrived");
    };
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Medium, 0, &mut h);
    for total in cap..=cap + 8 {
        head(Category::Request, AmKind::Medium, total - n, &mut h);
        let sent = a.try_send(1, &out(&h[..n], &bytes[n..total]));
        if total == cap {
            assert_eq!(sent, Ok(()), "{medium:?}");
            let want = [&h[..n], &bytes[n..total]].concat();
            assert_eq!(take(&mut b), (0, want, false), "{medium:?}");
        } else {
            assert_eq!(sent, Err(SendError::TooLarge(total)), "{medium:?}");
        }
    }
    let long = |head, payload| Outgoing {
        long_offset: Some(0),
        ..out(head, payload)
    };
    for len in cap..=cap + 8 {
        let sent = a.try_send(1, &long(&bytes[..len], &[]));
        if len == cap {
            assert_eq!(sent, Ok(()));
            assert_eq!(take(&mut b), (0, bytes[..len].to_vec(), true));
        } else {
            assert_eq!(sent, Err(SendError::TooLarge(len)));
        }
    }
    let n = head(Category::Request, AmKind::Long, 2048, &mut h);
    for len in 2048..=2048 + 8 {
        let sent = a.try_send(1, &long(&h[..n], &bytes[..len]));
        if len == 2048 {
            assert_eq!(sent, Ok(()));
            assert_eq!(take(&mut b), (0, h[..n].to_vec(), true));
            assert_eq!(&b.segment().to_vec()[..len], &bytes[..len]);
        } else {
            assert_eq!(sent, Err(SendError::TooLarge(len)));
        }
    }
    assert!(b.poll_recv(|d, _, _| d.src).unwrap().is_none());
}
