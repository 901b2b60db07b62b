//! Credit-based flow control: how many requests a rank may have outstanding to each peer.
//!
//! A request takes one credit; its reply (explicit, or the implicit empty one the core sends when
//! a handler does not reply) carries a credit byte back. Because every request has receive space
//! reserved at its target, no message is ever dropped for lack of space: a sender out of credit
//! polls (blocking API) or gets [`crate::TryRequestError::WouldBlock`] (`try_` API).
//!
//! The policy is pluggable. [`StaticCredits`] gives every peer the same fixed number; a dynamic
//! policy can steer credits by using the credit byte: the requester's hint on requests, and the
//! number of credits granted back on replies (1 returns the one used, 0 withholds it, more lends).

use crate::types::Rank;

/// A flow-control policy. The core calls it on every request and reply.
pub trait CreditPolicy {
    /// Takes one credit for a request to `peer`; `false` if there is none.
    fn try_acquire(&mut self, peer: Rank) -> bool;
    /// Gives back a credit taken by [`CreditPolicy::try_acquire`] whose request was not sent.
    fn cancel(&mut self, peer: Rank);
    /// A reply from `peer` arrived carrying credit byte `granted`. Returns `false` if no request
    /// to `peer` was outstanding (the peer misbehaved); the state is then unchanged.
    fn on_reply(&mut self, peer: Rank, granted: u8) -> bool;
    /// Replies from `peer` to `count` requests at once (a system message of acknowledgements)
    /// returned `granted` credits together. Returns `false`, the state unchanged, if fewer
    /// than `count` requests to `peer` were outstanding or `granted` is more than `count`
    /// replies can carry (255 each). The default calls [`CreditPolicy::on_reply`] per reply.
    fn on_replies(&mut self, peer: Rank, count: u32, granted: u32) -> bool {
        if count == 0
            || self.outstanding(peer) < count
            || u64::from(granted) > 255 * u64::from(count)
        {
            return false;
        }
        let mut left = granted;
        for _ in 0..count {
            let g = left.min(255);
            left -= g;
            self.on_reply(peer, g as u8);
        }
        true
    }
    /// The credit byte for a request to `peer`.
    fn request_hint(&mut self, peer: Rank) -> u8 {
        let _ = peer;
        0
    }
    /// Target side: the credit byte to put on the reply to a request from `peer` that carried
    /// `hint`. The default returns the one credit the request used.
    fn reply_grant(&mut self, peer: Rank, hint: u8) -> u8 {
        let _ = (peer, hint);
        1
    }
    /// Credits available now for requests to `peer`.
    fn available(&self, peer: Rank) -> u32;
    /// Requests to `peer` whose reply has not arrived.
    fn outstanding(&self, peer: Rank) -> u32;
    /// Credits held toward `peer`: available plus outstanding.
    fn held(&self, peer: Rank) -> u32 {
        self.available(peer) + self.outstanding(peer)
    }
    /// Target side: credits `peer` holds toward this rank, for policies that track it.
    fn lent_to(&self, peer: Rank) -> Option<u32> {
        let _ = peer;
        None
    }
    /// Target side: credits banked here to lend, for policies that bank.
    fn banked(&self) -> Option<u32> {
        None
    }
}

/// A sender's credits toward each target: available, and taken by requests whose reply has
/// not arrived. Both policies keep their sender side in one. One entry per peer, so each
/// request and reply indexes (and bounds-checks) once.
#[derive(Debug, Clone)]
struct Ledger {
    peers: Vec<LedgerEntry>,
}

#[derive(Debug, Clone, Copy)]
struct LedgerEntry {
    available: u32,
    outstanding: u32,
}

impl Ledger {
    fn new(ranks: u32, initial: u32) -> Self {
        Ledger {
            peers: vec![
                LedgerEntry {
                    available: initial,
                    outstanding: 0,
                };
                ranks as usize
            ],
        }
    }

    #[inline]
    fn available(&self, peer: Rank) -> u32 {
        self.peers[peer as usize].available
    }

    #[inline]
    fn outstanding(&self, peer: Rank) -> u32 {
        self.peers[peer as usize].outstanding
    }

