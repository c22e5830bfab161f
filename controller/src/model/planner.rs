//! The planner: every operator's parallelism decided in one call.
//!
//! 1. **Sizing (DS2, Kalavri et al., OSDI 2018 §3)**: the target rate of each source is its
//!    arrival rate γ plus the catch-up rate backlog / catch-up seconds; the traffic equations of
//!    the open Jackson network propagate it (edge gain = upstream selectivity); each non-source
//!    operator gets p = ⌈λ_target / (ρ_target · μ)⌉ subtasks, with μ its true processing rate per
//!    subtask, clamped to its scaling bounds and the job's maxParallelism.
//! 2. **Latency (greedy marginal allocation, DRS ICDCS'15 / Lohrmann et al. ICDCS'15)**: at the
//!    steady arrival rates γ (no catch-up), while the predicted end-to-end latency (the slowest
//!    path's sum of sojourn times) exceeds the SLO, one subtask is added to the operator on the
//!    slowest path whose increment cuts its sojourn time the most. Sojourn times are convex and
//!    decreasing in p, so this greedy allocation is the cheapest one that meets the SLO. The
//!    steps are taken in rounds on one path at a time, and subtasks the SLO does not need are
//!    given back at the end (see `planner/allocate.rs`: within max(2, 1 %) of the one-step greedy's
//!    subtasks, with the same SLO verdict, in its proptest).
//!
//! Sources are never rescaled (as in DS2). Operators whose true processing rate is unknown
//! (too little busy time in the window) keep their parallelism.

use std::borrow::{Borrow, Cow};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use streamscale_engine::spec::{AutoscalerSpec, JobSpec, UnattainableSlo};

use super::ModelError;
use super::estimate::{KeyGroupLists, OperatorEstimate, SubtaskFigures, estimate_flat};
use super::float_text::{Fixed, Short, cat};
use super::learn::{Observed, ScalabilityTracker};
use super::network::Topology;
use super::queueing::{
    QueueKind, TailBudget, TailNode, operator_sojourn_time, sojourn_quantile_bound_in,
    sojourn_quantile_upper_in,
};
use super::sample::MetricSample;
use allocate::{Allocated, LatencyState};
use memo::NanMemo;
use streamscale_engine::keygroup::key_group_range;
use streamscale_engine::spec::OperatorKind;
use streamscale_engine::time::window::WindowSpec;

mod allocate;
mod decision;
#[cfg(test)]
mod failure_cases;
mod graph;
mod key_groups;
mod memo;
mod settings;

pub(crate) use graph::JobGraph;
use graph::*;
use key_groups::*;
pub use key_groups::{key_group_load, key_group_load_with_hot};

pub use decision::{Decision, OperatorPlan, SourcePlan};
pub use settings::PlannerSettings;
pub(crate) use settings::Resolved;

/// Plans the parallelism of every operator of `spec` from a metric window (oldest first):
/// DS2 sizing at the target utilization for the sources' arrival plus catch-up rate, then
/// greedy marginal allocation until the predicted latency meets the SLO (see the module docs).
///
/// # Errors
/// Any [`ModelError`] from estimating the window ([`super::estimate()`]), a cycle in the graph,
/// or [`ModelError::InvalidSettings`].
pub fn plan(
    spec: &JobSpec,
    window: &[MetricSample],
    settings: &PlannerSettings,
) -> Result<Decision, ModelError> {
    Ok(Model::new(spec, window, settings)?.plan())
}

/// How often a windowed operator emits and whether it emits in bursts: (seconds, bursty).
/// Tumbling windows emit every `sizeMs`, sliding windows every `slideMs` (all keys' windows
/// close together: a burst at each boundary); session windows close per key `gapMs` after its
/// last record (spread out, not a burst). The period sizes the burst a window's downstream
/// receives; it is not part of a record's latency: a window result's latency counts from the
/// window's end (Flink's convention, and the engine's sink histogram: no parallelism can
/// shorten the wait for a window to close, the session gap included), see [`watermark_waits`]
/// for what a window adds beyond its end. `None` for operators that are not windowed.
fn window_period(kind: &OperatorKind) -> Option<(f64, bool)> {
    let secs = |ms: u64| ms as f64 / 1000.0;
    match kind {
        OperatorKind::Window { size_ms, .. } => Some((secs(*size_ms), true)),
        OperatorKind::EventWindow { window, .. }
        | OperatorKind::Join {
            window: Some(window),
        } => Some(match *window {
            WindowSpec::Tumbling { size_ms } => (secs(size_ms), true),
            WindowSpec::Sliding { slide_ms, .. } => (secs(slide_ms), true),
            WindowSpec::Session { gap_ms } => (secs(gap_ms), false),
        }),
        _ => None,
    }
}

/// Fewest input records (over the metric window, all subtasks) from which an operator's
/// selectivity above 1 drives the plan: the input count's relative standard error is 1/√n (a
/// Poisson count), 10 % at 100 records, the scale-up tolerance band ([`SCALE_UP_TOLERANCE`]).
/// Below it a ratio out/in above 1 is noise that the traffic equations multiply into the
/// downstream's target rate (2 records in, 1000 out read as selectivity 500), and the
/// operator's output is taken as the fixed rate it was measured at ([`OutputModel::Fixed`]).
/// A selectivity up to 1 can at most pass the operator's own rate on, and stands.
pub const MIN_SELECTIVITY_RECORDS: f64 = 100.0;

/// How an operator's output rate follows its input rate in the traffic equations.
#[derive(Debug, Clone, Copy, PartialEq)]
enum OutputModel {
    /// Output = selectivity × input (DS2's edge gain), records out per record in.
    Proportional(f64),
    /// Output at a fixed rate (records/s), whatever the input: a selectivity above 1 rests
    /// on fewer than [`MIN_SELECTIVITY_RECORDS`] input records (a trickle of input with a
    /// burst of output from a window or timers), so the measured output rate is what is known.
    Fixed(f64),
    /// A window that fires once per period emitted nothing in a metric window shorter than
    /// that period (seconds): its output rate is unknown, not 0, and no operator downstream
    /// of it is planned from this window ("a window of silence").
    Silent(f64),
}

/// The output of a window that emits in bursts ([`window_period`]), read over its period
/// rather than over the metric window: per scrape interval the operator's Σ Δrecords_in and
/// Σ Δrecords_out. `None` when the output is not bursty at the scrape resolution (every
/// interval with input has output), or an operator's row is missing (then the window-wide
/// selectivity stands). Otherwise `Some(Some(rate))`: the output in the window O over its B
/// bursts (maximal runs of intervals with output), one per firing, O / (B · period) records/s
/// (a window shorter than the period holds at most one firing, and O over the window's span
/// would overstate the rate by period / span); `Some(None)` when no burst is in a window
/// shorter than the period (silence). A window spanning a period or more without output
/// reads as rate 0 (`Some(Some(0))`).
fn burst_output_rate(
    name: &str,
    window: &[MetricSample],
    period: f64,
    span: f64,
) -> Option<Option<f64>> {
    let totals = |s: &MetricSample| {
        s.operators.get(name).map(|subs| {
            subs.iter().fold((0.0, 0.0), |(i, o), x| {
                (i + x.records_in, o + x.records_out)
            })
        })
    };
    let mut prev = totals(window.first()?)?;
    let (mut out, mut bursts, mut silent, mut in_burst) = (0.0, 0u32, false, false);
    for s in &window[1..] {
        let cur = totals(s)?;
        let (d_in, d_out) = (cur.0 - prev.0, cur.1 - prev.1);
        prev = cur;
        if d_out > 0.0 {
            out += d_out;
            bursts += u32::from(!in_burst);
            in_burst = true;
        } else {
            silent |= d_in > 0.0;
            in_burst = false;
        }
    }
    if !silent || period.is_nan() || period <= 0.0 {
        return None;
    }
    Some(match bursts {
        0 if span < period => None,
        0 => Some(0.0),
        b => Some(out / (f64::from(b) * period)),
    })
}

/// Operator `e`'s [`OutputModel`] from the metric `window` (spanning `span` seconds);
/// `window_kind` is its [`window_period`], `name` its name in the samples. Sources and
/// operators without input keep their estimate's selectivity (1 and the prior 1).
fn output_model(
    e: &OperatorEstimate,
    window_kind: Option<(f64, bool)>,
    name: &str,
    window: &[MetricSample],
    span: f64,
) -> OutputModel {
    if e.source.is_some() {
        return OutputModel::Proportional(e.selectivity);
    }
    let records_in = e.input_rate * span;
    let burst = match window_kind {
        Some((period, true)) => burst_output_rate(name, window, period, span),
        _ => None,
    };
    let out_rate = match burst {
        Some(None) => return OutputModel::Silent(window_kind.map_or(0.0, |(p, _)| p)),
        Some(Some(rate)) => Some(rate),
        None => None,
    };
    let fixed = out_rate.unwrap_or(e.output_rate);
    if records_in > 0.0 && records_in < MIN_SELECTIVITY_RECORDS && fixed > e.input_rate {
        return OutputModel::Fixed(fixed);
    }
    match out_rate {
        Some(rate) if e.input_rate > 0.0 => OutputModel::Proportional(rate / e.input_rate),
        _ => OutputModel::Proportional(e.selectivity),
    }
}

/// The traffic equations' inputs from every operator's [`OutputModel`], indexed like the
/// topology: edge gains (selectivity; 0 for a fixed or unknown output), the fixed output
/// rate each operator injects into every one of its outputs (records/s), and whether an
/// operator's arrival rate is unknown (downstream of a silent window, feedback edges not
/// followed).
#[derive(Debug, Clone, PartialEq)]
struct Flow {
    gain: Vec<f64>,
    fixed: Vec<f64>,
    inject: Vec<f64>,
    unknown: Vec<bool>,
    /// The silent window upstream of each operator whose rate is unknown (its index).
    silent_from: Vec<Option<usize>>,
}

impl Flow {
    fn of(topo: &Topology, outputs: &[OutputModel]) -> Flow {
        let n = topo.len();
        let mut f = Flow {
            gain: vec![0.0; n],
            fixed: vec![0.0; n],
            inject: vec![0.0; n],
            unknown: vec![false; n],
            silent_from: vec![None; n],
        };
        for (i, m) in outputs.iter().enumerate() {
            match *m {
                OutputModel::Proportional(g) => f.gain[i] = g,
                OutputModel::Fixed(rate) => f.fixed[i] = rate,
                OutputModel::Silent(_) => f.silent_from[i] = Some(i),
            }
        }
        for i in 0..n {
            for &u in topo.inputs[i].iter().filter(|&&u| u < i) {
                f.inject[i] += f.fixed[u];
                if let Some(w) = f.silent_from[u].filter(|_| !f.unknown[i]) {
                    f.unknown[i] = true;
                    f.silent_from[i] = f.silent_from[i].or(Some(w));
                }
            }
        }
        f
    }

    /// `gamma` (external arrivals per operator, records/s) plus the fixed outputs injected
    /// (borrowed as it is when no operator has a fixed output, the usual case).
    fn injected<'a>(&self, gamma: &'a [f64]) -> Cow<'a, [f64]> {
        if self.inject.iter().all(|&x| x == 0.0) {
            return Cow::Borrowed(gamma);
        }
        Cow::Owned(gamma.iter().zip(&self.inject).map(|(g, x)| g + x).collect())
    }

    /// Operator `i`'s output rate at input rate `lambda` (records/s).
    fn out_rate(&self, i: usize, lambda: f64) -> f64 {
        self.gain[i] * lambda + self.fixed[i]
    }
}

/// Seconds by which each operator's window results trail their windows' ends, indexed like
/// `topo` (empty when the job has no event-time windowed operator): an event-time window
/// (`eventWindow`, a windowed `join`) fires when the watermark passes its end, and a Nexmark
/// source's watermark trails the largest event time it emitted by its `maxOutOfOrdernessMs`
/// bound B (`engine/src/nexmark/source.rs`), so a window ending at event time e fires once the
/// source has emitted event time e + B: B·`eventRate`/1000 events later, B·`eventRate`/(1000·γ)
/// seconds at the source's measured rate γ (records/s; B of event time when γ is 0). The
/// input watermark is the minimum over the upstream sources, so the slowest one counts. No
/// allowed lateness is added: the engine's event-time windows have none (late records are
/// dropped). Processing-time windows fire at their end: 0. `gamma` is indexed like `topo`.
fn watermark_waits(topo: &Topology, spec: &JobSpec, gamma: &[f64]) -> Vec<f64> {
    let event_time = |k: &OperatorKind| {
        matches!(
            k,
            OperatorKind::EventWindow { .. } | OperatorKind::Join { window: Some(_) }
        )
    };
    if !spec.operators.iter().any(|o| event_time(&o.kind)) {
        return Vec::new();
    }
    let n = topo.len();
    let mut nexmark = vec![None; n];
    for o in &spec.operators {
        if let (
            Some(&i),
            OperatorKind::Source {
                nexmark: Some(x), ..
            },
        ) = (topo.index.get(&o.name), &o.kind)
        {
            let bound = x.max_out_of_orderness_ms as f64 / 1000.0;
            let g = gamma.get(i).copied().unwrap_or(0.0);
            nexmark[i] = Some(if g > 0.0 {
                bound * x.event_rate as f64 / g
            } else {
                bound
            });
        }
    }
    let mut waits = vec![0.0; n];
    for o in spec.operators.iter().filter(|o| event_time(&o.kind)) {
        let Some(&i) = topo.index.get(&o.name) else {
            continue;
        };
        // The Nexmark sources upstream of `i` (loops included: each operator visited once).
        let (mut seen, mut stack, mut wait) = (vec![false; n], vec![i], 0.0_f64);
        while let Some(j) = stack.pop() {
            if std::mem::replace(&mut seen[j], true) {
                continue;
            }
            if let Some(w) = nexmark[j] {
                wait = wait.max(w);
            }
            stack.extend(topo.inputs[j].iter().copied().filter(|&u| !seen[u]));
        }
        waits[i] = wait;
    }
    waits
}

