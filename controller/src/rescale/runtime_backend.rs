//! The rescale machine's backend over an [`EngineRuntime`]: the bundled engine as a local
//! process (`streamscale run`) or a Flink job resubmitted from a savepoint
//! (`streamscale flink`).
//!
//! The rescale's state lives in memory (a `streamscale run` that dies takes its engines with
//! it), and times are seconds since the rescale started. A runtime's stop-with-savepoint waits
//! for the savepoint, so the request is the poll: the machine's next turn observes its result.
//! An engine that fails during the savepoint is observed as stopped without the savepoint, so
//! the machine redeploys the old parallelism from the latest restore point (the engine's
//! latest checkpoint when a [`RestorePointFn`] is given, else the savepoint it was restored
//! from). A restore that fails (the engine exits, its job reports `failed`, `finished` or
//! `stopped`, or it does not run within the running timeout) is rolled back by the machine
//! from the newest restore point of the failed engine, found once it is killed or has exited
//! (with a [`RestorePointFn`], its latest completed checkpoint when newer than the savepoint:
//! it may have run, completed checkpoints and committed output through exactly-once sinks
//! before it failed).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::drive::{RescaleBackend, SavepointRequest};
use super::machine::{
    EngineObs, Observation, RescaleState, RescaleStep, SavepointObs, Transition, WorkloadObs,
    savepoint_id,
};
use crate::api::ApiError;
use crate::runtime::{EngineHandle, EngineRuntime, RuntimeError, Savepoint, wait_running};

/// Where a replacement for a dead engine resumes, given the savepoint the dead engine was
/// restored from (`None`: it started fresh): that savepoint, a newer completed checkpoint, or
/// `None` for the beginning. Blocking I/O; an error falls back to that savepoint.
pub type RestorePointFn =
    Arc<dyn Fn(Option<&Savepoint>) -> Result<Option<Savepoint>, String> + Send + Sync>;

/// How long an engine whose savepoint failed may take to report `running` again before it is
/// counted as stopped (and replaced).
const SAVEPOINT_FAILED_GRACE: Duration = Duration::from_secs(5);

/// One rescale of the engine `old` through `runtime`.
pub struct RuntimeBackend<'a, R: EngineRuntime> {
    runtime: &'a R,
    job: &'a Path,
    old: EngineHandle,
    running_timeout: Duration,
    restore_point: Option<RestorePointFn>,
    started: Instant,
    /// The engine deployed last (`None` when its start failed), and what it was deployed as.
    engine: Option<EngineHandle>,
    deployed: WorkloadObs,
    /// When the engine deployed last was started, and the last thing it said (for the error
    /// of a restore that did not reach `running`).
    deployed_at: Instant,
    last_seen: String,
    /// The error of each deployed engine that did not run, in order; `failed_counted` once the
    /// current engine's is in.
    launch_errors: Vec<String>,
    failed_counted: bool,
    /// The completed savepoint, or why the stop-with-savepoint failed.
    savepoint: Option<Savepoint>,
    savepoint_error: Option<String>,
    /// The old engine runs again after its failed savepoint (`Some(false)`: it stopped).
    old_alive: Option<bool>,
    /// Where a stopped old engine resumes (see [`RestorePointFn`]).
    fallback: Option<Savepoint>,
    /// Where the job resumes after the engine deployed last failed (see [`RestorePointFn`];
    /// `None` while it has not failed, or without a [`RestorePointFn`]).
    newest: Option<Savepoint>,
}

impl<'a, R: EngineRuntime> RuntimeBackend<'a, R> {
    /// A rescale of `old` (running the job file `job`); a deployed engine has `running_timeout`
    /// to run its job.
    pub fn new(
        runtime: &'a R,
        job: &'a Path,
        old: EngineHandle,
        running_timeout: Duration,
        restore_point: Option<RestorePointFn>,
    ) -> Self {
        RuntimeBackend {
            runtime,
            job,
            deployed: WorkloadObs {
                parallelism: old.parallelism.clone(),
                restore: old.restored_from.as_ref().map(|s| s.path.clone()),
            },
            engine: Some(old.clone()),
            old,
            running_timeout,
            restore_point,
            started: Instant::now(),
            deployed_at: Instant::now(),
            last_seen: String::new(),
            launch_errors: Vec::new(),
            failed_counted: false,
            savepoint: None,
            savepoint_error: None,
            old_alive: None,
            fallback: None,
            newest: None,
        }
    }

    /// The state a rescale to `target` starts in (its savepoint id chosen up front).
    pub fn start_state(&self, target: &BTreeMap<String, u32>) -> RescaleState {
        let now = self.now();
        RescaleState {
            step: RescaleStep::Savepointing,
            from: self.old.parallelism.clone(),
            to: target.clone(),
            reason: String::new(),
            savepoint_id: Some(savepoint_id(&format!("run-{now}"))),
            savepoint_path: None,
            rolling_back: false,
            started_at: now.clone(),
            step_started_at: now,
        }
    }

