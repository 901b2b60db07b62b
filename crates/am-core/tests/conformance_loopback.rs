//! The conformance suite on Loopback, with a roomy device and with a tiny one (so that replies
//! meet device back-pressure and go through the core's pending queue).

use am_core::{Loopback, LoopbackConfig};

fn roomy(ranks: u32, segment_size: usize) -> Vec<Loopback> {
    Loopback::cluster(
        ranks,
        LoopbackConfig {
            segment_size,
            ..LoopbackConfig::default()
        },
    )
}

fn tiny(ranks: u32, segment_size: usize) -> Vec<Loopback> {
    Loopback::cluster(
        ranks,
        LoopbackConfig {
            capacity: 2,
            segment_size,
            max_medium: 1024,
            max_long: 4096,
        },
    )
}

mod roomy_device {
    am_core::conformance_tests!(super::roomy);
}

mod tiny_device {
    am_core::conformance_tests!(super::tiny);
}
