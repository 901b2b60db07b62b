//! The symmetric heap: memory every member of a team allocates together and finds at the
//! same offset of its segment (OpenSHMEM's `shmem_malloc`, GASNet-EX's symmetric segments).
//!
//! The heap is the last [`crate::Config::symmetric_size`] bytes (`AM_SYMMETRIC_SIZE`) of
//! each rank's segment 0, reserved when the job connects: an allocation maps and registers
//! nothing, and every operation on segment 0 (puts, gets, atomics, put-with-signal,
//! strided transfers, Long AMs) reaches it on every transport. `amnet::run_job` makes the
//! segments `AM_SYMMETRIC_SIZE` bytes larger than the segment it is asked for, so those
//! bytes stay the program's; a program that sets `Config::symmetric_size` itself sizes its
//! segment to hold it.
//!
//! # How members agree
//! [`crate::Node::alloc_symmetric`] is collective over a team and costs one 40-byte
//! all-reduce of the team. Each member proposes the first free range of its own heap that
//! fits, and reports the end of its highest allocation. Where every member proposed the
//! same offset, that is the block. Otherwise (teams allocated differently on different
//! members) the block goes above every member's highest allocation, which is free on all of
//! them. Both are functions of the reduced values alone, so every member reaches the same
//! answer, or the same error ([`crate::AmError::OutOfSymmetricHeap`] when nothing fits,
//! [`crate::AmError::SymmetricHeapMismatch`] when members' heaps differ in size).
//!
//! One allocation or free runs at a time per endpoint: a second waits to start until the
//! first completes. Start them in the same order on every member of overlapping teams, as
//! MPI asks of blocking collectives.
//!
//! [`crate::Node::free_symmetric`] is collective too: a barrier of the team, after which the
//! block is free here. A member's puts to the block that completed before it entered the
//! barrier have landed; quiesce first for those still in flight.
//!
//! Blocks start on a multiple of [`SYMMETRIC_ALIGN`] bytes of the segment, so any atomic
//! word type fits at a block's start.
//!
//! # Bounds
//! A block is a range of segment 0, and an operation at a plain offset (`put(peer,
//! block.offset() + i, data)`, `put_strided`, `put_signal`, `atomic`) is checked only
//! against the segment's end: one past the block writes the next block. Through
//! [`Symmetric::on`] (`put_to(&block.on(peer), i, data)`, `get_from`, `get_from_into`,
//! `atomic_at`, the segment copies, `request_long_to`) the operation is checked against the
//! block's end when it starts, one comparison, and one that reaches past it fails with
//! [`crate::AmError::OutOfBlock`] naming the block, with nothing done.
//! [`Symmetric::at`] and [`Symmetric::range`] check a plain offset the same way before it
//! is used.
//!
//! # Example
//! A column into a peer's grid with one strided put ([`crate::Node::put_strided`]), then a
//! signal ([`crate::Node::put_signal`], OpenSHMEM's `shmem_put_signal`) to a peer asleep in
//! [`crate::Node::wait_word`] (`shmem_wait_until`) until it is there. `examples/stencil.rs`
//! exchanges its halos this way.
//!
//! ```
//! use amnet::{AtomicOp, Cmp, Config, Handlers, Loopback, Node, Signal};
//!
//! fn main() {
//!     amnet::run_ranks(Loopback::cluster(2, Default::default()), |t| {
//!         let config = Config::default().symmetric_size(64 << 10);
//!         let mut node = Node::new(t, Handlers::new(), config).unwrap();
//!         let world = node.world_team();
//!         // The same offset on every rank.
//!         let grid = node.alloc_symmetric(&world, 16 * 16 * 8).unwrap();
//!         if node.rank() == 0 {
//!             // A column of 16 f64s into rank 1's row-major 16 x 16 grid, then the flag at 8.
//!             let column: Vec<u8> = (0..16).flat_map(|i| f64::from(i).to_le_bytes()).collect();
//!             node.put_strided(1, grid.offset(), 16 * 8, 8, &column).unwrap();
//!             node.put_signal(1, 0, &[], 8, Signal::Set(1)).unwrap();
//!             // Through the block, checked against its end: a word of it on rank 1.
//!             node.atomic_at(&grid.on(1), 0, AtomicOp::FetchAdd(0.5f64)).unwrap();
//!         } else {
//!             node.wait_word(8, Cmp::Eq, 1).unwrap(); // sleeps in AM_WAIT=block until rank 0 signals
//!             let last = node.segment().load_u64(grid.at(15 * 16 * 8).unwrap()).unwrap();
//!             assert_eq!(last, 15f64.to_bits());
//!             // Past the block's 2048 bytes: an error naming the block, nothing written.
//!             match node.put_to(&grid.on(0), 2040, &[0; 16]) {
//!                 Err(amnet::AmError::OutOfBlock(b)) => {
//!                     assert_eq!((b.block_len, b.offset, b.len), (2048, 2040, 16))
//!                 }
//!                 other => panic!("{other:?}"),
//!             }
//!         }
//!         node.free_symmetric(&world, grid).unwrap();
//!     });
//! }
//! ```

