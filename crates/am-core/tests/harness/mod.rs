//! A deterministic cluster: N [`Endpoint`]s joined by in-memory queues, driven step by step
//! with no threads and no clock (quinn-proto's `Pair::drive`, for N ranks).
//!
//! - Messages between one pair stay in order; which pair delivers next is chosen by a seeded
//!   generator, so every seed is one reproducible interleaving of the pairs.
//! - The device can refuse sends (`busy`), a queue can fill (`capacity`), a rank can leave
//!   (its queues are dropped and the others are told, as a transport's poll would), be lost,
//!   or the job be aborted.
//! - A wait that can never end fails the test at once ("nothing to deliver"), and every
//!   drive is bounded in steps, so no scenario can hang.

#![allow(dead_code)]

use std::collections::VecDeque;
use std::rc::Rc;
use std::task::Poll;

use am_core::atomic::Batch;
use am_core::endpoint::Endpoint;
use am_core::transport::{NicInfo, Remote, Rma, RmaDone, Sink, Source};
use am_core::{
    AmError, CreditPolicy, Delivery, Handlers, Limits, Local, Outgoing, Rank, Received, Route,
    SendError, SharedBytes, StaticCredits, Transport, TransportError, Tx,
};
use am_shm::Segment;

/// The most steps one drive may take before the test fails.
pub const MAX_STEPS: usize = 200_000;

/// One message on a queue.
pub struct Packet {
    pub src: Rank,
    /// Head and payload, as a message transport carries them (Long payloads inline).
    pub bytes: Vec<u8>,
    pub reply: bool,
    /// A request's route: its number among the requests of its pair, from 1.
    pub route: Route,
}

/// The in-memory network: `queues[dest][src]`.
pub struct Net {
    pub queues: Vec<Vec<VecDeque<Packet>>>,
    /// Per sender: how many of its next sends the device refuses with `Busy`.
    pub busy: Vec<u32>,
    /// Messages a queue holds before the device refuses more (`Busy`).
    pub capacity: usize,
    pub departed: Vec<bool>,
    pub lost: Vec<bool>,
    pub aborted: bool,
    /// Every message that went out: (src, dest, reply).
    pub sent: Vec<(Rank, Rank, bool)>,
    /// `requests[src][dest]`: requests sent on the pair (the last one's route).
    pub requests: Vec<Vec<u64>>,
    /// `answered[replier][requester]`: the route of the latest request answered. The network
    /// pairs replies with requests as sci's reply slots do: a reply answers the request its
    /// route names and every earlier one still unanswered, so a reply routed to a request
    /// already answered is refused.
    pub answered: Vec<Vec<u64>>,
    /// Replies refused for their route: (replier, requester, route).
    pub misrouted: Vec<(Rank, Rank, u64)>,
    /// Every rank's segment, for the NIC's own one-sided operations.
    pub segments: Vec<Rc<Segment>>,
    pub limits: Limits,
    /// Whether the NIC reaches peers' segments itself (puts, gets, atomics), as the
    /// shared-memory NICs do; otherwise the core sends them as messages.
    pub rma: bool,
    /// Per initiator: how many of its next one-sided operations the NIC refuses with `Busy`.
    pub rma_busy: Vec<u32>,
    /// Per initiator: the NIC refuses its `n`th next one-sided operation with `Busy`, once
    /// (0: none), so that a test can let the operations before it through.
    pub rma_refuse: Vec<u32>,
    /// Per initiator: the NIC fails its `n`th next one-sided operation, once (0: none), as
    /// one that met a target's segment it cannot use (the target's misbehavior, which ends
    /// neither the node nor the peer).
    pub rma_fail: Vec<u32>,
    /// One-sided operations the NIC refused so far (a round with a refusal is not stuck:
    /// the operation goes again).
    pub rma_refused: u32,
    /// Every one-sided operation the NIC did: (messages sent before it, initiator, target,
    /// what), so a test can tell its order among the messages.
    pub nic_ops: Vec<(usize, Rank, Rank, &'static str)>,
}

/// A rank's side of the network: what [`Endpoint`] calls to send, and (with `rma`) a NIC
/// that reaches every rank's segment.
pub struct Wire<'a> {
    net: &'a mut Net,
    from: Rank,
}

