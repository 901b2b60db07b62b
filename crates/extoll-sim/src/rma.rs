//! The RMA engine: performs puts and gets between a rank's memory and registered regions, and
//! writes completion notifications into the notification queues of the requester and of the
//! completer, which their owners poll.
//!
//! One put routine, [`put`], used two ways:
//! - **immediate** (the doorbell write carries the source): AM Long payloads and RMA-buffered
//!   Mediums come from the caller's own (unregistered) buffer, so the engine processes that
//!   descriptor while the requester rings, on the requester's thread: the payload goes
//!   straight into the target's registered region, one copy, with no thread hand-off. The
//!   notification slots are reserved first ([`Reserved`]), so finishing never waits;
//! - **queued**: user puts and gets between registered regions ([`Job`]) go to the engine's
//!   thread (started on first use), which overlaps them with the rank's own work and waits
//!   for room in a full notification queue. When idle it sleeps in a channel receive.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use am_shm::{Imported, Segment, ShmError};
use crossbeam_channel::{unbounded, Sender};

use crate::layout::{claim_word, Layout, CLAIM_ENGINE, CLAIM_NOTES, DOORBELL};

/// A peer's segment as this process maps it: atomic access for mailbox and notification
/// claims, reads for gets, writes for everything else.
pub(crate) struct PeerMap {
    pub seg: Segment,
    pub imp: Imported,
}

/// Notification kinds (the high half of the notification's meta word).
pub(crate) mod kind {
    /// Completer: a Long payload from `src` landed in our segment.
    pub const LONG_LANDED: u32 = 1;
    /// Completer: an RMA Medium from `src` landed in our receive buffer.
    pub const MEDIUM_LANDED: u32 = 2;
    /// Completer: a user put from `src` landed.
    pub const PUT_LANDED: u32 = 3;
    /// Either side: a reserved slot given back unused (the put was refused for back-pressure
    /// after its slots were reserved).
    pub const NONE: u32 = 4;
    /// Requester: the put of a Long payload of `value` bytes is done.
    pub const LONG_SENT: u32 = 8;
    /// Requester: an RMA Medium put is done.
    pub const MEDIUM_SENT: u32 = 9;
    /// Requester: user operation `value` is done.
    pub const USER_DONE: u32 = 10;
}

/// One notification: its kind and value.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Note {
    pub kind: u32,
    pub value: u64,
}

/// Queued work for the engine's thread. Offsets are in the byte areas, checked by the
/// submitter.
pub(crate) enum Job {
    /// Copy `len` bytes from our `src` to `dest`'s `dst`, then notify the completer and the
    /// requester.
    Put {
        dest: usize,
        src: usize,
        dst: usize,
        len: usize,
        completer: Note,
        requester: Note,
    },
    /// Copy `len` bytes from `from`'s `src` to our `dst`, then notify the requester.
    Get {
        from: usize,
        src: usize,
        dst: usize,
        len: usize,
        requester: Note,
    },
}

pub(crate) struct Engine {
    jobs: Option<Sender<Job>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Fills the claimed notification slot `ticket` of `target`'s queue with `note` from `src`,
/// and rings its doorbell if it sleeps.
pub(crate) fn post(layout: &Layout, target: &PeerMap, ticket: u64, src: usize, note: Note) -> bool {
    let ring = layout.notifications();
    let ok = ring
        .write(&target.imp, ticket, 0, &note.value.to_le_bytes())
        .is_ok()
        && ring
            .publish(&target.imp, ticket, (src as u32 & 0xffff) | note.kind << 16)
            .is_ok();
    if let Ok(bell) = target.seg.doorbell(DOORBELL) {
        bell.ring_tagged_lazy(0);
    }
    ok
}

/// Writes a notification from `src` into `target`'s queue, waiting for room while the owner
/// drains it. False if stopped or the queue is corrupt.
pub(crate) fn notify(
    layout: &Layout,
    target: &PeerMap,
    src: usize,
    note: Note,
    stop: &AtomicBool,
) -> bool {
    let ring = layout.notifications();
    // The owner's head only grows: 0 is a safe (pessimistic) start.
    let mut head = 0;
    loop {
        match ring.try_claim(&target.seg, 1, &mut head) {
            Ok(Some(t)) => {
                let _ = target
                    .imp
                    .store_word(layout.claims(src, CLAIM_ENGINE), claim_word(t, 1));
                return post(layout, target, t, src, note);
            }
            Ok(None) if !stop.load(Ordering::Relaxed) => std::thread::yield_now(),
            _ => return false,
        }
    }
}

/// Notification slots claimed before an immediate put: one in the requester's queue, and
/// one in the completer's. Each must be posted exactly once ([`put`] or [`Reserved::cancel`]).
pub(crate) struct Reserved {
    completer: Option<(usize, u64)>,
    requester: u64,
}

impl Reserved {
    /// Claims a slot in our own queue (`rank`) and, with `dest`, one in `dest`'s. `None` if a
    /// queue is full (back-pressure; nothing stays claimed). `heads` caches each queue's
    /// head for the claims. `dest`'s slot is recorded in its claim word for us, so that
    /// `dest` can skip it if we die during the put.
    pub fn try_new(
        layout: &Layout,
        peers: &[PeerMap],
        rank: usize,
        dest: Option<usize>,
        heads: &mut [u64],
    ) -> Result<Option<Reserved>, ShmError> {
        let ring = layout.notifications();
        let Some(requester) = ring.try_claim(&peers[rank].seg, 1, &mut heads[rank])? else {
            return Ok(None);
        };
        let mut r = Reserved {
            completer: None,
            requester,
        };
        if let Some(d) = dest {
            match ring.try_claim(&peers[d].seg, 1, &mut heads[d]) {
                Ok(Some(t)) => {
                    let _ = peers[d]
                        .imp
                        .store_word(layout.claims(rank, CLAIM_NOTES), claim_word(t, 1));
                    r.completer = Some((d, t));
                }
                other => {
                    r.cancel(layout, peers, rank);
                    return other.map(|_| None);
                }
            }
        }
        Ok(Some(r))
    }