use std::collections::BTreeMap;

use crate::error::AmError;

/// The alignment of every symmetric block, in bytes (a cache line): a block starts on a
/// multiple of it, and takes a multiple of it.
pub const SYMMETRIC_ALIGN: usize = 64;

/// A block of the symmetric heap: the same `offset` of segment 0 on every member of the team
/// that allocated it ([`crate::Node::alloc_symmetric`]). Puts, gets and atomics through
/// [`Symmetric::on`] (`node.put_to(&block.on(peer), i, data)`) are checked against the
/// block; those that take a plain offset (`node.put(peer, block.offset() + i, data)`) only
/// against the segment's end, so that one past the block writes the next block: take
/// their offsets from [`Symmetric::at`] or [`Symmetric::range`], which check them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Symmetric {
    offset: usize,
    len: usize,
}

impl Symmetric {
    /// Where the block starts in segment 0, on every member.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The bytes asked for.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The segment offset of byte `i` of the block, for an operation that takes a plain
    /// offset (`node.segment().load_u64(grid.at(8)?)`): only this call checks it against the
    /// block, the operation only against the segment's end. For puts, gets and atomics
    /// checked against the block, address it through [`Symmetric::on`].
    ///
    /// # Errors
    /// [`AmError::OutOfBlock`] naming the block if `i` is not a byte of it (`i >= len()`).
    pub fn at(&self, i: usize) -> Result<usize, AmError> {
        self.range(i, 1)
    }

    /// The segment offset of `len` bytes at byte `i` of the block, checked against the
    /// block's end: for an operation that takes a plain offset and a length, such as
    /// [`crate::Node::put_strided`] or [`crate::Node::put_signal`]
    /// (`node.put_signal(1, grid.range(0, halo.len())?, &halo, ..)`).
    ///
    /// # Errors
    /// [`AmError::OutOfBlock`] naming the block if the bytes reach past its end.
    pub fn range(&self, i: usize, len: usize) -> Result<usize, AmError> {
        match i.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.offset + i),
            _ => Err(AmError::OutOfBlock(Box::new(crate::error::BlockBounds {
                rank: None,
                segment: crate::types::SegmentId::ZERO,
                block_offset: self.offset,
                block_len: self.len,
                offset: i as u64,
                len: len as u64,
            }))),
        }
    }

    /// The block on member `rank`, as a [`RemoteSegment`](crate::segment::RemoteSegment)
    /// block of its segment 0: puts, gets and atomics through it
    /// ([`crate::Node::put_to`], [`crate::Node::get_from`], [`crate::Node::get_from_into`],
    /// [`crate::Node::atomic_at`], [`crate::Node::put_to_from_segment`],
    /// [`crate::Node::get_from_into_segment`], [`crate::Node::request_long_to`]) take
    /// offsets from the block's start and are checked against its end when they start (one
    /// comparison): `node.put_to(&grid.on(1), 0, &row)?`. One that reaches past the block
    /// is [`AmError::OutOfBlock`] naming it, and nothing is written; otherwise it is the
    /// same operation as [`crate::Node::put`] and its kin at `offset() + i`, on the same
    /// path at the same cost.
    pub fn on(&self, rank: crate::types::Rank) -> crate::segment::RemoteSegment {
        crate::segment::RemoteSegment::symmetric(rank, self.offset, self.len)
    }

    /// The block as the 16 bytes an operation slot carries.
    pub(crate) fn to_bytes(self) -> Vec<u8> {
        let mut b = Vec::with_capacity(16);
        b.extend_from_slice(&(self.offset as u64).to_le_bytes());
        b.extend_from_slice(&(self.len as u64).to_le_bytes());
        b
    }

    /// The block back from [`Symmetric::to_bytes`].
    pub(crate) fn from_bytes(b: &[u8]) -> Option<Symmetric> {
        let word = |i: usize| -> Option<usize> {
            let w: [u8; 8] = b.get(i * 8..i * 8 + 8)?.try_into().ok()?;
            usize::try_from(u64::from_le_bytes(w)).ok()
        };
        (b.len() == 16).then_some(())?;
        Some(Symmetric {
            offset: word(0)?,
            len: word(1)?,
        })
    }
}

