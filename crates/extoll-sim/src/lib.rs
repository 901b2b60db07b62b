//! `extoll`: EXTOLL's two engines, **VELO** (small messages) and **RMA** (bulk data between
//! registered memory regions), over real shared memory between processes, after the seed's
//! GASNet conduit for EXTOLL and ParaStation's pscom plugins for it.
//!
//! The seed's mechanisms, in its own terms, and where they are:
//! - each rank owns one segment ([`layout`]), anonymous (a memfd, made by `am_nic::connect`: no
//!   file in `/dev/shm`, so a job leaves nothing behind whatever kills its ranks) and mapped by
//!   every peer through the launcher's key-value store (heap memory for the threads of an
//!   in-process [`Extoll::cluster`], with the same atomics and views, so Miri runs it);
//! - **VELO mailbox**: one ring per rank, shared by all senders, of packets of
//!   [`ExtollConfig::packet_size`] bytes (64 as on the seed's FPGA, or 128): 56 (or 120) bytes of
//!   packet data, then an 8-byte **status** word written last, which the receiver polls. Senders of
//!   any process claim slots with a compare-and-swap of the slot's status that names the claimer in
//!   the same step ([`am_shm::mailbox`], a [claimed ring](am_shm::claim)); a message of several
//!   packets claims all its slots or none, and a full mailbox is back-pressure
//!   ([`am_core::SendError::Busy`]), never an overwrite. The published status carries the packet's
//!   **source**, and the receiver reassembles per source ([`velo`]). Each sender has a claim record
//!   in the receiver's segment that only it writes and that vouches for its claims until they are
//!   published, so a receiver tells a dead sender's claim, or one nobody vouches for, from a slow
//!   one, and skips it (so it does in the notification queue, where a rank's main thread and its
//!   engine thread are two claimers). A sender that streams (a second one-packet send to the same
//!   rank since its last poll) takes the line of the slot 8 claims ahead for writing (`prefetchw`,
//!   a cache hint with no EXTOLL counterpart), so its claim does not wait for the receiver's core;
//!   a lone round trip takes no line ahead, as that transfer would share the path with its message;
//! - **AM framing** as in the seed: the 8-byte AM header (request/reply, number of
//!   arguments, handler, payload length) and the arguments, then the payload; spare room in
//!   the last header packet carries the first payload bytes, the rest goes in data-only
//!   packets. AM Short and Medium (up to 8192 bytes) go over VELO;
//! - **RMA engine**: one put routine and one get routine (`rma.rs`) that move bytes into
//!   registered regions (the AM segment, the RMA Medium receive buffers) and write
//!   **completion notifications** into the **notification queues** of the requester and of
//!   the completer, which their owners poll. User puts and gets between registered regions
//!   ([`Extoll::rma_put`], [`Extoll::rma_get`]) are queued to the engine's thread (started on
//!   first use), which overlaps them with the rank's work;
//! - **immediate puts**: an AM Long payload or an RMA Medium is a put whose source is the caller's
//!   own, unregistered buffer, handed over with the doorbell write (as a NIC's PIO window takes
//!   it). The engine processes such a descriptor as the doorbell is rung, on the requester's
//!   thread: the same put routine, the completer's notification (its slot reserved first, so it
//!   never waits; no requester notification is asked for, since the requester knows the put is done
//!   when the doorbell write returns), and the payload copied once, straight into the target's
//!   registered region. It is still the engine's work, not handler code: the AM layer only builds
//!   the descriptor, the handler never copies, and the target learns of the data only from the
//!   engine's completer notification. The thread would only move the same copy to another core,
//!   paying its wake-up and a second copy out of a staging area (BENCHMARKS.md has what that cost);
//! - **put, get and atomics** (`am_core::Transport::put`/`get`/`atomic`): `Node::put` and
//!   `Node::get` are immediate operations too, one copy into or out of the target's registered
//!   segment, complete when the call returns, with no notification; a remote atomic is the
//!   NIC's read-modify-write on the target's memory, as the RMA unit writes a put (one atomic
//!   instruction on the mapped word, no notification, no help from the target);
//! - **AM Long**: the payload put into the target's segment, then the header over VELO
//!   (flagged "wait for RMA"); the target runs the handler only once both the header and the
//!   completer notification have arrived;
//! - **RMA-buffered Medium** (pscom's RMA plugin): per connection, [`ExtollConfig::rma_buffers`]
//!   receive buffers; one put carries the message into the receive buffer of the next index,
//!   message at the end of the buffer and a 64-bit **tail** last (marker, length,
//!   piggybacked acks); a connection out of buffers is back-pressure. [`MediumPath`] chooses
//!   VELO or RMA per size (by default RMA from [`DEFAULT_RMA_FROM`] bytes);
//! - **or RMA Medium buffers from one pool per rank** ([`ExtollConfig::rma_pool`]; the
//!   environment's dynamic credits choose it, from `AM_CREDITS` or by default from 256 ranks, while
//!   credits set in code leave the layout as it is): a sender claims a free buffer of the
//!   receiver's pool with the RMA unit's compare-and-swap on the buffer's claim word, puts the
//!   Medium there as above and names the buffer in its completer notification; the receiver checks
//!   the claim and frees it once the Medium is read. A Medium that finds no free buffer (or its
//!   sender's share, at most 16, in flight) goes over VELO. A rank's receive memory then grows with
//!   the job by three cache lines of words per peer, not by 16 buffers of 8,320 B. A peer that
//!   forges claims for Mediums idle senders may still send (each may have up to 16 in flight) can
//!   hold pool buffers until those senders' Mediums pass them: Mediums then go over VELO, nothing
//!   is lost;
//! - messages of one source are delivered in send order across both paths (each VELO message
//!   says how many RMA Mediums preceded it, each RMA tail how many VELO messages);
//! - thread safety as in the seed: one lock around the NIC is how several threads would share
//!   a rank (the `Transport` takes `&mut self`; wrap it in a `Mutex`);
//! - a dead peer is noticed as `PeerLost` within ~0.2 s of a wait without progress (pids
//!   exchanged at start), a rank that ends cleanly marks itself departed first. The slots a
//!   dead sender claimed but never published, in the mailbox and the notification queue, are
//!   skipped as the heads reach them, so the other senders' messages keep flowing, and
//!   polling goes on after the `PeerLost`;
//! - a peer can write any word of a rank's segment. Every length, count, offset and status
//!   read from it is copied once and checked in the copy; what the protocol never produces is
//!   dropped and reported as `TransportError::PeerMisbehaved` (naming the peer where the
//!   word says who), and a wait that can no longer end (a claim nobody vouches for, a packet
//!   waiting for an RMA Medium or a Long payload that was never notified, a hole left by a
//!   corrupt tail) is ended by the checks a queue gets once its head has not moved for
//!   0.1 s. The RMA engine's thread never waits for ever either: it gives up a notification
//!   when its target is lost or departed, or after 10 s without room.
//!
//! Environment ([`ExtollConfig::from_env`]): `EXTOLL_PACKET_SIZE` (VELO packet bytes, 64 or
//! 128), `EXTOLL_MAILBOX_SLOTS` (mailbox slots, 1024 by default), `EXTOLL_MEDIUM` (`velo`,
//! `rma` or `auto`), `EXTOLL_RMA_FROM` (the size from which `auto` uses RMA buffers, 512 B by
//! default), `EXTOLL_RMA_BUFFERS` (RMA Medium buffers per connection, 16 by default),
//! `EXTOLL_RMA_POOL` (RMA Medium buffers in one pool per rank instead; by default none, or
//! the bank's size under dynamic credits, which [`ExtollConfig::from_env_for_ranks`] chooses
//! from 256 ranks on where `AM_CREDITS` does not),
//! `EXTOLL_MAX_LONG` (the Long limit) and `EXTOLL_NOTIFY_SLOTS` (notification-queue slots).
//!
//! ```
//! use am_core::{AmKind, Config, HandlerId, Handlers, Node, WaitMode};
//! let ranks = extoll_sim::Extoll::cluster(2, 1 << 16, extoll_sim::ExtollConfig::default()).unwrap();
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
//! its own, with its own VELO mailbox and RMA notification queue, and its own RMA Medium
//! buffers (per connection, or its pool). The seed's pscom plugin opens one VELO port per
//! process; the hardware has many VELO ports and RMA notification queues per node (one per
//! process or thread that opens the device), so an endpoint per thread is a port and a
//! notification queue of its own.
//!
//! What this crate does **not** do: it does not span hosts (the "network" is shared memory
//! between the processes of one host); it does not model VELO's own per-connection flow control
//! (the shared mailbox is simply bounded, and the core's credits bound requests); it does not
//! cut RMA Mediums into 4 KiB chunks as pscom does (a buffer holds a whole 8 KiB Medium);
//! registered regions are fixed at start (no dynamic registration). A live rank that holds a
//! claim it vouches for and never publishes stalls that queue (the receiver cannot tell it from
//! a slow one, and skipping it would let its late writes land in the next lap's slot), as a
//! stalled NIC would. A peer can forge well-formed messages in another rank's name: shared
//! memory cannot say who wrote a word.
//!
//! [`ExtollConfig::packet_size`]: field@ExtollConfig::packet_size
//! [`ExtollConfig::rma_buffers`]: field@ExtollConfig::rma_buffers

