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

                // A block as large as a Medium carries.
                let max = node.max_medium();
                let big = node.team_all_gather(&world, &block(me, 5, max)).unwrap();
                assert_eq!(big, gathered(&world, 5, max));
                // Larger is refused before anything is sent.
                assert!(node.team_all_gather(&world, &vec![0; max + 1]).is_err());

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
