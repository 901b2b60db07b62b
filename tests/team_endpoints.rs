//! Teams over several endpoints per process (`run_job_endpoints`): the world team is every
//! endpoint of every process, and the two splits endpoints make natural (one team per
//! process, one per endpoint index) run collectives, each endpoint driven by a thread of its
//! own, or all of a process's endpoints by one thread (`Node::start_all`, `_nb` starts,
//! `wait_any`). Loopback: the processes are threads of this one, nothing is left behind.

use std::time::{Duration, Instant};

use amnet::{
    AnyTransport, Config, EndpointLayout, Handlers, JobOptions, Node, Op, Outcome, ReduceOp, Team,
    WaitMode,
};

const PROCESSES: u32 = 2;
const PER_PROCESS: u32 = 2;
/// Safety net only: each job ends in well under a second.
const PATIENCE: Duration = Duration::from_secs(30);

fn opts() -> JobOptions {
    JobOptions::new().ranks(PROCESSES)
}

fn config() -> Config {
    Config::default().wait_mode(WaitMode::Block)
}

/// The world ranks of the job whose `of` is `which`, in rank order.
fn model(layout: EndpointLayout, of: impl Fn(u32) -> u32, which: u32) -> Vec<u32> {
    (0..layout.ranks()).filter(|&r| of(r) == which).collect()
}

/// Checks rank `me`'s two split teams (by process, by index) against the model, and the
/// all-reduce `sums` and the broadcasts from team rank 1 (`casts`) on the world, by process
/// and by index.
fn check(
    layout: EndpointLayout,
    me: u32,
    teams: [&Team; 2],
    sums: [u64; 3],
    casts: [Vec<u8>; 3],
) -> Result<(), String> {
    let by_process = model(layout, |r| layout.process_of(r), layout.process_of(me));
    let by_index = model(layout, |r| layout.endpoint_of(r), layout.endpoint_of(me));
    let world: Vec<u32> = (0..layout.ranks()).collect();
    if teams[0].members() != by_process || teams[1].members() != by_index {
        return Err(format!(
            "rank {me}: teams {:?} and {:?}, not {by_process:?} and {by_index:?}",
            teams[0].members(),
            teams[1].members()
        ));
    }
    for (i, members) in [&world, &by_process, &by_index].into_iter().enumerate() {
        let sum: u64 = members.iter().map(|&r| u64::from(r) + 1).sum();
        let root = members[1 % members.len()];
        if sums[i] != sum || casts[i] != bytes(root) {
            return Err(format!(
                "rank {me}, team {i} {members:?}: sum {} (not {sum}), broadcast {:?}",
                sums[i], casts[i]
            ));
        }
    }
    Ok(())
}

/// What world rank `root` broadcasts: more than one Medium of loopback's, in chunks.
fn bytes(root: u32) -> Vec<u8> {
    (0..100_000u32).map(|i| (i ^ root) as u8).collect()
}

/// Each endpoint on a thread of its own, with the blocking calls. Catches a world team that
/// counts one process's endpoints only, a split by process or by index that orders or
/// groups them wrongly, and collectives of two endpoints of one process that mix.
#[test]
fn endpoints_on_a_thread_each_run_collectives_on_their_splits() {
    let code = amnet::run_job_endpoints(&opts(), PER_PROCESS, |endpoints| {
        let layout = endpoints.layout();
        std::thread::scope(|s| {
            let threads: Vec<_> = endpoints
                .into_transports()
                .into_iter()
                .map(|t| s.spawn(move || one_thread_each(t, layout)))
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap_or_else(|_| Err("a thread panicked".into())))
                .collect::<Result<Vec<()>, String>>()
        })
        .map(drop)
    })
    .expect("the job");
    assert_eq!(code, 0);
}

fn one_thread_each(t: AnyTransport, layout: EndpointLayout) -> Result<(), String> {
    let e = |e: amnet::AmError| e.to_string();
    let mut node = Node::new(t, Handlers::new(), config()).map_err(|e| e.to_string())?;
    let me = node.rank();
    let world = node.world_team();
    let colors = [layout.process_of(me), layout.endpoint_of(me)];
    let mut teams = Vec::new();
    for color in colors {
        teams.push(
            node.split(&world, Some(color), 0)
                .map_err(e)?
                .ok_or("no team")?,
        );
    }
    let mut sums = [0; 3];
    let mut casts: [Vec<u8>; 3] = Default::default();
    for (i, team) in [&world, &teams[0], &teams[1]].into_iter().enumerate() {
        sums[i] = node
            .team_all_reduce(team, ReduceOp::Sum, &[u64::from(me) + 1])
            .map_err(e)?[0];
        let data = if team.rank() == 1 % team.size() {
            bytes(me)
        } else {
            Vec::new()
        };
        casts[i] = node
            .team_broadcast(team, 1 % team.size(), &data)
            .map_err(e)?;
    }
    check(layout, me, [&teams[0], &teams[1]], sums, casts)?;
    node.team_barrier(&world).map_err(e)
}

