//! Pieces of the transports' rank-test programs (`*-rank-test`): self-launch, the two-process
//! floors, the echo table and its payload pattern, the put ring and the killed-rank scenario.

use am_core::Local;
use std::cell::Cell;
use std::error::Error;
use std::io;
use std::path::Path;
use std::rc::Rc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use am_core::{AmError, AmKind, HandlerId, Handlers, Node, Rank, RegisterError, Transport};
use am_launch::JobInfo;

use crate::median;

/// Medium request of the echo table: its handler echoes arguments and payload back.
pub const ECHO: HandlerId = HandlerId(1);
/// Medium reply of the echo table: checks the payload against [`pattern`] keyed by the
/// first argument and counts one echo.
pub const ECHO_REPLY: HandlerId = HandlerId(2);

/// Microseconds since the Unix epoch (0 if the clock is before it): a time other processes
/// can compare with.
pub fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

/// `len` bytes that depend on `key`: byte `i` is `i ^ key`, truncated.
pub fn pattern(len: usize, key: u32) -> Vec<u8> {
    (0..len).map(|i| (i as u32 ^ key) as u8).collect()
}

/// Outside a launcher, with `--ranks N` among `args`: starts this program as an `N`-rank job
/// on `transport` and exits with the job's code. Otherwise returns.
///
/// A failure scenario's job ([`is_failure_scenario`] of `args[0]`) gets a grace period of
/// [`SURVIVOR_GRACE`] instead of the launcher's second: its survivors ignore the SIGTERM that
/// follows a death on purpose, and must not be killed before they have noticed the death
/// themselves (udp notices by silence, which takes most of a second).
pub fn self_launch_if_asked(args: &[String], transport: &str) -> Result<(), Box<dyn Error>> {
    if !JobInfo::is_launched() {
        if let Some(i) = args.iter().position(|a| a == "--ranks") {
            let n: u32 = args.get(i + 1).ok_or("--ranks N")?.parse()?;
            let mut launcher = am_launch::self_launcher(n)?.transport(transport);
            if args.first().is_some_and(|m| is_failure_scenario(m)) {
                launcher = launcher.grace(SURVIVOR_GRACE);
            }
            std::process::exit(launcher.run()?);
        }
    }
    Ok(())
}

/// How long a self-launched failure scenario's survivors get between the launcher's SIGTERM
/// and its SIGKILL: longer than any scenario's own deadline (10 s), so a survivor that hangs
/// fails its test by the report it never wrote, not by luck of the timing.
pub const SURVIVOR_GRACE: Duration = Duration::from_secs(30);

/// Lets SIGTERM do nothing, so the launcher's SIGTERM after a rank's death cannot end this
/// rank before it notices the loss itself.
pub fn ignore_sigterm() -> io::Result<()> {
    signal_hook::flag::register(
        signal_hook::consts::SIGTERM,
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    )
    .map(drop)
}

/// The iteration count of a measurement mode: `args[1]` unless it is absent or an option.
pub fn iters_arg(args: &[String], default: usize) -> Result<usize, std::num::ParseIntError> {
    args.get(1)
        .filter(|a| !a.starts_with('-'))
        .map_or(Ok(default), |s| s.parse())
}

/// A job-wide barrier through the launcher's key-value store.
pub fn fence(job: &mut JobInfo) -> io::Result<()> {
    job.kvs
        .as_mut()
        .ok_or_else(|| io::Error::other("no kvs"))?
        .fence()
        .map_err(io::Error::other)
}

/// Width of the label column in the programs' reports.
const LABEL: usize = 42;

/// The raw two-process floors ([`am_shm::floor`]) measured at the start of a run, so the AM
/// numbers of the same run can be compared with them.
#[derive(Debug, Clone, Copy)]
pub struct Floors {
    /// Median cache-line ping-pong round trip in µs (0 on rank 1).
    pub rtt_us: f64,
    /// Median two-line ping-pong round trip in µs (0 on rank 1): the least a design pays
    /// whose request and reply land on different lines, as every remote-write-only NIC's do.
    pub two_line_us: f64,
    /// 1 MiB copy bandwidth in bytes per second (at rank 0).
    pub copy_bps: f64,
}

