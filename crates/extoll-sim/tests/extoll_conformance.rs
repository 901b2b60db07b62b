//! The am-core conformance suite over the in-process EXTOLL cluster (segments in heap memory,
//! shared by the threads), with both packet sizes and both Medium paths.

use extoll_sim::{Extoll, ExtollConfig, MediumPath};

fn with(config: ExtollConfig) -> impl Fn(u32, usize) -> Vec<Extoll> {
    move |ranks, segment_size| Extoll::cluster(ranks, segment_size, config).expect("extoll cluster")
}

/// The default: 64-byte packets, the default Medium crossover (`extoll_sim::DEFAULT_RMA_FROM`).
fn cluster(ranks: u32, segment_size: usize) -> Vec<Extoll> {
    with(ExtollConfig::default())(ranks, segment_size)
}

am_core::conformance_tests!(cluster);

// Atomics, puts and gets are the NIC's: the target does not poll while they complete, and
// a departed one is refused.
am_core::nic_rma_tests!(cluster);

mod velo_128 {
    //! Every Medium over VELO, in 128-byte packets.
    fn cluster(ranks: u32, segment_size: usize) -> Vec<super::Extoll> {
        let config = super::ExtollConfig::default()
            .packet_size(128)
            .medium(super::MediumPath::Velo);
        super::with(config)(ranks, segment_size)
    }
    am_core::conformance_tests!(cluster);
}

mod rma_64 {
    //! Every Medium RMA-buffered (pscom's plugin), with the seed geometry's 64-byte packets
    //! and few buffers so back-pressure and acks are exercised.
    fn cluster(ranks: u32, segment_size: usize) -> Vec<super::Extoll> {
        let config = super::ExtollConfig::default()
            .medium(super::MediumPath::Rma)
            .rma_buffers(2);
        super::with(config)(ranks, segment_size)
    }
    am_core::conformance_tests!(cluster);
}
