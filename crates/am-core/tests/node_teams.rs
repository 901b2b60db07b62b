//! Teams and collectives through the drivers (`Node`, `SharedNode`, `AsyncNode`) on loopback,
//! 2 to 4 ranks as threads, each test under the watchdog.

use std::time::Duration;

use am_core::{AsyncNode, Config, Handlers, Loopback, Node, SharedNode, Team, TeamId};

mod watchdog;
use watchdog::within;

/// What every member of `team` gives to an all-gather: its world rank and `tag`, `len` bytes.
fn block(world: u32, tag: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (world as u8) ^ tag ^ (i as u8)).collect()
}

/// `x -> a * x + b`; composing two is associative and not commutative.
#[derive(Clone, Copy, Debug, PartialEq, am_core::bytemuck::Pod, am_core::bytemuck::Zeroable)]
#[repr(C)]
struct Affine {
    a: i64,
    b: i64,
}

/// `lower` then `upper`: the member of lower team rank applies first.
fn compose(lower: am_core::Plain<Affine>, upper: am_core::Plain<Affine>) -> am_core::Plain<Affine> {
    let (f, g) = (lower.0, upper.0);
    am_core::Plain(Affine {
        a: g.a.wrapping_mul(f.a),
        b: g.a.wrapping_mul(f.b).wrapping_add(g.b),
    })
}

/// Member `rank`'s element `i`.
fn mine(rank: u32, i: usize) -> Affine {
    Affine {
        a: i64::from(rank) + 2,
        b: i as i64 - i64::from(rank),
    }
}

/// The all-gather's expected outcome on `team`.
fn gathered(team: &Team, tag: u8, len: usize) -> Vec<u8> {
    team.members()
        .iter()
        .flat_map(|&w| block(w, tag, len))
        .collect()
}

/// Blocking and `_nb` forms on `Node`, 2 to 4 ranks: the world team, a split in halves by
/// parity with reversed keys, the team of one, and several collectives in flight at once on
/// overlapping teams, completed in bulk (`wait_all`) and out of issue order. Catches a
/// collective that only works on the harness's endpoint (a driver that does not carry a
/// collective on while it waits for another one, so two ranks waiting on different
/// collectives deadlock), and a team's ranks or order differing from MPI_Comm_split's.
#[test]
fn node_splits_and_runs_collectives_on_two_to_four_ranks() {
    for n in 2..=4u32 {
        within(Duration::from_secs(60), move || {
            am_core::run_ranks(Loopback::cluster(n, Default::default()), |t| {
                let mut node = Node::new(t, Handlers::new(), Config::default()).unwrap();
                let me = node.rank();
                let world = node.world_team();
                assert_eq!(
                    (world.id(), world.rank(), world.size()),
                    (TeamId::WORLD, me, n)
                );
                node.team_barrier(&world).unwrap();

                // Halves by parity, the highest world rank first.
                let half = node.split(&world, Some(me % 2), 100 - me).unwrap().unwrap();
                let expect: Vec<u32> = (0..n).rev().filter(|r| r % 2 == me % 2).collect();
                assert_eq!(half.members(), &expect[..]);
                assert_eq!(half.world_rank(half.rank()), Some(me));
                assert_eq!(half.team_rank(me), Some(half.rank()));
                assert_eq!(half.id().leader, expect[0]);
                assert_ne!(half.id(), TeamId::WORLD);

                // Every rank alone, and a rank that gives no color.
                let alone = node.split(&world, Some(me), 0).unwrap().unwrap();
                assert_eq!((alone.size(), alone.rank()), (1, 0));
                let none = node.split(&world, (me != 0).then_some(7), 0).unwrap();
                assert_eq!(none.is_some(), me != 0);

                assert_eq!(node.team_all_gather(&alone, &[9, 9]).unwrap(), [9, 9]);
                assert_eq!(
                    node.team_all_gather(&half, &block(me, 1, 5)).unwrap(),
                    gathered(&half, 1, 5)
                );

                // In flight together on overlapping teams, waited for in reverse.
                let g1 = node.team_all_gather_nb(&world, &block(me, 2, 8)).unwrap();
                let b1 = node.team_barrier_nb(&half).unwrap();
                let g2 = node.team_all_gather_nb(&half, &block(me, 3, 3)).unwrap();
                let g3 = node.team_all_gather_nb(&world, &block(me, 4, 1)).unwrap();
                let b2 = node.team_barrier_nb(&world).unwrap();
                node.wait(b2).unwrap();
                assert_eq!(node.wait(g3).unwrap(), gathered(&world, 4, 1));
                assert_eq!(node.wait(g2).unwrap(), gathered(&half, 3, 3));
                node.wait(b1).unwrap();
                assert_eq!(node.wait(g1).unwrap(), gathered(&world, 2, 8));

                // A block as large as a Medium carries, and one that takes three chunks.
                let max = node.max_medium();
                let big = node.team_all_gather(&world, &block(me, 5, max)).unwrap();
                assert_eq!(big, gathered(&world, 5, max));
                let big = node
                    .team_all_gather(&world, &block(me, 6, 2 * max + 1))
                    .unwrap();
                assert_eq!(big, gathered(&world, 6, 2 * max + 1));

                drop(half);
                drop(alone);
                drop(none);
                node.team_barrier(&world).unwrap();
                node.barrier().unwrap();
                assert_eq!(node.endpoint().collectives_in_flight(), 0);
            });
        });
    }
}

