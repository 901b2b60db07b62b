//! Typed active messages: a serde type sent to a rank, where its code runs, and a typed
//! answer back (Lamellar's `#[AmData]` structs and `exec_am_pe`, UPC++'s `rpc`).
//!
//! A message is a type implementing [`Am`]: serde in both directions, with the type of its
//! answer ([`Am::Reply`], `()` for none) and the code that runs at the target
//! ([`Am::exec`]). Every rank registers the same types in its [`crate::Handlers`]
//! ([`crate::Handlers::typed`]); [`crate::Node::call_typed`] sends one and completes with
//! its answer, [`crate::Node::post_typed`] sends one with no answer.
//!
//! ```
//! use amnet::typed::{Am, AmContext, Shape};
//! use amnet::{Config, Handlers, Loopback, Node};
//! use serde::{Deserialize, Serialize};
//!
//! #[derive(Serialize, Deserialize, Shape)]
//! struct Square(u64);
//!
//! impl Am for Square {
//!     type Reply = u64;
//!     const SHAPE: u64 = <Self as Shape>::SHAPE;
//!     fn exec(self, _cx: &mut AmContext) -> u64 {
//!         self.0 * self.0
//!     }
//! }
//!
//! fn main() {
//!
//!     amnet::run_ranks(Loopback::cluster(2, Default::default()), |t| {
//!         let mut handlers = Handlers::new();
//!         handlers.typed::<Square>().unwrap();
//!         let mut node = Node::new(t, handlers, Config::default()).unwrap();
//!         let peer = 1 - node.rank();
//!         assert_eq!(node.call_typed(peer, Square(12)).unwrap(), 144);
//!         node.barrier().unwrap();
//!     });
//! }
//! ```
//!
//! # Which types agree
//! Start-up compares the ids ([`type_id`]) of every rank's typed messages and refuses a job
//! whose ranks differ, naming the type and the rank ([`crate::StartError::TypedMismatch`]).
//! An id is the type's path and its [`Am::SHAPE`]: the path alone misses a type whose
//! fields changed in one rank's build and not another's. `#[derive(Shape)]` computes a
//! fingerprint of the type's serde shape at compile time: its kind and name, its fields'
//! names and types in order, its variants' names and fields, and (recursively) the same of
//! every type it holds, std's by their kind in serde's data model ([`shape`]). An `Am` takes
//! it as its `SHAPE` in one line, shown above; a type without it is compared by path alone.
//! The derive refuses serde attributes that change the wire in a way the fields do not show
//! (`flatten`, `with`, `tag`, `untagged`, `into`, ...): such a type implements [`Shape`] by
//! hand. `Am` does not require `Shape`, so that a message may hold a field type from a
//! crate with no `Shape` impl (the derive's `#[shape(by_name)]` on the field, or no
//! fingerprint).
//!
//! # Answering later
//! Code that cannot answer at once (it waits for a lock, a disk, another rank's answer)
//! registers with [`crate::Handlers::typed_deferred`]: it gets the call's [`Answer`] beside
//! the message, hands both out of the handler (a channel, a queue its runtime reads), and
//! whoever computes the answer gives it to [`crate::Node::answer_typed`] (blocking, `_nb`
//! or async, on any driver). A plain [`crate::Node`] is answered through on its own thread
//! (the `Answer` comes back to it); a [`crate::SharedNode`] or [`crate::AsyncNode`] from any
//! thread or task. Given to the node of another endpoint of the process, the answer still
//! leaves from the endpoint its call came to, at that endpoint's next poll (a node asleep
//! in a wait polls when a message wakes it or its sleep ends), and a value too large or
//! that does not encode fails the call ([`Refusal::TooLarge`], [`Refusal::BadAnswer`])
//! rather than `answer_typed`. The handler itself never waits: it runs inside progress.
//!
//! # Async handlers
//! Code written as a future registers with [`crate::Handlers::typed_async`]: its future
//! runs as a task of the node's driver, outside the node's lock, so it may await a timer,
//! a channel, or a call of its own node, and the call is answered when it completes
//! (Lamellar's `async fn exec`). Every driver polls these tasks: [`crate::AsyncNode`]'s
//! (`block_on`, and the tokio driver, which wakes from its sleep for a task woken), a
//! [`crate::SharedNode`]'s polls, and a blocking [`crate::Node`]'s polls and waits.
//!
//! # Wire
//! A typed message is an AM Medium to one of the handlers the table reserves at the first
//! typed registration (a call's, answered, and a post's), whose arguments carry the type's
//! id ([`type_id`]) and whose payload is the value in the wire format (bincode's, with
//! integers as fixed-width little-endian words, lengths too). A call's answer is
//! a Medium whose first argument says whether the target ran it, and whose payload is the
//! answer's value.
//!
//! # Values of any size
//! A value (or an answer) of up to [`MAX_LEN`] bytes encoded travels, whatever the
//! transport's largest AM Medium (`Node::max_medium`): one larger than a Medium leaves as
//! *parts*, requests of a third reserved handler, each one full Medium, followed by the
//! message itself with the last piece. The first part declares the whole length, each
//! part its index. A transport delivers one sender's messages in order, so the target has
//! every part when the message comes; it checks they are all there, in order, and runs the
//! whole. An answer too large for a reply leaves the same way, as requests of a fourth
//! reserved handler sent from the target's poll after the handler, and the call completes
//! when its last piece comes. A target holds at most [`MAX_LEN`] bytes of one peer's values
//! still arriving, charged when their first part declares them; past that their messages
//! are refused ([`Refusal::TooLarge`]). A value given up half sent (its future dropped, its
//! send failed) cancels its parts at the target, and an [`Answer`] given up so fails its
//! call with [`Refusal::Abandoned`].
//!
//! Where the transport's peers are processes or threads of this host that map each other's memory
//! ([`crate::Capabilities::map_segments`]: loopback, sci, extoll, portals), a value, or an answer
//! given to [`crate::Node::answer_typed`] on the endpoint its call came to, of 16 KiB to 64 MiB
//! that is larger than a Medium moves by *rendezvous* instead (an answer returned by the code or by
//! an async handler's future, or given to another endpoint's node, goes in parts): its sender
//! copies it into a staging segment of its own (a created segment's memory file, published to
//! nobody) and sends one Medium that says where it lies; the target maps that segment (once, kept
//! for the next values), copies the bytes out, releases them, and runs the whole. A target that
//! cannot map it refuses the value with [`Refusal::Unreachable`];
//! [`crate::Config::typed_rendezvous`] (`AM_TYPED_RENDEZVOUS=0`) sends every large value in parts.
//! At most 255 values are staged at once per endpoint, in a segment of at least four times the
//! largest; past that, values go in parts.
//!
//! Byte fields are best written with `serde_bytes` (`#[serde(with = "serde_bytes")]`, or
//! `serde_bytes::ByteBuf`): serde writes a plain `Vec<u8>` element by element.
//!
//! # Bad input
//! Bytes that do not decode as the named type (cut short, bytes left over, a length past the
//! payload), an id the target does not register, or an answer that does not decode, end the call
//! with [`crate::AmError::TypedRefused`] naming the peer. Whether the target's code ran depends on
//! the [`Refusal`]: not for [`Refusal::UnknownType`]; it did for [`Refusal::Abandoned`] and
//! [`Refusal::BadAnswer`]; [`Refusal::Undecodable`], [`Refusal::Unreachable`] and
//! [`Refusal::TooLarge`] say the message was refused on its way in (the code did not run) or its
//! answer on its way back (it did). A call refused with any but `UnknownType` is therefore not safe
//! to repeat unless its code is. A post has no answer: a value its target refuses is dropped, and
//! nobody is told ([`crate::Node::call_typed`] where delivery matters).
//!
//! A declared length does not make decoding allocate what it says: serde's sequence and map
//! visitors reserve at most a cautious bound (1 MiB) however long the sequence says it is, growing
//! only as elements are read from the bytes present, which a declared length past them soon runs
//! out of. (A hand-written `Visitor` that reserves serde's `size_hint` whole is not protected so:
//! the hint is the declared length.) Elements that occupy no bytes (`()`, a unit struct, a struct
//! whose fields are all skipped) would not run out, so the elements of all of a value's sequences
//! and maps may number at most its length in bytes plus 65,536: a value with more is refused, and a
//! forged count of them costs the target at most that many turns of a loop (and elements of that
//! type in memory). A value nested more than 128 containers deep (a recursive type's forged value,
//! a few bytes a level) is refused before decoding it would overflow the target's stack. The
//! elements of a value's sequences and maps (a map's keys and values, and what a `Box` among them
//! holds) may take at most 64 bytes of memory per byte of the value plus 64 MiB in all: a
//! legitimate value whose elements are that much larger in memory than on the wire (many `None`s of
//! a large `Option`) is refused as [`Refusal::Undecodable`] too. A boxed type decoded through a
//! smaller one (`#[serde(from = ...)]`, a hand-written `Deserialize`) is charged the smaller one's
//! size.

