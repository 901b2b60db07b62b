//! Several endpoints per process: each endpoint is a rank of its own in a larger job.
//!
//! A process of a job of `processes` ranks that opens `per_process` endpoints takes part, as
//! far as a transport can tell, in a job of `processes × per_process` ranks: endpoint `e` of
//! process `p` is rank `p × per_process + e`. [`split`] turns the process's [`JobInfo`] into
//! one [`JobInfo`] per endpoint. Their key-value stores are one store shared by the process's
//! endpoints: puts and gets pass through, and a [`fence`](KeyValueStore::fence) is one fence
//! of the launcher's store once every endpoint of the process has called it. So the
//! endpoints must start together, each on its own thread (a transport's start-up fences).
//!
//! A job of one process has no launcher's store (nor needs one with a single endpoint); with
//! several endpoints, [`split`] gives them a store of their own in this process.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use crate::error::BootstrapError;
use crate::job::JobInfo;
use crate::store::KeyValueStore;

/// Where each endpoint of a job is: endpoint `e` of process `p` is rank
/// `p × per_process + e` of the job the transports see.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EndpointLayout {
    processes: u32,
    per_process: u32,
}

impl EndpointLayout {
    /// The layout of `processes` processes of `per_process` endpoints each, or `None` when
    /// either is zero or there would be more than `u32::MAX` ranks.
    pub fn new(processes: u32, per_process: u32) -> Option<EndpointLayout> {
        if processes == 0 || per_process == 0 {
            return None;
        }
        processes.checked_mul(per_process)?;
        Some(EndpointLayout {
            processes,
            per_process,
        })
    }

    /// Processes in the job.
    pub fn processes(&self) -> u32 {
        self.processes
    }

    /// Endpoints each process opens.
    pub fn per_process(&self) -> u32 {
        self.per_process
    }

    /// Ranks the transports see: `processes × per_process`.
    pub fn ranks(&self) -> u32 {
        self.processes * self.per_process
    }

    /// The rank of endpoint `endpoint` of process `process`.
    ///
    /// # Panics
    /// If either is out of range.
    pub fn rank(&self, process: u32, endpoint: u32) -> u32 {
        assert!(
            process < self.processes && endpoint < self.per_process,
            "endpoint {endpoint} of process {process} is outside {self:?}"
        );
        process * self.per_process + endpoint
    }

    /// The process a rank's endpoint belongs to.
    pub fn process_of(&self, rank: u32) -> u32 {
        rank / self.per_process
    }

    /// The endpoint index of a rank within its process.
    pub fn endpoint_of(&self, rank: u32) -> u32 {
        rank % self.per_process
    }
}

/// One [`JobInfo`] per endpoint of this process: endpoint `e`'s rank is
/// `info.rank × per_process + e` in a job of `info.size × per_process` ranks, with the same
/// job id, transport and launcher, and a share of `info`'s key-value store (or, in a job of
/// one process without one, a store of this process's own).
///
/// Puts and gets on a share pass through to the launcher's store; a
/// [`fence`](KeyValueStore::fence) is one fence of the launcher's store, made once every
/// endpoint of the process has called it, so the endpoints must start together, each on its
/// own thread (a transport's start-up fences). An endpoint that drops its share fails the
/// others' fences instead of leaving them waiting.
///
/// Fails with [`BootstrapError::Inconsistent`] when `per_process` is zero or the job would
/// have more than `u32::MAX` ranks.
pub fn split(info: JobInfo, per_process: u32) -> Result<Vec<JobInfo>, BootstrapError> {
    let layout = EndpointLayout::new(info.size, per_process).ok_or_else(|| {
        BootstrapError::Inconsistent {
            detail: format!(
                "{per_process} endpoints in each of {} processes is not a job",
                info.size
            ),
        }
    })?;
    if per_process == 1 {
        return Ok(vec![info]);
    }
    let JobInfo {
        rank,
        size,
        job_id,
        transport,
        launcher,
        kvs,
    } = info;
    // Processes that find each other some other way (udp's coordinator) leave their
    // endpoints to do the same, as ranks of their own; otherwise the endpoints share the
    // launcher's store, or one of this process's own.
    let shared = (kvs.is_some() || size == 1).then(|| {
        Arc::new(Shared {
            state: Mutex::new(State {
                store: kvs,
                local: HashMap::new(),
                members: per_process,
                arrived: 0,
                generation: 0,
                failed: None,
                left: false,
            }),
            changed: Condvar::new(),
        })
    });
    Ok((0..per_process)
        .map(|e| JobInfo {
            rank: layout.rank(rank, e),
            size: layout.ranks(),
            job_id: job_id.clone(),
            transport: transport.clone(),
            launcher,
            kvs: shared.as_ref().map(|shared| {
                Box::new(EndpointStore {
                    shared: shared.clone(),
                    endpoint: e,
                }) as Box<dyn KeyValueStore + Send>
            }),
        })
        .collect())
}

