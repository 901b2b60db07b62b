//! A multi-producer mailbox ring (EXTOLL VELO's receive queue): fixed-size slots whose
//! **status word is last**, claimed by senders of several processes with one compare-and-swap
//! on a tail word in the receiver's segment, and read by its one owner in ticket order.
//!
//! - ticket `t` uses slot `t % slots` in lap `t / slots`. The status word holds a stamp in its
//!   low [`STAMP_BITS`] bits, `lap + 1` once published, and 32 bits of the caller's meta data
//!   in the high bits (VELO: source, length, flags). A status from an earlier lap (or zeroed
//!   memory) is never taken for a published one;
//! - the owner publishes how many tickets it has **consumed** in a head word, in batches
//!   ([`Ring::consumed`]); it never writes the slots, so a packet costs one cache-line transfer
//!   to the sender (its write) and one back to the owner (its poll), as on the raw floor;
//! - **claim**: a sender reads the tail `t`, and if `t + n <= head + slots` (with a cached
//!   head, reloaded with `Acquire` only when it says "full") moves the tail to `t + n` with a
//!   compare-and-swap. No room: [`Ring::try_claim`] says so without waiting (back-pressure,
//!   never an overwrite);
//! - **write** the payload bytes, then **publish** with a `Release` store of the status; the
//!   owner loads the status of its next ticket with `Acquire` before it reads, and stores the
//!   head with `Release` after, so a sender's `Acquire` of the head orders its overwrite after
//!   the owner's reads.
//!
//! Zeroed memory is a valid empty ring. Senders need the receiver's segment mapped with
//! atomic access ([`attach`]), as an EXTOLL NIC claims slots in the receiver's queue.
//!
//! ```
//! use am_shm::{mailbox::Ring, Segment};
//! let ring = Ring { tail: 0, head: 64, data: 0, slots: 4, slot_size: 64 };
//! let seg = Segment::heap(128, ring.data_bytes());
//! let w = seg.import();
//! let mut cached = 0;
//! let t = ring.try_claim(&seg, 2, &mut cached).unwrap().expect("room"); // two slots
//! ring.write(&w, t, 0, b"first").unwrap();
//! ring.publish(&w, t, 7).unwrap();                              // meta 7
//! assert_eq!(ring.peek(&seg, 0).unwrap(), Some(7));            // owner: next ticket 0
//! assert_eq!(ring.payload(&seg, 0, 5).unwrap(), b"first");
//! ring.consumed(&w, 1).unwrap();                               // owner: ticket 0 done
//! assert_eq!(ring.peek(&seg, 1).unwrap(), None, "claimed, not yet published");
//! ```

use std::sync::atomic::Ordering;

use crate::{Imported, Segment, ShmError};

/// Bits of the status word that hold the stamp; the high 32 bits are the caller's meta data.
pub const STAMP_BITS: u32 = 32;
const STAMP_MASK: u64 = (1 << STAMP_BITS) - 1;
/// Bytes of a slot's status word (at the end of the slot).
pub const STATUS_LEN: usize = 8;

/// Maps segment `name` of job `job_id` with atomic access to its word area and slot words, as
/// a sender of a [`Ring`] in it needs (and reads, as an RMA engine's get needs). The file must
/// have exactly this layout; it is not removed when the mapping is dropped.
pub fn attach(job_id: &str, name: &str, words: usize, bytes: usize) -> Result<Segment, ShmError> {
    Segment::attach(job_id, name, words, bytes)
}

/// Where a ring lives in a segment; see the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ring {
    /// Byte offset of the tail word (the next ticket to claim) in the word area, 8-aligned.
    pub tail: usize,
    /// Byte offset of the head word (tickets the owner consumed) in the word area, 8-aligned,
    /// on another cache line than the tail.
    pub head: usize,
    /// Byte offset of the first slot in the byte area (8-aligned; 64 keeps slots in lines).
    pub data: usize,
    /// Number of slots (at least 1).
    pub slots: usize,
    /// Bytes per slot, status word included (a multiple of 8, at least 16).
    pub slot_size: usize,
}

