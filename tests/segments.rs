//! Segments created and published as the job runs, driven by the async driver (tokio tasks)
//! and by a `SharedNode` under a progress thread: on loopback (peers map each other's
//! segments), two endpoints per process (`run_job_endpoints`), and on udp on 127.0.0.1 (the
//! owner's progress serves them), ranks as threads of this process. The per-transport cases
//! are in the conformance suite.

use std::time::Duration;

use amnet::{
    AmError, AmKind, AsyncNode, AtomicOp, Config, HandlerId, Handlers, JobOptions, Loopback,
    LoopbackConfig, Node, ProgressThread, SegmentId, SharedNode, Transport, WaitMode,
};
use transport_udp::{Udp, UdpConfig};

mod common;
use common::{on_threads, on_two_endpoints_per_process, within};

/// The Long request handler of the async case, and where its payload lands.
const LONG_TO: HandlerId = HandlerId(1);
const LONG_AT: usize = 75_000;

/// Ranks of the in-process clusters.
const RANKS: u32 = 4;

fn udp() -> Vec<Udp> {
    Udp::cluster(RANKS, 128 << 10, UdpConfig::default()).expect("UDP cluster")
}

fn loopback() -> Vec<Loopback> {
    Loopback::cluster(RANKS, LoopbackConfig::default())
}

fn config() -> Config {
    Config::default().wait_mode(WaitMode::Block)
}

/// What rank `r` puts into the next rank's segment: more than one udp Medium.
fn bytes(r: u32) -> Vec<u8> {
    (0..70_000u32).map(|i| ((i * 7) ^ r) as u8).collect()
}

/// One endpoint as tokio tasks: create, publish on the world, put into the next rank's
/// segment and add to rank 0's from two tasks at once, check, free.
fn as_tasks<T: Transport + 'static>(t: T) -> anyhow::Result<()> {
    // A Long into a created segment runs this where the payload landed: it counts the
    // Longs that found their payload whole there.
    let whole = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let mut handlers = Handlers::local();
    let w = whole.clone();
    handlers.request(LONG_TO, "long_to", AmKind::Long, move |msg, _token| {
        let src = msg.args()[0];
        if msg.long_segment() != Some(SegmentId::ZERO) && msg.payload() == bytes(src) {
            w.set(w.get() + 1);
        }
    })?;
    let node = AsyncNode::new(Node::new(t, handlers, config())?);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let driver = tokio::task::spawn_local({
            let node = node.clone();
            async move { node.drive().await }
        });
        let me = node.rank();
        let n = node.size();
        let world = node.world_team();
        let mine = node.create_segment(LONG_AT + 70_000)?;
        let peers = node.publish_segment(&world, mine).await?;
        let next = peers[((me + 1) % n) as usize];
        let put = tokio::task::spawn_local({
            let node = node.clone();
            async move { node.put_to(&next, 8, &bytes(me)).await }
        });
        let add = tokio::task::spawn_local({
            let node = node.clone();
            let zero = peers[0];
            async move { node.atomic_at(&zero, 0, AtomicOp::FetchAdd(1u64)).await }
        });
        put.await.expect("task")?;
        add.await.expect("task")?;
        node.request_long_to(&next, LONG_AT, LONG_TO, &[me], &bytes(me))
            .await?;
        while whole.get() == 0 {
            tokio::task::yield_now().await;
        }
        node.team_barrier(&world).await?;
        let prev = (me + n - 1) % n;
        let got = node.with(|n| {
            let seg = n.segment_at(mine).expect("its bytes");
            let mut got = vec![0u8; 70_000];
            seg.read(8, &mut got).map(|()| (got, seg.load_u64(0)))
        });
        let (got, adds) = got.expect("read");
        assert!(got == bytes(prev), "rank {me}: rank {prev}'s put");
        if me == 0 {
            assert_eq!(adds.expect("load"), u64::from(n), "every rank's add");
        }
        assert!(node.get_from(&next, 8, 70_000).await? == bytes(me));
        // Between segments by id and offset: the next rank's bytes into segment 0 here,
        // and this rank's created segment (rank `prev`'s bytes) into the next's.
        node.get_from_into_segment(&next, 8, SegmentId::ZERO, 0, 70_000)
            .await?;
        let got = node.with(|n| {
            let mut got = vec![0u8; 70_000];
            n.segment().read(0, &mut got).map(|()| got)
        });
        assert!(
            got.expect("read") == bytes(me),
            "rank {me}: a get into segment 0"
        );
        node.put_to_from_segment(&next, LONG_AT, mine, 8, 70_000)
            .await?;
        assert!(node.get_from(&next, LONG_AT, 70_000).await? == bytes(prev));
        node.free_segment(&world, mine).await?;
        match node.get_from(&next, 0, 1).await {
            Err(AmError::UnknownSegment { .. }) => {}
            other => panic!("rank {me}: a get from a freed segment: {other:?}"),
        }
        node.team_barrier(&world).await?;
        node.stop();
        driver.await.expect("driver")?;
        Ok::<(), anyhow::Error>(())
    })
}

/// Catches an operation on a created segment that only the blocking driver completes (an
/// async wait that is never woken by its answer, a copy between segments that never
/// writes what its get brought), a Long into one whose head outruns its
/// payload, a publication that mixes up two endpoints
/// of one process, and a mapped segment reached at the wrong endpoint's memory.
#[test]
fn created_segments_as_tokio_tasks() {
    within(Duration::from_secs(120), || {
        on_two_endpoints_per_process(&JobOptions::new().ranks(2), as_tasks);
        on_threads("udp", udp(), as_tasks);
    });
}

/// A `SharedNode` under a progress thread: two compute threads put into the next rank's
/// segment and read it back with `_nb` handles while the progress thread serves the peers.
/// Catches a handle of an operation on a created segment that only its own waiter advances
/// (udp's answers come through the progress thread).
#[test]
fn created_segments_from_compute_threads_under_a_progress_thread() {
    within(Duration::from_secs(120), || {
        on_threads("loopback", loopback(), shared);
        on_threads("udp", udp(), shared);
    });
}

fn shared<T: Transport + Send + 'static>(t: T) -> anyhow::Result<()> {
    let node = SharedNode::new(Node::new(t, Handlers::new(), config())?);
    let me = node.rank();
    let world = node.world_team();
    let mine = node.create_segment(4 << 10)?;
    let peers = node.publish_segment(&world, mine)?;
    let next = peers[((me + 1) % node.size()) as usize];
    let progress = ProgressThread::spawn(node.clone())?;
    std::thread::scope(|s| {
        for half in 0..2usize {
            let node = &node;
            s.spawn(move || {
                let at = half * 2048;
                let data = vec![half as u8 + 1; 2048];
                let h = node.put_to_nb(&next, at, &data).expect("put");
                node.wait(h).expect("put done");
                let h = node.get_from_nb(&next, at, 2048).expect("get");
                assert_eq!(node.wait(h).expect("get done"), data);
            });
        }
    });
    node.team_barrier(&world)?;
    drop(progress);
    node.free_segment(&world, mine)?;
    Ok(())
}
