//! Calls: a request whose reply comes back to the caller as a value ([`crate::Node::call`],
//! [`crate::AsyncNode::call`]) instead of running a reply handler, as Lamellar's
//! `exec_am_pe` returns the active message's result.
//!
//! A handler registered with [`crate::Handlers::callable`] answers through a [`Call`]; the
//! table reserves one reply handler for every callable one (the highest id free when the
//! first is registered, the same on every rank that builds the same table). On the wire a
//! call is an ordinary request whose first argument is the call's number, and its answer an
//! AM Medium reply whose first argument echoes it: nothing a transport sees is new.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

use crate::error::AmError;
use crate::reply::Token;
use crate::transport::Payload;
use crate::types::{HandlerId, Rank};

/// What a call returns: the arguments and payload its handler answered with
/// ([`Call::reply`]); both empty if the handler returned without answering.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reply {
    /// The answer's arguments (at most 15: the call's number takes the 16th).
    pub args: Vec<u32>,
    /// The answer's payload (at most the transport's largest AM Medium).
    pub payload: Vec<u8>,
}

/// The right to answer one call, given to a handler registered with
/// [`crate::Handlers::callable`] in place of a [`Token`]. Answering consumes it; a handler
/// that returns without answering answers with an empty [`Reply`], so the caller never waits
/// for ever.
pub struct Call<'a> {
    number: u32,
    reply_to: HandlerId,
    token: Option<Token<'a>>,
}

impl<'a> Call<'a> {
    pub(crate) fn new(number: u32, reply_to: HandlerId, token: Token<'a>) -> Call<'a> {
        Call {
            number,
            reply_to,
            token: Some(token),
        }
    }

    /// The caller.
    pub fn src(&self) -> Rank {
        self.token.as_ref().map_or(0, Token::src)
    }

    /// The call's number.
    pub(crate) fn number(&self) -> u32 {
        self.number
    }

    /// Leaves the call unanswered here (the request's credit goes back as for any handler
    /// that does not reply): its answer will come as a request of the caller's
    /// ([`crate::typed`]'s answers too large for a reply). The caller and the call's number.
    pub(crate) fn defer(mut self) -> (Rank, u32) {
        let src = self.src();
        self.token = None;
        (src, self.number)
    }

    /// Answers with `args` (at most 15) and `payload` (at most the largest AM Medium): the
    /// caller's call resolves with them. Errors as [`Token::reply_medium`] does.
    pub fn reply<'p>(
        mut self,
        args: &[u32],
        payload: impl Into<Payload<'p>>,
    ) -> Result<(), AmError> {
        let token = self.token.take().ok_or(AmError::StaleHandle)?;
        answer(token, self.number, self.reply_to, args, payload.into())
    }
}

fn answer(
    token: Token<'_>,
    number: u32,
    reply_to: HandlerId,
    args: &[u32],
    payload: Payload<'_>,
) -> Result<(), AmError> {
    let words = numbered(number, args)?;
    token.reply_medium(reply_to, &words[..=args.len()], payload)
}

/// A call's or an answer's arguments on the wire: the call's number, then `args` (at most
/// 15); the first `args.len() + 1` words are the message's.
pub(crate) fn numbered(number: u32, args: &[u32]) -> Result<[u32; crate::wire::MAX_ARGS], AmError> {
    let mut words = [0u32; crate::wire::MAX_ARGS];
    let Some(rest) = words.get_mut(1..=args.len()) else {
        return Err(AmError::TooManyArgs(args.len() + 1));
    };
    rest.copy_from_slice(args);
    words[0] = number;
    Ok(words)
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if let Some(token) = self.token.take() {
            let _ = answer(token, self.number, self.reply_to, &[], Payload::EMPTY);
        }
    }
}

impl std::fmt::Debug for Call<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Call")
            .field("number", &self.number)
            .field("src", &self.src())
            .finish()
    }
}

