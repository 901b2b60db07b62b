//! Shared memory for amnet's simulated NICs: the fenced `unsafe` code of the shared-memory
//! boundary (am-pmix fences libpmix's; every other crate forbids `unsafe`).
//!
//! - [`Segment`]: a region named by job id (`/dev/shm/am-<job_id>-<name>`), created, opened and
//!   removed by job, or backed by heap memory (so Miri and loom run the same code). A region
//!   has a **word area** (64-bit atomics, and 32-bit futex words on lines of their own) and a
//!   **byte area** (payloads). Sizes are computed with checked arithmetic in every build.
//! - [`SharedBytes`]: the only way to the byte area. Memory a peer can write is never lent as
//!   `&[u8]`/`&mut [u8]`; a `SharedBytes` reads and writes it by copies made of 8-byte relaxed
//!   atomics on the aligned words that hold it (a partial word is read whole, or merged with a
//!   compare-and-swap), so no byte is ever accessed non-atomically or at two sizes, whatever a
//!   peer does meanwhile. Parse a private copy, never the shared original.
//! - [`Imported`]: a peer's view of a segment, with writes only (SCI's "remote writes, local
//!   reads"): stores to words, copies into bytes; it has no read.
//! - [`WordRun`]: a run of a segment's word area checked once, when made, that keeps the
//!   mapping alive, so a NIC can cut a peer's runs at start-up and keep them.
//! - [`stamp`]: the slot hand-over, in crossbeam's `ArrayQueue` order: claim (by the caller's
//!   own bookkeeping), write the bytes, publish with a `Release` store of a stamp; the reader
//!   loads the stamp with `Acquire` before it copies the bytes out. For a hot path,
//!   [`stamp::SlotReader`] and [`stamp::SlotWriter`] check a set of slots against a segment
//!   once, so that each access compares only the slot index (and a peer-written length); a
//!   [`WordRun`] does the same for words of the word area.
//! - [`SpscRing`]: a ring of variable-size records with one writer and one reader (its
//!   bytes, its reader's head word and futex word), checked once when made, so that its hot
//!   path needs no bounds checks.
//! - [`claim`]: the claimed ring, a ring that producers of several processes claim slot by
//!   slot, each claim a compare-and-swap that names its claimer, so a dead claimer's slot can
//!   be told and skipped; the Portals event queue is one.
//! - [`mailbox`]: the claimed ring of VELO's mailbox, with payloads, multi-slot claims and
//!   checked-once handles for its senders and owner.
//! - [`Doorbell`]: a 32-bit flag word with a futex, so a receiver sleeps until a sender rings
//!   it, across processes, with no lost wake-up and no system call on the sender's fast path.
//! - [`floor`]: the raw floors the benchmarks compare against (cache-line ping-pong, copy
//!   bandwidth), between two processes or two threads.
//! - [`sync`]: the atomics all of the above use, loom's under `cfg(loom)`, so the loom models
//!   run this crate's code and the NIC code built on it, not copies of it; and
//!   [`sync::AsymmetricFence`], a fence pair for threads of one process whose frequent side
//!   costs no instruction (`membarrier` on the other).
//!
//! # What the crate trusts
//! Nothing it reads from shared memory: lengths, offsets, stamps, heads and tails are checked
//! before use and a corrupt value is an error ([`ShmError`]), never a panic or an
//! out-of-bounds access; bytes are only ever copied, so a peer that rewrites them while they
//! are read yields garbage bytes at worst, never undefined behaviour. Files are created with
//! `O_EXCL`, mode 0600, under a name only the job knows.
//!
//! What this crate does **not** do: it has no message format, no NIC model and no knowledge
//! of ranks; it does not clean up after a killed process (the NIC crates sweep dead jobs'
//! files); it runs only on Linux (futex).

#![warn(missing_docs)]
#![deny(unsafe_op_in_unsafe_fn)]

pub mod claim;
pub mod doorbell;
#[cfg(not(loom))]
pub mod floor;
mod futex;
pub mod mailbox;
mod mapping;
#[cfg(not(loom))]
pub mod portal;
pub mod segment;
mod shared;
pub mod spsc;
pub mod stamp;
pub mod sync;

pub use doorbell::{Doorbell, Rung};
pub use futex::{futex_wait, futex_wake};
pub use segment::{Imported, Segment, Slot, WordRun, CACHE_LINE};
pub use shared::SharedBytes;
pub use spsc::SpscRing;

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
    /// A layout whose size overflows or cannot be allocated.
    #[error("a segment of {len} bytes is too large")]
    TooLarge {
        /// The requested size (saturated).
        len: usize,
    },
    /// An atomic word at an offset that is not 8-aligned in memory.
    #[error("offset {offset} is not 8-aligned")]
    Misaligned {
        /// The offset.
        offset: usize,
    },
    /// A word read from shared memory holds a value its protocol never writes: a peer (or a
    /// stray write) corrupted it.
    #[error("corrupt {what}: {value:#x}")]
    Corrupt {
        /// Which word.
        what: &'static str,
        /// The value found.
        value: u64,
    },
}

impl From<ShmError> for std::io::Error {
    fn from(e: ShmError) -> Self {
        match e {
            ShmError::Io { source, .. } => source,
            other => std::io::Error::new(std::io::ErrorKind::InvalidData, other),
        }
    }
}
