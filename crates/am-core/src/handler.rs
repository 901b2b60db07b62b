//! The handler table, the message a handler sees, and the one-shot reply [`Token`].

use std::cell::{Cell, OnceCell};
use std::fmt;
use std::sync::Arc;

use crate::call::{Call, CallSite, Calls};
use crate::reply::Token;
use crate::transport::{Payload, SharedBytes};
use crate::types::Rank;
pub use crate::types::{AmKind, Category, HandlerId};

/// What a handler is told about the message that made it run.
///
/// The payload of a Medium is lent from the transport's receive buffer for the duration of
/// the call; the payload of a Long is already in the local segment at [`Msg::long_offset`].
/// Where that memory may be written by peers (a shared ring slot, the segment), it is a
/// [`SharedBytes`] view: [`Msg::payload`] copies it into private memory the first time it is
/// called (and only then), [`Msg::payload_view`] lends the view itself.
pub struct Msg<'a> {
    pub(crate) src: Rank,
    pub(crate) handler: HandlerId,
    pub(crate) args: &'a [u32],
    pub(crate) payload: Payload<'a>,
    pub(crate) long: Option<usize>,
    pub(crate) long_segment: crate::types::SegmentId,
    pub(crate) segment: SharedBytes<'a>,
    /// Private memory for the copy of a shared payload, taken by the first `payload()`.
    pub(crate) scratch: Cell<Option<&'a mut Vec<u8>>>,
    pub(crate) copied: OnceCell<&'a [u8]>,
}

impl<'a> Msg<'a> {
    /// The rank that sent this message.
    #[inline]
    pub fn src(&self) -> Rank {
        self.src
    }

    /// The handler that is running.
    #[inline]
    pub fn handler(&self) -> HandlerId {
        self.handler
    }

    /// The message's arguments (0..=16 words).
    #[inline]
    pub fn args(&self) -> &[u32] {
        self.args
    }

    /// The payload's length (a Medium's, or a Long's in the segment; 0 for a Short).
    #[inline]
    pub fn payload_len(&self) -> usize {
        self.payload.len()
    }

    /// The payload: a Medium's bytes, a Long's bytes in the local segment, empty for a Short.
    /// Bytes that peers may write (a shared receive slot, the segment) are copied into private
    /// memory on the first call, so what is returned cannot change under the caller; a
    /// handler that does not read the payload pays nothing. For a large Long, prefer
    /// [`payload_view`](Self::payload_view), which copies nothing.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        match self.payload {
            Payload::Private(b) => b,
            Payload::Shared(view) => self.copied.get_or_init(|| match self.scratch.take() {
                Some(buf) => {
                    view.read_into(buf);
                    buf
                }
                None => &[],
            }),
        }
    }

    /// The payload as a view, without a copy: a Long's bytes in the segment, or a Medium's in
    /// a shared receive buffer. `None` for a payload in private memory (use
    /// [`payload`](Self::payload), which then costs no copy either).
    #[inline]
    pub fn payload_view(&self) -> Option<SharedBytes<'a>> {
        match self.payload {
            Payload::Shared(view) => Some(view),
            Payload::Private(_) => None,
        }
    }

    /// The payload where it lies, without a copy: to echo or forward it with
    /// [`Token::reply_medium`] or [`Token::reply_long`], which then copy it once, straight
    /// from the receive buffer (or segment) to where the reply goes. ([`payload`](Self::payload)
    /// first copies a shared payload into private memory, so replying with it copies twice.)
    #[inline]
    pub fn payload_ref(&self) -> Payload<'a> {
        self.payload
    }

    /// Where a Long payload landed in its segment ([`Msg::long_segment`]); `None` for Short
    /// and Medium.
    #[inline]
    pub fn long_offset(&self) -> Option<usize> {
        self.long
    }

    /// The segment a Long payload landed in: [`SegmentId::ZERO`](crate::types::SegmentId::ZERO)
    /// (the local segment, [`Msg::segment`]) for a Long sent with `request_long`, the created
    /// segment named by a `request_long_to` ([`crate::endpoint::start::LongTo`]); `None` for
    /// Short and Medium. Its bytes are [`Msg::payload`] and [`Msg::payload_view`].
    #[inline]
    pub fn long_segment(&self) -> Option<crate::types::SegmentId> {
        self.long.map(|_| self.long_segment)
    }

    /// The local segment (what put, get and Long target on this rank): a view, since peers may
    /// write it at any time.
    #[inline]
    pub fn segment(&self) -> SharedBytes<'a> {
        self.segment
    }
}

impl fmt::Debug for Msg<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Msg")
            .field("src", &self.src)
            .field("handler", &self.handler)
            .field("args", &self.args)
            .field("payload_len", &self.payload_len())
            .field("long_offset", &self.long_offset())
            .field("long_segment", &self.long_segment())
            .finish()
    }
}

/// A request handler: runs at the target, may reply once through its token.
pub type RequestFn = dyn FnMut(Msg<'_>, Token<'_>);
/// A reply handler: runs at the requester; it has no way to send.
pub type ReplyFn = dyn FnMut(Msg<'_>);
/// A request handler that may move to another thread with its node.
pub type SendRequestFn = dyn FnMut(Msg<'_>, Token<'_>) + Send;
/// A reply handler that may move to another thread with its node.
pub type SendReplyFn = dyn FnMut(Msg<'_>) + Send;

/// Whether a handler table's closures may move to another thread, and with them the node
/// built on it: [`Sendable`] (the default: `Send` closures, so a [`crate::Node`] is `Send`
/// whenever its transport is) or [`Local`] (any closure, such as one that holds an `Rc`; the
/// node then stays on the thread that made it). Sealed: these two are the only ones.
pub trait Threading: sealed::Sealed + 'static {
    /// The boxed request handler.
    type Request: ?Sized + for<'a, 'b> FnMut(Msg<'a>, Token<'b>);
    /// The boxed reply handler.
    type Reply: ?Sized + for<'a> FnMut(Msg<'a>);
    /// The table of typed messages' code that the reserved handlers share.
    #[doc(hidden)]
    type TypedTable: Clone + Default;
    /// The tasks of async typed handlers ([`Handlers::typed_async`]).
    #[doc(hidden)]
    type Tasks: crate::typed::tasks::TaskQueue;
}

