//! An RDM endpoint with everything the provider may touch: its buffers and the registered
//! segment.

use std::alloc::Layout;
use std::collections::VecDeque;
use std::ffi::c_void;
use std::os::fd::BorrowedFd;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, PoisonError};

use am_shm::{Segment, SharedBytes};

use crate::ffi::{self, Amofi};
use crate::info::Interface;
use crate::{OfiError, FI_EAGAIN};

/// `FI_EAVAIL`: an error completion is next.
const FI_EAVAIL: i32 = 259;

/// Memory registration slots of the shim: the endpoint's own, then those of segments
/// registered with [`Endpoint::register_segment`] from [`MR_FIRST_SEGMENT`] on.
const MR_SEGMENT: i32 = 0;
const MR_RECV: i32 = 1;
const MR_SEND: i32 = 2;
const MR_STAGE: i32 = 3;
const MR_AMO: i32 = 4;
const MR_FIRST_SEGMENT: i32 = 5;

/// Operation contexts: the kind in the high half, the slot in the low.
const CTX_RECV: u64 = 1 << 32;
const CTX_SEND: u64 = 2 << 32;
const CTX_STAGE: u64 = 3 << 32;
const CTX_AMO: u64 = 4 << 32;
/// Atomics' small buffers (operand, compare, result): how many may be in flight.
const AMO_SLOTS: usize = 256;
/// [`Op`]s of the atomics' buffers have this bit set.
const OP_AMO: u32 = 1 << 31;

/// How many buffers of what size an [`Endpoint`] hands the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Receive buffers kept posted.
    pub recv_slots: usize,
    /// Bytes per receive buffer: the largest message.
    pub recv_size: usize,
    /// Send buffers (messages larger than the provider's inject size wait in one until their
    /// completion).
    pub send_slots: usize,
    /// Bytes per send buffer.
    pub send_size: usize,
    /// Staging buffers for RMA and atomics in flight.
    pub stage_slots: usize,
    /// Bytes per staging buffer: the largest single RMA transfer.
    pub stage_size: usize,
    /// Ask the completion queue for a file descriptor to sleep on.
    pub wait_fd: bool,
    /// The name of the region the `shm` provider keeps in `/dev/shm` for this endpoint
    /// (other providers have none): unique on the host; `None` leaves libfabric's, which is
    /// made of the process id.
    pub shm_name: Option<String>,
}

/// The local side of an RMA operation.
#[derive(Clone, Copy)]
enum Local {
    /// Its staging buffer.
    Staged,
    /// A range of the registered segment, from here.
    Segment(*mut u8),
    /// A range of a segment of [`Endpoint::register_segment`], from here, and its slot.
    Registered(*mut u8, i32),
}

/// A staging buffer in use by an RMA or atomic operation: released with
/// [`Endpoint::release`] once its [`Event::Done`] (or failure) was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Op(u32);

impl Op {
    /// The buffer's number in its pool.
    fn index(self) -> usize {
        (self.0 & !OP_AMO) as usize
    }

    fn is_amo(self) -> bool {
        self.0 & OP_AMO != 0
    }
}

/// Where a peer finds this endpoint's segment: the address it names it by (the virtual
/// address, or 0 where the provider uses offsets), its key and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Address of the segment's first byte in RMA operations.
    pub base: u64,
    /// The registration's key.
    pub key: u64,
    /// Length in bytes.
    pub len: u64,
}

/// A segment registered with [`Endpoint::register_segment`], until
/// [`Endpoint::deregister`] takes it: one handle per registration (neither `Clone` nor
/// `Copy`), so none outlives its registration to end a later one in the same slot.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Registration(i32);

/// A slot of [`Endpoint::register_segment`]'s registrations.
enum Registered {
    Free,
    /// Registered, with a handle that keeps the memory mapped.
    Held(Segment),
    /// Ended by [`Endpoint::deregister`] while writes from it were in flight
    /// ([`Endpoint::write_from_registration`]): still registered, and its memory held, until
    /// the last of them completes; then closed and freed.
    Closing(Segment),
    /// Its registration could not be closed: its memory was leaked, and the slot is never
    /// used again.
    Leaked,
}

/// What the completion queue reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A message of `len` bytes arrived in receive buffer `slot`: read it with
    /// [`Endpoint::received`], then give the buffer back with [`Endpoint::post_recv`].
    Received {
        /// The receive buffer.
        slot: usize,
        /// The message's length.
        len: usize,
    },
    /// An RMA or atomic operation completed: a read's bytes or an atomic's old value are in
    /// its staging buffer ([`Endpoint::staged`]) until [`Endpoint::release`].
    Done(Op),
    /// An operation failed. A failed send's buffer is free again; a failed receive's buffer
    /// must be posted again; a failed operation's staging buffer released.
    Failed {
        /// Which operation.
        what: Issued,
        /// libfabric's error and the provider's text.
        error: OfiError,
    },
}

/// The kind of operation an error completion belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Issued {
    /// A send: to this peer (a message larger than the inject size, or tracked), or to a
    /// peer the provider does not say (an injected message: its error carries no context).
    Send(Option<usize>),
    /// A receive, in this buffer.
    Recv(usize),
    /// An RMA or atomic operation.
    Op(Op),
    /// A context the endpoint never issued (a provider fault).
    Unknown(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Ours, holding nothing.
    Free,
    /// The provider's until its completion.
    Lent,
    /// Completed: ours, holding what the operation left.
    Ready,
}