/// The store the endpoints of one process share.
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    /// The launcher's store; `None` in a job of one process, where `local` is the store.
    store: Option<Box<dyn KeyValueStore + Send>>,
    local: HashMap<String, String>,
    /// Endpoints of the process still holding their store.
    members: u32,
    /// Endpoints waiting in the current fence.
    arrived: u32,
    /// Fences completed.
    generation: u64,
    /// Why the last fence failed, for the endpoints that waited on it.
    failed: Option<String>,
    /// An endpoint dropped its store: no fence completes any more.
    left: bool,
}

/// One endpoint's share of its process's store.
struct EndpointStore {
    shared: Arc<Shared>,
    endpoint: u32,
}

impl EndpointStore {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn departed(&self) -> BootstrapError {
        BootstrapError::Inconsistent {
            detail: format!(
                "another endpoint of this process left before endpoint {} fenced",
                self.endpoint
            ),
        }
    }
}

impl KeyValueStore for EndpointStore {
    fn put(&mut self, key: &str, value: &str) -> Result<(), BootstrapError> {
        let mut state = self.lock();
        match state.store.as_mut() {
            Some(store) => store.put(key, value),
            None => {
                state.local.insert(key.to_owned(), value.to_owned());
                Ok(())
            }
        }
    }

    fn fence(&mut self) -> Result<(), BootstrapError> {
        let mut state = self.lock();
        if state.left {
            return Err(self.departed());
        }
        state.arrived += 1;
        if state.arrived == state.members {
            // The last endpoint to arrive fences for the process.
            let result = match state.store.as_mut() {
                Some(store) => store.fence(),
                None => Ok(()),
            };
            state.failed = result.as_ref().err().map(ToString::to_string);
            state.arrived = 0;
            state.generation += 1;
            self.shared.changed.notify_all();
            return result;
        }
        let generation = state.generation;
        while state.generation == generation && !state.left {
            state = self
                .shared
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if state.generation == generation {
            return Err(self.departed());
        }
        match &state.failed {
            Some(why) => Err(BootstrapError::Inconsistent {
                detail: format!("the launcher's fence failed for this process: {why}"),
            }),
            None => Ok(()),
        }
    }

    fn get(&mut self, key: &str) -> Result<String, BootstrapError> {
        let mut state = self.lock();
        match state.store.as_mut() {
            Some(store) => store.get(key),
            None => state
                .local
                .get(key)
                .cloned()
                .ok_or_else(|| BootstrapError::KeyNotFound {
                    key: key.to_owned(),
                }),
        }
    }

    fn abort(&mut self, code: i32, message: &str) -> Result<(), BootstrapError> {
        let mut state = self.lock();
        match state.store.as_mut() {
            Some(store) => store.abort(code, message),
            None => {
                eprintln!("{message}");
                Ok(())
            }
        }
    }
}

impl Drop for EndpointStore {
    fn drop(&mut self) {
        let mut state = self.lock();
        state.members -= 1;
        // A fence of the process needs every endpoint: the others' fences now fail instead of
        // waiting forever (or fencing for the process without this endpoint's puts).
        state.left = true;
        if state.members == 0 {
            // The last share finalizes the launcher's store, as dropping a `JobInfo` does.
            if let Some(mut store) = state.store.take() {
                if !std::thread::panicking() {
                    let _ = store.finalize();
                }
            }
        }
        self.shared.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::LauncherKind;

    fn single(per_process: u32) -> Vec<JobInfo> {
        let info = JobInfo {
            rank: 0,
            size: 1,
            job_id: "t".into(),
            transport: None,
            launcher: LauncherKind::Singleton,
            kvs: None,
        };
        split(info, per_process).unwrap()
    }

    #[test]
    fn layout_numbers_endpoints_within_processes() {
        let l = EndpointLayout::new(3, 4).unwrap();
        assert_eq!(l.ranks(), 12);
        assert_eq!(l.rank(2, 1), 9);
        assert_eq!((l.process_of(9), l.endpoint_of(9)), (2, 1));
        assert!(EndpointLayout::new(0, 4).is_none());
        assert!(EndpointLayout::new(3, 0).is_none());
        assert!(EndpointLayout::new(1 << 16, 1 << 16).is_none());
        assert!(EndpointLayout::new(1 << 16, (1 << 16) - 1).is_some());
    }

    #[test]
    fn one_endpoint_keeps_the_job_as_it_is() {
        let infos = single(1);
        assert_eq!(infos.len(), 1);
        assert!(infos[0].kvs.is_none());
    }

    #[test]
    fn endpoints_see_each_others_puts_after_a_fence() {
        let infos = single(3);
        let ranks: Vec<u32> = infos.iter().map(|i| i.rank).collect();
        assert_eq!(ranks, [0, 1, 2]);
        assert!(infos.iter().all(|i| i.size == 3));
        std::thread::scope(|s| {
            for mut info in infos {
                s.spawn(move || {
                    let kvs = info.kvs.as_mut().unwrap();
                    kvs.put(&format!("k{}", info.rank), &format!("v{}", info.rank))
                        .unwrap();
                    kvs.fence().unwrap();
                    for r in 0..3 {
                        assert_eq!(kvs.get(&format!("k{r}")).unwrap(), format!("v{r}"));
                    }
                    // A second fence completes too.
                    kvs.fence().unwrap();
                });
            }
        });
    }

    #[test]
    fn a_fence_fails_when_another_endpoint_left() {
        let mut infos = single(2);
        let gone = infos.pop().unwrap();
        let mut info = infos.pop().unwrap();
        std::thread::scope(|s| {
            let waiter = s.spawn(move || info.kvs.as_mut().unwrap().fence());
            // Whether the first is waiting in the fence yet or not, the error is the same.
            drop(gone);
            let err = waiter.join().unwrap().unwrap_err();
            assert!(err.to_string().contains("left before"), "{err}");
        });
    }

    /// A launcher's store whose fence fails (a launcher that went away mid-fence).
    struct FailingFence;

    impl KeyValueStore for FailingFence {
        fn put(&mut self, _key: &str, _value: &str) -> Result<(), BootstrapError> {
            Ok(())
        }
        fn fence(&mut self) -> Result<(), BootstrapError> {
            Err(BootstrapError::Closed)
        }
        fn get(&mut self, key: &str) -> Result<String, BootstrapError> {
            Err(BootstrapError::KeyNotFound {
                key: key.to_owned(),
            })
        }
        fn abort(&mut self, _code: i32, _message: &str) -> Result<(), BootstrapError> {
            Ok(())
        }
    }

    /// Every endpoint of the process sees the launcher's failed fence, not only the last to
    /// arrive (which made it). Catches the failure no longer recorded in the shared state:
    /// the endpoints already waiting in the fence then got `Ok` and went on to read a store
    /// that never committed.
    #[test]
    fn a_failed_launcher_fence_fails_every_endpoint() {
        let info = JobInfo {
            rank: 0,
            size: 1,
            job_id: "t".into(),
            transport: None,
            launcher: LauncherKind::Amrun,
            kvs: Some(Box::new(FailingFence)),
        };
        let infos = split(info, 3).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        for mut info in infos {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let fenced = info.kvs.as_mut().unwrap().fence();
                // Sent before the share is dropped, which would fail a waiting fence anyway.
                let _ = tx.send((info.rank, fenced.map_err(|e| e.to_string())));
                drop(info);
            });
        }
        drop(tx);
        let limit = std::time::Duration::from_secs(20);
        let mut results: Vec<_> = (0..3)
            .map(|_| {
                rx.recv_timeout(limit)
                    .expect("an endpoint still waits in the fence")
            })
            .collect();
        results.sort();
        for (rank, fenced) in results {
            let err = fenced.expect_err(&format!("endpoint {rank} fenced"));
            assert!(
                !err.contains("left before"),
                "endpoint {rank} saw a departure, not the fence's failure: {err}"
            );
        }
    }

    /// Processes without a launcher's store (udp's coordinator finds them): their endpoints
    /// get none either, rather than a store only this process sees.
    #[test]
    fn several_processes_without_a_store_give_their_endpoints_none() {
        let info = JobInfo {
            rank: 1,
            size: 2,
            job_id: "t".into(),
            transport: None,
            launcher: LauncherKind::Singleton,
            kvs: None,
        };
        let infos = split(info, 2).unwrap();
        let ranks: Vec<u32> = infos.iter().map(|i| i.rank).collect();
        assert_eq!(ranks, [2, 3]);
        assert!(infos.iter().all(|i| i.size == 4 && i.kvs.is_none()));
    }

    #[test]
    fn a_missing_key_is_typed() {
        let mut infos = single(2);
        let err = infos[0].kvs.as_mut().unwrap().get("nothing").unwrap_err();
        assert!(matches!(err, BootstrapError::KeyNotFound { .. }), "{err}");
    }
}
