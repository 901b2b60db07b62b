//! Receiving: the message-exist flag, the ringer words and the take counts that say which
//! senders wrote, and the scan of their command slots in order.

use super::*;

impl Sci {
    /// Before a sleep: publishes finished DMA, takes the message-exist flag (never sleep on a
    /// flag left set) and checks liveness; whether there is still nothing to do.
    pub(super) fn nothing_to_do(&mut self) -> Result<bool, TransportError> {
        if self.bank.is_some() {
            return self.bank_is_empty();
        }
        if !self.tx.dma.queue.is_empty() {
            self.tx.progress_dma(&self.seg)?;
        }
        if !self.work.is_empty() {
            return Ok(false);
        }
        self.take_exist_flag()?;
        if !self.work.is_empty() {
            return Ok(false);
        }
        self.liveness_tick()?;
        Ok(self.work.is_empty())
    }

    /// Takes the message-exist flag: clears it and the ringer bits of the words its tags
    /// name, tells the senders whose bits it cleared (a new take count written into each
    /// one's segment, so they ring again), and scans them.
    pub(super) fn take_exist_flag(&mut self) -> Result<(), TransportError> {
        self.stale_polls = 0;
        let tags = self.seg.doorbell(MEF).map_err(sci_err)?.take_tags();
        if tags == 0 {
            return Ok(());
        }
        let mut rang = std::mem::take(&mut self.rang);
        rang.clear();
        let layout = self.tx.layout;
        let taken = for_each_ringer_word(&layout, tags, |w| {
            let bits = self.seg.take_word(layout.ringer_word(w))?;
            rang.extend(ringers_in(w, bits, layout.ranks));
            Ok(())
        });
        let mut fenced = true;
        let told = taken.and_then(|()| {
            if !rang.is_empty() {
                self.takes += 1;
                let at = layout.taken(self.tx.rank);
                for &c in &rang {
                    if let Some(peer) = self.tx.peers.get(c) {
                        peer.store_word(at, self.takes)?;
                    }
                }
                // The count before the scan, against the sender's ready flag before its read
                // of the count (see `publish_to`): a barrier on the senders' threads too, as
                // their side has no fence instruction.
                fenced = self.tx.fence.heavy();
            }
            Ok(())
        });
        let scanned = told.map_err(sci_err).and_then(|()| self.scan(&rang));
        self.rang = rang;
        scanned?;
        if !fenced {
            return Err(TransportError::device(
                "sci: membarrier failed: a sender's message may be found late",
            ));
        }
        Ok(())
    }

    /// Sender `c`'s ready messages, taken in stamp order (its [`Expect`] advanced past each)
    /// from the slots where each next one can be: the first one found goes to `first` if
    /// that is still empty, the others to the work queue.
    #[inline(always)]
    pub(super) fn take_ready(
        &mut self,
        c: usize,
        first: &mut Option<Ready>,
    ) -> Result<(), TransportError> {
        let io = sci_err;
        let p = self.tx.config.slots;
        let TxState { recv, dests, .. } = &mut self.tx;
        let Some(e) = recv.get_mut(c) else {
            return Ok(());
        };
        // A reply comes only while a request of ours to `c` waits for one: otherwise its reply
        // slots are not read (nor their pages allocated, for a peer we never asked anything).
        let replies = dests.get(c).is_some_and(|to| to.mls.0 != 0);
        loop {
            let restart = restart_slot(e, dests.get(c));
            let slot = if self.inbox.stamp(e.base + e.req).map_err(io)? == e.seq {
                e.req
            } else if replies && self.inbox.stamp(e.base + e.rep).map_err(io)? == e.seq {
                e.rep
            } else {
                match restart {
                    Some(r) if self.inbox.stamp(e.base + r).map_err(io)? == e.seq => r,
                    _ => return Ok(()),
                }
            };
            // A reply's flags say how many requests it answers (where the next reply goes), a
            // request's whether it was sent lone.
            let flags = self.inbox.header(e.base + slot).map_err(io)?.flags;
            e.advance(slot, p, flags);
            let found = Ready { sender: c, slot };
            if first.is_none() {
                *first = Some(found);
            } else {
                self.work.push_back(found);
            }
        }
    }

