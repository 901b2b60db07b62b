//! What a reduction combines: the element types ([`Element`]) and the operations
//! ([`ReduceOp`]) of [`crate::Node::team_reduce`] and [`crate::Node::team_all_reduce`].
//!
//! Elements travel as little-endian bytes; a reduction applies its operation element by
//! element, always as `op(lower, upper)` where `lower` covers members of lower team ranks,
//! so an associative operation need not be commutative, and every member of an all-reduce
//! computes the same operations on the same operands (floating-point results agree bit for
//! bit across members).

use std::sync::Arc;

use crate::error::AmError;
pub use crate::types::{ReduceId, ReduceOp};

mod sealed {
    pub trait Sealed {}
}

/// A user's operation as a handler table keeps it: over whole elements of its type, as
/// bytes, `acc = op(acc, other)` (`acc_lower`) or `op(other, acc)`.
pub(crate) type Combine = Arc<dyn Fn(&mut [u8], &[u8], bool) + Send + Sync>;

/// A registered user reduction.
#[derive(Clone)]
pub(crate) struct UserReduction {
    pub(crate) name: String,
    /// The element type's code, size and name (which tells two [`Plain`] types apart).
    pub(crate) elem: u32,
    pub(crate) size: usize,
    pub(crate) type_name: &'static str,
    pub(crate) f: Combine,
}

impl UserReduction {
    /// `f` over `E`, element by element.
    pub(crate) fn new<E: Element>(
        name: &str,
        f: impl Fn(E, E) -> E + Send + Sync + 'static,
    ) -> UserReduction {
        let combine = move |acc: &mut [u8], other: &[u8], acc_lower: bool| {
            elementwise(acc, other, acc_lower, &f)
        };
        UserReduction {
            name: name.to_owned(),
            elem: E::CODE,
            size: E::SIZE,
            type_name: std::any::type_name::<E>(),
            f: Arc::new(combine),
        }
    }
}

impl ReduceOp {
    fn code(self) -> u32 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Product => 2,
            ReduceOp::Min => 3,
            ReduceOp::Max => 4,
            ReduceOp::And => 5,
            ReduceOp::Or => 6,
            ReduceOp::Xor => 7,
            // Its word is its own (`Reduction::word`).
            ReduceOp::User(_) => 0,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<ReduceOp> {
        Some(match code {
            1 => ReduceOp::Sum,
            2 => ReduceOp::Product,
            3 => ReduceOp::Min,
            4 => ReduceOp::Max,
            5 => ReduceOp::And,
            6 => ReduceOp::Or,
            7 => ReduceOp::Xor,
            _ => return None,
        })
    }

    fn bitwise(self) -> bool {
        matches!(self, ReduceOp::And | ReduceOp::Or | ReduceOp::Xor)
    }
}

/// The types a reduction combines: `u8` to `u64`, `i8` to `i64`, `f32` and `f64`. Sealed:
/// each has a code on the wire, so that members reducing different types disagree visibly
/// ([`AmError::CollectiveMismatch`]).
pub trait Element: sealed::Sealed + Copy + Send + Sync + std::fmt::Debug + 'static {
    /// Bytes per element.
    const SIZE: usize;
    /// The element's code on the wire.
    #[doc(hidden)]
    const CODE: u32;
    /// Whether the bitwise operations apply.
    #[doc(hidden)]
    const INTEGER: bool;
    /// Whether the built-in operations apply (not to a [`Plain`] element).
    #[doc(hidden)]
    const NUMBER: bool = true;
    /// Writes the element's little-endian bytes to `out` (`SIZE` bytes).
    #[doc(hidden)]
    fn write(self, out: &mut [u8]);
    /// The element of `SIZE` little-endian bytes.
    #[doc(hidden)]
    fn take(b: &[u8]) -> Self;
    /// `op(self, other)`.
    #[doc(hidden)]
    fn apply(self, op: ReduceOp, other: Self) -> Self;
    /// Elements from their bytes (a multiple of `SIZE`; the rest ignored).
    #[doc(hidden)]
    fn from_bytes(b: Vec<u8>) -> Vec<Self> {
        b.chunks_exact(Self::SIZE).map(Self::take).collect()
    }
}

/// The encodings [`to_bytes`] zeroes itself rather than through calloc, in bytes.
const SMALL: usize = 4096;

