//! A multi-producer mailbox ring (EXTOLL VELO's receive queue, and its RMA notification
//! queue): fixed-size slots claimed slot by slot by senders of several processes, and read
//! by its one owner in ticket order.
//!
//! It is a [claimed ring](crate::claim) whose slots lie in the segment's byte area, each a
//! payload followed by its status word; the claim, the claimer's record, the publication
//! and the owner's take-over are that module's. What the mailbox adds:
//!
//! - the head the sender caches (reloaded with `Acquire` when it says "full");
//! - a claim of `n` slots (a multi-packet message) takes them one by one (they need not be
//!   consecutive: the owner reassembles per source) and is all or nothing: a sender that
//!   cannot get all of them marks the ones it got `SKIPPED` and reports "no room";
//! - payload writes as whole words, and a status that carries the sender's meta data (VELO:
//!   source, length, flags);
//! - the owner's head published in batches ([`Ring::consumed`]).
//!
//! Zeroed memory is a valid empty ring. Senders need the receiver's segment mapped with
//! atomic access ([`attach`]), as an EXTOLL NIC claims slots in the receiver's queue.
//!
//! A hot path keeps handles that check the ring against its segment once, when made: a
//! sender's [`Port`] ([`Ring::port`]: the one-slot send in one step, runs of slots, packets
//! of a claim) and the owner's [`Inbox`] ([`Ring::inbox`]: looks, payloads, and the owner's
//! head with its slot and lap kept as it moves, so no ticket is divided). Their accesses
//! check nothing of the layout again, only lengths, and run the same protocol as the
//! `Ring` methods ([`Ring::send_one`] is a port made for the call).
//!
//! ```
//! use am_shm::mailbox::{Ring, Seen};
//! use am_shm::Segment;
//! let ring = Ring::new(0, 64, 0, 4, 64).unwrap(); // tail, head, data, slots, slot size
//! let seg = Segment::heap(192, ring.data_bytes()).unwrap();
//! let w = seg.import();
//! let (mut head, mut got) = (0, [0u64; 2]);
//! assert!(ring.try_claim(&seg, 2, 9, 128, &mut head, &mut got).unwrap()); // claimer 9
//! assert_eq!(got, [0, 1]);
//! assert_eq!(ring.look(&seg, 0).unwrap(), Seen::Claimed(9));
//! ring.write(&w, 0, 0, b"first").unwrap();
//! ring.publish(&w, 0, 7).unwrap();                               // meta 7
//! ring.skip(&w, 1, 9).unwrap();                                  // not needed after all
//! ring.release(&w, 128).unwrap();                                // claims done
//! assert_eq!(ring.look(&seg, 0).unwrap(), Seen::Published(7)); // owner: next ticket 0
//! let mut bytes = [0u8; 5];
//! ring.read_payload(&seg, 0, &mut bytes).unwrap();
//! assert_eq!(&bytes, b"first");
//! assert_eq!(ring.look(&seg, 1).unwrap(), Seen::Skipped(9));
//! ring.consumed(&w, 2).unwrap();                                 // owner: tickets 0, 1 done
//! assert_eq!(ring.look(&seg, 2).unwrap(), Seen::Empty);
//! ```

use crate::claim::{self, Claimant, Laps, ACTIVE};
use crate::mapping::WORD;
use crate::sync::{AtomicU64, Ordering};
use crate::{Imported, Segment, SharedBytes, ShmError, Slot};

pub use crate::claim::{Seen, OWNER, STAMP_BITS};

/// Bytes of a slot's status word (at the end of the slot).
pub const STATUS_LEN: usize = 8;

/// Maps segment `name` of job `job_id` with atomic access to its word area and slot words, as
/// a sender of a [`Ring`] in it needs (and reads, as an RMA engine's get needs). The file must
/// have exactly this layout; it is not removed when the mapping is dropped.
#[cfg(not(loom))]
pub fn attach(job_id: &str, name: &str, words: usize, bytes: usize) -> Result<Segment, ShmError> {
    Segment::attach(job_id, name, words, bytes)
}

/// Where a ring lives in a segment; see the [module docs](self). Made by [`Ring::new`], which
/// checks the geometry once, so the hot paths do not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ring {
    tail: usize,
    head: usize,
    data: usize,
    slots: usize,
    slot_size: usize,
    laps: Laps,
}

impl Ring {
    /// A ring with its tail word at `tail` and head word at `head` in the word area (8-aligned,
    /// on different cache lines), and `slots` slots (at least 1; a power of two is cheapest)
    /// of `slot_size` bytes each (a multiple of 8, at least 16, status word included) from
    /// byte `data` of the byte area (8-aligned; 64 keeps slots in lines). An error for a
    /// geometry no ring can have; whether it fits a segment is checked at each access.
    pub fn new(
        tail: usize,
        head: usize,
        data: usize,
        slots: usize,
        slot_size: usize,
    ) -> Result<Ring, ShmError> {
        let bad = slots == 0
            || slot_size < 2 * STATUS_LEN
            || !slot_size.is_multiple_of(8)
            || slots.checked_mul(slot_size).is_none()
            || !tail.is_multiple_of(8)
            || !head.is_multiple_of(8)
            || !data.is_multiple_of(8);
        let laps = Laps::new(slots as u64).filter(|_| !bad);
        let Some(laps) = laps else {
            return Err(ShmError::OutOfBounds {
                offset: data,
                len: slot_size,
                area: slots,
            });
        };
        Ok(Ring {
            tail,
            head,
            data,
            slots,
            slot_size,
            laps,
        })
    }

    /// Byte offset of the tail word (a hint: at or below the next ticket to claim) in the
    /// word area.
    pub fn tail(&self) -> usize {
        self.tail
    }

    /// Byte offset of the head word (tickets the owner consumed) in the word area.
    pub fn head(&self) -> usize {
        self.head
    }

    /// Byte offset of the first slot in the byte area.
    pub fn data(&self) -> usize {
        self.data
    }

