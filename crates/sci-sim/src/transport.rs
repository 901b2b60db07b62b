//! [`Sci`]: the NIC of one rank, as an `am_core::Transport`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use am_core::{Delivery, Limits, Outgoing, Rank, SendError, Transport, TransportError, Tx};
use am_shm::{Imported, Segment};

use crate::dma::{Engine, Job, QUEUE_DEPTH};
use crate::layout::{Layout, ABORT, MEF, PLACED};
use crate::{MediumStrategy, SciConfig, SciError};

/// A wait with no progress this long makes the rank check that its peers are alive.
const LIVENESS_AFTER: Duration = Duration::from_millis(100);
/// Empty polls between two looks at the clock (keeps the idle poll one flag read).
const IDLE_POLLS_PER_TICK: u32 = 1024;
/// Message-ready flags a receiver may re-scan while it leaves its message-exist flag set
/// after the work queue drained (a few µs), before it clears the flag: clearing it on every
/// message would bounce its cache line between sender and receiver each time.
const STALE_SCAN_BUDGET: u32 = 16384;
/// Bit 0 of the AM header's flag byte: reply (`am_core::wire`).
const WIRE_REPLY: u8 = 1;

/// The sending half: message location status, sequence numbers, the DMA queue. Lent to
/// handlers during `poll_recv` (with publication deferred until the handler returns, so the
/// slot it reads is not handed back early).
struct TxState {
    rank: usize,
    layout: Layout,
    config: SciConfig,
    /// Imported segments, by rank (our own included, for messages to self).
    peers: Vec<Imported>,
    /// Message location status: bit k set = request slot k at that peer is busy.
    mls: Vec<u64>,
    /// Next stamp per destination.
    send_seq: Vec<u64>,
    /// Request slots each peer used for requests we still owe a reply (in arrival order).
    owed: Vec<VecDeque<u8>>,
    lost: Vec<bool>,
    /// Inside `poll_recv`: publish after the handler returns.
    deferring: bool,
    deferred: Vec<(usize, usize)>,
    /// "1 copy, 1 transfer" staging buffer.
    staging: Vec<u8>,
    dma: Dma,
}

struct Dma {
    engine: Option<Engine>,
    /// Messages whose payload the engine is copying, in submit order: (dest, slot).
    queue: VecDeque<(usize, usize)>,
    pending: Vec<u32>,
    free: Vec<Vec<u8>>,
}

/// One rank's SCI NIC. See the [crate docs](crate).
pub struct Sci {
    seg: Segment,
    tx: TxState,
    /// Work queue: (sender, slot) of messages found ready, in per-sender order.
    work: VecDeque<(usize, usize)>,
    recv_seq: Vec<u64>,
    /// Scratch for one sender's message-ready flags during a scan.
    stamps: Vec<u64>,
    pids: Vec<Option<nix::unistd::Pid>>,
    idle_polls: u32,
    /// Flags left to scan before the message-exist flag, set but with nothing new, is taken.
    stale_budget: u32,
    idle_since: Option<Instant>,
    last_check: Option<Instant>,
}

fn sci_err(e: am_shm::ShmError) -> SendError {
    SendError::Other(format!("sci: {e}"))
}

impl TxState {
    fn publish(&mut self, dest: usize, slot: usize) -> Result<(), SendError> {
        let stamp = self.send_seq[dest];
        self.send_seq[dest] += 1;
        let me = self.rank;
        let peer = &self.peers[dest];
        // Message-ready flag after the data, message-exist flag after the ready flag.
        self.layout
            .channel(me)
            .publish(peer, slot, stamp)
            .map_err(sci_err)?;
        // Always a write: the sender never reads a peer's memory (SCI's remote writes only).
        peer.ring_tagged(MEF, am_shm::doorbell::tag(me))
            .map_err(sci_err)
    }

    /// Publishes the headers of Longs whose DMA finished.
    fn progress_dma(&mut self) -> Result<(), SendError> {
        while !self.dma.queue.is_empty() {
            let Some(engine) = &self.dma.engine else {
                break;
            };
            let Ok(buf) = engine.done.try_recv() else {
                break;
            };
            self.dma.free.push(buf);
            if let Some((dest, slot)) = self.dma.queue.pop_front() {
                self.dma.pending[dest] -= 1;
                self.publish(dest, slot)?;
            }
        }
        Ok(())
    }

