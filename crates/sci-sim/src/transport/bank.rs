//! The bank (dynamic credits' layout): every message claims a slot of the receiver's one ring
//! with a compare-and-swap that names the sender; the receiver reads it in ticket order.

use super::*;

impl TxState {
    /// Sends `msg` through `dest`'s bank: one slot claimed with a compare-and-swap on its
    /// status word (SCI's lock transaction), the header and the AM bytes stored, the status
    /// published; then `dest`'s message-exist flag rung if it is not set already. A Long's
    /// payload goes first, into `dest`'s AM segment by PIO. `Busy` while the bank is full.
    #[inline(never)]
    pub(super) fn send_bank(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let d = dest as usize;
        match self.dests.get(d) {
            None => return Err(SendError::InvalidRank(dest)),
            Some(to) if to.lost => return Err(SendError::PeerLost(dest)),
            Some(_) => {}
        }
        let (Some(b), Some(peer)) = (self.bank.as_mut(), self.peers.get(d)) else {
            return Err(SendError::PeerLost(dest));
        };
        // A reply answers the oldest unanswered requests up to the one its route counts.
        let (mut flags, answers_up_to) = match msg.reply_to {
            None => (0, None),
            Some(route) => {
                let r = route.get();
                let first = b.answered[d] + 1;
                if r < first || r > b.received[d] || r - first >= 256 {
                    return Err(SendError::NoRequestToAnswer(route));
                }
                let n = (r - first + 1) as usize;
                (BANK_REPLY | answers_flag(n), Some(r))
            }
        };
        let mut payload = msg.payload;
        if let Some(off) = msg.long_offset {
            if payload.len() > self.config.max_long {
                return Err(SendError::TooLarge(payload.len()));
            }
            if let Some(at) = long_at(&self.layout, off, payload.len()) {
                write_payload(peer, at, payload)?;
            }
            flags |= PLACED;
            payload = Payload::EMPTY;
        }
        let port = &b.ports[d];
        let len = msg.head.len() + payload.len();
        if len > port.ring().capacity() - BANK_HEADER {
            return Err(SendError::TooLarge(len));
        }
        let mut hdr = [0u8; BANK_HEADER];
        hdr[..4].copy_from_slice(&(len as u32).to_le_bytes());
        hdr[4..].copy_from_slice(&flags.to_le_bytes());
        let head = &mut b.heads[d];
        let me = self.rank as u32;
        let mut send = || match payload {
            Payload::Private(p) => port.send_parts(head, &[&hdr, msg.head, p], me),
            Payload::Shared(s) => port.send_then(head, &[&hdr, msg.head], s, me),
        };
        if !send().map_err(sci_err)? {
            // Full: ask to be rung when there is room, then look once more: either the look
            // sees the room the owner made meanwhile, or the owner's next consume sees the
            // request.
            let l = &self.layout;
            am_nic::room::ask(peer, l.bank_room(), |w| l.bank_room_waiter(w), self.rank)
                .map_err(sci_err)?;
            if !send().map_err(sci_err)? {
                return Err(SendError::Busy);
            }
        }
        match answers_up_to {
            None => b.outstanding[d] += 1,
            Some(r) => b.answered[d] = r,
        }
        // The flag stays set while the receiver polls (it takes it only before it sleeps),
        // so a stream of messages reads it and writes nothing.
        let bell = port.segment().doorbell(MEF).map_err(sci_err)?;
        if bell.ring_tagged_lazy(0) == Rung::Armed {
            self.wakers.wake(dest);
        }
        Ok(())
    }
}

