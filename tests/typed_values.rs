//! Typed active messages ([`amnet::typed`]) with arbitrary serde values over real
//! transports (issue 57): proptest-generated values (nested and recursive enums, strings of
//! any code point, maps, options, floats, and vectors from empty to many Mediums long, with
//! sizes on both sides of each multiple of the transport's largest Medium) round trip on sci
//! (a shared-memory NIC whose Medium is 936 bytes; 2 processes of 2 endpoints) and udp
//! (64 KiB Mediums, ranks as threads), with blocking calls, handles in flight together and
//! the async driver; and forged messages to the reserved typed handlers are refused or
//! dropped, after which the job goes on.
//!
//! One process launch covers many cases: every rank generates the same values from a fixed
//! seed (a proptest `TestRunner` seeded per sender), so a target knows what each sender meant
//! to send and checks what came, and the sender checks the answer against a local model of the
//! target's transformation.
//!
//! The sci job re-runs this test binary as each of its processes (with the same arguments),
//! so the other tests here do nothing in a process of a job (`JobInfo::is_launched`), and
//! this file holds a single sci job.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use amnet::future::block_on;
use amnet::typed::{encoded_len, type_id, Am, AmContext, Shape};
use amnet::{
    run_ranks, AsyncNode, Config, HandlerId, Handlers, JobOptions, Node, Transport, TransportKind,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
use serde::{Deserialize, Serialize};
use transport_udp::{Udp, UdpConfig};

mod common;
use common::within;

const PER_PROCESS: u32 = 2;
/// Values each rank sends with the blocking driver (calls, then handles in flight
/// together), and then with the async driver.
const BLOCKING: u32 = 32;
const ASYNC: u32 = 16;
/// The seed every rank derives a sender's values from (with the sender's rank).
const SEED: u64 = 0x5eed_0057_7e57_da7a;

/// A recursive enum of every variant kind.
#[derive(Serialize, Deserialize, Shape, Debug, Clone, PartialEq)]
enum Tree {
    Leaf,
    Pair(i64, String),
    Node {
        label: String,
        kids: Vec<Tree>,
        weight: Option<f64>,
    },
    Boxed(Box<Tree>),
}

/// An arbitrary value: `case` says which of its sender's values it is.
#[derive(Serialize, Deserialize, Shape, Debug, Clone, PartialEq)]
struct Value {
    case: u32,
    tree: Tree,
    name: String,
    map: BTreeMap<String, Vec<u8>>,
    maybe: Option<(u32, char)>,
    ratio: f64,
    words: Vec<u64>,
    bytes: Vec<u8>,
}

/// Answered with the sender's rank, whether the value is the one the sender generated for
/// its case (the target regenerates it), and the value transformed ([`transform`]).
#[derive(Serialize, Deserialize, Shape, Debug, Clone, PartialEq)]
struct Echo(Value);

impl Am for Echo {
    type Reply = (u32, bool, Value);
    const SHAPE: u64 = <Self as Shape>::SHAPE;
    /// Registered with the model that checks it ([`handlers`]); this one cannot check.
    fn exec(self, cx: &mut AmContext) -> Self::Reply {
        (cx.src(), false, transform(self.0))
    }
}

/// A small value for the forged messages: the sum of its words (wrapping).
#[derive(Serialize, Deserialize, Shape, Debug, Clone, PartialEq)]
struct Sum(Vec<u64>);

impl Am for Sum {
    type Reply = u64;
    const SHAPE: u64 = <Self as Shape>::SHAPE;
    fn exec(self, _: &mut AmContext) -> u64 {
        self.0.iter().fold(0, |a, &b| a.wrapping_add(b))
    }
}

/// Posted: added to the target's counter ([`handlers`]).
#[derive(Serialize, Deserialize, Shape, Debug, Clone, PartialEq)]
struct Add(u64);

impl Am for Add {
    type Reply = ();
    const SHAPE: u64 = <Self as Shape>::SHAPE;
    fn exec(self, _: &mut AmContext) {}
}

/// The target's transformation, which the sender models: every sequence reversed, the
/// tree mirrored.
fn transform(mut v: Value) -> Value {
    v.words.reverse();
    v.bytes.reverse();
    for b in v.map.values_mut() {
        b.reverse();
    }
    v.name = v.name.chars().rev().collect();
    v.tree = mirror(v.tree);
    v
}

fn mirror(t: Tree) -> Tree {
    match t {
        Tree::Node {
            label,
            kids,
            weight,
        } => Tree::Node {
            label,
            kids: kids.into_iter().rev().map(mirror).collect(),
            weight,
        },
        Tree::Boxed(b) => Tree::Boxed(Box::new(mirror(*b))),
        other => other,
    }
}

/// A float that compares equal to itself.
fn float() -> impl Strategy<Value = f64> {
    any::<f64>().prop_map(|f| if f.is_nan() { -0.0 } else { f })
}

/// Any code point, newlines too.
fn text() -> impl Strategy<Value = String> {
    "(?s).{0,10}"
}

fn tree() -> impl Strategy<Value = Tree> {
    let leaf = prop_oneof![
        Just(Tree::Leaf),
        (any::<i64>(), text()).prop_map(|(n, s)| Tree::Pair(n, s)),
    ];
    leaf.prop_recursive(4, 16, 3, |inner| {
        prop_oneof![
            (
                text(),
                prop::collection::vec(inner.clone(), 0..3),
                prop::option::of(float()),
            )
                .prop_map(|(label, kids, weight)| Tree::Node {
                    label,
                    kids,
                    weight,
                }),
            inner.prop_map(|t| Tree::Boxed(Box::new(t))),
        ]
    })
}

/// The encoded sizes of the boundary cases: each side of the first multiples of the Medium,
/// for the value (a call) and for its answer, which is two bytes longer (the sender's rank
/// and a flag, one byte each).
fn boundaries(max: usize) -> Vec<usize> {
    let mut b = vec![1, 64];
    for k in 1..=3 {
        b.extend((k * max - 3)..=(k * max + 1));
    }
    b
}

/// The generated parts of a value, before it is sized: the last are a seed for its bulk
/// and, for a bulk value, the lengths of its words and bytes (in thousandths of the limit).
type Spec = (
    (Tree, String, BTreeMap<String, Vec<u8>>, Option<(u32, char)>),
    (f64, Vec<u64>, u64, (u32, u32)),
);

fn spec() -> impl Strategy<Value = Spec> {
    let size = (0..1000u32, 0..1000u32);
    (
        (
            tree(),
            text(),
            prop::collection::btree_map(text(), prop::collection::vec(any::<u8>(), 0..24), 0..4),
            prop::option::of((any::<u32>(), any::<char>())),
        ),
        (
            float(),
            prop::collection::vec(any::<u64>(), 0..12),
            any::<u64>(),
            size,
        ),
    )
}

/// splitmix64: the bulk of a large value, cheap to make in a debug build.
fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d4_9b2a_2e1d_3a4d);
    z ^ (z >> 31)
}

