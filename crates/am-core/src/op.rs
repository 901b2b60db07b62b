//! Operations in flight: [`Op`], the one handle of every non-blocking operation, and the
//! definitions every driver derives its operations from.
//!
//! # One operation, three forms, three ways to complete
//! Every one-sided operation, call and barrier exists once, as a [`Start`] (below: [`Put`],
//! [`Get`], [`GetInto`], [`Atomic`], [`Call`], [`Barrier`]), and every driver ([`crate::Node`],
//! [`crate::SharedNode`], [`crate::AsyncNode`]) offers it under the same names:
//!
//! | form | what it does | returns |
//! |---|---|---|
//! | `x` | starts the operation and waits until it completes | its value |
//! | `x_nb` | starts it (local completion: buffers may be reused) | an [`Op`] |
//! | `x_nbi` | starts it inside the implicit set (puts and non-fetching atomics) | nothing: `wait_nbi` completes the whole set |
//! | `try_x` | sends now or not at all, never waiting (AM requests) | `WouldBlock` if it cannot |
//!
//! An [`Op`] completes in one of three ways, on every driver: a blocking caller waits for it
//! (`node.wait(op)`, `wait_all`, `wait_some`), a poller tests it (`node.test(&op)`,
//! `test_some`), and an async caller awaits it (`node.wait(op).await` on an
//! [`crate::AsyncNode`]). On the async driver `x` and `x_nb` are futures.
//!
//! Dropping an [`Op`] before it completes detaches the operation: it still completes (a put
//! still lands, a barrier is still entered and left), its result is dropped and its slot
//! freed, as GASNet-EX's and UCX's requests that nobody waits for. Nothing leaks.
//!
//! ```
//! use am_core::{Config, Handlers, Loopback, Node};
//! am_core::run_ranks(Loopback::cluster(2, Default::default()), |t| {
//!     let mut node = Node::new(t, Handlers::new(), Config::default()).unwrap();
//!     let peer = 1 - node.rank();
//!     let me = node.rank() as u8;
//!     // Eight puts in flight, then wait for all of them at once.
//!     let puts: Vec<_> = (0..8)
//!         .map(|i| node.put_nb(peer, i * 8, &[me; 8]).unwrap())
//!         .collect();
//!     node.wait_all(puts).unwrap();
//!     node.barrier().unwrap();
//!     let got = node.get_nb(node.rank(), 0, 64).unwrap();
//!     assert!(node.wait(got).unwrap().iter().all(|&b| b == 1 - me));
//!     node.barrier().unwrap();
//! });
//! ```

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Poll, Waker};

use crate::atomic::{AtomicOp, AtomicWord};
use crate::call::{Calls, Reply};
use crate::endpoint::Endpoint;
use crate::error::AmError;
use crate::handler::Threading;
use crate::transport::Transport;
use crate::types::{HandlerId, Rank};

/// A non-blocking operation in flight, that completes with a `T`: `()` for a put or a
/// barrier, the bytes of a get, the buffer of a get into one of the caller's, the old value
/// of an atomic, the answer of a call (see the [module docs](self)).
///
/// It is only a name for the operation: the node it came from completes it (`wait`, `test`,
/// `wait_some`, an async `wait`). Dropping it first detaches the operation, which then
/// completes unobserved and frees its slot.
#[must_use = "an operation's completion is known only once waited for or tested; dropping it detaches the operation"]
pub struct Op<T: Outcome> {
    pub(crate) state: State,
    pub(crate) held: Option<T::Held>,
}

/// What `wait_some` and `test_some` complete: the positions in the set of the operations
/// taken out, each with its outcome, in order.
pub type Completed<U> = Vec<(usize, Result<U, AmError>)>;

/// The outcomes of a batch waited for in order (`wait_all`): all of them, or the first error
/// once every one has completed.
pub(crate) struct AllOf<U> {
    out: Vec<U>,
    first: Option<AmError>,
}

impl<U> FromIterator<Result<U, AmError>> for AllOf<U> {
    fn from_iter<I: IntoIterator<Item = Result<U, AmError>>>(outcomes: I) -> AllOf<U> {
        let mut all = AllOf::new();
        for outcome in outcomes {
            all.push(outcome);
        }
        all
    }
}

impl<U> AllOf<U> {
    pub(crate) fn new() -> AllOf<U> {
        AllOf {
            out: Vec::new(),
            first: None,
        }
    }

