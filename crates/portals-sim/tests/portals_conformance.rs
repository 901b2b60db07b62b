//! The am-core conformance suite over the in-process Portals cluster (heap segments, shared
//! between the ranks' threads as processes share a mapping).

fn cluster(ranks: u32, segment_size: usize) -> Vec<portals_sim::Portals> {
    portals_sim::Portals::cluster(ranks, segment_size, portals_sim::PortalsConfig::default())
        .expect("portals cluster")
}

am_core::conformance_tests!(cluster);

// Atomics, puts and gets are the NIC's: the target does not poll while they complete, and
// a departed one is refused.
am_core::nic_rma_tests!(cluster);

mod dynamic {
    //! Receive buffers sized for dynamic credits (the suite's nodes use static ones, so the
    //! all-to-all may outrun the smaller budget: flow control then refuses and resends).
    fn cluster(ranks: u32, segment_size: usize) -> Vec<portals_sim::Portals> {
        let config = portals_sim::PortalsConfig::default().credits(am_core::Credits::DYNAMIC);
        portals_sim::Portals::cluster(ranks, segment_size, config).expect("portals cluster")
    }
    am_core::conformance_tests!(cluster);
}

mod tiny_buffers {
    //! Request buffers far below the budget: every check runs through "entry disabled",
    //! recovery and resending.
    fn cluster(ranks: u32, segment_size: usize) -> Vec<portals_sim::Portals> {
        let config = portals_sim::PortalsConfig::default()
            .with_request_buffer_bytes(Some(1024))
            .send_slots(16);
        portals_sim::Portals::cluster(ranks, segment_size, config).expect("portals cluster")
    }
    am_core::conformance_tests!(cluster);
}
