//! Message rate and bandwidth, per transport: a flood of one-way AMs with many in flight
//! (messages per second), AM Long streams and blocking puts by size (bytes per second, puts up
//! to 16 MiB). `cargo bench --bench throughput`.
//!
//! Groups: `flood/short`, `flood/medium`, `flood/long` (`Throughput::Elements`), `bandwidth/long`
//! and `bandwidth/put` (`Throughput::Bytes`), all keyed `<transport>/<payload bytes>`.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

mod common;

use std::time::{Duration, Instant};

use amnet::AmKind;
use common::{kind_name, transports, Pair, KINDS, SINK};
use criterion::{
    criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput,
};

const FLOOD_SIZES: [usize; 2] = [8, 4096];
const LONG_SIZES: [usize; 4] = [4096, 65536, 1 << 20, 16 << 20];
const PUT_SIZES: [usize; 5] = [8, 4096, 65536, 1 << 20, 16 << 20];
const SEGMENT: usize = 16 << 20;

/// `iters` one-way requests, then every reply back: the time per message with many in flight.
fn stream(pair: &mut Pair, kind: AmKind, payload: &[u8], iters: u64) -> Duration {
    let t0 = Instant::now();
    for _ in 0..iters {
        pair.send(kind, SINK[kind as usize], payload);
    }
    pair.node.quiesce().expect("quiesce");
    t0.elapsed()
}

fn flood(c: &mut Criterion) {
    for kind in KINDS {
        let mut group = c.benchmark_group(format!("flood/{}", kind_name(kind)));
        group
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1))
            .sample_size(50)
            .throughput(Throughput::Elements(1));
        for transport in transports() {
            let Some(mut pair) = Pair::start(transport, 1 << 20) else {
                continue;
            };
            let limits = pair.node.limits();
            let sizes: Vec<usize> = match kind {
                AmKind::Short => vec![0],
                AmKind::Medium => FLOOD_SIZES
                    .into_iter()
                    .filter(|&s| s <= limits.max_medium)
                    .collect(),
                AmKind::Long => FLOOD_SIZES
                    .into_iter()
                    .filter(|&s| s <= limits.max_long)
                    .collect(),
            };
            for size in sizes {
                let payload = vec![1u8; size];
                group.bench_with_input(BenchmarkId::new(transport.name(), size), &size, |b, _| {
                    b.iter_custom(|iters| stream(&mut pair, kind, &payload, iters))
                });
            }
        }
        group.finish();
    }
}

fn bandwidth(c: &mut Criterion) {
    let mut long = c.benchmark_group("bandwidth/long");
    // Flat sampling: a 16 MiB put over UDP takes tens of ms, so linear sampling's growing
    // iteration counts would stretch one benchmark to minutes.
    long.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat);
    for transport in transports() {
        let Some(mut pair) = Pair::start(transport, SEGMENT) else {
            continue;
        };
        let max = pair.node.limits().max_long.min(SEGMENT);
        for size in LONG_SIZES.into_iter().filter(|&s| s <= max) {
            let payload = vec![1u8; size];
            long.throughput(Throughput::Bytes(size as u64));
            long.bench_with_input(BenchmarkId::new(transport.name(), size), &size, |b, _| {
                b.iter_custom(|iters| stream(&mut pair, AmKind::Long, &payload, iters))
            });
        }
    }
    long.finish();

    let mut put = c.benchmark_group("bandwidth/put");
    put.warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(10)
        .sampling_mode(SamplingMode::Flat);
    for transport in transports() {
        let Some(mut pair) = Pair::start(transport, SEGMENT) else {
            continue;
        };
        for size in PUT_SIZES {
            let data = vec![1u8; size];
            put.throughput(Throughput::Bytes(size as u64));
            put.bench_with_input(BenchmarkId::new(transport.name(), size), &size, |b, _| {
                b.iter(|| pair.node.put(1, 0, &data).expect("put"))
            });
        }
    }
    put.finish();
}

criterion_group!(benches, flood, bandwidth);
criterion_main!(benches);
