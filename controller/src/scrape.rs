//! Scraping an engine's Prometheus endpoint into the planner's input type.
//!
//! [`parse_metrics`] is pure (text in, [`EngineMetrics`] out) and [`scrape`] fetches the text
//! over HTTP first. Besides the per-subtask [`MetricSample`] the planner reads, a scrape keeps
//! what the live progress line and the report need: each source's target rate, the sink
//! latency histogram and the sink's accounted-records counter.

use std::collections::BTreeMap;

use crate::model::{MetricSample, SubtaskSample};

/// Counter: records taken from the subtask's input.
pub const RECORDS_IN: &str = "streamscale_records_in_total";
/// Counter: records emitted by the subtask.
pub const RECORDS_OUT: &str = "streamscale_records_out_total";
/// Counter: seconds the subtask spent processing records.
pub const BUSY: &str = "streamscale_busy_time_seconds_total";
/// Counter: seconds the subtask spent waiting for input.
pub const IDLE: &str = "streamscale_idle_time_seconds_total";
/// Counter: seconds the subtask spent blocked on a full output channel.
pub const BACKPRESSURED: &str = "streamscale_backpressured_time_seconds_total";
/// Gauge: records waiting in the subtask's input queue.
pub const QUEUE_LENGTH: &str = "streamscale_input_queue_length";
/// Gauge (sources): records that should have been emitted but were not yet.
pub const SOURCE_BACKLOG: &str = "streamscale_source_backlog_records";
/// Counter (sources): records that should have been emitted by now.
pub const SOURCE_ARRIVALS: &str = "streamscale_source_arrivals_total";
/// Gauge (Kafka sources): the topic's partition count.
pub const SOURCE_PARTITIONS: &str = "streamscale_source_partitions";
/// Gauge (sources): the trace's current target rate, in records/s.
pub const SOURCE_RATE: &str = "streamscale_source_rate_records_per_second";
/// Gauge (keyed operators): the busiest key group's share of the subtask's recent records.
pub const HOTTEST_KEY_GROUP_SHARE: &str = "streamscale_hottest_key_group_share";
/// Gauge (keyed operators), one series per listed key group (label `key_group`, its index):
/// the share of the subtask's recent records taken by each of its busiest key groups (the
/// engine lists its 8 busiest).
pub const KEY_GROUP_SHARE: &str = "streamscale_key_group_share";
/// Counter (non-source operators): records in the subtask's timed batches, Σn
/// (`streamscale_engine::service_time`).
pub const SERVICE_RECORDS: &str = "streamscale_service_records_total";
/// Counter: the timed batches' processing seconds, ΣT.
pub const SERVICE_SECONDS: &str = "streamscale_service_time_seconds_total";
/// Counter: the timed batches' squared seconds, ΣT².
pub const SERVICE_SECONDS_SQ: &str = "streamscale_service_time_sq_seconds_total";
/// Counter: the timed batches' records times seconds, ΣnT.
pub const SERVICE_RECORD_SECONDS: &str = "streamscale_service_time_records_seconds_total";
/// Counter: the timed batches' squared record counts, Σn².
pub const SERVICE_RECORDS_SQ: &str = "streamscale_service_records_sq_total";
/// Histogram (sinks): end-to-end latency in seconds.
pub const SINK_LATENCY: &str = "streamscale_sink_latency_seconds";
/// Counter (sinks): source records whose effect reached the sink.
pub const SINK_ACCOUNTED: &str = "streamscale_sink_accounted_records_total";

/// Errors from fetching or parsing a metrics page.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The HTTP request failed (connection refused, timeout, ...); the message carries the
    /// client error's causes down to the root one (e.g. `Connection refused`).
    #[error("GET {url}: {}", crate::causes::with_causes(source))]
    Http {
        /// The metrics URL.
        url: String,
        /// The client's error.
        source: reqwest::Error,
    },
    /// The endpoint answered with a non-success status (404 names the engine's `/metrics` path).
    #[error("GET {url}: HTTP {status}{}", if *status == 404 { " (the engine serves its metrics at http://HOST:PORT/metrics)" } else { "" })]
    Status {
        /// The metrics URL.
        url: String,
        /// The HTTP status code.
        status: u16,
    },
    /// The page is not Prometheus text, or a per-subtask sample lacks its labels.
    #[error("{url}: cannot parse metrics: {message}")]
    Parse {
        /// The metrics URL (or `<text>` when parsing a string).
        url: String,
        /// What is wrong.
        message: String,
    },
}

