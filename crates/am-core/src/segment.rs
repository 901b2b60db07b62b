//! Segments as values: memory a rank creates while it runs, publishes on a team, and frees
//! (GASNet-EX's `gex_Segment_Create` and `gex_EP_BindSegment`, UCX's `ucp_mem_map` and
//! remote keys).
//!
//! Segment 0 ([`SegmentId::ZERO`], [`crate::Node::segment`]) is the one every rank gets
//! when the job connects, the same size everywhere. Any other is created by one rank with
//! [`crate::Node::create_segment`], of any size, and is bound to that rank's endpoint. Its
//! bytes are this rank's at once ([`crate::Node::segment_at`]); peers reach it once it is
//! published on a team they belong to ([`crate::Node::publish_segment`], collective: each
//! member publishes one of its segments, segment 0 included, and gets every member's as a
//! [`RemoteSegment`]). Puts, gets and atomics then name it: [`crate::Node::put_to`],
//! [`crate::Node::get_from`], [`crate::Node::get_from_into`], [`crate::Node::atomic_at`].
//! [`crate::Node::put_to_from_segment`] and [`crate::Node::get_from_into_segment`] name
//! both sides, a range of one of this rank's segments (by id and offset) and one of a
//! published segment, so that bytes move between segments with no buffer of the
//! caller's and no borrow of a segment spanning the call.
//!
//! An AM Long request can land its payload in one too ([`crate::Node::request_long_to`]):
//! the payload goes first, as a `put_to`, and the request's head follows once the put is
//! complete, naming the segment; the handler finds the payload there
//! ([`crate::Msg::long_segment`], [`crate::Msg::long_offset`], [`crate::Msg::payload`]).
//! Such a Long is not bounded by the transport's largest Long, and costs the put's
//! completion before its head leaves: nothing where the segment is mapped, a round trip
//! where messages carry the put.
//!
//! # Checks
//! A [`RemoteSegment`] is made by a publication (or cut from one, [`RemoteSegment::range`];
//! or a symmetric block's, [`crate::symmetric::Symmetric::on`]), and the endpoint remembers
//! what each rank published: an operation on a segment that was never published here, or was freed
//! since, is [`crate::AmError::UnknownSegment`] before anything is sent, and a range past
//! the length the owner published is [`crate::AmError::SegmentOutOfBounds`]; through a block of
//! one ([`RemoteSegment::range`]), a range past the block's end is
//! [`crate::AmError::OutOfBlock`] naming the block. Over messages
//! the owner checks again when the operation arrives: a segment it does not hold (freed
//! while the operation was on its way) is refused with nothing written by that message,
//! and the initiator gets [`crate::AmError::UnknownSegment`] naming the owner; a range
//! outside a segment it holds is the initiator's misbehavior. The owner does not check
//! that the initiator was a member of a team the segment was published on. A segment a
//! peer maps carries a word its owner sets when freeing it, which the peer reads before
//! each operation: the same error, for an operation that starts after the free.
//!
//! # How bytes move
//! Operations on segment 0 use the transport's own path ([`crate::Node::put`]). A created segment
//! is an anonymous shared memory file (a `memfd`), all zero, its size sealed, and unmapped when
//! freed. Where the transport's peers are processes of this host
//! ([`crate::Capabilities::map_segments`]: loopback, sci, extoll, portals) the publication carries
//! the file's handle, and the first operation on a peer's segment maps it (after checking that the
//! file is that segment, by a nonce in its name): a put, get or atomic on it is then a copy or an
//! atomic instruction by the initiator, complete when it returns, with no message and no help from
//! the owner. Where the transport registers segments for its RMA instead
//! ([`crate::Capabilities::rma_segments`]: ofi), the owner registers a segment (its control words
//! and its bytes) before its first publication, which carries the key the transport returned; a
//! put, get or atomic on a peer's segment is then the transport's RMA
//! ([`Remote::Keyed`](crate::transport::Remote::Keyed); atomics where the transport applies them,
//! [`crate::Capabilities::atomics`]), complete when it returns, with an RMA read of the segment's
//! freed word in flight beside it (the check a mapping peer makes with a load before each
//! operation): one that finds it set fails with [`crate::AmError::UnknownSegment`], what it wrote
//! landing in memory nobody reads. A key a peer published is its word: one the transport cannot
//! have made is [`crate::AmError::PeerMisbehaved`] naming it. A segment that does not map or did
//! not register, and every created segment elsewhere (udp), is reached by system messages that the
//! owner's progress applies, one Medium per `max_medium` bytes. An operation on this rank's own
//! segment is a copy, complete when started; one of 0 bytes does nothing. Between segments, the
//! bytes go from mapping to mapping wherever this rank reaches both (a created segment here and a
//! peer's segment 0 where the transport copies from a created segment itself:
//! [`Source::Segment`](crate::transport::Source::Segment), on loopback, sci, extoll and portals,
//! and ofi's puts from a published created segment, straight from its registration); elsewhere the
//! local range is read into a buffer that goes as above, or a get's bytes are written into it once
//! they have come.
//!
//! Memory a program allocated itself cannot become a segment on the shared-memory NICs:
//! their peers reach a segment by mapping its file, so the library allocates it.
//!
//! # Freeing
//! [`crate::Node::free_segment`] is collective over the team the segment was published on: every
//! member frees one of its segments (one that published segment 0 frees it as nothing), and every
//! member forgets the ones freed. A member that names a segment it does not hold fails the free on
//! every member, and nothing is freed. Complete the operations on a segment before freeing it: a
//! Long whose head reaches the owner after the free runs no handler, and the owner reports the
//! initiator's misbehavior; over messages, a put still in flight when its owner frees the segment
//! may have written its first pieces and fails with [`crate::AmError::UnknownSegment`]; on a
//! mapping, one that passed its check just before the free writes into memory nobody reads any
//! more. A registered segment's registration ends once it is freed on a team of every rank it was
//! published to (each completed its operations before the free); freed on a smaller team, it stays
//! registered (its memory with the transport) until the transport closes, so that a rank outside
//! that team finds it freed by its freed word rather than an access the transport refuses, which
//! some providers answer by dropping the connection.

