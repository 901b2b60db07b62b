//! The AM wire format, shared by every transport.
//!
//! A message is a header, its arguments, then (for Medium, and for Long when the transport carries
//! the payload inline) the payload. All integers are little-endian.
//!
//! ```text
//! byte 0   flags: bit 0 reply, bit 1 system, bits 2-3 kind (0 Short, 1 Medium, 2 Long),
//!          bit 4 a Long into a created segment, bits 5-7 zero
//! byte 1   handler id (user messages) or system opcode
//! byte 2   number of 32-bit arguments, 0..=16
//! byte 3   credit byte: the policy's hint on requests, credits returned on replies
//! 4..8     payload length (u32)
//! 8..16    Long only: destination offset in the target's segment (u64)
//! then     arguments, 4 bytes each, then the payload
//! ```
//!
//! A Long into a created segment ([`crate::segment`], bit 4: user requests only) carries no
//! payload: its initiator wrote the payload into the target's segment before sending it. In
//! the payload's place it carries the segment's id ([`SEGMENT_ID_LEN`] bytes), and its
//! payload length is that of the bytes written.
//!
//! This is the seed's 8-byte GASNet header (request/reply, nargs, handler, length) plus the flag
//! bits the core needs. Bytes from a peer are untrusted: [`Header::decode`] checks every field and
//! the total length before anything is used.

use crate::types::{AmKind, Category};

/// The most arguments an AM can carry (GASNet's 16).
pub const MAX_ARGS: usize = 16;
/// Size of the fixed part of the header.
pub const BASE_HEADER_LEN: usize = 8;
/// Size of the header of a Long message (the fixed part plus the destination offset).
pub const LONG_HEADER_LEN: usize = 16;
/// The largest header plus arguments: what a transport must accept as the head of a message.
pub const MAX_HEAD_LEN: usize = LONG_HEADER_LEN + 4 * MAX_ARGS;

const FLAG_REPLY: u8 = 0b0001;
const FLAG_SYSTEM: u8 = 0b0010;
const KIND_SHIFT: u8 = 2;
const KIND_MASK: u8 = 0b1100;
const FLAG_SEGMENT: u8 = 0b1_0000;
const RESERVED_MASK: u8 = 0xE0;
/// The bytes a Long into a created segment carries in its payload's place: the segment's id.
pub const SEGMENT_ID_LEN: usize = 4;

/// A decoded AM header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Request or reply.
    pub category: Category,
    /// Short, Medium or Long.
    pub kind: AmKind,
    /// A core-internal message (barrier, put/get, exit, ...) rather than a user handler.
    pub system: bool,
    /// User handler id, or the system opcode when `system` is set.
    pub handler: u8,
    /// Number of arguments (0..=16).
    pub nargs: u8,
    /// Credit byte: flow-control hint on requests, credits returned on replies.
    pub credit: u8,
    /// Payload length in bytes.
    pub payload_len: u32,
    /// Destination offset of a Long payload in the target's segment; 0 otherwise.
    pub long_offset: u64,
}

/// Whether the head of a message [`Header::decode`] accepted is that of a Long into a created
/// segment ([`Header::encode_in_segment`]): its payload was written before, and the message
/// carries the segment's id ([`SEGMENT_ID_LEN`] bytes) where the payload would be.
#[inline]
pub fn in_segment(head: &[u8]) -> bool {
    head.first().is_some_and(|f| f & FLAG_SEGMENT != 0)
}

/// Why bytes could not be decoded as an AM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the header and arguments need.
    #[error("message truncated: {have} bytes, header and arguments need {need}")]
    Truncated {
        /// Bytes present.
        have: usize,
        /// Bytes the header announces.
        need: usize,
    },
    /// Reserved flag bits set or an undefined kind.
    #[error("invalid header flags {0:#04x}")]
    BadFlags(u8),
    /// More than [`MAX_ARGS`] arguments.
    #[error("{0} arguments announced, at most 16 allowed")]
    TooManyArgs(u8),
    /// A payload on a Short message.
    #[error("Short message announces a {0}-byte payload")]
    ShortWithPayload(u32),
    /// The message length does not match the announced payload length.
    #[error("payload length mismatch: header says {announced} bytes, {present} present")]
    LengthMismatch {
        /// Payload bytes the header announces.
        announced: u32,
        /// Payload bytes actually present after the arguments.
        present: usize,
    },
}