/// `SharedNode` and `AsyncNode` reach the same collectives under the same names
/// (`split`, `team_barrier`, `team_all_gather`, their `_nb`), the async ones as futures that
/// own their arguments. Catches a driver left out of the operation list, or a future that
/// borrows the block past its start.
#[test]
fn shared_and_async_nodes_run_the_same_collectives() {
    within(Duration::from_secs(60), || {
        am_core::run_ranks(Loopback::cluster(3, Default::default()), |t| {
            let node = Node::new(t, Handlers::new(), Config::default()).unwrap();
            let me = node.rank();
            let shared = SharedNode::new(node);
            let world = shared.world_team();
            let pair = shared
                .split(&world, Some(u32::from(me == 2)), 0)
                .unwrap()
                .unwrap();
            assert_eq!(
                shared.team_all_gather(&pair, &[me as u8]).unwrap(),
                pair.members().iter().map(|&w| w as u8).collect::<Vec<_>>()
            );
            let op = shared.team_barrier_nb(&world).unwrap();
            shared.wait(op).unwrap();
            drop(pair);
            let node = shared.into_inner().unwrap();

            let node = AsyncNode::new(node);
            let world = node.world_team();
            let gathered = am_core::future::block_on(&node, async {
                let team = node.split(&world, Some(0), 10 - me).await.unwrap().unwrap();
                assert_eq!(team.members(), &[2, 1, 0]);
                let fut = node.team_all_gather(&team, &[me as u8, 1]);
                let all = fut.await.unwrap();
                node.team_barrier(&world).await.unwrap();
                all
            });
            assert_eq!(gathered, [2, 1, 1, 1, 0, 1]);
        });
    });
}

/// Broadcast, gather, reduce and all-reduce through `Node` (blocking and `_nb`, several in
/// flight), `SharedNode` and `AsyncNode` on 3 and 4 ranks, with roots other than 0 and a
/// vector as large as a Medium carries. Catches a rooted collective or a reduction left out
/// of a driver, a typed outcome decoded at the wrong width, and a vector past `max_medium`
/// sent rather than refused.
#[test]
fn rooted_collectives_and_reductions_on_every_driver() {
    use am_core::ReduceOp;
    for n in [3u32, 4] {
        within(Duration::from_secs(60), move || {
            am_core::run_ranks(Loopback::cluster(n, Default::default()), |t| {
                let mut node = Node::new(t, Handlers::new(), Config::default()).unwrap();
                let me = node.rank();
                let world = node.world_team();
                let last = n - 1;
                let data = if me == last {
                    b"from the last".to_vec()
                } else {
                    Vec::new()
                };
                assert_eq!(
                    node.team_broadcast(&world, last, &data).unwrap(),
                    b"from the last"
                );
                let all: Vec<u8> = (0..n).flat_map(|r| [r as u8, 7]).collect();
                let got = node.team_gather(&world, 1, &[me as u8, 7]).unwrap();
                assert_eq!(got, if me == 1 { all } else { Vec::new() });

                let sum: u64 = (0..n as u64).map(|r| r * r).sum();
                let got = node
                    .team_reduce(&world, 2, ReduceOp::Sum, &[u64::from(me * me), 1])
                    .unwrap();
                assert_eq!(
                    got,
                    if me == 2 {
                        vec![sum, n as u64]
                    } else {
                        Vec::new()
                    }
                );
                let got = node
                    .team_all_reduce(&world, ReduceOp::Min, &[-(me as i32), me as i32])
                    .unwrap();
                assert_eq!(got, [-(last as i32), 0]);

                // In flight together, waited for in reverse.
                let a = node
                    .team_all_reduce_nb(&world, ReduceOp::Sum, &[0.5f64 * f64::from(me)])
                    .unwrap();
                let b = node
                    .team_broadcast_nb(&world, 0, if me == 0 { &[1, 2] } else { &[] })
                    .unwrap();
                let c = node
                    .team_all_reduce_nb(&world, ReduceOp::Xor, &[1u8 << me])
                    .unwrap();
                assert_eq!(node.wait(c).unwrap(), [(1u8 << n) - 1]);
                assert_eq!(node.wait(b).unwrap(), [1, 2]);
                let half: f64 = (0..n).map(|r| 0.5 * f64::from(r)).sum();
                assert_eq!(node.wait(a).unwrap(), [half]);

                // A vector as large as a Medium carries, and larger ones.
                let max = node.max_medium() / 8;
                let v: Vec<u64> = (0..max as u64).map(|i| i + u64::from(me)).collect();
                let got = node.team_all_reduce(&world, ReduceOp::Max, &v).unwrap();
                assert_eq!(
                    got,
                    (0..max as u64)
                        .map(|i| i + u64::from(last))
                        .collect::<Vec<_>>()
                );
                // Larger: in chunks of whole elements, each reduced on its own.
                let v: Vec<u64> = (0..3 * max as u64 + 1)
                    .map(|i| i * u64::from(me + 1))
                    .collect();
                let sum: u64 = (1..=u64::from(n)).sum();
                assert_eq!(
                    node.team_all_reduce(&world, ReduceOp::Sum, &v).unwrap(),
                    (0..3 * max as u64 + 1).map(|i| i * sum).collect::<Vec<_>>()
                );
                // A broadcast of several chunks in flight with a later collective: the
                // members that do not root it learn its length from its first chunk, and
                // start the next collective only after its chunks.
                let bytes: Vec<u8> = (0..17 * max + 3).map(|i| (i % 251) as u8).collect();
                let b = node
                    .team_broadcast_nb(&world, 1, if me == 1 { &bytes } else { &[] })
                    .unwrap();
                let c = node
                    .team_all_reduce_nb(&world, ReduceOp::Sum, &[1u32])
                    .unwrap();
                assert_eq!(node.wait(c).unwrap(), [n]);
                assert_eq!(node.wait(b).unwrap(), bytes);
                // Misuse refused before anything is sent.
                assert!(matches!(
                    node.team_all_reduce(&world, ReduceOp::And, &[1.0f32]),
                    Err(am_core::AmError::InvalidCollective(_))
                ));
                assert!(matches!(
                    node.team_broadcast(&world, n, &[]),
                    Err(am_core::AmError::InvalidCollective(_))
                ));

                let shared = SharedNode::new(node);
                let got = shared
                    .team_all_reduce(&world, ReduceOp::Max, &[me])
                    .unwrap();
                assert_eq!(got, [last]);
                let op = shared.team_gather_nb(&world, 0, &[me as u8]).unwrap();
                let got = shared.wait(op).unwrap();
                assert_eq!(got.len(), if me == 0 { n as usize } else { 0 });
                let node = AsyncNode::new(shared.into_inner().unwrap());
                let (sum, bytes) = am_core::future::block_on(&node, async {
                    let sum = node
                        .team_reduce(&world, 0, ReduceOp::Product, &[i64::from(me) + 1])
                        .await
                        .unwrap();
                    let bytes = node
                        .team_broadcast(&world, 1, if me == 1 { b"async" } else { b"" })
                        .await
                        .unwrap();
                    node.team_barrier(&world).await.unwrap();
                    (sum, bytes)
                });
                let fact: i64 = (1..=i64::from(n)).product();
                assert_eq!(sum, if me == 0 { vec![fact] } else { Vec::new() });
                assert_eq!(bytes, b"async");
            });
        });
    }
}

