//! [`FaultInjector`]: a seeded wrapper that drops, duplicates, reorders and delays messages, for
//! testing protocols that must be reliable over lossy links (smoltcp's `FaultInjector`).
//!
//! It wraps any [`Transport`] and applies faults to everything sent through it, replies from
//! handlers included. The same seed gives the same faults for the same sequence of sends.
//! The AM core itself assumes a reliable transport: this is a tool for building and testing the
//! reliability layer of transports such as UDP, not something to run a job over.

use std::time::Duration;

use crate::transport::{
    Delivery, Outgoing, Payload, Route, SendError, SharedBytes, Transport, TransportError, Tx,
};
use crate::types::Rank;

/// Probabilities (0.0..=1.0) of each fault, per message sent:
/// `FaultConfig::default().seed(7).drop(0.1)`.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct FaultConfig {
    /// Seed of the fault generator.
    pub seed: u64,
    /// Message silently discarded.
    pub drop: f64,
    /// Message sent twice.
    pub duplicate: f64,
    /// Message held back and sent after up to `max_delay` later sends (so it arrives late and
    /// out of order).
    pub delay: f64,
    /// The most later sends a delayed message waits for.
    pub max_delay: u32,
}

impl Default for FaultConfig {
    fn default() -> Self {
        FaultConfig {
            seed: 1,
            drop: 0.0,
            duplicate: 0.0,
            delay: 0.0,
            max_delay: 4,
        }
    }
}

impl FaultConfig {
    /// The defaults (no faults), as [`FaultConfig::default`]; change them with the setters
    /// below.
    pub fn new() -> FaultConfig {
        FaultConfig::default()
    }

    /// With this seed of the fault generator.
    #[must_use]
    pub fn seed(mut self, seed: u64) -> FaultConfig {
        self.seed = seed;
        self
    }

    /// Discarding a message with this probability.
    #[must_use]
    pub fn drop(mut self, drop: f64) -> FaultConfig {
        self.drop = drop;
        self
    }

    /// Sending a message twice with this probability.
    #[must_use]
    pub fn duplicate(mut self, duplicate: f64) -> FaultConfig {
        self.duplicate = duplicate;
        self
    }

    /// Holding a message back with this probability.
    #[must_use]
    pub fn delay(mut self, delay: f64) -> FaultConfig {
        self.delay = delay;
        self
    }

    /// Holding a delayed message back for at most this many later sends.
    #[must_use]
    pub fn max_delay(mut self, max_delay: u32) -> FaultConfig {
        self.max_delay = max_delay;
        self
    }
}

/// What the injector did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Messages passed through.
    pub sent: u64,
    /// Messages discarded.
    pub dropped: u64,
    /// Extra copies sent.
    pub duplicated: u64,
    /// Messages held back.
    pub delayed: u64,
}

struct Held {
    dest: Rank,
    head_len: usize,
    long_offset: Option<usize>,
    reply_to: Option<Route>,
    bytes: Vec<u8>,
    after: u32,
}

/// The seeded generator behind the fault decisions (SplitMix64: tiny, good enough to pick
/// faults). Public so that transports injecting faults below the AM level (datagrams) make
/// their decisions the same way from the same seed.
#[derive(Debug, Clone)]
pub struct FaultRng(u64);

impl FaultRng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        FaultRng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `p` (never for `p <= 0`).
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

struct Faults {
    config: FaultConfig,
    rng: FaultRng,
    held: Vec<Held>,
    stats: FaultStats,
}

impl Faults {
    fn next(&mut self) -> u64 {
        self.rng.next_u64()
    }

    fn chance(&mut self, p: f64) -> bool {
        self.rng.chance(p)
    }

    /// Sends the held messages whose time has come (one step per send or poll).
    fn release(&mut self, tx: &mut dyn Tx) {
        let mut i = 0;
        while i < self.held.len() {
            let h = &mut self.held[i];
            h.after = h.after.saturating_sub(1);
            if h.after == 0 {
                let out = Outgoing {
                    head: &h.bytes[..h.head_len],
                    payload: Payload::Private(&h.bytes[h.head_len..]),
                    long_offset: h.long_offset,
                    reply_to: h.reply_to,
                };
                match tx.try_send(h.dest, &out) {
                    Err(SendError::Busy) => {
                        h.after = 1;
                        i += 1;
                    }
                    _ => {
                        self.held.remove(i);
                    }
                }
            } else {
                i += 1;
            }
        }
    }

