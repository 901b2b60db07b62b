//! HPCC RandomAccess (GUPS) as a PGAS program on amnet.
//!
//! ```text
//! cargo run --release --example random_access -- [--transport T] [--ranks N] [--log2-table K]
//!     [--mode bucketed|fine|atomic|local] [--json]
//! ```
//!
//! A table of 2^K 64-bit words is spread in blocks over the ranks and lives in each rank's
//! registered segment, initialised `T[i] = i`. Each rank draws 4 × (its share of the table)
//! values `a` from its own sub-stream of the HPCC generator (POLY 7, started with HPCC's
//! `starts`) and applies `T[a & (2^K - 1)] ^= a`, GUPS being updates per second / 1e9. Updates
//! to another rank's block travel as active messages, and the target's handler applies them:
//!
//! - `bucketed` (default): updates are stored in one bucket per owner rank (this rank's own
//!   included, which keeps the loop free of a branch on the owner); a full bucket, or the
//!   fullest one when 1024 updates are stored (HPCC's look-ahead limit per rank), is applied
//!   locally or sent as one AM Medium of at most 1024 updates, whose handler XORs them straight
//!   from the received payload into the segment.
//! - `fine`: one AM Short per remote update, the value as two 32-bit arguments; updates to the
//!   own block are applied at once.
//! - `atomic`: one non-fetching remote atomic XOR per update (`Node::atomic_nbi` with
//!   `AtomicOp::Xor`), the way OpenSHMEM's GUPS is written, with no handler: on the
//!   shared-memory NICs and loopback it is one atomic instruction on the owner's word (in
//!   batches of 64 whose words are prefetched first), elsewhere a system message applied by the
//!   owner's progress. Updates to the own block are posted atomics too, since other ranks
//!   update it at the same time.
//! - `local`: no communication; each rank applies its whole sub-stream to its own block
//!   (word `(a & (2^K - 1)) * block / 2^K`), which is the memory-bound ceiling of the machine.
//!
//! Verification is HPCC's: the same stream is applied once more (XOR is its own inverse; the
//! replay uses `bucketed`, or `local` for `local`), and every word that is not `i` again is an
//! error. More than 1% wrong words is a failure: exit status 1. Each rank also checks that its
//! generator ends where the next rank's sub-stream starts, which checks `starts` exactly.
//!
//! `--ranks N` starts N ranks (threads on `loopback`, processes elsewhere); under `amrun`,
//! `mpiexec` or `srun` each process is one rank. Wait mode and credits: `AM_WAIT`,
//! `AM_CREDITS`; without `AM_WAIT`, ranks block instead of spinning when they outnumber the
//! cores.

use amnet::Local;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use amnet::{
    AmKind, AnyTransport, AtomicOp, Config, HandlerId, Handlers, JobOptions, Node, SharedBytes,
    Transport, TransportKind,
};
use clap::{Parser, ValueEnum};

#[derive(Parser, Debug)]
#[command(about = "HPCC RandomAccess (GUPS): random XOR updates to a table spread over the ranks")]
struct Args {
    /// Transport: loopback, sci, extoll, portals, udp, ofi
    #[arg(long, default_value = "loopback")]
    transport: TransportKind,
    /// Ranks to start when not under a launcher
    #[arg(long, default_value_t = 2)]
    ranks: u32,
    /// The table has 2^K 64-bit words in total
    #[arg(long, default_value_t = 24, value_parser = clap::value_parser!(u32).range(1..=40))]
    log2_table: u32,
    /// How remote updates travel
    #[arg(long, value_enum, default_value_t = Mode::Bucketed)]
    mode: Mode,
    /// One JSON object instead of a readable report
    #[arg(long)]
    json: bool,
    /// Test aid: rank 0 spoils this many of its words before verifying
    #[arg(long, hide = true, default_value_t = 0)]
    corrupt: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Updates packed per destination into AM Mediums of at most 1024
    Bucketed,
    /// One AM Short per remote update
    Fine,
    /// One remote atomic XOR per update, no handler
    Atomic,
    /// No communication: each rank updates its own block only (the memory-bound ceiling)
    Local,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Bucketed => "bucketed",
            Mode::Fine => "fine",
            Mode::Atomic => "atomic",
            Mode::Local => "local",
        }
    }
}

