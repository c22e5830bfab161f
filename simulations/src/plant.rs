//! What a simulated deployment reports: cumulative counters with the engine's meaning, and the
//! per-step statistics the accounting needs. Implemented by the fast fluid mode
//! ([`crate::fluid`]) and the event-level mode ([`crate::des`]).

use std::collections::BTreeMap;

use streamscale_controller::model::{MetricSample, SubtaskSample};

use crate::model::{JobModel, OpKind};

/// Cumulative counters of one operator (summed over its subtasks) since the deployment started,
/// with the engine's metric meaning.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpCounters {
    /// Records taken from the input queue (sources: 0).
    pub records_in: f64,
    /// Records emitted.
    pub records_out: f64,
    /// Seconds spent processing, summed over subtasks (DS2's useful time).
    pub busy_s: f64,
    /// Seconds waiting for input, summed over subtasks.
    pub idle_s: f64,
    /// Seconds blocked on a full downstream queue, summed over subtasks.
    pub backpressured_s: f64,
    /// Gauge: records in the input queue(s).
    pub queue: f64,
    /// Gauge, sources: records that arrived but are not emitted yet.
    pub backlog: f64,
    /// Counter, sources: records that arrived (should have been emitted) since the start.
    pub arrivals: f64,
}

/// Counters of every operator (topological order) at one scrape.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Simulated seconds.
    pub at_s: f64,
    /// Per operator, topological order.
    pub ops: Vec<OpCounters>,
}

/// What happened in one step. Rates in records/s, times in seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepStats {
    /// External arrivals in the step (all sources), records.
    pub arrivals: f64,
    /// p99 end-to-end latency estimate (fast mode) or measurement (event mode), seconds;
    /// `None` when no record reached a sink (event mode).
    pub p99_s: Option<f64>,
    /// The same at the SLO's percentile ([`JobModel::slo_quantile`]; equal to `p99_s` when the
    /// SLO is on p99): what the SLO is graded on. Seconds; `None` as for `p99_s`.
    pub slo_latency_s: Option<f64>,
    /// The p99 as the engine's sink histogram reports it ([`engine_p99_of_samples`],
    /// [`engine_p99_of_cdf`]): the same latencies through the same buckets and interpolation,
    /// to compare with `streamscale run`'s measurements. Event mode: always; fast mode: only
    /// when asked for ([`crate::fluid::FluidPlant::with_engine_p99`]); seconds.
    pub p99_engine_s: Option<f64>,
    /// Records that arrived in the step and will exceed (fast) / reached a sink in the step
    /// having exceeded (event) the SLO.
    pub late: f64,
    /// Sources' backlog at the end of the step, records.
    pub backlog: f64,
    /// Records queued at operators at the end of the step.
    pub queued: f64,
    /// Source-rate capacity of the configuration (records/s at the sources that the tightest
    /// operator can take), records/s.
    pub capacity: f64,
    /// Largest conservation error over the operators at the end of the step, records
    /// (received − processed − queued, and arrived − emitted − backlog at the sources).
    pub conservation_error: f64,
}

/// A simulated deployment of a job.
pub trait Plant {
    /// Advances from simulated second `t` by `dt` seconds; `arrivals[k]` records arrive at
    /// source `model.sources[k]` during the step (see [`crate::runner::Schedule`]).
    fn advance(&mut self, t: f64, dt: f64, arrivals: &[f64]) -> StepStats;
    /// Current counters (since the last (re)start).
    fn snapshot(&self, at_s: f64) -> Snapshot;
    /// Writes the current counters into `out`, reusing its allocation.
    fn snapshot_into(&self, at_s: f64, out: &mut Snapshot) {
        *out = self.snapshot(at_s);
    }
    /// An identifier of the last step's inputs (state at its start, arrivals, length, time
    /// still down, parallelism): steps of one class have the very same counter increments,
    /// gauges and statistics. `None` when the plant cannot tell (event mode). (Fast mode: a
    /// 64-bit hash of the inputs' bits.)
    fn step_class(&self) -> Option<u64> {
        None
    }
    /// Current parallelism per operator.
    fn parallelism(&self) -> &[u32];
    /// Rescales to `p` at `t`: the job is down for `downtime_s` seconds (queued records and the
    /// backlog are kept, as in stop-with-savepoint without drain), then counters restart at 0.
    fn rescale(&mut self, p: &[u32], t: f64, downtime_s: f64);
}

