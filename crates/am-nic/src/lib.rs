//! The parts amnet's simulated shared-memory NICs (`sci-sim`, `extoll-sim`, `portals-sim`)
//! share, none of which is a NIC model:
//!
//! - [`config`]: reading a configuration through a variable lookup, and `AM_CREDITS`;
//! - [`control`]: the control block at the start of every rank's segment (the doorbell line,
//!   the abort line) and where each rank's departed word is; [`control::depart`], what a rank
//!   that ends writes into its peers' segments;
//! - [`connect`]: start-up under a launcher. Each rank creates an anonymous segment (a memfd:
//!   no file in `/dev/shm`, so nothing outlives the job, whatever kills its ranks and under
//!   any launcher), publishes its pid, the segment's handle and its geometry through the
//!   launcher's key-value store, and maps every peer's;
//! - [`Liveness`]: noticing a dead peer within ~0.2 s of waiting without progress;
//! - [`SetupError`]: why a NIC could not start;
//! - [`wake`]: waking a rank armed on its wake socket (an event loop's file descriptor);
//! - [`room`]: ringing the senders that wait for room in a full queue.
//!
//! What this crate does **not** do: it has no message format, no rings, no hand-over protocol
//! (each NIC's own, in its crate) and no `unsafe` code (that is `am-shm`'s).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod control;
mod liveness;
pub mod room;
mod setup;
pub mod wake;

pub use liveness::{Liveness, IDLE_POLLS_PER_TICK, LIVENESS_AFTER};
pub use setup::{connect, Joined, SetupError};
