//! Sending: puts into the target's portal (requests into its request buffers, replies into
//! the slot the request named, Longs into its segment), and what their events say.

use super::*;
use am_shm::sync::{fence, Ordering};

impl TxState {
    #[inline(always)]
    pub(super) fn nic(&self, dest: usize) -> Nic<'_> {
        let p = &self.peers[dest];
        let wake = (&self.wakers, dest as Rank);
        Nic::with_runs(&p.seg, &p.imp, &self.layout.ni, &p.runs, wake)
    }

    /// A put to `d` was refused for room (its request entry disabled if `disabled`, else
    /// its event queue full): counted, and `d` asked to ring this rank when it has room (this
    /// rank's bit in its room waiter words, then its room word; `am_nic::room`). Then one
    /// more look at a disabled entry: either it sees the entry enabled (and the next wait
    /// returns at once), or the owner's look at the room word after enabling it sees the
    /// request. A full queue is looked at again by its owner's idle ticks.
    #[cold]
    #[inline(never)]
    pub(super) fn want_room(&mut self, d: usize, disabled: bool) {
        self.stats.refused += 1;
        let geo = &self.layout.ni;
        let Some(p) = self.peers.get(d) else {
            return;
        };
        let me = self.rank as usize;
        // In range of every NI of the job's geometry: cannot fail.
        let _ = am_nic::room::ask(&p.imp, geo.room(), |w| geo.room_waiter(w), me);
        self.room_wanted = Some(d);
        if disabled {
            fence(Ordering::SeqCst);
            if self.nic(d).pt_enabled(PT_REQUEST).unwrap_or(false) {
                self.retry_now = true;
            }
        }
    }

    /// Whether the peer this rank asked for room rang it (its bit in that peer's room waiter
    /// words is clear), or a refused put found room as it asked: the wait that asks
    /// returns at once, and the core sends again. Called after the wait's announcement
    /// (the waiting word stored, a `SeqCst` fence): either this load sees the bit the owner
    /// cleared, or the owner's ring after clearing it sees the waiting word and rings.
    pub(super) fn room_rung(&mut self) -> bool {
        if std::mem::take(&mut self.retry_now) {
            self.room_wanted = None;
            return true;
        }
        let Some(d) = self.room_wanted else {
            return false;
        };
        let (w, bit) = am_nic::room::waiter_bit(self.rank as usize);
        let waiting = self
            .peers
            .get(d)
            .and_then(|p| p.seg.word(self.layout.ni.room_waiter(w)).ok())
            .is_some_and(|word| word.load(Ordering::SeqCst) & bit != 0);
        if !waiting {
            self.room_wanted = None;
        }
        !waiting
    }

    /// A put's error: a corrupt word in the target's NI memory (another peer's doing, which
    /// its owner repairs when it next looks) is back-pressure; anything else is reported.
    #[cold]
    pub(super) fn put_err(&mut self, e: NiError) -> SendError {
        match e {
            NiError::Corrupt { .. } => {
                self.stats.refused += 1;
                SendError::Busy
            }
            other => SendError::device_from("portals: a put failed", other),
        }
    }

    #[inline(always)]
    pub(super) fn send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let d = dest as usize;
        if d >= self.peers.len() {
            return Err(SendError::InvalidRank(dest));
        }
        if self.lost[d] {
            return Err(SendError::PeerLost(dest));
        }
        if msg.head.len() < am_core::wire::BASE_HEADER_LEN {
            return Err(SendError::device(
                "portals: a head shorter than the AM header",
            ));
        }
        if msg.long_offset.is_some() {
            return self.send_long(dest, msg);
        }
        if msg.len() > self.config.max_message {
            return Err(SendError::TooLarge(msg.len()));
        }
        match msg.reply_to {
            None => self.send_request(dest, msg),
            Some(route) => self.send_reply(dest, route, msg),
        }
    }

    /// A request (not a Long): it takes a free send slot, which its reply frees.
    #[inline(always)]
    pub(super) fn send_request(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let slot = *self.free_slots.last().ok_or_else(|| SendError::Busy)?;
        self.put_message(dest, slot, false, msg)?;
        self.free_slots.pop();
        self.slot_dest[slot as usize] = dest;
        self.in_flight[dest as usize].push(slot);
        Ok(())
    }

    /// A reply (not a Long): to the requester's send slot, which its request's route names.
    #[inline(always)]
    pub(super) fn send_reply(
        &mut self,
        dest: Rank,
        route: Route,
        msg: &Outgoing<'_>,
    ) -> Result<(), SendError> {
        let slot = self.owed_slot(dest, route)?;
        self.put_message(dest, slot, true, msg)?;
        self.owed[dest as usize].answer_through(slot);
        Ok(())
    }

    /// The send slot of the request `route` answers, if `dest` is owed a reply there.
    #[inline(always)]
    pub(super) fn owed_slot(&self, dest: Rank, route: Route) -> Result<u16, SendError> {
        match route
            .get()
            .checked_sub(1)
            .and_then(|k| u16::try_from(k).ok())
        {
            Some(k) if self.owed[dest as usize].contains(k) => Ok(k),
            _ => Err(SendError::NoRequestToAnswer(route)),
        }
    }

    /// A Long: its payload into the target's segment first, then its header (out of line:
    /// the path of Shorts and Mediums stays small).
    #[inline(never)]
    pub(super) fn send_long(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let Some(off) = msg.long_offset else {
            return Err(SendError::device("portals: a Long without an offset"));
        };
        let head = msg.head;
        if head.len() > self.config.max_message {
            return Err(SendError::TooLarge(head.len()));
        }
        if msg.payload.len() > self.config.max_long {
            return Err(SendError::TooLarge(msg.payload.len()));
        }
        let is_reply = msg.is_reply();
        let slot = match msg.reply_to {
            Some(route) => self.owed_slot(dest, route)?,
            None => *self.free_slots.last().ok_or_else(|| SendError::Busy)?,
        };
        let (payload, shared): (&[u8], _) = match msg.payload {
            Payload::Private(p) => (p, None),
            Payload::Shared(s) => (&[], Some(s)),
        };
        self.place_long(dest, off, payload, shared, is_reply)?;
        self.put_message(dest, slot, is_reply, msg)?;
        let d = dest as usize;
        if is_reply {
            self.owed[d].answer_through(slot);
        } else {
            self.free_slots.pop();
            self.slot_dest[slot as usize] = dest;
            self.in_flight[d].push(slot);
        }
        Ok(())
    }

    /// Puts AM `msg` (its head, and its payload unless it is a Long, whose payload was
    /// placed already) into `dest`'s request portal (`is_reply` false) or reply portal (into
    /// send slot `slot`), with `slot` in its match bits. `Ok` once it was deposited where
    /// its target takes it.
    #[inline(always)]
    pub(super) fn put_message(
        &mut self,
        dest: Rank,
        slot: u16,
        is_reply: bool,
        msg: &Outgoing<'_>,
    ) -> Result<(), SendError> {
        // A shared payload (an echo) goes to the NI as such: the deposit moves it straight
        // from where it was received.
        let (payload, shared): (&[u8], _) = match msg.payload {
            Payload::Private(p) => (p, None),
            Payload::Shared(s) => (&[], Some(s)),
        };
        let long = msg.long_offset.is_some();
        let head = msg.head;
        let mut first4 = [0u8; 4];
        first4.copy_from_slice(&head[..4]);
        let match_bits = u32::from_le_bytes(first4) as u64 | (slot as u64) << 32 | AM_TAG << 48;
        let inline = !long && msg.payload.is_empty() && head.len() <= 16 && head[4..8] == [0; 4];
        let mut hdr = [0u8; 8];
        let parts: [&[u8]; 2] = [head, payload];
        // The message's data, and its shared tail: none for an inline header or for a Long
        // (whose payload is in the segment already).
        let (data, tail): (&[&[u8]], _) = if inline {
            // At most two argument words: a short byte loop, not a `memcpy` call.
            for (d, s) in hdr.iter_mut().zip(&head[8..]) {
                *d = *s;
            }
            (&[], None)
        } else if long {
            (&parts[..1], None)
        } else {
            (&parts, shared)
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
            shared: tail,
            ack: false,
            send_event: false,
            // The send slot is the request's, reserved for this reply.
            pad: is_reply,
        };
        let msg_len = if long { head.len() } else { msg.len() };
        let p = &mut self.peers[dest as usize];
        let wake = (&self.wakers, dest as Rank);
        let nic = Nic::with_runs(&p.seg, &p.imp, &self.layout.ni, &p.runs, wake);
        let done = nic.put_seen(&mut p.seen, self.rank, &args);
        match done.map_err(|e| self.put_err(e))? {
            Outcome::Done { me, start }
                if !data.is_empty() && !self.landed(is_reply, slot, me, start, msg_len) =>
            {
                // The target's entry was corrupt (another peer's doing): the deposit went
                // where its target will not take it (it drops the event, and repairs the
                // entry). Not sent, then: the core sends it again, after a walk that reads
                // the entries afresh (the corrupt field may be back before the repair).
                self.peers[dest as usize].seen.forget();
                self.stats.refused += 1;
                Err(SendError::Busy)
            }
            Outcome::Done { .. } => Ok(()),
            // The target's NIC refused it: nothing was deposited; the core sends it again
            // when the target rings that it has room.
            Outcome::Refused(f @ (NiFail::PtDisabled | NiFail::EqFull)) => {
                self.want_room(dest as usize, f == NiFail::PtDisabled);
                Err(SendError::Busy)
            }
            Outcome::Refused(f) => {
                // Perhaps by a kept entry a peer had corrupted: the next walk reads afresh.
                self.peers[dest as usize].seen.forget();
                Err(SendError::device(format!(
                    "portals: rank {dest} matched no entry for {} (send slot {slot}): {f:?}",
                    if is_reply { "a reply" } else { "a request" }
                )))
            }
        }
    }

    /// A Long's payload, put into `dest`'s segment entry before its header goes (out of
    /// line: the message path of Shorts and Mediums stays small).
    #[inline(never)]
    pub(super) fn place_long(
        &mut self,
        dest: Rank,
        off: usize,
        payload: &[u8],
        shared: Option<SharedBytes<'_>>,
        is_reply: bool,
    ) -> Result<(), SendError> {
        let d = dest as usize;
        // Do not move the payload for a header the target would refuse now.
        let enabled = self.nic(d).pt_enabled(PT_REQUEST);
        if !is_reply && !enabled.map_err(|e| self.put_err(e))? {
            self.want_room(d, true);
            return Err(SendError::Busy);
        }
        let len = shared.map_or(payload.len(), |s| s.len());
        // Out of the target's segment: the header goes alone and the target rejects it.
        let fits = off
            .checked_add(len)
            .is_some_and(|end| end <= self.layout.segment);
        if fits && len != 0 {
            let data: &[&[u8]] = &[payload];
            let args = PutArgs {
                pt: PT_SEGMENT,
                match_bits: 0,
                hdr_data: 0,
                remote_offset: off as u64,
                data,
                shared,
                ack: false,
                send_event: false,
                pad: false,
            };
            let done = self.nic(d).put(self.rank, None, &args);
            if let Outcome::Refused(f) = done.map_err(|e| self.put_err(e))? {
                return Err(SendError::device(format!(
                    "portals: rank {dest}'s segment entry refused a Long payload: {f:?}"
                )));
            }
        }
        Ok(())
    }

    /// Whether a deposit in entry `me` at `start` is where the target takes it (every rank
    /// lays out its NI alike, so the sender knows): a request inside a request buffer, at a
    /// claim boundary; a reply at its send slot. What the target checks of it (`locate`).
    #[inline(always)]
    pub(super) fn landed(
        &self,
        is_reply: bool,
        slot: u16,
        me: MeIndex,
        start: u64,
        len: usize,
    ) -> bool {
        let l = &self.layout;
        if is_reply {
            return me == self.reply_me
                && start == (l.send_base() + slot as usize * l.slot_bytes) as u64;
        }
        let Some(i) = self.buffer_mes.iter().position(|&b| b == me) else {
            return false;
        };
        let lo = l.request_buffer(i) as u64;
        start >= lo
            && (start - lo).is_multiple_of(ni::LM_ALIGN as u64)
            && start
                .checked_add(len as u64)
                .is_some_and(|end| end <= lo + l.request_buffer_bytes as u64)
    }

    /// Forgets what was in flight with a lost peer, so its send slots serve the others.
    pub(super) fn forget(&mut self, peer: usize) {
        if let Some(l) = self.lost.get_mut(peer) {
            *l = true;
        }
        if let Some(o) = self.owed.get_mut(peer) {
            o.clear();
        }
        if let Some(f) = self.in_flight.get_mut(peer) {
            f.clear();
        }
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
