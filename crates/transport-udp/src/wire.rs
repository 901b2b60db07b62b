//! The datagram format and its authentication.
//!
//! Every datagram is a fixed 84-byte header, a payload (data datagrams only) and a 16-byte MAC.
//! The payload is encrypted; the header is authenticated but readable.
//! All integers are little-endian.
//!
//! ```text
//! 0       version (0xA4)
//! 1       kind: 1 data, 2 ack, 3 ping (an ack that asks for an ack), 4 fence ("you were
//!         declared lost here": the answer to a datagram from a peer declared lost)
//! 2       flags (data only): bit 0 first fragment, bit 1 last fragment, bit 2 goodbye,
//!         bit 3 packed (alone: the payload is frames, see below)
//! 3       zero
//! 4..12   job tag: names the job (not secret; the MAC is what authenticates)
//! 12..16  source rank          16..20  destination rank
//! 20..28  source epoch         28..36  destination epoch (random per process start)
//! 36..44  packet number: unique per transmission from source to destination, never reused;
//!         also the MAC's nonce
//! 44..52  cumulative ack: every sequence number below it was received
//! 52..60  selective ack: bit i set = sequence number ack+1+i was received
//! 60..68  sequence number (data only)
//! 68..72  message length (first fragment only; zero in a packed datagram)
//! 72..80  newest data packet number: the highest packet number of a data datagram received
//!         from the destination (0: none yet)
//! 80..84  ack delay: microseconds between that datagram's arrival and this datagram (RFC
//!         9002's ack delay, saturating)
//! 84..    payload, encrypted with AES-128-GCM, then its tag (16 bytes), with the header
//!         as associated data, under the key of the direction source -> destination and
//!         with the packet number as nonce (see [`DatagramKey`])
//! ```
//!
//! A data datagram carries either one fragment of a message (a whole small message is one
//! fragment, first and last) or, with the packed flag, several whole messages to the same
//! peer as *frames*, as QUIC frames share a packet. The datagram still has one sequence
//! number: it is acknowledged, retransmitted and delivered in order as one piece. Each frame
//! is:
//!
//! ```text
//! 0       frame type: 1 message (no other type exists)
//! 1..3    length of the message in bytes, little-endian
//! 3..     the message
//! ```
//!
//! Frames fill the payload exactly: a frame of an unknown type, of length 0, longer than a
//! message may be, or whose length runs past the end of the payload, is a misbehaviour of its
//! (authenticated) sender, and nothing after it in that datagram is delivered. A frame never
//! continues into another datagram.
//!
//! Versions 0xA1 (a BLAKE3 keyed hash as MAC), 0xA2 (AES-128-GCM's tag of the whole datagram
//! as associated data, GMAC: authenticated, not encrypted) and 0xA3 (no packed datagrams) had
//! the same header; they are refused as malformed.

use std::fmt;
use std::io;

use ring::aead;

/// First byte of every datagram.
pub const VERSION: u8 = 0xA4;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 84;
/// Bytes of the MAC trailer.
pub const MAC_LEN: usize = 16;
/// Where the packet number (the MAC's nonce) lies in the header.
const PN_AT: usize = 36;
/// Header plus MAC: what a datagram carries besides its payload.
pub const OVERHEAD: usize = HEADER_LEN + MAC_LEN;

/// Data flag: the first fragment of a message.
pub const FLAG_FIRST: u8 = 0b001;
/// Data flag: the last fragment of a message.
pub const FLAG_LAST: u8 = 0b010;
/// Data flag: the sender is leaving the job (an empty, in-order goodbye).
pub const FLAG_BYE: u8 = 0b100;
/// Data flag: the payload is whole messages as frames ([`frames`]); never with another flag.
pub const FLAG_PACKED: u8 = 0b1000;

/// Frame type of a whole message in a packed datagram.
pub const FRAME_MESSAGE: u8 = 1;
/// Bytes of a frame's type and length.
pub const FRAME_HEADER_LEN: usize = 3;
/// The largest message a frame can carry (its length is 16 bits).
pub const FRAME_MAX: usize = u16::MAX as usize;

