//! Remote atomics: read-modify-write operations on one aligned 32- or 64-bit word of a
//! rank's segment (GASNet-EX's `gex_AD_OpNB`, UCX's `ucp_atomic_op_nbx`, OpenSHMEM's
//! `shmem_atomic_*`).
//!
//! A user names an operation as an [`AtomicOp`] on `u32`, `u64`, `i32`, `i64`, `f32` or `f64`
//! ([`AtomicWord`]): loads, stores, swaps, compare-and-swap, addition, minimum, maximum and
//! multiplication on every type, and, or, xor on the integers. The core, the transports and
//! the wire see it as an [`Atomic`] (its code, width, [`WordType`] and operands as bits in
//! 64). [`Atomic::apply`] performs one on a segment view with one atomic instruction where
//! the machine has it and a compare-and-swap loop otherwise: shared-memory transports apply
//! it to the target's mapped word at once ([`crate::transport::Rma::Atomic`]), ofi by the
//! provider's atomics where it validates every operation on every type (else as messages),
//! the others send it as a system message that the target's progress applies to its own
//! segment. One transport applies every atomic of a job the same way, so that atomics on one
//! word are atomic with each other whatever their operation or type.
//!
//! Every byte of a segment is accessed on the grid of aligned 8-byte words (see `am_shm`),
//! so a 32-bit operation is an instruction or a compare-and-swap loop on the 64-bit word that
//! holds it: its neighbour is never written, and no access of another size races with a
//! copy.
//!
//! Atomics are sequentially consistent with each other, whoever applies them. A put that has
//! completed ([`crate::Node::put`]) is visible to a later atomic on the same word, and an
//! atomic that has returned is visible to a later get.
//!
//! ```
//! use amnet::atomic::{Atomic, AtomicOp};
//! use amnet::Loopback;
//! # use amnet::LoopbackConfig;
//!
//! fn main() {
//!     let rank = Loopback::cluster(1, LoopbackConfig::default()).pop().unwrap();
//! #     use amnet::Transport;
//!     let seg = rank.segment();
//!     let add = Atomic::from(AtomicOp::FetchAdd(5u64));
//!     assert_eq!(add.apply(seg, 8), Ok(0));
//!     assert_eq!(add.apply(seg, 8), Ok(5));
//!     let cas = Atomic::from(AtomicOp::CompareSwap { current: 7u32, new: 1 });
//!     assert_eq!(cas.apply(seg, 8), Ok(10), "fails: the low half holds 10, not 7");
//!     assert_eq!(seg.load_u64(8).unwrap(), 10);
//!     assert_eq!(cas.apply(seg, 3), Err(amnet::atomic::Refused::Misaligned));
//! }
//! ```

use am_shm::sync::{AtomicU64, Ordering};

use am_shm::SharedBytes;

use crate::error::SendError;
use crate::types::Rank;

mod sealed {
    pub trait Sealed {}
    impl Sealed for u32 {}
    impl Sealed for u64 {}
    impl Sealed for i32 {}
    impl Sealed for i64 {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// The width of an atomic's word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Width {
    /// A 4-byte word, 4-aligned in the segment.
    U32,
    /// An 8-byte word, 8-aligned in the segment.
    U64,
}

impl Width {
    /// Its bytes (and alignment).
    pub const fn bytes(self) -> usize {
        match self {
            Width::U32 => 4,
            Width::U64 => 8,
        }
    }

    /// The bits of a word of this width, in the low bits of a `u64`.
    const fn mask(self) -> u64 {
        match self {
            Width::U32 => 0xffff_ffff,
            Width::U64 => u64::MAX,
        }
    }
}

/// How an atomic reads its word's bits: what addition, multiplication, minimum and maximum
/// mean. Loads, stores, swaps and compare-and-swap move and compare bits whatever the type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WordType {
    /// An unsigned integer (`u32`, `u64`).
    Unsigned,
    /// A two's-complement signed integer (`i32`, `i64`).
    Signed,
    /// An IEEE 754 binary floating-point number (`f32`, `f64`).
    Float,
}

impl WordType {
    const fn code(self) -> u32 {
        match self {
            WordType::Unsigned => 0,
            WordType::Signed => 1,
            WordType::Float => 2,
        }
    }

    const fn from_code(c: u32) -> Option<WordType> {
        match c {
            0 => Some(WordType::Unsigned),
            1 => Some(WordType::Signed),
            2 => Some(WordType::Float),
            _ => None,
        }
    }
}

/// A word type remote atomics operate on: `u32`, `u64`, `i32`, `i64`, `f32` or `f64`. Each is
/// also an [`Outcome`](crate::op::Outcome) of itself, what a fetching atomic's handle
/// completes with (`W: AtomicWord + Outcome<Value = W>` in code generic over the word).
pub trait AtomicWord: sealed::Sealed + Copy + PartialEq + std::fmt::Debug {
    /// Its width.
    const WIDTH: Width;
    /// How its bits are read.
    const TYPE: WordType;
    /// Its bits, in the low bits of a `u64` (the others zero).
    fn widen(self) -> u64;
    /// The word whose bits are the low bits of `v` (an old value read at this width).
    fn narrow(v: u64) -> Self;
}

