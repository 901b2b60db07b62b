//! Hostile peers: for each word a peer can write in a rank's segment, rank 0 writes a value
//! the protocol never produces into rank 1's. Each test asserts the typed error
//! (`PeerMisbehaved`, naming the peer where the word says who wrote it), that nothing was
//! delivered from it or written outside its range, and that rank 2's messages (over VELO and
//! by RMA buffer) still arrive. Heap clusters, bounded waits: Miri runs them.

use super::tests::{head, out, patience, poll_for_errors, poll_until, store_pool_claim};
use super::*;
use crate::layout::ABORT;
use crate::layout::{
    notes_claimer, CLAIM_ENGINE, MAILBOX_HEAD, MAILBOX_TAIL, NOTIFY_HEAD, NOTIFY_TAIL,
};
use am_core::wire::MAX_HEAD_LEN;
use am_core::AmKind;
use am_shm::mailbox::OWNER;

/// The smallest geometry that carries every message: Miri-sized.
pub(super) fn small() -> ExtollConfig {
    ExtollConfig {
        mailbox_slots: 148,
        notify_slots: 16,
        rma_buffers: 2,
        max_long: 4096,
        ..ExtollConfig::default()
    }
}

fn trio_with(config: ExtollConfig) -> (Extoll, Extoll, Extoll) {
    let mut v = Extoll::cluster(3, 4096, config).unwrap();
    let c = v.pop().unwrap();
    let b = v.pop().unwrap();
    (v.pop().unwrap(), b, c)
}

fn trio() -> (Extoll, Extoll, Extoll) {
    trio_with(small())
}

/// The cases a test runs: all of them natively; under Miri, where each case costs a
/// three-rank cluster (seconds), the first and the last. Every case reaches the same
/// `am-shm` code (the crate forbids `unsafe`); the values only steer the checks, which
/// `cargo test` runs in full.
fn cases<T>(all: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut v: Vec<T> = all.into_iter().collect();
    if cfg!(miri) && v.len() > 2 {
        let last = v.pop().unwrap();
        v.truncate(1);
        v.push(last);
    }
    v
}

/// `PeerMisbehaved` naming `peer`.
fn named(e: &TransportError, peer: Option<Rank>) -> bool {
    matches!(e, TransportError::PeerMisbehaved { peer: p, .. } if *p == peer)
}

/// Exactly one error, `PeerMisbehaved` naming `peer`.
#[track_caller]
fn one_naming(errors: &[TransportError], peer: Option<Rank>) {
    assert!(
        matches!(errors, [e] if named(e, peer)),
        "want one PeerMisbehaved naming {peer:?}: {errors:?}"
    );
}

/// Rank 2 sends rank 1 a Medium over VELO, then one by RMA buffer: rank 1 gets both, in
/// order, and nothing from anyone else. The errors met on the way.
#[track_caller]
fn good_still_arrives(b: &mut Extoll, c: &mut Extoll) -> Vec<TransportError> {
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Medium, 4, &mut h);
    c.set_medium(MediumPath::Velo);
    c.try_send(1, &out(&h[..n], b"good")).unwrap();
    c.set_medium(MediumPath::Rma);
    c.try_send(1, &out(&h[..n], b"rma!")).unwrap();
    c.set_medium(c.config().medium);
    let mut errors = Vec::new();
    for want in [b"good", b"rma!"] {
        let (got, e) = poll_until(b, patience(5));
        errors.extend(e);
        let (src, bytes) = got.expect("rank 2's message did not arrive");
        assert_eq!(src, 2, "a message from rank {src} was delivered");
        assert_eq!(&bytes[n..], want);
    }
    errors
}

/// One poll of `b` is refused with `PeerMisbehaved` naming `peer`, and delivers nothing
/// (`case` names the case in a failure).
#[track_caller]
fn one_poll_refused(b: &mut Extoll, peer: Option<Rank>, case: impl std::fmt::Display) {
    let mut delivered = false;
    let r = b.poll_recv(|_, _, _| delivered = true);
    assert!(matches!(&r, Err(e) if named(e, peer)), "{case}: {r:?}");
    assert!(!delivered, "{case}");
}

/// Nothing was written into `x`'s AM segment.
#[track_caller]
fn segment_untouched(x: &Extoll) {
    assert!(x.segment().to_vec().iter().all(|&b| b == 0));
}

/// Rank `as_rank` (through `x`'s maps) claims a slot of rank `to`'s mailbox, writes `data`,
/// publishes `meta` and releases: a packet made by hand. Its ticket.
fn publish(x: &Extoll, to: usize, as_rank: usize, data: &[u8], meta: u32) -> u64 {
    let l = x.tx.layout;
    let ring = l.mailbox();
    let p = &x.tx.peers[to];
    let record = l.claims(as_rank, CLAIM_MAILBOX);
    let mut t = [0u64; 1];
    assert!(ring
        .try_claim(&p.seg, 1, as_rank as u32, record, &mut 0, &mut t)
        .unwrap());
    ring.write(&p.imp, t[0], 0, data).unwrap();
    ring.publish(&p.imp, t[0], meta).unwrap();
    ring.release(&p.imp, record).unwrap();
    t[0]
}

fn meta(len: usize, flags: u32, rma_before: u32) -> u32 {
    Meta {
        src: 0,
        len,
        flags,
        rma_before,
    }
    .encode()
}

/// A well-formed 12-byte head (a Short request to handler 1).
fn short_head() -> Vec<u8> {
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Short, 0, &mut h);
    h[..n].to_vec()
}

