//! Where engines run: the [`EngineRuntime`] trait and its local implementation.
//!
//! A runtime starts an engine for a job file at a given parallelism (optionally restored from
//! a savepoint), stops it with a savepoint, and tears it down. The trait knows nothing about
//! processes or pods: an engine is an [`EngineHandle`] with a base URL for its REST API and
//! metrics, and a savepoint is an opaque [`Savepoint`] location the runtime can restore from.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;

use crate::api::{ApiError, JobStatus};

pub mod engine_binary;
pub mod local;
pub mod token;

pub use local::LocalRuntime;

/// A running engine, as returned by [`EngineRuntime::start`].
#[derive(Debug, Clone, PartialEq)]
pub struct EngineHandle {
    /// Runtime-specific identifier (unique within one runtime).
    pub id: u64,
    /// Base URL of the engine's HTTP API and metrics, e.g. `http://127.0.0.1:40123`.
    pub base_url: String,
    /// Parallelism per operator the engine was started with.
    pub parallelism: BTreeMap<String, u32>,
    /// The savepoint it was restored from, if any.
    pub restored_from: Option<Savepoint>,
}

/// A completed savepoint: a location the runtime can restore an engine from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct Savepoint {
    /// Location as the engine reports it (a directory path for local engines).
    pub path: String,
}

/// The result of a stop-with-savepoint.
#[derive(Debug, Clone, PartialEq)]
pub struct StopOutcome {
    /// The completed savepoint.
    pub savepoint: Savepoint,
    /// The job's final status (totals such as `recordsEmitted`), read with the completed
    /// savepoint; `None` from a runtime that cannot read it (the unit tests' mock runtime).
    pub final_job: Option<JobStatus>,
}

/// Errors from starting, stopping or tearing down engines.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The engine could not be launched at all.
    #[error(
        "cannot run engine `{binary}`: {source} (`streamscale run` looks for `streamscale-engine` next to its own executable: build both with `cargo build --release` (target/release), or pass --engine PATH or set STREAMSCALE_ENGINE_BIN)"
    )]
    Spawn {
        /// The engine binary.
        binary: String,
        /// The launch error.
        source: std::io::Error,
    },
    /// The engine exited (during start-up or later); `last_error` is its last WARN/ERROR (or
    /// `error:`/panic) line on stderr, or says there was none, and names its log file.
    #[error("engine exited ({status}): {last_error}")]
    Exited {
        /// Exit status description, e.g. `exit code 2`.
        status: String,
        /// Last non-empty stderr line, or a note that there was none.
        last_error: String,
    },
    /// The engine did not announce its address in time.
    #[error("engine did not report its listening address within {seconds:.0} s")]
    StartTimeout {
        /// Seconds waited.
        seconds: f64,
    },
    /// The engine's first stdout line was not the expected `listening` event.
    #[error("engine printed an unexpected first line: {line}")]
    BadListeningLine {
        /// The line.
        line: String,
    },
    /// A REST call to the engine failed.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// A log or savepoint directory could not be created or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A Flink cluster's REST API refused or failed a request.
    #[error(transparent)]
    Flink(Box<crate::flink::FlinkError>),
    /// A job submission (the Flink backend's resubmit command) failed.
    #[error("{0}")]
    Submit(String),
    /// The handle does not belong to this runtime (or was already shut down).
    #[error("unknown engine handle {id}")]
    UnknownHandle {
        /// The handle's id.
        id: u64,
    },
}

impl From<crate::flink::FlinkError> for RuntimeError {
    fn from(e: crate::flink::FlinkError) -> Self {
        RuntimeError::Flink(Box::new(e))
    }
}

/// Starts and stops engines. Implementations: [`LocalRuntime`] (child processes on loopback);
/// a Kubernetes runtime can implement the same operations with pods.
pub trait EngineRuntime: Send + Sync {
    /// Starts an engine for the job file `job` with the given parallelism per operator
    /// (overriding the file's), restored from `restore` if given. Returns once the engine serves
    /// its API (the job may still be initializing: wait for `running` via the API).
    fn start(
        &self,
        job: &Path,
        parallelism: &BTreeMap<String, u32>,
        restore: Option<&Savepoint>,
    ) -> impl Future<Output = Result<EngineHandle, RuntimeError>> + Send;

