//! The simulated job: operators in topological order with their service-time distributions,
//! selectivities, key-group shares and source rate functions, plus the latency model shared by
//! the fast mode and the oracle.

use streamscale_controller::model::{QueueKind, operator_sojourn_time};
use streamscale_engine::keygroup::{key_group, murmur_fmix64, subtask_for_key_group};
use streamscale_engine::spec::{JobSpec, OperatorKind};
use streamscale_engine::time::window::WindowSpec;
use streamscale_engine::trace::RateFunction;

use crate::SimError;
use crate::config::SimConfig;
use crate::rates::{RateSeries, ServiceRates};

/// Largest number of source-to-sink paths enumerated for the latency model.
const MAX_PATHS: usize = 4096;

/// z-score of the 99th percentile of the standard normal distribution (to 10 digits).
pub const Z99: f64 = 2.326_347_874;

/// A latency percentile as the latency model uses it: the quantile `q` in (0, 1), the
/// standard normal z-score Φ⁻¹(q) of the Wilson-Hilferty approximation
/// ([`gamma_quantile_and_tail`]) and the tail probability 1 − q that the step law's
/// bisection aims at ([`StepLatency::quantile`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quantile {
    /// The quantile, in (0, 1) (0.99 = p99).
    pub q: f64,
    /// Φ⁻¹(q), the standard normal quantile.
    pub z: f64,
    /// 1 − q, the probability of exceeding the quantile.
    pub tail: f64,
}

impl Quantile {
    /// The 99th percentile with the constants the model has always used ([`Z99`], tail 0.01),
    /// so that p99 results are bit for bit those of the p99-only model.
    pub const P99: Quantile = Quantile {
        q: 0.99,
        z: Z99,
        tail: 0.01,
    };

    /// The `q`-quantile (0 < `q` < 1, not checked here: the job spec and the simulator's
    /// settings are validated to that range): z = Φ⁻¹(q) from statrs' standard normal
    /// (`Normal::inverse_cdf`, through the inverse complementary error function), except that
    /// `q` = 0.99 is exactly [`Quantile::P99`] (its z agrees with Φ⁻¹(0.99) to 4·10⁻¹¹).
    pub fn new(q: f64) -> Quantile {
        if q == 0.99 {
            return Quantile::P99;
        }
        use statrs::distribution::{ContinuousCDF, Normal};
        Quantile {
            q,
            z: Normal::standard().inverse_cdf(q),
            tail: 1.0 - q,
        }
    }

    /// Whether this is the 99th percentile (then a p99 is the SLO percentile's latency).
    pub fn is_p99(&self) -> bool {
        self.q == 0.99
    }

    /// The percentile's name as `streamscale run` writes it (`p95` for 0.95, `p99.9` for 0.999;
    /// [`streamscale_controller::progress::percentile_label`]).
    pub fn label(&self) -> String {
        streamscale_controller::progress::percentile_label(self.q)
    }
}

/// What an operator does to records, for the model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OpKind {
    /// Emits external arrivals; never rescaled.
    Source,
    /// One record out per record in.
    Map,
    /// Keeps the share `keep` of records.
    Filter(f64),
    /// Keyed tumbling window of `size_s` seconds over `keys` distinct keys: `size_s` sets its
    /// selectivity ([`JobModel::selectivity`]); its records are not held until the window
    /// closes (a window result's latency counts from the window's end).
    Window {
        /// Window length, seconds.
        size_s: f64,
    },
    /// Consumes records.
    Sink,
}

/// One operator of the model.
#[derive(Debug, Clone)]
pub struct OpModel {
    /// Operator name (as in the job file).
    pub name: String,
    /// What it does.
    pub kind: OpKind,
    /// Input partitioned by key group (p separate queues) rather than one shared queue.
    pub keyed: bool,
    /// Mean service time of one record at one subtask, seconds (1/μ; μ is the true
    /// processing rate of DS2).
    pub service_s: f64,
    /// Coefficient of variation cs of the service time.
    pub cv: f64,
    /// Smallest and largest parallelism any policy may choose (scaling bounds, maxParallelism).
    pub bounds: (u32, u32),
    /// Parallelism in the job file.
    pub initial: u32,
    /// Indices of upstream operators.
    pub inputs: Vec<usize>,
    /// Indices of downstream operators.
    pub outputs: Vec<usize>,
}