/// `elems` as little-endian bytes.
pub(crate) fn to_bytes<E: Element>(elems: &[E]) -> Vec<u8> {
    let len = elems.len() * E::SIZE;
    let mut out = if len <= SMALL {
        // Below a page, malloc and a zeroing pass cost less than calloc (the lint assumes
        // the opposite).
        #[allow(clippy::slow_vector_initialization)]
        let mut v = Vec::with_capacity(len);
        v.resize(len, 0);
        v
    } else {
        // Above, the pages calloc maps come zeroed.
        vec![0u8; len]
    };
    if E::SIZE == 0 {
        // A zero-sized plain element: no bytes (its reduction is refused when it starts).
        return out;
    }
    for (o, &e) in out.chunks_exact_mut(E::SIZE).zip(elems) {
        e.write(o);
    }
    out
}

macro_rules! integer {
    ($($t:ty = $code:expr),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            const CODE: u32 = $code;
            const INTEGER: bool = true;
            fn write(self, out: &mut [u8]) {
                out[..Self::SIZE].copy_from_slice(&self.to_le_bytes());
            }
            fn take(b: &[u8]) -> $t {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..Self::SIZE]);
                <$t>::from_le_bytes(a)
            }
            fn apply(self, op: ReduceOp, o: $t) -> $t {
                match op {
                    ReduceOp::Sum => self.wrapping_add(o),
                    ReduceOp::Product => self.wrapping_mul(o),
                    ReduceOp::Min => self.min(o),
                    ReduceOp::Max => self.max(o),
                    ReduceOp::And => self & o,
                    ReduceOp::Or => self | o,
                    ReduceOp::Xor => self ^ o,
                    // Applied by its registered function (`Reduction::combine`).
                    ReduceOp::User(_) => self,
                }
            }
        }
    )*};
}

integer!(u16 = 2, u32 = 3, u64 = 4, i8 = 5, i16 = 6, i32 = 7, i64 = 8);

// u8 by hand: its bytes are its elements, taken as they are.
impl sealed::Sealed for u8 {}
impl Element for u8 {
    const SIZE: usize = 1;
    const CODE: u32 = 1;
    const INTEGER: bool = true;
    fn write(self, out: &mut [u8]) {
        out[0] = self;
    }
    fn take(b: &[u8]) -> u8 {
        b[0]
    }
    fn apply(self, op: ReduceOp, o: u8) -> u8 {
        match op {
            ReduceOp::Sum => self.wrapping_add(o),
            ReduceOp::Product => self.wrapping_mul(o),
            ReduceOp::Min => self.min(o),
            ReduceOp::Max => self.max(o),
            ReduceOp::And => self & o,
            ReduceOp::Or => self | o,
            ReduceOp::Xor => self ^ o,
            ReduceOp::User(_) => self,
        }
    }
    fn from_bytes(b: Vec<u8>) -> Vec<u8> {
        b
    }
}

macro_rules! float {
    ($($t:ty = $code:expr),*) => {$(
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            const CODE: u32 = $code;
            const INTEGER: bool = false;
            fn write(self, out: &mut [u8]) {
                out[..Self::SIZE].copy_from_slice(&self.to_le_bytes());
            }
            fn take(b: &[u8]) -> $t {
                let mut a = [0u8; std::mem::size_of::<$t>()];
                a.copy_from_slice(&b[..Self::SIZE]);
                <$t>::from_le_bytes(a)
            }
            fn apply(self, op: ReduceOp, o: $t) -> $t {
                match op {
                    ReduceOp::Sum => self + o,
                    ReduceOp::Product => self * o,
                    ReduceOp::Min => self.min(o),
                    ReduceOp::Max => self.max(o),
                    // Refused when the reduction starts (`Reduction::new`), or applied by
                    // its registered function.
                    ReduceOp::And | ReduceOp::Or | ReduceOp::Xor | ReduceOp::User(_) => self,
                }
            }
        }
    )*};
}

float!(f32 = 9, f64 = 10);