//!
//! # Memory as the job grows
//!
//! What a rank reserves to receive, with the default settings: one VELO mailbox for all senders
//! (64 KiB) and 16 RMA Medium buffers of 8,320 B per sender (130 MiB at 1,024 ranks); under
//! dynamic credits one pool of as many buffers as the bank (32: 260 KiB) that every sender
//! claims from, so 1.1 MiB per rank at 4,096 ranks. What it holds (the pages written or read)
//! grows with the peers that talk to it: the mailbox, and the buffers of senders of Mediums
//! from 512 B (with a pool, the pool's).
//!
//! Under dynamic credits, or `AM_CREDITS=dynamic`, extoll lays out one pool of RMA Medium
//! buffers per rank instead of buffers per sender (`EXTOLL_RMA_POOL` sets its size; the layout
//! is fixed at start, so credits chosen in code with `Config::credits` leave it as it is); a
//! Medium that finds the pool full goes over VELO packets.
//!
//! Where neither `AM_CREDITS` nor `Config::credits` chooses, a job of 256 ranks or more gets
//! dynamic credits (`am_core::credit::DYNAMIC_FROM_RANKS`), and its receive memory is laid out
//! for them. Each process also maps every peer's segment: at 1,024 ranks the processes' own
//! memory (page tables for 1,024 mappings, heap) came to about 10 MiB per rank. BENCHMARKS.md
//! has RandomAccess's segments and memory by ranks on every NIC.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod layout;
mod rma;
mod transport;
pub mod velo;

