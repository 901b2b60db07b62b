//! The conformance suite over libfabric's providers that run without special hardware:
//! `tcp` (`tcp;ofi_rxm`), `shm`, and `sockets`, whose progress is the provider's own, so its
//! RMA and atomics need no attention from the target.
#![cfg(feature = "libfabric")]

use transport_ofi::{Ofi, OfiConfig};

fn on(provider: &str, ranks: u32, segment_size: usize) -> Vec<Ofi> {
    Ofi::cluster(ranks, segment_size, OfiConfig::default().provider(provider))
        .unwrap_or_else(|e| panic!("an ofi cluster on {provider}: {e}"))
}

fn tcp(ranks: u32, segment_size: usize) -> Vec<Ofi> {
    on("tcp", ranks, segment_size)
}

fn shm(ranks: u32, segment_size: usize) -> Vec<Ofi> {
    on("shm", ranks, segment_size)
}

fn sockets(ranks: u32, segment_size: usize) -> Vec<Ofi> {
    on("sockets", ranks, segment_size)
}

mod tcp {
    am_core::conformance_tests!(super::tcp);
}

mod shm {
    am_core::conformance_tests!(super::shm);
}

mod sockets {
    am_core::conformance_tests!(super::sockets);
}

/// Every provider the suite runs on applies atomics itself: the core's AM path is only the
/// fallback for providers that do not validate every operation.
#[test]
fn the_providers_here_apply_atomics_themselves() {
    for provider in ["tcp", "shm", "sockets"] {
        let t = on(provider, 1, 4096);
        assert!(t[0].native_atomics(), "{provider}");
        assert!(t[0].provider().contains(provider), "{}", t[0].provider());
    }
}

/// `AM_OFI_ATOMICS=am`: the same provider's atomics go through the core's AM path.
#[test]
fn atomics_as_ams_when_asked() {
    let t = Ofi::cluster(
        1,
        4096,
        OfiConfig::default().provider("tcp").provider_atomics(false),
    )
    .expect("a tcp cluster");
    assert!(!t[0].native_atomics());
    assert!(!am_core::Transport::info(&t[0]).capabilities.atomics);
}

mod tcp_atomics_as_ams {
    fn tcp(ranks: u32, segment_size: usize) -> Vec<transport_ofi::Ofi> {
        super::Ofi::cluster(
            ranks,
            segment_size,
            super::OfiConfig::default()
                .provider("tcp")
                .provider_atomics(false),
        )
        .expect("a tcp cluster")
    }

    #[test]
    fn atomics_every_op_and_width() {
        am_core::conformance::atomics_every_op_and_width(&tcp);
    }

    #[test]
    fn atomics_from_all_ranks_add_up() {
        am_core::conformance::atomics_from_all_ranks_add_up(&tcp);
    }

    #[test]
    fn atomics_on_every_word_type() {
        am_core::conformance::atomics_on_every_word_type(&tcp);
    }
}

/// A provider nobody has is a typed error that names the providers found.
#[test]
fn an_unknown_provider_names_the_ones_found() {
    let e = Ofi::cluster(1, 4096, OfiConfig::default().provider("no-such-provider"))
        .expect_err("no such provider");
    let text = e.to_string();
    assert!(
        matches!(e, transport_ofi::OfiTransportError::NoProvider { .. }),
        "{text}"
    );
    assert!(
        text.contains("no-such-provider") && text.contains("tcp"),
        "{text}"
    );
}