/// Source-rate capacity with `servers` effective servers per operator at source rates
/// `gamma` (records/s, indexed by operator) and mean service times `service` (seconds, 1/μ_i,
/// indexed by operator): the largest factor x with x·λ_i ≤ servers_i μ_i for every operator
/// (traffic equations at `gamma`), times the total source rate; with no input, the capacity at
/// unit source rates. `scratch` is overwritten (length = operators).
pub fn capacity(
    model: &JobModel,
    servers: &[f64],
    service: &[f64],
    gamma: &[f64],
    scratch: &mut [f64],
) -> f64 {
    let total: f64 = gamma.iter().sum();
    let is_source = |i: usize| model.ops[i].kind == OpKind::Source;
    let lambda = scratch;
    for i in 0..model.ops.len() {
        let mut l = if total > 0.0 {
            gamma[i]
        } else if is_source(i) {
            1.0
        } else {
            0.0
        };
        for &u in &model.ops[i].inputs {
            l += lambda[u] * model.selectivity(u, lambda[u]);
        }
        lambda[i] = l;
    }
    let scale = if total > 0.0 {
        total
    } else {
        model.sources.len().max(1) as f64
    };
    let mut x = f64::INFINITY;
    for i in 0..model.ops.len() {
        if lambda[i] > 0.0 && !is_source(i) {
            x = x.min(servers[i] / service[i] / lambda[i]);
        }
    }
    x * scale
}

/// Share of each operator's input per subtask at parallelism `p` ([`JobModel::subtask_shares`]),
/// indexed like the operators.
pub fn subtask_shares(model: &JobModel, p: &[u32]) -> Vec<Vec<f64>> {
    (0..model.ops.len())
        .map(|i| model.subtask_shares(i, p[i]))
        .collect()
}

/// One subtask's sample from its operator's counters `c`: records, busy time, queue and source
/// figures split by the subtask's load share `w`, idle and backpressured time evenly over the
/// operator's `n` subtasks (they are per-subtask times, not loads).
fn subtask_sample(c: &OpCounters, w: f64, n: f64, is_source: bool) -> SubtaskSample {
    SubtaskSample {
        records_in: c.records_in * w,
        records_out: c.records_out * w,
        busy_seconds: c.busy_s * w,
        idle_seconds: c.idle_s / n,
        backpressured_seconds: c.backpressured_s / n,
        queue_length: c.queue * w,
        source_backlog: is_source.then_some(c.backlog * w),
        source_arrivals: is_source.then_some(c.arrivals * w),
        source_partitions: None,
        hottest_key_group_share: None,
        key_group_shares: Vec::new(),
        service: None,
    }
}

/// Converts one snapshot into the planner's metric sample: each operator's counters split over
/// its subtasks by their input `shares` ([`subtask_shares`]); idle and backpressured time split
/// evenly (they are per-subtask clocks).
pub fn metric_sample(model: &JobModel, shares: &[Vec<f64>], s: &Snapshot) -> MetricSample {
    MetricSample {
        at_seconds: s.at_s,
        operators: model
            .ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                let c = &s.ops[i];
                let is_source = op.kind == OpKind::Source;
                let n = shares[i].len() as f64;
                let subs = shares[i]
                    .iter()
                    .map(|&w| subtask_sample(c, w, n, is_source))
                    .collect();
                (op.name.clone(), subs)
            })
            .collect::<BTreeMap<_, _>>(),
    }
}

/// [`metric_sample`] written into `out`, reusing its operators' subtask vectors when it holds
/// the same operators (by name, in the same order) with the same numbers of subtasks (no
/// allocation then); rebuilt otherwise.
pub fn metric_sample_into(
    model: &JobModel,
    shares: &[Vec<f64>],
    s: &Snapshot,
    out: &mut MetricSample,
) {
    let same_shape = out.operators.len() == model.ops.len()
        && model.ops.iter().zip(shares).all(|(op, sh)| {
            out.operators
                .get(&op.name)
                .is_some_and(|subs| subs.len() == sh.len())
        });
    if !same_shape {
        *out = metric_sample(model, shares, s);
        return;
    }
    out.at_seconds = s.at_s;
    for (i, op) in model.ops.iter().enumerate() {
        let Some(subs) = out.operators.get_mut(&op.name) else {
            continue;
        };
        let c = &s.ops[i];
        let is_source = op.kind == OpKind::Source;
        let n = shares[i].len() as f64;
        for (sub, &w) in subs.iter_mut().zip(&shares[i]) {
            *sub = subtask_sample(c, w, n, is_source);
        }
    }
}

/// Converts a window of snapshots into the planner's metric samples ([`metric_sample`] for
/// each, at parallelism `p`).
pub fn metric_samples(model: &JobModel, p: &[u32], window: &[Snapshot]) -> Vec<MetricSample> {
    let shares = subtask_shares(model, p);
    window
        .iter()
        .map(|s| metric_sample(model, &shares, s))
        .collect()
}

