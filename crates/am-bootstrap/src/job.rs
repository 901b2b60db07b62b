//! Rank side: learn rank, size, job id and the launcher's key-value store from the environment.

use std::fmt;
use std::net::TcpStream;

use crate::client::{Conn, FdSocket, Pmi1Client, Pmi2Client};
use crate::env::{num, parse_fd, required_num, Env, ProcessEnv};
use crate::error::BootstrapError;
use crate::ids::{is_valid_job_id, random_job_id, sanitize_job_id};
use crate::pmix::store_if_served;
use crate::store::KeyValueStore;
use crate::types::LauncherKind;

/// Everything a rank knows about its job.
pub struct JobInfo {
    /// This process's rank, `0..size`.
    pub rank: u32,
    /// Number of ranks in the job.
    pub size: u32,
    /// The job's id, `[A-Za-z0-9_-]+`, the same on every rank; safe in file
    /// names (shared-memory files are named `am-<job_id>-...`).
    pub job_id: String,
    /// The transport requested with `AM_TRANSPORT`, if any.
    pub transport: Option<String>,
    /// The launcher that started the job.
    pub launcher: LauncherKind,
    /// The launcher's key-value store, when it has one.
    pub kvs: Option<Box<dyn KeyValueStore + Send>>,
}

impl fmt::Debug for JobInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobInfo")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("job_id", &self.job_id)
            .field("transport", &self.transport)
            .field("launcher", &self.launcher)
            .field("kvs", &self.kvs.as_ref().map(|_| "..."))
            .finish()
    }
}

/// Variables whose presence means "started by some launcher".
const LAUNCH_VARS: &[&str] = &[
    "AM_RANK",
    "PMI_FD",
    "PMI_PORT",
    "PMI_RANK",
    "OMPI_COMM_WORLD_RANK",
];

/// Launcher variables worth naming when a rank cannot use what its launcher gave it.
const EVIDENCE_VARS: &[&str] = &[
    "AM_RANK",
    "PMI_FD",
    "PMI_PORT",
    "PMI_RANK",
    "OMPI_COMM_WORLD_RANK",
    "PMIX_NAMESPACE",
    "PMIX_RANK",
    "PMIX_SERVER_URI41",
    "PMIX_SERVER_URI4",
    "PMIX_SERVER_URI3",
    "PMIX_SERVER_URI21",
    "PMIX_SERVER_URI2",
    "SLURM_PROCID",
    "SLURM_STEP_ID",
    "SLURM_MPI_TYPE",
];

