//! Receiving: a delivered message is checked, its credits taken, its handler run (or the
//! system message answered), and its reply or implicit reply sent.

use std::cell::{Cell, OnceCell};
use std::collections::HashMap;
use std::ops::Range;

use super::state::{Endpoint, Hello};
use crate::atomic::Refused;
use crate::credit::{CreditPolicy, Policy};
use crate::error::{shm_err, AmError, Misbehavior};
use crate::handler::Threading;
use crate::handler::{HandlerFn, Msg};
use crate::protocol::{
    opcode, read_atomic_entry, read_region_entry, HelloVerdict, SystemMsg, ATOMIC_ENTRY_LEN,
    MAX_BATCH_ATOMICS, REGION_ENTRY_LEN,
};
use crate::reply::{refuse_request, segment_range, ReplySink, Token};
use crate::segment::SegmentId;
use crate::transport::{Delivery, Payload, Received, Route, SharedBytes, Transport, Tx};
use crate::types::{AmKind, Category, HandlerId, Rank};
use crate::wire::{self, Header, WireError, BASE_HEADER_LEN, MAX_ARGS, MAX_HEAD_LEN};

fn misbehaved(peer: Rank, what: Misbehavior) -> AmError {
    AmError::PeerMisbehaved { peer, what }
}

/// What a target's refusal of an operation on its segment `seg` means: on segment 0, whose
/// ranges the initiator checked, a misbehaving target; on a created segment, one the target
/// no longer holds ([`crate::segment`]).
#[cold]
fn refused(src: Rank, seg: u32) -> AmError {
    match seg {
        0 => misbehaved(src, Misbehavior::OutOfSegment { offset: 0, len: 0 }),
        id => AmError::UnknownSegment {
            rank: src,
            id: crate::segment::SegmentId::new(id),
        },
    }
}

/// The created segment's id a message carries as its payload (an `ATOMIC_AT`, a Long into
/// a created segment): `None` if the payload is not [`wire::SEGMENT_ID_LEN`] bytes.
fn segment_id_in(payload: Payload<'_>) -> Result<Option<u32>, AmError> {
    let mut id = [0u8; wire::SEGMENT_ID_LEN];
    match payload {
        Payload::Private(b) if b.len() == id.len() => id.copy_from_slice(b),
        Payload::Shared(s) if s.len() == id.len() => s.read(0, &mut id).map_err(shm_err)?,
        _ => return Ok(None),
    }
    Ok(Some(u32::from_le_bytes(id)))
}

#[cold]
fn unknown_handler(src: Rank, hdr: &Header) -> AmError {
    misbehaved(
        src,
        Misbehavior::UnknownHandler {
            handler: HandlerId(hdr.handler),
            category: hdr.category,
            kind: hdr.kind,
        },
    )
}

/// Copies an accepted Long payload carried inline into its place in the segment.
#[inline(always)]
fn place(
    segment: SharedBytes<'_>,
    long: &Option<Range<usize>>,
    inline: Option<Payload<'_>>,
) -> Result<(), AmError> {
    if let (Some(r), Some(data)) = (long, inline) {
        match data {
            Payload::Private(b) => segment.write(r.start, b),
            Payload::Shared(s) => segment.copy_from(r.start, s),
        }
        .map_err(shm_err)?;
    }
    Ok(())
}

/// The `nargs` arguments after a message's first word (a decoded user Short or Medium, so
/// they are present), copied out into `out`.
#[inline(always)]
fn args_after_word<'o>(
    bytes: Received<'_>,
    nargs: u8,
    out: &'o mut [u32; MAX_ARGS],
) -> Result<&'o [u32], AmError> {
    let n = (nargs as usize).min(MAX_ARGS);
    if n > 0 {
        let mut raw = [0u8; 4 * MAX_ARGS];
        let raw = &mut raw[..4 * n];
        match bytes {
            Received::Shared(s) => s.read(BASE_HEADER_LEN, raw).map_err(shm_err)?,
            Received::Private(b) => raw.copy_from_slice(
                b.get(BASE_HEADER_LEN..BASE_HEADER_LEN + 4 * n)
                    .ok_or_else(|| {
                        shm_err(am_shm::ShmError::OutOfBounds {
                            offset: BASE_HEADER_LEN,
                            len: 4 * n,
                            area: b.len(),
                        })
                    })?,
            ),
        }
        for (a, b) in out.iter_mut().zip(raw.chunks_exact(4)) {
            *a = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        }
    }
    Ok(&out[..n])
}