/// HPCC's primitive polynomial and the generator's period.
const POLY: u64 = 0x0000_0000_0000_0007;
const PERIOD: i64 = 1_317_624_576_693_539_401;
/// HPCC's limit on look-ahead and stored updates per rank, and on updates per message.
const MAX_STORED: usize = 1024;
/// Updates generated between two polls.
const POLL_EVERY: u64 = 1024;
/// Updates between two polls in `fine` mode, where every remote update is a message.
const FINE_POLL_EVERY: u64 = 64;

const BUCKET: HandlerId = HandlerId(1);
const FINE: HandlerId = HandlerId(2);
const COUNT: HandlerId = HandlerId(3);

/// Set by rank 0 when verification failed; read by `main` in the same process.
static FAILED: AtomicBool = AtomicBool::new(false);

/// One step of the HPCC generator.
#[inline(always)]
fn next(ran: u64) -> u64 {
    (ran << 1) ^ if (ran as i64) < 0 { POLY } else { 0 }
}

/// HPCC's `HPCC_starts(n)`: the generator's state after `n` steps from 1, in O(log n).
fn starts(n: i64) -> u64 {
    let mut n = n;
    while n < 0 {
        n += PERIOD;
    }
    while n > PERIOD {
        n -= PERIOD;
    }
    if n == 0 {
        return 1;
    }
    let mut m2 = [0u64; 64];
    let mut temp = 1u64;
    for m in m2.iter_mut() {
        *m = temp;
        temp = next(next(temp));
    }
    let mut i: i32 = 62;
    while i >= 0 && (n >> i) & 1 == 0 {
        i -= 1;
    }
    let mut ran = 2u64;
    while i > 0 {
        let mut t = 0u64;
        for (j, m) in m2.iter().enumerate() {
            if (ran >> j) & 1 != 0 {
                t ^= m;
            }
        }
        ran = t;
        i -= 1;
        if (n >> i) & 1 != 0 {
            ran = next(ran);
        }
    }
    ran
}

/// The block distribution of the table: the first `rem` ranks hold `min + 1` words, the others
/// `min` (HPCC's layout for any number of ranks).
#[derive(Debug, Clone, Copy)]
struct Layout {
    log2: u32,
    mask: u64,
    min: u64,
    rem: u64,
    /// `log2(min)` when every block is the same power of two: the owner is one shift away.
    shift: Option<u32>,
}

impl Layout {
    fn new(log2: u32, ranks: u32) -> anyhow::Result<Layout> {
        let words = 1u64 << log2;
        let ranks = u64::from(ranks);
        anyhow::ensure!(
            words >= ranks,
            "a table of 2^{log2} words cannot be spread over {ranks} ranks"
        );
        let (min, rem) = (words / ranks, words % ranks);
        let shift = (rem == 0 && min.is_power_of_two()).then(|| min.trailing_zeros());
        Ok(Layout {
            log2,
            mask: words - 1,
            min,
            rem,
            shift,
        })
    }

    fn words(&self) -> u64 {
        self.mask + 1
    }

    fn start(&self, rank: u32) -> u64 {
        let r = u64::from(rank);
        r * self.min + r.min(self.rem)
    }

    fn block(&self, rank: u32) -> u64 {
        self.min + u64::from(u64::from(rank) < self.rem)
    }

    /// The rank holding global word `g` (< 2^K).
    #[inline(always)]
    fn owner(&self, g: u64) -> u32 {
        match self.shift {
            Some(s) => (g >> s) as u32,
            None => {
                let top = (self.min + 1) * self.rem;
                if g < top {
                    (g / (self.min + 1)) as u32
                } else {
                    ((g - self.rem) / self.min) as u32
                }
            }
        }
    }
}

