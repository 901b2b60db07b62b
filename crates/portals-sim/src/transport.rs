//! [`Portals`]: the NIC of one rank with the GASNet Portals conduit's AM mapping, as an
//! `am_core::Transport`.
//!
//! The rank's exported byte area:
//!
//! ```text
//! request buffers   request_buffers × request_buffer_bytes, one locally managed entry each
//!                   on the request portal (match bits AM_TAG << 48, ignoring the low 48)
//! send slots        send_slots × max_message (rounded to a cache line): one entry on the
//!                   reply portal covers them all; a reply goes to its request's slot
//! segment           the AM segment: one entry on the segment portal (put and get)
//! ```
//!
//! Match bits of an AM: bits 0..32 the AM header's first four bytes (flags, handler,
//! argument count, credit byte), bits 32..48 the request's send slot, bits 48..64 `AM_TAG`.
//! Header data: the first two arguments of an inline Short (a Short or empty Medium whose head
//! is at most 16 bytes); other messages carry their whole head (and Medium payload) as data.

use std::time::{Duration, Instant};

use am_core::{Delivery, Limits, Outgoing, Rank, SendError, Transport, TransportError, Tx};
use am_shm::{Imported, Segment};

use crate::ni::{
    self, EventKind, MeIndex, MeOptions, MeSpec, NiError, NiFail, NiGeometry, NiOwner, Nic,
    Outcome, PutArgs, ABORT, PT_REPLY, PT_REQUEST, PT_SEGMENT,
};
use crate::{PortalsConfig, PortalsError};

/// A wait with no progress this long makes the rank check that its peers are alive.
const LIVENESS_AFTER: Duration = Duration::from_millis(100);
/// Empty polls between two looks at the clock.
const IDLE_POLLS_PER_TICK: u32 = 1024;
/// Tag in the top 16 match bits of every AM.
const AM_TAG: u64 = 0xA3A3;
/// Bit 0 of the AM header's flag byte: reply (`am_core::wire`).
const WIRE_REPLY: u8 = 1;
/// Kind bits of the flag byte, and the Long kind.
const KIND_SHIFT: u8 = 2;
const KIND_LONG: u8 = 2;
/// Extra match-entry records beyond the transport's, for raw users of the NI.
const SPARE_ENTRIES: u32 = 8;
/// A send slot not in use.
const FREE: u32 = u32::MAX;

/// The geometry of every rank's exported memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Ranks.
    pub ranks: u32,
    /// Chained request receive buffers.
    pub request_buffers: usize,
    /// Bytes of each.
    pub request_buffer_bytes: usize,
    /// Send slots.
    pub send_slots: usize,
    /// Bytes per send slot.
    pub slot_bytes: usize,
    /// Bytes of the AM segment.
    pub segment: usize,
    /// The NI's geometry (word area, event queue, byte area).
    pub ni: NiGeometry,
}

impl Layout {
    /// The layout for `ranks` ranks, a segment of `segment` bytes and `config`.
    pub fn new(ranks: u32, segment: usize, config: &PortalsConfig) -> Result<Layout, PortalsError> {
        config.validate()?;
        let rb = config.request_buffer_bytes(ranks);
        let rb = usize::try_from(rb)
            .ok()
            .filter(|&b| b <= 1 << 36)
            .ok_or_else(|| PortalsError::Config(format!("request buffers of {rb} bytes")))?;
        let slot_bytes = config.max_message.div_ceil(64) * 64;
        let mut l = Layout {
            ranks,
            request_buffers: config.request_buffers,
            request_buffer_bytes: rb,
            send_slots: config.send_slots,
            slot_bytes,
            segment,
            ni: NiGeometry::new(ranks, 1, 8, 0)?,
        };
        let bytes = l
            .segment_base()
            .checked_add(segment)
            .ok_or_else(|| PortalsError::Config("segment too large".into()))?;
        l.ni = NiGeometry::new(
            ranks,
            config.request_buffers as u32 + 2 + SPARE_ENTRIES,
            config.eq_capacity(ranks),
            bytes,
        )?;
        Ok(l)
    }

    /// Offset of request buffer `i`.
    pub fn request_buffer(&self, i: usize) -> usize {
        i * self.request_buffer_bytes
    }

    /// Offset of the send slots.
    pub fn send_base(&self) -> usize {
        self.request_buffers * self.request_buffer_bytes
    }

    /// Offset of the AM segment.
    pub fn segment_base(&self) -> usize {
        (self.send_base() + self.send_slots * self.slot_bytes).div_ceil(64) * 64
    }

