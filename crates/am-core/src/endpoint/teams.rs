//! The state of teams and of the collectives in flight on them, and each collective's plan
//! of sends and takes: what [`super::coll`]'s engine advances (see its docs for the rules).

use rustc_hash::FxHashMap as HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use crate::error::{AmError, Misbehavior};
use crate::protocol::{opcode, CollectiveKind, FOLD_STEP, FORWARD_STEP, UNFOLD_STEP};
use crate::reduce::Reduction;
use crate::team::{Drops, Team, TeamId};
use crate::transport::Payload;
use crate::types::Rank;

use super::mismatch::{self, Diff, Field, Sig};

/// The most collectives a rank has in flight on one team: a further one waits to start
/// until one completes. It bounds what a rank keeps of its peers' early steps.
pub const MAX_COLLECTIVES_IN_FLIGHT: usize = 64;

/// The most chunks of a collective larger than `max_medium` started on a team and not
/// completed here: a further chunk starts as one completes. Enough to keep a pair of ranks
/// busy on every transport (each chunk is a full Medium), and few, because every advance
/// looks at every collective in flight on the team, and a chunk refused for want of room
/// waits for the next look.
pub const MAX_CHUNKS_IN_FLIGHT: usize = 4;

/// Every this many sequences on a team, a collective that a member may complete before the
/// others have started it (a broadcast, reduce or gather: its root or senders are done once
/// their steps are out) ends with a barrier among the members. So no member completes
/// sequence `s` with that sync before every member has started it, and no member gets more
/// than [`EARLY_WINDOW`] sequences ahead of another.
pub const SYNC_PERIOD: u64 = 32;

/// How far ahead of this rank's next sequence on a team a peer's step may be: at most
/// [`MAX_COLLECTIVES_IN_FLIGHT`] in flight after the last sync the slowest member has
/// started, and a sync every [`SYNC_PERIOD`] sequences.
pub const EARLY_WINDOW: u64 = 2 * MAX_COLLECTIVES_IN_FLIGHT as u64 + SYNC_PERIOD;

/// The most members of a team whose all-reduces may run as a ring
/// ([`crate::AllReduceAlgorithm`]): its `2 (n - 1)` steps stay below the steps of a sync.
pub const RING_MAX_MEMBERS: u32 = 64;

/// Below this `max_medium`, a 2-member all-reduce larger than a Medium runs as a ring under
/// [`crate::AllReduceAlgorithm::Auto`].
pub const RING_PAIR_MEDIUM: usize = 16 * 1024;

/// An all-reduce's root field names its algorithm (an all-reduce has no root): this one is
/// a ring, 0 recursive doubling. Members that chose differently disagree on the root.
pub(super) const RING_ROOT: u32 = 1;

/// Whether a collective of `kind` with root field `root` is a ring all-reduce (its chunks
/// are `n` equal blocks, see [`RING_ROOT`]).
pub(super) fn is_ring(kind: CollectiveKind, root: u32) -> bool {
    kind == CollectiveKind::AllReduce && root == RING_ROOT
}

/// The first step of the barrier that ends a synchronizing collective (round `k` is step
/// `SYNC_STEP + k`): above every member's index, which a gather's root takes as the step
/// of that member's block.
pub(super) const SYNC_STEP: u32 = 1 << 31;

/// One past the largest step any collective's plan takes.
pub(super) const STEP_BOUND: u32 = SYNC_STEP + 32;

/// The peer of a collective's operation slot: no rank, so no reply of a put, get or atomic
/// ever matches it.
pub(super) const NO_PEER: Rank = Rank::MAX;

pub(super) fn misbehaved(peer: Rank, what: Misbehavior) -> AmError {
    AmError::PeerMisbehaved { peer, what }
}

