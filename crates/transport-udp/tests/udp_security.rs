//! Hostile datagrams during a run: a stranger socket sends 100 000 datagrams (random bytes,
//! truncated, forged, replayed, replayed under a new packet number, another job's, another
//! key's, an earlier run's, sealed with the job's key for the other direction) to a rank while
//! it works. The run still verifies, no handler runs for them, the counters account for them,
//! nobody answers. Also what a relay sees: nothing readable, and small messages sharing
//! datagrams under a flood but not in a lone round trip; and an authentic peer's malformed
//! frame reported as its misbehaviour.

use std::cell::{Cell, RefCell};
use std::net::{SocketAddr, UdpSocket};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use am_core::{
    AmKind, Config, HandlerId, Handlers, Node, Received, Transport, TransportError, WaitMode,
};
use transport_udp::proto::{Engine, EngineConfig};
use transport_udp::wire::{self, Authenticator, Header, Kind};
use transport_udp::{JobKey, PeerAddr, Udp, UdpConfig};

const SEQ: HandlerId = HandlerId(1);
const HOSTILE: u64 = 100_000;
const EPOCHS: [u64; 2] = [0x1111_2222, 0x3333_4444];

fn bind() -> UdpSocket {
    UdpSocket::bind("127.0.0.1:0").unwrap()
}

/// Datagrams the kernel dropped on the socket bound to `port` (/proc/net/udp), if readable.
fn kernel_drops(port: u16) -> u64 {
    let Ok(t) = std::fs::read_to_string("/proc/net/udp") else {
        return 0;
    };
    let want = format!(":{port:04X}");
    t.lines()
        .skip(1)
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|a| a.ends_with(&want))
        })
        .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
        .sum()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A datagram another job (or a holder of another key, or rank 0 started with other epochs)
/// would send to rank 1.
fn foreign(key: [u8; 32], job: &str, epochs: &[u64], now: Instant) -> Vec<u8> {
    let auth = Authenticator::new(&JobKey::from_bytes(key), job);
    let mut e = Engine::new(EngineConfig::default(), 0, epochs, auth);
    e.send(now, 1, b"\x00\x01\x00\x00\x00\x00\x00\x00", &[])
        .unwrap();
    let mut out = Vec::new();
    e.transmit(now, &mut |_, b| out.push(b.to_vec()));
    out.remove(0)
}

/// Forwards every datagram `relay` receives to `to`, after showing it to `seen`, until `stop`.
/// Ranks 0 and 1 of `job` on `s0` and `s1` (at `at[0]` and `at[1]`), rank 0 sending to rank 1
/// at `to1` and rank 1 to rank 0 at `to0`: a relay's address, or the rank's own.
fn pair(
    key: &JobKey,
    job: &str,
    (s0, s1): (UdpSocket, UdpSocket),
    at: [SocketAddr; 2],
    (to0, to1): (SocketAddr, SocketAddr),
) -> (Udp, Udp) {
    let peer = |addr: SocketAddr, i: usize| PeerAddr {
        addr,
        epoch: EPOCHS[i],
    };
    let rank = |r: u32, s: UdpSocket, peers: &[PeerAddr]| {
        Udp::with_peers(r, s, peers, key, job, 1 << 16, UdpConfig::default()).unwrap()
    };
    (
        rank(0, s0, &[peer(at[0], 0), peer(to1, 1)]),
        rank(1, s1, &[peer(to0, 0), peer(at[1], 1)]),
    )
}

fn forward(relay: &UdpSocket, to: SocketAddr, stop: &AtomicBool, mut seen: impl FnMut(&[u8])) {
    relay
        .set_read_timeout(Some(Duration::from_millis(20)))
        .unwrap();
    let mut buf = [0u8; 65536];
    while !stop.load(Ordering::SeqCst) {
        if let Ok((n, _)) = relay.recv_from(&mut buf) {
            let _ = relay.send_to(&buf[..n], to);
            seen(&buf[..n]);
        }
    }
}

