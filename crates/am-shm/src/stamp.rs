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

use std::sync::Arc;

use crate::mapping::{round_to_words, Mapping, WORD};
use crate::sync::Ordering;
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

impl Slots {
    /// These slots of `seg` (the reader's own segment), checked against it once: see
    /// [`SlotReader`]. An error if they do not lie in its byte area, `data` or `size` is not
    /// a multiple of 8, or a slot is smaller than its header.
    pub fn reader(&self, seg: &Segment) -> Result<SlotReader, ShmError> {
        let (map, at) = seg.run(self.data, self.checked_bytes()?)?;
        Ok(SlotReader {
            map,
            at,
            count: self.count,
            size: self.size,
        })
    }

    /// These slots of a peer's segment, checked against it once: see [`SlotWriter`]. The
    /// same errors as [`reader`](Self::reader).
    pub fn writer(&self, to: &Imported) -> Result<SlotWriter, ShmError> {
        let (map, at) = to.run(self.data, self.checked_bytes()?)?;
        Ok(SlotWriter {
            map,
            at,
            count: self.count,
            size: self.size,
        })
    }

    /// [`data_bytes`](Self::data_bytes), if the geometry is one a handle can rely on.
    fn checked_bytes(&self) -> Result<usize, ShmError> {
        let bad = ShmError::OutOfBounds {
            offset: self.data,
            len: self.size,
            area: self.count,
        };
        if !self.size.is_multiple_of(WORD) || self.size < SLOT_HEADER {
            return Err(bad);
        }
        self.count.checked_mul(self.size).ok_or(bad)
    }
}

/// The total length of `parts`, saturated (a length past any slot).
#[inline(always)]
fn total_len(parts: &[&[u8]]) -> usize {
    parts.iter().fold(0usize, |n, p| n.saturating_add(p.len()))
}

/// The byte offset in `map` of slot `slot` of a run of `count` slots of `size` bytes from
/// `at`; the one check a handle makes per access.
#[inline(always)]
fn slot_at(at: usize, count: usize, size: usize, slot: usize) -> Result<usize, ShmError> {
    if slot >= count {
        return Err(ShmError::OutOfBounds {
            offset: slot,
            len: 1,
            area: count,
        });
    }
    Ok(at + slot * size)
}

/// A slot's header words as its writer stored them ([`SlotReader::header`]): named, since
/// both are `u32` and a swap would compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotHeader {
    /// The body's length (not checked: a peer wrote it).
    pub len: u32,
    /// The writer's flags.
    pub flags: u32,
}

/// [`Slots`] of this process's segment, checked against it once ([`Slots::reader`]), for a
/// reader's hot path: a stamp load, a header copy or a body view then checks only the slot
/// index (against the count) and, as always, the length read from shared memory (against
/// the slot). It keeps the segment's memory mapped, as the segment does.
///
/// ```
/// use am_shm::{stamp::Slots, Segment};
/// let slots = Slots { data: 64, count: 4, size: 64 };
/// let seg = Segment::heap(0, 64 + slots.data_bytes()).unwrap();
/// let (reader, writer) = (slots.reader(&seg).unwrap(), slots.writer(&seg.import()).unwrap());
/// writer.write(2, 7, &[b"head", b"payload"]).unwrap();
/// writer.publish(2, 1).unwrap();
/// assert_eq!(reader.stamp(2).unwrap(), 1);
/// let h = reader.header(2).unwrap();
/// assert_eq!((h.len, h.flags), (11, 7));
/// assert_eq!(reader.body(2, h.len as usize).unwrap().to_vec(), b"headpayload");
/// assert!(reader.body(2, 49).is_err(), "longer than the slot");
/// assert!(reader.stamp(4).is_err(), "no slot 4");
/// ```
#[derive(Clone)]
pub struct SlotReader {
    map: Arc<Mapping>,
    /// Offset of slot 0 in the mapping (8-aligned; the slots lie inside the byte area).
    at: usize,
    count: usize,
    /// A multiple of 8, at least [`SLOT_HEADER`].
    size: usize,
}

impl SlotReader {
    /// Number of slots.
    #[inline]
    pub fn count(&self) -> usize {
        self.count
    }

