//! Checkpoint overhead: records/s of a keyed job (source → map → window → sink, no
//! per-record cost, 100 000 keys) with aligned-barrier checkpoints every second written to a
//! local directory, against the same job without checkpoints, alternating in one run.
//!
//! `cargo bench -p streamscale-engine --bench checkpoint_overhead [-- RECORDS ROUNDS]`
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use streamscale_engine::checkpoint::storage::CheckpointStorage;
use streamscale_engine::metrics::EngineMetrics;
use streamscale_engine::runtime::{Job, RuntimeOptions};
use streamscale_engine::spec::JobSpec;

fn job(records: u64, checkpoint: bool) -> JobSpec {
    let chk = if checkpoint {
        "checkpoint: { intervalSeconds: 1, retain: 2 }\n"
    } else {
        ""
    };
    let yaml = format!(
        "name: keyed\noperators:\n  - {{ name: source, kind: source, keys: 100000, count: {records}, rate: {{ constant: 1.0e12 }} }}\n  - {{ name: map, kind: map }}\n  - {{ name: counts, kind: window, sizeMs: 1000 }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: source, to: map }}\n  - {{ from: map, to: counts }}\n  - {{ from: counts, to: sink }}\n{chk}"
    );
    let spec = JobSpec::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}"));
    spec.validate().unwrap_or_else(|e| panic!("{e}"));
    spec
}

/// Returns (records/s, checkpoints completed).
fn run(records: u64, checkpoint: bool) -> (f64, u64) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let metrics = EngineMetrics::new().unwrap_or_else(|e| panic!("{e}"));
    let options = RuntimeOptions {
        checkpoint_storage: checkpoint.then(|| Arc::new(CheckpointStorage::new(dir.path(), 2))),
        ..RuntimeOptions::default()
    };
    let start = Instant::now();
    let job = Job::start(job(records, checkpoint), None, metrics.clone(), options)
        .unwrap_or_else(|e| panic!("{e}"));
    while !job.is_finished() {
        std::thread::sleep(Duration::from_micros(200));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let done = job.join();
    assert!(done.errors.is_empty(), "{:?}", done.errors);
    (
        records as f64 / elapsed,
        metrics.checkpoints_completed.get(),
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let records = args.first().copied().unwrap_or(5_000_000);
    let rounds = args.get(1).copied().unwrap_or(5);
    run(records / 10, true); // warm-up
    let (mut on, mut off, mut taken) = (Vec::new(), Vec::new(), 0);
    for _ in 0..rounds {
        let (r, n) = run(records, true);
        on.push(r);
        taken += n;
        off.push(run(records, false).0);
    }
    let (on, off) = (median(on), median(off));
    println!("keyed job (100000 keys), {records} records, median of {rounds} alternating rounds");
    println!(
        "checkpoints every 1 s: {on:>12.0} records/s ({:.1} checkpoints per run)",
        taken as f64 / rounds as f64
    );
    println!("no checkpoints       : {off:>12.0} records/s");
    println!(
        "throughput loss      : {:>11.1} %",
        100.0 * (1.0 - on / off)
    );
}
