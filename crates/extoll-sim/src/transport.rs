//! [`Extoll`]: the NIC of one rank, as an `am_core::Transport`.

use std::cell::Cell;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use am_core::{Delivery, Limits, Outgoing, Rank, SendError, Transport, TransportError, Tx};
use am_shm::mailbox::STATUS_LEN;
use am_shm::{Imported, Segment};

use crate::layout::{
    claim_range, claim_word, Layout, ABORT, CLAIM_ENGINE, CLAIM_MAILBOX, CLAIM_NOTES, DOORBELL,
    RMA_BUF,
};
use crate::rma::{self, kind, Engine, Job, Note, PeerMap, Reserved, Slots};
use crate::velo::{self, Meta, Reassembler, FIRST, LAST, PLACED, RMA_BEFORE_MOD, RMA_WAIT};
use crate::{ExtollConfig, ExtollError, MediumPath, RmaError, MAX_MEDIUM};

/// A wait with no progress this long makes the rank check that its peers are alive.
const LIVENESS_AFTER: Duration = Duration::from_millis(100);
/// Empty polls between two looks at the clock.
const IDLE_POLLS_PER_TICK: u32 = 1024;
/// The largest message over VELO or in an RMA buffer: head plus Medium payload.
const MAX_MSG: usize = am_core::wire::MAX_HEAD_LEN + MAX_MEDIUM;
/// Bytes of an RMA buffer's tail.
const TAIL: usize = 8;

/// A user RMA operation in flight ([`Extoll::rma_put`], [`Extoll::rma_get`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RmaOp(u64);

/// The marker of the `k`-th RMA Medium of a connection (never 0 in its first lap, so a zeroed
/// buffer is never taken for a message).
fn marker(k: u64, buffers: usize) -> u64 {
    (k / buffers as u64 + 1) & 0xffff
}

fn align8(n: usize) -> usize {
    n.div_ceil(8) * 8
}

fn shm(e: am_shm::ShmError) -> SendError {
    SendError::Other(format!("extoll: {e}"))
}

/// The sending half, lent to handlers during `poll_recv`.
struct TxState {
    rank: usize,
    layout: Layout,
    config: ExtollConfig,
    /// The Medium path in use (switchable at run time, for measurements).
    medium: Cell<MediumPath>,
    peers: Arc<Vec<PeerMap>>,
    lost: Vec<bool>,
    /// Each destination's mailbox head as last read.
    mailbox_head: Vec<u64>,
    /// VELO messages sent, per destination.
    velo_sent: Vec<u64>,
    /// RMA Mediums sent, and acknowledged (freed receive buffers), per destination.
    rma_sent: Vec<u64>,
    rma_acked: Vec<u64>,
    /// RMA Mediums consumed per source, and the count last acknowledged to it.
    rma_consumed: Vec<u64>,
    rma_ack_sent: Vec<u64>,
    /// Each notification queue's head as last read (ours included), for immediate puts.
    note_heads: Vec<u64>,
    engine: Option<Engine>,
    /// Jobs queued to the engine's thread, and their requester notifications seen (all done
    /// when equal).
    jobs: u64,
    jobs_done: u64,
    next_op: u64,
}

/// One rank's EXTOLL NIC. See the [crate docs](crate).
pub struct Extoll {
    seg: Segment,
    own: Imported,
    tx: TxState,
    /// Next mailbox ticket, next notification ticket, and the heads last published.
    head: u64,
    note_head: u64,
    head_told: u64,
    note_told: u64,
    reasm: Reassembler,
    velo_delivered: Vec<u64>,
    rma_delivered: Vec<u64>,
    rma_landed: Vec<u64>,
    rma_pending: u64,
    long_landed: Vec<u64>,
    long_used: Vec<u64>,
    put_landed: Vec<u64>,
    user_done: HashSet<u64>,
    rr: usize,
    /// The last poll found the mailbox head waiting for an RMA landing.
    rma_stall: bool,
    pids: Vec<Option<nix::unistd::Pid>>,
    idle_polls: u32,
    idle_since: Option<Instant>,
    last_check: Option<Instant>,
}

impl TxState {
    fn cap(&self) -> usize {
        self.layout.packet_size - STATUS_LEN
    }

    fn engine(&mut self) -> Result<&Engine, SendError> {
        if self.engine.is_none() {
            let e = Engine::start(self.rank, self.layout, self.peers.clone())
                .map_err(|e| SendError::Other(format!("extoll: starting the RMA engine: {e}")))?;
            self.engine = Some(e);
        }
        self.engine
            .as_ref()
            .ok_or_else(|| SendError::Other("extoll: no RMA engine".into()))
    }

    fn submit(&mut self, job: Job) -> Result<(), SendError> {
        if !self.engine()?.submit(job) {
            return Err(SendError::Other("extoll: the RMA engine stopped".into()));
        }
        self.jobs += 1;
        Ok(())
    }

    /// Claims `n` mailbox slots at `d`, or reports back-pressure.
    /// Recorded in `d`'s claim word for us, so that `d` can skip them if we die before
    /// publishing them.
    #[inline(always)]
    fn claim(&mut self, d: usize, n: usize) -> Result<u64, SendError> {
        let peer = &self.peers[d];
        let t = self
            .layout
            .mailbox()
            .try_claim(&peer.seg, n, &mut self.mailbox_head[d])
            .map_err(shm)?
            .ok_or(SendError::Busy)?;
        peer.imp
            .store_word(
                self.layout.claims(self.rank, CLAIM_MAILBOX),
                claim_word(t, n),
            )
            .map_err(shm)?;
        Ok(t)
    }

