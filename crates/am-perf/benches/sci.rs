//! SCI NIC benches beside the raw shared-memory floors, in one run:
//! - `floor/pingpong`: two threads, one cache line (am_shm::floor), one round trip;
//! - `sci/short_rtt`: AM Short request + reply between two ranks (threads, real segments);
//! - `sci/medium_rtt/{two-transfers,one-copy}/1024`: AM Medium 1 KiB round trip;
//! - `floor/copy` and `sci/long_bw/{pio,dma}`: 1 MiB copy bandwidth vs AM Long bandwidth;
//! - `sci/idle_poll/{1,8,64}`: an empty `poll_recv` with that many peers.
//!
//! The groups' common parts are am-perf's (`am_perf::bench`); the SCI configurations are here.
//!
//! Run: `cargo bench -p am-perf --bench sci`.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use am_perf::am::{self, LONG};
use am_perf::bench::{self as perf, with_pair, MIB};
use am_perf::PEER;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use sci_sim::{MediumStrategy, Sci, SciConfig};

fn pair(sci: SciConfig) -> Vec<Sci> {
    Sci::cluster(2, 2 * MIB, sci).expect("cluster")
}

fn latency(c: &mut Criterion) {
    let mut g = perf::rtt_group(c, "sci", || {
        Sci::cluster(2, 4096, SciConfig::default()).expect("cluster")
    });
    with_pair(
        pair(SciConfig::default()),
        perf::spin_config(),
        |node, count| {
            g.bench_function(
                "sci/short",
                perf::round_trips(node, count, am::short_round_trip),
            );
        },
    );
    for (name, medium) in [
        ("two-transfers", MediumStrategy::TwoTransfers),
        ("one-copy", MediumStrategy::OneCopy),
    ] {
        // 1 KiB of payload needs a slot of 1 KiB + headers.
        let sci = SciConfig::default().slot_size(1152).medium(medium);
        with_pair(pair(sci), perf::spin_config(), |node, count| {
            let data = vec![7u8; 1024];
            g.bench_function(
                BenchmarkId::new(format!("sci/medium/{name}"), 1024),
                perf::round_trips(node, count, |n, c| am::medium_round_trip(n, c, &data)),
            );
        });
    }
    g.finish();
}

fn bandwidth(c: &mut Criterion) {
    let mut g = perf::bw_group(c);
    for (name, threshold) in [("pio", usize::MAX), ("dma", 64 << 10)] {
        let sci = SciConfig::default().dma_threshold(threshold);
        with_pair(pair(sci), perf::spin_config(), |node, _count| {
            let data = vec![3u8; MIB];
            g.bench_function(
                BenchmarkId::new(format!("sci/long/{name}"), MIB),
                perf::stream(node, |n| n.request_long(PEER, LONG, &[], &data, 0)),
            );
        });
    }
    g.finish();
}

fn idle_poll(c: &mut Criterion) {
    perf::idle_poll(c, "sci", |ranks| {
        Sci::cluster(ranks, 4096, SciConfig::default()).expect("cluster")
    });
}

criterion_group!(benches, latency, bandwidth, idle_poll);
criterion_main!(benches);
