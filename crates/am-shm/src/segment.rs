//! Segments: a word area (atomics only) followed by a byte area (bounds-checked copies).
//!
//! ```
//! use am_shm::Segment;
//! let seg = Segment::heap(64, 256);
//! let peer = seg.import();
//! peer.write(10, b"hello").unwrap();
//! peer.store_word(0, 1).unwrap(); // publish after the data
//! assert_eq!(seg.load_word(0).unwrap(), 1);
//! assert_eq!(seg.bytes(10, 5).unwrap(), b"hello");
//! ```

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use crate::doorbell::Doorbell;
use crate::ShmError;

/// Size of a cache line: flag words that different writers touch sit on separate lines.
pub const CACHE_LINE: usize = 64;

/// Where POSIX shared memory lives on Linux.
const SHM_DIR: &str = "/dev/shm";

/// The memory behind a segment: a shared file mapping or (for Miri, loom, tests) the heap.
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

enum Backing {
    /// From `Box::<[u64]>::into_raw`; freed in `Drop`.
    Heap(*mut [u64]),
    /// Held only to unmap on drop.
    #[allow(dead_code)]
    Mmap(memmap2::MmapRaw),
}

// SAFETY: the mapping is plain memory owned by this value; all accesses go through raw
// pointers, as atomics (word area) or as copies ordered by the callers' stamp protocol
// (byte area), never through references that could alias a `&mut`.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: shared access is through atomics or raw copies only.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Backing::Heap(p) = self.backing {
            // SAFETY: `p` came from `Box::into_raw` in `Mapping::heap` and is freed only here,
            // once, when the last `Arc` holder (owner or importer) is gone.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

impl Mapping {
    fn heap(len: usize) -> Mapping {
        let words = len.div_ceil(8).max(1);
        let raw: *mut [u64] = Box::into_raw(vec![0u64; words].into_boxed_slice());
        let ptr = NonNull::new(raw.cast::<u8>()).expect("Box::into_raw is never null");
        Mapping {
            ptr,
            len,
            backing: Backing::Heap(raw),
        }
    }

    #[cfg_attr(miri, allow(dead_code))]
    fn map(file: &std::fs::File, len: usize, path: &str) -> Result<Mapping, ShmError> {
        let raw = memmap2::MmapOptions::new()
            .len(len)
            .map_raw(file)
            .map_err(|source| ShmError::Io {
                what: "mapping",
                path: path.to_owned(),
                source,
            })?;
        let ptr =
            NonNull::new(raw.as_mut_ptr()).ok_or_else(|| ShmError::BadSegment(path.into()))?;
        Ok(Mapping {
            ptr,
            len,
            backing: Backing::Mmap(raw),
        })
    }
}

fn check_name(s: &str) -> Result<(), ShmError> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ShmError::BadName(s.to_owned()))
    }
}

/// The file name of segment `name` of job `job_id`: `/dev/shm/am-<job_id>-<name>`.
pub fn segment_path(job_id: &str, name: &str) -> Result<PathBuf, ShmError> {
    check_name(job_id)?;
    check_name(name)?;
    Ok(PathBuf::from(format!("{SHM_DIR}/am-{job_id}-{name}")))
}

/// The layout both sides agree on: `words` bytes of atomics, then `bytes` bytes of payload.
#[derive(Clone)]
struct View {
    map: Arc<Mapping>,
    words: usize,
    bytes: usize,
}

impl View {
    fn new(map: Mapping, words: usize, bytes: usize) -> View {
        debug_assert!(words % CACHE_LINE == 0 && words + bytes <= map.len);
        View {
            map: Arc::new(map),
            words,
            bytes,
        }
    }

