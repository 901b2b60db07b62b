//! Multi-process jobs: real rank processes started by `am_launch::Launcher` (amrun's code).
#![cfg(not(miri))]

use am_launch::Launcher;

const BIN: &str = env!("CARGO_BIN_EXE_portals-rank-test");

fn our_files() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| {
                    n.starts_with("am-") && n.contains("-portals-") && !n.contains("portalsproc")
                })
                .collect()
        })
        .unwrap_or_default()
}

fn job(ranks: u32, args: &[&str], env: &[(&str, &str)]) -> i32 {
    let mut l = Launcher::new(ranks, BIN)
        .args(args.iter().copied())
        .transport("portals")
        .env("AM_WAIT", "block");
    for (k, v) in env {
        l = l.env(k, v);
    }
    l.run().expect("launch")
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

/// Request buffers of 1 KiB against a budget of 4 ranks × 8 requests of up to 1 KiB: the
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
    let dir = std::env::temp_dir().join(format!("portals-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
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
    let _ = std::fs::remove_dir_all(&dir);
    let left = our_files();
    assert!(left.is_empty(), "left behind: {left:?}");
}