impl Wire<'_> {
    /// A one-sided operation of the NIC on `peer`'s segment: `Busy` while the test says so;
    /// recorded in `nic_ops`.
    fn nic<R>(
        &mut self,
        peer: Rank,
        what: &'static str,
        op: impl FnOnce(SharedBytes<'_>) -> Result<R, SendError>,
    ) -> Result<R, SendError> {
        let net = &mut *self.net;
        assert!(net.rma, "the core asked a NIC without RMA for a {what}");
        if net.lost[peer as usize] {
            return Err(SendError::PeerLost(peer));
        }
        let nth = &mut net.rma_refuse[self.from as usize];
        if *nth > 0 {
            *nth -= 1;
            if *nth == 0 {
                net.rma_refused += 1;
                return Err(SendError::Busy);
            }
        }
        let nth = &mut net.rma_fail[self.from as usize];
        if *nth > 0 {
            *nth -= 1;
            if *nth == 0 {
                return Err(SendError::PeerMisbehaved {
                    peer: Some(peer),
                    what: format!("a {what} into a segment the test says is unusable"),
                });
            }
        }
        let busy = &mut net.rma_busy[self.from as usize];
        if *busy > 0 {
            *busy -= 1;
            net.rma_refused += 1;
            return Err(SendError::Busy);
        }
        let r = op(net.segments[peer as usize].byte_area())?;
        net.nic_ops.push((net.sent.len(), self.from, peer, what));
        Ok(r)
    }
}

impl Transport for Wire<'_> {
    fn rank(&self) -> Rank {
        self.from
    }
    fn size(&self) -> u32 {
        self.net.queues.len() as u32
    }
    /// With `rma`, the NIC reaches every rank's segment: puts, gets and atomics.
    fn info(&self) -> NicInfo {
        let mut info = NicInfo::new("cluster", self.net.limits);
        let caps = &mut info.capabilities;
        caps.put = self.net.rma;
        caps.get = self.net.rma;
        caps.atomics = self.net.rma;
        info
    }
    fn segment(&self) -> SharedBytes<'_> {
        self.net.segments[self.from as usize].byte_area()
    }
    /// Delivers the oldest message of the lowest sender with one waiting (the cluster's own
    /// deliveries choose the pair by the seed instead).
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        let me = self.from as usize;
        let Some(packet) = self.net.queues[me].iter_mut().find_map(|q| q.pop_front()) else {
            return Ok(None);
        };
        let segment = Rc::clone(&self.net.segments[me]);
        let delivery = Delivery {
            src: packet.src,
            bytes: Received::Private(&packet.bytes),
            payload_placed: false,
            route: packet.route,
        };
        Ok(Some(f(delivery, segment.byte_area(), self)))
    }
    /// Contiguous puts, gets and atomics on segment 0 one by one; every other shape by
    /// pieces of those. A batch one by one, as the contract says: one refused for good does
    /// not stop the others, a busy NIC stops the batch.
    fn rma(&mut self, request: Rma<'_>) -> Result<RmaDone, SendError> {
        match request {
            Rma::Put {
                dest,
                to: Remote::At(offset),
                from: Source::Bytes(data),
            } => self
                .nic(dest, "put", |seg| {
                    am_core::rma::put_into(dest, seg, offset, data)
                })
                .map(|()| RmaDone::moved()),
            Rma::Get {
                src,
                from: Remote::At(offset),
                into: Sink::Bytes(dst),
            } => self
                .nic(src, "get", |seg| {
                    am_core::rma::get_from(src, seg, offset, dst)
                })
                .map(|()| RmaDone::moved()),
            Rma::Atomic {
                dest,
                at: Remote::At(offset),
                atomic,
            } => self
                .nic(dest, "atomic", |seg| atomic.apply_to(dest, seg, offset))
                .map(RmaDone::old),
            Rma::Atomics { batch, outcome } => {
                let mut error = None;
                for (done, p) in batch.iter().enumerate() {
                    match self.nic(p.dest, "posted", |seg| {
                        p.atomic.apply_to(p.dest, seg, p.offset)
                    }) {
                        Ok(_) => {}
                        Err(SendError::Busy) => {
                            *outcome = Batch { done, error };
                            return Ok(RmaDone::moved());
                        }
                        Err(e) => error = error.or(Some(e)),
                    }
                }
                *outcome = Batch {
                    done: batch.len(),
                    error,
                };
                Ok(RmaDone::moved())
            }
            other => am_core::rma::by_pieces(self, other),
        }
    }
}

