//! Waking a rank that sleeps in an event loop rather than on its doorbell's futex.
//!
//! A rank that arms ([`am_core::Transport::arm`]) sets its doorbell's `ARMED` bit
//! ([`am_shm::Doorbell::arm`]) and sleeps on a [`WakeSocket`]: a Unix datagram socket bound
//! to an abstract address named after the job and the rank, whose file descriptor an event
//! loop (epoll, tokio's `AsyncFd`) watches. The one ring that finds the receiver armed
//! ([`am_shm::Rung::Armed`]) sends it one empty datagram through [`Wakers`]; every other
//! ring costs nothing more than before.
//!
//! Why a socket by name, not an eventfd: a sender must reach the receiver's descriptor, and
//! an eventfd crosses processes only by descriptor passing (`SCM_RIGHTS` over a connection
//! per pair, or `pidfd_getfd`, which needs the right to trace the peer). An abstract address
//! needs neither, holds no file that could outlive the job, and costs one descriptor per
//! rank. Ranks of one host share the network namespace their launcher gave them; a sender
//! that cannot reach the address drops the wake-up, and the receiver still wakes at the
//! bound its arming returned.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use am_core::{Armed, TransportError};
use am_shm::Doorbell;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use am_core::Rank;

/// A job name of its own for an in-process job (ranks as threads) of NIC `nic`: no other job
/// on the host, and no other in-process job of this process, has it.
pub fn in_process_job(nic: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{nic}-{}-{n}", std::process::id())
}

/// The abstract address of `rank`'s wake socket in job `job`.
fn address(job: &str, rank: Rank) -> io::Result<SocketAddr> {
    SocketAddr::from_abstract_name(format!("amnet/{job}/{rank}/wake"))
}

/// A rank's wake socket: readable after a sender found it armed. Bound on first use.
#[derive(Debug)]
pub struct WakeSocket {
    sock: UnixDatagram,
}

impl WakeSocket {
    /// Binds `rank`'s wake address in job `job` (non-blocking). Fails if another live socket
    /// holds it (the same rank opened twice).
    pub fn bind(job: &str, rank: Rank) -> io::Result<WakeSocket> {
        let sock = UnixDatagram::bind_addr(&address(job, rank)?)?;
        sock.set_nonblocking(true)?;
        Ok(WakeSocket { sock })
    }

    /// Reads every wake-up queued, so that the socket is readable again only after the
    /// next one (a full queue would make senders' wake-ups fail).
    pub fn drain(&self) {
        let mut buf = [0u8; 8];
        while self.sock.recv(&mut buf).is_ok() {}
    }
}

impl AsFd for WakeSocket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// A rank's side of arming, what every NIC's `Transport::arm` shares: its wake socket (bound
/// on first use) and the doorbell's `ARMED` bit.
#[derive(Debug)]
pub struct Wake {
    nic: &'static str,
    job: String,
    rank: Rank,
    sock: Option<WakeSocket>,
}

impl Wake {
    /// Rank `rank` of job `job` on NIC `nic` (named in errors); nothing is bound yet.
    pub fn new(nic: &'static str, job: &str, rank: Rank) -> Wake {
        Wake {
            nic,
            job: job.to_owned(),
            rank,
            sock: None,
        }
    }

    /// The wake socket, bound on first use.
    fn socket(&mut self) -> Result<&WakeSocket, TransportError> {
        let sock = match self.sock.take() {
            Some(sock) => sock,
            None => WakeSocket::bind(&self.job, self.rank).map_err(|e| {
                TransportError::device_from(format!("{}: binding the wake socket", self.nic), e)
            })?,
        };
        Ok(self.sock.insert(sock))
    }

