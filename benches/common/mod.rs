//! Shared by the benches: in-process clusters by transport, the ping-pong handlers, and a pair
//! of ranks (rank 0 on the bench thread, rank 1 on a server thread that only polls).

#![allow(dead_code)] // each bench uses part of this

use amnet::Local;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use amnet::{AmKind, AnyTransport, Config, HandlerId, Handlers, Node, TransportKind, WaitMode};

pub const PING: [HandlerId; 3] = [HandlerId(1), HandlerId(2), HandlerId(3)];
pub const PONG: [HandlerId; 3] = [HandlerId(4), HandlerId(5), HandlerId(6)];
pub const SINK: [HandlerId; 3] = [HandlerId(7), HandlerId(8), HandlerId(9)];
pub const KINDS: [AmKind; 3] = [AmKind::Short, AmKind::Medium, AmKind::Long];

pub fn kind_name(k: AmKind) -> &'static str {
    match k {
        AmKind::Short => "short",
        AmKind::Medium => "medium",
        AmKind::Long => "long",
    }
}

/// The ranks of an in-process job on `kind` (real segments and sockets, ranks as threads), or
/// `None` if this build cannot start one.
pub fn cluster(kind: TransportKind, ranks: u32, segment_size: usize) -> Option<Vec<AnyTransport>> {
    if !kind.is_available() {
        return None;
    }
    match amnet::cluster(kind, ranks, segment_size) {
        Ok(ranks) => Some(ranks),
        Err(e) => {
            eprintln!("bench: skipping {kind}: {e}");
            None
        }
    }
}

/// The transports this build can bench.
pub fn transports() -> impl Iterator<Item = TransportKind> {
    TransportKind::ALL.into_iter().filter(|t| t.is_available())
}

/// Ping handlers that answer with the same kind and size, pong handlers that count, and sinks
/// that do not reply (the core's implicit reply returns the credit).
pub fn handlers(pongs: &Rc<Cell<u64>>) -> Handlers<Local> {
    let mut h = Handlers::local();
    for (i, kind) in KINDS.into_iter().enumerate() {
        let pong = PONG[i];
        // A Long is answered with as many bytes of private data (the segment is not lent out).
        let mut data = Vec::new();
        h.request(PING[i], "ping", kind, move |msg, token| {
            let _ = match kind {
                AmKind::Short => token.reply_short(pong, msg.args()),
                AmKind::Medium => token.reply_medium(pong, msg.args(), msg.payload_ref()),
                AmKind::Long => {
                    data.resize(msg.payload_len(), 0);
                    token.reply_long(pong, msg.args(), &data, 0)
                }
            };
        })
        .expect("register ping");
        let p = pongs.clone();
        h.reply(pong, "pong", kind, move |_| p.set(p.get() + 1))
            .expect("register pong");
        h.request(SINK[i], "sink", kind, |_, _| {})
            .expect("register sink");
    }
    h
}

/// `AM_CREDITS` / `AM_WAIT` when set; spin a little, then yield (pure spinning on a busy
/// 2-core machine turns a preempted partner into a whole time slice per round trip).
fn config() -> Config {
    Config::from_env().unwrap_or_default()
}

/// Polls until `stop`, yielding when there is nothing to do (as `config()` waits).
fn serve(node: &mut Node<AnyTransport, Local>, stop: &AtomicBool) {
    let spin_polls = node.config().spin_polls;
    let spin = node.config().wait_mode == WaitMode::Spin;
    let mut idle = 0u32;
    while !stop.load(Ordering::Relaxed) {
        if node.poll().expect("rank 1 poll") > 0 {
            idle = 0;
        } else {
            idle = idle.saturating_add(1);
            if spin || idle < spin_polls {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Rank 0 of a two-rank job on the bench thread; rank 1 polls on its own thread.
pub struct Pair {
    pub node: Node<AnyTransport, Local>,
    pub pongs: Rc<Cell<u64>>,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
}

impl Pair {
    /// `None` if `kind` has no in-process cluster.
    pub fn start(kind: TransportKind, segment_size: usize) -> Option<Pair> {
        let mut ranks = cluster(kind, 2, segment_size)?.into_iter();
        let (t0, t1) = (ranks.next()?, ranks.next()?);
        let stop = Arc::new(AtomicBool::new(false));
        let stop1 = stop.clone();
        let server = std::thread::spawn(move || {
            let pongs = Rc::new(Cell::new(0));
            let mut node = Node::new(t1, handlers(&pongs), config()).expect("rank 1");
            serve(&mut node, &stop1);
        });
        let pongs = Rc::new(Cell::new(0u64));
        let node = Node::new(t0, handlers(&pongs), config()).expect("rank 0");
        Some(Pair {
            node,
            pongs,
            stop,
            server: Some(server),
        })
    }

    /// Sends one request of `kind` to rank 1 (blocking while out of credit).
    #[inline]
    pub fn send(&mut self, kind: AmKind, id: HandlerId, payload: &[u8]) {
        match kind {
            AmKind::Short => self.node.request_short(1, id, &[7]),
            AmKind::Medium => self.node.request_medium(1, id, &[], payload),
            AmKind::Long => self.node.request_long(1, id, &[], payload, 0),
        }
        .expect("request");
    }

    /// One round trip: a ping of `kind` and its pong.
    #[inline]
    pub fn round_trip(&mut self, kind: AmKind, payload: &[u8]) {
        let want = self.pongs.get() + 1;
        self.send(kind, PING[kind as usize], payload);
        let pongs = &self.pongs;
        self.node
            .wait_until(|| pongs.get() == want)
            .expect("wait for pong");
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        // Every reply back first, so rank 1 owes nothing when it stops polling.
        let _ = self.node.quiesce();
        self.stop.store(true, Ordering::Relaxed);
        if let Some(s) = self.server.take() {
            let _ = s.join();
        }
    }
}
