//! Teams and collectives on the deterministic cluster harness (`harness`): random splits of 1
//! to 8 ranks checked against a sequential model, barriers and all-gathers on the teams they
//! make, several collectives in flight on overlapping teams, a member lost mid-collective,
//! and peers that send collective steps nobody expects; each over seeded interleavings of
//! the pairs, with no thread and no clock.

mod harness;

use std::collections::HashMap;
use std::task::Poll;

use am_core::endpoint::start::{
    AllocSymmetric, Split, Start, TeamAllGather, TeamBarrier, TeamBroadcast, TeamGather, TeamReduce,
};
use am_core::endpoint::Endpoint;
use am_core::protocol::{CollectiveKind, SystemMsg};
use am_core::wire::{Header, MAX_HEAD_LEN};
use am_core::{AmError, AmKind, Category, Local, Misbehavior, Op, Rank, ReduceOp, Team, TeamId};
use harness::{Cluster, Shape, Wire};
use proptest::prelude::*;

/// Which team an operation of a plan runs on: the world, or the team an earlier split of the
/// same plan made (by its index in the plan).
#[derive(Debug, Clone, Copy)]
enum On {
    World,
    Made(usize),
}

/// One operation of a rank's plan.
#[derive(Debug, Clone)]
enum Want {
    Split(On, Option<u32>, u32),
    Barrier(On),
    Gather(On, Vec<u8>),
    /// A broadcast from team rank `root % size` of `len` bytes ([`block`] of the root's, by
    /// the operation's index).
    Broadcast(On, u32, usize),
    /// A gather of this block to team rank `root % size`.
    GatherTo(On, u32, Vec<u8>),
    /// A reduction of this vector by the op, to team rank `root % size` or (`None`) to all.
    Reduce(On, Option<u32>, ReduceOp, Vec<i64>),
    /// An all-reduce of floats by sum.
    SumF(On, Vec<f64>),
}

enum Running {
    Split(Op<Option<Team>>),
    Barrier(Op<()>),
    Gather(Op<Vec<u8>>),
    Ints(Op<Vec<i64>>),
    Floats(Op<Vec<f64>>),
}

/// What an operation of a plan gave.
#[derive(Debug)]
enum Got {
    Team(Option<Team>),
    Unit,
    Bytes(Vec<u8>),
    Ints(Vec<i64>),
    Floats(Vec<f64>),
    /// It ran on a team that the rank's split did not give it.
    Skipped,
}

/// One rank's plan, started in order as soon as each operation can start (an operation on a
/// made team waits for its split), every started one polled at each step, so several are in
/// flight at once.
struct Plan {
    wants: Vec<Want>,
    next: usize,
    running: Vec<Option<Running>>,
    got: Vec<Option<Result<Got, AmError>>>,
}

impl Plan {
    fn new(wants: Vec<Want>) -> Plan {
        Plan {
            wants,
            next: 0,
            running: Vec::new(),
            got: Vec::new(),
        }
    }

    /// The team `on` names, `Err(())` if the split that makes it has not completed, `Ok(None)`
    /// if it gave this rank no team.
    fn team(&self, ep: &Endpoint<Local>, on: On) -> Result<Option<Team>, ()> {
        match on {
            On::World => Ok(Some(ep.world_team())),
            On::Made(i) => match self.got.get(i) {
                Some(Some(Ok(Got::Team(t)))) => Ok(t.clone()),
                Some(Some(_)) => Ok(None),
                _ => Err(()),
            },
        }
    }

    /// Starts and polls until nothing more changes (an operation on a made team may start
    /// once its split is polled to completion): ready once every operation has completed.
    fn step(&mut self, ep: &mut Endpoint<Local>, wire: &mut Wire<'_>) -> Poll<()> {
        loop {
            let before = (self.next, self.got.iter().filter(|g| g.is_some()).count());
            if self.step_once(ep, wire).is_ready() {
                // Done, it still polls, as any driver does whatever it waits for next: what
                // it owes the others (a notice that waited for a credit) still leaves.
                let _ = ep.background_step(wire);
                return Poll::Ready(());
            }
            if before == (self.next, self.got.iter().filter(|g| g.is_some()).count()) {
                return Poll::Pending;
            }
        }
    }

    fn step_once(&mut self, ep: &mut Endpoint<Local>, wire: &mut Wire<'_>) -> Poll<()> {
        while self.next < self.wants.len() {
            let want = self.wants[self.next].clone();
            let on = match want {
                Want::Split(on, ..)
                | Want::Barrier(on)
                | Want::Gather(on, _)
                | Want::Broadcast(on, ..)
                | Want::GatherTo(on, ..)
                | Want::Reduce(on, ..)
                | Want::SumF(on, _) => on,
            };
            let Ok(team) = self.team(ep, on) else {
                break;
            };
            let Some(team) = team else {
                self.running.push(None);
                self.got.push(Some(Ok(Got::Skipped)));
                self.next += 1;
                continue;
            };
            let started = match want {
                Want::Split(_, color, key) => {
                    start(Split::new(&team, color, key), ep, wire).map(|r| r.map(Running::Split))
                }
                Want::Barrier(_) => {
                    start(TeamBarrier::new(&team), ep, wire).map(|r| r.map(Running::Barrier))
                }
                Want::Gather(_, block) => start(TeamAllGather::new(&team, &block), ep, wire)
                    .map(|r| r.map(Running::Gather)),
                Want::Broadcast(_, root, len) => {
                    let root = root % team.size();
                    let data = match team.rank() == root {
                        true => block(ep.rank(), self.next, len),
                        false => Vec::new(),
                    };
                    start(TeamBroadcast::new(&team, root, &data), ep, wire)
                        .map(|r| r.map(Running::Gather))
                }
                Want::GatherTo(_, root, b) => {
                    start(TeamGather::new(&team, root % team.size(), &b), ep, wire)
                        .map(|r| r.map(Running::Gather))
                }
                Want::Reduce(_, root, op, v) => {
                    let root = root.map(|r| r % team.size());
                    start(TeamReduce::new(&team, root, op, &v), ep, wire)
                        .map(|r| r.map(Running::Ints))
                }
                Want::SumF(_, v) => {
                    start(TeamReduce::new(&team, None, ReduceOp::Sum, &v), ep, wire)
                        .map(|r| r.map(Running::Floats))
                }
            };
            match started {
                Poll::Pending => break,
                Poll::Ready(Ok(op)) => {
                    self.running.push(Some(op));
                    self.got.push(None);
                }
                Poll::Ready(Err(e)) => {
                    self.running.push(None);
                    self.got.push(Some(Err(e)));
                }
            }
            self.next += 1;
        }
        for (i, slot) in self.running.iter_mut().enumerate() {
            let polled = match slot {
                None => continue,
                Some(Running::Split(op)) => ep.poll_op(wire, op, None).map(|r| r.map(Got::Team)),
                Some(Running::Barrier(op)) => {
                    ep.poll_op(wire, op, None).map(|r| r.map(|()| Got::Unit))
                }
                Some(Running::Gather(op)) => ep.poll_op(wire, op, None).map(|r| r.map(Got::Bytes)),
                Some(Running::Ints(op)) => ep.poll_op(wire, op, None).map(|r| r.map(Got::Ints)),
                Some(Running::Floats(op)) => ep.poll_op(wire, op, None).map(|r| r.map(Got::Floats)),
            };
            if let Poll::Ready(r) = polled {
                *slot = None;
                self.got[i] = Some(r);
            }
        }
        if self.next == self.wants.len() && self.got.iter().all(Option::is_some) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    fn complete(&self) -> bool {
        self.next == self.wants.len() && self.got.iter().all(Option::is_some)
    }

    fn results(&mut self) -> Vec<Result<Got, AmError>> {
        self.got.drain(..).map(|g| g.expect("complete")).collect()
    }
}

/// An operation's start and send steps, as every driver takes them.
fn start<S: Start>(
    mut s: S,
    ep: &mut Endpoint<Local>,
    wire: &mut Wire<'_>,
) -> Poll<Result<Op<S::Output>, AmError>> {
    let mut op = match s.start(ep, wire) {
        Poll::Ready(Ok(op)) => op,
        other => return other,
    };
    match s.send(ep, wire, &mut op) {
        Poll::Ready(Ok(())) => Poll::Ready(Ok(op)),
        Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        Poll::Pending => unreachable!("collectives send from their start"),
    }
}

/// Runs one plan per rank to completion on `c`: each rank's outcomes, in plan order.
fn run(c: &mut Cluster, plans: Vec<Vec<Want>>) -> Vec<Vec<Result<Got, AmError>>> {
    let mut plans: Vec<Plan> = plans.into_iter().map(Plan::new).collect();
    // A rank whose plan is done goes on polling until every plan is.
    c.drive_all(|r, ep, wire| {
        let _ = plans[r as usize].step(ep, wire);
        match plans.iter().all(Plan::complete) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    });
    plans.iter_mut().map(Plan::results).collect()
}

/// The sequential model of a split: the members (world ranks, in team order) of the team
/// `me` gets when the members of `parent` (world ranks, in team order) give `colors` and
/// `keys` (by parent team rank), `None` if `me` gives no color.
fn model_split(
    parent: &[Rank],
    colors: &[Option<u32>],
    keys: &[u32],
    me: Rank,
) -> Option<Vec<Rank>> {
    let mine = parent.iter().position(|&w| w == me)?;
    let color = colors[mine]?;
    let mut members: Vec<(u32, Rank)> = parent
        .iter()
        .enumerate()
        .filter(|&(i, _)| colors[i] == Some(color))
        .map(|(i, &w)| (keys[i], w))
        .collect();
    members.sort();
    Some(members.into_iter().map(|(_, w)| w).collect())
}

/// A rank's block for the operation at index `op` of a plan: `len` bytes, distinct per rank
/// and operation.
fn block(world: Rank, op: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (world as u8).wrapping_mul(31) ^ (op as u8).wrapping_mul(7) ^ i as u8)
        .collect()
}

