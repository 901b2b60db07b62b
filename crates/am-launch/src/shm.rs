//! Removing what a job's ranks left in shared memory.

use std::io;
use std::path::Path;

use am_bootstrap::is_valid_job_id;

/// Where POSIX shared memory lives on Linux.
const SHM_DIR: &str = "/dev/shm";

/// Removes every `/dev/shm/am-<job_id>-*` file and returns how many were removed.
///
/// Shared-memory transports name their segments that way, so a launcher can
/// clean up after ranks that died before unlinking them. An invalid job id
/// removes nothing.
pub fn remove_job_shm(job_id: &str) -> io::Result<usize> {
    remove_job_files(Path::new(SHM_DIR), job_id)
}

pub(crate) fn remove_job_files(dir: &Path, job_id: &str) -> io::Result<usize> {
    if !is_valid_job_id(job_id) {
        return Ok(0);
    }
    let prefix = format!("am-{job_id}-");
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name();
        let matches = name.to_str().is_some_and(|n| n.starts_with(&prefix));
        if matches {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => removed += 1,
                // A rank may unlink its own file while we look.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use am_bootstrap::random_job_id;

    #[test]
    fn removes_only_this_jobs_files() {
        let dir = std::env::temp_dir().join(format!("am-launch-test-{}", random_job_id().unwrap()));
        std::fs::create_dir(&dir).unwrap();
        for name in ["am-j1-a", "am-j1-b", "am-j2-a", "am-j1", "other"] {
            std::fs::write(dir.join(name), b"x").unwrap();
        }
        assert_eq!(remove_job_files(&dir, "j1").unwrap(), 2);
        let mut left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["am-j1", "am-j2-a", "other"]);
        assert_eq!(remove_job_files(&dir, "../x").unwrap(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
