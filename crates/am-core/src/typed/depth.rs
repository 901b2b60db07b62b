//! A bound on how deeply a decoded value nests.
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

/// Deserializes a `T` from `inner`, refusing a value nested more than [`MAX_DEPTH`] deep.
#[inline]
pub(crate) fn deserialize<'de, T, D>(inner: D) -> Result<T, D::Error>
where
    T: de::Deserialize<'de>,
    D: Deserializer<'de>,
{
    T::deserialize(Deep {
        inner,
        left: MAX_DEPTH,
    })
}

/// A deserializer whose value may nest `left` more levels.
pub(crate) struct Deep<D> {
    inner: D,
    left: usize,
}

/// A visitor of a value that may nest `left` more levels: it takes a level when it
/// descends.
struct Visit<V> {
    inner: V,
    left: usize,
}

impl<V> Visit<V> {
    /// The levels left below this one, or the error past the bound.
    #[inline]
    fn descend<E: de::Error>(&self) -> Result<usize, E> {
        match self.left.checked_sub(1) {
            Some(left) => Ok(left),
            None => Err(E::custom(TOO_DEEP)),
        }
    }
}

/// A seed of a nested value: it deserializes through [`Deep`] with `left` levels.
struct Seed<S> {
    inner: S,
    left: usize,
}

impl<'de, S: DeserializeSeed<'de>> DeserializeSeed<'de> for Seed<S> {
    type Value = S::Value;

    #[inline]
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<S::Value, D::Error> {
        self.inner.deserialize(Deep {
            inner: d,
            left: self.left,
        })
    }
}

/// Forwards `deserialize_*` methods of a visitor alone.
macro_rules! forward {
    ($($method:ident)*) => {$(
        #[inline]
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, D::Error> {
            self.inner.$method(Visit { inner: visitor, left: self.left })
        }
    )*};
}

impl<'de, D: Deserializer<'de>> Deserializer<'de> for Deep<D> {
    type Error = D::Error;

    forward! {
        deserialize_any deserialize_bool
        deserialize_i8 deserialize_i16 deserialize_i32 deserialize_i64 deserialize_i128
        deserialize_u8 deserialize_u16 deserialize_u32 deserialize_u64 deserialize_u128
        deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_bytes
        deserialize_option deserialize_unit deserialize_seq deserialize_map
        deserialize_identifier deserialize_ignored_any
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
        let v = Visit {
            inner: visitor,
            left: self.left,
        };
        self.inner.deserialize_unit_struct(name, v)
    }

    #[inline]
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = Visit {
            inner: visitor,
            left: self.left,
        };
        self.inner.deserialize_newtype_struct(name, v)
    }

    #[inline]
    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = Visit {
            inner: visitor,
            left: self.left,
        };
        self.inner.deserialize_tuple(len, v)
    }

    #[inline]
    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = Visit {
            inner: visitor,
            left: self.left,
        };
        self.inner.deserialize_tuple_struct(name, len, v)
    }

    #[inline]
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = Visit {
            inner: visitor,
            left: self.left,
        };
        self.inner.deserialize_struct(name, fields, v)
    }

    #[inline]
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, D::Error> {
        let v = Visit {
            inner: visitor,
            left: self.left,
        };
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

impl<'de, V: Visitor<'de>> Visitor<'de> for Visit<V> {
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
        self.inner.visit_some(Deep { inner: d, left })
    }

    #[inline]
    fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<V::Value, D::Error> {
        let left = self.descend()?;
        self.inner.visit_newtype_struct(Deep { inner: d, left })
    }

    #[inline]
    fn visit_seq<A: de::SeqAccess<'de>>(self, a: A) -> Result<V::Value, A::Error> {
        let left = self.descend()?;
        self.inner.visit_seq(Access { inner: a, left })
    }

    #[inline]
    fn visit_map<A: de::MapAccess<'de>>(self, a: A) -> Result<V::Value, A::Error> {
        let left = self.descend()?;
        self.inner.visit_map(Access { inner: a, left })
    }

    #[inline]
    fn visit_enum<A: de::EnumAccess<'de>>(self, a: A) -> Result<V::Value, A::Error> {
        let left = self.descend()?;
        self.inner.visit_enum(Access { inner: a, left })
    }
}

/// A sequence's, map's, enum's or variant's access whose nested values may nest `left`
/// more levels.
struct Access<A> {
    inner: A,
    left: usize,
}

impl<A> Access<A> {
    #[inline]
    fn seed<S>(&self, inner: S) -> Seed<S> {
        Seed {
            inner,
            left: self.left,
        }
    }
}

impl<'de, A: de::SeqAccess<'de>> de::SeqAccess<'de> for Access<A> {
    type Error = A::Error;

    #[inline]
    fn next_element_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, A::Error> {
        let seed = self.seed(seed);
        self.inner.next_element_seed(seed)
    }

    #[inline]
    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: de::MapAccess<'de>> de::MapAccess<'de> for Access<A> {
    type Error = A::Error;

    #[inline]
    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let seed = self.seed(seed);
        self.inner.next_key_seed(seed)
    }

    #[inline]
    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        let seed = self.seed(seed);
        self.inner.next_value_seed(seed)
    }

    #[inline]
    fn size_hint(&self) -> Option<usize> {
        self.inner.size_hint()
    }
}

impl<'de, A: de::EnumAccess<'de>> de::EnumAccess<'de> for Access<A> {
    type Error = A::Error;
    type Variant = Access<A::Variant>;

    #[inline]
    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Self::Variant), A::Error> {
        let (left, seed) = (self.left, self.seed(seed));
        let (tag, variant) = self.inner.variant_seed(seed)?;
        Ok((
            tag,
            Access {
                inner: variant,
                left,
            },
        ))
    }
}

impl<'de, A: de::VariantAccess<'de>> de::VariantAccess<'de> for Access<A> {
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
        let v = Visit {
            inner: visitor,
            left: self.left,
        };
        self.inner.tuple_variant(len, v)
    }

    #[inline]
    fn struct_variant<V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, A::Error> {
        let v = Visit {
            inner: visitor,
            left: self.left,
        };
        self.inner.struct_variant(fields, v)
    }
}