/// What a symmetric collective does at a member when it completes ([`crate::endpoint`]'s
/// allocations and frees).
#[derive(Debug, Clone, Copy)]
pub(crate) enum HeapStep {
    /// An allocation of `len` bytes; this rank reserved its proposal at heap offset
    /// `reserved` until the members agree.
    Alloc { len: usize, reserved: Option<usize> },
    /// A free of this block.
    Free(Symmetric),
}

/// The symmetric collective in flight, by its operation slot.
#[derive(Debug)]
pub(crate) struct HeapOp {
    pub(crate) index: u32,
    pub(crate) gen: u32,
    pub(crate) step: HeapStep,
}

impl HeapOp {
    /// Whether it is the collective of slot `(index, gen)`.
    pub(crate) fn is(&self, index: u32, gen: u32) -> bool {
        self.index == index && self.gen == gen
    }
}

/// No free range fits: the proposal's word.
const NONE: u64 = u64::MAX;

/// The words each member contributes to an allocation's all-reduce (by maximum).
pub(crate) const PROPOSAL_WORDS: usize = 5;

/// `len` rounded up to whole [`SYMMETRIC_ALIGN`] units (at least one): what a block takes.
fn taken(len: usize) -> Option<usize> {
    len.max(1).checked_next_multiple_of(SYMMETRIC_ALIGN)
}

/// One member's heap: which ranges are taken and which are free, first fit.
#[derive(Debug, Default)]
pub(crate) struct Heap {
    /// Where the heap starts in segment 0 (a multiple of [`SYMMETRIC_ALIGN`]).
    base: usize,
    /// Its bytes (a multiple of [`SYMMETRIC_ALIGN`]).
    size: usize,
    /// Taken ranges, heap-relative: start -> bytes taken.
    used: BTreeMap<usize, usize>,
    /// Free ranges, heap-relative, coalesced: start -> bytes. Together with `used` they
    /// tile the heap; an allocation looks through these (few: the holes and the top), not
    /// through every block.
    free: BTreeMap<usize, usize>,
}

impl Heap {
    /// The heap of a segment of `segment_len` bytes whose last `size` bytes it is: an error
    /// (the reason) if they do not fit. The heap's start is rounded up to
    /// [`SYMMETRIC_ALIGN`], and its size down with it.
    pub(crate) fn new(segment_len: usize, size: usize) -> Result<Heap, String> {
        if size > segment_len {
            return Err(format!(
                "a symmetric heap of {size} bytes in a segment of {segment_len}"
            ));
        }
        let start = segment_len - size;
        let base = start.next_multiple_of(SYMMETRIC_ALIGN).min(segment_len);
        let size = (segment_len - base) / SYMMETRIC_ALIGN * SYMMETRIC_ALIGN;
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        Ok(Heap {
            base,
            size,
            used: BTreeMap::new(),
            free,
        })
    }