    /// `Transport::wake_fd`: the socket's descriptor.
    pub fn fd(&mut self) -> Result<BorrowedFd<'_>, TransportError> {
        Ok(self.socket()?.as_fd())
    }

    /// Binds the socket before an arming looks for work (a sender that finds the rank armed
    /// must reach it).
    pub fn prepare(&mut self) -> Result<(), TransportError> {
        self.socket().map(drop)
    }

    /// Arms `bell` after a look that found nothing ([`Doorbell::arm`]): [`Armed::Sleep`]
    /// for at most `within`, or [`Armed::Ready`] (disarmed again) if a ring came first.
    pub fn arm(&mut self, bell: &Doorbell<'_>, within: Duration) -> Armed {
        if bell.arm() {
            Armed::Sleep(within)
        } else {
            bell.disarm();
            Armed::Ready
        }
    }

    /// `Transport::disarm`: withdraws the announcement and reads the wake-ups queued.
    pub fn disarm(&self, bell: Option<Doorbell<'_>>) {
        if let Some(bell) = bell {
            bell.disarm();
        }
        if let Some(sock) = &self.sock {
            sock.drain();
        }
    }
}

/// The sending side: wakes armed peers of one job. Shared by reference between the threads
/// that ring (`Sync`); the socket and each peer's address are made on first use.
#[derive(Debug)]
pub struct Wakers {
    job: String,
    sock: OnceLock<Option<UnixDatagram>>,
    peers: Box<[OnceLock<Option<SocketAddr>>]>,
}

impl Wakers {
    /// Wakers for the `size` ranks of job `job`.
    pub fn new(job: &str, size: u32) -> Wakers {
        Wakers {
            job: job.to_owned(),
            sock: OnceLock::new(),
            peers: (0..size).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Wakes `dest`, which a ring found armed. Best effort and never blocking: a full queue
    /// means a wake-up is already waiting there, and a rank whose address cannot be reached
    /// wakes at its arming's bound.
    pub fn wake(&self, dest: Rank) {
        let Some(Some(addr)) = self
            .peers
            .get(dest as usize)
            .map(|a| a.get_or_init(|| address(&self.job, dest).ok()))
        else {
            return;
        };
        let sock = self.sock.get_or_init(|| {
            let s = UnixDatagram::unbound().ok()?;
            s.set_nonblocking(true).ok()?;
            Some(s)
        });
        if let Some(sock) = sock {
            let _ = sock.send_to_addr(&[], addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{SystemTime, UNIX_EPOCH};

    fn job() -> String {
        let t = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        format!("wake-test-{}-{}", std::process::id(), t.as_nanos())
    }

    fn readable(s: &WakeSocket) -> bool {
        let mut fds = [nix::poll::PollFd::new(
            s.as_fd(),
            nix::poll::PollFlags::POLLIN,
        )];
        nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap() == 1
    }

    /// A wake-up makes the socket readable, a drain makes it quiet again, and a second bind
    /// of the same rank is refused (two endpoints never share a wake address).
    #[test]
    fn a_wake_up_reaches_its_rank_only() {
        let job = job();
        let a = WakeSocket::bind(&job, 0).unwrap();
        let b = WakeSocket::bind(&job, 1).unwrap();
        assert!(WakeSocket::bind(&job, 1).is_err());
        assert!(!readable(&a) && !readable(&b));
        let wakers = Wakers::new(&job, 3);
        wakers.wake(1);
        wakers.wake(1);
        assert!(readable(&b) && !readable(&a));
        b.drain();
        assert!(!readable(&b));
        // Out of range and unbound ranks are dropped quietly.
        wakers.wake(2);
        wakers.wake(7);
        assert!(!readable(&a) && !readable(&b));
    }

    /// A full queue never blocks a sender.
    #[test]
    fn a_full_queue_does_not_block_the_sender() {
        let job = job();
        let a = WakeSocket::bind(&job, 0).unwrap();
        let wakers = Wakers::new(&job, 1);
        for _ in 0..10_000 {
            wakers.wake(0);
        }
        assert!(readable(&a));
        a.drain();
        assert!(!readable(&a));
    }
}
