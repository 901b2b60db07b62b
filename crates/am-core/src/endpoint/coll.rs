//! Teams and the collective engine: every collective on a team is a sequence of steps, each
//! one [`SystemMsg::Collective`] keyed by (team, sequence, step), matched on arrival against
//! what this rank's collective of that sequence waits for.
//!
//! - **Issue order**: each member numbers the collectives it starts on a team from 0 (the
//!   sequence); members start the same collectives in the same order, so a sequence names
//!   the same collective everywhere, and several in flight on one team never mix.
//! - **Early arrivals**: a step that arrives before this rank's collective wants it (or
//!   before this rank started that collective, or before its split made the team) is kept in
//!   the team's `early` map, as `barrier_arrivals` keeps early barrier epochs.
//! - **Bounds**: a rank has at most [`MAX_COLLECTIVES_IN_FLIGHT`] collectives in flight per
//!   team, none of them that many sequences older than the next (a further start waits).
//!   Most collectives complete only once every member has started them; a broadcast's root,
//!   a gather's senders and a reduce's inner members are done once their steps are out, so
//!   every [`SYNC_PERIOD`]-th sequence of those kinds ends with a barrier among the members.
//!   A correct peer is then never more than [`EARLY_WINDOW`] sequences ahead of this rank:
//!   a step for a sequence beyond, for a step its place in the team does not send to this
//!   rank, or the same step twice from its sender, is [`Misbehavior::StrayCollective`]; the
//!   same step from two members that started different collectives is a mismatch. A team
//!   is then bounded to about `EARLY_WINDOW * (size + 2)` early steps of at most
//!   `max_medium` bytes each. Steps for a team this rank does not know are kept only while
//!   a split is in flight here (the peer may have finished the split that makes the team
//!   first), for at most as many unknown teams as splits in flight (each split makes at
//!   most one team that holds this rank), each at most `EARLY_WINDOW * (world size + 2)`
//!   steps; with no split in flight such a step is refused as stray. Members are trusted
//!   to be honest about failures: any member's notice fails the team.
//! - **Failure**: a member lost fails every collective in flight on every team it belongs
//!   to, and every later one on those teams ([`Endpoint::mark_lost`]). A member that left
//!   cleanly ([`Endpoint::mark_departed`]) had sent everything it owed for the collectives
//!   it started: those that still wait for a step of its fail, the others complete, and
//!   every later one on its teams fails. A rank that fails a collective for a gone member
//!   tells every other member of the team, once per gone member and team (a
//!   [`SystemMsg::Collective`] of kind [`CollectiveKind::MemberLost`] or
//!   [`CollectiveKind::MemberDeparted`]): they fail that collective and the later ones on
//!   the team with the same error, without waiting for their own transport to notice (udp
//!   and ofi across hosts notice a silent peer only after `AM_PEER_TIMEOUT_MS`). A rank
//!   whose transport noticed the loss while nothing was in flight on a team tells the team
//!   when it next starts a collective on it (which fails at once). So a survivor learns of
//!   the loss within one message of the first member that failed a collective for it. A
//!   notice for a team not known here is dropped.
//! - **Progress**: collectives advance in [`Endpoint::poll_op`] of any operation in the
//!   table and in [`Endpoint::background_step`] (every driver's poll), so one whose handle
//!   was dropped, or that another collective's waiter does not name, still goes on.

use rustc_hash::FxHashMap as HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::task::{ready, Poll};

use super::state::Endpoint;
use crate::error::{AmError, Misbehavior};
use crate::handler::Threading;
use crate::protocol::{opcode, CollectiveKind, SystemMsg, FOLD_STEP, FORWARD_STEP, UNFOLD_STEP};
use crate::reduce::{Element, ReduceOp, Reduction};
use crate::team::{split_block, split_result, Drops, Team, TeamId};
use crate::transport::{Payload, Transport, Tx};
use crate::types::{AmKind, Rank};

/// The most collectives a rank has in flight on one team: a further one waits to start
/// until one completes. It bounds what a rank keeps of its peers' early steps.
pub const MAX_COLLECTIVES_IN_FLIGHT: usize = 64;

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

/// The first step of the barrier that ends a synchronizing collective (round `k` is step
/// `SYNC_STEP + k`).
const SYNC_STEP: u32 = 128;

/// One past the largest step any collective's plan takes.
const STEP_BOUND: u32 = SYNC_STEP + 32;

/// The peer of a collective's operation slot: no rank, so no reply of a put, get or atomic
/// ever matches it.
pub(super) const NO_PEER: Rank = Rank::MAX;

fn misbehaved(peer: Rank, what: Misbehavior) -> AmError {
    AmError::PeerMisbehaved { peer, what }
}

