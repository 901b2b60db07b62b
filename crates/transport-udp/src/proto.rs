//! The reliability protocol as a pure state machine: no sockets, no clock of its own (time is
//! passed in, as in quinn-proto), so it runs the same over a real socket and over a simulated
//! lossy network in tests.
//!
//! One [`Engine`] is one rank's view of its links to every other rank. Per directed pair:
//! - messages are cut into fragments, each with a 64-bit sequence number (never wraps in a job);
//! - every transmission gets a fresh 64-bit packet number, so a retransmission is told apart from
//!   a replay: a packet number seen before (window of 128) is dropped unseen;
//! - the receiver acknowledges cumulatively plus 64 selective bits (the first 64 of its
//!   [`WINDOW`] beyond the cumulative ack), piggybacked on its data or in
//!   a standalone ack after [`EngineConfig::ack_delay`] (at once on a gap or a duplicate);
//! - the sender keeps at most a congestion window of fragments in flight (NewReno as in
//!   RFC 9002 section 7, counted in fragments: slow start from [`INITIAL_WINDOW`], halved once
//!   per recovery period on loss, [`MIN_WINDOW`] after persistent timeouts, never above
//!   [`WINDOW`]) and sends at most [`MAX_BURST`] new fragments between two acknowledgements;
//! - it retransmits on a timeout derived from the measured round trip as in RFC 9002 section 5
//!   (each sample less the delay the peer reports having held the acknowledgement, min_rtt,
//!   srtt/rttvar; the timeout is srtt + max(4 rttvar, 1 ms) + the peer's ack delay; Karn's
//!   rule; exponential backoff), and early when a later transmission, of a fragment sent only
//!   once, was acknowledged first;
//! - the receiver buffers at most [`WINDOW`] fragments out of order and delivers whole messages
//!   in order;
//! - small messages to one peer share a datagram (a *packed* datagram, one fragment as far as
//!   the above is concerned: see [`crate::wire`]) when they come faster than they leave: a
//!   message that finds the link idle (everything sent to the peer acknowledged, nothing
//!   queued to it since the last progress point, [`Engine::release`]) leaves at once, alone,
//!   in the format of an unpacked message; the others wait in one open datagram that fills
//!   up to the MTU, and leaves when full or at the next progress point. Messages that find
//!   the congestion window full gather the same way;
//! - a peer is declared lost when nothing authenticated arrived from it for
//!   [`EngineConfig::peer_timeout`] of this engine's own polled time (keepalive pings keep quiet
//!   links alive, more often once half the timeout has passed unanswered), never by a retry
//!   count.
//!
//! Every datagram is authenticated ([`crate::wire`]) and checked before any state changes.
//!
//! [`EngineConfig::ack_delay`]: field@EngineConfig::ack_delay
//! [`EngineConfig::peer_timeout`]: field@EngineConfig::peer_timeout

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use am_core::{Rank, SendError};

use crate::wire::{
    self, Authenticator, DatagramKey, Header, Kind, FLAG_BYE, FLAG_FIRST, FLAG_LAST, FLAG_PACKED,
    FRAME_HEADER_LEN, FRAME_MESSAGE, HEADER_LEN, MAC_LEN, OVERHEAD,
};

/// Fragments in flight per peer at most (the largest congestion window), and the receiver's
/// reordering window. Selective acks report the first 64 of it beyond the cumulative ack
/// (what lies further is acknowledged cumulatively once the holes before it fill).
pub const WINDOW: u64 = 128;
/// Congestion window of a fresh link, in fragments (RFC 9002's ten datagrams).
pub const INITIAL_WINDOW: u64 = 10;
/// Smallest congestion window, in fragments (after persistent timeouts).
pub const MIN_WINDOW: u64 = 2;
/// New fragments sent toward one peer between two acknowledgements that make progress, at
/// most: a window opened wide at once (by a large send, or the end of a pause) goes out in
/// bursts clocked by the acknowledgements, not all at once into the peer's socket buffer.
/// Four times the receiver's ack interval: the acks of a burst's first fragments come back
/// while its last are still on the way, so the sender keeps sending while the receiver
/// works, instead of the two taking turns.
pub const MAX_BURST: u32 = 4 * ACK_EVERY;
/// How long a round-trip sample counts toward the largest recent one (two such periods).
const RTT_MAX_PERIOD: Duration = Duration::from_secs(1);
/// Timer granularity: the least variance allowed for in the retransmission timeout.
const GRANULARITY: Duration = Duration::from_millis(1);
/// Packet numbers remembered below the highest seen, for replay detection.
const PN_WINDOW: u64 = 128;
/// Received fragments that make the receiver acknowledge at once rather than after a delay.
const ACK_EVERY: u32 = 16;
/// Recycled datagram buffers kept.
const POOL_MAX: usize = 1024;
/// Fences sent to one lost peer at most this often: one answers its first datagram, and a
/// lost fence is repeated for its next retransmission, without answering a flood one for one.
const FENCE_INTERVAL: Duration = Duration::from_millis(20);

/// Tunables of the protocol.
///
/// Change the defaults with the setters named after the fields:
/// `EngineConfig::default().mtu(9000).peer_timeout(Duration::from_secs(5))`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineConfig {
    /// Largest datagram (UDP payload) in bytes, header and MAC included.
    pub mtu: usize,
    /// Largest message (AM head plus payload) accepted for sending or reassembly.
    pub max_message: usize,
    /// Fragments that may wait per peer (unacknowledged or not yet sent); beyond that a send
    /// reports [`SendError::Busy`]. A message larger than this is still accepted onto an empty
    /// queue.
    pub send_queue: usize,
    /// A peer silent this long (counted while this engine is polled) is declared lost.
    pub peer_timeout: Duration,
    /// Retransmission timeout before any round trip was measured.
    pub initial_rto: Duration,
    /// Floor of the retransmission timeout.
    pub min_rto: Duration,
    /// Ceiling of the retransmission timeout, backoff included. The ceiling in force is lowered
    /// further to a sixteenth of [`EngineConfig::peer_timeout`] (see
    /// [`EngineConfig::rto_ceiling`]), so that at least sixteen retransmissions fit in the time
    /// after which unacknowledged data condemns a peer.
    ///
    /// [`EngineConfig::peer_timeout`]: field@EngineConfig::peer_timeout
    pub max_rto: Duration,
    /// Longest delay of a standalone acknowledgement.
    pub ack_delay: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            mtu: 1472,
            max_message: am_core::wire::MAX_HEAD_LEN + (256 << 10),
            send_queue: 1024,
            peer_timeout: Duration::from_secs(30),
            initial_rto: Duration::from_millis(20),
            min_rto: Duration::from_millis(5),
            max_rto: Duration::from_millis(500),
            ack_delay: Duration::from_millis(1),
        }
    }
}

impl EngineConfig {
    /// The defaults, as [`EngineConfig::default`]; change them with the setters below.
    pub fn new() -> EngineConfig {
        EngineConfig::default()
    }

    /// With datagrams of at most this many bytes, header and MAC included.
    #[must_use]
    pub fn mtu(mut self, mtu: usize) -> EngineConfig {
        self.mtu = mtu;
        self
    }

    /// With messages of at most this many bytes, AM head and payload together.
    #[must_use]
    pub fn max_message(mut self, max_message: usize) -> EngineConfig {
        self.max_message = max_message;
        self
    }

    /// With at most this many fragments waiting per peer.
    #[must_use]
    pub fn send_queue(mut self, send_queue: usize) -> EngineConfig {
        self.send_queue = send_queue;
        self
    }

    /// Declaring a peer lost after it is silent this long.
    #[must_use]
    pub fn peer_timeout(mut self, peer_timeout: Duration) -> EngineConfig {
        self.peer_timeout = peer_timeout;
        self
    }

    /// With this retransmission timeout before any round trip is measured.
    #[must_use]
    pub fn initial_rto(mut self, initial_rto: Duration) -> EngineConfig {
        self.initial_rto = initial_rto;
        self
    }