/// The payload of a message after its `head_len` bytes of head, where it lies.
#[inline(always)]
fn body_after(bytes: Received<'_>, head_len: usize) -> Result<Payload<'_>, AmError> {
    Ok(match bytes {
        Received::Shared(s) => Payload::Shared(s.slice_from(head_len).map_err(shm_err)?),
        Received::Private(b) => Payload::Private(b.get(head_len..).unwrap_or(&[])),
    })
}

struct SystemState<'a> {
    rank: Rank,
    seg_len: usize,
    hello: &'a mut Hello,
    hello_digest: u64,
    hello_signature: &'a [u16; 256],
    hello_typed: &'a [u64],
    barrier_arrivals: &'a mut HashMap<(u64, u8), u32>,
    teams: &'a mut super::teams::Teams,
    changes: &'a mut u32,
    exit_requested: &'a mut Option<i32>,
    segments: &'a crate::segment::Segments,
}

fn system_request(
    st: &mut SystemState<'_>,
    sink: &mut ReplySink<'_>,
    hdr: &Header,
    args: &[u32],
    (segment, payload): (SharedBytes<'_>, Payload<'_>),
    (long, inline_long): (&Option<Range<usize>>, Option<Payload<'_>>),
) -> Result<(), AmError> {
    let src = sink.src;
    let bad = || misbehaved(src, Misbehavior::BadSystemMessage(hdr.handler));
    let msg = SystemMsg::decode(hdr.category, hdr.kind, hdr.handler, args)
        .map_err(|m| misbehaved(src, m))?;
    match msg {
        SystemMsg::Hello {
            digest,
            segment_len,
        } => {
            if st.rank != 0 {
                return Err(bad());
            }
            // Their signature up to their highest registered id (0 beyond), or fewer
            // entries if a Medium could not carry them all (then a difference beyond them
            // goes unnamed), and their typed messages' ids.
            if payload.len() > sink.out.limits.max_medium {
                return Err(bad());
            }
            let mut bytes = vec![0u8; payload.len()];
            match payload {
                Payload::Private(b) => bytes.copy_from_slice(b),
                Payload::Shared(s) => s.read(0, &mut bytes).map_err(shm_err)?,
            }
            let (sig, typed, typed_whole) = super::startup::parse_hello(&bytes).ok_or_else(bad)?;
            let n = sig.len();
            let truncated = n < 256 && n >= sink.out.limits.max_medium.saturating_sub(6) / 2;
            st.hello.received += 1;
            if st.hello.mismatch.is_none() {
                let ours_missing = st
                    .hello_typed
                    .iter()
                    .find(|id| typed.binary_search(id).is_err());
                let theirs_missing = typed
                    .iter()
                    .find(|id| st.hello_typed.binary_search(id).is_err());
                if digest != st.hello_digest
                    && typed_whole
                    && (ours_missing.is_some() || theirs_missing.is_some())
                {
                    st.hello.mismatch = Some(HelloVerdict::TypedMismatch {
                        rank: src,
                        ours: ours_missing.copied(),
                        theirs: theirs_missing.copied(),
                    });
                } else if digest != st.hello_digest {
                    // The lowest id whose signature entries differ.
                    let entries = if truncated { n } else { 256 };
                    let handler = (0..entries)
                        .find(|&id| sig.get(id).copied().unwrap_or(0) != st.hello_signature[id])
                        .map(|id| id as u8);
                    st.hello.mismatch = Some(HelloVerdict::TableMismatch {
                        rank: src,
                        ours: st.hello_digest,
                        theirs: digest,
                        handler,
                    });
                } else if segment_len != st.seg_len as u64 {
                    st.hello.mismatch = Some(HelloVerdict::SegmentMismatch {
                        rank: src,
                        ours: st.seg_len as u64,
                        theirs: segment_len,
                    });
                }
            }
            Ok(())
        }
        SystemMsg::HelloVerdict(v) => {
            st.hello.result = Some(v);
            Ok(())
        }
        SystemMsg::Barrier { epoch, round } => {
            *st.barrier_arrivals.entry((epoch, round)).or_insert(0) += 1;
            Ok(())
        }
        SystemMsg::Put { op } => {
            place(segment, long, inline_long)?;
            sink.system(SystemMsg::PutDone { op, ok: true }, Payload::EMPTY);
            Ok(())
        }
        SystemMsg::Get {
            op,
            offset,
            len,
            at,
        } => {
            let ours = segment.slice_or_empty(0, st.seg_len.min(segment.len()));
            serve_get(sink, ours, (op, offset, len, at), bad)
        }
        SystemMsg::Atomic { op, offset, atomic } => {
            let ours = segment.slice_or_empty(0, st.seg_len.min(segment.len()));
            serve_atomic(sink, ours, op, offset, atomic)
        }
        SystemMsg::Atomics { op, count } => {
            let ours = segment.slice_or_empty(0, st.seg_len.min(segment.len()));
            let applied = apply_atomics(ours, payload, count as usize);
            sink.system(
                SystemMsg::AtomicDone {
                    op,
                    old: 0,
                    ok: applied.is_ok(),
                },
                Payload::EMPTY,
            );
            applied.map_err(|why| match why {
                Some((offset, len)) => misbehaved(src, Misbehavior::OutOfSegment { offset, len }),
                None => bad(),
            })
        }
        SystemMsg::PutRegions { op, count } => {
            let ours = segment.slice_or_empty(0, st.seg_len.min(segment.len()));
            let placed = place_regions(ours, payload, count as usize);
            sink.system(
                SystemMsg::PutDone {
                    op,
                    ok: placed.is_ok(),
                },
                Payload::EMPTY,
            );
            placed.map_err(|why| match why {
                Some((offset, len)) => misbehaved(src, Misbehavior::OutOfSegment { offset, len }),
                None => bad(),
            })
        }
        // A created segment's operations: one the target does not hold (freed while the
        // operation was on its way, or never created) is refused with nothing done, and the
        // initiator told; no misbehavior, since a free may race them. A range outside a
        // segment it holds is one: the initiator checked it against the published length.
        SystemMsg::PutAt { op, seg, offset } => {
            let Some(ours) = st.segments.own_bytes(seg) else {
                sink.system(SystemMsg::PutDone { op, ok: false }, Payload::EMPTY);
                return Ok(());
            };
            let len = payload.len() as u64;
            let placed = segment_range(offset, len, ours.len()).and_then(|r| {
                match payload {
                    Payload::Private(b) => ours.write(r.start, b),
                    Payload::Shared(s) => ours.copy_from(r.start, s),
                }
                .ok()
            });
            let ok = placed.is_some();
            sink.system(SystemMsg::PutDone { op, ok }, Payload::EMPTY);
            placed.ok_or_else(|| misbehaved(src, Misbehavior::OutOfSegment { offset, len }))
        }
        SystemMsg::GetAt {
            op,
            seg,
            offset,
            len,
            at,
        } => {
            let refuse = |sink: &mut ReplySink<'_>| {
                sink.system(SystemMsg::GetData { op, at, ok: false }, Payload::EMPTY)
            };
            if len as usize > sink.out.limits.max_medium {
                refuse(sink);
                return Err(bad());
            }
            let Some(ours) = st.segments.own_bytes(seg) else {
                refuse(sink);
                return Ok(());
            };
            serve_get(sink, ours, (op, offset, len, at), bad)
        }
        SystemMsg::AtomicAt { op, offset, atomic } => {
            let refuse = |sink: &mut ReplySink<'_>| {
                let done = SystemMsg::AtomicDone {
                    op,
                    old: 0,
                    ok: false,
                };
                sink.system(done, Payload::EMPTY)
            };
            let Some(id) = segment_id_in(payload)? else {
                refuse(sink);
                return Err(bad());
            };
            let Some(ours) = st.segments.own_bytes(id) else {
                refuse(sink);
                return Ok(());
            };
            serve_atomic(sink, ours, op, offset, atomic)
        }
        SystemMsg::Exit { code } => {
            *st.exit_requested = Some(code);
            Ok(())
        }
        SystemMsg::Collective {
            team,
            seq,
            step,
            kind,
            root,
            desc,
        } => {
            *st.changes = st.changes.wrapping_add(1);
            // A Short's bytes are in its arguments.
            let mut inline = [0u8; crate::protocol::MAX_INLINE_STEP_BYTES];
            let payload = match hdr.kind {
                AmKind::Short => {
                    Payload::Private(crate::protocol::inline_step_bytes(args, &mut inline))
                }
                _ => payload,
            };
            st.teams.arrive(
                src,
                (team, seq, step, kind, root, desc),
                payload,
                sink.out.limits.max_medium,
            )
        }
        SystemMsg::Ack
        | SystemMsg::Acks { .. }
        | SystemMsg::PutDone { .. }
        | SystemMsg::GetData { .. }
        | SystemMsg::AtomicDone { .. } => Err(bad()),
    }
}

