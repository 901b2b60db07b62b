//! Receiving: the mailbox in ticket order, the notification queue of RMA Mediums, and the
//! recovery from what a hostile or dead peer left in either.

use super::*;

impl Extoll {
    /// Repairs the slot of `ticket` in `ring` (a claim nobody will publish, or a corrupt
    /// status) and says what it is now: the owner consumes it only once it is skipped, so
    /// its head never passes a ticket nobody published or skipped.
    pub(super) fn take_over(&self, ring: &Ring, ticket: u64) -> Result<Taken, TransportError> {
        ring.repair(&self.seg, ticket).map_err(io)?;
        Ok(match ring.look(&self.seg, ticket) {
            Ok(Seen::Skipped(_)) => Taken::Skipped,
            Ok(Seen::Published(_)) => Taken::Published,
            _ => Taken::Neither,
        })
    }

    /// Whether notification claimer `who` is a rank we lost.
    pub(super) fn notes_claimer_lost(&self, who: u32) -> bool {
        let (r, _) = notes_claimer_of(who);
        self.tx.dests.get(r).is_some_and(|d| d.lost)
    }

    /// Moves every notification to the counters it feeds. A corrupt one is consumed, and
    /// reported.
    pub(super) fn drain_notes(&mut self) -> Result<(), TransportError> {
        let ring = self.tx.layout.notifications();
        let mut result = Ok(());
        loop {
            // Published: one load and a compare, the usual case; the value is one word.
            if let Some(meta) = self.notes.head_published() {
                let value = u64::from_le(self.notes.head_first_word());
                self.consume_note();
                if let Err(e) = self.take_note(meta, value) {
                    result = Err(e);
                    break;
                }
                continue;
            }
            if self.notes.head_is_empty() {
                break;
            }
            let t = self.note_head;
            match self.notes.look(t) {
                Ok(Seen::Published(meta)) => {
                    let mut v = [0u8; 8];
                    let read = self.notes.read_payload(t, &mut v);
                    self.consume_note();
                    let taken = read
                        .map_err(io)
                        .and_then(|()| self.take_note(meta, u64::from_le_bytes(v)));
                    if let Err(e) = taken {
                        result = Err(e);
                        break;
                    }
                }
                Ok(Seen::Skipped(_)) => self.consume_note(),
                Ok(Seen::Claimed(who)) if self.notes_claimer_lost(who) => {
                    // A dead rank's claim: nobody will publish it.
                    match self.take_over(&ring, t)? {
                        Taken::Skipped => self.consume_note(),
                        Taken::Published => {}
                        Taken::Neither => break,
                    }
                }
                Ok(Seen::Claimed(_) | Seen::Empty) => break,
                Err(e) => {
                    // A status no claimer writes: skipped, so the next lap finds it free.
                    if self.take_over(&ring, t)? == Taken::Skipped {
                        self.consume_note();
                    }
                    result = Err(misbehaved(None, format!("notification ticket {t}: {e}")));
                    break;
                }
            }
        }
        if self.note_told != self.note_head {
            self.note_told = self.note_head;
            self.notes.consumed(self.note_head);
        }
        result
    }

