//! The serde shape fingerprint of a type ([`Shape`]): a 64-bit hash, computed at compile
//! time, of the kind of value serde's data model makes of it, its name, and its fields'
//! names and types in order, that a typed message's id includes ([`super::Am::SHAPE`]).
//!
//! Hashes are FNV-1a 64 ([`fnv`]); a string enters as its own hash ([`leaf`]), a nested
//! hash or a count as its 8 little-endian bytes ([`fold`]). A hand-written impl folds the
//! same way:
//!
//! ```
//! use amnet::typed::shape::{fold, leaf};
//! use amnet::typed::Shape;
//!
//! /// Serialized by a `serialize_with` as its seconds, a `u64`.
//! struct Stamp(std::time::SystemTime);
//!
//! impl Shape for Stamp {
//!     const SHAPE: u64 = fold(leaf("Stamp as seconds"), <u64 as Shape>::SHAPE);
//! }
//!
//! fn main() {
//! }
//! ```
//!
//! # Recursive types
//! A field whose type names the type itself (`Vec<Tree>`, `Option<Box<Self>>`) enters the
//! derived hash by its type as written, the type's own fields being hashed already. A
//! recursion through another type is a cycle in const evaluation, a compile error where
//! the `SHAPE` is used:
//!
//! ```compile_fail,E0391
//! use amnet::typed::Shape;
//!
//! #[derive(Shape)]
//! struct Dir {
//!     entries: Vec<Entry>,
//! }
//! #[derive(Shape)]
//! struct Entry {
//!     name: String,
//!     dir: Option<Box<Dir>>,
//! }
//! let _ = <Dir as Shape>::SHAPE;
//! ```
//!
//! `#[shape(by_name)]` on one field of the cycle breaks it (that field's type then counts
//! by its name as written, so a change inside it shows in the type's own `SHAPE`, not
//! through this field):
//!
//! ```
//! # use amnet::typed::Shape;
//! # #[derive(Shape)]
//! # struct Dir {
//! #     entries: Vec<Entry>,
//! # }
//! #[derive(Shape)]
//! struct Entry {
//!     name: String,
//!     #[shape(by_name)]
//!     dir: Option<Box<Dir>>,
//! }
//!
//! fn main() {
//!     let _ = <Dir as Shape>::SHAPE;
//! }
//! ```
//!
//! # What the std impls hash
//! The kind serde's data model gives a type, so that types serde serializes alike share a
//! hash: `Vec`, `VecDeque`, `LinkedList`, `BinaryHeap`, `HashSet`, `BTreeSet` and slices
//! are a sequence of their element; `HashMap` and `BTreeMap` a map of their key and value;
//! `String` and `str` a string; `Box`, `Rc`, `Arc`, `Cow` and references their content;
//! `usize` and `isize` are `u64` and `i64` (as serde writes them). Everything else differs:
//! each integer and float width, `bool`, `char`, `()`, `Option`, `Result`, `PhantomData`,
//! `Duration`, tuples by their length and elements, arrays by their length and element.
//! An array and a tuple of the same elements are alike on the wire but hash apart: a false
//! alarm at start-up, never a false agreement (up to the 2^-64 of a collision).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, LinkedList, VecDeque};
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// A type's serde shape as a hash: the same for the same definition on every rank, and
/// different (but for a collision) when a field's name, order or type, a variant's name or
/// fields, or the type's name changes.
///
/// `#[derive(Shape)]` (this trait's derive, re-exported beside it) implements it for a
/// struct or an enum, from its definition: see [`am_derive::Shape`](macro@super::Shape).
/// A typed message takes it as its [`Am::SHAPE`](super::Am::SHAPE).
pub trait Shape {
    /// The hash of the type's serde shape.
    const SHAPE: u64;
}

/// FNV-1a 64's offset basis: the hash of nothing.
pub const SEED: u64 = 0xcbf2_9ce4_8422_2325;
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 continued from `h` over `bytes` (from [`SEED`]: the hash of `bytes`).
pub const fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(PRIME);
        i += 1;
    }
    h
}

