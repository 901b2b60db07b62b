//! The watchdog every blocking test of this crate runs under.

use std::sync::mpsc;
use std::time::Duration;

/// Runs `f` on its own thread; panics if it has not finished within `limit` (the thread is
/// then left behind, and dies with the process), and re-raises its panic.
pub fn within<R: Send + 'static>(limit: Duration, f: impl FnOnce() -> R + Send + 'static) -> R {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(r)) => r,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(e) => panic!("the job did not finish within {limit:?} ({e}): a rank hangs"),
    }
}
