//! The datagram format and its authentication.
//!
//! Every datagram is a fixed 84-byte header, a payload (data datagrams only) and a 16-byte MAC.
//! All integers are little-endian.
//!
//! ```text
//! 0       version (0xA1)
//! 1       kind: 1 data, 2 ack, 3 ping (an ack that asks for an ack), 4 fence ("you were
//!         declared lost here": the answer to a datagram from a peer declared lost)
//! 2       flags (data only): bit 0 first fragment, bit 1 last fragment, bit 2 goodbye
//! 3       zero
//! 4..12   job tag: names the job (not secret; the MAC is what authenticates)
//! 12..16  source rank          16..20  destination rank
//! 20..28  source epoch         28..36  destination epoch (random per process start)
//! 36..44  packet number: unique per transmission from source to destination, never reused
//! 44..52  cumulative ack: every sequence number below it was received
//! 52..60  selective ack: bit i set = sequence number ack+1+i was received
//! 60..68  sequence number (data only)
//! 68..72  message length (first fragment only)
//! 72..80  newest data packet number: the highest packet number of a data datagram received
//!         from the destination (0: none yet)
//! 80..84  ack delay: microseconds between that datagram's arrival and this datagram (RFC
//!         9002's ack delay, saturating)
//! 84..    payload, then the MAC: blake3 keyed hash of everything before it, truncated to 16 bytes
//! ```

use std::fmt;
use std::io;

/// First byte of every datagram.
pub const VERSION: u8 = 0xA1;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 84;
/// Bytes of the MAC trailer.
pub const MAC_LEN: usize = 16;
/// Header plus MAC: what a datagram carries besides its payload.
pub const OVERHEAD: usize = HEADER_LEN + MAC_LEN;

/// Data flag: the first fragment of a message.
pub const FLAG_FIRST: u8 = 0b001;
/// Data flag: the last fragment of a message.
pub const FLAG_LAST: u8 = 0b010;
/// Data flag: the sender is leaving the job (an empty, in-order goodbye).
pub const FLAG_BYE: u8 = 0b100;

/// What a datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A fragment of a message, with a sequence number; acknowledged and retransmitted.
    Data = 1,
    /// Acknowledgements only.
    Ack = 2,
    /// Acknowledgements, and a request to be acknowledged (keepalive).
    Ping = 3,
    /// The sender declared the receiver lost and refuses its datagrams: the receiver must
    /// give the sender up at once too (fencing), rather than after a whole peer timeout.
    Fence = 4,
}

