//! The RMA engine: performs puts and gets between a rank's memory and registered regions, and
//! writes completion notifications into the notification queues of the requester and of the
//! completer, which their owners poll.
//!
//! One put, used two ways:
//! - **immediate** (the doorbell write carries the source): AM Long payloads and RMA-buffered
//!   Mediums come from the caller's own (unregistered) buffer, so the engine processes that
//!   descriptor while the requester rings, on the requester's thread: the payload goes
//!   straight into the target's registered region, one copy, with no thread hand-off. The
//!   completer's notification slot is reserved first ([`Reserved`]), so finishing never
//!   waits, and no requester notification is asked for. The one-sided puts and gets of
//!   `Transport::put`/`get` (a `Node`'s put and get) are immediate descriptors too, with no
//!   notification at either end: in this model the engine's transfer is the copy made on the
//!   requester's thread (a get's the other way), so they are complete when the call returns;
//! - **queued**: user puts and gets between registered regions ([`Job`]) go to the engine's
//!   thread (started on first use), which overlaps them with the rank's own work and waits
//!   for room in a full notification queue ([`notify`]), but not for ever: it gives up when
//!   the target is lost or departed, when the engine stops, or after [`NOTIFY_PATIENCE`],
//!   and the requester then learns that the put was not notified. When idle it sleeps in a
//!   channel receive.
//!
//! Every slot is claimed through `am_shm::mailbox`, whose claims name their claimer: a rank's
//! main thread and its engine thread are two claimers ([`notes_claimer`]), each with its own
//! record in the target's segment ([`CLAIM_NOTES`](crate::layout::CLAIM_NOTES),
//! [`CLAIM_ENGINE`]), released once its notifications are posted. The main thread claims
//! through a port per peer (`am_shm::mailbox::Port`, checked once, at start).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use am_nic::wake::Wakers;
use am_shm::mailbox::Port;
use am_shm::{Imported, Rung, Segment, ShmError};
use crossbeam_channel::{unbounded, Sender};

use crate::layout::{notes_claimer, Layout, CLAIM_ENGINE, DOORBELL};

/// How long the engine's thread waits for room in a live peer's full notification queue
/// before it gives up on that notification.
pub(crate) const NOTIFY_PATIENCE: Duration = Duration::from_secs(10);
/// How often a waiting engine looks whether its target is still alive.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// A peer's segment as this process maps it: full access for claims and the engine's queued
/// gets; the imported view for everything else (writes, and the immediate gets of
/// `Transport::get`).
pub(crate) struct PeerMap {
    pub seg: Segment,
    pub imp: Imported,
    /// The peer's rank, and what wakes it when it sleeps armed on its wake socket.
    pub rank: am_core::Rank,
    pub wakers: Arc<Wakers>,
}

impl PeerMap {
    /// After a ring of the peer's doorbell: wakes it on its socket if the ring found it armed.
    #[inline(always)]
    pub fn rang(&self, rung: Rung) {
        if rung == Rung::Armed {
            self.wakers.wake(self.rank);
        }
    }
}

/// Notification kinds (the high half of the notification's meta word).
pub(crate) mod kind {
    /// Completer: a Long payload of `value` bytes from `src` landed in our segment.
    pub const LONG_LANDED: u32 = 1;
    /// Completer: RMA Medium number `value` from `src` landed in our receive buffer.
    pub const MEDIUM_LANDED: u32 = 2;
    /// Completer: a user put of `value` bytes from `src` landed.
    pub const PUT_LANDED: u32 = 3;
    // 8 and 9 were requester notifications of immediate puts, which now ask for none.
    /// Requester: user operation `value` is done.
    pub const USER_DONE: u32 = 10;
    /// Requester: user put `value` landed, but its target was lost or departed before its
    /// completer notification could be posted.
    pub const USER_LOST: u32 = 11;
    /// Requester: user put `value` landed, but its target's notification queue stayed full
    /// (or corrupt) for [`super::NOTIFY_PATIENCE`]: the target was not notified.
    pub const USER_UNNOTIFIED: u32 = 12;
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
    /// Copy `len` bytes from our `src` to `dest`'s `dst`, then notify the completer (a
    /// [`kind::PUT_LANDED`]) and the requester (user operation `op`).
    Put {
        dest: usize,
        src: usize,
        dst: usize,
        len: usize,
        op: u64,
    },
    /// Copy `len` bytes from `from`'s `src` to our `dst`, then notify the requester.
    Get {
        from: usize,
        src: usize,
        dst: usize,
        len: usize,
        op: u64,
    },
}

