//! The am-core conformance suite over the in-process Portals cluster (heap segments, shared
//! between the ranks' threads as processes share a mapping).

fn cluster(ranks: u32, segment_size: usize) -> Vec<portals_sim::Portals> {
    portals_sim::Portals::cluster(ranks, segment_size, portals_sim::PortalsConfig::default())
        .expect("portals cluster")
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

mod dynamic {
    //! Receive buffers sized for dynamic credits (the suite's nodes use static ones, so the
    //! all-to-all may outrun the smaller budget: flow control then refuses and resends).
    fn cluster(ranks: u32, segment_size: usize) -> Vec<portals_sim::Portals> {
        let config = portals_sim::PortalsConfig {
            credits: am_core::Credits::DYNAMIC,
            ..portals_sim::PortalsConfig::default()
        };
        portals_sim::Portals::cluster(ranks, segment_size, config).expect("portals cluster")
    }
    am_core::conformance_tests!(cluster);
}

mod tiny_buffers {
    //! Request buffers far below the budget: every check runs through "entry disabled",
    //! recovery and resending.
    fn cluster(ranks: u32, segment_size: usize) -> Vec<portals_sim::Portals> {
        let config = portals_sim::PortalsConfig {
            request_buffer_bytes: Some(1024),
            send_slots: 16,
            ..portals_sim::PortalsConfig::default()
        };
        portals_sim::Portals::cluster(ranks, segment_size, config).expect("portals cluster")
    }
    am_core::conformance_tests!(cluster);
}
