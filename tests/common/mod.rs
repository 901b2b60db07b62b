//! Helpers shared by the root crate's integration tests.

use std::path::PathBuf;

use am_perf::launch::marked_processes;

/// An example binary, built next to the test binaries' directory by `cargo test`.
#[allow(dead_code)]
pub fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} not built: `cargo test` builds examples unless filtered with --test; run `cargo build --example {name}` first",
        path.display()
    );
    path
}

/// What a finished program printed and its exit code.
#[allow(dead_code)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Runs `cmd` (in its own process group) to the end, bounded by `watchdog`: past it the
/// whole group is killed and the test fails, so a hung job cannot hang the suite.
#[allow(dead_code)]
pub fn run_bounded(mut cmd: std::process::Command, watchdog: std::time::Duration) -> Run {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    use std::process::Stdio;
    let mut child = cmd
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let pid = child.id() as i32;
    let mut out = child.stdout.take().expect("piped stdout");
    let mut err = child.stderr.take().expect("piped stderr");
    let stdout = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = match rx.recv_timeout(watchdog) {
        Ok(status) => status.expect("wait for the program"),
        Err(_) => {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("{cmd:?} did not finish within {watchdog:?}");
        }
    };
    Run {
        code: status.code().unwrap_or(-1),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    }
}

/// Under a launcher, `random_access --json` on 4 ranks verifies on sci, extoll, portals and
/// udp, and with no transport named runs on sci (the launcher default on one host).
/// `launch(args)` starts `random_access args` on 4 ranks; `label` names the launcher.
#[allow(dead_code)]
pub fn random_access_on_every_process_transport(
    label: &str,
    mut launch: impl FnMut(&[&str]) -> Run,
) {
    for (transport, expect) in [
        (Some("sci"), "sci"),
        (Some("extoll"), "extoll"),
        (Some("portals"), "portals"),
        (Some("udp"), "udp"),
        (None, "sci"),
    ] {
        let mut args = vec!["--log2-table", "14", "--json"];
        if let Some(t) = transport {
            args.extend(["--transport", t]);
        }
        let job = launch(&args);
        assert_eq!(
            job.code, 0,
            "{label} {transport:?}:\n{}\n{}",
            job.stdout, job.stderr
        );
        let row: serde_json::Value = serde_json::from_str(job.stdout.trim())
            .unwrap_or_else(|e| panic!("{label} {transport:?}: {e}: {}", job.stdout));
        assert_eq!(row["transport"], expect, "{label}: {row}");
        assert_eq!(row["ranks"], 4, "{label}: {row}");
        assert_eq!(row["verified"], true, "{label}: {row}");
    }
}

/// Runs `f` on its own thread; panics if it has not finished within `limit` (the thread is
/// then left behind, and dies with the process), and re-raises its panic.
#[allow(dead_code)]
pub fn within<R: Send + 'static>(
    limit: std::time::Duration,
    f: impl FnOnce() -> R + Send + 'static,
) -> R {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    match rx.recv_timeout(limit) {
        Ok(Ok(r)) => r,
        Ok(Err(p)) => std::panic::resume_unwind(p),
        Err(e) => panic!("the job did not finish within {limit:?} ({e}): a rank hangs"),
    }
}

/// Runs `rank` on every endpoint of a job of `opts` with two endpoints per process
/// ([`amnet::run_job_endpoints`]), each endpoint on a thread of its own, and checks that the
/// job ended with 0: an endpoint's error fails its process, and so the job.
#[allow(dead_code)]
pub fn on_two_endpoints_per_process(
    opts: &amnet::JobOptions,
    rank: impl Fn(amnet::AnyTransport) -> anyhow::Result<()> + Sync,
) {
    let rank = &rank;
    let code = amnet::run_job_endpoints(opts, 2, |endpoints| {
        std::thread::scope(|s| {
            let threads: Vec<_> = endpoints
                .into_transports()
                .into_iter()
                .map(|t| s.spawn(move || rank(t)))
                .collect();
            for t in threads {
                t.join().expect("an endpoint's thread")?;
            }
            Ok::<(), anyhow::Error>(())
        })
    })
    .expect("the job");
    assert_eq!(code, 0);
}

