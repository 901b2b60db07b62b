//! Operations in flight: [`Op`], the one handle of every non-blocking operation.
//!
//! # One operation, three forms, three ways to complete
//! Every one-sided operation, call and barrier exists once, as a
//! [`Start`](crate::endpoint::start::Start) of the endpoint's
//! ([`endpoint::start`](crate::endpoint::start): `Put`, `Get`, `GetInto`, `Atomic`, `Call`,
//! `Barrier`), and every driver ([`crate::Node`], [`crate::SharedNode`],
//! [`crate::AsyncNode`]) offers it under the same names:
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
//! Only the node that started an operation completes it: another node (another rank's, or
//! another endpoint's of this process) refuses its handle with [`AmError::ForeignHandle`]
//! in every wait and test, rather than waiting for an operation that its own progress never
//! ends or taking one of its own for it. An operation complete when it was started
//! ([`Op::is_ready`]) is its outcome alone, which any node gives.
//!
//! Dropping an [`Op`] before it completes detaches the operation: it still completes (a put
//! still lands, a barrier is still entered and left), its result is dropped and its slot
//! freed, as GASNet-EX's and UCX's requests that nobody waits for. Nothing leaks.
//!
//! ```
//! use amnet::{Config, Handlers, Loopback, Node};
//!
//! fn main() {
//!     amnet::run_ranks(Loopback::cluster(2, Default::default()), |t| {
//!         let mut node = Node::new(t, Handlers::new(), Config::default()).unwrap();
//!         let peer = 1 - node.rank();
//!         let me = node.rank() as u8;
//!         // Eight puts in flight, then wait for all of them at once.
//!         let puts: Vec<_> = (0..8)
//!             .map(|i| node.put_nb(peer, i * 8, &[me; 8]).unwrap())
//!             .collect();
//!         node.wait_all(puts).unwrap();
//!         node.barrier().unwrap();
//!         let got = node.get_nb(node.rank(), 0, 64).unwrap();
//!         assert!(node.wait(got).unwrap().iter().all(|&b| b == 1 - me));
//!         node.barrier().unwrap();
//!     });
//! }
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Poll, Waker};

use crate::atomic::AtomicWord;
use crate::call::{Calls, Reply};
use crate::error::AmError;
use crate::reduce::Element;
use crate::team::Team;
use crate::types::Rank;

/// A non-blocking operation in flight, that completes with a `T`: `()` for a put or a
/// barrier, the bytes of a get, the buffer of a get into one of the caller's, the old value
/// of an atomic, the answer of a call (see the [module docs](self)).
///
/// It is only a name for the operation: the node it came from completes it (`wait`, `test`,
/// `wait_some`, an async `wait`). Another node refuses a handle in flight with
/// [`AmError::ForeignHandle`] (one complete when started holds its outcome, and any node
/// gives it). Dropping it first detaches the operation, which then completes unobserved and
/// frees its slot.
#[must_use = "an operation's completion is known only once waited for or tested; dropping it detaches the operation"]
pub struct Op<T: Outcome> {
    pub(crate) state: State,
    pub(crate) held: Option<T::Held>,
}

/// What `wait_some` and `test_some` complete: the positions in the set of the operations
/// taken out, each with its outcome, in order.
#[allow(type_alias_bounds)]
pub type Completed<U: Outcome> = Vec<(usize, Result<U::Value, AmError>)>;

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
    Ready(Raw),
    /// In the endpoint's operation table (`table`: the endpoint's, which a dropped handle
    /// leaves its slot to).
    Slot {
        index: u32,
        gen: u32,
        table: Arc<Orphans>,
    },
    /// A call, by its number among the calls in flight; `seen`, the table's count of ended
    /// calls when its waiter last found it unanswered.
    Call {
        number: u32,
        dest: Rank,
        calls: Arc<Calls>,
        seen: u64,
    },
    /// A barrier, by its epoch; `table` names its endpoint (as a slot's does).
    Barrier { epoch: u64, table: Arc<Orphans> },
    /// Completed, its outcome taken.
    Spent,
}

impl<T: Outcome> Op<T> {
    pub(crate) fn new(state: State) -> Op<T> {
        Op { state, held: None }
    }