/// A rank that waits for something else (`wait_until` on a flag a peer's request sets)
/// while its all-gather is in flight still forwards the ring: the peer sets the flag only
/// after its own all-gather completed. Catches blocking waits that advance collectives only
/// when their handle is polled (rank 0 would never forward, rank 1 never complete, and both
/// wait for ever).
#[test]
fn a_wait_for_something_else_carries_collectives_on() {
    use am_core::{AmKind, HandlerId};
    use std::cell::Cell;
    use std::rc::Rc;
    const FLAG: HandlerId = HandlerId(1);
    within(Duration::from_secs(30), || {
        am_core::run_ranks(Loopback::cluster(3, Default::default()), |t| {
            let flag = Rc::new(Cell::new(false));
            let mut h = Handlers::local();
            let f = flag.clone();
            h.request(FLAG, "flag", AmKind::Short, move |_, _| f.set(true))
                .unwrap();
            let mut node = Node::new(t, h, Config::default()).unwrap();
            let me = node.rank();
            let world = node.world_team();
            let op = node.team_all_gather_nb(&world, &[me as u8]).unwrap();
            match me {
                0 => {
                    node.wait_until(|| flag.get()).unwrap();
                    assert_eq!(node.wait(op).unwrap(), [0, 1, 2]);
                }
                // The ring runs 0 -> 1 -> 2 -> 0: rank 1's last block is the one rank 0
                // forwards.
                1 => {
                    assert_eq!(node.wait(op).unwrap(), [0, 1, 2]);
                    node.request_short(0, FLAG, &[]).unwrap();
                }
                _ => assert_eq!(node.wait(op).unwrap(), [0, 1, 2]),
            }
            node.barrier().unwrap();
        });
    });
}

/// `free_team` frees a team at once though a clone of its handle remains: the clone's next
/// collective is `UnknownTeam`, the endpoint holds the world team alone again, and the
/// world team cannot be freed. Catches a free that waits for the last clone (a runtime's
/// team table leaking its teams) and a freed team that still starts collectives.
#[test]
fn free_team_frees_a_team_whatever_clones_remain() {
    within(Duration::from_secs(60), || {
        am_core::run_ranks(Loopback::cluster(3, Default::default()), |t| {
            let mut node = Node::new(t, Handlers::new(), Config::default()).unwrap();
            let me = node.rank();
            let world = node.world_team();
            let team = node.split(&world, Some(0), me).unwrap().unwrap();
            let clone = team.clone();
            node.team_barrier(&team).unwrap();
            assert_eq!(node.endpoint().teams_held(), (2, 0));
            node.free_team(team).unwrap();
            assert_eq!(node.endpoint().teams_held(), (1, 0));
            assert!(matches!(
                node.team_barrier(&clone),
                Err(am_core::AmError::UnknownTeam(id)) if id == clone.id()
            ));
            assert!(node.free_team(world.clone()).is_err());
            node.team_barrier(&world).unwrap();
        });
    });
}

