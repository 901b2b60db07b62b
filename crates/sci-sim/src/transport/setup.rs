//! Starting a rank: its layout, its exported segment and the peers' imported ones, in one
//! process (a cluster) or through the launcher's key-value store.

use super::*;

impl Sci {
    pub(super) fn new(
        job: String,
        rank: usize,
        layout: Layout,
        config: SciConfig,
        seg: Segment,
        peer_segments: &[Segment],
        pids: Vec<Option<nix::unistd::Pid>>,
    ) -> Result<Sci, SciError> {
        let n = layout.ranks;
        let peers: Vec<Imported> = peer_segments.iter().map(Segment::import).collect();
        let (bank_tx, bank) = match layout.bank_ring() {
            Some(ring) => {
                let record = layout.bank_record(rank);
                let ports = peer_segments
                    .iter()
                    .map(|p| ring.port(p, rank as u32, record))
                    .collect::<Result<Vec<_>, _>>()?;
                let tx = BankTx {
                    ports,
                    heads: vec![0; n],
                    outstanding: vec![0; n],
                    received: vec![0; n],
                    answered: vec![0; n],
                };
                (Some(tx), Some(ring.inbox(&seg)?))
            }
            None => (None, None),
        };
        let chan = layout.command_segment(rank);
        // The geometry was checked by `Layout::new` and every segment made with it, so these
        // checks do not fail; made once, they spare every message its offset checks.
        let inbox = layout.command_segments().reader(&seg)?;
        let lines = layout.departed_words();
        let takes_at = lines.base;
        let takes = seg.word_run(takes_at, n * lines.stride / 8)?;
        let outs = peers
            .iter()
            .map(|peer| chan.writer(peer))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Sci {
            seg,
            inbox,
            tx: TxState {
                rank,
                ringer: Ringer::of(&layout, rank),
                wakers: Arc::new(Wakers::new(&job, n as u32)),
                takes,
                layout,
                config,
                chan,
                peers,
                dests: outs
                    .into_iter()
                    .enumerate()
                    .map(|(d, out)| Dest {
                        out,
                        mls: MessageLocationStatus::default(),
                        next_req: 0,
                        send_seq: 1,
                        rung: u64::MAX,
                        taken_ix: (layout.taken(d) - takes_at) / 8,
                        dma_pending: 0,
                        lost: false,
                        awaiting_reply: 0,
                        answer_next: 0,
                        last_lone: false,
                    })
                    .collect(),
                recv: (0..n)
                    .map(|c| Expect::new(c * 2 * config.slots, config.slots))
                    .collect(),
                fence: AsymmetricFence::across_processes(),
                deferring: false,
                deferred: Vec::with_capacity(4),
                staging: Vec::with_capacity(config.slot_size),
                dma: Dma {
                    engine: None,
                    queue: VecDeque::with_capacity(QUEUE_DEPTH),
                    free: Vec::new(),
                },
                bank: bank_tx,
            },
            work: VecDeque::with_capacity(n * 2 * layout.slots),
            stamps: vec![0; 2 * config.slots],
            rang: Vec::new(),
            liveness: Liveness::new(pids),
            faults: VecDeque::new(),
            takes: 0,
            hint: Hint {
                sender: 0,
                reply: false,
            },
            stale_polls: 0,
            am_base: layout.segment_base(),
            bank_room_at: layout.bank_room(),
            room_next: 0,
            wake: Wake::new("sci", &job, rank as Rank),
            bank,
        })
    }

    pub(super) fn layout_for(
        ranks: u32,
        segment_size: usize,
        config: &SciConfig,
    ) -> Result<Layout, SciError> {
        let (r, size) = (ranks as usize, config.slot_size);
        let layout = if config.bank > 0 {
            Layout::with_bank(r, config.bank, size, segment_size)
        } else {
            Layout::new(r, config.slots, size, segment_size)
        };
        layout.ok_or_else(|| {
            SciError::Config(format!(
                "{ranks} ranks with a segment of {segment_size} bytes overflow a segment's size"
            ))
        })
    }

    /// The transports of an in-process job of `ranks` ranks (one per thread), over heap
    /// memory that the threads share exactly as processes share a mapping (the same atomics,
    /// the same views), so Miri and loom check this code too.
    pub fn cluster(
        ranks: u32,
        segment_size: usize,
        config: SciConfig,
    ) -> Result<Vec<Sci>, SciError> {
        config.validate()?;
        if ranks == 0 {
            return Err(SciError::Config("a job has at least one rank".into()));
        }
        let layout = Self::layout_for(ranks, segment_size, &config)?;
        let segs = (0..ranks)
            .map(|_| Segment::heap(layout.words_len(), layout.bytes_len()))
            .collect::<Result<Vec<_>, _>>()?;
        let shared: Vec<Segment> = segs.iter().map(Segment::share).collect();
        let job = am_nic::wake::in_process_job("sci");
        segs.into_iter()
            .enumerate()
            .map(|(r, seg)| {
                Sci::new(
                    job.clone(),
                    r,
                    layout,
                    config,
                    seg,
                    &shared,
                    vec![None; ranks as usize],
                )
            })
            .collect()
    }

    /// Starts this rank's NIC in a multi-process job: exports its segment (anonymous: no file
    /// is ever left behind), exchanges pids, geometry and segment handles through the
    /// launcher's key-value store, and imports every peer's segment (`am_nic::connect`).
    pub fn connect(
        job: &mut am_bootstrap::JobInfo,
        segment_size: usize,
        config: SciConfig,
    ) -> Result<Sci, SciError> {
        config.validate()?;
        let layout = Self::layout_for(job.size, segment_size, &config)?;
        let geometry = format!(
            "{},{},{},{}",
            config.slots, config.slot_size, segment_size, config.bank
        );
        let joined = am_nic::connect(
            job,
            "sci",
            layout.words_len(),
            layout.bytes_len(),
            segment_size,
            &geometry,
            |_| Ok(()),
        )?;
        // An imported segment is written, never read (SCI's remote writes, local reads);
        // a bank's claims and head are the exception (lock transactions).
        Sci::new(
            job.job_id.clone(),
            job.rank as usize,
            layout,
            config,
            joined.own,
            &joined.peers,
            joined.pids,
        )
    }

    /// `dest`'s AM segment, as this rank's mapping of it reaches it (remote atomics).
    pub(super) fn peer_segment(&self, dest: Rank) -> Result<SharedBytes<'_>, SendError> {
        let d = dest as usize;
        let (Some(to), Some(peer)) = (self.tx.dests.get(d), self.tx.peers.get(d)) else {
            return Err(SendError::InvalidRank(dest));
        };
        if to.lost {
            return Err(SendError::PeerLost(dest));
        }
        let l = &self.tx.layout;
        // A rank that left wrote its departed word here: nothing it owns is to be touched.
        if d != self.tx.rank && self.seg.load_word(l.departed(d)).unwrap_or(0) != 0 {
            return Err(SendError::PeerDeparted(dest));
        }
        peer.byte_area()
            .slice(l.segment_base(), l.segment)
            .map_err(sci_err)
    }

    /// The AM segment: a view of this rank's exported memory after the command segments
    /// (in range by construction: the segment was made with this layout).
    pub(super) fn am_segment(&self) -> SharedBytes<'_> {
        self.seg
            .byte_area()
            .slice_or_empty(self.am_base, self.tx.layout.segment)
    }

    /// The configuration in use.
    pub fn config(&self) -> &SciConfig {
        &self.tx.config
    }

    /// The segment geometry in use.
    pub fn layout(&self) -> &Layout {
        &self.tx.layout
    }
}
