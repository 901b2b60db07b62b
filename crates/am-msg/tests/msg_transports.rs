//! The message layer on every transport: ranks as threads over each transport's in-process
//! cluster (real shared-memory segments and sockets).

use am_core::Local;
use std::collections::HashSet;
use std::sync::Arc;

use am_core::{Config, HandlerId, Handlers, Node, Transport, WaitMode};
use am_msg::{Completion, Messenger, MsgConfig, MsgError, Protocol, Rendezvous};

const SEG: usize = 12 << 20;
const SENTINEL: u8 = 0xEE;

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| 1 + ((i as u64).wrapping_mul(31).wrapping_add(seed * 7) % 200) as u8)
        .collect()
}

fn job<T, F>(transports: Vec<T>, config: MsgConfig, f: F)
where
    T: Transport + Send,
    F: Fn(&Messenger, &mut Node<T, Local>) + Sync,
{
    let wait = if transports.len() > 2 {
        WaitMode::Block
    } else {
        WaitMode::SpinThenYield
    };
    am_core::run_ranks(transports, |t| {
        let mut handlers = Handlers::local();
        let msg = Messenger::new(&mut handlers, HandlerId(200), config).expect("messenger");
        let config = Config::default().wait_mode(wait);
        let mut node = Node::new(t, handlers, config).expect("node");
        {
            let seg = node.segment();
            seg.fill(0, seg.len(), SENTINEL).unwrap();
        }
        node.barrier().expect("barrier");
        f(&msg, &mut node);
        node.barrier().expect("barrier");
    });
}

fn is_rendezvous(p: Protocol) -> bool {
    matches!(
        p,
        Protocol::SenderInitiated | Protocol::ReceiverInitiated | Protocol::Crossed
    )
}

/// Checks a send's protocol and completion against its size and the transport.
fn check_send<T: Transport>(msg: &Messenger, node: &Node<T, Local>, info: &am_msg::SendInfo) {
    let t = msg.eager_threshold(node);
    if info.len <= t {
        assert!(!is_rendezvous(info.protocol), "{info:?} (threshold {t})");
        assert_eq!(info.completion, Completion::OnSend);
    } else {
        assert!(is_rendezvous(info.protocol), "{info:?} (threshold {t})");
        let placed = info.len.min(node.max_long());
        let last = match info.len % node.max_long() {
            0 => node.max_long(),
            n => n,
        };
        let want = if node.long_placed_on_send(placed) && node.long_placed_on_send(last) {
            Completion::WriteBased
        } else {
            Completion::Ack
        };
        assert_eq!(info.completion, want, "{info:?}");
    }
}

fn check_data<T: Transport>(node: &Node<T, Local>, at: usize, len: usize, cap: usize, seed: u64) {
    let seg = node.segment().to_vec();
    assert!(seg[at..at + len] == pattern(len, seed)[..], "data at {at}");
    assert!(
        seg[at + len..at + cap].iter().all(|&b| b == SENTINEL),
        "nothing past the message"
    );
}

/// Sizes around the threshold, 0 bytes and several MB, receiver first and sender first.
fn sizes<T: Transport + Send>(transports: Vec<T>, rndv: Rendezvous) {
    let config = MsgConfig::default().rendezvous(rndv);
    job(transports, config, |msg, node| {
        let t = msg.eager_threshold(node);
        let mm = node.max_medium();
        let mut lens = vec![0, 1, t.saturating_sub(1), t, t + 1, mm + 1, 4 << 20];
        lens.dedup();
        for receiver_first in [true, false] {
            for (i, &len) in lens.iter().enumerate() {
                let seed = i as u64 + receiver_first as u64 * 100;
                let at = 4096;
                let cap = len + 64;
                if node.rank() == 1 {
                    if !receiver_first {
                        node.barrier().unwrap();
                    }
                    let h = msg.post_recv(node, Some(0), 7, at, cap).unwrap();
                    if receiver_first {
                        node.barrier().unwrap();
                    }
                    let info = msg.wait_recv(node, h).unwrap();
                    assert_eq!((info.src, info.tag, info.len), (0, 7, len));
                    let want = match (len <= t, receiver_first, rndv) {
                        (true, true, Rendezvous::Receiver) => Protocol::EagerDirect,
                        (true, _, _) => Protocol::Eager,
                        (false, true, Rendezvous::Receiver) => Protocol::ReceiverInitiated,
                        (false, _, _) => Protocol::SenderInitiated,
                    };
                    assert_eq!(
                        info.protocol, want,
                        "len {len} receiver first {receiver_first}"
                    );
                    check_data(node, at, len, cap, seed);
                    node.segment().fill(at, cap, SENTINEL).unwrap();
                } else {
                    if receiver_first {
                        node.barrier().unwrap();
                    }
                    let h = msg.send(node, 1, 7, pattern(len, seed)).unwrap();
                    if !receiver_first {
                        // The receiver posts only once the announcement is there.
                        node.barrier().unwrap();
                    }
                    let info = msg.wait_send(node, h).unwrap();
                    assert_eq!(info.len, len);
                    check_send(msg, node, &info);
                }
                node.barrier().unwrap();
            }
        }
    });
}

