//! Unit tests of the NI on heap segments (Miri runs them: `cargo miri test -p portals-sim --lib`).

use super::eq::{Claim, Claimer};
use super::*;
use am_shm::sync::{AtomicU64, Ordering};
use am_shm::{Imported, Segment, CACHE_LINE};
use proptest::prelude::*;

fn geo(bytes: usize) -> NiGeometry {
    NiGeometry::new(4, 16, 64, bytes).unwrap()
}

struct Ni {
    geo: NiGeometry,
    seg: Segment,
    imp: Imported,
    owner: NiOwner,
}

impl Ni {
    fn new(bytes: usize) -> Ni {
        let geo = geo(bytes);
        let seg = Segment::heap(geo.words_len(), bytes).unwrap();
        let imp = seg.import();
        let owner = NiOwner::new(geo, &seg, [true, false, false, false]).unwrap();
        Ni {
            geo,
            seg,
            imp,
            owner,
        }
    }
    fn nic(&self) -> Nic<'_> {
        Nic::new(&self.seg, &self.imp, &self.geo)
    }
    fn events(&mut self) -> Vec<Event> {
        let mut v = Vec::new();
        while let Some(e) = self.owner.eq_poll(&self.seg).unwrap() {
            v.push(e);
        }
        v
    }
}

