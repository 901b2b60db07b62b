//! The segment of one rank: an anonymous shared mapping its peers import.
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
//!   claims(c)         rank c's claim records in our queues (c writes them, `am_shm::mailbox`):
//!                     its sends into the VELO mailbox, its main thread's and its engine
//!                     thread's notification slots
//!   pool_claim(i)     with a pool: who holds pool buffer i (0: free; a sender's
//!                     compare-and-swap claims it, we free it once its Medium is read),
//!                     eight to a line
//!   room              a sender found the mailbox full and waits to be rung (a line)
//!   room_waiter(w)    which senders wait: bit c % 64 of word c / 64
//! byte area
//!   mailbox           slots × packet_size (56 or 120 data bytes + 8-byte status, status last)
//!   notifications     notify_slots × 16 (8-byte notification + 8-byte status)
//!   rx(c)             without a pool: RMA Medium receive buffers from rank c, buffers × BUF
//!                     bytes, each with the message at its end, just before the 8-byte tail
//!                     (marker last)
//!   pool(i)           with a pool: rma_pool buffers of BUF bytes, laid out as rx's
//!   segment           the AM segment (registered region 0: Long payloads, RMA put/get)
//! ```
//!
//! Without a pool, receive buffers grow with the job (`ranks × rma_buffers × BUF`); with one
//! ([`ExtollConfig::rma_pool`]), only the word area does (three lines per rank).

use am_shm::mailbox::Ring;
use am_shm::CACHE_LINE;

use crate::ExtollConfig;

/// Offset of the doorbell (the control block's).
pub const DOORBELL: usize = am_nic::control::DOORBELL;
/// Offset of the abort word (the control block's).
pub const ABORT: usize = am_nic::control::ABORT;
/// Offset of the mailbox tail word.
pub const MAILBOX_TAIL: usize = 2 * CACHE_LINE;
/// Offset of the notification queue's tail word.
pub const NOTIFY_TAIL: usize = 3 * CACHE_LINE;
/// Offset of the mailbox head word (tickets the owner consumed, published in batches).
pub const MAILBOX_HEAD: usize = 4 * CACHE_LINE;
/// Offset of the notification queue's head word.
pub const NOTIFY_HEAD: usize = 5 * CACHE_LINE;
const PER_RANK_WORDS: usize = 6 * CACHE_LINE;
/// [`Layout::claims`]: the record of a rank's sends into the VELO mailbox.
pub const CLAIM_MAILBOX: usize = 0;
/// [`Layout::claims`]: the record of the notification slots a rank's main thread reserves
/// (immediate puts).
pub const CLAIM_NOTES: usize = 1;
/// [`Layout::claims`]: the record of the notification slots a rank's engine thread claims.
pub const CLAIM_ENGINE: usize = 2;

/// The claimer id of rank `r`'s sends in a VELO mailbox (the status of a claimed slot names it).
#[inline]
pub fn mailbox_claimer(r: usize) -> u32 {
    r as u32
}

/// The claimer id of rank `r`'s main thread (`engine == false`) or engine thread in a
/// notification queue: two claimers per rank, so each has a record of its own.
#[inline]
pub fn notes_claimer(r: usize, engine: bool) -> u32 {
    2 * r as u32 + engine as u32
}

/// The rank and record ([`CLAIM_NOTES`] or [`CLAIM_ENGINE`]) of notification claimer `who`.
#[inline]
pub fn notes_claimer_of(who: u32) -> (usize, usize) {
    let q = if who.is_multiple_of(2) {
        CLAIM_NOTES
    } else {
        CLAIM_ENGINE
    };
    ((who / 2) as usize, q)
}

/// Bytes of one notification slot.
pub const NOTIFY_SLOT: usize = 16;

/// Bytes of one RMA Medium buffer: the largest message (80-byte head + 8192-byte payload)
/// plus the 8-byte tail, rounded up to whole cache lines.
pub const RMA_BUF: usize = 8320;

/// `n` rounded up to whole cache lines (saturating: a saturated offset fails the segment's
/// bounds checks instead of wrapping).
fn line(n: usize) -> usize {
    n.div_ceil(CACHE_LINE).saturating_mul(CACHE_LINE)
}

/// The geometry of every rank's segment. Make it with [`Layout::new`], which checks that its
/// sizes do not overflow and makes its rings once; the offsets below saturate rather than
/// wrap, so fields changed by hand to absurd values yield offsets the segment's bounds
/// checks refuse.
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
    /// RMA Medium buffers per connection (0 with a pool).
    pub rma_buffers: usize,
    /// RMA Medium buffers in the shared pool (0: buffers per connection).
    pub rma_pool: usize,
    /// Bytes of the AM segment.
    pub segment: usize,
    /// The VELO mailbox and the notification queue, made once by `new` from the fields above.
    mailbox: Ring,
    notifications: Ring,
    /// Where the AM segment starts in the byte area (computed once: every delivery needs it).
    segment_base: usize,
    /// [`Layout::rma_flight`], computed once (every RMA Medium needs it).
    flight: usize,
}