/// One allocation the provider may read and write while the endpoint that lent it is open:
/// shared by the [`Buffers`] that hand it out and, after a deferred close, by the
/// [`Kept`] objects that still hold it.
struct Alloc {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: plain heap memory; who reads or writes which part of it is decided by the
// `Buffers` that owns its states (through `&mut`), not by this handle.
unsafe impl Send for Alloc {}
// SAFETY: as above: `Alloc` itself gives no access to the bytes.
unsafe impl Sync for Alloc {}

impl Drop for Alloc {
    fn drop(&mut self) {
        // SAFETY: allocated in `Buffers::new` with this layout, freed once, by the last
        // handle. Every handle is held by an endpoint or its `Kept` objects, which are
        // dropped only after the libfabric objects they lent it to are closed; where
        // closing failed, a handle is leaked and this never runs.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Buffers of one kind in one allocation, 64-byte aligned.
struct Buffers {
    mem: Arc<Alloc>,
    size: usize,
    state: Vec<State>,
    free: Vec<u32>,
}

impl Buffers {
    fn new(count: usize, size: usize) -> Result<Buffers, OfiError> {
        let size = size.max(64).next_multiple_of(64);
        let bytes = count.max(1).checked_mul(size);
        let layout = bytes
            .and_then(|b| Layout::from_size_align(b, 64).ok())
            .ok_or_else(|| local_error("allocating buffers", "sizes overflow"))?;
        // SAFETY: the layout's size is non-zero (count and size are at least 1 and 64).
        let ptr = NonNull::new(unsafe { std::alloc::alloc_zeroed(layout) })
            .ok_or_else(|| local_error("allocating buffers", "out of memory"))?;
        Ok(Buffers {
            mem: Arc::new(Alloc { ptr, layout }),
            size,
            state: vec![State::Free; count],
            free: (0..count as u32).rev().collect(),
        })
    }

    fn at(&self, i: usize) -> *mut u8 {
        debug_assert!(i < self.state.len());
        self.mem.ptr.as_ptr().wrapping_add(i * self.size)
    }

    fn take(&mut self) -> Option<usize> {
        let i = self.free.pop()? as usize;
        debug_assert_eq!(self.state[i], State::Free);
        Some(i)
    }

    fn give_back(&mut self, i: usize) {
        self.state[i] = State::Free;
        self.free.push(i as u32);
    }

    /// Buffer `i`, ours: `Free` or `Ready`, so the provider neither reads nor writes it.
    fn owned(&mut self, i: usize, len: usize) -> &mut [u8] {
        assert!(self.state[i] != State::Lent && len <= self.size);
        // SAFETY: `i` is in bounds (the state lookup above) and `len <= size`, so the range is
        // inside the allocation; the buffer is not lent to the provider (checked), and
        // `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.at(i), len) }
    }

    fn lent(&self) -> usize {
        self.state.iter().filter(|s| **s == State::Lent).count()
    }
}

/// The `shm` provider's endpoints of this process. The provider reaches an endpoint of the
/// same process through that endpoint's own mapping of its region (found by name in a list
/// of the process's), which the endpoint's close unmaps: a peer of the process that still
/// sends to it, or reads an answer it left, would then touch unmapped memory, or memory
/// mapped anew for something else. So an `shm` endpoint closed while another of the process
/// is open is kept whole, still open and no longer used, and closed with the last.
static SHM_PROCESS: Mutex<ShmProcess> = Mutex::new(ShmProcess {
    open: 0,
    kept: Vec::new(),
});

/// [`SHM_PROCESS`], locked; a poisoned lock is taken as it is (every change under it is one
/// step, so a panic leaves it consistent).
fn shm_process() -> std::sync::MutexGuard<'static, ShmProcess> {
    SHM_PROCESS.lock().unwrap_or_else(PoisonError::into_inner)
}

struct ShmProcess {
    /// `shm` endpoints of this process not yet shut down.
    open: usize,
    kept: Vec<Kept>,
}

/// The libfabric objects of an endpoint shut down while others of the process were open,
/// still open, with everything they may touch.
struct Kept {
    raw: NonNull<Amofi>,
    // Dropped after `raw` is closed (see `Drop`).
    mem: Vec<Arc<Alloc>>,
    segment: Segment,
    registered: Vec<Segment>,
}

// SAFETY: the objects are used by nobody until they are closed, by one thread, under the
// `SHM_PROCESS` lock or after taking them out of it; the memory is plain memory.
unsafe impl Send for Kept {}

impl Drop for Kept {
    fn drop(&mut self) {
        // SAFETY: `raw` came from amofi_detach and is closed once, here, before the memory
        // and the segment it may touch (fields, dropped after this).
        let rc = unsafe { ffi::amofi_close(self.raw.as_ptr()) };
        if rc != 0 {
            for m in &self.mem {
                std::mem::forget(Arc::clone(m));
            }
            std::mem::forget(self.segment.share());
            for seg in &self.registered {
                std::mem::forget(seg.share());
            }
        }
    }
}

fn local_error(call: &str, text: &str) -> OfiError {
    OfiError {
        call: call.into(),
        code: 0,
        text: text.into(),
        provider: None,
    }
}

/// An enabled RDM endpoint, its completion queue and address vector, the registered segment
/// and the buffers the provider reads and writes. Driven by one thread at a time (`&mut`).
pub struct Endpoint {
    raw: NonNull<Amofi>,
    provider: String,
    inject_size: usize,
    max_msg: usize,
    wait_fd: Option<i32>,
    // Dropped after `raw` is closed (see `Drop`).
    segment: Segment,
    region: Region,
    /// Segments registered for peers' access, by slot from [`MR_FIRST_SEGMENT`]: each holds
    /// a handle of its memory, so the memory stays mapped while the provider may reach it.
    registered: Vec<Registered>,
    /// By staging buffer: the registration (its index in `registered`) whose memory the
    /// buffer's lent write reads ([`Endpoint::write_from_registration`]); cleared at its
    /// completion or failure. A registration some buffer names here is not closed.
    reading: Vec<Option<usize>>,
    recv: Buffers,
    send: Buffers,
    stage: Buffers,
    amo: Buffers,
    scratch: Vec<u8>,
    peers: Vec<u64>,
    /// An `shm` endpoint counted in [`SHM_PROCESS`] and not yet shut down.
    shm_open: bool,
    /// By send buffer: the peer its message went to.
    send_dest: Vec<u32>,
    cqes: Vec<ffi::Cqe>,
}

// SAFETY: the libfabric objects are used only through `&mut self` (one thread at a time, as
// FI_THREAD_DOMAIN allows), and the buffers are plain memory owned by this value. Moving the
// endpoint to another thread moves all of it.
unsafe impl Send for Endpoint {}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("provider", &self.provider)
            .field("peers", &self.peers.len())
            .finish()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // An `shm` endpoint's objects may move to the kept ones here (then `raw` holds none).
        self.shutdown();
        if self.shm_open {
            // Others of the process are open and no handle could be made to keep it: it
            // stays open, and what it lent is never freed; the others close without it.
            shm_process().open -= 1;
            self.leak();
            return;
        }
        // SAFETY: `raw` came from amofi_open and is closed once, here, before the buffers and
        // the segment (fields, dropped after this) are freed: closing the endpoint ends every
        // operation that could still touch them.
        let rc = unsafe { ffi::amofi_close(self.raw.as_ptr()) };
        if rc != 0 {
            self.leak();
        }
    }
}