fn len(v: &Value) -> usize {
    encoded_len(v).expect("encodable")
}

/// The typed wire format (`am_core::typed`'s): bincode's, integers and lengths as
/// fixed-width little-endian words.
const WIRE: bincode::config::Configuration<bincode::config::LittleEndian, bincode::config::Fixint> =
    bincode::config::standard().with_fixed_int_encoding();

/// `v` in the wire format, as a sender's `amnet` writes it.
fn wire<T: Serialize>(v: &T) -> Vec<u8> {
    bincode::serde::encode_to_vec(v, WIRE).expect("encodable")
}

/// The value all of `bytes` hold in the wire format.
fn unwire<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> anyhow::Result<T> {
    let (v, read) = bincode::serde::decode_from_slice(bytes, WIRE)?;
    anyhow::ensure!(
        read == bytes.len(),
        "{} bytes left over",
        bytes.len() - read
    );
    Ok(v)
}

/// Makes `v` exactly `target` bytes encoded: drops its variable parts while it is larger,
/// then pads its bytes (their length is a fixed word: `n` more bytes are `n` more encoded).
fn fit(mut v: Value, target: usize, seed: &mut u64) -> Value {
    fn drop_one(v: &mut Value) -> bool {
        if !v.words.is_empty() {
            v.words.clear()
        } else if !v.map.is_empty() {
            v.map.clear()
        } else if v.tree != Tree::Leaf {
            v.tree = Tree::Leaf
        } else if !v.name.is_empty() {
            v.name.clear()
        } else if v.maybe.is_some() {
            v.maybe = None
        } else {
            return false;
        }
        true
    }
    while len(&v) > target && drop_one(&mut v) {}
    let n = target.saturating_sub(len(&v));
    v.bytes = (0..n).map(|_| mix(seed) as u8).collect();
    v
}