impl Ring {
    /// Bytes of byte area the slots take.
    pub fn data_bytes(&self) -> usize {
        self.slots * self.slot_size
    }

    /// Payload bytes per slot (the slot without its status word).
    pub fn capacity(&self) -> usize {
        self.slot_size.saturating_sub(STATUS_LEN)
    }

    /// Byte offset of the slot of `ticket` (its payload; the status word is its last 8 bytes).
    #[inline]
    pub fn slot_base(&self, ticket: u64) -> usize {
        self.data + self.split(ticket).1 * self.slot_size
    }

    /// `(lap, slot)` of `ticket`: a shift and a mask for the usual power-of-two rings (a
    /// division costs more than the rest of a one-packet send).
    #[inline]
    fn split(&self, ticket: u64) -> (u64, usize) {
        // `slots >= 1` by contract; a zero ring is rejected by `check` instead of a panic.
        let n = self.slots.max(1) as u64;
        if n.is_power_of_two() {
            (ticket >> n.trailing_zeros(), (ticket & (n - 1)) as usize)
        } else {
            (ticket / n, (ticket % n) as usize)
        }
    }

    #[inline]
    fn status_off(&self, ticket: u64) -> usize {
        self.slot_base(ticket) + self.capacity()
    }

    #[inline]
    fn stamp(&self, ticket: u64) -> u64 {
        (self.split(ticket).0 + 1) & STAMP_MASK
    }

    fn check(&self, n: usize) -> Result<(), ShmError> {
        if self.slots == 0 || self.slot_size < 2 * STATUS_LEN || n == 0 || n > self.slots {
            return Err(ShmError::OutOfBounds {
                offset: 0,
                len: n,
                area: self.slots,
            });
        }
        Ok(())
    }

    /// Claims `n` consecutive slots (`1..=slots`) of the ring in `seg` (the receiver's
    /// segment, mapped by the sender with [`attach`] or shared in-process): returns the first
    /// ticket, or `None` if the ring has no room for `n` now. `head` is the sender's cached
    /// copy of the owner's head word (start with 0). Lock-free: a lost race retries.
    #[inline]
    pub fn try_claim(
        &self,
        seg: &Segment,
        n: usize,
        head: &mut u64,
    ) -> Result<Option<u64>, ShmError> {
        self.check(n)?;
        let tail = seg.word(self.tail)?;
        let mut t = tail.load(Ordering::Relaxed);
        loop {
            let end = t + n as u64;
            if end > *head + self.slots as u64 {
                *head = seg.word(self.head)?.load(Ordering::Acquire);
                if *head > t {
                    // Our tail was stale (the owner consumed tickets claimed since), or the
                    // head is corrupt: the owner cannot consume what was never claimed.
                    t = tail.load(Ordering::Relaxed);
                    if *head > t {
                        return Err(ShmError::OutOfBounds {
                            offset: self.head,
                            len: 8,
                            area: 8,
                        });
                    }
                    continue;
                }
                if end > *head + self.slots as u64 {
                    return Ok(None);
                }
            }
            match tail.compare_exchange_weak(t, end, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(Some(t)),
                Err(now) => t = now,
            }
        }
    }

    /// Writes `bytes` at `at` of the payload of the slot of `ticket` (claimed by the caller).
    #[inline]
    pub fn write(
        &self,
        to: &Imported,
        ticket: u64,
        at: usize,
        bytes: &[u8],
    ) -> Result<(), ShmError> {
        if at
            .checked_add(bytes.len())
            .is_none_or(|end| end > self.capacity())
        {
            return Err(ShmError::OutOfBounds {
                offset: at,
                len: bytes.len(),
                area: self.capacity(),
            });
        }
        to.write(self.slot_base(ticket) + at, bytes)
    }

