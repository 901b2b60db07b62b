//! Starting a rank: its NI (portal table, match list entries, event queue) and segment, in
//! one process (a cluster) or through the launcher's key-value store.

use super::*;

/// Creates and initializes a rank's NI memory: portal entries, request buffers, the reply and
/// segment entries.
pub(super) fn init_ni(seg: &Segment, layout: &Layout) -> Result<Initialized, PortalsError> {
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
            exhausted: false,
            used: None,
            high: 0,
        });
    }
    let reply_me = owner.me_append(
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
    Ok((owner, buffers, reply_me))
}

/// Why start-up failed, in this crate's terms.
pub(super) fn setup_error(e: am_nic::SetupError) -> PortalsError {
    match e {
        am_nic::SetupError::Shm(e) => PortalsError::Shm(e),
        am_nic::SetupError::Bootstrap(s) => PortalsError::Bootstrap(s),
        am_nic::SetupError::Config(s) => PortalsError::Config(s),
        am_nic::SetupError::Mismatch { rank, theirs, ours } => {
            PortalsError::Mismatch { rank, theirs, ours }
        }
        am_nic::SetupError::SegmentSizeMismatch { rank, ours, theirs } => {
            PortalsError::SegmentSizeMismatch { rank, ours, theirs }
        }
        other => PortalsError::Setup(other),
    }
}

impl Portals {
    /// `dest` as an index, for the operations the NIC does on its memory (put, get,
    /// atomics): a rank of the job, not known lost, and not departed (its departed word in
    /// our NI memory is set).
    pub(super) fn reachable(&self, dest: Rank) -> Result<usize, SendError> {
        let d = dest as usize;
        if d >= self.tx.peers.len() {
            return Err(SendError::InvalidRank(dest));
        }
        if self.tx.lost[d] {
            return Err(SendError::PeerLost(dest));
        }
        let departed = self.tx.layout.ni.departed(d);
        if d != self.tx.rank as usize && self.own.load_word(departed).unwrap_or(0) != 0 {
            return Err(SendError::PeerDeparted(dest));
        }
        Ok(d)
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        job: String,
        rank: u32,
        layout: Layout,
        config: PortalsConfig,
        own: Segment,
        init: Initialized,
        peers: Vec<Peer>,
        pids: Vec<Option<nix::unistd::Pid>>,
    ) -> Portals {
        let (owner, buffers, reply_me) = init;
        let n = layout.ranks as usize;
        Portals {
            own,
            owner,
            tx: TxState {
                rank,
                wakers: Wakers::new(&job, layout.ranks),
                layout,
                seg_base: layout.segment_base(),
                config,
                peers,
                free_slots: (0..layout.send_slots as u16).rev().collect(),
                slot_dest: vec![FREE; layout.send_slots],
                in_flight: (0..n).map(|_| SlotFifo::default()).collect(),
                owed: (0..n).map(|_| Owed::new(layout.send_slots)).collect(),
                lost: vec![false; n],
                stats: Stats::default(),
                buffer_mes: buffers.iter().map(|b| b.me).collect(),
                reply_me,
                room_wanted: None,
                retry_now: false,
            },
            buffers,
            reply_me,
            scratch: [0; 16],
            liveness: Liveness::new(pids),
            refusals: 0,
            in_flight_waits: 0,
            stuck: false,
            departures: std::collections::VecDeque::new(),
            wake: Wake::new("portals", &job, rank),
            room_next: 0,
            room_per_ring: (layout.request_buffer_bytes / layout.slot_bytes).max(1),
        }
    }

    /// The transports of an in-process job of `ranks` ranks (one per thread), over heap
    /// memory that the threads share exactly as processes share a mapping (the same atomics,
    /// the same views; each rank's NIC maps its peers with [`Segment::share`]), so Miri and
    /// loom check this code too.
    pub fn cluster(
        ranks: u32,
        segment_size: usize,
        config: PortalsConfig,
    ) -> Result<Vec<Portals>, PortalsError> {
        if ranks == 0 {
            return Err(PortalsError::Config("a job has at least one rank".into()));
        }
        let layout = Layout::new(ranks, segment_size, &config)?;
        let segs = (0..ranks)
            .map(|_| Segment::heap(layout.ni.words_len(), layout.ni.bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut out = Vec::with_capacity(ranks as usize);
        let job = am_nic::wake::in_process_job("portals");
        for (r, seg) in segs.iter().enumerate() {
            let init = init_ni(seg, &layout)?;
            let peers = segs
                .iter()
                .map(|s| Peer::new(s.share(), &layout))
                .collect::<Result<_, _>>()?;
            out.push(Portals::new(
                job.clone(),
                r as u32,
                layout,
                config,
                seg.share(),
                init,
                peers,
                vec![None; ranks as usize],
            ));
        }
        Ok(out)
    }

    /// Starts this rank's NIC in a multi-process job (`am_nic::connect`): creates its NI
    /// memory (anonymous: no file is ever left behind, whatever kills the job), initializes
    /// it, exchanges pids, geometry and segment handles through the launcher's key-value
    /// store, and maps every rank's NI with full access (its NIC's view).
    pub fn connect(
        job: &mut am_bootstrap::JobInfo,
        segment_size: usize,
        config: PortalsConfig,
    ) -> Result<Portals, PortalsError> {
        let layout = Layout::new(job.size, segment_size, &config)?;
        let rank = job.rank;
        let geometry = layout.fingerprint(&config);
        let mut made: Option<Result<Initialized, PortalsError>> = None;
        let joined = am_nic::connect(
            job,
            "portals",
            layout.ni.words_len(),
            layout.ni.bytes(),
            segment_size,
            &geometry,
            |seg| match init_ni(seg, &layout) {
                Ok(init) => {
                    made = Some(Ok(init));
                    Ok(())
                }
                Err(e) => {
                    made = Some(Err(e));
                    // Only stops `connect`: the typed error kept in `made` is the one returned.
                    Err(am_nic::SetupError::Config(
                        "the NI could not be set up".into(),
                    ))
                }
            },
        );
        let (init, joined) = match (made, joined) {
            (Some(Err(e)), _) => return Err(e),
            (_, Err(e)) => return Err(setup_error(e)),
            (Some(Ok(init)), Ok(joined)) => (init, joined),
            (None, Ok(_)) => unreachable!("am_nic::connect runs `init` before it can succeed"),
        };
        let peers = joined
            .peers
            .into_iter()
            .map(|seg| Peer::new(seg, &layout))
            .collect::<Result<_, _>>()?;
        Ok(Portals::new(
            job.job_id.clone(),
            rank,
            layout,
            config,
            joined.own,
            init,
            peers,
            joined.pids,
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
}