    #[inline]
    fn try_acquire(&mut self, peer: Rank) -> bool {
        let e = &mut self.peers[peer as usize];
        if e.available == 0 {
            return false;
        }
        e.available -= 1;
        e.outstanding += 1;
        true
    }

    #[inline]
    fn cancel(&mut self, peer: Rank) {
        let e = &mut self.peers[peer as usize];
        e.available += 1;
        e.outstanding -= 1;
    }

    #[inline]
    fn on_reply(&mut self, peer: Rank, granted: u8) -> bool {
        let e = &mut self.peers[peer as usize];
        if e.outstanding == 0 {
            return false;
        }
        e.outstanding -= 1;
        e.available += granted as u32;
        true
    }

    fn on_replies(&mut self, peer: Rank, count: u32, granted: u32) -> bool {
        let e = &mut self.peers[peer as usize];
        if count == 0 || e.outstanding < count || u64::from(granted) > 255 * u64::from(count) {
            return false;
        }
        e.outstanding -= count;
        e.available += granted;
        true
    }
}

/// The same fixed number of credits for every peer (GASNet's static partitioning).
#[derive(Debug, Clone)]
pub struct StaticCredits {
    ledger: Ledger,
}

impl StaticCredits {
    /// `per_peer` credits toward each of `ranks` ranks (self included).
    ///
    /// # Panics
    /// If `per_peer` is 0 or above 255 (the reply's credit byte must be able to return them).
    pub fn new(ranks: u32, per_peer: u32) -> Self {
        assert!(
            (1..=255).contains(&per_peer),
            "credits per peer must be in 1..=255, got {per_peer}"
        );
        StaticCredits {
            ledger: Ledger::new(ranks, per_peer),
        }
    }
}

impl CreditPolicy for StaticCredits {
    #[inline]
    fn try_acquire(&mut self, peer: Rank) -> bool {
        self.ledger.try_acquire(peer)
    }

    #[inline]
    fn cancel(&mut self, peer: Rank) {
        self.ledger.cancel(peer)
    }

    #[inline]
    fn on_reply(&mut self, peer: Rank, granted: u8) -> bool {
        self.ledger.on_reply(peer, granted)
    }

    fn on_replies(&mut self, peer: Rank, count: u32, granted: u32) -> bool {
        self.ledger.on_replies(peer, count, granted)
    }

    fn available(&self, peer: Rank) -> u32 {
        self.ledger.available(peer)
    }

    fn outstanding(&self, peer: Rank) -> u32 {
        self.ledger.outstanding(peer)
    }
}

/// The policy an endpoint runs: the built-in static one, called without dynamic dispatch on
/// the path of every request and reply, or any other behind a `Box`.
/// Every method of [`CreditPolicy`], the defaulted ones included, is forwarded below: a
/// method added to the trait must be added here too, or a custom policy's override of it
/// would be skipped (`policy_forwards_every_method_to_a_custom_policy` checks the present
/// ones).
pub(crate) enum Policy {
    Static(StaticCredits),
    Custom(Box<dyn CreditPolicy + Send>),
}

/// Forwards to the policy inside; the match lets the static policy's calls inline.
macro_rules! forward {
    ($self:ident, $p:ident => $call:expr) => {
        match $self {
            Policy::Static($p) => $call,
            Policy::Custom($p) => $call,
        }
    };
}

impl CreditPolicy for Policy {
    #[inline]
    fn try_acquire(&mut self, peer: Rank) -> bool {
        forward!(self, p => p.try_acquire(peer))
    }
    #[inline]
    fn cancel(&mut self, peer: Rank) {
        forward!(self, p => p.cancel(peer))
    }
    #[inline]
    fn on_reply(&mut self, peer: Rank, granted: u8) -> bool {
        forward!(self, p => p.on_reply(peer, granted))
    }
    #[inline]
    fn on_replies(&mut self, peer: Rank, count: u32, granted: u32) -> bool {
        forward!(self, p => p.on_replies(peer, count, granted))
    }
    #[inline]
    fn request_hint(&mut self, peer: Rank) -> u8 {
        forward!(self, p => p.request_hint(peer))
    }
    #[inline]
    fn reply_grant(&mut self, peer: Rank, hint: u8) -> u8 {
        forward!(self, p => p.reply_grant(peer, hint))
    }
    fn available(&self, peer: Rank) -> u32 {
        forward!(self, p => p.available(peer))
    }
    fn outstanding(&self, peer: Rank) -> u32 {
        forward!(self, p => p.outstanding(peer))
    }
    fn held(&self, peer: Rank) -> u32 {
        forward!(self, p => p.held(peer))
    }
    fn lent_to(&self, peer: Rank) -> Option<u32> {
        forward!(self, p => p.lent_to(peer))
    }
    fn banked(&self) -> Option<u32> {
        forward!(self, p => p.banked())
    }
}

