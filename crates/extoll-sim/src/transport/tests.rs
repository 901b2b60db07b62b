//! The NIC's own behaviour: back-pressure, order across both Medium paths, the RMA engine,
//! dead claimers. Every wait is bounded in time: a test fails rather than hangs. Heap
//! clusters throughout, so Miri runs them (except the ones that spawn a process).

use super::*;
use am_core::wire::{encode_head, MAX_HEAD_LEN};
use am_core::{AmKind, Category};

/// Encodes the head of a request to handler 1 with the one argument 42 and a payload of
/// `payload` bytes (12 bytes of head).
pub(super) fn head(kind: AmKind, payload: usize, buf: &mut [u8; MAX_HEAD_LEN]) -> usize {
    encode_head(Category::Request, kind, 1, &[42], payload, buf)
}

pub(super) fn out<'a>(head: &'a [u8], payload: &'a [u8]) -> Outgoing<'a> {
    Outgoing::new(head, payload)
}

pub(super) fn pair(config: ExtollConfig) -> (Extoll, Extoll) {
    let mut v = Extoll::cluster(2, 1 << 16, config).unwrap();
    let b = v.pop().unwrap();
    (v.pop().unwrap(), b)
}

/// A limit that a wait must meet, stretched under Miri: there the interpreter runs both ranks
/// and the engine thread hundreds of times slower, and a loaded CI machine slower still
/// (10 s of wall clock once ran out there). Checks that nothing arrives keep their short
/// limits: a longer one would only slow them.
pub(super) fn patience(secs: u64) -> Duration {
    Duration::from_secs(if cfg!(miri) { secs * 30 } else { secs })
}

/// Polls `x` until it delivers or `limit` passes, waiting between empty polls: the delivered
/// source and bytes, and every error met on the way.
pub(super) fn poll_until(
    x: &mut Extoll,
    limit: Duration,
) -> (Option<(u32, Vec<u8>)>, Vec<TransportError>) {
    poll_for_errors(x, |_| false, limit)
}

