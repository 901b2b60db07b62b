//! Start-up of a simulated NIC under a launcher, and why it can fail.

use am_bootstrap::{BootstrapError, JobInfo};
use am_shm::{Segment, ShmError};
use nix::unistd::Pid;

/// Why a simulated NIC could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// A shared-memory failure (creating, opening or mapping a segment).
    #[error("shared memory: {0}")]
    Shm(#[from] ShmError),
    /// The launcher's key-value store failed or is missing, or a rank published nonsense.
    #[error("bootstrap: {0}")]
    Bootstrap(String),
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

impl From<BootstrapError> for SetupError {
    fn from(e: BootstrapError) -> Self {
        SetupError::Bootstrap(e.to_string())
    }
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
    let own = Segment::create_anonymous(&format!("am-{nic}-{rank}"), words, bytes)?;
    init(&own)?;
    let mut pids = vec![None; job.size as usize];
    if job.size == 1 {
        let peers = vec![own.share()];
        return Ok(Joined { own, peers, pids });
    }
    let launcher = job.launcher;
    let kvs = job.kvs.as_mut().ok_or_else(|| {
        SetupError::Bootstrap(format!(
            "the launcher ({launcher}; launcher variables seen: {}) gives the ranks no \
             key-value store this transport can use to find its peers: start the job under \
             amrun, MPICH's mpiexec, srun --mpi=pmi2, or a PMIx launcher (Open MPI's mpirun, \
             srun --mpi=pmix), which must set PMIX_SERVER_URI* and PMIX_NAMESPACE",
            am_bootstrap::launcher_variables_seen()
        ))
    })?;
    let handle = own
        .handle()
        .ok_or_else(|| SetupError::Bootstrap("an anonymous segment without a handle".into()))?;
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
        let (Some(pid), Some(handle), Some(segment), Some(theirs)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(SetupError::Bootstrap(format!("rank {r} published {v:?}")));
        };
        let segment: u64 = segment
            .parse()
            .map_err(|_| SetupError::Bootstrap(format!("rank {r} published {v:?}")))?;
        published.push(Some((
            pid.to_owned(),
            handle.to_owned(),
            segment,
            theirs.to_owned(),
        )));
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
        let pid: i32 = pid
            .parse()
            .map_err(|_| SetupError::Bootstrap(format!("rank {r} sent pid {pid:?}")))?;
        pids[r as usize] = Some(Pid::from_raw(pid));
        peers.push(Segment::open_handle(&theirs_handle, words, bytes)?);
    }
    // Nobody leaves start-up (and perhaps ends) before every rank has mapped every segment.
    kvs.fence()?;
    Ok(Joined { own, peers, pids })
}
