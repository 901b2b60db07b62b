//! The core's own messages: what ranks tell each other to start, synchronize, move data and
//! end a job, beside the users' AMs.
//!
//! A system message travels as an AM whose header has the `system` bit set; its opcode is
//! the header's handler byte and its fields are the AM's argument words (64-bit fields as
//! two words, low first). [`SystemMsg::encode`] gives the opcode, the AM kind and category
//! and the words; [`SystemMsg::decode`] checks all of them against each other and returns
//! [`Misbehavior::BadSystemMessage`] for anything a correct peer does not send, so a
//! driver never interprets raw words.
//!
//! ```
//! use amnet::protocol::SystemMsg;
//! use amnet::{AmKind, Category};
//!
//! fn main() {
//!     let msg = SystemMsg::Barrier { epoch: 7, round: 2 };
//!     let wire = msg.encode();
//!     assert_eq!((wire.opcode, wire.kind, wire.category), (3, AmKind::Short, Category::Request));
//!     assert_eq!(wire.args(), &[7, 0, 2]);
//!     assert_eq!(SystemMsg::decode(wire.category, wire.kind, wire.opcode, wire.args()), Ok(msg));
//!     assert!(SystemMsg::decode(Category::Request, AmKind::Short, 3, &[7, 0, 99]).is_err());
//! }
//! ```

use crate::atomic::Atomic;
use crate::error::Misbehavior;
use crate::team::TeamId;
use crate::types::{AmKind, Category, Rank};

/// Opcodes: the header's handler byte of each [`SystemMsg`] variant (for tests and tools
/// that forge or inspect raw messages; a driver uses [`SystemMsg::encode`]).
pub mod opcode {
    /// [`SystemMsg::Ack`](super::SystemMsg::Ack).
    pub const ACK: u8 = 0;
    /// [`SystemMsg::Hello`](super::SystemMsg::Hello).
    pub const HELLO: u8 = 1;
    /// [`SystemMsg::HelloVerdict`](super::SystemMsg::HelloVerdict).
    pub const HELLO_VERDICT: u8 = 2;
    /// [`SystemMsg::Barrier`](super::SystemMsg::Barrier).
    pub const BARRIER: u8 = 3;
    /// [`SystemMsg::Put`](super::SystemMsg::Put).
    pub const PUT: u8 = 4;
    /// [`SystemMsg::PutDone`](super::SystemMsg::PutDone).
    pub const PUT_DONE: u8 = 5;
    /// [`SystemMsg::Get`](super::SystemMsg::Get).
    pub const GET: u8 = 6;
    /// [`SystemMsg::GetData`](super::SystemMsg::GetData).
    pub const GET_DATA: u8 = 7;
    /// [`SystemMsg::Exit`](super::SystemMsg::Exit).
    pub const EXIT: u8 = 8;
    /// [`SystemMsg::Acks`](super::SystemMsg::Acks).
    pub const ACKS: u8 = 9;
    /// [`SystemMsg::Atomic`](super::SystemMsg::Atomic).
    pub const ATOMIC: u8 = 10;
    /// [`SystemMsg::AtomicDone`](super::SystemMsg::AtomicDone).
    pub const ATOMIC_DONE: u8 = 11;
    /// [`SystemMsg::Atomics`](super::SystemMsg::Atomics).
    pub const ATOMICS: u8 = 12;
    /// [`SystemMsg::Collective`](super::SystemMsg::Collective).
    pub const COLLECTIVE: u8 = 13;
    /// [`SystemMsg::PutRegions`](super::SystemMsg::PutRegions).
    pub const PUT_REGIONS: u8 = 14;
    /// [`SystemMsg::PutAt`](super::SystemMsg::PutAt).
    pub const PUT_AT: u8 = 15;
    /// [`SystemMsg::GetAt`](super::SystemMsg::GetAt).
    pub const GET_AT: u8 = 16;
    /// [`SystemMsg::AtomicAt`](super::SystemMsg::AtomicAt).
    pub const ATOMIC_AT: u8 = 17;
}
use opcode as op;

/// Rounds of a dissemination barrier: enough for 2^32 ranks.
pub const MAX_BARRIER_ROUNDS: u8 = 32;

/// The most argument words a system message has.
pub const MAX_SYSTEM_ARGS: usize = 8;

/// Argument words of a [`SystemMsg::Collective`]: a Short's words after these are the
/// step's bytes ([`inline_step_bytes`]).
pub const COLLECTIVE_ARGS: usize = 8;

/// The most bytes a collective's step carries in a Short's arguments.
pub const MAX_INLINE_STEP_BYTES: usize = 4 * (crate::wire::MAX_ARGS - COLLECTIVE_ARGS);

/// The bytes a collective's step carries in the arguments of its Short after the
/// [`COLLECTIVE_ARGS`] of its own (four little-endian bytes a word), written into `out`:
/// none if there are no more, or more than [`MAX_INLINE_STEP_BYTES`] (a Short has no more).
pub fn inline_step_bytes<'a>(args: &[u32], out: &'a mut [u8; MAX_INLINE_STEP_BYTES]) -> &'a [u8] {
    let words = args.get(COLLECTIVE_ARGS..).unwrap_or(&[]);
    if words.len() * 4 > MAX_INLINE_STEP_BYTES {
        return &[];
    }
    for (w, o) in words.iter().zip(out.chunks_exact_mut(4)) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    &out[..words.len() * 4]
}

