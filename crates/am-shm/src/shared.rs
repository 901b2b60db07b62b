//! [`SharedBytes`]: the only way to reach bytes another process or thread may write.

use crate::mapping::{Mapping, WORD};
use crate::sync::{AtomicU64, Ordering};
use crate::ShmError;

/// A view of bytes that another process or thread may write at any time.
///
/// Memory a peer can write is never lent as `&[u8]` or `&mut [u8]`: the compiler may assume
/// such bytes do not change, and a racing write is undefined behaviour. A `SharedBytes` is
/// what `&[u8]` would be for such memory (after rust-vmm's `VolatileSlice`): it is `Copy`, can
/// be narrowed, and reads and writes only by copies and single-word atomics, which cost the
/// same as plain moves on x86. Copy out what you must parse, and check the copy, never the
/// shared original (no double fetch).
///
/// ```
/// use am_shm::Segment;
/// let seg = Segment::heap(0, 64).unwrap();
/// let bytes = seg.byte_area();
/// bytes.write(3, b"hello").unwrap();
/// let mut out = [0u8; 5];
/// bytes.read(3, &mut out).unwrap();
/// assert_eq!(&out, b"hello");
/// bytes.store_u64(8, 7).unwrap();
/// assert_eq!(bytes.load_u64(8).unwrap(), 7);
/// assert!(bytes.slice(60, 5).is_err(), "out of bounds is an error");
/// ```
#[derive(Clone, Copy)]
pub struct SharedBytes<'a> {
    map: &'a Mapping,
    /// Byte offset of the view in the mapping.
    start: usize,
    len: usize,
}

impl<'a> SharedBytes<'a> {
    /// The view `[start, start + len)` of `map`, which the caller has checked is in bounds.
    #[inline]
    pub(crate) fn new(map: &'a Mapping, start: usize, len: usize) -> SharedBytes<'a> {
        debug_assert!(start + len <= map.len());
        SharedBytes { map, start, len }
    }

    /// The mapping, offset and length of the view (for copies that go straight between
    /// mappings).
    #[inline]
    pub(crate) fn raw(&self) -> (&'a Mapping, usize, usize) {
        (self.map, self.start, self.len)
    }

    /// Where the view starts in memory, for handing the memory to a NIC that reads and writes
    /// it by DMA (libfabric's `fi_mr_reg`). The memory stays mapped for as long as the view's
    /// borrow lasts. Whatever reaches it through the pointer must keep this type's rule: peers
    /// may write it at any time, so only atomics and byte-wise copies, never references to
    /// its bytes. Getting the pointer is safe; using it is the caller's `unsafe`.
    #[cfg(not(loom))]
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.base().wrapping_add(self.start)
    }