/// Both sides start at once, many times; both directions at the same time.
fn simultaneous<T: Transport + Send>(transports: Vec<T>, len: usize, rounds: usize) {
    let seen = std::sync::Mutex::new(HashSet::new());
    job(transports, MsgConfig::default(), |msg, node| {
        let me = node.rank();
        let peer = 1 - me;
        for round in 0..rounds {
            node.barrier().unwrap();
            let at = 8192;
            let cap = len + 8;
            let (s, r) = if round % 2 == 0 {
                let s = msg.send(
                    node,
                    peer,
                    round as u64,
                    pattern(len, round as u64 + me as u64),
                );
                let r = msg.post_recv(node, Some(peer), round as u64, at, cap);
                (s.unwrap(), r.unwrap())
            } else {
                let r = msg.post_recv(node, Some(peer), round as u64, at, cap);
                let s = msg.send(
                    node,
                    peer,
                    round as u64,
                    pattern(len, round as u64 + me as u64),
                );
                (s.unwrap(), r.unwrap())
            };
            let ri = msg.wait_recv(node, r).unwrap();
            let si = msg.wait_send(node, s).unwrap();
            assert_eq!(ri.len, len);
            check_send(msg, node, &si);
            check_data(node, at, len, cap, round as u64 + peer as u64);
            seen.lock().unwrap().insert(ri.protocol);
            node.barrier().unwrap();
            node.segment().fill(at, cap, SENTINEL).unwrap();
        }
    });
    let seen = seen.into_inner().unwrap();
    assert!(seen.iter().all(|&p| is_rendezvous(p)), "{seen:?}");
    eprintln!("simultaneous starts, {len} bytes: protocols seen {seen:?}");
}

/// Three senders, many outstanding sends each, to one receiver that posts in its own order.
fn many_to_one<T: Transport + Send>(transports: Vec<T>) {
    const PER: usize = 24;
    job(transports, MsgConfig::default(), |msg, node| {
        let t = msg.eager_threshold(node);
        let len_of = |src: u32, i: usize| match i % 4 {
            0 => 0,
            1 => t,
            2 => t + 1 + src as usize * 13,
            _ => 70_000 + i * 3,
        };
        let slot = 80 << 10;
        if node.rank() == 0 {
            let mut hs = Vec::new();
            for i in 0..PER {
                for src in 1..node.size() {
                    // Half the receives name their source (advertised), half are wildcards
                    // on a tag of their own.
                    let tag = (i % 2) as u64;
                    let from = (tag == 0).then_some(src);
                    let at = ((i * 3 + src as usize - 1) * slot) % (SEG - slot);
                    hs.push((msg.post_recv(node, from, tag, at, slot).unwrap(), at));
                }
            }
            let mut got = HashSet::new();
            for (h, at) in hs {
                let info = msg.wait_recv(node, h).unwrap();
                let seq = node.segment().slice(at, info.len).unwrap().to_vec();
                // Which message is it? The i of its sender, from its length and content.
                let i = (0..PER)
                    .find(|&i| {
                        len_of(info.src, i) == info.len
                            && (i % 2) as u64 == info.tag
                            && seq == pattern(info.len, i as u64 * 10 + info.src as u64)
                            && !got.contains(&(info.src, i))
                    })
                    .unwrap_or_else(|| panic!("unknown message {info:?}"));
                got.insert((info.src, i));
            }
            assert_eq!(got.len(), PER * (node.size() as usize - 1));
        } else {
            let src = node.rank();
            let hs: Vec<_> = (0..PER)
                .map(|i| {
                    let data = pattern(len_of(src, i), i as u64 * 10 + src as u64);
                    msg.send(node, 0, (i % 2) as u64, data).unwrap()
                })
                .collect();
            for h in hs {
                let info = msg.wait_send(node, h).unwrap();
                check_send(msg, node, &info);
            }
        }
    });
}

