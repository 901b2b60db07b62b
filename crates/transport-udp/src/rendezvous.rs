//! Address exchange: through the launcher's key-value store, or through a small TCP
//! coordinator served by rank 0 (`AM_COORD=host:port`). Control plane only, off the data path.

use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use am_bootstrap::{JobInfo, KeyValueStore};

use crate::config::UdpConfig;
use crate::error::{io_err, UdpError};
use crate::wire::{Authenticator, JobKey};

/// How long ranks wait for each other at start-up.
const RENDEZVOUS_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest coordinator line accepted.
const MAX_LINE: u64 = 512;
const KEY_ENTRY: &str = "am-udp-key";

/// The address peers should send to: the bound one, or for a wildcard bind the configured or
/// host-name address.
pub(crate) fn advertised(socket: &UdpSocket, config: &UdpConfig) -> Result<SocketAddr, UdpError> {
    let local = socket
        .local_addr()
        .map_err(io_err("reading the socket address"))?;
    if !local.ip().is_unspecified() {
        return Ok(local);
    }
    let ip = match config.advertise {
        Some(ip) => ip,
        None => host_ip()?,
    };
    Ok(SocketAddr::new(ip, local.port()))
}

fn host_ip() -> Result<IpAddr, UdpError> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_err(io_err("reading the host name"))?;
    let addrs: Vec<IpAddr> = (name.trim(), 0)
        .to_socket_addrs()
        .map_err(io_err(format!("resolving the host name {:?}", name.trim())))?
        .map(|a| a.ip())
        .collect();
    addrs
        .iter()
        .find(|ip| !ip.is_loopback())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| {
            UdpError::Rendezvous("the host name has no address: set AM_UDP_ADVERTISE".into())
        })
}

/// A rank's address and epoch, as learned at rendezvous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr {
    /// Where its socket is.
    pub addr: SocketAddr,
    /// Its random epoch (non-zero, fresh each time a transport is created).
    pub epoch: u64,
}

/// What a rank tells the others at start-up: where it is, its epoch, and the largest
/// datagram it sends and can receive (`AM_UDP_MTU`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) peer: PeerAddr,
    pub(crate) mtu: usize,
}

/// `<epoch>@<addr>/<mtu>`.
fn entry(e: Entry) -> String {
    format!("{:016x}@{}/{}", e.peer.epoch, e.peer.addr, e.mtu)
}

fn parse_entry(s: &str) -> Option<Entry> {
    let (epoch, rest) = s.trim().split_once('@')?;
    let (addr, mtu) = rest.rsplit_once('/')?;
    let epoch = u64::from_str_radix(epoch, 16).ok().filter(|&e| e != 0)?;
    Some(Entry {
        peer: PeerAddr {
            addr: addr.parse().ok()?,
            epoch,
        },
        mtu: mtu.parse().ok()?,
    })
}

/// The datagram size every rank of the job uses: the smallest any rank was configured with
/// (`AM_UDP_MTU`), so that nobody sends a datagram a peer's receive buffer would cut short
/// (which looks like loss that no retransmission repairs). A size outside what this
/// transport supports, announced by a peer, is an error naming that rank.
pub(crate) fn agreed_mtu(entries: &[Entry]) -> Result<usize, UdpError> {
    let mut mtu = usize::MAX;
    for (r, e) in entries.iter().enumerate() {
        if !(crate::config::MIN_MTU..=crate::config::MAX_MTU).contains(&e.mtu) {
            return Err(UdpError::PeerMtu {
                peer: r as u32,
                mtu: e.mtu,
            });
        }
        mtu = mtu.min(e.mtu);
    }
    Ok(mtu)
}

/// Exchanges addresses, epochs and (if needed) the key with the other ranks.
pub(crate) fn exchange(
    job: &mut JobInfo,
    config: &UdpConfig,
    me: SocketAddr,
    epoch: u64,
) -> Result<(Vec<Entry>, JobKey), UdpError> {
    let mine = Entry {
        peer: PeerAddr { addr: me, epoch },
        mtu: config.engine.mtu,
    };
    if job.size == 1 {
        let key = match &config.key {
            Some(k) => k.clone(),
            None => JobKey::generate().map_err(io_err("reading /dev/urandom"))?,
        };
        return Ok((vec![mine], key));
    }
    if let Some(kvs) = job.kvs.as_deref_mut() {
        return via_kvs(
            kvs,
            &job.job_id,
            job.rank,
            job.size,
            config.key.clone(),
            mine,
        );
    }
    if let Some(coord) = &config.coord {
        let key = config.key.clone().ok_or(UdpError::KeyRequired)?;
        let auth = Authenticator::new(&key, &job.job_id);
        let peers = via_coordinator(coord, job.rank, job.size, &auth, mine)?;
        return Ok((peers, key));
    }
    Err(UdpError::NoRendezvous {
        launcher: job.launcher,
        seen: am_bootstrap::launcher_variables_seen(),
    })
}

/// Key confirmation: a MAC under the job key over a rank's published entry. Every rank
/// checks every other rank's, so ranks started with different keys fail at start-up with
/// [`UdpError::KeyMismatch`] rather than losing each other once every datagram fails.
fn key_confirmation(rank: u32, entry_text: &str) -> String {
    format!("key confirmation {rank} {entry_text}")
}

