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
//!   it started, whether they started here before or after it left: those that wait for a
//!   step of its not arrived, or send to it, fail, and every later one on the team; the
//!   others complete. A rank that fails a collective for a gone member
//!   tells every other member of the team, once per gone member and team (a
//!   [`SystemMsg::Collective`] of kind [`CollectiveKind::MemberLost`] or
//!   [`CollectiveKind::MemberDeparted`]): they fail that collective and the later ones on
//!   the team with the same error, without waiting for their own transport to notice (udp
//!   and ofi across hosts notice a silent peer only after `AM_PEER_TIMEOUT_MS`). A rank
//!   whose transport noticed the loss while nothing was in flight on a team tells the team
//!   when it next starts a collective on it (which fails at once). So a survivor learns of
//!   the loss within one message of the first member that failed a collective for it. A
//!   notice for a team not known here is dropped.
//! - **Chunks**: a collective whose bytes are more than one system Medium carries
//!   (`max_medium`: a broadcast's bytes, a reduction's vector, a gather's block) runs as
//!   chunk collectives on consecutive sequences, each over a slice of at most `max_medium`
//!   bytes (whole elements of a reduction), up to the window's worth in flight at once; its
//!   operation completes once every chunk has. Every member starts the chunks in the same
//!   order, and no other collective on the team until it has started them all: a member
//!   that is not a broadcast's root learns the count from the first chunk's step (the
//!   root's word in it), so its next start on the team waits until that step has come.
//!   Members that disagree on a length disagree on a chunk's length or on the collective
//!   of a sequence: a mismatch, as any other.
//! - **Progress**: collectives advance in [`Endpoint::poll_op`] of any operation in the
//!   table and in [`Endpoint::background_step`] (every driver's poll), so one whose handle
//!   was dropped, or that another collective's waiter does not name, still goes on.

use std::task::{ready, Poll};

use super::mismatch::Diff;
use super::state::Endpoint;
use super::teams::*;
use crate::config::AllReduceAlgorithm;
use crate::error::{AmError, Misbehavior};
use crate::handler::Threading;
use crate::protocol::{opcode, CollectiveKind, SystemMsg};
use crate::reduce::{Element, ReduceOp, Reduction};
use crate::team::{split_block, split_result, Team, TeamId};
use crate::transport::{Transport, Tx};
use crate::types::Rank;

/// What a collective starts with: its kind, root, reduction, this member's bytes and the
/// block length (a gather's and all-gather's).
pub(super) struct Args<'a> {
    pub(super) kind: CollectiveKind,
    pub(super) root: u32,
    pub(super) red: Option<Reduction>,
    pub(super) data: Data<'a>,
    /// The symmetric allocation or free this collective agrees on ([`super::heap`]).
    pub(super) heap: Option<crate::symmetric::HeapStep>,
    /// The segment publication or free this collective carries, with the team's members
    /// ([`super::segments`]).
    pub(super) seg: Option<(Vec<Rank>, crate::segment::SegStep)>,
}

impl<'a> Args<'a> {
    /// A collective that carries no symmetric allocation and no segment publication.
    #[inline]
    pub(super) fn new(
        kind: CollectiveKind,
        root: u32,
        red: Option<Reduction>,
        data: Data<'a>,
    ) -> Args<'a> {
        Args {
            kind,
            root,
            red,
            data,
            heap: None,
            seg: None,
        }
    }
}

