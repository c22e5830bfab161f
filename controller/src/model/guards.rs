//! Guards: the rules by which [`Autoscaler`](super::autoscaler::Autoscaler) decides *when* a
//! plan of [`plan`](super::planner::plan) may be applied, their settings and their memory.
//!
//! Guards, in order: enough samples and history; a stabilization period after every (re)start
//! (warm-up metrics are not representative, as DS2 and the Flink autoscaler note); no
//! scale-down while sources have a backlog (the Flink autoscaler's backlog mode); ignore
//! insignificant changes (HPA-style tolerance); delay scale-downs and then apply the highest
//! recommendation seen over the delay (Flink autoscaler / HPA scale-down stabilization),
//! counting only the metric windows that began after the scale-down was first wanted (a window
//! that straddles a drop in load mixes both rates, and its recommendation would stop the
//! scale-down half-way); scale-ups apply immediately. Time comes in only as `now_s` arguments (seconds on any
//! monotonic clock, the same clock for every call).

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use streamscale_engine::spec::JobSpec;

use super::ModelError;
use super::flaps::FlapHistory;
use super::float_text::{Fixed, cat};
use super::planner::{Decision, Model, OperatorPlan, PlannerSettings};
use super::sample::MetricSample;

/// Guard settings. Times in seconds, backlogs in records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GuardSettings {
    /// Fewest samples in a window before any decision. Default 3.
    pub min_samples: usize,
    /// Least history (seconds from the first to the last sample of the window) before any
    /// decision. Default 15 s.
    pub window_seconds: f64,
    /// No decision within this many seconds after a (re)start reported by
    /// [`Autoscaler::restarted`](crate::model::Autoscaler::restarted). Default 10 s.
    pub stabilization_seconds: f64,
    /// Backlog (records, per source) above which scale-downs are forbidden. `None` (default) =
    /// one second of that source's arrival rate γ.
    pub backlog_threshold_records: Option<f64>,
    /// Smallest change in subtasks that counts (scale-up or scale-down). Default 1: any change.
    pub min_change_subtasks: u32,
    /// Smallest relative scale-down (Δp / p) that counts. Default 0.1 (10%).
    pub min_scale_down_fraction: f64,
    /// Seconds a scale-down must be wanted continuously, in metric windows that began after
    /// it was first wanted, before it applies (so the wait after a drop in load is the window
    /// length plus this delay). The delay runs while the scale-down lookback holds the
    /// scale-down, not after it. 0: scale-downs apply at once. Default 30 s.
    pub scale_down_delay_seconds: f64,
    /// Horizon over which a rescale's benefit is weighed against its cost, seconds (see
    /// [`Autoscaler::decide`](crate::model::Autoscaler::decide)). Default 600 s.
    pub rescale_horizon_seconds: f64,
    /// Settings passed to the planner.
    pub planner: PlannerSettings,
}

impl Default for GuardSettings {
    fn default() -> Self {
        GuardSettings {
            min_samples: 3,
            window_seconds: 15.0,
            stabilization_seconds: 10.0,
            backlog_threshold_records: None,
            min_change_subtasks: 1,
            min_scale_down_fraction: 0.1,
            scale_down_delay_seconds: 30.0,
            rescale_horizon_seconds: 600.0,
            planner: PlannerSettings::default(),
        }
    }
}

