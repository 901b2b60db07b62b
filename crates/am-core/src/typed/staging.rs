//! Typed values moved by rendezvous ([`super::Transit`]): where the transport's peers are
//! processes (or threads) of this host that map each other's created segments
//! ([`crate::Capabilities::map_segments`]), a large value is not cut into Mediums. Its
//! sender copies it into a *staging segment* of its own (a created segment's memory file,
//! never published on a team) and sends one Medium that says where it lies: the
//! *descriptor*. The target maps the sender's staging segment (once: the mapping is kept
//! for the next values), copies the bytes out into a private buffer, and releases them by
//! storing the value's sequence number in the release word the descriptor names (one of
//! the segment's control words). The sender reuses the bytes once it sees its number
//! there.
//!
//! The sender owns the staging segment and the target only reads it, but a peer that
//! maps it could write it: what the target copies is a peer's bytes, decoded as any
//! payload is (and refused as any payload is), and the sender reads nothing from it but
//! its release words, compared with numbers it chose.

use std::collections::BTreeMap;

use super::Refusal;
use crate::types::Rank;

/// Release words: control words `1..SLOTS` of the staging segment (word 0 is the freed
/// word every created segment has), so at most `SLOTS - 1` values in flight at once; past
/// that, values go in parts.
pub(crate) const SLOTS: u32 = 256;

/// The smallest value sent by rendezvous: below it, a few Mediums cost less than the
/// rendezvous' copy into the staging segment and the target's mapping check.
pub(crate) const RENDEZVOUS_MIN: usize = 16 << 10;

/// The largest value sent by rendezvous: the staging segment's pages, once written, stay
/// the process's until it closes, so a larger value goes in parts rather than leave a
/// segment of several times its size behind.
pub(crate) const RENDEZVOUS_MAX: usize = 64 << 20;

/// The argument word, after the slot, that marks a message as a rendezvous' descriptor.
pub(crate) const RENDEZVOUS: u32 = u32::MAX;

/// Bytes of a descriptor before the handle: the sequence number, the offset, the length,
/// the staging segment's length and its nonce.
const DESC_LEN: usize = 40;

/// The bytes of a descriptor's length word (its third): [`Staging::shrink`] rewrites it.
const LEN_WORD: std::ops::Range<usize> = 16..24;

/// The longest handle a descriptor carries (`/proc/<pid>/fd/<fd>`).
const MAX_HANDLE: usize = 64;

/// The smallest staging segment.
const STAGING_MIN: usize = 4 << 20;

/// Where staged values start: whole cache lines.
const ALIGN: usize = 64;

/// A value staged for a target: its region of the staging segment and the descriptor
/// that tells the target where it lies.
#[derive(Debug)]
pub(crate) struct Staged {
    /// The release word's index: the message's argument.
    pub(crate) slot: u32,
    seq: u64,
    offset: usize,
    /// The staging segment it lies in, by its nonce.
    nonce: u64,
    /// The descriptor: the message's payload.
    pub(crate) desc: Vec<u8>,
}

impl Staged {
    /// Where its bytes go in the staging segment's byte area.
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// How many bytes its region holds (its descriptor's length).
    pub(crate) fn len(&self) -> usize {
        self.desc
            .get(LEN_WORD)
            .and_then(|w| w.try_into().ok())
            .map_or(0, |w| u64::from_le_bytes(w) as usize)
    }
}

/// A value in the staging segment that its target has not released.
#[derive(Debug)]
struct Region {
    len: usize,
    slot: u32,
    seq: u64,
    dest: Rank,
}

/// This rank's staging segment.
#[derive(Debug)]
struct Own {
    seg: am_shm::Segment,
    nonce: u64,
    handle: String,
}

/// A peer's staging segment as this rank maps it.
#[derive(Debug)]
struct Mapped {
    nonce: u64,
    len: usize,
    seg: am_shm::Segment,
}

