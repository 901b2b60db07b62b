//! Hostile peers: for each word rank 0 can write in rank 1's segment, a corrupt value is
//! a typed error naming rank 0 (or is harmless), nothing is delivered from it, and rank
//! 2's messages still arrive.

use super::tests::{head, out, pair, reply};
use super::*;
use am_core::wire::MAX_HEAD_LEN;
use am_core::{AmKind, Category};
use proptest::prelude::*;

fn trio() -> (Sci, Sci, Sci) {
    let config = SciConfig {
        slots: 2,
        ..SciConfig::default()
    };
    let mut v = Sci::cluster(3, 4096, config).unwrap();
    let c = v.pop().unwrap();
    let b = v.pop().unwrap();
    (v.pop().unwrap(), b, c)
}

/// Rings rank 1 as rank 0 does after writing into its slots: its ringer bit, then the flag
/// with its ringer word's tag.
fn ring_from_0(a: &Sci) {
    let (w, bit) = crate::layout::ringer_bit(0);
    let peer = &a.tx.peers[1];
    peer.fetch_or_word(a.tx.layout.ringer_word(w), bit).unwrap();
    let _ = peer.ring_tagged(MEF, am_shm::doorbell::tag(w)).unwrap();
}

/// Rank 2 sends a Medium "good" to rank 1; rank 1 must get it (within a few bounded
/// polls and waits), whatever rank 0 did before.
fn good_still_arrives(b: &mut Sci, c: &mut Sci) {
    send_good(c);
    good_arrives(b);
}

fn send_good(c: &mut Sci) {
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Medium, 4, &mut h);
    c.try_send(1, &out(&h[..n], b"good")).unwrap();
}

/// Rank 1 gets rank 2's "good" within a few bounded polls and waits.
fn good_arrives(b: &mut Sci) {
    let n = head(
        Category::Request,
        AmKind::Medium,
        4,
        &mut [0u8; MAX_HEAD_LEN],
    );
    for _ in 0..50 {
        match b.poll_recv(|d, _, _| (d.src, d.bytes.to_vec())) {
            Ok(Some((2, bytes))) => {
                assert_eq!(&bytes[n..], b"good");
                return;
            }
            Ok(Some((src, _))) => panic!("a message from rank {src} was delivered"),
            Ok(None) | Err(_) => b.wait(Duration::from_millis(20)).unwrap(),
        }
    }
    panic!("rank 2's message did not arrive");
}

#[test]
fn a_length_past_the_slot_is_an_error_naming_the_sender() {
    let (a, mut b, mut c) = trio();
    let chan = a.tx.layout.command_segment(0);
    let peer = &a.tx.peers[1];
    peer.write(chan.data + 8, &(chan.capacity() as u32 + 1).to_le_bytes())
        .unwrap();
    chan.publish(peer, 0, 1).unwrap();
    ring_from_0(&a);
    let mut delivered = false;
    let r = b.poll_recv(|_, _, _| delivered = true);
    assert!(
        matches!(r, Err(TransportError::PeerMisbehaved { peer: Some(0), .. })),
        "{r:?}"
    );
    assert!(!delivered);
    good_still_arrives(&mut b, &mut c);
}

/// A stamp that is not the next one, in any slot of the sender's command segment, is
/// never delivered.
#[test]
fn a_forged_stamp_is_never_delivered() {
    let (a, mut b, mut c) = trio();
    let chan = a.tx.layout.command_segment(0);
    let peer = &a.tx.peers[1];
    for slot in 0..4 {
        chan.write(peer, slot, 0, &[&[0xEE; 12]]).unwrap();
        chan.publish(peer, slot, 7 + slot as u64).unwrap();
    }
    ring_from_0(&a);
    for _ in 0..3 {
        assert!(b.poll_recv(|d, _, _| d.src).unwrap().is_none());
        b.take_exist_flag().unwrap();
    }
    good_still_arrives(&mut b, &mut c);
}

/// A reply that says it answers more requests than were sent, or more than there are
/// slots, is an error naming its sender, delivers nothing and frees no slot.
#[test]
fn a_reply_answering_requests_never_sent_is_an_error() {
    for claimed in [2usize, 3, 200] {
        let (mut a, mut b, mut c) = trio();
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = head(Category::Request, AmKind::Short, 0, &mut h);
        // Rank 1 sends one request to rank 0; rank 0 answers "claimed" of them.
        b.try_send(0, &out(&h[..n], &[])).unwrap();
        let chan = a.tx.layout.command_segment(0);
        let peer = &a.tx.peers[1];
        let mut r = [0u8; MAX_HEAD_LEN];
        let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
        write_slot(
            peer,
            chan.base(2).unwrap(),
            answers_flag(claimed),
            &r[..rn],
            Payload::EMPTY,
        )
        .unwrap();
        chan.publish(peer, 2, 1).unwrap();
        ring_from_0(&a);
        let mut delivered = false;
        let got = b.poll_recv(|_, _, _| delivered = true);
        assert!(
            matches!(
                got,
                Err(TransportError::PeerMisbehaved { peer: Some(0), .. })
            ),
            "{claimed}: {got:?}"
        );
        assert!(!delivered, "{claimed}");
        // The one request slot toward rank 0 is still busy (two slots: one free).
        b.try_send(0, &out(&h[..n], &[])).unwrap();
        assert_eq!(
            b.try_send(0, &out(&h[..n], &[])),
            Err(SendError::Busy),
            "{claimed}"
        );
        good_still_arrives(&mut b, &mut c);
        let _ = &mut a;
    }
}

