//! The transport: an RDM endpoint per rank.

use std::collections::VecDeque;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::time::{Duration, Instant};

use am_bootstrap::JobInfo;
use am_core::atomic::{Atomic, Batch, Code, Posted, WordType, CODES, WORD_TYPES};
use am_core::rma::Regions;
use am_core::transport::{
    NicInfo, OwnRange, Registration as SegmentChange, Remote, Rma, RmaDone, Sink, Source,
};
use am_core::{
    Armed, Delivery, Limits, NicError, Outgoing, Payload, Rank, Received, Route, SendError,
    Transport, TransportError, Tx,
};
use am_ofi::{
    Endpoint, EndpointConfig, Event, Interface, Issued, OfiError, Op, Region, Registration,
};
use am_shm::Segment;
use nix::unistd::Pid;

use crate::config::OfiConfig;
use crate::error::OfiTransportError;

/// The header every message carries: version, kind, two reserved bytes, the sender's rank.
const HEADER: usize = 8;
/// The header's version byte. A peer that writes another is misbehaving.
const VERSION: u8 = 1;
/// An AM: the core's head and payload follow.
const KIND_AM: u8 = 1;
/// An AM Long whose payload is already in this rank's segment: the head follows.
const KIND_PLACED: u8 = 2;
/// The sender is leaving the job: nothing follows, and nothing comes after it.
const KIND_GOODBYE: u8 = 3;

/// How often, at most, the processes of peers on this host are checked while nothing
/// arrives.
const LIVENESS_EVERY: Duration = Duration::from_millis(100);
/// The longest an armed rank sleeps before it checks its peers.
const ARMED_FOR: Duration = Duration::from_millis(100);
/// Error codes of a failed send that say its connection went away (`ECONNRESET`, `EPIPE`,
/// `ENOTCONN`, `ECONNREFUSED`, `ECONNABORTED`): a peer's death, usually.
const CONNECTION_LOST: [i32; 5] = [104, 32, 107, 111, 103];
/// How long such a failure waits for the liveness check to name the peer that died before
/// it is reported as the provider's.
const SUSPECT_FOR: Duration = Duration::from_secs(1);
/// How often, at most, the liveness check runs meanwhile.
const SUSPECT_CHECK_EVERY: Duration = Duration::from_millis(1);
/// How long a closing rank waits for its goodbyes to leave.
const LINGER: Duration = Duration::from_secs(2);
/// Staging buffers for RMA and atomics, and their size: a put of up to this many times the
/// size is in flight at once.
const STAGE_SLOTS: usize = 16;
const STAGE_SIZE: usize = 64 << 10;
/// Send buffers for messages above the inject size.
const SEND_SLOTS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PeerState {
    Alive,
    Lost,
    Departed,
}

#[derive(Debug)]
struct Peer {
    region: Region,
    /// The peer's process, when it runs on this host (its liveness can be checked).
    pid: Option<Pid>,
    state: PeerState,
    /// Its goodbye has been read from the completion queue, not yet handed to the core:
    /// its process may be gone already, and it is not lost for that.
    leaving: bool,
    /// Its region under the `shm` provider, a file in `/dev/shm`, when it runs on this host:
    /// removed once its process is found gone. A process that ends cleanly (or by a panic,
    /// or `exit`) removes its own, one killed by a signal cannot, and a launcher that does
    /// not clean up after its jobs (`mpiexec`) would leave it behind.
    shm_file: Option<String>,
}

/// The sending half, also lent to handlers.
struct Io {
    ep: Endpoint,
    provider: String,
    rank: Rank,
    size: u32,
    peers: Vec<Peer>,
    /// This rank's segment (another handle), for Longs to itself.
    own: Segment,
    /// Messages to itself: whether the payload is placed, and the bytes.
    self_queue: VecDeque<(bool, Vec<u8>)>,
    /// Receive-side events not yet handed to the core.
    events: VecDeque<Event>,
    /// RMA and atomic operations completed (or failed) and not yet collected.
    done: Vec<(Op, Result<(), OfiError>)>,
    /// What the next poll reports: lost peers, device failures.
    news: VecDeque<NicError>,
    scratch: VecDeque<Event>,
    peer_timeout: Duration,
    last_liveness: Instant,
    /// A send that failed as a dead peer's would, with no peer found gone yet, and since
    /// when.
    suspect: Option<(Instant, OfiError)>,
    /// RMA and atomic operations whose waiter gave up (a lost target, an error before
    /// them): their buffers are freed when their completions come.
    orphans: Vec<Op>,
    /// Peers whose goodbye was read and not yet reported.
    departures: VecDeque<Rank>,
}

/// A rank's endpoint on a libfabric provider. See the [crate docs](crate).
pub struct Ofi {
    io: Io,
    segment: Segment,
    /// Created segments registered for peers' RMA ([`Transport::registration`]), by id.
    registered: std::collections::HashMap<u32, (Registration, Vec<u8>)>,
    /// Operations on peers' registered segments started ([`Ofi::segment_rma_ops`]).
    segment_rma: u64,
    /// Puts made straight from a registration of this rank's ([`Ofi::registration_puts`]).
    registration_puts: u64,
    rx: Vec<u8>,
    limits: Limits,
    native_atomics: bool,
    empty_polls: u32,
    closed: bool,
}

impl std::fmt::Debug for Ofi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ofi")
            .field("rank", &self.io.rank)
            .field("size", &self.io.size)
            .field("provider", &self.io.provider)
            .finish()
    }
}

fn find_interface(config: &OfiConfig) -> Result<Interface, OfiTransportError> {
    Interface::find(config.provider.as_deref())?.ok_or_else(|| {
        let mut found = am_ofi::providers();
        // libfabric itself lists only what FI_PROVIDER names.
        if let Some(v) = std::env::var("FI_PROVIDER").ok().filter(|v| !v.is_empty()) {
            found = format!("{found} (libfabric lists only what FI_PROVIDER={v:?} names: unset it to see them all, or choose with AM_OFI_PROVIDER)");
        }
        OfiTransportError::NoProvider {
            wanted: config.provider.clone(),
            found,
        }
    })
}

/// What one rank tells the others: its address, its segment, its process and host, and its
/// provider (`;` is not allowed in a key-value store's value: written as `+`).
fn entry(name: &[u8], region: Region, provider: &str) -> String {
    let hex: String = name.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{hex}/{:x}/{:x}/{}/{}/{}/{}",
        region.base,
        region.key,
        region.len,
        std::process::id(),
        host_name(),
        provider.replace(';', "+")
    )
}

struct Entry {
    name: Vec<u8>,
    region: Region,
    pid: u32,
    host: String,
    provider: String,
}

fn parse_entry(s: &str) -> Option<Entry> {
    let f: Vec<&str> = s.trim().split('/').collect();
    let [hex, base, key, len, pid, host, provider] = f[..] else {
        return None;
    };
    if hex.is_empty() || hex.len() % 2 != 0 {
        return None;
    }
    let name = (0..hex.len() / 2)
        .map(|i| u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    let region = Region {
        base: u64::from_str_radix(base, 16).ok()?,
        key: u64::from_str_radix(key, 16).ok()?,
        len: len.parse().ok()?,
    };
    // Addresses in the segment are `base + offset`, with `offset < len`.
    region.base.checked_add(region.len)?;
    Some(Entry {
        name,
        region,
        pid: pid.parse().ok()?,
        host: host.to_owned(),
        provider: provider.replace('+', ";"),
    })
}

/// What makes a peer's process id mean a process this rank can check: the host's name, its
/// boot id and this process's pid namespace (two containers of one host may share a name
/// and not their pids). Any part unknown makes the whole unknown, and then no peer's process
/// is checked.
fn host_name() -> String {
    let part = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .map(|h| h.trim().to_owned())
            .filter(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_graphic() && c != '/'))
    };
    let pid_ns = std::fs::read_link("/proc/self/ns/pid")
        .ok()
        .and_then(|l| {
            l.to_str()
                .map(|s| s.replace(|c: char| !c.is_ascii_digit(), ""))
        })
        .filter(|ns| !ns.is_empty());
    match (
        part("/proc/sys/kernel/hostname"),
        part("/proc/sys/kernel/random/boot_id"),
        pid_ns,
    ) {
        (Some(h), Some(b), Some(ns)) => format!("{h}+{b}+{ns}"),
        _ => "unknown".into(),
    }
}

/// The name of rank `rank`'s region under the `shm` provider: the job's prefix, so that a
/// launcher that removes the job's shared-memory files (`amrun`) also removes what a killed
/// rank left; `None` where the job id cannot make a file name.
fn shm_name(job_id: &str, rank: Rank) -> Option<String> {
    am_bootstrap::is_valid_job_id(job_id).then(|| format!("am-{job_id}-ofi-{rank}"))
}

