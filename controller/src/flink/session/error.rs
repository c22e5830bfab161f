//! The errors that end `streamscale flink`.

use super::*;

/// Errors that end `streamscale flink`.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The cluster cannot be reached or answered something unexpected.
    #[error(transparent)]
    Flink(#[from] FlinkError),
    /// A named job has ended.
    #[error("job {job} is {state}: nothing to autoscale")]
    NotRunning {
        /// The job id.
        job: String,
        /// Its state.
        state: String,
    },
    /// No job to autoscale.
    #[error("no RUNNING job on the Flink cluster at {0} (submit one, or wait for it)")]
    NoJobs(String),
    /// A bad option.
    #[error("{0}")]
    Option(String),
    /// The report could not be written.
    #[error("{path}: {source}")]
    Report {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// A job's graph could not be read.
    #[error(transparent)]
    Topology(#[from] crate::flink::topology::TopologyError),
}