/// The job as the simulator sees it. Operators are indexed in topological order.
#[derive(Debug, Clone)]
pub struct JobModel {
    /// The job file (with its original parallelism), its `autoscaler` latency SLO, percentile
    /// and `onUnattainableSlo` as the simulator settings override them (the planner reads them
    /// from here).
    pub spec: JobSpec,
    /// Operators in topological order.
    pub ops: Vec<OpModel>,
    /// Source operator index → its rate function (records/s over simulated seconds).
    pub sources: Vec<(usize, RateFunction)>,
    /// Per source (`sources` order): the job file's `count`, records in total after which the
    /// source stops (the engine's bounded source); `None` = unbounded. See
    /// [`JobModel::source_cumulative`].
    pub source_counts: Vec<Option<f64>>,
    /// Number of key groups (maxParallelism).
    pub key_groups: u32,
    /// Distinct keys (largest over the sources).
    pub keys: u64,
    /// Share of records in each key group (sums to 1), from the sources' key hashing.
    pub group_share: Vec<f64>,
    /// Input queue capacity per subtask, records (`channelCapacity`).
    pub channel_capacity: f64,
    /// Effective servers per operator for p = 1..=min(max bound, 1024) (index p − 1).
    servers_table: Vec<Vec<f64>>,
    /// Every source-to-sink path (operator indices).
    pub paths: Vec<Vec<usize>>,
    /// Latency SLO, seconds, on the [`JobModel::slo_quantile`]'s latency.
    pub slo_s: f64,
    /// The percentile the SLO is on: the job's `autoscaler.latencyPercentile` (0.99, p99, by
    /// default) or the simulator's `latencyPercentile` setting ([`SimConfig::latency_percentile`],
    /// `--latency-percentile`). The fast mode's latency, the event mode's measured latency and
    /// the SLO grading are at it; the planner sizes for it (it is also set in [`JobModel::spec`]).
    pub slo_quantile: Quantile,
    /// Downtime of one rescale, seconds (fixed + per-MB cost).
    pub rescale_downtime_s: f64,
    /// Simulated seconds covered by the replay (the trace window / speedup; 3600 s without a
    /// trace unless set).
    pub duration_s: f64,
    /// Evenly spaced arrivals as the engine's source emits them (`arrivals: paced`) instead of
    /// Poisson ones: the event mode spaces them so, the fast mode's formulas take ca² = 0 at
    /// the sources ([`JobModel::source_scv`]).
    pub paced_arrivals: bool,
    /// Per operator: its replayed true processing rate over time ([`JobModel::with_service_rates`]),
    /// `None` = the constant [`OpModel::service_s`].
    service_series: Vec<Option<RateSeries>>,
    /// Whether any entry of `service_series` is set.
    replayed: bool,
}