/// Both sides of the rendezvous: this rank's staging segment and what lies in it, and
/// peers' staging segments that this rank maps.
#[derive(Debug, Default)]
pub(crate) struct Staging {
    own: Option<Own>,
    /// Values in `own` not released yet, by offset.
    live: BTreeMap<usize, Region>,
    /// Release words in use (bit `i` of word `i / 64`).
    slots: [u64; SLOTS as usize / 64],
    /// The last sequence number handed out (0: none; a release word starts at 0).
    seq: u64,
    /// Peers' staging segments mapped here.
    mapped: rustc_hash::FxHashMap<Rank, Mapped>,
}

/// The byte offset of release word `slot` in the control words.
fn word_at(slot: u32) -> usize {
    slot as usize * 8
}

impl Staging {
    /// Stages `len` bytes for `dest`: a region of the staging segment (made, or remade
    /// larger while nothing lies in it, as needed) and a release word. The segment to write
    /// the bytes into (the caller writes them outside the lock) and the staged value;
    /// `None` when no region or word is free, or no segment could be made (the value then
    /// goes in parts).
    pub(crate) fn stage(&mut self, dest: Rank, len: usize) -> Option<(am_shm::Segment, Staged)> {
        if len == 0 {
            return None;
        }
        self.reclaim();
        let slot = self.free_slot()?;
        let offset = match self.fit(len) {
            Some(at) => at,
            None if self.live.is_empty() => {
                self.remake(len)?;
                self.fit(len)?
            }
            None => return None,
        };
        let own = self.own.as_ref()?;
        let handle = own.handle.as_bytes();
        if handle.len() > MAX_HANDLE {
            return None;
        }
        self.seq += 1;
        let seq = self.seq;
        self.slots[slot as usize / 64] |= 1 << (slot % 64);
        let region = Region {
            len,
            slot,
            seq,
            dest,
        };
        self.live.insert(offset, region);
        let mut desc = Vec::with_capacity(DESC_LEN + handle.len());
        for w in [
            seq,
            offset as u64,
            len as u64,
            own.seg.bytes_len() as u64,
            own.nonce,
        ] {
            desc.extend_from_slice(&w.to_le_bytes());
        }
        desc.extend_from_slice(handle);
        let staged = Staged {
            slot,
            seq,
            offset,
            nonce: own.nonce,
            desc,
        };
        Some((own.seg.share(), staged))
    }

    /// Stages a region for a value to `dest` whose length is not known yet: the largest
    /// free run of the staging segment (made if there is none yet), at most
    /// [`RENDEZVOUS_MAX`] bytes and at least [`RENDEZVOUS_MIN`]. The value is written into
    /// it (outside the lock), then [`Staging::shrink`] fits the region and its descriptor to
    /// the bytes written, or [`Staging::unstage`] frees it.
    pub(crate) fn stage_open(&mut self, dest: Rank) -> Option<(am_shm::Segment, Staged)> {
        if self.own.is_none() {
            self.remake(0)?;
        }
        self.reclaim();
        let len = self.largest_gap().min(RENDEZVOUS_MAX);
        if len < RENDEZVOUS_MIN {
            return None;
        }
        self.stage(dest, len)
    }

    /// Fits `staged`'s region, staged by [`Staging::stage_open`], and its descriptor to the
    /// `len` bytes written into it (no more than it had).
    pub(crate) fn shrink(&mut self, staged: &mut Staged, len: usize) {
        if let Some(r) = self.live.get_mut(&staged.offset) {
            if r.seq == staged.seq && len <= r.len {
                r.len = len;
                staged.desc[LEN_WORD].copy_from_slice(&(len as u64).to_le_bytes());
            }
        }
    }

    /// The longest run of the staging segment no live region holds.
    fn largest_gap(&self) -> usize {
        let Some(own) = &self.own else {
            return 0;
        };
        let mut at = 0;
        let mut best = 0;
        for (&start, r) in &self.live {
            best = best.max(start.saturating_sub(at));
            at = (start + r.len).next_multiple_of(ALIGN);
        }
        best.max(own.seg.bytes_len().saturating_sub(at))
    }

    /// Frees `staged`'s region and word: its descriptor never left.
    pub(crate) fn unstage(&mut self, staged: &Staged) {
        if self.own.as_ref().map(|o| o.nonce) != Some(staged.nonce) {
            return;
        }
        if self.live.get(&staged.offset).map(|r| r.seq) == Some(staged.seq) {
            self.free(staged.offset);
        }
    }