impl Layout {
    /// The layout of a job of `ranks` ranks with `config`'s geometry and an AM segment of
    /// `segment` bytes; `None` if a size overflows (computed with checked arithmetic, in
    /// release builds too).
    pub fn new(ranks: usize, config: &ExtollConfig, segment: usize) -> Option<Layout> {
        let mailbox = Ring::new(
            MAILBOX_TAIL,
            MAILBOX_HEAD,
            0,
            config.mailbox_slots,
            config.packet_size,
        )
        .ok()?;
        let notifications = Ring::new(
            NOTIFY_TAIL,
            NOTIFY_HEAD,
            line(mailbox.data_bytes()),
            config.notify_slots,
            NOTIFY_SLOT,
        )
        .ok()?;
        let l = Layout {
            ranks,
            packet_size: config.packet_size,
            mailbox_slots: config.mailbox_slots,
            notify_slots: config.notify_slots,
            rma_buffers: if config.rma_pool > 0 {
                0
            } else {
                config.rma_buffers
            },
            rma_pool: config.rma_pool,
            segment,
            mailbox,
            notifications,
            segment_base: 0,
            flight: if config.rma_pool > 0 {
                config.rma_pool.min(crate::MAX_RMA_FLIGHT)
            } else {
                config.rma_buffers
            },
        };
        let lines = |n: usize| {
            n.checked_add(CACHE_LINE - 1)
                .map(|n| n / CACHE_LINE * CACHE_LINE)
        };
        let mailbox = lines(l.mailbox_slots.checked_mul(l.packet_size)?)?;
        let notes = l.notify_slots.checked_mul(NOTIFY_SLOT)?;
        let rx = lines(mailbox.checked_add(notes)?)?;
        let conns = ranks
            .checked_mul(l.rma_buffers.checked_mul(RMA_BUF)?)?
            .checked_add(l.rma_pool.checked_mul(RMA_BUF)?)?;
        let bytes = rx.checked_add(conns)?.checked_add(segment)?;
        let words = ranks
            .checked_mul(3 * CACHE_LINE)?
            .checked_add(PER_RANK_WORDS)?
            .checked_add(lines(l.rma_pool.checked_mul(8)?)?)?
            .checked_add(lines(ranks.div_ceil(64) * 8)? + CACHE_LINE)?;
        // Room for the segment's own rounding (whole words, whole lines).
        bytes.checked_add(words)?.checked_add(2 * CACHE_LINE)?;
        let l = Layout {
            segment_base: rx.checked_add(conns)?,
            ..l
        };
        debug_assert_eq!(
            l.segment_base,
            l.rx_base() + ranks * l.conn_bytes() + l.rma_pool * RMA_BUF
        );
        (bytes <= isize::MAX as usize).then_some(l)
    }

    /// Bytes of the word area.
    pub fn words_len(&self) -> usize {
        self.room_waiter(0)
            .saturating_add(line(self.room_words().saturating_mul(8)))
    }

    /// Offset of the room word: set by a sender that found the mailbox full (with its bit
    /// in the room waiter words); the owner looks at it as it tells senders its head, and
    /// then takes both and rings every waiter's doorbell, so that a sender asleep on a
    /// full mailbox wakes when there is room rather than when its sleep times out. A line
    /// of its own: senders write it only when the mailbox is full.
    pub fn room(&self) -> usize {
        self.pool_claim(0)
            .saturating_add(line(self.rma_pool.saturating_mul(8)))
    }

    /// How many room waiter words there are: a bit per sender.
    pub fn room_words(&self) -> usize {
        am_nic::room::waiter_words(self.ranks)
    }

    /// Offset of room waiter word `w` (`< room_words()`): sender `c` waits for room with bit
    /// `c % 64` of word `c / 64` set.
    pub fn room_waiter(&self, w: usize) -> usize {
        self.room()
            .saturating_add(CACHE_LINE)
            .saturating_add(w.saturating_mul(8))
    }

    /// Offset of the claim word of pool buffer `i` ([`ExtollConfig::rma_pool`]): after
    /// every rank's words.
    #[inline]
    pub fn pool_claim(&self, i: usize) -> usize {
        self.rank_words(self.ranks)
            .saturating_add(i.saturating_mul(8))
    }

    /// Offset of pool buffer `i` ([`ExtollConfig::rma_pool`]): after every connection's
    /// buffers (none, with a pool).
    #[inline]
    pub fn pool(&self, i: usize) -> usize {
        self.rx(self.ranks, i)
    }