/// Bytes of one entry of a [`SystemMsg::Atomics`] payload: the word's offset (8 bytes), the
/// atomic's wire word ([`Atomic::wire_word`], 4) and its two operands ([`Atomic::operands`],
/// 8 each), all little-endian.
pub const ATOMIC_ENTRY_LEN: usize = 28;

/// Bytes of one region of a [`SystemMsg::PutRegions`]: its offset in the target's segment
/// (`u64`) and its length (`u32`), little-endian.
pub const REGION_ENTRY_LEN: usize = 12;

/// Appends the [`SystemMsg::PutRegions`] entry of `len` bytes at `offset`.
pub fn push_region_entry(out: &mut Vec<u8>, offset: u64, len: u32) {
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
}

/// A [`SystemMsg::PutRegions`] entry: its offset and length.
pub fn read_region_entry(e: &[u8; REGION_ENTRY_LEN]) -> (u64, u32) {
    let mut o = [0u8; 8];
    o.copy_from_slice(&e[..8]);
    let mut l = [0u8; 4];
    l.copy_from_slice(&e[8..]);
    (u64::from_le_bytes(o), u32::from_le_bytes(l))
}

/// The most atomics one [`SystemMsg::Atomics`] carries.
pub const MAX_BATCH_ATOMICS: u32 = 64;

/// Appends the [`SystemMsg::Atomics`] entry of `atomic` on the word at `offset`.
pub fn push_atomic_entry(out: &mut Vec<u8>, offset: u64, atomic: &Atomic) {
    let (v, cur) = atomic.operands();
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&atomic.wire_word().to_le_bytes());
    out.extend_from_slice(&v.to_le_bytes());
    out.extend_from_slice(&cur.to_le_bytes());
}

