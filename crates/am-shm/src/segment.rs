//! Segments: a word area (64-bit atomics, and 32-bit futex words on lines of their own)
//! followed by a byte area (reached only through [`SharedBytes`] views and copies).
//!
//! ```
//! use am_shm::Segment;
//! let seg = Segment::heap(64, 256).unwrap();
//! let peer = seg.import();
//! peer.write(10, b"hello").unwrap();
//! peer.store_word(0, 1).unwrap(); // publish after the data
//! assert_eq!(seg.load_word(0).unwrap(), 1);
//! let mut got = [0u8; 5];
//! seg.read(10, &mut got).unwrap();
//! assert_eq!(&got, b"hello");
//! ```

#[cfg(not(loom))]
use std::fs::OpenOptions;
#[cfg(not(loom))]
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::doorbell::{Doorbell, Rung};
use crate::mapping::{round_to_words, Mapping, WORD};
use crate::shared::SharedBytes;
use crate::spsc::SpscRing;
use crate::sync::{AtomicU64, Ordering};
use crate::ShmError;

/// Size of a cache line: flag words that different writers touch sit on separate lines.
pub const CACHE_LINE: usize = 64;

/// Where POSIX shared memory lives on Linux.
const SHM_DIR: &str = "/dev/shm";

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

/// The sizes of a segment: `words` bytes of word area (whole cache lines) and `bytes` bytes of
/// byte area, in a mapping of `len` bytes (the byte area rounded up to whole words). Computed
/// with checked arithmetic, in release builds too: a layout that overflows is an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sizes {
    words: usize,
    bytes: usize,
    len: usize,
}

impl Sizes {
    fn new(words: usize, bytes: usize) -> Result<Sizes, ShmError> {
        let too_large = || ShmError::TooLarge {
            len: words.saturating_add(bytes),
        };
        let lines = words.checked_add(CACHE_LINE - 1).ok_or_else(too_large)? / CACHE_LINE;
        let words = lines.checked_mul(CACHE_LINE).ok_or_else(too_large)?;
        let len = round_to_words(bytes)
            .and_then(|b| b.checked_add(words))
            .filter(|&len| len <= isize::MAX as usize)
            .ok_or_else(too_large)?;
        Ok(Sizes { words, bytes, len })
    }
}

/// The layout both sides agree on: `words` bytes of atomics, then `bytes` bytes of payload.
#[derive(Clone)]
struct View {
    map: Arc<Mapping>,
    words: usize,
    bytes: usize,
}

impl View {
    fn new(map: Mapping, sizes: Sizes) -> View {
        debug_assert!(sizes.len <= map.len());
        View {
            map: Arc::new(map),
            words: sizes.words,
            bytes: sizes.bytes,
        }
    }

    /// The atomic at byte `off` of the word area, checked for bounds and alignment.
    #[inline]
    fn word64(&self, off: usize) -> Result<&AtomicU64, ShmError> {
        if !off.is_multiple_of(WORD) || off.checked_add(WORD).is_none_or(|end| end > self.words) {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len: WORD,
                area: self.words,
            });
        }
        // SAFETY: `off + 8 <= words <= map.len()` and `off % 8 == 0`, as `word64` requires.
        Ok(unsafe { self.map.word64(off) })
    }

    /// `n` consecutive atomics from byte `off` of the word area, checked for bounds and
    /// alignment once for the whole run (a record of several words).
    #[inline]
    fn words64(&self, off: usize, n: usize) -> Result<&[AtomicU64], ShmError> {
        let end = n.checked_mul(WORD).and_then(|len| off.checked_add(len));
        if !off.is_multiple_of(WORD) || end.is_none_or(|end| end > self.words) {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len: n.saturating_mul(WORD),
                area: self.words,
            });
        }
        // SAFETY: `off + 8n <= words <= map.len()` and `off % 8 == 0`.
        Ok(unsafe { self.map.words64(off, n) })
    }

    /// The 32-bit atomic at byte `off` of the word area (futex words).
    #[inline]
    fn word32(&self, off: usize) -> Result<&crate::sync::AtomicU32, ShmError> {
        if !off.is_multiple_of(4) || off.checked_add(4).is_none_or(|end| end > self.words) {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len: 4,
                area: self.words,
            });
        }
        // SAFETY: in bounds and 4-aligned as checked. A location is used either as a u64 or
        // as a u32 word, never both: the NIC models give each doorbell its own cache line and
        // do not cover it with `word`/`words` (documented on `Segment::words`).
        Ok(unsafe { self.map.word32(off) })
    }

    /// The atomic at byte `off` of the *byte* area (a slot's flag word), checked for bounds
    /// and 8-alignment.
    #[inline]
    fn slot_word(&self, off: usize) -> Result<&AtomicU64, ShmError> {
        if !off.is_multiple_of(WORD) || off.checked_add(WORD).is_none_or(|end| end > self.bytes) {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len: WORD,
                area: self.bytes,
            });
        }
        // SAFETY: `words + off + 8 <= words + bytes <= map.len()`; 8-aligned (`words` is a
        // multiple of 64, `off % 8 == 0`). The byte area is accessed only through 64-bit
        // atomics on this same grid (`mapping` module docs).
        Ok(unsafe { self.map.word64(self.words + off) })
    }

    /// `[off, off + len)` of the byte area as a [`Slot`]: 8-aligned whole words, checked.
    #[inline]
    fn slot(&self, off: usize, len: usize) -> Result<Slot<'_>, ShmError> {
        if !off.is_multiple_of(WORD)
            || !len.is_multiple_of(WORD)
            || len == 0
            || off.checked_add(len).is_none_or(|end| end > self.bytes)
        {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len,
                area: self.bytes,
            });
        }
        Ok(Slot {
            map: &self.map,
            at: self.words + off,
            len,
        })
    }

    /// `[off, off + len)` of the byte area (`off` 8-aligned), checked, as the mapping and the
    /// run's offset in it: for a handle that keeps both and checks its accesses against the
    /// run alone ([`crate::stamp::SlotReader`], [`crate::stamp::SlotWriter`]).
    fn run(&self, off: usize, len: usize) -> Result<(Arc<Mapping>, usize), ShmError> {
        if !off.is_multiple_of(WORD) || off.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len,
                area: self.bytes,
            });
        }
        Ok((self.map.clone(), self.words + off))
    }

    /// The view of `[off, off + len)` of the byte area, checked.
    #[inline]
    fn bytes(&self, off: usize, len: usize) -> Result<SharedBytes<'_>, ShmError> {
        if off.checked_add(len).is_none_or(|end| end > self.bytes) {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len,
                area: self.bytes,
            });
        }
        Ok(SharedBytes::new(&self.map, self.words + off, len))
    }

    /// The whole byte area.
    #[inline]
    fn byte_area(&self) -> SharedBytes<'_> {
        SharedBytes::new(&self.map, self.words, self.bytes)
    }

    /// Stores the concatenation of `parts` at 8-aligned byte `off` of the byte area as whole
    /// words, zero-padded (see [`Imported::write_padded`]).
    #[inline]
    fn write_padded(&self, off: usize, parts: &[&[u8]]) -> Result<usize, ShmError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let padded = round_to_words(total);
        let fits = padded
            .and_then(|p| off.checked_add(p))
            .is_some_and(|end| end <= round_to_words(self.bytes).unwrap_or(0));
        if !off.is_multiple_of(WORD) || !fits {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len: total,
                area: self.bytes,
            });
        }
        // SAFETY: `self.words + off` is 8-aligned and the padded run ends within the byte
        // area rounded up to words, which the mapping covers (`Sizes`).
        Ok(unsafe { self.map.store_padded(self.words + off, parts) })
    }

    /// Stores `words` at 8-aligned byte `off` of the byte area, then `bytes` as whole words
    /// with the last one zero-padded (see [`Imported::write_words_padded`]).
    #[inline(always)]
    fn write_words_padded(
        &self,
        off: usize,
        words: &[u64],
        bytes: &[u8],
    ) -> Result<usize, ShmError> {
        let padded = round_to_words(bytes.len())
            .and_then(|b| words.len().checked_mul(WORD).and_then(|w| w.checked_add(b)));
        let fits = padded
            .and_then(|p| off.checked_add(p))
            .is_some_and(|end| end <= round_to_words(self.bytes).unwrap_or(0));
        if !off.is_multiple_of(WORD) || !fits {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len: padded.unwrap_or(usize::MAX),
                area: self.bytes,
            });
        }
        let mut a = self.words + off;
        let mut store = |w: u64| {
            // SAFETY: `a` is 8-aligned and below the end of the padded run, which lies within
            // the byte area rounded up to words (checked above), which the mapping covers
            // (`Sizes`); the byte area is accessed only through 64-bit atomics on this grid.
            unsafe { self.map.word64(a) }.store(w, Ordering::Relaxed);
            a += WORD;
        };
        for &w in words {
            store(w);
        }
        let mut chunks = bytes.chunks_exact(WORD);
        for c in chunks.by_ref() {
            store(u64::from_ne_bytes([
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7],
            ]));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; WORD];
            last[..rest.len()].copy_from_slice(rest);
            store(u64::from_ne_bytes(last));
        }
        Ok(padded.unwrap_or(0))
    }

    /// [`write_padded`](Self::write_padded) of `parts` followed by the shared bytes `tail`,
    /// which move straight from their mapping (see [`Imported::write_padded_then`]).
    fn write_padded_then(
        &self,
        off: usize,
        parts: &[&[u8]],
        tail: SharedBytes<'_>,
    ) -> Result<usize, ShmError> {
        let head: usize = parts.iter().map(|p| p.len()).sum();
        let total = head.checked_add(tail.len());
        let padded = total.and_then(round_to_words);
        let fits = padded
            .and_then(|p| off.checked_add(p))
            .is_some_and(|end| end <= round_to_words(self.bytes).unwrap_or(0));
        if !off.is_multiple_of(WORD) || !fits {
            return Err(ShmError::OutOfBounds {
                offset: off,
                len: total.unwrap_or(usize::MAX),
                area: self.bytes,
            });
        }
        let (src, from, n) = tail.raw();
        let at = self.words + off;
        let end = at + padded.unwrap_or(0);
        if std::ptr::eq(src, &*self.map) && at < from + n && from < end {
            // The tail lies where it is to be written: through a private copy.
            let copy = tail.to_vec();
            let mut all: Vec<&[u8]> = parts.to_vec();
            all.push(&copy);
            return self.write_padded(off, &all);
        }
        // SAFETY: `at` is 8-aligned, the padded run ends within the byte area rounded up to
        // words (checked above), the tail is inside its mapping (an invariant of
        // `SharedBytes`), and the two do not overlap (checked above).
        Ok(unsafe { self.map.store_padded_then(at, parts, src, from, n) })
    }
}

