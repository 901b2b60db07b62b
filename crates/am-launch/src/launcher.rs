//! Launcher side: start N local ranks, serve them a PMI-1 key-value store,
//! forward their output and decide the job's exit code.

use std::ffi::{OsStr, OsString};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM};
use signal_hook::SigId;

/// A launcher's message on its stderr. A write error is ignored, never a panic: the launcher's
/// reader may be gone (a parent killed by a timeout), and a launcher that unwound there would
/// leave its ranks running.
macro_rules! say {
    ($($arg:tt)*) => {{
        let _ = writeln!(io::stderr(), $($arg)*);
    }};
}

use am_bootstrap::wire::MAX_MESSAGE;
use am_bootstrap::{is_udp_key, random_job_id, random_job_key, read_key_file, KeyFileError};

use crate::server::{Action, KvsServer};
use crate::shm::remove_job_shm;

/// Transport names `amrun --transport` accepts (passed to ranks as `AM_TRANSPORT`).
pub const TRANSPORTS: &[&str] = &["loopback", "sci", "extoll", "portals", "udp", "ofi"];

/// Serialises spawning across launchers (see [`Job::spawn`]).
static SPAWN_LOCK: Mutex<()> = Mutex::new(());

/// How long ranks get between SIGTERM and SIGKILL, unless [`Launcher::grace`] says otherwise.
const GRACE: Duration = Duration::from_secs(1);
/// Poll wake-up when nothing else is due; SIGCHLD normally wakes us first.
const SAFETY_TICK: Duration = Duration::from_secs(1);
/// Longest output line forwarded in one piece.
const MAX_LINE: usize = 64 * 1024;

