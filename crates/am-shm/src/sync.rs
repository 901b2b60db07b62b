//! The atomics every word of shared memory is accessed through, aliased to loom's under
//! `cfg(loom)` (as tokio's `src/loom/` and crossbeam's `crossbeam-utils/src/atomic/` do), so
//! that the loom models run this crate's own code and the NIC crates' code built on it.
//!
//! Code that touches shared memory uses these names, never `std::sync::atomic` directly:
//! `am_shm::sync::{AtomicU64, AtomicU32, Ordering, fence}`.

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