/// One call in flight.
#[derive(Debug)]
struct Pending {
    dest: Rank,
    done: Option<Result<Reply, AmError>>,
    waker: Option<Waker>,
}

/// The calls of one node in flight, shared by its reply handler (which completes them) and
/// whoever waits for them.
#[derive(Debug, Default)]
pub(crate) struct Calls {
    state: Mutex<CallState>,
    /// Calls ended so far (answered or failed) whose waiter was woken: read by a driver on
    /// every round, so outside the lock.
    woken: AtomicU64,
    /// Calls ended so far (answered or failed), woken or not: a waiter without a waker looks
    /// into the table only once this has moved since its last look.
    ended: AtomicU64,
    /// Answers that came for no call waiting for one (given up, failed, or a peer's
    /// invention): discarded, and counted here.
    late: AtomicU64,
}

#[derive(Debug, Default)]
struct CallState {
    next: u32,
    pending: HashMap<u32, Pending, BuildHasherDefault<CallNumbers>>,
}

/// The hash of a call's number (Fibonacci hashing: one multiplication). The numbers are this
/// node's own, handed out in sequence, so a peer cannot choose keys that collide: an answer
/// can only look one up, never insert one. A keyed hash would cost more than the rest of a
/// lookup, on every poll of a call that waits.
#[derive(Default)]
pub(crate) struct CallNumbers(u64);

impl Hasher for CallNumbers {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}

impl Calls {
    fn lock(&self) -> MutexGuard<'_, CallState> {
        // A panic elsewhere while the lock was held left the map as it was: go on with it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A number for a new call to `dest`.
    pub(crate) fn open(&self, dest: Rank) -> u32 {
        let mut s = self.lock();
        let mut n = s.next;
        while s.pending.contains_key(&n) {
            n = n.wrapping_add(1);
        }
        s.next = n.wrapping_add(1);
        s.pending.insert(
            n,
            Pending {
                dest,
                done: None,
                waker: None,
            },
        );
        n
    }

    /// The answer to call `number` came from `src`. One for no call of ours to `src` waiting
    /// for it (a call given up or failed, or a peer's invention) is dropped and counted.
    pub(crate) fn complete(&self, src: Rank, number: u32, args: &[u32], payload: &[u8]) {
        self.complete_with(src, number, || Reply {
            args: args.to_vec(),
            payload: payload.to_vec(),
        });
    }