/// The values sender `rank` sends to a transport of Mediums of `max` bytes, generated from
/// [`SEED`]: the same on every rank. Even cases are sized to the boundaries in turn
/// ([`boundaries`]), odd ones are bulk, up to about `limit` bytes.
fn cases(rank: u32, max: usize, limit: usize) -> Vec<Value> {
    let seed = SEED ^ u64::from(rank).wrapping_mul(0x100_0000_01b3);
    let mut bytes = [0u8; 32];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (seed >> (8 * (i % 8))) as u8 ^ i as u8;
    }
    let mut runner = TestRunner::new_with_rng(
        ProptestConfig::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &bytes),
    );
    let strategy = spec();
    let sizes = boundaries(max);
    (0..BLOCKING + ASYNC)
        .map(|case| {
            let ((tree, name, map, maybe), (ratio, words, mut bulk, (w, b))) =
                strategy.new_tree(&mut runner).expect("a value").current();
            let v = Value {
                case,
                tree,
                name,
                map,
                maybe,
                ratio,
                words,
                bytes: Vec::new(),
            };
            if case % 2 == 0 {
                return fit(v, sizes[(case / 2) as usize % sizes.len()], &mut bulk);
            }
            // Words of 8 bytes each: at most 0.4 of the limit.
            let mut v = v;
            let n = limit * w as usize / 1000 / 20;
            v.words
                .extend((0..n).map(|_| mix(&mut bulk) >> (mix(&mut bulk) % 64)));
            let n = limit * b as usize / 1000 / 2;
            v.bytes = (0..n).map(|_| mix(&mut bulk) as u8).collect();
            v
        })
        .collect()
}

/// Every sender's values, as each rank of a job of `size` ranks generates them.
struct Model {
    max: usize,
    by_sender: Vec<Vec<Value>>,
}

impl Model {
    fn new(size: u32, max: usize, limit: usize) -> Self {
        let by_sender: Vec<_> = (0..size).map(|r| cases(r, max, limit)).collect();
        let m = Model { max, by_sender };
        m.check_coverage();
        m
    }

    /// The premise of the round trips: values that fit one Medium and values that need
    /// parts, values and answers exactly at each side of the Medium, and some more than
    /// three Mediums long.
    fn check_coverage(&self) {
        let max = self.max;
        let lens: Vec<usize> = self.by_sender.iter().flatten().map(len).collect();
        let fits = lens.iter().filter(|&&l| l <= max).count();
        let exact = [max - 2, max - 1, max, max + 1];
        for e in exact {
            assert!(lens.contains(&e), "no value of {e} bytes (Medium {max})");
        }
        assert!(
            fits > 0 && lens.iter().any(|&l| l > 3 * max),
            "sizes {lens:?} (Medium {max})"
        );
    }

    fn case(&self, sender: u32, case: u32) -> Option<&Value> {
        self.by_sender.get(sender as usize)?.get(case as usize)
    }
}

/// The reserved typed handlers of a table, by name.
#[derive(Clone, Copy, Debug)]
struct Reserved {
    call: HandlerId,
    post: HandlerId,
    part: HandlerId,
    answer: HandlerId,
}

fn reserved(h: &Handlers) -> Reserved {
    let find = |name: &str| {
        (0..=255u8)
            .map(HandlerId)
            .find(|&id| h.info(id).is_some_and(|i| i.name == name))
            .unwrap_or_else(|| panic!("no handler {name:?}"))
    };
    Reserved {
        call: find("amnet: typed call"),
        post: find("amnet: typed post"),
        part: find("amnet: typed part"),
        answer: find("amnet: typed answer"),
    }
}

/// The rank's table: `Echo` checked against the model, `Sum`, and `Add` into `total`.
fn handlers(model: Arc<Model>, total: Arc<AtomicU64>) -> anyhow::Result<(Handlers, Reserved)> {
    let mut h = Handlers::new();
    h.typed_with::<Echo>(move |Echo(v), cx| {
        let intact = model.case(cx.src(), v.case) == Some(&v);
        (cx.src(), intact, transform(v))
    })?;
    h.typed::<Sum>()?;
    h.typed_with::<Add>(move |a, _| {
        total.fetch_add(a.0, Ordering::Relaxed);
    })?;
    let r = reserved(&h);
    Ok((h, r))
}

