//! The replay loop: a policy drives a simulated deployment over the trace; the accounting
//! integrates resource use, SLO violations, backlog and rescale downtime.

use serde::Serialize;

use crate::des::DesPlant;
use crate::fluid::FluidPlant;
use crate::model::JobModel;
use crate::plant::{Plant, Snapshot, StepStats};
use crate::policy::{Observation, Policy};

/// Simulation mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Fluid, discrete-time ([`crate::fluid`]).
    Fast,
    /// Discrete-event with sampled inter-arrival and service times ([`crate::des`]).
    Event,
}

/// Replay settings.
#[derive(Debug, Clone, Copy)]
pub struct ReplayOptions {
    /// Mode.
    pub mode: Mode,
    /// Step (fast mode) or scrape/accounting interval (event mode), simulated seconds.
    pub step_s: f64,
    /// Seed of the event-level mode.
    pub seed: u64,
    /// Largest number of time-series rows kept per policy (rows average several steps).
    pub max_rows: usize,
    /// Threads [`replay_all`] runs policies on; 0 = the machine's available parallelism.
    pub threads: usize,
    /// Fast mode: also compute each step's p99 as the engine's histogram reports it
    /// ([`StepStats::p99_engine_s`]; the event mode always does).
    pub engine_p99: bool,
}

/// Per-policy results, exactly the fields of `summary.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PolicySummary {
    /// Σ parallelism × time over every operator, hours (parallelism-hours).
    pub resource_hours: f64,
    /// `resource_hours` divided by the oracle's.
    pub resource_vs_oracle: f64,
    /// Share of simulated time with end-to-end latency at the SLO's percentile
    /// ([`JobModel::slo_quantile`], p99 by default) above the SLO.
    pub slo_violation_fraction: f64,
    /// Number of rescales.
    pub rescales: f64,
    /// Largest source backlog, records.
    pub max_backlog: f64,
    /// Time-averaged source backlog, records.
    pub mean_backlog: f64,
    /// Total rescale downtime, seconds.
    pub downtime_s: f64,
    /// Records whose end-to-end latency exceeded the SLO.
    pub records_late: f64,
    /// Records that arrived at the sources (`records_late / records` is the share of records
    /// late: at most 1 − the SLO's percentile when the whole run's latency at that percentile
    /// meets the SLO).
    pub records: f64,
}

/// One row of the time series (averages over the row's steps; parallelism at its end).
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// End of the row, simulated seconds.
    pub t_s: f64,
    /// Mean source arrival rate, records/s.
    pub input_rate: f64,
    /// Mean source-rate capacity of the configuration, records/s.
    pub capacity: f64,
    /// Largest p99 latency of the row's steps (the worst step of the row), seconds.
    pub p99_s: f64,
    /// Largest latency at the SLO's percentile ([`JobModel::slo_quantile`]) of the row's steps
    /// (the worst step of the row), seconds; equal to `p99_s` when the SLO is on p99.
    pub slo_latency_s: f64,
    /// Largest p99 of the row's steps as the engine's sink histogram reports it
    /// ([`StepStats::p99_engine_s`]), seconds; `None` when not computed or no record arrived.
    pub p99_engine_s: Option<f64>,
    /// Share of the row's time whose step was over the SLO at its percentile (0 to 1): the
    /// summary's `slo_violation_fraction`, row by row.
    pub over_slo_share: f64,
    /// Source backlog at the end, records.
    pub backlog: f64,
    /// Records queued at operators at the end.
    pub queued: f64,
    /// Parallelism per operator (topological order) at the end.
    pub parallelism: Vec<u32>,
}

/// A rescale decided by a policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Rescale {
    /// Simulated seconds.
    pub at_s: f64,
    /// Parallelism before.
    pub from: Vec<u32>,
    /// Parallelism after.
    pub to: Vec<u32>,
}

/// Result of one policy's replay.
#[derive(Debug, Clone)]
pub struct PolicyRun {
    /// Policy name.
    pub name: String,
    /// Summary figures.
    pub summary: PolicySummary,
    /// Time series.
    pub rows: Vec<Row>,
    /// Every rescale.
    pub rescales: Vec<Rescale>,
    /// Largest conservation error seen at any step, records.
    pub max_conservation_error: f64,
    /// Total external arrivals, records.
    pub arrivals: f64,
    /// Planner calls made and skipped, for policies that report them
    /// ([`Policy::planner_calls`]).
    pub planner_calls: Option<(u64, u64)>,
}

