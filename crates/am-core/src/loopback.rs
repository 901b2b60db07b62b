//! [`Loopback`]: ranks as threads of one process, for tests and for measuring the core alone.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, RecvTimeoutError, Sender, TryRecvError, TrySendError};

use am_shm::Segment;

use crate::transport::{
    Delivery, Limits, Outgoing, Received, Route, SendError, SharedBytes, Transport, TransportError,
    Tx,
};
use crate::Rank;

/// Settings of a [`Loopback`] cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopbackConfig {
    /// Messages each rank's receive queue holds, shared by all senders (like a NIC mailbox);
    /// a full queue is device back-pressure ([`SendError::Busy`]).
    pub capacity: usize,
    /// Bytes of each rank's segment.
    pub segment_size: usize,
    /// Largest AM Medium payload.
    pub max_medium: usize,
    /// Largest AM Long payload per message.
    pub max_long: usize,
}

impl Default for LoopbackConfig {
    fn default() -> Self {
        LoopbackConfig {
            capacity: 1024,
            segment_size: 1 << 20,
            max_medium: 64 << 10,
            max_long: 1 << 20,
        }
    }
}

struct Shared {
    /// Set when a rank's transport is dropped by a panic: the job is over.
    aborted: AtomicBool,
    /// Transports dropped so far, and when each rank's was (1 for the first, 0 while alive):
    /// a rank that fails drops its transport before its peers can notice it is gone.
    departures: AtomicU64,
    departed: Box<[AtomicU64]>,
}

struct Packet {
    src: Rank,
    bytes: Vec<u8>,
}

/// The sending half: one bounded channel per destination rank.
struct LoopbackTx {
    rank: Rank,
    peers: Vec<Sender<Packet>>,
    shared: Arc<Shared>,
}

impl Tx for LoopbackTx {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let Some(peer) = self.peers.get(dest as usize) else {
            return Err(SendError::PeerLost(dest));
        };
        if peer.is_full() {
            return Err(SendError::Busy);
        }
        let mut bytes = Vec::with_capacity(msg.len());
        bytes.extend_from_slice(msg.head);
        msg.payload.append_to(&mut bytes);
        match peer.try_send(Packet {
            src: self.rank,
            bytes,
        }) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(SendError::Busy),
            Err(TrySendError::Disconnected(_)) => {
                let departed = self
                    .shared
                    .departed
                    .get(dest as usize)
                    .is_some_and(|d| d.load(Ordering::Acquire) != 0);
                if self.shared.aborted.load(Ordering::Relaxed) {
                    Err(SendError::JobAborted)
                } else if departed {
                    Err(SendError::PeerDeparted(dest))
                } else {
                    Err(SendError::PeerLost(dest))
                }
            }
        }
    }
}

/// An in-process transport: each rank is a thread, messages move through bounded channels,
/// the segment is ordinary memory. Long payloads travel inline and the core copies them into
/// the target's segment. A rank whose thread panics aborts the job: the others get
/// [`TransportError::JobAborted`] from their next poll instead of waiting forever.
pub struct Loopback {
    tx: LoopbackTx,
    size: u32,
    rx: Receiver<Packet>,
    held: Option<Packet>,
    /// Peers whose departure this rank has reported, and how many.
    departures_reported: Vec<bool>,
    departures_count: u64,
    /// Heap memory reached through the same views as the shared-memory NICs' segments.
    segment: Segment,
    config: LoopbackConfig,
}

/// Ends a [`Loopback`] job from outside: every rank's next poll fails with
/// [`TransportError::JobAborted`]. What a launcher does to a job whose rank failed.
#[derive(Clone)]
pub struct AbortHandle(Arc<Shared>);

impl AbortHandle {
    /// Aborts the job.
    pub fn abort(&self) {
        self.0.aborted.store(true, Ordering::Relaxed);
    }

    /// When `rank`'s transport was dropped, in the order of the job's drops (1 for the
    /// first); `None` while it lives. Of several ranks that failed, the one that left first
    /// is the cause: the others failed because it was gone.
    pub fn departure(&self, rank: Rank) -> Option<u64> {
        let seq = self.0.departed.get(rank as usize)?.load(Ordering::Acquire);
        (seq != 0).then_some(seq)
    }
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortHandle")
            .field("aborted", &self.0.aborted.load(Ordering::Relaxed))
            .finish()
    }
}

