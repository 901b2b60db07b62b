//! Liveness: a peer that died or left, noticed while nothing arrives.

use super::*;

impl Sci {
    /// After a while without progress: is every peer that has not departed still alive? And a
    /// look where the next message can be of every sender we have exchanged messages with or
    /// whose ringer bit is set: a peer that corrupted a take count (so its sender never rings)
    /// or our message-exist flag can delay such a message by this much, never strand it.
    /// Other senders are left alone, so that their command segments' pages stay untouched: a
    /// peer that wipes our ringer words after a sender's first ring, before we heard from it,
    /// and forges its take count, can strand that sender's messages (as any peer can
    /// overwrite them).
    pub(super) fn liveness_tick(&mut self) -> Result<(), TransportError> {
        if !self.liveness.due() {
            return Ok(());
        }
        let layout = self.tx.layout;
        // With a bank there are no command segments to look at.
        let words = if self.bank.is_some() {
            0
        } else {
            layout.ringer_words()
        };
        for w in 0..words {
            // Senders whose ringer bits are set, whatever the flag's tags say (a peer may
            // have wiped them): one load per 64 senders.
            let bits = self.seg.load_word(layout.ringer_word(w)).unwrap_or(0);
            for c in w * 64..layout.ranks.min(w * 64 + 64) {
                let known = self.tx.recv.get(c).is_some_and(|e| e.seq > 1)
                    || self.tx.dests.get(c).is_some_and(|to| to.send_seq > 1);
                if known || bits & crate::layout::ringer_bit(c).1 != 0 {
                    self.queue_ready(c)?;
                }
            }
        }
        let found = self
            .liveness
            .check_now(&self.seg, self.tx.layout.departed_words())?;
        for e in &found {
            if let TransportError::PeerLost(r) = e {
                if let Some(to) = self.tx.dests.get_mut(*r as usize) {
                    to.lost = true;
                }
            }
        }
        if self.bank.is_some() {
            self.unblock_bank();
        }
        // One error per call; the others wait for the next polls.
        let mut found = found.into_iter();
        let first = found.next();
        self.faults.extend(found);
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