/// Appends a message frame holding `head` then `payload` to `out`.
///
/// # Panics
/// If the message is longer than [`FRAME_MAX`].
pub fn push_frame(out: &mut Vec<u8>, head: &[u8], payload: &[u8]) {
    let len = u16::try_from(head.len() + payload.len()).expect("a frame holds at most 64 KiB");
    out.push(FRAME_MESSAGE);
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(head);
    out.extend_from_slice(payload);
}

/// Why the frames of a packed datagram could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// A frame of a type this version does not know.
    #[error("a frame of unknown type {ty} at byte {at} of a packed datagram")]
    UnknownType {
        /// The type byte.
        ty: u8,
        /// Where the frame starts in the payload.
        at: usize,
    },
    /// A frame's header or message runs past the end of the payload.
    #[error(
        "a frame of {len} bytes at byte {at} runs past the end of a {payload}-byte packed datagram"
    )]
    PastEnd {
        /// Where the frame starts in the payload.
        at: usize,
        /// The length it claims (0 where even its header is cut short).
        len: usize,
        /// The payload's length.
        payload: usize,
    },
    /// A packed datagram with no frame at all.
    #[error("a packed datagram with no frame")]
    Empty,
    /// A frame holding no message (a correct sender never packs one).
    #[error("an empty frame at byte {at} of a packed datagram")]
    EmptyFrame {
        /// Where the frame starts in the payload.
        at: usize,
    },
    /// A message longer than this rank accepts ([`crate::proto::EngineConfig::max_message`]).
    #[error("a frame of {len} bytes at byte {at} of a packed datagram, more than the {max} a message may have")]
    TooLong {
        /// Where the frame starts in the payload.
        at: usize,
        /// Its message's length.
        len: usize,
        /// The most a message may have.
        max: usize,
    },
}

/// The messages of a packed datagram's `payload`, in order, as ranges of it. Yields an error
/// (and nothing after it) at the first frame that is not well formed.
pub fn frames(payload: &[u8]) -> Frames<'_> {
    Frames {
        payload,
        at: 0,
        failed: false,
    }
}

/// The iterator of [`frames`].
#[derive(Debug, Clone)]
pub struct Frames<'a> {
    payload: &'a [u8],
    at: usize,
    failed: bool,
}

