//! Checks of the job's `autoscaler` settings: utilization, latency, forecast and limits.

use super::*;

/// Longest `autoscaler.scaleDownLookbackSeconds` accepted, seconds (7 days).
const MAX_LOOKBACK_SECONDS: f64 = 7.0 * 86_400.0;

impl JobSpec {
    /// Checks `autoscaler` (utilization, latency SLO, catch-up, scale-down lookback, forecast,
    /// limits).
    ///
    /// # Errors
    /// The first problem found, naming the field.
    pub(super) fn validate_autoscaler(&self) -> Result<(), String> {
        let a = &self.autoscaler;
        if !(a.target_utilization > 0.0 && a.target_utilization <= 1.0) {
            return Err(format!(
                "autoscaler.targetUtilization: {} is not in (0, 1]",
                a.target_utilization
            ));
        }
        if !(a.latency_slo_seconds > 0.0 && a.latency_slo_seconds.is_finite()) {
            return Err(format!(
                "autoscaler.latencySloSeconds: {} must be a positive number of seconds",
                a.latency_slo_seconds
            ));
        }
        if !(a.latency_percentile > 0.0 && a.latency_percentile < 1.0) {
            return Err(format!(
                "autoscaler.latencyPercentile: {} is not in (0, 1) (0.99 is p99)",
                a.latency_percentile
            ));
        }
        if !(a.catch_up_seconds > 0.0 && a.catch_up_seconds.is_finite()) {
            return Err(format!(
                "autoscaler.catchUpSeconds: {} must be a positive number of seconds",
                a.catch_up_seconds
            ));
        }
        if let Some(l) = a.scale_down_lookback_seconds
            && !(0.0..=MAX_LOOKBACK_SECONDS).contains(&l)
        {
            return Err(format!(
                "autoscaler.scaleDownLookbackSeconds: {l} must be 0 (off) or a number of seconds up to {MAX_LOOKBACK_SECONDS} (7 days); to keep an operator from scaling down, give it a scaling.min"
            ));
        }
        if let Some(m) = a.max_utilization
            && !(m >= a.target_utilization && m <= 1.0)
        {
            return Err(format!(
                "autoscaler.maxUtilization: {m} must be in [targetUtilization ({}), 1]",
                a.target_utilization
            ));
        }
        if let Some(m) = a.min_utilization
            && !(m > 0.0 && m <= a.target_utilization)
        {
            return Err(format!(
                "autoscaler.minUtilization: {m} must be in (0, targetUtilization ({})]",
                a.target_utilization
            ));
        }
        if let Some(f) = &a.forecast {
            if !(f.season_seconds > 0.0 && f.season_seconds.is_finite()) {
                return Err(format!(
                    "autoscaler.forecast.seasonSeconds: {} must be a positive number of seconds",
                    f.season_seconds
                ));
            }
            if let Some(b) = f
                .bin_seconds
                .filter(|b| !(*b > 0.0 && *b <= f.season_seconds / 2.0))
            {
                return Err(format!(
                    "autoscaler.forecast.binSeconds: {b} must be positive and at most half of seasonSeconds ({})",
                    f.season_seconds
                ));
            }
            if let Some(h) = f
                .horizon_seconds
                .filter(|h| !(*h >= 0.0 && *h <= f.season_seconds))
            {
                return Err(format!(
                    "autoscaler.forecast.horizonSeconds: {h} must be in [0, seasonSeconds ({})]",
                    f.season_seconds
                ));
            }
            if !(f.max_error > 0.0 && f.max_error.is_finite()) {
                return Err(format!(
                    "autoscaler.forecast.maxError: {} must be a positive share (0.3 = 30%)",
                    f.max_error
                ));
            }
        }
        if let Some(l) = &a.limits {
            if !(0.0..=1.0).contains(&l.max_shed_share) {
                return Err(format!(
                    "autoscaler.limits.maxShedShare: {} is not in [0, 1]",
                    l.max_shed_share
                ));
            }
            if l.quota_subtasks == Some(0) {
                return Err("autoscaler.limits.quotaSubtasks: must be at least 1".into());
            }
        }
        Ok(())
    }
}