    /// The atomic at byte `off` of the word area, checked for bounds and alignment.
    #[inline]
    fn word64(&self, off: usize) -> Result<&AtomicU64, ShmError> {
        if off % 8 != 0 || off.checked_add(8).is_none_or(|end| end > self.words) {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len: 8,
                area: self.words,
            });
        }
        // SAFETY: `off + 8 <= words <= len`, so the pointer is inside the live mapping (kept
        // alive by `self.map` for the borrow's lifetime), 8-aligned (mapping and heap are
        // 8-aligned, `off % 8 == 0`), and the word area is only ever accessed atomically
        // (byte copies are confined to the byte area), so no non-atomic access can race.
        Ok(unsafe { AtomicU64::from_ptr(self.map.ptr.as_ptr().add(off).cast::<u64>()) })
    }

    /// `n` consecutive atomics from byte `off` of the word area, checked for bounds and
    /// alignment once for the whole run (a record of several words).
    #[inline]
    fn words64(&self, off: usize, n: usize) -> Result<&[AtomicU64], ShmError> {
        let end = n.checked_mul(8).and_then(|len| off.checked_add(len));
        if off % 8 != 0 || end.is_none_or(|end| end > self.words) {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len: n.saturating_mul(8),
                area: self.words,
            });
        }
        // SAFETY: `off + 8n <= words <= len`, so the run is inside the live mapping (kept
        // alive by `self.map` for the borrow's lifetime, and at most `len <= isize::MAX`
        // bytes); the pointer is non-null and 8-aligned (mapping and heap are 8-aligned,
        // `off % 8 == 0`), as `AtomicU64` needs. `AtomicU64` is an `UnsafeCell`, so a shared
        // slice of them asserts nothing about other processes' writes, and the word area is
        // only ever accessed atomically (as `word64` does), so no non-atomic access can race.
        Ok(unsafe {
            std::slice::from_raw_parts(self.map.ptr.as_ptr().add(off).cast::<AtomicU64>(), n)
        })
    }

    /// The 32-bit atomic at byte `off` of the word area (futex words).
    #[inline]
    fn word32(&self, off: usize) -> Result<&AtomicU32, ShmError> {
        if off % 4 != 0 || off.checked_add(4).is_none_or(|end| end > self.words) {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len: 4,
                area: self.words,
            });
        }
        // SAFETY: in bounds and 4-aligned as checked; the word area is accessed only
        // atomically. A location is used either as a u64 or as a u32 word, never both: the
        // NIC models give each flag its own cache line.
        Ok(unsafe { AtomicU32::from_ptr(self.map.ptr.as_ptr().add(off).cast::<u32>()) })
    }

    /// The atomic at byte `off` of the *byte* area: a slot's message-ready flag, which shares
    /// the slot's first cache line with its header (see [`crate::stamp`]). Checked for bounds
    /// and 8-alignment.
    #[inline]
    fn slot_word(&self, off: usize) -> Result<&AtomicU64, ShmError> {
        if off % 8 != 0 || off.checked_add(8).is_none_or(|end| end > self.bytes) {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len: 8,
                area: self.bytes,
            });
        }
        // SAFETY: `words + off + 8 <= words + bytes <= len`: inside the live mapping (kept
        // alive by `self.map`); 8-aligned (mapping and heap are 8-aligned, `words` is a
        // multiple of 64, `off % 8 == 0`). The stamp protocol accesses a slot's flag word only
        // through this function (atomically); byte copies start after it (`stamp::Slots`).
        Ok(unsafe {
            AtomicU64::from_ptr(self.map.ptr.as_ptr().add(self.words + off).cast::<u64>())
        })
    }

    /// Pointer to `[off, off + len)` of the byte area, checked.
    #[inline]
    fn range(&self, off: usize, len: usize) -> Result<*mut u8, ShmError> {
        if off.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len,
                area: self.bytes,
            });
        }
        // SAFETY: `words + off + len <= words + bytes <= map.len`: inside the mapping.
        Ok(unsafe { self.map.ptr.as_ptr().add(self.words + off) })
    }
}

