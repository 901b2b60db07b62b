//! The ping-pong example runs and its `--json` output is what the README promises.

use std::path::PathBuf;
use std::process::Command;

/// Examples are built next to the test binaries' directory by `cargo test`.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} not built: `cargo test` builds examples unless filtered with --test; run `cargo build --example {name}` first",
        path.display()
    );
    path
}

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
    // short 0; medium 0, 8, 4096; long 0, 8, 4096
    assert_eq!(rows.len(), 7, "{text}");
    for row in &rows {
        for key in [
            "transport",
            "kind",
            "bytes",
            "iters",
            "rtt_us_p50",
            "rtt_us_p99",
            "msgs_per_s",
        ] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
        assert_eq!(row["transport"], "loopback");
        let p50 = row["rtt_us_p50"].as_f64().expect("number");
        let p99 = row["rtt_us_p99"].as_f64().expect("number");
        assert!(p50 > 0.0 && p99 >= p50, "{row}");
        assert!(row["msgs_per_s"].as_f64().expect("number") > 0.0);
    }
}
