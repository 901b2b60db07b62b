//! The message protocol as a pure state machine: no transport, no clock, no segment.
//!
//! The glue in `lib.rs` feeds it what the AM handlers see ([`MsgEngine::on_wire`]) and drains
//! what it wants sent ([`MsgEngine::peek_out`] / [`MsgEngine::commit_out`]); the tests at the bottom
//! drive two engines over in-memory channels with arbitrary interleavings.
//!
//! # Matching rule of receiver-initiated rendezvous
//!
//! Every *announced* message (eager or RTS) carries a per-pair sequence number `seq`. An RTR
//! carries `seen`: how many announced messages from that sender the receiver had processed
//! when it created the RTR. Both sides apply the same rule: the RTRs of a (pair, tag) are
//! matched in order, each to the first announced message of that tag, not matched by an earlier
//! RTR, with `seq >= seen`.
//! - Receiver: an arriving announced message claims the oldest unclaimed RTR of its tag (its
//!   `seen` is necessarily `<= seq`: the RTR existed before the message was processed).
//! - Sender: an arriving RTR matches the oldest unmatched announced message of its tag with
//!   `seq >= seen`; if none was sent, the RTR is kept and the next send of that tag writes
//!   straight into its buffer, unannounced.
//!
//! The receiver never creates an RTR while it holds an unexpected message of that source and
//! tag, or while an earlier plain receive could match the same messages, so posting order is
//! matching order, as in MPI.

use std::collections::{HashMap, VecDeque};

use am_core::Rank;

use crate::{Completion, MsgError, Protocol, RecvInfo, SendInfo};

/// Identifies a send at its sender.
pub(crate) type SendId = u32;
/// Identifies a receive at its receiver.
pub(crate) type RecvId = u32;

/// How often (in announced messages processed) a receiver tells a sender how far it got, so
/// the sender can forget announced messages no future RTR can match.
const SEEN_EVERY: u64 = 64;

/// A protocol message between two engines. Each maps to one AM (see `lib.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wire {
    /// Eager message (Medium, payload = the data).
    Eager { tag: u64, seq: u64 },
    /// Ready to send: the sender announces a rendezvous message (Short).
    Rts {
        tag: u64,
        seq: u64,
        len: u64,
        send_id: SendId,
    },
    /// Ready to receive: the receiver advertises a buffer before any announcement (Short).
    Rtr {
        recv_id: RecvId,
        tag: u64,
        offset: u64,
        capacity: u64,
        seen: u64,
    },
    /// Clear to send: where the announced message goes (Short, request or reply).
    Cts {
        send_id: SendId,
        recv_id: RecvId,
        offset: u64,
        capacity: u64,
    },
    /// The receive matched by an RTS is too small (receiver → sender).
    NackRts { send_id: SendId, capacity: u64 },
    /// The receive matched by an eager message was too small (receiver → sender).
    NackEager {
        tag: u64,
        seq: u64,
        len: u64,
        capacity: u64,
    },
    /// The message for an advertised receive is too large (sender → receiver).
    NackRtr { recv_id: RecvId, len: u64 },
    /// One chunk of rendezvous data (Long into the receive buffer).
    Data {
        recv_id: RecvId,
        send_id: SendId,
        total: u64,
        last: bool,
        want_ack: bool,
    },
    /// A small message written straight into an advertised receive (Medium).
    Direct { recv_id: RecvId },
    /// How many announced messages the receiver has processed (Short).
    Seen { seen: u64 },
    /// The last chunk has landed: for transports that cannot tell the sender (Short reply).
    Ack { send_id: SendId },
}

/// What the glue must do after a message was handled.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Reaction {
    /// Copy the message's (Medium) payload into the segment at this offset.
    pub copy_to: Option<usize>,
    /// Reply with this to the source (only ever set for requests).
    pub reply: Option<Wire>,
}