/// XORs `v` into word `off` of the table; false if out of range.
#[inline(always)]
fn xor_word(table: &[AtomicU64], off: u64, v: u64) -> bool {
    // Relaxed loads and stores are plain moves: a loop of them keeps many cache misses in
    // flight. Only this rank's handlers and loop write its block, so load-then-store is not
    // a lost update; the words are little-endian in memory, as the verification reads them.
    match usize::try_from(off).ok().and_then(|o| table.get(o)) {
        Some(w) => {
            w.store(w.load(Ordering::Relaxed) ^ v.to_le(), Ordering::Relaxed);
            true
        }
        None => false,
    }
}

/// The table: this rank's segment as 64-bit words (the segment starts page-aligned).
#[inline]
fn table(seg: SharedBytes<'_>) -> &[AtomicU64] {
    seg.words().unwrap_or(&[])
}

/// Applies a bucket of little-endian updates to this rank's block of `table`; returns how
/// many did not belong there (a bucket comes from a peer: never trusted).
#[inline]
fn apply_bucket(table: &[AtomicU64], bucket: &[u8], mask: u64, start: u64, block: u64) -> u64 {
    let mut bad = (bucket.len() % 8) as u64;
    for w in bucket.chunks_exact(8) {
        let a = u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        let off = (a & mask).wrapping_sub(start);
        if off >= block || !xor_word(table, off, a) {
            bad += 1;
        }
    }
    bad
}

/// Progress on stderr for long runs (rank 0 only, every few seconds).
struct Progress {
    enabled: bool,
    label: &'static str,
    start: Instant,
    last: Instant,
}

impl Progress {
    const EVERY: Duration = Duration::from_secs(3);

    fn new(enabled: bool, label: &'static str) -> Self {
        let now = Instant::now();
        Progress {
            enabled,
            label,
            start: now,
            last: now,
        }
    }

    #[inline]
    fn tick(&mut self, done: u64, total: u64) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if now.duration_since(self.last) >= Self::EVERY {
            self.last = now;
            eprintln!(
                "random_access: {} {:.0}% ({:.0} s)",
                self.label,
                100.0 * done as f64 / total.max(1) as f64,
                now.duration_since(self.start).as_secs_f64()
            );
        }
    }
}

/// What the handlers share with the rank's main loop.
#[derive(Default)]
struct Counters {
    /// Updates that arrived at a rank that does not hold their word (never, if correct).
    misrouted: Cell<u64>,
    /// Rank 0: reports received, and their sums.
    reports: Cell<u32>,
    errors: Cell<u64>,
    misrouted_sum: Cell<u64>,
    stream_bad: Cell<u32>,
}

fn handlers(lay: Layout, me: u32, c: &Rc<Counters>) -> anyhow::Result<Handlers<Local>> {
    let (start, block) = (lay.start(me), lay.block(me));
    let mut h = Handlers::local();
    let cc = c.clone();
    h.request(BUCKET, "ra-bucket", AmKind::Medium, move |msg, _token| {
        let bad = apply_bucket(table(msg.segment()), msg.payload(), lay.mask, start, block);
        if bad > 0 {
            cc.misrouted.set(cc.misrouted.get() + bad);
        }
    })?;
    let cc = c.clone();
    h.request(FINE, "ra-fine", AmKind::Short, move |msg, _token| {
        let ok = match *msg.args() {
            [lo, hi] => {
                let a = u64::from(lo) | u64::from(hi) << 32;
                let off = (a & lay.mask).wrapping_sub(start);
                off < block && xor_word(table(msg.segment()), off, a)
            }
            _ => false,
        };
        if !ok {
            cc.misrouted.set(cc.misrouted.get() + 1);
        }
    })?;
    let cc = c.clone();
    h.request(COUNT, "ra-count", AmKind::Short, move |msg, _token| {
        if let [e_lo, e_hi, m_lo, m_hi, bad] = *msg.args() {
            cc.errors
                .set(cc.errors.get() + (u64::from(e_lo) | u64::from(e_hi) << 32));
            cc.misrouted_sum
                .set(cc.misrouted_sum.get() + (u64::from(m_lo) | u64::from(m_hi) << 32));
            cc.stream_bad.set(cc.stream_bad.get() + bad);
        }
        cc.reports.set(cc.reports.get() + 1);
    })?;
    Ok(h)
}