impl JobModel {
    /// Builds the model of `spec` with `cfg`'s service times and costs. `duration_s` overrides
    /// the replay length (default: end of the trace window).
    ///
    /// # Errors
    /// [`SimError`] for a cycle, an unreadable trace, or an override naming no operator.
    pub fn new(
        spec: &JobSpec,
        cfg: &SimConfig,
        duration_s: Option<f64>,
    ) -> Result<JobModel, SimError> {
        let order = spec.topological_order().map_err(SimError::Model)?;
        for name in cfg.operators.keys() {
            if spec.operator(name).is_none() {
                return Err(SimError::Model(format!(
                    "sim config: operators.{name}: no such operator in job `{}`",
                    spec.name
                )));
            }
        }
        let index = |n: &str| order.iter().position(|o| o == n);
        let mut ops = Vec::with_capacity(order.len());
        let mut sources = Vec::new();
        let mut source_counts = Vec::new();
        let mut keys = 1u64;
        let mut ends = Vec::new();
        for (i, name) in order.iter().enumerate() {
            let Some(op) = spec.operator(name) else {
                return Err(SimError::Model(format!("unknown operator `{name}`")));
            };
            let kind = match &op.kind {
                OperatorKind::Source {
                    rate,
                    keys: k,
                    count,
                    ..
                } => {
                    keys = keys.max(*k);
                    let f = RateFunction::from_spec(rate)?;
                    let limit = count.map(|c| c as f64);
                    // A bounded source is over when it reached its count or the trace ended.
                    let end = match (f.wall_end(), limit.and_then(|c| finish_time(&f, c))) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    };
                    ends.push(end);
                    sources.push((i, f));
                    source_counts.push(limit);
                    OpKind::Source
                }
                OperatorKind::Map => OpKind::Map,
                OperatorKind::Filter { keep, .. } => OpKind::Filter(*keep),
                OperatorKind::Window { size_ms, .. } => OpKind::Window {
                    size_s: (*size_ms as f64 / 1000.0).max(1e-3),
                },
                OperatorKind::Sink { .. } => OpKind::Sink,
                // Event-time operators, approximated: stateless stages and the regular join
                // as maps, windowed operators as keyed windows firing every slide/size/gap.
                OperatorKind::Select { .. }
                | OperatorKind::WindowTop { .. }
                | OperatorKind::Join { window: None } => OpKind::Map,
                OperatorKind::EventWindow { window, .. }
                | OperatorKind::Join {
                    window: Some(window),
                } => {
                    let ms = match *window {
                        WindowSpec::Tumbling { size_ms } => size_ms,
                        WindowSpec::Sliding { slide_ms, .. } => slide_ms,
                        WindowSpec::Session { gap_ms } => gap_ms,
                    };
                    OpKind::Window {
                        size_s: (ms as f64 / 1000.0).max(1e-3),
                    }
                }
            };
            let o = cfg.operators.get(name).copied().unwrap_or_default();
            let mean_us = o
                .mean_micros
                .unwrap_or(op.cpu + op.io + cfg.overhead_micros)
                .max(1e-3);
            let max = op
                .scaling
                .max
                .unwrap_or(spec.max_parallelism)
                .min(spec.max_parallelism)
                .max(1);
            let min = op.scaling.min.unwrap_or(1).clamp(1, max);
            ops.push(OpModel {
                name: name.clone(),
                kind,
                keyed: op.kind.is_keyed(),
                service_s: mean_us * 1e-6,
                cv: o.cv.unwrap_or(1.0),
                bounds: (min, max),
                initial: op.parallelism,
                inputs: spec
                    .inputs_of(name)
                    .iter()
                    .filter_map(|n| index(n))
                    .collect(),
                outputs: spec
                    .outputs_of(name)
                    .iter()
                    .filter_map(|n| index(n))
                    .collect(),
            });
        }
        let g = spec.max_parallelism.max(1);
        let mut counts = vec![0.0; g as usize];
        for k in 0..keys {
            counts[key_group(k, g) as usize] += 1.0;
        }
        let group_share = counts.iter().map(|c| c / keys as f64).collect();
        let mut paths = Vec::new();
        for &(s, _) in &sources {
            let mut stack = vec![vec![s]];
            while let Some(path) = stack.pop() {
                let last = path[path.len() - 1];
                if ops[last].outputs.is_empty() {
                    if paths.len() < MAX_PATHS {
                        paths.push(path);
                    }
                    continue;
                }
                for &n in &ops[last].outputs {
                    let mut p = path.clone();
                    p.push(n);
                    stack.push(p);
                }
            }
        }
        let state_mb = cfg.rescale.state_mb.unwrap_or_else(|| {
            ops.iter().filter(|o| o.keyed).count() as f64 * keys as f64 * 64.0 / 1e6
        });
        // Default length: until the last source that ends is over (its trace window ended or,
        // for a bounded source, it reached its count; then plus the SLO, by which a job
        // meeting it has drained what the sources emitted last); 3600 s when none ends.
        let bounded = source_counts.iter().any(Option::is_some);
        let slo_s = cfg
            .slo_seconds
            .unwrap_or(spec.autoscaler.latency_slo_seconds);
        let slo_percentile = cfg
            .latency_percentile
            .unwrap_or(spec.autoscaler.latency_percentile);
        // The planner (the streamscale policies) reads the SLO from the spec: the same as graded.
        let mut spec = spec.clone();
        spec.autoscaler.latency_slo_seconds = slo_s;
        spec.autoscaler.latency_percentile = slo_percentile;
        if let Some(u) = cfg.on_unattainable_slo {
            spec.autoscaler.on_unattainable_slo = u;
        }
        let duration_s = duration_s
            .or_else(|| {
                let last = ends.iter().flatten().copied().reduce(f64::max)?;
                Some(if bounded { last + slo_s } else { last })
            })
            .unwrap_or(3600.0);
        let channel_capacity = spec.channel_capacity as f64;
        let mut model = JobModel {
            spec,
            ops,
            sources,
            source_counts,
            key_groups: g,
            keys,
            group_share,
            channel_capacity,
            paths,
            slo_s,
            slo_quantile: Quantile::new(slo_percentile),
            rescale_downtime_s: cfg.rescale.downtime_seconds
                + cfg.rescale.seconds_per_mb * state_mb,
            duration_s,
            servers_table: Vec::new(),
            service_series: Vec::new(),
            replayed: false,
            paced_arrivals: cfg.arrivals == crate::config::Arrivals::Paced,
        };
        model.service_series = vec![None; model.ops.len()];
        model.servers_table = (0..model.ops.len())
            .map(|i| {
                let top = model.ops[i].bounds.1.max(model.ops[i].initial).min(1024);
                (1..=top).map(|p| model.servers_uncached(i, p)).collect()
            })
            .collect();
        Ok(model)
    }

    /// Replays `rates` ([`crate::rates`]): each named operator's service time follows the
    /// measured true processing rate over time instead of its constant mean (which still applies
    /// before the operator's first value). The coefficient of variation is kept.
    ///
    /// # Errors
    /// [`SimError::ServiceRates`] (line 1, the header) when a column names no operator of the
    /// job or a source (sources have no service time).
    pub fn with_service_rates(mut self, rates: &ServiceRates) -> Result<JobModel, SimError> {
        for name in &rates.operators {
            let problem = match self.ops.iter().find(|o| &o.name == name) {
                None => format!("operator `{name}` is not in job `{}`", self.spec.name),
                Some(o) if o.kind == OpKind::Source => {
                    format!("operator `{name}` is a source, which has no service rate")
                }
                Some(_) => continue,
            };
            return Err(SimError::ServiceRates {
                path: rates.source.clone(),
                line: 1,
                problem,
            });
        }
        for (i, op) in self.ops.iter().enumerate() {
            self.service_series[i] = rates.series(&op.name, 1.0 / op.service_s);
        }
        self.replayed = self.service_series.iter().any(Option::is_some);
        Ok(self)
    }

    /// Whether any operator's service rate is replayed ([`JobModel::with_service_rates`]).
    pub fn has_service_series(&self) -> bool {
        self.replayed
    }

    /// Mean service time of operator `i` over simulated seconds `[a, b)`, seconds: the
    /// constant [`OpModel::service_s`], or for a replayed rate (b − a) / ∫ₐᵇ μ
    /// ([`RateSeries::mean_service_s`]).
    pub fn service_s_over(&self, i: usize, a: f64, b: f64) -> f64 {
        match &self.service_series[i] {
            Some(s) => s.mean_service_s(a, b),
            None => self.ops[i].service_s,
        }
    }

    /// Writes [`JobModel::service_s_over`]`(i, a, b)` of every operator into `out`.
    pub fn service_times_over(&self, a: f64, b: f64, out: &mut Vec<f64>) {
        out.clear();
        out.extend((0..self.ops.len()).map(|i| self.service_s_over(i, a, b)));
    }

    /// Parallelism of every operator in the job file.
    pub fn initial_parallelism(&self) -> Vec<u32> {
        self.ops.iter().map(|o| o.initial).collect()
    }

    /// Share of operator `i`'s input that each of its `p` subtasks receives: key-group shares
    /// under Flink's assignment for keyed operators (subtask of key group g = g·p/K), 1/p
    /// otherwise.
    pub fn subtask_shares(&self, i: usize, p: u32) -> Vec<f64> {
        let p = p.max(1);
        if !self.ops[i].keyed {
            return vec![1.0 / f64::from(p); p as usize];
        }
        let mut s = vec![0.0; p as usize];
        for (g, share) in self.group_share.iter().enumerate() {
            s[subtask_for_key_group(g as u32, p, self.key_groups).min(p as usize - 1)] += share;
        }
        s
    }

    /// Effective number of servers of operator `i` at parallelism `p`: `p` for a shared queue;
    /// for a keyed operator 1 / (largest subtask share), since the hottest subtask saturates
    /// first (stability needs max share × λ < μ, the keyed-queue result of the reference).
    pub fn effective_servers(&self, i: usize, p: u32) -> f64 {
        match self.servers_table[i].get(p.max(1) as usize - 1) {
            Some(s) => *s,
            None => self.servers_uncached(i, p),
        }
    }

    fn servers_uncached(&self, i: usize, p: u32) -> f64 {
        if !self.ops[i].keyed {
            return f64::from(p.max(1));
        }
        let max = self
            .subtask_shares(i, p)
            .into_iter()
            .fold(0.0_f64, f64::max);
        if max > 0.0 { 1.0 / max } else { f64::from(p) }
    }

    /// Records out per record in at arrival rate `lambda` (records/s): 1 for maps and sources,
    /// `keep` for filters, 0 for sinks; for a window of w seconds over K keys, one record per
    /// active key per window: K (1 − e^(−λw/K)) / (λ w) (the expected number of distinct keys
    /// among λw uniform draws, divided by λw), and 1 at λ = 0.
    pub fn selectivity(&self, i: usize, lambda: f64) -> f64 {
        match self.ops[i].kind {
            OpKind::Source | OpKind::Map => 1.0,
            OpKind::Filter(keep) => keep,
            OpKind::Sink => 0.0,
            OpKind::Window { size_s } => {
                let n = lambda * size_s;
                let k = self.keys as f64;
                if n <= 1e-9 {
                    1.0
                } else {
                    (k * (1.0 - (-n / k).exp()) / n).min(1.0)
                }
            }
        }
    }

    /// Traffic equations λ_i = γ_i + Σ_j gain_j λ_j in topological order, with the sources'
    /// rates `gamma` (indexed by operator, 0 for non-sources) and selectivities at the
    /// resulting rates (the open Jackson network of the reference, with edge gains).
    pub fn traffic(&self, gamma: &[f64]) -> Vec<f64> {
        let mut lambda = vec![0.0; self.ops.len()];
        for i in 0..self.ops.len() {
            let mut l = gamma[i];
            for &u in &self.ops[i].inputs {
                l += lambda[u] * self.selectivity(u, lambda[u]);
            }
            lambda[i] = l;
        }
        lambda
    }

    /// Sources' total target rate at simulated second `t`, records/s, indexed by operator
    /// (0 for a bounded source that reached its count, [`JobModel::source_rate`]).
    pub fn gamma_at(&self, t: f64) -> Vec<f64> {
        let mut g = vec![0.0; self.ops.len()];
        for (k, (i, _)) in self.sources.iter().enumerate() {
            g[*i] += self.source_rate(k, t);
        }
        g
    }

    /// Records source `k` (index into `sources`) is due to emit by simulated second `t`:
    /// ∫₀ᵗ rate, capped at its `count` for a bounded source (the engine's source emits
    /// min(⌊∫ rate⌋, count) records and then stops; the fluid model drops the floor).
    pub fn source_cumulative(&self, k: usize, t: f64) -> f64 {
        let a = self.sources[k].1.cumulative(t);
        match self.source_counts[k] {
            Some(c) => a.min(c),
            None => a,
        }
    }

    /// Rate of source `k` at simulated second `t`, records/s: the rate function's, or 0 once a
    /// bounded source has reached its count.
    pub fn source_rate(&self, k: usize, t: f64) -> f64 {
        let f = &self.sources[k].1;
        match self.source_counts[k] {
            Some(c) if f.cumulative(t) >= c => 0.0,
            _ => f.rate(t),
        }
    }

    /// Mean sojourn (waiting + service) of operator `i` at arrival rate `lambda` and
    /// parallelism `p`, seconds, from the planner's formulas
    /// ([`operator_sojourn_time`]: Kingman per keyed subtask at its hottest share,
    /// Allen-Cunneen for a shared queue), with ρ capped at 0.99 (beyond that the fluid queue
    /// carries the delay). Sources: 0.
    /// `servers` is [`JobModel::effective_servers`] at `p` (passed in to keep the step loop
    /// free of allocation); `service_s` the mean service time in effect (seconds,
    /// [`JobModel::service_s_over`]); `arrival_scv` the squared coefficient of variation ca²
    /// of the operator's input stream ([`JobModel::input_scv`]; 1 = Poisson, the planner's
    /// assumption). A keyed operator's hottest subtask gets the share 1 / `servers` of the
    /// input, picked by key hash: a random split ([`split_scv`]).
    pub fn sojourn(
        &self,
        i: usize,
        lambda: f64,
        p: u32,
        servers: f64,
        service_s: f64,
        arrival_scv: f64,
    ) -> f64 {
        let op = &self.ops[i];
        if op.kind == OpKind::Source {
            return 0.0;
        }
        let mu = 1.0 / service_s;
        let lambda = lambda.min(0.99 * servers * mu).max(0.0);
        if op.keyed {
            // The hottest subtask sees λ / servers; model it as p queues at that rate.
            let ca = split_scv(arrival_scv.max(0.0), 1.0 / servers).sqrt();
            operator_sojourn_time(
                QueueKind::Keyed,
                lambda / servers * f64::from(p),
                mu,
                p,
                ca,
                op.cv,
            )
        } else {
            let ca = arrival_scv.max(0.0).sqrt();
            operator_sojourn_time(QueueKind::Shared, lambda, mu, p, ca, op.cv)
        }
    }

    /// Squared coefficient of variation of the sources' inter-arrival times: 0 for evenly
    /// spaced arrivals (`arrivals: paced`, as the engine's source emits), 1 for Poisson ones.
    pub fn source_scv(&self) -> f64 {
        if self.paced_arrivals { 0.0 } else { 1.0 }
    }

    /// Squared coefficient of variation ca² of operator `i`'s input stream, from its inputs'
    /// output streams: `flow[u]` records/s leave upstream `u` with SCV `out_scv[u]`
    /// ([`JobModel::output_scv`]); merged streams take the rate-weighted average of their SCVs
    /// (the asymptotic superposition rule of Whitt's Queueing Network Analyzer, Bell System
    /// Technical Journal 62(9), 1983). No flow (or a source): [`JobModel::source_scv`].
    pub fn input_scv(&self, i: usize, flow: &[f64], out_scv: &[f64]) -> f64 {
        let (mut w, mut x) = (0.0, 0.0);
        for &u in &self.ops[i].inputs {
            if flow[u] > 0.0 {
                w += flow[u];
                x += flow[u] * out_scv[u];
            }
        }
        if w > 0.0 { x / w } else { self.source_scv() }
    }

    /// Squared coefficient of variation of operator `i`'s output stream, given its input's
    /// `arrival_scv`, its utilization `rho` per server (λ·s / servers, capped at 1) and its
    /// effective `servers`: the QNA departure SCV ([`departure_scv`]; per keyed subtask, whose
    /// input is a random split, with one server each; the subtasks' outputs merge back with
    /// the same SCV), then thinned by the operator's selectivity `sel` ([`split_scv`]).
    /// Sources: their input's SCV.
    pub fn output_scv(&self, i: usize, arrival_scv: f64, rho: f64, servers: f64, sel: f64) -> f64 {
        let op = &self.ops[i];
        if op.kind == OpKind::Source {
            return arrival_scv;
        }
        let cs2 = op.cv * op.cv;
        let rho = rho.clamp(0.0, 1.0);
        let d = if op.keyed {
            departure_scv(split_scv(arrival_scv, 1.0 / servers), cs2, rho, 1.0)
        } else {
            departure_scv(arrival_scv, cs2, rho, servers)
        };
        split_scv(d, sel.clamp(0.0, 1.0))
    }

    /// Variance of operator `i`'s sojourn (seconds²) given its mean `sojourn` and mean service
    /// time `service_s` (seconds): the exponential law's (mean²; M/M/1's sojourn is exponential)
    /// with the exponential service's variance s² replaced by the operator's own cs²·s², i.e.
    /// mean² − (1 − cs²)·s², at least 0 (waiting and own service independent, as in FCFS
    /// queues). At cs = 1 it is exactly the exponential law's; at cs = 0 and no waiting, 0 (a
    /// fixed per-record cost, like the engine's spin + sleep).
    pub fn sojourn_variance(&self, i: usize, sojourn: f64, service_s: f64) -> f64 {
        let cv = self.ops[i].cv;
        if self.ops[i].kind == OpKind::Source {
            return 0.0;
        }
        (sojourn * sojourn - (1.0 - cv * cv) * service_s * service_s).max(0.0)
    }

    /// End-to-end latency at the SLO's percentile ([`JobModel::slo_quantile`], seconds) and the
    /// probability that a record's latency exceeds the SLO, each for its worst source-to-sink
    /// path ([`JobModel::path_latency_at`]).
    pub fn path_latency(&self, delay: &[f64], sojourn: &[f64], var: &[f64]) -> (f64, f64) {
        self.path_latency_at(&self.slo_quantile, delay, sojourn, var)
    }

    /// End-to-end latency at quantile `q` (seconds) and the probability that a record's latency
    /// exceeds the SLO, each for its worst source-to-sink path. Per operator: a deterministic
    /// delay `delay[i]` (queued records ahead / drain rate, source backlog / rate) plus a random
    /// sojourn with mean `sojourn[i]` and variance `var[i]` ([`JobModel::sojourn_variance`]);
    /// the sum along a path is matched to a gamma distribution by mean and variance, whose
    /// quantiles come from the Wilson-Hilferty cube-root normal approximation
    /// ([`gamma_quantile_and_tail`]).
    pub fn path_latency_at(
        &self,
        q: &Quantile,
        delay: &[f64],
        sojourn: &[f64],
        var: &[f64],
    ) -> (f64, f64) {
        let mut worst = (0.0_f64, 0.0_f64);
        for path in &self.paths {
            let (mut d, mut m, mut v) = (0.0, 0.0, 0.0);
            for &i in path {
                d += delay[i];
                m += sojourn[i];
                v += var[i];
            }
            let (at_q, tail) = gamma_quantile_and_tail(m, v, q.z, self.slo_s - d);
            worst.0 = worst.0.max(d + at_q);
            worst.1 = worst.1.max(tail);
        }
        worst
    }
}

