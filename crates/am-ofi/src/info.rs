//! Finding an interface: `fi_getinfo` for RDM endpoints with messages and RMA.

use std::ffi::{c_char, CString};
use std::ptr::NonNull;

use crate::ffi::{self, FiInfo};
use crate::{OfiError, FI_ENODATA};

/// `FI_ATOMIC` in `fi_info::caps`.
const FI_ATOMIC: u64 = 1 << 4;
/// `FI_MULTI_RECV` in `fi_info::caps`.
const FI_MULTI_RECV: u64 = 1 << 16;

/// One interface libfabric offers: a provider's RDM endpoint type on one fabric and domain,
/// with messages and RMA (and atomics, where [`Interface::has_atomics`]).
pub struct Interface {
    /// The whole list `fi_getinfo` returned (freed on drop); `chosen` points into it.
    list: NonNull<FiInfo>,
    chosen: NonNull<FiInfo>,
    attr: ffi::Attr,
}

// SAFETY: the list is plain memory owned by this value, read only through `&self` by
// `fi_dupinfo`-like copies in the shim, never shared with libfabric's other threads.
unsafe impl Send for Interface {}

impl std::fmt::Debug for Interface {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interface")
            .field("provider", &self.provider())
            .field("fabric", &self.fabric())
            .field("domain", &self.domain())
            .finish()
    }
}

impl Drop for Interface {
    fn drop(&mut self) {
        // SAFETY: `list` came from fi_getinfo and is freed once, here.
        unsafe { ffi::amofi_freeinfo(self.list.as_ptr()) }
    }
}

impl Interface {
    /// The first RDM interface with messages, RMA and atomics, else the first with messages
    /// and RMA, of provider `provider` (libfabric's names: `tcp`, `shm`, `sockets`,
    /// `tcp;ofi_rxm`, ...; `None`: whichever libfabric ranks first, which honours
    /// `FI_PROVIDER`). `None` when no provider offers one, with the error of the lookup
    /// otherwise.
    pub fn find(provider: Option<&str>) -> Result<Option<Interface>, OfiError> {
        crate::unhook_signals();
        if !ffi::check_sizes() {
            return Err(OfiError {
                call: "checking the shim's structures".into(),
                code: 0,
                text: "the C shim was compiled with other structure sizes".into(),
                provider: None,
            });
        }
        let prov = provider
            .map(|p| CString::new(p.as_bytes()))
            .transpose()
            .map_err(|_| OfiError {
                call: "fi_getinfo".into(),
                code: 22,
                text: "a provider name with a NUL byte".into(),
                provider: provider.map(str::to_owned),
            })?;
        for atomics in [1, 0] {
            let mut out: *mut FiInfo = std::ptr::null_mut();
            let p = prov.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
            // SAFETY: `p` is null or a NUL-terminated string alive for the call; `out` is a
            // valid location the shim fills with a list we own on success.
            let rc = unsafe { ffi::amofi_getinfo(p, atomics, &mut out) };
            crate::unhook_signals();
            if rc == -FI_ENODATA {
                continue;
            }
            if rc != 0 {
                return Err(OfiError {
                    call: "fi_getinfo".into(),
                    code: -rc,
                    text: ffi::strerror(-rc),
                    provider: provider.map(str::to_owned),
                });
            }
            let Some(list) = NonNull::new(out) else {
                continue;
            };
            let mut attr = std::mem::MaybeUninit::<ffi::Attr>::uninit();
            // SAFETY: `list` is a valid fi_info; the shim fills the whole `Attr`.
            let attr = unsafe {
                ffi::amofi_info_attr(list.as_ptr(), attr.as_mut_ptr());
                attr.assume_init()
            };
            return Ok(Some(Interface {
                list,
                chosen: list,
                attr,
            }));
        }
        Ok(None)
    }

    /// Every interface of the list after this one, in libfabric's order: the other fabrics
    /// and domains of the same lookup. `None` at its end.
    pub fn next(self) -> Option<Interface> {
        // SAFETY: `chosen` is an element of the list we own.
        let next = NonNull::new(unsafe { ffi::amofi_info_next(self.chosen.as_ptr()) })?;
        let mut attr = std::mem::MaybeUninit::<ffi::Attr>::uninit();
        // SAFETY: `next` is an element of the same list; the shim fills the whole `Attr`.
        let attr = unsafe {
            ffi::amofi_info_attr(next.as_ptr(), attr.as_mut_ptr());
            attr.assume_init()
        };
        let list = self.list;
        std::mem::forget(self);
        Some(Interface {
            list,
            chosen: next,
            attr,
        })
    }

    pub(crate) fn raw(&self) -> *const FiInfo {
        self.chosen.as_ptr()
    }

    /// The provider's name as libfabric gives it (`tcp;ofi_rxm`, `shm`, ...).
    pub fn provider(&self) -> String {
        ffi::text(&self.attr.prov)
    }

    /// The fabric's name (a subnet for the socket providers).
    pub fn fabric(&self) -> String {
        ffi::text(&self.attr.fabric)
    }

    /// The domain's name (an interface such as `eth0`, or `shm`).
    pub fn domain(&self) -> String {
        ffi::text(&self.attr.domain)
    }

    /// Whether the provider applies remote atomics (`FI_ATOMIC`).
    pub fn has_atomics(&self) -> bool {
        self.attr.caps & FI_ATOMIC != 0
    }

    /// Whether receive buffers may take several messages (`FI_MULTI_RECV`).
    pub fn has_multi_recv(&self) -> bool {
        self.attr.caps & FI_MULTI_RECV != 0
    }

    /// The largest message `fi_inject` sends, copied at once, without a completion.
    pub fn inject_size(&self) -> usize {
        usize::try_from(self.attr.inject_size).unwrap_or(usize::MAX)
    }

    /// The largest message or RMA transfer.
    pub fn max_msg_size(&self) -> usize {
        usize::try_from(self.attr.max_msg_size).unwrap_or(usize::MAX)
    }

    /// How many operations the transmit queue holds.
    pub fn tx_size(&self) -> usize {
        usize::try_from(self.attr.tx_size).unwrap_or(usize::MAX)
    }

    /// How many receives the receive queue holds.
    pub fn rx_size(&self) -> usize {
        usize::try_from(self.attr.rx_size).unwrap_or(usize::MAX)
    }

    /// Whether data moves only inside this process's libfabric calls
    /// (`FI_PROGRESS_MANUAL`), as for `tcp` and `shm`, rather than on the provider's own.
    pub fn manual_progress(&self) -> bool {
        self.attr.data_progress == 2
    }
}

/// The providers offering RDM endpoints on this machine, as `fi_getinfo` lists them
/// (`"tcp;ofi_rxm, shm, sockets"`), for error messages.
pub fn providers() -> String {
    let mut buf = vec![0 as c_char; 1024];
    // SAFETY: the shim writes a NUL-terminated text of at most `buf.len()` bytes.
    let rc = unsafe { ffi::amofi_providers(buf.as_mut_ptr(), buf.len()) };
    if rc != 0 {
        return format!("none ({})", ffi::strerror(-rc));
    }
    let t = ffi::text(&buf);
    if t.is_empty() {
        "none".into()
    } else {
        t
    }
}