    /// A string all ranks must agree on.
    fn fingerprint(&self, config: &PortalsConfig) -> String {
        format!(
            "{}x{}:{}x{}:{}:{}:{}:{}",
            self.request_buffers,
            self.request_buffer_bytes,
            self.send_slots,
            self.slot_bytes,
            self.segment,
            self.ni.eq_capacity(),
            config.max_long,
            config.credits
        )
    }
}

/// A peer's NI memory, mapped with full access (its NIC's view), and a writer's view of it.
struct Peer {
    seg: Segment,
    imp: Imported,
}

/// Flow-control counters of one rank (see [`Portals::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Puts this rank's wire had refused because a target's request portal entry was
    /// disabled or its event queue full (each was sent again later).
    pub refused: u64,
    /// `PtDisabled` events this rank's NI received (its request entry ran out of room).
    pub disabled: u64,
    /// Request buffers this rank re-linked after draining them.
    pub relinked: u64,
}

/// The sending half, lent to handlers during `poll_recv`.
struct TxState {
    rank: u32,
    layout: Layout,
    /// `layout.segment_base()`, computed once.
    seg_base: usize,
    config: PortalsConfig,
    peers: Vec<Peer>,
    /// Free send slots (a stack: the slot just freed is warm in the cache).
    free_slots: Vec<u16>,
    /// Destination of the request holding each send slot, or `FREE`.
    slot_dest: Vec<u32>,
    /// Per peer: the send slots of its requests we still owe a reply, in arrival order (the
    /// core answers one peer's requests in order).
    owed: Vec<Owed>,
    lost: Vec<bool>,
    stats: Stats,
}

/// A peer's send slots we owe a reply, oldest first: a ring as large as a rank's send slots
/// (each request in flight holds one of its sender's), so it never grows on the hot path.
#[derive(Debug)]
struct Owed {
    slots: Box<[u16]>,
    head: usize,
    len: usize,
}

