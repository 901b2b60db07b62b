//! The DMA engine: a thread per rank (started on first use) that copies Long payloads from
//! the rank's local DMA queue into target segments and signals completion.
//!
//! A thread rather than progress inside `poll`: the copy then overlaps with whatever the rank
//! does next (computing, staging the next payload), as a NIC's DMA would; when idle the thread
//! sleeps in a channel receive, so it costs nothing to ranks that send no large Longs.

use std::thread::JoinHandle;

use am_shm::Imported;
use crossbeam_channel::{bounded, Receiver, Sender};

use crate::layout::MEF;

/// Staging buffers in the DMA queue: two, so one can be filled while the other is copied.
pub(crate) const QUEUE_DEPTH: usize = 2;

pub(crate) struct Job {
    pub target: Imported,
    pub offset: usize,
    pub buf: Vec<u8>,
}

/// One rank's DMA engine: its thread and the two ends of its queue (see the module docs).
pub(crate) struct DmaEngine {
    jobs: Option<Sender<Job>>,
    pub done: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<()>>,
}

impl DmaEngine {
    /// Starts the engine; completions ring `own` (this rank's doorbell) so a sleeping rank
    /// wakes to publish the header, and call `wake` when the rank sleeps armed on its wake
    /// socket.
    pub fn start(own: Imported, wake: impl Fn() + Send + 'static) -> std::io::Result<DmaEngine> {
        let (jobs, rx) = bounded::<Job>(QUEUE_DEPTH);
        let (done_tx, done) = bounded::<Vec<u8>>(QUEUE_DEPTH);
        let thread = std::thread::Builder::new()
            .name("sci-dma".into())
            .spawn(move || {
                for job in rx {
                    // Out of bounds cannot happen (checked at submit); if it did, the receiver
                    // rejects the message as out of segment, as for PIO.
                    let _ = job.target.write(job.offset, &job.buf);
                    if done_tx.send(job.buf).is_err() {
                        break;
                    }
                    if let Ok(am_shm::Rung::Armed) = own.ring(MEF) {
                        wake();
                    }
                }
            })?;
        Ok(DmaEngine {
            jobs: Some(jobs),
            done,
            thread: Some(thread),
        })
    }

    /// Queues a copy; never blocks (the caller holds one of `QUEUE_DEPTH` buffers).
    pub fn submit(&self, job: Job) -> bool {
        self.jobs.as_ref().is_some_and(|j| j.try_send(job).is_ok())
    }
}

impl Drop for DmaEngine {
    fn drop(&mut self) {
        self.jobs = None;
        // Drain completions so the engine never blocks on a full `done` channel.
        while let Some(t) = &self.thread {
            if t.is_finished() {
                break;
            }
            let _ = self.done.recv_timeout(std::time::Duration::from_millis(10));
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
