//! Simulator settings: service-time distributions, rescale cost, step and decision intervals.
//!
//! Everything has a default, so a job file alone is enough. Settings can come from a small
//! YAML file (`--sim-config FILE`) and from command-line flags, flags winning:
//!
//! ```yaml
//! seed: 7                  # random seed of the event-level mode
//! stepSeconds: 1           # fast-mode step, simulated seconds (default: auto)
//! intervalSeconds: 5       # metrics (decision) interval of streamscale and ds2, seconds
//! windowSeconds: 30        # metric window handed to streamscale and ds2, seconds
//! stabilizationSeconds: 10 # streamscale: no decision this long after a (re)start
//! scaleDownDelaySeconds: 30 # streamscale: a scale-down must be wanted this long
//! guardWindowSeconds: 15   # streamscale: least history before a decision (default below)
//! overheadMicros: 5        # per-record framework overhead added to cpu + io, µs
//! arrivals: poisson        # `poisson` (default) or `paced` (as the engine's source)
//! sloSeconds: 1            # latency SLO (default: the job's autoscaler.latencySloSeconds)
//! latencyPercentile: 0.95  # its percentile (default: the job's autoscaler.latencyPercentile)
//! onUnattainableSlo: bestEffort # or utilizationOnly (default: the job's autoscaler.onUnattainableSlo)
//! operators:
//!   enrich: { meanMicros: 5200, cv: 1.5 }   # per-record service time: mean (µs) and CV
//! rescale:
//!   downtimeSeconds: 0.6   # fixed stop-with-savepoint + restore time per rescale
//!   secondsPerMb: 0.02     # extra downtime per MB of keyed state
//!   stateMb: 1.0           # keyed state size (default: keys × 64 bytes per keyed operator)
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use streamscale_engine::spec::UnattainableSlo;

use crate::SimError;

/// Per-operator service-time distribution override.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServiceOverride {
    /// Mean service time of one record at one subtask, µs (1/μ). Default: `cpu + io +
    /// overheadMicros` from the job file.
    pub mean_micros: Option<f64>,
    /// Coefficient of variation cs of the service time (σ/mean). Default 1 (exponential).
    pub cv: Option<f64>,
}

/// Rescale cost model: downtime = `downtime_seconds + seconds_per_mb × state_mb`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RescaleCost {
    /// Fixed downtime per rescale, seconds. Default 0.6 s: `streamscale run` measured
    /// 0.43–0.93 s per stop-with-savepoint and restore on the reference machine.
    pub downtime_seconds: f64,
    /// Additional downtime per MB of keyed state (write + read of the savepoint), s/MB.
    /// Default 0.02 s/MB (50 MB/s).
    pub seconds_per_mb: f64,
    /// Keyed state size, MB. `None` = 64 bytes per key per keyed operator.
    pub state_mb: Option<f64>,
}

impl Default for RescaleCost {
    fn default() -> Self {
        RescaleCost {
            downtime_seconds: 0.6,
            seconds_per_mb: 0.02,
            state_mb: None,
        }
    }
}

/// Arrival process of the sources: the event mode draws (or spaces) its arrivals by it; the
/// fast mode takes its squared coefficient of variation (1 or 0) as the sources' ca² in the
/// queueing formulas ([`crate::model::JobModel::source_scv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Poisson arrivals at the step's rate (exponential gaps): the queueing models' assumption.
    #[default]
    Poisson,
    /// Evenly spaced arrivals, as the engine's source emits: record k is due when ∫ rate reaches
    /// k (`due = ⌊∫ rate⌋`), so the gaps are 1 / rate.
    Paced,
}

