//! The am-core conformance suite over the in-process SCI cluster (segments in heap memory, shared by the threads).

fn cluster(ranks: u32, segment_size: usize) -> Vec<sci_sim::Sci> {
    sci_sim::Sci::cluster(ranks, segment_size, sci_sim::SciConfig::default()).expect("sci cluster")
}

am_core::conformance_tests!(cluster);

// Atomics, puts and gets are the NIC's: the target does not poll while they complete, and
// a departed one is refused.
am_core::nic_rma_tests!(cluster);

mod dma {
    //! The same suite with every Long through the DMA engine and one-copy Mediums.
    fn cluster(ranks: u32, segment_size: usize) -> Vec<sci_sim::Sci> {
        let config = sci_sim::SciConfig::default()
            .dma_threshold(1)
            .medium(sci_sim::MediumStrategy::OneCopy);
        sci_sim::Sci::cluster(ranks, segment_size, config).expect("sci cluster")
    }
    am_core::conformance_tests!(cluster);
}

mod bank {
    //! The same suite through a bank per receiver (dynamic credits' layout): every message
    //! claims its slot in the receiver's one ring.
    fn cluster(ranks: u32, segment_size: usize) -> Vec<sci_sim::Sci> {
        let config = sci_sim::SciConfig::default().bank(sci_sim::DEFAULT_BANK);
        sci_sim::Sci::cluster(ranks, segment_size, config).expect("sci cluster")
    }
    am_core::conformance_tests!(cluster);
    am_core::nic_rma_tests!(cluster);
}

mod small_bank {
    //! A bank of 8 slots for every sender of the job: floods and the all-to-all run into a
    //! full bank (back-pressure) all the time, and nothing may be lost or reordered.
    fn cluster(ranks: u32, segment_size: usize) -> Vec<sci_sim::Sci> {
        let config = sci_sim::SciConfig::default().bank(8);
        sci_sim::Sci::cluster(ranks, segment_size, config).expect("sci cluster")
    }
    am_core::conformance_tests!(cluster);
}
