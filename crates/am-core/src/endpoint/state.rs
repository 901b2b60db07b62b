//! The endpoint's state: what one rank knows of the protocol, and how it is made.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::task::Waker;

use crate::atomic::{Atomic, Posted};
use crate::credit::{CreditPolicy, Policy};
use crate::error::AmError;
use crate::handler::{Handlers, Sendable, Threading};
use crate::op::Orphans;
use crate::protocol::HelloVerdict;
use crate::reply::{OwedAcks, Replies};
use crate::transport::Limits;
use crate::types::Rank;

/// How many posted atomics make a batch. Each batch waits once for its first word's line (a
/// locked instruction lets no later load pass it, not even the next batch's prefetches), so a
/// longer batch spreads that wait over more atomics; past this length it gains nothing more.
pub(super) const POSTED_ATOMICS: usize = 64;

/// [`Endpoint`]'s per-peer gone flags: reported lost, and left the job cleanly.
pub(super) const LOST: u8 = 1;

pub(super) const DEPARTED: u8 = 2;

/// Set for every peer once the endpoint has ended ([`Endpoint::end`]): nothing to or from
/// anyone completes any more, and [`Endpoint::ended`] says why.
pub(super) const ENDED: u8 = 4;

/// A put or get in flight.
#[derive(Default)]
pub(super) struct OpSlot {
    pub(super) gen: u32,
    /// The rank the put or get targets: its replies are the only ones accepted.
    pub(super) peer: Rank,
    pub(super) live: bool,
    /// Where in the peer's segment the operation starts.
    pub(super) offset: usize,
    /// Bytes the operation moves, and how many of them have been asked for so far.
    pub(super) len: usize,
    pub(super) sent: usize,
    /// Chunks sent and not yet answered.
    pub(super) outstanding: u32,
    pub(super) error: Option<AmError>,
    pub(super) data: Vec<u8>,
    /// A remote atomic (one message; its old value lands in `word`) rather than a put or get.
    pub(super) atomic: Option<Atomic>,
    /// A put-with-signal's signal: the word's offset and the atomic sent after the data
    /// (the signal itself, or a load of the word where the NIC applied it), as the
    /// operation's last unit (`len` counts it).
    pub(super) signal: Option<(usize, Atomic)>,
    /// A strided or indexed transfer's regions (offset, length) in the peer's segment, in the
    /// order of its data; empty for every other operation.
    pub(super) regions: Vec<(usize, usize)>,
    /// Where the last look into `regions` ended: a region's index and the data's byte at its
    /// start (sends only go forward, so each message's lookup starts there).
    pub(super) cursor: (usize, usize),
    /// The units the operation had when it started (`len` before a failure cut it short):
    /// its data's bytes, plus the signal's unit.
    pub(super) total: usize,
    /// A put-with-signal whose data the NIC placed when it started: only its signal unit
    /// goes as a message.
    pub(super) placed: bool,
    pub(super) word: u64,
    /// Who completes it: its handle, or nobody (freed when its last answer comes).
    pub(super) detached: Detached,
    /// The task an async wait left, woken when the operation completes.
    pub(super) waker: Option<Waker>,
    /// A split's outcome, once it completed (the slot's outcome is then this team).
    pub(super) team: Option<Option<crate::team::Team>>,
    /// The peer's segment the operation targets: 0, or a created segment reached by
    /// system Mediums ([`crate::segment`]).
    pub(super) seg: u32,
}

/// Who completes an operation in the table.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Detached {
    /// Its [`Op`](crate::op::Op), which takes its outcome.
    #[default]
    No,
    /// Nobody: a posted atomic sent as a message, counted in
    /// [`Endpoint::posted_in_flight`] (a barrier waits for it).
    Posted,
    /// Nobody: its handle was dropped.
    Dropped,
    /// The implicit set ([`Endpoint::implicit`]): its error, if any, is the set's.
    Implicit,
}

/// Start-up handshake: everyone tells rank 0 its table digest and segment size, rank 0
/// tells everyone the verdict.
#[derive(Debug, Clone, Copy)]
pub(super) enum Startup {
    /// Not a rank 0: its HELLO has not gone out yet.
    SendHello,
    /// Not a rank 0: waits for rank 0's verdict.
    AwaitVerdict,
    /// Rank 0: waits for every other rank's HELLO.
    Collect,
    /// Rank 0: sends the verdict to ranks `next..size`.
    Verdicts { next: Rank, verdict: HelloVerdict },
    /// Rank 0, all agree: waits until the verdicts' implicit replies have brought every
    /// credit home.
    CreditsHome,
    /// Over, with this verdict.
    Done(HelloVerdict),
}