    /// Scans the command segments of the senders in `senders` (those whose ringer bits a take
    /// cleared): reads the message-ready flags of the slots each one can have written, then
    /// moves the ready messages to the work queue in stamp order, and then the ones found in
    /// turn after them. After a take, so that a message a sender put where the protocol does
    /// not is still found.
    ///
    /// Slots are taken in turn from slot 0, so a sender that has sent fewer messages than
    /// there are slots of a kind has written none past its next one of that kind: those are
    /// not read, and their pages, which a read would allocate, stay untouched until it writes
    /// them. Nor are its reply slots while no request of ours to it waits for a reply.
    pub(super) fn scan(&mut self, senders: &[usize]) -> Result<(), TransportError> {
        let io = sci_err;
        let p = self.tx.config.slots;
        for &c in senders {
            let replies = self.tx.dests.get(c).is_some_and(|to| to.mls.0 != 0);
            let Some(e) = self.tx.recv.get_mut(c) else {
                continue;
            };
            let (reqs, reps) = if e.seq > p as u64 {
                (p, p)
            } else {
                (e.req + 1, e.rep - p + 1)
            };
            let reps = if replies { reps } else { 0 };
            // One pass over the ready flags, then find the stamps in order locally. Reused
            // buffer: a fresh array per scan would cost a memset per poll.
            let stamps = &mut self.stamps;
            stamps.fill(0);
            for k in (0..reqs).chain(p..p + reps) {
                if let Some(s) = stamps.get_mut(k) {
                    *s = self.inbox.stamp(e.base + k).map_err(io)?;
                }
            }
            while let Some(slot) = stamps.iter().position(|&s| s == e.seq) {
                let flags = self.inbox.header(e.base + slot).map_err(io)?.flags;
                e.advance(slot, p, flags);
                self.work.push_back(Ready { sender: c, slot });
            }
            // The ones in turn after them, in slots not read above.
            self.queue_ready(c)?;
        }
        Ok(())
    }

    /// [`take_ready`](Self::take_ready) of sender `c` onto the end of the work queue, in
    /// stamp order, also when it fails part way (what it took is not lost).
    pub(super) fn queue_ready(&mut self, c: usize) -> Result<(), TransportError> {
        let queued = self.work.len();
        let mut first = None;
        let taken = self.take_ready(c, &mut first);
        if let Some(found) = first {
            self.work.insert(queued, found);
        }
        taken
    }

    /// The next message to deliver: the work queue's head; else the last sender's next
    /// message, if the slot where its next message of the same kind goes carries it (or, with
    /// the flag rung, the slot of the other kind: an exchange both ways alternates them);
    /// else what a [`look`](Self::look) at the senders that rang finds. An idle poll reads
    /// two words of our own memory, the message-exist flag and that ready flag, whatever the
    /// number of peers; they are independent loads, so when both lines were written the
    /// misses overlap.
    #[inline(always)]
    pub(super) fn next_message(&mut self) -> Result<Option<Next>, TransportError> {
        if let Some(ready) = self.work.pop_front() {
            return Ok(Some(Next {
                ready,
                at_hint: false,
            }));
        }
        let io = sci_err;
        let tags = self.seg.doorbell(MEF).map_err(io)?.peek_tags();
        // Taking a message here keeps per-sender order (the queue is empty and the stamp is
        // the next one) and leaves the flag as it is. A message elsewhere has its sender's
        // ringer bit set.
        let Hint { sender: c, reply } = self.hint;
        let Some(e) = self.tx.recv.get(c) else {
            return Err(TransportError::device("sci: bad hint"));
        };
        // With all its requests answered, `c`'s next request is likelier a lone one, restarted
        // at slot 0 (a round trip's) than one that crossed our last reply (in turn, left to
        // the look below).
        let req = restart_slot(e, self.tx.dests.get(c)).unwrap_or(e.req);
        let (same, other) = if reply { (e.rep, req) } else { (req, e.rep) };
        if self.inbox.stamp(e.base + same).map_err(io)? == e.seq {
            return Ok(Some(Next {
                ready: Ready {
                    sender: c,
                    slot: same,
                },
                at_hint: true,
            }));
        }
        if tags == 0 {
            if self.liveness.idle_poll() {
                self.liveness_tick()?;
            }
            return Ok(None);
        }
        if self.inbox.stamp(e.base + other).map_err(io)? == e.seq {
            return Ok(Some(Next {
                ready: Ready {
                    sender: c,
                    slot: other,
                },
                at_hint: true,
            }));
        }
        Ok(self.look(tags)?.map(|ready| Next {
            ready,
            at_hint: false,
        }))
    }