/// Why a job could not be run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LaunchError {
    /// The job was asked to have zero ranks.
    #[error("a job needs at least one rank")]
    NoRanks,
    /// The transport name is not one of [`TRANSPORTS`].
    #[error("unknown transport {name:?}; known transports: {}", TRANSPORTS.join(", "))]
    UnknownTransport {
        /// The name given.
        name: String,
    },
    /// A rank's process could not be started.
    #[error("cannot start rank {rank} ({}): {source}", program.display())]
    Spawn {
        /// The rank.
        rank: u32,
        /// The program.
        program: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The launcher itself hit an I/O error.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The job key given for a udp job (`AM_UDP_KEY`, or `AM_UDP_KEY_FILE` and the file it
    /// names) is unusable: found before any rank starts.
    #[error("{var}: {why}")]
    UdpKey {
        /// The variable.
        var: &'static str,
        /// What is wrong.
        why: String,
    },
    /// The key file `AM_UDP_KEY_FILE` names cannot be used as a secret (not readable, not a
    /// regular file, not this user's, or readable by others): found before any rank starts,
    /// by the check every rank makes.
    #[error("AM_UDP_KEY_FILE: {0}")]
    UdpKeyFile(#[source] KeyFileError),
    /// [`self_launch`] was called from a process that already is a rank.
    #[error("this process is already a rank of a job (AM_RANK is set); check JobInfo::is_launched() before self_launch")]
    Nested,
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> LaunchError {
    move |source| LaunchError::Io { what, source }
}

/// Starts a job of local processes, like `amrun`.
///
/// Each rank gets `AM_RANK`, `AM_SIZE`, `AM_JOB_ID` (16 random hex digits,
/// fresh per job), in a job of transport `udp` only the UDP transport's MAC
/// key (see below), `AM_LAUNCHER=amrun`, `AM_PMI_FD` (its end of a socket pair
/// speaking PMI-1, so [`crate::JobInfo::from_env`] finds a key-value store)
/// and, if set, `AM_TRANSPORT`. Ranks share a process group of their own and
/// read stdin from `/dev/null`.
///
/// **The udp key.** Ranks of a `udp` job get the key through a pipe, never the
/// environment: `AM_UDP_KEY_FD` names the read end, which holds 64 hex digits;
/// the rank reads it once and closes it, so what it starts later finds neither
/// the key in its environment nor an open pipe. The key is the user's own when
/// the launcher's environment (or [`Launcher::env`]) has `AM_UDP_KEY`, else a
/// fresh random one per job. With `AM_UDP_KEY_FILE` instead, the launcher checks
/// the file as the ranks will (see [`crate::read_key_file`]) and passes the path
/// through, and there is no pipe. Ranks of other transports get neither, not even
/// one inherited.
///
/// ```no_run
/// let code = am_launch::Launcher::new(4, "./my_program")
///     .args(["--size", "1024"])
///     .transport("udp")
///     .run()?;
/// std::process::exit(code);
/// # Ok::<(), am_launch::LaunchError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Launcher {
    /// How the launcher names itself in its messages.
    name: String,
    ranks: u32,
    program: PathBuf,
    args: Vec<OsString>,
    transport: Option<String>,
    env: Vec<(OsString, OsString)>,
    prefix_output: bool,
    verbose: bool,
    grace: Duration,
}

impl Launcher {
    /// A job of `ranks` copies of `program`.
    ///
    /// Verbose mode starts on when `AM_LAUNCH_VERBOSE` is set to anything but `0`.
    pub fn new(ranks: u32, program: impl Into<PathBuf>) -> Self {
        let verbose =
            std::env::var_os("AM_LAUNCH_VERBOSE").is_some_and(|v| !v.is_empty() && v != "0");
        Self {
            name: "amrun".to_owned(),
            ranks,
            program: program.into(),
            args: Vec::new(),
            transport: None,
            env: Vec::new(),
            prefix_output: true,
            verbose,
            grace: GRACE,
        }
    }

    /// How long the other ranks get, after SIGTERM, before SIGKILL when a rank fails
    /// (default 1 s): ranks that outlive a peer's death on purpose (tests of what survivors
    /// do) ignore SIGTERM and need the time.
    #[must_use]
    pub fn grace(mut self, grace: Duration) -> Self {
        self.grace = grace;
        self
    }

    /// How the launcher names itself in what it prints (default `amrun`): a program that
    /// starts its own job uses its own name, so messages do not mention a command the user
    /// never ran.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Appends arguments for every rank.
    #[must_use]
    pub fn args(mut self, args: impl IntoIterator<Item = impl Into<OsString>>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Sets `AM_TRANSPORT` for the ranks; must be one of [`TRANSPORTS`] (checked by [`run`](Self::run)).
    #[must_use]
    pub fn transport(mut self, name: &str) -> Self {
        self.transport = Some(name.to_owned());
        self
    }

    /// Sets an extra environment variable for every rank.
    #[must_use]
    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_owned(), value.as_ref().to_owned()));
        self
    }

    /// Whether to prefix each output line of rank r with `[r] ` (default true).
    ///
    /// Without prefixes the ranks write straight to the launcher's stdout and stderr.
    #[must_use]
    pub fn prefix_output(mut self, yes: bool) -> Self {
        self.prefix_output = yes;
        self
    }

    /// Whether to report the job id and shared-memory cleanup on stderr.
    #[must_use]
    pub fn verbose(mut self, yes: bool) -> Self {
        self.verbose = yes;
        self
    }

    /// Runs the job to completion and returns its exit code.
    ///
    /// The code is the first non-zero exit code of any rank (128+S for a rank
    /// killed by signal S), the code a rank passed to PMI `abort`, or 0. When
    /// a rank fails or aborts, the others get SIGTERM, then SIGKILL after a
    /// second. SIGINT, SIGTERM and SIGHUP to the launcher do the same and make
    /// the code 128+signal (a second signal sends SIGKILL at once). Every rank
    /// has been reaped when this returns, and `/dev/shm/am-<job_id>-*` files
    /// have been removed.
    ///
    /// Handlers for those signals and SIGCHLD are installed while the job
    /// runs; afterwards they stay installed but do nothing, so this is meant
    /// for processes whose job is to launch.
    pub fn run(self) -> Result<i32, LaunchError> {
        if self.ranks == 0 {
            return Err(LaunchError::NoRanks);
        }
        if let Some(t) = &self.transport {
            if !TRANSPORTS.contains(&t.as_str()) {
                return Err(LaunchError::UnknownTransport { name: t.clone() });
            }
        }
        let job_id = random_job_id().map_err(io_err("reading /dev/urandom for a job id"))?;
        let job_key = self.udp_key()?;
        if self.verbose {
            say!(
                "{}: job {job_id}: starting {} rank(s) of {}",
                self.name,
                self.ranks,
                self.program.display()
            );
        }
        let result = self.run_job(&job_id, job_key);
        match remove_job_shm(&job_id) {
            Ok(n) if self.verbose => {
                say!(
                    "{}: job {job_id}: removed {n} shared-memory file(s)",
                    self.name
                )
            }
            Ok(_) => {}
            Err(e) => say!(
                "{}: job {job_id}: cannot clean up /dev/shm/am-{job_id}-*: {e}",
                self.name
            ),
        }
        result
    }

    /// The value of `name` the ranks would see: set by [`Launcher::env`] (the last one),
    /// else inherited; empty is unset.
    fn env_value(&self, name: &str) -> Option<OsString> {
        self.env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| std::env::var_os(name))
            .filter(|v| !v.is_empty())
    }

    /// How the ranks of a udp job get their key (nothing for other transports).
    fn udp_key(&self) -> Result<UdpKey, LaunchError> {
        if self.transport.as_deref() != Some("udp") {
            return Ok(UdpKey::None);
        }
        let bad = |var, why: String| LaunchError::UdpKey { var, why };
        match (
            self.env_value("AM_UDP_KEY"),
            self.env_value("AM_UDP_KEY_FILE"),
        ) {
            (Some(_), Some(_)) => Err(bad(
                "AM_UDP_KEY_FILE",
                "set AM_UDP_KEY or AM_UDP_KEY_FILE, not both".into(),
            )),
            (Some(k), None) => match k.to_str() {
                Some(k) if is_udp_key(k) => Ok(UdpKey::Pipe(k.trim().to_owned())),
                _ => Err(bad(
                    "AM_UDP_KEY",
                    "a job key is 64 hexadecimal digits".into(),
                )),
            },
            (None, Some(path)) => {
                // Checked here as every rank will check it, so a bad file fails the launch
                // once, clearly, instead of every rank.
                let path = path.to_string_lossy().into_owned();
                let text = read_key_file(&path, 256).map_err(LaunchError::UdpKeyFile)?;
                if !is_udp_key(&text) {
                    return Err(bad(
                        "AM_UDP_KEY_FILE",
                        format!("{path} does not hold a job key (64 hexadecimal digits)"),
                    ));
                }
                Ok(UdpKey::File)
            }
            // Fresh for every job, seen only by its ranks.
            (None, None) => Ok(UdpKey::Pipe(
                random_job_key().map_err(io_err("reading /dev/urandom for a job key"))?,
            )),
        }
    }

    fn run_job(&self, job_id: &str, job_key: UdpKey) -> Result<i32, LaunchError> {
        // Before spawning, so no SIGCHLD is missed.
        let signals = SignalPipes::install()?;
        let mut job = Job::new(self, job_id, job_key);
        // On an error (or a panic) the job's drop ends the ranks still running.
        (0..self.ranks)
            .try_for_each(|r| job.spawn(self, r))
            .and_then(|()| job.event_loop(&signals))
    }
}

