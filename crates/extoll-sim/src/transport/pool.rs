//! The pool (dynamic credits' layout): RMA Medium buffers of the receiver that every sender
//! claims with a compare-and-swap on a claim word, freed by the receiver once read.

use super::*;

impl TxState {
    /// Claims a free buffer of `d`'s pool for our `k`-th RMA Medium to it (a compare-and-swap
    /// on its claim word, the RMA unit's atomic), trying them in turn from after the last one
    /// we took; `None` if every one is held.
    pub(super) fn claim_pool(&mut self, d: usize, k: u64) -> Result<Option<usize>, SendError> {
        let p = self.layout.rma_pool;
        let seg = &self.peers[d].seg;
        let v = pool_claim(self.rank, k);
        let start = self.pool_hint[d];
        for j in 0..p {
            let i = (start + j) % p;
            let w = seg.word(self.layout.pool_claim(i)).map_err(shm)?;
            // Acquire: the receiver's release of the buffer (after reading it) is before our
            // writes into it.
            if w.load(Ordering::Relaxed) == 0
                && w.compare_exchange(0, v, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                self.pool_hint[d] = (i + 1) % p;
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// Gives back pool buffer `i` of `d`, claimed for our `k`-th RMA Medium and not used.
    pub(super) fn unclaim_pool(&self, d: usize, i: usize, k: u64) {
        if let Ok(w) = self.peers[d].seg.word(self.layout.pool_claim(i)) {
            let _ = w.compare_exchange(
                pool_claim(self.rank, k),
                0,
                Ordering::Release,
                Ordering::Relaxed,
            );
        }
    }
}

impl TxState {
    /// [`send_rma_medium`](Self::send_rma_medium) with a pool: into a buffer of `d`'s pool
    /// claimed first; with none free, or this sender's share of the pool in flight, the
    /// Medium goes over VELO instead.
    #[inline(never)]
    pub(super) fn send_pool_medium(
        &mut self,
        d: usize,
        head: &[u8],
        payload: Payload<'_>,
    ) -> Result<(), SendError> {
        if self.rma_in_flight(d)? >= self.layout.rma_flight() as u64 {
            return self.send_velo(d, head, payload, 0);
        }
        let k = self.dests[d].rma_sent;
        let Some(i) = self.claim_pool(d, k)? else {
            return self.send_velo(d, head, payload, 0);
        };
        let slots = match self.reserve(d) {
            Ok(slots) => slots,
            Err(e) => {
                self.unclaim_pool(d, i, k);
                return Err(e);
            }
        };
        // `i < rma_pool`: `pool(i)` without its saturating arithmetic.
        let rx = self.pool_at + i * RMA_BUF;
        self.put_medium(
            d,
            rx,
            k,
            k | (i as u64) << POOL_INDEX_SHIFT,
            slots,
            head,
            payload,
        );
        Ok(())
    }
}

impl Extoll {
    /// Where the buffer of the next RMA Medium from `s` starts (one that landed).
    #[inline]
    pub(super) fn rma_buf(&self, s: usize) -> usize {
        let l = &self.tx.layout;
        if l.rma_pool > 0 {
            let i = self.pool_bufs[s].front().copied().unwrap_or(0) as usize;
            // `i < rma_pool` (checked as it landed): `pool(i)` without its saturating
            // arithmetic.
            self.tx.pool_at + i * RMA_BUF
        } else {
            let idx = (self.rma_delivered[s] % l.rma_buffers as u64) as usize;
            self.rx_from[s] + idx * RMA_BUF
        }
    }

    /// With a pool: frees the buffer of `s`'s RMA Medium just delivered or dropped (counted in
    /// `rma_delivered` already; a claim word someone rewrote meanwhile is left to the idle
    /// sweep). Part of [`rma_consumed`](Self::rma_consumed).
    #[inline(always)]
    pub(super) fn release_pool(&mut self, s: usize) {
        if self.tx.layout.rma_pool > 0 {
            self.release_pool_buf(s);
        }
    }

    #[inline(never)]
    pub(super) fn release_pool_buf(&mut self, s: usize) {
        let k = self.rma_delivered[s] - 1;
        if let Some(i) = self.pool_bufs[s].pop_front() {
            if let Ok(w) = self.seg.word(self.tx.layout.pool_claim(i as usize)) {
                // Release: our reads of the buffer are before the next claimer's writes.
                let _ =
                    w.compare_exchange(pool_claim(s, k), 0, Ordering::Release, Ordering::Relaxed);
            }
        }
    }

    /// With a pool, at the stalled-queue checks: frees what no Medium will free. A lost
    /// rank's claim not notified, once the notification queue was drained to empty
    /// (`notes_clear`: a notification it published before dying is then counted); a claim no
    /// sender writes, or one naming a Medium of its sender's outside the window that sender
    /// may have in flight (delivered already, or [`Layout::rma_flight`] or more past the
    /// delivered ones), reported. A claim inside a live sender's window is left: it may be in
    /// flight.
    pub(super) fn sweep_pool(&mut self, notes_clear: bool) {
        let l = self.tx.layout;
        for i in 0..l.rma_pool {
            let Ok(w) = self.seg.word(l.pool_claim(i)) else {
                return;
            };
            let v = w.load(Ordering::Acquire);
            if v == 0 {
                continue;
            }
            let s = ((v >> 32) & 0x7fff_ffff) as usize;
            let known = v >> 63 == 1 && s < l.ranks;
            if known && self.pool_bufs[s].contains(&(i as u32)) {
                continue;
            }
            let lost = known && self.tx.dests[s].lost;
            if lost && !notes_clear {
                continue;
            }
            // An honest sender claims for its `k`-th Medium only while fewer than the window
            // are unacknowledged, and acknowledged ones were delivered: `k - delivered` (mod
            // 2^32) is below the window.
            let window = known
                && (v as u32).wrapping_sub(self.rma_delivered[s] as u32) < l.rma_flight() as u32;
            if !lost && window {
                continue;
            }
            let freed = w
                .compare_exchange(v, 0, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
            if freed && !lost {
                self.tx.fault(misbehaved(
                    None,
                    format!(
                        "RMA Medium pool buffer {i} held by a claim no Medium will free ({v:#x})"
                    ),
                ));
            }
        }
    }
}