/// Everything the planner derives from a spec and a window, indexed in topological order.
pub(crate) struct Model {
    graph: Arc<JobGraph>,
    /// The window's estimates, their per-subtask vectors empty: those figures are in
    /// `figures`.
    est: Vec<OperatorEstimate>,
    /// The window's per-subtask figures by operator ([`estimate_flat`]).
    figures: SubtaskFigures,
    s: Resolved,
    gamma: Vec<f64>,
    gamma_target: Vec<f64>,
    lambda_target: Vec<f64>,
    /// `gamma_target` and `lambda_target` without the rescale's own backlog (downtime × γ):
    /// what a plan that keeps the parallelism (no rescale, no downtime) is sized for.
    gamma_target_hold: Vec<f64>,
    lambda_target_hold: Vec<f64>,
    /// Whether the targets in use include the rescale's downtime backlog.
    with_downtime: bool,
    lambda_steady: Vec<f64>,
    /// Steady arrival rate that does not come in window bursts (λ_steady minus the output of
    /// bursty windowed upstream operators), records/s.
    lambda_smooth: Vec<f64>,
    /// Records arriving at once at each window boundary from bursty windowed upstream
    /// operators: Σ over them of (their output rate × their period), records.
    burst_in: Vec<f64>,
    /// Seconds by which each operator's window results trail their windows' ends (event-time
    /// windows' watermark delay, [`watermark_waits`]); empty without event-time windows.
    wait: Vec<f64>,
    /// Per-operator tail budget of the union bound, (1 − percentile) / depth, with its
    /// logarithms for the quantile bounds.
    budget: TailBudget,
    spec_parallelism: Vec<u32>,
    /// Keyed operators: their slot in the flat key-group arrays below (`None` for shared-queue
    /// operators). Slot s owns `kg_loads[s·L..(s+1)·L]`, `kg_prefixes[s·(L+1)..(s+1)·(L+1)]`
    /// (L = [`Model::kg_len`]) and `share_memo[s·(K+1)..(s+1)·(K+1)]` (K key groups): one
    /// allocation each per model instead of three per keyed operator.
    kg_slot: Vec<Option<usize>>,
    /// Keyed operators' estimated share of the input per key group (each sums to 1), by slot.
    kg_loads: Vec<f64>,
    /// Prefix sums of each slot's `kg_loads` (L + 1 entries per slot), so a key-group range's
    /// load is one subtraction.
    kg_prefixes: Vec<f64>,
    /// Keyed operators: [`Model::max_share`] by parallelism (entry q of the slot's K + 1, NaN =
    /// not computed yet); a pure memo of a function of the model, it changes no result.
    share_memo: std::cell::RefCell<NanMemo>,
    /// Keyed operators: the first run [a, b) of key groups with the largest load (see
    /// [`Model::share_reaches`]); (0, 0) for shared-queue operators.
    hot_run: Vec<(u32, u32)>,
    /// Keyed operators: the largest key-group load (0 when none is positive); 0 for
    /// shared-queue operators. Made once per model for every sizing.
    hottest: Vec<f64>,
    /// Keyed operators held as a hot-key bottleneck by the window itself: their hottest key
    /// group already has a subtask to itself ([`isolated_groups`]), so the key-group loads
    /// are the point readings and the group is released only under the
    /// [`HOT_KEY_RELEASE`] band ([`Model::hot_limit`]). False elsewhere.
    hot_held: Vec<bool>,
    /// [`Model::tail`] by (operator, parallelism): a pure memo (tail depends on the model
    /// and the learned factors only, and is cleared when those change); it changes no result.
    /// Operator i's row is `[tail_at[i], tail_at[i + 1])` ([`JobGraph::tail_at`]), entry p
    /// its tail at parallelism p, NaN = not computed yet (a NaN tail is recomputed, which gives
    /// the same NaN); parallelisms beyond the row are not kept. One allocation, reused from
    /// the graph's previous model ([`ModelBuffers`]).
    tail_memo: std::cell::RefCell<NanMemo>,
    /// Learned scalability factor per operator (1 = linear scaling), applied to μ at
    /// parallelisms above the current one (see [`super::learn`]).
    factor: Vec<f64>,
    /// Whether the targets included the rescale's downtime backlog when [`Model::decision`]
    /// last assembled a decision (`None`: none yet): while they still do, that decision's
    /// predictions for an operator at an unchanged parallelism are what [`Model::refresh`]
    /// would recompute.
    decided_with: std::cell::Cell<Option<bool>>,
    /// Keyed operators: their last sizing search (see [`Model::size_keyed`]), `None` before
    /// the first; sizings at rising rates (without, then with the rescale's downtime backlog)
    /// start from there.
    keyed_searches: std::cell::RefCell<Vec<Option<KeyedSearch>>>,
    /// Seconds from the window's first to its last sample.
    elapsed: f64,
    /// Operators flagged for ineffective scaling: the parallelism the scale-up that did not
    /// raise their capacity started from ([`super::learn::Ineffective::from`]), the smallest
    /// measured to give that capacity; 0 when not flagged.
    flat_from: Vec<u32>,
    /// How each operator's output follows its input ([`output_model`]).
    outputs: Vec<OutputModel>,
    /// The traffic equations' gains and fixed outputs, and the operators whose rate is
    /// unknown (downstream of a silent window: planned as if μ were unknown, kept).
    flow: Flow,
    /// Operators flagged for ineffective scaling: never sized above their current parallelism,
    /// and their sojourn is left out of the latency allocation so that no other operator is
    /// scaled to make up for them.
    frozen: Vec<bool>,
}

impl Drop for Model {
    /// Puts the model's largest arrays back into its graph's [`BufferPool`].
    fn drop(&mut self) {
        self.graph.buffers.put(ModelBuffers {
            kg_loads: std::mem::take(&mut self.kg_loads),
            kg_prefixes: std::mem::take(&mut self.kg_prefixes),
            share_memo: std::mem::take(self.share_memo.get_mut()),
            tail_memo: std::mem::take(self.tail_memo.get_mut()),
            figures: std::mem::take(&mut self.figures),
        });
    }
}

/// A keyed operator's sizing search in [`Model::size_keyed`]: at arrival rate `lambda` ≥ 0
/// (records/s) and the limit `limit` (records/s a subtask may take), every parallelism from
/// `start` up to `stopped` (excluded) put a subtask over the limit; `stopped` fits, or is the
/// number of key groups.
#[derive(Debug, Clone, Copy)]
struct KeyedSearch {
    lambda: f64,
    limit: f64,
    start: u32,
    stopped: u32,
}

impl KeyedSearch {
    /// Whether a search at `lambda` with `limit` from `start` may skip to `stopped`: every
    /// parallelism p in [start, stopped) has λ_then · share(p) > limit, and λ · share(p) ≥
    /// λ_then · share(p) for λ ≥ λ_then ≥ 0 (shares are ≥ 0; rounding is monotone).
    fn reaches(&self, lambda: f64, limit: f64, start: u32) -> bool {
        self.lambda >= 0.0
            && lambda >= self.lambda
            && limit.to_bits() == self.limit.to_bits()
            && start >= self.start
    }
}

/// Most parallelisms (0 ..) kept per operator in the tail memo: an operator's row covers
/// 0 ..= its max parallelism, up to this many entries.
const TAIL_ROW_MAX: usize = 1024;

/// A key group is hot when its estimated load is at least this multiple of the mean.
pub const HOT_KEY_GROUP_FACTOR: f64 = 2.0;

/// A hot key group too large for one subtask at the target utilization counts as isolated
/// ([`Model::isolating_parallelism`]) when its subtask carries at most this multiple of the
/// group's own load besides it: 10 %, the scale-up tolerance band ([`SCALE_UP_TOLERANCE`]), so
/// the isolated subtask runs within that band of its unavoidable minimum (the group alone).
pub const HOT_KEY_ISOLATION: f64 = 0.1;

/// Whether a key group carrying `load` records/s is isolated by [`Model::isolating_parallelism`]
/// (and its operator held there) rather than sized for by the ordinary key-group search, with
/// `limit` = ρ_target·μ a subtask's rate at the target: when `load` · (1 + [`HOT_KEY_ISOLATION`])
/// exceeds `limit`, i.e. also a group up to the isolation margin *under* the limit. There
/// the ordinary search would need its subtask to carry less than `HOT_KEY_ISOLATION` × its
/// load besides it (limit − load < 0.1 · load), so it would go past the isolating
/// parallelism only to shave that remainder (up to maxParallelism for a group just under the
/// limit), while a group just over it was isolated and held: the two sides now meet. Under
/// the margin the ordinary search lets the hot subtask carry limit − load ≥ 0.1 · load besides
/// it, more than isolation does, so it never stops above the isolating parallelism for the
/// sake of the hottest group's subtask.
fn isolates(load: f64, limit: f64) -> bool {
    load * (1.0 + HOT_KEY_ISOLATION) > limit
}

/// Hysteresis of the hot-key judgement: an operator held as a hot-key bottleneck (its hottest
/// key group already has a subtask to itself, [`isolated_groups`]) is released only when that
/// group's load, read at its point estimate, falls this fraction below what claims one
/// ([`isolates`] against ρ_target·μ·(1 − this)). 10 %, the scale-up tolerance band
/// ([`SCALE_UP_TOLERANCE`]): a group that drifts within the band around the threshold from one
/// window to the next neither claims nor releases the operator each time.
pub const HOT_KEY_RELEASE: f64 = 0.1;

/// Saturation ((busy + backpressured time) / elapsed, [`OperatorEstimate::subtask_saturation`])
/// from which a keyed subtask counts as saturated in [`offered_shares`]: it processed what it
/// could, not what was offered to it.
pub const SATURATED: f64 = 0.9;

/// The rates [`offered_shares`] relates a keyed operator's subtasks to, records/s.
#[derive(Debug, Clone, Copy)]
struct Rates {
    /// The rate the planner multiplies key-group shares by (the smaller of its targets).
    target: f64,
    /// The steady input rate from the sources' arrival rates (traffic equations), read
    /// through the arrival scale.
    steady: f64,
    /// The arrival scale f the window's arrivals are read through (1 without one): the
    /// operator processed what it did at f = 1, so its offered load scales by f.
    scale: f64,
}

/// A keyed operator's subtask input shares corrected for saturated subtasks, written into
/// `out`; false (and `out` left alone) when there is nothing to correct: no key-group list
/// from the engine (the simulator's windows, which stay as they were), no input, or no
/// saturated subtask ([`SATURATED`]).
///
/// The measured shares are of the records each subtask *processed*. A saturated subtask
/// processed r_j = s_j · λ_obs records/s, less than was offered to it whenever it fell behind,
/// and its share of the processed total reads low whenever the other subtasks processed more
/// than the steady rate (catching up a backlog after a restart): the hot subtask of a job
/// isolated at p=64 read 14.4 % of the input where its group took 21.75 %. So each saturated
/// subtask gets at least f · (r_j + D · r_j / R) / λ_target, with D = max(0, λ_steady / f −
/// λ_obs) the steady load the operator did not process (it queued at the saturated subtasks,
/// the others keep up; split in proportion to what they processed, R their sum), λ_target the
/// rate the planner multiplies shares by and f the arrival scale (a forecast's, 1 without):
/// λ_target times the share is at least what the subtask processed plus its part of the
/// deficit (scaled by f), a lower bound on its offered load. The other subtasks share the rest
/// in their measured proportions. When the saturated subtasks' shares would reach 1 (all
/// saturated, say) the measured shares stand.
///
/// `input_rate`, `shares`, `sat`: the operator's [`OperatorEstimate::input_rate`],
/// [`OperatorEstimate::subtask_input_shares`] and [`OperatorEstimate::subtask_saturation`];
/// `listed`: whether its [`OperatorEstimate::subtask_key_group_shares`] is not empty.
fn offered_shares(
    input_rate: f64,
    shares: &[f64],
    sat: &[f64],
    listed: bool,
    rates: Rates,
    out: &mut Vec<f64>,
) -> bool {
    let Rates {
        target: lambda_target,
        steady,
        scale,
    } = rates;
    if !listed
        || shares.is_empty()
        || sat.len() != shares.len()
        || !(input_rate > 0.0
            && lambda_target > 0.0
            && lambda_target.is_finite()
            && scale > 0.0
            && scale.is_finite())
    {
        return false;
    }
    let saturated = |j: usize| sat[j] >= SATURATED;
    let processed: f64 = (0..shares.len())
        .filter(|&j| saturated(j))
        .map(|j| shares[j] * input_rate)
        .sum();
    if processed.is_nan() || processed <= 0.0 {
        return false;
    }
    let deficit = (steady / scale - input_rate).max(0.0);
    out.clear();
    out.extend(shares.iter().enumerate().map(|(j, &s)| {
        if saturated(j) {
            let r = s * input_rate;
            s.max(scale * (r + deficit * r / processed) / lambda_target)
        } else {
            s
        }
    }));
    let (mut taken, mut rest) = (0.0, 0.0);
    for (j, x) in out.iter().enumerate() {
        if saturated(j) {
            taken += x;
        } else {
            rest += x;
        }
    }
    if !(taken < 1.0 && rest > 0.0) {
        return false;
    }
    let f = (1.0 - taken) / rest;
    for (j, x) in out.iter_mut().enumerate() {
        if !saturated(j) {
            *x *= f;
        }
    }
    true
}

/// The key groups that a keyed operator's window shows with a subtask to themselves: each
/// subtask's busiest listed group (point reading,
/// [`OperatorEstimate::subtask_key_group_point_shares`]) when it lies in the subtask's range
/// and the subtask carries at most [`HOT_KEY_ISOLATION`] of its load besides it (share ≥
/// 1 / (1 + that)), as [`Model::isolating_parallelism`] leaves a hot group. Empty without
/// lists.
fn isolated_groups(point: KeyGroupLists<'_>, key_groups: u32) -> Vec<u32> {
    let p = point.len() as u32;
    let k = key_groups.max(1);
    if p == 0 || p > k {
        return Vec::new();
    }
    (0..point.len())
        .filter_map(|j| {
            let &(g, h) = point.get(j)?.first()?;
            (key_group_range(j as u32, p, k).contains(&g)
                && h * (1.0 + HOT_KEY_ISOLATION) >= 1.0 - 1e-9)
                .then_some(g)
        })
        .collect()
}