/// For programs that start their own job (`--ranks N`): re-executes the
/// current executable N times with the same arguments under [`Launcher`];
/// returns the job exit code.
///
/// The ranks see the same arguments, so the program must check
/// [`crate::JobInfo::is_launched`] before calling this; calling it from a rank
/// returns [`LaunchError::Nested`] instead of starting a job per rank.
pub fn self_launch(ranks: u32, transport: Option<&str>) -> Result<i32, LaunchError> {
    let mut launcher = self_launcher(ranks)?;
    if let Some(t) = transport {
        launcher = launcher.transport(t);
    }
    launcher.run()
}

/// The [`Launcher`] [`self_launch`] runs, to adjust before [`Launcher::run`] (for example
/// [`Launcher::prefix_output`]): `ranks` copies of the current executable with the same
/// arguments, named after it in messages.
pub fn self_launcher(ranks: u32) -> Result<Launcher, LaunchError> {
    if std::env::var_os("AM_RANK").is_some() {
        return Err(LaunchError::Nested);
    }
    let exe = std::env::current_exe().map_err(io_err("finding the current executable"))?;
    let name = exe.file_name().map_or_else(
        || "self-launch".into(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(Launcher::new(ranks, exe)
        .name(name)
        .args(std::env::args_os().skip(1)))
}

/// Self-pipes written by signal handlers, so one `poll` sees signals, output and PMI.
struct SignalPipes {
    ids: Vec<SigId>,
    chld: Option<UnixStream>,
    term: Vec<(i32, UnixStream)>,
}

impl SignalPipes {
    fn install() -> Result<Self, LaunchError> {
        let mut pipes = SignalPipes {
            ids: Vec::new(),
            chld: None,
            term: Vec::new(),
        };
        let what = "installing signal handlers";
        for sig in [SIGCHLD, SIGINT, SIGTERM, SIGHUP] {
            let (read, write) = UnixStream::pair().map_err(io_err(what))?;
            read.set_nonblocking(true).map_err(io_err(what))?;
            pipes
                .ids
                .push(signal_hook::low_level::pipe::register(sig, write).map_err(io_err(what))?);
            if sig == SIGCHLD {
                pipes.chld = Some(read);
            } else {
                pipes.term.push((sig, read));
            }
        }
        Ok(pipes)
    }
}

impl Drop for SignalPipes {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}

/// Empties a non-blocking self-pipe.
fn drain(mut s: &UnixStream) {
    let mut buf = [0u8; 64];
    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
}

/// Errors after which a read may simply be retried on the next poll.
fn transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
    )
}

enum Pipe {
    Out(ChildStdout),
    Err(ChildStderr),
}

/// One rank's stdout or stderr, forwarded line by line with a `[r] ` prefix.
struct Output {
    pipe: Pipe,
    pending: Vec<u8>,
}

impl Output {
    fn fd(&self) -> BorrowedFd<'_> {
        match &self.pipe {
            Pipe::Out(p) => p.as_fd(),
            Pipe::Err(p) => p.as_fd(),
        }
    }

    /// Reads what is available; returns false at end of file.
    fn pump(&mut self, rank: u32) -> bool {
        let mut buf = [0u8; 16 * 1024];
        let n = match &mut self.pipe {
            Pipe::Out(p) => p.read(&mut buf),
            Pipe::Err(p) => p.read(&mut buf),
        };
        match n {
            Err(e) if transient(&e) => true,
            Ok(0) | Err(_) => {
                self.finish(rank);
                false
            }
            Ok(n) => {
                self.pending.extend_from_slice(&buf[..n]);
                self.emit(rank, false);
                true
            }
        }
    }

    /// Writes complete lines (all of `pending` when `all`), each with its prefix.
    fn emit(&mut self, rank: u32, all: bool) {
        let out = take_lines(&mut self.pending, &format!("[{rank}] "), all);
        if !out.is_empty() {
            // One write per batch of whole lines, so ranks never mix within a line.
            // Errors (e.g. a closed pipe) are ignored: the ranks must keep running.
            let _ = match self.pipe {
                Pipe::Out(_) => io::stdout().lock().write_all(&out),
                Pipe::Err(_) => io::stderr().lock().write_all(&out),
            };
        }
    }

    fn finish(&mut self, rank: u32) {
        self.emit(rank, true);
    }
}

/// Removes the complete lines from `pending` and returns them, each after
/// `prefix`. A partial line stays unless `all` is set or it has grown to
/// [`MAX_LINE`]; then it is returned too, with a newline added.
fn take_lines(pending: &mut Vec<u8>, prefix: &str, all: bool) -> Vec<u8> {
    let mut out = Vec::new();
    let mut start = 0;
    while let Some(pos) = pending[start..].iter().position(|&b| b == b'\n') {
        out.extend_from_slice(prefix.as_bytes());
        out.extend_from_slice(&pending[start..=start + pos]);
        start += pos + 1;
    }
    if start < pending.len() && (all || pending.len() - start >= MAX_LINE) {
        out.extend_from_slice(prefix.as_bytes());
        out.extend_from_slice(&pending[start..]);
        out.push(b'\n');
        start = pending.len();
    }
    pending.drain(..start);
    out
}

