//! One-sided operations of a NIC that maps its peers' segments into this process (sci's
//! imported segments, extoll's registered ones): a put is one copy into the target's memory,
//! a get one copy out of it, an atomic one atomic instruction on its word, all complete when
//! they return, with no message and no help from the target. A NIC's `Transport::put`,
//! `get`, `atomic` and `atomics` are these, over its [`MappedPeers`].

use am_core::atomic::{apply_batch, Atomic, Batch, Posted};
use am_core::{Rank, SendError, SharedBytes};

/// A NIC that reaches its peers' segments as memory of this process.
pub trait MappedPeers {
    /// `rank`'s segment as this rank maps it: an error naming the rank if there is no such
    /// rank, or it is gone.
    fn peer_segment(&self, rank: Rank) -> Result<SharedBytes<'_>, SendError>;
}

/// Writes `data` at `offset` of `dest`'s segment ([`am_core::Transport::put`]).
pub fn put(
    nic: &impl MappedPeers,
    dest: Rank,
    offset: usize,
    data: &[u8],
) -> Result<(), SendError> {
    am_core::rma::put_into(dest, nic.peer_segment(dest)?, offset, data)
}

/// Copies `len` bytes at `local` of this rank's segment (`own`) to `offset` of `dest`'s,
/// one copy between the two mappings ([`am_core::Transport::put_from_segment`]).
pub fn put_from_segment(
    nic: &impl MappedPeers,
    own: SharedBytes<'_>,
    dest: Rank,
    offset: usize,
    local: usize,
    len: usize,
) -> Result<(), SendError> {
    am_core::rma::copy_to(dest, nic.peer_segment(dest)?, offset, own, local, len)
}

/// Copies `len` bytes at `offset` of `src`'s segment to `local` of this rank's (`own`), one
/// copy between the two mappings ([`am_core::Transport::get_into_segment`]).
pub fn get_into_segment(
    nic: &impl MappedPeers,
    own: SharedBytes<'_>,
    src: Rank,
    offset: usize,
    local: usize,
    len: usize,
) -> Result<(), SendError> {
    am_core::rma::copy_from(src, nic.peer_segment(src)?, offset, own, local, len)
}

/// Writes `data` into the regions (offset, length) of `dest`'s segment, in order
/// ([`am_core::Transport::put_regions`]): the segment looked up once, then one copy per
/// region.
pub fn put_regions(
    nic: &impl MappedPeers,
    dest: Rank,
    regions: am_core::rma::Regions<'_>,
    data: &[u8],
) -> Result<(), SendError> {
    let segment = nic.peer_segment(dest)?;
    for (offset, bytes) in regions.pieces(data)? {
        am_core::rma::put_into(dest, segment, offset, bytes)?;
    }
    Ok(())
}

/// Reads the regions (offset, length) of `src`'s segment into `dst`, in order
/// ([`am_core::Transport::get_regions`]): the segment looked up once, then one copy per
/// region.
pub fn get_regions(
    nic: &impl MappedPeers,
    src: Rank,
    regions: am_core::rma::Regions<'_>,
    dst: &mut [u8],
) -> Result<(), SendError> {
    let segment = nic.peer_segment(src)?;
    for (offset, into) in regions.pieces_mut(dst)? {
        am_core::rma::get_from(src, segment, offset, into)?;
    }
    Ok(())
}

/// Reads `dst.len()` bytes at `offset` of `src`'s segment ([`am_core::Transport::get`]).
pub fn get(
    nic: &impl MappedPeers,
    src: Rank,
    offset: usize,
    dst: &mut [u8],
) -> Result<(), SendError> {
    am_core::rma::get_from(src, nic.peer_segment(src)?, offset, dst)
}

/// Applies `atomic` to the word at `offset` of `dest`'s segment: its old value
/// ([`am_core::Transport::atomic`]).
pub fn atomic(
    nic: &impl MappedPeers,
    dest: Rank,
    offset: usize,
    atomic: Atomic,
) -> Result<u64, SendError> {
    atomic.apply_to(dest, nic.peer_segment(dest)?, offset)
}

/// Applies a batch of posted atomics in order ([`am_core::Transport::atomics`]).
pub fn atomics(nic: &impl MappedPeers, batch: &[Posted]) -> Batch {
    let applied = apply_batch(batch, |d| nic.peer_segment(d));
    Batch::all(batch.len(), applied)
}
