//! `portals`: a Portals NIC (the seed "Porting GASNet to Portals", Cray XT/SeaStar) over real
//! shared memory between processes, and the GASNet Portals conduit's AM mapping onto it.
//! Each rank's NI memory is an anonymous segment (no file is ever left behind), mapped by
//! every peer with full access (its NIC's view); in-process clusters use heap segments, so
//! Miri and loom run the same code.
//!
//! The seed's mechanisms, in its own terms, and where they are:
//! - a **network interface** per rank ([`ni`]) with a **portal table** ([`ni::NPT`] entries);
//!   each entry has a **match list** of **match entries** ([`ni::MeSpec`]: 64 match bits and
//!   64 ignore bits, persistent or **use-once**, optionally with a **locally managed offset**
//!   that packs incoming puts back to back); the initiator's data is its **memory
//!   descriptor** ([`ni::PutArgs::data`]); **event queues** are rings in the rank's shared
//!   memory with typed events ([`ni::EventKind`]: put, get, send, ack, reply, unlink and
//!   "portal entry disabled");
//! - **put** (with 64 bits of header data and an optional ack) and **get** are processed at the
//!   target by the NIC through matching, never by handler code. The NIC is modelled with **the
//!   initiator's process as the wire**: it walks the target's match list (in the target's exported
//!   memory), claims space with atomics (`fetch_add` on a locally managed offset, a CAS to take a
//!   use-once entry, a CAS of an event slot's status word (am-shm's claimed ring) that names the
//!   claimer), deposits the data and posts the target's event. No thread per rank, no copy through
//!   a staging queue: this is what the SeaStar's embedded processor does, run by the only CPU that
//!   is awake for the message anyway, and it keeps an AM round trip to one cache line per
//!   direction;
//! - **flow control**: the request portal entry has flow control. A put that finds no entry with
//!   room unlinks the entries it exhausted (`Unlink` event, with the bytes used) and disables the
//!   portal entry (`PtDisabled` event); the initiator learns it from the put's outcome
//!   ([`ni::NiFail::PtDisabled`], or an `Ack` event with that failure when it asked for one) and
//!   the transport reports `SendError::Busy`, so the core sends the message again. The target
//!   re-links a buffer once every message claimed in it was read, or was claimed by a rank that
//!   died, and then re-enables the entry. While the entry is disabled every put to it is refused,
//!   so no later message overtakes a refused one: nothing is lost and per-pair order holds. A
//!   refused sender asks to be rung when there is room (its bit in the target's room waiter words;
//!   not in the seed, whose initiator learns it from a later event), and the target rings the
//!   waiters when it re-enables the entry: a sender asleep in a wait wakes then, not when its sleep
//!   times out;
//! - **AMs** as the seed's conduit maps them ([`transport`]): the AM header's first four
//!   bytes (flags, handler, argument count, credit byte) and the request's send-slot index
//!   travel in the **match bits**; a Short with at most two arguments carries them in the
//!   **header data** and moves no payload at all (the whole message is the event); other
//!   messages deposit head and payload into the **request receive buffers**: at least three
//!   chained locally managed entries (triple buffering), sized from the credit policy
//!   ([`PortalsConfig::request_bytes`]): under static credits for its whole receive budget
//!   of the largest messages, so no request is ever refused for room; under dynamic credits
//!   the same up to [`WHOLE_BUDGET_BYTES`], and in larger jobs for every peer's initial
//!   requests as heads and the bank's as whole messages, so they grow by 160 bytes per
//!   peer (2.9 MiB of receive memory per rank at 4,096 peers) and a burst of large Mediums
//!   from many peers at once beyond them goes through flow control (below);
//! - the **reply is written back into the request's send buffer**: every request holds one
//!   of the initiator's send slots (exposed through the reply portal entry) until its reply
//!   lands there; a rank with no free slot reports `Busy` (the seed's send tokens). One
//!   coalesced implicit reply (`am_core::Capabilities::acks_coalesce`; not in the seed) lands in
//!   the send slot of the latest request it answers and frees the slots of the earlier ones
//!   to the same replier too: replies come in request order;
//! - the **segment** is exposed through one entry (put and get, remote offsets): Long payloads
//!   are put there before the header message, which is delivered with `payload_placed`.
//!   `Node::put` and `Node::get` are a `PtlPut` and a `PtlGet` through that entry, straight
//!   from and into the caller's buffer, done when the call returns; a remote atomic
//!   (`PtlFetchAtomic`'s shape, [`ni::Nic::atomic`]) matches it as a get does and is one atomic
//!   instruction on the word it maps to. The entry posts no event, so the target need not poll;
//! - a dead peer is noticed as `PeerLost` within ~0.2 s of a wait without progress (pids
//!   exchanged at start, as in `sci-sim`); a rank that ends cleanly marks itself departed;
//! - **a dead claimer never wedges a receiver**: every claim that could strand the owner
//!   names its claimer in one atomic step (the event slot's compare-and-swap to
//!   `CLAIMED(ticket, rank)`), and each initiator keeps a **sender record** in the target's
//!   memory, stored before its claims (the lowest ticket it may claim, and the locally
//!   managed entry it may be claiming space in) and cleared after its event is published.
//!   The owner skips a slot at its queue's head claimed by a lost rank (or in the name of a
//!   rank whose record does not vouch for it), and re-links a buffer once no live rank's
//!   record names it while that rank holds a claimed slot and no event about it is unread:
//!   a dead rank's claimed bytes are written off, with certainty and no timeout
//!   ([`ni::NiOwner::eq_unblock`], [`ni::NiOwner::lm_drained`]);
//! - **hostile peers**: everything read from shared memory is copied and checked before use
//!   (events, entries, offsets, counts, head and tail); a peer's word no protocol step
//!   writes is reported as `PeerMisbehaved` (naming the peer where the word says who wrote
//!   it), repaired or skipped by the owner (which keeps its own copy of its portal table and
//!   match lists, and checks the shared one when idle and after refusals), and the other
//!   ranks' messages flow on.
//!
//! Environment ([`PortalsConfig::from_env`]): `PORTALS_REQUEST_BUFFERS` (chained request
//! buffers, at least 3), `PORTALS_MAX_MESSAGE` (the largest AM message, 1024 B by default: a
//! Medium payload of up to 80 bytes less), `PORTALS_SEND_SLOTS` (send slots per rank, 128 by
//! default), `PORTALS_MAX_LONG` (the Long limit) and `PORTALS_REQUEST_BUFFER_BYTES` (a forced
//! buffer size, for flow-control tests); the buffers are sized for `AM_CREDITS`.
//!
//! ```
//! use am_core::{AmKind, Config, HandlerId, Handlers, Node, WaitMode};
//! let ranks = portals_sim::Portals::cluster(2, 1 << 16, portals_sim::PortalsConfig::default()).unwrap();
//! let out = am_core::run_ranks(ranks, |t| {
//!     let mut h = Handlers::local();
//!     h.request(HandlerId(1), "ping", AmKind::Short, |_m, tok| {
//!         tok.reply_short(HandlerId(2), &[7]).unwrap();
//!     }).unwrap();
//!     let got = std::rc::Rc::new(std::cell::Cell::new(0));
//!     let g = got.clone();
//!     h.reply(HandlerId(2), "pong", AmKind::Short, move |m| g.set(m.args()[0])).unwrap();
//!     let cfg = Config::default().wait_mode(WaitMode::Block);
//!     let mut node = Node::new(t, h, cfg).unwrap();
//!     if node.rank() == 0 {
//!         node.request_short(1, HandlerId(1), &[]).unwrap();
//!         node.wait_until(|| got.get() == 7).unwrap();
//!     }
//!     node.barrier().unwrap();
//!     got.get()
//! });
//! assert_eq!(out, vec![7, 0]);
//! ```
//!
//! **Several endpoints per process** (`amnet::run_job_endpoints`): each endpoint is a rank of
//! its own, with its own network interface (portal table, match lists, event queues and
//! credit bank). On real Portals, where a process gets one interface of each kind per NIC,
//! an endpoint would be a portal table entry of its own on the process's interface, with its
//! own match list, receive buffers and event queue, as the seed already keeps separate event
//! queues for separate traffic. Here it is a whole simulated interface: the same messages and
//! events, at the cost of an interface's memory per endpoint.
//!
//! What this crate does **not** do: it does not span hosts (the "network" is shared memory
//! between the processes of one host); it has no overflow list and no unexpected-message
//! handling (the AM mapping never needs them); puts are not truncated (a put that does not fit
//! an entry does not match it); locally managed offsets are claimed in 8-byte units; event
//! queues never drop events the AM path depends on (a full queue refuses the put instead), but
//! the courtesy events (`Send`/`Ack`/`Reply` at the initiator, `Unlink`) are skipped when their
//! queue is full, since the state they announce is also kept in the entries. A peer that
//! corrupts a rank's NI memory cannot make it fault, lend bytes outside a message's buffer or
//! write outside the byte area, and is reported; but what is in flight while the corruption
//! lasts may be lost or garbled (every peer can write the byte area, so no transport can keep a
//! hostile peer from rewriting a message before it is read), and a peer that forges a
//! consistent claim in a live rank's name (that rank's record and a claimed slot, together)
//! holds the rank's event queue until that rank ends.

