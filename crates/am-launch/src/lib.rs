//! Job launch for amnet: how ranks find each other, and how jobs are started.
//!
//! **Rank side** ([`JobInfo::from_env`]): a process learns its rank, the job
//! size, a job id all ranks agree on, the requested transport and the
//! launcher's key-value store from its environment. Supported launchers:
//! our own `amrun` ([`Launcher`]), MPICH's `mpiexec` (hydra; PMI-1 over
//! `PMI_FD` or `PMI_PORT`, PMI-2 on request), Slurm's `srun` (PMI-2 with
//! `--mpi=pmi2`), Open MPI's `mpirun` (no key-value store) and singletons.
//! The store ([`KeyValueStore`]) is what transports use to exchange
//! addresses before they can talk to each other.
//!
//! **Launcher side** ([`Launcher`], [`self_launch`], the `amrun` binary):
//! starts N local processes, serves them a PMI-1 key-value store over an
//! inherited socket (`AM_PMI_FD`), prefixes their output with `[rank] `,
//! ends the whole job when one rank fails, aborts, or the launcher is
//! signalled, and removes the job's `/dev/shm/am-<job_id>-*` files.
//!
//! What this crate does **not** do: start processes on other hosts (use
//! `mpiexec` or `srun` for that), forward stdin to ranks, bind processes to
//! cores, speak PMIx, or support dynamic process management (PMI spawn).
//! It moves no application data; transports do that. Known limits: if the
//! launcher itself is killed with SIGKILL its ranks keep running (setting a
//! parent-death signal needs `unsafe`); descendants of ranks that ignore
//! SIGTERM can outlive a job whose ranks all ended on SIGTERM; and the
//! launcher's signal handlers stay installed (inert) after a job.
//!
//! amrun passes the key-value store as an inherited socket rather than a
//! socket path: the rank's end has close-on-exec cleared (with `fcntl`) just
//! for its own spawn, and spawns are serialised so no other rank inherits it.
//!
//! Environment variables read by ranks: `AM_RANK`, `AM_SIZE`, `AM_JOB_ID`,
//! `AM_PMI_FD`, `AM_TRANSPORT`, `AM_PMI_VERSION` (1 or 2, for `PMI_FD` /
//! `PMI_PORT` only), `PMI_FD`, `PMI_PORT`, `PMI_ID`, `PMI_RANK`, `PMI_SIZE`,
//! `PMI_JOBID`, `OMPI_COMM_WORLD_RANK`, `OMPI_COMM_WORLD_SIZE`,
//! `PMIX_NAMESPACE`, `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_JOB_ID`,
//! `SLURM_STEP_ID`. Set for ranks by the launcher: `AM_RANK`, `AM_SIZE`,
//! `AM_JOB_ID`, `AM_LAUNCHER=amrun`, `AM_PMI_FD`, `AM_TRANSPORT`, and for a udp
//! job `AM_UDP_KEY_FD` (or `AM_UDP_KEY_FILE` passed through). Read by the
//! launcher: `AM_LAUNCH_VERBOSE`, and for a udp job `AM_UDP_KEY` or
//! `AM_UDP_KEY_FILE` (the user's own key, used instead of a fresh one).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bootstrap;
mod client;
pub mod keyfile;
pub mod launcher;
mod pmix;
mod server;
mod util;
mod wire;

pub use bootstrap::{
    launcher_variables_seen, BootstrapError, JobInfo, KeyValueStore, LauncherKind,
};
pub use keyfile::{read_key_file, KeyFileError};
pub use launcher::{self_launch, self_launcher, LaunchError, Launcher, TRANSPORTS};
pub use util::{is_valid_job_id, process_alive, remove_job_shm};