use std::collections::HashMap;

use crate::error::AmError;
pub(crate) use crate::memfile::{nonce, segment_name, CONTROL_WORDS};
use crate::types::Rank;
pub use crate::types::SegmentId;

/// A peer's segment as this rank may use it: its owner, its id there and its length
/// (a remote key). Made by [`crate::Node::publish_segment`]; valid until the owner frees it
/// ([`crate::Node::free_segment`]).
///
/// It may also stand for a range of one, a block: [`RemoteSegment::range`] cuts one out of
/// a published segment, and [`crate::symmetric::Symmetric::on`] makes one of a symmetric
/// block on a member. An operation on a block takes offsets from the block's start and is
/// checked against the block's end when it starts (one comparison): one that reaches past
/// it is [`AmError::OutOfBlock`] naming the block, and nothing is done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteSegment {
    rank: Rank,
    id: SegmentId,
    /// The whole segment's length (for a symmetric block, at least the block's end).
    len: usize,
    /// For a block: where it starts in the segment, and its length.
    block: Option<(usize, usize)>,
}

/// Bytes of one [`RemoteSegment`] in an operation's outcome (rank, id, length).
pub(crate) const REMOTE_LEN: usize = 16;

/// Bytes of one member's block in a publication: the segment's id (4), its key's length or
/// [`REFUSED`] (4), its length (8), the nonce of its memory file's name (8), and its key
/// (where peers map created segments, the memory file's handle).
pub(crate) const BLOCK_LEN: usize = 64;

/// The longest key a publication block carries.
pub(crate) const MAX_KEY: usize = BLOCK_LEN - 24;

/// The key-length word of a member that could not publish the segment it named, and the
/// flag word of one that could not free it: every member then fails the collective with
/// [`AmError::UnknownSegment`] naming it, and nothing is applied.
const REFUSED: u32 = u32::MAX;

/// Bytes of one member's block in a free: the id (4), and 0 or [`REFUSED`] (4).
pub(crate) const FREE_BLOCK_LEN: usize = 8;

/// The key of a peer's segment in [`Segments::known`]: its owner and its id.
fn known_key(rank: Rank, id: u32) -> u64 {
    u64::from(rank) << 32 | u64::from(id)
}

/// The hash of a [`known_key`] (a multiplication, its high half folded onto its low half,
/// which the table's buckets are picked by: the product's low half depends on the id alone,
/// and every rank's first segment has id 1). Every operation on a peer's segment looks one
/// up, where a keyed hash would cost more than the rest of a small put; a peer chooses only
/// the ids it publishes, one per publication, so it cannot flood the table with keys.
#[derive(Default)]
pub(crate) struct SegmentKeys(u64);

