//! Receiving: the event queue's put events, located in the request buffers or reply slots
//! they name, and the events that are not messages.

use super::*;

impl Portals {
    /// The AM segment: a view of this rank's byte area after the send slots.
    pub(super) fn am_segment(&self) -> Result<SharedBytes<'_>, TransportError> {
        let l = &self.tx.layout;
        self.own.view(self.tx.seg_base, l.segment).map_err(io)
    }

    pub(super) fn buffer_of(&self, me: MeIndex) -> Option<usize> {
        self.buffers.iter().position(|b| b.me == me)
    }

    /// The sender of an event, if its word names a rank of the job.
    pub(super) fn sender(&self, initiator: u32) -> Option<usize> {
        (initiator < self.tx.layout.ranks).then_some(initiator as usize)
    }
}

impl Portals {
    /// An event other than an accepted AM `Put` (decoded and checked here): flow control's
    /// events are handled; a `Put` on the request or reply portal is returned for
    /// [`locate`](Self::locate) to refuse (it carries a failure); anything else is an error.
    #[cold]
    #[inline(never)]
    pub(super) fn other_event(&mut self, w: [u64; 7]) -> Result<Option<[u64; 7]>, TransportError> {
        let ev = ni::Event::from_words(w).map_err(ni_fault)?;
        match (ev.kind, ev.pt) {
            (EventKind::Put, PT_REQUEST | PT_REPLY) => return Ok(Some(w)),
            (EventKind::Unlink, PT_REQUEST) => match self.buffer_of(ev.me) {
                Some(b) => self.note_exhausted(b, Some(ev.used))?,
                None => {
                    return Err(misbehaved(
                        self.sender(ev.initiator),
                        format_args!("an Unlink event for entry {}", ev.me),
                    ))
                }
            },
            (EventKind::PtDisabled, PT_REQUEST) => {
                self.tx.stats.disabled += 1;
                let checked = self.on_refusal();
                self.maybe_enable().and(checked)?
            }
            (EventKind::Dropped, _) => self.on_refusal()?,
            (k, pt) => {
                return Err(misbehaved(
                    self.sender(ev.initiator),
                    format_args!("an unexpected {k:?} event on portal {pt}"),
                ))
            }
        }
        Ok(None)
    }

    /// Checks the words `w` of an AM's `Put` event (on the request portal if `is_request`,
    /// else the reply portal) against what the mapping writes, and where its message is:
    /// `(Some(start), len, buffer)` deposited at `start` of the byte area (in request buffer
    /// `buffer`), or `(None, len, None)` rebuilt into `scratch`. The words are a private copy
    /// (see `Event::words` for their layout); each is checked before use.
    #[inline(always)]
    pub(super) fn locate(
        &mut self,
        w: [u64; 7],
        is_request: bool,
        src: usize,
    ) -> Result<(Option<usize>, usize, Option<usize>), TransportError> {
        let l = &self.tx.layout;
        let [w0, match_bits, hdr_data, start, w4, remote_offset, used] = w;
        let (mlen, me) = (w4 as u32 as usize, (w4 >> 32) as MeIndex);
        if match_bits >> 48 != AM_TAG || (w0 >> 8) as u8 != NiFail::Ok as u8 || used != 0 {
            return Err(bad_event(&w, src, "event"));
        }
        let slot = (match_bits >> 32) as u16 as usize;
        if slot >= l.send_slots {
            return Err(bad_event(&w, src, "send slot"));
        }
        let want_offset = if is_request {
            0
        } else {
            slot as u64 * l.slot_bytes as u64
        };
        if remote_offset != want_offset {
            return Err(bad_event(&w, src, "remote offset"));
        }
        if mlen == 0 {
            // Inline: the head's first four bytes, no payload length, two arguments at most
            // (and nothing in the header data beyond them).
            let nargs = (match_bits >> 16) as u8 as usize;
            if nargs > 2 || (nargs < 2 && hdr_data >> (32 * nargs) != 0) {
                return Err(bad_event(&w, src, "inline message"));
            }
            self.scratch[..8].copy_from_slice(&(match_bits as u32 as u64).to_le_bytes());
            self.scratch[8..].copy_from_slice(&hdr_data.to_le_bytes());
            return Ok((None, 8 + 4 * nargs, None));
        }
        if hdr_data != 0 || mlen > self.tx.config.max_message {
            return Err(bad_event(&w, src, "message"));
        }
        let (lo, hi, buffer) = if is_request {
            let Some(b) = self.buffer_of(me) else {
                return Err(bad_event(&w, src, "request buffer"));
            };
            let rb = &self.buffers[b];
            (rb.start as u64, (rb.start + rb.len) as u64, Some(b))
        } else {
            if me != self.reply_me {
                return Err(bad_event(&w, src, "reply entry"));
            }
            let s = (l.send_base() + slot * l.slot_bytes) as u64;
            (s, s + l.slot_bytes as u64, None)
        };
        // Inside the buffer (or the send slot), at a claim boundary, with checked ends.
        let in_range = start >= lo
            && (start - lo).is_multiple_of(ni::LM_ALIGN as u64)
            && start.checked_add(mlen as u64).is_some_and(|end| end <= hi);
        if !in_range || (!is_request && start != lo) {
            return Err(bad_event(&w, src, "message range"));
        }
        Ok((Some(start as usize), mlen, buffer))
    }
}