impl JobModel {
    /// The latency law of the path with the largest latency at the SLO's percentile
    /// ([`JobModel::path_latency`]): its deterministic delay `d` and the mean `m` and variance
    /// `v` of its random sojourn (seconds, s²), so that P(latency ≤ x) = 1 − tail(x − d) of the
    /// gamma law matched to (m, v) ([`gamma_quantile_and_tail`]); `var` as in
    /// [`JobModel::path_latency`].
    pub fn worst_path_law(&self, delay: &[f64], sojourn: &[f64], var: &[f64]) -> (f64, f64, f64) {
        let mut worst = (f64::NEG_INFINITY, (0.0, 0.0, 0.0));
        for path in &self.paths {
            let (mut d, mut m, mut v) = (0.0, 0.0, 0.0);
            for &i in path {
                d += delay[i];
                m += sojourn[i];
                v += var[i];
            }
            let q = d + gamma_quantile_and_tail(m, v, self.slo_quantile.z, f64::INFINITY).0;
            if q > worst.0 {
                worst = (q, (d, m, v));
            }
        }
        worst.1
    }
}

/// End-to-end latency law of the records arriving in one fast-mode step along one path: a
/// deterministic delay `d` plus a random sojourn matched to a gamma law of mean `m` and
/// variance `v` ([`gamma_quantile_and_tail`]); a share `f` of the records (those that arrived while
/// the job was down for a rescale, `down` seconds at the start of the step) waited in addition
/// a time uniform on [0, `down`] for it to come back up (arrivals spread evenly over the step).
/// Seconds throughout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepLatency {
    /// Deterministic delay, s.
    pub d: f64,
    /// Mean of the random sojourn, s.
    pub m: f64,
    /// Variance of the random sojourn, s².
    pub v: f64,
    /// Share of the step's records that arrived while the job was down.
    pub f: f64,
    /// Time down at the start of the step, s.
    pub down: f64,
}

