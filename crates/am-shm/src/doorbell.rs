//! The doorbell: a 32-bit flag word that senders ring and one receiver sleeps on (SCI's
//! **message-exist flag**, with a futex so a waiting rank does not burn a core).
//!
//! Bit 0 (`EXIST`) says "something arrived"; bit 1 (`SLEEPING`) says "the receiver announced
//! it is going to sleep". A sender sets `EXIST` with one atomic `fetch_or` and makes a system
//! call only if `SLEEPING` was set, so the fast path costs no syscall. The receiver sets
//! `SLEEPING` with `fetch_or` and sleeps only while the word is exactly `SLEEPING`: a ring
//! between its announcement and its sleep changes the word and the kernel returns at once,
//! so no wake-up is lost.
//!
//! Bit 2 (`ARMED`) says "the receiver sleeps elsewhere" (an event loop on a file descriptor,
//! [`Doorbell::arm`]): the one ring that finds `ARMED` set and `EXIST` clear is told so
//! ([`Rung::Armed`]), and its sender wakes the receiver by the NIC's own means. Later rings
//! find `EXIST` set and are quiet, so an armed receiver costs one wake-up per sleep, not one
//! per message.
//!
//! ```
//! use am_shm::Segment;
//! let seg = Segment::heap(64, 0).unwrap();
//! let bell = seg.doorbell(0).unwrap();
//! assert!(!bell.is_rung());
//! seg.import().ring(0).unwrap();
//! assert!(bell.take());
//! assert!(!bell.take());
//! ```

use crate::sync::{fence, AtomicU32, Ordering};
use std::time::Duration;

use crate::futex::{futex_wait, futex_wake};

const EXIST: u32 = 1;
const SLEEPING: u32 = 2;
const ARMED: u32 = 4;
/// The receiver's announcements: what a take leaves in the word.
const RECEIVER: u32 = SLEEPING | ARMED;
const FIRST_TAG: usize = 3;

/// Number of distinct ringer tags (bits 3..32 of the word).
pub const TAGS: usize = 32 - FIRST_TAG;

/// The tag bit of ringer `i` (ringers `i` and `i + TAGS` share one): lets the receiver look
/// only at the senders that rang, at no extra cost to the sender.
#[inline]
pub fn tag(i: usize) -> u32 {
    1 << (FIRST_TAG + i % TAGS)
}

/// The ringers whose tags `tags` (from [`Doorbell::take_tags`]) carries: bit `i` set for
/// [`tag`]`(i)` (ringers `i`, `i + TAGS`, ...).
#[inline]
pub fn ringers(tags: u32) -> u32 {
    tags >> FIRST_TAG
}

/// What a ring found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a receiver armed on a file descriptor is woken only by the sender that was told"]
pub enum Rung {
    /// Nothing more to do: the receiver polls, sleeps on the futex (woken by the ring), or
    /// was already told by an earlier ring.
    Quiet,
    /// This ring is the first since the receiver armed ([`Doorbell::arm`]): the sender must
    /// wake it by the NIC's means (its wake socket).
    Armed,
}

impl Rung {
    #[inline]
    fn of(before: u32) -> Rung {
        if before & (ARMED | EXIST) == ARMED {
            Rung::Armed
        } else {
            Rung::Quiet
        }
    }
}

/// A doorbell word in shared memory; see the [module docs](self).
#[derive(Clone, Copy)]
pub struct Doorbell<'a> {
    word: &'a AtomicU32,
}

impl<'a> Doorbell<'a> {
    /// Wraps a word (any 32-bit atomic, e.g. in a test).
    pub fn new(word: &'a AtomicU32) -> Self {
        Doorbell { word }
    }

    /// Rings: sets `EXIST` (after the caller's Release stores of data and ready flags) and
    /// wakes the receiver if it announced sleep.
    #[inline]
    pub fn ring(&self) -> Rung {
        self.ring_tagged(0)
    }