/// Answers a get (`op`, `offset`, `len`, `at`) from `ours`, a segment this rank holds: the
/// bytes straight from it (the transport copies the view once), or a refusal and the
/// peer's misbehavior: a range outside it, or (`bad`) more than one reply can carry.
fn serve_get(
    sink: &mut ReplySink<'_>,
    ours: SharedBytes<'_>,
    (op, offset, len, at): (u32, u64, u32, u64),
    bad: impl FnOnce() -> AmError,
) -> Result<(), AmError> {
    match segment_range(offset, len as u64, ours.len()) {
        Some(r) if r.len() <= sink.out.limits.max_medium => {
            let data = ours.slice(r.start, r.len()).map_err(shm_err)?;
            let done = SystemMsg::GetData { op, at, ok: true };
            sink.system(done, Payload::Shared(data));
            Ok(())
        }
        in_segment => {
            sink.system(SystemMsg::GetData { op, at, ok: false }, Payload::EMPTY);
            Err(match in_segment {
                Some(_) => bad(),
                None => misbehaved(
                    sink.src,
                    Misbehavior::OutOfSegment {
                        offset,
                        len: len as u64,
                    },
                ),
            })
        }
    }
}

/// Applies a remote atomic (`op`) to the word at `offset` of `ours`, a segment this rank
/// holds, and answers with its old value; a word outside it or misaligned is refused, and
/// the peer's misbehavior.
fn serve_atomic(
    sink: &mut ReplySink<'_>,
    ours: SharedBytes<'_>,
    op: u32,
    offset: u64,
    atomic: crate::atomic::Atomic,
) -> Result<(), AmError> {
    let applied = usize::try_from(offset)
        .map_err(|_| Refused::OutOfBounds)
        .and_then(|o| atomic.apply(ours, o));
    let (old, ok) = applied.map_or((0, false), |old| (old, true));
    sink.system(SystemMsg::AtomicDone { op, old, ok }, Payload::EMPTY);
    if ok {
        Ok(())
    } else {
        let len = atomic.width().bytes() as u64;
        Err(misbehaved(
            sink.src,
            Misbehavior::OutOfSegment { offset, len },
        ))
    }
}

