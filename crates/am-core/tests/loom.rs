//! loom model of the loopback ring, on the real `Loopback` (its rings are heap segments whose
//! atomics are loom's under `cfg(loom)`, and am-shm's futex is modelled without timeouts, so
//! a lost wake-up is a deadlock loom reports).
//!
//! A sender with room for one message in its ring sends two across the ring's end while the
//! receiver polls and sleeps: every interleaving must deliver both, whole and in order (the
//! header stored last with `Release`, the zeroed word after each record, the head published
//! after the handler, the wrap record), and a receiver that sleeps must be woken. A second
//! model does the same with Shorts, the first of which takes the sender's fast path (the
//! limits it last read let it through) and the second a wrap.
//!
//! The wake-up is a handshake: the receiver announces that it sleeps, fences and looks at its
//! rings again; a sender publishes, fences and looks at the announcement. In a process the
//! sender's fence is only a compiler fence and the receiver's a `membarrier`
//! (`am_shm::sync::AsymmetricFence`); under loom both are `SeqCst` fences, the pair's
//! guarantee, which is what these models check.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p am-core --release --test loom`
#![cfg(loom)]

use std::time::Duration;

use am_core::wire::{encode_head, MAX_HEAD_LEN};
use am_core::{AmKind, Category, Loopback, LoopbackConfig, Outgoing, SendError, Transport, Tx};

const BODY: usize = 16;

fn medium(buf: &mut [u8; MAX_HEAD_LEN]) -> usize {
    encode_head(Category::Request, AmKind::Medium, 1, &[], BODY, buf)
}

#[test]
fn loom_ring_hands_over_across_its_end_and_wakes_a_sleeper() {
    am_shm::sync::model(2, || {
        let config = LoopbackConfig::default()
            .capacity(1)
            .segment_size(64)
            .max_medium(BODY)
            .max_long(64);
        let mut v = Loopback::cluster(2, config);
        let mut rx = v.pop().unwrap();
        let mut tx = v.pop().unwrap();
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = medium(&mut h);
        // One thread first: the ring's position moves next to its end, so the two messages
        // of the model straddle it.
        for i in 0..5u8 {
            tx.try_send(1, &Outgoing::new(&h[..n], &[i; BODY])).unwrap();
            let got = rx.poll_recv(|d, _, _| d.bytes.to_vec()).unwrap().unwrap();
            assert_eq!(got[n..], [i; BODY]);
        }
        let sender = am_shm::sync::spawn(move || {
            let mut h = [0u8; MAX_HEAD_LEN];
            let n = medium(&mut h);
            for i in 5..7u8 {
                loop {
                    match tx.try_send(1, &Outgoing::new(&h[..n], &[i; BODY])) {
                        Ok(()) => break,
                        // Room for one: the second waits for the receiver's head.
                        Err(SendError::Busy) => am_shm::sync::yield_now(),
                        Err(e) => panic!("send: {e}"),
                    }
                }
            }
            tx
        });
        let mut got = Vec::new();
        while got.len() < 2 {
            match rx.poll_recv(|d, _, _| d.bytes.to_vec()).unwrap() {
                Some(bytes) => got.push(bytes[n..].to_vec()),
                // Announces itself, fences, looks again, and sleeps only if nothing came.
                None => rx.wait(Duration::from_secs(1)).unwrap(),
            }
        }
        assert_eq!(got, [[5u8; BODY].to_vec(), [6u8; BODY].to_vec()]);
        drop(sender.join().unwrap());
    });
}

/// A Short to handler `h` with no arguments: a head of one word, a record of two.
fn short(h: u8, buf: &mut [u8; MAX_HEAD_LEN]) -> usize {
    encode_head(Category::Request, AmKind::Short, h, &[], 0, buf)
}