/// User reductions registered in the handlers: `FIRST` (associative, not commutative: the
/// lowest team rank's element) and an absolute maximum over floats, on the world and on a
/// split, blocking and `_nb`, one over a vector of several chunks; an unregistered id and
/// another element type are refused before anything is sent; members that name different
/// operations get a mismatch; a rank that registers a different reduction fails start-up.
/// Catches a user operation applied as `op(upper, lower)` (FIRST would give the last
/// member's element), a user word that collides with a built-in one (the mismatch would
/// pass as agreement), and reductions left out of the handler digest.
/// Catches: a plain element written or read at the wrong width or offset, a user's
/// operation applied out of team order to a non-commutative plain type, two plain types of
/// one size taken for each other (locally or across ranks), a built-in operation applied to
/// a plain type, and a vector of elements larger than a Medium cut mid-element.
#[test]
fn plain_elements_reduce_by_the_users_operation() {
    use am_core::bytemuck::{Pod, Zeroable};
    use am_core::{AmError, LoopbackConfig, Plain, ReduceId, ReduceOp, StartError};

    /// The same size as `Affine`, another type.
    #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
    #[repr(C)]
    struct Pair {
        x: u64,
        y: u64,
    }
    /// Larger than the Medium below.
    #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
    #[repr(C)]
    struct Wide {
        w: [u64; 32],
    }
    const COMPOSE: ReduceId = ReduceId(3);
    const WIDEST: ReduceId = ReduceId(4);
    fn handlers() -> Handlers {
        let mut h = Handlers::new();
        h.reduction(COMPOSE, "compose", compose).unwrap();
        h.reduction(
            WIDEST,
            "widest",
            |a: Plain<Wide>, b: Plain<Wide>| {
                if b.0.w[0] > a.0.w[0] {
                    b
                } else {
                    a
                }
            },
        )
        .unwrap();
        h
    }
    // 160 bytes of Medium: a Wide (256 bytes) fits none.
    let config = LoopbackConfig::new().max_medium(160);
    within(Duration::from_secs(60), move || {
        am_core::run_ranks(Loopback::cluster(3, config), |t| {
            let mut node = Node::new(t, handlers(), Config::default()).unwrap();
            let me = node.rank();
            let world = node.world_team();
            // 23 elements of 16 bytes: chunks of 10, 10 and 3 elements.
            let v: Vec<Plain<Affine>> = (0..23).map(|i| Plain(mine(me, i))).collect();
            let fold = |order: &[u32], i: usize| {
                order[1..].iter().fold(Plain(mine(order[0], i)), |acc, &r| {
                    compose(acc, Plain(mine(r, i)))
                })
            };
            let want: Vec<_> = (0..23).map(|i| fold(&[0, 1, 2], i)).collect();
            let got = node.team_all_reduce(&world, ReduceOp::User(COMPOSE), &v);
            assert_eq!(got.unwrap(), want);
            // The higher ranks first: the composition in the other order, to team rank 1.
            let back = node.split(&world, Some(0), 10 - me).unwrap().unwrap();
            let want_back: Vec<_> = (0..23).map(|i| fold(&[2, 1, 0], i)).collect();
            assert_ne!(want, want_back);
            let got = node
                .team_reduce(&back, 1, ReduceOp::User(COMPOSE), &v)
                .unwrap();
            assert_eq!(got, if me == 1 { want_back } else { Vec::new() });
            // One element, non-blocking.
            let op = node
                .team_all_reduce_nb(&back, ReduceOp::User(COMPOSE), &v[..1])
                .unwrap();
            assert_eq!(node.wait(op).unwrap(), [fold(&[2, 1, 0], 0)]);
            // Refused on every member before anything is sent: an element larger than a
            // Medium, a built-in operation, another plain type of the same size.
            let wide = [Plain(Wide {
                w: [u64::from(me); 32],
            })];
            assert!(matches!(
                node.team_all_reduce(&world, ReduceOp::User(WIDEST), &wide),
                Err(AmError::InvalidCollective(_))
            ));
            assert!(matches!(
                node.team_all_reduce(&world, ReduceOp::Max, &v),
                Err(AmError::InvalidCollective(_))
            ));
            let pairs = [Plain(Pair { x: 1, y: 2 })];
            assert!(matches!(
                node.team_all_reduce(&world, ReduceOp::User(COMPOSE), &pairs),
                Err(AmError::InvalidCollective(_))
            ));
            // The team goes on.
            let got = node.team_all_reduce(&world, ReduceOp::User(COMPOSE), &v[..2]);
            assert_eq!(got.unwrap(), want[..2]);
        });
        // A rank whose operation under the same id and name is over another plain type of
        // the same size: start-up fails on every rank.
        am_core::run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let mut h = Handlers::new();
            if am_core::Transport::rank(&t) == 1 {
                h.reduction(COMPOSE, "compose", |a: Plain<Pair>, _b: Plain<Pair>| a)
                    .unwrap();
            } else {
                h.reduction(COMPOSE, "compose", compose).unwrap();
            }
            match Node::new(t, h, Config::default()) {
                Err(StartError::HandlerTableMismatch { .. }) => {}
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("reductions over two plain types started"),
            }
        });
    });
}

