//! The distributed hash map example runs on every transport, in both modes, and under
//! `amrun`; its `--json` rows carry what the target compares (typed inserts per
//! second beside raw ones from the same job). The example checks every answer against its
//! local model and exits non-zero on a mismatch, so a run that succeeds is a checked run.

use std::process::Command;
use std::time::Duration;

mod common;
use common::{example, run_bounded, Run};

const WATCHDOG: Duration = Duration::from_secs(120);

fn hashmap(args: &[&str]) -> Run {
    let mut cmd = Command::new(example("hashmap"));
    cmd.args(args);
    run_bounded(cmd, WATCHDOG)
}

/// The rows of a run that must succeed.
fn rows(what: &str, run: Run) -> Vec<serde_json::Value> {
    assert_eq!(run.code, 0, "{what}:\n{}\n{}", run.stdout, run.stderr);
    run.stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one bare JSON object per line"))
        .collect()
}

/// Checks `rows` are the three phases in order, each with a row per mode of `modes` in
/// order, all of one job of `ranks` ranks on `transport` with `batch` operations per
/// message, and that typed rows carry a ratio exactly when raw ran too.
fn check_rows(
    rows: &[serde_json::Value],
    transport: &str,
    modes: &[&str],
    ranks: u64,
    batch: Option<u64>,
) {
    assert_eq!(rows.len(), 3 * modes.len(), "{transport}: {rows:?}");
    let expect = ["insert", "get", "remove"]
        .into_iter()
        .flat_map(|op| modes.iter().map(move |&m| (op, m)));
    for (row, (op, mode)) in rows.iter().zip(expect) {
        assert_eq!(row["transport"], transport, "{row}");
        assert_eq!(row["op"], op, "{row}");
        assert_eq!(row["mode"], mode, "{row}");
        assert_eq!(row["ranks"], ranks, "{row}");
        let b = row["batch"].as_u64().expect("batch");
        assert!(b >= 1, "{row}");
        if let Some(batch) = batch {
            assert_eq!(b, batch, "{row}");
        }
        let rate = row["ops_per_s"].as_f64().expect("ops_per_s");
        assert!(rate.is_finite() && rate > 0.0, "{row}");
        let ratio = row["ratio_to_raw"].as_f64();
        assert_eq!(
            ratio.is_some(),
            mode == "typed" && modes.len() == 2,
            "{row}"
        );
        assert!(ratio.is_none_or(|r| r.is_finite() && r > 0.0), "{row}");
    }
}

/// Both modes on every transport with the default batch, sized from each transport's
/// largest Medium. Catches a mode whose answers go wrong on some transport (the model check
/// fails the run), a default batch too large for a small Medium (sci's and portals': the
/// typed calls fail with `TypedTooLarge`), and missing or misnamed rows.
#[test]
fn both_modes_check_on_every_transport() {
    for transport in ["loopback", "sci", "extoll", "portals", "udp"] {
        let run = hashmap(&[
            "--transport",
            transport,
            "--ops",
            "3000",
            "--rounds",
            "1",
            "--json",
        ]);
        check_rows(&rows(transport, run), transport, &["raw", "typed"], 2, None);
    }
}

/// Small batches with a small window, on three ranks: many batches per target, windows that
/// fill and drain, and a last batch per target shorter than the others. Catches a lost or
/// doubled last batch, answers matched to the wrong batch when a window drains, and an
/// owner function that only works for two ranks.
#[test]
fn small_batches_and_window_check_on_three_ranks() {
    for transport in ["loopback", "sci"] {
        let run = hashmap(&[
            "--transport",
            transport,
            "--ranks",
            "3",
            "--ops",
            "2000",
            "--batch",
            "7",
            "--window",
            "2",
            "--rounds",
            "2",
            "--json",
        ]);
        check_rows(
            &rows(transport, run),
            transport,
            &["raw", "typed"],
            3,
            Some(7),
        );
    }
}

/// One mode alone gives that mode's rows only, and no ratio. Catches `--raw` or `--typed`
/// running the other mode, or a ratio made up without its baseline.
#[test]
fn one_mode_alone() {
    for mode in ["raw", "typed"] {
        let flag = format!("--{mode}");
        let run = hashmap(&[
            "--transport",
            "sci",
            "--ops",
            "1000",
            "--rounds",
            "1",
            &flag,
            "--json",
        ]);
        check_rows(&rows(mode, run), "sci", &[mode], 2, None);
    }
}

/// A value changed in a shard behind the job's back (the hidden `--spoil`) must fail the
/// run, with ranks as threads and as processes. Catches a check that cannot fail: one that
/// compares the answers with themselves, or is skipped.
#[test]
fn a_spoiled_shard_fails_the_check() {
    for transport in ["loopback", "sci"] {
        let run = hashmap(&[
            "--transport",
            transport,
            "--ops",
            "1000",
            "--rounds",
            "1",
            "--spoil",
            "--json",
        ]);
        assert_ne!(run.code, 0, "{transport}: the spoiled run succeeded");
        assert!(
            run.stderr.contains("the model says"),
            "{transport}: {}",
            run.stderr
        );
    }
}

/// A batch larger than the transport's Medium holds is refused up front with a message,
/// not sent. Catches a `--batch` that reaches the typed calls and fails there.
#[test]
fn a_batch_too_large_is_refused() {
    let run = hashmap(&["--transport", "sci", "--ops", "100", "--batch", "100000"]);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains("fit in a Medium"), "{}", run.stderr);
}

/// Under `amrun`, each process is one rank: three of them on sci run the example's checks.
/// Catches a rank count taken from `--ranks` instead of the job (the model and the owners
/// would disagree with the shards).
#[test]
fn runs_under_amrun() {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_amrun"));
    cmd.args(["-n", "3", "--no-prefix", "--transport", "sci", "--"])
        .arg(example("hashmap"))
        .args(["--ops", "2000", "--rounds", "1", "--json"]);
    let run = run_bounded(cmd, WATCHDOG);
    check_rows(&rows("amrun", run), "sci", &["raw", "typed"], 3, None);
}