/// Stores `value` as the status word of `ticket` of `ring` in rank `to`'s segment.
fn store_status(x: &Extoll, to: usize, ring: &Ring, ticket: u64, value: u64) {
    x.tx.peers[to]
        .imp
        .store_slot_word(ring.slot_base(ticket) + ring.capacity(), value)
        .unwrap();
}

/// A `CLAIMED` status of lap 0 naming `who`, as the ring writes it.
fn claimed(who: u32) -> u64 {
    (who as u64) << 32 | 1 << 30 | 1
}

/// Rank `claimer_rank`'s engine (through `x`'s maps) posts `meta` and `value` into rank
/// `to`'s notification queue.
fn post_raw(x: &Extoll, to: usize, claimer_rank: usize, meta: u32, value: u64) {
    let l = x.tx.layout;
    let ring = l.notifications();
    let p = &x.tx.peers[to];
    let record = l.claims(claimer_rank, CLAIM_ENGINE);
    let me = notes_claimer(claimer_rank, true);
    let mut t = [0u64; 1];
    assert!(ring
        .try_claim(&p.seg, 1, me, record, &mut 0, &mut t)
        .unwrap());
    ring.write(&p.imp, t[0], 0, &value.to_le_bytes()).unwrap();
    ring.publish(&p.imp, t[0], meta).unwrap();
    ring.release(&p.imp, record).unwrap();
}

// ---- VELO mailbox: slot status and meta ----

/// A status no lap writes (a stamp of no lap, a state no claimer writes): an error naming
/// nobody (any peer can write a status), the slot repaired and skipped.
#[test]
fn a_corrupt_mailbox_status_is_skipped_and_reported() {
    for value in cases([0xdead_0000_0007u64, 1, u64::MAX]) {
        let (a, mut b, mut c) = trio();
        let ring = a.tx.layout.mailbox();
        store_status(&a, 1, &ring, 0, value);
        one_poll_refused(&mut b, None, format_args!("{value:#x}"));
        assert_eq!(b.head, 1, "{value:#x}: consumed");
        assert_eq!(ring.look(&b.seg, 0).unwrap(), Seen::Skipped(OWNER));
        assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
        segment_untouched(&b);
    }
}

#[test]
fn a_packet_from_outside_the_job_is_refused() {
    let (a, mut b, mut c) = trio();
    let m = Meta {
        src: 9,
        len: 12,
        flags: FIRST | LAST,
        rma_before: 0,
    };
    publish(&a, 1, 0, &short_head(), m.encode());
    one_poll_refused(&mut b, None, "");
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
}

/// The deliberate bug: VELO's packet-length check against the packet size removed,
/// the one-packet path then lends bytes of the neighbouring slots (here rank 2's message,
/// published just after). A length past the packet is refused, naming its source, and
/// nothing is lent; a message of several packets whose first one lies is dropped whole.
#[test]
fn a_packet_length_past_the_packet_is_refused_not_lent() {
    for packet_size in [64usize, 128] {
        let cap = packet_size - STATUS_LEN;
        for len in [cap + 1, 127] {
            let config = ExtollConfig {
                packet_size,
                ..small()
            };
            let (a, mut b, mut c) = trio_with(config);
            publish(&a, 1, 0, &vec![0xAA; cap], meta(len, FIRST | LAST, 0));
            let mut h = [0u8; MAX_HEAD_LEN];
            let n = head(AmKind::Medium, 4, &mut h);
            c.try_send(1, &out(&h[..n], b"next")).unwrap();
            let mut delivered = None;
            let r = b.poll_recv(|d, _, _| delivered = Some((d.src, d.bytes.len())));
            assert!(
                matches!(&r, Err(e) if named(e, Some(0))),
                "{packet_size}/{len}: {r:?}"
            );
            assert_eq!(delivered, None, "{packet_size}/{len}: lent");
            let (got, errors) = poll_until(&mut b, patience(5));
            assert_eq!(errors, vec![]);
            assert_eq!(got.map(|(s, m)| (s, m.len())), Some((2, n + 4)));
            // The first packet of a longer message lies: it and the rest of its message go,
            // with one error.
            publish(&a, 1, 0, &vec![0xAA; cap], meta(len, FIRST, 0));
            publish(&a, 1, 0, &[1; 8], meta(8, LAST, 0));
            let r = b.poll_recv(|d, _, _| d.src);
            assert!(matches!(&r, Err(e) if named(e, Some(0))), "{r:?}");
            assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
        }
    }
}

/// The meta's length field is 7 bits: no packet can announce more.
const MAX_META_LEN: usize = 0x7f;

/// One to eight bytes past `limit`: every length natively, the two ends under Miri (where a
/// case costs seconds).
fn just_past(limit: usize) -> Vec<usize> {
    if cfg!(miri) {
        vec![limit + 1, limit + 8]
    } else {
        (limit + 1..=limit + 8).collect()
    }
}

/// `PeerMisbehaved` naming rank 0 with the framing's own error `bad`: for a length, the
/// check of the meta against the packet refused it, before the slot's check was reached.
fn refused_with(r: &Result<Option<()>, TransportError>, bad: &FrameError) -> bool {
    let want = format!("extoll: {bad}");
    matches!(r, Err(TransportError::PeerMisbehaved { peer: Some(0), what }) if *what == want)
}

