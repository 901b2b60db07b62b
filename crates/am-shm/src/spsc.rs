//! [`SpscRing`]: a ring of variable-size records with one writer and one reader, whose
//! layout is checked once so that its hot path needs no bounds checks.
//!
//! ```
//! use am_shm::sync::Ordering;
//! use am_shm::Segment;
//! let seg = Segment::heap(128, 64).unwrap();
//! // Ring: bytes [0, 64) of the byte area; head word at 0, futex word at 64 of the word area.
//! let ring = seg.spsc_ring(0, 64, 0, 64).unwrap();
//! // A record at 0: its body, a zero where the next one starts (16), then its header.
//! assert_eq!(ring.publish(0, 5, b"hello"), Some(16));
//! let (header, rest) = ring.place(0);
//! assert_eq!(header.load(Ordering::Acquire), 5);
//! assert_eq!(rest.slice(0, 5).unwrap().to_vec(), b"hello");
//! assert!(ring.place(48).1.slice(0, 9).is_err(), "past the ring's end");
//! assert!(ring.publish(48, 6, b"x").is_none(), "no room for the word after it");
//! ```

use std::sync::Arc;

use crate::mapping::{round_to_words, Mapping, WORD};
use crate::shared::SharedBytes;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// The ring of one writer and one reader in a segment: `len` bytes of its byte area, holding
/// records (a header word at an 8-aligned position, then a body), a word of its word area
/// where the reader publishes how far it has read, and a 32-bit futex word the reader sleeps
/// on (several rings may share one).
///
/// The layout is checked against the segment once, when the ring is made
/// ([`Segment::spsc_ring`](crate::Segment::spsc_ring)). After that a record's position is
/// rounded down to a word and clamped to the ring's last word, and a body is checked against
/// the ring's end by one comparison: no access can leave the ring, whatever positions and
/// lengths it is given, and the hot path carries no other check. What the header and head
/// words mean is the caller's protocol. Like every view it hands out atomics and copies,
/// never references to the bytes; it keeps the segment's memory alive.
#[derive(Clone)]
pub struct SpscRing {
    map: Arc<Mapping>,
    /// Offset in the mapping of the ring's first byte (8-aligned) and its length (a multiple
    /// of 8, at least 16): `[at, at + len)` lies in the mapping.
    at: usize,
    len: usize,
    /// Offsets in the mapping of the head word (8-aligned) and the futex word (4-aligned, in
    /// another 8-byte word), both in the word area.
    head: usize,
    sleeper: usize,
}

impl SpscRing {
    /// A ring over checked offsets (see the fields), made by `Segment::spsc_ring`.
    pub(crate) fn new(
        map: Arc<Mapping>,
        at: usize,
        len: usize,
        head: usize,
        sleeper: usize,
    ) -> SpscRing {
        debug_assert!(at.is_multiple_of(WORD) && len.is_multiple_of(WORD) && len >= 2 * WORD);
        debug_assert!(at + len <= map.len() && head + WORD <= map.len());
        debug_assert!(sleeper.is_multiple_of(4) && sleeper / WORD != head / WORD);
        SpscRing {
            map,
            at,
            len,
            head,
            sleeper,
        }
    }

    /// Bytes of the ring.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: a ring has at least two words.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// `pos` rounded down to a word and clamped to the ring's last word.
    #[inline(always)]
    fn clamp(&self, pos: usize) -> usize {
        pos.min(self.len - WORD) & !(WORD - 1)
    }

    /// The header word of the record at byte `pos` of the ring (rounded down to a word and
    /// clamped to the ring's last word, so never outside it).
    #[inline(always)]
    pub fn header(&self, pos: usize) -> &AtomicU64 {
        // SAFETY: `clamp` gives an 8-aligned offset of at most `len - 8`, and `[at, at +
        // len)` lies in the mapping with `at` 8-aligned (checked when the ring was made); the
        // byte area is accessed only through 64-bit atomics on this grid (`mapping` docs).
        unsafe { self.map.word64(self.at + self.clamp(pos)) }
    }

    /// The header word of the record at `pos` (placed as by [`header`](Self::header)) and
    /// the view of the ring's bytes after it, to its end: the record's body is its first
    /// bytes ([`SharedBytes::slice`] checks a length read from the header against it).
    #[inline(always)]
    pub fn place(&self, pos: usize) -> (&AtomicU64, SharedBytes<'_>) {
        let p = self.clamp(pos);
        // SAFETY: as in `header`.
        let header = unsafe { self.map.word64(self.at + p) };
        // `[at + p + 8, at + len)`: inside the ring (`p + 8 <= len`), so inside the mapping.
        let rest = SharedBytes::new(&self.map, self.at + p + WORD, self.len - p - WORD);
        (header, rest)
    }