//!
//! # Memory as the job grows
//!
//! What a rank reserves to receive, with the default settings: request buffers for the credits'
//! receive budget, 1.5 KiB per request in flight: with 32 static credits 48 MiB at 1,024 ranks;
//! with dynamic ones (2 per peer and a bank of 32) the same up to 1 MiB of requests
//! (`portals_sim::WHOLE_BUDGET_BYTES`), beyond it every peer's initial requests as heads (80 B)
//! and the bank's as whole messages: with the event queue and a record per peer, 2.0 MiB at
//! 1,024 ranks and 2.9 MiB at 4,096 (large Mediums from many peers at once beyond that are
//! refused by the portal's flow control and sent again). What it holds (the pages written or
//! read) grows with the peers that talk to it: what the buffers took in.
//!
//! Where neither `AM_CREDITS` nor `Config::credits` chooses, a job of 256 ranks or more gets
//! dynamic credits (`am_core::credit::DYNAMIC_FROM_RANKS`), and its receive memory is laid out
//! for them. Each process also maps every peer's segment: at 1,024 ranks the processes' own
//! memory (page tables for 1,024 mappings, heap) came to about 10 MiB per rank. BENCHMARKS.md
//! has RandomAccess's segments and memory by ranks on every NIC.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod layout;
pub mod ni;
pub mod transport;

