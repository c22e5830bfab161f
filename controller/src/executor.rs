//! Applying a plan: stop-with-savepoint at the old parallelism, restore at the new one.
//!
//! The savepoint is never lost and never overwritten: if the new engine cannot be started from
//! it, the executor restarts the job at the old parallelism from the same savepoint; if the
//! savepoint itself fails, the old engine is left running.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::api::{EngineApi, JobStatus};
use crate::runtime::{EngineHandle, EngineRuntime, RuntimeError, Savepoint, StopOutcome};

/// How a rescale ended. In every variant `engine` is the engine now running the job.
#[derive(Debug)]
pub enum RescaleOutcome {
    /// The job runs at the new parallelism.
    Rescaled {
        /// The new engine.
        engine: EngineHandle,
        /// The savepoint the new engine was restored from.
        savepoint: Savepoint,
        /// Seconds from the savepoint request until the new engine was running.
        downtime_s: f64,
    },
    /// The savepoint failed; the old engine keeps running (or, if it died, was restarted at the
    /// old parallelism from the savepoint it had been restored from).
    SavepointFailed {
        /// The engine running the job (the old one, or its replacement).
        engine: EngineHandle,
        /// Why the savepoint failed.
        error: String,
        /// Seconds the attempt took.
        downtime_s: f64,
    },
    /// The savepoint completed but the new engine could not start from it; the job was restarted
    /// at the old parallelism from the same savepoint.
    RestoreFailed {
        /// The engine at the old parallelism.
        engine: EngineHandle,
        /// The savepoint (kept).
        savepoint: Savepoint,
        /// Why the restore at the new parallelism failed.
        error: String,
        /// Seconds from the savepoint request until the old-parallelism engine was running again.
        downtime_s: f64,
    },
}

impl RescaleOutcome {
    /// The engine running the job after the rescale attempt.
    pub fn engine(&self) -> &EngineHandle {
        match self {
            RescaleOutcome::Rescaled { engine, .. }
            | RescaleOutcome::SavepointFailed { engine, .. }
            | RescaleOutcome::RestoreFailed { engine, .. } => engine,
        }
    }

    /// Seconds the job was not processing (or the attempt lasted).
    pub fn downtime_s(&self) -> f64 {
        match self {
            RescaleOutcome::Rescaled { downtime_s, .. }
            | RescaleOutcome::SavepointFailed { downtime_s, .. }
            | RescaleOutcome::RestoreFailed { downtime_s, .. } => *downtime_s,
        }
    }
}

/// A rescale that left no engine running.
#[derive(Debug, thiserror::Error)]
pub enum ExecutorError {
    /// Neither the new nor the old parallelism could be started; the savepoint (if any) is kept.
    #[error("cannot restart the job{}: {error}", savepoint.as_ref().map(|s| format!(" from savepoint {}", s.path)).unwrap_or_default())]
    Unrecoverable {
        /// The last completed savepoint, to restore from by hand.
        savepoint: Option<Savepoint>,
        /// What went wrong.
        error: String,
    },
    /// Starting an engine failed.
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// Starts, stops and rescales the engine of one job file through a runtime.
pub struct Executor<'a, R: EngineRuntime> {
    runtime: &'a R,
    job: PathBuf,
    client: reqwest::Client,
    running_timeout: Duration,
}

