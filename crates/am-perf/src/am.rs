//! The AM side of the measurements: one handler table for every transport, and timed round
//! trips and streams from rank 0 to [`PEER`].

use am_core::Local;
use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use am_core::{AmError, AmKind, HandlerId, Handlers, Node, RegisterError, Transport};

use crate::{median, PEER};

/// Short request; its handler replies with [`SHORT_REPLY`].
pub const SHORT: HandlerId = HandlerId(1);
/// Short reply; counts one reply.
pub const SHORT_REPLY: HandlerId = HandlerId(2);
/// Medium request; its handler echoes the payload with [`MEDIUM_REPLY`].
pub const MEDIUM: HandlerId = HandlerId(3);
/// Medium reply; counts one reply.
pub const MEDIUM_REPLY: HandlerId = HandlerId(4);
/// Long request; its handler does nothing (bandwidth).
pub const LONG: HandlerId = HandlerId(5);
/// Short request without a reply (floods: the hot pair).
pub const FLOOD_SHORT: HandlerId = HandlerId(6);
/// Medium request without a reply (floods: the hot pair).
pub const FLOOD_MEDIUM: HandlerId = HandlerId(7);

/// The measurements' handler table; the reply handlers add one to `replies`.
pub fn handlers(replies: &Rc<Cell<u64>>) -> Result<Handlers<Local>, RegisterError> {
    let mut h = Handlers::local();
    h.request(SHORT, "s", AmKind::Short, |_m, t| {
        let _ = t.reply_short(SHORT_REPLY, &[]);
    })?;
    let c = replies.clone();
    h.reply(SHORT_REPLY, "rs", AmKind::Short, move |_m| {
        c.set(c.get() + 1)
    })?;
    h.request(MEDIUM, "m", AmKind::Medium, |m, t| {
        let _ = t.reply_medium(MEDIUM_REPLY, &[], m.payload_ref());
    })?;
    let c = replies.clone();
    h.reply(MEDIUM_REPLY, "rm", AmKind::Medium, move |_m| {
        c.set(c.get() + 1)
    })?;
    h.request(LONG, "l", AmKind::Long, |_m, _t| {})?;
    h.request(FLOOD_SHORT, "hot_s", AmKind::Short, |_m, _t| {})?;
    h.request(FLOOD_MEDIUM, "hot_m", AmKind::Medium, |_m, _t| {})?;
    Ok(h)
}

/// Runs `f` and returns what it returns: [`rma_ops`]'s measured loop runs inside it.
/// Never inlined, so callgrind finds it by name: under `valgrind --tool=callgrind
/// --collect-atstart=no --toggle-collect='*am_perf_measure*'` only what runs inside it is
/// counted, in the thread that runs it (another rank's thread, waiting meanwhile, is not),
/// and neither the job's start-up nor its teardown.
#[inline(never)]
pub fn am_perf_measure<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// The callable handler of `selfrt call`.
const CALL_SUM: HandlerId = HandlerId(1);

/// Four words to add up (`selfrt typed`): 32 bytes whose values need all their bytes.
#[derive(serde::Serialize, serde::Deserialize)]
struct Sum([u64; 4]);

impl am_core::typed::Am for Sum {
    type Reply = u64;
    fn exec(self, _: &mut am_core::typed::AmContext) -> u64 {
        self.0.iter().fold(0u64, |a, &w| a.wrapping_add(w))
    }
}

