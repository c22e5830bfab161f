//! Tests of the engine's metric families.

use std::sync::{Arc, Mutex};

use super::*;

/// The histogram a Prometheus `Histogram` with the same buckets builds from the same
/// latencies (in seconds, µs / 10⁶).
fn reference(latencies_us: &[u64]) -> (Vec<u64>, u64, f64) {
    let h = prometheus::Histogram::with_opts(
        prometheus::HistogramOpts::new("ref", "reference").buckets(SINK_LATENCY_BUCKETS.to_vec()),
    )
    .expect("valid histogram");
    for &l in latencies_us {
        h.observe(l as f64 / 1e6);
    }
    let m = prometheus::core::Metric::metric(&h);
    let buckets = m
        .get_histogram()
        .get_bucket()
        .iter()
        .map(|b| b.cumulative_count())
        .collect();
    (buckets, h.get_sample_count(), h.get_sample_sum())
}

#[test]
fn bucket_bounds_are_whole_microseconds() {
    for (i, b) in SINK_LATENCY_BUCKETS.iter().enumerate() {
        let us = bucket_bound_us(i);
        assert!(us as f64 / 1e6 <= *b, "{us} µs must fall into le={b}");
        assert!(
            (us + 1) as f64 / 1e6 > *b,
            "{} µs must not fall into le={b}",
            us + 1
        );
    }
}

/// The documented series: increasing, from 1 ms to 120 s, every bucket at most 5/3 of the
/// one before (the width that bounds the controller's interpolated p99), and the usual
/// SLOs among the bounds.
#[test]
fn latency_buckets_are_a_fine_series_with_the_usual_slos_as_bounds() {
    let b = SINK_LATENCY_BUCKETS;
    assert_eq!((b[0], b[b.len() - 1]), (0.001, 120.0));
    for w in b.windows(2) {
        assert!(w[0] < w[1], "{w:?}");
        assert!(w[1] / w[0] <= 5.0 / 3.0 + 1e-12, "{w:?} is too wide");
    }
    for slo in [0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0] {
        assert!(b.contains(&slo), "{slo} s is no bound");
    }
}

/// A clock far from 0, so that `CLOCK - latency` is a valid timestamp for every latency
/// of the tests.
const CLOCK: u64 = u64::MAX / 2;

#[test]
fn local_histogram_counts_as_a_prometheus_histogram() {
    // Every bound, its neighbours, zero, huge values, and runs in and out of a bucket.
    let mut latencies = vec![0, 1, 999, 1000, 1001, 7, 7, 7, 1500, 1501, 120_000_000];
    latencies.extend([120_000_001, u64::MAX / 4, 3, 70_000_000, 70_000_001, 1000]);
    for i in 0..SINK_LATENCY_BUCKETS.len() {
        let b = bucket_bound_us(i);
        latencies.extend([b - 1, b, b + 1, b, b - 1]);
    }
    let family = LatencyHistogramVec::new("t_latency_seconds", "test").expect("family");
    let mut local = family.local(["sink", "0"]);
    local.set_clock(CLOCK);
    let (half, rest) = latencies.split_at(latencies.len() / 2);
    for &l in half {
        local.observe(CLOCK - l);
    }
    local.flush();
    for &l in rest {
        local.observe(CLOCK - l);
    }
    local.flush();
    let got = family.get(["sink", "0"]).expect("series");
    let (cumulative, count, sum) = reference(&latencies);
    let mut running = 0;
    let got_cumulative: Vec<u64> = got.buckets[..SINK_LATENCY_BUCKETS.len()]
        .iter()
        .map(|n| {
            running += n;
            running
        })
        .collect();
    assert_eq!(got_cumulative, cumulative);
    assert_eq!(got.count(), count);
    assert!(
        (got.sum_seconds - sum).abs() <= 1e-9 * sum.abs(),
        "{} vs {sum}",
        got.sum_seconds
    );
}

