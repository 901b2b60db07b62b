//! The Portals network interface of one rank, in that rank's shared memory.
//!
//! Everything a Portals NIC keeps at the target lives in the target's exported segment, so
//! that the **wire** (the initiator's process, see the [crate docs](crate)) can do the
//! target NIC's work on it: walk the match list, claim space, deposit, post the event.
//!
//! ```text
//! word area (atomics only)
//!   line 0            EQ doorbell (futex word), then the words a producer reads to claim
//!                     a slot, on this one line: the waiting word (the owner may sleep), the
//!                     EQ head (published by the owner, lazily: every quarter ring, and idle)
//!                     and the EQ tail (a hint of the next free ticket, stored by producers)
//!   line 1            abort word (a rank that panicked sets it)
//!   NPT lines         portal table: state (enabled/disabled), list head, options
//!   departed words    one per rank, set by a rank that ends cleanly
//!   room line         the room word, then the room waiter words (a bit per rank): set by a
//!                     rank whose put was refused for room, rung by the owner when there is
//!                     room again (`am_nic::room`)
//!   ranks lines       sender records, one line per rank, written only by that rank as an
//!                     initiator: word 0 its event-queue claim (ACTIVE | the lowest ticket it
//!                     may claim), word 1 the locally managed entry it may be claiming space
//!                     in (ACTIVE | index + 1)
//!   max_me × 2 lines  match entries: line 0 = state+generation, match bits, ignore bits,
//!                     options, start, length, next; line 1 = locally managed offset, used
//!   eq_capacity lines event queue slots: status word, then the event's seven words
//! byte area
//!   whatever the owner describes with match entries (receive buffers, segment, ...)
//! ```
//!
//! # Event queue
//! The event queue is a [claimed ring](am_shm::claim) of `eq_capacity` slots, one line
//! each: the slot's status word first, then the event's seven words. Ticket `t` uses slot
//! `t % eq_capacity`.
//!
//! A producer (any rank's wire) **claims** ticket `t` with one compare-and-swap of the
//! slot's status that names it: the claim and its claimer are one atomic step. It claims
//! blind, from the status the previous lap left (a publication carries no meta data here,
//! so that status is known without a load), and only after checking `t < head +
//! eq_capacity` against the owner's published head (so the slot's previous event was read).
//! Before its first claim it stores `ACTIVE | t` into its sender record, so that the owner
//! can tell a claim that rank really holds from a status forged in its name. It then stores
//! the event's words and **publishes** with a `Release` store of the status; the owner reads
//! slots in ticket order. The tail word is only a hint of where to start (a producer that
//! finds a slot taken moves on to the next), so a stale or corrupt tail costs a walk, never
//! an overwrite.
//!
//! The owner never waits for ever at its head ([`NiOwner::eq_unblock`]): a slot claimed by
//! a rank that was lost, by a rank that is not in the job, or by one whose record does not
//! vouch for the claim is taken over (marked skipped with a compare-and-swap, so the next
//! lap finds it free) and skipped; a status no producer writes is taken over the same way
//! and reported; a free slot below claimed ones (a hole, left by a corrupt tail) is skipped.
//!
//! A producer rings the doorbell only if the owner announced that it may sleep (see
//! [`NiOwner::announce_wait`]): a spinning owner costs its producers no atomic on its lines
//! and no fence beyond the claim.
//!
//! # Match lists and locally managed offsets
//! Match entries are read under a seqlock (state word before and after), so a walker never
//! acts on a torn entry; use-once entries are taken with a CAS of their state, locally
//! managed space with a `fetch_add` of the entry's offset. The owner rewrites an entry only
//! under a new state word (a new generation), so a rank's wire keeps what it read and
//! checked of each entry with the state word it was read under, and while that word is
//! unchanged reads only it (see `MeSeen`). Only the owner changes the list
//! structure; a walker that races a re-link may end its walk early, which at worst disables
//! the portal entry spuriously (the initiator then sends again after the owner re-enables
//! it: nothing is lost).
//!
//! A walker that wants an event reserves its event slot **before** it takes any space
//! (reserve-first), so that a full event queue refuses the put with no side effect at the
//! target (no space claimed, no use-once entry taken); and before it claims locally managed
//! space it stores the entry into its sender record (released after its event is
//! published). That makes every claim attributable: the owner re-links an exhausted buffer
//! ([`NiOwner::lm_drained`]) once no live rank's record names it while that rank holds a
//! claimed slot, and no event about it is waiting in the queue. Bytes a dead rank claimed
//! are then simply never read; no count of bytes written by peers (`used`, an event's
//! length) decides a re-link.
//!
//! # Modules
//! Each submodule imports only those listed before it (`die` and `layout` import none):
//!
//! | module | what | imports |
//! |---|---|---|
//! | `die` | fault injection: the steps a test's rank dies at (no code outside tests) | |
//! | `layout` | where every word lies, the geometry, the errors, the views ([`Nic`], [`NiRuns`]) | |
//! | `eq` | the event queue: the claimed ring's slots, events, the claim in a rank's name and its sender record | `die`, `layout` |
//! | `me` | match entries: options, the seqlock (read and write), what a wire keeps, the match-list walk | `die`, `layout`, `eq` |
//! | `initiator` | the wire's operations: put, get, atomic | `die`, `layout`, `eq`, `me` |
//! | `owner` | the owner's side: match lists, re-links, repairs, reading the event queue | `layout`, `eq`, `me` |

pub(crate) mod die;
mod eq;
mod initiator;
mod layout;
mod me;
mod owner;
#[cfg(test)]
mod tests;

#[cfg(test)]
pub use am_shm::claim::Seen;
pub use eq::{Event, EventKind, NiFail, Unblocked};
pub use initiator::{Outcome, PutArgs};
pub use layout::{
    MeIndex, NiError, NiGeometry, NiRuns, Nic, ABORT, NO_ME, NPT, PT_REPLY, PT_REQUEST, PT_SEGMENT,
    PT_USER,
};
#[cfg(test)]
pub(crate) use layout::{ACTIVE, EQ_HEAD, EQ_TAIL, WAITING};
pub(crate) use layout::{PT_DISABLED, PT_ENABLED};
pub(crate) use me::MeSeen;
pub use me::{lm_len, MeOptions, MeSpec, LM_ALIGN};
pub use owner::{Drained, NiOwner};
