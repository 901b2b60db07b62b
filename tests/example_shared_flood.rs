//! The shared-node flood example on every transport: two processes (threads for loopback),
//! each flooding the other from four threads on one shared node and then from one thread,
//! every request handled exactly once (the example checks its counts), bounded in time.

use std::process::Command;
use std::time::Duration;

mod common;
use common::{example, run_bounded};

#[test]
fn threads_on_a_shared_node_flood_every_transport() {
    for transport in ["loopback", "sci", "extoll", "portals", "udp"] {
        let mut cmd = Command::new(example("shared_flood"));
        cmd.args(["--transport", transport, "--flood", "3000", "--rounds", "2"])
            .args(["--threads", "4"])
            // Four threads and two processes on however few cores: yield while waiting.
            .env("AM_WAIT", "yield");
        let run = run_bounded(cmd, Duration::from_secs(120));
        assert_eq!(run.code, 0, "{transport}: {}", run.stderr);
        let row: serde_json::Value = serde_json::from_str(run.stdout.trim())
            .unwrap_or_else(|e| panic!("{transport}: {e}: {}", run.stdout));
        assert_eq!(row["transport"], transport);
        assert!(
            row["shared_msgs_per_s"].as_f64().expect("number") > 0.0,
            "{row}"
        );
        assert!(
            row["single_msgs_per_s"].as_f64().expect("number") > 0.0,
            "{row}"
        );
    }
}
