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
//! written, and the initiator gets [`crate::AmError::UnknownSegment`] naming the owner. A
//! segment a peer maps carries a word its owner sets when freeing it, which the peer reads
//! before each operation: the same error, for an operation that starts after the free.
//!
//! # How bytes move
//! Operations on segment 0 use the transport's own path ([`crate::Node::put`]). A created
//! segment is an anonymous shared memory file (a `memfd`), all zero, its size sealed, and
//! unmapped when freed. Where the transport's peers are processes of this host
//! ([`crate::Capabilities::map_segments`]: loopback, sci, extoll, portals) the publication
//! carries the file's handle, and the first operation on a peer's segment maps it (after
//! checking that the file is that segment): a put, get or atomic on it is then a copy or
//! an atomic instruction by the initiator, complete when it returns, with no message and
//! no help from the owner. A segment that does not map is reached by messages. Elsewhere (udp, ofi) they go as
//! system messages that the owner's progress applies, one Medium per `max_medium` bytes. An
//! operation on this rank's own segment is a copy, complete when started.
//!
//! Memory a program allocated itself cannot become a segment on the shared-memory NICs:
//! their peers reach a segment by mapping its file, so the library allocates it.
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

/// Bytes of one [`RemoteSegment`] in an operation's outcome (rank, id, length).
pub(crate) const REMOTE_LEN: usize = 16;

/// Bytes of one member's block in a publication: the segment's id, its key's length, its
/// length, and its key (where peers map created segments, the memory file's handle).
pub(crate) const BLOCK_LEN: usize = 64;

/// The longest key a publication block carries.
const MAX_KEY: usize = BLOCK_LEN - 16;

/// Bytes of control words before a created segment's bytes: word 0 is set when its owner
/// frees it, so that a peer that mapped it refuses later operations. A whole page, so that
/// the bytes start on a page boundary as segment 0's do: a copy into a range whose offset
/// within its pages differs from the source's runs measurably slower.
const CONTROL_WORDS: usize = 4096;

/// The key of a peer's segment in [`Segments::known`]: its owner and its id.
fn known_key(rank: Rank, id: u32) -> u64 {
    u64::from(rank) << 32 | u64::from(id)
}

/// The hash of a [`known_key`] (Fibonacci hashing: one multiplication). Every operation on a
/// peer's segment looks one up, where a keyed hash would cost more than the rest of a small
/// put; a peer chooses only the ids it publishes, one per publication, so it cannot flood
/// the table with colliding keys.
#[derive(Default)]
pub(crate) struct SegmentKeys(u64);

impl std::hash::Hasher for SegmentKeys {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

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

/// One member's block of a publication: the id and length of the segment it publishes, and
/// the key peers map it by (empty: none).
pub(crate) fn publish_block(id: SegmentId, len: usize, key: Option<&str>) -> [u8; BLOCK_LEN] {
    let key = key.filter(|k| k.len() <= MAX_KEY).unwrap_or("").as_bytes();
    let mut b = [0; BLOCK_LEN];
    b[..4].copy_from_slice(&id.0.to_le_bytes());
    b[4..8].copy_from_slice(&(key.len() as u32).to_le_bytes());
    b[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    b[16..16 + key.len()].copy_from_slice(key);
    b
}

/// A peer's segment published here.
#[derive(Debug)]
pub(crate) struct Known {
    /// Its length, as its owner published it.
    pub(crate) len: usize,
    /// The key it is mapped by, where this rank maps peers' created segments, until the
    /// first operation on it maps it.
    key: Option<String>,
    /// Its memory, once an operation tried to map it (`None` inside: it did not open, and
    /// messages reach it).
    mapped: Option<Option<am_shm::Segment>>,
}

/// The name a created segment's memory file has: unique on the host while its owner lives
/// (ids are never reused, and ranks are distinct), so that a peer checks that the file it
/// opened by handle is that segment.
fn segment_name(rank: Rank, id: u32) -> String {
    format!("am-seg-{rank}-{id}")
}

/// What a rank knows of segments: its own beyond segment 0, and each peer's published to it.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    /// This rank's created segments, by id.
    own: HashMap<u32, am_shm::Segment>,
    /// The next id to hand out (ids are never reused).
    next: u32,
    /// Peers' segments published here, by (owner, id).
    pub(crate) known: HashMap<u64, Known, std::hash::BuildHasherDefault<SegmentKeys>>,
}

impl Segments {
    /// Creates a segment of `len` bytes, all zero: its id.
    pub(crate) fn create(&mut self, rank: Rank, len: usize) -> Result<SegmentId, AmError> {
        let failed = |why: String| AmError::SegmentNotCreated { len, why };
        let id = self
            .next
            .checked_add(1)
            .ok_or_else(|| failed("every segment id of this endpoint was used".into()))?;
        let seg = am_shm::Segment::create_anonymous(&segment_name(rank, id), CONTROL_WORDS, len)
            .map_err(|e| failed(e.to_string()))?;
        self.next = id;
        self.own.insert(id, seg);
        Ok(SegmentId(id))
    }