/// Checks an answer to rank `me`'s value `v`.
fn check(me: u32, v: &Value, answer: (u32, bool, Value)) -> anyhow::Result<()> {
    let (src, intact, back) = answer;
    anyhow::ensure!(
        src == me && intact,
        "rank {me}: case {} ({} bytes): src {src}, intact {intact}",
        v.case,
        len(v)
    );
    anyhow::ensure!(
        back == transform(v.clone()),
        "rank {me}: case {} ({} bytes): the answer is not the value transformed",
        v.case,
        len(v)
    );
    Ok(())
}

/// Round trips of this rank's values: the first half one blocking call at a time to the
/// next rank, the rest as handles 8 in flight together to the next rank, itself and the
/// one before; then [`forge`]; then the async values to the next rank on the async
/// driver, after two large calls given up, calls and handles in flight together.
fn rank<T: Transport + Send + 'static>(t: T, model: Arc<Model>) -> anyhow::Result<()> {
    let total = Arc::new(AtomicU64::new(0));
    let (h, reserved) = handlers(model.clone(), total.clone())?;
    let mut node = Node::new(t, h, Config::default())?;
    let (me, n) = (node.rank(), node.size());
    anyhow::ensure!(node.max_medium() == model.max, "the model's Medium");
    let next = (me + 1) % n;
    let mine = &model.by_sender[me as usize];
    let (blocking, later) = mine.split_at(BLOCKING as usize);
    let (one, batched) = blocking.split_at(BLOCKING as usize / 2);
    for v in one {
        let answer = node.call_typed(next, Echo(v.clone()))?;
        check(me, v, answer)?;
    }
    // To the next rank, this one and the one before, in turn: values and answers in
    // parts both ways on a pair at once, and to itself.
    let prev = (me + n - 1) % n;
    for chunk in batched.chunks(8) {
        let ops = chunk
            .iter()
            .enumerate()
            .map(|(i, v)| node.call_typed_nb([next, me, prev][i % 3], Echo(v.clone())))
            .collect::<Result<Vec<_>, _>>()?;
        for (v, answer) in chunk.iter().zip(node.wait_all(ops)?) {
            check(me, v, answer)?;
        }
    }
    node.barrier()?;
    forge(&mut node, reserved, &total)?;
    let node = AsyncNode::new(node);
    block_on(&node, async {
        // Calls given up while their values (and answers) in parts are under way: their
        // late answers are dropped, not paired with the calls after them.
        for v in later.iter().filter(|v| len(v) > model.max).take(2) {
            drop(node.call_typed_nb(next, Echo(v.clone())).await?);
        }
        let (calls, handles) = later.split_at(later.len() / 2);
        let ops = {
            let mut ops = Vec::new();
            for v in handles {
                ops.push(node.call_typed_nb(next, Echo(v.clone())).await?);
            }
            ops
        };
        let futures: Vec<_> = calls
            .iter()
            .map(|v| node.call_typed(next, Echo(v.clone())))
            .collect();
        for (v, f) in calls.iter().zip(futures) {
            check(me, v, f.await?)?;
        }
        for (v, answer) in handles.iter().zip(node.wait_all(ops).await?) {
            check(me, v, answer)?;
        }
        node.barrier().await?;
        Ok::<(), anyhow::Error>(())
    })?;
    Ok(())
}

/// Status words of a typed call's answer.
const OK: u32 = 0;
const UNKNOWN: u32 = 1;
const UNDECODABLE: u32 = 2;
const TOO_LARGE: u32 = 4;
const UNREACHABLE: u32 = 6;
/// The last argument of a value moved by rendezvous (its descriptor).
const RENDEZVOUS: u32 = u32::MAX;

/// Stream numbers of forged parts: far from the ones this rank's own values use (counted
/// from 0), so that no forged leftover could join a real value's parts.
const FORGED_STREAM: u32 = 0xf0_0000;

