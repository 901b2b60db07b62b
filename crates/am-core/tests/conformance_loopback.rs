//! The conformance suite on Loopback, with a roomy device and with a tiny one (so that replies
//! meet device back-pressure and go through the core's pending queue).

use am_core::{Loopback, LoopbackConfig};

fn roomy(ranks: u32, segment_size: usize) -> Vec<Loopback> {
    Loopback::cluster(ranks, LoopbackConfig::default().segment_size(segment_size))
}

fn tiny(ranks: u32, segment_size: usize) -> Vec<Loopback> {
    let config = LoopbackConfig::default()
        .capacity(2)
        .segment_size(segment_size)
        .max_medium(1024)
        .max_long(4096);
    Loopback::cluster(ranks, config)
}

mod roomy_device {
    am_core::conformance_tests!(super::roomy);
}

mod tiny_device {
    am_core::conformance_tests!(super::tiny);
}

mod by_messages;

// Loopback's atomics, puts and gets are copies into the target's memory: the target does
// not poll while they complete, and a departed one is refused.
am_core::nic_rma_tests!(roomy);

/// Loopback without its own atomics, puts and gets: the suite's atomic and RMA cases then
/// run the core's system-message path (the one UDP takes), against a target that serves
/// them in its progress.
mod rma_by_message {
    use super::by_messages::NoDirectRma;

    fn cluster(ranks: u32, segment_size: usize) -> Vec<NoDirectRma> {
        super::tiny(ranks, segment_size)
            .into_iter()
            .map(NoDirectRma)
            .collect()
    }

    #[test]
    fn segment_to_segment() {
        am_core::conformance::segment_to_segment(&cluster);
    }

    #[test]
    fn segments_by_id_and_offset() {
        am_core::conformance::segments_by_id_and_offset(&cluster);
    }

    #[test]
    fn atomics_every_op_and_width() {
        am_core::conformance::atomics_every_op_and_width(&cluster);
    }

    #[test]
    fn atomics_from_all_ranks_add_up() {
        am_core::conformance::atomics_from_all_ranks_add_up(&cluster);
    }

    #[test]
    fn atomics_on_every_word_type() {
        am_core::conformance::atomics_on_every_word_type(&cluster);
    }

    #[test]
    fn put_signal_hands_off() {
        am_core::conformance::put_signal_hands_off(&cluster);
    }

    #[test]
    fn put_regions_land_in_place() {
        am_core::conformance::put_regions_land_in_place(&cluster);
    }

    #[test]
    fn put_get() {
        am_core::conformance::put_get(&cluster);
    }

    #[test]
    fn rma_sizes_and_edges() {
        am_core::conformance::rma_sizes_and_edges(&cluster);
    }
}