    /// Number of slots.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Bytes per slot, status word included.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Bytes of byte area the slots take.
    pub fn data_bytes(&self) -> usize {
        self.slots.saturating_mul(self.slot_size)
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
    #[inline(always)]
    fn split(&self, ticket: u64) -> (u64, usize) {
        self.laps.split(ticket)
    }

    /// The ring's lap arithmetic (status values of its tickets).
    #[inline(always)]
    pub fn laps(&self) -> &Laps {
        &self.laps
    }

    #[inline]
    fn status_off(&self, ticket: u64) -> usize {
        self.slot_base(ticket) + self.capacity()
    }

    #[inline]
    fn status<'s>(&self, seg: &'s Segment, ticket: u64) -> Result<&'s AtomicU64, ShmError> {
        seg.slot_word(self.status_off(ticket))
    }

    fn check(&self, n: usize) -> Result<(), ShmError> {
        if n == 0 || n > self.slots {
            return Err(ShmError::OutOfBounds {
                offset: 0,
                len: n,
                area: self.slots,
            });
        }
        Ok(())
    }

    /// Claims `n` slots (`1..=slots`, `out.len() >= n`) of the ring in `seg` (the receiver's
    /// segment, mapped by the sender with [`attach`] or shared in-process) for `claimer`, whose
    /// record word is at `record` in the word area: their tickets go to `out[..n]`, in
    /// increasing order. `Ok(false)` if the ring has no room for all `n` now (nothing stays
    /// claimed). `head` is the sender's cached copy of the owner's head (start with 0).
    /// After publishing (or skipping) every claimed slot, call [`release`](Self::release);
    /// several claims may be open before one release (the record keeps vouching for the
    /// lowest). An error (a corrupt ring) resets `head`.
    #[inline]
    pub fn try_claim(
        &self,
        seg: &Segment,
        n: usize,
        claimer: u32,
        record: usize,
        head: &mut u64,
        out: &mut [u64],
    ) -> Result<bool, ShmError> {
        self.check(n)?;
        if out.len() < n {
            return Err(ShmError::OutOfBounds {
                offset: 0,
                len: n,
                area: out.len(),
            });
        }
        let tail = seg.word(self.tail)?;
        let record = seg.word(record)?;
        // Only this claimer writes its record: a claim still open (not yet released) keeps
        // vouching for its tickets, so the record only ever goes down while claims are open.
        let before = record.load(Ordering::Relaxed);
        if n == 1 && before == 0 {
            if let Some((t, _)) = self.claim_at_tail(seg, tail, record, *head, claimer)? {
                out[0] = t;
                return Ok(true);
            }
        }
        let mut c = Claimer {
            record,
            recorded: (before & ACTIVE != 0).then_some(before & !ACTIVE),
            claimer,
        };
        let mut cursor = tail.load(Ordering::Relaxed);
        if !self.room_for(seg, n, head, cursor)? {
            return Ok(false);
        }
        let slots = Slots { ring: self, seg };
        let head_word = seg.word(self.head)?;
        for k in 0..n {
            match claim::claim_next::<_, _, false>(
                &slots,
                tail,
                head_word,
                head,
                &mut cursor,
                &mut c,
            ) {
                Ok(Some(t)) => out[k] = t,
                other => {
                    // Give back what was taken: those slots are ours, the owner skips them.
                    for &t in &out[..k] {
                        self.status(seg, t)?
                            .store(self.laps.skipped(t, claimer), Ordering::Release);
                    }
                    record.store(before, Ordering::Release);
                    if other.is_err() {
                        // The head cache may hold a corrupt value: start over next time.
                        *head = 0;
                    }
                    return other.map(|_| false);
                }
            }
        }
        Ok(true)
    }

    /// The common claim, one packet and no claim open: the slot at the tail hint, free by
    /// the cached `head` and last written in the previous lap, claimed with one CAS; returns
    /// its ticket and the slot (checked once). `None`: take the general path.
    #[inline(always)]
    fn claim_at_tail<'s>(
        &self,
        seg: &'s Segment,
        tail: &AtomicU64,
        record: &AtomicU64,
        head: u64,
        claimer: u32,
    ) -> Result<Option<(u64, Slot<'s>)>, ShmError> {
        let t = tail.load(Ordering::Relaxed);
        if t < head || t - head >= self.slots as u64 {
            return Ok(None);
        }
        let slot = seg.slot(self.slot_base(t), self.slot_size)?;
        let word = slot.last_word();
        let st = word.load(Ordering::Acquire);
        if !self.laps.is_free(st, t) {
            return Ok(None);
        }
        record.store(claim::record(t), Ordering::Relaxed);
        if claim::try_slot(&self.laps, word, t, st, claimer).is_err() {
            record.store(0, Ordering::Relaxed);
            return Ok(None);
        }
        // Wrapping: the last ticket there is may be claimed (a corrupt tail and head); the
        // hint then points below the head, and the next claim walks from the head.
        tail.store(t.wrapping_add(1), Ordering::Release);
        Ok(Some((t, slot)))
    }

    /// A one-packet message in one step, as the VELO send does it: claims one slot for
    /// `claimer` (as [`try_claim`](Self::try_claim) with `n == 1`), stores the concatenation
    /// of `parts` (at most [`capacity`](Self::capacity) bytes) as its payload, publishes it
    /// with `meta` and releases the claim. `Ok(false)`: no room now (nothing claimed or
    /// written). On an error nothing stays claimed. The same code as [`Port::send_parts`]
    /// (a [`Port`] made for the call): a sender that sends often keeps its port instead.
    #[inline]
    pub fn send_one(
        &self,
        seg: &Segment,
        claimer: u32,
        record: usize,
        head: &mut u64,
        parts: &[&[u8]],
        meta: u32,
    ) -> Result<bool, ShmError> {
        self.port(seg, claimer, record)?
            .send_parts(head, parts, meta)
    }

    /// Whether `n` slots from the tail hint `t` may be free: false only if the (reloaded)
    /// head says they are not and the hint is one a claim produced (the slot before it is
    /// this lap's), so a corrupt hint never refuses for ever. Keeps a claim that cannot be
    /// whole from taking (and wasting) the slots that are free.
    #[inline(always)]
    fn room_for(&self, seg: &Segment, n: usize, head: &mut u64, t: u64) -> Result<bool, ShmError> {
        let slots = self.slots as u64;
        let fits = |h: u64| t < h || t - h <= slots - n as u64;
        if fits(*head) {
            return Ok(true);
        }
        *head = (*head).max(seg.word(self.head)?.load(Ordering::Acquire));
        if fits(*head) || t - *head > slots {
            return Ok(true);
        }
        let before = t - 1;
        let st = self.status(seg, before)?.load(Ordering::Acquire);
        Ok(before < *head || !self.laps.is_taken(st, before))
    }

    /// Takes for writing (a hint: [`Imported::prefetch_for_write`]) the line of the slot
    /// `ahead` tickets past the tail hint, which the owner has read and a sender streaming
    /// into the ring fills soon; so that a claim's compare-and-swap, which waits for the
    /// stores before it, finds that slot's line already ours. The hint is a peer-written
    /// word: any value names some slot of the ring, and a wrong one only wastes the hint.
    #[inline(always)]
    pub fn prefetch_ahead(&self, seg: &Segment, to: &Imported, ahead: u64) {
        if let Ok(tail) = seg.word(self.tail) {
            let t = tail.load(Ordering::Relaxed).wrapping_add(ahead);
            to.prefetch_for_write(self.slot_base(t));
        }
    }

    /// Writes `bytes` at `at` of the payload of the slot of `ticket` (claimed by the caller),
    /// as whole words from `at` (8-aligned): the last one padded with zeros.
    #[inline]
    pub fn write(
        &self,
        to: &Imported,
        ticket: u64,
        at: usize,
        bytes: &[u8],
    ) -> Result<(), ShmError> {
        self.write_parts(to, ticket, at, &[bytes])
    }

    /// [`write`](Self::write) of the concatenation of `parts`.
    #[inline]
    pub fn write_parts(
        &self,
        to: &Imported,
        ticket: u64,
        at: usize,
        parts: &[&[u8]],
    ) -> Result<(), ShmError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if !at.is_multiple_of(8) || at.checked_add(len).is_none_or(|end| end > self.capacity()) {
            return Err(ShmError::OutOfBounds {
                offset: at,
                len,
                area: self.capacity(),
            });
        }
        // The padding stays inside the payload: `capacity` is a multiple of 8.
        to.write_padded(self.slot_base(ticket) + at, parts)
            .map(|_| ())
    }

    /// [`write_parts`](Self::write_parts) of `parts` followed by the shared bytes `tail` (a
    /// received payload being echoed or forwarded), which move straight into the slot.
    #[inline]
    pub fn write_parts_then(
        &self,
        to: &Imported,
        ticket: u64,
        at: usize,
        parts: &[&[u8]],
        tail: SharedBytes<'_>,
    ) -> Result<(), ShmError> {
        let len = parts
            .iter()
            .map(|p| p.len())
            .sum::<usize>()
            .saturating_add(tail.len());
        if !at.is_multiple_of(8) || at.checked_add(len).is_none_or(|end| end > self.capacity()) {
            return Err(ShmError::OutOfBounds {
                offset: at,
                len,
                area: self.capacity(),
            });
        }
        to.write_padded_then(self.slot_base(ticket) + at, parts, tail)
            .map(|_| ())
    }

    /// Publishes the slot of `ticket` with `meta` (a `Release` store after the payload, in the
    /// same line).
    #[inline]
    pub fn publish(&self, to: &Imported, ticket: u64, meta: u32) -> Result<(), ShmError> {
        to.store_slot_word(self.status_off(ticket), self.laps.published(ticket, meta))
    }

    /// [`write_parts`](Self::write_parts) of `parts` from the start of the claimed slot of
    /// `ticket`, then [`publish`](Self::publish) with `meta`, the slot checked once for both:
    /// one packet of a multi-packet message.
    #[inline]
    pub fn write_and_publish(
        &self,
        to: &Imported,
        ticket: u64,
        parts: &[&[u8]],
        meta: u32,
    ) -> Result<(), ShmError> {
        let slot = to.slot(self.slot_base(ticket), self.slot_size)?;
        slot.store_padded(self.capacity(), parts)?;
        slot.last_word()
            .store(self.laps.published(ticket, meta), Ordering::Release);
        Ok(())
    }

    /// Gives up the claimed slot of `ticket` unused: the owner consumes it without delivering
    /// anything.
    #[inline]
    pub fn skip(&self, to: &Imported, ticket: u64, claimer: u32) -> Result<(), ShmError> {
        to.store_slot_word(self.status_off(ticket), self.laps.skipped(ticket, claimer))
    }

    /// Ends a claimer's open claims (all published or skipped): clears its record.
    #[inline]
    pub fn release(&self, to: &Imported, record: usize) -> Result<(), ShmError> {
        to.store_word(record, 0)
    }

    /// What the owner finds at `ticket` (`Acquire`): an error for a status no claimer could
    /// have written there (see [`repair`](Self::repair)).
    #[inline]
    pub fn look(&self, seg: &Segment, ticket: u64) -> Result<Seen, ShmError> {
        let st = seg.load_slot_word(self.status_off(ticket))?;
        self.laps.look(st, ticket)
    }

    /// Whether `claimer`'s record (the word at `record`) vouches for its claim of `ticket`:
    /// `ACTIVE`, from a ticket at or below it. A `CLAIMED` status its claimer does not vouch
    /// for was written by someone else; skip it ([`repair`](Self::repair)).
    pub fn claim_is_genuine(&self, seg: &Segment, ticket: u64, record: usize) -> bool {
        seg.load_word(record)
            .is_ok_and(|r| claim::vouches(r, ticket))
    }

    /// The owner takes over the slot of `ticket`, whose status `look` reported corrupt, or
    /// claimed by a dead claimer or by one that does not vouch for it: it marks it skipped
    /// (with a compare-and-swap, so a status that changed meanwhile is kept), so the next
    /// lap's claimer finds it free. The caller then consumes the ticket.
    pub fn repair(&self, seg: &Segment, ticket: u64) -> Result<(), ShmError> {
        claim::repair(&self.laps, self.status(seg, ticket)?, ticket);
        Ok(())
    }

    /// The owner's look past an `Empty` ticket `head` (when idle): the run of holes from
    /// `head` below a later claim of this lap (a corrupt tail or head sent the claims past
    /// them), each marked skipped with a compare-and-swap (a claimer that takes one first
    /// keeps it); how many, which the caller then consumes. One pass
    /// ([`claim::fill_holes`]).
    pub fn fill_holes(&self, seg: &Segment, head: u64) -> Result<u64, ShmError> {
        claim::fill_holes(&Slots { ring: self, seg }, head)
    }

    /// A view of the first `len` payload bytes of the published slot of `head` (`len` is
    /// checked against the slot's capacity: it may come from the untrusted meta data).
    #[inline]
    pub fn payload<'a>(
        &self,
        seg: &'a Segment,
        head: u64,
        len: usize,
    ) -> Result<SharedBytes<'a>, ShmError> {
        if len > self.capacity() {
            return Err(ShmError::OutOfBounds {
                offset: 0,
                len,
                area: self.capacity(),
            });
        }
        seg.view(self.slot_base(head), len)
    }

    /// Copies the first `dst.len()` payload bytes of the published slot of `head` out.
    #[inline]
    pub fn read_payload(&self, seg: &Segment, head: u64, dst: &mut [u8]) -> Result<(), ShmError> {
        self.payload(seg, head, dst.len())?.read(0, dst)
    }

    /// The owner has consumed every ticket below `head` (`Release`: after its reads); their
    /// slots may be claimed again. Call it in batches: each store moves a cache line.
    #[inline]
    pub fn consumed(&self, own: &Imported, head: u64) -> Result<(), ShmError> {
        own.store_word(self.head, head)
    }
}

