//! The exported segment of one rank.
//!
//! ```text
//! word area (atomics only)
//!   line 0            message-exist flag (doorbell, u32), then ringer words 0..7
//!   line 1            abort word: a rank that panicked sets it
//!   per rank c        departed word, then c's message-exist-flag take count (own line;
//!                     both written only by rank c)
//!   then              ringer words 7.. (whole lines)
//!   with a bank       the bank's tail word and head word (a line each), then a claim
//!                     record per rank (8 bytes, written only by that rank), then the
//!                     room word (a line) and the room waiter words (a bit per rank:
//!                     senders that found the bank full and wait to be rung)
//! byte area
//!   per sender c      command segment: slots request slots, then slots reply slots; each
//!                     slot starts with its message-ready flag (stamp), in the same cache
//!                     line as the slot header and the first 48 bytes of the message
//!                     (none with a bank)
//!   with a bank       the bank: `bank` slots of `slot_size` bytes, a claimed ring
//!                     (`am_shm::mailbox`), each slot's status word last
//!   then              the AM segment (GASNet segment; Long payloads land here)
//! ```
//!
//! A layout has command segments per sender ([`Layout::new`], under static credits) or a
//! bank ([`Layout::with_bank`], under dynamic ones), never both.

use am_nic::control::Departed;
use am_shm::stamp::Slots;
use am_shm::CACHE_LINE;

/// The seed's **command segment**: one sender's request and reply slots in a receiver's
/// exported segment, each slot starting with its **message-ready flag** (a stamp).
pub type CommandSegment = Slots;

/// Offset of the **message-exist flag** (the control block's doorbell).
pub const MEF: usize = am_nic::control::DOORBELL;
/// Offset of the abort word.
pub const ABORT: usize = am_nic::control::ABORT;
/// Slot flag: the Long payload is already in the AM segment.
pub const PLACED: u32 = 1;
/// Slot flag of a request sent with none of its sender's outstanding: if the sender's next
/// request is sent that way too, it restarts at request slot 0 (a run of round trips stays
/// on one slot). The receiver looks at slot 0 only after such a request, so a stream of
/// requests in turn costs it no second line per poll.
pub const LONE: u32 = 2;
/// Slot flags of a bank message that is a reply (see [`answers`] for how many requests it
/// answers); a request's has it clear.
pub const BANK_REPLY: u32 = 1 << 16;
/// Slot flags of a reply: bits 8..16 hold how many requests it answers, minus one (see
/// [`answers`]).
const ANSWERS_SHIFT: u32 = 8;

/// The slot flags of a reply that answers `n` requests (1 ..= 256).
#[inline]
pub fn answers_flag(n: usize) -> u32 {
    debug_assert!((1..=256).contains(&n));
    ((n as u32 - 1) & 0xff) << ANSWERS_SHIFT
}

/// How many requests a reply with slot flags `flags` answers: its request's and the ones
/// before it still unanswered (a coalesced implicit reply answers several). At least 1; a
/// peer can write any value, which the receiver checks against its own requests.
#[inline]
pub fn answers(flags: u32) -> usize {
    ((flags >> ANSWERS_SHIFT) & 0xff) as usize + 1
}

/// Ringer words in line 0, after the message-exist flag: a ring sets its bit and the flag in
/// one cache line in jobs of up to `64 * 7` ranks.
const RINGERS_IN_FLAG_LINE: usize = 7;

/// The ringer word and bit of sender `c`: bit `c % 64` of word `c / 64`. A sender that rings
/// sets its bit, then rings the message-exist flag with the tag of its word
/// ([`am_shm::doorbell::tag`]`(c / 64)`), so a receiver walks only the words whose tags are
/// set and, in them, only the senders that rang: what it looks at grows with the senders
/// that wrote to it, not with the job.
#[inline]
pub fn ringer_bit(c: usize) -> (usize, u64) {
    (c / 64, 1 << (c % 64))
}

/// The geometry of every rank's exported segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Ranks (senders per receiver, self included).
    pub ranks: usize,
    /// Request slots (= reply slots) per sender.
    pub slots: usize,
    /// Bytes per slot.
    pub slot_size: usize,
    /// Bytes of the AM segment.
    pub segment: usize,
    /// Slots of the bank (0: command segments per sender instead).
    pub bank: usize,
}

