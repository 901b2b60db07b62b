//! loom models of am-shm's own code: under `cfg(loom)` a heap segment is an array of loom
//! atomics (`am_shm::sync`), so these models run the real `Slots`, the claimed ring (in the
//! mailbox's layout, and in the Portals event queue's: status first, blind claims), `Ring`
//! and `Doorbell`,
//! copies included, and loom explores their interleavings. A lost wake-up shows as a
//! deadlock (the futex is modelled without timeouts), a torn or stale payload as a failed
//! assertion.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p am-shm --release --test loom`
#![cfg(loom)]

use std::time::Duration;

use am_shm::claim::{self, Laps, Slots as _};
use am_shm::doorbell::tag;
use am_shm::mailbox::{Ring, Seen};
use am_shm::stamp::Slots;
use am_shm::sync::{spawn, AtomicU64, Ordering};
use am_shm::{Rung, Segment, ShmError};
use loom::sync::Arc;

fn model(f: impl Fn() + Sync + Send + 'static) {
    am_shm::sync::model(3, f);
}

/// Stamp hand-over through `Slots`: the reader sees the whole body once it sees the stamp,
/// and the writer reuses the slot only after the hand-back.
#[test]
fn loom_stamp_hand_over() {
    model(|| {
        let slots = Slots {
            data: 0,
            count: 1,
            size: 32,
        };
        let seg = Arc::new(Segment::heap(64, slots.data_bytes()).unwrap());
        let w = seg.clone();
        let writer = spawn(move || {
            let to = w.import();
            let back = w.word(0).unwrap();
            for seq in 1..=2u64 {
                // Claim: the reader handed back the previous message.
                while back.load(Ordering::Acquire) + 1 < seq {
                    loom::thread::yield_now();
                }
                let body = [seq as u8; 12];
                slots.write(&to, 0, seq as u32, &[&body]).unwrap();
                slots.publish(&to, 0, seq).unwrap();
            }
        });
        let back = seg.word(0).unwrap();
        for seq in 1..=2u64 {
            while !slots.is_published(&seg, 0, seq).unwrap() {
                loom::thread::yield_now();
            }
            let (flags, body) = slots.body(&seg, 0).unwrap();
            assert_eq!(flags, seq as u32);
            assert_eq!(body.to_vec(), [seq as u8; 12]);
            back.store(seq, Ordering::Release);
        }
        writer.join().unwrap();
    });
}

/// Doorbell: a ring after a ready flag is never lost, whichever way ring and sleep
/// interleave.
#[test]
fn loom_doorbell_no_lost_wakeup() {
    model(|| {
        let seg = Arc::new(Segment::heap(128, 0).unwrap());
        let s = seg.clone();
        let sender = spawn(move || {
            s.word(64).unwrap().store(7, Ordering::Release); // the ready flag
            let _ = s.import().ring(0).unwrap();
        });
        let bell = seg.doorbell(0).unwrap();
        loop {
            if bell.take() {
                break;
            }
            bell.sleep(Duration::from_secs(1));
        }
        assert_eq!(seg.load_word(64).unwrap(), 7);
        sender.join().unwrap();
    });
}

/// Read before write: a sender that finds the flag already carrying its tag does not ring; the
/// receiver's take-then-scan still finds the message, or the sender sees the take and rings.
#[test]
fn loom_doorbell_lazy_ring_never_loses_a_message() {
    model(|| {
        let seg = Arc::new(Segment::heap(128, 0).unwrap());
        // The receiver left the flag set with the sender's tag (a message already taken).
        let _ = seg.import().ring_tagged(0, tag(1)).unwrap();
        let s = seg.clone();
        let sender = spawn(move || {
            s.word(64).unwrap().store(7, Ordering::Release);
            let _ = s.doorbell(0).unwrap().ring_tagged_lazy(tag(1));
        });
        let bell = seg.doorbell(0).unwrap();
        loop {
            bell.take_tags();
            if seg.load_word(64).unwrap() == 7 {
                break;
            }
            bell.sleep(Duration::from_secs(1));
        }
        sender.join().unwrap();
    });
}