#[test]
fn loom_short_fast_path_and_wrap_wake_a_sleeper() {
    am_shm::sync::model(2, || {
        // A ring of 216 bytes (twice the largest record and a word); records end at most a
        // word before its end, at 208.
        let config = LoopbackConfig::default()
            .capacity(3)
            .segment_size(64)
            .max_medium(BODY)
            .max_long(64);
        let mut v = Loopback::cluster(2, config);
        let mut rx = v.pop().unwrap();
        let mut tx = v.pop().unwrap();
        let mut h = [0u8; MAX_HEAD_LEN];
        // One thread first: ten Shorts of 16 bytes and a Medium of 32 take the ring to 192,
        // the limits last read leaving room for one more record without a wrap.
        for i in 0..11u8 {
            let n = if i < 10 {
                short(i, &mut h)
            } else {
                medium(&mut h)
            };
            let payload: &[u8] = if i < 10 { &[] } else { &[i; BODY] };
            tx.try_send(1, &Outgoing::new(&h[..n], payload)).unwrap();
            let got = rx.poll_recv(|d, _, _| d.bytes.to_vec()).unwrap().unwrap();
            assert_eq!(got, [&h[..n], payload].concat());
        }
        let sender = am_shm::sync::spawn(move || {
            let mut h = [0u8; MAX_HEAD_LEN];
            // The first ends at 208 (the fast path), the second wraps.
            for i in 11..13u8 {
                let n = short(i, &mut h);
                loop {
                    match tx.try_send(1, &Outgoing::new(&h[..n], &[])) {
                        Ok(()) => break,
                        Err(SendError::Busy) => am_shm::sync::yield_now(),
                        Err(e) => panic!("send: {e}"),
                    }
                }
            }
            tx
        });
        let mut got = Vec::new();
        while got.len() < 2 {
            match rx.poll_recv(|d, _, _| d.bytes.to_vec()).unwrap() {
                Some(bytes) => got.push(bytes),
                None => rx.wait(Duration::from_secs(1)).unwrap(),
            }
        }
        let mut want = Vec::new();
        for i in 11..13u8 {
            let n = short(i, &mut h);
            want.push(h[..n].to_vec());
        }
        assert_eq!(got, want);
        drop(sender.join().unwrap());
    });
}

/// Arming: a receiver that arms instead of sleeping loses no message. Whatever the order of
/// its arming and a send, either its arming saw the message (`Ready`), or the sender, looking
/// at the receiver's word after its publication, found it armed and woke its descriptor: once
/// the sender is done, an armed receiver's descriptor is readable. Both sides run the real
/// code (`Transport::arm`, the send path and its wake); only the descriptor is a real socket
/// that loom does not model, read here once the sender has finished.
#[test]
fn loom_arming_never_misses_a_message() {
    am_shm::sync::model(2, || {
        let mut v = Loopback::cluster(2, LoopbackConfig::default().capacity(2));
        let mut rx = v.pop().unwrap();
        let mut tx = v.pop().unwrap();
        let fd = rx
            .wake_fd()
            .unwrap()
            .expect("loopback has a wake descriptor")
            .try_clone_to_owned()
            .unwrap();
        let sender = am_shm::sync::spawn(move || {
            let mut h = [0u8; MAX_HEAD_LEN];
            let n = short(7, &mut h);
            tx.try_send(1, &Outgoing::new(&h[..n], &[])).unwrap();
            tx
        });
        let armed = rx.arm().unwrap();
        let tx = sender.join().unwrap();
        if let am_core::Armed::Sleep(_) = armed {
            use std::os::fd::AsFd;
            let mut fds = [nix::poll::PollFd::new(
                fd.as_fd(),
                nix::poll::PollFlags::POLLIN,
            )];
            let ready = nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO).unwrap();
            assert_eq!(ready, 1, "armed, and the sender's wake-up was lost");
        }
        rx.disarm();
        let got = rx.poll_recv(|d, _, _| d.bytes.to_vec()).unwrap();
        assert!(got.is_some(), "the message is there once disarmed");
        drop(tx);
    });
}