/// A message ready to go: the wire message, its payload, and where a Long lands.
#[derive(Debug)]
pub(crate) struct OutMsg<'a> {
    pub wire: Wire,
    pub payload: &'a [u8],
    pub long_offset: Option<usize>,
}

/// Something queued for one destination, sent in order from `progress`.
#[derive(Debug)]
enum Out {
    Msg(Wire),
    Eager { send_id: SendId },
    Direct { send_id: SendId, recv_id: RecvId },
    Data { send_id: SendId },
}

#[derive(Debug, Clone, Copy)]
enum CandKind {
    Eager { len: u64 },
    Rts { send_id: SendId },
}

/// An announced message an RTR may still match.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    seq: u64,
    tag: u64,
    kind: CandKind,
}

#[derive(Debug, Clone, Copy)]
struct StoredRtr {
    recv_id: RecvId,
    tag: u64,
    offset: u64,
    capacity: u64,
}

#[derive(Debug)]
enum Unexpected {
    Eager { seq: u64, data: Vec<u8> },
    Rts { len: u64, send_id: SendId },
}

#[derive(Debug)]
struct UnexpectedMsg {
    src: Rank,
    tag: u64,
    kind: Unexpected,
}

/// Per-peer state: this rank as its sender and as its receiver.
#[derive(Debug, Default)]
struct Peer {
    next_seq: u64,
    candidates: VecDeque<Candidate>,
    rtrs: VecDeque<StoredRtr>,
    out: VecDeque<Out>,
    processed: u64,
    reported: u64,
    /// Advertised receives not yet claimed, in RTR order.
    advertised: VecDeque<RecvId>,
}

enum SendStage {
    Queued,
    AwaitCts,
    Writing {
        recv_id: RecvId,
        offset: u64,
        pos: u64,
        all_placed: bool,
    },
    AwaitAck,
    Done(Result<SendInfo, MsgError>),
}

struct SendState {
    dest: Rank,
    tag: u64,
    len: u64,
    seq: u64,
    data: Option<Box<dyn AsRef<[u8]>>>,
    protocol: Protocol,
    stage: SendStage,
}

impl SendState {
    fn bytes(&self) -> &[u8] {
        match &self.data {
            Some(d) => (**d).as_ref(),
            None => &[],
        }
    }
}

#[derive(Debug)]
enum RecvStage {
    Posted,
    AwaitData {
        from: Rank,
        total: Option<u64>,
        got: u64,
        protocol: Protocol,
    },
    Done(Result<RecvInfo, MsgError>),
}

#[derive(Debug)]
struct RecvState {
    src: Option<Rank>,
    tag: u64,
    offset: u64,
    capacity: u64,
    stage: RecvStage,
}

/// A failure of an eager send learned after the send completed (its receive was too small).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LateError {
    /// Where the message went.
    pub dest: Rank,
    /// Its tag.
    pub tag: u64,
    /// The error ([`MsgError::TooSmall`]).
    pub error: MsgError,
}

/// One rank's message protocol (eager and rendezvous, matching) as a state machine.
#[derive(Default)]
pub(crate) struct MsgEngine {
    peers: Vec<Peer>,
    sends: HashMap<SendId, SendState>,
    recvs: HashMap<RecvId, RecvState>,
    next_send: SendId,
    next_recv: RecvId,
    /// Plain (not advertised) posted receives, in posting order.
    posted: VecDeque<RecvId>,
    unexpected: VecDeque<UnexpectedMsg>,
    /// Incremented by every handled message: lets waiters block until something happened.
    pub events: u64,
    /// Peers that broke the protocol, reported by the next `progress`.
    pub violations: Vec<(Rank, String)>,
    pub late_errors: Vec<LateError>,
}

fn too_small(len: u64, capacity: u64) -> MsgError {
    MsgError::TooSmall { len, capacity }
}

impl MsgEngine {
    fn peer(&mut self, r: Rank) -> &mut Peer {
        let i = r as usize;
        if self.peers.len() <= i {
            self.peers.resize_with(i + 1, Peer::default);
        }
        &mut self.peers[i]
    }

