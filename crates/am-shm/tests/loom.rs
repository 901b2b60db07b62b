//! loom models of the two protocols this crate's users rely on, written against loom's
//! atomics (the crate's own code uses `AtomicU64::from_ptr` on shared memory, which loom cannot
//! instrument, so these are faithful replicas of `stamp` and `doorbell`, step for step).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p am-shm --release --test loom`
#![cfg(loom)]

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use loom::sync::{Arc, Condvar, Mutex};
use loom::thread;

/// Stamp hand-over: write the slot, publish with Release; the reader sees the whole body once
/// it sees the stamp (Acquire), and the writer reuses the slot only after the hand-back.
#[test]
fn loom_stamp_hand_over() {
    loom::model(|| {
        let stamp = Arc::new(AtomicU64::new(0));
        let back = Arc::new(AtomicU64::new(0));
        let slot = Arc::new(UnsafeCell::new([0u64; 2]));
        let (s2, b2, sl2) = (stamp.clone(), back.clone(), slot.clone());
        let writer = thread::spawn(move || {
            for seq in 1..=2u64 {
                // Claim: wait for the reader's hand-back of the previous message.
                while b2.load(Ordering::Acquire) + 1 < seq {
                    thread::yield_now();
                }
                // SAFETY: claim step: the reader handed back the previous message, so it no
                // longer reads the slot; loom checks exactly this.
                sl2.with_mut(|p| unsafe { *p = [seq, seq * 10] });
                s2.store(seq, Ordering::Release);
            }
        });
        for seq in 1..=2u64 {
            while stamp.load(Ordering::Acquire) != seq {
                thread::yield_now();
            }
            // SAFETY: read after the Acquire load of the stamp; the writer does not touch the
            // slot again before our hand-back (loom checks it).
            let body = slot.with(|p| unsafe { *p });
            assert_eq!(body, [seq, seq * 10]);
            back.store(seq, Ordering::Release);
        }
        writer.join().unwrap();
    });
}

const EXIST: u32 = 1;
const SLEEPING: u32 = 2;

/// The kernel's futex, modelled: compare-and-sleep is atomic with respect to wake.
struct Futex {
    word: AtomicU32,
    lock: Mutex<()>,
    cv: Condvar,
}

impl Futex {
    fn wait(&self, expected: u32) {
        let g = self.lock.lock().unwrap();
        if self.word.load(Ordering::SeqCst) == expected {
            drop(self.cv.wait(g).unwrap());
        }
    }
    fn wake(&self) {
        let _g = self.lock.lock().unwrap();
        self.cv.notify_all();
    }
}

/// Doorbell: a ring is never lost, whichever way ring and sleep interleave (a lost wake-up
/// would deadlock the model, which loom reports).
#[test]
fn loom_doorbell_no_lost_wakeup() {
    loom::model(|| {
        let f = Arc::new(Futex {
            word: AtomicU32::new(0),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        });
        let data = Arc::new(AtomicU64::new(0));
        let (f2, d2) = (f.clone(), data.clone());
        let sender = thread::spawn(move || {
            d2.store(7, Ordering::Release); // the ready flag
            if f2.word.fetch_or(EXIST, Ordering::AcqRel) & SLEEPING != 0 {
                f2.wake();
            }
        });
        // Receiver: sleep until rung, then take and see the data.
        loop {
            if f.word.fetch_and(!EXIST, Ordering::AcqRel) & EXIST != 0 {
                break;
            }
            let before = f.word.fetch_or(SLEEPING, Ordering::AcqRel);
            if before & EXIST == 0 {
                f.wait(SLEEPING);
            }
            f.word.fetch_and(!SLEEPING, Ordering::AcqRel);
        }
        assert_eq!(data.load(Ordering::Acquire), 7);
        sender.join().unwrap();
    });
}

/// Read before write: the receiver left the flag set (a message it already consumed), the
/// sender skips the ring when it sees it set; the receiver's take-then-scan still finds the
/// message, or the sender sees the take and rings (waking it). A lost message would leave
/// the receiver asleep, which loom reports as a deadlock.
#[test]
fn loom_doorbell_lazy_ring_never_loses_a_message() {
    loom::model(|| {
        let f = Arc::new(Futex {
            word: AtomicU32::new(EXIST),
            lock: Mutex::new(()),
            cv: Condvar::new(),
        });
        let data = Arc::new(AtomicU64::new(0));
        let (f2, d2) = (f.clone(), data.clone());
        let sender = thread::spawn(move || {
            d2.store(7, Ordering::Release); // the ready flag
            loom::sync::atomic::fence(Ordering::SeqCst);
            let w = f2.word.load(Ordering::Relaxed);
            if w & EXIST != 0 && w & SLEEPING == 0 {
                return; // already rung: the receiver scans us after its take
            }
            if f2.word.fetch_or(EXIST, Ordering::AcqRel) & SLEEPING != 0 {
                f2.wake();
            }
        });
        // Receiver: take, fence, scan; sleep only on a cleared flag.
        loop {
            f.word.fetch_and(SLEEPING, Ordering::AcqRel);
            loom::sync::atomic::fence(Ordering::SeqCst);
            if data.load(Ordering::Acquire) == 7 {
                break;
            }
            let before = f.word.fetch_or(SLEEPING, Ordering::AcqRel);
            if before & EXIST == 0 {
                f.wait(SLEEPING);
            }
            f.word.fetch_and(!SLEEPING, Ordering::AcqRel);
        }
        sender.join().unwrap();
    });
}
