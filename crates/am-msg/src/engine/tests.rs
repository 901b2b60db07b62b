//! Two engines over in-memory channels, driven by arbitrary interleavings of user calls,
//! transmissions and deliveries (requests FIFO per pair, replies FIFO per pair, the two
//! independent, as in the core where a refused reply is resent later).

use std::collections::VecDeque;

use proptest::prelude::*;

use super::*;

const RANKS: usize = 2;
const THRESHOLD: usize = 8;
const MAX_LONG: usize = 7;
const SLOT: usize = 64;
const SENTINEL: u8 = 0xEE;
const LENS: [usize; 9] = [0, 1, 7, 8, 9, 13, 20, 40, 63];
/// Tags below this are received from a named source, the rest with a wildcard.
const NAMED_TAGS: u64 = 2;

#[derive(Debug, Clone)]
struct Message {
    src: usize,
    dest: usize,
    tag: u64,
    data: Vec<u8>,
}

#[derive(Debug, Clone)]
struct RecvSpec {
    src: Option<usize>,
    tag: u64,
    capacity: usize,
}

#[derive(Debug, Clone)]
enum Op {
    Send(usize),
    Recv(RecvSpec),
}

struct Packet {
    wire: Wire,
    payload: Vec<u8>,
    long: Option<usize>,
}

struct Node {
    eng: MsgEngine,
    seg: Vec<u8>,
    written: Vec<usize>,
    script: VecDeque<Op>,
    advertise: bool,
    placed: bool,
    sends: Vec<(SendId, usize)>,
    recvs: Vec<(RecvId, RecvSpec, usize)>,
}

struct World {
    nodes: Vec<Node>,
    /// `[src][dest][0 = request, 1 = reply]`
    chans: Vec<Vec<[VecDeque<Packet>; 2]>>,
    msgs: Vec<Message>,
}

fn pattern(id: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| 1 + ((id * 7 + i) % 200) as u8).collect()
}

impl World {
    fn write(&mut self, r: usize, at: usize, bytes: &[u8]) {
        let n = &mut self.nodes[r];
        n.seg[at..at + bytes.len()].copy_from_slice(bytes);
        if !bytes.is_empty() {
            n.written[at / SLOT] += bytes.len();
            assert_eq!(
                at / SLOT,
                (at + bytes.len() - 1) / SLOT,
                "write crosses a buffer"
            );
        }
    }

    fn script_step(&mut self, r: usize) -> bool {
        let Some(op) = self.nodes[r].script.pop_front() else {
            return false;
        };
        match op {
            Op::Send(m) => {
                let msg = self.msgs[m].clone();
                let eager = msg.data.len() <= THRESHOLD;
                let id = self.nodes[r].eng.send(
                    msg.dest as Rank,
                    msg.tag,
                    Box::new(msg.data.clone()),
                    eager,
                );
                self.nodes[r].sends.push((id, m));
            }
            Op::Recv(spec) => {
                let n = &mut self.nodes[r];
                let region = n.recvs.len();
                let (id, copy) = n.eng.post_recv(
                    spec.src.map(|s| s as Rank),
                    spec.tag,
                    (region * SLOT) as u64,
                    spec.capacity as u64,
                    n.advertise,
                );
                n.recvs.push((id, spec, region));
                if let Some(data) = copy {
                    self.write(r, region * SLOT, &data);
                }
            }
        }
        true
    }

    fn transmit(&mut self, r: usize, d: usize) -> bool {
        let placed = self.nodes[r].placed;
        let p = move |_: usize| placed;
        let Some(out) = self.nodes[r].eng.peek_out(d as Rank, MAX_LONG, &p) else {
            return false;
        };
        let packet = Packet {
            wire: out.wire.clone(),
            payload: out.payload.to_vec(),
            long: out.long_offset,
        };
        self.nodes[r].eng.commit_out(d as Rank, MAX_LONG, &p);
        self.chans[r][d][0].push_back(packet);
        true
    }

    fn deliver(&mut self, s: usize, d: usize, kind: usize) -> bool {
        let Some(pk) = self.chans[s][d][kind].pop_front() else {
            return false;
        };
        let long = pk.long.map(|at| {
            // Remote-write transports place a Long before its handler runs.
            self.write(d, at, &pk.payload);
            (at, pk.payload.len())
        });
        let payload: &[u8] = if long.is_some() { &[] } else { &pk.payload };
        let re = self.nodes[d].eng.on_wire(s as Rank, pk.wire, payload, long);
        if let Some(at) = re.copy_to {
            self.write(d, at, &pk.payload);
        }
        if let Some(w) = re.reply {
            assert_eq!(kind, 0, "a reply to a reply");
            self.chans[d][s][1].push_back(Packet {
                wire: w,
                payload: Vec::new(),
                long: None,
            });
        }
        true
    }

