//! futex(2) on a 32-bit word, without `FUTEX_PRIVATE_FLAG`, so it works across processes
//! that map the same file.

use std::sync::atomic::AtomicU32;
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

/// Without a futex (loom models, other systems): yield instead of sleeping.
#[cfg(any(not(target_os = "linux"), loom))]
pub fn futex_wait(_word: &AtomicU32, _expected: u32, _timeout: Option<Duration>) {
    std::thread::yield_now();
}

/// Without a futex: nothing to wake.
#[cfg(any(not(target_os = "linux"), loom))]
pub fn futex_wake(_word: &AtomicU32, _n: i32) {}
