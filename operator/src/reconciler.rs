//! The StreamJob reconciler (a kube-runtime `Controller`).
//!
//! Per reconcile of a StreamJob:
//! 0. `spec.job` is checked as the engine checks a job file ([`crate::spec_check`]); a job the
//!    engine would refuse is neither deployed nor planned (phase `Failed`, reason
//!    `InvalidSpec`, see `refuse_invalid_job`);
//! 1. a finalizer (`streamscale.dev/final-savepoint`) is ensured; on delete it takes a final
//!    savepoint when `spec.savepointOnDelete` is set (owned objects go by owner references);
//! 2. with a rescale in status, one step of [`crate::rescale::advance`]: the new status is
//!    written first, then the step's action runs;
//! 3. otherwise the owned objects are applied at the current parallelism, the engine's
//!    `/metrics` are scraped into a window and the same guarded planner as `streamscale run`
//!    ([`Autoscaler`](streamscale_controller::model::Autoscaler)) decides: mode `auto` starts a rescale, `recommend` writes the
//!    recommendation to status, `off` does neither. A job naming a `StreamQuota` plans within
//!    its share of it ([`crate::quota`]), and a limit it runs into (hold or shed) goes to
//!    `status.limit` and Events.
//!
//! A rescale that leaves the job running from its savepoint records it in
//! `status.savepointHistory` ([`crate::savepoint_history`]); while the engine runs, the
//! history's oldest entries beyond `spec.savepointHistoryMaxCount` are disposed of through the
//! engine's `DELETE /v1/savepoints/{id}` (`dispose_old_savepoints`).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action as Requeue, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use streamscale_controller::autoscale_session::{AutoscaleSession, WindowRule};
use streamscale_controller::model::shed::LimitPlan;
use streamscale_controller::model::{GuardSettings, MetricSample, PlannerSettings, Verdict};
use streamscale_controller::state_store::{Keep, LearnedState, StateStore, StateStoreError};
use streamscale_engine::spec::{JobSpec, LimitsSpec, OnLimit};

use crate::crd::{
    AutoscalerMode, DecisionAction, DecisionStatus, FINALIZER, LimitStatus, OperatorDemandStatus,
    Phase, QuotaShareStatus, RescaleStatus, RescaleStep, StreamJob, StreamJobStatus, StreamQuota,
};
use crate::engine_recovery;
use crate::last_decision;
use crate::learned_configmap::{self, ConfigMapStateStore};
use crate::metrics::Metrics;
use crate::network_policy::NetworkPolicySettings;
use crate::quota;
use crate::rescale::{self, Action, EngineObs, Observation, Outcome, SavepointObs};
use crate::resources::{self, FIELD_MANAGER};
use crate::runtime::{ApplyError, KubeRuntime};
use crate::savepoint_history;
use crate::spec_check;

mod autoscale;
mod conditions;
mod flink_scaler;
mod memory;
mod quota_limits;
mod rescale_driving;
use autoscale::*;
use conditions::*;
use memory::*;
use quota_limits::*;
use rescale_driving::*;

pub use flink_scaler::run_flink_scalers;

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
    /// The engine token Secret could not be read or written.
    #[error(transparent)]
    Token(#[from] crate::engine_token::TokenError),
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
    /// Who reports the Events (for those published without the recorder).
    reporter: Reporter,
    memory: Mutex<HashMap<String, JobMemory>>,
    /// What the autoscaler remembers per FlinkScaler (`NAMESPACE/NAME`).
    flink_memory: Mutex<HashMap<String, flink_scaler::ScalerMemory>>,
    /// One lock per StreamQuota (`NAMESPACE/NAME`): the reconciles of its members take it from
    /// reading each other's status to writing their own, so that two members never both grow
    /// into the same free subtasks.
    quota_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    clock: tokio::time::Instant,
    /// Unix time (s) of `clock`'s zero: persisted times are Unix times.
    unix0: f64,
    /// Who may reach engine pods; `None`: no NetworkPolicy is applied.
    network_policy: Option<NetworkPolicySettings>,
}

