//! Start-up of a simulated NIC under a launcher, and why it can fail.

use am_launch::{BootstrapError, JobInfo};
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
/// segment's handle and `geometry` through the launcher's key-value store, checks that every
/// rank announced the same geometry, and maps every rank's segment. Collective: every rank of
/// the job calls it. No file is created, so a rank killed at any point leaves nothing behind.
pub fn connect(
    job: &mut JobInfo,
    nic: &str,
    words: usize,
    bytes: usize,
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
    let kvs = job.kvs.as_mut().ok_or_else(|| {
        SetupError::Bootstrap(format!(
            "{nic}: no key-value store: start the job under amrun, mpiexec or srun --mpi=pmi2"
        ))
    })?;
    let handle = own
        .handle()
        .ok_or_else(|| SetupError::Bootstrap("an anonymous segment without a handle".into()))?;
    let key = |r: u32| format!("{nic}-{r}");
    // Key-value stores take no spaces in values (PMI): `|` separates the fields.
    kvs.put(
        &key(rank),
        &format!("{}|{handle}|{geometry}", std::process::id()),
    )?;
    kvs.fence()?;
    let mut peers = Vec::with_capacity(job.size as usize);
    for r in 0..job.size {
        if r == rank {
            peers.push(own.share());
            continue;
        }
        let v = kvs.get(&key(r))?;
        let mut parts = v.splitn(3, '|');
        let (pid, theirs_handle, theirs) = (parts.next(), parts.next(), parts.next());
        let (Some(pid), Some(theirs_handle), Some(theirs)) = (pid, theirs_handle, theirs) else {
            return Err(SetupError::Bootstrap(format!("rank {r} published {v:?}")));
        };
        if theirs != geometry {
            return Err(SetupError::Mismatch {
                rank: r,
                theirs: theirs.to_owned(),
                ours: geometry.to_owned(),
            });
        }
        let pid: i32 = pid
            .parse()
            .map_err(|_| SetupError::Bootstrap(format!("rank {r} sent pid {pid:?}")))?;
        pids[r as usize] = Some(Pid::from_raw(pid));
        peers.push(Segment::open_handle(theirs_handle, words, bytes)?);
    }
    // Nobody leaves start-up (and perhaps ends) before every rank has mapped every segment.
    kvs.fence()?;
    Ok(Joined { own, peers, pids })
}
