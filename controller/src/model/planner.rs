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
mod assess;
mod buffers;
mod build;
mod decision;
mod explain;
#[cfg(test)]
mod failure_cases;
mod graph;
mod key_groups;
mod keyed;
mod learned;
mod memo;
mod rates;
mod settings;
mod sizing;
mod slo;
mod sojourn;

use buffers::*;
pub(crate) use explain::fmt_rate;
pub(crate) use graph::JobGraph;
use key_groups::*;
pub use key_groups::{key_group_load, key_group_load_with_hot};
use keyed::*;
pub use keyed::{HOT_KEY_GROUP_FACTOR, HOT_KEY_ISOLATION, HOT_KEY_RELEASE, SATURATED};
pub use rates::MIN_SELECTIVITY_RECORDS;
use rates::*;
pub use sizing::SCALE_UP_TOLERANCE;
use sizing::*;
pub use slo::{BEST_EFFORT_MARGIN, NEGLIGIBLE_CUT};
use sojourn::*;

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
    /// (L = [`Model::kg_len`]) and `share_memo[s·(K+1)..(s+1)·(K+1)]` (K key groups).
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

impl Model {
    pub(crate) fn new(
        spec: &JobSpec,
        window: &[MetricSample],
        settings: &PlannerSettings,
    ) -> Result<Model, ModelError> {
        Model::with_graph(Arc::new(JobGraph::new(spec)?), spec, window, None, settings)
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

    fn name(&self, i: usize) -> &str {
        &self.graph.topo.names[i]
    }
}

#[cfg(test)]
mod partition_tests;
#[cfg(test)]
mod tests;
