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
/// use amnet::{AmKind, Config, HandlerId, Handlers, Loopback, Node};
///
/// const HIT: HandlerId = HandlerId(1);
///
/// fn main() {
///     let handlers = || {
///         let mut handlers = Handlers::new();
///         handlers.request(HIT, "hit", AmKind::Short, |_, _| {}).unwrap();
///         handlers
///     };
///     let mut transports = Loopback::cluster(3, Default::default());
///     let sender = transports.pop().unwrap();
///     std::thread::scope(|s| {
///         let sender = s.spawn(|| {
///             let mut sender = Node::new(sender, handlers(), Config::default()).unwrap();
///             sender.request_short(1, HIT, &[]).unwrap();
///             // Dropping the node waits until its request is acknowledged.
///         });
///         // Ranks 0 and 1 are driven by this thread, which sleeps until either has a message.
///         let parts = transports.into_iter().map(|t| (t, handlers()));
///         let mut nodes = Node::start_all(parts, Config::default()).unwrap();
///         let mut nodes: Vec<&mut Node<Loopback>> = nodes.iter_mut().collect();
///         while !sender.is_finished() {
///             amnet::wait_any(&mut nodes, Duration::from_millis(10)).unwrap();
///             for node in nodes.iter_mut() {
///                 node.poll().unwrap();
///             }
///         }
///     });
/// }
/// ```
pub fn wait_any<T: Transport, H: Threading>(
    nodes: &mut [&mut Node<T, H>],
    timeout: Duration,
) -> Result<bool, AmError> {
    let (armed, sleep) = arm_each(nodes.len(), timeout, |i| nodes[i].arm());
    let woken = match &sleep {
        Ok(Some(sleep)) => {
            let fds: Option<Vec<BorrowedFd<'_>>> = nodes
                .iter_mut()
                .map(|node| node.wake_fd().ok().flatten())
                .collect();
            match fds {
                // An error of `poll` ends the sleep early: the polls find out what there is.
                Some(fds) => any_readable(&fds, *sleep).unwrap_or(true),
                None => {
                    std::thread::sleep((*sleep).min(UNARMED_SLEEP));
                    true
                }
            }
        }
        _ => true,
    };
    for node in nodes[..armed].iter_mut() {
        node.disarm();
    }
    sleep.map(|_| woken)
}

/// Arms `count` nodes in turn (`arm(i)` arms node `i`), stopping at the first that has work
/// or fails: how many were armed (each must be disarmed), and how long they may sleep, at
/// most `longest` (`None`: one has work now).
pub(crate) fn arm_each(
    count: usize,
    longest: Duration,
    mut arm: impl FnMut(usize) -> Result<Armed, AmError>,
) -> (usize, Result<Option<Duration>, AmError>) {
    let mut sleep = longest;
    for i in 0..count {
        match arm(i) {
            Ok(Armed::Sleep(within)) => sleep = sleep.min(within),
            Ok(Armed::Ready) => return (i + 1, Ok(None)),
            Err(e) => return (i + 1, Err(e)),
        }
    }
    (count, Ok(Some(sleep)))
}
