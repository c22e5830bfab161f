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
//!    decreasing in p, so this greedy allocation is the cheapest one that meets the SLO.
//!
//! Sources are never rescaled (as in DS2). Operators whose true processing rate is unknown
//! (too little busy time in the window) keep their parallelism.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use streamscale_engine::spec::{AutoscalerSpec, JobSpec};

use super::ModelError;
use super::estimate::{OperatorEstimate, estimate_indexed};
use super::network::Topology;
use super::queueing::operator_sojourn_time;
use super::sample::MetricSample;

/// Planner settings. `None` fields take their value from the job's [`AutoscalerSpec`]
/// (`autoscaler:` in the job file) or the documented default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannerSettings {
    /// Utilization ρ = λ/(p μ) each operator is sized for, in (0, 1]. Default:
    /// `autoscaler.targetUtilization` (0.7 when the job file does not set it).
    pub target_utilization: Option<f64>,
    /// End-to-end latency SLO, seconds (mean sojourn along the slowest path). Default:
    /// `autoscaler.latencySloSeconds` (1.0).
    pub latency_slo_seconds: Option<f64>,
    /// Seconds within which the current source backlog must drain. Default:
    /// `autoscaler.catchUpSeconds` (30).
    pub catch_up_seconds: Option<f64>,
    /// Coefficient of variation cs of service times (for the Allen-Cunneen and Kingman
    /// approximations). `None` = 1, exponential service (M/M/c, M/M/1).
    pub service_cv: Option<f64>,
    /// Coefficient of variation ca of inter-arrival times. `None` = 1, Poisson arrivals.
    pub arrival_cv: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Resolved {
    pub rho: f64,
    pub slo: f64,
    pub catch_up: f64,
    pub ca: f64,
    pub cs: f64,
}

impl PlannerSettings {
    pub(crate) fn resolve(&self, a: &AutoscalerSpec) -> Result<Resolved, ModelError> {
        let r = Resolved {
            rho: self.target_utilization.unwrap_or(a.target_utilization),
            slo: self.latency_slo_seconds.unwrap_or(a.latency_slo_seconds),
            catch_up: self.catch_up_seconds.unwrap_or(a.catch_up_seconds),
            ca: self.arrival_cv.unwrap_or(1.0),
            cs: self.service_cv.unwrap_or(1.0),
        };
        let bad = |what: String| Err(ModelError::InvalidSettings(what));
        if !(r.rho > 0.0 && r.rho <= 1.0) {
            return bad(format!("target utilization {} is not in (0, 1]", r.rho));
        }
        if !(r.slo > 0.0) || r.slo.is_nan() {
            return bad(format!("latency SLO {} s must be positive", r.slo));
        }
        if !(r.catch_up > 0.0 && r.catch_up.is_finite()) {
            return bad(format!(
                "catch-up time {} s must be positive and finite",
                r.catch_up
            ));
        }
        for (name, v) in [("arrival", r.ca), ("service", r.cs)] {
            if !(v >= 0.0 && v.is_finite()) {
                return bad(format!("{name} coefficient of variation {v} must be >= 0"));
            }
        }
        Ok(r)
    }
}

