//! The memory behind a segment, and the only code that turns its addresses into atomics.
//!
//! Every byte of a mapping is accessed through 8-byte atomics on the aligned words that hold
//! it ("the word grid"), except the 32-bit futex words of a segment's word area, which are
//! never accessed at any other size. Bulk copies move whole words (C++ P1478's byte-wise
//! atomic memcpy, a word at a time); a copy that starts or ends inside a word reads that
//! whole word, or merges its bytes into it with a compare-and-swap, so no location is ever
//! written non-atomically in part, whatever a peer writes at the same time. On x86-64 the
//! whole words of a bulk copy move by 16-byte volatile moves, 32-byte AVX moves in assembly
//! from 64 bytes, or `rep movsb` from 4 KiB, which the compiler treats as opaquely as atomics
//! and the hardware performs word by word (8-byte atomic moves are half as fast); Miri and
//! loom check the atomic loop that does the same elsewhere. Ordering comes from the protocols' own `Release` stores and `Acquire`
//! loads of their flag words.
//!
//! Under `cfg(loom)` a mapping is an array of loom atomics (one per 8-byte word, and one per
//! 4-byte futex word), so the loom models run the same copy code.

#[cfg(not(loom))]
use std::ptr::NonNull;

use crate::sync::{AtomicU32, AtomicU64, Ordering};
use crate::ShmError;

/// Bytes of a word of the grid.
pub(crate) const WORD: usize = 8;

/// Rounds `n` up to whole words, `None` on overflow.
pub(crate) fn round_to_words(n: usize) -> Option<usize> {
    n.checked_add(WORD - 1).map(|n| n / WORD * WORD)
}

/// Whether this CPU has `prefetchw` (the PRFCHW feature; AMD's 3DNow! prefetch bit says the
/// same): 0 not asked yet, 1 no, 2 yes. A plain atomic rather than a `LazyLock`, so the hot
/// path is one load and a compare.
#[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
static PREFETCHW: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

#[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
#[inline(always)]
fn has_prefetchw() -> bool {
    match PREFETCHW.load(std::sync::atomic::Ordering::Relaxed) {
        0 => ask_prefetchw(),
        known => known == 2,
    }
}

#[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
#[cold]
#[inline(never)]
fn ask_prefetchw() -> bool {
    use std::arch::x86_64::__cpuid;
    // SAFETY: every x86-64 CPU has `cpuid`, and leaf 0x8000_0000 (the highest extended
    // leaf) exists on all of them; 0x8000_0001 is asked only if it says that one exists.
    #[allow(unused_unsafe)]
    let has = unsafe {
        __cpuid(0x8000_0000).eax >= 0x8000_0001 && __cpuid(0x8000_0001).ecx & (1 << 8) != 0
    };
    PREFETCHW.store(
        if has { 2 } else { 1 },
        std::sync::atomic::Ordering::Relaxed,
    );
    has
}

/// A shared file mapping or heap memory, 8-aligned, a whole number of words long.
#[cfg(not(loom))]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
}

#[cfg(not(loom))]
enum Backing {
    /// A `Box<[u64]>`'s allocation (zeroed by the global allocator); freed in `Drop`.
    Heap(*mut [u64]),
    /// Held only to unmap on drop.
    #[allow(dead_code)]
    Mmap(memmap2::MmapRaw),
}

// SAFETY: the mapping is plain memory owned by this value; every access goes through raw
// pointers turned into atomics (`word64`, `word32`, `words64`), never through references to
// plain bytes, so sharing it between threads cannot create a data race.
#[cfg(not(loom))]
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: shared access is through atomics only.
#[cfg(not(loom))]
unsafe impl Sync for Mapping {}

