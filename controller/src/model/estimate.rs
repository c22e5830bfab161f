//! Rate estimation from a metric window, after DS2 (Kalavri et al., OSDI 2018, §3).
//!
//! DS2 measures each operator's *useful time* (time spent processing, excluding time waiting
//! for input or for output buffers) and derives its *true processing rate*: records processed
//! per second of useful time, i.e. the rate one subtask would sustain if it were never idle and
//! never backpressured. Every rate here is a counter delta between the first and the last sample
//! of the window divided by the measured elapsed time, so irregular scrape intervals do not
//! bias it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use streamscale_engine::spec::JobSpec;

use super::ModelError;
use super::network::Topology;
use super::sample::{MetricSample, SubtaskSample};

mod checks;
mod figures;

use checks::*;
use figures::*;
pub use figures::{COUNT_CONFIDENCE_Z, count_lower_bound};
pub(crate) use figures::{KeyGroupLists, SubtaskFigures};

/// Smallest busy time (seconds, summed over an operator's subtasks, over the window) from which
/// a true processing rate is estimated. Below it the rate is unknown (too little data).
pub const MIN_BUSY_SECONDS: f64 = 1e-6;

/// What the window says about one operator. Rates are operator totals (all subtasks) unless
/// named "per subtask".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OperatorEstimate {
    /// Subtasks reporting in the window (the running parallelism).
    pub parallelism: u32,
    /// Observed input rate λ, records/s: Δrecords_in / Δt.
    pub input_rate: f64,
    /// Observed output rate, records/s: Δrecords_out / Δt.
    pub output_rate: f64,
    /// True processing rate μ per subtask, records/s of useful time (DS2 §3):
    /// Σ Δrecords_in / Σ Δbusy_seconds over the subtasks. `None` when the operator saw no
    /// input or its busy time is below [`MIN_BUSY_SECONDS`] (too little data); sources: `None`.
    pub true_processing_rate: Option<f64>,
    /// Selectivity (records out per record in): Σ Δrecords_out / Σ Δrecords_in over the
    /// scrape intervals in which the operator had input, so that output emitted without input
    /// (timers, window flushes after the input stopped) does not inflate it. Sources: 1 (a
    /// source emits what arrives). 1.0 as a prior when the operator saw no input.
    pub selectivity: f64,
    /// True when `selectivity` is the prior 1.0 because Δrecords_in was 0.
    pub selectivity_is_prior: bool,
    /// Mean utilization of a subtask over the window: Σ Δbusy_seconds / (p · Δt), in 0..=1.
    pub utilization: f64,
    /// Mean share of time a subtask was blocked on a full output channel:
    /// Σ Δbackpressured_seconds / (p · Δt).
    pub backpressured_share: f64,
    /// Records waiting in the input queue(s) at the last sample (sum over subtasks).
    pub queue_length: f64,
    /// Share of the operator's input each subtask took in the window (index = subtask; sums
    /// to 1). Empty when the operator had no input.
    pub subtask_input_shares: Vec<f64>,
    /// Keyed operators: the share of each subtask's input its busiest key group takes (index =
    /// subtask), read conservatively: the last sample's `hottest_key_group_share` h with the
    /// subtask's records in the window n taken as the count, less 2·√(h·n) (a Poisson lower
    /// confidence bound, as the busiest subtask's share in [`crate::stats`]' cap), over n.
    /// `None` for a subtask whose figure is absent or that took no record in the window;
    /// empty when no subtask reports it (then the key groups' loads are estimated as before).
    #[serde(default)]
    pub subtask_hottest_key_group_shares: Vec<Option<f64>>,
    /// Keyed operators: each subtask's busiest key groups as (key group, share of the
    /// subtask's input) (index = subtask), from the last sample's `key_group_shares`, each share
    /// read conservatively as [`Self::subtask_hottest_key_group_shares`] is (the share h of the
    /// subtask's n records in the window, less 2·√(h·n), over n; groups read as 0 dropped).
    /// Empty lists for subtasks without the figure or without a record in the window; empty
    /// when no subtask reports them (then the key groups' loads are estimated from the
    /// hottest share alone, as before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subtask_key_group_shares: Vec<Vec<(u32, f64)>>,
    /// Keyed operators: the same lists as [`Self::subtask_key_group_shares`] read as reported
    /// (the point estimates, not lowered by the confidence bound; groups with a share that is
    /// not a positive number dropped), for judging an operator the planner already holds as a
    /// hot-key bottleneck: a lower bound is for *claiming* a hot key, and a held one is
    /// released on the figure itself (see the planner's `HOT_KEY_RELEASE`). Empty lists and an
    /// empty vector exactly where [`Self::subtask_key_group_shares`] has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subtask_key_group_point_shares: Vec<Vec<(u32, f64)>>,
    /// Share of the window each subtask was saturated, busy or blocked on its output:
    /// (Δbusy_seconds + Δbackpressured_seconds) / Δt, in 0..=1 (index = subtask). A subtask near
    /// 1 processed all it could, so what it processed is a lower bound on what was offered to it
    /// (DS2's useful time and backpressure, §3), not a measure of it: its share of the input
    /// reads low when the others catch up a backlog or when it falls behind.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subtask_saturation: Vec<f64>,
    /// Measured coefficient of variation cs of the per-record service time
    /// ([`super::service_cv`]: the subtasks' batch sums over the window, pooled), at most
    /// [`super::service_cv::MAX_MEASURED_SERVICE_CV`]. `None` for sources, where the samples
    /// lack the sums (the simulator, older engines) or the window holds fewer than
    /// [`super::service_cv::MIN_SERVICE_BATCHES`] effective batches; the planner then uses
    /// the configured cs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_cv: Option<f64>,
    /// Source-only figures (`None` for other operators).
    pub source: Option<SourceEstimate>,
}

