//! Helpers for the cross-crate tests in `tests/tests/`: locating the workspace's binaries, and
//! the job files and commands several tests share ([`fixtures`]), and the real Kafka broker of
//! `scripts/kafka-testenv.sh` ([`kafka_broker`], also used by the operator's tests) and the real
//! Flink cluster of `scripts/flink-testenv.sh` ([`flink_cluster`]).
//!
//! The tests run the real `streamscale` and `streamscale-engine` binaries, built by
//! `cargo build --workspace --bins` (which `scripts/test.sh` runs before the tests).

use std::path::PathBuf;

/// Path of a workspace binary in the same target profile directory as the running test.
///
/// # Panics
/// When the binary has not been built, with the command that builds it.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    // target/<profile>/deps/<test> → target/<profile>/<name>
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .unwrap_or_else(|| panic!("unexpected test binary location {}", exe.display()));
    let bin = profile_dir.join(name);
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build --workspace --bins` first (scripts/test.sh does)",
        bin.display()
    );
    bin
}

pub mod fixtures;
pub mod flink_cluster;
pub mod kafka_broker;