/// A latency-allocation step is negligible, and not taken, when it cuts the slowest path's
/// bound by less than this fraction of the SLO per subtask added (0.1 ms at a 1 s SLO: at that
/// rate 100 subtasks would cut 1 % of the SLO). Without it the greedy gave a 2 M rec/s sink
/// 127 subtasks for nanoseconds each while a held hot-key operator kept the bound over the SLO.
pub const NEGLIGIBLE_CUT: f64 = 1e-4;

/// With `autoscaler.onUnattainableSlo: bestEffort`, an SLO unattainable even at maximum
/// parallelism (the slowest path's bound there is L_max > SLO) is replaced, for the latency
/// allocation, by the bound (1 + this) · L_max: subtasks are added while they cut the
/// bound toward the lowest the limits allow, and stop within 10 % of it, where each further
/// subtask buys little (a path's queueing terms fall off exponentially in the spare capacity
/// cμ − λ, the M/M/c waiting-time tail, so the last 10 % would take most of the subtasks).
pub const BEST_EFFORT_MARGIN: f64 = 0.1;

/// Relative slack when rounding λ/(ρμ) up, so that 2.0000000001 from float noise is 2.
const CEIL_SLACK: f64 = 1e-9;

/// The share of a Kafka source's input its busiest subtask reads at `p` subtasks over `n`
/// partitions (n ≥ 1): Flink's `KafkaSource` deals the partitions round-robin, so the busiest
/// subtask reads ⌈n/min(p, n)⌉ of them, ⌈n/p⌉ / n of the input with partitions equally loaded.
pub(crate) fn partition_share(n: u32, p: u32) -> f64 {
    let n = n.max(1);
    let q = p.clamp(1, n);
    f64::from(n.div_ceil(q)) / f64::from(n)
}

/// The smallest parallelism with the same busiest-subtask share as `p` over `n` partitions:
/// ⌈n / ⌈n/p⌉⌉ (the key-group rule of [`Model::size_keyed`], for partitions): 3 for 4 or 5
/// over 6 partitions, never above n. 0 stays 0.
pub(crate) fn align_to_partitions(n: u32, p: u32) -> u32 {
    if p == 0 || n == 0 {
        return p;
    }
    let q = p.min(n);
    n.div_ceil(n.div_ceil(q))
}

/// Scale-up tolerance band, relative to the target utilization ρ_target: an operator whose
/// busiest subtask would run at ρ ≤ ρ_target · (1 + this) at its current parallelism (and the
/// target rate, backlog drain included) is not scaled up by the utilization sizing; the target
/// is then a sizing target, and the trigger for a scale-up is ρ above the band or the latency
/// SLO at risk (the greedy latency allocation still adds subtasks when the tail bound exceeds
/// the SLO). The value is the Kubernetes HPA's default tolerance (0.1, the
/// `--horizontal-pod-autoscaler-tolerance` flag), so a job sized by both rules flaps no more
/// than under HPA. Scale-downs are not affected.
pub const SCALE_UP_TOLERANCE: f64 = 0.1;

/// The largest parallelism a scale-up from `cur` subtasks may probe in one step for an
/// operator with learned scalability factor `f` (see [`super::learn`]): unbounded for
/// scaling within [`SCALE_UP_TOLERANCE`] of linear (f > 0.9: the prior f = 1 included, DS2's
/// one-step sizing; a factor of 0.98 from one noisy rescale is no evidence against linear
/// scaling), else ⌈cur / (1 − f)⌉. The factor is how far the linear model was off on the last
/// rescales: the further it is below 1, the less an extrapolation to many more subtasks is
/// worth (capacity that stops growing, shared CPU), so the step is smaller and the next
/// window measures it before the next step (f = 0.9: up to 10×; 0.8: 5×; 0.5: 2×; the
/// smallest factor kept, 0.25: 1.33×).
fn probe_limit(cur: u32, f: f64) -> u32 {
    if f.is_nan() || f <= 0.0 || f > 1.0 - SCALE_UP_TOLERANCE {
        return u32::MAX;
    }
    let x = f64::from(cur.max(1)) / (1.0 - f);
    let r = (x - CEIL_SLACK * x).ceil();
    if r >= f64::from(u32::MAX) {
        u32::MAX
    } else {
        (r as u32).max(cur.saturating_add(1))
    }
}

/// Whether `x` > `limit` (false when either is NaN).
fn above(x: f64, limit: f64) -> bool {
    x > limit
}

/// Whether `x` ≥ `limit` (false when either is NaN).
fn at_least(x: f64, limit: f64) -> bool {
    x >= limit
}

/// A rate as the reasons and `streamscale run`'s AT LIMIT line print it: no decimals from
/// 100 records/s up, two below.
pub(crate) fn fmt_rate(x: f64) -> Fixed {
    if x.abs() >= 100.0 {
        Fixed(x, 0)
    } else {
        Fixed(x, 2)
    }
}

impl Model {
    pub(crate) fn new(
        spec: &JobSpec,
        window: &[MetricSample],
        settings: &PlannerSettings,
    ) -> Result<Model, ModelError> {
        Model::with_graph(Arc::new(JobGraph::new(spec)?), spec, window, None, settings)
    }

    /// [`Model::new`] for a graph built from `spec` (or from a spec it
    /// [matches](JobGraph::matches)), with the sources' arrivals read through `arrival_scale`
    /// (see [`estimate_indexed`]: the model of the window
    /// [`scale_arrivals`](super::forecast::scale_arrivals) would return, without the copy).
    pub(crate) fn with_graph(
        graph: Arc<JobGraph>,
        spec: &JobSpec,
        window: &[MetricSample],
        arrival_scale: Option<f64>,
        settings: &PlannerSettings,
    ) -> Result<Model, ModelError> {
        let s = settings.resolve(&spec.autoscaler)?;
        let topo = &graph.topo;
        let ModelBuffers {
            mut kg_loads,
            mut kg_prefixes,
            mut share_memo,
            mut tail_memo,
            mut figures,
        } = graph.buffers.take();
        let (elapsed, est) = estimate_flat(topo, window, arrival_scale, &mut figures)?;
        let n = topo.len();
        let mut spec_parallelism = vec![1; n];
        if graph.spec_order.len() == spec.operators.len() {
            // The graph matches the spec: its operators by position, without name lookups.
            for (op, &i) in spec.operators.iter().zip(&graph.spec_order) {
                if let Some(i) = i {
                    spec_parallelism[i] = op.parallelism;
                }
            }
        } else {
            for op in &spec.operators {
                if let Some(&i) = topo.index.get(&op.name) {
                    spec_parallelism[i] = op.parallelism;
                }
            }
        }
        let gamma: Vec<f64> = est
            .iter()
            .map(|e| e.source.map_or(0.0, |x| x.arrival_rate))
            .collect();
        // The backlog now, plus the backlog the rescale itself creates (its downtime times the
        // arrival rate), drains within the catch-up time.
        let gamma_target: Vec<f64> = est
            .iter()
            .map(|e| {
                e.source.map_or(0.0, |x| {
                    x.arrival_rate + (x.backlog_records + x.arrival_rate * s.downtime) / s.catch_up
                })
            })
            .collect();
        let key_groups = graph.key_groups;
        // Keyed operators' key-group loads, their prefix sums and the share memo, each in one
        // flat array by slot (see `kg_slot`).
        let kl = key_groups.max(1) as usize;
        let keyed = (0..n)
            .filter(|&i| topo.queue[i] == QueueKind::Keyed)
            .count();
        let mut kg_slot = Vec::with_capacity(n);
        kg_loads.clear();
        kg_loads.reserve(keyed * kl);
        kg_prefixes.clear();
        kg_prefixes.reserve(keyed * (kl + 1));
        // How each operator's output follows its input (a burst window's over its period, a
        // trickle's as a fixed rate, see `OutputModel`): the edge gains, the fixed rates
        // injected into the downstream operators, and the operators whose rate is unknown.
        let outputs: Vec<OutputModel> = (0..n)
            .map(|i| output_model(&est[i], graph.window[i], &topo.names[i], window, elapsed))
            .collect();
        let flow = Flow::of(topo, &outputs);
        let gain = &flow.gain;
        // A feedback loop whose gain is 1 or more has no finite rates: rejected, naming it.
        let lambda_target = topo.try_traffic(&flow.injected(&gamma_target), gain)?;
        let lambda_steady = topo.traffic(&flow.injected(&gamma), gain);
        let gamma_target_hold: Vec<f64> = est
            .iter()
            .map(|e| {
                e.source
                    .map_or(0.0, |x| x.arrival_rate + x.backlog_records / s.catch_up)
            })
            .collect();
        let lambda_target_hold = if s.downtime > 0.0 {
            topo.traffic(&flow.injected(&gamma_target_hold), gain)
        } else {
            lambda_target.clone()
        };
        let mut hot_run = Vec::with_capacity(n);
        let mut hottest = Vec::with_capacity(n);
        let mut hot_held = vec![false; n];
        let mut slots = 0;
        let mut offered = Vec::new();
        // One row per keyed operator (each takes the next slot).
        share_memo.reset(keyed * (key_groups as usize + 1));
        for (i, (e, queue)) in est.iter().zip(&topo.queue).enumerate() {
            if *queue != QueueKind::Keyed {
                kg_slot.push(None);
                hot_run.push((0, 0));
                hottest.push(0.0);
                continue;
            }
            let start = kg_loads.len();
            // The smaller target (without the rescale's downtime) as the denominator: either
            // target times the corrected share is at least what a saturated subtask processed.
            let rates = Rates {
                target: lambda_target_hold[i].min(lambda_target[i]),
                steady: lambda_steady[i],
                scale: arrival_scale.unwrap_or(1.0),
            };
            let listed = figures.lists(i, false);
            let shares = if offered_shares(
                e.input_rate,
                figures.input_shares(i),
                figures.saturation(i),
                !listed.is_empty(),
                rates,
                &mut offered,
            ) {
                &offered[..]
            } else {
                figures.input_shares(i)
            };
            // Held as a hot-key bottleneck (its hottest group already has a subtask to itself):
            // judged on the point readings; else on the lower bounds, which claim a hot key
            // only when the counts leave no doubt.
            let isolated = isolated_groups(figures.lists(i, true), key_groups);
            let mut run_top = None;
            if !isolated.is_empty() {
                key_group_load_into(
                    shares,
                    figures.hottest(i),
                    &figures.lists(i, true),
                    key_groups,
                    &mut kg_loads,
                );
                let (run, top) = hottest_run(&kg_loads[start..]);
                if top > 0.0 && isolated.contains(&run.0) {
                    hot_held[i] = true;
                    run_top = Some((run, top));
                } else {
                    kg_loads.truncate(start);
                }
            }
            let (run, top) = match run_top {
                Some(x) => x,
                None => {
                    key_group_load_into(
                        shares,
                        figures.hottest(i),
                        &listed,
                        key_groups,
                        &mut kg_loads,
                    );
                    hottest_run(&kg_loads[start..])
                }
            };
            let load = &kg_loads[start..];
            let mut acc = 0.0;
            // The busiest subtask's share at one key group per subtask (q = K), made on the
            // way as `busiest_range_load` makes it from these prefix sums (the largest
            // difference of neighbours, kept when larger): the same value, for the sizing
            // at the maximum parallelism, without another pass.
            let mut single = 0.0;
            kg_prefixes.push(0.0);
            // (Extended from the slice's exact-length iterator: no capacity check per entry.)
            kg_prefixes.extend(load.iter().map(|x| {
                let next = acc + x;
                let d = next - acc;
                if d > single {
                    single = d;
                }
                acc = next;
                next
            }));
            if key_groups > 0 {
                let k = key_groups as usize;
                share_memo.set(slots * (k + 1) + k, single);
            }
            hot_run.push(run);
            hottest.push(top);
            kg_slot.push(Some(slots));
            slots += 1;
        }
        // Window bursts: a bursty windowed operator's output reaches each downstream operator
        // as one batch of (output rate × period) records at every window boundary.
        let mut lambda_smooth = lambda_steady.clone();
        let mut burst_in = vec![0.0; n];
        for (i, &lambda) in lambda_steady.iter().enumerate() {
            if let Some((period, true)) = graph.window[i] {
                let out = flow.out_rate(i, lambda);
                for &j in &topo.outputs[i] {
                    lambda_smooth[j] = (lambda_smooth[j] - out).max(0.0);
                    burst_in[j] += out * period;
                }
            }
        }
        let eps = (1.0 - s.percentile) / f64::from(graph.depth);
        tail_memo.reset(graph.tail_at[n]);
        let wait = watermark_waits(topo, spec, &gamma);
        Ok(Model {
            budget: TailBudget::new(eps),
            lambda_smooth,
            burst_in,
            wait,
            graph,
            est,
            figures,
            s,
            gamma,
            gamma_target,
            lambda_target,
            gamma_target_hold,
            lambda_target_hold,
            with_downtime: true,
            lambda_steady,
            spec_parallelism,
            kg_slot,
            kg_prefixes,
            share_memo: std::cell::RefCell::new(share_memo),
            hot_run,
            hottest,
            hot_held,
            tail_memo: std::cell::RefCell::new(tail_memo),
            kg_loads,
            factor: vec![1.0; n],
            decided_with: std::cell::Cell::new(None),
            frozen: vec![false; n],
            elapsed,
            flat_from: vec![0; n],
            outputs,
            flow,
            keyed_searches: std::cell::RefCell::new(vec![None; n]),
        })
    }

    /// The observed state of every non-source operator, by name: what the
    /// [`ScalabilityTracker`](super::learn::ScalabilityTracker) learns from.
    pub(crate) fn observed(&self) -> impl Iterator<Item = (&str, Observed)> {
        (0..self.graph.topo.len())
            .filter(|&i| !self.graph.topo.is_source[i])
            .map(|i| {
                let e = &self.est[i];
                (
                    self.name(i),
                    Observed {
                        parallelism: e.parallelism,
                        true_processing_rate: e.true_processing_rate,
                        input_rate: e.input_rate,
                        busiest_share: self
                            .figures
                            .input_shares(i)
                            .iter()
                            .copied()
                            .reduce(f64::max),
                    },
                )
            })
    }