    /// Rings and leaves `tag` (from [`tag`]) for [`take_tags`](Self::take_tags).
    #[inline]
    pub fn ring_tagged(&self, tag: u32) -> Rung {
        let bits = EXIST | (tag & !(EXIST | RECEIVER));
        let before = self.word.fetch_or(bits, Ordering::AcqRel);
        if before & SLEEPING != 0 {
            futex_wake(self.word, i32::MAX);
        }
        Rung::of(before)
    }

    /// Rings with `tag` only if the word does not already say so: read before write. A
    /// receiver that leaves the flag set while it keeps scanning (see
    /// [`peek_tags`](Self::peek_tags)) then costs its sender no atomic read-modify-write and
    /// no cache-line steal. The caller's data and ready flag are stored before; the `SeqCst`
    /// fence orders them before the read, against the receiver's
    /// [`take_tags`](Self::take_tags), which fences likewise before it scans: either this
    /// read sees the take (and rings), or that scan sees the ready flag.
    ///
    /// A skipped ring is [`Rung::Quiet`]: the word carried `EXIST`, so the receiver either
    /// had not armed or was told by the ring that set it.
    #[inline]
    pub fn ring_tagged_lazy(&self, tag: u32) -> Rung {
        let bits = EXIST | (tag & !(EXIST | RECEIVER));
        fence(Ordering::SeqCst);
        let w = self.word.load(Ordering::Relaxed);
        if w & bits == bits && w & SLEEPING == 0 {
            return Rung::Quiet;
        }
        self.ring_tagged(tag)
    }

    /// Like [`take`](Self::take), and returns the tags left by the rings since the last
    /// take (0 if not rung). Untagged rings return just the `EXIST` bit (1): scan everyone.
    /// Ends with a `SeqCst` fence: scan the senders after it (see
    /// [`ring_tagged_lazy`](Self::ring_tagged_lazy)).
    #[inline]
    pub fn take_tags(&self) -> u32 {
        let t = self.word.fetch_and(RECEIVER, Ordering::AcqRel) & !RECEIVER;
        fence(Ordering::SeqCst);
        t
    }

    /// One relaxed load: the tags left since the last take, as [`take_tags`](Self::take_tags)
    /// would return them, without clearing (0 if not rung). Lets a receiver scan the senders
    /// that rang first and clear later, off the delivery path; it must still
    /// [`take_tags`](Self::take_tags) and scan again before it waits.
    #[inline]
    pub fn peek_tags(&self) -> u32 {
        let w = self.word.load(Ordering::Relaxed);
        if w & EXIST == 0 {
            0
        } else {
            w & !RECEIVER
        }
    }

    /// One relaxed load: has anything arrived? (The idle poll.)
    #[inline]
    pub fn is_rung(&self) -> bool {
        self.word.load(Ordering::Relaxed) & EXIST != 0
    }

    /// Clears `EXIST` and says whether it was set; Acquire, so the ready flags set before the
    /// ring are visible. Clear *before* scanning: a ring after this is seen by the next poll.
    #[inline]
    pub fn take(&self) -> bool {
        self.word.fetch_and(!EXIST, Ordering::AcqRel) & EXIST != 0
    }

    /// Sleeps until rung (or `timeout`, or spuriously). Returns at once if already rung.
    /// Does not clear `EXIST`: follow with [`take`](Self::take) and a scan.
    pub fn sleep(&self, timeout: Duration) {
        let before = self.word.fetch_or(SLEEPING, Ordering::AcqRel);
        if before & EXIST == 0 {
            futex_wait(self.word, (before & RECEIVER) | SLEEPING, Some(timeout));
        }
        self.word.fetch_and(!SLEEPING, Ordering::AcqRel);
    }

