//! **amnet**: active messages over pluggable NICs, the communication layer that PGAS languages
//! and runtimes compile down to (GASNet's Core API, in safe Rust).
//!
//! This crate is the facade: it re-exports the AM core ([`am_core`]), the rank side of a job
//! ([`am_bootstrap`]) and job launch ([`am_launch`]), names the transports
//! ([`TransportKind`]), lets a program pick one at run time ([`AnyTransport`]), and starts a
//! whole job in one call ([`run_job`]), however the program was started: as threads of this
//! process, as one rank under `amrun` / `mpiexec` / `mpirun` / `srun`, or by launching its own
//! ranks (`--ranks N`).
//!
//! ```no_run
//! use amnet::{AmKind, Config, HandlerId, Handlers, JobOptions, Node};
//!
//! const HELLO: HandlerId = HandlerId(1);
//!
//! fn main() {
//!     let code = amnet::run_job(&JobOptions::default(), |transport| {
//!         let mut handlers = Handlers::local();
//!         handlers.request(HELLO, "hello", AmKind::Short, |msg, _token| {
//!             println!("rank {} says hello", msg.src());
//!         })?;
//!         let mut node = Node::new(transport, handlers, Config::from_env()?)?;
//!         node.request_short((node.rank() + 1) % node.size(), HELLO, &[])?;
//!         node.barrier()?;
//!         Ok::<_, Box<dyn std::error::Error>>(())
//!     })
//!     .expect("job");
//!     std::process::exit(code);
//! }
//! ```
//!
//! What this crate does **not** do: it adds no protocol of its own; everything that moves
//! messages is in `am-core` and the transport crates.
//!
//! # The crates
//!
//! | crate | what it holds |
//! |---|---|
//! | `amnet` (this crate) | the facade: re-exports, `run_job`, transports by name; the `amrun` and `amprobe` binaries, examples and benches |
//! | [`am-core`](https://docs.rs/am-core) | the AM core: wire codec, handlers, tokens, credits, the sans-I/O `Endpoint` and its driver `Node`, the `Transport` trait, Loopback, FaultInjector, the conformance suite (its `conformance` feature) |
//! | [`am-derive`](https://docs.rs/am-derive) | `#[derive(Shape)]`: the serde shape fingerprint of typed messages (re-exported as `typed::Shape`) |
//! | [`am-bootstrap`](https://docs.rs/am-bootstrap) | the rank side of a job: rank, size, job id and the launcher's key-value store (amrun, PMI-1/PMI-2, PMIx), liveness |
//! | [`am-launch`](https://docs.rs/am-launch) | the launcher: `amrun`'s code (local ranks, PMI-1 server, signals, clean-up) |
//! | [`am-pmix`](https://docs.rs/am-pmix) | the PMIx client, with libpmix loaded at run time: the fenced `unsafe` of the libpmix boundary |
//! | [`am-shm`](https://docs.rs/am-shm) | segments, the `SharedBytes` view, rings (the claimed ring under extoll's mailbox and portals' event queue), stamped slots, doorbells, raw floors: the fenced `unsafe` of shared memory |
//! | [`am-nic`](https://docs.rs/am-nic) | what the simulated NICs share: control block, start-up over the key-value store, liveness |
//! | [`sci-sim`](https://docs.rs/sci-sim), [`extoll-sim`](https://docs.rs/extoll-sim), [`portals-sim`](https://docs.rs/portals-sim) | one crate per simulated NIC |
//! | [`transport-udp`](https://docs.rs/transport-udp) | the UDP transport; its threat model is `SECURITY.md` |
//! | [`transport-ofi`](https://docs.rs/transport-ofi) | the libfabric transport (built with the `ofi` feature) |
//! | [`am-ofi`](https://docs.rs/am-ofi) | the libfabric calls behind a safe interface: the fenced `unsafe` of the libfabric boundary |
//! | [`am-msg`](https://docs.rs/am-msg) | messages of any size: eager, sender- and receiver-initiated rendezvous |
//! | `am-perf` | tooling, not published: rank-test programs, the NICs' benches, multi-process tests |
//! | `am-udp-check` | tooling, not published: udp's test and benchmark program |
//!
//! # Environment
//!
//! The variables every job reads, whatever launched it:
//!
//! | variable | meaning |
//! |---|---|
//! | `AM_TRANSPORT` | the transport's name ([`TransportKind`]); wins over the program's choice, with or without a launcher |
//! | `AM_CREDITS` | credits per peer: 1..=255 (static), `dynamic`, or `dynamic:INITIAL:BANK`; unset, the transport's default: 32 static, 128 on `udp`, dynamic on `sci`, `portals` and `extoll` from 256 ranks ([`Config::from_env`]) |
//! | `AM_WAIT` | how blocking calls wait: `spin`, `yield` or `block` ([`WaitMode`]) |
//! | `AM_ALLREDUCE` | how team all-reduces run: `auto`, `doubling` or `ring` ([`AllReduceAlgorithm`]; the same on every rank) |
//! | `AM_SEGMENT_SIZE` | each rank's segment, e.g. `64M` |
//! | `AM_SYMMETRIC_SIZE` | the symmetric heap: the last bytes of segment 0, which grows by it ([`am_core::symmetric`]) |
//! | `AM_RANK`, `AM_SIZE`, `AM_JOB_ID`, `AM_PMI_FD` | set by `amrun` (the other launchers' own are read too: [`am_bootstrap`]) |
//!
//! Each transport's own (`SCI_*`, `EXTOLL_*`, `PORTALS_*`, `AM_UDP_*`, `AM_COORD`,
//! `AM_PEER_TIMEOUT_MS`, `AM_OFI_*`) are listed in its crate docs.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use std::fmt;
use std::str::FromStr;