/// The packet-length check at its boundary, which the wild lengths above do not probe (the
/// slot's own check refuses those too, so they cannot tell whether the meta check did).
/// A packet of exactly the capacity is lent whole and no further, alone or as the first of
/// two; each length from one to eight bytes past it (as far as the meta's field goes) is
/// refused by the meta check, naming its source and saying the length and the capacity,
/// whether it is a whole message, its first packet or a later one, nothing is lent, and
/// rank 2's messages still arrive.
#[test]
fn packet_lengths_at_and_just_past_the_capacity() {
    for packet_size in [64usize, 128] {
        let cap = packet_size - STATUS_LEN;
        let config = ExtollConfig {
            packet_size,
            ..small()
        };
        let (a, mut b, mut c) = trio_with(config);
        let full: Vec<u8> = (0..cap).map(|i| i as u8 | 0x80).collect();
        publish(&a, 1, 0, &full, meta(cap, FIRST | LAST, 0));
        let got = b.poll_recv(|d, _, _| (d.src, d.bytes.to_vec())).unwrap();
        assert_eq!(
            got,
            Some((0, full.clone())),
            "{packet_size}: one full packet"
        );
        publish(&a, 1, 0, &full, meta(cap, FIRST, 0));
        publish(&a, 1, 0, &[7; 8], meta(8, LAST, 0));
        let (got, errors) = poll_until(&mut b, patience(5));
        assert_eq!(errors, vec![]);
        let whole = [&full[..], &[7; 8]].concat();
        assert_eq!(got, Some((0, whole)), "{packet_size}: a full first packet");
        assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
        segment_untouched(&b);

        for len in just_past(cap)
            .into_iter()
            .filter(|&len| len <= MAX_META_LEN)
        {
            let bad = FrameError::BadLength { len, cap };
            let (a, mut b, mut c) = trio_with(config);
            let mut delivered = None;
            let mut poll = |b: &mut Extoll| {
                b.poll_recv(|d, _, _| delivered = Some((d.src, d.bytes.len())))
                    .map(|r| r.map(drop))
            };
            // A whole message.
            publish(&a, 1, 0, &vec![0xAA; cap], meta(len, FIRST | LAST, 0));
            let r = poll(&mut b);
            assert!(refused_with(&r, &bad), "{packet_size}/{len}: {r:?}");
            // The first packet of two: the second goes with it, in silence.
            publish(&a, 1, 0, &vec![0xAA; cap], meta(len, FIRST, 0));
            publish(&a, 1, 0, &[1; 8], meta(8, LAST, 0));
            let r = poll(&mut b);
            assert!(refused_with(&r, &bad), "{packet_size}/{len}: {r:?}");
            // The last packet of a message started well: the message goes.
            publish(&a, 1, 0, &full, meta(cap, FIRST, 0));
            publish(&a, 1, 0, &vec![0xAA; cap], meta(len, LAST, 0));
            let r = poll(&mut b);
            assert!(refused_with(&r, &bad), "{packet_size}/{len}: {r:?}");
            assert_eq!(delivered, None, "{packet_size}/{len}: lent");
            assert_eq!(b.head, 5, "{packet_size}/{len}: every packet consumed");
            assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
            segment_untouched(&b);
        }
    }
}

/// The limit of a message of several packets at its boundary: one of exactly the largest
/// message a rank sends (every slot of the mailbox, the last one part full) is delivered
/// whole; one to eight bytes more is refused at its last packet, naming its source, nothing
/// is delivered, and rank 2's messages still arrive.
#[test]
fn message_lengths_at_and_just_past_the_largest() {
    let cap = small().packet_size - STATUS_LEN;
    // Under Miri one length past (each case fills all 148 slots; the refusal at the last
    // packet is the same for all eight, and `framing_errors_drop_one_message_each` fills
    // the mailbox once more).
    let past = if cfg!(miri) {
        vec![MAX_MSG + 8]
    } else {
        just_past(MAX_MSG)
    };
    for total in std::iter::once(MAX_MSG).chain(past) {
        let (a, mut b, mut c) = trio();
        let bytes: Vec<u8> = (0..total).map(|i| (i % 251) as u8).collect();
        let n = bytes.len().div_ceil(cap);
        assert_eq!(n, 148, "the mailbox holds the whole message");
        for (i, part) in bytes.chunks(cap).enumerate() {
            let first = if i == 0 { FIRST } else { 0 };
            let last = if i + 1 == n { LAST } else { 0 };
            publish(&a, 1, 0, part, meta(part.len(), first | last, 0));
        }
        let mut delivered = None;
        let r = b.poll_recv(|d, _, _| delivered = Some((d.src, d.bytes.to_vec())));
        if total == MAX_MSG {
            assert!(matches!(r, Ok(Some(()))), "{r:?}");
            assert_eq!(delivered, Some((0, bytes)));
        } else {
            let bad = FrameError::TooLong {
                src: 0,
                max: MAX_MSG,
            };
            assert!(refused_with(&r, &bad), "{total}: {r:?}");
            assert_eq!(delivered, None, "{total}: delivered");
        }
        assert_eq!(b.head, 148, "{total}: every packet consumed");
        assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
        segment_untouched(&b);
    }
}

/// Packets that break the framing: each drops one message with one error naming its
/// source.
#[test]
fn framing_errors_drop_one_message_each() {
    // A data packet with no message in progress.
    let (a, mut b, mut c) = trio();
    publish(&a, 1, 0, &[1; 5], meta(5, LAST, 0));
    let r = b.poll_recv(|d, _, _| d.src);
    assert!(matches!(&r, Err(e) if named(e, Some(0))), "{r:?}");
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);

    // A first packet while rank 0's previous message is unfinished: that one is dropped,
    // this one starts the next (and is a message of its own).
    let (a, mut b, mut c) = trio();
    publish(&a, 1, 0, &[3; 56], meta(56, FIRST, 0));
    let h = short_head();
    publish(&a, 1, 0, &h, meta(h.len(), FIRST | LAST, 0));
    let r = b.poll_recv(|d, _, _| d.src);
    assert!(matches!(&r, Err(e) if named(e, Some(0))), "{r:?}");
    let got = b.poll_recv(|d, _, _| (d.src, d.bytes.to_vec())).unwrap();
    assert_eq!(got, Some((0, h.clone())));
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);

    // "Wait for the RMA put" on a message that is not a placed Long.
    let (a, mut b, mut c) = trio();
    publish(&a, 1, 0, &h, meta(h.len(), FIRST | LAST | RMA_WAIT, 0));
    let r = b.poll_recv(|d, _, _| d.src);
    assert!(matches!(&r, Err(e) if named(e, Some(0))), "{r:?}");
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);

    // A message longer than any rank sends (every slot of the mailbox, never a last one).
    let (a, mut b, mut c) = trio();
    publish(&a, 1, 0, &[4; 56], meta(56, FIRST, 0));
    for _ in 1..148 {
        publish(&a, 1, 0, &[4; 56], meta(56, 0, 0));
    }
    let r = b.poll_recv(|d, _, _| d.src);
    assert!(matches!(&r, Err(e) if named(e, Some(0))), "{r:?}");
    assert_eq!(b.head, 148);
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
    segment_untouched(&b);
}

