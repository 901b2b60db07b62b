//! `sci`: an SCI shared-segment NIC (Su, Gordon, Oral, George, "GASNet Core API on Scalable
//! Coherent Interface") over real shared memory between processes.
//!
//! The seed's mechanisms, in its own terms:
//! - each rank **exports** one segment (see [`layout`]) and **imports** every peer's
//!   ([`am_shm::Imported`]). The AM protocol only ever *writes* into another rank's memory and
//!   *reads* its own (SCI's "remote writes, local reads"); the one-sided get and the remote
//!   atomics below are the exceptions. Segments are anonymous (a memfd, made by
//!   `am_nic::connect`): no file is created in `/dev/shm`, so a job leaves nothing behind under
//!   any launcher, whatever kills its ranks. Ranks find each other's segments through the
//!   launcher's key-value store (`/proc/<pid>/fd/<n>`); an in-process [`Sci::cluster`] uses
//!   heap segments with the same views, so Miri runs it;
//! - the exported segment holds one **command segment** per sender: `slots` request slots and
//!   as many reply slots (request-reply pairs, the seed's "message number < 2 times the number
//!   of Request-Reply pairs"), each `slot_size` bytes (AM header plus Medium payload), so 2 ×
//!   `slots` × `slot_size` bytes per sender. There is a request slot per credit (`AM_CREDITS`,
//!   32 by default; `SCI_SLOTS` overrides it, 1..=64, and start-up then refuses static credits
//!   above it, while dynamic credits are capped at the slots; see [`SciConfig::from_env`]);
//! - per sender and slot a **message-ready flag** (a 64-bit stamp, the channel's sequence
//!   number, at the start of the slot so that it shares one cache line with the slot header
//!   and the first 48 bytes of the message) and one **message-exist flag** per receiver (a
//!   futex doorbell), written in that order after the data; the receiver moves ready slots to
//!   its **work queue** and delivers them in send order. A sender that rings first sets its
//!   bit in the receiver's **ringer words** (one bit per rank, a remote `fetch_or`: an SCI
//!   lock transaction) and then rings the flag with its ringer word's tag, so a receiver
//!   looks only at the senders that rang: what a poll, a take or an idle sweep reads, and
//!   so which pages of its segment are ever touched, grows with the peers that wrote to it,
//!   not with the job. The idle sweep that finds a message whose ring a corrupted take count
//!   suppressed covers the senders this rank has exchanged messages with; a sender's first
//!   message to a peer always rings;
//! - both sides take slots in turn (request slots, and the reply slot paired with the request
//!   answered), so the receiver knows the two slots a sender's next message can be in; an
//!   idle poll reads the message-exist flag and, beside it, the ready flag where the last
//!   sender's next message of the same kind goes (two words of its own memory, whatever the
//!   number of peers), and takes a message found there at once; with the flag set, it looks
//!   at that sender's other slot next (an exchange both ways alternates the two kinds);
//! - a request sent with none outstanding says so in its slot flags ([`layout::LONE`]), and a
//!   lone request after such a one restarts at request slot 0, where the receiver, once it has
//!   answered everything, also looks: a run of round trips reuses one slot and its reply slot,
//!   whose lines stay warm in both caches, while a stream of requests keeps to the slots in
//!   turn;
//! - the receiver clears its message-exist flag and ringer words only once nothing new came for a
//!   while (or before it sleeps), and then writes a take count into the segment of each sender
//!   whose ringer bit it cleared; a sender rings only if that count (in its *own* memory) moved
//!   since it last rang, so a small message in a steady exchange moves one cache line, the slot's,
//!   and the sender still never reads a peer's memory. The sender's ready flag must be ordered
//!   before its read of the count, against the receiver's take, count write and scan: the sender's
//!   side of that fence is no instruction, and the receiver's take runs
//!   `membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED)`, a barrier on every running thread of the
//!   processes registered for it, as every sci rank is
//!   ([`am_shm::sync::AsymmetricFence::across_processes`]; a kernel without the call fences on both
//!   sides). A take costs an interrupt to the CPUs running ranks, so a receiver takes only before
//!   it sleeps and after 16384 fruitless polls with the flag set;
//! - **message location status** at the sender: a request slot stays busy until the reply
//!   (or the core's implicit ACK) arrives in the paired reply slot, so `max_credits` is the
//!   number of request slots per peer. A reply goes to the reply slot paired with the request
//!   it answers: the request's slot is its `am_core::Route`, which the core hands back with
//!   the reply (the receiver keeps a bit per slot it owes a reply for, and refuses a request
//!   in a slot still owed);
//! - one implicit ACK may answer several requests (`am_core::Capabilities::acks_coalesce`), which
//!   the seed does not do: replies leave in request order, so an ACK routed to a request
//!   answers it and the unanswered ones before it; it lands in the reply slot paired with the
//!   oldest, its slot flags say how many it answers ([`layout::answers`]), and the requester
//!   frees all their request slots and looks for the next reply in the slot after them. A
//!   one-way flood then pays one reply per batch of requests instead of one per request;
//! - while requests stream to a peer, the sender asks its CPU for the cache lines of the request
//!   slots a reply frees, for writing (`prefetchw`, [`am_shm::Imported::prefetch_for_write`]): a
//!   cache hint of shared memory with no SCI counterpart, which reads and writes nothing a peer
//!   sees, so the "writes only" model above holds;
//! - **PIO** (CPU stores) for Short and Medium, with both Medium strategies of the seed
//!   ([`MediumStrategy`]; two transfers by default); a **DMA engine** (a thread per rank,
//!   started on first use) for Long payloads of at least [`SciConfig::dma_threshold`] bytes (by
//!   default none: every Long goes by PIO): the payload is copied into the engine's local DMA
//!   queue (the seed's "copying the source data into the DMA queue"), the engine copies it into
//!   the target's segment while the rank goes on, and the header is published by PIO once the
//!   engine signals completion;
//! - **put and get** (`am_core::Transport::put`/`get`): a put is a remote write into the
//!   target's imported segment, as a Long's payload goes; a get is a remote read of it, since a
//!   get whose bytes the target writes back would need the target's progress (a real card pays
//!   a read round trip per transaction for it). Both are one copy, complete when the call
//!   returns, with no message and no help from the target;
//! - **remote atomics** are SCI's lock transactions (fetch-and-add, compare-and-swap, swap),
//!   which the responder's memory performs: one atomic instruction on the target's mapped word;
//! - a dead peer is noticed as `PeerLost` within ~0.2 s of a wait without progress (its pid,
//!   exchanged at start, is probed with `kill(pid, 0)` and `/proc`); a rank that ends cleanly
//!   marks itself departed in every peer's segment first.
//!
//! **Under dynamic credits: the bank** ([`SciConfig::bank`]). Command segments per sender
//! cost every rank 2 × `slots` × `slot_size` bytes per peer (256 MiB at 4,096 peers), which
//! static credits need and dynamic ones are meant to avoid. With dynamic credits (by default
//! in jobs of [`am_core::credit::DYNAMIC_FROM_RANKS`] ranks or more, or with
//! `AM_CREDITS=dynamic`) each rank exports instead one **bank**: a ring of [`DEFAULT_BANK`]
//! slots of `slot_size` bytes that every sender uses, requests and replies alike. A sender
//! claims its slot with a lock transaction (a compare-and-swap on the slot's status word that
//! names it, [`am_shm::claim`]), stores the message (length, flags, AM bytes), publishes the
//! status and rings the message-exist flag if it is not set already; the receiver reads the
//! ring in ticket order, so a sender's messages arrive in send order, and a reply answers the
//! oldest of the requests still unanswered (its flags say how many), with no slot pairing to
//! keep. A full bank is back-pressure (`Busy`), never an overwrite. A rank's receive memory is
//! then the bank and a line of words and a claim record per peer: 1.3 MiB at 4,096 peers.
//! The receiver skips a slot claimed by a rank it lost, or in the name of one whose claim
//! record does not vouch for it, and holes a corrupt tail left. Longs go by PIO (the DMA
//! engine would hold a claim open).
//!
//! Environment ([`SciConfig::from_env`]): `SCI_SLOTS` (request and reply slots per sender),
//! `SCI_SLOT_SIZE` (slot bytes; a Medium payload takes what the slot and AM headers leave),
//! `SCI_DMA_THRESHOLD` (the Long size from which the DMA engine is used; `off` by default),
//! `SCI_MAX_LONG` (the Long limit, 1 MiB by default), `SCI_MEDIUM` (`two-transfers` or
//! `one-copy`) and `SCI_BANK` (the bank's slots; 0 for command segments per sender).
//!
//! ```
//! use am_core::{AmKind, Config, HandlerId, Handlers, Node, WaitMode};
//! let ranks = sci_sim::Sci::cluster(2, 1 << 16, sci_sim::SciConfig::default()).unwrap();
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
//! its own, with its own exported segment, command segments (one per sending endpoint), slots
//! and doorbell, so the endpoints of a process share nothing on the send or receive path. An
//! SCI adapter exports as many segments as memory allows and a process imports as many as its
//! mapping resources allow, so the seed's hardware gives an endpoint per thread the same way:
//! a segment exported per endpoint, imported by every other endpoint.
//!
//! What this crate does **not** do: it does not span hosts (the "network" is shared memory
//! between the processes of one host), it does not import the long-payload region lazily as the
//! seed does (every segment is mapped at start), its AM protocol makes no remote reads (the
//! one-sided get and the remote atomics are the only ones), and it does not survive a peer that
//! deliberately corrupts its segment beyond what the checks catch (lengths, slot indices and
//! offsets are checked; a corrupt message is an error for that message).
//!
//! [`SciConfig::dma_threshold`]: field@SciConfig::dma_threshold

