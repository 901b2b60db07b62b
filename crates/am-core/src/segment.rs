//! Segments as values: memory a rank creates while it runs, publishes on a team, and frees
//! (GASNet-EX's `gex_Segment_Create` and `gex_EP_BindSegment`, UCX's `ucp_mem_map` and
//! remote keys).
//!
//! Segment 0 ([`SegmentId::ZERO`], [`crate::Node::segment`]) is the one every rank gets
//! when the job connects, the same size everywhere. Any other is created by one rank with
//! [`crate::Node::create_segment`], of any size, and is bound to that rank's endpoint. Its
//! bytes are this rank's at once ([`crate::Node::segment_at`]); peers reach it once it is
//! published on a team they belong to ([`crate::Node::publish_segment`], collective: each
//! member publishes one of its segments and gets every member's as a [`RemoteSegment`]).
//! Puts, gets and atomics then name it: [`crate::Node::put_to`],
//! [`crate::Node::get_from`], [`crate::Node::atomic_at`].
//!
//! # Checks
//! A [`RemoteSegment`] is made only by a publication, and the endpoint remembers what each
//! rank published: an operation on a segment that was never published here, or was freed
//! since, is [`crate::AmError::UnknownSegment`] before anything is sent, and a range past
//! the length the owner published is [`crate::AmError::SegmentOutOfBounds`]. The owner
//! checks again when the operation arrives: a segment freed meanwhile (an operation racing
//! the free), or a peer naming a segment it never learned of, is refused with nothing
//! written, and the initiator gets [`crate::AmError::UnknownSegment`] naming the owner.
//!
//! # How bytes move
//! Operations on segment 0 use the transport's own path ([`crate::Node::put`]). Those on
//! another segment go as system messages that the owner's progress applies (one Medium per
//! `max_medium` bytes of a put or get), on every transport; an operation on this rank's own
//! segment is a copy, complete when started. A created segment is an anonymous shared
//! memory file (a `memfd`), all zero, unmapped when freed.
//!
//! # Freeing
//! [`crate::Node::free_segment`] is collective over the team the segment was published on:
//! every member frees one of its segments, and every member forgets the ones freed. Complete
//! the operations on a segment before freeing it: one still in flight when its owner frees
//! it fails with [`crate::AmError::UnknownSegment`], and writes nothing.

use std::collections::HashMap;

use crate::error::AmError;
use crate::types::Rank;

/// Which of a rank's segments: [`SegmentId::ZERO`] is the segment made when the job
/// connected; others come from [`crate::Node::create_segment`], numbered from 1 by each rank
/// and never reused while the endpoint lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SegmentId(u32);

impl SegmentId {
    /// Segment 0: the one every rank has from the start ([`crate::Node::segment`]).
    pub const ZERO: SegmentId = SegmentId(0);

    /// The id's number (as the wire carries it).
    pub fn get(self) -> u32 {
        self.0
    }

    pub(crate) fn new(id: u32) -> SegmentId {
        SegmentId(id)
    }
}

impl std::fmt::Display for SegmentId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A peer's segment as this rank may use it: its owner, its id there and its length
/// (a remote key). Made only by [`crate::Node::publish_segment`]; valid until the owner
/// frees it ([`crate::Node::free_segment`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteSegment {
    rank: Rank,
    id: SegmentId,
    len: usize,
}

/// Bytes of one [`RemoteSegment`] in an operation's outcome, and of one member's block in a
/// publication (id, a word of zero, length).
pub(crate) const REMOTE_LEN: usize = 16;

impl RemoteSegment {
    /// The rank that owns it.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Its id at its owner.
    pub fn id(&self) -> SegmentId {
        self.id
    }

    /// Its length in bytes, as its owner published it.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every member's segment from the bytes a publication completed with: `None` unless
    /// they are whole entries.
    pub(crate) fn list_from_bytes(b: &[u8]) -> Option<Vec<RemoteSegment>> {
        if !b.len().is_multiple_of(REMOTE_LEN) {
            return None;
        }
        b.chunks_exact(REMOTE_LEN)
            .map(|e| {
                let word = |i: usize| u32::from_le_bytes([e[i], e[i + 1], e[i + 2], e[i + 3]]);
                let len = u64::from_le_bytes(e[8..16].try_into().ok()?);
                Some(RemoteSegment {
                    rank: word(0),
                    id: SegmentId(word(4)),
                    len: usize::try_from(len).ok()?,
                })
            })
            .collect()
    }

    fn push_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.rank.to_le_bytes());
        out.extend_from_slice(&self.id.0.to_le_bytes());
        out.extend_from_slice(&(self.len as u64).to_le_bytes());
    }
}

/// One member's block of a publication: the id and length of the segment it publishes.
pub(crate) fn publish_block(id: SegmentId, len: usize) -> [u8; REMOTE_LEN] {
    let mut b = [0; REMOTE_LEN];
    b[..4].copy_from_slice(&id.0.to_le_bytes());
    b[8..].copy_from_slice(&(len as u64).to_le_bytes());
    b
}

