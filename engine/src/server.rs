//! The engine's HTTP endpoints and the coordinator that owns the running job.
//!
//! - `GET /metrics`: Prometheus text.
//! - `GET /v1/job`: graph, parallelism, state, record totals ([`JobInfo`]).
//! - `POST /v1/savepoints` `{"stop": true, "drain": false}`: stop-with-savepoint (a barrier
//!   with the stop flag); `{"stop": false}`: a savepoint of the running job (a barrier); 202
//!   with `{"id"}`.
//! - `GET /v1/savepoints/{id}`: [`SavepointStatus`].
//! - `DELETE /v1/savepoints/{id}`: disposes of the completed savepoint `DIR/ID` in the
//!   engine's savepoint directory (Flink's savepoint disposal; rules in
//!   [`crate::savepoint::disposal`]): 204 when removed; 404 when there is no such savepoint
//!   (nothing named `ID`, or an entry that is not a completed savepoint: a symlink, which is
//!   never followed, a file, or a directory without `_metadata.json`, all left in place); 409
//!   when it is the savepoint this engine was restored from or one still pending; 400 for an
//!   invalid id. Once removed, `GET /v1/savepoints/{id}` answers 404.
//! - `GET|POST /v1/shed`: load shedding at the sources ([`crate::shed`]).
//!
//! With a bearer token ([`crate::auth`]) every request but `GET`/`HEAD` needs it.
//!
//! After a stop-with-savepoint reaches a terminal status and a client has read it, the engine
//! asks its process to exit ([`Coordinator::exit_requested`]). If a stop-with-savepoint's
//! snapshot was taken but cannot be written, the job resumes from that snapshot in memory
//! (nothing is lost) and the savepoint is reported failed.
//!
//! When a subtask fails and the job has a `checkpoint` section, the job restarts in-process
//! from the latest completed checkpoint after the restart delay, up to the allowed attempts
//! ([`RestartPolicy`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::extract::{Path as AxPath, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use crate::checkpoint::BarrierKind;
use crate::checkpoint::coordinator::{Outcome, Target};
use crate::checkpoint::storage::CheckpointStorage;
use crate::metrics::EngineMetrics;
use crate::runtime::{Finished, Job, RuntimeOptions, StopKind};
use crate::savepoint::disposal::{self, DisposeError};
use crate::savepoint::{OperatorCounters, Savepoint};
use crate::spec::{JobSpec, OperatorKind};

/// The job's record balance, exact for any acyclic job graph: once nothing is in flight
/// (a finished bounded job, or after a draining stop-with-savepoint),
/// `emitted = accounted + absorbed`; a shortfall means records were lost, an excess that
/// they were counted twice.
///
/// Definition. Let `paths(X)` be the number of distinct paths from operator `X` to a sink
/// (`paths(sink) = 1`; with fan-out a record is delivered once per path). Then
/// - `emitted` = Σ over sources of source records × `paths(source)`, plus Σ over aggregating
///   operators (`eventWindow`, `windowTop`, `join`) of the records they derived ×
///   `paths(X)` — their results are new records, not 1:1 images of their inputs;
/// - `accounted` = Σ over sinks of the source records that reached it (a synthetic `window`
///   result carries the count of the records it aggregates, so it stays 1:1 with its input);
/// - `absorbed` = Σ over operators of records they removed on purpose × `paths(X)`: dropped
///   by `filter` or `select`, and every input record of an aggregating operator (including
///   late records it dropped).
///
/// Records are counted per record (watermarks and barriers are not records). The inputs of an
/// aggregating operator are event-time records, which always stand for one record each, so
/// their input count is in the same unit as the sink's `accounted`. A record that a map, a
/// channel or a rescale silently drops is absorbed nowhere and shows as
/// `emitted − accounted − absorbed > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordBalance {
    /// Record deliveries owed to the sinks.
    pub emitted: u64,
    /// Source records that reached a sink, over every sink.
    pub accounted: u64,
    /// Records removed or consumed on purpose, weighted by paths to a sink.
    pub absorbed: u64,
    /// Records the sources emitted, each once.
    pub source_records: u64,
}