/// What the window says about one source.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SourceEstimate {
    /// External arrival rate γ the planner sizes for, records/s: the larger of
    /// [`Self::window_arrival_rate`] and [`Self::recent_arrival_rate`], so that a rise is acted
    /// on within one interval while a fall has to persist through the window (and the
    /// guards' scale-down delay) before capacity is removed.
    pub arrival_rate: f64,
    /// Δsource_arrivals / Δt over the whole window (summed over subtasks). Arrivals count the
    /// records that *should* have been emitted, so the rate is unbiased by backpressure.
    pub window_arrival_rate: f64,
    /// The same over the window's last [`RECENT_INTERVALS`] intervals.
    pub recent_arrival_rate: f64,
    /// Records that should have been emitted but were not, at the last sample (sum over subtasks).
    pub backlog_records: f64,
    /// Kafka sources: the topic's partition count at the last sample (the largest any subtask
    /// reports, `streamscale_source_partitions`); `None` for other sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
    /// Kafka sources: records a subtask reads per second of busy time (Δrecords read / Δbusy
    /// over the window, summed over subtasks; records read are the subtasks' records in where
    /// the backend counts them, as Flink's source operator output, else their records out),
    /// the source's μ; `None` for other sources and when the window has no output or too
    /// little busy time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processing_rate: Option<f64>,
}

/// Number of most recent scrape intervals over which the recent arrival rate is measured.
pub const RECENT_INTERVALS: usize = 1;

/// Estimates for every operator of a job over one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Estimates {
    /// Seconds between the first and the last sample.
    pub elapsed_seconds: f64,
    /// Per operator name.
    pub operators: BTreeMap<String, OperatorEstimate>,
}

/// Estimates rates, true processing rates (DS2 §3 useful time), selectivities and utilizations
/// of every operator of `spec` from a window of samples (oldest first). Only the first and last
/// samples enter the rates; every sample is checked for resets and missing operators.
///
/// # Errors
/// [`ModelError::TooFewSamples`], [`ModelError::ZeroElapsed`], [`ModelError::InvalidTimestamp`],
/// [`ModelError::MissingOperator`], [`ModelError::NoSubtasks`],
/// [`ModelError::ParallelismChanged`], [`ModelError::CounterReset`],
/// [`ModelError::InvalidValue`], [`ModelError::SourceWithoutBacklog`], [`ModelError::Cycle`].
pub fn estimate(spec: &JobSpec, window: &[MetricSample]) -> Result<Estimates, ModelError> {
    let topo = Topology::from_spec(spec)?;
    let (elapsed, ests) = estimate_indexed(&topo, window, None)?;
    Ok(Estimates {
        elapsed_seconds: elapsed,
        operators: topo.names.iter().cloned().zip(ests).collect(),
    })
}

