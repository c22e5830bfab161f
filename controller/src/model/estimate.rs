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
    /// Kafka sources: records a subtask reads per second of busy time (Δrecords_out / Δbusy
    /// over the window, summed over subtasks), the source's μ; `None` for other sources and
    /// when the window has no output or too little busy time.
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

/// Every operator's per-subtask figures of a window in flat storage: what
/// [`OperatorEstimate`]'s per-subtask vectors (`subtask_input_shares`, `subtask_saturation`,
/// `subtask_hottest_key_group_shares`, `subtask_key_group_shares` and
/// `subtask_key_group_point_shares`) hold, the same values, in a few arrays whose allocations
/// a caller reuses from one window to the next (the planner makes a model per decision, with
/// a list per keyed subtask and reading otherwise).
#[derive(Debug, Default)]
pub(crate) struct SubtaskFigures {
    /// Per operator (topological order): where its figures lie in the arrays below.
    ops: Vec<OperatorFigures>,
    /// Operators' subtask input shares, one run per operator.
    input_shares: Vec<f64>,
    /// Operators' subtask saturations, one run per operator.
    saturation: Vec<f64>,
    /// Operators' subtasks' busiest-key-group shares (conservative), one run per operator.
    hottest: Vec<Option<f64>>,
    /// Per listed subtask: the ends of its lists in `conservative` and `point`.
    list_ends: Vec<(u32, u32)>,
    /// Listed subtasks' key groups, conservative readings.
    conservative: Vec<(u32, f64)>,
    /// Listed subtasks' key groups, point readings.
    point: Vec<(u32, f64)>,
}

/// Where one operator's figures lie in a [`SubtaskFigures`]: start and end of each run.
#[derive(Debug, Default, Clone, Copy)]
struct OperatorFigures {
    input_shares: (u32, u32),
    saturation: (u32, u32),
    hottest: (u32, u32),
    /// Its listed subtasks in `list_ends` (none when no subtask lists key groups).
    lists: (u32, u32),
    /// Where its first listed subtask's lists start in `conservative` and `point`.
    lists_from: (u32, u32),
}

/// One operator's key-group lists in a [`SubtaskFigures`] (one reading), by subtask.
#[derive(Debug, Clone, Copy)]
pub(crate) struct KeyGroupLists<'a> {
    /// The reading's entries of every operator (the operator's lists lie within).
    entries: &'a [(u32, f64)],
    /// Per subtask of the operator: the ends of its lists in `entries`, (conservative, point).
    ends: &'a [(u32, u32)],
    /// Where the first subtask's list starts.
    from: u32,
    /// Whether the point readings (`.1` of `ends`) are read.
    point: bool,
}

impl<'a> KeyGroupLists<'a> {
    /// Subtasks with a list (0 when no subtask lists key groups).
    pub(crate) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether no subtask lists key groups.
    pub(crate) fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Subtask `j`'s list; `None` past the last subtask.
    pub(crate) fn get(&self, j: usize) -> Option<&'a [(u32, f64)]> {
        let end = |k: usize| {
            let e = self.ends[k];
            (if self.point { e.1 } else { e.0 }) as usize
        };
        if j >= self.ends.len() {
            return None;
        }
        let start = if j == 0 {
            self.from as usize
        } else {
            end(j - 1)
        };
        Some(&self.entries[start..end(j)])
    }
}

/// A run's bounds as a range.
fn run(r: (u32, u32)) -> std::ops::Range<usize> {
    r.0 as usize..r.1 as usize
}

/// The current length of `v` as a run bound.
fn at<T>(v: &[T]) -> u32 {
    u32::try_from(v.len()).unwrap_or(u32::MAX)
}

impl SubtaskFigures {
    /// Empties every array, keeping the allocations.
    fn clear(&mut self) {
        self.ops.clear();
        self.input_shares.clear();
        self.saturation.clear();
        self.hottest.clear();
        self.list_ends.clear();
        self.conservative.clear();
        self.point.clear();
    }

    /// Operator `i`'s [`OperatorEstimate::subtask_input_shares`].
    pub(crate) fn input_shares(&self, i: usize) -> &[f64] {
        &self.input_shares[run(self.ops[i].input_shares)]
    }

    /// Operator `i`'s [`OperatorEstimate::subtask_saturation`].
    pub(crate) fn saturation(&self, i: usize) -> &[f64] {
        &self.saturation[run(self.ops[i].saturation)]
    }

    /// Operator `i`'s [`OperatorEstimate::subtask_hottest_key_group_shares`].
    pub(crate) fn hottest(&self, i: usize) -> &[Option<f64>] {
        &self.hottest[run(self.ops[i].hottest)]
    }

