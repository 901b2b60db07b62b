//! Messages of any size above the AM core: **eager** for small ones, **rendezvous** for large
//! ones, with the data always moved by one-sided writes into a buffer the receiver chose.
//!
//! This is the write-based protocol of the ExaNeSt MPI thesis (seed 002) on top of GASNet-style
//! active messages:
//! - **Eager** (`len <=` the eager threshold, at most `max_medium`): one AM Medium carrying the
//!   data; the receiver copies it into its buffer, or keeps it as an unexpected message until a
//!   matching receive is posted. The send completes as soon as the Medium was handed to the
//!   transport.
//! - **Sender-initiated rendezvous**: the sender announces the message (RTS); once a matching
//!   receive is posted the receiver answers with where to write (CTS); the sender writes the
//!   data with AM Longs (chunks of `max_long`) straight into that buffer.
//! - **Receiver-initiated rendezvous**: a receive posted with a known source sends its buffer's
//!   location ahead (RTR); a sender that arrives later writes at once, with no handshake. When
//!   both sides start at once (an RTS and an RTR cross), a deterministic matching rule, applied
//!   by both sides, pairs them: nothing is written twice and nothing waits forever (see the
//!   `engine` module's docs; a property test runs the two state machines under arbitrary
//!   interleavings).
//! - **Write-based completion**: a rendezvous send completes when its last chunk was sent if the
//!   transport places a Long's payload by then ([`am_core::Node::long_placed_on_send`]: PIO
//!   stores, a put the engine finished synchronously); otherwise the receiver acknowledges the
//!   last chunk and the send completes on that acknowledgement. [`SendInfo::completion`] says
//!   which.
//! - **Buffers too small**: a receive smaller than the message fails with
//!   [`MsgError::TooSmall`] and nothing is written into it; the rendezvous send fails with the
//!   same error. An eager send has completed before the receiver can know, so its failure is
//!   reported later by [`Messenger::take_late_errors`].
//!
//! Data lands in the receiver's registered segment at the offset it chose in
//! [`Messenger::post_recv`]; that is how "the receiver decides where the data lands".
//!
//! Environment ([`MsgConfig::from_env`]): `AM_EAGER_THRESHOLD` (bytes, `4K` style; default:
//! the transport's own threshold, [`threshold::default_for`]) and
//! `AM_RNDV=sender|receiver` (default `receiver`).
//!
//! Progress: handlers only record state and every message is sent from
//! [`Messenger::progress`], which the `wait_*`/`test_*` calls run. A rank that blocks in
//! another call (say [`am_core::Node::barrier`]) while the messenger still holds messages the
//! device refused (out of credit) delays its peers until it calls the messenger again; wait
//! for the messenger's operations before such calls.
//!
//! ```
//! use am_core::{Config, HandlerId, Handlers, Loopback, Node};
//! use am_msg::{Messenger, MsgConfig};
//!
//! let transports = Loopback::cluster(2, Default::default());
//! am_core::run_ranks(transports, |transport| {
//!     let mut handlers = Handlers::local();
//!     let msg = Messenger::new(&mut handlers, HandlerId(100), MsgConfig::default()).unwrap();
//!     let mut node = Node::new(transport, handlers, Config::default()).unwrap();
//!     if node.rank() == 0 {
//!         let data = vec![7u8; 300_000]; // far above any eager threshold: rendezvous
//!         let h = msg.send(&mut node, 1, 42, data).unwrap();
//!         let info = msg.wait_send(&mut node, h).unwrap();
//!         assert_eq!(info.len, 300_000);
//!     } else {
//!         // Land the message at offset 4096 of this rank's segment.
//!         let h = msg.post_recv(&mut node, Some(0), 42, 4096, 500_000).unwrap();
//!         let info = msg.wait_recv(&mut node, h).unwrap();
//!         assert_eq!((info.src, info.tag, info.len), (0, 42, 300_000));
//!         let landed = node.segment().slice(4096, 300_000).unwrap().to_vec();
//!         assert!(landed.iter().all(|&b| b == 7));
//!     }
//!     node.barrier().unwrap();
//! });
//! ```
//!
//! What this crate does **not** do: it does not copy data out of the segment for you, cancel
//! posted receives, order receives with a wildcard source against receives advertised to a
//! known source beyond MPI's rule for one source, or guard overlapping receive buffers (two
//! receives posted on overlapping ranges of the segment is the caller's error). It adds no
//! transport of its own: everything goes through [`am_core::Node`]'s requests and replies.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