/// Default of [`DynamicCredits`]: credits each peer starts with.
pub const DYNAMIC_INITIAL: u32 = 2;
/// Default of [`DynamicCredits`]: credits each target keeps banked to lend.
pub const DYNAMIC_BANK: u32 = 32;

/// Jobs of at least this many ranks get [`Credits::DYNAMIC`] instead of [`Credits::default`]
/// where nothing chose the credits, on a transport whose receive memory follows the credit
/// policy ([`Credits::default_for_ranks`]).
pub const DYNAMIC_FROM_RANKS: u32 = 256;

/// Requests received by a target between two halvings of its usage counters.
const EPOCH: u32 = 256;

/// Dynamic credit redistribution (the GASNet Portals conduit's final design).
///
/// Every peer starts with `initial` credits toward each target; the rest of the target's receive
/// space stays **banked** there. A sender that stalls for want of credit sets the credit byte of
/// its next request (its hint). The target then **lends** from its bank on the reply, doubling
/// that peer's holding up to `max_per_peer`. While some peer waits for an empty bank, the target
/// **takes back** one credit (a reply granting 0) from each request of any other peer that holds
/// a loan and did not ask; whatever the demand, it also takes loans back from peers whose usage
/// has decayed to little: usage counters are halved every epoch of 256 requests received.
///
/// The target never has more requests in flight than `ranks * initial + bank`, which is what its
/// receive buffers must hold (see [`Credits::receive_budget`]), against `ranks * per_peer` under
/// [`StaticCredits`]. Requests never fail for lack of credit: the blocking API polls until a
/// reply returns one. A peer that goes completely silent keeps its loan until its next request
/// to that target; the loan is bounded by `max_per_peer - initial`.
#[derive(Debug, Clone)]
pub struct DynamicCredits {
    initial: u32,
    max_per_peer: u32,
    // Sender side, per target.
    ledger: Ledger,
    stalled: Vec<bool>,
    // Target side, per sender.
    lent: Vec<u32>,
    usage: Vec<u32>,
    bank: u32,
    received: u32,
    // Peers that asked for more while the bank was empty, and how many there are.
    wanting: Vec<bool>,
    wanting_count: u32,
}

impl DynamicCredits {
    /// `initial` credits per peer, `bank` to lend, at most `max_per_peer` held by one peer.
    ///
    /// # Panics
    /// If `initial` is 0 or `max_per_peer < initial`.
    pub fn new(ranks: u32, initial: u32, bank: u32, max_per_peer: u32) -> Self {
        assert!(
            initial >= 1,
            "dynamic credits need at least 1 initial credit per peer"
        );
        assert!(
            max_per_peer >= initial,
            "max_per_peer ({max_per_peer}) below initial ({initial})"
        );
        let n = ranks as usize;
        DynamicCredits {
            initial,
            max_per_peer,
            ledger: Ledger::new(ranks, initial),
            stalled: vec![false; n],
            lent: vec![initial; n],
            usage: vec![0; n],
            bank,
            received: 0,
            wanting: vec![false; n],
            wanting_count: 0,
        }
    }

    /// Target side: credits `peer` holds toward this rank, as this rank accounts them.
    pub fn lent_to(&self, peer: Rank) -> u32 {
        self.lent[peer as usize]
    }