/// Handlers that are `Send` ([`Handlers::new`]): the table, the endpoint and the node may
/// move to another thread.
#[derive(Debug)]
pub enum Sendable {}

/// Handlers of any kind, `Send` or not ([`Handlers::local`]): the node stays on its thread.
///
/// A node of `Send` handlers is `Send`,
///
/// ```
/// fn is_send<T: Send>() {}
///
/// fn main() {
///     is_send::<amnet::Node<amnet::Loopback, amnet::Sendable>>();
/// }
/// ```
///
/// and one of local handlers (which may hold an `Rc`) is not:
///
/// ```compile_fail,E0277
/// fn is_send<T: Send>() {}
/// is_send::<amnet::Node<amnet::Loopback, amnet::Local>>();
/// ```
#[derive(Debug)]
pub enum Local {}

impl Threading for Sendable {
    type Request = SendRequestFn;
    type Reply = SendReplyFn;
    type TypedTable = Arc<std::sync::Mutex<TypedMap<crate::typed::SendTypedFn>>>;
    type Tasks = crate::typed::tasks::SendTasks;
}

impl Threading for Local {
    type Request = RequestFn;
    type Reply = ReplyFn;
    type TypedTable = std::rc::Rc<std::cell::RefCell<TypedMap<crate::typed::TypedFn>>>;
    type Tasks = crate::typed::tasks::LocalTasks;
}

/// Typed messages' code by type id.
#[doc(hidden)]
pub type TypedMap<F> = rustc_hash::FxHashMap<u64, Box<F>>;

/// The handlers a table reserves for typed messages, their shared table of code, and the
/// state of values larger than a Medium.
pub(crate) struct TypedSite<H: Threading> {
    pub(crate) call: HandlerId,
    pub(crate) post: HandlerId,
    /// A part of a value larger than a Medium ([`crate::typed::Transit`]).
    pub(crate) part: HandlerId,
    /// An answer too large for a reply, sent as a request.
    pub(crate) answer: HandlerId,
    table: H::TypedTable,
    pub(crate) transit: Arc<crate::typed::Transit>,
    /// The tasks of async typed handlers.
    pub(crate) tasks: H::Tasks,
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Sendable {}
    impl Sealed for super::Local {}
}

/// A registered handler with its kind, so a dispatch checks category and kind in the one
/// lookup that finds the function.
pub(crate) enum HandlerFn<H: Threading> {
    Request(AmKind, Box<H::Request>),
    Reply(AmKind, Box<H::Reply>),
}

/// What the table knows of a handler, identical on every rank (checked at start-up).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerInfo {
    /// A name for diagnostics and the start-up digest.
    pub name: String,
    /// Request or reply.
    pub category: Category,
    /// Short, Medium or Long.
    pub kind: AmKind,
}

/// The handler table a node is built with: up to 256 handlers, each registered as request or
/// reply and as Short, Medium or Long.
///
/// [`Handlers::new`] takes `Send` closures, so the node built on the table may move to
/// another thread (to a progress thread, into a thread pool); [`Handlers::local`] takes any
/// closure, one that holds an `Rc` or a `RefCell` too, and its node stays where it was made
/// (see [`Threading`]). Both run every handler on the thread that polls the node.
///
/// Every rank of a job must register the same table (same ids, names, categories and kinds);
/// [`crate::Node::new`] exchanges a digest of it and fails with
/// [`crate::StartError::HandlerTableMismatch`] otherwise.
///
/// ```
/// use amnet::{AmKind, HandlerId, Handlers};
/// const PING: HandlerId = HandlerId(1);
/// const PONG: HandlerId = HandlerId(2);
///
/// fn main() {
///     let mut handlers = Handlers::new();
///     handlers.request(PING, "ping", AmKind::Short, |msg, token| {
///         let _ = token.reply_short(PONG, msg.args());
///     }).unwrap();
///     handlers.reply(PONG, "pong", AmKind::Short, |_msg| {}).unwrap();
///     assert_eq!(handlers.len(), 2);
/// }
/// ```
pub struct Handlers<H: Threading = Sendable> {
    pub(crate) info: Vec<Option<HandlerInfo>>,
    /// Indexed by a `u8`, so no lookup needs a bounds check.
    pub(crate) fns: Box<[Option<HandlerFn<H>>; 256]>,
    /// The reply handler reserved for calls and the calls in flight, once a callable handler
    /// is registered.
    pub(crate) calls: Option<CallSite>,
    /// The ids registered by `callable`, one bit each: what a call may name.
    callable: [u64; 4],
    /// User reductions, by id ([`Handlers::reduction`]).
    pub(crate) reductions: std::collections::BTreeMap<u16, crate::reduce::UserReduction>,
    /// Typed messages' names by type id ([`Handlers::typed`]).
    pub(crate) typed: std::collections::BTreeMap<u64, &'static str>,
    /// The handlers reserved for typed messages, once one is registered.
    pub(crate) typed_site: Option<Box<TypedSite<H>>>,
}

/// The name of the reply handler a table reserves for its calls.
const CALL_REPLY_NAME: &str = "amnet: call reply";
/// The body of `Handlers::typed_async` on both kinds of table, which differ in their
/// bounds alone: the future, kept as a task of the table's, answers the call
/// ([`crate::typed::answer_later`]).
macro_rules! typed_async_body {
    ($self:ident, $m:ty, $f:ident) => {{
        let id = $self.note_typed::<$m>()?;
        let transit = $self.open_typed()?;
        let tasks = $self
            .typed_site
            .as_ref()
            .map(|s| s.tasks.clone())
            .unwrap_or_default();
        let run = crate::typed::deferred_runner::<$m>(transit, move |m, cx, answer| {
            let fut = $f(m, cx);
            tasks.spawn(Box::pin(async move {
                crate::typed::answer_later(answer, fut.await);
            }));
        });
        $self.insert_typed(id, Box::new(run));
        Ok(())
    }};
}

