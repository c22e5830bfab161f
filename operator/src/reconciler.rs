//! The StreamJob reconciler (a kube-runtime `Controller`).
//!
//! Per reconcile of a StreamJob:
//! 0. `spec.job` is checked as the engine checks a job file ([`crate::spec_check`]); a job the
//!    engine would refuse is neither deployed nor planned (phase `Failed`, reason
//!    `InvalidSpec`, see [`refuse_invalid_job`]);
//! 1. a finalizer (`streamscale.dev/final-savepoint`) is ensured; on delete it takes a final
//!    savepoint when `spec.savepointOnDelete` is set (owned objects go by owner references);
//! 2. with a rescale in status, one step of [`crate::rescale::advance`]: the new status is
//!    written first, then the step's action runs;
//! 3. otherwise the owned objects are applied at the current parallelism, the engine's
//!    `/metrics` are scraped into a window and the same guarded planner as `streamscale run`
//!    ([`Autoscaler`]) decides: mode `auto` starts a rescale, `recommend` writes the
//!    recommendation to status, `off` does neither. A job naming a `StreamQuota` plans within
//!    its share of it ([`crate::quota`]), and a limit it runs into (hold or shed) goes to
//!    `status.limit` and Events.
//!
//! A rescale that leaves the job running from its savepoint records it in
//! `status.savepointHistory` ([`crate::savepoint_history`]); while the engine runs, the
//! history's oldest entries beyond `spec.savepointHistoryMaxCount` are disposed of through the
//! engine's `DELETE /v1/savepoints/{id}` ([`dispose_old_savepoints`]).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use streamscale_controller::model::shed::LimitPlan;
use streamscale_controller::model::{
    Autoscaler, GuardSettings, MetricSample, PlannerSettings, Verdict,
};
use streamscale_engine::spec::{JobSpec, LimitsSpec, OnLimit};

use crate::crd::{
    AutoscalerMode, DecisionStatus, FINALIZER, LimitStatus, OperatorDemandStatus, Phase,
    QuotaShareStatus, RescaleStatus, RescaleStep, StreamJob, StreamJobStatus, StreamQuota,
};
use crate::learned_configmap::{self, SavedState};
use crate::metrics::Metrics;
use crate::quota;
use crate::rescale::{self, Action, EngineObs, Observation, Outcome, SavepointObs};
use crate::resources::{self, FIELD_MANAGER};
use crate::runtime::{ApplyError, KubeRuntime};
use crate::savepoint_history;
use crate::spec_check;

/// Errors of one reconcile (retried with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The API server refused or failed.
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// Applying owned objects failed.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// The finalizer failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// The engine refused a request.
    #[error("engine: {0}")]
    Engine(String),
}

/// What the autoscaler remembers about one job between reconciles. The metric window is not
/// persisted (after an operator restart it refills and the guards' stabilization applies);
/// what is learned (rate history, scalability factors, rescale downtime) is, in the job's
/// `NAME-autoscaler` ConfigMap ([`crate::state`]).
struct JobMemory {
    autoscaler: Autoscaler,
    window: VecDeque<MetricSample>,
    settings: GuardSettings,
    /// Unix seconds of the last Prometheus scrape put into `window` (a query that returns the
    /// same scrape again adds nothing).
    last_scrape_unix_s: Option<f64>,
    /// Shed share last applied at the engine's sources (`None`: not since this engine started
    /// or since the operator started).
    shed_applied: Option<f64>,
    /// What the state ConfigMap holds (as last loaded or written).
    saved: Option<StateFingerprint>,
}

/// The parts of the persisted state whose change is worth a write: the history's bins (a new
/// bin every `binSeconds`), the learned factors and flags, the downtime.
#[derive(Debug, Clone, PartialEq)]
struct StateFingerprint {
    bins: usize,
    last_bin: Option<i64>,
    factors: BTreeMap<String, f64>,
    ineffective: Vec<String>,
    downtime: Option<f64>,
}

impl StateFingerprint {
    fn of(s: &SavedState) -> StateFingerprint {
        let bins = s.history.as_ref().map_or(&[][..], |h| &h.bins[..]);
        StateFingerprint {
            bins: bins.len(),
            last_bin: bins.last().map(|b| b.0),
            factors: s.scalability.factors.clone(),
            ineffective: s.scalability.ineffective.keys().cloned().collect(),
            downtime: s.rescale_downtime_seconds,
        }
    }

    fn is_empty(&self) -> bool {
        self.bins == 0
            && self.factors.is_empty()
            && self.ineffective.is_empty()
            && self.downtime.is_none()
    }
}

/// The state to persist from `autoscaler` (history moved to Unix time by `unix0`, the Unix
/// time of the operator's clock zero).
fn snapshot(job: &StreamJob, autoscaler: &Autoscaler, unix0: f64) -> SavedState {
    let h = autoscaler.rate_history();
    SavedState {
        version: learned_configmap::VERSION,
        job: job.name_any(),
        history: (h.bin_seconds > 0.0 && (!h.bins.is_empty() || h.open.is_some()))
            .then(|| h.shifted(unix0)),
        scalability: autoscaler.scalability().clone(),
        rescale_downtime_seconds: autoscaler.settings().planner.rescale_downtime_seconds,
    }
}

/// Puts a persisted state into a fresh `autoscaler`.
fn restore(autoscaler: &mut Autoscaler, s: &SavedState, unix0: f64) {
    if let Some(h) = &s.history {
        autoscaler.set_rate_history(h.shifted(-unix0));
    }
    autoscaler.set_scalability(s.scalability.clone());
    if let Some(d) = s.rescale_downtime_seconds {
        autoscaler.observe_rescale_downtime(d);
    }
}

