//! The RandomAccess example verifies on loopback in every mode, prints the JSON the README
//! promises, and fails (exit status 1) when more than 1% of the table is wrong.

use std::process::{Command, Output};

mod common;
use common::{example, run_bounded};

fn run(args: &[&str]) -> (Output, serde_json::Value) {
    let out = Command::new(example("random_access"))
        .args(args)
        .env_remove("AM_SEGMENT_SIZE")
        .output()
        .expect("run random_access (built by cargo test)");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    // The whole of stdout is the JSON object, also when the ranks are processes (the
    // launcher's `[rank] ` prefixes are off under --json), so `| jq` works.
    let json = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "one JSON object expected ({e}): {text}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out, json)
}

fn check_keys(row: &serde_json::Value) {
    for key in [
        "transport",
        "ranks",
        "mode",
        "table_words",
        "updates",
        "seconds",
        "gups",
        "errors",
        "error_fraction",
        "verified",
    ] {
        assert!(row.get(key).is_some(), "{key} missing in {row}");
    }
}

#[test]
fn every_mode_verifies_on_every_transport() {
    let available = amnet::TransportKind::ALL
        .into_iter()
        .filter(|t| t.is_available());
    for transport in available.map(|t| t.name()) {
        for mode in ["bucketed", "fine", "atomic", "local"] {
            let (out, row) = run(&[
                "--transport",
                transport,
                "--log2-table",
                "14",
                "--mode",
                mode,
                "--json",
            ]);
            assert!(
                out.status.success(),
                "{transport} {mode}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            check_row(&row, transport, mode);
            // Not the 1% HPCC allows: a lost posted atomic or message would show here.
            assert_eq!(row["errors"], 0, "{transport} {mode}: {row}");
        }
    }
}

fn check_row(row: &serde_json::Value, transport: &str, mode: &str) {
    check_keys(row);
    assert_eq!(row["transport"], transport);
    assert_eq!(row["mode"], mode);
    assert_eq!(row["ranks"], 2);
    assert_eq!(row["table_words"], 1 << 14);
    assert_eq!(row["updates"], 4 << 14);
    assert_eq!(row["errors"], 0, "{row}");
    assert_eq!(row["verified"], true, "{row}");
    assert!(row["gups"].as_f64().expect("number") > 0.0);
}

#[test]
fn uneven_blocks_verify() {
    // 3 ranks: blocks of 2^13 / 3 words, owners found by division rather than a shift.
    let (out, row) = run(&["--log2-table", "13", "--ranks", "3", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(row["ranks"], 3);
    assert_eq!(row["errors"], 0, "{row}");
    assert_eq!(row["verified"], true, "{row}");
}

#[test]
fn wrong_words_are_counted_and_over_one_percent_fails() {
    // 1024 words: 5 wrong (0.5%) passes, 20 wrong (2%) fails with exit status 1.
    let (out, row) = run(&["--log2-table", "10", "--corrupt", "5", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(row["errors"], 5, "{row}");
    assert_eq!(row["verified"], true, "{row}");
    let (out, row) = run(&["--log2-table", "10", "--corrupt", "20", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{row}");
    assert_eq!(row["errors"], 20, "{row}");
    assert_eq!(row["verified"], false, "{row}");
}

#[test]
fn readable_report_names_the_numbers() {
    let out = Command::new(example("random_access"))
        .args(["--log2-table", "12"])
        .output()
        .expect("run random_access");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for word in ["table:", "updates:", "time:", "GUPS:", "errors:", "PASSED"] {
        assert!(text.contains(word), "{word} missing in {text}");
    }
}

/// Over UDP with 10% loss, 1% duplication and reordering injected into every rank's datagrams,
/// RandomAccess still verifies with 0 wrong words in every mode that talks: a lost or doubled
/// XOR update (a message, or a remote atomic sent as one) would show.
#[test]
fn udp_under_loss_and_duplication_verifies() {
    for mode in ["bucketed", "fine", "atomic"] {
        let out = Command::new(example("random_access"))
            .args([
                "--transport",
                "udp",
                "--ranks",
                "3",
                "--log2-table",
                "12",
                "--mode",
                mode,
                "--json",
            ])
            .env_remove("AM_SEGMENT_SIZE")
            .env("AM_UDP_FAULTS", "drop=0.1,dup=0.01,delay=0.05,seed=11")
            .output()
            .expect("run random_access");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let object = text.find('{').map_or("", |at| text[at..].trim());
        let row: serde_json::Value = serde_json::from_str(object).unwrap_or_else(|e| {
            panic!(
                "{mode}: one JSON object expected ({e}): {text}\nstderr: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert!(out.status.success(), "{mode}: {row}");
        assert_eq!(row["errors"], 0, "{mode}: {row}");
        assert_eq!(row["verified"], true, "{mode}: {row}");
    }
}

/// A job whose configuration chooses no credits gets its transport's (udp: 128 per peer, to
/// cover its round trip; loopback: the core's 32; sci, portals and extoll: dynamic ones from
/// 256 ranks on, which their receive memory is laid out for), and `AM_CREDITS` still wins.
#[test]
fn credits_are_the_transports_unless_am_credits_chooses() {
    let credits = |transport: &str, am_credits: Option<&str>| credits_of(transport, 2, am_credits);
    assert_eq!(credits("udp", None), "128");
    assert_eq!(credits("udp", Some("8")), "8");
    assert_eq!(credits("loopback", None), "32");
    assert_eq!(credits("portals", None), "32");
    let ranks = amnet::credit::DYNAMIC_FROM_RANKS;
    assert_eq!(credits_of("portals", ranks - 1, None), "32");
    assert_eq!(credits_of("portals", ranks, None), "dynamic:2:32");
    // `AM_CREDITS` is taken before the default for the job's size (which is only the
    // fallback), so a job of 2 ranks shows that it wins.
    assert_eq!(credits_of("portals", 2, Some("4")), "4");
    assert_eq!(credits("extoll", None), "32");
    assert_eq!(credits_of("extoll", ranks, None), "dynamic:2:32");
    assert_eq!(credits("sci", None), "32");
    assert_eq!(credits_of("sci", ranks, None), "dynamic:2:32");
}

/// The credits a `random_access --json` job of `ranks` ranks on `transport` reports.
fn credits_of(transport: &str, ranks: u32, am_credits: Option<&str>) -> String {
    let mut cmd = Command::new(example("random_access"));
    let ranks = ranks.to_string();
    cmd.args(["--transport", transport, "--log2-table", "10", "--json"])
        .args(["--ranks", &ranks])
        .env_remove("AM_SEGMENT_SIZE")
        .env_remove("AM_CREDITS");
    if let Some(c) = am_credits {
        cmd.env("AM_CREDITS", c);
    }
    let run = run_bounded(cmd, std::time::Duration::from_secs(120));
    let row: serde_json::Value = serde_json::from_str(run.stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "{transport}: one JSON object expected ({e}): {}",
            run.stdout
        )
    });
    assert_eq!(run.code, 0, "{transport}: {row} {}", run.stderr);
    row["credits"].as_str().expect("credits").to_owned()
}