/// The launcher variables set in this process's environment (names only), for error
/// messages that say what was found: `"OMPI_COMM_WORLD_RANK, PMIX_NAMESPACE, PMIX_RANK"`, or
/// `"none"`.
pub fn launcher_variables_seen() -> String {
    let seen: Vec<&str> = EVIDENCE_VARS
        .iter()
        .copied()
        .filter(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
        .collect();
    if seen.is_empty() {
        "none".to_owned()
    } else {
        seen.join(", ")
    }
}

impl JobInfo {
    /// Bootstraps from the environment.
    ///
    /// Detection order: amrun (`AM_RANK`, `AM_SIZE`, `AM_JOB_ID`, `AM_PMI_FD`),
    /// MPICH hydra (`PMI_FD` or `PMI_PORT`; PMI-1 unless `AM_PMI_VERSION=2`),
    /// Open MPI (`OMPI_COMM_WORLD_RANK`/`_SIZE`), Slurm (`SLURM_PROCID`,
    /// `SLURM_NTASKS`, `SLURM_STEP_ID`; PMI-2 over `PMI_FD` when present),
    /// otherwise a singleton. `AM_JOB_ID`, when set, overrides the job id
    /// everywhere; `AM_TRANSPORT` fills [`JobInfo::transport`].
    ///
    /// Call it once per process: a PMI connection cannot be initialised twice.
    pub fn from_env() -> Result<JobInfo, BootstrapError> {
        detect(&ProcessEnv)
    }

    /// Whether some launcher's variables are present (so this process is one
    /// rank of a job and should not start a job itself).
    pub fn is_launched() -> bool {
        let set = |v: &str| std::env::var_os(v).is_some_and(|s| !s.is_empty());
        LAUNCH_VARS.iter().any(|v| set(v))
            || (set("SLURM_PROCID") && (set("SLURM_STEP_ID") || set("SLURM_STEPID")))
    }
}

fn check_rank(
    rank: u32,
    size: u32,
    rank_var: &'static str,
    size_var: &'static str,
) -> Result<(), BootstrapError> {
    if size == 0 {
        return Err(BootstrapError::InvalidVar {
            var: size_var,
            value: "0".into(),
            reason: "a job has at least one rank".into(),
        });
    }
    if rank >= size {
        return Err(BootstrapError::RankOutOfRange {
            rank,
            size,
            rank_var,
            size_var,
        });
    }
    Ok(())
}

fn random_id() -> Result<String, BootstrapError> {
    random_job_id().map_err(|source| BootstrapError::Io {
        what: "reading /dev/urandom for a job id".into(),
        source,
    })
}

/// The key under which rank 0 shares a generated job id.
const JOB_ID_KEY: &str = "am-job-id";

/// Rank 0 invents a job id and shares it through the store.
fn agree_on_random_id(rank: u32, kvs: &mut dyn KeyValueStore) -> Result<String, BootstrapError> {
    if rank == 0 {
        let id = random_id()?;
        kvs.put(JOB_ID_KEY, &id)?;
        kvs.fence()?;
        Ok(id)
    } else {
        kvs.fence()?;
        let id = kvs.get(JOB_ID_KEY)?;
        if !is_valid_job_id(&id) {
            return Err(BootstrapError::Protocol {
                detail: format!("rank 0 shared an invalid job id {id:?}"),
            });
        }
        Ok(id)
    }
}
fn adopt_fd(var: &'static str, fd: i32) -> Result<Conn, BootstrapError> {
    FdSocket::adopt(fd)
        .map(Conn::fd)
        .map_err(|source| BootstrapError::Io {
            what: format!("using {var}={fd} as the launcher's PMI connection"),
            source,
        })
}

/// A PMI session: what the server said, plus the store itself.
struct PmiSession {
    rank: Option<u32>,
    size: Option<u32>,
    /// The kvsname (PMI-1) or jobid (PMI-2).
    name: String,
    kvs: Box<dyn KeyValueStore + Send>,
}

/// Connects to a PMI server announced by `PMI_FD` or `PMI_PORT`.
fn pmi_connect(env: &dyn Env, default_version: u32) -> Result<PmiSession, BootstrapError> {
    let version = match env.var("AM_PMI_VERSION")? {
        None => default_version,
        Some(v) if v == "1" || v == "2" => {
            if v == "1" {
                1
            } else {
                2
            }
        }
        Some(v) => {
            return Err(BootstrapError::InvalidVar {
                var: "AM_PMI_VERSION",
                value: v,
                reason: "expected 1 or 2".into(),
            })
        }
    };
    env.claim_pmi()?;
    let pmi_id = env.var("PMI_ID")?;
    let (conn, port_mode) = if let Some(fd) = parse_fd(env, "PMI_FD")? {
        (adopt_fd("PMI_FD", fd)?, false)
    } else if let Some(addr) = env.var("PMI_PORT")? {
        let stream = TcpStream::connect(addr.as_str()).map_err(|source| BootstrapError::Io {
            what: format!("connecting to the PMI server at PMI_PORT={addr}"),
            source,
        })?;
        let _ = stream.set_nodelay(true);
        (Conn::tcp(stream), true)
    } else {
        return Err(BootstrapError::MissingVar {
            var: "PMI_FD",
            why: "PMI needs PMI_FD or PMI_PORT",
        });
    };
    if version == 1 {
        let mut c = Pmi1Client::new(conn);
        let (mut rank, mut size) = (None, None);
        if port_mode {
            if let Some(id) = &pmi_id {
                let (r, s) = c.initack(id)?;
                (rank, size) = (Some(r), Some(s));
            }
        }
        c.init()?;
        Ok(PmiSession {
            rank,
            size,
            name: c.kvsname().to_owned(),
            kvs: Box::new(c),
        })
    } else {
        let mut c = Pmi2Client::new(conn);
        let rank_var = env.var("PMI_RANK")?;
        // Hydra and Slurm both want `pmirank`; in hydra's PMI_PORT mode PMI_ID is the rank.
        let id = match rank_var.as_ref().or(pmi_id.as_ref()) {
            Some(r) => ("pmirank", r.as_str()),
            None => {
                return Err(BootstrapError::MissingVar {
                    var: "PMI_RANK",
                    why: "PMI-2 fullinit needs PMI_RANK or PMI_ID",
                })
            }
        };
        // Slurm's pmi2 plugin also wants the job (PMI_JOBID), as MPICH's client sends it.
        let jobid = env.var("PMI_JOBID")?;
        let (r, s) = c.init(id, jobid.as_deref())?;
        Ok(PmiSession {
            rank: Some(r),
            size: Some(s),
            name: c.jobid().to_owned(),
            kvs: Box::new(c),
        })
    }
}

/// Picks the environment's value, else the server's; both must agree.
fn merge(
    env_value: Option<u32>,
    server: Option<u32>,
    var: &'static str,
) -> Result<Option<u32>, BootstrapError> {
    match (env_value, server) {
        (Some(e), Some(s)) if e != s => Err(BootstrapError::Inconsistent {
            detail: format!("{var}={e} but the PMI server says {s}"),
        }),
        (e, s) => Ok(e.or(s)),
    }
}

pub(crate) fn detect(env: &dyn Env) -> Result<JobInfo, BootstrapError> {
    let transport = env.var("AM_TRANSPORT")?;
    let forced_id = match env.var("AM_JOB_ID")? {
        Some(id) if !is_valid_job_id(&id) => {
            return Err(BootstrapError::InvalidVar {
                var: "AM_JOB_ID",
                value: id,
                reason: "expected [A-Za-z0-9_-]+, at most 64 characters".into(),
            })
        }
        id => id,
    };
    let slurm_step =
        env.has("SLURM_PROCID")? && (env.has("SLURM_STEP_ID")? || env.has("SLURM_STEPID")?);
    let has_pmi = env.has("PMI_FD")? || env.has("PMI_PORT")?;
    // srun --mpi=pmi2 also sets PMI_FD/PMI_RANK, but hydra never sets PMI_JOBID.
    let slurm_pmi2 = slurm_step && env.has("PMI_JOBID")?;

    let mut info = if env.has("AM_RANK")? || env.has("AM_SIZE")? {
        from_amrun(env, forced_id)?
    } else if has_pmi && !slurm_pmi2 {
        from_hydra(env, forced_id)?
    } else if env.has("OMPI_COMM_WORLD_RANK")? {
        from_ompi(env, forced_id)?
    } else if slurm_step {
        from_slurm(env, forced_id, has_pmi)?
    } else {
        JobInfo {
            rank: 0,
            size: 1,
            job_id: match forced_id {
                Some(id) => id,
                None => random_id()?,
            },
            transport: None,
            launcher: LauncherKind::Singleton,
            kvs: None,
        }
    };
    info.transport = transport;
    Ok(info)
}

fn from_amrun(env: &dyn Env, forced_id: Option<String>) -> Result<JobInfo, BootstrapError> {
    let rank = required_num(
        env,
        "AM_RANK",
        "amrun sets AM_RANK, AM_SIZE and AM_JOB_ID together",
    )?;
    let size = required_num(
        env,
        "AM_SIZE",
        "amrun sets AM_RANK, AM_SIZE and AM_JOB_ID together",
    )?;
    check_rank(rank, size, "AM_RANK", "AM_SIZE")?;
    let job_id = forced_id.ok_or(BootstrapError::MissingVar {
        var: "AM_JOB_ID",
        why: "amrun sets it; when starting ranks by hand give every rank the same AM_JOB_ID",
    })?;
    let kvs: Option<Box<dyn KeyValueStore + Send>> = match parse_fd(env, "AM_PMI_FD")? {
        Some(fd) => {
            env.claim_pmi()?;
            let mut c = Pmi1Client::new(adopt_fd("AM_PMI_FD", fd)?);
            c.init()?;
            Some(Box::new(c))
        }
        None => None,
    };
    Ok(JobInfo {
        rank,
        size,
        job_id,
        transport: None,
        launcher: LauncherKind::Amrun,
        kvs,
    })
}

fn from_hydra(env: &dyn Env, forced_id: Option<String>) -> Result<JobInfo, BootstrapError> {
    let env_rank = num(env, "PMI_RANK")?;
    let env_size = num(env, "PMI_SIZE")?;
    let mut s = pmi_connect(env, 1)?;
    let rank = merge(env_rank, s.rank, "PMI_RANK")?.ok_or(BootstrapError::MissingVar {
        var: "PMI_RANK",
        why: "the PMI server did not say which rank this is",
    })?;
    let size = merge(env_size, s.size, "PMI_SIZE")?.ok_or(BootstrapError::MissingVar {
        var: "PMI_SIZE",
        why: "the PMI server did not say how many ranks there are",
    })?;
    check_rank(rank, size, "PMI_RANK", "PMI_SIZE")?;
    let job_id = match forced_id.or_else(|| sanitize_job_id(&s.name)) {
        Some(id) => id,
        None => agree_on_random_id(rank, s.kvs.as_mut())?,
    };
    Ok(JobInfo {
        rank,
        size,
        job_id,
        transport: None,
        launcher: LauncherKind::Mpiexec,
        kvs: Some(s.kvs),
    })
}

fn from_ompi(env: &dyn Env, forced_id: Option<String>) -> Result<JobInfo, BootstrapError> {
    let rank = required_num(
        env,
        "OMPI_COMM_WORLD_RANK",
        "Open MPI sets it with OMPI_COMM_WORLD_SIZE",
    )?;
    let size = required_num(
        env,
        "OMPI_COMM_WORLD_SIZE",
        "Open MPI sets it with OMPI_COMM_WORLD_RANK",
    )?;
    check_rank(rank, size, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")?;
    let from_ompi = || -> Result<Option<String>, BootstrapError> {
        for var in [
            "PMIX_NAMESPACE",
            "OMPI_MCA_ess_base_jobid",
            "OMPI_MCA_orte_ess_jobid",
        ] {
            if let Some(id) = env.var(var)?.and_then(|v| sanitize_job_id(&v)) {
                return Ok(Some(id));
            }
        }
        Ok(None)
    };
    let kvs = store_if_served(env, rank, size)?;
    let job_id = match forced_id {
        Some(id) => id,
        None => match from_ompi()? {
            Some(id) => id,
            None if size == 1 => random_id()?,
            None => {
                return Err(BootstrapError::NoJobId {
                    launcher: LauncherKind::OpenMpi,
                })
            }
        },
    };
    Ok(JobInfo {
        rank,
        size,
        job_id,
        transport: None,
        launcher: LauncherKind::OpenMpi,
        kvs,
    })
}

fn from_slurm(
    env: &dyn Env,
    forced_id: Option<String>,
    has_pmi: bool,
) -> Result<JobInfo, BootstrapError> {
    let rank = required_num(env, "SLURM_PROCID", "srun sets it")?;
    let size = match num(env, "SLURM_NTASKS")? {
        Some(n) => n,
        None => required_num(
            env,
            "SLURM_STEP_NUM_TASKS",
            "srun sets SLURM_NTASKS or SLURM_STEP_NUM_TASKS",
        )?,
    };
    check_rank(rank, size, "SLURM_PROCID", "SLURM_NTASKS")?;
    let kvs = if has_pmi {
        let s = pmi_connect(env, 2)?;
        merge(Some(rank), s.rank, "SLURM_PROCID")?;
        merge(Some(size), s.size, "SLURM_NTASKS")?;
        Some(s.kvs)
    } else {
        // srun --mpi=pmix
        store_if_served(env, rank, size)?
    };
    let job = match env.var("SLURM_JOB_ID")? {
        Some(j) => Some(j),
        None => env.var("SLURM_JOBID")?,
    };
    let step = match env.var("SLURM_STEP_ID")? {
        Some(s) => Some(s),
        None => env.var("SLURM_STEPID")?,
    };
    let job_id = match (forced_id, job, step) {
        (Some(id), _, _) => id,
        (None, Some(j), Some(s)) => {
            sanitize_job_id(&format!("{j}_{s}")).ok_or(BootstrapError::NoJobId {
                launcher: LauncherKind::Slurm,
            })?
        }
        _ => {
            return Err(BootstrapError::NoJobId {
                launcher: LauncherKind::Slurm,
            })
        }
    };
    Ok(JobInfo {
        rank,
        size,
        job_id,
        transport: None,
        launcher: LauncherKind::Slurm,
        kvs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::ffi::OsString;

    struct MapEnv(HashMap<&'static str, String>);

    impl Env for MapEnv {
        fn raw(&self, name: &str) -> Option<OsString> {
            self.0.get(name).map(OsString::from)
        }
        fn claim_pmi(&self) -> Result<(), BootstrapError> {
            Ok(())
        }
    }

    fn env(vars: &[(&'static str, &str)]) -> MapEnv {
        MapEnv(vars.iter().map(|(k, v)| (*k, v.to_string())).collect())
    }

    #[test]
    fn singleton_by_default() {
        let info = detect(&env(&[])).unwrap();
        assert_eq!(
            (info.rank, info.size, info.launcher),
            (0, 1, LauncherKind::Singleton)
        );
        assert!(is_valid_job_id(&info.job_id));
        assert!(info.kvs.is_none() && info.transport.is_none());
        let info = detect(&env(&[("AM_JOB_ID", "mine"), ("AM_TRANSPORT", "udp")])).unwrap();
        assert_eq!(info.job_id, "mine");
        assert_eq!(info.transport.as_deref(), Some("udp"));
    }

    #[test]
    fn amrun_without_kvs() {
        let info = detect(&env(&[
            ("AM_RANK", "2"),
            ("AM_SIZE", "3"),
            ("AM_JOB_ID", "j1"),
        ]))
        .unwrap();
        assert_eq!(
            (info.rank, info.size, info.launcher),
            (2, 3, LauncherKind::Amrun)
        );
        assert_eq!(info.job_id, "j1");
        assert!(info.kvs.is_none());
    }

    #[test]
    fn amrun_errors_name_the_variable() {
        let e = detect(&env(&[("AM_RANK", "0"), ("AM_JOB_ID", "j")])).unwrap_err();
        assert!(
            matches!(e, BootstrapError::MissingVar { var: "AM_SIZE", .. }),
            "{e}"
        );
        assert!(e.to_string().contains("AM_SIZE"));
        let e = detect(&env(&[("AM_RANK", "0"), ("AM_SIZE", "1")])).unwrap_err();
        assert!(
            matches!(
                e,
                BootstrapError::MissingVar {
                    var: "AM_JOB_ID",
                    ..
                }
            ),
            "{e}"
        );
        let e = detect(&env(&[
            ("AM_RANK", "x"),
            ("AM_SIZE", "1"),
            ("AM_JOB_ID", "j"),
        ]))
        .unwrap_err();
        assert!(
            matches!(e, BootstrapError::InvalidVar { var: "AM_RANK", .. }),
            "{e}"
        );
        let e = detect(&env(&[
            ("AM_RANK", "-1"),
            ("AM_SIZE", "1"),
            ("AM_JOB_ID", "j"),
        ]))
        .unwrap_err();
        assert!(
            matches!(e, BootstrapError::InvalidVar { var: "AM_RANK", .. }),
            "{e}"
        );
        let e = detect(&env(&[
            ("AM_RANK", "3"),
            ("AM_SIZE", "3"),
            ("AM_JOB_ID", "j"),
        ]))
        .unwrap_err();
        assert!(
            matches!(
                e,
                BootstrapError::RankOutOfRange {
                    rank: 3,
                    size: 3,
                    ..
                }
            ),
            "{e}"
        );
        let e = detect(&env(&[
            ("AM_RANK", "0"),
            ("AM_SIZE", "0"),
            ("AM_JOB_ID", "j"),
        ]))
        .unwrap_err();
        assert!(
            matches!(e, BootstrapError::InvalidVar { var: "AM_SIZE", .. }),
            "{e}"
        );
        let e = detect(&env(&[
            ("AM_RANK", "0"),
            ("AM_SIZE", "1"),
            ("AM_JOB_ID", "a/b"),
        ]))
        .unwrap_err();
        assert!(
            matches!(
                e,
                BootstrapError::InvalidVar {
                    var: "AM_JOB_ID",
                    ..
                }
            ),
            "{e}"
        );
        let e = detect(&env(&[
            ("AM_RANK", "0"),
            ("AM_SIZE", "1"),
            ("AM_JOB_ID", "j"),
            ("AM_PMI_FD", "zz"),
        ]))
        .unwrap_err();
        assert!(
            matches!(
                e,
                BootstrapError::InvalidVar {
                    var: "AM_PMI_FD",
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn open_mpi_and_slurm() {
        let info = detect(&env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("PMIX_NAMESPACE", "prterun-host-123@1"),
        ]))
        .unwrap();
        assert_eq!(
            (info.rank, info.size, info.launcher),
            (1, 4, LauncherKind::OpenMpi)
        );
        assert_eq!(info.job_id, "prterun-host-123_1");
        let e = detect(&env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
        ]))
        .unwrap_err();
        assert!(matches!(
            e,
            BootstrapError::NoJobId {
                launcher: LauncherKind::OpenMpi
            }
        ));
        assert!(e.to_string().contains("AM_JOB_ID"));

        let info = detect(&env(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_JOB_ID", "1234"),
            ("SLURM_STEP_ID", "0"),
        ]))
        .unwrap();
        assert_eq!(
            (info.rank, info.size, info.launcher),
            (3, 8, LauncherKind::Slurm)
        );
        assert_eq!(info.job_id, "1234_0");
        assert!(info.kvs.is_none());
        // A batch script (no step) is not a launched rank.
        let info = detect(&env(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_JOB_ID", "1"),
        ]))
        .unwrap();
        assert_eq!(info.launcher, LauncherKind::Singleton);
    }

    #[test]
    fn pmi_errors() {
        let e = detect(&env(&[
            ("PMI_FD", "-3"),
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "1"),
        ]))
        .unwrap_err();
        assert!(
            matches!(e, BootstrapError::InvalidVar { var: "PMI_FD", .. }),
            "{e}"
        );
        // A descriptor that is not open: the system's error is the source.
        let e = detect(&env(&[
            ("PMI_FD", "999999"),
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "1"),
        ]))
        .unwrap_err();
        assert!(matches!(e, BootstrapError::Io { .. }), "{e}");
        let source = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            source.and_then(std::io::Error::raw_os_error),
            Some(nix::libc::EBADF),
            "{e}"
        );
        let e = detect(&env(&[("PMI_FD", "5"), ("AM_PMI_VERSION", "3")])).unwrap_err();
        assert!(
            matches!(
                e,
                BootstrapError::InvalidVar {
                    var: "AM_PMI_VERSION",
                    ..
                }
            ),
            "{e}"
        );
        let e = detect(&env(&[("PMI_PORT", "127.0.0.1:notaport")])).unwrap_err();
        assert!(matches!(e, BootstrapError::Io { .. }), "{e}");
    }

    #[test]
    fn hydra_over_a_socket_pair() {
        use std::io::{BufRead, BufReader, Write};
        use std::os::fd::IntoRawFd;
        use std::os::unix::net::UnixStream;
        let (ours, theirs) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mut r = BufReader::new(theirs.try_clone().unwrap());
            let mut w = theirs;
            let replies = [
                "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0",
                "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024",
                "cmd=my_kvsname kvsname=kvs_9_0_1.vm",
                "cmd=finalize_ack",
            ];
            for reply in replies {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                writeln!(w, "{reply}").unwrap();
            }
        });
        let fd = ours.into_raw_fd().to_string();
        let info = detect(&env(&[
            ("PMI_FD", &fd),
            ("PMI_RANK", "1"),
            ("PMI_SIZE", "2"),
        ]))
        .unwrap();
        assert_eq!(
            (info.rank, info.size, info.launcher),
            (1, 2, LauncherKind::Mpiexec)
        );
        assert_eq!(info.job_id, "kvs_9_0_1_vm");
        assert!(info.kvs.is_some());
        drop(info);
        server.join().unwrap();
    }
}