    /// Number of bytes in the view.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the view has no bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset check: `[off, off + len)` inside the view, returned as an absolute offset.
    #[inline]
    fn at(&self, off: usize, len: usize) -> Result<usize, ShmError> {
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.start + off),
            _ => Err(ShmError::OutOfBounds {
                offset: off,
                len,
                area: self.len,
            }),
        }
    }

    /// The narrower view `[off, off + len)`.
    #[inline]
    pub fn slice(&self, off: usize, len: usize) -> Result<SharedBytes<'a>, ShmError> {
        let start = self.at(off, len)?;
        Ok(SharedBytes {
            map: self.map,
            start,
            len,
        })
    }

    /// The narrower view `[off, off + len)`, or an empty view if that is out of range: for
    /// ranges a layout checked when the segment was made.
    #[inline]
    pub fn slice_or_empty(&self, off: usize, len: usize) -> SharedBytes<'a> {
        self.slice(off, len).unwrap_or(SharedBytes {
            map: self.map,
            start: self.start + self.len,
            len: 0,
        })
    }

    /// The view from `off` to its end.
    #[inline]
    pub fn slice_from(&self, off: usize) -> Result<SharedBytes<'a>, ShmError> {
        self.slice(off, self.len.checked_sub(off).unwrap_or(usize::MAX))
    }

    /// Copies `[off, off + dst.len())` into `dst`.
    #[inline]
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), ShmError> {
        let at = self.at(off, dst.len())?;
        // SAFETY: `at + dst.len() <= start + len <= map.len()` (checked by `at`).
        unsafe { self.map.load(at, dst) };
        Ok(())
    }

    /// Copies the whole view into `dst` (cleared first).
    pub fn read_into(&self, dst: &mut Vec<u8>) {
        dst.clear();
        dst.resize(self.len, 0);
        // SAFETY: the view is in bounds of its mapping (an invariant of `SharedBytes`).
        unsafe { self.map.load(self.start, dst) };
    }

    /// A private copy of the whole view.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::new();
        self.read_into(&mut v);
        v
    }

    /// Copies `src` to `[off, off + src.len())`.
    #[inline]
    pub fn write(&self, off: usize, src: &[u8]) -> Result<(), ShmError> {
        let at = self.at(off, src.len())?;
        // SAFETY: in bounds (checked by `at`).
        unsafe { self.map.store(at, src) };
        Ok(())
    }

    /// Copies the view `src` (of this or another mapping) to `[off, off + src.len())`, in one
    /// pass (no private buffer in between) unless the two overlap.
    pub fn copy_from(&self, off: usize, src: SharedBytes<'_>) -> Result<(), ShmError> {
        let at = self.at(off, src.len)?;
        // SAFETY: `at + src.len` is inside this view's mapping (checked by `at`) and `src`
        // is inside its own (an invariant of `SharedBytes`).
        unsafe { self.map.copy_from_map(at, src.map, src.start, src.len) };
        Ok(())
    }

    /// Sets `[off, off + len)` to `byte`.
    pub fn fill(&self, off: usize, len: usize, byte: u8) -> Result<(), ShmError> {
        self.at(off, len)?;
        let buf = [byte; 4096];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len());
            self.write(off + done, &buf[..n])?;
            done += n;
        }
        Ok(())
    }

    /// Asks the CPU to fetch the cache line of byte `off` before it is used (a hint, for
    /// code that knows its next accesses: a batch of remote atomics). Nothing if `off` is
    /// outside the view.
    #[inline]
    pub fn prefetch(&self, off: usize) {
        if let Ok(at) = self.at(off, 1) {
            self.map.prefetch(at);
        }
    }

    /// The 64-bit atomic at `off`, which must be 8-aligned in memory: for words the program
    /// updates atomically (counters, locks, remote atomics).
    #[inline]
    pub fn atomic_u64(&self, off: usize) -> Result<&'a AtomicU64, ShmError> {
        let at = self.at(off, WORD)?;
        if at % WORD != 0 {
            return Err(ShmError::Misaligned { offset: off });
        }
        // SAFETY: 8-aligned (checked) and in bounds (checked by `at`).
        Ok(unsafe { self.map.word64(at) })
    }

    /// The view's whole 8-byte words as atomics; the view must start 8-aligned in memory, and
    /// a tail shorter than a word is left out. For tables the program reads and updates in
    /// place word by word (RandomAccess's): one bounds check per access, and relaxed loads and
    /// stores compile to plain moves, so a loop over random words keeps as many cache misses
    /// in flight as one over `&mut [u64]`.
    #[inline]
    pub fn words(&self) -> Result<&'a [AtomicU64], ShmError> {
        if !self.start.is_multiple_of(WORD) {
            return Err(ShmError::Misaligned { offset: 0 });
        }
        // SAFETY: 8-aligned (checked) and `start + 8 * (len / 8) <= start + len <= map.len()`
        // (an invariant of `SharedBytes`).
        Ok(unsafe { self.map.words64(self.start, self.len / WORD) })
    }

    /// Loads the 8 bytes at `off` as a native-endian `u64` (a relaxed atomic load where they
    /// are aligned: the bytes [`read`](Self::read) would give).
    #[inline]
    pub fn load_u64(&self, off: usize) -> Result<u64, ShmError> {
        let at = self.at(off, WORD)?;
        if at % WORD == 0 {
            // SAFETY: aligned and in bounds (checked).
            return Ok(unsafe { self.map.word64(at) }.load(Ordering::Relaxed));
        }
        let mut b = [0u8; WORD];
        // SAFETY: in bounds (checked by `at`).
        unsafe { self.map.load(at, &mut b) };
        Ok(u64::from_ne_bytes(b))
    }

    /// Stores `value` native-endian at `off` (a relaxed atomic store where aligned).
    #[inline]
    pub fn store_u64(&self, off: usize, value: u64) -> Result<(), ShmError> {
        let at = self.at(off, WORD)?;
        if at % WORD == 0 {
            // SAFETY: aligned and in bounds (checked).
            unsafe { self.map.word64(at) }.store(value, Ordering::Relaxed);
            return Ok(());
        }
        // SAFETY: in bounds (checked by `at`).
        unsafe { self.map.store(at, &value.to_ne_bytes()) };
        Ok(())
    }
}