    /// The heap's bytes.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// The end of the highest range taken (0 if none): the start of the free range at the
    /// top, if there is one.
    fn high_water(&self) -> usize {
        match self.free.iter().next_back() {
            Some((&at, &n)) if at + n == self.size => at,
            _ => self.size,
        }
    }

    /// The first free range of `need` bytes, heap-relative.
    fn first_fit(&self, need: usize) -> Option<usize> {
        self.free
            .iter()
            .find(|(_, &n)| n >= need)
            .map(|(&at, _)| at)
    }

    /// What this member contributes to an allocation of `len` bytes: its proposal (first
    /// fit), its high water and its size, each also inverted so that one maximum gives the
    /// minimum too; and the range proposed, which the caller reserves ([`Heap::take`]) until
    /// the members have agreed.
    pub(crate) fn propose(&self, len: usize) -> ([u64; PROPOSAL_WORDS], Option<usize>) {
        let fit = taken(len).and_then(|need| self.first_fit(need));
        let p = fit.map_or(NONE, |at| at as u64);
        let size = self.size as u64;
        ([p, !p, self.high_water() as u64, size, !size], fit)
    }

    /// Takes the bytes of a block of `len` at heap offset `at`, which are free (a proposal,
    /// or above every member's high water): false, and nothing taken, if they are not.
    pub(crate) fn take(&mut self, at: usize, len: usize) -> bool {
        let Some(need) = taken(len) else {
            return false;
        };
        let Some((&start, &n)) = self.free.range(..=at).next_back() else {
            return false;
        };
        if at + need > start + n {
            return false;
        }
        self.free.remove(&start);
        if at > start {
            self.free.insert(start, at - start);
        }
        if start + n > at + need {
            self.free.insert(at + need, start + n - at - need);
        }
        self.used.insert(at, need);
        true
    }

    /// Gives back the range taken at heap offset `at`, joined with the free ranges beside
    /// it: false if none starts there.
    pub(crate) fn give_back(&mut self, at: usize) -> bool {
        let Some(need) = self.used.remove(&at) else {
            return false;
        };
        let (mut start, mut end) = (at, at + need);
        if let Some((&s, &n)) = self.free.range(..at).next_back() {
            if s + n == at {
                self.free.remove(&s);
                start = s;
            }
        }
        if let Some(n) = self.free.remove(&end) {
            end += n;
        }
        self.free.insert(start, end - start);
        true
    }

    /// The block the members agreed on, from the all-reduced words, for `len` bytes, where
    /// this member had reserved `reserved` (its proposal, taken): the same block, or the same
    /// error, on every member. The reservation is kept if it is the block, given back if not.
    pub(crate) fn agree(
        &mut self,
        words: &[u64],
        len: usize,
        reserved: Option<usize>,
    ) -> Result<Symmetric, AmError> {
        let [pmax, pmin_inv, high, smax, smin_inv] = match words {
            &[a, b, c, d, e] => [a, b, c, d, e],
            _ => return Err(AmError::StaleHandle),
        };
        let (pmin, smin) = (!pmin_inv, !smin_inv);
        let base = self.base;
        let block = |at: usize| Symmetric {
            offset: base + at,
            len,
        };
        if smax != smin {
            if let Some(at) = reserved {
                self.give_back(at);
            }
            return Err(AmError::SymmetricHeapMismatch {
                smallest: smin,
                largest: smax,
            });
        }
        if pmax == pmin && pmax != NONE {
            // Every member proposed this range, free on each (and reserved here).
            return Ok(block(pmax as usize));
        }
        if let Some(at) = reserved {
            self.give_back(at);
        }
        let need = taken(len).ok_or(AmError::OutOfSymmetricHeap {
            len,
            size: self.size,
        })?;
        match usize::try_from(high) {
            // Above every member's highest range: free on all of them.
            Ok(at) if at <= self.size && self.size - at >= need && self.take(at, len) => {
                Ok(block(at))
            }
            _ => Err(AmError::OutOfSymmetricHeap {
                len,
                size: self.size,
            }),
        }
    }