/// The head length the base header in `first` announces (its kind and argument count),
/// capped at [`MAX_HEAD_LEN`]: how many bytes to copy out of shared memory before decoding.
/// Nothing is checked here; [`Header::decode_prefix`] checks the copy.
#[inline]
pub fn head_len_hint(first: &[u8]) -> usize {
    let [flags, _, nargs, ..] = *first else {
        return first.len();
    };
    let base = if (flags & KIND_MASK) >> KIND_SHIFT == 2 {
        LONG_HEADER_LEN
    } else {
        BASE_HEADER_LEN
    };
    (base + 4 * nargs as usize).min(MAX_HEAD_LEN)
}

/// Request or reply, from the flags byte.
#[inline(always)]
fn category_of(flags: u8) -> Category {
    if flags & FLAG_REPLY != 0 {
        Category::Reply
    } else {
        Category::Request
    }
}

impl Header {
    /// Length of the header plus arguments on the wire.
    #[inline]
    pub fn head_len(&self) -> usize {
        let base = if self.kind == AmKind::Long {
            LONG_HEADER_LEN
        } else {
            BASE_HEADER_LEN
        };
        base + 4 * self.nargs as usize
    }

    /// Encodes the header and `args` into `out`, returning the number of bytes written.
    ///
    /// # Panics
    /// If `args.len() > MAX_ARGS` or `out` is shorter than [`MAX_HEAD_LEN`]; callers validate
    /// arguments first (the public API returns an error instead).
    #[inline]
    pub fn encode(&self, args: &[u32], out: &mut [u8; MAX_HEAD_LEN]) -> usize {
        assert!(args.len() <= MAX_ARGS, "at most 16 AM arguments");
        let mut flags = (self.kind as u8) << KIND_SHIFT;
        if self.category == Category::Reply {
            flags |= FLAG_REPLY;
        }
        if self.system {
            flags |= FLAG_SYSTEM;
        }
        // One store of the whole word: a transport reads it back as a word, and a word
        // read of bytes stored one by one waits for them (no store-to-load forwarding).
        let word = u64::from(flags)
            | u64::from(self.handler) << 8
            | (args.len() as u64) << 16
            | u64::from(self.credit) << 24
            | u64::from(self.payload_len) << 32;
        out[..8].copy_from_slice(&word.to_le_bytes());
        let mut at = BASE_HEADER_LEN;
        if self.kind == AmKind::Long {
            out[8..16].copy_from_slice(&self.long_offset.to_le_bytes());
            at = LONG_HEADER_LEN;
        }
        // Arguments two to a word, for the same reason.
        let mut pairs = args.chunks_exact(2);
        for p in &mut pairs {
            let w = u64::from(p[0]) | u64::from(p[1]) << 32;
            out[at..at + 8].copy_from_slice(&w.to_le_bytes());
            at += 8;
        }
        if let [last] = pairs.remainder() {
            out[at..at + 4].copy_from_slice(&last.to_le_bytes());
            at += 4;
        }
        at
    }

    /// [`encode`](Self::encode) of the head of a Long request into a created segment
    /// ([`in_segment`]): `payload_len` is that of the bytes its initiator wrote at
    /// `long_offset` of the segment, and the message carries the segment's id after the head.
    ///
    /// # Panics
    /// As [`encode`](Self::encode).
    pub fn encode_in_segment(&self, args: &[u32], out: &mut [u8; MAX_HEAD_LEN]) -> usize {
        debug_assert!(
            self.kind == AmKind::Long && self.category == Category::Request && !self.system
        );
        let n = self.encode(args, out);
        out[0] |= FLAG_SEGMENT;
        n
    }

    /// Decodes the header at the start of `bytes` and checks that the rest of `bytes` holds
    /// exactly the arguments and, if `payload_inline`, exactly the announced payload.
    ///
    /// Never panics, whatever the bytes.
    #[inline]
    pub fn decode(bytes: &[u8], payload_inline: bool) -> Result<Header, WireError> {
        Header::decode_prefix(bytes, bytes.len(), payload_inline)
    }

