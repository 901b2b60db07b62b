//! What typed messages send from the endpoint's polls ([`crate::typed::Transit`]): answers
//! that cannot leave as the handler's reply (too large for one, or given later by an
//! [`crate::typed::Answer`]), and the cancels of streams given up half sent.

use std::task::Poll;

use crate::error::AmError;
use crate::handler::Threading;
use crate::transport::Transport;
use crate::typed::{ahead_of_last, part_words, Queued, CANCEL};
use crate::types::AmKind;

use super::state::Endpoint;

impl<H: Threading> Endpoint<H> {
    /// The async typed handlers' tasks ([`crate::Handlers::typed_async`]), if the table
    /// registers typed messages.
    #[inline]
    pub(crate) fn typed_tasks(&self) -> Option<&H::Tasks> {
        self.handlers.typed_site.as_ref().map(|s| &s.tasks)
    }

    /// Sets whether this rank's transport maps peers' created segments
    /// ([`crate::Capabilities::map_segments`]), and whether typed values larger than a few
    /// Mediums then move by rendezvous ([`crate::Config::typed_rendezvous`]): this rank
    /// takes them so where it maps, and sends them so where it maps and `send` is set.
    pub fn set_typed_rendezvous(&mut self, maps: bool, send: bool) {
        if let Some(site) = &self.handlers.typed_site {
            site.transit.set_maps(maps, send);
        }
    }

    /// Sends what typed messages queued, oldest first, as far as the device and the
    /// credits allow; the rest goes on a later poll. Each item is taken out of the queue
    /// while it is sent (a send that finds a peer lost forgets that peer's items there);
    /// one for a peer that is gone is dropped (its call fails there, or already did).
    #[cold]
    #[inline(never)]
    pub(super) fn send_typed_queue<T: Transport + ?Sized>(&mut self, t: &mut T) {
        let Some(site) = &self.handlers.typed_site else {
            return;
        };
        let (transit, part, answer) = (site.transit.clone(), site.part, site.answer);
        while let Some(mut q) = transit.take_queued() {
            if let Poll::Ready(_gone) = self.waiting_for(q.dest()) {
                continue;
            }
            match self.send_queued(t, &mut q, part, answer) {
                // Sent: a large answer's buffer serves the next value this thread encodes.
                Ok(true) => {
                    if let crate::typed::Queued::Answer(a) = q {
                        crate::typed::recycle(a.bytes);
                    }
                }
                Ok(false) => {
                    transit.put_back(q);
                    return;
                }
                // The peer was found gone while sending: what it waited for fails there.
                Err(_) if self.waiting_for(q.dest()).is_ready() => {}
                // Not the peer's doing (the device): tried again on a later poll.
                Err(_) => {
                    transit.put_back(q);
                    return;
                }
            }
        }
    }

    /// One attempt to send `q` on: `Ok(true)` once all of it has left.
    fn send_queued<T: Transport + ?Sized>(
        &mut self,
        t: &mut T,
        q: &mut Queued,
        part: crate::HandlerId,
        answer: crate::HandlerId,
    ) -> Result<bool, AmError> {
        let medium = AmKind::Medium;
        let a = match q {
            Queued::Cancel { dest, stream } => {
                let args = [*stream, CANCEL];
                return self.try_send(t, *dest, false, medium, part.0, &args, &[], None);
            }
            Queued::Answer(a) => a,
        };
        let max = self.limits.max_medium.max(1);
        let len = a.bytes.len();
        let ahead = ahead_of_last(len, max);
        while a.sent < ahead {
            let piece = &a.bytes[a.sent..a.sent + max];
            let (words, n) = part_words(a.stream, (a.sent / max) as u32, len);
            if !self.try_send(t, a.dest, false, medium, part.0, &words[..n], piece, None)? {
                return Ok(false);
            }
            a.sent += max;
            a.stream_used = true;
        }
        // The stream's word only where parts went ahead.
        let words = [a.number, a.status, a.stream];
        let words = &words[..if a.stream_used { 3 } else { 2 }];
        let last = &a.bytes[ahead..];
        self.try_send(t, a.dest, false, medium, answer.0, words, last, None)
    }
}