macro_rules! atomic_word {
    ($($w:ty, $bits:ty, $width:ident, $ty:ident, |$x:ident| $to:expr, |$v:ident| $from:expr;)*) => {$(
        impl AtomicWord for $w {
            const WIDTH: Width = Width::$width;
            const TYPE: WordType = WordType::$ty;
            fn widen(self) -> u64 {
                let $x = self;
                u64::from($to)
            }
            fn narrow(v: u64) -> $w {
                let $v = v as $bits;
                $from
            }
        }
    )*};
}

atomic_word! {
    u32, u32, U32, Unsigned, |x| x, |v| v;
    u64, u64, U64, Unsigned, |x| x, |v| v;
    i32, u32, U32, Signed, |x| x as u32, |v| v as i32;
    i64, u64, U64, Signed, |x| x as u64, |v| v as i64;
    f32, u32, U32, Float, |x| x.to_bits(), |v| f32::from_bits(v);
    f64, u64, U64, Float, |x| x.to_bits(), |v| f64::from_bits(v);
}

/// What a remote atomic does with the word; every operation returns the word's old value
/// (a caller that does not need it ignores it, or posts the atomic:
/// [`crate::Node::atomic_nbi`]).
///
/// Integer additions and multiplications wrap. On floating-point words, additions and
/// multiplications are IEEE 754's (rounded to nearest); the minimum writes the operand only
/// if the word is greater than it, the maximum only if the word is less (so a NaN operand or
/// word leaves the word, and so does a zero of the other sign: what libfabric's
/// `FI_MIN`/`FI_MAX` do, so the result is the same whichever agent applies it). The bitwise
/// operations are for integers only: on a float they are refused
/// ([`crate::AmError::InvalidAtomic`]). Compare-and-swap compares bits, on every type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum AtomicOp<W: AtomicWord> {
    /// Reads the word.
    Load,
    /// Writes `v`.
    Store(W),
    /// Writes `v` (the same as [`AtomicOp::Store`]; named for the fetching form).
    Swap(W),
    /// Writes `new` if the word's bits are those of `current`.
    CompareSwap {
        /// The value expected.
        current: W,
        /// The value written if it was there.
        new: W,
    },
    /// Adds `v`.
    FetchAdd(W),
    /// Bitwise and with `v` (integers only).
    And(W),
    /// Bitwise or with `v` (integers only).
    Or(W),
    /// Bitwise exclusive or with `v` (integers only).
    Xor(W),
    /// The lesser of the word and `v`, as the word's type orders them.
    Min(W),
    /// The greater of the word and `v`, as the word's type orders them.
    Max(W),
    /// Multiplies by `v`.
    Mul(W),
}

/// The operation of an [`Atomic`], as its wire code says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
#[non_exhaustive]
pub enum Code {
    /// [`AtomicOp::Load`].
    Load = 0,
    /// [`AtomicOp::Store`].
    Store = 1,
    /// [`AtomicOp::Swap`].
    Swap = 2,
    /// [`AtomicOp::CompareSwap`].
    CompareSwap = 3,
    /// [`AtomicOp::FetchAdd`].
    FetchAdd = 4,
    /// [`AtomicOp::And`].
    And = 5,
    /// [`AtomicOp::Or`].
    Or = 6,
    /// [`AtomicOp::Xor`].
    Xor = 7,
    /// [`AtomicOp::Min`].
    Min = 8,
    /// [`AtomicOp::Max`].
    Max = 9,
    /// [`AtomicOp::Mul`].
    Mul = 10,
}

/// Every code, in wire order.
pub const CODES: [Code; 11] = [
    Code::Load,
    Code::Store,
    Code::Swap,
    Code::CompareSwap,
    Code::FetchAdd,
    Code::And,
    Code::Or,
    Code::Xor,
    Code::Min,
    Code::Max,
    Code::Mul,
];

/// Every word type: its width and how its bits are read.
pub const WORD_TYPES: [(Width, WordType); 6] = [
    (Width::U32, WordType::Unsigned),
    (Width::U64, WordType::Unsigned),
    (Width::U32, WordType::Signed),
    (Width::U64, WordType::Signed),
    (Width::U32, WordType::Float),
    (Width::U64, WordType::Float),
];

impl Code {
    /// Whether the operation is defined on words of type `ty` (the bitwise ones are not on
    /// floats).
    pub const fn applies_to(self, ty: WordType) -> bool {
        !matches!(
            (self, ty),
            (Code::And | Code::Or | Code::Xor, WordType::Float)
        )
    }
}

/// One remote atomic as the core, a transport and the wire see it: the operation, the width
/// and type of its word, its operand and (for compare-and-swap) the value expected, as bits
/// in the low bits of 64. Made from an [`AtomicOp`]; a decoded one is checked
/// ([`Atomic::from_wire`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Atomic {
    code: Code,
    width: Width,
    ty: WordType,
    operand: u64,
    current: u64,
}