    fn send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let d = dest as usize;
        if d >= self.peers.len() || self.lost[d] {
            return Err(SendError::PeerLost(dest));
        }
        if !self.deferring && !self.dma.queue.is_empty() {
            self.progress_dma()?;
        }
        let is_reply = msg.head.first().is_some_and(|b| b & WIRE_REPLY != 0);
        let use_dma = msg.long_offset.is_some() && msg.payload.len() >= self.config.dma_threshold;
        // Per-pair order: nothing overtakes a message not yet published.
        if (self.dma.pending[d] > 0 && !use_dma)
            || (self.deferring && self.deferred.iter().any(|&(x, _)| x == d))
        {
            return Err(SendError::Busy);
        }
        let p = self.config.slots;
        let slot = if is_reply {
            match self.owed[d].front() {
                Some(&k) => p + k as usize,
                None => {
                    return Err(SendError::Other(
                        "sci: a reply with no request to answer".into(),
                    ))
                }
            }
        } else {
            let free = !self.mls[d] & (u64::MAX >> (64 - p));
            if free == 0 {
                return Err(SendError::Busy);
            }
            free.trailing_zeros() as usize
        };
        let chan = self.layout.channel(self.rank);
        let cap = chan.capacity();
        let peer = &self.peers[d];
        let mut via_dma = false;
        if let Some(off) = msg.long_offset {
            if msg.head.len() > cap {
                return Err(SendError::TooLarge(msg.len()));
            }
            if msg.payload.len() > self.config.max_long {
                return Err(SendError::TooLarge(msg.payload.len()));
            }
            // Out of the target's segment: send the header alone; the target rejects it.
            let at = off
                .checked_add(msg.payload.len())
                .filter(|&end| end <= self.layout.segment)
                .map(|_| self.layout.segment_base() + off);
            if let Some(at) = at.filter(|_| !msg.payload.is_empty()) {
                if use_dma {
                    if self.dma.engine.is_none() {
                        let own = self.peers[self.rank].clone();
                        let engine = Engine::start(own)
                            .map_err(|e| SendError::Other(format!("sci: starting DMA: {e}")))?;
                        self.dma.engine = Some(engine);
                        self.dma.free = (0..QUEUE_DEPTH)
                            .map(|_| Vec::with_capacity(self.config.max_long))
                            .collect();
                    }
                    let Some(mut buf) = self.dma.free.pop() else {
                        return Err(SendError::Busy);
                    };
                    buf.clear();
                    buf.extend_from_slice(msg.payload);
                    let job = Job {
                        target: peer.clone(),
                        offset: at,
                        buf,
                    };
                    let submitted = self.dma.engine.as_ref().is_some_and(|e| e.submit(job));
                    if !submitted {
                        return Err(SendError::Other("sci: the DMA engine stopped".into()));
                    }
                    via_dma = true;
                } else {
                    peer.write(at, msg.payload).map_err(sci_err)?;
                }
            }
            chan.write(peer, slot, PLACED, &[msg.head])
                .map_err(sci_err)?;
        } else {
            if msg.len() > cap {
                return Err(SendError::TooLarge(msg.len()));
            }
            match self.config.medium {
                MediumStrategy::TwoTransfers => chan.write(peer, slot, 0, &[msg.head, msg.payload]),
                MediumStrategy::OneCopy => {
                    self.staging.clear();
                    self.staging.extend_from_slice(msg.head);
                    self.staging.extend_from_slice(msg.payload);
                    chan.write(peer, slot, 0, &[&self.staging])
                }
            }
            .map_err(sci_err)?;
        }
        // Claimed: message location status / owed reply consumed.
        if is_reply {
            self.owed[d].pop_front();
        } else {
            self.mls[d] |= 1 << slot;
        }
        if via_dma {
            self.dma.queue.push_back((d, slot));
            self.dma.pending[d] += 1;
            Ok(())
        } else if self.deferring {
            self.deferred.push((d, slot));
            Ok(())
        } else {
            self.publish(d, slot)
        }
    }
}

impl Tx for TxState {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.send(dest, msg)
    }
}

impl Tx for Sci {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.tx.send(dest, msg)
    }
}