/// Runs `rank` on every transport of `cluster`, the ranks as threads of this process
/// ([`amnet::run_ranks`]), and fails on an error of any, `what` naming the transport.
#[allow(dead_code)]
pub fn on_threads<T: Send>(
    what: &str,
    cluster: Vec<T>,
    rank: impl Fn(T) -> anyhow::Result<()> + Sync,
) {
    for r in amnet::run_ranks(cluster, rank) {
        r.unwrap_or_else(|e| panic!("{what} rank: {e:?}"));
    }
}

/// CPU time used so far by `pid`, in clock ticks (0 if it is gone).
fn cpu_ticks(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // Fields after the command's closing parenthesis: utime and stime are the 12th and 13th.
    stat.rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|f| f.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0)
}

/// Starts `launcher` (its own arguments given, before the program) on 4 ranks of the
/// `pingpong` example flooding each other with Shorts on sci, kills it with SIGKILL
/// mid-flood, and checks that every rank ended within two seconds of it and that no
/// `/dev/shm` file of the job is left ([`kill_launcher_mid_flood`]). `what` names the case
/// in the mark and in a failure.
#[allow(dead_code)]
pub fn ranks_end_when_launcher_is_killed(mut launcher: std::process::Command, what: &str) {
    use std::process::Stdio;
    use std::time::Duration;
    let mark = format!("kill-{}-{}", what.replace(' ', "-"), std::process::id());
    let program = example("pingpong");
    let launcher = launcher
        .arg(&program)
        .args(["--kind", "short", "--iters", "100000000", "--flood", "10"])
        .env("AM_TEST_MARK", &mark)
        .env("AM_TRANSPORT", "sci")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: start the launcher: {e}"));
    match kill_launcher_mid_flood(launcher, &program, &mark, 4, Duration::from_secs(10)) {
        Ok(took) => {
            eprintln!("{what}: the ranks ended {took:?} after the launcher's SIGKILL");
            assert!(
                took < Duration::from_secs(2),
                "{what}: ranks took {took:?} to end"
            );
        }
        Err(left) => panic!("{what}: ranks {left:?} outlived their launcher by 10 s"),
    }
}

/// Kills `launcher` (a process group leader or not) with SIGKILL while the job's `ranks`
/// ranks, marked with `mark` ([`marked_processes`]), flood; returns how long the ranks took
/// to end after it, or the pids still alive after `limit` (killed then, so that nothing is
/// left behind). Also checks that no `/dev/shm` file of the job's is left.
#[allow(dead_code)]
pub fn kill_launcher_mid_flood(
    mut launcher: std::process::Child,
    program: &std::path::Path,
    mark: &str,
    ranks: usize,
    limit: std::time::Duration,
) -> Result<std::time::Duration, Vec<u32>> {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    use std::time::{Duration, Instant};
    let deadline = Instant::now() + limit;
    let mut pids = marked_processes(program, mark);
    while pids.len() < ranks {
        if Instant::now() > deadline {
            let _ = launcher.kill();
            let _ = launcher.wait();
            for &p in &marked_processes(program, mark) {
                let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
            }
            panic!("only {} of {ranks} ranks started", pids.len());
        }
        std::thread::sleep(Duration::from_millis(20));
        pids = marked_processes(program, mark);
    }
    // Mid-flood: past start-up, the ranks have used half a second of CPU between them.
    while pids.iter().map(|&p| cpu_ticks(p)).sum::<u64>() < 50 {
        assert!(Instant::now() < deadline, "the ranks never got going");
        std::thread::sleep(Duration::from_millis(20));
    }
    let job_ids: Vec<String> = pids
        .iter()
        .filter_map(|p| std::fs::read(format!("/proc/{p}/environ")).ok())
        .flat_map(|env| {
            env.split(|&b| b == 0)
                .filter_map(|v| v.strip_prefix(b"AM_JOB_ID="))
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .collect::<Vec<_>>()
        })
        .collect();
    launcher.kill().expect("kill the launcher");
    let _ = launcher.wait();
    let killed = Instant::now();
    let end = killed + limit;
    let left = loop {
        let left = marked_processes(program, mark);
        if left.is_empty() || Instant::now() > end {
            break left;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    for &p in &left {
        let _ = kill(Pid::from_raw(p as i32), Signal::SIGKILL);
    }
    let files: Vec<String> = std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .filter(|f| job_ids.iter().any(|j| f.starts_with(&format!("am-{j}-"))))
                .collect()
        })
        .unwrap_or_default();
    assert!(files.is_empty(), "left in /dev/shm: {files:?}");
    if left.is_empty() {
        Ok(killed.elapsed())
    } else {
        Err(left)
    }
}
