//! The FlinkScaler controller: autoscales the Flink job of a `FlinkDeployment` or
//! `FlinkSessionJob` of the Apache Flink Kubernetes Operator.
//!
//! Per reconcile of a FlinkScaler:
//! 1. the target is read (absent: phase `TargetMissing`, `Degraded=True`, a Warning Event; a
//!    rescale in progress is dropped); a target with Flink's own autoscaler on
//!    (`job.autoscaler.enabled: "true"`) is refused (phase `Refused`, `Degraded=True`, a Warning
//!    Event): two autoscalers on one job fight;
//! 2. the job (id from the target's `status.jobStatus.jobId`) is read from the JobManager's REST
//!    API and mapped onto the planner's graph ([`FlinkTopology`]);
//! 3. with a rescale in status, one step of [`flink_rescale::advance`] (the next step is written
//!    to status before it acts);
//! 4. otherwise the job's counters are collected ([`Collector`], the one `streamscale flink`
//!    uses) into a window and the same guarded planner as StreamJobs ([`Autoscaler`]) decides:
//!    mode `auto` writes `spec.flinkConfiguration["pipeline.jobvertex-parallelism-overrides"]` on
//!    the target by server-side apply under the operator's field manager (that key only; the
//!    Flink operator applies it in place with the adaptive scheduler, else by an upgrade per
//!    the target's `upgradeMode`), `recommend` writes the recommendation to status only, `off`
//!    does neither.
//!
//! What the planner learns is kept in the FlinkScaler's `NAME-autoscaler` ConfigMap, as for
//! StreamJobs.

use kube::api::DynamicObject;
use streamscale_controller::collect::MetricsSource;
use streamscale_controller::flink::FlinkRest;
use streamscale_controller::flink::collect::{Collector, FlinkRestSource};
use streamscale_controller::flink::metrics::no_new_measurement;
use streamscale_controller::flink::rest::JobDetails;
use streamscale_controller::flink::slots;
use streamscale_controller::flink::topology::{FlinkTopology, VertexBounds};
use streamscale_engine::spec::{AutoscalerSpec, LimitsSpec, ScalingBounds};

use super::*;
use crate::flink_rescale::{self, JobObs, Next};
use crate::flink_scaler_crd::{
    BackoffStatus, FlinkRescaleStatus, FlinkRescaleStep, FlinkScaler, FlinkScalerPhase,
    FlinkScalerStatus, RescaleResultStatus, VertexStatus,
};

mod autoscale;
mod conditions;
mod rescale_driving;
use crate::flink_target::{self, TargetView};
use autoscale::autoscale_flink;
use conditions::{clear_degraded, degraded_by, target_missing};
use rescale_driving::drive;

/// What the autoscaler remembers about one FlinkScaler between reconciles (the window is not
/// persisted; what is learned is, in its ConfigMap).
pub(crate) struct ScalerMemory {
    /// The window, the autoscaler and the ConfigMap store.
    session: AutoscaleSession<ConfigMapStateStore>,
    collector: Collector,
    topology: Option<FlinkTopology>,
    /// The job has not had every vertex `RUNNING` since the last complete sample (a failover,
    /// a restart): the next complete sample counts as a restart.
    not_running: bool,
}

/// Runs the FlinkScaler controller in `namespace` (all when `None`) until shutdown. When
/// FlinkScalers cannot be listed (their CRD is not installed, or the operator's RBAC lacks them)
/// it logs one error saying so and returns: StreamJobs are served as before.
pub async fn run_flink_scalers(ctx: Arc<Context>, namespace: Option<String>) {
    let client = ctx.client.clone();
    let scalers = match &namespace {
        Some(ns) => Api::<FlinkScaler>::namespaced(client, ns),
        None => Api::<FlinkScaler>::all(client),
    };
    match scalers
        .list(&kube::api::ListParams::default().limit(1))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {
            tracing::error!(
                "FlinkScalers are not autoscaled: the FlinkScaler CRD is not installed (helm upgrade does not add CRDs: kubectl apply --server-side -f crds/flinkscaler.yaml, then restart the operator)"
            );
            return;
        }
        Err(kube::Error::Api(e)) if e.code == 403 => {
            tracing::error!(
                "FlinkScalers are not autoscaled: the operator may not list flinkscalers (chart value flink.enabled: true grants it; FLINK_SUPPORT=false turns this controller off): {}",
                e.message
            );
            return;
        }
        // Anything else (the API server not reachable yet) is retried by the watcher.
        Err(e) => tracing::warn!("listing FlinkScalers: {e}"),
    }
    Controller::new(scalers, watcher::Config::default().any_semantic())
        .shutdown_on_signal()
        .run(reconcile_scaler, scaler_error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(scaler = %obj.name, "reconciled"),
                Err(e) => tracing::warn!("FlinkScaler reconcile failed: {e}"),
            }
        })
        .await;
}