/// A receive buffer too small: an error on both sides, nothing written, for eager and both
/// rendezvous directions.
fn too_small<T: Transport + Send>(transports: Vec<T>) {
    job(transports, MsgConfig::default(), |msg, node| {
        let t = msg.eager_threshold(node);
        let big = node.max_medium() + 5000;
        let at = 1 << 20;
        // (len, capacity, receiver first)
        let cases = [
            (t.max(2), t.max(2) - 1, false),
            (t.max(2), t.max(2) - 1, true),
            (big, big - 1, false),
            (big, big / 2, true),
        ];
        for (k, &(len, cap, receiver_first)) in cases.iter().enumerate() {
            let tag = 50 + k as u64;
            if node.rank() == 1 {
                if !receiver_first {
                    node.barrier().unwrap();
                }
                let h = msg.post_recv(node, Some(0), tag, at, cap).unwrap();
                if receiver_first {
                    node.barrier().unwrap();
                }
                let err = msg.wait_recv(node, h).unwrap_err();
                assert_eq!(
                    err,
                    MsgError::TooSmall {
                        len: len as u64,
                        capacity: cap as u64
                    }
                );
                assert!(
                    node.segment()
                        .slice(at - 64, len + 128)
                        .unwrap()
                        .to_vec()
                        .iter()
                        .all(|&b| b == SENTINEL),
                    "case {k}: nothing written"
                );
            } else {
                if receiver_first {
                    node.barrier().unwrap();
                }
                let h = msg.send(node, 1, tag, vec![1u8; len]).unwrap();
                if !receiver_first {
                    node.barrier().unwrap();
                }
                let want = MsgError::TooSmall {
                    len: len as u64,
                    capacity: cap as u64,
                };
                if len <= t && !receiver_first {
                    // Eager: the send completed; the failure arrives later.
                    msg.wait_send(node, h).unwrap();
                    let mut late = Vec::new();
                    while late.is_empty() {
                        msg.progress(node).unwrap();
                        late = msg.take_late_errors();
                    }
                    assert_eq!(late.len(), 1);
                    assert_eq!((late[0].dest, late[0].tag), (1, tag));
                    assert_eq!(late[0].error, want);
                } else {
                    assert_eq!(msg.wait_send(node, h).unwrap_err(), want, "case {k}");
                }
            }
            node.barrier().unwrap();
        }
        // Bad input at post time.
        let seg = node.segment().len();
        assert!(matches!(
            msg.post_recv(node, None, 1, seg - 10, 11),
            Err(MsgError::OutOfSegment { .. })
        ));
        assert!(matches!(
            msg.post_recv(node, Some(9), 1, 0, 1),
            Err(MsgError::InvalidRank { rank: 9, .. })
        ));
        assert!(matches!(
            msg.send(node, 9, 1, vec![0u8]),
            Err(MsgError::InvalidRank { .. })
        ));
    });
}

macro_rules! transport_tests {
    ($name:ident, $cluster:expr) => {
        mod $name {
            use super::*;
            fn cluster(n: u32) -> Vec<impl Transport + Send> {
                $cluster(n, SEG)
            }
            #[test]
            fn sizes_receiver_initiated() {
                sizes(cluster(2), Rendezvous::Receiver);
            }
            #[test]
            fn sizes_sender_initiated() {
                sizes(cluster(2), Rendezvous::Sender);
            }
            #[test]
            fn simultaneous_starts() {
                simultaneous(cluster(2), 100_000, 40);
            }
            #[test]
            fn simultaneous_starts_large() {
                simultaneous(cluster(2), 3 << 20, 4);
            }
            #[test]
            fn three_senders_to_one_receiver() {
                many_to_one(cluster(4));
            }
            #[test]
            fn too_small_buffers() {
                too_small(cluster(2));
            }
        }
    };
}

transport_tests!(loopback, |n, seg| am_core::Loopback::cluster(
    n,
    am_core::LoopbackConfig::default().segment_size(seg)
));
transport_tests!(sci, |n, seg| sci_sim::Sci::cluster(
    n,
    seg,
    sci_sim::SciConfig::default()
)
.expect("sci"));
transport_tests!(extoll, |n, seg| extoll_sim::Extoll::cluster(
    n,
    seg,
    extoll_sim::ExtollConfig::default()
)
.expect("extoll"));
transport_tests!(portals, |n, seg| portals_sim::Portals::cluster(
    n,
    seg,
    portals_sim::PortalsConfig::default()
)
.expect("portals"));
transport_tests!(udp, |n, seg| transport_udp::Udp::cluster(
    n,
    seg,
    transport_udp::UdpConfig::default()
)
.expect("udp"));

/// One very large message (48 MiB, 48 chunks) on a fast transport, shared with `Arc` so the
/// sender keeps its copy.
#[test]
fn portals_48_mib() {
    const LEN: usize = 48 << 20;
    let t = portals_sim::Portals::cluster(2, LEN + 4096, portals_sim::PortalsConfig::default())
        .expect("portals");
    job(t, MsgConfig::default(), |msg, node| {
        if node.rank() == 0 {
            let data: Arc<[u8]> = pattern(LEN, 3).into();
            let h = msg.send(node, 1, 1, data.clone()).unwrap();
            let info = msg.wait_send(node, h).unwrap();
            assert_eq!(info.len, LEN);
            assert_eq!(data.len(), LEN);
        } else {
            let h = msg.post_recv(node, Some(0), 1, 4096, LEN).unwrap();
            let info = msg.wait_recv(node, h).unwrap();
            assert_eq!(info.len, LEN);
            assert!(node.segment().slice_from(4096).unwrap().to_vec() == pattern(LEN, 3)[..]);
        }
    });
}