impl Endpoint {
    /// Closes the endpoint and every libfabric object under it now, rather than at the
    /// drop (the `shm` provider removes its region in `/dev/shm` then; a process that ends
    /// with `exit` runs no drop). Every operation after it fails, and polls find nothing.
    ///
    /// An `shm` endpoint shut down while another `shm` endpoint of this process is open stays
    /// open, unused, until the last of them is shut down (its region in `/dev/shm` too):
    /// the provider reaches endpoints of one process through their own mappings.
    pub fn shutdown(&mut self) {
        self.wait_fd = None;
        let mut kept = Vec::new();
        if std::mem::take(&mut self.shm_open) {
            let mut process = shm_process();
            process.open -= 1;
            if process.open > 0 {
                match self.detach() {
                    Some(k) => process.kept.push(k),
                    // No memory for a handle: this endpoint stays open, as it is, until
                    // its drop.
                    None => self.shm_open = true,
                }
                if self.shm_open {
                    process.open += 1;
                }
                return;
            }
            kept = std::mem::take(&mut process.kept);
        }
        // SAFETY: `raw` is a valid handle; the shim closes each object once and leaves the
        // handle valid, with every later call refused.
        let rc = unsafe { ffi::amofi_shutdown(self.raw.as_ptr()) };
        if rc != 0 {
            self.leak();
        }
        // The last `shm` endpoint of the process: nobody uses the kept ones any more.
        drop(kept);
    }

    /// This endpoint's open objects as [`Kept`] (with shares of all they may touch),
    /// leaving `raw` with none, as after a shutdown; `None` when out of memory.
    fn detach(&mut self) -> Option<Kept> {
        // SAFETY: `raw` is a valid handle; the shim moves its open objects to a new handle
        // and leaves this one valid, with every later call refused.
        let moved = NonNull::new(unsafe { ffi::amofi_detach(self.raw.as_ptr()) })?;
        Some(Kept {
            raw: moved,
            mem: [&self.recv, &self.send, &self.stage, &self.amo]
                .iter()
                .map(|b| Arc::clone(&b.mem))
                .collect(),
            segment: self.segment.share(),
            registered: self.registered_shares(),
        })
    }

    /// Another handle of every segment registered now.
    fn registered_shares(&self) -> Vec<Segment> {
        self.registered
            .iter()
            .filter_map(|r| match r {
                Registered::Held(seg) | Registered::Closing(seg) => Some(seg.share()),
                Registered::Free | Registered::Leaked => None,
            })
            .collect()
    }

    /// The endpoint could not be closed, so the provider may still touch what it was lent:
    /// none of it is ever freed.
    fn leak(&mut self) {
        for b in [&self.recv, &self.send, &self.stage, &self.amo] {
            std::mem::forget(Arc::clone(&b.mem));
        }
        std::mem::forget(self.segment.share());
        for seg in self.registered_shares() {
            std::mem::forget(seg);
        }
    }

    /// Opens an endpoint on `iface`, registers `segment`'s byte area for peers' RMA and
    /// atomics, and posts every receive buffer.
    pub fn open(
        iface: &Interface,
        segment: Segment,
        config: EndpointConfig,
    ) -> Result<Endpoint, OfiError> {
        let provider = iface.provider();
        let cq_size = (config.recv_slots + config.send_slots + config.stage_slots + AMO_SLOTS)
            .max(64)
            .next_power_of_two();
        // Allocated before the libfabric objects, so that a failure leaves nothing open.
        let recv = Buffers::new(config.recv_slots, config.recv_size)?;
        let send = Buffers::new(config.send_slots, config.send_size)?;
        let stage = Buffers::new(config.stage_slots, config.stage_size)?;
        let amo = Buffers::new(AMO_SLOTS, 64)?;
        let shm_name = config
            .shm_name
            .as_deref()
            .map(std::ffi::CString::new)
            .transpose()
            .map_err(|_| local_error("fi_setname", "a name with a NUL byte"))?;
        let mut raw: *mut Amofi = std::ptr::null_mut();
        let mut step: *const std::ffi::c_char = std::ptr::null();
        // SAFETY: `iface.raw()` is a valid fi_info for the call (the shim copies it);
        // `shm_name` is null or a NUL-terminated string alive for the call; `raw` and `step`
        // are valid locations the shim fills.
        let rc = unsafe {
            ffi::amofi_open(
                iface.raw(),
                cq_size,
                config.wait_fd as i32,
                shm_name.as_ref().map_or(std::ptr::null(), |n| n.as_ptr()),
                &mut raw,
                &mut step,
            )
        };
        if rc != 0 {
            let call = if step.is_null() {
                "opening the endpoint".to_owned()
            } else {
                // SAFETY: `step` points to one of the shim's static string literals.
                unsafe { std::ffi::CStr::from_ptr(step) }
                    .to_string_lossy()
                    .into_owned()
            };
            return Err(OfiError {
                call,
                code: -rc,
                text: ffi::strerror(-rc),
                provider: Some(provider),
            });
        }
        let raw = NonNull::new(raw).ok_or_else(|| local_error("amofi_open", "no endpoint"))?;
        // SAFETY: `raw` is a valid handle.
        let fd = unsafe { ffi::amofi_wait_fd(raw.as_ptr()) };
        let mut ep = Endpoint {
            raw,
            provider,
            inject_size: iface.inject_size(),
            max_msg: iface.max_msg_size(),
            wait_fd: (fd >= 0).then_some(fd),
            region: Region {
                base: 0,
                key: 0,
                len: segment.byte_area().len() as u64,
            },
            segment,
            registered: Vec::new(),
            reading: vec![None; stage.state.len()],
            recv,
            send,
            stage,
            amo,
            send_dest: vec![0; config.send_slots],
            scratch: Vec::new(),
            peers: Vec::new(),
            shm_open: false,
            cqes: vec![ffi::Cqe::default(); 64],
        };
        let area = ep.segment.byte_area();
        let (ptr, len) = (area.as_ptr(), area.len().max(1));
        let (key, base) = ep.register(MR_SEGMENT, ptr, len, true)?;
        ep.region.key = key;
        ep.region.base = base;
        for (slot, kind) in [(MR_RECV, 0), (MR_SEND, 1), (MR_STAGE, 2), (MR_AMO, 3)] {
            let b = [&ep.recv, &ep.send, &ep.stage, &ep.amo][kind];
            let (ptr, len) = (b.mem.ptr.as_ptr(), b.mem.layout.size());
            ep.register(slot, ptr, len, false)?;
        }
        for _ in 0..config.recv_slots {
            let i = ep
                .recv
                .take()
                .expect("every receive buffer is free at first");
            ep.post_recv(i)?;
        }
        if ep.provider == "shm" {
            shm_process().open += 1;
            ep.shm_open = true;
        }
        Ok(ep)
    }

