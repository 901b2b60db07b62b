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
//! use am_core::typed::{Am, AmContext, Shape};
//! use am_core::{Config, Handlers, Loopback, Node};
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
//! am_core::run_ranks(Loopback::cluster(2, Default::default()), |t| {
//!     let mut handlers = Handlers::new();
//!     handlers.typed::<Square>().unwrap();
//!     let mut node = Node::new(t, handlers, Config::default()).unwrap();
//!     let peer = 1 - node.rank();
//!     assert_eq!(node.call_typed(peer, Square(12)).unwrap(), 144);
//!     node.barrier().unwrap();
//! });
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
//! # Wire
//! A typed message is an AM Medium to one of two handlers the table reserves at the first
//! typed registration (a call's, answered, and a post's), whose arguments carry the type's
//! id ([`type_id`]) and whose payload is the value in postcard's format. A call's answer is
//! a Medium whose first argument says whether the target ran it, and whose payload is the
//! answer's value.
//!
//! # Bad input
//! Bytes that do not decode as the named type (cut short, bytes left over, a length past the
//! payload), an id the target does not register, or an answer that does not decode, end the
//! call with [`crate::AmError::TypedRefused`] naming the peer; the target runs nothing.
//! Decoding never allocates more than the payload's length for a declared length: postcard
//! reads a sequence's length, and serde's sequence visitors reserve at most what a cautious
//! bound allows, growing only as elements are read from the bytes present.

use std::marker::PhantomData;

use serde::{de::DeserializeOwned, Serialize};

use crate::types::Rank;

pub mod shape;
/// `#[derive(Shape)]`: implements [`Shape`] for a struct or enum from its definition.
pub use am_derive::Shape;
pub use shape::Shape;

/// A typed active message: the value travels to the target, which runs [`Am::exec`] on it
/// inside progress (as a handler does) and answers with its [`Am::Reply`].
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

/// What a typed message's code knows of where it runs.
#[derive(Debug)]
#[non_exhaustive]
pub struct AmContext {
    pub(crate) src: Rank,
}

impl AmContext {
    /// The rank that sent the message.
    pub fn src(&self) -> Rank {
        self.src
    }
}

/// A type's id on the wire: an FNV-1a hash of its path (`std::any::type_name`) and its
/// [`Am::SHAPE`], the same on every rank built from the same source.
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
    /// The answer did not decode as the type's [`Am::Reply`], or carried no status.
    BadAnswer,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Refusal::UnknownType => "the target registers no such type",
            Refusal::Undecodable => "the target could not decode the message",
            Refusal::BadAnswer => "the answer did not decode as the reply type",
        })
    }
}

/// Status words of a typed call's answer (its first argument).
pub(crate) const ANSWER_OK: u32 = 0;
pub(crate) const ANSWER_UNKNOWN: u32 = 1;
pub(crate) const ANSWER_UNDECODABLE: u32 = 2;
pub(crate) const ANSWER_BAD: u32 = 3;

/// The length of `v` on the wire (postcard's format).
pub fn encoded_len<T: Serialize>(v: &T) -> Result<usize, crate::AmError> {
    encode(v)
        .map(|b| b.len())
        .map_err(|_| crate::AmError::TypedTooLarge {
            len: usize::MAX,
            max: 0,
        })
}

/// `v` in postcard's format.
pub(crate) fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, postcard::Error> {
    // Room for a small value at once: growing from empty reallocates at each doubling.
    postcard::to_extend(v, Vec::with_capacity(64))
}

/// The value `bytes` hold, all of them: a value followed by more bytes is refused.
pub(crate) fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Option<T> {
    match postcard::take_from_bytes(bytes) {
        Ok((v, [])) => Some(v),
        _ => None,
    }
}

/// The outcome of a typed call ([`crate::Node::call_typed_nb`]'s handle is an
/// `Op<Typed<R>>`): waiting for it gives the decoded answer, an `R`.
pub struct Typed<R>(PhantomData<fn() -> R>);

impl<R> std::fmt::Debug for Typed<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Typed")
    }
}

/// The code of a typed entry, `Send` ones.
pub type SendTypedFn = dyn FnMut(&[u8], &mut AmContext, &mut Vec<u8>) -> Result<(), Refusal> + Send;
/// The code of a typed entry.
pub type TypedFn = dyn FnMut(&[u8], &mut AmContext, &mut Vec<u8>) -> Result<(), Refusal>;

/// `M`'s entry: decodes the payload as an `M`, runs `f`, encodes its answer into `out`
/// (the dispatcher's buffer, kept from one message to the next so that answering allocates
/// nothing once it has grown).
pub(crate) fn runner<M: Am>(
    mut f: impl FnMut(M, &mut AmContext) -> M::Reply,
) -> impl FnMut(&[u8], &mut AmContext, &mut Vec<u8>) -> Result<(), Refusal> {
    move |bytes, cx, out| {
        let msg: M = decode(bytes).ok_or(Refusal::Undecodable)?;
        let answer = f(msg, cx);
        let mut buf = std::mem::take(out);
        buf.clear();
        *out = postcard::to_extend(&answer, buf).map_err(|_| Refusal::BadAnswer)?;
        Ok(())
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
/// type). The answer's status and bytes.
pub(crate) fn dispatch(
    msg: &crate::Msg<'_>,
    out: &mut Vec<u8>,
    run: impl FnOnce(u64, &[u8], &mut AmContext, &mut Vec<u8>) -> Option<Result<(), Refusal>>,
) -> u32 {
    let mut cx = AmContext { src: msg.src() };
    let Some(id) = id_from(msg.args()) else {
        return ANSWER_UNDECODABLE;
    };
    match run(id, msg.payload(), &mut cx, out) {
        None => ANSWER_UNKNOWN,
        Some(Ok(())) => ANSWER_OK,
        Some(Err(Refusal::Undecodable)) => ANSWER_UNDECODABLE,
        Some(Err(_)) => ANSWER_BAD,
    }
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
        // A sequence that says it holds 2^62 elements, in five bytes.
        let bomb = [0xff, 0xff, 0xff, 0xff, 0x3f];
        assert_eq!(decode::<Vec<u64>>(&bomb), None);
        assert_eq!(decode::<String>(&bomb), None);
    }

    /// Catches an id that ignores the shape (two layouts of one name would pass start-up).
    #[test]
    fn ids_depend_on_name_and_shape() {
        assert_ne!(id_of("a::B", 0), id_of("a::B", 1));
        assert_ne!(id_of("a::B", 0), id_of("a::C", 0));
        assert_eq!(id_of("a::B", 7), id_of("a::B", 7));
    }
}