/// The offset and atomic of a [`SystemMsg::Atomics`] entry a peer sent; `None` for an atomic
/// that does not exist (a correct peer never sends one).
pub fn read_atomic_entry(e: &[u8; ATOMIC_ENTRY_LEN]) -> Option<(u64, Atomic)> {
    let u64_at = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&e[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let word = u32::from_le_bytes([e[8], e[9], e[10], e[11]]);
    Some((u64_at(0), Atomic::from_wire(word, u64_at(12), u64_at(20))?))
}

/// Bytes of a [`SystemMsg::Hello`]'s table signature at most
/// ([`crate::Handlers::signature`], 256 little-endian 16-bit hashes). The payload is the
/// signature's entry count (2 bytes), its entries, the count of the table's typed messages
/// (4 bytes), and as many of their ids (8 bytes each, ascending) as the Medium carries.
pub const HELLO_SIGNATURE_LEN: usize = 512;

/// A system message; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemMsg {
    /// The implicit empty reply (Short reply): returns the credit of a request whose handler
    /// did not reply.
    Ack,
    /// Implicit empty replies to `count` requests at once (Short reply), returning `granted`
    /// credits in all: sent instead of [`SystemMsg::Ack`] where the transport allows it
    /// ([`crate::Capabilities::acks_coalesce`]).
    Acks {
        /// Requests answered (at least 1).
        count: u32,
        /// Credits returned for them together (what each one's reply would have granted).
        granted: u32,
    },
    /// Start-up, every rank to rank 0 (Medium request): its handler-table digest and the
    /// length of its segment; the payload is its table signature
    /// ([`HELLO_SIGNATURE_LEN`] bytes).
    Hello {
        /// Digest of the handler table (ids, names, categories, kinds).
        digest: u64,
        /// Bytes of the rank's segment.
        segment_len: u64,
    },
    /// Start-up, rank 0 to every rank (Short request): whether all tables and segments agree.
    HelloVerdict(HelloVerdict),
    /// A dissemination barrier's arrival (Short request): barrier `epoch`, `round`.
    Barrier {
        /// Which barrier (counted per rank, the same on all ranks).
        epoch: u64,
        /// The round, below [`MAX_BARRIER_ROUNDS`].
        round: u8,
    },
    /// Put (Long request, the data in its payload): operation `op` of the initiator.
    Put {
        /// The initiator's operation index.
        op: u32,
    },
    /// A put's completion (Short reply); `ok` false if the range was outside the target's
    /// segment (nothing was written).
    PutDone {
        /// The operation index of the [`SystemMsg::Put`].
        op: u32,
        /// Whether the data was written.
        ok: bool,
    },
    /// Get (Short request): `len` bytes at `offset` of the target's segment, to land at
    /// `at` of operation `op`'s buffer.
    Get {
        /// The initiator's operation index.
        op: u32,
        /// Where to read in the target's segment.
        offset: u64,
        /// How many bytes (at most the transport's `max_medium`).
        len: u32,
        /// Where they go in the operation's buffer.
        at: u64,
    },
    /// Get data (Medium reply, the bytes in its payload); `ok` false if the range was outside
    /// the target's segment (no bytes).
    GetData {
        /// The operation index of the [`SystemMsg::Get`].
        op: u32,
        /// Where the bytes go in the operation's buffer.
        at: u64,
        /// Whether the bytes were read.
        ok: bool,
    },
    /// A remote atomic (Short request) on the word at `offset` of the target's segment, for
    /// a transport that cannot apply it itself ([`Rma::Atomic`](crate::transport::Rma::Atomic)).
    Atomic {
        /// The initiator's operation index.
        op: u32,
        /// Where the word is in the target's segment.
        offset: u64,
        /// What to do with it.
        atomic: Atomic,
    },
    /// Non-fetching atomics posted together ([`crate::Node::atomic_nbi`]), for a transport
    /// that cannot apply them itself (Medium request): the payload is `count` entries of
    /// [`ATOMIC_ENTRY_LEN`] bytes ([`push_atomic_entry`]), applied in order, all of them or,
    /// if one names a word outside the target's segment or misaligned, none. Answered by one
    /// [`SystemMsg::AtomicDone`] whose `old` is 0.
    Atomics {
        /// The initiator's operation index.
        op: u32,
        /// Entries in the payload, 1 to [`MAX_BATCH_ATOMICS`].
        count: u32,
    },
    /// An atomic's result (Short reply): the word's old value; `ok` false if the word was
    /// outside the target's segment or misaligned (nothing was read or written).
    AtomicDone {
        /// The operation index of the [`SystemMsg::Atomic`].
        op: u32,
        /// The word's value before the atomic.
        old: u64,
        /// Whether the atomic was applied.
        ok: bool,
    },
    /// One step of a collective on a team (a Medium request, its payload the step's bytes;
    /// or a Short request, its arguments after these the step's bytes, where they are none
    /// or whole words that fit): keyed by the team, the collective's sequence number among
    /// those started on that team, and its step, so that several collectives in flight on
    /// one team and on several teams never mix.
    Collective {
        /// The team.
        team: TeamId,
        /// The collective's number among the team's, from 0, in the order members start them.
        seq: u64,
        /// The step (a round, a block) of the collective's algorithm.
        step: u32,
        /// Which collective the sender started under `seq`.
        kind: CollectiveKind,
        /// The root's team rank (a broadcast, reduce or gather), an all-reduce's algorithm (0
        /// recursive doubling, 1 a ring); 0 for the others.
        root: u32,
        /// The reduction's element type and operation (a reduce or all-reduce; 0 for the
        /// others).
        desc: u32,
    },
    /// End the job with `code` (Short request).
    Exit {
        /// The exit code every rank ends with.
        code: i32,
    },
    /// Bytes for several regions of the target's segment (Medium request, a strided or
    /// indexed put, [`crate::Node::put_indexed`]): the payload is `count` entries of
    /// [`REGION_ENTRY_LEN`] bytes ([`push_region_entry`]), then every region's bytes in
    /// order. Written all or, if one region is outside the segment or the lengths do not
    /// add up to the payload, none. Answered by a [`SystemMsg::PutDone`].
    PutRegions {
        /// The initiator's operation index.
        op: u32,
        /// Regions in the payload, at least 1.
        count: u32,
    },
    /// Put into a created segment of the target (Medium request, the bytes in its payload;
    /// [`crate::segment`]): written at `offset` of segment `seg` if the target holds it and
    /// the range is inside it, else nothing is. Answered by a [`SystemMsg::PutDone`].
    PutAt {
        /// The initiator's operation index.
        op: u32,
        /// The target's segment (never 0).
        seg: u32,
        /// Where in it.
        offset: u64,
    },
    /// Get from a created segment of the target (Short request), as [`SystemMsg::Get`]:
    /// answered by a [`SystemMsg::GetData`], whose `ok` is false if the target holds no
    /// segment `seg` or the range is outside it.
    GetAt {
        /// The initiator's operation index.
        op: u32,
        /// The target's segment (never 0).
        seg: u32,
        /// Where to read in it.
        offset: u64,
        /// How many bytes (at most the transport's `max_medium`).
        len: u32,
        /// Where they go in the operation's buffer.
        at: u64,
    },
    /// A remote atomic on a word of a created segment of the target (Medium request whose
    /// payload is the segment's id, 4 bytes little-endian), as [`SystemMsg::Atomic`]:
    /// answered by a [`SystemMsg::AtomicDone`], whose `ok` is false if the target holds no
    /// such segment or the word is outside it.
    AtomicAt {
        /// The initiator's operation index.
        op: u32,
        /// Where the word is in the segment.
        offset: u64,
        /// What to do with it.
        atomic: Atomic,
    },
}

/// Which collective a [`SystemMsg::Collective`] belongs to: the members of a team must
/// start the same collectives in the same order, and a message of another kind than the one
/// this member started under that sequence number is [`crate::AmError::CollectiveMismatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CollectiveKind {
    /// A team barrier (dissemination: round `step` goes to the member `2^step` after).
    Barrier,
    /// An all-gather (a ring: step `step` carries one block to the next member).
    AllGather,
    /// A team split: an all-gather of each member's color, key and next team serial.
    Split,
    /// A broadcast from the root (a binomial tree: step `k` comes from the member `2^k`
    /// before, counted from the root).
    Broadcast,
    /// A reduction to the root (a binomial tree towards team rank 0, which forwards the
    /// result to the root at step [`FORWARD_STEP`]).
    Reduce,
    /// A reduction whose result every member gets: recursive doubling (root field 0), or a
    /// ring (root field 1: steps `0..n-1` a reduce-scatter, `n-1..2n-2` an all-gather, one
    /// n-th of the chunk each).
    AllReduce,
    /// A gather to the root: step `s` is the block of team rank `s`.
    Gather,
    /// Not a collective's step: the sender failed the team's collective `seq` because the
    /// member of world rank `step` is lost, and so fails every collective on the team from
    /// that one on; the receiver does the same (a transport may notice a silent peer much
    /// later than another member's did).
    MemberLost,
    /// As [`CollectiveKind::MemberLost`], for a member that left the job.
    MemberDeparted,
    /// A segment publication ([`crate::Node::publish_segment`]): an all-gather of each
    /// member's segment id, length and key, as [`CollectiveKind::AllGather`] runs.
    PublishSegment,
    /// A segment free ([`crate::Node::free_segment`]): an all-gather of each member's freed
    /// id, as [`CollectiveKind::AllGather`] runs.
    FreeSegment,
    /// Not a collective's step: the sender found that the member of world rank `step`
    /// started another collective than its own under sequence `seq` (or with another root,
    /// length or reduction), and fails every collective on the team from that one on; the
    /// receiver does the same, so that every member gets
    /// [`crate::AmError::CollectiveMismatch`] rather than waiting for a step that never
    /// comes. Its payload (17 bytes) says what differs: the field's tag, then that
    /// member's value and the sender's, each a little-endian `u64`.
    Mismatch,
    /// The agreement of a collective in segment 0 ([`crate::Node::team_all_reduce_in_segment`]):
    /// an all-gather of each member's arguments and offsets, as
    /// [`CollectiveKind::AllGather`] runs.
    InSegment,
}