/// Forged messages from this rank to the next to each reserved typed handler; each call is
/// refused with the status it should be, each forged post, part and answer is dropped
/// without running anything, and the typed calls and posts after them work.
fn forge<T: Transport>(node: &mut Node<T>, r: Reserved, total: &AtomicU64) -> anyhow::Result<()> {
    let me = node.rank();
    let next = (me + 1) % node.size();
    let words = |id: u64| [id as u32, (id >> 32) as u32];
    let sum = words(type_id::<Sum>());
    let add = words(type_id::<Add>());
    let good = wire(&Sum(vec![1, 300, 70_000, u64::MAX]));
    let sum_of = 1u64
        .wrapping_add(300)
        .wrapping_add(70_000)
        .wrapping_add(u64::MAX);
    let s = FORGED_STREAM + 16 * me;
    let with = |w: [u32; 2], stream: u32| [w[0], w[1], stream];
    let u64s = |w: &[u64]| w.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
    // A `Vec` that says it holds 2^62 elements, then a few.
    let bomb = u64s(&[1 << 62, 1, 2, 3]);
    // A `Vec` of 1000 elements with 3 present.
    let short_vec = u64s(&[1000, 1, 2, 3]);
    let trailing = [good.clone(), vec![0]].concat();
    let mut calls: Vec<(&str, Vec<u32>, Vec<u8>, u32)> = vec![
        ("a whole value", sum.to_vec(), good.clone(), OK),
        (
            "cut short",
            sum.to_vec(),
            good[..good.len() - 1].to_vec(),
            UNDECODABLE,
        ),
        ("cut to nothing", sum.to_vec(), Vec::new(), UNDECODABLE),
        (
            "trailing bytes",
            sum.to_vec(),
            trailing.clone(),
            UNDECODABLE,
        ),
        (
            "unknown type",
            vec![sum[0] ^ 1, sum[1]],
            good.clone(),
            UNKNOWN,
        ),
        (
            "unknown type, high word",
            vec![sum[0], !sum[1]],
            good.clone(),
            UNKNOWN,
        ),
        ("a length of 2^62", sum.to_vec(), bomb.to_vec(), UNDECODABLE),
        (
            "a length past the payload",
            sum.to_vec(),
            short_vec.to_vec(),
            UNDECODABLE,
        ),
        ("no arguments", Vec::new(), good.clone(), UNDECODABLE),
        ("one argument", sum[..1].to_vec(), good.clone(), UNDECODABLE),
        (
            "four arguments",
            vec![sum[0], sum[1], s, 0],
            good.clone(),
            UNDECODABLE,
        ),
        (
            "a last piece of no parts",
            with(sum, s + 1).to_vec(),
            good.clone(),
            UNDECODABLE,
        ),
    ];
    // Bytes of the right length that break a rule of the type: an enum's variant past
    // its last (in the low byte of its word, and in a high byte, which a decoder reading
    // one byte would miss), a string that is not UTF-8, an `Option` tag other than 0 or 1,
    // a string's length of 2^62; a value cut inside a word; and the control, the value
    // itself (it runs, not as a case of the model).
    let echo = words(type_id::<Echo>());
    let small = Value {
        case: 0,
        tree: Tree::Leaf,
        name: "ab".into(),
        map: BTreeMap::new(),
        maybe: None,
        ratio: 0.0,
        words: Vec::new(),
        bytes: Vec::new(),
    };
    let valid = wire(&Echo(small));
    // `case` (a u32 word), the tree's variant (a u32 word), the name's length (a u64 word)
    // and bytes, the map's length (a u64 word), the option's tag (a byte).
    let layout = [
        [0; 4].as_slice(),
        &[0; 4],
        &2u64.to_le_bytes(),
        b"ab",
        &[0; 8],
        &[0],
    ]
    .concat();
    anyhow::ensure!(valid[..27] == layout[..], "{valid:?}");
    let with_at = |at: usize, bytes: &[u8]| {
        let mut v = valid.clone();
        v.splice(at..at + bytes.len(), bytes.iter().copied());
        v
    };
    for (what, payload, status) in [
        ("a valid value", valid.clone(), OK),
        (
            "an enum variant past the last",
            with_at(4, &9u32.to_le_bytes()),
            UNDECODABLE,
        ),
        (
            "an enum variant past the last in a high byte",
            with_at(4, &(1u32 << 24).to_le_bytes()),
            UNDECODABLE,
        ),
        (
            "a string not UTF-8",
            with_at(16, &[0xff, 0xfe]),
            UNDECODABLE,
        ),
        ("an option tag of 2", with_at(26, &[2]), UNDECODABLE),
        (
            "a string's length of 2^62",
            with_at(8, &(1u64 << 62).to_le_bytes()),
            UNDECODABLE,
        ),
        ("cut inside a word", valid[..6].to_vec(), UNDECODABLE),
    ] {
        calls.push((what, echo.to_vec(), payload, status));
    }
    // Parts with the wrong number of arguments are not kept: the last piece naming their
    // stream finds none.
    node.request_medium(next, r.part, &[], &good[..2])?;
    node.request_medium(next, r.part, &[s + 2, 0], &good[..2])?;
    calls.push((
        "a last piece after parts of two arguments",
        with(sum, s + 2).to_vec(),
        good[2..].to_vec(),
        UNDECODABLE,
    ));
    // Parts joined to a last piece that makes the value too long, or of an unknown type;
    // and the control: a value split by hand into parts runs.
    for (k, (what, w, last, status)) in [
        (
            "parts then trailing bytes",
            sum,
            &trailing[2..],
            UNDECODABLE,
        ),
        (
            "parts of an unknown type",
            [sum[0], !sum[1]],
            &good[2..],
            UNKNOWN,
        ),
        (
            "parts then a cut last piece",
            sum,
            &good[2..good.len() - 1],
            UNDECODABLE,
        ),
        ("parts of a whole value", sum, &good[2..], OK),
    ]
    .into_iter()
    .enumerate()
    {
        let stream = s + 3 + k as u32;
        // The first part declares the whole length (the control's), each its index.
        let total = good.len() as u32;
        node.request_medium(next, r.part, &[stream, 0, total, 0], &good[..1])?;
        node.request_medium(next, r.part, &[stream, 1], &good[1..2])?;
        calls.push((what, with(w, stream).to_vec(), last.to_vec(), status));
    }
    // Rendezvous descriptors (where the transport maps peers' memory: sci; elsewhere every
    // one is undecodable): cut short, a release word out of range, a length past the
    // largest value, and handles that map nothing (not `/proc/<pid>/fd/<fd>`, or a file of
    // the sender's that is not a staging segment: its stdin).
    let maps = node.capabilities().map_segments;
    let desc = |slot: u32, len: u64, handle: &str| {
        let mut d = u64s(&[1, 0, len, 1 << 20, 7]);
        d.extend_from_slice(handle.as_bytes());
        (vec![sum[0], sum[1], slot, RENDEZVOUS], d)
    };
    let stdin = format!("/proc/{}/fd/0", std::process::id());
    let or_undecodable = |status: u32| if maps { status } else { UNDECODABLE };
    for (what, (args, payload), status) in [
        ("a descriptor cut short", desc(1, 64, &stdin), UNDECODABLE),
        ("release word 0", desc(0, 64, &stdin), UNDECODABLE),
        (
            "a release word past the last",
            desc(1 << 20, 64, &stdin),
            UNDECODABLE,
        ),
        (
            "a value past the largest",
            desc(1, 1 << 31, &stdin),
            or_undecodable(TOO_LARGE),
        ),
        (
            "a handle of no form",
            desc(1, 64, "/proc/self/fd/0"),
            or_undecodable(UNREACHABLE),
        ),
        (
            "a handle of another file",
            desc(1, 64, &stdin),
            or_undecodable(UNREACHABLE),
        ),
    ] {
        let payload = match what {
            "a descriptor cut short" => payload[..30].to_vec(),
            _ => payload,
        };
        calls.push((what, args, payload, status));
    }
    for (what, args, payload, status) in &calls {
        let answer = node.call(next, r.call, args, payload)?;
        anyhow::ensure!(
            answer.args == [*status],
            "rank {me}: {what}: {:?}, not status {status}",
            answer.args
        );
        if *status == OK && args[..2] == sum {
            let got: u64 =
                unwire(&answer.payload).map_err(|e| anyhow::anyhow!("rank {me}: {what}: {e}"))?;
            anyhow::ensure!(got == sum_of, "rank {me}: {what}: answered {got}");
        }
    }
    // Posts: forged ones run nothing; the real ones after them all run.
    let post = wire(&Add(1 << 40));
    for (args, payload) in [
        (add.to_vec(), post[..post.len() - 1].to_vec()),
        (add.to_vec(), [post.clone(), vec![7]].concat()),
        (vec![add[0] ^ 1, add[1]], post.clone()),
        (add[..1].to_vec(), post.clone()),
        (Vec::new(), post.clone()),
        (with(add, s + 9).to_vec(), post.clone()),
        (add.to_vec(), bomb.to_vec()),
    ] {
        node.request_medium(next, r.post, &args, &payload)?;
    }
    // Requests (not calls) of the call handler: with no call number, and with one that
    // nobody here waits for (the value runs there, and its answer is dropped here).
    node.request_medium(next, r.call, &[], &good)?;
    node.request_medium(next, r.call, &[0xdead_beef, sum[0], sum[1]], &good)?;
    node.request_medium(next, r.call, &[0xdead_beef, sum[0]], &good)?;
    // Answers: to no call of the target's, with the wrong number of arguments, and naming
    // a stream of parts (which they use up, harmlessly).
    node.request_medium(next, r.part, &[s + 10], &good)?;
    for args in [
        vec![0xdead_beef, OK, s + 10],
        vec![0xdead_beef, OK, s + 11],
        vec![u32::MAX, UNDECODABLE, s + 12],
        vec![0xdead_beef],
        vec![],
        vec![1, 2, 3, 4],
        vec![0xdead_beef, OK, 1, RENDEZVOUS],
    ] {
        node.request_medium(next, r.answer, &args, &good)?;
    }
    // Posts of forged descriptors run nothing either.
    for slot in [0, 1] {
        let (args, payload) = desc(slot, 64, &stdin);
        node.request_medium(next, r.post, &[add[0], add[1], args[2], args[3]], &payload)?;
    }
    // The job goes on: typed calls and posts work, and only the real posts ran.
    anyhow::ensure!(
        node.call_typed(next, Sum(vec![2, 3]))? == 5,
        "rank {me}: a call after the forged ones"
    );
    for i in 1..=4 {
        node.post_typed(next, Add(i))?;
    }
    node.barrier()?;
    let t = total.load(Ordering::Relaxed);
    anyhow::ensure!(t == 10, "rank {me}: posts ran for {t}, not 10");
    node.barrier()?;
    Ok(())
}