pub use am_bootstrap::EndpointLayout;
pub use am_bootstrap::{Connect, ConnectError, ConnectErrorKind};
pub use am_core::*;
// Inlined, so `cargo doc -p amnet` documents them under this crate (with `--no-deps` too).
#[doc(inline)]
pub use am_bootstrap;
#[doc(inline)]
pub use am_core;
#[doc(inline)]
pub use am_launch;
#[doc(inline)]
pub use am_msg;
#[doc(inline)]
pub use extoll_sim;
#[doc(inline)]
pub use portals_sim;
#[doc(inline)]
pub use sci_sim;
/// The libfabric transport (built with the `ofi` feature).
#[cfg(feature = "ofi")]
#[doc(inline)]
pub use transport_ofi;
#[doc(inline)]
pub use transport_udp;

/// The transports, by the names used everywhere (`--transport`, `amrun --transport`,
/// `AM_TRANSPORT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransportKind {
    /// Ranks as threads of one process ([`Loopback`]).
    Loopback,
    /// SCI-style shared-segment NIC over shared memory between processes ([`sci_sim::Sci`]).
    Sci,
    /// EXTOLL VELO mailbox and RMA engine over shared memory ([`extoll_sim::Extoll`]).
    Extoll,
    /// Portals NI (portal table, match lists, event queues) over shared memory
    /// ([`portals_sim::Portals`]).
    Portals,
    /// Reliable, authenticated UDP across hosts ([`transport_udp::Udp`]).
    Udp,
    /// libfabric (OFI): InfiniBand, Slingshot, EFA, Omni-Path, or its tcp and shm providers
    /// (`transport_ofi::Ofi`; built with the `ofi` feature, see [`TransportKind::is_available`]).
    Ofi,
}

impl TransportKind {
    /// Every transport, in the order of the README's table.
    pub const ALL: [TransportKind; 6] = [
        TransportKind::Loopback,
        TransportKind::Sci,
        TransportKind::Extoll,
        TransportKind::Portals,
        TransportKind::Udp,
        TransportKind::Ofi,
    ];