impl RecordBalance {
    /// The balance of `spec` from cumulative per-operator `counters` (missing operators count
    /// as zero). The graph must be acyclic (as [`JobSpec::validate`] ensures); operators on a
    /// cycle get no paths.
    pub fn of(spec: &JobSpec, counters: &BTreeMap<String, OperatorCounters>) -> RecordBalance {
        let paths = paths_to_sinks(spec);
        let mut b = RecordBalance::default();
        for op in &spec.operators {
            let c = counters.get(&op.name).copied().unwrap_or_default();
            let w = paths.get(op.name.as_str()).copied().unwrap_or(0);
            // records_out counts each record once, however many output edges it goes on.
            let produced = c.records_out;
            match &op.kind {
                OperatorKind::Source { .. } => {
                    b.source_records = b.source_records.saturating_add(produced);
                    b.emitted = b.emitted.saturating_add(produced.saturating_mul(w));
                }
                OperatorKind::Sink { .. } => b.accounted = b.accounted.saturating_add(c.accounted),
                OperatorKind::EventWindow { .. }
                | OperatorKind::WindowTop { .. }
                | OperatorKind::Join { .. } => {
                    b.emitted = b.emitted.saturating_add(produced.saturating_mul(w));
                    b.absorbed = b.absorbed.saturating_add(c.records_in.saturating_mul(w));
                }
                OperatorKind::Map
                | OperatorKind::Filter { .. }
                | OperatorKind::Select { .. }
                | OperatorKind::Window { .. } => {}
            }
            if !matches!(op.kind, OperatorKind::Sink { .. }) {
                b.absorbed = b.absorbed.saturating_add(c.filtered.saturating_mul(w));
            }
        }
        b
    }

    /// `emitted − accounted − absorbed`: records lost (positive) or counted twice (negative).
    pub fn lost(&self) -> i128 {
        i128::from(self.emitted) - i128::from(self.accounted) - i128::from(self.absorbed)
    }
}

/// Number of distinct paths from each operator to a sink (saturating).
fn paths_to_sinks(spec: &JobSpec) -> BTreeMap<&str, u64> {
    let mut paths = BTreeMap::new();
    let Ok(order) = spec.topological_order() else {
        return paths;
    };
    for name in order.into_iter().rev() {
        let Some(op) = spec.operator(&name) else {
            continue;
        };
        let w = if matches!(op.kind, OperatorKind::Sink { .. }) {
            1
        } else {
            spec.outputs_of(&name)
                .iter()
                .map(|o| paths.get(o).copied().unwrap_or(0))
                .fold(0u64, u64::saturating_add)
        };
        paths.insert(op.name.as_str(), w);
    }
    paths
}

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

/// Lifecycle state of the job, as `GET /v1/job` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    /// Processing records.
    Running,
    /// Stop requested; draining.
    Stopping,
    /// Stopped by a stop-with-savepoint.
    Stopped,
    /// All sources reached their record count and the graph drained.
    Finished,
    /// A subtask failed.
    Failed,
}

/// Status of one savepoint request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavepointStatus {
    /// Savepoint id (also its directory name).
    pub id: String,
    /// `pending`, `completed` or `failed`.
    pub status: String,
    /// Directory of the completed savepoint.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Body of `POST /v1/savepoints`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavepointRequest {
    /// Stop the job after the savepoint (stop-with-savepoint); false takes a savepoint of the
    /// running job.
    pub stop: bool,
    /// Fire all open windows before stopping (Flink's `--drain`).
    #[serde(default)]
    pub drain: bool,
    /// Savepoint id (and directory name) chosen by the caller, so that a controller can
    /// record it before asking and find the savepoint again after a crash. Letters, digits,
    /// `-`, `_` and `.`, at most 128 characters, not starting with `.`. Default: generated.
    #[serde(default)]
    pub id: Option<String>,
}

/// Checks a caller-chosen savepoint id.
///
/// # Errors
/// A message naming the problem.
pub fn validate_savepoint_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "id: `{id}` is not a valid savepoint id (1-128 letters, digits, `-`, `_`, `.`; not starting with `.`)"
        ))
    }
}