use am_core::Credits;

pub use layout::Layout;
pub use transport::{Portals, Stats};

/// Settings of the Portals NIC and of the AM mapping. All ranks of a job must use the same.
///
/// Change the defaults with the setters named after the fields:
/// `PortalsConfig::default().send_slots(16).max_message(2048)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortalsConfig {
    /// The credit policy the receive buffers are sized for (`AM_CREDITS`): under static
    /// credits they hold [`Credits::receive_budget`] requests of
    /// [`max_message`](field@Self::max_message) bytes, under dynamic ones what
    /// [`request_bytes`](Self::request_bytes) says.
    pub credits: Credits,
    /// Chained request receive buffers (locally managed entries), at least 3.
    pub request_buffers: usize,
    /// Largest AM message, head and Medium payload together (a Medium payload of up to this
    /// minus 80 bytes). A multiple of 8 in 128..=65536. Also the size of a send slot.
    pub max_message: usize,
    /// Send slots per rank: requests this rank may have in flight to all peers together.
    pub send_slots: usize,
    /// Largest Long payload per message.
    pub max_long: usize,
    /// Forces the bytes of each request buffer, rounded up to a cache line (for tests of flow
    /// control: with buffers smaller than the budget, requests are refused and sent again).
    /// `None`: from the budget.
    pub request_buffer_bytes: Option<usize>,
}