impl std::hash::Hasher for SegmentKeys {
    fn finish(&self) -> u64 {
        self.0 ^ self.0 >> 32
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

    /// Its length in bytes, as its owner published it; for a block
    /// ([`RemoteSegment::range`], [`crate::symmetric::Symmetric::on`]), the block's.
    pub fn len(&self) -> usize {
        self.block.map_or(self.len, |(_, len)| len)
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Where it starts in its owner's segment: 0 for a whole segment, the block's offset
    /// for a block.
    pub fn offset(&self) -> usize {
        self.block.map_or(0, |(at, _)| at)
    }

    /// Whether it stands for a block of a segment rather than the whole segment.
    pub fn is_block(&self) -> bool {
        self.block.is_some()
    }

    /// The block of `len` bytes at `offset` of it (of the block, for a block), to which
    /// operations are then confined: `let row = remote.range(4096, 512)?;
    /// node.put_to(&row, 0, &bytes)?` writes the row, and a put of more than 512 bytes
    /// there is [`AmError::OutOfBlock`] naming the row, with nothing written.
    ///
    /// # Errors
    /// [`AmError::OutOfBlock`] (for a block) or [`AmError::SegmentOutOfBounds`] (for a
    /// whole segment) if the range reaches past it.
    pub fn range(&self, offset: usize, len: usize) -> Result<RemoteSegment, AmError> {
        let fits = offset.checked_add(len).is_some_and(|end| end <= self.len());
        if !fits {
            return Err(self.outside(offset, len));
        }
        Ok(RemoteSegment {
            block: Some((self.offset() + offset, len)),
            ..*self
        })
    }

    /// The error of an operation on `len` bytes at `offset` of it that reaches past it.
    fn outside(&self, offset: usize, len: usize) -> AmError {
        match self.block {
            Some((at, n)) => AmError::OutOfBlock(Box::new(crate::error::BlockBounds {
                rank: Some(self.rank),
                segment: self.id,
                block_offset: at,
                block_len: n,
                offset: offset as u64,
                len: len as u64,
            })),
            None => AmError::SegmentOutOfBounds {
                offset: offset as u64,
                len: len as u64,
                size: self.len,
            },
        }
    }

    /// The whole segment and the offset in it of `len` bytes at `offset` of this: for a
    /// block, checked against the block's end ([`AmError::OutOfBlock`]); a whole segment
    /// as it is (the operation checks it against the segment).
    #[inline]
    pub(crate) fn resolve(
        &self,
        offset: usize,
        len: usize,
    ) -> Result<(RemoteSegment, usize), AmError> {
        let Some((at, n)) = self.block else {
            return Ok((*self, offset));
        };
        match offset.checked_add(len) {
            Some(end) if end <= n => Ok((
                RemoteSegment {
                    block: None,
                    ..*self
                },
                at + offset,
            )),
            _ => Err(self.outside(offset, len)),
        }
    }

    /// Block `len` bytes at `offset` of `rank`'s segment 0 (a symmetric block there).
    pub(crate) fn symmetric(rank: Rank, offset: usize, len: usize) -> RemoteSegment {
        RemoteSegment {
            rank,
            id: SegmentId::ZERO,
            len: offset.saturating_add(len),
            block: Some((offset, len)),
        }
    }

    /// Every member's segment from the bytes a publication completed with: `None` unless
    /// they are whole entries.
    pub(crate) fn list_from_bytes(b: &[u8]) -> Option<Vec<RemoteSegment>> {
        if !b.len().is_multiple_of(REMOTE_LEN) {
            return None;
        }
        b.chunks_exact(REMOTE_LEN)
            .map(|e| {
                let len = u64::from_le_bytes(e[8..16].try_into().ok()?);
                Some(RemoteSegment {
                    rank: word(e, 0),
                    id: SegmentId::new(word(e, 4)),
                    len: usize::try_from(len).ok()?,
                    block: None,
                })
            })
            .collect()
    }

    fn push_to(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.rank.to_le_bytes());
        out.extend_from_slice(&self.id.get().to_le_bytes());
        out.extend_from_slice(&(self.len as u64).to_le_bytes());
    }
}

/// How a peer maps a created segment: its memory file's handle, and the nonce its name
/// carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MapKey {
    handle: String,
    nonce: u64,
}

impl MapKey {
    /// The key as a publication block carries it: the handle's bytes and the nonce.
    pub(crate) fn as_published(&self) -> PublishedKey<'_> {
        (self.handle.as_bytes(), self.nonce)
    }
}

/// How a peer reaches a created segment through the transport's RMA
/// ([`crate::Capabilities::rma_segments`]): the key blob its owner's transport returned
/// when it registered the segment, as the publication carried it (the peer's word, checked
/// by the transport on each use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RmaKey {
    bytes: [u8; MAX_KEY],
    len: u8,
}

