//! The exported memory of one rank, and the match bits of an AM.
//!
//! ```text
//! request buffers   request_buffers × request_buffer_bytes, one locally managed entry each
//!                   on the request portal (match bits AM_TAG << 48, ignoring the low 48)
//! send slots        send_slots × max_message (rounded to a cache line): one entry on the
//!                   reply portal covers them all; a reply goes to its request's slot
//! segment           the AM segment: one entry on the segment portal (put and get)
//! ```
//!
//! These lie in the NI's byte area; where the NI's own words lie (portal table, match entries,
//! event queue) is [`crate::ni`]'s.
//!
//! Match bits of an AM: bits 0..32 the AM header's first four bytes (flags, handler,
//! argument count, credit byte), bits 32..48 the request's send slot, bits 48..64 `AM_TAG`.

use am_nic::control::Departed;

use crate::ni::NiGeometry;
use crate::{PortalsConfig, PortalsError};

/// Tag in the top 16 match bits of every AM.
pub(crate) const AM_TAG: u64 = 0xA3A3;
/// Kind bits of the flag byte, and the Long kind.
pub(crate) const KIND_SHIFT: u8 = 2;
pub(crate) const KIND_LONG: u8 = 2;
/// Extra match-entry records beyond the transport's, for raw users of the NI.
const SPARE_ENTRIES: u32 = 8;

/// The geometry of every rank's exported memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Ranks.
    pub ranks: u32,
    /// Chained request receive buffers.
    pub request_buffers: usize,
    /// Bytes of each.
    pub request_buffer_bytes: usize,
    /// Send slots.
    pub send_slots: usize,
    /// Bytes per send slot.
    pub slot_bytes: usize,
    /// Bytes of the AM segment.
    pub segment: usize,
    /// The NI's geometry (word area, event queue, byte area).
    pub ni: NiGeometry,
}

impl Layout {
    /// The layout for `ranks` ranks, a segment of `segment` bytes and `config`.
    pub fn new(ranks: u32, segment: usize, config: &PortalsConfig) -> Result<Layout, PortalsError> {
        config.validate()?;
        let rb = config.request_buffer_bytes(ranks);
        let rb = usize::try_from(rb)
            .ok()
            .filter(|&b| b <= 1 << 36)
            .ok_or_else(|| PortalsError::Config(format!("request buffers of {rb} bytes")))?;
        let slot_bytes = config.max_message.div_ceil(64) * 64;
        let mut l = Layout {
            ranks,
            request_buffers: config.request_buffers,
            request_buffer_bytes: rb,
            send_slots: config.send_slots,
            slot_bytes,
            segment,
            ni: NiGeometry::new(ranks, 1, 8, 0)?,
        };
        let bytes = l
            .segment_base()
            .checked_add(segment)
            .ok_or_else(|| PortalsError::Config("segment too large".into()))?;
        l.ni = NiGeometry::new(
            ranks,
            config.request_buffers as u32 + 2 + SPARE_ENTRIES,
            config.eq_capacity(ranks),
            bytes,
        )?;
        Ok(l)
    }

    /// Offset of request buffer `i`.
    pub fn request_buffer(&self, i: usize) -> usize {
        i * self.request_buffer_bytes
    }

    /// Offset of the send slots.
    pub fn send_base(&self) -> usize {
        self.request_buffers * self.request_buffer_bytes
    }

    /// Offset of the AM segment.
    pub fn segment_base(&self) -> usize {
        (self.send_base() + self.send_slots * self.slot_bytes).div_ceil(64) * 64
    }

    /// Where each rank's departed word is.
    pub(crate) fn departed(&self) -> Departed {
        Departed {
            base: self.ni.departed(0),
            stride: 8,
        }
    }

    /// A string all ranks must agree on.
    pub(crate) fn fingerprint(&self, config: &PortalsConfig) -> String {
        format!(
            "{}x{}:{}x{}:{}:{}:{}:{}",
            self.request_buffers,
            self.request_buffer_bytes,
            self.send_slots,
            self.slot_bytes,
            self.segment,
            self.ni.eq_capacity(),
            config.max_long,
            config.credits
        )
    }
}