fn via_kvs(
    kvs: &mut (dyn KeyValueStore + Send),
    job_id: &str,
    rank: u32,
    size: u32,
    key: Option<JobKey>,
    mine: Entry,
) -> Result<(Vec<Entry>, JobKey), UdpError> {
    // Fallback when the launcher gave no key: rank 0 makes one and shares it through the store
    // (readable by whoever can read the store; see the threat model).
    let mut key = key;
    if rank == 0 && key.is_none() {
        let k = JobKey::generate().map_err(io_err("reading /dev/urandom"))?;
        kvs.put(KEY_ENTRY, &k.to_hex())?;
        key = Some(k);
    }
    // `<entry>#<key confirmation>` (store values hold no spaces), or `<entry>#-` from a rank
    // that takes rank 0's key from the store (it has no key of its own to confirm).
    let text = entry(mine);
    let confirmation = key.as_ref().map_or_else(
        || "-".to_owned(),
        |k| Authenticator::new(k, job_id).tag_text(&key_confirmation(rank, &text)),
    );
    kvs.put(
        &format!("am-udp-addr-{rank}"),
        &format!("{text}#{confirmation}"),
    )?;
    kvs.fence()?;
    let key = match key {
        Some(k) => k,
        None => JobKey::from_hex(&kvs.get(KEY_ENTRY)?).map_err(UdpError::Key)?,
    };
    let auth = Authenticator::new(&key, job_id);
    let mut mismatched = Vec::new();
    let mut peers = Vec::with_capacity(size as usize);
    for r in 0..size {
        if r == rank {
            peers.push(mine);
            continue;
        }
        let v = kvs.get(&format!("am-udp-addr-{r}"))?;
        let invalid =
            || UdpError::Rendezvous(format!("rank {r} published an invalid address {v:?}"));
        let (text, confirmation) = v.trim().rsplit_once('#').ok_or_else(invalid)?;
        peers.push(parse_entry(text).ok_or_else(invalid)?);
        if confirmation != "-" && !auth.verify_text(&key_confirmation(r, text), confirmation) {
            mismatched.push(r);
        }
    }
    if !mismatched.is_empty() {
        return Err(UdpError::KeyMismatch {
            rank,
            peers: mismatched,
        });
    }
    Ok((peers, key))
}

/// The coordinator's first line on every connection: `AMUDP1 CHALLENGE <32 hex digits>`, a
/// fresh random nonce the registration must answer, so a registration captured in one job
/// cannot be replayed in another (even one with the same key and job id).
fn challenge_line(nonce: &str) -> String {
    format!("AMUDP1 CHALLENGE {nonce}\n")
}

fn parse_challenge(line: &str) -> Option<String> {
    let nonce = line.trim_end().strip_prefix("AMUDP1 CHALLENGE ")?;
    (nonce.len() == 32 && nonce.bytes().all(|b| b.is_ascii_hexdigit())).then(|| nonce.to_owned())
}

fn fresh_nonce() -> std::io::Result<String> {
    let mut n = [0u8; 16];
    crate::wire::random_bytes(&mut n)?;
    Ok(crate::wire::hex(&n))
}

/// Registration line: `AMUDP1 <job tag> <rank> <size> <epoch>@<addr> <nonce> <mac>`.
fn registration(auth: &Authenticator, rank: u32, size: u32, mine: Entry, nonce: &str) -> String {
    let body = format!(
        "AMUDP1 {:016x} {rank} {size} {} {nonce}",
        auth.job_tag(),
        entry(mine)
    );
    let mac = auth.tag_text(&body);
    format!("{body} {mac}\n")
}

/// Checks a registration line answering `nonce`; returns the rank and its address.
fn parse_registration(
    auth: &Authenticator,
    size: u32,
    nonce: &str,
    line: &str,
) -> Option<(u32, Entry)> {
    let line = line.trim_end();
    let (body, mac) = line.rsplit_once(' ')?;
    if !auth.verify_text(body, mac) {
        return None;
    }
    let mut f = body.split(' ');
    if f.next()? != "AMUDP1" || f.next()? != format!("{:016x}", auth.job_tag()) {
        return None;
    }
    let rank: u32 = f.next()?.parse().ok()?;
    let their_size: u32 = f.next()?.parse().ok()?;
    let peer = parse_entry(f.next()?)?;
    if f.next()? != nonce || f.next().is_some() || their_size != size || rank >= size {
        return None;
    }
    Some((rank, peer))
}

/// Whether a registration that failed [`parse_registration`] is of this job and answers
/// `nonce`, so only its MAC is wrong: the rank was started with another key. (Anyone can
/// write such a line; it only earns its own connection the [`KEY_MISMATCH`] answer.)
fn is_key_mismatch(auth: &Authenticator, nonce: &str, line: &str) -> bool {
    let f: Vec<&str> = line.trim_end().split(' ').collect();
    f.len() == 7 && f[0] == "AMUDP1" && f[1] == format!("{:016x}", auth.job_tag()) && f[5] == nonce
}

/// The coordinator's answer to a valid registration, at once: `AMUDP1 REGISTERED <mac>`, the
/// MAC (under the job key) of the registration it answers. The registration holds the
/// coordinator's fresh challenge and the rank's fresh epoch, so the answer cannot be replayed
/// from another connection or run, and the rank knows within [`ANSWER_TIMEOUT`] whether it
/// talks to its own rank 0 or to whatever else holds the port, instead of waiting out the
/// whole start-up for a table that will never verify.
fn registered_line(auth: &Authenticator, registration: &str) -> String {
    let mac = auth.tag_text(&format!("registered {}", registration.trim_end()));
    format!("{REGISTERED} {mac}\n")
}

const REGISTERED: &str = "AMUDP1 REGISTERED";

/// How long a rank waits for the coordinator's challenge, and for its answer to the
/// registration: the coordinator sends both at once (it polls every 100 ms), so only a
/// coordinator that is not this job's, or a machine stalled for seconds, takes longer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// The coordinator's answer to a registration whose MAC is wrong but which is otherwise of
/// this job: the rank's key differs from rank 0's.
const KEY_MISMATCH: &str = "AMUDP1 KEY-MISMATCH";

