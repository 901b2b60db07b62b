//! The words every other module speaks: which launcher started the job.

use std::fmt;

/// Which launcher started this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LauncherKind {
    /// Our own launcher, `amrun` (or `am_launch::Launcher`): `AM_RANK`, `AM_SIZE`, `AM_JOB_ID`.
    Amrun,
    /// MPICH's `mpiexec` (hydra), through PMI (`PMI_FD` or `PMI_PORT`).
    Mpiexec,
    /// Slurm's `srun` (`SLURM_PROCID`), with PMI-2 when `srun --mpi=pmi2` provides `PMI_FD`,
    /// PMIx under `srun --mpi=pmix`.
    Slurm,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_RANK`), with PMIx when its server is there.
    OpenMpi,
    /// Not launched: a job of one rank.
    Singleton,
}

impl fmt::Display for LauncherKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LauncherKind::Amrun => "amrun",
            LauncherKind::Mpiexec => "mpiexec",
            LauncherKind::Slurm => "slurm",
            LauncherKind::OpenMpi => "openmpi",
            LauncherKind::Singleton => "singleton",
        })
    }
}
