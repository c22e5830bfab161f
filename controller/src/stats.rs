//! Per-interval statistics between two scrapes (pure): input rate, utilization, capacity,
//! backlog and the interval's p99 latency. Feeds the progress line and the report.

use std::collections::BTreeMap;

use crate::model::SubtaskSample;
use crate::model::estimate::count_lower_bound;
use crate::scrape::EngineMetrics;

/// Fewest records an operator must take in during an interval for its service rate (and so the
/// capacity estimate) to be measured.
pub const MIN_RECORDS_FOR_CAPACITY: f64 = 20.0;

/// Weight of the newest interval in the smoothed service rates of [`CapacityEstimator`].
pub const CAPACITY_SMOOTHING: f64 = 0.3;

/// Share of the per-subtask record counts of [`CapacityEstimator::records_per_subtask`] that is
/// forgotten at each interval (a memory of about 10 intervals, so that the busiest subtask's
/// share is not read from one short interval's noise).
pub const SPREAD_DECAY: f64 = 0.1;

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
    /// non-source operators of the rate its busiest subtask can carry (μ / that subtask's share
    /// of the operator's input; p·μ when the input is spread evenly) divided by the operator's
    /// share of the source output. See [`CapacityEstimator::capacity`].
    pub capacity: Option<f64>,
    /// Parallelism per operator in effect.
    pub parallelism: BTreeMap<String, u32>,
    /// Busy fraction per operator: Σ Δbusy / Σ Δ(busy + idle + backpressured) over its subtasks.
    pub utilization: BTreeMap<String, f64>,
    /// Busy fraction of each operator's busiest subtask (Δbusy / Δ(busy + idle +
    /// backpressured) of that subtask), for operators with more than one subtask; with a hot key
    /// it is near 1 while [`Self::utilization`] (the mean) stays low.
    pub busiest_utilization: BTreeMap<String, f64>,
    /// Records waiting at the sources at the end of the interval; NaN when a source does not
    /// report its backlog (unknown, never 0).
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
    /// `parallelism` is the parallelism in effect; `trace_time_s` is computed by the caller;
    /// `capacity` is the caller's estimator, which has observed the intervals it trusts up to
    /// this one (smoothed across intervals, so one interval alone does not set the capacity).
    pub fn between(
        prev: &EngineMetrics,
        cur: &EngineMetrics,
        sources: &[String],
        parallelism: &BTreeMap<String, u32>,
        trace_time_s: Option<f64>,
        capacity: &CapacityEstimator,
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
        let mut busiest_utilization = BTreeMap::new();
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
            if let Some(rho) = busiest_subtask_utilization(prev, cur, op) {
                busiest_utilization.insert(op.clone(), rho);
            }
        }
        let capacity = capacity.capacity(parallelism);
        IntervalStats {
            t_s: cur.sample.at_seconds,
            dt_s: dt.max(0.0),
            trace_time_s,
            input_rate,
            target_rate,
            capacity,
            parallelism: parallelism.clone(),
            utilization,
            busiest_utilization,
            backlog: cur.sources_backlog(sources),
            p99_s: cur.latency.quantile_since(Some(&prev.latency), 0.99),
            slo_percentile: None,
            slo_latency_s: None,
            service_rate,
        }
    }
}

/// Per-subtask deltas of counter `f` of operator `op` from `prev` to `cur`, in subtask order;
/// `None` when the operator is missing from either scrape, its subtask count changed or a
/// counter went down.
fn subtask_deltas(
    prev: &EngineMetrics,
    cur: &EngineMetrics,
    op: &str,
    f: impl Fn(&SubtaskSample) -> f64,
) -> Option<Vec<f64>> {
    let a = prev.sample.operators.get(op)?;
    let b = cur.sample.operators.get(op)?;
    if a.len() != b.len() {
        return None;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = f(y) - f(x);
            (d >= 0.0).then_some(d)
        })
        .collect()
}

/// The highest busy fraction among the subtasks of `op` over the interval, for operators with
/// at least two subtasks that each spent time in the interval.
fn busiest_subtask_utilization(prev: &EngineMetrics, cur: &EngineMetrics, op: &str) -> Option<f64> {
    let busy = subtask_deltas(prev, cur, op, |s| s.busy_seconds)?;
    let total = subtask_deltas(prev, cur, op, |s| {
        s.busy_seconds + s.idle_seconds + s.backpressured_seconds
    })?;
    if busy.len() < 2 || total.iter().any(|t| *t <= 0.0) {
        return None;
    }
    busy.iter()
        .zip(&total)
        .map(|(b, t)| (b / t).clamp(0.0, 1.0))
        .reduce(f64::max)
}

