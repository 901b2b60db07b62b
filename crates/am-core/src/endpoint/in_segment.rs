//! Collectives whose source and destination are ranges of segment 0 (OpenSHMEM's
//! `shmem_broadcastmem` and `shmem_sum_reduce` on symmetric memory): the bytes move by the
//! NIC's puts and gets straight between the members' segments, with no `Vec` in between.
//!
//! Each runs as three parts, each a collective of the engine's or a move of its own:
//!
//! 1. **Agreement**: an all-gather ([`CollectiveKind::InSegment`]) of every member's
//!    arguments (which collective, root, reduction, length, source and destination
//!    offsets). Members that disagree on anything but the offsets fail it with
//!    [`AmError::CollectiveMismatch`] naming the first that differs. Once it completes
//!    every member has entered: its source holds its data and its destination is free.
//! 2. **The move.** Where the NIC reads and writes peers' memory (`Capabilities::get` and
//!    `put`), each member does its share itself: a broadcast's members copy the root's
//!    source into their destination; in an all-reduce member `r` reduces block `r` of every
//!    member's source, in team order, a chunk at a time, and writes the result into
//!    every member's destination. Only member `r` touches block `r` of any member, so
//!    a source that is its destination (in place) is safe. Elsewhere the move is the
//!    engine's own broadcast or all-reduce of the source's bytes, whose result is written
//!    into the destination.
//! 3. **A status**, after a direct move: an all-reduce (max) of a word that says whether
//!    each member's move failed. Once it completes every member's writes into this
//!    member's destination are complete, and nobody reads its source any more. Where some
//!    member's move failed (an all-reduce's destinations then lack its block; a
//!    broadcast's, its own copy), the collective fails on every member: each one whose own
//!    move failed with its error, the others with [`AmError::MemberFailed`].
//!
//! The team's later collectives wait to start until this one's last part has started, so
//! that every member starts the team's collectives in the same order.

use std::task::{ready, Poll};

pub(super) mod state;

use self::state::{Held, InSegment, Part, What};
use super::coll::{Args, Data};
use super::teams::{misbehaved, NO_PEER};
use super::Endpoint;
use crate::error::{AmError, Misbehavior};
use crate::handler::Threading;
use crate::op::{Op, Outcome, Raw};
use crate::protocol::CollectiveKind;
use crate::reduce::{Element, ReduceOp, Reduction};
use crate::team::{Team, TeamId};
use crate::transport::RmaRequests;
use crate::transport::Transport;
use crate::types::Rank;

/// Bytes of one member's arguments in the agreement: six words.
const ARGS_LEN: usize = 48;

/// The bytes a direct all-reduce reduces at a time (a whole number of elements): small
/// enough that the sum and the block being added stay in the cache.
const REDUCE_CHUNK: usize = 64 << 10;

/// The bytes of its share a member moves in one advance, about (an all-reduce goes on to
/// the end of a chunk, and moves at least one): the advance runs inside a poll, under a
/// [`crate::SharedNode`]'s lock, which the other threads then get back between these steps
/// rather than wait out a whole move of many megabytes. (An all-reduce's step reads and
/// writes each member's range of it: its memory traffic is some times this.)
pub(in crate::endpoint) const MOVE_PER_STEP: usize = 256 << 10;

/// Whether `[a, a + len)` and `[b, b + len)` overlap without being the same range.
fn overlap(a: usize, b: usize, len: usize) -> bool {
    a != b && a < b.saturating_add(len) && b < a.saturating_add(len)
}