    /// [`decode`](Self::decode) of a message of `total` bytes from a private copy of its first
    /// bytes (`bytes`, at least `min(total, MAX_HEAD_LEN)` of them): how a message lent in
    /// shared memory is parsed, from the copy, never from the original.
    #[inline]
    pub fn decode_prefix(
        bytes: &[u8],
        total: usize,
        payload_inline: bool,
    ) -> Result<Header, WireError> {
        let bytes = &bytes[..bytes.len().min(total)];
        if bytes.len() < BASE_HEADER_LEN {
            return Err(WireError::Truncated {
                have: bytes.len(),
                need: BASE_HEADER_LEN,
            });
        }
        let flags = bytes[0];
        let kind = match (flags & KIND_MASK) >> KIND_SHIFT {
            0 => AmKind::Short,
            1 => AmKind::Medium,
            2 => AmKind::Long,
            _ => return Err(WireError::BadFlags(flags)),
        };
        let in_segment = flags & FLAG_SEGMENT != 0;
        // Only a user request is a Long into a created segment.
        if flags & RESERVED_MASK != 0
            || (in_segment && (kind != AmKind::Long || flags & (FLAG_REPLY | FLAG_SYSTEM) != 0))
        {
            return Err(WireError::BadFlags(flags));
        }
        let nargs = bytes[2];
        if nargs as usize > MAX_ARGS {
            return Err(WireError::TooManyArgs(nargs));
        }
        let payload_len = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        if kind == AmKind::Short && payload_len != 0 {
            return Err(WireError::ShortWithPayload(payload_len));
        }
        let mut header = Header {
            category: category_of(flags),
            kind,
            system: flags & FLAG_SYSTEM != 0,
            handler: bytes[1],
            nargs,
            credit: bytes[3],
            payload_len,
            long_offset: 0,
        };
        let head_len = header.head_len();
        if bytes.len() < head_len {
            return Err(WireError::Truncated {
                have: bytes.len(),
                need: head_len,
            });
        }
        if kind == AmKind::Long {
            let mut off = [0u8; 8];
            off.copy_from_slice(&bytes[8..16]);
            header.long_offset = u64::from_le_bytes(off);
        }
        let present = total - head_len;
        let expected = if in_segment {
            SEGMENT_ID_LEN
        } else if payload_inline || kind == AmKind::Medium {
            payload_len as usize
        } else {
            0
        };
        if present != expected {
            return Err(WireError::LengthMismatch {
                announced: payload_len,
                present,
            });
        }
        Ok(header)
    }

    /// The header of a user AM Short of `total` bytes from its first 8 bytes, read as one
    /// little-endian word: `Some` only if [`decode`](Self::decode) would accept it (no
    /// reserved or system bits, at most 16 arguments, no payload, exactly the arguments
    /// present). Anything else, malformed or not, is `None`: try
    /// [`user_medium`](Self::user_medium), then decode it the general way.
    #[inline(always)]
    pub fn user_short(word: u64, total: usize) -> Option<Header> {
        let [flags, handler, nargs, credit, l0, l1, l2, l3] = word.to_le_bytes();
        let ok = flags & !FLAG_REPLY == 0
            && nargs as usize <= MAX_ARGS
            && u32::from_le_bytes([l0, l1, l2, l3]) == 0
            && total == BASE_HEADER_LEN + 4 * nargs as usize;
        ok.then_some(Header {
            category: category_of(flags),
            kind: AmKind::Short,
            system: false,
            handler,
            nargs,
            credit,
            payload_len: 0,
            long_offset: 0,
        })
    }

    /// As [`user_short`](Self::user_short), for a user AM Medium: `Some` only if
    /// [`decode`](Self::decode) would accept it (exactly its arguments and payload present).
    #[inline(always)]
    pub fn user_medium(word: u64, total: usize) -> Option<Header> {
        const MEDIUM: u8 = (AmKind::Medium as u8) << KIND_SHIFT;
        let [flags, handler, nargs, credit, l0, l1, l2, l3] = word.to_le_bytes();
        let payload_len = u32::from_le_bytes([l0, l1, l2, l3]);
        let ok = flags & !FLAG_REPLY == MEDIUM
            && nargs as usize <= MAX_ARGS
            && total == BASE_HEADER_LEN + 4 * nargs as usize + payload_len as usize;
        ok.then_some(Header {
            category: category_of(flags),
            kind: AmKind::Medium,
            system: false,
            handler,
            nargs,
            credit,
            payload_len,
            long_offset: 0,
        })
    }

    /// Reads the arguments that follow a decoded header into `out`; returns them as a slice.
    ///
    /// `bytes` must be the same bytes [`Header::decode`] accepted.
    #[inline]
    pub fn read_args<'o>(&self, bytes: &[u8], out: &'o mut [u32; MAX_ARGS]) -> &'o [u32] {
        let start = self.head_len() - 4 * self.nargs as usize;
        let n = self.nargs as usize;
        for (i, chunk) in bytes[start..start + 4 * n].chunks_exact(4).enumerate() {
            out[i] = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        }
        &out[..n]
    }
}

