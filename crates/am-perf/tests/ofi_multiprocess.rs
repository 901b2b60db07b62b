//! The ofi transport across processes under amrun's launcher, on libfabric's `tcp`
//! (`tcp;ofi_rxm`) and `shm` providers: an all-to-all with puts, a killed rank noticed by
//! every survivor, a rank killed anywhere in a flood (tcp), `exit` across the job, and a
//! segment-size mismatch typed on every rank.
#![cfg(all(feature = "ofi", not(miri)))]

use std::time::Duration;

use am_perf::launch::{
    assert_exit_ends_every_rank, assert_loss_noticed, fresh_dir, kill_anywhere_jobs, run_job,
};

const BIN: &str = env!("CARGO_BIN_EXE_ofi-rank-test");
const PROVIDERS: [&str; 2] = ["tcp", "shm"];

fn job(provider: &str, ranks: u32, args: &[&str]) -> i32 {
    run_job(BIN, "ofi", ranks, args, &[("FI_PROVIDER", provider)])
}

#[test]
fn alltoall_with_puts_on_every_provider() {
    for p in PROVIDERS {
        assert_eq!(job(p, 4, &["alltoall", "20"]), 0, "{p}");
    }
}

/// Rank 1 dies by SIGKILL after a barrier: every survivor's next barrier fails with
/// `PeerLost(1)`, well within the peer timeout (liveness on one host, error completions).
#[test]
fn a_killed_rank_is_noticed_by_every_survivor() {
    for p in PROVIDERS {
        let dir = fresh_dir(&format!("ofi-kill-{p}"));
        let code = job(p, 4, &["kill", dir.to_str().expect("utf-8 path")]);
        assert_ne!(code, 0, "{p}: the job fails");
        assert_loss_noticed(&dir, &[0, 2, 3], Duration::from_secs(2));
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The last of 3 ranks killed at points spread over a flood: the survivors always finish a
/// full exchange. `AM_KILLS` sets the kills per provider (default 8).
fn killed_anywhere(provider: &str) {
    let kills = std::env::var("AM_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    kill_anywhere_jobs(
        BIN,
        "ofi",
        kills,
        30_000,
        0x0F1,
        &[("FI_PROVIDER", provider)],
    );
}

#[test]
fn tcp_survives_a_kill_anywhere() {
    killed_anywhere("tcp");
}

// Not on `shm`: libfabric 1.17's shm provider guards each rank's receive queue, in shared
// memory, with a spinlock that a sender takes; a sender killed while it holds it leaves every
// later sender and the owner's own completion reads spinning inside libfabric (seen: both
// survivors in `pthread_spin_lock` under `fi_inject` and `fi_cq_read`). A kill between
// messages is noticed there as on tcp (`a_killed_rank_is_noticed_by_every_survivor`).

/// `exit(7)` from rank 2 of 4 ends every rank's process with 7, promptly.
#[test]
fn exit_from_one_rank_ends_every_rank_with_its_code() {
    for p in PROVIDERS {
        assert_exit_ends_every_rank(BIN, "ofi", &[("FI_PROVIDER", p)]);
    }
}

/// Ranks with different segment sizes: start-up fails on every rank with the typed mismatch.
#[test]
fn a_segment_size_mismatch_is_typed_on_every_rank() {
    for p in PROVIDERS {
        assert_eq!(job(p, 3, &["mismatch"]), 0, "{p}");
    }
}