/// A scale-down the planner keeps wanting for one operator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingScaleDown {
    /// When the planner first wanted it (seconds, the `now_s` clock).
    pub since_s: f64,
    /// Highest parallelism recommended from the settled windows (those that began at or after
    /// `since_s`) once there is one; before that, the highest recommended since `since_s`.
    pub highest: u32,
    /// When the first settled window's recommendation came (seconds, the `now_s` clock);
    /// `None` while every window since `since_s` still reaches back before it.
    #[serde(default)]
    pub settled_s: Option<f64>,
    /// The settled windows' recommendations as a sliding-window maximum ((seconds on the
    /// `now_s` clock, parallelism), times increasing, parallelism strictly decreasing): all
    /// of them since `settled_s`, or, once the scale-down lookback has held the scale-down
    /// past its delay, those of the last `scaleDownDelaySeconds`.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub recent: VecDeque<(f64, u32)>,
    /// Whether it was held past its delay, by the scale-down lookback or waiting for another
    /// operator's scale-down to make one rescale (`highest` is then over the last
    /// `scaleDownDelaySeconds` only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held_past_delay: bool,
    /// When the scale-down lookback first let part of this scale-down through (seconds, the
    /// `now_s` clock): that partial step waits at most the lookback from then for the rest to
    /// clear, so that a spike's descent is one rescale rather than a step per recommendation
    /// leaving the lookback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_since_s: Option<f64>,
}

/// Memory of the guards between calls.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GuardState {
    /// Time of the last (re)start reported (seconds, the `now_s` clock).
    pub last_restart_s: Option<f64>,
    /// Scale-downs waiting out their delay, per operator.
    pub pending_scale_downs: BTreeMap<String, PendingScaleDown>,
    /// Per operator, the planner's recommendations within the scale-down lookback
    /// (`autoscaler.scaleDownLookbackSeconds`) as a sliding-window maximum: (seconds on the
    /// `now_s` clock, parallelism), times increasing and parallelism strictly decreasing, so
    /// the front is the highest recommendation of the lookback.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub recommended: BTreeMap<String, VecDeque<(f64, u32)>>,
    /// When the rescales of the last hour were decided (seconds, the `now_s` clock), for the
    /// rescale budget (`autoscaler.maxRescalesPerHour`).
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub rescales_s: VecDeque<f64>,
    /// Recent scale-downs and flaps, for the spiky-traffic profile ([`super::flaps`]).
    #[serde(default, skip_serializing_if = "FlapHistory::is_empty")]
    pub flaps: FlapHistory,
}

/// The budget's window: `autoscaler.maxRescalesPerHour` counts the rescales of the last hour.
pub(super) const BUDGET_WINDOW_S: f64 = 3600.0;

/// Sources that export no backlog figure in the window ([`super::estimate::sources_without_backlog`]):
/// planned from their arrivals, so the plan's figure is unknown, not 0 records. Their backlog
/// in `planned` becomes NaN (`null` in JSON), their reason says "backlog unknown", one reason
/// says why; returns them listed as the backlog guard lists backlogged sources (no scale-down
/// while a backlog is unknown). Empty for sources that report it (the usual case).
pub(super) fn unknown_backlogs(
    spec: &JobSpec,
    window: &[MetricSample],
    planned: &mut Decision,
) -> String {
    let unknown = super::estimate::sources_without_backlog(spec, window);
    let mut listed = String::new();
    for n in &unknown {
        if let Some(s) = planned.sources.get_mut(n.as_str()) {
            s.backlog_records = f64::NAN;
        }
        let prefix = format!("source {n}: ");
        for r in planned
            .reasons
            .iter_mut()
            .filter(|r| r.starts_with(&prefix))
        {
            *r = r.replacen(", backlog 0 records", ", backlog unknown", 1);
        }
        planned.reasons.push(format!(
            "source {n}: backlog unknown (it exports no {}): planned from its arrival rate without a catch-up, no scale-down while its backlog is unknown",
            crate::scrape::SOURCE_BACKLOG
        ));
        if !listed.is_empty() {
            listed.push_str(", ");
        }
        let _ = write!(listed, "{n} (backlog unknown)");
    }
    listed
}