/// The endpoint's teams.
pub(super) struct Teams {
    /// Where dropped [`Team`] handles record their drop.
    pub(super) drops: Arc<Drops>,
    pub(super) world: Team,
    pub(super) world_size: u32,
    /// The serial this rank offers in its next split (used if it leads the new team).
    pub(super) serial: u32,
    pub(super) live: TeamTable,
    /// Steps for teams not known yet, while splits are in flight.
    pub(super) unknown: HashMap<TeamId, Vec<Held>>,
    /// Splits in flight here.
    pub(super) splits: u32,
    /// Collectives in flight here, on every team.
    pub(super) in_flight: u32,
    /// Something a collective in flight may wait for changed since they were last advanced
    /// (a step arrived, a member went): polls advance them only then, or when a peer that a
    /// step waits to be sent to (`stalled`) has a credit again, so that many in flight cost
    /// nothing while nothing comes.
    pub(super) dirty: bool,
    pub(super) stalled: Vec<Rank>,
    /// Peers the device refused a step to during the current advance of a team.
    pub(super) refused: Vec<Rank>,
    /// Notices to send, oldest first: (team, to, first failed sequence, gone member, kind,
    /// and for a mismatch what differs).
    pub(super) notices: std::collections::VecDeque<Notice>,
    /// A peer's misbehavior found outside a delivery (steps held for a team that no split
    /// made), for the next poll.
    pub(super) stray: Option<AmError>,
    /// The teams with collectives in flight, listed by each advance (kept to spare an
    /// allocation per poll).
    pub(super) busy: Vec<TeamId>,
    /// Emptied buffers of steps taken, for the next steps that arrive (at most
    /// [`SPARE_BUFS`], of at most [`SPARE_BUF_BYTES`] each).
    pub(super) spare_bufs: Vec<Vec<u8>>,
    /// A [`Big`] was made here once: advances look for chunks to start from then on.
    pub(super) chunked: bool,
    /// How all-reduces run here ([`crate::Config::all_reduce`]).
    pub(super) all_reduce: crate::AllReduceAlgorithm,
    /// This rank's symmetric heap ([`crate::symmetric`]).
    pub(super) heap: crate::symmetric::Heap,
    /// The symmetric allocation or free in flight (one at a time).
    pub(super) heap_op: Option<crate::symmetric::HeapOp>,
    /// The segment publications and frees in flight ([`super::segments`]).
    pub(super) seg_ops: Vec<crate::segment::SegOp>,
    /// The collectives in segment 0 in flight ([`super::in_segment`]).
    pub(super) in_segment: Vec<super::in_segment::state::InSegment>,
    /// A direct all-reduce's sum and the block being added to it, kept between chunks.
    pub(super) reduce_acc: Vec<u8>,
    pub(super) reduce_other: Vec<u8>,
    /// Set while a collective in segment 0 starts one of its own parts, which no gate holds.
    pub(super) own_start: bool,
    /// Set when a direct move in segment 0 stopped at [`super::in_segment::MOVE_PER_STEP`]
    /// with more to move, until the next advance: a poll then makes progress without a
    /// message, so drivers must not sleep ([`super::Endpoint::has_local_work`]).
    pub(super) moving: bool,
}

pub(super) struct TeamState {
    /// World ranks in team order, and this rank's team rank.
    pub(super) members: Vec<Rank>,
    pub(super) me: u32,
    /// The sequence of the next collective started here.
    pub(super) next_seq: u64,
    /// Collectives in flight, in issue order.
    pub(super) colls: Vec<Coll>,
    /// Steps arrived before their collective wanted them: (sequence, step) -> arrival.
    pub(super) early: HashMap<(u64, u32), Arrival>,
    /// The last handle was dropped: forgotten once `colls` is empty.
    pub(super) freed: bool,
    /// A member is gone: every collective fails with this.
    pub(super) failed: Option<AmError>,
    /// A member told that a member is gone: the collectives from this sequence on fail with
    /// this error at the next advance.
    pub(super) told: Option<(u64, AmError)>,
    /// The gone members the others were told of (once each).
    pub(super) notified: Vec<Rank>,
    /// The others were told of a mismatch (once per team).
    pub(super) mismatch_told: bool,
    /// Sequences not started here whose steps disagreed (from two members), with one of the
    /// senders and what its step said: the collective fails with a mismatch when it starts.
    pub(super) mismatch_at: Vec<(u64, Rank, Sig)>,
    /// Collectives larger than one step, in issue order.
    pub(super) bigs: Vec<Big>,
    /// The plans this member's collectives on the team followed lately, by kind, root and
    /// whether they end with a barrier: most collectives repeat one of a few.
    plans: Vec<(CollectiveKind, u32, bool, Arc<[Action]>)>,
}

/// A collective whose bytes are more than one step carries (`max_medium`): run as chunk
/// collectives on consecutive sequences, each over a slice of them, which every member
/// starts in the same order (so no other collective starts on the team until all its
/// chunks have). Its operation completes with the chunks' results put together once
/// every chunk has completed.
pub(super) struct Big {
    /// The operation slot its chunks share.
    pub(super) index: u32,
    pub(super) gen: u32,
    pub(super) kind: CollectiveKind,
    pub(super) root: u32,
    pub(super) red: Option<Reduction>,
    /// This member's bytes: its block, its reduction's input, the root's broadcast bytes.
    /// A reduction's chunk results replace its input chunk by chunk (each chunk's input
    /// is copied out when the chunk starts), so for a reduction this ends as the result,
    /// as it is the broadcast root's.
    pub(super) data: Vec<u8>,
    /// Bytes of `data` (or of the broadcast) per chunk; the last may be shorter.
    pub(super) chunk: usize,
    pub(super) chunks: u32,
    /// Chunks started and completed.
    pub(super) issued: u32,
    pub(super) done: u32,
    /// The result so far where it is not `data`: the gathered blocks, a non-root's
    /// broadcast bytes.
    pub(super) out: Vec<u8>,
}

impl Coll {
    /// Whether it is a broadcast that member `me` does not root, whose first step (taken)
    /// said more chunks follow: its result is the first chunk of a [`Big`] made here.
    pub(super) fn announces_chunks(&self, me: u32) -> bool {
        self.kind == CollectiveKind::Broadcast && self.root != me && self.desc >= 2
    }