/// Checks the window's timestamps; returns the elapsed seconds between first and last sample.
pub(crate) fn window_elapsed(window: &[MetricSample]) -> Result<f64, ModelError> {
    if window.len() < 2 {
        return Err(ModelError::TooFewSamples { got: window.len() });
    }
    for (i, s) in window.iter().enumerate() {
        if !s.at_seconds.is_finite() {
            return Err(ModelError::InvalidTimestamp {
                sample: i,
                value: s.at_seconds,
            });
        }
    }
    let (first, last) = (&window[0], &window[window.len() - 1]);
    let elapsed = last.at_seconds - first.at_seconds;
    if elapsed.is_nan() || elapsed <= 0.0 {
        return Err(ModelError::ZeroElapsed { seconds: elapsed });
    }
    Ok(elapsed)
}

/// [`estimate`] indexed like `topo.names` (topological order). With `arrival_scale` f, every
/// source subtask's `source_arrivals` a is read as a₀ + f·(a − a₀) (a₀ its value in the first
/// sample, when both are reported): the estimate of the window that
/// [`scale_arrivals`](super::forecast::scale_arrivals) would return, value for value, without
/// copying the window.
pub(crate) fn estimate_indexed(
    topo: &Topology,
    window: &[MetricSample],
    arrival_scale: Option<f64>,
) -> Result<(f64, Vec<OperatorEstimate>), ModelError> {
    let mut figures = SubtaskFigures::default();
    let (elapsed, mut ests) = estimate_flat(topo, window, arrival_scale, &mut figures)?;
    for (i, e) in ests.iter_mut().enumerate() {
        figures.fill(i, e);
    }
    Ok((elapsed, ests))
}

/// [`estimate_indexed`] with the per-subtask vectors of the estimates left empty and their
/// figures written into `figures` instead (cleared first; operator i's at
/// [`SubtaskFigures::input_shares`]`(i)` and so on): the same values, without a vector per
/// operator and list.
pub(crate) fn estimate_flat(
    topo: &Topology,
    window: &[MetricSample],
    arrival_scale: Option<f64>,
    figures: &mut SubtaskFigures,
) -> Result<(f64, Vec<OperatorEstimate>), ModelError> {
    figures.clear();
    let elapsed = window_elapsed(window)?;
    let s = window.len();
    // The recent part of the window: its last RECENT_INTERVALS intervals.
    let recent_from = s.saturating_sub(RECENT_INTERVALS + 1);
    let recent_elapsed = window[s - 1].at_seconds - window[recent_from].at_seconds;
    let recent = (recent_elapsed > 0.0).then_some((recent_from, recent_elapsed));
    // table[op * s + sample]: that operator's subtasks in that sample. Both `topo.index` and
    // each sample's map are sorted by name, so one merge per sample finds every operator.
    // The job's operators are walked once, each sample's in step with them.
    let mut table: Vec<Option<&[SubtaskSample]>> = vec![None; topo.len() * s];
    let mut samples: Vec<_> = window
        .iter()
        .map(|sample| sample.operators.iter().peekable())
        .collect();
    for (name, &i) in &topo.index {
        let row = &mut table[i * s..(i + 1) * s];
        for (theirs, cell) in samples.iter_mut().zip(row) {
            // Equal names first (the common case: one comparison), then skip the sample's
            // operators that come before this one.
            if let Some((_, subs)) = theirs.next_if(|(n, _)| *n == name) {
                *cell = Some(subs.as_slice());
                continue;
            }
            while theirs
                .next_if(|(n, _)| n.as_str() < name.as_str())
                .is_some()
            {}
            if let Some((_, subs)) = theirs.next_if(|(n, _)| *n == name) {
                *cell = Some(subs.as_slice());
            }
        }
    }
    let mut ests = Vec::with_capacity(topo.len());
    for ((name, &is_source), rows) in topo.names.iter().zip(&topo.is_source).zip(table.chunks(s)) {
        ests.push(estimate_operator(
            name,
            is_source,
            rows,
            elapsed,
            recent,
            arrival_scale,
            figures,
        )?);
    }
    Ok((elapsed, ests))
}