/// One rank's RMA engine: the thread that runs its queued puts and gets (see the module docs).
pub(crate) struct RmaEngine {
    jobs: Option<Sender<Job>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Fills the claimed notification slot `ticket` of `target`'s queue with `note` from `src`
/// and rings its doorbell if it sleeps. The caller releases its claim record afterwards.
pub(crate) fn post(
    layout: &Layout,
    target: &PeerMap,
    ticket: u64,
    src: usize,
    note: Note,
) -> Result<(), ShmError> {
    let ring = layout.notifications();
    ring.write(&target.imp, ticket, 0, &note.value.to_le_bytes())?;
    ring.publish(&target.imp, ticket, (src as u32 & 0xffff) | note.kind << 16)?;
    target.rang(target.seg.doorbell(DOORBELL)?.ring_tagged_lazy(0));
    Ok(())
}

/// Why the engine gave up a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GaveUp {
    /// The engine is stopping.
    Stopped,
    /// The target was lost or departed.
    Lost,
    /// The target's queue stayed full for the engine's patience, or is corrupt.
    Stalled,
}

/// What the engine's thread needs to wait for room without waiting for ever.
pub(crate) struct Waiter<'a> {
    pub layout: &'a Layout,
    pub peers: &'a [PeerMap],
    pub rank: usize,
    pub pids: &'a [Option<nix::unistd::Pid>],
    pub stop: &'a AtomicBool,
    pub patience: Duration,
}

impl Waiter<'_> {
    /// Whether `target` has left: its departed word (in our segment) is set, or its process
    /// is gone.
    fn gone(&self, target: usize) -> bool {
        let departed = self.peers[self.rank]
            .seg
            .load_word(self.layout.departed(target))
            .unwrap_or(0)
            != 0;
        departed
            || self
                .pids
                .get(target)
                .copied()
                .flatten()
                .is_some_and(|p| !am_bootstrap::process_alive(p))
    }
}

/// Writes a notification from the engine's thread (claimer [`notes_claimer`]`(rank, true)`)
/// into `target`'s queue, waiting for room while the owner drains it. Every wait is bounded:
/// the engine stops, the target (a peer) is lost or departed, or `patience` runs out.
pub(crate) fn notify(w: &Waiter<'_>, target: usize, note: Note) -> Result<(), GaveUp> {
    let ring = w.layout.notifications();
    let peer = &w.peers[target];
    let record = w.layout.claims(w.rank, CLAIM_ENGINE);
    let me = notes_claimer(w.rank, true);
    // The owner's head only grows: 0 is a safe (pessimistic) start.
    let mut head = 0;
    let mut t = [0u64; 1];
    let start = Instant::now();
    let mut looked = start;
    loop {
        match ring.try_claim(&peer.seg, 1, me, record, &mut head, &mut t) {
            Ok(true) => {
                let posted = post(w.layout, peer, t[0], w.rank, note);
                if posted.is_err() {
                    let _ = ring.skip(&peer.imp, t[0], me);
                }
                let _ = ring.release(&peer.imp, record);
                return posted.map_err(|_| GaveUp::Stalled);
            }
            Ok(false) => {}
            // A corrupt queue: waiting would not mend it.
            Err(_) => return Err(GaveUp::Stalled),
        }
        if w.stop.load(Ordering::Relaxed) {
            return Err(GaveUp::Stopped);
        }
        let now = Instant::now();
        if target != w.rank && now.duration_since(looked) >= LOOK_EVERY {
            looked = now;
            if w.gone(target) {
                return Err(GaveUp::Lost);
            }
            if now.duration_since(start) >= w.patience {
                return Err(GaveUp::Stalled);
            }
        }
        std::thread::yield_now();
    }
}