    /// One notification (already consumed): `meta` and `value` as read, checked here.
    pub(super) fn take_note(&mut self, meta: u32, value: u64) -> Result<(), TransportError> {
        let l = self.tx.layout;
        let src = (meta & 0xffff) as usize;
        let k = meta >> 16;
        if src >= l.ranks {
            return Err(misbehaved(None, format!("a notification from rank {src}")));
        }
        match k {
            kind::LONG_LANDED if value <= self.tx.config.max_long as u64 => {
                self.long_landed[src] += 1
            }
            kind::MEDIUM_LANDED if self.medium_landed(src, value) => {}
            kind::PUT_LANDED if value <= l.segment as u64 => self.put_landed[src] += 1,
            kind::LONG_LANDED | kind::MEDIUM_LANDED | kind::PUT_LANDED => {
                return Err(misbehaved(
                    Some(src),
                    format!(
                        "notification {k} with value {value} (RMA Mediums landed {}, delivered {})",
                        self.rma_landed[src], self.rma_delivered[src]
                    ),
                ))
            }
            k if src != self.tx.rank => {
                return Err(misbehaved(
                    Some(src),
                    format!("requester notification {k} from rank {src}"),
                ))
            }
            kind::USER_DONE | kind::USER_LOST | kind::USER_UNNOTIFIED => {
                if !self.user_pending.remove(&value) {
                    // Written in our name: by whom, the word cannot say.
                    return Err(misbehaved(
                        None,
                        format!("completion of RMA operation {value}, which is not in flight"),
                    ));
                }
                self.tx.jobs_done += 1;
                if k == kind::USER_DONE {
                    self.user_done.insert(value);
                } else {
                    self.user_failed.insert(value, k);
                }
            }
            k => {
                return Err(misbehaved(
                    Some(src),
                    format!("unknown notification {k:#x} (value {value})"),
                ))
            }
        }
        Ok(())
    }

    /// An RMA Medium's completer notification from `src` with `value`: counted (true) if it
    /// is the next one `src` may have in flight, and with a pool, if it names a buffer of
    /// the pool that `src` holds for it.
    #[inline(always)]
    pub(super) fn medium_landed(&mut self, src: usize, value: u64) -> bool {
        let l = &self.tx.layout;
        let landed = self.rma_landed[src];
        let room = landed - self.rma_delivered[src] < l.rma_flight() as u64;
        if l.rma_pool == 0 {
            if value != landed || !room {
                return false;
            }
        } else {
            let k = value & ((1 << POOL_INDEX_SHIFT) - 1);
            let i = (value >> POOL_INDEX_SHIFT) as usize;
            if k != landed || !room || i >= l.rma_pool {
                return false;
            }
            if self.seg.load_word(l.pool_claim(i)).ok() != Some(pool_claim(src, k)) {
                return false;
            }
            self.pool_bufs[src].push_back(i as u32);
        }
        self.rma_landed[src] += 1;
        self.rma_pending += 1;
        true
    }
}

impl Extoll {
    /// Tells senders how far the mailbox was consumed: in batches of a quarter mailbox while
    /// busy, and whenever idle (so a sender waiting for room always gets it).
    #[inline(always)]
    pub(super) fn tell_head(&mut self, idle: bool) {
        let due = self.head - self.head_told;
        if due > 0 && (idle || due >= self.head_batch) {
            self.head_told = self.head;
            self.inbox.consumed(self.head);
            self.freed += due;
            self.ring_room_waiters_if_asked();
        }
    }

    /// After telling senders our head: if a sender asked to be rung when there is room (the
    /// room word, a line senders write only when the mailbox is full), rings waiters.
    /// A relaxed look; a request it misses is seen at the next one (the next head told, or
    /// the idle look before a sleep).
    #[inline(always)]
    pub(super) fn ring_room_waiters_if_asked(&mut self) {
        if self.seg.load_word(self.room_at).unwrap_or(0) != 0 {
            self.ring_room_waiters();
        }
    }

    /// Rings as many waiters for room as slots were told free since the last ring (their
    /// doorbells, or their wake sockets if armed; [`am_nic::room::ring_waiters`]): a sender
    /// asleep on our full mailbox wakes and sends again. The words are a peer's to write: a bit naming no other rank of the job is
    /// dropped, and a forged one costs its rank a spurious wake-up.
    #[cold]
    #[inline(never)]
    fn ring_room_waiters(&mut self) {
        let l = self.tx.layout;
        let tx = &self.tx;
        // As many waiters as slots were freed since the last ring (at least one: a look
        // before a sleep rings whoever waits).
        let at_most = self.freed.max(1) as usize;
        self.freed = 0;
        am_nic::room::ring_waiters(
            &self.seg,
            self.room_at,
            |w| l.room_waiter(w),
            l.ranks,
            tx.rank,
            at_most,
            &mut self.room_next,
            |c| {
                if let Some(peer) = tx.peers.get(c) {
                    if matches!(ring_doorbell(&peer.seg), Ok(Rung::Armed)) {
                        tx.wake(c);
                    }
                }
            },
        );
    }