/// A decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Data, ack or ping.
    pub kind: Kind,
    /// Fragment flags (data only).
    pub flags: u8,
    /// The job's tag.
    pub job_tag: u64,
    /// Sending rank.
    pub src: u32,
    /// Receiving rank.
    pub dst: u32,
    /// Sender's epoch.
    pub src_epoch: u64,
    /// Receiver's epoch as the sender knows it.
    pub dst_epoch: u64,
    /// Packet number.
    pub pn: u64,
    /// Cumulative ack.
    pub ack: u64,
    /// Selective ack bits.
    pub sack: u64,
    /// Sequence number (data only).
    pub seq: u64,
    /// Message length (first fragment only).
    pub msg_len: u32,
    /// The highest packet number of a data datagram the sender received from the receiver: a
    /// round-trip sample is taken only from that transmission (as QUIC's largest acknowledged).
    pub newest_pn: u64,
    /// Microseconds the sender held the datagram numbered `newest_pn` before this datagram
    /// carried the acknowledgement (subtracted from the round-trip sample).
    pub ack_delay_us: u32,
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl Header {
    /// Writes the header into the first [`HEADER_LEN`] bytes of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than [`HEADER_LEN`].
    pub fn write(&self, out: &mut [u8]) {
        let b = &mut out[..HEADER_LEN];
        b[0] = VERSION;
        b[1] = self.kind as u8;
        b[2] = self.flags;
        b[3] = 0;
        b[4..12].copy_from_slice(&self.job_tag.to_le_bytes());
        b[12..16].copy_from_slice(&self.src.to_le_bytes());
        b[16..20].copy_from_slice(&self.dst.to_le_bytes());
        b[20..28].copy_from_slice(&self.src_epoch.to_le_bytes());
        b[28..36].copy_from_slice(&self.dst_epoch.to_le_bytes());
        b[36..44].copy_from_slice(&self.pn.to_le_bytes());
        b[44..52].copy_from_slice(&self.ack.to_le_bytes());
        b[52..60].copy_from_slice(&self.sack.to_le_bytes());
        b[60..68].copy_from_slice(&self.seq.to_le_bytes());
        b[68..72].copy_from_slice(&self.msg_len.to_le_bytes());
        b[72..80].copy_from_slice(&self.newest_pn.to_le_bytes());
        b[80..84].copy_from_slice(&self.ack_delay_us.to_le_bytes());
    }

    /// Decodes a header from untrusted bytes; `None` if they are not a well-formed header.
    /// Does not authenticate: check the MAC first.
    pub fn read(b: &[u8]) -> Option<Header> {
        if b.len() < HEADER_LEN || b[0] != VERSION || b[3] != 0 {
            return None;
        }
        let kind = match b[1] {
            1 => Kind::Data,
            2 => Kind::Ack,
            3 => Kind::Ping,
            4 => Kind::Fence,
            _ => return None,
        };
        let flags = b[2];
        if flags & !(FLAG_FIRST | FLAG_LAST | FLAG_BYE) != 0 || (kind != Kind::Data && flags != 0) {
            return None;
        }
        Some(Header {
            kind,
            flags,
            job_tag: u64_at(b, 4),
            src: u32_at(b, 12),
            dst: u32_at(b, 16),
            src_epoch: u64_at(b, 20),
            dst_epoch: u64_at(b, 28),
            pn: u64_at(b, 36),
            ack: u64_at(b, 44),
            sack: u64_at(b, 52),
            seq: u64_at(b, 60),
            msg_len: u32_at(b, 68),
            newest_pn: u64_at(b, 72),
            ack_delay_us: u32_at(b, 80),
        })
    }
}

/// The job's secret: 32 random bytes shared by every rank of one job and nobody else.
///
/// Its `Debug` output does not show the bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct JobKey([u8; 32]);

/// Why a key could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The text is not 64 hexadecimal digits.
    #[error("a job key is 64 hexadecimal digits (32 bytes)")]
    BadFormat,
    /// The key file was refused or could not be read (the checks are `amrun`'s own).
    #[error(transparent)]
    File(#[from] am_launch::KeyFileError),
}

impl JobKey {
    /// A key from its bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> JobKey {
        JobKey(bytes)
    }

    /// A fresh random key from the operating system (`/dev/urandom`).
    pub fn generate() -> io::Result<JobKey> {
        let mut k = [0u8; 32];
        random_bytes(&mut k)?;
        Ok(JobKey(k))
    }

    /// Parses 64 hexadecimal digits (surrounding whitespace ignored).
    pub fn from_hex(s: &str) -> Result<JobKey, KeyError> {
        let s = s.trim().as_bytes();
        if s.len() != 64 {
            return Err(KeyError::BadFormat);
        }
        let mut k = [0u8; 32];
        for (i, pair) in s.chunks(2).enumerate() {
            let hi = hex_val(pair[0]).ok_or(KeyError::BadFormat)?;
            let lo = hex_val(pair[1]).ok_or(KeyError::BadFormat)?;
            k[i] = hi << 4 | lo;
        }
        Ok(JobKey(k))
    }

    /// Reads a key file: 64 hexadecimal digits in a regular file owned by this user, of mode
    /// 0600 or stricter.
    ///
    /// The file is opened once, without following a symbolic link as its last component
    /// (`O_NOFOLLOW`), and the checks are made on the open file (`fstat`), so the file read
    /// is the file checked: no swapping it between the check and the read.
    pub fn from_file(path: &str) -> Result<JobKey, KeyError> {
        // A key is 64 digits and maybe a newline; a larger file is not a key. The checks are
        // the launcher's own, so `amrun` refuses what a rank would.
        let text = am_launch::read_key_file(path, 256)?;
        JobKey::from_hex(&text)
    }

    /// The key as 64 lowercase hexadecimal digits.
    pub fn to_hex(&self) -> String {
        hex(&self.0)
    }
}

