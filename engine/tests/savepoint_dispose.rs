//! `DELETE /v1/savepoints/{id}` on a real engine process over HTTP: a completed savepoint is
//! removed (204) and forgotten; a missing one, a symlink, a file and a directory without
//! `_metadata.json` answer 404 and stay; a pending savepoint and the savepoint the engine was
//! restored from answer 409 and stay; an invalid id answers 400.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{EngineProcess, parse_metrics};
use reqwest::blocking::Client;
use serde_json::{Value, json};

/// An unbounded job whose map is slow (0.1 s of blocking wait per record, two subtasks, so not
/// chained to the source) behind channels of 8 records: a savepoint's barrier waits behind a
/// full channel for most of a second, so a savepoint stays pending long enough to be
/// asked about.
fn slow_job(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("slow.yaml");
    std::fs::write(
        &path,
        r#"name: slow
maxParallelism: 16
channelCapacity: 8
operators:
  - { name: source, kind: source, keys: 50, rate: { constant: 200 } }
  - { name: work, kind: map, io: 100000, parallelism: 2 }
  - { name: counts, kind: window, sizeMs: 200 }
  - { name: sink, kind: sink }
edges:
  - { from: source, to: work }
  - { from: work, to: counts }
  - { from: counts, to: sink }
"#,
    )
    .unwrap();
    path
}

/// Requests a savepoint under `id` (`stop` or not) and returns the HTTP status.
fn trigger(client: &Client, base: &str, id: &str, stop: bool) -> u16 {
    client
        .post(format!("{base}/v1/savepoints"))
        .json(&json!({"stop": stop, "id": id}))
        .send()
        .unwrap()
        .status()
        .as_u16()
}

fn status(client: &Client, base: &str, id: &str) -> (u16, Value) {
    let r = client
        .get(format!("{base}/v1/savepoints/{id}"))
        .send()
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().unwrap_or(Value::Null))
}

fn wait_completed(client: &Client, base: &str, id: &str) -> String {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, st) = status(client, base, id);
        assert_eq!(code, 200, "{st}");
        match st["status"].as_str().unwrap() {
            "completed" => return st["path"].as_str().unwrap().to_string(),
            "failed" => panic!("savepoint {id} failed: {st}"),
            _ => {}
        }
        assert!(Instant::now() < until, "savepoint {id} never completed");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `DELETE /v1/savepoints/{id}`: HTTP status and body text.
fn dispose(client: &Client, base: &str, id: &str) -> (u16, String) {
    let r = client
        .delete(format!("{base}/v1/savepoints/{id}"))
        .send()
        .unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

#[test]
fn completed_savepoints_are_disposed_and_nothing_else_is() {
    let dir = tempfile::tempdir().unwrap();
    let job = slow_job(dir.path());
    let sps = dir.path().join("savepoints");
    let mut engine = EngineProcess::start(&job, &sps, &[]);
    engine.wait_state("running", Duration::from_secs(30));
    let client = Client::new();
    let base = engine.base.clone();

    // Pending: asked at once after the request, while the barrier waits behind the slow map.
    // The channels fill within a tenth of a second; on a loaded machine wait until they hold a
    // few records (0.1 s each) so that the barrier is still queued when the question comes.
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let m = parse_metrics(&engine.metrics());
        let queued = |i: u32| {
            m.get(&format!(
                "streamscale_input_queue_length{{operator=\"work\",subtask=\"{i}\"}}"
            ))
            .copied()
            .unwrap_or(0.0)
        };
        if queued(0) >= 4.0 && queued(1) >= 4.0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "the slow map's input queues never filled in 60 s: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(trigger(&client, &base, "sp-a", false), 202);
    let (code, body) = dispose(&client, &base, "sp-a");
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("pending"), "{body}");
    let a = wait_completed(&client, &base, "sp-a");
    assert!(Path::new(&a).join("_metadata.json").is_file());
    assert_eq!(trigger(&client, &base, "sp-b", false), 202);
    let b = wait_completed(&client, &base, "sp-b");

    // Completed: removed, 204 with no body, and forgotten by GET.
    let (code, body) = dispose(&client, &base, "sp-a");
    assert_eq!((code, body.as_str()), (204, ""));
    assert!(!Path::new(&a).exists(), "{a} still there");
    assert_eq!(status(&client, &base, "sp-a").0, 404);
    // Again: nothing left to dispose of.
    let (code, body) = dispose(&client, &base, "sp-a");
    assert_eq!(code, 404, "{body}");
    assert!(body.contains("no savepoint `sp-a`"), "{body}");

    // Not completed savepoints: left in place with a 404 saying what they are.
    std::fs::create_dir(sps.join("partial")).unwrap();
    std::fs::write(sps.join("partial").join("state-work.bin"), b"x").unwrap();
    std::fs::write(sps.join("notes"), b"x").unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let precious = elsewhere.path().join("precious");
    std::fs::create_dir(&precious).unwrap();
    std::fs::write(precious.join("_metadata.json"), b"{}").unwrap();
    #[cfg(unix)]
    std::os::unix::fs::symlink(&precious, sps.join("link")).unwrap();
    for (id, what) in [
        ("partial", "no _metadata.json"),
        ("notes", "not a directory"),
        #[cfg(unix)]
        ("link", "symbolic link"),
    ] {
        let (code, body) = dispose(&client, &base, id);
        assert_eq!(code, 404, "{id}: {body}");
        assert!(body.contains(what), "{id}: {body}");
        assert!(
            std::fs::symlink_metadata(sps.join(id)).is_ok(),
            "{id} removed"
        );
    }
    assert!(precious.join("_metadata.json").is_file());

    // An invalid id never reaches the file system.
    let (code, body) = dispose(&client, &base, ".hidden");
    assert_eq!(code, 400, "{body}");

    // The savepoint the engine runs from stays (its path written differently than the
    // directory), the others go.
    assert_eq!(trigger(&client, &base, "base", true), 202);
    let base_path = wait_completed(&client, &base, "base");
    let _ = engine.child.wait();
    let restore = sps.join(".").join("base");
    let engine2 = EngineProcess::start(&job, &sps, &["--restore", restore.to_str().unwrap()]);
    engine2.wait_state("running", Duration::from_secs(30));
    let base2 = engine2.base.clone();
    let (code, body) = dispose(&client, &base2, "base");
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("restored from"), "{body}");
    assert!(Path::new(&base_path).join("_metadata.json").is_file());
    let (code, body) = dispose(&client, &base2, "sp-b");
    assert_eq!(code, 204, "{body}");
    assert!(!Path::new(&b).exists());
    let mut left: Vec<String> = std::fs::read_dir(&sps)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    let mut want = vec!["base", "notes", "partial"];
    if cfg!(unix) {
        want.insert(1, "link");
    }
    assert_eq!(left, want);
}