    /// As [`Calls::complete`], with the answer made only if a call takes it.
    pub(crate) fn complete_with(&self, src: Rank, number: u32, reply: impl FnOnce() -> Reply) {
        let mut s = self.lock();
        let mut taken = false;
        if let Some(p) = s.pending.get_mut(&number).filter(|p| p.dest == src) {
            if p.done.is_none() {
                taken = true;
                p.done = Some(Ok(reply()));
                self.end_one();
                if let Some(w) = p.waker.take() {
                    w.wake();
                    self.woken.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if !taken {
            self.late.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one more ended call. Its writers hold the table's lock, so a load and a store
    /// do: no locked read-modify-write between an answer's arrival and the next request.
    fn end_one(&self) {
        self.ended.store(
            self.ended.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Release,
        );
    }

    /// Answers discarded so far: they came for no call waiting for one.
    pub(crate) fn late(&self) -> u64 {
        self.late.load(Ordering::Relaxed)
    }

    /// Fails every call to `peer` still unanswered with `error` (the peer left or died).
    pub(crate) fn fail_to(&self, peer: Rank, error: &AmError) {
        self.fail_where(|dest| dest == peer, error);
    }

    /// Fails every call still unanswered with `error` (the endpoint ended).
    pub(crate) fn fail_all(&self, error: &AmError) {
        self.fail_where(|_| true, error);
    }

    fn fail_where(&self, to: impl Fn(Rank) -> bool, error: &AmError) {
        let mut s = self.lock();
        for p in s.pending.values_mut().filter(|p| to(p.dest)) {
            if p.done.is_none() {
                p.done = Some(Err(error.clone()));
                self.end_one();
                if let Some(w) = p.waker.take() {
                    w.wake();
                    self.woken.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// How many calls have ended so far: a call whose waiter saw this count unanswered is
    /// still unanswered while it stays the same.
    pub(crate) fn ended(&self) -> u64 {
        self.ended.load(Ordering::Acquire)
    }

    /// How many waiters ended calls have woken so far.
    pub(crate) fn answered(&self) -> u64 {
        self.woken.load(Ordering::Relaxed)
    }

    /// Call `number`'s answer if it came (the call is then closed), else `Pending`, and
    /// `waker` (if any) is woken when it comes.
    pub(crate) fn poll(&self, number: u32, waker: Option<&Waker>) -> Poll<Result<Reply, AmError>> {
        let mut s = self.lock();
        match s.pending.get_mut(&number) {
            None => Poll::Ready(Err(AmError::StaleHandle)),
            Some(p) => match p.done.take() {
                Some(r) => {
                    s.pending.remove(&number);
                    Poll::Ready(r)
                }
                None => {
                    if let Some(w) = waker {
                        if !p.waker.as_ref().is_some_and(|o| o.will_wake(w)) {
                            p.waker = Some(w.clone());
                        }
                    }
                    Poll::Pending
                }
            },
        }
    }

    /// Whether call `number` has its answer (or is no call in flight).
    pub(crate) fn is_done(&self, number: u32) -> bool {
        self.lock()
            .pending
            .get(&number)
            .is_none_or(|p| p.done.is_some())
    }

    /// Calls in flight (answered or not) that nobody has taken or given up yet.
    pub(crate) fn len(&self) -> usize {
        self.lock().pending.len()
    }

    /// Gives call `number` up (its waiter is gone); a late answer is dropped.
    pub(crate) fn close(&self, number: u32) {
        self.lock().pending.remove(&number);
    }
}

/// What a handler table keeps for its calls: the reply handler it reserved and the calls in
/// flight, which the node built on the table shares.
#[derive(Debug, Clone)]
pub(crate) struct CallSite {
    pub(crate) reply: HandlerId,
    pub(crate) calls: Arc<Calls>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;

    struct Count(AtomicUsize);
    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// An answer completes its call only from the peer it was sent to, once; a peer's loss
    /// fails its calls and no other's; each wakes its waiter; a closed call drops its answer.
    #[test]
    fn answers_losses_and_closes() {
        let calls = Calls::default();
        let woken = Arc::new(Count(AtomicUsize::new(0)));
        let waker = Waker::from(woken.clone());
        let (a, b, c) = (calls.open(1), calls.open(2), calls.open(1));
        assert!(a != b && b != c && a != c);
        assert!(calls.poll(a, Some(&waker)).is_pending());
        assert!(calls.poll(b, Some(&waker)).is_pending());
        calls.complete(2, a, &[9], b"x");
        assert!(
            calls.poll(a, Some(&waker)).is_pending(),
            "an answer from the wrong peer"
        );
        calls.complete(1, a, &[9], b"x");
        calls.complete(1, a, &[10], b"y");
        assert_eq!(woken.0.load(Ordering::SeqCst), 1);
        let want = Reply {
            args: vec![9],
            payload: b"x".to_vec(),
        };
        assert_eq!(calls.poll(a, Some(&waker)), Poll::Ready(Ok(want)));
        assert_eq!(
            calls.poll(a, Some(&waker)),
            Poll::Ready(Err(AmError::StaleHandle))
        );
        calls.fail_to(2, &AmError::PeerLost(2));
        assert_eq!(woken.0.load(Ordering::SeqCst), 2);
        assert_eq!(calls.poll(b, None), Poll::Ready(Err(AmError::PeerLost(2))));
        assert!(!calls.is_done(c));
        calls.close(c);
        calls.complete(1, c, &[], &[]);
        assert!(calls.is_done(c));
    }
}