pub use layout::Layout;
pub use transport::{Extoll, RmaOp};

/// The largest AM Medium payload (the seed's 8192 bytes).
pub const MAX_MEDIUM: usize = 8192;

/// The most RMA Mediums one sender may have in flight to one receiver: the most RMA Medium
/// buffers per connection ([`ExtollConfig::rma_buffers`]), and a sender's share of a pool. A
/// VELO message counts the RMA Mediums sent before it modulo [`velo::RMA_BEFORE_MOD`], which
/// must exceed it.
pub const MAX_RMA_FLIGHT: usize = 16;
const _: () = assert!(MAX_RMA_FLIGHT < velo::RMA_BEFORE_MOD as usize);

/// The smallest RMA Medium pool dynamic credits choose ([`ExtollConfig::from_env`]).
pub const MIN_RMA_POOL: usize = 8;
/// The largest RMA Medium pool ([`ExtollConfig::rma_pool`]).
pub const MAX_RMA_POOL: usize = 1024;

/// Which engine carries an AM Medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediumPath {
    /// Always VELO packets through the mailbox.
    Velo,
    /// Always an RMA-buffered put (pscom's RMA plugin).
    Rma,
    /// VELO below `rma_from` payload bytes, RMA from there on.
    Auto {
        /// Smallest payload that goes by RMA.
        rma_from: usize,
    },
}

