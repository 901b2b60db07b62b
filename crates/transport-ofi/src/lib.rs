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
//! - **Created segments** ([`am_core::segment`]) are registered with `fi_mr_reg` (their
//!   control words and bytes, one registration each) before their first publication,
//!   which carries the address, key and length as a key blob
//!   ([`am_core::Capabilities::rma_segments`]); peers' `put_to`, `get_from` and
//!   `atomic_at` on them take the path of put, get and atomics above, with no message
//!   for the owner. A blob whose length or region this transport could not have made, or
//!   that registers less than the range, is `PeerMisbehaved` naming the peer that
//!   published it; a blob that looks right but whose key the provider refuses fails as
//!   the provider reports it (`FI_EACCES`: `PeerMisbehaved`; a provider that drops the
//!   connection instead: the peer is lost). The word area is registered for peers' writes
//!   with the bytes: a peer holding the key is trusted not to set the freed word.
//! - **Atomics** go through `fi_fetch_atomic` and `fi_compare_atomic` where the provider
//!   validates every operation on every word type (unsigned, signed and float, 32 and 64
//!   bits: `tcp;ofi_rxm`, `shm` and `sockets` do), else through the core's AM path: atomics
//!   on one word are atomic with each other only if one agent applies them all. [`Ofi::native_atomics`] says which;
//!   `AM_OFI_ATOMICS=am` takes the AM path on any provider. Posted atomics (a batch) are in
//!   flight together and waited for once.
//! - **Waiting**: the completion queue's file descriptor (`FI_WAIT_FD`, with `fi_trywait`)
//!   is [`am_core::Transport::wake_fd`], so `AM_WAIT=block` and the async drivers sleep on
//!   it; a provider without one is polled.
//! - **Failure**: an error completion toward a peer, or (on one host) the peer's process
//!   gone, is `PeerLost`; an RMA or atomic that sees no completion for `AM_PEER_TIMEOUT_MS`
//!   (default 30 s) is `PeerLost` too. A rank that closes sends its peers a goodbye after its
//!   data, and they report `PeerDeparted`. Provider failures are [`am_core::NicError::Device`]
//!   errors carrying `fi_strerror`'s text and the provider's name. A message whose header is
//!   not one this transport writes, or that is longer than the receive buffers, is
//!   `PeerMisbehaved` and is dropped; an RMA or atomic the target refuses (the address or key
//!   it published is not its registration's) is `PeerMisbehaved` naming it.
//!
//! **Environment** (each rank reads it; set it the same for every rank):
//!
//! | variable | meaning |
//! |---|---|
//! | `AM_OFI_PROVIDER`, `FI_PROVIDER` | the provider: `tcp`, `shm`, `verbs`, `cxi`, `efa`, `psm2`, `tcp;ofi_rxm`, ... |
//! | `AM_OFI_MAX_MEDIUM` | the largest AM Medium payload (default 8192, at most the provider's message size) |
//! | `AM_OFI_ATOMICS` | `native` (the default: the provider's atomics where it has them all) or `am` |
//! | `AM_PEER_TIMEOUT_MS` | how long an RMA or atomic waits for its completion before its target counts as lost (default 30 s) |
//! | `AM_CREDITS` | the credit policy, which also sizes the posted receive buffers |
//! | `LIBFABRIC_DIR` | at build time: a libfabric installed outside the system's paths (its `include` and `lib`) |
//!
//! libfabric's own variables (`FI_LOG_LEVEL`, `FI_TCP_IFACE`, `FI_SHM_*`, ...) reach the
//! provider as usual.
//!
//! **Signals.** Debian's libfabric links libinfinipath (for its psm provider), which
//! catches SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM before `main` to print a
//! backtrace and `exit(1)`. Starting the transport gives those back to the default action
//! ([`unhook_signals`]); a program that installs its own SIGTERM handler (tokio's,
//! signal-hook's) before the transport starts calls [`unhook_signals`] first, or runs with
//! `IPATH_NO_BACKTRACE=1`, or its handler ends in `exit(1)`.
//!
//! What this transport does **not** do: multi-receive buffers (`FI_MULTI_RECV`), zero-copy
//! transfers from the caller's memory (everything goes through registered staging buffers),
//! tagged matching, or more than one endpoint per rank.
#![forbid(unsafe_code)]
#![warn(missing_docs)]
#![cfg_attr(not(feature = "libfabric"), allow(unused))]
// Without `libfabric` the items the docs above link to do not exist: the links stay text.
#![cfg_attr(not(feature = "libfabric"), allow(rustdoc::broken_intra_doc_links))]
#[cfg(feature = "libfabric")]
mod config;
#[cfg(feature = "libfabric")]
mod error;
#[cfg(feature = "libfabric")]
mod ofi;

#[cfg(feature = "libfabric")]
pub use am_ofi::unhook_signals;
#[cfg(feature = "libfabric")]
pub use config::OfiConfig;
#[cfg(feature = "libfabric")]
pub use error::OfiTransportError;
#[cfg(feature = "libfabric")]
pub use ofi::Ofi;

#[cfg(feature = "libfabric")]
am_bootstrap::impl_connect!(
    Ofi,
    OfiConfig,
    "ofi",
    |_ranks| OfiConfig::from_env(),
    am_bootstrap::ConnectError::from
);