//!
//! # Memory as the job grows
//!
//! What a rank reserves to receive, with the default settings: a command segment per sender: 2
//! × `SCI_SLOTS` × `SCI_SLOT_SIZE` (32 request and 32 reply slots of 1 KiB: 64 KiB), so 64 MiB
//! at 1,024 ranks, 256 MiB at 4,096; under dynamic credits one bank that every sender claims
//! slots in (`SCI_BANK`, 1,024 slots of 1 KiB) and 72 B of words per peer: 1.3 MiB at 4,096
//! ranks. What it holds (the pages written or read) grows with the peers that talk to it: the
//! slots senders wrote: a receiver reads only the slots of the senders that rang it, and of
//! those only as far as they can have written (with a bank, the bank).
//!
//! Under dynamic credits, or `AM_CREDITS=dynamic`, sci lays out a bank per rank instead of
//! command segments per sender (`SCI_BANK` sets its slots, 0 keeps the command segments):
//! every message, request or reply, claims a slot of the receiver's bank with a remote
//! compare-and-swap, and a full bank makes senders wait.
//!
//! Where neither `AM_CREDITS` nor `Config::credits` chooses, a job of 256 ranks or more gets
//! dynamic credits (`am_core::credit::DYNAMIC_FROM_RANKS`), and its receive memory is laid out
//! for them. Each process also maps every peer's segment: at 1,024 ranks the processes' own
//! memory (page tables for 1,024 mappings, heap) came to about 10 MiB per rank. BENCHMARKS.md
//! has RandomAccess's segments and memory by ranks on every NIC.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod dma;
pub mod layout;
mod transport;