/// Arming: a receiver that arms instead of sleeping loses no wake-up. Either its arming
/// finds a ring (and it polls, finding the flag the ring published), or every ring came
/// after it and exactly one of them (a plain ring and a lazy one) is told to wake it.
#[test]
fn loom_doorbell_arm_tells_exactly_one_ring() {
    model(|| {
        let seg = Arc::new(Segment::heap(128, 0).unwrap());
        let senders: Vec<_> = [(64, false), (72, true)]
            .into_iter()
            .map(|(flag, lazy)| {
                let s = seg.clone();
                spawn(move || {
                    s.word(flag).unwrap().store(7, Ordering::Release);
                    if lazy {
                        s.doorbell(0).unwrap().ring_tagged_lazy(tag(1))
                    } else {
                        s.import().ring(0).unwrap()
                    }
                })
            })
            .collect();
        let bell = seg.doorbell(0).unwrap();
        let armed = bell.arm();
        let seen = [64, 72].map(|f| seg.load_word(f).unwrap() == 7);
        let told = senders
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&r| r == Rung::Armed)
            .count();
        if armed {
            assert_eq!(
                told, 1,
                "armed with nothing rung: the first ring after is told"
            );
        } else {
            assert_eq!(
                told, 0,
                "a ring came first: the receiver polls, nobody is told"
            );
            assert!(
                seen.contains(&true),
                "the ring's flag is visible to the poll"
            );
        }
        assert!(bell.is_armed());
    });
}

fn ring(slots: usize) -> Ring {
    Ring::new(0, 64, 0, slots, 16).unwrap()
}

/// The owner of a one-slot mailbox whose senders each send `[id; 8]` with meta `id`: looks
/// twice, and checks and consumes what is published. Returns its head.
fn owner_reads_twice(r: Ring, seg: &Segment) -> u64 {
    let own = seg.import();
    let mut head = 0u64;
    for _ in 0..2 {
        if let Seen::Published(id) = r.look(seg, head).unwrap() {
            let mut b = [0u8; 8];
            r.read_payload(seg, head, &mut b).unwrap();
            assert_eq!(b, [id as u8; 8], "a payload overwritten before it was read");
            head += 1;
            r.consumed(&own, head).unwrap();
        }
    }
    head
}

/// Two senders each try once to claim the slot of a one-slot mailbox while its owner reads
/// and consumes: a sender gets the second lap only after the owner consumed the first
/// message, so every message the owner reads is intact, and every claim is published once.
#[test]
fn loom_mailbox_claims_never_overwrite() {
    model(|| {
        let r = ring(1);
        let seg = Arc::new(Segment::heap(192, r.data_bytes()).unwrap());
        let senders: Vec<_> = (1..=2u32)
            .map(|id| {
                let s = seg.clone();
                spawn(move || {
                    let w = s.import();
                    let mut head = 0;
                    let mut got = [0u64; 1];
                    let record = 128 + 8 * id as usize;
                    if !r.try_claim(&s, 1, id, record, &mut head, &mut got).unwrap() {
                        return None;
                    }
                    r.write(&w, got[0], 0, &[id as u8; 8]).unwrap();
                    r.publish(&w, got[0], id).unwrap();
                    r.release(&w, record).unwrap();
                    Some(got[0])
                })
            })
            .collect();
        let head = owner_reads_twice(r, &seg);
        let mut tickets: Vec<u64> = senders
            .into_iter()
            .filter_map(|s| s.join().unwrap())
            .collect();
        tickets.sort_unstable();
        assert!(
            !tickets.is_empty(),
            "the first claim always finds the slot free"
        );
        assert_eq!(tickets[0], 0);
        if tickets.len() == 2 {
            assert_eq!(
                tickets[1], 1,
                "the second lap, after the owner consumed ticket 0"
            );
            assert!(head >= 1);
        }
    });
}