/// Whether this process is a rank of a job (a copy of this test binary the sci job
/// started): then only the sci test has work here.
fn in_a_job() -> bool {
    amnet::am_launch::JobInfo::is_launched()
}

/// Catches a typed value that sci's Medium path cuts, reorders or joins wrongly: values
/// and answers of one byte either side of 1, 2 and 3 Mediums of 936 bytes and up to 8
/// Mediums long (many parts each), nested enums, strings of any code point and maps that
/// do not come back whole; parts of several values in flight together (8 handles, two
/// endpoints of one process) mixed up or paired with the wrong call; an async call whose
/// answer in parts never wakes it, or a late answer of a call given up that is taken
/// for a later call's; and a target that runs, keeps or panics on forged typed messages
/// (truncated, trailing bytes, an unknown type, a length past the payload, an enum variant
/// past the last, a string not UTF-8, an option tag of 2, a string's length of 2^62, a
/// value cut inside a word, a last piece of no parts, parts or answers with the wrong
/// arguments, an answer to no call), so that the job stops or a later call hangs.
#[test]
fn arbitrary_values_round_trip_on_sci_two_endpoints_per_process() {
    within(Duration::from_secs(120), || {
        let opts = JobOptions::new().transport(TransportKind::Sci).ranks(2);
        let code = amnet::run_job_endpoints(&opts, PER_PROCESS, |endpoints| {
            let transports = endpoints.into_transports();
            let max = transports[0].info().limits.max_medium;
            let model = Arc::new(Model::new(transports[0].size(), max, 8 * max));
            std::thread::scope(|s| {
                let threads: Vec<_> = transports
                    .into_iter()
                    .map(|t| {
                        let model = model.clone();
                        s.spawn(move || rank(t, model))
                    })
                    .collect();
                for t in threads {
                    t.join().expect("an endpoint's thread")?;
                }
                Ok::<(), anyhow::Error>(())
            })
        })
        .expect("the job");
        assert_eq!(code, 0);
    });
}

