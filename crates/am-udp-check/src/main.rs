//! A small AM program for the UDP transport's multi-process tests and its benchmark
//! (`cargo run --release -p am-udp-check -- bench`, or installed with
//! `cargo install --path crates/am-udp-check`).
//!
//! ```text
//! am-udp-check alltoall N    every rank sends N requests to every rank, checks order; exit 0
//! am-udp-check stream N      2 ranks: rank 0 sends N requests to rank 1, which checks order;
//!                            with AM_UDP_CHECK_STOP_AFTER=k rank 1 stops itself (SIGSTOP)
//!                            after k, for the test to resume (SIGCONT)
//! am-udp-check survive       traffic until a peer is lost; report it; exit 3
//! am-udp-check child         every rank starts a shell once its transport is up; fails if
//!                            the shell finds the job key (in its environment or the pipe)
//! am-udp-check bench [N]     in one process: raw UDP ping-pong vs AM Short round trip, the
//!                            raw UDP one-way flood vs the one-way AM Short flood, then
//!                            Node::put bandwidth of 1, 4 and 16 MiB
//! am-udp-check flood [N]     only the flood (N AM Shorts, default 200 000)
//! am-udp-check put           only the put bandwidth
//! ```
//!
//! Ranks learn their place from the launcher (`amrun`, `mpiexec`, or `AM_RANK`/`AM_SIZE`/
//! `AM_JOB_ID` plus `AM_COORD`). `AM_UDP_FAULTS=drop=0.1,dup=0.01,delay=0.05` makes each rank
//! drop, duplicate and reorder its outgoing datagrams: the run must still verify.

use std::cell::RefCell;
use std::net::UdpSocket;
use std::rc::Rc;
use std::time::{Duration, Instant};

use am_core::{AmError, AmKind, Config, HandlerId, Handlers, Node, Transport, WaitMode};
use transport_udp::{Udp, UdpConfig};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

macro_rules! bail {
    ($($t:tt)*) => { return Err(format!($($t)*).into()) };
}

const SEQ: HandlerId = HandlerId(1);
const SEQ_MEDIUM: HandlerId = HandlerId(2);
const PING: HandlerId = HandlerId(3);
const PONG: HandlerId = HandlerId(4);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("alltoall") => alltoall(args.get(1).and_then(|n| n.parse().ok()).unwrap_or(1000)),
        Some("stream") => stream(args.get(1).and_then(|n| n.parse().ok()).unwrap_or(1000)),
        Some("survive") => survive(),
        Some("child") => child(),
        Some("bench") => bench(args.get(1).and_then(|n| n.parse().ok()).unwrap_or(20_000)),
        Some("flood") => flood(args.get(1).and_then(|n| n.parse().ok()).unwrap_or(200_000))
            .map(|r| println!("{}", flood_line(r))),
        Some("put") => put(),
        _ => {
            eprintln!(
                "usage: am-udp-check alltoall N | stream N | survive | child | bench [N] | flood [N] | put"
            );
            std::process::exit(2)
        }
    };
    if let Err(e) = result {
        eprintln!("am-udp-check: {e}");
        std::process::exit(1);
    }
}

fn connect() -> Res<(am_bootstrap::JobInfo, Udp)> {
    let mut job = am_bootstrap::JobInfo::from_env()?;
    let config = UdpConfig::from_env()?;
    let udp = Udp::connect(&mut job, 1 << 20, config)?;
    Ok((job, udp))
}

fn node_config() -> Res<Config> {
    let mut c = Config::from_env()?;
    if std::env::var_os("AM_WAIT").is_none() {
        c.wait_mode = WaitMode::Block;
    }
    Ok(c)
}