/// A cumulative latency histogram (all sink subtasks added up).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LatencyHistogram {
    /// `(upper bound in seconds, cumulative count)` sorted by bound; the last bound may be +∞.
    pub buckets: Vec<(f64, f64)>,
    /// Sum of all observed latencies, in seconds.
    pub sum_seconds: f64,
    /// Number of observations.
    pub count: f64,
}

impl LatencyHistogram {
    /// The `q` quantile (0..=1), in seconds, of the observations made since `earlier` (a previous
    /// scrape of the same histogram), or of all observations when `earlier` is `None`.
    ///
    /// Interpolates linearly within the bucket holding the quantile (from the previous bound,
    /// or 0 for the first bucket). When the quantile falls in the +∞ bucket, returns the largest
    /// finite bound. `None` when no observation was made in the interval. A counter that went
    /// down (engine restarted without its counters) is treated as a reset: the current counts
    /// are used alone.
    pub fn quantile_since(&self, earlier: Option<&LatencyHistogram>, q: f64) -> Option<f64> {
        let mut deltas: Vec<(f64, f64)> = Vec::with_capacity(self.buckets.len());
        let mut reset = false;
        for &(le, count) in &self.buckets {
            let before = earlier
                .and_then(|e| e.buckets.iter().find(|(l, _)| same_bound(*l, le)))
                .map_or(0.0, |(_, c)| *c);
            if count < before {
                reset = true;
            }
            deltas.push((le, count - before));
        }
        if reset {
            deltas = self.buckets.clone();
        }
        let total = deltas.last().map_or(0.0, |(_, c)| *c);
        if total <= 0.0 || !total.is_finite() {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let mut lower_bound = 0.0;
        let mut lower_count = 0.0;
        for &(le, cum) in &deltas {
            if cum >= rank && cum > lower_count {
                if le.is_infinite() {
                    return Some(lower_bound);
                }
                let fraction = (rank - lower_count) / (cum - lower_count);
                return Some(lower_bound + (le - lower_bound) * fraction.clamp(0.0, 1.0));
            }
            if le.is_finite() {
                lower_bound = le;
            }
            lower_count = cum;
        }
        Some(lower_bound)
    }

    /// Number of observations made since `earlier` (all of them when `None` or after a reset).
    pub fn count_since(&self, earlier: Option<&LatencyHistogram>) -> f64 {
        match earlier {
            Some(e) if e.count <= self.count => self.count - e.count,
            _ => self.count,
        }
    }
}

fn same_bound(a: f64, b: f64) -> bool {
    (a.is_infinite() && b.is_infinite()) || (a - b).abs() <= 1e-12 * a.abs().max(1.0)
}

/// Everything one scrape of an engine yields.
#[derive(Debug, Clone, Default)]
pub struct EngineMetrics {
    /// Per-subtask counters and gauges, the planner's input.
    pub sample: MetricSample,
    /// Current target rate of each source operator, in records/s (sum over its subtasks).
    pub source_rates: BTreeMap<String, f64>,
    /// End-to-end latency histogram, all sinks added up.
    pub latency: LatencyHistogram,
    /// Source records whose effect reached a sink, all sinks added up (cumulative count).
    pub sink_accounted: f64,
}

impl EngineMetrics {
    /// Sum over all source operators of the target rate, in records/s.
    pub fn total_source_rate(&self) -> f64 {
        self.source_rates.values().fold(0.0, |a, b| a + b)
    }

    /// Sum over all source subtasks of the backlog gauge, in records.
    pub fn total_backlog(&self) -> f64 {
        self.sample
            .operators
            .values()
            .flatten()
            .filter_map(|s| s.source_backlog)
            .fold(0.0, |a, b| a + b)
    }