use am_core::Local;
use std::cell::RefCell;
use std::rc::Rc;

use am_core::config::ConfigError;
use am_core::{
    AmError, AmKind, HandlerId, Handlers, Msg, Node, Rank, RegisterError, Token, Transport,
    TryRequestError, WaitMode,
};

mod engine;
pub mod threshold;

pub use engine::LateError;
use engine::{MsgEngine, RecvId, SendId, Wire};

/// How many handler ids a [`Messenger`] takes, from its `first_handler` on.
pub const HANDLER_COUNT: u8 = 11;

/// Which protocol moved a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Protocol {
    /// Announced AM Medium, copied into the receive buffer (or kept as unexpected first).
    Eager,
    /// AM Medium written into a receive buffer the receiver had advertised (RTR), unannounced.
    EagerDirect,
    /// RTS, then CTS, then the sender's writes.
    SenderInitiated,
    /// The receiver's RTR arrived first: the sender wrote at once.
    ReceiverInitiated,
    /// RTS and RTR crossed: the RTR answered the RTS, no CTS was needed.
    Crossed,
}

/// How a send learned it was complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Completion {
    /// Eager: the transport took the message (its data is copied out of the send buffer); it
    /// says nothing of the receiver.
    OnSend,
    /// Write-based: the transport reported the last chunk placed in the target's segment when
    /// it was sent. No message from the receiver.
    WriteBased,
    /// The transport cannot tell: the receiver acknowledged the last chunk.
    Ack,
}

/// A completed send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendInfo {
    /// Destination rank.
    pub dest: Rank,
    /// Tag.
    pub tag: u64,
    /// Bytes sent.
    pub len: usize,
    /// The protocol used.
    pub protocol: Protocol,
    /// How completion was learned.
    pub completion: Completion,
}

/// A completed receive; the data is in the segment at the receive's offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvInfo {
    /// The sender.
    pub src: Rank,
    /// Tag.
    pub tag: u64,
    /// Bytes received.
    pub len: usize,
    /// The protocol used.
    pub protocol: Protocol,
}

/// Errors of message operations.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MsgError {
    /// The receive buffer is smaller than the message. Reported on both sides; nothing was
    /// written into the buffer.
    #[error("message of {len} bytes does not fit the {capacity}-byte receive buffer")]
    TooSmall {
        /// The message's length.
        len: u64,
        /// The receive buffer's capacity.
        capacity: u64,
    },
    /// A receive buffer outside the local segment.
    #[error("receive buffer [{offset}, {offset}+{capacity}) outside the {segment}-byte segment")]
    OutOfSegment {
        /// Offset asked for.
        offset: usize,
        /// Capacity asked for.
        capacity: usize,
        /// The segment's size.
        segment: usize,
    },
    /// The rank is not part of the job.
    #[error("rank {rank} is outside the job (size {size})")]
    InvalidRank {
        /// The rank given.
        rank: Rank,
        /// The job's size.
        size: u32,
    },
    /// A peer broke the message protocol (unknown ids, data outside the buffer it was given).
    #[error("rank {peer} broke the message protocol: {what}")]
    PeerMisbehaved {
        /// The peer.
        peer: Rank,
        /// What it did.
        what: String,
    },
    /// The handle is not known (already completed and taken, or from another messenger).
    #[error("unknown or already completed handle")]
    StaleHandle,
    /// `first_handler + HANDLER_COUNT` does not fit the 256-entry handler table.
    #[error("handler ids {first}..{first}+{HANDLER_COUNT} do not fit the handler table")]
    HandlerRange {
        /// The first id asked for.
        first: u8,
    },
    /// A handler id is already taken.
    #[error(transparent)]
    Register(#[from] RegisterError),
    /// The AM layer failed (peer lost, job aborted, transport error).
    #[error(transparent)]
    Am(#[from] AmError),
}

/// Which side starts a rendezvous when the receive names its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rendezvous {
    /// Only the sender (RTS/CTS): receives never advertise their buffers.
    Sender,
    /// Receives that name their source advertise their buffers (RTR); senders start otherwise.
    Receiver,
}