impl RmaKey {
    /// The key of at most [`MAX_KEY`] bytes of `b` (a longer one is cut there, and the
    /// transport refuses it as malformed).
    fn new(b: &[u8]) -> RmaKey {
        let n = b.len().min(MAX_KEY);
        let mut bytes = [0; MAX_KEY];
        bytes[..n].copy_from_slice(&b[..n]);
        RmaKey {
            bytes,
            len: n as u8,
        }
    }

    /// The blob, for [`Remote::Keyed`](crate::transport::Remote::Keyed) and its kin.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

/// What a publication's keys are, and so how peers reach the created segments published:
/// by the transport's capabilities, the same on every member of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    /// No keys: system messages that the owner's progress applies.
    Messages,
    /// Memory files' handles, which peers map ([`crate::Capabilities::map_segments`]).
    Map,
    /// The transport's key blobs, by which peers' RMA reaches the segments
    /// ([`crate::Capabilities::rma_segments`]).
    Rma,
}

impl Reach {
    /// How a transport with `caps` reaches peers' created segments.
    pub(crate) fn of(caps: crate::Capabilities) -> Reach {
        if caps.map_segments {
            Reach::Map
        } else if caps.rma_segments {
            Reach::Rma
        } else {
            Reach::Messages
        }
    }
}

/// A key as a publication block carries it: its bytes, and the nonce of the segment's memory
/// file's name (0 where peers do not map it).
pub(crate) type PublishedKey<'a> = (&'a [u8], u64);

