//! One thread driving several nodes: `wait_any` sleeps until any of them has work, and a
//! progress thread over a set serves every node of it.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use am_core::{
    wait_any, AmKind, Armed, Config, FaultConfig, FaultInjector, HandlerId, Handlers, Loopback,
    LoopbackConfig, Node, ProgressThread, SharedNode, Transport, TransportError, Tx,
};

mod watchdog;
use watchdog::within;

const HIT: HandlerId = HandlerId(1);
const ECHO: HandlerId = HandlerId(2);
const ECHOED: HandlerId = HandlerId(3);

/// Nodes started together from this thread (see [`handlers`]).
fn nodes(ts: Vec<Loopback>, hits: &Arc<AtomicU32>) -> Vec<Node<Loopback>> {
    let parts = ts.into_iter().map(|t| (t, handlers(hits)));
    Node::start_all(parts, Config::default()).unwrap()
}

/// Handlers: HIT counts into `hits`, ECHO answers with ECHOED, and ECHOED counts into `hits`
/// too.
fn handlers(hits: &Arc<AtomicU32>) -> Handlers {
    let mut handlers = Handlers::new();
    let h = hits.clone();
    handlers
        .request(HIT, "hit", AmKind::Short, move |_, _| {
            h.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
    handlers
        .request(ECHO, "echo", AmKind::Short, |_, token| {
            token.reply_short(ECHOED, &[]).unwrap();
        })
        .unwrap();
    let h = hits.clone();
    handlers
        .reply(ECHOED, "echoed", AmKind::Short, move |_| {
            h.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
    handlers
}

/// Two nodes of this thread through a barrier (each a thread while it lasts: a barrier
/// blocks).
fn barrier_both(a: &mut Node<Loopback>, b: &mut Node<Loopback>) {
    std::thread::scope(|s| {
        s.spawn(|| a.barrier().unwrap());
        b.barrier().unwrap();
    });
}

/// Ranks 0 and 1 are driven by one thread; rank 2 sends to rank 1 only, then to rank 0 only.
/// Each message must wake the sleeping thread: a wait that armed or watched only some of
/// the nodes would sleep through its whole (long) timeout and return `false`.
#[test]
fn a_message_to_any_node_wakes_the_thread() {
    within(Duration::from_secs(60), || {
        let mut ts = Loopback::cluster(3, LoopbackConfig::default());
        let hits = Arc::new(AtomicU32::new(0));
        let sender = ts.pop().unwrap();
        // The driver says when it is about to sleep; the sender then waits a little more
        // before it sends, so that the message usually finds the driver asleep (a message
        // that comes before the sleep is seen by the arming, as it must be, and proves less).
        let (sleeping, about_to_sleep) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            let hits = &hits;
            s.spawn(move || {
                let mut sender = nodes(vec![sender], &Arc::new(AtomicU32::new(0))).remove(0);
                for dest in [1, 0] {
                    about_to_sleep.recv().unwrap();
                    std::thread::sleep(Duration::from_millis(20));
                    sender.request_short(dest, HIT, &[]).unwrap();
                }
                sender.barrier().unwrap();
            });
            let mut mine = nodes(ts, hits);
            let mut refs: Vec<&mut Node<Loopback>> = mine.iter_mut().collect();
            for k in 1..=2 {
                sleeping.send(()).unwrap();
                while hits.load(Ordering::Relaxed) < k {
                    let mut handled = 0;
                    for node in refs.iter_mut() {
                        handled += node.poll().unwrap();
                    }
                    if handled == 0 {
                        let woken = wait_any(&mut refs, Duration::from_secs(30)).unwrap();
                        assert!(woken, "message {k} did not wake the thread");
                    }
                }
            }
            // The barrier needs all three; one thread drives both of its nodes through it.
            let [a, b] = &mut refs[..] else {
                unreachable!()
            };
            barrier_both(a, b);
        });
    });
}

/// A message that is already there: the wait returns at once (its timeout would outlast the
/// watchdog); with nothing there, it returns `false` when its time is up.
#[test]
fn waiting_work_returns_at_once_and_nothing_times_out() {
    within(Duration::from_secs(60), || {
        let hits = Arc::new(AtomicU32::new(0));
        let mut both = nodes(Loopback::cluster(2, LoopbackConfig::default()), &hits);
        let mut b = both.pop().unwrap();
        let mut a = both.pop().unwrap();
        assert!(!wait_any(&mut [&mut a, &mut b], Duration::from_millis(20)).unwrap());
        a.request_short(1, HIT, &[]).unwrap();
        assert!(wait_any(&mut [&mut a, &mut b], Duration::from_secs(3600)).unwrap());
        // The nodes were disarmed: they poll and answer as before.
        while hits.load(Ordering::Relaxed) < 1 {
            b.poll().unwrap();
        }
        barrier_both(&mut a, &mut b);
    });
}

/// One progress thread over both endpoints of a "process" (ranks 0 and 1) whose own threads
/// never poll: a third rank's requests to either endpoint are answered. A progress thread
/// that served only its first node would leave the requests to the second unanswered.
#[test]
fn a_progress_thread_serves_every_node_of_its_set() {
    within(Duration::from_secs(60), || {
        let answers = Arc::new(AtomicU32::new(0));
        let mut all = nodes(Loopback::cluster(3, LoopbackConfig::default()), &answers);
        let mut asker = all.pop().unwrap();
        let nodes: Vec<SharedNode<Loopback>> = all.into_iter().map(SharedNode::new).collect();
        let progress = ProgressThread::spawn_all(nodes.clone()).unwrap();
        let (asked, all_asked) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            s.spawn(|| {
                for round in 0..50u32 {
                    asker.request_short(round % 2, ECHO, &[]).unwrap();
                    let want = round + 1;
                    asker
                        .wait_until(|| answers.load(Ordering::Relaxed) >= want)
                        .unwrap();
                }
                asked.send(()).unwrap();
                asker.barrier().unwrap();
            });
            // The endpoints' own threads touch their nodes only for the final barrier, once
            // every request was answered: until then only the progress thread polls them.
            all_asked.recv().unwrap();
            for n in &nodes {
                s.spawn(|| n.barrier().unwrap());
            }
        });
        progress.stop().unwrap();
        assert_eq!(answers.load(Ordering::Relaxed), 50);
    });
}