impl std::str::FromStr for Rendezvous {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sender" => Ok(Rendezvous::Sender),
            "receiver" => Ok(Rendezvous::Receiver),
            other => Err(format!(
                "unknown rendezvous {other:?}: expected sender or receiver"
            )),
        }
    }
}

/// Settings of a [`Messenger`].
///
/// Change the defaults with the setters named after the fields:
/// `MsgConfig::default().eager_threshold(Some(4096)).rendezvous(Rendezvous::Sender)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MsgConfig {
    /// Largest message sent eagerly (`AM_EAGER_THRESHOLD`, sizes like `4K`); `None`: the
    /// transport's own default ([`threshold::default_for`]). Capped at `max_medium`.
    pub eager_threshold: Option<usize>,
    /// Who starts a rendezvous (`AM_RNDV=sender|receiver`, default receiver).
    pub rendezvous: Rendezvous,
}

impl Default for MsgConfig {
    fn default() -> Self {
        MsgConfig {
            eager_threshold: None,
            rendezvous: Rendezvous::Receiver,
        }
    }
}

impl MsgConfig {
    /// The defaults, as [`MsgConfig::default`]; change them with the setters below.
    pub fn new() -> MsgConfig {
        MsgConfig::default()
    }

    /// Sending messages of at most this many bytes eagerly (`None`: the transport's default).
    #[must_use]
    pub fn eager_threshold(mut self, eager_threshold: Option<usize>) -> MsgConfig {
        self.eager_threshold = eager_threshold;
        self
    }

    /// With rendezvous started by this side.
    #[must_use]
    pub fn rendezvous(mut self, rendezvous: Rendezvous) -> MsgConfig {
        self.rendezvous = rendezvous;
        self
    }
}

impl MsgConfig {
    /// The defaults, overridden by `AM_EAGER_THRESHOLD` and `AM_RNDV` where set.
    pub fn from_env() -> Result<MsgConfig, ConfigError> {
        let mut c = MsgConfig::default();
        if let Ok(v) = std::env::var("AM_EAGER_THRESHOLD") {
            c.eager_threshold = Some(am_core::config::parse_size(&v).ok_or(ConfigError {
                var: "AM_EAGER_THRESHOLD",
                value: v.clone(),
                why: "expected a size such as 512, 4K or 64K".into(),
            })?);
        }
        if let Ok(v) = std::env::var("AM_RNDV") {
            c.rendezvous = v.parse().map_err(|why| ConfigError {
                var: "AM_RNDV",
                value: v.clone(),
                why,
            })?;
        }
        Ok(c)
    }
}

/// A send in flight; complete it with [`Messenger::wait_send`] or [`Messenger::test_send`].
#[derive(Debug, PartialEq, Eq, Hash)]
#[must_use = "a send's outcome is known only once waited for"]
pub struct SendHandle(SendId);

/// A posted receive; complete it with [`Messenger::wait_recv`] or [`Messenger::test_recv`].
#[derive(Debug, PartialEq, Eq, Hash)]
#[must_use = "a receive's data is there only once waited for"]
pub struct RecvHandle(RecvId);

// Operation codes: handler id = first_handler + op.
const OP_EAGER: u8 = 0;
const OP_RTS: u8 = 1;
const OP_RTR: u8 = 2;
const OP_CTS: u8 = 3;
const OP_NACK: u8 = 4;
const OP_DATA: u8 = 5;
const OP_DIRECT: u8 = 6;
const OP_SEEN: u8 = 7;
const OP_CTS_REPLY: u8 = 8;
const OP_NACK_REPLY: u8 = 9;
const OP_ACK_REPLY: u8 = 10;

const NACK_RTS: u32 = 0;
const NACK_EAGER: u32 = 1;
const NACK_RTR: u32 = 2;

const FLAG_LAST: u32 = 1;
const FLAG_ACK: u32 = 2;

fn lo(x: u64) -> u32 {
    x as u32
}
fn hi(x: u64) -> u32 {
    (x >> 32) as u32
}
fn join(a: &[u32], i: usize) -> u64 {
    a[i] as u64 | (a[i + 1] as u64) << 32
}