impl Floors {
    /// Ranks 0 and 1 of `job` call this at the same time: `iters` ping-pongs on one line,
    /// `iters` on two lines, then 200 copies of 1 MiB.
    pub fn measure(job: &mut JobInfo, iters: usize) -> io::Result<Floors> {
        let (rank, id) = (job.rank, job.job_id.clone());
        let mut fence = || fence(job);
        let rtt = am_shm::floor::cacheline_pingpong(&id, rank, iters, &mut fence)?;
        let two = am_shm::floor::two_line_pingpong(&id, rank, iters, &mut fence)?;
        let copy_bps = am_shm::floor::copy_bandwidth(&id, rank, 1 << 20, 200, &mut fence)?;
        Ok(Floors {
            rtt_us: median(rtt.iter().map(|d| d.as_secs_f64() * 1e6).collect()),
            two_line_us: median(two.iter().map(|d| d.as_secs_f64() * 1e6).collect()),
            copy_bps,
        })
    }

    /// Prints the two ping-pong floors in µs.
    pub fn print_rtt(&self) {
        let label = "floor cache-line ping-pong (2 processes):";
        println!("{label:<LABEL$}{:.3} us", self.rtt_us);
        let label = "floor two-line ping-pong (2 processes):";
        println!(
            "{label:<LABEL$}{:.3} us ({:.2}x floor)",
            self.two_line_us,
            self.two_line_us / self.rtt_us
        );
    }

    /// Prints `label`, a round trip of `us` µs and its ratios to both ping-pong floors.
    pub fn print_rtt_vs(&self, label: &str, us: f64) {
        println!(
            "{label:<LABEL$}{us:.3} us ({:.2}x floor, {:.2}x two-line)",
            us / self.rtt_us,
            us / self.two_line_us
        );
    }

    /// Prints the copy floor in GB/s.
    pub fn print_copy(&self) {
        let label = "floor copy 1 MiB (2 processes):";
        println!("{label:<LABEL$}{:.2} GB/s", self.copy_bps / 1e9);
    }

    /// Prints `label`, a bandwidth of `bps` bytes per second in GB/s and its share of the
    /// copy floor.
    pub fn print_bw_vs(&self, label: &str, bps: f64) {
        let share = 100.0 * bps / self.copy_bps;
        println!(
            "{label:<LABEL$}{:.2} GB/s ({share:.0}% of floor)",
            bps / 1e9
        );
    }
}

/// Rank 0 of a `perf` run, after the floors and the NIC alone (`nic_rtt`, µs): times AM
/// Short and Medium (`medium` bytes) round trips to [`crate::PEER`] and Long 1 MiB bandwidth
/// over `node` (a table from [`crate::am::handlers`] counting into `replies`), and prints
/// them beside `floors`. `short_label` names the AM Short line.
pub fn print_am_figures<T: Transport>(
    node: &mut Node<T, Local>,
    replies: &Cell<u64>,
    iters: usize,
    medium: usize,
    floors: &Floors,
    nic_rtt: f64,
    short_label: &str,
) -> Result<(), AmError> {
    use crate::{am, median_us};
    let data = vec![5u8; medium];
    let short = median_us(iters, || am::short_round_trip(node, replies))?;
    let med = median_us(iters, || am::medium_round_trip(node, replies, &data))?;
    let long = am::long_bandwidth(node)?;
    floors.print_rtt();
    floors.print_rtt_vs("NIC only Short round trip (no AM core):", nic_rtt);
    floors.print_rtt_vs(short_label, short);
    println!("AM Medium {medium} B round trip:             {med:.3} us");
    floors.print_copy();
    floors.print_bw_vs("AM Long 1 MiB bandwidth:", long);
    Ok(())
}

/// The echo table: [`ECHO`] and [`ECHO_REPLY`] (every checked echo adds one to `echoes`), and
/// the callable [`PLUS_ONE`].
/// Programs add their own handlers from id 3 on.
pub fn echo_handlers(echoes: &Rc<Cell<u64>>) -> Result<Handlers<Local>, RegisterError> {
    let mut h = Handlers::local();
    h.callable(PLUS_ONE, "plus one", |m, call| {
        let x = m.args().first().copied().unwrap_or(0);
        let _ = call.reply(&[x.wrapping_add(1)], &[]);
    })?;
    h.request(ECHO, "echo", AmKind::Medium, |m, tok| {
        let _ = tok.reply_medium(ECHO_REPLY, m.args(), m.payload_ref());
    })?;
    let e = echoes.clone();
    h.reply(ECHO_REPLY, "echo_reply", AmKind::Medium, move |m| {
        assert_eq!(
            m.payload(),
            &pattern(m.payload().len(), m.args()[0])[..],
            "echoed payload"
        );
        e.set(e.get() + 1);
    })?;
    Ok(h)
}