    /// With a retransmission timeout of at least this.
    #[must_use]
    pub fn min_rto(mut self, min_rto: Duration) -> EngineConfig {
        self.min_rto = min_rto;
        self
    }

    /// With a retransmission timeout of at most this, backoff included.
    #[must_use]
    pub fn max_rto(mut self, max_rto: Duration) -> EngineConfig {
        self.max_rto = max_rto;
        self
    }

    /// Delaying a standalone acknowledgement at most this long.
    #[must_use]
    pub fn ack_delay(mut self, ack_delay: Duration) -> EngineConfig {
        self.ack_delay = ack_delay;
        self
    }
}

impl EngineConfig {
    /// Payload bytes per datagram.
    pub fn fragment_payload(&self) -> usize {
        self.mtu.saturating_sub(OVERHEAD).max(1)
    }

    /// The ceiling of the backed-off retransmission timeout: [`EngineConfig::max_rto`], but at
    /// most a sixteenth of [`EngineConfig::peer_timeout`], and never below
    /// [`EngineConfig::min_rto`]. With a ceiling near the peer timeout only a few retransmissions
    /// fit before a stalled fragment condemns its peer: at 30% loss each way a round trip fails
    /// half the time, and nine rounds (a 2 s timeout, 500 ms ceiling) all fail one time in 400.
    ///
    /// [`EngineConfig::max_rto`]: field@EngineConfig::max_rto
    /// [`EngineConfig::min_rto`]: field@EngineConfig::min_rto
    /// [`EngineConfig::peer_timeout`]: field@EngineConfig::peer_timeout
    pub fn rto_ceiling(&self) -> Duration {
        self.max_rto.min(self.peer_timeout / 16).max(self.min_rto)
    }

    /// How long a peer may be silent before it is pinged.
    pub fn keepalive(&self) -> Duration {
        (self.peer_timeout / 4).clamp(Duration::from_millis(1), Duration::from_secs(1))
    }
}

/// Counters of what the engine did and what it refused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Datagrams handed to the network (first transmissions, retransmissions, acks, pings).
    pub datagrams_sent: u64,
    /// Datagrams accepted (authenticated and fresh).
    pub datagrams_accepted: u64,
    /// Data fragments retransmitted.
    pub retransmits: u64,
    /// Congestion window reductions (a loss in a new recovery period, or persistent timeouts).
    pub congestion_events: u64,
    /// Of those, retransmitted early because a later transmission was acknowledged.
    pub fast_retransmits: u64,
    /// Retransmission timeouts that fired.
    pub timeouts: u64,
    /// Standalone acks sent.
    pub acks_sent: u64,
    /// Keepalive pings sent.
    pub pings_sent: u64,
    /// Authentic retransmitted fragments that had already arrived (acknowledged again, dropped).
    pub duplicates: u64,
    /// Messages delivered in order.
    pub delivered: u64,
    /// Dropped: shorter than a header plus MAC, or longer than the MTU.
    pub dropped_truncated: u64,
    /// Dropped: not our version or impossible header fields.
    pub dropped_malformed: u64,
    /// Dropped: another job's tag.
    pub dropped_wrong_job: u64,
    /// Dropped: the MAC did not verify (forged, corrupted, or another job's key).
    pub dropped_bad_mac: u64,
    /// Dropped: not addressed from a rank of this job in its current epoch to this rank in
    /// its own (misdirected, from an earlier run of a rank, or forged). Checked before the
    /// MAC, whose key is chosen by these fields.
    pub dropped_misaddressed: u64,
    /// Dropped: a packet number already seen or too old (replay).
    pub dropped_replayed: u64,
    /// Dropped: from a peer declared lost (each may be answered by a fence, see
    /// [`Stats::fences_sent`]).
    pub dropped_from_lost: u64,
    /// Fences sent: answers to datagrams from a peer declared lost, telling it that this rank
    /// refuses it, so that it gives this rank up at once instead of after a peer timeout.
    pub fences_sent: u64,
    /// Peers that fenced this rank (it had been declared lost by them, e.g. after it was
    /// stopped or descheduled for longer than the peer timeout): each was declared lost here
    /// at once.
    pub fenced: u64,
    /// Fragments to a peer that said goodbye which it never acknowledged within the peer
    /// timeout (it closed before receiving them): dropped, and reported here rather than
    /// silently.
    pub undelivered: u64,
    /// Data fragments refused (not acknowledged, not delivered) because this engine was
    /// closing: their senders see them unacknowledged, count them in
    /// [`Stats::undelivered`], and fail requests waiting on this rank as departed.
    pub refused_closing: u64,
    /// Dropped: an authentic peer broke the protocol (sequence beyond the window, acks for
    /// unsent data, bad fragment chain, a malformed frame). Never happens between correct peers.
    pub protocol_violations: u64,
    /// Packed datagrams sent for the first time (several messages in one).
    pub packed_datagrams: u64,
    /// Messages that left in a packed datagram.
    pub packed_messages: u64,
}

impl Stats {
    /// Every datagram dropped before it could change anything.
    pub fn rejected(&self) -> u64 {
        self.dropped_truncated
            + self.dropped_malformed
            + self.dropped_wrong_job
            + self.dropped_bad_mac
            + self.dropped_misaddressed
            + self.dropped_replayed
            + self.dropped_from_lost
    }
}

/// What an incoming datagram led to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A whole message from `src` is `bytes[range]` of the datagram just given: deliver it from
    /// there (zero copy) before giving the engine anything else.
    Deliver {
        /// The sender.
        src: Rank,
        /// Where the message lies in the datagram.
        range: std::ops::Range<usize>,
    },
    /// Accepted; any completed messages wait in [`Engine::pop_message`].
    Accepted,
    /// Dropped and counted; nothing changed.
    Rejected,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PeerState {
    Live,
    /// Declared lost: sends fail, its datagrams are dropped (and answered by a fence).
    Lost,
    /// Said goodbye: sends fail, but its datagrams are still acknowledged so it can leave.
    Departed,
}

/// A fragment kept until acknowledged.
struct Sent {
    /// The whole datagram: header space, payload, MAC space.
    buf: Vec<u8>,
    flags: u8,
    msg_len: u32,
    transmissions: u32,
    sent_at: Option<Instant>,
    last_pn: u64,
    acked: bool,
    queued: bool,
}

/// A fragment's payload: in the datagram just received (copied once, into the message being
/// reassembled), or held since it came out of order.
enum Frag<'a> {
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

impl Frag<'_> {
    fn into_vec(self) -> Vec<u8> {
        match self {
            Frag::Borrowed(b) => b.to_vec(),
            Frag::Owned(v) => v,
        }
    }
}

impl std::ops::Deref for Frag<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Frag::Borrowed(b) => b,
            Frag::Owned(v) => v,
        }
    }
}

/// A fragment received out of order.
struct Held {
    flags: u8,
    msg_len: u32,
    data: Vec<u8>,
}