/// One member's block of a publication: the id and length of the segment it publishes, and
/// the key peers reach it by, with its nonce (none: they reach it by messages; one longer
/// than a block holds is left out); `None` for a member that holds no such segment
/// ([`REFUSED`]).
pub(crate) fn publish_block(
    id: SegmentId,
    published: Option<(usize, Option<PublishedKey<'_>>)>,
) -> [u8; BLOCK_LEN] {
    let mut b = [0; BLOCK_LEN];
    b[..4].copy_from_slice(&id.get().to_le_bytes());
    let Some((len, key)) = published else {
        b[4..8].copy_from_slice(&REFUSED.to_le_bytes());
        return b;
    };
    let key = key.filter(|(k, _)| k.len() <= MAX_KEY);
    let handle = key.map_or(&[][..], |(k, _)| k);
    b[4..8].copy_from_slice(&(handle.len() as u32).to_le_bytes());
    b[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    b[16..24].copy_from_slice(&key.map_or(0, |(_, n)| n).to_le_bytes());
    b[24..24 + handle.len()].copy_from_slice(handle);
    b
}

/// One member's block of a free: the id it frees (0: none), or a refusal of an id it does
/// not hold.
pub(crate) fn free_block(id: SegmentId, refused: bool) -> [u8; FREE_BLOCK_LEN] {
    let mut b = [0; FREE_BLOCK_LEN];
    b[..4].copy_from_slice(&id.get().to_le_bytes());
    if refused {
        b[4..].copy_from_slice(&REFUSED.to_le_bytes());
    }
    b
}

/// The 4-byte little-endian word at `i` of `b` (in bounds: blocks have fixed lengths).
fn word(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// The blocks of a publication or free (`len` bytes each, one per member), unless they do
/// not fit the team or a member refused (word 1 [`REFUSED`]): that member's error, the same
/// on every member.
fn agreed<'b>(
    members: &[Rank],
    blocks: &'b [u8],
    len: usize,
) -> Result<std::slice::ChunksExact<'b, u8>, AmError> {
    if blocks.len() != members.len() * len {
        return Err(AmError::InvalidCollective(
            "a segment collective's blocks do not fit its team",
        ));
    }
    let blocks = blocks.chunks_exact(len);
    match members
        .iter()
        .zip(blocks.clone())
        .find(|(_, b)| word(b, 4) == REFUSED)
    {
        Some((&rank, b)) => Err(AmError::UnknownSegment {
            rank,
            id: SegmentId::new(word(b, 0)),
        }),
        None => Ok(blocks),
    }
}

/// A peer's segment published here.
#[derive(Debug)]
pub(crate) struct Known {
    /// Its length, as its owner published it.
    pub(crate) len: usize,
    /// The key it is mapped by, where this rank maps peers' created segments, until the
    /// first operation on it maps it.
    key: Option<MapKey>,
    /// Its memory, once an operation tried to map it (`None` inside: it did not open, and
    /// messages reach it).
    mapped: Option<Option<am_shm::Segment>>,
    /// The key its owner's transport registered it under, where this rank reaches peers'
    /// created segments by RMA.
    rma: Option<RmaKey>,
}

/// One of this rank's created segments.
#[derive(Debug)]
struct Own {
    seg: am_shm::Segment,
    /// The nonce its memory file's name carries.
    nonce: u64,
    /// Its registration with the transport for peers' RMA: `None` until its first
    /// publication where the transport registers segments, then the key blob (`None`
    /// inside: the transport did not register it, and peers reach it by messages).
    rma: Option<Option<Vec<u8>>>,
    /// Every rank it was published to, sorted: they may operate on it until a free on a
    /// team of them all.
    reached: Vec<Rank>,
}

/// What a rank knows of segments: its own beyond segment 0, and each peer's published to it.
#[derive(Debug, Default)]
pub(crate) struct Segments {
    /// This rank's created segments, by id.
    own: HashMap<u32, Own>,
    /// The next id to hand out (ids are never reused).
    next: u32,
    /// Peers' segments published here, by (owner, id).
    pub(crate) known: HashMap<u64, Known, std::hash::BuildHasherDefault<SegmentKeys>>,
    /// This rank's segments freed on a team of every rank they were published to, whose
    /// registrations with the transport are to end
    /// ([`Registration::Deregister`](crate::transport::Registration::Deregister)).
    pub(crate) retired: Vec<u32>,
}

impl Segments {
    /// Creates a segment of `len` bytes, all zero: its id.
    pub(crate) fn create(&mut self, len: usize) -> Result<SegmentId, AmError> {
        let failed = |why: String| AmError::SegmentNotCreated { len, why };
        let id = self
            .next
            .checked_add(1)
            .ok_or_else(|| failed("every segment id of this endpoint was used".into()))?;
        let nonce = nonce();
        let seg = am_shm::Segment::create_anonymous(&segment_name(nonce), CONTROL_WORDS, len)
            .map_err(|e| failed(e.to_string()))?;
        self.next = id;
        let own = Own {
            seg,
            nonce,
            rma: None,
            reached: Vec::new(),
        };
        self.own.insert(id, own);
        Ok(SegmentId::new(id))
    }

    /// The length of this rank's segment `id` (not 0), if it has one.
    pub(crate) fn own_len(&self, id: SegmentId) -> Option<usize> {
        self.own.get(&id.get()).map(|o| o.seg.bytes_len())
    }

    /// The key peers map this rank's segment `id` by.
    pub(crate) fn own_key(&self, id: SegmentId) -> Option<MapKey> {
        let own = self.own.get(&id.get())?;
        Some(MapKey {
            handle: own.seg.handle()?,
            nonce: own.nonce,
        })
    }

    /// The key blob peers reach this rank's segment `id` by through `t`'s RMA: registered
    /// with `t` by the first call ([`crate::transport::Registration::Register`]); `None` where `t`
    /// did not register it.
    pub(crate) fn own_rma_key<T: crate::Transport + ?Sized>(
        &mut self,
        t: &mut T,
        id: SegmentId,
    ) -> Option<Vec<u8>> {
        let own = self.own.get_mut(&id.get())?;
        own.rma
            .get_or_insert_with(|| {
                match t.registration(crate::transport::Registration::Register {
                    id: id.get(),
                    segment: &own.seg,
                }) {
                    Some(k) if k.len() <= MAX_KEY => Some(k),
                    // A key no publication can carry: peers reach the segment by messages, and
                    // the registration ends here rather than with the transport.
                    Some(_) => {
                        t.registration(crate::transport::Registration::Deregister { id: id.get() });
                        None
                    }
                    None => None,
                }
            })
            .clone()
    }

    /// The key `rank`'s segment `id` is reached by through the transport's RMA, if it was
    /// published with one.
    #[inline]
    pub(crate) fn rma_key(&self, rank: Rank, id: SegmentId) -> Option<RmaKey> {
        self.known.get(&known_key(rank, id.get()))?.rma
    }

    /// The bytes of this rank's segment `id` (not 0).
    pub(crate) fn own_bytes(&self, id: u32) -> Option<am_shm::SharedBytes<'_>> {
        self.own.get(&id).map(|o| o.seg.byte_area())
    }

    /// Another handle on this rank's segment `id` (not 0), keeping its mapping alive.
    pub(crate) fn own_share(&self, id: SegmentId) -> Option<am_shm::Segment> {
        self.own.get(&id.get()).map(|o| o.seg.share())
    }

    /// The length of `rank`'s segment `id` published here.
    pub(crate) fn known_len(&self, rank: Rank, id: SegmentId) -> Option<usize> {
        self.known.get(&known_key(rank, id.get())).map(|k| k.len)
    }

    /// The bytes of `rank`'s segment `id` as this rank maps it (mapped by the first call):
    /// `None` if it does not map it, `Some(Err(()))` if its owner has freed it since.
    pub(crate) fn mapped(
        &mut self,
        rank: Rank,
        id: SegmentId,
    ) -> Option<Result<am_shm::SharedBytes<'_>, ()>> {
        let known = self.known.get_mut(&known_key(rank, id.get()))?;
        if known.mapped.is_none() {
            let key = known.key.take()?;
            let name = segment_name(key.nonce);
            let seg =
                am_shm::Segment::open_handle_named(&key.handle, &name, CONTROL_WORDS, known.len);
            known.mapped = Some(seg.ok());
        }
        let seg = known.mapped.as_ref()?.as_ref()?;
        Some(match seg.load_word(0) {
            Ok(0) => Ok(seg.byte_area()),
            _ => Err(()),
        })
    }

    /// Applies a completed publication on a team whose members, in team order, are
    /// `members`: every member's (id, length) remembered (and, as `reach` says, every
    /// peer's key: one to map, by which its first operation maps it, a segment that does
    /// not open being reached by messages; or one for the transport's RMA), this rank's own
    /// segment as published to them all, and the outcome's bytes. A member's refusal is
    /// every member's error, and nothing is remembered.
    pub(crate) fn published(
        &mut self,
        me: Rank,
        members: &[Rank],
        blocks: &[u8],
        reach: Reach,
    ) -> Result<Vec<u8>, AmError> {
        let blocks = agreed(members, blocks, BLOCK_LEN)?;
        let mut out = Vec::with_capacity(members.len() * REMOTE_LEN);
        for (&rank, b) in members.iter().zip(blocks) {
            let (id, key_len) = (word(b, 0), word(b, 4) as usize);
            let len = u64::from_le_bytes(b[8..16].try_into().unwrap_or_default());
            let len = usize::try_from(len).map_err(|_| {
                AmError::InvalidCollective("a segment longer than this rank can address")
            })?;
            let nonce = u64::from_le_bytes(b[16..24].try_into().unwrap_or_default());
            let raw = b
                .get(24..24 + key_len.min(MAX_KEY))
                .filter(|k| rank != me && id != 0 && !k.is_empty());
            let key = raw
                .filter(|_| reach == Reach::Map)
                .and_then(|k| std::str::from_utf8(k).ok())
                .map(|handle| MapKey {
                    handle: handle.to_owned(),
                    nonce,
                });
            // A key longer than a block holds is kept cut, for the transport to refuse as
            // the peer's: the publication is not the place to judge a transport's key.
            let rma = raw.filter(|_| reach == Reach::Rma).map(RmaKey::new);
            if rank != me && id != 0 {
                let known = Known {
                    len,
                    key,
                    mapped: None,
                    rma,
                };
                self.known.insert(known_key(rank, id), known);
            }
            if rank == me {
                if let Some(own) = self.own.get_mut(&id) {
                    own.reached.extend_from_slice(members);
                    own.reached.sort_unstable();
                    own.reached.dedup();
                }
            }
            RemoteSegment {
                rank,
                id: SegmentId::new(id),
                len,
                block: None,
            }
            .push_to(&mut out);
        }
        Ok(out)
    }

    /// Applies a completed free on a team whose members, in team order, are `members`: each
    /// member's freed id is forgotten (and unmapped), and this rank's own `mine` marked
    /// freed for the peers that map it or read it by RMA, then unmapped here. Its
    /// registration with the transport is retired where `members` are every rank it was
    /// published to: each freed it after its own operations on it, so none reaches it any
    /// more. Published beyond them, it stays registered (its memory with the transport)
    /// while the transport lives, so that those others find it freed rather than an access
    /// the transport refuses. A member's refusal is every member's error, and nothing is
    /// freed.
    pub(crate) fn freed(
        &mut self,
        members: &[Rank],
        blocks: &[u8],
        mine: SegmentId,
    ) -> Result<(), AmError> {
        let blocks = agreed(members, blocks, FREE_BLOCK_LEN)?;
        if let Some(own) = self.own.remove(&mine.get()) {
            if let Ok(w) = own.seg.word(0) {
                w.store(1, std::sync::atomic::Ordering::Release);
            }
            let all = own.reached.iter().all(|r| members.contains(r));
            if matches!(own.rma, Some(Some(_))) && all {
                self.retired.push(mine.get());
            }
        }
        for (&rank, b) in members.iter().zip(blocks) {
            self.known.remove(&known_key(rank, word(b, 0)));
        }
        Ok(())
    }
}