/// Encodes a wire message: its operation (request form), AM kind and arguments.
fn encode(w: &Wire) -> (u8, AmKind, Vec<u32>) {
    match *w {
        Wire::Eager { tag, seq } => (
            OP_EAGER,
            AmKind::Medium,
            vec![lo(tag), hi(tag), lo(seq), hi(seq)],
        ),
        Wire::Rts {
            tag,
            seq,
            len,
            send_id,
        } => (
            OP_RTS,
            AmKind::Short,
            vec![
                lo(tag),
                hi(tag),
                lo(seq),
                hi(seq),
                lo(len),
                hi(len),
                send_id,
            ],
        ),
        Wire::Rtr {
            recv_id,
            tag,
            offset,
            capacity,
            seen,
        } => (
            OP_RTR,
            AmKind::Short,
            vec![
                recv_id,
                lo(tag),
                hi(tag),
                lo(offset),
                hi(offset),
                lo(capacity),
                hi(capacity),
                lo(seen),
                hi(seen),
            ],
        ),
        Wire::Cts {
            send_id,
            recv_id,
            offset,
            capacity,
        } => (
            OP_CTS,
            AmKind::Short,
            vec![
                send_id,
                recv_id,
                lo(offset),
                hi(offset),
                lo(capacity),
                hi(capacity),
            ],
        ),
        Wire::NackRts { send_id, capacity } => (
            OP_NACK,
            AmKind::Short,
            vec![NACK_RTS, send_id, lo(capacity), hi(capacity)],
        ),
        Wire::NackEager {
            tag,
            seq,
            len,
            capacity,
        } => (
            OP_NACK,
            AmKind::Short,
            vec![
                NACK_EAGER,
                lo(tag),
                hi(tag),
                lo(seq),
                hi(seq),
                lo(len),
                hi(len),
                lo(capacity),
                hi(capacity),
            ],
        ),
        Wire::NackRtr { recv_id, len } => (
            OP_NACK,
            AmKind::Short,
            vec![NACK_RTR, recv_id, lo(len), hi(len)],
        ),
        Wire::Data {
            recv_id,
            send_id,
            total,
            last,
            want_ack,
        } => {
            let flags = if last { FLAG_LAST } else { 0 } | if want_ack { FLAG_ACK } else { 0 };
            (
                OP_DATA,
                AmKind::Long,
                vec![recv_id, send_id, flags, lo(total), hi(total)],
            )
        }
        Wire::Direct { recv_id } => (OP_DIRECT, AmKind::Medium, vec![recv_id]),
        Wire::Seen { seen } => (OP_SEEN, AmKind::Short, vec![lo(seen), hi(seen)]),
        Wire::Ack { send_id } => (OP_ACK_REPLY, AmKind::Short, vec![send_id]),
    }
}

/// Decodes the arguments of operation `op` (replies decode as their request form).
fn decode(op: u8, a: &[u32]) -> Option<Wire> {
    let need = |n: usize| (a.len() == n).then_some(());
    Some(match op {
        OP_EAGER => {
            need(4)?;
            Wire::Eager {
                tag: join(a, 0),
                seq: join(a, 2),
            }
        }
        OP_RTS => {
            need(7)?;
            Wire::Rts {
                tag: join(a, 0),
                seq: join(a, 2),
                len: join(a, 4),
                send_id: a[6],
            }
        }
        OP_RTR => {
            need(9)?;
            Wire::Rtr {
                recv_id: a[0],
                tag: join(a, 1),
                offset: join(a, 3),
                capacity: join(a, 5),
                seen: join(a, 7),
            }
        }
        OP_CTS | OP_CTS_REPLY => {
            need(6)?;
            Wire::Cts {
                send_id: a[0],
                recv_id: a[1],
                offset: join(a, 2),
                capacity: join(a, 4),
            }
        }
        OP_NACK | OP_NACK_REPLY => match *a.first()? {
            NACK_RTS => {
                need(4)?;
                Wire::NackRts {
                    send_id: a[1],
                    capacity: join(a, 2),
                }
            }
            NACK_EAGER => {
                need(9)?;
                Wire::NackEager {
                    tag: join(a, 1),
                    seq: join(a, 3),
                    len: join(a, 5),
                    capacity: join(a, 7),
                }
            }
            NACK_RTR => {
                need(4)?;
                Wire::NackRtr {
                    recv_id: a[1],
                    len: join(a, 2),
                }
            }
            _ => return None,
        },
        OP_DATA => {
            need(5)?;
            if a[2] & !(FLAG_LAST | FLAG_ACK) != 0 {
                return None;
            }
            Wire::Data {
                recv_id: a[0],
                send_id: a[1],
                total: join(a, 3),
                last: a[2] & FLAG_LAST != 0,
                want_ack: a[2] & FLAG_ACK != 0,
            }
        }
        OP_DIRECT => {
            need(1)?;
            Wire::Direct { recv_id: a[0] }
        }
        OP_SEEN => {
            need(2)?;
            Wire::Seen { seen: join(a, 0) }
        }
        OP_ACK_REPLY => {
            need(1)?;
            Wire::Ack { send_id: a[0] }
        }
        _ => return None,
    })
}

