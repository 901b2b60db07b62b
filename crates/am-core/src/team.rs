//! Teams: ordered subsets of the job's ranks on which collectives run ([`Team`]).
//!
//! Every node has the world team ([`crate::Node::world_team`]): every rank of the job, in
//! rank order. A team is split into smaller ones by a collective call of all its members
//! ([`crate::Node::split`], MPI's `MPI_Comm_split`): members that give the same color form
//! one team, ordered by the key they gave, then by their rank in the world; a member that
//! gives no color (`None`) gets no team. Collectives then run on a team
//! ([`crate::Node::team_barrier`], [`crate::Node::team_all_gather`]), each one a collective
//! call of every member of that team, blocking, non-blocking (`_nb`, an [`crate::Op`]) or
//! async, like every operation (see [`crate::op`]), several in flight at once.
//!
//! The collectives are [`crate::Node::team_barrier`], [`crate::Node::team_broadcast`],
//! [`crate::Node::team_gather`], [`crate::Node::team_all_gather`],
//! [`crate::Node::team_reduce`] and [`crate::Node::team_all_reduce`]. A reduction applies
//! a built-in [`crate::ReduceOp`] (`Sum`, `Min`, `Max`, ...) over the integer and float
//! types, or `ReduceOp::User(id)`, an operation registered with
//! [`crate::Handlers::reduction`], also over a program's own structs as
//! [`crate::Plain`]`<T>` (see [`crate::reduce`]).
//!
//! # Names
//! A team is known on the wire by its [`TeamId`]: the world rank of its first member (its
//! *leader*) and a serial number the leader had not used before, agreed during the split
//! (every member hears every member's next serial in the split's all-gather). No two teams
//! alive in a job share an id; the world team is `(0, 0)`, and serials start at 1.
//!
//! Under `run_job_endpoints` the world is every endpoint of every process; the two splits
//! that several endpoints per process make natural are one team per process (`color` = the
//! layout's process of the rank) and one per endpoint index (`color` = its endpoint index),
//! each keyed by the world rank.
//!
//! # Lifetime
//! A [`Team`] is a cheap handle (clones share it) and does not borrow its node: dropping the
//! last clone records the drop in state the endpoint shares, as a dropped [`crate::Op`] does,
//! and the endpoint forgets the team once its collectives in flight here have completed;
//! [`crate::Node::free_team`] does the same at once, whatever clones remain. Freeing is
//! local: a member that frees a team while another still starts a collective on
//! it gets that peer's messages refused as [`crate::error::Misbehavior::StrayCollective`].
//!
//! # Algorithms
//! Every collective is built on the library's system Mediums, so every transport runs it:
//!
//! | collective | algorithm | steps |
//! |---|---|---|
//! | barrier | dissemination | ⌈log2 n⌉ |
//! | broadcast | binomial tree from the root | ⌈log2 n⌉ |
//! | reduce | binomial tree towards team rank 0, forwarded to the root | ⌈log2 n⌉ (+1) |
//! | all-reduce | recursive doubling (a fold before and after where `n` is not a power of two), or a ring of reduce-scatter then all-gather | ⌈log2 n⌉ (+2), or `2 (n - 1)` |
//! | gather | each member to the root | 1 |
//! | all-gather, split | ring | `n - 1` |
//!
//! A payload larger than the transport's `max_medium` runs as chunks of it, each a
//! collective of its own on the next sequence (several in flight). An all-reduce runs by
//! recursive doubling up to `max_medium` and as a ring above it (on 3 to
//! [`crate::endpoint::RING_MAX_MEMBERS`] members, on 2 where Mediums are small, over the
//! built-in operations, which commute): each member then sends and reduces `(n - 1) / n`
//! of the vector rather than all of it ⌈log2 n⌉ times. [`crate::Config::all_reduce`]
//! (`AM_ALLREDUCE=auto|doubling|ring`) forces either; every member of a team must choose
//! the same ([`crate::AmError::CollectiveMismatch`] otherwise).
//!
//! Results land in private buffers (a `Vec` per collective): the library owns no memory at
//! a peer.
//!
//! # In segment 0
//! [`crate::Node::team_broadcast_in_segment`] and [`crate::Node::team_all_reduce_in_segment`]
//! (OpenSHMEM's `shmem_broadcastmem` and `shmem_sum_reduce` on symmetric memory) take
//! their source and destination as ranges of each member's segment 0, which may be at
//! different offsets on different members (a [`crate::Symmetric`] block is the same on
//! all). Where the NIC reads and writes peers' memory ([`crate::Capabilities`] `get` and
//! `put`: loopback, sci, extoll, portals, ofi) the bytes move straight between the
//! segments, each member doing its share: a broadcast's members copy the root's bytes,
//! and in an all-reduce member `r` reduces the `r`-th block of every member's source and
//! writes it into every member's destination. An all-gather of the members' arguments
//! comes before (every member has entered: its source is ready and its destination free)
//! and an all-reduce of every member's status after (every write is complete, or a
//! member's NIC refused its share and the collective fails on every member:
//! [`crate::AmError::MemberFailed`]). Elsewhere (udp) the bytes go as
//! [`crate::Node::team_broadcast`]'s and [`crate::Node::team_all_reduce`]'s do and are
//! written into the destination. Those two collectives of the team cost some
//! microseconds, so these pay from some tens of KiB; below, the `Vec` forms are faster.
//! The team's later collectives wait to start here until the last of them has started.
//! A member's share moves about 256 KiB at a time, a step per advance of the collective (a
//! poll or a wait's turn): between those steps a [`crate::SharedNode`]'s other threads get
//! the node back, and a driver of its own polls again at once rather than sleep
//! ([`crate::endpoint::Endpoint::has_local_work`], and [`crate::Node::arm`] says
//! [`crate::Armed::Ready`]).
//!
//! ```
//! use amnet::{Config, Handlers, Loopback, Node, ReduceOp};
//!
//! fn main() {
//!     amnet::run_ranks(Loopback::cluster(2, Default::default()), |t| {
//!         let config = Config::default().symmetric_size(64 << 10);
//!         let mut node = Node::new(t, Handlers::new(), config).unwrap();
//!         let world = node.world_team();
//!         let n = 1024;
//!         let src = node.alloc_symmetric(&world, 8 * n).unwrap();
//!         let dest = node.alloc_symmetric(&world, 8 * n).unwrap();
//!         let me = u64::from(node.rank());
//!         let mine: Vec<u8> = (0..n as u64).flat_map(|i| (i + me).to_le_bytes()).collect();
//!         node.segment().write(src.offset(), &mine).unwrap();
//!         let (from, to) = (src.offset(), dest.offset());
//!         node.team_all_reduce_in_segment::<u64>(&world, ReduceOp::Sum, from, to, n).unwrap();
//!         // Word `i` is `(i + 0) + (i + 1)` on both ranks.
//!         assert_eq!(node.segment().load_u64(dest.at(8 * 10).unwrap()).unwrap(), 21);
//!     });
//! }
//! ```
//!
//! # Failure
//! Every collective on a team is started by every member, in the same order, with the
//! same root, sizes and reduction: members that disagree fail it on every member, and
//! every later one on the team ([`crate::AmError::CollectiveMismatch`]).
//!
//! A member lost fails the collectives in flight on every team it belongs to, on every survivor,
//! with [`crate::AmError::PeerLost`], and every later one on those teams. A member that left
//! cleanly had sent its part of every collective it took part in, so only a collective that waits
//! for it in vain, or must send to it, fails ([`crate::AmError::PeerDeparted`]), and every later
//! one on that team: a rank may leave as soon as its last collective returns, before the others
//! reach it. The first survivor whose transport notices the loss tells the rest of each team, so
//! every survivor fails within one message of that. When the first notices depends on the
//! transport:
//!
//! | transport | a dead member is noticed |
//! |---|---|
//! | loopback | ranks are threads: a panicking rank aborts the job (`JobAborted`) |
//! | sci, extoll, portals | by the next look at its process (one host): within a second |
//! | ofi | on one host, as above; across hosts, by an error completion toward it (a closed connection), else after `AM_PEER_TIMEOUT_MS` (default 30 s) of an RMA or atomic unanswered |
//! | udp | after `AM_PEER_TIMEOUT_MS` (default 30 s) of silence |
//!
//! Under a launcher (`amrun`, `mpiexec`, `srun`) a rank that dies usually ends the job
//! first, and the survivors' operations fail with `JobAborted`.
//!
//! ```
//! use amnet::{Config, Handlers, Loopback, Node};
//!
//! fn main() {
//!     amnet::run_ranks(Loopback::cluster(4, Default::default()), |t| {
//!         let mut node = Node::new(t, Handlers::new(), Config::default()).unwrap();
//!         let world = node.world_team();
//!         // Even and odd ranks, the higher ranks first.
//!         let me = node.rank();
//!         let half = node.split(&world, Some(me % 2), 10 - me).unwrap().unwrap();
//!         assert_eq!(half.size(), 2);
//!         assert_eq!(half.world_rank(0), Some(if me % 2 == 0 { 2 } else { 3 }));
//!         let all = node.team_all_gather(&half, &[me as u8]).unwrap();
//!         assert_eq!(all, [half.world_rank(0).unwrap() as u8, half.world_rank(1).unwrap() as u8]);
//!         node.team_barrier(&world).unwrap();
//!     });
//! }
//! ```
//!
//! A reduction on each half, then a broadcast on the world as a future:
//!
//! ```
//! use amnet::{AsyncNode, Config, Handlers, Loopback, Node, ReduceOp};
//!
//! fn main() {
//!     amnet::run_ranks(Loopback::cluster(4, Default::default()), |t| {
//!         let mut node = Node::new(t, Handlers::new(), Config::default()).unwrap();
//!         let me = node.rank();
//!         let world = node.world_team();
//!         // Even and odd ranks; the sum of the ranks on each.
//!         let half = node.split(&world, Some(me % 2), me).unwrap();
//!         let half = half.expect("a color gives a team");
//!         let sum = node.team_all_reduce(&half, ReduceOp::Sum, &[u64::from(me)]).unwrap();
//!         let expect: u64 = half.members().iter().map(|&r| u64::from(r)).sum();
//!         assert_eq!(sum, [expect]);
//!         // The same operations as futures.
//!         let node = AsyncNode::new(node);
//!         let hello = amnet::future::block_on(&node, async {
//!             let data = if me == 0 { &b"hello"[..] } else { &[][..] };
//!             node.team_broadcast(&world, 0, data).await
//!         });
//!         assert_eq!(hello.unwrap(), b"hello");
//!     });
//! }
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::types::Rank;