/// Mapping offsets of a ring's tail, head and record words and of its first slot, checked
/// against one segment by [`Ring::checked`]: the three words lie 8-aligned in that segment's
/// word area, and every slot `data + i * slot_size` (`i < slots`) whole in its byte area.
/// The handles ([`Port`], [`Inbox`]) keep one beside a share of the segment it was checked
/// against, and their `unsafe` blocks rely on that pairing, which nothing outside this
/// module can break (the fields are private and a segment's size never changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Checked {
    tail: usize,
    head: usize,
    record: usize,
    data: usize,
}

impl Ring {
    /// This ring's offsets in `seg` with `record` as the claimer's record word, checked once.
    fn checked(&self, seg: &Segment, record: usize) -> Result<Checked, ShmError> {
        seg.word(self.tail)?;
        seg.word(self.head)?;
        seg.word(record)?;
        // The whole ring as one run: 8-aligned, whole words, inside the byte area.
        seg.slot(self.data, self.data_bytes())?;
        Ok(Checked {
            tail: self.tail,
            head: self.head,
            record,
            data: seg.byte_base() + self.data,
        })
    }

    /// A sender's handle on this ring in `seg` (the receiver's segment, mapped as for
    /// [`try_claim`](Self::try_claim)) for `claimer`, whose record word is at `record`:
    /// the ring's words and slots are checked here, once, so its sends check nothing more
    /// of the layout. An error if they do not fit `seg`.
    pub fn port(&self, seg: &Segment, claimer: u32, record: usize) -> Result<Port, ShmError> {
        Ok(Port {
            c: self.checked(seg, record)?,
            seg: seg.share(),
            ring: *self,
            claimer,
        })
    }

    /// The owner's handle on this ring in its own segment `seg`: the ring's words and slots
    /// are checked here, once, so its looks and reads check nothing more of the layout.
    pub fn inbox(&self, seg: &Segment) -> Result<Inbox, ShmError> {
        Ok(Inbox {
            c: self.checked(seg, self.tail)?,
            seg: seg.share(),
            ring: *self,
            head: 0,
            head_slot: 0,
            head_lap: 0,
            head_pub: Laps::published_low(0),
        })
    }
}

/// The bytes of `parts` together (saturating: for an error message).
fn parts_len(parts: &[&[u8]]) -> usize {
    parts.iter().fold(0, |n, p| n.saturating_add(p.len()))
}

/// One claimer's handle on a [`Ring`] in a receiver's segment ([`Ring::port`]): the ring's
/// words and slots checked once when made, so that a one-packet send is the claim, the
/// stores and the publication, with no bounds check left but the payload's length.
pub struct Port {
    seg: Segment,
    ring: Ring,
    /// Checked against `seg` (see [`Checked`]).
    c: Checked,
    claimer: u32,
}

impl Port {
    /// The ring.
    #[inline]
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// The receiver's segment this port sends into.
    #[inline]
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    #[inline(always)]
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: `c.tail` was checked against `seg`'s mapping (8-aligned, inside the word
        // area), whose size never changes.
        unsafe { self.seg.mapping().word64(self.c.tail) }
    }

    #[inline(always)]
    fn record(&self) -> &AtomicU64 {
        // SAFETY: as in `tail`, for `c.record`.
        unsafe { self.seg.mapping().word64(self.c.record) }
    }

    /// The slot of `ticket`, with no check: `split` gives an index below `slots`.
    #[inline(always)]
    fn slot(&self, ticket: u64) -> Slot<'_> {
        self.slot_at(self.ring.split(ticket).1)
    }

    /// The common claim, as [`Ring::try_claim`]'s first step: the slot at the tail hint, if
    /// free by the cached `head` and last written in the previous lap, claimed with one
    /// compare-and-swap (the record first). Its ticket and slot; `None`: take the
    /// general path.
    #[inline(always)]
    fn claim_at_tail(&self, record: &AtomicU64, head: u64) -> Option<(u64, Slot<'_>)> {
        let tail = self.tail();
        let t = tail.load(Ordering::Relaxed);
        if t < head || t - head >= self.ring.slots as u64 {
            return None;
        }
        let laps = &self.ring.laps;
        let slot = self.slot_at(laps.split(t).1);
        let word = slot.last_word();
        let st = word.load(Ordering::Acquire);
        if !laps.is_free(st, t) {
            return None;
        }
        record.store(claim::record(t), Ordering::Relaxed);
        if claim::try_slot(laps, word, t, st, self.claimer).is_err() {
            record.store(0, Ordering::Relaxed);
            return None;
        }
        // Wrapping, as in `Ring::claim_at_tail`.
        tail.store(t.wrapping_add(1), Ordering::Release);
        Some((t, slot))
    }

    /// Slot `i` (below `slots`), with no check.
    #[inline(always)]
    fn slot_at(&self, i: usize) -> Slot<'_> {
        let at = self.c.data + i * self.ring.slot_size;
        // SAFETY: `i < slots`, so `[at, at + slot_size)` lies in the ring's run, checked
        // 8-aligned inside `seg`'s mapping; `slot_size` is a positive multiple of 8
        // (`Ring::new`).
        unsafe { Slot::unchecked(self.seg.mapping(), at, self.ring.slot_size) }
    }

    /// The general claim of one slot ([`Ring::try_claim`]), off the common path.
    #[cold]
    #[inline(never)]
    fn claim_slow(&self, head: &mut u64) -> Result<Option<(u64, Slot<'_>)>, ShmError> {
        let mut t = [0u64; 1];
        let (c, r) = (self.claimer, self.c.record);
        if !self.ring.try_claim(&self.seg, 1, c, r, head, &mut t)? {
            return Ok(None);
        }
        Ok(Some((t[0], self.slot(t[0]))))
    }

    /// Claims one slot, lets `write` store the payload into it (given the payload capacity;
    /// `None`: it does not fit), publishes it with `meta`, or skips it if it did not fit
    /// (the error says `len()` bytes), and releases the claim.
    #[inline(always)]
    fn send_with(
        &self,
        head: &mut u64,
        meta: u32,
        len: impl FnOnce() -> usize,
        write: impl FnOnce(&Slot<'_>, usize) -> Option<usize>,
    ) -> Result<bool, ShmError> {
        let record = self.record();
        // A record that is not clear (a claim open, or a value the receiver wrote): the
        // general path, which keeps tickets in order and any value of it harmless.
        let fast = if record.load(Ordering::Relaxed) == 0 {
            self.claim_at_tail(record, *head)
        } else {
            None
        };
        let (t, slot) = match fast {
            Some(claimed) => claimed,
            None => match self.claim_slow(head)? {
                Some(claimed) => claimed,
                None => return Ok(false),
            },
        };
        let written = write(&slot, self.ring.capacity()).is_some();
        // Not written: given up, so the owner skips it and no claim stays open.
        let status = if written {
            self.ring.laps.published(t, meta)
        } else {
            self.ring.laps.skipped(t, self.claimer)
        };
        slot.last_word().store(status, Ordering::Release);
        record.store(0, Ordering::Release);
        if !written {
            return Err(self.too_long(len()));
        }
        Ok(true)
    }

    /// The error for a payload of `len` bytes that does not fit a slot.
    #[cold]
    fn too_long(&self, len: usize) -> ShmError {
        ShmError::OutOfBounds {
            offset: 0,
            len,
            area: self.ring.capacity(),
        }
    }

    /// A one-packet message: `a` then `b` (a head and a private payload, at most
    /// [`Ring::capacity`] bytes together), claimed, stored, published with `meta` and
    /// released in one step. `Ok(false)`: no room now (nothing claimed). On an error nothing
    /// stays claimed.
    #[inline(always)]
    pub fn send(&self, head: &mut u64, a: &[u8], b: &[u8], meta: u32) -> Result<bool, ShmError> {
        let len = || a.len().saturating_add(b.len());
        self.send_with(head, meta, len, |slot, cap| slot.store_two(cap, a, b))
    }

    /// [`send`](Self::send) of `parts` followed by the shared bytes `tail` (a received
    /// payload echoed), which move straight into the slot.
    #[inline]
    pub fn send_then(
        &self,
        head: &mut u64,
        parts: &[&[u8]],
        tail: SharedBytes<'_>,
        meta: u32,
    ) -> Result<bool, ShmError> {
        let len = || parts_len(parts).saturating_add(tail.len());
        self.send_with(head, meta, len, |slot, cap| {
            slot.store_padded_then(cap, parts, tail)
        })
    }

    /// [`send`](Self::send) of the concatenation of `parts` ([`Ring::send_one`]).
    #[inline]
    pub fn send_parts(&self, head: &mut u64, parts: &[&[u8]], meta: u32) -> Result<bool, ShmError> {
        let len = || parts_len(parts);
        self.send_with(head, meta, len, |slot, cap| {
            slot.store_padded(cap, parts).ok()
        })
    }

    /// Claims one slot for this port's claimer (as [`Ring::try_claim`] with `n == 1`, the
    /// slot at the tail hint first): its ticket, `None` if there is no room now (nothing
    /// claimed). Publish it ([`write_two`](Self::write_two)) or [`skip`](Self::skip) it,
    /// then [`release`](Self::release).
    #[inline]
    pub fn claim_one(&self, head: &mut u64) -> Result<Option<u64>, ShmError> {
        let record = self.record();
        if record.load(Ordering::Relaxed) == 0 {
            if let Some((t, _)) = self.claim_at_tail(record, *head) {
                return Ok(Some(t));
            }
        }
        Ok(self.claim_slow(head)?.map(|(t, _)| t))
    }

    /// [`Ring::try_claim`] for this port's claimer: `n` slots, all or none.
    #[inline]
    pub fn try_claim(&self, n: usize, head: &mut u64, out: &mut [u64]) -> Result<bool, ShmError> {
        self.ring
            .try_claim(&self.seg, n, self.claimer, self.c.record, head, out)
    }

    /// Claims `n` consecutive slots from the tail hint (`1..=slots`), all or none, when the
    /// cached `head` says they are free and no claim of this port is open: the usual claim
    /// of a message of several packets, one compare-and-swap per slot and no list of
    /// tickets (they are `t..t + n`). `None`: nothing stays claimed (slots taken before a
    /// failure are skipped, as [`Ring::try_claim`] gives them back); take the general claim.
    /// Release the claim ([`release`](Self::release)) once every slot is published.
    #[inline]
    pub fn claim_run(&self, n: usize, head: u64) -> Option<u64> {
        let record = self.record();
        let tail = self.tail();
        let slots = self.ring.slots as u64;
        let t = tail.load(Ordering::Relaxed);
        let room = n >= 1 && n as u64 <= slots && t >= head && t - head <= slots - n as u64;
        // Tickets past the last one there is (a corrupt tail and head): the general claim.
        let end = t.checked_add(n as u64);
        if !room || end.is_none() || record.load(Ordering::Relaxed) != 0 {
            return None;
        }
        // The record first, so the owner never sees one of these claims without it.
        record.store(claim::record(t), Ordering::Relaxed);
        let laps = &self.ring.laps;
        for k in 0..n as u64 {
            let word = self.slot_at(laps.split(t + k).1).last_word();
            let st = word.load(Ordering::Acquire);
            if !laps.is_free(st, t + k)
                || claim::try_slot(laps, word, t + k, st, self.claimer).is_err()
            {
                for j in 0..k {
                    self.skip(t + j);
                }
                record.store(0, Ordering::Release);
                return None;
            }
        }
        tail.store(t + n as u64, Ordering::Release);
        Some(t)
    }

    /// One packet into a slot this port claimed: `a` then `b` (private bytes, at most
    /// [`Ring::capacity`] together) stored, then published with `meta`; no layout check.
    #[inline]
    pub fn write_two(&self, ticket: u64, a: &[u8], b: &[u8], meta: u32) -> Result<(), ShmError> {
        let slot = self.slot(ticket);
        if slot.store_two(self.ring.capacity(), a, b).is_none() {
            return Err(self.too_long(a.len().saturating_add(b.len())));
        }
        let status = self.ring.laps.published(ticket, meta);
        slot.last_word().store(status, Ordering::Release);
        Ok(())
    }

    /// [`write_two`](Self::write_two) of `parts` then the shared bytes `tail` (part of an
    /// echoed payload), which move straight into the slot.
    #[inline]
    pub fn write_then(
        &self,
        ticket: u64,
        parts: &[&[u8]],
        tail: SharedBytes<'_>,
        meta: u32,
    ) -> Result<(), ShmError> {
        let slot = self.slot(ticket);
        if slot
            .store_padded_then(self.ring.capacity(), parts, tail)
            .is_none()
        {
            return Err(self.too_long(parts_len(parts).saturating_add(tail.len())));
        }
        let status = self.ring.laps.published(ticket, meta);
        slot.last_word().store(status, Ordering::Release);
        Ok(())
    }

    /// [`Ring::write_and_publish`] into a slot this port claimed, with no layout check.
    #[inline]
    pub fn write_and_publish(
        &self,
        ticket: u64,
        parts: &[&[u8]],
        meta: u32,
    ) -> Result<(), ShmError> {
        let slot = self.slot(ticket);
        slot.store_padded(self.ring.capacity(), parts)?;
        slot.last_word()
            .store(self.ring.laps.published(ticket, meta), Ordering::Release);
        Ok(())
    }

    /// [`Ring::skip`] of a slot this port claimed.
    #[inline]
    pub fn skip(&self, ticket: u64) {
        self.slot(ticket).last_word().store(
            self.ring.laps.skipped(ticket, self.claimer),
            Ordering::Release,
        );
    }

    /// [`Ring::release`] of this port's claims.
    #[inline]
    pub fn release(&self) {
        self.record().store(0, Ordering::Release);
    }

    /// [`Ring::prefetch_ahead`], with no layout check.
    #[inline(always)]
    pub fn prefetch_ahead(&self, ahead: u64) {
        let t = self.tail().load(Ordering::Relaxed).wrapping_add(ahead);
        let at = self.c.data + self.ring.split(t).1 * self.ring.slot_size;
        self.seg.mapping().prefetch_for_write(at);
    }
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("ring", &self.ring)
            .field("claimer", &self.claimer)
            .finish()
    }
}

