//! Autoscaling policies compared by the simulator.
//!
//! * [`Streamscale`]: the controller's guarded planner ([`Autoscaler`]) as shipped, with its
//!   defaults, fed the same [`MetricSample`](streamscale_controller::model::MetricSample)s the
//!   engine's scrapes produce. One implementation, no copy.
//! * [`Ds2`], [`Flink`], [`Threshold`], [`Static`], [`Oracle`]: baselines, implemented here from
//!   their public descriptions (`baseline-policies.md`).

use std::collections::{BTreeMap, HashMap, VecDeque};

use streamscale_controller::model::{Autoscaler, GuardSettings, MetricSample, Verdict};
use streamscale_engine::spec::JobSpec;

use crate::config::SimConfig;
use crate::model::{JobModel, OpKind};
use crate::plant::{Snapshot, metric_sample, metric_sample_into, subtask_shares};

/// What a policy sees at a decision point.
#[derive(Debug)]
pub struct Observation<'a> {
    /// Simulated seconds.
    pub now_s: f64,
    /// The job.
    pub model: &'a JobModel,
    /// Running parallelism per operator (topological order).
    pub parallelism: &'a [u32],
    /// Scrapes since the last (re)start within the policy's window, oldest first.
    pub window: &'a [Snapshot],
    /// When the running deployment started, simulated seconds.
    pub started_s: f64,
    /// The simulator's step, seconds (the oracle sizes for the next step).
    pub step_s: f64,
    /// Records arriving at each source (`model.sources` order) in the next step (the oracle's
    /// knowledge of the future).
    pub next_arrivals: &'a [f64],
    /// When the plant reports step classes ([`Plant::step_class`](crate::plant::Plant::step_class)):
    /// a hash of the classes of the steps between `window`'s snapshots. Two windows with the
    /// same key have the same sample count and spacing, the same counter increments between
    /// consecutive samples and the same gauges: they differ only by a constant offset of the
    /// cumulative counters, i.e. not in any rate, selectivity, utilization or backlog.
    pub window_key: Option<u64>,
}

/// An autoscaling policy.
pub trait Policy {
    /// Name used on the command line and in reports.
    fn name(&self) -> &'static str;
    /// Seconds between decisions.
    fn interval_s(&self) -> f64;
    /// Metric history kept for the policy, seconds.
    fn window_s(&self) -> f64;
    /// Parallelism to start with, when the policy picks it (`static`).
    fn initial(&self) -> Option<Vec<u32>> {
        None
    }
    /// Rescales cost nothing (the oracle ignores rescale cost).
    fn free_rescales(&self) -> bool {
        false
    }
    /// The new parallelism, or `None` to keep the current one.
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>>;
    /// The job (re)started at `now_s`.
    fn restarted(&mut self, _now_s: f64) {}
    /// A rescale this policy asked for took `downtime_s` seconds.
    fn rescaled(&mut self, _downtime_s: f64) {}
    /// For a policy around a costly planner: its calls made and skipped (for benchmarks).
    fn planner_calls(&self) -> Option<(u64, u64)> {
        None
    }
    /// Whether the policy reads [`Observation::window_key`] (the replay computes it only then;
    /// `None` otherwise).
    fn uses_window_key(&self) -> bool {
        false
    }
}

/// Names accepted by [`make_policy`], in report order.
pub const POLICIES: [&str; 7] = [
    "streamscale",
    "streamscale-forecast",
    "ds2",
    "flink",
    "threshold",
    "static",
    "oracle",
];

/// Builds a policy by name with its defaults; `interval_s` and `window_s` are the simulator's
/// metrics interval and window (used by streamscale and ds2; `flink` and `threshold` keep the
/// intervals of the systems they model).
pub fn make_policy(
    name: &str,
    model: &JobModel,
    interval_s: f64,
    window_s: f64,
) -> Option<Box<dyn Policy>> {
    let cfg = SimConfig {
        interval_seconds: interval_s,
        window_seconds: window_s,
        ..SimConfig::default()
    };
    make_policy_with(name, model, &cfg)
}