/// The plan for one operator. Rates in records/s, times in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorPlan {
    /// Operator kind (`source`, `map`, `filter`, `window`, `sink`).
    pub kind: String,
    /// Subtasks running now (as reported in the metric window).
    pub current_parallelism: u32,
    /// Planned subtasks.
    pub parallelism: u32,
    /// Largest parallelism allowed (scaling bound, capped by maxParallelism).
    pub max_parallelism: u32,
    /// Observed input rate over the window, records/s.
    pub observed_input_rate: f64,
    /// Target arrival rate λ the operator is sized for (traffic equations at the sources'
    /// arrival rate plus catch-up rate), records/s. For a source: its target emission rate.
    pub arrival_rate: f64,
    /// Arrival rate at the sources' steady arrival rate γ (no catch-up), records/s; used for
    /// the latency prediction.
    pub steady_arrival_rate: f64,
    /// True processing rate μ per subtask (DS2 §3, records per second of useful time); `None`
    /// when unknown (too little busy time) and for sources.
    pub true_processing_rate: Option<f64>,
    /// Records out per record in (the gain of every outgoing edge); 1 for sources.
    pub selectivity: f64,
    /// True when the selectivity is the prior 1.0 (no input in the window).
    pub selectivity_is_prior: bool,
    /// Measured mean busy share of a subtask over the window.
    pub observed_utilization: f64,
    /// Measured mean share of time a subtask was backpressured.
    pub backpressured_share: f64,
    /// Predicted utilization ρ = arrival_rate / (parallelism · μ) at the planned parallelism;
    /// `None` when μ is unknown or for sources. May exceed the target when clamped at the max.
    pub predicted_utilization: Option<f64>,
    /// Predicted mean sojourn time (queueing + service) at the steady arrival rate and the
    /// planned parallelism, seconds (`inf` when unstable). 0 for sources and for operators
    /// with unknown μ (left out of the latency prediction).
    #[serde(with = "super::serde_inf")]
    pub predicted_sojourn_seconds: f64,
    /// True when the utilization target needed more subtasks than the maximum allowed.
    pub clamped_at_max: bool,
    /// Why this parallelism, in words.
    pub reason: String,
}

/// What the planner assumed about one source. Rates in records/s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourcePlan {
    /// Measured external arrival rate γ, records/s.
    pub arrival_rate: f64,
    /// Backlog at the end of the window, records.
    pub backlog_records: f64,
    /// γ + backlog / catch-up seconds: the rate the job is sized for, records/s.
    pub target_rate: f64,
}

/// A planned parallelism for every operator, with the predictions and reasons behind it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Planned parallelism per operator (sources included, unchanged).
    pub parallelism: BTreeMap<String, u32>,
    /// Running parallelism per operator (subtasks reporting in the window).
    pub current: BTreeMap<String, u32>,
    /// Per-operator details.
    pub operators: BTreeMap<String, OperatorPlan>,
    /// Per-source rates and backlog.
    pub sources: BTreeMap<String, SourcePlan>,
    /// Predicted mean end-to-end latency at the planned parallelism and steady arrival rates:
    /// the slowest source-to-sink path's sum of sojourn times, seconds (`inf` when unstable).
    #[serde(with = "super::serde_inf")]
    pub predicted_latency_seconds: f64,
    /// The slowest path, source first.
    pub critical_path: Vec<String>,
    /// The latency SLO planned for, seconds.
    pub latency_slo_seconds: f64,
    /// The utilization target planned for.
    pub target_utilization: f64,
    /// The operator with the highest utilization at the current parallelism, with why
    /// (e.g. "map: ρ=0.97 at p=2, μ=480.0 rec/s per subtask ...").
    pub bottleneck: Option<String>,
    /// Job-wide reasons (source rates, latency, SLO attainability, unknown rates, guards).
    pub reasons: Vec<String>,
}

impl Decision {
    /// Whether any operator's planned parallelism differs from its current one.
    pub fn changed(&self) -> bool {
        self.parallelism
            .iter()
            .any(|(k, p)| self.current.get(k) != Some(p))
    }

    /// Whether the predicted latency meets the SLO.
    pub fn slo_met(&self) -> bool {
        self.predicted_latency_seconds <= self.latency_slo_seconds
    }
}

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
    topo: Topology,
    est: Vec<OperatorEstimate>,
    kind: Vec<&'static str>,
    s: Resolved,
    gamma: Vec<f64>,
    gamma_target: Vec<f64>,
    lambda_target: Vec<f64>,
    lambda_steady: Vec<f64>,
    bounds: Vec<(u32, u32)>,
    spec_parallelism: Vec<u32>,
}

/// Relative slack when rounding λ/(ρμ) up, so that 2.0000000001 from float noise is 2.
const CEIL_SLACK: f64 = 1e-9;