/// The names of the handlers a table reserves for typed messages.
const TYPED_CALL_NAME: &str = "amnet: typed call";
const TYPED_POST_NAME: &str = "amnet: typed post";
const TYPED_PART_NAME: &str = "amnet: typed part";
const TYPED_ANSWER_NAME: &str = "amnet: typed answer";

/// A callable handler's wrapper: takes the call's number off the arguments and hands the
/// handler a [`Call`] in place of the token. A request without a number (a peer's doing) is
/// answered with nothing.
fn call_request<F>(reply: HandlerId, mut f: F) -> impl FnMut(Msg<'_>, Token<'_>)
where
    F: FnMut(Msg<'_>, Call<'_>),
{
    move |mut msg, token| {
        if let Some((&number, args)) = msg.args.split_first() {
            msg.args = args;
            f(msg, Call::new(number, reply, token));
        }
    }
}

/// Why a handler could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The id is already taken.
    #[error("handler {id:?} is already registered as {existing:?}")]
    Taken {
        /// The id asked for.
        id: HandlerId,
        /// Its current registration's name.
        existing: String,
    },
    /// Every id is taken: none is left for the answers of calls ([`Handlers::callable`]).
    #[error("no handler id is free for the answers of calls")]
    Full,
    /// A typed message's id is already registered ([`Handlers::typed`]).
    #[error("typed message {name} is already registered (as {existing})")]
    TypedTaken {
        /// The type registered again.
        name: &'static str,
        /// The registration holding its id.
        existing: String,
    },
    /// The user reduction's id is already taken ([`Handlers::reduction`]).
    #[error("reduction {id:?} is already registered as {existing:?}")]
    ReductionTaken {
        /// The id asked for.
        id: crate::ReduceId,
        /// Its current registration's name.
        existing: String,
    },
}

impl Default for Handlers {
    fn default() -> Self {
        Self::new()
    }
}

impl Handlers<Sendable> {
    /// An empty table of `Send` handlers. A handler that holds an `Rc` needs
    /// [`Handlers::local`],
    ///
    /// ```
    /// use std::{cell::Cell, rc::Rc};
    /// use amnet::{AmKind, HandlerId, Handlers};
    ///
    /// fn main() {
    ///
    ///     let seen = Rc::new(Cell::new(0u32));
    ///     let mut handlers = Handlers::local();
    ///     handlers.reply(HandlerId(1), "pong", AmKind::Short, move |_| seen.set(1)).unwrap();
    /// }
    /// ```
    ///
    /// since this table takes only `Send` closures:
    ///
    /// ```compile_fail,E0277
    /// use std::{cell::Cell, rc::Rc};
    /// use amnet::{AmKind, HandlerId, Handlers};
    ///
    /// let seen = Rc::new(Cell::new(0u32));
    /// let mut handlers = Handlers::new();
    /// handlers.reply(HandlerId(1), "pong", AmKind::Short, move |_| seen.set(1)).unwrap();
    /// ```
    pub fn new() -> Self {
        Self::empty()
    }

    /// Registers a request handler of the given kind.
    pub fn request(
        &mut self,
        id: HandlerId,
        name: &str,
        kind: AmKind,
        f: impl FnMut(Msg<'_>, Token<'_>) + Send + 'static,
    ) -> Result<(), RegisterError> {
        let f: Box<SendRequestFn> = Box::new(f);
        let f = HandlerFn::Request(kind, f);
        self.insert(id, name, Category::Request, kind, f)
    }

    /// Registers a reply handler of the given kind. It gets only the message,
    ///
    /// ```
    /// use amnet::{AmKind, HandlerId, Handlers};
    ///
    /// fn main() {
    ///
    ///     let mut handlers = Handlers::new();
    ///     handlers.reply(HandlerId(2), "pong", AmKind::Short, |_msg| {}).unwrap();
    /// }
    /// ```
    ///
    /// and no token to reply with (a reply is never answered):
    ///
    /// ```compile_fail,E0593
    /// use amnet::{AmKind, HandlerId, Handlers};
    ///
    /// let mut handlers = Handlers::new();
    /// handlers.reply(HandlerId(2), "pong", AmKind::Short, |_msg, token| {}).unwrap();
    /// ```
    pub fn reply(
        &mut self,
        id: HandlerId,
        name: &str,
        kind: AmKind,
        f: impl FnMut(Msg<'_>) + Send + 'static,
    ) -> Result<(), RegisterError> {
        let f: Box<SendReplyFn> = Box::new(f);
        let f = HandlerFn::Reply(kind, f);
        self.insert(id, name, Category::Reply, kind, f)
    }
}

impl Handlers<Sendable> {
    /// Registers a callable request handler: [`crate::Node::call`] and
    /// [`crate::AsyncNode::call`] send it a request (an AM Medium: arguments and a payload,
    /// possibly empty) whose answer comes back as their value. The handler answers through
    /// its [`Call`] (at most 15 arguments and a Medium's payload); one that returns without
    /// answering answers with nothing. The first
    /// callable handler reserves the highest id still free for the answers (every rank that
    /// builds the same table reserves the same one). Callable handlers are called only
    /// with `call`, which adds the call's number to the arguments: a plain request to one
    /// is a call without a caller, answered to nobody.
    pub fn callable(
        &mut self,
        id: HandlerId,
        name: &str,
        f: impl FnMut(Msg<'_>, Call<'_>) + Send + 'static,
    ) -> Result<(), RegisterError> {
        let site = self.call_site()?;
        let f: Box<SendRequestFn> = Box::new(call_request(site.reply, f));
        self.insert_callable(id, name, HandlerFn::Request(AmKind::Medium, f))
    }

