//! Starting, stopping and rescaling the engine of one job file through a runtime.
//!
//! A rescale (stop-with-savepoint at the old parallelism, restore at the new one) is the
//! rescale machine of [`crate::rescale`] driven with the runtime as its backend, the same
//! machine the Kubernetes operator drives. The savepoint is never lost and never overwritten:
//! if the new engine does not run from it, the job is restarted at the old parallelism from
//! the newest restore point (with [`Executor::with_restore_point`], the failed engine's latest
//! completed checkpoint when it got that far, else the same savepoint); if the savepoint itself
//! fails, the old engine is left running (or, when it died, restarted at the old parallelism
//! from its latest restore point).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::api::JobStatus;
use crate::rescale::drive;
use crate::rescale::machine::Outcome;
pub use crate::rescale::runtime_backend::RestorePointFn;
use crate::rescale::runtime_backend::RuntimeBackend;
use crate::runtime::{
    EngineHandle, EngineRuntime, RuntimeError, Savepoint, StopOutcome, wait_running,
};

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
    /// The savepoint completed but the new engine did not run from it in time; the job was
    /// restarted at the old parallelism from the newest restore point (`engine.restored_from`:
    /// the failed engine's latest completed checkpoint, else the savepoint).
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
    /// `savepoint` is the newest restore point (a savepoint or a completed checkpoint).
    #[error("cannot restart the job{}: {error}", savepoint.as_ref().map(|s| format!(" from savepoint {}", s.path)).unwrap_or_default())]
    Unrecoverable {
        /// The newest completed savepoint or checkpoint, to restore from by hand.
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

    /// Resumes an engine that died during a rescale's savepoint, and rolls back a restore that
    /// failed, from `find`'s restore point (the latest completed checkpoint, when newer) instead
    /// of the savepoint the failed engine was restored from.
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

    /// Polls the job's status every 100 ms until it is `running` (see
    /// [`crate::runtime::wait_running`]).
    ///
    /// # Errors
    /// [`ApiError::NotRunning`](crate::api::ApiError::NotRunning) (as [`RuntimeError::Api`]) after `timeout`, or at once when the
    /// job is `failed`, `finished` or `stopped`.
    pub async fn wait_running(
        &self,
        engine: &EngineHandle,
        timeout: Duration,
    ) -> Result<JobStatus, RuntimeError> {
        wait_running(self.runtime, engine, timeout).await
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

    /// Rescales the job running on `engine` to `target` parallelism: drives the rescale
    /// machine ([`crate::rescale::machine`]) with the runtime as its backend
    /// ([`RuntimeBackend`]).
    ///
    /// # Errors
    /// [`ExecutorError::Unrecoverable`] when no engine could be left running.
    pub async fn rescale(
        &self,
        engine: EngineHandle,
        target: &BTreeMap<String, u32>,
    ) -> Result<RescaleOutcome, ExecutorError> {
        let mut backend = RuntimeBackend::new(
            self.runtime,
            &self.job,
            engine.clone(),
            self.running_timeout,
            self.restore_point.clone(),
        );
        let state = backend.start_state(target);
        let outcome = match drive::run_to_end(&mut backend, state, POLL).await {
            Ok(outcome) => outcome,
            Err(never) => match never {},
        };
        let downtime_s = backend.elapsed_s();
        let running = backend.engine().cloned();
        let lost = |error: String| ExecutorError::Unrecoverable {
            savepoint: backend
                .newest()
                .or(backend.savepoint())
                .or(backend.fallback())
                .cloned(),
            error,
        };
        let first_error = backend.launch_errors().first().cloned().unwrap_or_default();
        match (outcome, running, backend.savepoint_error()) {
            (Outcome::Rescaled { .. }, Some(engine), _) => Ok(RescaleOutcome::Rescaled {
                engine,
                savepoint: backend.savepoint().cloned().unwrap_or(Savepoint {
                    path: String::new(),
                }),
                downtime_s,
            }),
            (Outcome::SavepointFailed { reason }, _, _) => Ok(RescaleOutcome::SavepointFailed {
                engine,
                error: reason,
                downtime_s,
            }),
            (Outcome::RolledBack { .. }, Some(engine), Some(error)) => {
                Ok(RescaleOutcome::SavepointFailed {
                    engine,
                    error: format!(
                        "{error}; the engine stopped, restarted at the old parallelism from {}",
                        backend
                            .fallback()
                            .map_or("scratch".to_string(), |s| s.path.clone())
                    ),
                    downtime_s,
                })
            }
            (Outcome::RolledBack { .. }, Some(engine), None) => Ok(RescaleOutcome::RestoreFailed {
                engine,
                savepoint: backend.savepoint().cloned().unwrap_or(Savepoint {
                    path: String::new(),
                }),
                error: first_error,
                downtime_s,
            }),
            (_, _, Some(error)) => {
                let e = backend.launch_errors().last().cloned().unwrap_or_default();
                Err(lost(format!(
                    "savepoint failed ({error}) and the restart failed ({e})"
                )))
            }
            (_, _, None) => {
                let e = backend.launch_errors().get(1).cloned().unwrap_or_default();
                Err(lost(format!(
                    "restore at the new parallelism failed ({first_error}), and at the old one too ({e})"
                )))
            }
        }
    }
}

/// How often a rescale in progress looks at its engine again, as [`Executor::wait_running`]
/// polls.
const POLL: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::api::ApiError;
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
        /// Starts at these parallelisms (of `enrich`) never answer a status request.
        silent_parallelism: Vec<u32>,
        /// Status requests made.
        status_calls: Mutex<u32>,
        next: Mutex<u64>,
        /// Engines recover on their own ([`EngineRuntime::recovers_on_its_own`], Flink).
        recovers: bool,
        /// Every engine reports `starting` (restarting after a failover) once set.
        restarting: std::sync::atomic::AtomicBool,
        /// Kills made.
        kills: Mutex<u32>,
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
            *self.status_calls.lock().expect("lock") += 1;
            let enrich = handle.parallelism.get("enrich").copied().unwrap_or(0);
            if self.silent_parallelism.contains(&enrich) {
                Err(RuntimeError::Io {
                    path: handle.base_url.clone(),
                    source: std::io::ErrorKind::ConnectionRefused.into(),
                })
            } else if self.broken_parallelism.contains(&enrich) {
                Ok(job("failed"))
            } else if self.restarting.load(std::sync::atomic::Ordering::Relaxed) {
                Ok(job("starting"))
            } else {
                Ok(job("running"))
            }
        }

        async fn shutdown(&self, _handle: &EngineHandle) -> Result<(), RuntimeError> {
            Ok(())
        }

        async fn kill(&self, _handle: &EngineHandle) -> Result<(), RuntimeError> {
            *self.kills.lock().expect("lock") += 1;
            Ok(())
        }

        fn recovers_on_its_own(&self) -> bool {
            self.recovers
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
    async fn an_engine_that_exited_before_running_is_not_waited_for() {
        let mock = Mock {
            silent_parallelism: vec![2],
            engines_die: true,
            ..Mock::default()
        };
        let ex = Executor::new(&mock, Path::new("job.yaml"))
            .with_running_timeout(Duration::from_secs(2));
        let err = ex.launch(&p(2), None).await.expect_err("the engine died");
        assert!(matches!(err, RuntimeError::Exited { .. }), "{err}");
        // One unanswered status request, then the exit: not a poll every 100 ms until the timeout.
        assert_eq!(*mock.status_calls.lock().expect("lock"), 1);
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
    async fn a_failed_savepoint_leaves_a_restarting_job_to_recover_on_its_own() {
        // Flink failed the job over during its stop: it restarts by its restart strategy. Not
        // cancelled (the bundled engine's case below), not started again.
        let mock = Mock {
            savepoint_fails: true,
            recovers: true,
            ..Mock::default()
        };
        let ex = Executor::new(&mock, Path::new("job.yaml"));
        let engine = first_engine(&ex).await;
        mock.restarting
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let out = ex.rescale(engine.clone(), &p(4)).await.expect("recovers");
        let RescaleOutcome::SavepointFailed { engine: kept, .. } = out else {
            panic!("expected SavepointFailed, got {out:?}");
        };
        assert_eq!(kept, engine);
        assert_eq!(*mock.kills.lock().expect("lock"), 0);
        assert_eq!(mock.starts.lock().expect("lock").len(), 1);
    }

    #[tokio::test]
    async fn an_ended_job_that_recovers_on_its_own_is_never_started_from_an_older_restore_point() {
        let mock = Mock {
            savepoint_fails: true,
            recovers: true,
            engines_die: true,
            ..Mock::default()
        };
        let ex = Executor::new(&mock, Path::new("job.yaml"));
        let old = Savepoint {
            path: "/sp/older".into(),
        };
        let engine = ex.launch(&p(2), Some(&old)).await.expect("starts").0;
        let _ = ex.rescale(engine, &p(4)).await;
        let starts = mock.starts.lock().expect("lock").clone();
        assert!(
            starts[1..]
                .iter()
                .all(|(_, from)| from.as_deref() != Some("/sp/older")),
            "{starts:?}"
        );
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
    async fn a_failed_restore_rolls_back_from_the_failed_engines_latest_checkpoint() {
        let mock = Mock {
            broken_parallelism: vec![4],
            ..Mock::default()
        };
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&asked);
        let ex = Executor::new(&mock, Path::new("job.yaml"))
            .with_running_timeout(Duration::from_secs(1))
            .with_restore_point(Arc::new(move |from: Option<&Savepoint>| {
                seen.lock().expect("lock").push(from.cloned());
                Ok(Some(Savepoint {
                    path: "/chk/chk-12".into(),
                }))
            }));
        let engine = first_engine(&ex).await;
        let out = ex.rescale(engine, &p(4)).await.expect("recovers");
        let RescaleOutcome::RestoreFailed {
            engine, savepoint, ..
        } = out
        else {
            panic!("expected RestoreFailed, got {out:?}");
        };
        assert_eq!(engine.parallelism, p(2));
        assert_eq!(
            engine.restored_from.map(|s| s.path).as_deref(),
            Some("/chk/chk-12")
        );
        assert_eq!(savepoint.path, "/sp/1", "the rescale's savepoint is kept");
        // Asked once the engine at the new parallelism (restored from /sp/1) had failed.
        assert_eq!(
            asked.lock().expect("lock").clone(),
            vec![Some(Savepoint {
                path: "/sp/1".into()
            })]
        );
        let starts = mock.starts.lock().expect("lock").clone();
        assert_eq!(
            starts,
            vec![
                (p(2), None),
                (p(4), Some("/sp/1".into())),
                (p(2), Some("/chk/chk-12".into()))
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
}
