//! A PMIx client for the bootstrap: what Open MPI's `mpirun`, PRRTE and Slurm's
//! `srun --mpi=pmix` give each rank instead of PMI-1/PMI-2.
//!
//! `libpmix` is loaded at run time (`dlopen`), only when the launcher's variables say PMIx
//! is there, so a build and a machine without PMIx work as before. `AM_PMIX_LIB` names the
//! library; otherwise `libpmix.so.2` is looked up by the dynamic loader and then in Debian's
//! `pmix2` directory. Only the calls the bootstrap needs are bound: init, put, commit,
//! fence (with data collection), get, abort and finalize.
//!
//! This is the workspace's one foreign-library boundary; every `unsafe` block says why it
//! holds. The structures are declared by hand from the PMIx standard's C API (PMIx v3, v4
//! and v5 share them: `pmix_proc_t` is a 256-byte namespace and a 32-bit rank;
//! `pmix_value_t` a 16-bit type then an 8-byte aligned union) and, where the library fills
//! them, given more room than it needs.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::ptr::NonNull;

/// `PMIX_MAX_NSLEN + 1`.
const NSPACE_LEN: usize = 256;
const PMIX_SUCCESS: c_int = 0;
/// `PMIX_GLOBAL`: data visible to every rank.
const PMIX_GLOBAL: u8 = 3;
const PMIX_BOOL: u16 = 1;
const PMIX_STRING: u16 = 3;
const PMIX_UINT32: u16 = 14;
const PMIX_RANK_WILDCARD: u32 = 0xFFFF_FFFE;
/// `PMIX_COLLECT_DATA`: a fence that also exchanges what every rank put.
const COLLECT_DATA: &CStr = c"pmix.collect";
/// `PMIX_OPTIONAL`: a get that looks only in the data the last fence collected, so a key
/// the named rank did not put is "not found" at once instead of a request to the server
/// that waits for it.
const OPTIONAL: &CStr = c"pmix.optional";
/// `PMIX_JOB_SIZE`.
const JOB_SIZE: &CStr = c"pmix.job.size";
/// `PMIX_LOCAL_SIZE`: ranks of this job on this node.
const LOCAL_SIZE: &CStr = c"pmix.local.size";

/// `pmix_proc_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Proc {
    nspace: [c_char; NSPACE_LEN],
    rank: u32,
}

/// `pmix_value_t` (32 bytes in PMIx 4): the type, then the union at offset 8. Room for a
/// larger union in other versions.
#[repr(C, align(8))]
struct Value {
    kind: u16,
    _pad: [u8; 6],
    data: [u64; 15],
}

/// `pmix_info_t` (552 bytes in PMIx 4): filled by `PMIx_Info_load`, given room to spare.
/// Only ever passed singly (`ninfo == 1`): the library steps through an array by its own
/// size, so an array of these would be read wrongly.
#[repr(C, align(8))]
struct Info {
    bytes: [u8; 2048],
}

type InitFn = unsafe extern "C" fn(*mut Proc, *mut Info, usize) -> c_int;
type FinalizeFn = unsafe extern "C" fn(*const Info, usize) -> c_int;
type PutFn = unsafe extern "C" fn(u8, *const c_char, *mut Value) -> c_int;
type CommitFn = unsafe extern "C" fn() -> c_int;
type FenceFn = unsafe extern "C" fn(*const Proc, usize, *const Info, usize) -> c_int;
type GetFn =
    unsafe extern "C" fn(*const Proc, *const c_char, *const Info, usize, *mut *mut Value) -> c_int;
type InfoLoadFn = unsafe extern "C" fn(*mut Info, *const c_char, *const c_void, u16) -> c_int;
type ValueDestructFn = unsafe extern "C" fn(*mut Value);
type AbortFn = unsafe extern "C" fn(c_int, *const c_char, *mut Proc, usize) -> c_int;
type ErrorStringFn = unsafe extern "C" fn(c_int) -> *const c_char;