/// Subtask `k`'s `source_arrivals` in `s`, read through the arrival scale of
/// [`estimate_indexed`] (`base`: the operator's subtasks in the window's first sample).
fn scaled_arrivals(
    s: &SubtaskSample,
    k: usize,
    base: &[SubtaskSample],
    scale: Option<f64>,
) -> Option<f64> {
    match (
        scale,
        s.source_arrivals,
        base.get(k).and_then(|b| b.source_arrivals),
    ) {
        (Some(f), Some(a), Some(a0)) => Some(a0 + f * (a - a0)),
        _ => s.source_arrivals,
    }
}

/// Which figures a source reports at all in a window: `(backlog, arrivals)`, each true when
/// some subtask of the source has it in some sample. A source that never reports one (its
/// connector exports no such metric) is planned without it: the backlog unknown (never read as
/// 0 records due), the arrivals read from the records it emitted. A figure missing from some
/// scrapes only is an incomplete sample.
fn source_reports(rows: &[Option<&[SubtaskSample]>]) -> (bool, bool) {
    let subtasks = || rows.iter().flatten().flat_map(|r| r.iter());
    (
        subtasks().any(|s| s.source_backlog.is_some()),
        subtasks().any(|s| s.source_arrivals.is_some()),
    )
}

/// The source operators of `spec` that report no `source_backlog` in any sample of `window`
/// where they appear (see `source_reports`): their backlog is unknown. Sorted by name.
pub fn sources_without_backlog(spec: &JobSpec, window: &[MetricSample]) -> Vec<String> {
    spec.operators
        .iter()
        .filter(|o| {
            matches!(
                o.kind,
                streamscale_engine::spec::OperatorKind::Source { .. }
            )
        })
        .filter(|o| {
            let rows: Vec<_> = window
                .iter()
                .map(|w| w.operators.get(&o.name).map(Vec::as_slice))
                .collect();
            rows.iter().any(Option::is_some) && !source_reports(&rows).0
        })
        .map(|o| o.name.clone())
        .collect()
}

/// Subtask `k`'s arrivals in `s` ([`scaled_arrivals`]); for a source that reports no
/// `source_arrivals` in the window (`reported` false), the records it emitted (a lower bound
/// on what arrived, as Flink's autoscaler reads a source without a pending-records metric).
fn source_arrivals(
    s: &SubtaskSample,
    k: usize,
    base: &[SubtaskSample],
    scale: Option<f64>,
    reported: bool,
) -> Option<f64> {
    if reported {
        scaled_arrivals(s, k, base, scale)
    } else {
        Some(s.records_out)
    }
}

fn source_fields(
    name: &str,
    subtask: usize,
    sample: usize,
    s: &SubtaskSample,
    arrivals: Option<f64>,
    backlog_reported: bool,
) -> Result<(f64, f64), ModelError> {
    let missing = |missing| ModelError::SourceWithoutBacklog {
        operator: name.to_string(),
        subtask,
        missing,
        sample,
    };
    if !backlog_reported {
        // Never reported: unknown, not checked (the estimate's backlog is then no figure).
        let arrivals = arrivals.ok_or_else(|| missing("source_arrivals"))?;
        check_value(name, subtask, sample, "source_arrivals", arrivals)?;
        return Ok((0.0, arrivals));
    }
    let backlog = s.source_backlog.ok_or_else(|| missing("source_backlog"))?;
    let arrivals = arrivals.ok_or_else(|| missing("source_arrivals"))?;
    check_value(name, subtask, sample, "source_backlog", backlog)?;
    check_value(name, subtask, sample, "source_arrivals", arrivals)?;
    Ok((backlog, arrivals))
}