    fn set_wanting(&mut self, p: usize, wanting: bool) {
        if self.wanting[p] != wanting {
            self.wanting[p] = wanting;
            if wanting {
                self.wanting_count += 1;
            } else {
                self.wanting_count -= 1;
            }
        }
    }

    fn tick_epoch(&mut self) {
        self.received += 1;
        if self.received >= EPOCH {
            self.received = 0;
            for u in &mut self.usage {
                *u /= 2;
            }
            // A peer that asked and then went quiet must not keep draining the others.
            self.wanting.fill(false);
            self.wanting_count = 0;
        }
    }
}

impl CreditPolicy for DynamicCredits {
    #[inline]
    fn try_acquire(&mut self, peer: Rank) -> bool {
        if !self.ledger.try_acquire(peer) {
            self.stalled[peer as usize] = true;
            return false;
        }
        true
    }

    #[inline]
    fn cancel(&mut self, peer: Rank) {
        self.ledger.cancel(peer)
    }

    #[inline]
    fn on_reply(&mut self, peer: Rank, granted: u8) -> bool {
        self.ledger.on_reply(peer, granted)
    }

    fn on_replies(&mut self, peer: Rank, count: u32, granted: u32) -> bool {
        self.ledger.on_replies(peer, count, granted)
    }

    #[inline]
    fn request_hint(&mut self, peer: Rank) -> u8 {
        let p = peer as usize;
        // Out of credit now, or stalled since the last request: ask for more.
        let want = self.stalled[p] || self.ledger.peers[p].available == 0;
        self.stalled[p] = false;
        want as u8
    }

    fn reply_grant(&mut self, peer: Rank, hint: u8) -> u8 {
        let p = peer as usize;
        self.tick_epoch();
        self.usage[p] = self.usage[p].saturating_add(1);
        let lent = self.lent[p];
        if hint != 0 {
            if lent < self.max_per_peer && self.bank > 0 {
                let more = lent.min(self.bank).min(self.max_per_peer - lent).min(254);
                self.bank -= more;
                self.lent[p] += more;
                self.set_wanting(p, false);
                return 1 + more as u8;
            }
            if lent < self.max_per_peer {
                self.set_wanting(p, true);
            }
            return 1;
        }
        // A peer with a loan that did not ask: take one back if another peer is waiting for
        // the bank, or if this one has gone quiet.
        let others_wait = self.wanting_count > self.wanting[p] as u32;
        if lent > self.initial && !self.wanting[p] && (others_wait || self.usage[p] < 2) {
            self.lent[p] -= 1;
            self.bank += 1;
            return 0;
        }
        1
    }

    fn available(&self, peer: Rank) -> u32 {
        self.ledger.available(peer)
    }

    fn outstanding(&self, peer: Rank) -> u32 {
        self.ledger.outstanding(peer)
    }

    fn lent_to(&self, peer: Rank) -> Option<u32> {
        Some(DynamicCredits::lent_to(self, peer))
    }

    fn banked(&self) -> Option<u32> {
        Some(self.bank)
    }
}

/// How credits are shared out between peers (`AM_CREDITS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credits {
    /// Every peer gets the same number toward every target (`AM_CREDITS=8`): [`StaticCredits`].
    Static(u32),
    /// Each peer starts with `initial`; each target banks `bank` more and lends them to peers
    /// that stall (`AM_CREDITS=dynamic` or `dynamic:INITIAL:BANK`): [`DynamicCredits`].
    Dynamic {
        /// Credits every peer starts with.
        initial: u32,
        /// Credits each target keeps to lend.
        bank: u32,
    },
}

impl Default for Credits {
    /// 32 static credits per peer: a one-way flood is bounded by how many requests are in
    /// flight while their credits travel back, so more credits keep more of them in flight
    /// (BENCHMARKS.md has the floods and RandomAccess against 8). Receive space grows with
    /// it (`receive_budget`).
    fn default() -> Self {
        Credits::Static(32)
    }
}

impl Credits {
    /// The dynamic policy with its defaults.
    pub const DYNAMIC: Credits = Credits::Dynamic {
        initial: DYNAMIC_INITIAL,
        bank: DYNAMIC_BANK,
    };

