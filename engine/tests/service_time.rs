//! The service-time sums (`streamscale_engine::service_time`) of an operator with a constant
//! per-record cost (a 10 ms sleep) give a squared coefficient of variation far below an exponential's 1, in
//! its own thread and chained to its source.
#![allow(clippy::unwrap_used)]

mod common;

const RECORDS: u64 = 300;
/// The map's cost per record: a sleep (`io`), which a busy machine stretches by its wake-up
/// latency only (CPU spinning is stretched by every preemption), long enough that a wake-up
/// late by a few ms on a loaded machine is a small part of it.
const MAP_IO_US: f64 = 10_000.0;

/// Runs source → map (10 ms a record) → sink to the end; returns the metrics text.
fn run(chaining: bool) -> String {
    let (_, text) = common::run_source_map_sink(RECORDS, &format!("io: {MAP_IO_US}"), chaining);
    text
}

fn value(text: &str, family: &str, operator: &str) -> Option<f64> {
    let prefix = format!("{family}{{operator=\"{operator}\",subtask=\"0\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

/// (Σn, cs², effective batches (Σn)²/Σn²) of `operator`'s sums, by the estimator of the
/// module documentation.
fn estimate(text: &str, operator: &str) -> (f64, f64, f64) {
    let v = |f: &str| {
        value(text, &format!("streamscale_service_{f}"), operator)
            .unwrap_or_else(|| panic!("no streamscale_service_{f} for {operator} in\n{text}"))
    };
    let (n, t, t2, nt, n2) = (
        v("records_total"),
        v("time_seconds_total"),
        v("time_sq_seconds_total"),
        v("time_records_seconds_total"),
        v("records_sq_total"),
    );
    let m = t / n;
    let var = (t2 - 2.0 * m * nt + m * m * n2) / (n - n2 / n);
    (n, var / (m * m), n * n / n2)
}

#[test]
fn a_constant_record_cost_reads_as_low_variability() {
    for chaining in [false, true] {
        let text = run(chaining);
        let (n, scv, batches) = estimate(&text, "map");
        // Every record but those of the last, unclosed batch is in a timed batch.
        assert!(
            n >= 0.9 * RECORDS as f64 && n <= RECORDS as f64,
            "chaining {chaining}: {n} records timed of {RECORDS}"
        );
        assert!(batches >= 30.0, "chaining {chaining}: {batches} batches");
        // Exponential service would read about 1; a 10 ms sleep reads near 0 (the machine's
        // jitter: timer slack, wake-up latency; 0.01-0.05 on a machine at load 8 on 2 cores).
        assert!(
            scv < 0.5,
            "chaining {chaining}: cs² {scv} from {batches:.0} batches"
        );
        let mean = value(&text, "streamscale_service_time_seconds_total", "map").unwrap() / n;
        assert!(
            mean >= MAP_IO_US * 1e-6,
            "chaining {chaining}: mean {mean} s under the record's cost"
        );
        // Sources receive no records: no service sums.
        assert_eq!(
            value(&text, "streamscale_service_records_total", "source"),
            None
        );
    }
}
