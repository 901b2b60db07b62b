//! The key-value store a launcher offers its ranks, whatever protocol serves it.

use crate::error::BootstrapError;

/// The key-value store a launcher offers to the ranks of a job (PMI).
///
/// Keys are `[A-Za-z0-9_/-]+`, at most 64 bytes; values are 1 to 1024 bytes of
/// printable ASCII without space, `;` and `\` (encode binary data, e.g. as hex).
/// These are the limits every PMI-1 and PMI-2 server honours; anything else is
/// rejected with [`BootstrapError::InvalidEntry`] before it is sent.
pub trait KeyValueStore {
    /// Stores `value` under `key`; visible to other ranks after the next [`fence`](Self::fence).
    fn put(&mut self, key: &str, value: &str) -> Result<(), BootstrapError>;
    /// Commit own puts and wait until every rank has committed (PMI-1 barrier / PMI-2 fence).
    fn fence(&mut self) -> Result<(), BootstrapError>;
    /// Reads a key put by any rank before the last fence.
    fn get(&mut self, key: &str) -> Result<String, BootstrapError>;
    /// Ask the launcher to end the whole job with this exit code (PMI `abort`).
    ///
    /// The message is printed to this rank's stderr. Under PMI-2 the exit code
    /// cannot be sent (hydra 4.0 then ends the job with 255). The caller should
    /// exit (or wait to be killed) afterwards; the store is closed.
    fn abort(&mut self, code: i32, message: &str) -> Result<(), BootstrapError>;
    /// Tells the launcher this rank is done with the store (PMI `finalize`).
    ///
    /// Done automatically on drop unless the thread is panicking. Hydra ends
    /// the whole job when a rank exits without finalizing, so drop the
    /// [`JobInfo`](crate::JobInfo) before `std::process::exit`.
    fn finalize(&mut self) -> Result<(), BootstrapError> {
        Ok(())
    }
}