/// The coordinator's notice that two processes registered as one rank:
/// `AMUDP1 CONFLICT <rank> <mac>`, sent instead of the answer to a registration or instead of
/// the table. The MAC covers the rank and the registration the notice goes to (its
/// connection's challenge, its rank's fresh epoch), so it cannot be replayed to another.
const CONFLICT: &str = "AMUDP1 CONFLICT";

fn conflict_text(rank: u32, registration: &str) -> String {
    format!("conflict {rank} {}", registration.trim_end())
}

fn conflict_line(auth: &Authenticator, rank: u32, registration: &str) -> String {
    let mac = auth.tag_text(&conflict_text(rank, registration));
    format!("{CONFLICT} {rank} {mac}\n")
}

/// What a conflict notice in answer to `registration` says: `None` if `line` is none,
/// `Some(Ok(rank))` if it is authentic, `Some(Err(()))` if it is not.
fn parse_conflict(auth: &Authenticator, registration: &str, line: &str) -> Option<Result<u32, ()>> {
    let rest = line.trim_end().strip_prefix(CONFLICT)?.strip_prefix(' ');
    let authentic = rest.and_then(|r| {
        let (rank, mac) = r.split_once(' ')?;
        let rank: u32 = rank.parse().ok()?;
        auth.verify_text(&conflict_text(rank, registration), mac)
            .then_some(rank)
    });
    Some(authentic.ok_or(()))
}

/// The MAC that ends the table sent to the connection that answered `nonce`: a table
/// captured by one connection is not accepted by another.
fn table_mac(auth: &Authenticator, table: &str, nonce: &str) -> String {
    auth.tag_text(&format!("{table}{nonce}"))
}

fn table_text(peers: &[Entry]) -> String {
    let mut t = String::new();
    for (r, p) in peers.iter().enumerate() {
        t.push_str(&format!("{r} {}\n", entry(*p)));
    }
    t
}

/// How long one connection may take to send its registration line.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);

/// A connection whose registration line has not fully arrived.
struct Pending {
    stream: TcpStream,
    nonce: String,
    line: Vec<u8>,
    since: Instant,
}

/// A connection whose registration was accepted: it waits for the table.
struct Registered {
    stream: TcpStream,
    /// Its registration line (what a conflict notice to it is bound to).
    line: String,
    /// The challenge it answered (what its table is bound to).
    nonce: String,
}