/// Sets the flag when dropped, also while unwinding from a panic.
struct StopOnDrop<'a>(&'a AtomicBool);
impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[test]
fn hostile_datagrams_change_nothing_during_a_run() {
    let key = JobKey::generate().unwrap();
    let hex = key.to_hex();
    let key_bytes: [u8; 32] =
        std::array::from_fn(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap());
    let (s0, s1, relay) = (bind(), bind(), bind());
    let (a0, a1, ar) = (
        s0.local_addr().unwrap(),
        s1.local_addr().unwrap(),
        relay.local_addr().unwrap(),
    );
    // Rank 0 reaches rank 1 through a relay that keeps copies for the attacker to replay.
    let (r0, r1) = pair(&key, "sec-job", (s0, s1), [a0, a1], (a0, ar));
    let port1 = a1.port();
    let drops_before = kernel_drops(port1);

    let tape: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    let attack_done = AtomicBool::new(false);
    let (recorded_tx, recorded_rx) = mpsc::channel::<()>();
    let stranger = bind();
    stranger.set_nonblocking(true).unwrap();
    let mut sent_hostile = 0u64;

    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        // The relay.
        s.spawn(|| {
            let mut signalled = false;
            forward(&relay, a1, &stop, |d| {
                let mut t = tape.lock().unwrap();
                if t.len() < 1000 {
                    t.push(d.to_vec());
                }
                if t.len() >= 200 && !signalled {
                    signalled = true;
                    let _ = recorded_tx.send(());
                }
            })
        });
        // The stranger.
        let (tape, attack_done, stranger, sent_hostile) =
            (&tape, &attack_done, &stranger, &mut sent_hostile);
        s.spawn(move || {
            recorded_rx
                .recv_timeout(Duration::from_secs(30))
                .expect("legit traffic recorded");
            let tape = tape.lock().unwrap().clone();
            let now = Instant::now();
            let wrong_job = foreign(
                *b"0123456789abcdef0123456789abcdef",
                "other-job",
                &EPOCHS,
                now,
            );
            // The right key and job, but an earlier run of rank 0 (another epoch).
            let earlier_run = foreign(key_bytes, "sec-job", &[0x5555, EPOCHS[1]], now);
            // The job's own key, but the subkey of the other direction (rank 1 to rank 0).
            let reverse = Authenticator::new(&JobKey::from_bytes(key_bytes), "sec-job")
                .datagram_key(1, 0, EPOCHS[1], EPOCHS[0]);
            let mut rng = Rng(42);
            for i in 0..HOSTILE {
                let pick = &tape[(rng.next() % tape.len() as u64) as usize];
                let fresh_pn = (u64::MAX - i).to_le_bytes();
                let d: Vec<u8> = match i % 9 {
                    0 => (0..rng.next() % 300).map(|_| rng.next() as u8).collect(),
                    1 => pick[..(rng.next() as usize % pick.len())].to_vec(),
                    2 => {
                        let mut f = pick.clone();
                        let bit = rng.next() as usize % (f.len() * 8);
                        f[bit / 8] ^= 1 << (bit % 8);
                        f[36..44].copy_from_slice(&fresh_pn);
                        f
                    }
                    3 => pick.clone(),
                    4 => wrong_job.clone(),
                    5 => {
                        // Right job id, wrong key.
                        let mut f = wrong_job.clone();
                        f[4..12].copy_from_slice(&pick[4..12]);
                        f
                    }
                    6 => {
                        // A replay renumbered past the replay window: the packet number is
                        // the MAC's nonce, so only the MAC stands in the way.
                        let mut f = pick.clone();
                        f[36..44].copy_from_slice(&fresh_pn);
                        f
                    }
                    7 => earlier_run.clone(),
                    _ => {
                        // Renumbered and sealed again under a key of this job, but the
                        // reverse direction's.
                        let mut f = pick.clone();
                        f[36..44].copy_from_slice(&fresh_pn);
                        reverse.seal(&mut f);
                        f
                    }
                };
                let _ = stranger.send_to(&d, a1);
                *sent_hostile += 1;
                if i % 200 == 199 {
                    // Pacing, so the kernel's socket buffer does not overflow.
                    std::thread::sleep(Duration::from_micros(500));
                }
            }
            attack_done.store(true, Ordering::SeqCst);
        });
        // The job.
        let results = am_core::run_ranks(vec![r0, r1], |t| {
            let seen = Rc::new(RefCell::new(Vec::new()));
            let s2 = seen.clone();
            let mut h = Handlers::local();
            h.request(SEQ, "seq", AmKind::Short, move |msg, _| {
                s2.borrow_mut().push(msg.args()[0])
            })
            .unwrap();
            let config = Config::default().wait_mode(WaitMode::Block);
            let mut node = Node::new(t, h, config).unwrap();
            let mut sent = 0u32;
            if node.rank() == 0 {
                while sent < 2000 || !attack_done.load(Ordering::SeqCst) {
                    node.request_short(1, SEQ, &[sent]).unwrap();
                    sent += 1;
                }
                node.request_short(1, SEQ, &[u32::MAX]).unwrap();
            } else {
                node.wait_until(|| seen.borrow().last() == Some(&u32::MAX))
                    .unwrap();
                // Read everything the stranger sent that the kernel kept.
                let deadline = Instant::now() + Duration::from_secs(20);
                while Instant::now() < deadline
                    && node.transport().stats().rejected() + kernel_drops(port1) - drops_before
                        < HOSTILE
                {
                    node.poll().unwrap();
                }
            }
            // Read while the socket is open (its /proc entry goes with it).
            let kernel = kernel_drops(port1) - drops_before;
            node.barrier().unwrap();
            let seqs = seen.borrow().clone();
            (seqs, node.transport().stats(), kernel)
        });
        stop.store(true, Ordering::SeqCst);
        let (seqs, stats, dropped_by_kernel) = &results[1];
        let n = seqs.len() - 1;
        assert!(n >= 2000);
        assert_eq!(
            seqs[..n],
            (0..n as u32).collect::<Vec<_>>()[..],
            "exactly once, in order"
        );
        assert!(
            stats.rejected() <= HOSTILE && stats.rejected() + dropped_by_kernel >= HOSTILE,
            "every hostile datagram that arrived was rejected: {stats:?}, kernel drops {dropped_by_kernel}"
        );
        assert!(stats.dropped_replayed > 0, "{stats:?}");
        assert!(stats.dropped_bad_mac > 0 && stats.dropped_wrong_job > 0);
        assert!(stats.dropped_misaddressed > 0, "{stats:?}");
        assert!(stats.dropped_truncated + stats.dropped_malformed > 0);
        assert_eq!(results[0].1.rejected(), 0);
    });
    assert_eq!(sent_hostile, HOSTILE);
    let mut buf = [0u8; 2048];
    assert!(
        stranger.recv_from(&mut buf).is_err(),
        "the stranger never gets an answer"
    );
}

