//! Slot hand-over by stamp, in crossbeam `ArrayQueue`'s order: **claim** (the writer knows by
//! its own bookkeeping that the slot is free), **write** the bytes, **publish** with a
//! `Release` store of a stamp; the reader loads the stamp with `Acquire` and only then reads.
//!
//! [`Slots`] describes `count` slots of `size` bytes in a segment's byte area. A slot holds
//! `[stamp: u64][len: u32][flags: u32][len bytes]`: the stamp (the message-ready flag) sits in
//! the slot's first cache line, beside the header and the first bytes of the body, so a small
//! message and its flag travel as one cache line (with `size` a multiple of 64 and the slots
//! line-aligned). The writer writes `[len][flags][body]` as whole words ([`Imported::write_padded`])
//! and then the stamp; the reader copies the header out, checks the copy, and reads the body
//! through a [`SharedBytes`] view of the checked length. Stamps are 64-bit sequence numbers
//! that never wrap, so an old stamp is never mistaken for a new one.
//!
//! ```
//! use am_shm::{stamp::Slots, Segment};
//! let slots = Slots { data: 0, count: 4, size: 64 };
//! let seg = Segment::heap(0, slots.data_bytes()).unwrap();
//! let writer = seg.import();
//! slots.write(&writer, 2, 7, &[b"head", b"payload"]).unwrap(); // write
//! slots.publish(&writer, 2, 1).unwrap();                        // publish stamp 1
//! assert_eq!(slots.find(&seg, 1).unwrap(), Some(2));            // reader: Acquire
//! let (flags, body) = slots.body(&seg, 2).unwrap();
//! assert_eq!((flags, body.to_vec()), (7, b"headpayload".to_vec()));
//! ```

use crate::{Imported, Segment, SharedBytes, ShmError};

/// Bytes of a slot's own header: the stamp, then `len` and `flags`.
pub const SLOT_HEADER: usize = 16;
/// Offset of `len` and `flags` in a slot (after the stamp).
const LEN_AT: usize = 8;

/// Where a set of slots lives in a segment; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slots {
    /// Byte offset of the first slot in the byte area (8-aligned; 64 keeps each slot's flag
    /// and header in one cache line).
    pub data: usize,
    /// Number of slots.
    pub count: usize,
    /// Bytes per slot, header included (a multiple of 8).
    pub size: usize,
}

impl Slots {
    /// Bytes of byte area the slots take.
    pub fn data_bytes(&self) -> usize {
        self.count * self.size
    }

    /// Largest body (`len`) a slot holds.
    pub fn capacity(&self) -> usize {
        self.size.saturating_sub(SLOT_HEADER)
    }

    /// Byte offset of `slot` (its stamp word), checked.
    #[inline]
    pub fn base(&self, slot: usize) -> Result<usize, ShmError> {
        if slot >= self.count {
            return Err(ShmError::OutOfBounds {
                offset: slot,
                len: 1,
                area: self.count,
            });
        }
        Ok(self.data + slot * self.size)
    }

    /// Writes `flags` and the concatenation of `parts` into `slot` (the "write" step; the
    /// caller has claimed the slot), as whole words from the slot's `len` word on. Nothing is
    /// visible to the reader until [`publish`](Self::publish).
    #[inline]
    pub fn write(
        &self,
        to: &Imported,
        slot: usize,
        flags: u32,
        parts: &[&[u8]],
    ) -> Result<(), ShmError> {
        let base = self.base(slot)?;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > self.capacity() {
            return Err(ShmError::OutOfBounds {
                offset: 0,
                len,
                area: self.capacity(),
            });
        }
        let mut hdr = [0u8; SLOT_HEADER - LEN_AT];
        hdr[..4].copy_from_slice(&(len as u32).to_le_bytes());
        hdr[4..].copy_from_slice(&flags.to_le_bytes());
        let hdr_word = u64::from_ne_bytes(hdr);
        match *parts {
            [] => to.write_words_padded(base + LEN_AT, &[hdr_word], &[]),
            [a] => to.write_words_padded(base + LEN_AT, &[hdr_word], a),
            [a, b] => to.write_padded(base + LEN_AT, &[&hdr, a, b]),
            _ => {
                let mut all = Vec::with_capacity(parts.len() + 1);
                all.push(&hdr[..]);
                all.extend_from_slice(parts);
                to.write_padded(base + LEN_AT, &all)
            }
        }
        .map(|_| ())
    }