/// Reads the job's state ConfigMap; `None` when there is none or it cannot be used (a
/// warning Event names the problem; the job starts with nothing learned).
async fn load_state(job: &StreamJob, ctx: &Context) -> Option<SavedState> {
    let ns = job.namespace().unwrap_or_else(|| "default".into());
    let name = learned_configmap::configmap_name(job);
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let cm = match cms.get_opt(&name).await {
        Ok(cm) => cm?,
        Err(e) => {
            tracing::warn!(job = %key(job), "cannot read ConfigMap {name}: {e}");
            return None;
        }
    };
    let text = cm
        .data
        .and_then(|mut d| d.remove(learned_configmap::STATE_KEY))?;
    match learned_configmap::decode(&name, &text, &job.name_any()) {
        Ok(s) => {
            if let Some(s) = &s {
                tracing::info!(
                    job = %key(job),
                    bins = s.history.as_ref().map_or(0, |h| h.bins.len()),
                    factors = s.scalability.factors.len(),
                    "autoscaler state loaded from ConfigMap {name}"
                );
            }
            s
        }
        Err(e) => {
            publish(
                ctx,
                job,
                true,
                "AutoscalerStateIgnored",
                format!("{e}; starting with nothing learned (it is overwritten)"),
            )
            .await;
            None
        }
    }
}

/// Writes the job's state ConfigMap (server-side apply, owned by the StreamJob).
async fn save_state(job: &StreamJob, ctx: &Context, text: String) -> Result<(), String> {
    let ns = job.namespace().unwrap_or_else(|| "default".into());
    let cm = learned_configmap::configmap(job, text).map_err(|e| e.to_string())?;
    Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &learned_configmap::configmap_name(job),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&cm),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Shared state of the reconciler.
pub struct Context {
    /// Kubernetes client.
    pub client: Client,
    /// HTTP client for the engines.
    pub http: reqwest::Client,
    /// The operator's metrics.
    pub metrics: Metrics,
    /// Event recorder.
    pub recorder: Recorder,
    memory: Mutex<HashMap<String, JobMemory>>,
    /// One lock per StreamQuota (`NAMESPACE/NAME`): the reconciles of its members take it from
    /// reading each other's status to writing their own, so that two members never both grow
    /// into the same free subtasks.
    quota_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    clock: tokio::time::Instant,
    /// Unix time (s) of `clock`'s zero: persisted times are Unix times.
    unix0: f64,
}

impl Context {
    /// A context for `client`; events are reported as `reporter`.
    pub fn new(client: Client, metrics: Metrics, reporter: Reporter) -> Context {
        Context {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap_or_default(),
            metrics,
            memory: Mutex::new(HashMap::new()),
            quota_locks: Mutex::new(HashMap::new()),
            clock: tokio::time::Instant::now(),
            unix0: Timestamp::now().as_millisecond() as f64 / 1000.0,
        }
    }

    fn now_s(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    /// The lock of `job`'s StreamQuota, when it names one.
    fn quota_lock(&self, job: &StreamJob) -> Option<Arc<tokio::sync::Mutex<()>>> {
        let name = job.spec.autoscaler.quota.as_ref()?;
        let k = format!("{}/{name}", job.namespace().unwrap_or_default());
        let mut locks = self.quota_locks.lock().unwrap_or_else(|p| p.into_inner());
        Some(Arc::clone(locks.entry(k).or_default()))
    }
}

/// Runs the controller for StreamJobs in `namespace` (all namespaces when `None`) until the
/// stream ends (on shutdown signal).
pub async fn run(ctx: Arc<Context>, namespace: Option<String>) {
    let client = ctx.client.clone();
    let (jobs, deployments) = match &namespace {
        Some(ns) => (
            Api::<StreamJob>::namespaced(client.clone(), ns),
            Api::<Deployment>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::<StreamJob>::all(client.clone()),
            Api::<Deployment>::all(client.clone()),
        ),
    };
    Controller::new(jobs, watcher::Config::default().any_semantic())
        .owns(deployments, watcher::Config::default())
        .shutdown_on_signal()
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(job = %obj.name, "reconciled"),
                Err(e) => tracing::warn!("reconcile failed: {e}"),
            }
        })
        .await;
}

fn error_policy(_job: Arc<StreamJob>, error: &Error, ctx: Arc<Context>) -> Requeue {
    ctx.metrics.errors.inc();
    tracing::warn!("reconcile error: {error}");
    Requeue::requeue(Duration::from_secs(5))
}

/// One reconcile of a StreamJob (see the module docs).
///
/// # Errors
/// API server and engine errors; the controller retries after 5 s.
pub async fn reconcile(job: Arc<StreamJob>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    ctx.metrics.reconciles.inc();
    let _timer = ctx.metrics.reconcile_seconds.start_timer();
    let ns = job.namespace().unwrap_or_else(|| "default".into());
    let api: Api<StreamJob> = Api::namespaced(ctx.client.clone(), &ns);
    let c = ctx.clone();
    finalizer(&api, FINALIZER, job, |event| async move {
        match event {
            Finalizer::Apply(job) => apply(job, c).await,
            Finalizer::Cleanup(job) => cleanup(job, c).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    })
}

fn key(job: &StreamJob) -> String {
    format!("{}/{}", job.namespace().unwrap_or_default(), job.name_any())
}

fn now_rfc3339() -> String {
    Timestamp::now().to_string()
}

fn age_s(since: &str) -> f64 {
    seconds_between(since, &now_rfc3339()).unwrap_or(0.0)
}

/// Seconds from `from` to `to` (both RFC 3339), or `None` when either does not parse or `to`
/// is before `from`.
fn seconds_between(from: &str, to: &str) -> Option<f64> {
    let (from, to) = (
        from.parse::<Timestamp>().ok()?,
        to.parse::<Timestamp>().ok()?,
    );
    let ms = to.as_millisecond() - from.as_millisecond();
    (ms >= 0).then(|| ms as f64 / 1000.0)
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    old: &[Condition],
) -> Condition {
    let status = if ok { "True" } else { "False" }.to_string();
    let last_transition_time = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or(Time(Timestamp::now()));
    Condition {
        type_: type_.to_string(),
        status,
        reason: reason.to_string(),
        message: message.to_string(),
        observed_generation: generation,
        last_transition_time,
    }
}

fn set_condition(status: &mut StreamJobStatus, c: Condition) {
    status.conditions.retain(|o| o.type_ != c.type_);
    status.conditions.push(c);
}

/// Sets the two conditions every end of a rescale sets: `Scaling=False` with
/// `scaling = (reason, message)`, and `Degraded` with `degraded = (status, reason, message)`.
fn set_outcome_conditions(
    status: &mut StreamJobStatus,
    scaling: (&str, &str),
    degraded: (bool, &str, &str),
    generation: Option<i64>,
    old: &[Condition],
) {
    let (reason, message) = scaling;
    set_condition(
        status,
        condition("Scaling", false, reason, message, generation, old),
    );
    let (ok, reason, message) = degraded;
    set_condition(
        status,
        condition("Degraded", ok, reason, message, generation, old),
    );
}

async fn publish(ctx: &Context, job: &StreamJob, warning: bool, reason: &str, note: String) {
    tracing::info!(job = %key(job), reason, "{note}");
    let ev = Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.to_string(),
        note: Some(note.chars().take(1000).collect()),
        action: "Reconcile".to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, &job.object_ref(&())).await {
        tracing::warn!("cannot publish event: {e}");
    }
}

