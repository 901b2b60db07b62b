//! EXTOLL NIC benches beside the raw shared-memory floors, in one run:
//! - `floor/pingpong`: two threads, one cache line (am_shm::floor), one round trip;
//! - `extoll/transport_only_short` and `extoll/short`: the NIC alone, and AM Short request +
//!   reply, between two ranks (threads, real segments);
//! - `extoll/medium/{velo,rma}/SIZE`: AM Medium round trips by size over each Medium path;
//! - `floor/copy` and `extoll/long`: 1 MiB copy bandwidth vs AM Long (RMA put) bandwidth;
//! - `idle_poll/extoll/{1,8,64}`: an empty `poll_recv` with that many peers.
//!
//! The groups' common parts are am-perf's (`am_perf::bench`); the Medium paths are here.
//!
//! Run: `cargo bench -p am-perf --bench extoll`.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use am_perf::am::{self, LONG};
use am_perf::bench::{self as perf, with_pair, MIB};
use am_perf::PEER;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use extoll_sim::{Extoll, ExtollConfig, MediumPath};

fn pair(x: ExtollConfig) -> Vec<Extoll> {
    Extoll::cluster(2, 2 * MIB, x).expect("cluster")
}

fn latency(c: &mut Criterion) {
    let mut g = perf::rtt_group(c, "extoll", || {
        Extoll::cluster(2, 4096, ExtollConfig::default()).expect("cluster")
    });
    with_pair(
        pair(ExtollConfig::default()),
        perf::spin_config(),
        |node, count| {
            g.bench_function(
                "extoll/short",
                perf::round_trips(node, count, am::short_round_trip),
            );
        },
    );
    for (name, medium) in [("velo", MediumPath::Velo), ("rma", MediumPath::Rma)] {
        let x = ExtollConfig::default().medium(medium);
        with_pair(pair(x), perf::spin_config(), |node, count| {
            for size in [64usize, 512, 2048, 8192] {
                let data = vec![7u8; size];
                g.bench_function(
                    BenchmarkId::new(format!("extoll/medium/{name}"), size),
                    perf::round_trips(node, count, |n, c| am::medium_round_trip(n, c, &data)),
                );
            }
        });
    }
    g.finish();
}

fn bandwidth(c: &mut Criterion) {
    let mut g = perf::bw_group(c);
    with_pair(
        pair(ExtollConfig::default()),
        perf::spin_config(),
        |node, _count| {
            let data = vec![3u8; MIB];
            g.bench_function(
                BenchmarkId::new("extoll/long", MIB),
                perf::stream(node, |n| n.request_long(PEER, LONG, &[], &data, 0)),
            );
        },
    );
    g.finish();
}

fn idle_poll(c: &mut Criterion) {
    perf::idle_poll(c, "extoll", |ranks| {
        Extoll::cluster(ranks, 4096, ExtollConfig::default()).expect("cluster")
    });
}

criterion_group!(benches, latency, bandwidth, idle_poll);
criterion_main!(benches);
