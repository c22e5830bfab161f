//! The disk state backend's working files (the `.redb` database and the `.seg` segment
//! directory of each keyed subtask) are gone once a stop-with-savepoint reads `completed`,
//! even when the engine exits at once afterwards: `streamscale run` closes the engine's stdin
//! right after the final savepoint, and the engine then exits with `process::exit`, which runs
//! no destructor. Before the fix the final snapshot (which holds the segment files) was
//! dropped only after the status was published, so an exit in between left
//! `disk-…-<pid>-0.seg/<key group>-<n>` (or the `.redb` file) behind. The job has 4096 key
//! groups, so that deleting the segment files takes long enough for that race to show (it
//! did in about one of three rounds before the fix).
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// State files and directories the disk backend left in `dir`.
fn leftovers(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".redb") || name.ends_with(".seg") {
            let inner: Vec<String> = std::fs::read_dir(e.path())
                .map(|d| {
                    d.filter_map(Result::ok)
                        .map(|f| f.file_name().to_string_lossy().into_owned())
                        .collect()
                })
                .unwrap_or_default();
            names.push(format!("{name} {inner:?}"));
        }
    }
    names
}

/// Runs a keyed window job with the disk backend, stops it with a savepoint and closes the
/// engine's stdin the moment the savepoint reads `completed`; returns what is left in the
/// state directory once the engine has exited.
fn stop_and_exit_at_once(dir: &Path) -> Vec<String> {
    let state_dir = dir.join("state-disk");
    let job = dir.join("job.yaml");
    std::fs::write(
        &job,
        format!(
            r#"name: diskwin
maxParallelism: 4096
operators:
  - {{ name: src, kind: source, keys: 40000, rate: {{ constant: 20000 }} }}
  - {{ name: win, kind: window, sizeMs: 60000 }}
  - {{ name: sink, kind: sink }}
edges:
  - {{ from: src, to: win }}
  - {{ from: win, to: sink }}
state: {{ backend: disk, dir: "{}" }}
"#,
            state_dir.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(common::engine_bin())
        .arg("--job")
        .arg(&job)
        .arg("--savepoint-dir")
        .arg(dir.join("savepoints"))
        .env("STREAMSCALE_ENGINE_EXIT_ON_STDIN_EOF", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let v: Value = serde_json::from_str(&line).unwrap();
    let base = format!("http://{}", v["address"].as_str().unwrap());
    let client = reqwest::blocking::Client::new();
    // Let every key group of the window hold state, on disk.
    std::thread::sleep(Duration::from_millis(1500));
    let resp: Value = client
        .post(format!("{base}/v1/savepoints"))
        .json(&serde_json::json!({"stop": true, "drain": false}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let id = resp["id"].as_str().unwrap().to_string();
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let st: Value = client
            .get(format!("{base}/v1/savepoints/{id}"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        match st["status"].as_str().unwrap() {
            "completed" => break,
            "failed" => panic!("savepoint failed: {st}"),
            _ => {}
        }
        assert!(Instant::now() < until, "savepoint never completed");
    }
    // As `streamscale run` does: done with this engine, close its stdin; it exits at once.
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    assert!(
        !status.success(),
        "the engine exits 1 on stdin EOF: {status}"
    );
    leftovers(&state_dir)
}

#[test]
fn disk_state_files_are_gone_when_the_final_savepoint_reads_completed() {
    for round in 0..4 {
        let dir = tempfile::tempdir().unwrap();
        let left = stop_and_exit_at_once(dir.path());
        assert!(
            left.is_empty(),
            "round {round}: the disk backend left {left:?} after a completed savepoint"
        );
    }
}
