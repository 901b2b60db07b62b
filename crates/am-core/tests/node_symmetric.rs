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

/// The block error a test expects: `len` bytes at `offset` of block `b` on `rank`.
fn outside(rank: Option<u32>, b: am_core::Symmetric, offset: u64, len: u64) -> AmError {
    AmError::OutOfBlock(Box::new(am_core::BlockBounds {
        rank,
        segment: am_core::SegmentId::ZERO,
        block_offset: b.offset(),
        block_len: b.len(),
        offset,
        len,
    }))
}

/// Puts, gets and atomics through a symmetric block (`Symmetric::on`) are checked against
/// the block, not only the segment: a 128-byte put into a 64-byte block, and every other
/// operation that reaches past it, fails with `OutOfBlock` naming the block and the range,
/// and the next block on the peer is left as it was; those inside it land. Catches issue
/// 78's silent put past a symmetric block, which returned `Ok(())` and overwrote the next
/// block on the peer.
#[test]
fn operations_past_a_symmetric_block_fail_naming_it() {
    within(Duration::from_secs(60), || {
        am_core::run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let mut node = Node::new(t, Handlers::new(), config()).unwrap();
            let world = node.world_team();
            let a = node.alloc_symmetric(&world, 64).unwrap();
            let b = node.alloc_symmetric(&world, 64).unwrap();
            assert_eq!(b.offset(), a.offset() + 64, "the blocks are neighbours");
            node.segment().write(b.offset(), &[7; 64]).unwrap();
            node.team_barrier(&world).unwrap();
            if node.rank() == 0 {
                let on1 = a.on(1);
                assert_eq!(
                    node.put_to(&on1, 0, &[1; 128]),
                    Err(outside(Some(1), a, 0, 128))
                );
                assert_eq!(
                    node.put_to(&on1, 60, &[1; 8]),
                    Err(outside(Some(1), a, 60, 8))
                );
                assert_eq!(node.get_from(&on1, 0, 65), Err(outside(Some(1), a, 0, 65)));
                let mut dst = [0u8; 16];
                assert_eq!(
                    node.get_from_into(&on1, 56, &mut dst).map(|_| ()),
                    Err(outside(Some(1), a, 56, 16))
                );
                assert_eq!(
                    node.atomic_at(&on1, 64, am_core::AtomicOp::FetchAdd(1u64)),
                    Err(outside(Some(1), a, 64, 8))
                );
                let zero = am_core::SegmentId::ZERO;
                assert_eq!(
                    node.put_to_from_segment(&on1, 32, zero, b.offset(), 64),
                    Err(outside(Some(1), a, 32, 64))
                );
                assert_eq!(
                    node.get_from_into_segment(&on1, 1, zero, b.offset(), 64),
                    Err(outside(Some(1), a, 1, 64))
                );
                assert_eq!(
                    node.put_to(&on1, usize::MAX, &[1]),
                    Err(outside(Some(1), a, u64::MAX, 1))
                );
                // Inside the block: it lands, at the block's offset.
                node.put_to(&on1, 0, &[1; 64]).unwrap();
                node.atomic_at(&on1, 56, am_core::AtomicOp::FetchAdd(1u64))
                    .unwrap();
                assert_eq!(node.get_from(&on1, 0, 8).unwrap(), vec![1; 8]);
            }
            node.team_barrier(&world).unwrap();
            if node.rank() == 1 {
                let mut next = [0u8; 64];
                node.segment().read(b.offset(), &mut next).unwrap();
                assert_eq!(next, [7; 64], "the next block is as it was");
                let mut mine = [0u8; 56];
                node.segment().read(a.offset(), &mut mine).unwrap();
                assert_eq!(mine, [1; 56]);
            }
            node.team_barrier(&world).unwrap();
        });
    });
}

/// `Symmetric::at` and `Symmetric::range` past the block are errors naming it, not a
/// panic. Catches issue 78's `at(100)` on a 64-byte block, which panicked.
#[test]
fn symmetric_at_past_the_block_is_an_error() {
    within(Duration::from_secs(60), || {
        am_core::run_ranks(Loopback::cluster(1, Default::default()), |t| {
            let mut node = Node::new(t, Handlers::new(), config()).unwrap();
            let world = node.world_team();
            let a = node.alloc_symmetric(&world, 64).unwrap();
            assert_eq!(a.at(100), Err(outside(None, a, 100, 1)));
            assert_eq!(a.at(64), Err(outside(None, a, 64, 1)));
            assert_eq!(a.at(63), Ok(a.offset() + 63));
            assert_eq!(a.range(60, 8), Err(outside(None, a, 60, 8)));
            assert_eq!(a.range(56, 8), Ok(a.offset() + 56));
            assert!(a.at(100).unwrap_err().to_string().contains("64-byte block"));
        });
    });
}

/// Operations through a range of a published created segment (`RemoteSegment::range`) are
/// checked against the range: past it is `OutOfBlock` naming the segment, the range and
/// the bytes asked for, and the bytes after the range are left as they were; a range past
/// the segment is refused when it is cut. Catches operations through a segment's range
/// checked only against the segment's end (issue 78).
#[test]
fn operations_past_a_range_of_a_created_segment_fail_naming_it() {
    within(Duration::from_secs(60), || {
        am_core::run_ranks(Loopback::cluster(2, Default::default()), |t| {
            let mut node = Node::new(t, Handlers::new(), config()).unwrap();
            let world = node.world_team();
            let id = node.create_segment(256).unwrap();
            let peers = node.publish_segment(&world, id).unwrap();
            if node.rank() == 0 {
                let row = peers[1].range(64, 64).unwrap();
                assert_eq!((row.offset(), row.len(), row.is_block()), (64, 64, true));
                let want = |offset, len| {
                    AmError::OutOfBlock(Box::new(am_core::BlockBounds {
                        rank: Some(1),
                        segment: id,
                        block_offset: 64,
                        block_len: 64,
                        offset,
                        len,
                    }))
                };
                assert_eq!(node.put_to(&row, 0, &[1; 128]), Err(want(0, 128)));
                assert_eq!(node.get_from(&row, 60, 8), Err(want(60, 8)));
                assert_eq!(
                    node.atomic_at(&row, 64, am_core::AtomicOp::FetchAdd(1u32)),
                    Err(want(64, 4))
                );
                // A range of the range is confined to it, and numbered from its start.
                let half = row.range(32, 32).unwrap();
                assert_eq!(half.offset(), 96);
                assert!(row.range(32, 33).is_err());
                assert!(peers[1].range(200, 57).is_err());
                node.put_to(&row, 0, &[1; 64]).unwrap();
                assert_eq!(node.get_from(&half, 0, 32).unwrap(), vec![1; 32]);
            }
            node.team_barrier(&world).unwrap();
            if node.rank() == 1 {
                let mut all = [9u8; 256];
                node.segment_at(id).unwrap().read(0, &mut all).unwrap();
                assert_eq!(all[..64], [0; 64]);
                assert_eq!(all[64..128], [1; 64]);
                assert_eq!(all[128..], [0; 128], "past the range: as it was");
            }
            node.team_barrier(&world).unwrap();
        });
    });
}