/// The step of a reduction's result forwarded from team rank 0 to a root that is not it.
pub const FORWARD_STEP: u32 = 64;

/// An all-reduce's first step, from an even member to the odd one after it, when the
/// team's size is not a power of two (the even member then sits out the doubling).
pub const FOLD_STEP: u32 = 0;

/// An all-reduce's last step, the result back to the even member that sat out.
pub const UNFOLD_STEP: u32 = 65;

impl CollectiveKind {
    /// Whether it runs as an all-gather: every member ends with every member's block.
    pub(crate) fn gathers_all(self) -> bool {
        matches!(
            self,
            CollectiveKind::AllGather
                | CollectiveKind::Split
                | CollectiveKind::PublishSegment
                | CollectiveKind::FreeSegment
                | CollectiveKind::InSegment
        )
    }

    pub(crate) fn code(self) -> u32 {
        match self {
            CollectiveKind::Barrier => 1,
            CollectiveKind::AllGather => 2,
            CollectiveKind::Split => 3,
            CollectiveKind::MemberLost => 4,
            CollectiveKind::MemberDeparted => 5,
            CollectiveKind::Broadcast => 6,
            CollectiveKind::Reduce => 7,
            CollectiveKind::AllReduce => 8,
            CollectiveKind::Gather => 9,
            CollectiveKind::Mismatch => 10,
            CollectiveKind::PublishSegment => 11,
            CollectiveKind::FreeSegment => 12,
            CollectiveKind::InSegment => 13,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<CollectiveKind> {
        Some(match code {
            1 => CollectiveKind::Barrier,
            2 => CollectiveKind::AllGather,
            3 => CollectiveKind::Split,
            4 => CollectiveKind::MemberLost,
            5 => CollectiveKind::MemberDeparted,
            6 => CollectiveKind::Broadcast,
            7 => CollectiveKind::Reduce,
            8 => CollectiveKind::AllReduce,
            9 => CollectiveKind::Gather,
            10 => CollectiveKind::Mismatch,
            11 => CollectiveKind::PublishSegment,
            12 => CollectiveKind::FreeSegment,
            13 => CollectiveKind::InSegment,
            _ => return None,
        })
    }
}

/// Rank 0's start-up verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HelloVerdict {
    /// Every rank's handler table and segment length agree with rank 0's.
    Ok,
    /// `rank`'s handler-table digest (`theirs`) differs from rank 0's (`ours`).
    TableMismatch {
        /// The first rank found to differ.
        rank: Rank,
        /// Rank 0's digest.
        ours: u64,
        /// That rank's digest.
        theirs: u64,
        /// The lowest handler id whose registration differs, if the signatures tell.
        handler: Option<u8>,
    },
    /// `rank`'s typed messages differ from rank 0's: `ours`, a type id rank 0 registers and
    /// `rank` does not, `theirs`, one `rank` registers and rank 0 does not (each rank names
    /// the one it knows).
    TypedMismatch {
        /// The first rank found to differ.
        rank: Rank,
        /// A type id of rank 0's that `rank` lacks.
        ours: Option<u64>,
        /// A type id of `rank`'s that rank 0 lacks.
        theirs: Option<u64>,
    },
    /// `rank`'s segment length (`theirs`) differs from rank 0's (`ours`).
    SegmentMismatch {
        /// The first rank found to differ.
        rank: Rank,
        /// Rank 0's segment length.
        ours: u64,
        /// That rank's segment length.
        theirs: u64,
    },
}

/// Status words of a [`HelloVerdict`].
const VERDICT_OK: u32 = 0;
const VERDICT_TABLE: u32 = 1;
const VERDICT_SEGMENT: u32 = 2;
const VERDICT_TYPED: u32 = 3;

/// A system message as it goes on the wire: see [`SystemMsg::encode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    /// The header's handler byte.
    pub opcode: u8,
    /// The AM kind: Short, or Long for a put, Medium for get data.
    pub kind: AmKind,
    /// Request or reply.
    pub category: Category,
    words: [u32; MAX_SYSTEM_ARGS],
    len: u8,
}

impl Encoded {
    /// The argument words.
    #[inline]
    pub fn args(&self) -> &[u32] {
        &self.words[..self.len as usize]
    }
}

