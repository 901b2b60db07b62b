//! `amrun`: start an amnet job of N local processes.

use std::ffi::OsString;
use std::io::ErrorKind;

use am_launch::{LaunchError, Launcher, TRANSPORTS};
use clap::builder::PossibleValuesParser;
use clap::Parser;

/// Start N copies of a program as the ranks of one amnet job on this host.
#[derive(Parser, Debug)]
#[command(
    name = "amrun",
    version,
    after_help = "\
Each rank gets AM_RANK, AM_SIZE, AM_JOB_ID (fresh per job), AM_LAUNCHER=amrun,
AM_PMI_FD (a PMI-1 key-value store served by amrun) and AM_TRANSPORT (with
--transport); amnet programs read them through am_launch::JobInfo::from_env().
Ranks read stdin from /dev/null and run in a process group of their own.

Exit status: the first non-zero exit code of any rank (128+S for a rank killed
by signal S), or the code a rank passed to PMI abort, or 0. When a rank fails,
the other ranks get SIGTERM, then SIGKILL a second later. SIGINT, SIGTERM or
SIGHUP to amrun end the job the same way (exit status 128+signal). Afterwards
/dev/shm/am-<job id>-* files are removed.

Example: amrun -n 4 --transport udp -- ./my_app --iterations 10"
)]
struct Args {
    /// Number of ranks (processes) to start
    #[arg(short = 'n', long = "ranks", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    ranks: u32,

    /// Transport the ranks should use (sets AM_TRANSPORT; unset by default)
    #[arg(long, value_name = "T", value_parser = PossibleValuesParser::new(TRANSPORTS))]
    transport: Option<String>,

    #[arg(
        long,
        help = "Do not prefix output lines with \"[rank] \"; ranks write straight to stdout/stderr"
    )]
    no_prefix: bool,

    /// Report the job id and shared-memory cleanup on stderr (also AM_LAUNCH_VERBOSE=1)
    #[arg(short, long)]
    verbose: bool,

    /// The program to run, then its arguments
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM [ARGS]"
    )]
    command: Vec<OsString>,
}

fn main() {
    let args = Args::parse();
    let Some((program, rest)) = args.command.split_first() else {
        unreachable!("clap requires a program")
    };
    let mut launcher = Launcher::new(args.ranks, program)
        .args(rest)
        .prefix_output(!args.no_prefix);
    if let Some(t) = &args.transport {
        launcher = launcher.transport(t);
    }
    if args.verbose {
        launcher = launcher.verbose(true);
    }
    let code = match launcher.run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("amrun: {e}");
            match &e {
                // Shell conventions for "not found" and "not executable".
                LaunchError::Spawn { source, .. } if source.kind() == ErrorKind::NotFound => 127,
                LaunchError::Spawn { source, .. }
                    if source.kind() == ErrorKind::PermissionDenied =>
                {
                    126
                }
                _ => 1,
            }
        }
    };
    std::process::exit(code);
}
