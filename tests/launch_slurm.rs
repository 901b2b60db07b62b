//! Start-up under Slurm's `srun`, with `--mpi=pmi2` (PMI-2) and `--mpi=pmix` (PMIx): the
//! probe's all-gather, and RandomAccess on every process transport and on the default one,
//! with no extra settings.
//!
//! These tests need a Slurm cluster `srun` can reach (`SLURM_CONF`; CI starts a single node
//! on localhost with `.ci/slurm up`). Without one they print a notice and skip, unless
//! `AM_REQUIRE_SLURM=1`, in which case they fail.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{example, random_access_on_every_process_transport, run_bounded, Run};

/// Safety net only: no job comes close to it.
const WATCHDOG: Duration = Duration::from_secs(120);

const AMPROBE: &str = env!("CARGO_BIN_EXE_amprobe");

/// True if a Slurm partition is up for `srun`.
fn slurm() -> bool {
    let up = Command::new("sinfo")
        .args(["-h", "-o", "%a"])
        .stderr(Stdio::null())
        .output()
        .is_ok_and(|o| o.status.success() && String::from_utf8_lossy(&o.stdout).contains("up"));
    if up {
        return true;
    }
    let required = std::env::var("AM_REQUIRE_SLURM").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "no Slurm partition is up and AM_REQUIRE_SLURM=1: start one (.ci/slurm up DIR) and export SLURM_CONF"
    );
    eprintln!("SKIPPED: no Slurm cluster (sinfo shows no partition up)");
    false
}

/// `srun --mpi=MPI -n N <program> <args>`, bounded by the watchdog.
fn run(mpi: &str, n: u32, program: &std::path::Path, args: &[&str]) -> Run {
    let mut cmd = Command::new("srun");
    cmd.args([
        &format!("--mpi={mpi}"),
        "--overcommit",
        "-n",
        &n.to_string(),
    ])
    .arg(program)
    .args(args)
    .env_remove("AM_TRANSPORT");
    run_bounded(cmd, WATCHDOG)
}

#[test]
fn ranks_share_a_job_id_and_a_key_value_store() {
    if !slurm() {
        return;
    }
    for mpi in ["pmi2", "pmix"] {
        let job = run(mpi, 3, std::path::Path::new(AMPROBE), &[]);
        assert_eq!(job.code, 0, "{mpi}: {}\n{}", job.stdout, job.stderr);
        let banners: Vec<&str> = job
            .stdout
            .lines()
            .filter(|l| l.starts_with("rank="))
            .collect();
        assert_eq!(banners.len(), 3, "{mpi}: {}", job.stdout);
        assert!(
            banners.iter().all(|b| b.contains("launcher=Slurm")),
            "{mpi}: {banners:?}"
        );
        let jobs: BTreeSet<&str> = banners
            .iter()
            .filter_map(|b| b.split(' ').find_map(|t| t.strip_prefix("job=")))
            .collect();
        assert_eq!(jobs.len(), 1, "{mpi}: {jobs:?}");
        let ok = job.stdout.lines().filter(|l| *l == "kvs=ok").count();
        assert_eq!(ok, 3, "{mpi}: {}\n{}", job.stdout, job.stderr);
    }
}

#[test]
fn random_access_runs_on_every_process_transport() {
    if !slurm() {
        return;
    }
    for mpi in ["pmi2", "pmix"] {
        random_access_on_every_process_transport(&format!("srun --mpi={mpi}"), |args| {
            run(mpi, 4, &example("random_access"), args)
        });
    }
}