impl Owed {
    fn new(send_slots: usize) -> Owed {
        Owed {
            slots: vec![0; send_slots.next_power_of_two()].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    #[inline]
    fn front(&self) -> Option<u16> {
        if self.len == 0 {
            return None;
        }
        self.slots.get(self.head & (self.slots.len() - 1)).copied()
    }

    #[inline]
    fn pop_front(&mut self) {
        if self.len > 0 {
            self.head = self.head.wrapping_add(1);
            self.len -= 1;
        }
    }

    /// `false` if the ring is full: the peer has more requests in flight than it has send
    /// slots (it broke the protocol).
    #[inline]
    fn push_back(&mut self, slot: u16) -> bool {
        let mask = self.slots.len() - 1;
        if self.len > mask {
            return false;
        }
        if let Some(s) = self.slots.get_mut(self.head.wrapping_add(self.len) & mask) {
            *s = slot;
        }
        self.len += 1;
        true
    }

    fn clear(&mut self) {
        self.len = 0;
    }
}

/// One request receive buffer as its owner tracks it.
#[derive(Debug, Clone, Copy)]
struct RequestBuffer {
    me: MeIndex,
    start: usize,
    len: usize,
    /// Bytes (in claim units) of messages handled since the entry was last linked.
    consumed: u64,
}

/// One rank's Portals NIC. See the [crate docs](crate).
pub struct Portals {
    own: Segment,
    owner: NiOwner,
    tx: TxState,
    buffers: Vec<RequestBuffer>,
    /// Head of an inline message, rebuilt from match bits and header data.
    scratch: [u8; 16],
    pids: Vec<Option<nix::unistd::Pid>>,
    idle_polls: u32,
    idle_since: Option<Instant>,
    last_check: Option<Instant>,
}

fn ni_err(e: NiError) -> SendError {
    SendError::Other(format!("portals: {e}"))
}

fn io(e: impl std::fmt::Display) -> TransportError {
    TransportError::Io(format!("portals: {e}"))
}

impl TxState {
    fn nic(&self, dest: usize) -> Nic<'_> {
        let p = &self.peers[dest];
        Nic::new(&p.seg, &p.imp, &self.layout.ni)
    }

    fn send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let d = dest as usize;
        if d >= self.peers.len() || self.lost[d] {
            return Err(SendError::PeerLost(dest));
        }
        let head = msg.head;
        if head.len() < am_core::wire::BASE_HEADER_LEN {
            return Err(SendError::Other(
                "portals: a head shorter than the AM header".into(),
            ));
        }
        let max = self.config.max_message;
        if msg.long_offset.is_some() {
            if head.len() > max {
                return Err(SendError::TooLarge(head.len()));
            }
            if msg.payload.len() > self.config.max_long {
                return Err(SendError::TooLarge(msg.payload.len()));
            }
        } else if msg.len() > max {
            return Err(SendError::TooLarge(msg.len()));
        }
        let is_reply = head[0] & WIRE_REPLY != 0;
        let slot = if is_reply {
            self.owed[d].front().ok_or_else(|| {
                SendError::Other("portals: a reply with no request to answer".into())
            })?
        } else {
            *self.free_slots.last().ok_or(SendError::Busy)?
        };
        let me = self.rank;
        let nic = self.nic(d);
        if let Some(off) = msg.long_offset {
            // Do not move the payload for a header the target would refuse now.
            if !is_reply && !nic.pt_enabled(PT_REQUEST).map_err(ni_err)? {
                self.stats.refused += 1;
                return Err(SendError::Busy);
            }
            // Out of the target's segment: the header goes alone and the target rejects it.
            let fits = off
                .checked_add(msg.payload.len())
                .is_some_and(|end| end <= self.layout.segment);
            if fits && !msg.payload.is_empty() {
                let data: &[&[u8]] = &[msg.payload];
                let args = PutArgs {
                    pt: PT_SEGMENT,
                    match_bits: 0,
                    hdr_data: 0,
                    remote_offset: off as u64,
                    data,
                    ack: false,
                    send_event: false,
                };
                if let Outcome::Refused(f) = nic.put(me, None, &args).map_err(ni_err)? {
                    return Err(SendError::Other(format!(
                        "portals: rank {dest}'s segment entry refused a Long payload: {f:?}"
                    )));
                }
            }
        }
        let mut first4 = [0u8; 4];
        first4.copy_from_slice(&head[..4]);
        let match_bits = u32::from_le_bytes(first4) as u64 | (slot as u64) << 32 | AM_TAG << 48;
        let inline = msg.long_offset.is_none()
            && msg.payload.is_empty()
            && head.len() <= 16
            && head[4..8] == [0; 4];
        let mut hdr = [0u8; 8];
        let parts: [&[u8]; 2] = [head, msg.payload];
        let data: &[&[u8]] = if inline {
            // At most two argument words: a short byte loop, not a `memcpy` call.
            for (d, s) in hdr.iter_mut().zip(&head[8..]) {
                *d = *s;
            }
            &[]
        } else if msg.long_offset.is_some() {
            &parts[..1]
        } else {
            &parts
        };
        let args = PutArgs {
            pt: if is_reply { PT_REPLY } else { PT_REQUEST },
            match_bits,
            hdr_data: u64::from_le_bytes(hdr),
            remote_offset: if is_reply {
                slot as u64 * self.layout.slot_bytes as u64
            } else {
                0
            },
            data,
            ack: false,
            send_event: false,
        };
        match nic.put(me, None, &args).map_err(ni_err)? {
            Outcome::Done { .. } => {
                if is_reply {
                    self.owed[d].pop_front();
                } else {
                    self.free_slots.pop();
                    self.slot_dest[slot as usize] = dest;
                }
                Ok(())
            }
            // The target's NIC refused it: nothing was deposited; the core sends it again.
            Outcome::Refused(NiFail::PtDisabled | NiFail::EqFull) => {
                self.stats.refused += 1;
                Err(SendError::Busy)
            }
            Outcome::Refused(f) => Err(SendError::Other(format!(
                "portals: rank {dest} matched no entry for {} (send slot {slot}): {f:?}",
                if is_reply { "a reply" } else { "a request" }
            ))),
        }
    }

    /// Forgets what was in flight with a lost peer, so its send slots serve the others.
    fn forget(&mut self, peer: usize) {
        self.lost[peer] = true;
        self.owed[peer].clear();
        for (s, d) in self.slot_dest.iter_mut().enumerate() {
            if *d == peer as u32 {
                *d = FREE;
                self.free_slots.push(s as u16);
            }
        }
    }
}

impl Tx for TxState {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.send(dest, msg)
    }
}

impl Tx for Portals {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.tx.send(dest, msg)
    }
}