    /// Writes and publishes `head ++ payload` into the claimed slots from ticket `t`.
    fn emit(
        &mut self,
        d: usize,
        t: u64,
        head: &[u8],
        payload: &[u8],
        flags: u32,
    ) -> Result<(), SendError> {
        let ring = self.layout.mailbox();
        let peer = &self.peers[d];
        let cap = self.cap();
        let n = velo::packets(head.len() + payload.len(), cap);
        let rma_before = (self.rma_sent[d] % RMA_BEFORE_MOD) as u32;
        let me = self.rank as u32;
        velo::fragment(head, payload, cap, |i, parts| {
            let mut at = 0;
            for p in parts {
                ring.write(&peer.imp, t + i as u64, at, p)?;
                at += p.len();
            }
            let mut f = if i == 0 { FIRST | flags } else { 0 };
            if i + 1 == n {
                f |= LAST;
            }
            let meta = Meta {
                src: me,
                len: at,
                flags: f,
                rma_before,
            };
            ring.publish(&peer.imp, t + i as u64, meta.encode())
        })
        .map_err(shm)?;
        self.velo_sent[d] += 1;
        peer.seg
            .doorbell(DOORBELL)
            .map_err(shm)?
            .ring_tagged_lazy(0);
        Ok(())
    }

    fn send_velo(
        &mut self,
        d: usize,
        head: &[u8],
        payload: &[u8],
        flags: u32,
    ) -> Result<(), SendError> {
        let total = head.len() + payload.len();
        if total <= self.cap() {
            return self.send_packet(d, head, payload, flags);
        }
        let n = velo::packets(total, self.cap());
        let t = self.claim(d, n)?;
        self.emit(d, t, head, payload, flags)
    }

    /// The one-packet case of [`send_velo`](Self::send_velo) (every Short, small Mediums):
    /// claim, write, publish, all in the slot's one cache line.
    #[inline]
    fn send_packet(
        &mut self,
        d: usize,
        head: &[u8],
        payload: &[u8],
        flags: u32,
    ) -> Result<(), SendError> {
        let t = self.claim(d, 1)?;
        let ring = self.layout.mailbox();
        let peer = &self.peers[d];
        let me = self.rank as u32;
        ring.write(&peer.imp, t, 0, head).map_err(shm)?;
        if !payload.is_empty() {
            ring.write(&peer.imp, t, head.len(), payload).map_err(shm)?;
        }
        let meta = Meta {
            src: me,
            len: head.len() + payload.len(),
            flags: FIRST | LAST | flags,
            rma_before: (self.rma_sent[d] % RMA_BEFORE_MOD) as u32,
        };
        ring.publish(&peer.imp, t, meta.encode()).map_err(shm)?;
        self.velo_sent[d] += 1;
        peer.seg
            .doorbell(DOORBELL)
            .map_err(shm)?
            .ring_tagged_lazy(0);
        Ok(())
    }

    /// Reserves the notification slots of an immediate put to `dest` (ours and `dest`'s), or
    /// reports back-pressure.
    fn reserve(&mut self, dest: usize) -> Result<Reserved, SendError> {
        Reserved::try_new(
            &self.layout,
            &self.peers,
            self.rank,
            Some(dest),
            &mut self.note_heads,
        )
        .map_err(shm)?
        .ok_or(SendError::Busy)
    }

    /// pscom's RMA plugin: one put of the message into `d`'s receive buffer of the next index
    /// (message at the end, the tail last), by the engine as the doorbell is rung.
    fn send_rma_medium(&mut self, d: usize, head: &[u8], payload: &[u8]) -> Result<(), SendError> {
        let b = self.config.rma_buffers as u64;
        let word = self.peers[self.rank]
            .seg
            .load_word(self.layout.ack(d))
            .map_err(shm)?;
        if word > self.rma_acked[d] && word <= self.rma_sent[d] {
            self.rma_acked[d] = word;
        }
        if self.rma_sent[d] - self.rma_acked[d] >= b {
            return Err(SendError::Busy);
        }
        let slots = self.reserve(d)?;
        let k = self.rma_sent[d];
        let idx = (k % b) as usize;
        let total = head.len() + payload.len();
        let start = RMA_BUF - TAIL - align8(total);
        let rx = self.layout.rx(self.rank, idx);
        let tail = marker(k, self.config.rma_buffers)
            | (total as u64) << 16
            | (self.velo_sent[d] & 0xffff) << 32
            | (self.rma_consumed[d] & 0xffff) << 48;
        rma::put(
            &self.layout,
            &self.peers,
            self.rank,
            d,
            rx + start,
            &[head, payload],
            Some((rx + RMA_BUF - TAIL, tail)),
            Some(Note {
                kind: kind::MEDIUM_LANDED,
                value: k,
            }),
            Note {
                kind: kind::MEDIUM_SENT,
                value: d as u64,
            },
            Slots::Reserved(slots),
        );
        self.rma_sent[d] += 1;
        // The tail carried our acknowledgement of d's buffers.
        self.rma_ack_sent[d] = self.rma_consumed[d];
        Ok(())
    }

    /// AM Long: the payload put by the engine straight into `d`'s segment as the doorbell is
    /// rung, then the header over VELO (flagged "wait for the completer notification").
    fn send_long(&mut self, d: usize, msg: &Outgoing<'_>, off: usize) -> Result<(), SendError> {
        if msg.payload.len() > self.config.max_long {
            return Err(SendError::TooLarge(msg.payload.len()));
        }
        if msg.head.len() > MAX_MSG {
            return Err(SendError::TooLarge(msg.head.len()));
        }
        let fits = off
            .checked_add(msg.payload.len())
            .is_some_and(|end| end <= self.layout.segment);
        if msg.payload.is_empty() || !fits {
            // Nothing to move (or out of the target's segment, which the target rejects).
            return self.send_velo(d, msg.head, &[], PLACED);
        }
        let slots = self.reserve(d)?;
        // The header's slots before the put: once the payload is sent, the header must follow.
        let t = match self.claim(d, velo::packets(msg.head.len(), self.cap())) {
            Ok(t) => t,
            Err(e) => {
                slots.cancel(&self.layout, &self.peers, self.rank);
                return Err(e);
            }
        };
        rma::put(
            &self.layout,
            &self.peers,
            self.rank,
            d,
            self.layout.segment_base() + off,
            &[msg.payload],
            None,
            Some(Note {
                kind: kind::LONG_LANDED,
                value: msg.payload.len() as u64,
            }),
            Note {
                kind: kind::LONG_SENT,
                value: msg.payload.len() as u64,
            },
            Slots::Reserved(slots),
        );
        self.emit(d, t, msg.head, &[], PLACED | RMA_WAIT)
    }

