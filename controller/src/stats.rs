//! Per-interval statistics between two scrapes (pure): input rate, utilization, capacity,
//! backlog and the interval's p99 latency. Feeds the progress line and the report.

use std::collections::BTreeMap;

use crate::model::SubtaskSample;
use crate::scrape::EngineMetrics;

/// Fewest records an operator must take in during an interval for its service rate (and so the
/// capacity estimate) to be measured.
pub const MIN_RECORDS_FOR_CAPACITY: f64 = 20.0;

/// Weight of the newest interval in the smoothed service rates of [`CapacityEstimator`].
pub const CAPACITY_SMOOTHING: f64 = 0.3;

/// What happened between two consecutive scrapes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct IntervalStats {
    /// End of the interval, seconds since the run started.
    pub t_s: f64,
    /// Length of the interval, seconds.
    pub dt_s: f64,
    /// Trace time at the end of the interval, seconds (when the first source follows a trace).
    pub trace_time_s: Option<f64>,
    /// Records/s that arrived at the sources (Δ arrivals / Δt; falls back to the target rate).
    pub input_rate: f64,
    /// Sources' target rate at the end of the interval, records/s.
    pub target_rate: f64,
    /// Records/s the tightest operator can take, expressed in source records/s: the minimum over
    /// non-source operators of p·μ divided by that operator's share of the source output.
    pub capacity: Option<f64>,
    /// Parallelism per operator in effect.
    pub parallelism: BTreeMap<String, u32>,
    /// Busy fraction per operator: Σ Δbusy / Σ Δ(busy + idle + backpressured) over its subtasks.
    pub utilization: BTreeMap<String, f64>,
    /// Records waiting at the sources at the end of the interval.
    pub backlog: f64,
    /// 99th percentile end-to-end latency of the records that reached a sink in the interval,
    /// seconds.
    pub p99_s: Option<f64>,
    /// The percentile the latency SLO is on when it is not p99 (`--latency-percentile`,
    /// `autoscaler.latencyPercentile`), in (0, 1); `None` for p99.
    pub slo_percentile: Option<f64>,
    /// End-to-end latency of the interval at [`Self::slo_percentile`], seconds (set with it).
    pub slo_latency_s: Option<f64>,
    /// Measured true processing rate μ per operator in this interval alone (DS2's rate: Σ Δrecords
    /// in / Σ Δbusy seconds over its subtasks, records/s per subtask), for operators that took at
    /// least [`MIN_RECORDS_FOR_CAPACITY`] records; unsmoothed (see [`CapacityEstimator`]).
    pub service_rate: BTreeMap<String, f64>,
}

fn sum(subtasks: &[SubtaskSample], f: impl Fn(&SubtaskSample) -> f64) -> f64 {
    subtasks.iter().map(f).fold(0.0, |a, b| a + b)
}

/// Delta of an operator-level sum of a counter, `None` when the operator is missing or the
/// counter went down.
fn delta(
    prev: &EngineMetrics,
    cur: &EngineMetrics,
    op: &str,
    f: impl Fn(&SubtaskSample) -> f64 + Copy,
) -> Option<f64> {
    let a = sum(prev.sample.operators.get(op)?, f);
    let b = sum(cur.sample.operators.get(op)?, f);
    (b >= a).then_some(b - a)
}

impl IntervalStats {
    /// The percentile the SLO is on (0.99 unless [`Self::slo_percentile`] says otherwise) and
    /// the interval's latency at it, seconds (`None` when no record reached a sink).
    pub fn slo_latency(&self) -> (f64, Option<f64>) {
        match self.slo_percentile {
            Some(q) => (q, self.slo_latency_s),
            None => (0.99, self.p99_s),
        }
    }