fn put_args<'a>(pt: u8, mb: u64, off: u64, data: &'a [&'a [u8]]) -> PutArgs<'a> {
    PutArgs {
        pt,
        match_bits: mb,
        hdr_data: 0xABCD,
        remote_offset: off,
        data,
        shared: None,
        ack: false,
        send_event: false,
        pad: false,
    }
}

fn spec(mb: u64, ib: u64, start: usize, length: usize, options: MeOptions) -> MeSpec {
    MeSpec {
        match_bits: mb,
        ignore_bits: ib,
        start,
        length,
        options,
    }
}

const PUT: MeOptions = MeOptions {
    put: true,
    get: true,
    use_once: false,
    manage_local: false,
    event_disable: false,
};

#[test]
fn match_bits_select_the_entry_and_ignore_bits_widen_it() {
    let mut ni = Ni::new(1024);
    let a = ni
        .owner
        .me_append(&ni.seg, PT_USER, spec(0x10, 0, 0, 100, PUT))
        .unwrap();
    let b = ni
        .owner
        .me_append(&ni.seg, PT_USER, spec(0x20, 0x0F, 100, 100, PUT))
        .unwrap();
    let nic = ni.nic();
    let d: &[&[u8]] = &[b"xy"];
    assert_eq!(
        nic.put(0, None, &put_args(PT_USER, 0x10, 5, d)).unwrap(),
        Outcome::Done { me: a, start: 5 }
    );
    assert_eq!(
        nic.put(1, None, &put_args(PT_USER, 0x2B, 7, d)).unwrap(),
        Outcome::Done { me: b, start: 107 }
    );
    assert_eq!(
        nic.put(1, None, &put_args(PT_USER, 0x30, 0, d)).unwrap(),
        Outcome::Refused(NiFail::NoMatch)
    );
    // Past the end of the entry: no truncation, no match.
    assert_eq!(
        nic.put(1, None, &put_args(PT_USER, 0x10, 99, d)).unwrap(),
        Outcome::Refused(NiFail::NoMatch)
    );
    let ev = ni.events();
    assert_eq!(ev.len(), 2);
    assert_eq!(
        (ev[0].kind, ev[0].me, ev[0].start, ev[0].mlength),
        (EventKind::Put, a, 5, 2)
    );
    assert_eq!(
        (ev[1].initiator, ev[1].match_bits, ev[1].hdr_data),
        (1, 0x2B, 0xABCD)
    );
    assert_eq!(ni.seg.view(107, 2).unwrap().to_vec(), b"xy");
}

/// A shared tail (an echoed payload) lands right after the private parts, padded or
/// not, and counts in the event's length; the neighbours of an unpadded deposit keep
/// their bytes.
#[test]
fn shared_bytes_follow_the_private_parts() {
    let mut ni = Ni::new(1024);
    let src = Ni::new(256);
    src.seg
        .view(0, 256)
        .unwrap()
        .write(0, &[0x5A; 256])
        .unwrap();
    src.seg
        .view(40, 11)
        .unwrap()
        .write(0, b"echoed-tail")
        .unwrap();
    let a = ni
        .owner
        .me_append(&ni.seg, PT_USER, spec(1, 0, 0, 512, PUT))
        .unwrap();
    ni.seg.view(0, 512).unwrap().fill(0, 512, 0xEE).unwrap();
    let nic = ni.nic();
    let d: &[&[u8]] = &[b"head"];
    for (off, pad) in [(16u64, true), (203, false)] {
        let args = PutArgs {
            shared: Some(src.seg.view(40, 11).unwrap()),
            pad,
            ..put_args(PT_USER, 1, off, d)
        };
        assert_eq!(
            nic.put(0, None, &args).unwrap(),
            Outcome::Done { me: a, start: off }
        );
        let at = off as usize;
        assert_eq!(ni.seg.view(at, 15).unwrap().to_vec(), b"headechoed-tail");
        let after = ni.seg.view(at + 15, 1).unwrap().to_vec()[0];
        // Padded: the rest of the last word is zeroed; unpadded: left as it was.
        assert_eq!(after, if pad { 0 } else { 0xEE }, "offset {off}");
        assert_eq!(ni.seg.view(at - 1, 1).unwrap().to_vec()[0], 0xEE);
    }
    let ev = ni.events();
    assert_eq!(
        ev.iter().map(|e| (e.start, e.mlength)).collect::<Vec<_>>(),
        [(16, 15), (203, 15)]
    );
}

#[test]
fn use_once_entry_unlinks_with_an_event() {
    let mut ni = Ni::new(256);
    let once = MeOptions {
        use_once: true,
        ..PUT
    };
    let a = ni
        .owner
        .me_append(&ni.seg, PT_USER, spec(7, 0, 0, 64, once))
        .unwrap();
    let b = ni
        .owner
        .me_append(&ni.seg, PT_USER, spec(7, 0, 64, 64, once))
        .unwrap();
    let nic = ni.nic();
    let d: &[&[u8]] = &[b"1"];
    let r1 = nic.put(2, None, &put_args(PT_USER, 7, 0, d)).unwrap();
    let r2 = nic.put(2, None, &put_args(PT_USER, 7, 0, d)).unwrap();
    let r3 = nic.put(2, None, &put_args(PT_USER, 7, 0, d)).unwrap();
    assert_eq!(r1, Outcome::Done { me: a, start: 0 });
    assert_eq!(r2, Outcome::Done { me: b, start: 64 });
    assert_eq!(r3, Outcome::Refused(NiFail::NoMatch));
    let kinds: Vec<_> = ni.events().iter().map(|e| (e.kind, e.me)).collect();
    assert_eq!(
        kinds,
        [
            (EventKind::Put, a),
            (EventKind::Unlink, a),
            (EventKind::Put, b),
            (EventKind::Unlink, b)
        ]
    );
    ni.owner.me_unlink(&ni.seg, a).unwrap();
    ni.owner.me_unlink(&ni.seg, b).unwrap();
    assert!(ni.owner.me_unlink(&ni.seg, b).is_err());
}

#[test]
fn ack_send_get_and_reply_events() {
    let mut tgt = Ni::new(256);
    let mut ini = Ni::new(64);
    tgt.owner
        .me_append(&tgt.seg, PT_USER, spec(1, 0, 0, 128, PUT))
        .unwrap();
    let d: &[&[u8]] = &[b"hello"];
    let args = PutArgs {
        ack: true,
        send_event: true,
        ..put_args(PT_USER, 1, 3, d)
    };
    tgt.nic().put(1, Some(&ini.nic()), &args).unwrap();
    let mut got = [0u8; 5];
    tgt.nic()
        .get(1, Some(&ini.nic()), PT_USER, 1, 3, &mut got)
        .unwrap();
    assert_eq!(&got, b"hello");
    let bad = PutArgs {
        ack: true,
        ..put_args(PT_USER, 9, 0, d)
    };
    tgt.nic().put(1, Some(&ini.nic()), &bad).unwrap();
    let i: Vec<_> = ini
        .events()
        .iter()
        .map(|e| (e.kind, e.fail, e.mlength))
        .collect();
    assert_eq!(
        i,
        [
            (EventKind::Send, NiFail::Ok, 5),
            (EventKind::Ack, NiFail::Ok, 5),
            (EventKind::Reply, NiFail::Ok, 5),
            (EventKind::Ack, NiFail::NoMatch, 0),
        ]
    );
    let t: Vec<_> = tgt.events().iter().map(|e| e.kind).collect();
    assert_eq!(t, [EventKind::Put, EventKind::Get]);
}

/// Locally managed offsets pack messages back to back; the claim that does not fit
/// unlinks the entry (with the bytes used), the next entry takes it, and when none has
/// room the portal entry is disabled until the owner re-enables it.
#[test]
fn locally_managed_packing_unlink_and_flow_control() {
    let mut ni = Ni::new(256);
    let lm = MeOptions {
        manage_local: true,
        ..PUT
    };
    let a = ni
        .owner
        .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 0, 32, lm))
        .unwrap();
    let b = ni
        .owner
        .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 32, 32, lm))
        .unwrap();
    let nic = ni.nic();
    let put = |n: usize| {
        let v = vec![n as u8; n];
        let d: &[&[u8]] = &[&v];
        nic.put(0, None, &put_args(PT_REQUEST, 5, 999, d)).unwrap()
    };
    assert_eq!(put(5), Outcome::Done { me: a, start: 0 });
    assert_eq!(put(9), Outcome::Done { me: a, start: 8 });
    assert_eq!(put(20), Outcome::Done { me: b, start: 32 });
    assert_eq!(
        put(0),
        Outcome::Done { me: b, start: 32 },
        "zero bytes fit anywhere"
    );
    assert_eq!(put(16), Outcome::Refused(NiFail::PtDisabled));
    assert_eq!(put(1), Outcome::Refused(NiFail::PtDisabled));
    let ev = ni.events();
    let kinds: Vec<_> = ev.iter().map(|e| (e.kind, e.me, e.used)).collect();
    assert_eq!(
        kinds,
        // A put's own event slot is claimed before the walk, so the unlink it causes
        // follows it in the queue.
        [
            (EventKind::Put, a, 0),
            (EventKind::Put, a, 0),
            (EventKind::Put, b, 0),
            (EventKind::Unlink, a, 24),
            (EventKind::Put, b, 0),
            (EventKind::PtDisabled, NO_ME, 0),
            (EventKind::Unlink, b, 24),
        ]
    );
    assert_eq!(ni.owner.lm_used(&ni.seg, a).unwrap(), Some(24));
    assert!(ni.owner.pt_disabled(&ni.seg, PT_REQUEST).unwrap());
    ni.owner.lm_relink(&ni.seg, a).unwrap();
    ni.owner.lm_retire(&ni.seg, b).unwrap();
    ni.owner.pt_enable(&ni.seg, PT_REQUEST).unwrap();
    let nic = ni.nic();
    let v = [7u8; 16];
    let d: &[&[u8]] = &[&v];
    assert_eq!(
        nic.put(0, None, &put_args(PT_REQUEST, 5, 0, d)).unwrap(),
        Outcome::Done { me: a, start: 0 }
    );
    assert_eq!(ni.owner.lm_used(&ni.seg, a).unwrap(), None);
    assert!(!ni.owner.is_listed(b));
}