fn open(
    iface: &Interface,
    segment_size: usize,
    config: &OfiConfig,
    ranks: u32,
    shm_name: Option<String>,
) -> Result<(Endpoint, Segment), OfiTransportError> {
    let segment = Segment::heap(0, segment_size).map_err(OfiTransportError::Segment)?;
    // Every request a peer may have in flight to this rank, and a reply to each request
    // this rank may have in flight: what the posted buffers must hold so that none waits in
    // the provider's unexpected queue; capped by the provider's receive queue.
    let budget = config
        .credits
        .receive_budget(ranks)
        .saturating_mul(2)
        .clamp(64, 4096) as usize;
    let recv_slots = budget.min(iface.rx_size().max(64));
    let message = HEADER + am_core::wire::MAX_HEAD_LEN + config.max_medium;
    let ep = Endpoint::open(
        iface,
        segment.share(),
        EndpointConfig {
            recv_slots,
            recv_size: message,
            send_slots: SEND_SLOTS.min(iface.tx_size().max(8)),
            send_size: message,
            stage_slots: STAGE_SLOTS,
            stage_size: STAGE_SIZE,
            wait_fd: true,
            shm_name,
        },
    )?;
    Ok((ep, segment))
}

impl Ofi {
    /// Starts rank `info.rank` of a job: opens an endpoint on the configured provider and
    /// exchanges addresses and segment keys through the launcher's key-value store (a job of
    /// one rank needs none).
    pub fn connect(
        info: &mut JobInfo,
        segment_size: usize,
        config: OfiConfig,
    ) -> Result<Ofi, OfiTransportError> {
        let iface = find_interface(&config)?;
        let name = shm_name(&info.job_id, info.rank);
        let (mut ep, segment) = open(&iface, segment_size, &config, info.size, name)?;
        let provider = iface.provider();
        let me = entry(&ep.name()?, ep.region(), &provider);
        let entries = if info.size == 1 {
            vec![me]
        } else {
            let kvs = info.kvs.as_mut().ok_or_else(|| {
                OfiTransportError::Rendezvous(
                    "a job of several ranks needs a launcher with a key-value store (amrun, mpiexec, srun, mpirun)".into(),
                )
            })?;
            kvs.put(&format!("am-ofi-{}", info.rank), &me)?;
            kvs.fence()?;
            (0..info.size)
                .map(|r| kvs.get(&format!("am-ofi-{r}")))
                .collect::<Result<Vec<_>, _>>()?
        };
        let mut ofi = Ofi::with_entries(info.rank, ep, segment, &entries, &config, &provider)?;
        if provider == "shm" {
            for (r, peer) in ofi.io.peers.iter_mut().enumerate() {
                if peer.pid.is_some() && r as Rank != info.rank {
                    peer.shm_file = shm_name(&info.job_id, r as Rank);
                }
            }
        }
        Ok(ofi)
    }

    /// The transports of an in-process job of `ranks` ranks, one endpoint each, for tests and
    /// benchmarks: real endpoints on the configured provider, only the processes are threads.
    pub fn cluster(
        ranks: u32,
        segment_size: usize,
        config: OfiConfig,
    ) -> Result<Vec<Ofi>, OfiTransportError> {
        let iface = find_interface(&config)?;
        let provider = iface.provider();
        let mut opened = Vec::new();
        let mut entries = Vec::new();
        // Without an id (no randomness to be had), libfabric names the regions by pid.
        let job_id = am_bootstrap::random_job_id().unwrap_or_default();
        for r in 0..ranks {
            let name = shm_name(&job_id, r);
            let (mut ep, segment) = open(&iface, segment_size, &config, ranks, name)?;
            entries.push(entry(&ep.name()?, ep.region(), &provider));
            opened.push((ep, segment));
        }
        opened
            .into_iter()
            .enumerate()
            .map(|(r, (ep, segment))| {
                Ofi::with_entries(r as Rank, ep, segment, &entries, &config, &provider)
            })
            .collect()
    }

    fn with_entries(
        rank: Rank,
        mut ep: Endpoint,
        segment: Segment,
        entries: &[String],
        config: &OfiConfig,
        provider: &str,
    ) -> Result<Ofi, OfiTransportError> {
        let size = entries.len() as u32;
        let ours = segment.byte_area().len();
        let host = host_name();
        let entries = entries
            .iter()
            .enumerate()
            .map(|(r, e)| {
                parse_entry(e).ok_or_else(|| {
                    OfiTransportError::Rendezvous(format!("rank {r}'s entry {e:?} is malformed"))
                })
            })
            .collect::<Result<Vec<Entry>, _>>()?;
        // Segment sizes against rank 0's, in rank order: every rank reports the same rank.
        let first = entries.first().map_or(ours as u64, |e| e.region.len);
        if let Some((r, e)) = entries
            .iter()
            .enumerate()
            .find(|(_, e)| e.region.len != first)
        {
            return Err(OfiTransportError::SegmentSizeMismatch {
                rank: r as Rank,
                ours: first as usize,
                theirs: e.region.len as usize,
            });
        }
        let mut names = Vec::new();
        let mut peers = Vec::new();
        for (r, e) in entries.into_iter().enumerate() {
            if e.provider != provider {
                return Err(OfiTransportError::ProviderMismatch {
                    rank: r as Rank,
                    ours: provider.to_owned(),
                    theirs: e.provider,
                });
            }
            names.push(e.name);
            let pid = i32::try_from(e.pid)
                .ok()
                .filter(|_| e.host == host && host != "unknown");
            peers.push(Peer {
                region: e.region,
                pid: pid.map(Pid::from_raw),
                state: PeerState::Alive,
                leaving: false,
                shm_file: None,
            });
        }
        ep.insert(&names)?;
        // Every operation on every word type by the provider, or none: atomics on one word
        // are atomic with each other only if one agent applies them all.
        let native_atomics = config.provider_atomics
            && CODES.iter().all(|&code| {
                WORD_TYPES.iter().all(|&(width, ty)| {
                    !code.applies_to(ty)
                        || ep.atomic_valid(code as u8, width.bytes(), fi_type(code, ty), true)
                })
            });
        let max_medium = ep
            .max_message()
            .min(HEADER + am_core::wire::MAX_HEAD_LEN + config.max_medium)
            - HEADER
            - am_core::wire::MAX_HEAD_LEN;
        let limits = Limits {
            max_args: am_core::wire::MAX_ARGS,
            max_medium,
            max_long: ours,
            max_credits: config.credits.max_per_peer().min(255),
        };
        Ok(Ofi {
            io: Io {
                provider: provider.to_owned(),
                own: segment.share(),
                ep,
                rank,
                size,
                peers,
                self_queue: VecDeque::new(),
                events: VecDeque::new(),
                done: Vec::new(),
                news: VecDeque::new(),
                scratch: VecDeque::new(),
                peer_timeout: config.peer_timeout,
                last_liveness: Instant::now(),
                suspect: None,
                orphans: Vec::new(),
                departures: VecDeque::new(),
            },
            segment,
            registered: std::collections::HashMap::new(),
            segment_rma: 0,
            registration_puts: 0,
            rx: Vec::new(),
            limits,
            native_atomics,
            empty_polls: 0,
            closed: false,
        })
    }

    /// libfabric's own bandwidth under a put ([`Rma::Put`]): `ops` writes of `bytes` each to
    /// the start of `dest`'s segment, in bytes per second, made exactly as a put makes them
    /// (the same staged, pipelined `fi_write`s with delivery completion) but without copying
    /// the data into the staging buffers. The floor a put is measured against; `dest` must
    /// be polling meanwhile, as for a put.
    pub fn raw_put_bandwidth(
        &mut self,
        dest: Rank,
        bytes: usize,
        ops: usize,
    ) -> Result<f64, SendError> {
        if dest == self.io.rank || dest >= self.io.size {
            return Err(SendError::InvalidRank(dest));
        }
        let t0 = Instant::now();
        for _ in 0..ops {
            self.io.write(dest, 0, None, bytes)?;
        }
        Ok((bytes * ops) as f64 / t0.elapsed().as_secs_f64().max(1e-12))
    }

    /// How many puts, gets and atomics this rank started on peers' created segments by the
    /// RMA of their registrations ([`Remote::Keyed`]), rather than by messages.
    pub fn segment_rma_ops(&self) -> u64 {
        self.segment_rma
    }

    /// How many puts to peers this rank made straight from the registration of one of its
    /// created segments ([`Source::Segment`], to segment 0 or to a peer's registration, on a
    /// segment published, so registered), the provider reading the segment itself, rather
    /// than through a copy into the staging buffers.
    pub fn registration_puts(&self) -> u64 {
        self.registration_puts
    }

    /// The provider in use (`tcp;ofi_rxm`, `shm`, ...).
    pub fn provider(&self) -> &str {
        &self.io.provider
    }

    /// Whether remote atomics are applied by the provider (`fi_fetch_atomic`), rather than
    /// by the core's AM path.
    pub fn native_atomics(&self) -> bool {
        self.native_atomics
    }
}

fn device(e: OfiError) -> NicError {
    NicError::device_from(e.call.clone(), e)
}