/// [`make_policy`] with the simulator settings `cfg` (interval, window, streamscale's guards).
pub fn make_policy_with(name: &str, model: &JobModel, cfg: &SimConfig) -> Option<Box<dyn Policy>> {
    let (interval_s, window_s) = (cfg.interval_seconds, cfg.window_seconds);
    Some(match name {
        "streamscale" => Box::new(Streamscale::with_guards(
            interval_s,
            window_s,
            cfg.guard_settings(),
        )),
        "streamscale-forecast" => Box::new(StreamscaleForecast::new(
            model,
            Streamscale::with_guards(interval_s, window_s, cfg.guard_settings()),
        )),
        "ds2" => Box::new(Ds2 {
            interval_s,
            window_s,
            deltas: Vec::new(),
            target_out: Vec::new(),
            p: Vec::new(),
        }),
        "flink" => Box::new(Flink::default()),
        "threshold" => Box::new(Threshold::new(model, HPA_SYNC_S)),
        "static" => Box::new(Static::new(model)),
        "oracle" => Box::new(Oracle::default()),
        _ => return None,
    })
}

/// Rounds up with a relative slack so that 2.0000000001 from float noise is 2.
fn ceil(x: f64) -> f64 {
    (x * (1.0 - 1e-9)).ceil()
}

/// Clamps `p` into operator `i`'s bounds.
fn bound(model: &JobModel, i: usize, p: f64) -> u32 {
    let (lo, hi) = model.ops[i].bounds;
    if p.is_nan() {
        return lo;
    }
    (p.max(f64::from(lo)).min(f64::from(hi))) as u32
}

/// Counter deltas of one operator between the first and last scrape of a window.
#[derive(Debug, Clone, Copy, Default)]
struct Delta {
    dt: f64,
    records_in: f64,
    records_out: f64,
    busy: f64,
    arrivals: f64,
    backlog_first: f64,
    backlog_last: f64,
}

/// The window's per-operator deltas, written into `out` (reused, no allocation once sized);
/// `None` for fewer than two snapshots or no time between them.
fn deltas<'a>(window: &[Snapshot], out: &'a mut Vec<Delta>) -> Option<&'a [Delta]> {
    let (first, last) = (window.first()?, window.last()?);
    let dt = last.at_s - first.at_s;
    if dt <= 0.0 {
        return None;
    }
    out.clear();
    out.extend(first.ops.iter().zip(&last.ops).map(|(a, b)| Delta {
        dt,
        records_in: b.records_in - a.records_in,
        records_out: b.records_out - a.records_out,
        busy: b.busy_s - a.busy_s,
        arrivals: b.arrivals - a.arrivals,
        backlog_first: a.backlog,
        backlog_last: b.backlog,
    }));
    Some(out)
}

/// The controller's planner with its guards, unchanged ([`Autoscaler`]), set up as the
/// Kubernetes operator sets it up with its defaults (`operator/src/reconciler.rs`,
/// `guard_settings`): guard window max(metrics window / 2, 2 × metrics interval), 10 s
/// stabilization, 30 s scale-down delay applying the highest recommendation, no scale-down
/// under backlog, the planner's targets from the job's `autoscaler:`. As `streamscale run`
/// does, each rescale's downtime is reported to it
/// ([`Autoscaler::observe_rescale_downtime`]).
///
/// Two things only save work and change no decision:
/// * the job spec at the running parallelism is built once per deployment, and each snapshot
///   is converted to a [`MetricSample`] once, when a decision first needs it;
/// * a window whose [`Observation::window_key`] (which covers the parallelism) already gave a
///   hold without guard memory (the planner's recommendation was computed and no scale-down is
///   pending after the call) under the same settings is not planned again while no scale-down
///   is pending and the stabilization period is over. Such a hold went through guard branches
///   that neither read nor write the guards' memory; the guarded planner is otherwise a
///   function of the window's rates and gauges (equal for equal keys) and of its settings, so
///   it would hold again.
#[derive(Debug)]
pub struct Streamscale {
    auto: Autoscaler,
    interval_s: f64,
    window_s: f64,
    /// The job spec at the running parallelism.
    spec: Option<(Vec<u32>, JobSpec)>,
    /// Subtask input shares at the running parallelism.
    shares: Vec<Vec<f64>>,
    /// Metric samples of the window's snapshots converted so far, oldest first.
    samples: VecDeque<MetricSample>,
    /// Samples dropped from `samples`, refilled for new snapshots.
    spare: Vec<MetricSample>,
    /// Window keys that held without guard memory under `memo_settings`, with what the call
    /// added to the scale-down lookback ([`Autoscaler::lookback_needs`], in name order).
    memo: HashMap<u64, Vec<u32>>,
    /// The settings `memo` was filled under.
    memo_settings: Option<GuardSettings>,
    /// Whether `memo` is used (off only to test that it changes nothing).
    use_memo: bool,
    /// Calls of [`Autoscaler::decide`] made and skipped (stationary repeats).
    planner_calls: (u64, u64),
}