/// The same race through the one-step send (`Ring::send_one`: claim, write, publish and
/// release in one call, the slot checked once): the owner never reads an overwritten payload,
/// and a second message is sent only into a lap the owner freed.
#[test]
fn loom_mailbox_send_one_never_overwrites() {
    model(|| {
        let r = ring(1);
        let seg = Arc::new(Segment::heap(192, r.data_bytes()).unwrap());
        let senders: Vec<_> = (1..=2u32)
            .map(|id| {
                let s = seg.clone();
                spawn(move || {
                    let mut head = 0;
                    let record = 128 + 8 * id as usize;
                    r.send_one(&s, id, record, &mut head, &[&[id as u8; 8]], id)
                        .unwrap()
                })
            })
            .collect();
        let head = owner_reads_twice(r, &seg);
        let sent = senders
            .into_iter()
            .map(|s| s.join().unwrap())
            .filter(|&ok| ok)
            .count();
        assert!(sent >= 1, "the first send always finds the slot free");
        if sent == 2 {
            assert!(
                head >= 1,
                "the second lap only after the owner consumed the first"
            );
        }
        for id in 1..=2u64 {
            assert_eq!(
                seg.load_word(128 + 8 * id as usize).unwrap(),
                0,
                "a claim left open"
            );
        }
    });
}

/// The same race through the handles the VELO mailbox keeps (`Port::send`, the owner's
/// `Inbox`): the owner finds a message published only with its payload whole, never an
/// overwritten one, and a second message only in a lap it freed.
#[test]
fn loom_mailbox_port_and_inbox_never_overwrite() {
    model(|| {
        let r = ring(1);
        let seg = Arc::new(Segment::heap(192, r.data_bytes()).unwrap());
        let senders: Vec<_> = (1..=2u32)
            .map(|id| {
                let port = r.port(&seg, id, 128 + 8 * id as usize).unwrap();
                spawn(move || {
                    let mut head = 0;
                    port.send(&mut head, &[id as u8; 4], &[id as u8; 4], id)
                        .unwrap()
                })
            })
            .collect();
        let inbox = r.inbox(&seg).unwrap();
        let mut head = 0u64;
        for _ in 0..2 {
            if let Some(id) = inbox.published(head) {
                let mut b = [0u8; 8];
                inbox.read_payload(head, &mut b).unwrap();
                assert_eq!(b, [id as u8; 8], "a payload overwritten before it was read");
                head += 1;
                inbox.consumed(head);
            }
        }
        let sent = senders
            .into_iter()
            .map(|s| s.join().unwrap())
            .filter(|&ok| ok)
            .count();
        assert!(sent >= 1, "the first send always finds the slot free");
        if sent == 2 {
            assert!(
                head >= 1,
                "the second lap only after the owner consumed the first"
            );
        }
    });
}

/// A two-slot claim races a one-slot claim for a two-slot mailbox: exactly one fits; the big
/// one gets both slots or gives back what it took; nothing is delivered twice or lost.
#[test]
fn loom_mailbox_multi_slot_claims_are_all_or_nothing() {
    model(|| {
        let r = ring(2);
        let seg = Arc::new(Segment::heap(192, r.data_bytes()).unwrap());
        let s = seg.clone();
        let big = spawn(move || {
            let w = s.import();
            let mut head = 0;
            let mut got = [0u64; 2];
            if r.try_claim(&s, 2, 2, 144, &mut head, &mut got).unwrap() {
                for &t in &got {
                    r.publish(&w, t, 2).unwrap();
                }
                r.release(&w, 144).unwrap();
                true
            } else {
                false
            }
        });
        let w = seg.import();
        let mut head = 0;
        let mut got = [0u64; 1];
        let small = r.try_claim(&seg, 1, 1, 136, &mut head, &mut got).unwrap();
        if small {
            r.publish(&w, got[0], 1).unwrap();
            r.release(&w, 136).unwrap();
        }
        let big = big.join().unwrap();
        assert!(
            small != big,
            "exactly one of them fits: small {small}, big {big}"
        );
        let mut published = [0; 3];
        for t in 0..2 {
            match r.look(&seg, t).unwrap() {
                Seen::Published(id) => published[id as usize] += 1,
                Seen::Skipped(2) | Seen::Empty => assert!(!big),
                other => panic!("ticket {t}: {other:?}"),
            }
        }
        assert_eq!(published[1], usize::from(small));
        assert_eq!(published[2], if big { 2 } else { 0 });
    });
}

