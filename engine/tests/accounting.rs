//! The record balance of `GET /v1/job` on the real engine: once nothing is in flight,
//! `recordsEmitted = recordsAccounted + recordsFiltered` for every job shape — selects that
//! drop records, aggregations (windows, joins), fan-out to several sinks and from the source.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::EngineProcess;
use serde_json::Value;
use streamscale_engine::spec::{JobSpec, OperatorKind, RateSpec};

const COUNT: u64 = 6_000;

/// The example job `file` (under `examples/`) bounded to `count` source records (`None`:
/// unbounded), written into `dir`.
fn example(dir: &Path, file: &str, count: Option<u64>) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(file);
    let mut spec = JobSpec::from_file(&path).unwrap();
    for op in &mut spec.operators {
        if let OperatorKind::Source {
            count: c, rate: r, ..
        } = &mut op.kind
        {
            *c = count;
            *r = RateSpec::Constant(5_000.0);
        }
    }
    let out = dir.join(format!("{}.yaml", spec.name));
    std::fs::write(&out, spec.to_yaml()).unwrap();
    out
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn assert_balanced(view: &Value) {
    let n = |f: &str| {
        view[f]
            .as_u64()
            .unwrap_or_else(|| panic!("{f} missing: {view}"))
    };
    assert!(n("recordsEmitted") > 0, "{view}");
    assert_eq!(
        n("recordsEmitted"),
        n("recordsAccounted") + n("recordsFiltered"),
        "records lost or counted twice: {view}"
    );
}

fn finished(job: &Path, extra: &[&str]) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let engine = EngineProcess::start(job, &dir.path().join("sp"), extra);
    engine.wait_state("finished", Duration::from_secs(120))
}

#[test]
fn nexmark_queries_balance_when_finished() {
    let dir = tempfile::tempdir().unwrap();
    for (file, par) in [
        ("nexmark/q1.yaml", "q1=2"),
        ("nexmark/q3.yaml", "join=2"),
        ("nexmark/q5.yaml", "counts=2,hot=2"),
    ] {
        let job = example(dir.path(), file, Some(COUNT));
        let view = finished(&job, &["--parallelism", par]);
        assert_eq!(view["sourceRecords"], COUNT, "{file}: {view}");
        assert!(
            view["recordsFiltered"].as_u64().unwrap() > 0,
            "{file}: {view}"
        );
        assert_balanced(&view);
    }
}

#[test]
fn nexmark_q5_balances_after_a_draining_stop_mid_stream() {
    let dir = tempfile::tempdir().unwrap();
    let job = example(dir.path(), "nexmark/q5.yaml", None);
    let mut engine = EngineProcess::start(&job, &dir.path().join("sp"), &[]);
    std::thread::sleep(Duration::from_millis(1500));
    // Mid-stream means after some records (a loaded machine can delay them past the pause).
    engine.wait_source_records_above(0);
    let (_, view) = engine.stop_with_savepoint(true);
    assert_balanced(&view);
}

#[test]
fn fan_out_to_two_sinks_counts_each_path() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(
        dir.path(),
        "fan2.yaml",
        "name: fan2\noperators:\n  - { name: source, kind: source, rate: { constant: 5000 }, count: 601 }\n  - { name: a, kind: map }\n  - { name: s1, kind: sink }\n  - { name: s2, kind: sink }\nedges:\n  - { from: source, to: a }\n  - { from: a, to: s1 }\n  - { from: a, to: s2 }\n",
    );
    let view = finished(&job, &[]);
    assert_eq!(view["sourceRecords"], 601, "{view}");
    assert_eq!(view["recordsEmitted"], 1202, "{view}");
    assert_eq!(view["recordsAccounted"], 1202, "{view}");
    assert_balanced(&view);
    // `a` sends each record to both sinks but emitted it once (Flink's numRecordsOut): the
    // planner's traffic equations send `a`'s output along each edge.
    let a = view["operators"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["name"] == "a")
        .unwrap();
    assert_eq!(
        (&a["recordsIn"], &a["recordsOut"]),
        (&601.into(), &601.into()),
        "{a}"
    );
}

#[test]
fn fan_out_from_the_source_through_a_filter_balances() {
    let dir = tempfile::tempdir().unwrap();
    let job = write(
        dir.path(),
        "fan.yaml",
        "name: fan\noperators:\n  - { name: source, kind: source, rate: { constant: 5000 }, count: 1000 }\n  - { name: a, kind: map }\n  - { name: b, kind: filter, keep: 0.5 }\n  - { name: w, kind: window, sizeMs: 50 }\n  - { name: sink, kind: sink }\nedges:\n  - { from: source, to: a }\n  - { from: source, to: b }\n  - { from: a, to: w }\n  - { from: b, to: sink }\n  - { from: w, to: sink }\n",
    );
    let dir2 = tempfile::tempdir().unwrap();
    let mut engine = EngineProcess::start(&job, &dir2.path().join("sp"), &[]);
    engine.wait_state("finished", Duration::from_secs(60));
    // The window's last pane fires on the draining stop.
    let (_, view) = engine.stop_with_savepoint(true);
    assert_eq!(view["sourceRecords"], 1000, "{view}");
    assert_eq!(view["recordsEmitted"], 2000, "{view}");
    assert!(view["recordsFiltered"].as_u64().unwrap() > 0, "{view}");
    assert_balanced(&view);
}