/// Creates and initializes a rank's NI memory: portal entries, request buffers, the reply and
/// segment entries.
fn init_ni(seg: &Segment, layout: &Layout) -> Result<(NiOwner, Vec<RequestBuffer>), PortalsError> {
    let mut owner = NiOwner::new(layout.ni, seg, [true, false, false, false])?;
    let mut buffers = Vec::with_capacity(layout.request_buffers);
    for i in 0..layout.request_buffers {
        let spec = MeSpec {
            match_bits: AM_TAG << 48,
            ignore_bits: (1 << 48) - 1,
            start: layout.request_buffer(i),
            length: layout.request_buffer_bytes,
            options: MeOptions {
                put: true,
                manage_local: true,
                ..MeOptions::default()
            },
        };
        let me = owner.me_append(seg, PT_REQUEST, spec)?;
        buffers.push(RequestBuffer {
            me,
            start: spec.start,
            len: spec.length,
            consumed: 0,
        });
    }
    owner.me_append(
        seg,
        PT_REPLY,
        MeSpec {
            match_bits: AM_TAG << 48,
            ignore_bits: (1 << 48) - 1,
            start: layout.send_base(),
            length: layout.send_slots * layout.slot_bytes,
            options: MeOptions {
                put: true,
                ..MeOptions::default()
            },
        },
    )?;
    owner.me_append(
        seg,
        PT_SEGMENT,
        MeSpec {
            match_bits: 0,
            ignore_bits: 0,
            start: layout.segment_base(),
            length: layout.segment,
            options: MeOptions {
                put: true,
                get: true,
                event_disable: true,
                ..MeOptions::default()
            },
        },
    )?;
    Ok((owner, buffers))
}

impl Portals {
    #[allow(clippy::too_many_arguments)]
    fn new(
        rank: u32,
        layout: Layout,
        config: PortalsConfig,
        own: Segment,
        owner: NiOwner,
        buffers: Vec<RequestBuffer>,
        peers: Vec<Peer>,
        pids: Vec<Option<nix::unistd::Pid>>,
    ) -> Portals {
        let n = layout.ranks as usize;
        Portals {
            own,
            owner,
            tx: TxState {
                rank,
                layout,
                seg_base: layout.segment_base(),
                config,
                peers,
                free_slots: (0..layout.send_slots as u16).rev().collect(),
                slot_dest: vec![FREE; layout.send_slots],
                owed: (0..n).map(|_| Owed::new(layout.send_slots)).collect(),
                lost: vec![false; n],
                stats: Stats::default(),
            },
            buffers,
            scratch: [0; 16],
            pids,
            idle_polls: 0,
            idle_since: None,
            last_check: None,
        }
    }

    fn attach(job: &str, r: u32, layout: &Layout) -> Result<Peer, PortalsError> {
        let seg = am_shm::portal::attach_nic(
            job,
            &format!("portals-{r}"),
            layout.ni.words_len(),
            layout.ni.bytes(),
        )?;
        let imp = seg.import();
        Ok(Peer { seg, imp })
    }