    /// [`Model::observed`] collected, with the positions of its entries in operator-name
    /// order (for [`ScalabilityTracker::observe_ordered`]).
    pub(crate) fn observed_ordered(&self) -> (Vec<(&str, Observed)>, Vec<usize>) {
        let topo = &self.graph.topo;
        // (Sized up front: a filtered collection would grow them step by step.)
        let mut now: Vec<(&str, Observed)> = Vec::with_capacity(topo.len());
        now.extend(self.observed());
        let mut pos = vec![usize::MAX; topo.len()];
        for (k, i) in (0..topo.len()).filter(|&i| !topo.is_source[i]).enumerate() {
            pos[i] = k;
        }
        let mut by_name = Vec::with_capacity(now.len());
        by_name.extend(
            self.graph
                .by_name
                .iter()
                .map(|&i| pos[i])
                .filter(|&k| k != usize::MAX),
        );
        (now, by_name)
    }

    /// Applies what the tracker learned: each operator's scalability factor (non-finite or
    /// non-positive factors are ignored) and its ineffective-scaling flag.
    pub(crate) fn apply_learned(&mut self, learned: &ScalabilityTracker) {
        // The tracker's maps and the graph's `by_name` are both in name order: one merge
        // finds every operator's entries (what `factor` and `is_ineffective` look up).
        let graph = Arc::clone(&self.graph);
        let mut factors = learned.factors.iter().peekable();
        let mut flagged = learned.ineffective.iter().peekable();
        for &i in &graph.by_name {
            let name = graph.topo.names[i].as_str();
            while factors.next_if(|(k, _)| k.as_str() < name).is_some() {}
            while flagged.next_if(|(k, _)| k.as_str() < name).is_some() {}
            let f = factors
                .next_if(|(k, _)| k.as_str() == name)
                .map_or(1.0, |(_, &f)| f);
            self.factor[i] = if f.is_finite() && f > 0.0 { f } else { 1.0 };
            let flag = flagged.next_if(|(k, _)| k.as_str() == name).map(|(_, f)| f);
            self.frozen[i] = flag.is_some();
            self.flat_from[i] = flag.map_or(0, |f| f.from);
        }
        let memo = self.tail_memo.get_mut();
        if memo.is_used() {
            memo.clear();
        }
    }

    /// Entries per keyed operator in `kg_loads`: the key groups (at least 1, as
    /// [`key_group_load`] returns).
    fn kg_len(&self) -> usize {
        self.graph.key_groups.max(1) as usize
    }

    /// The prefix sums of slot `s`'s key-group loads ([`Model::kg_len`] + 1 entries).
    fn kg_prefix_of(&self, s: usize) -> &[f64] {
        let l = self.kg_len() + 1;
        &self.kg_prefixes[s * l..(s + 1) * l]
    }

    /// Share of operator `i`'s input that its busiest subtask receives at parallelism `p`:
    /// a Kafka source's busiest subtask reads ⌈N/p⌉ of its N partitions ([`partition_share`]);
    /// keyed operators sum the key-group loads of each subtask's contiguous key-group range
    /// (so both skew and an uneven split of key groups count); other operators share one
    /// queue, 1/p.
    fn max_share(&self, i: usize, p: u32) -> f64 {
        let p = p.max(1);
        if let Some(n) = self.partitions(i) {
            return partition_share(n, p);
        }
        let Some(s) = self.kg_slot[i] else {
            return 1.0 / f64::from(p);
        };
        let k = self.graph.key_groups;
        let q = p.min(k);
        let at = s * (k as usize + 1) + q as usize;
        let m = self.share_memo.borrow().get(at);
        if !m.is_nan() {
            return m;
        }
        let share = busiest_range_load(self.kg_prefix_of(s), q, k);
        self.share_memo.borrow_mut().set(at, share);
        share
    }

    /// Whether a lower bound on [`Model::max_share`]`(i, p)`, cheaper than it, satisfies
    /// `reached` (non-decreasing in the share: once true, true for every larger share): the
    /// exact share when it is in the memo, else for a keyed operator the largest load of the
    /// subtask ranges at `p` that overlap its hottest key-group run (each range's load is one
    /// of the terms whose maximum `max_share` is, computed the same way, so never above it;
    /// where the busiest range lies in that run, as it does under skew, it is equal). The
    /// ranges' running maximum stops as soon as it satisfies `reached`: by monotonicity the
    /// answer is that of their full maximum. Used to rule out parallelisms whose share is
    /// certainly too large without the full O(p) scan.
    fn share_reaches(&self, i: usize, p: u32, reached: impl Fn(f64) -> bool) -> bool {
        let p = p.max(1);
        let Some(s) = self.kg_slot[i] else {
            return reached(1.0 / f64::from(p));
        };
        let k = self.graph.key_groups;
        let q = p.min(k);
        let m = self
            .share_memo
            .borrow()
            .get(s * (k as usize + 1) + q as usize);
        if !m.is_nan() {
            return reached(m);
        }
        let (a, b) = self.hot_run[i];
        reached(busiest_range_load_over_until(
            self.kg_prefix_of(s),
            q,
            k,
            a,
            b,
            &reached,
        ))
    }

    /// Arrival rate to size operator `i` against as if its `p` subtasks were evenly loaded:
    /// λ · max_share(p) · p, so that λ_eff / p is the busiest subtask's arrival rate.
    fn effective_lambda(&self, i: usize, lambda: f64, p: u32) -> f64 {
        lambda * self.max_share(i, p) * f64::from(p.max(1))
    }

    /// ρ of operator `i` at its current parallelism `cur` when `cur` lies in `bounds` and that ρ
    /// is within the scale-up tolerance of `rho_t` (at most `rho_t` × (1 + [`SCALE_UP_TOLERANCE`]),
    /// below 1): a scale-up that small is not made.
    fn tolerated_rho(
        &self,
        i: usize,
        cur: u32,
        bounds: std::ops::RangeInclusive<u32>,
        rho_t: f64,
    ) -> Option<f64> {
        if !bounds.contains(&cur) {
            return None;
        }
        self.predicted_rho(i, cur)
            .filter(|&rho| rho <= (rho_t * (1.0 + SCALE_UP_TOLERANCE)).min(1.0 - CEIL_SLACK))
    }

    /// Predicted utilization ρ of operator `i`'s busiest subtask at `p` and the target rate.
    fn predicted_rho(&self, i: usize, p: u32) -> Option<f64> {
        self.mu_at(i, p)
            .or_else(|| self.source_mu(i))
            .map(|m| self.effective_lambda(i, self.lambda_target[i], p) / (f64::from(p.max(1)) * m))
    }

    /// The partition count of Kafka source `i` (`None` for other operators).
    fn partitions(&self, i: usize) -> Option<u32> {
        self.est[i]
            .source
            .and_then(|s| s.partitions)
            .filter(|&n| n > 0)
    }

    /// A Kafka source's μ per subtask (records read per busy second,
    /// [`SourceEstimate::processing_rate`](super::estimate::SourceEstimate::processing_rate));
    /// `None` for other operators. Kept apart from [`Model::mu`]: a source has no sojourn in
    /// the latency prediction.
    fn source_mu(&self, i: usize) -> Option<f64> {
        let src = self.est[i].source?;
        src.partitions?;
        src.processing_rate.filter(|m| m.is_finite() && *m > 0.0)
    }

    /// The most subtasks operator `i` may have: its max, and for a Kafka source at most its
    /// partition count (more would idle).
    fn upper_bound(&self, i: usize) -> u32 {
        let hi = self.graph.bounds[i].1;
        self.partitions(i).map_or(hi, |n| hi.min(n))
    }

    /// Kafka source `i` (N partitions, μ per subtask known) sized as DS2 sizes an operator,
    /// with partition alignment, the key-group rule of [`Model::size_keyed`] for partitions:
    /// the smallest p ≤ N whose busiest subtask, reading ⌈N/p⌉ partitions, stays at or under
    /// ρ_target at the source's target rate, then lowered to the smallest p with the same
    /// ⌈N/p⌉ (a divisor-like p: 3 rather than 4 or 5 for 6 partitions). Returns the needed
    /// parallelism before the bounds (N + 1 when even one partition per subtask is too much)
    /// and the text of its sizing.
    fn size_source(&self, i: usize, n: u32, mu: f64) -> (u32, String) {
        let lambda = self.lambda_target[i];
        let limit = self.s.rho * mu * (1.0 + CEIL_SLACK);
        let fits = |p: u32| lambda * partition_share(n, p) <= limit;
        let Some(p) = (1..=n).find(|&p| fits(p)) else {
            let why = format!(
                "source with {n} partitions: λ_target {} rec/s needs more than one partition per subtask at ρ_target {} × μ {} rec/s → p={} (more than its partitions)",
                fmt_rate(lambda),
                Fixed(self.s.rho, 2),
                fmt_rate(mu),
                n + 1
            );
            return (n.saturating_add(1), why);
        };
        let aligned = align_to_partitions(n, p);
        let why = format!(
            "source with {n} partitions: λ_target {} rec/s, busiest subtask reads ⌈{n}/p⌉ of them, ρ_target {} × μ {} rec/s → p={aligned}",
            fmt_rate(lambda),
            Fixed(self.s.rho, 2),
            fmt_rate(mu)
        );
        (aligned, why)
    }

    /// μ per subtask (records/s) expected at parallelism `p`: the measured μ, times the learned
    /// scalability factor above the current parallelism (Lohrmann et al. ICDCS'15 fitting
    /// factor; see [`super::learn`]).
    fn mu_at(&self, i: usize, p: u32) -> Option<f64> {
        let mu = self.mu(i)?;
        Some(if p > self.est[i].parallelism {
            mu * self.factor[i]
        } else {
            mu
        })
    }

    /// μ per subtask at the current parallelism (records/s); `None` for sources, when the
    /// window has too little busy time, and when the operator's arrival rate is unknown
    /// (downstream of a silent window, [`OutputModel::Silent`]): such an operator keeps its
    /// parallelism and is left out of the latency prediction.
    fn mu(&self, i: usize) -> Option<f64> {
        if self.graph.topo.is_source[i] || self.flow.unknown[i] {
            None
        } else {
            self.est[i].true_processing_rate
        }
    }

    /// Seconds operator `i`'s window results wait beyond their windows' ends (the watermark
    /// delay of an event-time window, [`watermark_waits`]; 0 for other operators, processing-time
    /// windows included). A window's period is not part of a record's latency: a window
    /// result's latency counts from the window's end (Flink's convention, the engine's).
    fn window_wait(&self, i: usize) -> f64 {
        self.wait.get(i).copied().unwrap_or(0.0)
    }

    /// Whether operator `i` at `p` subtasks (μ per subtask) cannot keep up with its steady
    /// arrival rate (its busiest subtask at ρ ≥ 1).
    fn overloaded(&self, i: usize, p: u32, mu: f64) -> bool {
        self.effective_lambda(i, self.lambda_steady[i], p) >= f64::from(p.max(1)) * mu
    }

    /// Seconds the busiest subtask of operator `i` needs to work off its share of the batch
    /// that bursty windowed upstream operators deliver at each window boundary (fluid: the
    /// batch's records times the subtask's share, over μ). The last record of the batch waits
    /// this long; on average a record waits half of it. 0 without windowed inputs.
    fn drain(&self, i: usize, p: u32, mu: f64) -> f64 {
        if self.burst_in[i] > 0.0 {
            self.burst_in[i] * self.max_share(i, p) / mu
        } else {
            0.0
        }
    }

    /// Operator `i`'s service-time coefficient of variation: the configured cs when set
    /// ([`PlannerSettings::service_cv`]), else its measured one
    /// ([`OperatorEstimate::service_cv`]), else the default cs (1).
    #[inline]
    fn cs(&self, i: usize) -> f64 {
        self.measured_cs(i).unwrap_or(self.s.cs)
    }

    /// Operator `i`'s measured cs when the planner uses it (no configured cs overrides it).
    #[inline]
    fn measured_cs(&self, i: usize) -> Option<f64> {
        self.est[i].service_cv.filter(|_| !self.s.cs_set)
    }

    /// Mean sojourn at the steady rate with `p` subtasks: queueing of the smooth input and
    /// service, plus an event-time window's watermark delay ([`Model::window_wait`]: a window
    /// result counts from its window's end, the period is not added) and half the burst drain
    /// of a window's downstream. 0 for sources; the watermark delay alone for unknown μ.
    fn sojourn(&self, i: usize, p: u32) -> f64 {
        let window = self.window_wait(i);
        match self.mu_at(i, p) {
            Some(mu) if self.overloaded(i, p, mu) => f64::INFINITY,
            Some(mu) => {
                operator_sojourn_time(
                    self.graph.topo.queue[i],
                    self.effective_lambda(i, self.lambda_smooth[i], p),
                    mu,
                    p,
                    self.s.ca,
                    self.cs(i),
                ) + window
                    + 0.5 * self.drain(i, p, mu)
            }
            None => window,
        }
    }

    /// Operator `i`'s term of the path percentile bound at `p` subtasks, seconds: the
    /// ε'-quantile bound of its sojourn ([`super::queueing::sojourn_quantile_bound`] at the smooth input: a
    /// keyed operator's busiest subtask is one server, a shared queue has p), plus an
    /// event-time window's watermark delay ([`Model::window_wait`]; not the window period: a
    /// window result's latency counts from its window's end) and the burst drain time (no
    /// record of a batch waits longer than the busiest subtask's share of it, in the fluid
    /// view). 0 for sources; the watermark delay alone for unknown μ.
    fn tail(&self, i: usize, p: u32) -> f64 {
        let Some(at) = self.tail_slot(i, p) else {
            return self.tail_uncached(i, p);
        };
        let m = self.tail_memo.borrow().get(at);
        if !m.is_nan() {
            return m;
        }
        let t = self.tail_uncached(i, p);
        self.tail_memo.borrow_mut().set(at, t);
        t
    }

    /// The tail memo's entry for operator `i` at parallelism `p`, if its row covers `p`.
    fn tail_slot(&self, i: usize, p: u32) -> Option<usize> {
        let at = self.graph.tail_at[i] + p as usize;
        (at < self.graph.tail_at[i + 1]).then_some(at)
    }

    /// The memoized tail of operator `i` at `p`, if computed.
    fn tail_memoized(&self, i: usize, p: u32) -> Option<f64> {
        let at = self.tail_slot(i, p)?;
        Some(self.tail_memo.borrow().get(at)).filter(|t| !t.is_nan())
    }