    /// One step chosen by `c`; false if that step was not possible.
    fn step(&mut self, c: u8) -> bool {
        let c = c as usize;
        if c < RANKS {
            return self.script_step(c);
        }
        let c = c - RANKS;
        if c < RANKS * RANKS {
            return self.transmit(c / RANKS, c % RANKS);
        }
        let c = c - RANKS * RANKS;
        let (pair, kind) = (c / 2, c % 2);
        self.deliver(pair / RANKS, pair % RANKS, kind)
    }

    fn steps() -> u8 {
        (RANKS + RANKS * RANKS + 2 * RANKS * RANKS) as u8
    }

    fn run_to_quiescence(&mut self) {
        for _ in 0..100_000 {
            let mut moved = false;
            for c in 0..Self::steps() {
                while self.step(c) {
                    moved = true;
                }
            }
            if !moved {
                return;
            }
        }
        panic!("no quiescence");
    }
}

#[derive(Debug, Clone)]
struct Case {
    msgs: Vec<(usize, usize, u64, usize, u8)>,
    keys: Vec<u32>,
    advertise: [bool; 2],
    placed: [bool; 2],
    steps: Vec<u8>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec((0..RANKS, 0..RANKS, 0..3u64, 0..LENS.len(), 0..10u8), 0..12),
        prop::collection::vec(any::<u32>(), 48),
        any::<[bool; 2]>(),
        any::<[bool; 2]>(),
        prop::collection::vec(0..World::steps(), 0..300),
    )
        .prop_map(|(msgs, keys, advertise, placed, steps)| Case {
            msgs,
            keys,
            advertise,
            placed,
            steps,
        })
}