    /// The transports of an in-process job of `ranks` ranks (one per thread), over real
    /// `/dev/shm` segments that are unlinked as soon as all are mapped.
    pub fn cluster(
        ranks: u32,
        segment_size: usize,
        config: PortalsConfig,
    ) -> Result<Vec<Portals>, PortalsError> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static JOBS: AtomicUsize = AtomicUsize::new(0);
        if ranks == 0 {
            return Err(PortalsError::Config("a job has at least one rank".into()));
        }
        let layout = Layout::new(ranks, segment_size, &config)?;
        let job = format!(
            "portalsproc{}x{}",
            std::process::id(),
            JOBS.fetch_add(1, Ordering::Relaxed)
        );
        let mut segs = Vec::with_capacity(ranks as usize);
        for r in 0..ranks {
            let seg = Segment::create(
                &job,
                &format!("portals-{r}"),
                layout.ni.words_len(),
                layout.ni.bytes(),
            )?;
            let (owner, buffers) = init_ni(&seg, &layout)?;
            segs.push((seg, owner, buffers));
        }
        let mut out = Vec::with_capacity(ranks as usize);
        let mut all_peers = Vec::with_capacity(ranks as usize);
        for _ in 0..ranks {
            all_peers.push(
                (0..ranks)
                    .map(|p| Self::attach(&job, p, &layout))
                    .collect::<Result<Vec<_>, _>>()?,
            );
        }
        for (r, ((mut seg, owner, buffers), peers)) in segs.into_iter().zip(all_peers).enumerate() {
            seg.unlink()?;
            out.push(Portals::new(
                r as u32,
                layout,
                config,
                seg,
                owner,
                buffers,
                peers,
                vec![None; ranks as usize],
            ));
        }
        Ok(out)
    }

    /// Starts this rank's NIC in a multi-process job: creates and initializes its NI memory
    /// (`/dev/shm/am-<job>-portals-<rank>`), exchanges pids and geometry through the
    /// launcher's key-value store, maps every rank's NI, then unlinks its file (so a killed
    /// job leaves nothing behind).
    pub fn connect(
        job: &mut am_launch::JobInfo,
        segment_size: usize,
        config: PortalsConfig,
    ) -> Result<Portals, PortalsError> {
        let layout = Layout::new(job.size, segment_size, &config)?;
        let rank = job.rank;
        let mut seg = Segment::create(
            &job.job_id,
            &format!("portals-{rank}"),
            layout.ni.words_len(),
            layout.ni.bytes(),
        )?;
        let (owner, buffers) = init_ni(&seg, &layout)?;
        let ours = layout.fingerprint(&config);
        let boot = |e: am_launch::BootstrapError| PortalsError::Bootstrap(e.to_string());
        let mut pids = vec![None; job.size as usize];
        let mut peers = Vec::with_capacity(job.size as usize);
        if job.size == 1 {
            peers.push(Self::attach(&job.job_id, 0, &layout)?);
        } else {
            let kvs = job.kvs.as_mut().ok_or_else(|| {
                PortalsError::Bootstrap("no key-value store (launch with amrun or mpiexec)".into())
            })?;
            let pid = std::process::id();
            kvs.put(&format!("portals-{rank}"), &format!("{pid}:{ours}"))
                .map_err(boot)?;
            kvs.fence().map_err(boot)?;
            for r in 0..job.size {
                let v = kvs.get(&format!("portals-{r}")).map_err(boot)?;
                let (p, theirs) = v.split_once(':').unwrap_or(("", ""));
                if theirs != ours {
                    return Err(PortalsError::Mismatch {
                        rank: r,
                        theirs: theirs.to_owned(),
                        ours,
                    });
                }
                let p: i32 = p
                    .parse()
                    .map_err(|_| PortalsError::Bootstrap(format!("rank {r} sent pid {p:?}")))?;
                if r != rank {
                    pids[r as usize] = Some(nix::unistd::Pid::from_raw(p));
                }
                peers.push(Self::attach(&job.job_id, r, &layout)?);
            }
            kvs.fence().map_err(boot)?;
        }
        seg.unlink()?;
        Ok(Portals::new(
            rank, layout, config, seg, owner, buffers, peers, pids,
        ))
    }

    /// The configuration in use.
    pub fn config(&self) -> &PortalsConfig {
        &self.tx.config
    }

    /// The memory geometry in use.
    pub fn layout(&self) -> &Layout {
        &self.tx.layout
    }

    /// Bytes of this rank's request receive buffers (what the credit policy's budget costs).
    pub fn receive_buffer_bytes(&self) -> u64 {
        (self.tx.layout.request_buffers * self.tx.layout.request_buffer_bytes) as u64
    }

    /// Flow-control counters so far.
    pub fn stats(&self) -> Stats {
        self.tx.stats
    }

    /// This rank's NI: its memory as a NIC sees it, for raw puts and gets between ranks
    /// (`nic(r).put(...)` runs the wire into rank `r`).
    pub fn nic(&self, rank: Rank) -> Option<Nic<'_>> {
        (rank < self.tx.layout.ranks).then(|| self.tx.nic(rank as usize))
    }

    fn buffer_of(&self, me: MeIndex) -> Option<usize> {
        self.buffers.iter().position(|b| b.me == me)
    }

    /// After a request buffer's message was handled, or its entry was unlinked: once every
    /// byte claimed in an unlinked entry was consumed, link it again at the end of the list.
    fn check_buffer(&mut self, b: usize) -> Result<(), TransportError> {
        let me = self.buffers[b].me;
        let Some(used) = self.owner.lm_used(&self.own, me).map_err(io)? else {
            return Ok(());
        };
        if self.owner.is_listed(me) {
            self.owner.lm_retire(&self.own, me).map_err(io)?;
        }
        if self.buffers[b].consumed >= used {
            self.buffers[b].consumed = 0;
            self.owner.lm_relink(&self.own, me).map_err(io)?;
            self.tx.stats.relinked += 1;
            self.maybe_enable()?;
        }
        Ok(())
    }

    /// Flow-control recovery: re-enables the request portal entry once a buffer has room.
    fn maybe_enable(&mut self) -> Result<(), TransportError> {
        if !self.owner.pt_disabled(&self.own, PT_REQUEST).map_err(io)? {
            return Ok(());
        }
        for b in &self.buffers {
            if self.owner.is_listed(b.me)
                && self.owner.lm_claimed(&self.own, b.me).map_err(io)? < b.len as u64
            {
                return self.owner.pt_enable(&self.own, PT_REQUEST).map_err(io);
            }
        }
        Ok(())
    }

    /// After a while without progress: is every peer that has not departed still alive?
    fn liveness_tick(&mut self) -> Result<(), TransportError> {
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        self.owner.eq_publish_head(&self.own).map_err(io)?;
        self.maybe_enable()?;
        if now.duration_since(since) < LIVENESS_AFTER
            || self
                .last_check
                .is_some_and(|t| now.duration_since(t) < LIVENESS_AFTER)
        {
            return Ok(());
        }
        self.last_check = Some(now);
        if self.own.load_word(ABORT).unwrap_or(0) != 0 {
            return Err(TransportError::JobAborted);
        }
        for r in 0..self.pids.len() {
            let Some(pid) = self.pids[r] else { continue };
            let departed = self
                .own
                .load_word(self.tx.layout.ni.departed(r))
                .unwrap_or(0);
            if self.tx.lost[r] || departed != 0 {
                continue;
            }
            if !am_launch::process_alive(pid) {
                self.tx.forget(r);
                return Err(TransportError::PeerLost(r as Rank));
            }
        }
        Ok(())
    }
}

