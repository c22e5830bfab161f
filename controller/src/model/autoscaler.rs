//! The autoscaler's front door: [`Autoscaler::decide`] evaluates a metric window, plans every
//! operator's parallelism ([`plan`](super::planner::plan)) and applies the guards of
//! [`super::guards`], returning a [`Verdict`]. Pure: state changes only through its methods,
//! time only through arguments.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use streamscale_engine::spec::JobSpec;

use super::ModelError;
use super::flaps::Profile;
use super::float_text::Fixed;
use super::forecast::{self, ForecastConfig, RateHistory};
use super::guards::{
    Band, GuardSettings, GuardState, IGNORED, NowAssessment, PendingScaleDown, append_guard_notes,
    bounds_force, change_note, drop_incomplete, merge_scale_downs, op_note, over_budget, remember,
    rescale_worth_its_cost, restore, steady_need, unknown_backlogs,
};
use super::learn::ScalabilityTracker;
use super::planner::{Decision, JobGraph, Model};
use super::sample::MetricSample;
use super::shed::{LimitPlan, limit_plan};

/// What to do now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// Rescale the job to `parallelism` of the decision (guards already applied).
    Rescale(Decision),
    /// Keep the current parallelism.
    Hold {
        /// Why, in words.
        reason: String,
        /// The planner's unguarded decision, when one was computed.
        recommendation: Option<Decision>,
    },
}

/// The guarded autoscaling policy: [`plan`](super::planner::plan) plus the guards in the
/// module docs. Pure: state changes only through its methods, time only through arguments.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Autoscaler {
    settings: GuardSettings,
    state: GuardState,
    cache: GraphCache,
    /// Scalability factors and ineffective-scaling flags learned from past rescales.
    learned: ScalabilityTracker,
    /// The job's input-rate history for forecasting ([`super::forecast`]).
    history: RateHistory,
    /// The limit decision of the last call ([`super::shed`]), when a limit bound.
    limit: Option<LimitPlan>,
    /// Whether the last call's verdict depended on the guards' history (the scale-down
    /// lookback limited a scale-down, or the rescale budget held a rescale).
    used_history: bool,
    /// What the last [`Autoscaler::decide`] added to the scale-down lookback, per operator in
    /// name order (empty when the lookback was off or no plan was made).
    lookback_needs: Vec<u32>,
    /// The last [`DOWNTIMES_KEPT`] measured rescale downtimes, seconds, oldest first.
    downtimes: VecDeque<f64>,
    /// When the last call's hold expects to act (seconds on its clock), if it said so.
    hold_due_s: Option<f64>,
}

/// How many measured rescale downtimes [`Autoscaler::observe_rescale_downtime`] keeps.
pub const DOWNTIMES_KEPT: usize = 5;

/// The expected rescale downtime from measured ones (seconds, any order): the lower median,
/// the middle value or, of an even count, the smaller of the two middle ones. One slow outlier
/// (a Flink job's first in-place rescale, which brings up its slots) does not set the cost
/// until slow rescales are the majority; `None` for no measurement.
pub fn expected_downtime(measured: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = measured.into_iter().collect();
    v.sort_by(f64::total_cmp);
    let mid = v.len().checked_sub(1)? / 2;
    v.get(mid).copied()
}

/// The job graph's derived model from the last call, reused while the spec's graph (operators,
/// kinds, scaling bounds, edges, maxParallelism) is unchanged. A pure memo: it never changes a
/// decision, so it takes no part in equality.
#[derive(Debug, Clone, Default)]
struct GraphCache(Option<Arc<JobGraph>>);

impl PartialEq for GraphCache {
    fn eq(&self, _: &GraphCache) -> bool {
        true
    }
}

impl GraphCache {
    fn get(&mut self, spec: &JobSpec) -> Result<Arc<JobGraph>, ModelError> {
        if let Some(g) = self.0.as_ref().filter(|g| g.matches(spec)) {
            return Ok(Arc::clone(g));
        }
        let g = Arc::new(JobGraph::new(spec)?.with_templates());
        self.0 = Some(Arc::clone(&g));
        Ok(g)
    }
}