impl std::fmt::Debug for SharedBytes<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBytes")
            .field("start", &self.start)
            .field("len", &self.len)
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::Segment;

    #[test]
    fn copies_at_every_alignment_keep_the_neighbours() {
        let seg = Segment::heap(0, 64).unwrap();
        let b = seg.byte_area();
        // Every offset in a word and the next aligned one (every offset of two words natively).
        for start in 0..if cfg!(miri) { 9 } else { 16 } {
            for len in 0..24 {
                b.fill(0, 64, 0xEE).unwrap();
                let src: Vec<u8> = (0..len as u8).map(|i| i + 1).collect();
                b.write(start, &src).unwrap();
                let all = b.to_vec();
                assert_eq!(&all[start..start + len], &src[..]);
                assert!(
                    all[..start].iter().all(|&x| x == 0xEE),
                    "before {start}+{len}"
                );
                assert!(all[start + len..].iter().all(|&x| x == 0xEE), "after");
                let mut back = vec![0u8; len];
                b.read(start, &mut back).unwrap();
                assert_eq!(back, src);
            }
        }
    }

    /// Catches a large copy whose path is chosen by where its ends fall (the string copy,
    /// or vector moves where its destination is a little ahead of its source modulo a page)
    /// and that drops, doubles or shifts bytes on one of them: every distance modulo a page,
    /// both ways.
    #[test]
    #[cfg_attr(
        miri,
        ignore = "the copies' paths are the hardware's: Miri takes another"
    )]
    fn large_copies_at_every_distance_modulo_a_page_are_whole() {
        let n = 4096 + 136;
        let seg = Segment::heap(0, n + 64).unwrap();
        let b = seg.byte_area();
        let src: Vec<u8> = (0..n + 4096).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut back = vec![0u8; n + 4096];
        for from in (0..4096).step_by(8) {
            b.fill(0, n + 64, 0xEE).unwrap();
            b.write(8, &src[from..from + n]).unwrap();
            let all = b.to_vec();
            assert_eq!(&all[8..8 + n], &src[from..from + n], "from {from}");
            assert!(all[..8].iter().chain(&all[8 + n..]).all(|&x| x == 0xEE));
            b.read(8, &mut back[from..from + n]).unwrap();
            assert_eq!(
                &back[from..from + n],
                &src[from..from + n],
                "back to {from}"
            );
        }
    }

    #[test]
    fn bounds_overflow_and_alignment_are_errors() {
        let seg = Segment::heap(0, 20).unwrap();
        let b = seg.byte_area();
        assert_eq!(b.len(), 20);
        assert!(b.write(19, &[1]).is_ok());
        assert!(b.write(19, &[1, 2]).is_err());
        assert!(b.write(usize::MAX, &[1]).is_err());
        assert!(b.slice(usize::MAX, 2).is_err());
        assert!(b.slice(21, 0).is_err());
        assert!(b.slice_from(21).is_err());
        assert_eq!(b.slice_from(20).unwrap().len(), 0);
        let s = b.slice(4, 10).unwrap();
        assert!(s.read(8, &mut [0; 3]).is_err(), "past the narrower view");
        assert!(s.atomic_u64(0).is_err(), "misaligned");
        assert!(b.atomic_u64(8).is_ok());
        assert!(b.atomic_u64(16).is_err(), "past the end");
        s.store_u64(1, 0x0102030405060708).unwrap();
        assert_eq!(b.load_u64(5).unwrap(), 0x0102030405060708);
    }

    #[test]
    fn words_are_the_views_whole_aligned_words() {
        use std::sync::atomic::Ordering::Relaxed;
        let seg = Segment::heap(0, 64).unwrap();
        let b = seg.byte_area();
        let w = b.slice(8, 27).unwrap().words().unwrap();
        assert_eq!(w.len(), 3, "the 3-byte tail is left out");
        w[1].store(0x0102030405060708, Relaxed);
        assert_eq!(
            b.load_u64(16).unwrap(),
            0x0102030405060708,
            "word 1 is bytes 16..24"
        );
        b.store_u64(32, 9).unwrap();
        assert_eq!(w.len(), 3);
        assert_eq!(
            b.slice(24, 16).unwrap().words().unwrap()[1].load(Relaxed),
            9
        );
        assert!(b.slice(4, 16).unwrap().words().is_err(), "misaligned start");
        assert!(b.slice(64, 0).unwrap().words().unwrap().is_empty());
    }

    /// A long copy between mappings at different alignments lands whole; one that ends at the
    /// destination's last byte (within a word) lands too, and one a byte past it is refused.
    /// Under Miri every copy takes the word loop, which a thousand bytes run as a long one
    /// does (alignments are checked by `shared_to_shared_copy_any_alignment_and_overlap`).
    #[test]
    fn shared_to_shared_copy() {
        let (size, n) = if cfg!(miri) {
            (1_100, 1_000)
        } else {
            (10_004, 9_000)
        };
        let a = Segment::heap(0, size).unwrap();
        let b = Segment::heap(0, size).unwrap();
        let src: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
        a.byte_area().write(3, &src).unwrap();
        b.byte_area()
            .copy_from(5, a.byte_area().slice(3, n).unwrap())
            .unwrap();
        assert_eq!(b.byte_area().slice(5, n).unwrap().to_vec(), src);
        assert!(b
            .byte_area()
            .copy_from(size - n + 1, a.byte_area().slice(0, n).unwrap())
            .is_err());
        b.byte_area()
            .copy_from(size - n, a.byte_area().slice(0, n).unwrap())
            .unwrap();
        assert_eq!(
            b.byte_area().slice(size - n, n).unwrap().to_vec(),
            a.byte_area().slice(0, n).unwrap().to_vec()
        );
    }

    /// Copies long enough for the vector copy, to and from every word offset of a line (so
    /// each 32-byte move starts at each offset of a 32-byte block) and a few unaligned ones:
    /// private to shared, shared to private (into a buffer at several byte offsets) and
    /// shared to shared; the bytes land where they should, and the neighbours are kept.
    #[test]
    fn vector_copies_from_every_word_of_a_line() {
        let size = 1024;
        // Under Miri the vector copy is not built (the word loop is checked): a few cases.
        let lens: &[usize] = if cfg!(miri) {
            &[64]
        } else {
            &[64, 72, 88, 96, 120, 128, 136, 200, 256, 504, 512, 520]
        };
        let offsets: Vec<usize> = if cfg!(miri) {
            vec![0, 8, 24, 3]
        } else {
            (0..64).step_by(8).chain([1, 3, 13]).collect()
        };
        let pattern: Vec<u8> = (0..size).map(|i| (i * 7 + 3) as u8).collect();
        let src_seg = Segment::heap(0, size).unwrap();
        src_seg.byte_area().write(0, &pattern).unwrap();
        for &n in lens {
            for &at in &offsets {
                let seg = Segment::heap(0, size).unwrap();
                let b = seg.byte_area();
                let mut want = vec![0xEE; size];
                want[at..at + n].copy_from_slice(&pattern[..n]);
                b.fill(0, size, 0xEE).unwrap();
                b.write(at, &pattern[..n]).unwrap();
                assert_eq!(b.to_vec(), want, "write n {n} at {at}");
                for k in [0, 1, 5, 8] {
                    let mut back = vec![0x11u8; n + 16];
                    b.read(at, &mut back[k..k + n]).unwrap();
                    assert_eq!(
                        &back[k..k + n],
                        &pattern[..n],
                        "read n {n} at {at} into {k}"
                    );
                    assert!(back[..k].iter().chain(&back[k + n..]).all(|&x| x == 0x11));
                }
                let mut want = vec![0xEE; size];
                want[at..at + n].copy_from_slice(&pattern[24..24 + n]);
                b.fill(0, size, 0xEE).unwrap();
                b.copy_from(at, src_seg.byte_area().slice(24, n).unwrap())
                    .unwrap();
                assert_eq!(b.to_vec(), want, "copy n {n} to {at}");
            }
        }
    }

    /// Shared-to-shared copies at every pair of alignments, short and past the `rep movsb`
    /// threshold, between mappings and overlapping within one (both directions): the bytes
    /// land as `memmove` would put them, and the neighbours are kept.
    #[test]
    fn shared_to_shared_copy_any_alignment_and_overlap() {
        let lens: &[usize] = if cfg!(miri) {
            &[1, 9, 41]
        } else {
            &[
                0, 1, 7, 8, 9, 16, 24, 41, 64, 128, 168, 255, 256, 300, 1000, 1032,
            ]
        };
        let (size, aligns): (usize, &[usize]) = if cfg!(miri) {
            (160, &[0, 1, 7])
        } else {
            (2048, &[0, 1, 2, 3, 4, 5, 6, 7])
        };
        let pattern: Vec<u8> = (0..size).map(|i| (i * 13 + 1) as u8).collect();
        for &n in lens {
            for &src_at in aligns {
                for &dst_at in aligns {
                    let a = Segment::heap(0, size).unwrap();
                    let b = Segment::heap(0, size).unwrap();
                    a.byte_area().write(0, &pattern).unwrap();
                    b.byte_area().fill(0, size, 0xEE).unwrap();
                    let from = a.byte_area().slice(16 + src_at, n).unwrap();
                    b.byte_area().copy_from(16 + dst_at, from).unwrap();
                    let got = b.byte_area().to_vec();
                    let mut want = vec![0xEE; size];
                    want[16 + dst_at..16 + dst_at + n]
                        .copy_from_slice(&pattern[16 + src_at..16 + src_at + n]);
                    assert_eq!(got, want, "n {n} from {src_at} to {dst_at}");
                    // Within one mapping, overlapping forwards and backwards.
                    for shift in [3usize, 8, 64] {
                        a.byte_area().write(0, &pattern).unwrap();
                        let v = a.byte_area();
                        v.copy_from(16 + dst_at + shift, v.slice(16 + src_at, n).unwrap())
                            .unwrap();
                        let mut want = pattern.clone();
                        want.copy_within(16 + src_at..16 + src_at + n, 16 + dst_at + shift);
                        assert_eq!(v.to_vec(), want, "overlap n {n} shift {shift}");
                        a.byte_area().write(0, &pattern).unwrap();
                        v.copy_from(16 + dst_at, v.slice(16 + src_at + shift, n).unwrap())
                            .unwrap();
                        let mut want = pattern.clone();
                        want.copy_within(16 + src_at + shift..16 + src_at + shift + n, 16 + dst_at);
                        assert_eq!(v.to_vec(), want, "overlap back n {n} shift {shift}");
                    }
                }
            }
        }
    }

    /// A writer rewrites bytes while a reader copies them and a third thread merges bytes
    /// into the same words: every access is atomic, so Miri finds no race (and no mixed-size
    /// access), and every byte read is one that was written.
    #[test]
    fn concurrent_writers_and_readers_race_soundly() {
        let seg = Segment::heap(0, 64).unwrap();
        let rounds = if cfg!(miri) { 20 } else { 2000 };
        std::thread::scope(|s| {
            let b = seg.byte_area();
            s.spawn(move || {
                for i in 0..rounds {
                    b.write(1, &[(i % 2) as u8 * 0x11; 30]).unwrap();
                }
            });
            s.spawn(move || {
                for _ in 0..rounds {
                    b.write(40, &[0x22; 3]).unwrap();
                }
            });
            for _ in 0..rounds {
                let mut out = [0u8; 64];
                b.read(0, &mut out).unwrap();
                assert!(out[1..31].iter().all(|&x| x == 0 || x == 0x11));
                assert!(out[40..43].iter().all(|&x| x == 0 || x == 0x22));
            }
        });
    }
}
