//! One-sided put and get on a view of the target's segment, for the NICs that reach it
//! ([`crate::Transport::put`], [`crate::Transport::get`]): the copy is the transfer, so the
//! operation is complete, locally and remotely, when it returns, and the target does nothing.
//!
//! The copies go through [`SharedBytes`], whose loads and stores are word-wise atomic (or as
//! opaque to the compiler), so a get racing with the owner's own writes reads some mix of old
//! and new words, never undefined behaviour; what a racing pair of puts leaves is unspecified,
//! as in GASNet and OpenSHMEM. Ordering with the initiator's other traffic: a put is in the
//! target's memory before the initiator's next send to any rank, so a flag, an AM or a barrier
//! that follows it publishes it (the NICs publish their messages with `Release` stores).

use am_shm::SharedBytes;

use crate::error::SendError;
use crate::types::Rank;

/// Where a strided or indexed transfer's bytes go in the target's segment, region by region,
/// in the order of its data ([`crate::Node::put_strided`], [`crate::Node::put_indexed`],
/// [`crate::Transport::put_regions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Regions<'a> {
    /// `count` blocks of `block` bytes, one every `stride` bytes from `offset`.
    Strided {
        /// The first block's offset.
        offset: usize,
        /// Bytes from one block's start to the next's.
        stride: usize,
        /// Bytes per block.
        block: usize,
        /// Blocks.
        count: usize,
    },
    /// (offset, length) pairs.
    Indexed(&'a [(usize, usize)]),
}

impl<'a> Regions<'a> {
    /// The regions, in order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, usize)> + use<'a> {
        let (strided, indexed) = match *self {
            Regions::Strided {
                offset,
                stride,
                block,
                count,
            } => (Some((offset, stride, block, count)), &[][..]),
            Regions::Indexed(r) => (None, r),
        };
        let strided = strided
            .into_iter()
            .flat_map(|(offset, stride, block, count)| {
                (0..count).map(move |i| (offset.wrapping_add(i.wrapping_mul(stride)), block))
            });
        strided.chain(indexed.iter().copied())
    }

    /// Each region's offset with its bytes of `data`, in order. A `data` that does not hold
    /// exactly the regions' bytes is [`SendError::Device`] (the core checks it first).
    pub fn pieces<'d>(
        &self,
        data: &'d [u8],
    ) -> Result<impl Iterator<Item = (usize, &'d [u8])> + use<'a, 'd>, SendError> {
        self.fits(data.len())?;
        let mut rest = data;
        Ok(self.iter().map(move |(offset, len)| {
            let (bytes, after) = rest.split_at(len);
            rest = after;
            (offset, bytes)
        }))
    }

    /// [`Regions::pieces`] of a buffer to fill.
    pub fn pieces_mut<'d>(
        &self,
        dst: &'d mut [u8],
    ) -> Result<impl Iterator<Item = (usize, &'d mut [u8])> + use<'a, 'd>, SendError> {
        self.fits(dst.len())?;
        let mut rest = dst;
        Ok(self.iter().map(move |(offset, len)| {
            let (bytes, after) = std::mem::take(&mut rest).split_at_mut(len);
            rest = after;
            (offset, bytes)
        }))
    }

    /// Whether a buffer of `len` bytes holds exactly the regions' bytes.
    fn fits(&self, len: usize) -> Result<(), SendError> {
        if self.total() == Some(len) {
            Ok(())
        } else {
            Err(SendError::device(format!(
                "a transfer of {len} bytes into or out of regions of another total"
            )))
        }
    }

    /// How many regions.
    pub fn count(&self) -> usize {
        match *self {
            Regions::Strided { count, .. } => count,
            Regions::Indexed(r) => r.len(),
        }
    }

    /// The bytes of all regions, or `None` if they overflow.
    pub fn total(&self) -> Option<usize> {
        match *self {
            Regions::Strided { block, count, .. } => block.checked_mul(count),
            Regions::Indexed(r) => r.iter().try_fold(0usize, |a, &(_, n)| a.checked_add(n)),
        }
    }

    /// The lowest offset and the end of the highest region, or `None` if an end overflows
    /// (a strided transfer's regions lie between its first and last block; an empty one
    /// is `Some((0, 0))`).
    pub fn span(&self) -> Option<(usize, usize)> {
        match *self {
            Regions::Strided { count: 0, .. } => Some((0, 0)),
            Regions::Strided {
                offset,
                stride,
                block,
                count,
            } => {
                let last = (count - 1).checked_mul(stride)?.checked_add(offset)?;
                Some((offset, last.checked_add(block)?))
            }
            Regions::Indexed(r) => r
                .iter()
                .try_fold((usize::MAX, 0), |(lo, hi), &(o, n)| {
                    Some((lo.min(o), hi.max(o.checked_add(n)?)))
                })
                .map(|(lo, hi)| if r.is_empty() { (0, 0) } else { (lo, hi) }),
        }
    }
}

/// Copies `data` to `offset` of `dest`'s segment (`segment`, as this rank maps it).
/// The range outside the segment is [`SendError::Device`] naming `dest`.
pub fn put_into(
    dest: Rank,
    segment: SharedBytes<'_>,
    offset: usize,
    data: &[u8],
) -> Result<(), SendError> {
    segment
        .write(offset, data)
        .map_err(|e| outside(dest, offset, data.len(), e))
}