/// The bug (a): one packet whose RMA-before count can never be satisfied blocked the
/// shared mailbox for every sender, with no error. A count ahead of the RMA buffers a source
/// may have in flight is refused at once.
#[test]
fn an_rma_before_count_ahead_of_the_buffers_is_refused_at_once() {
    for rma_before in cases([3u32, 5, 31]) {
        let (a, mut b, mut c) = trio();
        let h = short_head();
        publish(&a, 1, 0, &h, meta(h.len(), FIRST | LAST, rma_before));
        one_poll_refused(&mut b, Some(0), format_args!("{rma_before}"));
        assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
    }
}

/// Bug (a), the subtle case: a count within the buffers, but no RMA Medium was ever sent
/// (its completer notification, published before the packet, is not in the drained
/// queue): dropped at the stalled-mailbox check, and the messages behind it flow.
#[test]
fn a_wait_for_an_rma_medium_never_sent_ends() {
    let (a, mut b, mut c) = trio();
    let h = short_head();
    publish(&a, 1, 0, &h, meta(h.len(), FIRST | LAST, 1));
    one_naming(&good_still_arrives(&mut b, &mut c), Some(0));
    let (got, errors) = poll_until(&mut b, Duration::from_millis(300));
    assert_eq!((got, errors), (None, vec![]));
}

/// A Long head whose payload's completer notification never came: the same.
#[test]
fn a_long_whose_payload_never_landed_ends() {
    let (a, mut b, mut c) = trio();
    let h = short_head();
    publish(
        &a,
        1,
        0,
        &h,
        meta(h.len(), FIRST | LAST | PLACED | RMA_WAIT, 0),
    );
    one_naming(&good_still_arrives(&mut b, &mut c), Some(0));
    segment_untouched(&b);
}

/// Garbage payload bytes are the core's to refuse (its wire checks): the transport lends
/// exactly the packet's length, from the slot, and nothing past it.
#[test]
fn garbage_in_a_slot_is_lent_within_its_length() {
    let (a, mut b, mut c) = trio();
    publish(&a, 1, 0, &[0xFF; 56], meta(40, FIRST | LAST, 0));
    let got = b.poll_recv(|d, _, _| (d.src, d.bytes.to_vec())).unwrap();
    assert_eq!(got, Some((0, vec![0xFF; 40])));
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
}

// ---- VELO mailbox: tail and head words ----

/// The tail is a hint: any value costs a walk, never an overwrite. One a little ahead
/// leaves holes, which the owner fills in one pass (reporting the run once) at its
/// stalled-mailbox check.
#[test]
fn a_corrupt_mailbox_tail_costs_a_walk_and_holes_are_filled() {
    for tail in cases([1u64 << 40, u64::MAX / 2, u64::MAX]) {
        let (a, mut b, mut c) = trio();
        a.tx.peers[1].imp.store_word(MAILBOX_TAIL, tail).unwrap();
        assert_eq!(good_still_arrives(&mut b, &mut c), vec![], "tail {tail}");
    }
    let (a, mut b, mut c) = trio();
    a.tx.peers[1].imp.store_word(MAILBOX_TAIL, 3).unwrap();
    let errors = good_still_arrives(&mut b, &mut c);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors.iter().all(|e| named(e, None)), "{errors:?}");
    assert!(format!("{errors:?}").contains("3 holes"), "{errors:?}");
    assert_eq!(b.head, 4);
}

/// Our head words are ours: a peer that rewrites one (which would keep senders from room,
/// or send them laps ahead) finds it put back at the stalled-queue check, reported. A
/// sender whose cached head was poisoned by one recovers after one error.
#[test]
fn rewritten_head_words_are_put_back() {
    let (a, mut b, mut c) = trio();
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
    // An idle poll tells the head.
    assert!(b.poll_recv(|_, _, _| ()).unwrap().is_none());
    let (mail, notes) = (b.head_told, b.note_told);
    assert_eq!((mail, notes), (b.head, b.note_head));
    a.tx.peers[1].imp.store_word(MAILBOX_HEAD, 1 << 40).unwrap();
    a.tx.peers[1].imp.store_word(NOTIFY_HEAD, 0).unwrap();
    let (got, errors) = poll_for_errors(&mut b, |e| e.len() >= 2, patience(5));
    assert_eq!(got, None);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors.iter().all(|e| named(e, None)), "{errors:?}");
    assert_eq!(b.seg.load_word(MAILBOX_HEAD).unwrap(), mail);
    assert_eq!(b.seg.load_word(NOTIFY_HEAD).unwrap(), notes);
    // A sender that read the corrupt head: one error, then its cache starts over.
    c.tx.mailbox_head[1] = 1 << 40;
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Short, 0, &mut h);
    assert!(matches!(
        c.try_send(1, &out(&h[..n], &[])),
        Err(SendError::Device(_))
    ));
    assert_eq!(c.tx.mailbox_head[1], 0);
    c.try_send(1, &out(&h[..n], &[])).unwrap();
    let (got, errors) = poll_until(&mut b, patience(5));
    assert_eq!((got.map(|g| g.0), errors), (Some(2), vec![]));
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
}