/// Every rank sends `n` requests (Short and Medium, numbered) to every rank, itself included;
/// each receiver checks it got 0..n from every sender, in order.
fn alltoall(n: u32) -> Res<()> {
    let (job, udp) = connect()?;
    let size = job.size;
    let seen: Rc<RefCell<Vec<Vec<u32>>>> = Rc::new(RefCell::new(vec![Vec::new(); size as usize]));
    let mut h = Handlers::local();
    for (id, kind) in [(SEQ, AmKind::Short), (SEQ_MEDIUM, AmKind::Medium)] {
        let s = seen.clone();
        h.request(id, "seq", kind, move |msg, _token| {
            let a = msg.args();
            let ok = msg.payload().iter().all(|&b| b == a[0] as u8);
            s.borrow_mut()[msg.src() as usize].push(if ok { a[0] } else { u32::MAX });
        })?;
    }
    let mut node = Node::new(udp, h, node_config()?)?;
    let me = node.rank();
    let data = vec![0u8; 3000];
    for i in 0..n {
        for k in 0..size {
            let dest = (me + k) % size;
            if i % 4 == 3 {
                let len = (i as usize * 37) % data.len();
                let payload: Vec<u8> = data[..len].iter().map(|_| i as u8).collect();
                node.request_medium(dest, SEQ_MEDIUM, &[i], &payload)?;
            } else {
                node.request_short(dest, SEQ, &[i])?;
            }
        }
    }
    node.wait_until(|| seen.borrow().iter().all(|v| v.len() == n as usize))?;
    node.barrier()?;
    for (src, v) in seen.borrow().iter().enumerate() {
        if *v != (0..n).collect::<Vec<_>>() {
            bail!("rank {me}: messages from rank {src} not exactly once in order");
        }
    }
    let s = node.transport().stats();
    println!(
        "rank {me} at {}: ok, {} messages from each of {size} ranks; retransmits {} (fast {}, timeouts {}), duplicates {}, rejected {}, send errors {}",
        node.transport().local_addr(),
        n,
        s.retransmits,
        s.fast_retransmits,
        s.timeouts,
        s.duplicates,
        s.rejected(),
        node.transport().send_errors()
    );
    drop(node);
    drop(job);
    Ok(())
}

/// Rank 0 streams `n` numbered requests to rank 1, which checks they arrive exactly once in
/// order. `AM_UDP_CHECK_STOP_AFTER=k`: rank 1 stops itself with SIGSTOP after k messages, so
/// a test can hold it paused mid-stream (the sender blocked on credits) and resume it.
fn stream(n: u32) -> Res<()> {
    let (job, udp) = connect()?;
    if job.size != 2 {
        bail!("stream needs exactly 2 ranks");
    }
    let stop_after: Option<u32> = match std::env::var("AM_UDP_CHECK_STOP_AFTER") {
        Ok(v) => Some(
            v.parse()
                .map_err(|_| "AM_UDP_CHECK_STOP_AFTER: expected a count")?,
        ),
        Err(_) => None,
    };
    let next = Rc::new(std::cell::Cell::new(0u32));
    let bad = Rc::new(std::cell::Cell::new(0u32));
    let mut h = Handlers::local();
    let (nx, bd) = (next.clone(), bad.clone());
    h.request(SEQ, "seq", AmKind::Short, move |msg, _token| {
        if msg.args()[0] == nx.get() {
            nx.set(nx.get() + 1);
        } else {
            bd.set(bd.get() + 1);
        }
    })?;
    let mut node = Node::new(udp, h, node_config()?)?;
    let start = Instant::now();
    if node.rank() == 0 {
        for i in 0..n {
            node.request_short(1, SEQ, &[i])?;
        }
    } else {
        if let Some(k) = stop_after {
            node.wait_until(|| next.get() >= k.min(n))?;
            println!("STOPPING after {}", next.get());
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGSTOP)?;
        }
        node.wait_until(|| next.get() + bad.get() >= n)?;
    }
    node.barrier()?;
    let s = node.transport().stats();
    if node.rank() == 1 && (next.get(), bad.get()) != (n, 0) {
        bail!(
            "rank 1: {} in order, {} out of order or twice, of {n}",
            next.get(),
            bad.get()
        );
    }
    println!(
        "rank {}: ok, {n} messages in {:?}; retransmits {}, timeouts {}",
        node.rank(),
        start.elapsed(),
        s.retransmits,
        s.timeouts
    );
    Ok(())
}

