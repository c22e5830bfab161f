//! `streamscale-sim`: replays workload traces through a model of a job to compare autoscaling
//! policies over days of traffic in seconds.
//!
//! * [`config`]: simulator settings (service times, rescale cost, intervals).
//! * [`model`]: the job model (operators, selectivities, key-group shares, latency model).
//! * [`plant`]: counters with the engine's metric meaning; conversion to the planner's
//!   [`MetricSample`](streamscale_controller::model::MetricSample)s.
//! * [`fluid`]: fast mode (fluid, discrete time). [`des`]: event-level mode (discrete events).
//! * [`policy`]: streamscale (the controller's planner, unchanged), ds2, flink, threshold,
//!   static, oracle.
//! * [`runner`]: the replay loop and accounting. [`report`]: summary.json, CSV, table, plots.
//!   [`progress`]: the progress bar of long replays.
//! * [`rates`]: replayed service rates (`--service-rates`), measured μ over time;
//!   [`run_settings`]: the replayed run's autoscaler settings, from its `summary.json`.

pub mod config;
pub mod des;
pub mod fluid;
pub mod model;
pub mod plant;
pub mod policy;
pub mod progress;
pub mod rates;
pub mod report;
pub mod run_settings;
pub mod runner;

use std::path::Path;

use streamscale_engine::spec::{JobSpec, OperatorKind, RateSpec};
use streamscale_engine::trace::{RateFunction, Trace, TraceError};

/// Errors loading simulator inputs.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The job file is invalid.
    #[error(transparent)]
    Spec(#[from] streamscale_engine::spec::SpecError),
    /// The trace file is invalid.
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The simulator settings file is invalid.
    #[error("{path}: {problem}")]
    Config {
        /// The settings file.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// A service-rates file ([`rates`]) is malformed.
    #[error("{path}: line {line}: {problem}")]
    ServiceRates {
        /// The file.
        path: String,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        problem: String,
    },
    /// The `summary.json` of a replayed run ([`run_settings`]) is unreadable or malformed; the
    /// problem names the field.
    #[error("{path}: {problem}")]
    RunSummary {
        /// The file.
        path: String,
        /// What is wrong.
        problem: String,
    },
    /// The job cannot be modelled (cycle, unknown operator in an override, bad option).
    #[error("{0}")]
    Model(String),
    /// A report file could not be written.
    #[error("{path}: {message}")]
    Write {
        /// The file.
        path: String,
        /// The reason.
        message: String,
    },
}

/// Statistics of a rate trace, in records/s after the source's `scale`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TraceSummary {
    /// Number of rows.
    pub rows: usize,
    /// Usual spacing between rows, seconds.
    pub resolution_s: f64,
    /// Trace length, seconds.
    pub length_s: f64,
    /// Smallest rate.
    pub min: f64,
    /// Median rate.
    pub median: f64,
    /// 99th-percentile rate.
    pub p99: f64,
    /// Largest rate.
    pub max: f64,
    /// Records a replay of the configured window would emit (∫ rate over wall time, at most
    /// the source's `count`).
    pub records_in_window: f64,
}

/// Summarizes a trace scaled by `scale` (order statistics by nearest rank).
pub fn summarize(trace: &Trace, scale: f64) -> TraceSummary {
    let mut rates: Vec<f64> = trace.rates.iter().map(|r| r * scale).collect();
    rates.sort_by(f64::total_cmp);
    let rank = |q: f64| rates[((q * rates.len() as f64).ceil() as usize).clamp(1, rates.len()) - 1];
    TraceSummary {
        rows: rates.len(),
        resolution_s: trace.resolution,
        length_s: trace.end() - trace.times[0],
        min: rates[0],
        median: rank(0.5),
        p99: rank(0.99),
        max: rates[rates.len() - 1],
        records_in_window: 0.0,
    }
}

/// Loads `job` and, for each source following a trace, summarizes that trace.
///
/// # Errors
/// [`SimError`] naming the file and the reason.
pub fn load(job: &Path) -> Result<(JobSpec, Vec<(String, TraceSummary)>), SimError> {
    let spec = JobSpec::from_file(job)?;
    let mut out = Vec::new();
    for op in &spec.operators {
        if let OperatorKind::Source {
            rate: rate @ RateSpec::Trace(t),
            count,
            ..
        } = &op.kind
        {
            let trace = Trace::from_file(&t.file)?;
            let mut summary = summarize(&trace, t.scale);
            let f = RateFunction::from_spec(rate)?;
            let window = f.cumulative(f.wall_end().unwrap_or(0.0));
            summary.records_in_window = count.map_or(window, |c| window.min(c as f64));
            out.push((op.name.clone(), summary));
        }
    }
    Ok((spec, out))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn summary_of_a_small_trace() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("t.csv");
        std::fs::write(&f, "t_seconds,rate\n0,1\n60,5\n120,2\n180,4\n").unwrap();
        let s = summarize(&Trace::from_file(&f).unwrap(), 2.0);
        assert_eq!((s.rows, s.min, s.median, s.max), (4, 2.0, 4.0, 10.0));
        assert_eq!(s.length_s, 240.0);
    }
}