/// Catches created segments still reached by system messages over ofi (the publication
/// carrying no key, or the core not taking the RMA path for a peer's segment that
/// published one), and an RMA path that writes, reads or adds at the wrong place: puts,
/// gets and atomics on the peer's created segment are the transport's RMA (counted by
/// `segment_rma_ops`), and land where a put by messages would.
#[test]
fn created_segments_go_by_rma() {
    use am_core::{conformance::run_watched, AtomicOp, Config, Handlers, Node, WaitMode};
    for provider in ["tcp", "shm"] {
        run_watched("created_segments_go_by_rma", on(provider, 2, 4096), |t| {
            let config = Config::default().wait_mode(WaitMode::Block);
            let mut node = Node::new(t, Handlers::local(), config).expect("node");
            let me = node.rank();
            let world = node.world_team();
            let len = 300_000 + 8 * me as usize;
            let mine = node.create_segment(len).expect("create");
            let peers = node.publish_segment(&world, mine).expect("publish");
            let next = peers[(1 - me) as usize];
            let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13 + me) as u8).collect();
            let before = node.transport().segment_rma_ops();
            node.put_to(&next, 5, &data).expect("put");
            assert!(node.get_from(&next, 5, data.len()).expect("get") == data);
            let mut back = vec![0u8; 16];
            node.get_from_into(&next, next.len() - 16, &mut back)
                .expect("get into");
            assert_eq!(back, [0; 16]);
            let word = next.len() & !7usize;
            let old = node
                .atomic_at(&next, word - 8, AtomicOp::FetchAdd(3u64))
                .expect("fetch-add");
            assert_eq!(old, 0);
            assert_eq!(
                node.transport().segment_rma_ops() - before,
                4,
                "{provider}: every operation by RMA"
            );
            node.team_barrier(&world).expect("barrier");
            let seg = node.segment_at(mine).expect("its bytes");
            let mut got = vec![0u8; data.len()];
            seg.read(5, &mut got).expect("read");
            let prev = 1 - me;
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, &b)| b == (i as u32 * 13 + prev) as u8),
                "{provider}: rank {prev}'s put"
            );
            assert_eq!(seg.load_u64((len & !7) - 8).expect("load"), 3);
            node.free_segment(&world, mine).expect("free");
            node.barrier().expect("barrier");
        });
    }
}

/// Catches puts from a published created segment copied on their way (counted by
/// `registration_puts`, which only a write straight from the segment's registration
/// counts), a write from the wrong place of the registration (its word area, or another
/// offset), and a segment never published taken for registered: a put from a created
/// segment to a peer's created segment and to its segment 0 is each one write from the
/// registration, and lands where the bytes were; from a segment never published (so never
/// registered) it goes through the staging buffers, landing all the same.
#[test]
fn puts_from_a_published_created_segment_go_straight_from_its_registration() {
    use am_core::{conformance::run_watched, Config, Handlers, Node, SegmentId, WaitMode};
    for provider in ["tcp", "shm", "sockets"] {
        let test = "puts_from_a_published_created_segment_go_straight_from_its_registration";
        run_watched(test, on(provider, 2, 1 << 20), |t| {
            let config = Config::default().wait_mode(WaitMode::Block);
            let mut node = Node::new(t, Handlers::local(), config).expect("node");
            let me = node.rank();
            let other = 1 - me;
            let world = node.world_team();
            let n = 300_001;
            let mine = node.create_segment(2 * n + 100).expect("create");
            let unpublished = node.create_segment(4096).expect("create");
            let peers = node.publish_segment(&world, mine).expect("publish");
            let zeros = node
                .publish_segment(&world, SegmentId::ZERO)
                .expect("publish segment 0");
            let pattern = |rank: u32, salt: u32, len: usize| -> Vec<u8> {
                (0..len as u32)
                    .map(|i| (i.wrapping_mul(7) ^ salt ^ rank) as u8)
                    .collect()
            };
            let data = pattern(me, 1, n);
            let small = pattern(me, 2, 1000);
            node.segment_at(mine)
                .expect("its bytes")
                .write(7, &data)
                .expect("write");
            node.segment_at(unpublished)
                .expect("its bytes")
                .write(3, &small)
                .expect("write");
            let (puts, rma) = (
                node.transport().registration_puts(),
                node.transport().segment_rma_ops(),
            );
            let created = peers[other as usize];
            let zero = zeros[other as usize];
            // The peer's puts land past this rank's source range, which they must not touch.
            node.put_to_from_segment(&created, n + 9, mine, 7, n)
                .expect("put to the peer's created segment");
            node.put_to_from_segment(&zero, 11, mine, 7, n)
                .expect("put to the peer's segment 0");
            assert_eq!(
                node.transport().registration_puts() - puts,
                2,
                "{provider}: both puts straight from the registration"
            );
            node.put_to_from_segment(&created, 2 * n + 60, unpublished, 3, 20)
                .expect("put from a segment never published");
            node.put_to_from_segment(&zero, n + 40, unpublished, 3, 1000)
                .expect("put from a segment never published to segment 0");
            assert_eq!(
                node.transport().registration_puts() - puts,
                2,
                "{provider}: a segment never published is not registered"
            );
            assert_eq!(
                node.transport().segment_rma_ops() - rma,
                2,
                "{provider}: the puts to the created segment by RMA"
            );
            assert!(node.get_from(&created, n + 9, n).expect("get") == data);
            assert!(node.get_from(&zero, 11, n).expect("get") == data);
            node.team_barrier(&world).expect("barrier");
            let theirs = pattern(other, 1, n);
            let mut got = vec![0u8; n];
            let seg = node.segment_at(mine).expect("its bytes");
            seg.read(n + 9, &mut got).expect("read");
            assert!(
                got == theirs,
                "{provider}: rank {other}'s put to a created segment"
            );
            let mut tail = vec![0u8; 20];
            seg.read(2 * n + 60, &mut tail).expect("read");
            assert_eq!(
                tail,
                pattern(other, 2, 1000)[..20],
                "{provider}: unregistered"
            );
            node.segment().read(11, &mut got).expect("read");
            assert!(got == theirs, "{provider}: rank {other}'s put to segment 0");
            let mut tail = vec![0u8; 1000];
            node.segment().read(n + 40, &mut tail).expect("read");
            assert_eq!(
                tail,
                pattern(other, 2, 1000),
                "{provider}: unregistered to 0"
            );
            node.team_barrier(&world).expect("barrier");
            node.free_segment(&world, mine).expect("free");
            node.barrier().expect("barrier");
        });
    }
}