    /// Sum over the subtasks of the `sources` operators of the backlog gauge, in records; NaN
    /// (unknown, never 0) when a subtask of one of them does not report it (a source without
    /// the metric, or a subtask missing from the scrape).
    pub fn sources_backlog(&self, sources: &[String]) -> f64 {
        let mut total = 0.0;
        for subtasks in sources.iter().filter_map(|s| self.sample.operators.get(s)) {
            for s in subtasks {
                total += s.source_backlog.unwrap_or(f64::NAN);
            }
        }
        total
    }

    /// The `sources` operators that report no backlog gauge in this scrape (no subtask has it),
    /// in the order given.
    pub fn sources_without_backlog<'a>(&self, sources: &'a [String]) -> Vec<&'a str> {
        sources
            .iter()
            .filter(|src| {
                self.sample
                    .operators
                    .get(*src)
                    .is_some_and(|subs| subs.iter().all(|s| s.source_backlog.is_none()))
            })
            .map(String::as_str)
            .collect()
    }

    /// Sum over all source subtasks of the arrivals counter (records that should have been
    /// emitted by now).
    pub fn total_arrivals(&self) -> f64 {
        self.sample
            .operators
            .values()
            .flatten()
            .filter_map(|s| s.source_arrivals)
            .fold(0.0, |a, b| a + b)
    }

    /// Number of subtasks seen per operator.
    pub fn parallelism(&self) -> BTreeMap<String, u32> {
        self.sample
            .operators
            .iter()
            .map(|(name, subtasks)| {
                (
                    name.clone(),
                    u32::try_from(subtasks.len()).unwrap_or(u32::MAX),
                )
            })
            .collect()
    }
}

/// Fetches `url` (an engine's `/metrics`) and parses it; `at_seconds` is the controller's clock
/// (seconds since the run started) stamped on the sample. Prefer [`scrape_stamped`], which
/// reads the clock when the page arrived.
///
/// # Errors
/// [`ScrapeError::Http`] / [`ScrapeError::Status`] when the page cannot be fetched,
/// [`ScrapeError::Parse`] when it is not valid.
pub async fn scrape(
    client: &reqwest::Client,
    url: &str,
    at_seconds: f64,
) -> Result<EngineMetrics, ScrapeError> {
    scrape_stamped(client, url, &|| at_seconds).await
}

/// Fetches `url` (an engine's `/metrics`) and parses it, stamping the sample with `clock`
/// (seconds on the caller's monotonic clock, e.g. since the run started) read when the answer
/// arrived: the engine renders its page (its counters, the sources' arrivals computed then)
/// just before it answers, so that is the time the figures are of. A time read when the
/// request was sent would add the engine's delay in answering (a busy engine, a loaded
/// machine) to one interval and take it from the next, and every rate divides by these times.
///
/// # Errors
/// [`ScrapeError::Http`] / [`ScrapeError::Status`] when the page cannot be fetched,
/// [`ScrapeError::Parse`] when it is not valid.
pub async fn scrape_stamped(
    client: &reqwest::Client,
    url: &str,
    clock: &(dyn Fn() -> f64 + Sync),
) -> Result<EngineMetrics, ScrapeError> {
    let http = |source| ScrapeError::Http {
        url: url.to_string(),
        source,
    };
    let response = client.get(url).send().await.map_err(http)?;
    let at_seconds = clock();
    let status = response.status();
    if !status.is_success() {
        return Err(ScrapeError::Status {
            url: url.to_string(),
            status: status.as_u16(),
        });
    }
    let text = response.text().await.map_err(http)?;
    parse_metrics(&text, at_seconds).map_err(|e| match e {
        ScrapeError::Parse { message, .. } => ScrapeError::Parse {
            url: url.to_string(),
            message,
        },
        other => other,
    })
}

