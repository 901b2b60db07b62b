//! A real `Node<Loopback, Local>` (rank 0) against a hand-driven raw `Loopback` peer (rank 1) that
//! breaks the protocol: malformed bytes, unknown handlers, stray replies, out-of-segment Longs and
//! bad system messages are each reported as `AmError::PeerMisbehaved`, run no handler, keep the
//! credits right, and leave the node working.

use am_core::Local;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use am_core::wire::{Header, MAX_HEAD_LEN};
use am_core::{
    run_ranks, AmError, AmKind, Category, Config, HandlerId, Handlers, Loopback, LoopbackConfig,
    Misbehavior, Node, Outgoing, SendError, Transport, Tx, WaitMode,
};

/// Bound on every wait of either side, and on a whole test.
const LIMIT: Duration = Duration::from_secs(10);
/// Credits per peer of the node.
const CREDITS: u32 = 4;
/// Segment size of both ranks.
const SEG: usize = 4096;

const REQ_SHORT: HandlerId = HandlerId(1);
const REQ_MEDIUM: HandlerId = HandlerId(2);
const REQ_LONG: HandlerId = HandlerId(3);
const REP_SHORT: HandlerId = HandlerId(10);
const REP_MEDIUM: HandlerId = HandlerId(11);
const REP_LONG: HandlerId = HandlerId(12);
/// Registered nowhere.
const UNKNOWN: u8 = 99;

// System opcodes, to forge raw system messages.
use am_core::protocol::opcode::{
    ACK as SYS_ACK, ACKS as SYS_ACKS, ATOMIC as SYS_ATOMIC, ATOMICS as SYS_ATOMICS,
    ATOMIC_DONE as SYS_ATOMIC_DONE, BARRIER as SYS_BARRIER, EXIT as SYS_EXIT, GET as SYS_GET,
    GET_DATA as SYS_GET_DATA, HELLO as SYS_HELLO, HELLO_VERDICT as SYS_HELLO_RESULT,
    PUT as SYS_PUT, PUT_DONE as SYS_PUT_DONE, PUT_REGIONS as SYS_PUT_REGIONS,
};
use am_core::protocol::opcode::{
    ATOMIC_AT as SYS_ATOMIC_AT, GET_AT as SYS_GET_AT, PUT_AT as SYS_PUT_AT,
};

// ---------------------------------------------------------------------------------------------
// The node's side.

/// What the node's handlers saw.
#[derive(Default)]
struct Seen {
    req_short: Cell<u32>,
    req_medium: Cell<u32>,
    req_long: Cell<u32>,
    /// The segment the last Long landed in.
    long_segment: Cell<Option<am_core::SegmentId>>,
    replies: Cell<u32>,
    last_reply: RefCell<Vec<u32>>,
}

impl Seen {
    fn requests(&self) -> u32 {
        self.req_short.get() + self.req_medium.get() + self.req_long.get()
    }
}

/// The table both sides agree on (the raw peer only needs its digest).
fn handlers(seen: &Rc<Seen>) -> Handlers<Local> {
    let mut h = Handlers::local();
    let s = seen.clone();
    h.request(REQ_SHORT, "req_short", AmKind::Short, move |msg, token| {
        s.req_short.set(s.req_short.get() + 1);
        token
            .reply_short(REP_SHORT, &[msg.args()[0] + 1])
            .expect("reply");
    })
    .unwrap();
    let s = seen.clone();
    h.request(
        REQ_MEDIUM,
        "req_medium",
        AmKind::Medium,
        move |msg, token| {
            s.req_medium.set(s.req_medium.get() + 1);
            token
                .reply_short(REP_SHORT, &[msg.payload().len() as u32])
                .expect("reply");
        },
    )
    .unwrap();
    let s = seen.clone();
    h.request(REQ_LONG, "req_long", AmKind::Long, move |msg, token| {
        s.req_long.set(s.req_long.get() + 1);
        s.long_segment.set(msg.long_segment());
        let at = msg.long_offset().expect("a Long has an offset") as u32;
        token.reply_short(REP_SHORT, &[at]).expect("reply");
    })
    .unwrap();
    for (id, name, kind) in [
        (REP_SHORT, "rep_short", AmKind::Short),
        (REP_MEDIUM, "rep_medium", AmKind::Medium),
        (REP_LONG, "rep_long", AmKind::Long),
    ] {
        let s = seen.clone();
        h.reply(id, name, kind, move |msg| {
            s.replies.set(s.replies.get() + 1);
            *s.last_reply.borrow_mut() = msg.args().to_vec();
        })
        .unwrap();
    }
    h
}

fn cluster() -> Vec<Loopback> {
    Loopback::cluster(2, LoopbackConfig::default().segment_size(SEG))
}

fn start(t: Loopback) -> (Node<Loopback, Local>, Rc<Seen>) {
    let seen = Rc::new(Seen::default());
    let config = Config::default()
        .credits(am_core::Credits::Static(CREDITS))
        .wait_mode(WaitMode::Block);
    let node = Node::new(t, handlers(&seen), config).expect("node start");
    (node, seen)
}

/// Polls until `done`, collecting what the evil rank was caught doing. Any other error fails.
fn poll_until(
    node: &mut Node<Loopback, Local>,
    mut done: impl FnMut(&Node<Loopback, Local>) -> bool,
) -> Vec<Misbehavior> {
    let deadline = Instant::now() + LIMIT;
    let mut caught = Vec::new();
    while !done(node) {
        match node.poll() {
            Ok(0) => std::thread::yield_now(),
            Ok(_) => {}
            Err(AmError::PeerMisbehaved { peer: 1, what }) => caught.push(what),
            Err(e) => panic!("node: unexpected error from poll: {e:?}"),
        }
        assert!(
            Instant::now() < deadline,
            "node: timed out; caught so far: {caught:?}"
        );
    }
    caught
}

/// The node sends one request to the evil rank and polls until its credit is back (which the
/// evil rank's answer, whatever it is, returns). Returns what the node caught meanwhile.
fn request_and_settle(node: &mut Node<Loopback, Local>, seq: u32) -> Vec<Misbehavior> {
    assert_eq!(node.credits_available(1), CREDITS);
    node.request_short(1, REQ_SHORT, &[seq]).expect("request");
    assert_eq!(node.credits_available(1), CREDITS - 1);
    poll_until(node, |n| n.credits_available(1) == CREDITS)
}

fn unknown(handler: u8, category: Category, kind: AmKind) -> Misbehavior {
    Misbehavior::UnknownHandler {
        handler: HandlerId(handler),
        category,
        kind,
    }
}

