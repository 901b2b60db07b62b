//! The multi-process tests' side: start a job of a rank-test program with
//! [`am_launch::Launcher`] (amrun's code) and check what its ranks left behind.
//!
//! These are test helpers: they panic, with a message, where a test should fail.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use am_launch::Launcher;

/// Runs `ranks` processes of `bin` with `args` on `transport`, with `AM_WAIT=block` (more
/// ranks than cores) and then `env`; returns the job's exit code.
///
/// # Panics
/// If the job cannot be started.
pub fn run_job(bin: &str, transport: &str, ranks: u32, args: &[&str], env: &[(&str, &str)]) -> i32 {
    run_job_with(Launcher::new(ranks, bin), transport, args, env)
}

/// [`run_job`] with a launcher the caller set up (e.g. its grace period).
pub fn run_job_with(l: Launcher, transport: &str, args: &[&str], env: &[(&str, &str)]) -> i32 {
    let mut l = l
        .args(args.iter().copied())
        .transport(transport)
        .env("AM_WAIT", "block");
    for (k, v) in env {
        l = l.env(k, v);
    }
    l.run().expect("launch")
}

/// A shell that runs a rank (`$0 "$@"`), writes its exit status into
/// `$AM_EXIT_CODES/code-$AM_RANK` (128+S if a signal S ended it), and exits with it. It ignores
/// the launcher's SIGTERM, so it outlives its rank to write the status (the rank program
/// ignores SIGTERM too, see [`crate::rank::ignore_sigterm`]). The launcher reaps every rank
/// itself and keeps only the first failure's code: this is how a test sees every rank's.
const RECORD_EXIT: &str = r#"trap '' TERM
"$0" "$@"
code=$?
echo "$code" > "$AM_EXIT_CODES/code-$AM_RANK"
exit "$code""#;

/// Runs the `exit` scenario ([`crate::rank::exit_scenario`]) of `bin` on `transport` with 4
/// ranks and checks that every rank's process ended with the exiting rank's code, promptly:
/// each rank's own exit status (recorded by the shell `RECORD_EXIT` around it) and the job's
/// code are that code, no rank was still polling 2 s after it (`late-<rank>`), and the job
/// ended well before the launcher would have killed a rank that kept running (its grace
/// period is 30 s here, so a rank that ignored the EXIT shows as a 30 s job). `env` is set
/// for every rank.
///
/// # Panics
/// If any of that does not hold.
pub fn assert_exit_ends_every_rank(bin: &str, transport: &str, env: &[(&str, &str)]) {
    let dir = fresh_dir(&format!("{transport}-exit"));
    let path = dir.to_str().unwrap_or("");
    let t0 = Instant::now();
    let launcher = Launcher::new(4, "/bin/sh")
        .args(["-c", RECORD_EXIT, bin])
        .grace(Duration::from_secs(30));
    let mut env = env.to_vec();
    env.push(("AM_EXIT_CODES", path));
    let code = run_job_with(launcher, transport, &["exit", path], &env);
    let took = t0.elapsed();
    let late: Vec<_> = (0..4)
        .filter(|r| dir.join(format!("late-{r}")).exists())
        .collect();
    let ranks: Vec<Option<i32>> = (0..4)
        .map(|r| {
            let s = std::fs::read_to_string(dir.join(format!("code-{r}"))).ok()?;
            s.trim().parse().ok()
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        ranks,
        [Some(crate::rank::EXIT_CODE); 4],
        "each rank's exit status ({transport}; None: not recorded)"
    );
    assert_eq!(code, crate::rank::EXIT_CODE, "the job's code ({transport})");
    assert!(
        late.is_empty(),
        "ranks {late:?} still polled 2 s after the exit"
    );
    assert!(
        took < Duration::from_secs(20),
        "{transport}: the job took {took:?}: a rank ignored the EXIT until it was killed"
    );
}

/// An empty directory `<temp>/<name>-<pid>`, emptied first if it exists.
///
/// # Panics
/// If it cannot be created.
pub fn fresh_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the test directory");
    dir
}