/// Locally managed claims at their entry's end (claims are whole units, an entry any
/// length): a claim ending exactly there is taken, and a zero-byte put still fits the
/// entry filled to its end; a claim that would end one to eight bytes past it goes to
/// the next entry, and so does a zero-byte put after it. Nothing lands past the end.
#[test]
fn locally_managed_claims_at_and_just_past_the_entry_end() {
    let lm = MeOptions {
        manage_local: true,
        ..PUT
    };
    for length in 24..=32 {
        let mut ni = Ni::new(256);
        let a = ni
            .owner
            .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 0, length, lm))
            .unwrap();
        let b = ni
            .owner
            .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 64, 64, lm))
            .unwrap();
        ni.seg.view(0, 64).unwrap().fill(0, 64, 0xEE).unwrap();
        let nic = ni.nic();
        let put = |n: usize| {
            let v = vec![n as u8; n];
            let d: &[&[u8]] = &[&v];
            nic.put(0, None, &put_args(PT_REQUEST, 5, 999, d)).unwrap()
        };
        let done = |me, start| Outcome::Done { me, start };
        assert_eq!(put(16), done(a, 0), "{length}");
        assert_eq!(put(8), done(a, 16), "{length}: ends at 24");
        assert_eq!(put(0), done(a, 0), "{length}: filled to 24");
        // The next unit, [24, 32): it ends 32 - length bytes past the end.
        // A zero-byte put lands at its entry's start.
        let (next, zero) = if length == 32 {
            (done(a, 24), done(a, 0))
        } else {
            (done(b, 64), done(b, 64))
        };
        assert_eq!(put(1), next, "{length}: ends at 32");
        assert_eq!(put(0), zero, "{length}: claimed to 32");
        let past = ni.seg.view(length, 64 - length).unwrap().to_vec();
        assert!(past.iter().all(|&x| x == 0xEE), "{length}: {past:?}");
    }
}

/// The `used` word against its entry's length: the whole length (the entry filled
/// exactly, then a claim that did not fit) is what a walker writes, and `verify` keeps
/// it; one to eight bytes past the length is reported and put back to unknown.
#[test]
fn a_used_word_at_and_just_past_the_entry_length() {
    let lm = MeOptions {
        manage_local: true,
        ..PUT
    };
    for over in 0..=8u64 {
        let mut ni = Ni::new(256);
        let a = ni
            .owner
            .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 0, 32, lm))
            .unwrap();
        ni.owner
            .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 64, 64, lm))
            .unwrap();
        let nic = ni.nic();
        let v = [3u8; 16];
        for n in [16, 16, 1] {
            let d: &[&[u8]] = &[&v[..n]];
            nic.put(0, None, &put_args(PT_REQUEST, 5, 0, d)).unwrap();
        }
        assert_eq!(ni.owner.lm_used(&ni.seg, a).unwrap(), Some(32));
        let at = ni.geo.me(a).unwrap() + 72;
        ni.seg.word(at).unwrap().store(32 + over, Ordering::Release);
        let r = ni.owner.verify(&ni.seg);
        if over == 0 {
            assert!(r.is_ok(), "{r:?}");
            assert_eq!(ni.owner.lm_used(&ni.seg, a).unwrap(), Some(32));
        } else {
            assert!(matches!(r, Err(NiError::Corrupt { .. })), "{over}: {r:?}");
            assert_eq!(ni.owner.lm_used(&ni.seg, a).unwrap(), None, "{over}");
            assert!(ni.owner.verify(&ni.seg).is_ok(), "{over}: repaired");
        }
    }
}

/// A padded deposit (whole words) at its entry's end: padded only while the padding
/// stays inside the entry. An entry one to eight bytes short of the padded end keeps
/// the bytes after it.
#[test]
fn padding_never_runs_past_the_entry_end() {
    for length in 9..=16 {
        let mut ni = Ni::new(256);
        let a = ni
            .owner
            .me_append(&ni.seg, PT_USER, spec(1, 0, 0, length, PUT))
            .unwrap();
        ni.seg.view(0, 32).unwrap().fill(0, 32, 0xEE).unwrap();
        let v = vec![0x11; length - 8];
        let d: &[&[u8]] = &[&v];
        let args = PutArgs {
            pad: true,
            ..put_args(PT_USER, 1, 8, d)
        };
        assert_eq!(
            ni.nic().put(0, None, &args).unwrap(),
            Outcome::Done { me: a, start: 8 },
            "{length}"
        );
        assert_eq!(ni.seg.view(8, length - 8).unwrap().to_vec(), v);
        let past = ni.seg.view(length, 32 - length).unwrap().to_vec();
        assert!(past.iter().all(|&x| x == 0xEE), "{length}: {past:?}");
        assert_eq!(ni.events().len(), 1);
    }
}

#[test]
fn a_full_event_queue_refuses_without_side_effects() {
    let mut ni = Ni::new(64);
    ni.owner
        .me_append(&ni.seg, PT_USER, spec(0, !0, 0, 64, PUT))
        .unwrap();
    let nic = ni.nic();
    let d: &[&[u8]] = &[b"z"];
    for _ in 0..64 {
        assert!(matches!(
            nic.put(0, None, &put_args(PT_USER, 0, 0, d)).unwrap(),
            Outcome::Done { .. }
        ));
    }
    assert_eq!(
        nic.put(0, None, &put_args(PT_USER, 0, 0, d)).unwrap(),
        Outcome::Refused(NiFail::EqFull)
    );
    assert_eq!(ni.events().len(), 64);
    ni.owner.eq_publish_head(&ni.seg).unwrap();
    assert!(matches!(
        ni.nic().put(0, None, &put_args(PT_USER, 0, 0, d)).unwrap(),
        Outcome::Done { .. }
    ));
}

