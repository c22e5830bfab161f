//! Applying a plan: stop-with-savepoint at the old parallelism, restore at the new one.
//!
//! The savepoint is never lost and never overwritten: if the new engine cannot be started from
//! it, the executor restarts the job at the old parallelism from the same savepoint; if the
//! savepoint itself fails, the old engine is left running (or, when it died, restarted at the
//! old parallelism from its latest restore point).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::api::{ApiError, JobStatus};
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

/// Where a replacement for a dead engine resumes, given the savepoint the dead engine was
/// restored from (`None`: it started fresh): that savepoint, a newer completed checkpoint, or
/// `None` for the beginning. Blocking I/O; an error falls back to that savepoint.
pub type RestorePointFn =
    Arc<dyn Fn(Option<&Savepoint>) -> Result<Option<Savepoint>, String> + Send + Sync>;

/// Starts, stops and rescales the engine of one job file through a runtime.
pub struct Executor<'a, R: EngineRuntime> {
    runtime: &'a R,
    job: PathBuf,
    running_timeout: Duration,
    restore_point: Option<RestorePointFn>,
}

impl<'a, R: EngineRuntime> Executor<'a, R> {
    /// An executor for the job file `job` (passed to every engine) on `runtime`.
    pub fn new(runtime: &'a R, job: &Path) -> Executor<'a, R> {
        Executor {
            runtime,
            job: job.to_path_buf(),
            running_timeout: Duration::from_secs(60),
            restore_point: None,
        }
    }

    /// Resumes an engine that died during a rescale's savepoint from `find`'s restore point
    /// (the latest completed checkpoint) instead of the savepoint it was restored from.
    pub fn with_restore_point(mut self, find: RestorePointFn) -> Self {
        self.restore_point = Some(find);
        self
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

    /// Polls the job's status every 100 ms until it is `running`.
    ///
    /// # Errors
    /// [`ApiError::NotRunning`] (as [`RuntimeError::Api`]) after `timeout`, or at once when the
    /// job is `failed`, `finished` or `stopped`.
    pub async fn wait_running(
        &self,
        engine: &EngineHandle,
        timeout: Duration,
    ) -> Result<JobStatus, RuntimeError> {
        let started = Instant::now();
        let not_running = |last: String| {
            RuntimeError::Api(ApiError::NotRunning {
                url: format!("{}/v1/job", engine.base_url),
                waited_s: started.elapsed().as_secs_f64(),
                last,
            })
        };
        loop {
            let last = match self.runtime.job_status(engine).await {
                Ok(job) if job.state == "running" => return Ok(job),
                Ok(job) if matches!(job.state.as_str(), "failed" | "finished" | "stopped") => {
                    return Err(not_running(format!("state {}", job.state)));
                }
                Ok(job) => format!("state {}", job.state),
                Err(e) => e.to_string(),
            };
            if started.elapsed() >= timeout {
                return Err(not_running(last));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
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
        match self.wait_running(&engine, self.running_timeout).await {
            Ok(job) => Ok((engine, job)),
            Err(e) => {
                let err = match self.runtime.exited(&engine).await {
                    Some(exit) => exit,
                    None => {
                        let _ = self.runtime.kill(&engine).await;
                        e
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
            if let Ok(job) = self.wait_running(&engine, Duration::from_secs(5)).await
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
        // The old engine is gone: restart at the old parallelism from its latest restore point.
        let restore = match &self.restore_point {
            Some(find) => {
                let (find, from) = (Arc::clone(find), engine.restored_from.clone());
                match tokio::task::spawn_blocking(move || find(from.as_ref())).await {
                    Ok(Ok(point)) => point,
                    Ok(Err(e)) => {
                        tracing::warn!(
                            "no checkpoint to restart from ({e}); using the engine's restore point"
                        );
                        engine.restored_from.clone()
                    }
                    Err(e) => {
                        tracing::warn!("{e}");
                        engine.restored_from.clone()
                    }
                }
            }
            None => engine.restored_from.clone(),
        };
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

/// First wait after a failed rescale before the next attempt, seconds (Kubernetes'
/// CrashLoopBackOff starts at 10 s too).
pub const BACKOFF_FIRST_S: f64 = 10.0;
/// Longest wait between rescale attempts while they keep failing, seconds.
pub const BACKOFF_MAX_S: f64 = 300.0;

/// Exponential backoff between rescale attempts while they fail: after the n-th failure in a
/// row no rescale is tried for [`BACKOFF_FIRST_S`]·2ⁿ⁻¹ seconds (at most [`BACKOFF_MAX_S`]),
/// whatever parallelism the planner wants next (an engine that cannot start one new
/// parallelism rarely starts another). The parallelisms that failed are remembered so the
/// hold can name them. A completed rescale clears it all. Pure: time comes in as arguments
/// (seconds on one monotonic clock).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RescaleBackoff {
    /// Failures in a row since the last completed rescale.
    failures: u32,
    /// No attempt before this time, seconds.
    until_s: f64,
    /// The parallelisms that failed, oldest first, each once, with how often it failed.
    failed: Vec<(BTreeMap<String, u32>, u32)>,
}

impl RescaleBackoff {
    /// Records a failed attempt at `parallelism` at `now_s`; returns the wait before the next
    /// attempt, seconds.
    pub fn failed(&mut self, now_s: f64, parallelism: &BTreeMap<String, u32>) -> f64 {
        self.failures = self.failures.saturating_add(1);
        let wait =
            (BACKOFF_FIRST_S * 2f64.powi(self.failures.min(31) as i32 - 1)).min(BACKOFF_MAX_S);
        self.until_s = now_s + wait;
        match self.failed.iter_mut().find(|(p, _)| p == parallelism) {
            Some((_, n)) => *n += 1,
            None => self.failed.push((parallelism.clone(), 1)),
        }
        wait
    }

    /// Records a completed rescale: the next failure waits [`BACKOFF_FIRST_S`] again.
    pub fn succeeded(&mut self) {
        *self = RescaleBackoff::default();
    }

    /// Failures in a row since the last completed rescale.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How many times `parallelism` failed since the last completed rescale.
    pub fn failures_of(&self, parallelism: &BTreeMap<String, u32>) -> u32 {
        self.failed
            .iter()
            .find(|(p, _)| p == parallelism)
            .map_or(0, |(_, n)| *n)
    }

    /// Seconds left before a rescale may be tried at `now_s`; `None` when one may be tried.
    pub fn wait_at(&self, now_s: f64) -> Option<f64> {
        (self.failures > 0 && now_s < self.until_s).then_some(self.until_s - now_s)
    }

    /// When the next attempt may be made, seconds (meaningful while [`Self::failures`] > 0).
    pub fn until_s(&self) -> f64 {
        self.until_s
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::runtime::StopOutcome;

    /// One recorded start: parallelism and the savepoint restored from.
    type Start = (BTreeMap<String, u32>, Option<String>);

    /// A scripted runtime: records every start, fails where told.
    #[derive(Default)]
    struct Mock {
        starts: Mutex<Vec<Start>>,
        /// Starts at these parallelisms (of `enrich`) never reach `running`.
        broken_parallelism: Vec<u32>,
        savepoint_fails: bool,
        /// Every engine has exited (died) by the time it is asked.
        engines_die: bool,
        next: Mutex<u64>,
    }

    fn p(enrich: u32) -> BTreeMap<String, u32> {
        [("enrich".to_string(), enrich), ("source".to_string(), 1)]
            .into_iter()
            .collect()
    }

    fn job(state: &str) -> JobStatus {
        JobStatus {
            name: "t".into(),
            state: state.into(),
            max_parallelism: 128,
            ..JobStatus::default()
        }
    }

    impl EngineRuntime for Mock {
        async fn start(
            &self,
            _job: &Path,
            parallelism: &BTreeMap<String, u32>,
            restore: Option<&Savepoint>,
        ) -> Result<EngineHandle, RuntimeError> {
            self.starts
                .lock()
                .expect("lock")
                .push((parallelism.clone(), restore.map(|s| s.path.clone())));
            let mut next = self.next.lock().expect("lock");
            *next += 1;
            Ok(EngineHandle {
                id: *next,
                base_url: format!("mock://{next}"),
                parallelism: parallelism.clone(),
                restored_from: restore.cloned(),
            })
        }

        async fn stop_with_savepoint(
            &self,
            handle: &EngineHandle,
            _drain: bool,
        ) -> Result<StopOutcome, RuntimeError> {
            if self.savepoint_fails {
                return Err(RuntimeError::Api(ApiError::SavepointFailed {
                    id: "1".into(),
                    reason: "disk full".into(),
                }));
            }
            Ok(StopOutcome {
                savepoint: Savepoint {
                    path: format!("/sp/{}", handle.id),
                },
                final_job: None,
            })
        }

        async fn job_status(&self, handle: &EngineHandle) -> Result<JobStatus, RuntimeError> {
            let enrich = handle.parallelism.get("enrich").copied().unwrap_or(0);
            if self.broken_parallelism.contains(&enrich) {
                Ok(job("failed"))
            } else {
                Ok(job("running"))
            }
        }

        async fn shutdown(&self, _handle: &EngineHandle) -> Result<(), RuntimeError> {
            Ok(())
        }

        async fn kill(&self, _handle: &EngineHandle) -> Result<(), RuntimeError> {
            Ok(())
        }

        async fn exited(&self, _handle: &EngineHandle) -> Option<RuntimeError> {
            self.engines_die.then(|| RuntimeError::Exited {
                status: "signal: 9 (SIGKILL)".into(),
                last_error: "none".into(),
            })
        }
    }

    async fn first_engine(ex: &Executor<'_, Mock>) -> EngineHandle {
        ex.launch(&p(2), None).await.expect("starts").0
    }

    #[tokio::test]
    async fn rescale_restores_the_new_parallelism_from_the_savepoint() {
        let mock = Mock::default();
        let ex = Executor::new(&mock, Path::new("job.yaml"));
        let engine = first_engine(&ex).await;
        let out = ex.rescale(engine, &p(4)).await.expect("rescales");
        let RescaleOutcome::Rescaled {
            engine,
            savepoint,
            downtime_s,
        } = out
        else {
            panic!("expected Rescaled, got {out:?}");
        };
        assert_eq!(engine.parallelism, p(4));
        assert_eq!(savepoint.path, "/sp/1");
        assert!(downtime_s >= 0.0);
        let starts = mock.starts.lock().expect("lock").clone();
        assert_eq!(starts, vec![(p(2), None), (p(4), Some("/sp/1".into()))]);
    }

    #[tokio::test]
    async fn a_failed_savepoint_keeps_the_old_engine() {
        let mock = Mock {
            savepoint_fails: true,
            ..Mock::default()
        };
        let ex = Executor::new(&mock, Path::new("job.yaml"));
        let engine = first_engine(&ex).await;
        let out = ex.rescale(engine.clone(), &p(4)).await.expect("recovers");
        let RescaleOutcome::SavepointFailed {
            engine: kept,
            error,
            ..
        } = out
        else {
            panic!("expected SavepointFailed, got {out:?}");
        };
        assert_eq!(kept, engine);
        assert!(error.contains("disk full"), "{error}");
        assert_eq!(mock.starts.lock().expect("lock").len(), 1);
    }

    #[tokio::test]
    async fn an_engine_that_died_during_the_savepoint_resumes_from_the_latest_checkpoint() {
        let mock = Mock {
            savepoint_fails: true,
            engines_die: true,
            ..Mock::default()
        };
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        let ex = Executor::new(&mock, Path::new("job.yaml")).with_restore_point(Arc::new(
            move |from: Option<&Savepoint>| {
                seen.lock().expect("lock").push(from.cloned());
                Ok(Some(Savepoint {
                    path: "/chk/chk-9".into(),
                }))
            },
        ));
        let engine = first_engine(&ex).await;
        let out = ex.rescale(engine, &p(4)).await.expect("recovers");
        let RescaleOutcome::SavepointFailed { engine, error, .. } = out else {
            panic!("expected SavepointFailed, got {out:?}");
        };
        assert_eq!(engine.parallelism, p(2));
        assert!(error.contains("/chk/chk-9"), "{error}");
        assert_eq!(asked.lock().expect("lock").clone(), vec![None]);
        let starts = mock.starts.lock().expect("lock").clone();
        assert_eq!(
            starts,
            vec![(p(2), None), (p(2), Some("/chk/chk-9".into()))]
        );
    }

    #[tokio::test]
    async fn a_failed_restore_restarts_the_old_parallelism_from_the_same_savepoint() {
        let mock = Mock {
            broken_parallelism: vec![4],
            ..Mock::default()
        };
        let ex = Executor::new(&mock, Path::new("job.yaml"))
            .with_running_timeout(Duration::from_secs(1));
        let engine = first_engine(&ex).await;
        let out = ex.rescale(engine, &p(4)).await.expect("recovers");
        let RescaleOutcome::RestoreFailed {
            engine, savepoint, ..
        } = out
        else {
            panic!("expected RestoreFailed, got {out:?}");
        };
        assert_eq!(engine.parallelism, p(2));
        assert_eq!(savepoint.path, "/sp/1");
        let starts = mock.starts.lock().expect("lock").clone();
        assert_eq!(
            starts,
            vec![
                (p(2), None),
                (p(4), Some("/sp/1".into())),
                (p(2), Some("/sp/1".into()))
            ]
        );
    }

    #[tokio::test]
    async fn when_nothing_restores_the_savepoint_is_reported() {
        let mock = Mock {
            broken_parallelism: vec![4, 2],
            ..Mock::default()
        };
        let ex = Executor::new(&mock, Path::new("job.yaml"))
            .with_running_timeout(Duration::from_secs(1));
        let engine = EngineHandle {
            id: 99,
            base_url: "mock://99".into(),
            parallelism: p(2),
            restored_from: None,
        };
        let err = ex.rescale(engine, &p(4)).await.expect_err("unrecoverable");
        let ExecutorError::Unrecoverable { savepoint, .. } = &err else {
            panic!("expected Unrecoverable, got {err:?}");
        };
        assert_eq!(savepoint.as_ref().map(|s| s.path.as_str()), Some("/sp/99"));
        assert!(err.to_string().contains("/sp/99"), "{err}");
    }

    fn par(work: u32) -> BTreeMap<String, u32> {
        [("work".to_string(), work)].into_iter().collect()
    }

    #[test]
    fn backoff_doubles_per_failure_in_a_row_and_remembers_the_parallelism() {
        let mut b = RescaleBackoff::default();
        assert_eq!(b.wait_at(0.0), None);
        assert_eq!(b.failed(5.0, &par(4)), 10.0);
        assert_eq!(b.wait_at(6.0), Some(9.0));
        assert_eq!(b.wait_at(15.0), None);
        assert_eq!(b.failed(16.0, &par(4)), 20.0);
        assert_eq!(b.failed(40.0, &par(5)), 40.0);
        assert_eq!((b.failures_of(&par(4)), b.failures_of(&par(5))), (2, 1));
        for _ in 0..40 {
            b.failed(100.0, &par(4));
        }
        assert_eq!(b.wait_at(100.0), Some(BACKOFF_MAX_S));
        b.succeeded();
        assert_eq!(
            (b.failures(), b.failures_of(&par(4)), b.wait_at(100.0)),
            (0, 0, None)
        );
        assert_eq!(b.failed(200.0, &par(4)), BACKOFF_FIRST_S);
    }
}
