//! The tokio driver of [`AsyncNode`]: tasks on a `LocalSet` calling concurrently while the
//! driver sleeps armed between messages, `run`, a call to a rank that left failing instead of
//! waiting, and an armed idle node using (almost) no CPU. On loopback, ranks as threads.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use amnet::{
    run_ranks, AmError, AmKind, AsyncNode, Config, HandlerId, Handlers, Local, Loopback,
    LoopbackConfig, Node, WaitMode,
};

mod common;
use common::within;

const SQUARE: HandlerId = HandlerId(1);

/// `SQUARE` answers `[x * x, caller]`, and counts its calls.
fn kv_handlers() -> Handlers<Local> {
    let served = Rc::new(Cell::new(0u32));
    let mut h = Handlers::local();
    h.callable(SQUARE, "square", move |msg, call| {
        served.set(served.get() + 1);
        let x = msg.args()[0];
        call.reply(&[x * x, msg.src()], &[]).expect("answer");
    })
    .expect("register");
    h
}

/// Squared later, by a task: the handler hands it out with its answer.
#[derive(serde::Serialize, serde::Deserialize)]
struct Later(u32);

impl amnet::typed::Am for Later {
    type Reply = (u32, u32);
    fn exec(self, _: &mut amnet::typed::AmContext) -> (u32, u32) {
        (self.0 * self.0, 0)
    }
}

/// Catches a deferred typed answer that the tokio driver never sends or never wakes for: the
/// handler hands each `Later` to a task over a channel (handlers cannot wait), the task
/// awaits a call of its own to the caller first (the node used inside an async handler),
/// then answers; both ranks serve each other's calls while making their own, under `drive`.
#[test]
fn a_task_answers_typed_calls_under_the_tokio_driver() {
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let mut h = kv_handlers();
            h.typed_deferred::<Later>(move |m, _cx, answer| {
                let _ = tx.send((m, answer));
            })
            .expect("register");
            let node = AsyncNode::new(Node::new(t, h, Config::default()).expect("start"));
            driven(&node, async {
                let me = node.rank();
                let peer = 1 - me;
                // The "async handler": everything it awaits runs while the driver drives.
                let server = tokio::task::spawn_local({
                    let node = node.clone();
                    async move {
                        while let Some((m, answer)) = rx.recv().await {
                            let r = node.call(answer.src(), SQUARE, &[m.0], &[]).await?;
                            node.answer_typed(answer, (r.args[0], m.0)).await?;
                        }
                        Ok::<_, AmError>(())
                    }
                });
                let calls: Vec<_> = (1..=20u32)
                    .map(|x| tokio::task::spawn_local(node.call_typed(peer, Later(x))))
                    .collect();
                for (x, c) in (1..=20u32).zip(calls) {
                    assert_eq!(c.await.expect("task").expect("answer"), (x * x, x));
                }
                node.barrier().await.expect("barrier");
                server.abort();
            });
        });
    });
}

/// Catches an async handler's task that the tokio driver, asleep, does not wake for: each
/// task awaits a tokio timer, whose wake must end the driver's sleep (else each call waits
/// out the driver's armed sleep of a second, and 100 in turn outlast the watchdog).
#[test]
fn async_handlers_run_as_tasks_of_the_tokio_driver() {
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let mut h = kv_handlers();
            h.typed_async::<Later, _>(|m, cx| {
                let src = cx.src();
                async move {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    (m.0 * m.0, src)
                }
            })
            .expect("register");
            let node = AsyncNode::new(Node::new(t, h, Config::default()).expect("start"));
            driven(&node, async {
                let me = node.rank();
                let peer = 1 - me;
                for x in 0..100u32 {
                    let answer = node.call_typed(peer, Later(x)).await.expect("answer");
                    assert_eq!(answer, (x * x, me));
                }
                node.barrier().await.expect("barrier");
            });
        });
    });
}

