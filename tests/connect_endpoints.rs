//! `connect_endpoints`: the endpoints of one process start together, fencing in a store they
//! share, so one that fails to start (an error or a panic) must fail the others' start-ups
//! instead of leaving them waiting for it, and the error reported is the cause (the endpoint
//! that failed first), not the failures it caused.
//!
//! Each job is one process of 3 endpoints on udp (sockets only: nothing in `/dev/shm`), whose
//! endpoints rendezvous through the store `split_endpoints` gives them; one endpoint's share is
//! wrapped so that its first put fails or panics.

use std::error::Error as _;
use std::time::Duration;

use amnet::am_bootstrap::{self, BootstrapError, JobInfo, KeyValueStore, LauncherKind};
use amnet::{connect_endpoints, JobError, TransportKind};

mod common;
use common::within;

/// Safety net only: a job that works ends in well under a second.
const WATCHDOG: Duration = Duration::from_secs(30);

const ENDPOINTS: u32 = 3;

/// What the refused endpoint's error says.
const REFUSED: &str = "the test refuses this endpoint's put";

/// An endpoint's share of the store whose first put fails (or panics): its transport's
/// start-up fails before it reaches the fence its siblings wait in.
struct Refusing {
    share: Box<dyn KeyValueStore + Send>,
    panics: bool,
}

impl KeyValueStore for Refusing {
    fn put(&mut self, _key: &str, _value: &str) -> Result<(), BootstrapError> {
        if self.panics {
            panic!("{REFUSED}");
        }
        Err(BootstrapError::Inconsistent {
            detail: REFUSED.to_owned(),
        })
    }
    fn fence(&mut self) -> Result<(), BootstrapError> {
        self.share.fence()
    }
    fn get(&mut self, key: &str) -> Result<String, BootstrapError> {
        self.share.get(key)
    }
    fn abort(&mut self, code: i32, message: &str) -> Result<(), BootstrapError> {
        self.share.abort(code, message)
    }
}

/// The endpoints' infos of a job of one process, endpoint `refused`'s share refusing.
fn infos(refused: usize, panics: bool) -> Vec<JobInfo> {
    let info = JobInfo {
        rank: 0,
        size: 1,
        job_id: format!("connect-endpoints-{}", std::process::id()),
        transport: None,
        launcher: LauncherKind::Singleton,
        kvs: None,
    };
    let mut infos = am_bootstrap::split_endpoints(info, ENDPOINTS).expect("split");
    let share = infos[refused].kvs.take().expect("a shared store");
    infos[refused].kvs = Some(Box::new(Refusing { share, panics }));
    infos
}

/// The error and all its sources, as text.
fn chain(e: &JobError) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// One endpoint fails to start: its siblings, already waiting in the shared fence, fail too
/// and `connect_endpoints` returns. Catches the failed endpoint's share marked as connected
/// (so kept, not dropped): its siblings then waited in the fence for ever.
#[test]
fn a_failed_endpoint_fails_its_siblings_start_ups() {
    let result = within(WATCHDOG, || {
        let mut infos = infos(0, false);
        connect_endpoints(TransportKind::Udp, &mut infos, 1 << 16).map(|t| t.len())
    });
    let e = result.expect_err("an endpoint refused, yet the job connected");
    assert!(chain(&e).contains(REFUSED), "{}", chain(&e));
}

/// Whichever endpoint fails first, its error is the one reported, not a sibling's "another
/// endpoint left" that it caused. The refusing endpoint is tried at every index, so that
/// neither the first nor the last error by index is the cause each time. Catches the errors
/// chosen by endpoint index instead of the order in which the endpoints failed.
#[test]
fn the_endpoint_that_failed_first_is_the_error_reported() {
    for refused in 0..ENDPOINTS as usize {
        let result = within(WATCHDOG, move || {
            let mut infos = infos(refused, false);
            connect_endpoints(TransportKind::Udp, &mut infos, 1 << 16).map(|t| t.len())
        });
        let e = result.expect_err("an endpoint refused, yet the job connected");
        let text = chain(&e);
        assert!(
            text.contains(REFUSED) && !text.contains("left before"),
            "endpoint {refused} refused, but the error reported is: {text}"
        );
    }
}

/// An endpoint whose start-up panics: its siblings' start-ups fail (its share goes as its
/// thread unwinds) and the panic is raised again from `connect_endpoints` once all have
/// ended. Catches the guard that drops a failed endpoint's share missing on a panic (the
/// siblings then waited for ever) and a panic turned into a hang or swallowed.
#[test]
fn a_panicking_endpoint_fails_its_siblings_and_its_panic_is_raised() {
    let caught = within(WATCHDOG, || {
        let mut infos = infos(1, true);
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            connect_endpoints(TransportKind::Udp, &mut infos, 1 << 16).map(|t| t.len())
        }))
    });
    let payload = match caught {
        Err(payload) => payload,
        Ok(result) => panic!("the endpoint's panic was not raised again: {result:?}"),
    };
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    assert!(message.contains(REFUSED), "another panic: {message:?}");
}
