//! A small AM program for the multi-process tests, run by `am_launch::Launcher`.
//!
//! - `extoll-rank-test alltoall ROUNDS`: every rank sends ROUNDS Medium requests of 0..8192
//!   bytes (VELO and RMA-buffered, by the configured path) to every rank, checks the echoes,
//!   then one Long put of 64 KiB to the next rank, and checks the data after a barrier.
//! - `extoll-rank-test flood N`: ranks 1.. each fire N Medium requests of 1 KiB at rank 0,
//!   which does not poll until every sender has seen its mailbox full (back-pressure); rank 0
//!   then checks that every request ran exactly once, in order per sender.
//! - `extoll-rank-test kill DIR`: after a barrier, rank 1 writes `DIR/victim` (time of death,
//!   µs since the epoch) and kills itself with SIGKILL; the others ignore SIGTERM, wait at a
//!   barrier, and on `PeerLost` write `DIR/lost-<rank>` (`<lost rank> <µs>`) and exit with 3.
//!   Rank 0 writes the job id to `DIR/job`.
//! - `extoll-rank-test inproc [ITERS]`: two ranks in one thread, taking turns: ITERS NIC-only
//!   Short round trips (a deterministic workload for `valgrind --tool=callgrind`; no
//!   launcher, no AM core, whose start needs both ranks running).
//! - `extoll-rank-test perf [ITERS]` (2 ranks; `--ranks 2` outside a launcher self-launches):
//!   in one run, the raw two-process floors (am_shm::floor), the NIC alone (a Short round trip
//!   without the AM core), AM Short, AM Medium round trips by size over VELO and over RMA
//!   buffers (with the crossover), Long 1 MiB bandwidth, and the one-lock-around-the-NIC cost;
//!   rank 0 prints.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use am_core::{AmError, AmKind, Config, HandlerId, Handlers, Node};
use extoll_sim::{Extoll, ExtollConfig, MediumPath};

const ECHO: HandlerId = HandlerId(1);
const ECHO_REPLY: HandlerId = HandlerId(2);
const SINK: HandlerId = HandlerId(3);

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

type Res = Result<(), Box<dyn std::error::Error>>;