impl StepLatency {
    /// Points of the midpoint rule over the downtime wait.
    const NODES: usize = 16;

    fn base_tail(&self, x: f64) -> f64 {
        if x < self.d {
            1.0
        } else {
            gamma_quantile_and_tail(self.m, self.v, Z99, x - self.d).1
        }
    }

    /// P(latency > `x`): (1 − f)·T(x) + f·E[T(x − W)], W uniform on [0, down], T the tail
    /// without downtime (midpoint rule, 16 nodes).
    pub fn tail(&self, x: f64) -> f64 {
        let base = self.base_tail(x);
        if self.f <= 0.0 || self.down <= 0.0 {
            return base;
        }
        let n = Self::NODES as f64;
        let waited: f64 = (0..Self::NODES)
            .map(|k| self.base_tail(x - (k as f64 + 0.5) / n * self.down))
            .sum::<f64>()
            / n;
        (1.0 - self.f) * base + self.f * waited
    }

    /// The 99th percentile ([`StepLatency::quantile`] at [`Quantile::P99`]).
    pub fn p99(&self) -> f64 {
        self.quantile(&Quantile::P99)
    }

    /// The `q`-quantile: the law's without downtime, or found by bisection between it and it
    /// plus `down` (the tail only grows with the downtime wait, so P(latency > x) = 1 − q has
    /// its root there; 40 halvings, to down · 2⁻⁴⁰).
    pub fn quantile(&self, q: &Quantile) -> f64 {
        let lo = self.d + gamma_quantile_and_tail(self.m, self.v, q.z, f64::INFINITY).0;
        if self.f <= 0.0 || self.down <= 0.0 {
            return lo;
        }
        let (mut lo, mut hi) = (lo, lo + self.down);
        for _ in 0..40 {
            let mid = 0.5 * (lo + hi);
            if self.tail(mid) > q.tail {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        hi
    }
}

/// SCV of the departures of a G/G/c queue with arrival SCV `ca2`, service SCV `cs2`,
/// utilization `rho` per server and `servers` servers: cd² = 1 + (1 − ρ²)(ca² − 1) +
/// ρ²(cs² − 1)/√c (the departure approximation of Whitt, The Queueing Network Analyzer, Bell
/// System Technical Journal 62(9), 1983). Exactly 1 for Poisson arrivals and exponential
/// service (M/M/c: Burke's theorem); ca² at ρ → 0; cs² at ρ → 1 with one server. At least 0.
pub fn departure_scv(ca2: f64, cs2: f64, rho: f64, servers: f64) -> f64 {
    let r2 = rho * rho;
    (1.0 + (1.0 - r2) * (ca2 - 1.0) + r2 * (cs2 - 1.0) / servers.max(1.0).sqrt()).max(0.0)
}

/// SCV of the stream left when each record of a stream with SCV `c2` is kept independently
/// with probability `q` (random splitting; records routed by key hash, or kept by a filter):
/// 1 + q(c² − 1) (the splitting rule of the same Queueing Network Analyzer). A Poisson stream stays Poisson; a sparse share of an even
/// stream is nearly Poisson.
/// `q` is taken within [0, 1] (a hottest share 1 / servers may exceed 1 by rounding), the result
/// at least 0.
pub fn split_scv(c2: f64, q: f64) -> f64 {
    (1.0 + q.clamp(0.0, 1.0) * (c2 - 1.0)).max(0.0)
}

/// For a gamma variable with mean `m` and variance `v` (seconds, s²): its quantile at the
/// standard normal z-score `z` (z = Φ⁻¹(q) for the q-quantile, [`Quantile::z`]) and P(X > x),
/// by the Wilson-Hilferty cube-root approximation (E. B. Wilson and M. M. Hilferty, The
/// distribution of chi-square, PNAS 17(12), 1931, for χ²; for the gamma law with shape
/// k = m²/v): (X/m)^(1/3) ≈ Normal(1 − 1/(9k), 1/(9k)), so the quantile is
/// m·(1 − 1/(9k) + z/(3√k))³. Its error grows as k falls: at k = 1 (exponential, exact
/// quantile −ln(1 − q)·m) the p95 is 0.9 % low and the p99 0.1 % high, the p99.9 2.3 % high.
/// A law without spread (m or v ≤ 0) is the constant max(m, 0).
pub fn gamma_quantile_and_tail(m: f64, v: f64, z: f64, x: f64) -> (f64, f64) {
    if m <= 0.0 || v <= 0.0 {
        return (m.max(0.0), if x < m { 1.0 } else { 0.0 });
    }
    let k = m * m / v;
    let s2 = 1.0 / (9.0 * k);
    let s = s2.sqrt();
    let c = (1.0 - s2 + z * s).max(0.0);
    let q = m * c * c * c;
    let tail = if x <= 0.0 {
        1.0
    } else {
        let z = ((x / m).cbrt() - (1.0 - s2)) / s;
        0.5 * statrs::function::erf::erfc(z / std::f64::consts::SQRT_2)
    };
    (q, tail)
}

/// Simulated second at which `f` has emitted `count` records (∫₀ᵗ rate = count), by doubling
/// then bisection to 1 ms; `None` when it never does (the trace ends first or the rate stays 0
/// over 10⁹ s).
fn finish_time(f: &RateFunction, count: f64) -> Option<f64> {
    let mut hi = 1.0;
    while f.cumulative(hi) < count {
        if let Some(end) = f.wall_end()
            && hi >= end
        {
            return None;
        }
        hi *= 2.0;
        if hi > 1e9 {
            return None;
        }
    }
    let mut lo = 0.0;
    while hi - lo > 1e-3 {
        let mid = 0.5 * (lo + hi);
        if f.cumulative(mid) >= count {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    Some(hi)
}

/// A deterministic 64-bit hash for per-record decisions (record sequence numbers).
pub fn hash64(x: u64) -> u64 {
    murmur_fmix64(x.wrapping_add(0x9e37_79b9_7f4a_7c15))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without downtime the step's law is the path's; with a share f of the records waiting
    /// U(0, down) the tail is the mixture, checked against a direct sum, and its p99 lies
    /// between the p99 without downtime and that plus the downtime.
    #[test]
    fn step_latency_with_downtime() {
        let base = StepLatency {
            d: 0.01,
            m: 0.02,
            v: 0.0004,
            f: 0.0,
            down: 0.0,
        };
        let q = base.p99();
        assert!((base.tail(q) - 0.01).abs() < 1e-3, "{}", base.tail(q));
        let l = StepLatency {
            f: 0.4,
            down: 0.6,
            ..base
        };
        // Mixture by a fine direct sum.
        let x = 0.3;
        let n = 10_000;
        let waited: f64 = (0..n)
            .map(|k| base.tail(x - (k as f64 + 0.5) / n as f64 * 0.6))
            .sum::<f64>()
            / n as f64;
        let want = 0.6 * base.tail(x) + 0.4 * waited;
        assert!((l.tail(x) - want).abs() < 1e-2, "{} vs {want}", l.tail(x));
        let p = l.p99();
        assert!(p > q && p < q + 0.6, "{p}");
        assert!((l.tail(p) - 0.01).abs() < 1e-3);
        // 40 % of the records waited up to 0.6 s: the p99 is close to 0.6 × (1 − 0.01/0.4) plus
        // the path's own latency.
        assert!(p > 0.58 && p < 0.7, "{p}");
        // Any percentile: the bisection lands where the tail is 1 − q, below the p99.
        let q95 = Quantile::new(0.95);
        let p95 = l.quantile(&q95);
        assert!((l.tail(p95) - 0.05).abs() < 1e-3, "{}", l.tail(p95));
        assert!(p95 < p && p95 > base.quantile(&q95), "{p95} vs {p}");
        // 40 % waited U(0, 0.6): the p95 is near 0.6 × (1 − 0.05/0.4).
        assert!(p95 > 0.52 && p95 < 0.6, "{p95}");
    }

    /// The percentile's z-score is the standard normal quantile (Φ⁻¹(0.95) = 1.6448536270,
    /// Φ⁻¹(0.999) = 3.0902323062), and 0.99 is exactly the constants of the p99-only model.
    #[test]
    fn quantile_z_scores_and_labels() {
        assert_eq!(Quantile::new(0.99), Quantile::P99);
        assert!((Quantile::new(0.95).z - 1.644_853_627_0).abs() < 1e-9);
        assert!((Quantile::new(0.999).z - 3.090_232_306_2).abs() < 1e-9);
        assert!(Quantile::new(0.5).z.abs() < 1e-12);
        assert!((Quantile::new(0.95).tail - 0.05).abs() < 1e-15);
        assert!((Z99 - Quantile::new(0.98999999999).z).abs() < 1e-9);
        assert!(!Quantile::new(0.95).is_p99() && Quantile::P99.is_p99());
        assert_eq!(Quantile::new(0.95).label(), "p95");
        assert_eq!(Quantile::P99.label(), "p99");
        assert_eq!(Quantile::new(0.999).label(), "p99.9");
        assert_eq!(Quantile::new(0.5).label(), "p50");
    }

    /// A gamma law of shape 1 is the exponential, whose q-quantile is −ln(1 − q)·mean:
    /// Wilson-Hilferty gives it within its known error at shape 1 (p95 0.9 % low, p99 0.1 %
    /// high), lower at 0.95 than at 0.99, and closer to the exact gamma quantile (statrs) at
    /// larger shapes. The tail at the quantile is 1 − q (the same approximation, inverted
    /// exactly).
    #[test]
    fn gamma_quantile_at_any_percentile() {
        let (m, v) = (0.2, 0.04);
        let at = |q: f64| gamma_quantile_and_tail(m, v, Quantile::new(q).z, f64::INFINITY).0;
        let (q95, q99) = (at(0.95), at(0.99));
        assert!(q95 < q99, "{q95} vs {q99}");
        let exact95 = -(0.05_f64.ln()) * m;
        let exact99 = -(0.01_f64.ln()) * m;
        assert!((q95 / exact95 - 1.0).abs() < 0.01, "{q95} vs {exact95}");
        assert!(q95 < exact95, "Wilson-Hilferty is low at p95, shape 1");
        assert!((q99 / exact99 - 1.0).abs() < 0.002, "{q99} vs {exact99}");
        // The same z as the p99-only model at 0.99: the very same number.
        assert_eq!(q99, gamma_quantile_and_tail(m, v, Z99, f64::INFINITY).0);
        for q in [0.5, 0.9, 0.95, 0.99, 0.999] {
            let z = Quantile::new(q).z;
            let x = gamma_quantile_and_tail(m, v, z, f64::INFINITY).0;
            let tail = gamma_quantile_and_tail(m, v, z, x).1;
            assert!((tail - (1.0 - q)).abs() < 1e-9, "q={q}: tail {tail}");
            // Against the exact gamma quantile (statrs): shape 1 within the errors above, the
            // error falling with the shape (k = 4, 25; checked from p50 to p99.9).
            use statrs::distribution::{ContinuousCDF, Gamma};
            for (k, tol) in [(1.0, 0.025), (4.0, 0.008), (25.0, 0.002)] {
                let exact = Gamma::new(k, k).unwrap().inverse_cdf(q);
                let wh = gamma_quantile_and_tail(1.0, 1.0 / k, z, f64::INFINITY).0;
                assert!(
                    (wh / exact - 1.0).abs() < tol,
                    "k={k} q={q}: {wh} vs {exact}"
                );
            }
        }
    }
}