    pub(crate) fn push(&mut self, outcome: Result<U, AmError>) {
        match outcome {
            Ok(v) => self.out.push(v),
            Err(e) => {
                self.first.get_or_insert(e);
            }
        }
    }

    pub(crate) fn finish(self) -> Result<Vec<U>, AmError> {
        match self.first {
            Some(e) => Err(e),
            None => Ok(self.out),
        }
    }
}

/// What an [`Op`] names.
pub(crate) enum State {
    /// Complete when it was started, with its outcome.
    Ready(Result<Raw, AmError>),
    /// In the endpoint's operation table (`table`: the endpoint's, which a dropped handle
    /// leaves its slot to).
    Slot {
        index: u32,
        gen: u32,
        table: Arc<Orphans>,
    },
    /// A call, by its number among the calls in flight.
    Call {
        number: u32,
        dest: Rank,
        calls: Arc<Calls>,
    },
    /// A barrier, by its epoch.
    Barrier { epoch: u64 },
    /// Completed, its outcome taken.
    Spent,
}

impl<T: Outcome> Op<T> {
    pub(crate) fn new(state: State) -> Op<T> {
        Op { state, held: None }
    }

    /// An operation complete when started, with `raw` as its outcome.
    pub(crate) fn ready(raw: Raw) -> Op<T> {
        Op::new(State::Ready(Ok(raw)))
    }

    /// Whether the operation was complete when it was started (a put or atomic the NIC did
    /// itself, or one on this rank): completing it then needs no progress.
    pub fn is_ready(&self) -> bool {
        matches!(self.state, State::Ready(_))
    }

    /// Takes what names the operation out, so that dropping the handle afterwards detaches
    /// nothing.
    pub(crate) fn take_state(&mut self) -> State {
        std::mem::replace(&mut self.state, State::Spent)
    }

    /// Completes with the operation's raw outcome.
    pub(crate) fn finish(&mut self, raw: Result<Raw, AmError>) -> Result<T, AmError> {
        self.state = State::Spent;
        let raw = raw?;
        T::finish(self.held.take(), raw)
    }

    /// The same operation, completing into `dst` (a get into a caller's buffer).
    pub(crate) fn filling(mut self, dst: &mut [u8]) -> Op<&mut [u8]>
    where
        T: Outcome<Held = ()>,
    {
        Op {
            state: self.take_state(),
            held: Some(dst),
        }
    }

    /// A call's completion step, from its table of calls alone (no node needed: a peer lost
    /// or gone fails the calls to it there): `None` for any other operation.
    pub(crate) fn poll_call(&mut self, waker: &Waker) -> Option<Poll<Result<T, AmError>>> {
        let State::Call { number, calls, .. } = &self.state else {
            return None;
        };
        match calls.poll(*number, Some(waker)) {
            Poll::Ready(r) => {
                self.take_state();
                Some(Poll::Ready(self.finish(r.map(Raw::Reply))))
            }
            Poll::Pending => Some(Poll::Pending),
        }
    }

    pub(crate) fn is_barrier(&self) -> bool {
        matches!(self.state, State::Barrier { .. })
    }
}

impl<T: Outcome> Drop for Op<T> {
    fn drop(&mut self) {
        match &self.state {
            State::Slot { index, gen, table } => table.push(*index, *gen),
            State::Call { number, calls, .. } => calls.close(*number),
            // A barrier goes on without its handle: the node's polls and waits carry it on.
            State::Ready(_) | State::Barrier { .. } | State::Spent => {}
        }
    }
}

impl<T: Outcome> std::fmt::Debug for Op<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Ready(_) => "ready",
            State::Slot { .. } => "in flight",
            State::Call { .. } => "call in flight",
            State::Barrier { .. } => "barrier in flight",
            State::Spent => "spent",
        };
        f.debug_struct("Op").field("state", &state).finish()
    }
}

/// The slots of handles dropped before their operation completed, for the endpoint to
/// detach at its next look (a handle cannot reach the endpoint itself).
#[derive(Debug, Default)]
pub(crate) struct Orphans {
    any: AtomicBool,
    list: Mutex<Vec<(u32, u32)>>,
}

impl Orphans {
    fn push(&self, index: u32, gen: u32) {
        let mut list = self.list.lock().unwrap_or_else(|p| p.into_inner());
        list.push((index, gen));
        self.any.store(true, Ordering::Release);
    }