impl Layout {
    /// The layout of `ranks` ranks, each sender with `slots` request slots of `slot_size` bytes,
    /// and an AM segment of `segment` bytes; `None` if its sizes overflow.
    pub fn new(ranks: usize, slots: usize, slot_size: usize, segment: usize) -> Option<Layout> {
        Layout::checked(Layout {
            ranks,
            slots,
            slot_size,
            segment,
            bank: 0,
        })
    }

    /// The layout of `ranks` ranks that send through one **bank** per receiver instead of
    /// command segments per sender: `bank` slots of `slot_size` bytes (its status word
    /// included), and an AM segment of `segment` bytes; `None` if its sizes overflow.
    pub fn with_bank(
        ranks: usize,
        bank: usize,
        slot_size: usize,
        segment: usize,
    ) -> Option<Layout> {
        if bank == 0 {
            return None;
        }
        Layout::checked(Layout {
            ranks,
            slots: 0,
            slot_size,
            segment,
            bank,
        })
    }

    fn checked(l: Layout) -> Option<Layout> {
        let channels = l
            .ranks
            .checked_mul(l.slots.checked_mul(2)?.checked_mul(l.slot_size)?)?;
        channels
            .checked_add(l.bank.checked_mul(l.slot_size)?)?
            .checked_add(l.segment)?;
        l.ranks
            .checked_mul(CACHE_LINE + 8)?
            .checked_add(4 * CACHE_LINE)?
            .checked_add(l.ranks.div_ceil(64) * 8 + CACHE_LINE)?
            .checked_add(l.ranks.div_ceil(64) * 8 + 3 * CACHE_LINE)?;
        Some(l)
    }

    fn channel_words(&self) -> usize {
        CACHE_LINE
    }

    fn channel_bytes(&self) -> usize {
        2 * self.slots * self.slot_size
    }

    /// Bytes of the word area.
    pub fn words_len(&self) -> usize {
        let words = self.ringers_end();
        if self.bank == 0 {
            return words;
        }
        self.bank_room_waiter(0) + (self.ringer_words() * 8).next_multiple_of(CACHE_LINE)
    }

    /// Where the ringer words end.
    fn ringers_end(&self) -> usize {
        self.ringers_base() + self.ringers_beyond_flag_line() * 8
    }

    /// Offset of the bank's tail word (a hint of the next ticket to claim) in the word area.
    pub fn bank_tail(&self) -> usize {
        self.ringers_end()
    }

    /// Offset of the bank's head word (the owner's next ticket, published in batches).
    pub fn bank_head(&self) -> usize {
        self.ringers_end() + CACHE_LINE
    }

    /// Offset of rank `c`'s claim record for the bank: only `c` writes it (see
    /// [`am_shm::claim`]).
    pub fn bank_record(&self, c: usize) -> usize {
        self.ringers_end() + 2 * CACHE_LINE + 8 * c
    }

    /// Offset of the bank's room word: set by a sender that found the bank full (with its
    /// bit in the room waiter words), looked at by the owner as it consumes; then the owner
    /// takes both and rings every waiter's message-exist flag, so that a sender asleep on
    /// a full bank wakes when there is room rather than when its sleep times out. A line of
    /// its own: senders write it only when the bank is full.
    pub fn bank_room(&self) -> usize {
        self.bank_record(0) + (self.ranks * 8).next_multiple_of(CACHE_LINE)
    }

    /// Offset of room waiter word `w` (`< ringer_words()`): sender `c` waits for room with
    /// bit [`ringer_bit`]`(c)` set.
    pub fn bank_room_waiter(&self, w: usize) -> usize {
        self.bank_room() + CACHE_LINE + 8 * w
    }

    /// The bank as a claimed ring; `None` without one.
    pub fn bank_ring(&self) -> Option<am_shm::mailbox::Ring> {
        if self.bank == 0 {
            return None;
        }
        am_shm::mailbox::Ring::new(
            self.bank_tail(),
            self.bank_head(),
            self.ranks * self.channel_bytes(),
            self.bank,
            self.slot_size,
        )
        .ok()
    }

