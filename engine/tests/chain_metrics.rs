//! The metrics of a fast chain, whose batches are full (512 records): every record reaches
//! the sink's latency histogram and accounted counter, each member's busy + idle +
//! backpressured time covers the job's wall time, and busy time goes to the member that
//! spent it — also when a filter in the chain hands on fewer records than it received, so
//! that the next member runs on a part of a batch.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use streamscale_engine::metrics::EngineMetrics;
use streamscale_engine::runtime::{Job, RuntimeOptions};
use streamscale_engine::spec::JobSpec;

const RECORDS: u64 = 60_000;
/// CPU per record of the map: 512 records take 5 ms, within the batch's time budget
/// (an eighth of the flush interval), so the chain runs full batches.
const MAP_CPU_US: f64 = 10.0;

/// Runs source → filter (keeps half) → map → sink to the end; returns the metrics text, the
/// job's wall time and the records the sink accounted.
fn run() -> (String, f64, u64) {
    let yaml = format!(
        "name: fastchain\noperators:\n  - {{ name: source, kind: source, keys: 10, count: {RECORDS}, rate: {{ constant: 1.0e9 }} }}\n  - {{ name: half, kind: filter, keep: 0.5 }}\n  - {{ name: map, kind: map, cpu: {MAP_CPU_US} }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: source, to: half }}\n  - {{ from: half, to: map }}\n  - {{ from: map, to: sink }}\n"
    );
    let spec = JobSpec::from_yaml(&yaml).unwrap();
    spec.validate().unwrap();
    let metrics = EngineMetrics::new().unwrap();
    let options = RuntimeOptions {
        flush_interval: Duration::from_millis(100),
        ..RuntimeOptions::default()
    };
    let start = Instant::now();
    let job = Job::start(spec, None, metrics.clone(), options).unwrap();
    while !job.is_finished() {
        std::thread::sleep(Duration::from_millis(2));
    }
    let wall = start.elapsed().as_secs_f64();
    let done = job.join();
    assert!(done.errors.is_empty(), "{:?}", done.errors);
    let c = &done.savepoint.metadata.counters;
    assert_eq!(c["source"].records_out, RECORDS);
    assert_eq!(c["half"].records_in, RECORDS);
    assert_eq!(c["half"].records_out + c["half"].filtered, RECORDS);
    assert_eq!(c["map"].records_in, c["half"].records_out);
    assert_eq!(c["sink"].accounted, c["half"].records_out);
    (metrics.render(), wall, c["sink"].accounted)
}

/// The sample of `series` (`family{labels}`) in the metrics text.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

fn of(family: &str, op: &str) -> String {
    format!("streamscale_{family}{{operator=\"{op}\",subtask=\"0\"}}")
}

#[test]
fn a_fast_chain_keeps_every_metric() {
    let (text, wall, accounted) = run();
    assert!(
        accounted > RECORDS / 3,
        "the filter keeps about half: {accounted}"
    );
    let m = |family: &str, op: &str| sample(&text, &of(family, op));

    // Counts per member.
    assert_eq!(m("records_in_total", "half"), RECORDS as f64);
    assert_eq!(m("records_in_total", "map"), accounted as f64);
    assert_eq!(m("records_out_total", "map"), accounted as f64);
    assert_eq!(m("records_in_total", "sink"), accounted as f64);

    // Every accounted record is in the sink's counter and latency histogram, each with a
    // latency below the job's wall time.
    assert_eq!(m("sink_accounted_records_total", "sink"), accounted as f64);
    assert_eq!(m("sink_latency_seconds_count", "sink"), accounted as f64);
    let bucket = |le: &str| {
        sample(
            &text,
            &format!(
                "streamscale_sink_latency_seconds_bucket{{operator=\"sink\",subtask=\"0\",le=\"{le}\"}}"
            ),
        )
    };
    assert_eq!(bucket("+Inf"), accounted as f64);
    assert_eq!(bucket("50"), accounted as f64, "no latency near a minute");
    let sum = m("sink_latency_seconds_sum", "sink");
    assert!(
        sum > 0.0 && sum <= accounted as f64 * wall,
        "latency sum {sum} s for {accounted} records in {wall} s"
    );

    // Each member's time covers the job's wall time (all of it but the start-up before its
    // thread ran and the end after its last flush).
    for op in ["source", "half", "map", "sink"] {
        let time = m("busy_time_seconds_total", op)
            + m("idle_time_seconds_total", op)
            + m("backpressured_time_seconds_total", op);
        assert!(
            time <= wall + 0.01 && time >= 0.8 * wall - 0.05,
            "{op}: busy + idle + backpressured {time} s in a {wall} s job"
        );
    }

    // The map's CPU is its own busy time, and the source and the filter wait for it.
    let busy = |op| m("busy_time_seconds_total", op);
    let map_work = accounted as f64 * MAP_CPU_US / 1e6;
    assert!(
        busy("map") >= map_work,
        "map busy {} < {map_work}",
        busy("map")
    );
    for op in ["source", "half", "sink"] {
        assert!(
            busy(op) < busy("map"),
            "{op} busy {} vs map busy {}",
            busy(op),
            busy("map")
        );
    }
    let bp = |op| m("backpressured_time_seconds_total", op);
    assert!(
        bp("source") >= 0.9 * map_work && bp("half") >= 0.9 * map_work,
        "source backpressured {} s, filter {} s, map work {map_work} s",
        bp("source"),
        bp("half")
    );
}