impl Sci {
    /// [`Transport::poll_recv`] with a bank: the message at its head, if published. The
    /// header (length and flags, one word) is copied out and checked, the body lent as a
    /// view of the slot, which no sender claims again until the handler has returned and the
    /// head has moved past it. Out of line: the command segments' poll stays as it was.
    #[inline(never)]
    pub(super) fn poll_bank<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        if let Some(e) = self.faults.pop_front() {
            return Err(e);
        }
        let Some(inbox) = self.bank.as_ref() else {
            return Ok(None);
        };
        let Some(meta) = inbox.head_published() else {
            self.bank_idle()?;
            return Ok(None);
        };
        let word = u64::from_le(inbox.head_first_word());
        let (len, flags) = (word as u32 as usize, (word >> 32) as u32);
        let src = meta as usize;
        let ranks = self.tx.layout.ranks;
        let bad = |what: String| TransportError::PeerMisbehaved {
            peer: (src < ranks).then_some(src as Rank),
            what: format!("sci: bank ticket {}: {what}", inbox.head()),
        };
        let Some(b) = self.tx.bank.as_mut().filter(|_| src < ranks) else {
            let e = bad(format!(
                "published in the name of rank {src}, not of the job"
            ));
            self.consume_bank();
            return Err(e);
        };
        let bytes = match inbox.head_payload(BANK_HEADER.saturating_add(len)) {
            Ok(all) => all.slice_or_empty(BANK_HEADER, len),
            Err(_) => {
                let e = bad(format!("a message of {len} bytes, past its slot"));
                self.consume_bank();
                return Err(e);
            }
        };
        let route = if flags & BANK_REPLY == 0 {
            b.received[src] += 1;
            Route::new(b.received[src])
        } else {
            // A reply answers our oldest requests to `src`: as many as its flags say, all of
            // them ours and unanswered.
            let n = answers(flags) as u64;
            if n > b.outstanding[src] {
                let e = bad(format!(
                    "a reply answers {n} requests, {} outstanding",
                    b.outstanding[src]
                ));
                self.consume_bank();
                return Err(e);
            }
            b.outstanding[src] -= n;
            Route::NONE
        };
        self.liveness.progress();
        let delivery = Delivery {
            src: src as Rank,
            bytes: Received::Shared(bytes),
            payload_placed: flags & PLACED != 0,
            route,
        };
        let segment = self
            .seg
            .byte_area()
            .slice_or_empty(self.am_base, self.tx.layout.segment);
        let r = f(delivery, segment, &mut self.tx);
        self.consume_bank();
        Ok(Some(r))
    }

    /// Moves the bank's head past its ticket and tells the senders (a store to our own word,
    /// which they read only when the bank looks full to them).
    pub(super) fn consume_bank(&mut self) {
        if let Some(inbox) = self.bank.as_mut() {
            inbox.advance();
            inbox.consumed(inbox.head());
            // A relaxed look at a line senders write only when the bank is full. One that
            // misses a request made just now sees it at the next consume: a sender asks
            // only when the bank is full, so more consumes follow.
            if self.seg.load_word(self.bank_room_at).unwrap_or(0) != 0 {
                self.ring_room_waiters();
            }
        }
    }

    /// Rings the message-exist flag of one sender waiting for room in the bank (its bit in
    /// the room waiter words; [`am_nic::room::ring_waiters`]): a sender asleep in
    /// [`Transport::wait`] wakes and sends again; one armed on its wake socket is woken
    /// through it. The words are a peer's to write: a bit that names no other rank of the
    /// job is dropped, and a forged one costs its rank a spurious wake-up.
    #[cold]
    #[inline(never)]
    fn ring_room_waiters(&mut self) {
        let l = self.tx.layout;
        let tx = &self.tx;
        // One slot freed: one waiter.
        am_nic::room::ring_waiters(
            &self.seg,
            self.bank_room_at,
            |w| l.bank_room_waiter(w),
            l.ranks,
            tx.rank,
            1,
            &mut self.room_next,
            |c| {
                if let Some(peer) = tx.peers.get(c) {
                    if matches!(peer.ring(MEF), Ok(Rung::Armed)) {
                        tx.wakers.wake(c as Rank);
                    }
                }
            },
        );
    }

    /// The bank's head is not published: a slot its claimer gave up is consumed; a job
    /// abort or a stalled head is looked into now and then (the liveness tick).
    pub(super) fn bank_idle(&mut self) -> Result<(), TransportError> {
        if self.bank_head_skipped() {
            self.consume_bank();
            return Ok(());
        }
        if self.seg.load_word(ABORT).unwrap_or(0) != 0 {
            return Err(TransportError::JobAborted);
        }
        if self.liveness.idle_poll() {
            self.liveness_tick()?;
        }
        Ok(())
    }

    /// Before a sleep with a bank: takes the message-exist flag (senders ring it again from
    /// then on) and looks at the head after the take, so a message published before it is
    /// found now and one published after it rings; whether there is still nothing to do (not
    /// if the flag was rung: by a message, or by a bank's owner with room for this rank).
    pub(super) fn bank_is_empty(&mut self) -> Result<bool, TransportError> {
        // A room request a consume's relaxed look missed is seen here, before any sleep.
        if self.seg.load_word(self.bank_room_at).unwrap_or(0) != 0 {
            self.ring_room_waiters();
        }
        if self.seg.doorbell(MEF).map_err(sci_err)?.take_tags() != 0 {
            // Rung since the last take: a message, or room in a bank this rank waits on
            // (which only a send finds out). Not a time to sleep.
            return Ok(false);
        }
        if self.faults.is_empty() && self.bank_head_is_idle() {
            self.liveness_tick()?;
        }
        Ok(self.faults.is_empty() && self.bank_head_is_idle())
    }

    /// Whether the bank's head holds nothing to take now: empty, or claimed and not yet
    /// published.
    pub(super) fn bank_head_is_idle(&self) -> bool {
        self.bank
            .as_ref()
            .is_none_or(|i| i.head_published().is_none())
            && !self.bank_head_skipped()
    }

    /// Whether the bank's head is a slot its claimer (or the owner) gave up.
    pub(super) fn bank_head_skipped(&self) -> bool {
        self.bank
            .as_ref()
            .is_some_and(|i| matches!(i.look(i.head()), Ok(Seen::Skipped(_))))
    }

    /// The owner's take-over at the bank's head (from the liveness tick, as extoll's at its
    /// mailbox): a slot claimed by a rank we lost, or in the name of one whose record does
    /// not vouch for it, or with a status no lap could have written, is skipped; a run of
    /// holes below a later claim (a corrupt tail) is skipped too. A claim by a live rank that
    /// vouches for it is left: it is being written.
    pub(super) fn unblock_bank(&mut self) {
        let l = self.tx.layout;
        let Some(ring) = self.bank.as_ref().map(|i| *i.ring()) else {
            return;
        };
        // The owner marks ticket `t` skipped with a compare-and-swap, so a status that
        // changed meanwhile (a publication) is kept; whether it is skipped now.
        let skip = |seg: &Segment, t: u64| {
            let _ = ring.repair(seg, t);
            matches!(ring.look(seg, t), Ok(Seen::Skipped(_)))
        };
        for _ in 0..=l.bank {
            let Some(t) = self.bank.as_ref().map(Inbox::head) else {
                return;
            };
            match ring.look(&self.seg, t) {
                Ok(Seen::Claimed(who)) => {
                    let r = who as usize;
                    let lost = self.tx.dests.get(r).is_some_and(|d| d.lost);
                    let vouched =
                        r < l.ranks && ring.claim_is_genuine(&self.seg, t, l.bank_record(r));
                    if vouched && !lost {
                        return;
                    }
                    if !skip(&self.seg, t) {
                        // Published meanwhile: the poll path takes it.
                        return;
                    }
                    if !lost {
                        self.faults.push_back(TransportError::PeerMisbehaved {
                            peer: None,
                            what: format!(
                                "sci: bank ticket {t} claimed in the name of rank {who}, who does not vouch for it"
                            ),
                        });
                    }
                    self.consume_bank();
                }
                Ok(Seen::Empty) => match ring.fill_holes(&self.seg, t) {
                    Ok(n) if n > 0 => {
                        self.faults.push_back(TransportError::PeerMisbehaved {
                            peer: None,
                            what: format!("sci: {n} holes from bank ticket {t} (a corrupt tail)"),
                        });
                    }
                    _ => return,
                },
                Ok(Seen::Skipped(_)) => self.consume_bank(),
                Ok(Seen::Published(_)) => return,
                Err(_) => {
                    // A status no lap could have written: skipped, and reported.
                    if !skip(&self.seg, t) {
                        return;
                    }
                    self.faults.push_back(TransportError::PeerMisbehaved {
                        peer: None,
                        what: format!("sci: bank ticket {t} held a corrupt status"),
                    });
                    self.consume_bank();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