impl Io {
    /// Reads the completion queue once: receive events are kept for the core, completed
    /// operations for whoever waits on them.
    fn pump(&mut self) -> Result<(), NicError> {
        let mut got = std::mem::take(&mut self.scratch);
        let polled = self.ep.poll(&mut got);
        for e in got.drain(..) {
            match e {
                Event::Received { slot, len } => {
                    self.note_goodbye(slot, len);
                    self.events.push_back(e);
                }
                Event::Done(op)
                | Event::Failed {
                    what: Issued::Op(op),
                    ..
                } if self.orphans.contains(&op) => {
                    // Its waiter gave up on it: the buffer is free again.
                    self.orphans.retain(|o| *o != op);
                    self.ep.release(op);
                }
                Event::Done(op) => self.done.push((op, Ok(()))),
                Event::Failed { what, error } => match what {
                    Issued::Op(op) => self.done.push((op, Err(error))),
                    Issued::Recv(slot) => {
                        // A receive cancelled or failed: the buffer goes back. A message
                        // longer than the buffer is a peer's, which the provider does not
                        // name (a truncated header is not the sender's word for it); any
                        // other failure is the provider's.
                        if let Err(e) = self.ep.post_recv(slot) {
                            self.news.push_back(device(e));
                        }
                        self.news.push_back(if error.code == am_ofi::FI_ETRUNC {
                            NicError::PeerMisbehaved {
                                peer: None,
                                what: "a message longer than the receive buffers".to_owned(),
                            }
                        } else {
                            device(error)
                        });
                    }
                    Issued::Send(Some(dest)) if dest < self.peers.len() => {
                        // A send to a peer that left or was lost already: reported then.
                        // One whose connection went away: that peer is lost.
                        let p = &self.peers[dest];
                        if p.state == PeerState::Alive && !p.leaving {
                            if CONNECTION_LOST.contains(&error.code) {
                                self.lose(dest as Rank);
                            } else {
                                self.news.push_back(device(error));
                            }
                        }
                    }
                    Issued::Send(_) | Issued::Unknown(_) => {
                        // A send failed whose peer the provider does not say (an inject): a
                        // peer found gone now, or lost or departed before (its loss was
                        // reported then, and sends to it were still queued), explains it;
                        // otherwise it is the provider's failure.
                        let explained = self.check_peers() || self.any_gone();
                        if !explained {
                            if CONNECTION_LOST.contains(&error.code) {
                                // A dying process's sockets close before the kernel shows
                                // it dead: give the liveness check a moment to find it.
                                self.suspect.get_or_insert((Instant::now(), error));
                            } else {
                                self.news.push_back(device(error));
                            }
                        }
                    }
                },
            }
        }
        self.scratch = got;
        if let Some((since, _)) = &self.suspect {
            let late = since.elapsed() >= SUSPECT_FOR;
            if late || self.last_liveness.elapsed() >= SUSPECT_CHECK_EVERY {
                if self.check_peers() || self.any_gone() {
                    self.suspect = None;
                } else if late {
                    if let Some((_, error)) = self.suspect.take() {
                        self.news.push_back(device(error));
                    }
                }
            }
        }
        polled.map(drop).map_err(device)
    }

    /// Checks the processes of the peers on this host; true if one was found gone (and
    /// reported).
    fn check_peers(&mut self) -> bool {
        self.last_liveness = Instant::now();
        let mut found = false;
        for (r, p) in self.peers.iter_mut().enumerate() {
            if p.state == PeerState::Alive
                && !p.leaving
                && r as Rank != self.rank
                && p.pid.is_some_and(|pid| !am_bootstrap::process_alive(pid))
            {
                p.state = PeerState::Lost;
                self.news.push_back(NicError::PeerLost(r as Rank));
                found = true;
                if let Some(file) = p.shm_file.take() {
                    // Gone already if the peer removed it itself, or another peer did.
                    let _ = std::fs::remove_file(Path::new("/dev/shm").join(file));
                }
            }
        }
        found
    }

    /// Marks `peer` lost and reports it, once.
    fn lose(&mut self, peer: Rank) {
        if let Some(p) = self.peers.get_mut(peer as usize) {
            if p.state == PeerState::Alive {
                p.state = PeerState::Lost;
                self.news.push_back(NicError::PeerLost(peer));
            }
        }
    }

    /// Whether a peer is lost, departed or leaving: what explains a failed send whose peer
    /// the provider does not say.
    fn any_gone(&self) -> bool {
        self.peers
            .iter()
            .any(|p| p.state != PeerState::Alive || p.leaving)
    }

    /// A received message that is a peer's goodbye marks that peer as leaving at once, so
    /// that a liveness check that finds its process gone does not take it for lost; it
    /// departs when the goodbye's turn comes, after the messages before it.
    fn note_goodbye(&mut self, slot: usize, len: usize) {
        if len != HEADER {
            return;
        }
        let Some(b) = self.ep.received(slot, len) else {
            return;
        };
        if b[0] != VERSION || b[1] != KIND_GOODBYE || b[2..4] != [0, 0] {
            return;
        }
        let src = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        if src == self.rank {
            return;
        }
        if let Some(p) = self.peers.get_mut(src as usize) {
            p.leaving = true;
        }
    }

    fn usable(&self, dest: Rank) -> Result<&Peer, SendError> {
        let peer = self
            .peers
            .get(dest as usize)
            .ok_or(SendError::InvalidRank(dest))?;
        match peer.state {
            PeerState::Alive => Ok(peer),
            PeerState::Lost => Err(SendError::PeerLost(dest)),
            PeerState::Departed => Err(SendError::PeerDeparted(dest)),
        }
    }

    /// Waits for `op` (an RMA or atomic toward `dest`) to complete and frees its staging
    /// buffer.
    fn wait_op(&mut self, op: Op, dest: Rank) -> Result<(), SendError> {
        self.wait_op_keep(op, dest)?;
        self.ep.release(op);
        Ok(())
    }

    /// What an RMA or atomic toward `dest` that completed with error `e` is. Access refused
    /// means the address or key `dest` published at start-up is not what it registered: its
    /// misbehaviour. Cancelled means the provider ended the connection under it (`tcp` does
    /// when the target refuses an access): that peer is lost.
    fn op_failed(&mut self, dest: Rank, e: OfiError) -> SendError {
        self.check_peers();
        if e.code == am_ofi::FI_EACCES && self.peers[dest as usize].state == PeerState::Alive {
            return NicError::PeerMisbehaved {
                peer: Some(dest),
                what: format!(
                    "its segment refused an access with the address and key it published ({e})"
                ),
            };
        }
        if CONNECTION_LOST.contains(&e.code) || e.code == am_ofi::FI_ECANCELED {
            self.lose(dest);
        }
        match self.peers[dest as usize].state {
            PeerState::Lost => SendError::PeerLost(dest),
            PeerState::Departed => SendError::PeerDeparted(dest),
            PeerState::Alive => device(e),
        }
    }

    /// Starts an operation, reading completions while the staging buffers are all in use.
    fn start(
        &mut self,
        dest: Rank,
        mut issue: impl FnMut(&mut Endpoint) -> Result<Option<Op>, OfiError>,
        in_flight: &mut VecDeque<Op>,
    ) -> Result<Op, SendError> {
        let start = Instant::now();
        loop {
            if let Some(op) = issue(&mut self.ep).map_err(device)? {
                return Ok(op);
            }
            match in_flight.pop_front() {
                Some(first) => self.wait_op(first, dest)?,
                None => {
                    self.pump()?;
                    self.usable(dest)?;
                    // Every buffer held by operations given up on, whose completions do
                    // not come.
                    if start.elapsed() >= self.peer_timeout {
                        return Err(NicError::device(
                            "no RMA buffer came free within the peer timeout",
                        ));
                    }
                }
            }
        }
    }

    /// Writes `payload` at `offset` of `dest`'s segment, in staged pieces, and waits until
    /// all of it is there. `None`: `total` bytes of whatever the staging buffers hold (the
    /// floor under a put: the same writes without the copy into them).
    fn write(
        &mut self,
        dest: Rank,
        offset: usize,
        payload: Option<Payload<'_>>,
        total: usize,
    ) -> Result<(), SendError> {
        let region = self.usable(dest)?.region;
        self.write_in(dest, region, offset, payload, total)
    }

    /// [`Io::write`] into `region` of `dest` (its segment 0, or a registered segment).
    fn write_in(
        &mut self,
        dest: Rank,
        region: Region,
        offset: usize,
        payload: Option<Payload<'_>>,
        total: usize,
    ) -> Result<(), SendError> {
        self.usable(dest)?;
        if offset
            .checked_add(total)
            .is_none_or(|end| end as u64 > region.len)
        {
            return Err(SendError::TooLarge(total));
        }
        self.issue_then_wait(dest, |io, in_flight| {
            io.issue_chunks(dest, region, offset, payload, total, in_flight)
        })
    }

    /// Writes `total` bytes at `local` of this rank's segment to `offset` of `peer`'s,
    /// straight from the registered segment, in pieces of the provider's largest message,
    /// all in flight together, and waits until all are done. `local..local + total` is
    /// inside this rank's segment (checked by the caller).
    fn write_from_segment(
        &mut self,
        peer: Rank,
        offset: usize,
        local: usize,
        total: usize,
    ) -> Result<(), SendError> {
        let region = self.usable(peer)?.region;
        self.write_straight(peer, region, offset, total, |ep, at, n, raddr, key| {
            ep.write_from_segment(peer as usize, local + at, n, raddr, key, true)
        })
    }