/// Producers ring only an owner announced waiting, and a claimed slot, published or
/// not, keeps the owner from sleeping.
#[test]
fn producers_ring_only_an_announced_waiter() {
    let mut ni = Ni::new(64);
    ni.owner
        .me_append(&ni.seg, PT_USER, spec(0, !0, 0, 64, PUT))
        .unwrap();
    let d: &[&[u8]] = &[b"z"];
    ni.nic().put(0, None, &put_args(PT_USER, 0, 0, d)).unwrap();
    let bell = ni.owner.doorbell(&ni.seg).unwrap();
    assert!(!bell.is_rung(), "a spinning owner is not rung");
    assert!(!ni.owner.announce_wait(&ni.seg).unwrap(), "an event unread");
    ni.owner.end_wait(&ni.seg).unwrap();
    assert_eq!(ni.events().len(), 1);
    assert!(ni.owner.announce_wait(&ni.seg).unwrap(), "nothing pending");
    ni.nic().put(0, None, &put_args(PT_USER, 0, 0, d)).unwrap();
    let bell = ni.owner.doorbell(&ni.seg).unwrap();
    assert!(bell.is_rung(), "an announced waiter is rung");
    ni.owner.end_wait(&ni.seg).unwrap();
    assert_eq!(ni.events().len(), 1);
    let nic = ni.nic();
    let mut cl = Claimer::new(&nic, 0).unwrap();
    let claim = nic.eq_reserve(&mut cl).unwrap().unwrap();
    assert!(!claim.ring, "not announced");
    drop(cl);
    assert!(
        !ni.owner.announce_wait(&ni.seg).unwrap(),
        "a claim not yet published"
    );
    ni.owner.end_wait(&ni.seg).unwrap();
}

/// Several initiators claim one locally managed entry at once: disjoint, packed ranges.
#[test]
fn concurrent_claims_pack_without_overlap() {
    let mut ni = Ni::new(4096);
    let lm = MeOptions {
        manage_local: true,
        ..PUT
    };
    ni.owner
        .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 0, 4096, lm))
        .unwrap();
    let per = if cfg!(miri) { 3 } else { 12 };
    let (seg, imp, geo) = (&ni.seg, &ni.imp, &ni.geo);
    std::thread::scope(|s| {
        for t in 0..3u8 {
            s.spawn(move || {
                let nic = Nic::new(seg, imp, geo);
                for i in 0..per {
                    let v = vec![t * 50 + i as u8; 8 + t as usize * 8];
                    let d: &[&[u8]] = &[&v];
                    let r = nic
                        .put(t as u32, None, &put_args(PT_REQUEST, 0, 0, d))
                        .unwrap();
                    assert!(matches!(r, Outcome::Done { .. }));
                }
            });
        }
    });
    let ev = ni.events();
    assert_eq!(ev.len(), 3 * per as usize);
    let mut ranges: Vec<_> = ev.iter().map(|e| (e.start, e.mlength)).collect();
    ranges.sort_unstable();
    let mut end = 0;
    for (start, len) in ranges {
        assert_eq!(start, end, "back to back");
        let b = ni.seg.view(start as usize, len as usize).unwrap().to_vec();
        assert!(b.iter().all(|&x| x == b[0]), "deposit intact");
        end = start + len as u64;
    }
}

proptest! {
    // Under Miri: no failure file (isolation has no working directory), and few cases.
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { ProptestConfig::default().cases },
        failure_persistence: if cfg!(miri) {
            None
        } else {
            ProptestConfig::default().failure_persistence
        },
        ..ProptestConfig::default()
    })]

    /// Matching follows (incoming ^ match) & !ignore == 0, whatever the bits.
    #[test]
    fn matching_rule(mb in any::<u64>(), ib in any::<u64>(), incoming in any::<u64>()) {
        let mut ni = Ni::new(64);
        ni.owner.me_append(&ni.seg, PT_USER, spec(mb, ib, 0, 64, PUT)).unwrap();
        let d: &[&[u8]] = &[b"q"];
        let r = ni.nic().put(0, None, &put_args(PT_USER, incoming, 0, d)).unwrap();
        let want = (incoming ^ mb) & !ib == 0;
        prop_assert_eq!(matches!(r, Outcome::Done { .. }), want);
    }

    /// Garbage in an entry's words or in the portal's list head is a typed error or a
    /// refusal, never a panic or an access outside the segment.
    #[test]
    fn corrupt_entry_fields_are_checked(word in 0usize..8, value in any::<u64>(), head in any::<u64>()) {
        let mut ni = Ni::new(128);
        let idx = ni.owner.me_append(&ni.seg, PT_USER, spec(0, !0, 0, 128, PUT)).unwrap();
        let base = ni.geo.me(idx).unwrap();
        if word != 0 {
            ni.seg.word(base + 8 * word).unwrap().store(value, Ordering::Relaxed);
        }
        let d: &[&[u8]] = &[b"abc"];
        let r = ni.nic().put(0, None, &put_args(PT_USER, 0, 10, d));
        if let Ok(Outcome::Done { start, .. }) = r {
            prop_assert!(start as usize + 3 <= 128);
        }
        ni.seg.word(ni.geo.pt(PT_USER).unwrap() + 8).unwrap().store(head, Ordering::Relaxed);
        let r = ni.nic().put(0, None, &put_args(PT_USER, 0, 10, d));
        if head > ni.geo.max_me as u64 {
            let corrupt = matches!(r, Err(NiError::Corrupt { .. }));
            prop_assert!(corrupt, "a bad list head is a typed error");
        }
    }

    /// Garbage event words are a typed error for that event; the queue moves on.
    #[test]
    fn corrupt_events_are_typed_errors(w0 in any::<u64>()) {
        let mut ni = Ni::new(64);
        let off = ni.geo.eq_slot(0);
        ni.seg.word(off + 8).unwrap().store(w0, Ordering::Relaxed);
        ni.seg.word(off).unwrap().store(1, Ordering::Release);
        match ni.owner.eq_poll(&ni.seg) {
            Ok(Some(e)) => prop_assert_eq!(e.kind as u8, w0 as u8),
            Ok(None) => prop_assert!(false, "the event was published"),
            Err(e) => {
                let corrupt = matches!(e, NiError::Corrupt { .. });
                prop_assert!(corrupt, "typed error");
            }
        }
        prop_assert_eq!(ni.owner.eq_poll(&ni.seg).unwrap(), None);
    }
}