    /// What its steps say of it.
    pub(super) fn sig(&self) -> Sig {
        Sig {
            kind: self.kind,
            root: self.root,
            desc: self.desc,
        }
    }

    /// Whether this collective holds value `v` of `field` (a length: of a block or of its
    /// buffer, what its steps carry), where it can tell.
    pub(super) fn holds(&self, field: Field, v: u64) -> Option<bool> {
        match field {
            Field::Length => {
                Some((self.block > 0 && v == self.block as u64) || v == self.buf.len() as u64)
            }
            field => self.sig().value(field).map(|own| own == v),
        }
    }

    /// The mismatch of a step of `len` bytes from `src` that `part` cannot take.
    pub(super) fn length_mismatch(&self, part: Part, src: Rank, len: usize) -> (Rank, Diff) {
        let want = match part {
            Part::Nothing => 0,
            Part::Block(_) | Part::Fold(_) => self.block,
            Part::Whole | Part::Lower | Part::Upper => self.buf.len(),
        };
        (src, Diff::length(len, want))
    }

    /// Takes step `a` as `part` of this collective's buffer, the step its plan is at, and
    /// goes on to the next; false (nothing taken) if its length is not the one `part`
    /// takes. Its kind, root and reduction were checked against this one's when it came (or
    /// when this one started).
    pub(super) fn take(&mut self, part: Part, a: &mut Arrival) -> bool {
        let len = self.block;
        let fits = match part {
            Part::Nothing => a.data.is_empty(),
            Part::Block(_) => a.data.len() == len,
            // A broadcast's length is the root's.
            Part::Whole => self.kind == CollectiveKind::Broadcast || a.data.len() == self.buf.len(),
            Part::Lower | Part::Upper => a.data.len() == self.buf.len(),
            Part::Fold(_) => a.data.len() == len,
        };
        if !fits {
            return false;
        }
        match part {
            Part::Nothing => {}
            Part::Block(b) => {
                self.buf[b as usize * len..(b as usize + 1) * len].copy_from_slice(&a.data)
            }
            Part::Whole => {
                if self.kind == CollectiveKind::Broadcast {
                    // The root's count of chunks, forwarded with the bytes.
                    self.desc = a.desc;
                    self.took_from = a.src;
                }
                self.buf = std::mem::take(&mut a.data)
            }
            Part::Lower | Part::Upper => {
                if let Some(red) = &self.red {
                    red.combine(&mut self.buf, &a.data, part == Part::Upper);
                }
            }
            Part::Fold(b) => {
                if let Some(red) = &self.red {
                    let block = &mut self.buf[b as usize * len..(b as usize + 1) * len];
                    red.combine(block, &a.data, false);
                }
            }
        }
        self.at += 1;
        true
    }
}

impl Big {
    /// The slice of `data` chunk `k` covers.
    pub(super) fn range(&self, k: u32) -> std::ops::Range<usize> {
        let from = (k as usize * self.chunk).min(self.data.len());
        from..(from + self.chunk).min(self.data.len())
    }
}

/// A step for a team not known yet: its sequence, step and arrival.
pub(super) type Held = (u64, u32, Arrival);

/// The gone member an error names and the notice that tells the team of it, if it is a
/// member's loss or departure.
pub(super) fn gone_notice(e: &AmError) -> Option<(Rank, CollectiveKind)> {
    match *e {
        AmError::PeerLost(p) => Some((p, CollectiveKind::MemberLost)),
        AmError::PeerDeparted(p) => Some((p, CollectiveKind::MemberDeparted)),
        _ => None,
    }
}

pub(super) struct Arrival {
    pub(super) src: Rank,
    pub(super) kind: CollectiveKind,
    pub(super) root: u32,
    pub(super) desc: u32,
    pub(super) data: Vec<u8>,
}

impl Arrival {
    /// What the step says of its collective.
    pub(super) fn sig(&self) -> Sig {
        Sig {
            kind: self.kind,
            root: self.root,
            desc: self.desc,
        }
    }
}

/// A notice to send: (team, to, first failed sequence, gone member, kind, and for a
/// mismatch what differs, as its finder sees it).
pub(super) type Notice = (TeamId, Rank, u64, Rank, CollectiveKind, Option<Diff>);

/// A collective in flight: its plan of sends and takes, taken in order, over one buffer.
pub(super) struct Coll {
    pub(super) seq: u64,
    /// Its operation slot.
    pub(super) index: u32,
    pub(super) gen: u32,
    pub(super) kind: CollectiveKind,
    /// The root's team rank (0 where there is none).
    pub(super) root: u32,
    /// The reduction's word (0 where there is none).
    pub(super) desc: u32,
    pub(super) red: Option<Reduction>,
    /// The block length of a gather or all-gather.
    pub(super) block: usize,
    /// What it sends from and takes into: the gathered blocks, the broadcast bytes, the
    /// reduction's partial result.
    pub(super) buf: Vec<u8>,
    /// Shared with the team's other collectives of the same plan ([`TeamState::plan_of`]).
    pub(super) plan: Arc<[Action]>,
    /// The next action of `plan`.
    pub(super) at: usize,
    /// A member that started another collective under this sequence (or another root,
    /// reduction or length), and what differs: the collective fails with
    /// [`AmError::CollectiveMismatch`].
    pub(super) mismatch: Option<(Rank, Diff)>,
    /// Which chunk of a [`Big`] (sharing its slot) it is.
    pub(super) chunk: Option<u32>,
    /// The member a broadcast's bytes came from (its parent in the tree).
    pub(super) took_from: Rank,
}