    /// Writes `total` bytes at `local` of registration `from` (counted from its first byte,
    /// in range: [`Endpoint::registered_offset`]) to `offset` of `region` of `peer`,
    /// straight from the registration, as [`Io::write_from_segment`].
    fn write_from_registration(
        &mut self,
        peer: Rank,
        region: Region,
        offset: usize,
        from: &Registration,
        local: usize,
        total: usize,
    ) -> Result<(), SendError> {
        self.write_straight(peer, region, offset, total, |ep, at, n, raddr, key| {
            ep.write_from_registration(from, local + at, n, peer as usize, raddr, key, true)
        })
    }

    /// Writes `total` bytes to `offset` of `region` of `peer` (its segment 0, or a
    /// registered segment) in pieces of the provider's largest message, which `issue`
    /// (given the piece's start in the whole, its length, and the remote address and key)
    /// puts in flight from registered memory; all in flight together, then waited for.
    fn write_straight(
        &mut self,
        peer: Rank,
        Region { base, key, len }: Region,
        offset: usize,
        total: usize,
        issue: impl Fn(&mut Endpoint, usize, usize, u64, u64) -> Result<Option<Op>, OfiError>,
    ) -> Result<(), SendError> {
        self.usable(peer)?;
        if offset.checked_add(total).is_none_or(|end| end as u64 > len) {
            return Err(SendError::TooLarge(total));
        }
        self.issue_then_wait(peer, |io, in_flight| {
            let chunk = io.ep.max_segment_transfer().max(1);
            let mut at = 0;
            while at < total {
                let n = chunk.min(total - at);
                let raddr = base + (offset + at) as u64;
                let op = io.start(peer, |ep| issue(ep, at, n, raddr, key), in_flight)?;
                in_flight.push_back(op);
                at += n;
            }
            Ok(())
        })
    }

    /// Runs `issue`, which puts writes to `dest` in flight, then waits for all of them; those
    /// not waited for after an error stay the provider's until their completions.
    fn issue_then_wait(
        &mut self,
        dest: Rank,
        issue: impl FnOnce(&mut Io, &mut VecDeque<Op>) -> Result<(), SendError>,
    ) -> Result<(), SendError> {
        let mut in_flight = VecDeque::new();
        let r = issue(self, &mut in_flight).and_then(|()| {
            while let Some(op) = in_flight.pop_front() {
                self.wait_op(op, dest)?;
            }
            Ok(())
        });
        self.orphans.extend(in_flight);
        r
    }

    /// Issues the writes of `total` bytes of `payload` at `offset` of `dest`'s region (checked
    /// by the caller), in chunks of the provider's largest transfer, adding them to
    /// `in_flight` (waiting for the oldest there while the staging buffers are all lent).
    fn issue_chunks(
        &mut self,
        dest: Rank,
        Region { base, key, .. }: Region,
        offset: usize,
        payload: Option<Payload<'_>>,
        total: usize,
        in_flight: &mut VecDeque<Op>,
    ) -> Result<(), SendError> {
        let chunk = self.ep.max_transfer();
        let mut at = 0;
        while at < total {
            let n = chunk.min(total - at);
            let raddr = base + (offset + at) as u64;
            let op = self.start(
                dest,
                |ep| {
                    ep.write(dest as usize, raddr, key, n, true, |buf| match payload {
                        Some(Payload::Private(b)) => buf.copy_from_slice(&b[at..at + n]),
                        Some(Payload::Shared(s)) => {
                            // In bounds: `at + n <= s.len()`.
                            let _ = s.read(at, buf);
                        }
                        None => {}
                    })
                },
                in_flight,
            )?;
            in_flight.push_back(op);
            at += n;
        }
        Ok(())
    }

    /// The regions of a strided or indexed put ([`Remote::Regions`]): every region's
    /// writes in flight together (as many as the staging buffers hold), then waited for once,
    /// rather than one round trip per region.
    fn write_regions(
        &mut self,
        dest: Rank,
        regions: Regions<'_>,
        data: &[u8],
    ) -> Result<(), SendError> {
        let region = self.usable(dest)?.region;
        match regions.span() {
            Some((_, end)) if end as u64 <= region.len => {}
            _ => return Err(SendError::TooLarge(data.len())),
        }
        self.issue_then_wait(dest, |io, in_flight| {
            for (offset, bytes) in regions.pieces(data)? {
                let len = bytes.len();
                let bytes = Some(Payload::Private(bytes));
                io.issue_chunks(dest, region, offset, bytes, len, in_flight)?;
            }
            Ok(())
        })
    }

    fn read(&mut self, src: Rank, offset: usize, dst: &mut [u8]) -> Result<(), SendError> {
        let region = self.usable(src)?.region;
        self.read_in(src, region, offset, dst)
    }

    /// [`Io::read`] from `region` of `src` (its segment 0, or a registered segment).
    fn read_in(
        &mut self,
        src: Rank,
        region: Region,
        offset: usize,
        dst: &mut [u8],
    ) -> Result<(), SendError> {
        let total = dst.len();
        self.read_with_in(src, region, offset, total, |at, data| {
            dst[at..at + data.len()].copy_from_slice(data);
            Ok(())
        })
    }

    /// Reads `total` bytes at `offset` of `src`'s segment in staged pieces, handing each to
    /// `land` (at its position in the whole) as it completes.
    fn read_with(
        &mut self,
        src: Rank,
        offset: usize,
        total: usize,
        land: impl FnMut(usize, &[u8]) -> Result<(), SendError>,
    ) -> Result<(), SendError> {
        let region = self.usable(src)?.region;
        self.read_with_in(src, region, offset, total, land)
    }

    /// [`Io::read_with`] from `region` of `src`.
    fn read_with_in(
        &mut self,
        src: Rank,
        Region { base, key, len }: Region,
        offset: usize,
        total: usize,
        mut land: impl FnMut(usize, &[u8]) -> Result<(), SendError>,
    ) -> Result<(), SendError> {
        self.usable(src)?;
        if offset.checked_add(total).is_none_or(|end| end as u64 > len) {
            return Err(SendError::TooLarge(total));
        }
        let chunk = self.ep.max_transfer();
        let mut at = 0;
        while at < total {
            let n = chunk.min(total - at);
            let raddr = base + (offset + at) as u64;
            let mut none = VecDeque::new();
            let op = self.start(src, |ep| ep.read(src as usize, raddr, key, n), &mut none)?;
            self.wait_op_keep(op, src)?;
            let Some(data) = self.ep.staged(op, n) else {
                self.ep.release(op);
                return Err(NicError::device("a completed read's buffer is not ours"));
            };
            let landed = land(at, data);
            self.ep.release(op);
            landed?;
            at += n;
        }
        Ok(())
    }

    /// Waits for `op` (an RMA or atomic toward `dest`) to complete, reading the completion
    /// queue meanwhile; a target lost meanwhile, or silent for the peer timeout, fails it. On
    /// success the staging buffer is left to the caller (a read's data, an atomic's old
    /// value), who releases it.
    fn wait_op_keep(&mut self, op: Op, dest: Rank) -> Result<(), SendError> {
        let start = Instant::now();
        let mut spins = 0u32;
        loop {
            if let Some(i) = self.done.iter().position(|(o, _)| *o == op) {
                let (_, r) = self.done.swap_remove(i);
                if r.is_err() {
                    self.ep.release(op);
                }
                return r.map_err(|e| self.op_failed(dest, e));
            }
            self.pump()?;
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(1024) {
                if self.last_liveness.elapsed() >= LIVENESS_EVERY {
                    self.check_peers();
                }
                let lost = self.peers[dest as usize].state == PeerState::Lost;
                if lost || start.elapsed() >= self.peer_timeout {
                    self.lose(dest);
                    // Still the provider's: freed when its completion comes, if ever.
                    self.orphans.push(op);
                    return Err(SendError::PeerLost(dest));
                }
                std::thread::yield_now();
            }
        }
    }

    fn send_message(
        &mut self,
        dest: Rank,
        kind: u8,
        head: &[u8],
        payload: Payload<'_>,
    ) -> Result<(), SendError> {
        let len = HEADER + head.len() + payload.len();
        if len > self.ep.max_message() {
            return Err(SendError::TooLarge(len));
        }
        let rank = self.rank;
        let fill = |buf: &mut [u8]| {
            buf[..4].copy_from_slice(&[VERSION, kind, 0, 0]);
            buf[4..8].copy_from_slice(&rank.to_le_bytes());
            buf[HEADER..HEADER + head.len()].copy_from_slice(head);
            let rest = &mut buf[HEADER + head.len()..];
            match payload {
                Payload::Private(b) => rest.copy_from_slice(b),
                Payload::Shared(s) => {
                    // In bounds: `rest` is exactly `s.len()` long.
                    let _ = s.read(0, rest);
                }
            }
        };
        // A goodbye is the last message to its peer: tracked, so that its completion says
        // everything before it has left.
        let sent = if kind == KIND_GOODBYE {
            self.ep.send_tracked(dest as usize, len, fill)
        } else {
            self.ep.send(dest as usize, len, fill)
        }
        .map_err(device)?;
        if sent {
            Ok(())
        } else {
            // Manual progress: what frees the queue is reading completions.
            self.pump()?;
            Err(SendError::Busy)
        }
    }
}