#[test]
fn user_reductions_registered_in_the_handlers() {
    use am_core::{AmError, ReduceId, ReduceOp, StartError};
    const FIRST: ReduceId = ReduceId(1);
    const ABS_MAX: ReduceId = ReduceId(7);
    fn handlers() -> Handlers {
        let mut h = Handlers::new();
        h.reduction(FIRST, "first", |a: u64, _b: u64| a).unwrap();
        h.reduction(
            ABS_MAX,
            "abs max",
            |a: f64, b: f64| {
                if b.abs() > a.abs() {
                    b
                } else {
                    a
                }
            },
        )
        .unwrap();
        assert!(matches!(
            h.reduction(FIRST, "again", |a: u64, _b: u64| a),
            Err(am_core::RegisterError::ReductionTaken { .. })
        ));
        h
    }
    within(Duration::from_secs(60), || {
        am_core::run_ranks(Loopback::cluster(4, Default::default()), |t| {
            let mut node = Node::new(t, handlers(), Config::default()).unwrap();
            let me = node.rank();
            let world = node.world_team();
            // The higher ranks first: FIRST is the element of world rank 3.
            let back = node.split(&world, Some(0), 10 - me).unwrap().unwrap();
            let v = [u64::from(me) * 10, u64::from(me)];
            assert_eq!(
                node.team_all_reduce(&world, ReduceOp::User(FIRST), &v)
                    .unwrap(),
                [0, 0]
            );
            assert_eq!(
                node.team_all_reduce(&back, ReduceOp::User(FIRST), &v)
                    .unwrap(),
                [30, 3]
            );
            let got = node
                .team_reduce(&back, 2, ReduceOp::User(FIRST), &v)
                .unwrap();
            assert_eq!(got, if me == 1 { vec![30, 3] } else { Vec::new() });
            let x = [f64::from(me) * if me % 2 == 1 { -1.0 } else { 1.0 }];
            let op = node
                .team_all_reduce_nb(&world, ReduceOp::User(ABS_MAX), &x)
                .unwrap();
            assert_eq!(node.wait(op).unwrap(), [-3.0]);
            // Several chunks, each reduced on its own.
            let words = 2 * node.max_medium() / 8 + 5;
            let long: Vec<u64> = (0..words as u64)
                .map(|i| i + 1000 * u64::from(me))
                .collect();
            let got = node
                .team_all_reduce(&back, ReduceOp::User(FIRST), &long)
                .unwrap();
            assert_eq!(got, (0..words as u64).map(|i| i + 3000).collect::<Vec<_>>());
            // Refused before anything is sent.
            assert!(matches!(
                node.team_all_reduce(&world, ReduceOp::User(ReduceId(9)), &[1u64]),
                Err(AmError::InvalidCollective(_))
            ));
            assert!(matches!(
                node.team_all_reduce(&world, ReduceOp::User(FIRST), &[1u32]),
                Err(AmError::InvalidCollective(_))
            ));
            // Rank 1 names another operation: a mismatch on every member.
            let op = if me == 1 {
                ReduceOp::User(FIRST)
            } else {
                ReduceOp::Max
            };
            assert!(matches!(
                node.team_all_reduce(&back, op, &[1u64]),
                Err(AmError::CollectiveMismatch { .. })
            ));
            node.barrier().unwrap();
        });
        // One rank's reductions differ: start-up fails on every rank.
        am_core::run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let mut h = handlers();
            if am_core::Transport::rank(&t) == 1 {
                h.reduction(ReduceId(2), "extra", |a: i32, b: i32| a.max(b))
                    .unwrap();
            }
            match Node::new(t, h, Config::default()) {
                Err(StartError::HandlerTableMismatch { rank: 1, .. }) => {}
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("a different reduction started"),
            }
        });
    });
}