/// The rescale budget (`autoscaler.maxRescalesPerHour`, 0 = none): `Some(reason)` when the
/// rescales decided in the last hour already fill it and the current parallelism can keep
/// up (its busiest operator below ρ = 1 at the target rate, backlog drain included, and the
/// latency bound within the SLO); a job falling behind is rescaled whatever the budget.
/// `times` are the rescales decided so far ([`GuardState::rescales_s`]); those older than an
/// hour are dropped from it.
pub(super) fn over_budget(
    times: &mut VecDeque<f64>,
    now_s: f64,
    now: &mut NowAssessment,
    model: &Model,
    planned: &Decision,
    spec: &JobSpec,
) -> Option<String> {
    let budget = spec.autoscaler.max_rescales_per_hour;
    while times.front().is_some_and(|&t| t <= now_s - BUDGET_WINDOW_S) {
        times.pop_front();
    }
    if budget == 0 || times.len() < budget as usize {
        return None;
    }
    let (rho_now, _, tail_now) = now.get(model, &planned.current);
    if rho_now >= 1.0 || tail_now > planned.latency_slo_seconds {
        return None;
    }
    let next = times.front().map_or(0.0, |&t| t + BUDGET_WINDOW_S - now_s);
    Some(format!(
        "rescale budget: {} rescales in the last hour, autoscaler.maxRescalesPerHour {budget}; the next in {} s unless the job falls behind (now ρ {} at the target rate, p{} bound {} s vs SLO {} s)",
        times.len(),
        Fixed(next, 0),
        Fixed(rho_now, 2),
        (planned.latency_percentile * 100.0).round(),
        Fixed(tail_now, 3),
        planned.latency_slo_seconds
    ))
}

/// The current parallelism's assessment ([`Model::assess`]: ρ at the target rate, steady ρ,
/// latency bound in seconds), computed at most once per decision however many guards ask.
#[derive(Debug, Default)]
pub(super) struct NowAssessment(Option<(f64, f64, f64)>);

impl NowAssessment {
    /// The assessment of `current` under `model` (the same model and parallelism on every call
    /// of one decision).
    pub(super) fn get(
        &mut self,
        model: &Model,
        current: &BTreeMap<Arc<str>, u32>,
    ) -> (f64, f64, f64) {
        *self.0.get_or_insert_with(|| model.assess(current))
    }
}

/// `Some((parallelism, note))` when an operator runs at `cur` outside its bounds (`scaling.min`,
/// `scaling.max`; a Flink vertex's `min`/`max` in the settings file; [`Model::bounds_of`]) and the
/// plan's `new` brings it inside them: below the lower bound it moves to `new`, above the upper
/// bound to the bound (a scale-down further than that waits for the usual guards). Such a change
/// is made at the next decision whatever the band, the smallest change, the scale-down delay,
/// the lookback, the rescale budget and the rescale's cost say (as Kubernetes' HPA enforces
/// `minReplicas`/`maxReplicas`); the guards that protect the decision itself (enough samples,
/// stabilization, backoff) still apply.
pub(super) fn bounds_force((min, max): (u32, u32), cur: u32, new: u32) -> Option<(u32, String)> {
    if cur < min && new >= min {
        let note = format!("{cur}→{new}: p={cur} is below its lower bound {min} (scaling.min)");
        return Some((new, note));
    }
    if cur > max && new <= max {
        let note = format!("{cur}→{max}: p={cur} is above its upper bound {max} (scaling.max)");
        return Some((max, note));
    }
    None
}

/// The utilization band (`autoscaler.minUtilization`, `autoscaler.maxUtilization`, see
/// [`AutoscalerSpec::utilization_band`](streamscale_engine::spec::AutoscalerSpec::utilization_band)),
/// the rule by which small moves of the load cost no rescale: an operator whose busiest subtask
/// runs inside the band at its current parallelism and the target rate (the current backlog's
/// catch-up included, not the backlog of the rescale's own downtime: [`Model::utilization_at`]) is
/// not rescaled on its own; a scale-up needs ρ above the upper end (or the latency bound over
/// the SLO), a scale-down ρ below the lower end (or above the upper end: more subtasks did not
/// help). Once one operator leaves the band, the rescale moves every operator to its plan (a
/// rescale restarts the whole job, so the others move at no extra cost). An operator without
/// a utilization (unknown μ, a source) is never held by the band.
#[derive(Debug, Clone)]
pub(super) struct Band {
    low: f64,
    high: f64,
    /// The latency SLO, seconds.
    slo: f64,
}

