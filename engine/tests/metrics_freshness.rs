//! Every subtask publishes its counters at the flush interval (100 ms by default) however few
//! records pass through it: a source chained to a slow map, a chain of slow members, and a slow
//! map in its own thread. The controller reads rates from these counters; a subtask that
//! publishes once per 8192 records (a minute for a map taking 5 ms a record) looks stalled.
//!
//! Each test reads the real engine's `/metrics` twice, [`WINDOW`] apart, and requires every
//! subtask's time counters (busy + idle + backpressured, which together cover its wall time) to
//! have grown by at least a quarter of the window, and its record counters to have grown where
//! records flow. The bound is generous (the flush lag is about 100 ms); what it rules out is a
//! subtask publishing once per several seconds.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{EngineProcess, metric_sample, parse_metrics};

/// Time between the two reads of `/metrics`.
const WINDOW: Duration = Duration::from_secs(2);
/// Time from the engine's start to the first read.
const WARM_UP: Duration = Duration::from_secs(1);

/// Busy + idle + backpressured seconds of one subtask: the wall time up to its last flush.
fn accounted_time(m: &BTreeMap<String, f64>, operator: &str, subtask: u32) -> f64 {
    [
        "busy_time_seconds_total",
        "idle_time_seconds_total",
        "backpressured_time_seconds_total",
    ]
    .iter()
    .map(|f| metric_sample(m, f, operator, subtask))
    .sum()
}

/// Starts `yaml`, reads `/metrics` after [`WARM_UP`] and again [`WINDOW`] later, and checks
/// that every listed subtask `(operator, subtask, records flow)` published its time (and, when
/// records flow through it, its records in and out) during the window. Returns both reads.
fn check_fresh(
    yaml: &str,
    subtasks: &[(&str, u32, bool)],
) -> (BTreeMap<String, f64>, BTreeMap<String, f64>) {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.yaml");
    std::fs::write(&job, yaml).unwrap();
    let engine = EngineProcess::start(&job, &dir.path().join("savepoints"), &[]);
    std::thread::sleep(WARM_UP);
    // A loaded machine can delay a subtask's first flush past the warm-up: the window starts
    // once every listed subtask has published its series at least once.
    let until = Instant::now() + Duration::from_secs(60);
    let a = loop {
        let a = parse_metrics(&engine.metrics());
        let missing: Vec<String> = subtasks
            .iter()
            .flat_map(|&(op, i, _)| {
                [
                    "busy_time_seconds_total",
                    "idle_time_seconds_total",
                    "backpressured_time_seconds_total",
                    "records_in_total",
                    "records_out_total",
                ]
                .map(|f| format!("streamscale_{f}{{operator=\"{op}\",subtask=\"{i}\"}}"))
            })
            .filter(|series| !a.contains_key(series))
            .collect();
        if missing.is_empty() {
            break a;
        }
        assert!(
            Instant::now() < until,
            "no first flush in 60 s: {missing:?} absent from /metrics: {a:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(WINDOW);
    let b = parse_metrics(&engine.metrics());
    let min_growth = WINDOW.as_secs_f64() / 4.0;
    for &(op, i, flows) in subtasks {
        let grown = accounted_time(&b, op, i) - accounted_time(&a, op, i);
        assert!(
            grown >= min_growth,
            "{op}-{i}: busy+idle+backpressured time grew by {grown:.3} s in a {:.0} s window \
             (at least {min_growth} s expected): its counters were not flushed\nfirst read: {a:?}\n\
             second read: {b:?}",
            WINDOW.as_secs_f64()
        );
        if flows {
            for family in ["records_in_total", "records_out_total"] {
                // A source takes no records in, a sink sends none on.
                let skip = match family {
                    "records_in_total" => op == "src",
                    _ => op == "sink",
                };
                if skip {
                    continue;
                }
                let before = metric_sample(&a, family, op, i);
                let after = metric_sample(&b, family, op, i);
                assert!(
                    after > before,
                    "{op}-{i}: {family} stayed at {before} over a {:.0} s window while records \
                     flowed\nsecond read: {b:?}",
                    WINDOW.as_secs_f64()
                );
            }
        }
    }
    (a, b)
}

/// The tester's job: a 400 records/s source chained (same thread) to a map taking 5 ms a
/// record (about 195 records/s), so the source's backlog grows and its thread spends nearly
/// all its time in the map. Before the fix the source published once per 128 batches of 64
/// records, about every 40 s here.
#[test]
fn a_source_chained_to_a_slow_map_publishes_its_counters_at_the_flush_interval() {
    let yaml = r#"name: drain
operators:
  - { name: src, kind: source, keys: 10, rate: { constant: 400 } }
  - { name: lookup, kind: map, io: 5000 }
  - { name: sink, kind: sink }
edges:
  - { from: src, to: lookup }
  - { from: lookup, to: sink }
"#;
    let (_, b) = check_fresh(
        yaml,
        &[("src", 0, true), ("lookup", 0, true), ("sink", 0, true)],
    );
    // Attribution stays per member: the map spends the time, the source waits for it.
    let busy = |op| metric_sample(&b, "busy_time_seconds_total", op, 0);
    let bp = |op| metric_sample(&b, "backpressured_time_seconds_total", op, 0);
    assert!(
        busy("lookup") > busy("src") && bp("src") > busy("src"),
        "source busy {} / backpressured {}, lookup busy {}",
        busy("src"),
        bp("src"),
        busy("lookup")
    );
}

/// A chain member taking 100 ms a record: a full chain batch (64 records) takes 6.4 s, so
/// the members (and the source waiting for them) must publish within a batch, and the sink
/// after the slow map must receive records within the window rather than once per batch.
#[test]
fn a_very_slow_chain_member_publishes_within_its_batch() {
    let yaml = r#"name: slowchain
operators:
  - { name: src, kind: source, keys: 10, rate: { constant: 100 } }
  - { name: lookup, kind: map, io: 100000 }
  - { name: sink, kind: sink }
edges:
  - { from: src, to: lookup }
  - { from: lookup, to: sink }
"#;
    check_fresh(
        yaml,
        &[("src", 0, true), ("lookup", 0, true), ("sink", 0, true)],
    );
}

/// A map in its own threads (parallelism 2 after a source of parallelism 1: not chained)
/// taking 200 ms a record behind a full input queue: before the fix it published once per 128
/// records (25.6 s); its input queue length is published with its other counters.
#[test]
fn a_slow_unchained_map_publishes_its_counters_and_queue_length() {
    let yaml = r#"name: slowmap
operators:
  - { name: src, kind: source, keys: 10, rate: { constant: 400 } }
  - { name: lookup, kind: map, io: 200000, parallelism: 2 }
  - { name: sink, kind: sink }
edges:
  - { from: src, to: lookup }
  - { from: lookup, to: sink }
"#;
    let (_, b) = check_fresh(
        yaml,
        &[
            ("src", 0, true),
            ("lookup", 0, true),
            ("lookup", 1, true),
            ("sink", 0, true),
        ],
    );
    for i in 0..2 {
        let queue = metric_sample(&b, "input_queue_length", "lookup", i);
        assert!(
            queue > 0.0,
            "lookup-{i}: input queue length {queue} although the source is 380 records/s ahead"
        );
    }
}