    /// The slots left since the last call.
    pub(crate) fn take(&self) -> Vec<(u32, u32)> {
        if !self.any.swap(false, Ordering::Acquire) {
            return Vec::new();
        }
        std::mem::take(&mut *self.list.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// An operation's outcome before it is given its type.
#[derive(Debug)]
pub enum Raw {
    /// Nothing (a put, a barrier, a get already in the caller's buffer).
    Unit,
    /// Bytes read (a get).
    Bytes(Vec<u8>),
    /// A word's old value (an atomic).
    Word(u64),
    /// A call's answer.
    Reply(Reply),
}

mod sealed {
    pub trait Sealed {}
}

/// The values an [`Op`] completes with: `()`, `Vec<u8>`, `&mut [u8]`, `u32`, `u64` and
/// [`Reply`]. Sealed: the operations of [`crate::op`] are the only ones.
pub trait Outcome: sealed::Sealed + Sized {
    /// What the handle holds for the outcome until it completes (a get's buffer).
    #[doc(hidden)]
    type Held;
    /// The outcome, from the raw one.
    #[doc(hidden)]
    fn finish(held: Option<Self::Held>, raw: Raw) -> Result<Self, AmError>;
}

impl sealed::Sealed for () {}
impl Outcome for () {
    type Held = ();
    fn finish(_: Option<()>, _: Raw) -> Result<(), AmError> {
        Ok(())
    }
}

impl sealed::Sealed for Vec<u8> {}
impl Outcome for Vec<u8> {
    type Held = ();
    fn finish(_: Option<()>, raw: Raw) -> Result<Vec<u8>, AmError> {
        match raw {
            Raw::Bytes(b) => Ok(b),
            _ => Err(AmError::StaleHandle),
        }
    }
}

impl sealed::Sealed for &mut [u8] {}
impl<'b> Outcome for &'b mut [u8] {
    type Held = &'b mut [u8];
    fn finish(held: Option<&'b mut [u8]>, raw: Raw) -> Result<&'b mut [u8], AmError> {
        let dst = held.ok_or(AmError::StaleHandle)?;
        match raw {
            // Read into `dst` when it was started.
            Raw::Unit => Ok(dst),
            Raw::Bytes(b) if b.len() == dst.len() => {
                dst.copy_from_slice(&b);
                Ok(dst)
            }
            _ => Err(AmError::StaleHandle),
        }
    }
}

macro_rules! word_outcome {
    ($($w:ty),*) => {$(
        impl sealed::Sealed for $w {}
        impl Outcome for $w {
            type Held = ();
            fn finish(_: Option<()>, raw: Raw) -> Result<$w, AmError> {
                match raw {
                    Raw::Word(old) => Ok(<$w as AtomicWord>::narrow(old)),
                    _ => Err(AmError::StaleHandle),
                }
            }
        }
    )*};
}
word_outcome!(u32, u64);

impl sealed::Sealed for Reply {}
impl Outcome for Reply {
    type Held = ();
    fn finish(_: Option<()>, raw: Raw) -> Result<Reply, AmError> {
        match raw {
            Raw::Reply(r) => Ok(r),
            _ => Err(AmError::StaleHandle),
        }
    }
}

/// An operation's definition: how it starts on an [`Endpoint`], and how it is sent until it
/// is locally complete. Every driver's `x` and `x_nb` are these two steps, taken until ready
/// with progress in between, then (for `x`) the wait for its [`Op`]; a driver of one's own
/// does the same (see [`crate::endpoint`]).
///
/// Both steps are re-entrant: `Pending` means nothing was lost, make progress and call again.
pub trait Start {
    /// What the operation completes with.
    type Output: Outcome;

    /// Starts the operation: `Pending` while it cannot start yet (posted atomics or the
    /// device wait), an error if it never can (nothing was done then).
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Self::Output>, AmError>>;

    /// Sends what the operation still has to send (chunks waiting for credits): ready once
    /// it is locally complete. After an error nothing more is sent; the handle, dropped,
    /// lets what was sent complete.
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<Self::Output>,
    ) -> Poll<Result<(), AmError>> {
        let _ = (ep, t, op);
        Poll::Ready(Ok(()))
    }
}

/// A put: `data` into `dest`'s segment at `offset`. Where the transport reaches the target's
/// memory ([`Transport::put`]) it is one copy into it, complete when started, whether or not
/// the target polls; elsewhere it goes as AM Longs that the target's progress acknowledges. A
/// put to this rank is a copy into its own segment. A range outside the segment is an error
/// when it starts, and nothing is written.
///
/// Puts are not ordered with this rank's AMs or with each other; a later request to the
/// target, a barrier or a quiesce after the completion publishes them.
#[derive(Debug, Clone, Copy)]
pub struct Put<'a> {
    /// The target.
    pub dest: Rank,
    /// Where in its segment.
    pub offset: usize,
    /// The bytes.
    pub data: &'a [u8],
}

impl Start for Put<'_> {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.put_start(t, self.dest, self.offset, self.data)
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<()>,
    ) -> Poll<Result<(), AmError>> {
        ep.put_step(t, op, self.data)
    }
}