impl Band {
    /// The band (lower, upper) in force ([`super::flaps::Profile::band`]), for a decision whose
    /// SLO is `slo` seconds.
    pub(super) fn new((low, high): (f64, f64), slo: f64) -> Band {
        Band { low, high, slo }
    }

    /// `Some(note)` when the change `cur → new` of operator `op` stays inside the band
    /// (`current`: the job's current parallelism, whose latency bound a scale-up needs).
    pub(super) fn holds(
        &self,
        now: &mut NowAssessment,
        model: &Model,
        current: &BTreeMap<Arc<str>, u32>,
        op: &str,
        cur: u32,
        new: u32,
    ) -> Option<String> {
        let rho = model.utilization_at(op, cur)?;
        if !(self.low..=self.high).contains(&rho) {
            return None;
        }
        if new > cur && now.get(model, current).2 > self.slo {
            return None;
        }
        let what = if new > cur { "scale-up" } else { "scale-down" };
        Some(format!(
            "{what} {cur}→{new} held: ρ {} at {cur} is inside the utilization band",
            Fixed(rho, 2)
        ))
    }

    /// "within the utilization band [low, high] (...)", the head of a hold's reason.
    pub(super) fn describe(&self) -> String {
        format!(
            "within the utilization band [{}, {}] (autoscaler.minUtilization, autoscaler.maxUtilization)",
            Fixed(self.low, 2),
            Fixed(self.high, 2)
        )
    }
}

/// The parallelism operator `o` needs at the sources' steady rate (no backlog catch-up) at
/// the target utilization `rho`: ⌈λ_steady / (ρ · μ)⌉, at least 1; its planned parallelism
/// when μ is unknown. What the scale-down lookback remembers: a scale-up sized to drain a
/// spike's backlog does not hold the job at that size for the whole lookback.
pub(super) fn steady_need(o: &OperatorPlan, rho: f64) -> u32 {
    match o.true_processing_rate {
        Some(mu) if mu > 0.0 && rho > 0.0 => {
            let x = o.steady_arrival_rate / (rho * mu);
            if x.is_finite() {
                (x * (1.0 - 1e-9)).ceil().clamp(1.0, f64::from(u32::MAX)) as u32
            } else {
                o.parallelism
            }
        }
        _ => o.parallelism,
    }
}

/// Adds the recommendation `p` of operator `name` at `now_s` to the sliding-window maximum of
/// `lookback` seconds (see [`GuardState::recommended`]): drops what is older than the
/// lookback and what `p` dominates.
pub(super) fn remember(
    recommended: &mut BTreeMap<String, VecDeque<(f64, u32)>>,
    name: &str,
    now_s: f64,
    p: u32,
    lookback: f64,
) {
    let h = match recommended.get_mut(name) {
        Some(h) => h,
        None => recommended.entry(name.to_string()).or_default(),
    };
    while h.front().is_some_and(|&(t, _)| t < now_s - lookback) {
        h.pop_front();
    }
    while h.back().is_some_and(|&(_, q)| q <= p) {
        h.pop_back();
    }
    h.push_back((now_s, p));
}

/// The end of a guard's note on a change below the change threshold.
pub(super) const IGNORED: &[&str] = &[" below the change threshold, ignored"];

/// A guard's note on a change of one operator's parallelism: `"{what} {cur}→{new}"` and then
/// the pieces of `rest`; the text of `format!` without its machinery (a decision of a large
/// job writes one per operator the guards hold).
pub(super) fn change_note(what: &str, cur: u32, new: u32, rest: &[&str]) -> String {
    let mut s =
        String::with_capacity(what.len() + 24 + rest.iter().map(|r| r.len()).sum::<usize>());
    cat!(&mut s; what, " ", cur, "→", new);
    for r in rest {
        s.push_str(r);
    }
    s
}