impl Io {
    /// The region of `dest`'s segment an `atomic` at `offset` goes to, checked: the peer
    /// usable and the word inside its segment.
    fn atomic_region(
        &self,
        dest: Rank,
        offset: usize,
        atomic: Atomic,
    ) -> Result<Region, SendError> {
        let region = self.usable(dest)?.region;
        self.atomic_in(dest, region, offset, atomic)
    }

    /// [`Io::atomic_region`] in `region` of `dest` (its segment 0, or a registered segment).
    fn atomic_in(
        &self,
        dest: Rank,
        region: Region,
        offset: usize,
        atomic: Atomic,
    ) -> Result<Region, SendError> {
        self.usable(dest)?;
        if offset
            .checked_add(atomic.width().bytes())
            .is_none_or(|e| e as u64 > region.len)
        {
            return Err(NicError::device(format!(
                "an atomic at {offset} of rank {dest}'s segment, past its end"
            )));
        }
        Ok(region)
    }
}

impl Io {
    /// Runs `op` (operations on `region` of `peer`, which it waits for) with a read of the
    /// region's first `u64` in flight beside it, issued first: `op`'s outcome and that word.
    /// The read completes while `op` waits for its own (every wait reads the completion
    /// queue), so it costs no round trip of its own.
    fn beside_first_word<R>(
        &mut self,
        peer: Rank,
        region: Region,
        op: impl FnOnce(&mut Io) -> Result<R, SendError>,
    ) -> Result<(R, u64), SendError> {
        self.usable(peer)?;
        let mut none = VecDeque::new();
        let read = self.start(
            peer,
            |ep| ep.read(peer as usize, region.base, region.key, 8),
            &mut none,
        )?;
        let r = op(self);
        let word = self.wait_op_keep(read, peer).and_then(|()| {
            let word = self.ep.staged(read, 8).and_then(|b| b.try_into().ok());
            self.ep.release(read);
            word.map(u64::from_ne_bytes)
                .ok_or_else(|| NicError::device("a completed read's buffer is not ours"))
        });
        Ok((r?, word?))
    }

    /// Applies `atomic` at `offset` of `region` (`dest`'s, checked by [`Io::atomic_in`]) and
    /// waits for its old value.
    fn atomic_at(
        &mut self,
        dest: Rank,
        region: Region,
        offset: usize,
        atomic: Atomic,
    ) -> Result<u64, SendError> {
        let mut none = VecDeque::new();
        let op = self.start(
            dest,
            |ep| issue_atomic(ep, dest, region, offset, atomic),
            &mut none,
        )?;
        self.wait_op_keep(op, dest)?;
        let old = self.ep.atomic_result(op, atomic.width().bytes());
        self.ep.release(op);
        old.ok_or_else(|| NicError::device("a completed atomic's buffer is not ours"))
    }
}

/// Bytes of a registered segment's key blob: the address peers name its first byte by, its
/// key and its length, each a little-endian `u64`.
const KEY_BLOB: usize = 24;

/// The key blob peers reach a registered segment by.
fn key_blob(region: Region) -> Vec<u8> {
    let mut b = Vec::with_capacity(KEY_BLOB);
    for v in [region.base, region.key, region.len] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b
}

/// The registration of `src`'s segment among `registered` (this rank's, by id) and where
/// `src` starts in it, if the segment is registered and `src` lies in that registration's
/// memory; `None` otherwise (a segment never published, so never registered).
fn registered_range<'r>(
    ep: &Endpoint,
    registered: &'r std::collections::HashMap<u32, (Registration, Vec<u8>)>,
    src: OwnRange<'_>,
) -> Option<(&'r Registration, usize)> {
    let (from, _) = registered.get(&src.id.get())?;
    let local = ep.registered_offset(from, src.bytes)?;
    Some((from, local))
}

/// The region a peer's key blob names, if it is one [`key_blob`] could have made.
fn region_of_blob(b: &[u8]) -> Option<Region> {
    if b.len() != KEY_BLOB {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or_default());
    let region = Region {
        base: word(0),
        key: word(8),
        len: word(16),
    };
    region.base.checked_add(region.len)?;
    Some(region)
}

impl Ofi {
    /// The region `peer`'s key blob `key` names, with `len` bytes at `offset` inside it: the
    /// peer's word, so a blob of another form, or a range past its length (which the core
    /// checked against the length the peer published), is the peer's misbehavior.
    fn registered_region(
        &self,
        peer: Rank,
        key: &[u8],
        offset: usize,
        len: usize,
    ) -> Result<Region, SendError> {
        if peer == self.io.rank || peer >= self.io.size {
            return Err(SendError::InvalidRank(peer));
        }
        let misbehaved = |what: &str| NicError::PeerMisbehaved {
            peer: Some(peer),
            what: what.to_owned(),
        };
        let region = region_of_blob(key)
            .ok_or_else(|| misbehaved("a segment's key that is not a registration's"))?;
        // The first word is read beside every operation (the core's freed flag).
        if region.len < 8
            || offset
                .checked_add(len)
                .is_none_or(|end| end as u64 > region.len)
        {
            return Err(misbehaved(
                "a segment's key that registers less than the length it published",
            ));
        }
        Ok(region)
    }
}

/// The type (am-ofi's numbering: 0 unsigned, 1 signed, 2 float) the provider applies `code`
/// on a word of type `ty` as: the word's own where it changes what the operation does
/// (signed and float minima and maxima, float sums and products), unsigned otherwise. A
/// float compare-and-swap then compares bits, as [`am_core::AtomicOp::CompareSwap`] says
/// (`FI_CSWAP` on `FI_DOUBLE` compares values: `-0.0` would match `0.0`).
fn fi_type(code: Code, ty: WordType) -> u8 {
    match (code, ty) {
        (Code::Min | Code::Max, WordType::Signed) => 1,
        (Code::Min | Code::Max | Code::FetchAdd | Code::Mul, WordType::Float) => 2,
        _ => 0,
    }
}

/// Issues `atomic` at `offset` of `region` (`dest`'s, checked by [`Io::atomic_region`]) as a
/// fetching atomic: `Ok(None)` while its buffers are all in use.
fn issue_atomic(
    ep: &mut Endpoint,
    dest: Rank,
    region: Region,
    offset: usize,
    atomic: Atomic,
) -> Result<Option<Op>, OfiError> {
    let (operand, current) = atomic.operands();
    ep.atomic(
        dest as usize,
        region.base + offset as u64,
        region.key,
        atomic.code() as u8,
        atomic.width().bytes(),
        fi_type(atomic.code(), atomic.word_type()),
        operand,
        current,
        true,
    )
}

impl Tx for Io {
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        if dest >= self.size {
            return Err(SendError::InvalidRank(dest));
        }
        let long = msg.long_offset.filter(|_| !msg.payload.is_empty());
        if dest == self.rank {
            let mut bytes = msg.head.to_vec();
            if let Some(off) = long {
                let seg = self.own.byte_area();
                if off
                    .checked_add(msg.payload.len())
                    .is_none_or(|e| e > seg.len())
                {
                    return Err(SendError::TooLarge(msg.payload.len()));
                }
                match msg.payload {
                    Payload::Private(b) => seg.write(off, b),
                    Payload::Shared(s) => seg.copy_from(off, s),
                }
                .map_err(|e| NicError::device_from("writing a Long to this rank's segment", e))?;
            } else {
                msg.payload.append_to(&mut bytes);
            }
            self.self_queue.push_back((long.is_some(), bytes));
            return Ok(());
        }
        self.usable(dest)?;
        match long {
            Some(off) => {
                // The payload is in the target's segment before its head leaves.
                self.write(dest, off, Some(msg.payload), msg.payload.len())?;
                // The payload is placed: the head goes now, or the Long is lost.
                let start = Instant::now();
                loop {
                    match self.send_message(dest, KIND_PLACED, msg.head, Payload::EMPTY) {
                        Err(SendError::Busy) if start.elapsed() < self.peer_timeout => {
                            self.usable(dest).map(drop)?
                        }
                        Err(SendError::Busy) => {
                            return Err(NicError::device(
                                "a placed Long's head found no room within the peer timeout",
                            ))
                        }
                        r => return r,
                    }
                }
            }
            None => self.send_message(dest, KIND_AM, msg.head, msg.payload),
        }
    }
}

impl Tx for Ofi {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.io.try_send(dest, msg)
    }
}

impl Transport for Ofi {
    fn rank(&self) -> Rank {
        self.io.rank
    }

    fn size(&self) -> u32 {
        self.io.size
    }