impl Iterator for Frames<'_> {
    type Item = Result<std::ops::Range<usize>, FrameError>;

    fn next(&mut self) -> Option<Self::Item> {
        let (p, at) = (self.payload, self.at);
        if self.failed || (at == p.len() && at > 0) {
            return None;
        }
        self.failed = true;
        if p.is_empty() {
            return Some(Err(FrameError::Empty));
        }
        if p.len() - at < FRAME_HEADER_LEN {
            return Some(Err(FrameError::PastEnd {
                at,
                len: 0,
                payload: p.len(),
            }));
        }
        if p[at] != FRAME_MESSAGE {
            return Some(Err(FrameError::UnknownType { ty: p[at], at }));
        }
        let len = usize::from(u16::from_le_bytes([p[at + 1], p[at + 2]]));
        if len == 0 {
            return Some(Err(FrameError::EmptyFrame { at }));
        }
        let start = at + FRAME_HEADER_LEN;
        if len > p.len() - start {
            return Some(Err(FrameError::PastEnd {
                at,
                len,
                payload: p.len(),
            }));
        }
        self.failed = false;
        self.at = start + len;
        Some(Ok(start..start + len))
    }
}

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
        b[PN_AT..PN_AT + 8].copy_from_slice(&self.pn.to_le_bytes());
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
        if flags & !(FLAG_FIRST | FLAG_LAST | FLAG_BYE | FLAG_PACKED) != 0
            || (kind != Kind::Data && flags != 0)
            || (flags & FLAG_PACKED != 0 && flags != FLAG_PACKED)
        {
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
            pn: u64_at(b, PN_AT),
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
    File(#[from] am_bootstrap::KeyFileError),
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
        let text = am_bootstrap::read_key_file(path, 256)?;
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

/// The job's MAC key: the root of every direction's datagram key
/// ([`Authenticator::datagram_key`]) and the MAC of the rendezvous messages.
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

    /// The key of the datagrams that rank `src`, started with epoch `src_epoch`, sends to rank
    /// `dst`, started with epoch `dst_epoch`.
    ///
    /// It is the first 16 bytes of BLAKE3's `derive_key` (context `"amnet transport-udp v3
    /// datagram key"`) over the job's MAC key, `src`, `dst` (4 bytes each), `src_epoch` and
    /// `dst_epoch` (8 bytes each), all little-endian. See [`DatagramKey`] for why every
    /// (key, nonce) pair is used once.
    pub fn datagram_key(&self, src: u32, dst: u32, src_epoch: u64, dst_epoch: u64) -> DatagramKey {
        let mut material = [0u8; 56];
        material[..32].copy_from_slice(&self.mac_key);
        material[32..36].copy_from_slice(&src.to_le_bytes());
        material[36..40].copy_from_slice(&dst.to_le_bytes());
        material[40..48].copy_from_slice(&src_epoch.to_le_bytes());
        material[48..56].copy_from_slice(&dst_epoch.to_le_bytes());
        let key = blake3::derive_key("amnet transport-udp v3 datagram key", &material);
        let gcm = aead::UnboundKey::new(&aead::AES_128_GCM, &key[..16])
            .expect("AES-128 takes a 16-byte key");
        DatagramKey {
            gcm: aead::LessSafeKey::new(gcm),
        }
    }

    /// Whether `mac` is [`Authenticator::tag_text`] of `text`, compared in constant time (no
    /// early exit at the first differing byte, so timing tells a forger nothing).
    pub(crate) fn verify_text(&self, text: &str, mac: &str) -> bool {
        let expected = self.tag_text(text);
        let (a, b) = (expected.as_bytes(), mac.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
    }

    /// A MAC of arbitrary control-plane bytes (rendezvous messages), as 32 hex digits: a
    /// BLAKE3 keyed hash under the job's MAC key (off the data path, so its speed does not
    /// matter).
    pub(crate) fn tag_text(&self, text: &str) -> String {
        let mut h = blake3::Hasher::new_keyed(&self.mac_key);
        h.update(b"rendezvous:");
        h.update(text.as_bytes());
        hex(&h.finalize().as_bytes()[..MAC_LEN])
    }
}

/// Seals and opens the datagrams of one direction (one source rank and epoch, one destination
/// rank and epoch) with AES-128-GCM: the payload is encrypted in place, the header is the
/// associated data (authenticated, not encrypted: the receiver needs it to pick the key), the
/// tag is the datagram's last [`MAC_LEN`] bytes and the packet number in the header is the
/// nonce. Checking a tag is constant-time (ring compares in constant time).
///
/// # Why no nonce is used twice under one key
///
/// GCM's guarantees hold only while a nonce is never used twice under one key: two different
/// datagrams sealed under the same nonce would give an observer the XOR of their payloads and
/// the GHASH key, and with it forgeries. Here the nonce is the packet number (8 bytes
/// little-endian, then 4 zero bytes) and the key belongs to one direction of one pair of
/// transport instances:
///
/// - the key is derived ([`Authenticator::datagram_key`]) from the job key and job id, the
///   source and destination ranks and both ranks' epochs. An epoch is 64 random bits drawn
///   each time a transport starts ([`Udp::connect`](crate::Udp::connect),
///   [`Udp::cluster`](crate::Udp::cluster)), so a key belongs to one sending
///   [`crate::proto::Engine`] and one of its peers (a rank restarted, or a key and job id
///   reused by another job, gets other keys, barring a 2^-64 collision of epochs);
/// - that engine numbers every datagram it sends to that peer from one counter that starts at
///   1, grows by one per datagram and is never reset: first transmissions, retransmissions
///   (a new number each, sealed again from the plaintext), acks, pings and fences alike. It
///   is 64 bits wide and never wraps (2^64 datagrams at 10^9 per second take 584 years);
/// - the nonce is read from the header that the tag also covers, so a datagram cannot be
///   sealed under a nonce other than its own packet number.
///
/// The one datagram sent twice (the testing aid's duplicates) repeats nonce *and* bytes,
/// hence the ciphertext and tag: that reveals nothing. A caller of
/// [`Udp::with_peers`](crate::Udp::with_peers) must give its own rank a fresh random epoch for
/// the same reason.
#[derive(Clone)]
pub struct DatagramKey {
    gcm: aead::LessSafeKey,
}

impl fmt::Debug for DatagramKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DatagramKey(..)")
    }
}