/// A team's name on the wire, the same on every member (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TeamId {
    /// The world rank of the team's first member.
    pub leader: Rank,
    /// A number the leader used for no other team.
    pub serial: u32,
}

impl TeamId {
    /// The world team's id.
    pub const WORLD: TeamId = TeamId {
        leader: 0,
        serial: 0,
    };
}

impl std::fmt::Display for TeamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.leader, self.serial)
    }
}

/// Teams dropped since the endpoint last looked, shared between an endpoint and its teams'
/// handles (a handle cannot reach the endpoint itself).
#[derive(Debug, Default)]
pub(crate) struct Drops {
    any: AtomicBool,
    list: Mutex<Vec<TeamId>>,
}

impl Drops {
    fn push(&self, id: TeamId) {
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        list.push(id);
        self.any.store(true, Ordering::Release);
    }

    /// The teams dropped since the last call.
    pub(crate) fn take(&self) -> Vec<TeamId> {
        if !self.any.load(Ordering::Relaxed) || !self.any.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *self.list.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

struct Inner {
    id: TeamId,
    /// World ranks of the members, in team order.
    members: Vec<Rank>,
    /// (world rank, team rank), by world rank.
    by_world: Vec<(Rank, u32)>,
    me: u32,
    drops: Arc<Drops>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.drops.push(self.id);
    }
}

/// An ordered set of ranks on which collectives run (see the [module docs](self)). Clones
/// name the same team; the team is freed once the last one is dropped.
#[derive(Clone)]
pub struct Team {
    inner: Arc<Inner>,
}

impl Team {
    /// A team of `members` (world ranks in team order, distinct) where this rank is team
    /// rank `me`, whose drop is recorded in `drops`.
    pub(crate) fn new(id: TeamId, members: Vec<Rank>, me: u32, drops: Arc<Drops>) -> Team {
        let mut by_world: Vec<(Rank, u32)> = members
            .iter()
            .enumerate()
            .map(|(i, &w)| (w, i as u32))
            .collect();
        by_world.sort_unstable();
        Team {
            inner: Arc::new(Inner {
                id,
                members,
                by_world,
                me,
                drops,
            }),
        }
    }