/// Bytes to count (`selfrt typedbulk`, `SELFRT_BYTES` of them, 1 MiB by default): one
/// byte string on the wire.
#[derive(serde::Serialize, serde::Deserialize)]
struct Bulk(#[serde(with = "serde_bytes")] Vec<u8>);

impl am_core::typed::Am for Bulk {
    type Reply = u64;
    fn exec(self, _: &mut am_core::typed::AmContext) -> u64 {
        self.0.len() as u64
    }
}

/// One round trip: `send` issues a request whose reply adds one to `replies` (a table from
/// [`handlers`]); returns when that reply has run.
pub fn round_trip<T: Transport>(
    node: &mut Node<T, Local>,
    replies: &Cell<u64>,
    send: impl FnOnce(&mut Node<T, Local>) -> Result<(), AmError>,
) -> Result<(), AmError> {
    let want = replies.get() + 1;
    send(node)?;
    node.wait_until(|| replies.get() == want)
}

/// One AM Short round trip to [`PEER`].
pub fn short_round_trip<T: Transport>(
    node: &mut Node<T, Local>,
    replies: &Cell<u64>,
) -> Result<(), AmError> {
    round_trip(node, replies, |n| n.request_short(PEER, SHORT, &[]))
}

/// One AM Medium round trip of `data` to [`PEER`] (echoed back).
pub fn medium_round_trip<T: Transport>(
    node: &mut Node<T, Local>,
    replies: &Cell<u64>,
    data: &[u8],
) -> Result<(), AmError> {
    round_trip(node, replies, |n| n.request_medium(PEER, MEDIUM, &[], data))
}

/// Calls `send` `count` times, then waits until everything sent is done
/// ([`Node::quiesce`]); returns the time from the first send to the end.
pub fn stream<T: Transport>(
    node: &mut Node<T, Local>,
    count: u64,
    mut send: impl FnMut(&mut Node<T, Local>) -> Result<(), AmError>,
) -> Result<Duration, AmError> {
    let start = Instant::now();
    for _ in 0..count {
        send(node)?;
    }
    node.quiesce()?;
    Ok(start.elapsed())
}

/// AM Long bandwidth to [`PEER`] in bytes per second: the median of 5 runs of 40 Longs of
/// 1 MiB, each run until quiescence.
pub fn long_bandwidth<T: Transport>(node: &mut Node<T, Local>) -> Result<f64, AmError> {
    const MIB: usize = 1 << 20;
    let big = vec![9u8; MIB];
    let mut bws = Vec::new();
    for _ in 0..5 {
        let t = stream(node, 40, |n| n.request_long(PEER, LONG, &[], &big, 0))?;
        bws.push(40.0 * MIB as f64 / t.as_secs_f64());
    }
    Ok(median(bws))
}

/// What one rank's round trips to itself cost, in one thread with every line in the cache:
/// `what` is `"nic"` (a Short request and its reply through [`Transport`] alone), `"am"`
/// (an AM Short round trip through [`Node`]), `"medium"` (a 512-byte AM Medium echoed) or
/// `"flood"` (one-way AM Shorts whose handler does not reply, as many in flight as the credits
/// allow, with the core's implicit replies: per message, the sender's, the receiver's and
/// the credit return's share). Returns ns per round trip (per message for `flood`).
///
/// Run under `valgrind --tool=callgrind` with two counts and subtract to get instructions
/// per round trip; `am` minus `nic` is the core's share. Counted over the whole process:
/// marking this function (or its loops) for callgrind's `--toggle-collect` changes what
/// LTO inlines here, and the counts with it (loopback's AM Short by about 40 instructions).
pub fn self_round_trips<T: Transport>(
    transport: T,
    what: &str,
    iters: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let start = Instant::now();
    match what {
        "nic" => {
            let mut t = transport;
            let heads = crate::nic::ShortHeads::new();
            let me = t.rank();
            for _ in 0..iters {
                t.try_send(me, &heads.request())?;
                t.poll_recv(|d, _, tx| tx.try_send(me, &heads.reply(d.route)))?
                    .ok_or("no request")??;
                t.poll_recv(|_, _, _| ())?.ok_or("no reply")?;
            }
        }
        "am" | "medium" | "flood" => {
            let replies = Rc::new(Cell::new(0u64));
            let config = am_core::Config::default().wait_mode(am_core::WaitMode::Spin);
            let mut node = Node::new(transport, handlers(&replies)?, config)?;
            let me = node.rank();
            // `medium`: a Medium of SELFRT_BYTES (512) echoed back (copied both ways).
            let medium = what == "medium";
            let data = vec![
                7u8;
                std::env::var("SELFRT_BYTES")
                    .ok()
                    .and_then(|b| b.parse().ok())
                    .unwrap_or(512)
            ];
            if what == "flood" {
                for _ in 0..iters {
                    node.request_short(me, FLOOD_SHORT, &[])?;
                }
                node.quiesce()?;
                return Ok(start.elapsed().as_secs_f64() * 1e9 / iters.max(1) as f64);
            }
            for _ in 0..iters {
                if !medium {
                    round_trip(&mut node, &replies, |n| n.request_short(me, SHORT, &[]))?;
                } else {
                    round_trip(&mut node, &replies, |n| {
                        n.request_medium(me, MEDIUM, &[], &data)
                    })?;
                }
            }
        }
        "call" | "typed" | "typedbulk" => {
            // A call with 32 bytes answered with 8 (`call`), and the same as a typed call of
            // four `u64`s answered with a `u64` (`typed`): the typed layer's own cost.
            let mut h = Handlers::local();
            h.callable(CALL_SUM, "sum", |msg, call| {
                let sum = msg
                    .payload()
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
                    .fold(0u64, u64::wrapping_add);
                let _ = call.reply(&[], &sum.to_le_bytes()[..]);
            })?;
            h.typed::<Sum>()?;
            h.typed::<Bulk>()?;
            let config = am_core::Config::default().wait_mode(am_core::WaitMode::Spin);
            let mut node = Node::new(transport, h, config)?;
            let me = node.rank();
            let words = [u64::MAX - 1, u64::MAX - 2, u64::MAX - 3, u64::MAX - 4];
            let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
            if what == "typedbulk" {
                let len = std::env::var("SELFRT_BYTES")
                    .ok()
                    .and_then(|b| b.parse().ok())
                    .unwrap_or(1 << 20);
                let data = vec![7u8; len];
                for _ in 0..iters {
                    let n = node.call_typed(me, Bulk(data.clone()))?;
                    if n != len as u64 {
                        return Err(format!("typedbulk: {n} bytes came, not {len}").into());
                    }
                }
                return Ok(start.elapsed().as_secs_f64() * 1e9 / iters.max(1) as f64);
            }
            for _ in 0..iters {
                if what == "call" {
                    std::hint::black_box(node.call(me, CALL_SUM, &[], &bytes)?);
                } else {
                    std::hint::black_box(node.call_typed(me, Sum(words))?);
                }
            }
        }
        _ => {
            let known = "nic, am, medium, flood, call, typed or typedbulk";
            return Err(format!("selfrt: `{what}` is not {known}").into());
        }
    }
    Ok(start.elapsed().as_secs_f64() * 1e9 / iters.max(1) as f64)
}

/// What one blocking RMA operation of 8 bytes from rank 0 to rank 1 costs rank 0, with the
/// operation reaching the transport (an operation on a rank's own segment never does):
/// `what` is `"put"` ([`Node::put`] of 8 bytes), `"get"` ([`Node::get_into`] an 8-byte
/// buffer, so no allocation is counted) or `"atomic"` ([`Node::atomic`], a fetching add
/// on a `u64`). `transports` are the two ranks of an in-process job (`T::cluster(2, ..)`),
/// each run in its own thread: rank 1 meets rank 0 at a barrier, then waits at the next one
/// (`peer_wait`: [`WaitMode::Block`](am_core::WaitMode::Block) sleeps there, so it costs
/// the measuring rank no CPU; a transport whose target must poll for the operations to
/// complete needs a polling mode), while rank 0, spinning as in [`self_round_trips`], makes
/// its `iters` operations inside [`am_perf_measure`] and checks what they did. Returns ns
/// per operation.
///
/// Under callgrind, count with `--collect-atstart=no --toggle-collect='*am_perf_measure*'`
/// (rank 0's thread inside the loop, not rank 1's), two counts subtracted as for
/// [`self_round_trips`].
pub fn rma_ops<T: Transport + Send>(
    transports: Vec<T>,
    what: &str,
    iters: usize,
    peer_wait: am_core::WaitMode,
) -> Result<f64, Box<dyn std::error::Error>> {
    if !matches!(what, "put" | "get" | "atomic") {
        return Err(format!("rma: `{what}` is not put, get or atomic").into());
    }
    if transports.len() != 2 {
        return Err(format!("rma: a job of 2 ranks, not {}", transports.len()).into());
    }
    let results: Vec<Result<f64, String>> = std::thread::scope(|s| {
        let ranks: Vec<_> = transports
            .into_iter()
            .map(|t| {
                s.spawn(move || {
                    let wait = if t.rank() == 0 {
                        am_core::WaitMode::Spin
                    } else {
                        peer_wait
                    };
                    rma_rank(t, what, iters, wait).map_err(|e| e.to_string())
                })
            })
            .collect();
        ranks
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
            .collect()
    });
    let mut ns = 0.0;
    for (rank, r) in results.into_iter().enumerate() {
        match r {
            Ok(t) if rank == 0 => ns = t,
            Ok(_) => {}
            Err(e) => return Err(format!("rma {what}: rank {rank}: {e}").into()),
        }
    }
    Ok(ns)
}

/// One rank of [`rma_ops`]: rank 0 measures, rank 1 waits at the second barrier.
fn rma_rank<T: Transport>(
    transport: T,
    what: &str,
    iters: usize,
    wait: am_core::WaitMode,
) -> Result<f64, Box<dyn std::error::Error>> {
    /// Where in rank 1's segment: the put's word, the get's and the atomic's.
    const PUT_AT: usize = 0;
    const GET_AT: usize = 64;
    const ATOMIC_AT: usize = 128;
    let replies = Rc::new(Cell::new(0u64));
    let config = am_core::Config::default().wait_mode(wait);
    let mut node = Node::new(transport, handlers(&replies)?, config)?;
    let got = 0x0123_4567_89ab_cdefu64;
    if node.rank() == PEER {
        node.segment().write(GET_AT, &got.to_le_bytes())?;
    }
    node.barrier()?;
    let mut ns = 0.0;
    if node.rank() == 0 {
        let start = Instant::now();
        let word = 42u64.to_le_bytes();
        let mut buf = [0u8; 8];
        let mut last = 0u64;
        am_perf_measure(|| -> Result<(), Box<dyn std::error::Error>> {
            for k in 0..iters as u64 {
                match what {
                    "put" => node.put(PEER, PUT_AT, &word)?,
                    "get" => {
                        node.get_into(PEER, GET_AT, &mut buf)?;
                    }
                    _ => {
                        last = node.atomic(PEER, ATOMIC_AT, am_core::AtomicOp::FetchAdd(1u64))?;
                        if last != k {
                            return Err(format!("atomic {k}: fetched {last}").into());
                        }
                    }
                }
            }
            Ok(())
        })?;
        ns = start.elapsed().as_secs_f64() * 1e9 / iters.max(1) as f64;
        if what == "get" && iters > 0 && u64::from_le_bytes(buf) != got {
            return Err(format!("get: {:#x} came, not {got:#x}", u64::from_le_bytes(buf)).into());
        }
        std::hint::black_box(last);
    }
    node.barrier()?;
    if node.rank() == PEER && what == "put" && iters > 0 {
        let mut put = [0u8; 8];
        node.segment().read(PUT_AT, &mut put)?;
        if put != 42u64.to_le_bytes() {
            return Err("put: the word did not land".into());
        }
    }
    Ok(ns)
}