    fn register(
        &mut self,
        slot: i32,
        ptr: *mut u8,
        len: usize,
        remote: bool,
    ) -> Result<(u64, u64), OfiError> {
        let (mut key, mut base) = (0u64, 0u64);
        // SAFETY: `ptr..ptr+len` is memory this endpoint keeps mapped while it is
        // registered: its own segment or a buffer allocation, for its whole life, or a
        // segment of `register_segment`, whose handle `registered` holds until the slot is
        // closed (`deregister`) or the endpoint is (its drop closes `raw` before the fields
        // go; a close that fails leaks them). The provider reaches it only through libfabric,
        // never through a Rust reference.
        let rc = unsafe {
            ffi::amofi_mr_reg(
                self.raw.as_ptr(),
                slot,
                ptr.cast::<c_void>(),
                len,
                remote as i32,
                &mut key,
                &mut base,
            )
        };
        self.check(rc as isize, "fi_mr_reg")?;
        Ok((key, base))
    }

    fn error(&self, call: &str, code: i32) -> OfiError {
        OfiError {
            call: call.into(),
            code,
            text: ffi::strerror(code),
            provider: Some(self.provider.clone()),
        }
    }

    /// `Ok(true)` for success, `Ok(false)` for `FI_EAGAIN`, the error otherwise.
    fn check(&self, rc: isize, call: &str) -> Result<bool, OfiError> {
        match rc {
            0.. => Ok(true),
            rc if rc == -(FI_EAGAIN as isize) => Ok(false),
            rc => Err(self.error(call, (-rc) as i32)),
        }
    }

    /// The provider's name.
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The largest message [`Endpoint::send`] takes.
    pub fn max_message(&self) -> usize {
        self.send.size.max(self.inject_size).min(self.max_msg)
    }

    /// How many receive buffers the endpoint keeps posted.
    pub fn recv_slots(&self) -> usize {
        self.recv.state.len()
    }

    /// The largest transfer of one [`Endpoint::write`] or [`Endpoint::read`].
    pub fn max_transfer(&self) -> usize {
        self.stage.size.min(self.max_msg)
    }

    /// The largest transfer of one [`Endpoint::write_from_segment`]: the provider's largest
    /// message.
    pub fn max_segment_transfer(&self) -> usize {
        self.max_msg
    }

    /// This endpoint's address, for its peers' [`Endpoint::insert`].
    pub fn name(&mut self) -> Result<Vec<u8>, OfiError> {
        let mut buf = vec![0u8; 256];
        let mut len = buf.len();
        // SAFETY: `buf` has `len` writable bytes; the shim writes at most that and sets `len`.
        let rc =
            unsafe { ffi::amofi_getname(self.raw.as_ptr(), buf.as_mut_ptr().cast(), &mut len) };
        self.check(rc as isize, "fi_getname")?;
        buf.truncate(len);
        Ok(buf)
    }

    /// Makes `names` (every rank's [`Endpoint::name`], in rank order) the peers this
    /// endpoint talks to: peer `i` is `names[i]`.
    pub fn insert(&mut self, names: &[Vec<u8>]) -> Result<(), OfiError> {
        let mut peers = Vec::with_capacity(names.len());
        for name in names {
            if name.is_empty() {
                return Err(local_error("fi_av_insert", "an empty peer address"));
            }
            // The provider reads a name as long as its own are; shorter ones are padded
            // with zeros, which no address-reading code reads past.
            let mut padded = name.clone();
            padded.resize(name.len().max(256), 0);
            let mut fa = 0u64;
            // SAFETY: `padded` holds an address of this provider (from fi_getname, padded
            // with zeros to at least 256 bytes, more than any provider's address length reads
            // for a name of its own), alive for the call; `fa` is a valid location.
            let rc = unsafe {
                ffi::amofi_av_insert(
                    self.raw.as_ptr(),
                    padded.as_ptr().cast(),
                    name.len(),
                    &mut fa,
                )
            };
            self.check(rc as isize, "fi_av_insert")?;
            peers.push(fa);
        }
        self.peers = peers;
        Ok(())
    }

    /// Where peers find this endpoint's segment.
    pub fn region(&self) -> Region {
        self.region
    }

    /// Registers all of `segment` (its word area, then its byte area:
    /// [`Segment::whole_area`]) for peers' RMA and atomics, holding a handle of it so that
    /// its memory stays mapped until [`Endpoint::deregister`] (or the endpoint's close):
    /// where peers find it, and the handle to deregister it by. Each registration gets a key
    /// of its own where the provider leaves keys to the endpoint.
    pub fn register_segment(
        &mut self,
        segment: &Segment,
    ) -> Result<(Registration, Region), OfiError> {
        let index = match self
            .registered
            .iter()
            .position(|r| matches!(r, Registered::Free))
        {
            Some(i) => i,
            None => {
                self.registered.push(Registered::Free);
                self.registered.len() - 1
            }
        };
        let slot = i32::try_from(index)
            .ok()
            .and_then(|i| i.checked_add(MR_FIRST_SEGMENT))
            .ok_or_else(|| local_error("fi_mr_reg", "too many registrations"))?;
        let held = segment.share();
        let (ptr, len) = {
            let area = held.whole_area();
            (area.as_ptr(), area.len())
        };
        let (key, base) = self.register(slot, ptr, len.max(1), true)?;
        self.registered[index] = Registered::Held(held);
        let region = Region {
            base,
            key,
            len: len as u64,
        };
        Ok((Registration(slot), region))
    }