/// The `Auto` crossover. An RMA Medium costs two cache-line transfers on its critical path
/// (the completer notification, then the buffer's tail) however small, and a VELO Medium one
/// per 56 bytes, serialized per packet, so from some size on RMA buffers are at least as fast;
/// where they tie, RMA leaves the mailbox, which every sender shares, to the small messages.
/// From 512 bytes they do (BENCHMARKS.md, "extoll's Medium paths").
pub const DEFAULT_RMA_FROM: usize = 512;

/// Settings of the EXTOLL NIC. All ranks of a job must use the same geometry.
///
/// Change the defaults with the setters named after the fields:
/// `ExtollConfig::default().packet_size(128).medium(MediumPath::Velo)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExtollConfig {
    /// Bytes per VELO packet, status word included: 64 (the seed's FPGA) or 128.
    pub packet_size: usize,
    /// Mailbox slots per rank; must hold the largest message (148 packets of 64 bytes).
    pub mailbox_slots: usize,
    /// How AM Mediums travel.
    pub medium: MediumPath,
    /// RMA Medium buffers per connection, 1..=16 (pscom's 16). Not laid out when
    /// [`rma_pool`](field@ExtollConfig::rma_pool) is set.
    pub rma_buffers: usize,
    /// RMA Medium buffers in one pool per rank that every sender claims from, instead of
    /// `rma_buffers` per connection (0: per connection, 1..=1024: the pool). A rank's receive
    /// memory then no longer grows with the job; a Medium that finds no free buffer goes over
    /// VELO. [`ExtollConfig::from_env`] sets it to the bank under dynamic credits
    /// ([`ExtollConfig::pool_for`]).
    pub rma_pool: usize,
    /// The credits the transport gives the core where nothing else chooses
    /// ([`NicInfo::credits`](am_core::transport::NicInfo::credits)): 32 static by default; what
    /// [`ExtollConfig::from_env_for_ranks`] chose for the job.
    pub credits: am_core::Credits,
    /// Largest Long payload per message.
    pub max_long: usize,
    /// Notification queue slots per rank.
    pub notify_slots: usize,
}

impl Default for ExtollConfig {
    fn default() -> Self {
        ExtollConfig {
            packet_size: 64,
            mailbox_slots: 1024,
            medium: MediumPath::Auto {
                rma_from: DEFAULT_RMA_FROM,
            },
            rma_buffers: 16,
            rma_pool: 0,
            credits: am_core::Credits::default(),
            max_long: 1 << 20,
            notify_slots: 1024,
        }
    }
}

impl ExtollConfig {
    /// The defaults, as [`ExtollConfig::default`]; change them with the setters below.
    pub fn new() -> ExtollConfig {
        ExtollConfig::default()
    }

    /// With VELO packets of this many bytes (64 or 128).
    #[must_use]
    pub fn packet_size(mut self, packet_size: usize) -> ExtollConfig {
        self.packet_size = packet_size;
        self
    }

    /// With this many mailbox slots per rank.
    #[must_use]
    pub fn mailbox_slots(mut self, mailbox_slots: usize) -> ExtollConfig {
        self.mailbox_slots = mailbox_slots;
        self
    }

    /// With AM Mediums carried this way.
    #[must_use]
    pub fn medium(mut self, medium: MediumPath) -> ExtollConfig {
        self.medium = medium;
        self
    }

