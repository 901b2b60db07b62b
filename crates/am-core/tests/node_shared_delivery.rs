//! Messages lent in memory peers may write (`Received::Shared`, as the shared-memory NICs lend
//! their slots): the core parses a private copy of the head, hands the payload to handlers as
//! a view or, on `payload()`, as a private copy, and places an inline Long by copies.

use am_core::Local;
use std::cell::RefCell;
use std::rc::Rc;

use am_core::wire::{encode_head, Header, MAX_HEAD_LEN};
use am_core::{
    AmError, AmKind, Category, Config, Delivery, HandlerId, Handlers, Limits, Misbehavior, Node,
    Outgoing, Rank, Received, SendError, SharedBytes, Transport, TransportError, Tx,
};
use am_shm::Segment;

/// Messages waiting for a [`SlotLoop`]: what it sent itself, or what a test injects.
type Inbox = Rc<RefCell<Vec<Vec<u8>>>>;

/// One rank on its own: each message it sends itself is written into a slot of a heap segment
/// (memory a peer could write) and lent from there.
struct SlotLoop {
    slot: Segment,
    segment: Segment,
    inbox: Inbox,
}

impl SlotLoop {
    fn new(inbox: Inbox) -> SlotLoop {
        SlotLoop {
            slot: Segment::heap(0, 8192).unwrap(),
            segment: Segment::heap(0, 4096).unwrap(),
            inbox,
        }
    }
}

impl Tx for SlotLoop {
    fn try_send(&mut self, dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        assert_eq!(dest, 0);
        let mut m = msg.head.to_vec();
        msg.payload.append_to(&mut m);
        self.inbox.borrow_mut().push(m);
        Ok(())
    }
}

impl Transport for SlotLoop {
    fn rank(&self) -> Rank {
        0
    }
    fn size(&self) -> u32 {
        1
    }
    fn info(&self) -> am_core::NicInfo {
        let limits = Limits {
            max_args: 16,
            max_medium: 4096,
            max_long: 4096,
            max_credits: 64,
        };
        am_core::NicInfo::new("slot-loop", limits)
    }
    fn segment(&self) -> SharedBytes<'_> {
        self.segment.byte_area()
    }
    fn poll_recv<R>(
        &mut self,
        f: impl FnOnce(Delivery<'_>, SharedBytes<'_>, &mut dyn Tx) -> R,
    ) -> Result<Option<R>, TransportError> {
        let next = {
            let mut inbox = self.inbox.borrow_mut();
            (!inbox.is_empty()).then(|| inbox.remove(0))
        };
        let Some(bytes) = next else {
            return Ok(None);
        };
        self.slot.byte_area().write(0, &bytes).unwrap();
        let d = Delivery {
            src: 0,
            bytes: Received::Shared(self.slot.view(0, bytes.len()).unwrap()),
            payload_placed: false,
            route: am_core::Route::NONE,
        };
        let mut replies = Inboxed(self.inbox.clone());
        Ok(Some(f(d, self.segment.byte_area(), &mut replies)))
    }
}