pub use layout::Layout;
pub use transport::Sci;

/// How an AM Medium gets into the command slot (the seed's section 5.2.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediumStrategy {
    /// "0 copy, 2 transfers": header, then payload straight from the caller's buffer.
    TwoTransfers,
    /// "1 copy, 1 transfer": header and payload copied into one local buffer first, then one
    /// transfer.
    OneCopy,
}

/// Settings of the SCI NIC. All ranks of a job must use the same geometry.
///
/// Change the defaults with the setters named after the fields:
/// `SciConfig::default().slots(4).medium(MediumStrategy::OneCopy)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SciConfig {
    /// Request slots per sender (and as many reply slots); also the most credits per peer.
    /// 1..=64. The seed uses 2; the default is 32, the core's default credits
    /// ([`SciConfig::from_env`] follows `AM_CREDITS` when `SCI_SLOTS` is not set).
    pub slots: usize,
    /// Bytes per slot, including the 8-byte slot header and the AM header (the seed's 1 KiB,
    /// which gives a Medium payload of up to 936 bytes: the slot less its header and a head
    /// with 16 arguments).
    pub slot_size: usize,
    /// Long payloads of at least this many bytes go through the DMA engine; smaller ones by PIO.
    /// Default: `usize::MAX` (PIO always): the engine adds a staging copy and a thread that
    /// competes for the cores with the polling ranks, and in shared memory there is no slow
    /// bus for it to take off the CPU (the seed's PCI trade-off; BENCHMARKS.md, "Figures
    /// behind the code's defaults"). Set it (e.g. `SCI_DMA_THRESHOLD=65536`) to overlap copies
    /// with computation on a machine with a spare core.
    pub dma_threshold: usize,
    /// Largest Long payload per message (also the size of each DMA queue buffer).
    pub max_long: usize,
    /// Medium strategy. Default [`MediumStrategy::TwoTransfers`]: one copy fewer, for a
    /// second transfer that costs no more than the copy it saves (the seed found the same on
    /// SCI; BENCHMARKS.md, "Figures behind the code's defaults").
    pub medium: MediumStrategy,
    /// Slots of each rank's **bank** (a power of two, 8..=65536), or 0 (the default) for
    /// command segments per sender. With a bank, every sender claims its messages' slots
    /// in one ring per receiver with a lock transaction (a remote compare-and-swap), so a
    /// rank's receive memory is the bank's and not a command segment per peer: what dynamic
    /// credits are for. [`SciConfig::from_env`] chooses [`DEFAULT_BANK`] under
    /// `AM_CREDITS=dynamic`; `SCI_BANK` sets it.
    pub bank: usize,
    /// The credits the job was set up for (`AM_CREDITS`, or [`SciConfig::from_env_for_ranks`]'s
    /// choice), which the transport gives the core where its configuration chooses none
    /// ([`NicInfo::credits`](am_core::transport::NicInfo::credits)). Default: the core's default.
    pub credits: am_core::Credits,
}