impl Transport for Portals {
    fn name(&self) -> &'static str {
        "portals"
    }

    fn rank(&self) -> Rank {
        self.tx.rank
    }

    fn size(&self) -> u32 {
        self.tx.layout.ranks
    }

    fn limits(&self) -> Limits {
        Limits {
            max_args: am_core::wire::MAX_ARGS,
            max_medium: self.tx.config.max_message - am_core::wire::MAX_HEAD_LEN,
            max_long: self.tx.config.max_long,
            max_credits: self.tx.config.credits.max_per_peer().min(255),
        }
    }

    fn segment(&self) -> &[u8] {
        let l = &self.tx.layout;
        self.own.bytes(l.segment_base(), l.segment).unwrap_or(&[])
    }

    fn segment_mut(&mut self) -> &mut [u8] {
        let l = self.tx.layout;
        self.own
            .bytes_mut(l.segment_base(), l.segment)
            .unwrap_or(&mut [])
    }

    #[inline]
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, &mut [u8], &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        let ev = loop {
            let Some(ev) = self.owner.eq_poll(&self.own).map_err(io)? else {
                self.idle_polls = self.idle_polls.wrapping_add(1);
                if self.idle_polls % IDLE_POLLS_PER_TICK == 0 {
                    self.liveness_tick()?;
                }
                return Ok(None);
            };
            match (ev.kind, ev.pt) {
                (EventKind::Put, PT_REQUEST | PT_REPLY) => break ev,
                (EventKind::Unlink, PT_REQUEST) => {
                    if let Some(b) = self.buffer_of(ev.me) {
                        self.check_buffer(b)?;
                    }
                }
                (EventKind::PtDisabled, _) => {
                    self.tx.stats.disabled += 1;
                    self.maybe_enable()?
                }
                (EventKind::Dropped, _) => {}
                (k, pt) => {
                    return Err(io(format_args!(
                        "rank {} posted an unexpected {k:?} event on portal {pt}",
                        ev.initiator
                    )))
                }
            }
        };
        self.idle_polls = 0;
        self.idle_since = None;
        let (ranks, seg_base, seg_len) = {
            let l = &self.tx.layout;
            (l.ranks as usize, self.tx.seg_base, l.segment)
        };
        let src = ev.initiator as usize;
        let is_request = ev.pt == PT_REQUEST;
        // Inline messages occupy no buffer space.
        let buffer = if is_request && ev.mlength > 0 {
            self.buffer_of(ev.me)
        } else {
            None
        };
        let claimed = ni::lm_len(ev.mlength as usize) as u64;
        let corrupt = |what: &str| {
            TransportError::Io(format!(
                "portals: a bad {what} from rank {src} (event {ev:?})"
            ))
        };
        if src >= ranks || ev.match_bits >> 48 != AM_TAG {
            return Err(corrupt("event"));
        }
        let slot = (ev.match_bits >> 32) as u16;
        let flags = ev.match_bits as u8;
        // Where the message is: rebuilt in `scratch` (inline) or where the NIC deposited it.
        let (at, len) = if ev.mlength == 0 {
            let nargs = (ev.match_bits >> 16) as u8 as usize;
            if nargs > 2 {
                return Err(corrupt("inline message"));
            }
            self.scratch[..4].copy_from_slice(&(ev.match_bits as u32).to_le_bytes());
            self.scratch[4..8].fill(0);
            self.scratch[8..].copy_from_slice(&ev.hdr_data.to_le_bytes());
            (None, 8 + 4 * nargs)
        } else {
            let (lo, hi) = if is_request {
                let Some(b) = buffer else {
                    return Err(corrupt("request buffer"));
                };
                let b = &self.buffers[b];
                (b.start, b.start + b.len)
            } else {
                let l = &self.tx.layout;
                let s = l.send_base() + slot as usize * l.slot_bytes;
                (s, s + l.slot_bytes)
            };
            let start = ev.start as usize;
            let ok = start >= lo
                && start
                    .checked_add(ev.mlength as usize)
                    .is_some_and(|e| e <= hi);
            if !ok || (!is_request && start != lo) {
                if let Some(b) = buffer {
                    self.buffers[b].consumed += claimed;
                    self.check_buffer(b)?;
                }
                return Err(corrupt("message range"));
            }
            (Some(start), ev.mlength as usize)
        };
        if is_request {
            if !self.tx.owed[src].push_back(slot) {
                return Err(corrupt("request (more in flight than send slots)"));
            }
        } else if self.tx.slot_dest.get(slot as usize) != Some(&(src as u32)) {
            return Err(corrupt("reply (to a send slot it does not hold)"));
        }
        let placed = (flags >> KIND_SHIFT) & 3 == KIND_LONG;
        let (bytes, segment) = match at {
            None => (
                &self.scratch[..len],
                self.own.bytes_mut(seg_base, seg_len).map_err(io)?,
            ),
            Some(start) => self
                .own
                .split_lend(start, len, seg_base, seg_len)
                .map_err(io)?,
        };
        let delivery = Delivery {
            src: src as Rank,
            bytes,
            payload_placed: placed,
        };
        let r = f(delivery, segment, &mut self.tx);
        if let Some(b) = buffer {
            self.buffers[b].consumed += claimed;
            self.check_buffer(b)?;
        } else if !is_request {
            // The reply landed in the request's send slot: the slot is free again.
            self.tx.slot_dest[slot as usize] = FREE;
            self.tx.free_slots.push(slot);
        }
        Ok(Some(r))
    }

    /// The initiator's process performs the segment entry's deposit before the header goes:
    /// a Long has landed once `try_send` returned.
    fn long_placed_on_send(&self, _len: usize) -> bool {
        true
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        if self.owner.eq_ready(&self.own).map_err(io)? {
            return Ok(());
        }
        self.owner.eq_publish_head(&self.own).map_err(io)?;
        // Producers ring only while we are announced; a claim the announcement raced with
        // (a producer mid-post) is a reason to poll on rather than sleep.
        let quiet = self.owner.announce_wait(&self.own).map_err(io)?;
        let r = if quiet { self.liveness_tick() } else { Ok(()) };
        if quiet && r.is_ok() {
            let bell = self.owner.doorbell(&self.own).map_err(io)?;
            bell.sleep(timeout.min(LIVENESS_AFTER));
        }
        self.owner.end_wait(&self.own).map_err(io)?;
        r
    }
}