impl<W: AtomicWord> From<AtomicOp<W>> for Atomic {
    fn from(op: AtomicOp<W>) -> Atomic {
        let (code, operand, current) = match op {
            AtomicOp::Load => (Code::Load, 0, 0),
            AtomicOp::Store(v) => (Code::Store, v.widen(), 0),
            AtomicOp::Swap(v) => (Code::Swap, v.widen(), 0),
            AtomicOp::CompareSwap { current, new } => {
                (Code::CompareSwap, new.widen(), current.widen())
            }
            AtomicOp::FetchAdd(v) => (Code::FetchAdd, v.widen(), 0),
            AtomicOp::And(v) => (Code::And, v.widen(), 0),
            AtomicOp::Or(v) => (Code::Or, v.widen(), 0),
            AtomicOp::Xor(v) => (Code::Xor, v.widen(), 0),
            AtomicOp::Min(v) => (Code::Min, v.widen(), 0),
            AtomicOp::Max(v) => (Code::Max, v.widen(), 0),
            AtomicOp::Mul(v) => (Code::Mul, v.widen(), 0),
        };
        Atomic {
            code,
            width: W::WIDTH,
            ty: W::TYPE,
            operand,
            current,
        }
    }
}

/// What a put-with-signal does to its signal word, a `u64` of the target's segment, once the
/// data is in place ([`crate::Node::put_signal`]; OpenSHMEM's `SHMEM_SIGNAL_SET` and
/// `SHMEM_SIGNAL_ADD`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Signal {
    /// Writes the value.
    Set(u64),
    /// Adds the value, wrapping (several signalers on one word: a counter).
    Add(u64),
}

impl Signal {
    /// The atomic that applies it.
    pub fn atomic(self) -> Atomic {
        Atomic::from(match self {
            Signal::Set(v) => AtomicOp::Store(v),
            Signal::Add(v) => AtomicOp::FetchAdd(v),
        })
    }
}

/// How [`crate::Node::wait_word`] compares a local `u64` word with its value (OpenSHMEM's
/// `SHMEM_CMP_*`): it returns once `word cmp value` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cmp {
    /// `word == value`.
    Eq,
    /// `word != value`.
    Ne,
    /// `word > value`.
    Gt,
    /// `word >= value`.
    Ge,
    /// `word < value`.
    Lt,
    /// `word <= value`.
    Le,
}

impl Cmp {
    /// Whether `word cmp value` holds.
    pub fn holds(self, word: u64, value: u64) -> bool {
        match self {
            Cmp::Eq => word == value,
            Cmp::Ne => word != value,
            Cmp::Gt => word > value,
            Cmp::Ge => word >= value,
            Cmp::Lt => word < value,
            Cmp::Le => word <= value,
        }
    }
}

/// A non-fetching atomic waiting to be applied ([`crate::Node::atomic_nbi`]): where, and
/// what.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Posted {
    /// The rank whose segment holds the word.
    pub dest: Rank,
    /// The word's offset in that segment.
    pub offset: usize,
    /// What to do with it.
    pub atomic: Atomic,
}

/// Applies `batch` in order for a transport that reaches the segments itself, `view(dest)`
/// giving `dest`'s segment: every word's cache line is fetched first, so that the misses
/// overlap instead of each atomic instruction waiting for its own (a locked instruction does
/// not overlap its miss with the next one). Every atomic is tried; the first error is
/// returned, a refused word being [`SendError::Device`].
pub fn apply_batch<'a>(
    batch: &[Posted],
    view: impl Fn(Rank) -> Result<SharedBytes<'a>, SendError>,
) -> Result<(), SendError> {
    const CHUNK: usize = 64;
    let mut first = Ok(());
    for chunk in batch.chunks(CHUNK) {
        // Each word is found and checked once, and its line fetched; then the atomics run.
        let mut words: [Option<(&AtomicU64, u32)>; CHUNK] = [None; CHUNK];
        for (slot, p) in words.iter_mut().zip(chunk) {
            let found = view(p.dest).and_then(|v| {
                v.prefetch(p.offset);
                p.atomic
                    .resolve(v, p.offset)
                    .map_err(|e| refused(p.dest, p.offset, e))
            });
            match found {
                Ok(w) => *slot = Some(w),
                Err(e) if first.is_ok() => first = Err(e),
                Err(_) => {}
            }
        }
        for (slot, p) in words.iter().zip(chunk) {
            if let Some((word, shift)) = slot {
                p.atomic.apply_resolved(word, *shift);
            }
        }
    }
    first
}

#[cold]
fn refused(dest: Rank, offset: usize, e: Refused) -> SendError {
    SendError::device(format!("atomic at {offset} of rank {dest}: {e:?}"))
}

/// What became of a batch of posted atomics ([`crate::transport::Rma::Atomics`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[must_use = "atomics past `done` were not applied"]
pub struct Batch {
    /// How many of the batch, from its start, were dealt with: applied, or refused for
    /// good. All of them, unless the device was busy ([`SendError::Busy`]) for the
    /// next one: that one and those after it were not tried, and nothing of them was done.
    pub done: usize,
    /// The first refusal among those dealt with, if any.
    pub error: Option<SendError>,
}