    /// Frees what lies for `peer`, and its staging segment's mapping: it is gone.
    pub(crate) fn forget(&mut self, peer: Rank) {
        let gone: Vec<usize> = self
            .live
            .iter()
            .filter(|(_, r)| r.dest == peer)
            .map(|(&at, _)| at)
            .collect();
        for at in gone {
            self.free(at);
        }
        self.mapped.remove(&peer);
    }

    fn free(&mut self, offset: usize) {
        if let Some(r) = self.live.remove(&offset) {
            self.slots[r.slot as usize / 64] &= !(1 << (r.slot % 64));
        }
    }

    /// Frees the regions whose targets released them.
    fn reclaim(&mut self) {
        let Some(own) = &self.own else {
            return;
        };
        let released: Vec<usize> = self
            .live
            .iter()
            .filter(|(_, r)| own.seg.load_word(word_at(r.slot)).ok() == Some(r.seq))
            .map(|(&at, _)| at)
            .collect();
        for at in released {
            self.free(at);
        }
    }

    /// A release word not in use (word 0 is the segment's freed word).
    fn free_slot(&self) -> Option<u32> {
        (1..SLOTS).find(|&s| self.slots[s as usize / 64] & 1 << (s % 64) == 0)
    }

    /// The first offset where `len` bytes fit between the live regions.
    fn fit(&self, len: usize) -> Option<usize> {
        let size = self.own.as_ref()?.seg.bytes_len();
        let mut at = 0;
        for (&start, r) in &self.live {
            if start.saturating_sub(at) >= len {
                return Some(at);
            }
            at = (start + r.len).next_multiple_of(ALIGN);
        }
        (size.checked_sub(at)? >= len).then_some(at)
    }

    /// Replaces the staging segment (nothing lies in it) with one that holds `len` bytes
    /// several times over. Targets map the new one when its first descriptor names it.
    fn remake(&mut self, len: usize) -> Option<()> {
        let size = len
            .checked_mul(4)?
            .max(STAGING_MIN)
            .checked_next_power_of_two()?;
        let nonce = crate::memfile::nonce();
        let name = crate::memfile::segment_name(nonce);
        let words = crate::memfile::CONTROL_WORDS;
        let seg = am_shm::Segment::create_anonymous(&name, words, size).ok()?;
        let handle = seg.handle()?;
        self.slots = Default::default();
        self.own = Some(Own { seg, nonce, handle });
        Some(())
    }

    /// The bytes a descriptor from `src` names, with release word `slot`: the mapping of
    /// `src`'s staging segment (made by the first descriptor that names it), where they lie
    /// in it, how many, and the sequence number that releases them. A descriptor that does
    /// not parse or names bytes outside the segment is undecodable; one longer than
    /// [`RENDEZVOUS_MAX`] too large; a segment that does not map (another host's, a file that is
    /// not the one named) unreachable.
    pub(crate) fn locate(
        &mut self,
        src: Rank,
        slot: u32,
        desc: &[u8],
    ) -> Result<(am_shm::Segment, Located), Refusal> {
        let word = |i: usize| {
            desc.get(i * 8..i * 8 + 8)
                .and_then(|w| w.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or(Refusal::Undecodable)
        };
        let (seq, offset, len, size, nonce) = (word(0)?, word(1)?, word(2)?, word(3)?, word(4)?);
        let handle = std::str::from_utf8(&desc[DESC_LEN..]).map_err(|_| Refusal::Undecodable)?;
        let as_usize = |w: u64| usize::try_from(w).map_err(|_| Refusal::Undecodable);
        let (offset, len, size) = (as_usize(offset)?, as_usize(len)?, as_usize(size)?);
        // No sender stages more: a larger length only makes this rank allocate.
        if len > RENDEZVOUS_MAX {
            return Err(Refusal::TooLarge);
        }
        if slot == 0 || slot >= SLOTS || offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(Refusal::Undecodable);
        }
        let fresh = match self.mapped.get(&src) {
            Some(m) => m.nonce != nonce || m.len != size,
            None => true,
        };
        if fresh {
            // The previous one is unmapped: a sender remakes its staging segment only when
            // nothing lies in it.
            self.mapped.remove(&src);
            let name = crate::memfile::segment_name(nonce);
            let words = crate::memfile::CONTROL_WORDS;
            let seg = am_shm::Segment::open_handle_named(handle, &name, words, size)
                .map_err(|_| Refusal::Unreachable)?;
            let m = Mapped {
                nonce,
                len: size,
                seg,
            };
            self.mapped.insert(src, m);
        }
        let seg = self
            .mapped
            .get(&src)
            .ok_or(Refusal::Unreachable)?
            .seg
            .share();
        Ok((seg, Located { seq, offset, len }))
    }
}