fn scaler_error_policy(_s: Arc<FlinkScaler>, error: &Error, ctx: Arc<Context>) -> Requeue {
    ctx.metrics.errors.inc();
    tracing::warn!("FlinkScaler reconcile error: {error}");
    Requeue::requeue(Duration::from_secs(5))
}

/// One reconcile of a FlinkScaler (see the module docs).
///
/// # Errors
/// API server errors; the controller retries after 5 s.
pub async fn reconcile_scaler(
    scaler: Arc<FlinkScaler>,
    ctx: Arc<Context>,
) -> Result<Requeue, Error> {
    ctx.metrics.reconciles.inc();
    let _timer = ctx.metrics.reconcile_seconds.start_timer();
    let k = key(&*scaler);
    let taken = ctx
        .flink_memory
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&k);
    let mut memory = match taken {
        Some(m) => m,
        None => {
            let settings = guard_settings_of(&scaler.spec.autoscaler);
            let now_s = ctx.now_s();
            let mut store = ConfigMapStateStore::for_flink_scaler(ctx.client.clone(), &scaler);
            let loaded = load_state(&*scaler, &ctx, &mut store).await;
            let horizon = f64::from(scaler.spec.autoscaler.metrics_window_seconds);
            ScalerMemory {
                session: new_session(
                    &scaler.name_any(),
                    settings,
                    now_s,
                    WindowRule::HorizonKeepingTwo(horizon),
                    store,
                    loaded.as_ref(),
                    ctx.unix0,
                ),
                collector: Collector::new(),
                topology: None,
                not_running: false,
            }
        }
    };
    let result = reconcile_with(&scaler, &ctx, &mut memory).await;
    ctx.flink_memory
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(k, memory);
    result
}

/// A reconcile's view of the world.
struct Scope<'a> {
    scaler: &'a FlinkScaler,
    ctx: &'a Context,
    targets: Api<DynamicObject>,
    generation: Option<i64>,
}

impl Scope<'_> {
    fn name(&self) -> &str {
        &self.scaler.spec.target_ref.name
    }

    async fn event(&self, warning: bool, reason: &str, note: String) {
        publish(self.ctx, self.scaler, warning, reason, note).await;
    }

    fn set(&self, status: &mut FlinkScalerStatus, type_: &str, ok: bool, reason: &str, msg: &str) {
        let old = status.conditions.clone();
        set_condition_in(
            &mut status.conditions,
            condition(type_, ok, reason, msg, self.generation, &old),
        );
    }

    async fn write_status(&self, status: &FlinkScalerStatus) -> Result<(), Error> {
        let ns = self.scaler.namespace().unwrap_or_else(|| "default".into());
        let api: Api<FlinkScaler> = Api::namespaced(self.ctx.client.clone(), &ns);
        api.patch_status(
            &self.scaler.name_any(),
            &PatchParams::default(),
            &Patch::Merge(
                &crate::status_patch::status_write(self.scaler.status.as_ref(), status)
                    .map_err(kube::Error::SerdeError)?,
            ),
        )
        .await?;
        Ok(())
    }

    /// Writes `overrides` on the target (server-side apply of that one key); returns the
    /// target's generation after the write.
    async fn write_overrides(&self, overrides: &str) -> Result<Option<i64>, Error> {
        let body =
            flink_target::overrides_patch(self.scaler.spec.target_ref.kind, self.name(), overrides);
        let obj = self
            .targets
            .patch(
                self.name(),
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            )
            .await?;
        Ok(obj.metadata.generation)
    }
}