/// A segment this process created (the SCI **exported** segment): it may read its own memory,
/// lend it out, and hand [`Imported`] views to writers.
///
/// Created under `/dev/shm` by job id ([`Segment::create`]) or on the heap
/// ([`Segment::heap`]). The file is removed on drop, or earlier with [`Segment::unlink`]
/// once every peer has opened it (the mapping stays valid).
pub struct Segment {
    view: View,
    path: Option<PathBuf>,
}

impl Segment {
    /// Creates `/dev/shm/am-<job_id>-<name>` with a word area of `words` bytes (rounded up to
    /// whole cache lines) and a byte area of `bytes` bytes, all zero. A stale file of the same
    /// job and name is replaced.
    pub fn create(
        job_id: &str,
        name: &str,
        words: usize,
        bytes: usize,
    ) -> Result<Segment, ShmError> {
        let path = segment_path(job_id, name)?;
        let shown = path.display().to_string();
        let words = words.div_ceil(CACHE_LINE) * CACHE_LINE;
        let len = words + bytes;
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(ShmError::Io {
                    what: "removing stale",
                    path: shown,
                    source,
                })
            }
        }
        let io = |what| {
            let shown = shown.clone();
            move |source| ShmError::Io {
                what,
                path: shown,
                source,
            }
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(io("creating"))?;
        // Remove the file again if anything below fails.
        let seg_path = Some(path);
        let result = file
            .set_len(len.max(1) as u64)
            .map_err(io("sizing"))
            .and_then(|()| Mapping::map(&file, len.max(1), &shown));
        match result {
            Ok(map) => Ok(Segment {
                view: View::new(map, words, bytes),
                path: seg_path,
            }),
            Err(e) => {
                if let Some(p) = seg_path {
                    let _ = std::fs::remove_file(p);
                }
                Err(e)
            }
        }
    }

    /// Maps an existing segment with full access (for the raw floors only, where both sides
    /// read and write one line).
    #[cfg_attr(miri, allow(dead_code))]
    pub(crate) fn attach(
        job_id: &str,
        name: &str,
        words: usize,
        bytes: usize,
    ) -> Result<Segment, ShmError> {
        Ok(Segment {
            view: Imported::open(job_id, name, words, bytes)?.view,
            path: None,
        })
    }

    /// A segment on the heap with the same layout, for in-process use, Miri and loom.
    pub fn heap(words: usize, bytes: usize) -> Segment {
        let words = words.div_ceil(CACHE_LINE) * CACHE_LINE;
        Segment {
            view: View::new(Mapping::heap(words + bytes), words, bytes),
            path: None,
        }
    }

    /// Removes the file now; the mapping (and peers' mappings) stay valid. After this, a
    /// killed job leaves nothing behind.
    pub fn unlink(&mut self) -> Result<(), ShmError> {
        if let Some(p) = self.path.take() {
            std::fs::remove_file(&p).map_err(|source| ShmError::Io {
                what: "removing",
                path: p.display().to_string(),
                source,
            })?;
        }
        Ok(())
    }

    /// A writer's view of this segment (for messages to self, or a helper thread).
    pub fn import(&self) -> Imported {
        Imported {
            view: self.view.clone(),
        }
    }

    /// Size of the word area (a multiple of [`CACHE_LINE`]).
    pub fn words_len(&self) -> usize {
        self.view.words
    }

    /// Size of the byte area.
    pub fn bytes_len(&self) -> usize {
        self.view.bytes
    }

    /// The 64-bit flag word at byte offset `off` of the word area.
    #[inline]
    pub fn word(&self, off: usize) -> Result<&AtomicU64, ShmError> {
        self.view.word64(off)
    }

    /// The `n` 64-bit words from byte offset `off` of the word area (a record of several
    /// words, e.g. one cache line), checked once for the whole run rather than per word.
    /// `off` must be 8-aligned. Do not cover a word used as a [`doorbell`](Self::doorbell)
    /// (a location is accessed either as a 64-bit or as a 32-bit atomic, never both).
    #[inline]
    pub fn words(&self, off: usize, n: usize) -> Result<&[AtomicU64], ShmError> {
        self.view.words64(off, n)
    }

    /// `Acquire` load of the word at `off`: what a reader does before reading the data it
    /// publishes.
    #[inline]
    pub fn load_word(&self, off: usize) -> Result<u64, ShmError> {
        Ok(self.view.word64(off)?.load(Ordering::Acquire))
    }

    /// `Acquire` load of the slot flag word at byte offset `off` of the *byte* area (a
    /// message-ready flag in its slot's first cache line, see [`crate::stamp`]).
    #[inline]
    pub fn load_slot_word(&self, off: usize) -> Result<u64, ShmError> {
        Ok(self.view.slot_word(off)?.load(Ordering::Acquire))
    }

    /// The doorbell (32-bit futex word) at byte offset `off` of the word area.
    #[inline]
    pub fn doorbell(&self, off: usize) -> Result<Doorbell<'_>, ShmError> {
        Ok(Doorbell::new(self.view.word32(off)?))
    }

    /// Copies `[off, off + dst.len())` of the byte area into `dst`.
    #[inline]
    pub fn read(&self, off: usize, dst: &mut [u8]) -> Result<(), ShmError> {
        let src = self.view.range(off, dst.len())?;
        // SAFETY: `src..src+len` is inside the byte area (checked by `range`); `dst` is a
        // distinct local buffer. The bytes were published to us by a stamp the caller loaded
        // with Acquire (hand-over step "read after Acquire").
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Lends `[off, off + len)` of the byte area. Only bytes that the hand-over protocol
    /// guarantees no one rewrites while lent should be borrowed (see the crate docs).
    #[inline]
    pub fn bytes(&self, off: usize, len: usize) -> Result<&[u8], ShmError> {
        let p = self.view.range(off, len)?;
        // SAFETY: in bounds of the live mapping (kept alive by `&self`); no `&mut` to these
        // bytes exists while `&self` is borrowed (`bytes_mut` takes `&mut self`); writers in
        // other threads/processes stay off published bytes until the reader hands them back
        // (the protocol step this crate trusts, see the crate docs).
        Ok(unsafe { std::slice::from_raw_parts(p, len) })
    }

    /// Lends `[off, off + len)` of the byte area mutably (the owner's own data, e.g. the AM
    /// segment).
    #[inline]
    pub fn bytes_mut(&mut self, off: usize, len: usize) -> Result<&mut [u8], ShmError> {
        let p = self.view.range(off, len)?;
        // SAFETY: in bounds; `&mut self` excludes other borrows through this owner; remote
        // writers touch only ranges the program designated (the trust in the crate docs).
        Ok(unsafe { std::slice::from_raw_parts_mut(p, len) })
    }
}