fn fmt_rate(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

impl Model {
    pub(crate) fn new(
        spec: &JobSpec,
        window: &[MetricSample],
        settings: &PlannerSettings,
    ) -> Result<Model, ModelError> {
        let s = settings.resolve(&spec.autoscaler)?;
        let topo = Topology::from_spec(spec)?;
        let (_, est) = estimate_indexed(&topo, window)?;
        let n = topo.len();
        let mut kind = vec![""; n];
        let mut bounds = vec![(1, 1); n];
        let mut spec_parallelism = vec![1; n];
        for op in &spec.operators {
            if let Some(&i) = topo.index.get(&op.name) {
                kind[i] = op.kind.name();
                let max_p = spec.max_parallelism.max(1);
                let lo = op.scaling.min.unwrap_or(1).clamp(1, max_p);
                let hi = op.scaling.max.unwrap_or(max_p).clamp(lo, max_p);
                bounds[i] = (lo, hi);
                spec_parallelism[i] = op.parallelism;
            }
        }
        let gamma: Vec<f64> = est
            .iter()
            .map(|e| e.source.map_or(0.0, |x| x.arrival_rate))
            .collect();
        let gamma_target: Vec<f64> = est
            .iter()
            .map(|e| {
                e.source
                    .map_or(0.0, |x| x.arrival_rate + x.backlog_records / s.catch_up)
            })
            .collect();
        let gain: Vec<f64> = est.iter().map(|e| e.selectivity).collect();
        let lambda_target = topo.traffic(&gamma_target, &gain);
        let lambda_steady = topo.traffic(&gamma, &gain);
        Ok(Model {
            topo,
            est,
            kind,
            s,
            gamma,
            gamma_target,
            lambda_target,
            lambda_steady,
            bounds,
            spec_parallelism,
        })
    }

    fn mu(&self, i: usize) -> Option<f64> {
        if self.topo.is_source[i] {
            None
        } else {
            self.est[i].true_processing_rate
        }
    }

    /// Mean sojourn at the steady rate with `p` subtasks; 0 for sources and unknown μ.
    fn sojourn(&self, i: usize, p: u32) -> f64 {
        match self.mu(i) {
            Some(mu) => operator_sojourn_time(
                self.topo.queue[i],
                self.lambda_steady[i],
                mu,
                p,
                self.s.ca,
                self.s.cs,
            ),
            None => 0.0,
        }
    }

    fn name(&self, i: usize) -> &str {
        &self.topo.names[i]
    }

    pub(crate) fn plan(&self) -> Decision {
        let n = self.topo.len();
        let rho_t = self.s.rho;
        let mut p = vec![1u32; n];
        let mut clamped = vec![false; n];
        let mut why = vec![String::new(); n];
        let mut reasons = Vec::new();

        for i in 0..n {
            let e = &self.est[i];
            if let Some(src) = e.source {
                reasons.push(format!(
                    "source {}: arrival rate γ={} rec/s, backlog {:.0} records → target rate {} rec/s (drains the backlog within {} s)",
                    self.name(i),
                    fmt_rate(src.arrival_rate),
                    src.backlog_records,
                    fmt_rate(self.gamma_target[i]),
                    self.s.catch_up
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
            if !self.topo.is_source[i] && e.selectivity_is_prior {
                reasons.push(format!(
                    "{}: no input in the window; selectivity prior 1.0 assumed",
                    self.name(i)
                ));
            }
        }

        // 1. DS2 sizing at the target utilization.
        for i in 0..n {
            let cur = self.est[i].parallelism;
            let (lo, hi) = self.bounds[i];
            if self.topo.is_source[i] {
                p[i] = cur;
                why[i] = format!("source: not rescaled, keeps p={cur}");
                continue;
            }
            let Some(mu) = self.mu(i) else {
                p[i] = cur.clamp(lo, hi);
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
            let need_u = if need >= f64::from(u32::MAX) {
                u32::MAX
            } else {
                need as u32
            };
            p[i] = need_u.clamp(lo, hi);
            why[i] = format!(
                "DS2: λ_target {} rec/s / (ρ_target {:.2} × μ {} rec/s) = {:.2} → p={}",
                fmt_rate(lambda),
                rho_t,
                fmt_rate(mu),
                x,
                need_u
            );
            if need_u > hi {
                clamped[i] = true;
                let rho = lambda / (f64::from(hi) * mu);
                let _ = write!(why[i], "; clamped to max {hi}: predicted ρ={rho:.2}");
                reasons.push(format!(
                    "{}: needs p={} for ρ ≤ {:.2} but its max is {}; predicted ρ={:.2}{}",
                    self.name(i),
                    need_u,
                    rho_t,
                    hi,
                    rho,
                    if rho >= 1.0 { " (unstable: backlog will grow)" } else { "" }
                ));
            } else if need_u < lo {
                let _ = write!(why[i], "; raised to min {lo}");
            }
        }

        // 2. Greedy marginal allocation for the latency SLO at the steady rates.
        let mut w: Vec<f64> = (0..n).map(|i| self.sojourn(i, p[i])).collect();
        let (mut dist, mut via) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let (mut lat, mut end) = self.topo.longest_path_into(&w, &mut dist, &mut via);
        let adjustable = |i: usize| self.mu(i).is_some();
        if lat > self.s.slo {
            let w_max: Vec<f64> = (0..n)
                .map(|i| {
                    if adjustable(i) {
                        self.sojourn(i, self.bounds[i].1.max(p[i]))
                    } else {
                        w[i]
                    }
                })
                .collect();
            let (lat_max, _) = self.topo.longest_path_into(&w_max, &mut dist, &mut via);
            if lat_max > self.s.slo {
                reasons.push(format!(
                    "latency SLO {} s unattainable: even at maximum parallelism the predicted latency is {:.4} s; no subtasks added for latency",
                    self.s.slo, lat_max
                ));
            } else {
                let before = lat;
                let mut next: Vec<Option<f64>> = vec![None; n];
                let mut added = vec![0u32; n];
                while lat > self.s.slo {
                    let mut best: Option<(f64, usize)> = None;
                    let mut at = end;
                    while at != usize::MAX {
                        if adjustable(at) && p[at] < self.bounds[at].1 {
                            let nx = *next[at].get_or_insert_with(|| self.sojourn(at, p[at] + 1));
                            let score = if w[at].is_infinite() {
                                if nx.is_finite() { f64::INFINITY } else { f64::MAX }
                            } else {
                                w[at] - nx
                            };
                            if best.is_none_or(|(b, _)| score > b) {
                                best = Some((score, at));
                            }
                        }
                        at = via[at];
                    }
                    let Some((_, i)) = best.filter(|(s, _)| *s > 0.0) else {
                        reasons.push(format!(
                            "latency SLO {} s unattainable: no subtask on the slowest path can cut its latency {:.4} s",
                            self.s.slo, lat
                        ));
                        break;
                    };
                    p[i] += 1;
                    w[i] = next[i].take().unwrap_or_else(|| self.sojourn(i, p[i]));
                    added[i] += 1;
                    (lat, end) = self.topo.longest_path_into(&w, &mut dist, &mut via);
                }
                let list: Vec<String> = (0..n)
                    .filter(|&i| added[i] > 0)
                    .map(|i| format!("{} +{}", self.name(i), added[i]))
                    .collect();
                if !list.is_empty() {
                    reasons.push(format!(
                        "latency: predicted {:.4} s at utilization-sized parallelism exceeds the SLO {} s; greedy marginal allocation added {} → {:.4} s",
                        before,
                        self.s.slo,
                        list.join(", "),
                        lat
                    ));
                }
                for i in 0..n {
                    if added[i] > 0 {
                        let _ = write!(
                            why[i],
                            "; +{} for the latency SLO (greedy marginal allocation) → p={}",
                            added[i], p[i]
                        );
                    }
                }
            }
        }
        self.decision(&p, &clamped, why, reasons)
    }

    /// Assembles a decision for parallelism `p` (indexed like the topology).
    fn decision(
        &self,
        p: &[u32],
        clamped: &[bool],
        why: Vec<String>,
        mut reasons: Vec<String>,
    ) -> Decision {
        let n = self.topo.len();
        let mut operators = BTreeMap::new();
        let mut sources = BTreeMap::new();
        for (i, reason) in why.into_iter().enumerate() {
            let e = &self.est[i];
            let mu = self.mu(i);
            operators.insert(
                self.topo.names[i].clone(),
                OperatorPlan {
                    kind: self.kind[i].to_string(),
                    current_parallelism: e.parallelism,
                    parallelism: p[i],
                    max_parallelism: self.bounds[i].1,
                    observed_input_rate: e.input_rate,
                    arrival_rate: self.lambda_target[i],
                    steady_arrival_rate: self.lambda_steady[i],
                    true_processing_rate: mu,
                    selectivity: e.selectivity,
                    selectivity_is_prior: e.selectivity_is_prior,
                    observed_utilization: e.utilization,
                    backpressured_share: e.backpressured_share,
                    predicted_utilization: mu
                        .map(|m| self.lambda_target[i] / (f64::from(p[i].max(1)) * m)),
                    predicted_sojourn_seconds: self.sojourn(i, p[i]),
                    clamped_at_max: clamped[i],
                    reason,
                },
            );
            if let Some(src) = e.source {
                sources.insert(
                    self.topo.names[i].clone(),
                    SourcePlan {
                        arrival_rate: self.gamma[i],
                        backlog_records: src.backlog_records,
                        target_rate: self.gamma_target[i],
                    },
                );
            }
        }
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
                "{}: ρ={:.2} at p={}, μ={} rec/s per subtask (λ={} rec/s at the arrival rate; measured busy {:.2}, backpressured {:.2})",
                self.topo.names[i],
                rho,
                e.parallelism,
                fmt_rate(e.true_processing_rate.unwrap_or(0.0)),
                fmt_rate(self.lambda_steady[i]),
                e.utilization,
                e.backpressured_share
            )
        });
        let mut d = Decision {
            parallelism: self
                .topo
                .names
                .iter()
                .cloned()
                .zip(p.iter().copied())
                .collect(),
            current: self
                .topo
                .names
                .iter()
                .cloned()
                .zip(self.est.iter().map(|e| e.parallelism))
                .collect(),
            operators,
            sources,
            predicted_latency_seconds: 0.0,
            critical_path: Vec::new(),
            latency_slo_seconds: self.s.slo,
            target_utilization: self.s.rho,
            bottleneck,
            reasons: Vec::new(),
        };
        self.refresh_latency(&mut d);
        reasons.push(format!(
            "predicted end-to-end latency {:.4} s {} SLO {} s along {}",
            d.predicted_latency_seconds,
            if d.slo_met() { "≤" } else { ">" },
            self.s.slo,
            d.critical_path.join(" → ")
        ));
        d.reasons = reasons;
        d
    }

    fn refresh_latency(&self, d: &mut Decision) {
        let w: Vec<f64> = self
            .topo
            .names
            .iter()
            .map(|name| {
                d.operators
                    .get(name)
                    .map_or(0.0, |o| o.predicted_sojourn_seconds)
            })
            .collect();
        let path = self.topo.longest_path(&w);
        d.predicted_latency_seconds = path.seconds;
        d.critical_path = path.path;
    }

    /// Recomputes every prediction of `d` after its `parallelism` was edited (by the guards).
    pub(crate) fn refresh(&self, d: &mut Decision) {
        for (name, plan) in d.operators.iter_mut() {
            let Some(&i) = self.topo.index.get(name) else {
                continue;
            };
            let p = d.parallelism.get(name).copied().unwrap_or(plan.parallelism);
            plan.parallelism = p;
            plan.predicted_utilization = self
                .mu(i)
                .map(|m| self.lambda_target[i] / (f64::from(p.max(1)) * m));
            plan.predicted_sojourn_seconds = self.sojourn(i, p);
        }
        self.refresh_latency(d);
    }
}
