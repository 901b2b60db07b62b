//! The `shm` endpoints of one process kept open for each other: an endpoint shut down while
//! another of the process is open stays open (its region in `/dev/shm` too), and the last to
//! close releases every one kept. Alone in its test binary, so that no other test's `shm`
//! endpoint is open in this process meanwhile.
#![cfg(feature = "libfabric")]

use std::path::PathBuf;

use am_ofi::{Endpoint, EndpointConfig, Interface};
use am_shm::Segment;

/// The regions of this test's endpoints in `/dev/shm`, removed at the end whatever happens
/// (a failed check leaves its endpoints kept, with their files, until the process ends).
struct Regions(Vec<PathBuf>);

impl Regions {
    fn exist(&self) -> Vec<bool> {
        self.0.iter().map(|p| p.exists()).collect()
    }
}

impl Drop for Regions {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn open(iface: &Interface, name: &str) -> Endpoint {
    Endpoint::open(
        iface,
        Segment::heap(0, 4096).expect("a segment"),
        EndpointConfig {
            recv_slots: 8,
            recv_size: 1024,
            send_slots: 8,
            send_size: 1024,
            stage_slots: 4,
            stage_size: 4096,
            wait_fd: false,
            shm_name: Some(name.to_owned()),
        },
    )
    .expect("an shm endpoint")
}

/// Catches the last `shm` endpoint of a process closing without closing the endpoints kept
/// open for its same-process peers (their regions in `/dev/shm` and everything lent to the
/// provider would stay until the process ends, one set per closed endpoint, and a later
/// endpoint of the same name would find the old region), and an endpoint closed while
/// another is open that is not kept (its region gone under a peer that still reaches it).
/// Both ways of closing: `shutdown`, and a drop without one.
#[test]
fn the_last_shm_endpoint_closing_releases_those_kept_for_its_peers() {
    let Some(iface) = Interface::find(Some("shm")).expect("the provider lookup") else {
        eprintln!("no shm provider: nothing to check");
        return;
    };
    let pid = std::process::id();
    let names: Vec<String> = (0..3).map(|i| format!("am-test-{pid}-kept-{i}")).collect();
    let regions = Regions(
        names
            .iter()
            .map(|n| PathBuf::from("/dev/shm").join(n))
            .collect(),
    );
    let mut eps: Vec<Endpoint> = names.iter().map(|n| open(&iface, n)).collect();
    assert_eq!(
        regions.exist(),
        [true; 3],
        "the premise: a region per endpoint"
    );
    let mut last = eps.pop().unwrap();
    let mut first = eps.remove(0);
    first.shutdown();
    drop(first);
    drop(eps);
    assert_eq!(
        regions.exist(),
        [true; 3],
        "closed while another of the process is open: kept"
    );
    last.shutdown();
    assert_eq!(
        regions.exist(),
        [false; 3],
        "the last closed: every kept endpoint closed with it"
    );
    drop(last);

    // Again, the last closed by its drop alone, with names used before.
    let mut eps: Vec<Endpoint> = names[..2].iter().map(|n| open(&iface, n)).collect();
    assert_eq!(regions.exist(), [true, true, false]);
    drop(eps.remove(0));
    assert_eq!(regions.exist(), [true, true, false]);
    drop(eps);
    assert_eq!(regions.exist(), [false; 3]);
}