/// What a rank knows of segments: its own beyond segment 0, and the length of each peer's
/// that was published to it.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    /// This rank's created segments, by id.
    pub(crate) own: HashMap<u32, am_shm::Segment>,
    /// The next id to hand out (ids are never reused).
    next: u32,
    /// Peers' segments published here: (owner, id) to length.
    pub(crate) known: HashMap<(Rank, u32), usize>,
}

impl Segments {
    /// Creates a segment of `len` bytes, all zero: its id.
    pub(crate) fn create(&mut self, rank: Rank, len: usize) -> Result<SegmentId, AmError> {
        let failed = |why: String| AmError::SegmentNotCreated { len, why };
        let id = self
            .next
            .checked_add(1)
            .ok_or_else(|| failed("every segment id of this endpoint was used".into()))?;
        let name = format!("am-seg-{rank}-{id}");
        let seg =
            am_shm::Segment::create_anonymous(&name, 0, len).map_err(|e| failed(e.to_string()))?;
        self.next = id;
        self.own.insert(id, seg);
        Ok(SegmentId(id))
    }

    /// The length of this rank's segment `id` (not 0), if it has one.
    pub(crate) fn own_len(&self, id: SegmentId) -> Option<usize> {
        self.own.get(&id.0).map(|s| s.bytes_len())
    }

    /// The bytes of this rank's segment `id` (not 0).
    pub(crate) fn own_bytes(&self, id: u32) -> Option<am_shm::SharedBytes<'_>> {
        self.own.get(&id).map(|s| s.byte_area())
    }

    /// Applies a completed publication on a team whose members, in team order, are
    /// `members`: every member's (id, length), remembered, and the outcome's bytes.
    pub(crate) fn published(&mut self, members: &[Rank], blocks: &[u8]) -> Option<Vec<u8>> {
        if blocks.len() != members.len() * REMOTE_LEN {
            return None;
        }
        let mut out = Vec::with_capacity(blocks.len());
        for (&rank, b) in members.iter().zip(blocks.chunks_exact(REMOTE_LEN)) {
            let id = u32::from_le_bytes(b[..4].try_into().ok()?);
            let len = usize::try_from(u64::from_le_bytes(b[8..].try_into().ok()?)).ok()?;
            self.known.insert((rank, id), len);
            RemoteSegment {
                rank,
                id: SegmentId(id),
                len,
            }
            .push_to(&mut out);
        }
        Some(out)
    }

    /// Applies a completed free on a team whose members, in team order, are `members`: each
    /// member's freed id (4 bytes each) is forgotten, and this rank's own `mine` unmapped.
    pub(crate) fn freed(&mut self, members: &[Rank], blocks: &[u8], mine: SegmentId) -> bool {
        self.own.remove(&mine.0);
        if blocks.len() != members.len() * 4 {
            return false;
        }
        for (&rank, b) in members.iter().zip(blocks.chunks_exact(4)) {
            let id = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            self.known.remove(&(rank, id));
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publication_round_trips_through_its_bytes() {
        // Catches an entry's fields swapped or cut between the block, the table and the
        // outcome.
        let mut s = Segments::default();
        let mut blocks = Vec::new();
        blocks.extend_from_slice(&publish_block(SegmentId(3), 4096));
        blocks.extend_from_slice(&publish_block(SegmentId::ZERO, 1 << 40));
        let out = s.published(&[7, 2], &blocks).unwrap();
        let list = RemoteSegment::list_from_bytes(&out).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(
            (list[0].rank(), list[0].id(), list[0].len()),
            (7, SegmentId(3), 4096)
        );
        assert_eq!(
            (list[1].rank(), list[1].id(), list[1].len()),
            (2, SegmentId(0), 1 << 40)
        );
        assert_eq!(s.known.get(&(7, 3)), Some(&4096));
        // A short list is refused, not read past its end.
        assert!(s.published(&[7, 2, 9], &blocks).is_none());
        assert!(RemoteSegment::list_from_bytes(&out[..20]).is_none());
    }

    #[test]
    fn ids_are_never_reused_and_a_free_forgets() {
        // Catches a freed id handed out again (an old RemoteSegment would then reach new
        // memory) and a free that leaves a peer's entry behind.
        let mut s = Segments::default();
        let a = s.create(0, 64).unwrap();
        let b = s.create(0, 128).unwrap();
        assert_ne!(a, b);
        assert_eq!(s.own_len(b), Some(128));
        s.known.insert((1, 5), 64);
        let mut blocks = Vec::new();
        blocks.extend_from_slice(&a.get().to_le_bytes());
        blocks.extend_from_slice(&5u32.to_le_bytes());
        assert!(s.freed(&[0, 1], &blocks, a));
        assert!(s.own_len(a).is_none() && !s.known.contains_key(&(1, 5)));
        let c = s.create(0, 64).unwrap();
        assert!(c != a && c != b);
    }
}