    /// Publishes the slot of `ticket` with `meta` in the status word's high bits (a `Release`
    /// store after the payload, in the same line).
    #[inline]
    pub fn publish(&self, to: &Imported, ticket: u64, meta: u32) -> Result<(), ShmError> {
        let status = (meta as u64) << STAMP_BITS | self.stamp(ticket);
        to.store_slot_word(self.status_off(ticket), status)
    }

    /// The owner's look at its next ticket `head`: the meta data if it is published
    /// (`Acquire`), else `None`.
    #[inline]
    pub fn peek(&self, seg: &Segment, head: u64) -> Result<Option<u32>, ShmError> {
        let status = seg.load_slot_word(self.status_off(head))?;
        if status & STAMP_MASK == self.stamp(head) {
            Ok(Some((status >> STAMP_BITS) as u32))
        } else {
            Ok(None)
        }
    }

    /// Lends the first `len` payload bytes of the published slot of `head` (`len` is
    /// checked against the slot's capacity: it may come from the untrusted meta data).
    #[inline]
    pub fn payload<'a>(
        &self,
        seg: &'a Segment,
        head: u64,
        len: usize,
    ) -> Result<&'a [u8], ShmError> {
        if len > self.capacity() {
            return Err(ShmError::OutOfBounds {
                offset: 0,
                len,
                area: self.capacity(),
            });
        }
        seg.bytes(self.slot_base(head), len)
    }

    /// The owner has consumed every ticket below `head` (`Release`: after its reads); their
    /// slots may be claimed again. Call it in batches: each store moves a cache line.
    #[inline]
    pub fn consumed(&self, own: &Imported, head: u64) -> Result<(), ShmError> {
        own.store_word(self.head, head)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn ring(slots: usize) -> Ring {
        Ring {
            tail: 64,
            head: 128,
            data: 64,
            slots,
            slot_size: 32,
        }
    }

    #[test]
    fn claim_until_full_then_consumed_frees_in_order() {
        let r = ring(4);
        let seg = Segment::heap(192, 64 + r.data_bytes());
        let w = seg.import();
        let mut h = 0;
        assert_eq!(r.try_claim(&seg, 3, &mut h).unwrap(), Some(0));
        assert_eq!(r.try_claim(&seg, 2, &mut h).unwrap(), None, "only one left");
        assert_eq!(r.try_claim(&seg, 1, &mut h).unwrap(), Some(3));
        assert_eq!(
            r.try_claim(&seg, 1, &mut h).unwrap(),
            None,
            "full: no overwrite"
        );
        assert!(r.try_claim(&seg, 5, &mut h).is_err(), "more than the ring");
        assert!(r.try_claim(&seg, 0, &mut h).is_err());
        for t in 0..4 {
            r.write(&w, t, 0, &[t as u8; 24]).unwrap();
            r.publish(&w, t, 100 + t as u32).unwrap();
        }
        assert!(r.write(&w, 0, 20, &[0; 5]).is_err(), "past the payload");
        assert_eq!(
            r.try_claim(&seg, 1, &mut h).unwrap(),
            None,
            "published, not consumed"
        );
        for t in 0..2 {
            assert_eq!(r.peek(&seg, t).unwrap(), Some(100 + t as u32));
            assert_eq!(r.payload(&seg, t, 24).unwrap(), &[t as u8; 24]);
        }
        assert!(r.payload(&seg, 2, 25).is_err());
        assert_eq!(r.try_claim(&seg, 1, &mut h).unwrap(), None, "not yet told");
        r.consumed(&w, 2).unwrap();
        assert_eq!(
            r.try_claim(&seg, 2, &mut h).unwrap(),
            Some(4),
            "two slots freed, lap 1"
        );
        assert_eq!(
            r.peek(&seg, 4).unwrap(),
            None,
            "lap 0's status is not lap 1's"
        );
        assert_eq!(r.peek(&seg, 2).unwrap(), Some(102));
    }

    /// Three senders race for slots of one ring, with multi-slot claims; the owner sees every
    /// message exactly once, intact, and each sender's in its order.
    #[test]
    fn many_senders_one_owner() {
        let r = ring(8);
        let seg = Segment::heap(192, 64 + r.data_bytes());
        let per: u32 = if cfg!(miri) { 12 } else { 3000 };
        let senders = 3u32;
        std::thread::scope(|s| {
            for id in 0..senders {
                let (seg, r) = (&seg, r);
                s.spawn(move || {
                    let w = seg.import();
                    let mut cached = 0;
                    for seq in 0..per {
                        // Messages of 1 or 2 slots: (sender, seq, part) in each.
                        let n = 1 + (seq % 2) as usize;
                        let t = loop {
                            match r.try_claim(seg, n, &mut cached).unwrap() {
                                Some(t) => break t,
                                None => std::thread::yield_now(),
                            }
                        };
                        for part in 0..n as u64 {
                            let mut body = [0u8; 24];
                            body[..4].copy_from_slice(&id.to_le_bytes());
                            body[4..8].copy_from_slice(&seq.to_le_bytes());
                            body[8] = part as u8;
                            r.write(&w, t + part, 0, &body).unwrap();
                            r.publish(&w, t + part, id << 8 | n as u32).unwrap();
                        }
                    }
                });
            }
            let own = seg.import();
            let mut next: HashMap<u32, u32> = HashMap::new();
            let total: u32 = (0..per).map(|q| 1 + q % 2).sum::<u32>() * senders;
            let mut head = 0u64;
            let mut part_expected = 0u8;
            while head < total as u64 {
                let Some(meta) = r.peek(&seg, head).unwrap() else {
                    // Batched: tell the senders only when idle.
                    r.consumed(&own, head).unwrap();
                    std::thread::yield_now();
                    continue;
                };
                let body = r.payload(&seg, head, 24).unwrap();
                let id = u32::from_le_bytes(body[..4].try_into().unwrap());
                let seq = u32::from_le_bytes(body[4..8].try_into().unwrap());
                assert_eq!(meta, id << 8 | (1 + seq % 2));
                assert_eq!(body[8], part_expected, "parts of a claim are consecutive");
                if body[8] as u32 + 1 == meta & 0xff {
                    let e = next.entry(id).or_insert(0);
                    assert_eq!(seq, *e, "per-sender order");
                    *e += 1;
                    part_expected = 0;
                } else {
                    part_expected += 1;
                }
                head += 1;
                if head % 4 == 0 {
                    r.consumed(&own, head).unwrap();
                }
            }
            assert!(next.values().all(|&n| n == per));
        });
    }

    /// A ring of a size that is not a power of two takes the division path: laps and slots
    /// still line up over several laps.
    #[test]
    fn odd_sized_ring_laps() {
        let r = ring(3);
        let seg = Segment::heap(192, 64 + r.data_bytes());
        let w = seg.import();
        let mut h = 0;
        for t in 0..10u64 {
            assert_eq!(r.try_claim(&seg, 1, &mut h).unwrap(), Some(t));
            assert_eq!(r.slot_base(t), 64 + (t % 3) as usize * 32);
            r.write(&w, t, 0, &[t as u8]).unwrap();
            r.publish(&w, t, t as u32).unwrap();
            assert_eq!(r.peek(&seg, t).unwrap(), Some(t as u32));
            assert_eq!(r.peek(&seg, t + 3).unwrap(), None, "next lap");
            r.consumed(&w, t + 1).unwrap();
        }
    }

    #[test]
    fn corrupt_words_are_never_taken_for_room_or_data() {
        let r = ring(2);
        let seg = Segment::heap(192, 64 + r.data_bytes());
        let w = seg.import();
        // Junk in slot 0's status: not lap 0's stamp (1).
        w.store_slot_word(64 + 24, 0xdead_0000_0007).unwrap();
        assert_eq!(r.peek(&seg, 0).unwrap(), None);
        // A head beyond the tail: an error, not room to overwrite.
        let mut h = 0;
        assert_eq!(r.try_claim(&seg, 2, &mut h).unwrap(), Some(0));
        w.store_word(128, 99).unwrap();
        assert!(r.try_claim(&seg, 1, &mut h).is_err());
    }
}
