//! The ping-pong example runs and its `--json` output is what the README promises.

use std::process::Command;

mod common;
use common::example;

#[test]
fn pingpong_json_parses() {
    let out = Command::new(example("pingpong"))
        .args([
            "--iters", "200", "--warmup", "20", "--flood", "500", "--sizes", "0,8,4096", "--json",
        ])
        .output()
        .expect("run pingpong (built by cargo test)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    // short 0; medium 0, 8, 4096; long 0, 8, 4096; atomic on a u64, then on an f64
    assert_eq!(rows.len(), 9, "{text}");
    assert_eq!(rows[7]["kind"], "atomic");
    assert_eq!(rows[8]["kind"], "atomic-f64");
    for row in &rows {
        for key in [
            "transport",
            "kind",
            "bytes",
            "iters",
            "rtt_us_p50",
            "rtt_us_p99",
            "rtt_us_mean",
            "msgs_per_s",
            "replied_per_s",
        ] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
        assert_eq!(row["transport"], "loopback");
        let p50 = row["rtt_us_p50"].as_f64().expect("number");
        let p99 = row["rtt_us_p99"].as_f64().expect("number");
        assert!(p50 > 0.0 && p99 >= p50, "{row}");
        assert!(row["rtt_us_mean"].as_f64().expect("number") > 0.0, "{row}");
        assert!(row["msgs_per_s"].as_f64().expect("number") > 0.0);
        assert!(row["replied_per_s"].as_f64().expect("number") > 0.0);
    }
}

fn run_json(args: &[&str]) -> (Vec<serde_json::Value>, String) {
    let out = Command::new(example("pingpong"))
        .args(args)
        .output()
        .expect("run pingpong (built by cargo test)");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let rows = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    (rows, stderr)
}

#[test]
fn baseline_gives_the_floor_and_the_ratio() {
    let (rows, _) = run_json(&[
        "--iters",
        "200",
        "--warmup",
        "20",
        "--flood",
        "200",
        "--kind",
        "medium",
        "--sizes",
        "8,64",
        "--json",
        "--baseline",
    ]);
    assert_eq!(rows.len(), 2, "{rows:?}");
    for row in &rows {
        assert_eq!(row["kind"], "medium");
        let floor = row["baseline_rtt_us_p50"]
            .as_f64()
            .expect("a floor on loopback");
        let ratio = row["ratio"].as_f64().expect("a ratio");
        let p50 = row["rtt_us_p50"].as_f64().expect("number");
        assert!(floor > 0.0, "{row}");
        assert!((ratio - p50 / floor).abs() < 1e-9 * ratio.max(1.0), "{row}");
        assert!(row["baseline"].is_string(), "{row}");
        // The flood's floor: a raw ring between the two rank threads, and the ratio to it.
        let ring = row["ring_floor_msgs_per_s"].as_f64().expect("a ring floor");
        let to_ring = row["flood_to_ring"].as_f64().expect("a flood ratio");
        let rate = row["msgs_per_s"].as_f64().expect("number");
        assert!(ring > 0.0, "{row}");
        assert!(
            (to_ring - rate / ring).abs() < 1e-9 * to_ring.max(1.0),
            "{row}"
        );
    }
}

#[test]
fn more_ranks_kind_filter_and_oversized_payloads() {
    // Ranks 2 and 3 wait in barriers; a Medium above the transport's limit is skipped, with a
    // note on stderr, and Long is not measured at all.
    let (rows, stderr) = run_json(&[
        "--ranks",
        "4",
        "--iters",
        "100",
        "--warmup",
        "10",
        "--flood",
        "100",
        "--kind",
        "medium",
        "--sizes",
        "8,1000000",
        "--json",
        "--baseline",
    ]);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["kind"], "medium");
    assert_eq!(rows[0]["bytes"], 8);
    assert_eq!(rows[0]["ranks"], 4);
    assert_eq!(rows[0]["iters"], 100);
    assert!(
        stderr.contains("skipping medium of 1000000 bytes"),
        "{stderr}"
    );
}

