//! The rank side of an amnet job: how a process learns its place in the job and reaches its
//! peers' addresses, with no launcher code.
//!
//! [`JobInfo::from_env`] gives a process its rank, the job size, a job id all ranks agree on,
//! the requested transport and the launcher's key-value store ([`KeyValueStore`]), through
//! which transports exchange addresses before they can talk to each other. It reads them from
//! whichever launcher started the process: amnet's own `amrun` (PMI-1 over an inherited
//! socket), MPICH's `mpiexec` (hydra; PMI-1 over `PMI_FD` or `PMI_PORT`, PMI-2 on request),
//! Slurm's `srun` (PMI-2 with `--mpi=pmi2`, PMIx with `--mpi=pmix`), Open MPI's `mpirun`
//! (PMIx, through [`am_pmix`], when its server is there), or none (a job of one rank). Beside
//! it: [`process_alive`] for the shared-memory transports' liveness checks, [`read_key_file`]
//! for the UDP transport's key file, and job ids and keys.
//!
//! A rank dies with its launcher: while its PMI connection (`AM_PMI_FD`, `PMI_FD` or
//! `PMI_PORT`) is open, a thread of the rank watches it, and if it closes before the rank
//! finalized or aborted (the launcher was killed, even by SIGKILL), the rank sends itself
//! SIGTERM, then SIGKILL a second later, as the launcher would have. A rank under PMIx
//! (`mpirun`, `srun --mpi=pmix`) is not watched this way.
//!
//! What this crate does **not** do: start processes or serve a key-value store (`am-launch`
//! and its `amrun` do), move application data (the transports do), or support dynamic
//! process management (PMI spawn).
//!
//! Environment variables read: `AM_RANK`, `AM_SIZE`, `AM_JOB_ID`, `AM_PMI_FD`,
//! `AM_TRANSPORT`, `AM_PMI_VERSION` (1 or 2, for `PMI_FD` / `PMI_PORT` only), `PMI_FD`,
//! `PMI_PORT`, `PMI_ID`, `PMI_RANK`, `PMI_SIZE`, `PMI_JOBID`, `OMPI_COMM_WORLD_RANK`,
//! `OMPI_COMM_WORLD_SIZE`, `PMIX_NAMESPACE`, `PMIX_RANK`, `PMIX_SERVER_URI*`,
//! `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_JOB_ID`, `SLURM_STEP_ID`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

// Modules in one direction: `types`, `ids`, `liveness`, `keyfile`, `watch` and `wire` import nothing
// of this crate; `error` imports `types`; `store` and `env` import `error`; `client` and
// `pmix` are built on those; `job` (detection) is on top, and `endpoints` on it.
mod client;
mod connect;
mod endpoints;
mod env;
mod error;
mod ids;
mod job;
mod keyfile;
mod liveness;
mod pmix;
mod store;
mod types;
mod watch;
#[doc(hidden)]
pub mod wire;

pub use connect::{Connect, ConnectError, ConnectErrorKind};
pub use endpoints::{split as split_endpoints, EndpointLayout};
pub use error::BootstrapError;
pub use ids::{is_valid_job_id, random_job_id, random_job_key};
pub use job::{launcher_variables_seen, JobInfo};
pub use keyfile::{is_udp_key, read_key_file, KeyFileError};
pub use liveness::process_alive;
pub use store::KeyValueStore;
pub use types::LauncherKind;
