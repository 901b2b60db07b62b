//! One thread waiting on several nodes: a process's endpoints driven from one thread.
//!
//! A thread that drives several nodes (the endpoints of its process, see `amnet`'s
//! `run_job_endpoints`) polls each in turn; when none has work, [`wait_any`] arms them all and
//! sleeps on all their wake descriptors at once (`poll(2)`), so the thread uses no CPU until a
//! message comes to any of them.

use std::os::fd::BorrowedFd;
use std::time::Duration;

use crate::error::AmError;
use crate::handler::Threading;
use crate::node::Node;
use crate::transport::{any_readable, Armed, Transport};

/// The longest sleep between looks at a node whose transport has no wake descriptor.
pub const UNARMED_SLEEP: Duration = Duration::from_micros(50);

/// Sleeps until any of `nodes` has work, or for at most `timeout`: arms each
/// ([`Node::arm`]), sleeps on all their wake descriptors, and disarms them. Call it after a
/// poll of every node that handled nothing, and poll them all after it.
///
/// Returns `Ok(true)` when a node may have work (a poll finds out), `Ok(false)` when the time
/// passed with none. The sleep is shorter when a transport's own timers need it (liveness,
/// retransmission: [`Armed::Sleep`]), and at most [`UNARMED_SLEEP`] when a transport has no
/// wake descriptor. An arming's error (a lost peer) is returned, with every node disarmed.
///
/// ```
/// use std::time::Duration;
/// use am_core::{AmKind, Config, HandlerId, Handlers, Loopback, Node};
///
/// const HIT: HandlerId = HandlerId(1);
/// let handlers = || {
///     let mut handlers = Handlers::new();
///     handlers.request(HIT, "hit", AmKind::Short, |_, _| {}).unwrap();
///     handlers
/// };
/// let mut transports = Loopback::cluster(3, Default::default());
/// let sender = transports.pop().unwrap();
/// std::thread::scope(|s| {
///     s.spawn(|| {
///         let mut sender = Node::new(sender, handlers(), Config::default()).unwrap();
///         sender.request_short(1, HIT, &[]).unwrap();
///     });
///     // Ranks 0 and 1 are driven by this thread, which sleeps until either has a message.
///     let parts = transports.into_iter().map(|t| (t, handlers()));
///     let mut nodes = Node::start_all(parts, Config::default()).unwrap();
///     let mut nodes: Vec<&mut Node<Loopback>> = nodes.iter_mut().collect();
///     let mut handled = 0;
///     while handled == 0 {
///         am_core::wait_any(&mut nodes, Duration::from_secs(10)).unwrap();
///         for node in nodes.iter_mut() {
///             handled += node.poll().unwrap();
///         }
///     }
/// });
/// ```
pub fn wait_any<T: Transport, H: Threading>(
    nodes: &mut [&mut Node<T, H>],
    timeout: Duration,
) -> Result<bool, AmError> {
    let mut sleep = Some(timeout);
    let mut armed = 0;
    let mut failed = None;
    for node in nodes.iter_mut() {
        armed += 1;
        match node.arm() {
            Ok(Armed::Sleep(within)) => sleep = sleep.map(|s| s.min(within)),
            Ok(Armed::Ready) => {
                sleep = None;
                break;
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let woken = match (sleep, &failed) {
        (Some(sleep), None) => {
            let fds: Option<Vec<BorrowedFd<'_>>> = nodes
                .iter_mut()
                .map(|node| node.wake_fd().ok().flatten())
                .collect();
            match fds {
                // An error of `poll` ends the sleep early: the polls find out what there is.
                Some(fds) => any_readable(&fds, sleep).unwrap_or(true),
                None => {
                    std::thread::sleep(sleep.min(UNARMED_SLEEP));
                    true
                }
            }
        }
        _ => true,
    };
    for node in nodes[..armed].iter_mut() {
        node.disarm();
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(woken),
    }
}