    /// Statistics of the interval from `prev` to `cur`. `sources` names the source operators;
    /// `parallelism` is the parallelism in effect; `trace_time_s` is computed by the caller.
    pub fn between(
        prev: &EngineMetrics,
        cur: &EngineMetrics,
        sources: &[String],
        parallelism: &BTreeMap<String, u32>,
        trace_time_s: Option<f64>,
    ) -> IntervalStats {
        let dt = cur.sample.at_seconds - prev.sample.at_seconds;
        let target_rate = cur.total_source_rate();
        let arrivals = cur.total_arrivals() - prev.total_arrivals();
        let input_rate = if dt > 0.0 && arrivals >= 0.0 && cur.total_arrivals() > 0.0 {
            arrivals / dt
        } else {
            target_rate
        };
        let mut utilization = BTreeMap::new();
        let mut service_rate = BTreeMap::new();
        for op in cur.sample.operators.keys() {
            if let (Some(n), Some(b)) = (
                delta(prev, cur, op, |s| s.records_in),
                delta(prev, cur, op, |s| s.busy_seconds),
            ) && n >= MIN_RECORDS_FOR_CAPACITY
                && b > 0.0
                && !sources.contains(op)
            {
                service_rate.insert(op.clone(), n / b);
            }
            let busy = delta(prev, cur, op, |s| s.busy_seconds);
            let total = delta(prev, cur, op, |s| {
                s.busy_seconds + s.idle_seconds + s.backpressured_seconds
            });
            if let (Some(b), Some(t)) = (busy, total)
                && t > 0.0
            {
                utilization.insert(op.clone(), (b / t).clamp(0.0, 1.0));
            }
        }
        let mut estimator = CapacityEstimator::default();
        estimator.observe(prev, cur, sources);
        let capacity = estimator.capacity(parallelism);
        IntervalStats {
            t_s: cur.sample.at_seconds,
            dt_s: dt.max(0.0),
            trace_time_s,
            input_rate,
            target_rate,
            capacity,
            parallelism: parallelism.clone(),
            utilization,
            backlog: cur.total_backlog(),
            p99_s: cur.latency.quantile_since(Some(&prev.latency), 0.99),
            slo_percentile: None,
            slo_latency_s: None,
            service_rate,
        }
    }
}

/// Remembers each operator's service rate μ (records per busy second per subtask) and its share
/// of the source output (records in per source record), smoothed over the intervals in which
/// they could be measured, so the capacity estimate does not vanish or jump when an interval
/// carries too few records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapacityEstimator {
    /// Smoothed μ per operator, records per busy second.
    pub service_rate: BTreeMap<String, f64>,
    /// Smoothed records in per source record, per operator.
    pub share: BTreeMap<String, f64>,
}

fn smooth(map: &mut BTreeMap<String, f64>, key: &str, value: f64) {
    map.entry(key.to_string())
        .and_modify(|v| *v += CAPACITY_SMOOTHING * (value - *v))
        .or_insert(value);
}

impl CapacityEstimator {
    /// Updates the estimates from the interval `prev` → `cur`; `sources` names the sources.
    /// Operators that took fewer than [`MIN_RECORDS_FOR_CAPACITY`] records keep their estimate.
    pub fn observe(&mut self, prev: &EngineMetrics, cur: &EngineMetrics, sources: &[String]) {
        let source_out: f64 = sources
            .iter()
            .filter_map(|s| delta(prev, cur, s, |x| x.records_out))
            .fold(0.0, |a, b| a + b);
        for op in cur.sample.operators.keys() {
            if sources.contains(op) {
                continue;
            }
            let (Some(records_in), Some(busy)) = (
                delta(prev, cur, op, |s| s.records_in),
                delta(prev, cur, op, |s| s.busy_seconds),
            ) else {
                continue;
            };
            if records_in < MIN_RECORDS_FOR_CAPACITY || busy <= 0.0 {
                continue;
            }
            smooth(&mut self.service_rate, op, records_in / busy);
            if source_out >= MIN_RECORDS_FOR_CAPACITY {
                smooth(&mut self.share, op, records_in / source_out);
            }
        }
    }