/// The status of ticket `t` claimed by `claimer` (in a queue of 64 slots).
fn seq_claimed(t: u64, claimer: u32) -> u64 {
    am_shm::claim::Laps::new(64).unwrap().claimed(t, claimer)
}

/// The status of ticket `t` published (in a queue of 64 slots).
fn seq_published(t: u64) -> u64 {
    am_shm::claim::Laps::new(64).unwrap().published(t, 0)
}

/// The raw status word of ticket `t`'s slot.
fn seq_word(ni: &Ni, t: u64) -> &AtomicU64 {
    ni.seg.word(ni.geo.eq_slot(t)).unwrap()
}

/// Claims the next ticket in the name of `rank` and leaves it unpublished (a rank that
/// dies there, or is slow).
fn claim_only(ni: &Ni, rank: u32) -> u64 {
    let nic = ni.nic();
    let mut cl = Claimer::new(&nic, rank).unwrap();
    let c = nic.eq_reserve(&mut cl).unwrap().unwrap();
    cl.dead.set(); // keep the record as a live claimer's
    c.seq
}

/// `n` puts by rank 1, header data `base + i`, each read back at once: the queue flows,
/// every event once and in order (what the tests check after a repair or a take-over).
fn events_flow(ni: &mut Ni, n: u64, base: u64, what: &str) {
    let d: &[&[u8]] = &[b"q"];
    for i in 0..n {
        let mut a = put_args(PT_USER, 0, 0, d);
        a.hdr_data = base + i;
        assert!(
            matches!(ni.nic().put(1, None, &a).unwrap(), Outcome::Done { .. }),
            "{what}: put {i}"
        );
        let ev = ni.owner.eq_poll(&ni.seg).unwrap().unwrap();
        assert_eq!(ev.hdr_data, base + i, "{what}");
        ni.owner.eq_publish_head(&ni.seg).unwrap();
    }
}

fn user_entry(ni: &mut Ni) {
    ni.owner
        .me_append(&ni.seg, PT_USER, spec(0, !0, 0, 64, PUT))
        .unwrap();
}

/// A claim names its claimer in the status word, and the claimer's record vouches for
/// it; publication clears the record.
#[test]
fn claims_name_their_claimer() {
    let mut ni = Ni::new(64);
    user_entry(&mut ni);
    let t = claim_only(&ni, 2);
    assert_eq!(t, 0);
    assert_eq!(seq_word(&ni, 0).load(Ordering::Relaxed), seq_claimed(0, 2));
    assert_eq!(ni.owner.eq_head_state(&ni.seg).unwrap(), Seen::Claimed(2));
    assert!(ni.owner.vouches(&ni.seg, 2, 0).unwrap());
    assert!(
        !ni.owner.vouches(&ni.seg, 1, 0).unwrap(),
        "another rank's record"
    );
    assert_eq!(
        ni.owner.eq_unblock(&ni.seg, &[false; 4]).unwrap(),
        Unblocked::InFlight(2)
    );
    // A put by rank 1 lands behind it; its record is cleared once it published.
    let d: &[&[u8]] = &[b"q"];
    ni.nic().put(1, None, &put_args(PT_USER, 0, 0, d)).unwrap();
    let rec = ni.seg.word(ni.geo.record(1).unwrap()).unwrap();
    assert_eq!(rec.load(Ordering::Relaxed), 0);
    assert_eq!(
        ni.owner.eq_poll(&ni.seg).unwrap(),
        None,
        "held by the claim"
    );
}

/// A claim by a rank that was lost is taken over and skipped; events behind it flow,
/// and the slot is free again for the next lap.
#[test]
fn a_lost_claimers_slot_is_skipped() {
    let mut ni = Ni::new(64);
    user_entry(&mut ni);
    claim_only(&ni, 2);
    let d: &[&[u8]] = &[b"q"];
    ni.nic().put(1, None, &put_args(PT_USER, 0, 0, d)).unwrap();
    assert_eq!(ni.owner.eq_poll(&ni.seg).unwrap(), None);
    assert!(
        !ni.owner.announce_wait(&ni.seg).unwrap(),
        "a claim: do not sleep"
    );
    ni.owner.end_wait(&ni.seg).unwrap();
    let lost = [false, false, true, false];
    assert_eq!(
        ni.owner.eq_unblock(&ni.seg, &lost).unwrap(),
        Unblocked::SkippedLost(2)
    );
    let ev = ni.owner.eq_poll(&ni.seg).unwrap().unwrap();
    assert_eq!((ev.kind, ev.initiator), (EventKind::Put, 1));
    // Laps over the skipped slot: every event once, in order. Under Miri one lap: from
    // ticket 2 it reaches ticket 64, the skipped slot's next use, and goes past it.
    for lap in 0..if cfg!(miri) { 1 } else { 3u64 } {
        events_flow(&mut ni, 64, lap << 32, "lap");
    }
}