/// In each of `rounds` rounds every rank sends one [`ECHO`] request to every rank (itself
/// too), keyed `round * 1000 + peer`, with `len(round, peer)` bytes of [`pattern`]; then
/// waits until the echo table has counted all echoes in `echoes`.
pub fn echo_rounds<T: Transport>(
    node: &mut Node<T, Local>,
    echoes: &Cell<u64>,
    rounds: u32,
    len: impl Fn(u32, u32) -> usize,
) -> Result<(), AmError> {
    let n = node.size();
    // Counted before sending: replies already run while the requests go out.
    let want = echoes.get() + rounds as u64 * n as u64;
    for round in 0..rounds {
        for peer in 0..n {
            let key = round * 1000 + peer;
            node.request_medium(peer, ECHO, &[key], &pattern(len(round, peer), key))?;
        }
    }
    node.wait_until(|| echoes.get() == want)
}

/// Every rank puts `data(me)` at `offset(me)` into the next rank's segment; after a barrier
/// each checks what the previous rank put, then all meet at a second barrier.
pub fn put_ring<T: Transport>(
    node: &mut Node<T, Local>,
    offset: impl Fn(u32) -> usize,
    data: impl Fn(u32) -> Vec<u8>,
) -> Result<(), Box<dyn Error>> {
    let (me, n) = (node.rank(), node.size());
    node.put((me + 1) % n, offset(me), &data(me))?;
    node.barrier()?;
    let prev = (me + n - 1) % n;
    let (at, want) = (offset(prev), data(prev));
    if node
        .segment()
        .slice(at, want.len())
        .map(|v| v.to_vec())
        .ok()
        != Some(want)
    {
        return Err(format!("rank {me}: the put from rank {prev} did not land").into());
    }
    node.barrier()?;
    Ok(())
}

/// The AM segment rank `rank` asks for in the `mismatch` scenario: rank 1's is a page
/// larger than everyone else's.
pub fn mismatched_segment(rank: Rank) -> usize {
    (1 << 20) + if rank == 1 { 4096 } else { 0 }
}

/// The `mismatch` scenario's check, on every rank: start-up failed with a segment-size
/// mismatch naming rank 1, rank 0's size and rank 1's (`got`: the error's rank, ours,
/// theirs; `None` if start-up succeeded).
pub fn expect_segment_mismatch(got: Option<(Rank, u64, u64)>) -> Result<(), Box<dyn Error>> {
    let want = (
        1,
        mismatched_segment(0) as u64,
        mismatched_segment(1) as u64,
    );
    match got {
        Some(got) if got == want => Ok(()),
        other => Err(format!("start-up gave {other:?}, not the mismatch {want:?}").into()),
    }
}

/// The rank that calls `exit(EXIT_CODE)` in [`exit_scenario`].
pub const EXITING_RANK: Rank = 2;
/// The code [`exit_scenario`] ends the job with.
pub const EXIT_CODE: i32 = 7;

/// `Node::exit` across processes: after a barrier, rank [`EXITING_RANK`] calls
/// `exit(EXIT_CODE)`; every other rank writes `dir/waiting-<rank>` and polls until the EXIT
/// arrives, which ends its process with the same code. A rank still polling 2 s later writes
/// `dir/late-<rank>` and ends with 1. Call [`ignore_sigterm`] first thing in the program, so
/// that the launcher's SIGTERM (sent when the exiting rank ends) cannot end the others first.
pub fn exit_scenario<T: Transport>(
    mut node: Node<T, Local>,
    dir: &Path,
) -> Result<(), Box<dyn Error>> {
    let me = node.rank();
    match node.barrier() {
        Ok(()) => {}
        // The exiting rank leaves its barrier while others may still be in theirs: a rank
        // its EXIT reached there ends without its last rounds, and a rank waiting for one of
        // those sees it depart before the EXIT (no order holds between two senders). The
        // EXIT still comes: wait for it below.
        Err(AmError::PeerDeparted(_)) => {}
        Err(e) => return Err(e.into()),
    }
    if me == EXITING_RANK {
        node.exit(EXIT_CODE);
    }
    std::fs::write(dir.join(format!("waiting-{me}")), "")?;
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        // The exiting rank is gone by the time its EXIT is read: errors about it are expected.
        let _ = node.poll();
        std::thread::sleep(Duration::from_micros(100));
    }
    std::fs::write(dir.join(format!("late-{me}")), "")?;
    std::process::exit(1);
}