/// Rank 0's coordinator: collects every rank's authenticated registration, then sends each
/// the whole table (authenticated). Strangers' connections are dropped and do not count.
///
/// Connections are served together, never one at a time: each is non-blocking and read as
/// its bytes come, gets [`REGISTRATION_TIMEOUT`] to send one line of at most [`MAX_LINE`]
/// bytes, and at most `4 * size + 16` wait at once (the oldest goes), so idle or slow
/// connections cannot delay or stop a job's start-up.
///
/// A rank registered again with the same entry (address, epoch, datagram size: the same
/// process) is answered again, and its new connection gets the table too. A rank registered
/// again with another entry is a conflict: two processes claim it, and the coordinator cannot
/// tell which is the job's. It then answers every registration it holds and every one that
/// comes later with an authenticated [`CONFLICT`] notice naming the rank, instead of the
/// table, so each rank fails with [`UdpError::ConflictingRegistration`]; it stops once every
/// rank was told (or at the start-up deadline).
fn serve(listener: TcpListener, auth: Authenticator, size: u32) {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let deadline = Instant::now() + RENDEZVOUS_TIMEOUT;
    let max_pending = 4 * size as usize + 16;
    // Per rank: its entry and the connections that registered it.
    let mut slots: Vec<Option<(Entry, Vec<Registered>)>> = (0..size).map(|_| None).collect();
    // The rank registered twice with different entries, and which ranks were told.
    let mut conflict: Option<u32> = None;
    let mut told = vec![false; size as usize];
    let mut pending: Vec<Pending> = Vec::new();
    let _ = listener.set_nonblocking(true);
    loop {
        match conflict {
            None if slots.iter().all(Option::is_some) => break,
            Some(_) if told.iter().all(|&t| t) => return,
            _ => {}
        }
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        // Everything waiting to be accepted.
        while let Ok((mut stream, _)) = listener.accept() {
            let Ok(nonce) = fresh_nonce() else {
                continue;
            };
            // The challenge is one short line: it fits the new socket's send buffer.
            if stream.write_all(challenge_line(&nonce).as_bytes()).is_err()
                || stream.set_nonblocking(true).is_err()
            {
                continue;
            }
            if pending.len() >= max_pending {
                pending.remove(0);
            }
            pending.push(Pending {
                stream,
                nonce,
                line: Vec::new(),
                since: now,
            });
        }
        // Whatever each connection has sent; a full line is judged at once.
        let mut i = 0;
        while i < pending.len() {
            match read_some(&mut pending[i]) {
                Progress::Waiting if now < pending[i].since + REGISTRATION_TIMEOUT => i += 1,
                Progress::Line => {
                    let p = pending.swap_remove(i);
                    let line = String::from_utf8_lossy(&p.line).into_owned();
                    if let Some((rank, peer)) = parse_registration(&auth, size, &p.nonce, &line) {
                        // A blocking stream again for the answers; each is one short line
                        // (which fits the socket's send buffer) or the table.
                        let mut stream = p.stream;
                        let _ = stream.set_nonblocking(false);
                        let _ = stream.set_write_timeout(Some(REGISTRATION_TIMEOUT));
                        let clashes = slots[rank as usize]
                            .as_ref()
                            .is_some_and(|(e, _)| *e != peer);
                        if conflict.is_none() && clashes {
                            // The newcomer first, then everyone registered so far.
                            conflict = Some(rank);
                            let _ = stream.write_all(conflict_line(&auth, rank, &line).as_bytes());
                            told[rank as usize] = true;
                            for (r, slot) in slots.iter_mut().enumerate() {
                                for mut c in slot.take().map_or_else(Vec::new, |(_, c)| c) {
                                    let notice = conflict_line(&auth, rank, &c.line);
                                    let _ = c.stream.write_all(notice.as_bytes());
                                    told[r] = true;
                                }
                            }
                        } else if let Some(c) = conflict {
                            let _ = stream.write_all(conflict_line(&auth, c, &line).as_bytes());
                            told[rank as usize] = true;
                        } else {
                            let _ = stream.write_all(registered_line(&auth, &line).as_bytes());
                            let (_, conns) = slots[rank as usize].get_or_insert((peer, Vec::new()));
                            conns.push(Registered {
                                stream,
                                line,
                                nonce: p.nonce,
                            });
                        }
                    } else if is_key_mismatch(&auth, &p.nonce, &line) {
                        // One short line: it fits the socket's send buffer.
                        let mut stream = p.stream;
                        let _ = stream.write_all(format!("{KEY_MISMATCH}\n").as_bytes());
                    }
                }
                // Closed, too long, or too slow: dropped.
                Progress::Waiting | Progress::Done => {
                    pending.swap_remove(i);
                }
            }
        }
        let mut fds = vec![PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        fds.extend(
            pending
                .iter()
                .map(|p| PollFd::new(p.stream.as_fd(), PollFlags::POLLIN)),
        );
        let _ = poll(&mut fds, PollTimeout::from(100u16));
    }
    let peers: Vec<Entry> = slots.iter().flatten().map(|(p, _)| *p).collect();
    let table = table_text(&peers);
    for (_, conns) in slots.into_iter().flatten() {
        for mut c in conns {
            let reply = format!("{table}END {}\n", table_mac(&auth, &table, &c.nonce));
            let _ = c.stream.write_all(reply.as_bytes());
        }
    }
}

enum Progress {
    /// No full line yet.
    Waiting,
    /// A full line (newline included) is in `line`.
    Line,
    /// Closed, failed or longer than [`MAX_LINE`]: drop it.
    Done,
}

/// Reads what a non-blocking connection has, up to one line.
fn read_some(p: &mut Pending) -> Progress {
    let mut buf = [0u8; 256];
    loop {
        match p.stream.read(&mut buf) {
            Ok(0) => return Progress::Done,
            Ok(n) => {
                let chunk = &buf[..n];
                if let Some(end) = chunk.iter().position(|&b| b == b'\n') {
                    p.line.extend_from_slice(&chunk[..=end]);
                    return if p.line.len() as u64 <= MAX_LINE {
                        Progress::Line
                    } else {
                        Progress::Done
                    };
                }
                p.line.extend_from_slice(chunk);
                if p.line.len() as u64 > MAX_LINE {
                    return Progress::Done;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Progress::Waiting,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Progress::Done,
        }
    }
}

use std::io::Read;

fn via_coordinator(
    coord: &str,
    rank: u32,
    size: u32,
    auth: &Authenticator,
    mine: Entry,
) -> Result<Vec<Entry>, UdpError> {
    let bad = |why: String| UdpError::Rendezvous(format!("coordinator AM_COORD={coord}: {why}"));
    let target = coord
        .to_socket_addrs()
        .map_err(io_err(format!("resolving AM_COORD={coord}")))?
        .next()
        .ok_or_else(|| bad("no address".into()))?;
    let read_failed =
        |why: &str, source: Option<std::io::Error>| UdpError::CoordinatorNotAuthentic {
            coord: coord.to_owned(),
            why: why.to_owned(),
            source,
        };
    let not_authentic = |why: &str| read_failed(why, None);
    let mut server = None;
    if rank == 0 {
        let listener = TcpListener::bind(target).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AddrInUse {
                UdpError::CoordinatorPortTaken {
                    coord: coord.to_owned(),
                }
            } else {
                io_err(format!("serving the coordinator at AM_COORD={coord}"))(e)
            }
        })?;
        let auth = auth.clone();
        server = Some(
            std::thread::Builder::new()
                .name("am-udp-coordinator".into())
                .spawn(move || serve(listener, auth, size))
                .map_err(io_err("starting the coordinator thread"))?,
        );
    }
    let deadline = Instant::now() + RENDEZVOUS_TIMEOUT;
    let mut stream = loop {
        match TcpStream::connect_timeout(&target, Duration::from_secs(1)) {
            Ok(s) => break s,
            Err(e) if Instant::now() >= deadline => {
                return Err(io_err(format!(
                    "connecting to the coordinator at AM_COORD={coord}"
                ))(e));
            }
            // Rank 0 may not be up yet: retry (a start-up backoff, not a synchronisation).
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    // The challenge and the answer to the registration come at once from a real coordinator.
    let _ = stream.set_read_timeout(Some(ANSWER_TIMEOUT));
    let mut reader = BufReader::new(
        stream
            .try_clone()
            .map_err(io_err("reading from the coordinator"))?
            .take(MAX_LINE * (size as u64 + 4)),
    );
    let mut first = String::new();
    reader
        .read_line(&mut first)
        .map_err(|e| read_failed("no challenge", Some(e)))?;
    let nonce = parse_challenge(&first).ok_or_else(|| not_authentic("no challenge"))?;
    let reg = registration(auth, rank, size, mine, &nonce);
    stream
        .write_all(reg.as_bytes())
        .map_err(io_err("registering with the coordinator"))?;
    let mut answer = String::new();
    reader
        .read_line(&mut answer)
        .map_err(|e| read_failed("no answer to the registration", Some(e)))?;
    // On a conflict, rank 0 returns only once its coordinator has told every rank (or gave
    // up at the start-up deadline): the coordinator ends with rank 0's process, and a rank
    // still to register would then wait for the deadline instead of learning of the conflict.
    let conflict = |rank, server: Option<std::thread::JoinHandle<()>>| {
        if let Some(s) = server {
            let _ = s.join();
        }
        UdpError::ConflictingRegistration {
            coord: coord.to_owned(),
            rank,
        }
    };
    match parse_conflict(auth, &reg, &answer) {
        Some(Ok(rank)) => return Err(conflict(rank, server.take())),
        Some(Err(())) => {
            return Err(not_authentic(
                "its conflict notice is not authenticated with this job's key",
            ))
        }
        None => {}
    }
    if answer.trim_end() == KEY_MISMATCH {
        // Not authenticated (a rank with another key could not check it): a squatter can
        // say it too, which only fails a start-up it could stop anyway.
        return Err(UdpError::KeyMismatch {
            rank,
            peers: vec![0],
        });
    }
    let proof = answer
        .trim_end()
        .strip_prefix(REGISTERED)
        .and_then(|m| m.strip_prefix(' '))
        .ok_or_else(|| not_authentic("no answer to the registration"))?;
    if !auth.verify_text(&format!("registered {}", reg.trim_end()), proof) {
        return Err(not_authentic(
            "its answer to the registration is not authenticated with this job's key",
        ));
    }
    // Now the table, once every rank registered.
    let _ = stream.set_read_timeout(Some(RENDEZVOUS_TIMEOUT));
    let mut table = String::new();
    let mut peers = Vec::with_capacity(size as usize);
    loop {
        let mut line = String::new();
        let n = reader
            .read_line(&mut line)
            .map_err(io_err("reading the coordinator's answer"))?;
        if n == 0 {
            return Err(bad(
                "closed before answering (wrong key or job, or timed out)".into(),
            ));
        }
        match parse_conflict(auth, &reg, &line) {
            Some(Ok(rank)) => return Err(conflict(rank, server.take())),
            Some(Err(())) => return Err(bad("a conflict notice that is not authentic".into())),
            None => {}
        }
        if let Some(mac) = line.trim_end().strip_prefix("END ") {
            if !auth.verify_text(&format!("{table}{nonce}"), mac) || peers.len() != size as usize {
                return Err(bad("the address table is not authentic".into()));
            }
            break;
        }
        table.push_str(&line);
        let (r, e) = line
            .trim_end()
            .split_once(' ')
            .ok_or_else(|| bad("malformed answer".into()))?;
        if r.parse::<usize>().ok() != Some(peers.len()) {
            return Err(bad("malformed answer".into()));
        }
        peers.push(parse_entry(e).ok_or_else(|| bad("malformed address".into()))?);
    }
    if peers[rank as usize] != mine {
        return Err(bad("the table does not list this rank as registered".into()));
    }
    Ok(peers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registrations_are_authenticated() {
        let auth = Authenticator::new(&JobKey::from_bytes([1; 32]), "job");
        let other = Authenticator::new(&JobKey::from_bytes([2; 32]), "job");
        let mine = Entry {
            peer: PeerAddr {
                addr: "127.0.0.1:4000".parse().unwrap(),
                epoch: 0x1234,
            },
            mtu: 1472,
        };
        let nonce = fresh_nonce().unwrap();
        let line = registration(&auth, 2, 4, mine, &nonce);
        assert_eq!(parse_registration(&auth, 4, &nonce, &line), Some((2, mine)));
        assert_eq!(
            parse_registration(&auth, 5, &nonce, &line),
            None,
            "size differs"
        );
        assert_eq!(
            parse_registration(&other, 4, &nonce, &line),
            None,
            "other key"
        );
        let forged = line.replace("4000", "4001");
        assert_eq!(parse_registration(&auth, 4, &nonce, &forged), None);
        assert_eq!(parse_registration(&auth, 4, &nonce, "garbage"), None);
        assert_eq!(parse_registration(&auth, 4, &nonce, ""), None);
        // The same line answering another connection's challenge: a replay, refused.
        let other_nonce = fresh_nonce().unwrap();
        assert_ne!(nonce, other_nonce);
        assert_eq!(
            parse_registration(&auth, 4, &other_nonce, &line),
            None,
            "replayed"
        );
        // The datagram size is part of what is authenticated.
        let forged = line.replace("/1472 ", "/9000 ");
        assert_ne!(forged, line);
        assert_eq!(parse_registration(&auth, 4, &nonce, &forged), None);
        // Challenges are 128-bit hex.
        assert_eq!(parse_challenge(&challenge_line(&nonce)), Some(nonce));
        assert_eq!(parse_challenge("AMUDP1 CHALLENGE xyz\n"), None);
    }

    /// A launcher's key-value store in memory, for threads: puts are visible after a fence.
    struct MemStore {
        map: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, String>>>,
        fence: std::sync::Arc<std::sync::Barrier>,
    }

    impl KeyValueStore for MemStore {
        fn put(&mut self, key: &str, value: &str) -> Result<(), am_bootstrap::BootstrapError> {
            // As PMI's: printable ASCII without space, ';' or backslash.
            assert!(
                value
                    .bytes()
                    .all(|b| b.is_ascii_graphic() && b != b';' && b != b'\\'),
                "{value:?}"
            );
            self.map.lock().unwrap().insert(key.into(), value.into());
            Ok(())
        }
        fn fence(&mut self) -> Result<(), am_bootstrap::BootstrapError> {
            self.fence.wait();
            Ok(())
        }
        fn get(&mut self, key: &str) -> Result<String, am_bootstrap::BootstrapError> {
            Ok(self.map.lock().unwrap()[key].clone())
        }
        fn abort(&mut self, _: i32, _: &str) -> Result<(), am_bootstrap::BootstrapError> {
            Ok(())
        }
    }

    /// Rank r of 3 runs `via_kvs` with `keys[r]` (`None`: take rank 0's from the store).
    fn kvs_job(keys: [Option<[u8; 32]>; 3]) -> Vec<Result<(Vec<Entry>, JobKey), UdpError>> {
        let map = std::sync::Arc::default();
        let fence = std::sync::Arc::new(std::sync::Barrier::new(3));
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..3u32)
                .map(|r| {
                    let mut store = MemStore {
                        map: std::sync::Arc::clone(&map),
                        fence: std::sync::Arc::clone(&fence),
                    };
                    let key = keys[r as usize].map(JobKey::from_bytes);
                    s.spawn(move || {
                        let mine = Entry {
                            peer: PeerAddr {
                                addr: format!("127.0.0.1:{}", 7000 + r).parse().unwrap(),
                                epoch: 300 + r as u64,
                            },
                            mtu: 1472,
                        };
                        via_kvs(&mut store, "job-k", r, 3, key, mine)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    #[test]
    fn a_rank_with_another_key_fails_start_up_with_key_mismatch() {
        let (a, b) = (Some([1u8; 32]), Some([2u8; 32]));
        for r in kvs_job([a, a, a]) {
            assert_eq!(r.unwrap().0.len(), 3);
        }
        // No key from the launcher: rank 0 makes one and the others take it from the store.
        for r in kvs_job([None, None, None]) {
            assert_eq!(r.unwrap().0.len(), 3);
        }
        let results = kvs_job([a, b, a]);
        for (rank, r) in results.into_iter().enumerate() {
            let want = if rank == 1 { vec![0, 2] } else { vec![1] };
            match r {
                Err(UdpError::KeyMismatch { rank: me, peers }) => {
                    assert_eq!((me, peers), (rank as u32, want));
                }
                other => panic!("rank {rank}: {other:?}"),
            }
        }
    }

    #[test]
    fn text_macs_verify_only_exactly() {
        let auth = Authenticator::new(&JobKey::from_bytes([1; 32]), "job");
        let mac = auth.tag_text("hello");
        assert!(auth.verify_text("hello", &mac));
        assert!(!auth.verify_text("hellp", &mac));
        assert!(!auth.verify_text("hello", &mac[..mac.len() - 1]));
        assert!(!auth.verify_text("hello", ""));
        let mut flipped = mac.clone().into_bytes();
        flipped[0] ^= 1;
        assert!(!auth.verify_text("hello", &String::from_utf8(flipped).unwrap()));
    }

    #[test]
    fn ranks_agree_on_the_smallest_datagram_size() {
        let e = |mtu| Entry {
            peer: PeerAddr {
                addr: "127.0.0.1:4000".parse().unwrap(),
                epoch: 1,
            },
            mtu,
        };
        assert_eq!(parse_entry(&entry(e(9000))), Some(e(9000)));
        assert_eq!(parse_entry("0000000000000001@127.0.0.1:4000"), None);
        assert_eq!(agreed_mtu(&[e(9000), e(1472), e(4000)]).unwrap(), 1472);
        match agreed_mtu(&[e(1472), e(100_000)]) {
            Err(UdpError::PeerMtu {
                peer: 1,
                mtu: 100_000,
            }) => {}
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn idle_and_slow_connections_do_not_hold_the_coordinator() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let coord = format!("127.0.0.1:{port}");
        let auth = Authenticator::new(&JobKey::from_bytes([6; 32]), "job-i");
        // Rank 0 serves; before the others register, ten strangers connect and say nothing
        // and one sends a byte every 100 ms. Served one at a time with a 5 s read timeout
        // each, they held start-up back by 50 s; served together, not at all.
        let started = Instant::now();
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3u32)
                .map(|r| {
                    let (coord, auth) = (coord.clone(), auth.clone());
                    s.spawn(move || {
                        let mine = Entry {
                            peer: PeerAddr {
                                addr: format!("127.0.0.1:{}", 6000 + r).parse().unwrap(),
                                epoch: 200 + r as u64,
                            },
                            mtu: 1472 + r as usize,
                        };
                        let mut strangers = Vec::new();
                        if r != 0 {
                            // Wait for rank 0's listener, then crowd it.
                            let deadline = Instant::now() + Duration::from_secs(10);
                            while strangers.is_empty() && Instant::now() < deadline {
                                if let Ok(s) = TcpStream::connect(&coord) {
                                    strangers.push(s);
                                } else {
                                    std::thread::sleep(Duration::from_millis(5));
                                }
                            }
                            for _ in 0..9 {
                                strangers.extend(TcpStream::connect(&coord).ok());
                            }
                        }
                        let dribble = (r == 1).then(|| {
                            let coord = coord.clone();
                            std::thread::spawn(move || {
                                if let Ok(mut s) = TcpStream::connect(&coord) {
                                    for _ in 0..50 {
                                        if s.write_all(b"A").is_err() {
                                            break;
                                        }
                                        std::thread::sleep(Duration::from_millis(100));
                                    }
                                }
                            })
                        });
                        let got = via_coordinator(&coord, r, 3, &auth, mine);
                        drop(strangers);
                        drop(dribble);
                        got
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            assert_eq!(r.unwrap().len(), 3);
        }
        let took = started.elapsed();
        assert!(
            took < REGISTRATION_TIMEOUT - Duration::from_secs(1),
            "start-up took {took:?}: a stranger's connection held the coordinator"
        );
    }

    #[test]
    fn a_squatted_coordinator_port_is_a_clear_error_on_every_rank() {
        // Someone else holds AM_COORD's port before rank 0 and plays coordinator: it sends a
        // challenge, takes the registration, and answers what it can without the key.
        let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
        let coord = squatter.local_addr().unwrap().to_string();
        let auth = Authenticator::new(&JobKey::from_bytes([7; 32]), "job-s");
        let mine = Entry {
            peer: PeerAddr {
                addr: "127.0.0.1:4000".parse().unwrap(),
                epoch: 0x77,
            },
            mtu: 1472,
        };
        // Rank 0 cannot serve there, and says why.
        match via_coordinator(&coord, 0, 2, &auth, mine) {
            Err(UdpError::CoordinatorPortTaken { coord: c }) => assert_eq!(c, coord),
            other => panic!("rank 0: {other:?}"),
        }
        let answers = [
            "AMUDP1 REGISTERED 00000000000000000000000000000000\n".to_owned(),
            format!("{REGISTERED}\n"),
            "0 0000000000000001@127.0.0.1:1/1472\n".to_owned(),
            String::new(), // closes without a word
        ];
        for answer in answers {
            let (done_tx, done_rx) = std::sync::mpsc::channel();
            let (coord2, auth2) = (coord.clone(), auth.clone());
            // Bounded: a rank that waited for the table here would wait two minutes.
            let rank = std::thread::spawn(move || {
                let _ = done_tx.send(via_coordinator(&coord2, 1, 2, &auth2, mine));
            });
            let (mut s, _) = squatter.accept().unwrap();
            s.write_all(challenge_line(&fresh_nonce().unwrap()).as_bytes())
                .unwrap();
            let mut line = String::new();
            BufReader::new(s.try_clone().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert!(line.starts_with("AMUDP1 "), "{line:?}");
            let _ = s.write_all(answer.as_bytes());
            if answer.is_empty() {
                drop(s);
            }
            let got = done_rx
                .recv_timeout(ANSWER_TIMEOUT + Duration::from_secs(20))
                .expect("the rank kept waiting on a coordinator that is not its rank 0");
            rank.join().unwrap();
            match got {
                Err(UdpError::CoordinatorNotAuthentic { coord: c, .. }) => assert_eq!(c, coord),
                other => panic!("answer {answer:?}: {other:?}"),
            }
        }
    }

    /// A coordinator whose challenge is not text: what answers there is not rank 0, and the
    /// failed read is the error's source.
    #[test]
    fn a_challenge_that_is_not_text_keeps_the_read_error() {
        use std::error::Error;
        let squatter = TcpListener::bind("127.0.0.1:0").unwrap();
        let coord = squatter.local_addr().unwrap().to_string();
        let auth = Authenticator::new(&JobKey::from_bytes([8; 32]), "job-t");
        let mine = Entry {
            peer: PeerAddr {
                addr: "127.0.0.1:4000".parse().unwrap(),
                epoch: 0x78,
            },
            mtu: 1472,
        };
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let coord2 = coord.clone();
        let rank = std::thread::spawn(move || {
            let _ = done_tx.send(via_coordinator(&coord2, 1, 2, &auth, mine));
        });
        let (mut s, _) = squatter.accept().unwrap();
        s.write_all(b"\xff\xfe\n").unwrap();
        let got = done_rx
            .recv_timeout(ANSWER_TIMEOUT + Duration::from_secs(20))
            .expect("the rank kept waiting on a coordinator that is not its rank 0");
        rank.join().unwrap();
        let e = got.map(|_| ()).unwrap_err();
        assert!(
            matches!(&e, UdpError::CoordinatorNotAuthentic { coord: c, .. } if *c == coord),
            "{e}"
        );
        let source = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            source.map(std::io::Error::kind),
            Some(std::io::ErrorKind::InvalidData),
            "{e}"
        );
        let read = source.unwrap().to_string();
        assert!(
            e.to_string().contains(&format!("(no challenge: {read})")),
            "{e}"
        );
    }

    /// A free port for a coordinator on 127.0.0.1.
    fn coord_addr() -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    }

    /// A client of the coordinator at `coord`, as a hostile holder of the key would write
    /// one: connects (rank 0 may not be listening yet), answers the challenge with a
    /// registration of `rank` at `entry`, and returns the connection, the registration line
    /// and the coordinator's answer. Every read is bounded by [`ANSWER_TIMEOUT`].
    fn register(
        coord: &str,
        auth: &Authenticator,
        rank: u32,
        size: u32,
        entry: Entry,
    ) -> (BufReader<TcpStream>, String, String) {
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        let stream = loop {
            match TcpStream::connect(coord) {
                Ok(s) => break s,
                Err(e) => {
                    assert!(Instant::now() < deadline, "no coordinator at {coord}: {e}");
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        };
        stream.set_read_timeout(Some(ANSWER_TIMEOUT)).unwrap();
        let mut reader = BufReader::new(stream);
        let mut challenge = String::new();
        reader.read_line(&mut challenge).unwrap();
        let nonce = parse_challenge(&challenge).expect("a challenge");
        let reg = registration(auth, rank, size, entry, &nonce);
        reader.get_mut().write_all(reg.as_bytes()).unwrap();
        let mut answer = String::new();
        reader.read_line(&mut answer).unwrap();
        (reader, reg, answer)
    }

    fn entry_at(port: u16, epoch: u64) -> Entry {
        Entry {
            peer: PeerAddr {
                addr: format!("127.0.0.1:{port}").parse().unwrap(),
                epoch,
            },
            mtu: 1472,
        }
    }

    /// Rank `rank` of a job of 3 through `coord`, on its own thread; its result comes on the
    /// returned channel.
    fn rank_thread(
        coord: &str,
        auth: &Authenticator,
        rank: u32,
    ) -> (
        std::thread::JoinHandle<()>,
        std::sync::mpsc::Receiver<Result<Vec<Entry>, UdpError>>,
    ) {
        let (tx, rx) = std::sync::mpsc::channel();
        let (coord, auth) = (coord.to_owned(), auth.clone());
        let h = std::thread::spawn(move || {
            let mine = entry_at(8000 + rank as u16, 0x500 + rank as u64);
            let _ = tx.send(via_coordinator(&coord, rank, 3, &auth, mine));
        });
        (h, rx)
    }

    /// Issue 16: a registration for a rank already registered overwrote its slot, so whoever
    /// held the key (or a second process started with the same `AM_RANK`) redirected that
    /// rank's traffic. Now a second registration of rank 1 from another address, or with
    /// another epoch, fails the start-up of every rank, each with an error naming rank 1:
    /// the two registrants, rank 0 and a rank that comes later.
    #[test]
    fn a_conflicting_duplicate_registration_fails_every_rank_naming_it() {
        let wait = ANSWER_TIMEOUT + Duration::from_secs(10);
        let auth = Authenticator::new(&JobKey::from_bytes([8; 32]), "job-d");
        let first = entry_at(9001, 0x501);
        for (what, second) in [
            ("another epoch", entry_at(9001, 0xBAD)),
            ("another address", entry_at(9999, 0x501)),
        ] {
            let coord = coord_addr();
            let (rank0, rank0_result) = rank_thread(&coord, &auth, 0);
            let (mut a, reg_a, answer) = register(&coord, &auth, 1, 3, first);
            assert!(answer.starts_with(REGISTERED), "{what}: {answer:?}");
            let (_b, reg_b, answer) = register(&coord, &auth, 1, 3, second);
            assert_eq!(
                parse_conflict(&auth, &reg_b, &answer),
                Some(Ok(1)),
                "{what}: the second registrant is refused: {answer:?}"
            );
            // The first registrant gets the notice in place of the table.
            let mut notice = String::new();
            a.read_line(&mut notice).unwrap();
            assert_eq!(
                parse_conflict(&auth, &reg_a, &notice),
                Some(Ok(1)),
                "{what}: {notice:?}"
            );
            // A notice is bound to its registration: another's does not verify.
            assert_eq!(parse_conflict(&auth, &reg_b, &notice), Some(Err(())));
            let (rank2, rank2_result) = rank_thread(&coord, &auth, 2);
            for (r, result) in [(0, rank0_result), (2, rank2_result)] {
                match result.recv_timeout(wait) {
                    Ok(Err(UdpError::ConflictingRegistration { coord: c, rank: 1 })) => {
                        assert_eq!(c, coord)
                    }
                    other => panic!("{what}: rank {r}: {other:?}"),
                }
            }
            rank0.join().unwrap();
            rank2.join().unwrap();
        }
    }

    /// The same registration again (the same process: same address and epoch) on a new
    /// connection is no conflict: both connections get the table.
    #[test]
    fn an_identical_registration_again_is_answered_again() {
        let wait = RENDEZVOUS_TIMEOUT;
        let auth = Authenticator::new(&JobKey::from_bytes([9; 32]), "job-e");
        let coord = coord_addr();
        let (rank0, rank0_result) = rank_thread(&coord, &auth, 0);
        let mine = entry_at(8001, 0x501);
        let (mut a, _, answer_a) = register(&coord, &auth, 1, 3, mine);
        let (mut b, _, answer_b) = register(&coord, &auth, 1, 3, mine);
        assert!(answer_a.starts_with(REGISTERED) && answer_b.starts_with(REGISTERED));
        let (rank2, rank2_result) = rank_thread(&coord, &auth, 2);
        for (r, result) in [(0, rank0_result), (2, rank2_result)] {
            let peers = result
                .recv_timeout(wait)
                .unwrap_or_else(|e| panic!("rank {r}: {e}"))
                .unwrap_or_else(|e| panic!("rank {r}: {e}"));
            assert_eq!(peers[1], mine);
        }
        for conn in [&mut a, &mut b] {
            let mut first = String::new();
            conn.read_line(&mut first).unwrap();
            assert!(first.starts_with("0 "), "{first:?}");
        }
        rank0.join().unwrap();
        rank2.join().unwrap();
    }

    #[test]
    fn coordinator_gives_everyone_the_table() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let coord = format!("127.0.0.1:{port}");
        let auth = Authenticator::new(&JobKey::from_bytes([5; 32]), "job-c");
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3u32)
                .map(|r| {
                    let (coord, auth) = (coord.clone(), auth.clone());
                    s.spawn(move || {
                        let mine = Entry {
                            peer: PeerAddr {
                                addr: format!("127.0.0.1:{}", 5000 + r).parse().unwrap(),
                                epoch: 100 + r as u64,
                            },
                            mtu: 1472 + r as usize,
                        };
                        // A stranger's junk before the ranks must not matter.
                        if r == 1 {
                            if let Ok(mut s) = TcpStream::connect(&coord) {
                                let _ = s.write_all(b"AMUDP1 hello\n");
                            }
                        }
                        via_coordinator(&coord, r, 3, &auth, mine)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            let peers = r.unwrap();
            assert_eq!(peers.len(), 3);
            for (i, p) in peers.iter().enumerate() {
                assert_eq!(p.peer.epoch, 100 + i as u64);
                assert_eq!(p.mtu, 1472 + i);
            }
        }
    }
}
