//! Multi-process jobs: real rank processes started by `am_launch::Launcher` (amrun's code).
#![cfg(not(miri))]

use am_launch::Launcher;

const BIN: &str = env!("CARGO_BIN_EXE_extoll-rank-test");

/// The `/dev/shm` files of job `id` (only its own: other tests' jobs run meanwhile).
fn files_of(id: &str) -> Vec<String> {
    let prefix = format!("am-{id}-");
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&prefix))
                .collect()
        })
        .unwrap_or_default()
}

fn job(ranks: u32, args: &[&str], env: &[(&str, &str)]) -> i32 {
    let mut l = Launcher::new(ranks, BIN)
        .args(args.iter().copied())
        .transport("extoll")
        .env("AM_WAIT", "block");
    for (k, v) in env {
        l = l.env(k, v);
    }
    l.run().expect("launch")
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("extoll-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
    let death: u128 = std::fs::read_to_string(dir.join("victim"))
        .expect("the victim ran")
        .parse()
        .unwrap();
    for r in [0, 2, 3] {
        let s = std::fs::read_to_string(dir.join(format!("lost-{r}")))
            .unwrap_or_else(|_| panic!("rank {r} did not report PeerLost"));
        let (lost, at) = s.split_once(' ').unwrap();
        assert_eq!(lost, "1", "rank {r} names the dead rank");
        let after = at.parse::<u128>().unwrap().saturating_sub(death);
        assert!(after < 1_000_000, "rank {r} noticed after {after} µs");
    }
    let id = std::fs::read_to_string(dir.join("job")).expect("rank 0 wrote the job id");
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!id.is_empty());
    let left = files_of(&id);
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The measurement program runs to its end: floors, the NIC alone (with a second thread of
/// rank 0 polling under the NIC's lock, whose end once raced with rank 1's first AM message
/// and left both ranks waiting for each other), AM Short, Mediums over both paths, Long.
#[test]
fn perf_program_completes() {
    assert_eq!(job(2, &["perf", "300"], &[("AM_WAIT", "yield")]), 0);
}
