//! A distributed hash map in the Lamellar style: `insert`, `get` and `remove` as typed
//! messages carrying a batch of operations each, beside the same batching hand-written on
//! raw AM calls, measured in turn in the same job and checked against a local model.
//!
//! ```text
//! cargo run --release --example hashmap -- [--transport T] [--ranks N] [--ops N] [--batch N]
//!     [--window N] [--rounds N] [--raw | --typed] [--json]
//! ```
//!
//! Each rank owns a shard (a `HashMap<u64, u64>`) and the key `k` belongs to rank
//! `hash(k) % ranks`. Each rank runs three phases of `--ops` operations, every one of them a
//! message (to its own rank too):
//! - `insert`: its own keys, each with a value derived from the key's rank and index;
//! - `get`: keys drawn from its seeded generator among every rank's keys and as many again
//!   never inserted (a quarter of the inserted count), answered `Some(value)` or `None`;
//! - `remove`: its own keys, answered with the value each held.
//!
//! Operations are put in one bucket per owner; a full bucket (`--batch` operations, by
//! default as many as fit in the transport's largest AM Medium in either mode, at most 1024)
//! is sent as one call, with at most `--window` calls in flight, all waited for together
//! when the window is full. The two modes:
//! - `typed`: `Insert(Vec<(u64, u64)>)`, `Get(Vec<u64>)` and `Remove(Vec<u64>)`, typed
//!   messages whose code at the owner is a closure holding its shard (`Handlers::typed_with`),
//!   answered with `()`, `Vec<Option<u64>>` and `Vec<Option<u64>>`;
//! - `raw`: a callable handler per operation whose payload is the packed little-endian words
//!   (key, or key and value), answering a bitmap of which keys were present followed by a
//!   word per key.
//!
//! Without `--raw` or `--typed`, each of `--rounds` rounds runs raw then typed, and each
//! figure is the median over the rounds (after one round of each not counted), so that the
//! typed row's `ratio_to_raw` comes from one job. A figure is operations per second over the
//! whole job: `ranks × ops` over the time from the barrier before the phase to the barrier
//! after it.
//!
//! The check: keys are disjoint per rank (a rank's number in the high bits), so every rank
//! computes the whole map that the inserts build, and each phase's answers must equal it:
//! gets answer the inserted value or `None`, removes the inserted value, a get of every key
//! after the removes `None`, and each shard holds exactly the model's keys it owns after the
//! inserts and none after the removes. A mismatch ends the job with a non-zero status and a
//! message naming the key.
//!
//! Output: a table, or with `--json` one JSON object per line and per mode and operation:
//! `{"transport", "mode", "op", "ranks", "ops", "batch", "window", "rounds", "ops_per_s"}`,
//! and `ratio_to_raw` on typed rows when both modes ran. `--ranks N` starts N ranks (threads
//! on `loopback`, processes elsewhere); under `amrun`, `mpiexec` or `srun` each process is
//! one rank.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Instant;

use amnet::typed::{Am, AmContext, Shape};
use amnet::{
    AnyTransport, Config, HandlerId, Handlers, JobOptions, Local, Node, Op, Outcome, Rank, Reply,
    Transport, TransportKind,
};
use clap::Parser;
use serde::{Deserialize, Serialize};

#[derive(Parser, Debug)]
#[command(about = "A distributed hash map: typed messages beside raw AM calls, checked")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Ranks to start when not under a launcher
    #[arg(long, default_value_t = 2)]
    ranks: u32,
    /// Operations per rank and phase
    #[arg(long, default_value_t = 100_000)]
    ops: u64,
    /// Operations per message (default: as many as fit in an AM Medium, at most 1024)
    #[arg(long)]
    batch: Option<usize>,
    /// Calls in flight per rank
    #[arg(long, default_value_t = 8)]
    window: usize,
    /// Counted rounds of each mode
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// The raw mode only
    #[arg(long, conflicts_with = "typed")]
    raw: bool,
    /// The typed mode only
    #[arg(long)]
    typed: bool,
    /// One JSON object per line instead of a table
    #[arg(long)]
    json: bool,
    /// Test aid: rank 0 changes a value in its shard after the inserts (the check must fail)
    #[arg(long, hide = true)]
    spoil: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Raw,
    Typed,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Raw => "raw",
            Mode::Typed => "typed",
        }
    }
}

