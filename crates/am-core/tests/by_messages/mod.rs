//! Loopback without its own atomics, puts and gets: one-sided operations then travel as
//! the core's system messages (the path UDP takes), served by the target's progress.

use am_core::transport::NicInfo;
use am_core::{Loopback, Transport, Tx};

/// A Loopback rank whose NIC does no puts, gets or atomics itself.
pub struct NoDirectRma(pub Loopback);

impl Tx for NoDirectRma {
    am_core::forward_transport!(field 0; try_send);
}

impl Transport for NoDirectRma {
    am_core::forward_transport!(field 0; rank, size, segment, poll_recv, wait, close);

    /// Loopback's, less puts, gets and atomics.
    fn info(&self) -> NicInfo {
        let mut info = self.0.info();
        info.name = "loopback-no-direct-rma";
        info.capabilities.put = false;
        info.capabilities.get = false;
        info.capabilities.atomics = false;
        info
    }
}