fn hold(reason: String) -> Verdict {
    Verdict::Hold {
        reason,
        recommendation: None,
    }
}

impl Autoscaler {
    /// A policy with these settings and a fresh state (no restart reported yet: no
    /// stabilization wait until [`Autoscaler::restarted`] is called).
    pub fn new(settings: GuardSettings) -> Autoscaler {
        Autoscaler {
            settings,
            state: GuardState::default(),
            cache: GraphCache::default(),
            learned: ScalabilityTracker::default(),
            history: RateHistory::default(),
            limit: None,
            used_history: false,
            lookback_needs: Vec::new(),
            downtimes: VecDeque::new(),
            hold_due_s: None,
        }
    }

    /// When the last [`Autoscaler::decide`]'s hold expects to act, seconds on the `now_s`
    /// clock: the due time of the scale-down a waiting scale-down joins (`scale-down … waits
    /// N s for …`); `None` for a verdict that names no such time. A caller that says a hold
    /// once says it again when this moves later (the wait it announced grew).
    pub fn hold_due_s(&self) -> Option<f64> {
        self.hold_due_s
    }

    /// Whether the last [`Autoscaler::decide`] depended on the guards' history: the scale-down
    /// lookback limited a scale-down or the rescale budget held a rescale back. A verdict
    /// that did not is a function of the window and the settings alone.
    pub fn used_history(&self) -> bool {
        self.used_history
    }

    /// What the last [`Autoscaler::decide`] added to the scale-down lookback (each operator's
    /// steady need, in name order; empty when none): what [`Autoscaler::repeat_recommendation`]
    /// takes for a repeat of that decision.
    pub fn lookback_needs(&self) -> &[u32] {
        &self.lookback_needs
    }

    /// Records, at `now_s`, what a decision added to the scale-down lookback
    /// ([`Autoscaler::lookback_needs`], in name order) for a decision made again without calling
    /// [`Autoscaler::decide`] (a caller that knows the window repeats one already decided), so
    /// that the scale-down lookback sees it as if it had been made.
    pub fn repeat_recommendation(&mut self, now_s: f64, recommended: &[u32], spec: &JobSpec) {
        let lookback = self.profile(now_s, spec).memory_s;
        let names: Vec<String> = self.state.recommended.keys().cloned().collect();
        if names.len() != recommended.len() {
            return;
        }
        for (name, &p) in names.iter().zip(recommended) {
            remember(&mut self.state.recommended, name, now_s, p, lookback);
        }
    }

    /// The limit decision of the last [`Autoscaler::decide`] (capacity, load, shed share under
    /// `autoscaler.limits`), `None` when no limit bound or no plan was made. See [`super::shed`].
    pub fn limit_plan(&self) -> Option<&LimitPlan> {
        self.limit.as_ref()
    }

    /// The input-rate history the forecast learns from (see [`super::forecast`]); persist it
    /// and hand it back with [`Autoscaler::set_rate_history`] after a restart.
    pub fn rate_history(&self) -> &RateHistory {
        &self.history
    }

    /// Replaces the input-rate history (e.g. one loaded from a file, moved to this clock with
    /// [`RateHistory::shifted`]).
    pub fn set_rate_history(&mut self, history: RateHistory) {
        self.history = history;
    }

    /// The settings.
    pub fn settings(&self) -> &GuardSettings {
        &self.settings
    }

    /// The guards' memory.
    pub fn state(&self) -> &GuardState {
        &self.state
    }

    /// What was learned from past rescales: per-operator scalability factors (measured μ per
    /// subtask / predicted, smoothed, within [0.25, 1.5]) and ineffective-scaling flags. See
    /// [`super::learn`].
    pub fn scalability(&self) -> &ScalabilityTracker {
        &self.learned
    }

    /// Replaces what was learned from past rescales (e.g. one persisted before a restart).
    pub fn set_scalability(&mut self, learned: ScalabilityTracker) {
        self.learned = learned;
    }

