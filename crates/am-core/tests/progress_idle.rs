//! An idle progress thread sleeps: alone in its test binary, because it reads the CPU time of
//! every thread of the process named `amnet-progress-*`, and the other tests' progress threads
//! would count.

use std::time::Duration;

use am_core::{
    run_ranks, Config, Handlers, Loopback, LoopbackConfig, Node, ProgressThread, SharedNode,
};

mod watchdog;
use watchdog::within;

/// Idle progress threads sleep armed on their nodes' wake descriptors: over a second in which
/// no rank sends, both ranks' progress threads together use a small fraction of a core.
/// Progress threads that polled, or slept in short steps, would use far more.
#[test]
fn idle_progress_threads_sleep() {
    within(Duration::from_secs(60), || {
        let together = std::sync::Barrier::new(2);
        let used = run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let node = SharedNode::new(Node::new(t, Handlers::new(), Config::default()).unwrap());
            let progress = ProgressThread::spawn(node.clone()).unwrap();
            node.barrier().unwrap();
            together.wait();
            let before = progress_threads_cpu();
            let t0 = std::time::Instant::now();
            std::thread::sleep(Duration::from_secs(1));
            let share =
                (progress_threads_cpu() - before).as_secs_f64() / t0.elapsed().as_secs_f64();
            together.wait();
            progress.stop().unwrap();
            node.barrier().unwrap();
            share
        });
        assert!(
            used[0] < 0.05,
            "idle progress threads used {:.1}% of a core",
            used[0] * 100.0
        );
    });
}

/// CPU time of this process's progress threads (named `amnet-progress-<rank>`), from
/// `/proc/self/task/*/stat` (in ticks of 10 ms): the test harness runs other tests beside
/// this one, in the same process.
fn progress_threads_cpu() -> Duration {
    let mut ticks = 0u64;
    for task in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        if !stat[open + 1..close].starts_with("amnet-progress") {
            continue;
        }
        // After the name: state, then fields 4.., of which utime and stime are 14 and 15.
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        ticks += fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    }
    Duration::from_millis(10 * ticks)
}