// ---- Notification queue ----

/// Notifications the protocol never writes: consumed, reported (naming the source they
/// claim where that is one of the job's ranks, nobody for a completion in our name), and
/// no counter moves.
#[test]
fn corrupt_notifications_are_dropped_and_reported() {
    let all: [(u32, u32, u64, Option<Rank>); 7] = [
        (0, 0x77, 0, Some(0)),                    // unknown kind
        (9, kind::PUT_LANDED, 0, None),           // source outside the job
        (0, kind::MEDIUM_LANDED, 5, Some(0)),     // not the next RMA Medium
        (0, kind::LONG_LANDED, 1 << 40, Some(0)), // longer than any Long
        (0, kind::PUT_LANDED, 1 << 40, Some(0)),  // larger than the segment
        (0, kind::USER_DONE, 0, Some(0)),         // a requester notification from another rank
        (1, kind::USER_DONE, 3, None),            // completion of an operation not in flight
    ];
    for (src, k, value, peer) in cases(all) {
        let (a, mut b, mut c) = trio();
        post_raw(&a, 1, 0, src | k << 16, value);
        one_poll_refused(&mut b, peer, format_args!("{k}/{value}"));
        assert_eq!(b.note_head, 1);
        assert_eq!(
            (
                b.rma_landed[0],
                b.rma_pending,
                b.long_landed[0],
                b.put_landed[0]
            ),
            (0, 0, 0, 0)
        );
        assert!(b.user_done.is_empty() && b.user_failed.is_empty());
        assert_eq!(good_still_arrives(&mut b, &mut c), vec![], "{k}/{value}");
        segment_untouched(&b);
    }
    // A notification status no lap writes.
    let (a, mut b, mut c) = trio();
    let ring = a.tx.layout.notifications();
    store_status(&a, 1, &ring, 0, 0xbad_0000_0005);
    let r = b.poll_recv(|d, _, _| d.src);
    assert!(matches!(&r, Err(e) if named(e, None)), "{r:?}");
    assert_eq!(b.note_head, 1);
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
}

/// The notification tail is a hint as the mailbox's is.
#[test]
fn a_corrupt_notification_tail_costs_a_walk() {
    for tail in cases([5u64, 1 << 40, u64::MAX]) {
        let (a, mut b, mut c) = trio();
        a.tx.peers[1].imp.store_word(NOTIFY_TAIL, tail).unwrap();
        let errors = good_still_arrives(&mut b, &mut c);
        // A hint a little ahead leaves holes, filled and reported.
        assert!(errors.iter().all(|e| named(e, None)), "{tail}: {errors:?}");
        if tail != 5 {
            assert_eq!(errors, vec![], "{tail}");
        }
    }
}

// ---- RMA Medium tails ----

/// Writes a tail into rank 1's receive buffer 0 from rank 0 and notifies it, as rank 0's
/// engine would after a put.
fn land_tail(a: &Extoll, tail: u64) {
    let l = a.tx.layout;
    a.tx.peers[1]
        .imp
        .store_slot_word(l.rx(0, 0) + RMA_BUF - TAIL, tail)
        .unwrap();
    post_raw(a, 1, 0, kind::MEDIUM_LANDED << 16, 0);
}

#[test]
fn an_rma_medium_with_a_wrong_marker_is_dropped() {
    let (a, mut b, mut c) = trio();
    land_tail(&a, 12 << 16);
    one_poll_refused(&mut b, Some(0), "");
    assert_eq!(
        (b.rma_landed[0], b.rma_pending),
        (0, 0),
        "notification dropped"
    );
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
}

/// A tail of exactly the largest message: delivered whole (the bytes before the tail and no
/// others), and the buffer freed.
#[test]
fn an_rma_medium_of_the_largest_length_is_delivered_whole() {
    let (a, mut b, mut c) = trio();
    let bytes: Vec<u8> = (0..MAX_MSG).map(|i| (i % 253) as u8).collect();
    let at = a.tx.layout.rx(0, 0) + RMA_BUF - TAIL - align8(MAX_MSG);
    a.tx.peers[1].imp.write(at, &bytes).unwrap();
    land_tail(&a, 1 | (MAX_MSG as u64) << 16);
    let got = b.poll_recv(|d, _, _| (d.src, d.bytes.to_vec())).unwrap();
    assert_eq!(got, Some((0, bytes)));
    assert_eq!((b.rma_delivered[0], b.rma_pending), (1, 0));
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
}

/// One to eight bytes past the largest message (the boundary), or a length as large as the
/// tail's 16 bits hold: dropped, naming the sender, and the buffer freed.
#[test]
fn an_rma_medium_longer_than_a_buffer_is_dropped() {
    for len in just_past(MAX_MSG).into_iter().chain([0xffff]) {
        let (a, mut b, mut c) = trio();
        land_tail(&a, 1 | (len as u64) << 16);
        one_poll_refused(&mut b, Some(0), format_args!("{len}"));
        assert_eq!((b.rma_delivered[0], b.rma_pending), (1, 0), "buffer freed");
        assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
    }
}