/// Polls `x` until the errors met satisfy `enough` and a poll then finds nothing more queued,
/// until it delivers, or until `limit` passes. Errors found by one check come out one per
/// poll, so a fixed window can end between them (it did under Miri).
pub(super) fn poll_for_errors(
    x: &mut Extoll,
    enough: impl Fn(&[TransportError]) -> bool,
    limit: Duration,
) -> (Option<(u32, Vec<u8>)>, Vec<TransportError>) {
    let deadline = Instant::now() + limit;
    let mut errors = Vec::new();
    while Instant::now() < deadline {
        match x.poll_recv(|d, _, _| (d.src, d.bytes.to_vec())) {
            Ok(Some(got)) => return (Some(got), errors),
            Ok(None) if enough(&errors) => break,
            Ok(None) => {
                if let Err(e) = x.wait(Duration::from_millis(5)) {
                    errors.push(e);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    (None, errors)
}

fn recv(x: &mut Extoll) -> Option<(u32, Vec<u8>)> {
    let (got, errors) = poll_until(x, patience(10));
    assert_eq!(errors, vec![]);
    got
}

/// Notification slots of rank 1 that rank 2's main thread (through `c`'s maps) claims as
/// its own (genuine claims) and holds until [`HeldNotes::give_up`].
pub(super) struct HeldNotes {
    ring: Ring,
    record: usize,
    me: u32,
    tickets: Vec<u64>,
}

impl HeldNotes {
    pub(super) fn claim(c: &Extoll, n: usize) -> HeldNotes {
        let l = c.tx.layout;
        let ring = l.notifications();
        let record = l.claims(2, crate::layout::CLAIM_NOTES);
        let me = crate::layout::notes_claimer(2, false);
        let mut tickets = vec![0u64; n];
        assert!(ring
            .try_claim(&c.tx.peers[1].seg, n, me, record, &mut 0, &mut tickets)
            .unwrap());
        HeldNotes {
            ring,
            record,
            me,
            tickets,
        }
    }

    /// Skips the held slots and clears the record, as a claimer that gives them up.
    pub(super) fn give_up(&self, c: &Extoll) {
        for &t in &self.tickets {
            self.ring.skip(&c.tx.peers[1].imp, t, self.me).unwrap();
        }
        self.ring.release(&c.tx.peers[1].imp, self.record).unwrap();
    }
}

/// Stores `value` into claim word `i` of rank `to`'s RMA Medium pool, through `x`'s maps.
pub(super) fn store_pool_claim(x: &Extoll, to: usize, i: usize, value: u64) {
    x.tx.peers[to]
        .imp
        .store_word(x.tx.layout.pool_claim(i), value)
        .unwrap();
}

/// A full mailbox is back-pressure: nothing is overwritten, and everything arrives once
/// the receiver drains.
#[test]
fn full_mailbox_is_busy_and_loses_nothing() {
    let config = ExtollConfig {
        mailbox_slots: 148,
        medium: crate::MediumPath::Velo,
        ..ExtollConfig::default()
    };
    let (mut a, mut b) = pair(config);
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Medium, 100, &mut h);
    let mut sent = 0u8;
    loop {
        let payload = [sent; 100];
        match a.try_send(1, &out(&h[..n], &payload)) {
            Ok(()) => sent += 1,
            Err(SendError::Busy) => break,
            Err(e) => panic!("{e}"),
        }
    }
    // 112-byte messages take 2 packets each: 74 of them fill 148 slots.
    assert_eq!(sent, 74);
    for k in 0..sent {
        let (src, bytes) = recv(&mut b).expect("delivered");
        assert_eq!(src, 0);
        assert_eq!(&bytes[n..], &[k; 100]);
    }
    assert!(b.poll_recv(|_, _, _| ()).unwrap().is_none());
    a.try_send(1, &out(&h[..n], &[1; 100])).unwrap();
}

/// A sender that found the mailbox full is rung when the owner tells its head: its sleep in
/// `Transport::wait` ends at once rather than lasting the whole timeout. Catches the sender
/// that slept its full `block_timeout` on a full mailbox with nothing to wake it.
#[test]
fn a_sender_waiting_for_room_is_rung_when_there_is_some() {
    let config = ExtollConfig {
        mailbox_slots: 148,
        medium: crate::MediumPath::Velo,
        ..ExtollConfig::default()
    };
    let (mut a, mut b) = pair(config);
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Short, 0, &mut h);
    let mut sent = 0;
    while a.try_send(1, &out(&h[..n], &[])).is_ok() {
        sent += 1;
    }
    assert_eq!(sent, 148, "one packet per slot");
    let t0 = Instant::now();
    a.wait(Duration::from_millis(50)).unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(40),
        "woken with no room"
    );
    for _ in 0..sent {
        recv(&mut b).expect("delivered");
    }
    let t0 = Instant::now();
    a.wait(Duration::from_secs(5)).unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(1),
        "the sender slept {:?} with room in the mailbox",
        t0.elapsed()
    );
    a.try_send(1, &out(&h[..n], &[])).unwrap();
    assert_eq!(b.seg.load_word(b.tx.layout.room()).unwrap(), 0);
}

/// A one-packet message is lent from the mailbox slot (shared memory), a multi-packet one
/// from the reassembly buffer (private), an RMA Medium from its receive buffer (shared).
#[test]
fn messages_are_lent_where_they_are() {
    let config = ExtollConfig {
        medium: crate::MediumPath::Auto { rma_from: 512 },
        ..ExtollConfig::default()
    };
    let (mut a, mut b) = pair(config);
    let mut h = [0u8; MAX_HEAD_LEN];
    for (len, shared) in [(40usize, true), (100, false), (600, true)] {
        let n = head(AmKind::Medium, len, &mut h);
        let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
        a.try_send(1, &out(&h[..n], &payload)).unwrap();
        let deadline = Instant::now() + patience(10);
        let got = loop {
            assert!(
                Instant::now() < deadline,
                "message of {len} bytes not delivered"
            );
            let r = b
                .poll_recv(|d, _, _| {
                    let kind = matches!(d.bytes, Received::Shared(_));
                    (kind, d.bytes.to_vec())
                })
                .unwrap();
            match r {
                Some(got) => break got,
                None => b.wait(Duration::from_millis(5)).unwrap(),
            }
        };
        assert_eq!(got.0, shared, "{len} bytes");
        assert_eq!(&got.1[n..], &payload[..]);
    }
}

