//! Multi-process jobs: real rank processes started by `am_launch::Launcher` (amrun's code).
#![cfg(not(miri))]

use std::time::Duration;

use am_perf::launch::{
    assert_exit_ends_every_rank, assert_job_left_nothing, assert_loss_noticed, fresh_dir, run_job,
};

const BIN: &str = env!("CARGO_BIN_EXE_extoll-rank-test");

fn job(ranks: u32, args: &[&str], env: &[(&str, &str)]) -> i32 {
    run_job(BIN, "extoll", ranks, args, env)
}

fn tempdir(name: &str) -> std::path::PathBuf {
    fresh_dir(&format!("extoll-{name}"))
}

/// Mediums of 0..8192 bytes over both paths (the default crossover) and a Long put each.
#[test]
fn four_ranks_all_to_all() {
    assert_eq!(job(4, &["alltoall", "12"], &[]), 0);
}

/// The other geometry: 128-byte packets, every Medium RMA-buffered with 2 buffers.
#[test]
fn three_ranks_rma_mediums_128_byte_packets() {
    let env = [
        ("EXTOLL_PACKET_SIZE", "128"),
        ("EXTOLL_MEDIUM", "rma"),
        ("EXTOLL_RMA_BUFFERS", "2"),
    ];
    assert_eq!(job(3, &["alltoall", "10"], &env), 0);
}

/// Eight ranks on two cores: only workable because waiting ranks sleep on the futex.
#[test]
fn eight_ranks_blocking() {
    assert_eq!(job(8, &["alltoall", "4"], &[("EXTOLL_MEDIUM", "velo")]), 0);
}

/// Three senders flood rank 0's small mailbox while it does not poll: each sees back-pressure,
/// and every request then runs exactly once, in order.
#[test]
fn full_mailbox_is_back_pressure_without_loss() {
    let dir = tempdir("flood");
    let env = [
        ("EXTOLL_MAILBOX_SLOTS", "160"),
        ("EXTOLL_MEDIUM", "velo"),
        ("AM_CREDITS", "64"),
    ];
    let code = job(4, &["flood", "150", dir.to_str().unwrap()], &env);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, 0);
}

#[test]
fn killed_rank_is_noticed_within_a_second() {
    let dir = tempdir("kill");
    let code = job(4, &["kill", dir.to_str().unwrap()], &[]);
    assert_ne!(code, 0, "the job fails");
    assert_loss_noticed(&dir, &[0, 2, 3], Duration::from_secs(1));
    assert_job_left_nothing(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The measurement program runs to its end: floors, the NIC alone (with a second thread of
/// rank 0 polling under the NIC's lock, whose end once raced with rank 1's first AM message
/// and left both ranks waiting for each other), AM Short, Mediums over both paths, Long.
#[test]
fn perf_program_completes() {
    assert_eq!(job(2, &["perf", "300"], &[("AM_WAIT", "yield")]), 0);
}

/// `exit(7)` from rank 2 of 4 ends every rank's process with 7, promptly.
#[test]
fn exit_from_one_rank_ends_every_rank_with_its_code() {
    assert_exit_ends_every_rank(BIN, "extoll", &[]);
}

/// Ranks with different segment sizes: start-up fails on every rank with the typed
/// mismatch naming rank 1 and both sizes (each rank checks it and ends with 0).
#[test]
fn a_segment_size_mismatch_is_typed_on_every_rank() {
    assert_eq!(job(3, &["mismatch"], &[]), 0);
}
