//! [`UdpError`]: why a UDP transport could not start.

use std::io;

use crate::wire::KeyError;

/// Why a UDP transport could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UdpError {
    /// A malformed configuration variable or setting.
    #[error("{var}={value:?}: {why}")]
    Config {
        /// The variable or setting.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        why: String,
    },
    /// The job key could not be read.
    #[error("job key: {0}")]
    Key(#[source] KeyError),
    /// A socket or file operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The launcher's key-value store failed.
    #[error("key-value store: {0}")]
    Bootstrap(#[from] am_bootstrap::BootstrapError),
    /// A job of several ranks with neither a key-value store nor `AM_COORD`.
    #[error("the ranks cannot find each other: the launcher ({launcher}; launcher variables seen: {seen}) gives them no key-value store: start the job under amrun, MPICH's mpiexec, srun --mpi=pmi2 or a PMIx launcher (Open MPI's mpirun, srun --mpi=pmix), or set AM_COORD=host:port (rank 0 serves it) and AM_UDP_KEY for every rank")]
    NoRendezvous {
        /// The launcher that started the job.
        launcher: am_bootstrap::LauncherKind,
        /// The launcher variables set ([`am_bootstrap::launcher_variables_seen`]).
        seen: String,
    },
    /// `AM_COORD` without a job key: the coordinator will not hand out a key in the clear.
    #[error("AM_COORD needs a job key shared by the ranks: set AM_UDP_KEY (64 hex digits) or AM_UDP_KEY_FILE for every rank")]
    KeyRequired,
    /// A peer announced at start-up a datagram size (its `AM_UDP_MTU`) this transport does
    /// not support. (Different supported sizes are no error: the ranks agree on the
    /// smallest.)
    #[error("rank {peer} announced a datagram size of {mtu} bytes (its AM_UDP_MTU), outside 576..=65507")]
    PeerMtu {
        /// The rank.
        peer: u32,
        /// The size it announced.
        mtu: usize,
    },
    /// The ranks were started with different job keys (`AM_UDP_KEY` or `AM_UDP_KEY_FILE`):
    /// found at start-up by key confirmation, instead of as lost peers once every datagram
    /// fails its MAC.
    #[error("job key mismatch: rank {rank} was started with a different AM_UDP_KEY/AM_UDP_KEY_FILE than rank(s) {peers:?}; every rank of a job needs the same key")]
    KeyMismatch {
        /// This rank.
        rank: u32,
        /// The ranks whose key differs from this rank's (rank 0 for the `AM_COORD`
        /// coordinator, whose key decides).
        peers: Vec<u32>,
    },
    /// Rank 0 cannot serve the `AM_COORD` coordinator: another process holds that port (a
    /// squatter, or a job still running with the same `AM_COORD`).
    #[error("AM_COORD={coord}: the port is taken by another process, so rank 0 cannot serve the coordinator there (another job, or someone squatting it): pick another port")]
    CoordinatorPortTaken {
        /// `AM_COORD`.
        coord: String,
    },
    /// What answers at `AM_COORD` did not prove it holds this job's key: it is not rank 0 of
    /// this job (another process holds the port), or it never answered in time.
    #[error("AM_COORD={coord}: what answers there is not this job's rank 0 ({why}{}); another process may hold the port", source.as_ref().map_or_else(String::new, |e| format!(": {e}")))]
    CoordinatorNotAuthentic {
        /// `AM_COORD`.
        coord: String,
        /// What it failed to do.
        why: String,
        /// The error reading its answer, where a read failed (timed out, not text).
        #[source]
        source: Option<io::Error>,
    },
    /// Two processes registered as the same rank with the `AM_COORD` coordinator, with
    /// different addresses or epochs (the same `AM_RANK` given twice, or a rank started again
    /// while the first is still registered). The coordinator does not pick one: it refuses the
    /// second and fails the start-up of every rank it can reach, rather than send one rank's
    /// traffic to the other.
    #[error("AM_COORD={coord}: two processes registered as rank {rank} (from different addresses or epochs), so the coordinator refused the job: start each rank once, with its own AM_RANK")]
    ConflictingRegistration {
        /// `AM_COORD`.
        coord: String,
        /// The rank registered twice.
        rank: u32,
    },
    /// The AM segment (heap memory in this transport) could not be made.
    #[error("a {size}-byte AM segment: {source}")]
    Segment {
        /// The size asked for.
        size: usize,
        /// Why.
        #[source]
        source: am_shm::ShmError,
    },
    /// Address exchange failed or a peer sent something invalid.
    #[error("rendezvous: {0}")]
    Rendezvous(String),
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> UdpError {
    let what = what.into();
    move |source| UdpError::Io { what, source }
}

impl UdpError {
    /// What kind of start-up failure this is ([`am_bootstrap::ConnectErrorKind`]).
    pub fn kind(&self) -> am_bootstrap::ConnectErrorKind {
        use am_bootstrap::ConnectErrorKind as K;
        match self {
            UdpError::Config { .. } | UdpError::Key(_) | UdpError::KeyRequired => K::Config,
            UdpError::Io { .. }
            | UdpError::Segment { .. }
            | UdpError::CoordinatorPortTaken { .. } => K::Resource,
            UdpError::Bootstrap(_) | UdpError::NoRendezvous { .. } => K::Bootstrap,
            UdpError::PeerMtu { .. }
            | UdpError::KeyMismatch { .. }
            | UdpError::CoordinatorNotAuthentic { .. }
            | UdpError::ConflictingRegistration { .. }
            | UdpError::Rendezvous(_) => K::Mismatch,
        }
    }
}

impl From<UdpError> for am_bootstrap::ConnectError {
    fn from(e: UdpError) -> am_bootstrap::ConnectError {
        am_bootstrap::ConnectError::new("udp", e.kind(), e)
    }
}