fn run(case: &Case) -> Vec<(Protocol, bool)> {
    let mut seen = Vec::new();
    let msgs: Vec<Message> = case
        .msgs
        .iter()
        .enumerate()
        .map(|(i, &(src, dest, tag, l, _))| Message {
            src,
            dest,
            tag,
            data: pattern(i, LENS[l]),
        })
        .collect();
    // One receive per message, at its destination; capacity exact, roomy or too small.
    let mut ops: Vec<Vec<(u32, Op)>> = vec![Vec::new(); RANKS];
    let mut k = 0;
    let mut key = || {
        k += 1;
        case.keys[k % case.keys.len()].wrapping_add(k as u32)
    };
    for (i, m) in msgs.iter().enumerate() {
        ops[m.src].push((key(), Op::Send(i)));
        let mode = case.msgs[i].4;
        let len = m.data.len();
        let capacity = match mode {
            0..=5 => len,
            6 | 7 => SLOT,
            _ => len.saturating_sub(1 + mode as usize % 3),
        };
        let src = (m.tag < NAMED_TAGS).then_some(m.src);
        ops[m.dest].push((
            key(),
            Op::Recv(RecvSpec {
                src,
                tag: m.tag,
                capacity,
            }),
        ));
    }
    let nodes = (0..RANKS)
        .map(|r| {
            let mut o = std::mem::take(&mut ops[r]);
            o.sort_by_key(|(k, _)| *k);
            let recvs = o.iter().filter(|(_, op)| matches!(op, Op::Recv(_))).count();
            Node {
                eng: MsgEngine::default(),
                seg: vec![SENTINEL; SLOT * recvs.max(1)],
                written: vec![0; recvs.max(1)],
                script: o.into_iter().map(|(_, op)| op).collect(),
                advertise: case.advertise[r],
                placed: case.placed[r],
                sends: Vec::new(),
                recvs: Vec::new(),
            }
        })
        .collect();
    let mut w = World {
        nodes,
        chans: (0..RANKS)
            .map(|_| (0..RANKS).map(|_| Default::default()).collect())
            .collect(),
        msgs: msgs.clone(),
    };
    for &c in &case.steps {
        w.step(c);
    }
    w.run_to_quiescence();

    for n in &w.nodes {
        assert!(
            n.eng.violations.is_empty(),
            "violations: {:?}",
            n.eng.violations
        );
        assert!(!n.eng.has_out());
    }
    // Sends.
    let mut send_result = vec![None; msgs.len()];
    let mut late = vec![Vec::new(); RANKS];
    for (r, n) in w.nodes.iter_mut().enumerate() {
        for &(id, m) in &n.sends {
            let proto = n.eng.sends.get(&id).map(|s| s.protocol);
            let res = n
                .eng
                .take_send(id)
                .unwrap_or_else(|| panic!("send of message {m} ({:?}) never completed", msgs[m]));
            if let Ok(info) = &res {
                seen.push((info.protocol, true));
                assert_eq!(info.len, msgs[m].data.len());
                if matches!(
                    info.protocol,
                    Protocol::SenderInitiated | Protocol::ReceiverInitiated | Protocol::Crossed
                ) {
                    let want = if n.placed {
                        Completion::WriteBased
                    } else {
                        Completion::Ack
                    };
                    assert_eq!(info.completion, want);
                } else {
                    assert_eq!(info.completion, Completion::OnSend);
                }
            }
            if let Err(MsgError::TooSmall { .. }) = &res {
                seen.push((proto.unwrap_or(Protocol::Eager), false));
            }
            send_result[m] = Some(res);
        }
        late[r] = std::mem::take(&mut n.eng.late_errors);
    }
    // Receives, matched per (source, tag) in posting order with messages in sending order.
    let mut next_of: std::collections::HashMap<(usize, usize, u64), VecDeque<usize>> =
        Default::default();
    for n in &w.nodes {
        for &(_, i) in &n.sends {
            let m = &msgs[i];
            next_of
                .entry((m.src, m.dest, m.tag))
                .or_default()
                .push_back(i);
        }
    }
    let mut delivered = vec![false; msgs.len()];
    let mut recv_failures = vec![0usize; RANKS];
    for (r, n) in w.nodes.iter_mut().enumerate() {
        for (id, spec, region) in n.recvs.clone() {
            let res = n
                .eng
                .take_recv(id)
                .unwrap_or_else(|| panic!("receive {spec:?} at rank {r} never completed"));
            let buf = &n.seg[region * SLOT..(region + 1) * SLOT];
            match res {
                Ok(info) => {
                    let q = next_of
                        .get_mut(&(info.src as usize, r, spec.tag))
                        .expect("a message of that source and tag");
                    let m = match spec.src {
                        Some(s) => {
                            assert_eq!(s, info.src as usize);
                            q.pop_front().expect("not more receives than messages")
                        }
                        // A wildcard's failures do not say which source they consumed.
                        None => {
                            let got = &buf[..info.len];
                            let i = q
                                .iter()
                                .position(|&m| msgs[m].data == got)
                                .expect("a message with that content");
                            q.remove(i).expect("in range")
                        }
                    };
                    let data = &msgs[m].data;
                    assert_eq!(info.len, data.len(), "receive got message {m}");
                    assert_eq!(&buf[..data.len()], &data[..], "data of message {m}");
                    assert!(buf[data.len()..].iter().all(|&b| b == SENTINEL));
                    assert_eq!(n.written[region], data.len(), "written exactly once");
                    assert!(matches!(send_result[m], Some(Ok(_))), "{m} sent");
                    delivered[m] = true;
                }
                Err(MsgError::TooSmall { len, capacity }) => {
                    assert_eq!(capacity, spec.capacity as u64);
                    assert!(len > capacity);
                    assert!(buf.iter().all(|&b| b == SENTINEL), "nothing written");
                    assert_eq!(n.written[region], 0);
                    if let Some(s) = spec.src {
                        // Named source: it is exactly the next message of that pair and tag.
                        let m = next_of
                            .get_mut(&(s, r, spec.tag))
                            .and_then(|q| q.pop_front())
                            .expect("the message that was too large");
                        assert_eq!(len, msgs[m].data.len() as u64);
                        if msgs[m].data.len() > THRESHOLD {
                            assert_eq!(
                                send_result[m],
                                Some(Err(MsgError::TooSmall { len, capacity }))
                            );
                        }
                    }
                    recv_failures[r] += 1;
                }
                Err(e) => panic!("receive failed: {e}"),
            }
        }
        assert_eq!(n.eng.residue(), (0, 0, 0, 0), "state left at rank {r}");
    }
    // Every message went somewhere exactly once; failures agree on both sides.
    let mut send_failures = vec![0usize; RANKS];
    for (m, res) in send_result.iter().enumerate() {
        match res {
            Some(Ok(_)) => {}
            Some(Err(MsgError::TooSmall { .. })) => send_failures[msgs[m].dest] += 1,
            other => panic!("send {m}: {other:?}"),
        }
    }
    for (r, l) in late.iter().enumerate() {
        for e in l {
            assert!(matches!(e.error, MsgError::TooSmall { .. }));
            send_failures[e.dest as usize] += 1;
            let _ = r;
        }
    }
    assert_eq!(
        send_failures, recv_failures,
        "failures seen by senders and receivers"
    );
    let ok_sends = send_result
        .iter()
        .filter(|r| matches!(r, Some(Ok(_))))
        .count();
    let late_total: usize = late.iter().map(|l| l.len()).sum();
    let delivered_total = delivered.iter().filter(|&&d| d).count();
    assert_eq!(
        ok_sends - late_total,
        delivered_total,
        "each message delivered once"
    );
    seen
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
    #[test]
    fn exactly_once_into_the_right_buffer_under_any_interleaving(c in case()) {
        run(&c);
    }
}

