//! The exported segment of one rank.
//!
//! ```text
//! word area (atomics only)
//!   line 0            message-exist flag (doorbell, u32)
//!   line 1            abort word: a rank that panicked sets it
//!   per rank c        departed word, then c's message-exist-flag take count (own line;
//!                     both written only by rank c)
//! byte area
//!   per sender c      command segment: slots request slots, then slots reply slots; each
//!                     slot starts with its message-ready flag (stamp), in the same cache
//!                     line as the slot header and the first 48 bytes of the message
//!   then              the AM segment (GASNet segment; Long payloads land here)
//! ```

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
}

impl Layout {
    /// The layout of `ranks` ranks, each sender with `slots` request slots of `slot_size` bytes,
    /// and an AM segment of `segment` bytes; `None` if its sizes overflow.
    pub fn new(ranks: usize, slots: usize, slot_size: usize, segment: usize) -> Option<Layout> {
        let l = Layout {
            ranks,
            slots,
            slot_size,
            segment,
        };
        let channels = ranks.checked_mul(slots.checked_mul(2)?.checked_mul(slot_size)?)?;
        channels.checked_add(segment)?;
        ranks.checked_mul(CACHE_LINE)?.checked_add(2 * CACHE_LINE)?;
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
        2 * CACHE_LINE + self.ranks * self.channel_words()
    }

    /// Bytes of the byte area.
    pub fn bytes_len(&self) -> usize {
        self.ranks * self.channel_bytes() + self.segment
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
    /// cleared this rank's tag: written by `c` (a remote write into this segment), read here
    /// before ringing `c`. While it has not moved since this rank last rang `c`, `c`'s flag
    /// still carries this rank's tag and need not be rung again.
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

    /// Offset of the AM segment in the byte area.
    pub fn segment_base(&self) -> usize {
        self.ranks * self.channel_bytes()
    }
}