impl Segment {
    /// Lends `[shared_off, +shared_len)` shared and `[excl_off, +excl_len)` mutably at once;
    /// the ranges must not overlap (a received message and the AM segment beside it).
    #[inline]
    pub fn split_lend(
        &mut self,
        shared_off: usize,
        shared_len: usize,
        excl_off: usize,
        excl_len: usize,
    ) -> Result<(&[u8], &mut [u8]), ShmError> {
        let a = self.view.range(shared_off, shared_len)?;
        let b = self.view.range(excl_off, excl_len)?;
        let disjoint = shared_off + shared_len <= excl_off || excl_off + excl_len <= shared_off;
        if !disjoint {
            return Err(ShmError::OutOfBounds {
                offset: excl_off,
                len: excl_len,
                area: self.view.bytes,
            });
        }
        // SAFETY: both ranges are in bounds (checked by `range`) and disjoint (checked above),
        // so the `&[u8]` and the `&mut [u8]` do not alias; `&mut self` excludes other borrows
        // through this owner; remote writers follow the hand-over protocol (crate docs).
        unsafe {
            Ok((
                std::slice::from_raw_parts(a, shared_len),
                std::slice::from_raw_parts_mut(b, excl_len),
            ))
        }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("words", &self.view.words)
            .field("bytes", &self.view.bytes)
            .field("path", &self.path)
            .finish()
    }
}

