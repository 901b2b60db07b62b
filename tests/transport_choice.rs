//! Which transport a program runs on: `AM_TRANSPORT` with or without a launcher (an unknown
//! name is an error), and a program that asked for loopback (the default) started by a
//! launcher runs on a process transport instead of failing.

use std::process::Command;
use std::time::Duration;

mod common;
use common::{example, run_bounded, Run};

use am_perf::launch::{have_mpiexec, mpiexec};

/// Safety net only: no run comes close to it.
const WATCHDOG: Duration = Duration::from_secs(60);

const AMRUN: &str = env!("CARGO_BIN_EXE_amrun");

fn run(cmd: Command) -> Run {
    run_bounded(cmd, WATCHDOG)
}

/// A short ping-pong, one JSON object per row (each line may carry a `[rank] ` prefix).
fn pingpong() -> Command {
    let mut cmd = Command::new(example("pingpong"));
    cmd.args([
        "--kind", "short", "--iters", "50", "--warmup", "5", "--flood", "10", "--json",
    ])
    .env_remove("AM_TRANSPORT");
    cmd
}

/// The transport named by the job's JSON rows (all the same).
fn transport_of(run: &Run) -> String {
    assert_eq!(
        run.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    let names: Vec<String> = run
        .stdout
        .lines()
        .filter_map(|l| l.find('{').map(|at| &l[at..]))
        .map(|json| {
            let row: serde_json::Value = serde_json::from_str(json).expect("a JSON row");
            row["transport"].as_str().expect("transport").to_owned()
        })
        .collect();
    assert!(!names.is_empty(), "no rows: {}", run.stdout);
    assert!(names.iter().all(|n| *n == names[0]), "{names:?}");
    names[0].clone()
}

#[test]
fn am_transport_is_honoured_without_a_launcher() {
    let mut cmd = pingpong();
    cmd.env("AM_TRANSPORT", "sci");
    assert_eq!(transport_of(&run(cmd)), "sci");
}

#[test]
fn an_unknown_am_transport_is_an_error() {
    let mut cmd = pingpong();
    cmd.env("AM_TRANSPORT", "infiniband");
    let r = run(cmd);
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(
        r.stderr.contains("unknown transport \"infiniband\""),
        "{}",
        r.stderr
    );
}

/// A job of no ranks is refused in the terms the user asked in (ranks, not endpoints), on a
/// thread transport and a process one. Catches the message that spoke of "1 endpoints in
/// each of 0 processes" to a user who never asked for endpoints.
#[test]
fn a_job_of_no_ranks_is_refused_in_the_users_terms() {
    for transport in ["loopback", "sci"] {
        let mut cmd = pingpong();
        cmd.args(["--ranks", "0", "--transport", transport]);
        let r = run(cmd);
        assert_ne!(r.code, 0, "{}", r.stdout);
        assert!(r.stderr.contains("at least one rank"), "{}", r.stderr);
        assert!(!r.stderr.contains("endpoint"), "{}", r.stderr);
    }
}

#[test]
fn a_loopback_program_under_amrun_runs_on_shared_memory() {
    let mut cmd = Command::new(AMRUN);
    cmd.args(["-n", "2", "--"])
        .arg(example("pingpong"))
        .args([
            "--kind", "short", "--iters", "50", "--warmup", "5", "--flood", "10", "--json",
        ])
        .env_remove("AM_TRANSPORT");
    assert_eq!(transport_of(&run(cmd)), "sci");
}

#[test]
fn self_launch_messages_name_the_program_not_amrun() {
    // A rank that fails makes the job's launcher report it; the user never ran amrun.
    let mut cmd = Command::new(example("pingpong"));
    cmd.args(["--transport", "sci", "--kind", "short", "--iters", "50"])
        .env_remove("AM_TRANSPORT")
        // The ranks reject this configuration as they start (after the launch).
        .env("AM_CREDITS", "0");
    let r = run(cmd);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("pingpong: rank "), "{}", r.stderr);
    assert!(!r.stderr.contains("amrun"), "{}", r.stderr);
}

#[test]
fn a_loopback_program_under_mpiexec_runs_on_shared_memory() {
    if !have_mpiexec() {
        return;
    }
    let mut cmd = Command::new(mpiexec());
    cmd.args(["-n", "2"])
        .arg(example("pingpong"))
        .args([
            "--kind", "short", "--iters", "50", "--warmup", "5", "--flood", "10", "--json",
        ])
        .env_remove("AM_TRANSPORT");
    assert_eq!(transport_of(&run(cmd)), "sci");
}

#[test]
fn a_launcher_without_a_key_value_store_is_named_with_what_was_seen() {
    // What Open MPI's mpirun gives a rank, less its PMIx server's address (no
    // PMIX_SERVER_URI*): its place in the job, but no key-value store to reach.
    for transport in ["sci", "extoll", "portals", "udp"] {
        let mut cmd = Command::new(example("pingpong"));
        cmd.args(["--transport", transport, "--kind", "short", "--iters", "10"])
            .env_remove("AM_TRANSPORT")
            .env_remove("AM_COORD")
            .envs([
                ("OMPI_COMM_WORLD_RANK", "0"),
                ("OMPI_COMM_WORLD_SIZE", "2"),
                ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
                ("AM_JOB_ID", "choice-test"),
                ("PMIX_NAMESPACE", "prterun-test-1"),
                ("PMIX_RANK", "0"),
            ]);
        let r = run(cmd);
        assert_ne!(r.code, 0, "{transport}");
        for needle in [
            "openmpi",
            "OMPI_COMM_WORLD_RANK, PMIX_NAMESPACE, PMIX_RANK",
            "amrun",
        ] {
            assert!(
                r.stderr.contains(needle),
                "{transport}: {needle}: {}",
                r.stderr
            );
        }
    }
}
