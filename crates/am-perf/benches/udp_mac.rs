//! What udp's datagram encryption and MAC cost per byte: `DatagramKey::seal` (the sender) and
//! `open` (the receiver), AES-128-GCM with the payload encrypted and the header as associated
//! data, at the default Ethernet-sized datagram (1472 bytes) and the largest (65507), beside a
//! `memcpy` of the same bytes. Each side of a bulk put pays one pass on its own core, on top of
//! the copies the kernel makes.
//!
//! Run: `cargo bench -p am-perf --bench udp_mac`.

#![allow(missing_docs)] // criterion_group! generates undocumented functions

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
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
        // Each `open` decrypts a fresh copy of the sealed datagram (the copy is not timed).
        g.bench_with_input(BenchmarkId::new("open", size), &size, |b, _| {
            b.iter_batched_ref(
                || dgram.clone(),
                |d| assert!(key.open(black_box(d))),
                BatchSize::SmallInput,
            )
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