impl Streamscale {
    /// Decisions every `interval_s` seconds from a metric window of `window_s` seconds, with the
    /// operator's default guards.
    pub fn new(interval_s: f64, window_s: f64) -> Streamscale {
        Streamscale::with_guards(
            interval_s,
            window_s,
            GuardSettings {
                window_seconds: (window_s / 2.0).max(interval_s * 2.0),
                ..GuardSettings::default()
            },
        )
    }

    /// Decisions every `interval_s` seconds from a metric window of `window_s` seconds, with
    /// these guard settings.
    pub fn with_guards(interval_s: f64, window_s: f64, guards: GuardSettings) -> Streamscale {
        Streamscale {
            auto: Autoscaler::new(guards),
            interval_s,
            window_s,
            spec: None,
            shares: Vec::new(),
            samples: VecDeque::new(),
            spare: Vec::new(),
            memo: HashMap::new(),
            memo_settings: None,
            use_memo: true,
            planner_calls: (0, 0),
        }
    }

    /// The same policy calling the planner at every decision (no memo of held windows).
    pub fn without_memo(mut self) -> Streamscale {
        self.use_memo = false;
        self
    }

    /// Brings `self.samples` in line with `window` (same parallelism), converting only the
    /// snapshots not converted yet.
    fn sync_samples(&mut self, model: &JobModel, window: &[Snapshot]) {
        let Some(first) = window.first() else {
            self.samples.clear();
            return;
        };
        while self
            .samples
            .front()
            .is_some_and(|s| s.at_seconds < first.at_s)
        {
            if let Some(old) = self.samples.pop_front() {
                self.spare.push(old);
            }
        }
        if self
            .samples
            .front()
            .is_some_and(|s| s.at_seconds != first.at_s)
        {
            self.spare.extend(self.samples.drain(..));
        }
        let last = self
            .samples
            .back()
            .map_or(f64::NEG_INFINITY, |s| s.at_seconds);
        for snap in window.iter().filter(|s| s.at_s > last) {
            // Samples dropped from the window are refilled (same operators and parallelism:
            // no allocation).
            let sample = match self.spare.pop() {
                Some(mut old) => {
                    metric_sample_into(model, &self.shares, snap, &mut old);
                    old
                }
                None => metric_sample(model, &self.shares, snap),
            };
            self.samples.push_back(sample);
        }
        if self.samples.len() != window.len() {
            self.samples = window
                .iter()
                .map(|s| metric_sample(model, &self.shares, s))
                .collect();
        }
    }
}

impl Policy for Streamscale {
    fn name(&self) -> &'static str {
        "streamscale"
    }
    fn uses_window_key(&self) -> bool {
        self.use_memo
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn window_s(&self) -> f64 {
        self.window_s
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let key = obs.window_key.filter(|_| self.use_memo);
        let settled = self.auto.state().pending_scale_downs.is_empty()
            && obs.now_s - obs.started_s >= self.auto.settings().stabilization_seconds;
        if settled
            && let Some(rec) = key.and_then(|k| self.memo.get(&k))
            && let Some((_, spec)) = &self.spec
        {
            // The skipped call's recommendation still counts for the scale-down lookback.
            self.auto.repeat_recommendation(obs.now_s, rec, spec);
            self.planner_calls.1 += 1;
            return None;
        }
        let m = obs.model;
        if self
            .spec
            .as_ref()
            .is_none_or(|(p, _)| p.as_slice() != obs.parallelism)
        {
            let current: BTreeMap<String, u32> = m
                .ops
                .iter()
                .zip(obs.parallelism)
                .map(|(o, p)| (o.name.clone(), *p))
                .collect();
            self.spec = Some((obs.parallelism.to_vec(), m.spec.with_parallelism(&current)));
            self.shares = subtask_shares(m, obs.parallelism);
            self.samples.clear();
        }
        self.sync_samples(m, obs.window);
        let Some((_, spec)) = &self.spec else {
            return None;
        };
        self.planner_calls.0 += 1;
        match self
            .auto
            .decide(obs.now_s, self.samples.make_contiguous(), spec)
        {
            Verdict::Rescale(d) => Some(
                m.ops
                    .iter()
                    .zip(obs.parallelism)
                    .map(|(o, p)| d.parallelism.get(&o.name).copied().unwrap_or(*p))
                    .collect(),
            ),
            Verdict::Hold {
                recommendation: Some(_),
                ..
            } if self.auto.state().pending_scale_downs.is_empty() && !self.auto.used_history() => {
                if let Some(k) = key {
                    self.memo.insert(k, self.auto.lookback_needs().to_vec());
                }
                None
            }
            Verdict::Hold { .. } => None,
        }
    }
    fn restarted(&mut self, now_s: f64) {
        self.auto.restarted(now_s);
        self.samples.clear();
        // Held windows stay valid across deployments (their keys include the parallelism)
        // while the settings are the same (the rescale downtime reported may change them).
        if self.memo_settings.as_ref() != Some(self.auto.settings()) {
            self.memo.clear();
            self.memo_settings = Some(self.auto.settings().clone());
        }
    }
    fn rescaled(&mut self, downtime_s: f64) {
        if downtime_s > 0.0 {
            self.auto.observe_rescale_downtime(downtime_s);
        }
    }
    /// Calls of [`Autoscaler::decide`]: (made, skipped as stationary repeats).
    fn planner_calls(&self) -> Option<(u64, u64)> {
        Some(self.planner_calls)
    }
}