#[test]
fn latency_is_measured_against_the_clock_set_before_the_record() {
    let family = LatencyHistogramVec::new("t_latency_seconds", "test").expect("family");
    let mut local = family.local(["sink", "0"]);
    // A run of three records created at 1 s, measured at 1.0005 s, then at 1.2 s; a record
    // stamped after the clock counts as 0.
    local.set_clock(1_000_500);
    for _ in 0..3 {
        local.observe(1_000_000);
    }
    local.set_clock(1_200_000);
    local.observe(1_000_000);
    local.observe(1_300_000);
    local.flush();
    let got = family.get(["sink", "0"]).expect("series");
    let mut want = [0; LATENCY_BUCKETS];
    want[0] = 4; // 500 µs ×3 and 0 µs: le=0.001
    want[14] = 1; // 200 ms: le=0.2
    assert_eq!(got.buckets, want);
    assert!(
        (got.sum_seconds - 0.2015).abs() < 1e-12,
        "{}",
        got.sum_seconds
    );
}

/// A source whose figures the test sets.
#[derive(Default)]
struct FakeSource(Mutex<(u64, u64, f64)>);

impl FakeSource {
    fn set(&self, due: u64, emitted: u64, rate: f64) {
        *self.0.lock().expect("fake") = (due, emitted, rate);
    }
}

impl SourceProbe for FakeSource {
    fn read(&self) -> SourceReading {
        let (due, emitted, rate) = *self.0.lock().expect("fake");
        SourceReading {
            due,
            emitted,
            rate,
            partitions: None,
        }
    }
}

#[test]
fn source_figures_are_read_at_every_scrape_as_a_subtask_share() {
    let metrics = EngineMetrics::new().expect("metrics");
    let fake = Arc::new(FakeSource::default());
    fake.set(0, 0, 800.0);
    let _held = metrics.sources.attach(["src", "1"], 2, fake.clone());
    let text = metrics.render();
    for line in [
        "# TYPE streamscale_source_arrivals_total counter",
        "# TYPE streamscale_source_backlog_records gauge",
        "# TYPE streamscale_source_rate_records_per_second gauge",
        "streamscale_source_arrivals_total{operator=\"src\",subtask=\"1\"} 0",
        "streamscale_source_backlog_records{operator=\"src\",subtask=\"1\"} 0",
        "streamscale_source_rate_records_per_second{operator=\"src\",subtask=\"1\"} 400",
    ] {
        assert!(text.contains(line), "missing {line} in {text}");
    }
    // Nothing but the probe changes: the next scrape reads the new figures.
    fake.set(801, 300, 600.0);
    let text = metrics.render();
    for line in [
        "streamscale_source_arrivals_total{operator=\"src\",subtask=\"1\"} 400.5",
        "streamscale_source_backlog_records{operator=\"src\",subtask=\"1\"} 250.5",
        "streamscale_source_rate_records_per_second{operator=\"src\",subtask=\"1\"} 300",
    ] {
        assert!(text.contains(line), "missing {line} in {text}");
    }
}

#[test]
fn source_arrivals_never_decrease() {
    let sources = SourceMetricsVec::new().expect("family");
    let fake = Arc::new(FakeSource::default());
    fake.set(1000, 1000, 100.0);
    let _held = sources.attach(["src", "0"], 1, fake.clone());
    // The wall clock steps back: fewer records are due; the counter holds, the gauges
    // follow.
    fake.set(900, 1000, 100.0);
    assert_eq!(sources.get(["src", "0"]), Some((1000.0, 0.0, 100.0)));
    fake.set(1100, 1000, 100.0);
    assert_eq!(sources.get(["src", "0"]), Some((1100.0, 100.0, 100.0)));
}

#[test]
fn a_stopped_source_keeps_its_last_figures() {
    let sources = SourceMetricsVec::new().expect("family");
    let fake = Arc::new(FakeSource::default());
    fake.set(100, 40, 10.0);
    let held = sources.attach(["src", "0"], 1, fake.clone());
    fake.set(200, 50, 10.0);
    drop(held); // read once more at the end
    fake.set(5000, 60, 10.0);
    assert_eq!(sources.get(["src", "0"]), Some((200.0, 150.0, 10.0)));
    assert_eq!(sources.get(["src", "1"]), None);
}

