//! A job across two network namespaces, each a "host" with its own address, joined by a veth
//! pair: rank 0 at 10.77.0.1 serves the `AM_COORD` rendezvous, rank 1 at 10.77.0.2, both bound
//! with `AM_UDP_BIND`. The namespaces are made with `unshare -rn` (a user namespace, so no
//! real root is needed where unprivileged user namespaces are allowed): they vanish with their
//! processes, so nothing is left behind even when the test fails. With `iptables` installed,
//! rank 1's namespace also drops 10% of incoming UDP (`-m statistic`); `AM_UDP_FAULTS` adds
//! duplication and reordering on both ranks.
//!
//! Without the privileges (or `ip`, `unshare`) the test prints `SKIPPED: ...` and passes;
//! with `AM_REQUIRE_NETNS=1` it fails instead.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

const BIN: &str = env!("CARGO_BIN_EXE_am-udp-check");

/// Runs in namespace A (rank 0's host); makes namespace B (rank 1's host) and the veth pair.
/// Fifos order the steps: the veth end moves into B only after B exists, rank 1 starts only
/// after its address is configured.
const SCRIPT: &str = r#"
set -eu
ip link set lo up
mkfifo "$D/ready" "$D/go"
unshare -n sh -c '
    set -eu
    echo > "$D/ready"
    read _ < "$D/go"
    ip link set lo up
    ip addr add 10.77.0.2/24 dev vb
    ip link set vb up
    if [ "$LOSS" = 1 ]; then
        iptables -A INPUT -p udp -m statistic --mode random --probability 0.1 -j DROP
    fi
    AM_RANK=1 AM_UDP_BIND=10.77.0.2 "$BIN" alltoall "$N"
    if [ "$LOSS" = 1 ]; then
        iptables -L INPUT -n -v -x | awk "/statistic/ { print \"IPTABLES_DROPPED\", \$1 }"
    fi
' &
B=$!
read _ < "$D/ready"
ip link add va type veth peer name vb netns "$B"
ip addr add 10.77.0.1/24 dev va
ip link set va up
echo > "$D/go"
rc=0
AM_RANK=0 AM_UDP_BIND=10.77.0.1 "$BIN" alltoall "$N" || rc=$?
wait "$B" || rc=$?
exit "$rc"
"#;

/// Kills the whole process group (namespaces' shells and ranks) if still running when dropped.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        if self.0.try_wait().ok().flatten().is_none() {
            let _ = killpg(Pid::from_raw(self.0.id() as i32), Signal::SIGKILL);
            let _ = self.0.wait();
        }
    }
}

fn skip_or_fail(why: &str) {
    if std::env::var_os("AM_REQUIRE_NETNS").is_some_and(|v| v == "1") {
        panic!("network namespaces are required (AM_REQUIRE_NETNS=1): {why}");
    }
    println!("SKIPPED: two-namespace UDP job: {why}");
}

/// Whether this machine lets us make a user + network namespace with a veth pair in it.
fn can_make_namespaces() -> Result<(), String> {
    let out = Command::new("unshare")
        .args([
            "-rn", "ip", "link", "add", "va", "type", "veth", "peer", "name", "vb",
        ])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run unshare (util-linux): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "unshare -rn + veth failed (no privileges for user/network namespaces, or no `ip` from iproute2): {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn has_iptables() -> bool {
    Command::new("iptables")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

#[test]
fn job_across_two_network_namespaces() {
    if let Err(why) = can_make_namespaces() {
        return skip_or_fail(&why);
    }
    let loss = has_iptables();
    if !loss {
        println!("NOTE: iptables not installed: the two-namespace job runs without loss");
    }
    let dir = std::env::temp_dir().join(format!("am-udp-netns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = transport_udp::JobKey::generate().unwrap();
    let mut child = Command::new("unshare")
        .args(["-rn", "sh", "-c", SCRIPT])
        .env("D", &dir)
        .env("BIN", BIN)
        .env("N", "2000")
        .env("LOSS", if loss { "1" } else { "0" })
        .env("AM_SIZE", "2")
        .env("AM_JOB_ID", format!("netns{}", std::process::id()))
        .env("AM_COORD", "10.77.0.1:7777")
        .env("AM_UDP_KEY", key.to_hex())
        .env("AM_WAIT", "block")
        .env_remove("AM_PMI_FD")
        .env_remove("PMI_FD")
        .env_remove("PMI_PORT")
        .env_remove("AM_UDP_PORT_BASE")
        // Duplication and reordering from the transport's hook, loss from iptables.
        .env("AM_UDP_FAULTS", "dup=0.01,delay=0.05,seed=3")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("spawn unshare");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut group = Group(child);
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    // A safety net only: kills the group if the job hangs.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = group.0.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(group);
    let mut out = String::new();
    let _ = stdout.read_to_string(&mut out);
    let err = err_reader.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    println!("{out}{err}");
    let status = status.expect("the two-namespace job did not end within 60 s");
    assert!(status.success(), "job failed: {status}\n{out}\n{err}");
    for (rank, addr) in [(0, "10.77.0.1:"), (1, "10.77.0.2:")] {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("rank {rank} at {addr}")) && l.contains(": ok,")),
            "rank {rank} verified from its own address {addr}: {out}"
        );
    }
    if loss {
        let dropped: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("IPTABLES_DROPPED "))
            .and_then(|n| n.trim().parse().ok())
            .expect("iptables counter");
        assert!(dropped > 0, "iptables dropped nothing");
    }
}