/// The completer's notification slot, claimed before an immediate put. It must be used once
/// ([`finish`](Self::finish) or [`cancel`](Self::cancel)).
///
/// An EXTOLL RMA command selects which notifications the engine writes. An immediate put asks
/// for the completer's only: its requester knows the put is done when the doorbell write
/// returns, so a requester notification would cost a claim and a post in its own queue and
/// tell it nothing.
pub(crate) struct Reserved {
    completer: u64,
}

impl Reserved {
    /// Claims a slot in `dest`'s queue as claimer [`notes_claimer`]`(rank, false)`. `None` if
    /// the queue is full (back-pressure; nothing stays claimed). `heads` caches each queue's
    /// head for the claims (reset after an error). The NIC claims through its port
    /// ([`claim`](Self::claim)); tests claim as a rank's main thread does, without one.
    #[cfg(test)]
    pub fn try_new(
        layout: &Layout,
        peers: &[PeerMap],
        rank: usize,
        dest: usize,
        heads: &mut [u64],
    ) -> Result<Option<Reserved>, ShmError> {
        let ring = layout.notifications();
        let me = notes_claimer(rank, false);
        let record = layout.claims(rank, crate::layout::CLAIM_NOTES);
        let mut t = [0u64; 1];
        let r = ring.try_claim(&peers[dest].seg, 1, me, record, &mut heads[dest], &mut t);
        if r.is_err() {
            heads[dest] = 0;
        }
        Ok(r?.then_some(Reserved { completer: t[0] }))
    }

    /// The same claim through `port`, this rank's main-thread port on a peer's notification
    /// queue (claimer [`notes_claimer`]`(rank, false)`, record
    /// [`CLAIM_NOTES`](crate::layout::CLAIM_NOTES); checked once, at start): the slot at the
    /// tail first. `head` caches the queue's head (reset after an error).
    #[inline]
    pub fn claim(port: &Port, head: &mut u64) -> Result<Option<Reserved>, ShmError> {
        let r = port.claim_one(head);
        if r.is_err() {
            *head = 0;
        }
        Ok(r?.map(|completer| Reserved { completer }))
    }

    /// Posts `completer` into the completer's slot through `port` (the one it was claimed
    /// through, on `target`'s queue), rings the completer's doorbell, then releases the
    /// claim. A slot that cannot be posted is skipped, so that no claim stays open.
    pub fn finish(self, port: &Port, target: &PeerMap, rank: usize, completer: Note) {
        let meta = (rank as u32 & 0xffff) | completer.kind << 16;
        let value = completer.value.to_le_bytes();
        match port.write_two(self.completer, &value, &[], meta) {
            Ok(()) => match port.segment().doorbell(DOORBELL) {
                Ok(bell) => target.rang(bell.ring_tagged_lazy(0)),
                Err(e) => drop_cold(e),
            },
            Err(e) => {
                drop_cold(e);
                port.skip(self.completer)
            }
        }
        port.release();
    }

    /// Gives the slot back unused (skipped: its owner consumes it and delivers nothing).
    pub fn cancel(self, port: &Port) {
        port.skip(self.completer);
        port.release();
    }
}

/// The bytes of an immediate put.
pub(crate) enum Data<'a> {
    /// `parts`, concatenated, then the shared bytes of the last field if any (an echoed
    /// payload, moved straight from where it was received), at 8-aligned `off` of a receive
    /// buffer the requester owns: whole words, zero-padded (no read-modify-write).
    Padded(usize, &'a [&'a [u8]], Option<am_shm::SharedBytes<'a>>),
    /// `bytes` at any `off` of the AM segment, whose neighbouring bytes are others'.
    Exact(usize, am_core::Payload<'a>),
}

