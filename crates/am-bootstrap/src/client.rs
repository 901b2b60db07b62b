//! PMI-1 and PMI-2 clients: the rank side of a launcher's key-value store.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::fd::RawFd;

use nix::fcntl::{fcntl, FcntlArg, FdFlag};
use nix::sys::socket::{recv, send, MsgFlags};

use crate::error::BootstrapError;
use crate::store::KeyValueStore;
use crate::watch::Watch;
use crate::wire::{self, Message};

/// A socket inherited by number (`PMI_FD`, `AM_PMI_FD`).
///
/// std can only adopt a raw descriptor with `unsafe`, so I/O goes through
/// nix's descriptor-number functions instead. The descriptor is closed on drop.
#[derive(Debug)]
pub(crate) struct FdSocket {
    fd: RawFd,
}

impl FdSocket {
    /// Takes ownership of `fd` after checking that it is open, and marks it
    /// close-on-exec so processes this rank starts do not inherit it.
    pub(crate) fn adopt(fd: RawFd) -> io::Result<Self> {
        fcntl(fd, FcntlArg::F_GETFD)?;
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))?;
        Ok(Self { fd })
    }
}

impl Read for FdSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(recv(self.fd, buf, MsgFlags::empty())?)
    }
}

impl Write for FdSocket {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // MSG_NOSIGNAL: a dead launcher must give an error, not SIGPIPE.
        Ok(send(self.fd, buf, MsgFlags::MSG_NOSIGNAL)?)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for FdSocket {
    fn drop(&mut self) {
        let _ = nix::unistd::close(self.fd);
    }
}

/// A connection to a PMI server: an inherited descriptor or a TCP connection (`PMI_PORT`),
/// with the rank's watch on it ([`Watch`]: the rank ends if its launcher goes first).
#[derive(Debug)]
pub(crate) struct Conn {
    /// Dropped before `io`, whose descriptor it wakes its thread through.
    watch: Option<Watch>,
    io: Io,
}

#[derive(Debug)]
enum Io {
    Fd(FdSocket),
    Tcp(TcpStream),
    #[cfg(test)]
    Unix(std::os::unix::net::UnixStream),
}

impl Conn {
    /// An inherited socket, watched.
    pub(crate) fn fd(s: FdSocket) -> Conn {
        Conn {
            watch: Watch::fd(s.fd),
            io: Io::Fd(s),
        }
    }

    /// A TCP connection, watched.
    pub(crate) fn tcp(s: TcpStream) -> Conn {
        Conn {
            watch: Watch::tcp(&s),
            io: Io::Tcp(s),
        }
    }

