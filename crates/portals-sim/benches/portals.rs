//! Portals NIC benches beside the raw shared-memory floors, in one run:
//! - `rtt/floor/pingpong`: two threads, one cache line (am_shm::floor), one round trip;
//! - `rtt/portals/transport_only_short`: a Short request and reply through `Transport`;
//! - `rtt/portals/short` and `rtt/portals/medium/944`: AM round trips between two ranks
//!   (threads, real segments);
//! - `bw/floor/copy` and `bw/portals/long`: 1 MiB copy bandwidth vs AM Long bandwidth;
//! - `hot/portals/{static8,dynamic}`: one sender flooding AM Shorts to one target;
//! - `idle_poll/portals/{1,8,64}`: an empty `poll_recv` with that many peers.
//!
//! Run: `cargo bench -p portals-sim --bench portals`.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use am_core::{AmKind, Config, Credits, HandlerId, Handlers, Node, Transport, WaitMode};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use portals_sim::{Portals, PortalsConfig};

const REQ_S: HandlerId = HandlerId(1);
const REP_S: HandlerId = HandlerId(2);
const REQ_M: HandlerId = HandlerId(3);
const REP_M: HandlerId = HandlerId(4);
const REQ_L: HandlerId = HandlerId(5);
const REQ_HOT: HandlerId = HandlerId(6);
const MIB: usize = 1 << 20;

fn handlers(count: &Rc<Cell<u64>>) -> Handlers {
    let mut h = Handlers::new();
    h.request(REQ_S, "s", AmKind::Short, |_m, t| {
        let _ = t.reply_short(REP_S, &[]);
    })
    .unwrap();
    let c = count.clone();
    h.reply(REP_S, "rs", AmKind::Short, move |_m| c.set(c.get() + 1))
        .unwrap();
    h.request(REQ_M, "m", AmKind::Medium, |m, t| {
        let _ = t.reply_medium(REP_M, &[], m.payload());
    })
    .unwrap();
    let c = count.clone();
    h.reply(REP_M, "rm", AmKind::Medium, move |_m| c.set(c.get() + 1))
        .unwrap();
    h.request(REQ_L, "l", AmKind::Long, |_m, _t| {}).unwrap();
    h.request(REQ_HOT, "hot", AmKind::Short, |_m, _t| {})
        .unwrap();
    h
}

fn config(credits: Credits) -> Config {
    Config {
        credits,
        wait_mode: WaitMode::Spin,
        ..Config::default()
    }
}

/// Runs `f` on rank 0 of a two-rank cluster while rank 1 polls until `f` returns.
fn with_pair(pc: PortalsConfig, f: impl FnOnce(&mut Node<Portals>, &Rc<Cell<u64>>)) {
    let mut ranks = Portals::cluster(2, 2 * MIB, pc).expect("cluster");
    let t1 = ranks.pop().unwrap();
    let t0 = ranks.pop().unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let count = Rc::new(Cell::new(0));
            let mut node = Node::new(t1, handlers(&count), config(pc.credits)).expect("node 1");
            while !stop.load(Ordering::Relaxed) {
                node.poll().expect("poll");
            }
        });
        let count = Rc::new(Cell::new(0));
        let mut node = Node::new(t0, handlers(&count), config(pc.credits)).expect("node 0");
        f(&mut node, &count);
        stop.store(true, Ordering::Relaxed);
    });
}

fn round_trips(
    node: &mut Node<Portals>,
    count: &Rc<Cell<u64>>,
    iters: u64,
    mut send: impl FnMut(&mut Node<Portals>),
) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        let want = count.get() + 1;
        send(node);
        node.wait_until(|| count.get() == want).expect("reply");
    }
    start.elapsed()
}

fn latency(c: &mut Criterion) {
    let mut g = c.benchmark_group("rtt");
    g.bench_function("floor/pingpong", |b| {
        b.iter_custom(|iters| {
            am_shm::floor::cacheline_pingpong_threads(iters as usize)
                .expect("floor")
                .into_iter()
                .sum()
        })
    });
    g.bench_function("portals/transport_only_short", |b| {
        b.iter_custom(transport_only_rtt)
    });
    with_pair(PortalsConfig::default(), |node, count| {
        g.bench_function("portals/short", |b| {
            b.iter_custom(|iters| {
                round_trips(node, count, iters, |n| {
                    n.request_short(1, REQ_S, &[]).unwrap()
                })
            })
        });
        let data = vec![7u8; node.limits().max_medium];
        g.bench_function(BenchmarkId::new("portals/medium", data.len()), |b| {
            b.iter_custom(|iters| {
                round_trips(node, count, iters, |n| {
                    n.request_medium(1, REQ_M, &[], &data).unwrap()
                })
            })
        });
    });
    g.finish();
}