/// Why a PMIx call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PmixError {
    /// `libpmix` could not be loaded or lacks a function.
    #[error("cannot load the PMIx library ({tried}): {why}; install it (Debian: libpmix2) or set AM_PMIX_LIB to its path")]
    Library {
        /// The names and paths tried.
        tried: String,
        /// The loader's message.
        why: String,
    },
    /// A call returned an error status.
    #[error("{call} failed: {message} (status {status})")]
    Call {
        /// The PMIx function.
        call: &'static str,
        /// Its status.
        status: i32,
        /// `PMIx_Error_string` of it.
        message: String,
    },
    /// A key or value with an interior NUL byte, or a namespace the library did not end.
    #[error("{0}")]
    Invalid(String),
    /// A value of another type than asked for.
    #[error("PMIx value of `{key}` has type {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// The type code found.
        found: u16,
        /// The type code expected.
        expected: u16,
    },
}

/// The bound functions of a loaded `libpmix`.
struct Lib {
    init: InitFn,
    finalize: FinalizeFn,
    put: PutFn,
    commit: CommitFn,
    fence: FenceFn,
    get: GetFn,
    info_load: InfoLoadFn,
    value_destruct: ValueDestructFn,
    abort: AbortFn,
    error_string: ErrorStringFn,
}

// SAFETY: the handle and function pointers are process-wide and the PMIx client library is
// thread-safe for these calls; `Pmix` is used from one thread at a time (`&mut self`).
unsafe impl Send for Lib {}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call
    // on this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown error".to_owned()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

impl Lib {
    fn load() -> Result<Lib, PmixError> {
        let mut names: Vec<String> = Vec::new();
        if let Some(p) = std::env::var_os("AM_PMIX_LIB").filter(|p| !p.is_empty()) {
            names.push(p.to_string_lossy().into_owned());
        }
        names.push("libpmix.so.2".into());
        names.push("/usr/lib/x86_64-linux-gnu/pmix2/lib/libpmix.so.2".into());
        names.push("/usr/lib/aarch64-linux-gnu/pmix2/lib/libpmix.so.2".into());
        let mut why = String::new();
        for name in &names {
            let Ok(c) = CString::new(name.as_str()) else {
                continue;
            };
            // SAFETY: `c` is a NUL-terminated path; dlopen has no other precondition.
            let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
            match NonNull::new(h) {
                Some(handle) => return Lib::bind(handle),
                None => why = dl_error(),
            }
        }
        Err(PmixError::Library {
            tried: names.join(", "),
            why,
        })
    }

    fn bind(handle: NonNull<c_void>) -> Result<Lib, PmixError> {
        let sym = |name: &CStr| -> Result<*mut c_void, PmixError> {
            // SAFETY: `handle` came from a successful dlopen and is not closed while bound.
            let p = unsafe { libc::dlsym(handle.as_ptr(), name.as_ptr()) };
            if p.is_null() {
                Err(PmixError::Library {
                    tried: "libpmix".into(),
                    why: format!("no symbol {}", name.to_string_lossy()),
                })
            } else {
                Ok(p)
            }
        };
        // SAFETY: for each transmute, the symbol is the PMIx function of that name, whose C
        // signature (PMIx standard, `pmix.h`) the target type spells out; a function
        // pointer and `*mut c_void` have the same size on the platforms dlsym serves.
        unsafe {
            Ok(Lib {
                init: std::mem::transmute::<*mut c_void, InitFn>(sym(c"PMIx_Init")?),
                finalize: std::mem::transmute::<*mut c_void, FinalizeFn>(sym(c"PMIx_Finalize")?),
                put: std::mem::transmute::<*mut c_void, PutFn>(sym(c"PMIx_Put")?),
                commit: std::mem::transmute::<*mut c_void, CommitFn>(sym(c"PMIx_Commit")?),
                fence: std::mem::transmute::<*mut c_void, FenceFn>(sym(c"PMIx_Fence")?),
                get: std::mem::transmute::<*mut c_void, GetFn>(sym(c"PMIx_Get")?),
                info_load: std::mem::transmute::<*mut c_void, InfoLoadFn>(sym(c"PMIx_Info_load")?),
                value_destruct: std::mem::transmute::<*mut c_void, ValueDestructFn>(sym(
                    c"PMIx_Value_destruct",
                )?),
                abort: std::mem::transmute::<*mut c_void, AbortFn>(sym(c"PMIx_Abort")?),
                error_string: std::mem::transmute::<*mut c_void, ErrorStringFn>(sym(
                    c"PMIx_Error_string",
                )?),
            })
        }
    }