/// VELO and RMA Mediums of one source arrive in send order.
#[test]
fn both_paths_keep_per_source_order() {
    let config = ExtollConfig {
        medium: crate::MediumPath::Auto { rma_from: 64 },
        rma_buffers: 2,
        ..ExtollConfig::default()
    };
    let (mut a, mut b) = pair(config);
    let mut h = [0u8; MAX_HEAD_LEN];
    let sizes = [10usize, 100, 20, 200, 300, 5, 400, 8192, 1];
    let mut got = Vec::new();
    let deadline = Instant::now() + patience(10);
    for (k, &len) in sizes.iter().enumerate() {
        let n = head(AmKind::Medium, len, &mut h);
        let payload = vec![k as u8; len];
        while let Err(e) = a.try_send(1, &out(&h[..n], &payload)) {
            assert_eq!(e, SendError::Busy, "RMA buffers run out");
            assert!(Instant::now() < deadline, "never room again");
            if let Some(m) = b.poll_recv(|d, _, _| d.bytes.to_vec()).unwrap() {
                got.push(m);
            }
            a.drain_notes().unwrap();
        }
    }
    while got.len() < sizes.len() {
        got.push(recv(&mut b).expect("delivered").1);
    }
    for (k, &len) in sizes.iter().enumerate() {
        assert_eq!(got[k].len(), len + 12);
        assert!(
            got[k][12..].iter().all(|&x| x == k as u8),
            "message {k} in order"
        );
    }
}

/// A legitimate wait is never taken for a lie: a VELO message that follows an RMA Medium
/// whose completer notification sits behind a live claimer's unpublished slot waits (past
/// the stalled-queue checks), then both arrive in order, with no error.
#[test]
fn a_message_waits_for_an_rma_medium_behind_a_live_claim() {
    let config = ExtollConfig {
        notify_slots: 16,
        rma_buffers: 2,
        mailbox_slots: 148,
        ..ExtollConfig::default()
    };
    let mut v = Extoll::cluster(3, 4096, config).unwrap();
    let c = v.pop().unwrap();
    let mut b = v.pop().unwrap();
    let mut a = v.pop().unwrap();
    // Rank 2's main thread claims notification ticket 0 at rank 1 (a genuine claim), and
    // holds it.
    let held = HeldNotes::claim(&c, 1);
    assert_eq!(held.tickets, [0]);
    // Rank 0: an RMA Medium (its notification lands behind the claim), then a Short.
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Medium, 600, &mut h);
    a.set_medium(MediumPath::Rma);
    a.try_send(1, &out(&h[..n], &[6; 600])).unwrap();
    let s = head(AmKind::Short, 0, &mut h);
    a.try_send(1, &out(&h[..s], &[])).unwrap();
    let (got, errors) = poll_until(&mut b, Duration::from_millis(400));
    assert_eq!(got, None, "nothing may pass the claimed notification");
    assert_eq!(errors, vec![], "a live claim is no error");
    // The claimer gives its slot up: everything flows, in rank 0's order.
    held.give_up(&c);
    let (got, errors) = poll_until(&mut b, patience(5));
    assert_eq!(errors, vec![]);
    assert_eq!(got.map(|(s, m)| (s, m.len())), Some((0, n + 600)));
    let (got, errors) = poll_until(&mut b, patience(5));
    assert_eq!(errors, vec![]);
    assert_eq!(got.map(|(s, m)| (s, m.len())), Some((0, s)));
}

#[test]
fn rma_put_and_get_by_the_engine_with_notifications() {
    let (mut a, mut b) = pair(ExtollConfig::default());
    a.segment().write(100, b"0123456789").unwrap();
    let deadline = Instant::now() + patience(10);
    let op = a.rma_put(1, 5000, 100, 10).unwrap();
    while !a.rma_test(op).unwrap() {
        assert!(Instant::now() < deadline);
        std::thread::yield_now();
    }
    while b.puts_landed(0) == 0 {
        assert!(Instant::now() < deadline);
        b.drain_notes().unwrap();
        std::thread::yield_now();
    }
    assert_eq!(b.segment().slice(5000, 10).unwrap().to_vec(), b"0123456789");
    b.segment().write(7, b"xy").unwrap();
    let op = a.rma_get(1, 7, 0, 2).unwrap();
    while !a.rma_test(op).unwrap() {
        assert!(Instant::now() < deadline);
        std::thread::yield_now();
    }
    assert_eq!(a.segment().slice(0, 2).unwrap().to_vec(), b"xy");
    assert!(matches!(
        a.rma_put(1, 1 << 16, 0, 1),
        Err(RmaError::OutOfBounds { .. })
    ));
    assert!(matches!(a.rma_get(5, 0, 0, 1), Err(RmaError::BadRank(5))));
}

