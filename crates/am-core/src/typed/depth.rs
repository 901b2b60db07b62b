//! Bounds on how deeply a decoded value nests, and on how many elements its sequences hold.
//!
//! serde's derived `Deserialize` of a recursive type (`enum Tree { Leaf, Node(Box<Tree>) }`)
//! calls itself once per level, and the wire format's decoder does too: a forged value a
//! few tens of kilobytes long, nested tens of thousands deep, overflows the decoding
//! thread's stack and aborts the process. [`deserialize`] decodes through [`Deep`], a
//! `Deserializer` that wraps the format's and refuses a value nested more than
//! [`MAX_DEPTH`] containers deep with an error, before the stack runs out.
//!
//! Every way serde descends into a nested value passes through a visitor: a sequence,
//! tuple or struct (`visit_seq`), a map (`visit_map`), an enum (`visit_enum`), an option's
//! value (`visit_some`), a newtype struct (`visit_newtype_struct`). The wrapped visitor
//! ([`Visit`]) takes one level from the budget there and hands the nested values a
//! deserializer with the rest: through the `SeqAccess`, `MapAccess`, `EnumAccess` and
//! `VariantAccess` it wraps, and the `DeserializeSeed`s they receive. The budget travels by
//! value, so nothing is shared and nothing needs undoing on the way out. (`Box<T>` is not
//! a level of its own: it deserializes `T` in place, with the same deserializer.)
//!
//! A sequence or map says on the wire how many elements it holds, and an element of a type
//! that occupies no bytes (`()`, a unit struct, a struct whose fields are all skipped)
//! decodes from none: eight forged bytes declaring 2^62 such elements would keep the
//! decoder looping for years. So the elements of every sequence and map of a value share
//! one budget, the value's length in bytes plus [`ELEMENTS_PAST_BYTES`]: an element that
//! occupies bytes takes at least one, so only elements that occupy none can run past it.
//! The budget is shared by reference (a `Cell`), since siblings draw on it in turn; a tuple's
//! or struct's fields are not counted, their number being the type's, not the wire's.
//!
//! An element also takes its size in memory (`size_of`, a map's key and value both) from a
//! second budget, [`MEMORY_PER_BYTE`] times the value's length plus [`MEMORY_PAST_BYTES`]:
//! an element may occupy a byte on the wire, or none, and kilobytes in memory (a `None` of
//! an `Option` of a large array, a field skipped on the wire that holds an array), and a
//! vector of them would otherwise make a few forged bytes into hundreds of megabytes.
//!
//! What a value holds behind a pointer takes from that budget too. `Box<T>` (and `Rc<T>` and
//! `Arc<T>`, with serde's `rc` feature) deserialize their `T` with the deserializer they are
//! given, so a vector of `Box<Option<T>>` of a large `T` would be charged a pointer's size an
//! element while each `None`, one byte on the wire, allocates a `T`. Each [`Deep`] knows how much memory was paid for
//! the value it deserializes (`paid`: an element's or a field's size, or the size of the
//! option or newtype struct around it); a visitor whose value is larger than that is one
//! behind a pointer, and its size is taken before it is decoded. Two limits: a pointee no
//! larger than its pointer is within the pointer's charge (at most twice the memory
//! charged); and a pointee is charged as the type its visitor builds, so a type that
//! decodes through a smaller one (`#[serde(from = "Small")]`, a hand-written
//! `Deserialize`) behind a `Box` is charged the smaller one's size.

use std::cell::Cell;

use serde::de::{self, DeserializeSeed, Deserializer, Visitor};

/// The deepest a decoded value may nest, in containers (each sequence, tuple, struct, map,
/// enum, option's value and newtype struct is one level, a struct variant of an enum two).
///
/// Real messages nest a handful of levels (a struct of vectors of structs of options);
/// 128 leaves room for trees and linked lists of modest depth. The bound is for the stack:
/// a level of a recursive type costs a few frames of the derived `Deserialize`, the wire
/// format's decoder and these wrappers, about 1 to 2 KiB in a debug build for a small
/// type (values nested just under the bound decode on a 256 KiB stack, not on 128 KiB),
/// so 128 levels fit the 2 MiB a spawned thread has by default with room to spare (the
/// tests decode them on such a thread, in every container kind). A type that holds large
/// arrays by value at every level of its recursion costs more a level, in proportion.
pub(crate) const MAX_DEPTH: usize = 128;

/// The error a value nested past [`MAX_DEPTH`] gives.
const TOO_DEEP: &str = "nested too deep";

