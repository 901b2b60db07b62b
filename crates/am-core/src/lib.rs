//! The active-message core of amnet: GASNet's Core API in safe Rust.
//!
//! A job is a set of ranks; each runs a [`Node`] over a [`Transport`] (a NIC). Nodes exchange
//! active messages: a request names a handler registered in the [`Handlers`] table of every
//! rank, and that handler runs at the target, inside its [`Node::poll`]. A request handler gets
//! a [`Token`] that may send one reply to the requester; a reply handler cannot send at all.
//!
//! - **AM Short / Medium / Long**, 0..=16 arguments of 32 bits; Medium payloads are lent to the
//!   handler from the transport's buffer, Long payloads land in the target's segment before the
//!   handler runs. The segment, and any buffer peers may write, is a [`SharedBytes`] view
//!   (copies and atomics only), never a `&[u8]`: no peer can cause undefined behaviour here.
//! - **Credits** per peer bound the requests in flight, so receive space always exists and no
//!   message is ever dropped; the policy is pluggable ([`CreditPolicy`]).
//! - **Progress** by explicit polling, with a per-job [`WaitMode`] for blocking calls.
//! - **PGAS minimum**: [`Node::barrier`], put, get and atomics on the peers' segments,
//!   [`Node::exit`] ending the whole job.
//! - **Operations** ([`op`]): one name scheme on every driver. `x` waits for the operation, `x_nb`
//!   returns its [`Op`] handle, `x_nbi` starts it inside the implicit set that `wait_nbi`
//!   completes, `try_x` sends now or not at all. An [`Op`] completes in one of three ways: a
//!   blocking caller waits (`wait`, `wait_all`, `wait_some`), a poller tests (`test`, `test_some`),
//!   an async caller awaits (`node.wait(op).await`); dropping it detaches the operation, which
//!   still completes. Each operation is defined once ([`endpoint::start::Start`]) and every driver
//!   derives its methods from that definition.
//! - Beside the trait: [`Loopback`] (ranks as threads), [`FaultInjector`], and the
//!   conformance suite every transport runs (`conformance`, with the `conformance` feature).
//!
//! # Threads
//! - **What is `Send`**: every transport of the workspace, the errors, and a [`Node`] (with
//!   its [`Endpoint`] and [`Handlers`]) built on [`Handlers::new`], whose handlers must be
//!   `Send`; such a node may move to another thread between calls (to a progress thread, a
//!   pool's worker). A node built on [`Handlers::local`] takes any closure, an `Rc` or a
//!   `RefCell` too, and stays on the thread that made it ([`Threading`]). Nothing here is
//!   `Sync`: a node is driven through `&mut`, by one thread at a time.
//! - **Which thread runs a handler**: the one that polls the node ([`Node::poll`], or any
//!   blocking call, which polls while it waits), inside that call.
//! - **What a handler may do**: compute, read its message, reply once through its token
//!   (requests only), and touch what it captured; it cannot reach the node it runs in (no
//!   sends of new requests, no waits), so a handler never blocks progress.
//! - **Several threads on one node**: [`SharedNode`] (a lock, given back between polls, GASNet's
//!   PAR mode), and [`ProgressThread`] polling it for a rank whose threads compute.
//! - **Several endpoints per process** (GASNet-EX's `gex_EP_Create`, UCX's worker per thread):
//!   each endpoint is a rank of its own in the transports' job, with its own transport, its
//!   own credits toward every other endpoint, and no lock shared with the process's other
//!   endpoints; `amnet::run_job_endpoints` starts a job of them and numbers them
//!   (`EndpointLayout`). One node per endpoint, one thread per node is the fast layout. A
//!   thread that drives several endpoints starts their nodes together ([`Node::start_all`]:
//!   start-up is collective) and sleeps on all of them with [`wait_any`]; one
//!   [`ProgressThread`] can serve a set of shared nodes ([`ProgressThread::spawn_all`]).
//!
//! # Async
//! [`AsyncNode`] shares a node with the tasks of an async runtime: every operation is a
//! `Future`, woken by progress ([`future`]). It is `Send` and `Sync` when its node is. A
//! driver makes progress when there may be work and otherwise sleeps on the node's wake
//! descriptor: [`Node::arm`] says whether to poll or sleep and for how long,
//! [`Node::wake_fd`] is what to watch, [`Node::disarm`] ends the sleep. Senders pay for the
//! wake-up only while the receiver is armed, once per sleep. The `tokio` feature adds that
//! driver on `AsyncFd` (`AsyncNode::run`, `AsyncNode::drive` and their spinning forms).
//! [`Node::call`] and [`AsyncNode::call`] return a callable handler's answer
//! ([`Handlers::callable`], [`call`]).
//!
//! What this crate does **not** do: it has no shared memory, sockets or processes of its own
//! (the transports and `am-launch` do; `am-shm` provides the views), it copies a lent payload
//! only when a handler reads it, and it never hides a lost message: a dead peer is an error,
//! not a hang.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod atomic;
pub mod call;
pub mod config;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod credit;
pub mod endpoint;
pub mod error;
pub mod fault;
pub mod future;
pub mod handler;
pub mod loopback;
mod memfile;
mod node;
pub mod op;
// The system messages' encoding: a transport never needs it; test peers that forge system
// messages (the `conformance` feature, which every test suite enables) do.
#[cfg(feature = "conformance")]
pub mod protocol;
#[cfg(not(feature = "conformance"))]
mod protocol;
pub mod reduce;
pub mod reply;
pub mod rma;
pub mod segment;
pub mod shared;
pub mod stats;
pub mod symmetric;
pub mod team;
pub mod transport;
pub mod typed;
pub mod types;
pub mod wait;
pub mod wire;

