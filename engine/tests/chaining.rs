//! Operator chaining keeps per-operator metrics: counts per operator, and busy time
//! attributed to the member that spent it (see `streamscale_engine::chain`).
#![allow(clippy::unwrap_used)]

mod common;

const RECORDS: u64 = 5000;
const MAP_CPU_US: f64 = 200.0;

/// Runs source → map (200 µs of CPU a record) → sink to the end; returns the metrics text.
fn run(chaining: bool) -> String {
    let (done, text) =
        common::run_source_map_sink(RECORDS, &format!("cpu: {MAP_CPU_US}"), chaining);
    let c = &done.savepoint.metadata.counters;
    assert_eq!(c["source"].records_out, RECORDS);
    assert_eq!(c["map"].records_in, RECORDS);
    assert_eq!(c["map"].records_out, RECORDS);
    assert_eq!(c["sink"].records_in, RECORDS);
    assert_eq!(c["sink"].accounted, RECORDS);
    text
}

fn seconds(text: &str, family: &str, operator: &str) -> f64 {
    let prefix = format!("{family}{{operator=\"{operator}\",subtask=\"0\"}}");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
}

#[test]
fn chained_members_report_their_own_counts_and_busy_time() {
    for chaining in [true, false] {
        let text = run(chaining);
        let busy = |op| seconds(&text, "streamscale_busy_time_seconds_total", op);
        let bp = |op| seconds(&text, "streamscale_backpressured_time_seconds_total", op);
        let in_total = |op| seconds(&text, "streamscale_records_in_total", op);
        assert_eq!(in_total("map"), RECORDS as f64);
        assert_eq!(in_total("sink"), RECORDS as f64);
        // The map burns 200 µs a record, so its busy time is at least RECORDS · 200 µs;
        // within a chain that time must not be booked to the source or the sink.
        let map_work = RECORDS as f64 * MAP_CPU_US / 1e6;
        assert!(
            busy("map") >= map_work,
            "chaining {chaining}: map busy {} < {map_work}",
            busy("map")
        );
        assert!(
            busy("source") < busy("map") && busy("sink") < busy("map"),
            "chaining {chaining}: source busy {} / sink busy {} vs map busy {}",
            busy("source"),
            busy("sink"),
            busy("map")
        );
        // The source waits for the slower map: backpressured (full channel, or the chained
        // map still processing its batch) for most of the map's work.
        assert!(
            bp("source") >= 0.5 * map_work,
            "chaining {chaining}: source backpressured {} s",
            bp("source")
        );
    }
}
