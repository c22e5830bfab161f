//! What the planner decides: the parallelism of every operator, with the figures and reasons
//! behind it.

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
    /// sojourn's ε'-quantile ([`super::queueing::sojourn_quantile_bound`], ε' = (1 −
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