/// The endpoint's teams.
pub(super) struct Teams {
    /// Where dropped [`Team`] handles record their drop.
    pub(super) drops: Arc<Drops>,
    pub(super) world: Team,
    world_size: u32,
    /// The serial this rank offers in its next split (used if it leads the new team).
    serial: u32,
    live: HashMap<TeamId, TeamState>,
    /// Steps for teams not known yet, while splits are in flight.
    unknown: HashMap<TeamId, Vec<Held>>,
    /// Splits in flight here.
    splits: u32,
    /// Collectives in flight here, on every team.
    pub(super) in_flight: u32,
    /// Something a collective in flight may wait for changed since they were last advanced
    /// (a step arrived, a member went): polls advance them only then, or when a peer that a
    /// step waits to be sent to (`stalled`) has a credit again, so that many in flight cost
    /// nothing while nothing comes.
    pub(super) dirty: bool,
    stalled: Vec<Rank>,
    /// Notices to send, oldest first: (team, to, first failed sequence, gone member, kind).
    notices: std::collections::VecDeque<(TeamId, Rank, u64, Rank, CollectiveKind)>,
    /// A peer's misbehavior found outside a delivery (steps held for a team that no split
    /// made), for the next poll.
    stray: Option<AmError>,
    /// The teams with collectives in flight, listed by each advance (kept to spare an
    /// allocation per poll).
    busy: Vec<TeamId>,
    /// Plans of completed collectives, emptied, for the next ones.
    spare_plans: Vec<Vec<Action>>,
}

struct TeamState {
    /// World ranks in team order, and this rank's team rank.
    members: Vec<Rank>,
    me: u32,
    /// The sequence of the next collective started here.
    next_seq: u64,
    /// Collectives in flight, in issue order.
    colls: Vec<Coll>,
    /// Steps arrived before their collective wanted them: (sequence, step) -> arrival.
    early: HashMap<(u64, u32), Arrival>,
    /// The last handle was dropped: forgotten once `colls` is empty.
    freed: bool,
    /// A member is gone: every collective fails with this.
    failed: Option<AmError>,
    /// A member told that a member is gone: the collectives from this sequence on fail with
    /// this error at the next advance.
    told: Option<(u64, AmError)>,
    /// The gone members the others were told of (once each).
    notified: Vec<Rank>,
    /// The others were told of a mismatch (once per team).
    mismatch_told: bool,
    /// Sequences not started here whose steps disagreed (from two members), with one of the
    /// senders: the collective fails with a mismatch when it starts.
    mismatch_at: Vec<(u64, Rank)>,
}

/// A step for a team not known yet: sender, sequence, step, kind, root, desc, data.
type Held = (Rank, u64, u32, CollectiveKind, u32, u32, Vec<u8>);

struct Arrival {
    src: Rank,
    kind: CollectiveKind,
    root: u32,
    desc: u32,
    data: Vec<u8>,
}

/// A collective in flight: its plan of sends and takes, taken in order, over one buffer.
struct Coll {
    seq: u64,
    /// Its operation slot.
    index: u32,
    gen: u32,
    kind: CollectiveKind,
    /// The root's team rank (0 where there is none).
    root: u32,
    /// The reduction's word (0 where there is none).
    desc: u32,
    red: Option<Reduction>,
    /// The block length of a gather or all-gather.
    block: usize,
    /// What it sends from and takes into: the gathered blocks, the broadcast bytes, the
    /// reduction's partial result.
    buf: Vec<u8>,
    plan: Vec<Action>,
    /// The next action of `plan`.
    at: usize,
    /// A member that started another collective under this sequence (or another root,
    /// reduction or length): the collective fails with [`AmError::CollectiveMismatch`].
    mismatch: Option<Rank>,
}

/// One action of a collective's plan: peers are team ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Send { to: u32, step: u32, part: Part },
    Take { from: u32, step: u32, part: Part },
}

/// Which part of a collective's buffer an action sends, or what a take does with the
/// bytes that came.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
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
}

/// `2^k`, if it is below `n`.
fn pow_below(k: u32, n: u32) -> Option<u32> {
    1u32.checked_shl(k).filter(|&d| d < n)
}

