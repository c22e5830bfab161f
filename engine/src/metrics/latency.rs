//! The sinks' end-to-end latency histogram: the family served on the page
//! ([`LatencyHistogramVec`]) and each sink subtask's thread-local part of it
//! ([`LocalLatencyHistogram`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};

use super::{LABELS, MetricsError, SINK_LATENCY_BUCKETS, label_pairs};

/// Number of buckets of the sinks' latency histogram: one per bound of
/// [`SINK_LATENCY_BUCKETS`], then +∞.
pub(super) const LATENCY_BUCKETS: usize = SINK_LATENCY_BUCKETS.len() + 1;

/// Upper bound of bucket `i` of the latency histogram in whole microseconds
/// ([`SINK_LATENCY_BUCKETS`] are whole microseconds; the +∞ bucket: `u64::MAX`).
pub(super) fn bucket_bound_us(i: usize) -> u64 {
    SINK_LATENCY_BUCKETS
        .get(i)
        .map_or(u64::MAX, |b| seconds_to_us(*b))
}

/// A bucket bound (seconds, whole microseconds) in microseconds.
fn seconds_to_us(bound: f64) -> u64 {
    (bound * 1e6).round() as u64
}

/// One series' observations: count per bucket (not cumulative) and the sum in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyCounts {
    /// Observations per bucket: `buckets[i]` counts latencies in
    /// (`SINK_LATENCY_BUCKETS[i-1]`, `SINK_LATENCY_BUCKETS[i]`]; the last one those above
    /// the largest bound.
    pub buckets: [u64; LATENCY_BUCKETS],
    /// Sum of the observed latencies, seconds.
    pub sum_seconds: f64,
}

impl Default for LatencyCounts {
    fn default() -> Self {
        LatencyCounts {
            buckets: [0; LATENCY_BUCKETS],
            sum_seconds: 0.0,
        }
    }
}