/// Copies `dst.len()` bytes at `offset` of `src`'s segment (`segment`, as this rank maps it)
/// into `dst`. The range outside the segment is [`SendError::Device`] naming `src`.
pub fn get_from(
    src: Rank,
    segment: SharedBytes<'_>,
    offset: usize,
    dst: &mut [u8],
) -> Result<(), SendError> {
    let len = dst.len();
    segment
        .read(offset, dst)
        .map_err(|e| outside(src, offset, len, e))
}

/// Copies `len` bytes at `local` of this rank's segment (`own`) to `offset` of `dest`'s
/// (`segment`, as this rank maps it), in one pass ([`crate::Transport::put_from_segment`]).
/// A range outside either segment is [`SendError::Device`] naming the rank.
pub fn copy_to(
    dest: Rank,
    segment: SharedBytes<'_>,
    offset: usize,
    own: SharedBytes<'_>,
    local: usize,
    len: usize,
) -> Result<(), SendError> {
    let from = own
        .slice(local, len)
        .map_err(|e| outside_own(local, len, e))?;
    segment
        .copy_from(offset, from)
        .map_err(|e| outside(dest, offset, len, e))
}

/// Copies `len` bytes at `offset` of `src`'s segment (`segment`) to `local` of this rank's
/// (`own`), in one pass ([`crate::Transport::get_into_segment`]). Failing as [`copy_to`].
pub fn copy_from(
    src: Rank,
    segment: SharedBytes<'_>,
    offset: usize,
    own: SharedBytes<'_>,
    local: usize,
    len: usize,
) -> Result<(), SendError> {
    let from = segment
        .slice(offset, len)
        .map_err(|e| outside(src, offset, len, e))?;
    own.copy_from(local, from)
        .map_err(|e| outside_own(local, len, e))
}

/// `len` bytes at `local` of this rank's own segment (`own`), or [`SendError::Device`].
pub fn own_slice(
    own: SharedBytes<'_>,
    local: usize,
    len: usize,
) -> Result<SharedBytes<'_>, SendError> {
    own.slice(local, len)
        .map_err(|e| outside_own(local, len, e))
}

/// A range outside this rank's own segment (of a copy between segments).
#[cold]
fn outside_own(local: usize, len: usize, e: am_shm::ShmError) -> SendError {
    SendError::device_from(format!("{len} bytes at {local} of this rank's segment"), e)
}

#[cold]
fn outside(rank: Rank, offset: usize, len: usize, e: am_shm::ShmError) -> SendError {
    SendError::device_from(
        format!("{len} bytes at {offset} of rank {rank}'s segment"),
        e,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use am_shm::Segment;

    #[test]
    fn put_then_get_round_trips_at_any_alignment() {
        let seg = Segment::heap(64, 256).unwrap();
        let view = seg.byte_area();
        for (offset, len) in [(0, 0), (3, 1), (5, 17), (200, 56), (0, 256)] {
            let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7) ^ 0x5a).collect();
            assert_eq!(put_into(1, view, offset, &data), Ok(()));
            let mut back = vec![0u8; len];
            assert_eq!(get_from(1, view, offset, &mut back), Ok(()));
            assert_eq!(back, data, "{len} bytes at {offset}");
        }
    }

    #[test]
    fn outside_the_segment_is_an_error_naming_the_rank_and_writes_nothing() {
        let seg = Segment::heap(64, 128).unwrap();
        let view = seg.byte_area();
        view.fill(0, 128, 0xee).unwrap();
        let e = put_into(3, view, 120, &[0; 9]).unwrap_err();
        assert!(
            matches!(&e, SendError::Device(d) if d.what().contains("rank 3")),
            "{e:?}"
        );
        assert!(
            view.to_vec().iter().all(|&b| b == 0xee),
            "a refused put wrote"
        );
        let mut dst = [1u8; 2];
        let e = get_from(4, view, usize::MAX, &mut dst).unwrap_err();
        assert!(
            matches!(&e, SendError::Device(d) if d.what().contains("rank 4")),
            "{e:?}"
        );
    }

    /// A strided description lists the blocks it says, and its span and total agree with the
    /// list; one whose last block's end overflows has no span (refused before anything is
    /// written), and an indexed one's span is its lowest start and highest end.
    #[test]
    fn regions_describe_their_blocks() {
        let s = Regions::Strided {
            offset: 10,
            stride: 100,
            block: 8,
            count: 3,
        };
        assert_eq!(s.iter().collect::<Vec<_>>(), [(10, 8), (110, 8), (210, 8)]);
        assert_eq!(
            (s.count(), s.total(), s.span()),
            (3, Some(24), Some((10, 218)))
        );
        let huge = Regions::Strided {
            offset: 1,
            stride: usize::MAX / 2,
            block: 8,
            count: 3,
        };
        assert_eq!(huge.span(), None);
        let none = Regions::Strided {
            offset: 5,
            stride: 1,
            block: 1,
            count: 0,
        };
        assert_eq!(
            (none.iter().count(), none.total(), none.span()),
            (0, Some(0), Some((0, 0)))
        );
        let i = Regions::Indexed(&[(50, 4), (8, 2), (60, 0)]);
        assert_eq!((i.total(), i.span()), (Some(6), Some((8, 60))));
        assert_eq!(Regions::Indexed(&[(usize::MAX, 2)]).span(), None);
    }
}