/// What start-up has heard.
#[derive(Default)]
pub(super) struct Hello {
    /// Rank 0: how many HELLOs arrived.
    pub(super) received: u32,
    /// Rank 0: the first mismatch seen.
    pub(super) mismatch: Option<HelloVerdict>,
    /// Other ranks: rank 0's verdict.
    pub(super) result: Option<HelloVerdict>,
}

/// Where a barrier stands: its epoch, its round, and whether that round's message went out.
#[derive(Debug, Clone, Copy)]
pub(super) struct BarrierAt {
    pub(super) epoch: u64,
    pub(super) round: u8,
    pub(super) sent: bool,
}

/// The AM protocol state of one rank (see the [module docs](crate::endpoint)).
pub struct Endpoint<H: Threading = Sendable> {
    pub(super) rank: Rank,
    pub(super) size: u32,
    pub(super) limits: Limits,
    pub(super) seg_len: usize,
    pub(super) handlers: Handlers<H>,
    pub(super) credits: Policy,
    /// Replies waiting for the device, implicit replies owed, and what the running handler's
    /// replies did.
    pub(super) replies: Replies,
    pub(super) ops: Vec<OpSlot>,
    pub(super) free_ops: Vec<u32>,
    /// The payload of the strided or indexed put being sent, reused.
    pub(super) scratch_regions: Vec<u8>,
    /// Where dropped handles leave their slots ([`crate::op::Op`]'s `Drop`).
    pub(super) orphans: Arc<Orphans>,
    /// Operations of the implicit set in flight, and the set's first error.
    pub(super) nbi_in_flight: u32,
    pub(super) nbi_error: Option<AmError>,
    /// Async waits woken by completions so far (a driver that sees it change lets the
    /// runtime run the woken tasks).
    pub(super) woken: u64,
    pub(super) startup: Startup,
    pub(super) barrier_epoch: u64,
    /// The barrier in progress (also one that returned an error, to resume).
    pub(super) barrier: Option<BarrierAt>,
    /// How many barriers this rank has left: the barrier of epoch `e` is complete once it
    /// exceeds `e`.
    pub(super) barriers_done: u64,
    /// The barrier in progress returned an error to its waiter: the next barrier resumes it
    /// rather than starting another.
    pub(super) barrier_failed: bool,
    pub(super) barrier_arrivals: HashMap<(u64, u8), u32>,
    pub(super) hello: Hello,
    pub(super) hello_digest: u64,
    /// Our handler table's signature ([`Handlers::signature`]), which rank 0 compares.
    pub(super) hello_signature: [u16; 256],
    /// The table's typed messages' ids, ascending, for the hello.
    pub(super) hello_typed: Vec<u64>,
    pub(super) exit_requested: Option<i32>,
    /// Per peer, whether the transport reported it lost ([`LOST`]: requests to it fail at
    /// once, its operations fail, and nobody waits for its replies any more) or gone from
    /// the job cleanly ([`DEPARTED`]); one byte, so a send looks once.
    pub(super) gone_as: Vec<u8>,
    /// How many peers were marked lost or departed so far.
    pub(super) gone: u32,
    /// Bumped when a peer goes and when a collective's step arrives: a blocking wait that
    /// polls no operation looks at what changed only then ([`Endpoint::changes`]).
    pub(super) changes: u32,
    /// The error that ended the endpoint ([`Endpoint::end`]), every peer then [`ENDED`].
    pub(super) ended: Option<AmError>,
    /// Send attempts that found no credit ([`crate::Stats::credit_waits`]).
    pub(super) credit_waits: u64,
    /// Gone peers whose unanswered requests a wait has already been failed for.
    pub(super) unanswered_reported: Vec<bool>,
    /// Private memory a handler's `Msg::payload` copies a shared payload into (reused).
    pub(super) scratch: Vec<u8>,
    /// Posted atomics not applied yet, in order ([`Endpoint::atomic_nbi`]), all of one path: the
    /// NIC applies them itself ([`Rma::Atomics`](crate::transport::Rma::Atomics)), or they go as
    /// messages.
    pub(super) posted: Vec<Posted>,
    pub(super) posted_by_nic: bool,
    /// The payload of a [`crate::protocol::SystemMsg::Atomics`] being sent (reused).
    pub(super) posted_batch: Vec<u8>,
    /// The first error of the posted atomics applied so far, reported once the queue is empty.
    pub(super) posted_refused: Option<AmError>,
    /// Detached atomics whose reply has not come ([`Endpoint::posted_in_flight`]).
    pub(super) detached_in_flight: u32,
    /// Teams and the collectives in flight on them ([`super::coll`]).
    pub(super) teams: super::teams::Teams,
    /// This rank's created segments and the peers' published here ([`crate::segment`]).
    pub(super) segments: crate::segment::Segments,
}

impl<H: Threading> std::fmt::Debug for Endpoint<H> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("startup", &self.startup)
            .field("quiet", &self.is_quiet())
            .finish_non_exhaustive()
    }
}