    /// Ends registration `r` ([`Endpoint::register_segment`]): peers' accesses with its key
    /// fail from now on, and its handle of the segment's memory is dropped. If the provider
    /// cannot close it, it may still reach the memory, which then stays mapped for good.
    /// While writes from it ([`Endpoint::write_from_registration`]) are in flight, the
    /// provider still reads its memory: it is closed when the last of them completes (or
    /// fails), and a close refused then leaves the memory mapped for good as well.
    pub fn deregister(&mut self, r: Registration) -> Result<(), OfiError> {
        let Some((index, _)) = self.held(&r) else {
            return Ok(());
        };
        if self.reading.contains(&Some(index)) {
            let was = std::mem::replace(&mut self.registered[index], Registered::Free);
            if let Registered::Held(seg) = was {
                self.registered[index] = Registered::Closing(seg);
            }
            return Ok(());
        }
        self.close_registration(index)
    }

    /// Closes the registration at `index` of `registered` (held, or closing and read by no
    /// write in flight) and drops its handle of the memory.
    fn close_registration(&mut self, index: usize) -> Result<(), OfiError> {
        let slot = i32::try_from(index)
            .ok()
            .and_then(|i| i.checked_add(MR_FIRST_SEGMENT))
            .ok_or_else(|| local_error("fi_close(mr)", "no such registration"))?;
        // SAFETY: a valid handle; the shim closes the registration in that slot, after which
        // the provider no longer reaches its memory (or reports that it could not). No write
        // in flight reads it (`reading`, checked by the callers).
        let rc = unsafe { ffi::amofi_mr_close(self.raw.as_ptr(), slot) };
        let was = std::mem::replace(&mut self.registered[index], Registered::Free);
        if rc != 0 {
            // Still the provider's: its memory is never unmapped, and the slot never reused.
            self.registered[index] = Registered::Leaked;
            std::mem::forget(was);
            return Err(self.error("fi_close(mr)", -rc));
        }
        Ok(())
    }

    /// Staging buffer `i`'s write, if it read a registration's memory, no longer does (its
    /// completion or failure came): a registration deregistered meanwhile and read by no
    /// other write is closed now. Its close has no caller to report a refusal to: the
    /// memory then stays mapped for good, as [`Endpoint::deregister`] says.
    fn done_reading(&mut self, i: usize) {
        let Some(index) = self.reading.get_mut(i).and_then(Option::take) else {
            return;
        };
        if matches!(self.registered.get(index), Some(Registered::Closing(_)))
            && !self.reading.contains(&Some(index))
        {
            let _ = self.close_registration(index);
        }
    }

    /// Registration `r`, if it is held: its index in `registered` and its segment.
    fn held(&self, r: &Registration) -> Option<(usize, &Segment)> {
        let index = usize::try_from(r.0.checked_sub(MR_FIRST_SEGMENT)?).ok()?;
        match self.registered.get(index)? {
            Registered::Held(seg) => Some((index, seg)),
            Registered::Free | Registered::Closing(_) | Registered::Leaked => None,
        }
    }

    /// Where `bytes` lies in registration `r`'s memory (its segment's word area, then its
    /// byte area): the offset of its first byte from the registration's first, for
    /// [`Endpoint::write_from_registration`]; `None` where `bytes` is not all inside it
    /// (another mapping's bytes, or `r` not held).
    pub fn registered_offset(&self, r: &Registration, bytes: SharedBytes<'_>) -> Option<usize> {
        let (_, seg) = self.held(r)?;
        let area = seg.whole_area();
        let start = (bytes.as_ptr() as usize).checked_sub(area.as_ptr() as usize)?;
        (start.checked_add(bytes.len())? <= area.len()).then_some(start)
    }

