//! The at-least-once file sink fails its subtask when it cannot write its file (a full disk,
//! here `/dev/full`) instead of dropping the lines a later checkpoint would move the sources
//! past for good.
#![allow(missing_docs, clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use streamscale_engine::metrics::EngineMetrics;
use streamscale_engine::runtime::Job;
use streamscale_engine::spec::JobSpec;

#[test]
fn a_file_sink_that_cannot_write_fails_the_job() {
    if !Path::new("/dev/full").exists() {
        eprintln!("no /dev/full here: skipped");
        return;
    }
    let spec = JobSpec::from_yaml(
        r#"name: full
operators:
  - { name: src, kind: source, keys: 10, rate: { constant: 20000 } }
  - { name: sink, kind: sink, output: /dev/full, delivery: at-least-once }
edges:
  - { from: src, to: sink }
"#,
    )
    .unwrap();
    spec.validate().unwrap();
    let job = Job::start(
        spec,
        None,
        EngineMetrics::new().unwrap(),
        common::fast_flush_options(),
    )
    .unwrap();
    // The source never ends: only the sink's failure ends the job.
    let until = Instant::now() + Duration::from_secs(60);
    while !job.is_finished() {
        assert!(
            Instant::now() < until,
            "the job ran on while its sink could not write"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let done = job.join();
    assert!(
        done.errors
            .iter()
            .any(|e| e.contains("cannot write the sink's file")),
        "{:?}",
        done.errors
    );
}

/// A sink writing a file that cannot be synced and need not be (`/dev/null`) runs through its
/// checkpoints and finishes.
#[test]
fn a_file_sink_into_dev_null_goes_through_its_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let spec = JobSpec::from_yaml(&format!(
        r#"name: discard
operators:
  - {{ name: src, kind: source, keys: 10, count: 3000, rate: {{ constant: 3000 }} }}
  - {{ name: sink, kind: sink, output: /dev/null, delivery: at-least-once }}
edges:
  - {{ from: src, to: sink }}
checkpoint: {{ intervalSeconds: 0.2, dir: "{}" }}
"#,
        dir.path().display()
    ))
    .unwrap();
    spec.validate().unwrap();
    let storage = std::sync::Arc::new(
        streamscale_engine::checkpoint::storage::CheckpointStorage::new(dir.path(), 3),
    );
    let options = streamscale_engine::runtime::RuntimeOptions {
        checkpoint_storage: Some(storage.clone()),
        ..common::fast_flush_options()
    };
    let job = Job::start(spec, None, EngineMetrics::new().unwrap(), options).unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while !job.is_finished() {
        assert!(Instant::now() < until, "never finished");
        std::thread::sleep(Duration::from_millis(20));
    }
    let done = job.join();
    assert!(done.errors.is_empty(), "{:?}", done.errors);
    assert!(!storage.completed_ids().unwrap().is_empty());
}