/// Writes the regions of a [`SystemMsg::PutRegions`] payload into `segment`, after checking
/// them all: nothing is written unless the `count` entries are there and their lengths add
/// up to the bytes after them (else `Err(None)`), and every region is inside the segment
/// (else `Err(Some((offset, len)))` of the first that is not). The entries are read once
/// into a private copy: a shared payload a peer may still write is never checked in one
/// read and used in another.
fn place_regions(
    segment: SharedBytes<'_>,
    payload: Payload<'_>,
    count: usize,
) -> Result<(), Option<(u64, u64)>> {
    let head = count.checked_mul(REGION_ENTRY_LEN).ok_or(None)?;
    if head > payload.len() {
        return Err(None);
    }
    let mut entries = vec![0u8; head];
    match payload {
        Payload::Private(b) => entries.copy_from_slice(&b[..head]),
        Payload::Shared(s) => s.read(0, &mut entries).map_err(|_| None)?,
    }
    let regions = || {
        entries
            .chunks_exact(REGION_ENTRY_LEN)
            .map(|e| read_region_entry(e.try_into().expect("chunks of the entry length")))
    };
    let mut total = 0u64;
    for (offset, len) in regions() {
        total += u64::from(len);
        if segment_range(offset, u64::from(len), segment.len()).is_none() {
            return Err(Some((offset, u64::from(len))));
        }
    }
    if total != (payload.len() - head) as u64 {
        return Err(None);
    }
    let mut at = head;
    for (offset, len) in regions() {
        let len = len as usize;
        // Checked above: inside the segment, and inside the payload.
        let written = match payload {
            Payload::Private(b) => segment.write(offset as usize, &b[at..at + len]),
            Payload::Shared(s) => s
                .slice(at, len)
                .and_then(|from| segment.copy_from(offset as usize, from)),
        };
        written.map_err(|_| Some((offset, len as u64)))?;
        at += len;
    }
    Ok(())
}

/// Applies the `count` atomics of a [`SystemMsg::Atomics`] payload to `segment`, in order,
/// after checking them all: none is applied unless every one is well formed (else
/// `Err(None)`) and names an aligned word inside the segment (else `Err(Some((offset, len)))`
/// of the first that does not).
fn apply_atomics(
    segment: SharedBytes<'_>,
    payload: Payload<'_>,
    count: usize,
) -> Result<(), Option<(u64, u64)>> {
    const MAX: usize = MAX_BATCH_ATOMICS as usize * ATOMIC_ENTRY_LEN;
    let n = count * ATOMIC_ENTRY_LEN;
    if n > MAX || payload.len() != n {
        return Err(None);
    }
    let mut raw = [0u8; MAX];
    match payload {
        Payload::Private(b) => raw[..n].copy_from_slice(b),
        Payload::Shared(s) => s.read(0, &mut raw[..n]).map_err(|_| None)?,
    }
    let entries = || {
        raw[..n].chunks_exact(ATOMIC_ENTRY_LEN).map(|e| {
            let e: &[u8; ATOMIC_ENTRY_LEN] = e.try_into().expect("chunks of the entry length");
            read_atomic_entry(e)
        })
    };
    for e in entries() {
        let (offset, atomic) = e.ok_or(None)?;
        let outside = Some((offset, atomic.width().bytes() as u64));
        let at = usize::try_from(offset).map_err(|_| outside)?;
        atomic.check(at, segment.len()).map_err(|_| outside)?;
    }
    for (offset, atomic) in entries().flatten() {
        // Checked above: in the segment and aligned.
        let _ = atomic.apply(segment, offset as usize);
    }
    Ok(())
}

/// What one [`Endpoint::poll_one`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Polled {
    /// Nothing had arrived (the implicit replies owed went out).
    Idle,
    /// One message was handled.
    Handled,
    /// A peer ended the job with this code ([`crate::Node::exit`]): the driver ends this
    /// rank's process with it.
    Exit(i32),
}

