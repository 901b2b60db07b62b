//! [`Udp`]: the socket glue that runs the [`Engine`] over UDP: one socket per rank that
//! receives, and sockets connected to its peers that send ([`PeerSockets`]).

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, BorrowedFd};
use std::time::{Duration, Instant};

use am_bootstrap::JobInfo;
use am_core::transport::NicInfo;
use am_core::{
    Armed, Delivery, FaultConfig, Limits, Outgoing, Rank, Received, Route, SendError, Transport,
    TransportError, Tx,
};

use crate::config::UdpConfig;
use crate::error::{io_err, UdpError};
use crate::proto::{Engine, Input, Stats};
use crate::rendezvous::{self, PeerAddr};
use crate::wire::{random_u64, Authenticator, JobKey};

/// Messages to self waiting for delivery; beyond that a send to self is `Busy` (credits keep
/// it far below this).
const SELF_QUEUE_MAX: usize = 1 << 16;
/// Datagrams read per poll before returning to the caller, so a flood cannot starve it.
const RECV_BATCH: usize = 64;
/// Bytes of one batch handed to the kernel at once with UDP GSO: what one UDP datagram may
/// carry (the kernel's limit for a GSO send), and the receive buffer of a GRO batch.
const BATCH_BYTES: usize = 65507;
/// Datagrams in one GSO send at most (the kernel's UDP_MAX_SEGMENTS is 64 or more).
const BATCH_SEGMENTS: usize = 64;
/// Reads (datagrams, or GRO batches of them) taken from the socket in one `recvmmsg`.
const RECV_SLOTS: usize = 8;
/// Peers that get a socket of their own for sending ([`PeerSockets`]) at most: the rest
/// share the rank's socket, so a large job costs no more than this many descriptors.
const CONNECTED_MAX: usize = 64;
/// Sockets connected to peers that all the transports of one process hold at most: an
/// in-process job of many ranks ([`Udp::cluster`]: n ranks, n - 1 peers each) must not run
/// the process out of file descriptors (the soft limit is often 1024), which would fail
/// whatever else it opens. Beyond it, peers share the rank's socket.
const CONNECTED_PROCESS_MAX: usize = 256;
/// Sockets connected to peers that this process's transports hold now.
static CONNECTED_IN_PROCESS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);
/// How long a closing rank whose data was all acknowledged waits for acks of its goodbyes.
const GOODBYE_GRACE: Duration = Duration::from_millis(250);

/// What the socket glue asked of the kernel: the system calls a message costs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SocketStats {
    /// System calls made to send datagrams (`send`, `sendto`, `sendmsg` with UDP GSO,
    /// `sendmmsg`), failed ones included: a GSO send the kernel refused before the same
    /// datagrams went out by `sendmmsg`, or a send made again after an `ECONNREFUSED`.
    pub send_calls: u64,
    /// Datagrams handed to the kernel (several per call when batched).
    pub datagrams_out: u64,
    /// Datagrams the kernel refused to send (counted as network loss).
    pub send_errors: u64,
    /// Sends through a socket connected to a peer that failed with `ECONNREFUSED`: the
    /// peer's host had answered an earlier datagram with an ICMP "port unreachable" (its
    /// process is gone). Each such send was made again at once, so it is not in
    /// `send_errors`; whether the peer is lost is the protocol's to decide (its timeout).
    pub refused: u64,
    /// Reads (`recvmsg`, `recvmmsg`) that returned something.
    pub reads: u64,
    /// Reads that returned nothing: the socket was empty (or the call was interrupted, or
    /// reported an error, which the protocol need not act on).
    pub empty_reads: u64,
    /// Datagrams read (several per read with `recvmmsg` or UDP GRO).
    pub datagrams_in: u64,
}

/// The testing aid ([`UdpConfig::faults`], `AM_UDP_FAULTS`): seeded drop, duplicate and delay of
/// outgoing datagrams.
struct Faults {
    config: FaultConfig,
    rng: am_core::FaultRng,
    held: Vec<(SocketAddr, Vec<u8>, u32)>,
    dropped: u64,
}

impl Faults {
    fn next(&mut self) -> u64 {
        self.rng.next_u64()
    }
    fn chance(&mut self, p: f64) -> bool {
        self.rng.chance(p)
    }
    /// Sends held datagrams whose time has come.
    fn release(&mut self, socket: &UdpSocket) {
        let mut i = 0;
        while i < self.held.len() {
            self.held[i].2 = self.held[i].2.saturating_sub(1);
            if self.held[i].2 == 0 {
                let (addr, bytes, _) = self.held.swap_remove(i);
                let _ = socket.send_to(&bytes, addr);
            } else {
                i += 1;
            }
        }
    }
}

/// Datagrams to one destination waiting to go out together: all of one size but the last,
/// which may be shorter (what UDP GSO cuts one buffer into).
struct Batch {
    buf: Vec<u8>,
    dest: Rank,
    /// The size of every datagram in it but the last.
    seg: usize,
    count: usize,
    /// The last datagram was shorter than `seg`: nothing more may follow it.
    closed: bool,
    /// Whether the kernel does UDP GSO (cleared at the first refusal; then one send per
    /// datagram).
    gso: bool,
}

impl Batch {
    /// An empty batch; `gso`: whether to try UDP GSO.
    fn new(gso: bool) -> Batch {
        Batch {
            buf: Vec::with_capacity(BATCH_BYTES),
            dest: 0,
            seg: 0,
            count: 0,
            closed: false,
            gso,
        }
    }

    fn fits(&self, dest: Rank, len: usize) -> bool {
        self.count == 0
            || (dest == self.dest
                && !self.closed
                && len <= self.seg
                && self.count < BATCH_SEGMENTS
                && self.buf.len() + len <= BATCH_BYTES)
    }

    fn push(&mut self, dest: Rank, bytes: &[u8]) {
        if self.count == 0 {
            self.dest = dest;
            self.seg = bytes.len();
            self.closed = false;
        }
        self.buf.extend_from_slice(bytes);
        self.count += 1;
        self.closed = bytes.len() < self.seg;
    }

