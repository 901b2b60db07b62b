//! Whole-job behaviour of `amnet::run_job` on Loopback: `Node::exit(code)` from one rank ends
//! the job with that code, a panicking rank aborts the job instead of hanging it, and a rank's
//! error fails the job. Each scenario runs in a child process (this test binary re-executed
//! with `AM_JOB_EXIT_CHILD` set), because ending the job ends the process.

use std::process::Command;
use std::time::{Duration, Instant};

use amnet::{
    AmKind, AsyncNode, Config, HandlerId, Handlers, JobError, JobOptions, Node, SharedNode,
    WaitMode,
};

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
        let mut h = Handlers::new();
        h.request(HandlerId(1), "noop", AmKind::Short, |_, _| {})
            .unwrap();
        let mut node = Node::new(t, h, config()).map_err(|e| e.to_string())?;
        match (scenario.as_str(), node.rank()) {
            // Others wait in a barrier that rank 1 never joins: only its exit can end them.
            ("exit", 1) => node.exit(7),
            ("shared_exit", 1) => SharedNode::new(node).exit(8),
            ("async_exit", 1) => AsyncNode::new(node).exit(9),
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

/// The same from a shared driver, which holds the node behind a lock.
#[test]
fn exit_from_a_shared_or_async_node_ends_the_job_with_its_code() {
    assert_eq!(run_child("shared_exit"), 8);
    assert_eq!(run_child("async_exit"), 9);
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

/// With several endpoints per process, the process that failed first is the one reported, not
/// one that failed only because it left, though an endpoint of the latter left first having
/// finished its work. Process 0's endpoint 0 finishes and drops its transport; then process 1
/// fails on its own (dropping both of its endpoints, having heard of nothing); process 0's
/// endpoint 1 then hears that process 1 has gone (or that the job was aborted for it) and
/// fails for it. Catches a cause chosen by
/// each process's earliest departure alone, which names process 0 (its endpoint 0 left
/// first). Runs in this process: a failing job ends no process.
#[test]
fn the_cause_is_reported_not_a_process_whose_endpoint_left_first() {
    use amnet::Transport;
    use std::sync::atomic::{AtomicBool, Ordering};
    let left = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(10);
    let result = amnet::run_job_endpoints(&opts(2), 2, |endpoints| {
        let layout = endpoints.layout();
        let process = endpoints.process();
        let mut transports = endpoints.into_transports();
        let Some(mut second) = transports.pop() else {
            return Err("no endpoint 1".to_string());
        };
        drop(transports);
        if process == 0 {
            left.store(true, Ordering::Release);
            // Endpoint 1 waits for process 1 to go; the departures of its own process's
            // endpoint (and the job's abort) are not what it waits for.
            while Instant::now() < deadline {
                match second.poll_recv(|_, _, _| ()) {
                    Err(amnet::TransportError::PeerDeparted(r)) if layout.process_of(r) == 1 => {
                        return Err(format!("process 0: process 1's endpoint {r} left"));
                    }
                    Err(amnet::TransportError::PeerDeparted(_)) | Ok(_) => std::thread::yield_now(),
                    Err(e) => return Err(format!("process 0: {e}")),
                }
            }
            return Err("process 0: process 1 never left".to_string());
        }
        while !left.load(Ordering::Acquire) && Instant::now() < deadline {
            std::thread::yield_now();
        }
        drop(second);
        Err("process 1 fails".to_string())
    });
    match result {
        Err(JobError::RankFailed { rank, message }) => {
            assert_eq!((rank, message.as_str()), (1, "process 1 fails"));
        }
        other => panic!("{other:?}"),
    }
}

/// The rank that failed first is reported though it had heard of a peer's clean departure
/// before failing, when the rank that failed for it learnt of its departure from a send
/// rather than a poll: rank 0 finishes and leaves; rank 1 hears of it, then fails on its own;
/// rank 2, which never polls, then fails on a send to rank 1. Catches a cause chosen among
/// the processes told of no other's end where what a send met is not counted as told (rank 2
/// would seem to have failed on its own, and be named).
#[test]
fn the_cause_is_reported_though_it_heard_of_a_clean_departure() {
    use amnet::{Outgoing, SendError, Transport, TransportError, Tx};
    use std::sync::atomic::{AtomicBool, Ordering};
    let (left, sent) = (AtomicBool::new(false), AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(10);
    let result = amnet::run_job(&opts(3), |mut t| match t.rank() {
        0 => Ok(()),
        1 => {
            while Instant::now() < deadline {
                match t.poll_recv(|_, _, _| ()) {
                    Err(TransportError::PeerDeparted(0)) => break,
                    Ok(_) => std::thread::yield_now(),
                    Err(e) => return Err(format!("rank 1: {e}")),
                }
            }
            drop(t);
            left.store(true, Ordering::Release);
            // Returned once rank 2 has sent: the job's abort, which follows the first error
            // returned, must not be what rank 2's send meets.
            while !sent.load(Ordering::Acquire) && Instant::now() < deadline {
                std::thread::yield_now();
            }
            Err("rank 1 fails".to_string())
        }
        _ => {
            while !left.load(Ordering::Acquire) && Instant::now() < deadline {
                std::thread::yield_now();
            }
            let to_1 = t.try_send(1, &Outgoing::new(&[0; 8], &[]));
            sent.store(true, Ordering::Release);
            match to_1 {
                Err(SendError::PeerDeparted(1)) => Err("rank 2: rank 1 left".to_string()),
                other => Err(format!("rank 2: a send to rank 1: {other:?}")),
            }
        }
    });
    match result {
        Err(JobError::RankFailed { rank, message }) => {
            assert_eq!((rank, message.as_str()), (1, "rank 1 fails"));
        }
        other => panic!("{other:?}"),
    }
}