/// The random cases do reach every protocol path, including the crossing and the failures.
#[test]
fn the_property_test_reaches_every_path() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let mut all = std::collections::HashSet::new();
    for _ in 0..3000 {
        let c = case().new_tree(&mut runner).expect("a case").current();
        all.extend(run(&c).into_iter().map(|(p, ok)| (format!("{p:?}"), ok)));
    }
    for p in [
        "Eager",
        "EagerDirect",
        "SenderInitiated",
        "ReceiverInitiated",
        "Crossed",
    ] {
        assert!(
            all.contains(&(p.to_string(), true)),
            "{p} never completed: {all:?}"
        );
    }
    assert!(all.iter().any(|(_, ok)| !ok), "no failing send: {all:?}");
}

/// The race by hand: RTS and RTR cross; each side sees the other's message before its own
/// is answered.
#[test]
fn crossing_rts_and_rtr_write_once() {
    use std::collections::HashSet;
    let case = Case {
        msgs: vec![(0, 1, 0, 8, 0)], // 63 bytes, rendezvous, exact buffer
        keys: vec![0; 48],
        advertise: [true, true],
        placed: [true, true],
        // rank 0 sends (RTS queued), rank 1 posts (RTR queued), both transmitted, then
        // delivered in both directions.
        steps: vec![0, 1, 2 + 1, 2 + 2, 6 + 2, 6 + 4],
    };
    let seen: HashSet<_> = run(&case).into_iter().collect();
    assert!(seen.contains(&(Protocol::Crossed, true)), "{seen:?}");
}

#[test]
fn receiver_first_writes_without_handshake() {
    let mut e0 = MsgEngine::default();
    let mut e1 = MsgEngine::default();
    let (rid, _) = e1.post_recv(Some(0), 5, 0, 100, true);
    let rtr = e1.peek_out(0, 1000, &|_| true).unwrap().wire;
    e1.commit_out(0, 1000, &|_| true);
    assert!(matches!(rtr, Wire::Rtr { seen: 0, .. }));
    assert_eq!(e0.on_wire(1, rtr, &[], None), Reaction::default());
    let sid = e0.send(1, 5, Box::new(vec![1u8; 50]), false);
    let out = e0.peek_out(1, 1000, &|_| true).unwrap();
    assert!(matches!(
        out.wire,
        Wire::Data {
            last: true,
            want_ack: false,
            ..
        }
    ));
    let wire = out.wire.clone();
    e0.commit_out(1, 1000, &|_| true);
    let info = e0.take_send(sid).unwrap().unwrap();
    assert_eq!(
        (info.protocol, info.completion),
        (Protocol::ReceiverInitiated, Completion::WriteBased)
    );
    e1.on_wire(0, wire, &[], Some((0, 50)));
    let r = e1.take_recv(rid).unwrap().unwrap();
    assert_eq!((r.len, r.protocol), (50, Protocol::ReceiverInitiated));
}

#[test]
fn out_of_order_announcement_is_a_violation() {
    let mut e = MsgEngine::default();
    e.on_wire(3, Wire::Eager { tag: 0, seq: 1 }, b"x", None);
    assert_eq!(e.violations.len(), 1);
}
