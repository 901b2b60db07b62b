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

    use am_core::{AmKind, Config, HandlerId, Handlers, Node, TryRequestError, WaitMode};
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::sync::Barrier;
    use std::time::{Duration, Instant};

    const MEDIUM: HandlerId = HandlerId(1);

    /// Under dynamic credits, a job whose whole receive budget is more than
    /// `WHOLE_BUDGET_BYTES` gets request buffers that hold every peer's initial credits as
    /// heads, not as whole messages: 39 peers that send two of the largest Mediums (32 KiB
    /// messages here, so that 40 ranks are such a job) each on those credits, while their
    /// target does not poll, fill them. The puts that find no room are refused (flow
    /// control), the core sends them again once the target polls, and every message arrives
    /// once, in order.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn mediums_beyond_the_heads_are_refused_then_delivered_once() {
        const RANKS: u32 = 40;
        const PER_PEER: u32 = 6;
        const MAX_MESSAGE: usize = 32 << 10;
        let config = portals_sim::PortalsConfig::default()
            .credits(am_core::Credits::DYNAMIC)
            .max_message(MAX_MESSAGE)
            .send_slots(16);
        let ranks = portals_sim::Portals::cluster(RANKS, 4096, config).expect("portals cluster");
        assert!(
            ranks[0].receive_buffer_bytes() < (RANKS as u64 - 1) * 2 * MAX_MESSAGE as u64,
            "the buffers hold less than the peers' initial Mediums"
        );
        let sent = Barrier::new(RANKS as usize);
        let case = "mediums_beyond_the_heads_are_refused_then_delivered_once";
        let refused = am_core::conformance::run_watched(case, ranks, |t| {
            let got: Rc<RefCell<Vec<Vec<u32>>>> = Rc::default();
            got.borrow_mut().resize(RANKS as usize, Vec::new());
            let mut h = Handlers::local();
            let g = got.clone();
            h.request(MEDIUM, "medium", AmKind::Medium, move |m, _t| {
                let k = m.args()[0];
                assert!(m.payload().iter().all(|&b| b == k as u8 ^ m.src() as u8));
                g.borrow_mut()[m.src() as usize].push(k);
            })
            .unwrap();
            let config = Config::default().wait_mode(WaitMode::Block);
            let mut node = Node::new(t, h, config).unwrap();
            assert_eq!(node.config().credits, Some(am_core::Credits::DYNAMIC));
            let me = node.rank();
            let big = node.max_medium();
            let payload = |k: u32| vec![k as u8 ^ me as u8; big];
            let mut k = 0;
            if me != 0 {
                // The two initial credits, without polling (rank 0 does not poll yet).
                while k < 2 {
                    match node.try_request_medium(0, MEDIUM, &[k], &payload(k)) {
                        Ok(()) => k += 1,
                        Err(TryRequestError::WouldBlock) => break,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            sent.wait();
            if me != 0 {
                while k < PER_PEER {
                    node.request_medium(0, MEDIUM, &[k], &payload(k)).unwrap();
                    k += 1;
                }
            } else {
                let deadline = Instant::now() + Duration::from_secs(60);
                let want = PER_PEER as usize * (RANKS as usize - 1);
                node.wait_until(|| {
                    assert!(Instant::now() < deadline, "not all arrived");
                    got.borrow().iter().map(Vec::len).sum::<usize>() == want
                })
                .unwrap();
                for (src, from) in got.borrow().iter().enumerate().skip(1) {
                    assert_eq!(*from, (0..PER_PEER).collect::<Vec<_>>(), "from {src}");
                }
            }
            node.quiesce().unwrap();
            node.barrier().unwrap();
            node.transport().stats().refused
        });
        assert!(
            refused.iter().sum::<u64>() > 0,
            "flow control was exercised"
        );
    }
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
