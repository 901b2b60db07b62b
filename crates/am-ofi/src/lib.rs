//! amnet's libfabric (OFI) boundary: the libfabric calls of the `ofi` transport, behind a safe
//! interface. The workspace's only unsafe code for libfabric.
//!
//! Built only with the `libfabric` feature (the crate is empty without it), which compiles a
//! small C file against the installed libfabric headers (Debian's `libfabric-dev`, or
//! `LIBFABRIC_DIR`) and links `libfabric.so.1`.
//!
//! **Why a C file and linking, not `dlopen`.** Nearly all of libfabric's data path
//! (`fi_send`, `fi_write`, `fi_cq_read`, ...) is `static inline` functions in its headers
//! that call through the provider's operation tables, and its `fi_info` structures grow
//! between releases. Compiled against the installed headers, those calls and structures are
//! right by construction for the libfabric the program runs with, 1.x or 2.x; a Rust mirror of
//! the tables would have to be checked against every release by hand. The library's symbols
//! are versioned, which the link editor binds and `dlsym` would not. Loading at run time (as
//! `am-pmix` does for PMIx) buys a binary that runs where libfabric is missing; here the cargo
//! feature already keeps libfabric out of every build that does not ask for it. The
//! published `ofi-libfabric-sys` was not used: it needs libfabric 2.x headers (`fi_profile.h`)
//! and libclang, and does not build against Debian's 1.17.
//!
//! **What the safe interface guarantees.** [`Endpoint`] owns every libfabric object and every
//! buffer the provider may touch: receive buffers, send buffers, staging buffers for RMA and
//! atomics, and the registered segment. A buffer handed to the provider is never read or
//! written by Rust until its completion has been read from the completion queue, and the
//! endpoint is closed (so the provider stops touching memory) before any of them is freed.
//! The segment is the exception the transport needs: peers write it at any time, so it is
//! reached only as [`am_shm::SharedBytes`] (atomic copies), never as a slice.
#![cfg_attr(not(feature = "libfabric"), allow(unused))]
// Without `libfabric` the items the docs above link to do not exist: the links stay text.
#![cfg_attr(not(feature = "libfabric"), allow(rustdoc::broken_intra_doc_links))]

#[cfg(feature = "libfabric")]
mod endpoint;
#[cfg(feature = "libfabric")]
mod ffi;
#[cfg(feature = "libfabric")]
mod info;

#[cfg(feature = "libfabric")]
pub use endpoint::{Endpoint, EndpointConfig, Event, Issued, Op, Region, Registration};
#[cfg(feature = "libfabric")]
pub use info::{providers, Interface};

/// Gives back to the default action the signal handlers that a library under libfabric
/// installed before `main` (Debian's libfabric links libinfinipath, whose constructor
/// catches SIGSEGV, SIGBUS, SIGILL, SIGABRT, SIGINT and SIGTERM to print a backtrace and
/// `exit(1)`), and returns how many it reset; handlers of anyone else are left alone.
/// [`Interface::find`] calls it before and after it asks libfabric for its providers (where
/// a provider is a library loaded then, its dependencies' constructors run then), so a
/// transport never runs under them. A program that
/// registers its own SIGTERM handler (tokio's, signal-hook's) before it starts the
/// transport calls this first: those chain to the handler they found.
///
/// A disposition that was `SIG_IGN` before libinfinipath replaced it comes back as the
/// default: libinfinipath keeps the one it replaced to itself.
#[cfg(feature = "libfabric")]
pub fn unhook_signals() -> usize {
    // SAFETY: the shim only reads and sets signal dispositions with sigaction, which is
    // thread-safe, and looks up handler addresses with dladdr; it touches no Rust memory.
    unsafe { ffi::amofi_unhook_signals() }.max(0) as usize
}

/// A libfabric call failed: which call, libfabric's error code and text, and the provider.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed{}: {text} ({code})", provider_suffix(.provider))]
pub struct OfiError {
    /// The libfabric call (`fi_getinfo`, `fi_send`, ...), or what was being done.
    pub call: String,
    /// libfabric's error number (positive, `FI_E*`/errno).
    pub code: i32,
    /// `fi_strerror`'s text for it, or the provider's own text for an error completion.
    pub text: String,
    /// The provider, where one was chosen.
    pub provider: Option<String>,
}

fn provider_suffix(p: &Option<String>) -> String {
    match p {
        Some(p) => format!(" on provider {p}"),
        None => String::new(),
    }
}

/// libfabric's `FI_EAGAIN`: the operation could not be queued now (the same as `EAGAIN`).
pub const FI_EAGAIN: i32 = 11;
/// libfabric's `FI_ENODATA`: no interface matched (`fi_getinfo`).
pub const FI_ENODATA: i32 = 61;
/// libfabric's `FI_EACCES`: access refused (an RMA or atomic whose key or address the
/// target's registration does not cover).
pub const FI_EACCES: i32 = 13;
/// libfabric's `FI_ETRUNC`: a message longer than the receive buffer it landed in.
pub const FI_ETRUNC: i32 = 265;
/// libfabric's `FI_ECANCELED`: an operation was cancelled (its endpoint closed).
pub const FI_ECANCELED: i32 = 125;