impl Default for PortalsConfig {
    fn default() -> Self {
        PortalsConfig {
            credits: Credits::default(),
            request_buffers: 3,
            max_message: 1024,
            send_slots: 128,
            max_long: 1 << 20,
            request_buffer_bytes: None,
        }
    }
}

impl PortalsConfig {
    /// The defaults, as [`PortalsConfig::default`]; change them with the setters below.
    pub fn new() -> PortalsConfig {
        PortalsConfig::default()
    }

    /// With receive buffers sized for this credit policy.
    #[must_use]
    pub fn credits(mut self, credits: Credits) -> PortalsConfig {
        self.credits = credits;
        self
    }

    /// With this many chained request receive buffers (at least 3).
    #[must_use]
    pub fn request_buffers(mut self, request_buffers: usize) -> PortalsConfig {
        self.request_buffers = request_buffers;
        self
    }

    /// With AM messages of at most this many bytes, head and Medium payload together.
    #[must_use]
    pub fn max_message(mut self, max_message: usize) -> PortalsConfig {
        self.max_message = max_message;
        self
    }

    /// With this many send slots per rank.
    #[must_use]
    pub fn send_slots(mut self, send_slots: usize) -> PortalsConfig {
        self.send_slots = send_slots;
        self
    }

    /// With Long payloads of at most this many bytes per message.
    #[must_use]
    pub fn max_long(mut self, max_long: usize) -> PortalsConfig {
        self.max_long = max_long;
        self
    }

    /// With request buffers of this many bytes (`None`: from the credit budget). Named
    /// `with_` because [`request_buffer_bytes`](method@Self::request_buffer_bytes) computes them.
    pub fn with_request_buffer_bytes(
        mut self,
        request_buffer_bytes: Option<usize>,
    ) -> PortalsConfig {
        self.request_buffer_bytes = request_buffer_bytes;
        self
    }
}

/// Under dynamic credits, the request bytes up to which the request buffers hold the whole
/// receive budget of the largest messages ([`PortalsConfig::request_bytes`]): a job that
/// small never meets flow control for room, whatever its peers send, at a cost that does not
/// matter (1.5 MiB of buffers with triple buffering); larger ones count the initial
/// credits' requests as heads.
pub const WHOLE_BUDGET_BYTES: u64 = 1 << 20;

/// Receive-side and send-side memory of one rank, in bytes (see
/// [`PortalsConfig::memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// Request receive buffers (all chained entries).
    pub receive_buffers: u64,
    /// The event queue.
    pub event_queue: u64,
    /// Send slots (where replies land).
    pub send_slots: u64,
}

impl PortalsConfig {
    /// The defaults, with `AM_CREDITS` (parsed as [`am_core::Config::from_env`] parses it)
    /// and `PORTALS_REQUEST_BUFFERS`, `PORTALS_MAX_MESSAGE`, `PORTALS_SEND_SLOTS`,
    /// `PORTALS_MAX_LONG`, `PORTALS_REQUEST_BUFFER_BYTES` over them.
    pub fn from_env() -> Result<PortalsConfig, PortalsError> {
        PortalsConfig::from_vars(am_nic::config::env, am_core::Credits::default())
    }

    /// [`from_env`](Self::from_env) for a job of `ranks` ranks: without `AM_CREDITS`, the
    /// credits are [`Credits::default_for_ranks`] (dynamic from
    /// [`am_core::credit::DYNAMIC_FROM_RANKS`] ranks on), so that the receive buffers, sized
    /// for them, grow by 2 requests per peer instead of 32. The transport then gives the core
    /// the same credits ([`am_core::transport::NicInfo::credits`]).
    pub fn from_env_for_ranks(ranks: u32) -> Result<PortalsConfig, PortalsError> {
        PortalsConfig::from_vars(am_nic::config::env, Credits::default_for_ranks(ranks))
    }

