//! What the planner decides: the parallelism of every operator, with the figures and reasons
//! behind it; how a model assembles a decision and refreshes its predictions after the guards
//! edit it.

use super::*;

/// The plan for one operator. Rates in records/s, times in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorPlan {
    /// Operator kind (`source`, `map`, `filter`, `window`, `sink`): the engine's static name of
    /// the kind in a plan the planner made (no copy per decision), owned when read back.
    pub kind: Cow<'static, str>,
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
    #[serde(with = "crate::model::serde_inf")]
    pub predicted_sojourn_seconds: f64,
    /// This operator's term of the path percentile bound, seconds (`inf` when unstable): its
    /// sojourn's ε'-quantile ([`sojourn_quantile_bound`](crate::model::queueing::sojourn_quantile_bound), ε' = (1 −
    /// percentile) / (the most operators on any path)), plus the watermark delay of an
    /// event-time windowed operator and the time to drain the burst a window upstream emits at
    /// its boundary. Not the window period: a window result's latency counts from its window's
    /// end (Flink's convention, as the engine's sink latency). Sources: 0; unknown μ: the
    /// watermark delay only.
    #[serde(default, with = "crate::model::serde_inf")]
    pub predicted_sojourn_percentile_seconds: f64,
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
    /// Running parallelism per operator (subtasks reporting in the window). Keyed by the
    /// operator names the planner's job graph shares between its decisions (an `Arc<str>`
    /// each: a decision copies no name), as are [`Self::operators`] and [`Self::sources`];
    /// serialized as plain strings.
    pub current: BTreeMap<Arc<str>, u32>,
    /// Per-operator details.
    pub operators: BTreeMap<Arc<str>, OperatorPlan>,
    /// Per-source rates and backlog.
    pub sources: BTreeMap<Arc<str>, SourcePlan>,
    /// Predicted mean end-to-end latency at the planned parallelism and steady arrival rates:
    /// the largest over source-to-sink paths of the sum of mean sojourn times (burst drains at
    /// half their length, event-time windows' watermark delays in full; window periods not
    /// counted: a window result's latency counts from its window's end), seconds (`inf` when
    /// unstable).
    #[serde(with = "crate::model::serde_inf")]
    pub predicted_latency_seconds: f64,
    /// The path with the largest percentile bound, source first.
    pub critical_path: Vec<String>,
    /// Upper bound on the [`Self::latency_percentile`]-quantile of end-to-end latency of the
    /// slowest path at the planned parallelism and steady rates, seconds (`inf` when
    /// unstable): the largest over paths of the sum of the operators'
    /// [`OperatorPlan::predicted_sojourn_percentile_seconds`]. Union bound (Boole's
    /// inequality): with ε = 1 − percentile split evenly over the K operators of the longest
    /// path, a path of k ≤ K operators exceeds the sum of its operators' ε/K-quantiles with
    /// probability at most k·ε/K ≤ ε, for any dependence between the operators. The SLO is
    /// checked against this bound.
    #[serde(default, with = "crate::model::serde_inf")]
    pub predicted_latency_percentile_seconds: f64,
    /// The percentile of [`Self::predicted_latency_percentile_seconds`] (0.99 = p99).
    #[serde(default)]
    pub latency_percentile: f64,
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
            .any(|(k, p)| self.current.get(k.as_str()) != Some(p))
    }

    /// Whether the predicted latency percentile bound meets the SLO.
    pub fn slo_met(&self) -> bool {
        self.predicted_latency_percentile_seconds <= self.latency_slo_seconds
    }
}

impl Model {
    /// Assembles a decision for parallelism `p` (indexed like the topology).
    pub(super) fn decision(
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

    pub(super) fn refresh_latency(&self, d: &mut Decision) {
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
    pub(super) fn latency_from(&self, d: &mut Decision, mean: &[f64], tail: &[f64]) {
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