/// [`Streamscale`] with forecasting on: the same guarded planner, deciding from a job spec
/// whose `autoscaler.forecast` is `{mode: on}` (Holt-Winters on the input rate, see
/// `streamscale_controller::model::forecast`). The season is a day of trace time in simulated
/// seconds (86 400 / the first trace source's speedup; 86 400 without a trace) unless the job
/// sets `seasonSeconds`; bins are at least one metrics interval wide (default season / 288) and
/// the horizon is at least half the metric window plus one interval (the lag of a rate measured
/// over the window). Every window is planned (no memo of held windows: the history changes
/// with each one).
#[derive(Debug)]
pub struct StreamscaleForecast {
    inner: Streamscale,
    /// The job with forecasting on.
    model: JobModel,
}

impl StreamscaleForecast {
    /// Wraps `inner` (which loses its memo) for `model`.
    pub fn new(model: &JobModel, inner: Streamscale) -> StreamscaleForecast {
        let (interval_s, window_s) = (inner.interval_s, inner.window_s);
        let mut model = model.clone();
        let speedup = model.spec.operators.iter().find_map(|o| match &o.kind {
            streamscale_engine::spec::OperatorKind::Source {
                rate: streamscale_engine::spec::RateSpec::Trace(t),
                ..
            } => Some(t.speedup),
            _ => None,
        });
        let mut f = model.spec.autoscaler.forecast.clone().unwrap_or_else(|| {
            streamscale_engine::spec::ForecastSpec {
                season_seconds: 86_400.0 / speedup.unwrap_or(1.0),
                ..Default::default()
            }
        });
        f.mode = streamscale_engine::spec::ForecastMode::On;
        let bin = f
            .bin_seconds
            .unwrap_or(f.season_seconds / 288.0)
            .max(interval_s)
            .min(f.season_seconds / 2.0);
        f.bin_seconds = Some(bin);
        f.horizon_seconds = Some(
            f.horizon_seconds
                .unwrap_or((2.0 * bin).max(window_s / 2.0 + interval_s))
                .min(f.season_seconds),
        );
        model.spec.autoscaler.forecast = Some(f);
        StreamscaleForecast {
            inner: inner.without_memo(),
            model,
        }
    }
}

impl Policy for StreamscaleForecast {
    fn name(&self) -> &'static str {
        "streamscale-forecast"
    }
    fn interval_s(&self) -> f64 {
        self.inner.interval_s
    }
    fn window_s(&self) -> f64 {
        self.inner.window_s
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let obs = Observation {
            now_s: obs.now_s,
            model: &self.model,
            parallelism: obs.parallelism,
            window: obs.window,
            started_s: obs.started_s,
            step_s: obs.step_s,
            next_arrivals: obs.next_arrivals,
            window_key: None,
        };
        self.inner.decide(&obs)
    }
    fn restarted(&mut self, now_s: f64) {
        self.inner.restarted(now_s);
    }
    fn rescaled(&mut self, downtime_s: f64) {
        self.inner.rescaled(downtime_s);
    }
    fn planner_calls(&self) -> Option<(u64, u64)> {
        self.inner.planner_calls()
    }
}

