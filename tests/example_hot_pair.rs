//! The hot-pair example at 64 ranks on every shared-memory NIC under dynamic credits: rank 0
//! floods rank 1 while the other 62 ranks trickle to it, and rank 1 counts every sender's
//! requests (the example fails unless each arrived exactly once, and with a payload, intact).
//! Bounded in time.

use std::process::Command;
use std::time::Duration;

mod common;
use common::{example, run_bounded};

#[test]
fn a_hot_pair_among_64_ranks_under_dynamic_credits_loses_nothing() {
    // AM Shorts, then Mediums of 900 B (sci's largest is 928 with a bank): on sci every
    // message of every sender claims a slot of rank 1's bank; on extoll, RMA Mediums from
    // every sender share rank 1's pool, and those that find it full go over VELO.
    for (transport, payload) in ["sci", "extoll", "portals"]
        .into_iter()
        .flat_map(|t| [(t, "0"), (t, "900")])
    {
        let mut cmd = Command::new(example("hot_pair"));
        cmd.args(["--transport", transport, "--ranks", "64"])
            .args(["--flood", "20000", "--trickle", "5", "--rounds", "2"])
            .args(["--payload", payload])
            .env("AM_CREDITS", "dynamic")
            .env_remove("AM_WAIT")
            .env_remove("AM_SEGMENT_SIZE");
        let run = run_bounded(cmd, Duration::from_secs(180));
        assert_eq!(run.code, 0, "{transport}: {}", run.stderr);
        let row: serde_json::Value = serde_json::from_str(run.stdout.trim())
            .unwrap_or_else(|e| panic!("{transport}: {e}: {}", run.stdout));
        assert_eq!(row["transport"], transport);
        assert_eq!(row["ranks"], 64);
        assert_eq!(row["credits"], "dynamic:2:32", "{row}");
        assert!(
            row["hot_msgs_per_s"].as_f64().expect("number") > 0.0,
            "{row}"
        );
        // The hot sender borrowed beyond its 2 initial credits.
        let held = row["held_toward_1"].as_u64().expect("number");
        assert!(
            held > 2,
            "{transport}: the hot sender holds {held} credits: {row}"
        );
    }
}