pub(super) use super::mismatch::CHUNKS_LEFT_SHIFT;
/// The most chunks left a step's word holds, above [`CHUNKS_LEFT_SHIFT`].
pub(super) const CHUNKS_LEFT_MAX: u32 = (1 << (32 - CHUNKS_LEFT_SHIFT)) - 1;

/// Whether a step of `a`'s agrees with a collective of `kind` rooted at `root` with
/// reduction word `desc`. A broadcast's word is the root's count of chunks, which the
/// others learn from its first step.
pub(super) fn agrees(kind: CollectiveKind, root: u32, desc: u32, a: &Arrival) -> bool {
    a.kind == kind && a.root == root && (kind == CollectiveKind::Broadcast || a.desc == desc)
}

/// One action of a collective's plan: peers are team ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Send { to: u32, step: u32, part: Part },
    Take { from: u32, step: u32, part: Part },
}

/// Which part of a collective's buffer an action sends, or what a take does with the
/// bytes that came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// No bytes (a barrier).
    Nothing,
    /// Block `b` (of the collective's block length).
    Block(u32),
    /// The whole buffer; a take replaces it.
    Whole,
    /// A take that combines: the bytes cover lower team ranks than the buffer,
    /// `buf = op(bytes, buf)`.
    Lower,
    /// A take that combines: the bytes cover higher team ranks, `buf = op(buf, bytes)`.
    Upper,
    /// A take that combines into block `b`: `block = op(bytes, block)` (a ring's
    /// reduce-scatter; its operation is commutative).
    Fold(u32),
}

/// `n - 1` steps round a ring from step `first`: at step `first + s` this member sends its
/// block `me + shift - s` to the next member and takes block `me + shift - 1 - s` from the
/// one before (all modulo `n`), doing `take` with it.
fn ring(p: &mut Vec<Action>, n: u32, me: u32, first: u32, shift: u32, take: fn(u32) -> Part) {
    for s in 0..n - 1 {
        p.push(Action::Send {
            to: (me + 1) % n,
            step: first + s,
            part: Part::Block((me + shift + n - s) % n),
        });
        p.push(Action::Take {
            from: (me + n - 1) % n,
            step: first + s,
            part: take((me + shift + 2 * n - 1 - s) % n),
        });
    }
}

/// Whether collective `seq` of `kind` ends with a barrier among the members (see
/// [`SYNC_PERIOD`]).
fn ends_with_barrier(kind: CollectiveKind, seq: u64) -> bool {
    matches!(
        kind,
        CollectiveKind::Broadcast | CollectiveKind::Reduce | CollectiveKind::Gather
    ) && seq % SYNC_PERIOD == SYNC_PERIOD - 1
}

/// How many emptied step buffers the teams keep: a small collective's steps then allocate
/// nothing.
const SPARE_BUFS: usize = 16;

/// The largest step buffer the teams keep, in bytes.
const SPARE_BUF_BYTES: usize = 4096;

impl Teams {
    /// Keeps the emptied buffer of a step taken for a later step, if it is small.
    #[inline]
    pub(super) fn spare(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() != 0
            && buf.capacity() <= SPARE_BUF_BYTES
            && self.spare_bufs.len() < SPARE_BUFS
        {
            buf.clear();
            self.spare_bufs.push(buf);
        }
    }
}

/// The teams this rank is a member of, by id. The world team, which most collectives use,
/// is kept apart: finding it is one comparison, not a hash lookup.
#[derive(Default)]
pub(super) struct TeamTable {
    world: Option<TeamState>,
    others: HashMap<TeamId, TeamState>,
}

impl TeamTable {
    #[inline]
    pub(super) fn get(&self, id: &TeamId) -> Option<&TeamState> {
        match *id == TeamId::WORLD {
            true => self.world.as_ref(),
            false => self.others.get(id),
        }
    }

    #[inline]
    pub(super) fn get_mut(&mut self, id: &TeamId) -> Option<&mut TeamState> {
        match *id == TeamId::WORLD {
            true => self.world.as_mut(),
            false => self.others.get_mut(id),
        }
    }

    pub(super) fn contains_key(&self, id: &TeamId) -> bool {
        self.get(id).is_some()
    }

    pub(super) fn insert(&mut self, id: TeamId, ts: TeamState) -> Option<TeamState> {
        match id == TeamId::WORLD {
            true => self.world.replace(ts),
            false => self.others.insert(id, ts),
        }
    }

    pub(super) fn remove(&mut self, id: &TeamId) -> Option<TeamState> {
        match *id == TeamId::WORLD {
            true => self.world.take(),
            false => self.others.remove(id),
        }
    }