/// The engine's immediate put into `dest`: the data, then `tail` (an RMA Medium's tail word,
/// stored with `Release`), then the completer's notification into the reserved slot. Bounds
/// are the submitter's to check; a failed write leaves the bytes unwritten, and the
/// completer's own checks (RMA Medium markers) see it.
/// `target` is the destination's map and `notes` our port on its notification queue, the
/// one `slots` was claimed through.
#[inline]
pub(crate) fn put_immediate(
    target: &PeerMap,
    notes: &Port,
    rank: usize,
    data: Data<'_>,
    tail: Option<(usize, u64)>,
    slots: Reserved,
    completer: Note,
) {
    ignore(match data {
        Data::Padded(off, parts, None) => target.imp.write_padded(off, parts).map(|_| ()),
        Data::Padded(off, parts, Some(tail)) => {
            target.imp.write_padded_then(off, parts, tail).map(|_| ())
        }
        Data::Exact(off, am_core::Payload::Private(bytes)) => target.imp.write(off, bytes),
        Data::Exact(off, am_core::Payload::Shared(bytes)) => target.imp.write_from(off, bytes),
    });
    if let Some((off, value)) = tail {
        ignore(target.imp.store_slot_word(off, value));
    }
    slots.finish(notes, target, rank, completer);
}

impl RmaEngine {
    pub fn start(
        rank: usize,
        layout: Layout,
        peers: Arc<Vec<PeerMap>>,
        pids: Vec<Option<nix::unistd::Pid>>,
        patience: Duration,
    ) -> std::io::Result<RmaEngine> {
        let (jobs, rx) = unbounded::<Job>();
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("extoll-rma-{rank}"))
            .spawn(move || {
                let w = Waiter {
                    layout: &layout,
                    peers: &peers,
                    rank,
                    pids: &pids,
                    stop: &halt,
                    patience,
                };
                let me = &peers[rank];
                for job in rx {
                    let (op, done) = match job {
                        Job::Put {
                            dest,
                            src,
                            dst,
                            len,
                            op,
                        } => {
                            if let Ok(bytes) = me.seg.view(src, len) {
                                let _ = peers[dest].imp.write_from(dst, bytes);
                            }
                            let landed = Note {
                                kind: kind::PUT_LANDED,
                                value: len as u64,
                            };
                            let done = match notify(&w, dest, landed) {
                                Ok(()) => kind::USER_DONE,
                                Err(GaveUp::Lost) => kind::USER_LOST,
                                Err(GaveUp::Stalled | GaveUp::Stopped) => kind::USER_UNNOTIFIED,
                            };
                            (op, done)
                        }
                        Job::Get {
                            from,
                            src,
                            dst,
                            len,
                            op,
                        } => {
                            if let Ok(bytes) = peers[from].seg.view(src, len) {
                                let _ = me.imp.write_from(dst, bytes);
                            }
                            (op, kind::USER_DONE)
                        }
                    };
                    let _ = notify(
                        &w,
                        rank,
                        Note {
                            kind: done,
                            value: op,
                        },
                    );
                }
            })?;
        Ok(RmaEngine {
            jobs: Some(jobs),
            stop,
            thread: Some(thread),
        })
    }

    /// Takes no more jobs, as an engine whose thread has ended.
    #[cfg(test)]
    pub fn stop_taking_jobs(&mut self) {
        self.jobs = None;
    }

    /// Queues a job; false if the engine has stopped.
    pub fn submit(&self, job: Job) -> bool {
        self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok())
    }
}

impl Drop for RmaEngine {
    fn drop(&mut self) {
        // Finish the queued jobs (bounded: every wait of the engine is bounded, and after a
        // second it is told to stop).
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

/// A write whose failure this side cannot report (an immediate put's bytes, its tail word):
/// its target's owner finds what did not land. The error is dropped off the common path, so
/// the common one makes no call to drop an `Ok`.
#[inline(always)]
fn ignore(r: Result<(), am_shm::ShmError>) {
    if let Err(e) = r {
        drop_cold(e);
    }
}

#[cold]
#[inline(never)]
fn drop_cold(e: am_shm::ShmError) {
    drop(e);
}
