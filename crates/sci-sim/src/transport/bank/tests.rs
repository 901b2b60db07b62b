//! The bank (dynamic credits' layout): messages claimed in one ring per receiver, in order
//! per sender, replies answering the oldest requests; and hostile peers at the bank: a
//! message in the name of a rank outside the job, a length past the slot, a reply to
//! requests never sent, a claim its claimer does not vouch for, a dead claimer's claim and
//! holes below a claim past the head. Heap clusters, so Miri runs them.

use super::super::tests::{head, out, reply};
use super::super::*;
use am_core::wire::MAX_HEAD_LEN;
use am_core::{AmKind, Category};

/// Three ranks with banks of 8 slots.
fn bank_trio() -> (Sci, Sci, Sci) {
    let mut v = Sci::cluster(3, 4096, SciConfig::default().bank(8)).unwrap();
    let c = v.pop().unwrap();
    let b = v.pop().unwrap();
    (v.pop().unwrap(), b, c)
}

/// Rank 2 sends rank 1 a Medium "good"; rank 1 must get it within a few bounded polls and
/// waits (long enough for its liveness tick to take over a stuck head), whatever rank 0 did.
/// The errors rank 1's polls returned on the way.
fn good_still_arrives(b: &mut Sci, c: &mut Sci) -> Vec<String> {
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Medium, 4, &mut h);
    c.try_send(1, &out(&h[..n], b"good")).unwrap();
    let mut errors = vec![];
    for _ in 0..100 {
        match b.poll_recv(|d, _, _| (d.src, d.bytes.to_vec())) {
            Ok(Some((2, bytes))) => {
                assert_eq!(&bytes[n..], b"good");
                return errors;
            }
            Ok(Some((src, _))) => panic!("a message from rank {src} was delivered"),
            Ok(None) => b.wait(Duration::from_millis(20)).unwrap(),
            Err(e) => errors.push(e.to_string()),
        }
    }
    panic!("rank 2's message did not arrive");
}

/// Rank 0 publishes `bytes` (a bank header and what follows) in rank 1's bank with `meta`
/// as its sender, as a hostile rank 0 can.
fn publish_raw(a: &mut Sci, bytes: &[u8], meta: u32) {
    let b = a.tx.bank.as_mut().unwrap();
    assert!(b.ports[1]
        .send_parts(&mut b.heads[1], &[bytes], meta)
        .unwrap());
}

/// A bank header: length, then flags.
fn bank_header(len: usize, flags: u32) -> [u8; BANK_HEADER] {
    let mut h = [0u8; BANK_HEADER];
    h[..4].copy_from_slice(&(len as u32).to_le_bytes());
    h[4..].copy_from_slice(&flags.to_le_bytes());
    h
}

