//! What can go wrong while a rank bootstraps or uses its launcher's key-value store.

use std::io;

use crate::types::LauncherKind;

/// Why bootstrapping, or a key-value-store operation, failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// A variable the detected launcher should have set is missing.
    #[error("environment variable {var} is not set ({why})")]
    MissingVar {
        /// The variable's name.
        var: &'static str,
        /// What it is needed for.
        why: &'static str,
    },
    /// A variable is set to something unusable.
    #[error("environment variable {var}={value:?} is invalid: {reason}")]
    InvalidVar {
        /// The variable's name.
        var: &'static str,
        /// Its value (lossily converted if not UTF-8).
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The rank is not below the job size.
    #[error(
        "rank {rank} (from {rank_var}) is out of range for a job of {size} ranks (from {size_var})"
    )]
    RankOutOfRange {
        /// The rank found.
        rank: u32,
        /// The job size found.
        size: u32,
        /// Where the rank came from.
        rank_var: &'static str,
        /// Where the size came from.
        size_var: &'static str,
    },
    /// The environment and the PMI server disagree.
    #[error("inconsistent launch information: {detail}")]
    Inconsistent {
        /// What disagrees.
        detail: String,
    },
    /// No job id all ranks agree on can be found.
    #[error("cannot find a job id shared by all ranks under {launcher}: set AM_JOB_ID to the same value ([A-Za-z0-9_-]+) for every rank, e.g. `mpirun -x AM_JOB_ID=$RANDOM$RANDOM ...`")]
    NoJobId {
        /// The launcher detected.
        launcher: LauncherKind,
    },
    /// The launcher's PMI connection was already used by an earlier bootstrap in this process.
    #[error("this process already bootstrapped through the launcher's PMI connection; call JobInfo::from_env() once and keep the JobInfo")]
    AlreadyBootstrapped,
    /// An I/O error talking to the launcher.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The launcher closed its PMI connection.
    #[error("the launcher closed the PMI connection while {what}")]
    Disconnected {
        /// What was being done.
        what: String,
    },
    /// The launcher sent something that is not valid PMI.
    #[error("PMI protocol error: {detail}")]
    Protocol {
        /// What was wrong.
        detail: String,
    },
    /// The launcher answered a PMI command with a non-zero return code.
    #[error("PMI command `{cmd}` failed with rc={rc}: {msg}")]
    Pmi {
        /// The command.
        cmd: String,
        /// The return code, as sent.
        rc: String,
        /// The launcher's message, possibly empty.
        msg: String,
    },
    /// `get` of a key no rank has put (or not yet fenced).
    #[error("key {key:?} is not in the launcher's key-value store")]
    KeyNotFound {
        /// The key.
        key: String,
    },
    /// A key or value that PMI cannot carry.
    #[error("invalid key-value entry for key {key:?}: {reason}")]
    InvalidEntry {
        /// The key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The key-value store was used after `finalize` or `abort`.
    #[error("the key-value store was already finalized or aborted")]
    Closed,
    /// The launcher's PMIx server (Open MPI's mpirun, PRRTE, srun --mpi=pmix) could not be
    /// used.
    #[error("PMIx: {0}")]
    Pmix(#[from] am_pmix::PmixError),
}
