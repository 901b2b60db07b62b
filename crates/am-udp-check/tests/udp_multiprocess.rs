//! Multi-process jobs of `am-udp-check`: under am_launch's Launcher (key-value-store
//! rendezvous), with datagram loss, under MPICH's mpiexec, and with a rank killed by SIGKILL
//! (processes started directly, rendezvous through AM_COORD, so no launcher ends the job
//! before the survivors notice).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_am-udp-check");

/// The jobs of this file's tests, one at a time: each is 2 to 4 processes with peer timeouts
/// of a second, and several at once on a 2-vCPU machine starved ranks past their timeouts
/// (a receiver failed its bootstrap, or never reached its stop, in about 1 run in 20).
fn one_job_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn four_ranks_all_to_all_under_launcher() {
    let _turn = one_job_at_a_time();
    let code = am_launch::Launcher::new(4, BIN)
        .args(["alltoall", "300"])
        .transport("udp")
        .env("AM_WAIT", "block")
        .run()
        .expect("launch");
    assert_eq!(code, 0);
}

#[test]
fn four_ranks_all_to_all_with_loss_under_launcher() {
    let _turn = one_job_at_a_time();
    // 10% of datagrams dropped, 1% duplicated, 5% delayed, on every rank: the testing aid
    // for whole jobs.
    let code = am_launch::Launcher::new(4, BIN)
        .args(["alltoall", "300"])
        .transport("udp")
        .env("AM_WAIT", "block")
        .env("AM_UDP_FAULTS", "drop=0.1,dup=0.01,delay=0.05,seed=7")
        .run()
        .expect("launch");
    assert_eq!(code, 0);
}

#[test]
fn processes_a_rank_starts_do_not_inherit_the_key() {
    let _turn = one_job_at_a_time();
    // amrun's own key (through a pipe), and the user's AM_UDP_KEY (through the pipe too).
    for key in [
        None,
        Some(transport_udp::JobKey::generate().unwrap().to_hex()),
    ] {
        let mut l = am_launch::Launcher::new(2, BIN)
            .args(["child"])
            .transport("udp")
            .env("AM_WAIT", "block");
        if let Some(k) = &key {
            l = l.env("AM_UDP_KEY", k);
        }
        assert_eq!(l.run().expect("launch"), 0, "user key: {}", key.is_some());
    }
}

#[test]
fn key_file_job_under_launcher() {
    use std::os::unix::fs::PermissionsExt;
    let _turn = one_job_at_a_time();
    let path = std::env::temp_dir().join(format!("am-udp-keyfile-{}", std::process::id()));
    let key = transport_udp::JobKey::generate().unwrap();
    std::fs::write(&path, key.to_hex()).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    let code = am_launch::Launcher::new(3, BIN)
        .args(["alltoall", "50"])
        .transport("udp")
        .env("AM_WAIT", "block")
        .env("AM_UDP_KEY_FILE", &path)
        .run();
    // A file others may read is refused before any rank starts.
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
    let refused = am_launch::Launcher::new(2, BIN)
        .args(["alltoall", "1"])
        .transport("udp")
        .env("AM_UDP_KEY_FILE", &path)
        .run();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(code.expect("launch"), 0);
    assert!(
        matches!(refused, Err(am_launch::LaunchError::UdpKeyFile(_))),
        "{refused:?}"
    );
}

#[test]
fn malformed_fault_spec_is_a_clear_error() {
    let out = Command::new(BIN)
        .args(["alltoall", "1"])
        .env("AM_UDP_FAULTS", "drop=0.1,loss=0.2")
        .env_remove("AM_PMI_FD")
        .env_remove("PMI_FD")
        .env_remove("PMI_PORT")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("AM_UDP_FAULTS=\"drop=0.1,loss=0.2\": unknown key \"loss\""),
        "{err}"
    );
}