    fn call_site(&mut self) -> Result<CallSite, RegisterError> {
        self.reserve_call_reply(|calls| {
            let f: Box<SendReplyFn> = Box::new(move |msg: Msg<'_>| complete(&calls, &msg));
            HandlerFn::Reply(AmKind::Medium, f)
        })
    }
}

impl Handlers<Sendable> {
    /// Registers the typed message `M` ([`crate::typed`]): a call or post of an `M` runs
    /// [`Am::exec`](crate::typed::Am::exec) here. Every rank registers the same types.
    ///
    /// The first typed registration of a table (this one, [`Handlers::typed_with`],
    /// [`Handlers::typed_deferred`] or [`Handlers::typed_async`]) takes the highest handler
    /// ids still free: the calls' reply handler's, unless a callable handler took it
    /// already, and four for typed messages. Register raw handlers at fixed high ids first.
    pub fn typed<M: crate::typed::Am>(&mut self) -> Result<(), RegisterError> {
        self.typed_with::<M>(|m, cx| m.exec(cx))
    }

    /// Registers the typed message `M` with `f` as the code that runs it here (a closure
    /// that holds state: a shard of a distributed table), in place of
    /// [`Am::exec`](crate::typed::Am::exec).
    pub fn typed_with<M: crate::typed::Am>(
        &mut self,
        f: impl FnMut(M, &mut crate::typed::AmContext) -> M::Reply + Send + 'static,
    ) -> Result<(), RegisterError> {
        let id = self.note_typed::<M>()?;
        self.open_typed()?;
        self.insert_typed(id, Box::new(crate::typed::runner::<M>(f)));
        Ok(())
    }

    /// Registers the typed message `M` with `f` as its code, which answers later: it gets
    /// the call's [`Answer`](crate::typed::Answer) and gives it, with the value, to
    /// [`crate::Node::answer_typed`] when it has one, from any thread or task (a handler
    /// cannot wait: it runs inside progress).
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use amnet::typed::{Am, AmContext, Answer};
    /// use amnet::{Config, Handlers, Loopback, Node};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Square(u64);
    ///
    /// impl Am for Square {
    ///     type Reply = u64;
    ///     fn exec(self, _cx: &mut AmContext) -> u64 {
    ///         self.0 * self.0
    ///     }
    /// }
    ///
    /// fn main() {
    ///
    ///     amnet::run_ranks(Loopback::cluster(2, Default::default()), |t| {
    ///         let (tx, rx) = mpsc::channel::<(Square, Answer<u64>)>();
    ///         let mut handlers = Handlers::new();
    ///         handlers.typed_deferred::<Square>(move |m, _cx, answer| {
    ///             tx.send((m, answer)).unwrap();
    ///         }).unwrap();
    ///         let mut node = Node::new(t, handlers, Config::default()).unwrap();
    ///         if node.rank() == 0 {
    ///             assert_eq!(node.call_typed(1, Square(12)).unwrap(), 144);
    ///         } else {
    ///             // The work comes out of the handler; the answer leaves from here.
    ///             let (m, answer) = loop {
    ///                 node.poll().unwrap();
    ///                 if let Ok(work) = rx.try_recv() {
    ///                     break work;
    ///                 }
    ///             };
    ///             node.answer_typed(answer, m.0 * m.0).unwrap();
    ///         }
    ///         node.barrier().unwrap();
    ///     });
    /// }
    /// ```
    pub fn typed_deferred<M: crate::typed::Am>(
        &mut self,
        f: impl FnMut(M, &mut crate::typed::AmContext, crate::typed::Answer<M::Reply>) + Send + 'static,
    ) -> Result<(), RegisterError> {
        let id = self.note_typed::<M>()?;
        let transit = self.open_typed()?;
        self.insert_typed(id, Box::new(crate::typed::deferred_runner::<M>(transit, f)));
        Ok(())
    }

    /// Registers the typed message `M` with `f` as its code, async: `f` returns a future of
    /// the answer, which runs as a task of the node's driver, outside its lock, so it may
    /// await anything, a call of the node's own included (Lamellar's `async fn exec`). The
    /// call is answered when the future completes. A task still running when its node
    /// closes is dropped, and its call fails at the caller (with the node's departure, or
    /// [`crate::typed::Refusal::Abandoned`] if that still left).
    ///
    /// The driver polls the tasks: [`crate::AsyncNode`]'s after each round of progress (its
    /// tokio driver wakes for a task woken while it sleeps), [`crate::SharedNode`]'s after
    /// each poll, a blocking [`crate::Node`]'s in its polls and waits (a task woken from
    /// another thread while the node sleeps in [`crate::WaitMode::Block`] runs within
    /// [`crate::Config::block_timeout`]). A task reaches its node through what its code
    /// captured: a [`crate::WeakAsyncNode`] set once the node is made (a strong handle in
    /// code the node holds would keep the node from ever dropping). Closing the node drops
    /// the tasks still running.
    ///
    /// ```
    /// use amnet::typed::{Am, AmContext};
    /// use amnet::future::block_on;
    /// use amnet::{AsyncNode, Config, Handlers, Loopback, Node};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize, Deserialize)]
    /// struct Slow(u64);
    /// impl Am for Slow {
    ///     type Reply = u64;
    ///     fn exec(self, _cx: &mut AmContext) -> u64 {
    ///         unreachable!("registered async")
    ///     }
    /// }
    ///
    /// fn main() {
    ///
    ///     amnet::run_ranks(Loopback::cluster(2, Default::default()), |t| {
    ///         let mut handlers = Handlers::new();
    ///         handlers
    ///             .typed_async::<Slow, _>(|m, _cx| async move {
    ///                 // Anything may be awaited here: a timer, a channel, another rank.
    ///                 std::future::ready(()).await;
    ///                 m.0 + 1
    ///             })
    ///             .unwrap();
    ///         let node = AsyncNode::new(Node::new(t, handlers, Config::default()).unwrap());
    ///         let peer = 1 - node.rank();
    ///         block_on(&node, async {
    ///             assert_eq!(node.call_typed(peer, Slow(41)).await.unwrap(), 42);
    ///             node.barrier().await.unwrap();
    ///         });
    ///     });
    /// }
    /// ```
    pub fn typed_async<M: crate::typed::Am, Fut>(
        &mut self,
        mut f: impl FnMut(M, &mut crate::typed::AmContext) -> Fut + Send + 'static,
    ) -> Result<(), RegisterError>
    where
        Fut: std::future::Future<Output = M::Reply> + Send + 'static,
    {
        typed_async_body!(self, M, f)
    }