    /// The most RMA Mediums one sender may have in flight to one receiver: its buffers per
    /// connection, or with a pool, the pool's size up to [`crate::MAX_RMA_FLIGHT`].
    #[inline]
    pub fn rma_flight(&self) -> usize {
        self.flight
    }

    /// Bytes of receive memory one rank reserves: its word area and its byte area without
    /// the AM segment (queues and RMA Medium buffers).
    pub fn receive_bytes(&self) -> usize {
        self.words_len().saturating_add(self.segment_base)
    }

    fn rank_words(&self, c: usize) -> usize {
        PER_RANK_WORDS.saturating_add(c.saturating_mul(3 * CACHE_LINE))
    }

    /// Offset of rank `c`'s departed word.
    pub fn departed(&self, c: usize) -> usize {
        self.rank_words(c)
    }

    /// Where each rank's departed word is (for `am_nic`'s liveness and departure).
    pub fn departed_words(&self) -> am_nic::control::Departed {
        am_nic::control::Departed {
            base: self.rank_words(0),
            stride: self.rank_words(1).saturating_sub(self.rank_words(0)),
        }
    }

    /// Offset of the word where rank `c` acknowledges our RMA Medium buffers.
    pub fn ack(&self, c: usize) -> usize {
        self.rank_words(c).saturating_add(CACHE_LINE)
    }

    /// Offset of rank `c`'s claim record for queue `q` of ours ([`CLAIM_MAILBOX`],
    /// [`CLAIM_NOTES`], [`CLAIM_ENGINE`]): `am_shm::mailbox`'s record, which only `c` writes
    /// (on its own line, so recording costs `c` no transfer), and which we read only to tell
    /// a claim that names `c` but that `c` does not vouch for.
    #[inline]
    pub fn claims(&self, c: usize, q: usize) -> usize {
        self.rank_words(c)
            .saturating_add(2 * CACHE_LINE)
            .saturating_add(8 * q)
    }

    /// The VELO mailbox.
    #[inline]
    pub fn mailbox(&self) -> Ring {
        self.mailbox
    }

    /// The notification queue.
    #[inline]
    pub fn notifications(&self) -> Ring {
        self.notifications
    }

    fn rx_base(&self) -> usize {
        let n = self.notifications();
        line(n.data().saturating_add(n.data_bytes()))
    }

    fn conn_bytes(&self) -> usize {
        self.rma_buffers.saturating_mul(RMA_BUF)
    }

    /// Offset of receive buffer `idx` for messages from rank `c`.
    #[inline]
    pub fn rx(&self, c: usize, idx: usize) -> usize {
        self.rx_base()
            .saturating_add(c.saturating_mul(self.conn_bytes()))
            .saturating_add(idx.saturating_mul(RMA_BUF))
    }

    /// Offset of the AM segment in the byte area.
    #[inline]
    pub fn segment_base(&self) -> usize {
        self.segment_base
    }

    /// Bytes of the byte area.
    pub fn bytes_len(&self) -> usize {
        self.segment_base().saturating_add(self.segment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes that overflow are refused by `new`, never wrapped, in every build.
    #[test]
    fn overflowing_sizes_are_refused() {
        let c = ExtollConfig::default();
        let l = Layout::new(4, &c, 1 << 16).unwrap();
        assert_eq!(l.bytes_len(), l.segment_base() + (1 << 16));
        assert_eq!(l.rx(1, 0), l.rx(0, 0) + 16 * RMA_BUF);
        assert!(l.claims(3, CLAIM_ENGINE) + 8 <= l.words_len());
        assert!(l.notifications().data() >= l.mailbox().data_bytes());
        assert!(Layout::new(4, &c, usize::MAX - 100).is_none());
        assert!(Layout::new(usize::MAX / 1000, &c, 0).is_none());
        assert!(Layout::new(1, &c, isize::MAX as usize).is_none());
        let huge = ExtollConfig {
            mailbox_slots: usize::MAX / 2,
            ..c
        };
        assert!(Layout::new(1, &huge, 0).is_none());
        let notes = ExtollConfig {
            notify_slots: usize::MAX / 8,
            ..c
        };
        assert!(Layout::new(1, &notes, 0).is_none());
        // A layout made by hand saturates instead of wrapping.
        let bad = Layout {
            segment: usize::MAX,
            ..l
        };
        assert_eq!(bad.bytes_len(), usize::MAX);
    }

    #[test]
    fn claimer_ids_are_distinct_per_thread() {
        assert_eq!(notes_claimer_of(notes_claimer(7, false)), (7, CLAIM_NOTES));
        assert_eq!(notes_claimer_of(notes_claimer(7, true)), (7, CLAIM_ENGINE));
        assert_ne!(notes_claimer(3, true), notes_claimer(4, false));
        assert_eq!(notes_claimer(65535, true), 131071);
    }
}
