//! The conformance suite over UDP on 127.0.0.1: on a clean network, and with the socket glue
//! dropping, duplicating and reordering datagrams (the protocol must hide all of it).

use transport_udp::{Udp, UdpConfig};

fn clean(ranks: u32, segment_size: usize) -> Vec<Udp> {
    Udp::cluster(ranks, segment_size, UdpConfig::default()).expect("UDP cluster")
}

fn lossy(ranks: u32, segment_size: usize) -> Vec<Udp> {
    let faults = am_core::FaultConfig::default()
        .seed(0x5eed + ranks as u64)
        .drop(0.1)
        .duplicate(0.01)
        .delay(0.05)
        .max_delay(4);
    let config = UdpConfig::default().faults(Some(faults));
    Udp::cluster(ranks, segment_size, config).expect("UDP cluster")
}

mod clean_network {
    am_core::conformance_tests!(super::clean);
}

mod lossy_network {
    am_core::conformance_tests!(super::lossy);
}

/// Large transfers on a clean network go through the batched paths (several datagrams per
/// system call each way, where the kernel does UDP GSO and GRO; with the largest datagrams,
/// one each): every datagram must arrive whole and authentic, so nothing is refused, and the
/// bytes land intact.
#[test]
fn batched_transfers_refuse_nothing() {
    for mtu in [1472, transport_udp::config::MAX_MTU] {
        batched_transfer(mtu);
    }
}

fn batched_transfer(mtu: usize) {
    use am_core::{Config, Handlers, Node};
    const SIZE: usize = 4 << 20;
    let mut config = UdpConfig::default();
    config.engine.mtu = mtu;
    let ranks = Udp::cluster(2, SIZE, config).expect("UDP cluster");
    let results = am_core::run_ranks(ranks, |t| {
        let mut node = Node::new(t, Handlers::local(), Config::default()).unwrap();
        let data: Vec<u8> = (0..SIZE).map(|i| (i * 13 + 5) as u8).collect();
        if node.rank() == 0 {
            node.put(1, 0, &data).unwrap();
        }
        node.barrier().unwrap();
        let landed = node.rank() == 0 || node.segment().to_vec() == data;
        (landed, node.transport().stats())
    });
    for (rank, (landed, stats)) in results.iter().enumerate() {
        assert!(
            landed,
            "mtu {mtu}, rank {rank}: the put did not land intact"
        );
        assert_eq!(stats.rejected(), 0, "mtu {mtu}, rank {rank}: {stats:?}");
        assert_eq!(
            stats.protocol_violations, 0,
            "mtu {mtu}, rank {rank}: {stats:?}"
        );
    }
}