/// The owner's handle on a [`Ring`] in its own segment ([`Ring::inbox`]): the ring's words
/// and slots checked once when made, so that a look is one load and a compare, and a
/// payload view checks only its length. It also keeps the owner's head (the next ticket
/// to consume, from 0) with its slot and lap stamp, moved one ticket at a time
/// ([`advance`](Self::advance)): the owner's looks at its head need no division, and no
/// shift or mask either.
pub struct Inbox {
    seg: Segment,
    ring: Ring,
    /// Checked against `seg` (see [`Checked`]).
    c: Checked,
    /// The head ticket, its slot (always below `slots`) and its lap.
    head: u64,
    head_slot: usize,
    head_lap: u64,
    /// The low half of the head's status once published ([`Laps::published_low`]).
    head_pub: u32,
}

impl Inbox {
    /// The ring.
    #[inline]
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Mapping offset of the slot of `ticket`: inside the checked run (`split` gives an
    /// index below `slots`).
    #[inline(always)]
    fn at(&self, ticket: u64) -> usize {
        self.slot_at(self.ring.split(ticket).1)
    }

    /// Mapping offset of slot `i` (below `slots`).
    #[inline(always)]
    fn slot_at(&self, i: usize) -> usize {
        self.c.data + i * self.ring.slot_size
    }

    /// `Acquire` load of the status word of the slot at mapping offset `at` (from `at`).
    #[inline(always)]
    fn status_of(&self, at: usize) -> u64 {
        // `slot_size - STATUS_LEN`, which `Ring::new` keeps positive (no saturation).
        let off = at + self.ring.slot_size - STATUS_LEN;
        // SAFETY: `at` is a slot of the ring's run (`slot_at`), checked 8-aligned inside
        // `seg`'s mapping (whose size never changes); the status word ends the slot, and
        // `slot_size` is a multiple of 8.
        unsafe { self.seg.mapping().word64(off) }.load(Ordering::Acquire)
    }

    /// `Acquire` load of the status of `ticket`.
    #[inline(always)]
    fn status(&self, ticket: u64) -> u64 {
        self.status_of(self.at(ticket))
    }

    /// The owner's head: the next ticket to consume.
    #[inline(always)]
    pub fn head(&self) -> u64 {
        self.head
    }

    /// Moves the owner's head one ticket on (its slot and lap stamp with it). Tells senders
    /// nothing: that is [`consumed`](Self::consumed).
    #[inline(always)]
    pub fn advance(&mut self) {
        self.head += 1;
        self.head_slot += 1;
        if self.head_slot == self.ring.slots {
            self.head_slot = 0;
            self.head_lap += 1;
            self.head_pub = Laps::published_low(self.head_lap);
        }
    }

    /// [`published`](Self::published) of the head: one load and one compare.
    #[inline(always)]
    pub fn head_published(&self) -> Option<u32> {
        let st = self.status_of(self.slot_at(self.head_slot));
        (st as u32 == self.head_pub).then_some((st >> 32) as u32)
    }

    /// [`is_empty`](Self::is_empty) of the head: one load and one compare.
    #[inline(always)]
    pub fn head_is_empty(&self) -> bool {
        // The previous lap's stamp: this one's minus one, mod 2^30 (`is_empty`'s `lap`).
        let st = self.status_of(self.slot_at(self.head_slot));
        Laps::is_free_in(st, self.head_lap)
    }

    /// The first payload word of the head's slot (`Relaxed`: after an `Acquire` look found it
    /// published): a notification's value, with no view and no length to check.
    #[inline(always)]
    pub fn head_first_word(&self) -> u64 {
        let at = self.slot_at(self.head_slot);
        // SAFETY: the slot's first word lies in the slot (`slot_size >= 16`, `Ring::new`),
        // in the ring's run, checked 8-aligned inside `seg`'s mapping.
        unsafe { self.seg.mapping().word64(at) }.load(Ordering::Relaxed)
    }

    /// Appends the first `len` payload bytes of the head's slot to `out` (a reassembly
    /// buffer): whole words loaded straight into it, no zeroing first, no bulk-copy size
    /// dispatch. `len` (which may come from untrusted meta data) is checked against the
    /// capacity; on an error nothing is appended.
    #[inline]
    pub fn head_append(&self, len: usize, out: &mut Vec<u8>) -> Result<(), ShmError> {
        if len > self.ring.capacity() {
            return Err(ShmError::OutOfBounds {
                offset: 0,
                len,
                area: self.ring.capacity(),
            });
        }
        let at = self.slot_at(self.head_slot);
        let start = out.len();
        let padded = len.next_multiple_of(WORD);
        out.reserve(padded);
        let spare = &mut out.spare_capacity_mut()[..padded];
        for (k, dst) in spare.chunks_exact_mut(WORD).enumerate() {
            // SAFETY: word `k` starts below `len <= capacity` bytes into the slot and the
            // capacity is whole words, so it lies in the slot's payload, in the ring's run,
            // checked 8-aligned inside `seg`'s mapping.
            let w = unsafe { self.seg.mapping().word64(at + k * WORD) }.load(Ordering::Relaxed);
            for (d, b) in dst.iter_mut().zip(w.to_ne_bytes()) {
                d.write(b);
            }
        }
        // SAFETY: `start + len <= start + padded <= capacity` (reserved above), and bytes
        // `start..start + padded` were all written just above. The last word's padding (or a
        // peer's bytes past `len`) stays outside the length.
        unsafe { out.set_len(start + len) };
        Ok(())
    }

    /// [`payload`](Self::payload) of the head.
    #[inline(always)]
    pub fn head_payload(&self, len: usize) -> Result<SharedBytes<'_>, ShmError> {
        if len > self.ring.capacity() {
            return Err(ShmError::OutOfBounds {
                offset: 0,
                len,
                area: self.ring.capacity(),
            });
        }
        // In the slot's payload, so in the checked run.
        Ok(SharedBytes::new(
            self.seg.mapping(),
            self.slot_at(self.head_slot),
            len,
        ))
    }

