//! A key-value service on `async`/`await`: every rank keeps a shard of the table, and runs
//! client tasks that store keys on their owners and read them back with
//! [`amnet::AsyncNode::call`], many calls in flight at once, on a tokio `LocalSet` whose
//! driver ([`amnet::AsyncNode::drive`]) sleeps armed on the node's wake descriptor between
//! messages. Then every rank checks a sample of the whole table, measures what its idle node
//! costs (the driver asleep for `--idle-ms`), and rank 0 prints one JSON line.
//!
//! ```text
//! cargo run --release --example async_service -- --transport sci --clients 8
//! ```

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use amnet::{
    AsyncNode, Config, HandlerId, Handlers, JobOptions, Local, Node, Transport, TransportKind,
};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "A key-value service over async calls, one shard per rank")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Ranks
    #[arg(long, default_value_t = 2)]
    ranks: u32,
    /// Client tasks per rank
    #[arg(long, default_value_t = 8)]
    clients: u32,
    /// Keys each client stores (and reads back)
    #[arg(long, default_value_t = 500)]
    keys: u32,
    /// How long each rank stays idle, armed, while its CPU time is measured
    #[arg(long, default_value_t = 1000)]
    idle_ms: u64,
}

/// `STORE key value`: answers 1 if the key was new. `FETCH key`: answers 1 and the value,
/// or 0.
const STORE: HandlerId = HandlerId(1);
const FETCH: HandlerId = HandlerId(2);

type Shard = Rc<RefCell<HashMap<u64, Vec<u8>>>>;

fn handlers(shard: &Shard) -> anyhow::Result<Handlers<Local>> {
    let mut h = Handlers::local();
    let s = shard.clone();
    h.callable(STORE, "store", move |msg, call| {
        let [lo, hi, ..] = *msg.args() else { return };
        let new = s.borrow_mut().insert(key(lo, hi), msg.payload().to_vec());
        let _ = call.reply(&[u32::from(new.is_none())], &[]);
    })?;
    let s = shard.clone();
    h.callable(FETCH, "fetch", move |msg, call| {
        let [lo, hi, ..] = *msg.args() else { return };
        let _ = match s.borrow().get(&key(lo, hi)) {
            Some(v) => call.reply(&[1], v.as_slice()),
            None => call.reply(&[0], &[]),
        };
    })?;
    Ok(h)
}

fn key(lo: u32, hi: u32) -> u64 {
    u64::from(hi) << 32 | u64::from(lo)
}

/// Key `i` of client `c` of rank `r`, and the value stored under it.
fn kv(r: u32, c: u32, i: u32) -> (u64, Vec<u8>) {
    let k = (u64::from(r) << 40) | (u64::from(c) << 20) | u64::from(i);
    let v = format!("{r}/{c}/{i}").into_bytes();
    (k.wrapping_mul(0x9e37_79b9_7f4a_7c15), v)
}

/// Stores `key` on its owner (keys spread over the ranks by value) and returns whether it
/// was new there.
async fn store<T: Transport>(node: &AsyncNode<T, Local>, k: u64, v: &[u8]) -> anyhow::Result<bool> {
    let owner = (k % u64::from(node.size())) as u32;
    let r = node
        .call(owner, STORE, &[k as u32, (k >> 32) as u32], v)
        .await?;
    Ok(r.args == [1])
}

async fn fetch<T: Transport>(
    node: &AsyncNode<T, Local>,
    k: u64,
) -> anyhow::Result<Option<Vec<u8>>> {
    let owner = (k % u64::from(node.size())) as u32;
    let r = node
        .call(owner, FETCH, &[k as u32, (k >> 32) as u32], &[])
        .await?;
    Ok((r.args == [1]).then_some(r.payload))
}

/// CPU time of the calling thread (where the rank's runtime runs).
fn thread_cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let Ok(u) = getrusage(UsageWho::RUSAGE_THREAD) else {
        return Duration::ZERO;
    };
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    tv(u.user_time()) + tv(u.system_time())
}

#[tokio::main(flavor = "current_thread")]
async fn rank_main(t: amnet::AnyTransport, args: &Args) -> anyhow::Result<()> {
    let shard = Shard::default();
    let node = Node::new(t, handlers(&shard)?, Config::from_env()?)?;
    let node = AsyncNode::new(node);
    let (me, size) = (node.rank(), node.size());
    let local = tokio::task::LocalSet::new();
    local
        .run_until(async {
            let driver = tokio::task::spawn_local({
                let node = node.clone();
                async move { node.drive().await }
            });
            node.barrier().await?;
            let t0 = Instant::now();
            let clients: Vec<_> = (0..args.clients)
                .map(|c| {
                    let node = node.clone();
                    let keys = args.keys;
                    tokio::task::spawn_local(async move {
                        for i in 0..keys {
                            let (k, v) = kv(me, c, i);
                            anyhow::ensure!(store(&node, k, &v).await?, "key {k:#x} stored twice");
                            // Read back one key stored a while ago.
                            let (k, v) = kv(me, c, i / 2);
                            anyhow::ensure!(fetch(&node, k).await? == Some(v), "key {k:#x} lost");
                        }
                        Ok(())
                    })
                })
                .collect();
            for c in clients {
                c.await??;
            }
            let took = t0.elapsed();
            node.barrier().await?;
            // Every rank's keys, seen from here: a sample of each client's.
            for r in 0..size {
                for c in 0..args.clients {
                    for i in (0..args.keys).step_by(97) {
                        let (k, v) = kv(r, c, i);
                        anyhow::ensure!(fetch(&node, k).await? == Some(v), "rank {r}'s key {k:#x}");
                    }
                }
            }
            node.barrier().await?;
            // Idle: the driver sleeps armed; what this rank's thread uses meanwhile.
            let cpu0 = thread_cpu();
            let idle0 = Instant::now();
            tokio::time::sleep(Duration::from_millis(args.idle_ms)).await;
            let idle_cpu = thread_cpu().saturating_sub(cpu0).as_secs_f64()
                / idle0.elapsed().as_secs_f64();
            node.barrier().await?;
            let stored = shard.borrow().len();
            let calls = 2 * u64::from(args.clients) * u64::from(args.keys);
            if me == 0 {
                println!(
                    "{{\"transport\":\"{}\",\"ranks\":{size},\"clients\":{},\"calls\":{calls},\"calls_per_s\":{:.3e},\"shard_keys\":{stored},\"idle_cpu_percent\":{:.3}}}",
                    node.with(|n| n.transport().info().name),
                    args.clients,
                    calls as f64 / took.as_secs_f64(),
                    100.0 * idle_cpu
                );
            }
            node.stop();
            driver.await??;
            anyhow::Ok(())
        })
        .await
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(args.ranks)
        .prefix_output(false);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