/// All simulator settings. Times are simulated seconds (trace seconds / speedup).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SimConfig {
    /// Seed of the event-level mode's random streams. Default 1.
    pub seed: u64,
    /// Fast-mode step, simulated seconds. `None` = auto: 1 s for runs up to 6 h, 10 s beyond.
    pub step_seconds: Option<f64>,
    /// Metrics (decision) interval of `streamscale` and `ds2`, seconds. Default 5 s, the
    /// operator's `metricsIntervalSeconds` (`operator/src/crd.rs`). `flink` keeps its own 60 s
    /// loop, `threshold` HPA's 15 s sync period. A decision can come no more often than once
    /// per step.
    pub interval_seconds: f64,
    /// Metric window given to `streamscale` and `ds2`, seconds. Default 30 s, the operator's
    /// `metricsWindowSeconds`.
    pub window_seconds: f64,
    /// `streamscale`: seconds after a (re)start before the planner may decide. Default 10 s
    /// (the operator's `stabilizationSeconds`; `streamscale run` uses 3).
    pub stabilization_seconds: f64,
    /// `streamscale`: seconds a scale-down must be wanted before it applies. Default 30 s (the
    /// operator's `scaleDownDelaySeconds`; `streamscale run` uses 15).
    pub scale_down_delay_seconds: f64,
    /// `streamscale`: least history (first to last sample) before a decision, seconds.
    /// `None` = max(window / 2, 2 × interval), as the operator derives it (`streamscale run`
    /// uses min(3 × interval, window)).
    pub guard_window_seconds: Option<f64>,
    /// Per-record overhead added to `cpu + io`, µs. Default 5 µs.
    pub overhead_micros: f64,
    /// Event mode's arrival process. Default Poisson.
    pub arrivals: Arrivals,
    /// Service-time overrides by operator name.
    pub operators: BTreeMap<String, ServiceOverride>,
    /// Rescale cost model.
    pub rescale: RescaleCost,
    /// Latency SLO, seconds. `None` = the job's `autoscaler.latencySloSeconds`.
    pub slo_seconds: Option<f64>,
    /// Percentile the SLO is on, in (0, 1) (0.95 = p95). `None` = the job's
    /// `autoscaler.latencyPercentile` (0.99 by default).
    pub latency_percentile: Option<f64>,
    /// What the planner (the streamscale policies) does when the latency SLO is unattainable
    /// even at every operator's maximum parallelism by its bound: `utilizationOnly` (no
    /// subtasks for latency) or `bestEffort` (subtasks down to 1.1 × the lowest bound there).
    /// `None` = the job's `autoscaler.onUnattainableSlo` (default `utilizationOnly`).
    pub on_unattainable_slo: Option<UnattainableSlo>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            step_seconds: None,
            interval_seconds: 5.0,
            window_seconds: 30.0,
            stabilization_seconds: 10.0,
            scale_down_delay_seconds: 30.0,
            guard_window_seconds: None,
            overhead_micros: 5.0,
            arrivals: Arrivals::Poisson,
            operators: BTreeMap::new(),
            rescale: RescaleCost::default(),
            slo_seconds: None,
            latency_percentile: None,
            on_unattainable_slo: None,
        }
    }
}

impl SimConfig {
    /// The guard settings of the `streamscale` policy (see the fields).
    pub fn guard_settings(&self) -> streamscale_controller::model::GuardSettings {
        streamscale_controller::model::GuardSettings {
            window_seconds: self
                .guard_window_seconds
                .unwrap_or((self.window_seconds / 2.0).max(2.0 * self.interval_seconds)),
            stabilization_seconds: self.stabilization_seconds,
            scale_down_delay_seconds: self.scale_down_delay_seconds,
            ..streamscale_controller::model::GuardSettings::default()
        }
    }