    /// The registered segment's byte area (peers write it at any time).
    pub fn segment(&self) -> SharedBytes<'_> {
        self.segment.byte_area()
    }

    /// The completion queue's file descriptor, if the provider gave one: readable when a
    /// completion may be there, once [`Endpoint::trywait`] said so.
    pub fn wait_fd(&self) -> Option<BorrowedFd<'_>> {
        // SAFETY: the descriptor belongs to the completion queue, which lives as long as
        // `self`, and the borrow cannot outlive `self`.
        self.wait_fd.map(|fd| unsafe { BorrowedFd::borrow_raw(fd) })
    }

    /// Whether sleeping on [`Endpoint::wait_fd`] now would be woken by the next completion
    /// (`fi_trywait`): `false` when completions are waiting to be read.
    pub fn trywait(&mut self) -> bool {
        // SAFETY: a valid handle.
        unsafe { ffi::amofi_trywait(self.raw.as_ptr()) == 0 }
    }

    fn peer(&self, rank: usize) -> Result<u64, OfiError> {
        self.peers
            .get(rank)
            .copied()
            .ok_or_else(|| local_error("addressing a peer", "no such peer"))
    }

    /// Sends `len` bytes that `fill` writes to peer `rank`: `Ok(false)` when the provider or
    /// the send buffers have no room now (nothing was sent; read completions and try again).
    pub fn send(
        &mut self,
        rank: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, OfiError> {
        self.send_as(rank, len, true, fill)
    }

    /// [`Endpoint::send`] from a send buffer whatever the size, never injected: the message
    /// counts in [`Endpoint::in_flight`] until its completion says it has left, and so have
    /// the messages sent to `rank` before it (messages to one peer leave in order).
    pub fn send_tracked(
        &mut self,
        rank: usize,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, OfiError> {
        self.send_as(rank, len, false, fill)
    }

    fn send_as(
        &mut self,
        rank: usize,
        len: usize,
        inject: bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<bool, OfiError> {
        let dest = self.peer(rank)?;
        if inject && len <= self.inject_size {
            self.scratch.resize(len, 0);
            fill(&mut self.scratch);
            // SAFETY: `scratch` holds `len` initialised bytes; fi_inject copies them before it
            // returns.
            let rc = unsafe {
                ffi::amofi_inject(self.raw.as_ptr(), self.scratch.as_ptr().cast(), len, dest)
            };
            return self.check(rc, "fi_inject");
        }
        if len > self.send.size {
            return Err(local_error("fi_send", "message larger than a send buffer"));
        }
        let Some(i) = self.send.take() else {
            return Ok(false);
        };
        fill(self.send.owned(i, len));
        self.send.state[i] = State::Lent;
        if let Some(d) = self.send_dest.get_mut(i) {
            *d = rank as u32;
        }
        // SAFETY: buffer `i` holds `len` bytes and stays untouched by Rust until its
        // completion (state `Lent`), and alive until the endpoint is closed.
        let rc = unsafe {
            ffi::amofi_send(
                self.raw.as_ptr(),
                self.send.at(i).cast(),
                len,
                MR_SEND,
                dest,
                CTX_SEND | i as u64,
            )
        };
        let sent = self.check(rc, "fi_send");
        if !matches!(sent, Ok(true)) {
            self.send.give_back(i);
        }
        sent
    }

    /// Gives receive buffer `slot` (free, or read after [`Event::Received`]) back to the
    /// provider.
    pub fn post_recv(&mut self, slot: usize) -> Result<(), OfiError> {
        assert!(self.recv.state[slot] != State::Lent, "posted twice");
        self.recv.state[slot] = State::Lent;
        // SAFETY: buffer `slot` is ours (checked) and becomes the provider's until its
        // completion; alive until the endpoint is closed.
        let rc = unsafe {
            ffi::amofi_recv(
                self.raw.as_ptr(),
                self.recv.at(slot).cast(),
                self.recv.size,
                MR_RECV,
                CTX_RECV | slot as u64,
            )
        };
        match self.check(rc, "fi_recv") {
            Ok(true) => Ok(()),
            Ok(false) => {
                self.recv.state[slot] = State::Ready;
                Err(self.error("fi_recv", FI_EAGAIN))
            }
            Err(e) => {
                self.recv.state[slot] = State::Ready;
                Err(e)
            }
        }
    }

    /// The first `len` bytes of receive buffer `slot` after its [`Event::Received`]; `None`
    /// for a buffer the provider holds, or past its end.
    pub fn received(&self, slot: usize, len: usize) -> Option<&[u8]> {
        if self.recv.state.get(slot) != Some(&State::Ready) || len > self.recv.size {
            return None;
        }
        // SAFETY: in bounds (checked), completed and not posted again (state `Ready`), so the
        // provider no longer writes it; posting it again needs `&mut self`, which this
        // borrow excludes.
        Some(unsafe { std::slice::from_raw_parts(self.recv.at(slot), len) })
    }

    fn pool(&mut self, amo: bool) -> &mut Buffers {
        if amo {
            &mut self.amo
        } else {
            &mut self.stage
        }
    }

    fn stage_op(
        &mut self,
        amo: bool,
        call: &'static str,
        fill: impl FnOnce(&mut [u8]),
        issue: impl FnOnce(*mut u8, u64) -> isize,
    ) -> Result<Option<Op>, OfiError> {
        let pool = self.pool(amo);
        let Some(i) = pool.take() else {
            return Ok(None);
        };
        let size = pool.size;
        fill(pool.owned(i, size));
        pool.state[i] = State::Lent;
        let (ctx, op) = if amo {
            (CTX_AMO | i as u64, Op(i as u32 | OP_AMO))
        } else {
            (CTX_STAGE | i as u64, Op(i as u32))
        };
        let rc = issue(pool.at(i), ctx);
        match self.check(rc, call) {
            Ok(true) => Ok(Some(op)),
            Ok(false) => {
                self.pool(amo).give_back(i);
                Ok(None)
            }
            Err(e) => {
                self.pool(amo).give_back(i);
                Err(e)
            }
        }
    }

    /// Writes `len` bytes that `fill` puts into a staging buffer to `raddr` (under `key`) at
    /// peer `rank`; with `delivery`, the completion means the bytes are in the target's
    /// memory (`FI_DELIVERY_COMPLETE`). `Ok(None)`: no room now.
    pub fn write(
        &mut self,
        rank: usize,
        raddr: u64,
        key: u64,
        len: usize,
        delivery: bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Option<Op>, OfiError> {
        self.rma(true, rank, raddr, key, len, delivery, fill)
    }

    /// Reads `len` bytes at `raddr` (under `key`) of peer `rank` into a staging buffer,
    /// readable with [`Endpoint::staged`] after its [`Event::Done`]. `Ok(None)`: no room now.
    pub fn read(
        &mut self,
        rank: usize,
        raddr: u64,
        key: u64,
        len: usize,
    ) -> Result<Option<Op>, OfiError> {
        self.rma(false, rank, raddr, key, len, false, |_| {})
    }

    /// Writes `len` bytes at `local` of this endpoint's own segment to `raddr` (under `key`)
    /// at peer `rank`, straight from the segment, which is registered: no copy into a
    /// staging buffer. The operation still takes a staging buffer, untouched, for its
    /// context and its place among the operations in flight; with `delivery`, as
    /// [`Endpoint::write`]. `Ok(None)`: no room now. There is no read into the segment the
    /// same way: a read an error left with the provider would land in the segment after
    /// its operation returned, over bytes its caller had moved on to, where a read's
    /// staging buffer takes such a late landing harmlessly.
    pub fn write_from_segment(
        &mut self,
        rank: usize,
        local: usize,
        len: usize,
        raddr: u64,
        key: u64,
        delivery: bool,
    ) -> Result<Option<Op>, OfiError> {
        let area = self.segment.byte_area();
        if local.checked_add(len).is_none_or(|end| end > area.len()) {
            return Err(local_error("fi_writemsg", "a range outside the segment"));
        }
        let at = Local::Segment(area.as_ptr().wrapping_add(local));
        self.rma_from(at, true, rank, raddr, key, len, delivery, |_| {})
    }

    /// Writes `len` bytes at `local` of registration `r`'s memory (counted from its first
    /// byte: [`Endpoint::registered_offset`]) to `raddr` (under `key`) at peer `rank`,
    /// straight from that memory, with the registration's descriptor, as
    /// [`Endpoint::write_from_segment`] does from this endpoint's segment: no copy into a
    /// staging buffer, whose untouched buffer the operation still takes. The registration is
    /// not closed while the write is in flight ([`Endpoint::deregister`] waits for it).
    /// `Ok(None)`: no room now.
    #[allow(clippy::too_many_arguments)]
    pub fn write_from_registration(
        &mut self,
        r: &Registration,
        local: usize,
        len: usize,
        rank: usize,
        raddr: u64,
        key: u64,
        delivery: bool,
    ) -> Result<Option<Op>, OfiError> {
        let (index, at) = {
            let (index, seg) = self
                .held(r)
                .ok_or_else(|| local_error("fi_writemsg", "a registration no longer held"))?;
            let area = seg.whole_area();
            if local.checked_add(len).is_none_or(|end| end > area.len()) {
                return Err(local_error(
                    "fi_writemsg",
                    "a range outside the registration",
                ));
            }
            (index, area.as_ptr().wrapping_add(local))
        };
        let from = Local::Registered(at, r.0);
        let op = self.rma_from(from, true, rank, raddr, key, len, delivery, |_| {})?;
        if let Some(op) = op {
            self.reading[op.index()] = Some(index);
        }
        Ok(op)
    }

    /// [`Endpoint::write`] (`write`, from what `fill` puts into the buffer) or
    /// [`Endpoint::read`] through one staging buffer.
    #[allow(clippy::too_many_arguments)]
    fn rma(
        &mut self,
        write: bool,
        rank: usize,
        raddr: u64,
        key: u64,
        len: usize,
        delivery: bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Option<Op>, OfiError> {
        self.rma_from(Local::Staged, write, rank, raddr, key, len, delivery, fill)
    }

    /// One RMA operation of `len` bytes with peer `rank`'s `raddr` (under `key`), its local
    /// side `local`; it takes a staging buffer either way (its context, and its place among
    /// the operations in flight), which `fill` fills.
    #[allow(clippy::too_many_arguments)]
    fn rma_from(
        &mut self,
        local: Local,
        write: bool,
        rank: usize,
        raddr: u64,
        key: u64,
        len: usize,
        delivery: bool,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Option<Op>, OfiError> {
        let (call, msg_call) = if write {
            ("fi_write", "fi_writemsg")
        } else {
            ("fi_read", "fi_readmsg")
        };
        let dest = self.peer(rank)?;
        let largest = match local {
            Local::Staged => self.max_transfer(),
            Local::Segment(_) | Local::Registered(..) => self.max_segment_transfer(),
        };
        if len > largest {
            return Err(local_error(
                call,
                "a transfer larger than one operation carries",
            ));
        }
        let raw = self.raw.as_ptr();
        self.stage_op(
            false,
            msg_call,
            |b| {
                // A segment's transfer may be longer than the buffer, which it leaves alone.
                if let Local::Staged = local {
                    fill(&mut b[..len]);
                }
            },
            |buf, ctx| {
                let (at, slot) = match local {
                    Local::Staged => (buf, MR_STAGE),
                    Local::Segment(at) => (at, MR_SEGMENT),
                    Local::Registered(at, slot) => (at, slot),
                };
                // SAFETY: `at..at + len` is either the staging buffer `buf` (at least `len`
                // bytes, checked against `max_transfer`), lent to the provider until its
                // completion (state `Lent`); or a range inside the segment's byte area
                // (checked by `write_from_segment`, the only maker of `Local::Segment`),
                // registered as slot MR_SEGMENT with local read access, which lives as long
                // as the endpoint and so past every completion (the endpoint's close, or a
                // leak where closing fails, comes first); or a range inside a held
                // registration's memory (checked by `write_from_registration`, the only
                // maker of `Local::Registered`), registered in `slot` with local read
                // access, whose handle of the segment keeps it mapped: the caller marks the
                // buffer as reading it (`reading`), and neither `deregister` nor a deferred
                // close ends the registration or drops the handle before the completion
                // clears that mark (the endpoint's close, or a leak, comes before any drop).
                // The provider only reads it (a write's source), as a NIC would: no Rust
                // reference is made to the segment, whose every other access is an atomic
                // or a copy by raw pointer (`SharedBytes`).
                unsafe {
                    ffi::amofi_rma(
                        raw,
                        write as i32,
                        at.cast(),
                        len,
                        slot,
                        dest,
                        raddr,
                        key,
                        ctx,
                        delivery as i32,
                    )
                }
            },
        )
    }

    /// Whether the provider applies atomic `code` (amnet's numbering: load, store, swap,
    /// compare-swap, fetch-add, and, or, xor, min, max, multiply) on words of `width` bytes
    /// read as `ty` (0 unsigned, 1 signed, 2 float), fetching the old value (compare-swap:
    /// comparing too), or without fetching when `!fetch`.
    pub fn atomic_valid(&mut self, code: u8, width: usize, ty: u8, fetch: bool) -> bool {
        let kind = match (code, fetch) {
            (3, _) => 2,
            (_, true) => 1,
            (_, false) => 0,
        };
        // SAFETY: a valid handle; the shim checks the arguments.
        unsafe {
            ffi::amofi_atomic_valid(
                self.raw.as_ptr(),
                code as i32,
                width as i32,
                i32::from(ty),
                kind,
            ) == 1
        }
    }

    /// Applies atomic `code` with `operand` (and `compare` for a compare-and-swap) to the
    /// word of `width` bytes read as `ty` (as [`Endpoint::atomic_valid`]) at `raddr` (under
    /// `key`) of peer `rank`; with `fetch`, its old value is [`Endpoint::atomic_result`]
    /// after the [`Event::Done`]. Operands are bits, in the low bits of a `u64`. `Ok(None)`:
    /// no room.
    #[allow(clippy::too_many_arguments)]
    pub fn atomic(
        &mut self,
        rank: usize,
        raddr: u64,
        key: u64,
        code: u8,
        width: usize,
        ty: u8,
        operand: u64,
        compare: u64,
        fetch: bool,
    ) -> Result<Option<Op>, OfiError> {
        let dest = self.peer(rank)?;
        let raw = self.raw.as_ptr();
        let word = |v: u64| -> [u8; 8] {
            if width == 4 {
                let mut b = [0u8; 8];
                b[..4].copy_from_slice(&(v as u32).to_ne_bytes());
                b
            } else {
                v.to_ne_bytes()
            }
        };
        let is_cas = code == 3;
        self.stage_op(
            true,
            "fi_atomic",
            |b| {
                b[0..8].copy_from_slice(&word(operand));
                b[8..16].copy_from_slice(&word(compare));
                b[16..24].fill(0);
            },
            |buf, ctx| {
                let operand = buf.cast::<c_void>();
                let compare = buf.wrapping_add(8).cast::<c_void>();
                let result = buf.wrapping_add(16).cast::<c_void>();
                // SAFETY: `buf` is a lent atomics buffer of 64 bytes: operand,
                // compare and result words at 0, 8 and 16, untouched by Rust until the
                // completion.
                unsafe {
                    ffi::amofi_atomic(
                        raw,
                        code as i32,
                        width as i32,
                        i32::from(ty),
                        operand,
                        if is_cas { compare } else { std::ptr::null() },
                        if fetch || is_cas {
                            result
                        } else {
                            std::ptr::null_mut()
                        },
                        MR_AMO,
                        dest,
                        raddr,
                        key,
                        ctx,
                    )
                }
            },
        )
    }

    /// The first `len` bytes of `op`'s staging buffer after its [`Event::Done`] (a read's
    /// data); `None` while the provider holds it.
    pub fn staged(&self, op: Op, len: usize) -> Option<&[u8]> {
        let i = op.index();
        let pool = if op.is_amo() { &self.amo } else { &self.stage };
        if pool.state.get(i) != Some(&State::Ready) || len > pool.size {
            return None;
        }
        // SAFETY: in bounds (checked); completed (state `Ready`), so the provider no longer
        // writes it; releasing it needs `&mut self`, which this borrow excludes.
        Some(unsafe { std::slice::from_raw_parts(pool.at(i), len) })
    }

    /// A fetching atomic's old value after its [`Event::Done`].
    pub fn atomic_result(&self, op: Op, width: usize) -> Option<u64> {
        let b = self.staged(op, 24)?;
        Some(if width == 4 {
            u64::from(u32::from_ne_bytes(b[16..20].try_into().ok()?))
        } else {
            u64::from_ne_bytes(b[16..24].try_into().ok()?)
        })
    }

    /// Frees `op`'s staging buffer after its [`Event::Done`] or failure.
    pub fn release(&mut self, op: Op) {
        let i = op.index();
        let pool = self.pool(op.is_amo());
        if pool.state.get(i) == Some(&State::Ready) {
            pool.give_back(i);
        }
    }

    /// Operations still lent to the provider: sends and RMA or atomic operations.
    pub fn in_flight(&self) -> usize {
        self.send.lent() + self.stage.lent() + self.amo.lent()
    }

    /// Reads the completion queue (which, for providers with manual progress, is also what
    /// moves data) and appends what it found to `out`; the number of events appended.
    /// Completed sends free their buffers without an event.
    pub fn poll(&mut self, out: &mut VecDeque<Event>) -> Result<usize, OfiError> {
        let before = out.len();
        let n = self.cqes.len();
        // SAFETY: `cqes` has room for `n` entries, which the shim fills at most.
        let got = unsafe { ffi::amofi_cq_read(self.raw.as_ptr(), self.cqes.as_mut_ptr(), n) };
        if got > 0 {
            for k in 0..got as usize {
                let e = self.cqes[k];
                self.complete(e.context, e.len as usize, out);
            }
        } else if got == -(FI_EAVAIL as isize) {
            let mut err = std::mem::MaybeUninit::<ffi::CqErr>::uninit();
            // SAFETY: the shim zeroes and fills the whole structure.
            let rc = unsafe { ffi::amofi_cq_readerr(self.raw.as_ptr(), err.as_mut_ptr()) };
            if rc == 1 {
                // SAFETY: filled by the shim (rc == 1).
                let err = unsafe { err.assume_init() };
                self.failed(err, out);
            }
        } else if got != -(FI_EAGAIN as isize) {
            return Err(self.error("fi_cq_read", (-got) as i32));
        }
        Ok(out.len() - before)
    }

    fn complete(&mut self, ctx: u64, len: usize, out: &mut VecDeque<Event>) {
        let i = (ctx & 0xffff_ffff) as usize;
        match ctx & !0xffff_ffff {
            CTX_RECV if self.recv.state.get(i) == Some(&State::Lent) => {
                self.recv.state[i] = State::Ready;
                out.push_back(Event::Received { slot: i, len });
            }
            CTX_SEND if self.send.state.get(i) == Some(&State::Lent) => self.send.give_back(i),
            CTX_STAGE if self.stage.state.get(i) == Some(&State::Lent) => {
                self.stage.state[i] = State::Ready;
                self.done_reading(i);
                out.push_back(Event::Done(Op(i as u32)));
            }
            CTX_AMO if self.amo.state.get(i) == Some(&State::Lent) => {
                self.amo.state[i] = State::Ready;
                out.push_back(Event::Done(Op(i as u32 | OP_AMO)));
            }
            _ => out.push_back(Event::Failed {
                what: Issued::Unknown(ctx),
                error: OfiError {
                    call: "fi_cq_read".into(),
                    code: 0,
                    text: format!("a completion for context {ctx:#x}, never issued"),
                    provider: Some(self.provider.clone()),
                },
            }),
        }
    }

    fn failed(&mut self, err: ffi::CqErr, out: &mut VecDeque<Event>) {
        let ctx = err.context;
        let i = (ctx & 0xffff_ffff) as usize;
        let provider_text = ffi::text(&err.text);
        let error = OfiError {
            call: "an operation's completion".into(),
            code: err.err,
            text: if provider_text.is_empty() {
                ffi::strerror(err.err)
            } else {
                format!("{} ({provider_text})", ffi::strerror(err.err))
            },
            provider: Some(self.provider.clone()),
        };
        let what = match ctx & !0xffff_ffff {
            CTX_RECV if self.recv.state.get(i) == Some(&State::Lent) => {
                self.recv.state[i] = State::Ready;
                Issued::Recv(i)
            }
            CTX_SEND if self.send.state.get(i) == Some(&State::Lent) => {
                self.send.give_back(i);
                Issued::Send(self.send_dest.get(i).map(|&r| r as usize))
            }
            CTX_STAGE if self.stage.state.get(i) == Some(&State::Lent) => {
                self.stage.state[i] = State::Ready;
                self.done_reading(i);
                Issued::Op(Op(i as u32))
            }
            CTX_AMO if self.amo.state.get(i) == Some(&State::Lent) => {
                self.amo.state[i] = State::Ready;
                Issued::Op(Op(i as u32 | OP_AMO))
            }
            // An inject has no context: its error completion carries none.
            0 => Issued::Send(None),
            _ => Issued::Unknown(ctx),
        };
        out.push_back(Event::Failed { what, error });
    }
}