/// Starts a shell once the transport is up, as a program would start a helper: it must find
/// no job key, neither in `AM_UDP_KEY` nor in the pipe `AM_UDP_KEY_FD` names.
fn child() -> Res<()> {
    let (_job, udp) = connect()?;
    let mut node = Node::new(udp, Handlers::local(), node_config()?)?;
    let out = std::process::Command::new("/bin/sh")
        .args([
            "-c",
            r#"printf '%s' "${AM_UDP_KEY-}"; [ -n "${AM_UDP_KEY_FD-}" ] && cat <&"$AM_UDP_KEY_FD" 2>/dev/null; true"#,
        ])
        .stdin(std::process::Stdio::null())
        .output()?;
    let found = String::from_utf8_lossy(&out.stdout);
    if !found.trim().is_empty() {
        bail!(
            "rank {}: a process it started found the job key: {:?}",
            node.rank(),
            found.trim()
        );
    }
    node.barrier()?;
    println!("rank {}: ok, its child found no key", node.rank());
    Ok(())
}

/// Ping everyone until a peer is lost, then report each loss once, check that sends to the lost
/// rank fail at once, and end with exit code 3.
fn survive() -> Res<()> {
    let (_job, udp) = connect()?;
    let timeout = UdpConfig::from_env()?.engine.peer_timeout;
    let mut h = Handlers::local();
    h.request(PING, "ping", AmKind::Short, |msg, token| {
        let _ = token.reply_short(PONG, msg.args());
    })?;
    h.reply(PONG, "pong", AmKind::Short, |_| {})?;
    let mut node = Node::new(udp, h, node_config()?)?;
    let me = node.rank();
    let size = node.size();
    node.barrier()?;
    println!("READY {me}");
    let mut lost: Vec<(u32, Instant)> = Vec::new();
    let mut first: Option<Instant> = None;
    let report = |r: u32, lost: &mut Vec<(u32, Instant)>| {
        println!("LOST {r}");
        lost.push((r, Instant::now()));
    };
    let mut i = 0u32;
    loop {
        if let Some(t) = first {
            // Keep polling a while: a second PeerLost for the same rank would be a bug.
            if t.elapsed() > timeout + Duration::from_secs(1) {
                break;
            }
            match node.poll() {
                Err(AmError::PeerLost(r)) => report(r, &mut lost),
                Err(e) => bail!("poll: {e}"),
                Ok(0) => std::thread::sleep(Duration::from_millis(1)),
                Ok(_) => {}
            }
            continue;
        }
        i += 1;
        let dest = (me + 1 + i % (size - 1)) % size;
        // Leave credits toward every peer: the core does not yet fail requests to a lost
        // peer, so a request that must wait for a credit from the dead rank would wait forever.
        let initial = node.config().credits.unwrap_or_default().initial();
        let r = if node.credits_available(dest) > initial / 2 {
            node.request_short(dest, PING, &[i])
        } else {
            Ok(())
        }
        .and_then(|()| node.poll().map(|_| ()));
        match r {
            Ok(()) => {}
            Err(AmError::PeerLost(r)) => {
                report(r, &mut lost);
                first = Some(Instant::now());
            }
            Err(e) => bail!("traffic: {e}"),
        }
    }
    for &(r, _) in &lost {
        let t = Instant::now();
        match node.request_short(r, PING, &[0]) {
            Err(AmError::PeerLost(x)) if x == r && t.elapsed() < Duration::from_millis(100) => {
                println!("SEND_FAILS {r}")
            }
            other => bail!("send to lost rank {r}: {other:?}"),
        }
    }
    // The job ends with an error; no quiesce toward a dead rank.
    std::process::exit(3)
}

/// Raw UDP busy-poll ping-pong next to an AM Short round trip over `Udp`, both on 127.0.0.1,
/// both between two threads of this process, medians of `n` round trips; then `Node::put`
/// bandwidth of 1, 4 and 16 MiB (`AM_UDP_MTU` sets the datagram size, `AM_WAIT` the wait mode
/// of the puts, `AM_UDP_CHECK_STATS=1` prints the protocol counters).
fn bench(n: usize) -> Res<()> {
    // The datagram of an AM Short with one argument: 92 bytes of UDP header+MAC, 12 of AM head.
    let size = transport_udp::wire::OVERHEAD + 12;
    let raw = raw_pingpong(n, size)?;
    let am = am_pingpong(n)?;
    println!(
        "raw UDP busy-poll ping-pong, {size}-byte datagrams: median {:.2} us",
        raw
    );
    println!(
        "AM Short round trip over transport-udp (spin):      median {:.2} us ({:.2}x raw)",
        am,
        am / raw
    );
    println!(
        "raw UDP one-way flood, {size}-byte datagrams, one send each:     median {:.3} M/s",
        raw_flood(10 * n, size)? / 1e6
    );
    println!("{}", flood_line(flood(10 * n as u32)?));
    put()
}