    /// Where ringer words [`RINGERS_IN_FLAG_LINE`].. start: after the per-rank lines.
    fn ringers_base(&self) -> usize {
        2 * CACHE_LINE + self.ranks * self.channel_words()
    }

    /// Ringer words past line 0, rounded up to whole lines.
    fn ringers_beyond_flag_line(&self) -> usize {
        self.ringer_words()
            .saturating_sub(RINGERS_IN_FLAG_LINE)
            .next_multiple_of(CACHE_LINE / 8)
    }

    /// How many ringer words there are: one bit per sender (see [`ringer_bit`]).
    pub fn ringer_words(&self) -> usize {
        self.ranks.div_ceil(64)
    }

    /// Offset of ringer word `w` (`< ringer_words()`) in the word area.
    #[inline]
    pub fn ringer_word(&self, w: usize) -> usize {
        if w < RINGERS_IN_FLAG_LINE {
            MEF + 8 + 8 * w
        } else {
            self.ringers_base() + 8 * (w - RINGERS_IN_FLAG_LINE)
        }
    }

    /// Bytes of the byte area.
    pub fn bytes_len(&self) -> usize {
        self.segment_base() + self.segment
    }

    /// Where each rank's departed word is.
    pub fn departed_words(&self) -> Departed {
        Departed {
            base: 2 * CACHE_LINE,
            stride: self.channel_words(),
        }
    }

    /// Offset of sender `c`'s departed word.
    pub fn departed(&self, c: usize) -> usize {
        self.departed_words().of(c)
    }

    /// Offset of the word where rank `c` counts the takes of *its* message-exist flag that
    /// cleared this rank's ringer bit: written by `c` (a remote write into this segment), read
    /// here before ringing `c`. While it has not moved since this rank last rang `c`, `c`'s
    /// ringer words still carry this rank's bit and `c` need not be rung again.
    pub fn taken(&self, c: usize) -> usize {
        self.departed(c) + 8
    }

    /// Sender `c`'s command segment: request slots `0..slots`, reply slots `slots..2*slots`.
    pub fn command_segment(&self, c: usize) -> CommandSegment {
        Slots {
            data: c * self.channel_bytes(),
            count: 2 * self.slots,
            size: self.slot_size,
        }
    }

    /// Every sender's command segment, one after another, as one run of slots: sender `c`'s
    /// slot `k` is slot `c * 2 * slots + k` (the receiver's view of all of them at once).
    pub fn command_segments(&self) -> Slots {
        Slots {
            data: 0,
            count: self.ranks * 2 * self.slots,
            size: self.slot_size,
        }
    }

    /// Offset of the AM segment in the byte area: after the command segments or the bank.
    pub fn segment_base(&self) -> usize {
        self.ranks * self.channel_bytes() + self.bank * self.slot_size
    }