    fn violation(&mut self, peer: Rank, what: impl Into<String>) {
        self.violations.push((peer, what.into()));
    }

    /// Starts a send. `eager`: the message fits the eager path (the glue checked the threshold
    /// and the Medium limit).
    pub fn send(
        &mut self,
        dest: Rank,
        tag: u64,
        data: Box<dyn AsRef<[u8]>>,
        eager: bool,
    ) -> SendId {
        let id = self.next_send;
        self.next_send = self.next_send.wrapping_add(1);
        let len = (*data).as_ref().len() as u64;
        let mut st = SendState {
            dest,
            tag,
            len,
            seq: u64::MAX,
            data: Some(data),
            protocol: Protocol::Eager,
            stage: SendStage::Queued,
        };
        let p = self.peer(dest);
        if let Some(i) = p.rtrs.iter().position(|r| r.tag == tag) {
            let Some(r) = p.rtrs.remove(i) else {
                unreachable!("position is in range")
            };
            if len > r.capacity {
                p.out.push_back(Out::Msg(Wire::NackRtr {
                    recv_id: r.recv_id,
                    len,
                }));
                st.data = None;
                st.stage = SendStage::Done(Err(too_small(len, r.capacity)));
            } else if eager {
                p.out.push_back(Out::Direct {
                    send_id: id,
                    recv_id: r.recv_id,
                });
                st.protocol = Protocol::EagerDirect;
            } else {
                p.out.push_back(Out::Data { send_id: id });
                st.protocol = Protocol::ReceiverInitiated;
                st.stage = SendStage::Writing {
                    recv_id: r.recv_id,
                    offset: r.offset,
                    pos: 0,
                    all_placed: true,
                };
            }
        } else {
            st.seq = p.next_seq;
            p.next_seq += 1;
            if eager {
                p.candidates.push_back(Candidate {
                    seq: st.seq,
                    tag,
                    kind: CandKind::Eager { len },
                });
                p.out.push_back(Out::Eager { send_id: id });
            } else {
                p.candidates.push_back(Candidate {
                    seq: st.seq,
                    tag,
                    kind: CandKind::Rts { send_id: id },
                });
                p.out.push_back(Out::Msg(Wire::Rts {
                    tag,
                    seq: st.seq,
                    len,
                    send_id: id,
                }));
                st.protocol = Protocol::SenderInitiated;
                st.stage = SendStage::AwaitCts;
            }
        }
        self.sends.insert(id, st);
        id
    }

    /// Posts a receive into `[offset, offset + capacity)` of the local segment (the glue
    /// checked the range). Returns its id and, if it matched an unexpected eager message, the
    /// bytes to copy to `offset`.
    pub fn post_recv(
        &mut self,
        src: Option<Rank>,
        tag: u64,
        offset: u64,
        capacity: u64,
        advertise: bool,
    ) -> (RecvId, Option<Vec<u8>>) {
        let id = self.next_recv;
        self.next_recv = self.next_recv.wrapping_add(1);
        let mut st = RecvState {
            src,
            tag,
            offset,
            capacity,
            stage: RecvStage::Posted,
        };
        let mut copy = None;
        let matches = |u: &UnexpectedMsg| u.tag == tag && src.is_none_or(|s| s == u.src);
        if let Some(i) = self.unexpected.iter().position(matches) {
            let Some(u) = self.unexpected.remove(i) else {
                unreachable!("position is in range")
            };
            match u.kind {
                Unexpected::Eager { seq, data } => {
                    let len = data.len() as u64;
                    if len > capacity {
                        self.peer(u.src).out.push_back(Out::Msg(Wire::NackEager {
                            tag,
                            seq,
                            len,
                            capacity,
                        }));
                        st.stage = RecvStage::Done(Err(too_small(len, capacity)));
                    } else {
                        st.stage = RecvStage::Done(Ok(RecvInfo {
                            src: u.src,
                            tag,
                            len: len as usize,
                            protocol: Protocol::Eager,
                        }));
                        copy = Some(data);
                    }
                }
                Unexpected::Rts { len, send_id } => {
                    let p = self.peer(u.src);
                    if len > capacity {
                        p.out
                            .push_back(Out::Msg(Wire::NackRts { send_id, capacity }));
                        st.stage = RecvStage::Done(Err(too_small(len, capacity)));
                    } else {
                        p.out.push_back(Out::Msg(Wire::Cts {
                            send_id,
                            recv_id: id,
                            offset,
                            capacity,
                        }));
                        st.stage = RecvStage::AwaitData {
                            from: u.src,
                            total: Some(len),
                            got: 0,
                            protocol: Protocol::SenderInitiated,
                        };
                    }
                }
            }
        } else if let Some(s) = src.filter(|&s| {
            advertise
                && !self.posted.iter().any(|r| {
                    let r = &self.recvs[r];
                    r.tag == tag && r.src.is_none_or(|x| x == s)
                })
        }) {
            let p = self.peer(s);
            p.advertised.push_back(id);
            p.reported = p.processed;
            let seen = p.processed;
            p.out.push_back(Out::Msg(Wire::Rtr {
                recv_id: id,
                tag,
                offset,
                capacity,
                seen,
            }));
        } else {
            self.posted.push_back(id);
        }
        self.recvs.insert(id, st);
        (id, copy)
    }