/// The launcher's end of a rank's PMI socket.
struct PmiConn {
    sock: UnixStream,
    pending: Vec<u8>,
}

struct Rank {
    child: Child,
    /// Exit code once reaped (128+S for signal S).
    exit: Option<i32>,
    stdout: Option<Output>,
    stderr: Option<Output>,
    pmi: Option<PmiConn>,
}

#[derive(Clone, Copy)]
enum Source {
    Chld,
    Term(i32),
    Stdout(usize),
    Stderr(usize),
    Pmi(usize),
}

struct Job {
    /// The launcher's name in messages.
    name: String,
    job_id: String,
    udp_key: UdpKey,
    size: u32,
    ranks: Vec<Rank>,
    kvs: KvsServer,
    pgid: Option<Pid>,
    /// The job's exit code, fixed by the first failure.
    outcome: Option<i32>,
    /// When SIGKILL follows the SIGTERM already sent.
    kill_deadline: Option<Instant>,
    killed_hard: bool,
    /// Between SIGTERM and SIGKILL.
    grace: Duration,
}

impl Drop for Job {
    /// A job that ends before its ranks (an error of the launcher's own, or a panic) kills
    /// and reaps them; a job that ran to its end has none left, and this does nothing. A
    /// launcher that unwinds also removes the job's shared-memory files here: nothing else
    /// would.
    fn drop(&mut self) {
        self.signal_all(Signal::SIGKILL);
        self.reap_blocking();
        if std::thread::panicking() {
            let _ = remove_job_shm(&self.job_id);
        }
    }
}

/// How the ranks of a job get the UDP transport's key.
#[derive(Debug)]
enum UdpKey {
    /// Not a udp job: no key.
    None,
    /// Through a pipe (`AM_UDP_KEY_FD`) holding this key.
    Pipe(String),
    /// From the user's `AM_UDP_KEY_FILE`, passed through (already checked).
    File,
}

/// The read end of a pipe that holds `key` and a newline, its write end closed, inheritable
/// (spawn under [`SPAWN_LOCK`], as the PMI socket).
fn key_pipe_for(key: &str) -> Result<std::os::fd::OwnedFd, LaunchError> {
    let err = |e: nix::Error| LaunchError::Io {
        what: "passing the udp key to a rank",
        source: e.into(),
    };
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(err)?;
    // 65 bytes fit any pipe's buffer: the write never blocks.
    std::fs::File::from(write)
        .write_all(format!("{key}\n").as_bytes())
        .map_err(io_err("passing the udp key to a rank"))?;
    fcntl(read.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty())).map_err(err)?;
    Ok(read)
}