/// Runs `body` on a current-thread runtime's `LocalSet` beside the tokio driver of `node`,
/// then stops the driver and checks that it ended cleanly.
fn driven<H: amnet::Threading>(
    node: &AsyncNode<Loopback, H>,
    body: impl std::future::Future<Output = ()>,
) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let local = tokio::task::LocalSet::new();
    local.block_on(&rt, async {
        let driver = tokio::task::spawn_local({
            let node = node.clone();
            async move { node.drive().await }
        });
        body.await;
        node.stop();
        driver.await.expect("driver").expect("driver ends cleanly");
    });
}

/// Catches an async `wait_until` that never asks again (a handler's effect comes in a round
/// of progress, which must wake the future), undriven on a plain runtime and under the tokio
/// driver; `limits` is the node's.
#[test]
fn an_async_wait_until_resolves_once_a_handler_has_run() {
    const HIT: HandlerId = HandlerId(2);
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let hits = Rc::new(Cell::new(0u32));
            let seen = hits.clone();
            let mut h = kv_handlers();
            h.request(HIT, "hit", AmKind::Short, move |_, _| {
                seen.set(seen.get() + 1)
            })
            .expect("register");
            let node = AsyncNode::new(Node::new(t, h, Config::default()).expect("start"));
            assert_eq!(node.limits(), node.with(|n| n.limits()));
            let peer = 1 - node.rank();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            // No driver: the future makes the progress itself.
            rt.block_on(async {
                node.request_short(peer, HIT, &[]).await.expect("request");
                node.wait_until(|| hits.get() >= 1).await.expect("wait");
            });
            driven(&node, async {
                node.request_short(peer, HIT, &[]).await.expect("request");
                node.wait_until(|| hits.get() >= 2).await.expect("wait");
                node.barrier().await.expect("barrier");
            });
        });
    });
}

/// The tokio driver on a current-thread runtime: tasks on a `LocalSet` (a node of local
/// handlers) calling concurrently, the driver sleeping armed between messages; `run` returns
/// the future's output.
#[test]
fn the_tokio_driver_serves_tasks_on_a_local_set() {
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let node =
                AsyncNode::new(Node::new(t, kv_handlers(), Config::default()).expect("start"));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async {
                let driver = tokio::task::spawn_local({
                    let node = node.clone();
                    async move { node.drive().await }
                });
                let me = node.rank();
                let peer = 1 - me;
                let tasks: Vec<_> = (0..8u32)
                    .map(|i| {
                        let node = node.clone();
                        tokio::task::spawn_local(async move {
                            for k in 0..25u32 {
                                let x = i * 100 + k;
                                let r = node.call(peer, SQUARE, &[x], &[]).await?;
                                assert_eq!(r.args, [x * x, me]);
                            }
                            Ok::<_, AmError>(())
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("task").expect("calls");
                }
                node.barrier().await.expect("barrier");
                node.stop();
                driver.await.expect("driver").expect("driver ends cleanly");
                // `run` drives as long as its future runs.
                let n = node
                    .run(async { node.call(peer, SQUARE, &[3], &[]).await })
                    .await
                    .expect("driver")
                    .expect("call");
                assert_eq!(n.args, [9, me]);
                // Both ranks drive until both are done.
                node.run(node.barrier())
                    .await
                    .expect("driver")
                    .expect("barrier");
            });
        });
    });
}

/// A call to a rank that left fails with its departure rather than waiting for ever.
#[test]
fn a_call_to_a_departed_rank_fails() {
    within(Duration::from_secs(60), || {
        let gone = std::sync::atomic::AtomicBool::new(false);
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let mut node = Node::new(t, kv_handlers(), Config::default()).expect("start");
            node.barrier().expect("barrier");
            if node.rank() == 1 {
                drop(node);
                gone.store(true, std::sync::atomic::Ordering::Release);
                return;
            }
            let node = AsyncNode::new(node);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let r = rt.block_on(async {
                // Rank 1 lingers until its own requests are answered: serve them.
                node.run(async {
                    while !gone.load(std::sync::atomic::Ordering::Acquire) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
                .await
                .expect("driver");
                node.run(node.call(1, SQUARE, &[2], &[])).await
            });
            match r {
                Ok(Err(AmError::PeerDeparted(1))) | Err(AmError::PeerDeparted(1)) => {}
                other => panic!("expected the departure of rank 1, got {other:?}"),
            }
        });
    });
}