/// The rank's sub-stream: where it starts and how many updates it draws.
fn sub_stream(lay: &Layout, me: u32) -> (u64, u64) {
    (starts(4 * lay.start(me) as i64), 4 * lay.block(me))
}

/// Applies this rank's whole sub-stream once in `mode`, and returns the generator's final state.
/// Every update is applied at its target when this returns on every rank.
fn run_updates(
    node: &mut Node<AnyTransport, Local>,
    lay: &Layout,
    mode: Mode,
    progress: &mut Progress,
) -> anyhow::Result<u64> {
    let me = node.rank();
    let (mut ran, total) = sub_stream(lay, me);
    let (start, block) = (lay.start(me), lay.block(me));
    let mask = lay.mask;
    let mut left = total;
    match mode {
        Mode::Local => {
            // Word (g * block) >> K of the own block: uniform over it, for any rank count.
            let (log2, block128) = (lay.log2, u128::from(block));
            while left > 0 {
                let n = left.min(POLL_EVERY * 64);
                let table = table(node.segment());
                for _ in 0..n {
                    ran = next(ran);
                    let off = ((u128::from(ran & mask) * block128) >> log2) as u64;
                    xor_word(table, off, ran);
                }
                left -= n;
                progress.tick(total - left, total);
            }
        }
        Mode::Fine => {
            while left > 0 {
                let n = left.min(FINE_POLL_EVERY);
                for _ in 0..n {
                    ran = next(ran);
                    let g = ran & mask;
                    let owner = lay.owner(g);
                    if owner == me {
                        xor_word(table(node.segment()), g - start, ran);
                    } else {
                        node.request_short(owner, FINE, &[ran as u32, (ran >> 32) as u32])?;
                    }
                }
                left -= n;
                node.poll()?;
                progress.tick(total - left, total);
            }
        }
        Mode::Atomic => {
            while left > 0 {
                let n = left.min(POLL_EVERY);
                for _ in 0..n {
                    ran = next(ran);
                    let g = ran & mask;
                    let owner = lay.owner(g);
                    let word = g - lay.start(owner);
                    // The own block too: others update it at the same time.
                    node.atomic_nbi(owner, word as usize * 8, AtomicOp::Xor(ran.to_le()))?;
                }
                left -= n;
                node.poll()?;
                progress.tick(total - left, total);
            }
        }
        Mode::Bucketed => {
            let size = node.size() as usize;
            let per_msg = MAX_STORED.min(node.max_medium() / 8);
            anyhow::ensure!(
                per_msg > 0,
                "the transport's AM Medium cannot hold one update"
            );
            // One bucket per rank, this one's included, so the loop has no branch on the
            // owner (a coin toss the CPU would mispredict half the time). Allocated once: the
            // hot loop only stores 8 bytes.
            let cap = per_msg * 8;
            let mut store = vec![0u8; size * cap];
            let mut fill = vec![0usize; size];
            let mut stored = 0usize;
            let me = me as usize;
            while left > 0 {
                let n = left.min(POLL_EVERY);
                let mut done = 0;
                let mut full = None;
                while done < n {
                    ran = next(ran);
                    done += 1;
                    let owner = lay.owner(ran & mask) as usize;
                    let at = owner * cap + fill[owner];
                    store[at..at + 8].copy_from_slice(&ran.to_le_bytes());
                    fill[owner] += 8;
                    stored += 1;
                    if fill[owner] == cap {
                        full = Some(owner);
                        break;
                    }
                    if stored == MAX_STORED {
                        break;
                    }
                }
                left -= done;
                if full.is_none() && stored == MAX_STORED {
                    full = (0..size).max_by_key(|&d| fill[d]);
                }
                if let Some(d) = full {
                    let bucket = &store[d * cap..d * cap + fill[d]];
                    if d == me {
                        apply_bucket(table(node.segment()), bucket, mask, start, block);
                    } else {
                        node.request_medium(d as u32, BUCKET, &[], bucket)?;
                    }
                    stored -= fill[d] / 8;
                    fill[d] = 0;
                }
                node.poll()?;
                progress.tick(total - left, total);
            }
            for d in 0..size {
                let bucket = &store[d * cap..d * cap + fill[d]];
                if d == me {
                    apply_bucket(table(node.segment()), bucket, mask, start, block);
                } else if !bucket.is_empty() {
                    node.request_medium(d as u32, BUCKET, &[], bucket)?;
                }
                fill[d] = 0;
            }
        }
    }
    // Every reply back means every update was applied; the barrier means everyone's were.
    node.quiesce()?;
    node.barrier()?;
    Ok(ran)
}