/// Runs one of the messenger's handlers: decode, hand to the engine, copy, reply.
fn handle(eng: &RefCell<MsgEngine>, first: u8, op: u8, msg: Msg<'_>, token: Option<Token<'_>>) {
    let src = msg.src();
    let args: Vec<u32> = msg.args().to_vec();
    let mut e = eng.borrow_mut();
    let Some(wire) = decode(op, &args) else {
        e.events += 1;
        e.violations.push((
            src,
            format!("malformed message (operation {op}, {} args)", args.len()),
        ));
        return;
    };
    let long = msg.long_offset().map(|o| (o, msg.payload_len()));
    let re = match long {
        None => {
            let payload = msg.payload();
            let re = e.on_wire(src, wire, payload, None);
            if let Some(at) = re.copy_to {
                // The engine only copies into receives whose range was checked at post time.
                if msg.segment().write(at, payload).is_err() {
                    e.violations.push((src, "copy outside the segment".into()));
                }
            }
            re
        }
        Some(_) => e.on_wire(src, wire, &[], long),
    };
    drop(e);
    if let (Some(w), Some(token)) = (re.reply, token) {
        let (op, _, args) = encode(&w);
        let op = match op {
            OP_CTS => OP_CTS_REPLY,
            OP_NACK => OP_NACK_REPLY,
            other => other,
        };
        if let Err(err) = token.reply_short(HandlerId(first + op), &args) {
            eng.borrow_mut()
                .violations
                .push((src, format!("reply failed: {err}")));
        }
    }
}

/// The message layer of one rank: register it in the handler table, then use it with the
/// rank's [`Node`].
///
/// It takes the handler ids `first_handler .. first_handler + HANDLER_COUNT` (11 ids; every rank
/// must register it at the same ids, which the node's start-up check enforces). Handlers only
/// record state; messages are sent from [`Messenger::progress`] (which every `wait_*` and
/// `test_*` call runs), because a request handler may only reply.
///
/// Ordering: messages from one sender with one tag are received in the order they were sent
/// (MPI's non-overtaking rule), and receives are matched in the order they were posted.
pub struct Messenger {
    engine: Rc<RefCell<MsgEngine>>,
    first: u8,
    config: MsgConfig,
}