/// Every all-reduce algorithm on 2 to 5 ranks (a ring of 5 is not a power of two) over
/// Mediums of 64 bytes: vectors shorter than the team, of a partial last block, of one and
/// of several chunks, integers exact against the model and floats bit for bit the same on
/// every member; members that chose different algorithms get a mismatch. Catches a ring
/// block folded or passed at the wrong index, padding left in a result, a ring over a user's
/// operation, and a member whose algorithm differs taken for one that agrees.
#[test]
fn every_all_reduce_algorithm_matches_the_model() {
    use am_core::{AllReduceAlgorithm, AmError, LoopbackConfig, ReduceOp};
    let config = LoopbackConfig::new().max_medium(64);
    within(Duration::from_secs(120), move || {
        for ranks in 2..=5u32 {
            for algorithm in [
                AllReduceAlgorithm::Auto,
                AllReduceAlgorithm::Doubling,
                AllReduceAlgorithm::Ring,
            ] {
                am_core::run_ranks(Loopback::cluster(ranks, config), |t| {
                    let config = Config::default().all_reduce(algorithm);
                    let mut node = Node::new(t, Handlers::new(), config).unwrap();
                    let me = u64::from(node.rank());
                    let world = node.world_team();
                    for len in [1usize, 2, 3, 7, 8, 9, 17, 40, 77] {
                        let v: Vec<u64> = (0..len as u64).map(|i| i * 1000 + me * 7 + 1).collect();
                        let sum: Vec<u64> = (0..len as u64)
                            .map(|i| (0..u64::from(ranks)).map(|r| i * 1000 + r * 7 + 1).sum())
                            .collect();
                        let got = node.team_all_reduce(&world, ReduceOp::Sum, &v).unwrap();
                        assert_eq!(got, sum, "{ranks} ranks, {algorithm:?}, {len} u64");
                        let max = node.team_all_reduce(&world, ReduceOp::Max, &v).unwrap();
                        let want: Vec<u64> = (0..len as u64)
                            .map(|i| i * 1000 + (u64::from(ranks) - 1) * 7 + 1)
                            .collect();
                        assert_eq!(max, want);
                        // Floats whose sum depends on the order: every member the same bits.
                        let f: Vec<f64> = (0..len)
                            .map(|i| 0.1 * (i as f64 + 1.0) / (me as f64 + 3.0))
                            .collect();
                        let got = node.team_all_reduce(&world, ReduceOp::Sum, &f).unwrap();
                        let bits: Vec<u64> = got.iter().map(|x| x.to_bits()).collect();
                        let all =
                            node.team_all_gather(&world, am_core::bytemuck::cast_slice(&bits));
                        let all = all.unwrap();
                        let one = all.len() / ranks as usize;
                        assert!(
                            all.chunks(one).all(|c| c == &all[..one]),
                            "members' float sums differ"
                        );
                        for (x, i) in got.iter().zip(0..) {
                            let exact: f64 = (0..ranks)
                                .map(|r| 0.1 * (i as f64 + 1.0) / (f64::from(r) + 3.0))
                                .sum();
                            assert!((x - exact).abs() < 1e-12);
                        }
                        // Bytes of another width, an odd count.
                        let small: Vec<i16> = (0..len as i16 + 1).map(|i| i - me as i16).collect();
                        let got = node.team_all_reduce(&world, ReduceOp::Min, &small).unwrap();
                        let want: Vec<i16> = (0..len as i16 + 1)
                            .map(|i| i - (ranks as i16 - 1))
                            .collect();
                        assert_eq!(got, want);
                    }
                    node.barrier().unwrap();
                });
            }
        }
        // One member chose a ring, the others recursive doubling: a mismatch on every one.
        am_core::run_ranks(Loopback::cluster(3, config), |t| {
            let algorithm = if am_core::Transport::rank(&t) == 1 {
                AllReduceAlgorithm::Ring
            } else {
                AllReduceAlgorithm::Doubling
            };
            let mut node =
                Node::new(t, Handlers::new(), Config::default().all_reduce(algorithm)).unwrap();
            let world = node.world_team();
            let team = node.split(&world, Some(0), 0).unwrap().unwrap();
            assert!(matches!(
                node.team_all_reduce(&team, ReduceOp::Sum, &[1u64, 2, 3]),
                Err(AmError::CollectiveMismatch { .. })
            ));
            // The world team goes on (its collectives other than all-reduce agree).
            let data: &[u8] = if node.rank() == 2 { b"on" } else { b"" };
            assert_eq!(node.team_broadcast(&world, 2, data).unwrap(), b"on");
            // No rank leaves before the others' mismatch notices reached it: one that came
            // after it left would be a request it never answers, which fails its sender's
            // next wait with `PeerDeparted`.
            node.barrier().unwrap();
        });
    });
}

