//! The coordinator that owns the running job: its savepoints (stop-with-savepoint and
//! savepoints of the running job), its record totals, its in-process restart after a subtask
//! failure, savepoint disposal, and when the process should exit.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::validate_savepoint_id;
use super::{EdgeInfo, JobInfo, JobState, OperatorInfo, RecordBalance, SavepointStatus};
use crate::checkpoint::BarrierKind;
use crate::checkpoint::coordinator::{Outcome, Target};
use crate::checkpoint::storage::{CheckpointStorage, StorageError};
use crate::metrics::EngineMetrics;
use crate::runtime::{Finished, Job, RuntimeOptions, StopKind};
use crate::savepoint::disposal::{self, DisposeError};
use crate::savepoint::{OperatorCounters, Savepoint};
use crate::spec::JobSpec;

/// In-process restart after a subtask failure: from the latest completed checkpoint in
/// `storage` (or from the start when there is none yet), after `delay`, at most `attempts`
/// times per process.
#[derive(Debug, Clone)]
pub struct RestartPolicy {
    /// Where the checkpoints are.
    pub storage: Arc<CheckpointStorage>,
    /// The first checkpoint id of this process ([`CheckpointStorage::next_id`] when it
    /// started): lower ids in the directory are an earlier run's, never restarted from.
    pub first_checkpoint_id: u64,
    /// The savepoint or checkpoint directory this process started from (`--restore`,
    /// `--recover-from`), restarted from while the job has completed no checkpoint of its own.
    pub started_from: Option<PathBuf>,
    /// Restarts allowed.
    pub attempts: u32,
    /// Wait before each restart.
    pub delay: Duration,
    /// Options to start the new job with.
    pub options: RuntimeOptions,
}

/// How long the engine keeps serving after a client read a terminal stop-with-savepoint status.
pub const EXIT_GRACE_AFTER_READ: Duration = Duration::from_millis(300);
/// How long the engine keeps serving after a stop-with-savepoint ended when nobody read it.
pub const EXIT_GRACE_UNREAD: Duration = Duration::from_secs(5);

struct Inner {
    spec: JobSpec,
    state: JobState,
    job: Option<Job>,
    /// The final state of a job that finished by itself, kept for a later savepoint request.
    finished: Option<Finished>,
    counters: BTreeMap<String, OperatorCounters>,
    savepoints: BTreeMap<String, SavepointStatus>,
    terminal_read_at: Option<Instant>,
    /// When a stop-with-savepoint reached a terminal status.
    terminal_at: Option<Instant>,
    errors: Vec<String>,
    restored_from: Option<String>,
    restarts: u32,
}

/// Owns the running job and serves the REST API.
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Mutex<Inner>>,
    pub(super) metrics: EngineMetrics,
    savepoint_dir: PathBuf,
    restart: Option<RestartPolicy>,
    /// Run by a supervisor that reruns it when it exits ([`Coordinator::supervised`]).
    supervised: bool,
}

impl Coordinator {
    /// Wraps a started job. Savepoints go under `savepoint_dir`.
    pub fn new(
        job: Job,
        metrics: EngineMetrics,
        savepoint_dir: PathBuf,
        restored_from: Option<String>,
    ) -> Coordinator {
        let spec = job.spec().clone();
        let counters = job.counters();
        Coordinator {
            inner: Arc::new(Mutex::new(Inner {
                spec,
                state: JobState::Running,
                job: Some(job),
                finished: None,
                counters,
                savepoints: BTreeMap::new(),
                terminal_read_at: None,
                terminal_at: None,
                errors: Vec::new(),
                restored_from,
                restarts: 0,
            })),
            metrics,
            savepoint_dir,
            restart: None,
            supervised: false,
        }
    }

    /// Run by a supervisor that reruns the process when it exits (`--recover`): after a stop
    /// whose terminal status was read, the process waits [`EXIT_GRACE_UNREAD`] rather than
    /// [`EXIT_GRACE_AFTER_READ`] before it exits, so that the deployer that read it replaces it
    /// first; a rerun meanwhile would run the job on from the stop beside its successor.
    pub fn supervised(mut self) -> Coordinator {
        self.supervised = true;
        self
    }

