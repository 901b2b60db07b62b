//! Loopback without its own atomics, puts and gets: one-sided operations then travel as
//! the core's system messages (the path UDP takes), served by the target's progress.

use std::time::Duration;

use am_core::{
    Capabilities, Delivery, Limits, Loopback, Outgoing, Rank, SendError, SharedBytes, Transport,
    TransportError, Tx,
};

/// A Loopback rank whose NIC does no puts, gets or atomics itself.
pub struct NoDirectRma(pub Loopback);

impl Tx for NoDirectRma {
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        self.0.try_send(dest, msg)
    }
}

impl Transport for NoDirectRma {
    fn name(&self) -> &'static str {
        "loopback-no-direct-rma"
    }
    fn rank(&self) -> Rank {
        self.0.rank()
    }
    fn size(&self) -> u32 {
        self.0.size()
    }
    fn limits(&self) -> Limits {
        self.0.limits()
    }
    fn segment(&self) -> SharedBytes<'_> {
        self.0.segment()
    }
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        self.0.poll_recv(f)
    }
    fn wait(&mut self, timeout: Duration) -> Result<(), TransportError> {
        self.0.wait(timeout)
    }
    /// Loopback's, less puts, gets and atomics.
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.0.capabilities();
        caps.put = false;
        caps.get = false;
        caps.atomics = false;
        caps
    }
    fn close(&mut self) {
        self.0.close()
    }
}
