//! Autoscaling policies compared by the simulator.
//!
//! * [`Streamscale`]: the controller's guarded planner ([`Autoscaler`]) as shipped, with its
//!   defaults, fed the same [`MetricSample`]s the
//!   engine's scrapes produce. One implementation, no copy.
//! * [`Ds2`], [`Flink`], [`Threshold`], [`Static`], [`Oracle`]: baselines, implemented here from
//!   their public descriptions (`baseline-policies.md`).

use std::collections::{BTreeMap, HashMap, VecDeque};

use streamscale_controller::model::{Autoscaler, GuardSettings, MetricSample, Verdict};
use streamscale_engine::spec::JobSpec;

use crate::config::SimConfig;
use crate::model::{JobModel, OpKind};
use crate::plant::{Snapshot, metric_sample, metric_sample_into, subtask_shares};

mod ds2;
mod flink;
mod oracle;
mod static_policy;
mod streamscale;
mod threshold;

pub use ds2::Ds2;
pub use flink::Flink;
pub use oracle::Oracle;
pub use static_policy::Static;
pub use streamscale::{Streamscale, StreamscaleForecast};
use threshold::HPA_SYNC_S;
pub use threshold::Threshold;

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
        "ds2" => Box::new(Ds2::new(interval_s, window_s)),
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

/// Smallest p within bounds with λ ≤ ρ · servers(p) · μ, μ = 1 / `service_s` (the bound's max
/// when none).
fn smallest_servers(model: &JobModel, i: usize, lambda: f64, rho: f64, service_s: f64) -> u32 {
    let (lo, hi) = model.ops[i].bounds;
    let mu = 1.0 / service_s;
    (lo..=hi)
        .find(|&p| lambda <= rho * model.effective_servers(i, p) * mu * (1.0 + 1e-9))
        .unwrap_or(hi)
}