    /// Hands the batch to the kernel: one `sendmsg` with a `UDP_SEGMENT` control message for
    /// several datagrams, else one `sendmmsg` for them all.
    fn send(&mut self, out: Outlet<'_>, stats: &mut SocketStats) {
        use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrStorage};
        use std::os::fd::AsRawFd;
        if self.count == 0 {
            return;
        }
        let mut sent = false;
        stats.datagrams_out += self.count as u64;
        // Through a connected socket the kernel knows the destination and its route already.
        let to = out.to.map(SockaddrStorage::from);
        if self.count > 1 && self.gso {
            let seg = self.seg as u16;
            let iov = [io::IoSlice::new(&self.buf)];
            match send_call(stats, || {
                sendmsg(
                    out.socket.as_raw_fd(),
                    &iov,
                    &[ControlMessage::UdpGsoSegments(&seg)],
                    MsgFlags::empty(),
                    to.as_ref(),
                )
            }) {
                Ok(_) => sent = true,
                // No GSO here (an old kernel, or a device without checksum offload): one by
                // one from now on.
                Err(nix::errno::Errno::EIO)
                | Err(nix::errno::Errno::EINVAL)
                | Err(nix::errno::Errno::ENOPROTOOPT)
                | Err(nix::errno::Errno::EOPNOTSUPP) => self.gso = false,
                // A full socket buffer or a transient error is loss on the network:
                // retransmission recovers it.
                Err(_) => {
                    stats.send_errors += self.count as u64;
                    sent = true;
                }
            }
        }
        if !sent && self.count == 1 {
            out.send(&self.buf, stats);
        } else if !sent {
            use nix::sys::socket::{sendmmsg, MultiHeaders};
            let slices: Vec<[io::IoSlice<'_>; 1]> = self
                .buf
                .chunks(self.seg.max(1))
                .map(|d| [io::IoSlice::new(d)])
                .collect();
            let addrs = vec![to; slices.len()];
            let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(slices.len(), None);
            let no_cmsgs: [ControlMessage<'_>; 0] = [];
            // What the kernel did not take (a full socket buffer) is loss on the network.
            let taken = send_call(stats, || {
                sendmmsg(
                    out.socket.as_raw_fd(),
                    &mut headers,
                    &slices,
                    &addrs,
                    no_cmsgs,
                    MsgFlags::empty(),
                )
                .map(|r| r.count())
            })
            .unwrap_or(0);
            stats.send_errors += (slices.len() - taken.min(slices.len())) as u64;
        }
        self.buf.clear();
        self.count = 0;
    }
}

/// Where datagrams to one peer leave from: a socket connected to it, or the rank's own
/// socket with the peer's address.
#[derive(Clone, Copy)]
struct Outlet<'a> {
    socket: &'a UdpSocket,
    /// `None`: `socket` is connected to the peer.
    to: Option<SocketAddr>,
}

impl Outlet<'_> {
    /// Sends one datagram (a system call of its own); whether the kernel took it. One it did
    /// not is counted in `send_errors`: loss on the network, which retransmission recovers.
    fn send(&self, bytes: &[u8], stats: &mut SocketStats) -> bool {
        let sent = send_call(stats, || match self.to {
            Some(addr) => self.socket.send_to(bytes, addr),
            None => self.socket.send(bytes),
        })
        .is_ok();
        if !sent {
            stats.send_errors += 1;
        }
        sent
    }
}

/// An error a send may fail with, as std or nix report it.
trait SendFailure {
    /// `ECONNREFUSED`.
    fn is_refused(&self) -> bool;
}

impl SendFailure for io::Error {
    fn is_refused(&self) -> bool {
        self.kind() == io::ErrorKind::ConnectionRefused
    }
}

impl SendFailure for nix::errno::Errno {
    fn is_refused(&self) -> bool {
        *self == nix::errno::Errno::ECONNREFUSED
    }
}

/// Makes one system call that sends (`call`), counted in `stats`, and makes it again once if
/// it failed with `ECONNREFUSED`.
///
/// A socket connected to a peer keeps the ICMP "port unreachable" the peer's host sent back
/// for an earlier datagram (its port is closed: the process is gone, or going), and the next
/// send on it fails with `ECONNREFUSED` having sent nothing. The error is about the earlier
/// datagram, not this one, and reading it cleared it: the send is made again, so the
/// datagram fares as it would through an unconnected socket (which never sees the report),
/// and the refusal is counted ([`SocketStats::refused`]), not taken for a failed send.
fn send_call<T, E: SendFailure>(
    stats: &mut SocketStats,
    mut call: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    stats.send_calls += 1;
    match call() {
        Err(e) if e.is_refused() => {
            stats.refused += 1;
            stats.send_calls += 1;
            call()
        }
        r => r,
    }
}

/// A peer's sending socket.
enum PeerSocket {
    /// Not needed yet.
    Untried,
    /// Bound to an ephemeral port of this rank's address and connected to the peer's.
    Connected(UdpSocket),
    /// None could be made (or the cap was reached): the rank's own socket serves.
    Shared,
}

/// Sockets connected to one peer each, used for sending only (what arrives for them is never
/// read: peers send to the rank's own socket, and the source of a datagram means nothing,
/// only its MAC). A send through a connected UDP socket skips the route lookup and the
/// address copy of every `sendto`: a tenth of the cost of a small datagram on loopback. Made
/// at the first send to a peer, for at most [`CONNECTED_MAX`] peers (and while the process
/// holds fewer than [`CONNECTED_PROCESS_MAX`]); the others share the rank's own socket.
///
/// The peers' addresses live here and only here, fixed for the job (learned at rendezvous;
/// a rank that restarts is a new transport with a new epoch, which its old peers fence), so
/// a connected socket cannot be left pointing at an address the rank no longer sends to.
struct PeerSockets {
    /// Each rank's address, indexed by rank.
    addrs: Vec<SocketAddr>,
    /// Indexed by rank.
    peers: Vec<PeerSocket>,
    made: usize,
    /// The address the rank's own socket is bound to (port aside): where connected ones bind.
    bind: std::net::IpAddr,
    /// What `SO_SNDBUF` to ask for.
    send_buffer: usize,
}

impl PeerSockets {
    fn new(addrs: Vec<SocketAddr>, bind: std::net::IpAddr, send_buffer: usize) -> PeerSockets {
        PeerSockets {
            peers: addrs.iter().map(|_| PeerSocket::Untried).collect(),
            addrs,
            made: 0,
            bind,
            send_buffer,
        }
    }

    /// Rank `dest`'s address.
    #[inline]
    fn addr(&self, dest: Rank) -> SocketAddr {
        self.addrs[dest as usize]
    }

    /// How to send to `dest`; `own` is the rank's socket.
    #[inline]
    fn outlet<'a>(&'a mut self, own: &'a UdpSocket, dest: Rank) -> Outlet<'a> {
        let addr = self.addrs[dest as usize];
        let slot = &mut self.peers[dest as usize];
        if let PeerSocket::Untried = slot {
            *slot = if self.made < CONNECTED_MAX && reserve_connected() {
                match connected(self.bind, addr, self.send_buffer) {
                    Ok(s) => {
                        self.made += 1;
                        PeerSocket::Connected(s)
                    }
                    Err(_) => {
                        release_connected(1);
                        PeerSocket::Shared
                    }
                }
            } else {
                PeerSocket::Shared
            };
        }
        match slot {
            PeerSocket::Connected(s) => Outlet {
                socket: s,
                to: None,
            },
            _ => Outlet {
                socket: own,
                to: Some(addr),
            },
        }
    }
}