use std::marker::PhantomData;

use serde::{de::DeserializeOwned, Serialize};

use crate::types::Rank;

mod depth;
pub mod shape;
pub(crate) mod staging;
pub(crate) mod tasks;
/// `#[derive(Shape)]`: implements [`Shape`] for a struct or enum from its definition.
pub use am_derive::Shape;
pub use shape::Shape;

/// A typed active message: the value travels to the target, which runs [`Am::exec`] on it
/// inside progress (as a handler does) and answers with its [`Am::Reply`].
///
/// `Am` does not require `Send`, but a message is held until its call or post starts: the
/// call's handle and its future on [`crate::AsyncNode`] are `Send` only where the message
/// is.
pub trait Am: Serialize + DeserializeOwned + 'static {
    /// The answer's type (`()` for none).
    type Reply: Serialize + DeserializeOwned + 'static;

    /// The fingerprint of the type's serde shape (its fields' names and types), part of its
    /// id: two ranks whose types share a name but not a shape have different ids, and
    /// start-up refuses the job. 0, the default, is none: the id is the name alone, and a
    /// changed layout under the same name goes unnoticed (its values fail to decode, or
    /// decode as other values).
    ///
    /// With `#[derive(Shape)]` on the type, its [`Shape::SHAPE`]:
    /// `const SHAPE: u64 = <Self as Shape>::SHAPE;` (the trait's name is needed: both
    /// traits have a `SHAPE`). What the fingerprint covers: [`shape`].
    const SHAPE: u64 = 0;

    /// Runs at the target, with the message's context.
    fn exec(self, cx: &mut AmContext) -> Self::Reply;
}

/// What a typed message's code knows of where it runs. [`Am::exec`] cannot send: code that
/// sends or calls while it answers is an async handler ([`crate::Handlers::typed_async`])
/// holding a [`crate::WeakAsyncNode`], or a deferred one
/// ([`crate::Handlers::typed_deferred`]) whose answer is given by a thread that can.
#[derive(Debug)]
#[non_exhaustive]
pub struct AmContext {
    pub(crate) src: Rank,
    /// The call's number, for a call (`None` for a post).
    pub(crate) number: Option<u32>,
}

impl AmContext {
    /// The rank that sent the message.
    pub fn src(&self) -> Rank {
        self.src
    }
}

/// A type's id on the wire: an FNV-1a hash of its path (`std::any::type_name`) and its
/// [`Am::SHAPE`], the same on every rank built from the same source with the same compiler
/// (`type_name`'s text is not promised to stay the same across compiler versions).
pub fn type_id<M: Am>() -> u64 {
    id_of(std::any::type_name::<M>(), M::SHAPE)
}

/// The name's bytes, then the fingerprint's 8: a fixed-length tail, so no two pairs share
/// their bytes.
fn id_of(name: &str, fingerprint: u64) -> u64 {
    shape::fold(shape::fnv(shape::SEED, name.as_bytes()), fingerprint)
}

/// Why a typed message was refused or its answer not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The target registers no type with the message's id.
    UnknownType,
    /// The target could not decode the message as its type.
    Undecodable,
    /// The answer did not decode as the type's [`Am::Reply`], carried no status, or the
    /// target's answer could not be encoded (its code ran).
    BadAnswer,
    /// The message or its answer was larger than [`MAX_LEN`], or the target already held
    /// that much of this rank's values arriving in parts.
    TooLarge,
    /// The target's code took the call's [`Answer`] and dropped it unsent.
    Abandoned,
    /// The target could not map the memory a value moved by rendezvous lay in (see
    /// "Values of any size" in [`crate::typed`]); for an answer moved so, the caller could
    /// not map the target's.
    Unreachable,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::UnknownType => "the target registers no such type",
            Refusal::Undecodable => "the target could not decode the message",
            Refusal::BadAnswer => "the answer did not decode as the reply type",
            Refusal::TooLarge => "the message or its answer was too large",
            Refusal::Abandoned => "the target dropped its answer unsent",
            Refusal::Unreachable => {
                "the target could not map the sender's staging memory (large values go in \
                 parts with Config::typed_rendezvous(false), or AM_TYPED_RENDEZVOUS=0)"
            }
        })
    }
}

/// The right to answer one typed call later, from anywhere: a type registered with
/// [`crate::Handlers::typed_deferred`] gets one in place of returning its answer, and the
/// answer leaves when it is given to [`crate::Node::answer_typed`] (on any driver: a
/// thread that received it over a channel, a task that awaited something first), as
/// GASNet-EX's deferred replies and Lamellar's `async fn exec` do. Given to the node of
/// another endpoint of the process, it leaves from the endpoint its call came to, at that
/// endpoint's next poll.
///
/// An `Answer` dropped unsent answers the call with [`Refusal::Abandoned`] (from the node's
/// next poll), so the caller never waits for ever. One made for a post
/// ([`crate::Node::post_typed`]) goes nowhere: giving it an answer does nothing.
#[must_use = "an Answer dropped unsent answers the caller with Refusal::Abandoned"]
pub struct Answer<R> {
    /// The caller.
    pub(crate) dest: Rank,
    /// The call's number.
    pub(crate) number: u32,
    /// Where an abandoned answer is queued; `None` once given to `answer_typed` and sent,
    /// or for a post.
    pub(crate) transit: Option<std::sync::Arc<Transit>>,
    /// What the caller is told if this answer is given up: abandoned, or why the value
    /// given could not be sent.
    pub(crate) status: u32,
    /// The stream of the parts sent before it was given up, if any.
    pub(crate) stream: Option<u32>,
    _r: PhantomData<fn(R)>,
}

impl<R> Answer<R> {
    /// The rank waiting for this answer (the message's sender).
    pub fn src(&self) -> Rank {
        self.dest
    }

    /// Whether answering goes anywhere: false for a post's.
    pub fn is_call(&self) -> bool {
        self.transit.is_some()
    }

    /// Whether this answer's call came to the endpoint whose typed state is `transit`.
    pub(crate) fn came_to(&self, transit: &Transit) -> bool {
        self.transit
            .as_deref()
            .is_some_and(|t| std::ptr::eq(t, transit))
    }

    /// Answers with `bytes` (the value encoded, or why it could not be) from the endpoint
    /// the call came to, at its next poll: for an answer given where no node is at hand, or
    /// to another endpoint's node. A value larger than [`MAX_LEN`], or one that did not
    /// encode, fails the call with [`Refusal::TooLarge`] or [`Refusal::BadAnswer`].
    pub(crate) fn queue_at_origin(&mut self, bytes: Result<Vec<u8>, crate::AmError>) {
        let Some(transit) = self.transit.take() else {
            return;
        };
        let (status, bytes) = match bytes {
            Ok(b) if b.len() <= MAX_LEN => (ANSWER_OK, b),
            Ok(_) => (ANSWER_TOO_LARGE, Vec::new()),
            Err(_) => (ANSWER_BAD, Vec::new()),
        };
        transit.queue(self.dest, self.number, status, bytes, None);
    }
}

impl<R> std::fmt::Debug for Answer<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field("src", &self.dest)
            .field("call", &self.is_call())
            .finish()
    }
}

impl<R> Drop for Answer<R> {
    fn drop(&mut self) {
        if let Some(transit) = self.transit.take() {
            transit.queue(self.dest, self.number, self.status, Vec::new(), self.stream);
        }
    }
}

/// Status words of a typed call's answer (its first argument).
pub(crate) const ANSWER_OK: u32 = 0;
pub(crate) const ANSWER_UNKNOWN: u32 = 1;
pub(crate) const ANSWER_UNDECODABLE: u32 = 2;
pub(crate) const ANSWER_BAD: u32 = 3;
pub(crate) const ANSWER_TOO_LARGE: u32 = 4;
pub(crate) const ANSWER_ABANDONED: u32 = 5;
pub(crate) const ANSWER_UNREACHABLE: u32 = 6;
/// Not on the wire: the code took an [`Answer`] and will answer later.
pub(crate) const DEFERRED: u32 = u32::MAX;

