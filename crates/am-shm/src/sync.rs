//! The atomics every word of shared memory is accessed through, aliased to loom's under
//! `cfg(loom)` (as tokio's `src/loom/` and crossbeam's `crossbeam-utils/src/atomic/` do), so
//! that the loom models run this crate's own code and the NIC crates' code built on it.
//!
//! Code that touches shared memory uses these names, never `std::sync::atomic` directly:
//! `am_shm::sync::{AtomicU64, AtomicU32, Ordering, fence}`. [`AsymmetricFence`] is a pair of
//! fences for a handshake between threads of one process whose frequent side needs none.

#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

/// A spin-wait hint: `std::hint::spin_loop`, or a loom yield (so a model that spins on a
/// word lets the other threads run).
#[inline]
pub fn spin_loop() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Gives the CPU away: `std::thread::yield_now`, or a loom yield.
#[inline]
pub fn yield_now() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}

#[cfg(loom)]
std::thread_local! {
    static YIELD_AFTER_SPAWN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// For loom models: `loom::thread::spawn`, and in the second pass of [`model`] a yield in
/// the spawning thread right after it.
#[cfg(loom)]
pub fn spawn<T: 'static>(f: impl FnOnce() -> T + Send + 'static) -> loom::thread::JoinHandle<T> {
    let handle = loom::thread::spawn(f);
    if YIELD_AFTER_SPAWN.with(|y| y.get()) {
        loom::thread::yield_now();
    }
    handle
}

/// For loom models: checks `f` twice with `preemption_bound`, threads started by [`spawn`].
/// The first pass spawns plainly. loom 0.7 explores a single execution when a new thread's
/// first operation is an atomic load (tokio-rs/loom#392): the spawner always runs first, so
/// the owner in a mailbox model never saw a message published. The second pass yields in the
/// spawner after each spawn, which lets the new threads go first; it explores fewer
/// executions where the spawner goes first, which the first pass covers.
#[cfg(loom)]
pub fn model(preemption_bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let f = std::sync::Arc::new(f);
    for yield_after_spawn in [false, true] {
        YIELD_AFTER_SPAWN.with(|y| y.set(yield_after_spawn));
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(preemption_bound);
        let f = f.clone();
        b.check(move || f());
    }
    YIELD_AFTER_SPAWN.with(|y| y.set(false));
}

/// A pair of fences for a handshake between threads of **this process** in which one side
/// runs often and the other rarely: a ring's writer after each record, and its reader before
/// it sleeps (each stores its flag, fences, then loads the other's). Together they order as
/// two `SeqCst` fences would: either the load after [`light`](Self::light) sees the store
/// before [`heavy`](Self::heavy), or the load after `heavy` sees the store before `light`.
///
/// `light` is only a compiler fence; `heavy` makes every running thread of the process
/// execute a full barrier (Linux `membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)`, the
/// asymmetric fence of folly and liburcu), so whatever the light side stored before its
/// fence is visible after `heavy`, or its load after its fence comes after `heavy` began.
/// Where the kernel refuses the registration, and under Miri and loom, both are `SeqCst`
/// fences. Threads of other processes are not covered by [`new`](Self::new): pair across
/// processes only fences made by [`across_processes`](Self::across_processes) on both sides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AsymmetricFence {
    /// `membarrier` is registered: the light side needs no fence instruction.
    expedited: bool,
    /// The heavy side's barrier reaches the registered threads of every process
    /// (`MEMBARRIER_CMD_GLOBAL_EXPEDITED`), not only this one's.
    global: bool,
}

impl AsymmetricFence {
    /// Registers this process for expedited `membarrier` (once per process), or falls back
    /// to a `SeqCst` fence on both sides where that is refused.
    pub fn new() -> AsymmetricFence {
        AsymmetricFence {
            expedited: membarrier::registered(),
            global: false,
        }
    }

    /// The pair for a handshake between processes (a sender in one, the receiver of shared
    /// memory in another): registers this process for `MEMBARRIER_CMD_GLOBAL_EXPEDITED`, and
    /// the heavy side makes every running thread of every process so registered execute a
    /// full barrier. A process whose registration fails fences on its light side; the heavy
    /// side issues the global barrier wherever the kernel offers it, so a registered light
    /// side in another process is covered whatever this one's registration did. The heavy
    /// side costs a system call and an inter-processor interrupt to each CPU running a
    /// registered process, and waits for them all: keep it off any per-message path.
    pub fn across_processes() -> AsymmetricFence {
        AsymmetricFence {
            expedited: membarrier::registered_global(),
            global: true,
        }
    }