/// The bank's slots under dynamic credits (see [`SciConfig::bank`]): 1 MiB with 1 KiB slots,
/// room for the initial credits of 512 peers (or the 32 a bank lends and hundreds of peers'
/// initial ones) before senders wait. A bank of 256 slots made RandomAccess at 1,024 ranks
/// take 1.19x as long (BENCHMARKS.md, "sci's bank"), its senders waiting for room.
pub const DEFAULT_BANK: usize = 1024;

impl Default for SciConfig {
    fn default() -> Self {
        SciConfig {
            slots: 32,
            slot_size: 1024,
            dma_threshold: usize::MAX,
            max_long: 1 << 20,
            medium: MediumStrategy::TwoTransfers,
            bank: 0,
            credits: am_core::Credits::default(),
        }
    }
}

impl SciConfig {
    /// The defaults, as [`SciConfig::default`]; change them with the setters below.
    pub fn new() -> SciConfig {
        SciConfig::default()
    }

    /// With this many request slots per sender (1..=64).
    #[must_use]
    pub fn slots(mut self, slots: usize) -> SciConfig {
        self.slots = slots;
        self
    }

    /// With slots of this many bytes, headers included.
    #[must_use]
    pub fn slot_size(mut self, slot_size: usize) -> SciConfig {
        self.slot_size = slot_size;
        self
    }

    /// Sending Long payloads of at least this many bytes through the DMA engine.
    #[must_use]
    pub fn dma_threshold(mut self, dma_threshold: usize) -> SciConfig {
        self.dma_threshold = dma_threshold;
        self
    }

    /// With Long payloads of at most this many bytes per message.
    #[must_use]
    pub fn max_long(mut self, max_long: usize) -> SciConfig {
        self.max_long = max_long;
        self
    }

    /// With this Medium strategy.
    #[must_use]
    pub fn medium(mut self, medium: MediumStrategy) -> SciConfig {
        self.medium = medium;
        self
    }

    /// With a bank of this many slots per rank (0: command segments per sender).
    #[must_use]
    pub fn bank(mut self, bank: usize) -> SciConfig {
        self.bank = bank;
        self
    }
}

