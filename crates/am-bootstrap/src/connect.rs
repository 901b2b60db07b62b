//! How a transport joins a job: [`Connect`], the one way every transport is made (by the
//! facade's table of transports, or by a program with a transport of its own), and its one
//! start-up error, [`ConnectError`].

use std::error::Error;

use crate::JobInfo;

/// A transport that a rank connects to its job: configured from the environment, then joined
/// to the other ranks through the launcher's key-value store ([`JobInfo`]), or made for all
/// ranks of a job in one process (`cluster`: ranks as threads, for tests and benchmarks).
///
/// Every transport of the workspace implements it, and a transport of one's own that does
/// is started the same way.
pub trait Connect: Sized {
    /// The transport's name (`sci`, `udp`, ...), as `AM_TRANSPORT` spells it.
    const NAME: &'static str;
    /// Its settings.
    type Config;

    /// The settings the environment gives a job of `ranks` ranks (a transport whose layout
    /// follows the job's size chooses from it).
    fn config_from_env(ranks: u32) -> Result<Self::Config, ConnectError>;

    /// Connects this process's rank of `job`, with segments of `segment_size` bytes.
    /// Collective: every rank of the job calls it.
    fn connect(
        job: &mut JobInfo,
        segment_size: usize,
        config: Self::Config,
    ) -> Result<Self, ConnectError>;

    /// The transports of all `ranks` ranks of a job in this process, one per rank.
    fn cluster(
        ranks: u32,
        segment_size: usize,
        config: Self::Config,
    ) -> Result<Vec<Self>, ConnectError>;
}

/// What kind of failure stopped a transport from starting ([`ConnectError::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectErrorKind {
    /// A setting (a variable of the environment, or the configuration given) is invalid.
    Config,
    /// The launcher's key-value store failed, or gives the ranks none to meet through.
    Bootstrap,
    /// The ranks' segments differ in size: `rank`'s has `theirs` bytes, rank 0's `ours`.
    SegmentSizeMismatch {
        /// The first rank whose segment differs.
        rank: u32,
        /// Rank 0's segment size.
        ours: u64,
        /// That rank's.
        theirs: u64,
    },
    /// The ranks disagree on the transport's own set-up (its geometry, its version), or one
    /// published something unreadable.
    Mismatch,
    /// The machine refused a resource: shared memory, a socket, the device.
    Resource,
    /// The transport is not there (no such provider, device or library).
    Unavailable,
}

/// A transport could not start: which transport, what kind of failure ([`Self::kind`]),
/// and the transport's own error as the [source](Error::source).
#[derive(Debug, thiserror::Error)]
#[error("{transport} transport: {source}")]
pub struct ConnectError {
    transport: &'static str,
    kind: ConnectErrorKind,
    #[source]
    source: Box<dyn Error + Send + Sync + 'static>,
}

impl ConnectError {
    /// A failure of `transport` of this kind, caused by `source`.
    pub fn new(
        transport: &'static str,
        kind: ConnectErrorKind,
        source: impl Into<Box<dyn Error + Send + Sync + 'static>>,
    ) -> ConnectError {
        ConnectError {
            transport,
            kind,
            source: source.into(),
        }
    }

    /// The transport that failed.
    pub fn transport(&self) -> &'static str {
        self.transport
    }

    /// What kind of failure it was.
    pub fn kind(&self) -> ConnectErrorKind {
        self.kind
    }

    /// The transport's own error, to inspect (`downcast_ref`) or to take back.
    pub fn into_source(self) -> Box<dyn Error + Send + Sync + 'static> {
        self.source
    }
}

/// Implements [`Connect`] for a transport whose inherent `connect` and `cluster` take a
/// [`JobInfo`] and its configuration: `$from_env` makes the configuration for a job of
/// `$ranks` ranks, and `$into` turns the transport's error into a [`ConnectError`].
///
/// ```ignore
/// am_bootstrap::impl_connect!(Udp, UdpConfig, "udp", |_ranks| UdpConfig::from_env(), ConnectError::from);
/// ```
#[macro_export]
macro_rules! impl_connect {
    ($t:ty, $config:ty, $name:literal, |$ranks:ident| $from_env:expr, $into:expr) => {
        impl $crate::Connect for $t {
            const NAME: &'static str = $name;
            type Config = $config;
            fn config_from_env($ranks: u32) -> Result<$config, $crate::ConnectError> {
                $from_env.map_err($into)
            }
            fn connect(
                job: &mut $crate::JobInfo,
                segment_size: usize,
                config: $config,
            ) -> Result<$t, $crate::ConnectError> {
                <$t>::connect(job, segment_size, config).map_err($into)
            }
            fn cluster(
                ranks: u32,
                segment_size: usize,
                config: $config,
            ) -> Result<Vec<$t>, $crate::ConnectError> {
                <$t>::cluster(ranks, segment_size, config).map_err($into)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transport's own error stays reachable, typed, behind the kind.
    #[test]
    fn the_source_is_kept_and_typed() {
        let io = std::io::Error::new(std::io::ErrorKind::PermissionDenied, "no /dev/shm");
        let e = ConnectError::new("sci", ConnectErrorKind::Resource, io);
        assert_eq!(e.kind(), ConnectErrorKind::Resource);
        assert_eq!(e.transport(), "sci");
        assert_eq!(e.to_string(), "sci transport: no /dev/shm");
        let source = e.source().expect("a source");
        let io = source.downcast_ref::<std::io::Error>().expect("typed");
        assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied);
    }
}