    fn send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let d = dest as usize;
        if d >= self.peers.len() || self.lost[d] {
            return Err(SendError::PeerLost(dest));
        }
        if let Some(off) = msg.long_offset {
            return self.send_long(d, msg, off);
        }
        if msg.len() > MAX_MSG {
            return Err(SendError::TooLarge(msg.len()));
        }
        if !msg.payload.is_empty() && self.medium.get().by_rma(msg.payload.len()) {
            self.send_rma_medium(d, msg.head, msg.payload)
        } else {
            self.send_velo(d, msg.head, msg.payload, 0)
        }
    }
}

impl Tx for TxState {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.send(dest, msg)
    }
}

impl Tx for Extoll {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.tx.send(dest, msg)
    }
}

fn io(e: impl std::fmt::Display) -> TransportError {
    TransportError::Io(format!("extoll: {e}"))
}

impl Extoll {
    fn new(
        rank: usize,
        layout: Layout,
        config: ExtollConfig,
        seg: Segment,
        peers: Arc<Vec<PeerMap>>,
        pids: Vec<Option<nix::unistd::Pid>>,
    ) -> Extoll {
        let n = layout.ranks;
        let own = seg.import();
        Extoll {
            seg,
            own,
            tx: TxState {
                rank,
                layout,
                config,
                medium: Cell::new(config.medium),
                peers,
                lost: vec![false; n],
                mailbox_head: vec![0; n],
                velo_sent: vec![0; n],
                rma_sent: vec![0; n],
                rma_acked: vec![0; n],
                rma_consumed: vec![0; n],
                rma_ack_sent: vec![0; n],
                note_heads: vec![0; n],
                engine: None,
                jobs: 0,
                jobs_done: 0,
                next_op: 0,
            },
            head: 0,
            note_head: 0,
            head_told: 0,
            note_told: 0,
            reasm: Reassembler::new(n, config.packet_size - STATUS_LEN, MAX_MSG),
            velo_delivered: vec![0; n],
            rma_delivered: vec![0; n],
            rma_landed: vec![0; n],
            rma_pending: 0,
            long_landed: vec![0; n],
            long_used: vec![0; n],
            put_landed: vec![0; n],
            user_done: HashSet::new(),
            rr: 0,
            rma_stall: false,
            pids,
            idle_polls: 0,
            idle_since: None,
            last_check: None,
        }
    }

    fn layout_for(ranks: u32, segment_size: usize, c: &ExtollConfig) -> Layout {
        Layout {
            ranks: ranks as usize,
            packet_size: c.packet_size,
            mailbox_slots: c.mailbox_slots,
            notify_slots: c.notify_slots,
            rma_buffers: c.rma_buffers,
            segment: segment_size,
        }
    }

    fn map(job: &str, r: usize, layout: &Layout) -> Result<PeerMap, ExtollError> {
        let seg = am_shm::mailbox::attach(
            job,
            &format!("extoll-{r}"),
            layout.words_len(),
            layout.bytes_len(),
        )?;
        let imp = seg.import();
        Ok(PeerMap { seg, imp })
    }