/// DS2 (Kalavri et al., OSDI 2018): π_i = ⌈R_i / μ_i⌉ with R_i propagated from the sources'
/// rates through observed selectivities in topological order, no headroom (f = 0), sources
/// not rescaled, decisions only on a full window after a (re)start (warm-up).
#[derive(Debug)]
pub struct Ds2 {
    interval_s: f64,
    window_s: f64,
    /// Reused buffers: the window's deltas, target output rates, the new parallelism.
    deltas: Vec<Delta>,
    target_out: Vec<f64>,
    p: Vec<u32>,
}

impl Policy for Ds2 {
    fn name(&self) -> &'static str {
        "ds2"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn window_s(&self) -> f64 {
        self.window_s
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let m = obs.model;
        if obs.now_s - obs.started_s < self.window_s {
            return None;
        }
        let d = deltas(obs.window, &mut self.deltas)?;
        let n = m.ops.len();
        let target_out = &mut self.target_out;
        target_out.clear();
        target_out.resize(n, 0.0);
        let p = &mut self.p;
        p.clear();
        p.extend_from_slice(obs.parallelism);
        for i in 0..n {
            let op = &m.ops[i];
            if op.kind == OpKind::Source {
                target_out[i] = d[i].arrivals / d[i].dt;
                continue;
            }
            let r: f64 = op.inputs.iter().map(|&u| target_out[u]).sum();
            let sel = if d[i].records_in > 0.0 {
                d[i].records_out / d[i].records_in
            } else {
                1.0
            };
            target_out[i] = r * sel;
            if d[i].busy > 1e-9 && d[i].records_in > 0.0 {
                let mu = d[i].records_in / d[i].busy;
                p[i] = bound(m, i, ceil(r / mu));
            }
        }
        (p.as_slice() != obs.parallelism).then(|| p.clone())
    }
}

/// The Flink Kubernetes Operator autoscaler with its defaults (see `baseline-policies.md`):
/// 60 s loop, 15 min metric window collected after a 5 min stabilization, utilization 0.7 ±
/// 0.3, catch-up 30 min, restart time 5 min, scale-down at most 60 % per step, key-group
/// alignment, backlog mode (lag > 5 min of input) forbids scale-down, 1 h scale-down delay
/// applying the highest recommendation seen.
#[derive(Debug, Default)]
pub struct Flink {
    pending: BTreeMap<usize, (f64, u32)>,
    /// Reused buffer of the window's deltas.
    deltas: Vec<Delta>,
}

const FLINK_INTERVAL_S: f64 = 60.0;
const FLINK_WINDOW_S: f64 = 900.0;
const FLINK_STABILIZATION_S: f64 = 300.0;
const FLINK_CATCH_UP_S: f64 = 1800.0;
const FLINK_RESTART_S: f64 = 300.0;
const FLINK_SCALE_DOWN_DELAY_S: f64 = 3600.0;
const FLINK_MAX_P: u32 = 200;