    /// Publishes `slot` with `stamp` (a `Release` store after the data, in the same line).
    #[inline]
    pub fn publish(&self, to: &Imported, slot: usize, stamp: u64) -> Result<(), ShmError> {
        to.store_slot_word(self.base(slot)?, stamp)
    }

    /// The stamp `slot` carries (`Acquire`).
    #[inline]
    pub fn stamp(&self, seg: &Segment, slot: usize) -> Result<u64, ShmError> {
        seg.load_slot_word(self.base(slot)?)
    }

    /// Whether `slot` carries `stamp` (`Acquire`).
    #[inline]
    pub fn is_published(&self, seg: &Segment, slot: usize, stamp: u64) -> Result<bool, ShmError> {
        Ok(self.stamp(seg, slot)? == stamp)
    }

    /// The slot carrying `stamp`, if any (`Acquire` loads).
    #[inline]
    pub fn find(&self, seg: &Segment, stamp: u64) -> Result<Option<usize>, ShmError> {
        for slot in 0..self.count {
            if self.stamp(seg, slot)? == stamp {
                return Ok(Some(slot));
            }
        }
        Ok(None)
    }

    /// Loads every stamp (`Acquire`) into `out`; returns how many were loaded
    /// (`min(count, out.len())`). Lines the writer did not touch since the last pass are
    /// still in the reader's cache: only new messages cost a transfer.
    #[inline]
    pub fn load_stamps(&self, seg: &Segment, out: &mut [u64]) -> Result<usize, ShmError> {
        let n = self.count.min(out.len());
        for (slot, o) in out[..n].iter_mut().enumerate() {
            *o = self.stamp(seg, slot)?;
        }
        Ok(n)
    }

    /// The flags and body length of a published `slot`, copied out of its header and checked
    /// (`len <= capacity`), and the offset of its body.
    #[inline]
    pub fn header(&self, seg: &Segment, slot: usize) -> Result<(u32, usize, usize), ShmError> {
        let base = self.base(slot)?;
        // One word: `len` and `flags`, in memory order.
        let hdr = seg.view(base + LEN_AT, SLOT_HEADER - LEN_AT)?.load_u64(0)?;
        let (len, flags) = decode_header(hdr.to_ne_bytes(), self.capacity())?;
        Ok((flags, len, base + SLOT_HEADER))
    }

    /// The flags of a published `slot` and a view of its body. The length comes from shared
    /// memory and is checked on the copy: a corrupt one is an error.
    #[inline]
    pub fn body<'a>(
        &self,
        seg: &'a Segment,
        slot: usize,
    ) -> Result<(u32, SharedBytes<'a>), ShmError> {
        let (flags, len, at) = self.header(seg, slot)?;
        Ok((flags, seg.view(at, len)?))
    }
}

/// The flags of the published slot whose stamp is at byte offset `at` of `seg`'s byte area
/// (one load of its header word, in the stamp's line).
#[inline]
pub fn flags_at(seg: &Segment, at: usize) -> Result<u32, ShmError> {
    // `len` then `flags`, little-endian: the flags are the high half.
    // Saturating: an offset past the area fails the load's bounds check.
    let word = seg.load_slot_word(at.saturating_add(LEN_AT))?;
    Ok((word >> 32) as u32)
}