    /// The job's recent scale-downs and flaps, for the spiky-traffic profile
    /// ([`super::flaps`]), times on this autoscaler's clock.
    pub fn flaps(&self) -> &super::flaps::FlapHistory {
        &self.state.flaps
    }

    /// Replaces them (e.g. ones persisted before a restart, moved to this clock with
    /// [`super::flaps::FlapHistory::shifted`]).
    pub fn set_flaps(&mut self, flaps: super::flaps::FlapHistory) {
        self.state.flaps = flaps;
    }

    /// Reports that the job (re)started at `now_s` (seconds): starts the stabilization period
    /// and forgets pending scale-downs (they were measured on the old deployment).
    pub fn restarted(&mut self, now_s: f64) {
        self.state.last_restart_s = Some(now_s);
        self.state.pending_scale_downs.clear();
    }

    /// Records the measured downtime (seconds) of a completed rescale; a value that is not a
    /// finite number >= 0 is ignored. The expected downtime (`planner.rescaleDowntimeSeconds`,
    /// replacing a configured one) becomes [`expected_downtime`] of the last
    /// [`DOWNTIMES_KEPT`] measurements: the planner sizes scale-ups to drain the backlog a
    /// rescale creates (downtime × γ) within the catch-up time, the guards weigh a rescale's
    /// cost and set the scale-down lookback by it.
    pub fn observe_rescale_downtime(&mut self, seconds: f64) {
        if !(seconds.is_finite() && seconds >= 0.0) {
            return;
        }
        if self.downtimes.len() == DOWNTIMES_KEPT {
            self.downtimes.pop_front();
        }
        self.downtimes.push_back(seconds);
        self.settings.planner.rescale_downtime_seconds =
            expected_downtime(self.downtimes.iter().copied());
    }

