//! The criterion groups every transport's bench shares (feature `criterion`): the floors next
//! to the NIC alone, AM round trips, streams and the idle poll, all over in-process clusters
//! (threads, real segments). A bench supplies its clusters and its own configurations.

use am_core::Local;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use am_core::{AmError, Config, Node, Transport, WaitMode};
use criterion::measurement::WallTime;
use criterion::{Bencher, BenchmarkGroup, BenchmarkId, Criterion, Throughput};

use crate::am::{self, handlers};

/// Bytes of the bandwidth benches' messages and copies.
pub const MIB: usize = 1 << 20;

/// The AM configuration of the benches: the default, spinning.
pub fn spin_config() -> Config {
    Config::default().wait_mode(WaitMode::Spin)
}

/// Runs `f` on rank 0 of `pair` (ranks 0 and 1 of one cluster, [`am::handlers`] on both)
/// while rank 1 polls in another thread until `f` returns. `f` gets the reply counter.
///
/// # Panics
/// If `pair` is not two ranks or a node fails: a bench has no other way to fail.
pub fn with_pair<T: Transport + Send>(
    mut pair: Vec<T>,
    config: Config,
    f: impl FnOnce(&mut Node<T, Local>, &Cell<u64>),
) {
    assert_eq!(pair.len(), 2, "a pair is two ranks");
    let t1 = pair.pop().expect("rank 1");
    let t0 = pair.pop().expect("rank 0");
    let stop = AtomicBool::new(false);
    let config1 = config.clone();
    std::thread::scope(|s| {
        s.spawn(|| {
            let count = Rc::new(Cell::new(0));
            let h = handlers(&count).expect("handlers");
            let mut node = Node::new(t1, h, config1).expect("node 1");
            while !stop.load(Ordering::Relaxed) {
                node.poll().expect("poll");
            }
        });
        let count = Rc::new(Cell::new(0));
        let h = handlers(&count).expect("handlers");
        let mut node = Node::new(t0, h, config).expect("node 0");
        f(&mut node, &count);
        stop.store(true, Ordering::Relaxed);
    });
}

/// The group `rtt`, opened with `floor/pingpong` (two threads, one cache line) and
/// `<name>/transport_only_short` (the NIC alone over a fresh `pair()` per sample).
pub fn rtt_group<'a, T: Transport + Send>(
    c: &'a mut Criterion,
    name: &str,
    pair: impl Fn() -> Vec<T>,
) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group("rtt");
    g.bench_function("floor/pingpong", |b| {
        b.iter_custom(|iters| {
            am_shm::floor::cacheline_pingpong_threads(iters as usize)
                .expect("floor")
                .into_iter()
                .sum()
        })
    });
    g.bench_function(format!("{name}/transport_only_short"), |b| {
        b.iter_custom(|iters| crate::nic::rtt_threads(pair(), iters).expect("NIC round trips"))
    });
    g
}

/// AM round trips from `node` (rank 0 of [`with_pair`]) for `bench_function`, one per
/// call of `round_trip` ([`am::short_round_trip`], [`am::medium_round_trip`], ...), which
/// gets the reply counter.
pub fn round_trips<'a, T: Transport>(
    node: &'a mut Node<T, Local>,
    replies: &'a Cell<u64>,
    mut round_trip: impl FnMut(&mut Node<T, Local>, &Cell<u64>) -> Result<(), AmError> + 'a,
) -> impl FnMut(&mut Bencher<'_>) + 'a {
    move |b| {
        b.iter_custom(|iters| {
            let start = std::time::Instant::now();
            for _ in 0..iters {
                round_trip(node, replies).expect("round trip");
            }
            start.elapsed()
        })
    }
}

/// The group `bw` (throughput 1 MiB, 20 samples), opened with `floor/copy/1048576`: two
/// threads copying 1 MiB through a shared segment.
pub fn bw_group(c: &mut Criterion) -> BenchmarkGroup<'_, WallTime> {
    let mut g = c.benchmark_group("bw");
    g.throughput(Throughput::Bytes(MIB as u64));
    g.sample_size(20);
    g.bench_function(BenchmarkId::new("floor/copy", MIB), |b| {
        b.iter_custom(|iters| {
            let bps = am_shm::floor::copy_bandwidth_threads(MIB, iters as usize).expect("floor");
            Duration::from_secs_f64(MIB as f64 * iters as f64 / bps)
        })
    });
    g
}

/// A stream from `node` for `bench_function`: `send` per iteration, then [`Node::quiesce`]
/// once.
pub fn stream<'a, T: Transport>(
    node: &'a mut Node<T, Local>,
    mut send: impl FnMut(&mut Node<T, Local>) -> Result<(), AmError> + 'a,
) -> impl FnMut(&mut Bencher<'_>) + 'a {
    move |b| b.iter_custom(|iters| am::stream(node, iters, &mut send).expect("stream"))
}

/// The group `idle_poll`: an empty `poll_recv` on rank 0 of `cluster(peers + 1)`, for 1, 8
/// and 64 peers, as `<name>/<peers>`.
pub fn idle_poll<T: Transport>(c: &mut Criterion, name: &str, cluster: impl Fn(u32) -> Vec<T>) {
    let mut g = c.benchmark_group("idle_poll");
    for peers in [1u32, 8, 64] {
        let mut ranks = cluster(peers + 1);
        let t = &mut ranks[0];
        g.bench_function(BenchmarkId::new(name, peers), |b| {
            b.iter(|| t.poll_recv(|_, _, _| ()).expect("poll").is_none())
        });
    }
    g.finish();
}