/// A Loopback rank that records whether it is armed: from an arming that succeeded (whether
/// it answered `Sleep` or `Ready`: either is to be followed by a disarm) until a disarm.
struct Watched {
    inner: Loopback,
    armed: Arc<AtomicBool>,
}

impl Tx for Watched {
    am_core::forward_transport!(field inner; try_send);
}

impl Transport for Watched {
    am_core::forward_transport!(field inner; rank, size, segment, poll_recv, wait, wake_fd,
        close);
    /// Loopback's limits, and nothing done by the NIC itself.
    fn info(&self) -> am_core::transport::NicInfo {
        am_core::transport::NicInfo::new("loopback-watched", self.inner.info().limits)
    }
    fn arm(&mut self) -> Result<Armed, TransportError> {
        let armed = self.inner.arm()?;
        self.armed.store(true, Ordering::Relaxed);
        Ok(armed)
    }
    fn disarm(&mut self) {
        self.armed.store(false, Ordering::Relaxed);
        self.inner.disarm()
    }
}

/// Rank 1 has a message waiting, so its arming answers `Ready` (after rank 0's, which
/// sleeps): the wait returns at once, and leaves neither node armed. Catches the arming loop
/// that counted the nodes armed without the one that answered `Ready`, which then stayed
/// armed for good (its peers paying a wake-up for it, its descriptor readable, the next
/// wait returning at once).
#[test]
fn a_node_whose_arming_answers_ready_is_disarmed_too() {
    within(Duration::from_secs(60), || {
        let hits = Arc::new(AtomicU32::new(0));
        let flags: Vec<Arc<AtomicBool>> = (0..2).map(|_| Arc::default()).collect();
        let parts = Loopback::cluster(2, LoopbackConfig::default())
            .into_iter()
            .zip(&flags)
            .map(|(inner, armed)| {
                let armed = armed.clone();
                (Watched { inner, armed }, handlers(&hits))
            });
        let mut both = Node::start_all(parts, Config::default()).unwrap();
        let mut b = both.pop().unwrap();
        let mut a = both.pop().unwrap();
        a.request_short(1, HIT, &[]).unwrap();
        assert!(wait_any(&mut [&mut a, &mut b], Duration::from_secs(3600)).unwrap());
        let armed: Vec<bool> = flags.iter().map(|f| f.load(Ordering::Relaxed)).collect();
        assert_eq!(armed, [false, false], "nodes left armed after the wait");
        while hits.load(Ordering::Relaxed) < 1 {
            b.poll().unwrap();
        }
        std::thread::scope(|s| {
            s.spawn(|| a.barrier().unwrap());
            b.barrier().unwrap();
        });
    });
}

/// Two nodes started together from this thread, rank 1's sends all held back by a fault
/// injector for up to 1000 of its later sends or polls (a lossy link's retransmission comes
/// as late): rank 1 starts once it has rank 0's verdict, but rank 0 starts only once rank
/// 1's answer to it is in, which only rank 1's polls let out. Catches `Node::start_all`
/// polling only the nodes not yet started: rank 1's answer then stayed held and rank 0
/// waited for ever (the start-up hang seen over lossy udp).
#[test]
fn start_all_polls_the_nodes_already_started() {
    within(Duration::from_secs(60), || {
        let hits = Arc::new(AtomicU32::new(0));
        let held_back = FaultConfig::new().seed(7).delay(1.0).max_delay(1000);
        let parts = Loopback::cluster(2, LoopbackConfig::default())
            .into_iter()
            .map(|t| {
                let faults = if t.rank() == 1 {
                    held_back
                } else {
                    FaultConfig::new()
                };
                (FaultInjector::new(t, faults), handlers(&hits))
            });
        let mut both = Node::start_all(parts, Config::default()).unwrap();
        let mut b = both.pop().unwrap();
        let mut a = both.pop().unwrap();
        assert!(
            b.transport().stats().delayed > 0,
            "rank 1's sends held back"
        );
        // Started: a request goes through, and both close (together: each waits for what
        // the other owes it).
        b.request_short(0, HIT, &[]).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                a.wait_until(|| hits.load(Ordering::Relaxed) == 1).unwrap();
                a.barrier().unwrap();
                a.close().unwrap();
            });
            b.barrier().unwrap();
            b.close().unwrap();
        });
    });
}