/// Appends each guard note (operator, note; in name order, as the guards make them) to its
/// operator's reason: one merge of the two name-ordered lists instead of a lookup per note.
pub(super) fn append_guard_notes(
    operators: &mut BTreeMap<Arc<str>, OperatorPlan>,
    notes: &[(String, String)],
) {
    let mut ops = operators.iter_mut().peekable();
    for (op, note) in notes {
        while ops.next_if(|(k, _)| &***k < op.as_str()).is_some() {}
        // Peeked, not taken: a second note on the same operator appends too.
        if let Some((k, plan)) = ops.peek_mut()
            && &***k == op.as_str()
        {
            plan.reason.push_str("; guard: ");
            plan.reason.push_str(note);
        }
    }
}

/// `"{op}: {note}"`, a guard's note as one of the decision's reasons.
pub(super) fn op_note(op: &str, note: &str) -> String {
    let mut s = String::with_capacity(op.len() + 2 + note.len());
    s.push_str(op);
    s.push_str(": ");
    s.push_str(note);
    s
}

/// Puts the plan's parallelism back into `parallelism` after the guards edited it in place:
/// `values` are its values in name order from before the edit (the keys are never changed).
pub(super) fn restore(parallelism: &mut BTreeMap<String, u32>, values: &[u32]) {
    for (p, &v) in parallelism.values_mut().zip(values) {
        *p = v;
    }
}

/// Why a rescale made only of scale-downs waits, if it does: another operator's scale-down is
/// held only for time (its delay or the lookback) and due within `window_s` (the scale-down
/// lookback or delay in force), so that both are made in one rescale instead of two. `ready`:
/// the operators whose scale-down would be applied now, with when their delay ended; `due`:
/// (operator, current, planned, when it is due), seconds on the `now_s` clock. No wait when
/// any operator grows (`planned` or a change held in the band, `in_band`), when a ready
/// scale-down has already waited `window_s`, or when `window_s` is 0. `Some((reason, due))`:
/// `due` is when the awaited scale-down is due, on the `now_s` clock.
pub(super) fn merge_scale_downs(
    now_s: f64,
    window_s: f64,
    planned: &Decision,
    in_band: &[(String, u32, String)],
    ready: &[(String, f64)],
    due: &[(String, u32, u32, f64)],
) -> Option<(String, f64)> {
    if window_s <= 0.0 || ready.is_empty() || due.is_empty() {
        return None;
    }
    let cur = |op: &str| planned.current.get(op).copied();
    let grows = planned
        .parallelism
        .iter()
        .map(|(op, &p)| (op, p))
        .chain(in_band.iter().map(|(op, p, _)| (op, *p)))
        .any(|(op, p)| cur(op).is_some_and(|c| p > c));
    if grows || ready.iter().any(|(_, since)| now_s - since >= window_s) {
        return None;
    }
    let (op, from, to, at) = due
        .iter()
        .filter(|d| d.3 - now_s <= window_s)
        .min_by(|a, b| a.3.total_cmp(&b.3))?;
    let moves: Vec<String> = ready
        .iter()
        .filter_map(|(o, _)| {
            let (c, p) = (cur(o)?, *planned.parallelism.get(o)?);
            (p < c).then(|| format!("{o} {c}→{p}"))
        })
        .collect();
    let why = format!(
        "scale-down {} waits {} s for {op}'s scale-down {from}→{to}: one rescale instead of two (a scale-down waits at most {} s, the scale-down lookback or delay, for another to join it)",
        moves.join(", "),
        Fixed((at - now_s).max(0.0), 0),
        Fixed(window_s, 0)
    );
    Some((why, at.max(now_s)))
}