    /// Consumes the mailbox ticket at the head (published, or skipped).
    #[inline(always)]
    pub(super) fn consume(&mut self) {
        self.head += 1;
        self.inbox.advance();
        debug_assert_eq!(self.head, self.inbox.head());
        self.tell_head(false)
    }

    /// Consumes the notification ticket at the head.
    #[inline(always)]
    pub(super) fn consume_note(&mut self) {
        self.note_head += 1;
        self.notes.advance();
        debug_assert_eq!(self.note_head, self.notes.head());
    }

    /// Drops the message the packet at the mailbox head belongs to, and consumes the packet.
    /// A message from a source of the job counts as delivered for that source's order: what
    /// it sends next does not wait for it.
    pub(super) fn refuse(&mut self, m: &Meta) {
        let s = m.src as usize;
        if s < self.tx.layout.ranks {
            self.reasm.refuse(m);
            if m.flags & FIRST != 0 {
                self.velo_delivered[s] += 1;
            }
        }
        self.consume()
    }

    /// Whether the first packet `m` of a message from `s` may be delivered now.
    #[inline]
    pub(super) fn order(&self, s: usize, m: &Meta) -> Order {
        // Those RMA Mediums sent before it that are not delivered yet: at most as many as
        // `s` may have in flight (the buffers), whatever the delays.
        let ahead = (m.rma_before as u64).wrapping_sub(self.rma_delivered[s]) % RMA_BEFORE_MOD;
        if ahead > self.tx.layout.rma_flight() as u64 {
            return Order::RmaAhead(ahead);
        }
        let long = m.flags & RMA_WAIT != 0;
        if long && m.flags & PLACED == 0 {
            return Order::WaitUnplaced;
        }
        if ahead != 0 {
            return Order::WaitRma;
        }
        if long && self.long_landed[s] <= self.long_used[s] {
            return Order::WaitLong;
        }
        Order::Ready
    }
}

impl Extoll {
    /// Ends the waits at the notification queue's head that cannot end: a claim by a lost
    /// rank, or by one whose record does not vouch for it, and holes. True if the queue is
    /// then empty (every notification published so far has been taken).
    pub(super) fn unblock_notes(&mut self) -> bool {
        let l = self.tx.layout;
        let ring = l.notifications();
        for _ in 0..=l.notify_slots {
            if let Err(e) = self.drain_notes() {
                self.tx.fault(e);
                continue;
            }
            let t = self.note_head;
            match ring.look(&self.seg, t) {
                Ok(Seen::Claimed(who)) => {
                    let (r, q) = notes_claimer_of(who);
                    let known = r < l.ranks;
                    if known
                        && !self.tx.dests[r].lost
                        && ring.claim_is_genuine(&self.seg, t, l.claims(r, q))
                    {
                        // A live claimer at work.
                        return false;
                    }
                    if self.take_over(&ring, t).ok() != Some(Taken::Skipped) {
                        return false;
                    }
                    if !(known && self.tx.dests[r].lost) {
                        self.tx.fault(misbehaved(
                            None,
                            format!(
                                "notification ticket {t} claimed in the name of claimer {who}, \
                                 who does not vouch for it"
                            ),
                        ));
                    }
                }
                Ok(Seen::Empty) => match ring.fill_holes(&self.seg, t) {
                    Ok(n) if n > 0 => self.tx.fault(misbehaved(
                        None,
                        format!("{n} holes from notification ticket {t} (a corrupt tail or head)"),
                    )),
                    _ => return true,
                },
                // Published, skipped or corrupt: the next drain takes it.
                _ => {}
            }
        }
        false
    }

