//! futex(2) on a 32-bit word, without `FUTEX_PRIVATE_FLAG`, so it works across processes
//! that map the same file.

use crate::sync::AtomicU32;
use std::time::Duration;

/// Sleeps while `*word == expected`, at most `timeout`. Returns at once if the word differs;
/// may return spuriously. Callers re-check their condition.
#[cfg(all(target_os = "linux", not(loom)))]
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word.as_ptr()` is a valid, aligned u32 for the duration of the call (borrowed);
    // the kernel only reads it (compares with `expected`); `ts_ptr` is null or points to a
    // live timespec on this stack frame. Errors (EAGAIN, ETIMEDOUT, EINTR) just mean "return".
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes up to `n` sleepers on `word`.
#[cfg(all(target_os = "linux", not(loom)))]
pub fn futex_wake(word: &AtomicU32, n: i32) {
    // SAFETY: `word.as_ptr()` is a valid aligned u32 (borrowed); FUTEX_WAKE does not access
    // memory beyond looking up the word's address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, n);
    }
}

/// The kernel's futex under loom: compare-and-sleep is atomic with respect to wake (one lock
/// and one condition variable for every word; a wake-up wakes all, and callers re-check).
/// The timeout is not modelled: a sleeper wakes only when rung, so a lost wake-up is a
/// deadlock that loom reports.
#[cfg(loom)]
mod model {
    use loom::sync::{Condvar, Mutex};

    loom::lazy_static! {
        pub(super) static ref KERNEL: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());
    }
}

/// Sleeps while `*word == expected` (loom's model of the kernel futex).
#[cfg(loom)]
pub fn futex_wait(word: &AtomicU32, expected: u32, _timeout: Option<Duration>) {
    let (lock, cv) = &*model::KERNEL;
    let g = lock.lock().unwrap_or_else(|e| e.into_inner());
    if word.load(crate::sync::Ordering::SeqCst) == expected {
        drop(cv.wait(g));
    }
}

/// Wakes the sleepers (loom's model of the kernel futex).
#[cfg(loom)]
pub fn futex_wake(_word: &AtomicU32, _n: i32) {
    let (lock, cv) = &*model::KERNEL;
    let _g = lock.lock().unwrap_or_else(|e| e.into_inner());
    cv.notify_all();
}

/// Without a futex (other systems): yield instead of sleeping.
#[cfg(all(not(target_os = "linux"), not(loom)))]
pub fn futex_wait(_word: &AtomicU32, _expected: u32, _timeout: Option<Duration>) {
    std::thread::yield_now();
}

/// Without a futex: nothing to wake.
#[cfg(all(not(target_os = "linux"), not(loom)))]
pub fn futex_wake(_word: &AtomicU32, _n: i32) {}