impl Policy for Flink {
    fn name(&self) -> &'static str {
        "flink"
    }
    fn interval_s(&self) -> f64 {
        FLINK_INTERVAL_S
    }
    fn window_s(&self) -> f64 {
        FLINK_WINDOW_S
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let m = obs.model;
        let collect_from = obs.started_s + FLINK_STABILIZATION_S;
        let from = obs.window.partition_point(|s| s.at_s < collect_from);
        let w = &obs.window[from..];
        if w.len() < 2 {
            return None;
        }
        let d = deltas(w, &mut self.deltas)?;
        let n = m.ops.len();
        let (mut target, mut catch) = (vec![0.0; n], vec![0.0; n]);
        let mut backlog_mode = false;
        let mut ratio = vec![1.0; n];
        let mut tpr = vec![f64::INFINITY; n];
        for i in 0..n {
            let op = &m.ops[i];
            let di = &d[i];
            if op.kind == OpKind::Source {
                let rate = di.records_out / di.dt;
                target[i] = rate + (di.backlog_last - di.backlog_first) / di.dt;
                catch[i] = di.backlog_last / FLINK_CATCH_UP_S;
                backlog_mode |= di.backlog_last > 300.0 * rate.max(1e-9);
                continue;
            }
            for &u in &op.inputs {
                target[i] += target[u] * ratio[u];
                catch[i] += catch[u] * ratio[u];
            }
            let p = obs.parallelism[i];
            if di.records_in > 0.0 {
                ratio[i] = di.records_out / di.records_in;
                // busyTimeMsPerSecond: the maximum over subtasks (the hottest key-group share
                // times p: p / effective servers, which are 1 / hottest share for a keyed
                // operator and p otherwise).
                let hot = f64::from(p) / m.effective_servers(i, p);
                let busy_max_per_s = di.busy / di.dt / f64::from(p) * hot;
                if busy_max_per_s > 1e-9 {
                    tpr[i] = di.records_in / di.dt / busy_max_per_s;
                }
            }
        }
        let c = |i: usize, u: f64, restart: bool| {
            catch[i]
                + if restart {
                    target[i] * FLINK_RESTART_S / FLINK_CATCH_UP_S
                } else {
                    0.0
                }
                + target[i] / u
        };
        let out_of_band = (0..n).any(|i| {
            m.ops[i].kind != OpKind::Source
                && tpr[i].is_finite()
                && (tpr[i] < c(i, 1.0, false) || (!backlog_mode && tpr[i] > c(i, 0.4, true)))
        });
        if !out_of_band {
            self.pending.clear();
            return None;
        }
        let mut p = obs.parallelism.to_vec();
        for i in 0..n {
            if m.ops[i].kind == OpKind::Source || !tpr[i].is_finite() {
                continue;
            }
            let cur = obs.parallelism[i];
            let factor = (c(i, 0.7, true) / tpr[i]).clamp(0.4, 1e5);
            let (lo, hi) = m.ops[i].bounds;
            let hi = hi.min(FLINK_MAX_P).max(lo);
            let mut new = (ceil(factor * f64::from(cur)) as u32).clamp(lo, hi);
            if m.ops[i].keyed {
                new = align(new, lo, hi, m.key_groups);
            }
            if new < cur && backlog_mode {
                new = cur;
            }
            if new < cur {
                let e = self.pending.entry(i).or_insert((obs.now_s, new));
                e.1 = e.1.max(new);
                if obs.now_s - e.0 >= FLINK_SCALE_DOWN_DELAY_S {
                    new = e.1;
                    self.pending.remove(&i);
                } else {
                    new = cur;
                }
            } else {
                self.pending.remove(&i);
            }
            p[i] = new;
        }
        (p != obs.parallelism).then_some(p)
    }
}

/// Key-group alignment: the smallest p' ≥ p within bounds that divides `groups` evenly, else the
/// largest such p' < p, else p.
fn align(p: u32, lo: u32, hi: u32, groups: u32) -> u32 {
    (p..=hi.min(groups))
        .find(|q| groups.is_multiple_of(*q))
        .or_else(|| (lo..p).rev().find(|q| groups.is_multiple_of(*q)))
        .unwrap_or(p)
}

/// Kubernetes HPA style: desired = ⌈p × busy / target⌉ per operator, 10 % tolerance,
/// scale-up immediate, scale-down to the highest recommendation of the last 5 minutes.
#[derive(Debug)]
pub struct Threshold {
    interval_s: f64,
    target: f64,
    history: VecDeque<(f64, Vec<u32>)>,
    /// Recommendation vectors dropped from `history`, for reuse.
    spare: Vec<Vec<u32>>,
    /// Reused buffer of the window's deltas.
    deltas: Vec<Delta>,
}

const HPA_TOLERANCE: f64 = 0.1;
/// Kubernetes HPA's sync period (`--horizontal-pod-autoscaler-sync-period`), seconds.
const HPA_SYNC_S: f64 = 15.0;
const HPA_STABILIZATION_S: f64 = 300.0;

impl Threshold {
    /// Targets the job's `autoscaler.targetUtilization`.
    pub fn new(model: &JobModel, interval_s: f64) -> Threshold {
        Threshold {
            interval_s,
            target: model.spec.autoscaler.target_utilization,
            history: VecDeque::new(),
            spare: Vec::new(),
            deltas: Vec::new(),
        }
    }
}