thread_local! {
    /// Replies this thread's node sent with a payload still in shared memory.
    static SHARED_REPLIES: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The sending half lent to handlers: replies join the inbox.
struct Inboxed(Inbox);

impl Tx for Inboxed {
    fn try_send(&mut self, _dest: Rank, msg: &Outgoing<'_>) -> Result<(), SendError> {
        if let am_core::Payload::Shared(_) = msg.payload {
            SHARED_REPLIES.with(|c| c.set(c.get() + 1));
        }
        let mut m = msg.head.to_vec();
        msg.payload.append_to(&mut m);
        self.0.borrow_mut().push(m);
        Ok(())
    }
}

#[derive(Default)]
struct Seen {
    medium: Vec<u8>,
    medium_view: Option<usize>,
    echoed: Vec<u8>,
    long: Vec<u8>,
    long_at: Option<usize>,
}

fn node(seen: &Rc<RefCell<Seen>>, inbox: &Inbox) -> Node<SlotLoop, Local> {
    let mut h = Handlers::local();
    let s = seen.clone();
    h.request(HandlerId(1), "medium", AmKind::Medium, move |m, _t| {
        let mut s = s.borrow_mut();
        // The view first (no copy), then the copy, twice: the same bytes each time.
        s.medium_view = m.payload_view().map(|v| v.len());
        assert_eq!(m.payload_len(), m.payload().len());
        s.medium = m.payload().to_vec();
        assert_eq!(m.payload(), &s.medium[..]);
    })
    .unwrap();
    let s = seen.clone();
    h.request(HandlerId(2), "long", AmKind::Long, move |m, _t| {
        let mut s = s.borrow_mut();
        s.long_at = m.long_offset();
        s.long = m.payload().to_vec();
        let view = m.payload_view().expect("a Long is in the segment");
        assert_eq!(view.to_vec(), s.long);
        assert_eq!(m.segment().len(), 4096);
    })
    .unwrap();
    h.request(HandlerId(3), "echo", AmKind::Medium, |m, t| {
        t.reply_medium(HandlerId(4), m.args(), m.payload_ref())
            .unwrap();
    })
    .unwrap();
    let s = seen.clone();
    h.reply(HandlerId(4), "echoed", AmKind::Medium, move |m| {
        s.borrow_mut().echoed = m.payload().to_vec();
    })
    .unwrap();
    Node::new(SlotLoop::new(inbox.clone()), h, Config::default()).unwrap()
}

/// A handler replies with the payload where it was received: the transport is handed the
/// shared view (to copy once, straight to where the reply goes), and the bytes arrive.
#[test]
fn a_reply_echoes_a_shared_payload_without_a_private_copy() {
    let seen = Rc::new(RefCell::new(Seen::default()));
    let inbox = Inbox::default();
    let mut node = node(&seen, &inbox);
    let data: Vec<u8> = (0..777).map(|i| (i * 3) as u8).collect();
    node.request_medium(0, HandlerId(3), &[7], &data).unwrap();
    node.quiesce().unwrap();
    assert_eq!(seen.borrow().echoed, data);
    assert_eq!(SHARED_REPLIES.with(|c| c.get()), 1);
}

#[test]
fn shared_mediums_are_lent_as_views_and_copied_on_demand() {
    let seen = Rc::new(RefCell::new(Seen::default()));
    let inbox = Inbox::default();
    let mut node = node(&seen, &inbox);
    node.request_medium(0, HandlerId(1), &[1, 2, 3], b"hello, shared world")
        .unwrap();
    node.quiesce().unwrap();
    let s = seen.borrow();
    assert_eq!(s.medium, b"hello, shared world");
    assert_eq!(s.medium_view, Some(19));
}

#[test]
fn inline_longs_in_shared_memory_are_placed_by_copies() {
    let seen = Rc::new(RefCell::new(Seen::default()));
    let inbox = Inbox::default();
    let mut node = node(&seen, &inbox);
    let data: Vec<u8> = (0..300).map(|i| i as u8).collect();
    node.request_long(0, HandlerId(2), &[], &data, 1001)
        .unwrap();
    node.quiesce().unwrap();
    let s = seen.borrow();
    assert_eq!(s.long_at, Some(1001));
    assert_eq!(s.long, data);
    assert_eq!(node.segment().slice(1001, 300).unwrap().to_vec(), data);
}

/// A head whose announced length disagrees with the lent bytes is rejected from the private
/// copy; nothing runs and the node goes on.
#[test]
fn a_bad_shared_head_is_rejected_and_the_node_goes_on() {
    let seen = Rc::new(RefCell::new(Seen::default()));
    let inbox = Inbox::default();
    let mut node = node(&seen, &inbox);
    let mut h = [0u8; MAX_HEAD_LEN];
    let n = encode_head(Category::Request, AmKind::Medium, 1, &[], 10, &mut h);
    let mut bad = h[..n].to_vec();
    bad.extend_from_slice(&[9; 4]); // 4 bytes where 10 are announced
    inbox.borrow_mut().push(bad.clone());
    let err = node.poll().unwrap_err();
    assert!(
        matches!(
            err,
            AmError::PeerMisbehaved {
                peer: 0,
                what: Misbehavior::Malformed(_)
            }
        ),
        "{err:?}"
    );
    assert!(seen.borrow().medium.is_empty());
    assert!(Header::decode(&bad, true).is_err());
    node.request_medium(0, HandlerId(1), &[], b"after").unwrap();
    node.quiesce().unwrap();
    assert_eq!(seen.borrow().medium, b"after");
}