    /// Bytes one rank reserves to receive: its word area (doorbell, ringer words, a line per
    /// peer, and with a bank its words and a claim record per peer) and every sender's
    /// command segment or the bank; the AM segment not counted. Reserved, not held: a
    /// receiver touches only the slots of the senders that wrote to it, or of the bank.
    pub fn receive_bytes(&self) -> usize {
        self.words_len() + self.segment_base()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every sender has its own ringer bit, in a word of the word area that nothing else
    /// uses: not the message-exist flag, the abort word, a departed word or a take count.
    /// Offsets only, no memory: Miri would spend minutes on it and find nothing.
    #[test]
    #[cfg_attr(miri, ignore)]
    fn ringer_words_are_apart_from_every_other_word() {
        for ranks in [1, 2, 63, 64, 65, 448, 449, 1024, 4097] {
            let l = Layout::new(ranks, 2, 1024, 4096).unwrap();
            assert_eq!(l.ringer_words(), ranks.div_ceil(64));
            let mut used = std::collections::BTreeSet::new();
            // The 32-bit flag's word, the abort word, each rank's two words.
            used.insert(MEF);
            used.insert(ABORT);
            for c in 0..ranks {
                assert!(used.insert(l.departed(c)), "{ranks}: departed {c}");
                assert!(used.insert(l.taken(c)), "{ranks}: taken {c}");
            }
            let mut bits = std::collections::BTreeSet::new();
            for c in 0..ranks {
                let (w, bit) = ringer_bit(c);
                assert_eq!(bit.count_ones(), 1);
                assert!(
                    bits.insert((w, bit)),
                    "{ranks}: sender {c}'s bit is its own"
                );
                let at = l.ringer_word(w);
                assert_eq!(at % 8, 0);
                assert!(at + 8 <= l.words_len(), "{ranks}: word {w} inside the area");
            }
            for w in 0..l.ringer_words() {
                assert!(used.insert(l.ringer_word(w)), "{ranks}: ringer word {w}");
            }
            assert_eq!(l.words_len() % CACHE_LINE, 0, "whole lines");
        }
    }

    /// With command segments (static credits), what a rank reserves to receive grows by a
    /// command segment and a line of words per peer: 2 × 32 slots of 1 KiB with the
    /// defaults, 256 MiB at 4,096 peers and 4 GiB at 65,536.
    #[test]
    fn receive_bytes_grow_by_a_command_segment_per_peer() {
        for (ranks, mib) in [(4096, 256), (65536, 4096)] {
            let l = Layout::new(ranks, 32, 1024, 1 << 20).unwrap();
            let per_peer = 2 * 32 * 1024 + CACHE_LINE;
            // Ringer words past the flag's line, in whole lines.
            let ringers = (ranks / 64 - RINGERS_IN_FLAG_LINE).next_multiple_of(8) * 8;
            assert_eq!(
                l.receive_bytes(),
                2 * CACHE_LINE + ranks * per_peer + ringers,
                "{ranks} peers"
            );
            assert_eq!(
                l.receive_bytes() >> 20,
                mib + ranks * CACHE_LINE / (1 << 20)
            );
        }
    }

    /// With a bank, what a rank reserves grows by a line of words, a claim record and a room
    /// waiter bit per peer, beside the bank itself: 1.3 MiB at 4,096 peers and 5.5 MiB at 65,536 with the
    /// default bank (1,024 slots of 1 KiB). The bank's words lie past every other word, and
    /// its slots before the AM segment.
    #[test]
    fn a_bank_keeps_receive_bytes_small_at_4096_and_65536_peers() {
        for (ranks, most) in [(4096, 4 << 20), (65536, 6 << 20)] {
            let l = Layout::with_bank(ranks, crate::DEFAULT_BANK, 1024, 1 << 20).unwrap();
            let ring = l.bank_ring().unwrap();
            assert_eq!(l.command_segments().count, 0);
            assert_eq!(l.segment_base(), ring.data_bytes());
            assert!(l.bank_tail() >= l.taken(ranks - 1) + 8);
            assert!(l.bank_tail() >= l.ringer_word(l.ringer_words() - 1) + 8);
            assert_eq!(l.bank_head(), l.bank_tail() + CACHE_LINE);
            assert_eq!(l.bank_record(0), l.bank_head() + CACHE_LINE);
            assert!(l.bank_record(ranks - 1) + 8 <= l.words_len());
            let bytes = l.receive_bytes();
            assert!(bytes <= most, "{bytes} bytes at {ranks} peers");
            assert_eq!(
                l.bank_room(),
                l.bank_record(0) + (ranks * 8).next_multiple_of(CACHE_LINE)
            );
            assert_eq!(l.bank_room_waiter(0), l.bank_room() + CACHE_LINE);
            assert!(l.bank_room_waiter(l.ringer_words() - 1) + 8 <= l.words_len());
            let words = l.words_len() - l.bank_tail();
            assert_eq!(
                words,
                3 * CACHE_LINE
                    + (ranks * 8).next_multiple_of(CACHE_LINE)
                    + (ranks.div_ceil(64) * 8).next_multiple_of(CACHE_LINE)
            );
        }
        assert!(Layout::with_bank(64, 0, 1024, 0).is_none());
    }

    /// In jobs of up to 448 ranks a ring touches one line: the flag's.
    #[test]
    fn small_jobs_ring_in_the_flag_line() {
        let l = Layout::new(448, 2, 1024, 0).unwrap();
        let last = l.ringer_word(ringer_bit(447).0);
        assert!(last < MEF + CACHE_LINE);
        let l = Layout::new(449, 2, 1024, 0).unwrap();
        assert!(l.ringer_word(ringer_bit(448).0) >= 2 * CACHE_LINE + 449 * CACHE_LINE);
    }
}