    /// Checks that the `streamscale` policy's metric window, sampled once per `step_s`
    /// (simulated seconds), can ever satisfy its guards: the window keeps the snapshots of the
    /// last `windowSeconds` (⌊window / step⌋ + 1 of them), and the guards want at least
    /// [`GuardSettings::min_samples`](streamscale_controller::model::GuardSettings) of them
    /// spanning their history (`guardWindowSeconds`). A window not longer than the step holds
    /// two snapshots at most: every decision would wait for data, silently.
    ///
    /// # Errors
    /// A message naming `windowSeconds`, the step and what to change.
    pub fn check_step(&self, step_s: f64) -> Result<(), String> {
        let guards = self.guard_settings();
        let need = guards.min_samples.max(2);
        // Snapshots are `step_s` apart; those within the window are kept.
        let kept = (self.window_seconds / step_s + 1e-9).floor() + 1.0;
        let span = (kept - 1.0) * step_s;
        if kept >= need as f64 && span + 1e-9 >= guards.window_seconds {
            return Ok(());
        }
        let least = (need as f64 - 1.0) * step_s;
        Err(format!(
            "windowSeconds: a {} s metric window at a step of {step_s} s holds {kept} snapshot(s) spanning {span} s, but streamscale needs {need} spanning {} s (guardWindowSeconds): it would never decide; give windowSeconds (--window) at least {} s or a smaller step (--step / stepSeconds)",
            self.window_seconds,
            guards.window_seconds,
            least.max(guards.window_seconds),
        ))
    }

    /// Reads a YAML settings file.
    ///
    /// # Errors
    /// [`SimError::Config`] naming the file and the parser's line and column.
    pub fn from_file(path: &Path) -> Result<SimConfig, SimError> {
        let text = std::fs::read_to_string(path).map_err(|e| SimError::Config {
            path: path.display().to_string(),
            problem: e.to_string(),
        })?;
        let cfg: SimConfig = serde_saphyr::from_str(&text).map_err(|e| SimError::Config {
            path: path.display().to_string(),
            problem: streamscale_engine::spec::yaml_error_line(&e),
        })?;
        cfg.validate().map_err(|problem| SimError::Config {
            path: path.display().to_string(),
            problem,
        })?;
        Ok(cfg)
    }

    /// Checks ranges; the message names the field.
    ///
    /// # Errors
    /// A message such as `intervalSeconds: must be > 0`.
    pub fn validate(&self) -> Result<(), String> {
        let pos = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("{name}: {v} must be a positive number"))
            }
        };
        let nonneg = |name: &str, v: f64| {
            if v.is_finite() && v >= 0.0 {
                Ok(())
            } else {
                Err(format!("{name}: {v} must be a non-negative number"))
            }
        };
        if let Some(s) = self.step_seconds {
            pos("stepSeconds", s)?;
        }
        pos("intervalSeconds", self.interval_seconds)?;
        pos("windowSeconds", self.window_seconds)?;
        // As in `streamscale run`: a window with fewer than two samples gives no rate, so the
        // policies that read it would never decide.
        if self.window_seconds < 2.0 * self.interval_seconds {
            return Err(format!(
                "windowSeconds: {} s must span at least two intervals (2 × intervalSeconds = {} s)",
                self.window_seconds,
                2.0 * self.interval_seconds
            ));
        }
        nonneg("overheadMicros", self.overhead_micros)?;
        nonneg("stabilizationSeconds", self.stabilization_seconds)?;
        nonneg("scaleDownDelaySeconds", self.scale_down_delay_seconds)?;
        if let Some(g) = self.guard_window_seconds {
            nonneg("guardWindowSeconds", g)?;
        }
        nonneg("rescale.downtimeSeconds", self.rescale.downtime_seconds)?;
        nonneg("rescale.secondsPerMb", self.rescale.seconds_per_mb)?;
        if let Some(s) = self.rescale.state_mb {
            nonneg("rescale.stateMb", s)?;
        }
        if let Some(s) = self.slo_seconds {
            pos("sloSeconds", s)?;
        }
        if let Some(q) = self.latency_percentile
            && !(q > 0.0 && q < 1.0)
        {
            return Err(format!(
                "latencyPercentile: {q} is not in (0, 1) (0.99 is p99)"
            ));
        }
        for (name, o) in &self.operators {
            if let Some(m) = o.mean_micros {
                pos(&format!("operators.{name}.meanMicros"), m)?;
            }
            if let Some(c) = o.cv {
                nonneg(&format!("operators.{name}.cv"), c)?;
            }
        }
        Ok(())
    }
}
