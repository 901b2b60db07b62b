//! Job launch for amnet: `amrun`'s code, which starts the ranks of a job on this host.
//!
//! [`Launcher`] (and [`self_launch`], and the `amrun` binary) starts N local processes,
//! serves them a PMI-1 key-value store over an inherited socket (`AM_PMI_FD`), prefixes their
//! output with `[rank] `, ends the whole job when one rank fails, aborts, or the launcher is
//! signalled, and removes the job's `/dev/shm/am-<job_id>-*` files.
//!
//! The rank side (how a process learns its rank, the job size, the job id and the launcher's
//! key-value store, under amrun, MPICH's `mpiexec`, Slurm's `srun`, Open MPI's `mpirun` or
//! none) is the `am-bootstrap` crate, which transports depend on without this launcher. Its
//! public items are re-exported here at their old paths ([`JobInfo`], [`KeyValueStore`],
//! [`BootstrapError`], [`bootstrap`], [`keyfile`], ...), so a program written against
//! `am_launch` compiles unchanged.
//!
//! What this crate does **not** do: start processes on other hosts (use `mpiexec` or `srun`
//! for that), forward stdin to ranks, bind processes to cores, serve PMI-2 or PMIx (its ranks
//! get PMI-1; as clients, ranks speak PMI-1, PMI-2 and PMIx through `am-bootstrap`), or
//! support dynamic process management (PMI spawn). It moves no application data; transports
//! do that. A launcher killed with SIGKILL takes its ranks down all the same: each
//! rank watches its PMI connection and ends (SIGTERM, then SIGKILL a second later) when it
//! closes before the rank finalized it (`am-bootstrap`). Known limits: descendants of ranks that ignore
//! SIGTERM can outlive a job whose ranks all ended on SIGTERM; and the launcher's signal
//! handlers stay installed (inert) after a job.
//!
//! amrun passes the key-value store as an inherited socket rather than a
//! socket path: the rank's end has close-on-exec cleared (with `fcntl`) just
//! for its own spawn, and spawns are serialised so no other rank inherits it.
//!
//! Set for ranks by the launcher: `AM_RANK`, `AM_SIZE`, `AM_JOB_ID`, `AM_LAUNCHER=amrun`,
//! `AM_PMI_FD`, `AM_TRANSPORT`, and for a udp job `AM_UDP_KEY_FD` (or `AM_UDP_KEY_FILE`
//! passed through). Read by the launcher: `AM_LAUNCH_VERBOSE`, and for a udp job
//! `AM_UDP_KEY` or `AM_UDP_KEY_FILE` (the user's own key, used instead of a fresh one).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod launcher;
mod server;
mod shm;

/// The rank side (`am-bootstrap`'s), re-exported at these paths for programs that use them.
pub mod bootstrap {
    pub use am_bootstrap::{
        launcher_variables_seen, BootstrapError, JobInfo, KeyValueStore, LauncherKind,
    };
}

/// Key files (`am-bootstrap`'s), re-exported at these paths for programs that use them.
pub mod keyfile {
    pub use am_bootstrap::{is_udp_key, read_key_file, KeyFileError};
}

pub use am_bootstrap::{
    is_valid_job_id, launcher_variables_seen, process_alive, read_key_file, BootstrapError,
    JobInfo, KeyFileError, KeyValueStore, LauncherKind,
};
pub use launcher::{self_launch, self_launcher, LaunchError, Launcher, TRANSPORTS};
pub use shm::remove_job_shm;