/// An engine that takes no more jobs refuses an RMA with the NIC's error as the source.
#[test]
fn a_stopped_engine_is_the_rma_errors_source() {
    use am_core::{NicError, NicErrorKind};
    use std::error::Error;
    let (mut a, _b) = pair(ExtollConfig::default());
    a.tx.engine().unwrap();
    a.tx.engine.as_mut().unwrap().stop_taking_jobs();
    let e = a.rma_put(1, 0, 0, 8).unwrap_err();
    assert!(
        matches!(&e, RmaError::Engine(n) if n.kind() == NicErrorKind::Device),
        "{e}"
    );
    let source = e.source().expect("the NIC's error is the source");
    let nic = source.downcast_ref::<NicError>();
    assert_eq!(
        nic.map(NicError::kind),
        Some(NicErrorKind::Device),
        "{source}"
    );
}

/// Posts a notification into `target`'s queue as rank `src`'s engine would.
pub(super) fn post_note(x: &Extoll, target: usize, src: usize, kind: u32, value: u64) {
    let l = x.tx.layout;
    let ring = l.notifications();
    let peer = &x.tx.peers[target];
    let me = crate::layout::notes_claimer(src, true);
    let record = l.claims(src, crate::layout::CLAIM_ENGINE);
    let mut t = [0u64; 1];
    assert!(ring
        .try_claim(&peer.seg, 1, me, record, &mut 0, &mut t)
        .unwrap());
    crate::rma::post(&l, peer, t[0], src, Note { kind, value }).unwrap();
    ring.release(&peer.imp, record).unwrap();
}

#[test]
fn corrupt_notifications_and_packets_are_errors() {
    let (a, mut b) = pair(ExtollConfig::default());
    // A requester notification claiming to come from another rank.
    post_note(&a, 1, 0, kind::USER_DONE, 0);
    assert!(matches!(
        b.poll_recv(|_, _, _| ()),
        Err(TransportError::PeerMisbehaved { peer: Some(0), .. })
    ));
    // An RMA Medium notified with no buffer written: the marker check catches it.
    post_note(&a, 1, 0, kind::MEDIUM_LANDED, 0);
    assert!(matches!(
        b.poll_recv(|_, _, _| ()),
        Err(TransportError::PeerMisbehaved { peer: Some(0), .. })
    ));
    // A packet from rank 9 of a 2-rank job.
    let ring = a.tx.layout.mailbox();
    let mut t = [0u64; 1];
    assert!(ring
        .try_claim(
            &a.tx.peers[1].seg,
            1,
            0,
            a.tx.layout.claims(0, CLAIM_MAILBOX),
            &mut 0,
            &mut t
        )
        .unwrap());
    let m = Meta {
        src: 9,
        len: 3,
        flags: FIRST | LAST,
        rma_before: 0,
    };
    ring.publish(&a.tx.peers[1].imp, t[0], m.encode()).unwrap();
    assert!(matches!(
        b.poll_recv(|_, _, _| ()),
        Err(TransportError::PeerMisbehaved { peer: None, .. })
    ));
    assert!(
        b.poll_recv(|_, _, _| ()).unwrap().is_none(),
        "dropped, not stuck"
    );
}