impl Policy for Threshold {
    fn name(&self) -> &'static str {
        "threshold"
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn window_s(&self) -> f64 {
        self.interval_s
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let m = obs.model;
        let d = deltas(obs.window, &mut self.deltas)?;
        // The recommendation goes into a vector the history dropped (no allocation).
        let mut rec = self.spare.pop().unwrap_or_default();
        rec.clear();
        rec.extend_from_slice(obs.parallelism);
        for i in 0..m.ops.len() {
            if m.ops[i].kind == OpKind::Source {
                continue;
            }
            let p = f64::from(obs.parallelism[i]);
            let util = d[i].busy / (p * d[i].dt);
            let ratio = util / self.target;
            if (ratio - 1.0).abs() > HPA_TOLERANCE {
                rec[i] = bound(m, i, ceil(p * ratio));
            }
        }
        self.history.push_back((obs.now_s, rec));
        while self
            .history
            .front()
            .is_some_and(|(t, _)| obs.now_s - t > HPA_STABILIZATION_S)
        {
            if let Some((_, old)) = self.history.pop_front() {
                self.spare.push(old);
            }
        }
        let rec = &self.history.back()?.1;
        let pick = |i: usize| {
            if rec[i] >= obs.parallelism[i] {
                rec[i]
            } else {
                let high = self
                    .history
                    .iter()
                    .map(|(_, r)| r[i])
                    .max()
                    .unwrap_or(rec[i]);
                high.min(obs.parallelism[i])
            }
        };
        // Allocate only for a change.
        (0..m.ops.len())
            .any(|i| pick(i) != obs.parallelism[i])
            .then(|| (0..m.ops.len()).map(pick).collect())
    }
}

/// Fixed parallelism sized for the trace's 99th-percentile source rate at the job's target
/// utilization: the smallest p_i with λ_i(p99) ≤ ρ_target · servers_i(p) · μ_i.
#[derive(Debug)]
pub struct Static {
    p: Vec<u32>,
}

impl Static {
    /// Sizes from the sources' mean rates over each step of `schedule` (the replay's own steps;
    /// the 99th percentile by nearest rank per source), for [`Static::sized_for`].
    pub fn from_schedule(model: &JobModel, schedule: &crate::runner::Schedule) -> Static {
        let mut gamma = vec![0.0; model.ops.len()];
        let n = schedule.steps();
        let mut rates = vec![0.0; n];
        for (k, (s, _)) in model.sources.iter().enumerate() {
            for (j, r) in rates.iter_mut().enumerate() {
                let (_, dt, arrivals) = schedule.step(j);
                *r = arrivals[k] / dt;
            }
            let idx = ((0.99 * n as f64).ceil() as usize).clamp(1, n) - 1;
            let (_, p99, _) = rates.select_nth_unstable_by(idx, f64::total_cmp);
            gamma[*s] += *p99;
        }
        Static::sized_for(model, &gamma)
    }

    /// Sizes from the sources' rates sampled every simulated second over the replay (at most
    /// 10⁶ samples, evenly spaced).
    pub fn new(model: &JobModel) -> Static {
        let n = (model.duration_s.ceil() as usize).clamp(1, 1_000_000);
        let mut gamma = vec![0.0; model.ops.len()];
        for (j, (s, _)) in model.sources.iter().enumerate() {
            let dt = model.duration_s / n as f64;
            let mut before = model.source_cumulative(j, 0.0);
            let mut rates: Vec<f64> = (0..n)
                .map(|k| {
                    let after = model.source_cumulative(j, (k + 1) as f64 * dt);
                    let r = (after - before) / dt;
                    before = after;
                    r
                })
                .collect();
            let idx = ((0.99 * n as f64).ceil() as usize).clamp(1, n) - 1;
            let (_, p99, _) = rates.select_nth_unstable_by(idx, f64::total_cmp);
            gamma[*s] += *p99;
        }
        Static::sized_for(model, &gamma)
    }

    /// The least parallelism per operator (within bounds) that keeps every operator at or
    /// under the job's target utilization ρ when the sources emit `gamma` records/s (indexed
    /// by operator; traffic equations for the operators' rates). Sources keep the job's.
    pub fn sized_for(model: &JobModel, gamma: &[f64]) -> Static {
        let rho = model.spec.autoscaler.target_utilization;
        let lambda = model.traffic(gamma);
        let p = (0..model.ops.len())
            .map(|i| {
                if model.ops[i].kind == OpKind::Source {
                    return model.ops[i].initial;
                }
                smallest_servers(model, i, lambda[i], rho, model.ops[i].service_s)
            })
            .collect();
        Static { p }
    }
}

/// Smallest p within bounds with λ ≤ ρ · servers(p) · μ, μ = 1 / `service_s` (the bound's max
/// when none).
fn smallest_servers(model: &JobModel, i: usize, lambda: f64, rho: f64, service_s: f64) -> u32 {
    let (lo, hi) = model.ops[i].bounds;
    let mu = 1.0 / service_s;
    (lo..=hi)
        .find(|&p| lambda <= rho * model.effective_servers(i, p) * mu * (1.0 + 1e-9))
        .unwrap_or(hi)
}

