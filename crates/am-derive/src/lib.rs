//! `#[derive(Shape)]`: the serde shape fingerprint of a typed message's type, re-exported
//! as `am_core::typed::Shape` (and `amnet::typed::Shape`) beside the trait it implements.
//! The trait, what the fingerprint covers and how a typed message uses it are documented
//! there.
//!
//! The derived `SHAPE` folds, with FNV-1a 64, in this order: the kind (`struct`,
//! `tuple struct`, `unit struct`, `enum`), the type's name, each type parameter's `SHAPE`,
//! the serde attributes that rename (as written); then, for a struct, the count of its
//! fields and each field's name (if it has one), its renaming attributes and its type's
//! `SHAPE`; for an enum, the count of its variants and each variant's kind, name,
//! renaming attributes and fields likewise. Every string enters as its own FNV-1a hash, every
//! hash as its 8 little-endian bytes: `am_core::typed::shape`'s `leaf` and `fold`.
//!
//! Serde attributes that change what goes on the wire in a way the fields do not show
//! (`flatten`, `with`, `tag`, `untagged`, `into`, ...) are refused with a compile error that
//! says to write `Shape` by hand: a derive that ignored them would give a fingerprint that
//! does not describe the bytes.

#![forbid(unsafe_code)]

use proc_macro2::{Literal, Span, TokenStream, TokenTree};
use quote::{quote, ToTokens};
use syn::punctuated::Punctuated;
use syn::{parse_macro_input, Attribute, Data, DeriveInput, Fields, Meta, Token, Type};

/// Implements `Shape` (`am_core::typed::Shape`): `SHAPE` is a hash of the type's serde
/// shape, its kind, name, fields' names and types in order, variants' names and fields.
///
/// The generated impl names the trait `Shape` as the derive's call site sees it (the `use`
/// that brings the derive brings the trait, as they share the name);
/// `#[shape(crate = "amnet::typed")]` names the module that holds it instead.
///
/// Each type parameter gets a `Shape` bound. A field whose type names the type itself
/// (`Option<Box<Self>>`, `Vec<Tree>`) enters by its type as written, since its `SHAPE`
/// would need the one being computed; `#[shape(by_name)]` on a field does the same for
/// any type (one without a `Shape` impl, or a recursion through another type, which is a
/// compile error otherwise: a cycle in const evaluation).
///
/// `#[serde(skip)]` fields are left out; `rename`, `rename_all`, `rename_all_fields` and
/// `transparent` enter as written; `alias`, `default`, `bound`, `borrow`, `crate`,
/// `expecting` and `deny_unknown_fields` change nothing in the wire format's bytes and are
/// ignored; any other serde attribute is a compile error.
#[proc_macro_derive(Shape, attributes(shape))]
pub fn derive_shape(input: proc_macro::TokenStream) -> proc_macro::TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand(&input)
        .unwrap_or_else(syn::Error::into_compile_error)
        .into()
}

/// FNV-1a 64's offset basis.
const SEED: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a 64's prime.
const PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64 continued from `h` over `bytes` (am-core's `shape::fnv`).
fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// The hash a string enters by: its length's 8 bytes, then its bytes (am-core's
/// `shape::leaf`), so that no two sequences of strings share their concatenation.
fn leaf(s: &str) -> u64 {
    fnv(fnv(SEED, &(s.len() as u64).to_le_bytes()), s.as_bytes())
}

/// Where a serde attribute is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Place {
    Container,
    Field,
    Variant,
}

/// What the derive does with one serde attribute item.
#[derive(PartialEq, Eq, Debug)]
enum Serde {
    /// It changes nothing in the wire format's bytes.
    Ignore,
    /// It renames (or unwraps): it enters the hash as written.
    Fold(String),
    /// `#[serde(skip)]`.
    Skip,
}

/// Reads the serde attributes of one item: what enters the hash, and whether it is skipped.
fn serde_attrs(attrs: &[Attribute], place: Place) -> syn::Result<(Vec<String>, bool)> {
    let mut folds = Vec::new();
    let mut skip = false;
    for attr in attrs.iter().filter(|a| a.path().is_ident("serde")) {
        let items = attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated)?;
        for item in items {
            match classify(&item, place)? {
                Serde::Ignore => {}
                Serde::Fold(s) => folds.push(s),
                Serde::Skip => skip = true,
            }
        }
    }
    Ok((folds, skip))
}