    pub(super) fn len(&self) -> usize {
        usize::from(self.world.is_some()) + self.others.len()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&TeamId, &TeamState)> {
        let world = self.world.iter().map(|ts| (&TeamId::WORLD, ts));
        world.chain(self.others.iter())
    }

    pub(super) fn iter_mut(&mut self) -> impl Iterator<Item = (&TeamId, &mut TeamState)> {
        let world = self.world.iter_mut().map(|ts| (&TeamId::WORLD, ts));
        world.chain(self.others.iter_mut())
    }

    pub(super) fn retain(&mut self, mut keep: impl FnMut(&TeamId, &mut TeamState) -> bool) {
        if self
            .world
            .as_mut()
            .is_some_and(|ts| !keep(&TeamId::WORLD, ts))
        {
            self.world = None;
        }
        self.others.retain(|id, ts| keep(id, ts));
    }
}

/// How many plans a team keeps ([`TeamState::plan_of`]).
const PLANS_KEPT: usize = 8;

/// `2^k`, if it is below `n`.
pub(super) fn pow_below(k: u32, n: u32) -> Option<u32> {
    1u32.checked_shl(k).filter(|&d| d < n)
}

/// The plan of a collective of `kind` for team rank `me` of `n` with root `root` (a team
/// rank below `n`): the algorithms of the [module docs](self).
pub(super) fn plan(
    kind: CollectiveKind,
    n: u32,
    me: u32,
    root: u32,
    seq: u64,
    mut p: Vec<Action>,
) -> Vec<Action> {
    use Action::{Send, Take};
    p.clear();
    let sync = ends_with_barrier(kind, seq);
    let rel = |vr: u32| (root + vr) % n;
    match kind {
        CollectiveKind::Barrier => {
            let mut k = 0;
            while let Some(d) = pow_below(k, n) {
                p.push(Send {
                    to: (me + d) % n,
                    step: k,
                    part: Part::Nothing,
                });
                p.push(Take {
                    from: (me + n - d) % n,
                    step: k,
                    part: Part::Nothing,
                });
                k += 1;
            }
        }
        CollectiveKind::AllGather
        | CollectiveKind::Split
        | CollectiveKind::PublishSegment
        | CollectiveKind::FreeSegment
        | CollectiveKind::InSegment => ring(&mut p, n, me, 0, 0, Part::Block),
        CollectiveKind::Broadcast => {
            let vr = (me + n - root) % n;
            let children_below = if vr == 0 {
                32 - (n - 1).leading_zeros()
            } else {
                let k = vr.trailing_zeros();
                p.push(Take {
                    from: rel(vr - (1 << k)),
                    step: k,
                    part: Part::Whole,
                });
                k
            };
            // The largest subtree first: its leaves are the farthest.
            for j in (0..children_below).rev() {
                if vr + (1 << j) < n {
                    p.push(Send {
                        to: rel(vr + (1 << j)),
                        step: j,
                        part: Part::Whole,
                    });
                }
            }
        }
        CollectiveKind::Reduce => {
            let mut k = 0;
            while let Some(d) = pow_below(k, n) {
                if me & d != 0 {
                    p.push(Send {
                        to: me - d,
                        step: k,
                        part: Part::Whole,
                    });
                    break;
                }
                if me + d < n {
                    p.push(Take {
                        from: me + d,
                        step: k,
                        part: Part::Upper,
                    });
                }
                k += 1;
            }
            if root != 0 && me == 0 {
                p.push(Send {
                    to: root,
                    step: FORWARD_STEP,
                    part: Part::Whole,
                });
            }
            if root != 0 && me == root {
                p.push(Take {
                    from: 0,
                    step: FORWARD_STEP,
                    part: Part::Whole,
                });
            }
        }
        CollectiveKind::AllReduce if is_ring(kind, root) => {
            // A ring of `n` blocks. Reduce-scatter: at step `s` this member passes on the
            // block it folded last (its own at first) and folds the one before it into its
            // copy; after `n - 1` steps its block `me + 1` holds every member's share.
            ring(&mut p, n, me, 0, 0, Part::Fold);
            // All-gather from there: the reduced blocks go round, each replacing the copy.
            ring(&mut p, n, me, n - 1, 1, Part::Block);
        }
        CollectiveKind::AllReduce => {
            // Recursive doubling over the largest power of two `q` not above `n`; the first
            // `2 * rest` members fold in pairs first (the odd one of each pair takes part).
            let q = 1u32 << (31 - n.leading_zeros());
            let rest = n - q;
            let nr = if me < 2 * rest {
                if me.is_multiple_of(2) {
                    p.push(Send {
                        to: me + 1,
                        step: FOLD_STEP,
                        part: Part::Whole,
                    });
                    p.push(Take {
                        from: me + 1,
                        step: UNFOLD_STEP,
                        part: Part::Whole,
                    });
                    return p;
                }
                p.push(Take {
                    from: me - 1,
                    step: FOLD_STEP,
                    part: Part::Lower,
                });
                me / 2
            } else {
                me - rest
            };
            let of = |r: u32| if r < rest { 2 * r + 1 } else { r + rest };
            let mut k = 0;
            while let Some(d) = pow_below(k, q) {
                let partner = nr ^ d;
                p.push(Send {
                    to: of(partner),
                    step: k + 1,
                    part: Part::Whole,
                });
                p.push(Take {
                    from: of(partner),
                    step: k + 1,
                    part: if partner < nr {
                        Part::Lower
                    } else {
                        Part::Upper
                    },
                });
                k += 1;
            }
            if me < 2 * rest {
                p.push(Send {
                    to: me - 1,
                    step: UNFOLD_STEP,
                    part: Part::Whole,
                });
            }
        }
        CollectiveKind::Gather => {
            if me == root {
                for s in (0..n).filter(|&s| s != root) {
                    p.push(Take {
                        from: s,
                        step: s,
                        part: Part::Block(s),
                    });
                }
            } else {
                p.push(Send {
                    to: root,
                    step: me,
                    part: Part::Whole,
                });
            }
        }
        CollectiveKind::MemberLost | CollectiveKind::MemberDeparted | CollectiveKind::Mismatch => {}
    }
    if sync {
        let mut k = 0;
        while let Some(d) = pow_below(k, n) {
            p.push(Send {
                to: (me + d) % n,
                step: SYNC_STEP + k,
                part: Part::Nothing,
            });
            p.push(Take {
                from: (me + n - d) % n,
                step: SYNC_STEP + k,
                part: Part::Nothing,
            });
            k += 1;
        }
    }
    p
}