/// Polls `b` until it delivers or fails, a bounded number of times.
fn poll_once<R>(
    b: &mut Sci,
    f: impl FnOnce(Delivery<'_>) -> R,
) -> Result<Option<R>, TransportError> {
    let mut f = Some(f);
    for _ in 0..100 {
        match b.poll_recv(|d, _, _| f.take().map(|f| f(d))) {
            Ok(None) => continue,
            Ok(Some(r)) => return Ok(r),
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// Requests and replies both ways through the banks: in send order, a reply may answer
/// several requests (the oldest unanswered ones), and every request's route is its count.
#[test]
fn requests_and_replies_keep_their_order_and_answer_the_oldest() {
    let (mut a, mut b, _c) = bank_trio();
    assert!(a.layout().bank == 8 && a.layout().slots == 0);
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Medium, 3, &mut h);
    for k in 0..3u8 {
        a.try_send(1, &out(&h[..n], &[k; 3])).unwrap();
    }
    let mut routes = vec![];
    for k in 0..3u8 {
        let (src, bytes, route) = poll_once(&mut b, |d| (d.src, d.bytes.to_vec(), d.route))
            .unwrap()
            .unwrap();
        assert_eq!((src, &bytes[n..]), (0, &[k; 3][..]));
        routes.push(route);
    }
    assert_eq!(routes, (1..=3).map(Route::new).collect::<Vec<_>>());
    // One reply for the first two (a coalesced acknowledgement), then one for the third.
    let mut r = [0u8; MAX_HEAD_LEN];
    let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
    b.try_send(0, &reply(&r[..rn], &[], routes[1])).unwrap();
    assert_eq!(
        b.try_send(0, &reply(&r[..rn], &[], routes[1])),
        Err(SendError::NoRequestToAnswer(routes[1])),
        "answered already"
    );
    assert_eq!(a.tx.bank.as_ref().unwrap().outstanding[1], 3);
    poll_once(&mut a, |d| assert_eq!(d.route, Route::NONE))
        .unwrap()
        .unwrap();
    assert_eq!(a.tx.bank.as_ref().unwrap().outstanding[1], 1);
    b.try_send(0, &reply(&r[..rn], &[], routes[2])).unwrap();
    poll_once(&mut a, |_| ()).unwrap().unwrap();
    assert_eq!(a.tx.bank.as_ref().unwrap().outstanding[1], 0);
    assert!(a.poll_recv(|_, _, _| ()).unwrap().is_none());
}

/// A full bank is back-pressure: nothing is overwritten, and every message arrives once, in
/// order, once the receiver has taken some.
#[test]
fn a_full_bank_is_back_pressure() {
    let (mut a, mut b, _c) = bank_trio();
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Medium, 1, &mut h);
    let mut sent = 0u8;
    while a.try_send(1, &out(&h[..n], &[sent])).is_ok() {
        sent += 1;
    }
    assert_eq!(sent, 8, "one message per slot");
    assert_eq!(a.try_send(1, &out(&h[..n], &[sent])), Err(SendError::Busy));
    let mut got = vec![];
    while got.len() < 12 {
        let k = poll_once(&mut b, |d| d.bytes.to_vec()[n]).unwrap().unwrap();
        got.push(k);
        if sent < 12 {
            a.try_send(1, &out(&h[..n], &[sent])).unwrap();
            sent += 1;
        }
    }
    assert_eq!(got, (0..12).collect::<Vec<u8>>());
}

/// A sender that found the bank full is rung when the owner consumes: its sleep in
/// `Transport::wait` ends at once instead of lasting the whole timeout, and its next send
/// goes through. Catches the sender that slept its full `block_timeout` on a full bank,
/// with nothing to wake it when room appeared (where sci's time went at 1,024 ranks).
#[test]
fn a_sender_waiting_for_room_is_rung_when_there_is_some() {
    let (mut a, mut b, _c) = bank_trio();
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Medium, 1, &mut h);
    for k in 0..8u8 {
        a.try_send(1, &out(&h[..n], &[k])).unwrap();
    }
    assert_eq!(a.try_send(1, &out(&h[..n], &[8])), Err(SendError::Busy));
    // Nothing rang `a` yet: a short wait lasts.
    let t0 = std::time::Instant::now();
    a.wait(Duration::from_millis(50)).unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(40),
        "woken with no room"
    );
    assert_eq!(poll_once(&mut b, |d| d.bytes.to_vec()[n]).unwrap(), Some(0));
    let t0 = std::time::Instant::now();
    a.wait(Duration::from_secs(5)).unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "the sender slept {:?} with room in the bank",
        t0.elapsed()
    );
    a.try_send(1, &out(&h[..n], &[8])).unwrap();
    // The request was taken with the ring: the next consume rings nobody.
    assert_eq!(b.seg.load_word(b.tx.layout.bank_room()).unwrap(), 0);
}

