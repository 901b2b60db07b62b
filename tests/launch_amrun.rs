//! `amrun` end to end, with `amprobe` as the rank program.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Safety net only: no test should come close to it.
mod common;

const WATCHDOG: Duration = Duration::from_secs(60);

const AMRUN: &str = env!("CARGO_BIN_EXE_amrun");
const AMPROBE: &str = env!("CARGO_BIN_EXE_amprobe");

/// A finished job: exit code and the lines it printed.
struct Job {
    code: i32,
    stdout: Vec<String>,
    stderr: String,
    elapsed: Duration,
}

/// A running launcher whose stdout lines arrive on a channel.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    stderr: thread::JoinHandle<String>,
    seen: Vec<String>,
    started: Instant,
}

fn amrun(args: &[&str]) -> Running {
    let mut cmd = Command::new(AMRUN);
    cmd.args(args);
    start(cmd)
}

fn start(cmd: Command) -> Running {
    start_with_stderr(cmd, Stdio::piped())
}

/// [`start`], with the launcher's stderr given (its text is then not collected).
fn start_with_stderr(mut cmd: Command, stderr: Stdio) -> Running {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("cannot start the launcher");
    let out = child.stdout.take().expect("piped stdout");
    let err = child.stderr.take();
    let (tx, lines) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let stderr = thread::spawn(move || {
        let mut s = String::new();
        if let Some(mut err) = err {
            let _ = err.read_to_string(&mut s);
        }
        s
    });
    Running {
        child,
        lines,
        stderr,
        seen: Vec::new(),
        started: Instant::now(),
    }
}

impl Running {
    /// Collects lines until `n` of them contain `pid=` (every rank printed its banner).
    fn wait_for_banners(&mut self, n: usize) {
        while self.seen.iter().filter(|l| l.contains("pid=")).count() < n {
            match self.lines.recv_timeout(WATCHDOG) {
                Ok(line) => self.seen.push(line),
                Err(_) => self.fail("ranks did not all print their banner"),
            }
        }
    }

    /// Kills everything we know of and panics; only reached when a test is broken.
    fn fail(&mut self, why: &str) -> ! {
        let _ = self.child.kill();
        for pid in pids(&self.seen) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.child.wait();
        panic!("{why}; output so far: {:#?}", self.seen);
    }

    fn finish(mut self) -> Job {
        // The stdout reader ends when the launcher and all ranks have closed stdout.
        let deadline = self.started + WATCHDOG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => self.fail("the job did not end"),
            }
        }
        let status = self.child.wait().expect("wait for the launcher");
        let elapsed = self.started.elapsed();
        Job {
            code: status.code().expect("the launcher exits normally"),
            stdout: self.seen,
            stderr: self.stderr.join().expect("stderr reader"),
            elapsed,
        }
    }
}

