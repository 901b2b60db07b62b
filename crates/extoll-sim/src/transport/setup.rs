//! Starting a rank: its layout, its registered segment and the peers', in one process (a
//! cluster) or through the launcher's key-value store.

use super::*;

impl Extoll {
    pub(super) fn new(
        job: String,
        rank: usize,
        layout: Layout,
        config: ExtollConfig,
        seg: Segment,
        peers: Arc<Vec<PeerMap>>,
        pids: Vec<Option<nix::unistd::Pid>>,
    ) -> Result<Extoll, ExtollError> {
        let n = layout.ranks;
        let own = seg.import();
        let now = Instant::now();
        let mailbox = layout.mailbox();
        let notes = layout.notifications();
        let dests = peers
            .iter()
            .map(|p| {
                let record = layout.claims(rank, CLAIM_MAILBOX);
                let note_record = layout.claims(rank, CLAIM_NOTES);
                Ok(Dest {
                    port: mailbox.port(&p.seg, mailbox_claimer(rank), record)?,
                    notes: notes.port(&p.seg, notes_claimer(rank, false), note_record)?,
                    velo_sent: 0,
                    rma_sent: 0,
                    lost: false,
                })
            })
            .collect::<Result<Vec<_>, ShmError>>()?;
        Ok(Extoll {
            inbox: mailbox.inbox(&seg)?,
            notes: layout.notifications().inbox(&seg)?,
            head_batch: layout.mailbox_slots as u64 / 4,
            room_at: layout.room(),
            freed: 0,
            room_next: 0,
            rx_from: (0..n).map(|s| layout.rx(s, 0)).collect(),
            seg,
            own,
            tx: TxState {
                rank,
                layout,
                config,
                medium: Cell::new(config.medium),
                peers,
                dests,
                cap: config.packet_size - STATUS_LEN,
                rx_ours: layout.rx(rank, 0),
                pool_at: layout.pool(0),
                pool_hint: vec![0; if layout.rma_pool > 0 { n } else { 0 }],
                pids: pids.clone(),
                mailbox_head: vec![0; n],
                last_sent_to: NOT_STREAMING,
                rma_acked: vec![0; n],
                rma_consumed: vec![0; n],
                rma_ack_sent: vec![0; n],
                note_heads: vec![0; n],
                engine: None,
                engine_patience: NOTIFY_PATIENCE,
                jobs: 0,
                jobs_done: 0,
                next_op: 0,
                faults: VecDeque::new(),
                tickets: Vec::with_capacity(MAX_PACKETS),
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
            pool_bufs: vec![VecDeque::new(); if layout.rma_pool > 0 { n } else { 0 }],
            long_landed: vec![0; n],
            long_used: vec![0; n],
            put_landed: vec![0; n],
            user_pending: HashSet::new(),
            user_done: HashSet::new(),
            user_failed: HashMap::new(),
            rr: 0,
            rma_stall: false,
            polls: 0,
            liveness: am_nic::Liveness::new(pids),
            watch: Watch {
                mailbox: 0,
                mailbox_since: now,
                notes: 0,
                notes_since: now,
                last_check: None,
            },
            wake: Wake::new("extoll", &job, rank as Rank),
        })
    }

    pub(super) fn layout_for(
        ranks: u32,
        segment_size: usize,
        c: &ExtollConfig,
    ) -> Result<Layout, ExtollError> {
        if ranks == 0 || ranks > 1 << 16 {
            return Err(ExtollError::Config("a job has 1..=65536 ranks".into()));
        }
        Layout::new(ranks as usize, c, segment_size).ok_or_else(|| {
            ExtollError::Config(format!(
                "{ranks} ranks with a segment of {segment_size} bytes overflow a segment's size"
            ))
        })
    }

    /// The transports of an in-process job of `ranks` ranks (one per thread), over heap
    /// memory that the threads share exactly as processes share a mapping (the same atomics,
    /// the same views), so Miri checks this code too.
    pub fn cluster(
        ranks: u32,
        segment_size: usize,
        config: ExtollConfig,
    ) -> Result<Vec<Extoll>, ExtollError> {
        config.validate()?;
        let layout = Self::layout_for(ranks, segment_size, &config)?;
        let segs = (0..ranks)
            .map(|_| Segment::heap(layout.words_len(), layout.bytes_len()))
            .collect::<Result<Vec<_>, _>>()?;
        // What a peer's NIC maps: full access for claims and gets, a writer for the rest.
        let job = am_nic::wake::in_process_job("extoll");
        let wakers = Arc::new(Wakers::new(&job, ranks));
        let peers: Arc<Vec<PeerMap>> = Arc::new(
            segs.iter()
                .enumerate()
                .map(|(r, s)| PeerMap {
                    seg: s.share(),
                    imp: s.import(),
                    rank: r as Rank,
                    wakers: wakers.clone(),
                })
                .collect(),
        );
        segs.into_iter()
            .enumerate()
            .map(|(r, seg)| {
                Extoll::new(
                    job.clone(),
                    r,
                    layout,
                    config,
                    seg,
                    peers.clone(),
                    vec![None; ranks as usize],
                )
            })
            .collect()
    }

    /// Starts this rank's NIC in a multi-process job: creates its segment (anonymous: no file
    /// is ever left behind), exchanges pids, geometry and segment handles through the
    /// launcher's key-value store, and maps every peer's segment (`am_nic::connect`).
    pub fn connect(
        job: &mut am_bootstrap::JobInfo,
        segment_size: usize,
        config: ExtollConfig,
    ) -> Result<Extoll, ExtollError> {
        config.validate()?;
        let layout = Self::layout_for(job.size, segment_size, &config)?;
        let geometry = format!(
            "{},{},{},{},{},{},{}",
            config.packet_size,
            config.mailbox_slots,
            config.notify_slots,
            layout.rma_buffers,
            config.rma_pool,
            config.max_long,
            segment_size
        );
        let joined = am_nic::connect(
            job,
            "extoll",
            layout.words_len(),
            layout.bytes_len(),
            segment_size,
            &geometry,
            |_| Ok(()),
        )?;
        // A peer's NIC maps it with full access (claims, gets) and writes through a writer.
        let wakers = Arc::new(Wakers::new(&job.job_id, job.size));
        let peers = joined
            .peers
            .into_iter()
            .enumerate()
            .map(|(r, seg)| PeerMap {
                imp: seg.import(),
                seg,
                rank: r as Rank,
                wakers: wakers.clone(),
            })
            .collect();
        Extoll::new(
            job.job_id.clone(),
            job.rank as usize,
            layout,
            config,
            joined.own,
            Arc::new(peers),
            joined.pids,
        )
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
}

impl Extoll {
    /// `dest`'s AM segment, as this rank's mapping of it reaches it (remote atomics).
    pub(super) fn peer_segment(&self, dest: Rank) -> Result<SharedBytes<'_>, SendError> {
        let d = dest as usize;
        let Some(peer) = self.tx.peers.get(d) else {
            return Err(SendError::InvalidRank(dest));
        };
        if self.tx.dests[d].lost {
            return Err(SendError::PeerLost(dest));
        }
        let l = &self.tx.layout;
        // A rank that left wrote its departed word here: nothing it owns is to be touched.
        if d != self.tx.rank && self.seg.load_word(l.departed(d)).unwrap_or(0) != 0 {
            return Err(SendError::PeerDeparted(dest));
        }
        peer.imp
            .byte_area()
            .slice(l.segment_base(), l.segment)
            .map_err(shm)
    }
}
