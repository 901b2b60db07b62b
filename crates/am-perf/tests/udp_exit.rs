//! `Node::exit` across udp processes (the shared-memory NICs run it in their own
//! multi-process tests).
#![cfg(not(miri))]

use am_perf::launch::assert_exit_ends_every_rank;

const BIN: &str = env!("CARGO_BIN_EXE_udp-rank-test");

/// `exit(7)` from rank 2 of 4 ends every rank's process with 7, promptly.
#[test]
fn exit_from_one_rank_ends_every_rank_with_its_code() {
    assert_exit_ends_every_rank(BIN, "udp", &[]);
}