/// The NIC alone, without the AM core: rank 0 sends a Short request head, rank 1's poll
/// replies from inside its receive closure, rank 0 polls for the reply.
fn transport_only_rtt(iters: u64) -> Duration {
    use am_core::wire::{Header, MAX_HEAD_LEN};
    use am_core::{Category, Outgoing, Tx};
    let head = |category| {
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = Header {
            category,
            kind: AmKind::Short,
            system: false,
            handler: 1,
            nargs: 0,
            credit: 0,
            payload_len: 0,
            long_offset: 0,
        }
        .encode(&[], &mut h);
        (h, n)
    };
    let (req, rn) = head(Category::Request);
    let (rep, pn) = head(Category::Reply);
    let mut ranks = Portals::cluster(2, 4096, PortalsConfig::default()).expect("cluster");
    let mut t1 = ranks.pop().unwrap();
    let mut t0 = ranks.pop().unwrap();
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut n = 0;
            while n < iters {
                let got = t1
                    .poll_recv(|_d, _seg, tx| {
                        let out = Outgoing {
                            head: &rep[..pn],
                            payload: &[],
                            long_offset: None,
                        };
                        tx.try_send(0, &out).expect("reply");
                    })
                    .expect("poll");
                n += got.is_some() as u64;
            }
        });
        let start = Instant::now();
        for _ in 0..iters {
            let out = Outgoing {
                head: &req[..rn],
                payload: &[],
                long_offset: None,
            };
            t0.try_send(1, &out).expect("send");
            while t0.poll_recv(|_, _, _| ()).expect("poll").is_none() {}
        }
        start.elapsed()
    })
}

fn bandwidth(c: &mut Criterion) {
    let mut g = c.benchmark_group("bw");
    g.throughput(Throughput::Bytes(MIB as u64));
    g.sample_size(20);
    g.bench_function(BenchmarkId::new("floor/copy", MIB), |b| {
        b.iter_custom(|iters| {
            let bps = am_shm::floor::copy_bandwidth_threads(MIB, iters as usize).expect("floor");
            Duration::from_secs_f64(MIB as f64 * iters as f64 / bps)
        })
    });
    with_pair(PortalsConfig::default(), |node, _count| {
        let data = vec![3u8; MIB];
        g.bench_function(BenchmarkId::new("portals/long", MIB), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    node.request_long(1, REQ_L, &[], &data, 0).unwrap();
                }
                node.quiesce().expect("quiesce");
                start.elapsed()
            })
        });
    });
    g.finish();
}

/// The hot pair: rank 0 floods rank 1 with AM Shorts under static and dynamic credits.
fn hot(c: &mut Criterion) {
    let mut g = c.benchmark_group("hot");
    g.throughput(Throughput::Elements(1));
    for (name, credits) in [
        ("static8", Credits::Static(8)),
        ("dynamic", Credits::DYNAMIC),
    ] {
        let pc = PortalsConfig {
            credits,
            ..PortalsConfig::default()
        };
        with_pair(pc, |node, _count| {
            g.bench_function(BenchmarkId::new("portals", name), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        node.request_short(1, REQ_HOT, &[]).unwrap();
                    }
                    node.quiesce().expect("quiesce");
                    start.elapsed()
                })
            });
        });
    }
    g.finish();
}

fn idle_poll(c: &mut Criterion) {
    let mut g = c.benchmark_group("idle_poll");
    for peers in [1u32, 8, 64] {
        let mut ranks =
            Portals::cluster(peers + 1, 4096, PortalsConfig::default()).expect("cluster");
        let t = &mut ranks[0];
        g.bench_function(BenchmarkId::new("portals", peers), |b| {
            b.iter(|| t.poll_recv(|_, _, _| ()).expect("poll").is_none())
        });
    }
    g.finish();
}

criterion_group!(benches, latency, bandwidth, hot, idle_poll);
criterion_main!(benches);
