//! A rank dies while a peer has operations pending on it (calls, and the barrier of a job of
//! two), on every process transport and by every death a process can die (panic, abort,
//! `exit` without `Node::exit`, SIGKILL), under amrun's launcher: every pending operation
//! fails with a typed error naming the dead rank (or the job's abort), promptly, and the job
//! ends (`am_perf::rank::pending_scenario`).
#![cfg(not(miri))]

use std::path::Path;
use std::time::Duration;

use am_launch::Launcher;
use am_perf::launch::{fresh_dir, run_job_with};

const DEATHS: [&str; 4] = ["panic", "abort", "exit", "kill"];

/// Runs the scenario with rank 1 dying by each of [`DEATHS`], and checks that the survivor
/// reported every operation failed within `within` of the death. The launcher's grace is
/// 30 s, so a survivor that hung (rather than being ended by the launcher) shows as a
/// missing report, not as a pass.
fn every_death(bin: &str, transport: &str, env: &[(&str, &str)], within: Duration) {
    for how in DEATHS {
        let dir = fresh_dir(&format!("{transport}-pending-{how}"));
        let launcher = Launcher::new(2, bin).grace(Duration::from_secs(30));
        let args = ["pending", dir.to_str().expect("utf-8 path"), how];
        let code = run_job_with(launcher, transport, &args, env);
        assert_ne!(
            code, 0,
            "{transport}, {how}: the victim's death fails the job"
        );
        let report = read(&dir.join("failed-0")).unwrap_or_else(|| {
            panic!("{transport}, {how}: rank 0 never saw its operations fail (code {code})")
        });
        let (took, errors) = report.split_once(' ').expect("`<ms> <errors>`");
        let took = Duration::from_millis(took.parse().expect("milliseconds"));
        assert!(
            took < within,
            "{transport}, {how}: the operations took {took:?} to fail ({errors})"
        );
        eprintln!("pending: {transport}, {how}: failed {took:?} after the death: {errors}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

#[test]
fn sci() {
    every_death(
        env!("CARGO_BIN_EXE_sci-rank-test"),
        "sci",
        &[],
        Duration::from_secs(3),
    );
}

#[test]
fn extoll() {
    every_death(
        env!("CARGO_BIN_EXE_extoll-rank-test"),
        "extoll",
        &[],
        Duration::from_secs(3),
    );
}

#[test]
fn portals() {
    every_death(
        env!("CARGO_BIN_EXE_portals-rank-test"),
        "portals",
        &[],
        Duration::from_secs(3),
    );
}

/// A dead udp peer is noticed by its silence: a short peer timeout keeps the test short.
#[test]
fn udp() {
    every_death(
        env!("CARGO_BIN_EXE_udp-rank-test"),
        "udp",
        &[("AM_PEER_TIMEOUT_MS", "1000")],
        Duration::from_secs(4),
    );
}

#[cfg(feature = "ofi")]
#[test]
fn ofi() {
    for provider in ["tcp", "shm"] {
        every_death(
            env!("CARGO_BIN_EXE_ofi-rank-test"),
            "ofi",
            &[("FI_PROVIDER", provider)],
            Duration::from_secs(4),
        );
    }
}