/// Room words a hostile peer wrote (bits of ranks outside the job, of the owner itself, a
/// room word with no waiter): the owner's consumes take them, one waiter per slot freed,
/// ring only the real waiters, and deliver on. Catches a ring past the job's ranks (an
/// out-of-bounds peer) or a ring the owner sends itself.
#[test]
fn forged_room_requests_are_taken_and_dropped() {
    let (mut a, mut b, c) = bank_trio();
    let l = b.tx.layout;
    a.tx.peers[1]
        .fetch_or_word(l.bank_room_waiter(0), 1 << 63 | 1 << 1 | 1 << 2)
        .unwrap();
    a.tx.peers[1].fetch_or_word(l.bank_room(), 7).unwrap();
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Medium, 1, &mut h);
    a.try_send(1, &out(&h[..n], &[5])).unwrap();
    assert_eq!(poll_once(&mut b, |d| d.bytes.to_vec()[n]).unwrap(), Some(5));
    // Rank 2 was named: it is rung (a spurious wake-up, nothing worse); the owner's own bit
    // is dropped, and one slot freed rings one waiter, so the forged rank's bit waits.
    assert!(c.seg.doorbell(MEF).unwrap().is_rung());
    assert_eq!(b.seg.load_word(l.bank_room_waiter(0)).unwrap(), 1 << 63);
    assert_eq!(
        b.seg.load_word(l.bank_room()).unwrap(),
        1,
        "waiters are left"
    );
    a.try_send(1, &out(&h[..n], &[6])).unwrap();
    assert_eq!(poll_once(&mut b, |d| d.bytes.to_vec()[n]).unwrap(), Some(6));
    assert_eq!(b.seg.load_word(l.bank_room()).unwrap(), 0);
    assert_eq!(b.seg.load_word(l.bank_room_waiter(0)).unwrap(), 0);
}

/// A request the full bank refused (`Busy`) was never sent, so it is not outstanding: once
/// the peer has answered the 8 that went, a reply answering one more is its misbehaviour.
/// Catches the request counted as outstanding before the `Busy` return: every refused send
/// then let the peer answer a request it never got (and the count never came back down).
#[test]
fn a_request_refused_busy_is_not_outstanding() {
    let (mut a, mut b, _c) = bank_trio();
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Medium, 1, &mut h);
    for k in 0..8u8 {
        a.try_send(1, &out(&h[..n], &[k])).unwrap();
    }
    for k in 8..11u8 {
        assert_eq!(a.try_send(1, &out(&h[..n], &[k])), Err(SendError::Busy));
    }
    assert_eq!(a.tx.bank.as_ref().unwrap().outstanding[1], 8);
    let mut last = Route::NONE;
    for _ in 0..8 {
        last = poll_once(&mut b, |d| d.route).unwrap().unwrap();
    }
    assert_eq!(last, Route::new(8));
    // One reply answers all 8.
    let mut r = [0u8; MAX_HEAD_LEN];
    let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
    b.try_send(0, &reply(&r[..rn], &[], last)).unwrap();
    poll_once(&mut a, |d| assert_eq!(d.route, Route::NONE))
        .unwrap()
        .unwrap();
    assert_eq!(a.tx.bank.as_ref().unwrap().outstanding[1], 0);
    // Rank 1 forges a reply answering one more.
    let mut msg = bank_header(rn, BANK_REPLY | answers_flag(1)).to_vec();
    msg.extend_from_slice(&r[..rn]);
    let bank = b.tx.bank.as_mut().unwrap();
    assert!(bank.ports[0]
        .send_parts(&mut bank.heads[0], &[&msg], 1)
        .unwrap());
    let got = a.poll_recv(|_, _, _| panic!("a reply to no request was delivered"));
    assert!(
        matches!(
            got,
            Err(TransportError::PeerMisbehaved { peer: Some(1), .. })
        ),
        "{got:?}"
    );
}

