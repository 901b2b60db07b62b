//! Job ids and job keys: fresh random ones, and checks of those a launcher gives.

use std::fs::File;
use std::io::{self, Read};

/// Longest job id we produce or accept; keeps `/dev/shm` names short.
pub(crate) const JOB_ID_MAX: usize = 64;

/// Reads `N` bytes from `/dev/urandom`.
fn random_bytes<const N: usize>() -> io::Result<[u8; N]> {
    let mut buf = [0u8; N];
    File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf)
}

/// A fresh job id: 16 lowercase hex characters from `/dev/urandom`.
pub fn random_job_id() -> io::Result<String> {
    Ok(hex(&random_bytes::<8>()?))
}

/// A fresh 256-bit key as 64 lowercase hex digits from `/dev/urandom`: the UDP transport's
/// job key (`AM_UDP_KEY`), which a launcher hands to the ranks of a udp job.
pub fn random_job_key() -> io::Result<String> {
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
}