/// How many elements of sequences and maps a value may hold beyond its length in bytes:
/// room for elements that occupy no bytes (a `Vec<()>`, a set of unit structs), which real
/// messages hold few of, while a forged count costs at most this many empty turns of a loop.
pub(crate) const ELEMENTS_PAST_BYTES: usize = 1 << 16;

/// The error a value whose sequences and maps hold more elements than its budget gives.
const TOO_MANY: &str = "more elements than the value's bytes allow";

/// The bytes of memory the elements of a value's sequences and maps may take, in all, per
/// byte of the value: a small integer in one byte of varint and 8 in memory, an enum's
/// one-byte unit variant in an element as large as its largest variant, fit many times over.
pub(crate) const MEMORY_PER_BYTE: usize = 64;

/// The bytes of memory those elements may take beyond [`MEMORY_PER_BYTE`] times the
/// value's length: room for short values of large elements.
pub(crate) const MEMORY_PAST_BYTES: usize = 64 << 20;

/// The error a value whose elements take more memory than its budget gives.
const TOO_LARGE: &str = "elements larger in memory than the value's bytes allow";

/// What the elements of a value's sequences and maps may still take: how many, and how
/// many bytes of memory.
pub(crate) struct Budget {
    elements: Cell<usize>,
    memory: Cell<usize>,
}

impl Budget {
    /// The budget of a value of `len` bytes.
    fn of(len: usize) -> Budget {
        Budget {
            elements: Cell::new(len.saturating_add(ELEMENTS_PAST_BYTES)),
            memory: Cell::new(
                len.saturating_mul(MEMORY_PER_BYTE)
                    .saturating_add(MEMORY_PAST_BYTES),
            ),
        }
    }

    /// Takes one element, or the error past the budget.
    #[inline]
    fn take_element<E: de::Error>(&self) -> Result<(), E> {
        match self.elements.get().checked_sub(1) {
            Some(left) => {
                self.elements.set(left);
                Ok(())
            }
            None => Err(E::custom(TOO_MANY)),
        }
    }

    /// Takes `T`'s size in memory, or the error past the budget.
    #[inline]
    fn take_memory<T, E: de::Error>(&self) -> Result<(), E> {
        match self.memory.get().checked_sub(std::mem::size_of::<T>()) {
            Some(left) => {
                self.memory.set(left);
                Ok(())
            }
            None => Err(E::custom(TOO_LARGE)),
        }
    }
}

/// Deserializes a `T` from `inner`, the decoder of `len` bytes, refusing a value nested more
/// than [`MAX_DEPTH`] deep, or whose sequences and maps hold more than `len` +
/// [`ELEMENTS_PAST_BYTES`] elements in all, or elements whose sizes in memory add up to
/// more than `len` times [`MEMORY_PER_BYTE`] plus [`MEMORY_PAST_BYTES`].
#[inline]
pub(crate) fn deserialize<'de, T, D>(inner: D, len: usize) -> Result<T, D::Error>
where
    T: de::Deserialize<'de>,
    D: Deserializer<'de>,
{
    let budget = Budget::of(len);
    T::deserialize(Deep {
        inner,
        left: MAX_DEPTH,
        budget: &budget,
        paid: std::mem::size_of::<T>(),
    })
}

/// A deserializer whose value may nest `left` more levels, its sequences drawing on
/// `budget`, and whose memory, up to `paid` bytes, is paid for already.
pub(crate) struct Deep<'b, D> {
    inner: D,
    left: usize,
    budget: &'b Budget,
    paid: usize,
}

/// A visitor of a value that may nest `left` more levels: it takes a level when it
/// descends. `counted` says whether it visits a sequence or map whose length is the wire's
/// (its elements draw on `budget`) rather than a tuple's or struct's.
struct Visit<'b, V> {
    inner: V,
    left: usize,
    budget: &'b Budget,
    counted: bool,
}

impl<'b, V> Visit<'b, V> {
    /// The levels left below this one, or the error past the bound.
    #[inline]
    fn descend<E: de::Error>(&self) -> Result<usize, E> {
        match self.left.checked_sub(1) {
            Some(left) => Ok(left),
            None => Err(E::custom(TOO_DEEP)),
        }
    }

    /// `a` wrapped for the level below this one, or the error past the bound.
    #[inline]
    fn access<A, E: de::Error>(&self, a: A) -> Result<Access<'b, A>, E> {
        Ok(Access {
            inner: a,
            left: self.descend()?,
            budget: self.budget,
            counted: self.counted,
        })
    }
}