    /// The most requests one target can have in flight from all `ranks` ranks (itself included)
    /// at once: the receive space a transport must reserve so that no request is ever dropped.
    pub fn receive_budget(&self, ranks: u32) -> u64 {
        match *self {
            Credits::Static(per_peer) => ranks as u64 * per_peer as u64,
            Credits::Dynamic { initial, bank } => ranks as u64 * initial as u64 + bank as u64,
        }
    }

    /// The credits of a job of `ranks` ranks where nothing chose them, on a transport whose
    /// receive memory follows [`receive_budget`](Self::receive_budget): static ones
    /// ([`Credits::default`]) below [`DYNAMIC_FROM_RANKS`] ranks, where they cost little and
    /// every peer streams at full speed from its first request; [`Credits::DYNAMIC`] from
    /// there on, so that a rank's receive memory grows by `initial` requests per peer instead
    /// of 32.
    pub fn default_for_ranks(ranks: u32) -> Credits {
        if ranks >= DYNAMIC_FROM_RANKS {
            Credits::DYNAMIC
        } else {
            Credits::default()
        }
    }

    /// The most credits one peer may hold toward one target.
    pub fn max_per_peer(&self) -> u32 {
        match *self {
            Credits::Static(per_peer) => per_peer,
            Credits::Dynamic { initial, bank } => initial.saturating_add(bank),
        }
    }

    /// The credits a peer starts with.
    pub fn initial(&self) -> u32 {
        match *self {
            Credits::Static(per_peer) => per_peer,
            Credits::Dynamic { initial, .. } => initial,
        }
    }

    /// Builds the policy for `ranks` ranks, lending no peer more than `transport_max` (the
    /// transport's [`crate::Limits::max_credits`]). Errors name what is out of range.
    pub fn policy(
        &self,
        ranks: u32,
        transport_max: u32,
    ) -> Result<Box<dyn CreditPolicy + Send>, String> {
        Ok(match self.build(ranks, transport_max)? {
            Policy::Static(s) => Box::new(s),
            Policy::Custom(c) => c,
        })
    }

    /// [`Credits::policy`], with the static policy unboxed.
    pub(crate) fn build(&self, ranks: u32, transport_max: u32) -> Result<Policy, String> {
        match *self {
            Credits::Static(per_peer) => {
                if per_peer == 0 || per_peer > 255 || per_peer > transport_max {
                    return Err(format!(
                        "{per_peer} static credits per peer, but this transport allows 1..={}",
                        transport_max.min(255)
                    ));
                }
                Ok(Policy::Static(StaticCredits::new(ranks, per_peer)))
            }
            Credits::Dynamic { initial, bank } => {
                if initial == 0 || initial > 255 || initial > transport_max {
                    return Err(format!(
                        "{initial} initial dynamic credits per peer, but this transport allows 1..={}",
                        transport_max.min(255)
                    ));
                }
                let max = self.max_per_peer().min(transport_max);
                Ok(Policy::Custom(Box::new(DynamicCredits::new(
                    ranks, initial, bank, max,
                ))))
            }
        }
    }
}

impl std::fmt::Display for Credits {
    /// The `AM_CREDITS` spelling: `8` or `dynamic:2:32`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credits::Static(n) => write!(f, "{n}"),
            Credits::Dynamic { initial, bank } => write!(f, "dynamic:{initial}:{bank}"),
        }
    }
}