    fn segment(&self) -> am_core::SharedBytes<'_> {
        self.segment.byte_area()
    }

    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, am_core::SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        if let Some(e) = self.io.news.pop_front() {
            return Err(e);
        }
        if let Some((placed, m)) = self.io.self_queue.pop_front() {
            let d = Delivery {
                src: self.io.rank,
                bytes: Received::Private(&m),
                payload_placed: placed,
                route: Route::NONE,
            };
            return Ok(Some(f(d, self.segment.byte_area(), &mut self.io)));
        }
        loop {
            if self.io.events.is_empty() {
                self.io.pump()?;
            }
            let Some(event) = self.io.events.pop_front() else {
                self.empty_polls = self.empty_polls.wrapping_add(1);
                if self.empty_polls.is_multiple_of(256)
                    && self.io.last_liveness.elapsed() >= LIVENESS_EVERY
                {
                    self.io.check_peers();
                }
                if let Some(e) = self.io.news.pop_front() {
                    return Err(e);
                }
                return match self.io.departures.pop_front() {
                    Some(r) => Err(NicError::PeerDeparted(r)),
                    None => Ok(None),
                };
            };
            let Event::Received { slot, len } = event else {
                continue;
            };
            self.rx.clear();
            match self.io.ep.received(slot, len) {
                Some(b) => self.rx.extend_from_slice(b),
                None => {
                    return Err(NicError::device(format!(
                        "a receive of {len} bytes does not fit its buffer"
                    )))
                }
            }
            self.io.ep.post_recv(slot).map_err(device)?;
            let misbehaved = |peer, what: &str| NicError::PeerMisbehaved {
                peer,
                what: what.to_owned(),
            };
            if self.rx.len() < HEADER {
                return Err(misbehaved(None, "a message shorter than its header"));
            }
            let src = u32::from_le_bytes(self.rx[4..8].try_into().expect("4 bytes"));
            if self.rx[0] != VERSION || self.rx[2..4] != [0, 0] {
                // The sender it names, where that is a peer (never this rank).
                return Err(misbehaved(
                    (src < self.io.size && src != self.io.rank).then_some(src),
                    "a message header of another version",
                ));
            }
            if src >= self.io.size || src == self.io.rank {
                return Err(misbehaved(
                    None,
                    "a message naming this rank or a rank outside the job as its sender",
                ));
            }
            if self.io.peers[src as usize].state != PeerState::Alive {
                // Nothing from a lost or departed peer is handled.
                continue;
            }
            let placed = match self.rx[1] {
                KIND_AM => false,
                KIND_PLACED => true,
                // Reported once nothing else waits: what other ranks sent before it left (an
                // EXIT that made it leave) comes first, though no order holds between two
                // senders' messages.
                KIND_GOODBYE if self.rx.len() == HEADER => {
                    self.io.peers[src as usize].state = PeerState::Departed;
                    self.io.departures.push_back(src);
                    continue;
                }
                _ => return Err(misbehaved(Some(src), "a message of an unknown kind")),
            };
            let d = Delivery {
                src,
                bytes: Received::Private(&self.rx[HEADER..]),
                payload_placed: placed,
                route: Route::NONE,
            };
            return Ok(Some(f(d, self.segment.byte_area(), &mut self.io)));
        }
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        match self.arm()? {
            Armed::Ready => {}
            Armed::Sleep(d) => {
                if let Some(fd) = self.io.ep.wait_fd() {
                    let _ = readable(fd, d.min(timeout));
                } else {
                    std::thread::yield_now();
                }
            }
        }
        Ok(())
    }

    fn wake_fd(&mut self) -> Result<Option<BorrowedFd<'_>>, TransportError> {
        Ok(self.io.ep.wait_fd())
    }

    /// Ready while messages, completions or news wait; otherwise `fi_trywait` decides,
    /// and the sleep is bounded so that peers on this host are checked.
    fn arm(&mut self) -> Result<Armed, TransportError> {
        let io = &mut self.io;
        if !io.self_queue.is_empty()
            || !io.events.is_empty()
            || !io.news.is_empty()
            || !io.departures.is_empty()
        {
            return Ok(Armed::Ready);
        }
        io.pump()?;
        if !io.events.is_empty() || !io.news.is_empty() || io.ep.wait_fd().is_none() {
            return Ok(Armed::Ready);
        }
        if io.last_liveness.elapsed() >= LIVENESS_EVERY && io.check_peers() {
            return Ok(Armed::Ready);
        }
        if !io.ep.trywait() {
            return Ok(Armed::Ready);
        }
        Ok(Armed::Sleep(ARMED_FOR))
    }

    /// Named `ofi`. Puts, gets and Long payloads by RMA, atomics where the provider validates
    /// them all; a reply needs no pairing, so one empty reply may answer several requests.
    /// Created segments are registered for peers' RMA.
    #[inline]
    fn info(&self) -> NicInfo {
        let mut info = NicInfo::new("ofi", self.limits);
        let caps = &mut info.capabilities;
        caps.put = true;
        caps.get = true;
        caps.atomics = self.native_atomics;
        caps.long_placed_below = usize::MAX;
        caps.acks_coalesce = true;
        caps.rma_segments = true;
        info
    }

    /// Each shape this transport moves itself takes its own path (staged writes and reads,
    /// writes straight from a registration, the provider's atomics, a batch in flight at
    /// once); the rest (gets into regions or into a created segment's range, keyed puts
    /// from and gets into segment 0, keyed gets into a created segment's range) go by
    /// [`am_core::rma::by_pieces`], through those.
    #[inline]
    fn rma(&mut self, request: Rma<'_>) -> Result<RmaDone, SendError> {
        match request {
            Rma::Put {
                dest,
                to: Remote::At(offset),
                from: Source::Bytes(data),
            } => self
                .put_bytes(dest, offset, data)
                .map(|()| RmaDone::moved()),
            Rma::Get {
                src,
                from: Remote::At(offset),
                into: Sink::Bytes(dst),
            } => self.get_bytes(src, offset, dst).map(|()| RmaDone::moved()),
            Rma::Atomic {
                dest,
                at: Remote::At(offset),
                atomic,
            } => self.atomic(dest, offset, atomic).map(RmaDone::old),
            Rma::Put {
                dest,
                to: Remote::Regions(regions),
                from: Source::Bytes(data),
            } => self
                .put_regions(dest, regions, data)
                .map(|()| RmaDone::moved()),
            Rma::Put {
                dest,
                to: Remote::At(offset),
                from: Source::Own { offset: local, len },
            } => self
                .put_from_segment(dest, offset, local, len)
                .map(|()| RmaDone::moved()),
            Rma::Put {
                dest,
                to: Remote::At(offset),
                from: Source::Segment(src),
            } => self
                .put_from_own(dest, offset, src)
                .map(|()| RmaDone::moved()),
            Rma::Get {
                src,
                from: Remote::At(offset),
                into: Sink::Own { offset: local, len },
            } => self
                .get_into_segment(src, offset, local, len)
                .map(|()| RmaDone::moved()),
            Rma::Put {
                dest,
                to: Remote::Keyed { key, offset },
                from: Source::Bytes(data),
            } => self
                .put_at(dest, key, offset, data)
                .map(|flag| RmaDone::keyed(0, flag)),
            Rma::Put {
                dest,
                to: Remote::Keyed { key, offset },
                from: Source::Segment(src),
            } => self
                .put_at_from_own(dest, key, offset, src)
                .map(|flag| RmaDone::keyed(0, flag)),
            Rma::Get {
                src,
                from: Remote::Keyed { key, offset },
                into: Sink::Bytes(dst),
            } => self
                .get_at(src, key, offset, dst)
                .map(|flag| RmaDone::keyed(0, flag)),
            Rma::Atomic {
                dest,
                at: Remote::Keyed { key, offset },
                atomic,
            } => self
                .atomic_at(dest, key, offset, atomic)
                .map(|(old, flag)| RmaDone::keyed(old, flag)),
            Rma::Atomics { batch, outcome } => {
                *outcome = self.atomics(batch);
                Ok(RmaDone::moved())
            }
            request => am_core::rma::by_pieces(self, request),
        }
    }

    /// Registers all of a created segment (word area, then byte area) with the endpoint, once
    /// per id: the key blob is its address, key and length, each a little-endian `u64`. Or
    /// ends a registration: one the provider refuses to end leaves the memory with the
    /// endpoint for good.
    fn registration(&mut self, change: SegmentChange<'_>) -> Option<Vec<u8>> {
        match change {
            SegmentChange::Register { id, segment } => self.register_segment(id, segment),
            SegmentChange::Deregister { id } => {
                self.deregister_segment(id);
                None
            }
            _ => None,
        }
    }

    fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        let io = &mut self.io;
        let deadline = Instant::now() + LINGER;
        for r in 0..io.size {
            if r == io.rank || io.peers[r as usize].state != PeerState::Alive {
                continue;
            }
            while Instant::now() < deadline {
                match io.send_message(r, KIND_GOODBYE, &[], Payload::EMPTY) {
                    Err(SendError::Busy) => continue,
                    _ => break,
                }
            }
        }
        // Manual progress: what was sent leaves only while completions are read.
        while io.ep.in_flight() > 0 && Instant::now() < deadline {
            if io.pump().is_err() {
                break;
            }
        }
        // The goodbyes' completions cover what was sent before them to each peer still
        // here; a moment more for the provider's own acknowledgements to leave.
        let settle = Instant::now() + Duration::from_millis(20);
        while Instant::now() < settle.min(deadline) {
            if io.pump().is_err() {
                break;
            }
            std::thread::yield_now();
        }
        // Now, not at the drop: a rank that ends with `exit` runs none, and the shm
        // provider's region in /dev/shm goes with the endpoint.
        io.ep.shutdown();
    }
}