    /// Largest body a slot holds.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.size - SLOT_HEADER
    }

    /// The stamp `slot` carries (`Acquire`: read the rest of the slot after it).
    #[inline]
    pub fn stamp(&self, slot: usize) -> Result<u64, ShmError> {
        let at = slot_at(self.at, self.count, self.size, slot)?;
        // SAFETY: `at` is 8-aligned and the slot, at least `SLOT_HEADER` bytes, lies inside
        // the byte area (checked when made: `Slots::reader`, `View::run`); the byte area is
        // accessed only through 64-bit atomics on this grid (`mapping` module docs).
        Ok(unsafe { self.map.word64(at) }.load(Ordering::Acquire))
    }

    /// The `len` and `flags` of `slot`'s header as its writer stored them (one load, after
    /// [`stamp`](Self::stamp)): a private copy, whose `len` is **not** checked yet. Pass it
    /// to [`body`](Self::body), which checks it.
    #[inline]
    pub fn header(&self, slot: usize) -> Result<SlotHeader, ShmError> {
        let at = slot_at(self.at, self.count, self.size, slot)?;
        // SAFETY: as in `stamp`: the word after the stamp is inside the slot (`size >= 16`).
        let word = unsafe { self.map.word64(at + LEN_AT) }.load(Ordering::Relaxed);
        let b = word.to_ne_bytes();
        Ok(SlotHeader {
            len: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            flags: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
        })
    }

    /// A view of the first `len` bytes of `slot`'s body; an error if `len` exceeds the
    /// slot's [`capacity`](Self::capacity) (a corrupt length a peer wrote).
    #[inline]
    pub fn body(&self, slot: usize, len: usize) -> Result<SharedBytes<'_>, ShmError> {
        let at = slot_at(self.at, self.count, self.size, slot)?;
        if len > self.capacity() {
            return Err(ShmError::OutOfBounds {
                offset: 0,
                len,
                area: self.capacity(),
            });
        }
        // In bounds: the body ends inside the slot, which lies inside the mapping.
        Ok(SharedBytes::new(&self.map, at + SLOT_HEADER, len))
    }
}

/// Tails up to this many bytes are echoed through a private buffer ([`SlotWriter::write_then`]).
const SMALL_TAIL: usize = 64;

/// [`Slots`] of a peer's segment, checked against it once ([`Slots::writer`]), for a
/// writer's hot path: writing a slot's header and body, publishing its stamp, or a
/// prefetch of it then checks only the slot index (against the count) and the body's
/// length (against the slot). Writes only, as [`Imported`] (see [`SlotReader`] for an
/// example). It keeps the segment's memory mapped.
#[derive(Clone)]
pub struct SlotWriter {
    map: Arc<Mapping>,
    /// Offset of slot 0 in the mapping (8-aligned; the slots lie inside the byte area).
    at: usize,
    count: usize,
    /// A multiple of 8, at least [`SLOT_HEADER`].
    size: usize,
}

impl SlotWriter {
    /// Number of slots.
    #[inline]
    pub fn count(&self) -> usize {
        self.count
    }