    /// Stop-with-savepoint (`drain` also fires all open windows). On success the engine is
    /// stopping and exits on its own; call [`EngineRuntime::shutdown`] afterwards. On failure
    /// the engine keeps running (unless it crashed).
    fn stop_with_savepoint(
        &self,
        handle: &EngineHandle,
        drain: bool,
    ) -> impl Future<Output = Result<StopOutcome, RuntimeError>> + Send;

    /// The job's status (`GET /v1/job`), e.g. to wait for `running` or read the totals.
    fn job_status(
        &self,
        handle: &EngineHandle,
    ) -> impl Future<Output = Result<JobStatus, RuntimeError>> + Send;

    /// Releases the engine: waits a grace period for it to exit on its own, then kills it.
    fn shutdown(
        &self,
        handle: &EngineHandle,
    ) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// Kills the engine at once (no savepoint).
    fn kill(&self, handle: &EngineHandle) -> impl Future<Output = Result<(), RuntimeError>> + Send;

    /// The bearer token the engines of this runtime require on state-changing requests
    /// (`streamscale_engine::auth`), `None` when they require none.
    fn auth_token(&self) -> Option<&str> {
        None
    }

    /// Whether an engine whose stop-with-savepoint failed recovers on its own (Flink restarts a
    /// job that failed over during its stop by its restart strategy) and is left to do so while
    /// it has not ended, never killed; and whether, once it has ended, it is never started again
    /// from what it was restored from (an older restore point: its exactly-once sinks committed
    /// output after it). `false` (the default): a stopped engine that is not `running` within a
    /// few seconds is killed and the job redeployed from its restore point.
    fn recovers_on_its_own(&self) -> bool {
        false
    }

    /// `Some(description)` when the engine has exited (with its status and last error line),
    /// `None` while it is alive.
    fn exited(&self, handle: &EngineHandle) -> impl Future<Output = Option<RuntimeError>> + Send;
}

/// Polls the job's status every 100 ms until it is `running`.
///
/// # Errors
/// The engine's exit ([`EngineRuntime::exited`]) at once when it does not answer because it
/// has exited; [`ApiError::NotRunning`] (as [`RuntimeError::Api`]) after `timeout`, or at once when the
/// job is `failed`, `finished` or `stopped`.
pub async fn wait_running<R: EngineRuntime>(
    runtime: &R,
    engine: &EngineHandle,
    timeout: std::time::Duration,
) -> Result<JobStatus, RuntimeError> {
    let started = tokio::time::Instant::now();
    let not_running = |last: String| {
        RuntimeError::Api(ApiError::NotRunning {
            url: format!("{}/v1/job", engine.base_url),
            waited_s: started.elapsed().as_secs_f64(),
            last,
        })
    };
    loop {
        let last = match runtime.job_status(engine).await {
            Ok(job) if job.state == "running" => return Ok(job),
            Ok(job) if matches!(job.state.as_str(), "failed" | "finished" | "stopped") => {
                return Err(not_running(format!("state {}", job.state)));
            }
            Ok(job) => format!("state {}", job.state),
            // No answer: an engine that has exited is not waited for.
            Err(e) => match runtime.exited(engine).await {
                Some(exit) => return Err(exit),
                None => e.to_string(),
            },
        };
        if started.elapsed() >= timeout {
            return Err(not_running(last));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Formats a parallelism map as the engine's `--parallelism` value: `op=N,op=N`.
pub fn parallelism_arg(parallelism: &BTreeMap<String, u32>) -> String {
    parallelism
        .iter()
        .map(|(op, p)| format!("{op}={p}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallelism_arg_lists_operators_in_order() {
        let p: BTreeMap<String, u32> = [("sink".to_string(), 1), ("enrich".to_string(), 6)]
            .into_iter()
            .collect();
        assert_eq!(parallelism_arg(&p), "enrich=6,sink=1");
    }
}