impl DatagramKey {
    /// The nonce of a datagram of at least [`OVERHEAD`] bytes: its packet number.
    fn nonce(dgram: &[u8]) -> aead::Nonce {
        let mut n = [0u8; aead::NONCE_LEN];
        n[..8].copy_from_slice(&dgram[PN_AT..PN_AT + 8]);
        aead::Nonce::assume_unique_for_key(n)
    }

    /// Encrypts the payload of `dgram` (between the header and the last [`MAC_LEN`] bytes)
    /// in place and writes the tag into its last [`MAC_LEN`] bytes, with the packet number in
    /// its header as nonce.
    ///
    /// # Panics
    /// If `dgram` is shorter than [`OVERHEAD`].
    pub fn seal(&self, dgram: &mut [u8]) {
        assert!(dgram.len() >= OVERHEAD, "a datagram has a header and a MAC");
        let nonce = Self::nonce(dgram);
        let (head, rest) = dgram.split_at_mut(HEADER_LEN);
        let (payload, mac) = rest.split_at_mut(rest.len() - MAC_LEN);
        let tag = self
            .gcm
            .seal_in_place_separate_tag(nonce, aead::Aad::from(&*head), payload)
            // Fails only beyond 64 GiB of payload.
            .expect("a datagram is within AES-GCM's length limits");
        mac.copy_from_slice(tag.as_ref());
    }

