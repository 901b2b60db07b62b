//! The RMA bandwidth example runs on every transport and its `--json` rows carry what the
//! README and BENCHMARKS quote: bandwidth per op and size (puts and gets from a buffer and
//! from the segment, into and from a segment created and published as the job runs, AM
//! Longs into it, and between created segments),
//! and the copy floor beside it.

use std::process::Command;
use std::time::Duration;

mod common;
use common::{example, run_bounded};

fn rows(transport: &str) -> Vec<serde_json::Value> {
    let mut cmd = Command::new(example("rma"));
    cmd.args([
        "--transport",
        transport,
        "--sizes",
        "0,5,4096,65536",
        "--bytes",
        "4096",
        "--reps",
        "2",
        "--baseline",
        "--json",
    ]);
    let run = run_bounded(cmd, Duration::from_secs(120));
    assert_eq!(run.code, 0, "{transport}: {}", run.stderr);
    run.stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one bare JSON object per line"))
        .collect()
}

#[test]
fn put_and_get_rows_on_every_transport() {
    for transport in ["loopback", "sci", "extoll", "portals", "udp"] {
        let rows = rows(transport);
        assert_eq!(rows.len(), 36, "{transport}: {rows:?}");
        for (row, (op, bytes)) in rows
            .iter()
            .zip([0, 5, 4096, 65536].into_iter().flat_map(|b| {
                [
                    "put", "get", "put_seg", "get_seg", "put_to", "get_from", "long_to", "seg_to",
                    "seg_from",
                ]
                .map(|op| (op, b))
            }))
        {
            assert_eq!(row["transport"], transport);
            assert_eq!(row["op"], op, "{row}");
            assert_eq!(row["bytes"], bytes, "{row}");
            let bw = row["bytes_per_s"].as_f64().expect("bytes_per_s");
            assert!(bw.is_finite() && (bw > 0.0 || bytes == 0), "{row}");
            // Every transport but UDP has a copy floor measured beside it.
            let floor = row["floor_bytes_per_s"].as_f64();
            assert_eq!(floor.is_some(), transport != "udp", "{row}");
            let with_ratio = floor.is_some() && bytes > 0;
            assert_eq!(row["ratio"].as_f64().is_some(), with_ratio, "{row}");
        }
    }
}