/// A run of whole words of a segment's byte area (a ring's or a channel's slot), checked
/// against the segment once when made ([`Segment::slot`], [`Imported::slot`]), so that its
/// words and stores need no further bounds check. Like every view it hands out atomics and
/// copies, never references to the bytes.
#[derive(Clone, Copy)]
pub struct Slot<'a> {
    map: &'a Mapping,
    /// Offset of its first byte in the mapping (8-aligned).
    at: usize,
    /// Its length in bytes (a positive multiple of 8).
    len: usize,
}

impl<'a> Slot<'a> {
    /// Its length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never: a slot has at least one word.
    #[inline]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Its last word (a ring slot's status word).
    #[inline]
    pub fn last_word(&self) -> &'a AtomicU64 {
        // SAFETY: `at + len <= words + bytes <= map.len()` (checked by `View::slot`), `len >= 8`
        // and both 8-aligned, so the last word lies inside the mapping on the 8-byte grid the
        // byte area is accessed on (`mapping` module docs).
        unsafe { self.map.word64(self.at + self.len - WORD) }
    }

    /// Stores the concatenation of `parts` from its start as whole words, zero-padded (see
    /// [`Imported::write_padded`]), if their padded length is at most `limit` (capped at the
    /// slot's length); returns the bytes stored.
    #[inline]
    pub fn store_padded(&self, limit: usize, parts: &[&[u8]]) -> Result<usize, ShmError> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if round_to_words(total).is_none_or(|p| p > limit.min(self.len)) {
            return Err(ShmError::OutOfBounds {
                offset: 0,
                len: total,
                area: limit.min(self.len),
            });
        }
        // SAFETY: `at` is 8-aligned and the padded run ends within the slot (checked just
        // above), which lies inside the mapping (checked by `View::slot`).
        Ok(unsafe { self.map.store_padded(self.at, parts) })
    }
}

/// What the mailbox's pre-checked handles ([`crate::mailbox::Port`], [`crate::mailbox::Inbox`])
/// need of a slot: made from offsets checked once, and the stores of a one-packet message.
impl<'a> Slot<'a> {
    /// The slot `[at, at + len)` of `map` (mapping offsets), not checked here.
    ///
    /// # Safety
    /// `at % 8 == 0`, `len % 8 == 0`, `len >= 8` and `at + len <= map.len()`: what
    /// `View::slot` checks.
    #[inline(always)]
    pub(crate) unsafe fn unchecked(map: &'a Mapping, at: usize, len: usize) -> Slot<'a> {
        debug_assert!(at.is_multiple_of(WORD) && len.is_multiple_of(WORD) && len >= WORD);
        debug_assert!(at + len <= map.len());
        Slot { map, at, len }
    }

    /// [`store_padded`](Self::store_padded) of `a` then `b` (a message head and a private
    /// payload), without building a list of parts. `None` (nothing stored) if their padded
    /// length passes `limit` or the slot: the caller says why.
    #[inline(always)]
    pub(crate) fn store_two(&self, limit: usize, a: &[u8], b: &[u8]) -> Option<usize> {
        // No overflow: both are slices in memory.
        let total = a.len() + b.len();
        if round_to_words(total).is_none_or(|p| p > limit.min(self.len)) {
            return None;
        }
        // SAFETY: `at` is 8-aligned and the padded run ends within the slot (checked just
        // above), which lies inside the mapping (an invariant of `Slot`).
        Some(unsafe { self.map.store_two_padded(self.at, a, b) })
    }

    /// [`store_padded`](Self::store_padded) of `parts` followed by the shared bytes `tail`
    /// (an echoed payload), which move straight from their mapping. `None` as for
    /// [`store_two`](Self::store_two).
    #[inline]
    pub(crate) fn store_padded_then(
        &self,
        limit: usize,
        parts: &[&[u8]],
        tail: SharedBytes<'_>,
    ) -> Option<usize> {
        let head: usize = parts.iter().map(|p| p.len()).sum();
        let padded = head.checked_add(tail.len()).and_then(round_to_words);
        if padded.is_none_or(|p| p > limit.min(self.len)) {
            return None;
        }
        let (src, from, n) = tail.raw();
        let end = self.at + padded.unwrap_or(0);
        if std::ptr::eq(src, self.map) && self.at < from + n && from < end {
            // The tail lies where it is to be written: through a private copy.
            let copy = tail.to_vec();
            let mut all: Vec<&[u8]> = parts.to_vec();
            all.push(&copy);
            return self.store_padded(limit, &all).ok();
        }
        // SAFETY: `at` is 8-aligned, the padded run ends within the slot (checked above),
        // which lies inside the mapping; the tail is inside its mapping (an invariant of
        // `SharedBytes`), and the two do not overlap (checked above).
        Some(unsafe { self.map.store_padded_then(self.at, parts, src, from, n) })
    }
}

impl std::fmt::Debug for Slot<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("at", &self.at)
            .field("len", &self.len)
            .finish()
    }
}