    /// A test's connection, not watched.
    #[cfg(test)]
    pub(crate) fn unix(s: std::os::unix::net::UnixStream) -> Conn {
        Conn {
            watch: None,
            io: Io::Unix(s),
        }
    }
}

/// The stream a PMI client speaks over.
pub(crate) trait Link: Read + Write {
    /// The rank is about to finalize or abort: the server may close the connection from
    /// now on without the rank having lost its launcher.
    fn finishing(&self);
}

impl Link for Conn {
    fn finishing(&self) {
        if let Some(w) = &self.watch {
            w.finish();
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.io {
            Io::Fd(s) => s.read(buf),
            Io::Tcp(s) => s.read(buf),
            #[cfg(test)]
            Io::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.io {
            Io::Fd(s) => s.write(buf),
            Io::Tcp(s) => s.write(buf),
            #[cfg(test)]
            Io::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    Finalized,
    Aborted,
}

fn io_err(cmd: &str, source: io::Error) -> BootstrapError {
    BootstrapError::Io {
        what: format!("PMI command `{cmd}`"),
        source,
    }
}

fn protocol(detail: impl Into<String>) -> BootstrapError {
    BootstrapError::Protocol {
        detail: detail.into(),
    }
}

fn pmi_failed(cmd: &str, rc: &str, m: &Message) -> BootstrapError {
    BootstrapError::Pmi {
        cmd: cmd.to_owned(),
        rc: rc.to_owned(),
        msg: m
            .get("msg")
            .or_else(|| m.get("errmsg"))
            .unwrap_or("")
            .to_owned(),
    }
}

fn expect_cmd(m: Message, expect: &str, sent: &str) -> Result<Message, BootstrapError> {
    if m.cmd == expect {
        Ok(m)
    } else {
        Err(protocol(format!(
            "sent `{sent}`, expected reply `{expect}`, got `{}`",
            m.cmd
        )))
    }
}

fn check_entry(key: &str, value: Option<&str>) -> Result<(), BootstrapError> {
    wire::check_key(key, wire::KEY_MAX).map_err(|reason| BootstrapError::InvalidEntry {
        key: key.to_owned(),
        reason,
    })?;
    if let Some(v) = value {
        wire::check_value(v, wire::VALUE_MAX).map_err(|reason| BootstrapError::InvalidEntry {
            key: key.to_owned(),
            reason,
        })?;
    }
    Ok(())
}

fn parse_u32_field(m: &Message, key: &str) -> Result<Option<u32>, BootstrapError> {
    m.get(key)
        .map(|v| {
            v.parse::<u32>()
                .map_err(|_| protocol(format!("`{}` reply has non-numeric {key}={v:?}", m.cmd)))
        })
        .transpose()
}

/// Client of the PMI-1 simple protocol (MPICH hydra, amrun).
pub(crate) struct Pmi1Client<S: Link> {
    io: BufReader<S>,
    kvsname: String,
    key_max: usize,
    value_max: usize,
    state: State,
}

impl<S: Link> Pmi1Client<S> {
    pub(crate) fn new(stream: S) -> Self {
        Self {
            io: BufReader::new(stream),
            kvsname: String::new(),
            key_max: wire::KEY_MAX,
            value_max: wire::VALUE_MAX,
            state: State::Open,
        }
    }

    fn send(&mut self, cmd: &str, fields: &[(&str, &str)]) -> Result<(), BootstrapError> {
        let line = wire::format_v1(cmd, fields);
        self.io
            .get_mut()
            .write_all(line.as_bytes())
            .map_err(|e| io_err(cmd, e))
    }

    fn recv(&mut self, cmd: &str) -> Result<Message, BootstrapError> {
        let mut line = Vec::new();
        let n = (&mut self.io)
            .take(wire::MAX_MESSAGE as u64)
            .read_until(b'\n', &mut line)
            .map_err(|e| io_err(cmd, e))?;
        if line.last() != Some(&b'\n') {
            return Err(if n == wire::MAX_MESSAGE {
                protocol(format!("reply to `{cmd}` is longer than {n} bytes"))
            } else {
                BootstrapError::Disconnected {
                    what: format!("waiting for the reply to `{cmd}`"),
                }
            });
        }
        line.pop();
        let text = String::from_utf8(line)
            .map_err(|_| protocol(format!("reply to `{cmd}` is not UTF-8")))?;
        wire::parse_v1(&text).map_err(protocol)
    }

    fn request(
        &mut self,
        cmd: &str,
        fields: &[(&str, &str)],
        expect: &str,
    ) -> Result<Message, BootstrapError> {
        if self.state != State::Open {
            return Err(BootstrapError::Closed);
        }
        self.send(cmd, fields)?;
        let m = expect_cmd(self.recv(cmd)?, expect, cmd)?;
        Ok(m)
    }

    fn request_ok(
        &mut self,
        cmd: &str,
        fields: &[(&str, &str)],
        expect: &str,
    ) -> Result<Message, BootstrapError> {
        let m = self.request(cmd, fields, expect)?;
        match m.failed() {
            Some(rc) => Err(pmi_failed(cmd, rc, &m)),
            None => Ok(m),
        }
    }

    /// The `PMI_PORT` handshake: `initack pmiid=<PMI_ID>`, then the server
    /// tells us size, rank and debug level. Returns `(rank, size)`.
    pub(crate) fn initack(&mut self, pmiid: &str) -> Result<(u32, u32), BootstrapError> {
        self.request_ok("initack", &[("pmiid", pmiid)], "initack")?;
        let (mut rank, mut size, mut debug) = (None, None, false);
        while rank.is_none() || size.is_none() || !debug {
            let m = expect_cmd(self.recv("initack")?, "set", "initack")?;
            rank = rank.or(parse_u32_field(&m, "rank")?);
            size = size.or(parse_u32_field(&m, "size")?);
            debug |= m.get("debug").is_some();
        }
        Ok((rank.unwrap_or(0), size.unwrap_or(0)))
    }

    /// `init`, `get_maxes` and `get_my_kvsname`.
    pub(crate) fn init(&mut self) -> Result<(), BootstrapError> {
        self.request_ok(
            "init",
            &[("pmi_version", "1"), ("pmi_subversion", "1")],
            "response_to_init",
        )?;
        let m = self.request_ok("get_maxes", &[], "maxes")?;
        let limit = |key: &str, ours: usize| -> Result<usize, BootstrapError> {
            // Keep our own limit unless the server's is smaller.
            Ok(parse_u32_field(&m, key)?.map_or(ours, |v| ours.min(v as usize)))
        };
        self.key_max = limit("keylen_max", wire::KEY_MAX)?;
        self.value_max = limit("vallen_max", wire::VALUE_MAX)?;
        let m = self.request_ok("get_my_kvsname", &[], "my_kvsname")?;
        self.kvsname = m
            .get("kvsname")
            .filter(|k| !k.is_empty())
            .ok_or_else(|| protocol("`my_kvsname` reply without kvsname"))?
            .to_owned();
        Ok(())
    }

    /// The name of the job's key-value space, as the server calls it.
    pub(crate) fn kvsname(&self) -> &str {
        &self.kvsname
    }

    fn check_limits(&self, key: &str, value: Option<&str>) -> Result<(), BootstrapError> {
        check_entry(key, value)?;
        let too_long = |what: &str, max: usize| BootstrapError::InvalidEntry {
            key: key.to_owned(),
            reason: format!("this launcher limits {what} to {max} bytes"),
        };
        if key.len() > self.key_max {
            return Err(too_long("keys", self.key_max));
        }
        if value.is_some_and(|v| v.len() > self.value_max) {
            return Err(too_long("values", self.value_max));
        }
        Ok(())
    }
}

impl<S: Link> KeyValueStore for Pmi1Client<S> {
    fn put(&mut self, key: &str, value: &str) -> Result<(), BootstrapError> {
        self.check_limits(key, Some(value))?;
        let kvsname = self.kvsname.clone();
        self.request_ok(
            "put",
            &[("kvsname", &kvsname), ("key", key), ("value", value)],
            "put_result",
        )?;
        Ok(())
    }

    fn fence(&mut self) -> Result<(), BootstrapError> {
        self.request_ok("barrier_in", &[], "barrier_out")?;
        Ok(())
    }

    fn get(&mut self, key: &str) -> Result<String, BootstrapError> {
        self.check_limits(key, None)?;
        let kvsname = self.kvsname.clone();
        let m = self.request("get", &[("kvsname", &kvsname), ("key", key)], "get_result")?;
        if let Some(rc) = m.failed() {
            // Hydra: rc=-1 msg=key_<k>_not_found
            return Err(if m.get("msg").is_some_and(|s| s.contains("not_found")) {
                BootstrapError::KeyNotFound {
                    key: key.to_owned(),
                }
            } else {
                pmi_failed("get", rc, &m)
            });
        }
        m.get("value")
            .map(str::to_owned)
            .ok_or_else(|| protocol("`get_result` reply without value"))
    }

    fn abort(&mut self, code: i32, message: &str) -> Result<(), BootstrapError> {
        if self.state != State::Open {
            return Err(BootstrapError::Closed);
        }
        // PMI-1 cannot carry the message; MPICH prints it locally too.
        if !message.is_empty() {
            eprintln!("aborting job: {message}");
        }
        self.state = State::Aborted;
        self.io.get_ref().finishing();
        self.send("abort", &[("exitcode", &code.to_string())])
    }

    fn finalize(&mut self) -> Result<(), BootstrapError> {
        self.io.get_ref().finishing();
        self.request_ok("finalize", &[], "finalize_ack")?;
        self.state = State::Finalized;
        Ok(())
    }
}

impl<S: Link> Drop for Pmi1Client<S> {
    fn drop(&mut self) {
        // A panicking rank must not finalize: hydra then treats the dropped
        // connection as a failure and ends the job instead of waiting.
        if self.state == State::Open && !std::thread::panicking() {
            let _ = self.finalize();
        }
    }
}

/// Client of the PMI-2 wire protocol (Slurm `--mpi=pmi2`, hydra on request).
pub(crate) struct Pmi2Client<S: Link> {
    io: S,
    jobid: String,
    state: State,
}

impl<S: Link> Pmi2Client<S> {
    pub(crate) fn new(stream: S) -> Self {
        Self {
            io: stream,
            jobid: String::new(),
            state: State::Open,
        }
    }

    fn send(&mut self, cmd: &str, fields: &[(&str, &str)]) -> Result<(), BootstrapError> {
        let framed = wire::format_v2(cmd, fields);
        self.io
            .write_all(framed.as_bytes())
            .map_err(|e| io_err(cmd, e))
    }

    fn read_exact(&mut self, buf: &mut [u8], cmd: &str) -> Result<(), BootstrapError> {
        self.io.read_exact(buf).map_err(|e| {
            if e.kind() == io::ErrorKind::UnexpectedEof {
                BootstrapError::Disconnected {
                    what: format!("waiting for the reply to `{cmd}`"),
                }
            } else {
                io_err(cmd, e)
            }
        })
    }

    fn recv(&mut self, cmd: &str) -> Result<Message, BootstrapError> {
        let mut header = [0u8; 6];
        self.read_exact(&mut header, cmd)?;
        let len = wire::parse_v2_len(&header).map_err(protocol)?;
        let mut body = vec![0u8; len];
        self.read_exact(&mut body, cmd)?;
        let text = String::from_utf8(body)
            .map_err(|_| protocol(format!("reply to `{cmd}` is not UTF-8")))?;
        wire::parse_v2(&text).map_err(protocol)
    }

    fn request_ok(
        &mut self,
        cmd: &str,
        fields: &[(&str, &str)],
    ) -> Result<Message, BootstrapError> {
        if self.state != State::Open {
            return Err(BootstrapError::Closed);
        }
        self.send(cmd, fields)?;
        let m = expect_cmd(self.recv(cmd)?, &format!("{cmd}-response"), cmd)?;
        match m.failed() {
            Some(rc) => Err(pmi_failed(cmd, rc, &m)),
            None => Ok(m),
        }
    }

    /// The PMI-1 line that opens a PMI-2 connection (`cmd=init pmi_version=2
    /// pmi_subversion=0`), as MPICH's own PMI-2 client sends it; Slurm's pmi2 plugin
    /// refuses a connection that starts with `fullinit` (hydra takes both).
    fn open_v2(&mut self) -> Result<(), BootstrapError> {
        let line = wire::format_v1("init", &[("pmi_version", "2"), ("pmi_subversion", "0")]);
        self.io
            .write_all(line.as_bytes())
            .map_err(|e| io_err("init", e))?;
        // The reply is one PMI-1 line, byte by byte so nothing after it is consumed.
        let mut reply = Vec::new();
        let mut byte = [0u8; 1];
        while byte[0] != b'\n' {
            if reply.len() > 1024 {
                return Err(protocol("PMI-2 `response_to_init` longer than 1024 bytes"));
            }
            self.read_exact(&mut byte, "init")?;
            reply.push(byte[0]);
        }
        let text = String::from_utf8(reply)
            .map_err(|_| protocol("PMI-2 `response_to_init` is not UTF-8"))?;
        let m = wire::parse_v1(text.trim_end()).map_err(protocol)?;
        let m = expect_cmd(m, "response_to_init", "init")?;
        match m.failed() {
            Some(rc) => Err(pmi_failed("init", rc, &m)),
            None => Ok(()),
        }
    }

    /// The PMI-2 opening (`init` as a PMI-1 line), `fullinit` then `job-getid`. `id` is the
    /// identifying field, e.g. `("pmirank", "3")`. Returns `(rank, size)` as the server sees
    /// them.
    /// `jobid` (`PMI_JOBID`, set by Slurm) is sent as `pmijobid` first when present.
    pub(crate) fn init(
        &mut self,
        id: (&str, &str),
        jobid: Option<&str>,
    ) -> Result<(u32, u32), BootstrapError> {
        if self.state != State::Open {
            return Err(BootstrapError::Closed);
        }
        self.open_v2()?;
        let mut fields: Vec<(&str, &str)> = Vec::with_capacity(3);
        if let Some(j) = jobid {
            fields.push(("pmijobid", j));
        }
        fields.extend([id, ("threaded", "FALSE")]);
        let m = self.request_ok("fullinit", &fields)?;
        let rank = parse_u32_field(&m, "rank")?
            .ok_or_else(|| protocol("`fullinit-response` without rank"))?;
        let size = parse_u32_field(&m, "size")?
            .ok_or_else(|| protocol("`fullinit-response` without size"))?;
        let m = self.request_ok("job-getid", &[])?;
        self.jobid = m
            .get("jobid")
            .filter(|j| !j.is_empty())
            .ok_or_else(|| protocol("`job-getid-response` without jobid"))?
            .to_owned();
        Ok((rank, size))
    }

    /// The job's PMI-2 id (needed by `kvs-get`).
    pub(crate) fn jobid(&self) -> &str {
        &self.jobid
    }
}

impl<S: Link> KeyValueStore for Pmi2Client<S> {
    fn put(&mut self, key: &str, value: &str) -> Result<(), BootstrapError> {
        check_entry(key, Some(value))?;
        self.request_ok("kvs-put", &[("key", key), ("value", value)])?;
        Ok(())
    }

    fn fence(&mut self) -> Result<(), BootstrapError> {
        self.request_ok("kvs-fence", &[])?;
        Ok(())
    }

    fn get(&mut self, key: &str) -> Result<String, BootstrapError> {
        check_entry(key, None)?;
        let jobid = self.jobid.clone();
        let m = self.request_ok(
            "kvs-get",
            &[("jobid", &jobid), ("srcid", "-1"), ("key", key)],
        )?;
        if m.get("found") != Some("TRUE") {
            return Err(BootstrapError::KeyNotFound {
                key: key.to_owned(),
            });
        }
        m.get("value")
            .map(str::to_owned)
            .ok_or_else(|| protocol("`kvs-get-response` with found=TRUE but no value"))
    }

    fn abort(&mut self, code: i32, message: &str) -> Result<(), BootstrapError> {
        if self.state != State::Open {
            return Err(BootstrapError::Closed);
        }
        if !message.is_empty() {
            eprintln!("aborting job: {message}");
        }
        // PMI-2 abort has no exit code; the message must not break the framing.
        let msg: String = message
            .chars()
            .map(|c| if c == ';' || c.is_control() { ' ' } else { c })
            .collect();
        let msg = if msg.trim().is_empty() {
            format!("abort with code {code}")
        } else {
            msg
        };
        self.state = State::Aborted;
        self.io.finishing();
        self.send("abort", &[("isworld", "TRUE"), ("msg", &msg)])
    }

    fn finalize(&mut self) -> Result<(), BootstrapError> {
        self.io.finishing();
        self.request_ok("finalize", &[])?;
        self.state = State::Finalized;
        Ok(())
    }
}

impl<S: Link> Drop for Pmi2Client<S> {
    fn drop(&mut self) {
        if self.state == State::Open && !std::thread::panicking() {
            let _ = self.finalize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::IntoRawFd;
    use std::os::unix::net::UnixStream;
    use std::thread;

    /// A scripted PMI-1 server: answers each expected line with a reply.
    fn v1_server(
        script: Vec<(&'static str, Option<&'static str>)>,
    ) -> (Conn, thread::JoinHandle<()>) {
        let (a, b) = UnixStream::pair().unwrap();
        let h = thread::spawn(move || {
            let mut r = BufReader::new(b.try_clone().unwrap());
            let mut w = b;
            for (expect, reply) in script {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                assert_eq!(line, format!("{expect}\n"));
                if let Some(reply) = reply {
                    w.write_all(reply.as_bytes()).unwrap();
                    w.write_all(b"\n").unwrap();
                }
            }
        });
        (Conn::unix(a), h)
    }

    const HYDRA_INIT: [(&str, Option<&str>); 3] = [
        (
            "cmd=init pmi_version=1 pmi_subversion=1",
            Some("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0"),
        ),
        (
            "cmd=get_maxes",
            Some("cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024"),
        ),
        (
            "cmd=get_my_kvsname",
            Some("cmd=my_kvsname kvsname=kvs_42_0"),
        ),
    ];

    #[test]
    fn pmi1_talks_like_hydra() {
        let mut script = HYDRA_INIT.to_vec();
        script.extend([
            (
                "cmd=put kvsname=kvs_42_0 key=k0 value=a=b",
                Some("cmd=put_result rc=0 msg=success"),
            ),
            ("cmd=barrier_in", Some("cmd=barrier_out")),
            (
                "cmd=get kvsname=kvs_42_0 key=k1",
                Some("cmd=get_result rc=0 msg=success value=x"),
            ),
            (
                "cmd=get kvsname=kvs_42_0 key=nokey",
                Some("cmd=get_result rc=-1 msg=key_nokey_not_found value=unknown"),
            ),
            ("cmd=finalize", Some("cmd=finalize_ack")),
        ]);
        let (conn, server) = v1_server(script);
        let mut c = Pmi1Client::new(conn);
        c.init().unwrap();
        assert_eq!(c.kvsname(), "kvs_42_0");
        c.put("k0", "a=b").unwrap();
        c.fence().unwrap();
        assert_eq!(c.get("k1").unwrap(), "x");
        assert!(matches!(
            c.get("nokey"),
            Err(BootstrapError::KeyNotFound { .. })
        ));
        drop(c); // finalizes
        server.join().unwrap();
    }

    #[test]
    fn pmi1_port_handshake() {
        let mut script = vec![(
            "cmd=initack pmiid=3",
            Some("cmd=initack\ncmd=set size=4\ncmd=set rank=3\ncmd=set debug=0"),
        )];
        script.extend(HYDRA_INIT);
        script.push(("cmd=finalize", Some("cmd=finalize_ack")));
        let (conn, server) = v1_server(script);
        let mut c = Pmi1Client::new(conn);
        assert_eq!(c.initack("3").unwrap(), (3, 4));
        c.init().unwrap();
        drop(c);
        server.join().unwrap();
    }

    #[test]
    fn pmi1_errors_are_typed() {
        let (conn, server) = v1_server(vec![(
            "cmd=init pmi_version=1 pmi_subversion=1",
            Some("cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=-1 msg=bad_version"),
        )]);
        let mut c = Pmi1Client::new(conn);
        match c.init() {
            Err(BootstrapError::Pmi { cmd, rc, msg }) => {
                assert_eq!(
                    (cmd.as_str(), rc.as_str(), msg.as_str()),
                    ("init", "-1", "bad_version")
                )
            }
            other => panic!("{other:?}"),
        }
        server.join().unwrap();
        // The server has gone: further requests see a disconnect, drop does not hang.
        assert!(matches!(
            c.fence(),
            Err(BootstrapError::Disconnected { .. } | BootstrapError::Io { .. })
        ));

        let (conn, server) = v1_server(vec![("cmd=barrier_in", Some("cmd=put_result rc=0"))]);
        let mut c = Pmi1Client::new(conn);
        assert!(matches!(c.fence(), Err(BootstrapError::Protocol { .. })));
        server.join().unwrap();

        let (conn, server) = v1_server(vec![("cmd=barrier_in", Some("garbage"))]);
        let mut c = Pmi1Client::new(conn);
        assert!(matches!(c.fence(), Err(BootstrapError::Protocol { .. })));
        server.join().unwrap();
    }

    #[test]
    fn pmi1_rejects_bad_entries_before_sending() {
        let (conn, server) = v1_server(vec![]);
        let mut c = Pmi1Client::new(conn);
        assert!(matches!(
            c.put("a b", "v"),
            Err(BootstrapError::InvalidEntry { .. })
        ));
        assert!(matches!(
            c.put("k", "with space"),
            Err(BootstrapError::InvalidEntry { .. })
        ));
        assert!(matches!(
            c.put("k", ""),
            Err(BootstrapError::InvalidEntry { .. })
        ));
        c.state = State::Finalized; // nothing to say to this server on drop
        server.join().unwrap();
    }

    #[test]
    fn pmi1_abort_sends_exit_code_and_closes() {
        let (conn, server) = v1_server(vec![("cmd=abort exitcode=7", None)]);
        let mut c = Pmi1Client::new(conn);
        c.abort(7, "").unwrap();
        assert!(matches!(c.put("k", "v"), Err(BootstrapError::Closed)));
        drop(c);
        server.join().unwrap();
    }

    /// A scripted PMI-2 server.
    fn v2_server(
        opens: bool,
        script: Vec<(&'static str, Option<&'static str>)>,
    ) -> (Conn, thread::JoinHandle<()>) {
        let (a, mut b) = UnixStream::pair().unwrap();
        let h = thread::spawn(move || {
            // The PMI-1 line that opens a PMI-2 connection (`init`), and its answer.
            if opens {
                let mut line = Vec::new();
                let mut byte = [0u8; 1];
                while byte[0] != b'\n' {
                    b.read_exact(&mut byte).unwrap();
                    line.push(byte[0]);
                }
                assert_eq!(line, b"cmd=init pmi_version=2 pmi_subversion=0\n");
                b.write_all(b"cmd=response_to_init pmi_version=2 pmi_subversion=0 rc=0\n")
                    .unwrap();
            }
            for (expect, reply) in script {
                let mut header = [0u8; 6];
                b.read_exact(&mut header).unwrap();
                let mut body = vec![0u8; wire::parse_v2_len(&header).unwrap()];
                b.read_exact(&mut body).unwrap();
                assert_eq!(String::from_utf8(body).unwrap(), expect);
                if let Some(reply) = reply {
                    b.write_all(format!("{:6}{reply}", reply.len()).as_bytes())
                        .unwrap();
                }
            }
        });
        (Conn::unix(a), h)
    }

    #[test]
    fn pmi2_talks_like_hydra() {
        let (conn, server) = v2_server(true, vec![
            (
                "cmd=fullinit;pmirank=1;threaded=FALSE;",
                Some("cmd=fullinit-response;pmi-version=2;pmi-subversion=0;rank=1;size=2;appnum=0;debugged=FALSE;pmiverbose=FALSE;rc=0;"),
            ),
            ("cmd=job-getid;", Some("cmd=job-getid-response;jobid=kvs_5286_0;rc=0;")),
            ("cmd=kvs-put;key=k1;value=v=1;", Some("cmd=kvs-put-response;rc=0;")),
            ("cmd=kvs-fence;", Some("cmd=kvs-fence-response;rc=0;")),
            (
                "cmd=kvs-get;jobid=kvs_5286_0;srcid=-1;key=k0;",
                Some("cmd=kvs-get-response;found=TRUE;value=v=0;rc=0;"),
            ),
            (
                "cmd=kvs-get;jobid=kvs_5286_0;srcid=-1;key=none;",
                Some("cmd=kvs-get-response;found=FALSE;rc=0;"),
            ),
            ("cmd=kvs-fence;", Some("cmd=kvs-fence-response;rc=-1;errmsg=broken;")),
            ("cmd=finalize;", Some("cmd=finalize-response;rc=0;")),
        ]);
        let mut c = Pmi2Client::new(conn);
        assert_eq!(c.init(("pmirank", "1"), None).unwrap(), (1, 2));
        assert_eq!(c.jobid(), "kvs_5286_0");
        c.put("k1", "v=1").unwrap();
        c.fence().unwrap();
        assert_eq!(c.get("k0").unwrap(), "v=0");
        assert!(matches!(
            c.get("none"),
            Err(BootstrapError::KeyNotFound { .. })
        ));
        match c.fence() {
            Err(BootstrapError::Pmi { msg, .. }) => assert_eq!(msg, "broken"),
            other => panic!("{other:?}"),
        }
        c.finalize().unwrap();
        drop(c);
        server.join().unwrap();
    }

    #[test]
    fn pmi2_abort_keeps_framing() {
        let (conn, server) = v2_server(
            false,
            vec![("cmd=abort;isworld=TRUE;msg=bad  thing;", None)],
        );
        let mut c = Pmi2Client::new(conn);
        c.abort(3, "bad; thing").unwrap();
        drop(c);
        server.join().unwrap();
    }

    #[test]
    fn fd_socket_adopts_only_open_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let raw = a.into_raw_fd();
        let mut s = FdSocket::adopt(raw).unwrap();
        let flags = fcntl(raw, FcntlArg::F_GETFD).unwrap();
        assert_ne!(flags & FdFlag::FD_CLOEXEC.bits(), 0);
        s.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        (&b).read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        drop(s);
        // Peer sees EOF once the adopted socket is closed.
        let mut rest = Vec::new();
        (&b).read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        assert!(FdSocket::adopt(-1).is_err());
    }
}