/// Where a descriptor's bytes lie in its sender's staging segment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Located {
    seq: u64,
    offset: usize,
    len: usize,
}

/// Copies the bytes `at` names out of `seg` (a peer's staging segment) into the first
/// bytes of `buf` (grown as needed, never shrunk: a buffer kept from one value to the next
/// is neither allocated nor zeroed again), releases them by storing their sequence number
/// in release word `slot`, and says how many there are.
pub(crate) fn fetch_into(
    seg: &am_shm::Segment,
    slot: u32,
    at: Located,
    buf: &mut Vec<u8>,
) -> Result<usize, Refusal> {
    if buf.len() < at.len {
        buf.try_reserve_exact(at.len - buf.len())
            .map_err(|_| Refusal::TooLarge)?;
        buf.resize(at.len, 0);
    }
    seg.byte_area()
        .read(at.offset, &mut buf[..at.len])
        .map_err(|_| Refusal::Undecodable)?;
    // Released once copied: the sender may write the region again.
    if let Ok(w) = seg.word(word_at(slot)) {
        w.store(at.seq, std::sync::atomic::Ordering::Release);
    }
    Ok(at.len)
}

#[cfg(all(test, not(miri)))]
mod tests {
    use super::*;

    fn release(s: &Staging, staged: &Staged) {
        let own = s.own.as_ref().unwrap();
        own.seg
            .word(word_at(staged.slot))
            .unwrap()
            .store(staged.seq, std::sync::atomic::Ordering::Release);
    }

    #[test]
    fn regions_are_reused_only_once_released() {
        // Catches a region handed out again while its target may still be copying it (its
        // word not yet at its number, or at a stale number), and one never reclaimed.
        let mut s = Staging::default();
        let (_, a) = s.stage(1, 1 << 20).unwrap();
        let (_, b) = s.stage(2, 1 << 20).unwrap();
        assert_ne!(a.offset, b.offset);
        assert_ne!(a.slot, b.slot);
        assert!(b.offset >= a.offset + (1 << 20) || a.offset >= b.offset + (1 << 20));
        // A stale number in b's word (a late store from an earlier value) frees nothing.
        let own = s.own.as_ref().unwrap();
        own.seg
            .word(word_at(b.slot))
            .unwrap()
            .store(b.seq - 1, std::sync::atomic::Ordering::Release);
        release(&s, &a);
        let (_, c) = s.stage(3, 1 << 20).unwrap();
        assert_eq!(c.offset, a.offset, "a's region, released, is first to fit");
        assert!(s.live.contains_key(&b.offset), "b is not released");
        // Full while anything lies in it: no region, the value goes in parts.
        assert!(s.stage(4, 8 << 20).is_none());
        s.unstage(&c);
        s.forget(2);
        assert!(s.live.is_empty());
        // Empty, it is remade larger.
        let (_, d) = s.stage(4, 8 << 20).unwrap();
        assert_ne!(d.nonce, a.nonce);
    }