    /// Operator `i`'s [`OperatorEstimate::subtask_key_group_shares`] (`point` false) or
    /// [`OperatorEstimate::subtask_key_group_point_shares`] (`point` true).
    pub(crate) fn lists(&self, i: usize, point: bool) -> KeyGroupLists<'_> {
        let o = self.ops[i];
        KeyGroupLists {
            entries: if point {
                &self.point
            } else {
                &self.conservative
            },
            ends: &self.list_ends[run(o.lists)],
            from: if point {
                o.lists_from.1
            } else {
                o.lists_from.0
            },
            point,
        }
    }

    /// Writes operator `i`'s per-subtask figures into `e`'s vectors.
    fn fill(&self, i: usize, e: &mut OperatorEstimate) {
        e.subtask_input_shares = self.input_shares(i).to_vec();
        e.subtask_saturation = self.saturation(i).to_vec();
        e.subtask_hottest_key_group_shares = self.hottest(i).to_vec();
        let read = |point: bool| -> Vec<Vec<(u32, f64)>> {
            let l = self.lists(i, point);
            (0..l.len())
                .map(|j| l.get(j).unwrap_or_default().to_vec())
                .collect()
        };
        e.subtask_key_group_shares = read(false);
        e.subtask_key_group_point_shares = read(true);
    }
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

fn subtasks<'a>(
    rows: &[Option<&'a [SubtaskSample]>],
    sample: usize,
    name: &str,
) -> Result<&'a [SubtaskSample], ModelError> {
    rows.get(sample)
        .copied()
        .flatten()
        .ok_or_else(|| ModelError::MissingOperator {
            operator: name.to_string(),
            sample,
        })
}

/// Whether a counter or gauge value passes [`check_value`]: finite and non-negative.
fn valid(value: f64) -> bool {
    // Finite and ≥ 0: +0 up to the largest finite value, or −0.
    let bits = value.to_bits();
    bits < f64::INFINITY.to_bits() || bits == (-0.0f64).to_bits()
}

/// Whether every counter of `s` and its queue length pass [`check_value`].
fn all_valid(s: &SubtaskSample) -> bool {
    valid(s.records_in)
        & valid(s.records_out)
        & valid(s.busy_seconds)
        & valid(s.idle_seconds)
        & valid(s.backpressured_seconds)
        & valid(s.queue_length)
}

/// Whether every counter of `b` is finite and at least its value in `a` (the checks of a
/// valid `a`'s successor that [`estimate_operator`] makes per counter).
fn grown(a: &SubtaskSample, b: &SubtaskSample) -> bool {
    // y ≥ x ≥ −0 (x valid): y is not NaN nor −∞, so y < +∞ is y finite.
    not_below(a, b) & below_infinity(b)
}

/// Whether every counter of `s` is below +∞.
fn below_infinity(s: &SubtaskSample) -> bool {
    (s.records_in < f64::INFINITY)
        & (s.records_out < f64::INFINITY)
        & (s.busy_seconds < f64::INFINITY)
        & (s.idle_seconds < f64::INFINITY)
        & (s.backpressured_seconds < f64::INFINITY)
}

/// Whether no counter of `b` is below (or NaN against) its value in `a`. Along a window whose
/// first sample is valid, this at every step and [`below_infinity`] at the last sample give
/// [`grown`] at every step: the counters only grow, so none is infinite before the last
/// sample unless it is there, and none is negative or NaN after the first.
fn not_below(a: &SubtaskSample, b: &SubtaskSample) -> bool {
    (b.records_in >= a.records_in)
        & (b.records_out >= a.records_out)
        & (b.busy_seconds >= a.busy_seconds)
        & (b.idle_seconds >= a.idle_seconds)
        & (b.backpressured_seconds >= a.backpressured_seconds)
}

/// [`ModelError::MissingSubtask`] when `s` (subtask `subtask` of `name`'s `p` in sample
/// `sample`) is the place of a subtask missing from its scrape.
fn absent(
    name: &str,
    subtask: usize,
    sample: usize,
    p: usize,
    s: &SubtaskSample,
) -> Result<(), ModelError> {
    if s.is_absent() {
        return Err(ModelError::MissingSubtask {
            operator: name.to_string(),
            subtask,
            parallelism: p,
            sample,
        });
    }
    Ok(())
}

