//! Stop-with-savepoint at parallelism 2, restore at 5 and at 1: the final keyed state equals
//! that of an uninterrupted run, and every emitted record is accounted at the sink.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{EngineProcess, bounded_job};
use streamscale_engine::savepoint::Savepoint;
use streamscale_engine::spec::JobSpec;

const COUNT: u64 = 12_000;

#[test]
fn rescaled_run_matches_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let job = bounded_job(dir.path(), COUNT, 2000.0);
    let spec = JobSpec::from_file(&job).unwrap();
    let sps = dir.path().join("savepoints");

    // Uninterrupted, at parallelism 2.
    let mut plain = EngineProcess::start(&job, &sps, &["--parallelism", "work=2,counts=2"]);
    plain.wait_state("finished", Duration::from_secs(60));
    let (plain_sp, plain_job) = plain.stop_with_savepoint(false);
    assert_eq!(plain_job["recordsEmitted"], COUNT);
    assert_eq!(plain_job["recordsAccounted"], COUNT);
    let expected = Savepoint::read(&plain_sp, &spec).unwrap().state["counts"].totals();
    assert_eq!(expected.values().map(|(c, _)| c).sum::<u64>(), COUNT);

    // Rescaled: 2 -> 5 -> 1, with stop-with-savepoint in the middle of the stream.
    let mut first = EngineProcess::start(&job, &sps, &["--parallelism", "work=2,counts=2"]);
    std::thread::sleep(Duration::from_millis(700));
    // The stop must land after some progress (a loaded machine can delay it past the pause).
    first.wait_source_records_above(0);
    let (sp1, job1) = first.stop_with_savepoint(false);
    let emitted1 = job1["recordsEmitted"].as_u64().unwrap();
    assert!(
        emitted1 > 0 && emitted1 < COUNT,
        "stop must land mid-stream: {job1}"
    );
    let restored = Savepoint::read(&sp1, &spec).unwrap();
    assert_eq!(restored.metadata.parallelism["counts"], 2);

    let sp1_arg = sp1.display().to_string();
    let mut second = EngineProcess::start(
        &job,
        &sps,
        &["--parallelism", "work=3,counts=5", "--restore", &sp1_arg],
    );
    assert_eq!(second.job()["restoredFrom"], sp1_arg.as_str());
    std::thread::sleep(Duration::from_millis(700));
    second.wait_source_records_above(emitted1);
    let (sp2, job2) = second.stop_with_savepoint(false);
    let emitted2 = job2["recordsEmitted"].as_u64().unwrap();
    assert!(emitted2 > emitted1 && emitted2 < COUNT, "{job2}");
    assert_eq!(
        Savepoint::read(&sp2, &spec).unwrap().metadata.parallelism["counts"],
        5
    );

    let sp2_arg = sp2.display().to_string();
    let mut third = EngineProcess::start(
        &job,
        &sps,
        &["--parallelism", "work=1,counts=1", "--restore", &sp2_arg],
    );
    third.wait_state("finished", Duration::from_secs(60));
    let (sp3, job3) = third.stop_with_savepoint(false);
    assert_eq!(job3["recordsEmitted"], COUNT);
    assert_eq!(job3["recordsAccounted"], COUNT, "{job3}");
    let actual = Savepoint::read(&sp3, &spec).unwrap().state["counts"].totals();
    assert_eq!(actual, expected);
    // Every savepoint is still there and intact: none was overwritten.
    for sp in [&sp1, &sp2, &sp3, &plain_sp] {
        Savepoint::read(sp, &spec).unwrap();
    }
}

