//! Portals NIC benches beside the raw shared-memory floors, in one run:
//! - `rtt/floor/pingpong`: two threads, one cache line (am_shm::floor), one round trip;
//! - `rtt/portals/transport_only_short`: a Short request and reply through `Transport`;
//! - `rtt/portals/short` and `rtt/portals/medium/944`: AM round trips between two ranks
//!   (threads, real segments);
//! - `bw/floor/copy` and `bw/portals/long`: 1 MiB copy bandwidth vs AM Long bandwidth;
//! - `hot/portals/{static8,dynamic}`: one sender flooding AM Shorts to one target;
//! - `idle_poll/portals/{1,8,64}`: an empty `poll_recv` with that many peers.
//!
//! The groups' common parts are am-perf's (`am_perf::bench`); the credit modes are here.
//!
//! Run: `cargo bench -p am-perf --bench portals`.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use am_core::Local;
use am_core::{Credits, Node};
use am_perf::am::{self, FLOOD_SHORT, LONG};
use am_perf::bench::{self as perf, MIB};
use am_perf::PEER;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use portals_sim::{Portals, PortalsConfig};
use std::cell::Cell;

/// Runs `f` on rank 0 of a two-rank cluster, with the AM credits of `pc` on both ranks.
fn with_pair(pc: PortalsConfig, f: impl FnOnce(&mut Node<Portals, Local>, &Cell<u64>)) {
    let ranks = Portals::cluster(2, 2 * MIB, pc).expect("cluster");
    let config = perf::spin_config().credits(pc.credits);
    perf::with_pair(ranks, config, f);
}

fn latency(c: &mut Criterion) {
    let mut g = perf::rtt_group(c, "portals", || {
        Portals::cluster(2, 4096, PortalsConfig::default()).expect("cluster")
    });
    with_pair(PortalsConfig::default(), |node, count| {
        g.bench_function(
            "portals/short",
            perf::round_trips(node, count, am::short_round_trip),
        );
        let data = vec![7u8; node.limits().max_medium];
        g.bench_function(
            BenchmarkId::new("portals/medium", data.len()),
            perf::round_trips(node, count, |n, c| am::medium_round_trip(n, c, &data)),
        );
    });
    g.finish();
}

fn bandwidth(c: &mut Criterion) {
    let mut g = perf::bw_group(c);
    with_pair(PortalsConfig::default(), |node, _count| {
        let data = vec![3u8; MIB];
        g.bench_function(
            BenchmarkId::new("portals/long", MIB),
            perf::stream(node, |n| n.request_long(PEER, LONG, &[], &data, 0)),
        );
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
        let pc = PortalsConfig::default().credits(credits);
        with_pair(pc, |node, _count| {
            g.bench_function(
                BenchmarkId::new("portals", name),
                perf::stream(node, |n| n.request_short(PEER, FLOOD_SHORT, &[])),
            );
        });
    }
    g.finish();
}

fn idle_poll(c: &mut Criterion) {
    perf::idle_poll(c, "portals", |ranks| {
        Portals::cluster(ranks, 4096, PortalsConfig::default()).expect("cluster")
    });
}

criterion_group!(benches, latency, bandwidth, hot, idle_poll);
criterion_main!(benches);