/// What a segment collective changes when it completes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SegStep {
    /// A publication: every member's (id, length) becomes known here, and its key as
    /// `reach` says ([`Reach::of`] the transport's capabilities).
    Publish { reach: Reach },
    /// A free of this rank's segment: it is unmapped, and every member's freed id forgotten.
    Free(SegmentId),
}

/// A segment collective in flight, by its operation slot, with the team's members (in team
/// order) that its blocks come from.
#[derive(Debug)]
pub(crate) struct SegOp {
    pub(crate) index: u32,
    pub(crate) gen: u32,
    pub(crate) members: Vec<Rank>,
    pub(crate) step: SegStep,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blocks(parts: &[[u8; BLOCK_LEN]]) -> Vec<u8> {
        parts.concat()
    }

    #[test]
    fn a_publication_round_trips_through_its_bytes() {
        // Catches an entry's fields swapped or cut between the block, the table and the
        // outcome, and a key longer than a block overrunning it.
        let mut s = Segments::default();
        let long = MapKey {
            handle: "x".repeat(200),
            nonce: 7,
        };
        let all = blocks(&[
            publish_block(SegmentId::new(3), Some((4096, None))),
            publish_block(
                SegmentId::new(9),
                Some((1 << 40, Some(long.as_published()))),
            ),
            publish_block(SegmentId::new(1), Some((8, None))),
        ]);
        let out = s.published(2, &[7, 5, 2], &all, Reach::Messages).unwrap();
        let list = RemoteSegment::list_from_bytes(&out).unwrap();
        let got: Vec<_> = list
            .iter()
            .map(|r| (r.rank(), r.id().get(), r.len()))
            .collect();
        assert_eq!(got, [(7, 3, 4096), (5, 9, 1 << 40), (2, 1, 8)]);
        assert_eq!(s.known_len(7, SegmentId::new(3)), Some(4096));
        assert!(
            s.known_len(2, SegmentId::new(1)).is_none(),
            "its own is not a peer's"
        );
        assert!(
            s.mapped(7, SegmentId::new(3)).is_none(),
            "nothing mapped without keys"
        );
        // A short list is refused, not read past its end.
        assert!(s
            .published(2, &[7, 2, 9, 1], &all, Reach::Messages)
            .is_err());
        assert!(RemoteSegment::list_from_bytes(&out[..20]).is_none());
    }