/// Catches a peer's key blob trusted as it came: one of another length, or one that
/// registers less than the range, is `PeerMisbehaved` naming that peer, with nothing sent,
/// never a panic or an access to whatever address the blob names.
#[test]
fn a_malformed_segment_key_is_the_peers_misbehavior() {
    use am_core::transport::{Remote, Rma, Sink, Source};
    use am_core::{SendError, Transport};
    let mut v = on("tcp", 2, 4096);
    let t = &mut v[0];
    let mut region = Vec::new();
    for w in [0u64, 1, 64] {
        region.extend_from_slice(&w.to_le_bytes());
    }
    let wrapping: Vec<u8> = [u64::MAX, 1, 64]
        .iter()
        .flat_map(|w| w.to_le_bytes())
        .collect();
    let named = |r: Result<(), SendError>| {
        matches!(r, Err(SendError::PeerMisbehaved { peer: Some(1), .. }))
    };
    let put = |t: &mut transport_ofi::Ofi, key: &[u8], offset: usize, data: &[u8]| {
        t.rma(Rma::Put {
            dest: 1,
            to: Remote::Keyed { key, offset },
            from: Source::Bytes(data),
        })
        .map(drop)
    };
    let get = |t: &mut transport_ofi::Ofi, key: &[u8], offset: usize, into: &mut [u8]| {
        t.rma(Rma::Get {
            src: 1,
            from: Remote::Keyed { key, offset },
            into: Sink::Bytes(into),
        })
        .map(drop)
    };
    for key in [&[][..], &[1, 2, 3], &[0; 40], &wrapping[..]] {
        assert!(named(put(t, key, 0, b"x")), "{key:?}");
        assert!(named(get(t, key, 0, &mut [0; 4])), "{key:?}");
        let add = am_core::atomic::Atomic::from(am_core::AtomicOp::FetchAdd(1u64));
        let at = Remote::Keyed { key, offset: 0 };
        let atomic = t.rma(Rma::Atomic {
            dest: 1,
            at,
            atomic: add,
        });
        assert!(named(atomic.map(drop)), "{key:?}");
    }
    // A range past the length the blob registers, and a blob too short for the freed word
    // read beside every operation.
    assert!(named(put(t, &region, 60, &[0; 8])));
    assert!(named(get(t, &region, usize::MAX, &mut [0; 2])));
    let short: Vec<u8> = [0u64, 1, 4].iter().flat_map(|w| w.to_le_bytes()).collect();
    assert!(named(get(t, &short, 0, &mut [0; 2])));
}