    /// Both sides `SeqCst` fences, whatever the kernel offers (for tests and comparisons).
    pub fn symmetric() -> AsymmetricFence {
        AsymmetricFence {
            expedited: false,
            global: false,
        }
    }

    /// Whether the light side is only a compiler fence.
    pub fn is_asymmetric(&self) -> bool {
        self.expedited
    }

    /// The frequent side's fence.
    #[inline(always)]
    pub fn light(&self) {
        std::sync::atomic::compiler_fence(Ordering::SeqCst);
        if !self.expedited {
            seq_cst_fence();
        }
    }

    /// The rare side's fence (a system call when asymmetric). False if the barrier could not
    /// be made (the kernel failed it): the handshake does not hold, so do not sleep on it.
    pub fn heavy(&self) -> bool {
        fence(Ordering::SeqCst);
        let done = if self.global {
            // Whatever our own registration did: other processes' light sides may rely on it.
            !membarrier::global_offered() || membarrier::barrier_global()
        } else {
            !self.expedited || membarrier::barrier()
        };
        fence(Ordering::SeqCst);
        done
    }
}

/// The light side's fence where there is no `membarrier`: out of line, so the light side's
/// hot path is one test.
#[cold]
#[inline(never)]
fn seq_cst_fence() {
    fence(Ordering::SeqCst);
}

impl Default for AsymmetricFence {
    fn default() -> Self {
        AsymmetricFence::new()
    }
}

#[cfg(all(target_os = "linux", not(loom), not(miri)))]
mod membarrier {
    use std::sync::OnceLock;

    // The kernel's ABI (linux/membarrier.h).
    const MEMBARRIER_CMD_QUERY: libc::c_int = 0;
    const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
    const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;
    const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
    const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

    /// The system call's return: 0 (or the commands offered, for the query), -1 if refused.
    fn call(cmd: libc::c_int) -> libc::c_long {
        // SAFETY: membarrier takes two integers (command, flags; and a CPU id we leave 0) and
        // touches no memory of this process; a refusal is an error return, not a fault.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                cmd,
                0 as libc::c_uint,
                0 as libc::c_int,
            )
        }
    }

    fn membarrier(cmd: libc::c_int) -> bool {
        call(cmd) == 0
    }

    /// Registers this process once (the kernel requires it before the barrier).
    pub(super) fn registered() -> bool {
        static REGISTERED: OnceLock<bool> = OnceLock::new();
        *REGISTERED.get_or_init(|| membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED))
    }

    /// A full barrier on every running thread of this process.
    pub(super) fn barrier() -> bool {
        membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED)
    }

    /// Registers this process once for the global barrier.
    pub(super) fn registered_global() -> bool {
        static REGISTERED: OnceLock<bool> = OnceLock::new();
        *REGISTERED.get_or_init(|| membarrier(MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED))
    }

    /// Whether the kernel offers the global barrier (asked once).
    pub(super) fn global_offered() -> bool {
        static OFFERED: OnceLock<bool> = OnceLock::new();
        *OFFERED.get_or_init(|| {
            let cmds = call(MEMBARRIER_CMD_QUERY);
            cmds > 0 && cmds & libc::c_long::from(MEMBARRIER_CMD_GLOBAL_EXPEDITED) != 0
        })
    }

    /// A full barrier on every running thread of every process registered for it.
    pub(super) fn barrier_global() -> bool {
        membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)
    }
}

#[cfg(not(all(target_os = "linux", not(loom), not(miri))))]
mod membarrier {
    /// Not available: both sides fence.
    pub(super) fn registered() -> bool {
        false
    }

    /// Never called (nothing is registered).
    pub(super) fn barrier() -> bool {
        false
    }

    /// Not available: both sides fence.
    pub(super) fn registered_global() -> bool {
        false
    }

    /// Not offered: the heavy side fences only.
    pub(super) fn global_offered() -> bool {
        false
    }