/// What crosses the wire is encrypted: a relay between the two ranks records every datagram
/// of a run that sends a Medium and puts a segment's worth of recognisable bytes, and none of
/// them holds a 16-byte run of those bytes, while rank 1 gets them all.
#[test]
fn payloads_are_not_readable_on_the_wire() {
    const MARKED: HandlerId = HandlerId(2);
    let marker: Vec<u8> = b"amnet-plaintext!".repeat(64);
    let key = JobKey::generate().unwrap();
    // One relay per direction (a rank may send from another port than it receives on).
    let (s0, s1, to1, to0) = (bind(), bind(), bind(), bind());
    let (a0, a1) = (s0.local_addr().unwrap(), s1.local_addr().unwrap());
    let (r1, r0) = (to1.local_addr().unwrap(), to0.local_addr().unwrap());
    let (rank0, rank1) = pair(&key, "wire-job", (s0, s1), [a0, a1], (r0, r1));
    let tape: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        // The relays stop also when a rank panics, so the test fails instead of hanging.
        let _stop = StopOnDrop(&stop);
        for (relay, to) in [(&to1, a1), (&to0, a0)] {
            let (tape, stop) = (&tape, &stop);
            s.spawn(move || forward(relay, to, stop, |d| tape.lock().unwrap().push(d.to_vec())));
        }
        let marker = &marker;
        let results = am_core::run_ranks(vec![rank0, rank1], |t| {
            let got = Rc::new(RefCell::new(Vec::new()));
            let g = got.clone();
            let mut h = Handlers::local();
            h.request(MARKED, "marked", AmKind::Medium, move |msg, _| {
                g.borrow_mut().extend_from_slice(msg.payload())
            })
            .unwrap();
            let config = Config::default().wait_mode(WaitMode::Block);
            let mut node = Node::new(t, h, config).unwrap();
            if node.rank() == 0 {
                node.request_medium(1, MARKED, &[], marker).unwrap();
                node.put(1, 0, marker).unwrap();
            } else {
                node.wait_until(|| got.borrow().len() == marker.len())
                    .unwrap();
            }
            node.barrier().unwrap();
            let segment = node
                .transport()
                .segment()
                .slice(0, marker.len())
                .unwrap()
                .to_vec();
            let medium = got.borrow().clone();
            (medium, segment)
        });
        stop.store(true, Ordering::SeqCst);
        assert_eq!(&results[1].0, marker, "the Medium arrived");
        assert_eq!(&results[1].1, marker, "the put landed");
    });
    let tape = tape.into_inner().unwrap();
    assert!(
        tape.iter().map(Vec::len).sum::<usize>() > 2 * marker.len(),
        "the relay saw the run"
    );
    let run = &marker[..16];
    for d in &tape {
        assert!(
            !d.windows(run.len()).any(|w| w == run),
            "a datagram carries the payload in the clear"
        );
    }
}

