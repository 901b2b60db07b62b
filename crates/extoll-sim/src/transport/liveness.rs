//! Liveness: a peer that died or left, and heads that stopped moving, noticed while nothing
//! arrives.

use super::*;

impl Extoll {
    /// Counts a poll; every [`IDLE_POLLS_PER_TICK`]th looks at the clock.
    #[inline]
    pub(super) fn count_poll(&mut self) {
        self.polls = self.polls.wrapping_add(1);
        if self.polls.is_multiple_of(IDLE_POLLS_PER_TICK) {
            self.tick(Instant::now());
        }
    }

    /// Runs the stalled-queue checks ([`check`](Self::check)) if a queue's head has not moved
    /// for [`LIVENESS_AFTER`], at most once per [`LIVENESS_AFTER`].
    pub(super) fn tick(&mut self, now: Instant) {
        let w = &mut self.watch;
        if w.mailbox != self.head {
            w.mailbox = self.head;
            w.mailbox_since = now;
        }
        if w.notes != self.note_head {
            w.notes = self.note_head;
            w.notes_since = now;
        }
        let stalled = |since: Instant| now.duration_since(since) >= LIVENESS_AFTER;
        let mailbox = stalled(w.mailbox_since);
        let due = w
            .last_check
            .is_none_or(|c| now.duration_since(c) >= LIVENESS_AFTER);
        if (mailbox || stalled(w.notes_since)) && due {
            w.last_check = Some(now);
            self.check(mailbox);
        }
    }

    /// The checks of a stalled queue: our head words, and every wait at the queues' heads
    /// that can no longer end; with the mailbox stalled (`peers`), the abort word and the
    /// peers' liveness too (a look at each peer's process: not while VELO traffic flows).
    /// What they find becomes errors for the next polls.
    pub(super) fn check(&mut self, peers: bool) {
        if peers {
            self.check_peers();
        }
        self.check_heads();
        let notes_clear = self.unblock_notes();
        self.unblock_mailbox();
        self.sweep_pool(notes_clear);
        self.tell_head(true);
    }

    /// Declares rank `r` lost: its partial message is dropped, its claims are skipped as the
    /// heads reach them, and the next poll reports it (once).
    pub(super) fn declare_lost(&mut self, r: usize) {
        if !self.tx.dests[r].lost {
            self.tx.dests[r].lost = true;
            self.reasm.abandon(r as u32);
            self.tx.fault(TransportError::PeerLost(r as Rank));
        }
    }

    /// The abort word, and every peer that has not departed: still alive? (`am_nic`'s check;
    /// what it finds becomes errors for the next polls.)
    pub(super) fn check_peers(&mut self) {
        match self
            .liveness
            .check_now(&self.seg, self.tx.layout.departed_words())
        {
            Err(e) => self.tx.fault(e),
            Ok(found) => {
                for e in found {
                    match e {
                        TransportError::PeerLost(r) => self.declare_lost(r as usize),
                        other => self.tx.fault(other),
                    }
                }
            }
        }
    }

    /// Our head words say what we told: a peer that rewrote one would keep senders from
    /// room (or send them laps ahead). Put back, reported.
    pub(super) fn check_heads(&mut self) {
        let l = self.tx.layout;
        for (ring, told, what) in [
            (l.mailbox(), self.head_told, "VELO mailbox"),
            (l.notifications(), self.note_told, "notification queue"),
        ] {
            let word = self.seg.load_word(ring.head()).unwrap_or(told);
            if word != told {
                let _ = ring.consumed(&self.own, told);
                self.tx.fault(misbehaved(
                    None,
                    format!("{what} head word {word}, {told} was consumed"),
                ));
            }
        }
    }
}