/// Waits for one operation per node, all driven by this thread: polls each, and sleeps in
/// `wait_any` while none completes; bounded.
fn all<U: Outcome<Value = U>>(
    nodes: &mut [Node<AnyTransport>],
    ops: Vec<Op<U>>,
) -> Result<Vec<U>, String> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut done = true;
        for (node, op) in nodes.iter_mut().zip(&ops) {
            done &= node.test(op).map_err(|e| e.to_string())?;
        }
        if done {
            break;
        }
        if Instant::now() > deadline {
            return Err("collectives not complete in time".into());
        }
        let mut refs: Vec<&mut Node<AnyTransport>> = nodes.iter_mut().collect();
        amnet::wait_any(&mut refs, Duration::from_millis(10)).map_err(|e| e.to_string())?;
    }
    nodes
        .iter_mut()
        .zip(ops)
        .map(|(node, op)| node.wait(op).map_err(|e| e.to_string()))
        .collect()
}

/// Both endpoints of each process on one thread: every collective started on each node
/// (`_nb`), then completed together. Catches a collective that only a blocking wait on its
/// own node advances (the other endpoint's steps would never be sent, and this thread would
/// wait for ever), and a split whose result depends on which node is waited first.
#[test]
fn endpoints_on_one_thread_run_collectives_with_nb_and_wait_any() {
    let code = amnet::run_job_endpoints(&opts(), PER_PROCESS, |endpoints| {
        let layout = endpoints.layout();
        let parts = endpoints
            .into_transports()
            .into_iter()
            .map(|t| (t, Handlers::new()));
        let mut nodes = Node::start_all(parts, config()).map_err(|e| e.to_string())?;
        let e = |e: amnet::AmError| e.to_string();
        let ranks: Vec<u32> = nodes.iter().map(|n| n.rank()).collect();
        let worlds: Vec<Team> = nodes.iter().map(|n| n.world_team()).collect();
        let mut teams: Vec<Vec<Team>> = vec![Vec::new(); nodes.len()];
        for of in [
            (|l: EndpointLayout, r| l.process_of(r)) as fn(EndpointLayout, u32) -> u32,
            |l, r| l.endpoint_of(r),
        ] {
            let ops = nodes
                .iter_mut()
                .zip(&worlds)
                .zip(&ranks)
                .map(|((n, w), &r)| n.split_nb(w, Some(of(layout, r)), 0))
                .collect::<Result<Vec<_>, _>>()
                .map_err(e)?;
            for (k, team) in all(&mut nodes, ops)?.into_iter().enumerate() {
                teams[k].push(team.ok_or("no team")?);
            }
        }
        let mut sums = vec![[0u64; 3]; nodes.len()];
        let mut casts: Vec<[Vec<u8>; 3]> = vec![Default::default(); nodes.len()];
        for i in 0..3 {
            let team = |k: usize| if i == 0 { &worlds[k] } else { &teams[k][i - 1] };
            let ops = (0..nodes.len())
                .map(|k| {
                    nodes[k].team_all_reduce_nb(team(k), ReduceOp::Sum, &[u64::from(ranks[k]) + 1])
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(e)?;
            for (k, v) in all(&mut nodes, ops)?.into_iter().enumerate() {
                sums[k][i] = v[0];
            }
            let ops = (0..nodes.len())
                .map(|k| {
                    let t = team(k);
                    let data = if t.rank() == 1 % t.size() {
                        bytes(ranks[k])
                    } else {
                        Vec::new()
                    };
                    nodes[k].team_broadcast_nb(t, 1 % t.size(), &data)
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(e)?;
            for (k, v) in all(&mut nodes, ops)?.into_iter().enumerate() {
                casts[k][i] = v;
            }
        }
        for k in 0..nodes.len() {
            check(
                layout,
                ranks[k],
                [&teams[k][0], &teams[k][1]],
                sums[k],
                casts[k].clone(),
            )?;
        }
        let ops = nodes
            .iter_mut()
            .zip(&worlds)
            .map(|(n, w)| n.team_barrier_nb(w))
            .collect::<Result<Vec<_>, _>>()
            .map_err(e)?;
        all(&mut nodes, ops).map(drop)
    })
    .expect("the job");
    assert_eq!(code, 0);
}