    /// Writes a whole record at `pos` (rounded down to a word): `body` after the header word
    /// as whole words, the last one zero-padded (each by one relaxed atomic store: for a few
    /// words, a message head), then zero in the word after the record (where the next
    /// record's header goes), then `header` with `Release`, so a reader that loads the header
    /// with `Acquire` sees the body and the zero. Returns where the next record starts, or
    /// `None`, with nothing written, if the record and the word after it do not fit before
    /// the ring's end.
    #[inline(always)]
    pub fn publish(&self, pos: usize, header: u64, body: &[u8]) -> Option<usize> {
        let p = pos & !(WORD - 1);
        let padded = round_to_words(body.len())?;
        // The header, the body and the word after them: `p + 16 + padded <= len`.
        if p > self.len - 2 * WORD || padded > self.len - 2 * WORD - p {
            return None;
        }
        let end = p + WORD + padded;
        // SAFETY: `at + p`, `at + p + 8` and `at + end` are 8-aligned, and the header, the
        // padded body and the word at `end` all lie in `[at, at + len)` (checked just above),
        // inside the mapping (checked when the ring was made); the byte area is accessed only
        // through 64-bit atomics on this grid (`mapping` docs).
        unsafe {
            let at = self.at + p + WORD;
            // Most bodies are a message head of a word or a few: the first word is stored
            // before the loop, which a one-word head then skips.
            match body.split_first_chunk::<WORD>() {
                Some((first, rest)) => {
                    self.map
                        .word64(at)
                        .store(u64::from_ne_bytes(*first), Ordering::Relaxed);
                    self.map.store_words_padded(at + WORD, rest);
                }
                None => {
                    self.map.store_words_padded(at, body);
                }
            }
            self.map.word64(self.at + end).store(0, Ordering::Relaxed);
            self.map
                .word64(self.at + p)
                .store(header, Ordering::Release);
        }
        Some(end)
    }

    /// Ends a record whose body was written otherwise (through an
    /// [`Imported`](crate::Imported) of the same segment, say): zero in the word at `next`
    /// (where the next record's header goes), then `header` at `pos` with `Release`; both
    /// placed as by [`header`](Self::header).
    #[inline(always)]
    pub fn seal(&self, pos: usize, next: usize, header: u64) {
        self.header(next).store(0, Ordering::Relaxed);
        self.header(pos).store(header, Ordering::Release);
    }

    /// The word where the reader publishes how far it has read.
    #[inline(always)]
    pub fn head(&self) -> &AtomicU64 {
        // SAFETY: 8-aligned and inside the word area (checked when the ring was made), which
        // is accessed only through 64-bit atomics but for futex words in words of their own.
        unsafe { self.map.word64(self.head) }
    }

    /// The reader's futex word (accessed at 32 bits only, in a word of its own).
    #[inline(always)]
    pub fn sleeper(&self) -> &AtomicU32 {
        // SAFETY: 4-aligned, inside the word area, and not in the head word's 8 bytes
        // (checked when the ring was made); used only as a 32-bit atomic (the contract of
        // `Segment::spsc_ring`).
        unsafe { self.map.word32(self.sleeper) }
    }
}

