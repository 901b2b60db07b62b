//! Whole-job behaviour of `amnet::run_job` on Loopback: `Node::exit(code)` from one rank ends
//! the job with that code, a panicking rank aborts the job instead of hanging it, and a rank's
//! error fails the job. Each scenario runs in a child process (this test binary re-executed
//! with `AM_JOB_EXIT_CHILD` set), because ending the job ends the process.

use std::process::Command;
use std::time::{Duration, Instant};

use amnet::{AmKind, Config, HandlerId, Handlers, JobError, JobOptions, Node, WaitMode};

const CHILD: &str = "AM_JOB_EXIT_CHILD";

fn opts(ranks: u32) -> JobOptions {
    JobOptions::new().ranks(ranks)
}

fn config() -> Config {
    Config::default().wait_mode(WaitMode::Block)
}

/// Runs this test binary's `child` test in a fresh process with the scenario named; returns
/// its exit code.
fn run_child(scenario: &str) -> i32 {
    let t0 = Instant::now();
    // Output captured: the child's own test harness lines must not read as this run's results.
    let out = Command::new(std::env::current_exe().expect("test exe"))
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD, scenario)
        .env_remove("AM_RANK")
        .output()
        .expect("spawn child");
    let log = format!(
        "child {scenario}: {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(t0.elapsed() < Duration::from_secs(30), "too slow: {log}");
    let code = out.status.code().unwrap_or_else(|| panic!("killed: {log}"));
    eprintln!("{log}");
    code
}

/// The scenarios, run only inside the child process.
#[test]
fn child() {
    let Ok(scenario) = std::env::var(CHILD) else {
        return;
    };
    let result = amnet::run_job(&opts(4), |t| {
        let mut h = Handlers::local();
        h.request(HandlerId(1), "noop", AmKind::Short, |_, _| {})
            .unwrap();
        let mut node = Node::new(t, h, config()).map_err(|e| e.to_string())?;
        match (scenario.as_str(), node.rank()) {
            // Others wait in a barrier that rank 1 never joins: only its exit can end them.
            ("exit", 1) => node.exit(7),
            ("panic", 2) => panic!("rank 2 gives up"),
            ("error", 3) => return Err("rank 3 fails".to_string()),
            _ => {}
        }
        node.barrier().map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    });
    match result {
        Ok(code) => std::process::exit(code),
        Err(JobError::RankFailed { rank, .. }) => std::process::exit(50 + rank as i32),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn exit_from_one_rank_ends_the_job_with_its_code() {
    assert_eq!(run_child("exit"), 7);
}

#[test]
fn a_panicking_rank_aborts_the_job() {
    // The panic is re-raised by run_job once every rank has stopped: Rust's panic exit code.
    assert_eq!(run_child("panic"), 101);
}

#[test]
fn a_rank_error_fails_the_job() {
    assert_eq!(run_child("error"), 53);
}

#[test]
fn a_clean_job_exits_zero() {
    assert_eq!(run_child("clean"), 0);
}

#[test]
fn loopback_refuses_to_span_processes() {
    let probe = env!("CARGO_BIN_EXE_amrun");
    // Loopback ranks are threads: a 2-process job on it is a configuration error.
    let out = Command::new(probe)
        .args(["-n", "2", "--transport", "loopback", "--"])
        .arg(std::env::current_exe().expect("test exe"))
        .args(["--exact", "child", "--nocapture"])
        .env(CHILD, "clean")
        .output()
        .expect("amrun");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr.contains("runs ranks as threads"),
        "clear error expected, got: {stderr}"
    );
}

/// The rank that fails first is the one reported, even when a peer notices it has gone and
/// fails before it has reported itself: rank 3 leaves (drops its node) and takes its time
/// before returning its error; rank 2, once it is gone, fails on its first send to it (the
/// others are then aborted). Runs in this process: a failing job ends no process.
#[test]
fn the_cause_is_reported_not_the_peers_it_failed() {
    let left = std::sync::atomic::AtomicBool::new(false);
    let result = amnet::run_job(&opts(4), |t| {
        use std::sync::atomic::Ordering;
        let mut node = Node::new(t, Handlers::local(), config()).map_err(|e| e.to_string())?;
        match node.rank() {
            3 => {
                drop(node);
                left.store(true, Ordering::Release);
                std::thread::sleep(Duration::from_millis(300));
                return Err("rank 3 fails".to_string());
            }
            2 => {
                let t0 = Instant::now();
                while !left.load(Ordering::Acquire) && t0.elapsed() < Duration::from_secs(10) {
                    std::thread::yield_now();
                }
            }
            _ => {}
        }
        // Rank 2's first round sends to rank 3.
        node.barrier()
            .map_err(|e| format!("rank {}: {e}", node.rank()))
    });
    match result {
        Err(JobError::RankFailed { rank, message }) => {
            assert_eq!((rank, message.as_str()), (3, "rank 3 fails"));
        }
        other => panic!("{other:?}"),
    }
}