fn check_value(
    name: &str,
    subtask: usize,
    sample: usize,
    field: &'static str,
    value: f64,
) -> Result<(), ModelError> {
    if valid(value) {
        Ok(())
    } else {
        Err(ModelError::InvalidValue {
            operator: name.to_string(),
            subtask,
            field,
            sample,
            value,
        })
    }
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
/// where they appear (see [`source_reports`]): their backlog is unknown. Sorted by name.
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

fn counters(s: &SubtaskSample) -> [(&'static str, f64); 5] {
    [
        ("records_in", s.records_in),
        ("records_out", s.records_out),
        ("busy_seconds", s.busy_seconds),
        ("idle_seconds", s.idle_seconds),
        ("backpressured_seconds", s.backpressured_seconds),
    ]
}

/// The first and last rows of an operator's window and the output of its intervals with input
/// (see [`estimate_operator`]), after every check, in the order that names the first problem.
type Checked<'a> = (&'a [SubtaskSample], &'a [SubtaskSample], f64);

/// [`estimate_operator`]'s checks of every sample: presence, subtask count, finite values,
/// monotone counters, the sources' figures; the first failure is the error. Returns what
/// [`plain_window`] returns when that one applies (the same sums in the same order).
fn checked_window<'a>(
    name: &str,
    is_source: bool,
    rows: &[Option<&'a [SubtaskSample]>],
    arrival_scale: Option<f64>,
) -> Result<Checked<'a>, ModelError> {
    let first = subtasks(rows, 0, name)?;
    let (backlog_reported, arrivals_reported) = if is_source {
        source_reports(rows)
    } else {
        (true, true)
    };
    let arr = |k: usize, s: &SubtaskSample| {
        source_arrivals(s, k, first, arrival_scale, arrivals_reported)
    };
    let p = first.len();
    if p == 0 {
        return Err(ModelError::NoSubtasks {
            operator: name.to_string(),
            sample: 0,
        });
    }
    // Validate every sample: presence, subtask count, finite values, monotone counters.
    // Meanwhile sum the output of the intervals with input only: an interval with output but
    // no input (timers, window flushes) must not inflate the selectivity.
    let mut out_with_input = 0.0;
    let mut prev = first;
    for (k, s) in first.iter().enumerate() {
        // Fast path: every figure valid (the checks below then pass; they run, in the same
        // order, only to name what is wrong).
        if !is_source && all_valid(s) {
            continue;
        }
        absent(name, k, 0, p, s)?;
        for (field, v) in counters(s) {
            check_value(name, k, 0, field, v)?;
        }
        check_value(name, k, 0, "queue_length", s.queue_length)?;
        if is_source {
            source_fields(name, k, 0, s, arr(k, s), backlog_reported)?;
        }
    }
    for i in 1..rows.len() {
        let cur = subtasks(rows, i, name)?;
        if cur.len() != p {
            return Err(ModelError::ParallelismChanged {
                operator: name.to_string(),
                first: p,
                other: cur.len(),
                sample: i,
            });
        }
        for (k, (a, b)) in prev.iter().zip(cur).enumerate() {
            // Fast path: `b` valid and no counter reset (`a` was validated before).
            if !is_source && valid(b.queue_length) && grown(a, b) {
                continue;
            }
            absent(name, k, i, p, b)?;
            check_value(name, k, i, "queue_length", b.queue_length)?;
            let arrivals = if is_source {
                let (_, arr_a) = source_fields(name, k, i - 1, a, arr(k, a), backlog_reported)?;
                let (_, arr_b) = source_fields(name, k, i, b, arr(k, b), backlog_reported)?;
                Some(("source_arrivals", arr_a, arr_b))
            } else {
                None
            };
            let pairs = counters(a)
                .into_iter()
                .zip(counters(b))
                .map(|((f, x), (_, y))| (f, x, y))
                .chain(arrivals);
            for (field, x, y) in pairs {
                if y >= x && y.is_finite() {
                    continue; // x was validated: y is finite, non-negative and not a reset
                }
                check_value(name, k, i, field, y)?;
                if y < x {
                    return Err(ModelError::CounterReset {
                        operator: name.to_string(),
                        subtask: k,
                        counter: field,
                        sample: i,
                        from: x,
                        to: y,
                    });
                }
            }
        }
        let d_in_k: f64 = prev
            .iter()
            .zip(cur)
            .map(|(a, b)| b.records_in - a.records_in)
            .sum();
        if d_in_k > 0.0 {
            out_with_input += prev
                .iter()
                .zip(cur)
                .map(|(a, b)| b.records_out - a.records_out)
                .sum::<f64>();
        }
        prev = cur;
    }
    Ok((first, prev, out_with_input))
}

/// The window of a non-source operator whose every sample is present with the first one's
/// subtask count, every figure valid and no counter reset (the usual case), in one pass: the
/// first and last rows and Σ over the intervals with input (Σ Δrecords_in > 0) of their
/// Σ Δrecords_out, each sum in the order [`checked_window`] takes it. `None` when anything is
/// off (then [`checked_window`] names it).
fn plain_window<'a>(rows: &[Option<&'a [SubtaskSample]>]) -> Option<Checked<'a>> {
    let (first, later) = rows.split_first()?;
    let first = (*first)?;
    let p = first.len();
    if p == 0 {
        return None;
    }
    let mut ok = first.iter().fold(true, |ok, s| ok & all_valid(s));
    let mut out_with_input = 0.0;
    let mut prev = first;
    for row in later {
        let cur = (*row)?;
        if cur.len() != p {
            return None;
        }
        // Iterator sums of f64 start at −0.0: so do these, to be the same sums bit for bit.
        let (mut d_in, mut d_out) = (-0.0, -0.0);
        for (a, b) in prev.iter().zip(cur) {
            ok &= valid(b.queue_length) & not_below(a, b);
            d_in += b.records_in - a.records_in;
            d_out += b.records_out - a.records_out;
        }
        if d_in > 0.0 {
            out_with_input += d_out;
        }
        prev = cur;
    }
    // Finite at the last sample: then at every sample (see `not_below`).
    ok &= prev.iter().fold(true, |ok, b| ok & below_infinity(b));
    ok.then_some((first, prev, out_with_input))
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
        let processing_rate = (partitions.is_some() && d_out > 0.0 && d_busy > MIN_BUSY_SECONDS)
            .then(|| d_out / d_busy);
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

