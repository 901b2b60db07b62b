//! [`UdpConfig`]: settings of the UDP transport, from code or from the environment.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use crate::error::UdpError;
use crate::proto::EngineConfig;
use crate::wire::{JobKey, OVERHEAD};

/// Largest UDP payload over IPv4.
pub const MAX_MTU: usize = 65507;
/// Smallest datagram size accepted (the IPv4 minimum reassembly size).
pub const MIN_MTU: usize = 576;

/// Settings of the UDP transport.
///
/// Change the defaults with the setters named after the fields:
/// `UdpConfig::default().max_long(1 << 20).port_base(Some(7000))`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct UdpConfig {
    /// Protocol tunables: datagram size (`AM_UDP_MTU`), peer timeout (`AM_PEER_TIMEOUT_MS`),
    /// retransmission timers, queue size. `max_message` is derived from the limits below.
    pub engine: EngineConfig,
    /// Largest AM Medium payload (default 64 KiB).
    pub max_medium: usize,
    /// Largest AM Long payload per message (default 256 KiB; larger puts are split by the core).
    pub max_long: usize,
    /// Interface to bind (`AM_UDP_BIND`, default 127.0.0.1).
    pub bind: IpAddr,
    /// Address announced to the peers when `bind` is unspecified (`AM_UDP_ADVERTISE`; default:
    /// this host name's first address).
    pub advertise: Option<IpAddr>,
    /// Rank r binds port `port_base + r` (`AM_UDP_PORT_BASE`); default: an ephemeral port.
    /// Peers send to that port; a rank's own datagrams leave from ephemeral ports (sockets
    /// connected to its peers), whatever this says.
    pub port_base: Option<u16>,
    /// Coordinator for jobs without a key-value store (`AM_COORD=host:port`; rank 0 serves it).
    pub coord: Option<String>,
    /// The job key (`AM_UDP_KEY`: 64 hex digits, or `AM_UDP_KEY_FILE`: a regular file of
    /// this user's, mode 0600, not a symbolic link, holding them). Without one, rank 0 makes one and shares it through the launcher's
    /// key-value store (see the threat model in the crate docs).
    pub key: Option<JobKey>,
    /// Socket send and receive buffer sizes asked of the kernel (capped by `net.core.*mem_max`).
    pub socket_buffer: usize,
    /// How long a closing rank keeps retransmitting until its last data and goodbye are
    /// acknowledged (also capped by the peer timeout).
    pub linger: Duration,
    /// Testing aid (`AM_UDP_FAULTS`, see [`parse_faults`]): drop, duplicate and delay outgoing
    /// datagrams with these seeded probabilities (the delay reorders). The protocol must hide
    /// all of it. Each rank mixes its rank into the seed, so ranks of one job fault
    /// independently.
    pub faults: Option<am_core::FaultConfig>,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            engine: EngineConfig::default(),
            max_medium: 64 << 10,
            max_long: 256 << 10,
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            advertise: None,
            port_base: None,
            coord: None,
            key: None,
            socket_buffer: 4 << 20,
            linger: Duration::from_secs(5),
            faults: None,
        }
    }
}

impl UdpConfig {
    /// The defaults, as [`UdpConfig::default`]; change them with the setters below.
    pub fn new() -> UdpConfig {
        UdpConfig::default()
    }

    /// With these protocol tunables.
    #[must_use]
    pub fn engine(mut self, engine: EngineConfig) -> UdpConfig {
        self.engine = engine;
        self
    }

    /// With AM Medium payloads of at most this many bytes.
    #[must_use]
    pub fn max_medium(mut self, max_medium: usize) -> UdpConfig {
        self.max_medium = max_medium;
        self
    }

    /// With AM Long payloads of at most this many bytes per message.
    #[must_use]
    pub fn max_long(mut self, max_long: usize) -> UdpConfig {
        self.max_long = max_long;
        self
    }

    /// Binding this interface.
    #[must_use]
    pub fn bind(mut self, bind: IpAddr) -> UdpConfig {
        self.bind = bind;
        self
    }