/// Folds `x` (a nested hash, a count, a [`leaf`]) into `h`: FNV-1a continued over `x`'s
/// 8 little-endian bytes. Not commutative: the order of folds is part of the hash.
pub const fn fold(h: u64, x: u64) -> u64 {
    fnv(h, &x.to_le_bytes())
}

/// The hash a string enters by: FNV-1a of its length's 8 bytes, then its bytes.
pub const fn leaf(s: &str) -> u64 {
    fnv(fold(SEED, s.len() as u64), s.as_bytes())
}

macro_rules! leaves {
    ($($t:ty => $label:literal),* $(,)?) => {
        $(impl Shape for $t {
            const SHAPE: u64 = leaf($label);
        })*
    };
}

leaves! {
    bool => "bool", char => "char", () => "unit", str => "str", String => "str",
    u8 => "u8", u16 => "u16", u32 => "u32", u64 => "u64", u128 => "u128",
    i8 => "i8", i16 => "i16", i32 => "i32", i64 => "i64", i128 => "i128",
    // serde writes a usize as a u64, an isize as an i64.
    usize => "u64", isize => "i64",
    f32 => "f32", f64 => "f64",
    Duration => "Duration",
}

/// A sequence of `T`.
const fn seq<T: Shape + ?Sized>() -> u64 {
    fold(leaf("seq"), T::SHAPE)
}

impl<T: Shape> Shape for [T] {
    const SHAPE: u64 = seq::<T>();
}
impl<T: Shape> Shape for Vec<T> {
    const SHAPE: u64 = seq::<T>();
}
impl<T: Shape> Shape for VecDeque<T> {
    const SHAPE: u64 = seq::<T>();
}
impl<T: Shape> Shape for LinkedList<T> {
    const SHAPE: u64 = seq::<T>();
}
impl<T: Shape> Shape for BinaryHeap<T> {
    const SHAPE: u64 = seq::<T>();
}
impl<T: Shape, S> Shape for HashSet<T, S> {
    const SHAPE: u64 = seq::<T>();
}
impl<T: Shape> Shape for BTreeSet<T> {
    const SHAPE: u64 = seq::<T>();
}

impl<K: Shape, V: Shape, S> Shape for HashMap<K, V, S> {
    const SHAPE: u64 = fold(fold(leaf("map"), K::SHAPE), V::SHAPE);
}
impl<K: Shape, V: Shape> Shape for BTreeMap<K, V> {
    const SHAPE: u64 = fold(fold(leaf("map"), K::SHAPE), V::SHAPE);
}

impl<T: Shape, const N: usize> Shape for [T; N] {
    const SHAPE: u64 = fold(fold(leaf("array"), N as u64), T::SHAPE);
}

impl<T: Shape> Shape for Option<T> {
    const SHAPE: u64 = fold(leaf("option"), T::SHAPE);
}
impl<T: Shape, E: Shape> Shape for Result<T, E> {
    const SHAPE: u64 = fold(fold(leaf("Result"), T::SHAPE), E::SHAPE);
}
impl<T: ?Sized> Shape for PhantomData<T> {
    const SHAPE: u64 = leaf("PhantomData");
}

// serde writes these as their content.
impl<T: Shape + ?Sized> Shape for Box<T> {
    const SHAPE: u64 = T::SHAPE;
}
impl<T: Shape + ?Sized> Shape for Rc<T> {
    const SHAPE: u64 = T::SHAPE;
}
impl<T: Shape + ?Sized> Shape for Arc<T> {
    const SHAPE: u64 = T::SHAPE;
}
impl<T: Shape + ?Sized> Shape for &T {
    const SHAPE: u64 = T::SHAPE;
}
impl<T: Shape + ?Sized> Shape for &mut T {
    const SHAPE: u64 = T::SHAPE;
}
impl<T: Shape + ToOwned + ?Sized> Shape for Cow<'_, T> {
    const SHAPE: u64 = T::SHAPE;
}

macro_rules! tuples {
    ($(($($t:ident),+))*) => {
        $(impl<$($t: Shape),+> Shape for ($($t,)+) {
            const SHAPE: u64 = {
                let h = fold(leaf("tuple"), [$(stringify!($t)),+].len() as u64);
                $(let h = fold(h, $t::SHAPE);)+
                h
            };
        })*
    };
}