impl std::fmt::Debug for Messenger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Messenger")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Messenger {
    /// Registers the messenger's handlers at `first_handler ..first_handler + HANDLER_COUNT`.
    pub fn new(
        handlers: &mut Handlers<Local>,
        first_handler: HandlerId,
        config: MsgConfig,
    ) -> Result<Messenger, MsgError> {
        let first = first_handler.0;
        if first as usize + HANDLER_COUNT as usize > 256 {
            return Err(MsgError::HandlerRange { first });
        }
        let engine = Rc::new(RefCell::new(MsgEngine::default()));
        let requests: [(u8, &str, AmKind); 8] = [
            (OP_EAGER, "am-msg eager", AmKind::Medium),
            (OP_RTS, "am-msg rts", AmKind::Short),
            (OP_RTR, "am-msg rtr", AmKind::Short),
            (OP_CTS, "am-msg cts", AmKind::Short),
            (OP_NACK, "am-msg nack", AmKind::Short),
            (OP_DATA, "am-msg data", AmKind::Long),
            (OP_DIRECT, "am-msg direct", AmKind::Medium),
            (OP_SEEN, "am-msg seen", AmKind::Short),
        ];
        for (op, name, kind) in requests {
            let eng = engine.clone();
            handlers.request(HandlerId(first + op), name, kind, move |msg, token| {
                handle(&eng, first, op, msg, Some(token))
            })?;
        }
        let replies: [(u8, &str); 3] = [
            (OP_CTS_REPLY, "am-msg cts reply"),
            (OP_NACK_REPLY, "am-msg nack reply"),
            (OP_ACK_REPLY, "am-msg ack reply"),
        ];
        for (op, name) in replies {
            let eng = engine.clone();
            handlers.reply(HandlerId(first + op), name, AmKind::Short, move |msg| {
                handle(&eng, first, op, msg, None)
            })?;
        }
        Ok(Messenger {
            engine,
            first,
            config,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &MsgConfig {
        &self.config
    }

    /// The eager threshold in force on `node`'s transport: the configured one or the
    /// transport's own default, capped at `max_medium`.
    pub fn eager_threshold<T: Transport>(&self, node: &Node<T, Local>) -> usize {
        self.config
            .eager_threshold
            .unwrap_or_else(|| {
                threshold::default_for(node.transport().info().name, node.max_medium())
            })
            .min(node.max_medium())
    }

    /// Starts sending `data` to `dest` with `tag`; returns at once. The data is owned by the
    /// messenger until the send completes, so a rendezvous can write it later without a copy
    /// (pass an `Arc<[u8]>` to keep a reference).
    pub fn send<T: Transport>(
        &self,
        node: &mut Node<T, Local>,
        dest: Rank,
        tag: u64,
        data: impl AsRef<[u8]> + 'static,
    ) -> Result<SendHandle, MsgError> {
        if dest >= node.size() {
            return Err(MsgError::InvalidRank {
                rank: dest,
                size: node.size(),
            });
        }
        let eager = data.as_ref().len() <= self.eager_threshold(node);
        let id = self
            .engine
            .borrow_mut()
            .send(dest, tag, Box::new(data), eager);
        self.flush(node)?;
        Ok(SendHandle(id))
    }

    /// Posts a receive of a message with `tag` from `src` (any rank if `None`) into
    /// `[offset, offset + capacity)` of this rank's segment. With a known source and
    /// receiver-initiated rendezvous, the buffer is advertised to the sender at once.
    pub fn post_recv<T: Transport>(
        &self,
        node: &mut Node<T, Local>,
        src: Option<Rank>,
        tag: u64,
        offset: usize,
        capacity: usize,
    ) -> Result<RecvHandle, MsgError> {
        if let Some(s) = src.filter(|&s| s >= node.size()) {
            return Err(MsgError::InvalidRank {
                rank: s,
                size: node.size(),
            });
        }
        let segment = node.segment().len();
        if offset.checked_add(capacity).is_none_or(|end| end > segment) {
            return Err(MsgError::OutOfSegment {
                offset,
                capacity,
                segment,
            });
        }
        let advertise = self.config.rendezvous == Rendezvous::Receiver;
        let (id, copy) =
            self.engine
                .borrow_mut()
                .post_recv(src, tag, offset as u64, capacity as u64, advertise);
        if let Some(data) = copy {
            // len <= capacity and the range is in the segment (checked above).
            node.segment()
                .write(offset, &data)
                .map_err(|_| MsgError::OutOfSegment {
                    offset,
                    capacity,
                    segment,
                })?;
        }
        self.flush(node)?;
        Ok(RecvHandle(id))
    }

    /// Polls the node (running handlers) and sends what the protocol has queued.
    pub fn progress<T: Transport>(&self, node: &mut Node<T, Local>) -> Result<(), MsgError> {
        node.poll()?;
        self.check()?;
        self.flush(node)
    }

    /// Reports a peer's protocol violation recorded by a handler.
    fn check(&self) -> Result<(), MsgError> {
        let mut e = self.engine.borrow_mut();
        if e.violations.is_empty() {
            return Ok(());
        }
        let (peer, what) = e.violations.remove(0);
        Err(MsgError::PeerMisbehaved { peer, what })
    }

    /// Sends queued messages, in order per destination, until each is empty or blocked.
    fn flush<T: Transport>(&self, node: &mut Node<T, Local>) -> Result<(), MsgError> {
        let first = self.first_handler_id();
        let max_long = node.max_long();
        let mut e = self.engine.borrow_mut();
        for dest in 0..e.peer_count() as Rank {
            while let Some(out) = e.peek_out(dest, max_long, &|n| node.long_placed_on_send(n)) {
                let (op, kind, args) = encode(&out.wire);
                let h = HandlerId(first + op);
                // try_request_* never polls, so no handler runs while the engine is borrowed.
                let r = match kind {
                    AmKind::Short => node.try_request_short(dest, h, &args),
                    AmKind::Medium => node.try_request_medium(dest, h, &args, out.payload),
                    AmKind::Long => node.try_request_long(
                        dest,
                        h,
                        &args,
                        out.payload,
                        out.long_offset.unwrap_or(0),
                    ),
                };
                match r {
                    Ok(()) => e.commit_out(dest, max_long, &|n| node.long_placed_on_send(n)),
                    Err(TryRequestError::WouldBlock) => break,
                    Err(TryRequestError::Failed(err)) => return Err(err.into()),
                    Err(other) => {
                        return Err(MsgError::Am(AmError::Transport(
                            am_core::TransportError::device_from("am-msg: a request failed", other),
                        )))
                    }
                }
            }
        }
        Ok(())
    }

    fn first_handler_id(&self) -> u8 {
        self.first
    }

    /// The outcome of a send if it has completed (runs [`Messenger::progress`] once).
    /// `Ok(None)`: still in flight; the handle stays valid.
    pub fn test_send<T: Transport>(
        &self,
        node: &mut Node<T, Local>,
        handle: &SendHandle,
    ) -> Result<Option<SendInfo>, MsgError> {
        self.progress(node)?;
        let mut e = self.engine.borrow_mut();
        if !e.knows_send(handle.0) {
            return Err(MsgError::StaleHandle);
        }
        e.take_send(handle.0).transpose()
    }

    /// The outcome of a receive if it has completed (runs [`Messenger::progress`] once).
    pub fn test_recv<T: Transport>(
        &self,
        node: &mut Node<T, Local>,
        handle: &RecvHandle,
    ) -> Result<Option<RecvInfo>, MsgError> {
        self.progress(node)?;
        let mut e = self.engine.borrow_mut();
        if !e.knows_recv(handle.0) {
            return Err(MsgError::StaleHandle);
        }
        e.take_recv(handle.0).transpose()
    }

    /// Waits until a send has completed (see [`Completion`] for what that means).
    pub fn wait_send<T: Transport>(
        &self,
        node: &mut Node<T, Local>,
        handle: SendHandle,
    ) -> Result<SendInfo, MsgError> {
        if !self.engine.borrow().knows_send(handle.0) {
            return Err(MsgError::StaleHandle);
        }
        self.wait(node, |e| e.take_send(handle.0))
    }

    /// Waits until a receive has completed: its data is then in the segment.
    pub fn wait_recv<T: Transport>(
        &self,
        node: &mut Node<T, Local>,
        handle: RecvHandle,
    ) -> Result<RecvInfo, MsgError> {
        if !self.engine.borrow().knows_recv(handle.0) {
            return Err(MsgError::StaleHandle);
        }
        self.wait(node, |e| e.take_recv(handle.0))
    }

    /// Progresses until `take` yields a result. Between rounds it waits as the node's wait
    /// mode says, but only while nothing of ours is queued (queued messages wait for credits or
    /// device space, which come back without any handler of ours running).
    fn wait<T: Transport, R>(
        &self,
        node: &mut Node<T, Local>,
        mut take: impl FnMut(&mut MsgEngine) -> Option<Result<R, MsgError>>,
    ) -> Result<R, MsgError> {
        let spin = node.config().wait_mode == WaitMode::Spin;
        loop {
            if let Some(r) = take(&mut self.engine.borrow_mut()) {
                return r;
            }
            let events = self.engine.borrow().events;
            if self.engine.borrow().has_out() {
                self.progress(node)?;
                if !spin && self.engine.borrow().events == events {
                    std::thread::yield_now();
                }
            } else {
                let eng = &self.engine;
                node.wait_until(|| eng.borrow().events != events)?;
                self.check()?;
                self.flush(node)?;
            }
        }
    }

    /// Failures of eager sends learned after they completed (their receive buffer was too
    /// small), oldest first; taking them clears the list.
    pub fn take_late_errors(&self) -> Vec<LateError> {
        std::mem::take(&mut self.engine.borrow_mut().late_errors)
    }
}