    /// Ends the waits at the mailbox's head that cannot end: a claim by a lost rank, or by
    /// one whose record does not vouch for it; a hole; a message waiting for an RMA Medium
    /// or a Long payload that was never sent; and RMA Mediums waiting for VELO messages that
    /// are not in the empty mailbox.
    pub(super) fn unblock_mailbox(&mut self) {
        let l = self.tx.layout;
        let ring = l.mailbox();
        for _ in 0..=l.mailbox_slots {
            let t = self.head;
            match ring.look(&self.seg, t) {
                Ok(Seen::Claimed(who)) => {
                    let r = who as usize;
                    let known = r < l.ranks;
                    if known
                        && !self.tx.dests[r].lost
                        && ring.claim_is_genuine(&self.seg, t, l.claims(r, CLAIM_MAILBOX))
                    {
                        return;
                    }
                    let lost = known && self.tx.dests[r].lost;
                    if lost {
                        self.reasm.abandon(who);
                    }
                    match self.take_over(&ring, t) {
                        Ok(Taken::Skipped) => {
                            if !lost {
                                self.tx.fault(misbehaved(
                                    None,
                                    format!(
                                        "VELO mailbox ticket {t} claimed in the name of rank \
                                         {who}, who does not vouch for it"
                                    ),
                                ));
                            }
                            self.consume()
                        }
                        Ok(Taken::Published) => {}
                        _ => return,
                    }
                }
                Ok(Seen::Empty) => match ring.fill_holes(&self.seg, t) {
                    Ok(n) if n > 0 => {
                        let what = format!(
                            "{n} holes from VELO mailbox ticket {t} (a corrupt tail or head)"
                        );
                        self.tx.fault(misbehaved(None, what));
                    }
                    // No claim above the head: the mailbox is empty, unless a claimer
                    // took the head meanwhile (a message may then sit above it).
                    _ => {
                        if matches!(ring.look(&self.seg, t), Ok(Seen::Empty)) {
                            self.drop_stranded_rma();
                        }
                        return;
                    }
                },
                Ok(Seen::Skipped(_)) => self.consume(),
                Ok(Seen::Published(meta)) => {
                    let m = Meta::decode(meta);
                    let s = m.src as usize;
                    if self.reasm.check(&m).is_err()
                        || m.flags & FIRST == 0
                        || self.reasm.in_progress(m.src)
                    {
                        // The poll path takes it.
                        return;
                    }
                    if !matches!(self.order(s, &m), Order::WaitRma | Order::WaitLong) {
                        // The poll path takes it.
                        return;
                    }
                    // The completer notification it waits for was published before this
                    // packet, which we have seen: drained now (not before the look at the
                    // packet), a queue with nothing left in it has counted it, or it was
                    // never sent.
                    let clear = self.unblock_notes();
                    let never = match self.order(s, &m) {
                        // The Medium it waits for waits for VELO messages itself (a Medium
                        // sent before it waits for none sent after it), or was never notified.
                        Order::WaitRma => {
                            matches!(self.rma_state(s), Ok(RmaState::WaitsVelo))
                                || (clear && self.rma_landed[s] == self.rma_delivered[s])
                        }
                        Order::WaitLong => clear,
                        _ => return,
                    };
                    if !never {
                        return;
                    }
                    self.tx.fault(misbehaved(
                        Some(s),
                        format!(
                            "VELO message at ticket {t} waits for an RMA landing that was never \
                             notified (RMA Mediums before it: {} mod 32; delivered {}, landed {})",
                            m.rma_before, self.rma_delivered[s], self.rma_landed[s]
                        ),
                    ));
                    self.refuse(&m)
                }
                // A corrupt status: the poll path repairs it.
                Err(_) => return,
            }
        }
    }

    /// With the mailbox empty: an RMA Medium that waits for VELO messages sent before it
    /// waits for nothing (they were published before its notification, so they would be
    /// there). Dropped, reported.
    pub(super) fn drop_stranded_rma(&mut self) {
        if self.rma_pending == 0 {
            return;
        }
        for s in 0..self.tx.layout.ranks {
            if let Ok(RmaState::WaitsVelo) = self.rma_state(s) {
                let k = self.rma_delivered[s];
                self.drop_rma(s);
                self.tx.fault(misbehaved(
                    Some(s),
                    format!(
                        "RMA Medium {k} waits for VELO messages that were never sent ({} \
                         delivered)",
                        self.velo_delivered[s]
                    ),
                ));
            }
        }
    }