    #[test]
    fn a_refusal_fails_the_collective_and_applies_nothing() {
        // Catches a member without the segment it named leaving the others with a
        // half-applied publication or free (or waiting: it takes part, refused).
        let mut s = Segments::default();
        let mine = s.create(64).unwrap();
        let all = blocks(&[
            publish_block(SegmentId::new(4), Some((64, None))),
            publish_block(SegmentId::new(6), None),
        ]);
        match s.published(0, &[3, 8], &all, Reach::Messages) {
            Err(AmError::UnknownSegment { rank: 8, id }) if id.get() == 6 => {}
            other => panic!("{other:?}"),
        }
        assert!(
            s.known_len(3, SegmentId::new(4)).is_none(),
            "nothing remembered"
        );
        let mut frees = Vec::new();
        frees.extend_from_slice(&free_block(mine, false));
        frees.extend_from_slice(&free_block(SegmentId::new(2), true));
        match s.freed(&[0, 8], &frees, mine) {
            Err(AmError::UnknownSegment { rank: 8, id }) if id.get() == 2 => {}
            other => panic!("{other:?}"),
        }
        assert_eq!(s.own_len(mine), Some(64), "nothing freed");
        // Segment 0 is freed as nothing.
        let frees = free_block(SegmentId::ZERO, false);
        assert!(s.freed(&[0], &frees, SegmentId::ZERO).is_ok());
        assert_eq!(s.own_len(mine), Some(64));
    }

    #[cfg(not(miri))]
    #[test]
    fn a_mapped_segment_is_refused_once_its_owner_frees_it() {
        // Catches a peer's mapping that keeps taking writes after its owner freed the
        // segment, and a key that maps other memory than the segment published: another
        // length, another segment's file, or a file whose name carries another nonce (a
        // descriptor closed and reused).
        let mut owner = Segments::default();
        let id = owner.create(100).unwrap();
        let other = owner.create(100).unwrap();
        let key = owner.own_key(id).unwrap();
        let mut peer = Segments::default();
        let block = publish_block(id, Some((100, Some(key.as_published()))));
        peer.published(1, &[0], &block, Reach::Map).unwrap();
        let view = peer.mapped(0, id).unwrap().unwrap();
        view.write(90, b"0123456789").unwrap();
        let mut back = [0u8; 10];
        owner
            .own_bytes(id.get())
            .unwrap()
            .read(90, &mut back)
            .unwrap();
        assert_eq!(&back, b"0123456789");
        // The handle now naming another file of the same length, as a descriptor number
        // closed and reused would; and the right file under another nonce.
        let reused = MapKey {
            handle: owner.own_key(other).unwrap().handle,
            nonce: key.nonce,
        };
        let stale = MapKey {
            handle: key.handle.clone(),
            nonce: key.nonce ^ 1,
        };
        let wrong = [(200, key.clone()), (100, reused), (100, stale)];
        for (len, key) in wrong {
            let mut s = Segments::default();
            let block = publish_block(id, Some((len, Some(key.as_published()))));
            s.published(1, &[0], &block, Reach::Map).unwrap();
            assert!(s.mapped(0, id).is_none(), "{len} bytes by {key:?}");
            assert_eq!(s.known_len(0, id), Some(len), "still reached by messages");
        }
        owner.freed(&[0], &free_block(id, false), id).unwrap();
        assert!(peer.mapped(0, id).unwrap().is_err(), "freed by its owner");
    }

