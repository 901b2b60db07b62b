//! The multi-process tests' side: start a job of a rank-test program with
//! [`am_launch::Launcher`] (amrun's code) and check what its ranks left behind.
//!
//! These are test helpers: they panic, with a message, where a test should fail.

use std::path::{Path, PathBuf};
use std::time::Duration;

use am_launch::Launcher;

/// Runs `ranks` processes of `bin` with `args` on `transport`, with `AM_WAIT=block` (more
/// ranks than cores) and then `env`; returns the job's exit code.
///
/// # Panics
/// If the job cannot be started.
pub fn run_job(bin: &str, transport: &str, ranks: u32, args: &[&str], env: &[(&str, &str)]) -> i32 {
    let mut l = Launcher::new(ranks, bin)
        .args(args.iter().copied())
        .transport(transport)
        .env("AM_WAIT", "block");
    for (k, v) in env {
        l = l.env(k, v);
    }
    l.run().expect("launch")
}

/// An empty directory `<temp>/<name>-<pid>`, emptied first if it exists.
///
/// # Panics
/// If it cannot be created.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test directory");
    dir
}

/// The names of the files in `/dev/shm` that `keep` accepts.
pub fn shm_files(keep: impl Fn(&str) -> bool) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| keep(n))
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that the job whose id [`crate::rank::kill_scenario`] wrote into `dir/job` left no
/// `/dev/shm` file behind (only its own: other tests' jobs run meanwhile).
pub fn assert_job_left_nothing(dir: &Path) {
    let id = std::fs::read_to_string(dir.join("job")).expect("rank 0 wrote the job id");
    assert!(!id.is_empty(), "empty job id");
    let prefix = format!("am-{id}-");
    let left = shm_files(|n| n.starts_with(&prefix));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Checks what [`crate::rank::kill_scenario`] wrote into `dir`: every rank of `survivors`
/// reported rank 1 lost, less than `within` after its death.
///
/// # Panics
/// If a file is missing or malformed, names another rank, or came too late.
pub fn assert_loss_noticed(dir: &Path, survivors: &[u32], within: Duration) {
    let death: u128 = std::fs::read_to_string(dir.join("victim"))
        .expect("the victim ran")
        .parse()
        .expect("the victim's time");
    for r in survivors {
        let s = std::fs::read_to_string(dir.join(format!("lost-{r}")))
            .unwrap_or_else(|_| panic!("rank {r} did not report PeerLost"));
        let (lost, at) = s.split_once(' ').expect("`<rank> <µs>`");
        assert_eq!(lost, "1", "rank {r} names the dead rank");
        let after = at.parse::<u128>().expect("µs").saturating_sub(death);
        assert!(
            after < within.as_micros(),
            "rank {r} noticed after {after} µs"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_reports_are_checked() {
        let dir = fresh_dir("am-perf-loss");
        std::fs::write(dir.join("victim"), "1000").unwrap();
        std::fs::write(dir.join("lost-0"), "1 1500").unwrap();
        assert_loss_noticed(&dir, &[0], Duration::from_millis(1));
        std::fs::write(dir.join("lost-2"), "1 3000").unwrap();
        let late = std::panic::catch_unwind(|| {
            assert_loss_noticed(&dir, &[0, 2], Duration::from_millis(1))
        });
        std::fs::write(dir.join("lost-2"), "3 1100").unwrap();
        let wrong =
            std::panic::catch_unwind(|| assert_loss_noticed(&dir, &[2], Duration::from_millis(1)));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(late.is_err() && wrong.is_err());
    }
}
