//! A rank dies while a peer has operations pending on it (calls, and the barrier of a job of
//! two), on every process transport, by every death a process can die (panic, abort, `exit`
//! without `Node::exit`, SIGKILL), under each launcher: amrun's, the program's own
//! (self-launch) and MPICH's `mpiexec`. Every pending operation fails with a typed error
//! naming the dead rank (or the job's abort), promptly; the job ends with a non-zero code; and
//! no process or `/dev/shm` file of the job is left (`am_perf::rank::pending_scenario`).
//!
//! Catches: a survivor whose operations on a dead peer never end (it hangs, or the launcher
//! has to kill it, and no report is written) or end with an untyped error; a death the job's
//! code hides; a rank or a segment that outlives its job. The mpiexec tests need MPICH (see
//! `am_perf::launch::have_mpiexec`).
#![cfg(not(miri))]

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use am_launch::Launcher;
use am_perf::launch::{
    assert_job_left_nothing, fresh_dir, have_mpiexec, marked_processes, mpiexec, run_job_with,
    wait_for,
};
use am_perf::rank::SURVIVOR_GRACE;

const DEATHS: [&str; 4] = ["panic", "abort", "exit", "kill"];

/// Safety net for a job this test starts as a child process: past it the job is killed and
/// the test fails. Above the launchers' grace ([`SURVIVOR_GRACE`]), so a survivor that hangs
/// shows as a missing report, not as a watchdog.
const WATCHDOG: Duration = Duration::from_secs(60);

/// Who starts the job of two ranks.
#[derive(Debug, Clone, Copy)]
enum StartedBy {
    /// amrun's launcher ([`am_launch::Launcher`]), run by the test, with a grace of
    /// [`SURVIVOR_GRACE`] (its survivors ignore its SIGTERM on purpose).
    Amrun,
    /// The rank program started once with `--ranks 2`, outside any launcher: it starts its
    /// own job (`am_perf::rank::self_launch_if_asked`, the same grace).
    Itself,
    /// MPICH's hydra, `-disable-auto-cleanup` so that the survivor outlives the death, each
    /// rank in a shell that ignores SIGUSR1, hydra's notice of a death to the others. The
    /// shell also makes a rank's death by signal an exit code to hydra: its proxy SIGKILLs
    /// the other ranks at once when one is killed by a signal, whatever the cleanup option
    /// (hydra 4.0), and the survivor would have nothing left to fail.
    Mpiexec,
}

impl StartedBy {
    fn name(self) -> &'static str {
        match self {
            StartedBy::Amrun => "amrun",
            StartedBy::Itself => "self-launch",
            StartedBy::Mpiexec => "mpiexec",
        }
    }
}

/// A transport as the rank program `bin` runs it: `env` for every rank, and how soon after
/// the death every pending operation must have failed.
struct Case {
    bin: &'static str,
    transport: &'static str,
    label: &'static str,
    env: &'static [(&'static str, &'static str)],
    within: Duration,
}

/// The shared-memory NICs notice a death by the dead process (or its departed or abort
/// word) at their next liveness check.
const SCI: Case = Case {
    bin: env!("CARGO_BIN_EXE_sci-rank-test"),
    transport: "sci",
    label: "sci",
    env: &[],
    within: Duration::from_secs(3),
};

const EXTOLL: Case = Case {
    bin: env!("CARGO_BIN_EXE_extoll-rank-test"),
    transport: "extoll",
    label: "extoll",
    env: &[],
    within: Duration::from_secs(3),
};

const PORTALS: Case = Case {
    bin: env!("CARGO_BIN_EXE_portals-rank-test"),
    transport: "portals",
    label: "portals",
    env: &[],
    within: Duration::from_secs(3),
};

/// A dead udp peer is noticed by its silence: a short peer timeout keeps the test short.
const UDP: Case = Case {
    bin: env!("CARGO_BIN_EXE_udp-rank-test"),
    transport: "udp",
    label: "udp",
    env: &[("AM_PEER_TIMEOUT_MS", "1000")],
    within: Duration::from_secs(4),
};

#[cfg(feature = "ofi")]
const OFI: [Case; 2] = [
    Case {
        bin: env!("CARGO_BIN_EXE_ofi-rank-test"),
        transport: "ofi",
        label: "ofi tcp",
        env: &[("FI_PROVIDER", "tcp")],
        within: Duration::from_secs(4),
    },
    Case {
        bin: env!("CARGO_BIN_EXE_ofi-rank-test"),
        transport: "ofi",
        label: "ofi shm",
        env: &[("FI_PROVIDER", "shm")],
        within: Duration::from_secs(4),
    },
];