/// The names of the files in `/dev/shm` that `keep` accepts.
pub fn shm_files(keep: impl Fn(&str) -> bool) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| keep(n))
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that the job whose id [`crate::rank::kill_scenario`] wrote into `dir/job` left no
/// `/dev/shm` file behind (only its own: other tests' jobs run meanwhile).
pub fn assert_job_left_nothing(dir: &Path) {
    let id = std::fs::read_to_string(dir.join("job")).expect("rank 0 wrote the job id");
    assert!(!id.is_empty(), "empty job id");
    let prefix = format!("am-{id}-");
    let left = shm_files(|n| n.starts_with(&prefix));
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Checks what [`crate::rank::kill_scenario`] wrote into `dir`: every rank of `survivors`
/// reported rank 1 lost, less than `within` after its death.
///
/// # Panics
/// If a file is missing or malformed, names another rank, or came too late.
pub fn assert_loss_noticed(dir: &Path, survivors: &[u32], within: Duration) {
    let death: u128 = std::fs::read_to_string(dir.join("victim"))
        .expect("the victim ran")
        .parse()
        .expect("the victim's time");
    for r in survivors {
        let s = std::fs::read_to_string(dir.join(format!("lost-{r}")))
            .unwrap_or_else(|_| panic!("rank {r} did not report PeerLost"));
        let (lost, at) = s.split_once(' ').expect("`<rank> <µs>`");
        assert_eq!(lost, "1", "rank {r} names the dead rank");
        let after = at.parse::<u128>().expect("µs").saturating_sub(death);
        assert!(
            after < within.as_micros(),
            "rank {r} noticed after {after} µs"
        );
    }
}

/// Kills the last of 3 ranks of `bin` (on `transport`) at `kills` points spread over a flood
/// ([`crate::rank::kill_anywhere`], the program's `kill-anywhere DIR DELAY_US` mode) and
/// checks each time that both survivors then completed their full exchange and that the job
/// left nothing in `/dev/shm`. The delays come from `seed` and cover `0..max_delay_us`; `env`
/// is set for every rank.
///
/// # Panics
/// On the first job whose survivors did not finish (with its delay, to reproduce it).
pub fn kill_anywhere_jobs(
    bin: &str,
    transport: &str,
    kills: u32,
    max_delay_us: u64,
    seed: u64,
    env: &[(&str, &str)],
) {
    // One job at a time, whatever the test threads: 3 ranks on 2 cores is load enough, and the
    // survivors have the launcher's grace period (a second) to finish.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut x = seed | 1;
    for k in 0..kills {
        // xorshift: reproducible delays, spread over the flood.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let delay = x % max_delay_us.max(1);
        let dir = fresh_dir(&format!("am-kill-anywhere-{transport}-{k}"));
        let before = shm_files(|n| n.starts_with("am-"));
        let arg_dir = dir.display().to_string();
        let arg_delay = delay.to_string();
        // The survivors ignore the launcher's SIGTERM after the death, and get the time to
        // notice it and finish (their own deadlines are 20 s).
        let launcher = Launcher::new(3, bin).grace(Duration::from_secs(30));
        let started = Instant::now();
        let code = run_job_with(
            launcher,
            transport,
            &["kill-anywhere", &arg_dir, &arg_delay],
            env,
        );
        eprintln!(
            "{transport}: kill {k} at {delay} µs: job of {:.2} s",
            started.elapsed().as_secs_f64()
        );
        for r in 0..2 {
            let ok = std::fs::read_to_string(dir.join(format!("ok-{r}")));
            assert!(
                ok.is_ok(),
                "{transport}: kill {k} at {delay} µs: rank {r} did not finish its exchange (job code {code})"
            );
        }
        let after = shm_files(|n| n.starts_with("am-") && !before.iter().any(|b| b == n));
        assert!(after.is_empty(), "{transport}: left behind {after:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// MPICH's `mpiexec` on `PATH`, named explicitly (`mpiexec.mpich`, `mpiexec.hydra`) so
/// that an Open MPI installed as the default `mpiexec` does not stand in for it; else plain
/// `mpiexec`, if any.
pub fn find_mpiexec() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    ["mpiexec.mpich", "mpiexec.hydra", "mpiexec"]
        .iter()
        .find_map(|name| {
            std::env::split_paths(&path)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
        })
}

/// False (after a notice) when MPICH is missing and not required: the test then returns
/// early. With `AM_REQUIRE_MPIEXEC=1` (CI, after installing MPICH) a missing one fails.
pub fn have_mpiexec() -> bool {
    if find_mpiexec().is_some() {
        return true;
    }
    let required = std::env::var("AM_REQUIRE_MPIEXEC").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "mpiexec is not on PATH and AM_REQUIRE_MPIEXEC=1: install MPICH (e.g. `apt-get install mpich`)"
    );
    eprintln!("SKIPPED: mpiexec is not on PATH; install MPICH (e.g. `apt-get install mpich`) to run the mpiexec launch tests");
    false
}

/// MPICH's `mpiexec`, or a failure telling how to get it.
pub fn mpiexec() -> PathBuf {
    let Some(mpiexec) = find_mpiexec() else {
        panic!("mpiexec is not on PATH: install MPICH (e.g. `apt-get install mpich`) to run these tests");
    };
    let version = Command::new(&mpiexec)
        .arg("--version")
        .output()
        .expect("cannot run mpiexec --version");
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(
        text.contains("HYDRA"),
        "{} is not MPICH's hydra mpiexec (install MPICH, e.g. `apt-get install mpich`): {text}",
        mpiexec.display()
    );
    mpiexec
}

/// Waits until `done` holds, checking every 10 ms; false after `within`.
pub fn wait_for(within: Duration, mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if done() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done()
}

/// Whether process `pid` holds open a shared-memory segment: a memfd or a `/dev/shm` file.
pub fn holds_a_segment(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| e.ok()).any(|e| {
                std::fs::read_link(e.path()).is_ok_and(|t| {
                    let t = t.to_string_lossy();
                    t.starts_with("/memfd:am-") || t.starts_with("/dev/shm/am-")
                })
            })
        })
        .unwrap_or(false)
}

/// The processes running `program` whose environment holds `AM_TEST_MARK=mark`: a job's
/// ranks, found without knowing which launcher started them or how (the launchers, which
/// pass the mark on, run other programs). Zombies are not among them: their `exe` link is
/// gone with the process.
pub fn marked_processes(program: &Path, mark: &str) -> Vec<u32> {
    let needle = format!("AM_TEST_MARK={mark}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe == program)
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|&b| b == 0).any(|var| var == needle.as_bytes()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loss_reports_are_checked() {
        let dir = fresh_dir("am-perf-loss");
        std::fs::write(dir.join("victim"), "1000").unwrap();
        std::fs::write(dir.join("lost-0"), "1 1500").unwrap();
        assert_loss_noticed(&dir, &[0], Duration::from_millis(1));
        std::fs::write(dir.join("lost-2"), "1 3000").unwrap();
        let late = std::panic::catch_unwind(|| {
            assert_loss_noticed(&dir, &[0, 2], Duration::from_millis(1))
        });
        std::fs::write(dir.join("lost-2"), "3 1100").unwrap();
        let wrong =
            std::panic::catch_unwind(|| assert_loss_noticed(&dir, &[2], Duration::from_millis(1)));
        let _ = std::fs::remove_dir_all(&dir);
        assert!(late.is_err() && wrong.is_err());
    }
}