#[inline]
fn lo(v: u64) -> u32 {
    v as u32
}

#[inline]
fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

#[inline]
fn join(lo: u32, hi: u32) -> u64 {
    u64::from(lo) | u64::from(hi) << 32
}

impl SystemMsg {
    /// Opcode, kind, category and argument words.
    pub fn encode(&self) -> Encoded {
        use AmKind::{Long, Medium, Short};
        use Category::{Reply, Request};
        let mut words = [0u32; MAX_SYSTEM_ARGS];
        let (opcode, kind, category, args): (u8, AmKind, Category, &[u32]) = match *self {
            SystemMsg::Ack => (op::ACK, Short, Reply, &[]),
            SystemMsg::Acks { count, granted } => (op::ACKS, Short, Reply, &[count, granted]),
            SystemMsg::Hello {
                digest,
                segment_len,
            } => (
                op::HELLO,
                Medium,
                Request,
                &[lo(digest), hi(digest), lo(segment_len), hi(segment_len)],
            ),
            SystemMsg::HelloVerdict(v) => {
                let none = u32::MAX;
                let w = match v {
                    HelloVerdict::Ok => [VERDICT_OK, 0, 0, 0, 0, 0, none],
                    HelloVerdict::TableMismatch {
                        rank,
                        ours,
                        theirs,
                        handler,
                    } => [
                        VERDICT_TABLE,
                        rank,
                        lo(ours),
                        hi(ours),
                        lo(theirs),
                        hi(theirs),
                        handler.map_or(none, u32::from),
                    ],
                    HelloVerdict::SegmentMismatch { rank, ours, theirs } => [
                        VERDICT_SEGMENT,
                        rank,
                        lo(ours),
                        hi(ours),
                        lo(theirs),
                        hi(theirs),
                        none,
                    ],
                    HelloVerdict::TypedMismatch { rank, ours, theirs } => [
                        VERDICT_TYPED,
                        rank,
                        lo(ours.unwrap_or(0)),
                        hi(ours.unwrap_or(0)),
                        lo(theirs.unwrap_or(0)),
                        hi(theirs.unwrap_or(0)),
                        u32::from(ours.is_some()) | u32::from(theirs.is_some()) << 1,
                    ],
                };
                words[..7].copy_from_slice(&w);
                return Encoded {
                    opcode: op::HELLO_VERDICT,
                    kind: Short,
                    category: Request,
                    words,
                    len: 7,
                };
            }
            SystemMsg::Barrier { epoch, round } => (
                op::BARRIER,
                Short,
                Request,
                &[lo(epoch), hi(epoch), u32::from(round)],
            ),
            SystemMsg::Put { op } => (op::PUT, Long, Request, &[op]),
            SystemMsg::PutDone { op, ok } => (op::PUT_DONE, Short, Reply, &[op, u32::from(!ok)]),
            SystemMsg::Get {
                op,
                offset,
                len,
                at,
            } => (
                op::GET,
                Short,
                Request,
                &[op, lo(offset), hi(offset), len, lo(at), hi(at)],
            ),
            SystemMsg::GetData { op, at, ok } => (
                op::GET_DATA,
                Medium,
                Reply,
                &[op, lo(at), hi(at), u32::from(!ok)],
            ),
            // The same words; a created segment's id travels in the Medium's payload.
            SystemMsg::Atomic { op, offset, atomic }
            | SystemMsg::AtomicAt { op, offset, atomic } => {
                let (v, cur) = atomic.operands();
                let (opcode, kind) = match self {
                    SystemMsg::Atomic { .. } => (op::ATOMIC, Short),
                    _ => (op::ATOMIC_AT, Medium),
                };
                return Encoded {
                    opcode,
                    kind,
                    category: Request,
                    words: [
                        op,
                        lo(offset),
                        hi(offset),
                        atomic.wire_word(),
                        lo(v),
                        hi(v),
                        lo(cur),
                        hi(cur),
                    ],
                    len: 8,
                };
            }
            SystemMsg::PutAt { op, seg, offset } => (
                op::PUT_AT,
                Medium,
                Request,
                &[op, seg, lo(offset), hi(offset)],
            ),
            SystemMsg::GetAt {
                op,
                seg,
                offset,
                len,
                at,
            } => (
                op::GET_AT,
                Short,
                Request,
                &[op, seg, lo(offset), hi(offset), len, lo(at), hi(at)],
            ),
            SystemMsg::Atomics { op, count } => (op::ATOMICS, Medium, Request, &[op, count]),
            SystemMsg::PutRegions { op, count } => (op::PUT_REGIONS, Medium, Request, &[op, count]),
            SystemMsg::AtomicDone { op, old, ok } => (
                op::ATOMIC_DONE,
                Short,
                Reply,
                &[op, lo(old), hi(old), u32::from(!ok)],
            ),
            SystemMsg::Exit { code } => (op::EXIT, Short, Request, &[code as u32]),
            SystemMsg::Collective {
                team,
                seq,
                step,
                kind,
                root,
                desc,
            } => (
                op::COLLECTIVE,
                Medium,
                Request,
                &[
                    team.leader,
                    team.serial,
                    lo(seq),
                    hi(seq),
                    step,
                    kind.code(),
                    root,
                    desc,
                ],
            ),
        };
        words[..args.len()].copy_from_slice(args);
        Encoded {
            opcode,
            kind,
            category,
            words,
            len: args.len() as u8,
        }
    }