impl SciConfig {
    /// Reads `SCI_SLOTS`, `SCI_SLOT_SIZE`, `SCI_DMA_THRESHOLD` (bytes, or `off`),
    /// `SCI_MAX_LONG`, `SCI_MEDIUM` (`two-transfers` or `one-copy`) and `SCI_BANK` (slots,
    /// or 0 for command segments per sender) over the defaults. Under dynamic credits
    /// (`AM_CREDITS=dynamic...`) without `SCI_BANK` the bank has [`DEFAULT_BANK`] slots.
    /// Without `SCI_SLOTS`, there is a slot for each credit the core may give a peer
    /// (`AM_CREDITS`, or the core's default), at most 64, so that any credit setting the
    /// slots allow just works; an `AM_CREDITS` the core would refuse is refused here too.
    /// With `SCI_SLOTS` below static credits, start-up is refused: set `AM_CREDITS` to at
    /// most `SCI_SLOTS` as well (dynamic credits with `SCI_BANK=0` are capped at the slots
    /// instead; with a bank, slots are not used).
    pub fn from_env() -> Result<SciConfig, SciError> {
        SciConfig::from_vars(am_nic::config::env, am_core::Credits::default())
    }

    /// [`from_env`](Self::from_env) for a job of `ranks` ranks: without `AM_CREDITS`, the
    /// credits are [`am_core::Credits::default_for_ranks`] (dynamic from
    /// [`am_core::credit::DYNAMIC_FROM_RANKS`] ranks on), and with dynamic ones the bank,
    /// so that a rank's receive memory stops growing by a command segment per peer. The
    /// transport then gives the core the same credits
    /// ([`NicInfo::credits`](am_core::transport::NicInfo::credits)).
    pub fn from_env_for_ranks(ranks: u32) -> Result<SciConfig, SciError> {
        SciConfig::from_vars(
            am_nic::config::env,
            am_core::Credits::default_for_ranks(ranks),
        )
    }

    /// [`from_env`](Self::from_env) over the variables `var` gives (`None`: not set), with
    /// `default` credits where `AM_CREDITS` is not set.
    fn from_vars(
        var: impl Fn(&str) -> Option<String>,
        default: am_core::Credits,
    ) -> Result<SciConfig, SciError> {
        let mut c = SciConfig::default();
        let num = |k: &str| -> Result<Option<usize>, SciError> {
            match var(k) {
                Some(v) if v == "off" => Ok(Some(usize::MAX)),
                Some(v) => v
                    .parse()
                    .map(Some)
                    .map_err(|_| SciError::Config(format!("{k}={v:?} is not a number"))),
                None => Ok(None),
            }
        };
        let credits =
            am_nic::config::credits(&var, default).map_err(|e| SciError::Config(e.to_string()))?;
        c.credits = credits;
        match num("SCI_SLOTS")? {
            Some(v) => c.slots = v,
            None => c.slots = (credits.max_per_peer() as usize).clamp(1, 64),
        }
        match num("SCI_BANK")? {
            Some(v) => c.bank = v,
            None if matches!(credits, am_core::Credits::Dynamic { .. }) => c.bank = DEFAULT_BANK,
            None => {}
        }
        if let Some(v) = num("SCI_SLOT_SIZE")? {
            c.slot_size = v;
        }
        if let Some(v) = num("SCI_DMA_THRESHOLD")? {
            c.dma_threshold = v;
        }
        if let Some(v) = num("SCI_MAX_LONG")? {
            c.max_long = v;
        }
        match var("SCI_MEDIUM").as_deref() {
            Some("two-transfers") => c.medium = MediumStrategy::TwoTransfers,
            Some("one-copy") => c.medium = MediumStrategy::OneCopy,
            Some(v) => return Err(SciError::Config(format!("SCI_MEDIUM={v:?}"))),
            None => {}
        }
        c.validate()?;
        Ok(c)
    }

    /// Checks the ranges documented on the fields.
    pub fn validate(&self) -> Result<(), SciError> {
        if !(1..=64).contains(&self.slots) {
            return Err(SciError::Config(format!("slots = {} (1..=64)", self.slots)));
        }
        if !(128..=1 << 20).contains(&self.slot_size) || !self.slot_size.is_multiple_of(8) {
            return Err(SciError::Config(format!(
                "slot_size = {} (128..=1 MiB, a multiple of 8)",
                self.slot_size
            )));
        }
        if self.max_long > u32::MAX as usize {
            return Err(SciError::Config("max_long must fit 32 bits".into()));
        }
        if self.bank != 0 && (!(8..=65536).contains(&self.bank) || !self.bank.is_power_of_two()) {
            return Err(SciError::Config(format!(
                "bank = {} (0, or a power of two in 8..=65536)",
                self.bank
            )));
        }
        Ok(())
    }
}