impl<H: Threading> Endpoint<H> {
    /// Starts a broadcast in segment 0 ([`crate::endpoint::start::TeamBroadcastInSegment`]):
    /// `len` bytes at `src` of team rank `root`'s segment into `dest` of every member's.
    pub fn team_broadcast_in_segment_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        root: u32,
        src: usize,
        dest: usize,
        len: usize,
    ) -> Poll<Result<Op<()>, AmError>> {
        if root >= team.size() {
            return Poll::Ready(Err(AmError::InvalidCollective(
                "a root that is not a team rank",
            )));
        }
        self.in_segment_start(t, team, What::Broadcast { root }, src, dest, len)
    }

    /// Starts an all-reduce in segment 0 ([`crate::endpoint::start::TeamAllReduceInSegment`]):
    /// `count` elements of `E` at `src` of every member's segment, reduced by `op` in team
    /// order, into `dest` of every member's.
    pub fn team_all_reduce_in_segment_start<E: Element, T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        op: ReduceOp,
        src: usize,
        dest: usize,
        count: usize,
    ) -> Poll<Result<Op<()>, AmError>> {
        let red = match self.reduction::<E>(op) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        let Some(len) = count.checked_mul(red.size()) else {
            return Poll::Ready(Err(self.out_of_bounds(src as u64, u64::MAX)));
        };
        self.in_segment_start(t, team, What::AllReduce { red }, src, dest, len)
    }

    fn in_segment_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        what: What,
        src: usize,
        dest: usize,
        len: usize,
    ) -> Poll<Result<Op<()>, AmError>> {
        if let Err(e) = self
            .check_segment(src as u64, len as u64)
            .and_then(|()| self.check_segment(dest as u64, len as u64))
        {
            return Poll::Ready(Err(e));
        }
        if overlap(src, dest, len) {
            return Poll::Ready(Err(AmError::InvalidCollective(
                "a source and destination that overlap without being the same range",
            )));
        }
        let mut block = Vec::with_capacity(ARGS_LEN);
        let [code, root, word] = what.words();
        for w in [code, root, word, len as u64, src as u64, dest as u64] {
            block.extend_from_slice(&w.to_le_bytes());
        }
        let args = Args::new(CollectiveKind::InSegment, 0, None, Data::Borrowed(&block));
        // Gated behind the team's collectives in segment 0 still starting theirs.
        let (a, b) = ready!(self.collective_start(t, team, args))?;
        let (index, gen) = self.alloc_op(NO_PEER, 0, 0, Vec::new());
        self.ops[index as usize].outstanding = 1;
        self.teams.in_segment.push(InSegment {
            index,
            gen,
            team: team.clone(),
            what,
            src,
            dest,
            len,
            part: Part::Agree(a, b),
            failed: None,
        });
        self.advance_in_segment(t);
        Poll::Ready(Ok(self.slot_op(index, gen)))
    }

    /// Whether a collective on team `id` must wait to start: one in segment 0 on it has
    /// not started its last part. Advanced first.
    #[cold]
    #[inline(never)]
    pub(super) fn in_segment_gates<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        id: TeamId,
    ) -> bool {
        if !self.teams.in_segment.iter().any(|c| c.gates(id)) {
            return false;
        }
        self.advance_in_segment(t);
        self.teams.in_segment.iter().any(|c| c.gates(id))
    }

    /// Advances the collectives in segment 0 in flight, if any.
    #[inline]
    pub(crate) fn carry_in_segment<T: Transport + ?Sized>(&mut self, t: &mut T) {
        if self.teams.in_segment_pending() {
            self.advance_in_segment(t);
        }
    }

    /// Takes every collective in segment 0 as far as it goes now; completes those done.
    #[inline(never)]
    pub(super) fn advance_in_segment<T: Transport + ?Sized>(&mut self, t: &mut T) {
        // Set again by a move that stops at its step's bytes with more to move.
        self.teams.moving = false;
        let mut i = 0;
        while i < self.teams.in_segment.len() {
            match self.step_in_segment(t, i) {
                Poll::Pending => i += 1,
                Poll::Ready(outcome) => {
                    let c = self.teams.in_segment.swap_remove(i);
                    if let Some(slot) = self.op(c.index, c.gen) {
                        if let Err(e) = outcome {
                            slot.error.get_or_insert(e);
                        }
                        slot.outstanding = 0;
                        self.settle(c.index);
                    }
                }
            }
        }
    }

    /// Takes collective `i` in segment 0 as far as it goes now: ready once it is done, or
    /// with the error that ends it.
    fn step_in_segment<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        i: usize,
    ) -> Poll<Result<(), AmError>> {
        loop {
            let c = &self.teams.in_segment[i];
            if !self.slot_pending(c.index, c.gen) {
                // The endpoint ended, which failed its slot.
                return Poll::Ready(Err(AmError::StaleHandle));
            }
            match c.part {
                Part::Agree(a, b) => {
                    let blocks = match ready!(self.poll_slot(a, b))? {
                        Raw::Bytes(v) => v,
                        _ => return Poll::Ready(Err(AmError::StaleHandle)),
                    };
                    let (srcs, dests) = self.agreed(i, &blocks)?;
                    self.teams.in_segment[i].part = Part::Move {
                        srcs,
                        dests,
                        next: 0,
                        held: None,
                    };
                }
                Part::Move { .. } => {
                    let caps = t.info().capabilities;
                    let part = if caps.put && caps.get {
                        // A move that failed is over: only the status is left to start.
                        let failed = self.teams.in_segment[i].failed.is_some();
                        let moved = if failed {
                            Ok(())
                        } else {
                            ready!(self.move_directly(t, i))
                        };
                        if let Err(e) = moved {
                            // Kept for after the status, which every member starts
                            // whatever its move met, so that the team's collectives stay
                            // in one order on every member.
                            self.teams.in_segment[i].failed.get_or_insert(e);
                        }
                        let c = &self.teams.in_segment[i];
                        let team = c.team.clone();
                        // 0, or this member's team rank + 1 where its move failed.
                        let status = match c.failed {
                            Some(_) => u64::from(team.rank()) + 1,
                            None => 0,
                        };
                        let red = self.reduction::<u64>(ReduceOp::Max)?;
                        let word = status.to_le_bytes();
                        let (a, b) = ready!(self.own_collective_start(
                            t,
                            &team,
                            Args::new(
                                CollectiveKind::AllReduce,
                                0,
                                Some(red),
                                Data::Borrowed(&word)
                            )
                        ))?;
                        Part::Status(a, b)
                    } else {
                        let (a, b) = ready!(self.engine_start(t, i))?;
                        Part::Engine(a, b)
                    };
                    self.teams.in_segment[i].part = part;
                }
                Part::Engine(a, b) => {
                    let bytes = match ready!(self.poll_slot(a, b))? {
                        Raw::Bytes(v) => v,
                        _ => return Poll::Ready(Err(AmError::StaleHandle)),
                    };
                    let c = &self.teams.in_segment[i];
                    if bytes.len() != c.len || t.segment().write(c.dest, &bytes).is_err() {
                        return Poll::Ready(Err(self.out_of_bounds(c.dest as u64, c.len as u64)));
                    }
                    return Poll::Ready(Ok(()));
                }
                Part::Status(a, b) => {
                    let status = ready!(self.poll_slot(a, b));
                    let c = &mut self.teams.in_segment[i];
                    if let Some(e) = c.failed.take() {
                        return Poll::Ready(Err(e));
                    }
                    // Read as every all-reduce's result is.
                    let word = match Vec::<u64>::finish(None, status?)?[..] {
                        [w] => w,
                        _ => return Poll::Ready(Err(AmError::StaleHandle)),
                    };
                    if word == 0 {
                        return Poll::Ready(Ok(()));
                    }
                    // The highest team rank whose move failed.
                    let team = c.team.id();
                    let peer = u32::try_from(word - 1)
                        .ok()
                        .and_then(|r| c.team.world_rank(r))
                        .unwrap_or(NO_PEER);
                    return Poll::Ready(Err(AmError::MemberFailed { team, peer }));
                }
            }
        }
    }

    /// The agreement of collective `i` came with every member's arguments (`blocks`, in
    /// team order): their source and destination offsets, or the mismatch or peer's
    /// misbehavior that fails it.
    fn agreed(&self, i: usize, blocks: &[u8]) -> Result<(Vec<usize>, Vec<usize>), AmError> {
        let c = &self.teams.in_segment[i];
        let n = c.team.size() as usize;
        if blocks.len() != n * ARGS_LEN {
            return Err(AmError::StaleHandle);
        }
        let word = |m: usize, w: usize| {
            let at = m * ARGS_LEN + w * 8;
            u64::from_le_bytes(blocks[at..at + 8].try_into().expect("eight bytes"))
        };
        let me = c.team.rank() as usize;
        let (mut srcs, mut dests) = (Vec::with_capacity(n), Vec::with_capacity(n));
        // The lowest member whose arguments differ from this member's, against the lowest
        // that holds this member's (the rule of `AmError::CollectiveMismatch`).
        let args = |m: usize| [word(m, 0), word(m, 1), word(m, 2), word(m, 3)];
        if let Some(m) = (0..n).find(|&m| args(m) != args(me)) {
            let lowest = (0..n).find(|&a| args(a) == args(me)).unwrap_or(me);
            let rank = |m: usize| c.team.world_rank(m as u32).unwrap_or(NO_PEER);
            let diff = super::mismatch::in_segment_diff(args(me), args(m));
            return Err(diff.error(c.team.id(), rank(m), rank(lowest)));
        }
        for m in 0..n {
            let peer = c.team.world_rank(m as u32).unwrap_or(NO_PEER);
            // A peer's offsets are its word: one outside the segment is its misbehavior.
            for at in [word(m, 4), word(m, 5)] {
                if self.check_segment(at, c.len as u64).is_err() {
                    return Err(misbehaved(
                        peer,
                        Misbehavior::OutOfSegment {
                            offset: at,
                            len: c.len as u64,
                        },
                    ));
                }
            }
            srcs.push(word(m, 4) as usize);
            dests.push(word(m, 5) as usize);
        }
        Ok((srcs, dests))
    }

    /// This member's share of collective `i`'s move, by the NIC's gets and puts, from where
    /// it stopped: ready once it is done. Pending where the NIC is busy.
    fn move_directly<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        i: usize,
    ) -> Poll<Result<(), AmError>> {
        let c = &self.teams.in_segment[i];
        let Part::Move {
            srcs, dests, next, ..
        } = &c.part
        else {
            return Poll::Ready(Ok(()));
        };
        let (me, len, dest) = (c.team.rank(), c.len, c.dest);
        match &c.what {
            What::Broadcast { root } => {
                let (root, from, done) = (*root, srcs[*root as usize], *next);
                if me == root && from == dest {
                    // Its own bytes, already where they go.
                    return Poll::Ready(Ok(()));
                }
                let owner = c.team.world_rank(root).unwrap_or(NO_PEER);
                // The bytes from `done` on, a step's worth at a time.
                let piece = len.saturating_sub(done).min(MOVE_PER_STEP);
                let (from, to) = (from + done, dest + done);
                if piece == 0 {
                    return Poll::Ready(Ok(()));
                }
                if me != root {
                    ready!(self.nic_rma(|| t.get_own(owner, from, to, piece)))?;
                } else if super::rma::copy_here(t, from, to, piece).is_err() {
                    return Poll::Ready(Err(self.out_of_bounds(to as u64, piece as u64)));
                }
                if let Part::Move { next, .. } = &mut self.teams.in_segment[i].part {
                    *next = done + piece;
                }
                if done + piece < len {
                    self.teams.moving = true;
                    return Poll::Pending;
                }
                Poll::Ready(Ok(()))
            }
            What::AllReduce { red } => {
                let red = red.clone();
                let n = c.team.size() as usize;
                let members: Vec<Rank> = c.team.members().to_vec();
                let (srcs, dests, mut next) = (srcs.clone(), dests.clone(), *next);
                // This member's block: elements split as evenly as they go.
                let elems = len / red.size();
                let lo = elems * me as usize / n * red.size();
                let hi = elems * (me as usize + 1) / n * red.size();
                // Whole elements, at least one (a plain element may be larger than a chunk).
                let step = (REDUCE_CHUNK / red.size()).max(1) * red.size();
                // A chunk the NIC stopped part-way through its writes goes on with its bytes.
                let held = match &mut self.teams.in_segment[i].part {
                    Part::Move { held, .. } => held.take(),
                    _ => None,
                };
                let (mut acc, mut written) = match held {
                    Some(h) => (h.acc, h.written),
                    None => (std::mem::take(&mut self.teams.reduce_acc), 0),
                };
                let mut other = std::mem::take(&mut self.teams.reduce_other);
                let mut result = Poll::Ready(Ok(()));
                let mut moved = 0;
                while lo + next * step < hi {
                    if moved >= MOVE_PER_STEP {
                        // The rest at the next advance, after the driver's other work.
                        self.teams.moving = true;
                        result = Poll::Pending;
                        break;
                    }
                    let at = lo + next * step;
                    let take = step.min(hi - at);
                    acc.resize(take, 0);
                    other.resize(take, 0);
                    let r = self.reduce_chunk(
                        t,
                        &red,
                        &members,
                        (&srcs, &dests, at),
                        &mut acc,
                        &mut other,
                        &mut written,
                    );
                    match r {
                        Poll::Ready(Ok(())) => {
                            next += 1;
                            moved += take;
                            written = 0;
                        }
                        r => {
                            result = r;
                            break;
                        }
                    }
                }
                if let Part::Move { next: n, held, .. } = &mut self.teams.in_segment[i].part {
                    *n = next;
                    if written > 0 {
                        // Kept with its collective: another's move may use the shared buffer.
                        *held = Some(Held { acc, written });
                        acc = Vec::new();
                    }
                }
                if self.teams.reduce_acc.capacity() < acc.capacity() {
                    self.teams.reduce_acc = acc;
                }
                self.teams.reduce_other = other;
                result
            }
        }
    }

    /// One chunk of this member's block of a direct all-reduce: the bytes at `at` of every
    /// member's source, reduced in team order into `acc`, then written at `at` of every
    /// member's destination. Pending where the NIC is busy, `written` then saying how many
    /// destinations (in team order) have the result in `acc`: with none, the chunk is
    /// reduced again whole at the next try; with some, the next try writes the rest from
    /// `acc` (a destination written may be a source, in place, not to be reduced again).
    #[allow(clippy::too_many_arguments)]
    fn reduce_chunk<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        red: &Reduction,
        members: &[Rank],
        (srcs, dests, at): (&[usize], &[usize], usize),
        acc: &mut [u8],
        other: &mut [u8],
        written: &mut usize,
    ) -> Poll<Result<(), AmError>> {
        // Only where the NIC reads and writes peers' memory: never `false` here.
        if *written == 0 {
            for (m, &peer) in members.iter().enumerate() {
                let into: &mut [u8] = if m == 0 { &mut *acc } else { &mut *other };
                let read = ready!(self.read_now(t, peer, srcs[m] + at, into))?;
                debug_assert!(read, "a direct move where the NIC cannot read");
                if m > 0 {
                    red.combine(acc, other, true);
                }
            }
        }
        for (m, &peer) in members.iter().enumerate().skip(*written) {
            let done = ready!(self.write_now(t, peer, dests[m] + at, acc))?;
            debug_assert!(done, "a direct move where the NIC cannot write");
            *written = m + 1;
        }
        Poll::Ready(Ok(()))
    }

    /// Starts a part of a collective in segment 0: a collective of the team that the
    /// collectives in segment 0 still starting theirs do not hold back.
    fn own_collective_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        team: &Team,
        args: Args<'_>,
    ) -> Poll<Result<(u32, u32), AmError>> {
        self.teams.own_start = true;
        let started = self.collective_start(t, team, args);
        self.teams.own_start = false;
        started
    }

    /// Starts the engine's broadcast or all-reduce of collective `i`'s source bytes.
    fn engine_start<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        i: usize,
    ) -> Poll<Result<(u32, u32), AmError>> {
        let c = &self.teams.in_segment[i];
        let (team, what) = (c.team.clone(), c.what.clone());
        let gives = match &what {
            What::Broadcast { root } => *root == team.rank(),
            What::AllReduce { .. } => true,
        };
        let mut data = vec![0u8; if gives { c.len } else { 0 }];
        if t.segment().read(c.src, &mut data).is_err() {
            return Poll::Ready(Err(self.out_of_bounds(c.src as u64, c.len as u64)));
        }
        let (kind, root, red) = match what {
            What::Broadcast { root } => (CollectiveKind::Broadcast, root, None),
            What::AllReduce { red } => (CollectiveKind::AllReduce, 0, Some(red)),
        };
        let args = Args::new(kind, root, red, Data::Taken(&mut data));
        self.own_collective_start(t, &team, args)
    }
}