    /// The transport's name.
    pub fn name(self) -> &'static str {
        match self {
            TransportKind::Loopback => "loopback",
            TransportKind::Sci => "sci",
            TransportKind::Extoll => "extoll",
            TransportKind::Portals => "portals",
            TransportKind::Udp => "udp",
            TransportKind::Ofi => "ofi",
        }
    }

    /// Whether this build can run it: every transport but `ofi`, which needs the `ofi`
    /// feature (it links libfabric).
    pub fn is_available(self) -> bool {
        match self {
            TransportKind::Loopback
            | TransportKind::Sci
            | TransportKind::Extoll
            | TransportKind::Portals
            | TransportKind::Udp => true,
            TransportKind::Ofi => cfg!(feature = "ofi"),
        }
    }

    /// Whether its ranks are threads of one process (rather than processes).
    pub fn ranks_are_threads(self) -> bool {
        matches!(self, TransportKind::Loopback)
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for TransportKind {
    type Err = JobError;
    fn from_str(s: &str) -> Result<Self, JobError> {
        TransportKind::ALL
            .into_iter()
            .find(|t| t.name() == s)
            .ok_or_else(|| JobError::UnknownTransport(s.to_owned()))
    }
}

/// The enum of transports and a `From` of each (so the table of constructors can make any).
macro_rules! any_transport {
    ($($(#[$meta:meta])* $variant:ident($t:ty),)*) => {
        /// A transport chosen at run time. The core stays generic over [`Transport`]; this
        /// enum is the one place that dispatches by name (crossbeam-channel's flavors).
        #[derive(Debug)]
        #[non_exhaustive]
        // One per rank: boxing the big variants would only add a pointer chase to every send
        // and poll.
        #[allow(clippy::large_enum_variant)]
        pub enum AnyTransport {
            $($(#[$meta])* $variant($t),)*
        }

        $(
            $(#[$meta])*
            impl From<$t> for AnyTransport {
                fn from(t: $t) -> AnyTransport {
                    AnyTransport::$variant(t)
                }
            }
        )*
    };
}

any_transport! {
    /// Ranks as threads.
    Loopback(Loopback),
    /// SCI shared segments.
    Sci(sci_sim::Sci),
    /// EXTOLL VELO/RMA.
    Extoll(extoll_sim::Extoll),
    /// Portals NI.
    Portals(portals_sim::Portals),
    /// Reliable UDP.
    Udp(transport_udp::Udp),
    /// libfabric.
    #[cfg(feature = "ofi")]
    Ofi(transport_ofi::Ofi),
}

macro_rules! dispatch {
    ($self:expr, $t:ident => $e:expr) => {
        match $self {
            AnyTransport::Loopback($t) => $e,
            AnyTransport::Sci($t) => $e,
            AnyTransport::Extoll($t) => $e,
            AnyTransport::Portals($t) => $e,
            AnyTransport::Udp($t) => $e,
            #[cfg(feature = "ofi")]
            AnyTransport::Ofi($t) => $e,
        }
    };
}

impl Tx for AnyTransport {
    am_core::forward_transport!(via dispatch; try_send);
}

impl Transport for AnyTransport {
    am_core::forward_transport!(via dispatch; rank, size, info, segment, poll_recv, wait,
        wake_fd, arm, disarm, flush, stats, rma, registration, close);
}

/// What a job needs to start.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct JobOptions {
    /// The transport. `AM_TRANSPORT` (which `amrun --transport` sets) wins, with or without
    /// a launcher; an unknown name is an error. A transport whose ranks are threads
    /// (loopback) means "threads when the program starts its own job": under a launcher,
    /// where ranks are processes, the job runs on [`launcher_default`] instead.
    pub transport: TransportKind,
    /// Ranks to start when the program starts its own job (ignored under a launcher).
    pub ranks: u32,
    /// Bytes of each rank's segment (`AM_SEGMENT_SIZE` overrides).
    pub segment_size: usize,
    /// When the program starts its own job of processes: whether each output line of rank
    /// r is prefixed with `[r] ` (default true). Turn it off for machine-readable output
    /// (one JSON object per line) that only one rank prints.
    pub prefix_output: bool,
}

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            transport: TransportKind::Loopback,
            ranks: 2,
            segment_size: 1 << 20,
            prefix_output: true,
        }
    }
}

impl JobOptions {
    /// The defaults: loopback, 2 ranks, 1 MiB segments, prefixed output. Set what differs
    /// with the methods below: `JobOptions::new().ranks(4).transport(TransportKind::Sci)`.
    pub fn new() -> JobOptions {
        JobOptions::default()
    }

    /// With this transport.
    #[must_use]
    pub fn transport(mut self, transport: TransportKind) -> JobOptions {
        self.transport = transport;
        self
    }

    /// With this many ranks when the program starts its own job.
    #[must_use]
    pub fn ranks(mut self, ranks: u32) -> JobOptions {
        self.ranks = ranks;
        self
    }

    /// With segments of this many bytes.
    #[must_use]
    pub fn segment_size(mut self, bytes: usize) -> JobOptions {
        self.segment_size = bytes;
        self
    }

    /// Whether each output line of a rank process is prefixed with `[r] `.
    #[must_use]
    pub fn prefix_output(mut self, on: bool) -> JobOptions {
        self.prefix_output = on;
        self
    }
}

/// Why a job could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    /// A transport name that does not exist.
    #[error("unknown transport {0:?}: expected one of loopback, sci, extoll, portals, udp, ofi")]
    UnknownTransport(String),
    /// A transport this build does not have (`ofi` without the `ofi` feature).
    #[error("the {0} transport is not in this build: build with `--features {0}` (it links libfabric: install libfabric-dev or set LIBFABRIC_DIR)")]
    NotBuilt(TransportKind),
    /// Loopback ranks are threads; they cannot be separate processes.
    #[error("AM_TRANSPORT=loopback runs ranks as threads of one process, which a launcher cannot start: unset AM_TRANSPORT for the launcher's default (sci on one host, udp across hosts), choose sci, extoll, portals or udp, or start the program directly with --ranks N")]
    LoopbackUnderLauncher,
    /// A bad configuration variable.
    #[error(transparent)]
    Config(#[from] am_core::config::ConfigError),
    /// The rank could not learn its place in the job.
    #[error(transparent)]
    Bootstrap(#[from] am_launch::BootstrapError),
    /// The ranks could not be started.
    #[error(transparent)]
    Launch(#[from] am_launch::LaunchError),
    /// The ranks do not agree on the job's set-up: their segment sizes differ (found by
    /// the shared-memory NICs as they start; the other transports report it from
    /// `Node::new`, as the same `StartError`).
    #[error(transparent)]
    Start(#[from] am_core::StartError),
    /// The transport could not start: its kind ([`ConnectError::kind`]) and its own error,
    /// kept as the source. (Segment sizes that differ are [`JobError::Start`].)
    #[error(transparent)]
    Connect(ConnectError),
    /// This process could not start a thread to connect an endpoint on.
    #[error("starting a thread to connect an endpoint: {0}")]
    Thread(#[source] std::io::Error),
    /// More endpoints than a job can number (`processes × per_process` must fit a `u32`),
    /// or none.
    #[error("{}", endpoints_message(*processes, *per_process))]
    Endpoints {
        /// Processes in the job.
        processes: u32,
        /// Endpoints asked for in each.
        per_process: u32,
    },
    /// A rank's main function returned an error.
    #[error("rank {rank} failed: {message}")]
    RankFailed {
        /// The rank.
        rank: Rank,
        /// Its error.
        message: String,
    },
}

/// The transport `AM_TRANSPORT` names, if it is set; an unknown name is an error.
pub fn requested_transport() -> Result<Option<TransportKind>, JobError> {
    match std::env::var("AM_TRANSPORT") {
        Ok(name) if !name.is_empty() => name.parse().map(Some),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(name)) => Err(JobError::UnknownTransport(
            name.to_string_lossy().into_owned(),
        )),
    }
}

/// The transport of a launched job whose program asked for threads (loopback) and named no
/// other with `AM_TRANSPORT`: sci when every rank is on this host (amrun and self-launch
/// always; `mpiexec`, Open MPI's `mpirun` and `srun` when their variables say all ranks are
/// local), udp otherwise (it crosses hosts).
pub fn launcher_default(info: &am_launch::JobInfo) -> TransportKind {
    let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let size = u64::from(info.size);
    let one_host = match info.launcher {
        am_launch::LauncherKind::Amrun | am_launch::LauncherKind::Singleton => true,
        am_launch::LauncherKind::Mpiexec => var("MPI_LOCALNRANKS") == Some(size),
        am_launch::LauncherKind::OpenMpi => var("OMPI_COMM_WORLD_LOCAL_SIZE") == Some(size),
        am_launch::LauncherKind::Slurm => {
            var("SLURM_JOB_NUM_NODES").or_else(|| var("SLURM_NNODES")) == Some(1)
        }
        _ => false,
    };
    if one_host {
        TransportKind::Sci
    } else {
        TransportKind::Udp
    }
}

/// Runs `main` as every rank of a job and returns the job's exit code.
///
/// The transport is `AM_TRANSPORT` when set (an unknown name is
/// [`JobError::UnknownTransport`]), else `opts.transport`.
///
/// - Under a launcher (`amrun`, `mpiexec`, `srun`): this process is one rank; `main` runs
///   once. A program that asked for loopback runs on [`launcher_default`] here.
/// - Otherwise, with a transport whose ranks are threads: `main` runs on `opts.ranks` threads.
/// - Otherwise: the program starts `opts.ranks` copies of itself (same arguments) under the
///   built-in launcher and returns the job's exit code.
///
/// What a failing rank gives:
/// - ranks as threads: [`JobError::RankFailed`] naming the rank that failed first, with its
///   error; a panicking rank's panic is re-raised after the others ended;
/// - this process is one rank under a launcher: [`JobError::RankFailed`] for this rank;
/// - the program started its own job of processes: `Ok` with the job's exit code (the first
///   non-zero code of a rank, 128+S for a rank killed by signal S), after the failing rank
///   printed its error; the others were ended.
pub fn run_job<F, E>(opts: &JobOptions, main: F) -> Result<i32, JobError>
where
    F: Fn(AnyTransport) -> Result<(), E> + Sync,
    E: fmt::Display,
{
    run_job_endpoints(opts, 1, |endpoints| {
        let transport = endpoints
            .into_transports()
            .pop()
            .expect("a process of one endpoint has one transport");
        main(transport)
    })
}

/// Runs a job whose processes open `per_process` endpoints each: `main` runs once per
/// process (per rank of [`run_job`]) with all of the process's [`Endpoints`], usually to hand
/// each to a thread of its own (GASNet-EX's `gex_EP_Create`, UCX's worker per thread).
///
/// Each endpoint is a rank of its own in the transport's job: endpoint `e` of process `p` is
/// rank `p × per_process + e` ([`EndpointLayout`]), with its own transport resources (no
/// lock shared with the process's other endpoints), its own credits toward every other
/// endpoint, and a place in every barrier (all endpoints of all processes enter it). A
/// message to endpoint `e` of process `p` is a message to [`EndpointLayout::rank`]`(p, e)`.
///
/// The job is started as [`run_job`] starts it, with the same results and errors; a failing
/// process is named by its process rank.
///
/// ```no_run
/// use amnet::{AmKind, Config, HandlerId, Handlers, JobOptions, Node};
///
/// const HELLO: HandlerId = HandlerId(1);
///
/// fn main() {
///     let code = amnet::run_job_endpoints(&JobOptions::default(), 2, |endpoints| {
///         let layout = endpoints.layout();
///         let process = endpoints.process();
///         std::thread::scope(|s| {
///             let threads: Vec<_> = endpoints
///                 .into_transports()
///                 .into_iter()
///                 .map(|transport| {
///                     s.spawn(move || {
///                         let mut handlers = Handlers::new();
///                         handlers.request(HELLO, "hello", AmKind::Short, |msg, _token| {
///                             println!("hello from endpoint {}", msg.src());
///                         })?;
///                         let mut node = Node::new(transport, handlers, Config::from_env()?)?;
///                         // The same endpoint of the next process.
///                         let ep = layout.endpoint_of(node.rank());
///                         let next = (process + 1) % layout.processes();
///                         node.request_short(layout.rank(next, ep), HELLO, &[])?;
///                         node.barrier()?;
///                         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
///                     })
///                 })
///                 .collect();
///             threads.into_iter().try_for_each(|t| t.join().expect("no panic"))
///         })
///     })
///     .expect("job");
///     std::process::exit(code);
/// }
/// ```
pub fn run_job_endpoints<F, E>(
    opts: &JobOptions,
    per_process: u32,
    main: F,
) -> Result<i32, JobError>
where
    F: Fn(Endpoints) -> Result<(), E> + Sync,
    E: fmt::Display,
{
    // The symmetric heap (`AM_SYMMETRIC_SIZE`, which `Config::from_env` reads) is the last
    // bytes of segment 0: the segments grow by it, so the size asked for stays the program's.
    let segment_size = am_core::config::segment_size_from_env(opts.segment_size)?
        .checked_add(am_core::config::symmetric_size_from_env()?)
        .ok_or_else(|| {
            JobError::Config(am_core::config::ConfigError {
                var: "AM_SYMMETRIC_SIZE",
                value: std::env::var("AM_SYMMETRIC_SIZE").unwrap_or_default(),
                why: "the segment and the heap together overflow".into(),
            })
        })?;
    if am_launch::JobInfo::is_launched() {
        let info = am_launch::JobInfo::from_env()?;
        let layout = layout(info.size, per_process)?;
        // Loopback's ranks are threads of one process: a job of several endpoints is more
        // than one rank, as a job of several processes is.
        let several = layout.ranks() > 1;
        let transport = match &info.transport {
            Some(name) => name.parse()?,
            None if opts.transport.ranks_are_threads() && several => launcher_default(&info),
            None => opts.transport,
        };
        if !transport.is_available() {
            return Err(JobError::NotBuilt(transport));
        }
        if transport.ranks_are_threads() && several {
            return Err(JobError::LoopbackUnderLauncher);
        }
        let process = info.rank;
        let mut infos = am_bootstrap::split_endpoints(info, per_process)?;
        let transports = connect_endpoints(transport, &mut infos, segment_size)?;
        let endpoints = Endpoints {
            layout,
            process,
            transports,
        };
        // The infos (the launcher's store) stay open until `main` is done, as in a job of one
        // endpoint per process.
        let result = main(endpoints);
        drop(infos);
        return match result {
            Ok(()) => Ok(0),
            Err(e) => Err(JobError::RankFailed {
                rank: process,
                message: e.to_string(),
            }),
        };
    }
    let layout = layout(opts.ranks, per_process)?;
    let kind = requested_transport()?.unwrap_or(opts.transport);
    if !kind.is_available() {
        return Err(JobError::NotBuilt(kind));
    }
    if kind.ranks_are_threads() {
        let mut transports = cluster(kind, layout.ranks(), segment_size)?.into_iter();
        // A process that fails ends the job, as a launcher would, so no process waits for it
        // forever; the job reports the first failure in time (the cause, not the aborts it
        // caused).
        let abort = match transports.as_slice().first() {
            Some(AnyTransport::Loopback(t)) => Some(t.abort_handle()),
            _ => None,
        };
        let processes: Vec<Endpoints> = (0..layout.processes())
            .map(|process| Endpoints {
                layout,
                process,
                transports: transports
                    .by_ref()
                    .take(layout.per_process() as usize)
                    .collect(),
            })
            .collect();
        let failures = std::sync::Mutex::new(Vec::new());
        run_ranks(processes, |endpoints| {
            let process = endpoints.process;
            if let Err(e) = main(endpoints) {
                failures
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((process, e.to_string()));
                if let Some(abort) = &abort {
                    abort.abort();
                }
            }
        });
        let failures = failures.into_inner().unwrap_or_else(|p| p.into_inner());
        // The cause is a process that failed on its own. One with an endpoint that had been
        // told, when it left, that an endpoint of another process had left or that the job
        // was aborted may have failed for that; one told nothing cannot have. So those told
        // nothing come first, and of them (or of all, if every one had been told) the one
        // that left first: `main` drops its transports as it returns the error, before the
        // peers that then fail can tell. Departure times alone would name a process whose
        // endpoint finished its work and left before the cause failed. Without departure
        // times, the first one recorded.
        let cause = failures
            .into_iter()
            .enumerate()
            .min_by_key(|(k, (process, _))| {
                let endpoints = || (0..layout.per_process()).map(|e| layout.rank(*process, e));
                let (told, left) = abort.as_ref().map_or((false, None), |a| {
                    let told = endpoints().filter_map(|r| a.told(r)).any(|t| {
                        t.aborted || t.departed.iter().any(|&r| layout.process_of(r) != *process)
                    });
                    (told, endpoints().filter_map(|r| a.departure(r)).min())
                });
                (told, left.unwrap_or(u64::MAX), *k)
            });
        if let Some((_, (rank, message))) = cause {
            return Err(JobError::RankFailed { rank, message });
        }
        return Ok(0);
    }
    Ok(am_launch::self_launcher(opts.ranks)?
        .transport(kind.name())
        .prefix_output(opts.prefix_output)
        .run()?)
}

/// [`JobError::Endpoints`] in the words the user chose: ranks (`--ranks`,
/// `JobOptions::ranks`) unless endpoints were asked for.
fn endpoints_message(processes: u32, per_process: u32) -> String {
    match (processes, per_process) {
        (0, _) => "a job needs at least one rank, and 0 were asked for (--ranks N or \
                   JobOptions::ranks)"
            .to_owned(),
        (_, 0) => "each process needs at least one endpoint, and 0 were asked for".to_owned(),
        _ => format!(
            "{processes} processes of {per_process} endpoints each are more ranks than a job \
             can number (at most {})",
            u32::MAX
        ),
    }
}

fn layout(processes: u32, per_process: u32) -> Result<EndpointLayout, JobError> {
    EndpointLayout::new(processes, per_process).ok_or(JobError::Endpoints {
        processes,
        per_process,
    })
}

/// The endpoints of one process of a job started by [`run_job_endpoints`].
#[derive(Debug)]
pub struct Endpoints {
    layout: EndpointLayout,
    process: u32,
    transports: Vec<AnyTransport>,
}

impl Endpoints {
    /// Where every endpoint of the job is.
    pub fn layout(&self) -> EndpointLayout {
        self.layout
    }

    /// This process's rank among the job's processes.
    pub fn process(&self) -> u32 {
        self.process
    }

    /// This process's endpoints, by index: endpoint `e`'s transport is rank
    /// `layout().rank(process(), e)` of the transports' job.
    pub fn into_transports(self) -> Vec<AnyTransport> {
        self.transports
    }
}

/// Connects the endpoints of this process ([`am_bootstrap::split_endpoints`] gives their
/// infos) to the transport `kind`, each on a thread of its own, since their start-ups fence
/// together (a single endpoint connects on this thread). When one fails to connect (an
/// error, a panic, no thread for it), its share of the store is dropped so that the others'
/// start-ups fail too instead of waiting for it, and the error of the endpoint that failed
/// first is returned (a panic is raised again once all have ended).
pub fn connect_endpoints(
    kind: TransportKind,
    infos: &mut [am_launch::JobInfo],
    segment_size: usize,
) -> Result<Vec<AnyTransport>, JobError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    if let [info] = infos {
        return Ok(vec![connect(kind, info, segment_size)?]);
    }
    /// Drops its endpoint's share of the store unless the endpoint connected: on an error,
    /// an unwinding panic, or a thread that never started (its closure is dropped).
    struct Share<'a> {
        info: &'a mut am_launch::JobInfo,
        connected: bool,
    }
    impl Drop for Share<'_> {
        fn drop(&mut self) {
            if !self.connected {
                self.info.kvs = None;
            }
        }
    }
    // The order in which endpoints failed: the first is the cause, the later ones mostly
    // failed because it left.
    let failures = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let threads: Vec<_> = infos
            .iter_mut()
            .map(|info| {
                let name = format!("amnet-connect-{}", info.rank);
                let mut share = Share {
                    info,
                    connected: false,
                };
                let failures = &failures;
                std::thread::Builder::new()
                    .name(name)
                    .spawn_scoped(s, move || {
                        let connected = connect(kind, share.info, segment_size);
                        share.connected = connected.is_ok();
                        // Numbered before the share goes, so that the cause comes first.
                        let order =
                            failures.fetch_add(usize::from(!share.connected), Ordering::SeqCst);
                        drop(share);
                        connected.map_err(|e| (order, e))
                    })
            })
            .collect();
        let mut transports = Vec::with_capacity(threads.len());
        let mut first: Option<(usize, JobError)> = None;
        let mut panic = None;
        for thread in threads {
            let result = match thread {
                Ok(t) => match t.join() {
                    Ok(r) => r,
                    Err(p) => {
                        panic.get_or_insert(p);
                        continue;
                    }
                },
                Err(e) => Err((0, JobError::Thread(e))),
            };
            match result {
                Ok(t) => transports.push(t),
                Err((order, e)) => {
                    if first.as_ref().is_none_or(|(o, _)| order < *o) {
                        first = Some((order, e));
                    }
                }
            }
        }
        if let Some(p) = panic {
            std::panic::resume_unwind(p);
        }
        match first {
            Some((_, e)) => Err(e),
            None => Ok(transports),
        }
    })
}