    /// With this many RMA Medium buffers per connection (1..=16).
    #[must_use]
    pub fn rma_buffers(mut self, rma_buffers: usize) -> ExtollConfig {
        self.rma_buffers = rma_buffers;
        self
    }

    /// With a pool of this many RMA Medium buffers per rank instead of buffers per
    /// connection (0: per connection).
    #[must_use]
    pub fn rma_pool(mut self, rma_pool: usize) -> ExtollConfig {
        self.rma_pool = rma_pool;
        self
    }

    /// With these credits given to the core where nothing else chooses (the pool stays as
    /// set: [`ExtollConfig::pool_for`] gives the one dynamic credits choose).
    #[must_use]
    pub fn credits(mut self, credits: am_core::Credits) -> ExtollConfig {
        self.credits = credits;
        self
    }

    /// With Long payloads of at most this many bytes per message.
    #[must_use]
    pub fn max_long(mut self, max_long: usize) -> ExtollConfig {
        self.max_long = max_long;
        self
    }

    /// With this many notification queue slots per rank.
    #[must_use]
    pub fn notify_slots(mut self, notify_slots: usize) -> ExtollConfig {
        self.notify_slots = notify_slots;
        self
    }
}

impl ExtollConfig {
    /// Reads `EXTOLL_PACKET_SIZE` (64|128), `EXTOLL_MAILBOX_SLOTS`, `EXTOLL_MEDIUM`
    /// (`velo`, `rma` or `auto`), `EXTOLL_RMA_FROM` (the `auto` crossover in payload bytes),
    /// `EXTOLL_RMA_BUFFERS`, `EXTOLL_RMA_POOL`, `EXTOLL_MAX_LONG` and `EXTOLL_NOTIFY_SLOTS`
    /// over the defaults, with the credits of `AM_CREDITS` (32 static without it). Without
    /// `EXTOLL_RMA_POOL`, dynamic credits choose a pool ([`ExtollConfig::pool_for`]):
    /// receive memory that follows the credits.
    pub fn from_env() -> Result<ExtollConfig, ExtollError> {
        ExtollConfig::from_vars(am_nic::config::env, am_core::Credits::default())
    }

    /// [`from_env`](Self::from_env) for a job of `ranks` ranks: without `AM_CREDITS`, the
    /// credits are [`am_core::Credits::default_for_ranks`] (dynamic from
    /// [`am_core::credit::DYNAMIC_FROM_RANKS`] ranks on), with the pool they choose, so that
    /// a rank's receive buffers stop growing with the job. The transport then gives the core
    /// the same credits ([`NicInfo::credits`](am_core::transport::NicInfo::credits)).
    pub fn from_env_for_ranks(ranks: u32) -> Result<ExtollConfig, ExtollError> {
        ExtollConfig::from_vars(
            am_nic::config::env,
            am_core::Credits::default_for_ranks(ranks),
        )
    }

    /// The RMA Medium pool `credits` choose: as many buffers as a dynamic policy's bank
    /// lends (within [`MIN_RMA_POOL`]..=[`MAX_RMA_POOL`]); none (buffers per connection)
    /// under static credits.
    pub fn pool_for(credits: am_core::Credits) -> usize {
        match credits {
            am_core::Credits::Dynamic { bank, .. } => {
                (bank as usize).clamp(MIN_RMA_POOL, MAX_RMA_POOL)
            }
            am_core::Credits::Static(_) => 0,
        }
    }

