//! Helpers shared by the example tests.

use std::path::PathBuf;

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