/// A port's run claim of both slots of a two-slot mailbox races a one-slot send: exactly
/// one fits; the run gets both slots or gives back what it took (skipped); the owner sees
/// every published payload whole, and nothing twice.
#[test]
fn loom_mailbox_run_claims_are_all_or_nothing() {
    model(|| {
        let r = ring(2);
        let seg = Arc::new(Segment::heap(192, r.data_bytes()).unwrap());
        let run = r.port(&seg, 2, 144).unwrap();
        let big = spawn(move || match run.claim_run(2, 0) {
            Some(t) => {
                for k in 0..2 {
                    run.write_two(t + k, &[2; 8], &[], 2).unwrap();
                }
                run.release();
                true
            }
            None => false,
        });
        let one = r.port(&seg, 1, 136).unwrap();
        let mut head = 0;
        let small = one.send(&mut head, &[1; 8], &[], 1).unwrap();
        let big = big.join().unwrap();
        assert!(small != big, "exactly one fits: small {small}, big {big}");
        let inbox = r.inbox(&seg).unwrap();
        let mut published = [0; 3];
        for t in 0..2 {
            match inbox.look(t).unwrap() {
                Seen::Published(id) => {
                    let mut b = [0u8; 8];
                    inbox.read_payload(t, &mut b).unwrap();
                    assert_eq!(b, [id as u8; 8]);
                    published[id as usize] += 1;
                }
                Seen::Skipped(2) | Seen::Empty => assert!(!big),
                other => panic!("ticket {t}: {other:?}"),
            }
        }
        assert_eq!(published[1], usize::from(small));
        assert_eq!(published[2], if big { 2 } else { 0 });
        assert_eq!(seg.load_word(144).unwrap(), 0, "a claim left open");
    });
}

/// The record a claimer stores before its compare-and-swap is visible to an owner that sees
/// the claim: a live claim is never taken for a forged one.
#[test]
fn loom_mailbox_claims_are_vouched_for() {
    model(|| {
        let r = ring(2);
        let seg = Arc::new(Segment::heap(192, r.data_bytes()).unwrap());
        let s = seg.clone();
        let sender = spawn(move || {
            let mut head = 0;
            let mut got = [0u64; 1];
            assert!(r.try_claim(&s, 1, 3, 152, &mut head, &mut got).unwrap());
        });
        if let Seen::Claimed(3) = r.look(&seg, 0).unwrap() {
            assert!(r.claim_is_genuine(&seg, 0, 152));
        }
        sender.join().unwrap();
        let _: &AtomicU64 = seg.word(152).unwrap();
    });
}

// ---- the claimed ring itself, in the other layout: status first, blind claims ----

/// A claimed ring laid out as the Portals event queue lays out its own: in the word area,
/// slot `i` at `SLOT0 + 16 * i`, its status first and one value word after it; the tail
/// at 0, the head at 8, claimer `id`'s record at `16 + 8 * id`.
struct StatusFirst<'s> {
    seg: &'s Segment,
    laps: Laps,
}

const SLOT0: usize = 64;

impl claim::Slots for StatusFirst<'_> {
    type Error = ShmError;

    fn laps(&self) -> Laps {
        self.laps
    }

    fn status(&self, t: u64) -> Result<&AtomicU64, ShmError> {
        self.seg.word(SLOT0 + 16 * self.laps.split(t).1)
    }
}

struct Producer<'s> {
    record: &'s AtomicU64,
    recorded: Option<u64>,
    id: u32,
}

impl claim::Claimant for Producer<'_> {
    type Error = ShmError;

    fn claimer(&self) -> u32 {
        self.id
    }

    fn record(&mut self, t: u64) -> Result<(), ShmError> {
        if self.recorded.is_none_or(|r| t < r) {
            self.record.store(claim::record(t), Ordering::Relaxed);
            self.recorded = Some(t);
        }
        Ok(())
    }
}

/// One blind claim by `id` in the status-first ring of `slots` slots: its ticket, the value
/// `id` stored and published (meta data 0), the record cleared.
fn blind_send(seg: &Segment, slots: u64, id: u32) -> Option<u64> {
    let ring = StatusFirst {
        seg,
        laps: Laps::new(slots).unwrap(),
    };
    let record = seg.word(16 + 8 * id as usize).unwrap();
    let mut c = Producer {
        record,
        recorded: None,
        id,
    };
    let (tail, head_word) = (seg.word(0).unwrap(), seg.word(8).unwrap());
    let (mut head, mut cursor) = (0, tail.load(Ordering::Relaxed));
    let t = claim::claim_next::<_, _, true>(&ring, tail, head_word, &mut head, &mut cursor, &mut c)
        .unwrap()?;
    let status = ring.status(t).unwrap();
    seg.word(SLOT0 + 16 * ring.laps.split(t).1 + 8)
        .unwrap()
        .store(id as u64, Ordering::Relaxed);
    status.store(ring.laps.published(t, 0), Ordering::Release);
    record.store(0, Ordering::Release);
    Some(t)
}