    /// The length of this rank's segment `id` (not 0), if it has one.
    pub(crate) fn own_len(&self, id: SegmentId) -> Option<usize> {
        self.own.get(&id.0).map(|s| s.bytes_len())
    }

    /// The key peers map this rank's segment `id` by (its memory file's handle).
    pub(crate) fn own_key(&self, id: SegmentId) -> Option<String> {
        self.own.get(&id.0).and_then(|s| s.handle())
    }

    /// The bytes of this rank's segment `id` (not 0).
    pub(crate) fn own_bytes(&self, id: u32) -> Option<am_shm::SharedBytes<'_>> {
        self.own.get(&id).map(|s| s.byte_area())
    }

    /// The length of `rank`'s segment `id` published here.
    pub(crate) fn known_len(&self, rank: Rank, id: SegmentId) -> Option<usize> {
        self.known.get(&known_key(rank, id.0)).map(|k| k.len)
    }

    /// The bytes of `rank`'s segment `id` as this rank maps it (mapped by the first call):
    /// `None` if it does not map it, `Some(Err(()))` if its owner has freed it since.
    pub(crate) fn mapped(
        &mut self,
        rank: Rank,
        id: SegmentId,
    ) -> Option<Result<am_shm::SharedBytes<'_>, ()>> {
        let known = self.known.get_mut(&known_key(rank, id.0))?;
        if known.mapped.is_none() {
            let key = known.key.take()?;
            let name = segment_name(rank, id.0);
            known.mapped = Some(
                am_shm::Segment::open_handle_named(&key, &name, CONTROL_WORDS, known.len).ok(),
            );
        }
        let seg = known.mapped.as_ref()?.as_ref()?;
        Some(match seg.load_word(0) {
            Ok(0) => Ok(seg.byte_area()),
            _ => Err(()),
        })
    }

    /// Applies a completed publication on a team whose members, in team order, are
    /// `members`: every member's (id, length) remembered (and, where `map`, every peer's
    /// key, by which its first operation maps it; one that does not open is reached by
    /// messages), and the outcome's bytes.
    pub(crate) fn published(
        &mut self,
        me: Rank,
        members: &[Rank],
        blocks: &[u8],
        map: bool,
    ) -> Option<Vec<u8>> {
        if blocks.len() != members.len() * BLOCK_LEN {
            return None;
        }
        let mut out = Vec::with_capacity(members.len() * REMOTE_LEN);
        for (&rank, b) in members.iter().zip(blocks.chunks_exact(BLOCK_LEN)) {
            let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            let (id, key_len) = (word(0), word(4) as usize);
            let len = usize::try_from(u64::from_le_bytes(b[8..16].try_into().ok()?)).ok()?;
            let key = b
                .get(16..16 + key_len.min(MAX_KEY))
                .and_then(|k| std::str::from_utf8(k).ok())
                .filter(|k| map && rank != me && id != 0 && !k.is_empty())
                .map(str::to_owned);
            if rank != me && id != 0 {
                let known = Known {
                    len,
                    key,
                    mapped: None,
                };
                self.known.insert(known_key(rank, id), known);
            }
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
    /// member's freed id (4 bytes each) is forgotten (and unmapped), and this rank's own
    /// `mine` marked freed for the peers that map it, then unmapped here.
    pub(crate) fn freed(&mut self, members: &[Rank], blocks: &[u8], mine: SegmentId) -> bool {
        if let Some(seg) = self.own.remove(&mine.0) {
            if let Ok(w) = seg.word(0) {
                w.store(1, std::sync::atomic::Ordering::Release);
            }
        }
        if blocks.len() != members.len() * 4 {
            return false;
        }
        for (&rank, b) in members.iter().zip(blocks.chunks_exact(4)) {
            let id = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            self.known.remove(&known_key(rank, id));
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
        // outcome, and a key longer than a block overrunning it.
        let mut s = Segments::default();
        let mut blocks = Vec::new();
        blocks.extend_from_slice(&publish_block(SegmentId(3), 4096, None));
        blocks.extend_from_slice(&publish_block(
            SegmentId(9),
            1 << 40,
            Some(&"x".repeat(200)),
        ));
        blocks.extend_from_slice(&publish_block(SegmentId(1), 8, None));
        let out = s.published(2, &[7, 5, 2], &blocks, false).unwrap();
        let list = RemoteSegment::list_from_bytes(&out).unwrap();
        let got: Vec<_> = list
            .iter()
            .map(|r| (r.rank(), r.id().get(), r.len()))
            .collect();
        assert_eq!(got, [(7, 3, 4096), (5, 9, 1 << 40), (2, 1, 8)]);
        assert_eq!(s.known_len(7, SegmentId(3)), Some(4096));
        assert!(
            s.known_len(2, SegmentId(1)).is_none(),
            "its own is not a peer's"
        );
        assert!(
            s.mapped(7, SegmentId(3)).is_none(),
            "nothing mapped without keys"
        );
        // A short list is refused, not read past its end.
        assert!(s.published(2, &[7, 2, 9, 1], &blocks, false).is_none());
        assert!(RemoteSegment::list_from_bytes(&out[..20]).is_none());
    }

    #[cfg(not(miri))]
    #[test]
    fn a_mapped_segment_is_refused_once_its_owner_frees_it() {
        // Catches a peer's mapping that keeps taking writes after its owner freed the
        // segment, and a key that maps other memory than the segment published: another
        // length, or another segment's file (a descriptor reused).
        let mut owner = Segments::default();
        let id = owner.create(0, 100).unwrap();
        let other = owner.create(0, 100).unwrap();
        let key = owner.own_key(id).unwrap();
        let mut peer = Segments::default();
        peer.published(1, &[0], &publish_block(id, 100, Some(&key)), true)
            .unwrap();
        let view = peer.mapped(0, id).unwrap().unwrap();
        view.write(90, b"0123456789").unwrap();
        let mut back = [0u8; 10];
        owner
            .own_bytes(id.get())
            .unwrap()
            .read(90, &mut back)
            .unwrap();
        assert_eq!(&back, b"0123456789");
        for (len, key) in [(200, key.clone()), (100, owner.own_key(other).unwrap())] {
            let mut wrong = Segments::default();
            wrong
                .published(1, &[0], &publish_block(id, len, Some(&key)), true)
                .unwrap();
            assert!(wrong.mapped(0, id).is_none(), "{len} bytes by {key}");
            assert_eq!(
                wrong.known_len(0, id),
                Some(len),
                "still reached by messages"
            );
        }
        owner.freed(&[0], &id.get().to_le_bytes(), id);
        assert!(peer.mapped(0, id).unwrap().is_err(), "freed by its owner");
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
        s.published(0, &[1], &publish_block(SegmentId(5), 64, None), false)
            .unwrap();
        let mut blocks = Vec::new();
        blocks.extend_from_slice(&a.get().to_le_bytes());
        blocks.extend_from_slice(&5u32.to_le_bytes());
        assert!(s.freed(&[0, 1], &blocks, a));
        assert!(s.own_len(a).is_none() && s.known_len(1, SegmentId(5)).is_none());
        let c = s.create(0, 64).unwrap();
        assert!(c != a && c != b);
    }
}