/// Remembers each operator's service rate μ (records per busy second per subtask) and its share
/// of the source output (records in per source record), smoothed over the intervals in which
/// they could be measured, so the capacity estimate does not vanish or jump when an interval
/// carries too few records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CapacityEstimator {
    /// Smoothed μ per operator, records per busy second.
    pub service_rate: BTreeMap<String, f64>,
    /// Smoothed records in (a Kafka source: records out) per source record, per operator.
    pub share: BTreeMap<String, f64>,
    /// Per operator: its records in per subtask at the parallelism now measured (the vector's
    /// length), summed over the intervals since that parallelism took effect with older
    /// intervals' weight decaying by [`SPREAD_DECAY`] per interval. The busiest subtask's
    /// share of the sum is the share of the input it carries (1/p for an even spread, near 1
    /// when one key carries the input). Restarted when the parallelism changes, since key
    /// groups are then spread differently.
    pub records_per_subtask: BTreeMap<String, Vec<f64>>,
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
        for (op, subtasks) in &cur.sample.operators {
            // A Kafka source reads at a rate of its own (records out per busy second, its
            // busiest subtask the one with the most partitions); a synthetic source emits its
            // schedule and has no capacity to show.
            let records: fn(&SubtaskSample) -> f64 = if !sources.contains(op) {
                |s| s.records_in
            } else if subtasks.iter().any(|s| s.source_partitions.is_some()) {
                |s| s.records_out
            } else {
                continue;
            };
            if let Some(per_subtask) = subtask_deltas(prev, cur, op, records) {
                self.observe_spread(op, per_subtask);
            }
            let (Some(taken), Some(busy)) = (
                delta(prev, cur, op, records),
                delta(prev, cur, op, |s| s.busy_seconds),
            ) else {
                continue;
            };
            if taken < MIN_RECORDS_FOR_CAPACITY || busy <= 0.0 {
                continue;
            }
            smooth(&mut self.service_rate, op, taken / busy);
            if source_out >= MIN_RECORDS_FOR_CAPACITY {
                smooth(&mut self.share, op, taken / source_out);
            }
        }
    }

    fn observe_spread(&mut self, op: &str, per_subtask: Vec<f64>) {
        match self.records_per_subtask.get_mut(op) {
            Some(sums) if sums.len() == per_subtask.len() => {
                for (sum, d) in sums.iter_mut().zip(per_subtask) {
                    *sum = (1.0 - SPREAD_DECAY) * *sum + d;
                }
            }
            _ => {
                self.records_per_subtask.insert(op.to_string(), per_subtask);
            }
        }
    }

    /// The share of `op`'s input its busiest subtask carries at parallelism `p`, in [1/p, 1]:
    /// its record count n read as [`count_lower_bound`] (n − 2√n) over all subtasks' records (1/p until
    /// the counts tell the busiest subtask from noise). `None` at another parallelism or before
    /// [`MIN_RECORDS_FOR_CAPACITY`] records were seen at `p`.
    pub fn busiest_share(&self, op: &str, p: u32) -> Option<f64> {
        let sums = self.records_per_subtask.get(op)?;
        let pf = f64::from(p);
        if sums.len() != usize::try_from(p).ok()? {
            return None;
        }
        let total: f64 = sums.iter().sum();
        if total < MIN_RECORDS_FOR_CAPACITY {
            return None;
        }
        let max = sums.iter().copied().reduce(f64::max)?;
        let max_low = count_lower_bound(max);
        Some((max_low / total).clamp(1.0 / pf, 1.0))
    }

    /// Records/s (in source records) the tightest operator can take at `parallelism`: the
    /// minimum over operators with known μ and share of μ / s_max / share, with s_max the
    /// busiest subtask's share of the operator's input measured at this parallelism
    /// ([`Self::busiest_share`]: the subtask that saturates first; DS2's p·μ assumes
    /// s_max = 1/p, which is what is used until s_max has been measured at this parallelism).
    /// `None` before any measurement.
    pub fn capacity(&self, parallelism: &BTreeMap<String, u32>) -> Option<f64> {
        self.service_rate
            .iter()
            .filter_map(|(op, mu)| {
                let share = *self.share.get(op)?;
                let p = *parallelism.get(op)?;
                let busiest = self.busiest_share(op, p).unwrap_or(1.0 / f64::from(p));
                (share > 0.0).then(|| mu / busiest / share)
            })
            .filter(|c| c.is_finite())
            .reduce(f64::min)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statistics of one interval with a capacity estimator that observed only it.
    fn one_interval(
        prev: &EngineMetrics,
        cur: &EngineMetrics,
        sources: &[String],
        parallelism: &BTreeMap<String, u32>,
        trace_time_s: Option<f64>,
    ) -> IntervalStats {
        let mut capacity = CapacityEstimator::default();
        capacity.observe(prev, cur, sources);
        IntervalStats::between(prev, cur, sources, parallelism, trace_time_s, &capacity)
    }
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

    /// Issue 22, case 3: a source exporting no backlog metric had its backlog reported as 0
    /// (an overloaded job's summary said "backlog 0"). It is unknown: NaN, shown as `?` on the
    /// progress line and `null` in summary.json.
    #[test]
    fn a_source_without_a_backlog_metric_has_an_unknown_backlog() {
        let no_backlog = |m: &mut EngineMetrics| {
            for s in m.sample.operators.get_mut("source").expect("source") {
                s.source_backlog = None;
            }
        };
        let mut prev = metrics(
            10.0,
            1000.0,
            1000.0,
            vec![sub(500.0, 500.0, 1.0, 9.0)],
            1000.0,
        );
        let mut cur = metrics(
            12.0,
            1200.0,
            1100.0,
            vec![sub(600.0, 600.0, 2.0, 10.0)],
            1100.0,
        );
        no_backlog(&mut prev);
        no_backlog(&mut cur);
        let p: BTreeMap<String, u32> = [("source".to_string(), 1), ("enrich".to_string(), 1)]
            .into_iter()
            .collect();
        let s = one_interval(&prev, &cur, &["source".to_string()], &p, None);
        assert!(
            s.backlog.is_nan(),
            "backlog {} for an unknown one",
            s.backlog
        );
        let line = crate::progress::progress_line(&s, &["source".to_string()], 1.0, 0.0);
        assert!(line.contains("backlog=?"), "{line}");
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
        let s = one_interval(&prev, &cur, &["source".to_string()], &p, Some(3600.0));
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

    /// A Kafka source reads at a rate of its own: the capacity is the lower of its and the
    /// other operators' (a Kafka job's `cap=` showed millions of records/s, the sink's).
    #[test]
    fn a_kafka_source_caps_capacity_at_its_read_rate() {
        let kafka = |at: f64, read: f64, busy: f64| {
            let mut m = metrics(
                at,
                0.0,
                0.0,
                vec![sub(3.0 * read, 3.0 * read, 0.01 * at, at)],
                3.0 * read,
            );
            let src = SubtaskSample {
                records_out: read,
                busy_seconds: busy,
                source_arrivals: Some(3.0 * read),
                source_backlog: Some(0.0),
                source_partitions: Some(6.0),
                ..SubtaskSample::default()
            };
            m.sample
                .operators
                .insert("source".into(), vec![src.clone(), src.clone(), src]);
            m
        };
        let p: BTreeMap<String, u32> = [("source".to_string(), 3), ("enrich".to_string(), 1)]
            .into_iter()
            .collect();
        // The capacity after 10 s in which each of 3 subtasks read 1000 records in 1.25 busy
        // seconds (μ = 800/s) and enrich took the 3000 records in 0.1 busy seconds (μ = 30000/s).
        let capacity = |metrics: &dyn Fn(f64, f64, f64) -> EngineMetrics| {
            one_interval(
                &metrics(0.0, 0.0, 0.0),
                &metrics(10.0, 1000.0, 1.25),
                &["source".to_string()],
                &p,
                None,
            )
            .capacity
            .expect("measured")
        };
        // 2400 rec/s in all: the source is the bottleneck.
        let cap = capacity(&kafka);
        assert!((cap - 2400.0).abs() < 1.0, "{cap}");
        // A synthetic source (no partition count) emits its schedule: no capacity of its own.
        let synthetic = |at: f64, read: f64, busy: f64| {
            let mut m = kafka(at, read, busy);
            for x in m.sample.operators.get_mut("source").expect("source") {
                x.source_partitions = None;
            }
            m
        };
        let cap = capacity(&synthetic);
        assert!(cap > 20_000.0, "{cap}");
    }

    #[test]
    fn a_hot_key_caps_capacity_at_the_busiest_subtask() {
        let sources = ["source".to_string()];
        let p2: BTreeMap<String, u32> = [("enrich".to_string(), 2)].into_iter().collect();
        let p4: BTreeMap<String, u32> = [("enrich".to_string(), 4)].into_iter().collect();
        let prev = metrics(
            0.0,
            0.0,
            0.0,
            vec![sub(0.0, 0.0, 0.0, 0.0), sub(0.0, 0.0, 0.0, 0.0)],
            0.0,
        );
        // 1000 source records; subtask 0 takes 900 of them (one key) in 9 busy seconds out of
        // 10, subtask 1 takes 100 in 1: μ = 100/s per subtask, busiest share 0.9, read as
        // (900 − 2·√900) / 1000 = 0.84.
        let cur = metrics(
            10.0,
            1000.0,
            1000.0,
            vec![sub(900.0, 900.0, 9.0, 1.0), sub(100.0, 100.0, 1.0, 9.0)],
            1000.0,
        );
        let s = one_interval(&prev, &cur, &sources, &p2, None);
        // Not p·μ = 200: the busiest subtask saturates at 100 / 0.84 ≈ 119 source records/s.
        let cap = s.capacity.expect("measured");
        assert!((cap - 100.0 / 0.84).abs() < 1e-6, "{cap}");
        assert!((s.utilization["enrich"] - 0.5).abs() < 1e-9);
        assert!((s.busiest_utilization["enrich"] - 0.9).abs() < 1e-9);
        // At another parallelism the spread is unknown until measured: p·μ.
        let mut est = CapacityEstimator::default();
        est.observe(&prev, &cur, &sources);
        assert!((est.capacity(&p4).expect("measured") - 400.0).abs() < 1e-6);
        // Few records: 18 of 20 on one subtask could be chance (18 − 2·√18 ≈ 9.5 of 20): p·μ.
        let few = metrics(
            10.2,
            1020.0,
            1020.0,
            vec![sub(918.0, 918.0, 9.18, 1.02), sub(102.0, 102.0, 1.02, 9.18)],
            1020.0,
        );
        let mut est = CapacityEstimator::default();
        est.observe(&cur, &few, &sources);
        assert_eq!(est.busiest_share("enrich", 2), Some(0.5));
        assert!((est.capacity(&p2).expect("measured") - 200.0).abs() < 1e-6);
        // Counts carry over intervals at one parallelism, older ones decaying, and the hot
        // subtask shows once they are many.
        for _ in 0..19 {
            est.observe(&cur, &few, &sources);
        }
        let sums = &est.records_per_subtask["enrich"];
        let (hot, total) = (sums[0], sums[0] + sums[1]);
        assert!((hot / total - 0.9).abs() < 1e-9);
        let share = est.busiest_share("enrich", 2).expect("measured");
        assert!(
            (share - (hot - 2.0 * hot.sqrt()) / total).abs() < 1e-9 && share > 0.6,
            "{share}"
        );
        // One subtask only: no busiest figure to show beside the mean.
        let one = metrics(0.0, 0.0, 0.0, vec![sub(0.0, 0.0, 0.0, 0.0)], 0.0);
        let one_later = metrics(1.0, 50.0, 50.0, vec![sub(50.0, 50.0, 0.5, 0.5)], 50.0);
        let s = one_interval(&one, &one_later, &sources, &p2, None);
        assert!(s.busiest_utilization.is_empty());
    }

    #[test]
    fn an_even_spread_at_high_parallelism_is_not_read_as_a_hot_subtask() {
        // 43 subtasks, 650 records in an interval spread by key: counts 10..=20 (one 25, as
        // the largest of 43 noisy counts can be). Read as p·μ, not μ / (25 / 650).
        let sources = ["source".to_string()];
        let counts: Vec<f64> = (0..43)
            .map(|k| {
                if k == 7 {
                    25.0
                } else {
                    10.0 + f64::from(k % 11)
                }
            })
            .collect();
        let total: f64 = counts.iter().sum();
        let zero = vec![sub(0.0, 0.0, 0.0, 0.0); 43];
        let later: Vec<SubtaskSample> = counts
            .iter()
            .map(|&c| sub(c, c, c / 100.0, 1.0 - c / 100.0))
            .collect();
        let prev = metrics(0.0, 0.0, 0.0, zero, 0.0);
        let cur = metrics(1.0, total, total, later, total);
        let mut est = CapacityEstimator::default();
        est.observe(&prev, &cur, &sources);
        assert_eq!(est.busiest_share("enrich", 43), Some(1.0 / 43.0));
        let p: BTreeMap<String, u32> = [("enrich".to_string(), 43)].into_iter().collect();
        assert!((est.capacity(&p).expect("measured") - 4300.0).abs() < 1e-6);
    }

    #[test]
    fn no_traffic_means_no_capacity_and_no_p99() {
        let prev = metrics(0.0, 0.0, 0.0, vec![sub(0.0, 0.0, 0.0, 1.0)], 0.0);
        let cur = metrics(1.0, 0.0, 0.0, vec![sub(0.0, 0.0, 0.0, 2.0)], 0.0);
        let s = one_interval(&prev, &cur, &["source".to_string()], &BTreeMap::new(), None);
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
        let s = one_interval(&b, &c, &sources, &p1, None);
        assert_eq!(s.capacity, None);
    }
}