/// A run of 64-bit words of a segment's word area, checked for bounds and alignment once,
/// when made ([`Segment::word_run`]), that keeps the mapping alive: a NIC cuts the runs of a
/// peer's memory it reaches on every message once, at start-up, keeps them, and then reaches
/// their words with no check beyond a slice index (and no offset arithmetic). Like every
/// view it hands out atomics only.
///
/// ```
/// use am_shm::Segment;
/// let seg = Segment::heap(128, 0).unwrap();
/// seg.import().store_word(72, 5).unwrap();
/// let run = seg.word_run(64, 8).unwrap();
/// assert_eq!((run.load(1), run.load(8)), (Some(5), None));
/// ```
#[derive(Clone)]
pub struct WordRun {
    /// Keeps the memory mapped (and in place) as long as the run lives.
    _map: Arc<Mapping>,
    /// Its first word, in `_map` (from `Mapping::words64` on the checked run).
    first: std::ptr::NonNull<AtomicU64>,
    /// Byte offset of its first word in the mapping (8-aligned).
    at: usize,
    /// Its words.
    n: usize,
}

// SAFETY: a `WordRun` is an `Arc` to a mapping (which is `Send` and `Sync`: its memory is
// reached through atomics only) and a pointer into that mapping's memory, which it only turns
// into `&[AtomicU64]` (atomics are `Sync`); nothing in it is tied to a thread.
unsafe impl Send for WordRun {}
// SAFETY: as for `Send`: shared use only hands out shared references to atomics.
unsafe impl Sync for WordRun {}

impl WordRun {
    /// Its words.
    #[inline(always)]
    pub fn words(&self) -> &[AtomicU64] {
        // SAFETY: `first` points at `n` consecutive `AtomicU64`s inside the mapping: it came
        // from `words64` on a run checked by `View::words64` (`at % 8 == 0`, `at + 8 * n <=
        // words <= map.len()`) when the run was made (`Segment::word_run`). The mapping never
        // moves (a file mapping, or a boxed slice never reallocated) and stays alive as long
        // as `_map`, so as long as `&self`; every access to its words is atomic.
        unsafe { std::slice::from_raw_parts(self.first.as_ptr(), self.n) }
    }

    /// `Acquire` load of word `i`; `None` past the run.
    #[inline]
    pub fn load(&self, i: usize) -> Option<u64> {
        self.words().get(i).map(|w| w.load(Ordering::Acquire))
    }

    /// Its length in words.
    #[inline(always)]
    pub fn len(&self) -> usize {
        self.n
    }

    /// Whether it has no word.
    #[inline(always)]
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }
}

impl std::fmt::Debug for WordRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WordRun")
            .field("at", &self.at)
            .field("n", &self.n)
            .finish()
    }
}

/// A segment this process created (the SCI **exported** segment), or a full-access mapping
/// of a peer's ([`Segment::share`], [`crate::mailbox::attach`]): word atomics, copies in and
/// out, views of the byte area, and [`Imported`] write-only views for writers.
///
/// Created under `/dev/shm` by job id ([`Segment::create`]) or on the heap
/// ([`Segment::heap`]). The creator removes the file on drop, or earlier with
/// [`Segment::unlink`] once every peer has opened it (the mapping stays valid).
pub struct Segment {
    view: View,
    path: Option<PathBuf>,
    /// An anonymous segment's file (memfd), kept open so peers can open it through
    /// [`Segment::handle`] while this process lives.
    #[cfg(not(loom))]
    fd: Option<std::fs::File>,
}

