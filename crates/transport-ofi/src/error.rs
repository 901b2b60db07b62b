//! Why the transport could not start.

use am_bootstrap::BootstrapError;
use am_core::Rank;
use am_ofi::OfiError;

/// Why the transport could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OfiTransportError {
    /// No libfabric interface offers RDM endpoints with messages and RMA (of the provider
    /// asked for).
    #[error("no libfabric provider{} offers RDM endpoints with messages and RMA; providers with RDM endpoints here: {found}", wanted.as_ref().map(|w| format!(" matching {w:?}")).unwrap_or_default())]
    NoProvider {
        /// The provider asked for (`AM_OFI_PROVIDER` or `FI_PROVIDER`).
        wanted: Option<String>,
        /// The providers libfabric lists with RDM endpoints.
        found: String,
    },
    /// A libfabric call failed.
    #[error(transparent)]
    Ofi(#[from] OfiError),
    /// The exchange of addresses through the launcher failed.
    #[error("start-up through the launcher's key-value store: {0}")]
    Bootstrap(#[from] BootstrapError),
    /// A peer's start-up entry could not be used.
    #[error("start-up: {0}")]
    Rendezvous(String),
    /// The segment could not be made.
    #[error("making the segment")]
    Segment(#[source] am_shm::ShmError),
    /// A setting is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// A rank's segment differs in size from rank 0's (every rank finds the same one: the
    /// first that differs).
    #[error(
        "rank {rank} has a {theirs}-byte segment, rank 0 has {ours}: segment sizes must agree"
    )]
    SegmentSizeMismatch {
        /// The first rank whose segment differs.
        rank: Rank,
        /// Rank 0's segment size.
        ours: usize,
        /// That rank's.
        theirs: usize,
    },
    /// A peer chose another provider.
    #[error("rank {rank} uses provider {theirs:?}, this rank {ours:?}: set AM_OFI_PROVIDER (or FI_PROVIDER) the same for every rank")]
    ProviderMismatch {
        /// The peer.
        rank: Rank,
        /// This rank's provider.
        ours: String,
        /// The peer's.
        theirs: String,
    },
}

impl OfiTransportError {
    /// What kind of start-up failure this is ([`am_bootstrap::ConnectErrorKind`]).
    pub fn kind(&self) -> am_bootstrap::ConnectErrorKind {
        use am_bootstrap::ConnectErrorKind as K;
        match self {
            OfiTransportError::NoProvider { .. } => K::Unavailable,
            OfiTransportError::Ofi(_) | OfiTransportError::Segment(_) => K::Resource,
            OfiTransportError::Bootstrap(_) => K::Bootstrap,
            OfiTransportError::Rendezvous(_) | OfiTransportError::ProviderMismatch { .. } => {
                K::Mismatch
            }
            OfiTransportError::Config(_) => K::Config,
            &OfiTransportError::SegmentSizeMismatch { rank, ours, theirs } => {
                K::SegmentSizeMismatch {
                    rank,
                    ours: ours as u64,
                    theirs: theirs as u64,
                }
            }
        }
    }
}

impl From<OfiTransportError> for am_bootstrap::ConnectError {
    fn from(e: OfiTransportError) -> am_bootstrap::ConnectError {
        am_bootstrap::ConnectError::new("ofi", e.kind(), e)
    }
}