/// The floor of a one-way flood of one datagram per message: one thread sends `n` datagrams
/// of `size` bytes with one `send` each on a connected socket (the cheapest way to send one
/// datagram, as transport-udp sends an AM Short), another busy-polls them out of its socket;
/// the sender stays at most 64 ahead, well within the socket buffer. Five runs after a
/// warm-up, the median rate in datagrams per second. Fails if the receiver makes no progress
/// for 10 s (a datagram lost, which it should not be on loopback), however long a run is.
fn raw_flood(n: usize, size: usize) -> Res<f64> {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    b.set_nonblocking(true)?;
    let _ = nix::sys::socket::setsockopt(&b, nix::sys::socket::sockopt::RcvBuf, &(4 << 20));
    a.connect(b.local_addr()?)?;
    let runs = 6;
    let got = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let (got, stop) = (&got, &stop);
        s.spawn(move || {
            let mut buf = [0u8; 2048];
            let mut count = 0;
            while !stop.load(Ordering::Relaxed) {
                if b.recv_from(&mut buf).is_ok() {
                    count += 1;
                    got.store(count, Ordering::Release);
                }
            }
        });
        let result = (|| -> Res<f64> {
            let msg = vec![7u8; size];
            let mut rates = Vec::new();
            let mut sent = 0;
            // Spins until the receiver has `until` datagrams. A datagram lost (it should not
            // be on loopback) must not hang the benchmark: 10 s without one arriving fails it.
            let wait_for = |until: usize| -> Res<()> {
                let (mut seen, mut since) = (got.load(Ordering::Acquire), Instant::now());
                while seen < until {
                    std::hint::spin_loop();
                    let now = got.load(Ordering::Acquire);
                    if now != seen {
                        (seen, since) = (now, Instant::now());
                    } else if since.elapsed() > Duration::from_secs(10) {
                        bail!("raw flood: datagrams lost on loopback ({seen} of {until} arrived)");
                    }
                }
                Ok(())
            };
            for run in 0..runs {
                let t = Instant::now();
                for _ in 0..n {
                    if sent >= got.load(Ordering::Acquire) + 64 {
                        wait_for(sent - 63)?;
                    }
                    a.send(&msg)?;
                    sent += 1;
                }
                wait_for(sent)?;
                if run > 0 {
                    rates.push(n as f64 / t.elapsed().as_secs_f64());
                }
            }
            Ok(median(rates))
        })();
        stop.store(true, Ordering::Relaxed);
        result
    })
}

fn flood_line((rate, credits): (f64, u32)) -> String {
    format!(
        "one-way AM Short flood over transport-udp (spin, {credits} credits):  median {:.3} M/s",
        rate / 1e6
    )
}

/// The one-way AM Short flood: rank 0 sends `n` AM Shorts (one argument) to rank 1 as fast as
/// credits allow, then one more whose reply says rank 1 ran every handler (per-pair order);
/// five runs after a warm-up, the median rate in messages per second. Credits from
/// `AM_CREDITS` (the core's default otherwise).
fn flood(n: u32) -> Res<(f64, u32)> {
    let transports = Udp::cluster(2, 1 << 16, UdpConfig::from_env()?)?;
    let results = am_core::run_ranks(transports, |t| -> Result<(f64, u32), String> {
        let r = (|| -> Res<(f64, u32)> {
            let got = Rc::new(std::cell::Cell::new(0u32));
            let done = Rc::new(std::cell::Cell::new(0u32));
            let (g, d) = (got.clone(), done.clone());
            let mut h = Handlers::local();
            h.request(SEQ, "seq", AmKind::Short, move |_, _| g.set(g.get() + 1))?;
            h.request(PING, "ping", AmKind::Short, |msg, token| {
                let _ = token.reply_short(PONG, msg.args());
            })?;
            h.reply(PONG, "pong", AmKind::Short, move |msg| d.set(msg.args()[0]))?;
            let mut config = Config::from_env()?;
            config.wait_mode = WaitMode::Spin;
            let mut node = Node::new(t, h, config)?;
            let credits = node.config().credits.unwrap_or_default().initial();
            let mut rates = Vec::new();
            if node.rank() == 0 {
                for run in 0..=5u32 {
                    let t = Instant::now();
                    for i in 0..n {
                        node.request_short(1, SEQ, &[i])?;
                    }
                    node.request_short(1, PING, &[run + 1])?;
                    node.wait_until(|| done.get() == run + 1)?;
                    if run > 0 {
                        rates.push(n as f64 / t.elapsed().as_secs_f64());
                    }
                }
            }
            node.barrier()?;
            if node.rank() == 1 && got.get() != 6 * n {
                bail!("flood: rank 1 ran {} of {} handlers", got.get(), 6 * n);
            }
            if std::env::var_os("AM_UDP_CHECK_STATS").is_some() {
                print_per_message(node.rank(), 6 * n as u64, node.transport());
            }
            Ok((if rates.is_empty() { 0.0 } else { median(rates) }, credits))
        })();
        r.map_err(|e| e.to_string())
    });
    let mut it = results.into_iter();
    Ok(it.next().ok_or("no rank 0")??)
}