/// A seed of a nested value: it deserializes through [`Deep`] with `left` levels.
struct Seed<'b, S> {
    inner: S,
    left: usize,
    budget: &'b Budget,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<'_, S> {
    type Value = S::Value;

    #[inline]
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Deep {
            inner: d,
            left: self.left,
            budget: self.budget,
            paid: std::mem::size_of::<S::Value>(),
        })
    }
}

/// Forwards `deserialize_*` methods of a visitor alone.
macro_rules! forward {
    ($($method:ident)*) => {$(
        #[inline]
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            let v = self.visit(visitor, false)?;
            self.inner.$method(v)
        }
    )*};
}

impl<'b, 'de, D: Deserializer<'de>> Deep<'b, D> {
    /// `visitor` wrapped for this deserializer's levels and budget; first, the size of the
    /// value it builds taken from the budget if it is larger than what was paid for this
    /// deserializer's value (it lies behind a pointer), or the error past the budget.
    #[inline]
    fn visit<V: Visitor<'de>>(&self, visitor: V, counted: bool) -> Result<Visit<'b, V>, D::Error> {
        if std::mem::size_of::<V::Value>() > self.paid {
            self.budget.take_memory::<V::Value, D::Error>()?;
        }
        Ok(Visit {
            inner: visitor,
            left: self.left,
            budget: self.budget,
            counted,
        })
    }
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Deep<'_, D> {
    type Error = D::Error;

    forward! {
        deserialize_any deserialize_bool
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
        deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_bytes
        deserialize_option deserialize_unit
        deserialize_identifier deserialize_ignored_any
    }

    /// A sequence's elements, as many as the wire says, draw on the budget.
    #[inline]
    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let v = self.visit(visitor, true)?;
        self.inner.deserialize_seq(v)
    }

    /// A map's entries, as many as the wire says, draw on the budget.
    #[inline]
    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        let v = self.visit(visitor, true)?;
        self.inner.deserialize_map(v)
    }

    /// Asked for a `String`, it asks the wire format for a borrowed `str`: its decoder
    /// zero-fills a new buffer before it copies the bytes in, where the visitor of a
    /// borrowed one copies them once (`to_owned`). A visitor that takes an owned string also
    /// takes a borrowed one (serde's contract: `deserialize_string` is a hint).
    #[inline]
    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.deserialize_str(visitor)
    }

    /// Asked for a byte buffer, it asks for borrowed bytes, for the reason given at
    /// `deserialize_string`.
    #[inline]
    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
        self.deserialize_bytes(visitor)
    }

    #[inline]
    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = self.visit(visitor, false)?;
        self.inner.deserialize_unit_struct(name, v)
    }

    #[inline]
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = self.visit(visitor, false)?;
        self.inner.deserialize_newtype_struct(name, v)
    }

    #[inline]
    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = self.visit(visitor, false)?;
        self.inner.deserialize_tuple(len, v)
    }

    #[inline]
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = self.visit(visitor, false)?;
        self.inner.deserialize_tuple_struct(name, len, v)
    }

    #[inline]
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = self.visit(visitor, false)?;
        self.inner.deserialize_struct(name, fields, v)
    }

    #[inline]
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = self.visit(visitor, false)?;
        self.inner.deserialize_enum(name, variants, v)
    }

    #[inline]
    fn is_human_readable(&self) -> bool {
        self.inner.is_human_readable()
    }
}

/// Forwards `visit_*` methods of one argument that nests nothing.
macro_rules! leaf {
    ($($method:ident($ty:ty))*) => {$(
        #[inline]
        fn $method<E: de::Error>(self, v: $ty) -> Result<V::Value, E> {
            self.inner.$method(v)
        }
    )*};
}

