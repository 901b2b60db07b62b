//! Per-job configuration of a node, from code or from the environment.

use std::time::Duration;

use crate::credit::Credits;

/// How a rank waits when a blocking call has nothing to do.
///
/// Ranks often outnumber cores (8 ranks on a 2-core laptop); spinning ranks then steal the CPU
/// from the rank that would make progress. Choose per job: `AM_WAIT=spin|yield|block`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitMode {
    /// Busy-poll: lowest latency, one core per rank.
    Spin,
    /// Spin a little, then yield the CPU between polls.
    SpinThenYield,
    /// Spin a little, then block in the transport until something arrives (or a short timeout).
    Block,
}

impl std::str::FromStr for WaitMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "spin" => Ok(WaitMode::Spin),
            "yield" | "spin-then-yield" => Ok(WaitMode::SpinThenYield),
            "block" => Ok(WaitMode::Block),
            other => Err(format!(
                "unknown wait mode {other:?}: expected spin, yield or block"
            )),
        }
    }
}

/// How a team all-reduce runs ([`Config::all_reduce`], `AM_ALLREDUCE=auto|doubling|ring`).
/// Every member of a team must choose the same: members that differ get
/// [`crate::AmError::CollectiveMismatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum AllReduceAlgorithm {
    /// Recursive doubling up to `max_medium` bytes, a ring above: on 3 to
    /// [`crate::endpoint::RING_MAX_MEMBERS`] members, and on 2 where `max_medium` is below
    /// [`crate::endpoint::RING_PAIR_MEDIUM`] (at 2 a ring moves the same bytes as doubling
    /// in two dependent steps per chunk instead of one, and pays only by halving the
    /// number of chunks where Mediums are small). A user's operation, which need not be
    /// commutative, always runs by recursive doubling.
    #[default]
    Auto,
    /// Recursive doubling at every size: ⌈log2 n⌉ steps, each carrying the whole vector
    /// (in chunks of `max_medium`), each member reducing all of it at every step.
    Doubling,
    /// A ring at every size where it applies: a reduce-scatter then an all-gather,
    /// `2 (n - 1)` steps of one n-th of the vector each; every member sends and reduces
    /// `(n - 1) / n` of it, and each step's Medium carries `max_medium` bytes, so a chunk
    /// is `n` Mediums long.
    Ring,
}

impl std::str::FromStr for AllReduceAlgorithm {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(AllReduceAlgorithm::Auto),
            "doubling" => Ok(AllReduceAlgorithm::Doubling),
            "ring" => Ok(AllReduceAlgorithm::Ring),
            other => Err(format!(
                "unknown all-reduce algorithm {other:?}: expected auto, doubling or ring"
            )),
        }
    }
}

/// Configuration of a [`crate::Node`].
///
/// Built from the defaults or the environment, then changed by the setters named after the
/// fields: `Config::default().wait_mode(WaitMode::Block).spin_polls(100)`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// How many requests a rank may have outstanding to each peer (`AM_CREDITS`): static (at most
    /// 255 and at most the transport's `max_credits`) or dynamic. `None`, the default: the
    /// transport's own ([`NicInfo::credits`](crate::transport::NicInfo::credits)), 32 static per
    /// peer unless its round trip asks for more (udp: 128).
    pub credits: Option<Credits>,
    /// How blocking calls wait (`AM_WAIT`, default `yield`).
    pub wait_mode: WaitMode,
    /// Polls spent spinning before yielding or blocking.
    pub spin_polls: u32,
    /// Longest single block in [`WaitMode::Block`] before polling again.
    pub block_timeout: Duration,
    /// Longest a closing node ([`crate::Node::close`], or its drop) waits for what it owes
    /// and is owed (replies, acknowledgements, posted atomics) before it leaves anyway.
    pub close_timeout: Duration,
    /// How team all-reduces run (`AM_ALLREDUCE`, default [`AllReduceAlgorithm::Auto`]).
    pub all_reduce: AllReduceAlgorithm,
    /// Bytes of the symmetric heap: the last this many bytes of segment 0
    /// (`AM_SYMMETRIC_SIZE`, default 0; [`crate::symmetric`]). `run_job` makes the segments
    /// `AM_SYMMETRIC_SIZE` larger than asked; set in code, size the segment to hold it.
    pub symmetric_size: usize,
    /// Whether typed values larger than a few Mediums move by rendezvous where the
    /// transport's peers map each other's memory (`AM_TYPED_RENDEZVOUS`, `1` or `0`,
    /// default on; [`crate::typed`]): off, they go in parts of one Medium each.
    pub typed_rendezvous: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            credits: None,
            wait_mode: WaitMode::SpinThenYield,
            spin_polls: 64,
            block_timeout: Duration::from_millis(10),
            close_timeout: Duration::from_secs(30),
            all_reduce: AllReduceAlgorithm::Auto,
            symmetric_size: 0,
            typed_rendezvous: true,
        }
    }
}