/// The `key=value` fields of an `amprobe` banner line, after any `[r] ` prefix.
fn fields(line: &str) -> BTreeMap<String, String> {
    let body = line.split_once("] ").map_or(line, |(_, b)| b);
    body.split(' ')
        .filter_map(|t| t.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn banners(lines: &[String]) -> Vec<BTreeMap<String, String>> {
    lines
        .iter()
        .filter(|l| l.contains("pid="))
        .map(|l| fields(l))
        .collect()
}

fn pids(lines: &[String]) -> Vec<i32> {
    banners(lines)
        .iter()
        .filter_map(|f| f.get("pid")?.parse().ok())
        .collect()
}

/// True when `pid` is no longer an amprobe process (gone, or the pid reused).
fn probe_gone(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).map_or(true, |cmd| {
        !String::from_utf8_lossy(&cmd).contains("amprobe")
    })
}

fn assert_all_gone(job: &Job, expected: usize) {
    let pids = pids(&job.stdout);
    assert_eq!(pids.len(), expected, "banners: {:#?}", job.stdout);
    for pid in pids {
        assert!(probe_gone(pid), "rank process {pid} survived the job");
    }
}

#[test]
fn ranks_are_distinct_and_share_one_job_id() {
    let job = amrun(&["-n", "4", "--", AMPROBE]).finish();
    assert_eq!(job.code, 0, "{}", job.stderr);
    let b = banners(&job.stdout);
    assert_eq!(b.len(), 4, "{:#?}", job.stdout);
    let ranks: BTreeSet<u32> = b.iter().map(|f| f["rank"].parse().unwrap()).collect();
    assert_eq!(ranks, (0..4).collect());
    let jobs: BTreeSet<&str> = b.iter().map(|f| f["job"].as_str()).collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let id = jobs.iter().next().unwrap();
    assert!(
        id.len() == 16 && id.bytes().all(|c| c.is_ascii_hexdigit()),
        "{id}"
    );
    for f in &b {
        assert_eq!(f["size"], "4");
        assert_eq!(f["launcher"], "Amrun");
        assert_eq!(f["transport"], "none");
    }
    // Every line carries its rank's prefix, and the all-gather worked on every rank.
    for line in &job.stdout {
        let (prefix, rest) = line.split_once(' ').unwrap();
        if let Some(rank) = fields(rest).get("rank") {
            assert_eq!(prefix, format!("[{rank}]"));
        }
    }
    let ok = job
        .stdout
        .iter()
        .filter(|l| l.ends_with("] kvs=ok"))
        .count();
    assert_eq!(ok, 4, "{:#?}", job.stdout);
    assert_all_gone(&job, 4);
}

#[test]
fn job_ids_differ_between_jobs() {
    let a = amrun(&["-n", "1", AMPROBE]).finish();
    let b = amrun(&["-n", "1", AMPROBE]).finish();
    assert_ne!(banners(&a.stdout)[0]["job"], banners(&b.stdout)[0]["job"]);
}

#[test]
fn transport_and_prefix_options() {
    let job = amrun(&[
        "-n",
        "2",
        "--transport",
        "udp",
        "--no-prefix",
        "--",
        AMPROBE,
    ])
    .finish();
    assert_eq!(job.code, 0, "{}", job.stderr);
    let b = banners(&job.stdout);
    assert_eq!(b.len(), 2);
    assert!(b.iter().all(|f| f["transport"] == "udp"));
    assert!(
        job.stdout.iter().all(|l| !l.starts_with('[')),
        "{:#?}",
        job.stdout
    );

    let job = amrun(&["-n", "2", "--transport", "tcp", "--", AMPROBE]).finish();
    assert_eq!(job.code, 2);
    for name in ["loopback", "sci", "extoll", "portals", "udp"] {
        assert!(job.stderr.contains(name), "{}", job.stderr);
    }
    assert!(job.stdout.is_empty());
}

#[test]
fn usage_errors() {
    let help = amrun(&["--help"]).finish();
    assert_eq!(help.code, 0);
    assert!(help.stdout.join("\n").contains("AM_PMI_FD"));
    assert_eq!(amrun(&["-n", "0", AMPROBE]).finish().code, 2);
    assert_eq!(amrun(&["-n", "2"]).finish().code, 2);
    let missing = amrun(&["-n", "2", "/nonexistent/amprobe"]).finish();
    assert_eq!(missing.code, 127);
    assert!(
        missing.stderr.contains("cannot start rank 0"),
        "{}",
        missing.stderr
    );
}

#[test]
fn exit_code_of_the_failing_rank_is_the_jobs() {
    let job = amrun(&["-n", "3", AMPROBE, "--exit-rank", "1", "--exit-code", "3"]).finish();
    assert_eq!(job.code, 3, "{}", job.stderr);
    assert_all_gone(&job, 3);
}

#[test]
fn a_dying_rank_takes_the_hung_ones_down() {
    let job = amrun(&[
        "-n",
        "3",
        AMPROBE,
        "--exit-rank",
        "1",
        "--exit-code",
        "1",
        "--hang-unless-rank",
        "1",
    ])
    .finish();
    assert_eq!(job.code, 1, "{}", job.stderr);
    // Hung ranks sleep for 300 s unless killed; SIGTERM ends them at once.
    assert!(
        job.elapsed < Duration::from_secs(30),
        "took {:?}",
        job.elapsed
    );
    assert!(
        job.stderr.contains("rank 1 exited with code 1"),
        "{}",
        job.stderr
    );
    assert_all_gone(&job, 3);
}

#[test]
fn a_panicking_rank_aborts_the_job() {
    let job = amrun(&[
        "-n",
        "3",
        AMPROBE,
        "--panic-rank",
        "2",
        "--hang-unless-rank",
        "2",
    ])
    .finish();
    assert_eq!(job.code, 101, "{}", job.stderr);
    assert!(job.stderr.contains("[2] "), "{}", job.stderr);
    assert_all_gone(&job, 3);
}

#[test]
fn abort_through_the_key_value_store() {
    // The aborting rank then sleeps, so only the abort can end the job with 7.
    let job = amrun(&["-n", "3", AMPROBE, "--abort-rank", "1", "--exit-code", "7"]).finish();
    assert_eq!(job.code, 7, "{}", job.stderr);
    assert!(
        job.stderr.contains("rank 1 aborted the job"),
        "{}",
        job.stderr
    );
    assert_all_gone(&job, 3);
}

#[test]
fn sigterm_to_amrun_ends_every_rank() {
    let mut run = amrun(&["-n", "3", AMPROBE, "--hang-unless-rank", "99"]);
    run.wait_for_banners(3);
    kill(Pid::from_raw(run.child.id() as i32), Signal::SIGTERM).expect("signal amrun");
    let job = run.finish();
    assert_eq!(job.code, 128 + 15, "{}", job.stderr);
    assert_all_gone(&job, 3);
}

/// The launcher's stderr is a pipe nobody reads any more (its parent was killed by a
/// timeout, say): a SIGTERM still ends every rank. A launcher whose message about the signal
/// panicked on the broken pipe left its ranks running, holding the job's stdout open.
#[test]
fn sigterm_to_amrun_whose_stderr_is_gone_ends_every_rank() {
    let (read, write) = nix::unistd::pipe().expect("pipe");
    drop(read);
    let mut cmd = Command::new(AMRUN);
    cmd.args(["-n", "3", AMPROBE, "--hang-unless-rank", "99"]);
    let mut run = start_with_stderr(cmd, Stdio::from(write));
    run.wait_for_banners(3);
    kill(Pid::from_raw(run.child.id() as i32), Signal::SIGTERM).expect("signal amrun");
    let job = run.finish();
    let pids = pids(&job.stdout);
    let survivors: Vec<i32> = pids.iter().copied().filter(|&p| !probe_gone(p)).collect();
    // Leave nothing behind, even when failing.
    for &pid in &survivors {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    assert_eq!(pids.len(), 3, "banners: {:#?}", job.stdout);
    assert!(
        survivors.is_empty(),
        "ranks {survivors:?} survived the launcher"
    );
    assert_eq!(job.code, 128 + 15);
}

/// amrun killed by SIGKILL (which it cannot catch) while 4 ranks flood each other on sci:
/// every rank ends within a second, and no `/dev/shm` file of the job is left. Catches ranks
/// that outlived their launcher, keeping the cores busy until killed by hand.
#[test]
fn ranks_end_when_amrun_is_killed_mid_flood() {
    let mut cmd = Command::new(AMRUN);
    cmd.args(["-n", "4", "--transport", "sci", "--"]);
    common::ranks_end_when_launcher_is_killed(cmd, "amrun");
}

#[test]
fn shared_memory_files_are_removed() {
    for extra in [
        &[][..],
        &[
            "--exit-rank",
            "0",
            "--exit-code",
            "2",
            "--hang-unless-rank",
            "0",
        ][..],
    ] {
        let mut args = vec!["-n", "2", AMPROBE, "--touch-shm"];
        args.extend_from_slice(extra);
        let job = amrun(&args).finish();
        let files: Vec<&str> = job
            .stdout
            .iter()
            .filter_map(|l| l.split_once("shm=").map(|(_, p)| p))
            .collect();
        assert_eq!(files.len(), 2, "{:#?}\n{}", job.stdout, job.stderr);
        for f in files {
            assert!(f.starts_with("/dev/shm/am-"));
            assert!(!Path::new(f).exists(), "{f} left behind");
        }
        assert_all_gone(&job, 2);
    }
}

#[test]
fn self_launch_starts_the_job_itself() {
    // The same launcher code as amrun, entered from the program: ranks, job id, KVS, exit code.
    let mut cmd = Command::new(AMPROBE);
    cmd.args(["--self-launch", "3"]).env_remove("AM_RANK");
    let job = start(cmd).finish();
    assert_eq!(job.code, 0, "{}", job.stderr);
    let b = banners(&job.stdout);
    let ranks: BTreeSet<u32> = b.iter().map(|f| f["rank"].parse().unwrap()).collect();
    assert_eq!(ranks, (0..3).collect(), "{:#?}", job.stdout);
    let jobs: BTreeSet<&str> = b.iter().map(|f| f["job"].as_str()).collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(
        job.stdout
            .iter()
            .filter(|l| l.ends_with("] kvs=ok"))
            .count(),
        3
    );
    assert_all_gone(&job, 3);

    let mut cmd = Command::new(AMPROBE);
    cmd.args(["--self-launch", "3", "--exit-rank", "2", "--exit-code", "6"])
        .env_remove("AM_RANK");
    let job = start(cmd).finish();
    assert_eq!(job.code, 6, "{}", job.stderr);
}