impl From<ConnectError> for JobError {
    /// Segment sizes that differ are the core's typed start-up error, as `Node::new` reports
    /// it on the transports that find it there.
    fn from(e: ConnectError) -> JobError {
        match e.kind() {
            ConnectErrorKind::SegmentSizeMismatch { rank, ours, theirs } => {
                JobError::Start(am_core::StartError::SegmentSizeMismatch { rank, ours, theirs })
            }
            _ => JobError::Connect(e),
        }
    }
}

/// How the facade makes a transport of one kind: one rank of a launched job, or every rank of
/// a job in this process. Every kind but loopback (whose ranks are threads, so a launcher
/// cannot start them) is its [`Connect`] implementation.
#[derive(Clone, Copy)]
struct Constructors {
    connect: fn(&mut am_launch::JobInfo, usize) -> Result<AnyTransport, JobError>,
    cluster: fn(u32, usize) -> Result<Vec<AnyTransport>, JobError>,
}

impl Constructors {
    /// Those of a transport that connects as every transport does.
    fn of<T: Connect + Into<AnyTransport>>() -> Constructors {
        Constructors {
            connect: |info, segment_size| {
                let config = T::config_from_env(info.size)?;
                Ok(T::connect(info, segment_size, config)?.into())
            },
            cluster: |ranks, segment_size| {
                let config = T::config_from_env(ranks)?;
                let transports = T::cluster(ranks, segment_size, config)?;
                Ok(transports.into_iter().map(Into::into).collect())
            },
        }
    }