/// Records arriving at every source in every step of a replay, computed once from the sources'
/// rate functions and shared by the replays of all policies.
///
/// Step `k` covers simulated seconds `[k·step, min((k+1)·step, duration))`. Its arrivals are
/// ∫ rate over the step ([`RateFunction::cumulative`] differences, capped at a bounded
/// source's `count`: [`JobModel::source_cumulative`]); when the rate is one
/// constant `r` over the step (the usual case for a piecewise-constant trace) they are exactly
/// `r × dt`, so that stationary stretches repeat bit for bit (see [`Plant::step_class`]).
///
/// [`RateFunction::cumulative`]: streamscale_engine::trace::RateFunction::cumulative
#[derive(Debug, Clone)]
pub struct Schedule {
    step_s: f64,
    duration_s: f64,
    steps: usize,
    sources: usize,
    /// `arrivals[k * sources + s]`: records arriving at source `s` (index into
    /// `model.sources`) in step `k`.
    arrivals: Vec<f64>,
}

impl Schedule {
    /// The schedule of `model`'s replay at `step_s` simulated seconds per step.
    pub fn new(model: &JobModel, step_s: f64) -> Schedule {
        let duration_s = model.duration_s.max(0.0);
        let steps = (duration_s / step_s).ceil().max(1.0) as usize;
        let sources = model.sources.len();
        let mut arrivals = vec![0.0; steps * sources];
        for s in 0..sources {
            let mut before = model.source_cumulative(s, 0.0);
            for k in 0..steps {
                let t = k as f64 * step_s;
                let dt = step_s.min(duration_s - t).max(1e-9);
                let after = model.source_cumulative(s, t + dt);
                let a = (after - before).max(0.0);
                before = after;
                // The rate at both ends of the step: one constant rate when they agree and the
                // integral says so (a bin narrower than the step, or a bounded source reaching
                // its count within the step, could hide a change).
                let r = model.source_rate(s, t);
                let flat = r == model.source_rate(s, t + dt * (1.0 - 1e-9));
                arrivals[k * sources + s] = if flat && (a - r * dt).abs() <= 1e-9 * a.max(1.0) {
                    r * dt
                } else {
                    a
                };
            }
        }
        Schedule {
            step_s,
            duration_s,
            steps,
            sources,
            arrivals,
        }
    }

    /// Number of steps.
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// Step `k`: its start `t` and length `dt` (seconds) and the records arriving at each source.
    pub fn step(&self, k: usize) -> (f64, f64, &[f64]) {
        let t = k as f64 * self.step_s;
        let dt = self.step_s.min(self.duration_s - t).max(1e-9);
        (
            t,
            dt,
            &self.arrivals[k * self.sources..(k + 1) * self.sources],
        )
    }
}

/// Replays `model`'s trace under `policy`. `on_steps` is called with the number of steps done
/// since its last call (for a progress bar).
pub fn replay(
    model: &JobModel,
    policy: &mut dyn Policy,
    opts: &ReplayOptions,
    on_steps: &mut dyn FnMut(u64),
) -> PolicyRun {
    replay_scheduled(
        model,
        &Schedule::new(model, opts.step_s),
        policy,
        opts,
        on_steps,
    )
}

