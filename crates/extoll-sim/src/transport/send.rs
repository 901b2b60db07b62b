//! Sending: VELO packets into the receiver's mailbox (claimed, written, published), and the
//! choice of path per message.

use super::*;

impl TxState {
    /// Wakes `d`, whose doorbell said it sleeps armed on its wake socket (off the send path).
    #[cold]
    #[inline(never)]
    pub(super) fn wake(&self, d: usize) {
        if let Some(peer) = self.peers.get(d) {
            peer.wakers.wake(peer.rank);
        }
    }

    #[inline(always)]
    pub(super) fn cap(&self) -> usize {
        self.cap
    }

    /// Keeps an error for the next poll (bounded: a peer that keeps misbehaving costs no
    /// memory).
    pub(super) fn fault(&mut self, e: TransportError) {
        if self.faults.len() < MAX_FAULTS {
            self.faults.push_back(e);
        }
    }

    pub(super) fn engine(&mut self) -> Result<&RmaEngine, SendError> {
        if self.engine.is_none() {
            let e = RmaEngine::start(
                self.rank,
                self.layout,
                self.peers.clone(),
                self.pids.clone(),
                self.engine_patience,
            )
            .map_err(|e| SendError::device_from("extoll: starting the RMA engine", e))?;
            self.engine = Some(e);
        }
        self.engine
            .as_ref()
            .ok_or_else(|| SendError::device("extoll: no RMA engine"))
    }

    pub(super) fn submit(&mut self, job: Job) -> Result<(), SendError> {
        if !self.engine()?.submit(job) {
            return Err(SendError::device("extoll: the RMA engine stopped"));
        }
        self.jobs += 1;
        Ok(())
    }

    /// Claims `out.len()` mailbox slots at `d`, all or none, or reports back-pressure. The
    /// claims name us, and our record in `d`'s segment vouches for them until
    /// [`finish_claim`](Self::finish_claim) releases it.
    #[inline(always)]
    pub(super) fn claim(&mut self, d: usize, out: &mut [u64]) -> Result<(), SendError> {
        match self.dests[d]
            .port
            .try_claim(out.len(), &mut self.mailbox_head[d], out)
        {
            Ok(true) => Ok(()),
            Ok(false) => self.want_room(d),
            Err(e) => Err(self.corrupt_mailbox(d, e)),
        }
    }

    /// `d`'s mailbox is full: asks `d` to ring us when it has room (our bit in its room
    /// waiter words, then its room word), and returns `Busy`. The core tries the send again
    /// after it: these read-modify-writes come before that look, so either it sees the room
    /// `d` made meanwhile, or `d` sees the request when it next tells its head (a full
    /// mailbox has more for it to consume) or before it sleeps.
    #[cold]
    #[inline(never)]
    pub(super) fn want_room(&mut self, d: usize) -> Result<(), SendError> {
        let l = &self.layout;
        let Some(peer) = self.peers.get(d) else {
            return Err(SendError::InvalidRank(d as Rank));
        };
        am_nic::room::ask(&peer.imp, l.room(), |w| l.room_waiter(w), self.rank).map_err(shm)?;
        Err(SendError::Busy)
    }

    /// A claim at `d` failed on a corrupt ring: the cached head only grows, so a corrupt head
    /// word must not poison it.
    #[cold]
    pub(super) fn corrupt_mailbox(&mut self, d: usize, e: ShmError) -> SendError {
        self.mailbox_head[d] = 0;
        shm(e)
    }

    /// A message's packets at `d` are all published: counted, and `d`'s doorbell rung.
    #[inline(always)]
    pub(super) fn announce(&mut self, d: usize) -> Result<(), SendError> {
        let dst = &mut self.dests[d];
        dst.velo_sent += 1;
        if ring_doorbell(dst.port.segment())? == Rung::Armed {
            self.wake(d);
        }
        Ok(())
    }

    /// The reused ticket buffer, holding `n` zeros (give it back to `self.tickets`): an array
    /// for the largest message would be kilobytes of stack to zero on every send.
    pub(super) fn take_tickets(&mut self, n: usize) -> Vec<u64> {
        let mut t = std::mem::take(&mut self.tickets);
        t.clear();
        t.resize(n, 0);
        t
    }

    /// Ends a claim at `d` whose slots are published (`r` is `Ok`) or not (then `unpublished`
    /// are skipped, so that no claim stays open): releases the record and rings the doorbell.
    #[inline(always)]
    pub(super) fn finish_claim(
        &mut self,
        d: usize,
        unpublished: &[u64],
        r: Result<(), ShmError>,
    ) -> Result<(), SendError> {
        let port = &self.dests[d].port;
        if r.is_err() {
            for &t in unpublished {
                port.skip(t);
            }
        }
        port.release();
        r.map_err(shm)?;
        self.announce(d)
    }

