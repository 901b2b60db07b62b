//! Start-up of a simulated NIC under a launcher, and why it can fail.

use am_bootstrap::{BootstrapError, JobInfo, LauncherKind};
use am_bootstrap::{ConnectError, ConnectErrorKind};
use am_shm::{Segment, ShmError};
use nix::unistd::Pid;

/// Why a simulated NIC could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// A shared-memory failure (creating, opening or mapping a segment).
    #[error("shared memory: {0}")]
    Shm(#[from] ShmError),
    /// The launcher's key-value store failed (the store's error is the source).
    #[error("bootstrap: {0}")]
    Bootstrap(#[from] BootstrapError),
    /// A job of several ranks whose launcher gives them no key-value store to find each
    /// other through.
    #[error(
        "the launcher ({launcher}; launcher variables seen: {seen}) gives the ranks no \
         key-value store this transport can use to find its peers: start the job under \
         amrun, MPICH's mpiexec, srun --mpi=pmi2, or a PMIx launcher (Open MPI's mpirun, \
         srun --mpi=pmix), which must set PMIX_SERVER_URI* and PMIX_NAMESPACE"
    )]
    NoKeyValueStore {
        /// The launcher that started the job.
        launcher: LauncherKind,
        /// The launcher variables set ([`am_bootstrap::launcher_variables_seen`]).
        seen: String,
    },
    /// A rank published, through the key-value store, something that is not
    /// `pid|handle|segment size|geometry` with a number for the pid and the size.
    #[error("rank {rank} published {value:?}, not pid|handle|segment size|geometry")]
    BadAnnouncement {
        /// The rank.
        rank: u32,
        /// What it published.
        value: String,
    },
    /// This build's segments have no handle another process can open them by (a loom
    /// build has no shared-memory files), so a job of several processes cannot start.
    #[error("segment {0} has no handle another process could open it by")]
    Unshareable(String),
    /// An invalid setting.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A rank's AM segment differs in size from rank 0's (every rank finds the same one:
    /// the first that differs).
    #[error(
        "rank {rank} has a {theirs}-byte segment, rank 0 has {ours}: segment sizes must agree"
    )]
    SegmentSizeMismatch {
        /// The first rank whose segment differs.
        rank: u32,
        /// Rank 0's segment size.
        ours: u64,
        /// That rank's segment size.
        theirs: u64,
    },
    /// A rank announced a different geometry.
    #[error("rank {rank} uses a different geometry: {theirs} (ours: {ours})")]
    Mismatch {
        /// The rank.
        rank: u32,
        /// Its geometry.
        theirs: String,
        /// Ours.
        ours: String,
    },
}

/// A rank's memory and its view of every rank's after [`connect`].
#[derive(Debug)]
pub struct Joined {
    /// This rank's segment.
    pub own: Segment,
    /// Every rank's segment with full access, by rank (this rank's too).
    pub peers: Vec<Segment>,
    /// Every rank's pid (`None` for this rank).
    pub pids: Vec<Option<Pid>>,
}