/// The job aborts (rank 0 panics) while rank 1 has 50 calls pending under the tokio driver,
/// some sent and some waiting for a credit: the driver returns the abort, and every one of
/// the 50 futures, awaited after it returned, resolves with it, as does a fresh call. Catches
/// futures left parked when the driver returns on an error that ends the node (they were
/// never woken again, and the program never ended).
#[test]
fn an_aborted_job_fails_every_future_under_the_tokio_driver() {
    const GIVE_UP: &str = "rank 0 gives up on purpose";
    within(Duration::from_secs(60), || {
        let ready = std::sync::atomic::AtomicBool::new(false);
        let outcome = std::sync::Mutex::new(None);
        let job = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
                let config = Config::default().credits(amnet::Credits::Static(8));
                let node = Node::new(t, kv_handlers(), config).expect("start");
                if node.rank() == 0 {
                    while !ready.load(std::sync::atomic::Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    std::thread::sleep(Duration::from_millis(50));
                    panic!("{GIVE_UP}");
                }
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let node = AsyncNode::new(node);
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .expect("runtime");
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&rt, async {
                        let driver = tokio::task::spawn_local({
                            let node = node.clone();
                            async move { node.drive().await }
                        });
                        let calls: Vec<_> = (0..50u32)
                            .map(|x| tokio::task::spawn_local(node.call(0, SQUARE, &[x], &[])))
                            .collect();
                        // Let every call start: sent, or parked for a credit.
                        for _ in 0..10 {
                            tokio::task::yield_now().await;
                        }
                        ready.store(true, std::sync::atomic::Ordering::Release);
                        let limit = Duration::from_secs(10);
                        let driven = tokio::time::timeout(limit, driver).await;
                        assert_eq!(
                            driven.expect("the driver returns").expect("driver task"),
                            Err(AmError::JobAborted)
                        );
                        for c in calls {
                            let r = tokio::time::timeout(limit, c)
                                .await
                                .expect("a call future never resolved")
                                .expect("call task");
                            assert_eq!(r.map(|_| ()), Err(AmError::JobAborted));
                        }
                        let fresh = tokio::time::timeout(limit, node.call(0, SQUARE, &[1], &[]))
                            .await
                            .expect("a fresh call never resolved");
                        assert_eq!(fresh.map(|_| ()), Err(AmError::JobAborted));
                    });
                }));
                ready.store(true, std::sync::atomic::Ordering::Release);
                *outcome.lock().unwrap() = Some(r);
            })
        }));
        match outcome.into_inner().unwrap() {
            Some(Ok(())) => {}
            Some(Err(p)) => std::panic::resume_unwind(p),
            None => panic!("rank 1 never finished"),
        }
        let p = job.expect_err("rank 0's panic is re-raised");
        assert_eq!(
            p.downcast_ref::<String>().map(String::as_str),
            Some(GIVE_UP)
        );
    });
}

/// An armed node idle under the tokio driver sleeps: over a second, the rank's thread uses a
/// small fraction of a core (a driver that polled instead would use all of it).
#[test]
fn an_idle_armed_node_uses_no_cpu() {
    within(Duration::from_secs(60), || {
        let used = run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let config = Config::default().wait_mode(WaitMode::Block);
            let node = AsyncNode::new(Node::new(t, kv_handlers(), config).expect("start"));
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async {
                node.run(node.barrier())
                    .await
                    .expect("driver")
                    .expect("barrier");
                let before = thread_cpu();
                let t0 = Instant::now();
                node.run(tokio::time::sleep(Duration::from_secs(1)))
                    .await
                    .expect("driver");
                let used = thread_cpu() - before;
                let wall = t0.elapsed();
                node.run(node.barrier())
                    .await
                    .expect("driver")
                    .expect("barrier");
                used.as_secs_f64() / wall.as_secs_f64()
            })
        });
        for (rank, share) in used.into_iter().enumerate() {
            assert!(
                share < 0.05,
                "rank {rank} used {:.1}% of a core idle",
                share * 100.0
            );
        }
    });
}