/// Sets `T[i] = i` over this rank's block.
fn init_table(node: &mut Node<AnyTransport, Local>, lay: &Layout) {
    let me = node.rank();
    let (start, block) = (lay.start(me), lay.block(me));
    let seg = node.segment();
    for i in 0..block {
        let _ = seg.store_u64(i as usize * 8, (start + i).to_le());
    }
}

/// Words of this rank's block that are not `i`.
fn count_errors(node: &Node<AnyTransport, Local>, lay: &Layout) -> u64 {
    let me = node.rank();
    let (start, block) = (lay.start(me), lay.block(me));
    let seg = node.segment();
    (0..block)
        .filter(|&i| {
            seg.load_u64(i as usize * 8)
                .map_or(true, |w| u64::from_le(w) != start + i)
        })
        .count() as u64
}

/// Bytes in binary units.
fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn split(v: u64) -> [u32; 2] {
    [v as u32, (v >> 32) as u32]
}

fn rank_main(transport: AnyTransport, args: &Args) -> anyhow::Result<()> {
    let name = transport.info().name;
    let size = transport.size();
    let me = transport.rank();
    let lay = Layout::new(args.log2_table, size)?;
    let need = lay.block(0) as usize * 8;
    anyhow::ensure!(
        transport.segment().len() >= need,
        "the segment has {} bytes but this rank's share of the table needs {need}: \
         unset AM_SEGMENT_SIZE or raise it",
        transport.segment().len()
    );
    let counters = Rc::new(Counters::default());
    let mut node = Node::new(
        transport,
        handlers(lay, me, &counters)?,
        Config::from_env_for_ranks(size)?,
    )?;
    let talk = me == 0;

    init_table(&mut node, &lay);
    node.barrier()?;
    let t0 = Instant::now();
    let mut progress = Progress::new(talk, "updates");
    run_updates(&mut node, &lay, args.mode, &mut progress)?;
    let seconds = t0.elapsed().as_secs_f64();
    if me == 0 && args.corrupt > 0 {
        let seg = node.segment();
        for off in 0..args.corrupt.min(lay.block(0)) {
            xor_word(table(seg), off, 1 << 63);
        }
    }

    // Verification: the same stream again undoes every update that was applied exactly once.
    let replay = match args.mode {
        Mode::Local => Mode::Local,
        Mode::Bucketed | Mode::Fine | Mode::Atomic => Mode::Bucketed,
    };
    let t1 = Instant::now();
    let mut progress = Progress::new(talk, "verification");
    let end = run_updates(&mut node, &lay, replay, &mut progress)?;
    let next_start = 4 * (lay.start(me) + lay.block(me));
    let stream_ok = end == starts(next_start as i64);
    let errors = count_errors(&node, &lay);
    let misrouted = counters.misrouted.get();
    if me != 0 {
        let [e_lo, e_hi] = split(errors);
        let [m_lo, m_hi] = split(misrouted);
        node.request_short(0, COUNT, &[e_lo, e_hi, m_lo, m_hi, u32::from(!stream_ok)])?;
    } else {
        node.wait_until(|| counters.reports.get() == size - 1)?;
    }
    node.quiesce()?;
    node.barrier()?;
    let verify_seconds = t1.elapsed().as_secs_f64();
    if me != 0 {
        return Ok(());
    }

    let errors = errors + counters.errors.get();
    let misrouted = misrouted + counters.misrouted_sum.get();
    let stream_ok = stream_ok && counters.stream_bad.get() == 0;
    let words = lay.words();
    let updates = 4 * words;
    let error_fraction = errors as f64 / words as f64;
    let verified = error_fraction <= 0.01 && misrouted == 0 && stream_ok;
    let gups = updates as f64 / seconds / 1e9;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "benchmark": "RandomAccess", "transport": name, "ranks": size,
                "mode": args.mode.name(), "log2_table": args.log2_table, "table_words": words,
                "table_bytes": words * 8, "updates": updates, "seconds": seconds, "gups": gups,
                "errors": errors, "error_fraction": error_fraction, "misrouted": misrouted,
                "stream_ok": stream_ok, "verified": verified, "verify_seconds": verify_seconds,
                "credits": node.config().credits.unwrap_or_default().to_string(),
                "max_stored_updates": MAX_STORED,
            })
        );
    } else {
        println!(
            "# HPCC RandomAccess on {name}, {size} ranks, mode {}",
            args.mode.name()
        );
        println!(
            "table:     2^{} = {words} words ({}, {} per rank)",
            args.log2_table,
            human(words * 8),
            human(lay.block(0) * 8)
        );
        println!("updates:   {updates} (4 per word)");
        println!("time:      {seconds:.3} s");
        println!("GUPS:      {gups:.5}");
        println!(
            "errors:    {errors} of {words} words ({:.4}%){}",
            100.0 * error_fraction,
            if misrouted > 0 {
                format!(", {misrouted} misrouted updates")
            } else {
                String::new()
            }
        );
        println!(
            "verified:  {} (replay in {verify_seconds:.3} s{})",
            if verified { "PASSED" } else { "FAILED" },
            if stream_ok {
                ""
            } else {
                "; the generator did not end where the next rank's stream starts"
            }
        );
    }
    if !verified {
        FAILED.store(true, Ordering::Relaxed);
    }
    Ok(())
}

/// The job size announced by the launcher, read before the rank bootstraps (which may happen
/// once per process); 1 if unknown, which sizes the segment for the whole table.
fn launched_size() -> u32 {
    [
        "AM_SIZE",
        "PMI_SIZE",
        "SLURM_NTASKS",
        "OMPI_COMM_WORLD_SIZE",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.parse::<u32>().ok())
    .unwrap_or(1)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Each rank's block lives in its segment, sized for the job's rank count.
    let ranks = if amnet::am_launch::JobInfo::is_launched() {
        launched_size()
    } else {
        args.ranks
    };
    let lay = Layout::new(args.log2_table, ranks.max(1))?;
    let opts = JobOptions::new()
        .transport(args.transport)
        .ranks(args.ranks)
        .segment_size((lay.block(0) as usize * 8).max(4096))
        // One JSON object per line, unprefixed, even when the ranks are processes.
        .prefix_output(!args.json);
    let code = amnet::run_job(&opts, |t| rank_main(t, &args))?;
    if FAILED.load(Ordering::Relaxed) {
        std::process::exit(1);
    }
    std::process::exit(code);
}