/// [`replay`] with a precomputed [`Schedule`] (of `opts.step_s`).
pub fn replay_scheduled(
    model: &JobModel,
    schedule: &Schedule,
    policy: &mut dyn Policy,
    opts: &ReplayOptions,
    on_steps: &mut dyn FnMut(u64),
) -> PolicyRun {
    let p0: Vec<u32> = policy
        .initial()
        .unwrap_or_else(|| model.initial_parallelism());
    let mut plant: Box<dyn Plant + '_> = match opts.mode {
        Mode::Fast => Box::new(FluidPlant::new(model, &p0).with_engine_p99(opts.engine_p99)),
        Mode::Event => Box::new(DesPlant::new(model, &p0, opts.seed)),
    };
    let duration = model.duration_s.max(0.0);
    let steps = schedule.steps() as u64;
    let per_row = steps.div_ceil(opts.max_rows.max(1) as u64).max(1);
    let free = policy.free_rescales();
    let interval = policy.interval_s();
    let window_s = policy.window_s();
    let uses_key = policy.uses_window_key();
    policy.restarted(0.0);
    let mut started_s = 0.0;
    let mut window = Window::default();
    window.push(plant.as_ref(), 0.0, None);
    let mut next_decision = if free { 0.0 } else { interval };
    let mut s = PolicySummary::default();
    let mut rows = Vec::new();
    let mut rescales = Vec::new();
    let (mut max_err, mut arrivals, mut backlog_integral) = (0.0_f64, 0.0, 0.0);
    let mut acc = RowAcc::default();
    let mut pending_steps = 0u64;
    let mut cur: Vec<u32> = plant.parallelism().to_vec();
    for k in 0..schedule.steps() {
        let (t, dt, arr) = schedule.step(k);
        if free || t + 1e-9 >= next_decision {
            if !free {
                while next_decision <= t + 1e-9 {
                    next_decision += interval;
                }
            }
            let window_key = if uses_key {
                window_key(window.classes())
            } else {
                None
            };
            let obs = Observation {
                now_s: t,
                model,
                parallelism: &cur,
                window: window.snapshots(),
                started_s,
                step_s: dt,
                next_arrivals: arr,
                window_key,
            };
            if let Some(mut new) = policy.decide(&obs) {
                for (i, p) in new.iter_mut().enumerate() {
                    let (lo, hi) = model.ops[i].bounds;
                    if model.ops[i].kind != crate::model::OpKind::Source {
                        *p = (*p).clamp(lo, hi);
                    } else {
                        *p = cur[i];
                    }
                }
                if new != cur {
                    let downtime = if free { 0.0 } else { model.rescale_downtime_s };
                    plant.rescale(&new, t, downtime);
                    s.rescales += 1.0;
                    s.downtime_s += downtime;
                    started_s = t + downtime;
                    policy.rescaled(downtime);
                    policy.restarted(started_s);
                    window.clear();
                    rescales.push(Rescale {
                        at_s: t,
                        from: std::mem::replace(&mut cur, new.clone()),
                        to: new,
                    });
                }
            }
        }
        let st: StepStats = plant.advance(t, dt, arr);
        let total_p: u32 = cur.iter().sum();
        s.resource_hours += f64::from(total_p) * dt / 3600.0;
        // Graded at the SLO's percentile, as the planner sized for it.
        let over_slo = st.slo_latency_s.is_some_and(|p| p > model.slo_s);
        if over_slo {
            s.slo_violation_fraction += dt;
        }
        s.records_late += st.late;
        s.max_backlog = s.max_backlog.max(st.backlog);
        backlog_integral += st.backlog * dt;
        arrivals += st.arrivals;
        max_err = max_err.max(st.conservation_error);
        let now = t + dt;
        // Policies without a metric window (static, oracle) get no snapshots.
        if window_s > 0.0 && now + 1e-9 >= started_s {
            // Step classes only for policies that read the window key.
            let class = if uses_key { plant.step_class() } else { None };
            window.push(plant.as_ref(), now, class);
            window.drop_older(now, window_s);
        }
        acc.add(&st, dt, over_slo);
        if (k as u64 + 1).is_multiple_of(per_row) || k as u64 + 1 == steps {
            rows.push(acc.row(now, &st, &cur));
            acc = RowAcc::default();
        }
        pending_steps += 1;
        if pending_steps >= 4096 {
            on_steps(pending_steps);
            pending_steps = 0;
        }
    }
    on_steps(pending_steps);
    s.records = arrivals;
    if duration > 0.0 {
        s.slo_violation_fraction /= duration;
        s.mean_backlog = backlog_integral / duration;
    }
    PolicyRun {
        name: policy.name().to_string(),
        summary: s,
        rows,
        rescales,
        max_conservation_error: max_err,
        arrivals,
        planner_calls: policy.planner_calls(),
    }
}

/// A policy's metric window: snapshots (oldest first) and the class of the step ending at each
/// ([`Plant::step_class`]; the first one's step is not part of the window), kept in vectors
/// whose start moves forward, so that the window is always one contiguous slice, and reusing
/// the snapshots it drops (no allocation per step).
#[derive(Debug, Default)]
struct Window {
    snaps: Vec<Snapshot>,
    classes: Vec<Option<u64>>,
    start: usize,
    spare: Vec<Snapshot>,
}