    /// An operation complete when started, with `raw` as its outcome.
    pub(crate) fn ready(raw: Raw) -> Op<T> {
        Op::new(State::Ready(raw))
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
    pub(crate) fn finish(&mut self, raw: Result<Raw, AmError>) -> Result<T::Value, AmError> {
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

    /// A call's completion step, from its table of calls alone: `None` for any other
    /// operation. A waiter without a waker (a blocking driver's, which looks again after each
    /// poll) skips the table's lock while no call has ended since its last look; one with a
    /// waker always leaves it there. A peer lost or gone fails the calls to it in the table;
    /// one gone before the call was opened is the endpoint's to see ([`Endpoint::poll_op`]).
    ///
    /// [`Endpoint::poll_op`]: crate::endpoint::Endpoint::poll_op
    pub(crate) fn poll_call(
        &mut self,
        waker: Option<&Waker>,
    ) -> Option<Poll<Result<T::Value, AmError>>> {
        let State::Call {
            number,
            calls,
            seen,
            ..
        } = &mut self.state
        else {
            return None;
        };
        if waker.is_none() {
            let ended = calls.ended();
            if ended == *seen {
                return Some(Poll::Pending);
            }
            *seen = ended;
        }
        match calls.poll(*number, waker) {
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

    /// Whether this is a call whose table of calls is not `calls` (the node's: `None` if it
    /// has no callable handler): a call another node made.
    pub(crate) fn is_foreign_call(&self, calls: Option<&Arc<Calls>>) -> bool {
        match &self.state {
            State::Call { calls: of, .. } => !calls.is_some_and(|c| Arc::ptr_eq(of, c)),
            _ => false,
        }
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
        // A load first: the common case, nothing dropped, writes nothing.
        if !self.any.load(Ordering::Relaxed) || !self.any.swap(false, Ordering::Acquire) {
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
    /// A split's team (`None`: this rank gave no color).
    Team(Option<Team>),
}

mod sealed {
    pub trait Sealed {}
}

/// The values an [`Op`] completes with: `()`, `Vec<u8>` (and `Vec<E>` of a reduction's
/// [`Element`]s), `&mut [u8]`, `u32`, `u64`, [`Reply`] and `Option<Team>` (a split's). Sealed: the
/// operations of [`crate::op`] are the only ones.
pub trait Outcome: sealed::Sealed + Sized {
    /// What the handle holds for the outcome until it completes (a get's buffer).
    #[doc(hidden)]
    type Held;
    /// What waiting for the operation gives: the type itself, except for a typed call's
    /// [`Typed`](crate::typed::Typed) marker, whose value is the call's decoded answer.
    type Value;
    /// The outcome, from the raw one.
    #[doc(hidden)]
    fn finish(held: Option<Self::Held>, raw: Raw) -> Result<Self::Value, AmError>;
}

impl sealed::Sealed for () {}
impl Outcome for () {
    type Held = ();
    type Value = Self;
    fn finish(_: Option<()>, _: Raw) -> Result<(), AmError> {
        Ok(())
    }
}

// Bytes (`Vec<u8>`, a get's) and a reduction's elements: its bytes, little-endian.
impl<E: Element> sealed::Sealed for Vec<E> {}
impl<E: Element> Outcome for Vec<E> {
    type Held = ();
    type Value = Self;
    fn finish(_: Option<()>, raw: Raw) -> Result<Vec<E>, AmError> {
        match raw {
            Raw::Bytes(b) => Ok(E::from_bytes(b)),
            _ => Err(AmError::StaleHandle),
        }
    }
}

impl sealed::Sealed for &mut [u8] {}
impl<'b> Outcome for &'b mut [u8] {
    type Held = &'b mut [u8];
    type Value = Self;
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
            type Value = Self;
            fn finish(_: Option<()>, raw: Raw) -> Result<$w, AmError> {
                match raw {
                    Raw::Word(old) => Ok(<$w as AtomicWord>::narrow(old)),
                    _ => Err(AmError::StaleHandle),
                }
            }
        }
    )*};
}
word_outcome!(u32, u64, i32, i64, f32, f64);

impl sealed::Sealed for Reply {}
impl Outcome for Reply {
    type Held = ();
    type Value = Self;
    fn finish(_: Option<()>, raw: Raw) -> Result<Reply, AmError> {
        match raw {
            Raw::Reply(r) => Ok(r),
            _ => Err(AmError::StaleHandle),
        }
    }
}

impl sealed::Sealed for crate::symmetric::Symmetric {}
impl Outcome for crate::symmetric::Symmetric {
    type Held = ();
    type Value = Self;
    fn finish(_: Option<()>, raw: Raw) -> Result<crate::symmetric::Symmetric, AmError> {
        match raw {
            Raw::Bytes(b) => {
                crate::symmetric::Symmetric::from_bytes(&b).ok_or(AmError::StaleHandle)
            }
            _ => Err(AmError::StaleHandle),
        }
    }
}

// A publication's segments, every member's in team order.
impl sealed::Sealed for Vec<crate::segment::RemoteSegment> {}
impl Outcome for Vec<crate::segment::RemoteSegment> {
    type Held = ();
    type Value = Self;
    fn finish(_: Option<()>, raw: Raw) -> Result<Vec<crate::segment::RemoteSegment>, AmError> {
        match raw {
            Raw::Bytes(b) => {
                crate::segment::RemoteSegment::list_from_bytes(&b).ok_or(AmError::StaleHandle)
            }
            _ => Err(AmError::StaleHandle),
        }
    }
}

impl sealed::Sealed for Option<Team> {}
impl Outcome for Option<Team> {
    type Held = ();
    type Value = Self;
    fn finish(_: Option<()>, raw: Raw) -> Result<Option<Team>, AmError> {
        match raw {
            Raw::Team(t) => Ok(t),
            _ => Err(AmError::StaleHandle),
        }
    }
}

impl<R> sealed::Sealed for crate::typed::Typed<R> {}
/// A typed call's answer: its status, then its value decoded as an `R`; the handle holds the
/// target, which errors name.
impl<R: serde::de::DeserializeOwned> Outcome for crate::typed::Typed<R> {
    type Held = Rank;
    type Value = R;
    fn finish(held: Option<Rank>, raw: Raw) -> Result<R, AmError> {
        use crate::typed::{decode, refusal_of, Refusal};
        let peer = held.ok_or(AmError::StaleHandle)?;
        let Raw::Reply(reply) = raw else {
            return Err(AmError::StaleHandle);
        };
        let refused = |reason| AmError::TypedRefused { peer, reason };
        match reply.args.first().map(|&s| refusal_of(s)) {
            Some(None) => decode(&reply.payload).ok_or(refused(Refusal::BadAnswer)),
            Some(Some(reason)) => Err(refused(reason)),
            None => Err(refused(Refusal::BadAnswer)),
        }
    }
}
