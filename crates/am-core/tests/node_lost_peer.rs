//! After the transport reports a peer lost (once), the core remembers it: requests to it fail
//! at once, put/get in flight to it fail, quiesce and drop stop waiting for its replies, and
//! the other peers work as before. Also what the NIC's own put, get and atomics report: a
//! loss, recorded as a poll's would be, and a busy device, waited out.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use am_core::*;

/// Loopback that reports `PeerLost(victim)` from one poll once `trigger` is set: what a real
/// transport does when it notices a dead peer.
struct Losing<'a> {
    inner: Loopback,
    trigger: &'a AtomicUsize,
    reported: bool,
    /// Report the loss from `wait` (a blocking wait's liveness check) instead of a poll.
    from_wait: bool,
}

const VICTIM: Rank = 2;

impl Tx for Losing<'_> {
    am_core::forward_transport!(field inner; try_send);
}

impl Transport for Losing<'_> {
    am_core::forward_transport!(field inner; rank, size, segment);
    /// Loopback's limits, and nothing done by the NIC itself.
    fn info(&self) -> NicInfo {
        NicInfo::new("losing", self.inner.info().limits)
    }
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, am_core::SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        if !self.from_wait && !self.reported && self.trigger.load(Ordering::SeqCst) == 1 {
            self.reported = true;
            return Err(TransportError::PeerLost(VICTIM));
        }
        self.inner.poll_recv(f)
    }
    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        if self.from_wait && !self.reported && self.trigger.load(Ordering::SeqCst) == 1 {
            self.reported = true;
            return Err(TransportError::PeerLost(VICTIM));
        }
        self.inner.wait(timeout.min(Duration::from_millis(1)))
    }
}

/// Ends the test process if a test runs past `limit`: a wait that never ends (a loss that
/// is not marked, so a quiesce waits for the lost rank's reply) fails instead of hanging.
fn watchdog(name: &'static str, limit: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(limit);
        eprintln!("{name}: still running after {limit:?}: a wait on a lost peer never ended");
        std::process::exit(101);
    });
}

const REQ: HandlerId = HandlerId(1);
const REP: HandlerId = HandlerId(2);

#[test]
fn a_lost_peer_fails_fast_and_the_rest_goes_on() {
    watchdog(
        "a_lost_peer_fails_fast_and_the_rest_goes_on",
        Duration::from_secs(60),
    );
    // 0: victim stays silent; 1: trigger set; 2: victim may go.
    let state = AtomicUsize::new(0);
    // Set by the victim once it has stopped polling for good.
    let silent = AtomicUsize::new(0);
    let transports = Loopback::cluster(3, LoopbackConfig::default());
    run_ranks(transports, |t| {
        let mut handlers = Handlers::local();
        handlers
            .request(REQ, "req", AmKind::Short, |_, token| {
                let _ = token.reply_short(REP, &[]);
            })
            .unwrap();
        handlers.reply(REP, "rep", AmKind::Short, |_| {}).unwrap();
        let config = Config::default()
            .credits(am_core::Credits::Static(2))
            .wait_mode(WaitMode::Block);
        let rank = t.rank();
        let t = Losing {
            inner: t,
            trigger: &state,
            reported: rank == VICTIM,
            from_wait: false,
        };
        let mut node = Node::new(t, handlers, config).unwrap();
        node.barrier().unwrap();
        /// Releases the silent rank even if rank 0 panics, so a failure cannot hang the test.
        struct Release<'a>(&'a AtomicUsize);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.store(2, Ordering::SeqCst);
            }
        }
        match rank {
            0 => {
                let _release = Release(&state);
                node.wait_until(|| silent.load(Ordering::SeqCst) == 1)
                    .unwrap();
                // The victim acked the barrier before falling silent: all credits are back.
                node.quiesce().unwrap();
                assert_eq!(node.credits_available(VICTIM), 2);
                // Requests and a get to the victim, which never answers.
                node.try_request_short(VICTIM, REQ, &[]).unwrap();
                let get = node.get_nb(VICTIM, 0, 16).unwrap();
                assert!(matches!(
                    node.try_request_short(VICTIM, REQ, &[]),
                    Err(TryRequestError::WouldBlock)
                ));
                state.store(1, Ordering::SeqCst);
                // Exactly one PeerLost from polling.
                assert_eq!(node.poll(), Err(AmError::PeerLost(VICTIM)));
                assert_eq!(
                    node.request_short(VICTIM, REQ, &[]),
                    Err(AmError::PeerLost(VICTIM))
                );
                assert!(matches!(
                    node.try_request_short(VICTIM, REQ, &[]),
                    Err(TryRequestError::Failed(AmError::PeerLost(VICTIM)))
                ));
                assert_eq!(node.wait(get), Err(AmError::PeerLost(VICTIM)));
                assert_eq!(node.put(VICTIM, 0, &[1]), Err(AmError::PeerLost(VICTIM)));
                // The living peer still answers, and quiesce does not wait for the victim.
                node.request_short(1, REQ, &[]).unwrap();
                node.quiesce().unwrap();
                assert_eq!(node.get(1, 0, 4).unwrap(), vec![0; 4]);
                for _ in 0..10 {
                    assert_eq!(node.poll().map(|_| ()), Ok(()), "reported once only");
                }
                state.store(2, Ordering::SeqCst);
            }
            1 => {
                // Serve rank 0 until it is done with us; this survivor too hears of the loss once.
                let mut heard = 0;
                loop {
                    match node.wait_until(|| state.load(Ordering::SeqCst) == 2) {
                        Ok(()) => break,
                        Err(AmError::PeerLost(VICTIM)) => heard += 1,
                        Err(e) => panic!("rank 1: {e}"),
                    }
                }
                assert!(heard <= 1, "PeerLost reported {heard} times");
            }
            _ => {
                // The "dead" rank: silent until the others are done, then gone without polling.
                node.quiesce().unwrap();
                silent.store(1, Ordering::SeqCst);
                while state.load(Ordering::SeqCst) != 2 {
                    std::thread::yield_now();
                }
                std::mem::forget(node);
            }
        }
    });
}