async fn reconcile_with(
    scaler: &FlinkScaler,
    ctx: &Context,
    memory: &mut ScalerMemory,
) -> Result<Requeue, Error> {
    let ns = scaler.namespace().unwrap_or_else(|| "default".into());
    let kind = scaler.spec.target_ref.kind;
    let scope = Scope {
        scaler,
        ctx,
        targets: Api::namespaced_with(ctx.client.clone(), &ns, &flink_target::api_resource(kind)),
        generation: scaler.metadata.generation,
    };
    let before = scaler.status.clone().unwrap_or_default();
    let mut status = before.clone();
    let a = &scaler.spec.autoscaler;
    if status.observed_generation != scope.generation && a.prometheus.is_some() {
        scope
            .event(
                true,
                "UnsupportedSetting",
                "spec.autoscaler.prometheus is not used by a FlinkScaler (metrics come from the JobManager's REST API)".to_string(),
            )
            .await;
    }
    status.observed_generation = scope.generation;
    if a.quota.is_none() {
        status.quota = None;
    }

    let Some(target) = scope.targets.get_opt(scope.name()).await? else {
        return target_missing(&scope, before, status).await;
    };
    let view = TargetView::from_json(&serde_json::to_value(&target).unwrap_or_default());
    if view.flink_autoscaler_enabled() {
        let message = format!(
            "{} {} has Flink's own autoscaler enabled (job.autoscaler.enabled: \"true\"); two autoscalers on one job fight: turn it off to let streamscale scale the job",
            kind.name(),
            scope.name()
        );
        let first = status.phase != FlinkScalerPhase::Refused;
        status.phase = FlinkScalerPhase::Refused;
        scope.set(
            &mut status,
            "Ready",
            false,
            "FlinkAutoscalerEnabled",
            &message,
        );
        scope.set(
            &mut status,
            "Degraded",
            true,
            "FlinkAutoscalerEnabled",
            &message,
        );
        scope.set(&mut status, "Scaling", false, "Refused", "");
        if first {
            scope.event(true, "FlinkAutoscalerEnabled", message).await;
        }
        if status != before {
            scope.write_status(&status).await?;
        }
        // The target is not watched: look again soon, so a target fixed or deleted shows.
        return Ok(Requeue::requeue(Duration::from_secs(10)));
    }

    let rest_url = scaler
        .spec
        .rest_url
        .clone()
        .unwrap_or_else(|| flink_target::default_rest_url(kind, scope.name(), &view, &ns));
    status.rest_url = Some(rest_url.clone());
    status.job_id.clone_from(&view.job_id);
    let rest = match crate::flink_rest_auth::flink_rest(
        &ctx.client,
        &ctx.http,
        &ns,
        scaler.spec.rest_auth.as_ref(),
        &rest_url,
    )
    .await
    {
        Ok(rest) => rest,
        Err(message) => {
            // Names the Secret and key, never a value.
            let first = !status
                .conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.reason == "RestAuthInvalid");
            status.phase = FlinkScalerPhase::Pending;
            scope.set(&mut status, "Ready", false, "RestAuthInvalid", &message);
            if first {
                scope.event(true, "RestAuthInvalid", message).await;
            }
            if status != before {
                scope.write_status(&status).await?;
            }
            // Secrets are not watched: look again soon, so a fixed Secret shows.
            return Ok(Requeue::requeue(Duration::from_secs(10)));
        }
    };
    let job: Result<JobDetails, String> = match &view.job_id {
        Some(jid) => rest.job(jid).await.map_err(|e| e.to_string()),
        None => Err(format!(
            "{} {} has no job yet (status.jobStatus.jobId is empty)",
            kind.name(),
            scope.name()
        )),
    };
    if let Ok(job) = &job {
        let bounds: VertexBounds = a
            .parallelism
            .iter()
            .map(|(n, b)| {
                (
                    n.clone(),
                    ScalingBounds {
                        min: Some(b.min),
                        max: Some(b.max),
                    },
                )
            })
            .collect();
        match FlinkTopology::from_job(job, &AutoscalerSpec::default(), &bounds) {
            Ok(topo) => {
                if memory
                    .topology
                    .as_ref()
                    .is_none_or(|t| t.job_id != topo.job_id || !t.same_graph(job))
                {
                    memory.session.clear_window();
                }
                memory.topology = Some(topo);
            }
            Err(e) => tracing::warn!(scaler = %key(scaler), "{e}"),
        }
        if let Some(topo) = &memory.topology {
            status.current_parallelism = topo.by_name(&job.parallelism_by_id());
            status.total_parallelism = total(&status.current_parallelism);
            status.vertices = topo
                .vertices
                .iter()
                .map(|v| VertexStatus {
                    name: v.name.clone(),
                    id: v.id.clone(),
                    current: status
                        .current_parallelism
                        .get(&v.name)
                        .copied()
                        .unwrap_or(0),
                    recommended: status.recommended_parallelism.get(&v.name).copied(),
                    max_parallelism: v.max_parallelism,
                })
                .collect();
        }
    }

    if let Some(r) = status.rescale.clone() {
        let requeue = drive(&scope, memory, &view, job.as_ref().ok(), &mut status, r).await?;
        if status != before {
            scope.write_status(&status).await?;
        }
        return Ok(requeue);
    }
    // Scaling=False keeps the reason of the last rescale's end (Rescaled, RolledBack, ...).
    if !status
        .conditions
        .iter()
        .any(|c| c.type_ == "Scaling" && c.status == "False")
    {
        scope.set(
            &mut status,
            "Scaling",
            false,
            "Idle",
            "no rescale in progress",
        );
    }
    let interval = Duration::from_secs(u64::from(a.metrics_interval_seconds.max(1)));
    let job = match job {
        Ok(job) if job.state == "RUNNING" => job,
        other => {
            let message = match other {
                Ok(job) => format!("job {} is {}", job.jid, job.state),
                Err(e) => e,
            };
            memory.not_running = true;
            status.phase = FlinkScalerPhase::Pending;
            scope.set(&mut status, "Ready", false, "JobNotRunning", &message);
            // A stateless-upgrade hold is judged again once the job runs (said once).
            clear_degraded(&scope, &mut status, &["StatelessUpgrade"]);
            if status != before {
                scope.write_status(&status).await?;
            }
            return Ok(Requeue::requeue(interval.min(Duration::from_secs(5))));
        }
    };
    status.phase = FlinkScalerPhase::Running;
    scope.set(
        &mut status,
        "Ready",
        true,
        "JobRunning",
        &format!("job {} runs", job.jid),
    );
    let cluster = autoscale::cluster_view(&scope, &view).await;
    match view
        .stateless_upgrade(&cluster, job.adaptive_scheduler())
        .filter(|_| a.mode == AutoscalerMode::Auto)
    {
        // Rescales are held (autoscale_flink); said once.
        Some(note) => {
            let said = degraded_by(&before, "StatelessUpgrade");
            // A failed rollback's Degraded stays until a rescale completes (none can now).
            if !degraded_by(&status, "RollbackFailed") {
                scope.set(&mut status, "Degraded", true, "StatelessUpgrade", &note);
            }
            if !said && !degraded_by(&status, "RollbackFailed") {
                scope.event(true, "StatelessUpgrade", note).await;
            }
        }
        None => clear_degraded(&scope, &mut status, &[]),
    }
    // Held until this reconcile's status is written (see `Context::quota_locks`).
    let quota_lock = ctx.quota_lock_of(scaler, a.quota.as_deref());
    let _quota_guard = match &quota_lock {
        Some(l) => Some(l.lock().await),
        None => None,
    };
    if a.mode != AutoscalerMode::Off {
        autoscale_flink(&scope, memory, &rest, &job, &view, &cluster, &mut status).await?;
    }
    if status != before {
        scope.write_status(&status).await?;
    }
    Ok(Requeue::requeue(if status.rescale.is_some() {
        Duration::from_millis(500)
    } else {
        interval
    }))
}