/// A get: `len` bytes at `offset` of `src`'s segment, into a new `Vec`. Where the transport
/// reaches the target's memory ([`Transport::get`]) or `src` is this rank, the bytes are read
/// when it starts, with no help from `src`; elsewhere `src`'s progress answers system messages
/// for them. A range outside the segment is an error when it starts.
#[derive(Debug, Clone, Copy)]
pub struct Get {
    /// The rank read from.
    pub src: Rank,
    /// Where in its segment.
    pub offset: usize,
    /// How many bytes.
    pub len: usize,
}

impl Start for Get {
    type Output = Vec<u8>;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<Vec<u8>>, AmError>> {
        ep.get_start(t, self.src, self.offset, self.len)
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<Vec<u8>>,
    ) -> Poll<Result<(), AmError>> {
        ep.get_step(t, op)
    }
}

/// A get into a buffer of the caller's (OpenSHMEM's `shmem_getmem_nbi`): `dst.len()` bytes at
/// `offset` of `src`'s segment. The handle holds `dst` until it completes, and gives it back
/// filled. Where the transport reaches the target's memory the bytes are in `dst` when it
/// starts; elsewhere they are copied there on completion. A range outside the segment is an
/// error when it starts, and `dst` is left as it was.
#[derive(Debug)]
pub struct GetInto<'b> {
    /// The rank read from.
    pub src: Rank,
    /// Where in its segment.
    pub offset: usize,
    /// The buffer, until the handle takes it.
    pub dst: Option<&'b mut [u8]>,
}

impl<'b> Start for GetInto<'b> {
    type Output = &'b mut [u8];
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<&'b mut [u8]>, AmError>> {
        let Some(dst) = self.dst.as_deref_mut() else {
            return Poll::Ready(Err(AmError::StaleHandle));
        };
        let op = ready!(ep.get_into_start(t, self.src, self.offset, dst))?;
        let dst = self.dst.take().ok_or(AmError::StaleHandle)?;
        Poll::Ready(Ok(op.filling(dst)))
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<&'b mut [u8]>,
    ) -> Poll<Result<(), AmError>> {
        ep.get_step(t, op)
    }
}

/// A remote atomic on the aligned `u32` or `u64` word at `offset` of `dest`'s segment
/// ([`AtomicOp`]; see [`crate::atomic`] for the ordering), completing with the word's old
/// value. Where the transport reaches the target's memory (the shared-memory NICs and
/// [`crate::Loopback`]) it is one atomic instruction on the target's word, done when it
/// starts, whether or not the target polls; elsewhere it travels as a system message that the
/// target's progress applies. A word outside the segment or misaligned is an error when it
/// starts, and nothing is done.
#[derive(Debug, Clone, Copy)]
pub struct Atomic<W: AtomicWord> {
    /// The target.
    pub dest: Rank,
    /// The word's offset in its segment.
    pub offset: usize,
    /// What to do to it.
    pub op: AtomicOp<W>,
}

impl<W: AtomicWord + Outcome> Start for Atomic<W> {
    type Output = W;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<W>, AmError>> {
        ep.atomic_start(t, self.dest, self.offset, self.op)
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<W>,
    ) -> Poll<Result<(), AmError>> {
        ep.atomic_step(t, op)
    }
}

/// A call: `handler` on `dest` (registered with [`crate::Handlers::callable`]) with `args`
/// (at most 15) and `payload` (at most the largest AM Medium), completing with the arguments
/// and payload it answered with ([`Reply`]), with no reply handler of the caller's. It fails
/// as a request does, and with the peer's loss or departure if it goes before it answers.
/// Dropping its handle gives the call up: a late answer is dropped.
#[derive(Debug, Clone)]
pub struct Call<'a> {
    /// The rank called.
    pub dest: Rank,
    /// The callable handler.
    pub handler: HandlerId,
    /// The arguments.
    pub args: Cow<'a, [u32]>,
    /// The payload.
    pub payload: Cow<'a, [u8]>,
}