tuples! {
    (A)
    (A, B)
    (A, B, C)
    (A, B, C, D)
    (A, B, C, D, E)
    (A, B, C, D, E, F)
    (A, B, C, D, E, F, G)
    (A, B, C, D, E, F, G, H)
    (A, B, C, D, E, F, G, H, I)
    (A, B, C, D, E, F, G, H, I, J)
    (A, B, C, D, E, F, G, H, I, J, K)
    (A, B, C, D, E, F, G, H, I, J, K, L)
}

#[cfg(test)]
// The types here exist for their shapes: no value of them is built or read.
#[allow(dead_code)]
mod tests {
    use super::*;
    // The derive's generated impls name the trait as `Shape`: this `use` (via `super::*`)
    // brings the trait, and the derive's own name.
    use crate::typed::Shape;

    const fn shape<T: Shape + ?Sized>() -> u64 {
        T::SHAPE
    }

    /// Catches an FNV-1a that is not the published one, and one that the derive's copy
    /// (checked against the same vector in am-derive) would disagree with.
    #[test]
    fn fnv_is_fnv1a_64() {
        assert_eq!(fnv(SEED, b""), SEED);
        assert_eq!(fnv(SEED, b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    /// Catches a derive whose fold is not the documented one (kind, name, field count,
    /// each field's name and type), so that a hand-written impl could not match it.
    #[test]
    fn the_derive_folds_as_documented() {
        #[derive(Shape)]
        struct P {
            x: u32,
        }
        let h = fold(fold(SEED, leaf("struct")), leaf("P"));
        let h = fold(fold(fold(h, 1), leaf("x")), shape::<u32>());
        assert_eq!(shape::<P>(), h);
    }

    /// Catches std impls that confuse widths, sequences of different elements, arrays of
    /// different lengths, or tuples with their elements reordered.
    #[test]
    fn std_shapes_differ_where_the_wire_does() {
        let all = [
            shape::<u8>(),
            shape::<u16>(),
            shape::<u32>(),
            shape::<u64>(),
            shape::<u128>(),
            shape::<i8>(),
            shape::<i16>(),
            shape::<i32>(),
            shape::<i64>(),
            shape::<i128>(),
            shape::<f32>(),
            shape::<f64>(),
            shape::<bool>(),
            shape::<char>(),
            shape::<()>(),
            shape::<String>(),
            shape::<Vec<u8>>(),
            shape::<Vec<u16>>(),
            shape::<[u8; 4]>(),
            shape::<[u8; 5]>(),
            shape::<(u8, u16)>(),
            shape::<(u16, u8)>(),
            shape::<(u8, u16, u8)>(),
            shape::<Option<u8>>(),
            shape::<Result<u8, u16>>(),
            shape::<Result<u16, u8>>(),
            shape::<BTreeMap<u8, u16>>(),
            shape::<BTreeMap<u16, u8>>(),
            shape::<PhantomData<u8>>(),
            shape::<Duration>(),
        ];
        for (i, a) in all.iter().enumerate() {
            for (j, b) in all.iter().enumerate().skip(i + 1) {
                assert_ne!(a, b, "{i} and {j}");
            }
        }
    }

    /// Catches std impls that set apart types serde serializes alike (the documented
    /// equivalences).
    #[test]
    fn serde_alike_types_share_a_shape() {
        let seq = shape::<Vec<u8>>();
        assert_eq!(shape::<VecDeque<u8>>(), seq);
        assert_eq!(shape::<HashSet<u8>>(), seq);
        assert_eq!(shape::<BTreeSet<u8>>(), seq);
        assert_eq!(shape::<[u8]>(), seq);
        assert_eq!(shape::<HashMap<u8, u8>>(), shape::<BTreeMap<u8, u8>>());
        assert_eq!(shape::<str>(), shape::<String>());
        assert_eq!(shape::<Box<str>>(), shape::<String>());
        assert_eq!(shape::<Arc<u8>>(), shape::<u8>());
        assert_eq!(shape::<Rc<u8>>(), shape::<u8>());
        assert_eq!(shape::<Cow<'static, str>>(), shape::<String>());
        assert_eq!(shape::<&'static str>(), shape::<String>());
        assert_eq!(shape::<usize>(), shape::<u64>());
        assert_eq!(shape::<isize>(), shape::<i64>());
    }

    mod v1 {
        use crate::typed::Shape;
        #[derive(Shape)]
        pub struct Point {
            pub x: u32,
            pub y: u32,
        }
        #[derive(Shape)]
        pub struct Path {
            pub at: Point,
            pub data: Vec<u8>,
        }
        #[derive(Shape)]
        pub enum Cmd {
            Stop,
            Go(Point),
            Jump { to: Point, high: bool },
        }
    }
    /// The same source as `v1`: the same shapes.
    mod same {
        use crate::typed::Shape;
        #[derive(Shape)]
        pub struct Point {
            pub x: u32,
            pub y: u32,
        }
        #[derive(Shape)]
        pub struct Path {
            pub at: Point,
            pub data: Vec<u8>,
        }
        #[derive(Shape)]
        pub enum Cmd {
            Stop,
            Go(Point),
            Jump { to: Point, high: bool },
        }
    }
    mod renamed_field {
        use crate::typed::Shape;
        #[derive(Shape)]
        pub struct Point {
            pub x: u32,
            pub z: u32,
        }
    }
    mod reordered {
        use crate::typed::Shape;
        #[derive(Shape)]
        pub struct Point {
            pub y: u32,
            pub x: u32,
        }
    }
    mod wider {
        use crate::typed::Shape;
        #[derive(Shape)]
        pub struct Point {
            pub x: u32,
            pub y: u64,
        }
        #[derive(Shape)]
        pub struct Path {
            pub at: super::v1::Point,
            pub data: Vec<u16>,
        }
    }
    mod nested_changed {
        use crate::typed::Shape;
        #[derive(Shape)]
        pub struct Path {
            pub at: super::wider::Point,
            pub data: Vec<u8>,
        }
    }
    mod tuple_point {
        use crate::typed::Shape;
        #[derive(Shape)]
        pub struct Point(pub u32, pub u32);
    }
    mod variant_renamed {
        use crate::typed::Shape;
        #[derive(Shape)]
        pub enum Cmd {
            Halt,
            Go(super::v1::Point),
            Jump { to: super::v1::Point, high: bool },
        }
    }
    mod variant_added {
        use crate::typed::Shape;
        #[derive(Shape)]
        pub enum Cmd {
            Stop,
            Go(super::v1::Point),
            Jump { to: super::v1::Point, high: bool },
            Wait,
        }
    }
    mod variant_field_renamed {
        use crate::typed::Shape;
        #[derive(Shape)]
        pub enum Cmd {
            Stop,
            Go(super::v1::Point),
            Jump { to: super::v1::Point, tall: bool },
        }
    }
    mod variant_kind_changed {
        use crate::typed::Shape;
        #[derive(Shape)]
        pub enum Cmd {
            Stop,
            Go { at: super::v1::Point },
            Jump { to: super::v1::Point, high: bool },
        }
    }

    /// Catches a fingerprint that misses a change of layout under the same name: each
    /// variant of `Point`, `Path` and `Cmd` changes one thing (a field's name, the fields'
    /// order, a field's type, a nested struct's field, the kind, a variant's name, fields or
    /// kind, a new variant); and one that two copies of the same source do not share.
    #[test]
    fn derived_shapes_change_with_the_layout() {
        assert_eq!(shape::<v1::Point>(), shape::<same::Point>());
        assert_eq!(shape::<v1::Path>(), shape::<same::Path>());
        assert_eq!(shape::<v1::Cmd>(), shape::<same::Cmd>());

        let point = shape::<v1::Point>();
        assert_ne!(point, shape::<renamed_field::Point>(), "renamed field");
        assert_ne!(point, shape::<reordered::Point>(), "reordered fields");
        assert_ne!(point, shape::<wider::Point>(), "u32 to u64");
        assert_ne!(point, shape::<tuple_point::Point>(), "named to tuple");
        let path = shape::<v1::Path>();
        assert_ne!(path, shape::<wider::Path>(), "Vec<u8> to Vec<u16>");
        assert_ne!(
            path,
            shape::<nested_changed::Path>(),
            "nested struct changed"
        );
        let cmd = shape::<v1::Cmd>();
        assert_ne!(cmd, shape::<variant_renamed::Cmd>(), "variant renamed");
        assert_ne!(cmd, shape::<variant_added::Cmd>(), "variant added");
        assert_ne!(
            cmd,
            shape::<variant_field_renamed::Cmd>(),
            "variant's field renamed"
        );
        assert_ne!(
            cmd,
            shape::<variant_kind_changed::Cmd>(),
            "tuple to struct variant"
        );
    }

    #[derive(Shape)]
    struct Unit;
    #[derive(Shape)]
    struct Empty {}
    #[derive(Shape)]
    struct Newtype(u8);
    #[derive(Shape)]
    struct Wrap<T, const N: usize> {
        items: [T; N],
    }
    #[derive(Shape)]
    struct Tagged<'a, T: Clone, U>
    where
        U: Copy,
    {
        name: &'a str,
        pair: (T, U),
    }
    #[derive(Shape)]
    enum Tree<T> {
        Leaf(T),
        Node {
            kids: Vec<Tree<T>>,
            at: Option<Box<Self>>,
        },
        Empty,
    }

    /// Catches a derive that does not compile on a kind of struct or variant, on generics
    /// (type, lifetime and const parameters, an existing where clause), or on a recursive
    /// type; and one whose generic shapes ignore their parameters (also the parameter a
    /// recursive field alone would hold).
    #[test]
    fn the_derive_takes_every_kind_and_generics() {
        let kinds = [
            shape::<Unit>(),
            shape::<Empty>(),
            shape::<Newtype>(),
            shape::<Wrap<u8, 4>>(),
            shape::<Tagged<'static, u8, u16>>(),
            shape::<Tree<u8>>(),
        ];
        for (i, a) in kinds.iter().enumerate() {
            for b in &kinds[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_ne!(shape::<Wrap<u8, 4>>(), shape::<Wrap<u8, 5>>());
        assert_ne!(shape::<Wrap<u8, 4>>(), shape::<Wrap<u16, 4>>());
        assert_ne!(shape::<Tagged<u8, u16>>(), shape::<Tagged<u16, u8>>());
        assert_ne!(shape::<Tree<u8>>(), shape::<Tree<u16>>());
    }

    mod serde_attrs {
        use crate::typed::Shape;
        use serde::Serialize;

        pub struct NoShape;

        #[derive(Shape, Serialize)]
        pub struct Point {
            pub x: u32,
            pub y: u32,
        }
        pub mod skipping {
            use crate::typed::Shape;
            use serde::Serialize;
            #[derive(Shape, Serialize)]
            pub struct Point {
                pub x: u32,
                pub y: u32,
                #[serde(skip)]
                pub cache: super::NoShape,
            }
        }
        #[derive(Shape, Serialize)]
        pub struct Renamed {
            #[serde(rename = "x")]
            pub ex: u32,
            pub y: u32,
        }
        #[derive(Shape, Serialize)]
        #[serde(rename_all = "UPPERCASE")]
        pub enum Mode {
            Fast,
            #[serde(skip)]
            Hidden(NoShape),
            Slow {
                #[serde(rename = "lvl")]
                level: u8,
            },
        }
        #[derive(Shape, Serialize)]
        pub enum ModeUnrenamed {
            Fast,
            #[serde(skip)]
            Hidden(NoShape),
            Slow {
                level: u8,
            },
        }
    }

    /// Catches `#[serde(skip)]` fields that still need `Shape` or change the hash, and
    /// renames that leave it unchanged.
    #[test]
    fn serde_attributes_that_the_derive_takes() {
        use serde_attrs::*;
        assert_eq!(shape::<Point>(), shape::<skipping::Point>());
        assert_ne!(shape::<Point>(), shape::<Renamed>());
        assert_ne!(shape::<Mode>(), shape::<ModeUnrenamed>());
    }
}