    /// Reserves the typed handlers at the first typed registration; the shared state.
    fn open_typed(&mut self) -> Result<Arc<crate::typed::Transit>, RegisterError> {
        if let Some(site) = &self.typed_site {
            return Ok(site.transit.clone());
        }
        let table = <Sendable as Threading>::TypedTable::default();
        let transit = Arc::<crate::typed::Transit>::default();
        let (t1, t2, x1, x2) = (
            table.clone(),
            table.clone(),
            transit.clone(),
            transit.clone(),
        );
        let site = self.call_site()?;
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        let call: Box<SendRequestFn> = Box::new(call_request(site.reply, move |msg, call| {
            let mut t = t1.lock().unwrap_or_else(|p| p.into_inner());
            run_typed_call(&msg, call, &x1, &mut out, |id, b, cx, o| {
                t.get_mut(&id).map(|f| f(b, cx, o))
            });
        }));
        let post: Box<SendRequestFn> = Box::new(move |msg: Msg<'_>, _token| {
            let mut t = t2.lock().unwrap_or_else(|p| p.into_inner());
            crate::typed::dispatch(&msg, None, &x2, &mut scratch, |id, b, cx, o| {
                t.get_mut(&id).map(|f| f(b, cx, o))
            });
        });
        let part: Box<SendRequestFn> = Box::new(part_handler(transit.clone()));
        let answer: Box<SendRequestFn> =
            Box::new(answer_handler(site.calls.clone(), transit.clone()));
        self.reserve_typed(table, transit.clone(), [call, post, part, answer])?;
        Ok(transit)
    }

    fn insert_typed(&mut self, id: u64, run: Box<crate::typed::SendTypedFn>) {
        if let Some(site) = &self.typed_site {
            site.table
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, run);
        }
    }
}

impl Handlers<Local> {
    /// Registers the typed message `M`, as [`Handlers::typed`] for `Send` tables.
    pub fn typed<M: crate::typed::Am>(&mut self) -> Result<(), RegisterError> {
        self.typed_with::<M>(|m, cx| m.exec(cx))
    }

    /// Registers the typed message `M` with `f` as its code, as [`Handlers::typed_with`] for
    /// `Send` tables.
    pub fn typed_with<M: crate::typed::Am>(
        &mut self,
        f: impl FnMut(M, &mut crate::typed::AmContext) -> M::Reply + 'static,
    ) -> Result<(), RegisterError> {
        let id = self.note_typed::<M>()?;
        self.open_typed()?;
        self.insert_typed(id, Box::new(crate::typed::runner::<M>(f)));
        Ok(())
    }

    /// Registers the typed message `M` with `f` as its code, which answers later, as
    /// [`Handlers::typed_deferred`] for `Send` tables.
    pub fn typed_deferred<M: crate::typed::Am>(
        &mut self,
        f: impl FnMut(M, &mut crate::typed::AmContext, crate::typed::Answer<M::Reply>) + 'static,
    ) -> Result<(), RegisterError> {
        let id = self.note_typed::<M>()?;
        let transit = self.open_typed()?;
        self.insert_typed(id, Box::new(crate::typed::deferred_runner::<M>(transit, f)));
        Ok(())
    }

    /// Registers the typed message `M` with `f` as its code, async, as
    /// [`Handlers::typed_async`] for `Send` tables: the future need not be `Send`.
    pub fn typed_async<M: crate::typed::Am, Fut>(
        &mut self,
        mut f: impl FnMut(M, &mut crate::typed::AmContext) -> Fut + 'static,
    ) -> Result<(), RegisterError>
    where
        Fut: std::future::Future<Output = M::Reply> + 'static,
    {
        typed_async_body!(self, M, f)
    }

    /// Reserves the typed handlers at the first typed registration; the shared state.
    fn open_typed(&mut self) -> Result<Arc<crate::typed::Transit>, RegisterError> {
        if let Some(site) = &self.typed_site {
            return Ok(site.transit.clone());
        }
        let table = <Local as Threading>::TypedTable::default();
        let transit = Arc::<crate::typed::Transit>::default();
        let (t1, t2, x1, x2) = (
            table.clone(),
            table.clone(),
            transit.clone(),
            transit.clone(),
        );
        let site = self.call_site()?;
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        let call: Box<RequestFn> = Box::new(call_request(site.reply, move |msg, call| {
            let mut t = t1.borrow_mut();
            run_typed_call(&msg, call, &x1, &mut out, |id, b, cx, o| {
                t.get_mut(&id).map(|f| f(b, cx, o))
            });
        }));
        let post: Box<RequestFn> = Box::new(move |msg: Msg<'_>, _token| {
            let mut t = t2.borrow_mut();
            crate::typed::dispatch(&msg, None, &x2, &mut scratch, |id, b, cx, o| {
                t.get_mut(&id).map(|f| f(b, cx, o))
            });
        });
        let part: Box<RequestFn> = Box::new(part_handler(transit.clone()));
        let answer: Box<RequestFn> = Box::new(answer_handler(site.calls.clone(), transit.clone()));
        self.reserve_typed(table, transit.clone(), [call, post, part, answer])?;
        Ok(transit)
    }

    fn insert_typed(&mut self, id: u64, run: Box<crate::typed::TypedFn>) {
        if let Some(site) = &self.typed_site {
            site.table.borrow_mut().insert(id, run);
        }
    }
}

