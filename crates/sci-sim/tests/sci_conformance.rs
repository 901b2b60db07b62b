//! The am-core conformance suite over the in-process SCI cluster (real /dev/shm segments).

fn cluster(ranks: u32, segment_size: usize) -> Vec<sci_sim::Sci> {
    sci_sim::Sci::cluster(ranks, segment_size, sci_sim::SciConfig::default()).expect("sci cluster")
}

am_core::conformance_tests!(cluster);

/// Atomics are the NIC's: the target does not poll while they complete.
#[test]
fn atomics_need_no_target_progress() {
    am_core::conformance::atomics_need_no_target_progress(&cluster);
}

/// Puts and gets are the NIC's: the target does not poll while they complete.
#[test]
fn rma_needs_no_target_progress() {
    am_core::conformance::rma_needs_no_target_progress(&cluster);
}

/// A departed rank's memory is refused by the NIC itself.
#[test]
fn rma_to_a_departed_rank_is_refused() {
    am_core::conformance::rma_to_a_departed_rank_is_refused(&cluster);
}

mod dma {
    //! The same suite with every Long through the DMA engine and one-copy Mediums.
    fn cluster(ranks: u32, segment_size: usize) -> Vec<sci_sim::Sci> {
        let config = sci_sim::SciConfig {
            dma_threshold: 1,
            medium: sci_sim::MediumStrategy::OneCopy,
            ..sci_sim::SciConfig::default()
        };
        sci_sim::Sci::cluster(ranks, segment_size, config).expect("sci cluster")
    }
    am_core::conformance_tests!(cluster);
}