impl TeamState {
    pub(super) fn new(members: Vec<Rank>, me: u32) -> TeamState {
        TeamState {
            members,
            me,
            next_seq: 0,
            colls: Vec::new(),
            early: HashMap::default(),
            freed: false,
            failed: None,
            told: None,
            notified: Vec::new(),
            mismatch_told: false,
            mismatch_at: Vec::new(),
            bigs: Vec::new(),
            plans: Vec::new(),
        }
    }

    /// The plan of this member's collective `seq` of `kind` rooted at team rank `root`
    /// (below the team's size), from those kept or made now.
    pub(super) fn plan_of(&mut self, kind: CollectiveKind, root: u32, seq: u64) -> Arc<[Action]> {
        let sync = ends_with_barrier(kind, seq);
        if let Some((.., p)) = self
            .plans
            .iter()
            .find(|&&(k, r, s, _)| (k, r, s) == (kind, root, sync))
        {
            return p.clone();
        }
        let n = self.members.len() as u32;
        let p: Arc<[Action]> = plan(kind, n, self.me, root, seq, Vec::new()).into();
        if self.plans.len() == PLANS_KEPT {
            self.plans.remove(0);
        }
        self.plans.push((kind, root, sync, p.clone()));
        p
    }

    /// The member (world rank) that sends step `step` of collective `seq` of `kind` rooted
    /// at team rank `root` to this rank, if any.
    pub(super) fn sender_of(
        &mut self,
        kind: CollectiveKind,
        seq: u64,
        step: u32,
        root: u32,
    ) -> Option<Rank> {
        let n = self.members.len() as u32;
        let me = self.me;
        if root >= n {
            return None;
        }
        let from = match kind {
            CollectiveKind::Barrier => (me + n - pow_below(step, n)?) % n,
            k if k.gathers_all() && step < n - 1 => (me + n - 1) % n,
            CollectiveKind::Gather if me == root && step < n && step != root => step,
            CollectiveKind::Broadcast
            | CollectiveKind::Reduce
            | CollectiveKind::AllReduce
            | CollectiveKind::Gather => {
                self.plan_of(kind, root, seq)
                    .iter()
                    .find_map(|a| match *a {
                        Action::Take { from, step: s, .. } if s == step => Some(from),
                        _ => None,
                    })?
            }
            _ => return None,
        };
        self.members.get(from as usize).copied()
    }

