//! One-sided put and get on a view of the target's segment, for the NICs that reach it
//! ([`crate::Transport::rma`]): the copy is the transfer, so the operation is complete,
//! locally and remotely, when it returns, and the target does nothing. [`mapped`] carries out
//! every [`Rma`] request of a NIC that maps its peers' segments, and [`by_pieces`] breaks the
//! shapes a NIC does not move itself into the ones it does: each copy between memories is
//! written here, once.
//!
//! The copies go through [`SharedBytes`], whose loads and stores are word-wise atomic (or as
//! opaque to the compiler), so a get racing with the owner's own writes reads some mix of old
//! and new words, never undefined behaviour; what a racing pair of puts leaves is unspecified,
//! as in GASNet and OpenSHMEM. Ordering with the initiator's other traffic: a put is in the
//! target's memory before the initiator's next send to any rank, so a flag, an AM or a barrier
//! that follows it publishes it (the NICs publish their messages with `Release` stores).

use am_shm::SharedBytes;

use crate::atomic::{apply_batch, Batch};
use crate::error::SendError;
pub use crate::transport::Regions;
use crate::transport::{Remote, Rma, RmaDone, Sink, Source, Transport};
use crate::types::Rank;

/// A NIC that reaches its peers' segments as memory of this process (loopback's threads,
/// sci's imported segments, extoll's registered ones): it says how once, and [`mapped`]
/// does the rest.
pub trait MappedPeers {
    /// `rank`'s segment 0 as this rank maps it: an error naming the rank if there is no such
    /// rank, or it is gone.
    fn peer_segment(&self, rank: Rank) -> Result<SharedBytes<'_>, SendError>;
}

/// Carries out `request` on the peers' mapped segments ([`crate::Transport::rma`] for a
/// [`MappedPeers`] NIC): a put is one copy into the target's memory, a get one copy out of
/// it, an atomic one atomic instruction on its word, and a copy between a segment of this
/// rank and a peer's one pass from mapping to mapping; complete when it returns, with no
/// message and no help from the target. A batch of atomics fetches every word first, so
/// their misses overlap. [`Remote::Keyed`] is not such a NIC's: [`SendError::Unsupported`].
// Inlined whole: each caller's request is of one shape, known where it is built, so the
// match folds to that shape's copy.
#[inline(always)]
pub fn mapped<N: MappedPeers + Transport + ?Sized>(
    nic: &N,
    request: Rma<'_>,
) -> Result<RmaDone, SendError> {
    match request {
        Rma::Put {
            dest,
            to: Remote::At(offset),
            from,
        } => {
            let segment = nic.peer_segment(dest)?;
            match from {
                Source::Bytes(data) => put_into(dest, segment, offset, data)?,
                Source::Own { offset: local, len } => {
                    copy_to(dest, segment, offset, nic.segment(), local, len)?
                }
                Source::Segment(r) => copy_to(dest, segment, offset, r.bytes, 0, r.bytes.len())?,
            }
            Ok(RmaDone::moved())
        }
        Rma::Get {
            src,
            from: Remote::At(offset),
            into,
        } => {
            let segment = nic.peer_segment(src)?;
            match into {
                Sink::Bytes(dst) => get_from(src, segment, offset, dst)?,
                Sink::Own { offset: local, len } => {
                    copy_from(src, segment, offset, nic.segment(), local, len)?
                }
                Sink::Segment(r) => copy_from(src, segment, offset, r.bytes, 0, r.bytes.len())?,
            }
            Ok(RmaDone::moved())
        }
        Rma::Put {
            dest,
            to: Remote::Regions(regions),
            from: Source::Bytes(data),
        } => {
            let segment = nic.peer_segment(dest)?;
            for (offset, bytes) in regions.pieces(data)? {
                put_into(dest, segment, offset, bytes)?;
            }
            Ok(RmaDone::moved())
        }
        Rma::Get {
            src,
            from: Remote::Regions(regions),
            into: Sink::Bytes(dst),
        } => {
            let segment = nic.peer_segment(src)?;
            for (offset, into) in regions.pieces_mut(dst)? {
                get_from(src, segment, offset, into)?;
            }
            Ok(RmaDone::moved())
        }
        Rma::Atomic {
            dest,
            at: Remote::At(offset),
            atomic,
        } => Ok(RmaDone::old(atomic.apply_to(
            dest,
            nic.peer_segment(dest)?,
            offset,
        )?)),
        Rma::Atomics { batch, outcome } => {
            let applied = apply_batch(batch, |d| nic.peer_segment(d));
            *outcome = Batch::all(batch.len(), applied);
            Ok(RmaDone::moved())
        }
        _ => Err(SendError::Unsupported(
            "this shape of RMA on mapped segments",
        )),
    }
}

