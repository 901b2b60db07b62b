//! Full-access views for the Portals NIC model (`portals-sim`).
//!
//! SCI's imported segment can only be written ([`crate::Imported`]). A Portals NIC does more
//! at the target: it walks the target's match list (reads), claims locally managed offsets
//! and use-once entries with atomic read-modify-writes, and serves gets by reading the
//! target's memory. In this model the initiator's process plays the wire and the target's
//! NIC logic, so it needs the target's segment with the owner's access: word atomics
//! ([`Segment::word`], or [`Segment::words`] for a whole record), copies out ([`Segment::read`]) and, through [`Segment::import`],
//! copies in. This module adds no `unsafe` code: it exposes the mapping the floors already
//! use, under a name that says what it is for.
//!
//! ```
//! use std::sync::atomic::Ordering;
//! let seg = am_shm::Segment::heap(64, 64).unwrap();
//! // In one process the owner's own handle serves as the NIC view (tests, Miri).
//! let nic: &am_shm::Segment = &seg;
//! assert_eq!(nic.word(8).unwrap().fetch_add(16, Ordering::AcqRel), 0);
//! assert_eq!(seg.load_word(8).unwrap(), 16);
//! ```

use crate::{Segment, ShmError};

/// Maps segment `name` of job `job_id` (created by its owner with exactly this layout) with
/// full access, as the Portals NIC of an initiator sees its target. Unlike
/// [`Segment::create`], the returned handle does not own the file: dropping it does not
/// remove it.
pub fn attach_nic(
    job_id: &str,
    name: &str,
    words: usize,
    bytes: usize,
) -> Result<Segment, ShmError> {
    Segment::attach(job_id, name, words, bytes)
}

#[cfg(all(test, not(miri), not(loom)))]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn attached_view_shares_atomics_and_bytes_with_the_owner() {
        let job = format!("amshmportal{}", std::process::id());
        let mut owner = Segment::create(&job, "p", 64, 128).unwrap();
        let nic = attach_nic(&job, "p", 64, 128).unwrap();
        assert!(attach_nic(&job, "p", 64, 64).is_err(), "layout mismatch");
        owner.unlink().unwrap();
        // A claim by the NIC view is seen by the owner, and the other way round.
        assert_eq!(nic.word(16).unwrap().fetch_add(40, Ordering::AcqRel), 0);
        assert_eq!(owner.word(16).unwrap().fetch_add(8, Ordering::AcqRel), 40);
        assert_eq!(nic.load_word(16).unwrap(), 48);
        nic.import().write(100, b"deposit").unwrap();
        assert_eq!(owner.view(100, 7).unwrap().to_vec(), b"deposit");
        owner.byte_area().write(0, b"get").unwrap();
        let mut out = [0u8; 3];
        nic.read(0, &mut out).unwrap();
        assert_eq!(&out, b"get");
        drop(nic);
        assert!(!am_shm_path_exists(&job));
    }

    fn am_shm_path_exists(job: &str) -> bool {
        crate::segment::segment_path(job, "p").unwrap().exists()
    }
}

/// Heap-backed checks, run under Miri too: the operations the Portals model performs on a
/// target's memory from several initiators at once.
#[cfg(all(test, not(loom)))]
mod heap_tests {
    use crate::Segment;
    use std::sync::atomic::Ordering;

    /// Locally managed offsets: concurrent claims get disjoint ranges, and each deposit is
    /// read back intact after the claimant publishes it.
    #[test]
    fn concurrent_offset_claims_are_disjoint() {
        let seg = Segment::heap(64 * 3, 256).unwrap();
        let per = if cfg!(miri) { 4 } else { 8 };
        std::thread::scope(|s| {
            for t in 0..2u8 {
                let seg = &seg;
                s.spawn(move || {
                    let imp = seg.import();
                    for i in 0..per {
                        let off = seg.word(0).unwrap().fetch_add(8, Ordering::AcqRel) as usize;
                        imp.write(off, &[t * 16 + i as u8; 8]).unwrap();
                        seg.word(64 + 64 * t as usize)
                            .unwrap()
                            .fetch_add(1, Ordering::Release);
                    }
                });
            }
        });
        assert_eq!(seg.load_word(0).unwrap(), 2 * 8 * per as u64);
        let mut seen = Vec::new();
        for k in 0..2 * per {
            let b = seg.view(k * 8, 8).unwrap().to_vec();
            assert!(b.iter().all(|&x| x == b[0]), "a deposit was torn");
            seen.push(b[0]);
        }
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 2 * per, "every claim got its own range");
    }
}