    /// Gives the slots back unused (as [`kind::NONE`] notifications).
    pub fn cancel(self, layout: &Layout, peers: &[PeerMap], rank: usize) {
        let none = Note {
            kind: kind::NONE,
            value: 0,
        };
        if let Some((d, t)) = self.completer {
            post(layout, &peers[d], t, rank, none);
        }
        post(layout, &peers[rank], self.requester, rank, none);
    }
}

/// How a put's notifications get their slots.
pub(crate) enum Slots<'a> {
    /// Reserved before the put started (immediate puts).
    Reserved(Reserved),
    /// Claimed after the copy, waiting for room unless `stop` (the engine's thread).
    Wait(&'a AtomicBool),
}

/// The engine's put: copies `src` into `dest`'s byte area at `dst`, stores `tail` (an RMA
/// Medium's tail word) with `Release`, then notifies the completer (if any) and the requester
/// (`rank`). Bounds are the submitter's to check; a failed write leaves the bytes unwritten,
/// and the completer's own checks (RMA Medium markers) see it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn put(
    layout: &Layout,
    peers: &[PeerMap],
    rank: usize,
    dest: usize,
    dst: usize,
    src: &[&[u8]],
    tail: Option<(usize, u64)>,
    completer: Option<Note>,
    requester: Note,
    slots: Slots<'_>,
) -> bool {
    let target = &peers[dest];
    let mut at = dst;
    for s in src {
        let _ = target.imp.write(at, s);
        at += s.len();
    }
    if let Some((off, value)) = tail {
        let _ = target.imp.store_slot_word(off, value);
    }
    match slots {
        Slots::Reserved(r) => {
            if let Some((d, t)) = r.completer {
                let none = Note {
                    kind: kind::NONE,
                    value: 0,
                };
                post(layout, &peers[d], t, rank, completer.unwrap_or(none));
            }
            post(layout, &peers[rank], r.requester, rank, requester)
        }
        Slots::Wait(stop) => {
            if let Some(note) = completer {
                notify(layout, target, rank, note, stop);
            }
            notify(layout, &peers[rank], rank, requester, stop)
        }
    }
}

impl Engine {
    pub fn start(rank: usize, layout: Layout, peers: Arc<Vec<PeerMap>>) -> std::io::Result<Engine> {
        let (jobs, rx) = unbounded::<Job>();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("extoll-rma-{rank}"))
            .spawn(move || {
                let me = &peers[rank];
                for job in rx {
                    match job {
                        Job::Put {
                            dest,
                            src,
                            dst,
                            len,
                            completer,
                            requester,
                        } => {
                            let bytes = me.seg.bytes(src, len).unwrap_or(&[]);
                            put(
                                &layout,
                                &peers,
                                rank,
                                dest,
                                dst,
                                &[bytes],
                                None,
                                Some(completer),
                                requester,
                                Slots::Wait(&halt),
                            );
                        }
                        Job::Get {
                            from,
                            src,
                            dst,
                            len,
                            requester,
                        } => {
                            if let Ok(bytes) = peers[from].seg.bytes(src, len) {
                                let _ = me.imp.write(dst, bytes);
                            }
                            notify(&layout, me, rank, requester, &halt);
                        }
                    }
                }
            })?;
        Ok(Engine {
            jobs: Some(jobs),
            stop,
            thread: Some(thread),
        })
    }

    /// Queues a job; false if the engine has stopped.
    pub fn submit(&self, job: Job) -> bool {
        self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok())
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Finish the queued jobs (bounded: a dead target's full queue must not hang us).
        self.jobs = None;
        let deadline = Instant::now() + Duration::from_secs(1);
        while let Some(t) = &self.thread {
            if t.is_finished() || Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