    /// An upper bound on [`Model::tail`] that skips the quantile's root finding (the
    /// quantile's starting bracket end, [`super::queueing::sojourn_quantile_upper`]): the same terms added in
    /// the same order to a term that is at least the quantile, so never below `tail(i, p)`.
    fn tail_upper(&self, i: usize, p: u32) -> f64 {
        if let Some(t) = self.tail_memoized(i, p) {
            return t;
        }
        let window = self.window_wait(i);
        let Some(mu) = self.mu_at(i, p) else {
            return window;
        };
        if self.overloaded(i, p, mu) {
            return f64::INFINITY;
        }
        sojourn_quantile_upper_in(
            self.tail_node(i, p, mu),
            self.s.ca,
            self.cs(i),
            &self.budget,
        ) + window
            + self.drain(i, p, mu)
    }

    /// The queue a record of operator `i` joins at `p` subtasks of μ each: a keyed
    /// operator's busiest subtask (one server), else the shared queue of p servers.
    fn tail_node(&self, i: usize, p: u32, mu: f64) -> TailNode {
        if self.kg_slot[i].is_some() {
            TailNode {
                lambda: self.lambda_smooth[i] * self.max_share(i, p),
                mu,
                servers: 1,
            }
        } else {
            TailNode {
                lambda: self.lambda_smooth[i],
                mu,
                servers: p.max(1),
            }
        }
    }

    /// [`Model::tail`] without the memo.
    fn tail_uncached(&self, i: usize, p: u32) -> f64 {
        let window = self.window_wait(i);
        let Some(mu) = self.mu_at(i, p) else {
            return window;
        };
        if self.overloaded(i, p, mu) {
            return f64::INFINITY;
        }
        let node = self.tail_node(i, p, mu);
        sojourn_quantile_bound_in(node, self.s.ca, self.cs(i), &self.budget, f64::NAN)
            + window
            + self.drain(i, p, mu)
    }

    /// Keyed operator `i`: the smallest parallelism from `from` (the DS2 value, a lower bound
    /// since max_share(p) ≥ 1/p) up to the number of key groups whose busiest subtask stays at
    /// or under the target utilization (it may exceed the operator's max: the caller clamps
    /// and reports), then lowered to the smallest parallelism with the same busiest-subtask
    /// share (key-group alignment: with K key groups in contiguous ranges, p and
    /// ⌈K / ⌈K/p⌉⌉ give every subtask at most ⌈K/p⌉ groups, so extra subtasks would add
    /// nothing). When one key group alone exceeds a subtask's capacity at the target, or comes
    /// within the isolation margin under it ([`isolates`]), no parallelism brings its subtask
    /// under the target, or only by shaving the little it carries besides the group: the
    /// operator is sized by
    /// [`Model::isolating_parallelism`] instead (the smallest parallelism at which every other
    /// subtask fits at the target and the hot group's subtask carries almost nothing else), held
    /// there (not scaled further for utilization) and reported as a hot-key bottleneck, saying
    /// when the group even exceeds a subtask's full capacity μ: then the job cannot keep up at
    /// any parallelism, the operator takes at most μ / (the group's share of its input), and the
    /// other subtasks are sized for that rate (a backlog's drain rate above it would otherwise
    /// ask for subtasks that cannot raise what the operator takes).
    fn size_keyed(
        &self,
        i: usize,
        from: u32,
        mu: f64,
        explain: bool,
        why: &mut String,
        reasons: &mut Vec<String>,
    ) -> u32 {
        let lambda = self.lambda_target[i];
        let cap = self.s.rho * mu;
        let hottest = self.hottest[i];
        if self.hot_key_at(i, mu) {
            // A group above even a subtask's full μ caps what the operator takes at μ / its share
            // (its subtask saturates and backpressure holds the input there): the other
            // subtasks need to fit only that rate, not the target rate it cannot reach.
            let hot = lambda * hottest;
            let over = hot > mu * (1.0 + CEIL_SLACK);
            let taken = if over { mu / hottest } else { lambda };
            let (p, group, other) = self.isolating_parallelism(i, taken, cap * (1.0 + CEIL_SLACK));
            if !explain {
                return p;
            }
            // Rates to 4 significant digits at least, so that the group's load and a subtask's
            // rate at the target read differently when they are close.
            let rate = |x: f64| {
                let d = match x.abs() {
                    a if a >= 1000.0 => 0,
                    a if a >= 100.0 => 1,
                    a if a >= 10.0 => 2,
                    _ => 3,
                };
                format!("{x:.d$}")
            };
            let compared = if hot > cap {
                format!(
                    "more than one subtask's {} rec/s at ρ {:.2}",
                    rate(cap),
                    self.s.rho
                )
            } else if isolates(hot, cap * (1.0 + CEIL_SLACK)) {
                format!(
                    "within {:.0}% under one subtask's {} rec/s at ρ {:.2}",
                    HOT_KEY_ISOLATION * 100.0,
                    rate(cap),
                    self.s.rho
                )
            } else {
                // Held (`hot_held`) within the release band.
                format!(
                    "under one subtask's {} rec/s at ρ {:.2} but it has a subtask to itself, released only under {} rec/s",
                    rate(cap),
                    self.s.rho,
                    rate(cap * (1.0 - HOT_KEY_RELEASE) / (1.0 + HOT_KEY_ISOLATION))
                )
            };
            let cannot = if hot > cap {
                "more parallelism cannot bring it under the target"
            } else {
                "more parallelism would only shave what its subtask carries besides it"
            };
            let isolated = if p == 1 {
                format!(
                    "p=1 isolates it (the one subtask carries {:.1}% of the input besides it)",
                    other * 100.0
                )
            } else {
                format!(
                    "p={p} isolates it (its subtask carries {:.1}% of the input besides it, every other subtask within the target)",
                    other * 100.0
                )
            };
            reasons.push(format!(
                "{}: hot-key bottleneck: key group {group} takes {:.1}% of {} rec/s ({} rec/s), {compared}{}; {cannot}: {isolated}, holds there",
                self.name(i),
                hottest * 100.0,
                fmt_rate(lambda),
                rate(hot),
                if over {
                    format!(
                        ", even more than its full capacity μ {} rec/s: the operator cannot keep up at any parallelism (it takes at most {} rec/s{})",
                        fmt_rate(mu),
                        fmt_rate(taken),
                        if p > 1 {
                            ", the rate the other subtasks are sized for"
                        } else {
                            ""
                        }
                    )
                } else {
                    String::new()
                },
            ));
            let _ = write!(
                why,
                "; hot key group {group}: p={p} isolates it, holds there"
            );
            return p;
        }
        let limit = cap * (1.0 + CEIL_SLACK);
        // (A share whose lower bound already misses the limit misses it: λ ≥ 0 and the
        // product is monotone in the share.)
        let fits = |p: u32| {
            !(lambda >= 0.0 && self.share_reaches(i, p, |v| lambda * v > limit))
                && lambda * self.max_share(i, p) <= limit
        };
        let start = from.clamp(1, self.graph.key_groups);
        // Every parallelism from an earlier search's start up to where it stopped failed there
        // at λ ≤ this λ and the same limit, so it fails here too (λ · share is monotone in λ,
        // the share ≥ 0): this search starts where that one stopped (the same answer).
        let known = self.keyed_searches.borrow()[i];
        let mut p = match known {
            Some(k) if k.reaches(lambda, limit, start) => start.max(k.stopped),
            _ => start,
        };
        while p < self.graph.key_groups && !fits(p) {
            p += 1;
        }
        if lambda >= 0.0 {
            self.keyed_searches.borrow_mut()[i] = Some(KeyedSearch {
                lambda,
                limit,
                start,
                stopped: p,
            });
        }
        if !fits(p) {
            // Even one key group per subtask is too much: more than the key groups are needed.
            return self.graph.key_groups.saturating_add(1).max(from);
        }
        let share = self.max_share(i, p);
        let same = share * (1.0 + 1e-12);
        while p > 1
            && !self.share_reaches(i, p - 1, |v| above(v, same))
            && self.max_share(i, p - 1) <= same
        {
            p -= 1;
        }
        if explain && p != from {
            cat!(why;
                "; key groups: the busiest subtask takes ", Fixed(share * 100.0, 1),
                "% of the input at p=", p, " → p=", p
            );
        }
        p
    }

    /// Whether keyed operator `i` is a hot-key bottleneck at parallelism `p`'s μ (the learned
    /// scalability factor applied above the current parallelism, as in the sizing): its
    /// busiest key group holds at least [`HOT_KEY_GROUP_FACTOR`] times the mean load and, at
    /// the target rate, more than one subtask takes at the target utilization (ρ_target·μ) or
    /// comes within the isolation margin under it ([`isolates`]), the condition under which [`Model::size_keyed`] sizes it by
    /// [`Model::isolating_parallelism`].
    fn hot_key_bottleneck(&self, i: usize, p: u32) -> bool {
        self.kg_slot[i].is_some() && self.mu_at(i, p).is_some_and(|mu| self.hot_key_at(i, mu))
    }

    /// The hot-key rule of keyed operator `i` at service rate `mu` (records/s per subtask), the
    /// one test [`Model::size_keyed`] and [`Model::hot_key_bottleneck`] share: its hottest key
    /// group has at least [`HOT_KEY_GROUP_FACTOR`] times the mean load (the estimate spreads
    /// each subtask's load over its range, so uneven ranges alone differ by far less) and that
    /// group's load at the target rate is too much for one subtask at ρ_target·μ, or within
    /// the isolation margin under it ([`isolates`]).
    /// An operator held as a hot-key bottleneck ([`Model::hot_limit`]) stays one until its
    /// group falls under the [`HOT_KEY_RELEASE`] band below that limit.
    fn hot_key_at(&self, i: usize, mu: f64) -> bool {
        let hottest = self.hottest[i];
        hottest * f64::from(self.graph.key_groups) >= HOT_KEY_GROUP_FACTOR
            && isolates(
                self.lambda_target[i] * hottest,
                self.hot_limit(i, self.s.rho * mu * (1.0 + CEIL_SLACK)),
            )
    }

    /// The limit [`isolates`] judges operator `i`'s hottest key group against, given a
    /// subtask's rate at the target `limit` (records/s): `limit` to claim a hot key, and
    /// `limit` · (1 − [`HOT_KEY_RELEASE`]) for an operator the window shows held as a hot-key
    /// bottleneck (`hot_held`): the hysteresis that keeps one noisy window from releasing it.
    fn hot_limit(&self, i: usize, limit: f64) -> f64 {
        if self.hot_held[i] {
            limit * (1.0 - HOT_KEY_RELEASE)
        } else {
            limit
        }
    }

    /// Keyed operator `i` with key groups too hot for one subtask at the target (`hot` = those
    /// whose load λ·load exceeds `limit`, ρ_target·μ, or comes within the isolation margin
    /// under it, [`isolates`]): the smallest parallelism p at which every
    /// subtask range (Flink's contiguous assignment, [`key_group_range`]) either holds no hot
    /// group and fits, λ·load ≤ `limit`, or holds exactly one hot group and besides it at most
    /// [`HOT_KEY_ISOLATION`] times that group's load ("almost nothing else": what is left is
    /// the unavoidable hot group itself). More subtasks cannot lower the hot subtask below its
    /// group's load, and any fewer leave another subtask over the target or load the hot one
    /// further, so this is where the operator is held. Such a p exists: at p = K each range is
    /// one key group, a hot one alone or a cool one that fits by definition. Returns p, the
    /// hottest group and the load its subtask carries besides it at p (share of the input).
    /// `lambda` is the operator's input rate, records/s ([`Model::size_keyed`] passes the
    /// target rate, or the μ / share its hottest group lets through when that is less). The
    /// search starts at a lower bound (the hot groups need a subtask each, and the others'
    /// subtasks carry the rest at `limit`) and checks each p in O(p), stopping at the first: O(p²)
    /// range sums in all, p usually a few dozen (at worst K² / 2, when only single-group ranges
    /// separate the hot groups).
    fn isolating_parallelism(&self, i: usize, lambda: f64, limit: f64) -> (u32, u32, f64) {
        let k = self.graph.key_groups.max(1);
        let Some(s) = self.kg_slot[i] else {
            return (self.est[i].parallelism, 0, 0.0);
        };
        let load = &self.kg_loads[s * self.kg_len()..(s + 1) * self.kg_len()];
        let prefix = self.kg_prefix_of(s);
        let hottest = self.hot_run[i].0;
        let hottest_limit = self.hot_limit(i, limit);
        let hot: Vec<u32> = (0..k)
            .filter(|&g| {
                let l = if g == hottest { hottest_limit } else { limit };
                isolates(lambda * load[g as usize], l)
            })
            .collect();
        let hot_sum: f64 = hot.iter().map(|&g| load[g as usize]).sum();
        let rest = lambda * (1.0 - (1.0 + HOT_KEY_ISOLATION) * hot_sum);
        let lower = if limit > 0.0 && rest > 0.0 {
            (rest / limit).floor().min(f64::from(k))
        } else {
            0.0
        };
        let start = (hot.len() as u32).saturating_add(lower as u32).clamp(1, k);
        // Whether every range at q isolates or fits; the hottest group's extra load on the way.
        let check = |q: u32| -> Option<f64> {
            let mut h = hot.iter().peekable();
            let mut extra = 0.0;
            for j in 0..q {
                let r = key_group_range(j, q, k);
                let range_load = prefix[r.end as usize] - prefix[r.start as usize];
                let mut in_range = None;
                while let Some(&&g) = h.peek() {
                    if g >= r.end {
                        break;
                    }
                    if in_range.is_some() {
                        return None;
                    }
                    in_range = Some(g);
                    h.next();
                }
                match in_range {
                    None if lambda * range_load > limit => return None,
                    None => {}
                    Some(g) => {
                        let own = load[g as usize];
                        let besides = (range_load - own).max(0.0);
                        if besides > HOT_KEY_ISOLATION * own * (1.0 + 1e-9) {
                            return None;
                        }
                        if g == hottest {
                            extra = besides;
                        }
                    }
                }
            }
            Some(extra)
        };
        for q in start..=k {
            if let Some(extra) = check(q) {
                return (q, hottest, extra);
            }
        }
        (k, hottest, 0.0)
    }