    fn check(&self, call: &'static str, status: c_int) -> Result<(), PmixError> {
        if status == PMIX_SUCCESS {
            return Ok(());
        }
        // SAFETY: PMIx_Error_string returns a static NUL-terminated string (or NULL).
        let message = unsafe {
            let s = (self.error_string)(status);
            if s.is_null() {
                String::new()
            } else {
                CStr::from_ptr(s).to_string_lossy().into_owned()
            }
        };
        Err(PmixError::Call {
            call,
            status,
            message,
        })
    }
}

/// A rank's connection to its PMIx server: its namespace and rank, and the job's key-value
/// store. Finalized on drop.
pub struct Pmix {
    lib: Lib,
    me: Proc,
    finalized: bool,
}

/// True if the environment says a PMIx server serves this process (`PMIX_NAMESPACE`,
/// `PMIX_RANK` and a server URI are set).
pub fn available() -> bool {
    let set = |v: &str| std::env::var_os(v).is_some_and(|s| !s.is_empty());
    set("PMIX_NAMESPACE")
        && set("PMIX_RANK")
        && [
            "PMIX_SERVER_URI41",
            "PMIX_SERVER_URI4",
            "PMIX_SERVER_URI3",
            "PMIX_SERVER_URI21",
            "PMIX_SERVER_URI2",
        ]
        .iter()
        .any(|v| set(v))
}

fn key(k: &str) -> Result<CString, PmixError> {
    if k.len() > 511 {
        return Err(PmixError::Invalid(format!(
            "PMIx key longer than 511 bytes: {k:?}"
        )));
    }
    CString::new(k).map_err(|_| PmixError::Invalid(format!("PMIx key with a NUL byte: {k:?}")))
}

impl Pmix {
    /// Loads `libpmix` and connects to the local PMIx server (`PMIx_Init`).
    pub fn init() -> Result<Pmix, PmixError> {
        let lib = Lib::load()?;
        let mut me = Proc {
            nspace: [0; NSPACE_LEN],
            rank: 0,
        };
        // SAFETY: `me` is a valid pmix_proc_t to fill; no info array (NULL, 0).
        let status = unsafe { (lib.init)(&mut me, std::ptr::null_mut(), 0) };
        lib.check("PMIx_Init", status)?;
        if !me.nspace.contains(&0) {
            return Err(PmixError::Invalid(
                "PMIx namespace not NUL-terminated".into(),
            ));
        }
        Ok(Pmix {
            lib,
            me,
            finalized: false,
        })
    }

    /// This process's rank in its namespace.
    pub fn rank(&self) -> u32 {
        self.me.rank
    }