fn gathered(members: &[Rank], op: usize, len: usize) -> Vec<u8> {
    members.iter().flat_map(|&w| block(w, op, len)).collect()
}

/// A harness shape whose Medium carries 64 bytes, and few credits, so that steps wait for
/// credits and the device.
fn shape(ranks: u32) -> Shape {
    let mut s = Shape::new(ranks);
    s.limits.max_medium = 64;
    s.credits = 2;
    s
}

/// Checks that every team id names one member set, and that distinct teams have distinct
/// ids (none the world's).
fn check_ids(seen: &mut HashMap<TeamId, Vec<Rank>>, team: &Team) {
    assert_ne!(team.id(), TeamId::WORLD);
    let members = seen
        .entry(team.id())
        .or_insert_with(|| team.members().to_vec());
    assert_eq!(members, team.members(), "one id, two member sets");
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 96 },
        ..ProptestConfig::default()
    })]

    /// Random splits of 1 to 8 ranks, then a nested split of each team, with barriers and
    /// all-gathers on the world, on each made team and on the nested ones, all started as
    /// soon as their team exists (several in flight on overlapping teams, and steps arriving
    /// for a team whose split has not completed at the receiver yet), checked against the
    /// sequential model: the members and their order (key, then world rank), the team
    /// ranks, one id per team and distinct ids for distinct teams, and every all-gather's
    /// blocks. Catches a split that orders ties by anything but the world rank, two teams
    /// given one id (their traffic would mix), a step taken by the wrong collective when
    /// several are in flight, an early step for a team not made yet dropped or refused
    /// (the receiver would hang), and a block placed at the wrong member's place.
    #[test]
    fn random_splits_and_collectives_match_the_model(
        n in 1u32..=8,
        seed in any::<u64>(),
        colors in proptest::collection::vec(proptest::option::weighted(0.85, 0u32..3), 8),
        keys in proptest::collection::vec(0u32..3, 8),
        colors2 in proptest::collection::vec(proptest::option::weighted(0.85, 0u32..2), 8),
        keys2 in proptest::collection::vec(0u32..3, 8),
        len in 1usize..=8,
    ) {
        let mut c = Cluster::started(shape(n), seed, |_| am_core::Handlers::local());
        let plans: Vec<Vec<Want>> = (0..n)
            .map(|r| {
                let i = r as usize;
                vec![
                    Want::Split(On::World, colors[i], keys[i]),
                    Want::Gather(On::Made(0), block(r, 1, len)),
                    Want::Barrier(On::Made(0)),
                    Want::Gather(On::World, block(r, 3, len)),
                    // Nested: colors2 and keys2 by world rank.
                    Want::Split(On::Made(0), colors2[i], keys2[i]),
                    Want::Barrier(On::World),
                    Want::Gather(On::Made(4), block(r, 6, len)),
                    Want::Barrier(On::Made(4)),
                    Want::Gather(On::Made(0), block(r, 8, len)),
                ]
            })
            .collect();
        let results = run(&mut c, plans);
        let world: Vec<Rank> = (0..n).collect();
        let mut ids = HashMap::new();
        for (r, got) in results.iter().enumerate() {
            let r = r as Rank;
            let ok = |i: usize| got[i].as_ref().unwrap_or_else(|e| panic!("rank {r} op {i}: {e}"));
            let team = |i: usize| match ok(i) {
                Got::Team(t) => t.clone(),
                other => panic!("op {i} gave {other:?}"),
            };
            // The split of the world.
            let first = team(0);
            let want = model_split(&world, &colors[..n as usize], &keys[..n as usize], r);
            prop_assert_eq!(first.as_ref().map(|t| t.members().to_vec()), want.clone());
            // World-wide collectives, in flight with the others.
            prop_assert!(matches!(ok(3), Got::Bytes(b) if *b == gathered(&world, 3, len)));
            prop_assert!(matches!(ok(5), Got::Unit));
            let Some(first) = first else {
                for i in [1, 2, 4, 6, 7, 8] {
                    prop_assert!(matches!(ok(i), Got::Skipped));
                }
                continue;
            };
            check_ids(&mut ids, &first);
            prop_assert_eq!(first.world_rank(first.rank()), Some(r));
            prop_assert_eq!(first.team_rank(r), Some(first.rank()));
            let members = first.members().to_vec();
            prop_assert!(matches!(ok(1), Got::Bytes(b) if *b == gathered(&members, 1, len)));
            prop_assert!(matches!(ok(2), Got::Unit));
            prop_assert!(matches!(ok(8), Got::Bytes(b) if *b == gathered(&members, 8, len)));
            // The nested split: colors2 and keys2 of the parent's members, in parent order.
            let c2: Vec<Option<u32>> = members.iter().map(|&w| colors2[w as usize]).collect();
            let k2: Vec<u32> = members.iter().map(|&w| keys2[w as usize]).collect();
            let nested = team(4);
            prop_assert_eq!(
                nested.as_ref().map(|t| t.members().to_vec()),
                model_split(&members, &c2, &k2, r)
            );
            match nested {
                Some(nested) => {
                    check_ids(&mut ids, &nested);
                    let m = nested.members().to_vec();
                    prop_assert!(matches!(ok(6), Got::Bytes(b) if *b == gathered(&m, 6, len)));
                    prop_assert!(matches!(ok(7), Got::Unit));
                }
                None => {
                    prop_assert!(matches!(ok(6), Got::Skipped));
                    prop_assert!(matches!(ok(7), Got::Skipped));
                }
            }
        }
        // Every rank's teams dropped: each endpoint is back to the world team alone, with no
        // step kept anywhere.
        drop(results);
        c.drive_all(|_, ep, wire| ep.background_step(wire));
        for node in &c.nodes {
            prop_assert_eq!(node.ep.teams_held(), (1, 0));
            prop_assert_eq!(node.ep.collectives_in_flight(), 0);
        }
    }
}

/// A rank's vector for the reduction at index `op` of a plan.
fn ints(world: Rank, op: usize, len: usize) -> Vec<i64> {
    (0..len)
        .map(|i| (world as i64 * 1_000_003 + op as i64 * 7919) ^ ((i as i64 * 104_729) - 500_000))
        .collect()
}

fn floats(world: Rank, len: usize) -> Vec<f64> {
    (0..len)
        .map(|i| 0.1 * f64::from(world) + 1e-3 * i as f64 + 1.0 / 3.0)
        .collect()
}

/// The sequential model of a reduction: `op` over the members' vectors, in team order.
fn model_reduce(members: &[Rank], op: ReduceOp, at: usize, len: usize) -> Vec<i64> {
    let f = |a: i64, b: i64| match op {
        ReduceOp::Sum => a.wrapping_add(b),
        ReduceOp::Product => a.wrapping_mul(b),
        ReduceOp::Min => a.min(b),
        ReduceOp::Max => a.max(b),
        ReduceOp::And => a & b,
        ReduceOp::Or => a | b,
        ReduceOp::Xor => a ^ b,
        _ => unreachable!(),
    };
    let mut acc = ints(members[0], at, len);
    for &m in &members[1..] {
        for (a, b) in acc.iter_mut().zip(ints(m, at, len)) {
            *a = f(*a, b);
        }
    }
    acc
}

