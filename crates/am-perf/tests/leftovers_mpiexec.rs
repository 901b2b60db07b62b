//! No leftovers under a launcher that does not clean up: a rank SIGKILLed while it is inside
//! its NIC's start-up (its segment created, the others not yet attached), in a job started by
//! MPICH's `mpiexec`, leaves nothing in `/dev/shm`. Checked from outside the launcher, for
//! each shared-memory NIC. Needs MPICH (see `am_perf::launch::have_mpiexec`).
#![cfg(not(miri))]

use std::process::{Command, Stdio};
use std::time::Duration;

use am_perf::launch::{fresh_dir, have_mpiexec, holds_a_segment, mpiexec, shm_files, wait_for};

fn killed_in_start_up_leaves_nothing(bin: &str, nic: &str) {
    if !have_mpiexec() {
        return;
    }
    let dir = fresh_dir(&format!("am-leftovers-{nic}"));
    let before = shm_files(|n| n.starts_with("am-"));
    let mut job = Command::new(mpiexec())
        .args(["-n", "2", bin, "stall", &dir.display().to_string()])
        .env("AM_TRANSPORT", nic)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start mpiexec");
    let pid = |r: u32| {
        std::fs::read_to_string(dir.join(format!("pid-{r}")))
            .ok()
            .and_then(|p| p.parse::<u32>().ok())
    };
    let started = wait_for(Duration::from_secs(20), || pid(1).is_some());
    let victim = pid(1);
    // Rank 1 holds its segment and waits for rank 0, held back by the test.
    let in_start_up =
        started && victim.is_some_and(|v| wait_for(Duration::from_secs(20), || holds_a_segment(v)));
    if let Some(v) = victim {
        let _ = Command::new("kill")
            .args(["-KILL", &v.to_string()])
            .status();
    }
    std::fs::write(dir.join("go"), "").expect("go");
    let ended = wait_for(Duration::from_secs(30), || {
        job.try_wait().ok().flatten().is_some()
    });
    if !ended {
        let _ = job.kill();
    }
    let _ = job.wait();
    let left = shm_files(|n| n.starts_with("am-") && !before.iter().any(|b| b == n));
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        in_start_up,
        "{nic}: rank 1 never held a segment in start-up"
    );
    assert!(ended, "{nic}: mpiexec did not end after a rank died");
    assert!(left.is_empty(), "{nic}: left behind {left:?}");
}

#[test]
fn sci_killed_in_start_up_leaves_nothing() {
    killed_in_start_up_leaves_nothing(env!("CARGO_BIN_EXE_sci-rank-test"), "sci");
}

#[test]
fn extoll_killed_in_start_up_leaves_nothing() {
    killed_in_start_up_leaves_nothing(env!("CARGO_BIN_EXE_extoll-rank-test"), "extoll");
}

#[test]
fn portals_killed_in_start_up_leaves_nothing() {
    killed_in_start_up_leaves_nothing(env!("CARGO_BIN_EXE_portals-rank-test"), "portals");
}