struct Peer {
    epoch: u64,
    state: PeerState,
    /// The MAC keys of the two directions, this rank to the peer and back (derived from both
    /// epochs: see [`DatagramKey`] for why no nonce repeats under one).
    send_key: DatagramKey,
    recv_key: DatagramKey,
    // Send side.
    next_seq: u64,
    /// Lowest unacknowledged sequence number; `sent[i]` is `base + i`.
    base: u64,
    sent: VecDeque<Sent>,
    next_pn: u64,
    srtt: Option<Duration>,
    rttvar: Duration,
    min_rtt: Option<Duration>,
    /// The largest round-trip sample of the current and the previous [`RTT_MAX_PERIOD`],
    /// and when the current period began: a peer that is sometimes descheduled (more ranks
    /// than cores) answers late now and then, and the timeout must not fire on that.
    rtt_max: (Duration, Duration, Option<Instant>),
    rto: Duration,
    /// Congestion window and slow-start threshold, in fragments.
    cwnd: u64,
    ssthresh: u64,
    /// Fragments acknowledged toward the next window increase (congestion avoidance).
    ca_acked: u64,
    /// Losses of transmissions with a packet number below it belong to the current recovery
    /// period: they do not shrink the window again, and their acks do not grow it.
    recovery_pn: u64,
    /// Fragments queued for sending since the last acknowledgement that made progress.
    burst: u32,
    /// Fragments queued or transmitted and not acknowledged: what the congestion window
    /// limits (fragments acknowledged selectively beyond a hole do not count).
    flight: u64,
    /// Every fragment below it was queued for sending at least once (the ones from it on are
    /// waiting for the window, or held for packing).
    fresh_from: u64,
    /// A data datagram was queued to it since the last progress point: a small message sent
    /// now waits, to be packed with the ones after it.
    busy_since_release: bool,
    /// It is in the engine's list of peers with messages held for packing.
    holding: bool,
    backoff: u32,
    rto_deadline: Option<Instant>,
    // Receive side.
    /// Every sequence number below it was received.
    recv_next: u64,
    /// Bit i: `recv_next + i` is held out of order.
    recv_mask: u128,
    held: Vec<Option<Held>>,
    reasm: Option<(Vec<u8>, usize)>,
    ready_count: usize,
    pn_max: u64,
    pn_seen: u128,
    /// The highest packet number of a data datagram received, and when it arrived (for the
    /// ack delay).
    newest_data: Option<(u64, Instant)>,
    unacked_recv: u32,
    ack_owed: bool,
    ack_deadline: Option<Instant>,
    // Liveness.
    /// When something authentic last came from it (`None`: not since the engine started).
    heard_at: Option<Instant>,
    /// The engine's [`Engine::absence`] at `heard_at`.
    heard_absence: Duration,
    last_ping: Option<Instant>,
    /// When a fence was last sent to it (it is lost and still sending).
    last_fence: Option<Instant>,
    /// Since when data to it has waited for an acknowledgement with none arriving (and the
    /// engine's absence then): pings and acks of nothing new do not reset it, so a peer that
    /// answers pings but never acknowledges data (datagrams it cannot receive) is lost.
    stalled_since: Option<(Instant, Duration)>,
}

impl Peer {
    fn new(epoch: u64, keys: (DatagramKey, DatagramKey), rto: Duration) -> Peer {
        Peer {
            epoch,
            state: PeerState::Live,
            send_key: keys.0,
            recv_key: keys.1,
            next_seq: 0,
            base: 0,
            sent: VecDeque::new(),
            next_pn: 1,
            srtt: None,
            rttvar: Duration::ZERO,
            min_rtt: None,
            rtt_max: (Duration::ZERO, Duration::ZERO, None),
            rto,
            cwnd: INITIAL_WINDOW,
            ssthresh: u64::MAX,
            ca_acked: 0,
            recovery_pn: 0,
            burst: 0,
            flight: 0,
            fresh_from: 0,
            busy_since_release: false,
            holding: false,
            backoff: 0,
            rto_deadline: None,
            recv_next: 0,
            recv_mask: 0,
            held: (0..WINDOW).map(|_| None).collect(),
            reasm: None,
            ready_count: 0,
            pn_max: 0,
            pn_seen: 0,
            newest_data: None,
            unacked_recv: 0,
            ack_owed: false,
            ack_deadline: None,
            heard_at: None,
            heard_absence: Duration::ZERO,
            last_ping: None,
            last_fence: None,
            stalled_since: None,
        }
    }

    fn sack(&self) -> u64 {
        (self.recv_mask >> 1) as u64
    }

    fn fresh_pn(&self, pn: u64) -> bool {
        if pn == 0 {
            return false;
        }
        if pn > self.pn_max {
            return true;
        }
        let back = self.pn_max - pn;
        back < PN_WINDOW && self.pn_seen & (1u128 << back) == 0
    }

    fn record_pn(&mut self, pn: u64) {
        if pn > self.pn_max {
            let shift = pn - self.pn_max;
            self.pn_seen = if shift >= 128 {
                0
            } else {
                self.pn_seen << shift
            };
            self.pn_seen |= 1;
            self.pn_max = pn;
        } else {
            self.pn_seen |= 1u128 << (self.pn_max - pn);
        }
    }

    fn current_rto(&self, cfg: &EngineConfig) -> Duration {
        let ceiling = cfg.rto_ceiling();
        let backed = self
            .rto
            .checked_mul(1u32 << self.backoff.min(16))
            .unwrap_or(ceiling);
        backed.min(ceiling)
    }

    /// Fragments that may be in flight: the congestion window, within the receiver's.
    fn window(&self) -> u64 {
        self.cwnd.clamp(MIN_WINDOW, WINDOW)
    }

    /// A loss of a transmission numbered `pn`: the window halves, once per recovery period.
    fn on_congestion(&mut self, pn: u64, stats: &mut Stats) {
        if pn < self.recovery_pn {
            return;
        }
        self.ssthresh = (self.cwnd / 2).max(MIN_WINDOW);
        self.cwnd = self.ssthresh;
        self.ca_acked = 0;
        self.recovery_pn = self.next_pn;
        stats.congestion_events += 1;
    }

    fn has_unacked(&self) -> bool {
        // Only the first WINDOW fragments can have been transmitted.
        self.sent
            .iter()
            .take(WINDOW as usize)
            .any(|s| !s.acked && s.transmissions > 0)
    }
}

#[derive(Debug, Clone, Copy)]
enum Out {
    Data(Rank, u64),
    Ack(Rank),
    Ping(Rank),
    Fence(Rank),
}

