//! VELO packet framing: how a message (the core's head, then the payload) is cut into mailbox
//! packets and put back together per source.
//!
//! A packet is one mailbox slot: `packet_size - 8` bytes of data, then the 8-byte status word
//! the sender writes last. The status word's high 32 bits are the packet's [`Meta`]: its
//! source, its data length and flags. The first packet of a message starts with the seed's
//! 8-byte AM header and the arguments; spare room in it carries the first payload bytes, and
//! the rest goes in data-only packets (the seed's "header section" and "data section").
//!
//! ```text
//! meta bits  0..16  source rank
//!           16..23  data bytes in this packet (0..=120)
//!           23      FIRST: starts a message
//!           24      LAST: ends a message
//!           25      PLACED: a Long whose payload goes by RMA (the head only travels here)
//!           26      RMA_WAIT: deliver only after the RMA completer notification of its put
//!           27..32  RMA-buffered Mediums the source sent to us before this message (mod 32)
//! ```

/// Flag: the packet starts a message.
pub const FIRST: u32 = 1 << 23;
/// Flag: the packet ends a message.
pub const LAST: u32 = 1 << 24;
/// Flag (first packet): the Long payload is placed in the segment by RMA.
pub const PLACED: u32 = 1 << 25;
/// Flag (first packet): wait for the RMA completer notification of the payload's put.
pub const RMA_WAIT: u32 = 1 << 26;
const LEN_SHIFT: u32 = 16;
const LEN_MASK: u32 = 0x7f;
const RMA_SHIFT: u32 = 27;
/// Modulus of the RMA-before count (5 bits).
pub const RMA_BEFORE_MOD: u64 = 32;

/// The meta data of one packet (the status word's high half), decoded but not yet checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta {
    /// Source rank.
    pub src: u32,
    /// Data bytes in the packet.
    pub len: usize,
    /// [`FIRST`], [`LAST`], [`PLACED`], [`RMA_WAIT`] bits.
    pub flags: u32,
    /// RMA-buffered Mediums sent before this message, mod [`RMA_BEFORE_MOD`].
    pub rma_before: u32,
}

impl Meta {
    /// Packs the fields (`src < 65536`, `len <= 127`, `rma_before < 32`; higher bits are
    /// dropped, which the receiver's checks then catch).
    #[inline]
    pub fn encode(&self) -> u32 {
        (self.src & 0xffff)
            | (self.len as u32 & LEN_MASK) << LEN_SHIFT
            | self.flags & (FIRST | LAST | PLACED | RMA_WAIT)
            | (self.rma_before & 0x1f) << RMA_SHIFT
    }

    /// Unpacks any 32-bit value (every bit pattern decodes; [`Reassembler::push`] checks it).
    #[inline]
    pub fn decode(v: u32) -> Meta {
        Meta {
            src: v & 0xffff,
            len: ((v >> LEN_SHIFT) & LEN_MASK) as usize,
            flags: v & (FIRST | LAST | PLACED | RMA_WAIT),
            rma_before: v >> RMA_SHIFT,
        }
    }
}

/// Why a packet was refused. The packet is dropped, and so is the message it belonged to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The source is not a rank of the job.
    #[error("packet from rank {0}, not in the job")]
    BadSource(u32),
    /// More data bytes than a packet holds.
    #[error("packet announces {len} data bytes, a packet holds {cap}")]
    BadLength {
        /// Announced.
        len: usize,
        /// Packet capacity.
        cap: usize,
    },
    /// A data-only packet with no message in progress from its source.
    #[error("data packet from rank {0} with no message in progress")]
    DataWithoutHeader(u32),
    /// A first packet while a message from the same source was still incomplete.
    #[error("rank {0} started a message before finishing the previous one")]
    Interleaved(u32),
    /// The message grew beyond the largest a rank can send.
    #[error("message from rank {src} exceeds {max} bytes")]
    TooLong {
        /// Source.
        src: u32,
        /// Largest message.
        max: usize,
    },
}

/// Number of packets of `cap` data bytes a message of `total` bytes takes (at least one).
#[inline]
pub fn packets(total: usize, cap: usize) -> usize {
    total.div_ceil(cap.max(1)).max(1)
}

/// Cuts `head ++ payload` into packets of `cap` bytes and calls `f(index, parts)` for each,
/// where `parts` are the (one or two) slices that make up that packet's data, in order.
pub fn fragment<E>(
    head: &[u8],
    payload: &[u8],
    cap: usize,
    mut f: impl FnMut(usize, &[&[u8]]) -> Result<(), E>,
) -> Result<(), E> {
    let total = head.len() + payload.len();
    let n = packets(total, cap);
    for i in 0..n {
        let (start, end) = (i * cap, ((i + 1) * cap).min(total));
        let h = &head[start.min(head.len())..end.min(head.len())];
        let p = &payload[start.saturating_sub(head.len())..end.saturating_sub(head.len())];
        match (h.is_empty(), p.is_empty()) {
            (false, false) => f(i, &[h, p])?,
            (true, false) => f(i, &[p])?,
            _ => f(i, &[h])?,
        }
    }
    Ok(())
}