/// Starts rank `job.rank` of a NIC called `nic`: creates its anonymous segment of `words` and
/// `bytes` (see [`Segment::create_anonymous`]), lets `init` set it up, publishes its pid, the
/// segment's handle, the size of its AM segment (`am_segment`) and `geometry` through the
/// launcher's key-value store, checks that every rank announced rank 0's AM segment size
/// ([`SetupError::SegmentSizeMismatch`]) and this rank's geometry, and maps every rank's
/// segment. Collective: every rank of
/// the job calls it. No file is created, so a rank killed at any point leaves nothing behind.
pub fn connect(
    job: &mut JobInfo,
    nic: &str,
    words: usize,
    bytes: usize,
    am_segment: usize,
    geometry: &str,
    init: impl FnOnce(&Segment) -> Result<(), SetupError>,
) -> Result<Joined, SetupError> {
    let rank = job.rank;
    let name = format!("am-{nic}-{rank}");
    let own = Segment::create_anonymous(&name, words, bytes)?;
    init(&own)?;
    let mut pids = vec![None; job.size as usize];
    if job.size == 1 {
        let peers = vec![own.share()];
        return Ok(Joined { own, peers, pids });
    }
    let launcher = job.launcher;
    let kvs = job
        .kvs
        .as_mut()
        .ok_or_else(|| SetupError::NoKeyValueStore {
            launcher,
            seen: am_bootstrap::launcher_variables_seen(),
        })?;
    let handle = own.handle().ok_or(SetupError::Unshareable(name))?;
    let key = |r: u32| format!("{nic}-{r}");
    // Key-value stores take no spaces in values (PMI): `|` separates the fields.
    kvs.put(
        &key(rank),
        &format!("{}|{handle}|{am_segment}|{geometry}", std::process::id()),
    )?;
    kvs.fence()?;
    let mut published = Vec::with_capacity(job.size as usize);
    for r in 0..job.size {
        if r == rank {
            published.push(None);
            continue;
        }
        let v = kvs.get(&key(r))?;
        let mut parts = v.splitn(4, '|');
        let parsed = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(pid), Some(handle), Some(segment), Some(theirs)) => {
                match (pid.parse::<i32>(), segment.parse::<u64>()) {
                    (Ok(pid), Ok(segment)) => {
                        Some((pid, handle.to_owned(), segment, theirs.to_owned()))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        let Some(parsed) = parsed else {
            return Err(SetupError::BadAnnouncement { rank: r, value: v });
        };
        published.push(Some(parsed));
    }
    // Segment sizes against rank 0's, in rank order: every rank reports the same rank.
    let size_of = |r: usize| match &published[r] {
        Some((_, _, segment, _)) => *segment,
        None => am_segment as u64,
    };
    let first = size_of(0);
    if let Some(r) = (1..published.len()).find(|&r| size_of(r) != first) {
        return Err(SetupError::SegmentSizeMismatch {
            rank: r as u32,
            ours: first,
            theirs: size_of(r),
        });
    }
    let mut peers = Vec::with_capacity(job.size as usize);
    for (r, p) in published.into_iter().enumerate() {
        let r = r as u32;
        let Some((pid, theirs_handle, _, theirs)) = p else {
            peers.push(own.share());
            continue;
        };
        if theirs != geometry {
            return Err(SetupError::Mismatch {
                rank: r,
                theirs,
                ours: geometry.to_owned(),
            });
        }
        pids[r as usize] = Some(Pid::from_raw(pid));
        peers.push(Segment::open_handle(&theirs_handle, words, bytes)?);
    }
    // Nobody leaves start-up (and perhaps ends) before every rank has mapped every segment.
    kvs.fence()?;
    Ok(Joined { own, peers, pids })
}

impl SetupError {
    /// What kind of start-up failure this is ([`am_bootstrap::ConnectErrorKind`]).
    pub fn kind(&self) -> ConnectErrorKind {
        match self {
            SetupError::Shm(_) => ConnectErrorKind::Resource,
            SetupError::Bootstrap(_) | SetupError::NoKeyValueStore { .. } => {
                ConnectErrorKind::Bootstrap
            }
            SetupError::BadAnnouncement { .. } | SetupError::Mismatch { .. } => {
                ConnectErrorKind::Mismatch
            }
            SetupError::Unshareable(_) => ConnectErrorKind::Unavailable,
            SetupError::Config(_) => ConnectErrorKind::Config,
            &SetupError::SegmentSizeMismatch { rank, ours, theirs } => {
                ConnectErrorKind::SegmentSizeMismatch { rank, ours, theirs }
            }
        }
    }

    /// The start-up error of `transport` that this is, keeping it as the source.
    pub fn into_connect_error(self, transport: &'static str) -> ConnectError {
        ConnectError::new(transport, self.kind(), self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use am_bootstrap::KeyValueStore;
    use std::error::Error;

    /// A key-value store whose `put` fails as a closed store does, and whose `get` returns
    /// `published`.
    struct Store {
        put_fails: bool,
        published: &'static str,
    }

    impl KeyValueStore for Store {
        fn put(&mut self, _key: &str, _value: &str) -> Result<(), BootstrapError> {
            if self.put_fails {
                return Err(BootstrapError::Closed);
            }
            Ok(())
        }
        fn fence(&mut self) -> Result<(), BootstrapError> {
            Ok(())
        }
        fn get(&mut self, _key: &str) -> Result<String, BootstrapError> {
            Ok(self.published.to_owned())
        }
        fn abort(&mut self, _code: i32, _message: &str) -> Result<(), BootstrapError> {
            Ok(())
        }
    }

    fn job(kvs: Option<Store>) -> JobInfo {
        JobInfo {
            rank: 0,
            size: 2,
            job_id: "setup-test".into(),
            transport: None,
            launcher: LauncherKind::Amrun,
            kvs: kvs.map(|s| Box::new(s) as Box<dyn KeyValueStore + Send>),
        }
    }

    fn connect_to(kvs: Option<Store>) -> SetupError {
        connect(&mut job(kvs), "test", 16, 4096, 0, "g", |_| Ok(())).unwrap_err()
    }

    /// A failing key-value store's error is the set-up error's source, as its own type.
    #[test]
    #[cfg_attr(miri, ignore = "an anonymous segment is a memfd")]
    fn a_store_failure_is_the_source() {
        let e = connect_to(Some(Store {
            put_fails: true,
            published: "",
        }));
        assert!(
            matches!(e, SetupError::Bootstrap(BootstrapError::Closed)),
            "{e}"
        );
        let source = e.source().expect("the store's error is the source");
        assert!(
            matches!(
                source.downcast_ref::<BootstrapError>(),
                Some(BootstrapError::Closed)
            ),
            "{source}"
        );
        assert_eq!(e.to_string(), format!("bootstrap: {source}"));
    }

    /// Without a store, and with a peer's announcement that does not parse, the error says
    /// which, in fields rather than a message.
    #[test]
    #[cfg_attr(miri, ignore = "an anonymous segment is a memfd")]
    fn no_store_and_a_bad_announcement_are_their_own_errors() {
        let e = connect_to(None);
        assert!(
            matches!(
                e,
                SetupError::NoKeyValueStore {
                    launcher: LauncherKind::Amrun,
                    ..
                }
            ),
            "{e}"
        );
        for published in ["1|h|4096", "x|h|4096|g", "1|h|big|g"] {
            let e = connect_to(Some(Store {
                put_fails: false,
                published,
            }));
            match e {
                SetupError::BadAnnouncement { rank: 1, value } => assert_eq!(value, published),
                e => panic!("{published}: {e}"),
            }
        }
    }
}