    /// What a symmetric collective that failed leaves here: an allocation's reservation
    /// goes back; a block whose free failed stays allocated.
    pub(crate) fn abandon(&mut self, step: HeapStep) {
        if let HeapStep::Alloc {
            reserved: Some(at), ..
        } = step
        {
            self.give_back(at);
        }
    }

    /// Gives back `block`, if it is one of this heap's: false if not.
    pub(crate) fn free(&mut self, block: Symmetric) -> bool {
        match block.offset.checked_sub(self.base) {
            Some(at) => self.give_back(at),
            None => false,
        }
    }

    /// Whether `block` is a block of this heap, taken now.
    pub(crate) fn holds(&self, block: Symmetric) -> bool {
        block.offset.checked_sub(self.base).is_some_and(|at| {
            self.used
                .get(&at)
                .is_some_and(|&n| Some(n) == taken(block.len))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The used and free ranges tile the heap, and no two free ranges touch.
    fn tiles(h: &Heap) -> bool {
        let mut all: Vec<(usize, usize, bool)> =
            h.used.iter().map(|(&a, &n)| (a, n, true)).collect();
        all.extend(h.free.iter().map(|(&a, &n)| (a, n, false)));
        all.sort_unstable();
        let mut at = 0;
        let mut last_free = false;
        for (a, n, used) in all {
            if a != at || n == 0 || (!used && last_free) {
                return false;
            }
            at = a + n;
            last_free = !used;
        }
        at == h.size
    }

    /// The all-reduce of the members' words, by maximum.
    fn reduce(words: &[[u64; PROPOSAL_WORDS]]) -> Vec<u64> {
        (0..PROPOSAL_WORDS)
            .map(|i| words.iter().map(|w| w[i]).max().unwrap())
            .collect()
    }

    /// Members whose heaps differ (a team allocated on some of them only) still agree on one
    /// block, free on each. Catches an agreement that takes one member's first fit, which
    /// another member has in use.
    #[test]
    fn members_whose_heaps_differ_agree_above_every_high_water() {
        let mut a = Heap::new(4096, 1024).unwrap();
        let mut b = Heap::new(4096, 1024).unwrap();
        a.take(0, 64);
        let (wa, ra) = a.propose(64);
        let (wb, rb) = b.propose(64);
        assert_eq!((ra, rb), (Some(64), Some(0)));
        assert!(a.take(ra.unwrap(), 64) && b.take(rb.unwrap(), 64));
        let w = reduce(&[wa, wb]);
        let x = a.agree(&w, 64, ra).unwrap();
        let y = b.agree(&w, 64, rb).unwrap();
        assert_eq!(x, y);
        assert_eq!(x.offset(), 3072 + 64);
        assert!(a.holds(x) && b.holds(y));
        assert_eq!(a.used.len(), 2, "a's proposal was given back");
        assert_eq!(b.used.len(), 1, "b's proposal was given back");
    }

    /// Out of room and mismatched sizes are the same error on every member. Catches a member
    /// that succeeds where another fails.
    #[test]
    fn errors_are_the_same_on_every_member() {
        let mut a = Heap::new(4096, 128).unwrap();
        let mut b = Heap::new(4096, 128).unwrap();
        let (wa, _) = a.propose(200);
        let (wb, _) = b.propose(200);
        let w = reduce(&[wa, wb]);
        let full = AmError::OutOfSymmetricHeap {
            len: 200,
            size: 128,
        };
        assert_eq!(a.agree(&w, 200, None), Err(full.clone()));
        assert_eq!(b.agree(&w, 200, None), Err(full));
        let mut c = Heap::new(4096, 256).unwrap();
        let (wc, rc) = c.propose(8);
        c.take(rc.unwrap(), 8);
        let w = reduce(&[a.propose(8).0, wc]);
        let mismatch = AmError::SymmetricHeapMismatch {
            smallest: 128,
            largest: 256,
        };
        assert_eq!(c.agree(&w, 8, rc), Err(mismatch));
        assert!(c.used.is_empty(), "the reservation was given back");
    }

    /// One step of the model: an allocation of `len` bytes by the members in `team` (a bit
    /// mask), or a free of the `k`-th live block (modulo) by its team.
    #[derive(Debug, Clone)]
    enum Step {
        Alloc(u8, usize),
        Free(usize),
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            3 => (1u8..16, 0usize..700).prop_map(|(t, n)| Step::Alloc(t, n)),
            1 => any::<usize>().prop_map(Step::Free),
        ]
    }

    proptest::proptest! {
        /// Four members allocate on random teams and free at random, checked against a model
        /// of each member's bytes: every member of a team gets the same block (or the same
        /// error), inside its heap and on bytes no live block of its own holds, and a block
        /// fails only where the model has no room for it on some member. Catches an
        /// agreement that overlaps a block, leaves the heap, differs between members, or
        /// reports full while a common range is free above every member's high water.
        #[test]
        fn allocations_match_a_model_of_each_members_bytes(
            steps in proptest::collection::vec(step(), 1..60)
        ) {
            const SIZE: usize = 2048;
            let mut heaps: Vec<Heap> = (0..4).map(|_| Heap::new(SIZE + 64, SIZE).unwrap()).collect();
            let mut bytes = vec![vec![false; SIZE + 64]; 4];
            let mut live: Vec<(u8, Symmetric)> = Vec::new();
            for s in steps {
                match s {
                    Step::Alloc(team, len) => {
                        let members: Vec<usize> = (0..4).filter(|m| team & (1 << m) != 0).collect();
                        let mut words = Vec::new();
                        let mut reserved = Vec::new();
                        for &m in &members {
                            let (w, r) = heaps[m].propose(len);
                            if let Some(at) = r {
                                proptest::prop_assert!(heaps[m].take(at, len));
                            }
                            words.push(w);
                            reserved.push(r);
                        }
                        let w = reduce(&words);
                        let got: Vec<_> = members
                            .iter()
                            .zip(&reserved)
                            .map(|(&m, &r)| heaps[m].agree(&w, len, r))
                            .collect();
                        proptest::prop_assert!(got.windows(2).all(|g| g[0] == g[1]), "{got:?}");
                        let need = taken(len).unwrap();
                        match &got[0] {
                            Ok(b) => {
                                proptest::prop_assert_eq!(b.len(), len);
                                proptest::prop_assert_eq!(b.offset() % SYMMETRIC_ALIGN, 0);
                                proptest::prop_assert!(b.offset() >= 64 && b.offset() + need <= SIZE + 64);
                                for &m in &members {
                                    let r = &mut bytes[m][b.offset()..b.offset() + need];
                                    proptest::prop_assert!(r.iter().all(|&x| !x), "member {m} overlaps");
                                    r.fill(true);
                                }
                                live.push((team, *b));
                            }
                            Err(AmError::OutOfSymmetricHeap { .. }) => {
                                // No room above the highest block of every member.
                                let top = members
                                    .iter()
                                    .map(|&m| bytes[m].iter().rposition(|&x| x).map_or(64, |i| i + 1))
                                    .max()
                                    .unwrap();
                                proptest::prop_assert!(top + need > SIZE + 64);
                            }
                            Err(e) => proptest::prop_assert!(false, "{e}"),
                        }
                    }
                    Step::Free(k) if !live.is_empty() => {
                        let (team, b) = live.remove(k % live.len());
                        for m in (0..4).filter(|m| team & (1 << m) != 0) {
                            proptest::prop_assert!(heaps[m].holds(b));
                            proptest::prop_assert!(heaps[m].free(b));
                            bytes[m][b.offset()..b.offset() + taken(b.len()).unwrap()].fill(false);
                        }
                    }
                    Step::Free(_) => {}
                }
                proptest::prop_assert!(heaps.iter().all(tiles), "{heaps:?}");
            }
        }
    }

    /// A heap larger than its segment is refused; one at an unaligned end is rounded in.
    #[test]
    fn the_heap_fits_its_segment_aligned() {
        assert!(Heap::new(100, 200).is_err());
        let h = Heap::new(1000, 200).unwrap();
        assert_eq!((h.base, h.size), (832, 128));
        assert_eq!(Heap::new(0, 0).unwrap().size(), 0);
    }
}