async fn write_status(
    ctx: &Context,
    job: &StreamJob,
    status: &StreamJobStatus,
) -> Result<(), Error> {
    let ns = job.namespace().unwrap_or_else(|| "default".into());
    let api: Api<StreamJob> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = serde_json::json!({ "status": status });
    api.patch_status(
        &job.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

fn guard_settings(job: &StreamJob) -> GuardSettings {
    let a = &job.spec.autoscaler;
    GuardSettings {
        window_seconds: (a.metrics_window_seconds as f64 / 2.0)
            .max(a.metrics_interval_seconds as f64 * 2.0),
        stabilization_seconds: a.stabilization_seconds,
        scale_down_delay_seconds: a.scale_down_delay_seconds,
        planner: PlannerSettings {
            target_utilization: Some(a.target_utilization),
            latency_slo_seconds: Some(a.latency_slo_seconds),
            catch_up_seconds: Some(a.catch_up_seconds),
            ..PlannerSettings::default()
        },
        ..GuardSettings::default()
    }
}

/// The job spec the planner sees: `spec.autoscaler.parallelism` bounds folded into each
/// operator's `scaling`.
pub fn planning_spec(job: &StreamJob, current: &BTreeMap<String, u32>) -> JobSpec {
    let mut spec = job.spec.job.with_parallelism(current);
    for op in &mut spec.operators {
        if let Some(b) = job.spec.autoscaler.parallelism.get(&op.name) {
            op.scaling.min = Some(op.scaling.min.map_or(b.min, |m| m.max(b.min)));
            op.scaling.max = Some(op.scaling.max.map_or(b.max, |m| m.min(b.max)));
        }
    }
    spec
}

fn total(p: &BTreeMap<String, u32>) -> u32 {
    p.values().sum()
}

async fn observe_engine(
    rt: &KubeRuntime,
) -> (EngineObs, Option<streamscale_controller::api::JobStatus>) {
    match rt.api().job().await {
        Ok(job) => (
            EngineObs::Up {
                state: job.state.clone(),
                parallelism: job
                    .operators
                    .iter()
                    .map(|o| (o.name.clone(), o.parallelism))
                    .collect(),
                restored_from: job.restored_from.clone(),
            },
            Some(job),
        ),
        Err(_) => (EngineObs::Unreachable, None),
    }
}

/// How long a StreamJob whose `spec.job` is invalid waits before it is checked again (a new
/// generation is reconciled at once, through the watch).
pub const INVALID_SPEC_RECHECK: Duration = Duration::from_secs(300);

async fn apply(job: Arc<StreamJob>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let mut status = job.status.clone().unwrap_or_default();
    let generation = job.metadata.generation;
    if let Err(invalid) = spec_check::check(&job.spec.job) {
        return refuse_invalid_job(&job, &ctx, status, &invalid).await;
    }
    // Fixed since: what said so goes (the conditions are set again below).
    status.conditions.retain(|c| c.reason != "InvalidSpec");
    if status.current_parallelism.is_empty() {
        status.current_parallelism = job.spec.job.parallelism();
    }
    status.total_parallelism = total(&status.current_parallelism);
    let rt = KubeRuntime::new(ctx.client.clone(), ctx.http.clone(), (*job).clone());

    if let Some(r) = status.rescale.clone() {
        return drive_rescale(&job, &ctx, &rt, status, r).await;
    }

    let (engine, _) = observe_engine(&rt).await;
    // A stopped engine (stop-with-savepoint outside a rescale, or a rescale that ended without
    // replacing it) never runs again by itself: replace its pod (persisted first).
    if matches!(&engine, EngineObs::Up { state, .. } if state == "stopped") {
        // Only on the latest StreamJob: a cached one from before a rescale started would
        // replace the engine under that rescale.
        let ns = job.namespace().unwrap_or_else(|| "default".into());
        let fresh = Api::<StreamJob>::namespaced(ctx.client.clone(), &ns)
            .get_status(&job.name_any())
            .await?;
        if fresh.metadata.resource_version != job.metadata.resource_version {
            return Ok(Requeue::requeue(Duration::from_millis(200)));
        }
        status.restarts += 1;
        write_status(&ctx, &job, &status).await?;
        publish(
            &ctx,
            &job,
            true,
            "EngineRestarted",
            format!(
                "the engine was stopped; replacing its pod at {} from {}",
                rescale::fmt_p(&status.current_parallelism),
                status.restored_from.as_deref().unwrap_or("a fresh start")
            ),
        )
        .await;
    }
    rt.deploy(
        &status.current_parallelism,
        status.restored_from.as_deref(),
        status.restarts,
    )
    .await?;
    let old_conditions = status.conditions.clone();
    // Held until this reconcile's status is written (see `Context::quota_locks`).
    let quota_lock = ctx.quota_lock(&job);
    let _quota_guard = match &quota_lock {
        Some(l) => Some(l.lock().await),
        None => None,
    };
    let interval = Duration::from_secs(job.spec.autoscaler.metrics_interval_seconds.max(1) as u64);
    let mut requeue = Requeue::requeue(interval);
    match &engine {
        EngineObs::Up {
            state,
            restored_from,
            ..
        } if state == "running" => {
            status.phase = Phase::Running;
            set_condition(
                &mut status,
                condition(
                    "Ready",
                    true,
                    "EngineRunning",
                    "the engine runs the job",
                    generation,
                    &old_conditions,
                ),
            );
            dispose_old_savepoints(&job, &ctx, &rt, &mut status, restored_from.as_deref()).await;
            if job.spec.autoscaler.mode != AutoscalerMode::Off {
                autoscale(&job, &ctx, &rt, &mut status).await;
            }
        }
        EngineObs::Up { state, .. } if state == "failed" => {
            status.phase = Phase::Failed;
            set_condition(
                &mut status,
                condition(
                    "Ready",
                    false,
                    "EngineFailed",
                    "the engine reports state failed",
                    generation,
                    &old_conditions,
                ),
            );
            set_condition(
                &mut status,
                condition(
                    "Degraded",
                    true,
                    "EngineFailed",
                    "the engine reports state failed",
                    generation,
                    &old_conditions,
                ),
            );
        }
        other => {
            status.phase = Phase::Deploying;
            let msg = match other {
                EngineObs::Up { state, .. } => format!("engine state {state}"),
                EngineObs::Unreachable => {
                    format!("engine not reachable at {}", resources::engine_url(&job))
                }
            };
            set_condition(
                &mut status,
                condition(
                    "Ready",
                    false,
                    "EngineNotReady",
                    &msg,
                    generation,
                    &old_conditions,
                ),
            );
            requeue = Requeue::requeue(Duration::from_secs(2));
        }
    }
    if !status.conditions.iter().any(|c| c.type_ == "Scaling") {
        set_condition(
            &mut status,
            condition(
                "Scaling",
                false,
                "Idle",
                "no rescale in progress",
                generation,
                &old_conditions,
            ),
        );
    }
    if !status.conditions.iter().any(|c| c.type_ == "Degraded") {
        set_condition(
            &mut status,
            condition(
                "Degraded",
                false,
                "AsExpected",
                "",
                generation,
                &old_conditions,
            ),
        );
    }
    if status.rescale.is_some() {
        requeue = Requeue::requeue(Duration::from_millis(200));
    }
    status.observed_generation = generation;
    if job.status.as_ref() != Some(&status) {
        write_status(&ctx, &job, &status).await?;
    }
    Ok(requeue)
}

/// The outcome of a StreamJob whose `spec.job` the engine would refuse: nothing is deployed
/// or planned (an engine already running keeps its previous job, a rescale in progress waits),
/// the status says phase `Failed` with `Ready=False` and `Degraded=True`, both with reason
/// `InvalidSpec` and the problem as message, and a Warning Event `InvalidSpec` names it (once
/// per generation and problem). It is checked again after [`INVALID_SPEC_RECHECK`]; a fixed
/// StreamJob (a new generation) deploys at its next reconcile.
async fn refuse_invalid_job(
    job: &StreamJob,
    ctx: &Context,
    mut status: StreamJobStatus,
    invalid: &spec_check::InvalidJob,
) -> Result<Requeue, Error> {
    let generation = job.metadata.generation;
    let old = status.conditions.clone();
    let message = format!("{invalid}; the job is not deployed until spec.job is fixed");
    status.phase = Phase::Failed;
    set_condition(
        &mut status,
        condition("Ready", false, "InvalidSpec", &message, generation, &old),
    );
    set_condition(
        &mut status,
        condition("Degraded", true, "InvalidSpec", &message, generation, &old),
    );
    status.observed_generation = generation;
    if job.status.as_ref() != Some(&status) {
        write_status(ctx, job, &status).await?;
        publish(ctx, job, true, "InvalidSpec", message).await;
    }
    Ok(Requeue::requeue(INVALID_SPEC_RECHECK))
}

/// Disposes of the oldest savepoints of `status.savepointHistory` beyond
/// `spec.savepointHistoryMaxCount` through the running engine (never the one the job or the
/// engine runs from, `engine_restored_from`): an entry is dropped from the history when the
/// engine answers 204 (removed, Event `SavepointDisposed`) or 404 (already gone), and kept for
/// the next reconcile on any other answer (Warning Event `SavepointDisposalFailed`). An
/// invalid maximum disposes of nothing (Warning Event `InvalidSpec`).
async fn dispose_old_savepoints(
    job: &StreamJob,
    ctx: &Context,
    rt: &KubeRuntime,
    status: &mut StreamJobStatus,
    engine_restored_from: Option<&str>,
) {
    let max = match savepoint_history::max_count(job.spec.savepoint_history_max_count) {
        Ok(max) => max,
        Err(e) => {
            publish(ctx, job, true, "InvalidSpec", e.to_string()).await;
            return;
        }
    };
    let protected: Vec<&str> = status
        .restored_from
        .as_deref()
        .into_iter()
        .chain(engine_restored_from)
        .collect();
    let chosen: Vec<_> = savepoint_history::to_dispose(&status.savepoint_history, max, &protected)
        .into_iter()
        .cloned()
        .collect();
    if chosen.is_empty() {
        return;
    }
    let api = rt.api();
    for entry in chosen {
        match api.dispose_savepoint(&entry.id).await {
            Ok(()) => {
                status.savepoint_history.retain(|e| e.id != entry.id);
                publish(
                    ctx,
                    job,
                    false,
                    "SavepointDisposed",
                    format!(
                        "savepoint {} disposed of (history kept to the newest {max})",
                        entry.path
                    ),
                )
                .await;
            }
            Err(streamscale_controller::api::ApiError::Status { status: 404, .. }) => {
                tracing::info!(job = %key(job), savepoint = %entry.path, "savepoint already gone; dropped from the history");
                status.savepoint_history.retain(|e| e.id != entry.id);
            }
            Err(why) => {
                publish(
                    ctx,
                    job,
                    true,
                    "SavepointDisposalFailed",
                    format!(
                        "cannot dispose of savepoint {} ({why}); kept in the history and tried again",
                        entry.path
                    ),
                )
                .await;
            }
        }
    }
}

/// Scrapes, decides, and records the decision (starting a rescale in mode `auto`).
async fn autoscale(job: &StreamJob, ctx: &Context, rt: &KubeRuntime, status: &mut StreamJobStatus) {
    let now_s = ctx.now_s();
    let (sample, scraped_at) = match &job.spec.autoscaler.prometheus {
        Some(p) => {
            let selector = p
                .selector
                .clone()
                .unwrap_or_else(|| default_prometheus_selector(job));
            let now_unix_s = Timestamp::now().as_millisecond() as f64 / 1000.0;
            match crate::prometheus::fetch(&ctx.http, &p.url, &selector, now_s, now_unix_s).await {
                Ok(m) => {
                    ctx.metrics
                        .metric_reads
                        .with_label_values(&["prometheus"])
                        .inc();
                    (m.metrics.sample, Some(m.scraped_at_unix_s))
                }
                Err(e) => {
                    tracing::warn!(job = %key(job), "metrics from Prometheus: {e}");
                    return;
                }
            }
        }
        None => {
            match streamscale_controller::scrape::scrape(&ctx.http, &rt.api().metrics_url(), now_s)
                .await
            {
                Ok(m) => {
                    ctx.metrics
                        .metric_reads
                        .with_label_values(&["engine"])
                        .inc();
                    (m.sample, None)
                }
                Err(e) => {
                    tracing::debug!(job = %key(job), "scrape failed: {e}");
                    return;
                }
            }
        }
    };
    let mut spec = planning_spec(job, &status.current_parallelism);
    // A shared StreamQuota: this job plans within its share (its planning quota).
    let quota = match &job.spec.autoscaler.quota {
        Some(name) => Some(quota_share(job, ctx, name, &spec, status).await),
        None => None,
    };
    if let Some(q) = &quota {
        let running = quota::non_source_total(&spec, &status.current_parallelism);
        let cap = q.share.as_ref().map_or(running, |s| s.cap).max(1);
        let limits = spec
            .autoscaler
            .limits
            .get_or_insert_with(LimitsSpec::default);
        limits.quota_subtasks = Some(limits.quota_subtasks.map_or(cap, |own| own.min(cap)));
    }
    // The first time this operator process sees the job: what was learned before it started.
    let known = ctx
        .memory
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(&key(job));
    let loaded = if known {
        None
    } else {
        load_state(job, ctx).await
    };
    let (verdict, limit, shed_applied, to_save) = {
        let mut memory = ctx.memory.lock().unwrap_or_else(|p| p.into_inner());
        let settings = guard_settings(job);
        let m = memory.entry(key(job)).or_insert_with(|| {
            let mut autoscaler = Autoscaler::new(settings.clone());
            autoscaler.restarted(now_s);
            if let Some(s) = &loaded {
                restore(&mut autoscaler, s, ctx.unix0);
            }
            JobMemory {
                autoscaler,
                window: VecDeque::new(),
                settings: settings.clone(),
                last_scrape_unix_s: None,
                shed_applied: None,
                saved: loaded.as_ref().map(StateFingerprint::of),
            }
        });
        if m.settings != settings {
            // New settings, same job: what was learned carries over.
            let mut fresh = Autoscaler::new(settings.clone());
            fresh.restarted(now_s);
            restore(&mut fresh, &snapshot(job, &m.autoscaler, 0.0), 0.0);
            m.autoscaler = fresh;
            m.settings = settings;
        }
        // A window from another parallelism is not about this deployment.
        if m.window
            .back()
            .is_some_and(|last| last_parallelism(last) != status.current_parallelism)
        {
            m.window.clear();
        }
        if scraped_at.is_none() || scraped_at != m.last_scrape_unix_s {
            m.window.push_back(sample);
            m.last_scrape_unix_s = scraped_at;
        }
        let horizon = job.spec.autoscaler.metrics_window_seconds as f64;
        while m
            .window
            .front()
            .is_some_and(|s| now_s - s.at_seconds > horizon)
        {
            m.window.pop_front();
        }
        let window: Vec<MetricSample> = m.window.iter().cloned().collect();
        let verdict = m.autoscaler.decide(now_s, &window, &spec);
        let snap = snapshot(job, &m.autoscaler, ctx.unix0);
        let fp = StateFingerprint::of(&snap);
        let to_save = (m.saved.as_ref() != Some(&fp) && !fp.is_empty())
            .then(|| (fp, learned_configmap::encode(&snap)));
        (
            verdict,
            m.autoscaler.limit_plan().cloned(),
            m.shed_applied,
            to_save,
        )
    };
    if let Some((fp, text)) = to_save {
        match save_state(job, ctx, text).await {
            Ok(()) => {
                let mut memory = ctx.memory.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(m) = memory.get_mut(&key(job)) {
                    m.saved = Some(fp);
                }
            }
            Err(e) => tracing::warn!(job = %key(job), "cannot save the autoscaler state: {e}"),
        }
    }
    let planned = match &verdict {
        Verdict::Rescale(d) => Some(d),
        Verdict::Hold { recommendation, .. } => recommendation.as_ref(),
    };
    if let Some(mut q) = quota {
        if let Some(d) = planned {
            q.demand = quota::demand_from_decision(d, &spec);
        }
        report_quota(job, ctx, status, q).await;
    }
    if planned.is_some() {
        report_limit(job, ctx, rt, status, limit.as_ref(), shed_applied).await;
    }
    let (mut decision, mut rescale) = match verdict {
        Verdict::Rescale(d) => (d, true),
        Verdict::Hold {
            recommendation: Some(d),
            ..
        } => (d, false),
        Verdict::Hold { reason, .. } => {
            ctx.metrics.decisions.with_label_values(&["hold"]).inc();
            tracing::debug!(job = %key(job), "hold: {reason}");
            return;
        }
    };
    // A job holding more than its quota share is rescaled down to it, whatever the
    // scale-down guards say (the other members wait for those subtasks).
    if let Some(q) = &status.quota
        && let Some(target) = quota::forced_scale_down(
            &spec,
            q,
            &status.current_parallelism,
            &decision.parallelism,
            rescale,
            limit.as_ref().map(|lp| &lp.parallelism),
        )
    {
        decision.parallelism = target;
        decision.reasons.insert(
            0,
            format!(
                "quota {}: {} subtasks held, the share is {}; rescaling down to it",
                q.name, q.running_subtasks, q.allocated_subtasks
            ),
        );
        rescale = true;
    }
    let auto = job.spec.autoscaler.mode == AutoscalerMode::Auto;
    let reason = std::iter::once(decision.bottleneck.clone().unwrap_or_default())
        .chain(decision.reasons.iter().cloned())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    let predicted_utilization = decision
        .operators
        .values()
        .filter_map(|o| o.predicted_utilization)
        .fold(None, |acc: Option<f64>, u| {
            Some(acc.map_or(u, |a| a.max(u)))
        });
    let changed = status.recommended_parallelism != decision.parallelism;
    status.recommended_parallelism = decision.parallelism.clone();
    if !rescale {
        ctx.metrics.decisions.with_label_values(&["hold"]).inc();
        return;
    }
    let bottleneck = decision
        .bottleneck
        .as_ref()
        .map(|b| b.split(':').next().unwrap_or(b).to_string());
    status.last_decision = Some(DecisionStatus {
        time: now_rfc3339(),
        from: status.current_parallelism.clone(),
        to: decision.parallelism.clone(),
        reason: reason.clone(),
        predicted_utilization,
        predicted_latency_seconds: decision
            .predicted_latency_seconds
            .is_finite()
            .then_some(decision.predicted_latency_seconds),
        bottleneck,
        applied: auto,
    });
    if auto {
        ctx.metrics.decisions.with_label_values(&["rescale"]).inc();
        let now = now_rfc3339();
        // The savepoint id is chosen here and persisted with the step, before it is requested.
        status.rescale = Some(RescaleStatus {
            step: RescaleStep::Savepointing,
            from: status.current_parallelism.clone(),
            to: decision.parallelism.clone(),
            reason: reason.clone(),
            savepoint_id: Some(rescale::savepoint_id(&now)),
            savepoint_path: None,
            rolling_back: false,
            started_at: now.clone(),
            step_started_at: now,
        });
        status.phase = Phase::Rescaling;
        let old = status.conditions.clone();
        set_condition(
            status,
            condition(
                "Scaling",
                true,
                "Savepointing",
                "rescale started",
                job.metadata.generation,
                &old,
            ),
        );
        publish(
            ctx,
            job,
            false,
            "RescaleStarted",
            format!(
                "{} -> {}: {reason}",
                rescale::fmt_p(&status.current_parallelism),
                rescale::fmt_p(&decision.parallelism)
            ),
        )
        .await;
    } else {
        ctx.metrics
            .decisions
            .with_label_values(&["recommend"])
            .inc();
        if changed {
            publish(
                ctx,
                job,
                false,
                "Recommendation",
                format!(
                    "recommended {}: {reason}",
                    rescale::fmt_p(&decision.parallelism)
                ),
            )
            .await;
        }
    }
}

/// The quota part of one reconcile: the StreamQuota's size, this job's share, and the demand
/// this job reports (its previous one until a new plan replaces it).
struct QuotaOutcome {
    name: String,
    subtasks: u32,
    share: Result<quota::Share, String>,
    held: u32,
    demand: Vec<OperatorDemandStatus>,
}

/// Reads the StreamQuota `name` and its member StreamJobs (of this namespace) and computes
/// this job's share (see [`crate::quota`]). `spec` is this job's planning spec, `status` its
/// status as this reconcile has it.
async fn quota_share(
    job: &StreamJob,
    ctx: &Context,
    name: &str,
    spec: &JobSpec,
    status: &StreamJobStatus,
) -> QuotaOutcome {
    let ns = job.namespace().unwrap_or_else(|| "default".into());
    let own = job.name_any();
    let held = quota::non_source_total(spec, &status.current_parallelism);
    let demand = status
        .quota
        .as_ref()
        .filter(|q| q.name == name && !q.demand.is_empty())
        .map_or_else(
            || quota::demand_from_parallelism(spec, &status.current_parallelism),
            |q| q.demand.clone(),
        );
    let mut out = QuotaOutcome {
        name: name.to_string(),
        subtasks: 0,
        share: Err(String::new()),
        held,
        demand: demand.clone(),
    };
    let quotas: Api<StreamQuota> = Api::namespaced(ctx.client.clone(), &ns);
    let q = match quotas.get_opt(name).await {
        Ok(Some(q)) => q,
        Ok(None) => {
            out.share = Err(format!(
                "StreamQuota {name} not found in namespace {ns}: the job does not grow"
            ));
            return out;
        }
        Err(e) => {
            out.share = Err(format!("cannot read StreamQuota {name}: {e}"));
            return out;
        }
    };
    out.subtasks = q.spec.subtasks;
    let jobs: Api<StreamJob> = Api::namespaced(ctx.client.clone(), &ns);
    let list = match jobs.list(&kube::api::ListParams::default()).await {
        Ok(l) => l,
        Err(e) => {
            out.share = Err(format!("cannot list the StreamJobs of quota {name}: {e}"));
            return out;
        }
    };
    let mut members = vec![quota::Member {
        name: own.clone(),
        demand,
        held,
    }];
    for other in list.items {
        if other.name_any() == own || other.spec.autoscaler.quota.as_deref() != Some(name) {
            continue;
        }
        let p = quota::held(&other);
        let other_spec = planning_spec(&other, &p);
        let demand = other
            .status
            .as_ref()
            .and_then(|s| s.quota.as_ref())
            .filter(|q| q.name == name && !q.demand.is_empty())
            .map_or_else(
                || quota::demand_from_parallelism(&other_spec, &p),
                |q| q.demand.clone(),
            );
        members.push(quota::Member {
            name: other.name_any(),
            demand,
            held: quota::non_source_total(&other_spec, &p),
        });
    }
    out.share = quota::share(&own, &members, q.spec.subtasks).map_err(|e| e.to_string());
    out
}

/// Writes this job's quota share to `status.quota`, with an Event when the share changes.
async fn report_quota(
    job: &StreamJob,
    ctx: &Context,
    status: &mut StreamJobStatus,
    q: QuotaOutcome,
) {
    let old = status.quota.clone();
    let new = match &q.share {
        Ok(s) => QuotaShareStatus {
            name: q.name.clone(),
            quota_subtasks: q.subtasks,
            allocated_subtasks: s.allocated,
            running_subtasks: q.held,
            admitted_share: s.allocation.admitted_share,
            demand: q.demand,
            message: s.message.clone(),
        },
        Err(e) => QuotaShareStatus {
            name: q.name.clone(),
            quota_subtasks: q.subtasks,
            allocated_subtasks: q.held,
            running_subtasks: q.held,
            admitted_share: old.as_ref().map_or(1.0, |o| o.admitted_share),
            demand: q.demand,
            message: e.clone(),
        },
    };
    let changed = old.as_ref().is_none_or(|o| {
        o.name != new.name
            || o.quota_subtasks != new.quota_subtasks
            || o.allocated_subtasks != new.allocated_subtasks
            || (q.share.is_err() && o.message != new.message)
    });
    if changed {
        match &q.share {
            Ok(s) => {
                publish(
                    ctx,
                    job,
                    false,
                    "QuotaShare",
                    format!(
                        "share of StreamQuota {}: {} of {} subtasks, admitting {:.0}% of the load ({})",
                        q.name,
                        s.allocated,
                        q.subtasks,
                        100.0 * s.allocation.admitted_share,
                        s.message
                    ),
                )
                .await;
            }
            Err(e) => publish(ctx, job, true, "QuotaUnavailable", e.clone()).await,
        }
    }
    status.quota = Some(new);
}

/// Writes the limit the last plan ran into to `status.limit` (with an Event when it starts,
/// changes or ends) and, under `onLimit: shed`, applies the plan's shed share at the engine's
/// sources (`POST /v1/shed`; a restarted engine starts at 0, so it is applied again after a
/// rescale).
async fn report_limit(
    job: &StreamJob,
    ctx: &Context,
    rt: &KubeRuntime,
    status: &mut StreamJobStatus,
    limit: Option<&LimitPlan>,
    shed_applied: Option<f64>,
) {
    let new = limit
        .filter(|lp| lp.capacity < lp.load * (1.0 - 1e-9))
        .map(|lp| LimitStatus {
            action: format!("{:?}", lp.action),
            shed_share: lp.shed_share,
            load_records_per_second: lp.load,
            capacity_records_per_second: lp.capacity,
            limited_by: lp.limited_by.clone(),
            reason: lp.reason.clone(),
        });
    let old = status.limit.take();
    let same = |a: &LimitStatus, b: &LimitStatus| {
        a.action == b.action
            && a.limited_by == b.limited_by
            && (a.shed_share - b.shed_share).abs() < 1e-3
    };
    match (&old, &new) {
        (Some(o), Some(n)) if same(o, n) => {}
        (_, Some(n)) => {
            let reason = if n.action == "Shed" {
                "LoadShed"
            } else {
                "LimitHold"
            };
            publish(ctx, job, true, reason, n.reason.clone()).await;
        }
        (Some(_), None) => {
            publish(
                ctx,
                job,
                false,
                "WithinLimits",
                "the plan fits the limits again".to_string(),
            )
            .await;
        }
        (None, None) => {}
    }
    status.limit = new;
    let shedding = job
        .spec
        .job
        .autoscaler
        .limits
        .as_ref()
        .is_some_and(|l| l.on_limit == OnLimit::Shed);
    if !shedding || job.spec.autoscaler.mode != AutoscalerMode::Auto {
        return;
    }
    let wanted = limit.map_or(0.0, |lp| lp.shed_share);
    if shed_applied.is_some_and(|a| (a - wanted).abs() < 1e-3) {
        return;
    }
    let url = format!("{}/v1/shed", rt.api().base_url());
    let sent = ctx
        .http
        .post(&url)
        .json(&serde_json::json!({ "share": wanted }))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status);
    match sent {
        Ok(_) => {
            tracing::info!(job = %key(job), share = wanted, "shed share applied");
            let mut memory = ctx.memory.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(m) = memory.get_mut(&key(job)) {
                m.shed_applied = Some(wanted);
            }
        }
        Err(e) => tracing::warn!(job = %key(job), "{url}: {e}"),
    }
}

/// `namespace="NS",job="NAME-engine"`: the labels a ServiceMonitor on the engine Service gives.
pub fn default_prometheus_selector(job: &StreamJob) -> String {
    format!(
        "namespace=\"{}\",job=\"{}\"",
        job.namespace().unwrap_or_else(|| "default".into()),
        resources::engine_name(job)
    )
}

fn last_parallelism(sample: &MetricSample) -> BTreeMap<String, u32> {
    sample
        .operators
        .iter()
        .map(|(op, subtasks)| (op.clone(), subtasks.len() as u32))
        .collect()
}

async fn drive_rescale(
    job: &StreamJob,
    ctx: &Context,
    rt: &KubeRuntime,
    mut status: StreamJobStatus,
    r: RescaleStatus,
) -> Result<Requeue, Error> {
    let (engine, _) = observe_engine(rt).await;
    let savepoint = match (&r.step, &r.savepoint_id) {
        (RescaleStep::Savepointing, Some(id)) => match rt.api().savepoint(id).await {
            Ok(sp) => match sp.status.as_str() {
                "completed" => SavepointObs::Completed(sp.path.unwrap_or_default()),
                "failed" => {
                    SavepointObs::Failed(sp.reason.unwrap_or_else(|| "no reason given".into()))
                }
                _ => SavepointObs::Pending,
            },
            Err(streamscale_controller::api::ApiError::Status { status: 404, .. }) => {
                SavepointObs::NotFound
            }
            Err(_) => SavepointObs::Unknown,
        },
        _ => SavepointObs::NotAsked,
    };
    let a = &job.spec.autoscaler;
    let obs = Observation {
        engine,
        savepoint,
        workload: rt.workload().await?,
        step_age_s: age_s(&r.step_started_at),
        previous_restore: status.restored_from.clone(),
        savepoint_dir: resources::savepoint_dir(job),
        savepoint_timeout_s: f64::from(a.savepoint_timeout_seconds),
        restore_timeout_s: f64::from(a.restore_timeout_seconds),
    };
    let now = now_rfc3339();
    let t = rescale::advance(&r, &obs, &now);
    let generation = job.metadata.generation;
    let old = status.conditions.clone();
    if t.rescale.as_ref().map(|n| n.step) != Some(r.step) {
        ctx.metrics
            .rescale_step_seconds
            .with_label_values(&[&format!("{:?}", r.step)])
            .observe(obs.step_age_s);
    }
    status.rescale = t.rescale.clone();
    if let Some(next) = &t.rescale {
        status.phase = Phase::Rescaling;
        set_condition(
            &mut status,
            condition(
                "Scaling",
                true,
                &format!("{:?}", next.step),
                t.event.as_deref().unwrap_or("rescaling"),
                generation,
                &old,
            ),
        );
    }
    let mut warning = false;
    let reason = match &t.outcome {
        // Events with one reason are aggregated into one (its first note kept): a roll back
        // gets its own reason.
        None => t
            .rescale
            .as_ref()
            .map(|n| {
                if n.rolling_back && !r.rolling_back {
                    "RollingBack".to_string()
                } else {
                    format!("{:?}", n.step)
                }
            })
            .unwrap_or_default(),
        Some(Outcome::Rescaled {
            parallelism,
            savepoint,
        }) => {
            status.current_parallelism = parallelism.clone();
            status.restored_from = Some(savepoint.clone());
            status.rescales += 1;
            status.phase = Phase::Running;
            let note = t.event.as_deref().unwrap_or("");
            let scaling = ("Rescaled", note);
            set_outcome_conditions(
                &mut status,
                scaling,
                (false, "AsExpected", ""),
                generation,
                &old,
            );
            "Rescaled".into()
        }
        Some(Outcome::SavepointFailed { reason }) => {
            warning = true;
            status.phase = Phase::Running;
            let scaling = ("SavepointFailed", reason.as_str());
            let degraded = (true, "SavepointFailed", reason.as_str());
            set_outcome_conditions(&mut status, scaling, degraded, generation, &old);
            "SavepointFailed".into()
        }
        Some(Outcome::RolledBack {
            parallelism,
            savepoint,
        }) => {
            warning = true;
            status.current_parallelism = parallelism.clone();
            status.restored_from = savepoint.clone();
            status.phase = Phase::Running;
            let scaling = ("RolledBack", t.event.as_deref().unwrap_or(""));
            let degraded = (
                true,
                "RescaleRolledBack",
                "restoring at the new parallelism failed",
            );
            set_outcome_conditions(&mut status, scaling, degraded, generation, &old);
            "RolledBack".into()
        }
        Some(Outcome::Failed { reason }) => {
            warning = true;
            status.phase = Phase::Failed;
            let scaling = ("RescaleFailed", reason.as_str());
            let degraded = (true, "RescaleFailed", reason.as_str());
            set_outcome_conditions(&mut status, scaling, degraded, generation, &old);
            "RescaleFailed".into()
        }
    };
    if let Some(outcome) = &t.outcome
        && let Some(entry) =
            savepoint_history::recorded(&status.savepoint_history, &r, outcome, &obs.savepoint_dir)
    {
        status.savepoint_history.push(entry);
    }
    status.total_parallelism = total(&status.current_parallelism);
    // Deploying what is already deployed does not replace a stopped engine's pod (a roll back
    // after a savepoint whose id was lost): raise the restart counter so that it does.
    if let Action::Deploy {
        parallelism,
        restore,
    } = &t.action
        && matches!(&obs.engine, EngineObs::Up { state, .. } if state == "stopped")
        && obs.workload.as_ref()
            == Some(&rescale::WorkloadObs {
                parallelism: parallelism.clone(),
                restore: restore.clone(),
            })
    {
        status.restarts += 1;
    }
    if t.outcome.is_some() {
        // The downtime of a completed rescale (from the stop-with-savepoint request, made right
        // after the rescale started, to the job running again at the new parallelism) feeds the
        // planner's rescale-cost model, as `streamscale run` does with its measured downtime.
        let downtime_s = match &t.outcome {
            Some(Outcome::Rescaled { .. }) => seconds_between(&r.started_at, &now),
            _ => None,
        };
        let mut memory = ctx.memory.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = memory.get_mut(&key(job)) {
            m.window.clear();
            m.shed_applied = None;
            m.autoscaler.restarted(ctx.now_s());
            if let Some(s) = downtime_s {
                tracing::info!(job = %key(job), downtime_s = s, "rescale downtime observed");
                m.autoscaler.observe_rescale_downtime(s);
            }
        }
    }
    // Persist first, act second.
    if job.status.as_ref() != Some(&status) {
        write_status(ctx, job, &status).await?;
    }
    if let Some(event) = &t.event {
        publish(ctx, job, warning, &reason, event.clone()).await;
    }
    match t.action {
        Action::Wait => {}
        Action::TriggerSavepoint { id } => {
            match rt.api().request_stop_with_savepoint_as(false, &id).await {
                Ok(_) => {
                    publish(
                        ctx,
                        job,
                        false,
                        "Savepointing",
                        format!(
                            "stop-with-savepoint {id} requested at {}",
                            rescale::fmt_p(&r.from)
                        ),
                    )
                    .await;
                }
                // Taken before an operator restart by an engine that has restarted since.
                Err(streamscale_controller::api::ApiError::Status {
                    status: 409, body, ..
                }) if body.contains("already exists") => {
                    if let Some(next) = status.rescale.as_ref() {
                        status.rescale = Some(rescale::savepoint_exists(
                            next,
                            &resources::savepoint_dir(job),
                        ));
                    }
                    write_status(ctx, job, &status).await?;
                    publish(
                        ctx,
                        job,
                        false,
                        "Savepointing",
                        format!("savepoint {id} already exists; restoring from it"),
                    )
                    .await;
                }
                Err(e) => return Err(Error::Engine(e.to_string())),
            }
        }
        Action::Deploy {
            parallelism,
            restore,
        } => {
            rt.deploy(&parallelism, restore.as_deref(), status.restarts)
                .await?;
        }
    }
    Ok(Requeue::requeue(Duration::from_millis(300)))
}

async fn cleanup(job: Arc<StreamJob>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    ctx.memory
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key(&job));
    if job.spec.savepoint_on_delete {
        let api = streamscale_controller::api::EngineApi::new(
            ctx.http.clone(),
            &resources::engine_url(&job),
        );
        match api
            .stop_with_savepoint(false, Duration::from_secs(60))
            .await
        {
            Ok(out) => {
                publish(
                    &ctx,
                    &job,
                    false,
                    "FinalSavepoint",
                    format!("final savepoint at {}", out.path),
                )
                .await
            }
            Err(e) => publish(&ctx, &job, true, "FinalSavepointFailed", e.to_string()).await,
        }
    }
    Ok(Requeue::await_change())
}

/// The field manager used for server-side apply.
pub const MANAGER: &str = FIELD_MANAGER;

#[cfg(test)]
mod tests {
    use super::seconds_between;

    #[test]
    fn seconds_between_parses_rfc3339_and_rejects_bad_or_reversed_times() {
        assert_eq!(
            seconds_between("2026-11-30T10:00:00Z", "2026-11-30T10:00:02.5Z"),
            Some(2.5)
        );
        assert_eq!(
            seconds_between("2026-11-30T10:00:02Z", "2026-11-30T10:00:00Z"),
            None
        );
        assert_eq!(seconds_between("t0", "2026-11-30T10:00:00Z"), None);
        assert_eq!(seconds_between("2026-11-30T10:00:00Z", "later"), None);
    }
}