    /// The next parallelism above `p` worth trying for operator `i` in the latency allocation,
    /// within its max ([`Model::step_max`]): `p + 1`, or for a keyed operator the smallest higher parallelism that
    /// lowers its busiest subtask's share (adding subtasks that leave ⌈K/p⌉ unchanged cuts no
    /// latency, which would break the convexity the greedy allocation relies on). `None` for a
    /// keyed operator held as a hot-key bottleneck ([`Model::hot_key_bottleneck`]): sized to
    /// isolate its hot key group, it is not scaled further, for latency either (more subtasks
    /// would only shave the little its hot subtask carries besides that group).
    fn next_parallelism(&self, i: usize, p: u32) -> Option<u32> {
        let hi = self.step_max(i);
        if self.kg_slot[i].is_none() {
            return (p < hi).then_some(p + 1);
        }
        if self.hot_key_bottleneck(i, p.saturating_add(1)) {
            return None;
        }
        let lower = self.max_share(i, p) * (1.0 - 1e-12);
        (p + 1..=hi.min(self.graph.key_groups)).find(|&q| {
            !self.share_reaches(i, q, |v| at_least(v, lower)) && self.max_share(i, q) < lower
        })
    }

    /// Whether the latency allocation leaves operator `i` at `p` although it is below its max
    /// ([`Model::next_parallelism`] offers no higher parallelism: a hot-key bottleneck, or a
    /// keyed operator whose busiest subtask's share no higher parallelism lowers).
    fn held_for_latency(&self, i: usize, p: u32) -> bool {
        p < self.step_max(i) && self.next_parallelism(i, p).is_none()
    }

    /// The largest parallelism operator `i` may take in this decision: its max, and for an
    /// operator with learned sub-linear scaling the probe step's limit ([`probe_limit`]).
    fn step_max(&self, i: usize) -> u32 {
        self.graph.bounds[i]
            .1
            .min(probe_limit(self.est[i].parallelism, self.factor[i]))
    }

    /// For an unattainable-SLO reason: the operators flagged in `held` on the path ending at
    /// `end` (predecessors `via`), each with its parallelism in `p`, why it is held and its term
    /// in `w` (seconds); empty when none is.
    fn held_on_path(
        &self,
        p: &[u32],
        w: &[f64],
        held: &[bool],
        via: &[usize],
        end: usize,
    ) -> String {
        let mut out = String::new();
        let mut at = end;
        while at < held.len() {
            if held[at] {
                let what = if self.hot_key_bottleneck(at, p[at].saturating_add(1)) {
                    "a hot-key bottleneck (more subtasks cannot unload its hot key group's subtask)"
                } else {
                    "a keyed operator whose busiest subtask's key-group share no higher parallelism lowers"
                };
                let _ = write!(
                    out,
                    "{}{} is held at p={} as {what}, its term {:.4} s",
                    if out.is_empty() { " (" } else { "; " },
                    self.name(at),
                    p[at],
                    w[at]
                );
            }
            at = via.get(at).copied().unwrap_or(usize::MAX);
        }
        if !out.is_empty() {
            out.push(')');
        }
        out
    }

    /// For best effort at the bound `target` (seconds): the slowest path's bound at the
    /// current parallelism when it can hold, i.e. every operator's current parallelism is at
    /// least its sized one `p` (operators the allocation leaves alone — μ unknown, flagged for
    /// ineffective scaling, or `held` hot-key operators — at exactly it), within its bounds, and
    /// the bound is at most target · (1 + [`SCALE_UP_TOLERANCE`]); `None` otherwise. `w` holds
    /// the terms at `p`.
    fn best_effort_hold(&self, p: &[u32], w: &[f64], held: &[bool], target: f64) -> Option<f64> {
        let n = p.len();
        let mut cur_w = Vec::with_capacity(n);
        for i in 0..n {
            let cur = self.est[i].parallelism;
            let (lo, hi) = self.graph.bounds[i];
            let fixed = !self.adjustable(i) || held[i] || self.graph.topo.is_source[i];
            if cur < p[i] || (fixed && cur != p[i]) || !(lo..=hi).contains(&cur) {
                return None;
            }
            cur_w.push(if cur == p[i] { w[i] } else { self.tail(i, cur) });
        }
        let (mut dist, mut via) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (bound, _) = self.graph.longest_path_into(&cur_w, &mut dist, &mut via);
        (bound <= target * (1.0 + SCALE_UP_TOLERANCE)).then_some(bound)
    }

    fn name(&self, i: usize) -> &str {
        &self.graph.topo.names[i]
    }

    /// Why operator `i`, downstream of the silent window `w`, keeps `p` subtasks.
    fn silent_why(&self, w: usize, p: u32) -> String {
        let period = match self.outputs[w] {
            OutputModel::Silent(period) => period,
            _ => 0.0,
        };
        format!(
            "arrival rate unknown: window {} fires once per {} s and did not fire in this metric window: keeps p={p} (not planned from a window of silence)",
            self.name(w),
            Short(period)
        )
    }

    /// The job-wide reason for operator `i`'s output model when it is not the window's
    /// selectivity (a burst read over its period, a fixed rate, a silent window).
    fn output_reason(&self, i: usize, reasons: &mut Vec<String>) {
        let e = &self.est[i];
        let text = match (self.outputs[i], self.graph.window[i]) {
            (OutputModel::Silent(period), _) => format!(
                "{}: window fires once per {} s and emitted nothing in this shorter metric window: its output rate is unknown, the operators downstream keep their parallelism",
                self.name(i),
                Short(period)
            ),
            (OutputModel::Fixed(rate), _) => format!(
                "{}: selectivity from {} input records (fewer than {}) is not used; its output is taken as the measured {} rec/s, not scaled with its input",
                self.name(i),
                Fixed(e.input_rate * self.elapsed, 0),
                MIN_SELECTIVITY_RECORDS,
                fmt_rate(rate)
            ),
            (OutputModel::Proportional(g), Some((period, true)))
                if (g - e.selectivity).abs() > 1e-12 * e.selectivity.abs().max(1.0) =>
            {
                format!(
                    "{}: window bursts read over its {} s period: selectivity {} (the metric window alone read {})",
                    self.name(i),
                    Short(period),
                    Fixed(g, 4),
                    Fixed(e.selectivity, 4)
                )
            }
            _ => return,
        };
        reasons.push(text);
    }

    /// Plans (see the module docs). With a rescale downtime D > 0 the plan is first made
    /// without the backlog D·γ the rescale would create: when that plan keeps every operator's
    /// parallelism there is no rescale and no downtime, and it is the decision; otherwise the
    /// rescale happens, and the plan is made again with its backlog added to what must drain
    /// within the catch-up time. (Always adding it would let a plan scale up only to absorb
    /// the downtime of the very rescale it asks for.) Likewise that backlog does not block a
    /// scale-down the plan without it makes: an operator keeps the lower parallelism when its
    /// busiest subtask there stays within the scale-up tolerance band at the rate with the
    /// backlog (see [`SCALE_UP_TOLERANCE`]), since from there the planner would not scale it
    /// back up. (Without this, the backlog of a scale-down's own downtime could keep the
    /// operator at the higher parallelism, so that no rescale and no downtime happen at all.)
    pub(crate) fn plan(&mut self) -> Decision {
        let mut free = None;
        if self.s.downtime > 0.0 {
            self.use_downtime(false);
            // The sizing without text first (same parallelism: the text never feeds back into a
            // number): most plans that may only hold stop there, and it is `free` otherwise.
            let n = self.graph.topo.len();
            let (mut p, mut clamped) = (vec![1u32; n], vec![false; n]);
            let (mut why, mut reasons) = (vec![String::new(); n], Vec::new());
            self.size(false, None, &mut p, &mut clamped, &mut why, &mut reasons);
            let grown = (0..n).any(|i| p[i] > self.est[i].parallelism);
            let hold = if grown {
                None
            } else {
                self.plan_once(true, None)
            };
            if hold.is_none() {
                free = Some(p);
            }
            self.use_downtime(true);
            if let Some(hold) = hold {
                return hold;
            }
        }
        self.plan_once(false, free.as_deref())
            .expect("a plan not limited to holds always decides")
    }

    /// Switches the targets between including the rescale's downtime backlog and not.
    fn use_downtime(&mut self, on: bool) {
        if self.with_downtime != on {
            std::mem::swap(&mut self.gamma_target, &mut self.gamma_target_hold);
            std::mem::swap(&mut self.lambda_target, &mut self.lambda_target_hold);
            self.with_downtime = on;
        }
    }

    /// Step 1 of a plan: the sources' reasons and DS2 sizing at the target utilization into
    /// `p` (with `clamped`, each operator's `why` and the job-wide `reasons`). With `explain`
    /// false no text is written (the parallelism is the same). `free`: the sizing without the
    /// rescale's downtime backlog, when these targets include it (see [`Model::plan`]).
    fn size(
        &self,
        explain: bool,
        free: Option<&[u32]>,
        p: &mut [u32],
        clamped: &mut [bool],
        why: &mut [String],
        reasons: &mut Vec<String>,
    ) {
        let n = self.graph.topo.len();
        let rho_t = self.s.rho;

        for i in (0..n).filter(|_| explain) {
            let e = &self.est[i];
            if let Some(src) = e.source {
                let downtime = if self.with_downtime && self.s.downtime > 0.0 {
                    format!(
                        " + {} records from the rescale's {} s downtime",
                        Fixed(src.arrival_rate * self.s.downtime, 0),
                        Fixed(self.s.downtime, 2)
                    )
                } else {
                    String::new()
                };
                reasons.push(format!(
                    "source {}: arrival rate γ={} rec/s, backlog {} records{downtime} → target rate {} rec/s (drains the backlog within {} s)",
                    self.name(i),
                    fmt_rate(src.arrival_rate),
                    Fixed(src.backlog_records, 0),
                    fmt_rate(self.gamma_target[i]),
                    Short(self.s.catch_up)
                ));
            }
            if e.parallelism != self.spec_parallelism[i] {
                reasons.push(format!(
                    "{}: the job spec says parallelism {} but {} subtasks report metrics; planning from the running {}",
                    self.name(i),
                    self.spec_parallelism[i],
                    e.parallelism,
                    e.parallelism
                ));
            }
            self.output_reason(i, reasons);
            if !self.graph.topo.is_source[i] && e.selectivity_is_prior {
                reasons.push(format!(
                    "{}: no input in the window; selectivity prior 1.0 assumed",
                    self.name(i)
                ));
            }
        }

        // 1. DS2 sizing at the target utilization.
        for i in 0..n {
            let cur = self.est[i].parallelism;
            let (lo, hi) = self.graph.bounds[i];
            if self.graph.topo.is_source[i] {
                let (Some(n), Some(mu)) = (self.partitions(i), self.source_mu(i)) else {
                    p[i] = cur;
                    if explain {
                        why[i] = format!("source: not rescaled, keeps p={cur}");
                    }
                    continue;
                };
                let hi = self.upper_bound(i);
                let lo = lo.min(hi);
                let (mut need, text) = self.size_source(i, n, mu);
                if explain {
                    why[i] = text;
                }
                if need > cur
                    && let Some(rho_cur) = self.tolerated_rho(i, cur, lo..=hi, rho_t)
                {
                    if explain {
                        cat!(&mut why[i];
                            "; ρ=", Fixed(rho_cur, 3), " at the current p=", cur,
                            " is within the scale-up tolerance: keeps p=", cur
                        );
                    }
                    need = cur;
                }
                // Within the bounds, and aligned again there (a max of 4 over 6 partitions
                // gives 3: a fourth subtask would take no partition off the busiest).
                p[i] = align_to_partitions(n, need.clamp(lo, hi)).max(lo);
                if need > hi {
                    clamped[i] = true;
                    if explain {
                        let rho = self.predicted_rho(i, p[i]).unwrap_or(f64::INFINITY);
                        let _ = write!(why[i], "; at its limit p={}: predicted ρ={rho:.2}", p[i]);
                        let limit = if hi == n && self.graph.bounds[i].1 >= n {
                            format!("its topic has {n} partitions")
                        } else {
                            format!("its max is {hi}")
                        };
                        reasons.push(format!(
                            "{}: needs p={need} for ρ ≤ {rho_t:.2} but {limit}; predicted ρ={rho:.2}{}",
                            self.name(i),
                            if rho >= 1.0 {
                                " (unstable: backlog will grow)"
                            } else {
                                ""
                            }
                        ));
                    }
                }
                continue;
            }
            let Some(mu) = self.mu(i) else {
                if let Some(w) = self.flow.silent_from[i].filter(|_| self.flow.unknown[i]) {
                    p[i] = cur.clamp(lo, hi);
                    if explain {
                        why[i] = self.silent_why(w, p[i]);
                    }
                    continue;
                }
                if self.lambda_target[i] <= 0.0 && self.lambda_steady[i] <= 0.0 {
                    // No input at all (a pause in the stream): μ cannot be measured, but DS2
                    // needs no subtask for λ = 0, so the operator goes to its minimum.
                    p[i] = lo.max(1).min(hi);
                    if explain {
                        why[i] = format!(
                            "no input in the window (λ_target 0 rec/s): DS2 needs no capacity → p={} (minimum)",
                            p[i]
                        );
                    }
                    continue;
                }
                p[i] = cur.clamp(lo, hi);
                if !explain {
                    continue;
                }
                why[i] = format!(
                    "true processing rate unknown (no measurable busy time in the window): keeps p={}",
                    p[i]
                );
                if p[i] != cur {
                    let _ = write!(why[i], " (current {cur} moved into bounds [{lo}, {hi}])");
                }
                reasons.push(format!(
                    "{}: true processing rate unknown; parallelism kept at {} and its sojourn left out of the latency prediction",
                    self.name(i),
                    p[i]
                ));
                continue;
            };
            let lambda = self.lambda_target[i];
            let x = lambda / (rho_t * mu);
            let need = if x.is_finite() {
                (x - CEIL_SLACK * x.max(1.0)).ceil().max(1.0)
            } else {
                f64::MAX
            };
            let mut need_u = if need >= f64::from(u32::MAX) {
                u32::MAX
            } else {
                need as u32
            };
            if explain {
                // Room for the clauses appended below in one allocation.
                why[i] = String::with_capacity(256);
                cat!(&mut why[i];
                    "DS2: λ_target ", fmt_rate(lambda), " rec/s / (ρ_target ", Fixed(rho_t, 2),
                    " × μ ", fmt_rate(mu), " rec/s) = ", Fixed(x, 2), " → p=", need_u
                );
            }
            // Above the current parallelism μ is corrected by the learned scalability factor.
            let mut mu_size = mu;
            let f = self.factor[i];
            if need_u > cur && f != 1.0 {
                mu_size = mu * f;
                let xf = lambda / (rho_t * mu_size);
                let needf = if xf.is_finite() {
                    (xf - CEIL_SLACK * xf.max(1.0)).ceil().max(1.0)
                } else {
                    f64::MAX
                };
                need_u = if needf >= f64::from(u32::MAX) {
                    u32::MAX
                } else {
                    (needf as u32).max(cur.saturating_add(1))
                };
                let probe = probe_limit(cur, f);
                if need_u > probe {
                    if explain {
                        cat!(&mut why[i];
                            "; sub-linear scaling: probes at most ", Fixed(1.0 / (1.0 - f), 2),
                            "× its current p per step → p=", probe
                        );
                    }
                    need_u = probe;
                }
                if explain {
                    cat!(&mut why[i];
                        "; scalability factor ", Fixed(f, 2), " (μ ", fmt_rate(mu_size),
                        " rec/s per subtask above p=", cur, ") → p=", need_u
                    );
                }
            }
            let mut need_u = if self.kg_slot[i].is_some() {
                self.size_keyed(i, need_u, mu_size, explain, &mut why[i], reasons)
            } else {
                need_u
            };
            if self.frozen[i] && need_u > cur {
                if explain {
                    let _ = write!(
                        why[i],
                        "; ineffective scaling: not scaled up, keeps p={cur}"
                    );
                }
                need_u = cur;
            }
            // Scale back down to the smallest parallelism measured to give the capacity that
            // more subtasks did not raise (μ per subtask at `cur` understates it below `cur`).
            let from = self.flat_from[i];
            if self.frozen[i] && from > 0 && from < cur && need_u > from {
                if explain {
                    let _ = write!(
                        why[i],
                        "; p={from} gave the same capacity before the scale-up that did not raise it → p={from}"
                    );
                }
                need_u = from;
            }
            if need_u > cur
                && let Some(rho_cur) = self.tolerated_rho(i, cur, lo..=hi, rho_t)
            {
                if explain {
                    cat!(&mut why[i];
                        "; ρ=", Fixed(rho_cur, 3), " at the current p=", cur,
                        " is within the scale-up tolerance (", Fixed(100.0 * SCALE_UP_TOLERANCE, 0),
                        "% above ρ_target): keeps p=", cur, " unless the latency SLO needs more"
                    );
                }
                need_u = cur;
            }
            // A scale-down the plan without the rescale's downtime backlog makes, kept when the
            // lower parallelism stays within the scale-up tolerance band with that backlog.
            if let Some(&down) = free.and_then(|f| f.get(i))
                && down < cur
                && down < need_u
                && let Some(rho_down) = self.predicted_rho(i, down)
                && rho_down <= (rho_t * (1.0 + SCALE_UP_TOLERANCE)).min(1.0 - CEIL_SLACK)
            {
                if explain {
                    let _ = write!(
                        why[i],
                        "; scale-down to p={down}: with the rescale's downtime backlog its busiest subtask runs at ρ={} there, within the scale-up tolerance ({}% above ρ_target) → p={down}",
                        Fixed(rho_down, 3),
                        Fixed(100.0 * SCALE_UP_TOLERANCE, 0)
                    );
                }
                need_u = down;
            }
            p[i] = need_u.clamp(lo, hi);
            if need_u > hi {
                clamped[i] = true;
                if !explain {
                    continue;
                }
                let rho = self.predicted_rho(i, hi).unwrap_or(f64::INFINITY);
                let _ = write!(why[i], "; clamped to max {hi}: predicted ρ={rho:.2}");
                reasons.push(format!(
                    "{}: needs p={} for ρ ≤ {:.2} but its max is {}; predicted ρ={:.2}{}",
                    self.name(i),
                    need_u,
                    rho_t,
                    hi,
                    rho,
                    if rho >= 1.0 {
                        " (unstable: backlog will grow)"
                    } else {
                        ""
                    }
                ));
            } else if explain && need_u < lo {
                let _ = write!(why[i], "; raised to min {lo}");
            }
        }
        self.limit_upstream_of_bottlenecks(explain, p, why);
    }