/// The plan of a collective of `kind` for team rank `me` of `n` with root `root` (a team
/// rank below `n`): the algorithms of the [module docs](self).
fn plan(
    kind: CollectiveKind,
    n: u32,
    me: u32,
    root: u32,
    seq: u64,
    mut p: Vec<Action>,
) -> Vec<Action> {
    use Action::{Send, Take};
    p.clear();
    let sync = matches!(
        kind,
        CollectiveKind::Broadcast | CollectiveKind::Reduce | CollectiveKind::Gather
    ) && seq % SYNC_PERIOD == SYNC_PERIOD - 1;
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
        CollectiveKind::AllGather | CollectiveKind::Split => {
            for s in 0..n - 1 {
                p.push(Send {
                    to: (me + 1) % n,
                    step: s,
                    part: Part::Block((me + n - s) % n),
                });
                p.push(Take {
                    from: (me + n - 1) % n,
                    step: s,
                    part: Part::Block((me + 2 * n - 1 - s) % n),
                });
            }
        }
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
    fn new(members: Vec<Rank>, me: u32) -> TeamState {
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
        }
    }

    /// The member (world rank) that sends step `step` of collective `seq` of `kind` rooted
    /// at team rank `root` to this rank, if any.
    fn sender_of(&self, kind: CollectiveKind, seq: u64, step: u32, root: u32) -> Option<Rank> {
        let n = self.members.len() as u32;
        let me = self.me;
        if root >= n {
            return None;
        }
        let from = match kind {
            CollectiveKind::Barrier => (me + n - pow_below(step, n)?) % n,
            CollectiveKind::AllGather | CollectiveKind::Split if step < n - 1 => (me + n - 1) % n,
            CollectiveKind::Gather if me == root && step < n && step != root => step,
            CollectiveKind::Broadcast
            | CollectiveKind::Reduce
            | CollectiveKind::AllReduce
            | CollectiveKind::Gather => plan(kind, n, me, root, seq, Vec::new())
                .into_iter()
                .find_map(|a| match a {
                    Action::Take { from, step: s, .. } if s == step => Some(from),
                    _ => None,
                })?,
            _ => return None,
        };
        self.members.get(from as usize).copied()
    }

    /// Keeps a step of a peer's for the collective that takes it; false if no collective
    /// here can take it.
    fn arrive(&mut self, src: Rank, seq: u64, step: u32, a: Arrival) -> bool {
        if self.sender_of(a.kind, seq, step, a.root) != Some(src) {
            return false;
        }
        let in_flight = self.colls.iter_mut().find(|c| c.seq == seq);
        if self.failed.is_some() && in_flight.is_none() {
            // A member is gone: a survivor's step of a collective failed here is dropped.
            return true;
        }
        let wanted = match in_flight {
            Some(c) => {
                if (a.kind, a.root, a.desc) != (c.kind, c.root, c.desc) {
                    c.mismatch.get_or_insert(src);
                }
                // Not a step it has taken already.
                !c.plan[..c.at]
                    .iter()
                    .any(|x| matches!(x, Action::Take { step: s, .. } if *s == step))
            }
            None => seq >= self.next_seq && seq - self.next_seq < EARLY_WINDOW,
        };
        if !wanted {
            return false;
        }
        match self.early.entry((seq, step)) {
            // The same step twice from its sender: not our protocol.
            Entry::Occupied(o) if (o.get().src, o.get().kind) == (src, a.kind) => false,
            // Two members that started different collectives under `seq` may both send
            // this step: a disagreement, not a peer's misbehavior.
            Entry::Occupied(_) => {
                match self.colls.iter_mut().find(|c| c.seq == seq) {
                    Some(c) => {
                        c.mismatch.get_or_insert(src);
                    }
                    None => {
                        if self.mismatch_at.len() < MAX_COLLECTIVES_IN_FLIGHT {
                            self.mismatch_at.push((seq, src));
                        }
                    }
                }
                true
            }
            Entry::Vacant(v) => {
                v.insert(a);
                true
            }
        }
    }

    /// Whether a start must wait: [`MAX_COLLECTIVES_IN_FLIGHT`] in flight, or the oldest in
    /// flight that many sequences back (collectives complete out of order: a bound on the
    /// count alone would not bound how far ahead of the oldest this member runs).
    fn window_full(&self) -> bool {
        self.colls.len() >= MAX_COLLECTIVES_IN_FLIGHT
            || self
                .colls
                .first()
                .is_some_and(|c| self.next_seq - c.seq >= MAX_COLLECTIVES_IN_FLIGHT as u64)
    }

    /// Whether collective `c` still needs a step from `peer` that has not arrived.
    fn still_needs(&self, c: &Coll, peer: Rank) -> bool {
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
    pub(super) fn new(rank: Rank, size: u32) -> Teams {
        let drops = Arc::new(Drops::default());
        let members: Vec<Rank> = (0..size).collect();
        let world = Team::new(TeamId::WORLD, members.clone(), rank, drops.clone());
        let mut live = HashMap::default();
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
            notices: std::collections::VecDeque::new(),
            stray: None,
            busy: Vec::new(),
            spare_plans: Vec::new(),
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
            return self.told(src, team, seq, step, kind, payload.len());
        }
        if let Some(ts) = self.live.get_mut(&team) {
            let mut data = Vec::new();
            payload.append_to(&mut data);
            let a = Arrival {
                src,
                kind,
                root,
                desc,
                data,
            };
            return match ts.arrive(src, seq, step, a) {
                true => {
                    self.dirty = true;
                    Ok(())
                }
                false => Err(stray()),
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
        let mut data = Vec::new();
        payload.append_to(&mut data);
        steps.push((src, seq, step, kind, root, desc, data));
        Ok(())
    }
}

impl Teams {
    /// A member's notice that member `gone` of `team` is gone (or, for a
    /// [`CollectiveKind::Mismatch`], started another collective), from sequence `seq` on. A
    /// notice for a team not known here is dropped (this rank may have freed it, or not
    /// made it yet: its collectives then fail as the gone member's own steps fail to come).
    fn told(
        &mut self,
        src: Rank,
        team: TeamId,
        seq: u64,
        gone: Rank,
        kind: CollectiveKind,
        len: usize,
    ) -> Result<(), AmError> {
        let Some(ts) = self.live.get_mut(&team) else {
            return Ok(());
        };
        let me = ts.members.get(ts.me as usize).copied();
        let member = |r: Rank| ts.members.contains(&r);
        let mismatch = kind == CollectiveKind::Mismatch;
        if len != 0
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
            CollectiveKind::Mismatch => AmError::CollectiveMismatch { team, peer: gone },
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

/// What a collective starts with: its kind, root, reduction, this member's bytes and the
/// block length (a gather's and all-gather's).
struct Args<'a> {
    kind: CollectiveKind,
    root: u32,
    red: Option<Reduction>,
    data: &'a [u8],
}

impl<H: Threading> Endpoint<H> {
    /// The world team: every rank of the job, in rank order ([`TeamId::WORLD`]).
    pub fn world_team(&self) -> Team {
        self.teams.world.clone()
    }

    /// Starts a team barrier ([`crate::endpoint::start::TeamBarrier`]): complete once every
    /// member of `team` has entered it. As the world barrier, it starts once this rank's
    /// posted atomics are applied, so every member leaving it sees them.
    pub fn team_barrier_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
    ) -> Poll<Result<crate::op::Op<()>, AmError>> {
        let args = Args {
            kind: CollectiveKind::Barrier,
            root: 0,
            red: None,
            data: &[],
        };
        let (index, gen) = ready!(self.collective_start(t, team, args))?;
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// Starts an all-gather of `block` over `team`
    /// ([`crate::endpoint::start::TeamAllGather`]): completes with every member's block, in
    /// team order. Every member gives a block of the same length, at most the transport's
    /// `max_medium`.
    pub fn team_all_gather_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        block: &[u8],
    ) -> Poll<Result<crate::op::Op<Vec<u8>>, AmError>> {
        self.bytes_start(t, team, CollectiveKind::AllGather, 0, None, block)
    }

    /// Starts a gather of `block` to team rank `root`
    /// ([`crate::endpoint::start::TeamGather`]): the root completes with every member's
    /// block in team order, the others with nothing (an empty `Vec`).
    pub fn team_gather_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        root: u32,
        block: &[u8],
    ) -> Poll<Result<crate::op::Op<Vec<u8>>, AmError>> {
        self.bytes_start(t, team, CollectiveKind::Gather, root, None, block)
    }

    /// Starts a broadcast of `data` from team rank `root`
    /// ([`crate::endpoint::start::TeamBroadcast`]): every member completes with the root's
    /// bytes (at most the transport's `max_medium`); the others give `&[]`.
    pub fn team_broadcast_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        root: u32,
        data: &[u8],
    ) -> Poll<Result<crate::op::Op<Vec<u8>>, AmError>> {
        if !data.is_empty() && team.rank() != root {
            return Poll::Ready(Err(AmError::InvalidCollective(
                "data given to a broadcast by a member that is not its root",
            )));
        }
        self.bytes_start(t, team, CollectiveKind::Broadcast, root, None, data)
    }

    /// Starts a reduction of `data` (elements of `E`, as little-endian bytes) by `op`
    /// ([`crate::endpoint::start::TeamReduce`]): the result to team rank `root`, or to every
    /// member (`root` `None`).
    pub fn team_reduce_start<E: Element, T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        root: Option<u32>,
        op: ReduceOp,
        data: &[u8],
    ) -> Poll<Result<crate::op::Op<Vec<E>>, AmError>> {
        let red = match Reduction::new::<E>(op) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let (kind, root) = match root {
            Some(r) => (CollectiveKind::Reduce, r),
            None => (CollectiveKind::AllReduce, 0),
        };
        let args = Args {
            kind,
            root,
            red: Some(red),
            data,
        };
        let (index, gen) = ready!(self.collective_start(t, team, args))?;
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    fn bytes_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        kind: CollectiveKind,
        root: u32,
        red: Option<Reduction>,
        data: &[u8],
    ) -> Poll<Result<crate::op::Op<Vec<u8>>, AmError>> {
        let args = Args {
            kind,
            root,
            red,
            data,
        };
        let (index, gen) = ready!(self.collective_start(t, team, args))?;
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// Starts a split of `parent` ([`crate::endpoint::start::Split`]): completes with this
    /// rank's new team, `None` if `color` is.
    pub fn split_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        parent: &Team,
        color: Option<u32>,
        key: u32,
    ) -> Poll<Result<crate::op::Op<Option<Team>>, AmError>> {
        let block = split_block(color, key, self.teams.serial);
        let args = Args {
            kind: CollectiveKind::Split,
            root: 0,
            red: None,
            data: &block,
        };
        let (index, gen) = ready!(self.collective_start(t, parent, args))?;
        // Used whether or not this rank leads the new team: never offered twice.
        self.teams.serial = self.teams.serial.wrapping_add(1).max(1);
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// Starts a collective on `team`: its operation slot, whose completion carries the
    /// outcome (the gathered blocks, the bytes, or nothing).
    fn collective_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        args: Args<'_>,
    ) -> Poll<Result<(u32, u32), AmError>> {
        let Args {
            kind,
            root,
            red,
            data,
        } = args;
        let id = team.id();
        if !team.is_of(&self.teams.drops) {
            return Poll::Ready(Err(AmError::UnknownTeam(id)));
        }
        if let Some(e) = &self.ended {
            return Poll::Ready(Err(e.clone()));
        }
        self.adopt_team_drops();
        let Some(ts) = self.teams.live.get(&id) else {
            return Poll::Ready(Err(AmError::UnknownTeam(id)));
        };
        if let Some(e) = ts.failed.clone() {
            // The others may not know yet (this rank's transport noticed a loss while
            // nothing was in flight, or the team was made with a member gone): they hear
            // it now, once, rather than wait for this rank's steps.
            let gone = match e {
                AmError::PeerLost(p) => Some((p, CollectiveKind::MemberLost)),
                AmError::PeerDeparted(p) => Some((p, CollectiveKind::MemberDeparted)),
                _ => None,
            };
            if let Some((p, kind)) = gone.filter(|&(p, _)| ts.members.contains(&p)) {
                let seq = ts.next_seq;
                self.notify(id, seq, p, kind);
                self.send_notices(t);
            }
            return Poll::Ready(Err(e));
        }
        if root as usize >= ts.members.len() {
            return Poll::Ready(Err(AmError::InvalidCollective(
                "a root that is not a team rank",
            )));
        }
        if red.is_some_and(|r| data.len() % r.size() != 0) {
            return Poll::Ready(Err(AmError::InvalidCollective(
                "a reduction over bytes that are not whole elements",
            )));
        }
        let full = ts.window_full();
        if data.len() > self.limits.max_medium {
            return Poll::Ready(Err(AmError::PayloadTooLarge {
                kind: AmKind::Medium,
                len: data.len(),
                max: self.limits.max_medium,
            }));
        }
        if kind == CollectiveKind::Barrier {
            // As the world barrier: what this rank posted is applied before it enters.
            ready!(self.apply_posted(t))?;
            if self.detached_in_flight > 0 {
                return Poll::Pending;
            }
        }
        if full {
            self.advance_team(t, id);
            if self.teams.live.get(&id).is_some_and(TeamState::window_full) {
                return Poll::Pending;
            }
        }
        let (index, gen) = self.alloc_op(NO_PEER, 0, 0, Vec::new());
        // In flight until the collective completes (or a failure completes it).
        self.ops[index as usize].outstanding = 1;
        let Some(ts) = self.teams.live.get_mut(&id) else {
            return Poll::Ready(Err(AmError::UnknownTeam(id)));
        };
        let n = ts.members.len() as u32;
        let (buf, block) = match kind {
            CollectiveKind::AllGather | CollectiveKind::Split => {
                let mut buf = vec![0u8; n as usize * data.len()];
                let at = ts.me as usize * data.len();
                buf[at..at + data.len()].copy_from_slice(data);
                (buf, data.len())
            }
            CollectiveKind::Gather if ts.me == root => {
                let mut buf = vec![0u8; n as usize * data.len()];
                let at = ts.me as usize * data.len();
                buf[at..at + data.len()].copy_from_slice(data);
                (buf, data.len())
            }
            _ => (data.to_vec(), data.len()),
        };
        let seq = ts.next_seq;
        ts.next_seq += 1;
        let mut c = Coll {
            seq,
            index,
            gen,
            kind,
            root,
            desc: red.map_or(0, Reduction::word),
            red,
            block,
            buf,
            plan: plan(
                kind,
                n,
                ts.me,
                root,
                seq,
                self.teams.spare_plans.pop().unwrap_or_default(),
            ),
            at: 0,
            mismatch: None,
        };
        // Steps that came before it started, from members that started something else.
        if !ts.early.is_empty() {
            c.mismatch = ts
                .early
                .iter()
                .find(|(&(s, _), a)| s == seq && (a.kind, a.root, a.desc) != (kind, root, c.desc))
                .map(|(_, a)| a.src);
        }
        if let Some(at) = ts.mismatch_at.iter().position(|&(s, _)| s == seq) {
            c.mismatch.get_or_insert(ts.mismatch_at.swap_remove(at).1);
        }
        ts.colls.push(c);
        self.teams.in_flight += 1;
        if kind == CollectiveKind::Split {
            self.teams.splits += 1;
        }
        // Its first steps go out now if credits allow.
        self.advance_team(t, id);
        Poll::Ready(Ok((index, gen)))
    }

    /// Forgets the teams whose last handle was dropped, once their collectives in flight
    /// here have completed.
    pub(super) fn adopt_team_drops(&mut self) {
        for id in self.teams.drops.take() {
            if let Some(ts) = self.teams.live.get_mut(&id) {
                ts.freed = true;
                if ts.colls.is_empty() {
                    self.teams.live.remove(&id);
                }
            }
        }
    }

    /// The error of a step held for a team that no split made, if any (once).
    pub(super) fn take_stray(&mut self) -> Option<AmError> {
        self.teams.stray.take()
    }

    /// Advances every collective in flight here, on every team.
    pub(super) fn advance_collectives(&mut self, tx: &mut (impl Tx + ?Sized)) {
        if !self.teams.notices.is_empty() {
            self.send_notices(tx);
        }
        if self.teams.in_flight == 0 {
            return;
        }
        let credit_back = || {
            let credits = self.credits();
            self.teams.stalled.iter().any(|&p| credits.available(p) > 0)
        };
        if self.teams.dirty || credit_back() {
            self.teams.dirty = false;
            self.teams.stalled.clear();
            // The busy teams' ids, in a list kept between polls (no allocation per poll).
            let mut busy = std::mem::take(&mut self.teams.busy);
            busy.extend(
                self.teams
                    .live
                    .iter()
                    .filter(|(_, ts)| !ts.colls.is_empty())
                    .map(|(&id, _)| id),
            );
            for &id in &busy {
                self.advance_team(tx, id);
            }
            busy.clear();
            self.teams.busy = busy;
            // What those found gone, the others hear at once.
            if !self.teams.notices.is_empty() {
                self.send_notices(tx);
            }
        }
    }

    /// Advances the collectives in flight, if any (a blocking driver's idle poll).
    #[inline]
    pub(crate) fn carry_collectives(&mut self, tx: &mut (impl Tx + ?Sized)) {
        if self.collectives_pending() {
            self.advance_collectives(tx);
        }
    }

    /// Whether collectives are in flight or notices wait to go: polls then advance them.
    #[inline]
    pub(super) fn collectives_pending(&self) -> bool {
        self.teams.in_flight > 0 || !self.teams.notices.is_empty()
    }

    /// Advances the collectives of team `id` as far as the steps arrived and credits allow;
    /// completes those that are done.
    fn advance_team(&mut self, tx: &mut (impl Tx + ?Sized), id: TeamId) {
        if let Some((from, error)) = self.teams.live.get_mut(&id).and_then(|ts| ts.told.take()) {
            self.fail_team_from(id, from, &error);
        }
        let mut i = 0;
        while let Some(c) = self.teams.live.get(&id).and_then(|ts| ts.colls.get(i)) {
            let alive = self
                .ops
                .get(c.index as usize)
                .is_some_and(|s| s.live && s.gen == c.gen && s.outstanding > 0);
            let outcome = if alive {
                self.step_coll(tx, id, i)
            } else {
                // Its slot was failed (the endpoint ended): nothing more to do.
                Poll::Ready(Err(AmError::StaleHandle))
            };
            match outcome {
                Poll::Pending => i += 1,
                Poll::Ready(r) => self.complete_coll(id, i, r),
            }
        }
        if let Some(ts) = self.teams.live.get(&id) {
            if ts.freed && ts.colls.is_empty() {
                self.teams.live.remove(&id);
            }
        }
    }

    /// Takes the steps collective `i` of team `id` can take now: ready with its outcome
    /// once it is done, or with the error that ends it.
    fn step_coll(
        &mut self,
        tx: &mut (impl Tx + ?Sized),
        id: TeamId,
        i: usize,
    ) -> Poll<Result<Vec<u8>, AmError>> {
        loop {
            let Some(ts) = self.teams.live.get_mut(&id) else {
                return Poll::Ready(Err(AmError::UnknownTeam(id)));
            };
            let me = ts.me;
            let Some(c) = ts.colls.get_mut(i) else {
                return Poll::Ready(Err(AmError::StaleHandle));
            };
            if let Some(peer) = c.mismatch {
                return Poll::Ready(Err(AmError::CollectiveMismatch { team: id, peer }));
            }
            let (seq, kind, root, desc) = (c.seq, c.kind, c.root, c.desc);
            let Some(&action) = c.plan.get(c.at) else {
                let keep = match kind {
                    CollectiveKind::Barrier => false,
                    CollectiveKind::Reduce | CollectiveKind::Gather => me == root,
                    _ => true,
                };
                return Poll::Ready(Ok(if keep {
                    std::mem::take(&mut c.buf)
                } else {
                    Vec::new()
                }));
            };
            match action {
                Action::Send { to, step, part } => {
                    let to = ts.members[to as usize];
                    let buf = std::mem::take(&mut c.buf);
                    let len = c.block;
                    let payload = match part {
                        Part::Nothing => &[][..],
                        Part::Block(b) => &buf[b as usize * len..(b as usize + 1) * len],
                        Part::Whole | Part::Lower | Part::Upper => &buf[..],
                    };
                    let msg = SystemMsg::Collective {
                        team: id,
                        seq,
                        step,
                        kind,
                        root,
                        desc,
                    };
                    let sent = self.system_step(tx, to, msg, payload, None);
                    let Some(c) = self
                        .teams
                        .live
                        .get_mut(&id)
                        .and_then(|ts| ts.colls.get_mut(i))
                    else {
                        return Poll::Ready(Err(AmError::StaleHandle));
                    };
                    c.buf = buf;
                    match sent {
                        Poll::Ready(Ok(())) => c.at += 1,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => {
                            // Retried once a credit for `to` is back.
                            if !self.teams.stalled.contains(&to) {
                                self.teams.stalled.push(to);
                            }
                            return Poll::Pending;
                        }
                    }
                }
                Action::Take { from, step, part } => {
                    let Some(a) = ts.early.remove(&(seq, step)) else {
                        // Not arrived: unless its sender is gone, which fails the team.
                        let from = ts.members[from as usize];
                        return match self.waiting_for(from) {
                            Poll::Ready(e) => Poll::Ready(Err(e)),
                            Poll::Pending => Poll::Pending,
                        };
                    };
                    let len = c.block;
                    // Its kind, root and reduction were checked against this one's when it
                    // came (or when this one started): what is left is its length.
                    let fits = match part {
                        Part::Nothing => a.data.is_empty(),
                        Part::Block(_) => a.data.len() == len,
                        // A broadcast's length is the root's.
                        Part::Whole => {
                            kind == CollectiveKind::Broadcast || a.data.len() == c.buf.len()
                        }
                        Part::Lower | Part::Upper => a.data.len() == c.buf.len(),
                    };
                    if !fits {
                        return Poll::Ready(Err(AmError::CollectiveMismatch {
                            team: id,
                            peer: a.src,
                        }));
                    }
                    match part {
                        Part::Nothing => {}
                        Part::Block(b) => {
                            c.buf[b as usize * len..(b as usize + 1) * len].copy_from_slice(&a.data)
                        }
                        Part::Whole => c.buf = a.data,
                        Part::Lower | Part::Upper => {
                            if let Some(red) = c.red {
                                red.combine(&mut c.buf, &a.data, part == Part::Upper);
                            }
                        }
                    }
                    c.at += 1;
                }
            }
        }
    }

    /// Ends collective `i` of team `id` with `outcome` (its gathered blocks, or an error):
    /// a split makes its team first; the operation's waiter is woken, or a detached one
    /// freed.
    fn complete_coll(&mut self, id: TeamId, i: usize, outcome: Result<Vec<u8>, AmError>) {
        let Some(ts) = self.teams.live.get_mut(&id) else {
            return;
        };
        let mut c = ts.colls.remove(i);
        if outcome.is_err() {
            // What came for it is no collective's any more; what comes later is dropped
            // (the team is failed below).
            ts.early.retain(|&(s, _), _| s != c.seq);
            if let Err(e) = &outcome {
                ts.failed.get_or_insert_with(|| e.clone());
            }
        }
        if self.teams.spare_plans.len() < MAX_COLLECTIVES_IN_FLIGHT {
            // Its plan's storage serves the next collective.
            let mut spare = std::mem::take(&mut c.plan);
            spare.clear();
            self.teams.spare_plans.push(spare);
        }
        let parent = (ts.members.clone(), ts.me);
        self.teams.in_flight = self.teams.in_flight.saturating_sub(1);
        match &outcome {
            Err(AmError::PeerLost(p) | AmError::PeerDeparted(p)) if parent.0.contains(p) => {
                let kind = match outcome {
                    Err(AmError::PeerLost(_)) => CollectiveKind::MemberLost,
                    _ => CollectiveKind::MemberDeparted,
                };
                self.notify(id, c.seq, *p, kind);
            }
            Err(e @ AmError::CollectiveMismatch { peer, .. }) => {
                // The team's sequence is broken: this collective and every later one on
                // it fail, here and, once told, on every member.
                let e = e.clone();
                self.notify(id, c.seq, *peer, CollectiveKind::Mismatch);
                self.fail_team_from(id, c.seq, &e);
            }
            _ => {}
        }
        let mut made = None;
        let outcome = match (c.kind, outcome) {
            (CollectiveKind::Split, outcome) => {
                self.teams.splits = self.teams.splits.saturating_sub(1);
                let r = outcome.and_then(|blocks| self.make_team(&parent.0, parent.1, &blocks));
                if self.teams.splits == 0 {
                    self.drop_unknown();
                }
                r.map(|team| {
                    made = Some(team);
                    Vec::new()
                })
            }
            (_, outcome) => outcome,
        };
        let Some(slot) = self.op(c.index, c.gen) else {
            return;
        };
        match outcome {
            Ok(data) => {
                slot.data = data;
                slot.team = made;
            }
            Err(e) => {
                slot.error.get_or_insert(e);
            }
        }
        slot.outstanding = 0;
        self.settle(c.index);
    }

    /// The team a split of `parent` (this rank team rank `me`) gave, from every member's
    /// contribution: registered here, with the steps that arrived for it before.
    fn make_team(
        &mut self,
        parent: &[Rank],
        me: u32,
        blocks: &[u8],
    ) -> Result<Option<Team>, AmError> {
        let bad = |i: usize| {
            misbehaved(
                parent.get(i).copied().unwrap_or(NO_PEER),
                Misbehavior::BadSystemMessage(opcode::COLLECTIVE),
            )
        };
        let Some((tid, members, rank)) = split_result(parent, me, blocks).map_err(bad)? else {
            return Ok(None);
        };
        if self.teams.live.contains_key(&tid) {
            // The leader offered a serial it had used: not our protocol.
            return Err(misbehaved(
                tid.leader,
                Misbehavior::BadSystemMessage(opcode::COLLECTIVE),
            ));
        }
        let mut ts = TeamState::new(members.clone(), rank);
        let mut stray = None;
        for (src, seq, step, kind, root, desc, data) in
            self.teams.unknown.remove(&tid).unwrap_or_default()
        {
            let a = Arrival {
                src,
                kind,
                root,
                desc,
                data,
            };
            if !ts.arrive(src, seq, step, a) {
                stray.get_or_insert(misbehaved(
                    src,
                    Misbehavior::StrayCollective {
                        team: tid,
                        seq,
                        step,
                    },
                ));
            }
        }
        if let Some(e) = stray {
            self.teams.stray.get_or_insert(e);
        }
        // A member already gone fails the team at once.
        if let Some(e) = members.iter().find_map(|&m| match self.waiting_for(m) {
            Poll::Ready(e) => Some(e),
            Poll::Pending => None,
        }) {
            ts.failed = Some(e);
        }
        self.teams.live.insert(tid, ts);
        Ok(Some(Team::new(
            tid,
            members,
            rank,
            self.teams.drops.clone(),
        )))
    }

    /// No split is in flight any more: steps held for teams no split made are a peer's
    /// misbehavior, reported at the next poll.
    fn drop_unknown(&mut self) {
        if let Some((&team, steps)) = self.teams.unknown.iter().next() {
            if let Some(&(src, seq, step, ..)) = steps.first() {
                self.teams.stray.get_or_insert(misbehaved(
                    src,
                    Misbehavior::StrayCollective { team, seq, step },
                ));
            }
        }
        self.teams.unknown.clear();
    }

    /// `peer` is gone (`error` says how) from every team it belongs to: every later
    /// collective on those teams fails with `error` when it starts. Lost (`eager`), it fails
    /// every collective in flight on them too: it may not have sent its part, and the others
    /// wait for what it would have sent on. Departed cleanly, it ended what it had started
    /// and sent what it owed before it left (a transport reports a departure after the
    /// messages sent before it): only a collective that still waits for a step of its own,
    /// not arrived, fails.
    pub(super) fn fail_teams_with(&mut self, peer: Rank, error: &AmError, eager: bool) {
        let mut failed = Vec::new();
        let mut notify = Vec::new();
        let mut splits = 0;
        self.teams.dirty = true;
        for (&id, ts) in self.teams.live.iter_mut() {
            if !ts.members.contains(&peer) {
                continue;
            }
            ts.failed.get_or_insert_with(|| error.clone());
            let mut first = None::<u64>;
            let mut kept = Vec::new();
            for c in std::mem::take(&mut ts.colls) {
                if !eager && !ts.still_needs(&c, peer) {
                    kept.push(c);
                    continue;
                }
                if c.kind == CollectiveKind::Split {
                    splits += 1;
                }
                ts.early.retain(|&(seq, _), _| seq != c.seq);
                first = Some(first.map_or(c.seq, |f| f.min(c.seq)));
                failed.push((c.index, c.gen));
            }
            ts.colls = kept;
            if let Some(seq) = first {
                notify.push((id, seq));
            }
        }
        self.teams
            .live
            .retain(|_, ts| !(ts.freed && ts.colls.is_empty()));
        self.teams.in_flight = self.teams.in_flight.saturating_sub(failed.len() as u32);
        self.teams.splits = self.teams.splits.saturating_sub(splits);
        if splits > 0 && self.teams.splits == 0 {
            self.teams.unknown.clear();
        }
        for (id, seq) in notify {
            let kind = match error {
                AmError::PeerLost(_) => CollectiveKind::MemberLost,
                _ => CollectiveKind::MemberDeparted,
            };
            self.notify(id, seq, peer, kind);
        }
        self.fail_slots_of(failed, error);
    }

    fn fail_slots_of(&mut self, failed: Vec<(u32, u32)>, error: &AmError) {
        for (index, gen) in failed {
            if let Some(slot) = self.op(index, gen) {
                slot.error.get_or_insert_with(|| error.clone());
                slot.outstanding = 0;
                self.settle(index);
            }
        }
    }

    /// A member told this rank that a member is gone: the collectives on team `id` from
    /// sequence `from` on fail with `error`, and every later one.
    fn fail_team_from(&mut self, id: TeamId, from: u64, error: &AmError) {
        let Some(ts) = self.teams.live.get_mut(&id) else {
            return;
        };
        ts.failed.get_or_insert_with(|| error.clone());
        let mut failed = Vec::new();
        let mut splits = 0;
        let mut kept = Vec::new();
        for c in std::mem::take(&mut ts.colls) {
            if c.seq < from {
                kept.push(c);
                continue;
            }
            if c.kind == CollectiveKind::Split {
                splits += 1;
            }
            ts.early.retain(|&(seq, _), _| seq != c.seq);
            failed.push((c.index, c.gen));
        }
        ts.colls = kept;
        self.teams.in_flight = self.teams.in_flight.saturating_sub(failed.len() as u32);
        self.teams.splits = self.teams.splits.saturating_sub(splits);
        if splits > 0 && self.teams.splits == 0 {
            self.teams.unknown.clear();
        }
        self.fail_slots_of(failed, error);
    }

    /// Tells every other member of team `id` (but `gone`) that `gone` is gone and this rank
    /// failed the team's collectives from `seq` on; once per gone member and team.
    fn notify(&mut self, id: TeamId, seq: u64, gone: Rank, kind: CollectiveKind) {
        let Some(ts) = self.teams.live.get_mut(&id) else {
            return;
        };
        let mismatch = kind == CollectiveKind::Mismatch;
        if mismatch {
            if ts.mismatch_told {
                return;
            }
            ts.mismatch_told = true;
        } else {
            if ts.notified.contains(&gone) {
                return;
            }
            ts.notified.push(gone);
        }
        let me = ts.members.get(ts.me as usize).copied();
        for &m in &ts.members {
            // The member that disagreed hears it too: it may wait for a step that the
            // others, started on another collective, never send.
            if (mismatch || m != gone) && Some(m) != me {
                self.teams.notices.push_back((id, m, seq, gone, kind));
            }
        }
    }

    /// Sends the notices queued, in order, until one waits for a credit; those to members
    /// gone meanwhile are dropped.
    fn send_notices(&mut self, tx: &mut (impl Tx + ?Sized)) {
        while let Some(&(team, to, seq, gone, kind)) = self.teams.notices.front() {
            let msg = SystemMsg::Collective {
                team,
                seq,
                step: gone,
                kind,
                root: 0,
                desc: 0,
            };
            match self.system_step(tx, to, msg, &[], None) {
                Poll::Pending => {
                    if !self.teams.stalled.contains(&to) {
                        self.teams.stalled.push(to);
                    }
                    return;
                }
                Poll::Ready(_) => {
                    self.teams.notices.pop_front();
                }
            }
        }
    }

    /// The collectives in flight here, on every team (for tests and diagnostics).
    pub fn collectives_in_flight(&self) -> u32 {
        self.teams.in_flight
    }

    /// Teams this endpoint knows (the world team included), and steps kept for teams not
    /// known yet: what freeing teams and completing splits must bring back down.
    pub fn teams_held(&self) -> (usize, usize) {
        (
            self.teams.live.len(),
            self.teams.unknown.values().map(Vec::len).sum(),
        )
    }
}