/// A `CLAIMED` status word in the name of a rank whose record does not vouch for it,
/// or of a rank outside the job, is skipped and reported; one whose record vouches is
/// waited for until the record is cleared.
#[test]
fn a_forged_claim_is_skipped_and_reported() {
    for (claimer, record) in [(3u32, 0u64), (3, ACTIVE | 1), (99, 0), (u32::MAX >> 1, 0)] {
        let mut ni = Ni::new(64);
        user_entry(&mut ni);
        seq_word(&ni, 0).store(seq_claimed(0, claimer), Ordering::Release);
        if claimer < 4 {
            let rec = ni.seg.word(ni.geo.record(claimer).unwrap()).unwrap();
            rec.store(record, Ordering::Release);
        }
        let d: &[&[u8]] = &[b"q"];
        ni.nic().put(1, None, &put_args(PT_USER, 0, 0, d)).unwrap();
        assert_eq!(ni.owner.eq_poll(&ni.seg).unwrap(), None);
        let r = ni.owner.eq_unblock(&ni.seg, &[false; 4]);
        assert!(
            matches!(r, Err(NiError::Corrupt { .. })),
            "{claimer} {record:#x}: {r:?}"
        );
        let ev = ni.owner.eq_poll(&ni.seg).unwrap().unwrap();
        assert_eq!(ev.initiator, 1);
    }
    // A record that vouches (ACTIVE from ticket 0): a live claimer at work.
    let mut ni = Ni::new(64);
    user_entry(&mut ni);
    seq_word(&ni, 0).store(seq_claimed(0, 3), Ordering::Release);
    let rec = ni.seg.word(ni.geo.record(3).unwrap()).unwrap();
    rec.store(ACTIVE, Ordering::Release);
    assert_eq!(
        ni.owner.eq_unblock(&ni.seg, &[false; 4]).unwrap(),
        Unblocked::InFlight(3)
    );
    rec.store(0, Ordering::Release);
    assert!(ni.owner.eq_unblock(&ni.seg, &[false; 4]).is_err());
    assert_eq!(ni.owner.eq_head(), 1);
}

/// A status word no producer writes at the head is a typed error once, repaired (the
/// slot is free for the next lap) and skipped; nothing published after it is lost.
#[test]
fn corrupt_status_words_are_repaired() {
    let cap = 64u64;
    let all = [
        0xdead_beef,
        u64::MAX,
        seq_published(cap),
        seq_published(5),
        seq_claimed(cap, 1),
        1 << 30 | 7,
    ];
    // Under Miri (seconds a case) one of each path: a stamp no lap writes (repaired), and
    // this lap's publication with no event behind it (refused when decoded).
    let bads: &[u64] = if cfg!(miri) { &[all[0], all[3]] } else { &all };
    for &bad in bads {
        let mut ni = Ni::new(64);
        user_entry(&mut ni);
        seq_word(&ni, 0).store(bad, Ordering::Release);
        let d: &[&[u8]] = &[b"q"];
        // The producer never claims over it: it takes ticket 1.
        ni.nic().put(1, None, &put_args(PT_USER, 0, 0, d)).unwrap();
        let r = ni.owner.eq_poll(&ni.seg);
        assert!(matches!(r, Err(NiError::Corrupt { .. })), "{bad:#x}: {r:?}");
        let ev = ni.owner.eq_poll(&ni.seg).unwrap().unwrap();
        assert_eq!(ev.initiator, 1, "{bad:#x}");
        ni.owner.eq_publish_head(&ni.seg).unwrap();
        // Two laps (one under Miri: from ticket 2, `cap` events reach ticket `cap`, the
        // repaired slot's next use): the repaired slot is claimed again, every event once.
        let laps = if cfg!(miri) { 1 } else { 2 };
        events_flow(&mut ni, laps * cap, 0, &format!("{bad:#x}"));
    }
}

/// The tail word is a hint: any value costs producers a walk, never an overwrite of an
/// unread event; a hint past a free head leaves a hole the owner skips (and reports),
/// and a hint past every claim is put back.
#[test]
fn any_tail_costs_a_walk_never_an_overwrite() {
    let cap = 64u64;
    let all = [0, 1, 2, 3, 5, 40, cap, cap + 1, cap + 3, 1 << 40, u64::MAX];
    // Under Miri (seconds a case) one of each path: the oldest unread event, the first free
    // ticket, past it (holes at 3 and 4), a whole queue on (the full check's status load),
    // and far past every claim (put back at the head).
    let tails: &[u64] = if cfg!(miri) {
        &[0, 3, 5, cap, u64::MAX]
    } else {
        &all
    };
    for &tail in tails {
        let mut ni = Ni::new(64);
        user_entry(&mut ni);
        let d: &[&[u8]] = &[b"q"];
        // Three unread events.
        for i in 0..3 {
            let mut a = put_args(PT_USER, 0, 0, d);
            a.hdr_data = 100 + i;
            ni.nic().put(1, None, &a).unwrap();
        }
        ni.seg.word(EQ_TAIL).unwrap().store(tail, Ordering::Relaxed);
        let mut a = put_args(PT_USER, 0, 0, d);
        a.hdr_data = 200;
        assert!(matches!(
            ni.nic().put(2, None, &a).unwrap(),
            Outcome::Done { .. }
        ));
        let mut seen = Vec::new();
        let mut errors = 0;
        for _ in 0..3 * cap {
            match ni.owner.eq_poll(&ni.seg) {
                Ok(Some(ev)) => seen.push(ev.hdr_data),
                Ok(None) => match ni.owner.eq_unblock(&ni.seg, &[false; 4]) {
                    Ok(Unblocked::Clear) if seen.len() == 4 => break,
                    Ok(_) => {}
                    Err(_) => errors += 1,
                },
                Err(e) => panic!("tail {tail}: {e}"),
            }
        }
        assert_eq!(seen, [100, 101, 102, 200], "tail {tail}");
        assert!(errors <= cap, "tail {tail}");
        // And the queue works on: a whole lap, over the slots the walk skipped (under Miri
        // for the hints that leave a hole or lie far ahead; a few events for the others).
        ni.owner.eq_publish_head(&ni.seg).unwrap();
        let flow = if cfg!(miri) && ![5, 40, u64::MAX].contains(&tail) {
            4
        } else {
            cap
        };
        events_flow(&mut ni, flow, 0, &format!("tail {tail}"));
    }
}