/// Whether `mode` is one of the failure scenarios [`failure_scenario`] runs (their programs
/// call [`ignore_sigterm`] first thing).
pub fn is_failure_scenario(mode: &str) -> bool {
    matches!(
        mode,
        "kill" | "kill-allreduce" | "kill-anywhere" | "exit" | "pending"
    )
}

/// The callable handler of [`echo_handlers`]: answers `[x + 1]`.
pub const PLUS_ONE: HandlerId = HandlerId(150);

/// The rank that dies in [`pending_scenario`].
pub const PENDING_VICTIM: Rank = 1;

/// Calls each survivor of [`pending_scenario`] has in flight when the victim dies (within
/// every transport's credits, so that all are sent).
pub const PENDING_CALLS: u32 = 8;

/// Every operation pending on a rank that dies fails, whatever killed it: after a barrier,
/// [`PENDING_VICTIM`] stops polling, so that the [`PENDING_CALLS`] calls each other rank
/// then makes to it (and, in a job of 2, the barrier the survivor enters) stay unanswered;
/// 300 ms later it dies as `how` says: `panic`, `abort`, `exit` (`exit(5)` without
/// `Node::exit`) or `kill` (SIGKILL). Each survivor waits for every one of its operations,
/// each of which must fail with a typed error (the peer lost or departed, the job aborted)
/// within 10 s, and writes `dir/failed-<rank>` (the errors, and the milliseconds the last
/// took after the victim's death); the caller then ends the process with code 3. Rank 0
/// first writes `job_id` into `dir/job`, so that the test can look for this job's leftovers
/// only ([`crate::launch::assert_job_left_nothing`]). Call [`ignore_sigterm`] first thing in
/// the program.
pub fn pending_scenario<T: Transport>(
    node: &mut Node<T, Local>,
    job_id: &str,
    how: &str,
    dir: &Path,
) -> Result<(), Box<dyn Error>> {
    let me = node.rank();
    if me == 0 {
        std::fs::write(dir.join("job"), job_id)?;
    }
    node.barrier()?;
    if me == PENDING_VICTIM {
        std::thread::sleep(Duration::from_millis(300));
        std::fs::write(dir.join("victim"), now_us().to_string())?;
        match how {
            "panic" => panic!("rank {me} dies by panic on purpose"),
            "abort" => std::process::abort(),
            "exit" => std::process::exit(5),
            "kill" => {
                nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL)?;
                unreachable!("SIGKILL returned");
            }
            other => return Err(format!("pending: no such death {other:?}").into()),
        }
    }
    let mut calls = Vec::new();
    let mut errors = Vec::new();
    for i in 0..PENDING_CALLS {
        match node.call_nb(PENDING_VICTIM, PLUS_ONE, &[i], &[]) {
            Ok(op) => calls.push(op),
            Err(e) => errors.push(e),
        }
    }
    let barrier = if node.size() == 2 {
        Some(node.barrier_nb())
    } else {
        None
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    // Every operation, one at a time, with the node's blocking waits: each must end by
    // itself, since nothing here gives up on it.
    for op in calls {
        match node.wait(op) {
            Ok(r) => {
                return Err(format!("rank {me}: a call to the dead rank answered {r:?}").into())
            }
            Err(e) => errors.push(e),
        }
        if Instant::now() > deadline {
            return Err(format!("rank {me}: calls took more than 10 s to fail").into());
        }
    }
    match barrier {
        Some(Ok(op)) => match node.wait(op) {
            Ok(()) => return Err(format!("rank {me}: a barrier with the dead rank passed").into()),
            Err(e) => errors.push(e),
        },
        Some(Err(e)) => errors.push(e),
        None => {}
    }
    let typed = |e: &AmError| {
        matches!(
            e,
            AmError::PeerLost(PENDING_VICTIM)
                | AmError::PeerDeparted(PENDING_VICTIM)
                | AmError::JobAborted
        )
    };
    if let Some(e) = errors.iter().find(|e| !typed(e)) {
        return Err(format!("rank {me}: an operation failed with {e:?}").into());
    }
    let died: u128 = std::fs::read_to_string(dir.join("victim"))?
        .trim()
        .parse()?;
    let took_ms = now_us().saturating_sub(died) / 1000;
    let names: Vec<String> = errors.iter().map(|e| format!("{e:?}")).collect();
    std::fs::write(
        dir.join(format!("failed-{me}")),
        format!("{took_ms} {}", names.join(",")),
    )?;
    Ok(())
}