    #[test]
    fn an_open_region_takes_the_largest_run_and_gives_back_what_it_did_not_use() {
        // Catches an open region that overlaps a live one, a shrink that leaves the rest
        // unusable or a descriptor that still says the open length, and an open region
        // staged where no run is long enough.
        let mut s = Staging::default();
        let (_, a) = s.stage(1, 1 << 20).unwrap();
        let (_, mut b) = s.stage_open(2).unwrap();
        assert_eq!(b.offset, 1 << 20, "after a");
        assert_eq!(b.len(), (4 << 20) - (1 << 20), "the rest of the segment");
        s.shrink(&mut b, 100_000);
        assert_eq!(b.len(), 100_000);
        let (m, at) = Staging::default().locate(0, b.slot, &b.desc).unwrap();
        assert_eq!(at.len, 100_000);
        drop(m);
        let (_, c) = s.stage(3, 2 << 20).unwrap();
        assert_eq!(
            c.offset,
            (1 << 20) + 100_032,
            "after b, shrunk, whole lines"
        );
        release(&s, &a);
        let (_, d) = s.stage_open(4).unwrap();
        assert_eq!(
            (d.offset, d.len()),
            (0, 1 << 20),
            "a's run, the longest now"
        );
        s.unstage(&d);
        // Runs shorter than the least rendezvous: none.
        let (_, e) = s.stage(5, (1 << 20) - RENDEZVOUS_MIN + 64).unwrap();
        let left = (4 << 20) - ((1 << 20) + 100_032 + (2 << 20));
        let (_, f) = s.stage(6, left - 64).unwrap();
        assert!(s.stage_open(7).is_none(), "{e:?} {f:?}");
    }

    #[test]
    fn words_run_out_before_anything_is_overwritten() {
        // Catches a release word shared by two values in flight.
        let mut s = Staging::default();
        let staged: Vec<Staged> = (1..SLOTS).map(|_| s.stage(0, 64).unwrap().1).collect();
        let mut words: Vec<u32> = staged.iter().map(|v| v.slot).collect();
        words.sort_unstable();
        words.dedup();
        assert_eq!(words.len(), SLOTS as usize - 1);
        assert!(s.stage(0, 64).is_none());
        release(&s, &staged[7]);
        assert_eq!(s.stage(0, 64).unwrap().1.slot, staged[7].slot);
    }

    #[test]
    fn a_target_copies_what_the_descriptor_names_and_releases_it() {
        // Catches a descriptor's fields swapped, bytes read from the wrong place, a release
        // the sender does not see, and forged descriptors read past the segment or mapping
        // another file.
        let mut sender = Staging::default();
        let (seg, v) = sender.stage(1, 5000).unwrap();
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        seg.byte_area().write(v.offset, &data).unwrap();
        let mut target = Staging::default();
        let (m, at) = target.locate(0, v.slot, &v.desc).unwrap();
        let mut buf = vec![7; 6000];
        assert_eq!(fetch_into(&m, v.slot, at, &mut buf), Ok(5000));
        assert_eq!(&buf[..5000], &data[..]);
        assert_eq!(buf.len(), 6000, "a buffer is not shrunk");
        sender.reclaim();
        assert!(sender.live.is_empty(), "released");
        // Forged: cut, past the segment, slot 0 or past the words, another nonce.
        let mut past = v.desc.clone();
        past[8..16].copy_from_slice(&(4u64 << 20).to_le_bytes());
        let mut huge = v.desc.clone();
        huge[16..24].copy_from_slice(&((RENDEZVOUS_MAX as u64) + 1).to_le_bytes());
        let mut other = v.desc.clone();
        other[32..40].copy_from_slice(&(v.nonce ^ 1).to_le_bytes());
        let mut t = Staging::default();
        let refused = |t: &mut Staging, slot, d: &[u8]| t.locate(0, slot, d).err();
        assert_eq!(
            refused(&mut t, 1, &v.desc[..30]),
            Some(Refusal::Undecodable)
        );
        assert_eq!(refused(&mut t, 1, &past), Some(Refusal::Undecodable));
        assert_eq!(refused(&mut t, 1, &huge), Some(Refusal::TooLarge));
        assert_eq!(refused(&mut t, 0, &v.desc), Some(Refusal::Undecodable));
        assert_eq!(refused(&mut t, SLOTS, &v.desc), Some(Refusal::Undecodable));
        assert_eq!(refused(&mut t, 1, &other), Some(Refusal::Unreachable));
    }
}