    /// The transports of an in-process job of `ranks` ranks (one per thread), over real
    /// `/dev/shm` segments that are unlinked as soon as all are mapped.
    pub fn cluster(
        ranks: u32,
        segment_size: usize,
        config: ExtollConfig,
    ) -> Result<Vec<Extoll>, ExtollError> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static JOBS: AtomicUsize = AtomicUsize::new(0);
        config.validate()?;
        if ranks == 0 || ranks > 1 << 16 {
            return Err(ExtollError::Config("a job has 1..=65536 ranks".into()));
        }
        let job = format!(
            "extollproc{}x{}",
            std::process::id(),
            JOBS.fetch_add(1, Ordering::Relaxed)
        );
        let layout = Self::layout_for(ranks, segment_size, &config);
        let mut segs = (0..ranks)
            .map(|r| {
                Segment::create(
                    &job,
                    &format!("extoll-{r}"),
                    layout.words_len(),
                    layout.bytes_len(),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let peers = (0..ranks as usize)
            .map(|r| Self::map(&job, r, &layout))
            .collect::<Result<Vec<_>, _>>();
        for s in &mut segs {
            s.unlink()?;
        }
        let peers = Arc::new(peers?);
        Ok(segs
            .into_iter()
            .enumerate()
            .map(|(r, seg)| {
                Extoll::new(
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

    /// Starts this rank's NIC in a multi-process job: creates its segment, exchanges pids and
    /// geometry through the launcher's key-value store, maps every peer's segment, then
    /// unlinks its file (so a killed job leaves nothing behind).
    pub fn connect(
        job: &mut am_launch::JobInfo,
        segment_size: usize,
        config: ExtollConfig,
    ) -> Result<Extoll, ExtollError> {
        config.validate()?;
        if job.size == 0 || job.size > 1 << 16 {
            return Err(ExtollError::Config("a job has 1..=65536 ranks".into()));
        }
        let layout = Self::layout_for(job.size, segment_size, &config);
        let rank = job.rank as usize;
        let mut seg = Segment::create(
            &job.job_id,
            &format!("extoll-{rank}"),
            layout.words_len(),
            layout.bytes_len(),
        )?;
        let ours = format!(
            "{},{},{},{},{},{}",
            config.packet_size,
            config.mailbox_slots,
            config.notify_slots,
            config.rma_buffers,
            config.max_long,
            segment_size
        );
        let boot = |e: am_launch::BootstrapError| ExtollError::Bootstrap(e.to_string());
        let mut pids = vec![None; job.size as usize];
        let mut peers = Vec::with_capacity(job.size as usize);
        if job.size == 1 {
            peers.push(Self::map(&job.job_id, rank, &layout)?);
        } else {
            let kvs = job.kvs.as_mut().ok_or_else(|| {
                ExtollError::Bootstrap("no key-value store (launch with amrun or mpiexec)".into())
            })?;
            kvs.put(
                &format!("extoll-{rank}"),
                &format!("{}:{ours}", std::process::id()),
            )
            .map_err(boot)?;
            kvs.fence().map_err(boot)?;
            for r in 0..job.size {
                let v = kvs.get(&format!("extoll-{r}")).map_err(boot)?;
                let (p, theirs) = v.split_once(':').unwrap_or(("", ""));
                if theirs != ours {
                    return Err(ExtollError::Mismatch {
                        rank: r,
                        theirs: theirs.to_owned(),
                        ours,
                    });
                }
                let p: i32 = p
                    .parse()
                    .map_err(|_| ExtollError::Bootstrap(format!("rank {r} sent pid {p:?}")))?;
                if r as usize != rank {
                    pids[r as usize] = Some(nix::unistd::Pid::from_raw(p));
                }
                peers.push(Self::map(&job.job_id, r as usize, &layout)?);
            }
            kvs.fence().map_err(boot)?;
        }
        seg.unlink()?;
        Ok(Extoll::new(
            rank,
            layout,
            config,
            seg,
            Arc::new(peers),
            pids,
        ))
    }

    /// The configuration in use.
    pub fn config(&self) -> &ExtollConfig {
        &self.tx.config
    }

    /// Switches the path of the Mediums this rank sends from now on (the receiver takes
    /// both; order per source holds across a switch).
    pub fn set_medium(&self, path: MediumPath) {
        self.tx.medium.set(path);
    }

    /// The segment geometry in use.
    pub fn layout(&self) -> &Layout {
        &self.tx.layout
    }

    fn check_region(&self, offset: usize, len: usize) -> Result<usize, RmaError> {
        let region = self.tx.layout.segment;
        if offset.checked_add(len).is_none_or(|end| end > region) {
            return Err(RmaError::OutOfBounds {
                offset,
                len,
                region,
            });
        }
        Ok(self.tx.layout.segment_base() + offset)
    }

    fn user_op(&mut self, dest: Rank, job: impl FnOnce(Note) -> Job) -> Result<RmaOp, RmaError> {
        if dest as usize >= self.tx.peers.len() || self.tx.lost[dest as usize] {
            return Err(RmaError::BadRank(dest));
        }
        let id = self.tx.next_op;
        self.tx.next_op += 1;
        let note = Note {
            kind: kind::USER_DONE,
            value: id,
        };
        self.tx
            .submit(job(note))
            .map_err(|e| RmaError::Engine(e.to_string()))?;
        Ok(RmaOp(id))
    }

    /// RMA put by the engine: `len` bytes of our AM segment at `src_offset` into `dest`'s AM
    /// segment at `dst_offset`. Complete (and the source reusable) once [`rma_test`](Self::rma_test)
    /// says so; the completer gets a notification ([`puts_landed`](Self::puts_landed)).
    pub fn rma_put(
        &mut self,
        dest: Rank,
        dst_offset: usize,
        src_offset: usize,
        len: usize,
    ) -> Result<RmaOp, RmaError> {
        let dst = self.check_region(dst_offset, len)?;
        let src = self.check_region(src_offset, len)?;
        self.user_op(dest, |requester| Job::Put {
            dest: dest as usize,
            src,
            dst,
            len,
            completer: Note {
                kind: kind::PUT_LANDED,
                value: len as u64,
            },
            requester,
        })
    }

    /// RMA get by the engine: `len` bytes of `from`'s AM segment at `src_offset` into ours at
    /// `dst_offset`.
    pub fn rma_get(
        &mut self,
        from: Rank,
        src_offset: usize,
        dst_offset: usize,
        len: usize,
    ) -> Result<RmaOp, RmaError> {
        let src = self.check_region(src_offset, len)?;
        let dst = self.check_region(dst_offset, len)?;
        self.user_op(from, |requester| Job::Get {
            from: from as usize,
            src,
            dst,
            len,
            requester,
        })
    }

    /// Polls the notification queue; true once `op`'s requester notification arrived.
    pub fn rma_test(&mut self, op: RmaOp) -> Result<bool, TransportError> {
        self.drain_notes()?;
        Ok(self.user_done.remove(&op.0))
    }

    /// How many user RMA puts from `src` landed in our segment (completer notifications).
    pub fn puts_landed(&self, src: Rank) -> u64 {
        self.put_landed.get(src as usize).copied().unwrap_or(0)
    }

    /// Moves every notification to the counters it feeds.
    fn drain_notes(&mut self) -> Result<(), TransportError> {
        let ring = self.tx.layout.notifications();
        let n = self.tx.layout.ranks;
        while let Some(meta) = ring.peek(&self.seg, self.note_head).map_err(io)? {
            let mut v = [0u8; 8];
            v.copy_from_slice(ring.payload(&self.seg, self.note_head, 8).map_err(io)?);
            let value = u64::from_le_bytes(v);
            self.note_head += 1;
            let src = (meta & 0xffff) as usize;
            if src >= n {
                return Err(io(format!("a notification from rank {src}")));
            }
            match meta >> 16 {
                kind::LONG_LANDED => self.long_landed[src] += 1,
                kind::MEDIUM_LANDED => {
                    self.rma_landed[src] += 1;
                    self.rma_pending += 1;
                }
                kind::PUT_LANDED => self.put_landed[src] += 1,
                kind::NONE => {}
                k if src != self.tx.rank => {
                    return Err(io(format!("requester notification {k} from rank {src}")))
                }
                // Immediate puts: done before the send returned; nothing to free.
                kind::LONG_SENT | kind::MEDIUM_SENT => {}
                kind::USER_DONE => {
                    self.tx.jobs_done += 1;
                    self.user_done.insert(value);
                }
                k => return Err(io(format!("unknown notification {k:#x} (value {value})"))),
            }
        }
        if self.note_told != self.note_head {
            self.note_told = self.note_head;
            ring.consumed(&self.own, self.note_head).map_err(io)?;
        }
        Ok(())
    }

    /// Tells senders how far the mailbox was consumed: in batches of a quarter mailbox while
    /// busy, and whenever idle (so a sender waiting for room always gets it).
    #[inline]
    fn tell_head(&mut self, idle: bool) -> Result<(), TransportError> {
        let due = self.head - self.head_told;
        if due > 0 && (idle || due >= self.tx.layout.mailbox_slots as u64 / 4) {
            self.head_told = self.head;
            self.tx
                .layout
                .mailbox()
                .consumed(&self.own, self.head)
                .map_err(io)?;
        }
        Ok(())
    }

    /// The tail of the next RMA Medium from `s`, if it landed and every VELO message sent
    /// before it was delivered.
    fn rma_next(&mut self, s: usize) -> Result<Option<u64>, TransportError> {
        if self.rma_landed[s] <= self.rma_delivered[s] {
            return Ok(None);
        }
        let l = &self.tx.layout;
        let idx = (self.rma_delivered[s] % l.rma_buffers as u64) as usize;
        let tail = self
            .seg
            .load_slot_word(l.rx(s, idx) + RMA_BUF - TAIL)
            .map_err(io)?;
        if tail & 0xffff != marker(self.rma_delivered[s], l.rma_buffers) {
            // Drop the notification: a corrupt one must not wedge every later poll.
            self.rma_landed[s] -= 1;
            self.rma_pending -= 1;
            return Err(io(format!(
                "rank {s}: RMA Medium notified but its tail marker is {:#x}",
                tail & 0xffff
            )));
        }
        if (tail >> 32) & 0xffff != self.velo_delivered[s] & 0xffff {
            return Ok(None);
        }
        Ok(Some(tail))
    }

    /// Delivers the next RMA Medium from `s` (its tail is `tail`), lent from the receive
    /// buffer, then frees the buffer (acknowledging lazily).
    fn deliver_rma<R>(
        &mut self,
        s: usize,
        tail: u64,
        f: impl FnOnce(Delivery<'_>, &mut [u8], &mut dyn Tx) -> R,
    ) -> Result<R, TransportError> {
        let l = self.tx.layout;
        let len = ((tail >> 16) & 0xffff) as usize;
        if len > MAX_MSG {
            return Err(io(format!("rank {s}: RMA Medium of {len} bytes")));
        }
        let idx = (self.rma_delivered[s] % l.rma_buffers as u64) as usize;
        let at = l.rx(s, idx) + RMA_BUF - TAIL - align8(len);
        // Piggybacked ack: how many of our buffers s has consumed (mod 2^16).
        let acked = self.tx.rma_acked[s];
        let delta = (tail >> 48).wrapping_sub(acked) & 0xffff;
        if delta <= self.tx.rma_sent[s] - acked {
            self.tx.rma_acked[s] += delta;
        }
        self.rma_delivered[s] += 1;
        self.rma_pending -= 1;
        self.mark_progress();
        let (bytes, segment) = self
            .seg
            .split_lend(at, len, l.segment_base(), l.segment)
            .map_err(io)?;
        let r = f(
            Delivery {
                src: s as Rank,
                bytes,
                payload_placed: false,
            },
            segment,
            &mut self.tx,
        );
        let tx = &mut self.tx;
        tx.rma_consumed[s] += 1;
        if tx.rma_consumed[s] - tx.rma_ack_sent[s] >= (l.rma_buffers as u64).div_ceil(2) {
            tx.rma_ack_sent[s] = tx.rma_consumed[s];
            let _ = tx.peers[s]
                .imp
                .store_word(l.ack(tx.rank), tx.rma_consumed[s]);
        }
        Ok(r)
    }

    fn mark_progress(&mut self) {
        self.idle_polls = 0;
        self.idle_since = None;
    }

    fn idle(&mut self) -> Result<(), TransportError> {
        self.idle_polls = self.idle_polls.wrapping_add(1);
        if self.idle_polls % IDLE_POLLS_PER_TICK == 0 {
            // Even a spinning rank gives the CPU away now and then (tens of µs without a
            // message): on an oversubscribed machine the peer it waits for may need it.
            std::thread::yield_now();
            self.liveness_tick()?;
        }
        Ok(())
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
        let mut newly = None;
        for (r, pid) in self.pids.iter().enumerate() {
            let Some(pid) = *pid else { continue };
            if self.tx.lost[r] || self.seg.load_word(self.tx.layout.departed(r)).unwrap_or(0) != 0 {
                continue;
            }
            if !am_launch::process_alive(pid) {
                self.tx.lost[r] = true;
                newly.get_or_insert(r);
            }
        }
        let Some(lost) = newly.or_else(|| self.tx.lost.iter().position(|&l| l)) else {
            return Ok(());
        };
        self.skip_dead_claims()?;
        if newly.is_some() || self.blocked()? {
            // Behind a slot claimed by a sender that died before marking it, nothing passes
            // any more: say so at every check rather than wait in silence.
            return Err(TransportError::PeerLost(lost as Rank));
        }
        Ok(())
    }

    /// Skips the mailbox and notification slots that lost ranks claimed but never published
    /// (their claim records say which): no live sender writes them, and everything behind
    /// them flows again.
    fn skip_dead_claims(&mut self) -> Result<(), TransportError> {
        let l = self.tx.layout;
        let ring = l.mailbox();
        while ring.peek(&self.seg, self.head).map_err(io)?.is_none() {
            match self.dead_claimer(&[CLAIM_MAILBOX], self.head)? {
                Some(r) => {
                    self.reasm.abandon(r as u32);
                    self.head += 1;
                }
                None => break,
            }
        }
        self.tell_head(true)?;
        let notes = l.notifications();
        while notes.peek(&self.seg, self.note_head).map_err(io)?.is_none()
            && self
                .dead_claimer(&[CLAIM_NOTES, CLAIM_ENGINE], self.note_head)?
                .is_some()
        {
            self.note_head += 1;
        }
        if self.note_told != self.note_head {
            self.note_told = self.note_head;
            notes.consumed(&self.own, self.note_head).map_err(io)?;
        }
        Ok(())
    }

    /// The lost rank whose last claim in one of queues `qs` holds `ticket`, if any.
    fn dead_claimer(&self, qs: &[usize], ticket: u64) -> Result<Option<usize>, TransportError> {
        for (r, _) in self.tx.lost.iter().enumerate().filter(|(_, &l)| l) {
            for &q in qs {
                let word = self
                    .seg
                    .load_word(self.tx.layout.claims(r, q))
                    .map_err(io)?;
                if claim_range(word).contains(&ticket) {
                    return Ok(Some(r));
                }
            }
        }
        Ok(None)
    }

    /// Whether the mailbox or the notification queue waits on a claimed, unpublished slot.
    fn blocked(&self) -> Result<bool, TransportError> {
        let l = &self.tx.layout;
        let waits = |ring: am_shm::mailbox::Ring, head: u64| -> Result<bool, TransportError> {
            Ok(self.seg.load_word(ring.tail).map_err(io)? > head
                && ring.peek(&self.seg, head).map_err(io)?.is_none())
        };
        Ok(waits(l.mailbox(), self.head)? || waits(l.notifications(), self.note_head)?)
    }

    /// Whether a poll could make progress now (used before sleeping).
    fn has_work(&self) -> Result<bool, TransportError> {
        let l = &self.tx.layout;
        if l.notifications()
            .peek(&self.seg, self.note_head)
            .map_err(io)?
            .is_some()
        {
            return Ok(true);
        }
        let Some(meta) = l.mailbox().peek(&self.seg, self.head).map_err(io)? else {
            return Ok(self.rma_pending > 0);
        };
        let m = Meta::decode(meta);
        let s = m.src as usize;
        if m.flags & FIRST == 0 || s >= l.ranks {
            return Ok(true);
        }
        let waits_rma = m.rma_before as u64 != self.rma_delivered[s] % RMA_BEFORE_MOD;
        let waits_long = m.flags & RMA_WAIT != 0 && self.long_landed[s] <= self.long_used[s];
        Ok(!(waits_rma || waits_long) || self.rma_pending > 0)
    }

    /// A message from the mailbox, if one is complete and may be delivered in order.
    fn poll_mailbox<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, &mut [u8], &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        let l = self.tx.layout;
        let ring = l.mailbox();
        loop {
            let Some(meta) = ring.peek(&self.seg, self.head).map_err(io)? else {
                return Ok(None);
            };
            let m = Meta::decode(meta);
            if let Err(e) = self.reasm.check(&m) {
                self.head += 1;
                return Err(io(e));
            }
            let s = m.src as usize;
            if m.flags & FIRST != 0 && !self.reasm.in_progress(m.src) {
                // Per-source order across both paths, and a Long waits for its payload.
                if m.rma_before as u64 != self.rma_delivered[s] % RMA_BEFORE_MOD {
                    return match self.rma_next(s)? {
                        Some(tail) => self.deliver_rma(s, tail, f).map(Some),
                        None => {
                            self.rma_stall = true;
                            Ok(None)
                        }
                    };
                }
                if m.flags & RMA_WAIT != 0 && self.long_landed[s] <= self.long_used[s] {
                    self.rma_stall = true;
                    return Ok(None);
                }
                if m.flags & LAST != 0 {
                    // One packet: lent straight from the mailbox slot.
                    self.mark_progress();
                    let (bytes, segment) = self
                        .seg
                        .split_lend(
                            ring.slot_base(self.head),
                            m.len,
                            l.segment_base(),
                            l.segment,
                        )
                        .map_err(io)?;
                    let r = f(
                        Delivery {
                            src: s as Rank,
                            bytes,
                            payload_placed: m.flags & PLACED != 0,
                        },
                        segment,
                        &mut self.tx,
                    );
                    self.head += 1;
                    self.tell_head(false)?;
                    self.velo_delivered[s] += 1;
                    if m.flags & RMA_WAIT != 0 {
                        self.long_used[s] += 1;
                    }
                    return Ok(Some(r));
                }
            }
            let data = ring.payload(&self.seg, self.head, m.len).map_err(io)?;
            let pushed = self.reasm.push(&m, data);
            self.head += 1;
            self.tell_head(false)?;
            self.mark_progress();
            let Some((flags, buf)) = pushed.map_err(io)? else {
                continue;
            };
            self.velo_delivered[s] += 1;
            if flags & RMA_WAIT != 0 {
                self.long_used[s] += 1;
            }
            let segment = {
                let base = l.segment_base();
                self.seg.bytes_mut(base, l.segment).map_err(io)?
            };
            let r = f(
                Delivery {
                    src: s as Rank,
                    bytes: &buf,
                    payload_placed: flags & PLACED != 0,
                },
                segment,
                &mut self.tx,
            );
            self.reasm.recycle(buf);
            return Ok(Some(r));
        }
    }
}

impl Transport for Extoll {
    fn name(&self) -> &'static str {
        "extoll"
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
            max_medium: MAX_MEDIUM,
            max_long: self.tx.config.max_long,
            // The shared mailbox is bounded as a whole; back-pressure covers the rest.
            max_credits: 255,
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
        let l = self.tx.layout;
        if l.notifications()
            .peek(&self.seg, self.note_head)
            .map_err(io)?
            .is_some()
        {
            self.drain_notes()?;
        }
        if self.rma_pending > 0 {
            // Round robin over the sources with a landed RMA Medium.
            for i in 0..l.ranks {
                let s = (self.rr + i) % l.ranks;
                if let Some(tail) = self.rma_next(s)? {
                    self.rr = s + 1;
                    return self.deliver_rma(s, tail, f).map(Some);
                }
            }
        }
        self.rma_stall = false;
        match self.poll_mailbox(f)? {
            Some(r) => Ok(Some(r)),
            None => {
                self.tell_head(true)?;
                if self.rma_stall || self.tx.jobs > self.tx.jobs_done {
                    // Waiting on an RMA engine (ours, or the sender's): give it the core.
                    // On a machine with no spare core, a spinning rank would otherwise keep
                    // the engine thread off the CPU for a whole scheduler slice.
                    std::thread::yield_now();
                }
                self.idle()?;
                Ok(None)
            }
        }
    }

    /// A Long's payload is an immediate put the engine runs when the doorbell is rung, before
    /// `try_send` returns (its requester notification is written by then).
    fn long_placed_on_send(&self, _len: usize) -> bool {
        true
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        if self.has_work()? {
            return Ok(());
        }
        self.tell_head(true)?;
        let bell = self.seg.doorbell(DOORBELL).map_err(io)?;
        // Clear the flag (senders ring again from now on), then look once more.
        bell.take_tags();
        if self.has_work()? {
            return Ok(());
        }
        self.liveness_tick()?;
        let bell = self.seg.doorbell(DOORBELL).map_err(io)?;
        bell.sleep(timeout.min(LIVENESS_AFTER));
        Ok(())
    }

    fn close(&mut self) {
        // Let the engine finish what was sent (bounded).
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.tx.jobs_done < self.tx.jobs && Instant::now() < deadline {
            if self.drain_notes().is_err() {
                break;
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for Extoll {
    fn drop(&mut self) {
        self.close();
        // Stop the engine before saying goodbye.
        self.tx.engine = None;
        let me = self.tx.rank;
        let panicking = std::thread::panicking();
        for (r, peer) in self.tx.peers.iter().enumerate() {
            if r == me {
                continue;
            }
            let _ = peer.imp.store_word(self.tx.layout.departed(me), 1);
            if panicking {
                let _ = peer.imp.store_word(ABORT, 1);
            }
            let _ = peer.imp.ring(DOORBELL);
        }
    }
}

impl std::fmt::Debug for Extoll {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Extoll")
            .field("rank", &self.tx.rank)
            .field("layout", &self.tx.layout)
            .field("config", &self.tx.config)
            .finish()
    }
}

/// Posts a notification as a peer's engine would (tests of the receive checks).
#[cfg(test)]
pub(crate) fn post_note(x: &Extoll, target: usize, src: usize, kind: u32, value: u64) -> bool {
    use crate::rma::notify;
    let stop = std::sync::atomic::AtomicBool::new(true);
    notify(
        &x.tx.layout,
        &x.tx.peers[target],
        src,
        Note { kind, value },
        &stop,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use am_core::wire::MAX_HEAD_LEN;
    use am_core::{AmKind, Category};
    use am_perf::nic::{head_into as head, message as out};

    fn pair(config: ExtollConfig) -> (Extoll, Extoll) {
        let mut v = Extoll::cluster(2, 1 << 16, config).unwrap();
        let b = v.pop().unwrap();
        (v.pop().unwrap(), b)
    }

    fn recv(x: &mut Extoll) -> Option<(u32, Vec<u8>)> {
        for _ in 0..100_000 {
            if let Some(v) = x.poll_recv(|d, _, _| (d.src, d.bytes.to_vec())).unwrap() {
                return Some(v);
            }
            std::thread::yield_now();
        }
        None
    }

    /// A full mailbox is back-pressure: nothing is overwritten, and everything arrives once
    /// the receiver drains.
    #[test]
    fn full_mailbox_is_busy_and_loses_nothing() {
        let config = ExtollConfig {
            mailbox_slots: 148,
            medium: crate::MediumPath::Velo,
            ..ExtollConfig::default()
        };
        let (mut a, mut b) = pair(config);
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = head(Category::Request, AmKind::Medium, 100, &mut h);
        let mut sent = 0u8;
        loop {
            let payload = [sent; 100];
            match a.try_send(1, &out(&h[..n], &payload)) {
                Ok(()) => sent += 1,
                Err(SendError::Busy) => break,
                Err(e) => panic!("{e}"),
            }
        }
        // 112-byte messages take 2 packets each: 74 of them fill 148 slots.
        assert_eq!(sent, 74);
        for k in 0..sent {
            let (src, bytes) = recv(&mut b).expect("delivered");
            assert_eq!(src, 0);
            assert_eq!(&bytes[n..], &[k; 100]);
        }
        assert!(b.poll_recv(|_, _, _| ()).unwrap().is_none());
        a.try_send(1, &out(&h[..n], &[1; 100])).unwrap();
    }

    /// VELO and RMA Mediums of one source arrive in send order.
    #[test]
    fn both_paths_keep_per_source_order() {
        let config = ExtollConfig {
            medium: crate::MediumPath::Auto { rma_from: 64 },
            rma_buffers: 2,
            ..ExtollConfig::default()
        };
        let (mut a, mut b) = pair(config);
        let mut h = [0u8; MAX_HEAD_LEN];
        let sizes = [10usize, 100, 20, 200, 300, 5, 400, 8192, 1];
        let mut got = Vec::new();
        for (k, &len) in sizes.iter().enumerate() {
            let n = head(Category::Request, AmKind::Medium, len, &mut h);
            let payload = vec![k as u8; len];
            while let Err(e) = a.try_send(1, &out(&h[..n], &payload)) {
                assert_eq!(e, SendError::Busy, "RMA buffers run out");
                if let Some(m) = b.poll_recv(|d, _, _| d.bytes.to_vec()).unwrap() {
                    got.push(m);
                }
                a.drain_notes().unwrap();
            }
        }
        while got.len() < sizes.len() {
            got.push(recv(&mut b).expect("delivered").1);
        }
        for (k, &len) in sizes.iter().enumerate() {
            assert_eq!(got[k].len(), len + 12);
            assert!(
                got[k][12..].iter().all(|&x| x == k as u8),
                "message {k} in order"
            );
        }
    }

    #[test]
    fn rma_put_and_get_by_the_engine_with_notifications() {
        let (mut a, mut b) = pair(ExtollConfig::default());
        a.segment_mut()[100..110].copy_from_slice(b"0123456789");
        let op = a.rma_put(1, 5000, 100, 10).unwrap();
        while !a.rma_test(op).unwrap() {
            std::thread::yield_now();
        }
        while b.puts_landed(0) == 0 {
            b.drain_notes().unwrap();
            std::thread::yield_now();
        }
        assert_eq!(&b.segment()[5000..5010], b"0123456789");
        b.segment_mut()[7..9].copy_from_slice(b"xy");
        let op = a.rma_get(1, 7, 0, 2).unwrap();
        while !a.rma_test(op).unwrap() {
            std::thread::yield_now();
        }
        assert_eq!(&a.segment()[..2], b"xy");
        assert!(matches!(
            a.rma_put(1, 1 << 16, 0, 1),
            Err(RmaError::OutOfBounds { .. })
        ));
        assert!(matches!(a.rma_get(5, 0, 0, 1), Err(RmaError::BadRank(5))));
    }

    #[test]
    fn corrupt_notifications_and_packets_are_errors() {
        let (a, mut b) = pair(ExtollConfig::default());
        // A requester notification claiming to come from another rank.
        assert!(post_note(&a, 1, 0, kind::LONG_SENT, 0));
        assert!(b.poll_recv(|_, _, _| ()).is_err());
        // An RMA Medium notified with no buffer written: the marker check catches it.
        assert!(post_note(&a, 1, 0, kind::MEDIUM_LANDED, 0));
        assert!(b.poll_recv(|_, _, _| ()).is_err());
        // A packet from rank 9 of a 2-rank job.
        let ring = a.tx.layout.mailbox();
        let t = ring
            .try_claim(&a.tx.peers[1].seg, 1, &mut 0)
            .unwrap()
            .unwrap();
        let m = Meta {
            src: 9,
            len: 3,
            flags: FIRST | LAST,
            rma_before: 0,
        };
        ring.publish(&a.tx.peers[1].imp, t, m.encode()).unwrap();
        assert!(b.poll_recv(|_, _, _| ()).is_err());
        assert!(
            b.poll_recv(|_, _, _| ()).unwrap().is_none(),
            "dropped, not stuck"
        );
    }
}

#[cfg(test)]
mod dead_claimer {
    use super::*;
    use am_core::wire::{Header, MAX_HEAD_LEN};
    use am_core::{AmKind, Category};

    /// The pid of a process that has exited and been reaped.
    fn dead_pid() -> nix::unistd::Pid {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id() as i32;
        child.wait().unwrap();
        nix::unistd::Pid::from_raw(pid)
    }

    fn short(buf: &mut [u8; MAX_HEAD_LEN]) -> usize {
        Header {
            category: Category::Request,
            kind: AmKind::Short,
            system: false,
            handler: 1,
            nargs: 1,
            credit: 0,
            payload_len: 0,
            long_offset: 0,
        }
        .encode(&[7], buf)
    }

    /// Polls `x` until it delivers (the message's source), collecting the errors on the way;
    /// `None` after 5 s.
    fn poll_until_delivery(x: &mut Extoll, errors: &mut Vec<TransportError>) -> Option<u32> {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            match x.poll_recv(|d, _, _| d.src) {
                Ok(Some(src)) => return Some(src),
                Ok(None) => std::thread::yield_now(),
                Err(e) => errors.push(e),
            }
        }
        None
    }

    /// Rank 1 claims (and marks) slots in rank 0's mailbox and notification queue, then dies
    /// without publishing: once rank 0 notices, it skips them, and rank 2's message flows.
    #[test]
    fn slots_of_a_dead_claimer_are_skipped() {
        let mut v = Extoll::cluster(3, 1 << 16, ExtollConfig::default()).unwrap();
        let mut c = v.pop().unwrap();
        let mut b = v.pop().unwrap();
        let mut a = v.pop().unwrap();
        a.pids[1] = Some(dead_pid());
        // A 3-packet message: the first packet published, then death.
        let t = b.tx.claim(0, 3).unwrap();
        let ring = b.tx.layout.mailbox();
        let first = Meta {
            src: 1,
            len: 8,
            flags: FIRST,
            rma_before: 0,
        };
        ring.publish(&b.tx.peers[0].imp, t, first.encode()).unwrap();
        Reserved::try_new(&b.tx.layout, &b.tx.peers, 1, Some(0), &mut [0; 3])
            .unwrap()
            .unwrap();
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = short(&mut h);
        c.try_send(0, &out(&h[..n])).unwrap();
        let mut errors = Vec::new();
        assert_eq!(poll_until_delivery(&mut a, &mut errors), Some(2));
        assert_eq!(errors, vec![TransportError::PeerLost(1)]);
        assert!(
            a.note_head >= 1,
            "the dead rank's notification slot skipped"
        );
        // Later traffic from rank 2 needs no more checks.
        c.try_send(0, &out(&h[..n])).unwrap();
        assert_eq!(poll_until_delivery(&mut a, &mut errors), Some(2));
        assert_eq!(errors.len(), 1);
    }

    /// A slot claimed but never recorded (the sender died right after its claim) cannot be
    /// attributed: every liveness check then reports the loss again, never silence.
    #[test]
    fn an_unmarked_claim_keeps_reporting_peer_lost() {
        let (mut a, b) = {
            let mut v = Extoll::cluster(2, 1 << 16, ExtollConfig::default()).unwrap();
            let b = v.pop().unwrap();
            (v.pop().unwrap(), b)
        };
        a.pids[1] = Some(dead_pid());
        let ring = b.tx.layout.mailbox();
        ring.try_claim(&b.tx.peers[0].seg, 1, &mut 0)
            .unwrap()
            .unwrap();
        let mut errors = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while errors.len() < 3 && Instant::now() < deadline {
            match a.poll_recv(|_, _, _| ()) {
                Ok(Some(())) => panic!("nothing was published"),
                Ok(None) => std::thread::yield_now(),
                Err(e) => errors.push(e),
            }
        }
        assert_eq!(errors, vec![TransportError::PeerLost(1); 3]);
    }

    fn out(head: &[u8]) -> Outgoing<'_> {
        Outgoing {
            head,
            payload: &[],
            long_offset: None,
        }
    }
}
