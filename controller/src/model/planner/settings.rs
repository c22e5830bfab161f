//! The planner's settings and their values resolved against a job's `autoscaler` settings.

use super::*;

/// Planner settings. `None` fields take their value from the job's [`AutoscalerSpec`]
/// (`autoscaler:` in the job file) or the documented default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlannerSettings {
    /// Utilization ρ = λ/(p μ) each operator is sized for, in (0, 1]. Default:
    /// `autoscaler.targetUtilization` (0.7 when the job file does not set it).
    pub target_utilization: Option<f64>,
    /// End-to-end latency SLO, seconds, on the [`Self::latency_percentile`]-quantile (p99 by
    /// default) of every source-to-sink path's latency: the greedy allocation adds subtasks
    /// until the union-bound percentile of the slowest path is within it. Default:
    /// `autoscaler.latencySloSeconds` (1.0).
    pub latency_slo_seconds: Option<f64>,
    /// Seconds within which the current source backlog must drain. Default:
    /// `autoscaler.catchUpSeconds` (30).
    pub catch_up_seconds: Option<f64>,
    /// Coefficient of variation cs of service times (for the Allen-Cunneen and Kingman
    /// approximations), every operator's. `None`: each operator's measured cs
    /// ([`OperatorEstimate::service_cv`], from the engine's batch timings), and 1
    /// (exponential service: M/M/c, M/M/1) for an operator without a measurement. Set, it
    /// overrides the measurements.
    pub service_cv: Option<f64>,
    /// Coefficient of variation ca of inter-arrival times. `None` = 1, Poisson arrivals.
    pub arrival_cv: Option<f64>,
    /// Expected downtime of a rescale, seconds (measured from this job's past rescales by the
    /// caller). Its backlog, downtime × γ, is added to what must drain within the catch-up
    /// time, so a scale-up is sized to absorb the rescale it causes. `None` = 0.
    pub rescale_downtime_seconds: Option<f64>,
    /// Percentile of end-to-end latency the SLO is on (reported as
    /// [`Decision::predicted_latency_percentile_seconds`]), in (0, 1). Default:
    /// `autoscaler.latencyPercentile` (0.99, p99).
    #[serde(default)]
    pub latency_percentile: Option<f64>,
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Resolved {
    pub rho: f64,
    pub slo: f64,
    pub catch_up: f64,
    pub ca: f64,
    pub cs: f64,
    /// Whether `cs` was set ([`PlannerSettings::service_cv`]): it then overrides the
    /// operators' measured cs.
    pub cs_set: bool,
    pub downtime: f64,
    pub percentile: f64,
    /// `autoscaler.onUnattainableSlo: bestEffort` (see [`BEST_EFFORT_MARGIN`]).
    pub best_effort: bool,
}

impl PlannerSettings {
    pub(crate) fn resolve(&self, a: &AutoscalerSpec) -> Result<Resolved, ModelError> {
        let r = Resolved {
            rho: self.target_utilization.unwrap_or(a.target_utilization),
            slo: self.latency_slo_seconds.unwrap_or(a.latency_slo_seconds),
            catch_up: self.catch_up_seconds.unwrap_or(a.catch_up_seconds),
            ca: self.arrival_cv.unwrap_or(1.0),
            cs: self.service_cv.unwrap_or(1.0),
            cs_set: self.service_cv.is_some(),
            downtime: self.rescale_downtime_seconds.unwrap_or(0.0),
            percentile: self.latency_percentile.unwrap_or(a.latency_percentile),
            best_effort: a.on_unattainable_slo == UnattainableSlo::BestEffort,
        };
        if !(r.percentile > 0.0 && r.percentile < 1.0) {
            return Err(ModelError::InvalidSettings(format!(
                "latency percentile {} is not in (0, 1)",
                r.percentile
            )));
        }
        let bad = |what: String| Err(ModelError::InvalidSettings(what));
        if !(r.rho > 0.0 && r.rho <= 1.0) {
            return bad(format!("target utilization {} is not in (0, 1]", r.rho));
        }
        if r.slo.is_nan() || r.slo <= 0.0 {
            return bad(format!("latency SLO {} s must be positive", r.slo));
        }
        if !(r.catch_up > 0.0 && r.catch_up.is_finite()) {
            return bad(format!(
                "catch-up time {} s must be positive and finite",
                r.catch_up
            ));
        }
        if !(r.downtime >= 0.0 && r.downtime.is_finite()) {
            return bad(format!(
                "rescale downtime {} s must be non-negative and finite",
                r.downtime
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
