//! The replay loop: a policy drives a simulated deployment over the trace; the accounting
//! integrates resource use, SLO violations, backlog and rescale downtime.

use std::collections::VecDeque;

use serde::Serialize;

use crate::des::DesPlant;
use crate::fluid::FluidPlant;
use crate::model::JobModel;
use crate::plant::{Plant, StepStats};
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
}

/// Per-policy results, exactly the fields of `summary.json`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PolicySummary {
    /// Σ parallelism × time over every operator, hours (parallelism-hours).
    pub resource_hours: f64,
    /// `resource_hours` divided by the oracle's.
    pub resource_vs_oracle: f64,
    /// Share of simulated time with p99 end-to-end latency above the SLO.
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
    /// Largest p99 latency of the row's steps, seconds.
    pub p99_s: f64,
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
}

/// Replays `model`'s trace under `policy`. `on_steps` is called with the number of steps done
/// since its last call (for a progress bar).
pub fn replay(
    model: &JobModel,
    policy: &mut dyn Policy,
    opts: &ReplayOptions,
    on_steps: &mut dyn FnMut(u64),
) -> PolicyRun {
    let p0: Vec<u32> = policy
        .initial()
        .unwrap_or_else(|| model.initial_parallelism());
    let mut plant: Box<dyn Plant + '_> = match opts.mode {
        Mode::Fast => Box::new(FluidPlant::new(model, &p0)),
        Mode::Event => Box::new(DesPlant::new(model, &p0, opts.seed)),
    };
    let duration = model.duration_s.max(0.0);
    let step = opts.step_s;
    let steps = (duration / step).ceil().max(1.0) as u64;
    let per_row = steps.div_ceil(opts.max_rows.max(1) as u64).max(1);
    let free = policy.free_rescales();
    let interval = policy.interval_s();
    let window_s = policy.window_s();
    policy.restarted(0.0);
    let mut started_s = 0.0;
    let mut window: VecDeque<crate::plant::Snapshot> = VecDeque::new();
    window.push_back(plant.snapshot(0.0));
    let mut next_decision = if free { 0.0 } else { interval };
    let mut s = PolicySummary::default();
    let mut rows = Vec::new();
    let mut rescales = Vec::new();
    let (mut max_err, mut arrivals, mut backlog_integral) = (0.0_f64, 0.0, 0.0);
    let mut acc = RowAcc::default();
    let mut pending_steps = 0u64;
    for k in 0..steps {
        let t = k as f64 * step;
        let dt = step.min(duration - t).max(1e-9);
        if free || t + 1e-9 >= next_decision {
            if !free {
                while next_decision <= t + 1e-9 {
                    next_decision += interval;
                }
            }
            let cur = plant.parallelism().to_vec();
            let obs = Observation {
                now_s: t,
                model,
                parallelism: &cur,
                window: window.make_contiguous(),
                started_s,
                step_s: dt,
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
                    policy.restarted(started_s);
                    window.clear();
                    rescales.push(Rescale {
                        at_s: t,
                        from: cur,
                        to: new,
                    });
                }
            }
        }
        let st: StepStats = plant.advance(t, dt);
        let total_p: u32 = plant.parallelism().iter().sum();
        s.resource_hours += f64::from(total_p) * dt / 3600.0;
        if st.p99_s.is_some_and(|p| p > model.slo_s) {
            s.slo_violation_fraction += dt;
        }
        s.records_late += st.late;
        s.max_backlog = s.max_backlog.max(st.backlog);
        backlog_integral += st.backlog * dt;
        arrivals += st.arrivals;
        max_err = max_err.max(st.conservation_error);
        let now = t + dt;
        if now + 1e-9 >= started_s {
            window.push_back(plant.snapshot(now));
            while window.len() > 2 && window.front().is_some_and(|f| now - f.at_s > window_s) {
                window.pop_front();
            }
        }
        acc.add(&st, dt);
        if (k + 1) % per_row == 0 || k + 1 == steps {
            rows.push(acc.row(now, &st, plant.parallelism()));
            acc = RowAcc::default();
        }
        pending_steps += 1;
        if pending_steps >= 4096 {
            on_steps(pending_steps);
            pending_steps = 0;
        }
    }
    on_steps(pending_steps);
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
    }
}

#[derive(Debug, Default)]
struct RowAcc {
    dt: f64,
    arrivals: f64,
    capacity: f64,
    p99: f64,
}

impl RowAcc {
    fn add(&mut self, st: &StepStats, dt: f64) {
        self.dt += dt;
        self.arrivals += st.arrivals;
        self.capacity += st.capacity.min(1e12) * dt;
        self.p99 = self.p99.max(st.p99_s.unwrap_or(0.0));
    }
    fn row(&self, t_s: f64, st: &StepStats, p: &[u32]) -> Row {
        Row {
            t_s,
            input_rate: self.arrivals / self.dt,
            capacity: self.capacity / self.dt,
            p99_s: self.p99,
            backlog: st.backlog,
            queued: st.queued,
            parallelism: p.to_vec(),
        }
    }
}

/// Replays every named policy (and the oracle, for `resource_vs_oracle`) and assembles the
/// summary. Returns the runs of the named policies in the order given.
///
/// # Errors
/// [`crate::SimError::Model`] for an unknown policy name.
pub fn replay_all(
    model: &JobModel,
    names: &[String],
    opts: &ReplayOptions,
    interval_s: f64,
    window_s: f64,
    on_steps: &mut dyn FnMut(u64),
) -> Result<(crate::report::Summary, Vec<PolicyRun>), crate::SimError> {
    let mut all: Vec<String> = names.to_vec();
    if !all.iter().any(|n| n == "oracle") {
        all.push("oracle".into());
    }
    let mut runs = Vec::new();
    for name in &all {
        let mut policy =
            crate::policy::make_policy(name, model, interval_s, window_s).ok_or_else(|| {
                crate::SimError::Model(format!(
                    "--policy: unknown policy `{name}` (known: {}, all)",
                    crate::policy::POLICIES.join(", ")
                ))
            })?;
        runs.push(replay(model, policy.as_mut(), opts, on_steps));
    }
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