/// One rank's reliability state toward every other rank. See the [module docs](self).
pub struct Engine {
    cfg: EngineConfig,
    me: Rank,
    epoch: u64,
    job_tag: u64,
    peers: Vec<Peer>,
    outbox: VecDeque<Out>,
    ready: VecDeque<(Rank, Vec<u8>)>,
    lost: VecDeque<Rank>,
    /// Peers with messages held for packing, and peers that were sent data since the last
    /// progress point ([`Engine::release`]).
    held: Vec<Rank>,
    recent: Vec<Rank>,
    /// Authentic peers' malformed frames, for [`Engine::poll_misbehaved`].
    misbehaved: VecDeque<(Rank, wire::FrameError)>,
    pool: Vec<Vec<u8>>,
    /// Buffers freed by an acknowledgement, on their way to the pool.
    freed: Vec<Vec<u8>>,
    scratch: Vec<u8>,
    stats: Stats,
    wake_at: Option<Instant>,
    last_tick: Option<Instant>,
    /// Time this engine was not polled (beyond one keepalive per gap): not counted as silence.
    absence: Duration,
    /// [`Engine::close`] was called: data that arrives now cannot be delivered, and is refused.
    closing: bool,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("me", &self.me)
            .field("size", &self.peers.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// The engine of rank `me`, whose epoch is `epochs[me]`; `epochs[r]` is rank r's epoch as
    /// learned at rendezvous. This rank's epoch must be fresh (random, drawn for this engine):
    /// with the ranks, it keys the MAC of every datagram, whose nonces are this engine's packet
    /// numbers ([`DatagramKey`]).
    ///
    /// # Panics
    /// If `me` is not below `epochs.len()`.
    pub fn new(cfg: EngineConfig, me: Rank, epochs: &[u64], auth: Authenticator) -> Engine {
        assert!((me as usize) < epochs.len(), "rank {me} out of range");
        let rto = cfg.initial_rto;
        let mine = epochs[me as usize];
        // Each direction's key once per peer, not per datagram. (The pair for `me` itself is
        // never used: nothing is sent to it through the engine, and datagrams claiming to come
        // from it are refused before their MAC is checked.)
        let keys = |r: Rank, theirs: u64| {
            (
                auth.datagram_key(me, r, mine, theirs),
                auth.datagram_key(r, me, theirs, mine),
            )
        };
        Engine {
            me,
            epoch: mine,
            job_tag: auth.job_tag(),
            peers: epochs
                .iter()
                .enumerate()
                .map(|(r, &e)| Peer::new(e, keys(r as Rank, e), rto))
                .collect(),
            outbox: VecDeque::new(),
            ready: VecDeque::new(),
            lost: VecDeque::new(),
            held: Vec::new(),
            recent: Vec::new(),
            misbehaved: VecDeque::new(),
            pool: Vec::new(),
            freed: Vec::new(),
            scratch: vec![0; OVERHEAD],
            stats: Stats::default(),
            wake_at: None,
            last_tick: None,
            absence: Duration::ZERO,
            closing: false,
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The counters.
    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.me
    }

    /// When [`Engine::handle_timeout`] must run next, if anything is scheduled.
    pub fn next_timeout(&self) -> Option<Instant> {
        self.wake_at
    }

    fn wake(&mut self, at: Instant) {
        self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
    }

    fn buffer(&mut self, len: usize) -> Vec<u8> {
        let mut b = self.pool.pop().unwrap_or_default();
        b.clear();
        b.resize(len, 0);
        b
    }

    /// Gives a buffer back for reuse (messages from [`Engine::pop_message`]).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if buf.capacity() > 0
            && self.pool.len() < POOL_MAX
            && buf.capacity() <= 2 * self.cfg.mtu.max(4096)
        {
            self.pool.push(buf);
        }
    }

    /// Whether sends to `peer` fail because it was lost or left.
    pub fn is_gone(&self, peer: Rank) -> bool {
        self.peers
            .get(peer as usize)
            .is_none_or(|p| p.state != PeerState::Live)
    }

    /// Queues a message (`head` then `payload`) to `dest`; [`Engine::transmit`] sends it, or,
    /// if it is small and the link is not idle, after the next [`Engine::release`] (or once
    /// the datagram it joins is full).
    ///
    /// Fails at once with [`SendError::PeerLost`] if `dest` was lost, [`SendError::PeerDeparted`]
    /// if it said goodbye, with [`SendError::TooLarge`] beyond [`EngineConfig::max_message`], and with
    /// [`SendError::Busy`] when the queue to `dest` is full (nothing was queued).
    ///
    /// [`EngineConfig::max_message`]: field@EngineConfig::max_message
    pub fn send(
        &mut self,
        now: Instant,
        dest: Rank,
        head: &[u8],
        payload: &[u8],
    ) -> Result<(), SendError> {
        if self.send_packed(dest, head, payload) {
            return Ok(());
        }
        self.send_new(now, dest, head, payload)
    }

    /// [`Engine::send`] of a message that did not join an open datagram
    /// ([`Engine::send_packed`] said no): in datagrams of its own.
    pub(crate) fn send_new(
        &mut self,
        now: Instant,
        dest: Rank,
        head: &[u8],
        payload: &[u8],
    ) -> Result<(), SendError> {
        self.send_flags(now, dest, head, payload, 0)
    }

    /// Whether a message of `total` bytes, with data flags `extra`, may share a datagram:
    /// room for it as a frame and for the frame of the message it may join, and not a
    /// goodbye (nothing may follow one).
    fn packable(&self, total: usize, extra: u8) -> bool {
        let room = self.cfg.fragment_payload().min(wire::FRAME_MAX);
        extra == 0 && total > 0 && total + 2 * FRAME_HEADER_LEN <= room
    }

    /// Queues a message in datagrams of its own (one, held open for the ones after it, if
    /// it is small and the link is not idle).
    fn send_flags(
        &mut self,
        now: Instant,
        dest: Rank,
        head: &[u8],
        payload: &[u8],
        extra: u8,
    ) -> Result<(), SendError> {
        if dest == self.me || dest as usize >= self.peers.len() {
            return Err(SendError::InvalidRank(dest));
        }
        match self.peers[dest as usize].state {
            PeerState::Live => {}
            PeerState::Departed => return Err(SendError::PeerDeparted(dest)),
            _ => return Err(SendError::PeerLost(dest)),
        }
        let total = head.len() + payload.len();
        if total > self.cfg.max_message {
            return Err(SendError::TooLarge(total));
        }
        let frag = self.cfg.fragment_payload();
        let packable = self.packable(total, extra);
        let nfrags = total.div_ceil(frag).max(1);
        let queued = self.peers[dest as usize].sent.len();
        // A goodbye always fits: it must not be lost to back-pressure.
        if extra & FLAG_BYE == 0 && queued > 0 && queued + nfrags > self.cfg.send_queue {
            return Err(SendError::Busy);
        }
        let mtu = self.cfg.mtu;
        let mut at = 0usize;
        for i in 0..nfrags {
            let len = frag.min(total - at);
            let mut buf = self.buffer(HEADER_LEN + len + MAC_LEN);
            if packable {
                // Others may join it: room for them now, not a reallocation each.
                buf.reserve(mtu.saturating_sub(buf.len()));
            }
            // Copy [at, at+len) of head ++ payload.
            let body = &mut buf[HEADER_LEN..HEADER_LEN + len];
            let mut done = 0;
            if at < head.len() {
                let n = (head.len() - at).min(len);
                body[..n].copy_from_slice(&head[at..at + n]);
                done = n;
            }
            if done < len {
                let p = at + done - head.len();
                body[done..].copy_from_slice(&payload[p..p + len - done]);
            }
            let mut flags = extra;
            if i == 0 {
                flags |= FLAG_FIRST;
            }
            if i == nfrags - 1 {
                flags |= FLAG_LAST;
            }
            let peer = &mut self.peers[dest as usize];
            if peer.sent.is_empty() {
                peer.stalled_since = Some((now, self.absence));
            }
            peer.next_seq += 1;
            peer.sent.push_back(Sent {
                buf,
                flags,
                msg_len: if i == 0 { total as u32 } else { 0 },
                transmissions: 0,
                sent_at: None,
                last_pn: 0,
                acked: false,
                queued: false,
            });
            at += len;
        }
        let p = &mut self.peers[dest as usize];
        if packable && (p.busy_since_release || p.flight > 0) {
            // Held open for the messages after it: what came before it (full) goes now.
            let upto = p.next_seq - 1;
            if !p.holding {
                p.holding = true;
                self.held.push(dest);
            }
            self.queue_window(dest, upto);
        } else {
            self.queue_window(dest, u64::MAX);
        }
        Ok(())
    }

    /// [`Engine::send`] of a message that joins a datagram held open for `dest`, without the
    /// time (which only a new datagram needs): whether it did. False changes nothing; the
    /// message is then for [`Engine::send`].
    pub fn send_packed(&mut self, dest: Rank, head: &[u8], payload: &[u8]) -> bool {
        let total = head.len() + payload.len();
        dest != self.me
            && self
                .peers
                .get(dest as usize)
                .is_some_and(|p| p.state == PeerState::Live)
            && total <= self.cfg.max_message
            && self.packable(total, 0)
            && self.append(dest, head, payload)
    }

    /// Adds a small message to the datagram held open for `dest`, if there is one with room:
    /// the last one queued to it, never handed to the network yet, one message or packed.
    fn append(&mut self, dest: Rank, head: &[u8], payload: &[u8]) -> bool {
        let frag = self.cfg.fragment_payload();
        let p = &mut self.peers[dest as usize];
        let Some(s) = p.sent.back_mut() else {
            return false;
        };
        let lone = s.flags == FLAG_FIRST | FLAG_LAST;
        if s.transmissions > 0 || s.queued || !(lone || s.flags == FLAG_PACKED) {
            return false;
        }
        let body = s.buf.len() - OVERHEAD;
        let grown = body
            + usize::from(lone) * FRAME_HEADER_LEN
            + FRAME_HEADER_LEN
            + head.len()
            + payload.len();
        if grown > frag {
            return false;
        }
        s.buf.truncate(HEADER_LEN + body);
        if lone {
            // Its message becomes the first frame.
            let len = (body as u16).to_le_bytes();
            s.buf
                .splice(HEADER_LEN..HEADER_LEN, [FRAME_MESSAGE, len[0], len[1]]);
            s.flags = FLAG_PACKED;
            s.msg_len = 0;
            self.stats.packed_messages += 1;
        }
        wire::push_frame(&mut s.buf, head, payload);
        s.buf.resize(s.buf.len() + MAC_LEN, 0);
        self.stats.packed_messages += 1;
        true
    }

    /// Queues for sending, in order, the fragments to `dest` below sequence number `upto`
    /// never queued before, as far as the window and the burst limit allow.
    fn queue_window(&mut self, dest: Rank, upto: u64) {
        let p = &mut self.peers[dest as usize];
        let from = p.fresh_from.max(p.base);
        let limit = (p.base + WINDOW).min(p.next_seq).min(upto);
        let mut seq = from;
        while seq < limit && p.burst < MAX_BURST && p.flight < p.window() {
            let s = &mut p.sent[(seq - p.base) as usize];
            if s.transmissions == 0 && !s.queued {
                s.queued = true;
                p.burst += 1;
                p.flight += 1;
                self.outbox.push_back(Out::Data(dest, seq));
            }
            seq += 1;
        }
        p.fresh_from = seq;
        if seq > from && !p.busy_since_release {
            p.busy_since_release = true;
            self.recent.push(dest);
        }
    }

    /// A progress point (a poll that handled what had arrived, or a wait): every message
    /// held for packing is queued, within each peer's window, and the next small message to
    /// each peer leaves at once again.
    pub fn release(&mut self) {
        if self.recent.is_empty() && self.held.is_empty() {
            return;
        }
        // Cleared first: what the held messages' queueing marks belongs to the next period.
        for &r in &self.recent {
            self.peers[r as usize].busy_since_release = false;
        }
        self.recent.clear();
        let mut held = std::mem::take(&mut self.held);
        for &r in &held {
            self.peers[r as usize].holding = false;
            if self.peers[r as usize].state != PeerState::Lost {
                self.queue_window(r, u64::MAX);
            }
        }
        held.clear();
        self.held = held;
    }

    /// True while messages are held for packing ([`Engine::release`] sends them).
    pub fn has_held(&self) -> bool {
        !self.held.is_empty()
    }

    /// The next malformed frame an authentic peer sent (a misbehaviour: the frames after it
    /// in its datagram were not delivered).
    pub fn poll_misbehaved(&mut self) -> Option<(Rank, wire::FrameError)> {
        self.misbehaved.pop_front()
    }

    /// Says goodbye to every live peer: an empty message after everything already queued.
    /// Afterwards, [`Engine::is_flushed`] tells when the goodbyes (and all data) were
    /// acknowledged.
    ///
    /// From then on, data fragments that arrive (other than goodbyes) are refused: neither
    /// acknowledged nor delivered, so their senders learn they were not received rather
    /// than believing them delivered.
    pub fn close(&mut self, now: Instant) {
        self.closing = true;
        for r in 0..self.peers.len() as Rank {
            if r != self.me && self.peers[r as usize].state == PeerState::Live {
                let _ = self.send_flags(now, r, &[], &[], FLAG_BYE);
            }
        }
    }

    /// Queues every acknowledgement still owed, delayed or not (before a socket closes).
    pub fn ack_all(&mut self) {
        for r in 0..self.peers.len() {
            let p = &mut self.peers[r];
            if p.ack_owed && p.state != PeerState::Lost {
                p.ack_deadline = None;
                self.outbox.push_back(Out::Ack(r as Rank));
            }
        }
    }

    /// True when nothing sent to a live peer waits for an acknowledgement.
    pub fn is_flushed(&self) -> bool {
        self.peers
            .iter()
            .all(|p| p.state != PeerState::Live || p.sent.is_empty())
    }

    /// True when at most goodbyes wait for acknowledgement: all data was acknowledged.
    pub fn only_goodbyes_pending(&self) -> bool {
        self.peers.iter().all(|p| {
            p.state != PeerState::Live || p.sent.iter().all(|s| s.acked || s.flags & FLAG_BYE != 0)
        })
    }

    /// True once `peer` said goodbye.
    pub fn has_departed(&self, peer: Rank) -> bool {
        self.peers
            .get(peer as usize)
            .is_some_and(|p| p.state == PeerState::Departed)
    }

    /// The next peer declared lost (each peer at most once).
    pub fn poll_lost(&mut self) -> Option<Rank> {
        self.lost.pop_front()
    }

    /// True if datagrams are due to be sent ([`Engine::transmit`]): an acknowledgement owed
    /// at once, fragments an acknowledgement let go. Worth sending before reading on.
    pub fn has_output(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// True if a whole message waits in [`Engine::pop_message`].
    pub fn has_message(&self) -> bool {
        !self.ready.is_empty()
    }

    /// The next reassembled message, in order per sender. Give the buffer back with
    /// [`Engine::recycle`] when done.
    pub fn pop_message(&mut self) -> Option<(Rank, Vec<u8>)> {
        let (src, m) = self.ready.pop_front()?;
        self.peers[src as usize].ready_count -= 1;
        self.stats.delivered += 1;
        Some((src, m))
    }

    /// Hands every datagram due to `sink(dest, bytes)`: first transmissions, retransmissions,
    /// acks and pings. A datagram the sink fails to send counts as lost on the network.
    pub fn transmit(&mut self, now: Instant, sink: &mut dyn FnMut(Rank, &[u8])) {
        while let Some(out) = self.outbox.pop_front() {
            match out {
                Out::Data(dest, seq) => self.transmit_data(now, dest, seq, sink),
                Out::Ack(dest) => {
                    if self.peers[dest as usize].ack_owed {
                        self.transmit_control(now, dest, Kind::Ack, sink);
                        self.stats.acks_sent += 1;
                    }
                }
                Out::Ping(dest) => {
                    if self.peers[dest as usize].state == PeerState::Live {
                        self.transmit_control(now, dest, Kind::Ping, sink);
                        self.stats.pings_sent += 1;
                    }
                }
                Out::Fence(dest) => {
                    if self.peers[dest as usize].state == PeerState::Lost {
                        self.transmit_control(now, dest, Kind::Fence, sink);
                        self.stats.fences_sent += 1;
                    }
                }
            }
        }
    }

    fn header(&mut self, now: Instant, dest: Rank, kind: Kind) -> Header {
        let job_tag = self.job_tag;
        let (me, epoch) = (self.me, self.epoch);
        let p = &mut self.peers[dest as usize];
        let pn = p.next_pn;
        p.next_pn += 1;
        // Piggybacked: whatever ack was owed is sent now.
        p.ack_owed = false;
        p.unacked_recv = 0;
        p.ack_deadline = None;
        let (newest_pn, ack_delay_us) = p.newest_data.map_or((0, 0), |(pn, t)| {
            let us = now.saturating_duration_since(t).as_micros();
            (pn, u32::try_from(us).unwrap_or(u32::MAX))
        });
        Header {
            kind,
            flags: 0,
            job_tag,
            src: me,
            dst: dest,
            src_epoch: epoch,
            dst_epoch: p.epoch,
            pn,
            ack: p.recv_next,
            sack: p.sack(),
            seq: 0,
            msg_len: 0,
            newest_pn,
            ack_delay_us,
        }
    }

    fn transmit_control(
        &mut self,
        now: Instant,
        dest: Rank,
        kind: Kind,
        sink: &mut dyn FnMut(Rank, &[u8]),
    ) {
        let h = self.header(now, dest, kind);
        let mut buf = std::mem::take(&mut self.scratch);
        h.write(&mut buf);
        self.peers[dest as usize].send_key.seal(&mut buf);
        sink(dest, &buf);
        self.scratch = buf;
        self.stats.datagrams_sent += 1;
    }

    fn transmit_data(
        &mut self,
        now: Instant,
        dest: Rank,
        seq: u64,
        sink: &mut dyn FnMut(Rank, &[u8]),
    ) {
        let p = &self.peers[dest as usize];
        if p.state == PeerState::Lost || seq < p.base {
            return;
        }
        let idx = (seq - p.base) as usize;
        match p.sent.get(idx) {
            Some(s) if !s.acked => {}
            _ => return,
        }
        let mut h = self.header(now, dest, Kind::Data);
        let rto = self.peers[dest as usize].current_rto(&self.cfg);
        let p = &mut self.peers[dest as usize];
        let s = &mut p.sent[idx];
        if s.transmissions > 0 {
            // Sent before, so encrypted under its last packet number: back to the plaintext
            // first, as a retransmission is sealed again under a new one.
            let opened = p.send_key.open(&mut s.buf);
            assert!(
                opened,
                "a datagram this engine sealed and kept opens under its key"
            );
        }
        h.flags = s.flags;
        h.seq = seq;
        h.msg_len = s.msg_len;
        h.write(&mut s.buf);
        p.send_key.seal(&mut s.buf);
        sink(dest, &s.buf);
        if s.transmissions > 0 {
            self.stats.retransmits += 1;
        } else if s.flags == FLAG_PACKED {
            self.stats.packed_datagrams += 1;
        }
        s.transmissions += 1;
        s.sent_at = Some(now);
        s.last_pn = h.pn;
        s.queued = false;
        self.stats.datagrams_sent += 1;
        if p.rto_deadline.is_none() {
            let at = now + rto;
            p.rto_deadline = Some(at);
            self.wake(at);
        }
    }

    /// Takes one datagram from the network. Everything is checked before anything changes: a
    /// datagram that is truncated, malformed, from another job, forged, misaddressed, replayed
    /// or from a lost peer is counted and dropped, and nothing else happens.
    ///
    /// `d` is decrypted in place when it is authentic; [`Input::Deliver`]'s range points into
    /// it.
    pub fn on_datagram(&mut self, now: Instant, d: &mut [u8]) -> Input {
        if d.len() < OVERHEAD || d.len() > self.cfg.mtu.max(OVERHEAD) {
            self.stats.dropped_truncated += 1;
            return Input::Rejected;
        }
        let Some(h) = Header::read(d) else {
            self.stats.dropped_malformed += 1;
            return Input::Rejected;
        };
        if h.job_tag != self.job_tag {
            self.stats.dropped_wrong_job += 1;
            return Input::Rejected;
        }
        // The addresses pick the key (each direction between two epochs has its own), so
        // they are checked first: a datagram not from a known rank and epoch to this one
        // could not be verified anyway. Nothing is believed before the MAC, only compared.
        let src = h.src;
        if h.dst != self.me
            || src == self.me
            || src as usize >= self.peers.len()
            || h.dst_epoch != self.epoch
            || h.src_epoch != self.peers[src as usize].epoch
        {
            self.stats.dropped_misaddressed += 1;
            return Input::Rejected;
        }
        if !self.peers[src as usize].recv_key.open(d) {
            self.stats.dropped_bad_mac += 1;
            return Input::Rejected;
        }
        let p = &self.peers[src as usize];
        if !p.fresh_pn(h.pn) {
            self.stats.dropped_replayed += 1;
            return Input::Rejected;
        }
        if p.state == PeerState::Lost {
            // Fencing: a rank declared lost that comes back (stopped, descheduled, cut off
            // for longer than the timeout) is refused, never half-accepted, and told so, so
            // that it fails at once rather than after a whole timeout of its own. Only an
            // authentic, fresh datagram of the lost peer earns the answer, at most once per
            // FENCE_INTERVAL: a stranger cannot make this rank send anything. A fence is never
            // answered (two ranks that lost each other would fence each other for ever).
            self.stats.dropped_from_lost += 1;
            let p = &mut self.peers[src as usize];
            if h.kind != Kind::Fence && p.last_fence.is_none_or(|t| now >= t + FENCE_INTERVAL) {
                p.last_fence = Some(now);
                self.outbox.push_back(Out::Fence(src));
            }
            return Input::Rejected;
        }
        if h.kind == Kind::Fence {
            // The peer declared this rank lost and refuses it: nothing more can pass between
            // the two, so give it up now (its acks, if any, are moot).
            let p = &mut self.peers[src as usize];
            p.record_pn(h.pn);
            self.stats.datagrams_accepted += 1;
            self.stats.fenced += 1;
            self.declare_lost(src);
            return Input::Accepted;
        }
        // Authentic and fresh: from here on the datagram counts.
        let p = &mut self.peers[src as usize];
        if h.kind == Kind::Data && h.pn > p.pn_max {
            p.newest_data = Some((h.pn, now));
        }
        p.record_pn(h.pn);
        p.heard_at = Some(now);
        p.heard_absence = self.absence;
        self.stats.datagrams_accepted += 1;
        let ack_delay = Duration::from_micros(h.ack_delay_us.into());
        self.on_ack(now, src, h.ack, h.sack, (h.newest_pn, ack_delay));
        match h.kind {
            Kind::Ack => Input::Accepted,
            Kind::Ping => {
                self.owe_ack(now, src, true);
                Input::Accepted
            }
            Kind::Data => self.on_data(now, src, &h, d),
            // Handled above.
            Kind::Fence => Input::Accepted,
        }
    }

    fn owe_ack(&mut self, now: Instant, src: Rank, immediately: bool) {
        let delay = self.cfg.ack_delay;
        let p = &mut self.peers[src as usize];
        p.unacked_recv += 1;
        if immediately || p.unacked_recv >= ACK_EVERY {
            if !p.ack_owed || p.ack_deadline.is_some() {
                self.outbox.push_back(Out::Ack(src));
            }
            p.ack_owed = true;
            p.ack_deadline = None;
        } else if !p.ack_owed {
            p.ack_owed = true;
            let at = now + delay;
            p.ack_deadline = Some(at);
            self.wake(at);
        }
    }

    /// `timed`: the peer's newest data packet number and how long it held it (the only
    /// transmission a round-trip sample may come from: the ack of any other may have been
    /// held, or lost and repeated, for any time).
    fn on_ack(&mut self, now: Instant, src: Rank, ack: u64, sack: u64, timed: (u64, Duration)) {
        let (timed_pn, ack_delay) = timed;
        let cfg_min = self.cfg.min_rto;
        let cfg_max = self.cfg.rto_ceiling();
        let max_ack_delay = self.cfg.ack_delay;
        let p = &mut self.peers[src as usize];
        // Nothing from `fresh_from` on was ever sent (messages held to pack among them).
        if ack > p.fresh_from.max(p.base) {
            self.stats.protocol_violations += 1;
            return;
        }
        let mut newest: Option<(u64, u64)> = None; // (last_pn, seq) of the newest acked transmission
        let mut sample: Option<Duration> = None;
        let mut progress = false;
        // Newly acknowledged fragments sent after the current recovery period began.
        let mut grow = 0u64;
        let recovery_pn = p.recovery_pn;
        let mut acked = 0u64;
        let mut note = |s: &Sent, seq: u64, newest: &mut Option<(u64, u64)>| {
            progress = true;
            acked += 1;
            if s.last_pn >= recovery_pn {
                grow += 1;
            }
            // Karn again: the ack of a fragment sent more than once may be for an earlier
            // transmission, so only a fragment sent once proves which packet number arrived.
            // Crediting the latest transmission instead made every fragment sent between a
            // spurious retransmission's first and last transmission look lost (a cascade of
            // "fast" retransmissions whenever a timeout fired early).
            if s.transmissions == 1 && newest.is_none_or(|(pn, _)| s.last_pn > pn) {
                *newest = Some((s.last_pn, seq));
                // Karn: only fragments sent once give a round-trip sample, and only the one
                // whose arrival the peer timed.
                if s.last_pn == timed_pn {
                    sample = s.sent_at.map(|t| now.saturating_duration_since(t));
                }
            }
        };
        // Buffers of acknowledged fragments, for the pool (a vector kept for it, not one
        // allocated per acknowledgement).
        let mut freed = std::mem::take(&mut self.freed);
        while p.base < ack {
            let Some(s) = p.sent.pop_front() else { break };
            if !s.acked {
                note(&s, p.base, &mut newest);
            }
            freed.push(s.buf);
            p.base += 1;
        }
        let mut bits = sack;
        while bits != 0 {
            let i = bits.trailing_zeros() as u64;
            bits &= bits - 1;
            let seq = ack + 1 + i;
            if seq < p.base || seq >= p.next_seq {
                continue;
            }
            let s = &mut p.sent[(seq - p.base) as usize];
            if !s.acked && s.transmissions > 0 {
                s.acked = true;
                note(s, seq, &mut newest);
                freed.push(std::mem::take(&mut s.buf));
            }
        }
        // Fully acknowledged fragments at the front go.
        while p.sent.front().is_some_and(|s| s.acked) {
            p.sent.pop_front();
            p.base += 1;
        }
        if let Some(latest) = sample {
            // RFC 9002 5.3: the time the peer held the ack is not path delay, unless that
            // would make the sample smaller than the smallest seen.
            let min_rtt = p.min_rtt.map_or(latest, |m| m.min(latest));
            p.min_rtt = Some(min_rtt);
            let r = if latest >= min_rtt + ack_delay {
                latest - ack_delay
            } else {
                latest
            };
            match p.srtt {
                None => {
                    p.srtt = Some(r);
                    p.rttvar = r / 2;
                }
                Some(srtt) => {
                    let diff = srtt.abs_diff(r);
                    p.rttvar = p.rttvar * 3 / 4 + diff / 4;
                    p.srtt = Some(srtt * 7 / 8 + r / 8);
                }
            }
            let (cur, prev, since) = &mut p.rtt_max;
            if since.is_none_or(|t| now >= t + RTT_MAX_PERIOD) {
                *prev = *cur;
                *cur = Duration::ZERO;
                *since = Some(now);
            }
            *cur = (*cur).max(r);
            let recent_max = (*cur).max(*prev);
            let srtt = p.srtt.unwrap_or(r);
            // RFC 9002 6.2.1: the probe timeout allows for the peer's largest ack delay; and
            // for the largest recent round trip, which smoothing forgets within a few samples.
            let pto = srtt + (p.rttvar * 4).max(GRANULARITY) + max_ack_delay;
            p.rto = pto.max(recent_max + recent_max / 4).clamp(cfg_min, cfg_max);
        }
        p.flight = p.flight.saturating_sub(acked);
        if progress {
            p.backoff = 0;
            p.burst = 0;
            // Progress: what is still unacknowledged waits from now on.
            p.stalled_since = (!p.sent.is_empty()).then_some((now, self.absence));
        }
        // NewReno: slow start below the threshold, one fragment per window of acks above it.
        if grow > 0 {
            if p.cwnd < p.ssthresh {
                p.cwnd += grow;
            } else {
                p.ca_acked += grow;
                if p.ca_acked >= p.cwnd {
                    p.ca_acked -= p.cwnd;
                    p.cwnd += 1;
                }
            }
            // Beyond the receiver's window a larger one only delays the reaction to loss.
            p.cwnd = p.cwnd.min(WINDOW);
        }
        // Retransmit early a fragment whose last transmission is older than one already
        // acknowledged (it was most likely lost: a congestion signal); what the window and
        // the burst limit now allow is queued at the end.
        let newest_pn = newest.map_or(0, |(pn, _)| pn);
        let mut fast = 0;
        let base = p.base;
        for seq in base..(base + WINDOW).min(p.next_seq) {
            let s = &p.sent[(seq - base) as usize];
            if s.transmissions == 0 || s.acked || s.queued || s.last_pn >= newest_pn {
                continue;
            }
            let pn = s.last_pn;
            p.on_congestion(pn, &mut self.stats);
            p.sent[(seq - base) as usize].queued = true;
            p.burst += 1;
            fast += 1;
            self.outbox.push_back(Out::Data(src, seq));
        }
        self.stats.fast_retransmits += fast;
        if progress {
            p.rto_deadline = None;
            if p.has_unacked() {
                let at = now + p.current_rto(&self.cfg);
                p.rto_deadline = Some(at);
                self.wake(at);
            }
        }
        for b in freed.drain(..) {
            self.recycle(b);
        }
        self.freed = freed;
        self.queue_window(src, u64::MAX);
    }

    fn on_data(&mut self, now: Instant, src: Rank, h: &Header, d: &[u8]) -> Input {
        let body = HEADER_LEN..d.len() - MAC_LEN;
        let p = &mut self.peers[src as usize];
        if h.seq < p.recv_next {
            self.stats.duplicates += 1;
            self.owe_ack(now, src, true);
            return Input::Accepted;
        }
        let off = h.seq - p.recv_next;
        if off >= WINDOW {
            self.stats.protocol_violations += 1;
            return Input::Accepted;
        }
        if self.closing && h.flags & FLAG_BYE == 0 {
            // Nobody will deliver it: not acknowledging it lets its sender know.
            self.stats.refused_closing += 1;
            return Input::Accepted;
        }
        if off > 0 {
            if p.recv_mask & (1u128 << off) != 0 {
                self.stats.duplicates += 1;
            } else {
                let mut data = self.pool.pop().unwrap_or_default();
                data.clear();
                data.extend_from_slice(&d[body.clone()]);
                let p = &mut self.peers[src as usize];
                p.recv_mask |= 1u128 << off;
                p.held[(h.seq % WINDOW) as usize] = Some(Held {
                    flags: h.flags,
                    msg_len: h.msg_len,
                    data,
                });
            }
            // Two ranks closing at once refuse each other's last data, so each one's goodbye
            // waits behind a gap that will never fill. A closing rank delivers nothing more
            // anyway: it takes the goodbye as soon as it comes (and acknowledges it
            // selectively), or both would linger to their bound.
            let p = &mut self.peers[src as usize];
            if self.closing
                && h.flags == FLAG_BYE | FLAG_FIRST | FLAG_LAST
                && body.is_empty()
                && p.state == PeerState::Live
            {
                p.state = PeerState::Departed;
            }
            // A gap: tell the sender at once.
            self.owe_ack(now, src, true);
            return Input::Accepted;
        }
        // In order.
        let p = &mut self.peers[src as usize];
        p.recv_next += 1;
        p.recv_mask >>= 1;
        let fast = h.flags & (FLAG_FIRST | FLAG_LAST | FLAG_BYE) == FLAG_FIRST | FLAG_LAST
            && p.reasm.is_none()
            && p.ready_count == 0
            && h.msg_len as usize == body.len()
            && body.len() <= self.cfg.max_message;
        let result = if fast {
            self.stats.delivered += 1;
            Input::Deliver { src, range: body }
        } else {
            self.accept_fragment(src, h.flags, h.msg_len, Frag::Borrowed(&d[body]));
            Input::Accepted
        };
        self.drain(src);
        // A gap still open, or a goodbye (its sender waits for nothing else): ack at once.
        let now_please = self.peers[src as usize].recv_mask != 0 || h.flags & FLAG_BYE != 0;
        self.owe_ack(now, src, now_please);
        result
    }

    /// Moves fragments that became in order into reassembly.
    fn drain(&mut self, src: Rank) {
        loop {
            let p = &mut self.peers[src as usize];
            if p.recv_mask & 1 == 0 {
                return;
            }
            let Some(held) = p.held[(p.recv_next % WINDOW) as usize].take() else {
                return;
            };
            p.recv_next += 1;
            p.recv_mask >>= 1;
            self.accept_fragment(src, held.flags, held.msg_len, Frag::Owned(held.data));
        }
    }

    /// Appends an in-order fragment to the message being reassembled.
    fn accept_fragment(&mut self, src: Rank, flags: u8, msg_len: u32, data: Frag<'_>) {
        if flags == FLAG_PACKED {
            self.accept_packed(src, data);
            return;
        }
        let max = self.cfg.max_message;
        let p = &mut self.peers[src as usize];
        if flags & FLAG_BYE != 0 {
            if flags & (FLAG_FIRST | FLAG_LAST) == FLAG_FIRST | FLAG_LAST && data.is_empty() {
                // It is leaving: what it has not acknowledged yet is still retransmitted while
                // it lingers, and reported as undelivered if it stays unacknowledged for the
                // peer timeout (see handle_timeout), never dropped silently.
                p.state = PeerState::Departed;
            } else {
                self.stats.protocol_violations += 1;
            }
            return;
        }
        if flags & FLAG_FIRST != 0 {
            if p.reasm.is_some() {
                self.stats.protocol_violations += 1;
                p.reasm = None;
            }
            let len = msg_len as usize;
            if len > max || data.len() > len {
                self.stats.protocol_violations += 1;
                return;
            }
            if flags & FLAG_LAST != 0 {
                if data.len() != len {
                    self.stats.protocol_violations += 1;
                    return;
                }
                p.ready_count += 1;
                self.ready.push_back((src, data.into_vec()));
                return;
            }
            let mut buf = Vec::with_capacity(len);
            buf.extend_from_slice(&data);
            p.reasm = Some((buf, len));
            if let Frag::Owned(v) = data {
                self.recycle(v);
            }
            return;
        }
        let Some((mut buf, len)) = p.reasm.take() else {
            self.stats.protocol_violations += 1;
            return;
        };
        if buf.len() + data.len() > len {
            self.stats.protocol_violations += 1;
            return;
        }
        buf.extend_from_slice(&data);
        if let Frag::Owned(v) = data {
            self.recycle(v);
        }
        let p = &mut self.peers[src as usize];
        if flags & FLAG_LAST != 0 {
            if buf.len() != len {
                self.stats.protocol_violations += 1;
                return;
            }
            p.ready_count += 1;
            self.ready.push_back((src, buf));
        } else {
            p.reasm = Some((buf, len));
        }
    }

    /// Delivers the messages of an in-order packed datagram, up to its first malformed frame
    /// (a misbehaviour of its authenticated sender: nothing after it is delivered).
    fn accept_packed(&mut self, src: Rank, data: Frag<'_>) {
        let p = &mut self.peers[src as usize];
        if p.reasm.take().is_some() {
            // A message's fragments are consecutive: one was left unfinished.
            self.stats.protocol_violations += 1;
        }
        let max = self.cfg.max_message;
        for frame in wire::frames(&data) {
            match frame {
                Ok(range) if range.len() > max => {
                    self.stats.protocol_violations += 1;
                    let e = wire::FrameError::TooLong {
                        at: range.start - wire::FRAME_HEADER_LEN,
                        len: range.len(),
                        max,
                    };
                    self.misbehaved.push_back((src, e));
                    break;
                }
                Ok(range) => {
                    let mut m = self.pool.pop().unwrap_or_default();
                    m.clear();
                    m.extend_from_slice(&data[range]);
                    self.peers[src as usize].ready_count += 1;
                    self.ready.push_back((src, m));
                }
                Err(e) => {
                    self.stats.protocol_violations += 1;
                    self.misbehaved.push_back((src, e));
                    break;
                }
            }
        }
        if let Frag::Owned(v) = data {
            self.recycle(v);
        }
    }

    /// Runs the timers due at `now`: delayed acks, retransmissions, keepalives and the peer
    /// timeout. Call it when [`Engine::next_timeout`] has passed (calling more often is fine).
    pub fn handle_timeout(&mut self, now: Instant) {
        let keepalive = self.cfg.keepalive();
        // Silence counts only time this engine was polled: a rank back from a long pause first
        // hears its peers again before judging them.
        if let Some(t) = self.last_tick {
            self.absence += now.saturating_duration_since(t).saturating_sub(keepalive);
        }
        self.last_tick = Some(now);
        let absence = self.absence;
        let mut wake = now + keepalive / 2;
        for r in 0..self.peers.len() {
            if r == self.me as usize {
                continue;
            }
            let rank = r as Rank;
            let p = &mut self.peers[r];
            if p.state == PeerState::Lost {
                continue;
            }
            if let Some(at) = p.ack_deadline {
                if at <= now {
                    p.ack_deadline = None;
                    if p.ack_owed {
                        self.outbox.push_back(Out::Ack(rank));
                    }
                } else {
                    wake = wake.min(at);
                }
            }
            // Data unacknowledged for the timeout: lost, however many pings it answers.
            let stalled = p.stalled_since.is_some_and(|(t, at_absence)| {
                now.saturating_duration_since(t)
                    .saturating_sub(absence - at_absence)
                    >= self.cfg.peer_timeout
            });
            if p.state == PeerState::Departed {
                if p.sent.is_empty() {
                    continue;
                }
                if stalled {
                    // It left without acknowledging these: report them, do not wait on.
                    let n = p.sent.iter().filter(|s| !s.acked).count() as u64;
                    self.stats.undelivered += n;
                    let bufs: Vec<_> = p.sent.drain(..).map(|s| s.buf).collect();
                    p.base = p.next_seq;
                    p.flight = 0;
                    p.stalled_since = None;
                    p.rto_deadline = None;
                    for b in bufs {
                        self.recycle(b);
                    }
                    continue;
                }
            } else {
                let heard = *p.heard_at.get_or_insert(now);
                let silence = now
                    .saturating_duration_since(heard)
                    .saturating_sub(absence - p.heard_absence);
                if silence >= self.cfg.peer_timeout || stalled {
                    self.declare_lost(rank);
                    continue;
                }
                // Past half the timeout unanswered pings are sent again every RTO ceiling, not
                // every keepalive: on a lossy path (a ping and its ack each lost 30% of the
                // time) three tries in a 2 s timeout left a live, idle peer condemned about
                // once in a thousand quiet spells; eight more make that negligible.
                let every = if silence >= self.cfg.peer_timeout / 2 {
                    self.cfg.rto_ceiling()
                } else {
                    keepalive
                };
                if silence >= keepalive {
                    if p.last_ping.is_none_or(|t| now >= t + every) {
                        p.last_ping = Some(now);
                        self.outbox.push_back(Out::Ping(rank));
                    }
                    if let Some(t) = p.last_ping {
                        wake = wake.min(t + every);
                    }
                }
            }
            let p = &mut self.peers[r];
            if let Some(at) = p.rto_deadline {
                if at <= now {
                    self.stats.timeouts += 1;
                    p.backoff = (p.backoff + 1).min(16);
                    if p.backoff == 2 {
                        // Two timeouts in a row with no progress: persistent congestion
                        // (RFC 9002 7.6), the window restarts from its minimum.
                        p.ssthresh = (p.cwnd / 2).max(MIN_WINDOW);
                        p.cwnd = MIN_WINDOW;
                        p.ca_acked = 0;
                        p.recovery_pn = p.next_pn;
                        self.stats.congestion_events += 1;
                    }
                    // RFC 6298 5.4: retransmit the earliest unacknowledged fragment.
                    let base = p.base;
                    if let Some(i) = p.sent.iter().position(|s| !s.acked && s.transmissions > 0) {
                        let s = &mut p.sent[i];
                        if !s.queued {
                            s.queued = true;
                            self.outbox.push_back(Out::Data(rank, base + i as u64));
                        }
                        let at = now + p.current_rto(&self.cfg);
                        p.rto_deadline = Some(at);
                        wake = wake.min(at);
                    } else {
                        p.rto_deadline = None;
                    }
                } else {
                    wake = wake.min(at);
                }
            }
        }
        self.wake_at = Some(wake);
    }

    fn declare_lost(&mut self, rank: Rank) {
        let p = &mut self.peers[rank as usize];
        p.state = PeerState::Lost;
        let bufs: Vec<_> = p.sent.drain(..).map(|s| s.buf).collect();
        p.base = p.next_seq;
        p.flight = 0;
        p.stalled_since = None;
        p.rto_deadline = None;
        p.ack_owed = false;
        p.ack_deadline = None;
        p.reasm = None;
        for h in p.held.iter_mut() {
            *h = None;
        }
        p.recv_mask = 0;
        for b in bufs {
            self.recycle(b);
        }
        self.lost.push_back(rank);
    }
}

#[cfg(test)]
mod tests;