impl Tx for Wire<'_> {
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        let net = &mut *self.net;
        if net.aborted {
            return Err(SendError::JobAborted);
        }
        let Some(queue) = net.queues.get_mut(dest as usize) else {
            return Err(SendError::PeerLost(dest));
        };
        if net.lost[dest as usize] {
            return Err(SendError::PeerLost(dest));
        }
        if net.departed[dest as usize] {
            return Err(SendError::PeerDeparted(dest));
        }
        let busy = &mut net.busy[self.from as usize];
        if *busy > 0 {
            *busy -= 1;
            return Err(SendError::Busy);
        }
        let queue = &mut queue[self.from as usize];
        if queue.len() >= net.capacity {
            return Err(SendError::Busy);
        }
        let (from, to) = (self.from as usize, dest as usize);
        let route = match msg.reply_to {
            Some(route) => {
                let r = route.get();
                if r <= net.answered[from][to] || r > net.requests[to][from] {
                    net.misrouted.push((self.from, dest, r));
                    return Err(SendError::NoRequestToAnswer(route));
                }
                net.answered[from][to] = r;
                Route::NONE
            }
            None => {
                net.requests[from][to] += 1;
                Route::new(net.requests[from][to])
            }
        };
        let mut bytes = msg.head.to_vec();
        msg.payload.append_to(&mut bytes);
        queue.push_back(Packet {
            src: self.from,
            bytes,
            reply: msg.is_reply(),
            route,
        });
        net.sent.push((self.from, dest, msg.is_reply()));
        Ok(())
    }
}

/// One rank: its endpoint, its segment and the errors its deliveries reported.
pub struct Node {
    pub ep: Endpoint<Local>,
    pub segment: Rc<Segment>,
    pub errors: Vec<AmError>,
}

/// xorshift64*: the seeded choice of which pair delivers next.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n.max(1)
    }
}

/// What a cluster is built with.
#[derive(Clone, Copy)]
pub struct Shape {
    pub ranks: u32,
    pub credits: u32,
    pub segment: usize,
    pub limits: Limits,
    pub capacity: usize,
    /// The NIC reaches every rank's segment (puts, gets and atomics without messages): fixed
    /// for the cluster's life, as a NIC's capabilities are.
    pub rma: bool,
}

impl Shape {
    pub fn new(ranks: u32) -> Shape {
        Shape {
            ranks,
            credits: 4,
            segment: 4096,
            limits: Limits {
                max_args: 16,
                max_medium: 256,
                max_long: 1024,
                max_credits: 64,
            },
            capacity: 64,
            rma: false,
        }
    }

    /// What a rank's NIC says it is ([`am_core::Transport::info`]).
    pub fn info(&self) -> NicInfo {
        let mut info = NicInfo::new("cluster", self.limits);
        let caps = &mut info.capabilities;
        caps.put = self.rma;
        caps.get = self.rma;
        caps.atomics = self.rma;
        info
    }
}

/// N endpoints on one in-memory network.
pub struct Cluster {
    pub net: Net,
    pub nodes: Vec<Node>,
    pub rng: Rng,
}

impl Cluster {
    /// A cluster whose rank `r` has the handlers `handlers(r)` and a segment of
    /// `segment(r)` bytes, not started.
    pub fn build(
        shape: Shape,
        seed: u64,
        mut handlers: impl FnMut(Rank) -> Handlers<Local>,
        mut segment: impl FnMut(Rank) -> usize,
        mut credits: impl FnMut(Rank) -> Box<dyn CreditPolicy + Send>,
    ) -> Cluster {
        let n = shape.ranks as usize;
        let nodes: Vec<Node> = (0..shape.ranks)
            .map(|r| {
                let len = segment(r);
                Node {
                    ep: Endpoint::new(r, shape.ranks, shape.info(), len, handlers(r), credits(r)),
                    segment: Rc::new(Segment::heap(0, len).expect("a heap segment")),
                    errors: Vec::new(),
                }
            })
            .collect();
        let segments = nodes.iter().map(|n| Rc::clone(&n.segment)).collect();
        Cluster {
            net: Net {
                queues: (0..n)
                    .map(|_| (0..n).map(|_| VecDeque::new()).collect())
                    .collect(),
                busy: vec![0; n],
                capacity: shape.capacity,
                departed: vec![false; n],
                lost: vec![false; n],
                aborted: false,
                sent: Vec::new(),
                requests: vec![vec![0; n]; n],
                answered: vec![vec![0; n]; n],
                misrouted: Vec::new(),
                segments,
                limits: shape.limits,
                rma: shape.rma,
                rma_busy: vec![0; n],
                rma_refuse: vec![0; n],
                rma_fail: vec![0; n],
                rma_refused: 0,
                nic_ops: Vec::new(),
            },
            nodes,
            rng: Rng::new(seed),
        }
    }