/// The largest typed value or answer, encoded: 1 GiB. It also bounds the bytes a target
/// holds for one peer's values still arriving in parts.
pub const MAX_LEN: usize = 1 << 30;

/// The length of `v` on the wire.
pub fn encoded_len<T: Serialize>(v: &T) -> Result<usize, crate::AmError> {
    /// Counts what is written, and keeps nothing.
    struct Counted(usize);
    impl std::io::Write for Counted {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Counted(0);
    bincode::serde::encode_into_std_write(v, &mut n, WIRE).map_err(unencodable::<T>)?;
    Ok(n.0)
}

/// The error of an operation on a `T` the wire format cannot hold.
fn unencodable<T>(e: bincode::error::EncodeError) -> crate::AmError {
    crate::AmError::TypedUnencodable {
        name: std::any::type_name::<T>(),
        reason: e.to_string(),
    }
}

/// `v` in the wire format, or the error an operation on it gives: one of a type serde
/// cannot write in it (a sequence of unknown length, a serializer's own error).
pub(crate) fn encoded<T: Serialize>(v: &T) -> Result<Vec<u8>, crate::AmError> {
    encode(v).map_err(unencodable::<T>)
}

/// The wire format: bincode's, integers as fixed-width little-endian words. Fixed words
/// are what PGAS messages mostly carry (indices, keys, values of any magnitude) and what
/// decodes fastest: a word is one load, where a varint is a loop over up to 10 bytes.
const WIRE: bincode::config::Configuration<bincode::config::LittleEndian, bincode::config::Fixint> =
    bincode::config::standard().with_fixed_int_encoding();

/// `v` in the wire format.
pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, bincode::error::EncodeError> {
    // Room for a small value at once: growing from empty reallocates at each doubling.
    let mut out = Spilling::<{ usize::MAX }>(Vec::with_capacity(64));
    bincode::serde::encode_into_std_write(v, &mut out, WIRE)?;
    Ok(out.0)
}

/// Values encoded longer than this are encoded again when they start ([`encoded_small`]).
///
/// What a value encoded so far is thrown away when it stops, so the bound is where that
/// waste is small against the copy it saves (a value by rendezvous, encoded straight into
/// the staging segment): a byte buffer stops at once, a value of many small fields after
/// this many bytes of them. Below it, a value by rendezvous is copied into the staging
/// segment from its private encoding, as one of a Medium is sent from it.
pub(crate) const LATE_FROM: usize = 64 << 10;

/// `v` in the wire format if it is no longer than [`LATE_FROM`]; `None` if it is longer
/// (its encoding stops there): such a value is encoded when it starts, straight into the
/// staging segment where it moves by rendezvous ([`Transit::encode_late`]).
#[inline]
pub(crate) fn encoded_small<T: Serialize>(v: &T) -> Result<Option<Vec<u8>>, crate::AmError> {
    let mut out = Spilling::<LATE_FROM>(Vec::with_capacity(64));
    match bincode::serde::encode_into_std_write(v, &mut out, WIRE) {
        Ok(_) => Ok(Some(out.0)),
        // The output's only error.
        Err(bincode::error::EncodeError::Io { .. }) => Ok(None),
        Err(e) => Err(unencodable::<T>(e)),
    }
}

/// Values encoded past this many bytes move to this thread's recycled buffer
/// ([`recycle`]).
const SPILL: usize = 64 << 10;

thread_local! {
    /// A buffer a large value was encoded into, given back once its bytes left
    /// ([`recycle`]), for the next large value this thread encodes.
    static RECYCLED: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Keeps `buf` (the bytes of a large value, sent) for the next large value this thread
/// encodes, if it is larger than the one kept and no larger than [`INBOX_KEEP`]. Where the
/// allocator returns freed memory to the system (glibc's main arena trims its heap), a
/// fresh buffer of a large value's size costs a page fault a page as it is written: more
/// than the value's copies.
pub(crate) fn recycle(buf: Vec<u8>) {
    if buf.capacity() < SPILL {
        return;
    }
    RECYCLED.with(|r| {
        let mut kept = r.take();
        keep_larger(&mut kept, buf);
        r.set(kept);
    });
}

/// Keeps in `kept` the larger of it and `buf`, unless `buf` is larger than [`INBOX_KEEP`]:
/// the rule of the buffers kept for large values ([`recycle`], [`Transit::put_inbox`]).
fn keep_larger(kept: &mut Vec<u8>, buf: Vec<u8>) {
    if buf.capacity() > kept.capacity() && buf.capacity() <= INBOX_KEEP {
        *kept = buf;
    }
}

/// The encoder's output: a growing `Vec` that moves, past [`SPILL`] bytes, into this
/// thread's recycled buffer ([`recycle`]), and refuses to grow past `STOP` bytes (its only
/// error).
struct Spilling<const STOP: usize>(Vec<u8>);

impl<const STOP: usize> Spilling<STOP> {
    #[cold]
    #[inline(never)]
    fn spill(&mut self, more: usize) -> std::io::Result<()> {
        let want = self.0.len() + more;
        if want > STOP {
            return Err(std::io::ErrorKind::FileTooLarge.into());
        }
        if want <= SPILL || self.0.capacity() >= SPILL {
            self.0.reserve(more);
            return Ok(());
        }
        let mut big = RECYCLED.with(std::cell::Cell::take);
        big.clear();
        big.reserve(want.max(2 * SPILL));
        big.extend_from_slice(&self.0);
        self.0 = big;
        Ok(())
    }
}

impl<const STOP: usize> std::io::Write for Spilling<STOP> {
    #[inline]
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.write_all(b)?;
        Ok(b.len())
    }

    #[inline]
    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        if self.0.capacity() - self.0.len() < b.len() {
            self.spill(b.len())?;
        }
        self.0.extend_from_slice(b);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A value encoded as it starts ([`Transit::encode_late`]): its bytes, or its region of
/// the staging segment.
#[derive(Debug)]
pub(crate) enum Late {
    Bytes(Vec<u8>),
    Staged(staging::Staged),
}

/// [`Transit::encode_late`]'s output: a private buffer up to `limit` bytes, then a staged
/// region.
struct LateOut<'t> {
    transit: &'t Transit,
    dest: Rank,
    private: Spilling<{ usize::MAX }>,
    limit: usize,
    staged: Option<(staging::Staged, InSegment)>,
}

impl std::io::Write for LateOut<'_> {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.write_all(b)?;
        Ok(b.len())
    }

    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        if let Some((_, seg)) = &mut self.staged {
            return seg.write_all(b);
        }
        if self.private.0.len() + b.len() > self.limit {
            // Longer than a Medium: on into the staging segment, if it has room.
            self.limit = usize::MAX;
            if let Some((seg, staged)) = self.transit.staging().stage_open(self.dest) {
                let mut out = InSegment {
                    at: staged.offset(),
                    end: staged.offset() + staged.len(),
                    seg,
                    buf: Vec::new(),
                    full: false,
                };
                let written = out.write_all(&self.private.0);
                self.staged = Some((staged, out));
                written?;
                self.private.0 = Vec::new();
                return self.write_all(b);
            }
        }
        self.private.write_all(b)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match &mut self.staged {
            Some((_, seg)) => seg.flush(),
            None => Ok(()),
        }
    }
}

/// The encoder's output into a staged region of the staging segment `seg`, up to `end`:
/// small writes are gathered into whole chunks (a store into shared memory merges a partial
/// word at either end), large ones go straight in. Past `end`, it refuses, and says so.
struct InSegment {
    seg: am_shm::Segment,
    /// Where the next flushed byte goes.
    at: usize,
    end: usize,
    /// Small writes not flushed yet.
    buf: Vec<u8>,
    /// A write went past `end`.
    full: bool,
}

/// Writes this long or longer go straight into the segment.
const IN_SEGMENT_CHUNK: usize = 4096;

impl InSegment {
    fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        let full = || std::io::Error::from(std::io::ErrorKind::FileTooLarge);
        let end = self.at.checked_add(b.len()).ok_or_else(full)?;
        if end > self.end {
            self.full = true;
            return Err(full());
        }
        self.seg.byte_area().write(self.at, b).map_err(|_| full())?;
        self.at = end;
        Ok(())
    }
}