    /// Seconds since the rescale started (its downtime once it ended).
    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    /// The engine running the job now (the old one until a replacement was deployed).
    pub fn engine(&self) -> Option<&EngineHandle> {
        self.engine.as_ref()
    }

    /// The completed savepoint of this rescale.
    pub fn savepoint(&self) -> Option<&Savepoint> {
        self.savepoint.as_ref()
    }

    /// Why the stop-with-savepoint failed (or the engine stopped before it).
    pub fn savepoint_error(&self) -> Option<&str> {
        self.savepoint_error.as_deref()
    }

    /// Why each deployed engine did not run, in order (the new parallelism, then the rollback).
    pub fn launch_errors(&self) -> &[String] {
        &self.launch_errors
    }

    /// Where the job resumes after its engine stopped without a savepoint.
    pub fn fallback(&self) -> Option<&Savepoint> {
        self.fallback.as_ref()
    }

    /// The newest restore point after the engine deployed last failed: its latest completed
    /// checkpoint, or what it was restored from (`None` before it failed, or without a
    /// [`RestorePointFn`]).
    pub fn newest(&self) -> Option<&Savepoint> {
        self.newest.as_ref()
    }

    /// `find`'s restore point for an engine restored from `from` (see [`RestorePointFn`]);
    /// `from` itself without a `find` or when it fails.
    async fn restore_point(&self, from: Option<Savepoint>) -> Option<Savepoint> {
        let Some(find) = &self.restore_point else {
            return from;
        };
        let (find, asked) = (Arc::clone(find), from.clone());
        match tokio::task::spawn_blocking(move || find(asked.as_ref())).await {
            Ok(Ok(point)) => point,
            Ok(Err(e)) => {
                tracing::warn!(
                    "no checkpoint to restart from ({e}); using the engine's restore point"
                );
                from
            }
            Err(e) => {
                tracing::warn!("{e}");
                from
            }
        }
    }

    fn age_s(&self, since: &str) -> f64 {
        since
            .parse::<f64>()
            .map_or(0.0, |t| (self.elapsed_s() - t).max(0.0))
    }

    /// Records a failed stop-with-savepoint: the old engine keeps running when it reports
    /// `running` within a grace period (or, for a runtime whose engines recover on their own,
    /// while it has not ended); otherwise it is killed and its restore point found.
    async fn savepoint_failed(&mut self, error: String) {
        self.savepoint_error = Some(error);
        let alive = self.runtime.exited(&self.old).await.is_none();
        let recovers = self.runtime.recovers_on_its_own();
        if alive && recovers {
            // Flink restarts it (its restart strategy, from its latest checkpoint): a cancel
            // here would end a job that is recovering.
            self.old_alive = Some(true);
            return;
        }
        if alive
            && let Ok(job) = wait_running(self.runtime, &self.old, SAVEPOINT_FAILED_GRACE).await
            && job.state == "running"
        {
            self.old_alive = Some(true);
            return;
        }
        if alive {
            let _ = self.runtime.kill(&self.old).await;
        }
        self.old_alive = Some(false);
        self.engine = None;
        self.fallback = if recovers {
            None
        } else {
            self.restore_point(self.old.restored_from.clone()).await
        };
    }

    /// Records that the engine deployed last did not run (`error`; it is dead by now) and
    /// finds the newest restore point of its lineage (see [`Self::newest`]).
    async fn deployed_failed(&mut self, error: String) {
        self.failed_counted = true;
        self.launch_errors.push(error);
        if self.restore_point.is_some() {
            let from = self.deployed.restore.clone().map(|path| Savepoint { path });
            self.newest = self.restore_point(from).await;
        }
    }

    /// The deployed engine as the machine sees it while restoring; records why it did not
    /// run (killing it if it is still up) once it failed or ran out of time.
    async fn observe_restoring(&mut self, age_s: f64) -> EngineObs {
        let failed = EngineObs::Up {
            state: "failed".into(),
            parallelism: self.deployed.parallelism.clone(),
            restored_from: self.deployed.restore.clone(),
        };
        let Some(engine) = self.engine.clone() else {
            return failed;
        };
        if self.failed_counted {
            return failed;
        }
        let (seen, exit) = match self.runtime.job_status(&engine).await {
            Ok(job) if job.state == "running" => {
                return EngineObs::Up {
                    state: job.state,
                    parallelism: engine.parallelism.clone(),
                    restored_from: engine.restored_from.as_ref().map(|s| s.path.clone()),
                };
            }
            Ok(job) => (format!("state {}", job.state), None),
            // No answer: an engine that has exited is not waited for.
            Err(e) => (e.to_string(), self.runtime.exited(&engine).await),
        };
        let ended = seen
            .strip_prefix("state ")
            .is_some_and(|s| matches!(s, "failed" | "finished" | "stopped"));
        self.last_seen = seen;
        if exit.is_none() && !ended && age_s < self.running_timeout.as_secs_f64() {
            return EngineObs::Unreachable;
        }
        // As `wait_running` fails: with the engine's exit when it died, else killed.
        let exit = match exit {
            Some(exit) => Some(exit),
            None => self.runtime.exited(&engine).await,
        };
        let error = match exit {
            Some(exit) => exit.to_string(),
            None => {
                let _ = self.runtime.kill(&engine).await;
                RuntimeError::Api(ApiError::NotRunning {
                    url: format!("{}/v1/job", engine.base_url),
                    waited_s: self.deployed_at.elapsed().as_secs_f64(),
                    last: self.last_seen.clone(),
                })
                .to_string()
            }
        };
        self.deployed_failed(error).await;
        failed
    }
}