/// Catches a registration table of fixed size (more than five registrations at once
/// refused), a slot handed out while still registered, and a blob that names another
/// segment's memory: twelve segments registered at once are each reached by their own key
/// (offsets counting from the word area, the first word read beside each operation being
/// that segment's); half are deregistered and as many registered again in the freed slots,
/// and each new one is reached by its own key too.
#[test]
fn registrations_grow_and_each_key_reaches_its_segment() {
    use am_core::transport::{Registration, Remote, Rma, Sink, Source};
    use am_core::Transport;
    use am_shm::Segment;
    use std::sync::atomic::{AtomicBool, Ordering};
    for provider in ["tcp", "shm"] {
        let mut v = on(provider, 2, 4096);
        let mut b = v.pop().expect("rank 1");
        let mut a = v.pop().expect("rank 0");
        let words = 64;
        let mut segs: Vec<Segment> = (0..12)
            .map(|_| Segment::heap(words, 4096).expect("segment"))
            .collect();
        let mut keys: Vec<Vec<u8>> = (0..12)
            .map(|i| {
                b.registration(Registration::Register {
                    id: i,
                    segment: &segs[i as usize],
                })
                .expect("registered")
            })
            .collect();
        let puts = |a: &mut Ofi, b: Ofi, keys: &[Vec<u8>], tag: u8| {
            let stop = AtomicBool::new(false);
            std::thread::scope(|s| {
                let poller = s.spawn(|| {
                    let mut b = b;
                    while !stop.load(Ordering::SeqCst) {
                        let _ = b.poll_recv(|_, _, _| ());
                        std::thread::yield_now();
                    }
                    b
                });
                for (i, key) in keys.iter().enumerate() {
                    let offset = words + 8 * i;
                    let r = a
                        .rma(Rma::Put {
                            dest: 1,
                            to: Remote::Keyed { key, offset },
                            from: Source::Bytes(&[tag + i as u8; 8]),
                        })
                        .map(|d| d.flag);
                    let mut back = [0u8; 8];
                    let g = a
                        .rma(Rma::Get {
                            src: 1,
                            from: Remote::Keyed { key, offset },
                            into: Sink::Bytes(&mut back),
                        })
                        .map(|d| d.flag);
                    let first = Ok(u64::from(tag) + i as u64);
                    if r != first || g != first || back != [tag + i as u8; 8] {
                        stop.store(true, Ordering::SeqCst);
                        panic!("{provider}: segment {i}: {r:?} {g:?} {back:?}");
                    }
                }
                stop.store(true, Ordering::SeqCst);
                poller.join().expect("poller")
            })
        };
        let first_words = |segs: &[Segment], tag: u64| {
            for (i, seg) in segs.iter().enumerate() {
                seg.word(0)
                    .expect("word")
                    .store(tag + i as u64, Ordering::SeqCst);
            }
        };
        first_words(&segs, 10);
        b = puts(&mut a, b, &keys, 10);
        for (i, seg) in segs.iter().enumerate() {
            let mut got = [0u8; 8];
            seg.read(8 * i, &mut got).expect("read");
            assert_eq!(got, [10 + i as u8; 8], "{provider}: segment {i}");
        }
        for i in (0..12).step_by(2) {
            b.registration(Registration::Deregister { id: i as u32 });
            segs[i] = Segment::heap(words, 4096).expect("segment");
            keys[i] = b
                .registration(Registration::Register {
                    id: 100 + i as u32,
                    segment: &segs[i],
                })
                .expect("registered again");
        }
        first_words(&segs, 40);
        b = puts(&mut a, b, &keys, 40);
        for (i, seg) in segs.iter().enumerate() {
            let mut got = [0u8; 8];
            seg.read(8 * i, &mut got).expect("read");
            assert_eq!(got, [40 + i as u8; 8], "{provider}: segment {i} again");
        }
        drop((a, b));
    }
}