impl Segment {
    /// Creates `/dev/shm/am-<job_id>-<name>` with a word area of `words` bytes (rounded up to
    /// whole cache lines) and a byte area of `bytes` bytes, all zero. A stale file of the same
    /// job and name is replaced.
    #[cfg(not(loom))]
    pub fn create(
        job_id: &str,
        name: &str,
        words: usize,
        bytes: usize,
    ) -> Result<Segment, ShmError> {
        let path = segment_path(job_id, name)?;
        let shown = path.display().to_string();
        let sizes = Sizes::new(words, bytes)?;
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
        let result = file
            .set_len(file_len(&sizes))
            .map_err(io("sizing"))
            .and_then(|()| Mapping::map(&file, sizes.len, &shown));
        match result {
            Ok(map) => Ok(Segment {
                view: View::new(map, sizes),
                path: Some(path),
                fd: None,
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }

    /// Maps an existing segment with full access (a NIC's view of a peer, or the raw floors).
    /// It does not own the file: dropping it does not remove it.
    #[cfg(not(loom))]
    pub(crate) fn attach(
        job_id: &str,
        name: &str,
        words: usize,
        bytes: usize,
    ) -> Result<Segment, ShmError> {
        Ok(Segment {
            view: Imported::open(job_id, name, words, bytes)?.view,
            path: None,
            fd: None,
        })
    }

    /// A segment on the heap with the same layout, for in-process use, Miri and loom. An error
    /// if the sizes overflow or cannot be allocated.
    pub fn heap(words: usize, bytes: usize) -> Result<Segment, ShmError> {
        let sizes = Sizes::new(words, bytes)?;
        Ok(Segment {
            view: View::new(Mapping::heap(sizes.len)?, sizes),
            path: None,
            #[cfg(not(loom))]
            fd: None,
        })
    }

    /// Another full-access handle to this segment's memory (what a peer's NIC maps), which
    /// does not own the file.
    pub fn share(&self) -> Segment {
        Segment {
            view: self.view.clone(),
            path: None,
            #[cfg(not(loom))]
            fd: None,
        }
    }

    /// Creates an anonymous segment (a `memfd`, named `name` for diagnostics only), all zero:
    /// no file in `/dev/shm` or anywhere, so nothing can outlive the processes that map it,
    /// whatever kills them. Peers map it through [`handle`](Self::handle) while this process
    /// is alive (as a job's ranks do during start-up). Its size is sealed: nobody can shrink
    /// it under a peer's mapping (whose accesses past the new end would fault), and
    /// [`Segment::open_handle`] maps only files sealed so.
    #[cfg(not(loom))]
    pub fn create_anonymous(name: &str, words: usize, bytes: usize) -> Result<Segment, ShmError> {
        use std::os::fd::FromRawFd;
        check_name(name)?;
        let sizes = Sizes::new(words, bytes)?;
        let io = |what| {
            move |source| ShmError::Io {
                what,
                path: format!("memfd {name}"),
                source,
            }
        };
        let cname = std::ffi::CString::new(name).map_err(|_| ShmError::BadName(name.into()))?;
        // SAFETY: `cname` is a valid NUL-terminated string for the duration of the call;
        // memfd_create reads only it.
        let fd = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(io("creating")(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by memfd_create, is open, and is owned by nobody else.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.set_len(file_len(&sizes)).map_err(io("sizing"))?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: `fd` is open (owned by `file`, alive here); F_ADD_SEALS takes an int and
        // touches no memory of ours.
        if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io("sealing")(std::io::Error::last_os_error()));
        }
        let map = Mapping::map(&file, sizes.len, &format!("memfd {name}"))?;
        Ok(Segment {
            view: View::new(map, sizes),
            path: None,
            fd: Some(file),
        })
    }

    /// Under loom there are no files: a heap segment, which has no handle.
    #[cfg(loom)]
    pub fn create_anonymous(name: &str, words: usize, bytes: usize) -> Result<Segment, ShmError> {
        check_name(name)?;
        Segment::heap(words, bytes)
    }

    /// Under loom there are no files: no handle.
    #[cfg(loom)]
    pub fn handle(&self) -> Option<String> {
        None
    }

    /// Under loom there are no files: always an error.
    #[cfg(loom)]
    pub fn open_handle(handle: &str, _words: usize, _bytes: usize) -> Result<Segment, ShmError> {
        Err(ShmError::BadName(handle.into()))
    }

    /// Under loom there are no files: always an error.
    #[cfg(loom)]
    pub fn open_handle_named(
        handle: &str,
        _name: &str,
        _words: usize,
        _bytes: usize,
    ) -> Result<Segment, ShmError> {
        Err(ShmError::BadName(handle.into()))
    }

    /// Where peers of this process open an anonymous segment: `/proc/<pid>/fd/<fd>`. `None`
    /// for other segments.
    #[cfg(not(loom))]
    pub fn handle(&self) -> Option<String> {
        use std::os::fd::AsRawFd;
        let fd = self.fd.as_ref()?.as_raw_fd();
        Some(format!("/proc/{}/fd/{fd}", std::process::id()))
    }

    /// Maps a peer's anonymous segment by its [`handle`](Self::handle) with full access (a
    /// NIC's view of its peer); it must have exactly this layout. The handle comes from a
    /// peer, so only `/proc/<pid>/fd/<fd>` is accepted.
    #[cfg(not(loom))]
    pub fn open_handle(handle: &str, words: usize, bytes: usize) -> Result<Segment, ShmError> {
        Ok(Segment {
            view: Imported::open_handle_as(handle, None, words, bytes)?.view,
            path: None,
            fd: None,
        })
    }

    /// As [`Segment::open_handle`], and only if the handle's file is the anonymous segment
    /// created as `name` ([`Segment::create_anonymous`]): a handle whose descriptor its
    /// process closed and reused for another file is refused ([`ShmError::BadSegment`]).
    #[cfg(not(loom))]
    pub fn open_handle_named(
        handle: &str,
        name: &str,
        words: usize,
        bytes: usize,
    ) -> Result<Segment, ShmError> {
        Ok(Segment {
            view: Imported::open_handle_as(handle, Some(name), words, bytes)?.view,
            path: None,
            fd: None,
        })
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

    /// The 32-bit word at byte offset `off` of the word area, for a futex (a location is
    /// accessed either as a 64-bit or as a 32-bit atomic, never both: give it its own line).
    #[inline]
    pub fn word32(&self, off: usize) -> Result<&crate::sync::AtomicU32, ShmError> {
        self.view.word32(off)
    }

    /// The `n` 64-bit words from byte offset `off` of the word area (a record of several
    /// words, e.g. one cache line), checked once for the whole run rather than per word.
    /// `off` must be 8-aligned. Do not cover a word used as a [`doorbell`](Self::doorbell)
    /// (a location is accessed either as a 64-bit or as a 32-bit atomic, never both).
    #[inline]
    pub fn words(&self, off: usize, n: usize) -> Result<&[AtomicU64], ShmError> {
        self.view.words64(off, n)
    }

    /// The `n` 64-bit words from byte offset `off` of the word area as a [`WordRun`]: checked
    /// here, once (as [`words`](Self::words) checks), and kept by the caller, which then
    /// reaches them with no further check. The same rule holds: do not cover a doorbell.
    pub fn word_run(&self, off: usize, n: usize) -> Result<WordRun, ShmError> {
        let first = std::ptr::NonNull::from(self.view.words64(off, n)?).cast::<AtomicU64>();
        Ok(WordRun {
            _map: Arc::clone(&self.view.map),
            first,
            at: off,
            n,
        })
    }

    /// `Acquire` load of the word at `off`: what a reader does before reading the data it
    /// publishes.
    #[inline]
    pub fn load_word(&self, off: usize) -> Result<u64, ShmError> {
        Ok(self.view.word64(off)?.load(Ordering::Acquire))
    }

    /// `SeqCst` swap of the word at `off` with 0: takes the bits peers set with
    /// [`Imported::fetch_or_word`], each exactly once.
    #[inline]
    pub fn take_word(&self, off: usize) -> Result<u64, ShmError> {
        Ok(self.view.word64(off)?.swap(0, Ordering::SeqCst))
    }

    /// See `View::run`.
    pub(crate) fn run(&self, off: usize, len: usize) -> Result<(Arc<Mapping>, usize), ShmError> {
        self.view.run(off, len)
    }

    /// `[off, off + len)` of the byte area (8-aligned, whole words) as a [`Slot`], checked
    /// once here: a ring slot whose status word and payload a hot path reaches several times.
    #[inline]
    pub fn slot(&self, off: usize, len: usize) -> Result<Slot<'_>, ShmError> {
        self.view.slot(off, len)
    }

    /// The ring `[at, at + len)` of the byte area (`at` and `len` multiples of 8, `len` at
    /// least two words) with its reader's head word at byte `head` and futex word at byte
    /// `sleeper` of the word area, checked once here, as an [`SpscRing`]. The futex word must
    /// not lie in the head word's 8 bytes, and is never to be accessed at another size.
    pub fn spsc_ring(
        &self,
        at: usize,
        len: usize,
        head: usize,
        sleeper: usize,
    ) -> Result<SpscRing, ShmError> {
        let bytes = self.view.slot(at, len)?;
        self.view.word64(head)?;
        self.view.word32(sleeper)?;
        if len < 2 * WORD || sleeper / WORD == head / WORD {
            return Err(ShmError::OutOfBounds {
                offset: at,
                len,
                area: self.view.bytes,
            });
        }
        Ok(SpscRing::new(
            self.view.map.clone(),
            bytes.at,
            len,
            head,
            sleeper,
        ))
    }

    /// The 64-bit word at 8-aligned byte offset `off` of the *byte* area (a slot's flag word,
    /// see [`crate::stamp`]).
    #[inline]
    pub fn slot_word(&self, off: usize) -> Result<&AtomicU64, ShmError> {
        self.view.slot_word(off)
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
        self.view.bytes(off, dst.len())?.read(0, dst)
    }

    /// The view of `[off, off + len)` of the byte area. Peers may write those bytes at any
    /// time: the view copies, it never lends references.
    #[inline]
    pub fn view(&self, off: usize, len: usize) -> Result<SharedBytes<'_>, ShmError> {
        self.view.bytes(off, len)
    }

    /// The view of the whole byte area.
    #[inline]
    pub fn byte_area(&self) -> SharedBytes<'_> {
        self.view.byte_area()
    }

    /// The word area and the byte area together, as one view from the word area's first
    /// byte (the memory a NIC registers for peers to reach both: the byte area starts
    /// [`Segment::words_len`] bytes in). Peers may write it at any time, as the byte area.
    #[inline]
    pub fn whole_area(&self) -> SharedBytes<'_> {
        SharedBytes::new(&self.view.map, 0, self.view.words + self.view.bytes)
    }