/// Rank 0's data datagrams to rank 1 as a relay between them sees them (their header is
/// readable): round trips one at a time never share a datagram; a flood of one-way AM Shorts
/// does, and every message arrives.
#[test]
fn a_flood_shares_datagrams_and_a_lone_round_trip_does_not() {
    const PING: HandlerId = HandlerId(3);
    const PONG: HandlerId = HandlerId(4);
    const SINK: HandlerId = HandlerId(5);
    const ROUND_TRIPS: u32 = 300;
    const FLOOD: u32 = 20_000;
    /// Phases: start-up (not counted), round trips, flood.
    const START: u32 = 2;
    let key = JobKey::generate().unwrap();
    let (s0, s1, to1, to0) = (bind(), bind(), bind(), bind());
    let (a0, a1) = (s0.local_addr().unwrap(), s1.local_addr().unwrap());
    let (r1, r0) = (to1.local_addr().unwrap(), to0.local_addr().unwrap());
    let (rank0, rank1) = pair(&key, "pack-job", (s0, s1), [a0, a1], (r0, r1));
    // Per phase: rank 0's data datagrams, and how many of them were packed.
    let counts: Mutex<[[u64; 2]; 2]> = Mutex::new([[0; 2]; 2]);
    let phase = AtomicU32::new(START);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let (counts, phase, stop) = (&counts, &phase, &stop);
        s.spawn(move || {
            forward(&to1, a1, stop, |d| {
                let p = phase.load(Ordering::SeqCst);
                if p != START && d[1] == Kind::Data as u8 {
                    counts.lock().unwrap()[p as usize][usize::from(d[2] == wire::FLAG_PACKED)] += 1;
                }
            })
        });
        s.spawn(move || forward(&to0, a0, stop, |_| {}));
        let results = am_core::run_ranks(vec![rank0, rank1], |t| {
            let pongs = Rc::new(Cell::new(0u32));
            let sunk = Rc::new(Cell::new(0u32));
            let mut h = Handlers::local();
            h.request(PING, "ping", AmKind::Short, |_, token| {
                token.reply_short(PONG, &[]).unwrap();
            })
            .unwrap();
            let p = pongs.clone();
            h.reply(PONG, "pong", AmKind::Short, move |_| p.set(p.get() + 1))
                .unwrap();
            let k = sunk.clone();
            h.request(SINK, "sink", AmKind::Short, move |msg, _| {
                if msg.args()[0] == k.get() {
                    k.set(k.get() + 1);
                }
            })
            .unwrap();
            let config = Config::default().wait_mode(WaitMode::Block);
            let mut node = Node::new(t, h, config).unwrap();
            node.barrier().unwrap();
            if node.rank() == 0 {
                phase.store(0, Ordering::SeqCst);
                let sent = || {
                    let c = counts.lock().unwrap();
                    c[0][0] + c[0][1]
                };
                for i in 0..ROUND_TRIPS {
                    let before = sent();
                    node.request_short(1, PING, &[i]).unwrap();
                    // After the first round trip the link is idle when a request goes (the
                    // last reply acknowledged everything): the request is on the wire before
                    // this rank polls again. (Before the first, the barrier's message may
                    // still be unacknowledged, and the request waits for the poll.)
                    let deadline = Instant::now() + Duration::from_secs(10);
                    while i > 0 && sent() == before {
                        assert!(Instant::now() < deadline, "round trip {i}: request held");
                        std::thread::yield_now();
                    }
                    node.wait_until(|| pongs.get() > i).unwrap();
                }
                phase.store(1, Ordering::SeqCst);
                for i in 0..FLOOD {
                    node.request_short(1, SINK, &[i]).unwrap();
                }
            } else {
                node.wait_until(|| sunk.get() == FLOOD).unwrap();
            }
            node.barrier().unwrap();
            (pongs.get(), sunk.get())
        });
        stop.store(true, Ordering::SeqCst);
        assert_eq!(results[0].0, ROUND_TRIPS);
        assert_eq!(results[1].1, FLOOD, "every message, in order");
    });
    let [[rt, rt_packed], [flood, flood_packed]] = counts.into_inner().unwrap();
    println!("round trips: {rt} datagrams, {rt_packed} packed; flood: {flood}, {flood_packed}");
    assert_eq!(rt_packed, 0, "a lone round trip is never held for packing");
    assert!(
        rt >= u64::from(ROUND_TRIPS),
        "each request its own datagram"
    );
    assert!(flood_packed > 0, "the flood was packed");
    assert!(
        flood + flood_packed < u64::from(FLOOD) / 4,
        "{FLOOD} messages in {flood} datagrams"
    );
}