    /// Largest body a slot holds.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.size - SLOT_HEADER
    }

    /// Where `slot` is and the header word of a body of `len` bytes with `flags`, if the
    /// body fits.
    #[inline(always)]
    fn start(&self, slot: usize, len: usize, flags: u32) -> Result<(usize, u64), ShmError> {
        let at = slot_at(self.at, self.count, self.size, slot)?;
        match u32::try_from(len) {
            Ok(n) if len <= self.capacity() => {
                let mut hdr = [0u8; WORD];
                hdr[..4].copy_from_slice(&n.to_le_bytes());
                hdr[4..].copy_from_slice(&flags.to_le_bytes());
                Ok((at, u64::from_ne_bytes(hdr)))
            }
            _ => Err(ShmError::OutOfBounds {
                offset: 0,
                len,
                area: self.capacity(),
            }),
        }
    }

    /// [`Slots::write`]: `flags` and the concatenation of `parts` into `slot`, as whole words
    /// from its `len` word on (the last one zero-padded); nothing is visible to the reader
    /// until [`publish`](Self::publish). An error if the body exceeds the slot.
    #[inline(always)]
    pub fn write(&self, slot: usize, flags: u32, parts: &[&[u8]]) -> Result<(), ShmError> {
        match *parts {
            [one] => self.write_one(slot, flags, one),
            [head, payload] => self.write_two(slot, flags, head, payload),
            _ => self.write_parts(slot, flags, parts),
        }
    }

    /// [`write`](Self::write) of a head and its payload (an AM Medium): each goes straight
    /// when the head is whole words, with no list of parts to gather.
    #[inline(always)]
    fn write_two(
        &self,
        slot: usize,
        flags: u32,
        head: &[u8],
        payload: &[u8],
    ) -> Result<(), ShmError> {
        // No overflow: both are slices in memory.
        let (at, hdr) = self.start(slot, head.len() + payload.len(), flags)?;
        // SAFETY: as in `write_parts`: the header word and the padded body end inside the
        // slot, which lies inside the byte area, accessed only through 64-bit atomics.
        unsafe {
            self.map.word64(at + LEN_AT).store(hdr, Ordering::Relaxed);
            self.map.store_two_padded(at + SLOT_HEADER, head, payload);
        }
        Ok(())
    }

    /// [`write`](Self::write) of several parts.
    fn write_parts(&self, slot: usize, flags: u32, parts: &[&[u8]]) -> Result<(), ShmError> {
        let len = total_len(parts);
        let (at, hdr) = self.start(slot, len, flags)?;
        // SAFETY: `at` is 8-aligned and the slot lies inside the byte area (checked when
        // made); the header word and the padded body, `round_to_words(len) <= capacity`
        // bytes (`capacity` is a multiple of 8), end inside the slot. The byte area is
        // accessed only through 64-bit atomics on this grid.
        unsafe {
            self.map.word64(at + LEN_AT).store(hdr, Ordering::Relaxed);
            self.map.store_padded(at + SLOT_HEADER, parts);
        }
        Ok(())
    }

    /// [`write`](Self::write) of one part (an AM Short's head): a few word stores in a loop,
    /// inlined, with no gathering and no size classes.
    #[inline(always)]
    fn write_one(&self, slot: usize, flags: u32, body: &[u8]) -> Result<(), ShmError> {
        let (at, hdr) = self.start(slot, body.len(), flags)?;
        let mut a = at + LEN_AT;
        let mut store = |w: u64| {
            // SAFETY: `a` is 8-aligned and below the end of the header word and the padded
            // body, which end inside the slot (`round_to_words(len) <= capacity`, a multiple
            // of 8), which lies inside the byte area (checked when made); the byte area is
            // accessed only through 64-bit atomics on this grid.
            unsafe { self.map.word64(a) }.store(w, Ordering::Relaxed);
            a += WORD;
        };
        store(hdr);
        let mut rest = body;
        // The first word before the loop: a head without arguments is one word, and the
        // loop's unrolled set-up is then skipped.
        if let Some((w, tail)) = rest.split_first_chunk::<WORD>() {
            store(u64::from_ne_bytes(*w));
            rest = tail;
            while let Some((w, tail)) = rest.split_first_chunk::<WORD>() {
                store(u64::from_ne_bytes(*w));
                rest = tail;
            }
        }
        if !rest.is_empty() {
            let mut last = [0u8; WORD];
            last[..rest.len()].copy_from_slice(rest);
            store(u64::from_ne_bytes(last));
        }
        Ok(())
    }

    /// [`write`](Self::write) of `parts` followed by the shared bytes `tail` (a received
    /// payload echoed or forwarded), which move straight from their mapping (see
    /// [`Imported::write_padded_then`]); a tail of at most 64 bytes with one part before it
    /// goes through a private buffer instead, which costs less than setting up the copy.
    pub fn write_then(
        &self,
        slot: usize,
        flags: u32,
        parts: &[&[u8]],
        tail: SharedBytes<'_>,
    ) -> Result<(), ShmError> {
        if let ([head], n @ ..=SMALL_TAIL) = (parts, tail.len()) {
            // A small echo (the common Medium): loaded into a private word or few and
            // written as a head and payload, cheaper than setting up the bulk copy.
            let mut buf = [0u8; SMALL_TAIL];
            tail.read(0, &mut buf[..n])?;
            return self.write_two(slot, flags, head, &buf[..n]);
        }
        let len = total_len(parts).saturating_add(tail.len());
        let (at, hdr) = self.start(slot, len, flags)?;
        let body = at + SLOT_HEADER;
        let (src, from, n) = tail.raw();
        // `len <= capacity`, so this does not overflow.
        let end = body + round_to_words(len).unwrap_or(0);
        if std::ptr::eq(src, &*self.map) && body < from + n && from < end {
            // The tail lies where it is to be written: through a private copy.
            let copy = tail.to_vec();
            let mut all: Vec<&[u8]> = parts.to_vec();
            all.push(&copy);
            return self.write(slot, flags, &all);
        }
        // SAFETY: as in `write` for the header word and the padded run; the tail is inside
        // its mapping (an invariant of `SharedBytes`) and does not overlap the run (checked
        // just above).
        unsafe {
            self.map.word64(at + LEN_AT).store(hdr, Ordering::Relaxed);
            self.map.store_padded_then(body, parts, src, from, n);
        }
        Ok(())
    }

    /// [`Slots::publish`]: `slot`'s stamp, a `Release` store after its header and body.
    #[inline]
    pub fn publish(&self, slot: usize, stamp: u64) -> Result<(), ShmError> {
        let at = slot_at(self.at, self.count, self.size, slot)?;
        // SAFETY: `at` is 8-aligned and the slot lies inside the byte area (checked when
        // made); the byte area is accessed only through 64-bit atomics on this grid.
        unsafe { self.map.word64(at) }.store(stamp, Ordering::Release);
        Ok(())
    }

    /// [`Imported::prefetch_for_write`] of `slot`'s first line: a hint, nothing for a slot
    /// past the count.
    #[inline(always)]
    pub fn prefetch_for_write(&self, slot: usize) {
        // Not `slot_at`: a hint has no error to build (and drop).
        if slot < self.count {
            self.map.prefetch_for_write(self.at + slot * self.size);
        }
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

    /// Every check of a body's length against its slot, at its boundary: a body of exactly
    /// the capacity is written and read back whole, through `Slots` and through the
    /// handles; one to eight bytes past it, whether a sender asks to write it or a header a
    /// peer wrote says it, is an error that writes and lends nothing.
    #[test]
    fn lengths_at_and_just_past_the_capacity() {
        let s = layout();
        let cap = s.capacity();
        let seg = Segment::heap(0, 104 + s.data_bytes()).unwrap();
        let imp = seg.import();
        let (reader, writer) = (s.reader(&seg).unwrap(), s.writer(&imp).unwrap());
        let full: Vec<u8> = (0..cap).map(|i| i as u8 + 1).collect();
        s.write(&imp, 0, 7, &[&full]).unwrap();
        writer.write(1, 7, &[&full[..5], &full[5..]]).unwrap();
        let src = Segment::heap(0, 64).unwrap();
        src.byte_area().write(0, &full).unwrap();
        let tail = src.byte_area().slice(3, cap - 3).unwrap();
        writer.write_then(2, 7, &[&full[..3]], tail).unwrap();
        for slot in 0..3 {
            assert_eq!(s.header(&seg, slot).unwrap().0, 7);
            assert_eq!(s.body(&seg, slot).unwrap().1.to_vec(), full, "{slot}");
            assert_eq!(reader.body(slot, cap).unwrap().to_vec(), full, "{slot}");
        }
        let before = seg.byte_area().to_vec();
        for over in 1..=8 {
            let long = vec![0xEE; cap + over];
            assert!(s.write(&imp, 0, 7, &[&long]).is_err(), "{over}");
            assert!(writer.write(0, 7, &[&long]).is_err(), "{over}");
            assert!(writer.write(0, 7, &[&long[..5], &long[5..]]).is_err());
            let tail = src.byte_area().slice(0, cap + over - 3).unwrap();
            assert!(writer.write_then(0, 7, &[b"abc"], tail).is_err());
            assert!(reader.body(0, cap + over).is_err(), "{over}");
            let mut hdr = [0u8; 8];
            hdr[..4].copy_from_slice(&((cap + over) as u32).to_le_bytes());
            assert!(decode_header(hdr, cap).is_err(), "{over}");
        }
        assert_eq!(seg.byte_area().to_vec(), before, "nothing written");
        // The length word of slot 1, as a peer may write it.
        let len_at = s.base(1).unwrap() + 8;
        for over in 0..=8 {
            imp.write(len_at, &((cap + over) as u32).to_le_bytes())
                .unwrap();
            let (header, body) = (s.header(&seg, 1), s.body(&seg, 1));
            if over == 0 {
                assert_eq!(header.unwrap().1, cap);
                assert_eq!(body.unwrap().1.to_vec(), full);
            } else {
                assert!(header.is_err() && body.is_err(), "{over}");
            }
        }
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

    /// The checked-once handles write what `Slots` reads and read what `Slots` writes,
    /// for every split of every length that fits, and touch nothing outside the slot's
    /// header and padded body.
    #[test]
    fn handles_write_and_read_as_slots_do() {
        let s = layout();
        let total = 104 + s.data_bytes() + 24;
        let seg = Segment::heap(0, total).unwrap();
        let (reader, writer) = (s.reader(&seg).unwrap(), s.writer(&seg.import()).unwrap());
        assert_eq!((reader.count(), reader.capacity()), (3, 32));
        assert_eq!((writer.count(), writer.capacity()), (3, 32));
        let data: Vec<u8> = (0..32).map(|i| (i * 7 + 1) as u8).collect();
        let lens: &[usize] = if cfg!(miri) {
            &[0, 1, 8, 13, 32]
        } else {
            &[0, 1, 2, 7, 8, 9, 15, 16, 17, 24, 31, 32]
        };
        for (stamp, &len) in (1u64..).zip(lens) {
            let slot = len % 3;
            let msg = &data[..len];
            let cut = len / 3;
            let splits: [&[&[u8]]; 4] = [
                &[],
                &[msg],
                &[&msg[..cut], &msg[cut..]],
                &[&msg[..cut], &[], &msg[cut..]],
            ];
            for parts in splits {
                let want: Vec<u8> = parts.concat();
                seg.byte_area().fill(0, total, 0xEE).unwrap();
                writer.write(slot, 9, parts).unwrap();
                writer.publish(slot, stamp).unwrap();
                // `Slots` reads what the handles wrote...
                assert_eq!(s.find(&seg, stamp).unwrap(), Some(slot));
                let (flags, body) = s.body(&seg, slot).unwrap();
                assert_eq!((flags, body.to_vec()), (9, want.clone()));
                // ...and the reader handle too.
                assert_eq!(reader.stamp(slot).unwrap(), stamp);
                let SlotHeader { len: n, flags } = reader.header(slot).unwrap();
                assert_eq!((n as usize, flags), (want.len(), 9));
                assert_eq!(reader.body(slot, n as usize).unwrap().to_vec(), want);
                // Nothing outside the slot's header and padded body changed.
                let all = seg.byte_area().to_vec();
                let from = s.base(slot).unwrap();
                let end = from + SLOT_HEADER + want.len().div_ceil(8) * 8;
                assert!(all[from + SLOT_HEADER + want.len()..end]
                    .iter()
                    .all(|&b| b == 0));
                assert!(all[..from].iter().chain(&all[end..]).all(|&b| b == 0xEE));
            }
        }
        // The reader handle reads what `Slots` writes.
        s.write(&seg.import(), 2, 4, &[b"from slots"]).unwrap();
        s.publish(&seg.import(), 2, 77).unwrap();
        assert_eq!(reader.stamp(2).unwrap(), 77);
        assert_eq!(reader.header(2).unwrap(), SlotHeader { len: 10, flags: 4 });
        assert_eq!(reader.body(2, 10).unwrap().to_vec(), b"from slots");
        // The handles keep the memory mapped after the segment's handles are gone.
        drop(seg);
        writer.publish(2, 78).unwrap();
        assert_eq!(reader.stamp(2).unwrap(), 78);
    }

    /// Everything out of range is an error (or, for a prefetch, nothing), and a refused
    /// write writes nothing; a geometry a handle cannot rely on is refused when it is made.
    #[test]
    fn handles_refuse_what_is_out_of_range() {
        let s = layout();
        let seg = Segment::heap(0, 104 + s.data_bytes()).unwrap();
        let imp = seg.import();
        let (reader, writer) = (s.reader(&seg).unwrap(), s.writer(&imp).unwrap());
        seg.byte_area().fill(0, 104 + s.data_bytes(), 0xEE).unwrap();
        for slot in [3, 4, usize::MAX] {
            assert!(reader.stamp(slot).is_err());
            assert!(reader.header(slot).is_err());
            assert!(reader.body(slot, 0).is_err());
            assert!(writer.write(slot, 0, &[b"x"]).is_err());
            assert!(writer.write(slot, 0, &[b"x", b"y"]).is_err());
            let tail = seg.byte_area().slice(0, 1).unwrap();
            assert!(writer.write_then(slot, 0, &[b"x"], tail).is_err());
            assert!(writer.publish(slot, 1).is_err());
            writer.prefetch_for_write(slot);
        }
        assert!(reader.body(0, 33).is_err(), "past the slot");
        assert!(reader.body(0, usize::MAX).is_err());
        assert!(writer.write(0, 0, &[&[1; 33]]).is_err(), "body too large");
        assert!(writer.write(0, 0, &[&[1; 20], &[2; 13]]).is_err());
        let tail = seg.byte_area().slice(0, 30).unwrap();
        assert!(writer.write_then(0, 0, &[b"abc"], tail).is_err());
        assert!(
            seg.byte_area().to_vec().iter().all(|&b| b == 0xEE),
            "nothing written"
        );
        // Geometries: misaligned, a size that is not whole words or smaller than a header,
        // slots past the area, a size that overflows.
        let bad = [
            Slots { data: 100, ..s },
            Slots { size: 44, ..s },
            Slots { size: 8, ..s },
            Slots { count: 4, ..s },
            Slots { data: 112, ..s },
            Slots {
                count: usize::MAX / 8,
                ..s
            },
            Slots {
                data: usize::MAX - 7,
                ..s
            },
        ];
        for b in bad {
            assert!(b.reader(&seg).is_err(), "{b:?}");
            assert!(b.writer(&imp).is_err(), "{b:?}");
        }
        let none = Slots { count: 0, ..s };
        assert!(none.reader(&seg).unwrap().stamp(0).is_err());
    }

    /// A shared tail moves straight from another segment, at any alignment, or through a
    /// private copy when it lies where it is to be written; either way the slot holds the
    /// concatenation, padded.
    #[test]
    fn handles_write_a_shared_tail() {
        let s = layout();
        let seg = Segment::heap(0, 104 + s.data_bytes()).unwrap();
        let src = Segment::heap(0, 64).unwrap();
        let data: Vec<u8> = (0..64).map(|i| (i * 31 + 7) as u8).collect();
        src.byte_area().write(0, &data).unwrap();
        let (reader, writer) = (s.reader(&seg).unwrap(), s.writer(&seg.import()).unwrap());
        for (from, n) in [(0, 0), (0, 5), (3, 17), (1, 29), (8, 24)] {
            writer
                .write_then(1, 2, &[b"hd"], src.byte_area().slice(from, n).unwrap())
                .unwrap();
            let SlotHeader { len, flags } = reader.header(1).unwrap();
            assert_eq!((len as usize, flags), (2 + n, 2));
            let mut want = b"hd".to_vec();
            want.extend_from_slice(&data[from..from + n]);
            assert_eq!(reader.body(1, len as usize).unwrap().to_vec(), want);
        }
        // The tail is the slot's own body (an echo to self): the bytes as they were.
        writer.write(0, 0, &[b"0123456789abcdef"]).unwrap();
        let own = reader.body(0, 16).unwrap();
        writer.write_then(0, 5, &[b"xy"], own).unwrap();
        assert_eq!(reader.header(0).unwrap(), SlotHeader { len: 18, flags: 5 });
        assert_eq!(
            reader.body(0, 18).unwrap().to_vec(),
            b"xy0123456789abcdef".to_vec()
        );
    }

    /// Tails past the small-echo size take the bulk copy, from another segment or from the
    /// slot's own body; tails at the edge take the private buffer. The slot holds the same
    /// either way, and a two-part write matches it.
    #[test]
    fn handles_write_large_and_edge_tails() {
        let s = Slots {
            data: 0,
            count: 2,
            size: 320,
        };
        let seg = Segment::heap(0, s.data_bytes()).unwrap();
        let src = Segment::heap(0, 512).unwrap();
        let data: Vec<u8> = (0..512).map(|i| (i * 13 + 5) as u8).collect();
        src.byte_area().write(0, &data).unwrap();
        let (reader, writer) = (s.reader(&seg).unwrap(), s.writer(&seg.import()).unwrap());
        let n_edge = [SMALL_TAIL - 1, SMALL_TAIL, SMALL_TAIL + 1];
        for (from, n) in n_edge
            .map(|n| (3, n))
            .into_iter()
            .chain([(0, 200), (5, 299)])
        {
            let head: &[u8] = if n % 2 == 0 { b"12345678" } else { b"hd3" };
            let tail = src.byte_area().slice(from, n).unwrap();
            writer.write_then(1, 7, &[head], tail).unwrap();
            let mut want = head.to_vec();
            want.extend_from_slice(&data[from..from + n]);
            assert_eq!(
                reader.header(1).unwrap(),
                SlotHeader {
                    len: want.len() as u32,
                    flags: 7
                }
            );
            assert_eq!(reader.body(1, want.len()).unwrap().to_vec(), want, "{n}");
            writer.write(0, 7, &[head, &data[from..from + n]]).unwrap();
            assert_eq!(reader.body(0, want.len()).unwrap().to_vec(), want, "{n}");
        }
        // A large tail that is the slot's own body: through a private copy.
        writer.write(0, 0, &[&data[..200]]).unwrap();
        let own = reader.body(0, 200).unwrap();
        writer.write_then(0, 1, &[b"xyz"], own).unwrap();
        let mut want = b"xyz".to_vec();
        want.extend_from_slice(&data[..200]);
        assert_eq!(reader.body(0, 203).unwrap().to_vec(), want);
    }

    /// Hand-over between two threads through the handles: every body arrives intact, in
    /// stamp order (Miri checks the orderings).
    #[test]
    fn two_thread_hand_over_through_handles() {
        let s = Slots {
            data: 0,
            count: 2,
            size: 32,
        };
        let seg = Segment::heap(64, s.data_bytes()).unwrap();
        let (reader, writer) = (s.reader(&seg).unwrap(), s.writer(&seg.import()).unwrap());
        let back = std::sync::atomic::AtomicU64::new(0);
        let n: u64 = if cfg!(miri) { 20 } else { 2000 };
        std::thread::scope(|sc| {
            sc.spawn(|| {
                for seq in 1..=n {
                    let slot = (seq % 2) as usize;
                    while back.load(std::sync::atomic::Ordering::Acquire) + 2 < seq {
                        std::hint::spin_loop();
                        std::thread::yield_now();
                    }
                    writer.write(slot, 0, &[&seq.to_le_bytes()]).unwrap();
                    writer.publish(slot, seq).unwrap();
                }
            });
            for seq in 1..=n {
                let slot = (seq % 2) as usize;
                while reader.stamp(slot).unwrap() != seq {
                    std::thread::yield_now();
                }
                let len = reader.header(slot).unwrap().len;
                let body = reader.body(slot, len as usize).unwrap().to_vec();
                assert_eq!(body, seq.to_le_bytes());
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
        fn the_reader_handle_checks_any_length(junk in proptest::collection::vec(any::<u8>(), 0..160), slot in 0usize..5, len in any::<u32>()) {
            let s = layout();
            let seg = Segment::heap(0, 104 + s.data_bytes()).unwrap();
            seg.import().write(104, &junk[..junk.len().min(s.data_bytes())]).unwrap();
            let reader = s.reader(&seg).unwrap();
            if let Ok(SlotHeader { len: n, .. }) = reader.header(slot) {
                prop_assert!(slot < 3);
                match reader.body(slot, n as usize) {
                    Ok(body) => prop_assert!(body.len() <= reader.capacity()),
                    Err(_) => prop_assert!(n as usize > reader.capacity()),
                }
            }
            prop_assert_eq!(reader.body(slot, len as usize).is_ok(), slot < 3 && len as usize <= 32);
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
