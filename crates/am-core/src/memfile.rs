//! The memory files of created segments and of typed values' staging segments: their
//! layout (control words, then bytes) and their names, which peers check before they map
//! one ([`am_shm::Segment::open_handle_named`]).

/// Bytes of control words before a created segment's bytes: word 0 is set when its owner
/// frees it, so that a peer that mapped it refuses later operations. A whole page, so that
/// the bytes start on a page boundary as segment 0's do: a copy into a range whose offset
/// within its pages differs from the source's runs measurably slower.
pub(crate) const CONTROL_WORDS: usize = 4096;

/// The name of a created segment's memory file: made of a nonce drawn when it is created,
/// so that a peer that opens a handle can check that the file is that segment, even where
/// its owner closed the descriptor and the number now names another file (of its own, or
/// of another job's ranks in the same process).
pub(crate) fn segment_name(nonce: u64) -> String {
    format!("am-seg-{nonce:016x}")
}

/// A fresh nonce: a randomly keyed hash of a process-wide counter.
pub(crate) fn nonce() -> u64 {
    use std::hash::BuildHasher;
    static DRAWN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = DRAWN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::collections::hash_map::RandomState::new().hash_one(n)
}