    /// A cluster of equal ranks with static credits, not started.
    pub fn new(shape: Shape, seed: u64, handlers: impl FnMut(Rank) -> Handlers<Local>) -> Cluster {
        Cluster::build(
            shape,
            seed,
            handlers,
            |_| shape.segment,
            |_| Box::new(StaticCredits::new(shape.ranks, shape.credits)),
        )
    }

    /// A cluster of equal ranks, started (start-up checked to succeed everywhere).
    pub fn started(
        shape: Shape,
        seed: u64,
        handlers: impl FnMut(Rank) -> Handlers<Local>,
    ) -> Cluster {
        let mut c = Cluster::new(shape, seed, handlers);
        for r in c.start() {
            r.expect("start-up");
        }
        c
    }

    pub fn size(&self) -> u32 {
        self.nodes.len() as u32
    }

    /// Runs start-up on every rank.
    pub fn start(&mut self) -> Vec<Result<(), am_core::StartError>> {
        self.drive_all(|_, ep, tx| ep.start_step(tx))
    }

    /// A rank's sender.
    pub fn wire(&mut self, rank: Rank) -> (&mut Endpoint<Local>, Wire<'_>) {
        let node = &mut self.nodes[rank as usize];
        (
            &mut node.ep,
            Wire {
                net: &mut self.net,
                from: rank,
            },
        )
    }

    /// A rank's endpoint and segment, to start a put or get.
    pub fn with_segment(&mut self, rank: Rank) -> (&mut Endpoint<Local>, am_core::SharedBytes<'_>) {
        let node = &mut self.nodes[rank as usize];
        (&mut node.ep, node.segment.byte_area())
    }

    /// Ranks with a message waiting.
    fn ready(&self) -> Vec<Rank> {
        (0..self.size())
            .filter(|&d| self.net.queues[d as usize].iter().any(|q| !q.is_empty()))
            .collect()
    }

    /// True if a message waits anywhere.
    pub fn in_flight(&self) -> bool {
        !self.ready().is_empty()
    }

    /// Delivers one message to `dest` (from a pair chosen by the seed), after `dest` sent
    /// the replies its device refused. Returns false if none waits.
    pub fn deliver_to(&mut self, dest: Rank) -> bool {
        let d = dest as usize;
        let sources: Vec<usize> = (0..self.nodes.len())
            .filter(|&s| !self.net.queues[d][s].is_empty())
            .collect();
        if sources.is_empty() {
            return false;
        }
        let src = sources[self.rng.below(sources.len())];
        let packet = self.net.queues[d][src].pop_front().expect("a packet");
        let node = &mut self.nodes[d];
        let mut wire = Wire {
            net: &mut self.net,
            from: dest,
        };
        if let Err(e) = node.ep.flush(&mut wire) {
            if let Some(e) = node.ep.absorb(e) {
                node.errors.push(e);
            }
        }
        let delivery = Delivery {
            src: packet.src,
            bytes: Received::Private(&packet.bytes),
            payload_placed: false,
            route: packet.route,
        };
        if let Err(e) = node
            .ep
            .handle(delivery, node.segment.byte_area(), &mut wire)
        {
            if let Some(e) = node.ep.absorb(e) {
                node.errors.push(e);
            }
        }
        // As a driver's poll that finds nothing more: the implicit replies still owed go.
        if self.net.queues[d].iter().all(|q| q.is_empty()) {
            self.flush_acks(dest);
        }
        true
    }