impl Drop for PeerSockets {
    fn drop(&mut self) {
        release_connected(self.made);
    }
}

/// Counts one more connected socket in the process, unless it holds
/// [`CONNECTED_PROCESS_MAX`] already.
fn reserve_connected() -> bool {
    use std::sync::atomic::Ordering;
    CONNECTED_IN_PROCESS
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < CONNECTED_PROCESS_MAX).then_some(n + 1)
        })
        .is_ok()
}

/// Counts `n` connected sockets fewer in the process.
fn release_connected(n: usize) {
    CONNECTED_IN_PROCESS.fetch_sub(n, std::sync::atomic::Ordering::Relaxed);
}

/// A non-blocking UDP socket on an ephemeral port of `bind`, connected to `peer`.
fn connected(
    bind: std::net::IpAddr,
    peer: SocketAddr,
    send_buffer: usize,
) -> io::Result<UdpSocket> {
    let bind = match (bind, peer) {
        (std::net::IpAddr::V4(_), SocketAddr::V4(_))
        | (std::net::IpAddr::V6(_), SocketAddr::V6(_)) => bind,
        (_, SocketAddr::V4(_)) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        (_, SocketAddr::V6(_)) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let s = UdpSocket::bind(SocketAddr::new(bind, 0))?;
    s.connect(peer)?;
    s.set_nonblocking(true)?;
    // Best effort, as for the rank's own socket.
    let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::SndBuf, &send_buffer);
    // Nothing is read from it, and no peer sends to it, but the kernel queues what arrives
    // from the peer's address (anyone can forge that) until the receive buffer is full: the
    // smallest the kernel allows (it rounds 0 up to its minimum) bounds what that can hold.
    let _ = nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::RcvBuf, &0);
    Ok(s)
}

/// The sending half, also lent to handlers for replies.
struct Io {
    rank: Rank,
    size: u32,
    socket: UdpSocket,
    /// The peers' addresses, and sockets connected to them for sending.
    outlets: PeerSockets,
    batch: Batch,
    engine: Engine,
    self_queue: VecDeque<Vec<u8>>,
    faults: Option<Faults>,
    sys: SocketStats,
    /// A private copy of a payload sent from shared memory (a get served from the segment).
    echo: Vec<u8>,
}

fn send_datagram(
    socket: &UdpSocket,
    faults: &mut Option<Faults>,
    stats: &mut SocketStats,
    addr: SocketAddr,
    bytes: &[u8],
) {
    if let Some(f) = faults {
        f.release(socket);
        if f.chance(f.config.drop) {
            f.dropped += 1;
            return;
        }
        if f.chance(f.config.delay) {
            let after = 1 + (f.next() % f.config.max_delay.max(1) as u64) as u32;
            f.held.push((addr, bytes.to_vec(), after));
            return;
        }
        if f.chance(f.config.duplicate) {
            let _ = socket.send_to(bytes, addr);
        }
    }
    // A full socket buffer or a transient error is loss on the network: retransmission
    // recovers it.
    stats.datagrams_out += 1;
    Outlet {
        socket,
        to: Some(addr),
    }
    .send(bytes, stats);
}

impl Io {
    /// Sends whatever the engine has due: consecutive datagrams to one peer in one system
    /// call where the kernel allows (UDP GSO), the others one by one.
    #[inline]
    fn flush(&mut self, now: Instant) {
        let Io {
            engine,
            socket,
            faults,
            sys,
            batch,
            outlets,
            ..
        } = self;
        if faults.is_some() {
            // The testing aid judges every datagram on its own.
            engine.transmit(now, &mut |dest, bytes| {
                send_datagram(socket, faults, sys, outlets.addr(dest), bytes)
            });
            return;
        }
        engine.transmit(now, &mut |dest, bytes| {
            if !batch.fits(dest, bytes.len()) {
                batch.send(outlets.outlet(socket, batch.dest), sys);
            }
            if bytes.len() > BATCH_BYTES / 2 {
                // No second one of its size would fit: straight out, without the copy.
                sys.datagrams_out += 1;
                outlets.outlet(socket, dest).send(bytes, sys);
                return;
            }
            batch.push(dest, bytes);
        });
        if batch.count > 0 {
            batch.send(outlets.outlet(socket, batch.dest), sys);
        }
    }

    /// Runs the timers if due, then sends.
    #[inline]
    fn tick(&mut self, now: Instant) {
        if self.engine.next_timeout().is_none_or(|t| now >= t) {
            self.engine.handle_timeout(now);
        }
        if let Some(f) = &mut self.faults {
            f.release(&self.socket);
        }
        self.flush(now);
    }
}

impl Tx for Io {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        if dest == self.rank {
            if self.self_queue.len() >= SELF_QUEUE_MAX {
                return Err(SendError::Busy);
            }
            let mut m = Vec::with_capacity(msg.len());
            m.extend_from_slice(msg.head);
            msg.payload.append_to(&mut m);
            self.self_queue.push_back(m);
            return Ok(());
        }
        if dest >= self.size {
            return Err(SendError::InvalidRank(dest));
        }
        let payload = msg.payload.to_private(&mut self.echo);
        // Joining a datagram held open sends nothing now: no clock to read.
        if self.engine.send_packed(dest, msg.head, payload) {
            return Ok(());
        }
        let now = Instant::now();
        self.engine.send_new(now, dest, msg.head, payload)?;
        self.flush(now);
        Ok(())
    }
}

/// The UDP transport of one rank: reliable, in-order, authenticated AM delivery over UDP (one
/// socket to receive on, others connected to its peers to send from). See the
/// [crate docs](crate) for the protocol and the threat model.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use am_core::{AmKind, Config, HandlerId, Handlers, Node};
/// use transport_udp::{Udp, UdpConfig};
///
/// let mut job = am_bootstrap::JobInfo::from_env()?;
/// let udp = Udp::connect(&mut job, 1 << 20, UdpConfig::from_env()?)?;
/// let mut handlers = Handlers::local();
/// handlers.request(HandlerId(1), "hello", AmKind::Short, |msg, _token| {
///     println!("hello from {}", msg.src());
/// })?;
/// let mut node = Node::new(udp, handlers, Config::from_env()?)?;
/// node.request_short((node.rank() + 1) % node.size(), HandlerId(1), &[])?;
/// node.barrier()?;
/// # Ok(()) }
/// ```
pub struct Udp {
    io: Io,
    /// Received bytes: [`RECV_SLOTS`] slots of `rx_slot` bytes, each holding one datagram,
    /// or with UDP GRO several of one size (the last may be shorter).
    rx: Vec<u8>,
    rx_slot: usize,
    /// What the last read filled, not yet handed on: (start in `rx`, length, segment size).
    rx_reads: VecDeque<(usize, usize, usize)>,
    /// The last read found datagrams: the next uses `recvmmsg` (more are likely waiting);
    /// after an empty one, a plain `recvmsg` (an idle poll costs less, a round trip too).
    rx_busy: bool,
    /// Control-message space for the GRO segment size of a `recvmsg`.
    rx_cmsg: Vec<u8>,
    /// Private heap memory, reached through the same views as the shared-memory NICs'.
    segment: am_shm::Segment,
    limits: Limits,
    linger: Duration,
    local: SocketAddr,
    /// Set once the rank has said goodbye (`close` or drop): it lingers only once.
    closed: bool,
    /// Peers whose goodbye was reported (`TransportError::PeerDeparted`, once each).
    departures_reported: Vec<bool>,
}