/// The raw UDP stream and `Node::put` bandwidth of 1, 4 and 16 MiB.
fn put() -> Res<()> {
    let mtu = UdpConfig::from_env()?.engine.mtu;
    let wait = std::env::var("AM_WAIT").unwrap_or_else(|_| "block".into());
    println!(
        "raw UDP send+receive of 16 MiB in {mtu}-byte datagrams, one thread:  median {:.0} MiB/s (the kernel's ceiling)",
        raw_stream(16 << 20, mtu, 3)?
    );
    for (size, mib_s) in put_bandwidth(&[1 << 20, 4 << 20, 16 << 20], 5)? {
        println!(
            "Node::put of {:>2} MiB over transport-udp ({mtu}-byte datagrams, {wait}): median {:.0} MiB/s",
            size >> 20,
            mib_s
        );
    }
    Ok(())
}

/// Blocking `Node::put`s of each size from rank 0 to rank 1 (two threads), `reps`
/// times each after one warm-up: the median bandwidth per size in MiB/s. The configuration
/// comes from the environment (`AM_UDP_MTU=65507` for loopback-sized datagrams).
fn put_bandwidth(sizes: &[usize], reps: usize) -> Res<Vec<(usize, f64)>> {
    let largest = sizes.iter().copied().max().unwrap_or(0);
    let transports = Udp::cluster(2, largest, UdpConfig::from_env()?)?;
    let results = am_core::run_ranks(transports, |t| -> Result<Vec<(usize, f64)>, String> {
        let r = (|| -> Res<Vec<(usize, f64)>> {
            // Blocking by default: spinning ranks starve each other on a busy 2-core machine,
            // and a starved receiver turns into retransmission timeouts (`AM_WAIT` overrides).
            let mut config = Config::from_env()?;
            if std::env::var_os("AM_WAIT").is_none() {
                config.wait_mode = WaitMode::Block;
            }
            let mut node = Node::new(t, Handlers::local(), config)?;
            let data: Vec<u8> = (0..largest).map(|i| (i * 7 + 1) as u8).collect();
            let mut out = Vec::new();
            for &size in sizes {
                let mut rates = Vec::new();
                if node.rank() == 0 {
                    for rep in 0..=reps {
                        let t = Instant::now();
                        node.put(1, 0, &data[..size])?;
                        if rep > 0 {
                            rates.push(size as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64());
                        }
                    }
                    out.push((size, median(rates)));
                    if std::env::var_os("AM_UDP_CHECK_STATS").is_some() {
                        eprintln!("after {size}: {:?}", node.transport().stats());
                    }
                }
                node.barrier()?;
                if node.rank() == 1
                    && node.transport().segment().slice(0, size)?.to_vec()[..] != data[..size]
                {
                    bail!("put of {size} bytes: the target segment does not match");
                }
            }
            Ok(out)
        })();
        r.map_err(|e| e.to_string())
    });
    let mut it = results.into_iter();
    Ok(it.next().ok_or("no rank 0")??)
}