impl<H: Threading> Endpoint<H> {
    /// One step of progress: sends the replies the device refused earlier, then hands at
    /// most one delivered message to [`Endpoint::handle`]; when nothing has arrived, sends
    /// the implicit replies owed ([`Endpoint::flush_acks`]). What an error says about a
    /// peer is recorded ([`Endpoint::absorb`]); a departure is not an error of the poll that
    /// found it. The message that caused an error is dropped, and polling can go on.
    #[inline(always)]
    pub fn poll_one<T: Transport + ?Sized>(&mut self, t: &mut T) -> Result<Polled, AmError> {
        match self.poll_raw(t) {
            Err(e) => self.poll_failed(e),
            ok => ok,
        }
    }

    #[inline(always)]
    fn poll_raw<T: Transport + ?Sized>(&mut self, t: &mut T) -> Result<Polled, AmError> {
        self.flush(t)?;
        // The handler's error is kept aside rather than carried out through the transport's
        // result: the common, error-free message then moves nothing.
        let mut failed = None;
        let handled = t.poll_recv(|d, segment, tx| {
            if let Err(e) = self.handle(d, segment, tx) {
                failed = Some(e);
            }
        })?;
        if !self.segments.retired.is_empty() {
            self.retire_segments(t);
        }
        if let Some(site) = &self.handlers.typed_site {
            if site.transit.has_queued() {
                self.send_typed_queue(t);
            }
        }
        if handled.is_none() {
            if self.acks_owed() {
                self.flush_acks(t)?;
            }
            t.flush();
            return Ok(Polled::Idle);
        }
        if let Some(code) = self.exit_requested {
            return Ok(Polled::Exit(code));
        }
        match failed {
            None => Ok(Polled::Handled),
            Some(e) => Err(e),
        }
    }

    #[cold]
    #[inline(never)]
    fn poll_failed(&mut self, e: AmError) -> Result<Polled, AmError> {
        match self.absorb(e) {
            None => Ok(Polled::Idle),
            Some(e) => Err(e),
        }
    }

