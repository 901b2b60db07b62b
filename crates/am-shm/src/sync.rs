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
