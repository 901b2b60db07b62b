//! Round-trip latency: an AM request whose handler replies with the same kind and size, per
//! transport × kind × size, beside the raw floor measured in the same run (two threads
//! bouncing one cache line). `cargo bench --bench latency`.
//!
//! Groups: `rtt/short`, `rtt/medium`, `rtt/long`, keyed `<transport>/<payload bytes>`;
//! `rtt/floor`, keyed `threads/8` (an 8-byte atomic).

#![allow(missing_docs)] // criterion_group! generates undocumented functions

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amnet::AmKind;
use common::{kind_name, transports, Pair, KINDS};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbeam_utils::CachePadded;

const SIZES: [usize; 5] = [0, 8, 512, 4096, 65536];

fn am_rtt(c: &mut Criterion) {
    for kind in KINDS {
        let mut group = c.benchmark_group(format!("rtt/{}", kind_name(kind)));
        group
            .warm_up_time(Duration::from_millis(300))
            .measurement_time(Duration::from_secs(1))
            .sample_size(50);
        for transport in transports() {
            let Some(mut pair) = Pair::start(transport, 1 << 20) else {
                continue;
            };
            let limits = pair.node.limits();
            let max = match kind {
                AmKind::Short => 0,
                AmKind::Medium => limits.max_medium,
                AmKind::Long => limits.max_long.min(pair.node.segment().len()),
            };
            for size in SIZES.into_iter().filter(|&s| s <= max) {
                let payload = vec![1u8; size];
                group.throughput(Throughput::Bytes(size as u64));
                group.bench_with_input(BenchmarkId::new(transport.name(), size), &size, |b, _| {
                    b.iter(|| pair.round_trip(kind, &payload))
                });
            }
        }
        group.finish();
    }
}

/// Spins, yielding once in a while so a preempted partner gets the core back.
#[inline]
fn relax(idle: u32) {
    if idle.is_multiple_of(1024) {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// The floor: one thread makes a cache-padded counter odd, the other makes it even again.
/// One iteration is one round trip of the cache line.
fn raw_floor(c: &mut Criterion) {
    let line = Arc::new(CachePadded::new(AtomicU64::new(0)));
    let l = line.clone();
    let server = std::thread::spawn(move || {
        let mut idle = 0u32;
        loop {
            let v = l.load(Ordering::Acquire);
            if v == u64::MAX {
                break;
            }
            if v % 2 == 1 {
                l.store(v + 1, Ordering::Release);
                idle = 0;
            } else {
                idle = idle.wrapping_add(1);
                relax(idle);
            }
        }
    });
    let mut group = c.benchmark_group("rtt/floor");
    group
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(50);
    let mut n = 0u64;
    group.bench_function(BenchmarkId::new("threads", 8), |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                line.store(n + 1, Ordering::Release);
                n += 2;
                let mut idle = 0u32;
                while line.load(Ordering::Acquire) != n {
                    idle = idle.wrapping_add(1);
                    relax(idle);
                }
            }
            t0.elapsed()
        })
    });
    group.finish();
    line.store(u64::MAX, Ordering::Release);
    server.join().unwrap();
}

criterion_group!(benches, raw_floor, am_rtt);
criterion_main!(benches);