/// An RMA Medium that waits for VELO messages its source never sent: dropped at the
/// stalled check once the mailbox is empty (they would be there), and no busy loop
/// meanwhile.
#[test]
fn an_rma_medium_waiting_for_velo_messages_never_sent_is_dropped() {
    let (a, mut b, mut c) = trio();
    land_tail(&a, 1 | 12 << 16 | 5 << 32);
    let (got, errors) = poll_for_errors(&mut b, |e| !e.is_empty(), patience(5));
    assert_eq!(got, None);
    one_naming(&errors, Some(0));
    assert_eq!((b.rma_delivered[0], b.rma_pending), (1, 0));
    assert!(!b.has_work().unwrap());
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
}

/// Both paths waiting for each other (a VELO message for an RMA Medium that waits for VELO
/// messages sent after it, which a sender's order never produces): the VELO message is
/// dropped at the stalled-mailbox check, the Medium once the mailbox is empty.
#[test]
fn a_mutual_wait_of_both_paths_is_broken() {
    let (a, mut b, mut c) = trio();
    land_tail(&a, 1 | 12 << 16 | 5 << 32);
    let h = short_head();
    publish(&a, 1, 0, &h, meta(h.len(), FIRST | LAST, 1));
    let mut errors = good_still_arrives(&mut b, &mut c);
    let met = errors.len();
    let (got, e) = poll_for_errors(&mut b, |e| met + e.len() >= 2, patience(5));
    assert_eq!(got, None);
    errors.extend(e);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors.iter().all(|e| named(e, Some(0))), "{errors:?}");
    assert_eq!((b.rma_delivered[0], b.rma_pending), (1, 0));
    segment_untouched(&b);
}

/// A piggybacked acknowledgement of RMA Mediums never sent: the (otherwise sound) message is
/// delivered, the ack ignored and reported.
#[test]
fn a_piggybacked_ack_ahead_is_ignored_and_reported() {
    let (a, mut b, mut c) = trio();
    let h = short_head();
    let at = a.tx.layout.rx(0, 0) + RMA_BUF - TAIL - align8(h.len());
    a.tx.peers[1].imp.write(at, &h).unwrap();
    land_tail(&a, 1 | (h.len() as u64) << 16 | 7 << 48);
    let got = b.poll_recv(|d, _, _| (d.src, d.bytes.to_vec())).unwrap();
    assert_eq!(got, Some((0, h)));
    let r = b.poll_recv(|d, _, _| d.src);
    assert!(matches!(&r, Err(e) if named(e, Some(0))), "{r:?}");
    assert_eq!(b.tx.rma_acked[0], 0);
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
}

// ---- Ack words ----

/// An ack word that acknowledges RMA Mediums never sent: ignored (put back), reported, and
/// the sender's flow control holds (the receiver's buffers are never overwritten).
#[test]
fn a_corrupt_ack_word_is_ignored_and_reported() {
    let (mut a, mut b, mut c) = trio();
    let at = b.tx.layout.ack(0);
    a.tx.peers[1].imp.store_word(at, 1000).unwrap();
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = head(AmKind::Medium, 600, &mut h);
    b.set_medium(MediumPath::Rma);
    b.try_send(0, &out(&h[..n], &[1; 600])).unwrap();
    assert_eq!(b.tx.rma_acked[0], 0);
    assert_eq!(b.seg.load_word(at).unwrap(), 0, "put back");
    let r = b.poll_recv(|d, _, _| d.src);
    assert!(matches!(&r, Err(e) if named(e, Some(0))), "{r:?}");
    b.try_send(0, &out(&h[..n], &[2; 600])).unwrap();
    assert_eq!(
        b.try_send(0, &out(&h[..n], &[3; 600])),
        Err(SendError::Busy),
        "two buffers, none acknowledged"
    );
    for k in [1u8, 2] {
        let (got, errors) = poll_until(&mut a, patience(5));
        assert_eq!(errors, vec![]);
        let (src, m) = got.unwrap();
        assert_eq!((src, m.len()), (1, n + 600));
        assert!(m[n..].iter().all(|&x| x == k));
    }
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
}

// ---- Claim records ----

/// A `CLAIMED` status in the name of a claimer whose record does not vouch for it (no
/// claim at all, a record pointing past it, a claimer of no rank, the owner itself): taken
/// over at the stalled-mailbox check, reported, and the messages behind it flow.
#[test]
fn forged_mailbox_claims_are_skipped_and_reported() {
    for (who, record) in cases([
        (2u32, None),
        (0, Some(1u64 << 63 | 100)),
        (77, None),
        (1, None),
    ]) {
        let (a, mut b, mut c) = trio();
        let ring = a.tx.layout.mailbox();
        if let Some(r) = record {
            a.tx.peers[1]
                .imp
                .store_word(a.tx.layout.claims(who as usize, CLAIM_MAILBOX), r)
                .unwrap();
        }
        store_status(&a, 1, &ring, 0, claimed(who));
        one_naming(&good_still_arrives(&mut b, &mut c), None);
        assert_eq!(ring.look(&b.seg, 0).unwrap(), Seen::Skipped(OWNER), "{who}");
    }
}

/// The same in the notification queue: a forged claim in front of rank 2's RMA Medium's
/// notification.
#[test]
fn forged_notification_claims_are_skipped_and_reported() {
    for who in cases([notes_claimer(2, false), notes_claimer(0, true), 1000]) {
        let (a, mut b, mut c) = trio();
        let ring = a.tx.layout.notifications();
        store_status(&a, 1, &ring, 0, claimed(who));
        one_naming(&good_still_arrives(&mut b, &mut c), None);
        assert_eq!(ring.look(&b.seg, 0).unwrap(), Seen::Skipped(OWNER), "{who}");
    }
}

