//! Room doorbells: a sender that finds a receiver's queue full (sci's bank, extoll's
//! mailbox) sets its bit in the receiver's room waiter words and then the room word (both in
//! the receiver's segment, on lines senders write only when the queue is full); the receiver
//! looks at the room word when it frees room and, if set, rings as many waiters as it freed
//! slots ([`ring_waiters`]), so that a sender asleep on a full queue wakes when there is
//! room rather than when its sleep times out, and a thousand waiters do not all wake for
//! one slot.

use std::sync::atomic::Ordering;

use am_shm::{Imported, Segment, ShmError};

/// The room waiter word and bit of sender `c`: bit `c % 64` of word `c / 64`.
#[inline]
pub fn waiter_bit(c: usize) -> (usize, u64) {
    (c / 64, 1 << (c % 64))
}

/// How many room waiter words a job of `ranks` ranks has.
#[inline]
pub fn waiter_words(ranks: usize) -> usize {
    ranks.div_ceil(64)
}

/// Asks the receiver whose segment `peer` imports to ring sender `me` when it has room: its
/// bit in the room waiter words (word `w` at `waiter(w)`), then the room word at `room`,
/// each a `SeqCst` read-modify-write, in that order. The receiver clears the room word
/// before it takes bits ([`ring_waiters`]), so the walk a set room word starts sees the bit;
/// and a look at the queue after this either sees room the receiver made meanwhile, or the
/// receiver's look at the room word after making it sees this request.
#[inline]
pub fn ask(
    peer: &Imported,
    room: usize,
    waiter: impl Fn(usize) -> usize,
    me: usize,
) -> Result<(), ShmError> {
    let (w, bit) = waiter_bit(me);
    peer.fetch_or_word(waiter(w), bit)?;
    peer.fetch_or_word(room, 1)?;
    Ok(())
}

/// Takes up to `at_most` waiters from the room waiter words (word `w` at `waiter(w)`) of
/// the receiver's own segment `own`, each once, and calls `ring(c)` for each: the lowest
/// bits of each word in turn, from word `*next` on (the words after the last one rung are
/// looked at first, so no sender waits behind the others for ever). The room word at `room`
/// is cleared first and set again if waiters are left, so a request made meanwhile is seen
/// either by this walk or by the next look at the room word.
///
/// The words are the peers' to write: a bit naming this rank (`me`) or no rank of the job
/// (`c >= ranks`) is dropped, and a forged one costs its rank a spurious wake-up.
#[allow(clippy::too_many_arguments)]
pub fn ring_waiters(
    own: &Segment,
    room: usize,
    waiter: impl Fn(usize) -> usize,
    ranks: usize,
    me: usize,
    at_most: usize,
    next: &mut usize,
    mut ring: impl FnMut(usize),
) {
    let _ = own.take_word(room);
    let words = waiter_words(ranks);
    let mut rung = 0;
    let mut left = false;
    for k in 0..words {
        let w = (*next + k) % words;
        let Ok(word) = own.word(waiter(w)) else {
            continue;
        };
        while word.load(Ordering::Relaxed) != 0 {
            if rung == at_most {
                left = true;
                break;
            }
            let bits = word.load(Ordering::Acquire);
            let bit = bits & bits.wrapping_neg();
            if word.fetch_and(!bit, Ordering::AcqRel) & bit == 0 {
                continue;
            }
            let c = w * 64 + bit.trailing_zeros() as usize;
            if c != me && c < ranks {
                ring(c);
                rung += 1;
                *next = w;
            }
        }
        if left {
            break;
        }
    }
    if left {
        if let Ok(room) = own.word(room) {
            room.fetch_or(1, Ordering::AcqRel);
        }
    }
}