/// A sender that reuses a request slot before its reply (more requests in flight than
/// it has slots) is an error naming it.
#[test]
fn more_requests_than_slots_is_an_error() {
    let (a, mut b, mut c) = trio();
    let chan = a.tx.layout.command_segment(0);
    let peer = &a.tx.peers[1];
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Short, 0, &mut h);
    // Stamps 1, 2 in request slots 0, 1, then 3 in slot 0 again, no reply between.
    let mut errors = Vec::new();
    for (seq, slot) in [(1u64, 0usize), (2, 1), (3, 0)] {
        write_slot(peer, chan.base(slot).unwrap(), 0, &h[..n], Payload::EMPTY).unwrap();
        chan.publish(peer, slot, seq).unwrap();
        ring_from_0(&a);
        match b.poll_recv(|d, _, _| d.src) {
            Ok(_) => {}
            Err(e) => errors.push(e),
        }
    }
    assert!(
        matches!(
            errors[..],
            [TransportError::PeerMisbehaved { peer: Some(0), .. }]
        ),
        "{errors:?}"
    );
    good_still_arrives(&mut b, &mut c);
}

/// A take count forged to look unchanged makes rank 2 skip its ring: rank 1 still
/// finds the message (its idle look at the slots of every sender it has heard from).
#[test]
fn a_forged_take_count_delays_but_never_strands() {
    let (mut a, mut b, mut c) = trio();
    // Rank 1 has heard from rank 2 (its first message rings whatever the count).
    let at = c.tx.layout.taken(1);
    c.seg.import().store_word(at, 5).unwrap();
    c.tx.dests[1].rung = 5;
    good_still_arrives(&mut b, &mut c);
    // Rank 1 takes its flag (and clears rank 2's ringer bit); rank 2's count is forged to
    // look as it did when it last rang, so it does not ring again.
    b.take_exist_flag().unwrap();
    c.seg.import().store_word(at, 5).unwrap();
    // Rank 1's last message is rank 0's, so its idle poll looks at rank 0's slots first.
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Short, 0, &mut h);
    a.try_send(1, &out(&h[..n], &[])).unwrap();
    assert_eq!(b.poll_recv(|d, _, _| d.src).unwrap(), Some(0));
    b.take_exist_flag().unwrap();
    send_good(&mut c);
    assert_eq!(
        b.seg.doorbell(MEF).unwrap().peek_tags(),
        0,
        "it did not ring"
    );
    good_arrives(&mut b);
}

/// A rank whose first message finds a take count forged to look unchanged rings anyway:
/// its receiver, which never heard from it, does not look at its slots otherwise.
#[test]
fn a_first_message_rings_whatever_the_take_count() {
    let (_a, b, mut c) = trio();
    let at = c.tx.layout.taken(1);
    c.seg.import().store_word(at, u64::MAX).unwrap();
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Short, 0, &mut h);
    c.try_send(1, &out(&h[..n], &[])).unwrap();
    let (w, bit) = crate::layout::ringer_bit(2);
    assert_eq!(
        b.seg.load_word(b.tx.layout.ringer_word(w)).unwrap(),
        bit,
        "its ringer bit"
    );
    assert_ne!(b.seg.doorbell(MEF).unwrap().peek_tags(), 0);
}

/// A sender that restarts at slot 0 when its last request was not lone (breaking the
/// rule, or with the flag forged) is not looked for there first, and is still found.
#[test]
fn a_restart_the_receiver_does_not_expect_is_found_in_order() {
    let (_a, mut b, mut c) = trio();
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(Category::Request, AmKind::Medium, 4, &mut h);
    let mut r = [0u8; MAX_HEAD_LEN];
    let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
    // Rank 2's three requests go in turn (slots 0, 1 and 0 again, the last two not
    // lone: the third is sent after the first's reply, before the second's); all
    // answered.
    let answer = |b: &mut Sci| {
        let route = b.poll_recv(|d, _, _| d.route).unwrap().unwrap();
        b.try_send(2, &reply(&r[..rn], &[], route)).unwrap();
    };
    c.try_send(1, &out(&h[..n], b"turn")).unwrap();
    c.try_send(1, &out(&h[..n], b"turn")).unwrap();
    answer(&mut b);
    assert!(c.poll_recv(|_, _, _| ()).unwrap().is_some());
    c.try_send(1, &out(&h[..n], b"turn")).unwrap();
    answer(&mut b);
    answer(&mut b);
    while c.poll_recv(|_, _, _| ()).unwrap().is_some() {}
    assert!(
        b.tx.recv[2].req == 1 && !b.tx.recv[2].lone,
        "expects slot 1 only"
    );
    c.tx.dests[1].last_lone = true;
    // The restart (slot 0), then one in turn (slot 1, the stamp after it).
    c.try_send(1, &out(&h[..n], b"rst0")).unwrap();
    c.try_send(1, &out(&h[..n], b"rst1")).unwrap();
    assert_eq!(c.tx.dests[1].next_req, 0, "slots 0 and 1 taken");
    // Not looked for in slot 0, and the later one in slot 1 not taken early.
    assert!(b.poll_recv(|_, _, _| ()).unwrap().is_none());
    let mut got = Vec::new();
    for _ in 0..50 {
        match b.poll_recv(|d, _, _| (d.src, d.bytes.to_vec())) {
            Ok(Some((2, bytes))) => got.push(bytes[n..].to_vec()),
            Ok(Some((src, _))) => panic!("a message from rank {src} was delivered"),
            Ok(None) | Err(_) if got.len() == 2 => break,
            Ok(None) | Err(_) => b.wait(Duration::from_millis(20)).unwrap(),
        }
    }
    assert_eq!(got, [b"rst0".to_vec(), b"rst1".to_vec()], "both, in order");
}