/// A plain-old-data element of a user reduction: any type without padding or invalid bit
/// patterns ([`bytemuck::Pod`], usually derived), reduced by the operation registered for
/// `Plain<T>` with [`crate::Handlers::reduction`] (the built-in [`ReduceOp`]s are numbers'
/// and refuse it): a value with its index (MPI's `MINLOC`), a small fixed-size vector, a
/// histogram bucket.
///
/// Its bytes travel in the machine's own byte order, so every rank of the job must share
/// it (the built-in elements travel little-endian). An element larger than a transport's
/// `max_medium` cannot be reduced in more than one step there:
/// [`AmError::InvalidCollective`].
///
/// ```
/// use amnet::bytemuck::{Pod, Zeroable};
/// use amnet::{Config, Handlers, Loopback, Node, Plain, ReduceId, ReduceOp};
///
/// #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
/// #[repr(C)]
/// struct MinLoc {
///     value: f64,
///     rank: u64,
/// }
/// const MIN_LOC: ReduceId = ReduceId(1);
///
/// fn main() {
///
///     amnet::run_ranks(Loopback::cluster(3, Default::default()), |t| {
///         let mut handlers = Handlers::new();
///         handlers
///             .reduction(MIN_LOC, "min loc", |a: Plain<MinLoc>, b: Plain<MinLoc>| {
///                 if b.0.value < a.0.value { b } else { a }
///             })
///             .unwrap();
///         let mut node = Node::new(t, handlers, Config::default()).unwrap();
///         let world = node.world_team();
///         let mine = MinLoc { value: 10.0 - node.rank() as f64, rank: node.rank().into() };
///         let min = node.team_all_reduce(&world, ReduceOp::User(MIN_LOC), &[Plain(mine)]).unwrap();
///         assert_eq!(min[0].0, MinLoc { value: 8.0, rank: 2 });
///     });
/// }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Plain<T>(pub T);

impl<T: bytemuck::Pod> sealed::Sealed for Plain<T> {}
impl<T: bytemuck::Pod + std::fmt::Debug + Send + Sync> Element for Plain<T> {
    const SIZE: usize = std::mem::size_of::<T>();
    /// One code for every plain type: a user reduction checks the type by its name.
    const CODE: u32 = 11;
    const INTEGER: bool = false;
    const NUMBER: bool = false;
    fn write(self, out: &mut [u8]) {
        out[..Self::SIZE].copy_from_slice(bytemuck::bytes_of(&self.0));
    }
    fn take(b: &[u8]) -> Self {
        Plain(bytemuck::pod_read_unaligned(&b[..Self::SIZE]))
    }
    fn apply(self, _: ReduceOp, _: Self) -> Self {
        // Never called: `Reduction::new` refuses the built-in operations over a plain type,
        // and a user's operation is applied by its registered function.
        self
    }
}

/// `acc = f(acc, other)` (`acc_lower`) or `acc = f(other, acc)`, element by element of `E`
/// over little-endian bytes; both hold the same whole number of elements.
fn elementwise<E: Element>(acc: &mut [u8], other: &[u8], acc_lower: bool, f: impl Fn(E, E) -> E) {
    for (a, b) in acc
        .chunks_exact_mut(E::SIZE)
        .zip(other.chunks_exact(E::SIZE))
    {
        let (x, y) = (E::take(a), E::take(b));
        let r = if acc_lower { f(x, y) } else { f(y, x) };
        r.write(a);
    }
}

/// A reduction as the engine carries it: the operation and the element type, one word on
/// the wire (`element code | op code << 8`, or `1 << 16 | id` for a user's operation, whose
/// registration names its element type and is the same on every rank).
#[derive(Clone)]
pub(crate) struct Reduction {
    op: ReduceOp,
    elem: u32,
    size: usize,
    user: Option<Combine>,
}

impl std::fmt::Debug for Reduction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reduction")
            .field("op", &self.op)
            .field("elem", &self.elem)
            .finish()
    }
}

impl Reduction {
    /// `op` over `E`; a bitwise operation over a float type is refused.
    pub(crate) fn new<E: Element>(op: ReduceOp) -> Result<Reduction, AmError> {
        if let ReduceOp::User(_) = op {
            // Its function is in the handlers: `Reduction::user`.
            return Err(AmError::InvalidCollective(
                "a user reduction not registered in this node's handlers",
            ));
        }
        if !E::NUMBER {
            return Err(AmError::InvalidCollective(
                "a built-in reduction over a Plain element (register a user reduction)",
            ));
        }
        if op.bitwise() && !E::INTEGER {
            return Err(AmError::InvalidCollective(
                "a bitwise reduction over a floating-point type",
            ));
        }
        Ok(Reduction {
            op,
            elem: E::CODE,
            size: E::SIZE,
            user: None,
        })
    }