    /// [`from_env`](Self::from_env) over the variables `var` gives (`None`: not set), with
    /// `default` credits where `AM_CREDITS` is not set. Of the core's variables only
    /// `AM_CREDITS` counts here: [`am_core::Config::from_env`] checks the others.
    fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        default: am_core::Credits,
    ) -> Result<ExtollConfig, ExtollError> {
        let credits = am_nic::config::credits(&var, default)
            .map_err(|e| ExtollError::Config(e.to_string()))?;
        let mut c = ExtollConfig {
            credits,
            rma_pool: ExtollConfig::pool_for(credits),
            ..ExtollConfig::default()
        };
        let num = |k: &str| -> Result<Option<usize>, ExtollError> {
            match var(k) {
                Some(v) => v
                    .parse()
                    .map(Some)
                    .map_err(|_| ExtollError::Config(format!("{k}={v:?} is not a number"))),
                None => Ok(None),
            }
        };
        if let Some(v) = num("EXTOLL_PACKET_SIZE")? {
            c.packet_size = v;
        }
        if let Some(v) = num("EXTOLL_MAILBOX_SLOTS")? {
            c.mailbox_slots = v;
        }
        if let Some(v) = num("EXTOLL_RMA_BUFFERS")? {
            c.rma_buffers = v;
        }
        if let Some(v) = num("EXTOLL_RMA_POOL")? {
            c.rma_pool = v;
        }
        if let Some(v) = num("EXTOLL_MAX_LONG")? {
            c.max_long = v;
        }
        if let Some(v) = num("EXTOLL_NOTIFY_SLOTS")? {
            c.notify_slots = v;
        }
        let rma_from = num("EXTOLL_RMA_FROM")?.unwrap_or(DEFAULT_RMA_FROM);
        c.medium = match var("EXTOLL_MEDIUM").as_deref() {
            Some("velo") => MediumPath::Velo,
            Some("rma") => MediumPath::Rma,
            Some("auto") | None => MediumPath::Auto { rma_from },
            Some(v) => return Err(ExtollError::Config(format!("EXTOLL_MEDIUM={v:?}"))),
        };
        c.validate()?;
        Ok(c)
    }

    /// Checks the ranges documented on the fields.
    pub fn validate(&self) -> Result<(), ExtollError> {
        let bad = |s: String| Err(ExtollError::Config(s));
        if self.packet_size != 64 && self.packet_size != 128 {
            return bad(format!("packet_size = {} (64 or 128)", self.packet_size));
        }
        let need = velo::packets(
            am_core::wire::MAX_HEAD_LEN + MAX_MEDIUM,
            self.packet_size - am_shm::mailbox::STATUS_LEN,
        );
        if self.mailbox_slots < need || self.mailbox_slots > 1 << 20 {
            return bad(format!(
                "mailbox_slots = {} (the largest message needs {need}; at most 2^20)",
                self.mailbox_slots
            ));
        }
        if !(1..=MAX_RMA_FLIGHT).contains(&self.rma_buffers) {
            return bad(format!(
                "rma_buffers = {} (1..={MAX_RMA_FLIGHT})",
                self.rma_buffers
            ));
        }
        if self.rma_pool > MAX_RMA_POOL {
            return bad(format!(
                "rma_pool = {} (0, or 1..={MAX_RMA_POOL})",
                self.rma_pool
            ));
        }
        if self.max_long > u32::MAX as usize || self.max_long == 0 {
            return bad(format!("max_long = {} (1..2^32)", self.max_long));
        }
        if !(16..=1 << 20).contains(&self.notify_slots) {
            return bad(format!("notify_slots = {} (16..=2^20)", self.notify_slots));
        }
        Ok(())
    }

    /// Whether a Medium of `payload` bytes goes by RMA.
    #[inline]
    pub fn medium_by_rma(&self, payload: usize) -> bool {
        self.medium.by_rma(payload)
    }
}

impl MediumPath {
    /// Whether a Medium of `payload` bytes goes by RMA on this path.
    #[inline]
    pub fn by_rma(&self, payload: usize) -> bool {
        match *self {
            MediumPath::Velo => false,
            MediumPath::Rma => true,
            MediumPath::Auto { rma_from } => payload >= rma_from,
        }
    }
}

/// Why an EXTOLL NIC could not start: the set-up errors every simulated NIC shares.
pub type ExtollError = am_nic::SetupError;

