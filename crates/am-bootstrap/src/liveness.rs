//! Liveness: whether a peer's process still runs.

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