fn status_code(status: std::process::ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

fn describe(code: i32) -> String {
    match Signal::try_from(code - 128) {
        Ok(sig) if code > 128 => format!("was killed by {sig}"),
        _ => format!("exited with code {code}"),
    }
}

impl Job {
    fn new(cfg: &Launcher, job_id: &str, udp_key: UdpKey) -> Self {
        Self {
            name: cfg.name.clone(),
            job_id: job_id.to_owned(),
            udp_key,
            size: cfg.ranks,
            ranks: Vec::with_capacity(cfg.ranks as usize),
            kvs: KvsServer::new(cfg.ranks, job_id),
            pgid: None,
            outcome: None,
            kill_deadline: None,
            killed_hard: false,
            grace: cfg.grace,
        }
    }

    fn spawn(&mut self, cfg: &Launcher, rank: u32) -> Result<(), LaunchError> {
        // While a rank's socket end is inheritable, no other launcher in this
        // process may spawn, or its rank would inherit that end too.
        let _guard = SPAWN_LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        let (ours, theirs) = UnixStream::pair().map_err(io_err("creating a PMI socket pair"))?;
        // std creates sockets close-on-exec; the rank's end must survive exec.
        fcntl(theirs.as_raw_fd(), FcntlArg::F_SETFD(FdFlag::empty())).map_err(|e| {
            LaunchError::Io {
                what: "passing the PMI socket to a rank",
                source: e.into(),
            }
        })?;
        let mut cmd = Command::new(&cfg.program);
        cmd.args(&cfg.args);
        for (k, v) in &cfg.env {
            cmd.env(k, v);
        }
        // The key goes only where it is needed, and never into an environment: a secret in
        // the environment of ranks that never use it, or of whatever a rank starts, is only
        // a secret spread further. A pipe is read once and closed by the rank.
        let mut key_pipe = None;
        match &self.udp_key {
            UdpKey::None => {
                if !cfg.env.iter().any(|(k, _)| k == "AM_UDP_KEY") {
                    cmd.env_remove("AM_UDP_KEY");
                }
                cmd.env_remove("AM_UDP_KEY_FD");
            }
            UdpKey::File => {
                cmd.env_remove("AM_UDP_KEY").env_remove("AM_UDP_KEY_FD");
            }
            UdpKey::Pipe(key) => {
                let pipe = key_pipe_for(key)?;
                cmd.env_remove("AM_UDP_KEY")
                    .env("AM_UDP_KEY_FD", pipe.as_raw_fd().to_string());
                key_pipe = Some(pipe);
            }
        }
        cmd.env("AM_RANK", rank.to_string())
            .env("AM_SIZE", self.size.to_string())
            .env("AM_JOB_ID", &self.job_id)
            .env("AM_LAUNCHER", "amrun")
            .env("AM_PMI_FD", theirs.as_raw_fd().to_string());
        if let Some(t) = &cfg.transport {
            cmd.env("AM_TRANSPORT", t);
        }
        cmd.stdin(Stdio::null());
        if cfg.prefix_output {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        cmd.process_group(self.pgid.map_or(0, Pid::as_raw));
        let mut child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            rank,
            program: cfg.program.clone(),
            source,
        })?;
        drop(theirs);
        drop(key_pipe);
        if self.pgid.is_none() {
            self.pgid = Some(Pid::from_raw(child.id() as i32));
        }
        let stdout = child.stdout.take().map(|p| Output {
            pipe: Pipe::Out(p),
            pending: Vec::new(),
        });
        let stderr = child.stderr.take().map(|p| Output {
            pipe: Pipe::Err(p),
            pending: Vec::new(),
        });
        self.ranks.push(Rank {
            child,
            exit: None,
            stdout,
            stderr,
            pmi: Some(PmiConn {
                sock: ours,
                pending: Vec::new(),
            }),
        });
        Ok(())
    }

    fn running(&self) -> bool {
        self.ranks.iter().any(|r| r.exit.is_none())
    }

    /// Signals every unreaped rank, and their process group (for any children they started).
    fn signal_all(&mut self, sig: Signal) {
        if !self.running() {
            // Once all are reaped the group id may be reused: never signal it then.
            return;
        }
        for r in self.ranks.iter().filter(|r| r.exit.is_none()) {
            let _ = kill(Pid::from_raw(r.child.id() as i32), sig);
        }
        if let Some(pgid) = self.pgid {
            let _ = killpg(pgid, sig);
        }
    }

    /// Records a failure (the first one fixes the exit code) and ends the job.
    fn fail(&mut self, code: i32) {
        self.outcome.get_or_insert(code);
        if self.kill_deadline.is_none() {
            self.kill_deadline = Some(Instant::now() + self.grace);
            self.signal_all(Signal::SIGTERM);
        }
    }

    fn ending(&self) -> bool {
        self.kill_deadline.is_some()
    }

    fn reap(&mut self) {
        for i in 0..self.ranks.len() {
            if self.ranks[i].exit.is_some() {
                continue;
            }
            let code = match self.ranks[i].child.try_wait() {
                Ok(None) => continue,
                Ok(Some(status)) => status_code(status),
                Err(e) => {
                    // Someone else reaped it (e.g. SIGCHLD ignored): the status is lost.
                    say!("{}: lost the exit status of rank {i}: {e}", self.name);
                    1
                }
            };
            self.ranks[i].exit = Some(code);
            if code != 0 {
                if !self.ending() && self.running() {
                    say!("{}: rank {i} {}; ending the job", self.name, describe(code));
                }
                self.fail(code);
            }
        }
    }

    fn reap_blocking(&mut self) {
        for r in self.ranks.iter_mut().filter(|r| r.exit.is_none()) {
            r.exit = Some(r.child.wait().map_or(1, status_code));
        }
    }

    /// A rank that exited can never join a barrier others wait in (a rank in
    /// a barrier cannot exit before it is released): the job would hang, so end it.
    fn check_stuck_barrier(&mut self) {
        if self.ending() {
            return;
        }
        let ranks = &self.ranks;
        let stuck = self.kvs.stuck_barrier(|r| ranks[r as usize].exit.is_some());
        if let Some(r) = stuck {
            say!(
                "{}: rank {r} exited while other ranks wait in a key-value fence; ending the job",
                self.name
            );
            self.fail(1);
        }
    }

    fn pmi_input(&mut self, i: usize) {
        let Some(conn) = self.ranks[i].pmi.as_mut() else {
            return;
        };
        let mut buf = [0u8; 4096];
        let n = match conn.sock.read(&mut buf) {
            Err(e) if transient(&e) => return,
            Ok(0) | Err(_) => 0,
            Ok(n) => n,
        };
        if n == 0 {
            self.ranks[i].pmi = None;
            return;
        }
        conn.pending.extend_from_slice(&buf[..n]);
        let mut lines = Vec::new();
        while let Some(pos) = conn.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = conn.pending.drain(..=pos).collect();
            lines.push(String::from_utf8_lossy(&line[..pos]).into_owned());
        }
        if conn.pending.len() > MAX_MESSAGE {
            say!(
                "{}: rank {i} sent an overlong PMI message; closing its connection",
                self.name
            );
            self.ranks[i].pmi = None;
        }
        for line in lines {
            for action in self.kvs.handle(i as u32, &line) {
                self.apply(action);
            }
        }
    }

    fn apply(&mut self, action: Action) {
        match action {
            Action::Reply(r, text) => {
                let rank = &mut self.ranks[r as usize];
                if let Some(conn) = rank.pmi.as_mut() {
                    if conn.sock.write_all(text.as_bytes()).is_err() {
                        rank.pmi = None;
                    }
                }
            }
            Action::Abort { rank, code } => {
                if !self.ending() {
                    say!(
                        "{}: rank {rank} aborted the job with exit code {code}",
                        self.name
                    );
                }
                self.fail(code);
            }
        }
    }

    fn event_loop(&mut self, signals: &SignalPipes) -> Result<i32, LaunchError> {
        loop {
            self.reap();
            self.check_stuck_barrier();
            if !self.running() {
                break;
            }
            let now = Instant::now();
            let mut timeout = SAFETY_TICK;
            if let Some(deadline) = self.kill_deadline {
                if !self.killed_hard {
                    if now >= deadline {
                        self.killed_hard = true;
                        self.signal_all(Signal::SIGKILL);
                    } else {
                        timeout = timeout.min(deadline - now);
                    }
                }
            }
            for src in self.wait(signals, timeout)? {
                match src {
                    Source::Chld => {
                        if let Some(p) = &signals.chld {
                            drain(p);
                        }
                    }
                    Source::Term(sig) => {
                        if let Some((_, p)) = signals.term.iter().find(|(s, _)| *s == sig) {
                            drain(p);
                        }
                        if self.ending() {
                            self.killed_hard = true;
                            self.signal_all(Signal::SIGKILL);
                        } else {
                            let name = Signal::try_from(sig).map_or("a signal", Signal::as_str);
                            say!("{}: got {name}; ending the job", self.name);
                        }
                        self.fail(128 + sig);
                    }
                    Source::Stdout(i) => self.pump(i, false),
                    Source::Stderr(i) => self.pump(i, true),
                    Source::Pmi(i) => self.pmi_input(i),
                }
            }
        }
        self.drain_outputs()?;
        Ok(self.outcome.unwrap_or(0))
    }

    fn pump(&mut self, i: usize, err: bool) {
        let rank = i as u32;
        let slot = if err {
            &mut self.ranks[i].stderr
        } else {
            &mut self.ranks[i].stdout
        };
        if let Some(out) = slot {
            if !out.pump(rank) {
                *slot = None;
            }
        }
    }

    /// Polls everything we listen to; returns what is ready.
    fn wait(&self, signals: &SignalPipes, timeout: Duration) -> Result<Vec<Source>, LaunchError> {
        let mut fds = Vec::new();
        let mut srcs = Vec::new();
        let flags = PollFlags::POLLIN;
        if let Some(p) = &signals.chld {
            fds.push(PollFd::new(p.as_fd(), flags));
            srcs.push(Source::Chld);
        }
        for (sig, p) in &signals.term {
            fds.push(PollFd::new(p.as_fd(), flags));
            srcs.push(Source::Term(*sig));
        }
        self.output_fds(&mut fds, &mut srcs);
        for (i, r) in self.ranks.iter().enumerate() {
            if let Some(c) = &r.pmi {
                fds.push(PollFd::new(c.sock.as_fd(), flags));
                srcs.push(Source::Pmi(i));
            }
        }
        // Round up so a pending deadline does not spin.
        let ms = u16::try_from(timeout.as_micros().div_ceil(1000)).unwrap_or(u16::MAX);
        poll_ready(&mut fds, &srcs, PollTimeout::from(ms))
    }

    fn output_fds<'a>(&'a self, fds: &mut Vec<PollFd<'a>>, srcs: &mut Vec<Source>) {
        for (i, r) in self.ranks.iter().enumerate() {
            if let Some(o) = &r.stdout {
                fds.push(PollFd::new(o.fd(), PollFlags::POLLIN));
                srcs.push(Source::Stdout(i));
            }
            if let Some(o) = &r.stderr {
                fds.push(PollFd::new(o.fd(), PollFlags::POLLIN));
                srcs.push(Source::Stderr(i));
            }
        }
    }

    /// After the last rank is reaped: forward what is already in the pipes,
    /// without waiting for descendants that may still hold them open.
    fn drain_outputs(&mut self) -> Result<(), LaunchError> {
        for _ in 0..1024 {
            let mut fds = Vec::new();
            let mut srcs = Vec::new();
            self.output_fds(&mut fds, &mut srcs);
            if fds.is_empty() {
                break;
            }
            let ready = poll_ready(&mut fds, &srcs, PollTimeout::ZERO)?;
            if ready.is_empty() {
                break;
            }
            for src in ready {
                match src {
                    Source::Stdout(i) => self.pump(i, false),
                    Source::Stderr(i) => self.pump(i, true),
                    _ => {}
                }
            }
        }
        for (i, r) in self.ranks.iter_mut().enumerate() {
            for mut out in [r.stdout.take(), r.stderr.take()].into_iter().flatten() {
                out.finish(i as u32);
            }
        }
        Ok(())
    }
}