impl fmt::Debug for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobKey(..)")
    }
}

fn hex_val(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Fills `buf` from `/dev/urandom`.
pub(crate) fn random_bytes(buf: &mut [u8]) -> io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

/// A random non-zero 64-bit number (epochs).
pub(crate) fn random_u64() -> io::Result<u64> {
    let mut b = [0u8; 8];
    loop {
        random_bytes(&mut b)?;
        let v = u64::from_le_bytes(b);
        if v != 0 {
            return Ok(v);
        }
    }
}

/// Seals and verifies datagrams of one job.
#[derive(Clone)]
pub struct Authenticator {
    mac_key: [u8; 32],
    job_tag: u64,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authenticator")
            .field("job_tag", &format_args!("{:#018x}", self.job_tag))
            .finish_non_exhaustive()
    }
}

impl Authenticator {
    /// The MAC key is derived from the job key *and* the job id, so the same key reused by
    /// another job (a mistake) still gives unrelated MACs.
    pub fn new(key: &JobKey, job_id: &str) -> Authenticator {
        let mut material = Vec::with_capacity(32 + job_id.len());
        material.extend_from_slice(&key.0);
        material.extend_from_slice(job_id.as_bytes());
        let mac_key = blake3::derive_key("amnet transport-udp v1 datagram MAC", &material);
        let tag = blake3::derive_key("amnet transport-udp v1 job tag", job_id.as_bytes());
        let mut t = [0u8; 8];
        t.copy_from_slice(&tag[..8]);
        Authenticator {
            mac_key,
            job_tag: u64::from_le_bytes(t),
        }
    }

    /// The job tag every datagram of this job carries.
    pub fn job_tag(&self) -> u64 {
        self.job_tag
    }

    /// Writes the MAC of `dgram[..len - MAC_LEN]` into its last [`MAC_LEN`] bytes.
    ///
    /// # Panics
    /// If `dgram` is shorter than [`MAC_LEN`].
    pub fn seal(&self, dgram: &mut [u8]) {
        let body = dgram.len() - MAC_LEN;
        let mac = blake3::keyed_hash(&self.mac_key, &dgram[..body]);
        dgram[body..].copy_from_slice(&mac.as_bytes()[..MAC_LEN]);
    }

    /// Whether the last [`MAC_LEN`] bytes are the MAC of the rest (constant time).
    pub fn verify(&self, dgram: &[u8]) -> bool {
        if dgram.len() < MAC_LEN {
            return false;
        }
        let body = dgram.len() - MAC_LEN;
        let mac = blake3::keyed_hash(&self.mac_key, &dgram[..body]);
        let diff = mac.as_bytes()[..MAC_LEN]
            .iter()
            .zip(&dgram[body..])
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        diff == 0
    }