    /// Whether a poll could make progress now (used before sleeping).
    /// Before a sleep: tells the head, takes the doorbell (senders ring again from then on),
    /// looks once more and checks liveness; whether there is still nothing to do.
    pub(super) fn nothing_to_do(&mut self) -> Result<bool, TransportError> {
        if self.has_work()? {
            return Ok(false);
        }
        // Telling the head looks at the room word; with nothing to tell, look here.
        if self.head == self.head_told {
            self.ring_room_waiters_if_asked();
        }
        self.tell_head(true);
        let bell = self.seg.doorbell(DOORBELL).map_err(io)?;
        if bell.take_tags() != 0 || self.has_work()? {
            // Rung since the last take: a message, or room in a mailbox this rank waits on
            // (which only a send finds out). Not a time to sleep.
            return Ok(false);
        }
        self.tick(Instant::now());
        if let Some(e) = self.tx.faults.pop_front() {
            return Err(e);
        }
        Ok(!self.has_work()?)
    }

    pub(super) fn has_work(&self) -> Result<bool, TransportError> {
        if !self.tx.faults.is_empty() {
            return Ok(true);
        }
        let l = &self.tx.layout;
        match l.notifications().look(&self.seg, self.note_head) {
            Ok(Seen::Empty) => {}
            Ok(Seen::Claimed(who)) if !self.notes_claimer_lost(who) => {}
            _ => return Ok(true),
        }
        match l.mailbox().look(&self.seg, self.head) {
            Ok(Seen::Empty) => {}
            Ok(Seen::Claimed(who)) => {
                if self.tx.dests.get(who as usize).is_some_and(|d| d.lost) {
                    return Ok(true);
                }
            }
            Ok(Seen::Published(meta)) => {
                let m = Meta::decode(meta);
                if self.reasm.check(&m).is_err()
                    || m.flags & FIRST == 0
                    || self.reasm.in_progress(m.src)
                {
                    return Ok(true);
                }
                match self.order(m.src as usize, &m) {
                    Order::WaitRma => {
                        if !matches!(
                            self.rma_state(m.src as usize)?,
                            RmaState::None | RmaState::WaitsVelo
                        ) {
                            return Ok(true);
                        }
                    }
                    Order::WaitLong => {}
                    _ => return Ok(true),
                }
            }
            _ => return Ok(true),
        }
        if self.rma_pending > 0 {
            for s in 0..l.ranks {
                if !matches!(self.rma_state(s)?, RmaState::None | RmaState::WaitsVelo) {
                    return Ok(true);
                }
            }
        }
        Ok(false)
    }