    /// The team's id (the same on every member).
    pub fn id(&self) -> TeamId {
        self.inner.id
    }

    /// This rank's rank in the team.
    pub fn rank(&self) -> u32 {
        self.inner.me
    }

    /// Number of members.
    pub fn size(&self) -> u32 {
        self.inner.members.len() as u32
    }

    /// The world rank of team rank `r`, if the team has one.
    pub fn world_rank(&self, r: u32) -> Option<Rank> {
        self.inner.members.get(r as usize).copied()
    }

    /// The team rank of world rank `world`, if it is a member.
    pub fn team_rank(&self, world: Rank) -> Option<u32> {
        let by = &self.inner.by_world;
        by.binary_search_by_key(&world, |&(w, _)| w)
            .ok()
            .map(|i| by[i].1)
    }

    /// The members' world ranks, in team order.
    pub fn members(&self) -> &[Rank] {
        &self.inner.members
    }

    /// Whether this handle was made by the endpoint whose drops are `drops`.
    pub(crate) fn is_of(&self, drops: &Arc<Drops>) -> bool {
        Arc::ptr_eq(&self.inner.drops, drops)
    }
}

impl std::fmt::Debug for Team {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Team")
            .field("id", &self.inner.id)
            .field("rank", &self.inner.me)
            .field("members", &self.inner.members)
            .finish()
    }
}