impl std::io::Write for InSegment {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.write_all(b)?;
        Ok(b.len())
    }

    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        if self.buf.len() + b.len() > IN_SEGMENT_CHUNK {
            self.flush()?;
        }
        if b.len() >= IN_SEGMENT_CHUNK {
            return self.put(b);
        }
        if self.buf.capacity() == 0 {
            self.buf.reserve_exact(IN_SEGMENT_CHUNK);
        }
        self.buf.extend_from_slice(b);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let buf = std::mem::take(&mut self.buf);
        let put = self.put(&buf);
        self.buf = buf;
        self.buf.clear();
        put
    }
}

/// `v` in the wire format, appended to `out`.
fn encode_into<T: Serialize>(v: &T, out: &mut Vec<u8>) -> Result<(), bincode::error::EncodeError> {
    bincode::serde::encode_into_std_write(v, out, WIRE).map(drop)
}

/// The value `bytes` hold, all of them: a value followed by more bytes is refused.
///
/// It is decoded from the slice, borrowing it: a string's or a byte buffer's declared
/// length is checked against the bytes left before anything is allocated, so a few bytes
/// declaring a length of 2^62 allocate nothing, and its bytes are copied out once (see
/// `depth::Deep::deserialize_byte_buf`). Sequences are not checked so: serde reserves at
/// most 1 MiB for one, however long it says it is, and each element must then decode; the
/// elements of all its sequences and maps may number at most its length in bytes plus
/// [`depth::ELEMENTS_PAST_BYTES`], so elements that occupy no bytes cannot keep it looping,
/// and take at most [`depth::MEMORY_PER_BYTE`] times its length plus
/// [`depth::MEMORY_PAST_BYTES`] bytes of memory, so elements small on the wire and large in
/// memory cannot make a few bytes into gigabytes.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    /// Decodes a `T` of `.1` bytes through [`depth::deserialize`].
    struct Bounded<T>(PhantomData<fn() -> T>, usize);
    impl<'de, T: DeserializeOwned> serde::de::DeserializeSeed<'de> for Bounded<T> {
        type Value = T;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
            depth::deserialize(d, self.1)
        }
    }
    let seed = Bounded::<T>(PhantomData, bytes.len());
    let (v, read) =
        bincode::serde::seed_decode_from_slice(seed, bytes, WIRE.with_limit::<MAX_LEN>()).ok()?;
    // Every byte read: a value followed by more is refused.
    (read == bytes.len()).then_some(v)
}

/// The outcome of a typed call ([`crate::Node::call_typed_nb`]'s handle is an
/// `Op<Typed<R>>`): waiting for it gives the decoded answer, an `R`.
pub struct Typed<R>(PhantomData<fn() -> R>);

impl<R> std::fmt::Debug for Typed<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Typed")
    }
}

/// The code of a typed entry, `Send` ones: decodes, runs, and says whether the answer is
/// in the buffer (`false`: the code took an [`Answer`]).
#[doc(hidden)]
pub type SendTypedFn =
    dyn FnMut(&[u8], &mut AmContext, &mut Vec<u8>) -> Result<bool, Refusal> + Send;
/// The code of a typed entry.
#[doc(hidden)]
pub type TypedFn = dyn FnMut(&[u8], &mut AmContext, &mut Vec<u8>) -> Result<bool, Refusal>;

/// `M`'s entry: decodes the payload as an `M`, runs `f`, encodes its answer into `out`
/// (the dispatcher's buffer, kept from one message to the next so that answering allocates
/// nothing once it has grown).
pub(crate) fn runner<M: Am>(
    mut f: impl FnMut(M, &mut AmContext) -> M::Reply,
) -> impl FnMut(&[u8], &mut AmContext, &mut Vec<u8>) -> Result<bool, Refusal> {
    move |bytes, cx, out| {
        let msg: M = decode(bytes).ok_or(Refusal::Undecodable)?;
        let answer = f(msg, cx);
        out.clear();
        encode_into(&answer, out).map_err(|_| Refusal::BadAnswer)?;
        Ok(true)
    }
}

/// `M`'s entry when its code answers later ([`crate::Handlers::typed_deferred`]): decodes
/// the payload as an `M` and hands `f` the message and its [`Answer`].
pub(crate) fn deferred_runner<M: Am>(
    transit: std::sync::Arc<Transit>,
    mut f: impl FnMut(M, &mut AmContext, Answer<M::Reply>),
) -> impl FnMut(&[u8], &mut AmContext, &mut Vec<u8>) -> Result<bool, Refusal> {
    move |bytes, cx, _out| {
        let msg: M = decode(bytes).ok_or(Refusal::Undecodable)?;
        let answer = Answer {
            dest: cx.src,
            number: cx.number.unwrap_or(0),
            transit: cx.number.map(|_| transit.clone()),
            status: ANSWER_ABANDONED,
            stream: None,
            _r: PhantomData,
        };
        f(msg, cx, answer);
        Ok(false)
    }
}

/// Gives `answer` its value from where no node is at hand (an async handler's task,
/// [`crate::Handlers::typed_async`]): queued, to leave as requests from the endpoint's next
/// poll. A value that does not encode, or is larger than [`MAX_LEN`], fails the call with
/// [`Refusal::BadAnswer`] or [`Refusal::TooLarge`].
pub(crate) fn answer_later<R: Serialize>(mut answer: Answer<R>, value: R) {
    if answer.is_call() {
        answer.queue_at_origin(encoded(&value));
    }
}

/// The type id two argument words carry (low word first).
pub(crate) fn id_from(args: &[u32]) -> Option<u64> {
    match args {
        [lo, hi] => Some(u64::from(*lo) | u64::from(*hi) << 32),
        _ => None,
    }
}

/// The two argument words that carry type id `id`.
pub(crate) fn id_words(id: u64) -> [u32; 2] {
    [id as u32, (id >> 32) as u32]
}

/// Runs a typed message that arrived: `run` finds its entry and runs it (`None`: no such
/// type). Its arguments are the type id's two words, then, for a value that came in parts,
/// the parts' stream, whose bytes `transit` holds and the message's payload ends. `number`
/// is a call's. The answer's status (its bytes in `out`), or [`DEFERRED`].
pub(crate) fn dispatch(
    msg: &crate::Msg<'_>,
    number: Option<u32>,
    transit: &Transit,
    out: &mut Vec<u8>,
    run: impl FnOnce(u64, &[u8], &mut AmContext, &mut Vec<u8>) -> Option<Result<bool, Refusal>>,
) -> u32 {
    let mut cx = AmContext {
        src: msg.src(),
        number,
    };
    let (id, ran) = match msg.args() {
        [lo, hi] => {
            let id = id_from(&[*lo, *hi]);
            (id, id.and_then(|id| run(id, msg.payload(), &mut cx, out)))
        }
        [lo, hi, stream] => {
            let id = id_from(&[*lo, *hi]);
            // The parts are taken whatever the id, so that none stay behind.
            let ran = match (id, transit.take_parts(msg.src(), *stream, msg.payload())) {
                (Some(id), Ok(bytes)) => {
                    let ran = run(id, &bytes, &mut cx, out);
                    transit.put_inbox(bytes);
                    ran
                }
                (_, Err(refusal)) => Some(Err(refusal)),
                (None, Ok(_)) => None,
            };
            (id, ran)
        }
        [lo, hi, slot, staging::RENDEZVOUS] => {
            let id = id_from(&[*lo, *hi]);
            let mut inbox = transit.take_inbox();
            let ran = match transit.fetch_into(msg.src(), *slot, msg.payload(), &mut inbox) {
                Ok(n) => id.and_then(|id| run(id, &inbox[..n], &mut cx, out)),
                Err(refusal) => Some(Err(refusal)),
            };
            transit.put_inbox(inbox);
            (id, ran)
        }
        _ => (None, None),
    };
    if id.is_none() {
        return ANSWER_UNDECODABLE;
    }
    match ran {
        None => ANSWER_UNKNOWN,
        Some(Ok(false)) => DEFERRED,
        Some(Ok(true)) if out.len() > MAX_LEN => ANSWER_TOO_LARGE,
        Some(Ok(true)) => ANSWER_OK,
        Some(Err(Refusal::Undecodable)) => ANSWER_UNDECODABLE,
        Some(Err(Refusal::TooLarge)) => ANSWER_TOO_LARGE,
        Some(Err(Refusal::Unreachable)) => ANSWER_UNREACHABLE,
        Some(Err(_)) => ANSWER_BAD,
    }
}