/// The multi-process transports' floors: shared-memory cache-line ping-pong for the simulated
/// NICs, plain UDP ping-pong for udp, each measured in the same job as the AMs. (ofi's floor
/// is libfabric's own `fi_pingpong`, a program of its own: BENCHMARKS.md runs it beside.)
#[test]
fn process_transports_have_a_floor() {
    let process_transports = amnet::TransportKind::ALL
        .into_iter()
        .filter(|t| t.is_available() && !t.ranks_are_threads() && *t != amnet::TransportKind::Ofi);
    for transport in process_transports.map(|t| t.name()) {
        let out = Command::new(example("pingpong"))
            .args([
                "--transport",
                transport,
                "--baseline",
                "--json",
                "--kind",
                "short",
                "--iters",
                "300",
                "--warmup",
                "30",
                "--flood",
                "100",
            ])
            .output()
            .expect("run pingpong");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{transport}: {stderr}");
        let text = String::from_utf8(out.stdout).expect("utf-8");
        // Self-launched ranks are processes: the launcher prefixes their lines with "[rank] ".
        let rows: Vec<serde_json::Value> = text
            .lines()
            .map(|l| l.split_once("] ").map_or(l, |(_, rest)| rest))
            .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
            .collect();
        assert_eq!(rows.len(), 1, "{transport}: {text}");
        let floor = rows[0]["baseline_rtt_us_p50"].as_f64();
        let ratio = rows[0]["ratio"].as_f64();
        assert!(
            floor.is_some_and(|f| f > 0.0) && ratio.is_some_and(|r| r > 0.0),
            "{transport}: no floor in {}",
            rows[0]
        );
        // The shared-memory NICs also get the two-line floor; udp has no such thing.
        let two_line = rows[0]["two_line_rtt_us_p50"].as_f64();
        let ratio_two_line = rows[0]["ratio_two_line"].as_f64();
        let ring = rows[0]["ring_floor_msgs_per_s"].as_f64();
        if transport == "udp" {
            assert!(two_line.is_none(), "{transport}: {}", rows[0]);
            assert!(ring.is_none(), "{transport}: {}", rows[0]);
        } else {
            assert!(
                two_line.is_some_and(|f| f > 0.0) && ratio_two_line.is_some_and(|r| r > 0.0),
                "{transport}: no two-line floor in {}",
                rows[0]
            );
            assert!(
                ring.is_some_and(|f| f > 0.0) && rows[0]["flood_to_ring"].as_f64().is_some(),
                "{transport}: no ring floor in {}",
                rows[0]
            );
        }
    }
}

/// `--kind atomic` times remote fetch-and-adds (which check each other's old values) on every
/// transport here: a row of kind `atomic` (a `u64`) and one of kind `atomic-f64`, each with a
/// latency and a rate.
#[test]
fn atomic_row_on_every_transport() {
    let available = amnet::TransportKind::ALL
        .into_iter()
        .filter(|t| t.is_available());
    for transport in available.map(|t| t.name()) {
        let (rows, stderr) = run_json(&[
            "--transport",
            transport,
            "--iters",
            "200",
            "--warmup",
            "20",
            "--flood",
            "300",
            "--kind",
            "atomic",
            "--json",
        ]);
        assert_eq!(rows.len(), 2, "{transport}: {rows:?} {stderr}");
        for (row, kind) in rows.iter().zip(["atomic", "atomic-f64"]) {
            assert_eq!((&row["kind"], &row["bytes"]), (&kind.into(), &8.into()));
            assert!(row["rtt_us_p50"].as_f64().is_some_and(|v| v > 0.0), "{row}");
            assert!(row["msgs_per_s"].as_f64().is_some_and(|v| v > 0.0), "{row}");
        }
    }
}