    /// Writes and publishes `head ++ payload` as packets into the `claimed` tickets
    /// `ticket(0)`, `ticket(1)`, ... (one per packet, as many as the message takes), straight
    /// from where the payload is (a shared one included, with no private copy), then ends
    /// the claim ([`finish_claim`](Self::finish_claim)): on an error the rest are skipped.
    pub(super) fn emit(
        &mut self,
        d: usize,
        claimed: usize,
        ticket: impl Fn(usize) -> u64,
        head: &[u8],
        payload: Payload<'_>,
        flags: u32,
    ) -> Result<(), SendError> {
        let cap = self.cap;
        let hl = head.len();
        let total = hl + payload.len();
        let n = velo::packets(total, cap);
        let dst = &self.dests[d];
        let port = &dst.port;
        let rma_before = (dst.rma_sent % RMA_BEFORE_MOD) as u32;
        let mut published = 0;
        let mut r = if claimed == n {
            Ok(())
        } else {
            Err(ShmError::OutOfBounds {
                offset: 0,
                len: n,
                area: claimed,
            })
        };
        if r.is_ok() {
            for i in 0..n {
                // Packet i holds bytes [start, end) of head ++ payload; end > start but
                // for an empty message (n == 1, then 0 bytes).
                let (start, end) = (i * cap, ((i + 1) * cap).min(total));
                let h = &head[start.min(hl)..end.min(hl)];
                let (a, b) = (start.saturating_sub(hl), end.saturating_sub(hl));
                let mut f = if i == 0 { FIRST | flags } else { 0 };
                if i + 1 == n {
                    f |= LAST;
                }
                let meta = Meta {
                    src: self.rank as u32,
                    len: end - start.min(end),
                    flags: f,
                    rma_before,
                }
                .encode();
                let t = ticket(i);
                let w = match payload {
                    Payload::Private(p) => port.write_two(t, h, &p[a..b], meta),
                    Payload::Shared(s) => s
                        .slice(a, b - a)
                        .and_then(|s| port.write_then(t, &[h], s, meta)),
                };
                match w {
                    Ok(()) => published = i + 1,
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                }
            }
        }
        if r.is_err() {
            let rest: Vec<u64> = (published..claimed).map(ticket).collect();
            return self.finish_claim(d, &rest, r);
        }
        self.finish_claim(d, &[], r)
    }

    pub(super) fn send_velo(
        &mut self,
        d: usize,
        head: &[u8],
        payload: Payload<'_>,
        flags: u32,
    ) -> Result<(), SendError> {
        let total = head.len() + payload.len();
        if total <= self.cap() {
            return self.send_packet(d, head, payload, flags);
        }
        self.send_packets(d, head, payload, flags)
    }

    /// The several-packet case of [`send_velo`](Self::send_velo): claims all, then writes
    /// and publishes each.
    #[inline(never)]
    pub(super) fn send_packets(
        &mut self,
        d: usize,
        head: &[u8],
        payload: Payload<'_>,
        flags: u32,
    ) -> Result<(), SendError> {
        let total = head.len() + payload.len();
        let n = velo::packets(total, self.cap());
        if n > MAX_PACKETS {
            return Err(SendError::TooLarge(total));
        }
        // The usual claim: a run of consecutive slots at the tail, no ticket list.
        if let Some(t0) = self.dests[d].port.claim_run(n, self.mailbox_head[d]) {
            return self.emit(d, n, |i| t0 + i as u64, head, payload, flags);
        }
        let mut t = self.take_tickets(n);
        let r = self
            .claim(d, &mut t)
            .and_then(|()| self.emit(d, n, |i| t[i], head, payload, flags));
        self.tickets = t;
        r
    }

    /// The one-packet case of [`send_velo`](Self::send_velo) (every Short, small Mediums):
    /// claim, write, publish, all in the slot's one cache line, then release the claim.
    #[inline]
    pub(super) fn send_packet(
        &mut self,
        d: usize,
        head: &[u8],
        payload: Payload<'_>,
        flags: u32,
    ) -> Result<(), SendError> {
        let dst = &mut self.dests[d];
        let meta = Meta {
            src: self.rank as u32,
            len: head.len() + payload.len(),
            flags: FIRST | LAST | flags,
            rma_before: (dst.rma_sent % RMA_BEFORE_MOD) as u32,
        }
        .encode();
        let cached = &mut self.mailbox_head[d];
        // Claim, write, publish and release in one step, on the port's checked slots.
        let sent = match payload {
            Payload::Private(p) => dst.port.send(cached, head, p, meta),
            // An echo: straight from where it was received into the peer's slot.
            Payload::Shared(s) => dst.port.send_then(cached, &[head], s, meta),
        };
        match sent {
            Ok(true) => {
                dst.velo_sent += 1;
                // Streaming: take a line we will write soon. Not for a lone round trip,
                // where that transfer would share the path with the message.
                if self.last_sent_to == d {
                    dst.port.prefetch_ahead(PREFETCH_AHEAD);
                }
                self.last_sent_to = d;
                if ring_doorbell(dst.port.segment())? == Rung::Armed {
                    self.wake(d);
                }
                Ok(())
            }
            Ok(false) => self.want_room(d),
            Err(e) => Err(self.corrupt_mailbox(d, e)),
        }
    }

    /// Reserves the completer's notification slot of an immediate put to `dest`, or reports
    /// back-pressure.
    pub(super) fn reserve(&mut self, dest: usize) -> Result<Reserved, SendError> {
        let port = &self.dests[dest].notes;
        Reserved::claim(port, &mut self.note_heads[dest])
            .map_err(shm)?
            .ok_or_else(|| SendError::Busy)
    }
}

impl TxState {
    #[inline]
    pub(super) fn send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let d = dest as usize;
        match self.dests.get(d) {
            None => return Err(SendError::InvalidRank(dest)),
            Some(dst) if dst.lost => return Err(SendError::PeerLost(dest)),
            Some(_) => {}
        }
        // One packet over VELO (every Short, small Mediums): the common case first.
        let velo = msg.payload.is_empty() || !self.medium.get().by_rma(msg.payload.len());
        if msg.long_offset.is_none() && msg.len() <= self.cap && velo {
            return self.send_packet(d, msg.head, msg.payload, 0);
        }
        self.send_other(d, msg)
    }

    /// Everything but a one-packet VELO message: a Long, a Medium by RMA buffer or in
    /// several packets, or one too large.
    #[inline(never)]
    pub(super) fn send_other(&mut self, d: usize, msg: &Outgoing<'_>) -> Result<(), SendError> {
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