/// A peer's segment mapped here (the SCI **imported** segment): it exposes writes only —
/// word stores, doorbell rings and byte copies — and no way to read.
#[derive(Clone)]
pub struct Imported {
    view: View,
}

impl Imported {
    /// Opens segment `name` of job `job_id`, which must have exactly this layout (`words` is
    /// rounded up to whole cache lines, as at creation).
    pub fn open(
        job_id: &str,
        name: &str,
        words: usize,
        bytes: usize,
    ) -> Result<Imported, ShmError> {
        let path = segment_path(job_id, name)?;
        let shown = path.display().to_string();
        let words = words.div_ceil(CACHE_LINE) * CACHE_LINE;
        let len = words + bytes;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| ShmError::Io {
                what: "opening",
                path: shown.clone(),
                source,
            })?;
        let meta = file.metadata().map_err(|source| ShmError::Io {
            what: "stat",
            path: shown.clone(),
            source,
        })?;
        if meta.len() != len.max(1) as u64 {
            return Err(ShmError::BadSegment(shown));
        }
        Ok(Imported {
            view: View::new(Mapping::map(&file, len.max(1), &shown)?, words, bytes),
        })
    }

    /// Size of the byte area.
    pub fn bytes_len(&self) -> usize {
        self.view.bytes
    }

    /// `Release` store to the word at `off`: publishes everything written before it.
    #[inline]
    pub fn store_word(&self, off: usize, value: u64) -> Result<(), ShmError> {
        self.view.word64(off)?.store(value, Ordering::Release);
        Ok(())
    }

    /// `Release` store to the slot flag word at byte offset `off` of the *byte* area: publishes
    /// the slot bytes written before it (see [`crate::stamp`]).
    #[inline]
    pub fn store_slot_word(&self, off: usize, value: u64) -> Result<(), ShmError> {
        self.view.slot_word(off)?.store(value, Ordering::Release);
        Ok(())
    }

    /// Rings the doorbell at `off` (see [`Doorbell::ring`]).
    #[inline]
    pub fn ring(&self, off: usize) -> Result<(), ShmError> {
        Doorbell::new(self.view.word32(off)?).ring();
        Ok(())
    }

    /// Rings the doorbell at `off` leaving `tag` (see [`Doorbell::ring_tagged`]).
    #[inline]
    pub fn ring_tagged(&self, off: usize, tag: u32) -> Result<(), ShmError> {
        Doorbell::new(self.view.word32(off)?).ring_tagged(tag);
        Ok(())
    }

    /// Copies `src` to `[off, off + src.len())` of the byte area.
    #[inline]
    pub fn write(&self, off: usize, src: &[u8]) -> Result<(), ShmError> {
        let dst = self.view.range(off, src.len())?;
        // SAFETY: in bounds (checked); `src` is local memory, distinct from the mapping's
        // byte area unless the caller lends it from there, which the borrow rules forbid for
        // the owner's `bytes_mut` and which copies within a byte area never do. The caller
        // owns this range by its protocol ("claim" step) and publishes it afterwards with a
        // Release store ("publish" step).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }
}

