//! amnet transport over libfabric (OFI): the same program on InfiniBand (`verbs`), Slingshot
//! (`cxi`), EFA (`efa`), Omni-Path (`psm2`, `opx`) and, on any machine, libfabric's `tcp`
//! (`tcp;ofi_rxm`), `shm` and `sockets` providers.
//!
//! Built with the `libfabric` feature (the facade's `ofi` feature), which links the installed
//! libfabric through [`am_ofi`]; without it this crate is empty.
//!
//! - **Provider**: `AM_OFI_PROVIDER`, else libfabric's own `FI_PROVIDER`, else the first
//!   interface libfabric lists with RDM endpoints, messages and RMA (atomics where offered).
//!   None matching is [`OfiTransportError::NoProvider`], which names the providers found.
//! - **AMs** travel as messages on one reliable, connectionless (RDM) endpoint per rank:
//!   sent with `fi_inject` when they fit the provider's inject size (no completion to wait
//!   for), else from a send buffer with `fi_send`, into receive buffers kept posted, as many
//!   as the credit budget (`AM_CREDITS`) lets peers have in flight, up to the provider's
//!   receive queue. Each message carries an 8-byte header: a version, its kind and the
//!   sender's rank, which is checked against the job (an authenticated source needs
//!   `FI_SOURCE`, which not every provider has; the fabric is trusted as far as the job's
//!   launcher is). Messages between two ranks stay in order (`FI_ORDER_SAS` is asked for).
//! - **Long, put and get** are `fi_write` and `fi_read` into the peer's segment, registered
//!   with `fi_mr_reg` at start-up, its address and key exchanged with the endpoint's name
//!   through the launcher's key-value store (PMI-1, PMI-2, PMIx or `amrun`). Writes ask
//!   for delivery completion, so a completed put or Long payload is in the target's segment,
//!   and a Long's head leaves only then. Transfers are staged through registered buffers
//!   (the data is copied once on each side of the call), several in flight.
//! - **Atomics** go through `fi_fetch_atomic` and `fi_compare_atomic` where the provider
//!   validates every operation on 32- and 64-bit words (`tcp;ofi_rxm`, `shm` and `sockets`
//!   do), else through the core's AM path. [`Ofi::native_atomics`] says which.
//! - **Waiting**: the completion queue's file descriptor (`FI_WAIT_FD`, with `fi_trywait`)
//!   is [`am_core::Transport::wake_fd`], so `AM_WAIT=block` and the async drivers sleep on
//!   it; a provider without one is polled.
//! - **Failure**: an error completion toward a peer, or (on one host) the peer's process
//!   gone, is `PeerLost`; an RMA or atomic that sees no completion for `AM_PEER_TIMEOUT_MS`
//!   (default 30 s) is `PeerLost` too. A rank that closes sends its peers a goodbye after its
//!   data, and they report `PeerDeparted`. Provider failures are [`am_core::NicError::Device`]
//!   errors carrying `fi_strerror`'s text and the provider's name. A message whose header is
//!   not one this transport writes is `PeerMisbehaved` and is dropped.
//!
//! What this transport does **not** do: multi-receive buffers (`FI_MULTI_RECV`), zero-copy
//! transfers from the caller's memory (everything goes through registered staging buffers),
//! tagged matching, or more than one endpoint per rank.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(not(feature = "libfabric"), allow(unused))]

#[cfg(feature = "libfabric")]
mod config;
#[cfg(feature = "libfabric")]
mod ofi;

#[cfg(feature = "libfabric")]
pub use config::OfiConfig;
#[cfg(feature = "libfabric")]
pub use ofi::{Ofi, OfiTransportError};
