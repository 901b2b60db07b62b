//! The handles of one-sided operations in flight: puts, gets and remote atomics.

use std::marker::PhantomData;

use crate::atomic::AtomicWord;

/// A non-blocking put in flight: complete it with [`crate::Node::wait_put`] (or, driving an
/// [`Endpoint`](crate::endpoint::Endpoint) yourself, [`Endpoint::put_step`](crate::endpoint::Endpoint::put_step) then [`Endpoint::poll_put`](crate::endpoint::Endpoint::poll_put)).
#[derive(Debug)]
#[must_use = "a put is complete only once waited for"]
pub struct PutHandle {
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

/// A non-blocking get in flight: complete it with [`crate::Node::wait_get`] (or
/// [`Endpoint::get_step`](crate::endpoint::Endpoint::get_step) then [`Endpoint::poll_get`](crate::endpoint::Endpoint::poll_get)).
#[derive(Debug)]
#[must_use = "a get's data arrives only once waited for"]
pub struct GetHandle {
    pub(crate) index: u32,
    pub(crate) gen: u32,
}

/// A remote atomic in flight: complete it with [`crate::Node::wait_atomic`] (or
/// [`Endpoint::atomic_step`](crate::endpoint::Endpoint::atomic_step) then [`Endpoint::poll_atomic`](crate::endpoint::Endpoint::poll_atomic)). One the transport applied
/// itself, or on this rank, is complete when made.
#[derive(Debug)]
#[must_use = "an atomic's old value arrives only once waited for"]
pub struct AtomicHandle<W: AtomicWord> {
    pub(crate) state: AtomicState,
    pub(crate) width: PhantomData<W>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum AtomicState {
    /// Applied: the word's old value.
    Done(u64),
    /// Sent as a system message: its operation slot.
    Op { index: u32, gen: u32 },
}

impl<W: AtomicWord> AtomicHandle<W> {
    /// Whether the atomic was applied when it was made (by the transport, on the target's
    /// memory, or on this rank): waiting for it then needs no message.
    pub fn is_applied(&self) -> bool {
        matches!(self.state, AtomicState::Done(_))
    }

    /// An atomic already applied (by the transport, or to this rank's segment), whose word
    /// held `old`.
    pub fn applied(old: u64) -> AtomicHandle<W> {
        AtomicHandle {
            state: AtomicState::Done(old),
            width: PhantomData,
        }
    }
}