#[test]
fn four_ranks_under_mpiexec() {
    let _turn = one_job_at_a_time();
    // MPICH's, by its own name: the default `mpiexec` may be Open MPI's.
    let mpiexec = ["mpiexec.mpich", "mpiexec"]
        .into_iter()
        .find(|m| Command::new(m).arg("--version").output().is_ok())
        .unwrap_or("mpiexec");
    let Ok(out) = Command::new(mpiexec).arg("--version").output() else {
        if std::env::var_os("AM_REQUIRE_MPIEXEC").is_some_and(|v| v == "1") {
            panic!("mpiexec is required (AM_REQUIRE_MPIEXEC=1) but not installed");
        }
        println!("SKIPPED: mpiexec not found (apt-get install mpich)");
        return;
    };
    assert!(out.status.success());
    let status = Command::new(mpiexec)
        .args(["-n", "4", BIN, "alltoall", "200"])
        .env("AM_WAIT", "block")
        .stdin(Stdio::null())
        .status()
        .expect("mpiexec");
    assert!(status.success(), "mpiexec job failed: {status}");
}

/// Kills every child still running when dropped (a failing test leaves no processes).
struct Job(Vec<Child>);

impl Drop for Job {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A TCP port for a job's coordinator. Not one the kernel hands out itself (a port bound and
/// closed at "127.0.0.1:0" is soon the local port of some test's outgoing connection, and
/// the coordinator then fails with "Address already in use"): a port below the ephemeral
/// range (32768-60999), each handed out once per test process, and checked free by binding.
fn free_tcp_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = std::process::id().wrapping_mul(97) % COUNT;
    for _ in 0..COUNT {
        let port = FIRST + (start + NEXT.fetch_add(1, Ordering::Relaxed)) % COUNT;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    panic!("no free TCP port in {FIRST}..{}", FIRST + COUNT);
}

#[test]
fn killed_rank_is_lost_once_by_every_survivor() {
    let _turn = one_job_at_a_time();
    const RANKS: u32 = 4;
    const VICTIM: u32 = 2;
    const TIMEOUT_MS: u64 = 1000;
    let key = transport_udp::JobKey::generate().unwrap();
    let coord = format!("127.0.0.1:{}", free_tcp_port());
    let (tx, rx) = mpsc::channel::<(u32, String, Instant)>();
    let mut job = Job(Vec::new());
    for r in 0..RANKS {
        let mut child = Command::new(BIN)
            .arg("survive")
            .env("AM_RANK", r.to_string())
            .env("AM_SIZE", RANKS.to_string())
            .env("AM_JOB_ID", format!("killtest{}", std::process::id()))
            .env("AM_COORD", &coord)
            .env("AM_UDP_KEY", key.to_hex())
            .env("AM_PEER_TIMEOUT_MS", TIMEOUT_MS.to_string())
            .env("AM_WAIT", "block")
            .env("AM_CREDITS", "16")
            .env_remove("AM_PMI_FD")
            .env_remove("PMI_FD")
            .env_remove("PMI_PORT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn");
        let out = child.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send((r, line, Instant::now()));
            }
        });
        job.0.push(child);
    }
    drop(tx);
    let safety = Instant::now() + Duration::from_secs(60);
    let mut lines = Vec::new();
    let mut ready = 0;
    while ready < RANKS {
        let left = safety.saturating_duration_since(Instant::now());
        let (r, line, at) = rx.recv_timeout(left).expect("all ranks READY");
        if line.starts_with("READY") {
            ready += 1;
        }
        lines.push((r, line, at));
    }
    let killed_at = Instant::now();
    job.0[VICTIM as usize].kill().expect("SIGKILL");
    let survivors: Vec<u32> = (0..RANKS).filter(|&r| r != VICTIM).collect();
    let mut codes = vec![None; RANKS as usize];
    while survivors.iter().any(|&r| codes[r as usize].is_none()) {
        assert!(Instant::now() < safety, "survivors did not end: {lines:?}");
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(20)) {
            lines.push(l);
        }
        for &r in &survivors {
            if codes[r as usize].is_none() {
                if let Some(status) = job.0[r as usize].try_wait().expect("try_wait") {
                    codes[r as usize] = Some(status.code());
                }
            }
        }
    }
    // Output written just before exiting.
    while let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
        lines.push(l);
    }
    for &r in &survivors {
        assert_eq!(
            codes[r as usize],
            Some(Some(3)),
            "rank {r} ends the job with an error"
        );
        let lost: Vec<_> = lines
            .iter()
            .filter(|(who, l, _)| *who == r && l.starts_with("LOST"))
            .collect();
        assert_eq!(lost.len(), 1, "rank {r}: exactly one PeerLost: {lines:?}");
        assert_eq!(lost[0].1, format!("LOST {VICTIM}"));
        let after = lost[0].2 - killed_at;
        assert!(
            after <= Duration::from_millis(TIMEOUT_MS + 2000),
            "rank {r} noticed after {after:?}"
        );
        assert!(
            lines
                .iter()
                .any(|(who, l, _)| *who == r && *l == format!("SEND_FAILS {VICTIM}")),
            "rank {r}: sends to the lost rank fail at once"
        );
    }
}