/// Per-source reassembly of multi-packet messages (the mailbox is shared: packets of several
/// sources interleave, but one source's packets arrive in its order).
///
/// A message refused part-way (a packet that breaks the framing, or one the transport
/// refuses) is dropped whole: the source's later packets of it are consumed in silence up to
/// its last packet, so one bad message is one error.
#[derive(Debug)]
pub struct Reassembler {
    cap: usize,
    max: usize,
    /// Per source: (flags of the first packet, bytes so far) of a message in progress.
    partial: Vec<Option<(u32, Vec<u8>)>>,
    /// Per source: the rest of a refused message is being dropped.
    discarding: Vec<bool>,
    /// Buffers of finished messages, reused.
    spare: Vec<Vec<u8>>,
}

impl Reassembler {
    /// For `ranks` sources, packets of `cap` data bytes and messages of at most `max` bytes.
    pub fn new(ranks: usize, cap: usize, max: usize) -> Reassembler {
        Reassembler {
            cap,
            max,
            partial: vec![None; ranks],
            discarding: vec![false; ranks],
            spare: Vec::new(),
        }
    }

    /// Checks a packet's meta against the job and packet size, before anything is used.
    #[inline]
    pub fn check(&self, m: &Meta) -> Result<(), FrameError> {
        if m.src as usize >= self.partial.len() {
            return Err(FrameError::BadSource(m.src));
        }
        if m.len > self.cap {
            return Err(FrameError::BadLength {
                len: m.len,
                cap: self.cap,
            });
        }
        Ok(())
    }

    /// True if a message from `src` is in progress.
    #[inline]
    pub fn in_progress(&self, src: u32) -> bool {
        self.partial.get(src as usize).is_some_and(|p| p.is_some())
    }

    /// Takes one packet whose data are the first `m.len` bytes of `data` (fewer if `data` is
    /// shorter): `Ok(Some((flags, message)))` when it completes a message (give the buffer
    /// back with [`recycle`](Self::recycle)). On error the message is dropped whole.
    pub fn push(&mut self, m: &Meta, data: &[u8]) -> Result<Option<(u32, Vec<u8>)>, FrameError> {
        let len = m.len.min(data.len());
        self.push_with(m, len, |dst| dst.copy_from_slice(&data[..len]))
    }

