//! A rank's watch on its launcher: a rank whose launcher's PMI connection closes before the
//! rank finalized it has lost its launcher (killed, even by SIGKILL, which it cannot catch)
//! and ends as the launcher would have ended it: SIGTERM, then SIGKILL a grace period later.
//! Without it, ranks outlive a killed `amrun` or `mpiexec` and keep the cores busy. Under
//! PMIx, whose connection is libpmix's, the rank watches its parent instead.

use std::io::{self, Write};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{raise, Signal};
use nix::sys::socket::{recv, shutdown, MsgFlags, Shutdown};

/// How long a rank gets between the SIGTERM it sends itself and the SIGKILL (the launcher's
/// own grace period).
const GRACE: Duration = Duration::from_secs(1);

/// While data waits for the rank's own reader, how often the watch looks again.
const BUSY_LOOK: Duration = Duration::from_millis(20);

/// How often a watch on the parent process looks at it.
const PARENT_LOOK: Duration = Duration::from_millis(100);

/// The watch on one connection: a thread blocked peeking at a duplicate of it. Finishing it
/// (before the rank finalizes or aborts: the launcher may close the connection then) or
/// dropping it ends the thread without ending the rank.
#[derive(Debug)]
pub(crate) struct Watch {
    finished: Arc<AtomicBool>,
    /// Shuts the connection down, so that the blocked peek returns.
    wake: Wake,
}

#[derive(Debug)]
enum Wake {
    /// The connection's own descriptor (open as long as the watch: the connection owns both),
    /// never the duplicate, which the thread closes as it ends.
    Fd(RawFd),
    Tcp(std::net::TcpStream),
    /// Nothing to shut down: the thread looks at `finished` between its looks.
    Parent,
}

impl Watch {
    /// Watches an inherited socket (`AM_PMI_FD`, `PMI_FD`) through a duplicate of it, which
    /// the thread closes as it ends.
    pub(crate) fn fd(fd: RawFd) -> Option<Watch> {
        let dup = nix::unistd::dup(fd).ok()?;
        let flags = nix::fcntl::FdFlag::FD_CLOEXEC;
        let _ = nix::fcntl::fcntl(dup, nix::fcntl::FcntlArg::F_SETFD(flags));
        let watch = Watch::spawn(
            move |buf| Ok(recv(dup, buf, MsgFlags::MSG_PEEK)?),
            move || {
                let _ = nix::unistd::close(dup);
            },
            Wake::Fd(fd),
        );
        if watch.is_none() {
            let _ = nix::unistd::close(dup);
        }
        watch
    }

    /// Watches a TCP connection (`PMI_PORT`) through a clone of it.
    pub(crate) fn tcp(stream: &std::net::TcpStream) -> Option<Watch> {
        let peek = stream.try_clone().ok()?;
        let wake = stream.try_clone().ok()?;
        Watch::spawn(move |buf| peek.peek(buf), || {}, Wake::Tcp(wake))
    }

    /// Watches the parent process, under a launcher whose connection the rank cannot see
    /// (PMIx: libpmix owns the connection to its server). The rank's parent is the launcher
    /// or its daemon on this host (`mpirun`, `prted`, `slurmstepd`); once it is gone the
    /// rank is re-parented, and it ends. Looked at every [`PARENT_LOOK`]: a system call a
    /// tenth of a second on a thread that otherwise sleeps.
    pub(crate) fn parent() -> Option<Watch> {
        let parent = nix::unistd::getppid();
        let finished = Arc::new(AtomicBool::new(false));
        let done = finished.clone();
        std::thread::Builder::new()
            .name("amnet-launcher-watch".to_owned())
            .spawn(move || loop {
                std::thread::sleep(PARENT_LOOK);
                if done.load(Ordering::Acquire) {
                    break;
                }
                if nix::unistd::getppid() != parent {
                    if !done.load(Ordering::Acquire) {
                        end_rank();
                    }
                    break;
                }
            })
            .ok()?;
        Some(Watch {
            finished,
            wake: Wake::Parent,
        })
    }

    fn spawn(
        mut peek: impl FnMut(&mut [u8]) -> io::Result<usize> + Send + 'static,
        close: impl FnOnce() + Send + 'static,
        wake: Wake,
    ) -> Option<Watch> {
        let finished = Arc::new(AtomicBool::new(false));
        let done = finished.clone();
        std::thread::Builder::new()
            .name("amnet-launcher-watch".to_owned())
            .spawn(move || {
                let gone = loop {
                    if done.load(Ordering::Acquire) {
                        break false;
                    }
                    let mut byte = [0u8; 1];
                    match peek(&mut byte) {
                        // End of stream: the launcher closed it, or died.
                        Ok(0) => break true,
                        // A reply waits for the rank's own reader: look again later.
                        Ok(_) => std::thread::sleep(BUSY_LOOK),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(_) => break true,
                    }
                };
                close();
                if gone && !done.load(Ordering::Acquire) {
                    end_rank();
                }
            })
            .ok()?;
        Some(Watch { finished, wake })
    }

    /// The rank is about to finalize or abort: the connection may close from now on.
    pub(crate) fn finish(&self) {
        self.finished.store(true, Ordering::Release);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.finish();
        // The rank is done with the connection: wake the blocked peek with an end of stream.
        match &self.wake {
            Wake::Fd(fd) => {
                let _ = shutdown(*fd, Shutdown::Both);
            }
            Wake::Tcp(s) => {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            Wake::Parent => {}
        }
    }
}

/// Ends this rank as its launcher would have: SIGTERM (a program that handles it cleans up),
/// then SIGKILL once the grace period is over.
fn end_rank() {
    // Not `eprintln!`: stderr may be a pipe to the launcher that is gone, and a failed
    // write must not stop the rank from ending.
    let _ = writeln!(
        io::stderr(),
        "amnet: rank {}: the launcher's connection closed before the job ended (the launcher \
         is gone): ending this rank",
        std::env::var("AM_RANK")
            .or_else(|_| std::env::var("PMI_RANK"))
            .unwrap_or_else(|_| "?".to_owned())
    );
    let _ = raise(Signal::SIGTERM);
    std::thread::sleep(GRACE);
    let _ = raise(Signal::SIGKILL);
}
