//! The C shim's functions (`csrc/shim.c`) and the structures it shares with Rust. The shim's
//! own structures are checked against these declarations when the first interface is looked
//! up ([`check_sizes`]); libfabric's are never seen by Rust.

use std::ffi::{c_char, c_int, c_void};

/// `struct fi_info`, only ever behind a pointer.
#[repr(C)]
pub(crate) struct FiInfo {
    _opaque: [u8; 0],
}

/// `struct amofi`, only ever behind a pointer.
#[repr(C)]
pub(crate) struct Amofi {
    _opaque: [u8; 0],
}

/// `struct amofi_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Attr {
    pub caps: u64,
    pub mode: u64,
    pub mr_mode: u64,
    pub inject_size: u64,
    pub max_msg_size: u64,
    pub tx_size: u64,
    pub rx_size: u64,
    pub data_progress: u64,
    pub msg_order: u64,
    pub prov: [c_char; 64],
    pub fabric: [c_char; 64],
    pub domain: [c_char; 64],
}

/// `struct amofi_cqe`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub(crate) struct Cqe {
    pub context: u64,
    pub flags: u64,
    pub len: u64,
}

/// `struct amofi_cqerr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CqErr {
    pub context: u64,
    pub flags: u64,
    pub err: i32,
    pub prov_errno: i32,
    pub text: [c_char; 256],
}

extern "C" {
    pub(crate) fn amofi_unhook_signals() -> c_int;
    pub(crate) fn amofi_sizes(attr: *mut usize, cqe: *mut usize, cqerr: *mut usize);
    pub(crate) fn amofi_strerror(err: c_int) -> *const c_char;
    pub(crate) fn amofi_getinfo(
        prov: *const c_char,
        atomics: c_int,
        out: *mut *mut FiInfo,
    ) -> c_int;
    pub(crate) fn amofi_info_next(info: *mut FiInfo) -> *mut FiInfo;
    pub(crate) fn amofi_freeinfo(info: *mut FiInfo);
    pub(crate) fn amofi_info_attr(info: *const FiInfo, out: *mut Attr);
    pub(crate) fn amofi_providers(buf: *mut c_char, len: usize) -> c_int;
    pub(crate) fn amofi_open(
        info: *const FiInfo,
        cq_size: usize,
        want_fd: c_int,
        shm_name: *const c_char,
        out: *mut *mut Amofi,
        step: *mut *const c_char,
    ) -> c_int;
    pub(crate) fn amofi_close(a: *mut Amofi) -> c_int;
    pub(crate) fn amofi_shutdown(a: *mut Amofi) -> c_int;
    pub(crate) fn amofi_detach(a: *mut Amofi) -> *mut Amofi;
    pub(crate) fn amofi_wait_fd(a: *const Amofi) -> c_int;
    pub(crate) fn amofi_getname(a: *mut Amofi, buf: *mut c_void, len: *mut usize) -> c_int;
    pub(crate) fn amofi_av_insert(
        a: *mut Amofi,
        addr: *const c_void,
        len: usize,
        out: *mut u64,
    ) -> c_int;
    pub(crate) fn amofi_mr_reg(
        a: *mut Amofi,
        slot: c_int,
        buf: *mut c_void,
        len: usize,
        remote: c_int,
        key: *mut u64,
        base: *mut u64,
    ) -> c_int;
    pub(crate) fn amofi_mr_close(a: *mut Amofi, slot: c_int) -> c_int;
    pub(crate) fn amofi_recv(
        a: *mut Amofi,
        buf: *mut c_void,
        len: usize,
        slot: c_int,
        ctx: u64,
    ) -> isize;
    pub(crate) fn amofi_send(
        a: *mut Amofi,
        buf: *const c_void,
        len: usize,
        slot: c_int,
        dest: u64,
        ctx: u64,
    ) -> isize;
    pub(crate) fn amofi_inject(a: *mut Amofi, buf: *const c_void, len: usize, dest: u64) -> isize;
    pub(crate) fn amofi_rma(
        a: *mut Amofi,
        write: c_int,
        buf: *mut c_void,
        len: usize,
        slot: c_int,
        dest: u64,
        raddr: u64,
        key: u64,
        ctx: u64,
        delivery: c_int,
    ) -> isize;
    pub(crate) fn amofi_atomic_valid(
        a: *mut Amofi,
        code: c_int,
        width: c_int,
        ty: c_int,
        kind: c_int,
    ) -> c_int;
    pub(crate) fn amofi_atomic(
        a: *mut Amofi,
        code: c_int,
        width: c_int,
        ty: c_int,
        operand: *const c_void,
        compare: *const c_void,
        result: *mut c_void,
        slot: c_int,
        dest: u64,
        raddr: u64,
        key: u64,
        ctx: u64,
    ) -> isize;
    pub(crate) fn amofi_cq_read(a: *mut Amofi, out: *mut Cqe, n: usize) -> isize;
    pub(crate) fn amofi_cq_readerr(a: *mut Amofi, out: *mut CqErr) -> c_int;
    pub(crate) fn amofi_trywait(a: *mut Amofi) -> c_int;
}

/// Whether the shim was compiled with the structures declared here.
pub(crate) fn check_sizes() -> bool {
    let (mut a, mut c, mut e) = (0usize, 0usize, 0usize);
    // SAFETY: the shim writes one `size_t` through each pointer, all valid locals.
    unsafe { amofi_sizes(&mut a, &mut c, &mut e) };
    a == std::mem::size_of::<Attr>()
        && c == std::mem::size_of::<Cqe>()
        && e == std::mem::size_of::<CqErr>()
}

/// A NUL-terminated buffer's text (lossy), up to its end if the NUL is missing.
pub(crate) fn text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// `fi_strerror(code)`.
pub(crate) fn strerror(code: i32) -> String {
    // SAFETY: fi_strerror returns a pointer to a static NUL-terminated string for any value.
    let p = unsafe { amofi_strerror(code) };
    if p.is_null() {
        return format!("error {code}");
    }
    // SAFETY: non-null, NUL-terminated and static (above).
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}