impl Drop for Portals {
    fn drop(&mut self) {
        let me = self.tx.rank as usize;
        let panicking = std::thread::panicking();
        for (r, peer) in self.tx.peers.iter().enumerate() {
            if r == me {
                continue;
            }
            if let Ok(w) = peer.seg.word(self.tx.layout.ni.departed(me)) {
                w.store(1, std::sync::atomic::Ordering::Release);
            }
            if panicking {
                if let Ok(w) = peer.seg.word(ABORT) {
                    w.store(1, std::sync::atomic::Ordering::Release);
                }
            }
            if let Ok(bell) = peer.seg.doorbell(0) {
                bell.ring();
            }
        }
    }
}

impl std::fmt::Debug for Portals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Portals")
            .field("rank", &self.tx.rank)
            .field("layout", &self.tx.layout)
            .field("config", &self.tx.config)
            .finish()
    }
}

/// Over real `/dev/shm` segments, so not under Miri (the NI model's tests are).
#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;
    use am_core::wire::{Header, MAX_HEAD_LEN};
    use am_core::{AmKind, Category};
    use am_perf::nic::message as out;

    fn head(
        category: Category,
        kind: AmKind,
        nargs: u8,
        payload: usize,
    ) -> ([u8; MAX_HEAD_LEN], usize) {
        let mut buf = [0u8; MAX_HEAD_LEN];
        let args: Vec<u32> = (0..nargs as u32).map(|i| 100 + i).collect();
        let n = Header {
            category,
            kind,
            system: false,
            handler: 9,
            nargs,
            credit: 0,
            payload_len: payload as u32,
            long_offset: 0,
        }
        .encode(&args, &mut buf);
        (buf, n)
    }

    fn pair(config: PortalsConfig) -> (Portals, Portals) {
        let mut v = Portals::cluster(2, 4096, config).unwrap();
        let b = v.pop().unwrap();
        (v.pop().unwrap(), b)
    }

    /// Inline Shorts rebuild the exact head; deposited Mediums are lent in place; the reply
    /// lands in the request's send slot and frees it.
    #[test]
    fn inline_and_deposited_messages_and_replies() {
        let (mut a, mut b) = pair(PortalsConfig {
            send_slots: 2,
            ..PortalsConfig::default()
        });
        let (s, sn) = head(Category::Request, AmKind::Short, 2, 0);
        let (m, mn) = head(Category::Request, AmKind::Medium, 3, 5);
        a.try_send(1, &out(&s[..sn], &[])).unwrap();
        a.try_send(1, &out(&m[..mn], b"hello")).unwrap();
        assert_eq!(
            a.try_send(1, &out(&s[..sn], &[])),
            Err(SendError::Busy),
            "no send slot"
        );
        let (r, rn) = head(Category::Reply, AmKind::Medium, 1, 3);
        for want in [s[..sn].to_vec(), [&m[..mn], b"hello"].concat()] {
            let got = b
                .poll_recv(|d, _, tx| {
                    assert_eq!(d.bytes, &want[..]);
                    tx.try_send(0, &out(&r[..rn], b"abc")).unwrap();
                })
                .unwrap();
            assert!(got.is_some());
        }
        assert!(b.poll_recv(|_, _, _| ()).unwrap().is_none());
        for _ in 0..2 {
            let got = a
                .poll_recv(|d, _, _| assert_eq!(d.bytes, [&r[..rn], b"abc"].concat()))
                .unwrap();
            assert!(got.is_some());
        }
        a.try_send(1, &out(&s[..sn], &[])).unwrap();
    }

    #[test]
    fn reply_without_request_oversize_and_bad_rank_are_errors() {
        let (mut a, _b) = pair(PortalsConfig::default());
        let (r, rn) = head(Category::Reply, AmKind::Short, 0, 0);
        assert!(matches!(
            a.try_send(1, &out(&r[..rn], &[])),
            Err(SendError::Other(_))
        ));
        let big = vec![0u8; 1100];
        let (m, mn) = head(Category::Request, AmKind::Medium, 0, big.len());
        assert_eq!(
            a.try_send(1, &out(&m[..mn], &big)),
            Err(SendError::TooLarge(mn + 1100))
        );
        assert_eq!(
            a.try_send(5, &out(&m[..mn], &[])),
            Err(SendError::PeerLost(5))
        );
    }

    /// Tiny request buffers: puts are refused while the portal entry is disabled and accepted
    /// again after the target consumed and re-linked its buffers. Nothing is lost.
    #[test]
    fn entry_disabled_then_recovered() {
        let (mut a, mut b) = pair(PortalsConfig {
            request_buffer_bytes: Some(256),
            max_message: 256,
            ..PortalsConfig::default()
        });
        let payload = [7u8; 100];
        let (m, mn) = head(Category::Request, AmKind::Medium, 0, payload.len());
        let mut sent = 0;
        while a.try_send(1, &out(&m[..mn], &payload)).is_ok() {
            sent += 1;
        }
        assert_eq!(
            sent, 6,
            "two 112-byte messages per 256-byte buffer, three buffers"
        );
        assert!(b.owner.pt_disabled(&b.own, PT_REQUEST).unwrap());
        let (r, rn) = head(Category::Reply, AmKind::Short, 0, 0);
        let mut got = 0;
        let mut refused = 0;
        while got < 40 {
            match b.poll_recv(|d, _, tx| {
                assert_eq!(&d.bytes[mn..], &payload[..]);
                tx.try_send(0, &out(&r[..rn], &[])).unwrap();
            }) {
                Ok(Some(())) => got += 1,
                Ok(None) => {}
                Err(e) => panic!("{e}"),
            }
            while a.poll_recv(|_, _, _| ()).unwrap().is_some() {}
            if sent < 40 {
                match a.try_send(1, &out(&m[..mn], &payload)) {
                    Ok(()) => sent += 1,
                    Err(SendError::Busy) => refused += 1,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        assert_eq!((sent, got), (40, 40));
        assert!(refused > 0, "flow control was exercised");
    }

    #[test]
    fn long_payload_is_placed_before_the_header() {
        let (mut a, mut b) = pair(PortalsConfig::default());
        let mut buf = [0u8; MAX_HEAD_LEN];
        let n = Header {
            category: Category::Request,
            kind: AmKind::Long,
            system: false,
            handler: 3,
            nargs: 0,
            credit: 0,
            payload_len: 6,
            long_offset: 100,
        }
        .encode(&[], &mut buf);
        a.try_send(
            1,
            &Outgoing {
                head: &buf[..n],
                payload: b"placed",
                long_offset: Some(100),
            },
        )
        .unwrap();
        let got = b
            .poll_recv(|d, seg, _| {
                assert!(d.payload_placed);
                assert_eq!(d.bytes, &buf[..n]);
                assert_eq!(&seg[100..106], b"placed");
            })
            .unwrap();
        assert!(got.is_some());
    }
}