impl Window {
    fn snapshots(&self) -> &[Snapshot] {
        &self.snaps[self.start..]
    }

    fn classes(&self) -> &[Option<u64>] {
        &self.classes[self.start..]
    }

    fn clear(&mut self) {
        self.spare.append(&mut self.snaps);
        self.classes.clear();
        self.start = 0;
    }

    /// Appends the plant's counters at `now` and the class of the step that ended then.
    fn push(&mut self, plant: &dyn Plant, now: f64, class: Option<u64>) {
        let mut snap = self.spare.pop().unwrap_or_else(|| Snapshot {
            at_s: now,
            ops: Vec::new(),
        });
        plant.snapshot_into(now, &mut snap);
        self.snaps.push(snap);
        self.classes.push(class);
    }

    /// Drops snapshots older than `window_s` before `now`, keeping at least two.
    fn drop_older(&mut self, now: f64, window_s: f64) {
        while self.snaps.len() - self.start > 2 && now - self.snaps[self.start].at_s > window_s {
            self.start += 1;
        }
        if self.start >= 64 && 2 * self.start >= self.snaps.len() {
            self.spare.extend(self.snaps.drain(..self.start));
            self.classes.drain(..self.start);
            self.start = 0;
        }
    }
}

/// [`Observation::window_key`](crate::policy::Observation::window_key): a hash of the classes of
/// the steps between the window's snapshots (`classes[1..]`), when every one is known.
fn window_key(classes: &[Option<u64>]) -> Option<u64> {
    if classes.len() < 2 {
        return None;
    }
    let mut h: u64 = 0x1319_8a2e_0370_7344;
    for c in classes.iter().skip(1) {
        h = crate::model::hash64(h ^ (*c)?);
    }
    Some(crate::model::hash64(h ^ classes.len() as u64))
}

#[derive(Debug, Default)]
struct RowAcc {
    dt: f64,
    arrivals: f64,
    capacity: f64,
    p99: f64,
    slo_latency: f64,
    p99_engine: Option<f64>,
    over_slo_s: f64,
}

impl RowAcc {
    /// Adds a step of `dt` seconds; `over_slo` when it was graded over the SLO.
    fn add(&mut self, st: &StepStats, dt: f64, over_slo: bool) {
        self.dt += dt;
        if over_slo {
            self.over_slo_s += dt;
        }
        self.arrivals += st.arrivals;
        self.capacity += st.capacity.min(1e12) * dt;
        self.p99 = self.p99.max(st.p99_s.unwrap_or(0.0));
        self.slo_latency = self.slo_latency.max(st.slo_latency_s.unwrap_or(0.0));
        if let Some(p) = st.p99_engine_s {
            self.p99_engine = Some(self.p99_engine.map_or(p, |q| q.max(p)));
        }
    }
    fn row(&self, t_s: f64, st: &StepStats, p: &[u32]) -> Row {
        Row {
            t_s,
            input_rate: self.arrivals / self.dt,
            capacity: self.capacity / self.dt,
            p99_s: self.p99,
            slo_latency_s: self.slo_latency,
            p99_engine_s: self.p99_engine,
            over_slo_share: self.over_slo_s / self.dt,
            backlog: st.backlog,
            queued: st.queued,
            parallelism: p.to_vec(),
        }
    }
}

/// Order in which [`replay_all`] hands policies to its threads: the slowest first, so that the
/// others fill the remaining threads meanwhile.
const COST_ORDER: [&str; 6] = [
    "streamscale",
    "flink",
    "ds2",
    "threshold",
    "static",
    "oracle",
];

/// The policies [`replay_all`] replays for `names`: each name once, in order, and the oracle
/// (last unless named).
pub fn replayed_policies(names: &[String]) -> Vec<String> {
    let mut all: Vec<String> = Vec::new();
    for n in names.iter().map(String::as_str).chain(["oracle"]) {
        if !all.iter().any(|a| a == n) {
            all.push(n.to_string());
        }
    }
    all
}