/// Runs failure scenario `mode` of a rank-test program with its `args` (`kill-anywhere DIR
/// DELAY_US`: [`kill_anywhere`], whose exchange handlers `exchanged` counts; `exit DIR`:
/// [`exit_scenario`]; `kill DIR`: [`kill_scenario`]). `kill` and `kill-anywhere` end the
/// process with code 3 once the node and the job are dropped.
pub fn failure_scenario<T: Transport>(
    mode: &str,
    args: &[String],
    mut node: Node<T, Local>,
    job: JobInfo,
    exchanged: &(Cell<u64>, Cell<u64>),
) -> Result<(), Box<dyn Error>> {
    let dir = std::path::PathBuf::from(args.get(1).ok_or(format!("{mode} DIR"))?);
    match mode {
        "kill-anywhere" => {
            let delay: u64 = args.get(2).ok_or("kill-anywhere DIR DELAY_US")?.parse()?;
            kill_anywhere(&mut node, exchanged, delay, &dir)?;
        }
        "exit" => return exit_scenario(node, &dir),
        "pending" => {
            let how = args.get(2).ok_or("pending DIR panic|abort|exit|kill")?;
            pending_scenario(&mut node, &job.job_id, how, &dir)?;
        }
        "kill" => kill_scenario(&mut node, &job.job_id, &dir)?,
        "kill-allreduce" => kill_allreduce_scenario(&mut node, &job.job_id, &dir)?,
        other => return Err(format!("not a failure scenario: {other:?}").into()),
    }
    drop(node);
    drop(job);
    std::process::exit(3);
}

/// The killed-rank scenario: rank 0 writes the job id into `dir/job` (so the test can look for
/// this job's leftovers only); after a barrier rank 1 writes `dir/victim` (its time of death,
/// [`now_us`]) and kills itself with SIGKILL; the others wait at a barrier, and on
/// `PeerLost` write `dir/lost-<rank>` (`<lost rank> <now_us>`), wait (at most 10 s) until
/// every survivor has, and return `Ok`. The caller
/// then ends the process with exit code 3 (after dropping the node and the job). Call
/// [`ignore_sigterm`] first thing in the program.
pub fn kill_scenario<T: Transport>(
    node: &mut Node<T, Local>,
    job_id: &str,
    dir: &Path,
) -> Result<(), Box<dyn Error>> {
    let me = node.rank();
    if me == 0 {
        std::fs::write(dir.join("job"), job_id)?;
    }
    node.barrier()?;
    if me == 1 {
        std::fs::write(dir.join("victim"), now_us().to_string())?;
        nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL)?;
    }
    match node.barrier() {
        Err(AmError::PeerLost(r)) => {
            std::fs::write(dir.join(format!("lost-{me}")), format!("{r} {}", now_us()))?;
            await_survivors(me, node.size(), dir)
        }
        other => Err(format!("rank {me}: expected PeerLost, got {other:?}").into()),
    }
}

