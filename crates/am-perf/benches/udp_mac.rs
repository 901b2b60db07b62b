//! What udp's datagram MAC costs per byte: `DatagramKey::seal` (the sender) and `verify`
//! (the receiver), AES-128-GCM with the whole datagram as associated data, at the default
//! Ethernet-sized datagram (1472 bytes) and the largest (65507), beside a `memcpy` of the
//! same bytes. Each side of a bulk put pays one pass of the MAC on its own core, on top of
//! the copies the kernel makes.
//!
//! Run: `cargo bench -p am-perf --bench udp_mac`.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use transport_udp::wire::{Authenticator, JobKey, OVERHEAD};

fn mac(c: &mut Criterion) {
    let auth = Authenticator::new(&JobKey::from_bytes([7; 32]), "bench");
    let key = auth.datagram_key(0, 1, 1, 2);
    let mut g = c.benchmark_group("udp_mac");
    for size in [1472usize, 65507] {
        assert!(size >= OVERHEAD);
        g.throughput(Throughput::Bytes(size as u64));
        // One datagram sealed again and again: its nonce (the packet number in the header)
        // repeats, which costs the same as a fresh one and is harmless in a benchmark.
        let mut dgram = vec![0x5a; size];
        g.bench_with_input(BenchmarkId::new("seal", size), &size, |b, _| {
            b.iter(|| key.seal(black_box(&mut dgram)))
        });
        key.seal(&mut dgram);
        g.bench_with_input(BenchmarkId::new("verify", size), &size, |b, _| {
            b.iter(|| assert!(key.verify(black_box(&dgram))))
        });
        let src = vec![0x5a; size];
        let mut dst = vec![0u8; size];
        g.bench_with_input(BenchmarkId::new("memcpy", size), &size, |b, _| {
            b.iter(|| dst.copy_from_slice(black_box(&src)))
        });
    }
    g.finish();
}

criterion_group!(benches, mac);
criterion_main!(benches);