/// The status word an answer refused for `refusal` carries.
pub(crate) fn status_of(refusal: Refusal) -> u32 {
    match refusal {
        Refusal::UnknownType => ANSWER_UNKNOWN,
        Refusal::Undecodable => ANSWER_UNDECODABLE,
        Refusal::TooLarge => ANSWER_TOO_LARGE,
        Refusal::Abandoned => ANSWER_ABANDONED,
        Refusal::Unreachable => ANSWER_UNREACHABLE,
        Refusal::BadAnswer => ANSWER_BAD,
    }
}

/// The refusal an answer's status word says (`None`: it ran).
pub(crate) fn refusal_of(status: u32) -> Option<Refusal> {
    match status {
        ANSWER_OK => None,
        ANSWER_UNKNOWN => Some(Refusal::UnknownType),
        ANSWER_UNDECODABLE => Some(Refusal::Undecodable),
        ANSWER_TOO_LARGE => Some(Refusal::TooLarge),
        ANSWER_ABANDONED => Some(Refusal::Abandoned),
        ANSWER_UNREACHABLE => Some(Refusal::Unreachable),
        _ => Some(Refusal::BadAnswer),
    }
}

/// What typed traffic larger than one AM Medium needs beside the handlers, shared by the
/// reserved handlers and the endpoint.
///
/// A value (or an answer) larger than the transport's largest Medium leaves as *parts*:
/// requests of the reserved part handler, each one full Medium, then the message itself
/// (call, post or answer) carrying the last piece and the stream. A part's arguments are
/// its stream (a number the sender chose) and its index; the first also carries the
/// value's whole length, which the target charges against the sender's bound before it
/// holds anything. A transport delivers one sender's messages in order, so the parts have
/// all come when the message does; the target checks that they are all there, in order,
/// and runs the whole. A sender that gives up a value half sent cancels its stream.
///
/// An answer that cannot leave as the handler's reply (too large for one, or given later
/// by an [`Answer`]) is queued here, and the endpoint sends it as requests from its polls.
#[derive(Debug, Default)]
pub(crate) struct Transit {
    state: std::sync::Mutex<TransitState>,
    /// Items queued: a poll looks here without taking the lock. Changed under the lock.
    queued: std::sync::atomic::AtomicUsize,
    /// This rank's largest AM Medium, set when its endpoint is made.
    max_medium: std::sync::atomic::AtomicUsize,
    /// The next stream number this rank sends parts under.
    next_stream: std::sync::atomic::AtomicU32,
    /// Values moved by rendezvous ([`staging`]), both ways.
    staging: std::sync::Mutex<staging::Staging>,
    /// The buffer large values arriving are copied (by rendezvous) or joined (from
    /// parts) into, kept from one to the next.
    inbox: std::sync::Mutex<Vec<u8>>,
    /// Whether this rank's transport maps peers' created segments: it takes values by
    /// rendezvous only then.
    maps: std::sync::atomic::AtomicBool,
    /// Whether this rank sends large values by rendezvous (it maps, and
    /// [`crate::Config::typed_rendezvous`]).
    rendezvous: std::sync::atomic::AtomicBool,
    /// Values and answers this rank staged for a rendezvous ([`crate::Stats::typed_staged`]).
    staged: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Default)]
struct TransitState {
    /// Values arriving, by sender and stream.
    parts: rustc_hash::FxHashMap<(Rank, u32), Parts>,
    /// What `parts` is charged per sender: no peer makes this rank hold more than
    /// [`MAX_LEN`] of its values at once.
    held: rustc_hash::FxHashMap<Rank, usize>,
    /// What waits to leave, oldest first.
    queue: std::collections::VecDeque<Queued>,
}

#[derive(Debug)]
struct Parts {
    bytes: Vec<u8>,
    /// The whole value's length, as its first part declared it.
    total: usize,
    /// The index the next part must have.
    next: u32,
    /// What the stream is charged against its sender's bound.
    charged: usize,
    /// Why its message will be refused, once it is (its bytes then dropped).
    refused: Option<Refusal>,
}

/// The largest buffer kept for the next value moved by rendezvous.
const INBOX_KEEP: usize = 64 << 20;

/// What each stream costs against its sender's bound beyond its bytes.
const PART_COST: usize = 64;

/// A part's index that cancels its stream.
pub(crate) const CANCEL: u32 = u32::MAX;

/// What waits in [`Transit`] to leave as requests.
#[derive(Debug)]
pub(crate) enum Queued {
    /// An answer that leaves as requests.
    Answer(QueuedAnswer),
    /// A stream `dest` holds parts of, given up before its last message.
    Cancel {
        /// The target.
        dest: Rank,
        /// The stream.
        stream: u32,
    },
}

impl Queued {
    /// Where it goes.
    pub(crate) fn dest(&self) -> Rank {
        match self {
            Queued::Answer(a) => a.dest,
            Queued::Cancel { dest, .. } => *dest,
        }
    }
}

/// An answer leaving as requests: parts if it is larger than a Medium, then the answer.
#[derive(Debug)]
pub(crate) struct QueuedAnswer {
    /// The caller.
    pub(crate) dest: Rank,
    /// The call's number.
    pub(crate) number: u32,
    /// Its status word.
    pub(crate) status: u32,
    /// The stream its parts go under, and whether parts of it have left already (an
    /// answer given up half sent ends the stream it started).
    pub(crate) stream: u32,
    pub(crate) stream_used: bool,
    /// The answer's bytes.
    pub(crate) bytes: Vec<u8>,
    /// How many of them have left as parts.
    pub(crate) sent: usize,
}

/// The arguments of part `index` of `stream`, for a value of `total` bytes: the first
/// carries the length.
pub(crate) fn part_words(stream: u32, index: u32, total: usize) -> ([u32; 4], usize) {
    if index == 0 {
        let total = total as u64;
        ([stream, 0, total as u32, (total >> 32) as u32], 4)
    } else {
        ([stream, index, 0, 0], 2)
    }
}

/// How a value of `len` bytes leaves over Mediums of `max` bytes: the bytes sent ahead as
/// parts (whole Mediums), the rest with the message.
pub(crate) fn ahead_of_last(len: usize, max: usize) -> usize {
    let max = max.max(1);
    if len <= max {
        0
    } else {
        len - ((len - 1) % max + 1)
    }
}