impl std::fmt::Debug for Udp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Udp")
            .field("rank", &self.io.rank)
            .field("size", &self.io.size)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

/// Binds the rank's socket as the configuration says.
pub(crate) fn bind_socket(config: &UdpConfig, rank: Rank) -> Result<UdpSocket, UdpError> {
    let port = match config.port_base {
        Some(base) => u16::try_from(base as u32 + rank).map_err(|_| UdpError::Config {
            var: "AM_UDP_PORT_BASE",
            value: base.to_string(),
            why: format!("rank {rank} would need a port above 65535"),
        })?,
        None => 0,
    };
    let addr = SocketAddr::new(config.bind, port);
    let socket = UdpSocket::bind(addr).map_err(io_err(format!("binding UDP {addr}")))?;
    socket
        .set_nonblocking(true)
        .map_err(io_err("making the UDP socket non-blocking"))?;
    // Best effort: the kernel caps these at net.core.{r,w}mem_max.
    let n = config.socket_buffer;
    let _ = nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::RcvBuf, &n);
    let _ = nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::SndBuf, &n);
    // Best effort too: with GRO the kernel hands over a batch of datagrams from one sender
    // in one read (each still authenticated on its own); without, one read per datagram.
    let _ = nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::UdpGroSegment, &true);
    Ok(socket)
}

fn random_job_name() -> Result<String, UdpError> {
    let v = random_u64().map_err(io_err("reading /dev/urandom"))?;
    Ok(format!("udp-cluster-{v:016x}"))
}

impl Udp {
    /// Connects this rank of a multi-process job: binds its socket, exchanges addresses,
    /// epochs and (if none is configured) the job key through `job.kvs`, or through the
    /// coordinator at `config.coord` when the launcher has no key-value store.
    ///
    /// Collective: every rank of the job must call it.
    pub fn connect(
        job: &mut JobInfo,
        segment_size: usize,
        config: UdpConfig,
    ) -> Result<Udp, UdpError> {
        let config = config.validated()?;
        let socket = bind_socket(&config, job.rank)?;
        let epoch = random_u64().map_err(io_err("reading /dev/urandom"))?;
        let me = rendezvous::advertised(&socket, &config)?;
        let (entries, key) = rendezvous::exchange(job, &config, me, epoch)?;
        // Every rank sends datagrams of at most the agreed size, which every rank's receive
        // buffer fits.
        let mut config = config;
        config.engine.mtu = rendezvous::agreed_mtu(&entries)?;
        let peers: Vec<PeerAddr> = entries.iter().map(|e| e.peer).collect();
        Udp::with_peers(
            job.rank,
            socket,
            &peers,
            &key,
            &job.job_id,
            segment_size,
            config,
        )
    }

    /// The transports of an in-process job of `ranks` ranks, on sockets bound to
    /// `config.bind` (127.0.0.1 by default), with a fresh random key and job id. Move each to
    /// its own thread.
    pub fn cluster(
        ranks: u32,
        segment_size: usize,
        config: UdpConfig,
    ) -> Result<Vec<Udp>, UdpError> {
        let config = config.validated()?;
        let key = match &config.key {
            Some(k) => k.clone(),
            None => JobKey::generate().map_err(io_err("reading /dev/urandom"))?,
        };
        let job_id = random_job_name()?;
        let mut sockets = Vec::new();
        let mut peers = Vec::new();
        for r in 0..ranks {
            let s = bind_socket(&config, r)?;
            let addr = s
                .local_addr()
                .map_err(io_err("reading the socket address"))?;
            let epoch = random_u64().map_err(io_err("reading /dev/urandom"))?;
            peers.push(PeerAddr { addr, epoch });
            sockets.push(s);
        }
        sockets
            .into_iter()
            .enumerate()
            .map(|(r, s)| {
                Udp::with_peers(
                    r as Rank,
                    s,
                    &peers,
                    &key,
                    &job_id,
                    segment_size,
                    config.clone(),
                )
            })
            .collect()
    }

    /// Builds a rank from an already bound socket and a rendezvous done elsewhere: `peers[r]`
    /// is rank r's address and epoch (`peers[rank]` is this rank's own, whose epoch must be
    /// unique to this transport: drawn at random for it, as it keys the MAC of every datagram
    /// this transport sends, whose nonces start again with each transport; see
    /// [`crate::wire::DatagramKey`]), `key` and `job_id` are the job's.
    pub fn with_peers(
        rank: Rank,
        socket: UdpSocket,
        peers: &[PeerAddr],
        key: &JobKey,
        job_id: &str,
        segment_size: usize,
        config: UdpConfig,
    ) -> Result<Udp, UdpError> {
        let config = config.validated()?;
        if rank as usize >= peers.len() {
            return Err(UdpError::Rendezvous(format!(
                "rank {rank} is not below the job size {}",
                peers.len()
            )));
        }
        socket
            .set_nonblocking(true)
            .map_err(io_err("making the UDP socket non-blocking"))?;
        let local = socket
            .local_addr()
            .map_err(io_err("reading the socket address"))?;
        let epochs: Vec<u64> = peers.iter().map(|p| p.epoch).collect();
        let auth = Authenticator::new(key, job_id);
        let engine = Engine::new(config.engine.clone(), rank, &epochs, auth);
        let limits = Limits {
            max_args: am_core::wire::MAX_ARGS,
            max_medium: config.max_medium,
            max_long: config.max_long,
            max_credits: 255,
        };
        Ok(Udp {
            io: Io {
                rank,
                size: peers.len() as u32,
                socket,
                outlets: PeerSockets::new(
                    peers.iter().map(|p| p.addr).collect(),
                    local.ip(),
                    config.socket_buffer,
                ),
                batch: Batch::new(true),
                engine,
                self_queue: VecDeque::new(),
                echo: Vec::new(),
                faults: config.faults.map(|c| Faults {
                    config: c,
                    // Ranks of one job (one AM_UDP_FAULTS) fault independently.
                    rng: am_core::FaultRng::new(
                        c.seed
                            .wrapping_add((rank as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)),
                    ),
                    held: Vec::new(),
                    dropped: 0,
                }),
                sys: SocketStats::default(),
            },
            // Each slot has room for a GRO batch (and one byte more than the largest datagram,
            // so a longer one shows as too long rather than fitting exactly when cut).
            rx: vec![0; RECV_SLOTS * (BATCH_BYTES.max(config.engine.mtu) + 1)],
            rx_slot: BATCH_BYTES.max(config.engine.mtu) + 1,
            rx_reads: VecDeque::with_capacity(RECV_SLOTS),
            rx_busy: false,
            rx_cmsg: nix::cmsg_space!(i32),
            departures_reported: vec![false; peers.len()],
            segment: am_shm::Segment::heap(0, segment_size).map_err(|source| {
                UdpError::Segment {
                    size: segment_size,
                    source,
                }
            })?,
            limits,
            linger: config.linger,
            local,
            closed: false,
        })
    }