    /// [`next_message`](Self::next_message) past the hint with the message-exist flag set:
    /// takes the ready messages of the senders that rang (`tags`), looking only where each
    /// one's next message can be (see [`Expect`]): two flags per sender. The first one found
    /// is returned (a look runs only with the work queue empty, and would take it next), the
    /// others queued.
    ///
    /// The flag is left set while traffic flows: its senders send without ringing again (see
    /// `TxState::publish`), and the take, which makes the next one ring, stays off the
    /// delivery path. After a bounded number of fruitless looks it is taken, and the senders
    /// that rang since are scanned.
    #[inline(never)]
    pub(super) fn look(&mut self, tags: u32) -> Result<Option<Ready>, TransportError> {
        if self.seg.load_word(ABORT).unwrap_or(0) != 0 {
            return Err(TransportError::JobAborted);
        }
        debug_assert!(self.work.is_empty());
        let layout = self.tx.layout;
        let mut first = None;
        // The senders whose ringer bits are set in the words the tags name; an untagged ring
        // (a departure, the DMA engine) names none.
        let walked = for_each_ringer_word(&layout, tags, |w| {
            let bits = self.seg.load_word(layout.ringer_word(w)).map_err(sci_err)?;
            for c in ringers_in(w, bits, layout.ranks) {
                self.take_ready(c, &mut first)?;
            }
            Ok(())
        });
        if let Err(e) = walked {
            // A message already taken is not lost with the look: it is next.
            if let Some(found) = first {
                self.work.push_front(found);
            }
            return Err(e);
        }
        if first.is_some() {
            return Ok(first);
        }
        self.stale_polls += 1;
        if self.stale_polls >= STALE_POLLS {
            self.take_exist_flag()?;
            return Ok(self.work.pop_front());
        }
        Ok(None)
    }
}

/// Calls `f` with every ringer word whose tag `tags` carries (word `w` has tag `w % TAGS`;
/// none for an untagged ring), stopping at its first error.
#[inline]
pub(super) fn for_each_ringer_word<E>(
    layout: &Layout,
    tags: u32,
    mut f: impl FnMut(usize) -> Result<(), E>,
) -> Result<(), E> {
    let words = layout.ringer_words();
    let mut classes = am_shm::doorbell::ringers(tags);
    while classes != 0 {
        let mut w = classes.trailing_zeros() as usize;
        classes &= classes - 1;
        while w < words {
            f(w)?;
            w += am_shm::doorbell::TAGS;
        }
    }
    Ok(())
}

/// The senders whose bits are set in ringer word `w`, which holds `bits` (a peer can write
/// any bits: those of no rank are left out).
pub(super) fn ringers_in(w: usize, mut bits: u64, ranks: usize) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        while bits != 0 {
            let c = w * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if c < ranks {
                return Some(c);
            }
        }
        None
    })
}