/// A claim its live claimer vouches for is waited for, past every check, never skipped:
/// the owner cannot tell a slow claimer from a stalled one.
#[test]
fn a_live_claim_is_waited_for_not_skipped() {
    let (_a, mut b, mut c) = trio();
    let mut t = [0u64; 1];
    c.tx.claim(1, &mut t).unwrap();
    let (got, errors) = poll_until(&mut b, Duration::from_millis(400));
    assert_eq!((got, errors), (None, vec![]));
    assert_eq!(b.head, 0);
    let h = short_head();
    let ring = c.tx.layout.mailbox();
    ring.write(&c.tx.peers[1].imp, t[0], 0, &h).unwrap();
    let m = Meta {
        src: 2,
        len: h.len(),
        flags: FIRST | LAST,
        rma_before: 0,
    };
    ring.publish(&c.tx.peers[1].imp, t[0], m.encode()).unwrap();
    c.tx.finish_claim(1, &[], Ok(())).unwrap();
    let (got, errors) = poll_until(&mut b, patience(5));
    assert_eq!((got, errors), (Some((2, h)), vec![]));
}

// ---- Departed and abort words ----

#[test]
fn corrupt_departed_and_abort_words_are_put_back_and_reported() {
    let (a, mut b, mut c) = trio();
    let at = b.tx.layout.departed(0);
    a.tx.peers[1].imp.store_word(at, 0xdead).unwrap();
    let (got, errors) = poll_for_errors(&mut b, |e| !e.is_empty(), patience(5));
    assert_eq!(got, None);
    one_naming(&errors, Some(0));
    assert_eq!(b.seg.load_word(at).unwrap(), 0);
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);

    let (a, mut b, mut c) = trio();
    a.tx.peers[1].imp.store_word(ABORT, 0xdead).unwrap();
    let (got, errors) = poll_for_errors(&mut b, |e| !e.is_empty(), patience(5));
    assert_eq!(got, None);
    one_naming(&errors, None);
    assert_eq!(b.seg.load_word(ABORT).unwrap(), 0);
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);

    // 1 is what a panicking rank writes: the job is over.
    let (a, mut b, _c) = trio();
    a.tx.peers[1].imp.store_word(ABORT, 1).unwrap();
    let enough = |e: &[TransportError]| e.contains(&TransportError::JobAborted);
    let (_, errors) = poll_for_errors(&mut b, enough, patience(5));
    assert!(errors.contains(&TransportError::JobAborted), "{errors:?}");
}

// ---- The RMA engine's waits (bug b) ----

/// Fills rank 1's notification queue with notifications it does not drain (it never
/// polls), then has rank 0's engine put to it: its completer notification waits.
fn engine_waits_on_a_full_queue(a: &mut Extoll, c: &Extoll) -> RmaOp {
    let op = put_into_a_full_queue(a, c);
    let (deadline, mut polls) = (Instant::now() + Duration::from_millis(50), 0);
    while Instant::now() < deadline || polls < 3 {
        assert!(!a.rma_test(op).unwrap(), "notified into a full queue");
        polls += 1;
        std::thread::yield_now();
    }
    op
}

fn put_into_a_full_queue(a: &mut Extoll, c: &Extoll) -> RmaOp {
    for _ in 0..16 {
        post_raw(c, 1, 2, 2 | kind::PUT_LANDED << 16, 8);
    }
    a.segment().write(0, b"12345678").unwrap();
    a.rma_put(1, 100, 0, 8).unwrap()
}

fn rma_result(a: &mut Extoll, op: RmaOp) -> Result<bool, TransportError> {
    let deadline = Instant::now() + patience(10);
    loop {
        match a.rma_test(op) {
            Ok(false) if Instant::now() < deadline => std::thread::yield_now(),
            other => return other,
        }
    }
}

/// The bug (b): the engine's notify loop spun for ever on a full queue. A target
/// that departs ends the wait: the put is `PeerLost`.
#[test]
fn the_engine_gives_up_on_a_departed_target() {
    let (mut a, b, c) = trio();
    let op = engine_waits_on_a_full_queue(&mut a, &c);
    drop(b);
    assert_eq!(rma_result(&mut a, op), Err(TransportError::PeerLost(1)));
}

/// A live target that never makes room: the engine gives up after its patience; the data
/// landed, unannounced.
#[test]
fn the_engine_gives_up_on_a_never_draining_target() {
    let (mut a, b, c) = trio();
    a.tx.engine_patience = Duration::from_millis(200);
    let op = engine_waits_on_a_full_queue(&mut a, &c);
    assert!(matches!(
        rma_result(&mut a, op),
        Err(TransportError::Device(_))
    ));
    assert_eq!(b.segment().slice(100, 8).unwrap().to_vec(), b"12345678");
    assert_eq!(b.puts_landed(0), 0);
}

/// A target whose process is gone (pid reaped): the same as a departed one.
#[cfg(not(miri))]
#[test]
fn the_engine_gives_up_on_a_dead_target() {
    let (mut a, _b, c) = trio();
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    child.wait().unwrap();
    a.tx.pids[1] = Some(nix::unistd::Pid::from_raw(pid));
    a.liveness = am_nic::Liveness::new(a.tx.pids.clone());
    let op = put_into_a_full_queue(&mut a, &c);
    assert_eq!(rma_result(&mut a, op), Err(TransportError::PeerLost(1)));
}

// ---- The RMA Medium pool ----

/// [`small`] with a pool of two buffers instead of buffers per connection.
fn pooled() -> ExtollConfig {
    ExtollConfig {
        rma_pool: 2,
        ..small()
    }
}

/// Rank 1's pool claim words.
fn pool_claims(b: &Extoll) -> Vec<u64> {
    let l = b.tx.layout;
    (0..l.rma_pool)
        .map(|i| b.seg.load_word(l.pool_claim(i)).unwrap())
        .collect()
}

