//! `amprobe`: show what a rank learns at bootstrap and exercise the launcher's
//! key-value store. A smoke test (`amrun -n 4 amprobe`, `mpiexec -n 4 amprobe`)
//! and the rank program of amnet's launch tests.

use std::time::Duration;

use am_launch::{JobInfo, KeyValueStore};
use clap::Parser;

/// Print `rank=R size=N job=J launcher=L transport=T pid=P`, then all-gather
/// through the launcher's key-value store (`kvs=ok`).
#[derive(Parser, Debug)]
#[command(name = "amprobe", version)]
struct Args {
    /// Exit with this code (see --exit-rank); also the code for --abort-rank
    #[arg(
        long,
        value_name = "C",
        default_value_t = 0,
        allow_negative_numbers = true
    )]
    exit_code: i32,
    /// Only this rank exits with --exit-code; the others exit 0
    #[arg(long, value_name = "R")]
    exit_rank: Option<u32>,
    /// Every rank but R sleeps (at most 300 s) instead of exiting
    #[arg(long, value_name = "R")]
    hang_unless_rank: Option<u32>,
    /// This rank panics after the all-gather
    #[arg(long, value_name = "R")]
    panic_rank: Option<u32>,
    /// This rank asks the launcher to abort the job with --exit-code, then sleeps
    #[arg(long, value_name = "R")]
    abort_rank: Option<u32>,
    /// Not under a launcher: start N copies of this program as a job (am_launch::self_launch)
    #[arg(long, value_name = "N")]
    self_launch: Option<u32>,
    #[arg(
        long,
        help = "Create /dev/shm/am-<job>-probe-<rank> (left for the launcher to remove)"
    )]
    touch_shm: bool,
}

/// Sleeps until killed; bounded so a broken launcher cannot leave it forever.
fn hang() -> ! {
    std::thread::sleep(Duration::from_secs(300));
    eprintln!("amprobe: still alive after 300 s; the launcher did not end the job");
    std::process::exit(124);
}

/// Every rank puts `k<rank>`, fences, then reads and checks every rank's key.
fn all_gather(kvs: &mut dyn KeyValueStore, rank: u32, size: u32, job: &str) -> Result<(), String> {
    let value = |r: u32| format!("r{r}-{job}");
    kvs.put(&format!("k{rank}"), &value(rank))
        .map_err(|e| e.to_string())?;
    kvs.fence().map_err(|e| e.to_string())?;
    for r in 0..size {
        let got = kvs.get(&format!("k{r}")).map_err(|e| e.to_string())?;
        if got != value(r) {
            return Err(format!("k{r} is {got:?}, expected {:?}", value(r)));
        }
    }
    Ok(())
}

fn main() {
    let args = Args::parse();
    if let Some(ranks) = args.self_launch {
        if !JobInfo::is_launched() {
            match am_launch::self_launch(ranks, None) {
                Ok(code) => std::process::exit(code),
                Err(e) => {
                    eprintln!("amprobe: self-launch failed: {e}");
                    std::process::exit(2);
                }
            }
        }
    }
    let mut info = match JobInfo::from_env() {
        Ok(info) => info,
        Err(e) => {
            eprintln!("amprobe: bootstrap failed: {e}");
            std::process::exit(2);
        }
    };
    let rank = info.rank;
    println!(
        "rank={rank} size={} job={} launcher={:?} transport={} pid={}",
        info.size,
        info.job_id,
        info.launcher,
        info.transport.as_deref().unwrap_or("none"),
        std::process::id()
    );

    if args.touch_shm {
        let path = format!("/dev/shm/am-{}-probe-{rank}", info.job_id);
        if let Err(e) = std::fs::write(&path, b"amprobe") {
            eprintln!("amprobe: cannot create {path}: {e}");
            std::process::exit(2);
        }
        println!("shm={path}");
    }

    match info.kvs.as_mut() {
        None => println!("kvs=none"),
        Some(kvs) => {
            if let Err(e) = all_gather(kvs.as_mut(), rank, info.size, &info.job_id) {
                println!("kvs=FAILED");
                eprintln!("amprobe: rank {rank}: key-value all-gather failed: {e}");
                std::process::exit(1);
            }
            println!("kvs=ok");
        }
    }

    if args.abort_rank == Some(rank) {
        let Some(kvs) = info.kvs.as_mut() else {
            eprintln!("amprobe: --abort-rank needs a launcher with a key-value store");
            std::process::exit(2);
        };
        if let Err(e) = kvs.abort(args.exit_code, "amprobe --abort-rank") {
            eprintln!("amprobe: abort failed: {e}");
            std::process::exit(2);
        }
        hang();
    }
    if args.panic_rank == Some(rank) {
        panic!("amprobe: --panic-rank {rank}");
    }
    if args.hang_unless_rank.is_some_and(|r| r != rank) {
        hang();
    }
    let code = match args.exit_rank {
        Some(r) if r != rank => 0,
        _ if args.abort_rank.is_some() => 0,
        _ => args.exit_code,
    };
    // Finalize PMI before exiting: hydra ends the job if a rank exits without.
    drop(info);
    std::process::exit(code);
}