/// Appends one operator's per-subtask figures to `figures` from the window's first and last
/// rows of its subtasks (Δrecords_in `d_in` summed over them, over `elapsed` seconds): its
/// [`OperatorEstimate::subtask_input_shares`] (none when `d_in` ≤ 0),
/// [`OperatorEstimate::subtask_saturation`],
/// [`OperatorEstimate::subtask_hottest_key_group_shares`] (none when no subtask reports it) and
/// key-group lists, both readings (none when no subtask lists any).
fn subtask_figures(
    first: &[SubtaskSample],
    last: &[SubtaskSample],
    d_in: f64,
    elapsed: f64,
    figures: &mut SubtaskFigures,
) {
    let mut o = OperatorFigures::default();
    let f = &mut *figures;
    o.input_shares.0 = at(&f.input_shares);
    if d_in > 0.0 {
        f.input_shares.extend(
            first
                .iter()
                .zip(last)
                .map(|(a, b)| (b.records_in - a.records_in) / d_in),
        );
    }
    o.input_shares.1 = at(&f.input_shares);
    o.saturation.0 = at(&f.saturation);
    f.saturation.extend(first.iter().zip(last).map(|(a, b)| {
        let t =
            (b.busy_seconds - a.busy_seconds) + (b.backpressured_seconds - a.backpressured_seconds);
        (t / elapsed).clamp(0.0, 1.0)
    }));
    o.saturation.1 = at(&f.saturation);
    o.hottest.0 = at(&f.hottest);
    if !last.iter().all(|s| s.hottest_key_group_share.is_none()) {
        f.hottest.extend(first.iter().zip(last).map(|(a, b)| {
            conservative_share(b.hottest_key_group_share?, b.records_in - a.records_in)
        }));
    }
    o.hottest.1 = at(&f.hottest);
    o.lists.0 = at(&f.list_ends);
    o.lists_from = (at(&f.conservative), at(&f.point));
    if !last.iter().all(|s| s.key_group_shares.is_empty()) {
        for (a, b) in first.iter().zip(last) {
            let n = b.records_in - a.records_in;
            for &(g, h) in &b.key_group_shares {
                // (Where either reading is `None`, so is the other: the same test.)
                if !(h.is_finite() && h > 0.0 && n > 0.0) {
                    continue;
                }
                if let Some(read) = conservative_share(h, n).filter(|&x| x > 0.0) {
                    f.conservative.push((g, read));
                }
                if let Some(read) = point_share(h, n).filter(|&x| x > 0.0) {
                    f.point.push((g, read));
                }
            }
            f.list_ends.push((at(&f.conservative), at(&f.point)));
        }
    }
    o.lists.1 = at(&f.list_ends);
    f.ops.push(o);
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

/// Standard deviations taken off a record count in [`count_lower_bound`].
pub const COUNT_CONFIDENCE_Z: f64 = 2.0;

/// A lower confidence bound on a record count `n` treated as Poisson: n − z·√n with
/// z = [`COUNT_CONFIDENCE_Z`] (about 97.7 % one-sided), at least 0. Used where a share is read
/// from few records: the busiest key group's ([`OperatorEstimate::subtask_hottest_key_group_shares`])
/// and the busiest subtask's (`stats::CapacityEstimator::busiest_share`), so that the largest
/// of several noisy counts is not read as a hot spot.
pub fn count_lower_bound(n: f64) -> f64 {
    (n - COUNT_CONFIDENCE_Z * n.sqrt()).max(0.0)
}

/// A share `h` of `n` records read conservatively: the count h·n less
/// [`COUNT_CONFIDENCE_Z`]·√(h·n) ([`count_lower_bound`]), over n, within [0, 1]; `None` for
/// no record or a share that is not a positive number.
fn conservative_share(h: f64, n: f64) -> Option<f64> {
    if !(h.is_finite() && h > 0.0 && n > 0.0) {
        return None;
    }
    Some((count_lower_bound(h.min(1.0) * n) / n).min(1.0))
}

/// A share `h` of `n` records as reported, within (0, 1]; `None` where
/// [`conservative_share`] is `None` (no record, or a share that is not a positive number).
fn point_share(h: f64, n: f64) -> Option<f64> {
    (h.is_finite() && h > 0.0 && n > 0.0).then(|| h.min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::testutil::{Synth, job, window};

    const CHAIN: &str = r"
name: chain
operators:
  - { name: src, kind: source, rate: { constant: 100 } }
  - { name: map, kind: map, parallelism: 2 }
  - { name: sink, kind: sink }
edges:
  - { from: src, to: map }
  - { from: map, to: sink }
";

    fn ops() -> Vec<Synth> {
        vec![
            Synth::source("src", 1, 100.0, 0.0),
            Synth::op("map", 2, 100.0, 62.5, 0.5),
            Synth::op("sink", 1, 50.0, 250.0, 0.0),
        ]
    }

    #[test]
    fn valid_is_finite_and_not_negative() {
        for x in [0.0, -0.0, 1.0, f64::MAX, f64::MIN_POSITIVE, 5e-324] {
            assert!(valid(x), "{x}");
        }
        for x in [
            -1.0,
            -5e-324,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
            -f64::NAN,
        ] {
            assert!(!valid(x), "{x}");
        }
    }

    #[test]
    fn key_group_shares_are_read_conservatively_per_group() {
        let spec = job(CHAIN);
        let mut w = window(&ops(), &[10.0, 20.0]);
        // map: 100 rec/s over 2 subtasks, 500 records each in the 10 s window. Subtask 1 lists
        // three key groups; subtask 0 lists none.
        let last = w.last_mut().expect("rows");
        let map = last.operators.get_mut("map").expect("map");
        map[1].key_group_shares = vec![(117, 0.5), (70, 0.002), (64, 0.3)];
        let est = estimate(&spec, &w).expect("estimates");
        let got = &est.operators["map"].subtask_key_group_shares;
        assert_eq!(got.len(), 2);
        assert!(got[0].is_empty());
        // 250 records less 2·√250, over 500; 150 less 2·√150; 1 record less 2 is 0: dropped.
        let want = [
            (117, (250.0 - 2.0 * 250f64.sqrt()) / 500.0),
            (64, (150.0 - 2.0 * 150f64.sqrt()) / 500.0),
        ];
        assert_eq!(got[1].len(), 2, "{got:?}");
        for (g, w) in got[1].iter().zip(want) {
            assert_eq!(g.0, w.0);
            assert!((g.1 - w.1).abs() < 1e-12, "{got:?}");
        }
        // No subtask lists any: empty, and nothing else changes.
        assert!(est.operators["sink"].subtask_key_group_shares.is_empty());
        let plain = estimate(&spec, &window(&ops(), &[10.0, 20.0])).expect("estimates");
        assert!(plain.operators["map"].subtask_key_group_shares.is_empty());
    }

    #[test]
    fn point_shares_and_saturation_per_subtask() {
        let spec = job(CHAIN);
        let mut w = window(&ops(), &[10.0, 20.0]);
        // map: 500 records per subtask in the 10 s window, busy 8 s each (μ 62.5); subtask 1
        // also blocked on its output for 1.5 s and lists two groups.
        let last = w.last_mut().expect("rows");
        let map = last.operators.get_mut("map").expect("map");
        map[1].backpressured_seconds += 1.5;
        map[1].key_group_shares = vec![(117, 0.5), (70, 0.002), (64, f64::NAN)];
        let est = estimate(&spec, &w).expect("estimates");
        let m = &est.operators["map"];
        // As reported (a share that is not a number dropped), not lowered by 2·√(h·n).
        assert_eq!(
            m.subtask_key_group_point_shares,
            vec![vec![], vec![(117, 0.5), (70, 0.002)]]
        );
        assert_eq!(m.subtask_key_group_shares[1].len(), 1);
        let sat = &m.subtask_saturation;
        assert!(
            (sat[0] - 0.8).abs() < 1e-9 && (sat[1] - 0.95).abs() < 1e-9,
            "{sat:?}"
        );
        // Without lists: none either way.
        let plain = estimate(&spec, &window(&ops(), &[10.0, 20.0])).expect("estimates");
        assert!(
            plain.operators["map"]
                .subtask_key_group_point_shares
                .is_empty()
        );
    }

    #[test]
    fn rates_from_synthetic_counters() {
        let spec = job(CHAIN);
        let mut w = window(&ops(), &[10.0, 13.0, 20.0]);
        // Operators the job does not have are ignored, wherever they sort.
        for s in &mut w {
            for extra in ["aaa", "mapx", "zzz"] {
                s.operators
                    .insert(extra.into(), vec![SubtaskSample::default()]);
            }
        }
        let est = estimate(&spec, &w).expect("estimates");
        assert_eq!(est.operators.len(), 3);
        assert_eq!(est.elapsed_seconds, 10.0);
        let map = &est.operators["map"];
        assert_eq!(map.parallelism, 2);
        assert!((map.input_rate - 100.0).abs() < 1e-9);
        assert!((map.output_rate - 50.0).abs() < 1e-9);
        assert!((map.true_processing_rate.expect("known") - 62.5).abs() < 1e-9);
        assert!((map.selectivity - 0.5).abs() < 1e-12);
        // busy 100/62.5 = 1.6 s per second over 2 subtasks = 0.8.
        assert!((map.utilization - 0.8).abs() < 1e-9);
        let src = est.operators["src"].source.expect("source");
        assert!((src.arrival_rate - 100.0).abs() < 1e-9);
        assert_eq!(est.operators["src"].selectivity, 1.0);
    }

    #[test]
    fn a_rise_counts_at_once_a_fall_only_over_the_window() {
        let spec = job(CHAIN);
        // γ = 100 rec/s for 8 s, then 400 rec/s in the last 1 s interval.
        let mut w = window(&ops(), &[0.0, 4.0, 8.0, 9.0]);
        let arrivals = |t: f64| {
            if t <= 8.0 {
                100.0 * t
            } else {
                800.0 + 400.0 * (t - 8.0)
            }
        };
        for s in &mut w {
            let a = arrivals(s.at_seconds);
            s.operators.get_mut("src").expect("src")[0].source_arrivals = Some(a);
        }
        let src = estimate(&spec, &w).expect("estimates").operators["src"]
            .source
            .expect("source");
        assert!((src.window_arrival_rate - 1200.0 / 9.0).abs() < 1e-9);
        assert!((src.recent_arrival_rate - 400.0).abs() < 1e-9);
        assert!((src.arrival_rate - 400.0).abs() < 1e-9);
        // A fall in the last interval does not lower γ below the window average.
        let fall = |t: f64| {
            if t <= 8.0 {
                100.0 * t
            } else {
                800.0 + 10.0 * (t - 8.0)
            }
        };
        for s in &mut w {
            let a = fall(s.at_seconds);
            s.operators.get_mut("src").expect("src")[0].source_arrivals = Some(a);
        }
        let src = estimate(&spec, &w).expect("estimates").operators["src"]
            .source
            .expect("source");
        assert!((src.recent_arrival_rate - 10.0).abs() < 1e-9);
        assert!((src.arrival_rate - 810.0 / 9.0).abs() < 1e-9);
    }

    #[test]
    fn window_errors() {
        let spec = job(CHAIN);
        let w = window(&ops(), &[0.0, 5.0, 10.0]);
        assert_eq!(
            estimate(&spec, &w[..1]),
            Err(ModelError::TooFewSamples { got: 1 })
        );
        let same = window(&ops(), &[5.0, 5.0]);
        assert!(matches!(
            estimate(&spec, &same),
            Err(ModelError::ZeroElapsed { .. })
        ));

        let mut missing = w.clone();
        missing[1].operators.remove("sink");
        assert_eq!(
            estimate(&spec, &missing),
            Err(ModelError::MissingOperator {
                operator: "sink".into(),
                sample: 1
            })
        );

        let mut rescaled = w.clone();
        let extra = rescaled[2].operators["map"][0].clone();
        rescaled[2]
            .operators
            .get_mut("map")
            .expect("map")
            .push(extra);
        assert!(matches!(
            estimate(&spec, &rescaled),
            Err(ModelError::ParallelismChanged { ref operator, first: 2, other: 3, sample: 2 }) if operator == "map"
        ));

        // A reset in the middle sample is caught even though last > first.
        let mut reset = w.clone();
        reset[1].operators.get_mut("map").expect("map")[1].busy_seconds = 0.0;
        reset[0].operators.get_mut("map").expect("map")[1].busy_seconds = 0.5;
        assert!(matches!(
            estimate(&spec, &reset),
            Err(ModelError::CounterReset {
                counter: "busy_seconds",
                subtask: 1,
                sample: 1,
                ..
            })
        ));

        let mut no_backlog = w.clone();
        no_backlog[2].operators.get_mut("src").expect("src")[0].source_backlog = None;
        assert!(matches!(
            estimate(&spec, &no_backlog),
            Err(ModelError::SourceWithoutBacklog {
                missing: "source_backlog",
                sample: 2,
                ..
            })
        ));

        let mut nan = w.clone();
        nan[1].operators.get_mut("sink").expect("sink")[0].records_in = f64::NAN;
        assert!(matches!(
            estimate(&spec, &nan),
            Err(ModelError::InvalidValue {
                field: "records_in",
                ..
            })
        ));
    }

    #[test]
    fn output_without_input_does_not_inflate_selectivity() {
        let spec = job(CHAIN);
        // map takes 100 rec/s and emits half of it while input flows (t = 0..10); then its
        // input stops and a window flush emits 300 records (t = 10..15).
        let mut w = window(&ops(), &[0.0, 5.0, 10.0, 15.0]);
        let m10 = w[2].operators["map"].clone();
        let last = w[3].operators.get_mut("map").expect("map");
        for (sub, before) in last.iter_mut().zip(&m10) {
            sub.records_in = before.records_in;
            sub.busy_seconds = before.busy_seconds;
            sub.records_out = before.records_out + 150.0;
        }
        let map = &estimate(&spec, &w).expect("estimates").operators["map"];
        assert!((map.selectivity - 0.5).abs() < 1e-12, "{}", map.selectivity);
        // The output rate still counts every record emitted: (500 + 300) / 15.
        assert!((map.output_rate - 800.0 / 15.0).abs() < 1e-9);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 200,
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// Rates are counter deltas over the measured elapsed time: any scrape times (irregular
        /// intervals, jitter) give the same rates for counters growing at constant rates.
        #[test]
        fn irregular_scrapes_do_not_bias_rates(
            start in 0.0f64..1e4,
            gaps in proptest::collection::vec(0.01f64..60.0, 1..8),
            gamma in 1.0f64..1e5,
        ) {
            let spec = job(CHAIN);
            let mut times = vec![start];
            for g in gaps {
                let t = times[times.len() - 1] + g;
                times.push(t);
            }
            let o = vec![
                Synth::source("src", 1, gamma, 0.0),
                Synth::op("map", 2, gamma, 3.0 * gamma, 0.5),
                Synth::op("sink", 1, gamma / 2.0, 1e6, 0.0),
            ];
            let est = estimate(&spec, &window(&o, &times)).expect("estimates");
            let map = &est.operators["map"];
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
            proptest::prop_assert!(close(map.input_rate, gamma), "{} vs {}", map.input_rate, gamma);
            proptest::prop_assert!(close(map.true_processing_rate.expect("μ"), 3.0 * gamma));
            proptest::prop_assert!(close(map.selectivity, 0.5));
            let src = est.operators["src"].source.expect("source");
            proptest::prop_assert!(close(src.window_arrival_rate, gamma));
        }

        /// Reading the sources' arrivals through a scale gives the estimate (or the error) of
        /// the window `scale_arrivals` returns, bit for bit: two sources of 1–3 subtasks, some
        /// arrivals missing, reset, NaN or infinite, subtasks added in later samples.
        #[test]
        fn scaled_arrivals_read_in_place_equal_the_scaled_copy(
            factor in proptest::prop_oneof![0.5f64..3.0, proptest::strategy::Just(1.0), proptest::strategy::Just(0.0)],
            subs in proptest::collection::vec(1usize..4, 2),
            extra in proptest::collection::vec(proptest::bool::weighted(0.1), 8),
            edits in proptest::collection::vec((0usize..4, 0usize..2, 0usize..3, 0u8..6), 0..3),
            rates in proptest::collection::vec(1.0f64..1e4, 2),
        ) {
            let spec = job(TWO_SOURCES);
            let o = vec![
                Synth::source("a", subs[0] as u32, rates[0], 3.0),
                Synth::source("b", subs[1] as u32, rates[1], 0.0),
                Synth::op("m", 1, rates[0] + rates[1], 1e5, 1.0),
            ];
            let mut w = window(&o, &[0.0, 5.0, 10.0, 15.0]);
            for (k, s) in w.iter_mut().enumerate().skip(1) {
                for (j, name) in ["a", "b"].into_iter().enumerate() {
                    if extra[2 * (k - 1) + j] {
                        let row = s.operators.get_mut(name).expect("source");
                        let mut sub = row[0].clone();
                        sub.source_arrivals = sub.source_arrivals.map(|a| a * 0.5);
                        row.push(sub);
                    }
                }
            }
            for (k, op, sub, how) in edits {
                let row = w[k].operators.get_mut(["a", "b"][op]).expect("source");
                let n = row.len();
                let a = &mut row[sub % n].source_arrivals;
                *a = match how {
                    0 => None,
                    1 => a.map(|x| x * 0.25),
                    2 => Some(f64::NAN),
                    3 => Some(f64::INFINITY),
                    4 => a.map(|x| x + 7.0),
                    _ => Some(-1.0),
                };
            }
            let topo = Topology::from_spec(&spec).expect("a DAG");
            let copy = crate::model::forecast::scale_arrivals(&w, &spec, factor);
            let in_place = format!("{:?}", estimate_indexed(&topo, &w, Some(factor)));
            let reference = format!("{:?}", estimate_indexed(&topo, &copy, None));
            proptest::prop_assert_eq!(in_place, reference);
        }
    }

    /// A random operator window for [`plain_window`]: `p` subtasks over `s` samples with
    /// counters from random increments (zero increments included, so that intervals without
    /// input occur), then `edits` applied: (sample, subtask, field, kind) with kind 0 NaN,
    /// 1 +∞, 2 −1, 3 a reset to 0, 4 −0.0, 5 a row removed, 6 a subtask added.
    fn random_rows(
        p: usize,
        incs: &[(f64, f64, f64, f64, f64, f64)],
        edits: &[(usize, usize, usize, u8)],
    ) -> Vec<Option<Vec<SubtaskSample>>> {
        let s = incs.len() / p;
        let mut acc = vec![SubtaskSample::default(); p];
        let mut rows: Vec<Option<Vec<SubtaskSample>>> = (0..s)
            .map(|k| {
                for (j, a) in acc.iter_mut().enumerate() {
                    let (i, o, b, d, bp, q) = incs[k * p + j];
                    a.records_in += i;
                    a.records_out += o;
                    a.busy_seconds += b;
                    a.idle_seconds += d;
                    a.backpressured_seconds += bp;
                    a.queue_length = q;
                }
                Some(acc.clone())
            })
            .collect();
        for &(k, j, f, kind) in edits {
            let k = k % s;
            let Some(row) = rows[k].as_mut() else {
                continue;
            };
            match kind {
                5 => {
                    rows[k] = None;
                    continue;
                }
                6 => {
                    row.push(SubtaskSample::default());
                    continue;
                }
                _ => {}
            }
            let sub = &mut row[j % p];
            let x = match f % 6 {
                0 => &mut sub.records_in,
                1 => &mut sub.records_out,
                2 => &mut sub.busy_seconds,
                3 => &mut sub.idle_seconds,
                4 => &mut sub.backpressured_seconds,
                _ => &mut sub.queue_length,
            };
            *x = match kind {
                0 => f64::NAN,
                1 => f64::INFINITY,
                2 => -1.0,
                3 => 0.0,
                _ => -0.0,
            };
        }
        rows
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: 500,
            failure_persistence: None,
            ..proptest::prelude::ProptestConfig::default()
        })]

        /// The one-pass window of a non-source operator applies exactly when the checks pass,
        /// and is then the checked one, bit for bit (else the checks name the problem).
        #[test]
        fn the_plain_window_is_the_checked_window(
            p in 1usize..5,
            s in 2usize..7,
            incs in proptest::collection::vec(
                (
                    proptest::prop_oneof![proptest::strategy::Just(0.0), 0.0f64..1e4],
                    proptest::prop_oneof![proptest::strategy::Just(0.0), 0.0f64..1e4],
                    0.0f64..10.0,
                    0.0f64..10.0,
                    proptest::prop_oneof![proptest::strategy::Just(0.0), 0.0f64..10.0],
                    proptest::prop_oneof![proptest::strategy::Just(-0.0), 0.0f64..100.0],
                ),
                24,
            ),
            edits in proptest::collection::vec((0usize..6, 0usize..4, 0usize..6, 0u8..7), 0..3),
        ) {
            let rows = random_rows(p, &incs[..p * s], &edits);
            let rows: Vec<Option<&[SubtaskSample]>> = rows.iter().map(|r| r.as_deref()).collect();
            let plain = plain_window(&rows);
            let checked = checked_window("op", false, &rows, None);
            match (plain, checked) {
                (Some((f1, l1, o1)), Ok((f2, l2, o2))) => {
                    proptest::prop_assert!(std::ptr::eq(f1, f2) && std::ptr::eq(l1, l2));
                    proptest::prop_assert_eq!(o1.to_bits(), o2.to_bits());
                }
                (None, Err(_)) => {}
                (None, Ok(_)) => proptest::prop_assert!(false, "checked but not plain"),
                (Some(_), Err(e)) => proptest::prop_assert!(false, "plain but {e}"),
            }
        }
    }

    const TWO_SOURCES: &str = r"
name: two
operators:
  - { name: a, kind: source, rate: { constant: 1 } }
  - { name: b, kind: source, rate: { constant: 1 } }
  - { name: m, kind: map }
edges:
  - { from: a, to: m }
  - { from: b, to: m }
";

    #[test]
    fn unknown_rate_and_prior_selectivity() {
        let spec = job(CHAIN);
        let mut o = ops();
        o[1].mu = None; // input but no busy time
        o[2].input_rate = 0.0; // no input at all
        let est = estimate(&spec, &window(&o, &[0.0, 10.0])).expect("estimates");
        let map = &est.operators["map"];
        assert_eq!(map.true_processing_rate, None);
        assert!(!map.selectivity_is_prior);
        let sink = &est.operators["sink"];
        assert_eq!(sink.true_processing_rate, None);
        assert!(sink.selectivity_is_prior);
        assert_eq!(sink.selectivity, 1.0);
    }
}