/// The sender's limits at their boundaries: a Medium of exactly the largest message (over
/// VELO and by RMA buffer), a Long head of exactly it and a Long payload of exactly
/// `max_long` go out and arrive whole; one to eight bytes more is `TooLarge`, and nothing
/// goes out.
#[test]
fn send_lengths_at_and_just_past_the_limits() {
    let config = ExtollConfig {
        mailbox_slots: 148,
        max_long: 4096,
        ..ExtollConfig::default()
    };
    let (mut a, mut b) = pair(config);
    let bytes: Vec<u8> = (0..MAX_MSG + 8).map(|i| (i % 251) as u8).collect();
    let mut h = [0u8; MAX_HEAD_LEN];
    for path in [MediumPath::Velo, MediumPath::Rma] {
        a.set_medium(path);
        for total in MAX_MSG..=MAX_MSG + 8 {
            let n = head(AmKind::Medium, total - 12, &mut h);
            assert_eq!(n, 12);
            let sent = a.try_send(1, &out(&h[..n], &bytes[n..total]));
            if total == MAX_MSG {
                assert_eq!(sent, Ok(()), "{path:?}");
                let (src, got) = recv(&mut b).expect("delivered");
                assert_eq!((src, &got[..n], &got[n..]), (0, &h[..n], &bytes[n..total]));
            } else {
                assert_eq!(sent, Err(SendError::TooLarge(total)), "{path:?}");
            }
        }
    }
    fn long<'a>(head: &'a [u8], payload: &'a [u8]) -> Outgoing<'a> {
        Outgoing {
            head,
            payload: Payload::Private(payload),
            long_offset: Some(0),
            reply_to: None,
        }
    }
    for len in MAX_MSG..=MAX_MSG + 8 {
        let sent = a.try_send(1, &long(&bytes[..len], &[]));
        if len == MAX_MSG {
            assert_eq!(sent, Ok(()));
            assert_eq!(recv(&mut b), Some((0, bytes[..len].to_vec())));
        } else {
            assert_eq!(sent, Err(SendError::TooLarge(len)));
        }
    }
    let n = head(AmKind::Long, 4096, &mut h);
    for len in 4096..=4096 + 8 {
        let sent = a.try_send(1, &long(&h[..n], &bytes[..len]));
        if len == 4096 {
            assert_eq!(sent, Ok(()));
            assert_eq!(recv(&mut b), Some((0, h[..n].to_vec())));
            assert_eq!(&b.segment().to_vec()[..len], &bytes[..len]);
        } else {
            assert_eq!(sent, Err(SendError::TooLarge(len)));
        }
    }
    assert_eq!(
        poll_until(&mut b, Duration::from_millis(100)),
        (None, vec![])
    );
}

/// A peer that dies: its claims are skipped as the heads reach them, `PeerLost` is reported
/// once, and polling goes on.
mod dead_claimer {
    use super::*;
    use crate::velo::Meta;

    /// The pid of a process that has exited and been reaped.
    #[cfg(not(miri))]
    fn dead_pid() -> nix::unistd::Pid {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        nix::unistd::Pid::from_raw(pid)
    }

    fn trio() -> (Extoll, Extoll, Extoll) {
        let mut v = Extoll::cluster(3, 4096, super::super::hostile::small()).unwrap();
        let c = v.pop().unwrap();
        let b = v.pop().unwrap();
        (v.pop().unwrap(), b, c)
    }

    /// Rank 1 claims three slots in rank 0's mailbox for one message and two notification
    /// slots (its own and rank 0's) for an immediate put, publishes the first packet only,
    /// then dies.
    fn die_mid_message(b: &mut Extoll) {
        let mut t = [0u64; 3];
        b.tx.claim(0, &mut t).unwrap();
        let ring = b.tx.layout.mailbox();
        let first = Meta {
            src: 1,
            len: 8,
            flags: FIRST,
            rma_before: 0,
        };
        ring.publish(&b.tx.peers[0].imp, t[0], first.encode())
            .unwrap();
        let r = Reserved::try_new(&b.tx.layout, &b.tx.peers, 1, 0, &mut [0; 3]).unwrap();
        assert!(r.is_some(), "two notification slots claimed, never posted");
    }

    /// After the loss: rank 2's messages (VELO, and RMA behind the dead claim in the
    /// notification queue) arrive, and polling goes on with no more errors.
    fn survivors_flow(a: &mut Extoll, c: &mut Extoll, mut errors: Vec<TransportError>) {
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = head(AmKind::Short, 0, &mut h);
        c.try_send(0, &out(&h[..n], &[])).unwrap();
        let (got, e) = poll_until(a, patience(5));
        errors.extend(e);
        assert_eq!(got.map(|g| g.0), Some(2));
        assert_eq!(errors, vec![TransportError::PeerLost(1)]);
        c.set_medium(MediumPath::Rma);
        let m = head(AmKind::Medium, 700, &mut h);
        c.try_send(0, &out(&h[..m], &[7; 700])).unwrap();
        c.try_send(0, &out(&h[..n], &[])).unwrap();
        for want in [m + 700, n] {
            let (got, e) = poll_until(a, patience(5));
            assert_eq!(e, vec![], "PeerLost is reported once");
            assert_eq!(got.map(|(s, b)| (s, b.len())), Some((2, want)));
        }
        let (got, e) = poll_until(a, Duration::from_millis(300));
        assert_eq!((got, e), (None, vec![]), "polling goes on after PeerLost");
    }

