//! Several endpoints per process on every transport: the endpoint flood example's pairs of
//! endpoints (threads of two processes; threads of one process for loopback) flood each
//! other, every request handled exactly once by the endpoint it was sent to (the example
//! checks its counts and every request's source), and one pair's round trips run beside an
//! idle endpoint asleep in its barriers; bounded in time.

use std::process::Command;
use std::time::Duration;

mod common;
use common::{example, run_bounded};

fn run(transport: &str, extra: &[&str]) -> serde_json::Value {
    let mut cmd = Command::new(example("endpoint_flood"));
    cmd.args(["--transport", transport, "--rounds", "2"])
        .args(extra)
        // More threads than cores: yield while waiting.
        .env("AM_WAIT", "yield");
    let run = run_bounded(cmd, Duration::from_secs(120));
    assert_eq!(run.code, 0, "{transport} {extra:?}: {}", run.stderr);
    serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("{transport} {extra:?}: {e}: {}", run.stdout))
}

#[test]
fn endpoints_as_threads_flood_every_transport() {
    for transport in ["loopback", "sci", "extoll", "portals", "udp"] {
        let row = run(transport, &["--pairs", "3", "--flood", "3000"]);
        assert_eq!(row["transport"], transport);
        assert_eq!(row["layout"], "Threads");
        assert!(row["msgs_per_s"].as_f64().expect("number") > 0.0, "{row}");
    }
}

#[test]
fn a_round_trip_beside_an_idle_endpoint_on_every_transport() {
    for transport in ["loopback", "sci", "extoll", "portals", "udp"] {
        let row = run(
            transport,
            &["--test", "rt", "--idle", "1", "--iters", "500"],
        );
        assert_eq!(row["idle"], 1);
        assert!(row["rt_us"].as_f64().expect("number") > 0.0, "{row}");
    }
}

#[test]
fn endpoints_compare_with_processes() {
    let mut cmd = Command::new(example("endpoint_flood"));
    cmd.args(["--transport", "sci", "--compare", "pairs", "--jobs", "1"])
        .args(["--pairs", "2", "--flood", "2000", "--rounds", "1"])
        .env("AM_WAIT", "yield");
    let run = run_bounded(cmd, Duration::from_secs(120));
    assert_eq!(run.code, 0, "{}", run.stderr);
    let row: serde_json::Value = serde_json::from_str(run.stdout.trim()).expect("one JSON line");
    assert!(
        row["threads_msgs_per_s"].as_f64().expect("number") > 0.0,
        "{row}"
    );
    assert!(
        row["processes_msgs_per_s"].as_f64().expect("number") > 0.0,
        "{row}"
    );
}