/// A head word a peer rewrote: producers never overwrite an unread event (they refuse,
/// or find the free tickets), and the owner's check repairs it.
#[test]
fn a_corrupt_head_word_is_repaired() {
    for head in [u64::MAX, 1 << 40, 200, 63] {
        let mut ni = Ni::new(64);
        user_entry(&mut ni);
        let d: &[&[u8]] = &[b"q"];
        let mut a = put_args(PT_USER, 0, 0, d);
        a.hdr_data = 1;
        ni.nic().put(1, None, &a).unwrap();
        ni.seg.word(EQ_HEAD).unwrap().store(head, Ordering::Release);
        a.hdr_data = 2;
        let early = ni.nic().put(1, None, &a).unwrap();
        assert!(matches!(
            ni.owner.verify(&ni.seg),
            Err(NiError::Corrupt { .. })
        ));
        assert!(ni.owner.verify(&ni.seg).is_ok(), "repaired");
        // The owner reads what is there (skipping, and reporting once, the hole a claim
        // beyond a forged head left).
        let mut got = Vec::new();
        let mut errors = 0;
        for _ in 0..200 {
            match ni.owner.eq_poll(&ni.seg).unwrap() {
                Some(e) => got.push(e.hdr_data),
                None => match ni.owner.eq_unblock(&ni.seg, &[false; 4]) {
                    Ok(Unblocked::Clear) => break,
                    Ok(other) => panic!("head {head}: {other:?}"),
                    Err(_) => errors += 1,
                },
            }
        }
        assert!(errors <= 1, "head {head}: {errors} errors");
        ni.owner.eq_publish_head(&ni.seg).unwrap();
        a.hdr_data = 3;
        assert!(matches!(
            ni.nic().put(1, None, &a).unwrap(),
            Outcome::Done { .. }
        ));
        got.extend(ni.events().iter().map(|e| e.hdr_data));
        match early {
            Outcome::Done { .. } => assert_eq!(got, [1, 2, 3], "head {head}"),
            Outcome::Refused(f) => {
                assert_eq!(f, NiFail::EqFull);
                assert_eq!(got, [1, 3], "head {head}");
            }
        }
    }
}

/// `lm_drained`: an exhausted entry is re-linked only when no live walker that names it
/// holds a claimed slot and no event about it is unread, whatever `used` says; a lost
/// walker's bytes are written off.
#[test]
fn lm_drained_follows_the_claims_not_the_counts() {
    let lm = MeOptions {
        manage_local: true,
        ..PUT
    };
    for walker_lost in [false, true] {
        let mut ni = Ni::new(256);
        let a = ni
            .owner
            .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 0, 32, lm))
            .unwrap();
        ni.owner
            .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 32, 64, lm))
            .unwrap();
        // Rank 3 claims 16 bytes of entry `a` and stops before its event.
        let nic = ni.nic();
        let mut cl = Claimer::new(&nic, 3).unwrap();
        cl.slot = nic.eq_reserve(&mut cl).unwrap();
        cl.record_lm(a);
        let counter = ni.seg.word(ni.geo.me(a).unwrap() + CACHE_LINE).unwrap();
        assert_eq!(counter.fetch_add(16, Ordering::AcqRel), 0);
        cl.dead.set();
        drop(cl);
        // Rank 1 takes the other 16, and a third put does not fit (unlink, used 32).
        let v = [5u8; 16];
        let d: &[&[u8]] = &[&v];
        for _ in 0..2 {
            ni.nic()
                .put(1, None, &put_args(PT_REQUEST, 0, 0, d))
                .unwrap();
        }
        // A forged `used` of 0 changes nothing.
        ni.seg
            .word(ni.geo.me(a).unwrap() + CACHE_LINE + 8)
            .unwrap()
            .store(0, Ordering::Relaxed);
        let mut lost = [false; 4];
        assert_eq!(
            ni.owner.lm_drained(&ni.seg, a, &lost).unwrap(),
            Drained::Busy
        );
        lost[3] = walker_lost;
        assert_eq!(
            ni.owner.lm_drained(&ni.seg, a, &lost).unwrap(),
            Drained::Busy,
            "rank 1's event is unread"
        );
        if walker_lost {
            assert_eq!(
                ni.owner.eq_unblock(&ni.seg, &lost).unwrap(),
                Unblocked::SkippedLost(3)
            );
        } else {
            // It was only slow: it publishes after all.
            let nic = ni.nic();
            let mut cl = Claimer::new(&nic, 3).unwrap();
            cl.eq_from = Some(0);
            cl.lm = ACTIVE | (a as u64 + 1);
            let mut ev = Event::new(EventKind::Put, 3, PT_REQUEST);
            ev.me = a;
            ev.mlength = 16;
            nic.eq_publish(
                Claim {
                    seq: 0,
                    ring: false,
                },
                &ev,
            )
            .unwrap();
        }
        let mut kinds = Vec::new();
        while let Some(e) = ni.owner.eq_poll(&ni.seg).unwrap() {
            kinds.push((e.kind, e.initiator));
        }
        // Rank 1's second put reserved its slot before its unlink's.
        let mut want = vec![
            (EventKind::Put, 1),
            (EventKind::Put, 1),
            (EventKind::Unlink, 1),
        ];
        if !walker_lost {
            want.insert(0, (EventKind::Put, 3));
        }
        assert_eq!(kinds, want);
        assert_eq!(
            ni.owner.lm_drained(&ni.seg, a, &lost).unwrap(),
            Drained::Yes
        );
        ni.owner.lm_relink(&ni.seg, a).unwrap();
        assert_eq!(
            ni.owner.lm_drained(&ni.seg, a, &lost).unwrap(),
            Drained::NotExhausted
        );
    }
}