/// The shapes of [`Rma`] this transport moves itself ([`Transport::rma`]).
impl Ofi {
    /// A put of the caller's bytes ([`Remote::At`] from [`Source::Bytes`]): to this rank, a
    /// copy into its segment; else staged writes into the peer's.
    fn put_bytes(&mut self, dest: Rank, offset: usize, data: &[u8]) -> Result<(), SendError> {
        if dest == self.io.rank {
            return self
                .segment
                .byte_area()
                .write(offset, data)
                .map_err(|e| NicError::device_from("a put to this rank", e));
        }
        self.io
            .write(dest, offset, Some(Payload::Private(data)), data.len())
    }

    /// A put into regions of segment 0 ([`Remote::Regions`]): every region's writes in
    /// flight together, waited for once.
    fn put_regions(
        &mut self,
        dest: Rank,
        regions: Regions<'_>,
        data: &[u8],
    ) -> Result<(), SendError> {
        if dest == self.io.rank {
            let own = self.segment.byte_area();
            for (offset, bytes) in regions.pieces(data)? {
                own.write(offset, bytes)
                    .map_err(|e| NicError::device_from("a put to this rank", e))?;
            }
            return Ok(());
        }
        self.io.write_regions(dest, regions, data)
    }

    /// A put from this rank's segment 0 ([`Source::Own`]) straight from the registered
    /// segment: no copy into a staging buffer.
    fn put_from_segment(
        &mut self,
        dest: Rank,
        offset: usize,
        local: usize,
        len: usize,
    ) -> Result<(), SendError> {
        let own = self.segment.byte_area();
        let from = own
            .slice(local, len)
            .map_err(|e| NicError::device_from("a put from this rank's segment", e))?;
        if dest != self.io.rank {
            // `from` is in bounds: the provider reads those bytes of the segment.
            return self.io.write_from_segment(dest, offset, local, len);
        }
        own.copy_from(offset, from)
            .map_err(|e| NicError::device_from("a put to this rank", e))
    }

    /// A put from a range of a created segment ([`Source::Segment`]): straight from the
    /// segment's registration where `src` is a range of a created segment registered here
    /// (published, so a peer may reach it): no copy. Otherwise the staging buffers' one copy
    /// from the segment, with no buffer between.
    fn put_from_own(
        &mut self,
        dest: Rank,
        offset: usize,
        src: OwnRange<'_>,
    ) -> Result<(), SendError> {
        if dest == self.io.rank {
            return self
                .segment
                .byte_area()
                .copy_from(offset, src.bytes)
                .map_err(|e| NicError::device_from("a put to this rank", e));
        }
        let region = self.io.usable(dest)?.region;
        let total = src.bytes.len();
        match registered_range(&self.io.ep, &self.registered, src) {
            Some((from, local)) => {
                self.registration_puts += 1;
                self.io
                    .write_from_registration(dest, region, offset, from, local, total)
            }
            None => {
                let payload = Some(Payload::Shared(src.bytes));
                self.io.write_in(dest, region, offset, payload, total)
            }
        }
    }

    /// A get into this rank's segment 0 ([`Sink::Own`]): the reads' staging buffers copied
    /// straight into the segment (one copy, not two): a read straight into the segment that
    /// an error left with the provider would land there after the get returned.
    fn get_into_segment(
        &mut self,
        src: Rank,
        offset: usize,
        local: usize,
        len: usize,
    ) -> Result<(), SendError> {
        let own = self.segment.byte_area();
        if src == self.io.rank {
            let from = own
                .slice(offset, len)
                .map_err(|e| NicError::device_from("a get from this rank", e))?;
            return own
                .copy_from(local, from)
                .map_err(|e| NicError::device_from("a get into this rank's segment", e));
        }
        self.io.usable(src)?;
        self.io.read_with(src, offset, len, |at, data| {
            own.write(local + at, data)
                .map_err(|e| NicError::device_from("a get into this rank's segment", e))
        })
    }

    /// A get into the caller's buffer ([`Remote::At`] into [`Sink::Bytes`]): from this rank,
    /// a copy out of its segment; else staged reads of the peer's.
    fn get_bytes(&mut self, src: Rank, offset: usize, dst: &mut [u8]) -> Result<(), SendError> {
        if src == self.io.rank {
            return self
                .segment
                .byte_area()
                .read(offset, dst)
                .map_err(|e| NicError::device_from("a get from this rank", e));
        }
        self.io.usable(src)?;
        self.io.read(src, offset, dst)
    }

    /// An atomic on a word of segment 0 ([`Rma::Atomic`] at [`Remote::At`]): applied here on
    /// this rank's own, else by the provider, waited for its old value.
    fn atomic(&mut self, dest: Rank, offset: usize, atomic: Atomic) -> Result<u64, SendError> {
        if !self.native_atomics {
            return Err(SendError::Unsupported("atomics"));
        }
        if dest == self.io.rank {
            return atomic.apply_to(dest, self.segment.byte_area(), offset);
        }
        let region = self.io.atomic_region(dest, offset, atomic)?;
        self.io.atomic_at(dest, region, offset, atomic)
    }

    /// Registers all of `seg` (word area, then byte area) with the endpoint; the key blob is
    /// its address, key and length, each a little-endian `u64`. Registered once per id.
    fn register_segment(&mut self, id: u32, seg: &Segment) -> Option<Vec<u8>> {
        if let Some((_, blob)) = self.registered.get(&id) {
            return Some(blob.clone());
        }
        let (registration, region) = self.io.ep.register_segment(seg).ok()?;
        let blob = key_blob(region);
        self.registered.insert(id, (registration, blob.clone()));
        Some(blob)
    }

    /// A deregistration the provider refuses leaves the memory with the endpoint for good
    /// (am-ofi's `Endpoint::deregister`): nothing more to do here.
    fn deregister_segment(&mut self, id: u32) {
        if let Some((registration, _)) = self.registered.remove(&id) {
            let _ = self.io.ep.deregister(registration);
        }
    }

    /// A put of the caller's bytes into a peer's registration ([`Remote::Keyed`] from
    /// [`Source::Bytes`]), the registration's first word read beside it.
    fn put_at(
        &mut self,
        dest: Rank,
        key: &[u8],
        offset: usize,
        data: &[u8],
    ) -> Result<u64, SendError> {
        let region = self.registered_region(dest, key, offset, data.len())?;
        self.segment_rma += 1;
        let payload = Some(Payload::Private(data));
        let total = data.len();
        let (_, word) = self.io.beside_first_word(dest, region, |io| {
            io.write_in(dest, region, offset, payload, total)
        })?;
        Ok(word)
    }

    /// Straight from the registration, as [`Ofi::put_from_own`] (with the staging
    /// buffers' one copy where `src` is not registered here), the freed word read beside.
    fn put_at_from_own(
        &mut self,
        dest: Rank,
        key: &[u8],
        offset: usize,
        src: OwnRange<'_>,
    ) -> Result<u64, SendError> {
        let total = src.bytes.len();
        let region = self.registered_region(dest, key, offset, total)?;
        self.segment_rma += 1;
        let straight = registered_range(&self.io.ep, &self.registered, src);
        if straight.is_some() {
            self.registration_puts += 1;
        }
        let (_, word) = self
            .io
            .beside_first_word(dest, region, |io| match straight {
                Some((from, local)) => {
                    io.write_from_registration(dest, region, offset, from, local, total)
                }
                None => {
                    let payload = Some(Payload::Shared(src.bytes));
                    io.write_in(dest, region, offset, payload, total)
                }
            })?;
        Ok(word)
    }

    /// A get from a peer's registration into the caller's buffer ([`Remote::Keyed`] into
    /// [`Sink::Bytes`]), the registration's first word read beside it.
    fn get_at(
        &mut self,
        src: Rank,
        key: &[u8],
        offset: usize,
        dst: &mut [u8],
    ) -> Result<u64, SendError> {
        let region = self.registered_region(src, key, offset, dst.len())?;
        self.segment_rma += 1;
        let (_, word) = self
            .io
            .beside_first_word(src, region, |io| io.read_in(src, region, offset, dst))?;
        Ok(word)
    }

    /// An atomic on a word of a peer's registration ([`Rma::Atomic`] at [`Remote::Keyed`]):
    /// its old value, and the registration's first word read beside it.
    fn atomic_at(
        &mut self,
        dest: Rank,
        key: &[u8],
        offset: usize,
        atomic: Atomic,
    ) -> Result<(u64, u64), SendError> {
        if !self.native_atomics {
            return Err(SendError::Unsupported("atomics"));
        }
        let region = self.registered_region(dest, key, offset, atomic.width().bytes())?;
        self.segment_rma += 1;
        self.io.beside_first_word(dest, region, |io| {
            io.atomic_at(dest, region, offset, atomic)
        })
    }