/// Collectives in segment 0 through every driver, 3 ranks: a user's non-commutative
/// operation over plain elements (the direct move on loopback folds each block in team
/// order, whichever member does it), in both team orders, on `Node`, `SharedNode` and
/// `AsyncNode`, elements larger than a chunk, zero-sized elements, and a broadcast from a
/// root that is not team rank 0. Catches a block folded from its owner outwards rather than
/// in team order, a chunk of no whole element (an endless loop), a zero-sized element
/// dividing by zero, a driver without the operations, and a future that does not carry a
/// collective in segment 0 on while it waits.
#[test]
fn collectives_in_segment_on_every_driver() {
    use am_core::bytemuck::{Pod, Zeroable};
    use am_core::{Plain, ReduceId, ReduceOp};

    const COMPOSE: ReduceId = ReduceId(3);
    /// Larger than a direct all-reduce's chunk (64 KiB).
    #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
    #[repr(C)]
    struct Wide {
        a: [u64; 4096],
        b: [u64; 4096],
        c: [u64; 512],
    }
    const WIDE: ReduceId = ReduceId(4);
    const NOTHING: ReduceId = ReduceId(5);
    fn bytes(v: &[Affine]) -> Vec<u8> {
        v.iter()
            .flat_map(|x| am_core::bytemuck::bytes_of(x).to_vec())
            .collect()
    }
    fn fold(order: &[u32], i: usize) -> Affine {
        order[1..]
            .iter()
            .fold(Plain(mine(order[0], i)), |acc, &r| {
                compose(acc, Plain(mine(r, i)))
            })
            .0
    }
    // Elements past a direct chunk (64 KiB), so blocks end mid-chunk.
    const COUNT: usize = 9_000;
    const SRC: usize = 0;
    const DEST: usize = 256 << 10;
    within(Duration::from_secs(60), move || {
        am_core::run_ranks(Loopback::cluster(3, Default::default()), |t| {
            let mut h = Handlers::new();
            h.reduction(COMPOSE, "compose", compose).unwrap();
            h.reduction(WIDE, "wide", |x: Plain<Wide>, y: Plain<Wide>| {
                let mut out = x;
                out.0.c[0] = x.0.c[0].wrapping_mul(3).wrapping_add(y.0.c[0]);
                out
            })
            .unwrap();
            h.reduction(NOTHING, "nothing", |x: Plain<()>, _: Plain<()>| x)
                .unwrap();
            let mut node = Node::new(t, h, Config::default()).unwrap();
            let me = node.rank();
            let world = node.world_team();
            let v: Vec<Affine> = (0..COUNT).map(|i| mine(me, i)).collect();
            let read = |seg: am_core::SharedBytes<'_>| {
                let mut got = vec![0u8; COUNT * 16];
                seg.read(DEST, &mut got).unwrap();
                got
            };
            let want = bytes(&(0..COUNT).map(|i| fold(&[0, 1, 2], i)).collect::<Vec<_>>());
            node.segment().write(SRC, &bytes(&v)).unwrap();
            node.team_all_reduce_in_segment::<Plain<Affine>>(
                &world,
                ReduceOp::User(COMPOSE),
                SRC,
                DEST,
                COUNT,
            )
            .unwrap();
            assert!(read(node.segment()) == want, "world order");

            // Elements larger than a chunk: whole elements, one at a time.
            let wide: Vec<u8> = (0..2u64)
                .flat_map(|i| {
                    let mut w = Wide::zeroed();
                    w.c[0] = 10 * i + u64::from(me);
                    am_core::bytemuck::bytes_of(&w).to_vec()
                })
                .collect();
            node.segment().write(SRC, &wide).unwrap();
            node.team_all_reduce_in_segment::<Plain<Wide>>(
                &world,
                ReduceOp::User(WIDE),
                SRC,
                DEST,
                2,
            )
            .unwrap();
            let size = std::mem::size_of::<Wide>();
            for i in 0..2u64 {
                let at = DEST + i as usize * size + 8 * (4096 + 4096);
                // ((10i * 3 + 10i + 1) * 3 + 10i + 2) in team order 0, 1, 2.
                let want = ((10 * i * 3 + 10 * i + 1) * 3) + 10 * i + 2;
                assert_eq!(node.segment().load_u64(at).unwrap(), want, "wide {i}");
            }
            // Zero-sized elements: refused, here and in the `Vec` form.
            assert!(matches!(
                node.team_all_reduce_in_segment::<Plain<()>>(
                    &world,
                    ReduceOp::User(NOTHING),
                    SRC,
                    DEST,
                    4
                ),
                Err(am_core::AmError::InvalidCollective(_))
            ));
            assert!(matches!(
                node.team_all_reduce(&world, ReduceOp::User(NOTHING), &[Plain(()); 4]),
                Err(am_core::AmError::InvalidCollective(_))
            ));

            // The other order, through a SharedNode.
            node.segment().write(SRC, &bytes(&v)).unwrap();
            let shared = SharedNode::new(node);
            let back = shared.split(&world, Some(0), 10 - me).unwrap().unwrap();
            let want_back = bytes(&(0..COUNT).map(|i| fold(&[2, 1, 0], i)).collect::<Vec<_>>());
            assert_ne!(want, want_back);
            let op = shared
                .team_all_reduce_in_segment_nb::<Plain<Affine>>(
                    &back,
                    ReduceOp::User(COMPOSE),
                    SRC,
                    DEST,
                    COUNT,
                )
                .unwrap();
            shared.wait(op).unwrap();
            let node = shared.into_inner().unwrap();
            assert!(read(node.segment()) == want_back, "reversed order");

            // A broadcast from world rank 2 as a future.
            let node = AsyncNode::new(node);
            let payload: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
            if me == 2 {
                node.with(|n| n.segment().write(SRC, &payload).unwrap());
            }
            am_core::future::block_on(&node, async {
                node.team_broadcast_in_segment(&world, 2, SRC, DEST, payload.len())
                    .await
                    .unwrap();
            });
            let mut got = vec![0u8; payload.len()];
            node.with(|n| n.segment().read(DEST, &mut got).unwrap());
            assert!(got == payload, "broadcast");
        });
    });
}

