//! Start-up under Open MPI's `mpirun`, whose ranks get a PMIx server as their key-value
//! store: the probe's all-gather, and RandomAccess on every process transport and on the
//! default one, with no extra settings.
//!
//! These tests need Debian's Open MPI (`mpirun.openmpi`, with libpmix). Without it they
//! print a notice and skip, unless `AM_REQUIRE_OPENMPI=1` (CI sets it after installing
//! Open MPI), in which case they fail.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{example, random_access_on_every_process_transport, run_bounded, Run};

/// Safety net only: no job comes close to it.
const WATCHDOG: Duration = Duration::from_secs(120);

const AMPROBE: &str = env!("CARGO_BIN_EXE_amprobe");

fn mpirun() -> Option<&'static str> {
    let found = Command::new("mpirun.openmpi")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some("mpirun.openmpi");
    }
    let required = std::env::var("AM_REQUIRE_OPENMPI").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "mpirun.openmpi is not installed and AM_REQUIRE_OPENMPI=1: apt-get install openmpi-bin"
    );
    eprintln!("SKIPPED: mpirun.openmpi is not installed (apt-get install openmpi-bin)");
    None
}

/// `mpirun.openmpi -n N <program> <args>`, bounded by the watchdog.
fn run(mpirun: &str, n: u32, program: &std::path::Path, args: &[&str]) -> Run {
    let mut cmd = Command::new(mpirun);
    cmd.args(["--oversubscribe", "-n", &n.to_string()])
        .arg(program)
        .args(args)
        // Open MPI refuses root unless told; CI runs as root.
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("AM_TRANSPORT");
    run_bounded(cmd, WATCHDOG)
}

#[test]
fn ranks_share_a_job_id_and_a_key_value_store() {
    let Some(mpirun) = mpirun() else { return };
    let job = run(mpirun, 3, std::path::Path::new(AMPROBE), &[]);
    assert_eq!(job.code, 0, "{}\n{}", job.stdout, job.stderr);
    let banners: Vec<&str> = job
        .stdout
        .lines()
        .filter(|l| l.starts_with("rank="))
        .collect();
    assert_eq!(banners.len(), 3, "{}", job.stdout);
    assert!(
        banners.iter().all(|b| b.contains("launcher=OpenMpi")),
        "{banners:?}"
    );
    let jobs: BTreeSet<&str> = banners
        .iter()
        .filter_map(|b| b.split(' ').find_map(|t| t.strip_prefix("job=")))
        .collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let ok = job.stdout.lines().filter(|l| *l == "kvs=ok").count();
    assert_eq!(ok, 3, "{}\n{}", job.stdout, job.stderr);
}

#[test]
fn random_access_runs_on_every_process_transport() {
    let Some(mpirun) = mpirun() else { return };
    random_access_on_every_process_transport("mpirun.openmpi", |args| {
        run(mpirun, 4, &example("random_access"), args)
    });
}

/// mpirun killed by SIGKILL while 4 ranks flood each other on sci: every rank ends within
/// two seconds, and no `/dev/shm` file of the job is left. Catches ranks that outlive their
/// launcher under PMIx, whose connection to the server is libpmix's, not the rank's.
#[test]
fn ranks_end_when_mpirun_is_killed_mid_flood() {
    let Some(mpirun) = mpirun() else { return };
    let mut cmd = Command::new(mpirun);
    cmd.args(["--oversubscribe", "-n", "4"])
        .args(["-x", "AM_TEST_MARK", "-x", "AM_TRANSPORT"])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    common::ranks_end_when_launcher_is_killed(cmd, "mpirun");
}