/// Replays every named policy (and the oracle, for `resource_vs_oracle`) and assembles the
/// summary. Returns the runs of the named policies in the order given. Policies run on
/// `opts.threads` threads (each replay is independent and deterministic, so the results do not
/// depend on the number of threads); `on_steps` may be called from any of them.
///
/// # Errors
/// [`crate::SimError::Model`] for an unknown policy name, or when `streamscale` is replayed
/// with a metric window its guards can never use at this step ([`SimConfig::check_step`]).
///
/// [`SimConfig::check_step`]: crate::config::SimConfig::check_step
pub fn replay_all(
    model: &JobModel,
    names: &[String],
    opts: &ReplayOptions,
    cfg: &crate::config::SimConfig,
    on_steps: &(dyn Fn(u64) + Sync),
) -> Result<(crate::report::Summary, Vec<PolicyRun>), crate::SimError> {
    let all = replayed_policies(names);
    for name in &all {
        if !crate::policy::POLICIES.contains(&name.as_str()) {
            return Err(crate::SimError::Model(format!(
                "--policy: unknown policy `{name}` (known: {}, all)",
                crate::policy::POLICIES.join(", ")
            )));
        }
    }
    if all.iter().any(|n| n == "streamscale") {
        cfg.check_step(opts.step_s)
            .map_err(crate::SimError::Model)?;
    }
    let mut order: Vec<usize> = (0..all.len()).collect();
    order.sort_by_key(|&i| COST_ORDER.iter().position(|n| *n == all[i]));
    let schedule = Schedule::new(model, opts.step_s);
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, usize::from),
        n => n,
    }
    .clamp(1, all.len());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let work = |_| {
        let mut done = Vec::new();
        loop {
            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let Some(&i) = order.get(k) else {
                return done;
            };
            // Static sizes from the replay's own steps (no second pass over the trace).
            let made = if all[i] == "static" {
                Some(
                    Box::new(crate::policy::Static::from_schedule(model, &schedule))
                        as Box<dyn Policy>,
                )
            } else {
                crate::policy::make_policy_with(&all[i], model, cfg)
            };
            if let Some(mut policy) = made {
                let run = replay_scheduled(model, &schedule, policy.as_mut(), opts, &mut |n| {
                    on_steps(n)
                });
                done.push((i, run));
            }
        }
    };
    let mut slots: Vec<Option<PolicyRun>> = vec![None; all.len()];
    let results: Vec<Vec<(usize, PolicyRun)>> = if threads == 1 {
        vec![work(0)]
    } else {
        std::thread::scope(|sc| {
            let handles: Vec<_> = (0..threads).map(|t| sc.spawn(move || work(t))).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
                .collect()
        })
    };
    for (i, run) in results.into_iter().flatten() {
        slots[i] = Some(run);
    }
    let mut runs: Vec<PolicyRun> = slots.into_iter().flatten().collect();
    let oracle = runs
        .iter()
        .find(|r| r.name == "oracle")
        .map_or(0.0, |r| r.summary.resource_hours);
    for r in &mut runs {
        r.summary.resource_vs_oracle = if oracle > 0.0 {
            r.summary.resource_hours / oracle
        } else {
            0.0
        };
    }
    runs.retain(|r| names.contains(&r.name));
    let summary = crate::report::Summary {
        policies: runs
            .iter()
            .map(|r| (r.name.clone(), r.summary.clone()))
            .collect(),
        duration_s: model.duration_s,
        step_s: opts.step_s,
        slo_s: model.slo_s,
        latency_percentile: model.slo_quantile.q,
        on_unattainable_slo: model.spec.autoscaler.on_unattainable_slo,
        interval_s: cfg.interval_seconds,
        window_s: cfg.window_seconds,
        guard_window_s: cfg.guard_settings().window_seconds,
        stabilization_s: cfg.stabilization_seconds,
        scale_down_delay_s: cfg.scale_down_delay_seconds,
        mode: match opts.mode {
            Mode::Fast => "fast".into(),
            Mode::Event => "event".into(),
        },
    };
    Ok((summary, runs))
}

/// Default fast-mode step for a replay of `duration_s` simulated seconds: 1 s up to 6 hours,
/// 10 s beyond.
pub fn default_step(duration_s: f64) -> f64 {
    if duration_s <= 6.0 * 3600.0 {
        1.0
    } else {
        10.0
    }
}
