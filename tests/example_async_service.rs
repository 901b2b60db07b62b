//! The async key-value service example on every transport: two processes (threads for
//! loopback), client tasks storing and reading back keys through calls on a tokio `LocalSet`
//! (the example checks every answer), then idle with the driver asleep, bounded in time.

use std::process::Command;
use std::time::Duration;

mod common;
use common::{example, run_bounded};

#[test]
fn the_async_service_runs_on_every_transport() {
    for transport in ["loopback", "sci", "extoll", "portals", "udp"] {
        let mut cmd = Command::new(example("async_service"));
        cmd.args(["--transport", transport, "--clients", "4", "--keys", "100"])
            .args(["--idle-ms", "500"]);
        let run = run_bounded(cmd, Duration::from_secs(120));
        assert_eq!(run.code, 0, "{transport}: {}", run.stderr);
        let row: serde_json::Value = serde_json::from_str(run.stdout.trim())
            .unwrap_or_else(|e| panic!("{transport}: {e}: {}", run.stdout));
        assert_eq!(row["transport"], transport);
        assert_eq!(row["calls"], 800, "{row}");
        // Keys spread over both shards.
        let keys = row["shard_keys"].as_u64().expect("number");
        assert!(keys > 0 && keys < 800, "{row}");
        // Asleep, not polling: a polling driver would use a whole core.
        let idle = row["idle_cpu_percent"].as_f64().expect("number");
        assert!(idle < 10.0, "{transport}: idle node used {idle}% of a core");
    }
}