impl std::fmt::Debug for Imported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Imported")
            .field("words", &self.view.words)
            .field("bytes", &self.view.bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_alignment_are_errors() {
        let seg = Segment::heap(64, 100);
        let imp = seg.import();
        assert!(seg.word(0).is_ok());
        assert!(seg.word(56).is_ok());
        assert!(seg.word(64).is_err());
        assert!(seg.word(3).is_err());
        assert!(seg.word(usize::MAX - 3).is_err());
        assert!(seg.doorbell(60).is_ok());
        assert!(seg.doorbell(62).is_err());
        assert!(imp.write(99, &[1]).is_ok());
        assert!(imp.write(99, &[1, 2]).is_err());
        assert!(imp.write(usize::MAX, &[1]).is_err());
        assert!(seg.bytes(0, 101).is_err());
        assert!(seg.bytes(usize::MAX, 2).is_err());
        let mut b = [0u8; 1];
        seg.read(99, &mut b).unwrap();
        assert_eq!(b, [1]);
    }

    #[test]
    fn word_runs_are_checked_once_and_alias_single_words() {
        let seg = Segment::heap(128, 0);
        let run = seg.words(64, 8).unwrap();
        assert_eq!(run.len(), 8);
        run[7].store(9, Ordering::Relaxed);
        assert_eq!(
            seg.load_word(120).unwrap(),
            9,
            "the run's last word is word 120"
        );
        assert!(seg.words(0, 16).is_ok());
        assert!(seg.words(0, 0).unwrap().is_empty());
        assert!(seg.words(128, 0).is_ok());
        assert!(seg.words(8, 16).is_err(), "past the word area");
        assert!(seg.words(4, 1).is_err(), "misaligned");
        assert!(seg.words(0, usize::MAX / 4).is_err(), "length overflow");
        assert!(seg.words(usize::MAX - 7, 1).is_err(), "offset overflow");
    }

    /// A record published through a run: the reader's `Acquire` load of the stamp makes the
    /// writer's earlier `Relaxed` stores to the other words visible (Miri checks the races).
    #[test]
    fn word_run_record_hand_over_between_threads() {
        let seg = Segment::heap(64, 0);
        let rounds = if cfg!(miri) { 3 } else { 200 };
        std::thread::scope(|s| {
            let seg = &seg;
            s.spawn(move || {
                let rec = seg.words(0, 8).unwrap();
                for r in 1..=rounds {
                    while rec[0].load(Ordering::Acquire) != 2 * r - 2 {
                        std::thread::yield_now();
                    }
                    for (i, w) in rec[1..].iter().enumerate() {
                        w.store(r * 10 + i as u64, Ordering::Relaxed);
                    }
                    rec[0].store(2 * r - 1, Ordering::Release);
                }
            });
            let rec = seg.words(0, 8).unwrap();
            for r in 1..=rounds {
                while rec[0].load(Ordering::Acquire) != 2 * r - 1 {
                    std::thread::yield_now();
                }
                for (i, w) in rec[1..].iter().enumerate() {
                    assert_eq!(w.load(Ordering::Relaxed), r * 10 + i as u64);
                }
                rec[0].store(2 * r, Ordering::Release);
            }
        });
    }

    #[test]
    fn names_are_checked() {
        assert!(segment_path("job", "a/b").is_err());
        assert!(segment_path("", "x").is_err());
        assert!(segment_path("j..", "x").is_err());
        assert_eq!(
            segment_path("j1", "sci-0").unwrap(),
            PathBuf::from("/dev/shm/am-j1-sci-0")
        );
    }

    #[cfg(not(miri))]
    #[test]
    fn create_open_unlink_and_stale_replace() {
        let job = format!("amshmtest{}", std::process::id());
        let stale = segment_path(&job, "s").unwrap();
        std::fs::write(&stale, b"stale junk").unwrap();
        let mut seg = Segment::create(&job, "s", 8, 4096).unwrap();
        assert_eq!(seg.words_len(), 64);
        let peer = Imported::open(&job, "s", 8, 4096).unwrap();
        assert!(
            Imported::open(&job, "s", 8, 4095).is_err(),
            "layout mismatch"
        );
        assert!(Imported::open("otherjob", "s", 8, 4096).is_err());
        seg.unlink().unwrap();
        assert!(!stale.exists());
        peer.write(4000, b"xyz").unwrap();
        peer.store_word(8, 7).unwrap();
        assert_eq!(seg.load_word(8).unwrap(), 7);
        assert_eq!(seg.bytes(4000, 3).unwrap(), b"xyz");
        let seg2 = Segment::create(&job, "t", 64, 10).unwrap();
        let p2 = segment_path(&job, "t").unwrap();
        assert!(p2.exists());
        drop(seg2);
        assert!(!p2.exists(), "the creator removes on drop");
    }
}