/// Every word walkers read that differs from the owner's copy is repaired by `verify`
/// (and reported); puts then match again.
#[test]
fn verify_repairs_the_portal_table_and_entries() {
    let lm = MeOptions {
        manage_local: true,
        ..PUT
    };
    type At = fn(&Ni) -> usize;
    let words: Vec<(&str, At, u64)> = vec![
        ("pt state", |ni| ni.geo.pt(PT_REQUEST).unwrap(), 77),
        ("pt head", |ni| ni.geo.pt(PT_REQUEST).unwrap() + 8, 5),
        ("pt head past", |ni| ni.geo.pt(PT_REQUEST).unwrap() + 8, 999),
        ("pt options", |ni| ni.geo.pt(PT_REQUEST).unwrap() + 16, 0),
        ("me state", |ni| ni.geo.me(0).unwrap(), 0x1234),
        ("me match", |ni| ni.geo.me(0).unwrap() + 8, 7),
        ("me ignore", |ni| ni.geo.me(0).unwrap() + 16, 0xF0),
        ("me options", |ni| ni.geo.me(0).unwrap() + 24, 0xFFFF),
        ("me start", |ni| ni.geo.me(0).unwrap() + 32, 1 << 40),
        ("me length", |ni| ni.geo.me(0).unwrap() + 40, 0),
        ("me next", |ni| ni.geo.me(0).unwrap() + 48, 9),
        ("me used", |ni| ni.geo.me(0).unwrap() + 72, 1 << 50),
    ];
    for (what, at, value) in words {
        let mut ni = Ni::new(256);
        ni.owner
            .me_append(&ni.seg, PT_REQUEST, spec(1, 0, 0, 64, lm))
            .unwrap();
        ni.owner
            .me_append(&ni.seg, PT_REQUEST, spec(0, !0, 64, 64, lm))
            .unwrap();
        ni.seg
            .word(at(&ni))
            .unwrap()
            .store(value, Ordering::Release);
        let v = [1u8; 8];
        let d: &[&[u8]] = &[&v];
        // Whatever the walk does with it: a typed error or a refusal, never a panic.
        let _ = ni.nic().put(0, None, &put_args(PT_REQUEST, 1, 0, d));
        let r = ni.owner.verify(&ni.seg);
        assert!(matches!(r, Err(NiError::Corrupt { .. })), "{what}: {r:?}");
        assert!(ni.owner.verify(&ni.seg).is_ok(), "{what}: repaired");
        // (Flow control may have disabled the portal entry meanwhile.)
        ni.owner.pt_enable(&ni.seg, PT_REQUEST).unwrap();
        let got = ni
            .nic()
            .put(0, None, &put_args(PT_REQUEST, 1, 0, d))
            .unwrap();
        assert!(matches!(got, Outcome::Done { .. }), "{what}: {got:?}");
    }
}

/// A wire that keeps the entries it checked (`MeSeen`) acts on them only while their
/// state word is unchanged: a field a peer rewrote under the same state word is not
/// used (the owner's check repairs it under a new generation), a field read during a
/// corruption is dropped with the repair, and an entry unlinked and appended again is
/// read again.
#[test]
fn kept_entries_follow_the_state_word() {
    let mut ni = Ni::new(256);
    let a = ni
        .owner
        .me_append(&ni.seg, PT_USER, spec(0, !0, 0, 64, PUT))
        .unwrap();
    let mut seen = MeSeen::new(&ni.geo);
    let d: &[&[u8]] = &[b"abc"];
    let put = |ni: &Ni, seen: &mut MeSeen| {
        ni.nic()
            .put_seen(seen, 1, &put_args(PT_USER, 0, 8, d))
            .unwrap()
    };
    let start = ni.geo.me(a).unwrap() + 32;
    assert_eq!(put(&ni, &mut seen), Outcome::Done { me: a, start: 8 });
    // A stray write of the start under the same state word: the kept entry is used.
    ni.seg.word(start).unwrap().store(128, Ordering::Relaxed);
    assert_eq!(put(&ni, &mut seen), Outcome::Done { me: a, start: 8 });
    assert!(matches!(
        ni.owner.verify(&ni.seg),
        Err(NiError::Corrupt { .. })
    ));
    // A wire that first reads the entry during a corruption keeps the corrupt (but
    // in-range) start only until the repair.
    let mut late = MeSeen::new(&ni.geo);
    ni.seg.word(start).unwrap().store(128, Ordering::Relaxed);
    assert_eq!(put(&ni, &mut late), Outcome::Done { me: a, start: 136 });
    assert_eq!(put(&ni, &mut late), Outcome::Done { me: a, start: 136 });
    assert!(ni.owner.verify(&ni.seg).is_err());
    assert_eq!(put(&ni, &mut late), Outcome::Done { me: a, start: 8 });
    assert_eq!(put(&ni, &mut seen), Outcome::Done { me: a, start: 8 });
    // Unlinked and appended again elsewhere: a new state word, read again.
    ni.owner.me_unlink(&ni.seg, a).unwrap();
    let b = ni
        .owner
        .me_append(&ni.seg, PT_USER, spec(0, !0, 64, 64, PUT))
        .unwrap();
    assert_eq!(a, b, "the same record");
    assert_eq!(put(&ni, &mut seen), Outcome::Done { me: b, start: 72 });
    assert_eq!(ni.events().len(), 7);
}

/// A locally managed entry must post events (its owner re-links it by them).
#[test]
fn locally_managed_entries_post_events() {
    let mut ni = Ni::new(64);
    let bad = MeOptions {
        manage_local: true,
        event_disable: true,
        ..PUT
    };
    assert!(ni
        .owner
        .me_append(&ni.seg, PT_USER, spec(0, 0, 0, 64, bad))
        .is_err());
}