    /// The real path: rank 1's process is gone (its pid reaped).
    #[cfg(not(miri))]
    #[test]
    fn slots_of_a_dead_claimer_are_skipped() {
        let (mut a, mut b, mut c) = trio();
        a.tx.pids[1] = Some(dead_pid());
        a.liveness = am_nic::Liveness::new(a.tx.pids.clone());
        die_mid_message(&mut b);
        survivors_flow(&mut a, &mut c, Vec::new());
        assert_eq!(
            a.note_head, 2,
            "the dead rank's notification slot skipped, rank 2's taken"
        );
    }

    /// The same with the loss declared as the liveness check would (no process to spawn),
    /// for Miri.
    #[test]
    fn a_peer_dying_mid_message_never_wedges_the_others() {
        let (mut a, mut b, mut c) = trio();
        die_mid_message(&mut b);
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = head(AmKind::Short, 0, &mut h);
        c.try_send(0, &out(&h[..n], &[])).unwrap();
        // Before the loss: the dead rank's claims are a live one's, and block.
        let (got, errors) = poll_until(&mut a, Duration::from_millis(300));
        assert_eq!((got, errors), (None, vec![]));
        a.declare_lost(1);
        // Reported once, and the dead claims are skipped as the head reaches them: the next
        // poll delivers, with no wait for a stalled-queue check.
        assert_eq!(
            a.poll_recv(|d, _, _| d.src),
            Err(TransportError::PeerLost(1))
        );
        assert_eq!(a.poll_recv(|d, _, _| d.src), Ok(Some(2)));
        survivors_flow(&mut a, &mut c, vec![TransportError::PeerLost(1)]);
        assert_eq!(
            a.note_head, 2,
            "the dead rank's notification slot skipped, rank 2's taken"
        );
    }

    /// A lost rank's record may vouch for any ticket: the head still never passes a ticket
    /// nobody published or skipped (the old record-based skip pushed it past the tail, and
    /// lost the next sender's message).
    #[test]
    fn a_lost_claimers_record_skips_nothing_unclaimed() {
        let (mut a, b, mut c) = trio();
        // Rank 1's records vouch for every ticket from 0, and it dies holding no claim.
        for q in [
            CLAIM_MAILBOX,
            crate::layout::CLAIM_NOTES,
            crate::layout::CLAIM_ENGINE,
        ] {
            b.tx.peers[0]
                .imp
                .store_word(b.tx.layout.claims(1, q), 1 << 63)
                .unwrap();
        }
        a.declare_lost(1);
        let (got, errors) = poll_until(&mut a, Duration::from_millis(300));
        assert_eq!((got, errors), (None, vec![TransportError::PeerLost(1)]));
        assert_eq!((a.head, a.note_head), (0, 0), "nothing was skipped");
        survivors_flow(&mut a, &mut c, vec![TransportError::PeerLost(1)]);
    }
}

