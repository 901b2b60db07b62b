//! A rank killed at any point of a flood never wedges the survivors: for each shared-memory
//! NIC, many jobs of 3 ranks in which the last rank is SIGKILLed at a different moment of a
//! flood of mixed-size messages (in a send, a claim, a deposit, a poll), after which the two
//! survivors must complete a full exchange; and no job leaves anything in `/dev/shm`.
//! sci and extoll run twice: sci with command segments per sender and with a bank, extoll
//! with RMA Medium buffers per connection and with one pool per rank.
//! `AM_KILLS` sets the kills per NIC (default 70), `AM_KILL_SEED` the delays' seed.
#![cfg(not(miri))]

use am_perf::launch::kill_anywhere_jobs;

fn kills() -> u32 {
    std::env::var("AM_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(70)
}

fn seed() -> u64 {
    std::env::var("AM_KILL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x5EED)
}

/// Up to 30 ms into the flood: the flood lasts longer, so every kill lands inside it.
const MAX_DELAY_US: u64 = 30_000;

#[test]
fn sci_survives_a_kill_anywhere() {
    kill_anywhere_jobs(
        env!("CARGO_BIN_EXE_sci-rank-test"),
        "sci",
        kills(),
        MAX_DELAY_US,
        seed(),
        &[],
    );
}

#[test]
fn extoll_survives_a_kill_anywhere() {
    kill_anywhere_jobs(
        env!("CARGO_BIN_EXE_extoll-rank-test"),
        "extoll",
        kills(),
        MAX_DELAY_US,
        seed(),
        &[],
    );
}

/// sci under dynamic credits, which send every message through the receiver's bank: the
/// killed rank may die holding a bank slot's claim, which the survivors' owner must take
/// over. Half the kills, and other delays.
#[test]
fn sci_with_a_bank_survives_a_kill_anywhere() {
    kill_anywhere_jobs(
        env!("CARGO_BIN_EXE_sci-rank-test"),
        "sci",
        kills().div_ceil(2),
        MAX_DELAY_US,
        seed().rotate_left(29),
        &[("AM_CREDITS", "dynamic")],
    );
}

/// extoll under dynamic credits, whose RMA Mediums (900 and 3000 bytes in the flood) claim
/// buffers of the receiver's pool: the killed rank may die holding a claim, which the
/// survivors' sweep must free. Half the kills, and other delays.
#[test]
fn extoll_with_a_pool_survives_a_kill_anywhere() {
    kill_anywhere_jobs(
        env!("CARGO_BIN_EXE_extoll-rank-test"),
        "extoll",
        kills().div_ceil(2),
        MAX_DELAY_US,
        seed().rotate_left(17),
        &[("AM_CREDITS", "dynamic")],
    );
}

#[test]
fn portals_survives_a_kill_anywhere() {
    kill_anywhere_jobs(
        env!("CARGO_BIN_EXE_portals-rank-test"),
        "portals",
        kills(),
        MAX_DELAY_US,
        seed(),
        &[],
    );
}