impl Sci {
    fn new(
        rank: usize,
        layout: Layout,
        config: SciConfig,
        seg: Segment,
        peers: Vec<Imported>,
        pids: Vec<Option<nix::unistd::Pid>>,
    ) -> Sci {
        let n = layout.ranks;
        Sci {
            seg,
            tx: TxState {
                rank,
                layout,
                config,
                peers,
                mls: vec![0; n],
                send_seq: vec![1; n],
                owed: (0..n)
                    .map(|_| VecDeque::with_capacity(config.slots))
                    .collect(),
                lost: vec![false; n],
                deferring: false,
                deferred: Vec::with_capacity(4),
                staging: Vec::with_capacity(config.slot_size),
                dma: Dma {
                    engine: None,
                    queue: VecDeque::with_capacity(QUEUE_DEPTH),
                    pending: vec![0; n],
                    free: Vec::new(),
                },
            },
            work: VecDeque::with_capacity(n * 2 * config.slots),
            recv_seq: vec![1; n],
            stamps: vec![0; 2 * config.slots],
            pids,
            idle_polls: 0,
            stale_budget: STALE_SCAN_BUDGET,
            idle_since: None,
            last_check: None,
        }
    }

    fn layout_for(ranks: u32, segment_size: usize, config: &SciConfig) -> Layout {
        Layout {
            ranks: ranks as usize,
            slots: config.slots,
            slot_size: config.slot_size,
            segment: segment_size,
        }
    }

