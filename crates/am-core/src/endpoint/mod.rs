//! The AM protocol of one rank, without I/O: [`Endpoint`].
//!
//! An endpoint holds everything a rank knows about the protocol (handlers, credits, replies
//! the device refused, start-up, barriers, one-sided operations, posted atomics, peers that
//! are gone) and does no waiting of its own: every method that sends takes the transport (or,
//! where only sending is needed, its [`Tx`](crate::Tx)) as an argument, and every method that
//! would wait returns [`Poll::Pending`](std::task::Poll::Pending) instead, so the caller
//! decides how to wait. There is no clock in here either.
//!
//! Everything a driver must not get wrong is inside: the checks of every call, the choice
//! between the NIC's own put, get and atomics ([`crate::Capabilities`]) and messages, and
//! the order of posted atomics before every later operation. A driver does two things:
//!
//! - **progress**: [`Endpoint::poll_one`] sends the replies the device refused, hands one
//!   delivered message to its handler, and says whether one was handled or a peer ended the
//!   job ([`Polled::Exit`]), which the driver then does;
//! - **operations**: it takes an operation's [`Start`](crate::endpoint::start::Start) steps
//!   (`start`, then `send`) until each is ready, making progress in between; that gives the
//!   operation's [`Op`](crate::op::Op), which [`Endpoint::poll_op`] completes (leaving a waker, for
//!   an async driver, that the completion wakes).
//!
//! [`crate::Node`] is the driver this workspace uses; it waits between polls as its
//! [`crate::WaitMode`] says. A driver of one's own (an event loop, a test harness that
//! delivers messages in a chosen order) does the same. The first step of every rank, before
//! any other send, is start-up:
//!
//! ```
//! use std::task::Poll;
//! use amnet::endpoint::Endpoint;
//! use amnet::{Handlers, Limits, NicInfo, StaticCredits, Outgoing, SendError, Tx};
//!
//! /// A sender that keeps what it is given (a real driver hands it to a NIC).
//! struct Outbox(Vec<(u32, Vec<u8>)>);
//! impl Tx for Outbox {
//!     fn try_send(&mut self, dest: u32, m: &Outgoing<'_>) -> Result<(), SendError> {
//!         let mut bytes = m.head.to_vec();
//!         m.payload.append_to(&mut bytes);
//!         self.0.push((dest, bytes));
//!         Ok(())
//!     }
//! }
//!
//! fn main() {
//!     // What the NIC is: its limits, and here nothing it does itself.
//!     let limits = Limits { max_args: 16, max_medium: 1024, max_long: 4096, max_credits: 8 };
//!     let info = NicInfo::new("outbox", limits);
//!     let credits = Box::new(StaticCredits::new(2, 8));
//!     let mut ep = Endpoint::new(1, 2, info, 4096, Handlers::new(), credits);
//!     let mut out = Outbox(Vec::new());
//!     // Rank 1 starts by telling rank 0 its handler table, then waits for the verdict.
//!     assert!(ep.start_step(&mut out).is_pending());
//!     assert_eq!(out.0.len(), 1);
//!     assert_eq!(out.0[0].0, 0);
//! }
//! ```

mod barrier;
mod coll;
mod complete;
mod heap;
mod in_segment;
mod mismatch;
mod peers;
mod posted;
mod recv;
mod rma;
mod segments;
mod send;
pub mod start;
mod startup;
mod state;
mod teams;
mod typed;

pub use recv::Polled;
pub use state::Endpoint;
pub use teams::{
    EARLY_WINDOW, MAX_CHUNKS_IN_FLIGHT, MAX_COLLECTIVES_IN_FLIGHT, RING_MAX_MEMBERS,
    RING_PAIR_MEDIUM, SYNC_PERIOD,
};