    /// [`push`](Self::push) of a packet of `len <= m.len` data bytes, which `fill` copies into
    /// the slice it is given (exactly `len` bytes, in the message buffer): one copy from a
    /// shared slot, no staging.
    pub fn push_with(
        &mut self,
        m: &Meta,
        len: usize,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<Option<(u32, Vec<u8>)>, FrameError> {
        let len = len.min(m.len);
        self.push_append(m, len, |buf| {
            let at = buf.len();
            buf.resize(at + len, 0);
            fill(&mut buf[at..]);
        })
    }

    /// [`push_with`](Self::push_with) of a packet of `len <= m.len` data bytes that `append`
    /// appends to the message buffer it is given (no zeroing first). The buffer then holds
    /// exactly the bytes before it plus `len`, whatever `append` did.
    pub fn push_append(
        &mut self,
        m: &Meta,
        len: usize,
        append: impl FnOnce(&mut Vec<u8>),
    ) -> Result<Option<(u32, Vec<u8>)>, FrameError> {
        self.check(m)?;
        let len = len.min(m.len);
        let src = m.src as usize;
        let last = m.flags & LAST != 0;
        if m.flags & FIRST == 0 && self.discarding[src] {
            // The rest of a refused message.
            self.discarding[src] = !last;
            return Ok(None);
        }
        self.discarding[src] = false;
        let slot = &mut self.partial[src];
        if m.flags & FIRST != 0 {
            if let Some((_, old)) = slot.take() {
                self.refuse(m);
                self.recycle(old);
                return Err(FrameError::Interleaved(m.src));
            }
            let mut buf = self.spare.pop().unwrap_or_default();
            buf.clear();
            append(&mut buf);
            buf.resize(len, 0);
            *slot = Some((m.flags, buf));
        } else {
            let Some((_, buf)) = slot.as_mut() else {
                self.refuse(m);
                return Err(FrameError::DataWithoutHeader(m.src));
            };
            let at = buf.len();
            if at + len > self.max {
                self.refuse(m);
                return Err(FrameError::TooLong {
                    src: m.src,
                    max: self.max,
                });
            }
            append(buf);
            buf.resize(at + len, 0);
        }
        if last {
            Ok(slot.take())
        } else {
            Ok(None)
        }
    }

    /// Drops the message packet `m` belongs to (the transport refused it): the source's
    /// partial message, and, unless `m` is its last packet, the rest of it as it comes.
    pub fn refuse(&mut self, m: &Meta) {
        let src = m.src as usize;
        if let Some(p) = self.partial.get_mut(src) {
            *p = None;
            self.discarding[src] = m.flags & LAST == 0;
        }
    }

    /// Drops the message in progress from `src` (its sender died mid-message).
    pub fn abandon(&mut self, src: u32) {
        if let Some(p) = self.partial.get_mut(src as usize) {
            *p = None;
            self.discarding[src as usize] = false;
        }
    }

    /// Gives a finished message's buffer back for reuse.
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < 4 {
            self.spare.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packetize(src: u32, head: &[u8], payload: &[u8], cap: usize) -> Vec<(Meta, Vec<u8>)> {
        let n = packets(head.len() + payload.len(), cap);
        let mut out = Vec::new();
        fragment::<()>(head, payload, cap, |i, parts| {
            let data: Vec<u8> = parts.concat();
            let mut flags = 0;
            if i == 0 {
                flags |= FIRST;
            }
            if i + 1 == n {
                flags |= LAST;
            }
            out.push((
                Meta {
                    src,
                    len: data.len(),
                    flags,
                    rma_before: 0,
                },
                data,
            ));
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn spare_room_in_the_header_packet_carries_payload() {
        let head = [1u8; 12];
        let payload: Vec<u8> = (0..100).collect();
        let p = packetize(3, &head, &payload, 56);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].1.len(), 56);
        assert_eq!(&p[0].1[12..], &payload[..44]);
        assert_eq!(p[1].1, &payload[44..]);
        assert_eq!(packets(8, 56), 1);
        assert_eq!(packets(0, 56), 1);
        assert_eq!(packets(8 + 64 + 8192, 56), 148);
        let m = Meta {
            src: 65535,
            len: 120,
            flags: FIRST | RMA_WAIT,
            rma_before: 31,
        };
        assert_eq!(Meta::decode(m.encode()), m);
    }

    /// A refused message is dropped whole: one error, the rest of it consumed in silence, and
    /// the source's next message whole.
    #[test]
    fn a_refused_message_is_dropped_whole() {
        let mut r = Reassembler::new(2, 56, 300);
        let m = |flags, len| Meta {
            src: 1,
            len,
            flags,
            rma_before: 0,
        };
        // The transport refuses a first packet: the rest of its message goes quietly.
        r.refuse(&m(FIRST, 56));
        assert_eq!(r.push(&m(0, 56), &[1; 56]), Ok(None));
        assert_eq!(r.push(&m(LAST, 3), &[1; 3]), Ok(None));
        assert_eq!(
            r.push(&m(FIRST | LAST, 2), &[7; 2]),
            Ok(Some((FIRST | LAST, vec![7; 2])))
        );
        // Too long: one error, then silence up to the last packet.
        assert_eq!(r.push(&m(FIRST, 56), &[2; 56]), Ok(None));
        for _ in 0..4 {
            assert_eq!(r.push(&m(0, 56), &[2; 56]), Ok(None));
        }
        assert!(matches!(
            r.push(&m(0, 56), &[2; 56]),
            Err(FrameError::TooLong { src: 1, .. })
        ));
        assert!(!r.in_progress(1));
        assert_eq!(r.push(&m(0, 56), &[2; 56]), Ok(None));
        assert_eq!(r.push(&m(LAST, 5), &[2; 5]), Ok(None));
        // A data packet with no message: one error; a refused one-packet message leaves
        // nothing to discard.
        assert_eq!(
            r.push(&m(LAST, 5), &[3; 5]),
            Err(FrameError::DataWithoutHeader(1))
        );
        r.refuse(&m(FIRST | LAST, 5));
        assert_eq!(
            r.push_with(&m(FIRST | LAST, 4), 4, |d| d.copy_from_slice(b"abcd")),
            Ok(Some((FIRST | LAST, b"abcd".to_vec())))
        );
        // A first packet from a dead source's half message: abandoned, nothing discarded.
        assert_eq!(r.push(&m(FIRST, 56), &[4; 56]), Ok(None));
        r.abandon(1);
        assert!(!r.in_progress(1));
        assert_eq!(
            r.push(&m(LAST, 5), &[3; 5]),
            Err(FrameError::DataWithoutHeader(1))
        );
    }

    /// The meta check and the message limit at their boundaries: a packet of exactly its
    /// capacity and a message of exactly the maximum are taken whole; one to eight bytes
    /// past either is refused with the error that names the limit (wild lengths alone let a
    /// check loosened by a few bytes pass).
    #[test]
    fn lengths_at_and_just_past_the_limits() {
        let m = |flags, len| Meta {
            src: 1,
            len,
            flags,
            rma_before: 0,
        };
        let mut r = Reassembler::new(2, 56, 300);
        assert_eq!(r.check(&m(FIRST | LAST, 56)), Ok(()));
        assert_eq!(
            r.push(&m(FIRST | LAST, 56), &[9; 64]),
            Ok(Some((FIRST | LAST, vec![9; 56])))
        );
        for len in 57..=64 {
            let bad = FrameError::BadLength { len, cap: 56 };
            assert_eq!(r.check(&m(FIRST | LAST, len)), Err(bad.clone()));
            assert_eq!(r.push(&m(FIRST | LAST, len), &[9; 64]), Err(bad.clone()));
            assert_eq!(r.push(&m(FIRST, len), &[9; 64]), Err(bad));
            assert!(!r.in_progress(1), "{len}");
        }
        // 300 bytes: five full packets and one of 20. Then the last one grows by 1..=8.
        for over in 0..=8 {
            let mut r = Reassembler::new(2, 56, 300);
            assert_eq!(r.push(&m(FIRST, 56), &[1; 56]), Ok(None));
            for _ in 1..5 {
                assert_eq!(r.push(&m(0, 56), &[1; 56]), Ok(None));
            }
            let got = r.push(&m(LAST, 20 + over), &[1; 28]);
            if over == 0 {
                assert_eq!(got, Ok(Some((FIRST, vec![1; 300]))));
            } else {
                assert_eq!(got, Err(FrameError::TooLong { src: 1, max: 300 }), "{over}");
                assert!(!r.in_progress(1), "{over}");
            }
            assert_eq!(
                r.push(&m(FIRST | LAST, 3), &[2; 3]),
                Ok(Some((FIRST | LAST, vec![2; 3]))),
                "{over}: the next message"
            );
        }
    }

    proptest! {
        // Under Miri: no failure file (isolation has no working directory), and few cases.
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { ProptestConfig::default().cases },
            failure_persistence: if cfg!(miri) {
                None
            } else {
                ProptestConfig::default().failure_persistence
            },
            ..ProptestConfig::default()
        })]

        /// Messages from several sources, cut into packets and interleaved (each source's
        /// packets in order), come back intact.
        #[test]
        fn interleaved_sources_reassemble(
            msgs in proptest::collection::vec((0u32..4, 0usize..40, 0usize..400), 1..20),
            cap in prop_oneof![Just(56usize), Just(120usize)],
            pick in proptest::collection::vec(0usize..4, 0..2000),
        ) {
            let mut queues: Vec<std::collections::VecDeque<(Meta, Vec<u8>)>> = vec![Default::default(); 4];
            let mut want: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 4];
            for (k, &(src, h, p)) in msgs.iter().enumerate() {
                let head: Vec<u8> = (0..h).map(|i| (i + k) as u8).collect();
                let payload: Vec<u8> = (0..p).map(|i| (i * 7 + k) as u8).collect();
                queues[src as usize].extend(packetize(src, &head, &payload, cap));
                want[src as usize].push([head, payload].concat());
            }
            let mut r = Reassembler::new(4, cap, 1 << 16);
            let mut got: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 4];
            let mut picks = pick.into_iter();
            while queues.iter().any(|q| !q.is_empty()) {
                let mut s = picks.next().unwrap_or(0);
                while queues[s].is_empty() { s = (s + 1) % 4; }
                let (m, d) = queues[s].pop_front().unwrap();
                if let Some((_, msg)) = r.push(&m, &d).unwrap() {
                    got[s].push(msg);
                }
            }
            prop_assert_eq!(got, want);
        }

        /// Any meta word and bytes: a typed error or a message no longer than the maximum,
        /// never a panic.
        #[test]
        fn corrupt_packets_are_typed_errors(
            packets in proptest::collection::vec((any::<u32>(), proptest::collection::vec(any::<u8>(), 0..130)), 0..200),
        ) {
            let mut r = Reassembler::new(3, 56, 300);
            for (meta, data) in packets {
                let m = Meta::decode(meta);
                match r.push(&m, &data) {
                    Ok(Some((_, msg))) => prop_assert!(msg.len() <= 300 + 56),
                    Ok(None) => {}
                    Err(FrameError::BadSource(s)) => prop_assert!(s >= 3),
                    Err(FrameError::BadLength { len, .. }) => prop_assert!(len > 56),
                    Err(_) => {}
                }
            }
        }
    }
}