    /// Plain copy into the byte area for the raw copy floor, whose byte area is written by one
    /// thread and read by no one.
    #[cfg(not(loom))]
    pub(crate) fn raw_write_unshared(&self, off: usize, src: &[u8]) -> Result<(), ShmError> {
        self.view.bytes(off, src.len())?;
        // SAFETY: in bounds (checked just above); the floor's caller is the only accessor of
        // these bytes (only the stamp and ack words are shared in `floor::copy_on`).
        unsafe { self.view.map.raw_copy_in(self.view.words + off, src) };
        Ok(())
    }
}

/// The file length of a segment of these sizes (at least one word, as mmap needs).
#[cfg(not(loom))]
fn file_len(sizes: &Sizes) -> u64 {
    sizes.len.max(WORD) as u64
}

/// For the mailbox's pre-checked handles, which check offsets against a segment once.
impl Segment {
    /// The mapping behind this segment.
    #[inline(always)]
    pub(crate) fn mapping(&self) -> &Mapping {
        &self.view.map
    }

    /// Where the byte area starts in the mapping (the word area starts at 0).
    #[inline(always)]
    pub(crate) fn byte_base(&self) -> usize {
        self.view.words
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

/// Whether nobody can shrink `file` any more (a peer's memfd sealed by
/// [`Segment::create_anonymous`]): a mapping of it never faults for want of pages.
#[cfg(not(loom))]
fn sealed_against_shrinking(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: the descriptor is open (owned by `file`, borrowed for the call); F_GET_SEALS
    // reads no memory of ours.
    let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
    seals >= 0 && seals & libc::F_SEAL_SHRINK != 0
}

/// A peer's segment mapped here (the SCI **imported** segment): word stores, doorbell rings
/// and byte copies, and, through [`Imported::byte_area`], the reads and atomics of one-sided
/// gets and remote atomics (what a NIC reaches of a peer's memory without its help).
#[derive(Clone)]
pub struct Imported {
    view: View,
}

impl Imported {
    /// Opens segment `name` of job `job_id`, which must have exactly this layout (`words` is
    /// rounded up to whole cache lines, as at creation).
    #[cfg(not(loom))]
    pub fn open(
        job_id: &str,
        name: &str,
        words: usize,
        bytes: usize,
    ) -> Result<Imported, ShmError> {
        let path = segment_path(job_id, name)?;
        let shown = path.display().to_string();
        let sizes = Sizes::new(words, bytes)?;
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
        if meta.len() != file_len(&sizes) {
            return Err(ShmError::BadSegment(shown));
        }
        Ok(Imported {
            view: View::new(Mapping::map(&file, sizes.len, &shown)?, sizes),
        })
    }

    /// Opens a peer's anonymous segment by its handle (see [`Segment::open_handle`]), for
    /// writing only.
    #[cfg(not(loom))]
    pub fn open_handle(handle: &str, words: usize, bytes: usize) -> Result<Imported, ShmError> {
        Self::open_handle_as(handle, None, words, bytes)
    }

    /// [`Imported::open_handle`], checking, where `name` is given, that the file opened is
    /// the anonymous segment of that name (its `/proc/self/fd` link, read after opening, so
    /// that no reuse of the peer's descriptor can come in between).
    #[cfg(not(loom))]
    fn open_handle_as(
        handle: &str,
        name: Option<&str>,
        words: usize,
        bytes: usize,
    ) -> Result<Imported, ShmError> {
        let valid = handle
            .strip_prefix("/proc/")
            .and_then(|r| r.split_once("/fd/"))
            .is_some_and(|(pid, fd)| {
                [pid, fd].iter().all(|n| {
                    !n.is_empty() && n.len() <= 10 && n.bytes().all(|b| b.is_ascii_digit())
                })
            });
        if !valid {
            return Err(ShmError::BadName(handle.into()));
        }
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        let sizes = Sizes::new(words, bytes)?;
        let io = |what| {
            move |source| ShmError::Io {
                what,
                path: handle.into(),
                source,
            }
        };
        // The handle comes from a peer and may name anything: first a path descriptor,
        // which opens nothing (no terminal, FIFO or device open, which could block or act),
        // then, once it is seen to be a regular file, the file itself through it.
        let path = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH)
            .open(handle)
            .map_err(io("opening"))?;
        if !path.metadata().map_err(io("stat"))?.is_file() {
            return Err(ShmError::BadSegment(handle.into()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", path.as_raw_fd()))
            .map_err(io("opening"))?;
        let meta = file.metadata().map_err(io("stat"))?;
        if !meta.is_file() || meta.len() != file_len(&sizes) || !sealed_against_shrinking(&file) {
            return Err(ShmError::BadSegment(handle.into()));
        }
        if let Some(name) = name {
            let link = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
                .map_err(io("reading the link of"))?;
            let memfd = format!("/memfd:{name}");
            let link = link.to_string_lossy();
            if link != memfd && link != format!("{memfd} (deleted)") {
                return Err(ShmError::BadSegment(handle.into()));
            }
        }
        Ok(Imported {
            view: View::new(Mapping::map(&file, sizes.len, handle)?, sizes),
        })
    }

    /// Size of the byte area.
    pub fn bytes_len(&self) -> usize {
        self.view.bytes
    }

    /// The view of the whole byte area (a peer's segment: for one-sided gets and remote
    /// atomics on its words).
    #[inline]
    pub fn byte_area(&self) -> SharedBytes<'_> {
        self.view.byte_area()
    }

    /// `Release` store to the word at `off`: publishes everything written before it.
    #[inline]
    pub fn store_word(&self, off: usize, value: u64) -> Result<(), ShmError> {
        self.view.word64(off)?.store(value, Ordering::Release);
        Ok(())
    }

    /// `SeqCst` `fetch_or` of `bits` into the word at `off` (an SCI lock transaction, which
    /// the owner's memory performs); the word's value before it.
    #[inline]
    pub fn fetch_or_word(&self, off: usize, bits: u64) -> Result<u64, ShmError> {
        Ok(self.view.word64(off)?.fetch_or(bits, Ordering::SeqCst))
    }

    /// See `View::run`.
    pub(crate) fn run(&self, off: usize, len: usize) -> Result<(Arc<Mapping>, usize), ShmError> {
        self.view.run(off, len)
    }

    /// `[off, off + len)` of the byte area as a [`Slot`] (see [`Segment::slot`]).
    #[inline]
    pub fn slot(&self, off: usize, len: usize) -> Result<Slot<'_>, ShmError> {
        self.view.slot(off, len)
    }

    /// Asks the CPU to own the cache line of byte `off` of the byte area before this process
    /// writes it (`prefetchw`): for a slot the owner has finished reading and the writer will
    /// fill next, so that its stores, and a fence after them, do not wait for the owner's core.
    /// A hint: nothing is read or written, and nothing happens for an `off` outside the area.
    #[inline(always)]
    pub fn prefetch_for_write(&self, off: usize) {
        if off < self.view.bytes {
            self.view.map.prefetch_for_write(self.view.words + off);
        }
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
    pub fn ring(&self, off: usize) -> Result<Rung, ShmError> {
        Ok(Doorbell::new(self.view.word32(off)?).ring())
    }

    /// Rings the doorbell at `off` leaving `tag` (see [`Doorbell::ring_tagged`]).
    #[inline]
    pub fn ring_tagged(&self, off: usize, tag: u32) -> Result<Rung, ShmError> {
        Ok(Doorbell::new(self.view.word32(off)?).ring_tagged(tag))
    }

    /// Copies `src` to `[off, off + src.len())` of the byte area (word-wise atomic stores; a
    /// partial word at either end is merged, keeping its other bytes).
    #[inline]
    pub fn write(&self, off: usize, src: &[u8]) -> Result<(), ShmError> {
        self.view.bytes(off, src.len())?.write(0, src)
    }

    /// Copies the concatenation of `parts` to 8-aligned byte `off` of the byte area as whole
    /// words, padding the last one with zeros; returns the bytes written (the total rounded up
    /// to 8). For a writer that owns the words it pads (a slot it claimed): no read-modify-write
    /// at all. The padded length must fit in the byte area (rounded up to a word).
    #[inline]
    pub fn write_padded(&self, off: usize, parts: &[&[u8]]) -> Result<usize, ShmError> {
        self.view.write_padded(off, parts)
    }

    /// [`write_padded`](Self::write_padded) of a few words: `words` (stored as they are, each
    /// as one atomic store, so its bytes land in this machine's byte order) and then `bytes`,
    /// the last word zero-padded; returns the bytes written. For a slot header and a message
    /// head: no gathering of parts, one bounds check.
    #[inline(always)]
    pub fn write_words_padded(
        &self,
        off: usize,
        words: &[u64],
        bytes: &[u8],
    ) -> Result<usize, ShmError> {
        self.view.write_words_padded(off, words, bytes)
    }

    /// [`write_padded`](Self::write_padded) of `parts` followed by the shared bytes `tail`
    /// (a received payload being echoed or forwarded): the tail moves straight from its
    /// mapping into this one, with no private copy in between.
    #[inline]
    pub fn write_padded_then(
        &self,
        off: usize,
        parts: &[&[u8]],
        tail: SharedBytes<'_>,
    ) -> Result<usize, ShmError> {
        self.view.write_padded_then(off, parts, tail)
    }

    /// Copies the view `src` (typically of this rank's own segment) to `[off, off +
    /// src.len())` of the byte area: an engine's put between registered regions.
    pub fn write_from(&self, off: usize, src: SharedBytes<'_>) -> Result<(), ShmError> {
        self.view.bytes(off, src.len())?.copy_from(0, src)
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A word run is checked when made, reaches the same words as the segment, and keeps the
    /// memory alive after the segment is gone.
    #[test]
    fn word_runs_are_checked_once_and_outlive_the_segment() {
        let seg = Segment::heap(128, 16).unwrap();
        assert!(seg.word_run(0, 16).is_ok());
        assert!(seg.word_run(8, 16).is_err(), "past the word area");
        assert!(seg.word_run(4, 1).is_err(), "misaligned");
        assert!(seg.word_run(usize::MAX - 7, 1).is_err());
        assert!(seg.word_run(0, usize::MAX / 4).is_err(), "overflow");
        let run = seg.word_run(64, 8).unwrap();
        assert_eq!((run.len(), run.is_empty()), (8, false));
        assert!(seg.word_run(128, 0).unwrap().is_empty());
        run.words()[3].store(7, Ordering::Release);
        assert_eq!(seg.load_word(64 + 24).unwrap(), 7);
        seg.word(64 + 56).unwrap().store(9, Ordering::Release);
        drop(seg);
        assert_eq!(run.words()[7].load(Ordering::Acquire), 9);
        assert_eq!(run.clone().words()[3].load(Ordering::Acquire), 7);
        // Sent to another thread (the last holder of the mapping while it runs).
        let moved = run.clone();
        drop(run);
        std::thread::spawn(move || moved.words()[0].store(5, Ordering::Release))
            .join()
            .unwrap();
    }

    #[test]
    fn bits_peers_set_are_taken_once() {
        let seg = Segment::heap(128, 0).unwrap();
        let (a, b) = (seg.import(), seg.import());
        assert_eq!(a.fetch_or_word(64, 1 << 3).unwrap(), 0);
        assert_eq!(b.fetch_or_word(64, 1 << 60).unwrap(), 1 << 3);
        assert_eq!(seg.take_word(64).unwrap(), 1 << 3 | 1 << 60);
        assert_eq!(seg.take_word(64).unwrap(), 0);
        assert!(a.fetch_or_word(60, 1).is_err(), "unaligned");
        assert!(a.fetch_or_word(128, 1).is_err(), "past the word area");
        assert!(seg.take_word(124).is_err());
    }

    #[test]
    fn bounds_and_alignment_are_errors() {
        let seg = Segment::heap(64, 100).unwrap();
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
        assert!(seg.view(0, 101).is_err());
        assert!(seg.view(usize::MAX, 2).is_err());
        assert!(seg.slot_word(88).is_ok());
        assert!(
            seg.slot_word(96).is_err(),
            "the word holds bytes past the area"
        );
        assert!(seg.slot_word(4).is_err());
        let mut b = [0u8; 1];
        seg.read(99, &mut b).unwrap();
        assert_eq!(b, [1]);
    }

    /// Sizes are checked in release builds too: a layout that overflows is an error, never a
    /// small mapping with a huge byte area.
    #[test]
    fn overflowing_layouts_are_errors() {
        assert!(matches!(
            Segment::heap(64, usize::MAX - 10),
            Err(ShmError::TooLarge { .. })
        ));
        assert!(Segment::heap(usize::MAX - 10, 64).is_err());
        assert!(Segment::heap(usize::MAX / 2, usize::MAX / 2).is_err());
        assert!(Sizes::new(0, isize::MAX as usize).is_err());
        let s = Sizes::new(65, 9).unwrap();
        assert_eq!((s.words, s.bytes, s.len), (128, 9, 144));
    }

    #[test]
    fn padded_writes_fill_whole_words() {
        let seg = Segment::heap(0, 40).unwrap();
        let imp = seg.import();
        seg.byte_area().fill(0, 40, 0xEE).unwrap();
        assert_eq!(
            imp.write_padded(8, &[b"abc", b"", b"defgh", b"ij"])
                .unwrap(),
            16
        );
        let all = seg.byte_area().to_vec();
        assert_eq!(&all[8..18], b"abcdefghij");
        assert_eq!(&all[18..24], &[0; 6], "the last word is padded with zeros");
        assert!(all[..8].iter().chain(&all[24..]).all(|&b| b == 0xEE));
        assert_eq!(imp.write_padded(32, &[&[1; 8]]).unwrap(), 8);
        assert!(imp.write_padded(4, &[b"x"]).is_err(), "misaligned");
        assert!(imp.write_padded(40, &[b"x"]).is_err(), "past the end");
        assert_eq!(imp.write_padded(40, &[]).unwrap(), 0);
        // A byte area that is not whole words: its last word is still the segment's own.
        let odd = Segment::heap(0, 13).unwrap();
        assert_eq!(odd.import().write_padded(8, &[b"12345"]).unwrap(), 8);
        assert!(odd.import().write_padded(8, &[b"123456789"]).is_err());
    }

    /// A message in one part (a head), or in one and an empty one, takes the path that stores
    /// its words straight: every length lands whole, padded with zeros, nothing after it
    /// touched; and words then bytes land in that order.
    #[test]
    fn one_part_and_word_writes_land_whole_and_padded() {
        let seg = Segment::heap(0, 256).unwrap();
        let imp = seg.import();
        // Under Miri every remainder mod 8 with zero to three whole words before it.
        for total in 0..=if cfg!(miri) { 31 } else { 80usize } {
            let msg: Vec<u8> = (0..total).map(|i| (i * 13 + 1) as u8).collect();
            let padded = total.div_ceil(8) * 8;
            let words = [0x0102_0304_0506_0708u64, u64::MAX - 5];
            for how in 0..4 {
                seg.byte_area().fill(0, 256, 0xEE).unwrap();
                let (n, lead) = match how {
                    0 => (imp.write_padded(16, &[&msg]).unwrap(), 0),
                    1 => (imp.write_padded(16, &[&msg, &[]]).unwrap(), 0),
                    2 => (imp.write_words_padded(16, &[], &msg).unwrap(), 0),
                    _ => (imp.write_words_padded(16, &words, &msg).unwrap(), 16),
                };
                assert_eq!(n, lead + padded, "{total} bytes, way {how}");
                let all = seg.byte_area().to_vec();
                for (k, w) in words.iter().enumerate().take(lead / 8) {
                    assert_eq!(all[16 + 8 * k..24 + 8 * k], w.to_ne_bytes(), "word {k}");
                }
                let at = 16 + lead;
                assert_eq!(&all[at..at + total], &msg[..], "{total} bytes, way {how}");
                assert!(all[at + total..at + padded].iter().all(|&b| b == 0), "pad");
                assert!(
                    all[..16]
                        .iter()
                        .chain(&all[at + padded..])
                        .all(|&b| b == 0xEE),
                    "{total} bytes, way {how}: nothing else touched"
                );
            }
        }
        assert!(imp.write_words_padded(4, &[1], &[]).is_err(), "misaligned");
        assert!(
            imp.write_words_padded(248, &[1], b"x").is_err(),
            "past the end"
        );
        assert!(
            imp.write_words_padded(256, &[], b"").is_ok(),
            "nothing, at the end"
        );
        assert!(
            imp.write_words_padded(0, &[0; 33], &[]).is_err(),
            "too many words"
        );
        // A byte area that is not whole words: its last word is still the segment's own.
        let odd = Segment::heap(0, 13).unwrap();
        assert_eq!(
            odd.import().write_words_padded(8, &[], b"12345").unwrap(),
            8
        );
        assert!(odd.import().write_words_padded(8, &[7], b"").is_ok());
        assert!(odd.import().write_words_padded(8, &[7], b"1").is_err());
    }

    /// A write-intent prefetch is a hint: at any offset, in the area or past it, it changes
    /// no byte and fails nothing.
    #[test]
    fn a_prefetch_for_write_changes_nothing() {
        let seg = Segment::heap(64, 200).unwrap();
        let imp = seg.import();
        seg.byte_area().fill(0, 200, 0xA5).unwrap();
        for off in [0, 1, 63, 64, 199, 200, 4096, usize::MAX] {
            imp.prefetch_for_write(off);
        }
        assert!(seg.byte_area().to_vec().iter().all(|&b| b == 0xA5));
    }

    /// Every split of a message into parts, short or longer than a line or the gather
    /// chunk, lands as the concatenation and a zero pad, and nothing past it is touched.
    #[test]
    fn padded_writes_of_any_split_and_size() {
        // Under Miri every copy takes the word loop, whatever its size: 1,000 and 5,000
        // bytes (past the bulk copy's threshold natively) reach no path there that 300 (past
        // every cut) do not, and filling and reading back the segment is most of its time.
        let (size, totals): (usize, &[usize]) = if cfg!(miri) {
            (512, &[0, 1, 7, 8, 9, 63, 64, 65, 300])
        } else {
            (
                8192,
                &[0, 1, 7, 8, 9, 63, 64, 65, 255, 256, 257, 1000, 5000],
            )
        };
        let seg = Segment::heap(0, size).unwrap();
        let imp = seg.import();
        for &total in totals {
            let msg: Vec<u8> = (0..total).map(|i| (i * 31 + 7) as u8).collect();
            for cut in [0, 1, 5, 8, 13, 300].map(|c: usize| c.min(total)) {
                let cut2 = (cut + 259).min(total);
                seg.byte_area().fill(0, size, 0xEE).unwrap();
                let parts: [&[u8]; 3] = [&msg[..cut], &msg[cut..cut2], &msg[cut2..]];
                let padded = imp.write_padded(64, &parts).unwrap();
                assert_eq!(
                    padded,
                    total.div_ceil(8) * 8,
                    "{total} split at {cut}/{cut2}"
                );
                let all = seg.byte_area().to_vec();
                assert_eq!(
                    &all[64..64 + total],
                    &msg[..],
                    "{total} split at {cut}/{cut2}"
                );
                assert!(all[64 + total..64 + padded].iter().all(|&b| b == 0));
                assert!(all[..64]
                    .iter()
                    .chain(&all[64 + padded..])
                    .all(|&b| b == 0xEE));
            }
        }
    }

    /// A head and a shared tail (from another segment at any alignment, short or past the
    /// bulk-copy threshold) land as the concatenation and a zero pad, as `write_padded` of
    /// the same bytes would put them; a tail that lies where it is written goes through a
    /// copy; a run that does not fit is refused.
    #[test]
    fn padded_writes_with_a_shared_tail() {
        let (size, heads, tails, aligns): (usize, &[usize], &[usize], &[usize]) = if cfg!(miri) {
            (192, &[0, 3, 8], &[0, 5, 17, 40], &[0, 3])
        } else {
            (
                4096,
                &[0, 1, 3, 8, 12, 16],
                &[0, 1, 5, 8, 17, 255, 256, 300, 1500],
                &[0, 1, 3, 7],
            )
        };
        let seg = Segment::heap(0, size).unwrap();
        let src = Segment::heap(0, size).unwrap();
        let imp = seg.import();
        let data: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
        src.byte_area().write(0, &data).unwrap();
        for &h in heads {
            let head: Vec<u8> = (0..h).map(|i| 0xA0 ^ i as u8).collect();
            for &n in tails {
                for &from in aligns {
                    seg.byte_area().fill(0, size, 0xEE).unwrap();
                    let tail = src.byte_area().slice(from, n).unwrap();
                    let padded = imp
                        .write_padded_then(64, &[&head[..h / 2], &head[h / 2..]], tail)
                        .unwrap();
                    let total = h + n;
                    assert_eq!(padded, total.div_ceil(8) * 8, "head {h} tail {n} at {from}");
                    let all = seg.byte_area().to_vec();
                    let mut want = head.clone();
                    want.extend_from_slice(&data[from..from + n]);
                    assert_eq!(
                        &all[64..64 + total],
                        &want[..],
                        "head {h} tail {n} at {from}"
                    );
                    assert!(all[64 + total..64 + padded].iter().all(|&b| b == 0));
                    assert!(all[..64]
                        .iter()
                        .chain(&all[64 + padded..])
                        .all(|&b| b == 0xEE));
                }
            }
        }
        // The tail inside the run it is written to: the bytes as they were before.
        seg.byte_area().write(0, &data).unwrap();
        let tail = seg.byte_area().slice(70, 33).unwrap();
        assert_eq!(imp.write_padded_then(64, &[b"abc"], tail).unwrap(), 40);
        let all = seg.byte_area().to_vec();
        assert_eq!(&all[64..67], b"abc");
        assert_eq!(&all[67..100], &data[70..103]);
        assert!(imp
            .write_padded_then(size - 8, &[b"abc"], src.byte_area().slice(0, 6).unwrap())
            .is_err());
        assert!(imp
            .write_padded_then(4, &[], src.byte_area().slice(0, 6).unwrap())
            .is_err());
    }

    #[test]
    fn word_runs_are_checked_once_and_alias_single_words() {
        let seg = Segment::heap(128, 0).unwrap();
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

    /// A word run is checked once when made; its loads are the words `load_word` reads, and
    /// an index past it is `None`.
    #[test]
    fn word_runs_are_checked_once_and_load_by_index() {
        let seg = Segment::heap(128, 0).unwrap();
        let run = seg.word_run(64, 8).unwrap();
        assert_eq!((run.len(), run.is_empty()), (8, false));
        for i in 0..8 {
            seg.import().store_word(64 + 8 * i, 100 + i as u64).unwrap();
        }
        for i in 0..8 {
            assert_eq!(run.load(i), Some(100 + i as u64));
            assert_eq!(run.load(i), Some(seg.load_word(64 + 8 * i).unwrap()));
        }
        for i in [8, 9, usize::MAX / 8 + 1, usize::MAX] {
            assert_eq!(run.load(i), None);
        }
        assert!(seg.word_run(0, 0).unwrap().is_empty());
        assert_eq!(seg.word_run(128, 0).unwrap().load(0), None);
        assert!(seg.word_run(8, 16).is_err(), "past the word area");
        assert!(seg.word_run(4, 1).is_err(), "misaligned");
        assert!(seg.word_run(0, usize::MAX / 4).is_err(), "length overflow");
        assert!(seg.word_run(usize::MAX - 7, 1).is_err(), "offset overflow");
        // A run outlives the segment handle it came from: it keeps the memory mapped.
        drop(seg);
        assert_eq!(run.load(7), Some(107));
    }

    /// A record published through a run: the reader's `Acquire` load of the stamp makes the
    /// writer's earlier `Relaxed` stores to the other words visible (Miri checks the races).
    #[test]
    fn word_run_record_hand_over_between_threads() {
        let seg = Segment::heap(64, 0).unwrap();
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

    /// An anonymous segment leaves no file anywhere, and a peer maps it by its handle
    /// (here the same process stands in for the peer).
    #[cfg(not(miri))]
    #[test]
    fn anonymous_segments_are_shared_by_handle() {
        let seg = Segment::create_anonymous("amshmanon", 64, 100).unwrap();
        let handle = seg.handle().unwrap();
        assert!(handle.starts_with("/proc/"), "{handle}");
        let peer = Segment::open_handle(&handle, 64, 100).unwrap();
        peer.import().write(90, b"from the peer").unwrap_err();
        peer.import().write(80, b"from the peer").unwrap();
        assert_eq!(seg.view(80, 13).unwrap().to_vec(), b"from the peer");
        assert!(
            Segment::open_handle(&handle, 64, 200).is_err(),
            "layout mismatch"
        );
        for bad in [
            "/etc/passwd",
            "/proc/1/fd/",
            "/proc/x/fd/3",
            "/proc/1/fd/3/../../x",
        ] {
            assert!(
                matches!(
                    Segment::open_handle(bad, 64, 100),
                    Err(ShmError::BadName(_))
                ),
                "{bad}"
            );
        }
        assert!(Segment::heap(64, 8).unwrap().handle().is_none());
        // By name: the file must be the segment created under that name.
        let named = Segment::open_handle_named(&handle, "amshmanon", 64, 100).unwrap();
        named.import().write(0, b"x").unwrap();
        assert!(matches!(
            Segment::open_handle_named(&handle, "amshmother", 64, 100),
            Err(ShmError::BadSegment(_))
        ));
        // A file of the right size that its owner could still shrink under the mapping
        // (whose accesses past the new end would fault) is refused.
        let path = std::env::temp_dir().join(format!("amshmunsealed{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        file.set_len(std::fs::metadata(&handle).unwrap().len())
            .unwrap();
        let unsealed = {
            use std::os::fd::AsRawFd;
            format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd())
        };
        assert!(
            matches!(
                Segment::open_handle(&unsealed, 64, 100),
                Err(ShmError::BadSegment(_))
            ),
            "an unsealed file"
        );
        let leftover = std::fs::read_dir("/dev/shm")
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| e.file_name().to_string_lossy().contains("amshmanon"));
        assert!(!leftover);
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
            Imported::open(&job, "s", 8, 4088).is_err(),
            "layout mismatch"
        );
        assert!(Imported::open("otherjob", "s", 8, 4096).is_err());
        seg.unlink().unwrap();
        assert!(!stale.exists());
        peer.write(4000, b"xyz").unwrap();
        peer.store_word(8, 7).unwrap();
        assert_eq!(seg.load_word(8).unwrap(), 7);
        assert_eq!(seg.view(4000, 3).unwrap().to_vec(), b"xyz");
        let seg2 = Segment::create(&job, "t", 64, 10).unwrap();
        let p2 = segment_path(&job, "t").unwrap();
        assert!(p2.exists());
        drop(seg2);
        assert!(!p2.exists(), "the creator removes on drop");
    }
}