/// Catches the same on udp, where a Medium is 64 KiB: values up to 200 kB, which leave in
/// parts of datagram-sized Mediums, with answers as large sent as requests from the
/// target's next poll; and forged messages over an encrypted datagram transport.
#[test]
fn arbitrary_values_round_trip_on_udp() {
    if in_a_job() {
        return;
    }
    within(Duration::from_secs(120), || {
        let udp = Udp::cluster(3, 64 << 10, UdpConfig::default()).expect("UDP cluster");
        let max = udp[0].info().limits.max_medium;
        let model = Arc::new(Model::new(3, max, 200_000));
        for r in run_ranks(udp, |t| rank(t, model.clone())) {
            r.expect("udp rank");
        }
    });
}

/// Catches a generator that never hits the cases the round trips are for (checked
/// without a transport, for both transports' Mediums), and one that differs between two
/// runs with the seed (the ranks of a job would disagree on the values).
#[test]
fn generated_values_cover_the_boundaries_and_repeat() {
    if in_a_job() {
        return;
    }
    for (max, limit) in [(936, 8 * 936), (64_000, 200_000)] {
        let a = Model::new(2, max, limit);
        let b = cases(1, max, limit);
        assert_eq!(
            a.by_sender[1], b,
            "Medium {max}: the seed gives other values"
        );
        assert_ne!(a.by_sender[0], a.by_sender[1], "senders share values");
    }
}