    /// The transports of an in-process job of `ranks` ranks (one per thread), over real
    /// `/dev/shm` segments that are unlinked as soon as all are mapped.
    pub fn cluster(
        ranks: u32,
        segment_size: usize,
        config: SciConfig,
    ) -> Result<Vec<Sci>, SciError> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static JOBS: AtomicUsize = AtomicUsize::new(0);
        config.validate()?;
        if ranks == 0 {
            return Err(SciError::Config("a job has at least one rank".into()));
        }
        let job = format!(
            "sciproc{}x{}",
            std::process::id(),
            JOBS.fetch_add(1, Ordering::Relaxed)
        );
        let layout = Self::layout_for(ranks, segment_size, &config);
        let mut segs = (0..ranks)
            .map(|r| {
                Segment::create(
                    &job,
                    &format!("sci-{r}"),
                    layout.words_len(),
                    layout.bytes_len(),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let peers: Vec<Imported> = segs.iter().map(|s| s.import()).collect();
        for s in &mut segs {
            s.unlink()?;
        }
        Ok(segs
            .into_iter()
            .enumerate()
            .map(|(r, seg)| {
                Sci::new(
                    r,
                    layout,
                    config,
                    seg,
                    peers.clone(),
                    vec![None; ranks as usize],
                )
            })
            .collect())
    }

    /// Starts this rank's NIC in a multi-process job: exports its segment, exchanges pids and
    /// geometry through the launcher's key-value store, imports every peer's segment, then
    /// unlinks its file (so a killed job leaves nothing behind).
    pub fn connect(
        job: &mut am_launch::JobInfo,
        segment_size: usize,
        config: SciConfig,
    ) -> Result<Sci, SciError> {
        config.validate()?;
        let layout = Self::layout_for(job.size, segment_size, &config);
        let rank = job.rank as usize;
        let mut seg = Segment::create(
            &job.job_id,
            &format!("sci-{rank}"),
            layout.words_len(),
            layout.bytes_len(),
        )?;
        let ours = format!("{},{},{}", config.slots, config.slot_size, segment_size);
        let pid = std::process::id();
        let boot = |e: am_launch::BootstrapError| SciError::Bootstrap(e.to_string());
        let mut pids = vec![None; job.size as usize];
        let mut peers = Vec::with_capacity(job.size as usize);
        if job.size == 1 {
            peers.push(seg.import());
        } else {
            let kvs = job.kvs.as_mut().ok_or_else(|| {
                SciError::Bootstrap("no key-value store (launch with amrun or mpiexec)".into())
            })?;
            kvs.put(&format!("sci-{rank}"), &format!("{pid}:{ours}"))
                .map_err(boot)?;
            kvs.fence().map_err(boot)?;
            for r in 0..job.size {
                let v = kvs.get(&format!("sci-{r}")).map_err(boot)?;
                let (p, theirs) = v.split_once(':').unwrap_or(("", ""));
                if theirs != ours {
                    return Err(SciError::Mismatch {
                        rank: r,
                        theirs: theirs.to_owned(),
                        ours,
                    });
                }
                let p: i32 = p
                    .parse()
                    .map_err(|_| SciError::Bootstrap(format!("rank {r} sent pid {p:?}")))?;
                if r as usize != rank {
                    pids[r as usize] = Some(nix::unistd::Pid::from_raw(p));
                }
                peers.push(if r as usize == rank {
                    seg.import()
                } else {
                    Imported::open(
                        &job.job_id,
                        &format!("sci-{r}"),
                        layout.words_len(),
                        layout.bytes_len(),
                    )?
                });
            }
            kvs.fence().map_err(boot)?;
        }
        seg.unlink()?;
        Ok(Sci::new(rank, layout, config, seg, peers, pids))
    }

    /// The configuration in use.
    pub fn config(&self) -> &SciConfig {
        &self.tx.config
    }

    /// The segment geometry in use.
    pub fn layout(&self) -> &Layout {
        &self.tx.layout
    }

    /// Clears the message-exist flag and scans the senders that rang since it was last
    /// cleared.
    fn take_and_scan(&mut self) -> Result<(), TransportError> {
        self.stale_budget = STALE_SCAN_BUDGET;
        let tags = self
            .seg
            .doorbell(MEF)
            .map_err(|e| TransportError::Io(e.to_string()))?
            .take_tags();
        if tags != 0 {
            self.scan(tags)?;
        }
        Ok(())
    }

    /// Moves every ready slot of the senders that rang (`tags`, see [`am_shm::doorbell::tag`])
    /// to the work queue, per sender in stamp order. Returns how many flags it read.
    fn scan(&mut self, tags: u32) -> Result<u32, TransportError> {
        let layout = self.tx.layout;
        let all = tags & !1 == 0;
        // Reused buffer: a fresh array per scan would cost a memset per poll.
        let mut stamps = std::mem::take(&mut self.stamps);
        let mut read = 0;
        for c in 0..layout.ranks {
            if !all && tags & am_shm::doorbell::tag(c) == 0 {
                continue;
            }
            let chan = layout.channel(c);
            // One pass over the ready flags, then find the stamps in order locally.
            let n = match chan.load_stamps(&self.seg, &mut stamps) {
                Ok(n) => n,
                Err(e) => {
                    self.stamps = stamps;
                    return Err(TransportError::Io(e.to_string()));
                }
            };
            read += n as u32;
            while let Some(slot) = stamps[..n].iter().position(|&s| s == self.recv_seq[c]) {
                self.recv_seq[c] += 1;
                self.work.push_back((c, slot));
            }
        }
        self.stamps = stamps;
        Ok(read)
    }

    /// After a while without progress: is every peer that has not departed still alive?
    fn liveness_tick(&mut self) -> Result<(), TransportError> {
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        if now.duration_since(since) < LIVENESS_AFTER
            || self
                .last_check
                .is_some_and(|t| now.duration_since(t) < LIVENESS_AFTER)
        {
            return Ok(());
        }
        self.last_check = Some(now);
        if self.seg.load_word(ABORT).unwrap_or(0) != 0 {
            return Err(TransportError::JobAborted);
        }
        for (r, pid) in self.pids.iter().enumerate() {
            let Some(pid) = *pid else { continue };
            if self.tx.lost[r] || self.seg.load_word(self.tx.layout.departed(r)).unwrap_or(0) != 0 {
                continue;
            }
            if !alive(pid) {
                self.tx.lost[r] = true;
                return Err(TransportError::PeerLost(r as Rank));
            }
        }
        Ok(())
    }
}

/// `kill(pid, 0)`, and not a zombie.
fn alive(pid: nix::unistd::Pid) -> bool {
    if nix::sys::signal::kill(pid, None) == Err(nix::errno::Errno::ESRCH) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

impl Transport for Sci {
    fn name(&self) -> &'static str {
        "sci"
    }

    fn rank(&self) -> Rank {
        self.tx.rank as Rank
    }

    fn size(&self) -> u32 {
        self.tx.layout.ranks as u32
    }

    fn limits(&self) -> Limits {
        Limits {
            max_args: am_core::wire::MAX_ARGS,
            max_medium: self.tx.config.slot_size
                - am_shm::stamp::SLOT_HEADER
                - (am_core::wire::BASE_HEADER_LEN + 4 * am_core::wire::MAX_ARGS),
            max_long: self.tx.config.max_long,
            max_credits: self.tx.config.slots as u32,
        }
    }

    fn segment(&self) -> &[u8] {
        let l = &self.tx.layout;
        self.seg.bytes(l.segment_base(), l.segment).unwrap_or(&[])
    }

    fn segment_mut(&mut self) -> &mut [u8] {
        let l = self.tx.layout;
        self.seg
            .bytes_mut(l.segment_base(), l.segment)
            .unwrap_or(&mut [])
    }

    #[inline]
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, &mut [u8], &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        if !self.tx.dma.queue.is_empty() {
            self.tx.progress_dma()?;
        }
        if self.work.is_empty() {
            let bell = self
                .seg
                .doorbell(MEF)
                .map_err(|e| TransportError::Io(e.to_string()))?;
            // The idle poll: one flag read.
            let tags = bell.peek_tags();
            if tags == 0 {
                self.idle_polls = self.idle_polls.wrapping_add(1);
                if self.idle_polls % IDLE_POLLS_PER_TICK == 0 {
                    self.liveness_tick()?;
                }
                return Ok(None);
            }
            if self.seg.load_word(ABORT).unwrap_or(0) != 0 {
                return Err(TransportError::JobAborted);
            }
            // Scan the senders that rang without clearing the flag: while it stays set, they
            // send without ringing again, and the clear (a write the next ringer would pay
            // for) stays off the delivery path. After a bounded number of fruitless scans
            // the flag is taken, and the senders that rang since are scanned.
            let scanned = self.scan(tags)?;
            if self.work.is_empty() {
                self.stale_budget = self.stale_budget.saturating_sub(scanned);
                if self.stale_budget == 0 {
                    self.take_and_scan()?;
                }
            }
            if self.work.is_empty() {
                return Ok(None);
            }
            self.stale_budget = STALE_SCAN_BUDGET;
        }
        let Some((src, slot)) = self.work.pop_front() else {
            return Ok(None);
        };
        self.idle_polls = 0;
        self.idle_since = None;
        let layout = self.tx.layout;
        let chan = layout.channel(src);
        let p = self.tx.config.slots;
        let corrupt = |e: am_shm::ShmError| {
            TransportError::Io(format!("sci: rank {src} wrote a bad slot: {e}"))
        };
        let (flags, len, body) = chan.header(&self.seg, slot).map_err(corrupt)?;
        if slot < p {
            // A request: its reply goes to the paired reply slot.
            self.tx.owed[src].push_back(slot as u8);
        }
        let (bytes, segment) = self
            .seg
            .split_lend(body, len, layout.segment_base(), layout.segment)
            .map_err(corrupt)?;
        let delivery = Delivery {
            src: src as Rank,
            bytes,
            payload_placed: flags & PLACED != 0,
        };
        self.tx.deferring = true;
        let r = f(delivery, segment, &mut self.tx);
        self.tx.deferring = false;
        if slot >= p {
            // The reply frees its request slot (message location status).
            self.tx.mls[src] &= !(1u64 << (slot - p));
        }
        while let Some((d, s)) = self.tx.deferred.pop() {
            self.tx.publish(d, s)?;
        }
        Ok(Some(r))
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        if !self.tx.dma.queue.is_empty() {
            self.tx.progress_dma()?;
        }
        if !self.work.is_empty() {
            return Ok(());
        }
        // Never sleep on a flag left set: take it (and scan) first.
        self.take_and_scan()?;
        if !self.work.is_empty() {
            return Ok(());
        }
        self.liveness_tick()?;
        let bell = self
            .seg
            .doorbell(MEF)
            .map_err(|e| TransportError::Io(e.to_string()))?;
        bell.sleep(timeout.min(LIVENESS_AFTER));
        Ok(())
    }
}

impl Drop for Sci {
    fn drop(&mut self) {
        let me = self.tx.rank;
        let panicking = std::thread::panicking();
        for (r, peer) in self.tx.peers.iter().enumerate() {
            if r == me {
                continue;
            }
            let _ = peer.store_word(self.tx.layout.departed(me), 1);
            if panicking {
                let _ = peer.store_word(ABORT, 1);
            }
            let _ = peer.ring(MEF);
        }
    }
}

impl std::fmt::Debug for Sci {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sci")
            .field("rank", &self.tx.rank)
            .field("layout", &self.tx.layout)
            .field("config", &self.tx.config)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use am_core::wire::{Header, MAX_HEAD_LEN};
    use am_core::{AmKind, Category};
    use proptest::prelude::*;