    /// Announces that the receiver will sleep on its wake file descriptor instead of the
    /// futex: the next ring returns [`Rung::Armed`] to its sender. Call it after a
    /// [`take`](Self::take) and a scan that found nothing, like [`sleep`](Self::sleep).
    /// Returns `false` if a ring came in between (`EXIST` is set: poll, do not sleep); the
    /// announcement stands either way until [`disarm`](Self::disarm).
    ///
    /// The read-modify-write orders it against every ring: a ring before it is seen here
    /// (`EXIST`), a ring after it sees `ARMED`, so no wake-up is lost.
    #[inline]
    pub fn arm(&self) -> bool {
        self.word.fetch_or(ARMED, Ordering::AcqRel) & EXIST == 0
    }

    /// Withdraws [`arm`](Self::arm)'s announcement: rings are quiet again.
    #[inline]
    pub fn disarm(&self) {
        self.word.fetch_and(!ARMED, Ordering::AcqRel);
    }

    /// Whether the receiver is armed ([`arm`](Self::arm)).
    #[inline]
    pub fn is_armed(&self) -> bool {
        self.word.load(Ordering::Relaxed) & ARMED != 0
    }
}

impl std::fmt::Debug for Doorbell<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Doorbell({:#x})", self.word.load(Ordering::Relaxed))
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// Every ringer's tag is its own bit, clear of the receiver's announcements, and
    /// `ringers` maps it back; ringer `i + TAGS` shares ringer `i`'s.
    #[test]
    fn tags_name_their_ringers() {
        for i in 0..TAGS {
            assert_eq!(ringers(tag(i)), 1 << i, "ringer {i}");
            assert_eq!(tag(i) & (EXIST | RECEIVER), 0, "ringer {i}");
            assert_eq!(tag(i + TAGS), tag(i));
        }
        let word = AtomicU32::new(0);
        let bell = Doorbell::new(&word);
        assert!(bell.arm());
        assert_eq!(bell.ring_tagged(tag(5)), Rung::Armed);
        assert_eq!(bell.ring_tagged(tag(6)), Rung::Quiet);
        assert_eq!(ringers(bell.take_tags()), 1 << 5 | 1 << 6);
        assert!(bell.is_armed(), "a take keeps the announcement");
        bell.disarm();
        assert_eq!(bell.ring(), Rung::Quiet);
    }

    /// Read before write: a ring the word already carries is skipped; after a take, or with
    /// a sleeper announced, the ring happens.
    #[test]
    fn lazy_ring_skips_only_what_the_word_carries() {
        let word = AtomicU32::new(0);
        let bell = Doorbell::new(&word);
        let _ = bell.ring_tagged_lazy(tag(3));
        assert_eq!(bell.peek_tags(), EXIST | tag(3));
        let _ = bell.ring_tagged_lazy(tag(3));
        assert_eq!(word.load(Ordering::Relaxed), EXIST | tag(3), "skipped");
        let _ = bell.ring_tagged_lazy(tag(4));
        assert_eq!(bell.take_tags(), EXIST | tag(3) | tag(4));
        assert_eq!(bell.peek_tags(), 0);
        let _ = bell.ring_tagged_lazy(tag(3));
        assert_eq!(
            bell.take_tags(),
            EXIST | tag(3),
            "rang again after the take"
        );
        word.store(SLEEPING | EXIST | tag(3), Ordering::Relaxed);
        let _ = bell.ring_tagged_lazy(tag(3));
        assert_eq!(bell.peek_tags(), EXIST | tag(3));
    }

    #[test]
    fn ring_wakes_a_sleeper_without_loss() {
        let word = AtomicU32::new(0);
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let bell = Doorbell::new(&word);
                let mut n = 0;
                while n < 50 {
                    // The timeout is only a safety net: a lost wake-up would show as slowness.
                    bell.sleep(Duration::from_secs(5));
                    if bell.take() {
                        n += 1;
                    }
                }
                done.store(true, Ordering::SeqCst);
            });
            let bell = Doorbell::new(&word);
            while !done.load(Ordering::SeqCst) {
                let _ = bell.ring();
                std::thread::yield_now();
            }
        });
    }
}