/// A loss the transport reports from a blocking wait (where the NICs' liveness checks run)
/// counts as one reported by a poll: the core remembers it, so requests to the dead rank fail
/// at once and quiesce (and drop) stop waiting for its replies.
#[test]
fn a_loss_found_while_waiting_counts_too() {
    watchdog(
        "a_loss_found_while_waiting_counts_too",
        Duration::from_secs(60),
    );
    const SILENT: usize = 3;
    let state = AtomicUsize::new(0);
    let stopped = AtomicUsize::new(0);
    let transports = Loopback::cluster(3, LoopbackConfig::default());
    run_ranks(transports, |t| {
        let mut handlers = Handlers::local();
        handlers
            .request(REQ, "req", AmKind::Short, |_, _| {})
            .unwrap();
        let config = Config::default()
            .credits(am_core::Credits::Static(1))
            .wait_mode(WaitMode::Block)
            .spin_polls(0);
        let rank = t.rank();
        let t = Losing {
            inner: t,
            trigger: &state,
            reported: rank != 0,
            from_wait: true,
        };
        let mut node = Node::new(t, handlers, config).unwrap();
        node.barrier().unwrap();
        if rank == 0 {
            // Every credit back first (the barrier's messages are acknowledged only while the
            // others poll), then the others stop polling: the victim goes silent.
            node.quiesce().unwrap();
            state.store(SILENT, Ordering::SeqCst);
            while stopped.load(Ordering::SeqCst) != 2 {
                std::thread::yield_now();
            }
            // A request the silent victim never answers, then the loss, found while waiting.
            node.try_request_short(VICTIM, REQ, &[]).unwrap();
            state.store(1, Ordering::SeqCst);
            assert_eq!(node.quiesce(), Err(AmError::PeerLost(VICTIM)));
            assert!(matches!(
                node.try_request_short(VICTIM, REQ, &[]),
                Err(TryRequestError::Failed(AmError::PeerLost(VICTIM)))
            ));
            assert_eq!(node.quiesce(), Ok(()), "no wait for the lost rank's reply");
            state.store(2, Ordering::SeqCst);
        } else {
            while state.load(Ordering::SeqCst) != SILENT {
                node.poll().unwrap();
                std::thread::yield_now();
            }
            stopped.fetch_add(1, Ordering::SeqCst);
            while state.load(Ordering::SeqCst) != 2 {
                std::thread::yield_now();
            }
            std::mem::forget(node);
        }
    });
}

/// Loopback whose NIC-side put, get and atomics first answer what a shared-memory NIC may:
/// `PeerLost` toward `VICTIM` once its liveness check failed, before any poll reports it
/// (`victim_lost`), and `Busy` while `busy` counts down, doing nothing then (as portals does
/// while a word of the target's NI is corrupt).
struct NicSays<'a> {
    inner: Loopback,
    victim_lost: bool,
    busy: &'a AtomicUsize,
}

impl NicSays<'_> {
    fn first(&self, peer: Rank) -> Result<(), SendError> {
        if self.victim_lost && peer == VICTIM {
            return Err(SendError::PeerLost(VICTIM));
        }
        let busy = self
            .busy
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |b| b.checked_sub(1));
        match busy {
            Ok(_) => Err(SendError::Busy),
            Err(_) => Ok(()),
        }
    }
}

impl Tx for NicSays<'_> {
    am_core::forward_transport!(field inner; try_send);
}