impl Policy for Static {
    fn name(&self) -> &'static str {
        "static"
    }
    fn interval_s(&self) -> f64 {
        f64::INFINITY
    }
    fn window_s(&self) -> f64 {
        0.0
    }
    fn initial(&self) -> Option<Vec<u32>> {
        Some(self.p.clone())
    }
    fn decide(&mut self, _obs: &Observation) -> Option<Vec<u32>> {
        None
    }
}

/// Offline lower bound: knows the whole trace and the true service rates; at every step, the
/// least parallelism that carries the next step's rates (ρ ≤ 1) and whose predicted latency at
/// the SLO's percentile ([`JobModel::slo_quantile`], p99 by default) meets the SLO (greedy
/// marginal allocation, optimal for convex latency), with free rescales.
#[derive(Debug, Default)]
pub struct Oracle {
    /// Last sizing: (source rates, service times, parallelism), reused while they are
    /// unchanged.
    last: Option<(Vec<f64>, Vec<f64>, Vec<u32>)>,
    /// The step's source rates (reused buffer).
    gamma: Vec<f64>,
    /// The step's mean service times (reused buffer; [`JobModel::service_s_over`]).
    service: Vec<f64>,
}

impl Oracle {
    /// The oracle's parallelism for source rates `gamma` (records/s, indexed by operator) and
    /// mean service times `service` (seconds, indexed by operator; [`JobModel::service_s_over`]).
    pub fn size(model: &JobModel, gamma: &[f64], service: &[f64], current: &[u32]) -> Vec<u32> {
        let lambda = model.traffic(gamma);
        let n = model.ops.len();
        let mut p: Vec<u32> = (0..n)
            .map(|i| {
                if model.ops[i].kind == OpKind::Source {
                    current[i]
                } else {
                    smallest_servers(model, i, lambda[i], 1.0, service[i])
                }
            })
            .collect();
        let soj = |p: &[u32], i: usize| {
            model.sojourn(
                i,
                lambda[i],
                p[i],
                model.effective_servers(i, p[i]),
                service[i],
                // Sized for Poisson arrivals, as the planner assumes.
                1.0,
            )
        };
        let zero = vec![0.0; n];
        let mut s: Vec<f64> = (0..n).map(|i| soj(&p, i)).collect();
        let mut var = vec![0.0; n];
        for _ in 0..10_000 {
            for i in 0..n {
                var[i] = model.sojourn_variance(i, s[i], service[i]);
            }
            let (at_q, _) = model.path_latency(&zero, &s, &var);
            if at_q <= model.slo_s {
                break;
            }
            let mut best: Option<(usize, f64)> = None;
            for i in 0..n {
                if model.ops[i].kind == OpKind::Source || p[i] >= model.ops[i].bounds.1 {
                    continue;
                }
                p[i] += 1;
                let gain = s[i] - soj(&p, i);
                p[i] -= 1;
                if best.is_none_or(|(_, g)| gain > g) {
                    best = Some((i, gain));
                }
            }
            let Some((i, gain)) = best else { break };
            if gain <= 0.0 {
                break;
            }
            p[i] += 1;
            s[i] = soj(&p, i);
        }
        p
    }
}

impl Policy for Oracle {
    fn name(&self) -> &'static str {
        "oracle"
    }
    fn interval_s(&self) -> f64 {
        0.0
    }
    fn window_s(&self) -> f64 {
        0.0
    }
    fn free_rescales(&self) -> bool {
        true
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let m = obs.model;
        self.gamma.clear();
        self.gamma.resize(m.ops.len(), 0.0);
        for ((s, _), a) in m.sources.iter().zip(obs.next_arrivals) {
            self.gamma[*s] += a / obs.step_s;
        }
        if m.has_service_series() || self.service.len() != m.ops.len() {
            m.service_times_over(obs.now_s, obs.now_s + obs.step_s, &mut self.service);
        }
        // Most steps repeat the last step's rates: no sizing and no allocation then.
        if let Some((g, sv, p)) = &self.last
            && *g == self.gamma
            && *sv == self.service
        {
            return (p.as_slice() != obs.parallelism).then(|| p.clone());
        }
        let p = Oracle::size(m, &self.gamma, &self.service, obs.parallelism);
        let changed = p.as_slice() != obs.parallelism;
        let out = changed.then(|| p.clone());
        self.last = Some((self.gamma.clone(), self.service.clone(), p));
        out
    }
}