fn classify(item: &Meta, place: Place) -> syn::Result<Serde> {
    let key = item
        .path()
        .get_ident()
        .map(ToString::to_string)
        .unwrap_or_default();
    let fold = || Serde::Fold(item.to_token_stream().to_string());
    Ok(match (place, key.as_str()) {
        (Place::Container, "rename" | "rename_all" | "rename_all_fields" | "transparent")
        | (Place::Field, "rename")
        | (Place::Variant, "rename" | "rename_all") => fold(),
        (Place::Field | Place::Variant, "skip") => Serde::Skip,
        (Place::Container, "deny_unknown_fields" | "default" | "bound" | "crate" | "expecting")
        | (Place::Field, "alias" | "default" | "bound" | "borrow")
        | (Place::Variant, "alias" | "bound" | "borrow") => Serde::Ignore,
        _ => {
            return Err(syn::Error::new_spanned(
                item,
                format!(
                    "#[derive(Shape)] cannot fingerprint `#[serde({})]`: it changes the \
                     serialized form in a way the fields do not show; implement `Shape` by \
                     hand (`impl Shape for T {{ const SHAPE: u64 = ...; }}`, folding the \
                     shapes of what goes on the wire with `shape::fold`)",
                    item.to_token_stream()
                ),
            ))
        }
    })
}

/// Reads `#[shape(...)]`: the container's `crate = "path"`, a field's `by_name`.
fn shape_attrs(attrs: &[Attribute], place: Place) -> syn::Result<(Option<syn::Path>, bool)> {
    let mut krate = None;
    let mut by_name = false;
    for attr in attrs.iter().filter(|a| a.path().is_ident("shape")) {
        attr.parse_nested_meta(|meta| {
            if place == Place::Container && meta.path.is_ident("crate") {
                let s: syn::LitStr = meta.value()?.parse()?;
                krate = Some(s.parse()?);
                Ok(())
            } else if place == Place::Field && meta.path.is_ident("by_name") {
                by_name = true;
                Ok(())
            } else {
                Err(meta.error(
                    "unknown `shape` attribute: `crate = \"...\"` on the type, `by_name` on a field",
                ))
            }
        })?;
    }
    Ok((krate, by_name))
}

/// Whether `tokens` name `name` or `Self` anywhere (a field of a recursive type).
fn names(tokens: TokenStream, name: &syn::Ident) -> bool {
    tokens.into_iter().any(|t| match t {
        TokenTree::Ident(i) => i == *name || i == "Self",
        TokenTree::Group(g) => names(g.stream(), name),
        _ => false,
    })
}

/// The values the hash folds in order: a literal (a string's `leaf`, a count) or a field
/// type's `SHAPE`.
struct Parts {
    tr: TokenStream,
    name: syn::Ident,
    parts: Vec<TokenStream>,
}

impl Parts {
    fn word(&mut self, w: u64) {
        self.parts
            .push(Literal::u64_suffixed(w).into_token_stream());
    }

    fn str(&mut self, s: &str) {
        self.word(leaf(s));
    }