/// A typed call's handler body: runs the message, answers with its status and bytes. An
/// answer too large for a reply leaves the call unanswered here and is queued, to leave as
/// requests from the endpoint's next poll ([`crate::typed::Transit`]).
fn run_typed_call(
    msg: &Msg<'_>,
    call: Call<'_>,
    transit: &crate::typed::Transit,
    out: &mut Vec<u8>,
    run: impl FnOnce(
        u64,
        &[u8],
        &mut crate::typed::AmContext,
        &mut Vec<u8>,
    ) -> Option<Result<bool, crate::typed::Refusal>>,
) {
    let status = crate::typed::dispatch(msg, Some(call.number()), transit, out, run);
    if status == crate::typed::DEFERRED {
        let _ = call.defer();
        return;
    }
    if status == crate::typed::ANSWER_OK && out.len() > transit.max_medium() {
        let (dest, number) = call.defer();
        transit.queue(dest, number, status, std::mem::take(out), None);
        return;
    }
    let answer: &[u8] = match status {
        crate::typed::ANSWER_OK => out,
        _ => &[],
    };
    let _ = call.reply(&[status], answer);
}

/// The typed part handler: keeps a part of a value larger than a Medium.
fn part_handler(
    transit: Arc<crate::typed::Transit>,
) -> impl FnMut(Msg<'_>, Token<'_>) + Send + 'static {
    move |msg, _token| transit.add_part(msg.src(), msg.args(), msg.payload())
}

/// The typed answer handler: an answer came as a request (too large for a reply, or given
/// later: [`crate::typed::Answer`]), its arguments the call's number, the status and, if
/// parts went ahead, their stream; completes the call.
fn answer_handler(
    calls: Arc<Calls>,
    transit: Arc<crate::typed::Transit>,
) -> impl FnMut(Msg<'_>, Token<'_>) + Send + 'static {
    move |msg, _token| {
        // The parts are taken whatever the status, so that none stay behind.
        let (number, status, whole) = match *msg.args() {
            [number, status] => (number, status, Ok(msg.payload().to_vec())),
            [number, status, stream] => (
                number,
                status,
                transit.take_parts(msg.src(), stream, msg.payload()),
            ),
            [number, status, slot, crate::typed::staging::RENDEZVOUS] => (
                number,
                status,
                transit.fetch(msg.src(), slot, msg.payload()),
            ),
            _ => return,
        };
        let reply = match whole {
            Ok(payload) if status == crate::typed::ANSWER_OK => crate::Reply {
                args: vec![status],
                payload,
            },
            Err(refusal) if status == crate::typed::ANSWER_OK => crate::Reply {
                args: vec![crate::typed::status_of(refusal)],
                payload: Vec::new(),
            },
            // A refusal: its status says why, whatever came with it.
            _ => crate::Reply {
                args: vec![status],
                payload: Vec::new(),
            },
        };
        calls.complete_with(msg.src(), number, || reply);
    }
}

/// The reserved reply handler's body: completes the call the answer names.
fn complete(calls: &Calls, msg: &Msg<'_>) {
    if let Some((&number, args)) = msg.args.split_first() {
        calls.complete(msg.src, number, args, msg.payload());
    }
}

impl Handlers<Local> {
    /// Registers a callable request handler, as [`Handlers::callable`] for `Send` tables.
    pub fn callable(
        &mut self,
        id: HandlerId,
        name: &str,
        f: impl FnMut(Msg<'_>, Call<'_>) + 'static,
    ) -> Result<(), RegisterError> {
        let site = self.call_site()?;
        let f: Box<RequestFn> = Box::new(call_request(site.reply, f));
        self.insert_callable(id, name, HandlerFn::Request(AmKind::Medium, f))
    }

    fn call_site(&mut self) -> Result<CallSite, RegisterError> {
        self.reserve_call_reply(|calls| {
            let f: Box<ReplyFn> = Box::new(move |msg: Msg<'_>| complete(&calls, &msg));
            HandlerFn::Reply(AmKind::Medium, f)
        })
    }
}

impl Handlers<Local> {
    /// An empty table of handlers that need not be `Send` (they may hold an `Rc`): its node
    /// stays on the thread that made it.
    ///
    /// ```
    /// use std::{cell::Cell, rc::Rc};
    /// use amnet::{AmKind, HandlerId, Handlers};
    ///
    /// fn main() {
    ///     let pongs = Rc::new(Cell::new(0));
    ///     let mut handlers = Handlers::local();
    ///     let p = pongs.clone();
    ///     handlers.reply(HandlerId(2), "pong", AmKind::Short, move |_| p.set(p.get() + 1)).unwrap();
    /// }
    /// ```
    pub fn local() -> Self {
        Self::empty()
    }

    /// Registers a request handler of the given kind.
    pub fn request(
        &mut self,
        id: HandlerId,
        name: &str,
        kind: AmKind,
        f: impl FnMut(Msg<'_>, Token<'_>) + 'static,
    ) -> Result<(), RegisterError> {
        let f: Box<RequestFn> = Box::new(f);
        let f = HandlerFn::Request(kind, f);
        self.insert(id, name, Category::Request, kind, f)
    }

    /// Registers a reply handler of the given kind.
    pub fn reply(
        &mut self,
        id: HandlerId,
        name: &str,
        kind: AmKind,
        f: impl FnMut(Msg<'_>) + 'static,
    ) -> Result<(), RegisterError> {
        let f: Box<ReplyFn> = Box::new(f);
        let f = HandlerFn::Reply(kind, f);
        self.insert(id, name, Category::Reply, kind, f)
    }
}

impl<H: Threading> Handlers<H> {
    fn empty() -> Self {
        Handlers {
            info: (0..256).map(|_| None).collect(),
            fns: Box::new(std::array::from_fn(|_| None)),
            calls: None,
            callable: [0; 4],
            reductions: Default::default(),
            typed: Default::default(),
            typed_site: None,
        }
    }