    /// Restarts the job after a subtask failure according to `policy`.
    pub fn with_restart(mut self, policy: RestartPolicy) -> Coordinator {
        self.restart = Some(policy);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Current `GET /v1/job` view.
    pub fn job_info(&self) -> JobInfo {
        let mut inner = self.lock();
        if let Some(job) = &inner.job {
            inner.counters = job.counters();
        }
        let spec = &inner.spec;
        let balance = RecordBalance::of(spec, &inner.counters);
        JobInfo {
            name: spec.name.clone(),
            fingerprint: spec.fingerprint(),
            state: inner.state,
            max_parallelism: spec.max_parallelism,
            operators: spec
                .operators
                .iter()
                .map(|o| {
                    let c = inner.counters.get(&o.name).copied().unwrap_or_default();
                    OperatorInfo {
                        name: o.name.clone(),
                        kind: o.kind.name().into(),
                        parallelism: o.parallelism,
                        records_in: c.records_in,
                        records_out: c.records_out,
                    }
                })
                .collect(),
            edges: spec
                .edges
                .iter()
                .map(|e| EdgeInfo {
                    from: e.from.clone(),
                    to: e.to.clone(),
                })
                .collect(),
            records_emitted: balance.emitted,
            records_accounted: balance.accounted,
            records_filtered: balance.absorbed,
            source_records: balance.source_records,
            restored_from: inner.restored_from.clone(),
            errors: inner.errors.clone(),
        }
    }

    /// Starts a stop-with-savepoint (`stop`), a savepoint of the running job (`!stop`), or,
    /// for a finished job, writes its final state, under `id` or a generated id.
    ///
    /// # Errors
    /// A message when the job is not running, a stop is already in progress, or `id` is
    /// invalid or taken.
    pub fn trigger(&self, stop: bool, drain: bool, id: Option<String>) -> Result<String, String> {
        let mut inner = self.lock();
        let id = match id {
            Some(id) => {
                validate_savepoint_id(&id)?;
                if inner.savepoints.contains_key(&id) || self.savepoint_dir.join(&id).exists() {
                    return Err(format!("id: a savepoint `{id}` already exists"));
                }
                id
            }
            None => {
                let base = format!(
                    "sp-{}-{}",
                    inner.spec.name,
                    std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis())
                );
                let mut id = base.clone();
                let mut n = 1;
                while inner.savepoints.contains_key(&id) || self.savepoint_dir.join(&id).exists() {
                    n += 1;
                    id = format!("{base}-{n}");
                }
                id
            }
        };
        let dir = self.savepoint_dir.join(&id);
        match inner.state {
            JobState::Running => {
                let Some(job) = inner.job.as_ref() else {
                    return Err("job is not running".into());
                };
                let outcome = if stop {
                    job.stop_with_savepoint(
                        if drain {
                            StopKind::Drain
                        } else {
                            StopKind::Stop
                        },
                        dir,
                    )
                } else {
                    job.trigger(BarrierKind::Savepoint, Target::Savepoint(dir))
                };
                if stop {
                    inner.state = JobState::Stopping;
                }
                inner.savepoints.insert(id.clone(), pending(&id));
                let this = self.clone();
                let sp_id = id.clone();
                std::thread::spawn(move || {
                    let outcome = outcome.recv().unwrap_or_else(|_| {
                        Err(crate::checkpoint::coordinator::Failed {
                            id: None,
                            reason: "the job ended before the savepoint completed".into(),
                            snapshot: None,
                        })
                    });
                    if stop {
                        this.complete_stop(&sp_id, outcome);
                    } else {
                        this.record(&sp_id, outcome);
                    }
                });
                Ok(id)
            }
            JobState::Finished => {
                let Some(finished) = inner.finished.take() else {
                    return Err("the finished job's final state was already saved".into());
                };
                inner.savepoints.insert(id.clone(), pending(&id));
                drop(inner);
                self.complete(&id, finished, JobState::Finished);
                Ok(id)
            }
            other => Err(format!(
                "job is {}; a savepoint needs a running job",
                serde_json::to_string(&other).unwrap_or_default()
            )),
        }
    }

