//! The conformance suite over libfabric's providers that run without special hardware:
//! `tcp` (`tcp;ofi_rxm`), `shm`, and `sockets`, whose progress is the provider's own, so its
//! RMA and atomics need no attention from the target.
#![cfg(feature = "libfabric")]

use transport_ofi::{Ofi, OfiConfig};

fn on(provider: &str, ranks: u32, segment_size: usize) -> Vec<Ofi> {
    Ofi::cluster(ranks, segment_size, OfiConfig::default().provider(provider))
        .unwrap_or_else(|e| panic!("an ofi cluster on {provider}: {e}"))
}

fn tcp(ranks: u32, segment_size: usize) -> Vec<Ofi> {
    on("tcp", ranks, segment_size)
}

fn shm(ranks: u32, segment_size: usize) -> Vec<Ofi> {
    on("shm", ranks, segment_size)
}

fn sockets(ranks: u32, segment_size: usize) -> Vec<Ofi> {
    on("sockets", ranks, segment_size)
}

mod tcp {
    am_core::conformance_tests!(super::tcp);
}

mod shm {
    am_core::conformance_tests!(super::shm);
}

mod sockets {
    am_core::conformance_tests!(super::sockets);
}

/// Every provider the suite runs on applies atomics itself: the core's AM path is only the
/// fallback for providers that do not validate every operation.
#[test]
fn the_providers_here_apply_atomics_themselves() {
    for provider in ["tcp", "shm", "sockets"] {
        let t = on(provider, 1, 4096);
        assert!(t[0].native_atomics(), "{provider}");
        assert!(t[0].provider().contains(provider), "{}", t[0].provider());
    }
}

/// `AM_OFI_ATOMICS=am`: the same provider's atomics go through the core's AM path.
#[test]
fn atomics_as_ams_when_asked() {
    let t = Ofi::cluster(
        1,
        4096,
        OfiConfig::default().provider("tcp").provider_atomics(false),
    )
    .expect("a tcp cluster");
    assert!(!t[0].native_atomics());
    assert!(!am_core::Transport::capabilities(&t[0]).atomics);
}

mod tcp_atomics_as_ams {
    fn tcp(ranks: u32, segment_size: usize) -> Vec<transport_ofi::Ofi> {
        super::Ofi::cluster(
            ranks,
            segment_size,
            super::OfiConfig::default()
                .provider("tcp")
                .provider_atomics(false),
        )
        .expect("a tcp cluster")
    }

    #[test]
    fn atomics_every_op_and_width() {
        am_core::conformance::atomics_every_op_and_width(&tcp);
    }

    #[test]
    fn atomics_from_all_ranks_add_up() {
        am_core::conformance::atomics_from_all_ranks_add_up(&tcp);
    }

    #[test]
    fn atomics_on_every_word_type() {
        am_core::conformance::atomics_on_every_word_type(&tcp);
    }
}

/// A provider nobody has is a typed error that names the providers found.
#[test]
fn an_unknown_provider_names_the_ones_found() {
    let e = Ofi::cluster(1, 4096, OfiConfig::default().provider("no-such-provider"))
        .expect_err("no such provider");
    let text = e.to_string();
    assert!(
        matches!(e, transport_ofi::OfiTransportError::NoProvider { .. }),
        "{text}"
    );
    assert!(
        text.contains("no-such-provider") && text.contains("tcp"),
        "{text}"
    );
}
