//! The launcher's key-value store over PMIx (Open MPI's `mpirun`, PRRTE, `srun --mpi=pmix`),
//! through [`am_pmix`].

use crate::env::Env;
use crate::error::BootstrapError;
use crate::store::KeyValueStore;
use crate::watch::Watch;

/// Variables a PMIx server sets for its clients, one of which must be present.
const SERVER_URIS: &[&str] = &[
    "PMIX_SERVER_URI41",
    "PMIX_SERVER_URI4",
    "PMIX_SERVER_URI3",
    "PMIX_SERVER_URI21",
    "PMIX_SERVER_URI2",
];

/// A PMIx key-value store when the environment says a PMIx server serves this process
/// (`PMIX_NAMESPACE`, `PMIX_RANK` and a server URI), else `None`. Its rank and the job
/// size must agree with what the launcher's other variables said.
pub(crate) fn store_if_served(
    env: &dyn Env,
    rank: u32,
    size: u32,
) -> Result<Option<Box<dyn KeyValueStore + Send>>, BootstrapError> {
    let mut served = env.has("PMIX_NAMESPACE")? && env.has("PMIX_RANK")?;
    if served {
        served = false;
        for v in SERVER_URIS {
            served |= env.has(v)?;
        }
    }
    if !served {
        return Ok(None);
    }
    env.claim_pmi()?;
    let mut pmix = am_pmix::Pmix::init()?;
    let pmix_size = pmix.job_size()?;
    if (pmix.rank(), pmix_size) != (rank, size) {
        return Err(BootstrapError::Inconsistent {
            detail: format!(
                "the launcher's variables say rank {rank} of {size}, its PMIx server says rank {} of {pmix_size}",
                pmix.rank()
            ),
        });
    }
    Ok(Some(Box::new(PmixStore {
        pmix,
        size,
        closed: false,
        watch: Watch::parent(),
    })))
}

/// [`KeyValueStore`] over a PMIx client.
///
/// A PMIx `get` names the rank that put the key. The keys of this workspace say it: a key
/// ending in `-<rank>` was put by that rank (`am-udp-addr-3`, `sci-3`), any other key by
/// rank 0 (the UDP job key, an agreed job id); a key of another shape is looked for at every
/// rank in turn.
struct PmixStore {
    pmix: am_pmix::Pmix,
    size: u32,
    closed: bool,
    /// The rank ends if its launcher goes first ([`Watch::parent`]).
    watch: Option<Watch>,
}

/// The rank that put `key`, by the convention above.
fn owner(key: &str, size: u32) -> u32 {
    key.rsplit_once('-')
        .and_then(|(_, r)| r.parse::<u32>().ok())
        .filter(|&r| r < size)
        .unwrap_or(0)
}

impl PmixStore {
    /// The launcher may end from now on.
    fn finish_watch(&self) {
        if let Some(w) = &self.watch {
            w.finish();
        }
    }

    fn open(&self) -> Result<(), BootstrapError> {
        if self.closed {
            Err(BootstrapError::Closed)
        } else {
            Ok(())
        }
    }
}

impl KeyValueStore for PmixStore {
    fn put(&mut self, key: &str, value: &str) -> Result<(), BootstrapError> {
        self.open()?;
        Ok(self.pmix.put(key, value)?)
    }

    fn fence(&mut self) -> Result<(), BootstrapError> {
        self.open()?;
        self.pmix.commit()?;
        Ok(self.pmix.fence()?)
    }

    fn get(&mut self, key: &str) -> Result<String, BootstrapError> {
        self.open()?;
        // The conventional owner first, then every other rank (a key of another shape).
        let first = owner(key, self.size);
        for r in std::iter::once(first).chain((0..self.size).filter(|&r| r != first)) {
            if let Some(v) = self.pmix.get(r, key)? {
                return Ok(v);
            }
        }
        Err(BootstrapError::KeyNotFound { key: key.into() })
    }

    fn abort(&mut self, code: i32, message: &str) -> Result<(), BootstrapError> {
        self.open()?;
        eprintln!("{message}");
        self.closed = true;
        self.finish_watch();
        Ok(self.pmix.abort(code, message)?)
    }

    fn finalize(&mut self) -> Result<(), BootstrapError> {
        self.closed = true;
        self.finish_watch();
        Ok(self.pmix.finalize()?)
    }
}

#[cfg(test)]
mod tests {
    use super::owner;

    #[test]
    fn keys_name_their_owner() {
        assert_eq!(owner("am-udp-addr-3", 4), 3);
        assert_eq!(owner("sci-0", 4), 0);
        assert_eq!(owner("portals-12", 16), 12);
        // Not a rank of the job, or no rank at all: rank 0's.
        assert_eq!(owner("sci-9", 4), 0);
        assert_eq!(owner("am-udp-key", 4), 0);
        assert_eq!(owner("am-job-id", 4), 0);
    }
}