    /// The address this rank's socket is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// What the protocol did and what it refused (hostile datagrams are counted here).
    pub fn stats(&self) -> Stats {
        self.io.engine.stats()
    }

    /// Datagrams the kernel refused to send (counted as network loss).
    pub fn send_errors(&self) -> u64 {
        self.io.sys.send_errors
    }

    /// What the socket glue asked of the kernel (system calls and datagrams each way).
    pub fn socket_stats(&self) -> SocketStats {
        self.io.sys
    }

    /// Datagrams the test hook ([`UdpConfig::faults`]) dropped.
    ///
    /// [`UdpConfig::faults`]: field@UdpConfig::faults
    pub fn injected_drops(&self) -> u64 {
        self.io.faults.as_ref().map_or(0, |f| f.dropped)
    }

    /// The next received datagram, as a range of `rx`: the rest of the last reads, else
    /// fresh ones (up to [`RECV_SLOTS`] in one `recvmmsg`). `None` when the socket is empty.
    fn next_datagram(&mut self) -> Option<std::ops::Range<usize>> {
        if self.rx_reads.is_empty() {
            self.read_socket();
        }
        let (start, len, seg) = self.rx_reads.front_mut()?;
        let take = (*seg).min(*len);
        let d = *start..*start + take;
        *start += take;
        *len -= take;
        if *len == 0 {
            self.rx_reads.pop_front();
        }
        Some(d)
    }

    /// Reads the socket into the slots of `rx`, noting in `rx_reads` what it filled: one
    /// `recvmsg` when the last read found nothing, else one `recvmmsg`.
    fn read_socket(&mut self) {
        use nix::sys::socket::SockaddrStorage;
        use nix::sys::socket::{recvmmsg, recvmsg, ControlMessageOwned, MsgFlags, MultiHeaders};
        use std::os::fd::AsRawFd;
        // The kernel's word on how it joined datagrams (GRO); each is still checked on its
        // own, and a longer one than agreed is refused as such.
        fn segment(cmsgs: Option<nix::sys::socket::CmsgIterator<'_>>, n: usize) -> usize {
            cmsgs
                .and_then(|mut c| {
                    c.find_map(|m| match m {
                        ControlMessageOwned::UdpGroSegments(s) => usize::try_from(s).ok(),
                        _ => None,
                    })
                })
                .filter(|&s| s > 0)
                .unwrap_or(n)
                .max(1)
        }
        let slot = self.rx_slot;
        if !self.rx_busy {
            let mut iov = [io::IoSliceMut::new(&mut self.rx[..slot])];
            // EAGAIN: nothing more. EINTR: read at the next poll. Anything else (an ICMP
            // error reported on the socket) says nothing the protocol must act on.
            if let Ok(msg) = recvmsg::<SockaddrStorage>(
                self.io.socket.as_raw_fd(),
                &mut iov,
                Some(&mut self.rx_cmsg),
                MsgFlags::MSG_DONTWAIT,
            ) {
                let n = msg.bytes;
                let seg = segment(msg.cmsgs().ok(), n);
                self.rx_reads.push_back((0, n, seg));
                self.rx_busy = true;
                self.io.sys.reads += 1;
                self.io.sys.datagrams_in += n.div_ceil(seg) as u64;
            } else {
                self.io.sys.empty_reads += 1;
            }
            return;
        }
        let mut chunks = self.rx.chunks_mut(slot);
        let mut slots: [[io::IoSliceMut<'_>; 1]; RECV_SLOTS] =
            std::array::from_fn(|_| [io::IoSliceMut::new(chunks.next().unwrap_or_default())]);
        let mut headers =
            MultiHeaders::<SockaddrStorage>::preallocate(slots.len(), Some(nix::cmsg_space!(i32)));
        // EAGAIN: nothing more. EINTR: read at the next poll. Anything else (an ICMP error
        // reported on the socket) says nothing the protocol must act on.
        let Ok(reads) = recvmmsg(
            self.io.socket.as_raw_fd(),
            &mut headers,
            slots.iter_mut(),
            MsgFlags::MSG_DONTWAIT,
            None,
        ) else {
            self.rx_busy = false;
            self.io.sys.empty_reads += 1;
            return;
        };
        for (i, msg) in reads.enumerate() {
            let n = msg.bytes;
            let seg = segment(msg.cmsgs().ok(), n);
            self.rx_reads.push_back((i * slot, n, seg));
            self.io.sys.datagrams_in += n.div_ceil(seg) as u64;
        }
        self.rx_busy = !self.rx_reads.is_empty();
        if self.rx_busy {
            self.io.sys.reads += 1;
        } else {
            self.io.sys.empty_reads += 1;
        }
    }

    /// Reads datagrams until one yields something to deliver or the socket is empty.
    fn receive(&mut self, now: Instant) -> Option<Input> {
        for _ in 0..RECV_BATCH {
            let d = self.next_datagram()?;
            match self.io.engine.on_datagram(now, &mut self.rx[d.clone()]) {
                Input::Rejected => {}
                Input::Deliver { src, range } => {
                    return Some(Input::Deliver {
                        src,
                        range: d.start + range.start..d.start + range.end,
                    })
                }
                Input::Accepted => {
                    if self.io.engine.has_message() {
                        return Some(Input::Accepted);
                    }
                }
            }
            // An ack owed, or fragments an ack let go: out now, not after the whole batch,
            // so both ends work at once.
            if self.io.engine.has_output() {
                self.io.flush(now);
            }
        }
        None
    }

    /// Blocks in poll(2) on the socket for at most `timeout`.
    fn block(&self, timeout: Duration) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        // Datagrams already read from the socket wait in `rx`, not in the socket.
        if !self.rx_reads.is_empty() {
            return;
        }
        let ms = timeout.as_micros().div_ceil(1000).min(u16::MAX as u128) as u16;
        let mut fds = [PollFd::new(self.io.socket.as_fd(), PollFlags::POLLIN)];
        let _ = poll(&mut fds, PollTimeout::from(ms));
    }
}

impl Tx for Udp {
    #[inline]
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.io.try_send(dest, msg)
    }
}