/// One operator in `GET /v1/job`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperatorInfo {
    /// Operator name.
    pub name: String,
    /// Kind (`source`, `map`, ...).
    pub kind: String,
    /// Current parallelism.
    pub parallelism: u32,
    /// Records received (cumulative across restores).
    pub records_in: u64,
    /// Records emitted, each once however many downstream operators it goes to (cumulative
    /// across restores).
    pub records_out: u64,
}

/// An edge in `GET /v1/job`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EdgeInfo {
    /// Upstream operator.
    pub from: String,
    /// Downstream operator.
    pub to: String,
}

/// Body of `GET /v1/job`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobInfo {
    /// Job name.
    pub name: String,
    /// Structural fingerprint.
    pub fingerprint: String,
    /// Lifecycle state.
    pub state: JobState,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Operators with parallelism and counters.
    pub operators: Vec<OperatorInfo>,
    /// Edges.
    pub edges: Vec<EdgeInfo>,
    /// Record deliveries owed to the sinks (see [`RecordBalance`]): every record a source
    /// emitted, and every record an aggregating operator (`eventWindow`, `windowTop`, `join`)
    /// derived, times its number of paths to a sink. Equals `recordsAccounted +
    /// recordsFiltered` once nothing is in flight (a finished job or a draining stop).
    pub records_emitted: u64,
    /// Records that reached a sink, in source records (a `window` result counts the source
    /// records it aggregates), summed over every sink.
    pub records_accounted: u64,
    /// Records absorbed on purpose on their way to the sinks, times the absorbing operator's
    /// number of paths to a sink: dropped by `filter` or `select`, or consumed by
    /// `eventWindow`, `windowTop` or `join` (whose results are counted in `recordsEmitted`).
    pub records_filtered: u64,
    /// Records the sources emitted, each once (not multiplied by fan-out).
    #[serde(default)]
    pub source_records: u64,
    /// Savepoint this run was restored from.
    pub restored_from: Option<String>,
    /// Subtask failures, if any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<String>,
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
    metrics: EngineMetrics,
    savepoint_dir: PathBuf,
    restart: Option<RestartPolicy>,
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
        }
    }

    /// Restarts the job after a subtask failure according to `policy`.
    pub fn with_restart(mut self, policy: RestartPolicy) -> Coordinator {
        self.restart = Some(policy);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The axum router with every endpoint, state-changing requests guarded by `token` when
    /// one is given ([`crate::auth`]).
    pub fn router_with_auth(&self, token: Option<crate::auth::TokenSource>) -> Router {
        match token {
            Some(t) => self.router().layer(axum::middleware::from_fn_with_state(
                t,
                crate::auth::require_token,
            )),
            None => self.router(),
        }
    }

    /// The axum router with every endpoint (no authentication).
    pub fn router(&self) -> Router {
        Router::new()
            .route("/metrics", get(metrics_handler))
            .route("/v1/job", get(job_handler))
            .route("/v1/savepoints", post(trigger_handler))
            .route(
                "/v1/savepoints/{id}",
                get(status_handler).delete(dispose_handler),
            )
            .route("/v1/shed", get(shed_get).post(shed_post))
            .with_state(self.clone())
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
                let resumed = match (&f.snapshot, errors.is_empty()) {
                    (Some(snapshot), true) => {
                        let spec = self.lock().spec.clone();
                        let options = self
                            .restart
                            .as_ref()
                            .map(|r| r.options.clone())
                            .unwrap_or_default();
                        match Job::start(spec, Some(snapshot), self.metrics.clone(), options) {
                            Ok(job) => Some(job),
                            Err(e) => {
                                errors
                                    .push(format!("cannot resume after the failed savepoint: {e}"));
                                None
                            }
                        }
                    }
                    _ => None,
                };
                let mut inner = self.lock();
                inner
                    .savepoints
                    .insert(id.into(), failed(id, f.reason.clone()));
                if let Some(job) = resumed {
                    tracing::warn!(
                        "the job resumes from the snapshot of the failed stop-with-savepoint"
                    );
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
        let inner = self.lock();
        inner
            .terminal_read_at
            .is_some_and(|t| t.elapsed() > EXIT_GRACE_AFTER_READ)
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

    fn status(&self, id: &str) -> Option<SavepointStatus> {
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

async fn metrics_handler(State(c): State<Coordinator>) -> Response {
    (
        [("content-type", "text/plain; version=0.0.4")],
        c.metrics.render() + &crate::shed::render(),
    )
        .into_response()
}

/// `GET /v1/shed` (see [`crate::shed`]).
async fn shed_get() -> Json<crate::shed::ShedStatus> {
    Json(crate::shed::status())
}

/// `POST /v1/shed` `{"share": S}` (see [`crate::shed`]).
async fn shed_post(
    body: Result<Json<crate::shed::ShedRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    match body
        .map_err(|e| e.body_text())
        .and_then(|Json(r)| crate::shed::set_share(r.share))
    {
        Ok(()) => Json(crate::shed::status()).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

async fn job_handler(State(c): State<Coordinator>) -> Json<JobInfo> {
    Json(c.job_info())
}

fn error(code: StatusCode, message: String) -> Response {
    (code, Json(serde_json::json!({ "error": message }))).into_response()
}

async fn trigger_handler(
    State(c): State<Coordinator>,
    body: Result<Json<SavepointRequest>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Json(req) = match body {
        Ok(b) => b,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    if let Some(Err(e)) = req.id.as_deref().map(validate_savepoint_id) {
        return error(StatusCode::BAD_REQUEST, e);
    }
    match tokio::task::spawn_blocking(move || c.trigger(req.stop, req.drain, req.id)).await {
        Ok(Ok(id)) => (StatusCode::ACCEPTED, Json(serde_json::json!({ "id": id }))).into_response(),
        Ok(Err(e)) => error(StatusCode::CONFLICT, e),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn status_handler(State(c): State<Coordinator>, AxPath(id): AxPath<String>) -> Response {
    match c.status(&id) {
        Some(st) => Json(st).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!("no savepoint with id `{id}`"),
        ),
    }
}

/// `DELETE /v1/savepoints/{id}` (see the module docs).
async fn dispose_handler(State(c): State<Coordinator>, AxPath(id): AxPath<String>) -> Response {
    match tokio::task::spawn_blocking(move || c.dispose(&id)).await {
        Ok(Ok(_)) => StatusCode::NO_CONTENT.into_response(),
        Ok(Err(e)) => {
            let code = match &e {
                DisposeError::InvalidId(_) => StatusCode::BAD_REQUEST,
                DisposeError::NotFound { .. } | DisposeError::NotASavepoint { .. } => {
                    StatusCode::NOT_FOUND
                }
                DisposeError::RestoredFrom { .. } | DisposeError::Pending { .. } => {
                    StatusCode::CONFLICT
                }
                DisposeError::Io { .. } => StatusCode::INTERNAL_SERVER_ERROR,
            };
            error(code, e.to_string())
        }
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// Reads a savepoint for restore, verifying it against `spec` before anything starts.
///
/// # Errors
/// The savepoint error, naming the file and reason.
pub fn load_for_restore(
    dir: &std::path::Path,
    spec: &JobSpec,
) -> Result<Savepoint, crate::savepoint::SavepointError> {
    Savepoint::read(dir, spec)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn spec(yaml: &str) -> JobSpec {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn counters(items: &[(&str, u64, u64, u64, u64)]) -> BTreeMap<String, OperatorCounters> {
        items
            .iter()
            .map(|&(n, records_in, records_out, accounted, filtered)| {
                (
                    n.to_string(),
                    OperatorCounters {
                        records_in,
                        records_out,
                        accounted,
                        filtered,
                    },
                )
            })
            .collect()
    }

    const SRC: &str = "{ name: src, kind: source, rate: { constant: 1 } }";

    #[test]
    fn select_drops_are_absorbed() {
        let s = spec(&format!(
            "name: j\noperators: [{SRC}, {{ name: q, kind: select, query: q1 }}, {{ name: sink, kind: sink }}]\nedges: [{{ from: src, to: q }}, {{ from: q, to: sink }}]\n"
        ));
        let c = counters(&[
            ("src", 0, 100, 0, 0),
            ("q", 100, 92, 0, 8),
            ("sink", 92, 0, 92, 0),
        ]);
        let b = RecordBalance::of(&s, &c);
        assert_eq!(
            (b.emitted, b.accounted, b.absorbed, b.lost()),
            (100, 92, 8, 0)
        );
    }

    #[test]
    fn fan_out_counts_each_path_once() {
        // source -> a -> {s1, s2}: every record is delivered to two sinks.
        let s = spec(&format!(
            "name: j\noperators: [{SRC}, {{ name: a, kind: map }}, {{ name: s1, kind: sink }}, {{ name: s2, kind: sink }}]\nedges: [{{ from: src, to: a }}, {{ from: a, to: s1 }}, {{ from: a, to: s2 }}]\n"
        ));
        let c = counters(&[
            ("src", 0, 601, 0, 0),
            // records_out counts each record once, not once per output edge.
            ("a", 601, 601, 0, 0),
            ("s1", 601, 0, 601, 0),
            ("s2", 601, 0, 601, 0),
        ]);
        let b = RecordBalance::of(&s, &c);
        assert_eq!((b.source_records, b.emitted, b.lost()), (601, 1202, 0));
        // source -> {a (map), b (filter keep 0.5)} -> sink.
        let s = spec(&format!(
            "name: j\noperators: [{SRC}, {{ name: a, kind: map }}, {{ name: b, kind: filter, keep: 0.5 }}, {{ name: sink, kind: sink }}]\nedges: [{{ from: src, to: a }}, {{ from: src, to: b }}, {{ from: a, to: sink }}, {{ from: b, to: sink }}]\n"
        ));
        let c = counters(&[
            ("src", 0, 100, 0, 0),
            ("a", 100, 100, 0, 0),
            ("b", 100, 48, 0, 52),
            ("sink", 148, 0, 148, 0),
        ]);
        let b = RecordBalance::of(&s, &c);
        assert_eq!(
            (b.source_records, b.emitted, b.absorbed, b.lost()),
            (100, 200, 52, 0)
        );
    }

    #[test]
    fn aggregations_absorb_inputs_and_emit_results() {
        let s = spec(
            "name: j\noperators: [{ name: src, kind: source, rate: { constant: 1 }, nexmark: {} }, { name: bids, kind: select, query: bids }, { name: w, kind: eventWindow, key: auction, window: { tumbling: { sizeMs: 1000 } } }, { name: top, kind: windowTop, key: auction }, { name: sink, kind: sink }]\nedges: [{ from: src, to: bids }, { from: bids, to: w }, { from: w, to: top }, { from: top, to: sink }]\n",
        );
        let c = counters(&[
            ("src", 0, 1000, 0, 0),
            ("bids", 1000, 920, 0, 80),
            ("w", 920, 40, 0, 0),
            ("top", 40, 12, 0, 0),
            ("sink", 12, 0, 12, 0),
        ]);
        let b = RecordBalance::of(&s, &c);
        assert_eq!(b.emitted, 1000 + 40 + 12);
        assert_eq!(b.absorbed, 80 + 920 + 40);
        assert_eq!(b.lost(), 0);
    }

    #[test]
    fn a_record_dropped_by_a_map_is_reported_lost() {
        let s = spec(&format!(
            "name: j\noperators: [{SRC}, {{ name: a, kind: map }}, {{ name: sink, kind: sink }}]\nedges: [{{ from: src, to: a }}, {{ from: a, to: sink }}]\n"
        ));
        // `a` received 100 records but passed on only 99.
        let c = counters(&[
            ("src", 0, 100, 0, 0),
            ("a", 100, 99, 0, 0),
            ("sink", 99, 0, 99, 0),
        ]);
        assert_eq!(RecordBalance::of(&s, &c).lost(), 1);
    }
}
