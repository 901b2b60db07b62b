//! Job ids, random bytes and shared-memory cleanup.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

/// Longest job id we produce or accept; keeps `/dev/shm` names short.
pub(crate) const JOB_ID_MAX: usize = 64;

/// Where POSIX shared memory lives on Linux.
const SHM_DIR: &str = "/dev/shm";

/// Reads `N` bytes from `/dev/urandom`.
pub(crate) fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf)
}

/// A fresh job id: 16 lowercase hex characters.
pub(crate) fn random_job_id() -> io::Result<String> {
    Ok(hex(&random_bytes::<8>()?))
}

/// A fresh 256-bit key as 64 lowercase hex digits (the UDP transport's `AM_UDP_KEY`).
pub(crate) fn random_job_key() -> io::Result<String> {
    Ok(hex(&random_bytes::<32>()?))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Whether `id` is a usable job id: `[A-Za-z0-9_-]+`, at most 64 bytes.
pub fn is_valid_job_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= JOB_ID_MAX
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Turns a launcher-provided name (PMI kvsname, Slurm ids) into a valid job id.
///
/// Every rank gets the same input, so every rank gets the same output.
/// Returns `None` for an empty input.
pub(crate) fn sanitize_job_id(raw: &str) -> Option<String> {
    if raw.is_empty() {
        return None;
    }
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= JOB_ID_MAX {
        return Some(clean);
    }
    // Too long for file names: keep a readable head and a hash of the whole name.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in raw.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    Some(format!("{}-{h:016x}", &clean[..JOB_ID_MAX - 17]))
}

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

/// Whether process `pid` still runs: `kill(pid, 0)` finds it and it is not a zombie. How the
/// shared-memory transports tell a dead peer from a slow one.
pub fn process_alive(pid: nix::unistd::Pid) -> bool {
    if nix::sys::signal::kill(pid, None) == Err(nix::errno::Errno::ESRCH) {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_valid_and_differ() {
        let a = random_job_id().unwrap();
        let b = random_job_id().unwrap();
        assert_eq!(a.len(), 16);
        assert!(is_valid_job_id(&a));
        assert_ne!(a, b);
    }

    #[test]
    fn job_id_validation() {
        assert!(is_valid_job_id("abc_DEF-123"));
        assert!(!is_valid_job_id(""));
        assert!(!is_valid_job_id("a/b"));
        assert!(!is_valid_job_id("a b"));
        assert!(!is_valid_job_id("../x"));
        assert!(!is_valid_job_id(&"x".repeat(JOB_ID_MAX + 1)));
    }

    #[test]
    fn sanitize_keeps_short_names_and_hashes_long_ones() {
        assert_eq!(
            sanitize_job_id("kvs_3856_0_2032324110_vm").as_deref(),
            Some("kvs_3856_0_2032324110_vm")
        );
        assert_eq!(sanitize_job_id("12.3/x").as_deref(), Some("12_3_x"));
        assert_eq!(sanitize_job_id(""), None);
        let long = "k".repeat(300);
        let a = sanitize_job_id(&long).unwrap();
        assert!(is_valid_job_id(&a), "{a}");
        let other = format!("{}z", "k".repeat(299));
        assert_ne!(a, sanitize_job_id(&other).unwrap());
    }

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