pub use atomic::{AtomicOp, AtomicWord, Cmp, Signal};
/// The crate of [`Plain`]'s bound (`bytemuck::Pod`), re-exported so that its derives match
/// this crate's version.
pub use bytemuck;
pub use call::{Call, Reply};
pub use config::{AllReduceAlgorithm, Config, WaitMode};
pub use credit::{CreditPolicy, Credits, DynamicCredits, StaticCredits};
pub use endpoint::{Endpoint, Polled};
pub use error::{
    AmError, BlockBounds, DeviceError, Disagreement, Misbehavior, NicError, NicErrorKind,
    RuntimeError, StartError, TryRequestError,
};
pub use fault::{FaultConfig, FaultInjector, FaultRng, FaultStats};
pub use future::{AsyncNode, WeakAsyncNode};
pub use handler::{HandlerInfo, Handlers, Local, Msg, RegisterError, Sendable, Threading};
pub use loopback::{AbortHandle, Loopback, LoopbackConfig, Told};
pub use node::Node;
pub use op::{Completed, Op, Outcome};
pub use reduce::{Element, Plain, ReduceId, ReduceOp};
pub use reply::Token;
pub use segment::{RemoteSegment, SegmentId};
pub use shared::{NodeGuard, ProgressThread, Shared, SharedNode};
pub use stats::{NicStats, Stats};
pub use symmetric::{Symmetric, SYMMETRIC_ALIGN};
pub use team::{Team, TeamId};
pub use transport::{
    Armed, Capabilities, Delivery, Limits, NicInfo, Outgoing, Payload, Received, Route, SendError,
    SharedBytes, Transport, TransportError, Tx,
};
pub use types::{AmKind, Category, HandlerId, Rank};
pub use wait::wait_any;

/// Runs one closure per transport, each on its own thread, and returns their results in rank
/// order: the way to run a job whose ranks are threads ([`Loopback`], or any transport whose
/// endpoints can live in one process).
///
/// If a rank panics, the panic that happened first is re-raised here after every thread has
/// ended (the others see the job aborted rather than hanging).
pub fn run_ranks<T, R, F>(transports: Vec<T>, f: F) -> Vec<R>
where
    T: Send,
    R: Send,
    F: Fn(T) -> R + Sync,
{
    use std::sync::Mutex;
    let first_panic: Mutex<Option<Box<dyn std::any::Any + Send>>> = Mutex::new(None);
    let results: Vec<Option<R>> = std::thread::scope(|s| {
        let handles: Vec<_> = transports
            .into_iter()
            .enumerate()
            .map(|(rank, t)| {
                let f = &f;
                let first_panic = &first_panic;
                std::thread::Builder::new()
                    .name(format!("rank-{rank}"))
                    .spawn_scoped(s, move || {
                        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(t))) {
                            Ok(r) => Some(r),
                            Err(p) => {
                                let mut slot =
                                    first_panic.lock().unwrap_or_else(|e| e.into_inner());
                                if slot.is_none() {
                                    *slot = Some(p);
                                }
                                None
                            }
                        }
                    })
                    .expect("spawning a rank thread")
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(None))
            .collect()
    });
    if let Some(p) = first_panic.into_inner().unwrap_or_else(|e| e.into_inner()) {
        std::panic::resume_unwind(p);
    }
    results
        .into_iter()
        .map(|r| r.expect("rank result"))
        .collect()
}
