//! The ofi transport as a user runs it: RandomAccess (every remote mode) on libfabric's
//! `tcp` (`tcp;ofi_rxm`) and `shm` providers under `amrun` and MPICH's `mpiexec`, the
//! provider chosen by `FI_PROVIDER` or `AM_OFI_PROVIDER`, and a provider nobody has refused
//! with an error naming the ones found. A build without the `ofi` feature says how to get it.
//!
//! The mpiexec test needs MPICH: without it it prints a notice and passes, unless
//! `AM_REQUIRE_MPIEXEC=1` (as in CI), which makes it fail.

use std::process::Command;
use std::time::Duration;

mod common;
use common::{example, run_bounded, Run};

/// Safety net only: no job comes close to it.
const WATCHDOG: Duration = Duration::from_secs(120);

const AMRUN: &str = env!("CARGO_BIN_EXE_amrun");

/// Checks that `job` printed one verified RandomAccess row over ofi on 4 ranks with no
/// wrong word; `label` names the job in a failure.
#[cfg(feature = "ofi")]
fn check_verified(job: &Run, label: &str) {
    assert_eq!(job.code, 0, "{label}:\n{}\n{}", job.stdout, job.stderr);
    // amrun prefixes rank 0's line with "[0] "; mpiexec does not.
    let line = job.stdout.trim();
    let json = line.strip_prefix("[0] ").unwrap_or(line);
    let row: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{label}: {e}: {}", job.stdout));
    assert_eq!(row["transport"], "ofi", "{label}: {row}");
    assert_eq!(row["ranks"], 4, "{label}: {row}");
    assert_eq!(row["errors"], 0, "{label}: {row}");
    assert_eq!(row["verified"], true, "{label}: {row}");
}

#[cfg(feature = "ofi")]
const CASES: [(&str, &str, &str); 4] = [
    // (provider variable, provider, mode)
    ("FI_PROVIDER", "tcp", "bucketed"),
    ("FI_PROVIDER", "shm", "atomic"),
    ("AM_OFI_PROVIDER", "tcp", "atomic"),
    ("AM_OFI_PROVIDER", "shm", "fine"),
];

/// RandomAccess over ofi for every case of [`CASES`], each job started by `launcher` (a
/// command whose arguments run `random_access` on 4 ranks over ofi), and verified.
#[cfg(feature = "ofi")]
fn random_access_verifies_under(label: &str, launcher: impl Fn() -> Command) {
    for (var, provider, mode) in CASES {
        let mut cmd = launcher();
        cmd.arg(example("random_access"))
            .args(["--log2-table", "14", "--mode", mode, "--json"])
            .env_remove("FI_PROVIDER")
            .env_remove("AM_OFI_PROVIDER")
            .env(var, provider)
            // 4 ranks, and the other tests' jobs beside them, on 2 cores.
            .env("AM_WAIT", "block");
        let job = run_bounded(cmd, WATCHDOG);
        check_verified(&job, &format!("{label} {var}={provider} {mode}"));
    }
}

#[cfg(feature = "ofi")]
#[test]
fn random_access_verifies_on_tcp_and_shm_under_amrun() {
    random_access_verifies_under("amrun", || {
        let mut cmd = Command::new(AMRUN);
        cmd.args(["-n", "4", "--transport", "ofi", "--"])
            .env_remove("AM_TRANSPORT");
        cmd
    });
}

#[cfg(feature = "ofi")]
#[test]
fn random_access_verifies_on_tcp_and_shm_under_mpiexec() {
    use am_perf::launch::{have_mpiexec, mpiexec};
    if !have_mpiexec() {
        return;
    }
    random_access_verifies_under("mpiexec", || {
        let mut cmd = Command::new(mpiexec());
        cmd.args(["-n", "4"]).env("AM_TRANSPORT", "ofi");
        cmd
    });
}

/// A provider nobody has: every rank fails start-up with the typed error, which names the
/// providers libfabric found (all of them under `AM_OFI_PROVIDER`; under `FI_PROVIDER`,
/// which filters libfabric's own list, it says so), and the job fails.
#[cfg(feature = "ofi")]
#[test]
fn an_unknown_provider_fails_naming_the_providers_found() {
    for (var, expect) in [
        ("AM_OFI_PROVIDER", "tcp"),
        ("FI_PROVIDER", "FI_PROVIDER=\"no-such-provider\""),
    ] {
        let mut cmd = Command::new(AMRUN);
        cmd.args(["-n", "2", "--transport", "ofi", "--"])
            .arg(example("random_access"))
            .args(["--log2-table", "10"])
            .env_remove("AM_TRANSPORT")
            .env_remove("AM_OFI_PROVIDER")
            .env_remove("FI_PROVIDER")
            .env(var, "no-such-provider");
        let job = run_bounded(cmd, WATCHDOG);
        assert_ne!(job.code, 0, "{var}: {}", job.stdout);
        assert!(
            job.stderr.contains("matching \"no-such-provider\"") && job.stderr.contains(expect),
            "{var}: {}",
            job.stderr
        );
    }
}

/// Without the `ofi` feature, `--transport ofi` is refused with the way to build it.
#[cfg(not(feature = "ofi"))]
#[test]
fn without_the_feature_ofi_says_how_to_build_it() {
    let mut cmd = Command::new(example("random_access"));
    cmd.args(["--transport", "ofi", "--log2-table", "10"])
        .env_remove("AM_TRANSPORT");
    let job: Run = run_bounded(cmd, WATCHDOG);
    assert_ne!(job.code, 0, "{}", job.stdout);
    assert!(
        job.stderr.contains("--features ofi") && job.stderr.contains("libfabric"),
        "{}",
        job.stderr
    );
    let mut cmd = Command::new(AMRUN);
    cmd.args(["-n", "2", "--transport", "ofi", "--"])
        .arg(example("random_access"))
        .args(["--log2-table", "10"])
        .env_remove("AM_TRANSPORT");
    let job = run_bounded(cmd, WATCHDOG);
    assert_ne!(job.code, 0, "{}", job.stdout);
    assert!(job.stderr.contains("--features ofi"), "{}", job.stderr);
}