/// Whether rescaling from the current parallelism to `guarded` is worth its cost, with the
/// reason either way (`Err` = hold).
///
/// Cost: the job stops for the expected downtime D (the lower median of the last measured
/// rescales, [`Autoscaler::observe_rescale_downtime`], or the configured
/// `planner.rescaleDowntimeSeconds` until then; 0 = free). Its backlog D·γ drains at the new
/// parallelism's spare capacity in T = D·ρ/(1 − ρ) (fluid: the slowest operator at steady
/// utilization ρ takes γ/ρ, so the backlog shrinks at γ(1/ρ − 1)); for D + T seconds records
/// are late. The planner already sizes scale-ups to drain that backlog within the catch-up
/// time (the downtime is part of the sources' target rate).
///
/// * Scale-up (any operator grows): one that still cannot keep up (ρ ≥ 1 at the new
///   parallelism) goes ahead when it lowers ρ: the backlog grows slower. Otherwise the
///   benefit is the violation avoided over the horizon H:
///   H seconds when the current parallelism violates the utilization target at the target
///   rate (with catch-up) or the latency SLO's percentile bound, else 0. The reason says
///   which: time over the utilization target alone is not called SLO violation. Rescale when the
///   benefit exceeds the D + T seconds of violation the rescale causes. A scale-up for latency
///   alone whose plan still exceeds the SLO (`onUnattainableSlo: bestEffort`, or an allocation
///   stuck above it) avoids no violation but cuts the bound, which best effort asks for: it
///   counts H as well, and its reason says the SLO stays unmet.
/// * Scale-down: the benefit is the subtask-seconds saved over H, (P_now − P_new)·H; the cost
///   is the whole job's output for D + T seconds, P_now·(D + T) subtask-seconds.
pub(super) fn rescale_worth_its_cost(
    now: &mut NowAssessment,
    model: &Model,
    planned: &Decision,
    guarded: &BTreeMap<String, u32>,
    g: &GuardSettings,
) -> Result<String, String> {
    let downtime = g.planner.rescale_downtime_seconds.unwrap_or(0.0).max(0.0);
    let horizon = g.rescale_horizon_seconds;
    let rho_new = model.assess_steady_rho(guarded);
    let drain = if downtime == 0.0 {
        0.0
    } else if rho_new < 1.0 {
        downtime * rho_new / (1.0 - rho_new)
    } else {
        f64::INFINITY
    };
    let cost_s = downtime + drain;
    let backlog = downtime * model.arrival_rate();
    let cost = format!(
        "rescale cost: downtime {} s × γ {} rec/s = {} records, drained in {} s at the new parallelism (ρ {})",
        Fixed(downtime, 1),
        Fixed(model.arrival_rate(), 1),
        Fixed(backlog, 0),
        Fixed(drain, 1),
        Fixed(rho_new, 2)
    );
    let up = guarded
        .iter()
        .any(|(k, p)| planned.current.get(k.as_str()).is_some_and(|c| p > c));
    if up {
        let (rho_target_now, rho_steady_now, tail_now) = now.get(model, &planned.current);
        // A scale-up that cannot keep up either (at the slot limit or `scaling.max`, under a
        // load above the most the job can have) never drains its own downtime's backlog, but
        // it slows the backlog's growth: worth it when it adds capacity (it was held as
        // "drained in inf s", and the overload went on at the smaller parallelism).
        if rho_new >= 1.0 && rho_new < rho_steady_now {
            return Ok(format!(
                "{cost}; the new parallelism cannot keep up either (ρ {} at the steady rate, now {}), but the backlog grows slower: worth its {} s of downtime",
                Fixed(rho_new, 2),
                Fixed(rho_steady_now, 2),
                Fixed(downtime, 1)
            ));
        }
        let violates = rho_target_now > planned.target_utilization * (1.0 + 1e-9)
            || tail_now > planned.latency_slo_seconds;
        let benefit = if violates { horizon } else { 0.0 };
        // A scale-up for latency alone whose plan still exceeds the SLO (best effort, or an
        // allocation stuck above it) avoids no violation; it cuts the bound, and counts the
        // horizon as its benefit all the same (what `onUnattainableSlo: bestEffort` asks for).
        let latency_only = rho_target_now <= planned.target_utilization * (1.0 + 1e-9)
            && tail_now > planned.latency_slo_seconds
            && !planned.slo_met();
        let gain = if latency_only {
            format!(
                "scale-up cuts the {} bound {} → {} s, still over the SLO (best effort: counted as {} s of violation avoided",
                format_args!("p{}", (planned.latency_percentile * 100.0).round()),
                Fixed(tail_now, 4),
                Fixed(planned.predicted_latency_percentile_seconds, 4),
                Fixed(benefit, 0)
            )
        } else if tail_now > planned.latency_slo_seconds || !violates {
            format!("scale-up avoids {} s of SLO violation", Fixed(benefit, 0))
        } else {
            // Over the utilization target with the SLO's bound still met: the time counted is
            // time without the headroom the target keeps, not time over the SLO.
            format!(
                "scale-up avoids {} s over the utilization target (the SLO's bound is met)",
                Fixed(benefit, 0)
            )
        };
        let verdict = format!(
            "{cost}; {gain} over the {} s horizon{} (now: ρ {} vs target {}, {} bound {} s vs SLO {} s) vs {} s late during the rescale",
            Fixed(horizon, 0),
            if latency_only { ")" } else { "" },
            Fixed(rho_target_now, 2),
            Fixed(planned.target_utilization, 2),
            format_args!("p{}", (planned.latency_percentile * 100.0).round()),
            Fixed(tail_now, 4),
            planned.latency_slo_seconds,
            Fixed(cost_s, 1)
        );
        return if benefit > cost_s || cost_s == 0.0 {
            Ok(format!("{verdict}: worth it"))
        } else {
            Err(format!("rescale not worth its cost: {verdict}"))
        };
    }
    let now: u64 = planned.current.values().map(|&p| u64::from(p)).sum();
    let new: u64 = guarded.values().map(|&p| u64::from(p)).sum();
    let saved = now.saturating_sub(new) as f64 * horizon;
    let spent = now as f64 * cost_s;
    let verdict = format!(
        "{cost}; scale-down saves {} subtasks × {} s = {} subtask-s vs the job's {now} subtasks × {} s late = {} subtask-s",
        now.saturating_sub(new),
        Fixed(horizon, 0),
        Fixed(saved, 0),
        Fixed(cost_s, 1),
        Fixed(spent, 0)
    );
    if saved > spent || cost_s == 0.0 {
        Ok(format!("{verdict}: worth it"))
    } else {
        Err(format!("rescale not worth its cost: {verdict}"))
    }
}

/// The samples of `window` to keep after `err`, when `err` says the metric set is incomplete:
/// drops the scrape that lacks an operator, a subtask, a source's backlog or arrivals, or has an
/// invalid value; after a counter reset keeps the samples from the reset on. `None` when `err`
/// is not about incomplete metrics (nothing to repair).
pub(super) fn drop_incomplete(
    window: &[MetricSample],
    err: &ModelError,
) -> Option<Vec<MetricSample>> {
    let drop_one = |k: usize| -> Vec<MetricSample> {
        window
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != k)
            .map(|(_, s)| s.clone())
            .collect()
    };
    match *err {
        ModelError::MissingOperator { sample, .. }
        | ModelError::NoSubtasks { sample, .. }
        | ModelError::ParallelismChanged { sample, .. }
        | ModelError::MissingSubtask { sample, .. }
        | ModelError::InvalidValue { sample, .. }
        | ModelError::SourceWithoutBacklog { sample, .. } => Some(drop_one(sample)),
        ModelError::CounterReset { sample, .. } => Some(window.get(sample..)?.to_vec()),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