/// Why an SCI NIC could not start: the set-up errors every simulated NIC shares.
pub type SciError = am_nic::SetupError;

// Started by the facade, or a program, as every transport is.
am_bootstrap::impl_connect!(
    Sci,
    SciConfig,
    "sci",
    |ranks| SciConfig::from_env_for_ranks(ranks),
    |e| e.into_connect_error("sci")
);

#[cfg(test)]
mod tests {
    use super::*;

    fn config(vars: &[(&str, &str)]) -> Result<SciConfig, SciError> {
        config_for(vars, am_core::Credits::default())
    }

    fn config_for(vars: &[(&str, &str)], default: am_core::Credits) -> Result<SciConfig, SciError> {
        SciConfig::from_vars(am_nic::config::lookup(vars), default)
    }

    /// Dynamic credits, from `AM_CREDITS` or a large job's default, choose the bank;
    /// `SCI_BANK` sets it (0: command segments per sender), and a size no bank has is
    /// refused.
    #[test]
    fn dynamic_credits_choose_the_bank() {
        assert_eq!(config(&[]).unwrap().bank, 0);
        assert_eq!(
            config(&[("AM_CREDITS", "dynamic")]).unwrap().bank,
            DEFAULT_BANK
        );
        let large = am_core::Credits::default_for_ranks(1024);
        let c = config_for(&[], large).unwrap();
        assert_eq!(
            (c.bank, c.credits),
            (DEFAULT_BANK, am_core::Credits::DYNAMIC)
        );
        let small = config_for(&[], am_core::Credits::default_for_ranks(64)).unwrap();
        assert_eq!(small.bank, 0);
        assert_eq!(config_for(&[("AM_CREDITS", "32")], large).unwrap().bank, 0);
        let off = config(&[("AM_CREDITS", "dynamic"), ("SCI_BANK", "0")]).unwrap();
        assert_eq!(off.bank, 0);
        assert_eq!(config(&[("SCI_BANK", "64")]).unwrap().bank, 64);
        for bad in ["4", "100", "131072"] {
            assert!(config(&[("SCI_BANK", bad)]).is_err(), "SCI_BANK={bad}");
        }
    }

    /// Without `SCI_SLOTS` there is a slot per credit, whatever says how many credits: the
    /// core's default, a number (at most 64 slots) or the dynamic policy's most per peer.
    #[test]
    fn slots_follow_the_credits() {
        let default = am_core::Credits::default().max_per_peer() as usize;
        assert_eq!(config(&[]).unwrap().slots, default);
        assert_eq!(config(&[("AM_CREDITS", "4")]).unwrap().slots, 4);
        assert_eq!(config(&[("AM_CREDITS", "64")]).unwrap().slots, 64);
        assert_eq!(config(&[("AM_CREDITS", "200")]).unwrap().slots, 64);
        let dynamic = am_core::Credits::DYNAMIC.max_per_peer() as usize;
        assert_eq!(config(&[("AM_CREDITS", "dynamic")]).unwrap().slots, dynamic);
        // Only AM_CREDITS counts: another core variable the core would refuse does not.
        let other = config(&[("AM_CREDITS", "16"), ("AM_WAIT", "sometimes")]);
        assert_eq!(other.unwrap().slots, 16);
        let set = config(&[("AM_CREDITS", "64"), ("SCI_SLOTS", "8")]);
        assert_eq!(set.unwrap().slots, 8, "SCI_SLOTS wins");
    }

    /// A credit setting the core refuses is refused here, naming the variable, rather than
    /// silently giving the default slots.
    #[test]
    fn credits_the_core_refuses_are_refused() {
        for bad in ["0", "lots", "256", "dynamic:0:1"] {
            match config(&[("AM_CREDITS", bad)]) {
                Err(SciError::Config(m)) => assert!(m.contains("AM_CREDITS"), "{m}"),
                other => panic!("AM_CREDITS={bad}: {other:?}"),
            }
        }
        assert!(config(&[("SCI_SLOTS", "65")]).is_err());
        assert!(config(&[("SCI_SLOTS", "x")]).is_err());
    }
}