/// The p99 that the engine reports for these latencies (seconds): the observations counted
/// into the sinks' histogram buckets ([`SINK_LATENCY_BUCKETS`], then +∞) and the quantile read
/// back by the controller's linear interpolation within the bucket
/// ([`LatencyHistogram::quantile_since`](streamscale_controller::scrape::LatencyHistogram::quantile_since)), as `streamscale run` reads it at each scrape.
/// `None` for no observations. Always the p99, whatever the SLO's percentile: it backs the
/// `p99_engine_s` column, which compares with `streamscale run`'s `p99_s` column (p99 there
/// too; the SLO percentile's own latency is graded on the simulator's exact quantile).
///
/// [`SINK_LATENCY_BUCKETS`]: streamscale_engine::metrics::SINK_LATENCY_BUCKETS
pub fn engine_p99_of_samples(latencies: &[f64]) -> Option<f64> {
    use streamscale_engine::metrics::SINK_LATENCY_BUCKETS;
    let mut cum = [0.0; SINK_LATENCY_BUCKETS.len() + 1];
    for &l in latencies {
        let b = SINK_LATENCY_BUCKETS.partition_point(|&le| le < l);
        cum[b] += 1.0;
    }
    for b in 1..cum.len() {
        cum[b] += cum[b - 1];
    }
    engine_quantile(&cum)
}

/// [`engine_p99_of_samples`] for a latency distribution given by its CDF `cdf(x)` = P(latency
/// ≤ x) (x in seconds): the histogram's expected cumulative bucket counts are the CDF at the
/// bucket bounds, read back by the same interpolation. `None` when `cdf` is never positive.
pub fn engine_p99_of_cdf(cdf: impl Fn(f64) -> f64) -> Option<f64> {
    use streamscale_engine::metrics::SINK_LATENCY_BUCKETS;
    let mut cum = [1.0; SINK_LATENCY_BUCKETS.len() + 1];
    let mut prev: f64 = 0.0;
    for (c, &le) in cum.iter_mut().zip(&SINK_LATENCY_BUCKETS) {
        // A CDF never decreases; numerical noise must not make a bucket count negative.
        prev = prev.max(cdf(le).clamp(0.0, 1.0));
        *c = prev;
    }
    engine_quantile(&cum)
}

/// The controller's 0.99 quantile of cumulative bucket counts `cum` over
/// [`SINK_LATENCY_BUCKETS`](streamscale_engine::metrics::SINK_LATENCY_BUCKETS) and +∞.
fn engine_quantile(cum: &[f64]) -> Option<f64> {
    use streamscale_controller::scrape::LatencyHistogram;
    use streamscale_engine::metrics::SINK_LATENCY_BUCKETS;
    let count = cum.last().copied().unwrap_or(0.0);
    let h = LatencyHistogram {
        buckets: SINK_LATENCY_BUCKETS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(cum.iter().copied())
            .collect(),
        sum_seconds: 0.0,
        count,
    };
    h.quantile_since(None, 0.99)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Seven records in one scrape interval, all between 10 and 15 ms: the engine's histogram
    /// puts rank 6.93 of 7 near the top of the 10–15 ms bucket (14.95 ms), whatever the exact
    /// values; the simulator reports the same.
    #[test]
    fn engine_p99_reads_through_the_buckets() {
        let lat = [0.011, 0.012, 0.012, 0.013, 0.014, 0.0145, 0.015];
        let p = engine_p99_of_samples(&lat).unwrap();
        assert!((p - (0.01 + 0.005 * 6.93 / 7.0)).abs() < 1e-12, "{p}");
        assert_eq!(engine_p99_of_samples(&[]), None);
        // Above the largest bound: the largest finite bound, as the controller reads it.
        assert_eq!(engine_p99_of_samples(&[500.0; 10]), Some(120.0));
    }

    /// From a CDF: uniform latency on [0, 0.1 s] has F(0.07) = 0.7 and F(0.1) = 1, so the
    /// 0.99 rank falls in the 70–100 ms bucket at 0.07 + 0.03 × 0.29 / 0.3.
    #[test]
    fn engine_p99_of_a_cdf() {
        let p = engine_p99_of_cdf(|x| (x / 0.1).clamp(0.0, 1.0)).unwrap();
        assert!((p - (0.07 + 0.03 * 0.29 / 0.3)).abs() < 1e-12, "{p}");
        // Samples drawn from the same law agree with it.
        let lat: Vec<f64> = (0..100_000).map(|k| 0.1 * (k as f64 + 0.5) / 1e5).collect();
        let q = engine_p99_of_samples(&lat).unwrap();
        assert!((p - q).abs() < 1e-4, "{p} vs {q}");
    }
}