    /// Announcing this address to the peers when `bind` is unspecified.
    #[must_use]
    pub fn advertise(mut self, advertise: Option<IpAddr>) -> UdpConfig {
        self.advertise = advertise;
        self
    }

    /// With rank r on port `port_base + r` (`None`: an ephemeral port).
    #[must_use]
    pub fn port_base(mut self, port_base: Option<u16>) -> UdpConfig {
        self.port_base = port_base;
        self
    }

    /// With this coordinator (`host:port`) for jobs without a key-value store.
    #[must_use]
    pub fn coord(mut self, coord: Option<String>) -> UdpConfig {
        self.coord = coord;
        self
    }

    /// With this job key (`None`: rank 0 makes one).
    #[must_use]
    pub fn key(mut self, key: Option<JobKey>) -> UdpConfig {
        self.key = key;
        self
    }

    /// Asking the kernel for socket buffers of this many bytes.
    #[must_use]
    pub fn socket_buffer(mut self, socket_buffer: usize) -> UdpConfig {
        self.socket_buffer = socket_buffer;
        self
    }

    /// Retransmitting for at most this long when closing.
    #[must_use]
    pub fn linger(mut self, linger: Duration) -> UdpConfig {
        self.linger = linger;
        self
    }

    /// Injecting these datagram faults (a testing aid; `None`: none).
    #[must_use]
    pub fn faults(mut self, faults: Option<am_core::FaultConfig>) -> UdpConfig {
        self.faults = faults;
        self
    }
}

fn var(name: &'static str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn bad(var: &'static str, value: &str, why: &str) -> UdpError {
    UdpError::Config {
        var,
        value: value.to_owned(),
        why: why.to_owned(),
    }
}

/// Parses the testing aid `AM_UDP_FAULTS`: comma-separated `key=value` settings of datagram
/// faults injected on every rank's outgoing datagrams, e.g.
/// `drop=0.1,dup=0.01,delay=0.05,seed=7`.
///
/// - `drop=p`: a datagram is discarded with probability p;
/// - `dup=p` (or `duplicate=p`): sent twice;
/// - `delay=p`: held back and sent after 1..=`max_delay` later sends, so it arrives late and
///   out of order (`max_delay=n`, 1..=1000, default 4);
/// - `seed=n`: the seed of the fault generator (default 1; each rank mixes in its rank).
///
/// Probabilities are in 0..=1; keys left out are 0. This is for testing the protocol (a job run
/// with it must still verify, only slower), never for production. The error says what is wrong.
pub fn parse_faults(spec: &str) -> Result<am_core::FaultConfig, String> {
    let mut f = am_core::FaultConfig::default();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            return Err(format!(
                "{item:?} is not key=value (keys: drop, dup, delay, max_delay, seed)"
            ));
        };
        let (key, value) = (key.trim(), value.trim());
        let prob = || match value.parse::<f64>() {
            Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
            _ => Err(format!("{key}={value:?}: expected a probability in 0..=1")),
        };
        match key {
            "drop" => f.drop = prob()?,
            "dup" | "duplicate" => f.duplicate = prob()?,
            "delay" => f.delay = prob()?,
            "max_delay" => {
                f.max_delay = match value.parse::<u32>() {
                    Ok(n) if (1..=1000).contains(&n) => n,
                    _ => return Err(format!("max_delay={value:?}: expected 1..=1000 sends")),
                }
            }
            "seed" => {
                f.seed = value
                    .parse::<u64>()
                    .map_err(|_| format!("seed={value:?}: expected an unsigned integer"))?
            }
            _ => {
                return Err(format!(
                    "unknown key {key:?} (keys: drop, dup, delay, max_delay, seed)"
                ))
            }
        }
    }
    Ok(f)
}

/// The key `amrun` passed through a pipe (`AM_UDP_KEY_FD`), once read: the pipe is read
/// once and closed, and later calls of [`UdpConfig::from_env`] in this process get the same
/// key from here.
static KEY_FROM_FD: std::sync::Mutex<Option<(i32, JobKey)>> = std::sync::Mutex::new(None);