/// A collective's bytes: borrowed (copied when it starts) or the caller's own vector,
/// taken when it starts (a reduction's encoded input: no second copy).
pub(super) enum Data<'a> {
    Borrowed(&'a [u8]),
    Taken(&'a mut Vec<u8>),
}

impl Data<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Data::Borrowed(b) => b,
            Data::Taken(v) => v,
        }
    }

    fn into_vec(self) -> Vec<u8> {
        match self {
            Data::Borrowed(b) => b.to_vec(),
            Data::Taken(v) => std::mem::take(v),
        }
    }
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
        let args = Args::new(CollectiveKind::Barrier, 0, None, Data::Borrowed(&[]));
        let (index, gen) = ready!(self.collective_start(t, team, args))?;
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// Starts an all-gather of `block` over `team`
    /// ([`crate::endpoint::start::TeamAllGather`]): completes with every member's block, in
    /// team order. Every member gives a block of the same length.
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
    /// bytes; the others give `&[]`.
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
        self.reduce_start::<E, T>(t, team, root, op, Data::Borrowed(data))
    }

    /// [`Endpoint::team_reduce_start`] on bytes the caller gives up: taken (left empty)
    /// once the reduction starts, rather than copied.
    pub(crate) fn team_reduce_start_taking<E: Element, T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        root: Option<u32>,
        op: ReduceOp,
        data: &mut Vec<u8>,
    ) -> Poll<Result<crate::op::Op<Vec<E>>, AmError>> {
        self.reduce_start::<E, T>(t, team, root, op, Data::Taken(data))
    }

    /// `op` over `E`: a built-in operation, or the user's registered in this node's
    /// handlers.
    pub(super) fn reduction<E: Element>(&self, op: ReduceOp) -> Result<Reduction, AmError> {
        match op {
            ReduceOp::User(id) => Reduction::user::<E>(id, self.handlers.reductions.get(&id.0)),
            op => Reduction::new::<E>(op),
        }
    }

    fn reduce_start<E: Element, T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        root: Option<u32>,
        op: ReduceOp,
        data: Data<'_>,
    ) -> Poll<Result<crate::op::Op<Vec<E>>, AmError>> {
        let red = match self.reduction::<E>(op) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let (kind, root) = match root {
            Some(r) => (CollectiveKind::Reduce, r),
            None => (CollectiveKind::AllReduce, 0),
        };
        let args = Args::new(kind, root, Some(red), data);
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
        let args = Args::new(kind, root, red, Data::Borrowed(data));
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
        let args = Args::new(CollectiveKind::Split, 0, None, Data::Borrowed(&block));
        let (index, gen) = ready!(self.collective_start(t, parent, args))?;
        // Used whether or not this rank leads the new team: never offered twice.
        self.teams.serial = self.teams.serial.wrapping_add(1).max(1);
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// Starts a collective on `team`: its operation slot, whose completion carries the
    /// outcome (the gathered blocks, the bytes, or nothing). It waits to start while a
    /// collective in segment 0 on the team has not started its last part (see
    /// `in_segment`), so that every member starts them in one order; that collective's own
    /// parts start with `Teams::own_start` set.
    pub(super) fn collective_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        args: Args<'_>,
    ) -> Poll<Result<(u32, u32), AmError>> {
        if self.teams.in_segment_pending()
            && !self.teams.own_start
            && self.in_segment_gates(t, team.id())
        {
            return Poll::Pending;
        }
        let Args {
            kind,
            root,
            red,
            data,
            heap,
            seg,
        } = args;
        let id = team.id();
        if !team.is_of(&self.teams.drops) {
            return Poll::Ready(Err(AmError::UnknownTeam(id)));
        }
        if let Some(e) = &self.ended {
            return Poll::Ready(Err(e.clone()));
        }
        self.adopt_team_drops();
        let Some(ts) = self.teams.live.get(&id).filter(|ts| !ts.freed) else {
            return Poll::Ready(Err(AmError::UnknownTeam(id)));
        };
        if let Some(e) = ts.failed.clone() {
            // The others may not know yet (this rank's transport noticed a loss while
            // nothing was in flight, or the team was made with a member gone): they hear
            // it now, once, rather than wait for this rank's steps.
            if let Some((p, kind)) = gone_notice(&e).filter(|&(p, _)| ts.members.contains(&p)) {
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
        let len = data.bytes().len();
        if red.as_ref().is_some_and(|r| len % r.size() != 0) {
            return Poll::Ready(Err(AmError::InvalidCollective(
                "a reduction over bytes that are not whole elements",
            )));
        }
        let me = ts.me;
        let wait = ts.must_wait();
        let max = self.limits.max_medium;
        if len > max && red.as_ref().is_some_and(|r| r.size() > max) {
            // Chunks are whole elements of at most one Medium each.
            return Poll::Ready(Err(AmError::InvalidCollective(
                "an element larger than max_medium bytes",
            )));
        }
        // A ring all-reduce ([`crate::AllReduceAlgorithm`]) runs as chunks of `n` blocks of up
        // to a Medium each, its root field saying so. Only over a built-in operation, which
        // is commutative, as a ring's reduce-scatter needs.
        let n = ts.members.len() as u32;
        let ring = kind == CollectiveKind::AllReduce
            && red
                .as_ref()
                .is_some_and(|r| !r.is_user() && r.size() <= max)
            && (2..=RING_MAX_MEMBERS).contains(&n)
            && match self.teams.all_reduce {
                // At 2 members a ring moves as many bytes as doubling, in two dependent
                // steps per chunk rather than one: it pays only where Mediums are small
                // (its chunks are twice as long, so half as many).
                AllReduceAlgorithm::Auto => len > max && (n > 2 || max < RING_PAIR_MEDIUM),
                AllReduceAlgorithm::Ring => len > 0,
                _ => false,
            };
        let root = if ring { RING_ROOT } else { root };
        // More than one step carries: chunk collectives (see `Big`). A broadcast's length is
        // the root's: the others learn it from its first step.
        let big = (len > max || ring) && kind != CollectiveKind::Split;
        if kind == CollectiveKind::Barrier {
            // As the world barrier: what this rank posted is applied before it enters.
            ready!(self.apply_posted(t))?;
            if self.detached_in_flight > 0 {
                return Poll::Pending;
            }
        }
        if wait {
            self.advance_team(t, id);
            if self.teams.live.get(&id).is_some_and(TeamState::must_wait) {
                return Poll::Pending;
            }
            // What the wait advanced may have failed the team (a mismatch, a gone member).
            if let Some(e) = self.teams.live.get(&id).and_then(|ts| ts.failed.clone()) {
                return Poll::Ready(Err(e));
            }
        }
        let (index, gen) = self.alloc_op(NO_PEER, 0, 0, Vec::new());
        // In flight until the collective completes (or a failure completes it).
        self.ops[index as usize].outstanding = 1;
        if let Some(step) = heap {
            // Before its first step: a team of one completes it at once.
            self.heap_begin(index, gen, step);
        }
        if let Some((members, step)) = seg {
            self.teams.seg_ops.push(crate::segment::SegOp {
                index,
                gen,
                members,
                step,
            });
        }
        let Some(ts) = self.teams.live.get_mut(&id) else {
            return Poll::Ready(Err(AmError::UnknownTeam(id)));
        };
        if big {
            let chunk = red.as_ref().map_or(max, |r| max / r.size() * r.size());
            let chunk = if ring { chunk * n as usize } else { chunk };
            let chunks = len.div_ceil(chunk);
            let Ok(chunks) = u32::try_from(chunks) else {
                return Poll::Ready(Err(AmError::InvalidCollective(
                    "more than 2^32 chunks of max_medium bytes",
                )));
            };
            // A reduction's result and a broadcast root's are `data` itself (see `Big`).
            let out = match kind {
                k if k.gathers_all() => vec![0u8; n as usize * len],
                CollectiveKind::Gather if me == root => vec![0u8; n as usize * len],
                _ => Vec::new(),
            };
            self.teams.chunked = true;
            ts.bigs.push(Big {
                index,
                gen,
                kind,
                root,
                red,
                data: data.into_vec(),
                chunk,
                chunks,
                issued: 0,
                done: 0,
                out,
            });
            self.advance_team(t, id);
            return Poll::Ready(Ok((index, gen)));
        }
        self.push_coll(id, kind, root, red, data.into_vec(), (index, gen), None, 0);
        // Its first steps go out now if credits allow.
        self.advance_team(t, id);
        Poll::Ready(Ok((index, gen)))
    }

    /// Starts the collective of the team's next sequence, on `data`, in operation slot
    /// `slot`: chunk `chunk` of a [`Big`] or a collective of its own. `desc` is a broadcast
    /// root's count of chunks (the reduction's word otherwise).
    #[allow(clippy::too_many_arguments)]
    fn push_coll(
        &mut self,
        id: TeamId,
        kind: CollectiveKind,
        root: u32,
        red: Option<Reduction>,
        data: Vec<u8>,
        (index, gen): (u32, u32),
        chunk: Option<u32>,
        chunks: u32,
    ) {
        let Some(ts) = self.teams.live.get_mut(&id) else {
            return;
        };
        let n = ts.members.len() as u32;
        let (buf, block) = match kind {
            k if k.gathers_all() => {
                let mut buf = vec![0u8; n as usize * data.len()];
                let at = ts.me as usize * data.len();
                buf[at..at + data.len()].copy_from_slice(&data);
                (buf, data.len())
            }
            CollectiveKind::Gather if ts.me == root => {
                let mut buf = vec![0u8; n as usize * data.len()];
                let at = ts.me as usize * data.len();
                buf[at..at + data.len()].copy_from_slice(&data);
                (buf, data.len())
            }
            CollectiveKind::AllReduce if is_ring(kind, root) => {
                let block = data.len() / n as usize;
                (data, block)
            }
            _ => {
                let block = data.len();
                (data, block)
            }
        };
        let seq = ts.next_seq;
        ts.next_seq += 1;
        // A chunk's word also says how many chunks are left from it (at least 1; capped),
        // so that members that cut different lengths into chunks disagree at the latest on
        // the last chunk of the shorter, never matching a chunk with a collective of its own.
        let left = chunk.map_or(0, |k| (chunks - k).min(CHUNKS_LEFT_MAX));
        let desc = match (kind, &red) {
            (CollectiveKind::Broadcast, _) if chunks > 1 => chunks,
            (_, red) => red.as_ref().map_or(0, Reduction::word) | left << CHUNKS_LEFT_SHIFT,
        };
        let mut c = Coll {
            seq,
            index,
            gen,
            kind,
            root,
            desc,
            red,
            block,
            buf,
            plan: ts.plan_of(kind, root, seq),
            at: 0,
            mismatch: None,
            chunk,
            took_from: NO_PEER,
        };
        // Steps that came before it started, from members that started something else.
        if !ts.early.is_empty() {
            c.mismatch = ts
                .early
                .iter()
                .find(|(&(s, _), a)| s == seq && !agrees(kind, root, c.desc, a))
                .map(|(_, a)| (a.src, c.sig().diff(&a.sig())));
        }
        if let Some(at) = ts.mismatch_at.iter().position(|&(s, _, _)| s == seq) {
            let (_, src, sig) = ts.mismatch_at.swap_remove(at);
            c.mismatch.get_or_insert((src, c.sig().diff(&sig)));
        }
        ts.colls.push(c);
        self.teams.in_flight += 1;
        if kind == CollectiveKind::Split {
            self.teams.splits += 1;
        }
    }

    /// Starts the next chunks of the team's oldest [`Big`] still starting them, as far as
    /// the window allows; drops those whose operation failed, and fails those the team's
    /// failure ends. Whether it started any.
    fn issue_chunks(&mut self, id: TeamId) -> bool {
        let mut started = false;
        loop {
            let Some(ts) = self.teams.live.get_mut(&id) else {
                return started;
            };
            let Some(at) = ts.bigs.iter().position(|b| b.issued < b.chunks) else {
                return started;
            };
            let (index, gen) = (ts.bigs[at].index, ts.bigs[at].gen);
            let alive = self.slot_pending(index, gen);
            let ts = self.teams.live.get_mut(&id).expect("looked up above");
            if !alive || ts.failed.is_some() {
                ts.bigs.remove(at);
                // Its chunks in flight fail with the team; the operation fails once.
                let error = ts.failed.clone();
                if let (true, Some(e)) = (alive, error) {
                    self.fail_slots_of(vec![(index, gen)], &e);
                }
                continue;
            }
            if ts.window_full() || ts.colls.len() >= MAX_CHUNKS_IN_FLIGHT {
                return started;
            }
            let b = &mut ts.bigs[at];
            let k = b.issued;
            b.issued += 1;
            let (kind, root, red, chunks) = (b.kind, b.root, b.red.clone(), b.chunks);
            let mut data = b.data[b.range(k)].to_vec();
            if let (true, Some(r)) = (is_ring(b.kind, b.root), &b.red) {
                // A ring's chunk is `n` equal blocks of whole elements: the last one padded
                // (the padding's results are dropped).
                let unit = ts.members.len() * r.size();
                data.resize(data.len().div_ceil(unit) * unit, 0);
            }
            self.push_coll(id, kind, root, red, data, (index, gen), Some(k), chunks);
            started = true;
        }
    }

    /// Frees `team` here ([`crate::Node::free_team`]): forgotten once its collectives in
    /// flight here complete, whatever clones of its handle remain.
    pub fn free_team(&mut self, team: Team) -> Result<(), AmError> {
        let id = team.id();
        if !team.is_of(&self.teams.drops) || id == TeamId::WORLD {
            return Err(AmError::UnknownTeam(id));
        }
        self.adopt_team_drops();
        if let Some(ts) = self.teams.live.get_mut(&id) {
            ts.freed = true;
            if ts.colls.is_empty() {
                self.teams.live.remove(&id);
            }
        }
        Ok(())
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
        self.teams.refused.clear();
        loop {
            let mut i = 0;
            while let Some(c) = self.teams.live.get(&id).and_then(|ts| ts.colls.get(i)) {
                let outcome = if self.slot_pending(c.index, c.gen) {
                    self.step_coll(tx, id, i)
                } else {
                    // Its slot was failed (the endpoint ended, or another chunk of its
                    // `Big` failed): nothing more to do.
                    Poll::Ready(Err(AmError::StaleHandle))
                };
                match outcome {
                    Poll::Pending => i += 1,
                    Poll::Ready(r) => self.complete_coll(id, i, r),
                }
            }
            // Chunks of a `Big` that the window has room for now: taken round again.
            if !self.teams.chunked || !self.issue_chunks(id) {
                break;
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
            if let Some((peer, diff)) = c.mismatch {
                let agrees = ts.members.get(me as usize).copied().unwrap_or(peer);
                return Poll::Ready(Err(diff.error(id, peer, agrees)));
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
                    if self.teams.refused.contains(&to) {
                        // A step to `to` was refused earlier in this advance: this one waits
                        // with it rather than be encoded to be refused too (with many
                        // collectives in flight, every advance would try each).
                        return Poll::Pending;
                    }
                    let buf = std::mem::take(&mut c.buf);
                    let len = c.block;
                    let payload = match part {
                        Part::Nothing => &[][..],
                        // Plans send blocks, never folds: the same bytes either way.
                        Part::Block(b) | Part::Fold(b) => {
                            &buf[b as usize * len..(b as usize + 1) * len]
                        }
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
                    let sent = self.collective_step(tx, to, msg, payload);
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
                            self.teams.refused.push(to);
                            return Poll::Pending;
                        }
                    }
                }
                Action::Take { from, step, part } => {
                    let Some(mut a) = ts.early.remove(&(seq, step)) else {
                        // Not arrived: unless its sender is gone, which fails the team.
                        let from = ts.members[from as usize];
                        return match self.waiting_for(from) {
                            Poll::Ready(e) => Poll::Ready(Err(e)),
                            Poll::Pending => Poll::Pending,
                        };
                    };
                    if !c.take(part, &mut a) {
                        // Kept, for the notice that tells the others what differs.
                        let (peer, diff) = c.length_mismatch(part, a.src, a.data.len());
                        c.mismatch = Some((peer, diff));
                        let agrees = ts.members.get(me as usize).copied().unwrap_or(peer);
                        return Poll::Ready(Err(diff.error(id, peer, agrees)));
                    }
                    // Copied or folded (or moved, leaving nothing): its buffer serves a later step.
                    self.teams.spare(a.data);
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
        let c = ts.colls.remove(i);
        // Most collectives complete with their result, no team or chunks to make, no heap
        // or segment step to end: their slot takes the result at once.
        let outcome = match outcome {
            Ok(data)
                if c.chunk.is_none()
                    && c.kind != CollectiveKind::Split
                    && !c.announces_chunks(ts.me)
                    && self.teams.heap_op.is_none()
                    && self.teams.seg_ops.is_empty() =>
            {
                self.teams.in_flight = self.teams.in_flight.saturating_sub(1);
                if let Some(slot) = self.op(c.index, c.gen) {
                    // A slot's team is only a split's, taken when the slot is finished.
                    debug_assert!(slot.team.is_none());
                    slot.data = data;
                    slot.outstanding = 0;
                    self.settle(c.index);
                }
                return;
            }
            outcome => outcome,
        };
        if outcome.is_err() {
            // What came for it is no collective's any more; what comes later is dropped
            // (the team is failed below).
            ts.early.retain(|&(s, _), _| s != c.seq);
            if let Err(e) = &outcome {
                ts.failed.get_or_insert_with(|| e.clone());
            }
        }
        // Only a split needs its team's members once the team may have changed below.
        let parent = (c.kind == CollectiveKind::Split).then(|| (ts.members.clone(), ts.me));
        let gone = outcome
            .as_ref()
            .err()
            .and_then(gone_notice)
            .filter(|(p, _)| ts.members.contains(p));
        self.teams.in_flight = self.teams.in_flight.saturating_sub(1);
        if let Some((p, kind)) = gone {
            self.notify(id, c.seq, p, kind);
        } else if let Err(e @ AmError::CollectiveMismatch { peer, .. }) = &outcome {
            // The team's sequence is broken: this collective and every later one on it
            // fail, here and, once told, on every member.
            let e = e.clone();
            let diff = c.mismatch.map(|(_, d)| d);
            self.notify_with(id, c.seq, *peer, CollectiveKind::Mismatch, diff);
            self.fail_team_from(id, c.seq, &e);
        }
        let mut made = None;
        let outcome = match (parent, outcome) {
            (Some((members, me)), outcome) => {
                self.teams.splits = self.teams.splits.saturating_sub(1);
                let r = outcome.and_then(|blocks| self.make_team(&members, me, &blocks));
                if self.teams.splits == 0 {
                    self.drop_unknown();
                }
                r.map(|team| {
                    made = Some(team);
                    Vec::new()
                })
            }
            (None, outcome) => outcome,
        };
        // A chunk's outcome is its `Big`'s once every chunk is in.
        let Some(outcome) = self.chunk_done(id, &c, outcome) else {
            return;
        };
        let outcome = match &self.teams.heap_op {
            Some(h) if h.is(c.index, c.gen) => self.heap_end(outcome),
            _ => outcome,
        };
        let outcome = match self
            .teams
            .seg_ops
            .iter()
            .position(|s| s.index == c.index && s.gen == c.gen)
        {
            Some(i) => {
                let op = self.teams.seg_ops.swap_remove(i);
                self.segment_end(op, outcome)
            }
            None => outcome,
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

    /// Whether operation slot `(index, gen)` is live and still waits for its collective (not
    /// completed, nor failed by the endpoint's end or by another chunk of its `Big`).
    pub(super) fn slot_pending(&self, index: u32, gen: u32) -> bool {
        self.ops
            .get(index as usize)
            .is_some_and(|s| s.live && s.gen == gen && s.outstanding > 0)
    }

    /// Puts a completed chunk's result into its [`Big`]: the `Big`'s outcome once it is
    /// whole (or failed), `None` while chunks remain. The first step of a broadcast this
    /// rank does not root that says it has more chunks makes it a `Big` here. Any other
    /// collective's outcome is its own.
    fn chunk_done(
        &mut self,
        id: TeamId,
        c: &Coll,
        outcome: Result<Vec<u8>, AmError>,
    ) -> Option<Result<Vec<u8>, AmError>> {
        let ts = self.teams.live.get_mut(&id)?;
        let at = ts
            .bigs
            .iter()
            .position(|b| (b.index, b.gen) == (c.index, c.gen));
        let (data, k, at) = match (outcome, c.chunk, at) {
            (Err(e), _, at) => {
                if let Some(at) = at {
                    ts.bigs.remove(at);
                }
                return Some(Err(e));
            }
            (Ok(data), None, _) => {
                if !c.announces_chunks(ts.me) {
                    return Some(Ok(data));
                }
                if data.is_empty() {
                    // More chunks than bytes: not our protocol.
                    // The member that sent it (its parent in the tree), not the root.
                    return Some(Err(misbehaved(
                        c.took_from,
                        Misbehavior::BadSystemMessage(opcode::COLLECTIVE),
                    )));
                }
                self.teams.chunked = true;
                ts.bigs.push(Big {
                    index: c.index,
                    gen: c.gen,
                    kind: c.kind,
                    root: c.root,
                    red: None,
                    data: Vec::new(),
                    chunk: data.len(),
                    chunks: c.desc,
                    issued: 1,
                    done: 1,
                    // Room for the chunks the root announced, so that none moves the others.
                    out: with_room(data, c.desc),
                });
                return None;
            }
            // Its `Big` was dropped (another chunk failed, and so did the operation).
            (Ok(_), Some(_), None) => return None,
            (Ok(data), Some(k), Some(at)) => (data, k, at),
        };
        let n = ts.members.len();
        // A chunk's bytes came from this member's parent in the tree.
        let sender = c.took_from;
        let b = &mut ts.bigs[at];
        let r = b.range(k);
        match b.kind {
            CollectiveKind::Broadcast => {
                let from = k as usize * b.chunk;
                let last = k + 1 == b.chunks;
                if data.len() > b.chunk || (!last && data.len() != b.chunk) {
                    ts.bigs.remove(at);
                    return Some(Err(misbehaved(
                        sender,
                        Misbehavior::BadSystemMessage(opcode::COLLECTIVE),
                    )));
                }
                if b.root == ts.me {
                    // Its own bytes, sent: the result is `data` itself.
                } else if b.out.len() == from {
                    b.out.extend_from_slice(&data);
                } else {
                    if b.out.len() < from + data.len() {
                        b.out.resize(from + data.len(), 0);
                    }
                    b.out[from..from + data.len()].copy_from_slice(&data);
                }
            }
            k if (k.gathers_all() || k == CollectiveKind::Gather) && !data.is_empty() => {
                let (len, block) = (r.len(), b.data.len());
                for m in 0..n {
                    b.out[m * block + r.start..m * block + r.end]
                        .copy_from_slice(&data[m * len..(m + 1) * len]);
                }
            }
            CollectiveKind::AllReduce | CollectiveKind::Reduce if !data.is_empty() => {
                // Chunk `k`'s input was copied out when it started: its result replaces it
                // (a ring's without the padding).
                let len = r.len();
                b.data[r].copy_from_slice(&data[..len]);
            }
            _ => {}
        }
        b.done += 1;
        if b.done < b.chunks {
            return None;
        }
        let b = ts.bigs.remove(at);
        Some(Ok(match b.kind {
            CollectiveKind::AllReduce => b.data,
            CollectiveKind::Reduce | CollectiveKind::Broadcast if b.root == ts.me => b.data,
            _ => b.out,
        }))
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
        for (seq, step, a) in self.teams.unknown.remove(&tid).unwrap_or_default() {
            let src = a.src;
            if ts.arrive(src, seq, step, a).is_none() {
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
        // A member lost fails the team at once. One departed may have ended collectives on
        // it before it left (their steps were adopted above): those fail only where they
        // wait for it.
        if let Some(e) = members.iter().find_map(|&m| match self.waiting_for(m) {
            Poll::Ready(AmError::PeerDeparted(_)) | Poll::Pending => None,
            Poll::Ready(e) => Some(e),
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
            if let Some((seq, step, a)) = steps.first() {
                let (seq, step) = (*seq, *step);
                self.teams.stray.get_or_insert(misbehaved(
                    a.src,
                    Misbehavior::StrayCollective { team, seq, step },
                ));
            }
        }
        self.teams.unknown.clear();
    }

    /// `peer` is gone (`error` says how) from every team it belongs to. Lost (`eager`), it
    /// fails every collective in flight on them and every later one: it may not have sent
    /// its part, and the others wait for what it would have sent on. Departed cleanly, it
    /// ended what it had started and sent what it owed before it left (a transport reports
    /// a departure after the messages sent before it): only a collective that still waits
    /// for a step of its own, not arrived, fails, and then every later one on the team. A
    /// collective started here after the departure, which the departed member had already
    /// ended, finds its steps arrived and completes; one it had not started fails where it
    /// waits for the departed member or sends to it.
    pub(super) fn fail_teams_with(&mut self, peer: Rank, error: &AmError, eager: bool) {
        let mut failed = Vec::new();
        let mut removed = 0u32;
        let mut notify = Vec::new();
        let mut splits = 0;
        self.teams.dirty = true;
        for (&id, ts) in self.teams.live.iter_mut() {
            if !ts.members.contains(&peer) {
                continue;
            }
            if eager {
                ts.failed.get_or_insert_with(|| error.clone());
            }
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
                removed += 1;
            }
            ts.colls = kept;
            drop_bigs(ts, &mut failed);
            if let Some(seq) = first {
                // The team's sequence is broken from here: later collectives fail at start.
                ts.failed.get_or_insert_with(|| error.clone());
                notify.push((id, seq));
            }
        }
        self.teams
            .live
            .retain(|_, ts| !(ts.freed && ts.colls.is_empty()));
        self.teams.in_flight = self.teams.in_flight.saturating_sub(removed);
        self.teams.splits = self.teams.splits.saturating_sub(splits);
        if splits > 0 && self.teams.splits == 0 {
            self.teams.unknown.clear();
        }
        // `error` is `peer`'s loss or departure.
        let kind = gone_notice(error).map_or(CollectiveKind::MemberDeparted, |(_, k)| k);
        for (id, seq) in notify {
            self.notify(id, seq, peer, kind);
        }
        self.fail_slots_of(failed, error);
    }

    fn fail_slots_of(&mut self, failed: Vec<(u32, u32)>, error: &AmError) {
        let mut failed = failed;
        // A `Big`'s chunks share its slot: failed once.
        failed.sort_unstable();
        failed.dedup();
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
        let chunks = failed.len() as u32;
        drop_bigs(ts, &mut failed);
        self.teams.in_flight = self.teams.in_flight.saturating_sub(chunks);
        self.teams.splits = self.teams.splits.saturating_sub(splits);
        if splits > 0 && self.teams.splits == 0 {
            self.teams.unknown.clear();
        }
        self.fail_slots_of(failed, error);
    }

    /// Tells every other member of team `id` (but `gone`) that `gone` is gone and this rank
    /// failed the team's collectives from `seq` on; once per gone member and team.
    fn notify(&mut self, id: TeamId, seq: u64, gone: Rank, kind: CollectiveKind) {
        self.notify_with(id, seq, gone, kind, None)
    }

    /// As [`Endpoint::notify`], a mismatch's notice carrying what differs (`diff`, as this
    /// rank found it: `gone`'s value and its own).
    fn notify_with(
        &mut self,
        id: TeamId,
        seq: u64,
        gone: Rank,
        kind: CollectiveKind,
        diff: Option<Diff>,
    ) {
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
                self.teams.notices.push_back((id, m, seq, gone, kind, diff));
            }
        }
    }

    /// Sends the notices queued, in order, until one waits for a credit; those to members
    /// gone meanwhile are dropped.
    fn send_notices(&mut self, tx: &mut (impl Tx + ?Sized)) {
        while let Some(&(team, to, seq, gone, kind, diff)) = self.teams.notices.front() {
            let msg = SystemMsg::Collective {
                team,
                seq,
                step: gone,
                kind,
                root: 0,
                desc: 0,
            };
            // A mismatch says what differs (the sequence's steps, where nothing else is
            // known); a gone member's notice carries nothing.
            let words = diff.unwrap_or(Diff::STEPS).encode();
            let payload = match kind {
                CollectiveKind::Mismatch => &words[..],
                _ => &[],
            };
            match self.system_step(tx, to, msg, payload, None) {
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

/// Drops the [`Big`]s of a team failed just now: those whose chunks in flight failed (their
/// slots in `failed`), and those with chunks still to start (they would fail at the start),
/// whose slots join `failed`. A `Big` whose chunks are all started and kept goes on.
fn drop_bigs(ts: &mut TeamState, failed: &mut Vec<(u32, u32)>) {
    ts.bigs.retain(|b| {
        let slot = (b.index, b.gen);
        if failed.contains(&slot) {
            return false;
        }
        if b.issued < b.chunks {
            failed.push(slot);
            return false;
        }
        true
    });
}

/// Most bytes a non-root member reserves ahead for a chunked broadcast from the root's
/// count of chunks (a peer's value): beyond it the result grows as chunks arrive.
const BROADCAST_RESERVE_MAX: usize = 1 << 30;

/// `first` (a broadcast's first chunk) with room for `chunks` chunks of its length, as far
/// as [`BROADCAST_RESERVE_MAX`] and the allocator allow: the later chunks are appended
/// without moving what came before.
fn with_room(mut first: Vec<u8>, chunks: u32) -> Vec<u8> {
    let want = first
        .len()
        .saturating_mul(chunks as usize)
        .min(BROADCAST_RESERVE_MAX);
    // Refused, the result grows as chunks arrive instead: never an abort on a peer's count.
    let _ = first.try_reserve_exact(want.saturating_sub(first.len()));
    first
}