    /// The rate operator `i` passes on at most at `p` subtasks, records/s: the input rate at
    /// which its busiest subtask saturates, μ(p) / (its share of the input at p)
    /// ([`Model::mu_at`], [`Model::max_share`]); ∞ when μ is unknown (a source, too little
    /// busy time).
    fn capacity_at(&self, i: usize, p: u32) -> f64 {
        self.mu_at(i, p)
            .map_or(f64::INFINITY, |mu| mu / self.max_share(i, p))
    }

    /// Nothing upstream of a bottleneck is sized for more than the bottleneck can take
    /// (FLINK-31215): an operator planned at `p` whose capacity ([`Model::capacity_at`]) is
    /// below its target rate (capped at its max, a hot-key bottleneck, held for ineffective
    /// scaling) passes on only the fraction capacity / λ_target of it, and backpressure holds
    /// everything upstream of it to that fraction (a blocked output blocks the whole subtask,
    /// so an operator takes the smallest fraction over its outputs, and that of anything
    /// further down). In reverse topological order each operator's fraction is the smaller of
    /// its own and its outputs'; a planned scale-up of an operator whose outputs pass on a
    /// fraction f < 1 is then sized for f · λ_target instead (the smallest parallelism whose
    /// busiest subtask stays within ρ_target there, and not below the current one). Operators
    /// without such a bottleneck below them keep their sizing.
    fn limit_upstream_of_bottlenecks(&self, explain: bool, p: &mut [u32], why: &mut [String]) {
        let topo = &self.graph.topo;
        let n = topo.len();
        let mut through = vec![1.0_f64; n];
        let mut any = false;
        for i in (0..n).rev() {
            let lambda = self.lambda_target[i];
            let own = if topo.is_source[i] || lambda.is_nan() || lambda <= 0.0 {
                1.0
            } else {
                (self.capacity_at(i, p[i]) / lambda).min(1.0)
            };
            let below = self.fraction_below(i, &through);
            through[i] = own.min(below);
            any |= through[i] < 1.0;
        }
        if !any {
            return;
        }
        for i in 0..n {
            let cur = self.est[i].parallelism;
            let f = self.fraction_below(i, &through);
            if topo.is_source[i] || p[i] <= cur || f.is_nan() || f >= 1.0 || self.mu(i).is_none() {
                continue;
            }
            let lambda = self.lambda_target[i] * f;
            let limit =
                |q: u32| self.mu_at(i, q).map_or(0.0, |mu| self.s.rho * mu) * (1.0 + CEIL_SLACK);
            let q = (1..p[i])
                .find(|&q| lambda * self.max_share(i, q) <= limit(q))
                .unwrap_or(p[i]);
            let band = (self.s.rho * (1.0 + SCALE_UP_TOLERANCE)).min(1.0 - CEIL_SLACK);
            let keep_cur = self
                .mu_at(i, cur)
                .is_some_and(|mu| lambda * self.max_share(i, cur) <= band * mu);
            let q = if keep_cur { cur } else { q.max(cur) };
            let q = q.max(self.graph.bounds[i].0);
            if q >= p[i] {
                continue;
            }
            if explain {
                let _ = write!(
                    why[i],
                    "; upstream of a bottleneck that passes on only {}% of its target rate: sized for {} rec/s → p={q} (FLINK-31215)",
                    Fixed(100.0 * f, 1),
                    fmt_rate(lambda)
                );
            }
            p[i] = q;
        }
    }

    /// The smallest of `through` over operator `i`'s forward outputs (1 without outputs).
    fn fraction_below(&self, i: usize, through: &[f64]) -> f64 {
        self.graph.topo.outputs[i]
            .iter()
            .filter(|&&j| j > i)
            .map(|&j| through[j])
            .fold(1.0, f64::min)
    }