/// Reads the job key from the inherited pipe `AM_UDP_KEY_FD` names, and closes it.
///
/// Why a pipe and not `AM_UDP_KEY`: the environment is inherited by everything a rank
/// starts, and a rank cannot take a variable out of its own environment soundly once other
/// threads may read it (`remove_var` races with C code calling `getenv`, as a PMIx client's
/// or the resolver's threads do). The pipe holds the key until the rank reads it; what the
/// rank starts afterwards finds the pipe closed and no key in its environment.
fn key_from_fd(value: &str) -> Result<JobKey, UdpError> {
    use nix::sys::stat::{fstat, SFlag};
    let fd = value
        .parse::<i32>()
        .ok()
        .filter(|&fd| fd > 2)
        .ok_or_else(|| {
            bad(
                "AM_UDP_KEY_FD",
                value,
                "expected a descriptor number above 2",
            )
        })?;
    let mut cached = KEY_FROM_FD.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((f, key)) = &*cached {
        if *f == fd {
            return Ok(key.clone());
        }
    }
    let failed = |why: String| bad("AM_UDP_KEY_FD", value, &why);
    let os_failed = |what: &str, e: nix::errno::Errno| UdpError::Io {
        what: format!("AM_UDP_KEY_FD={value:?}: {what}"),
        source: e.into(),
    };
    let stat = fstat(fd).map_err(|e| os_failed("not an open descriptor", e))?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFIFO {
        return Err(failed("not a pipe (amrun passes the key in one)".into()));
    }
    // The launcher wrote 65 bytes and closed its end: read to the end, at most 256 bytes.
    let mut text = Vec::new();
    let mut buf = [0u8; 128];
    let read = loop {
        match nix::unistd::read(fd, &mut buf) {
            Ok(0) => break Ok(()),
            Ok(n) if text.len() + n <= 256 => text.extend_from_slice(&buf[..n]),
            Ok(_) => break Err(failed("more than a key in the pipe".into())),
            Err(nix::errno::Errno::EINTR) => {}
            Err(e) => break Err(os_failed("reading the key", e)),
        }
    };
    let _ = nix::unistd::close(fd);
    read?;
    let key = std::str::from_utf8(&text)
        .map_err(|_| UdpError::Key(crate::wire::KeyError::BadFormat))
        .and_then(|t| JobKey::from_hex(t).map_err(UdpError::Key))?;
    *cached = Some((fd, key.clone()));
    Ok(key)
}

impl UdpConfig {
    /// The defaults, overridden by the environment: `AM_UDP_MTU` (576..=65507),
    /// `AM_PEER_TIMEOUT_MS`, `AM_UDP_BIND`, `AM_UDP_ADVERTISE`, `AM_UDP_PORT_BASE`, `AM_COORD`,
    /// `AM_UDP_KEY`, `AM_UDP_KEY_FILE` or `AM_UDP_KEY_FD` (a pipe from `amrun`, read once per
    /// process and closed), and the testing aid `AM_UDP_FAULTS` (see
    /// [`parse_faults`]).
    pub fn from_env() -> Result<UdpConfig, UdpError> {
        let mut c = UdpConfig::default();
        if let Some(v) = var("AM_UDP_MTU") {
            c.engine.mtu = match v.parse::<usize>() {
                Ok(n) if (MIN_MTU..=MAX_MTU).contains(&n) => n,
                _ => {
                    return Err(bad(
                        "AM_UDP_MTU",
                        &v,
                        "expected a datagram size in 576..=65507",
                    ))
                }
            };
        }
        if let Some(v) = var("AM_PEER_TIMEOUT_MS") {
            c.engine.peer_timeout = match v.parse::<u64>() {
                Ok(n) if n >= 10 => Duration::from_millis(n),
                _ => {
                    return Err(bad(
                        "AM_PEER_TIMEOUT_MS",
                        &v,
                        "expected milliseconds, at least 10",
                    ))
                }
            };
        }
        if let Some(v) = var("AM_UDP_BIND") {
            c.bind = v
                .parse()
                .map_err(|_| bad("AM_UDP_BIND", &v, "expected an IP address"))?;
        }
        if let Some(v) = var("AM_UDP_ADVERTISE") {
            c.advertise = Some(
                v.parse()
                    .map_err(|_| bad("AM_UDP_ADVERTISE", &v, "expected an IP address"))?,
            );
        }
        if let Some(v) = var("AM_UDP_PORT_BASE") {
            c.port_base = Some(
                v.parse::<u16>()
                    .ok()
                    .filter(|&p| p > 0)
                    .ok_or_else(|| bad("AM_UDP_PORT_BASE", &v, "expected a port in 1..=65535"))?,
            );
        }
        c.coord = var("AM_COORD");
        if let Some(v) = var("AM_UDP_FAULTS") {
            c.faults = Some(parse_faults(&v).map_err(|why| bad("AM_UDP_FAULTS", &v, &why))?);
        }
        match (
            var("AM_UDP_KEY"),
            var("AM_UDP_KEY_FILE"),
            var("AM_UDP_KEY_FD"),
        ) {
            (Some(k), None, None) => c.key = Some(JobKey::from_hex(&k).map_err(UdpError::Key)?),
            (None, Some(path), None) => {
                c.key = Some(JobKey::from_file(&path).map_err(UdpError::Key)?)
            }
            (None, None, Some(fd)) => c.key = Some(key_from_fd(&fd)?),
            (None, None, None) => {}
            _ => {
                return Err(bad(
                    "AM_UDP_KEY_FILE",
                    "",
                    "set one of AM_UDP_KEY, AM_UDP_KEY_FILE and AM_UDP_KEY_FD, not several",
                ))
            }
        }
        Ok(c)
    }