    /// Handles one delivered message: runs its handler, sends the reply or the implicit one
    /// through `tx` (the transport's sender for this delivery). An error names the peer
    /// and what it did; the message is dropped and the endpoint goes on.
    #[inline]
    pub fn handle(
        &mut self,
        d: Delivery<'_>,
        segment: SharedBytes<'_>,
        tx: &mut dyn Tx,
    ) -> Result<(), AmError> {
        let src = d.src;
        let route = d.route;
        if src >= self.size {
            return Err(AmError::InvalidRank {
                rank: src,
                size: self.size,
            });
        }
        let total = d.bytes.len();
        // The common case, a user Short or Medium: its header is one word read once (from
        // shared memory, so what is checked is what is used), its arguments copied out after
        // it, its payload lent where it lies; nothing to place.
        let word = match d.bytes {
            Received::Shared(s) => s
                .load_u64(0)
                .ok()
                .map(|w| u64::from_le_bytes(w.to_ne_bytes())),
            Received::Private(b) => b.first_chunk().map(|w| u64::from_le_bytes(*w)),
        };
        if let Some(hdr) = word.and_then(|w| Header::user_short(w, total)) {
            let n = hdr.nargs as usize;
            // Filled only when there are arguments: no zeroing on the argument-less path.
            let mut argbuf: [u32; MAX_ARGS];
            let args: &[u32] = if n == 0 {
                &[]
            } else {
                argbuf = [0u32; MAX_ARGS];
                let mut raw = [0u8; 4 * MAX_ARGS];
                let raw = &mut raw[..4 * n];
                match d.bytes {
                    Received::Shared(s) => s.read(BASE_HEADER_LEN, raw).map_err(shm_err)?,
                    // `total` is the header and exactly these arguments (checked), so the
                    // slice needs no second bounds check (which `args_after_word` makes).
                    Received::Private(b) => raw.copy_from_slice(&b[BASE_HEADER_LEN..total]),
                }
                for (a, b) in argbuf.iter_mut().zip(raw.chunks_exact(4)) {
                    *a = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                &argbuf[..n]
            };
            let grant = self.take_credits(src, &hdr, &[])?;
            return self.dispatch_user(
                src,
                route,
                &hdr,
                args,
                Payload::EMPTY,
                None,
                None,
                grant,
                segment,
                SegmentId::ZERO,
                tx,
            );
        }
        if let Some(hdr) = word.and_then(|w| Header::user_medium(w, total)) {
            return self.handle_medium(src, route, &hdr, d.bytes, segment, tx);
        }
        // The head is parsed from private memory: a copy of it when the transport lends
        // shared memory, so what was checked is what is used (no double fetch).
        let mut copy = [0u8; MAX_HEAD_LEN];
        let head: &[u8] = match d.bytes {
            Received::Private(b) => b,
            Received::Shared(s) => {
                // The base header first (one word), then only as many bytes as it says the
                // head has; decode_prefix checks the copy either way.
                let n = total.min(BASE_HEADER_LEN);
                if n == BASE_HEADER_LEN {
                    // One word load (the common case: a slot starts word-aligned).
                    let word = s.load_u64(0).map_err(shm_err)?;
                    copy[..n].copy_from_slice(&word.to_ne_bytes());
                } else {
                    s.read(0, &mut copy[..n]).map_err(shm_err)?;
                }
                let want = wire::head_len_hint(&copy[..n]).min(total);
                if want > n {
                    s.read(n, &mut copy[n..want]).map_err(shm_err)?;
                }
                &copy[..want.max(n)]
            }
        };
        let hdr = Header::decode_prefix(head, total, !d.payload_placed)
            .map_err(|e| misbehaved(src, Misbehavior::Malformed(e)))?;
        let mut argbuf = [0u32; MAX_ARGS];
        let args = hdr.read_args(head, &mut argbuf);
        let body = body_after(d.bytes, hdr.head_len())?;
        let grant = self.take_credits(src, &hdr, args)?;
        if hdr.kind == AmKind::Long && wire::in_segment(head) {
            return self.long_in_segment(src, route, &hdr, args, body, grant, segment, tx);
        }
        // A Long payload carried inline is copied into the segment only once the message is
        // accepted, so a rejected message leaves the segment as it was.
        let (payload, long, inline_long) = match hdr.kind {
            AmKind::Short => (Payload::Private(&[]), None, None),
            AmKind::Medium => (body, None, None),
            AmKind::Long => {
                match segment_range(hdr.long_offset, hdr.payload_len as u64, segment.len()) {
                    Some(r) => (
                        Payload::Shared(segment.slice(r.start, r.len()).map_err(shm_err)?),
                        Some(r),
                        (!d.payload_placed).then_some(body),
                    ),
                    None => return self.out_of_segment(src, route, &hdr, args, grant, tx),
                }
            }
        };
        if hdr.system {
            return self.dispatch_system(
                src,
                route,
                &hdr,
                args,
                payload,
                segment,
                long,
                inline_long,
                grant,
                tx,
            );
        }
        self.dispatch_user(
            src,
            route,
            &hdr,
            args,
            payload,
            long,
            inline_long,
            grant,
            segment,
            SegmentId::ZERO,
            tx,
        )
    }

    /// Credits first, whatever becomes of the message: a reply returns what its request
    /// took; a request learns what its reply (explicit or implicit) will grant.
    #[inline(always)]
    pub(super) fn take_credits(
        &mut self,
        src: Rank,
        hdr: &Header,
        args: &[u32],
    ) -> Result<u8, AmError> {
        match hdr.category {
            Category::Reply => {
                // ACKS answers as many requests as it says; malformed, it counts as one
                // reply, like any other, and its decoding reports it.
                let answered = match (hdr.system && hdr.handler == opcode::ACKS, args) {
                    (true, &[count, granted]) => self.credits.on_replies(src, count, granted),
                    _ => self.credits.on_reply(src, hdr.credit),
                };
                if !answered {
                    return Err(misbehaved(src, Misbehavior::ReplyWithoutRequest));
                }
                Ok(0)
            }
            Category::Request => {
                let grant = self.credits.reply_grant(src, hdr.credit);
                // Only a custom policy lends: the static one's batches are fixed.
                if let Policy::Custom(p) = &self.credits {
                    if let (Some(acks), Some(lent)) = (self.replies.acks.as_mut(), p.lent_to(src)) {
                        acks.lent(src, lent);
                    }
                }
                Ok(grant)
            }
        }
    }

    /// Runs the user handler of an accepted message (its credits taken), placing an inline
    /// Long payload first; a request's handler gets the reply path.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn dispatch_user(
        &mut self,
        src: Rank,
        route: Route,
        hdr: &Header,
        args: &[u32],
        payload: Payload<'_>,
        long: Option<Range<usize>>,
        inline_long: Option<Payload<'_>>,
        grant: u8,
        segment: SharedBytes<'_>,
        long_segment: SegmentId,
        tx: &mut dyn Tx,
    ) -> Result<(), AmError> {
        let id = hdr.handler as usize;
        let long_offset = long.as_ref().map(|r| r.start);
        let Endpoint {
            handlers,
            replies,
            scratch,
            ..
        } = self;
        let msg = |scratch| Msg {
            src,
            handler: HandlerId(hdr.handler),
            args,
            payload,
            long: long_offset,
            long_segment,
            segment,
            scratch: Cell::new(Some(scratch)),
            copied: OnceCell::new(),
        };
        match hdr.category {
            Category::Reply => match &mut handlers.fns[id] {
                Some(HandlerFn::Reply(kind, f)) if *kind == hdr.kind => {
                    place(segment, &long, inline_long)?;
                    f(msg(scratch));
                    Ok(())
                }
                _ => Err(unknown_handler(src, hdr)),
            },
            Category::Request => {
                let f = match &mut handlers.fns[id] {
                    Some(HandlerFn::Request(kind, f)) if *kind == hdr.kind => f,
                    _ => {
                        let e = unknown_handler(src, hdr);
                        return refuse_request(replies, tx, src, route, grant, e);
                    }
                };
                if let Err(e) = place(segment, &long, inline_long) {
                    return refuse_request(replies, tx, src, route, grant, e);
                }
                // Afresh, also after a handler that panicked (a driver may catch it and poll
                // on): its reply must not pass for this one's.
                replies.replied = false;
                replies.error = None;
                let mut sink = ReplySink::new(src, route, grant, true, &mut *tx, replies);
                f(
                    msg(scratch),
                    Token {
                        src,
                        sink: &mut sink,
                    },
                );
                match (replies.replied, &replies.error, replies.acks.as_mut()) {
                    // Replied, and the reply went out or waits in order: nothing to finish.
                    (true, None, _) => {
                        replies.replied = false;
                        Ok(())
                    }
                    // No reply: one more owed to the requester, sent with others.
                    (false, None, Some(acks)) => match acks.owe(src, grant, route) {
                        None => Ok(()),
                        Some(owed) => {
                            ReplySink::new(src, route, grant, true, tx, replies).send_acks(&owed);
                            match replies.error.take() {
                                None => Ok(()),
                                Some(e) => Err(e),
                            }
                        }
                    },
                    _ => ReplySink::new(src, route, grant, true, tx, replies).finish(),
                }
            }
        }
    }