/// Why an RMA operation of [`Extoll::rma_put`] / [`Extoll::rma_get`] was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RmaError {
    /// The rank is not in the job, or was lost.
    #[error("rank {0} is not reachable")]
    BadRank(u32),
    /// A range outside a registered region.
    #[error("range of {len} bytes at {offset} outside the registered region of {region} bytes")]
    OutOfBounds {
        /// Offset.
        offset: usize,
        /// Length.
        len: usize,
        /// Region size.
        region: usize,
    },
    /// The engine could not start or stopped (the NIC's error is the source).
    #[error("RMA engine: {0}")]
    Engine(#[source] am_core::NicError),
}
am_bootstrap::impl_connect!(
    Extoll,
    ExtollConfig,
    "extoll",
    |ranks| ExtollConfig::from_env_for_ranks(ranks),
    |e| e.into_connect_error("extoll")
);

#[cfg(test)]
mod tests {
    use super::*;
    use am_core::Credits;

    fn config_for(vars: &[(&str, &str)], default: Credits) -> Result<ExtollConfig, ExtollError> {
        ExtollConfig::from_vars(am_nic::config::lookup(vars), default)
    }

    /// The receive memory (word area, queues and RMA Medium buffers) of one rank of a
    /// 256-rank job laid out by `c`.
    fn receive_bytes(c: &ExtollConfig) -> usize {
        layout::Layout::new(256, c, 0).unwrap().receive_bytes()
    }

    /// Catches a large job's receive memory laid out for its default (dynamic) credits while
    /// `AM_CREDITS` gives the core static ones, or the reverse: a pool shared by every
    /// sender where each connection's credits count on buffers of its own.
    #[test]
    fn am_credits_lays_out_the_receive_memory_of_a_large_job() {
        let large = Credits::default_for_ranks(256);
        assert!(matches!(large, Credits::Dynamic { .. }), "{large:?}");
        let default = config_for(&[], large).unwrap();
        assert_eq!(
            (default.credits, default.rma_pool),
            (large, ExtollConfig::pool_for(large))
        );
        assert!(default.rma_pool > 0);
        let set = config_for(&[("AM_CREDITS", "32")], large).unwrap();
        assert_eq!((set.credits, set.rma_pool), (Credits::Static(32), 0));
        assert!(receive_bytes(&set) > 16 * receive_bytes(&default));
        let bank = config_for(&[("AM_CREDITS", "dynamic:2:512")], large).unwrap();
        assert_eq!(bank.rma_pool, 512);
        assert!(receive_bytes(&bank) > receive_bytes(&default));
        let small = config_for(&[("AM_CREDITS", "dynamic")], Credits::default_for_ranks(2));
        assert_eq!(
            small.unwrap().rma_pool,
            ExtollConfig::pool_for(Credits::DYNAMIC)
        );
        let pool = config_for(&[("AM_CREDITS", "32"), ("EXTOLL_RMA_POOL", "64")], large);
        assert_eq!(pool.unwrap().rma_pool, 64, "EXTOLL_RMA_POOL wins");
    }

    /// Only `AM_CREDITS` of the core's variables counts here, and a value the core refuses
    /// is refused naming it, rather than silently giving the default layout.
    #[test]
    fn credits_the_core_refuses_are_refused() {
        for bad in ["0", "lots", "256", "dynamic:0:1"] {
            match config_for(&[("AM_CREDITS", bad)], Credits::default()) {
                Err(ExtollError::Config(m)) => assert!(m.contains("AM_CREDITS"), "{m}"),
                other => panic!("AM_CREDITS={bad}: {other:?}"),
            }
        }
        let other = config_for(
            &[("AM_CREDITS", "16"), ("AM_WAIT", "sometimes")],
            Credits::default(),
        );
        assert_eq!(other.unwrap().credits, Credits::Static(16));
        assert!(config_for(&[("EXTOLL_MEDIUM", "dma")], Credits::default()).is_err());
    }
}