    /// Records/s (in source records) the tightest operator can take at `parallelism`: the
    /// minimum over operators with known μ and share of p·μ / share. `None` before any
    /// measurement.
    pub fn capacity(&self, parallelism: &BTreeMap<String, u32>) -> Option<f64> {
        self.service_rate
            .iter()
            .filter_map(|(op, mu)| {
                let share = *self.share.get(op)?;
                let p = f64::from(*parallelism.get(op)?);
                (share > 0.0).then(|| p * mu / share)
            })
            .filter(|c| c.is_finite())
            .reduce(f64::min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scrape::LatencyHistogram;

    fn sub(records_in: f64, records_out: f64, busy: f64, idle: f64) -> SubtaskSample {
        SubtaskSample {
            records_in,
            records_out,
            busy_seconds: busy,
            idle_seconds: idle,
            ..SubtaskSample::default()
        }
    }

    fn metrics(
        at: f64,
        arrivals: f64,
        out: f64,
        enrich: Vec<SubtaskSample>,
        sink_count: f64,
    ) -> EngineMetrics {
        let mut m = EngineMetrics::default();
        m.sample.at_seconds = at;
        m.sample.operators.insert(
            "source".into(),
            vec![SubtaskSample {
                records_out: out,
                source_arrivals: Some(arrivals),
                source_backlog: Some(arrivals - out),
                ..SubtaskSample::default()
            }],
        );
        m.sample.operators.insert("enrich".into(), enrich);
        m.source_rates.insert("source".into(), 100.0);
        m.latency = LatencyHistogram {
            buckets: vec![(0.1, sink_count), (f64::INFINITY, sink_count)],
            sum_seconds: 0.0,
            count: sink_count,
        };
        m
    }

    #[test]
    fn rates_utilization_and_capacity() {
        let prev = metrics(
            10.0,
            1000.0,
            1000.0,
            vec![sub(500.0, 500.0, 1.0, 9.0), sub(500.0, 500.0, 1.0, 9.0)],
            1000.0,
        );
        // 2 s later: 200 arrivals, 180 emitted; enrich took 180 records in 1.8 busy seconds
        // (μ = 100/s per subtask) out of 4 subtask-seconds.
        let cur = metrics(
            12.0,
            1200.0,
            1180.0,
            vec![sub(590.0, 590.0, 1.9, 10.1), sub(590.0, 590.0, 1.9, 10.1)],
            1180.0,
        );
        let p: BTreeMap<String, u32> = [("source".to_string(), 1), ("enrich".to_string(), 2)]
            .into_iter()
            .collect();
        let s = IntervalStats::between(&prev, &cur, &["source".to_string()], &p, Some(3600.0));
        assert_eq!(s.dt_s, 2.0);
        assert!((s.input_rate - 100.0).abs() < 1e-9);
        assert_eq!(s.target_rate, 100.0);
        assert_eq!(s.backlog, 20.0);
        assert!((s.utilization["enrich"] - 1.8 / 4.0).abs() < 1e-9);
        // p·μ = 2 × 100 = 200 records/s; enrich sees every source record.
        let cap = s.capacity.expect("measured");
        assert!((cap - 200.0).abs() < 1e-6, "{cap}");
        // This interval's own μ (180 records in 1.8 busy seconds); none for the source.
        assert!((s.service_rate["enrich"] - 100.0).abs() < 1e-9);
        assert!(!s.service_rate.contains_key("source"));
        assert!(s.p99_s.is_some());
        assert_eq!(s.trace_time_s, Some(3600.0));
    }

    #[test]
    fn no_traffic_means_no_capacity_and_no_p99() {
        let prev = metrics(0.0, 0.0, 0.0, vec![sub(0.0, 0.0, 0.0, 1.0)], 0.0);
        let cur = metrics(1.0, 0.0, 0.0, vec![sub(0.0, 0.0, 0.0, 2.0)], 0.0);
        let s =
            IntervalStats::between(&prev, &cur, &["source".to_string()], &BTreeMap::new(), None);
        assert_eq!(s.capacity, None);
        assert_eq!(s.p99_s, None);
        assert_eq!(s.utilization["enrich"], 0.0);
        assert!(s.service_rate.is_empty());
        // No arrivals counted yet: fall back to the target rate.
        assert_eq!(s.input_rate, 100.0);
    }

    #[test]
    fn the_estimator_keeps_mu_through_quiet_intervals_and_scales_with_p() {
        let p1: BTreeMap<String, u32> = [("enrich".to_string(), 1)].into_iter().collect();
        let p3: BTreeMap<String, u32> = [("enrich".to_string(), 3)].into_iter().collect();
        let sources = ["source".to_string()];
        let a = metrics(0.0, 0.0, 0.0, vec![sub(0.0, 0.0, 0.0, 0.0)], 0.0);
        // 100 records in 0.5 busy seconds: μ = 200/s.
        let b = metrics(1.0, 100.0, 100.0, vec![sub(100.0, 100.0, 0.5, 0.5)], 100.0);
        // Only 5 records: too few to measure, the estimate stays.
        let c = metrics(2.0, 105.0, 105.0, vec![sub(105.0, 105.0, 0.6, 1.4)], 105.0);
        let mut est = CapacityEstimator::default();
        assert_eq!(est.capacity(&p1), None);
        est.observe(&a, &b, &sources);
        assert!((est.capacity(&p1).expect("measured") - 200.0).abs() < 1e-9);
        est.observe(&b, &c, &sources);
        assert!((est.capacity(&p1).expect("kept") - 200.0).abs() < 1e-9);
        assert!((est.capacity(&p3).expect("kept") - 600.0).abs() < 1e-9);
        // The instantaneous figure of the quiet interval is unknown.
        let s = IntervalStats::between(&b, &c, &sources, &p1, None);
        assert_eq!(s.capacity, None);
    }
}
