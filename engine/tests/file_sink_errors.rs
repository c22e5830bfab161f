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
