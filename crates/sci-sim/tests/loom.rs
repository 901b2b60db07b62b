//! loom model of SCI's message-exist-flag suppression, on the real `Sci` over heap memory
//! (am-shm's atomics are loom's under `cfg(loom)`, and its futex is modelled without timeouts,
//! so a lost wake-up is a deadlock loom reports).
//!
//! A sender that rang once sends again without ringing while the receiver's take count (in
//! the sender's own memory) has not moved; the receiver takes the flag, writes the new count,
//! and scans. The fence pair must make either the sender see the new count (and ring), or the
//! receiver's scan see the message: otherwise the receiver sleeps for ever.
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p sci-sim --release --test loom`
#![cfg(loom)]

use std::time::Duration;

use am_core::wire::{encode_head, MAX_HEAD_LEN};
use am_core::{AmKind, Category, Outgoing, Transport, Tx};
use sci_sim::{Sci, SciConfig};

fn short(buf: &mut [u8; MAX_HEAD_LEN]) -> usize {
    encode_head(Category::Request, AmKind::Short, 1, &[], 0, buf)
}

#[test]
fn loom_take_count_suppression_never_loses_a_message() {
    am_shm::sync::model(2, || {
        let config = SciConfig::default().slots(2).slot_size(128);
        let mut v = Sci::cluster(2, 64, config).unwrap();
        let mut rx = v.pop().unwrap();
        let mut tx = v.pop().unwrap();
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = short(&mut h);
        // The first message rings; the receiver takes it and leaves its flag set.
        tx.try_send(1, &Outgoing::new(&h[..n], &[])).unwrap();
        assert!(rx.poll_recv(|d, _, _| d.src).unwrap().is_some());
        let sender = am_shm::sync::spawn(move || {
            let mut h = [0u8; MAX_HEAD_LEN];
            let n = short(&mut h);
            // The count has not moved since it rang: this send may skip the ring.
            tx.try_send(1, &Outgoing::new(&h[..n], &[])).unwrap();
            tx
        });
        loop {
            if rx.poll_recv(|d, _, _| d.src).unwrap().is_some() {
                break;
            }
            // Takes the flag, writes the count, scans, and sleeps only if nothing was found.
            rx.wait(Duration::from_secs(1)).unwrap();
        }
        drop(sender.join().unwrap());
    });
}