/// Parses Prometheus text exposition into [`EngineMetrics`] stamped `at_seconds`.
///
/// Metrics other than streamscale's are ignored. Subtasks are indexed by their `subtask` label;
/// an operator whose exported subtask indices have holes gets [`SubtaskSample::absent`] places
/// there (a subtask missing from the scrape, never zeros that would read as a counter reset).
///
/// # Errors
/// [`ScrapeError::Parse`] when a per-subtask sample lacks `operator`/`subtask` labels or the
/// subtask index is not a small non-negative integer.
pub fn parse_metrics(text: &str, at_seconds: f64) -> Result<EngineMetrics, ScrapeError> {
    let parse_err = |message: String| ScrapeError::Parse {
        url: "<text>".into(),
        message,
    };
    let lines = text.lines().map(|l| Ok(l.to_string()));
    let scrape = prometheus_parse::Scrape::parse(lines).map_err(|e| parse_err(e.to_string()))?;

    let mut operators: BTreeMap<String, Vec<SubtaskSample>> = BTreeMap::new();
    let mut source_rates: BTreeMap<String, f64> = BTreeMap::new();
    let mut latency_buckets: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    let mut latency = LatencyHistogram::default();
    let mut sink_accounted = 0.0;

    for sample in &scrape.samples {
        let name = sample.metric.as_str();
        if name == SINK_LATENCY {
            if let prometheus_parse::Value::Histogram(buckets) = &sample.value {
                for b in buckets {
                    // Key by the bound's bit pattern so equal bounds from several sinks add up.
                    let entry = latency_buckets
                        .entry(b.less_than.to_bits())
                        .or_insert((b.less_than, 0.0));
                    entry.1 += b.count;
                }
            }
            continue;
        }
        let value = match sample.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => v,
            _ => continue,
        };
        match name {
            n if n == format!("{SINK_LATENCY}_sum") => latency.sum_seconds += value,
            n if n == format!("{SINK_LATENCY}_count") => latency.count += value,
            SINK_ACCOUNTED => sink_accounted += value,
            SOURCE_RATE => {
                let op = sample.labels.get("operator").unwrap_or("source");
                *source_rates.entry(op.to_string()).or_insert(0.0) += value;
            }
            RECORDS_IN
            | RECORDS_OUT
            | BUSY
            | IDLE
            | BACKPRESSURED
            | QUEUE_LENGTH
            | SOURCE_BACKLOG
            | SOURCE_ARRIVALS
            | SOURCE_PARTITIONS
            | HOTTEST_KEY_GROUP_SHARE
            | KEY_GROUP_SHARE
            | SERVICE_RECORDS
            | SERVICE_SECONDS
            | SERVICE_SECONDS_SQ
            | SERVICE_RECORD_SECONDS
            | SERVICE_RECORDS_SQ => {
                let op = sample.labels.get("operator").ok_or_else(|| {
                    parse_err(format!("{name}: sample without an `operator` label"))
                })?;
                let subtask = sample.labels.get("subtask").ok_or_else(|| {
                    parse_err(format!(
                        "{name}{{operator=\"{op}\"}}: sample without a `subtask` label"
                    ))
                })?;
                let index: usize = subtask
                    .parse()
                    .ok()
                    .filter(|i| *i < streamscale_engine::spec::MAX_KEY_GROUPS as usize)
                    .ok_or_else(|| {
                        parse_err(format!(
                            "{name}{{operator=\"{op}\"}}: subtask label `{subtask}` is not an index"
                        ))
                    })?;
                let subtasks = operators.entry(op.to_string()).or_default();
                if subtasks.len() <= index {
                    // Places of lower subtasks not seen (yet) are absent until they are.
                    subtasks.resize(index + 1, SubtaskSample::absent());
                }
                let s = &mut subtasks[index];
                if s.is_absent() {
                    *s = SubtaskSample::default();
                }
                match name {
                    RECORDS_IN => s.records_in = value,
                    RECORDS_OUT => s.records_out = value,
                    BUSY => s.busy_seconds = value,
                    IDLE => s.idle_seconds = value,
                    BACKPRESSURED => s.backpressured_seconds = value,
                    QUEUE_LENGTH => s.queue_length = value,
                    SOURCE_BACKLOG => s.source_backlog = Some(value),
                    SOURCE_PARTITIONS => {
                        s.source_partitions = (value.is_finite() && value >= 1.0).then_some(value);
                    }
                    SERVICE_RECORDS => s.service.get_or_insert_default().records = value,
                    SERVICE_SECONDS => s.service.get_or_insert_default().seconds = value,
                    SERVICE_SECONDS_SQ => s.service.get_or_insert_default().seconds_sq = value,
                    SERVICE_RECORD_SECONDS => {
                        s.service.get_or_insert_default().record_seconds = value;
                    }
                    SERVICE_RECORDS_SQ => s.service.get_or_insert_default().records_sq = value,
                    HOTTEST_KEY_GROUP_SHARE => {
                        s.hottest_key_group_share =
                            (value.is_finite() && value > 0.0).then_some(value.min(1.0));
                    }
                    KEY_GROUP_SHARE => {
                        let group = sample
                            .labels
                            .get("key_group")
                            .and_then(|g| g.parse::<u32>().ok())
                            .filter(|g| *g < streamscale_engine::spec::MAX_KEY_GROUPS)
                            .ok_or_else(|| {
                                parse_err(format!(
                                    "{name}{{operator=\"{op}\",subtask=\"{subtask}\"}}: no key_group label with a key-group index"
                                ))
                            })?;
                        if value.is_finite() && value > 0.0 {
                            s.key_group_shares.push((group, value.min(1.0)));
                        }
                    }
                    _ => s.source_arrivals = Some(value),
                }
            }
            _ => {}
        }
    }
    // Each subtask's listed key groups busiest first (the lower index first on a tie), as the
    // engine lists them, whatever the order of the page.
    for subtasks in operators.values_mut() {
        for s in subtasks.iter_mut().filter(|s| s.key_group_shares.len() > 1) {
            s.key_group_shares
                .sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            s.key_group_shares.dedup_by_key(|x| x.0);
        }
    }
    let mut buckets: Vec<(f64, f64)> = latency_buckets.into_values().collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    latency.buckets = buckets;
    Ok(EngineMetrics {
        sample: MetricSample {
            at_seconds,
            operators,
        },
        source_rates,
        latency,
        sink_accounted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = r#"# HELP streamscale_records_in_total Records taken from the input.
# TYPE streamscale_records_in_total counter
streamscale_records_in_total{operator="enrich",subtask="0"} 1200
streamscale_records_in_total{operator="enrich",subtask="1"} 1300
streamscale_records_in_total{operator="sink",subtask="0"} 2400
streamscale_records_in_total{operator="source",subtask="0"} 0
# TYPE streamscale_records_out_total counter
streamscale_records_out_total{operator="enrich",subtask="0"} 1190
streamscale_records_out_total{operator="enrich",subtask="1"} 1290
streamscale_records_out_total{operator="source",subtask="0"} 2500
# TYPE streamscale_busy_time_seconds_total counter
streamscale_busy_time_seconds_total{operator="enrich",subtask="0"} 7.5
streamscale_busy_time_seconds_total{operator="enrich",subtask="1"} 8.25
# TYPE streamscale_idle_time_seconds_total counter
streamscale_idle_time_seconds_total{operator="enrich",subtask="0"} 2.5
streamscale_idle_time_seconds_total{operator="enrich",subtask="1"} 1.75
# TYPE streamscale_backpressured_time_seconds_total counter
streamscale_backpressured_time_seconds_total{operator="enrich",subtask="0"} 0
streamscale_backpressured_time_seconds_total{operator="enrich",subtask="1"} 0.5
# TYPE streamscale_input_queue_length gauge
streamscale_input_queue_length{operator="enrich",subtask="0"} 17
streamscale_input_queue_length{operator="enrich",subtask="1"} 17
# TYPE streamscale_hottest_key_group_share gauge
streamscale_hottest_key_group_share{operator="enrich",subtask="1"} 0.75
# TYPE streamscale_key_group_share gauge
streamscale_key_group_share{operator="enrich",subtask="1",key_group="70"} 0.125
streamscale_key_group_share{operator="enrich",subtask="1",key_group="117"} 0.75
streamscale_key_group_share{operator="enrich",subtask="1",key_group="64"} 0.125
# TYPE streamscale_service_records_total counter
streamscale_service_records_total{operator="enrich",subtask="0"} 1150
# TYPE streamscale_service_time_seconds_total counter
streamscale_service_time_seconds_total{operator="enrich",subtask="0"} 7.25
# TYPE streamscale_service_time_sq_seconds_total counter
streamscale_service_time_sq_seconds_total{operator="enrich",subtask="0"} 0.0625
# TYPE streamscale_service_time_records_seconds_total counter
streamscale_service_time_records_seconds_total{operator="enrich",subtask="0"} 80.5
# TYPE streamscale_service_records_sq_total counter
streamscale_service_records_sq_total{operator="enrich",subtask="0"} 14000
# TYPE streamscale_source_backlog_records gauge
streamscale_source_backlog_records{operator="source",subtask="0"} 120
# TYPE streamscale_source_arrivals_total counter
streamscale_source_arrivals_total{operator="source",subtask="0"} 2620
# TYPE streamscale_source_rate_records_per_second gauge
streamscale_source_rate_records_per_second{operator="source",subtask="0"} 812.5
# HELP streamscale_sink_latency_seconds End-to-end latency.
# TYPE streamscale_sink_latency_seconds histogram
streamscale_sink_latency_seconds_bucket{operator="sink",subtask="0",le="0.01"} 100
streamscale_sink_latency_seconds_bucket{operator="sink",subtask="0",le="0.1"} 2000
streamscale_sink_latency_seconds_bucket{operator="sink",subtask="0",le="1"} 2390
streamscale_sink_latency_seconds_bucket{operator="sink",subtask="0",le="+Inf"} 2400
streamscale_sink_latency_seconds_sum{operator="sink",subtask="0"} 150.5
streamscale_sink_latency_seconds_count{operator="sink",subtask="0"} 2400
# TYPE streamscale_sink_accounted_records_total counter
streamscale_sink_accounted_records_total{operator="sink",subtask="0"} 2400
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 3.2
"#;

    /// A one-connection-at-a-time HTTP server whose every answer first advances the virtual
    /// `clock` by the next of `delays` (the engine busy before it renders, as on a loaded
    /// machine), then renders a source's arrivals counter at 1000 records/s of that clock.
    async fn delayed_engine(
        clock: std::sync::Arc<std::sync::Mutex<f64>>,
        delays: Vec<f64>,
    ) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let url = format!("http://{}/metrics", listener.local_addr().expect("address"));
        tokio::spawn(async move {
            for delay in delays {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let now = {
                    let mut c = clock.lock().expect("clock");
                    *c += delay;
                    *c
                };
                let body = format!(
                    "{SOURCE_ARRIVALS}{{operator=\"src\",subtask=\"0\"}} {}\n{SOURCE_BACKLOG}{{operator=\"src\",subtask=\"0\"}} 0\n",
                    1000.0 * now
                );
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(answer.as_bytes()).await;
            }
        });
        url
    }

    /// Issue 22, case 2: jittered scrapes of a constant load. The engine renders its page some
    /// time after the request was sent (0 or 0.5 s here); a sample stamped when the request
    /// was sent mixes that delay into Δt, and the arrival rate read 1500 rec/s for 1000.
    #[tokio::test]
    async fn samples_are_stamped_when_the_engine_rendered_them() {
        let clock = std::sync::Arc::new(std::sync::Mutex::new(0.0_f64));
        let delays = vec![0.0, 0.5, 0.0, 0.5, 0.5, 0.0];
        let url = delayed_engine(clock.clone(), delays.clone()).await;
        let client = reqwest::Client::builder()
            .no_proxy()
            .build()
            .expect("client");
        let read = || *clock.lock().expect("clock");
        let mut samples = Vec::new();
        for _ in &delays {
            let m = scrape_stamped(&client, &url, &read).await.expect("scrape");
            samples.push((m.sample.at_seconds, m.total_arrivals()));
            // The controller's interval between scrapes.
            *clock.lock().expect("clock") += 1.0;
        }
        for pair in samples.windows(2) {
            let ((t0, a0), (t1, a1)) = (pair[0], pair[1]);
            let rate = (a1 - a0) / (t1 - t0);
            assert!((rate - 1000.0).abs() < 1e-6, "{rate} rec/s: {samples:?}");
        }
    }

    #[test]
    fn parses_subtasks_sources_and_sinks() {
        let m = parse_metrics(FIXTURE, 42.0).expect("fixture parses");
        assert_eq!(m.sample.at_seconds, 42.0);
        let enrich = &m.sample.operators["enrich"];
        assert_eq!(enrich.len(), 2);
        assert_eq!(enrich[1].records_in, 1300.0);
        assert_eq!(enrich[1].records_out, 1290.0);
        assert_eq!(enrich[1].busy_seconds, 8.25);
        assert_eq!(enrich[1].idle_seconds, 1.75);
        assert_eq!(enrich[1].backpressured_seconds, 0.5);
        assert_eq!(enrich[0].queue_length, 17.0);
        assert_eq!(enrich[0].source_backlog, None);
        assert_eq!(enrich[0].hottest_key_group_share, None);
        assert_eq!(enrich[1].hottest_key_group_share, Some(0.75));
        // Busiest first, the lower index first on a tie; none for the subtask without a list.
        assert_eq!(
            enrich[1].key_group_shares,
            vec![(117, 0.75), (64, 0.125), (70, 0.125)]
        );
        assert!(enrich[0].key_group_shares.is_empty());
        assert_eq!(
            enrich[0].service,
            Some(crate::model::ServiceMoments {
                records: 1150.0,
                seconds: 7.25,
                seconds_sq: 0.0625,
                record_seconds: 80.5,
                records_sq: 14000.0,
            })
        );
        assert_eq!(enrich[1].service, None, "no service sums for subtask 1");
        let source = &m.sample.operators["source"];
        assert_eq!(source[0].records_out, 2500.0);
        assert_eq!(source[0].source_backlog, Some(120.0));
        assert_eq!(source[0].source_arrivals, Some(2620.0));
        assert_eq!(m.source_rates["source"], 812.5);
        assert_eq!(m.total_backlog(), 120.0);
        assert_eq!(m.total_arrivals(), 2620.0);
        assert_eq!(m.sink_accounted, 2400.0);
        assert_eq!(m.latency.count, 2400.0);
        assert_eq!(m.latency.sum_seconds, 150.5);
        assert_eq!(m.latency.buckets.len(), 4);
        assert_eq!(m.latency.buckets[0], (0.01, 100.0));
        assert!(m.latency.buckets[3].0.is_infinite());
        assert_eq!(m.parallelism()["enrich"], 2);
        assert!(!m.sample.operators.contains_key("process"));
    }

    #[test]
    fn sample_without_subtask_label_is_an_error() {
        let text = "# TYPE streamscale_records_in_total counter\nstreamscale_records_in_total{operator=\"a\"} 1\n";
        let err = parse_metrics(text, 0.0).expect_err("missing label");
        assert!(err.to_string().contains("subtask"), "{err}");
        let text = "streamscale_records_in_total{operator=\"a\",subtask=\"x\"} 1\n";
        assert!(parse_metrics(text, 0.0).is_err());
    }

    #[test]
    fn histograms_of_several_sinks_add_up() {
        let text = "# TYPE streamscale_sink_latency_seconds histogram\n\
            streamscale_sink_latency_seconds_bucket{operator=\"a\",subtask=\"0\",le=\"0.5\"} 1\n\
            streamscale_sink_latency_seconds_bucket{operator=\"a\",subtask=\"0\",le=\"+Inf\"} 2\n\
            streamscale_sink_latency_seconds_bucket{operator=\"b\",subtask=\"0\",le=\"0.5\"} 3\n\
            streamscale_sink_latency_seconds_bucket{operator=\"b\",subtask=\"0\",le=\"+Inf\"} 4\n";
        let m = parse_metrics(text, 0.0).expect("parses");
        assert_eq!(m.latency.buckets.len(), 2);
        assert_eq!(m.latency.buckets[0], (0.5, 4.0));
        assert_eq!(m.latency.buckets[1].1, 6.0);
    }

    fn hist(buckets: &[(f64, f64)]) -> LatencyHistogram {
        LatencyHistogram {
            buckets: buckets.to_vec(),
            sum_seconds: 0.0,
            count: buckets.last().map_or(0.0, |b| b.1),
        }
    }

    #[test]
    fn p99_interpolates_within_the_bucket_of_the_interval() {
        let before = hist(&[(0.1, 100.0), (1.0, 100.0), (f64::INFINITY, 100.0)]);
        // 100 new observations: 50 under 0.1 s, 50 in (0.1, 1]; p99 rank 99 is the 49th of 50
        // in the second bucket: 0.1 + 0.9 * 49/50.
        let after = hist(&[(0.1, 150.0), (1.0, 200.0), (f64::INFINITY, 200.0)]);
        let p99 = after
            .quantile_since(Some(&before), 0.99)
            .expect("observations");
        assert!((p99 - (0.1 + 0.9 * 49.0 / 50.0)).abs() < 1e-9, "{p99}");
        // Median: rank 50 is the last of the first bucket.
        let p50 = after
            .quantile_since(Some(&before), 0.5)
            .expect("observations");
        assert!((p50 - 0.1).abs() < 1e-9, "{p50}");
        assert_eq!(after.count_since(Some(&before)), 100.0);
    }

    /// The engine's own histogram, rendered and parsed back: a p99 between 1 and 2.5 s is
    /// read inside the engine's finer bucket (1, 1.5] s, where the former (1, 2.5] bucket
    /// read a true 1.2 s as 1.75 s and failed a 1.5 s SLO the records met.
    #[test]
    fn p99_between_1_and_2_5_s_reads_within_the_engines_finer_bucket() {
        let engine = streamscale_engine::metrics::EngineMetrics::new().expect("metrics");
        let mut sink = engine.sink_latency.local(["sink", "0"]);
        let clock_us = 10_000_000;
        sink.set_clock(clock_us);
        // 980 records at 50 ms, 20 at 1.2 s (each with its own timestamp, as records arrive).
        for i in 0..1000u64 {
            let latency_us = if i % 50 == 0 { 1_200_000 } else { 50_000 };
            sink.observe(clock_us - latency_us - i % 2);
        }
        sink.flush();
        let m = parse_metrics(&engine.render(), 0.0).expect("the engine's page parses");
        assert_eq!(m.latency.count, 1000.0);
        let p99 = m.latency.quantile_since(None, 0.99).expect("observations");
        assert!(p99 <= 1.5, "a 1.5 s SLO is met: {p99}");
        // Rank 990: the 10th of the 20 records in (1, 1.5].
        assert!((p99 - 1.25).abs() < 1e-9, "{p99}: {:?}", m.latency.buckets);
    }

    #[test]
    fn p99_in_the_first_bucket_starts_from_zero() {
        let h = hist(&[(0.2, 100.0), (f64::INFINITY, 100.0)]);
        let p = h.quantile_since(None, 0.5).expect("observations");
        assert!((p - 0.1).abs() < 1e-9, "{p}");
    }

    #[test]
    fn p99_in_the_infinite_bucket_is_the_largest_finite_bound() {
        let h = hist(&[(0.1, 10.0), (2.5, 50.0), (f64::INFINITY, 100.0)]);
        assert_eq!(h.quantile_since(None, 0.99), Some(2.5));
    }

    #[test]
    fn no_new_observations_means_no_p99() {
        let h = hist(&[(0.1, 10.0), (f64::INFINITY, 10.0)]);
        assert_eq!(h.quantile_since(Some(&h), 0.99), None);
        assert_eq!(LatencyHistogram::default().quantile_since(None, 0.99), None);
    }

    #[test]
    fn a_counter_reset_uses_the_current_counts() {
        let before = hist(&[(0.1, 1000.0), (f64::INFINITY, 1000.0)]);
        let after = hist(&[(0.1, 0.0), (1.0, 10.0), (f64::INFINITY, 10.0)]);
        let p = after
            .quantile_since(Some(&before), 0.5)
            .expect("observations");
        assert!((p - 0.55).abs() < 1e-9, "{p}");
    }
}
