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
}