    /// A message from the mailbox, if one is complete and may be delivered in order.
    pub(super) fn poll_mailbox<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        loop {
            // Published: one load and a compare, the usual case.
            let meta = match self.inbox.head_published() {
                Some(meta) => meta,
                None => match self.head_unpublished()? {
                    Unpublished::Published(meta) => meta,
                    Unpublished::Again => continue,
                    Unpublished::Wait => return Ok(None),
                },
            };
            let m = Meta::decode(meta);
            if let Err(e) = self.reasm.check(&m) {
                return Err(self.refuse_frame(&m, e));
            }
            let s = m.src as usize;
            if m.flags & FIRST != 0 {
                if self.reasm.in_progress(m.src) {
                    return Err(self.interleaved(&m));
                }
                match self.order(s, &m) {
                    Order::Ready => {}
                    Order::WaitRma => {
                        return match self.rma_next(s)? {
                            Some(tail) => self.deliver_rma(s, tail, f).map(Some),
                            None => {
                                self.rma_stall = true;
                                Ok(None)
                            }
                        };
                    }
                    Order::WaitLong => {
                        self.rma_stall = true;
                        return Ok(None);
                    }
                    refused => return Err(self.refuse_order(&m, refused)),
                }
                if m.flags & LAST != 0 {
                    // One packet: lent straight from the mailbox slot (its length checked
                    // against the packet's above, and again by the ring).
                    let bytes = match self.inbox.head_payload(m.len) {
                        Ok(b) => b,
                        Err(e) => return Err(self.refuse_payload(&m, e)),
                    };
                    let r = f(
                        Delivery {
                            src: s as Rank,
                            bytes: Received::Shared(bytes),
                            payload_placed: m.flags & PLACED != 0,
                            route: Route::NONE,
                        },
                        am_segment(&self.seg, &self.tx.layout),
                        &mut self.tx,
                    );
                    self.consume();
                    self.velo_delivered[s] += 1;
                    if m.flags & RMA_WAIT != 0 {
                        self.long_used[s] += 1;
                    }
                    return Ok(Some(r));
                }
            }
            // Part of a message of several packets: copied into the source's reassembly
            // buffer (out of line: the one-packet path above is every Short's, and keeps the
            // registers; so do the rare cases, in the functions below).
            let Some((flags, buf)) = self.take_part(&m)? else {
                continue;
            };
            self.velo_delivered[s] += 1;
            if flags & RMA_WAIT != 0 {
                self.long_used[s] += 1;
            }
            let r = f(
                Delivery {
                    src: s as Rank,
                    bytes: Received::Private(&buf),
                    payload_placed: flags & PLACED != 0,
                    route: Route::NONE,
                },
                am_segment(&self.seg, &self.tx.layout),
                &mut self.tx,
            );
            self.reasm.recycle(buf);
            return Ok(Some(r));
        }
    }
}

impl Extoll {
    /// The next error kept for a poll.
    #[cold]
    #[inline(never)]
    pub(super) fn next_fault(&mut self) -> Option<TransportError> {
        self.tx.faults.pop_front()
    }

    /// The notification queue's head is not empty: drained, unless a live claimer is still
    /// writing it.
    #[inline(never)]
    pub(super) fn notes_waiting(&mut self) -> Result<(), TransportError> {
        // Published (the usual case): no second look before the drain's.
        if self.notes.head_published().is_none() {
            if let Ok(Seen::Claimed(who)) = self.notes.look(self.note_head) {
                if !self.notes_claimer_lost(who) {
                    return Ok(());
                }
            }
        }
        self.drain_notes()
    }

    /// A poll that found nothing: the head told, and the CPU given away when that helps.
    #[inline(never)]
    pub(super) fn idle(&mut self) {
        self.tell_head(true);
        if self.rma_stall || self.tx.jobs > self.tx.jobs_done {
            // Waiting on an RMA engine (ours, or the sender's): give it the core. On a
            // machine with no spare core, a spinning rank would otherwise keep the engine
            // thread off the CPU for a whole scheduler slice.
            std::thread::yield_now();
        } else if self.polls.is_multiple_of(IDLE_POLLS_PER_TICK) {
            // Even a spinning rank gives the CPU away now and then (tens of µs without a
            // message): on an oversubscribed machine the peer it waits for may need it.
            std::thread::yield_now();
        }
    }
}

/// What [`Extoll::head_unpublished`] found at the mailbox head.
pub(super) enum Unpublished {
    /// Published after all (between the two looks).
    Published(u32),
    /// A slot consumed (skipped, or a dead claimer's): look at the next.
    Again,
    /// Nothing to take now.
    Wait,
}