    /// Registers `f` as the user reduction `id` over elements of `E`, for
    /// [`ReduceOp::User`](crate::ReduceOp::User) in [`crate::Node::team_reduce`] and
    /// [`crate::Node::team_all_reduce`]. `f` must be associative; it is always applied as
    /// `f(lower, upper)`, `lower` covering members of lower team ranks, so it need not be
    /// commutative. Every rank registers the same reductions (their ids, names and element
    /// types are part of [`Handlers::digest`], which start-up checks), and runs `f` inside
    /// progress, as a handler.
    ///
    /// ```
    /// use amnet::{Config, Handlers, Loopback, Node, ReduceId, ReduceOp};
    /// const ABS_MAX: ReduceId = ReduceId(1);
    ///
    /// fn main() {
    ///     amnet::run_ranks(Loopback::cluster(3, Default::default()), |t| {
    ///         let mut handlers = Handlers::new();
    ///         handlers
    ///             .reduction(ABS_MAX, "abs max", |a: f64, b: f64| if b.abs() > a.abs() { b } else { a })
    ///             .unwrap();
    ///         let mut node = Node::new(t, handlers, Config::default()).unwrap();
    ///         let world = node.world_team();
    ///         let x = [-(node.rank() as f64)];
    ///         let m = node.team_all_reduce(&world, ReduceOp::User(ABS_MAX), &x).unwrap();
    ///         assert_eq!(m, [-2.0]);
    ///     });
    /// }
    /// ```
    pub fn reduction<E: crate::Element>(
        &mut self,
        id: crate::ReduceId,
        name: &str,
        f: impl Fn(E, E) -> E + Send + Sync + 'static,
    ) -> Result<(), RegisterError> {
        if let Some(existing) = self.reductions.get(&id.0) {
            return Err(RegisterError::ReductionTaken {
                id,
                existing: existing.name.clone(),
            });
        }
        self.reductions
            .insert(id.0, crate::reduce::UserReduction::new(name, f));
        Ok(())
    }

    /// Records typed message `M` (refused if its id is taken): its id.
    fn note_typed<M: crate::typed::Am>(&mut self) -> Result<u64, RegisterError> {
        let id = crate::typed::type_id::<M>();
        let name = std::any::type_name::<M>();
        if let Some(existing) = self.typed.get(&id) {
            return Err(RegisterError::TypedTaken {
                name,
                existing: existing.to_string(),
            });
        }
        self.typed.insert(id, name);
        Ok(id)
    }

    /// Reserves the four handlers of typed messages (the highest ids still free, after the
    /// calls' reply handler: call, post, part, answer), with their bodies sharing `table`
    /// and `transit`.
    fn reserve_typed(
        &mut self,
        table: H::TypedTable,
        transit: Arc<crate::typed::Transit>,
        [call, post, part, answer]: [Box<H::Request>; 4],
    ) -> Result<(), RegisterError> {
        let free: Vec<u8> = (0..=255u8)
            .rev()
            .filter(|&i| self.info[i as usize].is_none())
            .take(4)
            .collect();
        let &[c, p, q, a] = free.as_slice() else {
            return Err(RegisterError::Full);
        };
        let ids = [c, p, q, a].map(HandlerId);
        self.insert_callable(
            ids[0],
            TYPED_CALL_NAME,
            HandlerFn::Request(AmKind::Medium, call),
        )?;
        for (id, name, f) in [
            (ids[1], TYPED_POST_NAME, post),
            (ids[2], TYPED_PART_NAME, part),
            (ids[3], TYPED_ANSWER_NAME, answer),
        ] {
            self.insert(
                id,
                name,
                Category::Request,
                AmKind::Medium,
                HandlerFn::Request(AmKind::Medium, f),
            )?;
        }
        self.typed_site = Some(Box::new(TypedSite {
            call: ids[0],
            post: ids[1],
            part: ids[2],
            answer: ids[3],
            table,
            transit,
            tasks: H::Tasks::default(),
        }));
        Ok(())
    }

    /// Whether `id` is registered by `callable`, so that a call may name it.
    pub(crate) fn is_callable(&self, id: HandlerId) -> bool {
        self.callable[usize::from(id.0 / 64)] & (1 << (id.0 % 64)) != 0
    }

    fn insert_callable(
        &mut self,
        id: HandlerId,
        name: &str,
        f: HandlerFn<H>,
    ) -> Result<(), RegisterError> {
        self.insert(id, name, Category::Request, AmKind::Medium, f)?;
        self.callable[usize::from(id.0 / 64)] |= 1 << (id.0 % 64);
        Ok(())
    }

    /// The call site, reserving the highest free id for the answers on first use (`reply`
    /// makes the reply handler that completes `calls`).
    fn reserve_call_reply(
        &mut self,
        reply: impl FnOnce(Arc<Calls>) -> HandlerFn<H>,
    ) -> Result<CallSite, RegisterError> {
        if let Some(site) = &self.calls {
            return Ok(site.clone());
        }
        let Some(free) = (0..=255u8).rev().find(|&i| self.info[i as usize].is_none()) else {
            return Err(RegisterError::Full);
        };
        let id = HandlerId(free);
        let calls = Arc::new(Calls::default());
        self.insert(
            id,
            CALL_REPLY_NAME,
            Category::Reply,
            AmKind::Medium,
            reply(calls.clone()),
        )?;
        let site = CallSite { reply: id, calls };
        self.calls = Some(site.clone());
        Ok(site)
    }

    fn insert(
        &mut self,
        id: HandlerId,
        name: &str,
        category: Category,
        kind: AmKind,
        f: HandlerFn<H>,
    ) -> Result<(), RegisterError> {
        let i = id.0 as usize;
        if let Some(existing) = &self.info[i] {
            return Err(RegisterError::Taken {
                id,
                existing: existing.name.clone(),
            });
        }
        self.info[i] = Some(HandlerInfo {
            name: name.to_owned(),
            category,
            kind,
        });
        self.fns[i] = Some(f);
        Ok(())
    }