    /// [`from_env`](Self::from_env) over the variables `var` gives (`None`: not set), with
    /// `default` credits where `AM_CREDITS` is not set. Of the core's variables only
    /// `AM_CREDITS` counts here: [`am_core::Config::from_env`] checks the others.
    fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        default: Credits,
    ) -> Result<PortalsConfig, PortalsError> {
        let credits = am_nic::config::credits(&var, default)?;
        let mut c = PortalsConfig {
            credits,
            ..PortalsConfig::default()
        };
        let num = |k: &str| -> Result<Option<usize>, PortalsError> {
            match var(k) {
                Some(v) => am_core::config::parse_size(&v)
                    .map(Some)
                    .ok_or_else(|| PortalsError::Config(format!("{k}={v:?} is not a size"))),
                None => Ok(None),
            }
        };
        if let Some(v) = num("PORTALS_REQUEST_BUFFERS")? {
            c.request_buffers = v;
        }
        if let Some(v) = num("PORTALS_MAX_MESSAGE")? {
            c.max_message = v;
        }
        if let Some(v) = num("PORTALS_SEND_SLOTS")? {
            c.send_slots = v;
        }
        if let Some(v) = num("PORTALS_MAX_LONG")? {
            c.max_long = v;
        }
        if let Some(v) = num("PORTALS_REQUEST_BUFFER_BYTES")? {
            c.request_buffer_bytes = Some(v);
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks the ranges documented on the fields.
    pub fn validate(&self) -> Result<(), PortalsError> {
        let bad = |s: String| Err(PortalsError::Config(s));
        if !(3..=64).contains(&self.request_buffers) {
            return bad(format!(
                "request_buffers = {} (3..=64)",
                self.request_buffers
            ));
        }
        if !(128..=65536).contains(&self.max_message) || !self.max_message.is_multiple_of(8) {
            return bad(format!(
                "max_message = {} (128..=65536, a multiple of 8)",
                self.max_message
            ));
        }
        if !(1..=65535).contains(&self.send_slots) {
            return bad(format!("send_slots = {} (1..=65535)", self.send_slots));
        }
        if self.max_long > u32::MAX as usize {
            return bad("max_long must fit 32 bits".into());
        }
        if let Some(b) = self.request_buffer_bytes {
            if b < self.max_message || b > 1 << 32 {
                return bad(format!(
                    "request_buffer_bytes = {b} (at least max_message, {})",
                    self.max_message
                ));
            }
        }
        if self.credits.max_per_peer() == 0 {
            return bad("credits must allow at least one request per peer".into());
        }
        Ok(())
    }

    /// Bytes of one request receive buffer in a job of `ranks` ranks: with `n` buffers,
    /// `ceil(need / (n - 1)) + max_message`, rounded up to a cache line, so that `need`
    /// ([`request_bytes`](Self::request_bytes)) fits in `n - 1` of them even when each
    /// wastes up to one message at its end, while the oldest drains (the seed's triple
    /// buffering).
    pub fn request_buffer_bytes(&self, ranks: u32) -> u64 {
        if let Some(b) = self.request_buffer_bytes {
            return (b as u64).div_ceil(64) * 64;
        }
        let need = self.request_bytes(ranks);
        let per = need.div_ceil(self.request_buffers as u64 - 1) + self.max_message as u64;
        per.div_ceil(64) * 64
    }

    /// The request bytes the buffers hold at once in a job of `ranks` ranks, besides what
    /// a buffer wastes at its end.
    ///
    /// Static credits: [`Credits::receive_budget`] requests of
    /// [`max_message`](field@Self::max_message) bytes, so no request is ever refused for
    /// room. Dynamic credits: the same while that is at most [`WHOLE_BUDGET_BYTES`]; in
    /// larger jobs, every peer's initial requests as heads (a Short with all its arguments,
    /// [`am_core::wire::MAX_HEAD_LEN`] bytes; one with two or fewer deposits nothing) and
    /// the bank's loans plus one peer's initial credits as whole messages (a peer that
    /// streams Mediums has borrowed, and its Mediums fit), and never less than
    /// `WHOLE_BUDGET_BYTES`: the buffers then grow by 160 bytes per peer instead of 2 KiB.
    /// There, many peers that send large Mediums at once on their initial credits can fill
    /// them: the portal entry's flow control refuses the puts that find no room and the
    /// core sends them again (see the crate docs), slower but never lost.
    pub fn request_bytes(&self, ranks: u32) -> u64 {
        let max = self.max_message as u64;
        let whole = self.credits.receive_budget(ranks).saturating_mul(max);
        match self.credits {
            Credits::Static(_) => whole,
            Credits::Dynamic { initial, bank } => {
                let heads = (ranks as u64 * initial as u64)
                    .saturating_mul(am_core::wire::MAX_HEAD_LEN as u64)
                    .saturating_add((initial as u64 + bank as u64).saturating_mul(max));
                whole.min(heads.max(WHOLE_BUDGET_BYTES))
            }
        }
    }

    /// Bytes of all request receive buffers of one rank in a job of `ranks` ranks: computed
    /// by the code that sizes the real buffers.
    pub fn receive_buffer_bytes(&self, ranks: u32) -> u64 {
        self.request_buffers as u64 * self.request_buffer_bytes(ranks)
    }

    /// Event-queue slots: room for every request of the budget, a reply per send slot and
    /// the unlink and flow-control events, as a power of two.
    pub fn eq_capacity(&self, ranks: u32) -> u32 {
        let want = self
            .credits
            .receive_budget(ranks)
            .saturating_add(self.send_slots as u64)
            .saturating_add(4 * self.request_buffers as u64 + ranks as u64 + 16);
        want.clamp(64, 1 << 22).next_power_of_two() as u32
    }

    /// The memory one rank reserves for messaging in a job of `ranks` ranks.
    pub fn memory(&self, ranks: u32) -> Memory {
        Memory {
            receive_buffers: self.receive_buffer_bytes(ranks),
            event_queue: self.eq_capacity(ranks) as u64 * am_shm::CACHE_LINE as u64,
            send_slots: self.send_slots as u64 * self.max_message.div_ceil(64) as u64 * 64,
        }
    }
}

/// Why a Portals NIC could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PortalsError {
    /// A shared-memory failure (creating, opening or mapping a segment).
    #[error("shared memory: {0}")]
    Shm(#[from] am_shm::ShmError),
    /// Setting up the NI failed.
    #[error("network interface: {0}")]
    Ni(#[from] ni::NiError),
    /// The launcher's key-value store failed (the store's error is the source).
    #[error("bootstrap: {0}")]
    Bootstrap(#[source] am_bootstrap::BootstrapError),
    /// Start-up under the launcher failed otherwise (no key-value store, a rank's
    /// announcement unreadable): the shared set-up's error is the source.
    #[error("{0}")]
    Setup(#[source] am_nic::SetupError),
    /// An invalid setting.
    #[error("invalid Portals configuration: {0}")]
    Config(String),
    /// A malformed `AM_CREDITS`, the one variable of the core's that
    /// [`PortalsConfig::from_env`] reads.
    #[error("invalid Portals configuration: {0}")]
    CoreConfig(#[from] am_core::config::ConfigError),
    /// A rank's AM segment differs in size from rank 0's (every rank finds the same one).
    #[error(
        "rank {rank} has a {theirs}-byte segment, rank 0 has {ours}: segment sizes must agree"
    )]
    SegmentSizeMismatch {
        /// The first rank whose segment differs.
        rank: u32,
        /// Rank 0's segment size.
        ours: u64,
        /// That rank's segment size.
        theirs: u64,
    },
    /// A rank announced a different geometry.
    #[error("rank {rank} uses a different Portals geometry: {theirs} (ours: {ours})")]
    Mismatch {
        /// The rank.
        rank: u32,
        /// Its geometry.
        theirs: String,
        /// Ours.
        ours: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_for(vars: &[(&str, &str)], default: Credits) -> Result<PortalsConfig, PortalsError> {
        PortalsConfig::from_vars(am_nic::config::lookup(vars), default)
    }

    /// Catches a large job's receive buffers sized for its default (dynamic) credits while
    /// `AM_CREDITS` gives the core others: the core would then lend more than the buffers
    /// hold, or the buffers hold far more than it lends.
    #[test]
    fn am_credits_sizes_the_receive_buffers_of_a_large_job() {
        let large = Credits::default_for_ranks(256);
        assert!(matches!(large, Credits::Dynamic { .. }), "{large:?}");
        let sized = |credits| {
            PortalsConfig {
                credits,
                ..PortalsConfig::default()
            }
            .receive_buffer_bytes(256)
        };
        let default = config_for(&[], large).unwrap();
        assert_eq!(default.credits, large);
        let set = config_for(&[("AM_CREDITS", "32")], large).unwrap();
        assert_eq!(set.credits, Credits::Static(32));
        assert_eq!(set.receive_buffer_bytes(256), sized(Credits::Static(32)));
        assert!(set.receive_buffer_bytes(256) > default.receive_buffer_bytes(256));
        // A larger bank than the default's takes more room; a small job's static default
        // gives way to dynamic credits the same way.
        let bank = config_for(&[("AM_CREDITS", "dynamic:2:4096")], large).unwrap();
        assert!(bank.receive_buffer_bytes(256) > default.receive_buffer_bytes(256));
        assert_eq!(bank.receive_buffer_bytes(256), sized(bank.credits));
        let small = config_for(&[("AM_CREDITS", "dynamic")], Credits::default_for_ranks(2));
        assert_eq!(small.unwrap().credits, Credits::DYNAMIC);
    }

    /// Only `AM_CREDITS` of the core's variables counts here, and a value the core refuses
    /// is refused naming it, rather than silently giving the default buffers.
    #[test]
    fn credits_the_core_refuses_are_refused() {
        for bad in ["0", "lots", "256", "dynamic:0:1"] {
            match config_for(&[("AM_CREDITS", bad)], Credits::default()) {
                Err(PortalsError::CoreConfig(e)) => {
                    assert_eq!((e.var, e.value.as_str()), ("AM_CREDITS", bad));
                }
                other => panic!("AM_CREDITS={bad}: {other:?}"),
            }
        }
        let other = config_for(
            &[("AM_CREDITS", "16"), ("AM_WAIT", "sometimes")],
            Credits::default(),
        );
        assert_eq!(other.unwrap().credits, Credits::Static(16));
        let bad = config_for(&[("PORTALS_MAX_MESSAGE", "x")], Credits::default());
        assert!(bad.is_err());
    }

    /// Static partitioning grows with the peers; dynamic credits mostly do not.
    #[test]
    fn receive_memory_follows_the_credit_budget() {
        let st = PortalsConfig::default();
        let dy = PortalsConfig {
            credits: Credits::DYNAMIC,
            ..st
        };
        for ranks in [16, 256, 1024] {
            let (s, d) = (
                st.receive_buffer_bytes(ranks),
                dy.receive_buffer_bytes(ranks),
            );
            assert!(
                s >= st.credits.receive_budget(ranks) * 1024,
                "static holds its budget"
            );
            // Every peer's initial requests as heads, and the bank's (and one peer's
            // initial) as whole messages, in two of the three buffers.
            let (initial, bank) = (2, 32);
            assert!(
                d >= (ranks as u64 * initial * 80 + (initial + bank) * 1024) * 3 / 2,
                "dynamic holds its heads and its bank"
            );
            assert!(d >= dy.credits.receive_budget(ranks).min(1024) * 1024 * 3 / 2);
            assert!(d < s);
        }
        assert!(dy.receive_buffer_bytes(1024) * 3 < st.receive_buffer_bytes(1024));
        // A job whose whole budget is at most 1 MiB keeps it.
        assert_eq!(dy.request_bytes(64), dy.credits.receive_budget(64) * 1024);
        assert_eq!(dy.request_bytes(1024), WHOLE_BUDGET_BYTES);
        assert!(st.eq_capacity(1024).is_power_of_two());
    }

    /// What one rank reserves to receive under dynamic credits, from the layout the
    /// transport makes (AM segment not counted): its word area (portal table, match
    /// entries, a departed word and a sender record per peer, the event queue), its request
    /// buffers and its send slots, where replies land.
    fn receive_bytes(config: &PortalsConfig, ranks: u32) -> u64 {
        let l = Layout::new(ranks, 0, config).unwrap();
        (l.ni.words_len() + l.segment_base()) as u64
    }

    #[test]
    fn dynamic_credits_keep_receive_memory_small_at_4096_and_65536_peers() {
        let dy = PortalsConfig::default().credits(Credits::DYNAMIC);
        let at_4k = receive_bytes(&dy, 4096);
        assert!(at_4k <= 4 << 20, "{at_4k} bytes at 4,096 peers");
        let at_64k = receive_bytes(&dy, 65536);
        // Per peer: 72 bytes of words, two requests' heads in the buffers (with triple
        // buffering's half more) and event slots for them and the peer's courtesy events.
        assert!(at_64k <= 40 << 20, "{at_64k} bytes at 65,536 peers");
        assert!(
            (at_64k - at_4k) / (65536 - 4096) <= 640,
            "grows by at most 640 bytes per peer"
        );
        // Static credits hold their whole budget of full messages: 1 KiB per credit.
        let st = PortalsConfig::default();
        assert!(receive_bytes(&st, 4096) > 32 * 4096 * 1024);
    }

    #[test]
    fn config_ranges_are_checked() {
        let ok = PortalsConfig::default();
        assert!(ok.validate().is_ok());
        for bad in [
            PortalsConfig {
                request_buffers: 2,
                ..ok
            },
            PortalsConfig {
                max_message: 1001,
                ..ok
            },
            PortalsConfig {
                send_slots: 0,
                ..ok
            },
            PortalsConfig {
                request_buffer_bytes: Some(64),
                ..ok
            },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}

impl PortalsError {
    /// What kind of start-up failure this is ([`am_bootstrap::ConnectErrorKind`]).
    pub fn kind(&self) -> am_bootstrap::ConnectErrorKind {
        use am_bootstrap::ConnectErrorKind as K;
        match self {
            PortalsError::Shm(_) | PortalsError::Ni(_) => K::Resource,
            PortalsError::Bootstrap(_) => K::Bootstrap,
            PortalsError::Setup(e) => e.kind(),
            PortalsError::Config(_) | PortalsError::CoreConfig(_) => K::Config,
            &PortalsError::SegmentSizeMismatch { rank, ours, theirs } => {
                K::SegmentSizeMismatch { rank, ours, theirs }
            }
            PortalsError::Mismatch { .. } => K::Mismatch,
        }
    }

    /// The start-up error of `transport` that this is, keeping it as the source.
    pub fn into_connect_error(self, transport: &'static str) -> am_bootstrap::ConnectError {
        am_bootstrap::ConnectError::new(transport, self.kind(), self)
    }
}

am_bootstrap::impl_connect!(
    Portals,
    PortalsConfig,
    "portals",
    |ranks| PortalsConfig::from_env_for_ranks(ranks),
    |e| e.into_connect_error("portals")
);