// ---------------------------------------------------------------------------------------------
// The evil side: a raw transport speaking the wire format by hand.

fn header(category: Category, system: bool, kind: AmKind, handler: u8) -> Header {
    Header {
        category,
        kind,
        system,
        handler,
        nargs: 0,
        // A request's hint is ignored by the static policy; a reply returns one credit.
        credit: u8::from(category == Category::Reply),
        payload_len: 0,
        long_offset: 0,
    }
}

fn request(system: bool, kind: AmKind, handler: u8) -> Header {
    header(Category::Request, system, kind, handler)
}

fn reply(system: bool, kind: AmKind, handler: u8) -> Header {
    header(Category::Reply, system, kind, handler)
}

/// Encodes `h` with `args` and `payload` (payload inline, as on Loopback).
fn wire(h: Header, args: &[u32], payload: &[u8]) -> Vec<u8> {
    let h = Header {
        nargs: args.len() as u8,
        payload_len: payload.len() as u32,
        ..h
    };
    let mut head = [0u8; MAX_HEAD_LEN];
    let n = h.encode(args, &mut head);
    let mut bytes = head[..n].to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

fn lo(v: u64) -> u32 {
    v as u32
}

fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

/// A message the evil rank received.
#[derive(Debug)]
struct Got {
    hdr: Header,
    args: Vec<u32>,
    payload: Vec<u8>,
}

struct Evil {
    t: Loopback,
}

impl Evil {
    fn send(&mut self, bytes: &[u8]) {
        let out = Outgoing {
            head: bytes,
            payload: am_core::Payload::EMPTY,
            long_offset: None,
            // Loopback pairs nothing: requests and replies alike go as they are.
            reply_to: None,
        };
        let deadline = Instant::now() + LIMIT;
        loop {
            match self.t.try_send(0, &out) {
                Ok(()) => return,
                Err(SendError::Busy) => std::thread::yield_now(),
                Err(e) => panic!("evil: send failed: {e}"),
            }
            assert!(Instant::now() < deadline, "evil: device busy for too long");
        }
    }

    /// The next message from the node. Panics (rather than hangs) if the node's thread
    /// panicked, or after [`LIMIT`].
    fn recv(&mut self) -> Got {
        let deadline = Instant::now() + LIMIT;
        loop {
            let got = self
                .t
                .poll_recv(|d, _segment, _tx| (d.src, d.bytes.to_vec()))
                .expect("evil: the job ended");
            if let Some((src, bytes)) = got {
                assert_eq!(src, 0);
                let hdr = Header::decode(&bytes, true).expect("the node sends well-formed AMs");
                let mut buf = [0u32; 16];
                let args = hdr.read_args(&bytes, &mut buf).to_vec();
                let payload = bytes[hdr.head_len()..].to_vec();
                return Got { hdr, args, payload };
            }
            assert!(Instant::now() < deadline, "evil: nothing from the node");
            std::thread::yield_now();
        }
    }

    /// Receives the implicit empty reply that returns the credit of a request: an ACK, or
    /// (on Loopback, which coalesces them) ACKS for this one request, sent when the node's
    /// next poll found nothing.
    fn expect_ack(&mut self, what: &str) {
        let g = self.recv();
        assert_eq!(
            (g.hdr.category, g.hdr.system, g.hdr.kind),
            (Category::Reply, true, AmKind::Short),
            "evil: expected the ACK of {what}, got {g:?}"
        );
        match g.hdr.handler {
            SYS_ACK => {
                assert_eq!(g.hdr.credit, 1, "the ACK of {what} returns the credit");
                assert!(g.args.is_empty(), "{g:?}");
            }
            am_core::protocol::opcode::ACKS => {
                assert_eq!(g.args, [1, 1], "the ACKS of {what} returns its one credit");
            }
            _ => panic!("evil: expected the ACK of {what}, got {g:?}"),
        }
        assert!(g.payload.is_empty(), "{g:?}");
    }

    /// Receives a user Short reply to `REP_SHORT`; returns its arguments.
    /// The answer to a remote atomic (or batch) that was refused: ATOMIC_DONE status 1,
    /// returning its credit.
    fn expect_atomic_refused(&mut self, op: u32) {
        let g = self.recv();
        assert_eq!(
            (g.hdr.category, g.hdr.system, g.hdr.handler, g.hdr.credit),
            (Category::Reply, true, SYS_ATOMIC_DONE, 1),
            "{g:?}"
        );
        assert_eq!(g.args, [op, 0, 0, 1]);
    }

    fn expect_rep_short(&mut self) -> Vec<u32> {
        let g = self.recv();
        assert_eq!(
            (g.hdr.category, g.hdr.system, g.hdr.kind, g.hdr.handler),
            (Category::Reply, false, AmKind::Short, REP_SHORT.0),
            "evil: expected a REP_SHORT reply, got {g:?}"
        );
        assert_eq!(g.hdr.credit, 1);
        g.args
    }

    /// Receives a user request the node sent to `REQ_SHORT`; returns its arguments.
    fn expect_req_short(&mut self) -> Vec<u32> {
        let g = self.recv();
        assert_eq!(
            (g.hdr.category, g.hdr.system, g.hdr.kind, g.hdr.handler),
            (Category::Request, false, AmKind::Short, REQ_SHORT.0),
            "evil: expected a REQ_SHORT request, got {g:?}"
        );
        g.args
    }

    /// Receives the node's REQ_SHORT and answers it as the node's own handler would: the
    /// first argument plus one.
    fn answer_req_short(&mut self) {
        let args = self.expect_req_short();
        self.send(&wire(
            reply(false, AmKind::Short, REP_SHORT.0),
            &[args[0] + 1],
            &[],
        ));
    }

    /// The start-up handshake, by hand: HELLO to rank 0 with the same table digest and
    /// segment size, take the ACK of it, take HELLO_RESULT and ACK it.
    fn handshake(&mut self) {
        let table = handlers(&Rc::default());
        let digest = table.digest();
        // The hello's payload: the signature's entry count and entries, then the count of
        // typed messages (none) and their ids.
        let mut signature: Vec<u8> = 256u16.to_le_bytes().to_vec();
        signature.extend(table.signature().iter().flat_map(|h| h.to_le_bytes()));
        signature.extend(0u32.to_le_bytes());
        let seg = self.t.segment().len() as u64;
        self.send(&wire(
            request(true, AmKind::Medium, SYS_HELLO),
            &[lo(digest), hi(digest), lo(seg), hi(seg)],
            &signature,
        ));
        self.expect_ack("HELLO");
        let g = self.recv();
        assert_eq!(
            (g.hdr.category, g.hdr.system, g.hdr.handler),
            (Category::Request, true, SYS_HELLO_RESULT),
            "{g:?}"
        );
        assert_eq!(g.args.len(), 7);
        assert_eq!(g.args[0], 0, "rank 0 accepted our table: {g:?}");
        self.send(&wire(reply(true, AmKind::Short, SYS_ACK), &[], &[]));
    }

    /// A valid request after the misbehaviour: the node must still run it and reply.
    fn check_node_still_works(&mut self) {
        self.send(&wire(
            request(false, AmKind::Short, REQ_SHORT.0),
            &[41],
            &[],
        ));
        assert_eq!(self.expect_rep_short(), [42]);
    }
}

/// Runs the node's side on rank 0 and the evil side on rank 1, the whole job bounded in time.
fn duel(node_side: fn(Loopback), evil_side: fn(&mut Evil)) {
    let (done_tx, done_rx) = mpsc::channel();
    let job = std::thread::spawn(move || {
        let r = std::panic::catch_unwind(|| {
            run_ranks(cluster(), |t| {
                if t.rank() == 0 {
                    node_side(t)
                } else {
                    let mut evil = Evil { t };
                    evil.handshake();
                    evil_side(&mut evil);
                }
            })
        });
        let _ = done_tx.send(());
        r
    });
    match done_rx.recv_timeout(2 * LIMIT + Duration::from_secs(5)) {
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(p) = job.join().expect("job thread") {
                std::panic::resume_unwind(p);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the job hangs"),
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Malformed bytes.

/// Deterministic pseudo-random bytes that do not decode.
fn random_garbage(count: usize) -> Vec<Vec<u8>> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::new();
    while out.len() < count {
        let len = (next() % 48) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        if Header::decode(&bytes, true).is_err() {
            out.push(bytes);
        }
    }
    out
}

/// Every malformed message the evil rank sends, in order.
fn garbage() -> Vec<Vec<u8>> {
    let mut g = random_garbage(8);
    let ok_short = wire(request(false, AmKind::Short, REQ_SHORT.0), &[1, 2], &[]);
    let ok_medium = wire(request(false, AmKind::Medium, REQ_MEDIUM.0), &[1], &[7; 10]);
    let ok_long = wire(request(false, AmKind::Long, REQ_LONG.0), &[], &[7; 8]);
    // Empty, and a truncated fixed header.
    g.push(Vec::new());
    g.push(ok_short[..5].to_vec());
    // Header announces two arguments, one is there.
    g.push(ok_short[..ok_short.len() - 4].to_vec());
    // A Long cut inside its offset field.
    g.push(ok_long[..12].to_vec());
    // Each reserved flag bit, and the undefined kind 3.
    for bit in 4..8 {
        let mut b = ok_short.clone();
        b[0] |= 1 << bit;
        g.push(b);
    }
    let mut b = ok_short.clone();
    b[0] |= 0b1100;
    g.push(b);
    // 17 and 255 arguments announced.
    for n in [17u8, 255] {
        let mut b = ok_short.clone();
        b[2] = n;
        b.resize(8 + 4 * n as usize, 0);
        g.push(b);
    }
    // A Short with a payload length (with and without the payload present).
    let mut b = ok_short.clone();
    b[4..8].copy_from_slice(&4u32.to_le_bytes());
    g.push(b.clone());
    b.extend_from_slice(&[1, 2, 3, 4]);
    g.push(b);
    // Medium whose length field disagrees with the bytes: too few, too many, u32::MAX.
    g.push(ok_medium[..ok_medium.len() - 1].to_vec());
    let mut b = ok_medium.clone();
    b.push(0);
    g.push(b);
    let mut b = ok_medium.clone();
    b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    g.push(b);
    // Same for an inline Long.
    let mut b = ok_long.clone();
    b.pop();
    g.push(b);
    // A Long into a created segment whose id is cut short or too long, and the flag of one
    // on a reply, a system message and a Medium.
    let in_seg = long_in_segment(1, 0, 4);
    g.push(in_seg[..in_seg.len() - 1].to_vec());
    let mut b = in_seg.clone();
    b.push(0);
    g.push(b);
    for (flags, at) in [
        (0b1_1001, &in_seg),
        (0b1_1010, &in_seg),
        (0b1_0100, &ok_medium),
    ] {
        let mut b = at.clone();
        b[0] = flags;
        g.push(b);
    }
    g
}

/// A Long request into created segment `seg`: its `len` bytes at `offset` written before
/// (as its initiator would), the segment's id in the payload's place; its argument is the
/// offset.
fn long_in_segment(seg: u32, offset: u64, len: u32) -> Vec<u8> {
    let h = Header {
        long_offset: offset,
        nargs: 1,
        payload_len: len,
        ..request(false, AmKind::Long, REQ_LONG.0)
    };
    let mut head = [0u8; MAX_HEAD_LEN];
    let n = h.encode_in_segment(&[offset as u32], &mut head);
    let mut bytes = head[..n].to_vec();
    bytes.extend_from_slice(&seg.to_le_bytes());
    bytes
}

#[test]
fn forged_longs_into_created_segments_run_nothing() {
    // Catches a target that runs a handler on a segment it does not hold (or takes a forged
    // id of 0 for segment 0), lends a payload view outside the segment, panics on a range a
    // peer chose, or keeps the credit of a refused Long.
    duel(
        |t| {
            let (mut node, seen) = start(t);
            let id = node.create_segment(MADE).expect("create");
            assert_eq!(id.get(), 1);
            let caught = poll_until(&mut node, |_| seen.requests() == 2);
            let made = MADE as u64;
            let unknown: Vec<u32> = caught
                .iter()
                .filter_map(|m| match m {
                    Misbehavior::UnknownSegment { id } => Some(id.get()),
                    _ => None,
                })
                .collect();
            assert_eq!(unknown, [7, 0], "{caught:?}");
            let out = |offset, len| Misbehavior::OutOfSegment { offset, len };
            assert_eq!(caught[2..], [out(made - 2, 4), out(u64::MAX - 1, 4)]);
            assert_eq!(seen.long_segment.get(), Some(id), "the good Long's segment");
            assert_eq!(node.credits_available(1), CREDITS);
        },
        |evil| {
            for (i, (seg, offset)) in [(7, 0), (0, 0), (1, MADE as u64 - 2), (1, u64::MAX - 1)]
                .into_iter()
                .enumerate()
            {
                evil.send(&long_in_segment(seg, offset, 4));
                evil.expect_ack(&format!("forged Long #{i}"));
            }
            evil.send(&long_in_segment(1, 8, 4));
            let g = evil.recv();
            assert_eq!(
                (g.hdr.handler, g.args.as_slice()),
                (REP_SHORT.0, &[8][..]),
                "{g:?}"
            );
            evil.check_node_still_works();
        },
    );
}

fn expected_malformed() -> Vec<Misbehavior> {
    garbage()
        .iter()
        .map(|b| Misbehavior::Malformed(Header::decode(b, true).expect_err("garbage decodes")))
        .collect()
}

#[test]
fn malformed_messages_are_reported_and_dropped() {
    duel(
        |t| {
            let (mut node, seen) = start(t);
            let caught = poll_until(&mut node, |_| seen.requests() == 1);
            assert_eq!(caught, expected_malformed());
            assert_eq!(seen.req_short.get(), 1, "only the valid request ran");
            assert_eq!(seen.req_medium.get() + seen.req_long.get(), 0);
            assert_eq!(seen.replies.get(), 0);
            assert_eq!(node.credits_available(1), CREDITS);
            // And the node can still talk to the peer that misbehaved.
            assert!(request_and_settle(&mut node, 7).is_empty());
            assert_eq!(*seen.last_reply.borrow(), [8]);
        },
        |evil| {
            for g in garbage() {
                evil.send(&g);
            }
            // Nothing comes back for an undecodable message: the first thing the evil rank
            // receives is the reply to its valid request.
            evil.check_node_still_works();
            evil.answer_req_short();
        },
    );
}

#[test]
fn garbage_covers_every_wire_error() {
    // The list above covers every WireError variant.
    let kinds: std::collections::BTreeSet<String> = expected_malformed()
        .iter()
        .map(|m| match m {
            Misbehavior::Malformed(e) => format!("{e:?}")
                .split(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap_or_default()
                .to_owned(),
            other => panic!("{other:?}"),
        })
        .collect();
    let all: std::collections::BTreeSet<String> = [
        "Truncated",
        "BadFlags",
        "TooManyArgs",
        "ShortWithPayload",
        "LengthMismatch",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(kinds, all);
}

// ---------------------------------------------------------------------------------------------
// 2. Unknown handlers.

#[test]
fn unknown_handler_is_reported_and_the_credit_still_returned() {
    duel(
        |t| {
            let (mut node, seen) = start(t);
            let caught = poll_until(&mut node, |_| seen.requests() == 1);
            assert_eq!(
                caught,
                [
                    unknown(UNKNOWN, Category::Request, AmKind::Short),
                    unknown(UNKNOWN, Category::Request, AmKind::Medium),
                    unknown(REQ_SHORT.0, Category::Request, AmKind::Medium),
                    unknown(REQ_SHORT.0, Category::Request, AmKind::Long),
                    unknown(REQ_MEDIUM.0, Category::Request, AmKind::Short),
                    unknown(REP_SHORT.0, Category::Request, AmKind::Short),
                ]
            );
            assert_eq!(seen.req_short.get(), 1, "only the valid request ran");
            assert_eq!(seen.replies.get(), 0);
            // Replies naming a handler that is unknown, a request handler, or a reply handler
            // of another kind: reported, no handler runs, and the credit they carry counts.
            for (seq, want) in [
                (0, unknown(UNKNOWN, Category::Reply, AmKind::Short)),
                (1, unknown(REQ_SHORT.0, Category::Reply, AmKind::Short)),
                (2, unknown(REP_SHORT.0, Category::Reply, AmKind::Medium)),
                (3, unknown(REP_MEDIUM.0, Category::Reply, AmKind::Short)),
            ] {
                assert_eq!(request_and_settle(&mut node, seq), [want]);
            }
            assert_eq!(seen.replies.get(), 0);
            assert_eq!(seen.requests(), 1);
        },
        |evil| {
            let bad = [
                wire(request(false, AmKind::Short, UNKNOWN), &[1], &[]),
                wire(request(false, AmKind::Medium, UNKNOWN), &[], &[1, 2]),
                wire(
                    request(false, AmKind::Medium, REQ_SHORT.0),
                    &[1],
                    &[1, 2, 3],
                ),
                // Zero-length Long, so the segment is not involved.
                wire(request(false, AmKind::Long, REQ_SHORT.0), &[1], &[]),
                wire(request(false, AmKind::Short, REQ_MEDIUM.0), &[], &[]),
                wire(request(false, AmKind::Short, REP_SHORT.0), &[5], &[]),
            ];
            for (i, b) in bad.iter().enumerate() {
                evil.send(b);
                evil.expect_ack(&format!("bad request #{i}"));
            }
            evil.check_node_still_works();
            let replies = [
                wire(reply(false, AmKind::Short, UNKNOWN), &[], &[]),
                wire(reply(false, AmKind::Short, REQ_SHORT.0), &[], &[]),
                wire(reply(false, AmKind::Medium, REP_SHORT.0), &[], &[9]),
                wire(reply(false, AmKind::Short, REP_MEDIUM.0), &[], &[]),
            ];
            for (seq, r) in replies.iter().enumerate() {
                assert_eq!(evil.expect_req_short(), [seq as u32]);
                evil.send(r);
            }
        },
    );
}

// ---------------------------------------------------------------------------------------------
// 3. Replies without a request.

#[test]
fn reply_without_request_leaves_credits_unchanged() {
    duel(
        |t| {
            let (mut node, seen) = start(t);
            // Start-up ended with every credit home (the evil rank ACKed HELLO_RESULT).
            assert_eq!(node.credits_available(1), CREDITS);
            let caught = poll_until(&mut node, |_| seen.requests() == 1);
            assert_eq!(caught, vec![Misbehavior::ReplyWithoutRequest; 7]);
            assert_eq!(
                node.credits_available(1),
                CREDITS,
                "stray credits not taken"
            );
            assert_eq!(seen.replies.get(), 0, "no reply handler ran");
            // The accounting still works for a real round trip.
            assert!(request_and_settle(&mut node, 100).is_empty());
            assert_eq!(seen.replies.get(), 1);
            assert_eq!(*seen.last_reply.borrow(), [101]);
            assert_eq!(node.credits_available(1), CREDITS);
        },
        |evil| {
            let stray = [
                wire(reply(true, AmKind::Short, SYS_ACK), &[], &[]),
                wire(reply(false, AmKind::Short, REP_SHORT.0), &[1], &[]),
                wire(
                    Header {
                        credit: 255,
                        ..reply(false, AmKind::Short, REP_SHORT.0)
                    },
                    &[2],
                    &[],
                ),
                wire(reply(false, AmKind::Medium, REP_MEDIUM.0), &[3], &[1, 2, 3]),
                // Coalesced ACKs: for one request, for none, and more credit than their
                // count of replies can carry.
                wire(reply(true, AmKind::Short, SYS_ACKS), &[1, 1], &[]),
                wire(reply(true, AmKind::Short, SYS_ACKS), &[0, 0], &[]),
                wire(reply(true, AmKind::Short, SYS_ACKS), &[1, 256], &[]),
            ];
            for s in stray {
                evil.send(&s);
            }
            evil.check_node_still_works();
            evil.answer_req_short();
        },
    );
}

// ---------------------------------------------------------------------------------------------
// 4. Long payloads outside the segment.

fn segment_pattern() -> Vec<u8> {
    (0..SEG).map(|i| (i * 7 + 3) as u8).collect()
}

/// (offset, len) pairs that do not fit a `SEG`-byte segment.
fn out_of_segment() -> Vec<(u64, u32)> {
    vec![
        (SEG as u64 - 6, 10),
        (SEG as u64, 1),
        (SEG as u64 + 1, 0),
        (1 << 32, 4),
        (u64::MAX, 1),
        (u64::MAX - 3, 8),
        (u64::MAX, 0),
    ]
}

const GOOD_LONG_AT: usize = 100;
const GOOD_LONG: [u8; 4] = [0xA1, 0xA2, 0xA3, 0xA4];

#[test]
fn long_outside_the_segment_is_refused_and_acked() {
    duel(
        |t| {
            let (mut node, seen) = start(t);
            node.segment().write(0, &segment_pattern()).unwrap();
            let caught = poll_until(&mut node, |_| seen.requests() == 1);
            let mut want: Vec<Misbehavior> = out_of_segment()
                .into_iter()
                .map(|(offset, len)| Misbehavior::OutOfSegment {
                    offset,
                    len: len as u64,
                })
                .collect();
            // The system PUT and GET with bad ranges.
            want.push(Misbehavior::OutOfSegment {
                offset: SEG as u64 - 2,
                len: 4,
            });
            want.push(Misbehavior::OutOfSegment {
                offset: u64::MAX - 1,
                len: 4,
            });
            // The atomics past the end and off their alignment.
            for offset in [SEG as u64 - 4, 3, u64::MAX - 7] {
                want.push(Misbehavior::OutOfSegment { offset, len: 8 });
            }
            // The batch whose second atomic is past the end, and the batch shorter than its
            // count says.
            want.push(Misbehavior::OutOfSegment {
                offset: SEG as u64 - 4,
                len: 8,
            });
            want.push(Misbehavior::BadSystemMessage(SYS_ATOMICS));
            // The strided put whose second region is past the end; the one whose entries
            // are cut short; the one whose lengths do not add up to its bytes.
            want.push(Misbehavior::OutOfSegment {
                offset: SEG as u64 - 2,
                len: 4,
            });
            want.push(Misbehavior::BadSystemMessage(SYS_PUT_REGIONS));
            want.push(Misbehavior::BadSystemMessage(SYS_PUT_REGIONS));
            assert_eq!(caught, want);
            assert_eq!(seen.req_long.get(), 1, "only the valid Long ran");
            assert_eq!(seen.requests(), 1);
            let mut expected = segment_pattern();
            expected[GOOD_LONG_AT..GOOD_LONG_AT + 4].copy_from_slice(&GOOD_LONG);
            assert!(
                node.segment().to_vec() == expected,
                "only the valid Long wrote"
            );
            // A Long reply outside the segment: refused, its credit counted, nothing written.
            assert_eq!(
                request_and_settle(&mut node, 0),
                [Misbehavior::OutOfSegment {
                    offset: u64::MAX - 1,
                    len: 4
                }]
            );
            assert_eq!(seen.replies.get(), 0);
            assert!(
                node.segment().to_vec() == expected,
                "the bad reply wrote nothing"
            );
        },
        |evil| {
            for (i, (offset, len)) in out_of_segment().into_iter().enumerate() {
                evil.send(&wire(
                    Header {
                        long_offset: offset,
                        ..request(false, AmKind::Long, REQ_LONG.0)
                    },
                    &[offset as u32],
                    &vec![0xEE; len as usize],
                ));
                evil.expect_ack(&format!("out-of-segment Long #{i}"));
            }
            // A put past the end: refused with PUT_DONE status 1 (so the putter is not left
            // waiting), which returns the credit like an ACK.
            evil.send(&wire(
                Header {
                    long_offset: SEG as u64 - 2,
                    ..request(true, AmKind::Long, SYS_PUT)
                },
                &[42],
                &[0xEE; 4],
            ));
            let g = evil.recv();
            assert_eq!(
                (g.hdr.category, g.hdr.system, g.hdr.handler, g.hdr.credit),
                (Category::Reply, true, SYS_PUT_DONE, 1),
                "{g:?}"
            );
            assert_eq!(g.args, [42, 1]);
            // A get whose offset + len overflows: GET_DATA status 1, no data.
            let off = u64::MAX - 1;
            evil.send(&wire(
                request(true, AmKind::Short, SYS_GET),
                &[43, lo(off), hi(off), 4, 0, 0],
                &[],
            ));
            let g = evil.recv();
            assert_eq!(
                (g.hdr.category, g.hdr.system, g.hdr.handler, g.hdr.credit),
                (Category::Reply, true, SYS_GET_DATA, 1),
                "{g:?}"
            );
            assert_eq!(g.args, [43, 0, 0, 1]);
            assert!(g.payload.is_empty());
            // Atomics past the end, misaligned, or whose end overflows: ATOMIC_DONE status 1,
            // nothing read or written.
            for (op, off) in [(44u32, SEG as u64 - 4), (45, 3), (46, u64::MAX - 7)] {
                let xor_u64 = 7 | 8 << 8;
                evil.send(&wire(
                    request(true, AmKind::Short, SYS_ATOMIC),
                    &[op, lo(off), hi(off), xor_u64, u32::MAX, u32::MAX, 0, 0],
                    &[],
                ));
                evil.expect_atomic_refused(op);
            }
            // A batch of a good atomic and one past the end: none is applied (the segment
            // check above finds the good one's word untouched), ATOMIC_DONE status 1; and a
            // batch whose payload is not the entries its count says.
            let xor = |off: u64| {
                let mut e = Vec::new();
                let atomic = am_core::atomic::Atomic::from_wire(7 | 8 << 8, u64::MAX, 0).unwrap();
                am_core::protocol::push_atomic_entry(&mut e, off, &atomic);
                e
            };
            let mut two = xor(16);
            two.extend(xor(SEG as u64 - 4));
            for (op, count, payload) in [(47u32, 2, two), (48, 2, xor(16))] {
                evil.send(&wire(
                    request(true, AmKind::Medium, SYS_ATOMICS),
                    &[op, count],
                    &payload,
                ));
                evil.expect_atomic_refused(op);
            }
            // Strided puts: a good region and one past the end (neither is written), entries
            // cut short, lengths that do not add up: PUT_DONE status 1 each.
            let entry = |off: u64, len: u32| {
                let mut e = Vec::new();
                am_core::protocol::push_region_entry(&mut e, off, len);
                e
            };
            let mut past = entry(16, 4);
            past.extend(entry(SEG as u64 - 2, 4));
            past.extend([0xEE; 8]);
            let short = entry(16, 4)[..10].to_vec();
            let mut uneven = entry(16, 4);
            uneven.extend([0xEE; 6]);
            for (op, count, payload) in [(49u32, 2, past), (50, 1, short), (51, 1, uneven)] {
                evil.send(&wire(
                    request(true, AmKind::Medium, SYS_PUT_REGIONS),
                    &[op, count],
                    &payload,
                ));
                let g = evil.recv();
                assert_eq!(
                    (g.hdr.category, g.hdr.system, g.hdr.handler, g.hdr.credit),
                    (Category::Reply, true, SYS_PUT_DONE, 1),
                    "{g:?}"
                );
                assert_eq!(g.args, [op, 1]);
            }
            // A valid Long still lands and runs its handler.
            evil.send(&wire(
                Header {
                    long_offset: GOOD_LONG_AT as u64,
                    ..request(false, AmKind::Long, REQ_LONG.0)
                },
                &[],
                &GOOD_LONG,
            ));
            assert_eq!(evil.expect_rep_short(), [GOOD_LONG_AT as u32]);
            // Answer the node's request with a Long reply that overflows.
            evil.expect_req_short();
            evil.send(&wire(
                Header {
                    long_offset: u64::MAX - 1,
                    ..reply(false, AmKind::Long, REP_LONG.0)
                },
                &[],
                &[0xEE; 4],
            ));
        },
    );
}

// ---------------------------------------------------------------------------------------------
// 5. Bad system messages.

/// System requests the node must refuse, with the opcode it reports. None of them may be
/// accepted: a well-formed EXIT would end the test process.
fn bad_system_requests() -> Vec<(Vec<u8>, u8)> {
    let r = |kind, op| request(true, kind, op);
    vec![
        (wire(r(AmKind::Short, 99), &[], &[]), 99),
        (wire(r(AmKind::Short, 255), &[1, 2, 3], &[]), 255),
        (wire(r(AmKind::Medium, 200), &[], &[1, 2]), 200),
        // Opcodes that exist only as replies.
        (wire(r(AmKind::Short, SYS_ACK), &[], &[]), SYS_ACK),
        (wire(r(AmKind::Short, SYS_ACKS), &[1, 1], &[]), SYS_ACKS),
        (
            wire(r(AmKind::Short, SYS_PUT_DONE), &[0, 0], &[]),
            SYS_PUT_DONE,
        ),
        (
            wire(r(AmKind::Medium, SYS_GET_DATA), &[0, 0, 0, 0], &[1]),
            SYS_GET_DATA,
        ),
        // Wrong argument counts.
        (
            wire(r(AmKind::Short, SYS_HELLO), &[1, 2, 3], &[]),
            SYS_HELLO,
        ),
        (
            wire(r(AmKind::Short, SYS_HELLO_RESULT), &[0; 5], &[]),
            SYS_HELLO_RESULT,
        ),
        (
            wire(r(AmKind::Short, SYS_BARRIER), &[0, 0], &[]),
            SYS_BARRIER,
        ),
        (
            wire(r(AmKind::Short, SYS_BARRIER), &[0, 0, 0, 0], &[]),
            SYS_BARRIER,
        ),
        (wire(r(AmKind::Long, SYS_PUT), &[], &[]), SYS_PUT),
        (wire(r(AmKind::Long, SYS_PUT), &[1, 2], &[]), SYS_PUT),
        (wire(r(AmKind::Short, SYS_GET), &[0; 5], &[]), SYS_GET),
        (wire(r(AmKind::Short, SYS_EXIT), &[], &[]), SYS_EXIT),
        // An atomic with an operation code, a width, a word type or an operand that does not
        // exist, or xor on a float.
        (
            wire(
                r(AmKind::Short, SYS_ATOMIC),
                &[0, 0, 0, 11 | 8 << 8, 0, 0, 0, 0],
                &[],
            ),
            SYS_ATOMIC,
        ),
        (
            wire(
                r(AmKind::Short, SYS_ATOMIC),
                &[0, 0, 0, 4 | 8 << 8 | 3 << 16, 0, 0, 0, 0],
                &[],
            ),
            SYS_ATOMIC,
        ),
        (
            wire(
                r(AmKind::Short, SYS_ATOMIC),
                &[0, 0, 0, 7 | 8 << 8 | 2 << 16, 0, 0, 0, 0],
                &[],
            ),
            SYS_ATOMIC,
        ),
        (
            wire(
                r(AmKind::Short, SYS_ATOMIC),
                &[0, 0, 0, 4 | 2 << 8, 0, 0, 0, 0],
                &[],
            ),
            SYS_ATOMIC,
        ),
        (
            wire(
                r(AmKind::Short, SYS_ATOMIC),
                &[0, 0, 0, 4 | 4 << 8, 0, 1, 0, 0],
                &[],
            ),
            SYS_ATOMIC,
        ),
        (wire(r(AmKind::Short, SYS_ATOMIC), &[0; 7], &[]), SYS_ATOMIC),
        // Batches of no atomic, of more than a batch holds, or not a Medium.
        (
            wire(r(AmKind::Medium, SYS_ATOMICS), &[0, 0], &[]),
            SYS_ATOMICS,
        ),
        (
            wire(r(AmKind::Medium, SYS_ATOMICS), &[0, 65], &[0; 28]),
            SYS_ATOMICS,
        ),
        (
            wire(r(AmKind::Short, SYS_ATOMICS), &[0, 1], &[]),
            SYS_ATOMICS,
        ),
        (
            wire(r(AmKind::Short, SYS_ATOMIC_DONE), &[0, 0, 0, 0], &[]),
            SYS_ATOMIC_DONE,
        ),
        (wire(r(AmKind::Short, SYS_EXIT), &[0, 0], &[]), SYS_EXIT),
        // Right arguments, wrong kind or value.
        (
            wire(r(AmKind::Medium, SYS_BARRIER), &[0, 0, 0], &[1]),
            SYS_BARRIER,
        ),
        (
            wire(r(AmKind::Short, SYS_BARRIER), &[0, 0, 32], &[]),
            SYS_BARRIER,
        ),
        (wire(r(AmKind::Short, SYS_PUT), &[1], &[]), SYS_PUT),
        (wire(r(AmKind::Medium, SYS_EXIT), &[0], &[1]), SYS_EXIT),
    ]
}

/// System replies the node must refuse (one per request it sends), with the opcode reported.
fn bad_system_replies() -> Vec<(Vec<u8>, u8)> {
    let r = |kind, op| reply(true, kind, op);
    vec![
        (wire(r(AmKind::Short, 77), &[], &[]), 77),
        // ACKS carries a count and the credits granted: never one word or three.
        (wire(r(AmKind::Short, SYS_ACKS), &[1], &[]), SYS_ACKS),
        (wire(r(AmKind::Short, SYS_ACKS), &[1, 1, 1], &[]), SYS_ACKS),
        (wire(r(AmKind::Short, SYS_HELLO), &[0; 4], &[]), SYS_HELLO),
        (
            wire(r(AmKind::Short, SYS_BARRIER), &[0; 3], &[]),
            SYS_BARRIER,
        ),
        (
            wire(r(AmKind::Short, SYS_PUT_DONE), &[0], &[]),
            SYS_PUT_DONE,
        ),
        // No put or get is in flight, so no operation slot is live.
        (
            wire(r(AmKind::Short, SYS_PUT_DONE), &[0, 0], &[]),
            SYS_PUT_DONE,
        ),
        (
            wire(r(AmKind::Medium, SYS_GET_DATA), &[0, 0, 0], &[1]),
            SYS_GET_DATA,
        ),
        (
            wire(r(AmKind::Medium, SYS_GET_DATA), &[5, 0, 0, 0], &[1]),
            SYS_GET_DATA,
        ),
    ]
}

#[test]
fn bad_system_messages_are_reported() {
    duel(
        |t| {
            let (mut node, seen) = start(t);
            let caught = poll_until(&mut node, |_| seen.requests() == 1);
            let want: Vec<Misbehavior> = bad_system_requests()
                .into_iter()
                .map(|(_, op)| Misbehavior::BadSystemMessage(op))
                .collect();
            assert_eq!(caught, want);
            assert_eq!(seen.req_short.get(), 1);
            for (seq, (_, op)) in bad_system_replies().into_iter().enumerate() {
                assert_eq!(
                    request_and_settle(&mut node, seq as u32),
                    [Misbehavior::BadSystemMessage(op)]
                );
            }
            assert_eq!(seen.replies.get(), 0);
            // After all that, a normal round trip still works. (Whether the refused BARRIER
            // messages left no trace in the barrier state is not observable from outside.)
            assert!(request_and_settle(&mut node, 1000).is_empty());
            assert_eq!(*seen.last_reply.borrow(), [1001]);
        },
        |evil| {
            for (i, (b, op)) in bad_system_requests().into_iter().enumerate() {
                evil.send(&b);
                evil.expect_ack(&format!("bad system request #{i} (opcode {op})"));
            }
            evil.check_node_still_works();
            for (seq, (b, _)) in bad_system_replies().into_iter().enumerate() {
                assert_eq!(evil.expect_req_short(), [seq as u32]);
                evil.send(&b);
            }
            evil.answer_req_short();
        },
    );
}

// ---------------------------------------------------------------------------------------------
// Rejected Long messages and the segment.

#[test]
fn rejected_long_messages_leave_the_segment_alone() {
    duel(
        |t| {
            let (mut node, seen) = start(t);
            node.segment().write(0, &segment_pattern()).unwrap();
            let caught = poll_until(&mut node, |_| seen.requests() == 1);
            assert_eq!(
                caught,
                [
                    unknown(UNKNOWN, Category::Request, AmKind::Long),
                    unknown(REQ_SHORT.0, Category::Request, AmKind::Long),
                    Misbehavior::BadSystemMessage(SYS_BARRIER),
                    Misbehavior::ReplyWithoutRequest,
                ]
            );
            // Each rejected message aimed 8 bytes at 0, 16, 32 and 48 respectively.
            let written: Vec<usize> = [0, 16, 32, 48]
                .into_iter()
                .filter(|&at| {
                    node.segment().slice(at, 8).unwrap().to_vec()[..]
                        != segment_pattern()[at..at + 8]
                })
                .collect();
            assert!(
                written.is_empty() && node.segment().to_vec() == segment_pattern(),
                "messages reported as misbehaviour and dropped wrote into the segment at \
                 offsets {written:?} (of the unknown-handler Long, wrong-kind Long, bad system \
                 Long and stray Long reply at 0, 16, 32, 48)"
            );
        },
        |evil| {
            let long = |h: Header, at: u64| Header {
                long_offset: at,
                ..h
            };
            let evil_bytes = [0xEE; 8];
            for (i, h) in [
                long(request(false, AmKind::Long, UNKNOWN), 0),
                long(request(false, AmKind::Long, REQ_SHORT.0), 16),
                long(request(true, AmKind::Long, SYS_BARRIER), 32),
            ]
            .into_iter()
            .enumerate()
            {
                evil.send(&wire(h, &[0, 0, 0], &evil_bytes));
                evil.expect_ack(&format!("rejected Long #{i}"));
            }
            evil.send(&wire(
                long(reply(false, AmKind::Long, REP_LONG.0), 48),
                &[],
                &evil_bytes,
            ));
            evil.check_node_still_works();
        },
    );
}

// ---------------------------------------------------------------------------------------------
// 6. A blocking call that failed can be called again.

/// A barrier interrupted by a peer's bad message can be called again: it resumes its epoch
/// and round, sends nothing twice, and the next barrier is the next epoch (no drift).
#[test]
fn a_failed_barrier_resumes_where_it_stopped() {
    duel(
        |t| {
            let (mut node, seen) = start(t);
            let err = node.barrier().expect_err("a bad message while waiting");
            assert!(
                matches!(
                    err,
                    AmError::PeerMisbehaved {
                        peer: 1,
                        what: Misbehavior::ReplyWithoutRequest
                    }
                ),
                "{err:?}"
            );
            node.barrier().expect("the retry completes");
            node.barrier().expect("and the next barrier");
            assert!(poll_until(&mut node, |_| seen.requests() == 1).is_empty());
        },
        |evil| {
            for epoch in [0u32, 1] {
                let g = evil.recv();
                assert_eq!(
                    (g.hdr.category, g.hdr.system, g.hdr.handler, &g.args[..]),
                    (Category::Request, true, SYS_BARRIER, &[epoch, 0, 0][..]),
                    "barrier {epoch}, round 0, once: {g:?}"
                );
                evil.send(&wire(reply(true, AmKind::Short, SYS_ACK), &[], &[]));
                if epoch == 0 {
                    // A reply to nothing: the node's first barrier call fails on it.
                    evil.send(&wire(reply(false, AmKind::Short, REP_SHORT.0), &[1], &[]));
                }
                evil.send(&wire(
                    request(true, AmKind::Short, SYS_BARRIER),
                    &[epoch, 0, 0],
                    &[],
                ));
                evil.expect_ack("BARRIER");
            }
            evil.check_node_still_works();
        },
    );
}

// ---------------------------------------------------------------------------------------------
// 6. Operations on created segments.

/// Bytes of the segment the node creates.
const MADE: usize = 64;

/// A forged operation on a created segment.
enum Forged {
    Put(u32, u64, usize),
    Get(u32, u64, u32),
    Atomic(u64, Vec<u8>),
}

/// Operations naming a segment the node never created (or segment 0, which these messages
/// never reach), ranges past the created one's end, and one good put at 8.
fn forged_segment_ops() -> Vec<(Forged, bool)> {
    let made = MADE as u64;
    vec![
        (Forged::Put(2, 0, 4), false),
        (Forged::Put(0, 0, 4), false),
        (Forged::Put(1, made - 2, 4), false),
        (Forged::Put(1, u64::MAX - 1, 4), false),
        (Forged::Put(1, 8, 4), true),
        (Forged::Get(1, made - 2, 4), false),
        (Forged::Get(7, 0, 4), false),
        (Forged::Get(1, u64::MAX, 1), false),
        (Forged::Atomic(made, 1u32.to_le_bytes().to_vec()), false),
        (Forged::Atomic(0, 9u32.to_le_bytes().to_vec()), false),
        (Forged::Atomic(3, 1u32.to_le_bytes().to_vec()), false),
    ]
}

#[test]
fn forged_segment_operations_write_nothing() {
    // Catches a target that writes or reads a created segment out of its range, treats an
    // unknown id as segment 0, panics on an id or length a peer chose, or leaves the
    // initiator without an answer; one that calls a refusal of a segment it does not hold
    // misbehavior (a free may have raced it), and one that lets a range outside a segment
    // it holds pass as such a refusal.
    duel(
        |t| {
            let (mut node, seen) = start(t);
            node.segment().write(0, &segment_pattern()).unwrap();
            let id = node.create_segment(MADE).expect("create");
            assert_eq!(id.get(), 1);
            let pattern: Vec<u8> = (0..MADE as u8).collect();
            node.segment_at(id).unwrap().write(0, &pattern).unwrap();
            let caught = poll_until(&mut node, |_| seen.requests() == 1);
            let made = MADE as u64;
            let out = |offset, len| Misbehavior::OutOfSegment { offset, len };
            assert_eq!(
                caught,
                [
                    out(made - 2, 4),
                    out(u64::MAX - 1, 4),
                    out(made - 2, 4),
                    out(u64::MAX, 1),
                    out(made, 8),
                    out(3, 8),
                    Misbehavior::BadSystemMessage(SYS_GET_AT),
                    Misbehavior::BadSystemMessage(SYS_ATOMIC_AT),
                ],
                "ranges outside a segment it holds, a get past max_medium and an atomic \
                 without its id are misbehavior; a segment it does not hold is not"
            );
            let mut expected = pattern;
            expected[8..12].copy_from_slice(&[0xEE; 4]);
            assert_eq!(
                node.segment_at(id).unwrap().to_vec(),
                expected,
                "only the good put wrote"
            );
            assert!(
                node.segment().to_vec() == segment_pattern(),
                "segment 0 untouched"
            );
        },
        |evil| {
            for (op, (forged, ok)) in forged_segment_ops().into_iter().enumerate() {
                let op = op as u32;
                let status = u32::from(!ok);
                match forged {
                    Forged::Put(seg, offset, len) => {
                        evil.send(&wire(
                            request(true, AmKind::Medium, SYS_PUT_AT),
                            &[op, seg, lo(offset), hi(offset)],
                            &vec![0xEE; len],
                        ));
                        let g = evil.recv();
                        assert_eq!((g.hdr.handler, g.hdr.credit), (SYS_PUT_DONE, 1), "{g:?}");
                        assert_eq!(g.args, [op, status], "put #{op}");
                    }
                    Forged::Get(seg, offset, len) => {
                        evil.send(&wire(
                            request(true, AmKind::Short, SYS_GET_AT),
                            &[op, seg, lo(offset), hi(offset), len, 5, 0],
                            &[],
                        ));
                        let g = evil.recv();
                        assert_eq!((g.hdr.handler, g.hdr.credit), (SYS_GET_DATA, 1), "{g:?}");
                        assert_eq!(g.args, [op, 5, 0, status], "get #{op}");
                        assert!(g.payload.is_empty());
                    }
                    Forged::Atomic(offset, seg) => {
                        // A fetch-add of 1 on a u64.
                        evil.send(&wire(
                            request(true, AmKind::Medium, SYS_ATOMIC_AT),
                            &[op, lo(offset), hi(offset), 4 | 8 << 8, 1, 0, 0, 0],
                            &seg,
                        ));
                        evil.expect_atomic_refused(op);
                    }
                }
            }
            // A get longer than one reply carries, and an atomic whose payload is not an id.
            evil.send(&wire(
                request(true, AmKind::Short, SYS_GET_AT),
                &[99, 1, 0, 0, u32::MAX, 0, 0],
                &[],
            ));
            let g = evil.recv();
            assert_eq!(g.args, [99, 0, 0, 1], "{g:?}");
            evil.send(&wire(
                request(true, AmKind::Medium, SYS_ATOMIC_AT),
                &[98, 0, 0, 4 | 8 << 8, 1, 0, 0, 0],
                &[1, 0, 0],
            ));
            evil.expect_atomic_refused(98);
            evil.check_node_still_works();
        },
    );
}