impl<'a, R: EngineRuntime> Executor<'a, R> {
    /// An executor for the job file `job` (passed to every engine) on `runtime`.
    pub fn new(runtime: &'a R, job: &Path, client: reqwest::Client) -> Executor<'a, R> {
        Executor {
            runtime,
            job: job.to_path_buf(),
            client,
            running_timeout: Duration::from_secs(60),
        }
    }

    /// Replaces how long a started engine may take to report `running` (default 60 s).
    pub fn with_running_timeout(mut self, timeout: Duration) -> Self {
        self.running_timeout = timeout;
        self
    }

    /// The runtime.
    pub fn runtime(&self) -> &R {
        self.runtime
    }

    /// An API client for `engine`.
    pub fn api(&self, engine: &EngineHandle) -> EngineApi {
        EngineApi::new(self.client.clone(), &engine.base_url)
    }

    /// Starts an engine at `parallelism` (restored from `restore`) and waits until its job is
    /// `running`; kills it if it does not get there.
    ///
    /// # Errors
    /// The runtime's error, or [`RuntimeError::Api`] when the job does not reach `running`
    /// (with the engine's exit reason when it died).
    pub async fn launch(
        &self,
        parallelism: &BTreeMap<String, u32>,
        restore: Option<&Savepoint>,
    ) -> Result<(EngineHandle, JobStatus), RuntimeError> {
        let engine = self.runtime.start(&self.job, parallelism, restore).await?;
        match self.api(&engine).wait_running(self.running_timeout).await {
            Ok(job) => Ok((engine, job)),
            Err(e) => {
                let err = match self.runtime.exited(&engine).await {
                    Some(exit) => exit,
                    None => {
                        let _ = self.runtime.kill(&engine).await;
                        e.into()
                    }
                };
                Err(err)
            }
        }
    }

    /// Stop-with-savepoint and release the engine (used for the final, draining stop).
    ///
    /// # Errors
    /// The runtime's error; the engine is killed in that case unless still running.
    pub async fn stop(
        &self,
        engine: &EngineHandle,
        drain: bool,
    ) -> Result<StopOutcome, RuntimeError> {
        let outcome = self.runtime.stop_with_savepoint(engine, drain).await;
        if let Err(e) = self.runtime.shutdown(engine).await {
            tracing::debug!("shutdown after stop: {e}");
        }
        outcome
    }

    /// Rescales the job running on `engine` to `target` parallelism.
    ///
    /// # Errors
    /// [`ExecutorError::Unrecoverable`] when no engine could be left running.
    pub async fn rescale(
        &self,
        engine: EngineHandle,
        target: &BTreeMap<String, u32>,
    ) -> Result<RescaleOutcome, ExecutorError> {
        let started = Instant::now();
        let old_parallelism = engine.parallelism.clone();
        let stop = self.runtime.stop_with_savepoint(&engine, false).await;
        let savepoint = match stop {
            Ok(outcome) => outcome.savepoint,
            Err(error) => {
                return self
                    .recover_after_failed_savepoint(engine, error, started)
                    .await;
            }
        };
        if let Err(e) = self.runtime.shutdown(&engine).await {
            tracing::debug!("shutdown of the old engine: {e}");
        }
        match self.launch(target, Some(&savepoint)).await {
            Ok((new_engine, _)) => Ok(RescaleOutcome::Rescaled {
                engine: new_engine,
                savepoint,
                downtime_s: started.elapsed().as_secs_f64(),
            }),
            Err(restore_error) => {
                tracing::warn!(
                    "restore at the new parallelism failed ({restore_error}); restarting at the old parallelism from {}",
                    savepoint.path
                );
                match self.launch(&old_parallelism, Some(&savepoint)).await {
                    Ok((old_engine, _)) => Ok(RescaleOutcome::RestoreFailed {
                        engine: old_engine,
                        savepoint,
                        error: restore_error.to_string(),
                        downtime_s: started.elapsed().as_secs_f64(),
                    }),
                    Err(e) => Err(ExecutorError::Unrecoverable {
                        savepoint: Some(savepoint),
                        error: format!(
                            "restore at the new parallelism failed ({restore_error}), and at the old one too ({e})"
                        ),
                    }),
                }
            }
        }
    }

    async fn recover_after_failed_savepoint(
        &self,
        engine: EngineHandle,
        error: RuntimeError,
        started: Instant,
    ) -> Result<RescaleOutcome, ExecutorError> {
        let alive = self.runtime.exited(&engine).await.is_none();
        if alive {
            // The engine may still be stopping after a failed savepoint; give it a moment.
            if let Ok(job) = self.api(&engine).wait_running(Duration::from_secs(5)).await
                && job.state == "running"
            {
                return Ok(RescaleOutcome::SavepointFailed {
                    engine,
                    error: error.to_string(),
                    downtime_s: started.elapsed().as_secs_f64(),
                });
            }
            let _ = self.runtime.kill(&engine).await;
        }
        // The old engine is gone: restart at the old parallelism from its own restore point.
        let restore = engine.restored_from.clone();
        match self.launch(&engine.parallelism, restore.as_ref()).await {
            Ok((replacement, _)) => Ok(RescaleOutcome::SavepointFailed {
                engine: replacement,
                error: format!(
                    "{error}; the engine stopped, restarted at the old parallelism from {}",
                    restore
                        .as_ref()
                        .map_or("scratch".to_string(), |s| s.path.clone())
                ),
                downtime_s: started.elapsed().as_secs_f64(),
            }),
            Err(e) => Err(ExecutorError::Unrecoverable {
                savepoint: restore,
                error: format!("savepoint failed ({error}) and the restart failed ({e})"),
            }),
        }
    }
}
