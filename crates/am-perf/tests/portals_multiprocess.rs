//! Multi-process jobs: real rank processes started by `am_launch::Launcher` (amrun's code).
#![cfg(not(miri))]

use std::time::Duration;

use am_perf::launch::{
    assert_exit_ends_every_rank, assert_job_left_nothing, assert_loss_noticed, fresh_dir, run_job,
};

const BIN: &str = env!("CARGO_BIN_EXE_portals-rank-test");

fn job(ranks: u32, args: &[&str], env: &[(&str, &str)]) -> i32 {
    run_job(BIN, "portals", ranks, args, env)
}

/// Mediums of every size up to the limit, Longs and a put, all ranks to all ranks.
#[test]
fn four_ranks_all_to_all() {
    assert_eq!(job(4, &["alltoall", "30"], &[]), 0);
}

#[test]
fn four_ranks_all_to_all_dynamic_credits() {
    assert_eq!(job(4, &["alltoall", "30"], &[("AM_CREDITS", "dynamic")]), 0);
}

/// Eight ranks on two cores: only workable because waiting ranks sleep on the futex.
#[test]
fn eight_ranks_blocking() {
    assert_eq!(job(8, &["alltoall", "10"], &[]), 0);
}

/// Request buffers of 1 KiB against a budget of 4 ranks × 32 requests of up to 1 KiB: the
/// request portal entry is disabled again and again, every refused request is sent again
/// after recovery, and every echo still arrives with the right payload (the bin checks each
/// one and the count).
#[test]
fn entry_disabled_recovery_loses_nothing() {
    let env = [
        ("PORTALS_REQUEST_BUFFER_BYTES", "1024"),
        ("PORTALS_SEND_SLOTS", "8"),
    ];
    assert_eq!(
        job(4, &["alltoall", "40", "--expect-flow-control"], &env),
        0
    );
}

#[test]
fn killed_rank_is_noticed_within_a_second() {
    let dir = fresh_dir("portals-kill");
    let code = job(4, &["kill", dir.to_str().unwrap()], &[]);
    assert_ne!(code, 0, "the job fails");
    assert_loss_noticed(&dir, &[0, 2, 3], Duration::from_secs(1));
    assert_job_left_nothing(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `exit(7)` from rank 2 of 4 ends every rank's process with 7, promptly.
#[test]
fn exit_from_one_rank_ends_every_rank_with_its_code() {
    assert_exit_ends_every_rank(BIN, "portals", &[]);
}

/// Ranks with different segment sizes: start-up fails on every rank with the typed
/// mismatch naming rank 1 and both sizes (each rank checks it and ends with 0).
#[test]
fn a_segment_size_mismatch_is_typed_on_every_rank() {
    assert_eq!(job(3, &["mismatch"], &[]), 0);
}