    /// Records the outcome of a savepoint of a running job.
    fn record(&self, id: &str, outcome: Outcome) {
        let status = match outcome {
            Ok(c) => SavepointStatus {
                id: id.into(),
                status: "completed".into(),
                path: Some(c.location),
                reason: None,
            },
            Err(f) => failed(id, f.reason),
        };
        tracing::info!(savepoint = id, status = %status.status, reason = ?status.reason, "savepoint finished");
        self.lock().savepoints.insert(id.into(), status);
    }

    /// Ends a stop-with-savepoint: joins the stopped job; if the snapshot was taken but not
    /// written, resumes the job from it.
    fn complete_stop(&self, id: &str, outcome: Outcome) {
        let job = self.lock().job.take();
        let Some(job) = job else { return };
        if outcome.is_err() {
            job.cancel();
        }
        let Finished {
            savepoint: final_state,
            mut errors,
        } = job.join();
        // The savepoint was written from the barrier's snapshot; the final state only holds the
        // disk backend's segment files. Drop it (deleting them) before the status says
        // `completed`: a controller that then closes stdin makes the process exit at once.
        drop(final_state);
        match outcome {
            Ok(c) => {
                tracing::info!(savepoint = id, path = %c.location, "stop-with-savepoint completed");
                let mut inner = self.lock();
                inner.counters = c.metadata.counters.clone();
                inner.state = if errors.is_empty() {
                    JobState::Stopped
                } else {
                    JobState::Failed
                };
                inner.errors.append(&mut errors);
                inner.savepoints.insert(
                    id.into(),
                    SavepointStatus {
                        id: id.into(),
                        status: "completed".into(),
                        path: Some(c.location),
                        reason: None,
                    },
                );
                inner.terminal_at = Some(Instant::now());
            }
            Err(f) => {
                tracing::error!(savepoint = id, reason = %f.reason, "stop-with-savepoint failed");
                // Whether the job restarted from its latest checkpoint rather than resumed from
                // the stop's snapshot.
                let mut restarted = false;
                let resumed = match (&f.snapshot, errors.is_empty()) {
                    (Some(snapshot), true) => match self.durable(snapshot) {
                        Ok(()) => {
                            let spec = self.lock().spec.clone();
                            let options = self
                                .restart
                                .as_ref()
                                .map(|r| r.options.clone())
                                .unwrap_or_default();
                            match Job::start(spec, Some(snapshot), self.metrics.clone(), options) {
                                Ok(job) => Some(job),
                                Err(e) => {
                                    errors.push(format!(
                                        "cannot resume after the failed savepoint: {e}"
                                    ));
                                    None
                                }
                            }
                        }
                        // Resuming from it would commit its sinks' transactions, which a later
                        // restart from the last checkpoint publishes again: restarted from that
                        // checkpoint now instead (the stop's transactions are aborted, their
                        // records come again from the sources).
                        Err(why) => {
                            let restarts = self.lock().restarts;
                            match self
                                .restart
                                .as_ref()
                                .filter(|p| restarts < p.attempts)
                                .map(|p| self.restart_job(p))
                            {
                                Some(Ok((job, from))) => {
                                    tracing::warn!(from = ?from, "{why}; restarted from the latest checkpoint");
                                    self.metrics.restarts.inc();
                                    let mut inner = self.lock();
                                    inner.restarts += 1;
                                    inner.restored_from = from;
                                    restarted = true;
                                    Some(job)
                                }
                                Some(Err(e)) => {
                                    errors.push(format!("{why}; restart failed: {e}"));
                                    None
                                }
                                None => {
                                    errors.push(format!(
                                        "{why}; no restart left to restart from the latest checkpoint"
                                    ));
                                    None
                                }
                            }
                        }
                    },
                    _ => None,
                };
                let mut inner = self.lock();
                inner
                    .savepoints
                    .insert(id.into(), failed(id, f.reason.clone()));
                if let Some(job) = resumed {
                    if !restarted {
                        tracing::warn!(
                            "the job resumes from the snapshot of the failed stop-with-savepoint"
                        );
                    }
                    inner.job = Some(job);
                    inner.state = JobState::Running;
                } else {
                    inner.state = JobState::Failed;
                    errors.push(format!("stop-with-savepoint failed: {}", f.reason));
                    inner.errors.append(&mut errors);
                    inner.terminal_at = Some(Instant::now());
                }
            }
        }
    }