impl Loopback {
    /// A handle that aborts this rank's whole job.
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle(self.tx.shared.clone())
    }

    /// Creates the transports of a job of `ranks` ranks; move each to its own thread.
    ///
    /// # Panics
    /// If `ranks` is 0, `config.capacity` is 0, or a segment of `config.segment_size` bytes
    /// cannot be allocated.
    pub fn cluster(ranks: u32, config: LoopbackConfig) -> Vec<Loopback> {
        assert!(ranks > 0, "a job has at least one rank");
        assert!(
            config.capacity > 0,
            "a receive queue holds at least one message"
        );
        let shared = Arc::new(Shared {
            aborted: AtomicBool::new(false),
            departures: AtomicU64::new(0),
            departed: (0..ranks).map(|_| AtomicU64::new(0)).collect(),
        });
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..ranks).map(|_| bounded(config.capacity)).unzip();
        receivers
            .into_iter()
            .enumerate()
            .map(|(rank, rx)| Loopback {
                tx: LoopbackTx {
                    rank: rank as Rank,
                    peers: senders.clone(),
                    shared: shared.clone(),
                },
                size: ranks,
                rx,
                held: None,
                departures_reported: vec![false; ranks as usize],
                departures_count: 0,
                segment: Segment::heap(0, config.segment_size)
                    .expect("a segment of config.segment_size bytes"),
                config,
            })
            .collect()
    }
}

impl Tx for Loopback {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.tx.try_send(dest, msg)
    }
}

impl Transport for Loopback {
    fn name(&self) -> &'static str {
        "loopback"
    }

    fn rank(&self) -> Rank {
        self.tx.rank
    }

    fn size(&self) -> u32 {
        self.size
    }

    fn limits(&self) -> Limits {
        Limits {
            max_args: crate::wire::MAX_ARGS,
            max_medium: self.config.max_medium,
            max_long: self.config.max_long,
            max_credits: u32::MAX,
        }
    }

    fn segment(&self) -> SharedBytes<'_> {
        self.segment.byte_area()
    }

    #[inline]
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        let packet = match self.held.take() {
            Some(p) => p,
            None => {
                // Loaded before the queue is tried: a departure counted here came after all
                // of that rank's sends, which the queue then holds.
                let departures = self.tx.shared.departures.load(Ordering::Acquire);
                match self.rx.try_recv() {
                    Ok(p) => p,
                    Err(TryRecvError::Empty) | Err(TryRecvError::Disconnected) => {
                        if self.tx.shared.aborted.load(Ordering::Relaxed) {
                            return Err(TransportError::JobAborted);
                        }
                        if departures != self.departures_count {
                            if let Some(r) = self.departed_since(departures) {
                                return Err(TransportError::PeerDeparted(r));
                            }
                        }
                        return Ok(None);
                    }
                }
            }
        };
        let delivery = Delivery {
            src: packet.src,
            bytes: Received::Private(&packet.bytes),
            payload_placed: false,
            route: Route::NONE,
        };
        Ok(Some(f(delivery, self.segment.byte_area(), &mut self.tx)))
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        if self.held.is_some() {
            return Ok(());
        }
        match self.rx.recv_timeout(timeout) {
            Ok(p) => self.held = Some(p),
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {}
        }
        Ok(())
    }
}

impl Loopback {
    /// A peer that departed among the first `departures` drops and was not reported yet
    /// (now marked reported).
    fn departed_since(&mut self, departures: u64) -> Option<Rank> {
        let me = self.tx.rank as usize;
        let shared = &self.tx.shared;
        let r = (0..self.departures_reported.len()).find(|&r| {
            let seq = shared.departed[r].load(Ordering::Acquire);
            r != me && !self.departures_reported[r] && seq != 0 && seq <= departures
        })?;
        self.departures_reported[r] = true;
        self.departures_count += 1;
        Some(r as Rank)
    }
}

impl Drop for Loopback {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.tx.shared.aborted.store(true, Ordering::Relaxed);
        }
        let shared = &self.tx.shared;
        let seq = shared.departures.fetch_add(1, Ordering::AcqRel) + 1;
        if let Some(d) = shared.departed.get(self.tx.rank as usize) {
            d.store(seq, Ordering::Release);
        }
    }
}

impl std::fmt::Debug for Loopback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loopback")
            .field("rank", &self.tx.rank)
            .field("size", &self.size)
            .field("config", &self.config)
            .finish()
    }
}