    /// This job's namespace (its PMIx name).
    pub fn namespace(&self) -> String {
        let bytes: Vec<u8> = self
            .me
            .nspace
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn proc(&self, rank: u32) -> Proc {
        Proc {
            nspace: self.me.nspace,
            rank,
        }
    }

    /// The number of ranks in the job (`PMIX_JOB_SIZE`).
    pub fn job_size(&mut self) -> Result<u32, PmixError> {
        self.get_u32(PMIX_RANK_WILDCARD, JOB_SIZE)
    }

    /// The number of this job's ranks on this node (`PMIX_LOCAL_SIZE`).
    pub fn local_size(&mut self) -> Result<u32, PmixError> {
        self.get_u32(PMIX_RANK_WILDCARD, LOCAL_SIZE)
    }

    /// Publishes `value` under `key` for every rank (visible after [`Pmix::commit`] and a
    /// [`Pmix::fence`]).
    pub fn put(&mut self, k: &str, value: &str) -> Result<(), PmixError> {
        let k = key(k)?;
        let v = CString::new(value)
            .map_err(|_| PmixError::Invalid(format!("PMIx value with a NUL byte: {value:?}")))?;
        let mut val = Value {
            kind: PMIX_STRING,
            _pad: [0; 6],
            data: [0; 15],
        };
        val.data[0] = v.as_ptr() as u64;
        // SAFETY: `k` is a NUL-terminated key of at most PMIX_MAX_KEYLEN bytes; `val` is a
        // PMIX_STRING value whose string pointer (union offset 8) stays valid for the call;
        // PMIx_Put copies the value.
        let status = unsafe { (self.lib.put)(PMIX_GLOBAL, k.as_ptr(), &mut val) };
        self.lib.check("PMIx_Put", status)
    }

    /// Pushes this rank's puts to the server (`PMIx_Commit`).
    pub fn commit(&mut self) -> Result<(), PmixError> {
        // SAFETY: no arguments.
        let status = unsafe { (self.lib.commit)() };
        self.lib.check("PMIx_Commit", status)
    }

    /// Waits until every rank of the job has reached this fence, collecting their data.
    pub fn fence(&mut self) -> Result<(), PmixError> {
        let all = self.proc(PMIX_RANK_WILDCARD);
        let info = self.flag(COLLECT_DATA)?;
        // SAFETY: one valid pmix_proc_t (the whole namespace) and one loaded pmix_info_t.
        let status = unsafe { (self.lib.fence)(&all, 1, &*info, 1) };
        self.lib.check("PMIx_Fence", status)
    }

    /// The string `rank` put under `key` before the last fence; `Ok(None)` if it put none.
    pub fn get(&mut self, rank: u32, k: &str) -> Result<Option<String>, PmixError> {
        match self.get_value(rank, &key(k)?, k, true)? {
            None => Ok(None),
            Some(v) => v.string(k).map(Some),
        }
    }

    fn get_u32(&mut self, rank: u32, k: &CStr) -> Result<u32, PmixError> {
        let name = k.to_string_lossy().into_owned();
        match self.get_value(rank, k, &name, false)? {
            None => Err(PmixError::Call {
                call: "PMIx_Get",
                status: -46,
                message: format!("{name} not found"),
            }),
            Some(v) => v.uint32(&name),
        }
    }

    /// A flag (`PMIX_BOOL` true) as a `pmix_info_t`.
    fn flag(&self, k: &CStr) -> Result<Box<Info>, PmixError> {
        let mut info = Box::new(Info { bytes: [0; 2048] });
        let yes = true;
        // SAFETY: `info` has room for a pmix_info_t (552 bytes in PMIx 4); the key is a
        // NUL-terminated string and the data a C bool of type PMIX_BOOL, both copied.
        let status = unsafe {
            (self.lib.info_load)(
                &mut *info,
                k.as_ptr(),
                (&yes as *const bool).cast(),
                PMIX_BOOL,
            )
        };
        self.lib.check("PMIx_Info_load", status)?;
        Ok(info)
    }

    fn get_value(
        &mut self,
        rank: u32,
        k: &CStr,
        name: &str,
        local_only: bool,
    ) -> Result<Option<Got<'_>>, PmixError> {
        let proc = self.proc(rank);
        let optional = if local_only {
            Some(self.flag(OPTIONAL)?)
        } else {
            None
        };
        let (info, ninfo) = match &optional {
            Some(i) => (&**i as *const Info, 1),
            None => (std::ptr::null(), 0),
        };
        let mut out: *mut Value = std::ptr::null_mut();
        // SAFETY: a valid pmix_proc_t, a NUL-terminated key, `ninfo` loaded pmix_info_t (or
        // none), and a place for the library to store a pointer to a value it allocates.
        let status = unsafe { (self.lib.get)(&proc, k.as_ptr(), info, ninfo, &mut out) };
        // PMIX_ERR_NOT_FOUND (-46): an optional get of a key the rank did not put;
        // PMIX_ERR_TIMEOUT (-24): what a get without PMIX_OPTIONAL returns for it (after
        // the server's 2 s wait in PMIx 4.2).
        if status == -46 || status == -24 {
            return Ok(None);
        }
        self.lib.check("PMIx_Get", status)?;
        let value = NonNull::new(out).ok_or_else(|| PmixError::Call {
            call: "PMIx_Get",
            status: 0,
            message: format!("no value returned for {name}"),
        })?;
        Ok(Some(Got {
            lib: &self.lib,
            value,
        }))
    }