    /// [`handle`](Self::handle) of a user Medium whose head `hdr` was decoded from its first
    /// word: arguments copied out, the payload lent where it lies. Inlined into the user
    /// message's path, where its decoded head and lent bytes stay in registers; the Short's
    /// path does not pay for it.
    #[inline(always)]
    pub(super) fn handle_medium(
        &mut self,
        src: Rank,
        route: Route,
        hdr: &Header,
        bytes: Received<'_>,
        segment: SharedBytes<'_>,
        tx: &mut dyn Tx,
    ) -> Result<(), AmError> {
        // Filled only when there are arguments, as for a Short.
        let mut argbuf: [u32; MAX_ARGS];
        let args: &[u32] = if hdr.nargs == 0 {
            &[]
        } else {
            argbuf = [0u32; MAX_ARGS];
            args_after_word(bytes, hdr.nargs, &mut argbuf)?
        };
        let payload = body_after(bytes, hdr.head_len())?;
        let grant = self.take_credits(src, hdr, args)?;
        self.dispatch_user(
            src,
            route,
            hdr,
            args,
            payload,
            None,
            None,
            grant,
            segment,
            SegmentId::ZERO,
            tx,
        )
    }

    /// A Long into this rank's created segment, whose payload its initiator wrote before
    /// sending it (the message carries the segment's id): the handler runs with the payload
    /// where it lies. A segment this rank does not hold is misbehavior, as a range outside
    /// it is: the initiator wrote the payload into it first, and a free waits for every
    /// member of the team, so only a program that frees a segment while a Long into it is
    /// on its way meets this.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    fn long_in_segment(
        &mut self,
        src: Rank,
        route: Route,
        hdr: &Header,
        args: &[u32],
        body: Payload<'_>,
        grant: u8,
        segment: SharedBytes<'_>,
        tx: &mut dyn Tx,
    ) -> Result<(), AmError> {
        let Some(id) = segment_id_in(body)? else {
            let e = misbehaved(
                src,
                Misbehavior::Malformed(WireError::LengthMismatch {
                    announced: wire::SEGMENT_ID_LEN as u32,
                    present: body.len(),
                }),
            );
            return refuse_request(&mut self.replies, tx, src, route, grant, e);
        };
        let id = SegmentId::new(id);
        // Its own handle on the mapping: the handler runs with `self` borrowed.
        let Some(ours) = self.segments.own_share(id) else {
            let e = misbehaved(src, Misbehavior::UnknownSegment { id });
            return refuse_request(&mut self.replies, tx, src, route, grant, e);
        };
        let bytes = ours.byte_area();
        let Some(r) = segment_range(hdr.long_offset, u64::from(hdr.payload_len), bytes.len())
        else {
            return self.out_of_segment(src, route, hdr, args, grant, tx);
        };
        let payload = Payload::Shared(bytes.slice(r.start, r.len()).map_err(shm_err)?);
        self.dispatch_user(
            src,
            route,
            hdr,
            args,
            payload,
            Some(r),
            None,
            grant,
            segment,
            id,
            tx,
        )
    }

    /// A Long whose range lies outside this rank's segment: rejected, and a request is still
    /// answered (a put's initiator is told, so it does not hang).
    #[cold]
    #[inline(never)]
    pub(super) fn out_of_segment(
        &mut self,
        src: Rank,
        route: Route,
        hdr: &Header,
        args: &[u32],
        grant: u8,
        tx: &mut dyn Tx,
    ) -> Result<(), AmError> {
        let rejected = misbehaved(
            src,
            Misbehavior::OutOfSegment {
                offset: hdr.long_offset,
                len: hdr.payload_len as u64,
            },
        );
        if hdr.category == Category::Request {
            let mut sink = ReplySink::new(src, route, grant, false, tx, &mut self.replies);
            if hdr.system {
                if let Ok(SystemMsg::Put { op }) =
                    SystemMsg::decode(hdr.category, hdr.kind, hdr.handler, args)
                {
                    // The initiator waits for this put: tell it, don't leave it hanging.
                    sink.system(SystemMsg::PutDone { op, ok: false }, Payload::EMPTY);
                }
            }
            sink.finish()?;
        }
        Err(rejected)
    }

    /// A core-internal message (start-up, barrier, put/get, exit).
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    pub(super) fn dispatch_system(
        &mut self,
        src: Rank,
        route: Route,
        hdr: &Header,
        args: &[u32],
        payload: Payload<'_>,
        segment: SharedBytes<'_>,
        long: Option<Range<usize>>,
        inline_long: Option<Payload<'_>>,
        grant: u8,
        tx: &mut dyn Tx,
    ) -> Result<(), AmError> {
        match hdr.category {
            Category::Reply => self.system_reply(src, hdr, args, payload),
            Category::Request => {
                let mut sink = ReplySink::new(src, route, grant, false, tx, &mut self.replies);
                // Split borrows: the system state is disjoint from the sink's fields.
                let result = system_request(
                    &mut SystemState {
                        rank: self.rank,
                        seg_len: self.seg_len,
                        hello: &mut self.hello,
                        hello_digest: self.hello_digest,
                        hello_signature: &self.hello_signature,
                        hello_typed: &self.hello_typed,
                        barrier_arrivals: &mut self.barrier_arrivals,
                        teams: &mut self.teams,
                        changes: &mut self.changes,
                        exit_requested: &mut self.exit_requested,
                        segments: &self.segments,
                    },
                    &mut sink,
                    hdr,
                    args,
                    (segment, payload),
                    (&long, inline_long),
                );
                sink.finish()?;
                result
            }
        }
    }

    pub(super) fn system_reply(
        &mut self,
        src: Rank,
        hdr: &Header,
        args: &[u32],
        medium: Payload<'_>,
    ) -> Result<(), AmError> {
        let bad = || misbehaved(src, Misbehavior::BadSystemMessage(hdr.handler));
        let msg = SystemMsg::decode(hdr.category, hdr.kind, hdr.handler, args)
            .map_err(|m| misbehaved(src, m))?;
        match msg {
            SystemMsg::Ack | SystemMsg::Acks { .. } => Ok(()),
            SystemMsg::AtomicDone { op, old, ok } => {
                // An atomic's answer, or a put-with-signal's once its signal went out.
                let slot = self
                    .live_op(op, src)
                    .filter(|s| s.atomic.is_some() || s.signal.is_some_and(|_| s.sent >= s.len))
                    .ok_or_else(bad)?;
                slot.outstanding -= 1;
                if ok {
                    slot.word = old;
                } else {
                    slot.error.get_or_insert(refused(src, slot.seg));
                }
                // A detached one's result is nobody's: the slot is free again (an error
                // was checked away at the initiator, or is a loss reported anyway).
                self.settle(op);
                Ok(())
            }
            SystemMsg::PutDone { op, ok } => {
                let slot = self
                    .live_op(op, src)
                    .filter(|s| s.atomic.is_none())
                    .ok_or_else(bad)?;
                if !ok && slot.error.is_none() {
                    slot.error = Some(refused(src, slot.seg));
                }
                slot.outstanding = slot.outstanding.saturating_sub(1);
                self.settle(op);
                Ok(())
            }
            SystemMsg::GetData { op, at, ok } => {
                let slot = self
                    .live_op(op, src)
                    .filter(|s| s.atomic.is_none())
                    .ok_or_else(bad)?;
                slot.outstanding = slot.outstanding.saturating_sub(1);
                let landed = if !ok {
                    if slot.error.is_none() {
                        slot.error = Some(refused(src, slot.seg));
                    }
                    Ok(())
                } else {
                    match segment_range(at, medium.len() as u64, slot.data.len()) {
                        Some(r) => match medium {
                            Payload::Private(b) => {
                                slot.data[r].copy_from_slice(b);
                                Ok(())
                            }
                            Payload::Shared(s) => s.read(0, &mut slot.data[r]).map_err(shm_err),
                        },
                        None => Err(bad()),
                    }
                };
                self.settle(op);
                landed
            }
            _ => Err(bad()),
        }
    }
}