    /// A batch of posted atomics ([`Rma::Atomics`]): all of the batch in flight at once (as
    /// many as the atomics' buffers hold), then waited for: one round trip's wait for the
    /// batch, not one per atomic. Those on this rank are applied here. Each is a fetching
    /// atomic whose old value is dropped: a provider may complete a non-fetching `fi_atomic`
    /// once it has left (`shm` does), before the target applied it, while a fetch completes
    /// only with the old value back, so after the batch every atomic is in the target's
    /// memory, as a later get must see.
    fn atomics(&mut self, batch: &[Posted]) -> Batch {
        if !self.native_atomics {
            return Batch {
                done: batch.len(),
                error: Some(SendError::Unsupported("atomics")),
            };
        }
        let mut error = None;
        let mut in_flight: VecDeque<(Op, Rank)> = VecDeque::new();
        let io = &mut self.io;
        let fail = |e: SendError, error: &mut Option<SendError>| {
            error.get_or_insert(e);
        };
        for p in batch {
            if p.dest == io.rank {
                if let Err(e) = p.atomic.apply_to(p.dest, io.own.byte_area(), p.offset) {
                    fail(e, &mut error);
                }
                continue;
            }
            let region = match io.atomic_region(p.dest, p.offset, p.atomic) {
                Ok(region) => region,
                Err(e) => {
                    fail(e, &mut error);
                    continue;
                }
            };
            let dest = p.dest;
            let start = Instant::now();
            loop {
                match issue_atomic(&mut io.ep, dest, region, p.offset, p.atomic) {
                    Ok(Some(op)) => {
                        in_flight.push_back((op, dest));
                        break;
                    }
                    Ok(None) => match in_flight.pop_front() {
                        Some((op, d)) => {
                            if let Err(e) = io.wait_op(op, d) {
                                fail(e, &mut error);
                            }
                        }
                        None => {
                            if let Err(e) = io.pump().and_then(|()| io.usable(dest).map(drop)) {
                                fail(e, &mut error);
                                break;
                            }
                            if start.elapsed() >= io.peer_timeout {
                                fail(
                                    NicError::device(
                                        "no atomics buffer came free within the peer timeout",
                                    ),
                                    &mut error,
                                );
                                break;
                            }
                        }
                    },
                    Err(e) => {
                        fail(device(e), &mut error);
                        break;
                    }
                }
            }
        }
        while let Some((op, d)) = in_flight.pop_front() {
            if let Err(e) = io.wait_op(op, d) {
                fail(e, &mut error);
            }
        }
        Batch {
            done: batch.len(),
            error,
        }
    }
}

impl Drop for Ofi {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.close();
        }
    }
}

/// Whether `fd` becomes readable within `timeout` (whole milliseconds, rounded up).
fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> nix::Result<bool> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let ms = timeout.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32;
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    poll(
        &mut fds,
        PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX),
    )
    .map(|n| n > 0)
}

#[cfg(test)]
mod hostile;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reads_back_and_a_malformed_one_is_refused() {
        let region = Region {
            base: 0x7f00_0000_1000,
            key: 42,
            len: 1 << 20,
        };
        let s = entry(&[1, 2, 0xab], region, "tcp;ofi_rxm");
        assert!(!s.contains(';') && !s.contains(' '), "{s}");
        let e = parse_entry(&s).expect("reads back");
        assert_eq!(e.name, vec![1, 2, 0xab]);
        assert_eq!(e.region, region);
        assert_eq!(e.provider, "tcp;ofi_rxm");
        assert_eq!(e.pid, std::process::id());
        for bad in [
            "",
            "zz/1/2/3/4/h/p",
            "010/1/2/3/4/h/p",
            "01/1/2/3/4/h",
            "01/x/2/3/4/h/p",
            // A segment that would end past the top of the address space.
            "01/ffffffffffffffff/2/3/4/h/p",
        ] {
            assert!(parse_entry(bad).is_none(), "{bad:?}");
        }
    }

    /// Catches a write straight from a registration that reads the wrong bytes (an offset
    /// not counted from the registration's first byte), a range outside it or another
    /// mapping's bytes taken as inside, and, where the provider reads a write's source after
    /// the call that issued it returned, a deregistration that ends the registration (or
    /// drops its memory) under that write: the write issued, the segment deregistered and
    /// this test's handle of it dropped before its completion is read, the bytes still land
    /// whole.
    #[test]
    fn a_write_from_a_registration_outlives_its_deregistration() {
        use std::sync::atomic::{AtomicBool, Ordering};
        for provider in ["tcp", "shm"] {
            let mut ranks = Ofi::cluster(2, 4096, OfiConfig::default().provider(provider))
                .unwrap_or_else(|e| panic!("{provider}: {e}"));
            let b = ranks.pop().expect("rank 1");
            let mut a = ranks.pop().expect("rank 0");
            let words = 64;
            let seg = Segment::heap(words, 8192).expect("segment");
            let pattern: Vec<u8> = (0..8192u32).map(|i| (i * 5 + 3) as u8).collect();
            seg.byte_area().write(0, &pattern).expect("write");
            let (reg, _) = a.io.ep.register_segment(&seg).expect("registered");
            let other = Segment::heap(words, 8192).expect("segment");
            assert_eq!(a.io.ep.registered_offset(&reg, other.byte_area()), None);
            let range = seg.byte_area().slice(10, 100).expect("range");
            assert_eq!(a.io.ep.registered_offset(&reg, range), Some(words + 10));
            drop(other);
            let region = b.io.ep.region();
            let past = a.io.ep.write_from_registration(
                &reg,
                words + 8192 - 10,
                20,
                1,
                region.base,
                region.key,
                true,
            );
            assert!(past.is_err(), "{provider}: a range past the registration");
            let stop = AtomicBool::new(false);
            let b = std::thread::scope(|s| {
                let poller = s.spawn(|| {
                    let mut b = b;
                    while !stop.load(Ordering::SeqCst) {
                        let _ = b.poll_recv(|_, _, _| ());
                        std::thread::yield_now();
                    }
                    b
                });
                // The first write may wait for the connection: issued as the transport
                // issues its own, reading completions while the provider has no room.
                let written =
                    a.io.start(
                        1,
                        |ep| {
                            ep.write_from_registration(
                                &reg,
                                words + 10,
                                100,
                                1,
                                region.base,
                                region.key,
                                true,
                            )
                        },
                        &mut VecDeque::new(),
                    )
                    .and_then(|op| {
                        a.io.ep.deregister(reg).map_err(device)?;
                        drop(seg);
                        a.io.wait_op(op, 1)
                    });
                stop.store(true, Ordering::SeqCst);
                let b = poller.join().expect("poller");
                written.unwrap_or_else(|e| panic!("{provider}: {e}"));
                b
            });
            let mut got = vec![0u8; 100];
            b.segment.byte_area().read(0, &mut got).expect("read");
            assert_eq!(got, pattern[10..110], "{provider}");
            drop((a, b));
        }
    }

    /// On `shm` the endpoints of one process reach each other's regions through the
    /// provider's one mapping of each: a rank of this process that sends to, and reads after,
    /// a rank of the same process that has closed must find that region still there. Would
    /// catch an endpoint whose close unmaps its region while another of the process still
    /// knows it (a fault inside libfabric, or a write into memory mapped anew).
    #[test]
    fn a_rank_may_send_to_a_rank_of_its_process_that_closed_first() {
        for provider in ["shm", "tcp", "sockets"] {
            let mut ranks = Ofi::cluster(2, 4096, OfiConfig::default().provider(provider))
                .unwrap_or_else(|e| panic!("{provider}: {e}"));
            let deadline = Instant::now() + Duration::from_secs(10);
            // A message each way first: `shm` sends to a peer only once it has read this
            // rank's name, so the goodbye leaves at once.
            let mut got = [false; 2];
            let mut sent = [false; 2];
            while got != [true; 2] && Instant::now() < deadline {
                for r in 0..2 {
                    if !sent[r] {
                        let to = 1 - r as Rank;
                        sent[r] = ranks[r]
                            .io
                            .send_message(to, KIND_AM, &[0; 8], Payload::EMPTY)
                            .is_ok();
                    }
                    if let Ok(Some(())) = ranks[r].poll_recv(|_, _, _| ()) {
                        got[r] = true;
                    }
                }
            }
            assert_eq!(got, [true; 2], "{provider}");
            let mut b = ranks.pop().unwrap();
            drop(ranks);
            // Unaware of the goodbye until it reads it: these go to the closed rank.
            for _ in 0..64 {
                let _ = b.io.send_message(0, KIND_AM, &[0; 8], Payload::EMPTY);
            }
            let mut departed = false;
            while !departed && Instant::now() < deadline {
                departed = matches!(b.poll_recv(|_, _, _| ()), Err(NicError::PeerDeparted(0)));
            }
            assert!(departed, "{provider}");
            // What the closed rank left unread stays in its region until the last closes.
            let _ = b.io.send_message(0, KIND_GOODBYE, &[], Payload::EMPTY);
            let _ = b.io.pump();
        }
    }
}