/// With a pool: the senders share the receiver's buffers, each claimed for one Medium and
/// free again once it is read; a Medium that finds none free goes over VELO instead of
/// waiting. Every Medium arrives once, each source's in send order.
#[test]
fn a_pool_is_shared_and_a_medium_without_a_buffer_goes_over_velo() {
    let (mut a, mut b, mut c) = pooled_trio(2);
    let l = b.tx.layout;
    let claims = |b: &Extoll| -> Vec<u64> {
        (0..2)
            .map(|i| b.seg.load_word(l.pool_claim(i)).unwrap())
            .collect()
    };
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Medium, 600, &mut h);
    // Nobody polls meanwhile: the first Medium of each sender takes a buffer, the rest find
    // none and go over VELO (never Busy).
    for k in 0..3u8 {
        a.try_send(1, &out(&h[..n], &[k; 600])).unwrap();
        c.try_send(1, &out(&h[..n], &[100 + k; 600])).unwrap();
    }
    assert_eq!(claims(&b), vec![pool_claim(0, 0), pool_claim(2, 0)]);
    let mut got: HashMap<u32, Vec<(bool, u8)>> = HashMap::new();
    let deadline = Instant::now() + patience(10);
    while got.values().map(Vec::len).sum::<usize>() < 6 {
        assert!(Instant::now() < deadline, "not all delivered: {got:?}");
        let r = b
            .poll_recv(|d, _, _| {
                let shared = matches!(d.bytes, Received::Shared(_));
                let bytes = d.bytes.to_vec();
                assert_eq!(bytes.len(), n + 600);
                (d.src, shared, bytes[n])
            })
            .unwrap();
        match r {
            Some((src, shared, k)) => got.entry(src).or_default().push((shared, k)),
            None => b.wait(Duration::from_millis(5)).unwrap(),
        }
    }
    // In order per source; the pooled one lent from its buffer, the others reassembled.
    assert_eq!(got[&0], vec![(true, 0), (false, 1), (false, 2)]);
    assert_eq!(got[&2], vec![(true, 100), (false, 101), (false, 102)]);
    assert_eq!(claims(&b), vec![0, 0], "buffers freed once read");
    // Freed buffers are claimed again.
    a.try_send(1, &out(&h[..n], &[7; 600])).unwrap();
    assert!(claims(&b).contains(&pool_claim(0, 1)), "{:x?}", claims(&b));
    let (src, bytes) = recv(&mut b).expect("delivered");
    assert_eq!((src, bytes[n]), (0, 7));
    assert_eq!(claims(&b), vec![0, 0]);
}

/// Receive memory per rank at 4,096 and 65,536 peers: with buffers per connection it grows
/// by 16 RMA buffers per peer; with a pool (what dynamic credits choose) by the three lines
/// of words and the room waiter bit per peer alone.
#[test]
fn a_pool_keeps_receive_memory_from_growing_with_the_buffers() {
    let per_conn = ExtollConfig::default();
    let pooled =
        ExtollConfig::default().rma_pool(ExtollConfig::pool_for(am_core::Credits::DYNAMIC));
    assert_eq!(pooled.rma_pool, am_core::credit::DYNAMIC_BANK as usize);
    assert_eq!(ExtollConfig::pool_for(am_core::Credits::default()), 0);
    // What jobs get without AM_CREDITS: buffers per connection below the threshold, the
    // pool from it on.
    let from = am_core::credit::DYNAMIC_FROM_RANKS;
    let default = |ranks| ExtollConfig::pool_for(am_core::Credits::default_for_ranks(ranks));
    assert_eq!((default(from - 1), default(from)), (0, 32));
    for ranks in [4096usize, 65536] {
        let a = Layout::new(ranks, &per_conn, 0).unwrap().receive_bytes();
        let p = Layout::new(ranks, &pooled, 0).unwrap().receive_bytes();
        assert!(a > ranks * 16 * RMA_BUF, "{ranks}: {a}");
        // Words (3 lines and a room waiter bit per peer), mailbox, notification queue and
        // the pool.
        let want = ranks * 3 * 64 + ranks / 8 + 1024 * 64 + 1024 * 16 + pooled.rma_pool * RMA_BUF;
        assert!(p >= want && p < want + 4096, "{ranks}: {p} against {want}");
    }
    let p = Layout::new(4096, &pooled, 0).unwrap().receive_bytes();
    assert!(p <= 4 << 20, "{p} bytes at 4,096 peers");
}

/// A trio with a pool of `pool` buffers and Mediums of any size by RMA.
fn pooled_trio(pool: usize) -> (Extoll, Extoll, Extoll) {
    let config = ExtollConfig {
        rma_pool: pool,
        notify_slots: 16,
        mailbox_slots: 148,
        medium: crate::MediumPath::Rma,
        ..ExtollConfig::default()
    };
    let mut v = Extoll::cluster(3, 4096, config).unwrap();
    let c = v.pop().unwrap();
    let b = v.pop().unwrap();
    (v.pop().unwrap(), b, c)
}