#[test]
fn four_credits_receiver_process_stopped_half_the_timeout_then_everything_delivered() {
    let _turn = one_job_at_a_time();
    use nix::sys::signal::{kill, Signal};
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    use nix::unistd::Pid;
    const TIMEOUT_MS: u64 = 1000;
    const N: u32 = 2000;
    let key = transport_udp::JobKey::generate().unwrap();
    let coord = format!("127.0.0.1:{}", free_tcp_port());
    let mut job = Job(Vec::new());
    for r in 0..2u32 {
        let mut cmd = Command::new(BIN);
        cmd.args(["stream", &N.to_string()])
            .env("AM_RANK", r.to_string())
            .env("AM_SIZE", "2")
            .env("AM_JOB_ID", format!("pausetest{}", std::process::id()))
            .env("AM_COORD", &coord)
            .env("AM_UDP_KEY", key.to_hex())
            .env("AM_PEER_TIMEOUT_MS", TIMEOUT_MS.to_string())
            .env("AM_CREDITS", "4")
            .env("AM_WAIT", "block")
            .env_remove("AM_PMI_FD")
            .env_remove("PMI_FD")
            .env_remove("PMI_PORT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        if r == 1 {
            // Mid-stream, with the sender blocked on its 4 credits.
            cmd.env("AM_UDP_CHECK_STOP_AFTER", "100");
        }
        job.0.push(cmd.spawn().expect("spawn"));
    }
    let receiver = Pid::from_raw(job.0[1].id() as i32);
    match waitpid(receiver, Some(WaitPidFlag::WUNTRACED)).expect("waitpid") {
        WaitStatus::Stopped(_, Signal::SIGSTOP) => {}
        other => panic!("the receiver should have stopped itself: {other:?}"),
    }
    // The pause itself: the whole receiver process, sockets and all, for half the timeout.
    std::thread::sleep(Duration::from_millis(TIMEOUT_MS / 2));
    kill(receiver, Signal::SIGCONT).expect("SIGCONT");
    let mut outs = Vec::new();
    for c in job.0.iter_mut() {
        let mut out = String::new();
        std::io::Read::read_to_string(c.stdout.as_mut().unwrap(), &mut out).unwrap();
        let status = c.wait().expect("wait");
        outs.push((status, out));
    }
    for (r, (status, out)) in outs.iter().enumerate() {
        println!("{out}");
        assert!(status.success(), "rank {r}: {status}: {out}");
        assert!(
            out.contains(&format!("rank {r}: ok, {N} messages")),
            "rank {r}: {out}"
        );
    }
}