/// A malformed configuration variable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("environment variable {var}={value:?}: {why}")]
pub struct ConfigError {
    /// The variable.
    pub var: &'static str,
    /// Its value.
    pub value: String,
    /// What is wrong with it.
    pub why: String,
}

/// Environment variable `var` parsed, if it is set.
fn from_var<T: std::str::FromStr<Err = String>>(
    var: &'static str,
) -> Result<Option<T>, ConfigError> {
    parse_var(&|k| std::env::var(k).ok(), var)
}

/// Variable `var` as `lookup` gives it (`None`: not set), parsed, if it is set: the parse
/// [`Config::from_env`] makes of its variables, for a configuration that reads them through
/// a lookup of its own (a NIC's, or its tests' list of variables), with the same error.
pub fn parse_var<T: std::str::FromStr<Err = String>>(
    lookup: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<T>, ConfigError> {
    let Some(value) = lookup(var) else {
        return Ok(None);
    };
    match value.parse() {
        Ok(v) => Ok(Some(v)),
        Err(why) => Err(ConfigError { var, value, why }),
    }
}

impl Config {
    /// The defaults, overridden by `AM_CREDITS`, `AM_WAIT`, `AM_ALLREDUCE`,
    /// `AM_SYMMETRIC_SIZE` and `AM_TYPED_RENDEZVOUS` where set.
    pub fn from_env() -> Result<Config, ConfigError> {
        let mut c = Config::default();
        if let Some(credits) = from_var("AM_CREDITS")? {
            c.credits = Some(credits);
        }
        if let Some(mode) = from_var("AM_WAIT")? {
            c.wait_mode = mode;
        }
        if let Some(algorithm) = from_var("AM_ALLREDUCE")? {
            c.all_reduce = algorithm;
        }
        c.symmetric_size = symmetric_size_from_env()?;
        if let Ok(value) = std::env::var("AM_TYPED_RENDEZVOUS") {
            c.typed_rendezvous = match value.trim() {
                "1" => true,
                "0" => false,
                _ => {
                    let why = "expected 1 or 0".into();
                    let var = "AM_TYPED_RENDEZVOUS";
                    return Err(ConfigError { var, value, why });
                }
            };
        }
        Ok(c)
    }

    /// [`Config::from_env`] for a job of `ranks` ranks on this machine: where `AM_WAIT` is not
    /// set and the ranks outnumber the cores, they block rather than spin (a spinning rank
    /// would keep a descheduled one from the core it waits for).
    pub fn from_env_for_ranks(ranks: u32) -> Result<Config, ConfigError> {
        let mut c = Config::from_env()?;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        if std::env::var_os("AM_WAIT").is_none() && ranks as usize > cores {
            c.wait_mode = WaitMode::Block;
        }
        Ok(c)
    }

    /// The defaults, as [`Config::default`]; change them with the setters below.
    pub fn new() -> Config {
        Config::default()
    }

    /// With this credit policy.
    #[must_use]
    pub fn credits(mut self, credits: Credits) -> Config {
        self.credits = Some(credits);
        self
    }

    /// With this all-reduce algorithm.
    #[must_use]
    pub fn all_reduce(mut self, all_reduce: AllReduceAlgorithm) -> Config {
        self.all_reduce = all_reduce;
        self
    }

    /// With a symmetric heap of this many bytes: the last bytes of segment 0.
    #[must_use]
    pub fn symmetric_size(mut self, bytes: usize) -> Config {
        self.symmetric_size = bytes;
        self
    }

    /// With typed values moved by rendezvous where the transport allows (`true`, the
    /// default), or always in parts.
    #[must_use]
    pub fn typed_rendezvous(mut self, on: bool) -> Config {
        self.typed_rendezvous = on;
        self
    }

    /// With this way of waiting.
    #[must_use]
    pub fn wait_mode(mut self, wait_mode: WaitMode) -> Config {
        self.wait_mode = wait_mode;
        self
    }

    /// Spinning this many polls before yielding or blocking.
    #[must_use]
    pub fn spin_polls(mut self, spin_polls: u32) -> Config {
        self.spin_polls = spin_polls;
        self
    }

    /// Blocking at most this long at a time in [`WaitMode::Block`].
    #[must_use]
    pub fn block_timeout(mut self, block_timeout: Duration) -> Config {
        self.block_timeout = block_timeout;
        self
    }

    /// A closing node waits at most this long for what it owes and is owed.
    #[must_use]
    pub fn close_timeout(mut self, close_timeout: Duration) -> Config {
        self.close_timeout = close_timeout;
        self
    }
}

/// Parses a byte size such as `4096`, `64K`, `16M` or `1G` (binary multiples), as accepted by
/// `AM_SEGMENT_SIZE`.
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (num, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1usize << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        b'g' | b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<usize>().ok()?.checked_mul(mult)
}

/// The segment size asked for by `AM_SEGMENT_SIZE`, or `default`.
pub fn segment_size_from_env(default: usize) -> Result<usize, ConfigError> {
    size_from_env("AM_SEGMENT_SIZE", default)
}

/// The symmetric heap's size asked for by `AM_SYMMETRIC_SIZE` (a size as
/// `AM_SEGMENT_SIZE` takes), or 0.
pub fn symmetric_size_from_env() -> Result<usize, ConfigError> {
    size_from_env("AM_SYMMETRIC_SIZE", 0)
}

/// The byte size environment variable `var` asks for ([`parse_size`]), or `default`.
fn size_from_env(var: &'static str, default: usize) -> Result<usize, ConfigError> {
    match std::env::var(var) {
        Ok(v) => parse_size(&v).ok_or(ConfigError {
            var,
            value: v,
            why: "expected a size such as 1048576, 64K, 16M or 1G".into(),
        }),
        Err(_) => Ok(default),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// More ranks than cores block; a job that fits keeps the default. (`AM_WAIT` set in the
    /// environment decides instead, as it should: nothing to check then.)
    #[test]
    fn ranks_beyond_the_cores_block() {
        if std::env::var_os("AM_WAIT").is_some() || std::env::var_os("AM_CREDITS").is_some() {
            return;
        }
        let crowded = Config::from_env_for_ranks(u32::MAX).unwrap();
        assert_eq!(crowded.wait_mode, WaitMode::Block);
        let fits = Config::from_env_for_ranks(1).unwrap();
        assert_eq!(fits.wait_mode, Config::default().wait_mode);
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("16m"), Some(16 << 20));
        assert_eq!(parse_size("1G"), Some(1 << 30));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        assert_eq!(parse_size("99999999999999999999G"), None);
    }

    #[test]
    fn wait_modes_parse() {
        assert_eq!("spin".parse::<WaitMode>(), Ok(WaitMode::Spin));
        assert_eq!("block".parse::<WaitMode>(), Ok(WaitMode::Block));
        assert!("fast".parse::<WaitMode>().is_err());
    }
}
