//! The RMA engine: a thread per rank (started on first use) that performs puts and gets
//! between registered regions and writes completion notifications into notification queues.
//!
//! A thread, so the copies are the engine's work and not the calling CPU's: the rank goes on
//! (stages the next payload, polls, runs handlers) while a put is in flight, as with a NIC.
//! When idle it sleeps in a channel receive.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use am_shm::{Imported, Segment};
use crossbeam_channel::{unbounded, Sender};

use crate::layout::{Layout, DOORBELL};

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
    /// Requester: the put of staging slot `value` is done.
    pub const STAGING_FREE: u32 = 8;
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

/// Work for the engine. Offsets are in the byte areas, checked by the submitter.
pub(crate) enum Job {
    /// Copy `len` bytes from our `src` to `dest`'s `dst`, then (RMA Medium) store `tail` with
    /// `Release`, then notify the completer and the requester.
    Put {
        dest: usize,
        src: usize,
        dst: usize,
        len: usize,
        tail: Option<(usize, u64)>,
        completer: Option<Note>,
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

/// Writes a notification from `src` into `target`'s queue (waiting for room while the owner
/// drains it) and rings its doorbell if it sleeps. False if stopped or the queue is corrupt.
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
                let ok = ring
                    .write(&target.imp, t, 0, &note.value.to_le_bytes())
                    .is_ok()
                    && ring
                        .publish(&target.imp, t, (src as u32 & 0xffff) | note.kind << 16)
                        .is_ok();
                if let Ok(bell) = target.seg.doorbell(DOORBELL) {
                    bell.ring_tagged_lazy(0);
                }
                return ok;
            }
            Ok(None) if !stop.load(Ordering::Relaxed) => std::thread::yield_now(),
            _ => return false,
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
                            tail,
                            completer,
                            requester,
                        } => {
                            let target = &peers[dest];
                            // Bounds were checked at submit; a failure leaves the bytes
                            // unwritten, and the receiver's checks see it.
                            if let Ok(bytes) = me.seg.bytes(src, len) {
                                let _ = target.imp.write(dst, bytes);
                            }
                            if let Some((at, value)) = tail {
                                let _ = target.imp.store_slot_word(at, value);
                            }
                            if let Some(c) = completer {
                                notify(&layout, target, rank, c, &halt);
                            }
                            notify(&layout, me, rank, requester, &halt);
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