/// Garbage on the message-exist flag (any tags) costs looks at the ringer words, nothing
/// else.
#[test]
fn garbage_on_the_message_exist_flag_is_harmless() {
    let (a, mut b, mut c) = trio();
    let _ = a.tx.peers[1].ring_tagged(MEF, u32::MAX).unwrap();
    assert!(b.poll_recv(|d, _, _| d.src).unwrap().is_none());
    good_still_arrives(&mut b, &mut c);
}

/// Any AM head and flags in a published slot reach the core as bytes to check (its
/// own hostile-peer tests cover the decoding); the transport only lends the checked
/// length, as a view.
#[test]
fn garbage_heads_are_lent_within_the_slot() {
    let (a, mut b, mut c) = trio();
    let chan = a.tx.layout.command_segment(0);
    let peer = &a.tx.peers[1];
    chan.write(peer, 0, u32::MAX, &[&[0xFF; 40]]).unwrap();
    chan.publish(peer, 0, 1).unwrap();
    ring_from_0(&a);
    let got = b.poll_recv(|d, _, _| (d.src, d.bytes.len())).unwrap();
    assert_eq!(got, Some((0, 40)));
    good_still_arrives(&mut b, &mut c);
}

proptest! {
    /// Garbage in a published slot is an error for that message, never a panic.
    #[test]
    fn corrupt_slot_header_is_checked(len in any::<u32>(), flags in any::<u32>()) {
        let (a, mut b) = pair(2);
        let chan = a.tx.layout.command_segment(0);
        let peer = &a.tx.peers[1];
        let mut hdr = [0u8; 8];
        hdr[..4].copy_from_slice(&len.to_le_bytes());
        hdr[4..].copy_from_slice(&flags.to_le_bytes());
        peer.write(chan.data + 8, &hdr).unwrap();
        chan.publish(peer, 0, 1).unwrap();
        let _ = peer.ring(MEF).unwrap();
        let r = b.poll_recv(|d, _, _| d.bytes.len());
        if len as usize <= chan.capacity() {
            prop_assert_eq!(r.unwrap(), Some(len as usize));
        } else {
            let named = matches!(r, Err(TransportError::PeerMisbehaved { peer: Some(0), .. }));
            prop_assert!(named, "{:?}", r);
        }
    }
}

/// The slot-length check at its boundary, which one byte past and the proptest's
/// any length seldom probe: a body of exactly the slot's capacity is lent whole and
/// no further; a length one to eight bytes past it is an error naming the sender,
/// nothing is delivered, and rank 2's message still arrives.
#[test]
fn lengths_at_and_just_past_the_slot_capacity() {
    for over in 0..=8 {
        let (a, mut b, mut c) = trio();
        let chan = a.tx.layout.command_segment(0);
        let peer = &a.tx.peers[1];
        let cap = chan.capacity();
        let body: Vec<u8> = (0..cap).map(|i| i as u8 | 0x80).collect();
        chan.write(peer, 0, 0, &[&body]).unwrap();
        if over > 0 {
            peer.write(chan.data + 8, &((cap + over) as u32).to_le_bytes())
                .unwrap();
        }
        chan.publish(peer, 0, 1).unwrap();
        ring_from_0(&a);
        let mut delivered = None;
        let r = b.poll_recv(|d, _, _| delivered = Some((d.src, d.bytes.to_vec())));
        if over == 0 {
            assert!(matches!(r, Ok(Some(()))), "{r:?}");
            assert_eq!(delivered, Some((0, body)));
        } else {
            assert!(
                matches!(r, Err(TransportError::PeerMisbehaved { peer: Some(0), .. })),
                "{over}: {r:?}"
            );
            assert_eq!(delivered, None, "{over}");
        }
        good_still_arrives(&mut b, &mut c);
    }
}