#[cfg(not(loom))]
impl Drop for Mapping {
    fn drop(&mut self) {
        if let Backing::Heap(p) = self.backing {
            // SAFETY: `p` came from `alloc_zeroed` in `Mapping::heap` with the layout of a
            // `[u64]` of its length, all initialized (zero): a valid `Box<[u64]>` allocation.
            // It is freed only here, once, when the last `Arc` holder (owner or importer) is
            // gone.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

/// Mappings of at least a huge page's size ask for transparent huge pages.
#[cfg(not(loom))]
const HUGE_PAGE: usize = 2 << 20;

#[cfg(not(loom))]
impl Mapping {
    /// Where the mapping starts in memory.
    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// `len` bytes (a multiple of 8) of zeroed heap memory; an error if they cannot be
    /// allocated.
    pub(crate) fn heap(len: usize) -> Result<Mapping, ShmError> {
        debug_assert!(len.is_multiple_of(WORD));
        #[cfg(not(miri))]
        if len >= HUGE_PAGE {
            return Self::anonymous(len);
        }
        let words = (len / WORD).max(1);
        // Zeroed by the allocator (one call, and pages the kernel gives zeroed are not
        // written again), where a `Vec` filled with zeros writes every word itself.
        let layout =
            std::alloc::Layout::array::<u64>(words).map_err(|_| ShmError::TooLarge { len })?;
        // SAFETY: `layout` is not zero-sized (at least one word).
        let p = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u64>();
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(ShmError::TooLarge { len })?;
        // A `Box<[u64]>`'s allocation: the global allocator's, with the layout of `words`
        // words, every one initialized (zero); `Drop` frees it as that box.
        let raw: *mut [u64] = std::ptr::slice_from_raw_parts_mut(p, words);
        Ok(Mapping {
            ptr,
            len,
            backing: Backing::Heap(raw),
        })
    }

    /// `len` bytes of anonymous memory from the kernel (zero pages until written), with
    /// transparent huge pages asked for: a table spread over many pages (RandomAccess's)
    /// otherwise costs a TLB miss per access. The advice is a hint, ignored where the kernel
    /// has them off.
    #[cfg(not(miri))]
    fn anonymous(len: usize) -> Result<Mapping, ShmError> {
        let map = memmap2::MmapOptions::new()
            .len(len)
            .map_anon()
            .map_err(|_| ShmError::TooLarge { len })?;
        let raw = memmap2::MmapRaw::from(map);
        let _ = raw.advise(memmap2::Advice::HugePage);
        let ptr = NonNull::new(raw.as_mut_ptr()).ok_or(ShmError::TooLarge { len })?;
        Ok(Mapping {
            ptr,
            len,
            backing: Backing::Mmap(raw),
        })
    }

    /// Maps `len` bytes (a multiple of 8) of `file`, shared.
    #[cfg_attr(miri, allow(dead_code))]
    pub(crate) fn map(file: &std::fs::File, len: usize, path: &str) -> Result<Mapping, ShmError> {
        debug_assert!(len.is_multiple_of(WORD));
        let raw = memmap2::MmapOptions::new()
            .len(len.max(WORD))
            .map_raw(file)
            .map_err(|source| ShmError::Io {
                what: "mapping",
                path: path.to_owned(),
                source,
            })?;
        if len >= HUGE_PAGE {
            // As for heap memory; shared memory gets them only where the kernel's shmem
            // setting allows (`advise` or `always`).
            let _ = raw.advise(memmap2::Advice::HugePage);
        }
        let ptr =
            NonNull::new(raw.as_mut_ptr()).ok_or_else(|| ShmError::BadSegment(path.into()))?;
        Ok(Mapping {
            ptr,
            len,
            backing: Backing::Mmap(raw),
        })
    }

    /// The 64-bit atomic at byte `off`.
    ///
    /// # Safety
    /// `off % 8 == 0` and `off + 8 <= self.len()`.
    #[inline(always)]
    pub(crate) unsafe fn word64(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off.is_multiple_of(WORD) && off + WORD <= self.len);
        // SAFETY: by the caller's contract the 8 bytes are inside the live mapping (alive as
        // long as `&self`) and 8-aligned (the base is 8-aligned: a page, or a `u64` array);
        // every access to them is atomic and 8 bytes wide (module docs), so `from_ptr`'s
        // requirement that no non-atomic or differently sized access races holds.
        unsafe { AtomicU64::from_ptr(self.ptr.as_ptr().add(off).cast::<u64>()) }
    }

    /// `n` consecutive 64-bit atomics from byte `off`.
    ///
    /// # Safety
    /// `off % 8 == 0` and `off + 8 * n <= self.len()`.
    #[inline(always)]
    pub(crate) unsafe fn words64(&self, off: usize, n: usize) -> &[AtomicU64] {
        debug_assert!(off.is_multiple_of(WORD) && off + WORD * n <= self.len);
        // SAFETY: by the caller's contract the run is inside the live mapping and 8-aligned;
        // `AtomicU64` is an `UnsafeCell`, so a shared slice of them asserts nothing about
        // other processes' writes, and every access to these bytes is a 64-bit atomic.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(off).cast::<AtomicU64>(), n) }
    }

    /// Asks the CPU to bring the cache line of byte `off` into its cache (`prefetcht0`): a
    /// hint, which reads and writes nothing the program can see and cannot fault. Nothing
    /// for an `off` outside the mapping, off x86-64, and under Miri.
    #[inline(always)]
    pub(crate) fn prefetch(&self, off: usize) {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if off < self.len {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: `off < len`, so the pointer is inside the live mapping (`add` stays in
            // the allocation); a prefetch accesses no memory in the language's sense.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(self.ptr.as_ptr().add(off).cast::<i8>()) }
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        let _ = off;
    }

    /// Asks the CPU to bring the cache line of byte `off` into its cache in a state that it
    /// may write without asking other cores again (`prefetchw`): a hint for a line this
    /// process will store to soon and another core last read, so that the store does not
    /// wait for that core when a fence follows it. Reads and writes nothing the program can
    /// see and cannot fault; nothing for an `off` outside the mapping, off x86-64, under Miri,
    /// or on a CPU without the instruction.
    #[inline(always)]
    pub(crate) fn prefetch_for_write(&self, off: usize) {
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        if off < self.len && has_prefetchw() {
            // SAFETY: `off < len`, so the pointer is inside the live mapping (`add` stays in
            // the allocation); `prefetchw` (checked present above) accesses no memory in the
            // language's sense, touches no flags and no stack.
            unsafe {
                std::arch::asm!(
                    "prefetchw [{0}]",
                    in(reg) self.ptr.as_ptr().add(off),
                    options(nostack, preserves_flags, readonly)
                )
            }
        }
        #[cfg(not(all(target_arch = "x86_64", not(miri))))]
        let _ = off;
    }

    /// The 32-bit atomic at byte `off` (futex words).
    ///
    /// # Safety
    /// `off % 4 == 0`, `off + 4 <= self.len()`, and the location is never accessed at another
    /// size (the callers keep futex words on lines of their own).
    #[inline(always)]
    pub(crate) unsafe fn word32(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off.is_multiple_of(4) && off + 4 <= self.len);
        // SAFETY: in bounds and 4-aligned by the caller's contract; only ever accessed as a
        // 32-bit atomic.
        unsafe { AtomicU32::from_ptr(self.ptr.as_ptr().add(off).cast::<u32>()) }
    }

    /// Plain copy of `src` to byte `at`, for the raw copy floor only, where the byte area is
    /// touched by one thread of one process and read by no one.
    ///
    /// # Safety
    /// `at + src.len() <= self.len()`, and no other thread or process accesses those bytes
    /// during the copy.
    #[cfg_attr(miri, allow(dead_code))]
    pub(crate) unsafe fn raw_copy_in(&self, at: usize, src: &[u8]) {
        debug_assert!(at + src.len() <= self.len);
        // SAFETY: in bounds by contract; exclusive by contract, so not a data race; `src` is
        // private memory, distinct from the mapping.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(at), src.len()) }
    }
}

/// 16 bytes moved by one unaligned SSE instruction (`movups`): the bulk of a copy.
#[cfg(all(not(loom), not(miri), target_arch = "x86_64"))]
#[derive(Clone, Copy)]
#[repr(C, packed)]
struct Chunk16(std::arch::x86_64::__m128i);

/// Copies of at least this many bytes use the CPU's string copy (`rep movsb`), which moves
/// whole lines; below it, [`copy_avx`] where the CPU has AVX, else 16-byte moves. Into or
/// out of lines another core holds, 16-byte moves one at a time fill the store buffer, which
/// `rep movsb` does not; below 4 KiB, four 32-byte loads then four stores are the faster of
/// the two, and from about there on they are level (BENCHMARKS.md, "Figures behind the
/// code's defaults").
#[cfg(all(not(loom), not(miri), target_arch = "x86_64"))]
const REP_MOVSB_FROM: usize = 4096;

/// Whether `rep movsb` from `src` to `dst` would take its slow path: where the destination
/// lies less than a line ahead of the source modulo a 4 KiB page, the CPU's string copy
/// sees its stores alias its next loads and falls back to moving a few bytes at a time, an
/// order of magnitude slower (glibc's `memcpy` makes the same check; BENCHMARKS.md,
/// "Figures behind the code's defaults"). [`copy_avx`]'s loads and stores are not slowed so.
/// Where a copy's ends fall is the caller's: a value's bytes after an 8-byte length, a
/// buffer the allocator placed.
#[cfg(all(not(loom), not(miri), target_arch = "x86_64"))]
#[inline(always)]
fn page_aliased(dst: *mut u8, src: *const u8) -> bool {
    let ahead = (dst as usize).wrapping_sub(src as usize) % 4096;
    ahead != 0 && ahead < 64
}

/// `rep movsb`: copies `n` bytes from `src` to `dst`. The assembly is opaque to the compiler,
/// so, like an atomic, the copy is never merged, split, elided or invented; the hardware
/// reads and writes each aligned word of it whole.
///
/// # Safety
/// `src` and `dst` are valid for `n` bytes and do not overlap.
#[cfg(all(not(loom), not(miri), target_arch = "x86_64"))]
#[inline(always)]
unsafe fn rep_movsb(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: by the caller's contract; `rep movsb` touches only `[dst, dst + n)` and
    // `[src, src + n)`, needs no stack, and the direction flag is clear per the ABI.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
}

/// Copies of at least this many bytes (and below [`REP_MOVSB_FROM`]) use [`copy_avx`].
#[cfg(all(not(loom), not(miri), target_arch = "x86_64"))]
const AVX_FROM: usize = 64;

/// Whether the CPU has AVX (detected once by std, then a load and a test).
#[cfg(all(not(loom), not(miri), target_arch = "x86_64"))]
#[inline(always)]
fn has_avx() -> bool {
    std::arch::is_x86_feature_detected!("avx")
}

/// 32-byte AVX moves in assembly, four loads then four stores per 128 bytes (as glibc's
/// `memcpy` does at these sizes), then 32-byte moves and a 16- and 8-byte rest. The
/// assembly is opaque to the compiler, as `rep movsb` is.
///
/// # Safety
/// `src` and `dst` valid for `n` bytes (`n % 8 == 0`), disjoint; the CPU has AVX.
#[cfg(all(not(loom), not(miri), target_arch = "x86_64"))]
#[target_feature(enable = "avx")]
unsafe fn copy_avx(dst: *mut u8, src: *const u8, n: usize) {
    use std::ptr::{read_volatile as rd, write_volatile as wr};
    let mut i = 0;
    while i + 128 <= n {
        // SAFETY: `[i, i + 128)` lies within `n` bytes of both (loop condition), disjoint by
        // contract; unaligned moves need no alignment; AVX by contract; no stack is used.
        unsafe {
            std::arch::asm!(
                "vmovdqu {a}, ymmword ptr [{s}]",
                "vmovdqu {b}, ymmword ptr [{s} + 32]",
                "vmovdqu {c}, ymmword ptr [{s} + 64]",
                "vmovdqu {e}, ymmword ptr [{s} + 96]",
                "vmovdqu ymmword ptr [{d}], {a}",
                "vmovdqu ymmword ptr [{d} + 32], {b}",
                "vmovdqu ymmword ptr [{d} + 64], {c}",
                "vmovdqu ymmword ptr [{d} + 96], {e}",
                s = in(reg) src.add(i),
                d = in(reg) dst.add(i),
                a = out(ymm_reg) _,
                b = out(ymm_reg) _,
                c = out(ymm_reg) _,
                e = out(ymm_reg) _,
                options(nostack, preserves_flags)
            );
        }
        i += 128;
    }
    while i + 32 <= n {
        // SAFETY: as above, for `[i, i + 32)`.
        unsafe {
            std::arch::asm!(
                "vmovdqu {a}, ymmword ptr [{s}]",
                "vmovdqu ymmword ptr [{d}], {a}",
                s = in(reg) src.add(i),
                d = in(reg) dst.add(i),
                a = out(ymm_reg) _,
                options(nostack, preserves_flags)
            );
        }
        i += 32;
    }
    // SAFETY: clears the upper halves of the vector registers, which hold nothing of ours
    // (the moves above declare theirs clobbered); AVX by contract.
    unsafe { std::arch::asm!("vzeroupper", options(nostack, preserves_flags)) };
    if i + 16 <= n {
        // SAFETY: `[i, i + 16)` within `n` (condition); `Chunk16` is packed.
        unsafe {
            wr(
                dst.add(i).cast::<Chunk16>(),
                rd(src.add(i).cast::<Chunk16>()),
            )
        };
        i += 16;
    }
    if i < n {
        // SAFETY: the last 8 bytes (`n % 8 == 0`, `i < n`); `Chunk8` is packed.
        unsafe { wr(dst.add(i).cast::<Chunk8>(), rd(src.add(i).cast::<Chunk8>())) };
    }
}

/// A large copy whose destination is [`page_aliased`] to its source: [`copy_avx`] where the
/// CPU has AVX, else `rep movsb` all the same. Out of line: rare, and the copy sites that
/// inline [`copy_large`] stay as they were.
///
/// # Safety
/// As [`copy_large`].
#[cfg(all(not(loom), not(miri), target_arch = "x86_64"))]
#[cold]
#[inline(never)]
unsafe fn copy_aliased(dst: *mut u8, src: *const u8, n: usize) -> bool {
    if has_avx() {
        // SAFETY: the caller's contract; AVX is there.
        unsafe { copy_avx(dst, src, n) };
    } else {
        // SAFETY: the caller's contract.
        unsafe { rep_movsb(dst, src, n) };
    }
    true
}

/// The copy of `n` bytes (`n % 8 == 0`) by `rep movsb` from [`REP_MOVSB_FROM`] (unless the
/// two are [`page_aliased`]) or [`copy_avx`] from [`AVX_FROM`]; false, with nothing copied,
/// below those (the caller's 16-byte moves). Inlined into each copy site: a call on every
/// Medium's copy costs more than the code it adds to each site (BENCHMARKS.md, "Figures
/// behind the code's defaults").
///
/// # Safety
/// `src` and `dst` valid for `n` bytes, disjoint.
#[cfg(all(not(loom), not(miri), target_arch = "x86_64"))]
#[inline(always)]
unsafe fn copy_large(dst: *mut u8, src: *const u8, n: usize) -> bool {
    if n >= REP_MOVSB_FROM {
        if page_aliased(dst, src) {
            // SAFETY: the contract of this function.
            return unsafe { copy_aliased(dst, src, n) };
        }
        // SAFETY: the contract of this function.
        unsafe { rep_movsb(dst, src, n) };
        return true;
    }
    if n >= AVX_FROM && has_avx() {
        // SAFETY: the contract of this function; AVX is there.
        unsafe { copy_avx(dst, src, n) };
        return true;
    }
    false
}

#[cfg(not(loom))]
impl Mapping {
    /// Copies whole words `[a, a + dst.len())` into private `dst` (`a` 8-aligned, `dst.len()`
    /// a multiple of 8).
    ///
    /// On x86-64 this is 16- or 32-byte volatile loads ([`copy_avx`], `rep movsb` from
    /// [`REP_MOVSB_FROM`]), not 8-byte atomics: with eight bytes per
    /// instruction a 1 KiB copy from lines another core holds has half as many of them in
    /// flight (the load and store buffers fill), and an AM Medium's round trip waits for
    /// that copy (BENCHMARKS.md, "Figures behind the code's defaults"). The volatile loads
    /// are as opaque to the compiler as atomics (never merged,
    /// split, elided or invented), each aligned word of them is read whole by the hardware,
    /// and the protocols order them with their `Acquire` flag loads, as they do atomics.
    /// Miri and loom check the atomic loop below, which copies the same words.
    ///
    /// # Safety
    /// `a % 8 == 0`, `dst.len() % 8 == 0` and `a + dst.len() <= self.len()`.
    #[inline(always)]
    unsafe fn load_words(&self, a: usize, dst: &mut [u8]) {
        debug_assert!(
            a.is_multiple_of(WORD) && dst.len().is_multiple_of(WORD) && a + dst.len() <= self.len
        );
        #[cfg(all(not(miri), target_arch = "x86_64"))]
        {
            let n = dst.len();
            // SAFETY: `[a, a + n)` is inside the mapping (contract) and `dst` is private.
            if unsafe { copy_large(dst.as_mut_ptr(), self.ptr.as_ptr().add(a), n) } {
                return;
            }
            let mut i = 0;
            while i + 16 <= n {
                // SAFETY: `[a + i, a + i + 16)` is inside the mapping (contract); `Chunk16`
                // is packed, so no alignment is required; `dst` is private and in bounds.
                unsafe {
                    let v = std::ptr::read_volatile(self.ptr.as_ptr().add(a + i).cast::<Chunk16>());
                    std::ptr::write_unaligned(dst.as_mut_ptr().add(i).cast::<Chunk16>(), v);
                }
                i += 16;
            }
            if i < n {
                // SAFETY: the last word, inside the mapping (contract) and 8-aligned.
                let w = unsafe { self.word64(a + i) }.load(Ordering::Relaxed);
                dst[i..].copy_from_slice(&w.to_ne_bytes());
            }
        }
        #[cfg(any(miri, not(target_arch = "x86_64")))]
        for (k, chunk) in dst.chunks_exact_mut(WORD).enumerate() {
            // SAFETY: 8-aligned and inside the mapping (contract).
            let w = unsafe { self.word64(a + k * WORD) }.load(Ordering::Relaxed);
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
    }

    /// Copies private `src` to whole words `[a, a + src.len())` (`a` 8-aligned, `src.len()` a
    /// multiple of 8); 16- or 32-byte volatile stores on x86-64, for the reason given at
    /// [`load_words`](Self::load_words).
    ///
    /// # Safety
    /// `a % 8 == 0`, `src.len() % 8 == 0` and `a + src.len() <= self.len()`.
    #[inline(always)]
    unsafe fn store_words(&self, a: usize, src: &[u8]) {
        debug_assert!(
            a.is_multiple_of(WORD) && src.len().is_multiple_of(WORD) && a + src.len() <= self.len
        );
        #[cfg(all(not(miri), target_arch = "x86_64"))]
        {
            let n = src.len();
            // SAFETY: as in `load_words`, the other way round.
            if unsafe { copy_large(self.ptr.as_ptr().add(a), src.as_ptr(), n) } {
                return;
            }
            let mut i = 0;
            while i + 16 <= n {
                // SAFETY: as in `load_words`, the other way round.
                unsafe {
                    let v = std::ptr::read_unaligned(src.as_ptr().add(i).cast::<Chunk16>());
                    std::ptr::write_volatile(self.ptr.as_ptr().add(a + i).cast::<Chunk16>(), v);
                }
                i += 16;
            }
            if i < n {
                let v = u64::from_ne_bytes(src[i..].try_into().unwrap_or([0; WORD]));
                // SAFETY: the last word, inside the mapping (contract) and 8-aligned.
                unsafe { self.word64(a + i) }.store(v, Ordering::Relaxed);
            }
        }
        #[cfg(any(miri, not(target_arch = "x86_64")))]
        for (k, chunk) in src.chunks_exact(WORD).enumerate() {
            let v = u64::from_ne_bytes(chunk.try_into().unwrap_or([0; WORD]));
            // SAFETY: 8-aligned and inside the mapping (contract).
            unsafe { self.word64(a + k * WORD) }.store(v, Ordering::Relaxed);
        }
    }
}

#[cfg(not(loom))]
impl Mapping {
    /// Copies `n` bytes (a multiple of 8) from byte `from` of `src` (any alignment) to whole
    /// words from `a` of this mapping, in one pass: `rep movsb` from [`REP_MOVSB_FROM`],
    /// [`copy_avx`] from [`AVX_FROM`], else 16-byte volatile moves, as
    /// [`store_words`](Self::store_words) does from private
    /// memory. `None` where that is not available (Miri, other CPUs): the caller copies word
    /// by word.
    ///
    /// # Safety
    /// `a % 8 == 0`, `n % 8 == 0`, `a + n <= self.len()`, `from + n <= src.len()`, and the two
    /// ranges do not overlap.
    #[inline(always)]
    unsafe fn copy_words_fast(&self, a: usize, src: &Mapping, from: usize, n: usize) -> Option<()> {
        #[cfg(all(not(miri), target_arch = "x86_64"))]
        {
            // SAFETY: `a + n <= self.len()` and `from + n <= src.len()` (contract).
            let (dst, from) = unsafe { (self.ptr.as_ptr().add(a), src.ptr.as_ptr().add(from)) };
            // SAFETY: both ranges are inside their mappings and disjoint (contract).
            if unsafe { copy_large(dst, from, n) } {
                return Some(());
            }
            let mut i = 0;
            while i + 16 <= n {
                // SAFETY: `[i, i + 16)` of both ranges, in bounds and disjoint (contract);
                // `Chunk16` is packed, so no alignment is required; the moves are volatile,
                // as in `load_words`.
                unsafe {
                    let v = std::ptr::read_volatile(from.add(i).cast::<Chunk16>());
                    std::ptr::write_volatile(dst.add(i).cast::<Chunk16>(), v);
                }
                i += 16;
            }
            if i < n {
                // SAFETY: the last 8 bytes of both ranges (`n % 8 == 0`), as above.
                unsafe {
                    let v = std::ptr::read_volatile(from.add(i).cast::<Chunk8>());
                    std::ptr::write_volatile(dst.add(i).cast::<Chunk8>(), v);
                }
            }
            Some(())
        }
        #[cfg(any(miri, not(target_arch = "x86_64")))]
        {
            let _ = (a, src, from, n);
            None
        }
    }

    /// Whether `[a, a + n)` of this mapping and `[from, from + n)` of `src` share a byte.
    fn overlaps(&self, a: usize, src: &Mapping, from: usize, n: usize) -> bool {
        std::ptr::eq(self, src) && a < from + n && from < a + n
    }
}

/// 8 bytes moved by one unaligned move: the last word of a copy between mappings.
#[cfg(all(not(loom), not(miri), target_arch = "x86_64"))]
#[derive(Clone, Copy)]
#[repr(C, packed)]
struct Chunk8(u64);

#[cfg(loom)]
impl Mapping {
    /// # Safety
    /// As the non-loom version; under loom the caller copies word by word.
    #[inline(always)]
    unsafe fn copy_words_fast(&self, _: usize, _: &Mapping, _: usize, _: usize) -> Option<()> {
        None
    }

    fn overlaps(&self, a: usize, src: &Mapping, from: usize, n: usize) -> bool {
        std::ptr::eq(self, src) && a < from + n && from < a + n
    }
}

/// Under loom: one loom atomic per 8-byte word and one per 4-byte futex word (a location is
/// used at one size only, so the two arrays never alias a real access).
#[cfg(loom)]
pub(crate) struct Mapping {
    w64: Box<[AtomicU64]>,
    w32: Box<[AtomicU32]>,
    len: usize,
}

#[cfg(loom)]
impl Mapping {
    pub(crate) fn heap(len: usize) -> Result<Mapping, ShmError> {
        Ok(Mapping {
            w64: (0..(len / WORD).max(1))
                .map(|_| AtomicU64::new(0))
                .collect(),
            w32: (0..(len / 4).max(1)).map(|_| AtomicU32::new(0)).collect(),
            len,
        })
    }

    /// # Safety
    /// As the non-loom version (here it is checked by indexing).
    #[inline(always)]
    pub(crate) unsafe fn word64(&self, off: usize) -> &AtomicU64 {
        &self.w64[off / WORD]
    }

    /// # Safety
    /// As the non-loom version (here it is checked by indexing).
    #[inline(always)]
    pub(crate) unsafe fn words64(&self, off: usize, n: usize) -> &[AtomicU64] {
        &self.w64[off / WORD..off / WORD + n]
    }

    /// # Safety
    /// As the non-loom version (here it is checked by indexing).
    #[inline(always)]
    pub(crate) unsafe fn word32(&self, off: usize) -> &AtomicU32 {
        &self.w32[off / 4]
    }

    /// A hint: nothing to do under loom.
    #[inline(always)]
    pub(crate) fn prefetch(&self, _off: usize) {}

    /// Nothing under loom.
    #[inline(always)]
    pub(crate) fn prefetch_for_write(&self, _off: usize) {}
}

#[cfg(loom)]
impl Mapping {
    /// # Safety
    /// As the non-loom version.
    #[inline(always)]
    unsafe fn load_words(&self, a: usize, dst: &mut [u8]) {
        for (k, chunk) in dst.chunks_exact_mut(WORD).enumerate() {
            // SAFETY: checked by indexing under loom.
            let w = unsafe { self.word64(a + k * WORD) }.load(Ordering::Relaxed);
            chunk.copy_from_slice(&w.to_ne_bytes());
        }
    }

    /// # Safety
    /// As the non-loom version.
    #[inline(always)]
    unsafe fn store_words(&self, a: usize, src: &[u8]) {
        for (k, chunk) in src.chunks_exact(WORD).enumerate() {
            let v = u64::from_ne_bytes(chunk.try_into().unwrap_or([0; WORD]));
            // SAFETY: checked by indexing under loom.
            unsafe { self.word64(a + k * WORD) }.store(v, Ordering::Relaxed);
        }
    }
}

impl Mapping {
    /// Stores `bytes` as whole words from byte `at`, the last one zero-padded, each word by
    /// one relaxed atomic store (for a few words: a message head, with nothing to gather).
    ///
    /// # Safety
    /// `at % 8 == 0` and `at + round_to_words(bytes.len()) <= self.len()`.
    #[inline(always)]
    pub(crate) unsafe fn store_words_padded(&self, at: usize, bytes: &[u8]) {
        let mut a = at;
        let mut chunks = bytes.chunks_exact(WORD);
        for c in chunks.by_ref() {
            let w = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            // SAFETY: `a` is 8-aligned and the word ends within the padded run, inside the
            // mapping (contract); the mapping is accessed only through 64-bit atomics on
            // this grid (module docs).
            unsafe { self.word64(a) }.store(w, Ordering::Relaxed);
            a += WORD;
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; WORD];
            last[..rest.len()].copy_from_slice(rest);
            // SAFETY: as above, for the padded last word.
            unsafe { self.word64(a) }.store(u64::from_ne_bytes(last), Ordering::Relaxed);
        }
    }

    /// Length in bytes (a multiple of 8).
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Copies bytes `[at, at + dst.len())` into private `dst`: loads of the words that cover
    /// them (a partial word at either end is loaded whole).
    ///
    /// # Safety
    /// `at + dst.len() <= self.len()`.
    #[inline]
    pub(crate) unsafe fn load(&self, at: usize, dst: &mut [u8]) {
        let n = dst.len();
        let lead = at % WORD;
        if lead == 0 && n == WORD {
            // SAFETY: 8-aligned and `at + 8 <= len`.
            let w = unsafe { self.word64(at) }.load(Ordering::Relaxed);
            dst.copy_from_slice(&w.to_ne_bytes());
            return;
        }
        if lead == 0 && n <= 2 * WORD && n > 0 {
            // Headers and flags: one or two word loads, no loop (the common small read).
            let mut b = [0u8; 2 * WORD];
            // SAFETY: 8-aligned, and byte `at < at + n <= len` lies in the mapping, whose
            // length is a multiple of 8, so the whole word does.
            let w0 = unsafe { self.word64(at) }.load(Ordering::Relaxed);
            b[..WORD].copy_from_slice(&w0.to_ne_bytes());
            if n > WORD {
                // SAFETY: as above, for byte `at + 8 < at + n`.
                let w1 = unsafe { self.word64(at + WORD) }.load(Ordering::Relaxed);
                b[WORD..].copy_from_slice(&w1.to_ne_bytes());
            }
            dst.copy_from_slice(&b[..n]);
            return;
        }
        if n == 0 {
            return;
        }
        let mut i = 0;
        let mut a = at;
        if lead != 0 {
            // SAFETY: the word holding byte `at` starts at `at - lead >= 0`, 8-aligned, and
            // ends at or before `len` (a multiple of 8 covering byte `at`).
            let w = unsafe { self.word64(a - lead) }.load(Ordering::Relaxed);
            let take = (WORD - lead).min(n);
            dst[..take].copy_from_slice(&w.to_ne_bytes()[lead..lead + take]);
            i = take;
            a += take;
        }
        let whole = (n - i) / WORD * WORD;
        if whole > 0 {
            // SAFETY: `a` is 8-aligned here (the lead word was taken whole, or there was
            // none) and `a + whole <= at + n <= len`.
            unsafe { self.load_words(a, &mut dst[i..i + whole]) };
        }
        a += whole;
        let rest = &mut dst[i + whole..];
        if !rest.is_empty() {
            // SAFETY: `a` is 8-aligned and holds byte `at + n - 1 < len`; `len` is a multiple
            // of 8, so the whole word is inside the mapping.
            let w = unsafe { self.word64(a) }.load(Ordering::Relaxed);
            let k = rest.len();
            rest.copy_from_slice(&w.to_ne_bytes()[..k]);
        }
    }

    /// Copies private `src` to bytes `[at, at + src.len())`: relaxed atomic stores of whole
    /// words, and a compare-and-swap that merges the bytes of a partial word at either end (so
    /// the other bytes of that word, someone else's, are kept).
    ///
    /// # Safety
    /// `at + src.len() <= self.len()`.
    #[inline]
    pub(crate) unsafe fn store(&self, at: usize, src: &[u8]) {
        let n = src.len();
        if n == 0 {
            return;
        }
        let mut i = 0;
        let mut a = at;
        let lead = a % WORD;
        if lead != 0 {
            let take = (WORD - lead).min(n);
            // SAFETY: as in `load`: the word holding byte `at` is inside the mapping.
            merge(unsafe { self.word64(a - lead) }, lead, &src[..take]);
            i = take;
            a += take;
        }
        let whole = (n - i) / WORD * WORD;
        if whole > 0 {
            // SAFETY: `a` is 8-aligned (as in `load`) and `a + whole <= at + n <= len`.
            unsafe { self.store_words(a, &src[i..i + whole]) };
        }
        a += whole;
        let rest = &src[i + whole..];
        if !rest.is_empty() {
            // SAFETY: as in `load`'s tail: the word holding the last byte is in the mapping.
            merge(unsafe { self.word64(a) }, 0, rest);
        }
    }

    /// Copies `n` bytes (a multiple of 8) from byte `from` of `src` (any alignment) to whole
    /// words from `a`: [`copy_words_fast`](Self::copy_words_fast) where it is available,
    /// else word by word through `src`'s loads.
    ///
    /// # Safety
    /// As [`copy_words_fast`](Self::copy_words_fast).
    #[inline(always)]
    unsafe fn copy_words(&self, a: usize, src: &Mapping, from: usize, n: usize) {
        // SAFETY: the caller's contract is `copy_words_fast`'s.
        if unsafe { self.copy_words_fast(a, src, from, n) }.is_some() {
            return;
        }
        let mut w = [0u8; WORD];
        for k in (0..n).step_by(WORD) {
            // SAFETY: `[from + k, from + k + 8)` of `src` and the 8-aligned word `a + k` are
            // in bounds (contract).
            unsafe {
                src.load(from + k, &mut w);
                self.word64(a + k)
                    .store(u64::from_ne_bytes(w), Ordering::Relaxed);
            }
        }
    }

    /// Copies `n` bytes from byte `from` of `src` (this mapping or another) to bytes `[at, at
    /// + n)`, in one pass where the ranges are disjoint: the destination's partial words at
    /// either end are merged as [`store`](Self::store) does, its whole words are moved straight
    /// from `src`. Overlapping ranges go through a private copy.
    ///
    /// # Safety
    /// `at + n <= self.len()` and `from + n <= src.len()`.
    pub(crate) unsafe fn copy_from_map(&self, at: usize, src: &Mapping, from: usize, n: usize) {
        if n == 0 {
            return;
        }
        if self.overlaps(at, src, from, n) {
            let mut tmp = vec![0u8; n];
            // SAFETY: in bounds by contract; `tmp` is private.
            unsafe {
                src.load(from, &mut tmp);
                self.store(at, &tmp);
            }
            return;
        }
        let mut edge = [0u8; WORD];
        let mut i = 0;
        let lead = at % WORD;
        if lead != 0 {
            let take = (WORD - lead).min(n);
            // SAFETY: in bounds by contract (`take <= n`).
            unsafe {
                src.load(from, &mut edge[..take]);
                self.store(at, &edge[..take]);
            }
            i = take;
        }
        let whole = (n - i) / WORD * WORD;
        if whole > 0 {
            let a = at + i;
            // SAFETY: `a` is 8-aligned (the lead was taken, or there was none), both ranges
            // are in bounds by contract and disjoint (checked above).
            unsafe { self.copy_words(a, src, from + i, whole) };
            i += whole;
        }
        if i < n {
            let k = n - i;
            // SAFETY: in bounds by contract.
            unsafe {
                src.load(from + i, &mut edge[..k]);
                self.store(at + i, &edge[..k]);
            }
        }
    }

    /// Stores the concatenation of `parts` from 8-aligned byte `at`, as whole words: the last
    /// word is padded with zeros. Returns the bytes stored (the total rounded up to words).
    /// For a writer that owns whole words (a slot): no compare-and-swap at all.
    ///
    /// Whole words go straight from the parts; only the bytes that straddle a part boundary
    /// and the last few are assembled in a register, so a message of a header and a payload
    /// costs a few instructions per word and no call.
    ///
    /// # Safety
    /// `at % 8 == 0` and `at + round_to_words(total) <= self.len()`.
    #[inline]
    pub(crate) unsafe fn store_padded(&self, at: usize, parts: &[&[u8]]) -> usize {
        if let [one] | [one, []] = *parts {
            // One part (a message head): its words go straight, with nothing to gather.
            // SAFETY: the contract of this function.
            return unsafe { self.store_one_padded(at, one) };
        }
        // SAFETY: the contract of this function.
        let (a, acc, fill) = unsafe { self.gather(at, parts, 0, 0) };
        // SAFETY: as above.
        let end = unsafe { self.flush(a, acc, fill) };
        end - at
    }

    /// [`store_padded`](Self::store_padded) of `a` then `b`: a head of whole words (an even
    /// number of arguments) and its payload each go straight, with nothing to gather.
    ///
    /// # Safety
    /// As [`store_padded`](Self::store_padded), for the total of both.
    #[inline(always)]
    pub(crate) unsafe fn store_two_padded(&self, at: usize, a: &[u8], b: &[u8]) -> usize {
        if b.is_empty() {
            // SAFETY: the contract of this function.
            return unsafe { self.store_one_padded(at, a) };
        }
        if a.len().is_multiple_of(WORD) {
            // SAFETY: `a` is whole words, within the padded length (contract).
            unsafe { self.store_words(at, a) };
            // SAFETY: `at + a.len()` is 8-aligned and `b` padded ends the padded length.
            return a.len() + unsafe { self.store_one_padded(at + a.len(), b) };
        }
        // SAFETY: the contract of this function, as `store_padded` of `[a, b]`.
        let (end, acc, fill) = unsafe { self.gather(at, &[a, b], 0, 0) };
        // SAFETY: as above.
        unsafe { self.flush(end, acc, fill) - at }
    }

    /// [`store_padded`](Self::store_padded) of one part: its whole words, then the rest
    /// zero-padded.
    ///
    /// # Safety
    /// As [`store_padded`](Self::store_padded).
    #[inline(always)]
    unsafe fn store_one_padded(&self, at: usize, bytes: &[u8]) -> usize {
        let whole = bytes.len() / WORD * WORD;
        // SAFETY: `[at, at + whole)` is within the padded length (contract).
        unsafe { self.store_words(at, &bytes[..whole]) };
        let rest = &bytes[whole..];
        if rest.is_empty() {
            return whole;
        }
        let mut last = [0u8; WORD];
        last[..rest.len()].copy_from_slice(rest);
        // SAFETY: the padded last word ends the padded length (contract).
        unsafe { self.word64(at + whole) }.store(u64::from_ne_bytes(last), Ordering::Relaxed);
        whole + WORD
    }

    /// [`store_padded`](Self::store_padded) of `parts` followed by bytes `[from, from + n)`
    /// of `src` (a received payload being echoed or forwarded): the shared bytes move
    /// straight from `src` to this mapping, whole words by the bulk copy, with no private
    /// copy in between. Returns the bytes stored.
    ///
    /// # Safety
    /// `at % 8 == 0`, `at + round_to_words(total + n) <= self.len()`, `from + n <=
    /// src.len()`, and the destination does not overlap `[from, from + n)` of `src`.
    pub(crate) unsafe fn store_padded_then(
        &self,
        at: usize,
        parts: &[&[u8]],
        src: &Mapping,
        from: usize,
        n: usize,
    ) -> usize {
        // SAFETY: the contract of this function; every range read is inside `[from, from +
        // n)` of `src`, every word written inside the padded length, and the two disjoint.
        unsafe {
            let mut edge = [0u8; WORD];
            let (mut a, mut acc, mut fill) = self.gather(at, parts, 0, 0);
            let mut done = 0;
            if fill != 0 && n > 0 {
                let k = (WORD - fill).min(n);
                src.load(from, &mut edge[..k]);
                (a, acc, fill) = self.gather(a, &[&edge[..k]], acc, fill);
                done = k;
            }
            let whole = (n - done) / WORD * WORD;
            if whole > 0 {
                // `fill == 0` here: the straddling word was completed above.
                self.copy_words(a, src, from + done, whole);
                a += whole;
                done += whole;
            }
            if done < n {
                let r = n - done;
                src.load(from + done, &mut edge[..r]);
                (a, acc, fill) = self.gather(a, &[&edge[..r]], acc, fill);
            }
            self.flush(a, acc, fill) - at
        }
    }

    /// Stores `parts` from 8-aligned `a` after `fill` bytes already assembled little-endian
    /// in `acc` (byte k at bits 8k): whole words go straight from the parts; only the bytes
    /// that straddle a part boundary are assembled. Returns the new `(a, acc, fill)`.
    ///
    /// # Safety
    /// `a % 8 == 0` and every word written lies within the caller's padded length.
    #[inline(always)]
    unsafe fn gather(
        &self,
        at: usize,
        parts: &[&[u8]],
        mut acc: u64,
        mut fill: usize,
    ) -> (usize, u64, usize) {
        let mut a = at;
        for part in parts {
            let mut s = *part;
            while !s.is_empty() {
                if fill == 0 && s.len() >= WORD {
                    let whole = s.len() / WORD * WORD;
                    if whole >= 2 * WORD {
                        // SAFETY: `a` is 8-aligned and the words are within the padded length.
                        unsafe { self.store_words(a, &s[..whole]) };
                    } else {
                        let v = u64::from_ne_bytes(s[..WORD].try_into().unwrap_or([0; WORD]));
                        // SAFETY: as above.
                        unsafe { self.word64(a) }.store(v, Ordering::Relaxed);
                    }
                    a += whole;
                    s = &s[whole..];
                    continue;
                }
                acc |= u64::from(s[0]) << (8 * fill);
                fill += 1;
                s = &s[1..];
                if fill == WORD {
                    // SAFETY: as above.
                    unsafe { self.word64(a) }.store(u64::from_le(acc), Ordering::Relaxed);
                    a += WORD;
                    acc = 0;
                    fill = 0;
                }
            }
        }
        (a, acc, fill)
    }

    /// Stores the `fill` assembled bytes in `acc` as one zero-padded word at `a`, if any.
    /// Returns where the stored run ends.
    ///
    /// # Safety
    /// As [`gather`](Self::gather).
    #[inline(always)]
    unsafe fn flush(&self, a: usize, acc: u64, fill: usize) -> usize {
        if fill > 0 {
            // SAFETY: the padded last word is within the padded length (contract).
            unsafe { self.word64(a) }.store(u64::from_le(acc), Ordering::Relaxed);
            return a + WORD;
        }
        a
    }
}

/// Compare-and-swaps a partial-word store tries before it stores its merge plainly: only a
/// peer rewriting that very word without pause gets there, and it then loses its bytes of it.
const MERGE_TRIES: u32 = 64;

/// Writes `bytes` at byte `lead` of `word`, keeping its other bytes: a compare-and-swap loop
/// (the other bytes may belong to someone writing them now), bounded by [`MERGE_TRIES`].
#[inline]
fn merge(word: &AtomicU64, lead: usize, bytes: &[u8]) {
    let mut cur = word.load(Ordering::Relaxed);
    for _ in 0..MERGE_TRIES {
        let mut b = cur.to_ne_bytes();
        b[lead..lead + bytes.len()].copy_from_slice(bytes);
        match word.compare_exchange_weak(
            cur,
            u64::from_ne_bytes(b),
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => return,
            Err(now) => cur = now,
        }
    }
    let mut b = cur.to_ne_bytes();
    b[lead..lead + bytes.len()].copy_from_slice(bytes);
    word.store(u64::from_ne_bytes(b), Ordering::Relaxed);
}