#[test]
fn a_restarted_source_continues_its_counter() {
    let sources = SourceMetricsVec::new().expect("family");
    let first = Arc::new(FakeSource::default());
    first.set(1000, 1000, 10.0);
    let held = sources.attach(["src", "0"], 2, first.clone());
    drop(held);
    // From a checkpoint: the job's start time is kept, the share continues (no offset).
    let restored = Arc::new(FakeSource::default());
    restored.set(1010, 900, 10.0);
    let held = sources.attach(["src", "0"], 2, restored.clone());
    assert_eq!(sources.get(["src", "0"]), Some((505.0, 55.0, 5.0)));
    drop(held);
    // From scratch: arrivals count from 0 again; the counter grows on from 505.
    let fresh = Arc::new(FakeSource::default());
    let held = sources.attach(["src", "0"], 2, fresh.clone());
    // An older run's handle dropped late leaves the new run attached.
    let stale = sources.attach(["src", "0"], 2, fresh.clone());
    let newest = sources.attach(["src", "0"], 2, fresh.clone());
    drop(stale);
    drop(held);
    fresh.set(40, 0, 10.0);
    assert_eq!(sources.get(["src", "0"]), Some((525.0, 20.0, 5.0)));
    drop(newest);
}

#[test]
fn series_exist_at_zero_and_render_as_a_prometheus_histogram() {
    let metrics = EngineMetrics::new().expect("metrics");
    let mut local = metrics.sink_latency.local(["sink", "1"]);
    let text = metrics.render();
    assert!(
        text.contains("streamscale_sink_latency_seconds_count{operator=\"sink\",subtask=\"1\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("# TYPE streamscale_sink_latency_seconds histogram"),
        "{text}"
    );
    local.set_clock(1_000_000);
    local.observe(997_000); // 3 ms: le=0.003
    local.observe(800_000); // 200 ms: le=0.2
    let before = metrics.render();
    assert!(
        before
            .contains("streamscale_sink_latency_seconds_count{operator=\"sink\",subtask=\"1\"} 0"),
        "nothing is visible before the flush: {before}"
    );
    local.flush();
    let text = metrics.render();
    for line in [
        "streamscale_sink_latency_seconds_bucket{operator=\"sink\",subtask=\"1\",le=\"0.002\"} 0",
        "streamscale_sink_latency_seconds_bucket{operator=\"sink\",subtask=\"1\",le=\"0.003\"} 1",
        "streamscale_sink_latency_seconds_bucket{operator=\"sink\",subtask=\"1\",le=\"0.15\"} 1",
        "streamscale_sink_latency_seconds_bucket{operator=\"sink\",subtask=\"1\",le=\"0.2\"} 2",
        "streamscale_sink_latency_seconds_bucket{operator=\"sink\",subtask=\"1\",le=\"+Inf\"} 2",
        "streamscale_sink_latency_seconds_sum{operator=\"sink\",subtask=\"1\"} 0.203",
        "streamscale_sink_latency_seconds_count{operator=\"sink\",subtask=\"1\"} 2",
    ] {
        assert!(text.contains(line), "missing {line} in {text}");
    }
}

#[test]
fn key_group_shares_render_per_key_group_and_drop_out_of_the_list() {
    let metrics = EngineMetrics::new().expect("metrics");
    let top = metrics.key_group_shares.series(["counts", "1"]);
    let text = metrics.render();
    assert!(
        !text.contains("streamscale_key_group_share{"),
        "nothing before a record: {text}"
    );
    top.set(&[(117, 0.5), (3, 0.25)]);
    let text = metrics.render();
    for line in [
        "# TYPE streamscale_key_group_share gauge",
        "streamscale_key_group_share{operator=\"counts\",subtask=\"1\",key_group=\"117\"} 0.5",
        "streamscale_key_group_share{operator=\"counts\",subtask=\"1\",key_group=\"3\"} 0.25",
    ] {
        assert!(text.contains(line), "missing {line} in {text}");
    }
    // The next flush's list replaces the whole list: group 3 is gone.
    top.set(&[(117, 0.75), (4, 0.125)]);
    let text = metrics.render();
    assert!(!text.contains("key_group=\"3\""), "{text}");
    assert!(text.contains("key_group=\"4\"} 0.125"), "{text}");
    assert_eq!(
        metrics.key_group_shares.get(["counts", "1"]),
        Some(vec![(117, 0.75), (4, 0.125)])
    );
    // A subtask started again starts with an empty list.
    let _again = metrics.key_group_shares.series(["counts", "1"]);
    assert_eq!(metrics.key_group_shares.get(["counts", "1"]), Some(vec![]));
    assert!(!metrics.render().contains("streamscale_key_group_share{"));
}