impl Transport for Udp {
    /// Named `udp`. 128 static credits per peer ([`DEFAULT_CREDITS`]): a round trip over
    /// UDP takes ten microseconds or more, in which a sender packs a hundred small messages,
    /// so the core's 32 would leave the link idle most of each round trip. Nothing here is
    /// reserved per credit (the socket buffer and the reliability window are shared by
    /// whatever is in flight).
    ///
    /// No RMA of its own: puts, gets and atomics travel as messages. A reply travels on the
    /// reliable stream like any message: nothing is held per request, so one empty reply may
    /// answer several (one datagram instead of one per request).
    #[inline]
    fn info(&self) -> NicInfo {
        let mut info = NicInfo::new("udp", self.limits);
        info.credits = am_core::Credits::Static(DEFAULT_CREDITS);
        info.capabilities.acks_coalesce = true;
        info
    }

    fn rank(&self) -> Rank {
        self.io.rank
    }

    fn size(&self) -> u32 {
        self.io.size
    }

    fn segment(&self) -> am_core::SharedBytes<'_> {
        self.segment.byte_area()
    }

    #[inline]
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, am_core::SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        if let Some(r) = self.io.engine.poll_lost() {
            return Err(TransportError::PeerLost(r));
        }
        if let Some((peer, e)) = self.io.engine.poll_misbehaved() {
            return Err(TransportError::PeerMisbehaved {
                peer: Some(peer),
                what: e.to_string(),
            });
        }
        if let Some(m) = self.io.self_queue.pop_front() {
            let d = Delivery {
                src: self.io.rank,
                bytes: Received::Private(&m),
                payload_placed: false,
                route: Route::NONE,
            };
            let r = f(d, self.segment.byte_area(), &mut self.io);
            if self.io.engine.has_held() && self.drained() {
                self.settle(Instant::now());
            }
            return Ok(Some(r));
        }
        let mut read_at = None;
        if !self.io.engine.has_message() {
            let now = Instant::now();
            read_at = Some(now);
            // Datagrams first, timers after: a rank back from a gap in its polling (descheduled,
            // or busy in a handler) finds the acknowledgements that came meanwhile waiting in
            // its socket, and must not retransmit what they acknowledge.
            match self.receive(now) {
                Some(Input::Deliver { src, range }) => {
                    let d = Delivery {
                        src,
                        bytes: Received::Private(&self.rx[range]),
                        payload_placed: false,
                        route: Route::NONE,
                    };
                    let r = f(d, self.segment.byte_area(), &mut self.io);
                    self.settle(now);
                    return Ok(Some(r));
                }
                Some(_) => {}
                None => {
                    self.io.engine.release();
                    self.io.tick(now);
                    if let Some(r) = self.io.engine.poll_lost() {
                        return Err(TransportError::PeerLost(r));
                    }
                    // A goodbye comes after all of its sender's data: with nothing left to
                    // deliver, its departure is news.
                    let engine = &self.io.engine;
                    let left = (0..self.departures_reported.len())
                        .find(|&r| !self.departures_reported[r] && engine.has_departed(r as Rank));
                    if let Some(r) = left {
                        self.departures_reported[r] = true;
                        return Err(TransportError::PeerDeparted(r as Rank));
                    }
                    return Ok(None);
                }
            }
        }
        let Some((src, m)) = self.io.engine.pop_message() else {
            return Ok(None);
        };
        let d = Delivery {
            src,
            bytes: Received::Private(&m),
            payload_placed: false,
            route: Route::NONE,
        };
        let r = f(d, self.segment.byte_area(), &mut self.io);
        self.io.engine.recycle(m);
        // Timers and the held messages wait while messages already here remain to be
        // delivered (the next poll comes for them): one clock read per batch, not per message.
        if self.drained() {
            self.settle(read_at.unwrap_or_else(Instant::now));
        }
        Ok(Some(r))
    }

    /// Every message held for packing leaves now.
    fn flush(&mut self) {
        self.io.engine.release();
        if self.io.engine.has_output() {
            self.io.flush(Instant::now());
        }
    }

    /// Fragments sent again after a loss ([`Stats::retransmits`]).
    fn stats(&self) -> am_core::NicStats {
        am_core::NicStats::new(0, Udp::stats(self).retransmits)
    }

    fn close(&mut self) {
        self.linger_and_close();
    }

    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        if let Some(until) = self.sleep_bound(timeout) {
            self.block(until);
        }
        Ok(())
    }

    /// The rank's own socket: every datagram for this rank arrives there.
    fn wake_fd(&mut self) -> Result<Option<BorrowedFd<'_>>, TransportError> {
        Ok(Some(self.io.socket.as_fd()))
    }

    /// Datagrams wake the socket by themselves: arming only makes sure none waits in it
    /// already (a read finds them, for the next poll) and bounds the sleep by the engine's
    /// next timer (retransmission, acknowledgement, liveness).
    fn arm(&mut self) -> Result<Armed, TransportError> {
        let Some(until) = self.sleep_bound(ARMED_FOR) else {
            return Ok(Armed::Ready);
        };
        self.read_socket();
        if !self.rx_reads.is_empty() {
            return Ok(Armed::Ready);
        }
        Ok(Armed::Sleep(until))
    }
}

/// Credits per peer where the job's configuration chooses none.
pub const DEFAULT_CREDITS: u32 = 128;

/// The longest an armed rank with no timer running sleeps.
const ARMED_FOR: Duration = Duration::from_secs(1);

impl Udp {
    /// Whether everything that arrived was handled: nothing waits to be delivered, in the
    /// engine, in datagrams already read, or sent to this rank itself.
    fn drained(&self) -> bool {
        self.io.self_queue.is_empty() && !self.io.engine.has_message() && self.rx_reads.is_empty()
    }

    /// After a delivery: once everything that arrived was handled (the replies its handlers
    /// sent are all in), the messages held for packing leave; then the timers and the sends.
    #[inline]
    fn settle(&mut self, now: Instant) {
        if self.drained() {
            self.io.engine.release();
        }
        self.io.tick(now);
    }