impl std::fmt::Debug for SpscRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpscRing")
            .field("at", &self.at)
            .field("len", &self.len)
            .field("head", &self.head)
            .field("sleeper", &self.sleeper)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::sync::Ordering;
    use crate::Segment;

    #[test]
    fn layouts_are_checked_once() {
        let seg = Segment::heap(128, 100).unwrap();
        assert!(seg.spsc_ring(0, 96, 0, 64).is_ok());
        assert!(seg.spsc_ring(8, 88, 120, 64).is_ok());
        assert!(seg.spsc_ring(8, 96, 0, 64).is_err(), "past the byte area");
        assert!(seg.spsc_ring(4, 16, 0, 64).is_err(), "misaligned ring");
        assert!(seg.spsc_ring(0, 20, 0, 64).is_err(), "not whole words");
        assert!(seg.spsc_ring(0, 8, 0, 64).is_err(), "one word");
        assert!(seg.spsc_ring(0, 0, 0, 64).is_err(), "empty");
        assert!(
            seg.spsc_ring(usize::MAX - 7, 16, 0, 64).is_err(),
            "overflow"
        );
        assert!(seg.spsc_ring(0, 16, 4, 64).is_err(), "misaligned head");
        assert!(
            seg.spsc_ring(0, 16, 128, 64).is_err(),
            "head past the word area"
        );
        assert!(
            seg.spsc_ring(0, 16, 0, 126).is_err(),
            "misaligned futex word"
        );
        assert!(
            seg.spsc_ring(0, 16, 0, 128).is_err(),
            "futex word past the word area"
        );
        assert!(
            seg.spsc_ring(0, 16, 0, 4).is_err(),
            "futex word inside the head word"
        );
        assert!(seg.spsc_ring(0, 16, 8, 0).is_ok());
    }

    /// Positions are clamped into the ring and records checked against its end: whatever
    /// they are given, the accesses stay inside the ring and nothing else is touched.
    #[test]
    fn positions_and_records_never_leave_the_ring() {
        let seg = Segment::heap(64, 64).unwrap();
        seg.byte_area().fill(0, 64, 0xEE).unwrap();
        let ring = seg.spsc_ring(16, 32, 0, 8).unwrap();
        assert_eq!(ring.len(), 32);
        for pos in [0, 3, 8, 24, 31, 32, 1000, usize::MAX - 3] {
            ring.header(pos).store(u64::MAX, Ordering::Relaxed);
            let (header, rest) = ring.place(pos);
            header.store(u64::MAX, Ordering::Relaxed);
            let _ = rest.to_vec();
            let _ = ring.publish(pos, 1, &[0xAA; 8]);
            ring.seal(pos, pos.saturating_add(8), 2);
        }
        let all = seg.byte_area().to_vec();
        assert!(all[..16].iter().chain(&all[48..]).all(|&b| b == 0xEE));
        // `pos` 3 is the word at 0, and past the end is the last word (24).
        assert_eq!(ring.header(3).load(Ordering::Relaxed), 2);
        assert_eq!(ring.header(usize::MAX).load(Ordering::Relaxed), 2);
        assert_eq!(ring.place(24).1.len(), 0, "nothing after the last word");
        assert_eq!(ring.place(usize::MAX).1.len(), 0);
        assert_eq!(ring.place(0).1.len(), 24);
        assert_eq!(ring.place(13).1.len(), 16);
        // A record needs its header, its padded body and the word after it.
        assert_eq!(ring.publish(8, 1, &[1; 8]), Some(24));
        assert_eq!(ring.publish(8, 1, &[1; 9]), None, "padded past the end");
        assert_eq!(ring.publish(0, 1, &[1; 16]), Some(24));
        assert_eq!(ring.publish(0, 1, &[1; 17]), None);
        assert_eq!(ring.publish(16, 1, &[]), Some(24));
        assert_eq!(ring.publish(24, 1, &[]), None);
        assert_eq!(ring.publish(usize::MAX, 1, &[]), None);
        assert_eq!(ring.publish(0, 1, &vec![0; 1 << 20]), None);
    }

    /// A record lands as its body, padded with zeros, a zero word after it and its header;
    /// the head and futex words are the word area's.
    #[test]
    fn records_land_whole_and_words_are_the_segments() {
        let seg = Segment::heap(128, 256).unwrap();
        let ring = seg.spsc_ring(64, 128, 8, 68).unwrap();
        for len in 0..=40usize {
            seg.byte_area().fill(0, 256, 0xEE).unwrap();
            let msg: Vec<u8> = (0..len).map(|i| (i * 7 + 1) as u8).collect();
            let padded = len.div_ceil(8) * 8;
            assert_eq!(ring.publish(40, 0x0102_0304, &msg), Some(48 + padded));
            let all = seg.byte_area().to_vec();
            assert_eq!(all[104..112], 0x0102_0304u64.to_ne_bytes());
            assert_eq!(&all[112..112 + len], &msg[..]);
            assert!(all[112 + len..112 + padded + 8].iter().all(|&b| b == 0));
            let after = 112 + padded + 8;
            assert!(all[..104].iter().chain(&all[after..]).all(|&b| b == 0xEE));
            assert_eq!(ring.place(40).1.slice(0, len).unwrap().to_vec(), msg);
        }
        seg.byte_area().fill(0, 256, 0xEE).unwrap();
        ring.seal(8, 120, 9);
        let all = seg.byte_area().to_vec();
        assert_eq!(all[72..80], 9u64.to_ne_bytes());
        assert_eq!(all[184..192], [0; 8]);
        ring.head().store(7, Ordering::Relaxed);
        assert_eq!(seg.load_word(8).unwrap(), 7);
        ring.sleeper().store(3, Ordering::Relaxed);
        assert_eq!(seg.word32(68).unwrap().load(Ordering::Relaxed), 3);
    }

    /// Records handed over between threads around the ring's end: the reader's `Acquire`
    /// load of a header makes the writer's body stores visible, and the writer reuses a
    /// record only after the reader's head says it was read (Miri checks the races).
    #[test]
    fn records_hand_over_between_threads() {
        let seg = Segment::heap(64, 80).unwrap();
        let rounds: u64 = if cfg!(miri) { 12 } else { 2000 };
        std::thread::scope(|s| {
            let ring = seg.spsc_ring(0, 80, 0, 8).unwrap();
            s.spawn(move || {
                // Three places of 24 bytes; record `r` goes at `24 * (r % 3)` and zeroes the
                // header of the place after it, so it waits until the reader has read record
                // `r - 2`, the last one there.
                for r in 1..=rounds {
                    while r > 2 && ring.head().load(Ordering::Acquire) < r - 2 {
                        std::thread::yield_now();
                    }
                    let pos = 24 * (r % 3) as usize;
                    let body = [r.to_ne_bytes(), (!r).to_ne_bytes()].concat();
                    assert_eq!(ring.publish(pos, r, &body), Some(pos + 24));
                }
            });
            let ring = seg.spsc_ring(0, 80, 0, 8).unwrap();
            for r in 1..=rounds {
                let pos = 24 * (r % 3) as usize;
                while ring.header(pos).load(Ordering::Acquire) != r {
                    std::thread::yield_now();
                }
                let got = ring.place(pos).1.slice(0, 16).unwrap().to_vec();
                assert_eq!(got, [r.to_ne_bytes(), (!r).to_ne_bytes()].concat());
                ring.head().store(r, Ordering::Release);
            }
        });
    }
}