    /// True if anything waits to be sent.
    pub fn has_out(&self) -> bool {
        self.peers.iter().any(|p| !p.out.is_empty())
    }

    /// Number of peers with a slot (any rank this engine has talked to, or lower).
    pub fn peer_count(&self) -> usize {
        self.peers.len()
    }

    /// The chunk the front `Data` item of a send would carry now.
    fn chunk(st: &SendState, max_long: usize) -> Option<(RecvId, u64, u64, u64, bool)> {
        match st.stage {
            SendStage::Writing {
                recv_id,
                offset,
                pos,
                all_placed,
            } => {
                let n = (st.len - pos).min(max_long.max(1) as u64);
                Some((recv_id, offset, pos, n, all_placed))
            }
            _ => None,
        }
    }

    /// The next message for `dest`, if any. `placed(n)`: whether the transport has placed a
    /// Long of `n` bytes by the time it was sent.
    pub fn peek_out(
        &self,
        dest: Rank,
        max_long: usize,
        placed: &dyn Fn(usize) -> bool,
    ) -> Option<OutMsg<'_>> {
        let out = self.peers.get(dest as usize)?.out.front()?;
        Some(match out {
            Out::Msg(w) => OutMsg {
                wire: w.clone(),
                payload: &[],
                long_offset: None,
            },
            Out::Eager { send_id } => {
                let st = &self.sends[send_id];
                OutMsg {
                    wire: Wire::Eager {
                        tag: st.tag,
                        seq: st.seq,
                    },
                    payload: st.bytes(),
                    long_offset: None,
                }
            }
            Out::Direct { send_id, recv_id } => OutMsg {
                wire: Wire::Direct { recv_id: *recv_id },
                payload: self.sends[send_id].bytes(),
                long_offset: None,
            },
            Out::Data { send_id } => {
                let st = &self.sends[send_id];
                let (recv_id, offset, pos, n, all_placed) = Self::chunk(st, max_long)?;
                let last = pos + n == st.len;
                OutMsg {
                    wire: Wire::Data {
                        recv_id,
                        send_id: *send_id,
                        total: st.len,
                        last,
                        want_ack: last && !(all_placed && placed(n as usize)),
                    },
                    payload: &st.bytes()[pos as usize..(pos + n) as usize],
                    long_offset: Some((offset + pos) as usize),
                }
            }
        })
    }

    /// The message [`MsgEngine::peek_out`] returned was sent: advance.
    pub fn commit_out(&mut self, dest: Rank, max_long: usize, placed: &dyn Fn(usize) -> bool) {
        let Some(p) = self.peers.get_mut(dest as usize) else {
            return;
        };
        let Some(out) = p.out.front() else { return };
        match *out {
            Out::Msg(_) => {
                p.out.pop_front();
            }
            Out::Eager { send_id } | Out::Direct { send_id, .. } => {
                p.out.pop_front();
                if let Some(st) = self.sends.get_mut(&send_id) {
                    st.data = None;
                    st.stage = SendStage::Done(Ok(SendInfo {
                        dest: st.dest,
                        tag: st.tag,
                        len: st.len as usize,
                        protocol: st.protocol,
                        completion: Completion::OnSend,
                    }));
                }
            }
            Out::Data { send_id } => {
                let Some(st) = self.sends.get_mut(&send_id) else {
                    p.out.pop_front();
                    return;
                };
                let Some((recv_id, offset, pos, n, all_placed)) = Self::chunk(st, max_long) else {
                    p.out.pop_front();
                    return;
                };
                let all_placed = all_placed && placed(n as usize);
                let pos = pos + n;
                if pos < st.len {
                    st.stage = SendStage::Writing {
                        recv_id,
                        offset,
                        pos,
                        all_placed,
                    };
                    return;
                }
                p.out.pop_front();
                st.data = None;
                st.stage = if all_placed {
                    SendStage::Done(Ok(SendInfo {
                        dest: st.dest,
                        tag: st.tag,
                        len: st.len as usize,
                        protocol: st.protocol,
                        completion: Completion::WriteBased,
                    }))
                } else {
                    SendStage::AwaitAck
                };
            }
        }
    }

    /// The result of a send, once complete (then forgotten); `None` while in flight.
    pub fn take_send(&mut self, id: SendId) -> Option<Result<SendInfo, MsgError>> {
        match self.sends.get(&id)?.stage {
            SendStage::Done(_) => match self.sends.remove(&id)?.stage {
                SendStage::Done(r) => Some(r),
                _ => None,
            },
            _ => None,
        }
    }

    /// The result of a receive, once complete (then forgotten); `None` while in flight.
    pub fn take_recv(&mut self, id: RecvId) -> Option<Result<RecvInfo, MsgError>> {
        match self.recvs.get(&id)?.stage {
            RecvStage::Done(_) => match self.recvs.remove(&id)?.stage {
                RecvStage::Done(r) => Some(r),
                _ => None,
            },
            _ => None,
        }
    }

    /// Whether a send or receive is known (in flight or completed but not yet taken).
    pub fn knows_send(&self, id: SendId) -> bool {
        self.sends.contains_key(&id)
    }

    /// See [`MsgEngine::knows_send`].
    pub fn knows_recv(&self, id: RecvId) -> bool {
        self.recvs.contains_key(&id)
    }

    fn finish_send(&mut self, id: SendId, r: Result<Completion, MsgError>) {
        if let Some(st) = self.sends.get_mut(&id) {
            st.data = None;
            st.stage = SendStage::Done(r.map(|completion| SendInfo {
                dest: st.dest,
                tag: st.tag,
                len: st.len as usize,
                protocol: st.protocol,
                completion,
            }));
        }
    }

    /// An announced message from `src` was processed: check its sequence number, count it.
    fn announced(&mut self, src: Rank, seq: u64) -> bool {
        let p = self.peer(src);
        if seq != p.processed {
            let expected = p.processed;
            self.violation(
                src,
                format!("announced message {seq} out of order (expected {expected})"),
            );
            return false;
        }
        p.processed += 1;
        if p.processed - p.reported >= SEEN_EVERY {
            p.reported = p.processed;
            let seen = p.processed;
            p.out.push_back(Out::Msg(Wire::Seen { seen }));
        }
        true
    }

    /// Which receive an announced message of `tag` from `src` goes to: the oldest unclaimed
    /// advertised one, else the oldest plain posted one that matches. Removed from its list.
    fn claim(&mut self, src: Rank, tag: u64) -> Option<(RecvId, bool)> {
        self.peer(src);
        let recvs = &self.recvs;
        let p = &mut self.peers[src as usize];
        if let Some(i) = p.advertised.iter().position(|r| recvs[r].tag == tag) {
            return p.advertised.remove(i).map(|r| (r, true));
        }
        let recvs = &self.recvs;
        let i = self.posted.iter().position(|r| {
            let r = &recvs[r];
            r.tag == tag && r.src.is_none_or(|s| s == src)
        })?;
        self.posted.remove(i).map(|r| (r, false))
    }

    /// Handles one message from `src`. `payload`: a Medium's bytes or a Long's length in
    /// bytes (already in the segment at `long_offset`).
    pub fn on_wire(
        &mut self,
        src: Rank,
        wire: Wire,
        payload: &[u8],
        long: Option<(usize, usize)>,
    ) -> Reaction {
        self.events += 1;
        let mut re = Reaction::default();
        match wire {
            Wire::Eager { tag, seq } => {
                if !self.announced(src, seq) {
                    return re;
                }
                let len = payload.len() as u64;
                match self.claim(src, tag) {
                    Some((id, advertised)) => {
                        let r = self.recvs.get_mut(&id).expect("claimed receive exists");
                        if len > r.capacity {
                            // An advertised receive's sender learns it from the RTR.
                            if !advertised {
                                re.reply = Some(Wire::NackEager {
                                    tag,
                                    seq,
                                    len,
                                    capacity: r.capacity,
                                });
                            }
                            r.stage = RecvStage::Done(Err(too_small(len, r.capacity)));
                        } else {
                            re.copy_to = Some(r.offset as usize);
                            r.stage = RecvStage::Done(Ok(RecvInfo {
                                src,
                                tag,
                                len: len as usize,
                                protocol: Protocol::Eager,
                            }));
                        }
                    }
                    None => self.unexpected.push_back(UnexpectedMsg {
                        src,
                        tag,
                        kind: Unexpected::Eager {
                            seq,
                            data: payload.to_vec(),
                        },
                    }),
                }
            }
            Wire::Rts {
                tag,
                seq,
                len,
                send_id,
            } => {
                if !self.announced(src, seq) {
                    return re;
                }
                match self.claim(src, tag) {
                    Some((id, advertised)) => {
                        let r = self.recvs.get_mut(&id).expect("claimed receive exists");
                        if len > r.capacity {
                            if !advertised {
                                re.reply = Some(Wire::NackRts {
                                    send_id,
                                    capacity: r.capacity,
                                });
                            }
                            r.stage = RecvStage::Done(Err(too_small(len, r.capacity)));
                        } else {
                            if !advertised {
                                re.reply = Some(Wire::Cts {
                                    send_id,
                                    recv_id: id,
                                    offset: r.offset,
                                    capacity: r.capacity,
                                });
                            }
                            r.stage = RecvStage::AwaitData {
                                from: src,
                                total: Some(len),
                                got: 0,
                                protocol: if advertised {
                                    Protocol::Crossed
                                } else {
                                    Protocol::SenderInitiated
                                },
                            };
                        }
                    }
                    None => self.unexpected.push_back(UnexpectedMsg {
                        src,
                        tag,
                        kind: Unexpected::Rts { len, send_id },
                    }),
                }
            }
            Wire::Rtr {
                recv_id,
                tag,
                offset,
                capacity,
                seen,
            } => self.on_rtr(src, recv_id, tag, offset, capacity, seen),
            Wire::Cts {
                send_id,
                recv_id,
                offset,
                capacity,
            } => {
                let p = self.peer(src);
                p.candidates
                    .retain(|c| !matches!(c.kind, CandKind::Rts { send_id: s } if s == send_id));
                let Some(st) = self.sends.get_mut(&send_id) else {
                    self.violation(src, format!("CTS for unknown send {send_id}"));
                    return re;
                };
                if st.dest != src || !matches!(st.stage, SendStage::AwaitCts) {
                    self.violation(src, format!("unexpected CTS for send {send_id}"));
                    return re;
                }
                if st.len > capacity {
                    let len = st.len;
                    self.violation(src, "CTS for a buffer too small");
                    self.finish_send(send_id, Err(too_small(len, capacity)));
                    return re;
                }
                st.stage = SendStage::Writing {
                    recv_id,
                    offset,
                    pos: 0,
                    all_placed: true,
                };
                self.peer(src).out.push_back(Out::Data { send_id });
            }
            Wire::NackRts { send_id, capacity } => {
                let p = self.peer(src);
                p.candidates
                    .retain(|c| !matches!(c.kind, CandKind::Rts { send_id: s } if s == send_id));
                match self.sends.get(&send_id) {
                    Some(st) if st.dest == src && matches!(st.stage, SendStage::AwaitCts) => {
                        let len = st.len;
                        self.finish_send(send_id, Err(too_small(len, capacity)));
                    }
                    _ => self.violation(src, format!("unexpected NACK for send {send_id}")),
                }
            }
            Wire::NackEager {
                tag,
                seq,
                len,
                capacity,
            } => {
                // The tag travels with the NACK: a SEEN may have pruned the candidate already.
                self.peer(src).candidates.retain(|c| c.seq != seq);
                self.late_errors.push(LateError {
                    dest: src,
                    tag,
                    error: too_small(len, capacity),
                });
            }
            Wire::NackRtr { recv_id, len } => {
                if self.unadvertise(src, recv_id) {
                    let r = self.recvs.get_mut(&recv_id).expect("advertised exists");
                    r.stage = RecvStage::Done(Err(too_small(len, r.capacity)));
                }
            }
            Wire::Direct { recv_id } => {
                if self.unadvertise(src, recv_id) {
                    let len = payload.len() as u64;
                    let r = self.recvs.get_mut(&recv_id).expect("advertised exists");
                    if len > r.capacity {
                        let cap = r.capacity;
                        r.stage = RecvStage::Done(Err(too_small(len, cap)));
                        self.violation(src, "direct message larger than the advertised buffer");
                    } else {
                        re.copy_to = Some(r.offset as usize);
                        r.stage = RecvStage::Done(Ok(RecvInfo {
                            src,
                            tag: r.tag,
                            len: len as usize,
                            protocol: Protocol::EagerDirect,
                        }));
                    }
                }
            }
            Wire::Data {
                recv_id,
                send_id,
                total,
                last,
                want_ack,
            } => {
                if want_ack {
                    // Even if the data is wrong: the sender must not wait forever.
                    re.reply = Some(Wire::Ack { send_id });
                }
                self.on_data(src, recv_id, total, last, long.unwrap_or((0, 0)));
            }
            Wire::Seen { seen } => {
                self.peer(src).candidates.retain(|c| c.seq >= seen);
            }
            Wire::Ack { send_id } => match self.sends.get(&send_id) {
                Some(st) if st.dest == src && matches!(st.stage, SendStage::AwaitAck) => {
                    self.finish_send(send_id, Ok(Completion::Ack));
                }
                _ => self.violation(src, format!("unexpected ACK for send {send_id}")),
            },
        }
        re
    }

    /// Removes an advertised, unclaimed receive of `src`; false (and a violation) if it is not.
    fn unadvertise(&mut self, src: Rank, recv_id: RecvId) -> bool {
        let p = self.peer(src);
        match p.advertised.iter().position(|&r| r == recv_id) {
            Some(i) => {
                p.advertised.remove(i);
                true
            }
            None => {
                self.violation(src, format!("receive {recv_id} is not advertised to it"));
                false
            }
        }
    }

    fn on_rtr(
        &mut self,
        src: Rank,
        recv_id: RecvId,
        tag: u64,
        offset: u64,
        capacity: u64,
        seen: u64,
    ) {
        let p = self.peer(src);
        // No later RTR can match what the receiver had processed before this one.
        while p.candidates.front().is_some_and(|c| c.seq < seen) {
            p.candidates.pop_front();
        }
        let Some(i) = p.candidates.iter().position(|c| c.tag == tag) else {
            p.rtrs.push_back(StoredRtr {
                recv_id,
                tag,
                offset,
                capacity,
            });
            return;
        };
        let c = p.candidates.remove(i).expect("position is in range");
        match c.kind {
            CandKind::Eager { len } => {
                if len > capacity {
                    self.late_errors.push(LateError {
                        dest: src,
                        tag,
                        error: too_small(len, capacity),
                    });
                }
            }
            CandKind::Rts { send_id } => {
                let Some(st) = self.sends.get_mut(&send_id) else {
                    self.violation(src, "RTR matched a forgotten send");
                    return;
                };
                if !matches!(st.stage, SendStage::AwaitCts) {
                    self.violation(src, format!("RTR matched send {send_id} twice"));
                    return;
                }
                st.protocol = Protocol::Crossed;
                if st.len > capacity {
                    let len = st.len;
                    self.finish_send(send_id, Err(too_small(len, capacity)));
                } else {
                    st.stage = SendStage::Writing {
                        recv_id,
                        offset,
                        pos: 0,
                        all_placed: true,
                    };
                    self.peer(src).out.push_back(Out::Data { send_id });
                }
            }
        }
    }

    fn on_data(
        &mut self,
        src: Rank,
        recv_id: RecvId,
        total: u64,
        last: bool,
        long: (usize, usize),
    ) {
        let (at, n) = (long.0 as u64, long.1 as u64);
        // The first chunk of a write into an advertised receive claims it.
        let fresh = self
            .recvs
            .get(&recv_id)
            .is_some_and(|r| matches!(r.stage, RecvStage::Posted));
        if fresh {
            if !self.unadvertise(src, recv_id) {
                return;
            }
            if let Some(r) = self.recvs.get_mut(&recv_id) {
                r.stage = RecvStage::AwaitData {
                    from: src,
                    total: None,
                    got: 0,
                    protocol: Protocol::ReceiverInitiated,
                };
            }
        }
        let Some(r) = self.recvs.get_mut(&recv_id) else {
            self.violation(src, format!("data for unknown receive {recv_id}"));
            return;
        };
        let RecvStage::AwaitData {
            from,
            total: expect,
            got,
            protocol,
        } = &mut r.stage
        else {
            self.violation(src, format!("data for receive {recv_id} not awaiting it"));
            return;
        };
        let bad = if *from != src {
            Some("data from the wrong rank")
        } else if expect.is_some_and(|e| e != total) || total > r.capacity {
            Some("data length differs from the announced one")
        } else if at != r.offset + *got || *got + n > total {
            Some("data chunk outside the receive buffer")
        } else {
            None
        };
        if let Some(what) = bad {
            r.stage = RecvStage::Done(Err(MsgError::PeerMisbehaved {
                peer: src,
                what: what.into(),
            }));
            self.violation(src, what);
            return;
        }
        *expect = Some(total);
        *got += n;
        if last {
            let info = if *got == total {
                Ok(RecvInfo {
                    src,
                    tag: r.tag,
                    len: total as usize,
                    protocol: *protocol,
                })
            } else {
                Err(MsgError::PeerMisbehaved {
                    peer: src,
                    what: "last chunk before all data".into(),
                })
            };
            let failed = info.is_err();
            r.stage = RecvStage::Done(info);
            if failed {
                self.violation(src, "last chunk before all data");
            }
        }
    }

    /// Decodes nothing: test helper listing in-flight state sizes (sends, recvs, candidates).
    #[cfg(test)]
    fn residue(&self) -> (usize, usize, usize, usize) {
        (
            self.sends.len(),
            self.recvs.len(),
            self.unexpected.len(),
            self.peers.iter().map(|p| p.rtrs.len()).sum(),
        )
    }
}

#[cfg(test)]
mod tests;