/// A node dropped with a call its peer never answers (the peer does not poll until the drop
/// is over) waits for it at most `close_timeout`, asleep: even in `AM_WAIT=spin` the
/// dropping thread uses a small fraction of a core. Catches the drop that spun at 95% of
/// a core for 30 s, stalling the thread (a tokio worker) that dropped the node.
#[test]
fn dropping_a_node_waits_for_an_unanswered_call_asleep_and_bounded() {
    within(Duration::from_secs(60), || {
        let dropped = std::sync::atomic::AtomicBool::new(false);
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let config = Config::default()
                .wait_mode(WaitMode::Spin)
                .close_timeout(Duration::from_secs(1));
            let mut node = Node::new(t, kv_handlers(), config).expect("start");
            node.barrier().expect("barrier");
            if node.rank() == 1 {
                while !dropped.load(std::sync::atomic::Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                return;
            }
            drop(node.call_nb(1, SQUARE, &[3], &[]).expect("sent"));
            let (cpu, t0) = (thread_cpu(), Instant::now());
            drop(node);
            let (used, wall) = (thread_cpu() - cpu, t0.elapsed());
            dropped.store(true, std::sync::atomic::Ordering::Release);
            assert!(wall >= Duration::from_millis(900), "left after {wall:?}");
            assert!(
                wall < Duration::from_secs(3),
                "bounded by close_timeout: {wall:?}"
            );
            let share = used.as_secs_f64() / wall.as_secs_f64();
            assert!(
                share < 0.25,
                "the drop used {:.0}% of a core",
                share * 100.0
            );
        });
    });
}

/// `AsyncNode::close` under the tokio driver, with a call its peer never answers pending:
/// resolves within `close_timeout` without blocking the runtime's thread (a task ticks
/// meanwhile), fails the pending call with `NodeClosed`, and returns the driver `Ok`; a
/// later call fails at once. Catches a close that blocks the runtime's only thread, and
/// calls left pending for ever by it.
#[test]
fn an_async_close_fails_pending_calls_without_blocking_the_runtime() {
    within(Duration::from_secs(60), || {
        let closed = std::sync::atomic::AtomicBool::new(false);
        run_ranks(Loopback::cluster(2, LoopbackConfig::default()), |t| {
            let config = Config::default().close_timeout(Duration::from_secs(1));
            let mut node = Node::new(t, kv_handlers(), config).expect("start");
            node.barrier().expect("barrier");
            if node.rank() == 1 {
                while !closed.load(std::sync::atomic::Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                return;
            }
            let node = AsyncNode::new(node);
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, async {
                let driver = tokio::task::spawn_local({
                    let node = node.clone();
                    async move { node.drive().await }
                });
                let call = tokio::task::spawn_local(node.call(1, SQUARE, &[3], &[]));
                let ticks = Rc::new(Cell::new(0u32));
                let ticker = tokio::task::spawn_local({
                    let ticks = ticks.clone();
                    async move {
                        loop {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            ticks.set(ticks.get() + 1);
                        }
                    }
                });
                tokio::task::yield_now().await;
                let t0 = Instant::now();
                node.close().await.expect("close");
                let wall = t0.elapsed();
                assert!(
                    wall < Duration::from_secs(3),
                    "bounded by close_timeout: {wall:?}"
                );
                assert!(
                    ticks.get() >= 20,
                    "the runtime ran {} ticks meanwhile",
                    ticks.get()
                );
                ticker.abort();
                let r = call.await.expect("call task");
                assert_eq!(r.map(|_| ()), Err(AmError::NodeClosed));
                assert_eq!(driver.await.expect("driver task"), Ok(()));
                let later = node.call(1, SQUARE, &[4], &[]).await;
                assert_eq!(later.map(|_| ()), Err(AmError::NodeClosed));
            });
            closed.store(true, std::sync::atomic::Ordering::Release);
        });
    });
}

/// CPU time of the calling thread.
fn thread_cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_THREAD).expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    tv(u.user_time()) + tv(u.system_time())
}