impl<H: Threading> Endpoint<H> {
    /// The protocol state of rank `rank` of `size`, over a transport that is `info`
    /// ([`crate::Transport::info`]: its limits and what it does itself) with a segment of
    /// `segment_len` bytes. Start it with [`Endpoint::start_step`] before any other send.
    pub fn new(
        rank: Rank,
        size: u32,
        info: crate::transport::NicInfo,
        segment_len: usize,
        handlers: Handlers<H>,
        credits: Box<dyn CreditPolicy + Send>,
    ) -> Endpoint<H> {
        Self::with_policy(
            rank,
            size,
            info,
            segment_len,
            handlers,
            Policy::Custom(credits),
        )
    }

    /// [`Endpoint::new`] with a policy built by [`crate::Credits`] (the static one unboxed).
    pub(crate) fn with_policy(
        rank: Rank,
        size: u32,
        info: crate::transport::NicInfo,
        segment_len: usize,
        handlers: Handlers<H>,
        credits: Policy,
    ) -> Endpoint<H> {
        let limits = info.limits;
        let hello_digest = handlers.digest();
        let hello_signature = handlers.signature();
        let hello_typed: Vec<u64> = handlers.typed.keys().copied().collect();
        let meta = handlers.registrations();
        if let Some(site) = &handlers.typed_site {
            site.transit.set_max_medium(limits.max_medium);
        }
        Endpoint {
            rank,
            size,
            limits,
            seg_len: segment_len,
            handlers,
            credits,
            replies: Replies {
                pending: VecDeque::new(),
                acks: None,
                replied: false,
                error: None,
                meta,
                limits,
                seg_len: segment_len,
                refused: 0,
            },
            ops: Vec::new(),
            free_ops: Vec::new(),
            scratch_regions: Vec::new(),
            orphans: Arc::default(),
            nbi_in_flight: 0,
            nbi_error: None,
            woken: 0,
            startup: if size <= 1 {
                Startup::Done(HelloVerdict::Ok)
            } else if rank == 0 {
                Startup::Collect
            } else {
                Startup::SendHello
            },
            barrier_epoch: 0,
            barrier: None,
            barriers_done: 0,
            barrier_failed: false,
            barrier_arrivals: HashMap::new(),
            hello: Hello::default(),
            hello_digest,
            hello_signature,
            hello_typed,
            exit_requested: None,
            gone_as: vec![0; size as usize],
            gone: 0,
            changes: 0,
            ended: None,
            credit_waits: 0,
            unanswered_reported: vec![false; size as usize],
            scratch: Vec::new(),
            posted: Vec::with_capacity(POSTED_ATOMICS),
            posted_by_nic: false,
            posted_batch: Vec::new(),
            posted_refused: None,
            detached_in_flight: 0,
            teams: super::teams::Teams::new(rank, size),
            segments: crate::segment::Segments::default(),
        }
    }

    /// Whether one empty reply may answer several requests of a peer
    /// ([`crate::Capabilities::acks_coalesce`]; off by default). On, the requests whose handlers
    /// sent no reply are answered by one system message of acknowledgements per peer when half the
    /// credits a peer starts with are owed to it, and the rest by [`Endpoint::flush_acks`], which a
    /// driver calls when a poll finds nothing.
    pub fn set_acks_coalesce(&mut self, on: bool) {
        self.replies.acks = on.then(|| OwedAcks::new(self.size, self.credits.held(self.rank) / 2));
    }

    /// How team all-reduces run here ([`crate::Config::all_reduce`]; every member of a team
    /// must choose the same). [`crate::AllReduceAlgorithm::Auto`] unless set.
    pub fn set_all_reduce(&mut self, algorithm: crate::AllReduceAlgorithm) {
        self.teams.all_reduce = algorithm;
    }

    /// Whether implicit replies are owed and not yet sent (see [`Endpoint::flush_acks`]).
    #[inline]
    pub fn acks_owed(&self) -> bool {
        self.replies.acks.as_ref().is_some_and(|a| a.owed > 0)
    }

    /// This rank.
    #[inline]
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Number of ranks.
    #[inline]
    pub fn size(&self) -> u32 {
        self.size
    }

    /// The transport's size limits.
    #[inline]
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Bytes of this rank's segment (and, once start-up agreed, of every rank's).
    #[inline]
    pub fn segment_len(&self) -> usize {
        self.seg_len
    }

    /// The credit policy.
    #[inline]
    pub fn credits(&self) -> &dyn CreditPolicy {
        match &self.credits {
            Policy::Static(s) => s,
            Policy::Custom(c) => &**c,
        }
    }

    /// The exit code a peer asked the whole job to end with (a system message): once set,
    /// the driver ends this rank's process with it.
    #[inline]
    pub fn exit_requested(&self) -> Option<i32> {
        self.exit_requested
    }
}