fn main() -> Res {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map(String::as_str).unwrap_or("alltoall");
    if mode == "kill" {
        // Registered before anything else, so the launcher's SIGTERM cannot end us early.
        signal_hook::flag::register(
            signal_hook::consts::SIGTERM,
            std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        )?;
    }
    if mode == "inproc" {
        return inproc(&args);
    }
    if !am_launch::JobInfo::is_launched() {
        if let Some(i) = args.iter().position(|a| a == "--ranks") {
            let n: u32 = args.get(i + 1).ok_or("--ranks N")?.parse()?;
            std::process::exit(am_launch::self_launch(n, Some("extoll"))?);
        }
    }
    let mut job = am_launch::JobInfo::from_env()?;
    if mode == "perf" {
        return perf(job, &args);
    }
    let nic = Extoll::connect(&mut job, 1 << 20, ExtollConfig::from_env()?)?;
    let echoes = Rc::new(Cell::new(0u64));
    let sunk = Rc::new(std::cell::RefCell::new(Vec::<(u32, u32)>::new()));
    let mut h = Handlers::new();
    h.request(ECHO, "echo", AmKind::Medium, |m, tok| {
        let _ = tok.reply_medium(ECHO_REPLY, m.args(), m.payload());
    })?;
    let e = echoes.clone();
    h.reply(ECHO_REPLY, "echo_reply", AmKind::Medium, move |m| {
        let expect: Vec<u8> = (0..m.payload().len())
            .map(|i| (i as u32 ^ m.args()[0]) as u8)
            .collect();
        assert_eq!(m.payload(), &expect[..], "echoed payload");
        e.set(e.get() + 1);
    })?;
    let s = sunk.clone();
    h.request(SINK, "sink", AmKind::Medium, move |m, _tok| {
        assert!(m.payload().iter().all(|&b| b == m.args()[1] as u8));
        s.borrow_mut().push((m.src(), m.args()[0]));
    })?;
    let mut node = Node::new(nic, h, Config::from_env()?)?;
    let (me, n) = (node.rank(), node.size());
    match mode {
        "alltoall" => {
            let rounds: u32 = args.get(1).map_or(Ok(20), |s| s.parse())?;
            for round in 0..rounds {
                for peer in 0..n {
                    let key = round * 1000 + peer;
                    let len = (round as usize * 1237 + peer as usize * 301) % 8193;
                    let data: Vec<u8> = (0..len).map(|i| (i as u32 ^ key) as u8).collect();
                    node.request_medium(peer, ECHO, &[key], &data)?;
                }
            }
            let want = rounds as u64 * n as u64;
            node.wait_until(|| echoes.get() == want)?;
            let next = (me + 1) % n;
            let data: Vec<u8> = (0..65536).map(|i| (i as u32 * 7 + me) as u8).collect();
            node.put(next, me as usize * 65536, &data)?;
            node.barrier()?;
            let prev = (me + n - 1) % n;
            let want: Vec<u8> = (0..65536).map(|i| (i as u32 * 7 + prev) as u8).collect();
            let at = prev as usize * 65536;
            if node.segment()[at..at + 65536] != want[..] {
                return Err(format!("rank {me}: the put from rank {prev} did not land").into());
            }
            node.barrier()?;
            println!("rank {me}/{n}: ok");
        }
        "flood" => {
            let per: u32 = args.get(1).map_or(Ok(200), |s| s.parse())?;
            let mailbox = node.transport().config().mailbox_slots;
            let payload_for = |k: u32| vec![(k % 251) as u8; 1024];
            node.barrier()?;
            if me == 0 {
                // Not polling: the senders must run into a full mailbox. Each tells us so by
                // a file, so the wait is for an event, not a guess of time.
                let dir = std::path::PathBuf::from(args.get(2).ok_or("flood N DIR")?);
                let deadline = Instant::now() + std::time::Duration::from_secs(20);
                while (1..n).any(|r| !dir.join(format!("busy-{r}")).exists()) {
                    if Instant::now() > deadline {
                        return Err("senders never saw a full mailbox".into());
                    }
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                let want = (n - 1) as usize * per as usize;
                node.wait_until(|| sunk.borrow().len() == want)?;
                for r in 1..n {
                    let seqs: Vec<u32> = sunk
                        .borrow()
                        .iter()
                        .filter(|&&(s, _)| s == r)
                        .map(|&(_, k)| k)
                        .collect();
                    if seqs != (0..per).collect::<Vec<_>>() {
                        return Err(format!("from rank {r}: {seqs:?}").into());
                    }
                }
                println!("rank 0: {want} requests, each once, in order (mailbox {mailbox})");
            } else {
                let dir = std::path::PathBuf::from(args.get(2).ok_or("flood N DIR")?);
                let mut k = 0;
                let mut told = false;
                while k < per {
                    match node.try_request_medium(0, SINK, &[k, k % 251], &payload_for(k)) {
                        Ok(()) => k += 1,
                        Err(am_core::TryRequestError::WouldBlock) => {
                            if !told {
                                std::fs::write(dir.join(format!("busy-{me}")), b"")?;
                                told = true;
                            }
                            node.poll()?;
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                if !told {
                    return Err(format!("rank {me}: {per} requests never hit back-pressure").into());
                }
                node.quiesce()?;
            }
            node.barrier()?;
        }
        "kill" => {
            let dir = std::path::PathBuf::from(args.get(1).ok_or("kill DIR")?);
            if me == 0 {
                std::fs::write(dir.join("job"), &job.job_id)?;
            }
            node.barrier()?;
            if me == 1 {
                std::fs::write(dir.join("victim"), now_us().to_string())?;
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL)?;
            }
            match node.barrier() {
                Err(AmError::PeerLost(r)) => {
                    std::fs::write(dir.join(format!("lost-{me}")), format!("{r} {}", now_us()))?;
                    drop(node);
                    drop(job);
                    std::process::exit(3);
                }
                other => return Err(format!("rank {me}: expected PeerLost, got {other:?}").into()),
            }
        }
        other => return Err(format!("unknown mode {other:?}").into()),
    }
    drop(node);
    drop(job);
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The NIC alone between the two processes, without the AM core: rank 0 sends a Short
/// request head and polls for the reply; rank 1 replies from inside its receive closure.
/// `lock` puts the NIC behind a mutex taken per call (the seed's AMLOCK); with `contend`,
/// a second thread of rank 0 takes the same lock in a loop meanwhile. Rank 0 returns the
/// median round trip in µs.
fn nic_only(
    nic: Extoll,
    rank: u32,
    iters: usize,
    lock: bool,
    contend: bool,
) -> Result<(f64, Extoll), Box<dyn std::error::Error>> {
    use am_core::wire::{Header, MAX_HEAD_LEN};
    use am_core::{Category, Outgoing, Transport, Tx};
    use std::sync::{Arc, Mutex};
    let head = |category| {
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = Header {
            category,
            kind: AmKind::Short,
            system: false,
            handler: 1,
            nargs: 0,
            credit: 0,
            payload_len: 0,
            long_offset: 0,
        }
        .encode(&[], &mut h);
        (h, n)
    };
    fn out(head: &[u8]) -> Outgoing<'_> {
        Outgoing {
            head,
            payload: &[],
            long_offset: None,
        }
    }
    let shared = Arc::new(Mutex::new(nic));
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    // Replies seen by any thread of rank 0: whichever thread polls takes the message.
    let replies = Arc::new(AtomicUsize::new(0));
    let other = (rank == 0 && contend).then(|| {
        let (s, stop, replies) = (shared.clone(), stop.clone(), replies.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Another thread of the rank using the NIC: a poll under the lock.
                if let Ok(mut x) = s.lock() {
                    if let Ok(Some(())) = x.poll_recv(|_, _, _| ()) {
                        replies.fetch_add(1, Ordering::Relaxed);
                    }
                }
                // std's Mutex is not fair: let the other thread in between our polls.
                std::thread::yield_now();
            }
        })
    });
    let mut v = Vec::with_capacity(iters);
    let mut got = 0;
    if rank == 0 {
        let (req, n) = head(Category::Request);
        let mut plain = (!lock)
            .then(|| shared.lock().map_err(|_| "poisoned"))
            .transpose()?;
        for i in 0..iters {
            let t = Instant::now();
            match plain.as_deref_mut() {
                Some(x) => {
                    x.try_send(1, &out(&req[..n]))?;
                    while x.poll_recv(|_, _, _| ())?.is_none() {}
                }
                None => {
                    shared
                        .lock()
                        .map_err(|_| "poisoned")?
                        .try_send(1, &out(&req[..n]))?;
                    while replies.load(Ordering::Relaxed) <= i {
                        let mut x = shared.lock().map_err(|_| "poisoned")?;
                        if x.poll_recv(|_, _, _| ())?.is_some() {
                            replies.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
        drop(plain);
    } else {
        let (rep, n) = head(Category::Reply);
        let mut x = shared.lock().map_err(|_| "poisoned")?;
        while got < iters {
            if let Some(r) = x.poll_recv(|_, _, tx| tx.try_send(0, &out(&rep[..n])))? {
                r?;
                got += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    if let Some(t) = other {
        let _ = t.join();
    }
    let nic = Arc::try_unwrap(shared)
        .map_err(|_| "NIC still shared")?
        .into_inner()
        .map_err(|_| "poisoned")?;
    Ok((median(v), nic))
}

/// Two-process floors and AM numbers in one run (rank 0 prints).
fn perf(mut job: am_launch::JobInfo, args: &[String]) -> Res {
    let iters: usize = args
        .get(1)
        .filter(|a| !a.starts_with('-'))
        .map_or(Ok(20000), |s| s.parse())?;
    let (rank, id) = (job.rank, job.job_id.clone());
    fn fence(job: &mut am_launch::JobInfo) -> std::io::Result<()> {
        job.kvs
            .as_mut()
            .ok_or_else(|| std::io::Error::other("no kvs"))?
            .fence()
            .map_err(std::io::Error::other)
    }
    let floor_rtt = am_shm::floor::cacheline_pingpong(&id, rank, iters, &mut || fence(&mut job))?;
    let floor_bw = am_shm::floor::copy_bandwidth(&id, rank, 1 << 20, 200, &mut || fence(&mut job))?;
    let nic = Extoll::connect(&mut job, 2 << 20, ExtollConfig::from_env()?)?;
    let (nic_rtt, nic) = nic_only(nic, rank, iters, false, false)?;
    let (lock_rtt, nic) = nic_only(nic, rank, iters, true, false)?;
    let (contend_rtt, nic) = nic_only(nic, rank, iters / 4, true, true)?;
    // Rank 1 must not send its first AM message (the core's hello) before rank 0's second
    // thread has stopped: that thread takes and drops whatever arrives, and a dropped hello
    // left both ranks waiting for each other for ever.
    fence(&mut job)?;
    let count = Rc::new(Cell::new(0u64));
    let mut h = Handlers::new();
    h.request(HandlerId(1), "s", AmKind::Short, |_m, t| {
        let _ = t.reply_short(HandlerId(2), &[]);
    })?;
    let c = count.clone();
    h.reply(HandlerId(2), "rs", AmKind::Short, move |_m| {
        c.set(c.get() + 1)
    })?;
    h.request(HandlerId(3), "m", AmKind::Medium, |m, t| {
        let _ = t.reply_medium(HandlerId(4), &[], m.payload());
    })?;
    let c = count.clone();
    h.reply(HandlerId(4), "rm", AmKind::Medium, move |_m| {
        c.set(c.get() + 1)
    })?;
    h.request(HandlerId(5), "l", AmKind::Long, |_m, _t| {})?;
    let mut node = Node::new(nic, h, Config::from_env()?)?;
    let sizes = [8usize, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];
    let rtt = |node: &mut Node<Extoll>, size: Option<usize>, n: usize| -> Result<f64, AmError> {
        let data = vec![5u8; size.unwrap_or(0)];
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            let want = count.get() + 1;
            let t = Instant::now();
            match size {
                None => node.request_short(1, HandlerId(1), &[])?,
                Some(_) => node.request_medium(1, HandlerId(3), &[], &data)?,
            }
            node.wait_until(|| count.get() == want)?;
            v.push(t.elapsed().as_secs_f64() * 1e6);
        }
        Ok(median(v))
    };
    let short = if rank == 0 {
        rtt(&mut node, None, iters)?
    } else {
        0.0
    };
    // Medium by size over each path; both ranks switch between barriers.
    let mut table = Vec::new();
    for path in [MediumPath::Velo, MediumPath::Rma] {
        node.transport().set_medium(path);
        node.barrier()?;
        let mut row = Vec::new();
        if rank == 0 {
            for &s in &sizes {
                row.push(rtt(&mut node, Some(s), (iters / 4).max(100))?);
            }
        }
        table.push(row);
        node.barrier()?;
    }
    node.transport()
        .set_medium(ExtollConfig::from_env()?.medium);
    node.barrier()?;
    if rank == 0 {
        let big = vec![9u8; 1 << 20];
        let mut bws = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            for _ in 0..40 {
                node.request_long(1, HandlerId(5), &[], &big, 0)?;
            }
            node.quiesce()?;
            bws.push(40.0 * (1u64 << 20) as f64 / t.elapsed().as_secs_f64());
        }
        let long = median(bws);
        let floor = median(floor_rtt.iter().map(|d| d.as_secs_f64() * 1e6).collect());
        let cfg = node.transport().config();
        println!(
            "config: packet {} B, mailbox {} slots, medium {:?}",
            cfg.packet_size, cfg.mailbox_slots, cfg.medium
        );
        println!("floor cache-line ping-pong (2 processes): {floor:.3} us");
        println!(
            "NIC only Short round trip (no AM core):   {nic_rtt:.3} us ({:.2}x floor)",
            nic_rtt / floor
        );
        println!(
            "  same, NIC behind one lock (AMLOCK):     {lock_rtt:.3} us; with a 2nd thread polling under it: {contend_rtt:.3} us"
        );
        println!(
            "AM Short round trip (extoll, 2 procs):    {short:.3} us ({:.2}x floor)",
            short / floor
        );
        let seed = [2.8, 2.8, 3.5, 3.9, 4.9, 6.7];
        println!("Medium round trip by payload size (us); VELO half round trip next to the seed's VELO (2013 HW):");
        println!(
            "  size   VELO rtt   RMA rtt  faster  | VELO half   seed VELO half  (ratio to its 8 B)"
        );
        let mut crossover = None;
        for (i, &s) in sizes.iter().enumerate() {
            let (v, r) = (table[0][i], table[1][i]);
            if r < v && crossover.is_none() {
                crossover = Some(s);
            }
            if r >= v {
                crossover = None;
            }
            let seed_s = seed
                .get(i)
                .map(|x| format!("{x:.1} ({:.2}x)", x / seed[0]))
                .unwrap_or_else(|| "-".into());
            println!(
                "  {s:>5}  {v:>8.3}  {r:>8.3}  {:>5}   | {:>8.3} ({:.2}x)  {seed_s}",
                if r < v { "RMA" } else { "VELO" },
                v / 2.0,
                v / table[0][0],
            );
        }
        match crossover {
            Some(s) => println!("crossover: RMA faster from {s} B on"),
            None => println!("crossover: none (VELO faster at the largest size)"),
        }
        println!(
            "floor copy 1 MiB (2 processes):           {:.2} GB/s",
            floor_bw / 1e9
        );
        println!(
            "AM Long 1 MiB bandwidth (RMA put):        {:.2} GB/s ({:.0}% of floor)",
            long / 1e9,
            100.0 * long / floor_bw
        );
    }
    node.barrier()?;
    drop(node);
    drop(job);
    Ok(())
}

/// Two ranks in one thread, taking turns (see the module docs).
fn inproc(args: &[String]) -> Res {
    use am_core::wire::{Header, MAX_HEAD_LEN};
    use am_core::{Category, Outgoing, Transport, Tx};
    let iters: usize = args.get(1).map_or(Ok(100_000), |s| s.parse())?;
    let mut ranks = Extoll::cluster(2, 1 << 16, ExtollConfig::from_env()?)?;
    let mut b = ranks.pop().ok_or("rank 1")?;
    let mut a = ranks.pop().ok_or("rank 0")?;
    let head = |category| {
        let mut h = [0u8; MAX_HEAD_LEN];
        let n = Header {
            category,
            kind: AmKind::Short,
            system: false,
            handler: 1,
            nargs: 0,
            credit: 0,
            payload_len: 0,
            long_offset: 0,
        }
        .encode(&[], &mut h);
        (h, n)
    };
    let ((req, rn), (rep, pn)) = (head(Category::Request), head(Category::Reply));
    fn out(head: &[u8]) -> Outgoing<'_> {
        Outgoing {
            head,
            payload: &[],
            long_offset: None,
        }
    }
    let t = Instant::now();
    for _ in 0..iters {
        a.try_send(1, &out(&req[..rn]))?;
        while b
            .poll_recv(|_, _, tx| tx.try_send(0, &out(&rep[..pn])))?
            .transpose()?
            .is_none()
        {}
        while a.poll_recv(|_, _, _| ())?.is_none() {}
    }
    let nic = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    println!("in one thread: NIC-only Short round trip {nic:.3} us");
    Ok(())
}
