//! Reading a secret from a file of the user's own: the UDP transport's `AM_UDP_KEY_FILE`,
//! checked the same way by `amrun` (before it starts a job) and by every rank.

use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

/// Why a key file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyFileError {
    /// The file could not be opened or read (a symbolic link is `ELOOP`).
    #[error("cannot read the key file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// The file is not a regular file (a directory, a device, a FIFO).
    #[error("the key file {path} is not a regular file")]
    NotAFile {
        /// The file.
        path: String,
    },
    /// The file belongs to another user, who can read it or give it another key.
    #[error("the key file {path} belongs to user {owner}, not to this user ({me})")]
    Owner {
        /// The file.
        path: String,
        /// Its owner's user id.
        owner: u32,
        /// This process's effective user id.
        me: u32,
    },
    /// The file can be read or written by other users.
    #[error(
        "the key file {path} has mode {mode:o}: it must be readable by its owner only (chmod 600)"
    )]
    Permissions {
        /// The file.
        path: String,
        /// Its mode bits.
        mode: u32,
    },
}

/// Reads at most `limit` bytes of a secret file: a regular file owned by this user, of mode
/// 0600 or stricter.
///
/// The file is opened once, without following a symbolic link as its last component
/// (`O_NOFOLLOW`), and the checks are made on the open file (`fstat`), so the file read is
/// the file checked: no swapping it between the check and the read.
pub fn read_key_file(path: &str, limit: u64) -> Result<String, KeyFileError> {
    let io_err = |source| KeyFileError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .map_err(io_err)?;
    let meta = file.metadata().map_err(io_err)?;
    if !meta.file_type().is_file() {
        return Err(KeyFileError::NotAFile {
            path: path.to_owned(),
        });
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(KeyFileError::Owner {
            path: path.to_owned(),
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyFileError::Permissions {
            path: path.to_owned(),
            mode,
        });
    }
    let mut text = String::new();
    file.take(limit).read_to_string(&mut text).map_err(io_err)?;
    Ok(text)
}

/// Whether `text` (surrounding whitespace ignored) is a UDP job key: 64 hexadecimal digits.
pub fn is_udp_key(text: &str) -> bool {
    let t = text.trim();
    t.len() == 64 && t.bytes().all(|b| b.is_ascii_hexdigit())
}
