//! Shared memory for amnet's simulated NICs: the workspace's only `unsafe` code.
//!
//! - [`Segment`]: a region named by job id (`/dev/shm/am-<job_id>-<name>`), created, opened and
//!   removed by job, or backed by heap memory (so Miri and loom can run the same logic). A
//!   region has a **word area** (8-byte words, touched only as atomics) and a **byte area**
//!   (payloads, touched only by bounds-checked copies); the two never overlap, so no location
//!   is ever accessed both atomically and non-atomically. The one exception is by design: a
//!   slot's message-ready flag (see [`stamp`]) is a word at the start of the slot in the byte
//!   area, so that it shares a cache line with the message; it is only ever accessed
//!   atomically, and slot copies start after it.
//! - [`Imported`]: a peer's view of a segment, with writes only (SCI's "remote writes, local
//!   reads"): stores to words and copies into bytes; it neither has nor makes any read.
//! - [`stamp`]: the slot hand-over, in crossbeam's `ArrayQueue` order: claim (by the caller's
//!   own bookkeeping), write the bytes, publish with a `Release` store of a stamp; the reader
//!   loads the stamp with `Acquire` before it reads the bytes.
//! - [`Doorbell`]: a 32-bit flag word with a futex, so a receiver sleeps until a sender rings
//!   it, across processes, with no lost wake-up and no system call on the sender's fast path.
//!   `Doorbell::ring_tagged_lazy` (read before write) is for rings of a word the caller may
//!   read; a remote (imported) doorbell is always rung with a write.
//! - [`floor`]: the raw floors the benchmarks compare against (cache-line ping-pong, copy
//!   bandwidth), between two processes or two threads.
//!
//! # What the crate trusts
//! Everything *read* from shared memory (lengths, offsets, stamps) is checked before use: a
//! corrupt value is an error, never a panic or an out-of-bounds access. What it cannot check
//! is *when* other processes write: bytes lent out as `&[u8]` (a received slot, the AM
//! segment) stay unchanged only because the processes of a job follow the hand-over protocol
//! of the NIC model on top (a slot is rewritten only after its reader handed it back). This
//! is the trust memmap2 places in a mapped file; here the file is created with `O_EXCL`, mode
//! 0600, under a name only the job knows, and only ranks of that job map it.
//!
//! What this crate does **not** do: it has no message format, no NIC model and no knowledge
//! of ranks; it does not clean up after a killed process (the launcher removes
//! `/dev/shm/am-<job_id>-*`); it runs only on Linux (futex); it does not protect a job from a
//! rank that deliberately scribbles over a segment.

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod doorbell;
pub mod floor;
mod futex;
pub mod mailbox;
pub mod portal;
pub mod segment;
pub mod stamp;

pub use doorbell::Doorbell;
pub use futex::{futex_wait, futex_wake};
pub use segment::{Imported, Segment, CACHE_LINE};

/// Why a shared-memory operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// Creating, opening, sizing or mapping the file failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A job id or segment name with characters other than `[A-Za-z0-9_-]`, or empty.
    #[error("invalid segment name {0:?}")]
    BadName(String),
    /// An offset/length outside the area, or a misaligned word offset: possibly a corrupt
    /// value read from shared memory.
    #[error("access of {len} bytes at {offset} outside an area of {area} bytes (or misaligned)")]
    OutOfBounds {
        /// Requested offset.
        offset: usize,
        /// Requested length.
        len: usize,
        /// Size of the area.
        area: usize,
    },
    /// The file is smaller than its header says, or its header is not one of ours.
    #[error("segment {0} is not a valid amnet segment")]
    BadSegment(String),
}

impl From<ShmError> for std::io::Error {
    fn from(e: ShmError) -> Self {
        match e {
            ShmError::Io { source, .. } => source,
            other => std::io::Error::new(std::io::ErrorKind::InvalidData, other),
        }
    }
}