    fn head(
        category: Category,
        kind: AmKind,
        payload: usize,
        buf: &mut [u8; MAX_HEAD_LEN],
    ) -> usize {
        Header {
            category,
            kind,
            system: false,
            handler: 1,
            nargs: 1,
            credit: 0,
            payload_len: payload as u32,
            long_offset: 0,
        }
        .encode(&[42], buf)
    }

    fn pair(slots: usize) -> (Sci, Sci) {
        let config = SciConfig {
            slots,
            ..SciConfig::default()
        };
        let mut v = Sci::cluster(2, 4096, config).unwrap();
        let b = v.pop().unwrap();
        (v.pop().unwrap(), b)
    }

    fn out<'a>(head: &'a [u8], payload: &'a [u8]) -> Outgoing<'a> {
        Outgoing {
            head,
            payload,
            long_offset: None,
        }
    }

    #[test]
    fn idle_poll_is_empty() {
        let (mut a, _b) = pair(2);
        assert!(a.poll_recv(|_, _, _| ()).unwrap().is_none());
    }

    /// Request slots stay busy until the reply lands in the paired reply slot.
    #[test]
    fn slots_free_only_on_reply_and_order_holds() {
        let (mut a, mut b) = pair(2);
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = head(Category::Request, AmKind::Medium, 3, &mut h);
        a.try_send(1, &out(&h[..n], b"one")).unwrap();
        a.try_send(1, &out(&h[..n], b"two")).unwrap();
        assert_eq!(a.try_send(1, &out(&h[..n], b"3")), Err(SendError::Busy));
        let mut r = [0u8; MAX_HEAD_LEN];
        let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
        for want in [&b"one"[..], b"two"] {
            let got = b
                .poll_recv(|d, _seg, tx| {
                    assert_eq!(d.src, 0);
                    assert_eq!(&d.bytes[n..], want);
                    tx.try_send(0, &out(&r[..rn], &[])).unwrap();
                    // One unpublished reply per peer while the request is still lent.
                    assert_eq!(tx.try_send(0, &out(&r[..rn], &[])), Err(SendError::Busy));
                })
                .unwrap();
            assert!(got.is_some());
        }
        assert_eq!(a.try_send(1, &out(&h[..n], b"3")), Err(SendError::Busy));
        assert!(a.poll_recv(|_, _, _| ()).unwrap().is_some());
        // One reply back: one slot free again.
        a.try_send(1, &out(&h[..n], b"3")).unwrap();
        assert_eq!(a.try_send(1, &out(&h[..n], b"4")), Err(SendError::Busy));
    }