    /// The meta data of `ticket` if it is published (`Acquire`): one load and one compare,
    /// the owner's usual case. `None`: anything else, which [`look`](Self::look) tells.
    #[inline(always)]
    pub fn published(&self, ticket: u64) -> Option<u32> {
        let st = self.status(ticket);
        // The low half is the stamp and the state.
        let want = Laps::published_low(self.ring.split(ticket).0);
        (st as u32 == want).then_some((st >> 32) as u32)
    }

    /// Whether nobody has claimed `ticket` yet (`Acquire`): one load and one compare.
    #[inline(always)]
    pub fn is_empty(&self, ticket: u64) -> bool {
        let st = self.status(ticket);
        self.ring.laps.is_free(st, ticket)
    }

    /// [`Ring::look`], with no layout check.
    #[inline]
    pub fn look(&self, ticket: u64) -> Result<Seen, ShmError> {
        self.ring.laps.look(self.status(ticket), ticket)
    }

    /// [`Ring::payload`]: a view of the first `len` payload bytes of the slot of `ticket`;
    /// `len` (which may come from untrusted meta data) is checked against the capacity.
    #[inline(always)]
    pub fn payload(&self, ticket: u64, len: usize) -> Result<SharedBytes<'_>, ShmError> {
        if len > self.ring.capacity() {
            return Err(ShmError::OutOfBounds {
                offset: 0,
                len,
                area: self.ring.capacity(),
            });
        }
        // In the slot's payload, so in the checked run.
        Ok(SharedBytes::new(self.seg.mapping(), self.at(ticket), len))
    }

    /// [`Ring::read_payload`].
    #[inline]
    pub fn read_payload(&self, ticket: u64, dst: &mut [u8]) -> Result<(), ShmError> {
        self.payload(ticket, dst.len())?.read(0, dst)
    }

    /// [`Ring::consumed`]: every ticket below `head` is consumed (`Release`).
    #[inline(always)]
    pub fn consumed(&self, head: u64) {
        // SAFETY: `c.head` was checked against `seg`'s mapping (8-aligned, in the word area).
        unsafe { self.seg.mapping().word64(self.c.head) }.store(head, Ordering::Release);
    }
}

impl std::fmt::Debug for Inbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inbox").field("ring", &self.ring).finish()
    }
}

/// A claim in progress: its record word and what it says.
struct Claimer<'r> {
    record: &'r AtomicU64,
    recorded: Option<u64>,
    claimer: u32,
}

impl Claimant for Claimer<'_> {
    type Error = ShmError;

    #[inline(always)]
    fn claimer(&self) -> u32 {
        self.claimer
    }

    #[inline(always)]
    fn record(&mut self, t: u64) -> Result<(), ShmError> {
        if self.recorded.is_none_or(|r| t < r) {
            self.record.store(claim::record(t), Ordering::Relaxed);
            self.recorded = Some(t);
        }
        Ok(())
    }
}

/// A ring's slots in a segment, for the claimed ring's walks.
struct Slots<'r> {
    ring: &'r Ring,
    seg: &'r Segment,
}

