//! Fault injection: a rank that dies at a chosen step of a put (it stops writing there), so
//! that the tests can leave behind exactly what a killed process leaves in shared memory.
//!
//! The wire names each step where a process may die ([`Step`]) with one call; whether it
//! dies there is asked of [`here`]. In the crate's own tests `here` reads a per-thread
//! setting ([`at`]); in every other build it is a constant `false` and [`Dead`] holds
//! nothing, so the calls compile to no code at all: a production build has no branch, no
//! thread-local access and no field for them.

/// Where an operation stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Its event-queue record written, no slot claimed.
    Recorded,
    /// An event slot claimed.
    SlotClaimed,
    /// Its record names a locally managed entry, no space claimed.
    LmRecorded,
    /// Space claimed, nothing deposited.
    LmClaimed,
    /// Deposited, the event not published.
    Deposited,
    /// Published, the records not cleared.
    Published,
}

/// Whether this thread's operation dies at `s`.
#[cfg(not(test))]
#[inline(always)]
pub(crate) fn here(_: Step) -> bool {
    false
}

/// Whether a claimer died (then it writes nothing more, not even on its way out). Outside
/// the tests nobody dies: an empty type whose answer is a constant.
#[cfg(not(test))]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dead;

#[cfg(not(test))]
impl Dead {
    /// Alive.
    #[inline(always)]
    pub(crate) fn new() -> Dead {
        Dead
    }

    /// Marks the claimer dead.
    #[inline(always)]
    pub(crate) fn set(&mut self) {}

    /// Whether the claimer died.
    #[inline(always)]
    pub(crate) fn get(&self) -> bool {
        false
    }
}

#[cfg(test)]
pub(crate) use hooks::*;

/// The tests' side: a per-thread step to die at.
#[cfg(test)]
mod hooks {
    use super::Step;
    use std::cell::Cell;

    /// Every step, in order.
    pub(crate) const STEPS: [Step; 6] = [
        Step::Recorded,
        Step::SlotClaimed,
        Step::LmRecorded,
        Step::LmClaimed,
        Step::Deposited,
        Step::Published,
    ];

    thread_local! {
        static AT: Cell<Option<Step>> = const { Cell::new(None) };
    }

    /// Whether this thread's operation dies at `s`.
    pub(crate) fn here(s: Step) -> bool {
        AT.with(|a| a.get() == Some(s))
    }

    /// Makes this thread's operations die at `s` (`None`: live).
    pub(crate) fn at(s: Option<Step>) {
        AT.with(|a| a.set(s));
    }

    /// Whether a claimer died (then it writes nothing more, not even on its way out).
    #[derive(Debug, Clone, Copy)]
    pub(crate) struct Dead(bool);

    impl Dead {
        /// Alive.
        pub(crate) fn new() -> Dead {
            Dead(false)
        }

        /// Marks the claimer dead.
        pub(crate) fn set(&mut self) {
            self.0 = true;
        }

        /// Whether the claimer died.
        pub(crate) fn get(&self) -> bool {
            self.0
        }
    }
}