    /// Keeps a step of a peer's for the collective that takes it, or takes it at once where
    /// that collective's plan is at it: the buffer left to spare (empty if none), or `None`
    /// if no collective here can take it.
    pub(super) fn arrive(
        &mut self,
        src: Rank,
        seq: u64,
        step: u32,
        mut a: Arrival,
    ) -> Option<Vec<u8>> {
        if self.sender_of(a.kind, seq, step, a.root) != Some(src) {
            return None;
        }
        let in_flight = self.colls.iter_mut().find(|c| c.seq == seq);
        if self.failed.is_some() && in_flight.is_none() {
            // A member is gone: a survivor's step of a collective failed here is dropped.
            return Some(Vec::new());
        }
        let wanted = match in_flight {
            Some(c) => {
                let disagrees = !agrees(c.kind, c.root, c.desc, &a);
                if disagrees {
                    c.mismatch.get_or_insert((src, c.sig().diff(&a.sig())));
                }
                let taken = c.plan[..c.at]
                    .iter()
                    .any(|x| matches!(x, Action::Take { step: s, .. } if *s == step));
                if taken {
                    // A step it has taken already: from a member that started another
                    // collective under `seq`, a disagreement; else not our protocol.
                    return disagrees.then(Vec::new);
                }
                match c.plan.get(c.at) {
                    // The step its plan is at: taken now, not kept to be taken at the next
                    // advance (a collective that disagrees takes nothing more). One kept
                    // already (it came before the take on arrival of the step before it)
                    // makes this one its repeat, found below.
                    Some(&Action::Take { step: s, part, .. })
                        if s == step
                            && c.mismatch.is_none()
                            && !self.early.contains_key(&(seq, step)) =>
                    {
                        if !c.take(part, &mut a) {
                            c.mismatch = Some(c.length_mismatch(part, src, a.data.len()));
                        }
                        return Some(a.data);
                    }
                    _ => true,
                }
            }
            None => seq >= self.next_seq && seq - self.next_seq < EARLY_WINDOW,
        };
        if !wanted {
            return None;
        }
        match self.early.entry((seq, step)) {
            // The same step twice from its sender: not our protocol.
            Entry::Occupied(o) if (o.get().src, o.get().kind) == (src, a.kind) => None,
            // Two members that started different collectives under `seq` may both send
            // this step: a disagreement, not a peer's misbehavior.
            Entry::Occupied(o) => {
                match self.colls.iter_mut().find(|c| c.seq == seq) {
                    Some(c) => {
                        // The one of the two that disagrees with this collective.
                        let kept = o.get();
                        let named = match agrees(c.kind, c.root, c.desc, &a) {
                            true => (kept.src, c.sig().diff(&kept.sig())),
                            false => (src, c.sig().diff(&a.sig())),
                        };
                        c.mismatch.get_or_insert(named);
                    }
                    None => {
                        if self.mismatch_at.len() < MAX_COLLECTIVES_IN_FLIGHT {
                            self.mismatch_at.push((seq, src, a.sig()));
                        }
                    }
                }
                Some(a.data)
            }
            Entry::Vacant(v) => {
                v.insert(a);
                Some(Vec::new())
            }
        }
    }

    /// Whether a start must wait: [`MAX_COLLECTIVES_IN_FLIGHT`] in flight, or the oldest in
    /// flight that many sequences back (collectives complete out of order: a bound on the
    /// count alone would not bound how far ahead of the oldest this member runs).
    pub(super) fn window_full(&self) -> bool {
        self.colls.len() >= MAX_COLLECTIVES_IN_FLIGHT
            || self
                .colls
                .first()
                .is_some_and(|c| self.next_seq - c.seq >= MAX_COLLECTIVES_IN_FLIGHT as u64)
    }

    /// Whether a start must wait: the window is full, or the start is gated.
    pub(super) fn must_wait(&self) -> bool {
        self.window_full() || self.gated()
    }

    /// Whether a start must wait for the team's earlier collectives to have taken their
    /// sequences: a [`Big`] still starting chunks, or a broadcast this rank does not root
    /// whose first step has not come (it may be the first chunk of a big one).
    pub(super) fn gated(&self) -> bool {
        self.bigs.iter().any(|b| b.issued < b.chunks)
            || self.colls.iter().any(|c| {
                c.kind == CollectiveKind::Broadcast
                    && c.chunk.is_none()
                    && c.root != self.me
                    && (c.at == 0 || c.desc > 1)
            })
    }

    /// Whether collective `c` still needs a step from `peer` that has not arrived.
    pub(super) fn still_needs(&self, c: &Coll, peer: Rank) -> bool {
        c.plan[c.at..].iter().any(|a| match *a {
            Action::Take { from, step, .. } => {
                self.members.get(from as usize) == Some(&peer)
                    && !self.early.contains_key(&(c.seq, step))
            }
            Action::Send { .. } => false,
        })
    }
}

impl Teams {
    /// Whether collectives in segment 0 are in flight (which later ones may wait for).
    #[inline]
    pub(super) fn in_segment_pending(&self) -> bool {
        !self.in_segment.is_empty()
    }

    pub(super) fn new(rank: Rank, size: u32) -> Teams {
        let drops = Arc::new(Drops::default());
        let members: Vec<Rank> = (0..size).collect();
        let world = Team::new(TeamId::WORLD, members.clone(), rank, drops.clone());
        let mut live = TeamTable::default();
        live.insert(TeamId::WORLD, TeamState::new(members, rank));
        Teams {
            drops,
            world,
            world_size: size,
            serial: 1,
            live,
            unknown: HashMap::default(),
            splits: 0,
            in_flight: 0,
            dirty: false,
            stalled: Vec::new(),
            refused: Vec::new(),
            notices: std::collections::VecDeque::new(),
            stray: None,
            busy: Vec::new(),
            spare_bufs: Vec::new(),
            chunked: false,
            all_reduce: crate::AllReduceAlgorithm::Auto,
            heap: crate::symmetric::Heap::default(),
            heap_op: None,
            seg_ops: Vec::new(),
            in_segment: Vec::new(),
            reduce_acc: Vec::new(),
            reduce_other: Vec::new(),
            own_start: false,
            moving: false,
        }
    }