const PHASES: [&str; 3] = ["insert", "get", "remove"];

/// Inserts a batch of (key, value) pairs at their owner.
#[derive(Serialize, Deserialize, Shape)]
struct Insert(Vec<(u64, u64)>);

/// Looks up a batch of keys at their owner: the value of each, or `None`.
#[derive(Serialize, Deserialize, Shape)]
struct Get(Vec<u64>);

/// Removes a batch of keys at their owner: the value each held, or `None`.
#[derive(Serialize, Deserialize, Shape)]
struct Remove(Vec<u64>);

// The code that runs these is the closures `typed_with` registers, which hold the shard;
// `exec` is what a table registered with `typed` alone would run, which has no shard.
impl Am for Insert {
    type Reply = ();
    const SHAPE: u64 = <Self as Shape>::SHAPE;
    fn exec(self, _: &mut AmContext) {}
}

impl Am for Get {
    type Reply = Vec<Option<u64>>;
    const SHAPE: u64 = <Self as Shape>::SHAPE;
    fn exec(self, _: &mut AmContext) -> Vec<Option<u64>> {
        vec![None; self.0.len()]
    }
}

impl Am for Remove {
    type Reply = Vec<Option<u64>>;
    const SHAPE: u64 = <Self as Shape>::SHAPE;
    fn exec(self, _: &mut AmContext) -> Vec<Option<u64>> {
        vec![None; self.0.len()]
    }
}

const INSERT: HandlerId = HandlerId(1);
const GET: HandlerId = HandlerId(2);
const REMOVE: HandlerId = HandlerId(3);

/// Bytes of a `u64` on the typed wire (a fixed word), and of a sequence's length.
const WORD: usize = 8;
/// Bytes per operation of the largest message or answer of either mode at most: an
/// insert's pair of words, typed or raw (a get's or remove's answer takes 9 typed, an
/// `Option` tag and a word, and 8 and a bit raw).
const PER_OP_MAX: usize = 2 * WORD;
/// The default batch's cap, where the transport's Mediums are large.
const DEFAULT_BATCH_CAP: usize = 1024;

/// Keys hold their rank above this many bits, and a scrambled index below.
const INDEX_BITS: u32 = 40;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;

