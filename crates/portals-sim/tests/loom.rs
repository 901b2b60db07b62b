//! loom models of the Portals event queue and its waiting word, on the real `Nic` and
//! `NiOwner` over a heap segment (am-shm's atomics are loom's under `cfg(loom)`, and its
//! futex is modelled without timeouts, so a lost wake-up is a deadlock loom reports).
//!
//! The event queue is a claimed ring (`am_shm::claim`), whose claims, records and take-overs
//! have their models in am-shm's loom suite. These check what Portals adds on it: a
//! producer's put claims an event slot, deposits, publishes, and rings the doorbell only if
//! the owner announced that it may sleep; the owner polls, announces (`announce_wait`),
//! sleeps on the doorbell only if nothing is claimed at its head, and ends the wait. Every
//! event must be read exactly once, with its data, and the owner must never sleep through
//! one. And a locally managed entry is never re-linked before its deposits were read.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p portals-sim --release --test loom`
#![cfg(loom)]

use std::time::Duration;

use am_shm::sync::{model, spawn};
use am_shm::Segment;
use loom::sync::Arc;
use loom::thread;
use portals_sim::ni::{
    Drained, Event, EventKind, MeOptions, MeSpec, NiGeometry, NiOwner, Nic, Outcome, PutArgs,
    PT_REQUEST, PT_USER,
};

/// The smallest NI: `ranks` ranks, one match entry taking any put into 64 bytes, an event
/// queue of 8 slots.
fn ni(ranks: u32) -> (Arc<Segment>, NiGeometry, NiOwner) {
    let geo = NiGeometry::new(ranks, 1, 8, 64).unwrap();
    let seg = Segment::heap(geo.words_len(), geo.bytes()).unwrap();
    let mut owner = NiOwner::new(geo, &seg, [false; 4]).unwrap();
    let spec = MeSpec {
        match_bits: 0,
        ignore_bits: !0,
        start: 0,
        length: 64,
        options: MeOptions::default().put(true),
    };
    owner.me_append(&seg, PT_USER, spec).unwrap();
    (Arc::new(seg), geo, owner)
}

/// Rank `rank` puts 8 bytes of `rank + 1` at offset `8 * rank`, with `rank` as header data.
fn put(seg: &Segment, geo: &NiGeometry, rank: u32) {
    let imp = seg.import();
    let nic = Nic::new(seg, &imp, geo);
    let data = [rank as u8 + 1; 8];
    let parts: &[&[u8]] = &[&data];
    let args = PutArgs {
        pt: PT_USER,
        match_bits: 0,
        hdr_data: rank as u64,
        remote_offset: 8 * rank as u64,
        data: parts,
        shared: None,
        ack: false,
        send_event: false,
        pad: false,
    };
    assert!(matches!(
        nic.put(rank, None, &args).unwrap(),
        Outcome::Done { .. }
    ));
}

/// The owner's loop: poll; if nothing, announce, and sleep only if that is safe (else let
/// the producer run); until `n` events were read. Sleeps without a timeout under loom.
fn owner_reads(owner: &mut NiOwner, seg: &Segment, n: usize) -> Vec<Event> {
    let mut got = Vec::new();
    loop {
        while let Some(e) = owner.eq_poll(seg).unwrap() {
            got.push(e);
        }
        if got.len() >= n {
            break;
        }
        if owner.announce_wait(seg).unwrap() {
            owner.doorbell(seg).unwrap().sleep(Duration::from_secs(1));
        } else {
            // A claim in flight at the head: the producer publishes soon.
            thread::yield_now();
        }
        owner.end_wait(seg).unwrap();
    }
    got
}

/// Checks the events read: one per rank, each with its data in place.
fn check(seg: &Segment, mut got: Vec<Event>, ranks: u32) {
    got.sort_by_key(|e| e.initiator);
    assert_eq!(got.len(), ranks as usize);
    for (r, e) in got.iter().enumerate() {
        assert_eq!(
            (e.kind, e.initiator, e.hdr_data),
            (EventKind::Put, r as u32, r as u64)
        );
        let bytes = seg.view(e.start as usize, 8).unwrap().to_vec();
        assert_eq!(bytes, [r as u8 + 1; 8]);
    }
}

/// One producer's put against an owner that polls and sleeps: no lost wake-up, the event
/// read once.
#[test]
fn loom_put_against_a_sleeping_owner() {
    model(3, || {
        let (seg, geo, mut owner) = ni(1);
        let s = seg.clone();
        let producer = spawn(move || put(&s, &geo, 0));
        let got = owner_reads(&mut owner, &seg, 1);
        producer.join().unwrap();
        check(&seg, got, 1);
        assert_eq!(owner.eq_poll(&seg).unwrap(), None, "read once");
    });
}

/// Two producers post while the owner waits: both events are read once, none is slept
/// through (the second claim may be the one the owner's announcement races with).
#[test]
fn loom_two_producers_against_a_sleeping_owner() {
    model(3, || {
        let (seg, geo, mut owner) = ni(2);
        let producers: Vec<_> = (0..2)
            .map(|r| {
                let s = seg.clone();
                spawn(move || put(&s, &geo, r))
            })
            .collect();
        let got = owner_reads(&mut owner, &seg, 2);
        for p in producers {
            p.join().unwrap();
        }
        check(&seg, got, 2);
        assert_eq!(owner.eq_poll(&seg).unwrap(), None, "read once");
    });
}

/// A walker fills a locally managed entry while its owner asks whether the entry can be
/// re-linked: `lm_drained` never says yes before the owner has read the walker's event (the
/// walker's record, stored before its claim of space, is seen by an owner that sees the
/// claim's effect on the offset).
#[test]
fn loom_no_relink_before_the_deposit_is_read() {
    model(3, || {
        let geo = NiGeometry::new(1, 1, 8, 64).unwrap();
        let seg = Arc::new(Segment::heap(geo.words_len(), geo.bytes()).unwrap());
        let mut owner = NiOwner::new(geo, &seg, [true, false, false, false]).unwrap();
        let spec = MeSpec {
            match_bits: 0,
            ignore_bits: !0,
            start: 0,
            length: 8,
            options: MeOptions::default().put(true).manage_local(true),
        };
        let me = owner.me_append(&seg, PT_REQUEST, spec).unwrap();
        let s = seg.clone();
        let walker = spawn(move || {
            let imp = s.import();
            let nic = Nic::new(&s, &imp, &geo);
            let data = [7u8; 8];
            let parts: &[&[u8]] = &[&data];
            let args = PutArgs {
                pt: PT_REQUEST,
                match_bits: 0,
                hdr_data: 0,
                remote_offset: 0,
                data: parts,
                shared: None,
                ack: false,
                send_event: false,
                pad: false,
            };
            assert_eq!(
                nic.put(0, None, &args).unwrap(),
                Outcome::Done { me, start: 0 }
            );
        });
        let mut read = false;
        loop {
            while let Some(e) = owner.eq_poll(&seg).unwrap() {
                assert_eq!((e.kind, e.me, e.mlength), (EventKind::Put, me, 8));
                assert_eq!(seg.view(0, 8).unwrap().to_vec(), [7; 8]);
                read = true;
            }
            match owner.lm_drained(&seg, me, &[false]).unwrap() {
                Drained::Yes => {
                    assert!(read, "drained with its deposit unread");
                    break;
                }
                _ => thread::yield_now(),
            }
        }
        walker.join().unwrap();
    });
}