    /// Loopback's: threads only.
    fn loopback() -> Constructors {
        Constructors {
            connect: |info, segment_size| {
                if info.size > 1 {
                    return Err(JobError::LoopbackUnderLauncher);
                }
                Ok((Self::loopback().cluster)(1, segment_size)?.remove(0))
            },
            cluster: |ranks, segment_size| {
                let config = LoopbackConfig::default().segment_size(segment_size);
                Ok(Loopback::cluster(ranks, config)
                    .into_iter()
                    .map(AnyTransport::Loopback)
                    .collect())
            },
        }
    }

    /// The table of this build's transports.
    fn for_kind(kind: TransportKind) -> Result<Constructors, JobError> {
        Ok(match kind {
            TransportKind::Loopback => Constructors::loopback(),
            TransportKind::Sci => Constructors::of::<sci_sim::Sci>(),
            TransportKind::Extoll => Constructors::of::<extoll_sim::Extoll>(),
            TransportKind::Portals => Constructors::of::<portals_sim::Portals>(),
            TransportKind::Udp => Constructors::of::<transport_udp::Udp>(),
            #[cfg(feature = "ofi")]
            TransportKind::Ofi => Constructors::of::<transport_ofi::Ofi>(),
            #[cfg(not(feature = "ofi"))]
            TransportKind::Ofi => return Err(JobError::NotBuilt(kind)),
        })
    }
}