fn poll_ready(
    fds: &mut [PollFd<'_>],
    srcs: &[Source],
    timeout: PollTimeout,
) -> Result<Vec<Source>, LaunchError> {
    match poll(fds, timeout) {
        Ok(_) => {}
        // A signal arrived; its self-pipe will be readable on the next round.
        Err(nix::errno::Errno::EINTR) => return Ok(Vec::new()),
        Err(e) => {
            return Err(LaunchError::Io {
                what: "waiting for the ranks",
                source: e.into(),
            })
        }
    }
    Ok(fds
        .iter()
        .zip(srcs)
        .filter(|(fd, _)| fd.revents().is_some_and(|r| !r.is_empty()))
        .map(|(_, s)| *s)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// Shell helpers for rank scripts: PMI-1 requests over `AM_PMI_FD`.
    const SH_PMI: &str = r#"
req() { printf '%s\n' "$1" >&$AM_PMI_FD; read -r REPLY <&$AM_PMI_FD; }
fence() { req 'cmd=barrier_in'; }
"#;

    fn sh(ranks: u32, script: &str) -> Launcher {
        Launcher::new(ranks, "/bin/bash")
            .args(["-c", &format!("{SH_PMI}\n{script}")])
            .verbose(false)
    }

    fn temp_dir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("am-launch-test-{}", random_job_id().unwrap()));
        std::fs::create_dir(&dir).unwrap();
        dir
    }

    /// Waits (bounded, as a safety net) until `pid` no longer runs.
    fn assert_gone(pid: &str) {
        let stat = Path::new("/proc").join(pid).join("stat");
        for _ in 0..1000 {
            match std::fs::read_to_string(&stat) {
                Err(_) => return,
                // Dead but not yet reaped by its new parent.
                Ok(s)
                    if s.rsplit(')')
                        .next()
                        .is_some_and(|rest| rest.trim_start().starts_with('Z')) =>
                {
                    return
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
        panic!("process {pid} is still running");
    }

    #[test]
    fn prefixes_whole_lines_only() {
        let mut p = b"a\nbc".to_vec();
        assert_eq!(take_lines(&mut p, "[1] ", false), b"[1] a\n");
        assert_eq!(p, b"bc");
        p.extend_from_slice(b"d\n\ne");
        assert_eq!(take_lines(&mut p, "[1] ", false), b"[1] bcd\n[1] \n");
        assert_eq!(take_lines(&mut p, "[1] ", true), b"[1] e\n");
        assert!(p.is_empty());
        assert!(take_lines(&mut p, "[1] ", true).is_empty());
        let mut long = vec![b'x'; MAX_LINE];
        assert_eq!(take_lines(&mut long, "", false).len(), MAX_LINE + 1);
        assert!(long.is_empty());
    }

    #[test]
    fn rejects_bad_jobs_up_front() {
        assert!(matches!(
            Launcher::new(0, "/bin/true").run(),
            Err(LaunchError::NoRanks)
        ));
        let e = Launcher::new(1, "/bin/true")
            .transport("tcp")
            .run()
            .unwrap_err();
        assert!(matches!(e, LaunchError::UnknownTransport { .. }));
        assert!(
            e.to_string()
                .contains("loopback, sci, extoll, portals, udp"),
            "{e}"
        );
        match Launcher::new(2, "/nonexistent/program").run() {
            Err(LaunchError::Spawn {
                rank: 0, source, ..
            }) => {
                assert_eq!(source.kind(), io::ErrorKind::NotFound)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ranks_get_their_environment() {
        let code = sh(
            3,
            r#"
case "$AM_JOB_ID" in *[!0-9a-f]*|'') exit 10;; esac
[ ${#AM_JOB_ID} = 16 ] || exit 11
[ -z "${AM_UDP_KEY+set}" ] || exit 15
read -r key <&$AM_UDP_KEY_FD || exit 16
case "$key" in *[!0-9a-f]*|'') exit 13;; esac
[ ${#key} = 64 ] || exit 14
[ "$AM_SIZE" = 3 ] && [ "$AM_LAUNCHER" = amrun ] || exit 12
[ "$AM_TRANSPORT" = udp ] && [ "$EXTRA" = yes ] || exit 13
[ "$AM_RANK" -ge 0 ] && [ "$AM_RANK" -lt 3 ] || exit 14
"#,
        )
        .transport("udp")
        .env("EXTRA", "yes")
        .run()
        .unwrap();
        assert_eq!(code, 0);
    }

    #[test]
    fn only_ranks_of_a_udp_job_get_the_udp_key() {
        for transport in [None, Some("loopback"), Some("sci")] {
            let mut l = sh(
                2,
                r#"[ -z "${AM_UDP_KEY+set}${AM_UDP_KEY_FD+set}" ] || exit 30"#,
            );
            if let Some(t) = transport {
                l = l.transport(t);
            }
            assert_eq!(l.run().unwrap(), 0, "{transport:?}");
        }
    }

    #[test]
    fn a_users_udp_key_reaches_the_ranks_through_the_pipe_only() {
        let key = "0123456789abcdef".repeat(4);
        let l = sh(
            2,
            &format!(
                r#"[ -z "${{AM_UDP_KEY+set}}" ] || exit 30
read -r key <&$AM_UDP_KEY_FD || exit 31
[ "$key" = {key} ] || exit 32
# Read once: the pipe is empty now, as for whatever the rank starts after reading.
if read -r again <&$AM_UDP_KEY_FD; then exit 33; fi"#
            ),
        )
        .transport("udp")
        .env("AM_UDP_KEY", &key);
        assert_eq!(l.run().unwrap(), 0);
        let e = sh(1, "true")
            .transport("udp")
            .env("AM_UDP_KEY", "12")
            .run()
            .unwrap_err();
        assert!(
            matches!(
                e,
                LaunchError::UdpKey {
                    var: "AM_UDP_KEY",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn udp_key_file_is_checked_then_passed_through() {
        use std::os::unix::fs::PermissionsExt;
        let dir = temp_dir();
        let path = dir.join("key");
        std::fs::write(&path, format!("{}\n", "ab".repeat(32))).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let run = |script: &str| {
            sh(2, script)
                .transport("udp")
                .env("AM_UDP_KEY_FILE", &path)
                .run()
        };
        // The ranks get the path, and neither a key nor a pipe of the launcher's.
        let code = run(&format!(
            r#"[ "$AM_UDP_KEY_FILE" = {} ] || exit 30
[ -z "${{AM_UDP_KEY+set}}${{AM_UDP_KEY_FD+set}}" ] || exit 31"#,
            path.display()
        ));
        assert_eq!(code.unwrap(), 0);
        // What a rank would refuse, the launcher refuses before starting any rank: a file
        // others can read, a symbolic link, a file that holds no key, a key given twice.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = run("exit 40").unwrap_err();
        assert!(
            matches!(
                &e,
                LaunchError::UdpKeyFile(KeyFileError::Permissions { mode, .. }) if mode & 0o777 == 0o644
            ),
            "{e}"
        );
        assert!(e.to_string().contains("chmod 600"), "{e}");
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<KeyFileError>());
        assert!(
            matches!(source, Some(KeyFileError::Permissions { .. })),
            "{e}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        let e = sh(1, "exit 40")
            .transport("udp")
            .env("AM_UDP_KEY_FILE", &link)
            .run()
            .unwrap_err();
        assert!(
            matches!(e, LaunchError::UdpKeyFile(KeyFileError::Io { .. })),
            "{e}"
        );
        std::fs::write(&path, "not a key").unwrap();
        assert!(matches!(
            run("exit 40"),
            Err(LaunchError::UdpKey {
                var: "AM_UDP_KEY_FILE",
                ..
            })
        ));
        let e = sh(1, "exit 40")
            .transport("udp")
            .env("AM_UDP_KEY_FILE", &path)
            .env("AM_UDP_KEY", "ab".repeat(32))
            .run()
            .unwrap_err();
        assert!(e.to_string().contains("not both"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn kvs_all_gather_between_shell_ranks() {
        let code = sh(
            4,
            r#"
req 'cmd=init pmi_version=1 pmi_subversion=1'
case "$REPLY" in *rc=0*) ;; *) exit 20;; esac
req 'cmd=get_my_kvsname'; kvs=${REPLY#*kvsname=}; kvs=${kvs%% *}
[ "$kvs" = "$AM_JOB_ID" ] || exit 21
req "cmd=put kvsname=$kvs key=k$AM_RANK value=v=$AM_RANK"
fence
i=0
while [ $i -lt $AM_SIZE ]; do
  req "cmd=get kvsname=$kvs key=k$i"
  case "$REPLY" in *"value=v=$i"*) ;; *) exit 22;; esac
  i=$((i+1))
done
fence
req 'cmd=finalize'
"#,
        )
        .run()
        .unwrap();
        assert_eq!(code, 0);
    }

    #[test]
    fn first_failure_sets_the_exit_code() {
        // Everyone passes the fence first, so rank 1's exit is the only failure.
        let code = sh(3, r#"fence; [ $AM_RANK = 1 ] && exit 3; exit 0"#)
            .run()
            .unwrap();
        assert_eq!(code, 3);
        let code = sh(2, r#"fence; [ $AM_RANK = 0 ] && kill -USR1 $$; exit 0"#)
            .run()
            .unwrap();
        assert_eq!(code, 128 + 10);
    }

    #[test]
    fn failure_kills_other_ranks_and_their_children() {
        let dir = temp_dir();
        let script = format!(
            r#"
if [ $AM_RANK != 0 ]; then
  # Only reap the child on SIGTERM: killing it is the launcher's job (killpg).
  # Reaping keeps the test from leaving a zombie under a non-reaping init.
  trap 'wait $c; exit 143' TERM
  sleep 600 & c=$!
  echo $c > {d}/child.$AM_RANK
  echo $$ > {d}/rank.$AM_RANK
fi
fence
[ $AM_RANK = 0 ] && exit 4
wait $c
"#,
            d = dir.display()
        );
        let code = sh(3, &script).run().unwrap();
        assert_eq!(code, 4);
        for entry in std::fs::read_dir(&dir).unwrap() {
            let pid = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            assert_gone(pid.trim());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sigterm_is_followed_by_sigkill() {
        // Ranks ignoring SIGTERM still end, after the grace period.
        let code = sh(
            2,
            r#"trap '' TERM; fence; [ $AM_RANK = 0 ] && exit 6; exec sleep 600"#,
        )
        .run()
        .unwrap();
        assert_eq!(code, 6);
    }

    #[test]
    fn pmi_abort_ends_the_job_with_its_code() {
        let code = sh(
            3,
            r#"fence; [ $AM_RANK = 2 ] && printf 'cmd=abort exitcode=9
' >&$AM_PMI_FD; exec sleep 600"#,
        )
        .run()
        .unwrap();
        assert_eq!(code, 9);
    }

    #[test]
    fn leaving_while_others_fence_ends_the_job() {
        let code = sh(3, r#"[ $AM_RANK = 0 ] && exit 0; fence"#).run().unwrap();
        assert_eq!(code, 1);
    }

    #[test]
    fn removes_the_jobs_shared_memory_files() {
        let dir = temp_dir();
        let script = format!(
            r#"f=/dev/shm/am-$AM_JOB_ID-test-$AM_RANK; : > $f && echo $f > {d}/$AM_RANK"#,
            d = dir.display()
        );
        assert_eq!(sh(2, &script).run().unwrap(), 0);
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let shm = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            assert!(!Path::new(shm.trim()).exists(), "{shm} left behind");
            seen += 1;
        }
        assert_eq!(seen, 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