/// Forged claims: one no sender writes, and one for a Medium of rank 2's that was delivered
/// already (its count mod 2^32). Meanwhile Mediums find no buffer and go over VELO; the
/// stalled-queue check frees both, reporting them, and the pool serves again.
#[test]
fn forged_pool_claims_are_freed_and_reported() {
    let (a, mut b, mut c) = trio_with(pooled());
    store_pool_claim(&a, 1, 0, 0xdead);
    store_pool_claim(&a, 1, 1, pool_claim(2, u32::MAX as u64));
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
    assert_eq!(c.tx.dests[1].rma_sent, 0, "no buffer was free");
    let (got, errors) = poll_for_errors(&mut b, |e| e.len() >= 2, patience(5));
    assert_eq!(got, None);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors.iter().all(|e| named(e, None)), "{errors:?}");
    assert_eq!(pool_claims(&b), vec![0, 0]);
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
    assert_eq!(c.tx.dests[1].rma_sent, 1, "the pool serves again");
    assert_eq!(pool_claims(&b), vec![0, 0]);
    segment_untouched(&b);
}

/// A claim in a live sender's name for a Medium inside the window it may have in flight
/// (here the next two) may be one in flight: left alone, with no report, and the other
/// senders go on (over VELO while the pool is full). One past the window is no sender's:
/// freed and reported.
#[test]
fn a_claim_inside_a_senders_window_is_left_alone() {
    let (a, mut b, mut c) = trio_with(pooled());
    let held = vec![pool_claim(0, 0), pool_claim(0, 1)];
    for (i, &v) in held.iter().enumerate() {
        store_pool_claim(&a, 1, i, v);
    }
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
    // Past the stalled-queue check (it runs 0.1 s after the last progress).
    let since = Instant::now();
    while b.watch.last_check.is_none_or(|t| t < since) {
        assert!(
            since.elapsed() < patience(5),
            "the stalled-queue check never ran"
        );
        let (got, errors) = poll_until(&mut b, Duration::from_millis(50));
        assert_eq!((got, errors), (None, vec![]));
    }
    assert_eq!(pool_claims(&b), held);
    store_pool_claim(&a, 1, 1, pool_claim(0, 2));
    let (got, errors) = poll_for_errors(&mut b, |e| !e.is_empty(), patience(5));
    assert_eq!(got, None);
    one_naming(&errors, None);
    assert_eq!(pool_claims(&b), vec![pool_claim(0, 0), 0]);
}

/// Notifications that name a buffer past the pool, or one the sender does not hold for
/// that Medium: dropped, naming the sender; nothing is lent and no counter moves.
#[test]
fn a_notification_past_the_pool_or_for_a_buffer_not_held_is_refused() {
    let shift = POOL_INDEX_SHIFT;
    for (at, held, value) in cases([
        // Past the pool, where the word after the pool's claim words says it is held.
        (2, pool_claim(0, 0), 2u64 << shift),
        (1, 0, 1 << shift),                // a free buffer
        (1, pool_claim(2, 0), 1 << shift), // another sender's
        (1, pool_claim(0, 1), 1 << shift), // held for another Medium
        (1, pool_claim(0, 0), 1 << 63),    // far past the pool
    ]) {
        let (a, mut b, mut c) = trio_with(pooled());
        store_pool_claim(&a, 1, at, held);
        post_raw(&a, 1, 0, kind::MEDIUM_LANDED << 16, value);
        one_poll_refused(&mut b, Some(0), format_args!("{value:#x}"));
        assert_eq!((b.rma_landed[0], b.rma_pending), (0, 0), "{value:#x}");
        store_pool_claim(&a, 1, at, 0);
        assert_eq!(good_still_arrives(&mut b, &mut c), vec![], "{value:#x}");
    }
}

/// A pool buffer held by a rank that died before notifying its Medium is freed once the
/// rank is lost, with no report but the loss.
#[test]
fn a_dead_claimers_pool_buffer_is_freed() {
    let (a, mut b, mut c) = trio_with(pooled());
    store_pool_claim(&a, 1, 0, pool_claim(0, 0));
    b.declare_lost(0);
    // Not while a notification it may have published before dying is still to be read.
    b.sweep_pool(false);
    assert_eq!(pool_claims(&b), vec![pool_claim(0, 0), 0]);
    b.sweep_pool(true);
    assert_eq!(pool_claims(&b), vec![0, 0]);
    let r = b.poll_recv(|_, _, _| ());
    assert!(matches!(r, Err(TransportError::PeerLost(0))), "{r:?}");
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
    assert_eq!(c.tx.dests[1].rma_sent, 1);
}

/// A notified pool Medium whose tail does not match: dropped, naming its sender, and its
/// buffer freed (it holds no Medium to deliver).
#[test]
fn a_pool_medium_with_a_wrong_marker_is_dropped_and_its_buffer_freed() {
    let (a, mut b, mut c) = trio_with(pooled());
    let l = a.tx.layout;
    store_pool_claim(&a, 1, 1, pool_claim(0, 0));
    a.tx.peers[1]
        .imp
        .store_slot_word(l.pool(1) + RMA_BUF - TAIL, 7 | 12 << 16)
        .unwrap();
    post_raw(&a, 1, 0, kind::MEDIUM_LANDED << 16, 1 << POOL_INDEX_SHIFT);
    one_poll_refused(&mut b, Some(0), "");
    assert_eq!((b.rma_delivered[0], b.rma_pending), (1, 0));
    assert_eq!(pool_claims(&b), vec![0, 0]);
    assert_eq!(good_still_arrives(&mut b, &mut c), vec![]);
}