fn estimate_operator(
    name: &str,
    is_source: bool,
    rows: &[Option<&[SubtaskSample]>],
    elapsed: f64,
    recent: Option<(usize, f64)>,
    arrival_scale: Option<f64>,
    figures: &mut SubtaskFigures,
) -> Result<OperatorEstimate, ModelError> {
    let plain = if is_source { None } else { plain_window(rows) };
    let (first, last, out_with_input) = match plain {
        Some(w) => w,
        None => checked_window(name, is_source, rows, arrival_scale)?,
    };
    let arrivals_reported = !is_source || source_reports(rows).1;
    let arr = |k: usize, s: &SubtaskSample| {
        source_arrivals(s, k, first, arrival_scale, arrivals_reported)
    };
    let p = first.len();
    // The counters' deltas over the window and the last queue lengths, in one pass (sums
    // from −0.0, as iterator sums: the same values bit for bit).
    let (mut d_in, mut d_out, mut d_busy, mut d_bp, mut queue) = (-0.0, -0.0, -0.0, -0.0, -0.0);
    for (a, b) in first.iter().zip(last) {
        d_in += b.records_in - a.records_in;
        d_out += b.records_out - a.records_out;
        d_busy += b.busy_seconds - a.busy_seconds;
        d_bp += b.backpressured_seconds - a.backpressured_seconds;
        queue += b.queue_length;
    }
    let pf = p as f64;
    subtask_figures(first, last, d_in, elapsed, figures);
    let source = if is_source {
        let arrivals = |row: &[SubtaskSample]| -> f64 {
            row.iter()
                .enumerate()
                .map(|(k, s)| arr(k, s).unwrap_or(0.0))
                .sum()
        };
        let window_rate = (arrivals(last) - arrivals(first)) / elapsed;
        let recent_rate = match recent {
            Some((from, dt)) => (arrivals(last) - arrivals(subtasks(rows, from, name)?)) / dt,
            None => window_rate,
        };
        let backlog = last.iter().map(|s| s.source_backlog.unwrap_or(0.0)).sum();
        let partitions = last
            .iter()
            .filter_map(|s| s.source_partitions)
            .filter(|n| n.is_finite() && *n >= 1.0)
            .fold(None, |m: Option<f64>, n| Some(m.map_or(n, |m| m.max(n))))
            .map(|n| n.min(f64::from(u32::MAX)) as u32);
        // Records read: what the backend counts as the source's input where it does (Flink:
        // the source operator's output, ahead of the operators chained to it), else its output.
        let read = if d_in > 0.0 { d_in } else { d_out };
        let processing_rate = (partitions.is_some() && read > 0.0 && d_busy > MIN_BUSY_SECONDS)
            .then(|| read / d_busy);
        Some(SourceEstimate {
            arrival_rate: window_rate.max(recent_rate),
            window_arrival_rate: window_rate,
            recent_arrival_rate: recent_rate,
            backlog_records: backlog,
            partitions,
            processing_rate,
        })
    } else {
        None
    };
    let true_processing_rate = if !is_source && d_in > 0.0 && d_busy > MIN_BUSY_SECONDS {
        Some(d_in / d_busy)
    } else {
        None
    };
    let (selectivity, selectivity_is_prior) = if is_source {
        (1.0, false)
    } else if d_in > 0.0 {
        (out_with_input / d_in, false)
    } else {
        (1.0, true)
    };
    Ok(OperatorEstimate {
        parallelism: u32::try_from(p).unwrap_or(u32::MAX),
        input_rate: d_in / elapsed,
        output_rate: d_out / elapsed,
        true_processing_rate,
        selectivity,
        selectivity_is_prior,
        utilization: (d_busy / (pf * elapsed)).clamp(0.0, 1.0),
        backpressured_share: (d_bp / (pf * elapsed)).clamp(0.0, 1.0),
        queue_length: queue,
        subtask_input_shares: Vec::new(),
        subtask_hottest_key_group_shares: Vec::new(),
        subtask_key_group_shares: Vec::new(),
        subtask_key_group_point_shares: Vec::new(),
        subtask_saturation: Vec::new(),
        service_cv: if is_source {
            None
        } else {
            measured_service_cv(first, last)
        },
        source,
    })
}

/// [`OperatorEstimate::service_cv`] from a window's first and last rows of one operator's
/// subtasks: each subtask reporting the batch sums at both ends adds its deltas.
fn measured_service_cv(first: &[SubtaskSample], last: &[SubtaskSample]) -> Option<f64> {
    let mut pool = super::service_cv::ServicePool::default();
    for (a, b) in first.iter().zip(last) {
        if let (Some(a), Some(b)) = (&a.service, &b.service) {
            pool.add(&b.since(a));
        }
    }
    pool.cv()
}

#[cfg(test)]
mod tests;