    /// What is registered at each id, as (category, kind): what a reply is checked against
    /// while the table itself is lent to the handler that sends it.
    pub(crate) fn registrations(&self) -> [Option<(Category, AmKind)>; 256] {
        std::array::from_fn(|i| match &self.fns[i] {
            Some(HandlerFn::Request(kind, _)) => Some((Category::Request, *kind)),
            Some(HandlerFn::Reply(kind, _)) => Some((Category::Reply, *kind)),
            None => None,
        })
    }

    /// Number of registered handlers.
    pub fn len(&self) -> usize {
        self.info.iter().filter(|i| i.is_some()).count()
    }

    /// True if no handler is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What is registered at `id`.
    pub fn info(&self, id: HandlerId) -> Option<&HandlerInfo> {
        self.info[id.0 as usize].as_ref()
    }

    /// A 64-bit digest of the table (ids, names, categories, kinds), the same on every rank that
    /// registered the same table. FNV-1a: stable across builds and machines.
    pub fn digest(&self) -> u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |b: u8| {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        };
        for (i, info) in self.info.iter().enumerate() {
            if let Some(info) = info {
                eat(i as u8);
                eat(info.category as u8);
                eat(info.kind as u8);
                for b in (info.name.len() as u32).to_le_bytes() {
                    eat(b);
                }
                for &b in info.name.as_bytes() {
                    eat(b);
                }
            }
        }
        // User reductions after the handlers, in id order: none registered leaves the
        // digest as it was.
        for (&id, r) in &self.reductions {
            // The element's size and type name too: two `Plain` types share a code.
            let fields = [
                u32::from(id),
                r.elem,
                r.size as u32,
                r.name.len() as u32,
                r.type_name.len() as u32,
            ];
            for b in fields.iter().flat_map(|x| x.to_le_bytes()) {
                eat(b);
            }
            for &b in r.name.as_bytes().iter().chain(r.type_name.as_bytes()) {
                eat(b);
            }
        }
        // Typed messages after the reductions, in id order: none leaves the digest as it
        // was.
        for (&id, name) in &self.typed {
            for b in id
                .to_le_bytes()
                .into_iter()
                .chain((name.len() as u32).to_le_bytes())
            {
                eat(b);
            }
            for &b in name.as_bytes() {
                eat(b);
            }
        }
        h
    }

    /// The table's signature: for each of the 256 ids, a 16-bit hash of its name, category
    /// and kind (0 where nothing is registered). Start-up compares signatures to name the
    /// first handler that differs between two ranks' tables; two different registrations
    /// of one id have the same hash once in 65535.
    pub fn signature(&self) -> [u16; 256] {
        let mut sig = [0u16; 256];
        for (slot, info) in sig.iter_mut().zip(self.info.iter()) {
            if let Some(info) = info {
                let mut h: u32 = 0x811c_9dc5;
                let bytes = [info.category as u8, info.kind as u8];
                for &b in bytes.iter().chain(info.name.as_bytes()) {
                    h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
                }
                // Folded to 16 bits, never 0 (0 is "not registered").
                *slot = ((h >> 16) as u16 ^ h as u16).max(1);
            }
        }
        sig
    }
}

impl<H: Threading> fmt::Debug for Handlers<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.info
                    .iter()
                    .enumerate()
                    .filter_map(|(i, x)| x.as_ref().map(|x| (i, x))),
            )
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_depends_on_every_field() {
        let base = || {
            let mut h = Handlers::new();
            h.request(HandlerId(1), "a", AmKind::Short, |_, _| {})
                .unwrap();
            h
        };
        let d = base().digest();
        assert_eq!(d, base().digest());
        let mut other = Handlers::new();
        other
            .request(HandlerId(2), "a", AmKind::Short, |_, _| {})
            .unwrap();
        assert_ne!(d, other.digest());
        let mut other = Handlers::new();
        other
            .request(HandlerId(1), "a", AmKind::Medium, |_, _| {})
            .unwrap();
        assert_ne!(d, other.digest());
        let mut other = Handlers::new();
        other
            .reply(HandlerId(1), "a", AmKind::Short, |_| {})
            .unwrap();
        assert_ne!(d, other.digest());
        let mut other = Handlers::new();
        other
            .request(HandlerId(1), "b", AmKind::Short, |_, _| {})
            .unwrap();
        assert_ne!(d, other.digest());
    }

    /// Signatures agree where the tables do, and differ at an id registered differently
    /// (name, category or kind) or on one side only; unregistered ids are 0.
    #[test]
    fn signatures_point_at_the_differing_handler() {
        let table = |name: &str, kind: AmKind, extra: bool| {
            let mut h = Handlers::new();
            h.request(HandlerId(1), "a", AmKind::Short, |_, _| {})
                .unwrap();
            h.request(HandlerId(7), name, kind, |_, _| {}).unwrap();
            if extra {
                h.reply(HandlerId(200), "z", AmKind::Short, |_| {}).unwrap();
            }
            h.signature()
        };
        let base = table("b", AmKind::Medium, false);
        assert_eq!(base, table("b", AmKind::Medium, false));
        assert!(base[1] != 0 && base[7] != 0 && base[0] == 0 && base[200] == 0);
        let first_diff = |other: [u16; 256]| base.iter().zip(other).position(|(a, b)| *a != b);
        assert_eq!(first_diff(table("c", AmKind::Medium, false)), Some(7));
        assert_eq!(first_diff(table("b", AmKind::Long, false)), Some(7));
        assert_eq!(first_diff(table("b", AmKind::Medium, true)), Some(200));
    }

    #[test]
    fn double_registration_is_an_error() {
        let mut h = Handlers::new();
        h.reply(HandlerId(9), "x", AmKind::Short, |_| {}).unwrap();
        assert!(matches!(
            h.reply(HandlerId(9), "y", AmKind::Short, |_| {}),
            Err(RegisterError::Taken { .. })
        ));
    }
}