    /// Sends what `rank` owes as coalesced implicit replies (see `Endpoint::flush_acks`).
    pub fn flush_acks(&mut self, rank: Rank) {
        let node = &mut self.nodes[rank as usize];
        if !node.ep.acks_owed() {
            return;
        }
        let mut wire = Wire {
            net: &mut self.net,
            from: rank,
        };
        if let Err(e) = node.ep.flush_acks(&mut wire) {
            if let Some(e) = node.ep.absorb(e) {
                node.errors.push(e);
            }
        }
    }

    /// Delivers one message somewhere (rank chosen by the seed). False if none waits.
    pub fn deliver_one(&mut self) -> bool {
        let ready = self.ready();
        if ready.is_empty() {
            return false;
        }
        let dest = ready[self.rng.below(ready.len())];
        self.deliver_to(dest)
    }

    /// Every rank sends the replies its device refused (as a driver does before each poll),
    /// and one with nothing to receive the implicit replies it owes.
    pub fn flush_all(&mut self) {
        for r in 0..self.size() {
            if self.net.queues[r as usize].iter().all(|q| q.is_empty()) {
                self.flush_acks(r);
            }
        }
        for (r, node) in self.nodes.iter_mut().enumerate() {
            let mut wire = Wire {
                net: &mut self.net,
                from: r as Rank,
            };
            if let Err(e) = node.ep.flush(&mut wire) {
                if let Some(e) = node.ep.absorb(e) {
                    node.errors.push(e);
                }
            }
        }
    }

    /// Delivers until nothing is in flight and no reply waits (bounded).
    pub fn settle(&mut self) {
        for _ in 0..MAX_STEPS {
            self.flush_all();
            if !self.deliver_one() && self.net.busy.iter().all(|&b| b == 0) {
                self.flush_all();
                if !self.in_flight() {
                    assert!(
                        self.net.misrouted.is_empty(),
                        "replies routed to requests already answered: {:?}",
                        self.net.misrouted
                    );
                    return;
                }
            }
        }
        panic!("messages still in flight after {MAX_STEPS} deliveries");
    }

