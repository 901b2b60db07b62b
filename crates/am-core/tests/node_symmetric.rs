//! The symmetric heap through the drivers (`Node`, `SharedNode`, `AsyncNode`, several nodes
//! on one thread) on loopback, each test under the watchdog; `conformance::symmetric_heap`
//! runs the rest on every transport.

use std::time::Duration;

use am_core::{AmError, AsyncNode, Config, Handlers, Loopback, Node, SharedNode};

mod watchdog;
use watchdog::within;

const HEAP: usize = 16 << 10;

fn config() -> Config {
    Config::default().symmetric_size(HEAP)
}

/// A member whose heap has another size: every member's allocation fails with the same
/// `SymmetricHeapMismatch`, the team goes on, and a team of the members that agree
/// allocates. Catches a member that succeeds where another fails (their blocks would
/// differ), and a heap size that no member checks.
#[test]
fn members_with_heaps_of_other_sizes_fail_alike() {
    within(Duration::from_secs(60), || {
        am_core::run_ranks(Loopback::cluster(3, Default::default()), |t| {
            let me = am_core::Transport::rank(&t);
            let size = if me == 2 { 2 * HEAP } else { HEAP };
            let mut node =
                Node::new(t, Handlers::new(), Config::default().symmetric_size(size)).unwrap();
            let world = node.world_team();
            assert_eq!(
                node.alloc_symmetric(&world, 64),
                Err(AmError::SymmetricHeapMismatch {
                    smallest: HEAP as u64,
                    largest: 2 * HEAP as u64
                })
            );
            let agree = node
                .split(&world, Some(u32::from(me == 2)), 0)
                .unwrap()
                .unwrap();
            let a = node.alloc_symmetric(&agree, 64).unwrap();
            assert_eq!(a.offset(), (1 << 20) - size, "the heap's first block");
            node.team_barrier(&world).unwrap();
        });
    });
}

/// A heap larger than the segment is a start error naming the variable. Catches a heap
/// that reaches below the segment's start.
#[test]
fn a_heap_larger_than_the_segment_does_not_start() {
    let t = Loopback::cluster(1, Default::default()).remove(0);
    match Node::new(
        t,
        Handlers::new(),
        Config::default().symmetric_size(2 << 20),
    ) {
        Err(am_core::StartError::Config(why)) => assert!(why.contains("AM_SYMMETRIC_SIZE")),
        other => panic!("{:?}", other.map(|_| ())),
    }
}

/// `SharedNode` (with a progress thread) and `AsyncNode` allocate, put into the block and
/// free, as `Node` does; without a heap, allocation is `OutOfSymmetricHeap`. Catches an
/// allocation left out of a driver, and a driver whose wait does not carry the symmetric
/// all-reduce on.
#[test]
fn shared_and_async_nodes_allocate_and_free() {
    within(Duration::from_secs(60), || {
        am_core::run_ranks(Loopback::cluster(3, Default::default()), |t| {
            let node = Node::new(t, Handlers::new(), config()).unwrap();
            let me = node.rank();
            let next = (me + 1) % 3;
            let shared = SharedNode::new(node);
            let progress = am_core::ProgressThread::spawn(shared.clone()).unwrap();
            let world = shared.world_team();
            let a = shared.alloc_symmetric(&world, 100).unwrap();
            shared.put(next, a.offset(), &[me as u8; 100]).unwrap();
            shared.quiesce().unwrap();
            shared.team_barrier(&world).unwrap();
            let mut got = [0u8; 100];
            shared.lock().segment().read(a.offset(), &mut got).unwrap();
            assert_eq!(got, [((me + 2) % 3) as u8; 100]);
            let op = shared.free_symmetric_nb(&world, a).unwrap();
            shared.wait(op).unwrap();
            progress.stop().unwrap();
            let node = shared.into_inner().unwrap();

            let node = AsyncNode::new(node);
            let world = node.world_team();
            am_core::future::block_on(&node, async {
                let b = node.alloc_symmetric(&world, 100).await.unwrap();
                assert_eq!(b, a, "the freed block, first fit on every member");
                // A block holds what its bytes last held (as `shmem_malloc`'s).
                node.with(|n| n.segment().write(b.offset(), &[0; 8]).unwrap());
                node.team_barrier(&world).await.unwrap();
                node.atomic(0, b.offset(), am_core::AtomicOp::FetchAdd(1u64))
                    .await
                    .unwrap();
                node.team_barrier(&world).await.unwrap();
                if me == 0 {
                    assert_eq!(node.with(|n| n.segment().load_u64(b.offset()).unwrap()), 3);
                }
                node.free_symmetric(&world, b).await.unwrap();
                node.team_barrier(&world).await.unwrap();
            });
        });
    });
}

/// Two endpoints of one "process" on one thread, each allocating on the world with `_nb`,
/// then waited for together. Catches a symmetric allocation that needs a thread per
/// endpoint (one whose start waits without carrying the collective on).
#[test]
fn endpoints_on_one_thread_allocate_together() {
    within(Duration::from_secs(60), || {
        let mut transports = Loopback::cluster(4, Default::default()).into_iter();
        let processes: Vec<Vec<Loopback>> = (0..2)
            .map(|_| transports.by_ref().take(2).collect())
            .collect();
        am_core::run_ranks(processes, |endpoints| {
            let parts = endpoints.into_iter().map(|t| (t, Handlers::new()));
            let mut nodes = Node::start_all(parts, config()).unwrap();
            let worlds: Vec<_> = nodes.iter().map(|n| n.world_team()).collect();
            let mut ops: Vec<_> = nodes
                .iter_mut()
                .zip(&worlds)
                .map(|(n, w)| Some(n.alloc_symmetric_nb(w, 256).unwrap()))
                .collect();
            let mut blocks = vec![None; ops.len()];
            while blocks.contains(&None) {
                for (i, (node, op)) in nodes.iter_mut().zip(ops.iter_mut()).enumerate() {
                    if op.as_ref().is_some_and(|op| node.test(op).unwrap()) {
                        blocks[i] = Some(node.wait(op.take().unwrap()).unwrap());
                    }
                }
            }
            assert_eq!(blocks[0], blocks[1]);
            assert_eq!(blocks[0].unwrap().offset(), (1 << 20) - HEAP);
            let barriers: Vec<_> = nodes
                .iter_mut()
                .zip(&worlds)
                .map(|(n, w)| n.team_barrier_nb(w).unwrap())
                .collect();
            for (node, op) in nodes.iter_mut().zip(barriers) {
                node.wait(op).unwrap();
            }
        });
    });
}