impl Batch {
    /// All `n` dealt with; `result` says whether one was refused.
    pub fn all(n: usize, result: Result<(), SendError>) -> Batch {
        Batch {
            done: n,
            error: result.err(),
        }
    }
}

/// Runs `apply` on every atomic of `batch`, in order: one refused for good does not stop
/// the others (one lost target does not stop the others' atomics), a busy device does.
pub fn each_posted(
    batch: &[Posted],
    mut apply: impl FnMut(&Posted) -> Result<(), SendError>,
) -> Batch {
    let mut error = None;
    for (i, p) in batch.iter().enumerate() {
        match apply(p) {
            Ok(()) => {}
            Err(SendError::Busy) => return Batch { done: i, error },
            Err(e) => {
                error.get_or_insert(e);
            }
        }
    }
    Batch {
        done: batch.len(),
        error,
    }
}

/// Why an atomic was not applied: nothing was read or written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// The word is not wholly inside the segment.
    OutOfBounds,
    /// The offset is not a multiple of the word's width.
    Misaligned,
    /// The operation is not defined on the word's type (a bitwise one on a float).
    Undefined,
}

impl Atomic {
    /// The operation.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The width of the word.
    pub fn width(&self) -> Width {
        self.width
    }

    /// How the word's bits are read.
    pub fn word_type(&self) -> WordType {
        self.ty
    }

    /// The code, width and type as one wire word: the code in bits 0..8, the width's bytes
    /// in bits 8..16, the type in bits 16..24 (0 unsigned, 1 signed, 2 float).
    pub fn wire_word(&self) -> u32 {
        self.code as u32 | (self.width.bytes() as u32) << 8 | self.ty.code() << 16
    }

    /// The operand and the value expected (0 unless a compare-and-swap), as bits.
    pub fn operands(&self) -> (u64, u64) {
        (self.operand, self.current)
    }

    /// The atomic a peer sent: `None` for a code, width or type that does not exist, an
    /// operation not defined on the type, or an operand wider than the word (a correct peer
    /// never sends one).
    pub fn from_wire(word: u32, operand: u64, current: u64) -> Option<Atomic> {
        let code = *CODES.get((word & 0xff) as usize)?;
        let width = match (word >> 8) & 0xff {
            4 => Width::U32,
            8 => Width::U64,
            _ => return None,
        };
        let ty = WordType::from_code(word >> 16)?;
        let fits = |v: u64| v & !width.mask() == 0;
        (fits(operand) && fits(current) && code.applies_to(ty)).then_some(Atomic {
            code,
            width,
            ty,
            operand,
            current,
        })
    }

    /// Whether the atomic can be applied at `offset` of `len` bytes: the operation defined on
    /// its type, the word inside the segment and aligned to its width.
    pub fn check(&self, offset: usize, len: usize) -> Result<(), Refused> {
        if !self.code.applies_to(self.ty) {
            return Err(Refused::Undefined);
        }
        let w = self.width.bytes();
        // The 8-byte word that holds it must be in the segment too (a 32-bit word in the
        // last half word of a segment whose length is not a multiple of 8 is not reachable).
        let grid_end = (offset & !7).checked_add(8);
        if offset.checked_add(w).is_none_or(|end| end > len) || grid_end.is_none_or(|e| e > len) {
            Err(Refused::OutOfBounds)
        } else if !offset.is_multiple_of(w) {
            Err(Refused::Misaligned)
        } else {
            Ok(())
        }
    }

    /// Applies the atomic to the word at `offset` of `segment` with one atomic instruction,
    /// or a compare-and-swap loop where none does the operation (a 32-bit word's, which
    /// works on the 8-byte word that holds it; a float's; a signed minimum); the word's old
    /// value. Refused, touching nothing, if the word is outside the segment or misaligned
    /// (also in memory: the segment view must start 8-aligned, as every segment does), or the
    /// operation is not defined on its type.
    pub fn apply(&self, segment: SharedBytes<'_>, offset: usize) -> Result<u64, Refused> {
        let (word, shift) = self.resolve(segment, offset)?;
        Ok(self.apply_resolved(word, shift))
    }