    /// Drives one step function per rank until every rank is ready, delivering messages
    /// between steps in the seed's order. Fails (never hangs) if ranks wait with nothing
    /// left to deliver.
    pub fn drive_all<R>(
        &mut self,
        mut step: impl FnMut(Rank, &mut Endpoint<Local>, &mut Wire<'_>) -> Poll<R>,
    ) -> Vec<R> {
        let ranks: Vec<Rank> = (0..self.size()).collect();
        self.drive(&ranks, &mut step)
            .into_iter()
            .map(|r| r.expect("every rank"))
            .collect()
    }

    /// As [`Cluster::drive_all`], for some ranks (the others only receive). Results in the
    /// order of `ranks`.
    pub fn drive<R>(
        &mut self,
        ranks: &[Rank],
        mut step: impl FnMut(Rank, &mut Endpoint<Local>, &mut Wire<'_>) -> Poll<R>,
    ) -> Vec<Option<R>> {
        let mut done: Vec<Option<R>> = ranks.iter().map(|_| None).collect();
        for _ in 0..MAX_STEPS {
            let sent_before = self.net.sent.len();
            let refused_before = self.net.rma_refused;
            let busy_before: u32 = self.net.busy.iter().sum();
            let ready_before = done.iter().filter(|d| d.is_some()).count();
            self.flush_all();
            for (i, &r) in ranks.iter().enumerate() {
                if done[i].is_none() {
                    let node = &mut self.nodes[r as usize];
                    let mut wire = Wire {
                        net: &mut self.net,
                        from: r,
                    };
                    if let Poll::Ready(v) = step(r, &mut node.ep, &mut wire) {
                        done[i] = Some(v);
                    }
                }
            }
            if done.iter().all(Option::is_some) {
                return done;
            }
            if !self.deliver_one() {
                // A refused send this round may succeed the next, and a rank ready this
                // round may be what the others' steps look at: only a round in which
                // nothing was refused, sent or delivered and no rank became ready is stuck.
                let ready = done.iter().filter(|d| d.is_some()).count();
                let moving = self.nodes.iter().any(|n| n.ep.has_local_work());
                if busy_before > 0
                    || self.net.sent.len() != sent_before
                    || self.net.rma_refused != refused_before
                    || ready != ready_before
                    || moving
                {
                    continue;
                }
                let waiting: Vec<Rank> = ranks
                    .iter()
                    .zip(&done)
                    .filter(|(_, d)| d.is_none())
                    .map(|(&r, _)| r)
                    .collect();
                let states: Vec<String> =
                    self.nodes.iter().map(|n| format!("{:?}", n.ep)).collect();
                panic!("ranks {waiting:?} wait and nothing is left to deliver: {states:?}");
            }
        }
        panic!("not done after {MAX_STEPS} steps");
    }

    /// `rank` leaves the job cleanly: what was queued for it is dropped and every other rank
    /// is told (as its transport's poll would tell it).
    pub fn depart(&mut self, rank: Rank) {
        self.net.departed[rank as usize] = true;
        for q in &mut self.net.queues[rank as usize] {
            q.clear();
        }
        for (r, node) in self.nodes.iter_mut().enumerate() {
            if r != rank as usize {
                node.ep.mark_departed(rank);
            }
        }
    }

    /// `rank` has left, but no rank's transport has reported it yet: sends to it fail with
    /// `PeerDeparted`, what it sent before it left is still delivered, and
    /// [`Cluster::report_departure`] is the report a transport's poll makes after that.
    pub fn leave_unreported(&mut self, rank: Rank) {
        self.net.departed[rank as usize] = true;
        for q in &mut self.net.queues[rank as usize] {
            q.clear();
        }
    }

    /// Every other rank's transport reports `rank`'s departure (after
    /// [`Cluster::leave_unreported`]).
    pub fn report_departure(&mut self, rank: Rank) {
        for (r, node) in self.nodes.iter_mut().enumerate() {
            if r != rank as usize {
                node.ep.mark_departed(rank);
            }
        }
    }

    /// `rank` dies: as [`Cluster::depart`], reported as a loss.
    pub fn lose(&mut self, rank: Rank) {
        self.net.lost[rank as usize] = true;
        for q in &mut self.net.queues[rank as usize] {
            q.clear();
        }
        for (r, node) in self.nodes.iter_mut().enumerate() {
            if r != rank as usize {
                node.ep.mark_lost(rank);
            }
        }
    }

    /// Puts raw bytes on the queue from `src` to `dest`, as a misbehaving peer would.
    pub fn inject(&mut self, src: Rank, dest: Rank, bytes: Vec<u8>) {
        // Numbered as a request: if the bytes say it is one, its reply finds it.
        self.net.requests[src as usize][dest as usize] += 1;
        let route = Route::new(self.net.requests[src as usize][dest as usize]);
        self.net.queues[dest as usize][src as usize].push_back(Packet {
            src,
            bytes,
            reply: false,
            route,
        });
    }

    /// Takes the messages queued from `src` to `dest` (what a hand-driven peer reads).
    pub fn take(&mut self, src: Rank, dest: Rank) -> Vec<Packet> {
        self.net.queues[dest as usize][src as usize]
            .drain(..)
            .collect()
    }

    /// The errors rank `r`'s deliveries reported since the last call.
    pub fn errors(&mut self, r: Rank) -> Vec<AmError> {
        std::mem::take(&mut self.nodes[r as usize].errors)
    }
}

/// One barrier per rank, driven by steps as a driver's `barrier` is: the first step of a
/// rank starts its barrier ([`Endpoint::barrier_start`]), the later ones complete it
/// ([`Endpoint::poll_op`]); a completed one (or one that failed) makes the next step start
/// the next barrier, which resumes a failed one.
#[derive(Default)]
pub struct Barriers(Vec<Option<am_core::Op<()>>>);

impl Barriers {
    pub fn step(
        &mut self,
        rank: Rank,
        ep: &mut Endpoint<Local>,
        tx: &mut Wire<'_>,
    ) -> Poll<Result<(), am_core::AmError>> {
        let r = rank as usize;
        if self.0.len() <= r {
            self.0.resize_with(r + 1, || None);
        }
        let op = match &mut self.0[r] {
            Some(op) => op,
            slot => match ep.barrier_start(tx) {
                Poll::Ready(Ok(op)) => slot.insert(op),
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            },
        };
        let polled = ep.poll_op(tx, op, None);
        if polled.is_ready() {
            self.0[r] = None;
        }
        polled
    }
}