    fn ty(&mut self, ty: &Type, by_name: bool) {
        if by_name || names(ty.to_token_stream(), &self.name) {
            self.str(&format!("by name: {}", ty.to_token_stream()));
        } else {
            let tr = &self.tr;
            self.parts.push(quote!(<#ty as #tr>::SHAPE));
        }
    }

    /// A struct's or variant's fields; the types whose `SHAPE` the impl needs.
    fn fields(&mut self, fields: &Fields) -> syn::Result<()> {
        let mut kept = Vec::new();
        for f in fields {
            let (folds, skip) = serde_attrs(&f.attrs, Place::Field)?;
            let (_, by_name) = shape_attrs(&f.attrs, Place::Field)?;
            if !skip {
                kept.push((f, folds, by_name));
            }
        }
        self.word(kept.len() as u64);
        for (f, folds, by_name) in kept {
            if let Some(id) = &f.ident {
                self.str(&id.to_string());
            }
            for s in &folds {
                self.str(s);
            }
            self.ty(&f.ty, by_name);
        }
        Ok(())
    }
}

fn expand(input: &DeriveInput) -> syn::Result<TokenStream> {
    let (folds, _) = serde_attrs(&input.attrs, Place::Container)?;
    let (krate, _) = shape_attrs(&input.attrs, Place::Container)?;
    let tr = match krate {
        Some(path) => quote!(#path::Shape),
        None => quote!(Shape),
    };
    let mut p = Parts {
        tr: tr.clone(),
        name: input.ident.clone(),
        parts: Vec::new(),
    };
    let kind = match &input.data {
        Data::Struct(s) => match s.fields {
            Fields::Named(_) => "struct",
            Fields::Unnamed(_) => "tuple struct",
            Fields::Unit => "unit struct",
        },
        Data::Enum(_) => "enum",
        Data::Union(_) => {
            return Err(syn::Error::new_spanned(
                &input.ident,
                "#[derive(Shape)]: serde does not derive unions; implement `Shape` by hand",
            ))
        }
    };
    p.str(kind);
    p.str(&input.ident.to_string());
    // A parameter that only a recursive (by name) field holds still enters the hash.
    for t in input.generics.type_params() {
        let id = &t.ident;
        p.parts.push(quote!(<#id as #tr>::SHAPE));
    }
    for s in &folds {
        p.str(s);
    }
    match &input.data {
        Data::Struct(s) => p.fields(&s.fields)?,
        Data::Enum(e) => {
            p.word(e.variants.len() as u64);
            for v in &e.variants {
                let (folds, skip) = serde_attrs(&v.attrs, Place::Variant)?;
                if let Some(a) = v.attrs.iter().find(|a| a.path().is_ident("shape")) {
                    return Err(syn::Error::new_spanned(
                        a,
                        "no `shape` attribute on a variant",
                    ));
                }
                // A skipped variant keeps its place: serde numbers variants with it.
                p.str(match (&v.fields, skip) {
                    (_, true) => "skipped variant",
                    (Fields::Unit, _) => "unit variant",
                    (Fields::Unnamed(_), _) => "tuple variant",
                    (Fields::Named(_), _) => "struct variant",
                });
                p.str(&v.ident.to_string());
                for s in &folds {
                    p.str(s);
                }
                if !skip {
                    p.fields(&v.fields)?;
                }
            }
        }
        Data::Union(_) => unreachable!("refused above"),
    }

    let mut generics = input.generics.clone();
    for t in generics.type_params_mut() {
        t.bounds.push(syn::parse2(tr.clone())?);
    }
    let (impl_g, ty_g, where_c) = generics.split_for_impl();
    let name = &input.ident;
    let seed = Literal::u64_suffixed(SEED);
    let prime = Literal::u64_suffixed(PRIME);
    let h = syn::Ident::new("h", Span::mixed_site());
    let parts = &p.parts;
    Ok(quote! {
        impl #impl_g #tr for #name #ty_g #where_c {
            const SHAPE: u64 = {
                // `shape::fold`: FNV-1a 64 continued over `x`'s 8 little-endian bytes.
                const fn fold(h: u64, x: u64) -> u64 {
                    let b = x.to_le_bytes();
                    let mut h = h;
                    let mut i = 0;
                    while i < 8 {
                        h ^= b[i] as u64;
                        h = h.wrapping_mul(#prime);
                        i += 1;
                    }
                    h
                }
                let #h: u64 = #seed;
                #( let #h = fold(#h, #parts); )*
                #h
            };
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(input: DeriveInput) -> String {
        expand(&input).expect_err("refused").to_string()
    }

    /// Catches a derive that fingerprints a type whose serialized form its fields do not
    /// describe (a silently wrong fingerprint) instead of refusing it.
    #[test]
    fn wire_changing_serde_attributes_are_refused() {
        let cases: Vec<(DeriveInput, &str)> = vec![
            (
                syn::parse_quote! { struct A { #[serde(flatten)] x: B } },
                "flatten",
            ),
            (
                syn::parse_quote! { struct A { #[serde(with = "m")] x: B } },
                "with",
            ),
            (
                syn::parse_quote! { struct A { #[serde(serialize_with = "f")] x: B } },
                "serialize_with",
            ),
            (
                syn::parse_quote! { struct A { #[serde(deserialize_with = "f")] x: B } },
                "deserialize_with",
            ),
            (
                syn::parse_quote! { struct A { #[serde(skip_serializing_if = "f")] x: B } },
                "skip_serializing_if",
            ),
            (
                syn::parse_quote! { #[serde(tag = "t")] enum A { X } },
                "tag",
            ),
            (
                syn::parse_quote! { #[serde(tag = "t", content = "c")] enum A { X } },
                "tag",
            ),
            (
                syn::parse_quote! { #[serde(untagged)] enum A { X } },
                "untagged",
            ),
            (
                syn::parse_quote! { enum A { #[serde(untagged)] X(u8) } },
                "untagged",
            ),
            (
                syn::parse_quote! { #[serde(into = "u8", from = "u8")] struct A; },
                "into",
            ),
            (
                syn::parse_quote! { #[serde(remote = "B")] struct A; },
                "remote",
            ),
            (
                syn::parse_quote! { struct A { #[serde(some_future_thing)] x: u8 } },
                "some_future_thing",
            ),
        ];
        for (input, what) in cases {
            let e = err(input);
            assert!(e.contains(what) && e.contains("by hand"), "{what}: {e}");
        }
        assert!(err(syn::parse_quote! { union U { a: u8 } }).contains("union"));
        assert!(err(syn::parse_quote! { #[shape(by_name)] struct A; }).contains("unknown"));
    }

    /// Catches a renaming or skipping attribute that the hash ignores: the fingerprint of
    /// the same fields would not change when the serialized names or fields do.
    #[test]
    fn renames_enter_the_hash_and_skips_leave_it() {
        let out = |input: DeriveInput| expand(&input).unwrap().to_string();
        let plain = out(syn::parse_quote! { struct A { x: u8 } });
        let renamed = out(syn::parse_quote! { struct A { #[serde(rename = "y")] x: u8 } });
        let all = out(syn::parse_quote! { #[serde(rename_all = "UPPERCASE")] struct A { x: u8 } });
        let aliased = out(syn::parse_quote! { struct A { #[serde(alias = "y")] x: u8 } });
        let skipped = out(syn::parse_quote! { struct A { x: u8, #[serde(skip)] y: NoShape } });
        assert_ne!(plain, renamed);
        assert_ne!(plain, all);
        assert_eq!(plain, aliased);
        assert_eq!(plain, skipped, "a skipped field (and its type) is left out");
    }

    /// Catches a derive that refuses serde attributes that leave the wire format's bytes alone
    /// (or cannot parse their forms: a list, a keyword key).
    #[test]
    fn harmless_serde_attributes_are_taken() {
        let input: DeriveInput = syn::parse_quote! {
            #[serde(crate = "my_serde", deny_unknown_fields, default, expecting = "an A")]
            #[serde(bound(serialize = "T: Serialize", deserialize = "T: Deserialize<'de>"))]
            #[serde(rename(serialize = "B", deserialize = "B"))]
            struct A<T> {
                #[serde(alias = "y", default, borrow)]
                x: T,
                #[serde(skip, default = "f")]
                z: Nothing,
            }
        };
        expand(&input).expect("taken");
        let input: DeriveInput = syn::parse_quote! {
            enum A { #[serde(alias = "b", rename = "B", rename_all = "camelCase")] X { y: u8 } }
        };
        expand(&input).expect("taken");
    }

    /// Catches a recursive type whose `SHAPE` names itself (a const cycle, which does not
    /// compile) and a `by_name` field that still needs its type's `Shape`.
    #[test]
    fn recursive_and_by_name_fields_enter_as_written() {
        let input: DeriveInput = syn::parse_quote! {
            enum Tree { Leaf, Node(Vec<Tree>), Boxed { next: Option<Box<Self>> } }
        };
        let s = expand(&input).unwrap().to_string();
        assert!(!s.contains("as Shape"), "{s}");
        let input: DeriveInput = syn::parse_quote! {
            #[shape(crate = "amnet::typed")]
            struct A { #[shape(by_name)] id: uuid::Uuid, n: u8 }
        };
        let s = expand(&input).unwrap().to_string();
        assert!(!s.contains("Uuid as"), "{s}");
        assert!(
            s.contains("< u8 as amnet :: typed :: Shape > :: SHAPE"),
            "{s}"
        );
    }

    /// Catches an FNV-1a that is not the published one (am-core's `shape::fnv` is checked
    /// against the same vector, so the two crates' hashes agree).
    #[test]
    fn fnv_is_fnv1a_64() {
        assert_eq!(fnv(SEED, b""), SEED);
        assert_eq!(fnv(SEED, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(leaf("a"), fnv(fnv(SEED, &1u64.to_le_bytes()), b"a"));
    }
}