impl Call<'_> {
    /// The same call owning its arguments and payload (for a future that outlives them).
    pub fn into_owned(self) -> Call<'static> {
        Call {
            dest: self.dest,
            handler: self.handler,
            args: Cow::Owned(self.args.into_owned()),
            payload: Cow::Owned(self.payload.into_owned()),
        }
    }
}

impl Start for Call<'_> {
    type Output = Reply;
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        _t: &mut T,
    ) -> Poll<Result<Op<Reply>, AmError>> {
        Poll::Ready(ep.call_start(self.dest, self.handler, &self.args, self.payload.len()))
    }
    fn send<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
        op: &mut Op<Reply>,
    ) -> Poll<Result<(), AmError>> {
        ep.call_step(t, op, self.handler, &self.args, &self.payload)
    }
}

/// A barrier: complete once every rank has entered it (a dissemination barrier over AMs:
/// ⌈log2 N⌉ rounds of one request each). It starts once this rank's posted atomics are
/// applied, so every rank leaving it sees them. A barrier whose wait returned an error is
/// resumed by the next barrier, which sends nothing twice (the other ranks are still in it);
/// after an error that lasts (a lost peer, an aborted job) the retry fails the same way.
#[derive(Debug, Clone, Copy, Default)]
pub struct Barrier;

impl Start for Barrier {
    type Output = ();
    fn start<H: Threading, T: Transport + ?Sized>(
        &mut self,
        ep: &mut Endpoint<H>,
        t: &mut T,
    ) -> Poll<Result<Op<()>, AmError>> {
        ep.barrier_start(t)
    }
}

