//! The real Apache Flink 2.3 session cluster of `scripts/flink-testenv.sh` (one JobManager,
//! one TaskManager with 4 slots, on fixed loopback ports): its installation's paths and a
//! guard that stops it. Tests that start it live in separate test binaries, which cargo runs
//! one at a time.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or_else(|| panic!("no workspace root above {}", env!("CARGO_MANIFEST_DIR")))
        .to_path_buf()
}

/// Runs `scripts/flink-testenv.sh ARGS`.
///
/// # Panics
/// When the script cannot be run.
pub fn testenv(args: &[&str]) -> Output {
    Command::new(root().join("scripts/flink-testenv.sh"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run scripts/flink-testenv.sh: {e}"))
}

/// The `KEY=value` lines of `flink-testenv.sh env` when Flink and the jars named by `jars`
/// (keys of those lines, e.g. `FLINK_DEMO_JAR`) are installed; `None` (the test is skipped)
/// when they are not.
///
/// # Panics
/// When they are not installed and `CI=true`: CI must run the test.
pub fn flink_env(jars: &[&str]) -> Option<BTreeMap<String, String>> {
    let out = testenv(&["env"]);
    let env: BTreeMap<String, String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.trim_matches(['"', '\'']).to_string()))
        .collect();
    let installed = out.status.success()
        && jars
            .iter()
            .all(|k| env.get(*k).is_some_and(|j| Path::new(j).is_file()));
    if installed {
        return Some(env);
    }
    let why = format!(
        "Flink is not installed (run scripts/flink-testenv.sh install): {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{why}");
    }
    eprintln!("SKIP: {why}");
    None
}

/// Stops the cluster when dropped (the test ends, passed or not).
pub struct Cluster;

impl Cluster {
    /// Starts a fresh cluster (one left running is stopped first) with `extra_config`
    /// (`FLINK_EXTRA_CONFIG` lines) and `args` (e.g. `--scheduler default`).
    ///
    /// # Panics
    /// When the cluster does not start.
    pub fn start(extra_config: &str, args: &[&str]) -> Cluster {
        let _ = testenv(&["stop"]);
        let started = Command::new(root().join("scripts/flink-testenv.sh"))
            .arg("start")
            .args(args)
            .env("FLINK_EXTRA_CONFIG", extra_config)
            .output()
            .unwrap_or_else(|e| panic!("run scripts/flink-testenv.sh start: {e}"));
        assert!(
            started.status.success(),
            "cluster did not start: {}",
            String::from_utf8_lossy(&started.stderr)
        );
        Cluster
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = testenv(&["stop"]);
    }
}

/// `GET url` of the cluster's REST API through `curl` (the workspace's reqwest has no blocking
/// client, and these tests need no async runtime of their own), the answer as JSON;
/// `Value::Null` when it is none (the cluster gone, a timeout).
///
/// # Panics
/// When curl cannot be run.
pub fn get_json(url: &str) -> serde_json::Value {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "60", url])
        .output()
        .unwrap_or_else(|e| panic!("run curl: {e}"));
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// A job's state and its parallelism per vertex name, from its `GET /jobs/:jid` answer.
pub fn job_parallelism(job: &serde_json::Value) -> (String, BTreeMap<String, u64>) {
    let p = job["vertices"]
        .as_array()
        .map(|vs| {
            vs.iter()
                .map(|v| {
                    (
                        v["name"].as_str().unwrap_or("").to_string(),
                        v["parallelism"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    (job["state"].as_str().unwrap_or("?").to_string(), p)
}

/// Waits (at most 90 s) until job `jid` of the cluster at `rest` and every one of its vertices
/// are `RUNNING`.
///
/// # Panics
/// When they are not within 90 s.
pub fn wait_running(rest: &str, jid: &str) {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let j = get_json(&format!("{rest}/jobs/{jid}"));
        let all = j["state"] == "RUNNING"
            && j["vertices"]
                .as_array()
                .is_some_and(|vs| vs.iter().all(|v| v["status"] == "RUNNING"));
        if all {
            return;
        }
        assert!(Instant::now() < deadline, "job {jid} not running: {j}");
        std::thread::sleep(Duration::from_millis(300));
    }
}
