//! The conformance suite over UDP on 127.0.0.1: on a clean network, and with the socket glue
//! dropping, duplicating and reordering datagrams (the protocol must hide all of it).

use transport_udp::{Udp, UdpConfig};

fn clean(ranks: u32, segment_size: usize) -> Vec<Udp> {
    Udp::cluster(ranks, segment_size, UdpConfig::default()).expect("UDP cluster")
}

fn lossy(ranks: u32, segment_size: usize) -> Vec<Udp> {
    let config = UdpConfig {
        faults: Some(am_core::FaultConfig {
            seed: 0x5eed + ranks as u64,
            drop: 0.1,
            duplicate: 0.01,
            delay: 0.05,
            max_delay: 4,
        }),
        ..UdpConfig::default()
    };
    Udp::cluster(ranks, segment_size, config).expect("UDP cluster")
}

mod clean_network {
    am_core::conformance_tests!(super::clean);
}

mod lossy_network {
    am_core::conformance_tests!(super::lossy);
}