/// Set in the process [`a_deeply_nested_forged_value_is_refused`] starts: that process runs
/// the job (its target may die of the bug, so not the test's own process).
const DEEP_CHILD: &str = "TYPED_VALUES_DEEP_CHILD";

/// Catches a target that decodes a recursive type without a bound on its depth: a forged
/// call of one Medium (`Value` whose `tree` is `Tree::Boxed` 15,000 times, then nothing)
/// must be refused as undecodable, not overflow the target's stack and abort its process
/// (every rank of the job with it); and the job goes on, a typed call after it answered.
///
/// The payload: the two words of `type_id::<Echo>()` as the arguments of rank 1's reserved
/// "amnet: typed call" handler, and `case` 0 (a u32 word) followed by the variant index 3
/// (`Boxed`, a u32 word) 15,000 times, 60 kB. The serde-derived `Deserialize` of a
/// recursive type recurses once per level; a decoder without a bound overflows a rank
/// thread's stack at a few thousand levels in a debug build ("thread 'rank-1' has
/// overflowed its stack", SIGABRT), so the job runs in a child process, and this test
/// checks that it ended well.
#[test]
fn a_deeply_nested_forged_value_is_refused() {
    if in_a_job() {
        return;
    }
    if std::env::var_os(DEEP_CHILD).is_some() {
        return deeply_nested_job();
    }
    let mut cmd = std::process::Command::new(std::env::current_exe().expect("test exe"));
    cmd.args([
        "--exact",
        "a_deeply_nested_forged_value_is_refused",
        "--nocapture",
    ])
    .env(DEEP_CHILD, "1");
    let run = common::run_bounded(cmd, Duration::from_secs(60));
    assert_eq!(
        run.code, 0,
        "the job of a deeply nested value failed:\n{}\n{}",
        run.stdout, run.stderr
    );
}

/// Rank 0 sends rank 1 the deeply nested forged value, expects it refused, then a typed
/// call.
fn deeply_nested_job() {
    let udp = Udp::cluster(2, 64 << 10, UdpConfig::default()).expect("UDP cluster");
    let model = Arc::new(Model::new(2, udp[0].info().limits.max_medium, 200_000));
    for r in run_ranks(udp, |t| {
        let (h, r) = handlers(model.clone(), Arc::default())?;
        let mut node = Node::new(t, h, Config::default())?;
        if node.rank() == 0 {
            let id = type_id::<Echo>();
            // `case` 0, then `Boxed` 15,000 times.
            let payload = [vec![0; 4], 3u32.to_le_bytes().repeat(15_000)].concat();
            anyhow::ensure!(payload.len() <= node.max_medium(), "one Medium");
            let a = node.call(1, r.call, &[id as u32, (id >> 32) as u32], &payload)?;
            anyhow::ensure!(a.args == [UNDECODABLE], "status {:?}", a.args);
            anyhow::ensure!(node.call_typed(1, Sum(vec![1, 2]))? == 3, "a call after");
        }
        node.barrier()?;
        Ok::<(), anyhow::Error>(())
    }) {
        r.expect("udp rank");
    }
}