    /// Asks the launcher to end the whole job with `code` (`PMIx_Abort`).
    pub fn abort(&mut self, code: i32, message: &str) -> Result<(), PmixError> {
        let msg = CString::new(message.replace('\0', " ")).unwrap_or_default();
        // SAFETY: a NUL-terminated message; NULL procs means the whole namespace.
        let status = unsafe { (self.lib.abort)(code, msg.as_ptr(), std::ptr::null_mut(), 0) };
        self.lib.check("PMIx_Abort", status)
    }

    /// Disconnects from the server (`PMIx_Finalize`); also done on drop.
    pub fn finalize(&mut self) -> Result<(), PmixError> {
        if std::mem::replace(&mut self.finalized, true) {
            return Ok(());
        }
        // SAFETY: no info array.
        let status = unsafe { (self.lib.finalize)(std::ptr::null(), 0) };
        self.lib.check("PMIx_Finalize", status)
    }
}

impl Drop for Pmix {
    fn drop(&mut self) {
        // The library stays loaded (no dlclose): PMIx may keep threads running its code.
        let _ = self.finalize();
    }
}

/// A value `PMIx_Get` allocated; released on drop.
struct Got<'a> {
    lib: &'a Lib,
    value: NonNull<Value>,
}

impl Got<'_> {
    fn kind(&self) -> u16 {
        // SAFETY: `value` points to a pmix_value_t the library allocated and filled; its
        // type is the first 16 bits.
        unsafe { (*self.value.as_ptr()).kind }
    }

    fn string(&self, k: &str) -> Result<String, PmixError> {
        if self.kind() != PMIX_STRING {
            return Err(PmixError::WrongType {
                key: k.into(),
                found: self.kind(),
                expected: PMIX_STRING,
            });
        }
        // SAFETY: a PMIX_STRING value holds a `char *` at union offset 8, NULL or
        // NUL-terminated, owned by the value until it is destructed (after this copy).
        unsafe {
            let p = (*self.value.as_ptr()).data[0] as *const c_char;
            if p.is_null() {
                return Ok(String::new());
            }
            Ok(CStr::from_ptr(p).to_string_lossy().into_owned())
        }
    }

    fn uint32(&self, k: &str) -> Result<u32, PmixError> {
        if self.kind() != PMIX_UINT32 {
            return Err(PmixError::WrongType {
                key: k.into(),
                found: self.kind(),
                expected: PMIX_UINT32,
            });
        }
        // SAFETY: a PMIX_UINT32 value holds a uint32_t at union offset 8 (little- or
        // big-endian alike: it is read as a u32, not from a wider word).
        Ok(unsafe { *((*self.value.as_ptr()).data.as_ptr() as *const u32) })
    }
}

impl Drop for Got<'_> {
    fn drop(&mut self) {
        // SAFETY: the value was allocated by PMIx_Get with malloc (pmix_free is free):
        // PMIx_Value_destruct frees its contents, then the struct itself is freed, once.
        unsafe {
            (self.lib.value_destruct)(self.value.as_ptr());
            libc::free(self.value.as_ptr().cast());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_pmix_4() {
        // From a C program compiled against PMIx 4.2's headers (Debian libpmix-dev).
        assert_eq!(std::mem::size_of::<Proc>(), 260);
        assert_eq!(std::mem::offset_of!(Proc, rank), 256);
        assert_eq!(std::mem::offset_of!(Value, data), 8);
        assert!(std::mem::size_of::<Value>() >= 32);
        assert!(std::mem::size_of::<Info>() >= 552);
    }

    #[test]
    fn keys_are_checked() {
        assert!(key("am-sci-3").is_ok());
        assert!(matches!(key("a\0b"), Err(PmixError::Invalid(_))));
        assert!(matches!(key(&"k".repeat(512)), Err(PmixError::Invalid(_))));
    }
}
