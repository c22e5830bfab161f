//! `window` aggregates (`count`, `sum`, `min`, `max`) on the real engine binary, and the
//! restore of a savepoint written before panes carried min/max (format version 2, checked in
//! under `tests/data/window-v2-savepoint`, see its README).
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::EngineProcess;
use serde_json::Value;

const LEGACY: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/data/window-v2-savepoint/sp"
);

/// The job that wrote the legacy savepoint (same operator names and kinds, so the same
/// fingerprint), now with `aggregates` and a bounded count of `count` records in total.
fn job(dir: &Path, count: u64) -> PathBuf {
    let out = dir.join("out.jsonl");
    let yaml = format!(
        "name: legacy-window\nmaxParallelism: 16\noperators:\n  - {{ name: src, kind: source, rate: {{ constant: 4000 }}, keys: 20, count: {count} }}\n  - {{ name: win, kind: window, sizeMs: 3600000, parallelism: 3, aggregates: [count, sum, min, max] }}\n  - {{ name: out, kind: sink, delivery: at-least-once, output: \"{}\" }}\nedges:\n  - {{ from: src, to: win }}\n  - {{ from: win, to: out }}\n",
        out.display()
    );
    let path = dir.join("job.yaml");
    std::fs::write(&path, yaml).unwrap();
    path
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// Runs the job to its end (restored from `restore` if given); returns the result rows.
fn run(dir: &Path, count: u64, restore: Option<&Path>) -> Vec<Value> {
    let job = job(dir, count);
    let _ = std::fs::remove_file(dir.join("out.jsonl"));
    let restore_arg = restore.map(|p| p.display().to_string());
    let mut extra = vec![];
    if let Some(r) = &restore_arg {
        extra = vec!["--restore", r.as_str()];
    }
    let e = EngineProcess::start(&job, &dir.join("sps"), &extra);
    let view = e.wait_state("finished", Duration::from_secs(60));
    assert_eq!(view["recordsAccounted"], count, "{view}");
    common::read_sink_output(&dir.join("out.jsonl"))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|err| panic!("{err}: {l:?}")))
        .collect()
}

fn total(rows: &[Value], field: &str) -> i64 {
    rows.iter().map(|r| r[field].as_i64().unwrap()).sum()
}

#[test]
fn a_format_version_2_savepoint_restores_and_its_open_panes_give_no_made_up_min_max() {
    let dir = tempfile::tempdir().unwrap();
    let sp = dir.path().join("legacy");
    copy_dir(Path::new(LEGACY), &sp);
    // 484 records were in the savepoint's open panes; the source goes on to 1000.
    let rows = run(dir.path(), 1000, Some(&sp));
    // Values are seq % 100: the counts and sums continue across the migration.
    assert_eq!(total(&rows, "count"), 1000);
    assert_eq!(total(&rows, "sum"), 10 * 4950);
    assert_eq!(rows.len(), 20, "one result per key: {rows:?}");
    for r in &rows {
        assert_eq!(
            r.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["count", "key", "max", "min", "sum"]
        );
        // Every key had an open pane in the savepoint: its min and max are unknown.
        assert!(r["min"].is_null() && r["max"].is_null(), "{r}");
    }
    // The same job from scratch: min and max of every pane, over values 0..=99.
    let fresh = tempfile::tempdir().unwrap();
    let rows = run(fresh.path(), 1000, None);
    assert_eq!(total(&rows, "count"), 1000);
    assert_eq!(total(&rows, "sum"), 10 * 4950);
    let (mut lo, mut hi) = (i64::MAX, i64::MIN);
    for r in &rows {
        let (min, max, count) = (
            r["min"].as_i64().unwrap(),
            r["max"].as_i64().unwrap(),
            r["count"].as_i64().unwrap(),
        );
        assert!((0..=99).contains(&min) && min <= max && max <= 99, "{r}");
        let sum = r["sum"].as_i64().unwrap();
        assert!(min * count <= sum && sum <= max * count, "{r}");
        lo = lo.min(min);
        hi = hi.max(max);
    }
    assert_eq!((lo, hi), (0, 99));
}

/// Starts the engine restoring `sp` and expects it to refuse: non-zero exit, one error naming
/// `file`, no output written.
fn refused(dir: &Path, sp: &Path, file: &str, reason: &str) {
    let job = job(dir, 1000);
    let out = Command::new(common::engine_bin())
        .arg("--job")
        .arg(&job)
        .arg("--savepoint-dir")
        .arg(dir.join("sps"))
        .arg("--restore")
        .arg(sp)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&sp.join(file).display().to_string()) && stderr.contains(reason),
        "{stderr}"
    );
    assert!(
        !dir.join("out.jsonl").exists(),
        "nothing may run half-restored"
    );
}

#[test]
fn a_damaged_or_unknown_version_savepoint_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    // A flipped bit in the legacy state file.
    let sp = dir.path().join("flipped");
    copy_dir(Path::new(LEGACY), &sp);
    let state = sp.join("state-win.bin");
    let mut bytes = std::fs::read(&state).unwrap();
    bytes[200] ^= 0x08;
    std::fs::write(&state, bytes).unwrap();
    refused(dir.path(), &sp, "state-win.bin", "checksum mismatch");
    // A version this engine does not know.
    let sp = dir.path().join("future");
    copy_dir(Path::new(LEGACY), &sp);
    let meta = sp.join("_metadata.json");
    let text = std::fs::read_to_string(&meta).unwrap();
    std::fs::write(
        &meta,
        text.replace("\"format_version\": 2", "\"format_version\": 9"),
    )
    .unwrap();
    refused(
        dir.path(),
        &sp,
        "_metadata.json",
        "unknown savepoint format version 9",
    );
}
