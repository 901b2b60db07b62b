//! The NIC alone, without the AM core: rank 0 sends the encoded head of a Short request
//! through [`am_core::Tx::try_send`] and polls for the reply; [`PEER`] replies from inside its receive
//! closure. What a transport costs beneath the core.

use std::time::{Duration, Instant};

use am_core::wire::{encode_head, MAX_HEAD_LEN};
use am_core::{AmKind, Category, Outgoing, Transport, TransportError};

use crate::{median_us, PEER};

/// The encoded heads of a Short request to handler 1 and of its reply, no arguments.
#[derive(Debug, Clone)]
pub struct ShortHeads {
    request: ([u8; MAX_HEAD_LEN], usize),
    reply: ([u8; MAX_HEAD_LEN], usize),
}

impl ShortHeads {
    /// Encodes both heads.
    pub fn new() -> Self {
        Self {
            request: encode(Category::Request),
            reply: encode(Category::Reply),
        }
    }

    /// The request, ready for [`am_core::Tx::try_send`].
    pub fn request(&self) -> Outgoing<'_> {
        Outgoing::new(&self.request.0[..self.request.1], &[])
    }

    /// The reply to the request that came with `route`, ready for [`am_core::Tx::try_send`].
    pub fn reply(&self, route: am_core::Route) -> Outgoing<'_> {
        Outgoing {
            reply_to: Some(route),
            ..Outgoing::new(&self.reply.0[..self.reply.1], &[])
        }
    }
}

impl Default for ShortHeads {
    fn default() -> Self {
        Self::new()
    }
}

fn encode(category: Category) -> ([u8; MAX_HEAD_LEN], usize) {
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = encode_head(category, AmKind::Short, 1, &[], 0, &mut h);
    (h, n)
}

/// One round trip from rank 0: sends the request to [`PEER`] and polls until a message
/// (the reply) has arrived.
pub fn round_trip<T: Transport>(t: &mut T, heads: &ShortHeads) -> Result<(), TransportError> {
    t.try_send(PEER, &heads.request())?;
    while t.poll_recv(|_, _, _| ())?.is_none() {}
    Ok(())
}

/// [`PEER`]'s side: answers `count` requests with the reply, from inside the receive closure.
pub fn reply_to<T: Transport>(
    t: &mut T,
    heads: &ShortHeads,
    count: u64,
) -> Result<(), TransportError> {
    let mut got = 0;
    while got < count {
        if let Some(r) = t.poll_recv(|d, _, tx| tx.try_send(0, &heads.reply(d.route)))? {
            r?;
            got += 1;
        }
    }
    Ok(())
}

/// Between two processes: rank 0 returns the median of `iters` round trips in µs, rank 1
/// answers them and returns 0.
pub fn rtt_us<T: Transport>(t: &mut T, rank: u32, iters: usize) -> Result<f64, TransportError> {
    let heads = ShortHeads::new();
    if rank == 0 {
        median_us(iters, || round_trip(t, &heads))
    } else {
        reply_to(t, &heads, iters as u64)?;
        Ok(0.0)
    }
}

/// Between two threads of this process, over `pair` (ranks 0 and 1 of one cluster): the
/// total time of `iters` round trips.
pub fn rtt_threads<T: Transport + Send>(
    mut pair: Vec<T>,
    iters: u64,
) -> Result<Duration, TransportError> {
    let (mut t1, mut t0) = match (pair.pop(), pair.pop()) {
        (Some(t1), Some(t0)) if pair.is_empty() => (t1, t0),
        _ => return Err(TransportError::device("rtt_threads wants two ranks")),
    };
    let heads = ShortHeads::new();
    std::thread::scope(|s| {
        let peer = s.spawn(|| reply_to(&mut t1, &heads, iters));
        let start = Instant::now();
        for _ in 0..iters {
            round_trip(&mut t0, &heads)?;
        }
        let elapsed = start.elapsed();
        peer.join()
            .map_err(|_| TransportError::device("the replying thread panicked"))??;
        Ok(elapsed)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use am_core::wire::Header;
    use am_core::{Loopback, LoopbackConfig};

    #[test]
    fn heads_decode_as_short_request_and_reply() {
        let h = ShortHeads::new();
        for (out, category) in [
            (h.request(), Category::Request),
            (h.reply(am_core::Route::NONE), Category::Reply),
        ] {
            let head = Header::decode(out.head, true).expect("decodes");
            assert_eq!(head.category, category);
            assert_eq!((head.kind, head.handler, head.nargs), (AmKind::Short, 1, 0));
            assert!(out.payload.is_empty() && out.long_offset.is_none());
        }
    }

    #[test]
    fn round_trips_between_two_loopback_threads() {
        let pair = Loopback::cluster(2, LoopbackConfig::default());
        assert!(rtt_threads(pair, 50).is_ok());
    }
}
