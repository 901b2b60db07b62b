//! AM round trip on Loopback beside the raw floor: a two-thread atomic ping-pong on one cache
//! line, measured in the same run. `cargo bench --bench latency`.
//!
//! Groups: `rtt/<transport>` keyed by kind and payload size, `raw_floor/atomic_pingpong`.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use amnet::{AmKind, Config, HandlerId, Handlers, Loopback, LoopbackConfig, Node, WaitMode};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use crossbeam_utils::CachePadded;

const PING: [HandlerId; 3] = [HandlerId(1), HandlerId(2), HandlerId(3)];
const PONG: [HandlerId; 3] = [HandlerId(4), HandlerId(5), HandlerId(6)];
const KINDS: [AmKind; 3] = [AmKind::Short, AmKind::Medium, AmKind::Long];

fn handlers(pongs: &Rc<Cell<u64>>) -> Handlers {
    let mut h = Handlers::new();
    for (i, kind) in KINDS.into_iter().enumerate() {
        let pong = PONG[i];
        h.request(PING[i], "ping", kind, move |msg, token| {
            let _ = match kind {
                AmKind::Short => token.reply_short(pong, msg.args()),
                AmKind::Medium => token.reply_medium(pong, msg.args(), msg.payload()),
                AmKind::Long => {
                    let len = msg.payload().len();
                    token.reply_long(pong, msg.args(), &msg.segment()[..len], 0)
                }
            };
        })
        .unwrap();
        let p = pongs.clone();
        h.reply(pong, "pong", kind, move |_| p.set(p.get() + 1))
            .unwrap();
    }
    h
}

fn spin_config() -> Config {
    Config {
        wait_mode: WaitMode::Spin,
        ..Config::default()
    }
}

fn am_rtt(c: &mut Criterion) {
    let mut transports = Loopback::cluster(2, LoopbackConfig::default()).into_iter();
    let t0 = transports.next().unwrap();
    let t1 = transports.next().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let stop1 = stop.clone();
    let server = std::thread::spawn(move || {
        let pongs = Rc::new(Cell::new(0));
        let mut node = Node::new(t1, handlers(&pongs), spin_config()).unwrap();
        while !stop1.load(Ordering::Relaxed) {
            node.poll().unwrap();
        }
        std::mem::forget(node); // no quiesce: the bench side is gone
    });
    let pongs = Rc::new(Cell::new(0u64));
    let mut node = Node::new(t0, handlers(&pongs), spin_config()).unwrap();
    let mut group = c.benchmark_group("rtt/loopback");
    group.measurement_time(Duration::from_secs(3));
    for (i, kind) in KINDS.into_iter().enumerate() {
        let sizes: &[usize] = match kind {
            AmKind::Short => &[0],
            _ => &[8, 512, 4096, 65536],
        };
        for &size in sizes {
            let payload = vec![1u8; size];
            let name = format!("{kind:?}").to_lowercase();
            group.throughput(Throughput::Bytes(size as u64));
            group.bench_with_input(BenchmarkId::new(name, size), &size, |b, _| {
                b.iter(|| {
                    let want = pongs.get() + 1;
                    match kind {
                        AmKind::Short => node.request_short(1, PING[i], &[7]).unwrap(),
                        AmKind::Medium => node.request_medium(1, PING[i], &[], &payload).unwrap(),
                        AmKind::Long => node.request_long(1, PING[i], &[], &payload, 0).unwrap(),
                    }
                    node.wait_until(|| pongs.get() == want).unwrap();
                })
            });
        }
    }
    group.finish();
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
    std::mem::forget(node);
}

/// The floor: one thread writes a counter, the other answers by writing it back, through two
/// cache-padded atomics. One iteration is one round trip.
fn raw_floor(c: &mut Criterion) {
    let ping = Arc::new(CachePadded::new(AtomicU64::new(0)));
    let pong = Arc::new(CachePadded::new(AtomicU64::new(0)));
    let (p, q) = (ping.clone(), pong.clone());
    let server = std::thread::spawn(move || loop {
        let v = p.load(Ordering::Acquire);
        if v == u64::MAX {
            break;
        }
        if v != q.load(Ordering::Relaxed) {
            q.store(v, Ordering::Release);
        }
        std::hint::spin_loop();
    });
    let mut group = c.benchmark_group("raw_floor");
    group.measurement_time(Duration::from_secs(3));
    let mut n = 0u64;
    group.bench_function("atomic_pingpong", |b| {
        b.iter_custom(|iters| {
            let t0 = Instant::now();
            for _ in 0..iters {
                n += 1;
                ping.store(n, Ordering::Release);
                while pong.load(Ordering::Acquire) != n {
                    std::hint::spin_loop();
                }
            }
            t0.elapsed()
        })
    });
    group.finish();
    ping.store(u64::MAX, Ordering::Release);
    server.join().unwrap();
}

criterion_group!(benches, raw_floor, am_rtt);
criterion_main!(benches);