/// Two producers claim blind (a compare-and-swap from the status the previous lap usually
/// leaves, no load first) in a two-slot status-first ring while its owner reads: distinct
/// tickets, each value read once and intact, and a claim the owner sees is vouched for.
#[test]
fn loom_claim_blind_producers_take_distinct_slots() {
    model(|| {
        let seg = Arc::new(Segment::heap(SLOT0 + 32, 0).unwrap());
        let producers: Vec<_> = (1..=2u32)
            .map(|id| {
                let s = seg.clone();
                spawn(move || blind_send(&s, 2, id))
            })
            .collect();
        let laps = Laps::new(2).unwrap();
        let mut read = Vec::new();
        for t in 0..2u64 {
            let st = seg
                .word(SLOT0 + 16 * t as usize)
                .unwrap()
                .load(Ordering::Acquire);
            match laps.look(st, t).unwrap() {
                Seen::Published(0) => {
                    let v = seg.load_word(SLOT0 + 16 * t as usize + 8).unwrap();
                    read.push(v);
                }
                Seen::Claimed(id) => {
                    // A record that no longer vouches: the claimer published meanwhile (the
                    // owner's take-over would then fail on the changed status).
                    let rec = seg.load_word(16 + 8 * id as usize).unwrap();
                    let now = seg.load_word(SLOT0 + 16 * t as usize).unwrap();
                    assert!(
                        claim::vouches(rec, t) || now != st,
                        "a live claim taken for a forged one"
                    );
                    break;
                }
                Seen::Empty => break,
                other => panic!("ticket {t}: {other:?}"),
            }
        }
        let mut tickets: Vec<u64> = producers
            .into_iter()
            .map(|p| p.join().unwrap().expect("two slots, two claims"))
            .collect();
        tickets.sort_unstable();
        assert_eq!(tickets, [0, 1]);
        read.sort_unstable();
        read.dedup();
        assert!(read.iter().all(|&v| v == 1 || v == 2), "{read:?}");
    });
}

/// The owner takes over a slot whose claimer died (claimed, never published) while another
/// producer claims blind in the one-slot ring: the producer gets the next lap only after
/// the take-over and the owner's head moved, its blind guess then fails on the skipped
/// status and its claim succeeds from the status it found; nothing is claimed over.
#[test]
fn loom_take_over_hands_the_slot_to_the_next_lap() {
    model(|| {
        let seg = Arc::new(Segment::heap(SLOT0 + 16, 0).unwrap());
        let laps = Laps::new(1).unwrap();
        // Claimer 1 claimed ticket 0 and died.
        let status = seg.word(SLOT0).unwrap();
        status.store(laps.claimed(0, 1), Ordering::Relaxed);
        seg.word(0).unwrap().store(1, Ordering::Relaxed);
        let s = seg.clone();
        let producer = spawn(move || blind_send(&s, 1, 2));
        // The owner: claimer 1 is lost, so its slot is taken over and consumed.
        let st = status.load(Ordering::Acquire);
        if laps.look(st, 0).unwrap() == Seen::Claimed(1) {
            assert!(claim::take_over(&laps, status, 0, st));
        }
        seg.word(8).unwrap().store(1, Ordering::Release);
        let got = producer.join().unwrap();
        let st = status.load(Ordering::Acquire);
        match got {
            Some(t) => {
                assert_eq!(t, 1, "only the next lap");
                assert_eq!(laps.look(st, 1).unwrap(), Seen::Published(0));
                assert_eq!(seg.load_word(SLOT0 + 8).unwrap(), 2);
            }
            None => assert_eq!(laps.look(st, 0).unwrap(), Seen::Skipped(claim::OWNER)),
        }
    });
}