impl<'de, V: Visitor<'de>> Visitor<'de> for Visit<'_, V> {
    type Value = V::Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.expecting(f)
    }

    leaf! {
        visit_bool(bool)
        visit_i8(i8) visit_i16(i16) visit_i32(i32) visit_i64(i64) visit_i128(i128)
        visit_u8(u8) visit_u16(u16) visit_u32(u32) visit_u64(u64) visit_u128(u128)
        visit_f32(f32) visit_f64(f64) visit_char(char)
        visit_str(&str) visit_borrowed_str(&'de str) visit_string(String)
        visit_bytes(&[u8]) visit_borrowed_bytes(&'de [u8]) visit_byte_buf(Vec<u8>)
    }

    #[inline]
    fn visit_none<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_none()
    }

    #[inline]
    fn visit_unit<E: de::Error>(self) -> Result<V::Value, E> {
        self.inner.visit_unit()
    }

    #[inline]
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        let left = self.descend()?;
        let budget = self.budget;
        self.inner.visit_some(Deep {
            inner: d,
            left,
            budget,
            paid: std::mem::size_of::<V::Value>(),
        })
    }

    #[inline]
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        let left = self.descend()?;
        let budget = self.budget;
        self.inner.visit_newtype_struct(Deep {
            inner: d,
            left,
            budget,
            paid: std::mem::size_of::<V::Value>(),
        })
    }

    #[inline]
    fn visit_seq<A: de::SeqAccess<'de>>(self, a: A) -> Result<V::Value, A::Error> {
        let access = self.access(a)?;
        self.inner.visit_seq(access)
    }

    #[inline]
    fn visit_map<A: de::MapAccess<'de>>(self, a: A) -> Result<V::Value, A::Error> {
        let access = self.access(a)?;
        self.inner.visit_map(access)
    }

    #[inline]
    fn visit_enum<A: de::EnumAccess<'de>>(self, a: A) -> Result<V::Value, A::Error> {
        let access = self.access(a)?;
        self.inner.visit_enum(access)
    }
}

/// A sequence's, map's, enum's or variant's access whose nested values may nest `left`
/// more levels; a sequence's elements or a map's entries draw on `budget` if `counted`.
struct Access<'b, A> {
    inner: A,
    left: usize,
    budget: &'b Budget,
    counted: bool,
}

impl<'b, A> Access<'b, A> {
    #[inline]
    fn seed<S>(&self, inner: S) -> Seed<'b, S> {
        Seed {
            inner,
            left: self.left,
            budget: self.budget,
        }
    }

    /// `visitor` wrapped for the levels of this access's values.
    #[inline]
    fn visit<V>(&self, visitor: V) -> Visit<'b, V> {
        Visit {
            inner: visitor,
            left: self.left,
            budget: self.budget,
            counted: false,
        }
    }

    /// Takes one element, and its size in memory, from the budget if this access counts,
    /// or the error past it.
    #[inline]
    fn spend<T, E: de::Error>(&self, got: &Option<T>) -> Result<(), E> {
        if self.counted && got.is_some() {
            self.budget.take_element::<E>()?;
            self.budget.take_memory::<T, E>()?;
        }
        Ok(())
    }
}

impl<'de, A: de::SeqAccess<'de>> de::SeqAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    #[inline]
    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, A::Error> {
        let seed = self.seed(seed);
        let got = self.inner.next_element_seed(seed)?;
        self.spend(&got)?;
        Ok(got)
    }

    #[inline]
    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: de::MapAccess<'de>> de::MapAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    #[inline]
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let seed = self.seed(seed);
        let got = self.inner.next_key_seed(seed)?;
        self.spend(&got)?;
        Ok(got)
    }

    #[inline]
    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        let seed = self.seed(seed);
        let value = self.inner.next_value_seed(seed)?;
        if self.counted {
            self.budget.take_memory::<S::Value, A::Error>()?;
        }
        Ok(value)
    }

    #[inline]
    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'b, 'de, A: de::EnumAccess<'de>> de::EnumAccess<'de> for Access<'b, A> {
    type Error = A::Error;
    type Variant = Access<'b, A::Variant>;

    #[inline]
    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self::Variant), A::Error> {
        let (left, budget, seed) = (self.left, self.budget, self.seed(seed));
        let (tag, variant) = self.inner.variant_seed(seed)?;
        Ok((
            tag,
            Access {
                inner: variant,
                left,
                budget,
                counted: false,
            },
        ))
    }
}

impl<'de, A: de::VariantAccess<'de>> de::VariantAccess<'de> for Access<'_, A> {
    type Error = A::Error;

    #[inline]
    fn unit_variant(self) -> Result<(), A::Error> {
        self.inner.unit_variant()
    }

    #[inline]
    fn newtype_variant_seed<S: DeserializeSeed<'de>>(self, seed: S) -> Result<S::Value, A::Error> {
        let seed = self.seed(seed);
        self.inner.newtype_variant_seed(seed)
    }

    #[inline]
    fn tuple_variant<V: Visitor<'de>>(self, len: usize, visitor: V) -> Result<V::Value, A::Error> {
        let v = self.visit(visitor);
        self.inner.tuple_variant(len, v)
    }

    #[inline]
    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        let v = self.visit(visitor);
        self.inner.struct_variant(fields, v)
    }
}