/// Catches a collective in segment 0 that goes on only while its own handle is waited for:
/// rank 0 starts a broadcast of 1 MiB (several steps of a direct move) and goes straight
/// into the world barrier; rank 1 waits for the broadcast first. Unless rank 0's barrier
/// carries the move on (it is past its agreement, then part-way through), rank 1 never
/// leaves its wait and rank 0 never leaves the barrier: the watchdog fails it. In every
/// wait mode, since spinning, yielding and blocking waits take different paths.
#[test]
fn a_collective_in_segment_goes_on_while_its_member_waits_for_something_else() {
    use am_core::{LoopbackConfig, WaitMode};
    const LEN: usize = (1 << 20) + 24;
    for mode in [WaitMode::Spin, WaitMode::SpinThenYield, WaitMode::Block] {
        within(Duration::from_secs(60), move || {
            let cfg = LoopbackConfig::new().segment_size(2 * LEN);
            am_core::run_ranks(Loopback::cluster(2, cfg), |t| {
                let config = Config::default().wait_mode(mode);
                let mut node = Node::new(t, Handlers::new(), config).unwrap();
                let me = node.rank();
                let world = node.world_team();
                let bytes: Vec<u8> = (0..LEN).map(|i| (i % 251) as u8).collect();
                if me == 1 {
                    node.segment().write(0, &bytes).unwrap();
                }
                let op = node
                    .team_broadcast_in_segment_nb(&world, 1, 0, LEN, LEN)
                    .unwrap();
                if me == 0 {
                    node.barrier().unwrap();
                    node.wait(op).unwrap();
                } else {
                    node.wait(op).unwrap();
                    node.barrier().unwrap();
                }
                let mut got = vec![0u8; LEN];
                node.segment().read(LEN, &mut got).unwrap();
                assert!(got == bytes, "rank {me}: {mode:?}");
            });
        });
    }
}

/// Catches [`Node::arm`] saying `Sleep` while a collective in segment 0 is part-way through
/// its direct move. No message comes to wake the rank for the rest of it (its peer waits for
/// its part), so an event loop that sleeps as `arm` says would stall the move until the sleep
/// ran out. Each rank polls until its all-reduce of 1 MiB completes, and arms whenever its
/// endpoint says the move has work: `arm` must then say `Ready`. Each rank's share (half the
/// vector) is larger than one advance moves (`MOVE_PER_STEP`), so the move is seen part-way
/// at least once; and the sums must be right.
#[test]
fn arm_says_ready_while_a_collective_in_segment_is_moving() {
    use am_core::{Armed, LoopbackConfig, ReduceOp};
    const WORDS: usize = 1 << 17;
    const LEN: usize = WORDS * 8;
    within(Duration::from_secs(60), || {
        let cfg = LoopbackConfig::new().segment_size(2 * LEN);
        am_core::run_ranks(Loopback::cluster(2, cfg), |t| {
            let mut node = Node::new(t, Handlers::new(), Config::default()).unwrap();
            let me = node.rank();
            let world = node.world_team();
            let src: Vec<u8> = (0..WORDS as u64)
                .flat_map(|i| (i + u64::from(me)).to_le_bytes())
                .collect();
            node.segment().write(0, &src).unwrap();
            let op = node
                .team_all_reduce_in_segment_nb::<u64>(&world, ReduceOp::Sum, 0, LEN, WORDS)
                .unwrap();
            let mut moving = 0;
            while !node.test(&op).unwrap() {
                if node.endpoint().has_local_work() {
                    moving += 1;
                    let armed = node.arm().unwrap();
                    node.disarm();
                    assert_eq!(armed, Armed::Ready, "rank {me}: told to sleep mid-move");
                }
            }
            node.wait(op).unwrap();
            assert!(moving > 0, "rank {me}: the move was never seen part-way");
            let mut got = vec![0u8; LEN];
            node.segment().read(LEN, &mut got).unwrap();
            let want: Vec<u8> = (0..WORDS as u64)
                .flat_map(|i| (2 * i + 1).to_le_bytes())
                .collect();
            assert!(got == want, "rank {me}: wrong sums");
            node.barrier().unwrap();
        });
    });
}

/// Issue 78's example through `Node` on loopback threads: rank 0 all-reduces 2 `u32`s,
/// ranks 1 to 3 one. Every rank fails at once; ranks 1 to 3 are told that rank 0 differs
/// from rank 1 (8 bytes against 4), rank 0 that a rank differs from it (4 against 8).
/// Catches the words "rank 1 started another collective than this one on team 0.0", which
/// named no length and told rank 3 that rank 1, which agreed with it, differed.
#[test]
fn a_length_mismatch_says_both_lengths_and_names_the_rank_that_differs() {
    use am_core::{AmError, Disagreement, ReduceOp};
    within(Duration::from_secs(60), || {
        am_core::run_ranks(Loopback::cluster(4, Default::default()), |t| {
            let mut node = Node::new(t, Handlers::new(), Config::default()).unwrap();
            let world = node.world_team();
            let me = node.rank();
            let mine: &[u32] = if me == 0 { &[1, 2] } else { &[1] };
            let err = node
                .team_all_reduce(&world, ReduceOp::Sum, mine)
                .expect_err("a mismatch");
            let AmError::CollectiveMismatch {
                peer, agrees, what, ..
            } = err.clone()
            else {
                panic!("rank {me}: {err}");
            };
            if me == 0 {
                assert!(peer != 0 && agrees == 0, "{err}");
                assert_eq!(*what, Disagreement::Length { peer: 4, agrees: 8 });
            } else {
                assert_eq!((peer, agrees), (0, 1), "rank {me}: {err}");
                assert_eq!(*what, Disagreement::Length { peer: 8, agrees: 4 });
                assert!(err
                    .to_string()
                    .contains("rank 0 gave a length of 8 bytes where rank 1 gave 4"));
            }
        });
    });
}