/// Encodes into `buf` the head of a user (non-system) `kind` message to `handler` with `args`
/// and a payload of `payload_len` bytes announced; returns its length. What a transport's own
/// tests send through [`crate::Tx::try_send`] without a node.
///
/// # Panics
/// If `args.len() > MAX_ARGS`.
pub fn encode_head(
    category: Category,
    kind: AmKind,
    handler: u8,
    args: &[u32],
    payload_len: usize,
    buf: &mut [u8; MAX_HEAD_LEN],
) -> usize {
    Header {
        category,
        kind,
        system: false,
        handler,
        nargs: args.len() as u8,
        credit: 0,
        payload_len: payload_len as u32,
        long_offset: 0,
    }
    .encode(args, buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn kind_strategy() -> impl Strategy<Value = AmKind> {
        prop_oneof![
            Just(AmKind::Short),
            Just(AmKind::Medium),
            Just(AmKind::Long)
        ]
    }

    proptest! {
        #[test]
        fn round_trip(
            reply in any::<bool>(),
            system in any::<bool>(),
            kind in kind_strategy(),
            handler in any::<u8>(),
            credit in any::<u8>(),
            args in proptest::collection::vec(any::<u32>(), 0..=MAX_ARGS),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
            long_offset in any::<u64>(),
            inline in any::<bool>(),
            in_segment in any::<bool>(),
        ) {
            let payload = if kind == AmKind::Short { Vec::new() } else { payload };
            // Only a user Long request goes into a created segment.
            let in_seg = in_segment && kind == AmKind::Long && !reply && !system;
            let header = Header {
                category: if reply { Category::Reply } else { Category::Request },
                kind,
                system,
                handler,
                nargs: args.len() as u8,
                credit,
                payload_len: payload.len() as u32,
                long_offset: if kind == AmKind::Long { long_offset } else { 0 },
            };
            let mut head = [0u8; MAX_HEAD_LEN];
            let n = if in_seg {
                header.encode_in_segment(&args, &mut head)
            } else {
                header.encode(&args, &mut head)
            };
            prop_assert_eq!(n, header.head_len());
            let mut bytes = head[..n].to_vec();
            prop_assert_eq!(super::in_segment(&bytes), in_seg);
            let carries_payload = kind == AmKind::Medium || (kind == AmKind::Long && inline);
            if in_seg {
                bytes.extend_from_slice(&[7; SEGMENT_ID_LEN]);
            } else if carries_payload {
                bytes.extend_from_slice(&payload);
            }
            let decoded = Header::decode(&bytes, inline).unwrap();
            prop_assert_eq!(decoded, header);
            let mut out = [0u32; MAX_ARGS];
            prop_assert_eq!(decoded.read_args(&bytes, &mut out), &args[..]);
        }

        #[test]
        fn decoding_arbitrary_bytes_never_panics(
            bytes in proptest::collection::vec(any::<u8>(), 0..200),
            inline in any::<bool>(),
        ) {
            if let Ok(h) = Header::decode(&bytes, inline) {
                // Whatever was accepted is internally consistent.
                prop_assert!(h.nargs as usize <= MAX_ARGS);
                prop_assert!(bytes.len() >= h.head_len());
                let mut out = [0u32; MAX_ARGS];
                prop_assert_eq!(h.read_args(&bytes, &mut out).len(), h.nargs as usize);
            }
        }
    }

    proptest! {
        /// The one-word fast path accepts exactly the user Shorts and Mediums `decode` accepts, with the
        /// same header: a word it lets through is one the general decoder would refuse only
        /// if this test fails.
        #[test]
        fn user_short_and_medium_agree_with_decode(
            random in any::<u64>(),
            // Mostly near-valid user Shorts, so both answers are exercised.
            shaped in any::<bool>(),
            (flags, handler, nargs, credit) in (
                prop_oneof![0u8..=1, 0u8..=0x1f],
                any::<u8>(),
                prop_oneof![0u8..=16, 17u8..=20],
                any::<u8>(),
            ),
            len in prop_oneof![Just(0u8), any::<u8>()],
            matching in any::<bool>(),
            extra in 0usize..=80,
            inline in any::<bool>(),
        ) {
            let word = if shaped {
                u64::from_le_bytes([flags, handler, nargs, credit, len, 0, 0, 0])
            } else {
                random
            };
            // The length the word announces, where it is small enough to build.
            let announced = 4 * (word >> 16 & 0xff) as usize + (word >> 32) as usize;
            let extra = if matching && announced <= 200 { announced } else { extra };
            let mut bytes = word.to_le_bytes().to_vec();
            bytes.resize(8 + extra, 0xA5);
            let fast = Header::user_short(word, bytes.len())
                .or_else(|| Header::user_medium(word, bytes.len()));
            let general = Header::decode(&bytes, inline)
                .ok()
                .filter(|h| h.kind != AmKind::Long && !h.system);
            prop_assert_eq!(fast, general);
        }
    }

    #[test]
    fn user_short_and_user_medium_take_only_well_formed_ones() {
        let fast =
            |w, total| Header::user_short(w, total).or_else(|| Header::user_medium(w, total));
        let w =
            |flags: u8, nargs: u8, len: u8| u64::from_le_bytes([flags, 9, nargs, 3, len, 0, 0, 0]);
        let short = fast(w(0, 2, 0), 16).unwrap();
        assert_eq!((short.handler, short.nargs, short.credit), (9, 2, 3));
        assert_eq!(
            (short.category, short.kind),
            (Category::Request, AmKind::Short)
        );
        assert_eq!(
            fast(w(FLAG_REPLY, 0, 0), 8).unwrap().category,
            Category::Reply
        );
        let medium = fast(w(1 << KIND_SHIFT, 1, 5), 8 + 4 + 5).unwrap();
        assert_eq!(
            (medium.kind, medium.nargs, medium.payload_len),
            (AmKind::Medium, 1, 5)
        );
        for (word, total, why) in [
            (w(FLAG_SYSTEM, 0, 0), 8, "system"),
            (w(FLAG_SYSTEM | 1 << KIND_SHIFT, 0, 0), 8, "system Medium"),
            (w(1 << KIND_SHIFT, 0, 5), 8, "Medium payload missing"),
            (w(1 << KIND_SHIFT, 0, 5), 14, "Medium payload too long"),
            (w(2 << KIND_SHIFT, 0, 0), 16, "Long"),
            (w(3 << KIND_SHIFT, 0, 0), 8, "no kind"),
            (w(0x10, 0, 0), 8, "reserved bit"),
            (w(0, 17, 0), 8 + 68, "17 arguments"),
            (w(0, 0, 1), 9, "a Short with payload"),
            (w(0, 1, 0), 8, "an argument missing"),
            (w(0, 1, 0), 16, "bytes after the arguments"),
        ] {
            assert_eq!(fast(word, total), None, "{why}");
        }
    }

    #[test]
    fn rejects_bad_fields() {
        let mut head = [0u8; MAX_HEAD_LEN];
        let h = Header {
            category: Category::Request,
            kind: AmKind::Medium,
            system: false,
            handler: 7,
            nargs: 2,
            credit: 0,
            payload_len: 4,
            long_offset: 0,
        };
        let n = h.encode(&[1, 2], &mut head);
        let mut ok = head[..n].to_vec();
        ok.extend_from_slice(&[9, 9, 9, 9]);
        assert!(Header::decode(&ok, true).is_ok());
        assert!(matches!(
            Header::decode(&ok[..ok.len() - 1], true),
            Err(WireError::LengthMismatch { .. })
        ));
        let mut bad = ok.clone();
        bad[2] = 17;
        assert_eq!(Header::decode(&bad, true), Err(WireError::TooManyArgs(17)));
        let mut bad = ok.clone();
        bad[0] |= 0x80;
        assert!(matches!(
            Header::decode(&bad, true),
            Err(WireError::BadFlags(_))
        ));
        let mut bad = ok.clone();
        bad[0] = 0b1100;
        assert!(matches!(
            Header::decode(&bad, true),
            Err(WireError::BadFlags(_))
        ));
        // A Long into a created segment is a user request: on a Medium, a reply or a system
        // message the flag is refused (a peer cannot make a reply or system message land in
        // a created segment).
        for flags in [0b1_0100, 0b1_1001, 0b1_1010] {
            let mut bad = ok.clone();
            bad[0] = flags;
            assert!(
                matches!(Header::decode(&bad, true), Err(WireError::BadFlags(_))),
                "{flags:#b}"
            );
        }
        assert!(matches!(
            Header::decode(&[0u8; 3], true),
            Err(WireError::Truncated { .. })
        ));
    }
}
