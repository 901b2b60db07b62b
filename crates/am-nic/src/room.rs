//! Room doorbells: a sender that finds a receiver's queue full (sci's bank, extoll's
//! mailbox) sets its bit in the receiver's room waiter words and then the room word (both in
//! the receiver's segment, on lines senders write only when the queue is full); the receiver
//! looks at the room word when it frees room and, if set, rings every waiter
//! ([`ring_waiters`]), so that a sender asleep on a full queue wakes when there is room
//! rather than when its sleep times out.

use am_shm::Segment;

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

/// Takes the room word at `room` and the room waiter words (word `w` at `waiter(w)`) of the
/// receiver's own segment `own`, and calls `ring(c)` once for every sender `c` they name.
/// The words are the peers' to write: a bit naming this rank (`me`) or no rank of the job
/// (`c >= ranks`) is dropped, and a forged one costs its rank a spurious wake-up.
pub fn ring_waiters(
    own: &Segment,
    room: usize,
    waiter: impl Fn(usize) -> usize,
    ranks: usize,
    me: usize,
    mut ring: impl FnMut(usize),
) {
    let _ = own.take_word(room);
    for w in 0..waiter_words(ranks) {
        let mut bits = own.take_word(waiter(w)).unwrap_or(0);
        while bits != 0 {
            let c = w * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if c != me && c < ranks {
                ring(c);
            }
        }
    }
}
