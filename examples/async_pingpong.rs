//! Round trips of a call ([`amnet::Node::call`], [`amnet::AsyncNode::call`]) under four
//! drivers in one job, rounds interleaved: the blocking node sleeping between messages
//! (`AM_WAIT=block`), the tokio driver sleeping armed on the wake descriptor
//! ([`amnet::AsyncNode::run`]), the blocking node spinning (`AM_WAIT=spin`) and the tokio
//! driver that never sleeps ([`amnet::AsyncNode::run_spinning`]). Rank 0 calls, rank 1
//! answers under the same driver; rank 0 prints the medians and the two ratios that compare
//! like with like (tokio sleeping / block, tokio spinning / spin) as one JSON line.
//!
//! ```text
//! cargo run --release --example async_pingpong -- --transport sci --iters 5000 --rounds 7
//! ```

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::Instant;

use amnet::{
    AmKind, AsyncNode, Config, HandlerId, Handlers, JobOptions, Local, Node, Transport,
    TransportKind, WaitMode,
};
use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Call round trips: blocking and tokio drivers, sleeping and spinning")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Calls per round and driver
    #[arg(long, default_value_t = 5000)]
    iters: u32,
    /// Rounds (each measures every driver once, in a rotating order)
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Measure only this driver (block, tokio, spin, tokio-spin); the others report 0
    #[arg(long)]
    only: Option<String>,
    /// Empty polls before a sleeping driver sleeps (`Config::spin_polls`): 0 sleeps between
    /// every two messages, for block and tokio alike
    #[arg(long)]
    spin_polls: Option<u32>,
}

const ECHO: HandlerId = HandlerId(1);
const DONE: HandlerId = HandlerId(2);

/// Set by `DONE`; wakes a task waiting for it.
#[derive(Default)]
struct Flag {
    set: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Flag {
    fn raise(&self) {
        self.set.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    async fn wait(&self) {
        std::future::poll_fn(|cx| {
            if self.set.get() {
                Poll::Ready(())
            } else {
                *self.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Driver {
    Block,
    Tokio,
    Spin,
    TokioSpin,
}

const DRIVERS: [Driver; 4] = [
    Driver::Block,
    Driver::Tokio,
    Driver::Spin,
    Driver::TokioSpin,
];

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rank_main(t: amnet::AnyTransport, args: &Args) -> anyhow::Result<()> {
    let done = Rc::new(Flag::default());
    let mut handlers = Handlers::local();
    handlers.callable(ECHO, "echo", |msg, call| {
        let _ = call.reply(msg.args(), &[]);
    })?;
    let d = done.clone();
    handlers.request(DONE, "done", AmKind::Short, move |_, _| d.raise())?;
    let mut config = Config::from_env()?;
    if let Some(n) = args.spin_polls {
        config = config.spin_polls(n);
    }
    let mut node: Node<_, Local> = Node::new(t, handlers, config)?;
    anyhow::ensure!(node.size() == 2, "run with 2 ranks");
    let me = node.rank();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut rtt: [Vec<f64>; 4] = Default::default();
    for round in 0..args.rounds {
        for k in 0..DRIVERS.len() {
            let which = (round + k) % DRIVERS.len();
            let driver = DRIVERS[which];
            let names = ["block", "tokio", "spin", "tokio-spin"];
            if args.only.as_deref().is_some_and(|o| o != names[which]) {
                rtt[which].push(0.0);
                continue;
            }
            done.set.set(false);
            node.barrier()?;
            let t0 = Instant::now();
            match driver {
                Driver::Block | Driver::Spin => {
                    node.set_wait_mode(if driver == Driver::Block {
                        WaitMode::Block
                    } else {
                        WaitMode::Spin
                    });
                    if me == 0 {
                        for i in 0..args.iters {
                            anyhow::ensure!(node.call(1, ECHO, &[i], &[])?.args == [i]);
                        }
                        node.request_short(1, DONE, &[])?;
                    } else {
                        node.wait_until(|| done.set.get())?;
                    }
                }
                Driver::Tokio | Driver::TokioSpin => {
                    let an = AsyncNode::new(node);
                    let iters = args.iters;
                    let work = {
                        let (an, done) = (an.clone(), done.clone());
                        async move {
                            if me == 0 {
                                for i in 0..iters {
                                    let r = an.call(1, ECHO, &[i], &[]).await?;
                                    anyhow::ensure!(r.args == [i]);
                                }
                                an.request_short(1, DONE, &[]).await?;
                            } else {
                                done.wait().await;
                            }
                            anyhow::Ok(())
                        }
                    };
                    // The work in a task of a LocalSet, as an application runs it, made
                    // progress for by `run` in the same task: a message that wakes it has it
                    // polled at once.
                    let local = tokio::task::LocalSet::new();
                    let an2 = an.clone();
                    local.block_on(&rt, async move {
                        tokio::task::spawn_local(async move {
                            if driver == Driver::Tokio {
                                an2.run(work).await
                            } else {
                                an2.run_spinning(work).await
                            }
                        })
                        .await
                    })???;
                    node = an
                        .into_node()
                        .map_err(|_| anyhow::anyhow!("a clone of the async node is left"))?;
                }
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(args.iters);
            rtt[which].push(us);
        }
    }
    node.set_wait_mode(WaitMode::Block);
    node.barrier()?;
    if me == 0 {
        let [b, t, s, ts] = rtt.map(|mut v| median(&mut v));
        println!(
            "{{\"transport\":\"{}\",\"spin_polls\":{},\"iters\":{},\"rounds\":{},\"block_us\":{b:.3},\"tokio_us\":{t:.3},\"spin_us\":{s:.3},\"tokio_spin_us\":{ts:.3},\"tokio_to_block\":{:.3},\"tokio_spin_to_spin\":{:.3}}}",
            node.transport().info().name,
            node.config().spin_polls,
            args.iters,
            args.rounds,
            t / b,
            ts / s
        );
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(2)
        .prefix_output(false);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    std::process::exit(code);
}