    /// The user's operation `id`, registered as `user` (or not: `None`), over `E`.
    pub(crate) fn user<E: Element>(
        id: ReduceId,
        user: Option<&UserReduction>,
    ) -> Result<Reduction, AmError> {
        let Some(u) = user else {
            return Err(AmError::InvalidCollective(
                "a user reduction not registered in this node's handlers",
            ));
        };
        if E::SIZE == 0 {
            // No element has bytes to reduce, and a length divides by none.
            return Err(AmError::InvalidCollective(
                "a user reduction over a zero-sized element",
            ));
        }
        if u.elem != E::CODE || u.type_name != std::any::type_name::<E>() {
            return Err(AmError::InvalidCollective(
                "a user reduction over another element type than it was registered for",
            ));
        }
        Ok(Reduction {
            op: ReduceOp::User(id),
            elem: u.elem,
            size: u.size,
            user: Some(u.f.clone()),
        })
    }

    /// Its word on the wire.
    pub(crate) fn word(&self) -> u32 {
        match self.op {
            ReduceOp::User(id) => 1 << 16 | u32::from(id.0),
            op => self.elem | op.code() << 8,
        }
    }

    /// The element code and operation a word names, if any.
    #[cfg(test)]
    fn from_word(word: u32) -> Option<(u32, ReduceOp)> {
        Some((word & 0xff, ReduceOp::from_code(word >> 8)?))
    }

    /// Whether it is a user's operation (which need not be commutative).
    pub(crate) fn is_user(&self) -> bool {
        self.user.is_some()
    }

    /// Bytes per element.
    pub(crate) fn size(&self) -> usize {
        self.size
    }

    /// `acc = op(acc, other)` (`acc_lower`) or `acc = op(other, acc)`, element by element;
    /// both hold the same whole number of elements.
    pub(crate) fn combine(&self, acc: &mut [u8], other: &[u8], acc_lower: bool) {
        if let Some(f) = &self.user {
            return f(acc, other, acc_lower);
        }
        fn each<E: Element>(op: ReduceOp, acc: &mut [u8], other: &[u8], acc_lower: bool) {
            // One loop per operation, so that each is a plain loop the compiler can
            // vectorize rather than a branch per element.
            macro_rules! with {
                ($($op:ident),*) => {
                    match op {
                        $(ReduceOp::$op => {
                            elementwise(acc, other, acc_lower, |x: E, y| x.apply(ReduceOp::$op, y))
                        })*
                        other_op => {
                            elementwise(acc, other, acc_lower, |x: E, y| x.apply(other_op, y))
                        }
                    }
                };
            }
            with!(Sum, Product, Min, Max, And, Or, Xor)
        }
        let f = match self.elem {
            1 => each::<u8>,
            2 => each::<u16>,
            3 => each::<u32>,
            4 => each::<u64>,
            5 => each::<i8>,
            6 => each::<i16>,
            7 => each::<i32>,
            8 => each::<i64>,
            9 => each::<f32>,
            _ => each::<f64>,
        };
        f(self.op, acc, other, acc_lower);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches an operation applied in the wrong order (a non-commutative use would differ)
    /// and a type decoded at the wrong width.
    #[test]
    fn combine_applies_the_op_elementwise_in_order() {
        let r = Reduction::new::<i32>(ReduceOp::Sum).unwrap();
        let mut a = to_bytes(&[1i32, -2, 3]);
        r.combine(&mut a, &to_bytes(&[10i32, 20, -30]), true);
        assert_eq!(i32::from_bytes(a), [11, 18, -27]);
        let r = Reduction::new::<f64>(ReduceOp::Max).unwrap();
        let mut a = to_bytes(&[1.5f64, -2.0]);
        r.combine(&mut a, &to_bytes(&[0.5f64, 7.25]), false);
        assert_eq!(f64::from_bytes(a), [1.5, 7.25]);
        let r = Reduction::new::<u16>(ReduceOp::Xor).unwrap();
        let mut a = to_bytes(&[0xff00u16]);
        r.combine(&mut a, &to_bytes(&[0x0ff0u16]), true);
        assert_eq!(u16::from_bytes(a), [0xf0f0]);
        assert!(Reduction::new::<f32>(ReduceOp::And).is_err());
        assert_eq!(
            Reduction::from_word(Reduction::new::<u64>(ReduceOp::Min).unwrap().word()),
            Some((4, ReduceOp::Min))
        );
    }
}
