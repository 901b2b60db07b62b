//! The RMA engine's side of the transport: RMA Mediums and Longs put into the receiver's
//! buffers with a notification, the queued puts and gets of [`Extoll::rma_put`] and
//! [`Extoll::rma_get`], and the receiver's delivery of what they notified.

use super::*;

impl TxState {
    /// How many RMA Mediums to `d` are in flight (sent, not acknowledged), after reading its
    /// acknowledgement word (one load, checked in the copy).
    #[inline(always)]
    pub(super) fn rma_in_flight(&mut self, d: usize) -> Result<u64, SendError> {
        let at = self.layout.ack(d);
        let word = self.peers[self.rank].seg.load_word(at).map_err(shm)?;
        let sent = self.dests[d].rma_sent;
        if word > sent {
            // More acknowledged than sent: ignored, and put back to what we know.
            let _ = self.peers[self.rank].imp.store_word(at, self.rma_acked[d]);
            self.fault(misbehaved(
                Some(d),
                format!("acknowledged {word} RMA Mediums, {sent} were sent"),
            ));
        } else if word > self.rma_acked[d] {
            self.rma_acked[d] = word;
        }
        Ok(sent - self.rma_acked[d])
    }

    /// pscom's RMA plugin: one put of the message into `d`'s receive buffer of the next index
    /// (message at the end, the tail last), by the engine as the doorbell is rung.
    pub(super) fn send_rma_medium(
        &mut self,
        d: usize,
        head: &[u8],
        payload: Payload<'_>,
    ) -> Result<(), SendError> {
        if self.layout.rma_pool > 0 {
            return self.send_pool_medium(d, head, payload);
        }
        let b = self.layout.rma_buffers as u64;
        if self.rma_in_flight(d)? >= b {
            return Err(SendError::Busy);
        }
        let slots = self.reserve(d)?;
        let k = self.dests[d].rma_sent;
        // `k % b < rma_buffers`: `rx(rank, idx)` without its saturating arithmetic.
        let rx = self.rx_ours + (k % b) as usize * RMA_BUF;
        self.put_medium(d, rx, k, k, slots, head, payload);
        Ok(())
    }
}

impl TxState {
    /// The put of `d`'s `k`-th RMA Medium into the buffer at `rx` (message at the end, the
    /// tail last) and its completer notification with `value`, by the engine as the doorbell
    /// is rung.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn put_medium(
        &mut self,
        d: usize,
        rx: usize,
        k: u64,
        value: u64,
        slots: Reserved,
        head: &[u8],
        payload: Payload<'_>,
    ) {
        let total = head.len() + payload.len();
        let start = RMA_BUF - TAIL - align8(total);
        let tail = marker(k, &self.layout)
            | (total as u64) << 16
            | (self.dests[d].velo_sent & 0xffff) << 32
            | (self.rma_consumed[d] & 0xffff) << 48;
        let private_parts: [&[u8]; 2];
        let data = match payload {
            Payload::Private(p) => {
                private_parts = [head, p];
                Data::Padded(rx + start, &private_parts, None)
            }
            // An echo: straight from where it was received into the peer's buffer.
            Payload::Shared(s) => Data::Padded(rx + start, std::slice::from_ref(&head), Some(s)),
        };
        rma::put_immediate(
            &self.peers[d],
            &self.dests[d].notes,
            self.rank,
            data,
            Some((rx + RMA_BUF - TAIL, tail)),
            slots,
            Note {
                kind: kind::MEDIUM_LANDED,
                value,
            },
        );
        self.dests[d].rma_sent += 1;
        // The tail carried our acknowledgement of d's buffers.
        self.rma_ack_sent[d] = self.rma_consumed[d];
    }

    /// AM Long: the payload put by the engine straight into `d`'s segment as the doorbell is
    /// rung, then the header over VELO (flagged "wait for the completer notification").
    pub(super) fn send_long(
        &mut self,
        d: usize,
        msg: &Outgoing<'_>,
        off: usize,
    ) -> Result<(), SendError> {
        if msg.payload.len() > self.config.max_long {
            return Err(SendError::TooLarge(msg.payload.len()));
        }
        if msg.head.len() > MAX_MSG {
            return Err(SendError::TooLarge(msg.head.len()));
        }
        let fits = off
            .checked_add(msg.payload.len())
            .is_some_and(|end| end <= self.layout.segment);
        if msg.payload.is_empty() || !fits {
            // Nothing to move (or out of the target's segment, which the target rejects).
            return self.send_velo(d, msg.head, Payload::EMPTY, PLACED);
        }
        let slots = self.reserve(d)?;
        // The header's slots before the put: once the payload is sent, the header must follow.
        let n = velo::packets(msg.head.len(), self.cap());
        let mut t = self.take_tickets(n);
        if let Err(e) = self.claim(d, &mut t) {
            self.tickets = t;
            slots.cancel(&self.dests[d].notes);
            return Err(e);
        }
        rma::put_immediate(
            &self.peers[d],
            &self.dests[d].notes,
            self.rank,
            Data::Exact(self.layout.segment_base() + off, msg.payload),
            None,
            slots,
            Note {
                kind: kind::LONG_LANDED,
                value: msg.payload.len() as u64,
            },
        );
        let r = self.emit(d, n, |i| t[i], msg.head, Payload::EMPTY, PLACED | RMA_WAIT);
        self.tickets = t;
        r
    }
}