impl Extoll {
    /// The mailbox head is not (yet) a published packet: a skipped slot is consumed, a dead
    /// sender's claim taken over, a status no claimer writes repaired and reported.
    #[inline(never)]
    pub(super) fn head_unpublished(&mut self) -> Result<Unpublished, TransportError> {
        let t = self.head;
        Ok(match self.inbox.look(t) {
            Ok(Seen::Published(meta)) => Unpublished::Published(meta),
            Ok(Seen::Skipped(_)) => {
                self.consume();
                Unpublished::Again
            }
            Ok(Seen::Claimed(who)) => {
                if !self.tx.dests.get(who as usize).is_some_and(|d| d.lost) {
                    return Ok(Unpublished::Wait);
                }
                // A dead sender's claim: nobody will publish it, and its message in progress
                // will never end.
                self.reasm.abandon(who);
                match self.take_over(&self.tx.layout.mailbox(), t)? {
                    Taken::Skipped => self.consume(),
                    Taken::Published => {}
                    Taken::Neither => return Ok(Unpublished::Wait),
                }
                Unpublished::Again
            }
            Ok(Seen::Empty) => Unpublished::Wait,
            Err(e) => {
                // A status no claimer writes: skipped, so the next lap's claimer finds the
                // slot free.
                if self.take_over(&self.tx.layout.mailbox(), t)? == Taken::Skipped {
                    self.consume();
                }
                return Err(misbehaved(None, format!("VELO mailbox ticket {t}: {e}")));
            }
        })
    }

    /// A packet whose meta breaks the framing (a source outside the job, or more data bytes
    /// than a packet holds: lending them would lend the neighbouring slots): refused.
    #[cold]
    #[inline(never)]
    pub(super) fn refuse_frame(&mut self, m: &Meta, e: FrameError) -> TransportError {
        let peer = ((m.src as usize) < self.tx.layout.ranks).then_some(m.src as usize);
        self.refuse(m);
        misbehaved(peer, e)
    }

    /// A first packet while its source's previous message is unfinished: that one is
    /// dropped; this packet starts the next one, on the next poll.
    #[cold]
    #[inline(never)]
    pub(super) fn interleaved(&mut self, m: &Meta) -> TransportError {
        let s = m.src as usize;
        self.reasm.abandon(m.src);
        self.velo_delivered[s] += 1;
        misbehaved(Some(s), FrameError::Interleaved(m.src))
    }

    /// A first packet whose order can never be met (`refused`): refused.
    #[cold]
    #[inline(never)]
    pub(super) fn refuse_order(&mut self, m: &Meta, refused: Order) -> TransportError {
        let t = self.head;
        self.refuse(m);
        let why = match refused {
            Order::RmaAhead(n) => format!(
                "says {n} RMA Mediums sent before it are undelivered, more than the {} it may \
                 have in flight",
                self.tx.layout.rma_flight()
            ),
            _ => "waits for an RMA put, but is no placed Long".to_owned(),
        };
        misbehaved(
            Some(m.src as usize),
            format!("VELO message at ticket {t} {why}"),
        )
    }

    /// A packet whose length the slot does not hold (the meta check refuses it first).
    #[cold]
    #[inline(never)]
    pub(super) fn refuse_payload(&mut self, m: &Meta, e: ShmError) -> TransportError {
        self.refuse(m);
        misbehaved(Some(m.src as usize), e)
    }
}

impl Extoll {
    /// Takes the packet `m` at the mailbox head, part of a message of several packets, into
    /// its source's reassembly buffer and consumes it: the message when it is complete.
    #[inline(never)]
    pub(super) fn take_part(&mut self, m: &Meta) -> Result<Option<(u32, Vec<u8>)>, TransportError> {
        let s = m.src as usize;
        let pushed = match self.inbox.head_payload(m.len) {
            Ok(_) => {
                let inbox = &self.inbox;
                self.reasm.push_append(m, m.len, |buf| {
                    // The same length as the view just made: cannot fail.
                    let _ = inbox.head_append(m.len, buf);
                })
            }
            Err(e) => {
                self.refuse(m);
                return Err(misbehaved(Some(s), e));
            }
        };
        self.consume();
        match pushed {
            Ok(done) => Ok(done),
            Err(e) => {
                if matches!(e, FrameError::TooLong { .. }) {
                    // A message that was started: it counts for the order.
                    self.velo_delivered[s] += 1;
                }
                Err(misbehaved(Some(s), e))
            }
        }
    }
}