/// Bytes of one member's contribution to a split's all-gather: whether it gave a color
/// (0 or 1), the color, the key, and its next team serial, each a little-endian `u32`.
pub(crate) const SPLIT_BLOCK: usize = 16;

/// A member's contribution to a split.
pub(crate) fn split_block(color: Option<u32>, key: u32, serial: u32) -> [u8; SPLIT_BLOCK] {
    let mut b = [0u8; SPLIT_BLOCK];
    let words = [u32::from(color.is_some()), color.unwrap_or(0), key, serial];
    for (chunk, w) in b.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    b
}

/// One member's contribution read back: `(color, key, serial)`, `None` if malformed (a
/// correct peer never sends one).
pub(crate) fn read_split_block(b: &[u8]) -> Option<(Option<u32>, u32, u32)> {
    if b.len() != SPLIT_BLOCK {
        return None;
    }
    let w = |i: usize| u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
    let color = match w(0) {
        0 if w(1) == 0 => None,
        1 => Some(w(1)),
        _ => return None,
    };
    Some((color, w(2), w(3)))
}

/// What a split gives this member, from every member's contribution (`blocks`, in parent team
/// order, parent members `parent`): the new team's id and members in team order, and this
/// rank's team rank; `None` if it gave no color. `Err(i)`: parent member `i` sent a malformed
/// contribution.
pub(crate) fn split_result(
    parent: &[Rank],
    me: u32,
    blocks: &[u8],
) -> Result<Option<(TeamId, Vec<Rank>, u32)>, usize> {
    let mut all = Vec::with_capacity(parent.len());
    for (i, b) in blocks.chunks_exact(SPLIT_BLOCK).enumerate() {
        all.push(read_split_block(b).ok_or(i)?);
    }
    let Some(&(Some(color), _, _)) = all.get(me as usize) else {
        return Ok(None);
    };
    // (key, world rank, serial) of each member of my color.
    let mut mine: Vec<(u32, Rank, u32)> = all
        .iter()
        .zip(parent)
        .filter(|((c, _, _), _)| *c == Some(color))
        .map(|(&(_, key, serial), &w)| (key, w, serial))
        .collect();
    mine.sort_unstable();
    let (_, leader, serial) = mine[0];
    let my_world = parent[me as usize];
    let rank = mine
        .iter()
        .position(|&(_, w, _)| w == my_world)
        .unwrap_or(0) as u32;
    let members = mine.into_iter().map(|(_, w, _)| w).collect();
    Ok(Some((TeamId { leader, serial }, members, rank)))
}