    #[test]
    fn an_rma_key_is_kept_as_published_and_a_free_retires_it_only_when_all_freed() {
        // Catches an RMA key lost, cut or taken from another member's block, a forged key
        // length read past the block, and a registration ended while a rank it was
        // published to (outside the freeing team) may still reach it, or kept after a
        // free by every such rank.
        let mut s = Segments::default();
        let a = s.create(64).unwrap();
        let b = s.create(64).unwrap();
        for id in [a, b] {
            s.own.get_mut(&id.get()).unwrap().rma = Some(Some(vec![7; 24]));
        }
        let blob = [5u8; 24];
        let mut forged = publish_block(SegmentId::new(9), Some((64, Some((&blob, 0)))));
        forged[4..8].copy_from_slice(&200u32.to_le_bytes());
        let publish = |s: &mut Segments, id: SegmentId| {
            let all = blocks(&[
                publish_block(id, Some((64, Some((&[7; 24], 0))))),
                publish_block(SegmentId::new(4), Some((64, Some((&blob, 0))))),
                forged,
            ]);
            s.published(0, &[0, 1, 2], &all, Reach::Rma).unwrap();
        };
        publish(&mut s, a);
        publish(&mut s, b);
        assert_eq!(s.rma_key(1, SegmentId::new(4)).unwrap().bytes(), &blob);
        assert_eq!(
            s.rma_key(2, SegmentId::new(9)).unwrap().bytes().len(),
            MAX_KEY,
            "a forged length is cut at the block's end, for the transport to refuse"
        );
        assert!(s.mapped(1, SegmentId::new(4)).is_none(), "not mapped");
        // Freed alone: ranks 1 and 2 may still reach it, so it stays registered.
        s.freed(&[0], &free_block(a, false), a).unwrap();
        assert!(s.retired.is_empty());
        // Freed by all it was published to: retired.
        let zero = free_block(SegmentId::ZERO, false);
        let frees = [free_block(b, false), zero, zero].concat();
        s.freed(&[0, 1, 2], &frees, b).unwrap();
        assert_eq!(s.retired, [b.get()]);
    }

    #[test]
    fn every_ranks_first_segment_hashes_apart() {
        // Catches a hash whose low bits (the table's bucket) depend on the id alone: every
        // rank's segment 1 would share one bucket, and each lookup probe them all.
        use std::hash::{BuildHasher, BuildHasherDefault};
        let h = BuildHasherDefault::<SegmentKeys>::default();
        let buckets: std::collections::HashSet<u64> = (0..1024u32)
            .map(|r| h.hash_one(known_key(r, 1)) & 1023)
            .collect();
        assert!(buckets.len() > 512, "{} buckets of 1024", buckets.len());
    }

    #[test]
    fn ids_are_never_reused_and_a_free_forgets() {
        // Catches a freed id handed out again (an old RemoteSegment would then reach new
        // memory) and a free that leaves a peer's entry behind.
        let mut s = Segments::default();
        let a = s.create(64).unwrap();
        let b = s.create(128).unwrap();
        assert_ne!(a, b);
        assert_eq!(s.own_len(b), Some(128));
        let block = publish_block(SegmentId::new(5), Some((64, None)));
        s.published(0, &[1], &block, Reach::Messages).unwrap();
        let mut frees = Vec::new();
        frees.extend_from_slice(&free_block(a, false));
        frees.extend_from_slice(&free_block(SegmentId::new(5), false));
        s.freed(&[0, 1], &frees, a).unwrap();
        assert!(s.own_len(a).is_none() && s.known_len(1, SegmentId::new(5)).is_none());
        let c = s.create(64).unwrap();
        assert!(c != a && c != b);
    }
}