/// The protocol's and the socket's counters of one rank, per message of a run of `msgs`.
fn print_per_message(rank: u32, msgs: u64, t: &Udp) {
    let s = t.stats();
    let k = t.socket_stats();
    let per = |x: u64| x as f64 / msgs.max(1) as f64;
    eprintln!(
        "rank {rank}, per message: datagrams out {:.3} (acks {:.3}, pings {:.3}, retransmits {:.3}), \
         send calls {:.3} (refused {:.3}); datagrams in {:.3}, reads {:.3}, empty reads {:.3}",
        per(k.datagrams_out),
        per(s.acks_sent),
        per(s.pings_sent),
        per(s.retransmits),
        per(k.send_calls),
        per(k.refused),
        per(k.datagrams_in),
        per(k.reads),
        per(k.empty_reads),
    );
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The kernel's cost of moving `bytes` through loopback UDP in `mtu`-byte datagrams: one
/// thread sends a batch (well within the socket buffer, and loopback delivers during the send)
/// and drains it from the receiving socket, so nothing is lost and nothing waits for the
/// scheduler; `reps` times. The median rate of bytes received, in MiB/s.
fn raw_stream(bytes: usize, mtu: usize, reps: usize) -> Res<f64> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    b.set_nonblocking(true)?;
    let _ = nix::sys::socket::setsockopt(&b, nix::sys::socket::sockopt::RcvBuf, &(4 << 20));
    let to = b.local_addr()?;
    let batch = ((128 << 10) / mtu).clamp(1, 32);
    let msg = vec![7u8; mtu];
    let mut buf = vec![0u8; mtu + 1];
    let mut rates = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        let (mut sent, mut got) = (0, 0);
        while sent < bytes {
            for _ in 0..batch {
                sent += a.send_to(&msg, to)?;
            }
            while let Ok((n, _)) = b.recv_from(&mut buf) {
                got += n;
            }
        }
        rates.push(got as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64());
    }
    Ok(median(rates))
}

fn raw_pingpong(n: usize, size: usize) -> Res<f64> {
    let a = UdpSocket::bind("127.0.0.1:0")?;
    let b = UdpSocket::bind("127.0.0.1:0")?;
    a.set_nonblocking(true)?;
    b.set_nonblocking(true)?;
    let (aa, ba) = (a.local_addr()?, b.local_addr()?);
    let warm = n / 10;
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut buf = [0u8; 2048];
            for _ in 0..n + warm {
                let m = loop {
                    if let Ok((m, _)) = b.recv_from(&mut buf) {
                        break m;
                    }
                };
                let _ = b.send_to(&buf[..m], aa);
            }
        });
        let msg = vec![7u8; size];
        let mut buf = [0u8; 2048];
        let mut times = Vec::with_capacity(n);
        for i in 0..n + warm {
            let t = Instant::now();
            a.send_to(&msg, ba).expect("send");
            loop {
                if a.recv_from(&mut buf).is_ok() {
                    break;
                }
            }
            if i >= warm {
                times.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        Ok(median(times))
    })
}

fn am_pingpong(n: usize) -> Res<f64> {
    let transports = Udp::cluster(2, 1 << 16, UdpConfig::default())?;
    let warm = n / 10;
    let results = am_core::run_ranks(transports, |t| -> Result<f64, String> {
        let r = (|| -> Res<f64> {
            let got = Rc::new(std::cell::Cell::new(0u32));
            let g = got.clone();
            let mut h = Handlers::local();
            h.request(PING, "ping", AmKind::Short, |msg, token| {
                let _ = token.reply_short(PONG, msg.args());
            })?;
            h.reply(PONG, "pong", AmKind::Short, move |msg| g.set(msg.args()[0]))?;
            let config = Config::default().wait_mode(WaitMode::Spin);
            let mut node = Node::new(t, h, config)?;
            let mut times = Vec::with_capacity(n);
            if node.rank() == 0 {
                for i in 1..=(n + warm) as u32 {
                    let t = Instant::now();
                    node.request_short(1, PING, &[i])?;
                    node.wait_until(|| got.get() == i)?;
                    if i as usize > warm {
                        times.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                }
            }
            node.barrier()?;
            Ok(if times.is_empty() { 0.0 } else { median(times) })
        })();
        r.map_err(|e| e.to_string())
    });
    let mut it = results.into_iter();
    Ok(it.next().ok_or("no rank 0")??)
}