impl Extoll {
    pub(super) fn check_region(&self, offset: usize, len: usize) -> Result<usize, RmaError> {
        let region = self.tx.layout.segment;
        if offset.checked_add(len).is_none_or(|end| end > region) {
            return Err(RmaError::OutOfBounds {
                offset,
                len,
                region,
            });
        }
        Ok(self.tx.layout.segment_base() + offset)
    }

    pub(super) fn user_op(
        &mut self,
        dest: Rank,
        job: impl FnOnce(u64) -> Job,
    ) -> Result<RmaOp, RmaError> {
        let d = dest as usize;
        let departed =
            d != self.tx.rank && self.seg.load_word(self.tx.layout.departed(d)).unwrap_or(0) != 0;
        if d >= self.tx.peers.len() || self.tx.dests[d].lost || departed {
            return Err(RmaError::BadRank(dest));
        }
        let id = self.tx.next_op;
        self.tx.next_op += 1;
        self.tx.submit(job(id)).map_err(RmaError::Engine)?;
        self.user_pending.insert(id);
        Ok(RmaOp { id, peer: dest })
    }

    /// RMA put by the engine: `len` bytes of our AM segment at `src_offset` into `dest`'s AM
    /// segment at `dst_offset`. Complete (and the source reusable) once [`rma_test`](Self::rma_test)
    /// says so; the completer gets a notification ([`puts_landed`](Self::puts_landed)).
    pub fn rma_put(
        &mut self,
        dest: Rank,
        dst_offset: usize,
        src_offset: usize,
        len: usize,
    ) -> Result<RmaOp, RmaError> {
        let dst = self.check_region(dst_offset, len)?;
        let src = self.check_region(src_offset, len)?;
        self.user_op(dest, |op| Job::Put {
            dest: dest as usize,
            src,
            dst,
            len,
            op,
        })
    }

    /// RMA get by the engine: `len` bytes of `from`'s AM segment at `src_offset` into ours at
    /// `dst_offset`.
    pub fn rma_get(
        &mut self,
        from: Rank,
        src_offset: usize,
        dst_offset: usize,
        len: usize,
    ) -> Result<RmaOp, RmaError> {
        let src = self.check_region(src_offset, len)?;
        let dst = self.check_region(dst_offset, len)?;
        self.user_op(from, |op| Job::Get {
            from: from as usize,
            src,
            dst,
            len,
            op,
        })
    }

    /// Polls the notification queue; true once `op`'s requester notification arrived. A put
    /// whose target was lost before it could be notified is [`TransportError::PeerLost`]; one
    /// whose target never made room for the notification is [`TransportError::Device`] (the data
    /// landed in both cases, unannounced).
    pub fn rma_test(&mut self, op: RmaOp) -> Result<bool, TransportError> {
        self.drain_notes()?;
        if self.user_done.remove(&op.id) {
            return Ok(true);
        }
        match self.user_failed.remove(&op.id) {
            None => Ok(false),
            Some(kind::USER_LOST) => Err(TransportError::PeerLost(op.peer)),
            Some(_) => Err(TransportError::device(format!(
                "rank {}'s notification queue stayed full: RMA put {} landed unannounced",
                op.peer, op.id
            ))),
        }
    }

    /// How many user RMA puts from `src` landed in our segment (completer notifications).
    pub fn puts_landed(&self, src: Rank) -> u64 {
        self.put_landed.get(src as usize).copied().unwrap_or(0)
    }
}