/// Carries out `request` through the shapes a NIC moves itself, for a NIC that moves only
/// some: a put or get of regions becomes one contiguous request per region
/// ([`Remote::At`]), a put from or get into a range of a segment goes through a buffer of
/// its length (copied by this module's copies, which hold no Rust reference over the range:
/// peers may write it meanwhile), and a batch of atomics becomes one [`Rma::Atomic`] each, in
/// order (one refused for good does not stop the others; a busy device stops the batch).
/// Each piece goes to `t`'s own [`Transport::rma`], which must take contiguous requests from
/// and into [`Source::Bytes`] and [`Sink::Bytes`] itself; handed one of those, this is
/// [`SendError::Unsupported`] (never a loop back into `t`).
pub fn by_pieces<T: Transport + ?Sized>(t: &mut T, request: Rma<'_>) -> Result<RmaDone, SendError> {
    match request {
        Rma::Put {
            dest,
            to: Remote::Regions(regions),
            from: Source::Bytes(data),
        } => {
            for (offset, bytes) in regions.pieces(data)? {
                t.rma(Rma::Put {
                    dest,
                    to: Remote::At(offset),
                    from: Source::Bytes(bytes),
                })?;
            }
            Ok(RmaDone::moved())
        }
        Rma::Get {
            src,
            from: Remote::Regions(regions),
            into: Sink::Bytes(dst),
        } => {
            for (offset, into) in regions.pieces_mut(dst)? {
                t.rma(Rma::Get {
                    src,
                    from: Remote::At(offset),
                    into: Sink::Bytes(into),
                })?;
            }
            Ok(RmaDone::moved())
        }
        Rma::Put {
            dest,
            to,
            from: Source::Own { offset, len },
        } => {
            let bounce = read_range(t.rank(), own_slice(t.segment(), offset, len)?)?;
            t.rma(Rma::Put {
                dest,
                to,
                from: Source::Bytes(&bounce),
            })
        }
        Rma::Get {
            src,
            from,
            into: Sink::Own { offset, len },
        } => {
            let mut bounce = vec![0u8; len];
            let done = t.rma(Rma::Get {
                src,
                from,
                into: Sink::Bytes(&mut bounce),
            })?;
            let me = t.rank();
            put_into(me, own_slice(t.segment(), offset, len)?, 0, &bounce)?;
            Ok(done)
        }
        Rma::Put {
            dest,
            to,
            from: Source::Segment(range),
        } => {
            let bounce = read_range(t.rank(), range.bytes)?;
            t.rma(Rma::Put {
                dest,
                to,
                from: Source::Bytes(&bounce),
            })
        }
        Rma::Get {
            src,
            from,
            into: Sink::Segment(range),
        } => {
            let mut bounce = vec![0u8; range.bytes.len()];
            let done = t.rma(Rma::Get {
                src,
                from,
                into: Sink::Bytes(&mut bounce),
            })?;
            put_into(t.rank(), range.bytes, 0, &bounce)?;
            Ok(done)
        }
        Rma::Atomics { batch, outcome } => {
            *outcome = crate::atomic::each_posted(batch, |p| {
                t.rma(Rma::Atomic {
                    dest: p.dest,
                    at: Remote::At(p.offset),
                    atomic: p.atomic,
                })
                .map(drop)
            });
            Ok(RmaDone::moved())
        }
        _ => Err(SendError::Unsupported("a contiguous RMA request by pieces")),
    }
}

/// A private copy of `range`, this rank's (`me`).
fn read_range(me: Rank, range: SharedBytes<'_>) -> Result<Vec<u8>, SendError> {
    let mut bounce = vec![0u8; range.len()];
    get_from(me, range, 0, &mut bounce)?;
    Ok(bounce)
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
/// (`segment`, as this rank maps it), in one pass ([`Source::Segment`]).
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
/// (`own`), in one pass ([`Sink::Segment`]). Failing as [`copy_to`].
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