    /// The checks of [`Atomic::apply`]: the 8-byte word that holds the target word, and the
    /// shift of the target's bits in it.
    #[inline]
    fn resolve<'a>(
        &self,
        segment: SharedBytes<'a>,
        offset: usize,
    ) -> Result<(&'a AtomicU64, u32), Refused> {
        self.check(offset, segment.len())?;
        let base = offset & !7;
        let word = match segment.atomic_u64(base) {
            Ok(w) => w,
            // A 32-bit word in the last half word of a segment whose length is not a multiple
            // of 8: its 8-byte word is not all in the segment.
            Err(am_shm::ShmError::OutOfBounds { .. }) => return Err(Refused::OutOfBounds),
            Err(_) => return Err(Refused::Misaligned),
        };
        // A 32-bit word's bits within the 8-byte word, as memory order says.
        let low = (offset & 4 == 0) == cfg!(target_endian = "little");
        let shift = match self.width {
            Width::U32 if !low => 32,
            Width::U32 | Width::U64 => 0,
        };
        Ok((word, shift))
    }

    /// The atomic instruction on a word [`Atomic::resolve`] gave.
    #[inline]
    fn apply_resolved(&self, word: &AtomicU64, shift: u32) -> u64 {
        match self.width {
            Width::U64 => self.apply_u64(word),
            Width::U32 => self.apply_u32(word, shift),
        }
    }

    /// [`Atomic::apply`] as a transport does it on `dest`'s segment: a refused word is
    /// [`SendError::Device`] naming the word and the rank.
    pub fn apply_to(
        &self,
        dest: Rank,
        segment: SharedBytes<'_>,
        offset: usize,
    ) -> Result<u64, SendError> {
        self.apply(segment, offset)
            .map_err(|e| refused(dest, offset, e))
    }

    /// The word's new bits after the operation on its old bits `old` (both at the word's
    /// width), or `None` where it leaves the word as it is (a load, a failed
    /// compare-and-swap, a minimum that keeps the word).
    #[inline]
    pub fn combine(&self, old: u64) -> Option<u64> {
        use std::cmp::Ordering::{Greater, Less};
        let v = self.operand;
        let new = match (self.code, self.ty) {
            (Code::Load, _) => return None,
            (Code::Store | Code::Swap, _) => v,
            (Code::CompareSwap, _) if old == self.current => v,
            (Code::CompareSwap, _) => return None,
            (Code::And, _) => old & v,
            (Code::Or, _) => old | v,
            (Code::Xor, _) => old ^ v,
            (Code::FetchAdd | Code::Mul, WordType::Float) => self.float(old, v),
            (Code::FetchAdd, _) => old.wrapping_add(v),
            (Code::Mul, _) => old.wrapping_mul(v),
            // libfabric's FI_MIN and FI_MAX: the operand replaces the word only if the word
            // is strictly greater (less); a NaN on either side, or an equal value of the
            // other sign of zero, leaves the word.
            (Code::Min, _) if self.order(old, v) == Some(Greater) => v,
            (Code::Max, _) if self.order(old, v) == Some(Less) => v,
            (Code::Min | Code::Max, _) => return None,
        } & self.width.mask();
        (new != old).then_some(new)
    }

    /// The sum or (for [`Code::Mul`]) product of the floats whose bits are `a` and `b`, at
    /// the word's width (an `f32` one rounded once, in `f32`).
    #[inline]
    fn float(&self, a: u64, b: u64) -> u64 {
        let mul = self.code == Code::Mul;
        match self.width {
            Width::U32 => {
                let (a, b) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
                u64::from(if mul { a * b } else { a + b }.to_bits())
            }
            Width::U64 => {
                let (a, b) = (f64::from_bits(a), f64::from_bits(b));
                if mul { a * b } else { a + b }.to_bits()
            }
        }
    }

    /// How `a` compares with `b` as the word's type orders them (`None`: a NaN).
    #[inline]
    fn order(&self, a: u64, b: u64) -> Option<std::cmp::Ordering> {
        match (self.ty, self.width) {
            (WordType::Signed, Width::U32) => Some((a as u32 as i32).cmp(&(b as u32 as i32))),
            (WordType::Signed, Width::U64) => Some((a as i64).cmp(&(b as i64))),
            (WordType::Float, Width::U32) => {
                f32::from_bits(a as u32).partial_cmp(&f32::from_bits(b as u32))
            }
            (WordType::Float, Width::U64) => f64::from_bits(a).partial_cmp(&f64::from_bits(b)),
            _ => Some(a.cmp(&b)),
        }
    }

    fn apply_u64(&self, word: &AtomicU64) -> u64 {
        const SC: Ordering = Ordering::SeqCst;
        let v = self.operand;
        match (self.code, self.ty) {
            (Code::Load, _) => word.load(SC),
            // A store that reports the old value: the same instruction as a swap.
            (Code::Store | Code::Swap, _) => word.swap(v, SC),
            (Code::CompareSwap, _) => match word.compare_exchange(self.current, v, SC, SC) {
                Ok(old) | Err(old) => old,
            },
            (Code::FetchAdd, WordType::Unsigned | WordType::Signed) => word.fetch_add(v, SC),
            (Code::And, _) => word.fetch_and(v, SC),
            (Code::Or, _) => word.fetch_or(v, SC),
            (Code::Xor, _) => word.fetch_xor(v, SC),
            (Code::Min, WordType::Unsigned) => word.fetch_min(v, SC),
            (Code::Max, WordType::Unsigned) => word.fetch_max(v, SC),
            _ => self.update(word, 0),
        }
    }

    /// The 32-bit word at bit `shift` of `word`. And, or, xor and load need no loop: the
    /// other half is kept by the mask (all ones for and, zeros otherwise).
    fn apply_u32(&self, word: &AtomicU64, shift: u32) -> u64 {
        const SC: Ordering = Ordering::SeqCst;
        let mask = 0xffff_ffffu64 << shift;
        let v = (self.operand << shift) & mask;
        let old = match self.code {
            Code::Load => word.load(SC),
            Code::And => word.fetch_and(v | !mask, SC),
            Code::Or => word.fetch_or(v, SC),
            Code::Xor => word.fetch_xor(v, SC),
            _ => return self.update(word, shift),
        };
        (old & mask) >> shift
    }

    /// The operation as a compare-and-swap loop on the word's bits at `shift` of `word`
    /// ([`Atomic::combine`]), the other bits of `word` kept; the old value. A step that
    /// leaves the word writes nothing: it is a load.
    fn update(&self, word: &AtomicU64, shift: u32) -> u64 {
        const SC: Ordering = Ordering::SeqCst;
        let mask = self.width.mask() << shift;
        let mut seen = word.load(SC);
        loop {
            let old = (seen & mask) >> shift;
            let Some(new) = self.combine(old) else {
                return old;
            };
            let next = (seen & !mask) | (new << shift);
            match word.compare_exchange_weak(seen, next, SC, SC) {
                Ok(_) => return old,
                Err(now) => seen = now,
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use am_shm::Segment;
    use proptest::prelude::*;

    /// `each_posted` goes past a refusal but stops at a busy device, saying how far it got.
    #[test]
    fn each_posted_stops_at_busy_only() {
        let batch: Vec<Posted> = (0..5)
            .map(|i| Posted {
                dest: i,
                offset: 0,
                atomic: Atomic::from(AtomicOp::FetchAdd(1u64)),
            })
            .collect();
        let mut seen = Vec::new();
        let out = each_posted(&batch, |p| {
            seen.push(p.dest);
            match p.dest {
                1 => Err(SendError::PeerLost(1)),
                3 => Err(SendError::Busy),
                _ => Ok(()),
            }
        });
        assert_eq!(seen, [0, 1, 2, 3]);
        assert_eq!(
            out,
            Batch {
                done: 3,
                error: Some(SendError::PeerLost(1))
            }
        );
        let out = each_posted(&batch, |p| match p.dest {
            4 => Err(SendError::PeerDeparted(4)),
            _ => Ok(()),
        });
        assert_eq!(out, Batch::all(5, Err(SendError::PeerDeparted(4))));
    }

    /// A batch longer than one chunk, with a word out of bounds and a rank without a view
    /// in it: the others are applied in order (the compare-and-swap sees the store before
    /// it), 32-bit halves included, and the first error is the one returned.
    #[test]
    fn batch_applies_in_order_around_refusals_and_returns_the_first_error() {
        let seg = Segment::heap(16, 64).unwrap();
        let view = seg.byte_area();
        let post = |dest, offset, atomic| Posted {
            dest,
            offset,
            atomic,
        };
        let mut batch = vec![
            post(0, 0, Atomic::from(AtomicOp::Store(5u64))),
            post(0, 64, Atomic::from(AtomicOp::FetchAdd(1u64))),
            post(
                0,
                0,
                Atomic::from(AtomicOp::CompareSwap {
                    current: 5u64,
                    new: 7,
                }),
            ),
            post(9, 8, Atomic::from(AtomicOp::Store(1u64))),
        ];
        for _ in 0..15 {
            batch.push(post(0, 8, Atomic::from(AtomicOp::FetchAdd(3u64))));
        }
        batch.push(post(0, 20, Atomic::from(AtomicOp::Or(0xffu32))));
        let e = apply_batch(&batch, |d| {
            if d == 0 {
                Ok(view)
            } else {
                Err(SendError::PeerLost(d))
            }
        })
        .unwrap_err();
        assert!(
            matches!(&e, SendError::Device(d) if d.what().contains("at 64 of rank 0")),
            "{e:?}"
        );
        assert_eq!(view.load_u64(0).unwrap(), 7);
        assert_eq!(view.load_u64(8).unwrap(), 45);
        let high = if cfg!(target_endian = "little") {
            0xff << 32
        } else {
            0xff
        };
        assert_eq!(view.load_u64(16).unwrap(), high);
    }

    /// The operation on a plain value, in the word's own Rust type: the model the
    /// instructions must match.
    fn model(a: &Atomic, old: u64) -> u64 {
        let (v, cur) = a.operands();
        macro_rules! typed {
            ($t:ty, $bits:ty, $to:expr, $from:expr, $add:expr, $mul:expr) => {{
                let (o, x): ($t, $t) = ($from(old as $bits), $from(v as $bits));
                let r: $t = match a.code() {
                    Code::Load => o,
                    Code::Store | Code::Swap => x,
                    Code::CompareSwap => return if old == cur { v } else { old },
                    Code::FetchAdd => $add(o, x),
                    Code::Mul => $mul(o, x),
                    Code::Min => {
                        if o > x {
                            x
                        } else {
                            o
                        }
                    }
                    Code::Max => {
                        if o < x {
                            x
                        } else {
                            o
                        }
                    }
                    Code::And => return old & v,
                    Code::Or => return old | v,
                    Code::Xor => return old ^ v,
                };
                u64::from($to(r))
            }};
        }
        match (a.width(), a.word_type()) {
            (Width::U32, WordType::Unsigned) => {
                typed!(u32, u32, |r| r, |b| b, u32::wrapping_add, u32::wrapping_mul)
            }
            (Width::U64, WordType::Unsigned) => {
                typed!(u64, u64, |r| r, |b| b, u64::wrapping_add, u64::wrapping_mul)
            }
            (Width::U32, WordType::Signed) => typed!(
                i32,
                u32,
                |r: i32| r as u32,
                |b| b as i32,
                i32::wrapping_add,
                i32::wrapping_mul
            ),
            (Width::U64, WordType::Signed) => typed!(
                i64,
                u64,
                |r: i64| r as u64,
                |b| b as i64,
                i64::wrapping_add,
                i64::wrapping_mul
            ),
            (Width::U32, WordType::Float) => typed!(
                f32,
                u32,
                f32::to_bits,
                f32::from_bits,
                |p: f32, q| p + q,
                |p: f32, q| p * q
            ),
            (Width::U64, WordType::Float) => typed!(
                f64,
                u64,
                f64::to_bits,
                f64::from_bits,
                |p: f64, q| p + q,
                |p: f64, q| p * q
            ),
        }
    }

    /// Whether `bits`, the result of float arithmetic `a` (a sum or a product), are a NaN of
    /// its width.
    fn is_made_nan(a: &Atomic, bits: u64) -> bool {
        a.word_type() == WordType::Float
            && matches!(a.code(), Code::FetchAdd | Code::Mul)
            && match a.width() {
                Width::U32 => f32::from_bits(bits as u32).is_nan(),
                Width::U64 => f64::from_bits(bits).is_nan(),
            }
    }

    /// Small integers and ordinary floats half the time (so that minima, maxima and
    /// compare-and-swap decide both ways), any bits otherwise.
    fn any_bits() -> impl Strategy<Value = u64> {
        prop_oneof![
            any::<u64>(),
            (-8i64..8).prop_map(|v| v as u64),
            (-8i32..8).prop_map(|v| u64::from((v as f32 / 2.0).to_bits())),
            (-8i32..8).prop_map(|v| (f64::from(v) / 2.0).to_bits()),
            // NaNs and negative zeros, where minima and maxima are easy to get wrong.
            prop_oneof![
                Just(f64::NAN.to_bits()),
                Just((-0.0f64).to_bits()),
                Just(u64::from(f32::NAN.to_bits())),
                Just(u64::from((-0.0f32).to_bits())),
            ],
        ]
    }

    fn any_atomic() -> impl Strategy<Value = Atomic> {
        (0..CODES.len(), 0..WORD_TYPES.len(), any_bits(), any_bits()).prop_filter_map(
            "defined on its type",
            |(c, t, v, cur)| {
                let (width, ty) = WORD_TYPES[t];
                let code = CODES[c];
                // Often the value expected, so that compare-and-swap succeeds too.
                let cur = if cur % 2 == 0 { v } else { cur };
                let cur = if code == Code::CompareSwap { cur } else { 0 };
                let m = width.mask();
                code.applies_to(ty).then_some(Atomic {
                    code,
                    width,
                    ty,
                    operand: v & m,
                    current: cur & m,
                })
            },
        )
    }

    /// The most operations in a case of `ops_match_the_model`: fewer under Miri, where
    /// generating one costs about a second.
    const MODEL_OPS: usize = if cfg!(miri) { 8 } else { 40 };

    proptest! {
        /// Each operation does to its word what the model says, returns the old value, and
        /// leaves every other byte (the other half of a 32-bit word's 8 bytes) alone.
        #[test]
        fn ops_match_the_model(
            ops in proptest::collection::vec((any_atomic(), 0..4usize), 1..MODEL_OPS),
            fill in any::<u64>(),
        ) {
            let seg = Segment::heap(0, 32).unwrap();
            let view = seg.byte_area();
            let mut mem = [fill, !fill, fill.rotate_left(7), 0];
            for (i, w) in mem.iter().enumerate() {
                view.store_u64(i * 8, *w).unwrap();
            }
            for (a, slot) in ops {
                let off = slot * a.width().bytes();
                let (wi, shift) = (off / 8, (off % 8) * 8);
                let mask = match a.width() { Width::U32 => 0xffff_ffffu64 << shift, Width::U64 => u64::MAX };
                let old = (mem[wi] & mask) >> shift;
                prop_assert_eq!(a.apply(view, off), Ok(old));
                let mut new = model(&a, old);
                // Rust leaves the sign and payload of a NaN that arithmetic makes unspecified
                // (Miri picks them at random): a float sum or product that is a NaN must be
                // one, in whatever bits the instruction gave.
                if is_made_nan(&a, new) {
                    let got = (view.load_u64(wi * 8).unwrap() & mask) >> shift;
                    prop_assert!(is_made_nan(&a, got), "word {} holds {:#x}, not a NaN", wi, got);
                    new = got;
                }
                mem[wi] = (mem[wi] & !mask) | (new << shift);
                for (i, w) in mem.iter().enumerate() {
                    prop_assert_eq!(view.load_u64(i * 8).unwrap(), *w, "word {}", i);
                }
            }
        }

        /// What goes on the wire comes back the same.
        #[test]
        fn wire_round_trip(a in any_atomic()) {
            let (v, cur) = a.operands();
            prop_assert_eq!(Atomic::from_wire(a.wire_word(), v, cur), Some(a));
        }
    }

    #[test]
    fn a_peers_nonsense_is_refused() {
        let add = Atomic::from(AtomicOp::FetchAdd(1u32));
        let (v, cur) = add.operands();
        assert_eq!(Atomic::from_wire(11 | 4 << 8, v, cur), None, "no code 11");
        assert_eq!(
            Atomic::from_wire(4 | 4 << 8 | 3 << 16, v, cur),
            None,
            "no type 3"
        );
        assert_eq!(
            Atomic::from_wire(7 | 8 << 8 | 2 << 16, v, cur),
            None,
            "no xor on floats"
        );
        assert!(Atomic::from_wire(9 | 8 << 8 | 2 << 16, v, cur).is_some());
        assert_eq!(
            Atomic::from_wire(4 | 2 << 8, v, cur),
            None,
            "no 2-byte words"
        );
        assert_eq!(Atomic::from_wire(add.wire_word(), 1 << 32, 0), None);
        assert_eq!(Atomic::from_wire(add.wire_word(), 1, 1 << 40), None);
        assert!(Atomic::from_wire(add.wire_word() & 0xff | 8 << 8, 1 << 32, 0).is_some());
    }

    #[test]
    fn outside_or_misaligned_words_are_refused_untouched() {
        let seg = Segment::heap(0, 20).unwrap();
        let view = seg.byte_area();
        let set = Atomic::from(AtomicOp::Store(u64::MAX));
        assert_eq!(set.apply(view, 16), Err(Refused::OutOfBounds));
        assert_eq!(set.apply(view, usize::MAX - 3), Err(Refused::OutOfBounds));
        assert_eq!(set.apply(view, 4), Err(Refused::Misaligned));
        let set32 = Atomic::from(AtomicOp::Store(u32::MAX));
        assert_eq!(set32.apply(view, 2), Err(Refused::Misaligned));
        assert_eq!(set32.apply(view, 20), Err(Refused::OutOfBounds));
        // Bytes 16..20 are in the segment, but their 8-byte word is not all in it.
        assert_eq!(set32.apply(view, 16), Err(Refused::OutOfBounds));
        assert!(view.to_vec().iter().all(|&b| b == 0));
        // A view that starts off the word grid cannot be used for atomics.
        let odd = view.slice(4, 8).unwrap();
        assert_eq!(set32.apply(odd, 0), Err(Refused::Misaligned));
        // No bitwise operation on a float.
        assert_eq!(
            Atomic::from(AtomicOp::Xor(1.0f64)).apply(view, 0),
            Err(Refused::Undefined)
        );
        assert_eq!(
            Atomic::from(AtomicOp::And(1.0f32)).apply(view, 0),
            Err(Refused::Undefined)
        );
        assert!(view.to_vec().iter().all(|&b| b == 0));
    }

    /// Threads adding to both halves of one word, to a 64-bit word, to an `f32` and an
    /// `f64` (compare-and-swap loops, each a whole number of halves: exact sums), and taking
    /// a signed maximum: no update is lost.
    #[test]
    fn concurrent_adds_lose_nothing() {
        let seg = Segment::heap(0, 32).unwrap();
        let (n, per) = (4u64, if cfg!(miri) { 20 } else { 10_000 });
        std::thread::scope(|s| {
            for t in 0..n {
                let seg = &seg;
                s.spawn(move || {
                    let view = seg.byte_area();
                    let half = Atomic::from(AtomicOp::FetchAdd(1u32));
                    let whole = Atomic::from(AtomicOp::FetchAdd(3u64));
                    let f = Atomic::from(AtomicOp::FetchAdd(0.5f32));
                    let d = Atomic::from(AtomicOp::FetchAdd(1.5f64));
                    for i in 0..per {
                        half.apply(view, 4 * (t as usize % 2)).unwrap();
                        whole.apply(view, 8).unwrap();
                        f.apply(view, 16).unwrap();
                        d.apply(view, 24).unwrap();
                        let v = (t * per + i) as i32 - 5;
                        Atomic::from(AtomicOp::Max(v)).apply(view, 20).unwrap();
                    }
                });
            }
        });
        let view = seg.byte_area();
        let lo = Atomic::from(AtomicOp::Load::<u32>);
        assert_eq!(lo.apply(view, 0), Ok(n / 2 * per));
        assert_eq!(lo.apply(view, 4), Ok(n / 2 * per));
        assert_eq!(view.load_u64(8).unwrap(), 3 * n * per);
        let f = f32::from_bits(lo.apply(view, 16).unwrap() as u32);
        assert_eq!(f, 0.5 * (n * per) as f32);
        let top = lo.apply(view, 20).unwrap() as u32 as i32;
        assert_eq!(top, (n * per) as i32 - 6, "signed: -5 is not the greatest");
        assert_eq!(
            f64::from_bits(view.load_u64(24).unwrap()),
            1.5 * (n * per) as f64
        );
    }
}