impl Transit {
    fn lock(&self) -> std::sync::MutexGuard<'_, TransitState> {
        // A panic elsewhere while the lock was held left the maps whole: go on with them.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Sets this rank's largest Medium (the endpoint's limit).
    pub(crate) fn set_max_medium(&self, max: usize) {
        self.max_medium
            .store(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets whether this rank's transport maps peers' created segments
    /// ([`crate::Capabilities::map_segments`]), so that it takes values by rendezvous, and
    /// whether it sends them so.
    pub(crate) fn set_maps(&self, maps: bool, send: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        self.maps.store(maps, Relaxed);
        self.rendezvous.store(maps && send, Relaxed);
    }

    fn staging(&self) -> std::sync::MutexGuard<'_, staging::Staging> {
        // A panic elsewhere while the lock was held left the maps whole: go on with them.
        self.staging.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stages `bytes` for `dest` ([`staging`]): copied into this rank's staging segment,
    /// with the descriptor to send. `None` where values do not move by rendezvous, or
    /// nothing is free in the staging segment: the value goes in parts.
    pub(crate) fn stage(&self, dest: Rank, bytes: &[u8]) -> Option<staging::Staged> {
        if !self.rendezvous.load(std::sync::atomic::Ordering::Relaxed) {
            return None;
        }
        let (seg, staged) = self.staging().stage(dest, bytes.len())?;
        // The region is this value's alone until its descriptor leaves: written unlocked.
        match seg.byte_area().write(staged.offset(), bytes) {
            Ok(()) => {
                self.staged
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Some(staged)
            }
            Err(_) => {
                self.unstage(&staged);
                None
            }
        }
    }

    /// Encodes `v` for `dest` once, as it starts: into a private buffer while it fits one
    /// Medium of `max_medium` bytes (or wherever values do not move by rendezvous), then,
    /// once it is longer, straight into a region of this rank's staging segment (what was
    /// written so far copied in first): no private copy of a large value in between. A
    /// value longer than the largest free run, or where nothing is free, is encoded into a
    /// private buffer (and goes as [`Transit::stage`]'s values do).
    pub(crate) fn encode_late<T: Serialize>(
        &self,
        dest: Rank,
        v: &T,
        max_medium: usize,
    ) -> Result<Late, crate::AmError> {
        let rendezvous = self.rendezvous.load(std::sync::atomic::Ordering::Relaxed);
        let mut out = LateOut {
            transit: self,
            dest,
            private: Spilling::<{ usize::MAX }>(Vec::new()),
            limit: if rendezvous { max_medium } else { usize::MAX },
            staged: None,
        };
        let written = bincode::serde::encode_into_std_write(v, &mut out, WIRE).and_then(|_| {
            std::io::Write::flush(&mut out)
                .map_err(|inner| bincode::error::EncodeError::Io { inner, index: 0 })
        });
        match (written, out.staged.take()) {
            (Ok(_), None) => Ok(Late::Bytes(out.private.0)),
            (Ok(_), Some((mut staged, seg))) => {
                let len = seg.at - staged.offset();
                self.staging().shrink(&mut staged, len);
                self.staged
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(Late::Staged(staged))
            }
            (Err(e), staged) => {
                let overflowed = staged.as_ref().is_some_and(|(_, seg)| seg.full);
                if let Some((staged, _)) = staged {
                    self.unstage(&staged);
                }
                if overflowed {
                    // Longer than the run it was given: privately, whole.
                    return encoded(v).map(Late::Bytes);
                }
                Err(unencodable::<T>(e))
            }
        }
    }

    /// How many values and answers this rank staged for a rendezvous.
    pub(crate) fn staged(&self) -> u64 {
        self.staged.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Frees `staged`: its descriptor never left.
    pub(crate) fn unstage(&self, staged: &staging::Staged) {
        self.staging().unstage(staged);
    }

    /// The bytes a descriptor from `src` names ([`staging`]), copied out of its staging
    /// segment into the first bytes of `buf` and released there: how many. Refused where
    /// this rank does not map peers' segments.
    pub(crate) fn fetch_into(
        &self,
        src: Rank,
        slot: u32,
        desc: &[u8],
        buf: &mut Vec<u8>,
    ) -> Result<usize, Refusal> {
        if !self.maps.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(Refusal::Undecodable);
        }
        // Located under the lock, copied outside it.
        let (seg, at) = self.staging().locate(src, slot, desc)?;
        staging::fetch_into(&seg, slot, at, buf)
    }

    /// [`Transit::fetch_into`] a buffer of its own.
    pub(crate) fn fetch(&self, src: Rank, slot: u32, desc: &[u8]) -> Result<Vec<u8>, Refusal> {
        let mut buf = Vec::new();
        self.fetch_into(src, slot, desc, &mut buf)?;
        Ok(buf)
    }

    /// The buffer large values arriving are copied or joined into before they are decoded,
    /// kept from one to the next (a fresh one of a large value's size costs a page fault a page
    /// where the allocator returns freed memory to the system).
    fn take_inbox(&self) -> Vec<u8> {
        std::mem::take(&mut *self.inbox.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Keeps `buf` for the next large value arriving ([`keep_larger`]).
    fn put_inbox(&self, buf: Vec<u8>) {
        keep_larger(
            &mut self.inbox.lock().unwrap_or_else(|p| p.into_inner()),
            buf,
        );
    }

    /// This rank's largest Medium.
    pub(crate) fn max_medium(&self) -> usize {
        self.max_medium.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A stream number for parts this rank sends.
    pub(crate) fn next_stream(&self) -> u32 {
        self.next_stream
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }

    /// A part from `src` came, with arguments `args` ([`part_words`], or a cancel). A stream
    /// is charged its declared length and a fixed cost when its first part comes, against
    /// what `src` may make this rank hold ([`MAX_LEN`]); one that does not fit, a part out
    /// of order, or bytes past the declared length refuse the stream (its bytes dropped,
    /// the fixed cost kept until its message comes). Arguments of no known form are
    /// ignored.
    pub(crate) fn add_part(&self, src: Rank, args: &[u32], bytes: &[u8]) {
        self.add_part_within(src, args, bytes, MAX_LEN);
    }

    /// [`Transit::add_part`] with `bound` in place of [`MAX_LEN`].
    fn add_part_within(&self, src: Rank, args: &[u32], bytes: &[u8], bound: usize) {
        let s = &mut *self.lock();
        let held = s.held.entry(src).or_insert(0);
        match *args {
            [stream, CANCEL] => {
                if let Some(p) = s.parts.remove(&(src, stream)) {
                    *held -= p.charged;
                }
            }
            [stream, 0, lo, hi] => {
                let total =
                    usize::try_from(u64::from(lo) | u64::from(hi) << 32).unwrap_or(usize::MAX);
                if let Some(p) = s.parts.get_mut(&(src, stream)) {
                    // A stream opened twice.
                    refuse(p, held, Refusal::Undecodable);
                    return;
                }
                let charge = total.saturating_add(PART_COST);
                let mut open = Parts {
                    bytes: Vec::new(),
                    total,
                    next: 1,
                    charged: PART_COST,
                    refused: None,
                };
                if bytes.len() > total {
                    open.refused = Some(Refusal::Undecodable);
                } else if total > MAX_LEN
                    || held.saturating_add(charge) > bound
                    || !self.reserve_join(&mut open.bytes, total)
                {
                    open.refused = Some(Refusal::TooLarge);
                } else {
                    open.bytes.extend_from_slice(bytes);
                    open.charged = charge;
                }
                // A refused stream is remembered (so that its message is refused as such)
                // only while its fixed cost fits.
                if held.saturating_add(open.charged) <= bound {
                    *held += open.charged;
                    s.parts.insert((src, stream), open);
                }
            }
            [stream, index] => {
                let Some(p) = s.parts.get_mut(&(src, stream)) else {
                    return;
                };
                if p.refused.is_some() {
                    return;
                }
                if index != p.next || p.bytes.len() + bytes.len() > p.total {
                    refuse(p, held, Refusal::Undecodable);
                    return;
                }
                p.bytes.extend_from_slice(bytes);
                p.next += 1;
            }
            _ => {}
        }
    }

    /// Makes room in `buf` for a value of `total` bytes arriving in parts: the kept buffer
    /// ([`Transit::take_inbox`]) for a large one. Whether there is room.
    fn reserve_join(&self, buf: &mut Vec<u8>, total: usize) -> bool {
        if total >= SPILL {
            *buf = self.take_inbox();
            buf.clear();
        }
        buf.try_reserve_exact(total).is_ok()
    }

    /// Stream `stream` from `src` ends with `last`: its whole value, or why none.
    pub(crate) fn take_parts(
        &self,
        src: Rank,
        stream: u32,
        last: &[u8],
    ) -> Result<Vec<u8>, Refusal> {
        let s = &mut *self.lock();
        let Some(parts) = s.parts.remove(&(src, stream)) else {
            // Parts come before the message that ends them: none means the peer sent none.
            return Err(Refusal::Undecodable);
        };
        if let Some(h) = s.held.get_mut(&src) {
            *h -= parts.charged;
        }
        if let Some(refusal) = parts.refused {
            return Err(refusal);
        }
        if parts.bytes.len() + last.len() != parts.total {
            return Err(Refusal::Undecodable);
        }
        let mut bytes = parts.bytes;
        bytes.extend_from_slice(last);
        Ok(bytes)
    }

    /// Queues an answer that leaves as requests: one too large for a reply, or an
    /// [`Answer`]'s that was given up (`stream`: the stream it had sent parts under).
    pub(crate) fn queue(
        &self,
        dest: Rank,
        number: u32,
        status: u32,
        bytes: Vec<u8>,
        stream: Option<u32>,
    ) {
        let answer = QueuedAnswer {
            dest,
            number,
            status,
            stream: stream.unwrap_or_else(|| self.next_stream()),
            stream_used: stream.is_some(),
            bytes,
            sent: 0,
        };
        self.push_back(Queued::Answer(answer));
    }

    /// Queues the cancel of `stream`, whose parts `dest` holds.
    pub(crate) fn cancel(&self, dest: Rank, stream: u32) {
        self.push_back(Queued::Cancel { dest, stream });
    }

    fn push_back(&self, q: Queued) {
        let mut s = self.lock();
        s.queue.push_back(q);
        self.queued
            .store(s.queue.len(), std::sync::atomic::Ordering::Release);
    }

    /// Whether anything waits to leave.
    #[inline]
    pub(crate) fn has_queued(&self) -> bool {
        self.queued.load(std::sync::atomic::Ordering::Acquire) != 0
    }

    /// The oldest item waiting to leave, taken out: the endpoint sends it without holding
    /// the lock (a send that finds a peer lost forgets it here), and puts it back first
    /// ([`Transit::put_back`]) if the device or the credits refuse.
    pub(crate) fn take_queued(&self) -> Option<Queued> {
        let mut s = self.lock();
        let q = s.queue.pop_front();
        self.queued
            .store(s.queue.len(), std::sync::atomic::Ordering::Release);
        q
    }

    /// Puts `q` back first in line.
    pub(crate) fn put_back(&self, q: Queued) {
        let mut s = self.lock();
        s.queue.push_front(q);
        self.queued
            .store(s.queue.len(), std::sync::atomic::Ordering::Release);
    }

    /// Forgets what `peer` sent in parts and what waits to leave for it (it is gone).
    pub(crate) fn forget(&self, peer: Rank) {
        let mut s = self.lock();
        s.parts.retain(|&(src, _), _| src != peer);
        s.held.remove(&peer);
        s.queue.retain(|q| q.dest() != peer);
        self.queued
            .store(s.queue.len(), std::sync::atomic::Ordering::Release);
        drop(s);
        self.staging().forget(peer);
    }
}

/// Refuses stream `p` for `why`: its bytes dropped, its charge down to the fixed cost.
fn refuse(p: &mut Parts, held: &mut usize, why: Refusal) {
    *held -= p.charged - PART_COST;
    p.charged = PART_COST;
    p.bytes = Vec::new();
    p.refused = Some(why);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Batch {
        keys: Vec<u64>,
        name: String,
    }

    /// Catches a decoder that takes a prefix and ignores the rest, and one that trusts a
    /// declared length past the bytes present.
    #[test]
    fn decode_takes_all_the_bytes_and_nothing_past_them() {
        let b = Batch {
            keys: vec![1, 2, 3],
            name: "x".into(),
        };
        let bytes = encode(&b).unwrap();
        assert_eq!(decode::<Batch>(&bytes), Some(b));
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(decode::<Batch>(&longer), None, "trailing bytes");
        for cut in 0..bytes.len() {
            assert_eq!(decode::<Batch>(&bytes[..cut]), None, "cut at {cut}");
        }
        // A sequence that says it holds 2^62 elements, in eight bytes.
        let bomb = 0x3fff_ffff_ffff_ffffu64.to_le_bytes();
        assert_eq!(decode::<Vec<u64>>(&bomb), None);
        assert_eq!(decode::<String>(&bomb), None);
        assert_eq!(decode::<Blob>(&bomb), None);
    }

    /// A type that occupies bytes in memory and none on the wire.
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Skipped {
        #[serde(skip)]
        x: u64,
    }

    /// `n` as a sequence's or map's declared length.
    fn count(n: u64) -> [u8; 8] {
        n.to_le_bytes()
    }

    /// Catches a decoder that believes a sequence's or map's declared length where its
    /// elements occupy no bytes, and loops over it: eight forged bytes declaring 2^62 of
    /// them kept it busy for years. Also catches a budget that is not shared between
    /// sequences, or off by one at its edge.
    #[test]
    fn elements_that_occupy_no_bytes_cannot_keep_the_decoder_looping() {
        use std::collections::BTreeMap;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let bomb = count(0x3fff_ffff_ffff_ffff);
            let _ = tx.send([
                decode::<Vec<()>>(&bomb).is_none(),
                decode::<Vec<Skipped>>(&bomb).is_none(),
                decode::<Vec<[u64; 0]>>(&bomb).is_none(),
                decode::<BTreeMap<(), ()>>(&bomb).is_none(),
                decode::<Vec<Vec<()>>>(&[count(1), bomb].concat()).is_none(),
            ]);
        });
        let refused = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the decoder is still looping after a minute");
        assert_eq!(refused, [true; 5]);

        // Eight bytes allow 8 + ELEMENTS_PAST_BYTES elements, and not one more.
        let most = 8 + depth::ELEMENTS_PAST_BYTES;
        let v = decode::<Vec<()>>(&count(most as u64)).expect("the most allowed");
        assert_eq!(v.len(), most);
        assert_eq!(decode::<Vec<()>>(&count(most as u64 + 1)), None);
        // The budget is the whole value's: two sequences of 40,000 each fit alone, not
        // together (24 bytes).
        let half = count(40_000);
        assert!(decode::<Vec<Vec<()>>>(&[count(1), half].concat()).is_some());
        assert_eq!(
            decode::<Vec<Vec<()>>>(&[count(2), half, half].concat()),
            None
        );
        // Elements that occupy bytes never run out: each takes at least one.
        let bytes: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        assert_eq!(decode::<Vec<u8>>(&encode(&bytes).unwrap()), Some(bytes));
        let map: BTreeMap<u8, ()> = (0..=255).map(|k| (k, ())).collect();
        assert_eq!(
            decode::<BTreeMap<u8, ()>>(&encode(&map).unwrap()),
            Some(map)
        );
    }

    /// A type that occupies no bytes on the wire and 1.5 KiB in memory: a field the wire
    /// skips that holds an array. Its size divides the memory budget of eight bytes, so a
    /// budget off by one at its edge shows.
    #[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
    struct Heavy {
        #[serde(skip)]
        pad: [[u64; 32]; 6],
    }

    /// Catches a decoder that allocates for each element what its type takes in memory,
    /// whatever it occupied on the wire: eight forged bytes declaring 65,536 elements of
    /// [`Heavy`] made 96 MiB (of a 64 KiB array, 4 GiB), and a map's values, charged
    /// nothing, made 92 MB from 240 KB. Also catches a budget off by one at its edge.
    #[test]
    fn elements_large_in_memory_cannot_make_a_few_bytes_into_gigabytes() {
        use std::collections::{BTreeMap, BTreeSet};
        let size = std::mem::size_of::<Heavy>();
        // The most that fit in the memory of eight bytes (before the element count runs
        // out): n * 1536 <= 64 * 8 + MEMORY_PAST_BYTES, exactly.
        let budget = depth::MEMORY_PER_BYTE * 8 + depth::MEMORY_PAST_BYTES;
        assert_eq!(budget % size, 0, "the edge is exact");
        let most = budget / size;
        assert!(most < depth::ELEMENTS_PAST_BYTES);
        let v = decode::<Vec<Heavy>>(&count(most as u64)).expect("the most allowed");
        assert_eq!(v.len(), most);
        drop(v);
        assert!(decode::<Vec<Heavy>>(&count(most as u64 + 1)).is_none());
        // 60,000 entries of a 4-byte key and a `Heavy`: 240 KB on the wire, 92 MB in
        // memory against a budget of 82 MB.
        let keys: Vec<u8> = (0..60_000u32).flat_map(|k| k.to_le_bytes()).collect();
        let entries = [&count(60_000)[..], &keys].concat();
        assert!(decode::<BTreeMap<u32, Heavy>>(&entries).is_none());
        // The keys alone fit.
        assert_eq!(
            decode::<BTreeSet<u32>>(&entries).map(|s| s.len()),
            Some(60_000)
        );
    }

    /// Catches a decoder that charges an element behind a pointer (a `Box`; an `Rc` or `Arc`
    /// decodes as one with serde's `rc` feature) its pointer's size alone: eight forged bytes
    /// declaring 65,536 `Box<Heavy>` made 100 MB, and each byte of a vector of
    /// `Box<Option<Heavy>>` 1.5 KiB. Also catches boxed
    /// values that no longer decode, and an `Option<Box<..>>` of `None` charged the
    /// pointee it does not have (50,000 of them charged 1.5 KiB each would be refused).
    #[test]
    fn what_elements_hold_behind_pointers_is_charged_too() {
        let size = std::mem::size_of::<Heavy>();
        let budget = depth::MEMORY_PER_BYTE * 8 + depth::MEMORY_PAST_BYTES;
        // Each element takes its pointee before it is decoded, then its pointer.
        let each = size + std::mem::size_of::<Box<Heavy>>();
        let most = budget / each;
        assert!(
            budget % each < size,
            "the next pointee is refused, not its pointer"
        );
        let v = decode::<Vec<Box<Heavy>>>(&count(most as u64)).expect("the most allowed");
        assert_eq!(v.len(), most);
        drop(v);
        assert!(decode::<Vec<Box<Heavy>>>(&count(most as u64 + 1)).is_none());
        // A pointee in an option, in a variant: 60,000 elements of five bytes (a variant's
        // index and a `None`) would each allocate a `Heavy`, 92 MB against a budget of 86 MB;
        // a thousand fit. The same in a vector of one-byte `None`s.
        #[derive(Debug, Serialize, Deserialize)]
        enum Shelf {
            Full(Box<Option<Heavy>>),
        }
        let shelves = |n: usize| [&count(n as u64)[..], &vec![0u8; 5 * n]].concat();
        assert_eq!(
            decode::<Vec<Shelf>>(&shelves(1000)).map(|v| v.len()),
            Some(1000)
        );
        assert!(decode::<Vec<Shelf>>(&shelves(60_000)).is_none());
        let nones = |n: usize| [&count(n as u64)[..], &vec![0u8; n]].concat();
        let fit = decode::<Vec<Box<Option<Heavy>>>>(&nones(1000));
        assert_eq!(fit.map(|v| v.len()), Some(1000));
        assert!(decode::<Vec<Box<Option<Heavy>>>>(&nones(60_000)).is_none());
        // Boxed values decode; a `None` has no pointee to charge.
        let boxed: Vec<Box<u64>> = (0..100_000).map(Box::new).collect();
        assert_eq!(
            decode::<Vec<Box<u64>>>(&encode(&boxed).unwrap()),
            Some(boxed)
        );
        let none: Vec<Option<Box<Heavy>>> = (0..50_000).map(|_| None).collect();
        let back = decode::<Vec<Option<Box<Heavy>>>>(&encode(&none).unwrap());
        assert_eq!(back.map(|v| v.len()), Some(50_000));
    }

    /// A byte buffer that asks for one (`deserialize_byte_buf`), as `serde_bytes` does.
    #[derive(Debug, PartialEq)]
    struct Blob(Vec<u8>);

    impl Serialize for Blob {
        fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(&self.0)
        }
    }

    impl<'de> Deserialize<'de> for Blob {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl serde::de::Visitor<'_> for V {
                type Value = Blob;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("bytes")
                }
                fn visit_bytes<E>(self, b: &[u8]) -> Result<Blob, E> {
                    Ok(Blob(b.to_vec()))
                }
                fn visit_byte_buf<E>(self, b: Vec<u8>) -> Result<Blob, E> {
                    Ok(Blob(b))
                }
            }
            d.deserialize_byte_buf(V)
        }
    }

    /// Catches byte buffers and strings asked for as owned (and given borrowed, copied out
    /// once) that decode wrong, or take a declared length past the bytes present.
    #[test]
    fn owned_strings_and_byte_buffers_decode_from_borrowed_bytes() {
        let v = (
            Blob((0..100_000u32).map(|i| (i * 13) as u8).collect()),
            "é".repeat(500),
        );
        let bytes = encode(&v).unwrap();
        assert_eq!(decode::<(Blob, String)>(&bytes), Some(v));
        for cut in [1, 8, 9, 50_000, bytes.len() - 1] {
            assert_eq!(
                decode::<(Blob, String)>(&bytes[..cut]),
                None,
                "cut at {cut}"
            );
        }
    }

    /// The arguments of part `index` of `stream` for a value of `total` bytes.
    fn args(stream: u32, index: u32, total: usize) -> Vec<u32> {
        let (w, n) = part_words(stream, index, total);
        w[..n].to_vec()
    }

    /// Catches parts joined out of order, with one missing or doubled, or past the length
    /// the first declared (each refused, never run on what was kept), and a cancel that
    /// leaves a stream or its charge behind.
    #[test]
    fn parts_join_only_whole_and_in_order() {
        let t = Transit::default();
        t.add_part(1, &args(3, 0, 7), &[1, 2]);
        t.add_part(1, &args(3, 1, 7), &[3, 4]);
        assert_eq!(
            t.take_parts(1, 3, &[5, 6, 7]),
            Ok(vec![1, 2, 3, 4, 5, 6, 7])
        );
        // A part skipped, one doubled, bytes past the length, a short value.
        t.add_part(1, &args(4, 0, 7), &[1, 2]);
        t.add_part(1, &args(4, 2, 7), &[3, 4]);
        assert_eq!(t.take_parts(1, 4, &[5]), Err(Refusal::Undecodable));
        t.add_part(1, &args(5, 0, 7), &[1, 2]);
        t.add_part(1, &args(5, 1, 7), &[3, 4]);
        t.add_part(1, &args(5, 1, 7), &[3, 4]);
        assert_eq!(t.take_parts(1, 5, &[5]), Err(Refusal::Undecodable));
        t.add_part(1, &args(6, 0, 3), &[1, 2, 3, 4]);
        assert_eq!(t.take_parts(1, 6, &[]), Err(Refusal::Undecodable));
        t.add_part(1, &args(7, 0, 9), &[1, 2]);
        assert_eq!(t.take_parts(1, 7, &[3]), Err(Refusal::Undecodable));
        // A later part of a stream never opened opens nothing.
        t.add_part(1, &args(8, 1, 9), &[1]);
        assert_eq!(t.take_parts(1, 8, &[]), Err(Refusal::Undecodable));
        // A cancel frees the stream and its charge.
        t.add_part(1, &args(9, 0, 1000), &[1; 10]);
        t.add_part(1, &[9, CANCEL], &[]);
        assert_eq!(t.take_parts(1, 9, &[]), Err(Refusal::Undecodable));
        assert!(t.lock().parts.is_empty());
        assert_eq!(t.lock().held.get(&1), Some(&0));
    }

    /// Catches a peer that makes this rank hold more than the bound (with one stream, with
    /// many, with empty ones), a refused stream whose message runs on what was kept, a
    /// refusal not remembered (so that a later part opens the stream headless), and a
    /// bound never given back once values are taken.
    #[test]
    fn parts_are_bounded_per_peer() {
        let t = Transit::default();
        let bound = 1000 + PART_COST;
        // A declared length past the bound is refused as such, before anything is held.
        t.add_part_within(1, &args(1, 0, 2000), &[0; 10], bound);
        t.add_part_within(1, &args(1, 1, 2000), &[0; 10], bound);
        assert_eq!(t.take_parts(1, 1, &[]), Err(Refusal::TooLarge));
        // One that fits holds its whole length; another peer has a bound of its own.
        t.add_part_within(1, &args(2, 0, 1000), &[1; 500], bound);
        t.add_part_within(2, &args(2, 0, 1000), &[2; 500], bound);
        // A second stream does not fit beside it: refused, and remembered while its fixed
        // cost fits (here it does not: nothing is opened, and the last message is refused).
        t.add_part_within(1, &args(3, 0, 10), &[3; 5], bound);
        t.add_part_within(1, &args(3, 1, 10), &[3; 5], bound);
        assert!(t.take_parts(1, 3, &[]).is_err());
        assert_eq!(t.take_parts(1, 2, &[1; 500]).map(|b| b.len()), Ok(1000));
        // Empty streams are charged their fixed cost: no unbounded map of them.
        for stream in 10..100 {
            t.add_part_within(1, &args(stream, 0, 0), &[], bound);
        }
        let open = t.lock().parts.keys().filter(|k| k.0 == 1).count();
        assert_eq!(open, bound / PART_COST);
        for stream in 10..100 {
            let _ = t.take_parts(1, stream, &[]);
        }
        // Everything given back: a whole bound fits again.
        t.add_part_within(1, &args(5, 0, 1000), &[1; 999], bound);
        assert_eq!(t.take_parts(1, 5, &[2]).map(|b| b.len()), Ok(1000));
        assert_eq!(t.take_parts(2, 2, &[2; 500]).map(|b| b.len()), Ok(1000));
        assert!(t.lock().parts.is_empty());
        assert!(t.lock().held.values().all(|&h| h == 0));
    }

    /// Catches an id that ignores the shape (two layouts of one name would pass start-up).
    #[test]
    fn ids_depend_on_name_and_shape() {
        assert_ne!(id_of("a::B", 0), id_of("a::B", 1));
        assert_ne!(id_of("a::B", 0), id_of("a::C", 0));
        assert_eq!(id_of("a::B", 7), id_of("a::B", 7));
    }
}