/// Issue 16: with more ranks than cores, a spinning rank is descheduled now and then, and
/// its acknowledgements come late. That is no loss: 4 ranks, lossless loopback, all-to-all
/// of 2000 messages per pair must retransmit under 1% of the 6000 messages each rank sends to
/// its peers (before the fixes: 2,000 to 5,500 per rank, from a cascade of spurious "fast"
/// retransmissions after each early timeout and a timeout blind to late answers).
/// A count, not a timing: it holds on any machine, and most of all on a busy one.
#[test]
fn four_spinning_ranks_lossless_all_to_all_retransmit_under_one_percent() {
    let _turn = one_job_at_a_time();
    const RANKS: u32 = 4;
    const N: u32 = 2000;
    let key = transport_udp::JobKey::generate().unwrap().to_hex();
    let results = coord_job(
        &["alltoall", &N.to_string()],
        &vec![key; RANKS as usize],
        &vec![vec![("AM_WAIT", "spin")]; RANKS as usize],
        Duration::from_secs(120),
    );
    for (r, (status, out)) in results.iter().enumerate() {
        assert!(status.success(), "rank {r}: {out}");
        let retransmits: u64 = out
            .split("retransmits ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("rank {r}: no retransmission count in {out:?}"));
        let sent = u64::from(N * (RANKS - 1));
        println!("rank {r}: {retransmits} retransmissions for {sent} messages");
        assert!(
            retransmits * 100 < sent,
            "rank {r}: {retransmits} retransmissions for {sent} messages: {out}"
        );
    }
}

/// Runs `am-udp-check ARGS` as a job of `extra_env.len()` ranks through `AM_COORD`, rank r
/// with `extra_env[r]` added, and returns each rank's exit status and output (stdout then
/// stderr). A watchdog kills the job after `limit`.
fn coord_job(
    args: &[&str],
    key_hex: &[String],
    extra_env: &[Vec<(&str, &str)>],
    limit: Duration,
) -> Vec<(std::process::ExitStatus, String)> {
    let ranks = extra_env.len();
    let coord = format!("127.0.0.1:{}", free_tcp_port());
    let mut job = Job(Vec::new());
    for (r, extra) in extra_env.iter().enumerate() {
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .env("AM_RANK", r.to_string())
            .env("AM_SIZE", ranks.to_string())
            .env("AM_JOB_ID", format!("coordjob{}", std::process::id()))
            .env("AM_COORD", &coord)
            .env("AM_UDP_KEY", &key_hex[r])
            .env("AM_WAIT", "block")
            .env_remove("AM_UDP_MTU")
            .env_remove("AM_UDP_FAULTS")
            .env_remove("AM_PMI_FD")
            .env_remove("PMI_FD")
            .env_remove("PMI_PORT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in extra {
            cmd.env(k, v);
        }
        job.0.push(cmd.spawn().expect("spawn"));
    }
    let deadline = Instant::now() + limit;
    let mut done = vec![None; ranks];
    while done.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "the job did not end in {limit:?}"
        );
        for (r, c) in job.0.iter_mut().enumerate() {
            if done[r].is_none() {
                done[r] = c.try_wait().expect("try_wait");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    job.0
        .iter_mut()
        .zip(done)
        .map(|(c, status)| {
            let mut out = String::new();
            std::io::Read::read_to_string(c.stdout.as_mut().unwrap(), &mut out).unwrap();
            std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut out).unwrap();
            (status.unwrap(), out)
        })
        .collect()
}

/// Issue 16: rank 0 with `AM_UDP_MTU=9000`, rank 1 with the default 1472. Each used its own
/// size: rank 1 read rank 0's larger datagrams cut short and dropped them, for ever. Now the
/// sizes are exchanged at start-up and both use the smaller, so the job just works (Medium
/// messages up to 3000 bytes: larger than one small datagram, smaller than one large one).
#[test]
fn ranks_with_different_mtus_agree_on_the_smaller() {
    let _turn = one_job_at_a_time();
    let key = transport_udp::JobKey::generate().unwrap().to_hex();
    let timeout = ("AM_PEER_TIMEOUT_MS", "2000");
    let results = coord_job(
        &["alltoall", "200"],
        &[key.clone(), key],
        &[vec![("AM_UDP_MTU", "9000"), timeout], vec![timeout]],
        Duration::from_secs(60),
    );
    for (r, (status, out)) in results.iter().enumerate() {
        assert!(status.success(), "rank {r}: {status}: {out}");
        assert!(out.contains("ok, 200 messages"), "rank {r}: {out}");
    }
}

/// Rank `rank` of a `size`-rank job `job_id` that meets its peers through the coordinator at
/// `coord` with job key `key` (hex), running `alltoall 10`; its stderr is piped, for the
/// start-up errors these tests look for, its stdout discarded.
fn coord_rank(rank: u32, size: u32, job_id: &str, coord: &str, key: &str) -> Child {
    Command::new(BIN)
        .args(["alltoall", "10"])
        .env("AM_RANK", rank.to_string())
        .env("AM_SIZE", size.to_string())
        .env("AM_JOB_ID", job_id)
        .env("AM_COORD", coord)
        .env("AM_UDP_KEY", key)
        .env_remove("AM_PMI_FD")
        .env_remove("PMI_FD")
        .env_remove("PMI_PORT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

/// Issue 16: a rank started with another key than rank 0's was a `PeerLost` 30 s into the
/// job (every datagram failed its MAC). Through `AM_COORD` the coordinator now tells such a
/// registration that its key differs, and the rank fails start-up at once with a clear error.
/// (Rank 0 keeps waiting for a rank with the right key; the test's job guard kills it.)
#[test]
fn a_rank_with_another_key_fails_start_up_with_key_mismatch() {
    let _turn = one_job_at_a_time();
    let keys = [
        transport_udp::JobKey::generate().unwrap().to_hex(),
        transport_udp::JobKey::generate().unwrap().to_hex(),
    ];
    let coord = format!("127.0.0.1:{}", free_tcp_port());
    let job_id = format!("keytest{}", std::process::id());
    let mut job = Job(Vec::new());
    for (r, key) in keys.iter().enumerate() {
        job.0.push(coord_rank(r as u32, 2, &job_id, &coord, key));
    }
    let started = Instant::now();
    let status = loop {
        if let Some(s) = job.0[1].try_wait().expect("try_wait") {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "rank 1 still running after 20 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(job.0[1].stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("job key mismatch: rank 1"), "{err}");
}

/// Issue 16: two processes started as the same rank (a careless `AM_RANK`) both registered
/// with the coordinator, and the second overwrote the first: rank 1's traffic went to
/// whichever came last. Now the coordinator refuses the job, and every process fails start-up
/// with an error naming the rank: the two rank 1s, rank 0, and rank 2, started only once one
/// rank 1 has failed (so the conflict is found before the table could be complete, whichever
/// rank 1 registers first).
#[test]
fn two_processes_started_as_one_rank_fail_start_up_naming_it() {
    let _turn = one_job_at_a_time();
    let key = transport_udp::JobKey::generate().unwrap().to_hex();
    let coord = format!("127.0.0.1:{}", free_tcp_port());
    let job_id = format!("duptest{}", std::process::id());
    let spawn = |rank: u32| coord_rank(rank, 3, &job_id, &coord, &key);
    let mut job = Job(vec![spawn(0), spawn(1), spawn(1)]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut done: Vec<Option<std::process::ExitStatus>> = vec![None; 4];
    while done.iter().any(Option::is_none) {
        assert!(
            Instant::now() < deadline,
            "the job did not end in 60 s: {done:?}"
        );
        if job.0.len() == 3 && (done[1].is_some() || done[2].is_some()) {
            job.0.push(spawn(2));
        }
        for (p, c) in job.0.iter_mut().enumerate() {
            if done[p].is_none() {
                done[p] = c.try_wait().expect("try_wait");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (p, (c, status)) in job.0.iter_mut().zip(done).enumerate() {
        let mut err = String::new();
        std::io::Read::read_to_string(c.stderr.as_mut().unwrap(), &mut err).unwrap();
        let status = status.unwrap();
        assert_eq!(status.code(), Some(1), "process {p}: {status}: {err}");
        assert!(
            err.contains("two processes registered as rank 1"),
            "process {p}: {err}"
        );
    }
}