fn any_op() -> impl Strategy<Value = ReduceOp> {
    prop_oneof![
        Just(ReduceOp::Sum),
        Just(ReduceOp::Product),
        Just(ReduceOp::Min),
        Just(ReduceOp::Max),
        Just(ReduceOp::And),
        Just(ReduceOp::Or),
        Just(ReduceOp::Xor),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 128 },
        ..ProptestConfig::default()
    })]

    /// Broadcasts, gathers, reductions to one and to all, with random roots and operations
    /// on the world of 1 to 8 ranks and on a random split of it, all in flight at once,
    /// checked against the sequential model; float all-reduces give every member the same
    /// bits. Catches a tree that misses a member or sends a subtree twice (sizes that are
    /// not powers of two, roots other than 0), a pairing of the all-reduce's fold that
    /// leaves a member out, a block placed at another member's place, a root's result given
    /// to another member, and a non-root given a result.
    #[test]
    fn rooted_collectives_and_reductions_match_the_model(
        n in 1u32..=8,
        seed in any::<u64>(),
        colors in proptest::collection::vec(0u32..2, 8),
        roots in proptest::collection::vec(0u32..8, 6),
        ops in proptest::collection::vec(any_op(), 3),
        len in 1usize..=20,
    ) {
        let mut c = Cluster::started(shape(n), seed, |_| am_core::Handlers::local());
        // Vectors of up to 20 i64 (160 bytes) and bytes up to 5 * 20: one step of a 64-byte
        // Medium, or chunks of up to 3 and 2 steps.
        let blen = 5 * len;
        let plans: Vec<Vec<Want>> = (0..n)
            .map(|r| {
                vec![
                    Want::Split(On::World, Some(colors[r as usize]), 0),
                    Want::Broadcast(On::World, roots[0], blen),
                    Want::Reduce(On::Made(0), None, ops[0], ints(r, 2, len)),
                    Want::GatherTo(On::World, roots[1], block(r, 3, blen)),
                    Want::Reduce(On::World, Some(roots[2]), ops[1], ints(r, 4, len)),
                    Want::Broadcast(On::Made(0), roots[3], blen),
                    Want::Reduce(On::World, None, ops[2], ints(r, 6, len)),
                    Want::SumF(On::World, floats(r, len)),
                    Want::Reduce(On::Made(0), Some(roots[4]), ops[0], ints(r, 8, len)),
                    Want::GatherTo(On::Made(0), roots[5], block(r, 9, blen)),
                ]
            })
            .collect();
        let results = run(&mut c, plans);
        let world: Vec<Rank> = (0..n).collect();
        let mut sums: Vec<Vec<u64>> = Vec::new();
        for (r, got) in results.iter().enumerate() {
            let r = r as Rank;
            let ok = |i: usize| got[i].as_ref().unwrap_or_else(|e| panic!("rank {r} op {i}: {e}"));
            let team = match ok(0) {
                Got::Team(Some(t)) => t.clone(),
                other => panic!("split gave {other:?}"),
            };
            let members = team.members().to_vec();
            let bytes = |i: usize| match ok(i) {
                Got::Bytes(b) => b.clone(),
                other => panic!("op {i} gave {other:?}"),
            };
            let int = |i: usize| match ok(i) {
                Got::Ints(v) => v.clone(),
                other => panic!("op {i} gave {other:?}"),
            };
            // Broadcasts: the root's bytes everywhere.
            prop_assert_eq!(bytes(1), block(world[(roots[0] % n) as usize], 1, blen));
            let troot = |k: usize| roots[k] % members.len() as u32;
            prop_assert_eq!(bytes(5), block(members[troot(3) as usize], 5, blen));
            // Reductions to all.
            prop_assert_eq!(int(2), model_reduce(&members, ops[0], 2, len));
            prop_assert_eq!(int(6), model_reduce(&world, ops[2], 6, len));
            // Gathers and reductions to one: the root has it, the others nothing.
            let at_root = |root: u32, want: Vec<u8>| if root == r { want } else { Vec::new() };
            prop_assert_eq!(bytes(3), at_root(roots[1] % n, gathered(&world, 3, blen)));
            let want = model_reduce(&world, ops[1], 4, len);
            prop_assert_eq!(int(4), if roots[2] % n == r { want } else { Vec::new() });
            let want = model_reduce(&members, ops[0], 8, len);
            let root8 = members[troot(4) as usize];
            prop_assert_eq!(int(8), if root8 == r { want } else { Vec::new() });
            let root9 = members[troot(5) as usize];
            prop_assert_eq!(bytes(9), at_root(root9, gathered(&members, 9, blen)));
            // The float sum: close to the model, and the same bits on every member.
            let Got::Floats(f) = ok(7) else { panic!("op 7") };
            for (i, x) in f.iter().enumerate() {
                let want: f64 = world.iter().map(|&w| floats(w, len)[i]).sum();
                prop_assert!((x - want).abs() < 1e-9, "{} vs {}", x, want);
            }
            sums.push(f.iter().map(|x| x.to_bits()).collect());
        }
        prop_assert!(sums.windows(2).all(|w| w[0] == w[1]), "members' float sums differ");
        drop(results);
        c.drive_all(|_, ep, wire| ep.background_step(wire));
        for node in &c.nodes {
            prop_assert_eq!(node.ep.teams_held(), (1, 0));
            prop_assert_eq!(node.ep.collectives_in_flight(), 0);
        }
    }
}

/// Many collectives in flight on one team and on overlapping ones at once, more than the
/// window of `MAX_COLLECTIVES_IN_FLIGHT` per team (the later starts wait for earlier ones to
/// complete), over 40 interleavings of 5 ranks. Catches a window that deadlocks (a start
/// that waits without advancing the collectives ahead of it), steps of one sequence taken by
/// another, and early steps kept past their collective.
#[test]
fn more_collectives_than_the_window_complete_in_issue_order() {
    let window = am_core::endpoint::MAX_COLLECTIVES_IN_FLIGHT;
    for seed in 0..40 {
        let mut c = Cluster::started(shape(5), seed, |_| am_core::Handlers::local());
        let plans = (0..5)
            .map(|r| {
                let mut plan = vec![Want::Split(On::World, Some(r % 2), 0)];
                for i in 1..window + 10 {
                    plan.push(match i % 3 {
                        0 => Want::Barrier(On::World),
                        1 => Want::Gather(On::World, block(r, i, 2)),
                        _ => Want::Gather(On::Made(0), block(r, i, 3)),
                    });
                }
                plan
            })
            .collect();
        let results = run(&mut c, plans);
        for (r, got) in results.iter().enumerate() {
            let Ok(Got::Team(Some(half))) = &got[0] else {
                panic!("rank {r}: {:?}", got[0]);
            };
            let half = half.members().to_vec();
            let world: Vec<Rank> = (0..5).collect();
            for (i, g) in got.iter().enumerate().skip(1) {
                match (i % 3, g) {
                    (0, Ok(Got::Unit)) => {}
                    (1, Ok(Got::Bytes(b))) => assert_eq!(*b, gathered(&world, i, 2)),
                    (2, Ok(Got::Bytes(b))) => assert_eq!(*b, gathered(&half, i, 3)),
                    other => panic!("seed {seed} rank {r} op {i}: {other:?}"),
                }
            }
        }
    }
}

/// A survivor's all-gather and barrier, and their outcomes.
type Pair = (Op<Vec<u8>>, Op<()>);
type Outcomes = (
    Option<Result<Vec<u8>, AmError>>,
    Option<Result<(), AmError>>,
);

