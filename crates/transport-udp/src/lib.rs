//! Reliable, authenticated UDP transport for amnet: jobs across hosts.
//!
//! [`Udp`] implements [`am_core::Transport`] over UDP: each rank receives on one socket (and
//! sends through sockets connected to its peers, see **Batching** below). Every AM is
//! delivered to its handler exactly once and in order per pair of ranks, whatever the network
//! does (loss, duplication, reordering, delay), and every datagram is authenticated.
//!
//! - **Protocol** ([`proto::Engine`], a pure state machine with time passed in): per-peer
//!   64-bit sequence numbers, cumulative + 64-bit selective acks piggybacked on data (a
//!   standalone ack after 1 ms, at once on a gap), retransmission on a timeout from the
//!   measured round trip (RFC 9002: samples less the peer's reported ack delay, Karn's rule,
//!   never below 1.25 times the largest recent round trip, exponential backoff to 500 ms or a
//!   sixteenth of the peer timeout) and early when a later transmission of a fragment sent once
//!   was acknowledged, duplicate suppression, fragmentation of messages larger than one
//!   datagram (1472 bytes by default, safe for a 1500-byte MTU; `AM_UDP_MTU` up to 65507 on
//!   loopback or jumbo frames; the ranks agree on the smallest at start-up), a NewReno
//!   congestion window of at most 128 fragments in flight per peer, sent in bursts of at most
//!   64 between acknowledgements (the receiver acknowledges every 16 at once).
//! - **Batching**: consecutive datagrams to one peer (a window's worth of fragments) go to the
//!   kernel in one `sendmsg` with UDP GSO (`UDP_SEGMENT`), and the receiving socket asks for
//!   UDP GRO, so one read returns a sender's batch; each datagram in it is still authenticated
//!   on its own. While datagrams keep coming, one `recvmmsg` takes up to 8 reads; after an
//!   empty read, the next is a plain `recvmsg` (cheaper when idle). Where the kernel refuses
//!   GSO a batch goes out in one `sendmmsg`; without GRO each read returns one datagram. Socket
//!   buffers of 4 MiB are asked for (the kernel caps them at `net.core.rmem_max`/`wmem_max`).
//!   Datagrams to a peer leave from a socket connected to it (for up to 64 peers per rank and
//!   256 per process; the others share the rank's socket), which spares each send the kernel's
//!   route lookup; peers still send to the rank's own socket, and a datagram's source address
//!   (an ephemeral port, even with `AM_UDP_PORT_BASE`) means nothing to its receiver. A peer's
//!   closed port, reported as `ECONNREFUSED` on the socket connected to it, costs a send made
//!   again and is counted ([`SocketStats::refused`]); it never fails the job.
//! - **Packing**: small messages to one peer share an authenticated datagram (as QUIC frames
//!   share a packet; [`wire`] has the format), so a flood of AM Shorts does not pay a system
//!   call and an AES-GCM pass per message. A message that finds the link to its peer idle
//!   (everything sent to it acknowledged, nothing sent since the last progress point) leaves
//!   at once, alone, as before: a lone round trip waits for nothing. Messages that come
//!   faster (sent while earlier ones are unacknowledged, or several between two progress
//!   points, or while the congestion window is full) wait in one open datagram that fills
//!   up to the MTU and leaves when full, or at the next progress point at the latest: a poll
//!   that has handled everything that arrived (so the replies its handlers send go
//!   together), [`am_core::Transport::wait`], `arm` or the goodbye. Fragments of large
//!   messages, acknowledgements and goodbyes are not held. A program that sends and never
//!   polls keeps its later messages (as it keeps its retransmissions) until it does.
//!   [`proto::Stats::packed_messages`] and [`proto::Stats::packed_datagrams`] count them.
//! - **Flow control** stays in the core (credits). The transport never drops a message it
//!   accepted: its queues are bounded by what was accepted, and a full send queue is
//!   [`am_core::SendError::Busy`]. Where the job's configuration chooses no credits, a udp
//!   rank gets [`DEFAULT_CREDITS`] (128) per peer rather than the core's 32: a round trip
//!   here is ten microseconds or more, and a sender that may have only 32 small messages in
//!   flight would leave the link idle for most of it. Posted atomics
//!   ([`am_core::Node::atomic_nbi`]) travel as one message per target for all that were
//!   queued for it.
//! - **Lost peers**: a peer from which nothing authentic arrived, or which acknowledged none of
//!   the data waiting for it, for `AM_PEER_TIMEOUT_MS` (default 30 s) of this rank's polled
//!   time is lost, never after a retry count. A quiet peer is pinged after a quarter of the
//!   timeout (at most 1 s), and again every sixteenth of it (at most 500 ms) once half has
//!   passed unanswered, so a lossy path does not condemn a live, idle peer. The next poll
//!   returns `PeerLost(r)` once per lost peer; sends to it fail at once. Loss is final
//!   (fencing): datagrams from a lost peer are refused and answered by a fence (at most one per
//!   20 ms, never in answer to a fence), so a rank that comes back after being declared lost
//!   (stopped, descheduled or cut off for longer than the timeout) is refused rather than
//!   half-accepted, and reports its peers lost at once instead of after a timeout of its own. A
//!   rank that drops its transport says goodbye (in order, after its data) and lingers,
//!   bounded, until that is acknowledged, so a finished rank is never mistaken for a dead one;
//!   its peers report the departure (`PeerDeparted`), so waits on replies it owes fail rather
//!   than hang. After its goodbye it acknowledges no more data (it could not deliver it), and
//!   its peers count what it never acknowledged in [`proto::Stats::undelivered`] rather than
//!   dropping it silently. A rank must poll at least once per timeout, or its peers will
//!   declare it lost.
//! - **Rendezvous** ([`Udp::connect`]): through the launcher's key-value store (`amrun`,
//!   MPICH's `mpiexec`, `srun`, Open MPI's `mpirun`), so `mpiexec -n 4 -hosts a,b ./program
//!   --transport udp` needs no extra settings beyond a routable `AM_UDP_BIND`. Without a
//!   launcher, start each rank with `AM_RANK`, `AM_SIZE`, `AM_JOB_ID`, `AM_TRANSPORT=udp`,
//!   `AM_COORD=host:port` and the same job key: rank 0 serves a coordinator there, and every
//!   rank registers with it and gets everyone's addresses back. Ports are ephemeral unless
//!   `AM_UDP_PORT_BASE=P` (rank r binds P+r, for firewalls); `AM_UDP_BIND=ip` picks the
//!   interface (default 127.0.0.1); with a wildcard bind, `AM_UDP_ADVERTISE=ip` (or the host
//!   name's address) is what peers are told.
//! - **Testing aid**: `AM_UDP_FAULTS=drop=0.1,dup=0.01,delay=0.05,seed=7` makes every rank of a
//!   job drop, duplicate and reorder its outgoing datagrams (see [`config::parse_faults`]); a
//!   job must still verify under it, only slower. Not for production.
//!
//! # Security
//!
//! Every datagram's payload is encrypted and its header and payload authenticated (AES-128-GCM
//! under per-direction keys derived from the job key; [`wire::DatagramKey`] argues that no
//! nonce is used twice), and a datagram that fails any check is dropped and counted
//! ([`proto::Stats`]) without any effect on the receiver. What is protected and what is not
//! (replays, earlier runs, other jobs, the `AM_COORD` rendezvous, how the job key reaches the
//! ranks, what an on-path attacker can still do) is the threat model in `SECURITY.md`, beside
//! this crate's `Cargo.toml`.
//!
//! **Several endpoints per process** (`amnet::run_job_endpoints`): each endpoint is a rank of
//! its own, with its own socket, reliability state and key confirmation, and is found through
//! the launcher's key-value store like any rank.
//!
//! What this crate does **not** do: its congestion control is NewReno
//! counted in fragments with a burst limit, no pacing by time (it is meant for cluster
//! networks, not the Internet); it does not let a lost or departed rank rejoin a job; it has no background
//! thread: progress (acks, retransmissions, keepalives) happens inside the owner's polls,
//! sends and [`am_core::Transport::wait`]; it does not place Long payloads itself (the core
//! copies them from the reassembled message).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod error;
pub mod proto;
mod rendezvous;
mod udp;
pub mod wire;

pub use config::UdpConfig;
pub use error::UdpError;
pub use proto::Stats;
pub use rendezvous::PeerAddr;
pub use udp::{SocketStats, Udp, DEFAULT_CREDITS};
pub use wire::{JobKey, KeyError};

am_bootstrap::impl_connect!(
    Udp,
    UdpConfig,
    "udp",
    |_ranks| UdpConfig::from_env(),
    am_bootstrap::ConnectError::from
);
