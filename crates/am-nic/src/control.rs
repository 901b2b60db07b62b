//! The control block every simulated NIC keeps at the start of its word area, and the rank's
//! goodbye.
//!
//! ```text
//! line 0   the doorbell: a 32-bit futex word at offset 0 (SCI's message-exist flag, the
//!          VELO mailbox's and the event queue's wake-up word), the rest of the line the NIC's
//! line 1   the abort word: a rank that panicked sets it, and every rank's next wait fails
//!          with JobAborted
//! ...      the NIC's own words, and somewhere one departed word per rank (see [`Departed`]):
//!          written only by that rank, when it ends cleanly
//! ```

use am_shm::{Imported, CACHE_LINE};

/// Offset of the doorbell (a 32-bit futex word).
pub const DOORBELL: usize = 0;
/// Offset of the abort word.
pub const ABORT: usize = CACHE_LINE;

/// Where a NIC keeps rank `r`'s departed word: `base + r * stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Departed {
    /// Offset of rank 0's word in the word area.
    pub base: usize,
    /// Bytes between two ranks' words.
    pub stride: usize,
}

impl Departed {
    /// Offset of rank `r`'s departed word.
    #[inline]
    pub fn of(&self, r: usize) -> usize {
        self.base + r * self.stride
    }
}

/// What a rank whose NIC is dropped tells each peer (`peers[r]` is rank `r`'s segment, written
/// only): "rank `me` departed" (so its silence is not taken for death), "the job is aborted"
/// if the thread is panicking, and a ring so that a sleeping peer looks.
pub fn depart<'a>(peers: impl IntoIterator<Item = &'a Imported>, me: usize, departed: Departed) {
    let panicking = std::thread::panicking();
    for (r, peer) in peers.into_iter().enumerate() {
        if r == me {
            continue;
        }
        // The abort word first: a peer that sees this rank departed sees the abort too.
        if panicking {
            let _ = peer.store_word(ABORT, 1);
        }
        let _ = peer.store_word(departed.of(me), 1);
        let _ = peer.ring(DOORBELL);
    }
}