    /// Never called (not offered).
    pub(super) fn barrier_global() -> bool {
        false
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::{AsymmetricFence, AtomicU32, Ordering};

    /// The handshake both ways round, many times, in each mode: a thread stores its flag,
    /// fences and loads the other's; they can never both miss the other's store.
    #[test]
    fn no_side_misses_the_other() {
        let rounds = if cfg!(miri) { 20 } else { 2000 };
        for f in [
            AsymmetricFence::new(),
            AsymmetricFence::across_processes(),
            AsymmetricFence::symmetric(),
        ] {
            for _ in 0..rounds {
                let (a, b) = (AtomicU32::new(0), AtomicU32::new(0));
                let (seen_by_light, seen_by_heavy) = std::thread::scope(|s| {
                    let light = s.spawn(|| {
                        a.store(1, Ordering::Relaxed);
                        f.light();
                        b.load(Ordering::Relaxed)
                    });
                    b.store(1, Ordering::Relaxed);
                    assert!(f.heavy());
                    let seen = a.load(Ordering::Relaxed);
                    (light.join().unwrap(), seen)
                });
                assert!(seen_by_light == 1 || seen_by_heavy == 1);
            }
        }
        assert!(!AsymmetricFence::symmetric().is_asymmetric());
    }

    /// The store-buffering litmus test the asymmetric pair must pass: two long-lived threads
    /// meet at a spin barrier each round (with a small random skew, so that their stores and
    /// loads overlap in time), each stores its flag, fences and loads the other's; never may
    /// both loads miss. A `heavy` that did no barrier fails it within a few thousand rounds
    /// on x86 (the light side's store sits in its store buffer while it loads), as does a
    /// heavy side that fences only itself; the spawn-per-round test above cannot tell.
    #[cfg(not(miri))]
    #[test]
    fn store_buffering_never_misses_both() {
        store_buffering(AsymmetricFence::new());
    }

    /// The same with the pair made for a handshake between processes: its heavy side's
    /// global barrier must reach this process's registered threads too. (A global barrier
    /// that did nothing fails it as above.)
    #[cfg(not(miri))]
    #[test]
    fn store_buffering_never_misses_both_across_processes() {
        store_buffering(AsymmetricFence::across_processes());
    }

    #[cfg(not(miri))]
    fn store_buffering(f: AsymmetricFence) {
        use std::sync::atomic::AtomicU64 as Count;
        use std::time::{Duration, Instant};
        if !f.is_asymmetric() || std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
            return; // Nothing to check: both sides fence (the test above covers that).
        }
        // Bounded in time too: under a loaded test run the barrier waits for descheduled
        // threads, and fewer rounds only make a miss less likely, never a false failure.
        let (rounds, limit) = (200_000u64, Duration::from_secs(5));
        let (a, b, seen) = (AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(1));
        let (arrive, left, stop) = (Count::new(0), Count::new(0), Count::new(u64::MAX));
        let wait = |c: &Count, n: u64| {
            let mut spins = 0u32;
            while c.load(Ordering::Acquire) < n {
                spins += 1;
                if spins.is_multiple_of(1024) {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        };
        let skew = |x: &mut u64| {
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            for _ in 0..*x % 8 {
                std::hint::spin_loop();
            }
        };
        let start = Instant::now();
        let mut both_missed = 0;
        // Counted, not asserted in the loop: a panic there would leave the other thread
        // waiting at the spin barrier, and the scope's join would hang instead of failing.
        let mut heavy_failed = 0;
        let mut done = 0;
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut x = 12345u64;
                for r in 1..=rounds {
                    arrive.fetch_add(1, Ordering::AcqRel);
                    wait(&arrive, 2 * r);
                    if r > stop.load(Ordering::Acquire) {
                        break;
                    }
                    skew(&mut x);
                    a.store(1, Ordering::Relaxed);
                    f.light();
                    seen.store(b.load(Ordering::Relaxed), Ordering::Relaxed);
                    left.fetch_add(1, Ordering::AcqRel);
                    wait(&left, 2 * r);
                }
            });
            let mut x = 999u64;
            for r in 1..=rounds {
                if start.elapsed() > limit {
                    stop.store(r - 1, Ordering::Release);
                }
                arrive.fetch_add(1, Ordering::AcqRel);
                wait(&arrive, 2 * r);
                if r > stop.load(Ordering::Acquire) {
                    break;
                }
                skew(&mut x);
                b.store(1, Ordering::Relaxed);
                if !f.heavy() {
                    heavy_failed += 1;
                }
                let h = a.load(Ordering::Relaxed);
                left.fetch_add(1, Ordering::AcqRel);
                wait(&left, 2 * r);
                if h == 0 && seen.load(Ordering::Relaxed) == 0 {
                    both_missed += 1;
                }
                a.store(0, Ordering::Relaxed);
                b.store(0, Ordering::Relaxed);
                seen.store(1, Ordering::Relaxed);
                done = r;
            }
        });
        assert_eq!(heavy_failed, 0, "the heavy side failed in {done} rounds");
        assert_eq!(both_missed, 0, "in {done} rounds");
    }
}
