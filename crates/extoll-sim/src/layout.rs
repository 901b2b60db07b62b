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
//!   claims(c)         rank c's last claims here (c writes them): mailbox tickets, then
//!                     notification tickets by c's sends, then by c's engine thread
//! byte area
//!   mailbox           slots × packet_size (56 or 120 data bytes + 8-byte status, status last)
//!   notifications     notify_slots × 16 (8-byte notification + 8-byte status)
//!   rx(c)             RMA Medium receive buffers from rank c: buffers × BUF bytes, each with
//!                     the message at its end, just before the 8-byte tail (marker last)
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
/// [`Layout::claims`]: mailbox slots claimed by a rank's sends.
pub const CLAIM_MAILBOX: usize = 0;
/// [`Layout::claims`]: notification slots reserved by a rank's immediate puts.
pub const CLAIM_NOTES: usize = 1;
/// [`Layout::claims`]: notification slots claimed by a rank's engine thread.
pub const CLAIM_ENGINE: usize = 2;

/// A claim record: `n` tickets from `first` (`first < 2^48`, `n < 2^16`).
pub fn claim_word(first: u64, n: usize) -> u64 {
    first << 16 | (n as u64 & 0xffff)
}

/// The tickets `[first, first + n)` of a claim record.
pub fn claim_range(word: u64) -> std::ops::Range<u64> {
    let first = word >> 16;
    first..first + (word & 0xffff)
}

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
    /// Bytes of the AM segment.
    pub segment: usize,
}

impl Layout {
    /// Bytes of the word area.
    pub fn words_len(&self) -> usize {
        PER_RANK_WORDS + 3 * self.ranks * CACHE_LINE
    }

    /// Offset of rank `c`'s departed word.
    pub fn departed(&self, c: usize) -> usize {
        PER_RANK_WORDS + 3 * c * CACHE_LINE
    }

    /// Offset of the word where rank `c` acknowledges our RMA Medium buffers.
    pub fn ack(&self, c: usize) -> usize {
        PER_RANK_WORDS + (3 * c + 1) * CACHE_LINE
    }

    /// Offset of the word where rank `c` records its last claim in queue `q` of ours
    /// ([`CLAIM_MAILBOX`], [`CLAIM_NOTES`], [`CLAIM_ENGINE`]) as [`claim_word`]: only `c`
    /// writes it, so recording costs `c` no transfer, and we read it only once `c` is dead.
    pub fn claims(&self, c: usize, q: usize) -> usize {
        PER_RANK_WORDS + (3 * c + 2) * CACHE_LINE + 8 * q
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

    /// Offset of the AM segment in the byte area.
    #[inline]
    pub fn segment_base(&self) -> usize {
        self.rx_base() + self.ranks * self.conn_bytes()
    }

    /// Bytes of the byte area.
    pub fn bytes_len(&self) -> usize {
        self.segment_base() + self.segment
    }
}