/// The one list of the operations every driver offers: each entry is handed to the driver's
/// macro, which writes that driver's methods for it. `op`: an operation with a handle
/// (`name`, `nb` its non-blocking form, the [`Start`] that defines it, and whether an async
/// future `owns` its arguments or `borrows` them); `implicit`: a put started with `nb`, then
/// left to the implicit set; `post`: a step that posts; `request`: an AM request with its
/// `try_` form; `wait`: a wait for a condition of the endpoint's.
macro_rules! operations {
    ($driver:ident) => {
        $driver! { op
            /// Writes `data` into `dest`'s segment at `offset` ([`op::Put`](crate::op::Put):
            /// one copy where the NIC reaches the target's memory, AM Longs elsewhere).
            put [] (dest: $crate::Rank, offset: usize, data: &[u8]) -> ()
                = $crate::op::Put { dest, offset, data }; nb put_nb; borrows;
        }
        $driver! { op
            /// Reads `len` bytes at `offset` of `src`'s segment into a new `Vec`
            /// ([`op::Get`](crate::op::Get)).
            get [] (src: $crate::Rank, offset: usize, len: usize) -> Vec<u8>
                = $crate::op::Get { src, offset, len }; nb get_nb; owns;
        }
        $driver! { op
            /// Reads `dst.len()` bytes at `offset` of `src`'s segment into `dst`, and
            /// gives `dst` back filled ([`op::GetInto`](crate::op::GetInto)).
            get_into ['b] (src: $crate::Rank, offset: usize, dst: &'b mut [u8]) -> &'b mut [u8]
                = $crate::op::GetInto { src, offset, dst: Some(dst) }; nb get_into_nb; borrows;
        }
        $driver! { op
            /// Applies `op` to the word at `offset` of `dest`'s segment and completes with
            /// its old value ([`op::Atomic`](crate::op::Atomic)):
            /// `atomic(1, 64, AtomicOp::FetchAdd(1u64))`.
            atomic [W: $crate::atomic::AtomicWord + $crate::op::Outcome + 'static]
                (dest: $crate::Rank, offset: usize, op: $crate::atomic::AtomicOp<W>) -> W
                = $crate::op::Atomic { dest, offset, op }; nb atomic_nb; owns;
        }
        $driver! { op
            /// Calls `handler` on `dest` with `args` and `payload` and completes with its
            /// answer ([`op::Call`](crate::op::Call)).
            call [] (dest: $crate::Rank, handler: $crate::HandlerId, args: &[u32], payload: &[u8]) -> $crate::Reply
                = $crate::op::Call {
                    dest,
                    handler,
                    args: std::borrow::Cow::Borrowed(args),
                    payload: std::borrow::Cow::Borrowed(payload),
                }; nb call_nb; owns;
        }
        $driver! { op
            /// Enters a barrier and completes once every rank has entered it as often as
            /// this one ([`op::Barrier`](crate::op::Barrier)). Collective: one thread of
            /// each rank calls it.
            barrier [] () -> () = $crate::op::Barrier; nb barrier_nb; owns;
        }
        $driver! { implicit
            /// Starts a put inside the implicit set ([`op::Put`](crate::op::Put)):
            /// `wait_nbi` completes it with the others.
            put_nbi = put_nb (dest: $crate::Rank, offset: usize, data: &[u8]);
        }
        $driver! { post
            /// Posts a non-fetching remote atomic inside the implicit set (OpenSHMEM's
            /// `shmem_atomic_xor` and kin; [`op::Atomic`](crate::op::Atomic) for the
            /// rest): it takes effect by the next `wait_nbi`, `quiesce` or `barrier` at the
            /// latest (every rank leaving the barrier sees it), and before any later
            /// request, put, get or atomic of this rank to the same target, in the order
            /// posted. Where the transport applies atomics itself, posted ones go to it in
            /// batches of 64 ([`Transport::atomics`](crate::Transport::atomics)) whose words
            /// it fetches first, so that a stream of them to random words keeps several
            /// memory misses in flight; elsewhere they go out as messages nobody waits for,
            /// one per target for the (up to 64) atomics queued for it. Errors (a lost
            /// target) may come from the call that applies them.
            atomic_nbi [W: $crate::atomic::AtomicWord]
                (dest: $crate::Rank, offset: usize, op: $crate::atomic::AtomicOp<W>)
                = |ep, t| ep.atomic_nbi(t, dest, offset, op);
        }
        $driver! { request
            /// Sends an AM Short request.
            request_short, try_request_short (dest: $crate::Rank, handler: $crate::HandlerId, args: &[u32])
                = (dest, $crate::AmKind::Short, handler, args, &[], None);
        }
        $driver! { request
            /// Sends an AM Medium request (payload up to the transport's `max_medium`).
            request_medium, try_request_medium
                (dest: $crate::Rank, handler: $crate::HandlerId, args: &[u32], payload: &[u8])
                = (dest, $crate::AmKind::Medium, handler, args, payload, None);
        }
        $driver! { request
            /// Sends an AM Long request: `payload` lands at `offset` in `dest`'s segment,
            /// then the handler runs there.
            request_long, try_request_long
                (dest: $crate::Rank, handler: $crate::HandlerId, args: &[u32], payload: &[u8], offset: usize)
                = (dest, $crate::AmKind::Long, handler, args, payload, Some(offset));
        }
        $driver! { wait
            /// Waits until every request this rank sent has been answered, every refused
            /// reply has gone out and every one-sided operation is remotely complete: the
            /// fence of one-sided operations (OpenSHMEM's `shmem_quiet`), and what to run
            /// before dropping a node so that peers are not left without their replies.
            quiesce = |ep, t| ep.quiesce_step(t);
        }
        $driver! { wait
            /// Waits until the implicit set is complete: every `x_nbi` operation and
            /// posted atomic of this rank (GASNet-EX's `gex_NBI_Wait`), without waiting
            /// for AM replies as `quiesce` does. Fails with the first error of the set.
            wait_nbi = |ep, t| ep.nbi_step(t);
        }
    };
}
pub(crate) use operations;

/// A [`Start`] that a future may own whole: the async driver's `x` and `x_nb` of an operation
/// that `owns` its arguments take them by copy, so that the future is `'static` (it can be
/// boxed, stored and spawned).
pub(crate) trait Owned: Start {
    type Owned: Start<Output = Self::Output> + 'static;
    fn owned(self) -> Self::Owned;
}

impl Owned for Get {
    type Owned = Get;
    fn owned(self) -> Get {
        self
    }
}

impl<W: AtomicWord + Outcome + 'static> Owned for Atomic<W> {
    type Owned = Atomic<W>;
    fn owned(self) -> Atomic<W> {
        self
    }
}

impl Owned for Barrier {
    type Owned = Barrier;
    fn owned(self) -> Barrier {
        self
    }
}

impl Owned for Call<'_> {
    type Owned = Call<'static>;
    fn owned(self) -> Call<'static> {
        self.into_owned()
    }
}