impl std::str::FromStr for Credits {
    type Err = String;
    /// `8` (static), `dynamic`, or `dynamic:INITIAL:BANK`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("expected a number of static credits in 1..=255, `dynamic` or `dynamic:INITIAL:BANK`, got {s:?}")
        };
        if s == "dynamic" {
            return Ok(Credits::DYNAMIC);
        }
        if let Some(rest) = s.strip_prefix("dynamic:") {
            let (i, b) = rest.split_once(':').ok_or_else(bad)?;
            let initial: u32 = i.parse().map_err(|_| bad())?;
            let bank: u32 = b.parse().map_err(|_| bad())?;
            if !(1..=255).contains(&initial) || bank > 1 << 20 {
                return Err(bad());
            }
            return Ok(Credits::Dynamic { initial, bank });
        }
        match s.parse::<u32>() {
            Ok(n) if (1..=255).contains(&n) => Ok(Credits::Static(n)),
            _ => Err(bad()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Records each call with its arguments, and answers what no built-in policy would.
    struct Spy(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

    impl Spy {
        fn saw(&self, call: String) {
            self.0.lock().unwrap().push(call);
        }
    }

    impl CreditPolicy for Spy {
        fn try_acquire(&mut self, peer: Rank) -> bool {
            self.saw(format!("try_acquire({peer})"));
            true
        }
        fn cancel(&mut self, peer: Rank) {
            self.saw(format!("cancel({peer})"));
        }
        fn on_reply(&mut self, peer: Rank, granted: u8) -> bool {
            self.saw(format!("on_reply({peer}, {granted})"));
            true
        }
        fn on_replies(&mut self, peer: Rank, count: u32, granted: u32) -> bool {
            self.saw(format!("on_replies({peer}, {count}, {granted})"));
            true
        }
        fn request_hint(&mut self, peer: Rank) -> u8 {
            self.saw(format!("request_hint({peer})"));
            201
        }
        fn reply_grant(&mut self, peer: Rank, hint: u8) -> u8 {
            self.saw(format!("reply_grant({peer}, {hint})"));
            202
        }
        fn available(&self, peer: Rank) -> u32 {
            self.saw(format!("available({peer})"));
            203
        }
        fn outstanding(&self, peer: Rank) -> u32 {
            self.saw(format!("outstanding({peer})"));
            204
        }
        fn held(&self, peer: Rank) -> u32 {
            self.saw(format!("held({peer})"));
            205
        }
        fn lent_to(&self, peer: Rank) -> Option<u32> {
            self.saw(format!("lent_to({peer})"));
            Some(206)
        }
        fn banked(&self) -> Option<u32> {
            self.saw("banked".into());
            Some(207)
        }
    }

    /// `Policy::Custom` reaches the custom policy for every method, the ones the trait
    /// has a default for included (a missing forward would run the default instead), with
    /// the arguments in their places.
    #[test]
    fn policy_forwards_every_method_to_a_custom_policy() {
        let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut p = Policy::Custom(Box::new(Spy(calls.clone())));
        assert!(p.try_acquire(1));
        p.cancel(2);
        assert!(p.on_reply(3, 4));
        // The default would refuse 9 replies when none is outstanding.
        assert!(p.on_replies(5, 9, 6));
        assert_eq!(p.request_hint(7), 201);
        assert_eq!(p.reply_grant(8, 9), 202);
        assert_eq!(p.available(10), 203);
        assert_eq!(p.outstanding(11), 204);
        assert_eq!(p.held(12), 205);
        assert_eq!(p.lent_to(13), Some(206));
        assert_eq!(p.banked(), Some(207));
        assert_eq!(
            *calls.lock().unwrap(),
            [
                "try_acquire(1)",
                "cancel(2)",
                "on_reply(3, 4)",
                "on_replies(5, 9, 6)",
                "request_hint(7)",
                "reply_grant(8, 9)",
                "available(10)",
                "outstanding(11)",
                "held(12)",
                "lent_to(13)",
                "banked"
            ]
        );
    }

    /// A policy with only the required methods: the trait's default `on_replies`.
    struct Plain(StaticCredits);

    impl CreditPolicy for Plain {
        fn try_acquire(&mut self, peer: Rank) -> bool {
            self.0.try_acquire(peer)
        }
        fn cancel(&mut self, peer: Rank) {
            self.0.cancel(peer)
        }
        fn on_reply(&mut self, peer: Rank, granted: u8) -> bool {
            self.0.on_reply(peer, granted)
        }
        fn available(&self, peer: Rank) -> u32 {
            self.0.available(peer)
        }
        fn outstanding(&self, peer: Rank) -> u32 {
            self.0.outstanding(peer)
        }
    }

    /// Coalesced replies settle exactly what as many single replies would, and a count or a
    /// grant no outstanding requests explain changes nothing, whichever implementation.
    #[test]
    fn replies_together_settle_as_replies_one_by_one() {
        let policies: [Box<dyn CreditPolicy>; 3] = [
            Box::new(StaticCredits::new(2, 8)),
            Box::new(DynamicCredits::new(2, 8, 16, 24)),
            Box::new(Plain(StaticCredits::new(2, 8))),
        ];
        for mut p in policies {
            for _ in 0..5 {
                assert!(p.try_acquire(1));
            }
            for (count, granted) in [(6, 6), (0, 0), (2, 511)] {
                assert!(!p.on_replies(1, count, granted), "{count} {granted}");
                assert_eq!((p.available(1), p.outstanding(1)), (3, 5));
            }
            assert!(p.on_replies(1, 2, 5));
            assert_eq!((p.available(1), p.outstanding(1)), (8, 3));
            assert!(p.on_replies(1, 3, 0));
            assert_eq!((p.available(1), p.outstanding(1)), (8, 0));
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Acquire(u32),
        Cancel(u32),
        Reply(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u32..3).prop_map(Op::Acquire),
            (0u32..3).prop_map(Op::Cancel),
            (0u32..3).prop_map(Op::Reply),
        ]
    }

    proptest! {
        // Against a reference model: credits are conserved, never negative, and a reply with
        // nothing outstanding is refused without changing anything.
        #[test]
        fn static_credits_match_model(per_peer in 1u32..5, ops in proptest::collection::vec(op(), 0..200)) {
            let mut policy = StaticCredits::new(3, per_peer);
            let mut in_flight = [0u32; 3];
            for op in ops {
                match op {
                    Op::Acquire(p) => {
                        let ok = policy.try_acquire(p);
                        prop_assert_eq!(ok, in_flight[p as usize] < per_peer);
                        if ok { in_flight[p as usize] += 1; }
                    }
                    Op::Cancel(p) => {
                        if in_flight[p as usize] > 0 {
                            policy.cancel(p);
                            in_flight[p as usize] -= 1;
                        }
                    }
                    Op::Reply(p) => {
                        let ok = policy.on_reply(p, 1);
                        prop_assert_eq!(ok, in_flight[p as usize] > 0);
                        if ok { in_flight[p as usize] -= 1; }
                    }
                }
                for p in 0..3u32 {
                    prop_assert_eq!(policy.outstanding(p), in_flight[p as usize]);
                    prop_assert_eq!(policy.available(p) + policy.outstanding(p), per_peer);
                }
            }
        }

    }

    #[derive(Debug, Clone)]
    enum Step {
        /// Sender `p` sends a request to the target if it has a credit.
        Send(usize),
        /// The target handles the oldest request in flight from `p`.
        Handle(usize),
        /// Sender `p` receives the oldest reply in flight to it.
        Reply(usize),
    }

    fn step(senders: usize) -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => (0..senders).prop_map(Step::Send),
            2 => (0..senders).prop_map(Step::Handle),
            2 => (0..senders).prop_map(Step::Reply),
        ]
    }

    proptest! {
        // Senders and one target, each with its own policy, messages in flight in between:
        // credits are never created or lost, no sender holds more than the cap, and the target
        // never has more requests in flight than its receive budget.
        #[test]
        fn dynamic_credits_conserve(
            initial in 1u32..4,
            bank in 0u32..20,
            cap_extra in 0u32..24,
            steps in proptest::collection::vec(step(4), 0..600),
        ) {
            const SENDERS: usize = 4;
            let ranks = SENDERS as u32 + 1;
            let target = SENDERS as Rank;
            let max = initial + cap_extra;
            let mut tgt = DynamicCredits::new(ranks, initial, bank, max);
            let mut snd: Vec<DynamicCredits> =
                (0..SENDERS).map(|_| DynamicCredits::new(ranks, initial, bank, max)).collect();
            let mut requests: Vec<std::collections::VecDeque<u8>> = vec![Default::default(); SENDERS];
            let mut replies: Vec<std::collections::VecDeque<u8>> = vec![Default::default(); SENDERS];
            let budget = Credits::Dynamic { initial, bank }.receive_budget(ranks);
            for s in steps {
                match s {
                    Step::Send(p) => {
                        if snd[p].try_acquire(target) {
                            requests[p].push_back(snd[p].request_hint(target));
                        }
                    }
                    Step::Handle(p) => {
                        if let Some(hint) = requests[p].pop_front() {
                            replies[p].push_back(tgt.reply_grant(p as Rank, hint));
                        }
                    }
                    Step::Reply(p) => {
                        if let Some(g) = replies[p].pop_front() {
                            prop_assert!(snd[p].on_reply(target, g));
                        }
                    }
                }
                let mut loans = 0;
                let mut in_flight = 0u64;
                for p in 0..SENDERS {
                    let granted: u32 = replies[p].iter().map(|&g| g as u32).sum();
                    let returning = replies[p].len() as u32;
                    // The target's books: what the sender holds, plus grants still on the wire.
                    prop_assert_eq!(
                        tgt.lent_to(p as Rank),
                        snd[p].held(target) - returning + granted
                    );
                    prop_assert!(snd[p].held(target) <= max.max(initial));
                    prop_assert!(tgt.lent_to(p as Rank) >= initial);
                    loans += tgt.lent_to(p as Rank) - initial;
                    in_flight += requests[p].len() as u64;
                }
                prop_assert_eq!(loans + tgt.banked().unwrap(), bank);
                prop_assert!(in_flight <= budget);
            }
        }
    }

    #[test]
    fn a_stalling_sender_gets_a_loan_and_a_quiet_one_gives_it_back() {
        let mut tgt = DynamicCredits::new(3, 2, 8, 10);
        // Peer 1 asks: its holding doubles.
        assert_eq!(tgt.reply_grant(1, 1), 3);
        assert_eq!(tgt.lent_to(1), 4);
        assert_eq!(tgt.reply_grant(1, 1), 5);
        assert_eq!(tgt.lent_to(1), 8);
        assert_eq!(tgt.banked(), Some(2));
        // It keeps its loan while nobody else waits and it stays busy.
        for _ in 0..10 {
            assert_eq!(tgt.reply_grant(1, 0), 1);
        }
        // Peer 2 drains the rest of the bank, then waits: peer 1 gives back one per request.
        assert_eq!(tgt.reply_grant(2, 1), 3);
        assert_eq!(tgt.banked(), Some(0));
        assert_eq!(tgt.reply_grant(2, 1), 1);
        assert_eq!(tgt.reply_grant(1, 0), 0);
        assert_eq!(tgt.lent_to(1), 7);
        assert_eq!(tgt.reply_grant(2, 1), 2);
        assert_eq!(tgt.lent_to(2), 5);
    }

    #[test]
    fn credits_parse_and_print() {
        assert_eq!("8".parse::<Credits>(), Ok(Credits::Static(8)));
        assert_eq!("dynamic".parse::<Credits>(), Ok(Credits::DYNAMIC));
        assert_eq!(
            "dynamic:1:64".parse::<Credits>(),
            Ok(Credits::Dynamic {
                initial: 1,
                bank: 64
            })
        );
        for bad in [
            "0",
            "256",
            "dyn",
            "dynamic:0:4",
            "dynamic:1",
            "dynamic:a:b",
            "",
        ] {
            assert!(bad.parse::<Credits>().is_err(), "{bad}");
        }
        for c in [Credits::Static(3), Credits::DYNAMIC] {
            assert_eq!(c.to_string().parse::<Credits>(), Ok(c));
        }
        assert_eq!(Credits::Static(8).receive_budget(1024), 8192);
        assert_eq!(Credits::DYNAMIC.receive_budget(1024), 2048 + 32);
    }

    #[test]
    fn large_jobs_default_to_dynamic_credits() {
        assert_eq!(Credits::default_for_ranks(2), Credits::default());
        let below = DYNAMIC_FROM_RANKS - 1;
        assert_eq!(Credits::default_for_ranks(below), Credits::default());
        assert_eq!(
            Credits::default_for_ranks(DYNAMIC_FROM_RANKS),
            Credits::DYNAMIC
        );
        assert_eq!(Credits::default_for_ranks(u32::MAX), Credits::DYNAMIC);
    }
}