impl Extoll {
    /// The next RMA Medium from `s` as its tail says (one load; checked in the copy).
    #[inline]
    pub(super) fn rma_state(&self, s: usize) -> Result<RmaState, TransportError> {
        let k = self.rma_delivered[s];
        if self.rma_landed[s] <= k {
            return Ok(RmaState::None);
        }
        let l = &self.tx.layout;
        let tail = self
            .seg
            .load_slot_word(self.rma_buf(s) + RMA_BUF - TAIL)
            .map_err(io)?;
        if tail & 0xffff != marker(k, l) {
            return Ok(RmaState::BadMarker(tail & 0xffff));
        }
        let len = ((tail >> 16) & 0xffff) as usize;
        if len > MAX_MSG {
            return Ok(RmaState::BadLength(len));
        }
        if (tail >> 32) & 0xffff != self.velo_delivered[s] & 0xffff {
            return Ok(RmaState::WaitsVelo);
        }
        Ok(RmaState::Ready(tail))
    }

    /// The tail of the next RMA Medium from `s`, if it landed and every VELO message sent
    /// before it was delivered. A corrupt tail is dropped and reported.
    #[inline]
    pub(super) fn rma_next(&mut self, s: usize) -> Result<Option<u64>, TransportError> {
        match self.rma_state(s)? {
            RmaState::Ready(tail) => Ok(Some(tail)),
            RmaState::None | RmaState::WaitsVelo => Ok(None),
            RmaState::BadMarker(m) if self.tx.layout.rma_pool > 0 => {
                // Its sender holds the buffer for it, and the Medium is not there: dropped.
                let k = self.rma_delivered[s];
                self.drop_rma(s);
                Err(misbehaved(
                    Some(s),
                    format!("RMA Medium {k} notified but its tail marker is {m:#x}"),
                ))
            }
            RmaState::BadMarker(m) => {
                // No Medium behind the notification: drop the notification.
                self.rma_landed[s] -= 1;
                self.rma_pending -= 1;
                Err(misbehaved(
                    Some(s),
                    format!(
                        "RMA Medium {} notified but its tail marker is {m:#x}",
                        self.rma_delivered[s]
                    ),
                ))
            }
            RmaState::BadLength(len) => {
                let k = self.rma_delivered[s];
                self.drop_rma(s);
                Err(misbehaved(
                    Some(s),
                    format!("RMA Medium {k} of {len} bytes"),
                ))
            }
        }
    }

    /// Drops the next RMA Medium from `s` undelivered, freeing its buffer.
    pub(super) fn drop_rma(&mut self, s: usize) {
        self.rma_delivered[s] += 1;
        self.rma_pending -= 1;
        self.rma_consumed(s);
    }

    /// Frees the buffer of `s`'s RMA Medium just delivered or dropped (counted in
    /// `rma_delivered` already): a pool buffer at once, one per connection by acknowledging
    /// it, lazily.
    pub(super) fn rma_consumed(&mut self, s: usize) {
        self.release_pool(s);
        let tx = &mut self.tx;
        tx.rma_consumed[s] += 1;
        if tx.rma_consumed[s] - tx.rma_ack_sent[s] >= (tx.layout.rma_flight() as u64).div_ceil(2) {
            tx.rma_ack_sent[s] = tx.rma_consumed[s];
            let _ = tx.peers[s]
                .imp
                .store_word(tx.layout.ack(tx.rank), tx.rma_consumed[s]);
        }
    }

    /// Delivers the next RMA Medium from `s` (its tail, checked, is `tail`), lent from the
    /// receive buffer, then frees the buffer.
    pub(super) fn deliver_rma<R>(
        &mut self,
        s: usize,
        tail: u64,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<R, TransportError> {
        let len = ((tail >> 16) & 0xffff) as usize;
        let at = self.rma_buf(s) + RMA_BUF - TAIL - align8(len);
        // Piggybacked ack: how many of our buffers s has consumed (mod 2^16).
        let acked = self.tx.rma_acked[s];
        let delta = (tail >> 48).wrapping_sub(acked) & 0xffff;
        if delta <= self.tx.dests[s].rma_sent - acked {
            self.tx.rma_acked[s] += delta;
        } else if delta < STALE_ACK {
            // Ahead of what we sent (an older ack is legitimate, and ignored).
            self.tx.fault(misbehaved(
                Some(s),
                format!(
                    "acknowledges {} RMA Mediums, {} were sent",
                    acked + delta,
                    self.tx.dests[s].rma_sent
                ),
            ));
        }
        self.rma_delivered[s] += 1;
        self.rma_pending -= 1;
        let bytes = match self.seg.view(at, len) {
            Ok(bytes) => bytes,
            Err(e) => {
                self.rma_consumed(s);
                return Err(io(e));
            }
        };
        let segment = am_segment(&self.seg, &self.tx.layout);
        let r = f(
            Delivery {
                src: s as Rank,
                bytes: Received::Shared(bytes),
                payload_placed: false,
                route: Route::NONE,
            },
            segment,
            &mut self.tx,
        );
        self.rma_consumed(s);
        Ok(r)
    }
}
