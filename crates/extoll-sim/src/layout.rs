//! The segment of one rank (`/dev/shm/am-<job>-extoll-<rank>`).
//!
//! ```text
//! word area (atomics only, one cache line each)
//!   DOORBELL          futex word senders ring when the owner announced sleep
//!   ABORT             a rank that panicked sets it
//!   MAILBOX_TAIL      VELO mailbox: next ticket, claimed by senders' compare-and-swap
//!   NOTIFY_TAIL       notification queue: next ticket, claimed by RMA engines
//!   MAILBOX_HEAD      mailbox tickets the owner consumed (published in batches)
//!   NOTIFY_HEAD       notification tickets the owner consumed
//!   departed(c)       rank c ended cleanly
//!   ack(c)            RMA Medium buffers of ours that rank c has consumed (c writes it)
//! byte area
//!   mailbox           slots × packet_size (56 or 120 data bytes + 8-byte status, status last)
//!   notifications     notify_slots × 16 (8-byte notification + 8-byte status)
//!   rx(c)             RMA Medium receive buffers from rank c: buffers × BUF bytes, each with
//!                     the message at its end, just before the 8-byte tail (marker last)
//!   tx(c)             RMA Medium send buffers to rank c (registered source of the puts)
//!   staging           staging slots × max_long: registered source of Long payload puts
//!   segment           the AM segment (registered region 0: Long payloads, RMA put/get)
//! ```

use am_shm::mailbox::Ring;
use am_shm::CACHE_LINE;

/// Offset of the doorbell.
pub const DOORBELL: usize = 0;
/// Offset of the abort word.
pub const ABORT: usize = CACHE_LINE;
/// Offset of the mailbox tail word.
pub const MAILBOX_TAIL: usize = 2 * CACHE_LINE;
/// Offset of the notification queue's tail word.
pub const NOTIFY_TAIL: usize = 3 * CACHE_LINE;
/// Offset of the mailbox head word (tickets the owner consumed, published in batches).
pub const MAILBOX_HEAD: usize = 4 * CACHE_LINE;
/// Offset of the notification queue's head word.
pub const NOTIFY_HEAD: usize = 5 * CACHE_LINE;
const PER_RANK_WORDS: usize = 6 * CACHE_LINE;
/// Bytes of one notification slot.
pub const NOTIFY_SLOT: usize = 16;

/// Bytes of one RMA Medium buffer: the largest message (80-byte head + 8192-byte payload)
/// plus the 8-byte tail, rounded up to whole cache lines.
pub const RMA_BUF: usize = 8320;

fn line(n: usize) -> usize {
    n.div_ceil(CACHE_LINE) * CACHE_LINE
}

/// The geometry of every rank's segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Ranks in the job.
    pub ranks: usize,
    /// Bytes per VELO packet (mailbox slot), 64 or 128.
    pub packet_size: usize,
    /// Mailbox slots.
    pub mailbox_slots: usize,
    /// Notification queue slots.
    pub notify_slots: usize,
    /// RMA Medium buffers per connection.
    pub rma_buffers: usize,
    /// Long staging slots.
    pub staging_slots: usize,
    /// Bytes per staging slot (the largest Long).
    pub max_long: usize,
    /// Bytes of the AM segment.
    pub segment: usize,
}

impl Layout {
    /// Bytes of the word area.
    pub fn words_len(&self) -> usize {
        PER_RANK_WORDS + 2 * self.ranks * CACHE_LINE
    }

    /// Offset of rank `c`'s departed word.
    pub fn departed(&self, c: usize) -> usize {
        PER_RANK_WORDS + 2 * c * CACHE_LINE
    }

    /// Offset of the word where rank `c` acknowledges our RMA Medium buffers.
    pub fn ack(&self, c: usize) -> usize {
        PER_RANK_WORDS + (2 * c + 1) * CACHE_LINE
    }

    /// The VELO mailbox.
    pub fn mailbox(&self) -> Ring {
        Ring {
            tail: MAILBOX_TAIL,
            head: MAILBOX_HEAD,
            data: 0,
            slots: self.mailbox_slots,
            slot_size: self.packet_size,
        }
    }

    /// The notification queue.
    pub fn notifications(&self) -> Ring {
        Ring {
            tail: NOTIFY_TAIL,
            head: NOTIFY_HEAD,
            data: line(self.mailbox().data_bytes()),
            slots: self.notify_slots,
            slot_size: NOTIFY_SLOT,
        }
    }

    fn rx_base(&self) -> usize {
        let n = self.notifications();
        line(n.data + n.data_bytes())
    }

    fn conn_bytes(&self) -> usize {
        self.rma_buffers * RMA_BUF
    }

    /// Offset of receive buffer `idx` for messages from rank `c`.
    pub fn rx(&self, c: usize, idx: usize) -> usize {
        self.rx_base() + c * self.conn_bytes() + idx * RMA_BUF
    }

    /// Offset of send buffer `idx` for messages to rank `c`.
    pub fn tx(&self, c: usize, idx: usize) -> usize {
        self.rx_base() + (self.ranks + c) * self.conn_bytes() + idx * RMA_BUF
    }

    /// Offset of staging slot `k`.
    pub fn staging(&self, k: usize) -> usize {
        self.rx_base() + 2 * self.ranks * self.conn_bytes() + k * line(self.max_long)
    }

    /// Offset of the AM segment in the byte area.
    pub fn segment_base(&self) -> usize {
        self.staging(self.staging_slots)
    }

    /// Bytes of the byte area.
    pub fn bytes_len(&self) -> usize {
        self.segment_base() + self.segment
    }
}