/// Waits (at most 10 s) until every rank of `size` but rank 1 has written `dir/lost-<rank>`:
/// a survivor that ended first would be a second lost rank, and a slower one could report it
/// instead of the victim.
fn await_survivors(me: Rank, size: u32, dir: &Path) -> Result<(), Box<dyn Error>> {
    let deadline = Instant::now() + Duration::from_secs(10);
    for r in (0..size).filter(|&r| r != 1) {
        while !dir.join(format!("lost-{r}")).exists() {
            if Instant::now() > deadline {
                return Err(format!("rank {me}: rank {r} never reported").into());
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    Ok(())
}

/// The killed-in-a-collective scenario: as [`kill_scenario`], but every rank runs
/// all-reduces on the world team back to back, and rank 1 kills itself with SIGKILL right
/// after starting its `KILL_AFTER`-th (its first step may or may not have left). Each
/// survivor checks every result, and on `PeerLost(1)` (from its own transport or from
/// another member's notice) writes `dir/lost-<rank>` (`<lost rank> <now_us>`); its next
/// collective on the world team must fail at once with the same error; a survivor whose
/// checks all passed writes `dir/checked-<rank>`.
pub fn kill_allreduce_scenario<T: Transport>(
    node: &mut Node<T, Local>,
    job_id: &str,
    dir: &Path,
) -> Result<(), Box<dyn Error>> {
    use am_core::ReduceOp;
    const KILL_AFTER: u64 = 200;
    let me = node.rank();
    let n = u64::from(node.size());
    if me == 0 {
        std::fs::write(dir.join("job"), job_id)?;
    }
    let world = node.world_team();
    node.barrier()?;
    let want = |k: u64| k * n + n * (n - 1) / 2;
    for k in 0.. {
        if me == 1 && k == KILL_AFTER {
            let _started = node.team_all_reduce_nb(&world, ReduceOp::Sum, &[k + u64::from(me)]);
            std::fs::write(dir.join("victim"), now_us().to_string())?;
            nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL)?;
        }
        match node.team_all_reduce(&world, ReduceOp::Sum, &[k + u64::from(me)]) {
            Ok(v) if v == [want(k)] => {}
            Ok(v) => return Err(format!("rank {me}: all-reduce {k} gave {v:?}").into()),
            Err(AmError::PeerLost(r)) => {
                std::fs::write(dir.join(format!("lost-{me}")), format!("{r} {}", now_us()))?;
                if k < KILL_AFTER {
                    return Err(format!("rank {me}: lost rank {r} at all-reduce {k}").into());
                }
                break;
            }
            Err(e) => return Err(format!("rank {me}: all-reduce {k}: {e}").into()),
        }
    }
    // A later collective fails at once: the team is failed.
    match node.team_barrier(&world) {
        Err(AmError::PeerLost(1)) => {}
        other => return Err(format!("rank {me}: the next collective gave {other:?}").into()),
    }
    await_survivors(me, node.size(), dir)?;
    // Every check above passed here (the job fails whatever the survivors find).
    std::fs::write(dir.join(format!("checked-{me}")), "")?;
    Ok(())
}

/// The start of the `stall` mode: writes `dir/pid-<rank>`; rank 0 then waits (at most 30 s)
/// for `dir/go` to exist.
pub fn stall_before_start(job: &JobInfo, dir: &Path) -> Result<(), Box<dyn Error>> {
    std::fs::write(
        dir.join(format!("pid-{}", job.rank)),
        std::process::id().to_string(),
    )?;
    if job.rank == 0 {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !dir.join("go").exists() {
            if std::time::Instant::now() > deadline {
                return Err("stall: no go".into());
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
    Ok(())
}

/// Short request of the kill-anywhere exchange: answered by [`EXCHANGE_REPLY`].
pub const EXCHANGE: HandlerId = HandlerId(200);
/// Short reply of the kill-anywhere exchange: counts one round trip.
pub const EXCHANGE_REPLY: HandlerId = HandlerId(201);
/// Payload sizes the kill-anywhere flood cycles through (capped at the transport's largest
/// Medium): empty, one packet or slot, several VELO packets, an RMA-buffered Medium.
const FLOOD_SIZES: [usize; 5] = [0, 24, 200, 900, 3000];
/// Round trips each survivor makes with each other survivor after the loss.
const EXCHANGE_ROUNDS: u64 = 100;

/// Exchange replies got and exchange requests answered ([`exchange_counters`]).
pub type Exchanged = (Cell<u64>, Cell<u64>);

/// The counters of [`kill_anywhere`]'s exchange for a rank-test program running `mode`:
/// `.0` counts the exchange replies this rank got, `.1` the exchange requests it answered.
/// For `kill-anywhere` the exchange handlers are added to `h` (a table with the echo
/// handlers); other modes register nothing.
pub fn exchange_counters(
    h: &mut Handlers<Local>,
    mode: &str,
) -> Result<Rc<Exchanged>, RegisterError> {
    let exchanged = Rc::new((Cell::new(0u64), Cell::new(0u64)));
    if mode != "kill-anywhere" {
        return Ok(exchanged);
    }
    let served = exchanged.clone();
    h.request(EXCHANGE, "exchange", AmKind::Short, move |m, tok| {
        served.1.set(served.1.get() + 1);
        let _ = tok.reply_short(EXCHANGE_REPLY, m.args());
    })?;
    let e = exchanged.clone();
    h.reply(EXCHANGE_REPLY, "exchange_reply", AmKind::Short, move |_| {
        e.0.set(e.0.get() + 1)
    })?;
    Ok(exchanged)
}

/// The kill-anywhere scenario (3 ranks or more, the echo table and [`exchange_counters`]):
/// after a barrier every rank floods every other with echo requests of mixed sizes. The last
/// rank is the victim: a timer thread kills it with SIGKILL `delay_us` µs into the flood, at
/// whatever point of a send, a claim or a poll its main thread is. The survivors flood on until
/// they see it lost, then make a full exchange (a fixed number of round trips with every
/// other survivor), write `dir/ok-<rank>` (the round trips made) and return; the caller ends
/// the process (code 3). Errors other than the victim's loss are returned. Call
/// [`ignore_sigterm`] first thing in the program: the launcher's SIGTERM after the death must
/// not end the survivors before they are done.
pub fn kill_anywhere<T: Transport>(
    node: &mut Node<T, Local>,
    exchanged: &(Cell<u64>, Cell<u64>),
    delay_us: u64,
    dir: &Path,
) -> Result<(), Box<dyn Error>> {
    let (me, n) = (node.rank(), node.size());
    if n < 3 {
        return Err("kill-anywhere needs 3 ranks or more".into());
    }
    let victim = n - 1;
    let is_victims_loss = |e: &AmError| matches!(e, AmError::PeerLost(r) if *r == victim);
    let mut lost = false;
    match node.barrier() {
        Ok(()) => {}
        // The victim's clock starts when its barrier ends: it can die before a survivor's
        // barrier has sent it the last message (seen on extoll, kill at 175 µs).
        Err(e) if me != victim && is_victims_loss(&e) => lost = true,
        Err(e) => return Err(e.into()),
    }
    if me == victim {
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_micros(delay_us));
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
        });
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let max = node.max_medium();
    let mut key = 0u32;
    while !lost {
        if std::time::Instant::now() > deadline {
            return Err(format!("rank {me}: rank {victim} was never reported lost").into());
        }
        for p in (0..n).filter(|&p| p != me) {
            key = key.wrapping_add(1);
            let len = FLOOD_SIZES[key as usize % FLOOD_SIZES.len()].min(max);
            match node.request_medium(p, ECHO, &[key], &pattern(len, key)) {
                Ok(()) => {}
                Err(e) if me != victim && is_victims_loss(&e) => lost = true,
                Err(e) => return Err(format!("rank {me}: flood to {p}: {e}").into()),
            }
        }
    }
    // The survivors: a full exchange, whatever the victim left half done.
    let survivors = (0..n).filter(|&p| p != me && p != victim);
    let want = EXCHANGE_ROUNDS * (n as u64 - 2);
    let (got, served) = (&exchanged.0, &exchanged.1);
    let before = got.get();
    for p in survivors {
        for k in 0..EXCHANGE_ROUNDS as u32 {
            loop {
                match node.request_short(p, EXCHANGE, &[k]) {
                    Ok(()) => break,
                    Err(e) if is_victims_loss(&e) => {}
                    Err(e) => return Err(format!("rank {me}: exchange with {p}: {e}").into()),
                }
                if std::time::Instant::now() > deadline {
                    return Err(format!("rank {me}: exchange with {p} stuck").into());
                }
            }
        }
    }
    // Done when our round trips are back and we answered all of the others' (so they, and
    // everything they sent us before, need nothing more from us once we leave).
    while got.get() - before < want || served.get() < want {
        match node.poll() {
            Ok(_) => {}
            Err(e) if is_victims_loss(&e) => {}
            Err(e) => return Err(format!("rank {me}: exchange: {e}").into()),
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "rank {me}: {} of {want} exchange replies, {} requests answered",
                got.get() - before,
                served.get()
            )
            .into());
        }
    }
    std::fs::write(dir.join(format!("ok-{me}")), want.to_string())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_on_key_and_index() {
        assert_eq!(pattern(4, 0), [0, 1, 2, 3]);
        assert_eq!(pattern(3, 0x101), [1, 0, 3]);
        assert!(pattern(0, 9).is_empty());
    }

    #[test]
    fn iters_arg_skips_options() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(iters_arg(&args(&["perf"]), 7), Ok(7));
        assert_eq!(iters_arg(&args(&["perf", "--ranks", "2"]), 7), Ok(7));
        assert_eq!(iters_arg(&args(&["perf", "300"]), 7), Ok(300));
        assert!(iters_arg(&args(&["perf", "x"]), 7).is_err());
    }
}
