//! An idle progress thread sleeps: in a test binary of its own, its tests one at a time,
//! because it reads the CPU time of every thread of the process named `amnet-progress-*`, and
//! other tests' progress threads would count.

use std::time::Duration;

use am_core::{
    run_ranks, Config, Handlers, Loopback, LoopbackConfig, Node, ProgressThread, SharedNode,
};

mod watchdog;
use watchdog::within;

/// Held by each test of this binary for its whole run: the other test's progress thread
/// (which polls without sleeping, then exits) must not be counted by, or vanish during,
/// `idle_progress_threads_sleep`'s measurement.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ALONE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Idle progress threads sleep armed on their nodes' wake descriptors: over a second in which
/// no rank sends, two "processes" of two endpoints each, each with one progress thread over
/// both its endpoints, use a small fraction of a core together. Progress threads that polled,
/// or slept in short steps, would use far more. (`wait_any.rs` tests that a message to any
/// node of a set ends a sleep armed on all of them, the arming this thread sleeps through.)
#[test]
fn idle_progress_threads_sleep() {
    let _alone = alone();
    within(Duration::from_secs(60), || {
        let together = std::sync::Barrier::new(2);
        let mut transports = Loopback::cluster(4, LoopbackConfig::default()).into_iter();
        let processes: Vec<Vec<Loopback>> = (0..2)
            .map(|_| transports.by_ref().take(2).collect())
            .collect();
        let used = run_ranks(processes, |endpoints| {
            let parts = endpoints.into_iter().map(|t| (t, Handlers::new()));
            let nodes: Vec<SharedNode<Loopback>> = Node::start_all(parts, Config::default())
                .unwrap()
                .into_iter()
                .map(SharedNode::new)
                .collect();
            let progress = ProgressThread::spawn_all(nodes.clone()).unwrap();
            std::thread::scope(|s| {
                for node in &nodes {
                    s.spawn(|| node.barrier().unwrap());
                }
            });
            together.wait();
            let before = progress_threads_cpu();
            let t0 = std::time::Instant::now();
            std::thread::sleep(Duration::from_secs(1));
            let share =
                (progress_threads_cpu() - before).as_secs_f64() / t0.elapsed().as_secs_f64();
            together.wait();
            progress.stop().unwrap();
            std::thread::scope(|s| {
                for node in &nodes {
                    s.spawn(|| node.barrier().unwrap());
                }
            });
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

/// A transport whose arming always finds work (as any does when a message comes between a
/// poll and the arming): the idle progress thread must poll again and still stop when asked.
struct NeverSleeps(am_core::Loopback);

impl am_core::Tx for NeverSleeps {
    am_core::forward_transport!(field 0; try_send);
}

impl am_core::Transport for NeverSleeps {
    am_core::forward_transport!(field 0; rank, size, segment, poll_recv, wake_fd);
    /// Loopback's limits and name, and nothing done by the NIC itself.
    fn info(&self) -> am_core::NicInfo {
        let inner = self.0.info();
        am_core::NicInfo::new(inner.name, inner.limits)
    }
    fn arm(&mut self) -> Result<am_core::Armed, am_core::TransportError> {
        Ok(am_core::Armed::Ready)
    }
}

/// An idle progress thread whose arming says `Ready` every time goes on polling (it must not
/// take the node's lock twice) and stops when asked.
#[test]
fn a_progress_thread_whose_arming_finds_work_stops() {
    let _alone = alone();
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(1, LoopbackConfig::default()), |t| {
            let node = SharedNode::new(
                Node::new(NeverSleeps(t), Handlers::new(), Config::default()).unwrap(),
            );
            let progress = ProgressThread::spawn(node.clone()).unwrap();
            // Long enough to go idle and arm many times.
            std::thread::sleep(Duration::from_millis(100));
            progress.stop().unwrap();
            node.barrier().unwrap();
        });
    });
}
