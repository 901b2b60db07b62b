//! Bootstrap under MPICH's `mpiexec` (hydra), with `amprobe` as the rank program.
//!
//! These tests need MPICH. Without `mpiexec` on PATH they print a notice and skip, unless
//! `AM_REQUIRE_MPIEXEC=1` (CI sets it after installing MPICH), in which case they fail.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Safety net only: no test should come close to it.
const WATCHDOG: Duration = Duration::from_secs(60);

const AMPROBE: &str = env!("CARGO_BIN_EXE_amprobe");

use am_perf::launch::{have_mpiexec, mpiexec};

mod common;

struct Job {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `mpiexec <args>` with extra environment, bounded by the watchdog.
fn run(env: &[(&str, &str)], args: &[&str]) -> Job {
    let mut child = Command::new(mpiexec())
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot start mpiexec");
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let stdout = thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let stderr = thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = match rx.recv_timeout(WATCHDOG) {
        Ok(status) => status.expect("wait for mpiexec"),
        Err(_) => {
            // Hydra's SIGINT handling cleans up its ranks.
            let _ = Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status();
            panic!("mpiexec did not finish");
        }
    };
    Job {
        code: status.code().unwrap_or(-1),
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

fn banners(out: &str) -> Vec<BTreeMap<String, String>> {
    out.lines()
        .filter(|l| l.starts_with("rank="))
        .map(|l| {
            l.split(' ')
                .filter_map(|t| t.split_once('='))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        })
        .collect()
}

/// `n` ranks 0..n, one job id, all-gather done on every rank, launcher=Mpiexec.
fn assert_good_job(job: &Job, n: u32) {
    assert_eq!(
        job.code, 0,
        "stdout:\n{}\nstderr:\n{}",
        job.stdout, job.stderr
    );
    let b = banners(&job.stdout);
    let ranks: BTreeSet<u32> = b.iter().map(|f| f["rank"].parse().unwrap()).collect();
    assert_eq!(ranks, (0..n).collect(), "{}", job.stdout);
    let jobs: BTreeSet<&str> = b.iter().map(|f| f["job"].as_str()).collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert!(b
        .iter()
        .all(|f| f["launcher"] == "Mpiexec" && f["size"] == n.to_string()));
    let ok = job.stdout.lines().filter(|l| *l == "kvs=ok").count();
    assert_eq!(ok, n as usize, "{}\n{}", job.stdout, job.stderr);
}

/// mpiexec killed by SIGKILL while 4 ranks flood each other on sci, over PMI-1 and PMI-2 on
/// PMI_FD and PMI-1 on PMI_PORT: every rank ends as its PMI connection closes, within a
/// second, and no `/dev/shm` file of the job is left. Catches ranks that outlived their
/// launcher.
#[test]
fn ranks_end_when_mpiexec_is_killed_mid_flood() {
    if !have_mpiexec() {
        return;
    }
    for (version, extra) in [("1", None), ("2", None), ("1", Some("-pmi-port"))] {
        let mut cmd = Command::new(mpiexec());
        cmd.args(extra)
            .args(["-n", "4"])
            .env("AM_PMI_VERSION", version);
        common::ranks_end_when_launcher_is_killed(cmd, &format!("PMI-{version} {extra:?}"));
    }
}

#[test]
fn pmi1_over_pmi_fd() {
    if !have_mpiexec() {
        return;
    }
    assert_good_job(&run(&[], &["-n", "4", AMPROBE]), 4);
}

#[test]
fn pmi1_over_pmi_port() {
    if !have_mpiexec() {
        return;
    }
    assert_good_job(&run(&[], &["-pmi-port", "-n", "3", AMPROBE]), 3);
}

#[test]
fn pmi2_over_pmi_fd() {
    if !have_mpiexec() {
        return;
    }
    assert_good_job(&run(&[("AM_PMI_VERSION", "2")], &["-n", "4", AMPROBE]), 4);
}

#[test]
fn pmi2_over_pmi_port() {
    if !have_mpiexec() {
        return;
    }
    assert_good_job(
        &run(
            &[("AM_PMI_VERSION", "2")],
            &["-pmi-port", "-n", "2", AMPROBE],
        ),
        2,
    );
}

#[test]
fn transport_passes_through() {
    if !have_mpiexec() {
        return;
    }
    let job = run(&[("AM_TRANSPORT", "udp")], &["-n", "2", AMPROBE]);
    assert_good_job(&job, 2);
    assert!(banners(&job.stdout).iter().all(|f| f["transport"] == "udp"));
}

#[test]
fn exit_code_propagates() {
    if !have_mpiexec() {
        return;
    }
    let job = run(
        &[],
        &["-n", "3", AMPROBE, "--exit-rank", "1", "--exit-code", "3"],
    );
    assert_eq!(job.code, 3, "{}\n{}", job.stdout, job.stderr);
}

#[test]
fn pmi1_abort_ends_the_job_with_its_code() {
    if !have_mpiexec() {
        return;
    }
    // The aborting rank then sleeps, so only hydra acting on the abort ends the job.
    let job = run(
        &[],
        &["-n", "3", AMPROBE, "--abort-rank", "1", "--exit-code", "7"],
    );
    assert_eq!(job.code, 7, "{}\n{}", job.stdout, job.stderr);
}

#[test]
fn random_access_runs_on_every_process_transport() {
    if !have_mpiexec() {
        return;
    }
    let program = common::example("random_access");
    let program = program.to_str().expect("a UTF-8 path");
    common::random_access_on_every_process_transport("mpiexec.mpich", |args| {
        let job = run(&[], &[&["-n", "4", program], args].concat());
        common::Run {
            code: job.code,
            stdout: job.stdout,
            stderr: job.stderr,
        }
    });
}

/// The stencil example's 4 ranks as processes under hydra, sleeping in `wait_word` between
/// hand-offs (`AM_WAIT=block`): its grid equals the sequential run's.
#[test]
fn stencil_runs_under_mpiexec() {
    if !have_mpiexec() {
        return;
    }
    let program = common::example("stencil");
    let program = program.to_str().expect("a UTF-8 path");
    for transport in ["sci", "udp"] {
        let job = run(
            &[("AM_WAIT", "block")],
            &[
                "-n",
                "4",
                program,
                "--transport",
                transport,
                "--rows",
                "64",
                "--cols",
                "64",
                "--iters",
                "40",
                "--json",
            ],
        );
        assert_eq!(job.code, 0, "{transport}: {}\n{}", job.stdout, job.stderr);
        let row: serde_json::Value = serde_json::from_str(job.stdout.trim())
            .unwrap_or_else(|e| panic!("{transport}: {e}: {}", job.stdout));
        assert_eq!(row["checked"], true, "{row}");
        assert_eq!(row["ranks"], 4, "{row}");
    }
}