impl<R: EngineRuntime> RescaleBackend for RuntimeBackend<'_, R> {
    type Error = Infallible;

    fn now(&self) -> String {
        format!("{:.3}", self.elapsed_s())
    }

    async fn observe(&mut self, r: &RescaleState) -> Result<Observation, Infallible> {
        let step_age_s = self.age_s(&r.step_started_at);
        let (engine, savepoint) = match r.step {
            RescaleStep::Savepointing => {
                // The old engine is asked for the savepoint whatever its state: a dead one fails
                // the request, which is then handled as a failed savepoint.
                let up = |state: &str| EngineObs::Up {
                    state: state.into(),
                    parallelism: self.old.parallelism.clone(),
                    restored_from: self.old.restored_from.as_ref().map(|s| s.path.clone()),
                };
                match (&self.savepoint, &self.savepoint_error, self.old_alive) {
                    (Some(sp), _, _) => (up("stopped"), SavepointObs::Completed(sp.path.clone())),
                    (None, Some(e), Some(true)) => (up("running"), SavepointObs::Failed(e.clone())),
                    (None, Some(_), _) => (up("stopped"), SavepointObs::NotFound),
                    (None, None, _) => (up("running"), SavepointObs::NotFound),
                }
            }
            RescaleStep::Redeploying => (EngineObs::Unreachable, SavepointObs::NotAsked),
            RescaleStep::Restoring => (
                self.observe_restoring(step_age_s).await,
                SavepointObs::NotAsked,
            ),
        };
        let timeout_s = self.running_timeout.as_secs_f64();
        Ok(Observation {
            engine,
            savepoint,
            workload: Some(self.deployed.clone()),
            step_age_s,
            previous_restore: self.fallback.as_ref().map(|s| s.path.clone()),
            newest_restore: self.newest.as_ref().map(|s| s.path.clone()),
            savepoint_dir: String::new(),
            savepoint_timeout_s: timeout_s,
            restore_timeout_s: timeout_s,
        })
    }

    async fn persist(
        &mut self,
        _r: &RescaleState,
        _obs: &Observation,
        _t: &Transition,
        _now: &str,
    ) -> Result<(), Infallible> {
        // In memory: the driver carries the state from one turn to the next.
        Ok(())
    }

    async fn request_savepoint(
        &mut self,
        _r: &RescaleState,
        _id: &str,
    ) -> Result<SavepointRequest, Infallible> {
        // The runtime names its savepoints itself and waits for them.
        match self.runtime.stop_with_savepoint(&self.old, false).await {
            Ok(outcome) => self.savepoint = Some(outcome.savepoint),
            Err(e) => self.savepoint_failed(e.to_string()).await,
        }
        Ok(SavepointRequest::Accepted)
    }

    async fn persist_existing_savepoint(
        &mut self,
        _known: &RescaleState,
    ) -> Result<(), Infallible> {
        Ok(())
    }

    async fn deploy(
        &mut self,
        parallelism: &BTreeMap<String, u32>,
        restore: Option<&str>,
        _obs: &Observation,
    ) -> Result<(), Infallible> {
        if let Some(engine) = self.engine.take()
            && engine.id == self.old.id
            && let Err(e) = self.runtime.shutdown(&engine).await
        {
            tracing::debug!("shutdown of the old engine: {e}");
        }
        if let (None, [error]) = (&self.savepoint_error, self.launch_errors.as_slice()) {
            tracing::warn!(
                "restore at the new parallelism failed ({error}); restarting at the old parallelism from {}",
                restore.unwrap_or("scratch")
            );
        }
        let restore = restore.map(|path| Savepoint {
            path: path.to_string(),
        });
        self.deployed = WorkloadObs {
            parallelism: parallelism.clone(),
            restore: restore.as_ref().map(|s| s.path.clone()),
        };
        self.failed_counted = false;
        self.newest = None;
        self.last_seen.clear();
        match self
            .runtime
            .start(self.job, parallelism, restore.as_ref())
            .await
        {
            Ok(engine) => self.engine = Some(engine),
            Err(e) => self.deployed_failed(e.to_string()).await,
        }
        self.deployed_at = Instant::now();
        Ok(())
    }
}
