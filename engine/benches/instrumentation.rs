//! Instrumentation overhead: records/s of a map-only job (source → map → sink, no per-record
//! cost) with metrics on and off, alternating in one run.
//!
//! `cargo bench -p streamscale-engine --bench instrumentation [-- RECORDS ROUNDS [on|off]]`
//!
//! `overhead` compares the medians of each mode; `paired` is the median of each round's own
//! overhead (its two runs back to back), less sensitive to the shared machine's slow stretches.
//!
//! With `on` or `off` only that mode runs (for a profiler such as
//! `valgrind --tool=callgrind`, which needs one mode per process to tell them apart).
#![allow(missing_docs)]

use std::time::{Duration, Instant};

use streamscale_engine::metrics::EngineMetrics;
use streamscale_engine::runtime::{Job, RuntimeOptions};
use streamscale_engine::spec::JobSpec;

fn job(records: u64) -> JobSpec {
    let yaml = format!(
        "name: maponly\noperators:\n  - {{ name: source, kind: source, count: {records}, rate: {{ constant: 1.0e12 }} }}\n  - {{ name: map, kind: map }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: source, to: map }}\n  - {{ from: map, to: sink }}\n"
    );
    let spec = JobSpec::from_yaml(&yaml).unwrap_or_else(|e| panic!("{e}"));
    spec.validate().unwrap_or_else(|e| panic!("{e}"));
    spec
}

fn run(records: u64, metrics_enabled: bool) -> f64 {
    let metrics = EngineMetrics::new().unwrap_or_else(|e| panic!("{e}"));
    let options = RuntimeOptions {
        metrics_enabled,
        ..RuntimeOptions::default()
    };
    let start = Instant::now();
    let job = Job::start(job(records), None, metrics, options).unwrap_or_else(|e| panic!("{e}"));
    while !job.is_finished() {
        std::thread::sleep(Duration::from_micros(200));
    }
    let elapsed = start.elapsed().as_secs_f64();
    let done = job.join();
    assert!(done.errors.is_empty(), "{:?}", done.errors);
    records as f64 / elapsed
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let numbers: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let only = args.iter().find_map(|a| match a.as_str() {
        "on" => Some(true),
        "off" => Some(false),
        _ => None,
    });
    let records = numbers.first().copied().unwrap_or(2_000_000);
    let rounds = numbers.get(1).copied().unwrap_or(7);
    if let Some(enabled) = only {
        run(records / 10, enabled); // warm-up
        let rates: Vec<f64> = (0..rounds).map(|_| run(records, enabled)).collect();
        let mode = if enabled { "on " } else { "off" };
        println!("map-only job, {records} records, median of {rounds} rounds");
        println!("metrics {mode}: {:>12.0} records/s", median(rates));
        return;
    }
    run(records / 10, true); // warm-up
    let (mut on, mut off, mut paired) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        // Each round runs both modes back to back, in turn on first and off first, so that a
        // slow stretch of the shared machine falls on both alike.
        let (a, b) = if round % 2 == 0 {
            let a = run(records, true);
            (a, run(records, false))
        } else {
            let b = run(records, false);
            (run(records, true), b)
        };
        on.push(a);
        off.push(b);
        paired.push((b - a) / b * 100.0);
    }
    let (on, off, paired) = (median(on), median(off), median(paired));
    println!("map-only job, {records} records, median of {rounds} alternating rounds");
    println!("metrics on : {on:>12.0} records/s");
    println!("metrics off: {off:>12.0} records/s");
    println!("overhead   : {:>11.2} %", (off - on) / off * 100.0);
    println!("paired     : {paired:>11.2} % (median of the rounds' own overheads)");
}
