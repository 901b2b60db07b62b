//! Typed active messages ([`amnet::typed`]) over real transports: sci with two endpoints
//! per process (`run_job_endpoints`, ranks in separate processes) and udp on 127.0.0.1
//! (ranks as threads), blocking calls, handles and posts. The driver-by-driver cases are
//! am-core's (`crates/am-core/tests/typed.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use amnet::typed::{Am, AmContext, Shape};
use amnet::{Config, Handlers, JobOptions, Node, Transport, TransportKind};
use serde::{Deserialize, Serialize};
use transport_udp::{Udp, UdpConfig};

mod common;
use common::{on_threads, on_two_endpoints_per_process, within};

#[derive(Serialize, Deserialize, Shape, Debug, Clone, PartialEq)]
enum Op {
    Insert { key: String, value: Vec<u8> },
    Remove(String),
}

/// A batch of operations on a map: the target applies it to its shard and answers with
/// the shard's size and the keys it held before.
#[derive(Serialize, Deserialize, Shape, Debug, Clone, PartialEq)]
struct Batch(Vec<Op>);

impl Am for Batch {
    type Reply = (u64, Vec<String>);
    const SHAPE: u64 = <Self as Shape>::SHAPE;
    /// Applied to an empty shard (the registration below gives each rank its own).
    fn exec(self, _: &mut AmContext) -> Self::Reply {
        apply(&mut BTreeMap::new(), self)
    }
}

/// Applies `b` to `shard`: its size after, and the keys inserted that it held before.
fn apply(shard: &mut BTreeMap<String, Vec<u8>>, b: Batch) -> (u64, Vec<String>) {
    let mut before = Vec::new();
    for op in b.0 {
        match op {
            Op::Insert { key, value } => {
                if shard.insert(key.clone(), value).is_some() {
                    before.push(key);
                }
            }
            Op::Remove(key) => {
                shard.remove(&key);
            }
        }
    }
    (shard.len() as u64, before)
}

/// Posted: added to the target's counter.
#[derive(Serialize, Deserialize, Debug)]
struct Add(u64);

impl Am for Add {
    type Reply = ();
    fn exec(self, _: &mut AmContext) {}
}

/// Answered with its bytes reversed.
#[derive(Serialize, Deserialize, Debug)]
struct Mirror(Vec<u8>);

impl Am for Mirror {
    type Reply = Vec<u8>;
    fn exec(mut self, _: &mut AmContext) -> Vec<u8> {
        self.0.reverse();
        self.0
    }
}

fn batch(r: u32, i: u32) -> Batch {
    Batch(vec![
        Op::Insert {
            key: format!("{r}/{i}"),
            value: vec![r as u8; i as usize % 300],
        },
        Op::Remove(format!("{r}/{}", i.wrapping_sub(1))),
    ])
}

/// Every rank sends 50 batches to the next rank (its shard keeps one key per sender
/// afterwards: each batch inserts one and removes the one before), the last 10 as
/// handles, and posts 1..=10; then checks its own shard and counter.
fn rank<T: Transport + Send>(t: T) -> anyhow::Result<()> {
    let shard: Arc<std::sync::Mutex<BTreeMap<String, Vec<u8>>>> = Arc::default();
    let total = Arc::new(AtomicU64::new(0));
    let mut h = Handlers::new();
    let s = shard.clone();
    h.typed_with::<Batch>(move |b, _| apply(&mut s.lock().expect("shard"), b))?;
    let c = total.clone();
    h.typed_with::<Add>(move |a, _| {
        c.fetch_add(a.0, Ordering::Relaxed);
    })?;
    h.typed::<Mirror>()?;
    let mut node = Node::new(t, h, Config::default())?;
    let (me, n) = (node.rank(), node.size());
    let next = (me + 1) % n;
    for i in 0..40 {
        let (len, before) = node.call_typed(next, batch(me, i))?;
        anyhow::ensure!(
            before.is_empty() && len >= 1,
            "rank {me}: batch {i}: {len} {before:?}"
        );
    }
    let ops: Vec<_> = (40..50)
        .map(|i| node.call_typed_nb(next, batch(me, i)))
        .collect::<Result<_, _>>()?;
    node.wait_all(ops)?;
    // Larger than a Medium of either transport both ways, in parts, beside small calls.
    let big: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + me) as u8).collect();
    let far = node.call_typed_nb(next, Mirror(big.clone()))?;
    let near = node.call_typed_nb(next, batch(me, 50))?;
    let back = node.wait(far)?;
    anyhow::ensure!(back.iter().rev().eq(big.iter()), "rank {me}: mirror");
    node.wait(near)?;
    for i in 1..=10 {
        node.post_typed(next, Add(i))?;
    }
    node.barrier()?;
    let prev = (me + n - 1) % n;
    let s = shard.lock().expect("shard");
    anyhow::ensure!(
        s.len() == 1 && s.get(&format!("{prev}/50")) == Some(&vec![prev as u8; 50]),
        "rank {me}: shard {:?}",
        s.keys().collect::<Vec<_>>()
    );
    anyhow::ensure!(total.load(Ordering::Relaxed) == 55, "rank {me}: posts");
    drop(s);
    node.barrier()?;
    Ok(())
}

/// Catches a typed value that a shared-memory NIC's Medium path cuts or misplaces (a
/// `Vec` up to 300 bytes, strings, an enum; 100 kB in parts both ways), answers paired with the wrong call across two
/// endpoints of one process, and posts that are not run before the barrier after them.
#[test]
fn typed_messages_on_sci_two_endpoints_per_process_and_udp() {
    within(Duration::from_secs(120), || {
        let opts = JobOptions::new().transport(TransportKind::Sci).ranks(2);
        on_two_endpoints_per_process(&opts, rank);
        let udp = Udp::cluster(3, 64 << 10, UdpConfig::default()).expect("UDP cluster");
        on_threads("udp", udp, rank);
    });
}