/// A member lost in the middle of collectives on two teams that hold it (the world, and a
/// team of 4 of the 6 ranks): every survivor's collectives on those teams fail with
/// `PeerLost` naming it, never hang, and so does a later collective on them, while a team
/// without it still works. Catches a loss that fails only the collective waiting directly
/// on the lost member (the others would wait for forwards that never come), and a loss that
/// fails the teams that do not hold it.
#[test]
fn a_member_lost_mid_collective_fails_its_teams_on_every_survivor() {
    for seed in 0..40 {
        let mut c = Cluster::started(shape(6), seed, |_| am_core::Handlers::local());
        // Ranks 0..4 one team, 4 and 5 another.
        let teams = split_world(&mut c, 6, |r| (Some(u32::from(r >= 4)), 0));
        // Everyone starts an all-gather on the world and a barrier on its team; a few steps
        // are delivered; then rank 1 dies.
        let mut ops: Vec<Pair> = Vec::new();
        for r in 0..6u32 {
            let (ep, mut wire) = c.wire(r);
            let world = ep.world_team();
            let Poll::Ready(Ok(g)) =
                start(TeamAllGather::new(&world, &[r as u8; 4]), ep, &mut wire)
            else {
                panic!("start");
            };
            let Poll::Ready(Ok(b)) = start(TeamBarrier::new(&teams[r as usize]), ep, &mut wire)
            else {
                panic!("start");
            };
            ops.push((g, b));
        }
        for _ in 0..(seed % 7) {
            c.deliver_one();
        }
        c.lose(1);
        let mut ops: Vec<Option<Pair>> = ops.into_iter().map(Some).collect();
        ops[1] = None;
        let survivors: Vec<Rank> = vec![0, 2, 3, 4, 5];
        let mut outcomes: HashMap<Rank, Outcomes> = HashMap::new();
        c.drive(&survivors, |r, ep, wire| {
            let (g, b) = ops[r as usize].as_mut().expect("a survivor's");
            let out = outcomes.entry(r).or_default();
            if out.0.is_none() {
                if let Poll::Ready(x) = ep.poll_op(wire, g, None) {
                    out.0 = Some(x);
                }
            }
            if out.1.is_none() {
                if let Poll::Ready(x) = ep.poll_op(wire, b, None) {
                    out.1 = Some(x);
                }
            }
            if out.0.is_some() && out.1.is_some() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        for &r in &survivors {
            let (g, b) = outcomes.remove(&r).unwrap();
            assert_eq!(
                g.unwrap(),
                Err(AmError::PeerLost(1)),
                "seed {seed} rank {r}"
            );
            match r {
                0 | 2 | 3 => assert_eq!(b.unwrap(), Err(AmError::PeerLost(1))),
                _ => assert_eq!(b.unwrap(), Ok(()), "a team without the lost rank"),
            }
        }
        // Later collectives: refused at once on the teams that held rank 1, fine on the other.
        let results = c.drive(&survivors, |r, ep, wire| {
            let world = ep.world_team();
            let w = start(TeamBarrier::new(&world), ep, wire);
            let t = start(TeamBarrier::new(&teams[r as usize]), ep, wire);
            match (w, t) {
                (Poll::Ready(w), Poll::Ready(t)) => Poll::Ready((w.err(), t.map(|_| ()))),
                _ => Poll::Pending,
            }
        });
        for (r, res) in survivors.iter().zip(results) {
            let (w, t) = res.unwrap();
            assert_eq!(w, Some(AmError::PeerLost(1)));
            match r {
                0 | 2 | 3 => assert_eq!(t, Err(AmError::PeerLost(1))),
                _ => assert_eq!(t, Ok(())),
            }
        }
        assert_eq!(c.nodes[0].ep.collectives_in_flight(), 0);
    }
}

/// The error of a step from `peer` that no collective here takes.
fn stray(peer: Rank, team: TeamId, seq: u64, step: u32) -> AmError {
    AmError::PeerMisbehaved {
        peer,
        what: Misbehavior::StrayCollective { team, seq, step },
    }
}

/// The bytes of a collective step as a misbehaving peer sends it.
fn forged(team: TeamId, seq: u64, step: u32, kind: CollectiveKind, payload: &[u8]) -> Vec<u8> {
    let w = SystemMsg::Collective {
        team,
        seq,
        step,
        kind,
        root: 0,
        desc: 0,
    }
    .encode();
    let h = Header {
        category: Category::Request,
        kind: AmKind::Medium,
        system: true,
        handler: w.opcode,
        nargs: w.args().len() as u8,
        credit: 0,
        payload_len: payload.len() as u32,
        long_offset: 0,
    };
    let mut head = [0u8; MAX_HEAD_LEN];
    let n = h.encode(w.args(), &mut head);
    let mut bytes = head[..n].to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

/// Steps nobody expects: for a team that does not exist (no split in flight), a sequence far ahead
/// of the window, a step the sender's place does not send, a step sent twice, a barrier step with a
/// payload, a notice that the receiver itself is gone. Each is refused with a typed error naming
/// the sender, nothing is kept, and a barrier afterwards still completes. Catches a panic on a
/// peer's bytes, and memory a peer could grow without bound with steps for teams or sequences that
/// never come.
#[test]
fn stray_collective_steps_are_refused_naming_the_peer() {
    let mut c = Cluster::started(shape(3), 0, |_| am_core::Handlers::local());
    let bogus = TeamId {
        leader: 2,
        serial: 9,
    };
    let far = am_core::endpoint::EARLY_WINDOW;
    // Rank 0's ring sender is rank 2, its barrier senders 2 (round 0) and 1 (round 1).
    let cases: Vec<(Vec<u8>, AmError)> = vec![
        (
            forged(bogus, 0, 0, CollectiveKind::Barrier, &[]),
            stray(2, bogus, 0, 0),
        ),
        (
            forged(TeamId::WORLD, far, 0, CollectiveKind::Barrier, &[]),
            stray(2, TeamId::WORLD, far, 0),
        ),
        (
            forged(TeamId::WORLD, 0, 1, CollectiveKind::Barrier, &[]),
            stray(2, TeamId::WORLD, 0, 1),
        ),
        (
            forged(TeamId::WORLD, 0, 2, CollectiveKind::AllGather, &[1]),
            stray(2, TeamId::WORLD, 0, 2),
        ),
        // The largest step: no overflow in the ring's bound, nothing kept.
        (
            forged(TeamId::WORLD, 0, u32::MAX, CollectiveKind::AllGather, &[1]),
            stray(2, TeamId::WORLD, 0, u32::MAX),
        ),
        (
            forged(TeamId::WORLD, 0, u32::MAX, CollectiveKind::Broadcast, &[1]),
            stray(2, TeamId::WORLD, 0, u32::MAX),
        ),
        (
            forged(TeamId::WORLD, 0, 0, CollectiveKind::Barrier, &[1]),
            AmError::PeerMisbehaved {
                peer: 2,
                what: Misbehavior::BadSystemMessage(am_core::protocol::opcode::COLLECTIVE),
            },
        ),
    ];
    // A notice that names the receiver itself as gone.
    let cases = cases.into_iter().chain([(
        forged(TeamId::WORLD, 0, 0, CollectiveKind::MemberLost, &[]),
        stray(2, TeamId::WORLD, 0, 0),
    )]);
    for (bytes, want) in cases {
        c.inject(2, 0, bytes);
        assert!(c.deliver_to(0));
        assert_eq!(c.errors(0), [want]);
        assert_eq!(c.nodes[0].ep.teams_held(), (1, 0));
    }
    // A notice for a team this rank does not have (freed, say) is dropped, kept nowhere.
    c.inject(
        2,
        0,
        forged(bogus, 0, 1, CollectiveKind::MemberDeparted, &[]),
    );
    assert!(c.deliver_to(0));
    assert_eq!(c.errors(0), []);
    assert_eq!(c.nodes[0].ep.teams_held(), (1, 0));
    // A step sent twice: the first is kept for the collective it belongs to.
    c.inject(
        2,
        0,
        forged(TeamId::WORLD, 5, 0, CollectiveKind::Barrier, &[]),
    );
    c.inject(
        2,
        0,
        forged(TeamId::WORLD, 5, 0, CollectiveKind::Barrier, &[]),
    );
    assert!(c.deliver_to(0) && c.deliver_to(0));
    assert_eq!(c.errors(0), [stray(2, TeamId::WORLD, 5, 0)]);
    // Rank 2 sent none of these: the answers are not its to take.
    c.take(0, 2);
    // The world's collectives go on: sequence 0 is a barrier everywhere.
    let results = run(
        &mut c,
        (0..3).map(|_| vec![Want::Barrier(On::World)]).collect(),
    );
    for got in results {
        assert!(matches!(got[..], [Ok(Got::Unit)]));
    }
}

/// A step its collective took where it arrived, sent again: from its sender, a repeat,
/// refused as stray naming it; from a member that started another collective under that
/// sequence (an all-gather, whose first step rank 0 also takes from rank 2), a
/// disagreement that fails the collective with a mismatch naming it. Catches a step taken
/// on arrival that the collective forgets it took (a repeat taken twice, and the barrier
/// done a round early), and a disagreement turned into a peer's misbehavior.
#[test]
fn a_step_taken_where_it_arrives_is_not_taken_twice() {
    let mut c = Cluster::started(shape(3), 0, |_| am_core::Handlers::local());
    let (ep, mut wire) = c.wire(0);
    let world = ep.world_team();
    // Rank 0's barrier sends its round 0 to rank 1, then waits for rank 2's.
    let Poll::Ready(Ok(mut op)) = start(TeamBarrier::new(&world), ep, &mut wire) else {
        panic!("start")
    };
    let step = || forged(TeamId::WORLD, 0, 0, CollectiveKind::Barrier, &[]);
    c.inject(2, 0, step());
    assert!(c.deliver_to(0));
    assert_eq!(c.errors(0), []);
    c.inject(2, 0, step());
    assert!(c.deliver_to(0));
    assert_eq!(c.errors(0), [stray(2, TeamId::WORLD, 0, 0)]);
    c.inject(
        2,
        0,
        forged(TeamId::WORLD, 0, 0, CollectiveKind::AllGather, &[7]),
    );
    assert!(c.deliver_to(0));
    assert_eq!(c.errors(0), []);
    let (ep, mut wire) = c.wire(0);
    assert_eq!(
        ep.poll_op(&mut wire, &mut op, None),
        Poll::Ready(Err(AmError::CollectiveMismatch {
            team: TeamId::WORLD,
            peer: 2,
            agrees: 0,
            what: Box::new(am_core::Disagreement::Kind {
                peer: "all-gather",
                agrees: "barrier"
            })
        }))
    );
}

/// A gather's root whose plan takes member 1's block, then member 2's: member 2's block
/// comes first and is kept; member 1's is taken where it arrives, which moves the plan on
/// to member 2's; member 2's block sent again is a repeat, refused as stray naming it, and
/// the gather completes with the block that came first. Catches a take on arrival that
/// does not see the step already kept (the repeat taken over the original, the original
/// kept for good).
#[test]
fn a_repeat_of_a_kept_step_is_not_taken_on_arrival() {
    let mut c = Cluster::started(shape(4), 0, |_| am_core::Handlers::local());
    let (ep, mut wire) = c.wire(0);
    let world = ep.world_team();
    let Poll::Ready(Ok(mut op)) = start(TeamGather::new(&world, 0, &[7, 7]), ep, &mut wire) else {
        panic!("start")
    };
    let block = |from: u8, b: u8| {
        forged(
            TeamId::WORLD,
            0,
            u32::from(from),
            CollectiveKind::Gather,
            &[b, b],
        )
    };
    for (from, bytes) in [(2, block(2, 2)), (1, block(1, 1)), (2, block(2, 9))] {
        c.inject(from, 0, bytes);
        assert!(c.deliver_to(0));
    }
    assert_eq!(c.errors(0), [stray(2, TeamId::WORLD, 0, 2)]);
    c.inject(3, 0, block(3, 3));
    assert!(c.deliver_to(0));
    let (ep, mut wire) = c.wire(0);
    assert_eq!(
        ep.poll_op(&mut wire, &mut op, None),
        Poll::Ready(Ok(vec![7, 7, 1, 1, 2, 2, 3, 3]))
    );
}

/// Members that start different collectives under one sequence (a barrier here, an
/// all-gather there), or all-gathers of different lengths, get
/// `AmError::CollectiveMismatch` rather than a wrong answer or a hang. Catches steps matched
/// by sequence alone, whatever collective sent them.
#[test]
fn members_that_disagree_get_a_mismatch_not_a_wrong_answer() {
    for seed in 0..20 {
        let mut c = Cluster::started(shape(2), seed, |_| am_core::Handlers::local());
        let plans = vec![
            vec![Want::Barrier(On::World)],
            vec![Want::Gather(On::World, vec![1, 2])],
        ];
        let results = run(&mut c, plans);
        for (r, got) in results.iter().enumerate() {
            assert!(
                matches!(
                    got[0],
                    Err(AmError::CollectiveMismatch {
                        team: TeamId::WORLD,
                        ..
                    })
                ),
                "seed {seed} rank {r}: {:?}",
                got[0]
            );
        }
        let mut c = Cluster::started(shape(2), seed, |_| am_core::Handlers::local());
        let plans = vec![
            vec![Want::Gather(On::World, vec![1, 2])],
            vec![Want::Gather(On::World, vec![1, 2, 3])],
        ];
        for got in run(&mut c, plans) {
            assert!(
                matches!(got[0], Err(AmError::CollectiveMismatch { .. })),
                "{:?}",
                got[0]
            );
        }
    }
}

/// Members that disagree on a rooted collective's root, on a reduction's operation, element type or
/// length (of several chunks), on a chunked broadcast's root: the member that finds it fails, tells
/// the others, and every member gets `AmError::CollectiveMismatch` on every collective on the team
/// it has not completed when told, and on every later one (one whose steps had all come may
/// complete: the root of a broadcast sends and is done). Catches a mismatch seen by one member that
/// leaves the others waiting for steps that never come, and a team that goes on after one.
#[test]
fn a_disagreement_reaches_every_member_of_the_team() {
    type Case = fn(Rank) -> Want;
    let cases: [(&str, Case); 5] = [
        ("root", |r| Want::Broadcast(On::World, u32::from(r == 2), 4)),
        // Of several chunks (a 64-byte Medium): 3 against 2, a short chunk against a whole.
        ("length", |r| {
            let len = if r == 1 { 20 } else { 12 };
            Want::Reduce(On::World, None, ReduceOp::Sum, vec![1; len])
        }),
        ("big root", |r| {
            Want::Broadcast(On::World, u32::from(r == 2), 150)
        }),
        ("op", |r| {
            let op = if r == 1 { ReduceOp::Max } else { ReduceOp::Sum };
            Want::Reduce(On::World, None, op, vec![1])
        }),
        ("type", |r| match r {
            0 => Want::SumF(On::World, vec![1.0]),
            _ => Want::Reduce(On::World, None, ReduceOp::Sum, vec![1]),
        }),
    ];
    for (what, case) in cases {
        for seed in 0..20 {
            let mut c = Cluster::started(shape(3), seed, |_| am_core::Handlers::local());
            let plans = (0..3)
                .map(|r| vec![case(r), Want::Barrier(On::World)])
                .collect();
            let results = run(&mut c, plans);
            let mismatch = |g: &Result<Got, AmError>| {
                matches!(
                    g,
                    Err(AmError::CollectiveMismatch {
                        team: TeamId::WORLD,
                        ..
                    })
                )
            };
            assert!(
                results.iter().any(|got| mismatch(&got[0])),
                "{what}, seed {seed}: nobody saw it: {results:?}"
            );
            // A collective already in flight when the notice came may complete (its steps
            // had all come: the barrier did hold); the next one fails everywhere.
            for (r, got) in results.iter().enumerate() {
                assert!(
                    mismatch(&got[1]) || matches!(got[1], Ok(Got::Unit)),
                    "{what}, seed {seed}, rank {r}: {:?}",
                    got[1]
                );
            }
            let again = run(&mut c, vec![vec![Want::Barrier(On::World)]; 3]);
            for (r, got) in again.iter().enumerate() {
                assert!(
                    mismatch(&got[0]),
                    "{what}, seed {seed}, rank {r}: the next collective gave {:?}",
                    got[0]
                );
            }
        }
    }
}

/// Gathers on a team of more than 128 members, through a sequence that ends with the
/// barrier every `SYNC_PERIOD`-th gather ends with: every one completes, the root with every
/// member's block in team order. Catches a barrier step numbered as a member's block (the
/// root would take member 128's block as the barrier's first round, or refuse the round's
/// sender as stray).
#[test]
fn gathers_on_more_than_128_members_pass_their_sync() {
    let n = 130;
    let mut c = Cluster::started(shape(n), 7, |_| am_core::Handlers::local());
    let gathers = am_core::endpoint::SYNC_PERIOD as usize + 1;
    let plans = (0..n)
        .map(|r| {
            (0..gathers)
                .map(|i| Want::GatherTo(On::World, 0, block(r, i, 1)))
                .collect()
        })
        .collect();
    let world: Vec<Rank> = (0..n).collect();
    for (r, got) in run(&mut c, plans).into_iter().enumerate() {
        for (i, g) in got.into_iter().enumerate() {
            match g {
                Ok(Got::Bytes(b)) if r == 0 => assert_eq!(b, gathered(&world, i, 1), "gather {i}"),
                Ok(Got::Bytes(b)) => assert!(b.is_empty(), "rank {r} gather {i}"),
                other => panic!("rank {r} gather {i}: {other:?}"),
            }
        }
    }
}

/// A member whose collectives complete as soon as its steps are out (a broadcast's root, a
/// gather's senders) cannot run ahead of a member that has started none of them by more
/// than the window: rank 0 runs 150 broadcasts and 150 gathers alone (rank 1 only polls),
/// then rank 1 starts its own, and every step of rank 0's is taken, none refused. Catches
/// the sync that bounds the lead missing (rank 1 would refuse rank 0's honest steps past
/// the window as stray, and both would hang).
#[test]
fn a_root_that_runs_ahead_waits_at_the_sync_instead_of_being_refused() {
    for (n, seed) in [(2, 1), (3, 2), (4, 3)] {
        let mut c = Cluster::started(shape(n), seed, |_| am_core::Handlers::local());
        let want = |r: Rank| {
            let mut w: Vec<Want> = (0..150).map(|_| Want::Broadcast(On::World, 0, 3)).collect();
            w.extend((0..150).map(|i| Want::GatherTo(On::World, 0, block(r, i, 2))));
            w
        };
        let mut plans: Vec<Plan> = (0..n).map(|r| Plan::new(want(r))).collect();
        // Rank 0 alone: the others poll (their steps' credits go back) but start nothing.
        for _ in 0..20_000 {
            c.flush_all();
            {
                let (ep, mut wire) = c.wire(0);
                let _ = plans[0].step(ep, &mut wire);
            }
            for r in 1..n {
                let (ep, mut wire) = c.wire(r);
                if let Poll::Ready(Err(e)) = ep.background_step(&mut wire) {
                    panic!("{n} ranks: rank {r} refused a step of rank 0's: {e}");
                }
            }
            if !c.deliver_one() {
                break;
            }
        }
        let errors: Vec<_> = (1..n).flat_map(|r| c.errors(r)).collect();
        assert_eq!(errors, vec![], "{n} ranks: rank 0's steps refused");
        let done = plans[0].got.iter().filter(|g| g.is_some()).count();
        // Up to the sync at sequence 31, and a window's worth past it.
        let bound =
            am_core::endpoint::SYNC_PERIOD as usize + am_core::endpoint::MAX_COLLECTIVES_IN_FLIGHT;
        assert!(
            done < bound,
            "{n} ranks: rank 0 completed {done} collectives without the others: {:?}",
            &plans[0].got[..done.min(40)]
        );
        // A rank whose plan is done goes on polling until every plan is.
        c.drive_all(|r, ep, wire| {
            let _ = plans[r as usize].step(ep, wire);
            match plans.iter().all(Plan::complete) {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        });
        for (r, plan) in plans.iter_mut().enumerate() {
            for (i, got) in plan.results().into_iter().enumerate() {
                assert!(got.is_ok(), "{n} ranks: rank {r} op {i}: {got:?}");
            }
        }
    }
}

/// A job of one rank: its world team, a split of it, and every collective on them complete
/// at once, sending nothing. Catches a collective that waits for a step from itself.
#[test]
fn a_job_of_one_completes_every_collective_alone() {
    let mut c = Cluster::started(shape(1), 0, |_| am_core::Handlers::local());
    let plan = vec![
        Want::Split(On::World, Some(3), 0),
        Want::Gather(On::Made(0), vec![7; 3]),
        Want::Barrier(On::Made(0)),
        Want::Gather(On::World, vec![8; 2]),
        Want::Split(On::Made(0), None, 0),
        Want::Barrier(On::World),
    ];
    let got = run(&mut c, vec![plan]);
    assert!(matches!(&got[0][0], Ok(Got::Team(Some(t))) if t.members() == [0]));
    assert!(matches!(&got[0][1], Ok(Got::Bytes(b)) if *b == [7; 3]));
    assert!(matches!(&got[0][3], Ok(Got::Bytes(b)) if *b == [8; 2]));
    assert!(matches!(&got[0][4], Ok(Got::Team(None))));
    assert!(matches!(&got[0][5], Ok(Got::Unit)));
    assert!(c.net.sent.is_empty());
}

/// Drives `ranks`' all-gathers (`ops`, by rank) until each completes: their outcomes.
fn finish(
    c: &mut Cluster,
    ranks: &[Rank],
    ops: &mut [Option<Op<Vec<u8>>>],
) -> Vec<Result<Vec<u8>, AmError>> {
    c.drive(ranks, |r, ep, wire| {
        let op = ops[r as usize].as_mut().expect("started");
        ep.poll_op(wire, op, None)
    })
    .into_iter()
    .map(|r| r.expect("every rank"))
    .collect()
}

/// Every rank of `c` but `skip` starts an all-gather on the world.
fn gather_all_but(c: &mut Cluster, skip: Rank) -> Vec<Option<Op<Vec<u8>>>> {
    (0..c.size())
        .map(|r| {
            if r == skip {
                return None;
            }
            let (ep, mut wire) = c.wire(r);
            let world = ep.world_team();
            match start(TeamAllGather::new(&world, &[r as u8; 2]), ep, &mut wire) {
                Poll::Ready(Ok(op)) => Some(op),
                _ => panic!("start"),
            }
        })
        .collect()
}

/// A member that leaves the job without joining an all-gather its team started: the member
/// that waits for its block fails with `PeerDeparted`, and tells the others, whose ring
/// waits only for that member's forward; they fail the same way instead of hanging.
/// Catches a failure kept to the members that wait directly on the gone one.
#[test]
fn a_member_that_left_without_joining_fails_the_collective_everywhere() {
    for seed in 0..20 {
        let mut c = Cluster::started(shape(4), seed, |_| am_core::Handlers::local());
        let mut ops = gather_all_but(&mut c, 3);
        for _ in 0..(seed % 5) {
            c.deliver_one();
        }
        c.depart(3);
        for (r, got) in finish(&mut c, &[0, 1, 2], &mut ops).into_iter().enumerate() {
            assert_eq!(got, Err(AmError::PeerDeparted(3)), "seed {seed} rank {r}");
        }
        // Later collectives on the world fail at once.
        let (ep, mut wire) = c.wire(1);
        let world = ep.world_team();
        assert!(matches!(
            start(TeamBarrier::new(&world), ep, &mut wire),
            Poll::Ready(Err(AmError::PeerDeparted(3)))
        ));
    }
}

/// Ranks 1 to 3 start a broadcast from rank 0 on the world (rank 0's entry is `None`): each
/// one's handle, or the error its start gave.
fn broadcasts_from_0(c: &mut Cluster) -> Vec<Option<Result<Op<Vec<u8>>, AmError>>> {
    (0..4)
        .map(|r| {
            if r == 0 {
                return None;
            }
            let (ep, mut wire) = c.wire(r);
            let world = ep.world_team();
            match start(TeamBroadcast::new(&world, 0, b""), ep, &mut wire) {
                Poll::Ready(r) => Some(r),
                Poll::Pending => panic!("rank {r}: a start waits"),
            }
        })
        .collect()
}

/// The root of a broadcast leaves the job as soon as its broadcast returned, before the
/// others start theirs (their steps from it already arrived): every other member completes
/// the broadcast, and a later one on the world fails with `PeerDeparted` where it would
/// wait for the departed member. Catches a departure that fails collectives the departed
/// member had already done its part of (a rank 1 of the README's teams example saw "rank 0
/// has left the job").
#[test]
fn a_member_that_left_after_its_part_fails_nothing_it_took_part_in() {
    for seed in 0..20 {
        let mut c = Cluster::started(shape(4), seed, |_| am_core::Handlers::local());
        let mut root = {
            let (ep, mut wire) = c.wire(0);
            let world = ep.world_team();
            match start(TeamBroadcast::new(&world, 0, b"hello"), ep, &mut wire) {
                Poll::Ready(Ok(op)) => Some(op),
                _ => panic!("start"),
            }
        };
        let root = c
            .drive(&[0], |_, ep, wire| {
                ep.poll_op(wire, root.as_mut().expect("started"), None)
            })
            .remove(0);
        assert_eq!(root, Some(Ok(b"hello".to_vec())), "seed {seed}");
        // Rank 0's steps reach the others before its departure does.
        c.settle();
        c.depart(0);
        let mut ops: Vec<Option<Op<Vec<u8>>>> = broadcasts_from_0(&mut c)
            .into_iter()
            .map(|op| op.map(|op| op.expect("started")))
            .collect();
        for (r, got) in finish(&mut c, &[1, 2, 3], &mut ops).into_iter().enumerate() {
            assert_eq!(got, Ok(b"hello".to_vec()), "seed {seed} rank {}", r + 1);
        }
        // The next broadcast from rank 0 cannot come: its children fail and tell the rest.
        let mut ops: Vec<Option<Op<Vec<u8>>>> = broadcasts_from_0(&mut c)
            .into_iter()
            .map(|op| match op? {
                Ok(op) => Some(op),
                Err(e) => {
                    assert_eq!(e, AmError::PeerDeparted(0), "seed {seed}");
                    None
                }
            })
            .collect();
        let waiting: Vec<Rank> = (1..4).filter(|&r| ops[r as usize].is_some()).collect();
        for got in c
            .drive(&waiting, |r, ep, wire| {
                ep.poll_op(wire, ops[r as usize].as_mut().expect("started"), None)
            })
            .into_iter()
            .flatten()
        {
            assert_eq!(got, Err(AmError::PeerDeparted(0)), "seed {seed}");
        }
    }
}

/// A member lost while the others allocate symmetric memory on the world: each survivor's
/// allocation fails with `PeerLost`, and the range it had proposed is free again, so the
/// next allocation on a team of the survivors starts the heap. Catches a reservation kept
/// by a failed allocation (every later block would move up, and members that saw the
/// failure differently would disagree).
#[test]
fn a_symmetric_allocation_a_loss_fails_gives_its_range_back() {
    const HEAP: usize = 1024;
    for seed in 0..20 {
        let mut c = Cluster::started(shape(4), seed, |_| am_core::Handlers::local());
        let seg = c.with_segment(0).1.len();
        for r in 0..4 {
            c.wire(r).0.set_symmetric_size(HEAP).expect("fits");
        }
        let teams = split_world(&mut c, 4, |r| (Some(u32::from(r == 3)), 0));
        let mut ops: Vec<Option<Op<am_core::Symmetric>>> = (0..3)
            .map(|r| {
                let (ep, mut wire) = c.wire(r);
                let world = ep.world_team();
                match start(AllocSymmetric::new(&world, 100), ep, &mut wire) {
                    Poll::Ready(Ok(op)) => Some(op),
                    _ => panic!("start"),
                }
            })
            .collect();
        for _ in 0..(seed % 4) {
            c.deliver_one();
        }
        c.lose(3);
        let got = c.drive(&[0, 1, 2], |r, ep, wire| {
            ep.poll_op(wire, ops[r as usize].as_mut().expect("started"), None)
        });
        for g in got {
            assert_eq!(g, Some(Err(AmError::PeerLost(3))), "seed {seed}");
        }
        let mut ops: Vec<Option<Op<am_core::Symmetric>>> = (0..3)
            .map(|r| {
                let (ep, mut wire) = c.wire(r);
                match start(AllocSymmetric::new(&teams[r as usize], 100), ep, &mut wire) {
                    Poll::Ready(Ok(op)) => Some(op),
                    _ => panic!("start"),
                }
            })
            .collect();
        let got = c.drive(&[0, 1, 2], |r, ep, wire| {
            ep.poll_op(wire, ops[r as usize].as_mut().expect("started"), None)
        });
        for g in got {
            let block = g.expect("every rank").expect("allocated");
            assert_eq!(block.offset(), seg - HEAP, "seed {seed}: the heap's start");
        }
    }
}

/// A member that goes silent in the middle of an all-gather, as a udp peer does: only rank
/// 0's transport reports it lost (the others would notice only after the peer timeout).
/// Rank 0 fails its all-gather and tells the team, so every survivor fails with
/// `PeerLost` naming the silent member at once. Catches a loss that reaches only the
/// members whose own transport saw it.
#[test]
fn a_loss_one_member_sees_reaches_the_whole_team() {
    for seed in 0..20 {
        let mut c = Cluster::started(shape(5), seed, |_| am_core::Handlers::local());
        let mut ops = gather_all_but(&mut c, 5);
        for _ in 0..(seed % 6) {
            c.deliver_one();
        }
        // Rank 1 stops: its all-gather is never stepped again, and only rank 0 is told.
        ops[1] = None;
        c.nodes[0].ep.mark_lost(1);
        let survivors = [0, 2, 3, 4];
        let got = finish(&mut c, &survivors, &mut ops);
        for (r, got) in survivors.iter().zip(got) {
            assert_eq!(got, Err(AmError::PeerLost(1)), "seed {seed} rank {r}");
        }
    }
}

/// Members that cut different lengths into chunks where every chunk has a full Medium's
/// length: rank 0 runs two 64-byte gathers (or all-reduces of 8 words), rank 1 one of 128
/// bytes (2 chunks). Each chunk would match a whole collective of the other member's; the
/// chunks' count of chunks left in their word makes them disagree: no member gets bytes (a
/// gather's sender, done once its block is out, gets nothing anyway), and every member that
/// would gets the mismatch. Catches chunks that travel as collectives of their own (every
/// member completing `Ok`, the root with another member's bytes in the wrong gathers).
#[test]
fn chunk_counts_that_differ_are_a_mismatch_not_a_match() {
    type Case = fn(Rank) -> Vec<Want>;
    let cases: [(&str, Case); 2] = [
        ("gather", |r| match r {
            0 => vec![
                Want::GatherTo(On::World, 0, vec![0xaa; 64]),
                Want::GatherTo(On::World, 0, vec![0xbb; 64]),
            ],
            _ => vec![Want::GatherTo(
                On::World,
                0,
                (0..128).map(|i| i as u8).collect(),
            )],
        }),
        ("all-reduce", |r| match r {
            0 => vec![
                Want::Reduce(On::World, None, ReduceOp::Sum, vec![1; 8]),
                Want::Reduce(On::World, None, ReduceOp::Sum, vec![2; 8]),
            ],
            _ => vec![Want::Reduce(On::World, None, ReduceOp::Sum, vec![10; 16])],
        }),
    ];
    for (what, case) in cases {
        for seed in 0..10 {
            let mut c = Cluster::started(shape(2), seed, |_| am_core::Handlers::local());
            let results = run(&mut c, (0..2).map(case).collect());
            for (r, got) in results.iter().enumerate() {
                // A gather's sender is done once its block is out (it gets nothing); no
                // member gets bytes, and each that gets one sees the mismatch.
                let empty = |g: &Result<Got, AmError>| match g {
                    Ok(Got::Bytes(b)) => b.is_empty(),
                    Ok(Got::Ints(v)) => v.is_empty(),
                    _ => false,
                };
                assert!(
                    got.iter().all(|g| g.is_err() || empty(g)),
                    "{what}, seed {seed}, rank {r}: a collective completed with data: {got:?}"
                );
                assert!(
                    got.iter().all(empty)
                        || got
                            .iter()
                            .any(|g| matches!(g, Err(AmError::CollectiveMismatch { .. }))),
                    "{what}, seed {seed}, rank {r}: {got:?}"
                );
            }
        }
    }
}

/// A peer whose arguments to a collective in segment 0 name offsets outside the segment
/// (words a peer writes), or that disagree on the count: rank 0's collective fails with
/// the peer's misbehavior naming it, or a mismatch naming it, and nothing is read or
/// written at those offsets. Catches a peer's offset used for a put or get unchecked (an
/// out-of-bounds access or a panic on a peer's bytes).
#[test]
fn a_peers_offsets_outside_the_segment_fail_a_collective_in_segment() {
    const LEN: usize = 64;
    // Rank 1's arguments: rank 0's own (as it sent them) with word `w` replaced.
    let cases: [(usize, u64, bool); 3] = [
        (4, u64::MAX - 7, true),
        (5, 1 << 40, true),
        (3, LEN as u64 + 8, false),
    ];
    for (w, value, misbehaves) in cases {
        let mut c = Cluster::started(shape(2), 0, |_| am_core::Handlers::local());
        let world = c.nodes[0].ep.world_team();
        let mut op = {
            let (ep, mut wire) = c.wire(0);
            match ep.team_all_reduce_in_segment_start::<u64, _>(
                &mut wire,
                &world,
                ReduceOp::Sum,
                0,
                LEN,
                LEN / 8,
            ) {
                Poll::Ready(r) => r.expect("started"),
                Poll::Pending => panic!("pending"),
            }
        };
        c.flush_all();
        let sent = c.take(0, 1);
        assert_eq!(sent.len(), 1, "one step of the agreement");
        let bytes = &sent[0].bytes;
        let mut payload = bytes[bytes.len() - 48..].to_vec();
        payload[8 * w..8 * w + 8].copy_from_slice(&value.to_le_bytes());
        c.inject(
            1,
            0,
            forged(TeamId::WORLD, 0, 0, CollectiveKind::InSegment, &payload),
        );
        let got = c.drive(&[0], |_, ep, wire| ep.poll_op(wire, &mut op, None));
        let err = got[0].clone().expect("rank 0").expect_err("refused");
        if misbehaves {
            assert!(
                matches!(
                    err,
                    AmError::PeerMisbehaved {
                        peer: 1,
                        what: Misbehavior::OutOfSegment { .. }
                    }
                ),
                "word {w}: {err:?}"
            );
        } else {
            assert!(
                matches!(err, AmError::CollectiveMismatch { peer: 1, .. }),
                "word {w}: {err:?}"
            );
        }
    }
}

/// Every rank of `c`'s world (`n` of them) splits it with the color and key `of` gives it:
/// each rank's team, in rank order (every rank gives a color).
fn split_world(c: &mut Cluster, n: Rank, of: impl Fn(Rank) -> (Option<u32>, u32)) -> Vec<Team> {
    let split = (0..n)
        .map(|r| {
            let (color, key) = of(r);
            vec![Want::Split(On::World, color, key)]
        })
        .collect();
    run(c, split)
        .into_iter()
        .map(|mut g| match g.remove(0) {
            Ok(Got::Team(Some(t))) => t,
            other => panic!("{other:?}"),
        })
        .collect()
}

/// Rank `r`'s `i`th word of its source, in the tests of direct moves.
fn word(r: Rank, i: usize) -> u64 {
    (r as u64 + 1) << 32 | i as u64
}

/// `n` started ranks whose NIC reaches every segment of `segment` bytes, each with
/// [`word`]s in its first `len` bytes; and each rank's handle of the world.
fn rma_ranks(n: u32, len: usize, segment: usize) -> (Cluster, Vec<Team>) {
    let mut s = shape(n);
    s.segment = segment;
    s.rma = true;
    let mut c = Cluster::started(s, 0, |_| am_core::Handlers::local());
    let worlds: Vec<Team> = c.nodes.iter().map(|n| n.ep.world_team()).collect();
    for r in 0..n {
        let (_, seg) = c.with_segment(r);
        let src: Vec<u8> = (0..len / 8)
            .flat_map(|i| word(r, i).to_le_bytes())
            .collect();
        seg.write(0, &src).unwrap();
    }
    (c, worlds)
}

/// Every rank's `u64` sum of `len` bytes at 0 into `dest` in segment 0, on its handle in
/// `teams` (one per rank, in rank order), started.
fn all_reduces_started(c: &mut Cluster, teams: &[Team], dest: usize, len: usize) -> Vec<Op<()>> {
    (0..teams.len() as Rank)
        .map(|r| {
            let (ep, mut wire) = c.wire(r);
            let team = &teams[r as usize];
            match ep.team_all_reduce_in_segment_start::<u64, _>(
                &mut wire,
                team,
                ReduceOp::Sum,
                0,
                dest,
                len / 8,
            ) {
                Poll::Ready(op) => op.expect("started"),
                Poll::Pending => panic!("pending"),
            }
        })
        .collect()
}

/// The sum of `n` ranks' [`word`]s in `len` bytes.
fn summed(n: Rank, len: usize) -> Vec<u8> {
    (0..len / 8)
        .flat_map(|i| {
            (0..n)
                .fold(0u64, |a, r| a.wrapping_add(word(r, i)))
                .to_le_bytes()
        })
        .collect()
}

/// Drives every rank until its operation in `ops` (one per rank, in rank order) completes:
/// what each completed with.
fn completed(c: &mut Cluster, mut ops: Vec<Op<()>>) -> Vec<Result<(), AmError>> {
    c.drive_all(|r, ep, wire| ep.poll_op(wire, &mut ops[r as usize], None))
}

/// `len` bytes at `at` of rank `r`'s segment.
fn segment_bytes(c: &mut Cluster, r: Rank, at: usize, len: usize) -> Vec<u8> {
    let (_, seg) = c.with_segment(r);
    let mut out = vec![0u8; len];
    seg.read(at, &mut out).unwrap();
    out
}

/// Catches a direct move in segment 0 done whole inside one advance (one poll, under a
/// `SharedNode`'s lock, for as long as megabytes take), one that stops part-way and is
/// never taken up again, and pieces that leave a gap at their edges.
///
/// Two ranks all-reduce, then broadcast, 1 MiB and a few words (a step moves 256 KiB of a
/// member's share). Once rank 0's move has stopped after its first step, its share of
/// every member's destination is written up to 256 KiB and not past it; then both complete,
/// with every byte right.
#[test]
fn a_move_in_segment_goes_a_step_per_advance() {
    const STEP: usize = 256 << 10;
    const LEN: usize = (1 << 20) + 64;
    const DEST: usize = LEN;
    let (mut c, worlds) = rma_ranks(2, LEN, 2 * LEN);
    let dest_of = |c: &mut Cluster, r: Rank| segment_bytes(c, r, DEST, LEN);
    // Polls both ranks and delivers what they sent until rank 0's move stops part-way.
    let until_moving = |c: &mut Cluster, ops: &mut [Op<()>]| {
        for _ in 0..1_000 {
            for (r, op) in ops.iter_mut().enumerate() {
                let (ep, mut wire) = c.wire(r as Rank);
                assert!(
                    ep.poll_op(&mut wire, op, None).is_pending(),
                    "done in one advance"
                );
            }
            if c.nodes[0].ep.has_local_work() {
                return;
            }
            c.flush_all();
            while c.deliver_one() {}
        }
        panic!("rank 0's move never stopped part-way");
    };

    // The all-reduce: rank 0's share is the lower half of the elements.
    let mut ops = all_reduces_started(&mut c, &worlds, DEST, LEN);
    until_moving(&mut c, &mut ops);
    let sum = summed(2, LEN);
    let half = LEN / 8 / 2 * 8;
    for r in 0..2 {
        let d = dest_of(&mut c, r);
        assert_eq!(d[..STEP], sum[..STEP], "rank {r}: the first step's bytes");
        assert!(
            d[STEP..half].iter().all(|&b| b == 0),
            "rank {r}: past the first step"
        );
    }
    for (r, g) in completed(&mut c, ops).into_iter().enumerate() {
        g.expect("all-reduce");
        assert!(dest_of(&mut c, r as Rank) == sum, "rank {r}: the whole sum");
    }

    // The broadcast from rank 1: rank 0 copies its source a step at a time.
    let (_, seg) = c.with_segment(0);
    seg.fill(DEST, LEN, 0).unwrap();
    let mut ops: Vec<Op<()>> = (0..2)
        .map(|r| {
            let (ep, mut wire) = c.wire(r);
            match ep.team_broadcast_in_segment_start(
                &mut wire,
                &worlds[r as usize],
                1,
                0,
                DEST,
                LEN,
            ) {
                Poll::Ready(op) => op.expect("started"),
                Poll::Pending => panic!("pending"),
            }
        })
        .collect();
    until_moving(&mut c, &mut ops);
    let root: Vec<u8> = (0..LEN / 8)
        .flat_map(|i| word(1, i).to_le_bytes())
        .collect();
    let d = dest_of(&mut c, 0);
    assert_eq!(d[..STEP], root[..STEP], "the first step's bytes");
    assert!(d[STEP..].iter().all(|&b| b == 0), "past the first step");
    for g in completed(&mut c, ops) {
        g.expect("broadcast");
    }
    assert!(dest_of(&mut c, 0) == root, "the root's bytes");
}

/// Catches a direct all-reduce in place that reduces a chunk again after the NIC refused one
/// of its writes: rank 0 writes its own destination (its source) first, then the NIC
/// refuses the put into rank 1's; reduced again from its source, which now holds the sum,
/// rank 0's block comes out with rank 1's words added twice.
#[test]
fn a_chunk_written_part_way_is_not_reduced_again() {
    const LEN: usize = 64;
    let (mut c, worlds) = rma_ranks(2, LEN, shape(2).segment);
    let ops = all_reduces_started(&mut c, &worlds, 0, LEN);
    // Rank 0's one-sided operations: the get of rank 1's source, then the put into rank
    // 1's destination, which the NIC refuses.
    c.net.rma_refuse[0] = 2;
    for g in completed(&mut c, ops) {
        g.expect("all-reduce");
    }
    assert_eq!(c.net.rma_refuse[0], 0, "the put was refused");
    // Rank 0's NIC did the get, then (after the refusal) the put alone: the chunk was not
    // read again.
    let rank0: Vec<&str> = c
        .net
        .nic_ops
        .iter()
        .filter(|o| o.1 == 0)
        .map(|o| o.3)
        .collect();
    assert_eq!(rank0, ["get", "put"]);
    let sum = summed(2, LEN);
    for r in 0..2 {
        assert_eq!(segment_bytes(&mut c, r, 0, LEN), sum, "rank {r}");
    }
}

/// Catches a collective in segment 0 that reports success on a member whose destination
/// lacks another member's share: rank 0's NIC fails the get of rank 1's source (as a
/// segment it cannot use), so rank 0 neither reduces nor writes its block into either
/// destination. Rank 0 gets its NIC's error; rank 1 must get `MemberFailed` naming rank 0,
/// not `Ok` over a destination half unwritten. The team then goes on: the next all-reduce
/// completes on both with the sum.
#[test]
fn a_member_whose_move_failed_fails_the_collective_on_every_member() {
    const LEN: usize = 64;
    let (mut c, worlds) = rma_ranks(2, LEN, 8192);
    let ops = all_reduces_started(&mut c, &worlds, 4096, LEN);
    c.net.rma_fail[0] = 1;
    let got = completed(&mut c, ops);
    assert_eq!(c.net.rma_fail[0], 0, "the get failed");
    match &got[0] {
        Err(AmError::PeerMisbehaved { peer: 1, .. }) => {}
        other => panic!("rank 0: {other:?}"),
    }
    told_of(&got[1], &worlds[1], 0);
    next_all_reduce_sums(&mut c, &worlds, LEN);
}

/// `got` is the `MemberFailed` that names `team` and world rank `peer`.
#[track_caller]
fn told_of(got: &Result<(), AmError>, team: &Team, peer: Rank) {
    match got {
        Err(AmError::MemberFailed { team: t, peer: p }) => {
            assert_eq!((*t, *p), (team.id(), peer));
        }
        other => panic!("{other:?}"),
    }
}

/// The team's next all-reduce in segment 0 (every rank's handle in `teams`) completes on
/// every rank with the right sums.
#[track_caller]
fn next_all_reduce_sums(c: &mut Cluster, teams: &[Team], len: usize) {
    let ops = all_reduces_started(c, teams, 4096, len);
    for g in completed(c, ops) {
        g.expect("the next all-reduce");
    }
    let n = teams.len() as Rank;
    let sum = summed(n, len);
    for r in 0..n {
        assert_eq!(segment_bytes(c, r, 4096, len), sum, "rank {r}");
    }
}

/// Catches `MemberFailed` naming the failed member by its team rank, or the highest by world
/// rank, rather than the highest in team order by its world rank: on a team of the three
/// ranks in the reverse of the world's order (team rank 0 is world rank 2), world ranks 0 and
/// 2 fail their parts, and world rank 1 must be told of world rank 0 (team rank 2).
#[test]
fn a_failed_member_is_named_by_world_rank_and_the_highest_in_team_order() {
    const LEN: usize = 96;
    let (mut c, _) = rma_ranks(3, LEN, 8192);
    let teams = split_world(&mut c, 3, |r| (Some(0), 2 - r));
    for t in &teams {
        assert_eq!(
            t.members(),
            [2, 1, 0],
            "the team's order is the world's reversed"
        );
    }
    let ops = all_reduces_started(&mut c, &teams, 4096, LEN);
    c.net.rma_fail[0] = 1;
    c.net.rma_fail[2] = 1;
    let got = completed(&mut c, ops);
    assert_eq!(
        (c.net.rma_fail[0], c.net.rma_fail[2]),
        (0, 0),
        "both failed"
    );
    for r in [0, 2] {
        assert!(
            matches!(&got[r], Err(AmError::PeerMisbehaved { .. })),
            "rank {r}: {:?}",
            got[r]
        );
    }
    told_of(&got[1], &teams[1], 0);
    next_all_reduce_sums(&mut c, &teams, LEN);
}

/// Issue 78's mismatch: rank 0 all-reduces 2 elements, ranks 1 to 3 one. Every member fails,
/// and its error says what differs with both values: ranks 1 to 3 name rank 0 as the one
/// that differs, against rank 1 (the lowest that agrees with them), 16 bytes against 8;
/// rank 0 names a rank that differs from it, 8 bytes against 16. Under 20 orders of
/// delivery. Catches the words "rank 1 started another collective than this one", which
/// said nothing of the lengths and told rank 3 that rank 1 (which agreed with it) differed.
#[test]
fn a_length_mismatch_names_the_member_that_differs_and_both_lengths() {
    for seed in 0..20 {
        let mut c = Cluster::started(shape(4), seed, |_| am_core::Handlers::local());
        let plans = (0..4)
            .map(|r| {
                let len = if r == 0 { 2 } else { 1 };
                vec![Want::Reduce(On::World, None, ReduceOp::Sum, vec![1; len])]
            })
            .collect();
        let results = run(&mut c, plans);
        for (r, got) in results.iter().enumerate() {
            let Err(AmError::CollectiveMismatch {
                team,
                peer,
                agrees,
                what,
            }) = &got[0]
            else {
                panic!("seed {seed} rank {r}: {:?}", got[0]);
            };
            assert_eq!(*team, TeamId::WORLD);
            if r == 0 {
                assert!(*peer != 0 && *agrees == 0, "seed {seed}: {:?}", got[0]);
                assert_eq!(
                    **what,
                    am_core::Disagreement::Length {
                        peer: 8,
                        agrees: 16
                    }
                );
            } else {
                assert_eq!(
                    (*peer, *agrees),
                    (0, 1),
                    "seed {seed} rank {r}: {:?}",
                    got[0]
                );
                assert_eq!(
                    **what,
                    am_core::Disagreement::Length {
                        peer: 16,
                        agrees: 8
                    }
                );
                let words = got[0].as_ref().unwrap_err().to_string();
                assert!(
                    words.contains("rank 0 gave a length of 16 bytes where rank 1 gave 8"),
                    "{words}"
                );
            }
        }
    }
}

/// Members that disagree on the kind, root, operation or element type of a collective
/// (rank 1 of 3 alone): every member's error names what differs with both values, and the
/// members that agree (ranks 0 and 2) name rank 1, against a member that agrees with them;
/// rank 1 names one of them, against itself. Under 20 orders of delivery. Catches a
/// mismatch that does not say what differs (issue 78), and one that names a member that
/// agrees with the one reporting.
#[test]
fn a_mismatch_says_what_differs_with_both_values() {
    use am_core::Disagreement as D;
    type Case = fn(Rank) -> Want;
    let cases: [(Case, D, D); 4] = [
        (
            |r| match r {
                1 => Want::Barrier(On::World),
                _ => Want::Gather(On::World, vec![1, 2]),
            },
            D::Kind {
                peer: "barrier",
                agrees: "all-gather",
            },
            D::Kind {
                peer: "all-gather",
                agrees: "barrier",
            },
        ),
        (
            |r| Want::Broadcast(On::World, u32::from(r == 1), 4),
            D::Root { peer: 1, agrees: 0 },
            D::Root { peer: 0, agrees: 1 },
        ),
        (
            |r| {
                let op = if r == 1 { ReduceOp::Max } else { ReduceOp::Sum };
                Want::Reduce(On::World, None, op, vec![1])
            },
            D::Operation {
                peer: Some(ReduceOp::Max),
                agrees: Some(ReduceOp::Sum),
            },
            D::Operation {
                peer: Some(ReduceOp::Sum),
                agrees: Some(ReduceOp::Max),
            },
        ),
        (
            |r| match r {
                1 => Want::SumF(On::World, vec![1.0]),
                _ => Want::Reduce(On::World, None, ReduceOp::Sum, vec![1]),
            },
            D::ElementType {
                peer: "f64",
                agrees: "i64",
            },
            D::ElementType {
                peer: "i64",
                agrees: "f64",
            },
        ),
    ];
    for (case, others_see, odd_sees) in cases {
        for seed in 0..20 {
            let mut c = Cluster::started(shape(3), seed, |_| am_core::Handlers::local());
            let plans = (0..3).map(|r| vec![case(r)]).collect();
            let results = run(&mut c, plans);
            for (r, got) in results.iter().enumerate() {
                let r = r as Rank;
                let err = match &got[0] {
                    // A broadcast's root sends and is done.
                    Ok(_) if matches!(others_see, D::Root { .. }) => continue,
                    other => other,
                };
                let Err(AmError::CollectiveMismatch {
                    peer, agrees, what, ..
                }) = err
                else {
                    panic!("{others_see:?} seed {seed} rank {r}: {err:?}");
                };
                if r == 1 {
                    assert_eq!(*agrees, 1, "{others_see:?} seed {seed}: {err:?}");
                    assert!(*peer != 1, "{others_see:?} seed {seed}: {err:?}");
                    assert_eq!(**what, odd_sees, "seed {seed}");
                } else {
                    assert_eq!(*peer, 1, "{others_see:?} seed {seed} rank {r}: {err:?}");
                    assert!(
                        *agrees != 1 && *agrees <= r,
                        "seed {seed} rank {r}: {err:?}"
                    );
                    assert_eq!(**what, others_see, "seed {seed} rank {r}");
                }
            }
        }
    }
}
