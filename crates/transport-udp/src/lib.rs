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
//!   UDP GRO, so one read returns a sender's batch; each datagram in it is still
//!   authenticated on its own. While datagrams keep coming, one `recvmmsg` takes up to 8
//!   reads; after an empty read, the next is a plain `recvmsg` (cheaper when idle). Where the
//!   kernel refuses GSO a batch goes out in one `sendmmsg`; without GRO each read returns one
//!   datagram. Socket buffers of 4 MiB are asked for. Datagrams to a peer leave from a socket
//!   connected to it (for up to 64 peers per rank and 256 per process; the others share the
//!   rank's socket), which spares each send the kernel's route lookup; peers still send to the
//!   rank's own socket, and a datagram's source address (an ephemeral port, even with
//!   `AM_UDP_PORT_BASE`) means nothing to its receiver. A peer's closed port, reported as
//!   `ECONNREFUSED` on the socket connected to it, costs a send made again and is counted
//!   ([`SocketStats::refused`]); it never fails the job. A message that is one datagram
//!   is sent at once, alone: the core hands over one message per call and nothing waits, so
//!   a one-way flood of AM Shorts costs one system call per message ([`Udp::socket_stats`]
//!   counts them).
//! - **Flow control** stays in the core (credits). The transport never drops a message it
//!   accepted: its queues are bounded by what was accepted, and a full send queue is
//!   [`am_core::SendError::Busy`].
//! - **Lost peers**: a peer from which nothing authentic arrived, or which acknowledged none of
//!   the data waiting for it, for `AM_PEER_TIMEOUT_MS` (default 30 s) of this rank's polled
//!   time is lost, never after a retry count; quiet links
//!   are kept alive by pings. The next poll returns `PeerLost(r)` once per lost peer; sends to
//!   it fail at once. Loss is final (fencing): datagrams from a lost peer are refused and
//!   answered by a fence (at most one per 20 ms), so a rank that comes back after being
//!   declared lost (stopped, descheduled or cut off for longer than the timeout) is refused
//!   rather than half-accepted, and reports its peers lost at once instead of after a
//!   timeout of its own. A rank that drops its transport says goodbye (in order, after its data)
//!   so a finished rank is never mistaken for a dead one; after its goodbye it acknowledges no
//!   more data (it could not deliver it), and its peers count what it never acknowledged in
//!   [`proto::Stats::undelivered`] rather than dropping it silently. A rank must poll at least
//!   once per timeout, or its peers will declare it lost.
//! - **Rendezvous** ([`Udp::connect`]): through the launcher's key-value store (`amrun`,
//!   `mpiexec`, `srun --mpi=pmi2`), otherwise through a coordinator served by rank 0 at
//!   `AM_COORD=host:port`. Ports are ephemeral unless `AM_UDP_PORT_BASE=P` (rank r binds
//!   P+r); `AM_UDP_BIND=ip` picks the interface (default 127.0.0.1); with a wildcard bind,
//!   `AM_UDP_ADVERTISE=ip` (or the host name's address) is what peers are told.
//! - **Testing aid**: `AM_UDP_FAULTS=drop=0.1,dup=0.01,delay=0.05,seed=7` makes every rank of a
//!   job drop, duplicate and reorder its outgoing datagrams (see [`config::parse_faults`]); a
//!   job must still verify under it, only slower. Not for production.
//!
//! # Threat model
//!
//! **Protected.** Every datagram's payload is encrypted and its whole header and payload carry
//! a 16-byte MAC: AES-128-GCM with the header as associated data (the header stays readable:
//! the receiver needs its addresses to pick the key), under a key of its own direction
//! (derived from the job key, the job id, both ranks and both ranks' epochs) and with its
//! packet number as nonce, so no nonce is ever used twice under one key
//! ([`wire::DatagramKey`] gives the argument). Before the MAC only the length, the
//! format, the job tag and the addresses (which pick the key) are compared; a datagram that
//! fails any check (random bytes, truncated, another job's, forged, misaddressed, from an
//! earlier run of a rank, replayed) is dropped and counted ([`proto::Stats`]), causes no
//! handler call, no segment write, no change to ack, retransmission or credit state, and is
//! never answered. Replays are caught by a 128-wide window of per-transmission packet numbers
//! (a retransmission is a new transmission with a new packet number); each transport start
//! draws a random epoch that both ends put in every datagram and in its key, so datagrams of
//! an earlier run are never taken for current ones. Two jobs on the same hosts and ports never
//! see each other's traffic: their keys and job ids differ. The `AM_COORD` rendezvous is
//! authenticated with the same key (and refuses to run without one), both ways: the
//! coordinator challenges each registration, and answers it at once with a MAC over it (its
//! challenge and the rank's fresh epoch), so a rank that reached some other process holding
//! the port fails within seconds with [`UdpError::CoordinatorNotAuthentic`], and a rank 0 that
//! cannot bind it with [`UdpError::CoordinatorPortTaken`]. A rank is registered once: a second
//! registration of it with another address or epoch (two processes given the same `AM_RANK`)
//! fails every rank's start-up with [`UdpError::ConflictingRegistration`] instead of
//! redirecting its traffic. The key is confirmed at start-up: a rank with another key fails
//! with [`UdpError::KeyMismatch`].
//!
//! **Not protected.** The header is not encrypted: anyone on the path sees ranks, epochs,
//! packet and sequence numbers, acks and message lengths. An on-path attacker can drop or
//! delay datagrams (a denial of service, which ends as `PeerLost`), and a flood of junk costs CPU (at most one MAC check
//! per datagram, none for a datagram that names no current pair of ranks). The key is only as
//! secret as the way it reaches the ranks: `amrun` hands it to the ranks of a udp job only,
//! through a pipe each reads once and closes (`AM_UDP_KEY_FD`), so what a rank starts later
//! finds no key; or a file of the user's own, mode 0600, not a symbolic link, named by
//! `AM_UDP_KEY_FILE`; or `AM_UDP_KEY` set by hand (inherited by whatever the rank starts).
//! When none is given, rank 0 makes one and shares it through the launcher's key-value store
//! (the fallback under `mpiexec` and `srun`): then anyone who can query that store (same user
//! on the same host, or whoever can reach hydra's PMI port) can learn it. A compromised rank
//! or user account of the job is trusted. Traffic analysis (who talks to whom, sizes, timing)
//! is not hidden.
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
pub use udp::{SocketStats, Udp};
pub use wire::{JobKey, KeyError};