    fn complete(&self, id: &str, finished: Finished, end_state: JobState) {
        let Finished { savepoint, errors } = finished;
        let dir = self.savepoint_dir.join(id);
        let status = if errors.is_empty() {
            match savepoint.write(&dir) {
                Ok(_) => SavepointStatus {
                    id: id.into(),
                    status: "completed".into(),
                    path: Some(dir.display().to_string()),
                    reason: None,
                },
                Err(e) => failed(id, e.to_string()),
            }
        } else {
            failed(
                id,
                format!("job failed while stopping: {}", errors.join("; ")),
            )
        };
        tracing::info!(savepoint = id, status = %status.status, reason = ?status.reason, "savepoint finished");
        // Written: drop the state (deleting the disk backend's segment files) before the status
        // is published, as in `complete_stop`.
        let counters = savepoint.metadata.counters;
        drop(savepoint.state);
        let mut inner = self.lock();
        inner.counters = counters;
        inner.state = if errors.is_empty() {
            end_state
        } else {
            JobState::Failed
        };
        inner.errors.extend(errors);
        inner.savepoints.insert(id.into(), status);
        inner.terminal_at = Some(Instant::now());
    }

    /// Checks whether the job ended by itself (sources finished, or a failure) and records
    /// it; restarts a failed job from its latest completed checkpoint when the restart policy
    /// allows.
    pub fn poll_job(&self) {
        let mut inner = self.lock();
        if inner.state != JobState::Running {
            return;
        }
        let done = inner
            .job
            .as_ref()
            .is_some_and(|j| j.is_finished() || j.has_failed());
        if !done {
            return;
        }
        let Some(job) = inner.job.take() else { return };
        drop(inner);
        job.cancel();
        let finished = job.join();
        if finished.errors.is_empty() {
            let mut inner = self.lock();
            inner.counters = finished.savepoint.metadata.counters.clone();
            inner.state = JobState::Finished;
            inner.finished = Some(finished);
            tracing::info!("job finished: every source reached its record count");
            return;
        }
        tracing::error!(errors = ?finished.errors, "job failed");
        let restarts = self.lock().restarts;
        if let Some(policy) = self.restart.as_ref().filter(|p| restarts < p.attempts) {
            match self.restart_job(policy) {
                Ok((job, from)) => {
                    self.metrics.restarts.inc();
                    let mut inner = self.lock();
                    inner.restarts += 1;
                    inner.errors.extend(finished.errors);
                    inner.restored_from = from;
                    inner.job = Some(job);
                    return;
                }
                Err(e) => {
                    tracing::error!(error = %e, "restart failed");
                    self.lock().errors.push(format!("restart failed: {e}"));
                }
            }
        }
        let mut inner = self.lock();
        inner.counters = finished.savepoint.metadata.counters.clone();
        inner.state = JobState::Failed;
        inner.errors.extend(finished.errors);
    }

    /// Makes the snapshot of a failed stop-with-savepoint durable before the job resumes from
    /// it, when it lists sink transactions (resuming commits them): written as a checkpoint, so
    /// that a later restart from the latest checkpoint starts after them.
    ///
    /// # Errors
    /// Why it could not be written (no checkpoint storage, or the write failed).
    fn durable(&self, snapshot: &Savepoint) -> Result<(), String> {
        if snapshot.metadata.sinks.values().all(Vec::is_empty) {
            return Ok(());
        }
        let storage = self
            .restart
            .as_ref()
            .map(|r| r.storage.clone())
            .ok_or("the snapshot of the failed stop-with-savepoint lists sink transactions and there is no checkpoint storage to write it to")?;
        let id = snapshot
            .metadata
            .checkpoint_id
            .ok_or("the snapshot of the failed stop-with-savepoint has no checkpoint id")?;
        match storage.write_checkpoint(id, snapshot) {
            // The stop wrote it as a checkpoint before its savepoint failed.
            Ok(_) | Err(StorageError::Exists { .. }) => Ok(()),
            Err(e) => Err(e),
        }
        .map_err(|e| {
                format!(
                    "the snapshot of the failed stop-with-savepoint lists sink transactions and cannot be written as checkpoint {id}: {e}"
                )
            })
    }