impl Transport for NicSays<'_> {
    am_core::forward_transport!(field inner; rank, size, segment, poll_recv);
    /// Loopback's, named for the test.
    fn info(&self) -> NicInfo {
        let mut info = self.inner.info();
        info.name = "nic-says";
        info
    }
    /// Contiguous puts, gets and atomics ask `first` before Loopback does them; every other
    /// shape goes by pieces of those, posted atomics one `Atomic` each.
    fn rma(
        &mut self,
        request: am_core::transport::Rma<'_>,
    ) -> Result<am_core::transport::RmaDone, SendError> {
        use am_core::transport::{Remote, Rma, Sink, Source};
        match request {
            Rma::Put {
                dest,
                to: Remote::At(_),
                from: Source::Bytes(_),
            }
            | Rma::Get {
                src: dest,
                from: Remote::At(_),
                into: Sink::Bytes(_),
            }
            | Rma::Atomic {
                dest,
                at: Remote::At(_),
                ..
            } => {
                self.first(dest)?;
                self.inner.rma(request)
            }
            other => am_core::rma::by_pieces(self, other),
        }
    }
}

/// A loss the NIC finds during a put is the core's too: the put fails with `PeerLost`, and
/// so does every later call on that peer, at once, while the other peer works as before.
#[test]
fn a_loss_found_by_a_put_marks_the_peer_lost() {
    watchdog(
        "a_loss_found_by_a_put_marks_the_peer_lost",
        Duration::from_secs(60),
    );
    let not_busy = AtomicUsize::new(0);
    let done = RankZeroDone::default();
    run_ranks(Loopback::cluster(3, LoopbackConfig::default()), |t| {
        let mut handlers = Handlers::local();
        handlers
            .request(REQ, "req", AmKind::Short, |_, token| {
                let _ = token.reply_short(REP, &[]);
            })
            .unwrap();
        handlers.reply(REP, "rep", AmKind::Short, |_| {}).unwrap();
        let t = NicSays {
            inner: t,
            victim_lost: true,
            busy: &not_busy,
        };
        let mut node = Node::new(t, handlers, Config::default()).unwrap();
        if node.rank() == 0 {
            let _done = done.guard();
            assert_eq!(node.put(VICTIM, 0, &[1]), Err(AmError::PeerLost(VICTIM)));
            assert_eq!(
                node.request_short(VICTIM, REQ, &[]),
                Err(AmError::PeerLost(VICTIM))
            );
            assert_eq!(node.get(VICTIM, 0, 8), Err(AmError::PeerLost(VICTIM)));
            let mut buf = [7u8; 4];
            assert_eq!(
                node.get_into(VICTIM, 0, &mut buf),
                Err(AmError::PeerLost(VICTIM))
            );
            assert_eq!(buf, [7; 4], "a failed get wrote");
            node.put(1, 0, &[5]).unwrap();
            assert_eq!(node.get(1, 0, 1).unwrap(), [5]);
        }
        // Nobody leaves before rank 0 is done (a departure would be reported first).
        done.wait(node.rank());
        std::mem::forget(node);
    });
}

/// A busy NIC is waited out: the blocking put, get and atomic succeed once it is free, each
/// done once.
#[test]
fn a_busy_nic_is_waited_out() {
    watchdog("a_busy_nic_is_waited_out", Duration::from_secs(60));
    let done = RankZeroDone::default();
    let busy = [AtomicUsize::new(0), AtomicUsize::new(0)];
    run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
        let rank = t.rank() as usize;
        let t = NicSays {
            inner: t,
            victim_lost: false,
            busy: &busy[rank],
        };
        let mut node = Node::new(t, Handlers::local(), Config::default()).unwrap();
        if rank == 0 {
            let _done = done.guard();
            busy[0].store(3, Ordering::SeqCst);
            node.put(1, 8, &[1, 2, 3]).unwrap();
            busy[0].store(3, Ordering::SeqCst);
            assert_eq!(node.get(1, 8, 3).unwrap(), [1, 2, 3]);
            busy[0].store(3, Ordering::SeqCst);
            assert_eq!(node.atomic(1, 16, AtomicOp::FetchAdd(5u64)), Ok(0));
            assert_eq!(node.atomic(1, 16, AtomicOp::Load::<u64>), Ok(5));
            // A batch of posted atomics that meets a busy device (applied when the 16th is
            // posted): it goes again once the device is free, none lost, none applied twice.
            // (`each_posted_stops_at_busy_only` checks a stop half way through a batch.)
            busy[0].store(3, Ordering::SeqCst);
            for k in 0..16u64 {
                node.atomic_nbi(1, 24, AtomicOp::FetchAdd(1u64 << k))
                    .unwrap();
            }
            node.quiesce().unwrap();
            assert_eq!(node.atomic(1, 24, AtomicOp::Load::<u64>), Ok(0xffff));
            assert_eq!(
                busy[0].load(Ordering::SeqCst),
                0,
                "every busy answer was asked again"
            );
        }
        done.wait(node.rank());
        std::mem::forget(node);
    });
}

/// Set once rank 0 is done, or has panicked: the other ranks leave only then (a departure
/// would be reported first), and a failing rank 0 cannot leave them waiting.
#[derive(Default)]
struct RankZeroDone(std::sync::atomic::AtomicBool);

impl RankZeroDone {
    fn guard(&self) -> impl Drop + '_ {
        struct Guard<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        Guard(&self.0)
    }

    fn wait(&self, rank: Rank) {
        while rank != 0 && !self.0.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