/// Collectives as tokio tasks, with the driver sleeping armed between messages: on each rank
/// one task runs a chunked broadcast and all-reduces on the world while another runs
/// all-reduces on its half of a split, concurrently (each team's collectives start in one
/// order on every member); then, in a job of the same shape with the node shared, a
/// `ProgressThread` advances collectives that compute threads of the rank start and wait
/// for, one thread per team. Catches a
/// collective whose steps only its own waiter advances (the driver or the progress thread
/// must carry it), and a future that needs polling to take steps another team's task
/// waits on.
#[test]
fn collectives_run_as_tokio_tasks_and_under_a_progress_thread() {
    use amnet::{ProgressThread, ReduceOp, SharedNode};
    within(Duration::from_secs(60), || {
        run_ranks(Loopback::cluster(4, LoopbackConfig::default()), |t| {
            let node = Node::new(
                t,
                Handlers::new(),
                Config::default().wait_mode(WaitMode::Block),
            )
            .expect("start");
            let me = node.rank();
            let max = node.max_medium();
            let node = AsyncNode::new(node);
            let world = node.world_team();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            let local = tokio::task::LocalSet::new();
            let half: amnet::Team = local.block_on(&rt, async {
                let driver = tokio::task::spawn_local({
                    let node = node.clone();
                    async move { node.drive().await }
                });
                let half = node
                    .split(&world, Some(me % 2), 0)
                    .await
                    .expect("split")
                    .expect("a team");
                let on_world = tokio::task::spawn_local({
                    let (node, world) = (node.clone(), world.clone());
                    async move {
                        let bytes: Vec<u8> = (0..2 * max + 9).map(|i| i as u8).collect();
                        let data = if me == 3 { bytes.clone() } else { Vec::new() };
                        let got = node.team_broadcast(&world, 3, &data).await?;
                        assert_eq!(got, bytes);
                        for k in 0..20u64 {
                            let s = node.team_all_reduce(&world, ReduceOp::Sum, &[k]).await?;
                            assert_eq!(s, [4 * k]);
                        }
                        Ok::<_, AmError>(())
                    }
                });
                let on_half = tokio::task::spawn_local({
                    let (node, half) = (node.clone(), half.clone());
                    async move {
                        for k in 0..20u32 {
                            let m = node
                                .team_all_reduce(&half, ReduceOp::Max, &[me * 100 + k])
                                .await?;
                            assert_eq!(m, [(2 + me % 2) * 100 + k]);
                        }
                        Ok::<_, AmError>(())
                    }
                });
                on_world.await.expect("task").expect("world");
                on_half.await.expect("task").expect("half");
                node.team_barrier(&world).await.expect("barrier");
                node.stop();
                driver.await.expect("driver").expect("driver ends cleanly");
                half
            });
            drop(half);
        });
        // The same team shapes, the node shared between compute threads of the rank.
        run_ranks(Loopback::cluster(4, LoopbackConfig::default()), |t| {
            let node = Node::new(
                t,
                Handlers::new(),
                Config::default().wait_mode(WaitMode::Block),
            )
            .expect("start");
            let me = node.rank();
            let shared = SharedNode::new(node);
            let world = shared.world_team();
            let half = shared
                .split(&world, Some(me % 2), 0)
                .expect("split")
                .expect("a team");
            let progress = ProgressThread::spawn(shared.clone()).expect("progress thread");
            std::thread::scope(|s| {
                let a = s.spawn(|| {
                    for k in 0..20u64 {
                        let v = shared
                            .team_all_reduce(&world, ReduceOp::Sum, &[k, 1])
                            .expect("world");
                        assert_eq!(v, [4 * k, 4]);
                    }
                });
                let b = s.spawn(|| {
                    for k in 0..20u32 {
                        let v = shared
                            .team_all_gather(&half, &[me as u8, k as u8])
                            .expect("half");
                        let want: Vec<u8> = half
                            .members()
                            .iter()
                            .flat_map(|&m| [m as u8, k as u8])
                            .collect();
                        assert_eq!(v, want);
                    }
                });
                a.join().expect("world thread");
                b.join().expect("half thread");
            });
            shared.team_barrier(&world).expect("barrier");
            progress.stop().expect("progress thread ends");
        });
    });
}
