//! Noticing dead peers: a rank that waits without progress checks, at most every
//! [`LIVENESS_AFTER`], that every peer that has not departed is still alive.

use std::time::{Duration, Instant};

use am_core::{Rank, TransportError};
use am_shm::sync::Ordering;
use am_shm::Segment;
use nix::unistd::Pid;

use crate::control::{Departed, ABORT};

/// A wait with no progress this long makes a rank check that its peers are alive.
pub const LIVENESS_AFTER: Duration = Duration::from_millis(100);
/// Empty polls between two looks at the clock (keeps an idle poll free of system calls).
pub const IDLE_POLLS_PER_TICK: u32 = 1024;

/// A rank's view of its peers' lives: their pids (from start-up; `None` for in-process ranks,
/// which cannot die alone) and how long it has waited.
#[derive(Debug)]
pub struct Liveness {
    pids: Vec<Option<Pid>>,
    /// Peers known lost.
    lost: Vec<bool>,
    /// Peers whose departure was reported.
    departed: Vec<bool>,
    idle_polls: u32,
    idle_since: Option<Instant>,
    last_check: Option<Instant>,
}

impl Liveness {
    /// For peers with these pids (`pids[r]`, `None` for this rank and in-process peers).
    pub fn new(pids: Vec<Option<Pid>>) -> Liveness {
        Liveness {
            lost: vec![false; pids.len()],
            departed: vec![false; pids.len()],
            pids,
            idle_polls: 0,
            idle_since: None,
            last_check: None,
        }
    }

    /// Something arrived: the wait is over.
    #[inline]
    pub fn progress(&mut self) {
        self.idle_polls = 0;
        self.idle_since = None;
    }

    /// An empty poll; true every [`IDLE_POLLS_PER_TICK`]-th one (time for [`check`](Self::check)).
    #[inline]
    pub fn idle_poll(&mut self) -> bool {
        self.idle_polls = self.idle_polls.wrapping_add(1);
        self.idle_polls.is_multiple_of(IDLE_POLLS_PER_TICK)
    }

    /// Whether `peer` is known lost.
    #[inline]
    pub fn is_lost(&self, peer: usize) -> bool {
        self.lost.get(peer).copied().unwrap_or(true)
    }

    /// Marks `peer` lost (the transport learnt it another way).
    pub fn mark_lost(&mut self, peer: usize) {
        if let Some(l) = self.lost.get_mut(peer) {
            *l = true;
        }
    }

    /// The peers known lost.
    pub fn lost(&self) -> impl Iterator<Item = usize> + '_ {
        self.lost
            .iter()
            .enumerate()
            .filter(|(_, &l)| l)
            .map(|(r, _)| r)
    }

    /// The pid of `peer`, if it is a process of its own.
    pub fn pid(&self, peer: usize) -> Option<Pid> {
        self.pids.get(peer).copied().flatten()
    }

    /// After [`LIVENESS_AFTER`] without progress, and then at most every [`LIVENESS_AFTER`]:
    /// [`check_now`](Self::check_now). Usually finds nothing (an empty `Vec` does not
    /// allocate).
    pub fn check(
        &mut self,
        own: &Segment,
        departed: Departed,
    ) -> Result<Vec<TransportError>, TransportError> {
        if !self.due() {
            return Ok(Vec::new());
        }
        self.check_now(own, departed)
    }

    /// Whether a check is due: [`LIVENESS_AFTER`] without progress, and as long since the
    /// last one (a true answer counts as that check). For a NIC's own slow-path looks, too.
    pub fn due(&mut self) -> bool {
        let now = Instant::now();
        let since = *self.idle_since.get_or_insert(now);
        if now.duration_since(since) < LIVENESS_AFTER
            || self
                .last_check
                .is_some_and(|t| now.duration_since(t) < LIVENESS_AFTER)
        {
            return false;
        }
        self.last_check = Some(now);
        true
    }

    /// Fails with `JobAborted` if `own`'s abort word is set (1); otherwise marks lost every
    /// peer that neither departed (its word in `own` at `departed` is 1) nor is alive. Returns
    /// what it found: `PeerDeparted` once for each peer that departed, `PeerLost` for each
    /// newly lost peer, and `PeerMisbehaved` for an abort or departed word holding a value no
    /// rank writes, which it puts back to 0.
    pub fn check_now(
        &mut self,
        own: &Segment,
        departed: Departed,
    ) -> Result<Vec<TransportError>, TransportError> {
        let mut found = Vec::new();
        match own.load_word(ABORT).unwrap_or(0) {
            0 => {}
            1 => return Err(TransportError::JobAborted),
            v => found.push(put_back(own, ABORT, v, None, "abort word")),
        }
        for (r, pid) in self.pids.iter().enumerate() {
            if self.lost[r] {
                continue;
            }
            match own.load_word(departed.of(r)).unwrap_or(0) {
                0 => {}
                1 => {
                    if !std::mem::replace(&mut self.departed[r], true) {
                        found.push(TransportError::PeerDeparted(r as Rank));
                    }
                    continue;
                }
                v => found.push(put_back(
                    own,
                    departed.of(r),
                    v,
                    Some(r as Rank),
                    "departed word",
                )),
            }
            let Some(pid) = *pid else { continue };
            if !am_bootstrap::process_alive(pid) {
                // A rank that ends cleanly writes its departed word before it exits: one that
                // departed between the load above and the probe is gone with the word set.
                if own.load_word(departed.of(r)).unwrap_or(0) == 1 {
                    // A rank that panicked set the abort word before its departed word
                    // (`control::depart`).
                    if own.load_word(ABORT).unwrap_or(0) == 1 {
                        return Err(TransportError::JobAborted);
                    }
                    if !std::mem::replace(&mut self.departed[r], true) {
                        found.push(TransportError::PeerDeparted(r as Rank));
                    }
                    continue;
                }
                self.lost[r] = true;
                found.push(TransportError::PeerLost(r as Rank));
            }
        }
        Ok(found)
    }
}

/// Puts a control word holding a value no rank writes back to 0; the error that reports it.
fn put_back(
    own: &Segment,
    at: usize,
    value: u64,
    peer: Option<Rank>,
    what: &str,
) -> TransportError {
    if let Ok(w) = own.word(at) {
        let _ = w.compare_exchange(value, 0, Ordering::AcqRel, Ordering::Relaxed);
    }
    TransportError::PeerMisbehaved {
        peer,
        what: format!("{what} {value:#x}"),
    }
}
