//! Helpers shared by the example tests.

use std::path::PathBuf;

/// An example binary, built next to the test binaries' directory by `cargo test`.
pub fn example(name: &str) -> PathBuf {
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
