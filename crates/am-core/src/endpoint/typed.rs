//! Typed answers that leave as requests ([`crate::typed::Transit`]): too large for a reply,
//! or an abandoned [`crate::typed::Answer`]'s; the handler (or the drop) queued them, and
//! the endpoint sends them (parts, then the answer with the last piece).

use crate::error::AmError;
use crate::handler::Threading;
use crate::transport::Transport;
use crate::types::AmKind;

use super::state::Endpoint;

impl<H: Threading> Endpoint<H> {
    /// Sends the queued typed answers, oldest first, as far as the device and the credits
    /// allow; the rest go on a later poll. An answer to a peer that cannot take it (gone)
    /// is dropped: its call fails there, or already did.
    #[cold]
    #[inline(never)]
    pub(super) fn send_typed_answers<T: Transport + ?Sized>(&mut self, t: &mut T) {
        let Some(site) = &self.handlers.typed_site else {
            return;
        };
        let (transit, part, answer) = (site.transit.clone(), site.part, site.answer);
        let max = self.limits.max_medium;
        transit.send_queued(|a| -> Result<bool, AmError> {
            let len = a.bytes.len();
            let ahead = if len <= max {
                0
            } else {
                len - ((len - 1) % max + 1)
            };
            while a.sent < ahead {
                let piece = &a.bytes[a.sent..a.sent + max];
                let kind = AmKind::Medium;
                if !self.try_request(t, a.dest, kind, part, &[a.stream], piece, None)? {
                    return Ok(false);
                }
                a.sent += max;
            }
            // The stream's word only where parts went ahead.
            let words = [a.number, a.status, a.stream];
            let words = &words[..if ahead > 0 { 3 } else { 2 }];
            let last = &a.bytes[ahead..];
            self.try_request(t, a.dest, AmKind::Medium, answer, words, last, None)
        });
    }
}