    /// A MAC of arbitrary control-plane bytes (rendezvous messages), as 32 hex digits.
    /// Whether `mac` is [`Authenticator::tag_text`] of `text`, compared in constant time (no
    /// early exit at the first differing byte, so timing tells a forger nothing).
    pub(crate) fn verify_text(&self, text: &str, mac: &str) -> bool {
        let expected = self.tag_text(text);
        let (a, b) = (expected.as_bytes(), mac.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
    }

    pub(crate) fn tag_text(&self, text: &str) -> String {
        let mut h = blake3::Hasher::new_keyed(&self.mac_key);
        h.update(b"rendezvous:");
        h.update(text.as_bytes());
        hex(&h.finalize().as_bytes()[..MAC_LEN])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = Header> {
        (
            prop_oneof![
                Just(Kind::Data),
                Just(Kind::Ack),
                Just(Kind::Ping),
                Just(Kind::Fence)
            ],
            0u8..8,
            any::<(u64, u32, u32, u64, u64)>(),
            any::<(u64, u64, u64, u64, u32)>(),
            any::<(u64, u32)>(),
        )
            .prop_map(
                |(
                    kind,
                    flags,
                    (job_tag, src, dst, src_epoch, dst_epoch),
                    (pn, ack, sack, seq, msg_len),
                    (newest_pn, ack_delay_us),
                )| Header {
                    kind,
                    flags: if kind == Kind::Data { flags } else { 0 },
                    job_tag,
                    src,
                    dst,
                    src_epoch,
                    dst_epoch,
                    pn,
                    ack,
                    sack,
                    seq,
                    msg_len,
                    newest_pn,
                    ack_delay_us,
                },
            )
    }

    proptest! {
        #[test]
        fn header_round_trips(h in header()) {
            let mut b = [0u8; HEADER_LEN];
            h.write(&mut b);
            prop_assert_eq!(Header::read(&b), Some(h));
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Header::read(&b);
            let auth = Authenticator::new(&JobKey::from_bytes([7; 32]), "job");
            prop_assert!(!auth.verify(&b) || b.len() >= MAC_LEN);
        }

        #[test]
        fn any_bit_flip_breaks_the_mac(payload in proptest::collection::vec(any::<u8>(), 0..100), bit in 0usize..1000) {
            let auth = Authenticator::new(&JobKey::from_bytes([3; 32]), "job-a");
            let mut d = vec![0u8; HEADER_LEN];
            d.extend_from_slice(&payload);
            d.extend_from_slice(&[0; MAC_LEN]);
            auth.seal(&mut d);
            prop_assert!(auth.verify(&d));
            let bit = bit % (d.len() * 8);
            d[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(!auth.verify(&d));
        }
    }

    #[test]
    fn other_job_or_key_does_not_verify() {
        let key = JobKey::from_bytes([1; 32]);
        let a = Authenticator::new(&key, "job-a");
        let b = Authenticator::new(&key, "job-b");
        let c = Authenticator::new(&JobKey::from_bytes([2; 32]), "job-a");
        let mut d = vec![5u8; 100];
        a.seal(&mut d);
        assert!(a.verify(&d));
        assert!(!b.verify(&d));
        assert!(!c.verify(&d));
        assert_ne!(a.job_tag(), b.job_tag());
        assert_eq!(a.job_tag(), c.job_tag());
    }

    #[test]
    fn keys_parse_and_hide() {
        let k = JobKey::generate().unwrap();
        assert_eq!(JobKey::from_hex(&k.to_hex()).unwrap(), k);
        assert!(JobKey::from_hex("12").is_err());
        assert!(JobKey::from_hex(&"g".repeat(64)).is_err());
        assert_eq!(format!("{k:?}"), "JobKey(..)");
    }

    #[test]
    fn key_files_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("am-udp-key-test-{}", std::process::id()));
        let k = JobKey::generate().unwrap();
        std::fs::write(&dir, k.to_hex()).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o644)).unwrap();
        let path = dir.to_str().unwrap();
        assert!(matches!(
            JobKey::from_file(path),
            Err(KeyError::File(am_launch::KeyFileError::Permissions { .. }))
        ));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(JobKey::from_file(path).unwrap(), k);
        // A symbolic link to it, even to a good file, is not followed.
        let link = std::env::temp_dir().join(format!("am-udp-key-link-{}", std::process::id()));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        let linked = JobKey::from_file(link.to_str().unwrap());
        std::fs::remove_file(&link).unwrap();
        match linked {
            Err(KeyError::File(am_launch::KeyFileError::Io { source, .. })) => {
                assert_eq!(source.raw_os_error(), Some(nix::libc::ELOOP))
            }
            other => panic!("a symbolic link was followed: {other:?}"),
        }
        // A directory is no key file.
        assert!(matches!(
            JobKey::from_file(std::env::temp_dir().to_str().unwrap()),
            Err(KeyError::File(
                am_launch::KeyFileError::NotAFile { .. }
                    | am_launch::KeyFileError::Permissions { .. }
                    | am_launch::KeyFileError::Owner { .. }
            ))
        ));
        std::fs::remove_file(&dir).unwrap();
    }
}