    fn send(&mut self, tx: &mut dyn Tx, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.release(tx);
        if self.chance(self.config.drop) {
            self.stats.dropped += 1;
            return Ok(());
        }
        if self.chance(self.config.delay) {
            let mut bytes = Vec::with_capacity(msg.len());
            bytes.extend_from_slice(msg.head);
            msg.payload.append_to(&mut bytes);
            let after = 1 + (self.next() % self.config.max_delay.max(1) as u64) as u32;
            self.held.push(Held {
                dest,
                head_len: msg.head.len(),
                long_offset: msg.long_offset,
                reply_to: msg.reply_to,
                bytes,
                after,
            });
            self.stats.delayed += 1;
            return Ok(());
        }
        tx.try_send(dest, msg)?;
        self.stats.sent += 1;
        if self.chance(self.config.duplicate) && tx.try_send(dest, msg).is_ok() {
            self.stats.duplicated += 1;
        }
        Ok(())
    }
}

struct FaultTx<'a> {
    tx: &'a mut dyn Tx,
    faults: &'a mut Faults,
}

impl Tx for FaultTx<'_> {
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.faults.send(self.tx, dest, msg)
    }
}

/// Wraps a transport and injects seeded faults into everything it sends.
pub struct FaultInjector<T> {
    inner: T,
    faults: Faults,
}

impl<T: Transport> FaultInjector<T> {
    /// Wraps `inner`.
    pub fn new(inner: T, config: FaultConfig) -> Self {
        FaultInjector {
            inner,
            faults: Faults {
                config,
                rng: FaultRng::new(config.seed),
                held: Vec::new(),
                stats: FaultStats::default(),
            },
        }
    }

    /// What was done so far.
    pub fn stats(&self) -> FaultStats {
        self.faults.stats
    }

    /// Messages held back, not yet sent.
    pub fn held(&self) -> usize {
        self.faults.held.len()
    }

    /// The wrapped transport.
    pub fn into_inner(self) -> T {
        self.inner
    }
}

impl<T: Transport> Tx for FaultInjector<T> {
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.faults.send(&mut self.inner, dest, msg)
    }
}

/// What it changes: receiving (held and reordered messages), sleeping and arming (never
/// while a message is held). RMA the NIC does itself is not messages: nothing to delay or
/// reorder, so it is forwarded with the rest.
impl<T: Transport> Transport for FaultInjector<T> {
    crate::forward_transport!(field inner; rank, size, info, segment, wake_fd, disarm, flush,
        stats, rma, registration, close);

    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        self.faults.release(&mut self.inner);
        let faults = &mut self.faults;
        self.inner.poll_recv(|d, segment, tx| {
            let mut tx = FaultTx { tx, faults };
            f(d, segment, &mut tx)
        })
    }
    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        if self.faults.held.is_empty() {
            self.inner.wait(timeout)
        } else {
            Ok(())
        }
    }
    /// Held messages go out on the next poll: never armed while any is held.
    fn arm(&mut self) -> Result<crate::transport::Armed, TransportError> {
        if self.faults.held.is_empty() {
            self.inner.arm()
        } else {
            Ok(crate::transport::Armed::Ready)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loopback::{Loopback, LoopbackConfig};

    fn drain(t: &mut impl Transport) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        while let Ok(Some(b)) = t.poll_recv(|d, _, _| d.bytes.to_vec()) {
            got.push(b);
        }
        got
    }

    fn run(config: FaultConfig) -> (Vec<Vec<u8>>, FaultStats) {
        let mut ts = Loopback::cluster(2, LoopbackConfig::default()).into_iter();
        let mut a = FaultInjector::new(ts.next().unwrap(), config);
        let mut b = ts.next().unwrap();
        for i in 0u32..200 {
            let head = i.to_le_bytes();
            a.try_send(
                1,
                &Outgoing {
                    head: &head,
                    payload: Payload::EMPTY,
                    long_offset: None,
                    reply_to: None,
                },
            )
            .unwrap();
        }
        // Flush what is held back.
        for _ in 0..(config.max_delay + 1) {
            let _ = a.poll_recv(|_, _, _| ());
        }
        (drain(&mut b), a.stats())
    }

    #[test]
    fn faults_happen_and_are_reproducible() {
        let config = FaultConfig {
            seed: 7,
            drop: 0.1,
            duplicate: 0.1,
            delay: 0.1,
            max_delay: 4,
        };
        let (got, stats) = run(config);
        assert!(stats.dropped > 0 && stats.duplicated > 0 && stats.delayed > 0);
        assert_eq!(got.len() as u64, 200 - stats.dropped + stats.duplicated);
        let order: Vec<u32> = got
            .iter()
            .map(|b| u32::from_le_bytes(b[..4].try_into().unwrap()))
            .collect();
        assert!(
            order.windows(2).any(|w| w[0] > w[1]),
            "something was reordered"
        );
        assert_eq!(run(config).0, got, "same seed, same faults");
    }

    #[test]
    fn no_faults_is_transparent() {
        let (got, stats) = run(FaultConfig::default());
        assert_eq!(got.len(), 200);
        assert_eq!(stats.sent, 200);
        let order: Vec<u32> = got
            .iter()
            .map(|b| u32::from_le_bytes(b[..4].try_into().unwrap()))
            .collect();
        assert_eq!(order, (0..200).collect::<Vec<_>>());
    }
}