/// Runs the scenario with rank 1 dying by each of [`DEATHS`] in a job `launch` starts, and
/// checks that the job failed, that the survivor reported every operation failed within
/// `case.within` of the death, and that no process or `/dev/shm` file of the job is left
/// once the job has ended (every launcher has reaped all of its ranks by then).
fn every_death(launch: StartedBy, case: &Case) {
    let Case { bin, label, .. } = *case;
    for how in DEATHS {
        let name = format!("{}-{label}-pending-{how}", launch.name()).replace(' ', "-");
        let dir = fresh_dir(&name);
        let mark = format!("{name}-{}", std::process::id());
        let path = dir.to_str().expect("utf-8 path");
        let mut env = case.env.to_vec();
        env.push(("AM_TEST_MARK", &mark));
        let started = Instant::now();
        let code = run(launch, case, &["pending", path, how], &env);
        let job_took = started.elapsed();
        let what = format!("{}, {label}, {how}", launch.name());
        assert_ne!(code, 0, "{what}: the victim's death fails the job");
        let left = marked_processes(Path::new(bin), &mark);
        assert!(left.is_empty(), "{what}: ranks {left:?} outlived the job");
        assert_job_left_nothing(&dir);
        let report = read(&dir.join("failed-0")).unwrap_or_else(|| {
            panic!("{what}: rank 0 never saw its operations fail (code {code})")
        });
        let (took, errors) = report.split_once(' ').expect("`<ms> <errors>`");
        let took = Duration::from_millis(took.parse().expect("milliseconds"));
        assert!(
            took < case.within,
            "{what}: the operations took {took:?} to fail ({errors})"
        );
        eprintln!(
            "pending: {what}: failed {took:?} after the death (job {job_took:.2?}, code {code}): {errors}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// Runs the job of two ranks of `case.bin` with `args` on `case.transport` as `launch` starts
/// it, with `AM_WAIT=block` and then `env`; returns its exit code.
fn run(launch: StartedBy, case: &Case, args: &[&str], env: &[(&str, &str)]) -> i32 {
    match launch {
        StartedBy::Amrun => {
            let launcher = Launcher::new(2, case.bin).grace(SURVIVOR_GRACE);
            run_job_with(launcher, case.transport, args, env)
        }
        StartedBy::Itself => {
            let mut cmd = Command::new(case.bin);
            cmd.args(args).args(["--ranks", "2"]);
            bounded(cmd, case, env)
        }
        StartedBy::Mpiexec => {
            let mut cmd = Command::new(mpiexec());
            cmd.args(["-disable-auto-cleanup", "-n", "2", "/bin/sh", "-c"])
                .arg(r#"trap '' USR1; "$0" "$@""#)
                .arg(case.bin)
                .args(args)
                .env("AM_TRANSPORT", case.transport);
            bounded(cmd, case, env)
        }
    }
}

/// Runs `cmd` in a process group of its own with `AM_WAIT=block` and `env`, outside any job
/// (none of the test's own launcher variables), to its end or [`WATCHDOG`]; past it, kills
/// the group and the job's marked ranks, and fails.
fn bounded(mut cmd: Command, case: &Case, env: &[(&str, &str)]) -> i32 {
    for var in [
        "AM_RANK",
        "AM_SIZE",
        "AM_JOB_ID",
        "AM_LAUNCHER",
        "AM_PMI_FD",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("AM_WAIT", "block").envs(env.iter().copied());
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let mut status = None;
    let ended = wait_for(WATCHDOG, || {
        status = child.try_wait().expect("wait for the job");
        status.is_some()
    });
    if !ended {
        let group = nix::unistd::Pid::from_raw(child.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let mark = env
            .iter()
            .find(|(k, _)| *k == "AM_TEST_MARK")
            .map(|(_, v)| *v);
        for pid in mark.map_or_else(Vec::new, |m| marked_processes(Path::new(case.bin), m)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = child.wait();
        panic!("{cmd:?} did not end within {WATCHDOG:?}");
    }
    let status = status.expect("ended");
    // A launcher killed by a signal is a failed job too: 128+S, as a shell reports it.
    status.code().unwrap_or_else(|| {
        128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)
    })
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Each case under each launcher: `<transport>::{amrun, self_launch, mpiexec}`.
macro_rules! every_launcher {
    ($name:ident, $cases:expr) => {
        mod $name {
            use super::*;

            #[test]
            fn amrun() {
                for case in $cases {
                    every_death(StartedBy::Amrun, case);
                }
            }

            #[test]
            fn self_launch() {
                for case in $cases {
                    every_death(StartedBy::Itself, case);
                }
            }

            #[test]
            fn mpiexec() {
                if !have_mpiexec() {
                    return;
                }
                for case in $cases {
                    every_death(StartedBy::Mpiexec, case);
                }
            }
        }
    };
}

every_launcher!(sci, [&SCI]);
every_launcher!(extoll, [&EXTOLL]);
every_launcher!(portals, [&PORTALS]);
every_launcher!(udp, [&UDP]);
#[cfg(feature = "ofi")]
every_launcher!(ofi, &OFI);