    /// Checks the tag of `dgram` (the header and the encrypted payload, under this key, with
    /// the packet number in the header as nonce; constant time) and, if it is right, decrypts
    /// the payload in place. False for anything shorter than [`OVERHEAD`] or with a wrong
    /// tag; the payload's bytes are then unspecified (the header is never changed).
    pub fn open(&self, dgram: &mut [u8]) -> bool {
        if dgram.len() < OVERHEAD {
            return false;
        }
        let nonce = Self::nonce(dgram);
        let (head, rest) = dgram.split_at_mut(HEADER_LEN);
        let (payload, mac) = rest.split_at_mut(rest.len() - MAC_LEN);
        let Ok(tag) = aead::Tag::try_from(&*mac) else {
            return false;
        };
        self.gcm
            .open_in_place_separate_tag(nonce, aead::Aad::from(&*head), tag, payload, 0..)
            .is_ok()
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
            prop_oneof![0u8..8, Just(FLAG_PACKED)],
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
        fn frames_read_back_what_was_packed(
            msgs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..300), 1..20),
        ) {
            let mut payload = Vec::new();
            for m in &msgs {
                let (head, rest) = m.split_at(m.len() / 3);
                push_frame(&mut payload, head, rest);
            }
            let got: Vec<Vec<u8>> = frames(&payload)
                .map(|r| payload[r.unwrap()].to_vec())
                .collect();
            prop_assert_eq!(got, msgs);
        }

        #[test]
        fn frames_of_any_bytes_end_at_the_first_error(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut end = 0;
            let mut failed = false;
            for f in frames(&b) {
                prop_assert!(!failed, "nothing after an error");
                match f {
                    Ok(r) => {
                        prop_assert!(r.start == end + FRAME_HEADER_LEN && r.end <= b.len());
                        end = r.end;
                    }
                    Err(_) => failed = true,
                }
            }
            prop_assert!(failed || end == b.len(), "every byte read, or an error");
        }

        #[test]
        fn header_round_trips(h in header()) {
            let mut b = [0u8; HEADER_LEN];
            h.write(&mut b);
            prop_assert_eq!(Header::read(&b), Some(h));
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Header::read(&b);
            let key = Authenticator::new(&JobKey::from_bytes([7; 32]), "job")
                .datagram_key(0, 1, 2, 3);
            prop_assert!(!key.open(&mut b.clone()));
        }

        /// What `seal` encrypts, `open` gives back, under the same key and header only.
        #[test]
        fn open_returns_what_seal_encrypted(
            h in header(),
            payload in proptest::collection::vec(any::<u8>(), 0..1500),
        ) {
            let key = Authenticator::new(&JobKey::from_bytes([8; 32]), "job-o")
                .datagram_key(h.src, h.dst, h.src_epoch, h.dst_epoch);
            let mut d = sealed(&key, &h, &payload);
            if payload.len() >= 16 {
                prop_assert_ne!(&d[HEADER_LEN..d.len() - MAC_LEN], &payload[..], "not encrypted");
            }
            prop_assert!(key.open(&mut d));
            prop_assert_eq!(&d[HEADER_LEN..d.len() - MAC_LEN], &payload[..]);
            prop_assert_eq!(Header::read(&d), Some(h));
        }

        /// Two datagrams that differ in one byte (anywhere: header, payload or MAC, by any
        /// non-zero difference) do not both verify, whatever their length.
        #[test]
        fn datagrams_differing_in_one_byte_do_not_both_verify(
            h in header(),
            payload in proptest::collection::vec(any::<u8>(), 0..1500),
            at in any::<usize>(),
            delta in 1u8..=255,
        ) {
            let key = Authenticator::new(&JobKey::from_bytes([3; 32]), "job-a")
                .datagram_key(h.src, h.dst, h.src_epoch, h.dst_epoch);
            let d = sealed(&key, &h, &payload);
            prop_assert!(key.open(&mut d.clone()));
            let mut e = d.clone();
            let at = at % e.len();
            e[at] ^= delta;
            prop_assert!(!key.open(&mut e), "changed byte {} of {}", at, d.len());
        }

        /// Every truncation (and every extension) of a sealed datagram fails, also under any
        /// other direction's key.
        #[test]
        fn truncated_or_extended_datagrams_do_not_verify(
            h in header(),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
            cut in any::<usize>(),
            extra in proptest::collection::vec(any::<u8>(), 1..20),
        ) {
            let key = Authenticator::new(&JobKey::from_bytes([4; 32]), "job-t")
                .datagram_key(h.src, h.dst, h.src_epoch, h.dst_epoch);
            let d = sealed(&key, &h, &payload);
            let cut = cut % d.len();
            prop_assert!(!key.open(&mut d[..cut].to_vec()));
            let mut longer = d.clone();
            longer.extend_from_slice(&extra);
            prop_assert!(!key.open(&mut longer));
        }
    }

    /// A datagram with header `h` and `payload`, sealed under `key`.
    fn sealed(key: &DatagramKey, h: &Header, payload: &[u8]) -> Vec<u8> {
        let mut d = vec![0u8; HEADER_LEN];
        h.write(&mut d);
        d.extend_from_slice(payload);
        d.extend_from_slice(&[0; MAC_LEN]);
        key.seal(&mut d);
        d
    }

    fn some_header() -> Header {
        Header {
            kind: Kind::Data,
            flags: FLAG_FIRST | FLAG_LAST,
            job_tag: 0x1234,
            src: 0,
            dst: 1,
            src_epoch: 0xE0,
            dst_epoch: 0xE1,
            pn: 7,
            ack: 3,
            sack: 0,
            seq: 5,
            msg_len: 4,
            newest_pn: 2,
            ack_delay_us: 10,
        }
    }

    #[test]
    fn other_job_key_direction_or_epoch_does_not_verify() {
        let key = JobKey::from_bytes([1; 32]);
        let a = Authenticator::new(&key, "job-a");
        let b = Authenticator::new(&key, "job-b");
        let c = Authenticator::new(&JobKey::from_bytes([2; 32]), "job-a");
        let h = some_header();
        let d = sealed(&a.datagram_key(0, 1, 0xE0, 0xE1), &h, b"data");
        assert!(a.datagram_key(0, 1, 0xE0, 0xE1).open(&mut d.clone()));
        for (name, other) in [
            ("other job", b.datagram_key(0, 1, 0xE0, 0xE1)),
            ("other key", c.datagram_key(0, 1, 0xE0, 0xE1)),
            ("reverse direction", a.datagram_key(1, 0, 0xE1, 0xE0)),
            ("other source", a.datagram_key(2, 1, 0xE0, 0xE1)),
            ("other destination", a.datagram_key(0, 2, 0xE0, 0xE1)),
            ("source restarted", a.datagram_key(0, 1, 0xE2, 0xE1)),
            ("destination restarted", a.datagram_key(0, 1, 0xE0, 0xE2)),
        ] {
            assert!(!other.open(&mut d.clone()), "{name}");
        }
        assert_ne!(a.job_tag(), b.job_tag());
        assert_eq!(a.job_tag(), c.job_tag());
    }

    /// A datagram is exactly what the format comment and [`DatagramKey`] say: AES-128-GCM
    /// with the documented key derivation, the packet number as nonce, the header as
    /// associated data and the payload encrypted. Computed here with another implementation,
    /// RustCrypto's `aes-gcm`.
    #[test]
    fn the_datagram_is_aes_gcm_under_the_direction_key_with_the_packet_number_as_nonce() {
        use aes_gcm::{AeadInOut, Aes128Gcm, KeyInit};
        let job_key = JobKey::from_bytes([5; 32]);
        let auth = Authenticator::new(&job_key, "job-g");
        let mut h = some_header();
        h.pn = 0x0102_0304_0506_0708;
        let d = sealed(&auth.datagram_key(3, 9, 0xAAAA, 0xBBBB), &h, b"payload");
        let mut material = Vec::new();
        material.extend_from_slice(&[5; 32]);
        material.extend_from_slice(b"job-g");
        let mac_key = blake3::derive_key("amnet transport-udp v1 datagram MAC", &material);
        let mut material = mac_key.to_vec();
        material.extend_from_slice(&3u32.to_le_bytes());
        material.extend_from_slice(&9u32.to_le_bytes());
        material.extend_from_slice(&0xAAAAu64.to_le_bytes());
        material.extend_from_slice(&0xBBBBu64.to_le_bytes());
        let key = blake3::derive_key("amnet transport-udp v3 datagram key", &material);
        let gcm = Aes128Gcm::new_from_slice(&key[..16]).unwrap();
        let nonce = [8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0];
        let mut payload = b"payload".to_vec();
        let tag = gcm
            .encrypt_inout_detached(
                &nonce.into(),
                &d[..HEADER_LEN],
                payload.as_mut_slice().into(),
            )
            .unwrap();
        assert_eq!(&d[HEADER_LEN..d.len() - MAC_LEN], &payload[..]);
        assert_eq!(&d[d.len() - MAC_LEN..], &tag[..]);
        // The packet number is the nonce: the same bytes under another one differ.
        let mut other = nonce;
        other[0] ^= 1;
        let mut again = b"payload".to_vec();
        let tag2 = gcm
            .encrypt_inout_detached(&other.into(), &d[..HEADER_LEN], again.as_mut_slice().into())
            .unwrap();
        assert_ne!(tag, tag2);
        assert_ne!(payload, again);
    }

    /// Replaying a datagram is no MAC matter (the engine's packet-number window refuses it),
    /// but a replay with a new packet number, the one way past that window, breaks the MAC.
    #[test]
    fn a_replay_renumbered_does_not_verify() {
        let auth = Authenticator::new(&JobKey::from_bytes([6; 32]), "job-r");
        let key = auth.datagram_key(0, 1, 0xE0, 0xE1);
        let d = sealed(&key, &some_header(), b"once");
        assert!(key.open(&mut d.clone()));
        for pn in [0u64, 8, 1 << 40, u64::MAX] {
            let mut r = d.clone();
            r[PN_AT..PN_AT + 8].copy_from_slice(&pn.to_le_bytes());
            assert!(!key.open(&mut r), "pn {pn}");
        }
    }

    #[test]
    fn earlier_versions_are_malformed() {
        let mut b = [0u8; HEADER_LEN];
        some_header().write(&mut b);
        assert!(Header::read(&b).is_some());
        for v in [0xA1, 0xA2, 0xA3] {
            b[0] = v;
            assert_eq!(Header::read(&b), None);
        }
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
            Err(KeyError::File(
                am_bootstrap::KeyFileError::Permissions { .. }
            ))
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
            Err(KeyError::File(am_bootstrap::KeyFileError::Io { source, .. })) => {
                assert_eq!(source.raw_os_error(), Some(nix::libc::ELOOP))
            }
            other => panic!("a symbolic link was followed: {other:?}"),
        }
        // A directory is no key file.
        assert!(matches!(
            JobKey::from_file(std::env::temp_dir().to_str().unwrap()),
            Err(KeyError::File(
                am_bootstrap::KeyFileError::NotAFile { .. }
                    | am_bootstrap::KeyFileError::Permissions { .. }
                    | am_bootstrap::KeyFileError::Owner { .. }
            ))
        ));
        std::fs::remove_file(&dir).unwrap();
    }
}