    /// The measured rescale downtimes kept (the last [`DOWNTIMES_KEPT`], seconds, oldest
    /// first): persist them and replay them through
    /// [`Autoscaler::observe_rescale_downtime`] after a restart.
    pub fn measured_downtimes(&self) -> impl ExactSizeIterator<Item = f64> + '_ {
        self.downtimes.iter().copied()
    }

    /// The guard settings in force at `now_s` for `spec`: the spiky-traffic profile
    /// ([`super::flaps`]) when the job's recent rescales flapped, else the job's settings.
    pub fn profile(&self, now_s: f64, spec: &JobSpec) -> Profile {
        Profile::of(
            &spec.autoscaler,
            self.settings.planner.rescale_downtime_seconds,
            self.state.flaps.spiky(now_s),
        )
    }

    /// Decides at `now_s` (seconds) from a metric window (oldest first) of the job `spec`.
    /// Never fails: every problem (too little data, a planning error) is a
    /// [`Verdict::Hold`] with the reason.
    ///
    /// An incomplete metric set (an operator or subtask missing from a scrape, a counter
    /// reset, a source without `source_backlog`/`source_arrivals`, an invalid value) is planned
    /// from the complete samples only (the offending scrape dropped; after a reset, the samples
    /// from the reset on) when at least two remain, and then allows no scale-down; the reason
    /// names what was missing ("incomplete metrics (...)"). Missing backlog is never read as 0.
    ///
    /// Every call that gets as far as a model also feeds the learned correction
    /// ([`super::learn`]): a change of an operator's observed parallelism since the previous
    /// call is taken as a rescale, its measured μ per subtask is compared with the prediction,
    /// the operator's scalability factor is updated and applied to this decision, and an
    /// operator whose total capacity did not grow is flagged "ineffective scaling" in the
    /// reasons and not scaled up again until its μ or input changes by more than 20%.
    pub fn decide(&mut self, now_s: f64, window: &[MetricSample], spec: &JobSpec) -> Verdict {
        let g = &self.settings;
        self.used_history = false;
        self.hold_due_s = None;
        self.lookback_needs.clear();
        // Forecasting (`autoscaler.forecast`): every window feeds the rate history; with mode
        // `on` a usable forecast above the measured rate raises the sources' rates planned for.
        self.limit = None;
        let fc = ForecastConfig::of(spec);
        if let Some(cfg) = &fc {
            self.history.observe(cfg, window, spec);
        }
        if window.len() < g.min_samples.max(2) {
            return hold(format!(
                "waiting for data: {} of {} metric samples",
                window.len(),
                g.min_samples.max(2)
            ));
        }
        let span = window[window.len() - 1].at_seconds - window[0].at_seconds;
        if span.is_nan() || span < g.window_seconds {
            // Rounded down: 14.96 s short of 15 s must not read "spans 15.0 s, need 15 s".
            return hold(format!(
                "waiting for data: the window spans {:.1} s, need {} s",
                (span * 10.0).floor() / 10.0,
                g.window_seconds
            ));
        }
        if let Some(t) = self.state.last_restart_s {
            let since = now_s - t;
            if since < g.stabilization_seconds {
                return hold(format!(
                    "stabilizing: {since:.1} s since the last (re)start, need {} s",
                    g.stabilization_seconds
                ));
            }
        }
        let graph = match self.cache.get(spec) {
            Ok(graph) => graph,
            Err(e) => return hold(format!("cannot plan: {e}")),
        };
        let advice = fc.as_ref().and_then(|cfg| {
            let measured = forecast::measured_rate(window, spec)?;
            let downtime = g.planner.rescale_downtime_seconds.unwrap_or(0.0);
            Some(self.history.advise(cfg, now_s, measured, downtime))
        });
        // A usable forecast scales the sources' arrivals in the window
        // ([`forecast::scale_arrivals`]); the model reads them scaled in place, and the scaled
        // copy is made only when an incomplete window is repaired from it.
        let factor = advice.as_ref().and_then(|a| a.factor);
        // An incomplete metric set (a subtask or operator missing from a scrape, a counter
        // reset, a source without a backlog figure) is planned from the complete samples only,
        // and then may scale up but never down: a missing figure is not read as zero.
        let mut repaired: Option<Vec<MetricSample>> = None;
        let mut incomplete: Vec<String> = Vec::new();
        let mut model = loop {
            let (w, scale) = match &repaired {
                Some(kept) => (kept.as_slice(), None),
                None => (window, factor),
            };
            match Model::with_graph(Arc::clone(&graph), spec, w, scale, &g.planner) {
                Ok(m) => break m,
                Err(e) => {
                    let scaled;
                    let w = match scale {
                        Some(f) => {
                            scaled = forecast::scale_arrivals(w, spec, f);
                            scaled.as_slice()
                        }
                        None => w,
                    };
                    let Some(kept) = drop_incomplete(w, &e) else {
                        return hold(format!("cannot plan: {e}"));
                    };
                    let span = kept.last().map_or(0.0, |l| l.at_seconds)
                        - kept.first().map_or(0.0, |f| f.at_seconds);
                    if kept.len() < 2 || span.is_nan() || span <= 0.0 {
                        return hold(format!(
                            "cannot plan: {e}; fewer than 2 complete metric samples remain"
                        ));
                    }
                    incomplete.push(e.to_string());
                    repaired = Some(kept);
                }
            }
        };
        let learned_notes = {
            let (now, by_name) = model.observed_ordered();
            self.learned.observe_ordered(&now, &by_name)
        };
        model.apply_learned(&self.learned);
        let mut planned = model.plan();
        planned.reasons.extend(learned_notes);
        planned.reasons.extend(advice.map(|a| a.note));
        // Limits (`autoscaler.limits`): a subtask quota caps the plan; beyond max parallelism
        // or the quota, hold at the limit or shed the excess at the sources.
        self.limit = spec.autoscaler.limits.as_ref().and_then(|lim| {
            let mins = spec
                .operators
                .iter()
                .map(|o| (o.name.clone(), o.scaling.min.unwrap_or(1)))
                .collect();
            limit_plan(&planned, lim, &mins)
        });
        if let Some(lp) = &self.limit {
            planned.parallelism.clone_from(&lp.parallelism);
            planned.reasons.push(lp.reason.clone());
        }
        let incomplete = (!incomplete.is_empty()).then(|| {
            let used = repaired.as_ref().map_or(window.len(), Vec::len);
            let why = format!(
                "incomplete metrics ({}); planned from {used} of {} samples, scale-ups only",
                incomplete.join("; "),
                window.len()
            );
            planned.reasons.push(why.clone());
            why
        });

        let mut backlogged = unknown_backlogs(spec, window, &mut planned);
        for (n, s) in &planned.sources {
            if s.backlog_records > g.backlog_threshold_records.unwrap_or(s.arrival_rate) {
                if !backlogged.is_empty() {
                    backlogged.push_str(", ");
                }
                let _ = write!(backlogged, "{n} ({} records)", Fixed(s.backlog_records, 0));
            }
        }

        // The guarded parallelism, edited in the plan's own map; the plan's values are kept
        // in name order and put back when the plan is returned as the recommendation of a hold.
        let recommended: Vec<u32> = planned.parallelism.values().copied().collect();
        let profile = self.profile(now_s, spec);
        if profile.spiky {
            planned
                .reasons
                .push(profile.note(self.state.flaps.recent(now_s)));
        }
        let lookback = profile.lookback_s;
        if profile.memory_s > 0.0 {
            for (name, &p) in &planned.parallelism {
                let steady = planned
                    .operators
                    .get(name.as_str())
                    .map_or(p, |o| steady_need(o, planned.target_utilization).min(p));
                remember(
                    &mut self.state.recommended,
                    name,
                    now_s,
                    steady,
                    profile.memory_s,
                );
                self.lookback_needs.push(steady);
            }
        }
        let band = Band::new(profile.band, planned.latency_slo_seconds);
        let mut now = NowAssessment::default();
        // Changes held inside the utilization band: (operator, planned parallelism, note).
        let mut in_band: Vec<(String, u32, String)> = Vec::new();
        // Partial scale-downs waiting for the rest (their delay over): (operator, current,
        // the lookback's floor). A rescale made anyway takes them along.
        let mut partial_along: Vec<(String, u32, u32)> = Vec::new();
        let guarded = &mut planned.parallelism;
        let mut notes = Vec::new();
        // A change that brings an operator inside its bounds is made whatever the cost.
        let mut forced = false;
        // Scale-downs held only for time (the delay or the lookback): (operator, current,
        // planned, when it is due).
        let mut due_downs: Vec<(String, u32, u32, f64)> = Vec::new();
        // Scale-downs whose delay is over (applied now): (operator, since when they were ready).
        let mut ready_downs: Vec<(String, f64)> = Vec::new();
        if !self.state.pending_scale_downs.is_empty() {
            self.state
                .pending_scale_downs
                .retain(|k, _| guarded.contains_key(k));
        }
        // `guarded` and `planned.current` are both in name order: one merge finds each
        // operator's current parallelism (what `get` would).
        let mut currents = planned.current.iter().peekable();
        for (name, new) in guarded.iter_mut() {
            while currents.next_if(|(k, _)| &***k < name.as_str()).is_some() {}
            let Some((_, &cur)) = currents.next_if(|(k, _)| &***k == name.as_str()) else {
                continue;
            };
            if let Some((p, note)) = model
                .bounds_of(name)
                .and_then(|b| bounds_force(b, cur, *new))
            {
                *new = p;
                forced = true;
                self.state.pending_scale_downs.remove(name);
                notes.push((name.clone(), note));
                continue;
            }
            if *new >= cur {
                if !self.state.pending_scale_downs.is_empty() {
                    self.state.pending_scale_downs.remove(name);
                }
                if *new - cur > 0 && *new - cur < g.min_change_subtasks {
                    notes.push((name.clone(), change_note("scale-up", cur, *new, IGNORED)));
                    *new = cur;
                } else if *new > cur
                    && let Some(note) =
                        band.holds(&mut now, &model, &planned.current, name, cur, *new)
                {
                    in_band.push((name.clone(), *new, note));
                    *new = cur;
                }
                continue;
            }
            let drop = cur - *new;
            if drop < g.min_change_subtasks
                || f64::from(drop) / f64::from(cur) < g.min_scale_down_fraction
            {
                self.state.pending_scale_downs.remove(name);
                notes.push((name.clone(), change_note("scale-down", cur, *new, IGNORED)));
                *new = cur;
                continue;
            }
            // Scale-down lookback: no lower than the highest recommendation of the lookback.
            // When the lookback holds the whole scale-down, or lets part of it through but would
            // let the rest through within the scale-down delay (or within the lookback, for at
            // most a lookback), the job holds (one rescale later rather than two) while the
            // delay's clock keeps running.
            let mut lookback_hold: Option<String> = None;
            // Whether the lookback lets part of the scale-down through.
            let mut partial = false;
            // When the scale-down's delay ends (counted from the first window that began
            // after it was wanted).
            let delay_ends_s = if g.scale_down_delay_seconds <= 0.0 {
                now_s
            } else {
                self.state
                    .pending_scale_downs
                    .get(name)
                    .map_or(now_s + span + g.scale_down_delay_seconds, |p| {
                        p.settled_s.unwrap_or(p.since_s + span) + g.scale_down_delay_seconds
                    })
            };
            // The memory may reach further back than the lookback in force (see
            // `Profile::memory_s`): only the recommendations within the lookback count.
            let recent = self
                .state
                .recommended
                .get(name)
                .map(|h| h.range(h.partition_point(|&(t, _)| t < now_s - lookback)..));
            if let Some(h) = recent
                && let Some(highest) = h.clone().next().map(|&(_, p)| p).filter(|&p| p > *new)
            {
                self.used_history = true;
                let floor = highest.min(cur);
                partial = floor < cur;
                let partial_since = self
                    .state
                    .pending_scale_downs
                    .get(name)
                    .and_then(|p| p.partial_since_s)
                    .unwrap_or(now_s);
                // The lookback holds nothing above `new` from `clears_s` on.
                let clears_s = h
                    .take_while(|&&(_, p)| p > *new)
                    .last()
                    .map_or(now_s, |&(t, _)| t + lookback);
                if floor == cur {
                    due_downs.push((name.clone(), cur, *new, clears_s.max(delay_ends_s)));
                    lookback_hold = Some(format!(
                        "no scale-down {cur}→{new}: p={highest} was recommended within the last {} s (autoscaler.scaleDownLookbackSeconds)",
                        Fixed(lookback, 0)
                    ));
                } else if clears_s - now_s <= g.scale_down_delay_seconds
                    || (clears_s - now_s <= lookback && now_s - partial_since < lookback)
                {
                    // One step instead of two: the rest of the scale-down is due within the
                    // delay, or within the lookback while this partial step has waited less
                    // than the lookback (the wait `merge_scale_downs` allows for another
                    // operator's scale-down, for this one's own rest; a slow descent still
                    // steps, once per lookback at most). The scale-down also waits for its
                    // delay: the earlier of the two is no promise. A rescale made now for
                    // other reasons takes the partial step along (below).
                    if delay_ends_s <= now_s {
                        partial_along.push((name.clone(), cur, floor));
                    }
                    due_downs.push((name.clone(), cur, *new, clears_s.max(delay_ends_s)));
                    lookback_hold = Some(format!(
                        "no scale-down {cur}→{floor} now: {cur}→{new} in {} s, when p={highest} leaves the last {} s (autoscaler.scaleDownLookbackSeconds) and the scale-down delay is over",
                        Fixed(clears_s.max(delay_ends_s) - now_s, 0),
                        Fixed(lookback, 0)
                    ));
                } else {
                    notes.push((
                        name.clone(),
                        format!(
                            "scale-down {cur}→{new} limited to {floor}: p={highest} was recommended within the last {} s (autoscaler.scaleDownLookbackSeconds)",
                            Fixed(lookback, 0)
                        ),
                    ));
                    *new = floor;
                }
            }
            if let Some(why) = &incomplete {
                self.state.pending_scale_downs.remove(name);
                notes.push((
                    name.clone(),
                    change_note("no scale-down", cur, *new, &[": ", why.as_str()]),
                ));
                *new = cur;
                continue;
            }
            if !backlogged.is_empty() && !model.scale_back_keeps_capacity(name, *new) {
                self.state.pending_scale_downs.remove(name);
                let why = [" while sources have a backlog: ", backlogged.as_str()];
                notes.push((name.clone(), change_note("no scale-down", cur, *new, &why)));
                *new = cur;
                continue;
            }
            if lookback_hold.is_none()
                && let Some(note) = band.holds(&mut now, &model, &planned.current, name, cur, *new)
            {
                self.state.pending_scale_downs.remove(name);
                in_band.push((name.clone(), *new, note));
                *new = cur;
                continue;
            }
            let pending = self
                .state
                .pending_scale_downs
                .entry(name.clone())
                .or_insert_with(|| PendingScaleDown {
                    since_s: now_s,
                    highest: *new,
                    settled_s: None,
                    recent: VecDeque::new(),
                    held_past_delay: false,
                    partial_since_s: None,
                });
            if !partial {
                pending.partial_since_s = None;
            } else if pending.partial_since_s.is_none() {
                pending.partial_since_s = Some(now_s);
            }
            // This window began at now − span: at or after `since_s` it holds no sample from
            // before the load dropped, so its recommendation is the settled one.
            if (now_s - span >= pending.since_s || g.scale_down_delay_seconds <= 0.0)
                && pending.settled_s.is_none()
            {
                pending.settled_s = Some(now_s);
                pending.recent.clear();
            }
            if pending.settled_s.is_some() {
                while pending.recent.back().is_some_and(|&(_, q)| q <= *new) {
                    pending.recent.pop_back();
                }
                pending.recent.push_back((now_s, *new));
            }
            let waited = now_s - pending.since_s;
            let settled_for = pending.settled_s.map(|s| now_s - s);
            let delay_over = settled_for.is_some_and(|s| s >= g.scale_down_delay_seconds);
            if delay_over && (lookback_hold.is_some() || pending.held_past_delay) {
                // Held past the delay (by the lookback, or waiting for another operator's
                // scale-down): the delay's maximum is taken over its last
                // `scale_down_delay_seconds`, not over the whole hold.
                pending.held_past_delay = true;
                while pending
                    .recent
                    .front()
                    .is_some_and(|&(t, _)| t < now_s - g.scale_down_delay_seconds)
                    && pending.recent.len() > 1
                {
                    pending.recent.pop_front();
                }
            }
            pending.highest = match pending.recent.front() {
                Some(&(_, p)) => p,
                None => pending.highest.max(*new),
            };
            if let Some(note) = lookback_hold {
                notes.push((name.clone(), note));
                *new = cur;
            } else if delay_over {
                let over = settled_for.unwrap_or(0.0);
                let over = if pending.held_past_delay {
                    over.min(g.scale_down_delay_seconds)
                } else {
                    over
                };
                notes.push((name.clone(), format!(
                    "scale-down wanted for {waited:.1} s; applying the highest recommendation over the last {} s of windows that began after it was first wanted, {}",
                    Fixed(over, 1),
                    pending.highest
                )));
                *new = pending.highest;
                // Forgotten once the rescale is decided (below), not while it waits to be
                // made together with another operator's.
                let ready_s = pending.settled_s.unwrap_or(now_s) + g.scale_down_delay_seconds;
                ready_downs.push((name.clone(), ready_s.min(now_s)));
            } else {
                due_downs.push((name.clone(), cur, *new, delay_ends_s));
                notes.push((
                    name.clone(),
                    match settled_for {
                        Some(s) => format!(
                            "scale-down {cur}→{new} delayed ({s:.1} of {} s in windows that began after it was first wanted {waited:.1} s ago)",
                            g.scale_down_delay_seconds
                        ),
                        None => format!(
                            "scale-down {cur}→{new} delayed (wanted for {waited:.1} s; waiting for a metric window that began after that, then {} s)",
                            g.scale_down_delay_seconds
                        ),
                    },
                ));
                *new = cur;
            }
        }
        let changed = planned
            .parallelism
            .iter()
            .any(|(k, p)| planned.current.get(k.as_str()) != Some(p));
        if changed
            && !forced
            && let Some((why, due_s)) = merge_scale_downs(
                now_s,
                lookback.max(g.scale_down_delay_seconds),
                &planned,
                &in_band,
                &ready_downs,
                &due_downs,
            )
        {
            for (name, _) in &ready_downs {
                if let Some(p) = self.state.pending_scale_downs.get_mut(name) {
                    p.held_past_delay = true;
                }
            }
            self.hold_due_s = Some(due_s);
            restore(&mut planned.parallelism, &recommended);
            return Verdict::Hold {
                reason: why,
                recommendation: Some(planned),
            };
        }
        for (name, _) in &ready_downs {
            self.state.pending_scale_downs.remove(name);
        }
        let mut notes: Vec<(String, String)> = notes;
        if changed {
            // A rescale restarts the whole job: the changes held inside the band come along.
            for (name, p, note) in in_band {
                if let Some(v) = planned.parallelism.get_mut(&name) {
                    *v = p;
                }
                notes.push((name, format!("{note}, moves with this rescale")));
            }
            // So does the part of a scale-down the lookback lets through (the rest waits as
            // before): the job restarts anyway.
            for (name, cur, floor) in partial_along {
                let floor = self
                    .state
                    .pending_scale_downs
                    .get(&name)
                    .map_or(floor, |p| floor.max(p.highest));
                if floor < cur
                    && let Some(v) = planned.parallelism.get_mut(&name)
                {
                    *v = floor;
                    // Its hold note ("no scale-down … now") gives way to this one.
                    notes.retain(|(n, t)| !(n == &name && t.starts_with("no scale-down")));
                    notes.push((
                        name,
                        change_note(
                            "scale-down",
                            cur,
                            floor,
                            &[" (the part the scale-down lookback lets through) moves with this rescale"],
                        ),
                    ));
                }
            }
            notes.sort_by(|a, b| a.0.cmp(&b.0));
        } else if !in_band.is_empty() {
            restore(&mut planned.parallelism, &recommended);
            let list: Vec<String> = in_band.iter().map(|(op, _, n)| op_note(op, n)).collect();
            return Verdict::Hold {
                reason: format!("{}: {}", band.describe(), list.join("; ")),
                recommendation: Some(planned),
            };
        }
        if changed
            && !forced
            && let Some(why) = over_budget(
                &mut self.state.rescales_s,
                now_s,
                &mut now,
                &model,
                &planned,
                spec,
            )
        {
            self.used_history = true;
            restore(&mut planned.parallelism, &recommended);
            return Verdict::Hold {
                reason: why,
                recommendation: Some(planned),
            };
        }
        let worth = if changed && !forced {
            rescale_worth_its_cost(&mut now, &model, &planned, &planned.parallelism, g)
        } else {
            Ok(String::new())
        };
        let worth = match worth {
            Ok(note) => note,
            Err(why) => {
                restore(&mut planned.parallelism, &recommended);
                return Verdict::Hold {
                    reason: why,
                    recommendation: Some(planned),
                };
            }
        };
        if changed {
            let mut d = planned;
            append_guard_notes(&mut d.operators, &notes);
            model.refresh_planned(&mut d);
            d.reasons.extend(notes.iter().map(|(op, n)| op_note(op, n)));
            d.reasons.push(worth);
            if spec.autoscaler.max_rescales_per_hour > 0 {
                self.state.rescales_s.push_back(now_s);
            }
            self.state.flaps.record(
                now_s,
                d.parallelism.iter().filter_map(|(op, &new)| {
                    d.current
                        .get(op.as_str())
                        .map(|&cur| (op.as_str(), cur, new))
                }),
            );
            Verdict::Rescale(d)
        } else {
            restore(&mut planned.parallelism, &recommended);
            Verdict::Hold {
                reason: if notes.is_empty() {
                    "the plan keeps the current parallelism".to_string()
                } else {
                    let list: Vec<String> = notes.iter().map(|(op, n)| op_note(op, n)).collect();
                    format!("no change after guards: {}", list.join("; "))
                },
                recommendation: Some(planned),
            }
        }
    }
}