/// Connects this process's rank of a multi-process job (under `amrun`, `mpiexec`, `srun` or
/// self-launch) to the transport `kind`, configured from the environment ([`Connect`]).
pub fn connect(
    kind: TransportKind,
    info: &mut am_launch::JobInfo,
    segment_size: usize,
) -> Result<AnyTransport, JobError> {
    (Constructors::for_kind(kind)?.connect)(info, segment_size)
}

/// The transports of an in-process job of `ranks` ranks on `kind`, one per rank; run each on
/// its own thread (see [`run_ranks`]). For tests and benchmarks: the shared-memory and UDP
/// transports use their real segments and sockets, only the processes are threads.
pub fn cluster(
    kind: TransportKind,
    ranks: u32,
    segment_size: usize,
) -> Result<Vec<AnyTransport>, JobError> {
    (Constructors::for_kind(kind)?.cluster)(ranks, segment_size)
}

/// The README's examples, compiled and run as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;

    /// Catches: a transport's start-up error flattened into a string (its type and cause lost),
    /// a kind that does not say what failed, and a segment-size mismatch reported as anything
    /// but the core's typed start-up error.
    #[test]
    fn start_up_errors_keep_their_source_and_kind() {
        use std::error::Error as _;
        let e = <sci_sim::Sci as Connect>::cluster(0, 4096, sci_sim::SciConfig::default())
            .expect_err("a job of no ranks");
        assert_eq!((e.transport(), e.kind()), ("sci", ConnectErrorKind::Config));
        let job = JobError::from(e);
        assert!(job.to_string().starts_with("sci transport: "), "{job}");
        let source = job.source().expect("the NIC's own error");
        assert!(
            source.downcast_ref::<am_nic::SetupError>().is_some(),
            "{source:?}"
        );
        let mismatch = am_nic::SetupError::SegmentSizeMismatch {
            rank: 3,
            ours: 4096,
            theirs: 8192,
        };
        let job = JobError::from(mismatch.into_connect_error("extoll"));
        assert!(
            matches!(
                job,
                JobError::Start(am_core::StartError::SegmentSizeMismatch {
                    rank: 3,
                    ours: 4096,
                    theirs: 8192
                })
            ),
            "{job:?}"
        );
    }

    #[test]
    fn transport_names_round_trip() {
        for t in TransportKind::ALL {
            assert_eq!(t.name().parse::<TransportKind>().unwrap(), t);
        }
        assert!(matches!(
            "infiniband".parse::<TransportKind>(),
            Err(JobError::UnknownTransport(_))
        ));
        let names: Vec<_> = TransportKind::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(names, am_launch::TRANSPORTS, "one list of names everywhere");
    }

    /// Loopback's ranks are threads, so this runs in the test's process: each process's
    /// endpoints are numbered within it, and a failing process is named by its process rank.
    #[test]
    fn endpoints_are_numbered_by_process() {
        let opts = JobOptions::new()
            .ranks(3)
            .transport(TransportKind::Loopback);
        let seen = std::sync::Mutex::new(Vec::new());
        let result = run_job_endpoints(&opts, 2, |endpoints| {
            let layout = endpoints.layout();
            let process = endpoints.process();
            let ranks: Vec<Rank> = endpoints
                .into_transports()
                .iter()
                .map(|t| t.rank())
                .collect();
            assert_eq!((layout.processes(), layout.per_process()), (3, 2));
            assert_eq!(ranks, [layout.rank(process, 0), layout.rank(process, 1)]);
            seen.lock().unwrap().push(process);
            if process == 2 {
                return Err("process 2 fails");
            }
            Ok(())
        });
        match result {
            Err(JobError::RankFailed { rank: 2, message }) => {
                assert_eq!(message, "process 2 fails")
            }
            other => panic!("{other:?}"),
        }
        let mut seen = seen.into_inner().unwrap();
        seen.sort();
        assert_eq!(seen, [0, 1, 2]);
    }

    #[test]
    fn no_endpoints_is_not_a_job() {
        let opts = JobOptions::new().transport(TransportKind::Loopback);
        let result = run_job_endpoints(&opts, 0, |_| Ok::<(), String>(()));
        assert!(
            matches!(
                result,
                Err(JobError::Endpoints {
                    processes: 2,
                    per_process: 0
                })
            ),
            "{result:?}"
        );
    }
}
