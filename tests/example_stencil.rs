//! The stencil example runs on every transport in `AM_WAIT=block` (its ranks sleeping in
//! `wait_word` until a neighbour's put-with-signal wakes them) and under mpiexec, and its
//! result equals a sequential run of the same grid (the example checks every value and
//! fails otherwise). Catches a halo put to the wrong column or copy, a signal that reaches
//! a rank before its halo, and a waiter a signal does not wake (the bound).

use std::process::Command;
use std::time::Duration;

mod common;
use common::{example, run_bounded};

fn checked(transport: &str, ranks: &str) {
    let mut cmd = Command::new(example("stencil"));
    cmd.env("AM_WAIT", "block").args([
        "--transport",
        transport,
        "--ranks",
        ranks,
        "--rows",
        "64",
        "--cols",
        "48",
        "--iters",
        "60",
        "--json",
    ]);
    let run = run_bounded(cmd, Duration::from_secs(120));
    assert_eq!(run.code, 0, "{transport}: {}\n{}", run.stdout, run.stderr);
    let row: serde_json::Value = serde_json::from_str(run.stdout.trim())
        .unwrap_or_else(|e| panic!("{transport}: {e}: {}", run.stdout));
    assert_eq!(row["transport"], transport, "{row}");
    assert_eq!(row["checked"], true, "{row}");
    assert_eq!(row["ranks"].to_string(), ranks, "{row}");
}

#[test]
fn stencil_equals_the_sequential_run_on_every_transport() {
    for transport in ["loopback", "sci", "extoll", "portals", "udp"] {
        checked(transport, "3");
    }
}

#[test]
fn stencil_on_more_ranks_than_cores() {
    checked("sci", "6");
}