/// A datagram that rank 0 could have sent (the job's key, the right ranks and epochs), packed,
/// with a frame of an unknown type between two good ones: rank 1 delivers the first, reports
/// rank 0's misbehaviour, drops the rest of the datagram and goes on.
#[test]
fn a_malformed_frame_from_an_authentic_peer_is_its_misbehaviour() {
    let key = JobKey::generate().unwrap();
    let (s0, s1) = (bind(), bind());
    let (a0, a1) = (s0.local_addr().unwrap(), s1.local_addr().unwrap());
    let auth = Authenticator::new(&key, "frame-job");
    let dkey = auth.datagram_key(0, 1, EPOCHS[0], EPOCHS[1]);
    let packed = |pn: u64, seq: u64, body: &[u8]| {
        let h = Header {
            kind: Kind::Data,
            flags: wire::FLAG_PACKED,
            job_tag: auth.job_tag(),
            src: 0,
            dst: 1,
            src_epoch: EPOCHS[0],
            dst_epoch: EPOCHS[1],
            pn,
            ack: 0,
            sack: 0,
            seq,
            msg_len: 0,
            newest_pn: 0,
            ack_delay_us: 0,
        };
        let mut d = vec![0u8; wire::HEADER_LEN + body.len() + wire::MAC_LEN];
        h.write(&mut d);
        d[wire::HEADER_LEN..wire::HEADER_LEN + body.len()].copy_from_slice(body);
        dkey.seal(&mut d);
        d
    };
    let mut body = Vec::new();
    wire::push_frame(&mut body, b"good", &[]);
    body.extend_from_slice(&[0x7f, 5, 0, 1, 2, 3, 4, 5]);
    wire::push_frame(&mut body, b"never", &[]);
    let mut after = Vec::new();
    wire::push_frame(&mut after, b"next", &[]);
    // Rank 0 is only a socket that never answers: the datagrams are the test's.
    let mut config = UdpConfig::default();
    config.linger = Duration::from_millis(50);
    let peers = [
        PeerAddr {
            addr: a0,
            epoch: EPOCHS[0],
        },
        PeerAddr {
            addr: a1,
            epoch: EPOCHS[1],
        },
    ];
    let mut rank1 = Udp::with_peers(1, s1, &peers, &key, "frame-job", 1 << 16, config).unwrap();
    s0.send_to(&packed(1, 0, &body), a1).unwrap();
    s0.send_to(&packed(2, 1, &after), a1).unwrap();
    let mut got = Vec::new();
    let mut misbehaved = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 2 && Instant::now() < deadline {
        match rank1.poll_recv(|d, _, _| match d.bytes {
            Received::Private(m) => m.to_vec(),
            _ => Vec::new(),
        }) {
            Ok(Some(m)) => got.push(m),
            Ok(None) => {}
            Err(e) => misbehaved.push(e),
        }
    }
    assert_eq!(got, [b"good".to_vec(), b"next".to_vec()]);
    assert!(
        matches!(
            &misbehaved[..],
            [TransportError::PeerMisbehaved { peer: Some(0), what }] if what.contains("unknown type 127")
        ),
        "{misbehaved:?}"
    );
    assert_eq!(rank1.stats().protocol_violations, 1);
}

/// Fetching atomics whose results nobody waits for yet are packed with their neighbours: 64
/// `atomic_nb` to one word of rank 1, then the waits. Every old value is distinct (each add
/// applied once), the word ends at the sum, and most requests went packed.
#[test]
fn fetching_atomics_not_yet_waited_for_share_datagrams() {
    const N: u64 = 64;
    let transports = Udp::cluster(2, 1 << 16, UdpConfig::default()).unwrap();
    let results = am_core::run_ranks(transports, |t| {
        let config = Config::default().wait_mode(WaitMode::Block);
        let mut node = Node::new(t, Handlers::local(), config).unwrap();
        let mut olds = Vec::new();
        if node.rank() == 0 {
            let handles: Vec<_> = (0..N)
                .map(|_| {
                    node.atomic_nb(1, 0, am_core::AtomicOp::FetchAdd(1u64))
                        .unwrap()
                })
                .collect();
            for h in handles {
                olds.push(node.wait(h).unwrap());
            }
        }
        node.barrier().unwrap();
        let word = node.transport().segment().load_u64(0).unwrap();
        (olds, word, node.transport().stats().packed_messages)
    });
    let (mut olds, _, packed) = results[0].clone();
    olds.sort_unstable();
    assert_eq!(olds, (0..N).collect::<Vec<_>>(), "each add applied once");
    assert_eq!(results[1].1, N);
    assert!(packed >= N / 2, "{packed} of {N} requests packed");
}