/// Decodes a slot's `[len: u32][flags: u32]` read from shared memory: `(len, flags)`, with
/// `len <= capacity`.
pub fn decode_header(hdr: [u8; 8], capacity: usize) -> Result<(usize, u32), ShmError> {
    let len = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
    let flags = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
    if len > capacity {
        return Err(ShmError::OutOfBounds {
            offset: 0,
            len,
            area: capacity,
        });
    }
    Ok((len, flags))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    #[cfg(not(miri))]
    use proptest::prelude::*;

    fn layout() -> Slots {
        Slots {
            data: 104,
            count: 3,
            size: 48,
        }
    }

    #[test]
    fn write_publish_find_lend() {
        let s = layout();
        let seg = Segment::heap(0, 104 + s.data_bytes()).unwrap();
        let w = seg.import();
        assert_eq!(s.find(&seg, 1).unwrap(), None);
        s.write(&w, 1, 5, &[b"abc", b"", b"de"]).unwrap();
        assert_eq!(s.find(&seg, 1).unwrap(), None, "unpublished");
        s.publish(&w, 1, 1).unwrap();
        assert_eq!(s.find(&seg, 1).unwrap(), Some(1));
        let (flags, body) = s.body(&seg, 1).unwrap();
        assert_eq!((flags, body.to_vec()), (5, b"abcde".to_vec()));
        assert!(s.write(&w, 3, 0, &[]).is_err(), "no slot 3");
        assert!(s.write(&w, 0, 0, &[&[0; 33]]).is_err(), "body too large");
        s.write(&w, 0, 0, &[&[9; 32]]).unwrap();
        s.publish(&w, 0, 2).unwrap();
        assert_eq!(s.body(&seg, 0).unwrap().1.to_vec(), [9; 32]);
        // The flags alone, from the stamp's offset; an offset past the area is an error.
        assert_eq!(flags_at(&seg, s.base(1).unwrap()).unwrap(), 5);
        assert!(flags_at(&seg, s.base(2).unwrap() + 48).is_err());
        assert!(flags_at(&seg, usize::MAX - 3).is_err());
    }

    #[test]
    fn corrupt_length_is_an_error() {
        let s = layout();
        let seg = Segment::heap(0, 104 + s.data_bytes()).unwrap();
        seg.import()
            .write(104 + 48 + 8, &u32::MAX.to_le_bytes())
            .unwrap();
        assert!(s.body(&seg, 1).is_err());
    }

    /// Hand-over between two threads: every body arrives intact, in stamp order.
    #[test]
    fn two_thread_hand_over() {
        let s = Slots {
            data: 0,
            count: 2,
            size: 32,
        };
        let seg = Segment::heap(64, s.data_bytes()).unwrap();
        let w = seg.import();
        let back = std::sync::atomic::AtomicU64::new(0);
        let n: u64 = if cfg!(miri) { 20 } else { 2000 };
        std::thread::scope(|sc| {
            sc.spawn(|| {
                for seq in 1..=n {
                    let slot = (seq % 2) as usize;
                    // Claim: the reader has handed back the stamp seq - 2 (slot reuse).
                    while back.load(std::sync::atomic::Ordering::Acquire) + 2 < seq {
                        std::hint::spin_loop();
                        std::thread::yield_now();
                    }
                    s.write(&w, slot, 0, &[&seq.to_le_bytes(), &[seq as u8; 8]])
                        .unwrap();
                    s.publish(&w, slot, seq).unwrap();
                }
            });
            for seq in 1..=n {
                let slot = loop {
                    if let Some(slot) = s.find(&seg, seq).unwrap() {
                        break slot;
                    }
                    std::thread::yield_now();
                };
                let body = s.body(&seg, slot).unwrap().1.to_vec();
                assert_eq!(&body[..8], &seq.to_le_bytes());
                assert_eq!(&body[8..], &[seq as u8; 8]);
                back.store(seq, std::sync::atomic::Ordering::Release);
            }
        });
    }

    // Many cases: too slow under Miri, and the decoding has no unsafe code of its own.
    #[cfg(not(miri))]
    proptest! {
        #[test]
        fn decoding_any_header_never_panics(hdr in any::<[u8; 8]>(), cap in 0usize..4096) {
            match decode_header(hdr, cap) {
                Ok((len, _)) => prop_assert!(len <= cap),
                Err(_) => prop_assert!(u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize > cap),
            }
        }

        #[test]
        fn lending_after_arbitrary_bytes_is_checked(junk in proptest::collection::vec(any::<u8>(), 0..160), slot in 0usize..5) {
            let s = layout();
            let seg = Segment::heap(0, 104 + s.data_bytes()).unwrap();
            seg.import().write(104 + 8, &junk[..junk.len().min(s.data_bytes() - 8)]).unwrap();
            if let Ok((_, body)) = s.body(&seg, slot) {
                prop_assert!(body.len() <= s.capacity());
            }
        }
    }
}