    /// Checks the settings; fills in the engine's `max_message`.
    pub(crate) fn validated(&self) -> Result<UdpConfig, UdpError> {
        let mut c = self.clone();
        if !(MIN_MTU..=MAX_MTU).contains(&c.engine.mtu) || c.engine.mtu <= OVERHEAD {
            return Err(bad(
                "AM_UDP_MTU",
                &c.engine.mtu.to_string(),
                "expected a datagram size in 576..=65507",
            ));
        }
        c.engine.max_message = am_core::wire::MAX_HEAD_LEN + c.max_medium.max(c.max_long);
        if c.engine.max_message > u32::MAX as usize {
            return Err(bad("max_long", "", "messages are limited to 4 GiB"));
        }
        c.linger = c.linger.min(c.engine.peer_timeout);
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_spec_parses() {
        let f = parse_faults("drop=0.1,dup=0.01,delay=0.05,seed=7").unwrap();
        assert_eq!(
            (f.drop, f.duplicate, f.delay, f.seed, f.max_delay),
            (0.1, 0.01, 0.05, 7, 4)
        );
        let f = parse_faults(" duplicate = 1 , max_delay=9 ,").unwrap();
        assert_eq!((f.drop, f.duplicate, f.max_delay), (0.0, 1.0, 9));
        assert_eq!(parse_faults("").unwrap(), am_core::FaultConfig::default());
    }

    /// A descriptor that is not open is the system's error, as the source.
    #[test]
    fn a_key_descriptor_not_open_keeps_the_system_error() {
        use std::error::Error;
        let e = key_from_fd("999999").unwrap_err();
        assert!(matches!(e, UdpError::Io { .. }), "{e}");
        let source = e.source().and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            source.and_then(std::io::Error::raw_os_error),
            Some(nix::libc::EBADF),
            "{e}"
        );
    }

    #[test]
    fn malformed_faults_spec_says_why() {
        for (spec, says) in [
            ("drop", "not key=value"),
            ("drop=1.5", "probability in 0..=1"),
            ("drop=-0.1", "probability in 0..=1"),
            ("drop=NaN", "probability in 0..=1"),
            ("dup=x", "probability"),
            ("loss=0.1", "unknown key \"loss\""),
            ("seed=-1", "unsigned integer"),
            ("max_delay=0", "1..=1000"),
        ] {
            let e = parse_faults(spec).unwrap_err();
            assert!(e.contains(says), "{spec}: {e}");
        }
    }
}