/// SplitMix64's finaliser: a hash of `x` whose every output bit depends on every input bit.
fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A bijection of the 40-bit indexes (odd multipliers and xor-shifts are each invertible
/// modulo 2^40): distinct indexes give distinct keys, spread over the owners.
fn scramble(mut i: u64) -> u64 {
    i = i.wrapping_mul(0x9e37_79b9_7f4b) & INDEX_MASK;
    i ^= i >> 21;
    i = i.wrapping_mul(0x3c6e_f372_fe95) & INDEX_MASK;
    i ^ (i >> 19)
}

/// The key of rank `rank`'s `i`th insert: distinct for distinct (rank, i).
fn key(rank: Rank, i: u64) -> u64 {
    u64::from(rank) << INDEX_BITS | scramble(i)
}

/// The value rank `rank`'s `i`th insert stores.
fn value(rank: Rank, i: u64) -> u64 {
    mix64(u64::from(rank) << INDEX_BITS ^ i ^ 0x5eed)
}

/// The rank that owns `key`.
fn owner(key: u64, size: u32) -> Rank {
    (mix64(key) % u64::from(size)) as Rank
}

/// Xorshift64*: the per-rank generator of the gets' keys, seeded by the rank alone so that
/// every run draws the same keys.
struct Rng(u64);

impl Rng {
    fn new(rank: Rank) -> Rng {
        Rng(mix64(u64::from(rank) ^ 0x6a09_e667_f3bc_c909) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The map every rank's inserts build, which every rank computes for itself.
fn model(size: u32, ops: u64) -> HashMap<u64, u64> {
    (0..size)
        .flat_map(|r| (0..ops).map(move |i| (key(r, i), value(r, i))))
        .collect()
}

/// The keys rank `rank` gets: any rank's, with an index among the inserted ones and a
/// quarter as many past them (never inserted).
fn get_keys(rank: Rank, size: u32, ops: u64) -> impl Iterator<Item = u64> {
    let mut rng = Rng::new(rank);
    let span = ops + ops / 4;
    (0..ops).map(move |_| {
        let r = (rng.next() % u64::from(size)) as Rank;
        key(r, rng.next() % span)
    })
}

fn word(b: &[u8]) -> u64 {
    u64::from_le_bytes(b.try_into().unwrap_or_default())
}

type Shard = Rc<RefCell<HashMap<u64, u64>>>;

/// The raw answer to a get or remove: a bitmap of the keys found (bit `i % 8` of byte
/// `i / 8` for key `i`), then one word per key (0 where not found).
fn pack_found(found: impl ExactSizeIterator<Item = Option<u64>>, out: &mut Vec<u8>) {
    let n = found.len();
    out.clear();
    out.resize(n.div_ceil(8), 0);
    for (i, v) in found.enumerate() {
        if v.is_some() {
            out[i / 8] |= 1 << (i % 8);
        }
        out.extend_from_slice(&v.unwrap_or(0).to_le_bytes());
    }
}

/// The found values of a raw answer for `n` keys, or why it is malformed.
fn unpack_found(n: usize, payload: &[u8]) -> anyhow::Result<Vec<Option<u64>>> {
    let bits = n.div_ceil(8);
    anyhow::ensure!(
        payload.len() == bits + 8 * n,
        "a raw answer of {} bytes for {n} keys",
        payload.len()
    );
    let (map, words) = payload.split_at(bits);
    Ok(words
        .chunks_exact(8)
        .enumerate()
        .map(|(i, w)| (map[i / 8] >> (i % 8) & 1 == 1).then(|| word(w)))
        .collect())
}

/// The handlers of both modes, all on the same shard.
fn handlers(shard: &Shard) -> anyhow::Result<Handlers<Local>> {
    let mut h = Handlers::local();
    let s = shard.clone();
    h.callable(INSERT, "insert", move |msg, call| {
        let mut m = s.borrow_mut();
        for pair in msg.payload().chunks_exact(16) {
            m.insert(word(&pair[..8]), word(&pair[8..]));
        }
        drop(m);
        let _ = call.reply(&[], &[]);
    })?;
    let (s, mut out) = (shard.clone(), Vec::new());
    h.callable(GET, "get", move |msg, call| {
        let m = s.borrow();
        let keys = msg.payload().chunks_exact(8);
        pack_found(keys.map(|k| m.get(&word(k)).copied()), &mut out);
        drop(m);
        let _ = call.reply(&[], &out);
    })?;
    let (s, mut out) = (shard.clone(), Vec::new());
    h.callable(REMOVE, "remove", move |msg, call| {
        let mut m = s.borrow_mut();
        let keys = msg.payload().chunks_exact(8);
        pack_found(keys.map(|k| m.remove(&word(k))), &mut out);
        drop(m);
        let _ = call.reply(&[], &out);
    })?;
    let s = shard.clone();
    h.typed_with::<Insert>(move |Insert(pairs), _| s.borrow_mut().extend(pairs))?;
    let s = shard.clone();
    h.typed_with::<Get>(move |Get(keys), _| {
        let m = s.borrow();
        keys.iter().map(|k| m.get(k).copied()).collect()
    })?;
    let s = shard.clone();
    h.typed_with::<Remove>(move |Remove(keys), _| {
        let mut m = s.borrow_mut();
        keys.iter().map(|k| m.remove(k)).collect()
    })?;
    Ok(h)
}

type N = Node<AnyTransport, Local>;

/// How a phase sends: `batch` operations per message, `window` messages in flight.
#[derive(Clone, Copy)]
struct Batching {
    batch: usize,
    window: usize,
}

/// What a phase sent and was answered: each batch with its answers (none for inserts).
type Answers<T> = Vec<(Vec<T>, Vec<Option<u64>>)>;

/// Runs one phase: buckets `items` by `owner`, sends a full bucket with `send` (which gives
/// back the batch, kept for the check), waits for the whole window when it is full, and
/// turns each answer into found values with `finish`.
fn phase<T, U: Outcome>(
    node: &mut N,
    batching: Batching,
    items: impl Iterator<Item = T>,
    owner: impl Fn(&T) -> Rank,
    mut send: impl FnMut(&mut N, Rank, Vec<T>) -> anyhow::Result<(Op<U>, Vec<T>)>,
    mut finish: impl FnMut(&[T], U::Value) -> anyhow::Result<Vec<Option<u64>>>,
) -> anyhow::Result<Answers<T>> {
    let size = node.size() as usize;
    let mut buckets: Vec<Vec<T>> = (0..size)
        .map(|_| Vec::with_capacity(batching.batch))
        .collect();
    let mut ops = Vec::with_capacity(batching.window);
    let mut sent = Vec::with_capacity(batching.window);
    let mut done = Vec::new();
    let mut drain = |node: &mut N, ops: &mut Vec<Op<U>>, sent: &mut Vec<Vec<T>>| {
        for (batch, v) in sent.drain(..).zip(node.wait_all(ops.drain(..))?) {
            let found = finish(&batch, v)?;
            done.push((batch, found));
        }
        anyhow::Ok(())
    };
    for item in items {
        let dest = owner(&item);
        let bucket = &mut buckets[dest as usize];
        bucket.push(item);
        if bucket.len() == batching.batch {
            let full = std::mem::replace(bucket, Vec::with_capacity(batching.batch));
            if ops.len() == batching.window {
                drain(node, &mut ops, &mut sent)?;
            }
            let (op, batch) = send(node, dest, full)?;
            ops.push(op);
            sent.push(batch);
        }
    }
    for (dest, bucket) in buckets.into_iter().enumerate() {
        if bucket.is_empty() {
            continue;
        }
        if ops.len() == batching.window {
            drain(node, &mut ops, &mut sent)?;
        }
        let (op, batch) = send(node, dest as Rank, bucket)?;
        ops.push(op);
        sent.push(batch);
    }
    drain(node, &mut ops, &mut sent)?;
    Ok(done)
}

/// Inserts this rank's keys.
fn insert(node: &mut N, mode: Mode, batching: Batching, ops: u64) -> anyhow::Result<()> {
    let (me, size) = (node.rank(), node.size());
    let items = (0..ops).map(|i| (key(me, i), value(me, i)));
    let by_owner = |&(k, _): &(u64, u64)| owner(k, size);
    match mode {
        Mode::Raw => {
            let mut bytes = Vec::with_capacity(16 * batching.batch);
            phase(
                node,
                batching,
                items,
                by_owner,
                |node, dest, pairs| {
                    bytes.clear();
                    for &(k, v) in &pairs {
                        bytes.extend_from_slice(&k.to_le_bytes());
                        bytes.extend_from_slice(&v.to_le_bytes());
                    }
                    Ok((node.call_nb(dest, INSERT, &[], &bytes)?, pairs))
                },
                |_, _: Reply| Ok(Vec::new()),
            )?;
        }
        Mode::Typed => {
            phase(
                node,
                batching,
                items,
                by_owner,
                |node, dest, pairs| Ok((node.call_typed_nb(dest, Insert(pairs))?, Vec::new())),
                |_, ()| Ok(Vec::new()),
            )?;
        }
    }
    Ok(())
}

/// Gets or removes `keys` (`handler` and `typed` name the operation): each batch with what
/// its owner answered.
fn lookup<M: Am<Reply = Vec<Option<u64>>>>(
    node: &mut N,
    mode: Mode,
    batching: Batching,
    keys: impl Iterator<Item = u64>,
    handler: HandlerId,
    typed: impl Fn(Vec<u64>) -> M,
) -> anyhow::Result<Answers<u64>> {
    let size = node.size();
    let by_owner = |&k: &u64| owner(k, size);
    match mode {
        Mode::Raw => {
            let mut bytes = Vec::with_capacity(8 * batching.batch);
            phase(
                node,
                batching,
                keys,
                by_owner,
                |node, dest, keys| {
                    bytes.clear();
                    for k in &keys {
                        bytes.extend_from_slice(&k.to_le_bytes());
                    }
                    Ok((node.call_nb(dest, handler, &[], &bytes)?, keys))
                },
                |keys, r: Reply| unpack_found(keys.len(), &r.payload),
            )
        }
        Mode::Typed => phase(
            node,
            batching,
            keys,
            by_owner,
            |node, dest, keys| Ok((node.call_typed_nb(dest, typed(keys.clone()))?, keys)),
            |_, found| Ok(found),
        ),
    }
}

/// Checks a phase's answers: each key's against `want(key)`.
fn check(
    what: &str,
    mode: Mode,
    answers: &Answers<u64>,
    want: impl Fn(u64) -> Option<u64>,
) -> anyhow::Result<()> {
    for (keys, found) in answers {
        anyhow::ensure!(
            keys.len() == found.len(),
            "{} {what}: {} answers for {} keys",
            mode.name(),
            found.len(),
            keys.len()
        );
        for (&k, &got) in keys.iter().zip(found) {
            let want = want(k);
            anyhow::ensure!(
                got == want,
                "{} {what}: key {k:#x} answered {got:?}, the model says {want:?}",
                mode.name()
            );
        }
    }
    Ok(())
}

/// Seconds each phase took, in `PHASES` order.
type Times = [f64; 3];

/// One round of `mode`: the three timed phases, each checked against `model` after its
/// closing barrier, and the untimed final get. `mine` is how many of the model's keys this
/// rank owns.
fn round(
    node: &mut N,
    shard: &Shard,
    model: &HashMap<u64, u64>,
    mine: usize,
    mode: Mode,
    batching: Batching,
    args: &Args,
) -> anyhow::Result<Times> {
    let (me, size, ops) = (node.rank(), node.size(), args.ops);
    let mut times = [0.0; 3];
    node.barrier()?;
    let t0 = Instant::now();
    insert(node, mode, batching, ops)?;
    node.barrier()?;
    times[0] = t0.elapsed().as_secs_f64();
    let held = shard.borrow().len();
    anyhow::ensure!(
        held == mine,
        "{} insert: rank {me} holds {held} keys, the model gives it {mine}",
        mode.name()
    );
    if args.spoil && me == 0 {
        if let Some(v) = shard.borrow_mut().values_mut().next() {
            *v ^= 1;
        }
    }
    node.barrier()?;

    let t0 = Instant::now();
    let got = lookup(node, mode, batching, get_keys(me, size, ops), GET, Get)?;
    node.barrier()?;
    times[1] = t0.elapsed().as_secs_f64();
    check("get", mode, &got, |k| model.get(&k).copied())?;
    drop(got);

    let t0 = Instant::now();
    let own = (0..ops).map(|i| key(me, i));
    let removed = lookup(node, mode, batching, own, REMOVE, Remove)?;
    node.barrier()?;
    times[2] = t0.elapsed().as_secs_f64();
    check("remove", mode, &removed, |k| model.get(&k).copied())?;
    drop(removed);

    let own = (0..ops).map(|i| key(me, i));
    let after = lookup(node, mode, batching, own, GET, Get)?;
    check("get after remove", mode, &after, |_| None)?;
    node.barrier()?;
    let left = shard.borrow().len();
    anyhow::ensure!(
        left == 0,
        "{} remove: rank {me} still holds {left} keys",
        mode.name()
    );
    Ok(times)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn rank_main(transport: AnyTransport, args: &Args) -> anyhow::Result<()> {
    let name = transport.info().name;
    let size = transport.size();
    anyhow::ensure!(
        size < 1 << (64 - INDEX_BITS) && args.ops + args.ops / 4 <= INDEX_MASK,
        "too many ranks or operations for the keys' layout"
    );
    let shard: Shard = Rc::default();
    let mut node: N = Node::new(
        transport,
        handlers(&shard)?,
        Config::from_env_for_ranks(size)?,
    )?;
    // Every message and answer of either mode fits in one Medium: a sequence's length and
    // `PER_OP_MAX` bytes per operation.
    let fits = node.max_medium().saturating_sub(WORD) / PER_OP_MAX;
    let batch = match args.batch {
        Some(b) => {
            anyhow::ensure!(
                (1..=fits).contains(&b),
                "--batch {b}: 1 to {fits} operations fit in a Medium on {name}"
            );
            b
        }
        None => fits.min(DEFAULT_BATCH_CAP),
    };
    let batching = Batching {
        batch,
        window: args.window,
    };
    let model = model(size, args.ops);
    let mine = model
        .keys()
        .filter(|&&k| owner(k, size) == node.rank())
        .count();
    let modes: &[Mode] = match (args.raw, args.typed) {
        (true, _) => &[Mode::Raw],
        (_, true) => &[Mode::Typed],
        _ => &[Mode::Raw, Mode::Typed],
    };
    let mut times: Vec<Vec<Times>> = vec![Vec::new(); modes.len()];
    // Round 0 warms both modes up (the shards' tables grown, the first messages' costs
    // paid) and is not counted.
    for r in 0..=args.rounds {
        for (m, &mode) in modes.iter().enumerate() {
            let t = round(&mut node, &shard, &model, mine, mode, batching, args)?;
            if r > 0 {
                times[m].push(t);
            }
        }
    }
    node.barrier()?;
    if node.rank() != 0 {
        return Ok(());
    }
    let total = (u64::from(size) * args.ops) as f64;
    let rate = |m: usize, p: usize| total / median(times[m].iter().map(|t| t[p]).collect());
    for (p, op) in PHASES.iter().enumerate() {
        for (m, &mode) in modes.iter().enumerate() {
            let ops_per_s = rate(m, p);
            let ratio = (mode == Mode::Typed && modes.len() == 2).then(|| ops_per_s / rate(0, p));
            if args.json {
                let mut row = serde_json::json!({"transport": name, "mode": mode.name(),
                    "op": op, "ranks": size, "ops": args.ops, "batch": batch,
                    "window": args.window, "rounds": args.rounds, "ops_per_s": ops_per_s});
                if let Some(ratio) = ratio {
                    row["ratio_to_raw"] = ratio.into();
                }
                println!("{row}");
            } else {
                let ratio = ratio.map(|x| format!("  x{x:.2}")).unwrap_or_default();
                println!(
                    "{name:<9} {:<5} {op:<6} {size} ranks  batch {batch:>4}  {:>12.0} ops/s{ratio}",
                    mode.name(),
                    ops_per_s
                );
            }
        }
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(args.ops > 0, "--ops must be at least 1");
    anyhow::ensure!(args.window > 0, "--window must be at least 1");
    anyhow::ensure!(args.rounds > 0, "--rounds must be at least 1");
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(args.ranks)
        .prefix_output(!args.json);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