    #[test]
    fn reply_without_request_and_oversize_are_errors() {
        let (mut a, _b) = pair(2);
        let mut r = [0u8; MAX_HEAD_LEN];
        let rn = head(Category::Reply, AmKind::Short, 0, &mut r);
        assert!(matches!(
            a.try_send(1, &out(&r[..rn], &[])),
            Err(SendError::Other(_))
        ));
        let big = vec![0u8; 2000];
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = head(Category::Request, AmKind::Medium, big.len(), &mut h);
        assert_eq!(
            a.try_send(1, &out(&h[..n], &big)),
            Err(SendError::TooLarge(n + 2000))
        );
        assert_eq!(
            a.try_send(7, &out(&h[..n], &[])),
            Err(SendError::PeerLost(7))
        );
    }

    proptest! {
        /// Garbage in a published slot is an error for that message, never a panic.
        #[test]
        fn corrupt_slot_header_is_checked(len in any::<u32>(), flags in any::<u32>()) {
            let (a, mut b) = pair(2);
            let chan = a.tx.layout.channel(0);
            let peer = &a.tx.peers[1];
            let mut hdr = [0u8; 8];
            hdr[..4].copy_from_slice(&len.to_le_bytes());
            hdr[4..].copy_from_slice(&flags.to_le_bytes());
            peer.write(chan.data + 8, &hdr).unwrap();
            chan.publish(peer, 0, 1).unwrap();
            peer.ring(MEF).unwrap();
            let r = b.poll_recv(|d, _, _| d.bytes.len());
            if len as usize <= chan.capacity() {
                prop_assert_eq!(r.unwrap(), Some(len as usize));
            } else {
                prop_assert!(r.is_err());
            }
        }
    }
}