#[test]
fn metrics_have_flink_meaning_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let job = bounded_job(dir.path(), 1_000_000, 1500.0);
    let sps = dir.path().join("savepoints");
    let started = Instant::now();
    let engine = EngineProcess::start(&job, &sps, &["--parallelism", "work=2"]);
    std::thread::sleep(Duration::from_millis(1500));
    let names = [
        "streamscale_records_in_total{operator=\"work\",subtask=\"1\"}",
        "streamscale_busy_time_seconds_total{operator=\"work\",subtask=\"0\"}",
        "streamscale_idle_time_seconds_total{operator=\"counts\",subtask=\"0\"}",
        "streamscale_backpressured_time_seconds_total{operator=\"source\",subtask=\"0\"}",
        "streamscale_input_queue_length{operator=\"work\",subtask=\"0\"}",
        "streamscale_source_backlog_records{operator=\"source\",subtask=\"0\"}",
        "streamscale_source_arrivals_total{operator=\"source\",subtask=\"0\"}",
        "streamscale_sink_latency_seconds_bucket{operator=\"sink\",subtask=\"0\",le=\"0.1\"}",
        "streamscale_sink_accounted_records_total{operator=\"sink\",subtask=\"0\"}",
    ];
    let value = |text: &str, name: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with(name))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    };
    // A loaded machine can delay the first records and flushes past the pause: read until
    // every series is there and the map has taken 500 records (then `wall` bounds the time
    // the subtasks can have accounted).
    let until = Instant::now() + Duration::from_secs(60);
    let (text, wall) = loop {
        let text = engine.metrics();
        let wall = started.elapsed().as_secs_f64();
        let missing: Vec<_> = names.iter().filter(|n| !text.contains(*n)).collect();
        let records = value(&text, "streamscale_records_in_total{operator=\"work\"");
        if missing.is_empty() && records > 500.0 {
            break (text, wall);
        }
        assert!(
            Instant::now() < until,
            "in 60 s: missing {missing:?}, {records} records into work, in\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let value = |name: &str| value(&text, name);
    // The map costs at least 120 µs a record, so busy time covers at least that per record.
    let busy = value("streamscale_busy_time_seconds_total{operator=\"work\"");
    let records = value("streamscale_records_in_total{operator=\"work\"");
    assert!(
        busy >= records * 110e-6,
        "busy {busy} s for {records} records"
    );
    // Busy + idle + backpressured is about wall time per subtask (at least 1.5 s, 2 subtasks):
    // more than 1 s each, and no more than each subtask's life (under `wall`, the time from
    // before the engine's start to the answer) plus the 0.2 s this bound always allowed.
    let idle = value("streamscale_idle_time_seconds_total{operator=\"work\"");
    let bp = value("streamscale_backpressured_time_seconds_total{operator=\"work\"");
    let total = busy + idle + bp;
    assert!(
        (2.0..2.0 * (wall + 0.2)).contains(&total),
        "busy+idle+bp = {total} for 2 subtasks over {wall:.2} s"
    );
}

#[test]
fn caller_chosen_savepoint_id() {
    let dir = tempfile::tempdir().unwrap();
    let job = bounded_job(dir.path(), 1_000_000, 500.0);
    let sps = dir.path().join("savepoints");
    std::fs::create_dir_all(sps.join("taken")).unwrap();
    let engine = EngineProcess::start(&job, &sps, &[]);
    let client = reqwest::blocking::Client::new();
    let post = |body: serde_json::Value| {
        client
            .post(format!("{}/v1/savepoints", engine.base))
            .json(&body)
            .send()
            .unwrap()
    };
    let bad = post(serde_json::json!({"stop": true, "id": "../escape"}));
    assert_eq!(bad.status().as_u16(), 400);
    assert!(bad.text().unwrap().contains("not a valid savepoint id"));
    let taken = post(serde_json::json!({"stop": true, "id": "taken"}));
    assert_eq!(taken.status().as_u16(), 409);
    assert!(taken.text().unwrap().contains("already exists"));
    assert_eq!(
        engine.job()["state"],
        "running",
        "refusals leave the job running"
    );
    let ok = post(serde_json::json!({"stop": true, "id": "sp-chosen.1"}));
    assert_eq!(ok.status().as_u16(), 202);
    assert_eq!(ok.json::<serde_json::Value>().unwrap()["id"], "sp-chosen.1");
    // A deadline for a stuck stop only.
    let until = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let st: serde_json::Value = client
            .get(format!("{}/v1/savepoints/sp-chosen.1", engine.base))
            .send()
            .unwrap()
            .json()
            .unwrap();
        if st["status"] == "completed" {
            assert!(st["path"].as_str().unwrap().ends_with("sp-chosen.1"));
            break;
        }
        assert_ne!(st["status"], "failed", "{st}");
        assert!(
            std::time::Instant::now() < until,
            "savepoint sp-chosen.1 not completed in 120 s: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(sps.join("sp-chosen.1").join("_metadata.json").is_file());
}

#[test]
fn stopped_engine_exits_even_if_nobody_reads_the_savepoint_status() {
    let dir = tempfile::tempdir().unwrap();
    let job = bounded_job(dir.path(), 1_000_000, 500.0);
    let sps = dir.path().join("savepoints");
    let mut engine = EngineProcess::start(&job, &sps, &[]);
    let resp = reqwest::blocking::Client::new()
        .post(format!("{}/v1/savepoints", engine.base))
        .json(&serde_json::json!({"stop": true, "id": "unread"}))
        .send()
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    // The engine exits 5 s after an unread terminal status; the rest is for a slow stop on a
    // loaded machine.
    let until = std::time::Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = engine.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            std::time::Instant::now() < until,
            "engine still running 120 s after the stop request"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status}");
    assert!(sps.join("unread").join("_metadata.json").is_file());
}

/// The engine logs to stderr; a reader that went away (`streamscale-engine 2>&1 | head -1`)
/// must cost log lines only: a stop-with-savepoint still completes and the engine exits.
#[test]
fn stop_with_savepoint_completes_after_the_stderr_reader_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let job = bounded_job(dir.path(), 1_000_000, 500.0);
    let sps = dir.path().join("savepoints");
    let mut engine =
        EngineProcess::start_with_stderr(&job, &sps, &[], std::process::Stdio::piped());
    engine.wait_state("running", Duration::from_secs(30));
    let (path, _) = engine.stop_with_savepoint(false);
    assert!(path.join("_metadata.json").is_file(), "{}", path.display());
}