impl claim::Slots for Slots<'_> {
    type Error = ShmError;

    #[inline(always)]
    fn laps(&self) -> Laps {
        self.ring.laps
    }

    #[inline(always)]
    fn status(&self, t: u64) -> Result<&AtomicU64, ShmError> {
        self.ring.status(self.seg, t)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const REC: usize = 128;

    fn ring(slots: usize) -> Ring {
        Ring::new(64, 192, 64, slots, 32).unwrap()
    }

    fn seg_for(r: &Ring) -> Segment {
        Segment::heap(256 + 64, 64 + r.data_bytes()).unwrap()
    }

    fn claim(r: &Ring, seg: &Segment, n: usize, h: &mut u64) -> Option<Vec<u64>> {
        let mut out = vec![0; n];
        r.try_claim(seg, n, 1, REC, h, &mut out)
            .unwrap()
            .then_some(out)
    }

    /// The prefetch ahead of the tail reads a peer-written word: whatever the tail says
    /// (corrupt included) and however far ahead, it neither fails nor changes a word or a
    /// byte anywhere in the segment.
    #[test]
    fn a_prefetch_ahead_of_any_tail_changes_nothing() {
        let values = |all: &[AtomicU64]| -> Vec<u64> {
            all.iter().map(|w| w.load(Ordering::Relaxed)).collect()
        };
        for slots in [1, 3, 4] {
            let r = ring(slots);
            let seg = seg_for(&r);
            let w = seg.import();
            seg.byte_area().fill(0, 64 + r.data_bytes(), 0x5A).unwrap();
            let all = seg.words(0, seg.words_len() / 8).unwrap();
            for (i, word) in all.iter().enumerate() {
                word.store(0x1111 * (i as u64 + 1), Ordering::Relaxed);
            }
            for tail in [0, 1, 7, u64::MAX - 3, u64::MAX] {
                w.store_word(r.tail(), tail).unwrap();
                let before = values(all);
                for ahead in [0, 1, 8, u64::MAX] {
                    r.prefetch_ahead(&seg, &w, ahead);
                }
                assert_eq!(values(all), before, "tail {tail}");
            }
            assert!(seg.byte_area().to_vec().iter().all(|&b| b == 0x5A));
        }
    }

    #[test]
    fn claim_until_full_then_consumed_frees_in_order() {
        let r = ring(4);
        let seg = seg_for(&r);
        let w = seg.import();
        let mut h = 0;
        assert_eq!(claim(&r, &seg, 3, &mut h), Some(vec![0, 1, 2]));
        assert_eq!(claim(&r, &seg, 2, &mut h), None, "only one left");
        assert_eq!(
            r.look(&seg, 3).unwrap(),
            Seen::Empty,
            "nothing stays claimed"
        );
        assert_eq!(claim(&r, &seg, 1, &mut h), Some(vec![3]));
        assert_eq!(claim(&r, &seg, 1, &mut h), None, "full: no overwrite");
        assert!(r.try_claim(&seg, 5, 1, REC, &mut h, &mut [0; 5]).is_err());
        assert!(r.try_claim(&seg, 0, 1, REC, &mut h, &mut []).is_err());
        assert!(r.try_claim(&seg, 2, 1, REC, &mut h, &mut [0; 1]).is_err());
        for t in 0..4 {
            r.write(&w, t, 0, &[t as u8; 24]).unwrap();
            r.publish(&w, t, 100 + t as u32).unwrap();
        }
        r.release(&w, REC).unwrap();
        assert!(r.write(&w, 0, 16, &[0; 9]).is_err(), "past the payload");
        assert!(r.write(&w, 0, 4, &[0; 1]).is_err(), "misaligned");
        assert_eq!(claim(&r, &seg, 1, &mut h), None, "published, not consumed");
        for t in 0..2 {
            assert_eq!(r.look(&seg, t).unwrap(), Seen::Published(100 + t as u32));
            assert_eq!(r.payload(&seg, t, 24).unwrap().to_vec(), [t as u8; 24]);
        }
        assert!(r.payload(&seg, 2, 25).is_err());
        assert_eq!(claim(&r, &seg, 1, &mut h), None, "not yet told");
        r.consumed(&w, 2).unwrap();
        assert_eq!(claim(&r, &seg, 2, &mut h), Some(vec![4, 5]), "lap 1");
        assert_eq!(r.look(&seg, 4).unwrap(), Seen::Claimed(1));
        assert_eq!(r.look(&seg, 2).unwrap(), Seen::Published(102));
        assert_eq!(
            r.look(&seg, 6).unwrap(),
            Seen::Empty,
            "lap 0's status is lap 1's past"
        );
    }

    /// Ports and inboxes check the ring against the segment once, when made: a segment too
    /// small for the ring, or a record word outside its word area, is refused then.
    #[test]
    fn ports_and_inboxes_are_checked_when_made() {
        let r = ring(4);
        let seg = seg_for(&r);
        assert!(r.port(&seg, 1, REC).is_ok());
        assert!(r.inbox(&seg).is_ok());
        assert!(r.port(&seg, 1, 1 << 20).is_err(), "record outside");
        assert!(r.port(&seg, 1, REC + 4).is_err(), "misaligned record");
        let small = Segment::heap(256 + 64, 64 + r.data_bytes() - 8).unwrap();
        assert!(r.port(&small, 1, REC).is_err(), "slots past the byte area");
        assert!(r.inbox(&small).is_err());
        let words = Segment::heap(128, 64 + r.data_bytes()).unwrap();
        assert!(r.inbox(&words).is_err(), "head word outside");
    }

    /// A port's sends and an inbox's looks are the ring's: two parts (even and odd heads),
    /// an echo from shared bytes (also from the very slot it is written to), refused when
    /// full or too long, and every state the owner can find.
    #[test]
    fn ports_send_what_inboxes_find() {
        let r = ring(4);
        let seg = seg_for(&r);
        let port = r.port(&seg, 3, REC).unwrap();
        let inbox = r.inbox(&seg).unwrap();
        let mut h = 0;
        assert!(inbox.is_empty(0) && inbox.published(0).is_none());
        assert_eq!(inbox.look(0).unwrap(), Seen::Empty);
        assert!(port.send(&mut h, b"12345678", b"abc", 5).unwrap());
        assert_eq!(inbox.published(0), Some(5));
        assert!(!inbox.is_empty(0));
        assert_eq!(inbox.payload(0, 11).unwrap().to_vec(), b"12345678abc");
        assert!(inbox.payload(0, 25).is_err(), "past the payload");
        assert!(port.send(&mut h, b"1234", b"abcdef", 6).unwrap());
        assert_eq!(r.look(&seg, 1).unwrap(), Seen::Published(6));
        let mut b = [0u8; 10];
        inbox.read_payload(1, &mut b).unwrap();
        assert_eq!(&b, b"1234abcdef");
        assert_eq!(seg.load_word(REC).unwrap(), 0, "released");
        // An echo of ticket 0's payload, and one too long: skipped, nothing left claimed.
        let view = inbox.payload(0, 11).unwrap();
        assert!(port.send_then(&mut h, &[b"hd"], view, 7).unwrap());
        assert_eq!(inbox.payload(2, 13).unwrap().to_vec(), b"hd12345678abc");
        assert!(port.send_then(&mut h, &[&[0; 20]], view, 8).is_err());
        assert_eq!(inbox.look(3).unwrap(), Seen::Skipped(3));
        assert_eq!(seg.load_word(REC).unwrap(), 0);
        // Full until consumed; then the next lap, where an echo from the slot it overwrites
        // goes through a private copy.
        assert!(!port.send(&mut h, b"x", b"", 9).unwrap());
        inbox.consumed(4);
        assert_eq!(seg.load_word(r.head()).unwrap(), 4);
        assert!(inbox.is_empty(4) && inbox.published(4).is_none());
        let old = inbox.payload(4, 8).unwrap();
        assert!(port.send_then(&mut h, &[], old, 10).unwrap());
        assert_eq!(inbox.published(4), Some(10));
        assert_eq!(inbox.payload(4, 8).unwrap().to_vec(), b"12345678");
        // Claims, packets and skips of a multi-packet message through the port.
        let mut got = [0u64; 2];
        assert!(port.try_claim(2, &mut h, &mut got).unwrap());
        assert_eq!(got, [5, 6]);
        assert_eq!(inbox.look(5).unwrap(), Seen::Claimed(3));
        port.write_and_publish(5, &[b"ab", b"c"], 11).unwrap();
        assert!(port.write_and_publish(6, &[&[0; 25]], 12).is_err());
        port.skip(6);
        port.release();
        assert_eq!(inbox.payload(5, 3).unwrap().to_vec(), b"abc");
        assert_eq!(inbox.look(6).unwrap(), Seen::Skipped(3));
        assert_eq!(seg.load_word(REC).unwrap(), 0);
        port.prefetch_ahead(u64::MAX);
        // A status no lap writes: the inbox says so as the ring does.
        seg.import()
            .store_slot_word(r.slot_base(7) + r.capacity(), 0xdead_0000_0007)
            .unwrap();
        assert!(inbox.look(7).is_err() && r.look(&seg, 7).is_err());
        assert!(!inbox.is_empty(7) && inbox.published(7).is_none());
    }

    /// Every split of a packet into a head and a payload lands whole and zero-padded: heads
    /// of whole words or not, payloads of any length, small (word by word) or not.
    #[test]
    fn two_part_packets_land_whole() {
        let r = Ring::new(64, 192, 64, 4, 64).unwrap();
        let seg = Segment::heap(256 + 64, 64 + r.data_bytes()).unwrap();
        let port = r.port(&seg, 1, REC).unwrap();
        let mut inbox = r.inbox(&seg).unwrap();
        let bytes: Vec<u8> = (1..=56).collect();
        let mut h = 0;
        for (a, b) in [
            (0, 0),
            (0, 5),
            (8, 0),
            (8, 3),
            (16, 16),
            (8, 24),
            (8, 25),
            (12, 9),
        ] {
            for (c, d) in [(a, b), (a, 56 - a)] {
                let (head, body) = (&bytes[..c], &bytes[c..c + d]);
                assert!(port.send(&mut h, head, body, 9).unwrap());
                let padded = (c + d).div_ceil(8) * 8;
                let got = inbox.head_payload(padded).unwrap().to_vec();
                assert_eq!(&got[..c + d], &bytes[..c + d], "{c} + {d}");
                assert!(got[c + d..].iter().all(|&x| x == 0), "{c} + {d}: padding");
                inbox.advance();
                inbox.consumed(inbox.head());
            }
        }
    }

    /// A receiver that sets its head and tail words to the last tickets there are, and a
    /// status that looks free for that lap: the sender's claims (one slot, a run, the
    /// general claim) never overflow a ticket (a panic in a checked build).
    #[test]
    fn tickets_at_the_end_of_the_range_never_overflow() {
        let r = ring(4);
        for at in [u64::MAX, u64::MAX - 1, u64::MAX - 3] {
            let seg = seg_for(&r);
            let w = seg.import();
            w.store_word(r.tail(), at).unwrap();
            w.store_word(r.head(), at).unwrap();
            for t in at..=at.saturating_add(3) {
                w.store_slot_word(r.slot_base(t) + r.capacity(), r.laps().usual_free(t))
                    .unwrap();
            }
            let port = r.port(&seg, 1, REC).unwrap();
            let mut h = 0;
            let _ = port.send(&mut h, b"x", b"", 1);
            let mut h = at;
            let _ = port.send(&mut h, b"x", b"", 1);
            let _ = port.claim_run(2, at);
            port.release();
            let mut out = [0u64; 2];
            let _ = port.try_claim(2, &mut h, &mut out);
            let _ = r.try_claim(&seg, 1, 2, REC + 8, &mut 0, &mut out);
        }
    }

    /// Every check of a length against a slot's payload, at its boundary: exactly the
    /// capacity is written (from private parts, or with a shared tail), viewed, read and
    /// appended whole; one to eight bytes past it, whether a sender asks to write it or an
    /// owner is told it by the (untrusted) meta, is an error that writes, lends and appends
    /// nothing.
    #[test]
    fn lengths_at_and_just_past_the_capacity() {
        let r = ring(4);
        let seg = seg_for(&r);
        let w = seg.import();
        let cap = r.capacity();
        let full: Vec<u8> = (0..cap).map(|i| i as u8 + 1).collect();
        let src = Segment::heap(0, 64).unwrap();
        src.byte_area().write(0, &full).unwrap();
        let mut h = 0;
        let t = claim(&r, &seg, 3, &mut h).unwrap();
        r.write(&w, t[0], 0, &full).unwrap();
        r.write_parts(&w, t[1], 8, &[&full[8..13], &full[13..]])
            .unwrap();
        r.write(&w, t[1], 0, &full[..8]).unwrap();
        let tail = src.byte_area().slice(3, cap - 3).unwrap();
        r.write_parts_then(&w, t[2], 0, &[&full[..3]], tail)
            .unwrap();
        let before = seg.byte_area().to_vec();
        for over in 1..=8 {
            let long = vec![0xEE; cap + over];
            assert!(r.write(&w, t[0], 0, &long).is_err(), "{over}");
            assert!(r.write(&w, t[0], 8, &long[8..]).is_err(), "{over}: at 8");
            assert!(r
                .write_parts(&w, t[0], 0, &[&long[..5], &long[5..]])
                .is_err());
            let tail = src.byte_area().slice(0, cap + over - 3).unwrap();
            assert!(r.write_parts_then(&w, t[0], 0, &[b"abc"], tail).is_err());
            let tail = src.byte_area().slice(0, cap + over - 8).unwrap();
            assert!(r.write_parts_then(&w, t[0], 8, &[], tail).is_err());
        }
        assert_eq!(seg.byte_area().to_vec(), before, "nothing written");
        for (k, &t) in t.iter().enumerate() {
            r.publish(&w, t, k as u32).unwrap();
        }
        r.release(&w, REC).unwrap();
        let mut inbox = r.inbox(&seg).unwrap();
        for &t in &t {
            assert_eq!(r.payload(&seg, t, cap).unwrap().to_vec(), full, "{t}");
            assert_eq!(inbox.payload(t, cap).unwrap().to_vec(), full, "{t}");
            let mut got = vec![0; cap];
            inbox.read_payload(t, &mut got).unwrap();
            assert_eq!(got, full);
            assert_eq!(inbox.head_payload(cap).unwrap().to_vec(), full, "{t}");
            let mut v = vec![9u8];
            inbox.head_append(cap, &mut v).unwrap();
            assert_eq!(v, [&[9][..], &full[..]].concat(), "{t}");
            for over in 1..=8 {
                let n = cap + over;
                assert!(r.payload(&seg, t, n).is_err(), "{t}/{over}");
                assert!(r.read_payload(&seg, t, &mut vec![0; n]).is_err());
                assert!(inbox.payload(t, n).is_err(), "{t}/{over}");
                assert!(inbox.read_payload(t, &mut vec![0; n]).is_err());
                assert!(inbox.head_payload(n).is_err(), "{t}/{over}");
                assert!(inbox.head_append(n, &mut v).is_err(), "{t}/{over}");
                assert_eq!(v.len(), 1 + cap, "{t}/{over}: nothing appended");
            }
            inbox.advance();
        }
    }

    /// The inbox's head, moved one ticket at a time, finds what `look` finds at that
    /// ticket, over several laps of a power-of-two ring and of one that is not.
    #[test]
    fn an_inbox_head_follows_the_tickets() {
        for slots in [4, 3] {
            let r = ring(slots);
            let seg = seg_for(&r);
            let port = r.port(&seg, 2, REC).unwrap();
            let mut inbox = r.inbox(&seg).unwrap();
            let mut h = 0;
            for t in 0..4 * slots as u64 {
                assert_eq!(inbox.head(), t);
                assert!(inbox.head_is_empty() && inbox.head_published().is_none());
                assert!(port.send(&mut h, &t.to_le_bytes(), b"", t as u32).unwrap());
                assert!(!inbox.head_is_empty());
                assert_eq!(inbox.head_published(), Some(t as u32), "{slots}: {t}");
                assert_eq!(inbox.published(t), Some(t as u32));
                assert_eq!(inbox.head_payload(8).unwrap().to_vec(), t.to_le_bytes());
                assert_eq!(u64::from_le(inbox.head_first_word()), t);
                let mut v = vec![7u8];
                inbox.head_append(5, &mut v).unwrap();
                assert_eq!(v, [&[7][..], &t.to_le_bytes()[..5]].concat());
                assert!(inbox.head_append(25, &mut v).is_err());
                assert_eq!(v.len(), 6, "nothing appended");
                assert!(inbox.head_payload(25).is_err());
                inbox.advance();
                inbox.consumed(inbox.head());
            }
        }
    }

    /// A run of consecutive slots from the tail: all or none; refused (nothing taken) when
    /// the cached head says no room or a claim is open; given back (skipped) when a slot of
    /// it is taken meanwhile; its packets written straight from private or shared bytes.
    #[test]
    fn runs_of_slots_are_claimed_whole_or_not_at_all() {
        let r = ring(4);
        let seg = seg_for(&r);
        let port = r.port(&seg, 4, REC).unwrap();
        let inbox = r.inbox(&seg).unwrap();
        assert_eq!(port.claim_run(0, 0), None);
        assert_eq!(port.claim_run(5, 0), None);
        assert_eq!(port.claim_run(3, 0), Some(0));
        assert_eq!(seg.load_word(REC).unwrap(), ACTIVE);
        assert_eq!(port.claim_run(1, 0), None, "a claim is open");
        port.write_two(0, b"12345678", b"9", 1).unwrap();
        let view = inbox.payload(0, 9).unwrap();
        port.write_then(1, &[b"ab"], view, 2).unwrap();
        assert!(
            port.write_two(2, &[0; 20], &[0; 5], 3).is_err(),
            "past the payload"
        );
        assert!(port.write_then(2, &[&[0; 20]], view, 3).is_err());
        assert_eq!(
            inbox.look(2).unwrap(),
            Seen::Claimed(4),
            "nothing published"
        );
        port.write_two(2, b"", b"", 3).unwrap();
        port.release();
        assert_eq!(inbox.payload(1, 11).unwrap().to_vec(), b"ab123456789");
        assert_eq!(inbox.look(2).unwrap(), Seen::Published(3));
        assert_eq!(port.claim_run(2, 0), None, "one slot left");
        assert_eq!(inbox.look(3).unwrap(), Seen::Empty, "nothing taken");
        inbox.consumed(3);
        // Slot 4 (lap 1) is taken by someone else after the tail hint (a hint left behind):
        // the run takes 3, fails at 4 and gives 3 back.
        seg.import().store_word(r.tail(), 3).unwrap();
        let other = r.port(&seg, 5, REC + 8).unwrap();
        let mut h = 3;
        let mut got = [0u64; 1];
        seg.import().store_word(r.tail(), 4).unwrap();
        assert!(other.try_claim(1, &mut h, &mut got).unwrap());
        assert_eq!(got, [4]);
        seg.import().store_word(r.tail(), 3).unwrap();
        assert_eq!(port.claim_run(2, 3), None);
        assert_eq!(inbox.look(3).unwrap(), Seen::Skipped(4), "given back");
        assert_eq!(inbox.look(4).unwrap(), Seen::Claimed(5), "never taken over");
        assert_eq!(seg.load_word(REC).unwrap(), 0, "no claim left open");
    }

    /// The one-step send: claimed, written, published, released; refused when full; a
    /// payload past the slot is an error that leaves the slot skipped and no claim open; and
    /// it takes the general claim when another claim is open or the tail hint is stale.
    #[test]
    fn send_one_publishes_and_leaves_no_claim_open() {
        let r = ring(4);
        let seg = seg_for(&r);
        let w = seg.import();
        let mut h = 0;
        assert!(r
            .send_one(&seg, 1, REC, &mut h, &[b"abc", b"defgh"], 7)
            .unwrap());
        assert_eq!(r.look(&seg, 0).unwrap(), Seen::Published(7));
        assert_eq!(r.payload(&seg, 0, 8).unwrap().to_vec(), b"abcdefgh");
        assert_eq!(seg.load_word(REC).unwrap(), 0, "released");
        // Past the payload (24 bytes): refused, the slot given up, nothing left claimed.
        assert!(r
            .send_one(&seg, 1, REC, &mut h, &[&[1; 20], &[2; 5]], 8)
            .is_err());
        assert_eq!(r.look(&seg, 1).unwrap(), Seen::Skipped(1));
        assert_eq!(seg.load_word(REC).unwrap(), 0);
        // A claim open (record set): the general path, which keeps tickets in order.
        assert_eq!(claim(&r, &seg, 1, &mut h), Some(vec![2]));
        assert!(r.send_one(&seg, 1, REC, &mut h, &[&[3; 24]], 9).unwrap());
        assert_eq!(r.look(&seg, 3).unwrap(), Seen::Published(9));
        r.publish(&w, 2, 10).unwrap();
        // Full until the owner says so; then lap 1, from a tail hint put back.
        assert!(!r.send_one(&seg, 1, REC, &mut h, &[b"x"], 11).unwrap());
        r.consumed(&w, 4).unwrap();
        w.store_word(r.tail(), 1).unwrap();
        assert!(r.send_one(&seg, 1, REC, &mut h, &[b"y"], 12).unwrap());
        assert_eq!(r.look(&seg, 4).unwrap(), Seen::Published(12));
        assert_eq!(r.payload(&seg, 4, 1).unwrap().to_vec(), b"y");
        assert_eq!(seg.load_word(REC).unwrap(), 0);
        // The packets of a claim of two, each written and published in one step.
        assert_eq!(claim(&r, &seg, 2, &mut h), Some(vec![5, 6]));
        r.write_and_publish(&w, 5, &[b"ab", b"c"], 13).unwrap();
        assert!(
            r.write_and_publish(&w, 6, &[&[0; 25]], 14).is_err(),
            "past the payload"
        );
        assert_eq!(
            r.look(&seg, 6).unwrap(),
            Seen::Claimed(1),
            "nothing published"
        );
        r.write_and_publish(&w, 6, &[&[4; 24]], 14).unwrap();
        assert_eq!(r.look(&seg, 5).unwrap(), Seen::Published(13));
        assert_eq!(r.payload(&seg, 5, 3).unwrap().to_vec(), b"abc");
        assert_eq!(r.payload(&seg, 6, 24).unwrap().to_vec(), [4; 24]);
    }

    /// Three senders race for slots of one ring, with multi-slot claims; the owner sees every
    /// message exactly once, intact, and each sender's in its order.
    #[test]
    fn many_senders_one_owner() {
        let r = ring(8);
        let seg = seg_for(&r);
        let per: u32 = if cfg!(miri) { 12 } else { 3000 };
        let senders = 3u32;
        std::thread::scope(|s| {
            for id in 0..senders {
                let (seg, r) = (&seg, r);
                s.spawn(move || {
                    let w = seg.import();
                    let mut cached = 0;
                    let rec = 8 * id as usize;
                    let mut got = [0u64; 2];
                    let start = std::time::Instant::now();
                    for seq in 0..per {
                        // Messages of 1 or 2 slots: (sender, seq, part) in each.
                        let n = 1 + (seq % 2) as usize;
                        if n == 1 {
                            // One slot: the one-step send, racing the others' claims.
                            let mut body = [0u8; 24];
                            body[..4].copy_from_slice(&id.to_le_bytes());
                            body[4..8].copy_from_slice(&seq.to_le_bytes());
                            let meta = id << 8 | 1;
                            while !r
                                .send_one(seg, id, rec, &mut cached, &[&body], meta)
                                .unwrap()
                            {
                                assert!(start.elapsed().as_secs() < 60, "sender {id} starved");
                                std::thread::yield_now();
                            }
                            continue;
                        }
                        while !r.try_claim(seg, n, id, rec, &mut cached, &mut got).unwrap() {
                            assert!(start.elapsed().as_secs() < 60, "sender {id} starved");
                            std::thread::yield_now();
                        }
                        for (part, &t) in got[..n].iter().enumerate() {
                            let mut body = [0u8; 24];
                            body[..4].copy_from_slice(&id.to_le_bytes());
                            body[4..8].copy_from_slice(&seq.to_le_bytes());
                            body[8] = part as u8;
                            r.write(&w, t, 0, &body).unwrap();
                            r.publish(&w, t, id << 8 | n as u32).unwrap();
                        }
                        r.release(&w, rec).unwrap();
                    }
                });
            }
            let own = seg.import();
            let mut next: HashMap<u32, u32> = HashMap::new();
            let mut parts: HashMap<u32, u8> = HashMap::new();
            let total: u32 = (0..per).map(|q| 1 + q % 2).sum::<u32>() * senders;
            let mut skipped = 0u32;
            let mut head = 0u64;
            let start = std::time::Instant::now();
            while head < (total + skipped) as u64 {
                assert!(start.elapsed().as_secs() < 60, "owner stuck at {head}");
                let meta = match r.look(&seg, head).unwrap() {
                    Seen::Published(m) => m,
                    Seen::Skipped(_) => {
                        // A two-slot claim that could not be whole.
                        head += 1;
                        skipped += 1;
                        continue;
                    }
                    Seen::Empty | Seen::Claimed(_) => {
                        // Batched: tell the senders only when idle.
                        r.consumed(&own, head).unwrap();
                        std::thread::yield_now();
                        continue;
                    }
                };
                let mut body = [0u8; 24];
                r.read_payload(&seg, head, &mut body).unwrap();
                let id = u32::from_le_bytes(body[..4].try_into().unwrap());
                let seq = u32::from_le_bytes(body[4..8].try_into().unwrap());
                assert_eq!(meta, id << 8 | (1 + seq % 2));
                let part = parts.entry(id).or_insert(0);
                assert_eq!(body[8], *part, "one sender's parts arrive in order");
                if body[8] as u32 + 1 == meta & 0xff {
                    let e = next.entry(id).or_insert(0);
                    assert_eq!(seq, *e, "per-sender order");
                    *e += 1;
                    *part = 0;
                } else {
                    *part += 1;
                }
                head += 1;
                if head.is_multiple_of(4) {
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
        let seg = seg_for(&r);
        let w = seg.import();
        let mut h = 0;
        for t in 0..10u64 {
            assert_eq!(claim(&r, &seg, 1, &mut h), Some(vec![t]));
            assert_eq!(r.slot_base(t), 64 + (t % 3) as usize * 32);
            r.write(&w, t, 0, &[t as u8]).unwrap();
            r.publish(&w, t, t as u32).unwrap();
            assert_eq!(r.look(&seg, t).unwrap(), Seen::Published(t as u32));
            assert_eq!(r.look(&seg, t + 3).unwrap(), Seen::Empty, "next lap");
            r.consumed(&w, t + 1).unwrap();
        }
    }

    /// A geometry no ring can have is refused when the ring is made, not at each claim.
    #[test]
    fn impossible_geometries_are_refused() {
        assert!(Ring::new(0, 64, 0, 0, 32).is_err(), "no slots");
        assert!(
            Ring::new(0, 64, 0, 4, 8).is_err(),
            "no room beside the status"
        );
        assert!(Ring::new(0, 64, 0, 4, 20).is_err(), "not whole words");
        assert!(Ring::new(4, 64, 0, 4, 32).is_err(), "misaligned tail");
        assert!(Ring::new(0, 64, 4, 4, 32).is_err(), "misaligned slots");
        assert!(
            Ring::new(0, 64, 0, usize::MAX / 8, 64).is_err(),
            "overflowing size"
        );
        let r = Ring::new(0, 64, 128, 6, 48).unwrap();
        assert_eq!(
            (r.slots(), r.slot_size(), r.data(), r.data_bytes()),
            (6, 48, 128, 288)
        );
        assert_eq!(r.slot_base(13), 128 + 48);
    }

    /// The owner can always tell a claimed slot's claimer, and whether the claimer vouches
    /// for it.
    #[test]
    fn claims_name_their_claimer() {
        let r = ring(4);
        let seg = seg_for(&r);
        let w = seg.import();
        let mut h = 0;
        let mut got = [0; 1];
        assert!(r.try_claim(&seg, 1, 5, 8, &mut h, &mut got).unwrap());
        assert_eq!(r.look(&seg, 0).unwrap(), Seen::Claimed(5));
        assert!(r.claim_is_genuine(&seg, 0, 8));
        assert!(!r.claim_is_genuine(&seg, 0, 16), "another claimer's record");
        r.publish(&w, 0, 1).unwrap();
        r.release(&w, 8).unwrap();
        // A forged CLAIMED status in the name of claimer 5, which holds no claims.
        w.store_slot_word(64 + 32 + 24, r.laps().claimed(1, 5))
            .unwrap();
        assert_eq!(r.look(&seg, 1).unwrap(), Seen::Claimed(5));
        assert!(!r.claim_is_genuine(&seg, 1, 8));
        r.repair(&seg, 1).unwrap();
        assert_eq!(r.look(&seg, 1).unwrap(), Seen::Skipped(OWNER));
        // Two claims open before one release: the record vouches for both, and a claim that
        // fails (no room) leaves it as it was.
        let mut got = [0; 1];
        assert!(r.try_claim(&seg, 1, 5, 8, &mut h, &mut got).unwrap());
        assert!(r.try_claim(&seg, 1, 5, 8, &mut h, &mut got).unwrap());
        assert!(r.claim_is_genuine(&seg, 2, 8) && r.claim_is_genuine(&seg, 3, 8));
        let record = seg.load_word(8).unwrap();
        assert!(
            !r.try_claim(&seg, 1, 5, 8, &mut h, &mut got).unwrap(),
            "full"
        );
        assert_eq!(seg.load_word(8).unwrap(), record);
        r.release(&w, 8).unwrap();
        assert!(!r.claim_is_genuine(&seg, 2, 8));
    }

    /// Every word a peer can write: a corrupt tail (any value) costs a walk, never an
    /// overwrite; a rewound or huge head never gives room that is not there; a corrupt
    /// status is an error, never claimed over, and the owner's repair frees it.
    #[test]
    fn corrupt_words_are_never_taken_for_room_or_data() {
        let r = ring(4);
        // Two published, unconsumed messages; then any tail value.
        let published = |tail: u64| {
            let seg = seg_for(&r);
            let w = seg.import();
            let mut h = 0;
            assert_eq!(claim(&r, &seg, 2, &mut h), Some(vec![0, 1]));
            for t in 0..2 {
                r.write(&w, t, 0, &[7; 8]).unwrap();
                r.publish(&w, t, 7).unwrap();
            }
            w.store_word(64, tail).unwrap();
            seg
        };
        for tail in [0, 1, 2, 3, 4, 5, 8, 1 << 40, u64::MAX / 2, u64::MAX] {
            let seg = published(tail);
            let w = seg.import();
            let mut fresh = 0;
            // Whatever the hint, only the free slots 2 and 3 are ever claimed.
            for _ in 0..3 {
                if let Some(got) = claim(&r, &seg, 1, &mut fresh) {
                    assert!(got[0] == 2 || got[0] == 3, "tail {tail}: got {got:?}");
                }
            }
            for t in 0..2 {
                assert_eq!(r.look(&seg, t).unwrap(), Seen::Published(7), "tail {tail}");
            }
            // The owner consumes what was claimed, and fills a hole a far hint left behind.
            for t in 2..4 {
                match r.look(&seg, t).unwrap() {
                    Seen::Claimed(1) => r.skip(&w, t, 1).unwrap(),
                    Seen::Empty => {
                        assert!(r.fill_holes(&seg, t).unwrap() > 0, "tail {tail}: hole {t}")
                    }
                    other => panic!("tail {tail}: {other:?} at {t}"),
                }
            }
            r.consumed(&w, 4).unwrap();
            assert_eq!(
                claim(&r, &seg, 2, &mut fresh),
                Some(vec![4, 5]),
                "tail {tail}"
            );
        }
        let seg = published(4);
        let w = seg.import();
        assert_eq!(
            r.look(&seg, 0).unwrap(),
            Seen::Published(7),
            "never overwritten"
        );
        assert_eq!(r.look(&seg, 1).unwrap(), Seen::Published(7));
        // A rewound head word: the cached head stays; a fresh sender finds no room (it may
        // take and give back the free slots, never the published ones).
        w.store_word(192, 0).unwrap();
        let mut fresh = 0;
        assert_eq!(claim(&r, &seg, 3, &mut fresh), None);
        // A huge head word: every slot's status is then laps behind, never claimed over: no
        // room. (A head a multiple of 2^30 laps ahead would look like this lap: then no room,
        // still no overwrite.)
        w.store_word(192, (1 << 20) + 5).unwrap();
        let mut fresh = 0;
        let mut out = [0; 1];
        assert!(!r.try_claim(&seg, 1, 1, REC, &mut fresh, &mut out).unwrap());
        for t in 0..4 {
            assert!(!matches!(r.look(&seg, t), Ok(Seen::Claimed(_))), "{t}");
        }
        // A status no lap writes, at the owner's next ticket: an error for the owner; a sender
        // that reaches it steps over it; the repair makes it free for the next lap.
        let seg = published(2);
        let w = seg.import();
        w.store_slot_word(64 + 2 * 32 + 24, 0xdead_0000_0007)
            .unwrap();
        assert!(r.look(&seg, 2).is_err());
        let mut fresh = 0;
        assert!(r.try_claim(&seg, 1, 1, REC, &mut fresh, &mut out).unwrap());
        assert_eq!(out, [3]);
        assert!(r.look(&seg, 2).is_err(), "never claimed over");
        r.repair(&seg, 2).unwrap();
        assert_eq!(r.look(&seg, 2).unwrap(), Seen::Skipped(OWNER));
        // A corrupt status in the owner's view with an unknown state bit pattern.
        w.store_slot_word(64 + 3 * 32 + 24, r.laps().claimed(3, 1) & !(3 << 30))
            .unwrap();
        assert!(r.look(&seg, 3).is_err());
    }
}