    /// The message a peer sent as system AM `opcode` of `category` and `kind` with `args`;
    /// [`Misbehavior::BadSystemMessage`] for an unknown opcode, a kind, category or argument
    /// count that opcode never has, a status word other than 0 or 1, a verdict naming no
    /// known status, a barrier round of [`MAX_BARRIER_ROUNDS`] or more, or a collective of
    /// no known [`CollectiveKind`]. A [`SystemMsg::Collective`] may come as a Short though
    /// it encodes as a Medium: a step whose bytes are none, or whole words in the Short's
    /// arguments after its own ([`inline_step_bytes`]).
    pub fn decode(
        category: Category,
        kind: AmKind,
        opcode: u8,
        args: &[u32],
    ) -> Result<SystemMsg, Misbehavior> {
        use AmKind::{Long, Medium, Short};
        use Category::{Reply, Request};
        let bad = Misbehavior::BadSystemMessage(opcode);
        let is_short = kind == Short;
        let flag = |w: u32| match w {
            0 => Ok(true),
            1 => Ok(false),
            _ => Err(bad.clone()),
        };
        let msg = match (opcode, category, kind, args) {
            (op::ACK, Reply, Short, []) => SystemMsg::Ack,
            (op::ACKS, Reply, Short, &[count, granted]) if count > 0 => {
                SystemMsg::Acks { count, granted }
            }
            (op::HELLO, Request, Medium, &[d0, d1, s0, s1]) => SystemMsg::Hello {
                digest: join(d0, d1),
                segment_len: join(s0, s1),
            },
            (op::HELLO_VERDICT, Request, Short, &[VERDICT_TYPED, rank, o0, o1, t0, t1, which])
                if which < 4 =>
            {
                let (ours, theirs) = (join(o0, o1), join(t0, t1));
                SystemMsg::HelloVerdict(HelloVerdict::TypedMismatch {
                    rank,
                    ours: (which & 1 != 0).then_some(ours),
                    theirs: (which & 2 != 0).then_some(theirs),
                })
            }
            (op::HELLO_VERDICT, Request, Short, &[status, rank, o0, o1, t0, t1, id]) => {
                let (ours, theirs) = (join(o0, o1), join(t0, t1));
                let handler = match id {
                    u32::MAX => None,
                    id => Some(u8::try_from(id).map_err(|_| bad.clone())?),
                };
                SystemMsg::HelloVerdict(match (status, handler) {
                    (VERDICT_OK, None) if rank == 0 && ours == 0 && theirs == 0 => HelloVerdict::Ok,
                    (VERDICT_TABLE, _) => HelloVerdict::TableMismatch {
                        rank,
                        ours,
                        theirs,
                        handler,
                    },
                    (VERDICT_SEGMENT, None) => HelloVerdict::SegmentMismatch { rank, ours, theirs },
                    _ => return Err(bad),
                })
            }
            (op::BARRIER, Request, Short, &[e0, e1, round])
                if round < MAX_BARRIER_ROUNDS.into() =>
            {
                SystemMsg::Barrier {
                    epoch: join(e0, e1),
                    round: round as u8,
                }
            }
            (op::PUT, Request, Long, &[op]) => SystemMsg::Put { op },
            (op::PUT_DONE, Reply, Short, &[op, status]) => SystemMsg::PutDone {
                op,
                ok: flag(status)?,
            },
            (op::GET, Request, Short, &[op, o0, o1, len, a0, a1]) => SystemMsg::Get {
                op,
                offset: join(o0, o1),
                len,
                at: join(a0, a1),
            },
            (op::GET_DATA, Reply, Medium, &[op, a0, a1, status]) => SystemMsg::GetData {
                op,
                at: join(a0, a1),
                ok: flag(status)?,
            },
            (op::ATOMIC, Request, Short, &[op, o0, o1, what, v0, v1, c0, c1])
            | (op::ATOMIC_AT, Request, Medium, &[op, o0, o1, what, v0, v1, c0, c1]) => {
                let offset = join(o0, o1);
                let atomic = Atomic::from_wire(what, join(v0, v1), join(c0, c1))
                    .ok_or_else(|| bad.clone())?;
                if opcode == op::ATOMIC {
                    SystemMsg::Atomic { op, offset, atomic }
                } else {
                    SystemMsg::AtomicAt { op, offset, atomic }
                }
            }
            (op::PUT_AT, Request, Medium, &[op, seg, o0, o1]) => SystemMsg::PutAt {
                op,
                seg,
                offset: join(o0, o1),
            },
            (op::GET_AT, Request, Short, &[op, seg, o0, o1, len, a0, a1]) => SystemMsg::GetAt {
                op,
                seg,
                offset: join(o0, o1),
                len,
                at: join(a0, a1),
            },
            (op::ATOMICS, Request, Medium, &[op, count])
                if (1..=MAX_BATCH_ATOMICS).contains(&count) =>
            {
                SystemMsg::Atomics { op, count }
            }
            (op::PUT_REGIONS, Request, Medium, &[op, count]) if count >= 1 => {
                SystemMsg::PutRegions { op, count }
            }
            (op::ATOMIC_DONE, Reply, Short, &[op, v0, v1, status]) => SystemMsg::AtomicDone {
                op,
                old: join(v0, v1),
                ok: flag(status)?,
            },
            (op::EXIT, Request, Short, &[code]) => SystemMsg::Exit { code: code as i32 },
            // A Short's arguments after these are the step's bytes ([`inline_step_bytes`]).
            (
                op::COLLECTIVE,
                Request,
                Short | Medium,
                &[leader, serial, s0, s1, step, kind, root, desc, ref bytes @ ..],
            ) if bytes.is_empty() || (is_short && bytes.len() * 4 <= MAX_INLINE_STEP_BYTES) => {
                SystemMsg::Collective {
                    team: TeamId { leader, serial },
                    seq: join(s0, s1),
                    step,
                    kind: CollectiveKind::from_code(kind).ok_or_else(|| bad.clone())?,
                    root,
                    desc,
                }
            }
            _ => return Err(bad),
        };
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_msg() -> impl Strategy<Value = SystemMsg> {
        let verdict = prop_oneof![
            Just(HelloVerdict::Ok),
            (
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<Option<u8>>()
            )
                .prop_map(|(rank, ours, theirs, handler)| {
                    HelloVerdict::TableMismatch {
                        rank,
                        ours,
                        theirs,
                        handler,
                    }
                }),
            (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(rank, ours, theirs)| {
                HelloVerdict::SegmentMismatch { rank, ours, theirs }
            }),
            (any::<u32>(), any::<Option<u64>>(), any::<Option<u64>>()).prop_map(
                |(rank, ours, theirs)| HelloVerdict::TypedMismatch { rank, ours, theirs }
            ),
        ];
        prop_oneof![
            Just(SystemMsg::Ack),
            (1..=u32::MAX, any::<u32>())
                .prop_map(|(count, granted)| SystemMsg::Acks { count, granted }),
            (any::<u64>(), any::<u64>()).prop_map(|(digest, segment_len)| SystemMsg::Hello {
                digest,
                segment_len
            }),
            verdict.prop_map(SystemMsg::HelloVerdict),
            (any::<u64>(), 0..MAX_BARRIER_ROUNDS)
                .prop_map(|(epoch, round)| SystemMsg::Barrier { epoch, round }),
            any::<u32>().prop_map(|op| SystemMsg::Put { op }),
            (any::<u32>(), any::<bool>()).prop_map(|(op, ok)| SystemMsg::PutDone { op, ok }),
            (any::<u32>(), any::<u64>(), any::<u32>(), any::<u64>()).prop_map(
                |(op, offset, len, at)| SystemMsg::Get {
                    op,
                    offset,
                    len,
                    at
                }
            ),
            (any::<u32>(), any::<u64>(), any::<bool>())
                .prop_map(|(op, at, ok)| SystemMsg::GetData { op, at, ok }),
            any::<i32>().prop_map(|code| SystemMsg::Exit { code }),
            (any::<u32>(), any::<u64>(), any_atomic())
                .prop_map(|(op, offset, atomic)| SystemMsg::Atomic { op, offset, atomic }),
            (any::<u32>(), any::<u64>(), any::<bool>())
                .prop_map(|(op, old, ok)| SystemMsg::AtomicDone { op, old, ok }),
            (any::<u32>(), 1..=MAX_BATCH_ATOMICS)
                .prop_map(|(op, count)| SystemMsg::Atomics { op, count }),
            (any::<u32>(), 1..=u32::MAX)
                .prop_map(|(op, count)| SystemMsg::PutRegions { op, count }),
            (any::<u32>(), any::<u32>(), any::<u64>())
                .prop_map(|(op, seg, offset)| SystemMsg::PutAt { op, seg, offset }),
            (
                any::<(u32, u32)>(),
                any::<u64>(),
                any::<u32>(),
                any::<u64>()
            )
                .prop_map(|((op, seg), offset, len, at)| SystemMsg::GetAt {
                    op,
                    seg,
                    offset,
                    len,
                    at
                }),
            (any::<u32>(), any::<u64>(), any_atomic())
                .prop_map(|(op, offset, atomic)| SystemMsg::AtomicAt { op, offset, atomic }),
            (
                any::<(u32, u32)>(),
                any::<u64>(),
                any::<u32>(),
                1..=12u32,
                any::<(u32, u32)>()
            )
                .prop_map(|((leader, serial), seq, step, kind, (root, desc))| {
                    SystemMsg::Collective {
                        team: TeamId { leader, serial },
                        seq,
                        step,
                        kind: CollectiveKind::from_code(kind).expect("a known kind"),
                        root,
                        desc,
                    }
                }),
        ]
    }

    fn any_atomic() -> impl Strategy<Value = Atomic> {
        (0..11u32, any::<bool>(), 0..3u32, any::<u64>(), any::<u64>()).prop_map(
            |(code, wide, ty, v, cur)| {
                let (width, mask) = if wide {
                    (8, u64::MAX)
                } else {
                    (4, 0xffff_ffff)
                };
                let cur = if code == 3 { cur & mask } else { 0 };
                // No bitwise operation (5..=7) on floats (type 2).
                let ty = if (5..=7).contains(&code) { ty % 2 } else { ty };
                Atomic::from_wire(code | width << 8 | ty << 16, v & mask, cur)
                    .expect("a valid atomic")
            },
        )
    }

    fn any_kind() -> impl Strategy<Value = AmKind> {
        prop_oneof![
            Just(AmKind::Short),
            Just(AmKind::Medium),
            Just(AmKind::Long)
        ]
    }

    fn any_category() -> impl Strategy<Value = Category> {
        prop_oneof![Just(Category::Request), Just(Category::Reply)]
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 8 } else { 2000 },
            ..ProptestConfig::default()
        })]

        /// Every message decodes to itself.
        #[test]
        fn encode_then_decode_is_the_identity(msg in any_msg()) {
            let w = msg.encode();
            prop_assert!(w.args().len() <= MAX_SYSTEM_ARGS);
            prop_assert_eq!(SystemMsg::decode(w.category, w.kind, w.opcode, w.args()), Ok(msg));
        }

        /// A batch entry reads back as written.
        #[test]
        fn atomic_entries_round_trip(offset in any::<u64>(), atomic in any_atomic()) {
            let mut e = Vec::new();
            push_atomic_entry(&mut e, offset, &atomic);
            let e: [u8; ATOMIC_ENTRY_LEN] = e.try_into().unwrap();
            prop_assert_eq!(read_atomic_entry(&e), Some((offset, atomic)));
        }

        /// Whatever a peer sends either is refused as a bad system message naming its opcode,
        /// or decodes to a message that encodes back to exactly what was sent (one encoding
        /// per message: nothing is silently reinterpreted).
        #[test]
        fn decode_refuses_or_is_canonical(
            category in any_category(),
            kind in any_kind(),
            opcode in 0u8..16,
            args in proptest::collection::vec(
                prop_oneof![Just(0u32), Just(1), Just(2), Just(31), Just(32), Just(0x403), Just(0x2_0809), any::<u32>()],
                0..10,
            ),
        ) {
            match SystemMsg::decode(category, kind, opcode, &args) {
                Ok(msg) => {
                    let w = msg.encode();
                    // A collective's step may come as a Short, its bytes in the words after
                    // its own: the same message.
                    let (kind, args) = match (opcode, kind) {
                        (op::COLLECTIVE, AmKind::Short) => (AmKind::Medium, &args[..COLLECTIVE_ARGS]),
                        _ => (kind, &args[..]),
                    };
                    prop_assert_eq!((w.category, w.kind, w.opcode), (category, kind, opcode));
                    prop_assert_eq!(w.args(), args);
                }
                Err(e) => prop_assert_eq!(e, Misbehavior::BadSystemMessage(opcode)),
            }
        }
    }

    /// The wire format is the one of the `u32` codes this type replaced.
    #[test]
    fn known_encodings() {
        let w = SystemMsg::Get {
            op: 3,
            offset: 1 << 32 | 5,
            len: 9,
            at: 2,
        }
        .encode();
        assert_eq!((w.opcode, w.args()), (6, &[3, 5, 1, 9, 2, 0][..]));
        let w = SystemMsg::PutDone { op: 4, ok: false }.encode();
        assert_eq!(
            (w.opcode, w.category, w.args()),
            (5, Category::Reply, &[4, 1][..])
        );
        let w = SystemMsg::Exit { code: -1 }.encode();
        assert_eq!((w.opcode, w.args()), (8, &[u32::MAX][..]));
        assert_eq!(SystemMsg::Ack.encode().args(), &[] as &[u32]);
        let w = SystemMsg::Atomics { op: 7, count: 64 }.encode();
        assert_eq!(
            (w.opcode, w.kind, w.args()),
            (12, AmKind::Medium, &[7, 64][..])
        );
        for count in [0, MAX_BATCH_ATOMICS + 1] {
            assert!(SystemMsg::decode(Category::Request, AmKind::Medium, 12, &[7, count]).is_err());
        }
        // A collective's step is a Medium, or a Short (its bytes, if any, in its arguments);
        // never a Long.
        let step = SystemMsg::Collective {
            team: TeamId {
                leader: 2,
                serial: 1,
            },
            seq: 1 << 32 | 3,
            step: 1,
            kind: CollectiveKind::Barrier,
            root: 0,
            desc: 0,
        };
        let w = step.encode();
        for kind in [AmKind::Short, AmKind::Medium] {
            assert_eq!(
                SystemMsg::decode(w.category, kind, w.opcode, w.args()),
                Ok(step)
            );
        }
        assert!(SystemMsg::decode(w.category, AmKind::Long, w.opcode, w.args()).is_err());
        // A Short's words after the step's own are its bytes, up to what a Short carries; a
        // Medium carries its bytes as its payload, never in words.
        let mut words = w.args().to_vec();
        words.extend([0x0403_0201, 0x0807_0605]);
        assert_eq!(
            SystemMsg::decode(w.category, AmKind::Short, w.opcode, &words),
            Ok(step)
        );
        let mut out = [0u8; MAX_INLINE_STEP_BYTES];
        assert_eq!(
            inline_step_bytes(&words, &mut out),
            [1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(inline_step_bytes(w.args(), &mut out), [] as [u8; 0]);
        assert!(SystemMsg::decode(w.category, AmKind::Medium, w.opcode, &words).is_err());
        words.resize(crate::wire::MAX_ARGS + 1, 0);
        assert!(SystemMsg::decode(w.category, AmKind::Short, w.opcode, &words).is_err());
        assert_eq!(inline_step_bytes(&words, &mut out), [] as [u8; 0]);
        // An entry naming an atomic that does not exist (code 9, width 3).
        let mut e = [0u8; ATOMIC_ENTRY_LEN];
        e[8] = 9;
        e[9] = 3;
        assert_eq!(read_atomic_entry(&e), None);
    }
}