    /// Starts the job again from the latest usable checkpoint it completed (falling back to
    /// older ones), else from the savepoint or checkpoint the process started from, else from
    /// the start.
    fn restart_job(&self, policy: &RestartPolicy) -> Result<(Job, Option<String>), String> {
        let spec = self.lock().spec.clone();
        std::thread::sleep(policy.delay);
        let mut latest = policy
            .storage
            .latest_since(&spec, policy.first_checkpoint_id)
            .map_err(|e| e.to_string())?;
        if latest.is_none()
            && let Some(dir) = &policy.started_from
        {
            let sp = Savepoint::read(dir, &spec).map_err(|e| e.to_string())?;
            latest = Some((dir.clone(), sp));
        }
        let from = latest.as_ref().map(|(p, _)| p.display().to_string());
        tracing::warn!(from = ?from, "restarting the job from the latest completed checkpoint");
        let job = Job::start(
            spec,
            latest.as_ref().map(|(_, sp)| sp),
            self.metrics.clone(),
            policy.options.clone(),
        )
        .map_err(|e| e.to_string())?;
        Ok((job, from))
    }

    /// True once a stop-with-savepoint is terminal and its status has been read (plus
    /// [`EXIT_GRACE_AFTER_READ`]), or [`EXIT_GRACE_UNREAD`] after it became terminal without
    /// being read (a controller that died mid-request must not keep a stopped engine alive:
    /// a supervisor restarts the process only once it exits).
    pub fn exit_requested(&self) -> bool {
        let after_read = if self.supervised {
            EXIT_GRACE_UNREAD
        } else {
            EXIT_GRACE_AFTER_READ
        };
        let inner = self.lock();
        inner
            .terminal_read_at
            .is_some_and(|t| t.elapsed() > after_read)
            || inner
                .terminal_at
                .is_some_and(|t| t.elapsed() > EXIT_GRACE_UNREAD)
    }

    /// Disposes of the completed savepoint `id` in the savepoint directory (see
    /// [`crate::savepoint::disposal`]) and forgets its status; returns its former path.
    ///
    /// # Errors
    /// [`DisposeError::Pending`] for a savepoint still being taken, and the errors of
    /// [`disposal::detach`] and [`disposal::Detached::remove`].
    pub fn dispose(&self, id: &str) -> Result<PathBuf, DisposeError> {
        let detached = {
            let mut inner = self.lock();
            if inner
                .savepoints
                .get(id)
                .is_some_and(|s| s.status == "pending")
            {
                return Err(DisposeError::Pending { id: id.to_string() });
            }
            let restored_from = inner.restored_from.as_deref().map(std::path::Path::new);
            let detached = disposal::detach(&self.savepoint_dir, id, restored_from)?;
            inner.savepoints.remove(id);
            detached
        };
        let path = detached.remove()?;
        tracing::info!(savepoint = id, path = %path.display(), "savepoint disposed");
        Ok(path)
    }

    /// The status of savepoint `id`; a terminal one read after the job stopped starts the
    /// exit grace ([`Coordinator::exit_requested`]).
    pub(super) fn status(&self, id: &str) -> Option<SavepointStatus> {
        let mut inner = self.lock();
        let st = inner.savepoints.get(id).cloned()?;
        if st.status != "pending"
            && matches!(inner.state, JobState::Stopped | JobState::Finished)
            && inner.terminal_read_at.is_none()
        {
            inner.terminal_read_at = Some(Instant::now());
        }
        Some(st)
    }
}

fn pending(id: &str) -> SavepointStatus {
    SavepointStatus {
        id: id.into(),
        status: "pending".into(),
        path: None,
        reason: None,
    }
}

fn failed(id: &str, reason: String) -> SavepointStatus {
    SavepointStatus {
        id: id.into(),
        status: "failed".into(),
        path: None,
        reason: Some(reason),
    }
}