impl LatencyCounts {
    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// The sinks' end-to-end latency histogram family (`streamscale_sink_latency_seconds`, labels
/// `operator` and `subtask`, buckets [`SINK_LATENCY_BUCKETS`] and +∞), exposed exactly as a
/// Prometheus histogram.
///
/// Unlike `prometheus`' own `HistogramVec`, it takes a subtask's observations in bulk: each
/// sink subtask counts into a thread-local [`LocalLatencyHistogram`] (a few integer operations
/// per record) and adds its bucket counts at each metrics flush, under one lock per series, so
/// that a scrape always reads a consistent series (count = sum of the buckets).
#[derive(Clone)]
pub struct LatencyHistogramVec {
    inner: Arc<LatencyFamily>,
}

struct LatencyFamily {
    desc: Desc,
    /// Series by label values (`operator`, `subtask`).
    series: Mutex<BTreeMap<[String; 2], Arc<Mutex<LatencyCounts>>>>,
}

impl LatencyHistogramVec {
    /// An empty family named `name`.
    ///
    /// # Errors
    /// [`prometheus::Error`] if the name or help is not valid.
    pub fn new(name: &str, help: &str) -> Result<LatencyHistogramVec, MetricsError> {
        let labels = LABELS.iter().map(|l| (*l).to_string()).collect();
        let desc = Desc::new(name.into(), help.into(), labels, HashMap::new())?;
        Ok(LatencyHistogramVec {
            inner: Arc::new(LatencyFamily {
                desc,
                series: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    fn series(&self, labels: [&str; 2]) -> Arc<Mutex<LatencyCounts>> {
        let key = labels.map(str::to_string);
        let mut series = self
            .inner
            .series
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        series.entry(key).or_default().clone()
    }

    /// A thread-local recorder for the series `[operator, subtask]`, which exists (at 0) from
    /// this call on.
    pub fn local(&self, labels: [&str; 2]) -> LocalLatencyHistogram {
        LocalLatencyHistogram {
            shared: self.series(labels),
            counts: [0; LATENCY_BUCKETS],
            sum_us: 0,
            first_us: 0,
            span_us: bucket_bound_us(0),
            at: 0,
            clock_us: 0,
            run_created_us: 0,
            run: 0,
        }
    }

    /// The observations of the series `[operator, subtask]` flushed so far (`None` if it
    /// does not exist).
    pub fn get(&self, labels: [&str; 2]) -> Option<LatencyCounts> {
        let key = labels.map(str::to_string);
        let series = self
            .inner
            .series
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let counts = series.get(&key)?;
        Some(*counts.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Collector for LatencyHistogramVec {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.inner.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let series = self
            .inner
            .series
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let metrics = series
            .iter()
            .map(|(values, counts)| {
                let counts = *counts.lock().unwrap_or_else(PoisonError::into_inner);
                let labels = label_pairs(values);
                let mut cumulative = 0;
                let buckets = SINK_LATENCY_BUCKETS
                    .iter()
                    .zip(&counts.buckets)
                    .map(|(bound, n)| {
                        cumulative += n;
                        let mut b = proto::Bucket::default();
                        b.set_cumulative_count(cumulative);
                        b.set_upper_bound(*bound);
                        b
                    })
                    .collect();
                let mut h = proto::Histogram::default();
                h.set_sample_count(counts.count());
                h.set_sample_sum(counts.sum_seconds);
                h.set_bucket(buckets);
                let mut m = proto::Metric::from_label(labels);
                m.set_histogram(h);
                m
            })
            .collect();
        let mut family = MetricFamily::default();
        family.set_name(self.inner.desc.fq_name.clone());
        family.set_help(self.inner.desc.help.clone());
        family.set_field_type(MetricType::HISTOGRAM);
        family.set_metric(metrics);
        vec![family]
    }
}

/// A sink subtask's thread-local part of a [`LatencyHistogramVec`] series: counts latencies
/// in whole microseconds into the buckets until [`LocalLatencyHistogram::flush`].
///
/// A latency of `l` µs falls into the first bucket whose bound `b` (seconds) has
/// `l / 10⁶ ≤ b`, as in a Prometheus histogram observing `l / 10⁶` seconds.
///
/// A record's latency is measured against the recorder's clock ([`Self::set_clock`]: the
/// sink sets it once per batch of records or every few records). Records with the same
/// source timestamp (a source stamps a whole batch at once) then have the same latency: a run
/// of them costs one comparison and one increment per record and is put into its bucket when
/// it ends; the bucket of the last run is kept as a range of microseconds, so that a new run
/// of similar latency finds its bucket with one comparison.
pub struct LocalLatencyHistogram {
    shared: Arc<Mutex<LatencyCounts>>,
    counts: [u64; LATENCY_BUCKETS],
    /// Sum of the latencies since the last flush, µs.
    sum_us: u64,
    /// Latencies from `first_us` to `first_us + span_us` fall into bucket `at`.
    first_us: u64,
    span_us: u64,
    at: usize,
    /// The clock (µs since the Unix epoch) latencies are measured against.
    clock_us: u64,
    /// The source timestamp (µs since the Unix epoch) of the current run of records, and its
    /// length (not yet in `counts`).
    run_created_us: u64,
    run: u64,
}

impl LocalLatencyHistogram {
    /// Measures the following records' latency against `now_us` (µs since the Unix epoch).
    #[inline]
    pub fn set_clock(&mut self, now_us: u64) {
        if now_us != self.clock_us {
            self.end_run(self.run_created_us);
            self.run = 0;
            self.clock_us = now_us;
        }
    }

    /// Counts one record that arrived at its source at `created_us` (µs since the Unix
    /// epoch): its latency is the clock minus that, 0 if the clock is earlier.
    #[inline]
    pub fn observe(&mut self, created_us: u64) {
        if created_us == self.run_created_us {
            self.run += 1;
        } else {
            self.end_run(created_us);
        }
    }

    /// Puts the current run into its bucket and starts a run of records created at
    /// `created_us`.
    #[inline(never)]
    fn end_run(&mut self, created_us: u64) {
        let (created, n) = (self.run_created_us, self.run);
        (self.run_created_us, self.run) = (created_us, 1);
        if n == 0 {
            return;
        }
        let latency = self.clock_us.saturating_sub(created);
        if latency.wrapping_sub(self.first_us) > self.span_us {
            self.find_bucket(latency);
        }
        self.counts[self.at] += n;
        self.sum_us = self.sum_us.saturating_add(latency.saturating_mul(n));
    }

    /// Makes the bucket of `latency_us` the current one.
    #[cold]
    fn find_bucket(&mut self, latency_us: u64) {
        // The first bound at or above the latency (bounds increase; binary search over the
        // 32 bounds), else the +∞ bucket.
        let at = SINK_LATENCY_BUCKETS.partition_point(|b| seconds_to_us(*b) < latency_us);
        self.first_us = at.checked_sub(1).map_or(0, |i| bucket_bound_us(i) + 1);
        self.span_us = bucket_bound_us(at) - self.first_us;
        self.at = at;
    }

    /// Adds the observations since the last flush to the shared series (visible to the next
    /// scrape) and starts counting from zero again.
    pub fn flush(&mut self) {
        self.end_run(self.run_created_us);
        self.run = 0;
        if self.counts.iter().all(|&n| n == 0) {
            return;
        }
        {
            let mut shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
            for (total, n) in shared.buckets.iter_mut().zip(&self.counts) {
                *total += n;
            }
            shared.sum_seconds += self.sum_us as f64 / 1e6;
        }
        self.counts = [0; LATENCY_BUCKETS];
        self.sum_us = 0;
    }
}