    /// Before a sleep of at most `timeout`: runs the engine's timers, and says how long the
    /// sleep may last (until its next timer), or `None` if there is work for a poll now.
    fn sleep_bound(&mut self, timeout: Duration) -> Option<Duration> {
        if !self.drained() {
            return None;
        }
        let now = Instant::now();
        self.io.engine.release();
        self.io.tick(now);
        let until = self
            .io
            .engine
            .next_timeout()
            .map_or(timeout, |t| t.saturating_duration_since(now))
            .min(timeout);
        // Held test-hook datagrams go out on the next poll: do not sleep on them.
        if until.is_zero() || self.io.faults.as_ref().is_some_and(|f| !f.held.is_empty()) {
            return None;
        }
        Some(until)
    }
}

impl Drop for Udp {
    /// Lingers until what was sent is acknowledged (bounded), unless `close` already did.
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        self.linger_and_close();
    }
}

impl Udp {
    /// Lingers until everything sent was acknowledged and every live peer acknowledged our
    /// goodbye (bounded by [`UdpConfig::linger`]), so the last replies of a job are not lost
    /// with the process, and peers do not mistake a finished rank for a dead one.
    fn linger_and_close(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        let start = Instant::now();
        self.io.engine.close(start);
        loop {
            let now = Instant::now();
            self.io.tick(now);
            while let Some(input) = self.receive(now) {
                if let Input::Deliver { .. } = input {
                    continue;
                }
                while let Some((_, m)) = self.io.engine.pop_message() {
                    self.io.engine.recycle(m);
                }
            }
            while self.io.engine.poll_lost().is_some() {}
            self.io.flush(now);
            // A lost final ack must not hold a finished rank for the whole linger: once all
            // data is acknowledged, goodbyes get a short grace only.
            let bye_grace = now >= start + GOODBYE_GRACE && self.io.engine.only_goodbyes_pending();
            if self.io.engine.is_flushed() || bye_grace || now >= start + self.linger {
                break;
            }
            let wait = self
                .io
                .engine
                .next_timeout()
                .map_or(Duration::from_millis(10), |t| {
                    t.saturating_duration_since(now)
                })
                .clamp(Duration::from_micros(100), Duration::from_millis(10));
            self.block(wait);
        }
        // Acks still owed go out now rather than after a delay nobody will wait for.
        self.io.engine.ack_all();
        self.io.flush(Instant::now());
        if let Some(f) = &mut self.io.faults {
            for (addr, bytes, _) in f.held.drain(..) {
                let _ = self.io.socket.send_to(&bytes, addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A segment that cannot be made is the shared-memory error, as the source.
    #[test]
    fn a_segment_too_large_keeps_the_shared_memory_error() {
        use std::error::Error;
        let e = Udp::cluster(1, usize::MAX, UdpConfig::default())
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(
                e,
                UdpError::Segment {
                    size: usize::MAX,
                    ..
                }
            ),
            "{e}"
        );
        let source = e.source().expect("the shared-memory error is the source");
        assert!(
            source.downcast_ref::<am_shm::ShmError>().is_some(),
            "{source}"
        );
    }

    #[test]
    fn a_batch_holds_one_destination_and_equal_datagrams_but_the_last() {
        let mut b = Batch::new(true);
        assert!(b.fits(3, 1000));
        b.push(3, &[1; 1000]);
        assert!(b.fits(3, 1000) && b.fits(3, 10));
        assert!(!b.fits(2, 1000), "another destination");
        assert!(!b.fits(3, 1001), "longer than the first");
        b.push(3, &[2; 10]);
        assert!(!b.fits(3, 10), "nothing after a shorter one");
        let mut b = Batch::new(true);
        for _ in 0..BATCH_SEGMENTS {
            assert!(b.fits(1, 100));
            b.push(1, &[0; 100]);
        }
        assert!(!b.fits(1, 100), "at most BATCH_SEGMENTS");
        let mut b = Batch::new(true);
        while b.fits(1, 1472) {
            b.push(1, &[0; 1472]);
        }
        assert!(b.buf.len() <= BATCH_BYTES && b.buf.len() + 1472 > BATCH_BYTES);
    }

    /// Datagrams read ahead (one `recvmmsg` takes several) are not in the socket any more:
    /// `wait` must not sleep on the socket while they wait in the buffer.
    #[test]
    fn wait_returns_at_once_while_read_datagrams_wait() {
        let config = UdpConfig {
            linger: Duration::from_millis(100),
            ..UdpConfig::default()
        };
        let mut ranks = Udp::cluster(2, 4096, config).unwrap();
        let mut b = ranks.pop().unwrap();
        let mut a = ranks.pop().unwrap();
        // Each a datagram of its own: too large to share one (rank 0 never polls, so
        // smaller ones after the first would wait for it to).
        let alone = a.io.engine.config().fragment_payload() - 12;
        for i in 0..9u8 {
            a.try_send(1, &Outgoing::new(&[i; 12], &vec![i; alone]))
                .unwrap();
        }
        // One poll: the first byte of what it delivered, if anything.
        let poll_one = |b: &mut Udp| {
            b.poll_recv(|d, _, _| match d.bytes {
                Received::Private(m) => m[0],
                _ => u8::MAX,
            })
            .unwrap()
        };
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        // The first read takes one datagram, the next (recvmmsg) the other eight.
        while got.len() < 2 && Instant::now() < deadline {
            got.extend(poll_one(&mut b));
        }
        assert_eq!(got, [0, 1]);
        assert!(!b.rx_reads.is_empty(), "the other seven wait in the buffer");
        // (wait also sleeps no longer than the engine's next timer, a millisecond here; the
        // sleep itself is what must not happen.)
        let t = Instant::now();
        b.wait(Duration::from_secs(20)).unwrap();
        b.block(Duration::from_secs(5));
        assert!(
            t.elapsed() < Duration::from_millis(2500),
            "slept on an empty socket while datagrams waited in the buffer"
        );
        while got.len() < 9 && Instant::now() < deadline + Duration::from_secs(10) {
            got.extend(poll_one(&mut b));
        }
        assert_eq!(got, (0..9).collect::<Vec<u8>>());
        // Nine datagrams each way at least (acks may add some), and the reads that took them:
        // the first alone, the others together.
        let (sa, sb) = (a.socket_stats(), b.socket_stats());
        assert!(sa.datagrams_out >= 9 && sa.send_calls >= 1, "{sa:?}");
        assert!(sb.datagrams_in >= 9 && sb.reads >= 2, "{sb:?}");
        assert!(
            sb.reads < sb.datagrams_in,
            "one recvmmsg took several: {sb:?}"
        );
    }

    /// The first sends to a peer make a socket connected to it, for at most CONNECTED_MAX
    /// peers; the others go out through the rank's own socket. Every way delivers.
    #[test]
    fn peers_get_connected_sockets_up_to_the_cap_and_share_the_rest() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let own = UdpSocket::bind("127.0.0.1:0").unwrap();
        let own_addr = own.local_addr().unwrap();
        let to = rx.local_addr().unwrap();
        let peers = CONNECTED_MAX + 2;
        let mut sockets = PeerSockets::new(vec![to; peers], own_addr.ip(), 1 << 16);
        let mut connected = 0;
        for r in 0..peers as Rank {
            let out = sockets.outlet(&own, r);
            let from = out.socket.local_addr().unwrap();
            if out.to.is_none() {
                connected += 1;
                assert!(r < CONNECTED_MAX as Rank, "rank {r} beyond the cap got one");
                assert_ne!(
                    from, own_addr,
                    "rank {r}: connected, yet the rank's own socket"
                );
            } else {
                assert_eq!(from, own_addr);
            }
            let mut stats = SocketStats::default();
            assert!(
                out.send(&r.to_le_bytes(), &mut stats),
                "rank {r}: {stats:?}"
            );
            // The same socket again, not a new one.
            let again = sockets.outlet(&own, r).socket.local_addr().unwrap();
            assert_eq!(from, again, "rank {r}: a second outlet, another socket");
        }
        assert_eq!((connected, sockets.made), (CONNECTED_MAX, CONNECTED_MAX));
        let mut buf = [0u8; 16];
        for r in 0..peers as u32 {
            let (n, from) = rx.recv_from(&mut buf).unwrap();
            assert_eq!(&buf[..n], &r.to_le_bytes());
            // From a port of its own while connected, from the rank's socket beyond the cap.
            assert_eq!(from == own_addr, r >= CONNECTED_MAX as u32);
        }
    }

    /// A connected socket that cannot be made leaves the peer on the rank's own socket, for
    /// good: here a rank bound to loopback told of a peer elsewhere (the kernel will not
    /// route from 127.0.0.1 to it, or has no route at all), and a rank whose address is not
    /// this host's (where the kernel refuses non-local binds, its default).
    #[test]
    fn a_peer_socket_that_cannot_be_made_falls_back_to_the_ranks_own() {
        let own = UdpSocket::bind("127.0.0.1:0").unwrap();
        let elsewhere: SocketAddr = "203.0.113.1:9".parse().unwrap();
        let mut sockets =
            PeerSockets::new(vec![elsewhere; 2], "127.0.0.1".parse().unwrap(), 1 << 16);
        assert_eq!(sockets.outlet(&own, 1).to, Some(elsewhere));
        assert!(matches!(sockets.peers[1], PeerSocket::Shared));
        assert_eq!(
            sockets.outlet(&own, 1).to,
            Some(elsewhere),
            "tried once only"
        );
        assert_eq!(sockets.made, 0);

        let not_ours: std::net::IpAddr = "203.0.113.2".parse().unwrap();
        if UdpSocket::bind((not_ours, 0)).is_err() {
            let to: SocketAddr = "127.0.0.1:9".parse().unwrap();
            let mut sockets = PeerSockets::new(vec![to; 2], not_ours, 1 << 16);
            assert_eq!(sockets.outlet(&own, 1).to, Some(to));
            assert!(matches!(sockets.peers[1], PeerSocket::Shared));
            assert_eq!(sockets.made, 0);
        }
    }

    /// Both ways of sending a batch (GSO, and one by one after the kernel refused GSO), from
    /// the rank's own socket with the peer's address or from one connected to the peer, hand
    /// the receiver the same datagrams, in order, whole.
    #[test]
    fn a_batch_arrives_as_its_datagrams_with_and_without_gso() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let to = rx.local_addr().unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx_connected = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx_connected.connect(to).unwrap();
        let outlets = [
            Outlet {
                socket: &tx,
                to: Some(to),
            },
            Outlet {
                socket: &tx_connected,
                to: None,
            },
        ];
        for (gso, out) in [true, false]
            .into_iter()
            .flat_map(|g| outlets.map(|o| (g, o)))
        {
            let how = format!("gso {gso}, connected {}", out.to.is_none());
            let mut b = Batch::new(gso);
            let datagrams: Vec<Vec<u8>> = (0..5u8)
                .map(|i| vec![i; if i == 4 { 300 } else { 1200 }])
                .collect();
            for d in &datagrams {
                assert!(b.fits(7, d.len()));
                b.push(7, d);
            }
            let mut stats = SocketStats::default();
            b.send(out, &mut stats);
            assert_eq!(
                (stats.send_errors, b.count, b.buf.len()),
                (0, 0, 0),
                "{how}"
            );
            // One system call: `sendmsg` with GSO, or `sendmmsg`; two where the kernel
            // refused GSO (and the batch stopped asking for it).
            let calls = if gso && !b.gso { 2 } else { 1 };
            assert_eq!((stats.datagrams_out, stats.send_calls), (5, calls), "{how}");
            let mut buf = [0u8; 4096];
            for d in &datagrams {
                let (n, from) = rx.recv_from(&mut buf).unwrap();
                assert_eq!(&buf[..n], &d[..], "{how}");
                assert_eq!(from, out.socket.local_addr().unwrap(), "{how}");
            }
        }
    }

    /// A peer whose port closed (its process gone): the kernel keeps the ICMP "port
    /// unreachable" for a socket connected to it, and the next send there fails with
    /// ECONNREFUSED having sent nothing. That is counted as a refusal, not a failed send,
    /// and the datagram goes out anyway: here a new socket on the peer's port receives the
    /// one sent right after the refusals.
    #[test]
    fn a_refusal_on_a_connected_socket_is_counted_and_the_datagram_still_sent() {
        let gone = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = gone.local_addr().unwrap();
        drop(gone);
        let own = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut sockets = PeerSockets::new(vec![to; 2], "127.0.0.1".parse().unwrap(), 1 << 16);
        let mut stats = SocketStats::default();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut sends = 0;
        // On loopback the port unreachable is back before the send returns; allow for a
        // slower path all the same.
        while stats.refused == 0 {
            assert!(Instant::now() < deadline, "no refusal reported: {stats:?}");
            let out = sockets.outlet(&own, 1);
            assert!(out.to.is_none(), "a socket connected to the peer");
            assert!(out.send(b"nobody", &mut stats), "{stats:?}");
            sends += 1;
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(stats.send_errors, 0, "{stats:?}");
        assert_eq!(stats.send_calls, sends + stats.refused, "{stats:?}");
        // The peer is back on its port. (The last send left a refusal pending, at least
        // on loopback: the next one meets it.)
        let back = UdpSocket::bind(to).expect("the port was free a moment ago");
        back.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        assert!(
            sockets.outlet(&own, 1).send(b"again", &mut stats),
            "{stats:?}"
        );
        let mut buf = [0u8; 16];
        let (n, _) = back
            .recv_from(&mut buf)
            .expect("the datagram after a refusal");
        assert_eq!(&buf[..n], b"again");
        assert_eq!(stats.send_errors, 0, "{stats:?}");
    }
}