/// One sender's pooled Mediums in flight together, in buffers out of index order (the
/// claims wrap around the pool): delivered in send order, every buffer freed.
#[test]
fn pooled_mediums_of_one_sender_keep_their_order() {
    let (mut a, mut b, _c) = pooled_trio(4);
    a.tx.pool_hint[1] = 3;
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Medium, 600, &mut h);
    for k in 0..3u8 {
        a.try_send(1, &out(&h[..n], &[k; 600])).unwrap();
    }
    let l = b.tx.layout;
    let claims = |b: &Extoll| -> Vec<u64> {
        (0..4)
            .map(|i| b.seg.load_word(l.pool_claim(i)).unwrap())
            .collect()
    };
    assert_eq!(
        claims(&b),
        vec![pool_claim(0, 1), pool_claim(0, 2), 0, pool_claim(0, 0)]
    );
    for k in 0..3u8 {
        let (src, bytes) = recv(&mut b).expect("delivered");
        assert_eq!((src, bytes[n], bytes.len()), (0, k, n + 600));
    }
    assert_eq!(claims(&b), vec![0; 4]);
}

/// A pool buffer claimed for a Medium whose notification finds no room is given back: the
/// send is back-pressure, and the pool holds no claim of it.
#[test]
fn a_claim_is_given_back_when_the_notification_queue_is_full() {
    let (mut a, b, c) = pooled_trio(2);
    // Rank 2's main thread holds every notification slot of rank 1.
    let _held = HeldNotes::claim(&c, 16);
    let l = c.tx.layout;
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Medium, 600, &mut h);
    assert_eq!(
        a.try_send(1, &out(&h[..n], &[1; 600])),
        Err(SendError::Busy)
    );
    for i in 0..2 {
        assert_eq!(b.seg.load_word(l.pool_claim(i)).unwrap(), 0);
    }
    assert_eq!(a.tx.dests[1].rma_sent, 0);
}

/// A lost rank's Medium that was notified before it died is delivered: the sweep frees only
/// its claims that no notification counted.
#[test]
fn a_lost_ranks_notified_pool_medium_is_delivered() {
    let (mut a, mut b, _c) = pooled_trio(2);
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Medium, 600, &mut h);
    a.try_send(1, &out(&h[..n], &[9; 600])).unwrap();
    b.drain_notes().unwrap();
    assert_eq!(b.rma_pending, 1);
    let l = b.tx.layout;
    // A claim of its that nothing notified (it died between claim and put).
    store_pool_claim(&b, 1, 1, pool_claim(0, 1));
    b.declare_lost(0);
    b.sweep_pool(true);
    assert_eq!(b.seg.load_word(l.pool_claim(0)).unwrap(), pool_claim(0, 0));
    assert_eq!(b.seg.load_word(l.pool_claim(1)).unwrap(), 0);
    let (got, errors) = poll_until(&mut b, patience(5));
    assert_eq!(errors, vec![TransportError::PeerLost(0)]);
    let (src, bytes) = got.expect("delivered");
    assert_eq!((src, bytes[n]), (0, 9));
    assert_eq!(b.seg.load_word(l.pool_claim(0)).unwrap(), 0);
}

/// A lost rank's Medium whose notification waits behind a live claimer's slot keeps its pool
/// buffer through the stalled-queue checks (the queue is not drained), and is delivered once
/// the claimer publishes.
#[test]
fn a_lost_ranks_pool_medium_behind_a_live_claim_keeps_its_buffer() {
    let (mut a, mut b, c) = pooled_trio(2);
    // Rank 2's main thread claims notification ticket 0 at rank 1 (a genuine claim) and
    // holds it.
    let held = HeldNotes::claim(&c, 1);
    let l = c.tx.layout;
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Medium, 600, &mut h);
    a.try_send(1, &out(&h[..n], &[5; 600])).unwrap();
    b.declare_lost(0);
    b.check(true);
    assert_eq!(b.seg.load_word(l.pool_claim(0)).unwrap(), pool_claim(0, 0));
    held.give_up(&c);
    let (got, errors) = poll_until(&mut b, patience(5));
    assert!(
        errors.iter().all(|e| *e == TransportError::PeerLost(0)),
        "{errors:?}"
    );
    let (src, bytes) = got.expect("delivered");
    assert_eq!((src, bytes[n]), (0, 5));
    assert_eq!(b.seg.load_word(l.pool_claim(0)).unwrap(), 0);
}