impl Context {
    /// A context for `client`; events are reported as `reporter`.
    pub fn new(client: Client, metrics: Metrics, reporter: Reporter) -> Context {
        Context {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            reporter,
            client,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap_or_default(),
            metrics,
            memory: Mutex::new(HashMap::new()),
            flink_memory: Mutex::new(HashMap::new()),
            quota_locks: Mutex::new(HashMap::new()),
            clock: tokio::time::Instant::now(),
            unix0: Timestamp::now().as_millisecond() as f64 / 1000.0,
            network_policy: None,
        }
    }

    /// Applies a NetworkPolicy `NAME-engine` per StreamJob with `settings`
    /// ([`crate::network_policy`]).
    pub fn with_network_policy(mut self, settings: NetworkPolicySettings) -> Context {
        self.network_policy = Some(settings);
        self
    }

    fn now_s(&self) -> f64 {
        self.clock.elapsed().as_secs_f64()
    }

    /// The lock of `job`'s StreamQuota, when it names one.
    fn quota_lock(&self, job: &StreamJob) -> Option<Arc<tokio::sync::Mutex<()>>> {
        self.quota_lock_of(job, job.spec.autoscaler.quota.as_deref())
    }

    /// The lock of StreamQuota `quota` in `obj`'s namespace (StreamJobs and FlinkScalers).
    fn quota_lock_of<K: ResourceExt>(
        &self,
        obj: &K,
        quota: Option<&str>,
    ) -> Option<Arc<tokio::sync::Mutex<()>>> {
        let name = quota?;
        let k = format!("{}/{name}", obj.namespace().unwrap_or_default());
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

fn key<K: ResourceExt>(obj: &K) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
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

fn guard_settings(job: &StreamJob) -> GuardSettings {
    guard_settings_of(&job.spec.autoscaler)
}

/// The guards and planner settings of `spec.autoscaler` (StreamJob and FlinkScaler alike).
fn guard_settings_of(a: &crate::crd::AutoscalerSettings) -> GuardSettings {
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

/// How long a StreamJob whose owned objects the API server refused waits before they are
/// applied again (a new generation is reconciled at once; an admission rule, a quota or RBAC
/// may change without one).
pub const APPLY_REFUSED_RECHECK: Duration = Duration::from_secs(60);

/// The reason of the conditions and the Warning Event of a StreamJob whose owned objects the
/// API server refused.
pub const APPLY_REFUSED: &str = "ApplyRefused";

async fn apply(job: Arc<StreamJob>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let mut status = job.status.clone().unwrap_or_default();
    let generation = job.metadata.generation;
    if let Err(invalid) = spec_check::check(&job.spec.job)
        .and_then(|()| {
            spec_check::check_kafka_secret(&job.spec.job, job.spec.kafka_secret.is_some())
        })
        .and_then(|()| spec_check::check_bounds(&job.spec.job, &job.spec.autoscaler.parallelism))
    {
        return refuse_invalid_job(&job, &ctx, status, &invalid).await;
    }
    // Fixed since: what said so goes (the conditions are set again below).
    status.conditions.retain(|c| c.reason != "InvalidSpec");
    if status.current_parallelism.is_empty() {
        status.current_parallelism = job.spec.job.parallelism();
    }
    status.total_parallelism = total(&status.current_parallelism);
    let tokens = engine_tokens(&job, &ctx).await?;
    if let Some(settings) = &ctx.network_policy {
        let policy =
            crate::network_policy::network_policy(&job, settings).map_err(ApplyError::from)?;
        Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(
            ctx.client.clone(),
            &job.namespace().unwrap_or_else(|| "default".into()),
        )
        .patch(
            &resources::engine_name(&job),
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&policy),
        )
        .await?;
    }
    let rt =
        KubeRuntime::new(ctx.client.clone(), ctx.http.clone(), (*job).clone()).with_tokens(tokens);

    if let Some(r) = status.rescale.clone() {
        return drive_rescale(&job, &ctx, &rt, status, r).await;
    }

    // An edit that changes the job's graph: no savepoint of the running job restores into it
    // (the engine refuses it as another job's), and a fresh start would read and write again
    // what the running job has. Said, and nothing deployed, until the edit is undone.
    let deployed = rt.deployment().await?;
    if let Some(running) = deployed.as_ref().and_then(resources::deployed_fingerprint)
        && running != job.spec.job.fingerprint()
    {
        return refuse_graph_change(&job, &ctx, status).await;
    }
    status.conditions.retain(|c| c.reason != JOB_GRAPH_CHANGED);

    let (engine, _) = observe_engine(&rt).await;
    if matches!(&engine, EngineObs::Up { state, .. } if state == "running") {
        // An engine an older operator started without a token is moved onto its token through
        // a savepoint, as a rescale at the same parallelism, rather than replaced from an older
        // one.
        if deployed.as_ref().is_some_and(resources::runs_without_token) {
            return start_token_migration(&job, &ctx, status).await;
        }
        // An edited `spec.job` reaches a running engine through a savepoint, as a rescale at the
        // same parallelism, so that the new job continues from the old one's state and source
        // positions; replacing the pod would start it afresh from a new checkpoint lineage
        // (records read and written again, state lost).
        let want = resources::config_hash(&job, &status.current_parallelism);
        if deployed
            .as_ref()
            .and_then(resources::deployed_config_hash)
            .is_some_and(|h| h != want)
        {
            return start_job_change(&job, &ctx, status).await;
        }
    }
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
        // Raised once per stop: when the pod template does not carry the last raise yet (the
        // API server refused it, said as ApplyRefused), it is applied again, not raised again.
        let applied = deployed.as_ref().and_then(resources::deployed_restart);
        if applied.is_none_or(|n| n >= status.restarts) {
            status.restarts += 1;
            write_status(&ctx, &job, &status).await?;
            publish(
                &ctx,
                &*job,
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
    }
    if let Err(e) = rt
        .deploy(
            &status.current_parallelism,
            status.restored_from.as_deref(),
            status.restarts,
        )
        .await
    {
        return match e.spec_fault() {
            Some(fault) => {
                say_refused(&job, &ctx, &mut status, &fault).await?;
                Ok(Requeue::requeue(APPLY_REFUSED_RECHECK))
            }
            None => Err(e.into()),
        };
    }
    // Applied: a refusal said before is over (Ready and Degraded are set again below).
    status.conditions.retain(|c| c.reason != APPLY_REFUSED);
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
            let recovery = engine_recovery::observe(&status, restored_from.as_deref());
            if let Some(message) = engine_recovery::apply(&mut status, recovery) {
                publish(&ctx, &*job, true, "EngineRecovered", message).await;
            }
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

/// Starts a rescale at the current parallelism (stop with a savepoint, redeploy with the token
/// Secret mounted, restore) for an engine deployed without a token; Event
/// `EngineTokenMigration`.
async fn start_token_migration(
    job: &StreamJob,
    ctx: &Context,
    status: StreamJobStatus,
) -> Result<Requeue, Error> {
    let reason = "the engine runs without a token (deployed by an older operator): redeploying it from a savepoint with its token Secret";
    start_redeploy(
        job,
        ctx,
        status,
        reason,
        "redeploying the engine with its token",
        "EngineTokenMigration",
    )
    .await
}

/// Starts a rescale at the current parallelism (stop with a savepoint, deploy the edited job,
/// restore) for a running engine whose job file is not `spec.job`'s any more; Event
/// `JobSpecChanged`. A savepoint the edited job cannot restore (an operator with state
/// removed or renamed) fails the restore, and the rescale machine rolls back from the same
/// savepoint: nothing starts half-restored.
async fn start_job_change(
    job: &StreamJob,
    ctx: &Context,
    status: StreamJobStatus,
) -> Result<Requeue, Error> {
    start_redeploy(
        job,
        ctx,
        status,
        "spec.job changed: redeploying the engine with the edited job from a savepoint of the running one",
        "redeploying the engine with the edited job",
        "JobSpecChanged",
    )
    .await
}

/// The parallelism of `job` (an edited job) at `current`'s: each operator at its current
/// parallelism, one the edit added at the job's own; operators the job no longer has left out.
fn edited_parallelism(current: &BTreeMap<String, u32>, job: &JobSpec) -> BTreeMap<String, u32> {
    job.parallelism()
        .into_iter()
        .map(|(op, p)| {
            let now = current.get(&op).copied().unwrap_or(p);
            (op, now)
        })
        .collect()
}

/// Starts a rescale at the current parallelism with `reason` (status and Event `event`) and
/// `message` (the `Scaling` condition).
async fn start_redeploy(
    job: &StreamJob,
    ctx: &Context,
    mut status: StreamJobStatus,
    reason: &str,
    message: &str,
    event: &str,
) -> Result<Requeue, Error> {
    let now = now_rfc3339();
    let reason = reason.to_string();
    // At the same parallelism, over the operators of the job as it is now (an edit may add
    // or remove some: the engine refuses a `--parallelism` naming an operator its job lacks).
    let same = edited_parallelism(&status.current_parallelism, &job.spec.job);
    status.rescale = Some(RescaleStatus {
        step: RescaleStep::Savepointing,
        from: same.clone(),
        to: same,
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
        &mut status,
        condition(
            "Scaling",
            true,
            "Savepointing",
            message,
            job.metadata.generation,
            &old,
        ),
    );
    write_status(ctx, job, &status).await?;
    publish(ctx, job, false, event, reason).await;
    Ok(Requeue::requeue(Duration::from_millis(200)))
}

/// The engine tokens of `job` from its Secret (created, or rotated when the annotation asks);
/// a rotation is an Event `EngineTokenRotated` (never with the token).
async fn engine_tokens(
    job: &StreamJob,
    ctx: &Context,
) -> Result<crate::engine_token::EngineTokens, Error> {
    use crate::engine_token::{self, TokenChange};
    let (tokens, change) = engine_token::ensure(&ctx.client, job).await?;
    match change {
        TokenChange::Unchanged => {}
        TokenChange::Created => {
            tracing::info!(job = %key(job), secret = %engine_token::secret_name(job), "engine token Secret created");
        }
        TokenChange::Rotated => {
            publish(
                ctx,
                job,
                false,
                "EngineTokenRotated",
                format!(
                    "a new engine token is in Secret {}; the running engine keeps accepting the previous one until it restarts (the next rescale or pod replacement)",
                    engine_token::secret_name(job)
                ),
            )
            .await;
        }
    }
    Ok(tokens)
}

/// The outcome of a StreamJob whose `spec.job` the engine would refuse (or whose
/// `spec.autoscaler.parallelism` names an operator it lacks): nothing is deployed
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
    let message = format!(
        "{invalid}; the job is not deployed until {} is fixed",
        invalid.at
    );
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

/// Says in `status` that the API server refused an owned object of `job` or the operator could
/// not build one (`fault`, naming the object and the reason, e.g. a PVC of `storage.size: "0"`):
/// `Ready=False` and `Degraded=True`, both with reason [`APPLY_REFUSED`] and the refusal as
/// message, written at once, and a Warning Event when the refusal is new or another. The phase
/// is kept (an engine already running goes on with what was applied before; a rescale waits in
/// its redeploy). The caller applies again after [`APPLY_REFUSED_RECHECK`] (or at once on an
/// edit); the conditions go once an apply succeeds.
pub(super) async fn say_refused(
    job: &StreamJob,
    ctx: &Context,
    status: &mut StreamJobStatus,
    fault: &str,
) -> Result<(), Error> {
    ctx.metrics.errors.inc();
    tracing::warn!("{}: {fault}", key(job));
    let message =
        format!("{fault}; applied again until it is accepted (at once when the StreamJob changes)");
    say_not_applied(job, ctx, status, APPLY_REFUSED, message).await
}

/// `Ready=False` and `Degraded=True` with `reason` and `message` in `status`, written at once,
/// and a Warning Event when the message is new (an unchanged one keeps its transition time, so
/// it is written and said once).
async fn say_not_applied(
    job: &StreamJob,
    ctx: &Context,
    status: &mut StreamJobStatus,
    reason: &str,
    message: String,
) -> Result<(), Error> {
    let generation = job.metadata.generation;
    let old = job
        .status
        .as_ref()
        .map(|s| s.conditions.clone())
        .unwrap_or_default();
    let said = old
        .iter()
        .any(|c| c.reason == reason && c.message == message);
    for (type_, ok) in [("Ready", false), ("Degraded", true)] {
        set_condition(
            status,
            condition(type_, ok, reason, &message, generation, &old),
        );
    }
    status.observed_generation = generation;
    if job.status.as_ref() != Some(status) {
        write_status(ctx, job, status).await?;
    }
    if !said {
        publish(ctx, job, true, reason, message).await;
    }
    Ok(())
}

/// Reason of the conditions and Event when an edit of `spec.job` changes the running job's
/// graph, which no savepoint of it restores into.
pub const JOB_GRAPH_CHANGED: &str = "JobGraphChanged";

/// Says that `spec.job` changes the running job's graph; nothing is deployed, the engine goes
/// on with the previous job, and the StreamJob is looked at again on an edit.
async fn refuse_graph_change(
    job: &StreamJob,
    ctx: &Context,
    mut status: StreamJobStatus,
) -> Result<Requeue, Error> {
    let message = "spec.job changes the running job's graph (an operator added, removed, renamed \
                   or of another kind, an edge, the job's name or maxParallelism): no savepoint of \
                   the running job restores into it, so the engine goes on with the previous job. \
                   Put the previous graph back, or delete the StreamJob and create it again to \
                   start the edited job afresh (from its sources' start)"
        .to_string();
    say_not_applied(job, ctx, &mut status, JOB_GRAPH_CHANGED, message).await?;
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
    for entry in chosen {
        let id = entry.id.as_str();
        match rt
            .authorized(|api| async move { api.dispose_savepoint(id).await })
            .await
        {
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

async fn cleanup(job: Arc<StreamJob>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    ctx.memory
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key(&*job));
    if job.spec.savepoint_on_delete {
        // The Secret is read, never created or rotated, on the way out.
        let secret = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
            ctx.client.clone(),
            &job.namespace().unwrap_or_else(|| "default".into()),
        )
        .get_opt(&crate::engine_token::secret_name(&job))
        .await?;
        let mut rt = KubeRuntime::new(ctx.client.clone(), ctx.http.clone(), (*job).clone());
        if let Some(tokens) = secret.as_ref().and_then(crate::engine_token::stored) {
            rt = rt.with_tokens(tokens);
        }
        match rt
            .authorized(|api| async move {
                api.stop_with_savepoint(false, Duration::from_secs(60))
                    .await
            })
            .await
        {
            Ok(out) => {
                publish(
                    &ctx,
                    &*job,
                    false,
                    "FinalSavepoint",
                    format!("final savepoint at {}", out.path),
                )
                .await
            }
            Err(e) => publish(&ctx, &*job, true, "FinalSavepointFailed", e.to_string()).await,
        }
    }
    Ok(Requeue::await_change())
}

/// The field manager used for server-side apply.
pub const MANAGER: &str = FIELD_MANAGER;

#[cfg(test)]
mod tests {
    use super::{edited_parallelism, seconds_between};

    #[test]
    fn an_edited_job_keeps_the_parallelism_of_the_operators_it_still_has() {
        let yaml = "name: j\noperators:\n  - {name: source, kind: source}\n  \
                    - {name: tag, kind: map, parallelism: 2}\n  - {name: sink, kind: sink}\n\
                    edges:\n  - {from: source, to: tag}\n  - {from: tag, to: sink}\n";
        let job: streamscale_engine::spec::JobSpec = serde_saphyr::from_str(yaml).expect("job");
        let current = [("source", 1), ("enrich", 3), ("sink", 4)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let p = edited_parallelism(&current, &job);
        let want: Vec<(&str, u32)> = vec![("sink", 4), ("source", 1), ("tag", 2)];
        assert_eq!(
            p.iter().map(|(k, v)| (k.as_str(), *v)).collect::<Vec<_>>(),
            want
        );
    }

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