    /// A delivered [`SystemMsg::Collective`] (see the [module docs](self) for what is kept).
    pub(super) fn arrive(
        &mut self,
        src: Rank,
        (team, seq, step, kind, root, desc): (TeamId, u64, u32, CollectiveKind, u32, u32),
        payload: Payload<'_>,
        max_medium: usize,
    ) -> Result<(), AmError> {
        let stray = || misbehaved(src, Misbehavior::StrayCollective { team, seq, step });
        if payload.len() > max_medium || (kind == CollectiveKind::Barrier && !payload.is_empty()) {
            return Err(misbehaved(
                src,
                Misbehavior::BadSystemMessage(opcode::COLLECTIVE),
            ));
        }
        if matches!(
            kind,
            CollectiveKind::MemberLost | CollectiveKind::MemberDeparted | CollectiveKind::Mismatch
        ) {
            let mut words = Vec::new();
            if payload.len() <= mismatch::NOTICE_LEN {
                payload.append_to(&mut words);
            }
            return self.told(src, team, seq, step, kind, &words, payload.len());
        }
        let mut data = match payload.len() {
            0 => Vec::new(),
            _ => self.spare_bufs.pop().unwrap_or_default(),
        };
        payload.append_to(&mut data);
        let a = Arrival {
            src,
            kind,
            root,
            desc,
            data,
        };
        if let Some(ts) = self.live.get_mut(&team) {
            return match ts.arrive(src, seq, step, a) {
                Some(taken) => {
                    self.spare(taken);
                    self.dirty = true;
                    Ok(())
                }
                None => Err(stray()),
            };
        }
        // A team not known here: only while a split that may make it is in flight.
        let held = self.unknown.len();
        let limit = EARLY_WINDOW as usize * (self.world_size as usize + 2);
        let steps = match self.unknown.entry(team) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) if held < self.splits as usize => v.insert(Vec::new()),
            Entry::Vacant(_) => return Err(stray()),
        };
        let step_bound = self.world_size.max(STEP_BOUND);
        if seq >= EARLY_WINDOW
            || step >= step_bound
            || steps.len() >= limit
            || src >= self.world_size
        {
            return Err(stray());
        }
        steps.push((seq, step, a));
        Ok(())
    }
}

impl Teams {
    /// A member's notice that member `gone` of `team` is gone (or, for a
    /// [`CollectiveKind::Mismatch`], started another collective), from sequence `seq` on. A
    /// notice for a team not known here is dropped (this rank may have freed it, or not
    /// made it yet: its collectives then fail as the gone member's own steps fail to come).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn told(
        &mut self,
        src: Rank,
        team: TeamId,
        seq: u64,
        gone: Rank,
        kind: CollectiveKind,
        words: &[u8],
        len: usize,
    ) -> Result<(), AmError> {
        let Some(ts) = self.live.get_mut(&team) else {
            return Ok(());
        };
        let me = ts.members.get(ts.me as usize).copied();
        let member = |r: Rank| ts.members.contains(&r);
        let mismatch = kind == CollectiveKind::Mismatch;
        // A mismatch carries what differs; a gone member's notice nothing.
        let diff = Diff::decode(words);
        let well_formed = match mismatch {
            true => len == mismatch::NOTICE_LEN && diff.is_some(),
            false => len == 0,
        };
        if !well_formed
            || !member(src)
            || !member(gone)
            || (!mismatch && (Some(gone) == me || gone == src))
        {
            return Err(misbehaved(
                src,
                Misbehavior::StrayCollective {
                    team,
                    seq,
                    step: gone,
                },
            ));
        }
        let error = match kind {
            CollectiveKind::MemberLost => AmError::PeerLost(gone),
            CollectiveKind::Mismatch => {
                // In this member's words (the rule is in `AmError::CollectiveMismatch`'s
                // docs): against its own collective of `seq`, if it has started it.
                let diff = diff.unwrap_or(Diff::STEPS);
                let me = me.unwrap_or(src);
                let c = ts.colls.iter().find(|c| c.seq == seq);
                let holds = |v| c.and_then(|c| c.holds(diff.field, v));
                if holds(diff.peer) == Some(true) && holds(diff.agrees) != Some(true) {
                    diff.swapped().error(team, src, me.min(gone))
                } else if holds(diff.agrees) == Some(true) {
                    diff.error(team, gone, me.min(src))
                } else {
                    diff.error(team, gone, src)
                }
            }
            _ => AmError::PeerDeparted(gone),
        };
        // Every later collective fails when it starts; those in flight from `seq` on at
        // the next advance.
        ts.failed.get_or_insert_with(|| error.clone());
        if ts.told.as_ref().is_none_or(|&(s, _)| seq < s) {
            ts.told = Some((seq, error));
        }
        // Already told: this rank need not tell the others again.
        if mismatch {
            ts.mismatch_told = true;
        } else if !ts.notified.contains(&gone) {
            ts.notified.push(gone);
        }
        self.dirty = true;
        Ok(())
    }
}