/// A message published in the name of a rank outside the job: an error, nothing delivered,
/// and the next sender's message still arrives.
#[test]
fn a_message_from_outside_the_job_is_an_error() {
    let (mut a, mut b, mut c) = bank_trio();
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Short, 0, &mut h);
    let mut msg = bank_header(n, 0).to_vec();
    msg.extend_from_slice(&h[..n]);
    publish_raw(&mut a, &msg, 99);
    let r = b.poll_recv(|_, _, _| panic!("delivered"));
    assert!(
        matches!(r, Err(TransportError::PeerMisbehaved { peer: None, .. })),
        "{r:?}"
    );
    assert!(good_still_arrives(&mut b, &mut c).is_empty());
}

/// A length past the slot, and a reply answering requests never sent: errors naming the
/// sender, nothing delivered, and the next messages still arrive.
#[test]
fn a_bad_length_or_reply_is_an_error_naming_the_sender() {
    let (mut a, mut b, mut c) = bank_trio();
    let cap = a.tx.bank.as_ref().unwrap().ports[1].ring().capacity();
    publish_raw(&mut a, &bank_header(cap - BANK_HEADER + 1, 0), 0);
    let r = b.poll_recv(|_, _, _| panic!("delivered"));
    assert!(
        matches!(r, Err(TransportError::PeerMisbehaved { peer: Some(0), .. })),
        "{r:?}"
    );
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Reply, AmKind::Short, 0, &mut h);
    let mut msg = bank_header(n, BANK_REPLY | answers_flag(1)).to_vec();
    msg.extend_from_slice(&h[..n]);
    publish_raw(&mut a, &msg, 0);
    let r = b.poll_recv(|_, _, _| panic!("delivered"));
    assert!(
        matches!(r, Err(TransportError::PeerMisbehaved { peer: Some(0), .. })),
        "{r:?}"
    );
    assert!(good_still_arrives(&mut b, &mut c).is_empty());
}

/// Rank 0 claims the head slot of rank 1's bank in rank 2's name (its own record vouching,
/// not rank 2's): the owner skips it when idle and reports it, and rank 2's message, claimed
/// after it, arrives.
#[test]
fn a_claim_its_claimer_does_not_vouch_for_is_skipped() {
    let (a, mut b, mut c) = bank_trio();
    let l = a.tx.layout;
    let ring = l.bank_ring().unwrap();
    let seg = a.tx.bank.as_ref().unwrap().ports[1].segment().share();
    let (mut head, mut t) = (0, [0u64; 1]);
    assert!(ring
        .try_claim(&seg, 1, 2, l.bank_record(0), &mut head, &mut t)
        .unwrap());
    ring.release(&seg.import(), l.bank_record(0)).unwrap();
    assert_eq!(t[0], 0);
    let errors = good_still_arrives(&mut b, &mut c);
    assert!(
        errors.len() == 1 && errors[0].contains("does not vouch"),
        "{errors:?}"
    );
}

/// A claim by a rank that then died: skipped once the owner knows it lost that rank, with
/// no error (it is the loss, reported as such), and the next message arrives.
#[test]
fn a_dead_claimers_slot_is_skipped() {
    let (a, mut b, mut c) = bank_trio();
    let port = &a.tx.bank.as_ref().unwrap().ports[1];
    let mut head = 0;
    assert_eq!(port.claim_one(&mut head).unwrap(), Some(0));
    // Rank 0 dies holding it; rank 1 has noticed.
    b.tx.dests[0].lost = true;
    let errors = good_still_arrives(&mut b, &mut c);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(b.faults.is_empty(), "{:?}", b.faults);
}

/// A tail word moved past the head (a claim past the bank's next ticket): the holes below
/// the claim are skipped and reported, and the claimed message arrives.
#[test]
fn holes_below_a_claim_past_the_head_are_skipped() {
    let (a, mut b, mut c) = bank_trio();
    let l = a.tx.layout;
    a.tx.peers[1].store_word(l.bank_tail(), 3).unwrap();
    let errors = good_still_arrives(&mut b, &mut c);
    assert!(
        errors.len() == 1 && errors[0].contains("3 holes"),
        "{errors:?}"
    );
    assert_eq!(b.bank.as_ref().unwrap().head(), 4);
}
