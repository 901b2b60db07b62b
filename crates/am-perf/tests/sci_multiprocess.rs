//! Multi-process jobs: real rank processes started by `am_launch::Launcher` (amrun's code).
#![cfg(not(miri))]

use std::time::Duration;

use am_perf::launch::{
    assert_exit_ends_every_rank, assert_job_left_nothing, assert_loss_noticed, fresh_dir, run_job,
};

const BIN: &str = env!("CARGO_BIN_EXE_sci-rank-test");

fn job(ranks: u32, args: &[&str], env: &[(&str, &str)]) -> i32 {
    run_job(BIN, "sci", ranks, args, env)
}

#[test]
fn four_ranks_all_to_all() {
    assert_eq!(job(4, &["alltoall", "30"], &[]), 0);
}

/// Eight ranks on two cores: only workable because waiting ranks sleep on the futex.
#[test]
fn eight_ranks_blocking() {
    assert_eq!(job(8, &["alltoall", "10"], &[]), 0);
}

#[test]
fn seed_geometry_two_slots_dma_and_one_copy() {
    let env = [
        ("AM_CREDITS", "2"),
        ("SCI_SLOTS", "2"),
        ("SCI_DMA_THRESHOLD", "4096"),
        ("SCI_MEDIUM", "one-copy"),
    ];
    assert_eq!(job(3, &["alltoall", "10"], &env), 0);
}

/// Without `SCI_SLOTS` the slots follow `AM_CREDITS`: 64 credits per peer, which the
/// default 32 slots would refuse at start-up, start and flow.
#[test]
fn slots_follow_the_credits_when_not_set() {
    assert_eq!(job(3, &["alltoall", "10"], &[("AM_CREDITS", "64")]), 0);
}

#[test]
fn killed_rank_is_noticed_within_a_second() {
    let dir = fresh_dir("sci-kill");
    let code = job(4, &["kill", dir.to_str().unwrap()], &[]);
    assert_ne!(code, 0, "the job fails");
    assert_loss_noticed(&dir, &[0, 2, 3], Duration::from_secs(1));
    assert_job_left_nothing(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `exit(7)` from rank 2 of 4 ends every rank's process with 7, promptly.
#[test]
fn exit_from_one_rank_ends_every_rank_with_its_code() {
    assert_exit_ends_every_rank(BIN, "sci", &[]);
}

/// Ranks with different segment sizes: start-up fails on every rank with the typed
/// mismatch naming rank 1 and both sizes (each rank checks it and ends with 0).
#[test]
fn a_segment_size_mismatch_is_typed_on_every_rank() {
    assert_eq!(job(3, &["mismatch"], &[]), 0);
}

/// Rank 1 of 4 killed right after starting an all-reduce, the others in theirs: every
/// survivor's all-reduce fails with `PeerLost(1)` within a second (never a hang, never a
/// wrong sum), and so does its next collective. Catches a collective that waits for a dead
/// member's step for ever, and a survivor that hears of the loss only from its own transport
/// much later.
#[test]
fn a_rank_killed_during_an_allreduce_fails_it_on_every_survivor() {
    let dir = fresh_dir("sci-kill-allreduce");
    let code = job(4, &["kill-allreduce", dir.to_str().unwrap()], &[]);
    assert_ne!(code, 0, "the job fails");
    assert_loss_noticed(&dir, &[0, 2, 3], Duration::from_secs(1));
    for r in [0, 2, 3] {
        assert!(
            dir.join(format!("checked-{r}")).exists(),
            "rank {r}: a wrong sum, a loss before the kill, or a later collective that did not fail"
        );
    }
    assert_job_left_nothing(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}