    /// One plan at the targets in use. With `hold_only` (called only when the sizing keeps
    /// every operator at or below its current parallelism, see [`Model::plan`]), `None` as
    /// soon as it is known that the plan changes some operator's parallelism (the latency
    /// allocation raising one above it: it never lowers one again), and otherwise the decision
    /// only if it keeps every operator's parallelism.
    fn plan_once(&self, hold_only: bool, free: Option<&[u32]>) -> Option<Decision> {
        let n = self.graph.topo.len();
        let mut p = vec![1u32; n];
        let mut clamped = vec![false; n];
        let mut why = vec![String::new(); n];
        let mut reasons = Vec::new();
        self.size(true, free, &mut p, &mut clamped, &mut why, &mut reasons);

        // 2. Greedy marginal allocation for the latency SLO (on the percentile bound of the
        // slowest path) at the steady rates. Operators flagged for ineffective scaling count 0
        // here: nothing else is scaled for them.
        let w: Vec<f64> = (0..n)
            .map(|i| {
                if self.frozen[i] {
                    0.0
                } else {
                    self.tail(i, p[i])
                }
            })
            .collect();
        let (mut dist, mut via) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut lat, end) = self.graph.longest_path_into(&w, &mut dist, &mut via);
        let adjustable = |i: usize| self.mu(i).is_some() && !self.frozen[i];
        if lat > self.s.slo {
            // Attainable at maximum parallelism? Upper bounds on the tails first (the
            // longest path is monotone in its terms): when they meet the SLO so do the exact
            // tails, which are then not needed. Operators the allocation cannot scale further
            // (`next_parallelism` refuses: a hot-key bottleneck held where it isolates its hot
            // group) count at their sized parallelism, where the allocation leaves them.
            let held: Vec<bool> = (0..n)
                .map(|i| adjustable(i) && self.held_for_latency(i, p[i]))
                .collect();
            let mut w_max: Vec<f64> = (0..n)
                .map(|i| {
                    if adjustable(i) && !held[i] {
                        self.tail_upper(i, self.graph.bounds[i].1.max(p[i]))
                    } else {
                        w[i]
                    }
                })
                .collect();
            let (mut max_dist, mut max_via) = (Vec::new(), Vec::new());
            let (mut lat_max, mut max_end) =
                self.graph
                    .longest_path_into(&w_max, &mut max_dist, &mut max_via);
            // (NaN included: then the exact tails decide, as before.)
            if lat_max.is_nan() || lat_max > self.s.slo {
                for (i, x) in w_max.iter_mut().enumerate() {
                    if adjustable(i) && !held[i] {
                        *x = self.tail(i, self.graph.bounds[i].1.max(p[i]));
                    }
                }
                (lat_max, max_end) =
                    self.graph
                        .topo
                        .longest_path_into(&w_max, &mut max_dist, &mut max_via);
            }
            // The bound the allocation works down to: the SLO, or with an unattainable one
            // the best-effort bound (`None`: no subtasks added for latency).
            let target = if lat_max > self.s.slo {
                let best_effort = self
                    .s
                    .best_effort
                    .then_some(lat_max * (1.0 + BEST_EFFORT_MARGIN));
                let mut why = format!(
                    "latency SLO {} s unattainable: even at maximum parallelism the {} bound is {:.4} s{}",
                    self.s.slo,
                    self.percentile_label(),
                    lat_max,
                    self.held_on_path(&p, &w, &held, &max_via, max_end)
                );
                match best_effort {
                    Some(t) => {
                        let _ = write!(
                            why,
                            "; best effort (onUnattainableSlo: bestEffort): the latency allocation aims at {t:.4} s instead, within {:.0} % of that bound",
                            100.0 * BEST_EFFORT_MARGIN
                        );
                    }
                    None => why.push_str("; no subtasks added for latency"),
                }
                // What parallelism cannot shorten: event-time windows' watermark delays (a
                // window's period is not latency: its results count from the window's end).
                if let Some((i, w)) = (0..n)
                    .map(|i| (i, self.window_wait(i)))
                    .filter(|&(_, w)| w > 0.0)
                    .max_by(|a, b| a.1.total_cmp(&b.1))
                {
                    let _ = write!(
                        why,
                        " ({} waits {w:.4} s beyond its windows' ends for the watermark, which no parallelism shortens)",
                        self.name(i)
                    );
                }
                reasons.push(why);
                best_effort
            } else {
                Some(self.s.slo)
            };
            // Best effort follows the load more finely than the sizing does (its target moves
            // with every window's rates): a best-effort allocation that would raise an operator
            // above its current parallelism is not taken while the current parallelism has at
            // least the sizing everywhere and its bound is within the scale-up tolerance above
            // the best-effort bound (the current parallelism holds instead).
            let hold_at = match target {
                Some(t) if t > self.s.slo => self.best_effort_hold(&p, &w, &held, t),
                _ => None,
            };
            if let Some(target) = target.filter(|&t| lat > t) {
                let before = lat;
                let mut st = LatencyState {
                    target,
                    p,
                    w,
                    dist,
                    via,
                    lat,
                    end,
                    added: vec![0u32; n],
                };
                let outcome = self.allocate_latency(&mut st, hold_only);
                let grows =
                    outcome == Allocated::Grew || (0..n).any(|i| st.p[i] > self.est[i].parallelism);
                if let Some(bound) = hold_at.filter(|_| grows) {
                    reasons.push(format!(
                        "best effort: the current parallelism's {} bound {:.4} s is within {:.0} % above the best-effort bound {target:.4} s; held",
                        self.percentile_label(),
                        bound,
                        100.0 * SCALE_UP_TOLERANCE
                    ));
                    p = st.p;
                    for (i, x) in p.iter_mut().enumerate() {
                        let cur = self.est[i].parallelism;
                        if *x != cur {
                            cat!(&mut why[i]; "; held at the current p=", cur, " (best effort within its band)");
                            *x = cur;
                        }
                    }
                    return Some(self.decision(&p, &clamped, why, reasons));
                }
                let added = st.added;
                (p, lat) = (st.p, st.lat);
                match outcome {
                    Allocated::Grew => return None,
                    Allocated::Stuck => {
                        let held: Vec<bool> = (0..n)
                            .map(|i| adjustable(i) && self.held_for_latency(i, p[i]))
                            .collect();
                        reasons.push(format!(
                            "{}: no subtask on the slowest path cuts its {} bound {:.4} s by {:.2e} s or more (a negligible cut, under {:.0e} of the SLO, adds none){}",
                            if target > self.s.slo {
                                format!("best-effort bound {target:.4} s not reached")
                            } else {
                                format!("latency SLO {} s unattainable", self.s.slo)
                            },
                            self.percentile_label(),
                            lat,
                            NEGLIGIBLE_CUT * self.s.slo,
                            NEGLIGIBLE_CUT,
                            self.held_on_path(&p, &st.w, &held, &st.via, st.end)
                        ));
                    }
                    Allocated::Met => {}
                }
                let mut list = String::new();
                for i in (0..n).filter(|&i| added[i] > 0) {
                    if !list.is_empty() {
                        list.push_str(", ");
                    }
                    cat!(&mut list; self.name(i), " +", added[i]);
                }
                let best_effort = target > self.s.slo;
                if !list.is_empty() {
                    let over = if best_effort {
                        format!("best-effort bound {target:.4} s")
                    } else {
                        format!("SLO {} s", self.s.slo)
                    };
                    reasons.push(format!(
                        "latency: {} bound {:.4} s at utilization-sized parallelism exceeds the {over}; greedy marginal allocation added {} → {:.4} s",
                        self.percentile_label(),
                        before,
                        list,
                        lat
                    ));
                }
                for i in 0..n {
                    if added[i] > 0 {
                        cat!(&mut why[i];
                            "; +", added[i],
                            if best_effort {
                                " for latency, best effort (greedy marginal allocation) → p="
                            } else {
                                " for the latency SLO (greedy marginal allocation) → p="
                            },
                            p[i]
                        );
                        if let Some(cs) = self.measured_cs(i) {
                            let _ = write!(why[i], " (measured service cs {cs:.2})");
                        }
                    }
                }
            }
        }
        if hold_only && (0..n).any(|i| p[i] != self.est[i].parallelism) {
            return None;
        }
        Some(self.decision(&p, &clamped, why, reasons))
    }

    /// Assembles a decision for parallelism `p` (indexed like the topology).
    fn decision(
        &self,
        p: &[u32],
        clamped: &[bool],
        why: Vec<String>,
        mut reasons: Vec<String>,
    ) -> Decision {
        let n = self.graph.topo.len();
        let g = &*self.graph;
        self.decided_with.set(Some(self.with_downtime));
        // Every map is built from its entries in name order (the graph's `by_name`): the
        // collection then finds them sorted instead of sorting or inserting one by one.
        let mut why = why;
        // The predicted terms by index as well, for the latency below.
        let (mut mean, mut tail) = (vec![0.0; n], vec![0.0; n]);
        let operators = g.name_map(g.templates.as_ref().map(|t| &t.plans), |i| {
            let e = &self.est[i];
            mean[i] = self.sojourn(i, p[i]);
            tail[i] = self.tail(i, p[i]);
            OperatorPlan {
                kind: Cow::Borrowed(g.kind[i]),
                current_parallelism: e.parallelism,
                parallelism: p[i],
                max_parallelism: self.upper_bound(i),
                observed_input_rate: e.input_rate,
                arrival_rate: self.lambda_target[i],
                steady_arrival_rate: self.lambda_steady[i],
                true_processing_rate: self.mu(i),
                selectivity: e.selectivity,
                selectivity_is_prior: e.selectivity_is_prior,
                observed_utilization: e.utilization,
                backpressured_share: e.backpressured_share,
                predicted_utilization: self.predicted_rho(i, p[i]),
                predicted_sojourn_seconds: mean[i],
                predicted_sojourn_percentile_seconds: tail[i],
                clamped_at_max: clamped[i],
                reason: std::mem::take(&mut why[i]),
            }
        });
        let sources: BTreeMap<Arc<str>, SourcePlan> = g
            .by_name
            .iter()
            .filter_map(|&i| {
                let src = self.est[i].source?;
                Some((
                    g.shared_name(i),
                    SourcePlan {
                        arrival_rate: self.gamma[i],
                        backlog_records: src.backlog_records,
                        target_rate: self.gamma_target[i],
                    },
                ))
            })
            .collect();
        // Bottleneck: highest utilization demanded at the current parallelism.
        let mut bottleneck: Option<(f64, usize)> = None;
        for i in 0..n {
            if let Some(mu) = self.mu(i) {
                let rho = self.lambda_steady[i] / (f64::from(self.est[i].parallelism) * mu);
                if bottleneck.is_none_or(|(b, _)| rho > b) {
                    bottleneck = Some((rho, i));
                }
            }
        }
        let bottleneck = bottleneck.map(|(rho, i)| {
            let e = &self.est[i];
            format!(
                "{}: ρ={} at p={}, μ={} rec/s per subtask (λ={} rec/s at the arrival rate; measured busy {}, backpressured {})",
                self.graph.topo.names[i],
                Fixed(rho, 2),
                e.parallelism,
                fmt_rate(e.true_processing_rate.unwrap_or(0.0)),
                fmt_rate(self.lambda_steady[i]),
                Fixed(e.utilization, 2),
                Fixed(e.backpressured_share, 2)
            )
        });
        let mut d = Decision {
            parallelism: g.name_map(g.templates.as_ref().map(|t| &t.names), |i| p[i]),
            current: g.name_map(g.templates.as_ref().map(|t| &t.shared), |i| {
                self.est[i].parallelism
            }),
            operators,
            sources,
            predicted_latency_seconds: 0.0,
            critical_path: Vec::new(),
            predicted_latency_percentile_seconds: 0.0,
            latency_percentile: self.s.percentile,
            latency_slo_seconds: self.s.slo,
            target_utilization: self.s.rho,
            bottleneck,
            reasons: Vec::new(),
        };
        self.latency_from(&mut d, &mean, &tail);
        reasons.push(format!(
            "predicted end-to-end latency: {} ≤ {} s (union bound) {} SLO {} s along {}; mean {} s",
            self.percentile_label(),
            Fixed(d.predicted_latency_percentile_seconds, 4),
            if d.slo_met() { "≤" } else { ">" },
            Short(self.s.slo),
            d.critical_path.join(" → "),
            Fixed(d.predicted_latency_seconds, 4)
        ));
        d.reasons = reasons;
        d
    }

    fn refresh_latency(&self, d: &mut Decision) {
        let n = self.graph.topo.len();
        let (mut mean, mut tail) = (vec![0.0; n], vec![0.0; n]);
        if let Some(ops) = self.graph.indices_of(&d.operators) {
            for (i, o) in ops {
                mean[i] = o.predicted_sojourn_seconds;
                tail[i] = o.predicted_sojourn_percentile_seconds;
            }
        } else {
            for (i, name) in self.graph.topo.names.iter().enumerate() {
                if let Some(o) = d.operators.get(name.as_str()) {
                    mean[i] = o.predicted_sojourn_seconds;
                    tail[i] = o.predicted_sojourn_percentile_seconds;
                }
            }
        }
        self.latency_from(d, &mean, &tail);
    }

    /// [`Model::refresh_latency`] from the operators' predicted mean sojourn times `mean` and
    /// percentile terms `tail` (indexed like the topology; operators missing from
    /// `d.operators` 0), when the caller has them at hand.
    fn latency_from(&self, d: &mut Decision, mean: &[f64], tail: &[f64]) {
        let n = self.graph.topo.len();
        let (mut dist, mut via) = (Vec::with_capacity(n), Vec::with_capacity(n));
        d.predicted_latency_seconds = self.graph.longest_path_into(mean, &mut dist, &mut via).0;
        let (seconds, end) = self.graph.longest_path_into(tail, &mut dist, &mut via);
        d.predicted_latency_percentile_seconds = seconds;
        // The path's names, reusing those already there when it is the same path (as after
        // the guards' edits, mostly): no string copied and freed per operator.
        let names = &self.graph.topo.names;
        let mut path = Vec::new();
        let mut at = end;
        while at != usize::MAX {
            path.push(at);
            at = via[at];
        }
        path.reverse();
        let same = path.len() == d.critical_path.len()
            && path
                .iter()
                .zip(&d.critical_path)
                .all(|(&i, n)| names[i] == *n);
        if !same {
            d.critical_path.clear();
            d.critical_path
                .extend(path.iter().map(|&i| names[i].clone()));
        }
    }

    /// "p99" for percentile 0.99, "p99.9" for 0.999.
    fn percentile_label(&self) -> String {
        format!("p{}", Short((self.s.percentile * 1e6).round() / 1e4))
    }

    /// Utilization ρ of operator `op`'s busiest subtask at parallelism `p` and the target rate
    /// (catch-up included); `None` for sources, an unknown μ or an unknown operator.
    pub(crate) fn utilization_at(&self, op: &str, p: u32) -> Option<f64> {
        let &i = self.graph.topo.index.get(op)?;
        self.predicted_rho(i, p)
    }

    /// How parallelism `p` (by operator name; missing = current) would run: (highest
    /// predicted utilization ρ at the target rate, with catch-up; highest ρ at the steady rate;
    /// the percentile bound of the slowest path, seconds). Used to weigh a rescale's cost.
    pub(crate) fn assess<K: Borrow<str> + Ord>(&self, p: &BTreeMap<K, u32>) -> (f64, f64, f64) {
        let n = self.graph.topo.len();
        let pv = self.parallelism_by_index(p);
        let (mut rho_target, mut rho_steady) = (0.0f64, 0.0f64);
        for (i, &pi) in pv.iter().enumerate() {
            if let Some(rho) = self.steady_rho(i, pi) {
                rho_steady = rho_steady.max(rho);
                rho_target = rho_target.max(self.predicted_rho(i, pi).unwrap_or(0.0));
            }
        }
        let tail: Vec<f64> = (0..n).map(|i| self.tail(i, pv[i])).collect();
        let (seconds, _) = self
            .graph
            .longest_path_into(&tail, &mut Vec::new(), &mut Vec::new());
        (rho_target, rho_steady, seconds)
    }

    /// The second of [`Model::assess`]'s figures alone (the highest ρ at the steady rate),
    /// without the others' utilizations and tails.
    pub(crate) fn assess_steady_rho<K: Borrow<str> + Ord>(&self, p: &BTreeMap<K, u32>) -> f64 {
        let pv = self.parallelism_by_index(p);
        let mut rho_steady = 0.0f64;
        for (i, &pi) in pv.iter().enumerate() {
            if let Some(rho) = self.steady_rho(i, pi) {
                rho_steady = rho_steady.max(rho);
            }
        }
        rho_steady
    }

    /// Utilization ρ of operator `i`'s busiest subtask at parallelism `p` and the steady
    /// arrival rate (`None` without μ): λ_eff / (p · μ).
    fn steady_rho(&self, i: usize, p: u32) -> Option<f64> {
        self.mu_at(i, p).map(|mu| {
            self.effective_lambda(i, self.lambda_steady[i], p) / (f64::from(p.max(1)) * mu)
        })
    }

    /// Parallelism `p` (by operator name; missing = current) indexed like the topology.
    fn parallelism_by_index<K: Borrow<str> + Ord>(&self, p: &BTreeMap<K, u32>) -> Vec<u32> {
        let n = self.graph.topo.len();
        if let Some(ps) = self.graph.indices_of(p) {
            let mut pv = vec![0; n];
            for (i, &x) in ps {
                pv[i] = x;
            }
            pv
        } else {
            (0..n)
                .map(|i| {
                    p.get(self.name(i))
                        .copied()
                        .unwrap_or(self.est[i].parallelism)
                })
                .collect()
        }
    }

    /// Whether `new` subtasks for operator `op` is a scale-back to the smallest parallelism
    /// measured to give the capacity more subtasks did not raise (an operator flagged for
    /// ineffective scaling, [`super::learn::Ineffective::from`]): a scale-down that removes
    /// no capacity, so a source backlog is no reason to hold it.
    pub(crate) fn scale_back_keeps_capacity(&self, op: &str, new: u32) -> bool {
        self.graph
            .topo
            .index
            .get(op)
            .is_some_and(|&i| self.frozen[i] && self.flat_from[i] > 0 && new >= self.flat_from[i])
    }

    /// Sources' total steady arrival rate γ, records/s.
    pub(crate) fn arrival_rate(&self) -> f64 {
        self.gamma.iter().sum()
    }

    /// Recomputes every prediction of `d`, the decision [`Model::plan`] of this model returned,
    /// after its `parallelism` was edited (by the guards). An operator whose parallelism is
    /// unchanged keeps its predictions while the targets are those they were made with
    /// (recomputing them would give the same values).
    pub(crate) fn refresh_planned(&self, d: &mut Decision) {
        let same = self.decided_with.get() == Some(self.with_downtime);
        let g = &self.graph;
        if g.keys_match(&d.operators) && g.keys_match(&d.parallelism) {
            let n = g.topo.len();
            let (mut mean, mut tail) = (vec![0.0; n], vec![0.0; n]);
            for ((plan, &p), &i) in d
                .operators
                .values_mut()
                .zip(d.parallelism.values())
                .zip(&g.by_name)
            {
                if !(same && plan.parallelism == p) {
                    plan.parallelism = p;
                    plan.predicted_utilization = self.predicted_rho(i, p);
                    plan.predicted_sojourn_seconds = self.sojourn(i, p);
                    plan.predicted_sojourn_percentile_seconds = self.tail(i, p);
                }
                mean[i] = plan.predicted_sojourn_seconds;
                tail[i] = plan.predicted_sojourn_percentile_seconds;
            }
            self.latency_from(d, &mean, &tail);
            return;
        }
        for (name, plan) in d.operators.iter_mut() {
            let Some(&i) = self.graph.topo.index.get(&**name) else {
                continue;
            };
            let p = d
                .parallelism
                .get(&**name)
                .copied()
                .unwrap_or(plan.parallelism);
            plan.parallelism = p;
            plan.predicted_utilization = self.predicted_rho(i, p);
            plan.predicted_sojourn_seconds = self.sojourn(i, p);
            plan.predicted_sojourn_percentile_seconds = self.tail(i, p);
        }
        self.refresh_latency(d);
    }
}

#[cfg(test)]
mod partition_tests;
#[cfg(test)]
mod tests;
