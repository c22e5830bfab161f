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
use streamscale_controller::flink::metrics::same_counters;
use streamscale_controller::flink::rest::JobDetails;
use streamscale_controller::flink::slots;
use streamscale_controller::flink::topology::{FlinkTopology, VertexBounds};
use streamscale_controller::rescale::BACKOFF_MAX_S;
use streamscale_engine::spec::{AutoscalerSpec, LimitsSpec, ScalingBounds};

use super::*;
use crate::flink_rescale::{self, JobObs, Next};
use crate::flink_scaler_crd::{
    BackoffStatus, FailedParallelism, FlinkRescaleStatus, FlinkRescaleStep, FlinkScaler,
    FlinkScalerPhase, FlinkScalerStatus, RescaleResultStatus, VertexStatus,
};
use crate::flink_target::{self, TargetView};

/// What the autoscaler remembers about one FlinkScaler between reconciles (the window is not
/// persisted; what is learned is, in its ConfigMap).
pub(crate) struct ScalerMemory {
    /// The window, the autoscaler and the ConfigMap store.
    session: AutoscaleSession<ConfigMapStateStore>,
    collector: Collector,
    topology: Option<FlinkTopology>,
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
            &Patch::Merge(&serde_json::json!({ "status": status })),
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
            status.phase = FlinkScalerPhase::Pending;
            scope.set(&mut status, "Ready", false, "JobNotRunning", &message);
            clear_degraded(&scope, &mut status);
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
    clear_degraded(&scope, &mut status);
    // Held until this reconcile's status is written (see `Context::quota_locks`).
    let quota_lock = ctx.quota_lock_of(scaler, a.quota.as_deref());
    let _quota_guard = match &quota_lock {
        Some(l) => Some(l.lock().await),
        None => None,
    };
    if a.mode != AutoscalerMode::Off {
        autoscale_flink(&scope, memory, &rest, &job, &view, &mut status).await?;
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

/// `Degraded=False`, unless a rollback failed (that stays until a rescale completes): a target
/// that is back, or no longer refused, is no longer degraded.
fn clear_degraded(scope: &Scope<'_>, status: &mut FlinkScalerStatus) {
    let rollback_failed = status
        .conditions
        .iter()
        .any(|c| c.type_ == "Degraded" && c.status == "True" && c.reason == "RollbackFailed");
    if !rollback_failed {
        scope.set(status, "Degraded", false, "AsExpected", "");
    }
}

async fn target_missing(
    scope: &Scope<'_>,
    before: FlinkScalerStatus,
    mut status: FlinkScalerStatus,
) -> Result<Requeue, Error> {
    let kind = scope.scaler.spec.target_ref.kind;
    let message = format!(
        "{} {} not found in namespace {}",
        kind.name(),
        scope.name(),
        scope.scaler.namespace().unwrap_or_default()
    );
    let first = status.phase != FlinkScalerPhase::TargetMissing;
    if let Some(r) = status.rescale.take() {
        scope
            .event(
                true,
                "RescaleAbandoned",
                format!(
                    "the target is gone during the rescale to {}",
                    rescale::fmt_p(&r.to)
                ),
            )
            .await;
    }
    status.phase = FlinkScalerPhase::TargetMissing;
    status.job_id = None;
    status.vertices.clear();
    status.current_parallelism.clear();
    status.total_parallelism = 0;
    scope.set(&mut status, "Ready", false, "TargetNotFound", &message);
    scope.set(&mut status, "Degraded", true, "TargetNotFound", &message);
    scope.set(&mut status, "Scaling", false, "Idle", "");
    if first {
        scope.event(true, "TargetNotFound", message).await;
    }
    if status != before {
        scope.write_status(&status).await?;
    }
    Ok(Requeue::requeue(Duration::from_secs(10)))
}

/// `vid:p,vid:p` as a map by vertex id (malformed parts left out).
fn parse_overrides(s: &str) -> BTreeMap<String, u32> {
    s.split(',')
        .filter_map(|part| {
            let (vid, p) = part.trim().split_once(':')?;
            Some((vid.trim().to_string(), p.trim().parse().ok()?))
        })
        .collect()
}

/// One step of the rescale in status (see [`flink_rescale::advance`]).
async fn drive(
    scope: &Scope<'_>,
    memory: &mut ScalerMemory,
    view: &TargetView,
    job: Option<&JobDetails>,
    status: &mut FlinkScalerStatus,
    mut r: FlinkRescaleStatus,
) -> Result<Requeue, Error> {
    let a = &scope.scaler.spec.autoscaler;
    let obs = job.map(|j| JobObs {
        parallelism_by_id: j.parallelism_by_id(),
        all_running: j.all_running(),
        ended: matches!(j.state.as_str(), "FAILED" | "CANCELED" | "FINISHED")
            .then(|| j.state.clone()),
    });
    let to_by_id = parse_overrides(&r.overrides);
    let elapsed = age_s(&r.started_at);
    let next = flink_rescale::advance(
        &r,
        view,
        obs.as_ref(),
        &to_by_id,
        elapsed,
        f64::from(a.restore_timeout_seconds),
    );
    status.phase = FlinkScalerPhase::Rescaling;
    let fast = Requeue::requeue(Duration::from_millis(500));
    match next {
        Next::Wait => Ok(fast),
        Next::Write => {
            r.target_generation = scope.write_overrides(&r.overrides).await?;
            status.rescale = Some(r);
            Ok(Requeue::requeue(Duration::from_millis(200)))
        }
        Next::Observed => {
            r.step = FlinkRescaleStep::Observed;
            r.step_started_at = now_rfc3339();
            scope.set(
                status,
                "Scaling",
                true,
                "Observed",
                "the Flink operator has the new overrides; waiting for the job to run at them",
            );
            let note = format!(
                "the Flink operator observed {} after {elapsed:.1} s; waiting for the job to run at it",
                r.overrides
            );
            status.rescale = Some(r);
            scope.event(false, "RescaleObserved", note).await;
            Ok(fast)
        }
        Next::Done { seconds } => {
            let now = ctx_now(scope);
            status.rescale = None;
            status.phase = FlinkScalerPhase::Running;
            memory.session.restarted(now);
            if r.rolling_back {
                let message = format!("back at {} after {seconds:.1} s", rescale::fmt_p(&r.to));
                if let Some(last) = &mut status.last_rescale {
                    last.finished_at = now_rfc3339();
                    last.message = Some(format!(
                        "{}; {message}",
                        last.message.clone().unwrap_or_default()
                    ));
                }
                scope.set(status, "Scaling", false, "RolledBack", &message);
                scope.event(false, "RolledBack", message).await;
            } else {
                status.rescales += 1;
                status.backoff = None;
                scope.set(status, "Degraded", false, "AsExpected", "");
                memory
                    .session
                    .autoscaler_mut()
                    .observe_rescale_downtime(seconds);
                save_learned(&mut memory.session).await;
                let message = format!(
                    "{} -> {} in {seconds:.1} s",
                    rescale::fmt_p(&r.from),
                    rescale::fmt_p(&r.to)
                );
                status.last_rescale = Some(RescaleResultStatus {
                    outcome: "Rescaled".into(),
                    to: r.to.clone(),
                    downtime_seconds: Some(seconds),
                    finished_at: now_rfc3339(),
                    message: None,
                });
                scope.set(status, "Scaling", false, "Rescaled", &message);
                scope.event(false, "Rescaled", message).await;
            }
            Ok(Requeue::requeue(Duration::from_secs(1)))
        }
        Next::RollBack { why } => {
            let failures = status.backoff.as_ref().map_or(0, |b| b.failures) + 1;
            let wait = flink_rescale::backoff_seconds(failures).min(BACKOFF_MAX_S);
            let mut failed = status
                .backoff
                .as_ref()
                .map(|b| b.failed.clone())
                .unwrap_or_default();
            match failed.iter_mut().find(|f| f.parallelism == r.to) {
                Some(f) => f.failures += 1,
                None => failed.push(FailedParallelism {
                    parallelism: r.to.clone(),
                    failures: 1,
                }),
            }
            let retry = Timestamp::now()
                .checked_add(k8s_openapi::jiff::SignedDuration::from_secs_f64(wait))
                .unwrap_or_else(|_| Timestamp::now());
            status.backoff = Some(BackoffStatus {
                failures,
                retry_after: retry.to_string(),
                failed,
            });
            let message = format!(
                "rescale to {} failed: {why}; putting back {} (backoff {wait:.0} s)",
                rescale::fmt_p(&r.to),
                r.previous_overrides
            );
            status.last_rescale = Some(RescaleResultStatus {
                outcome: "RolledBack".into(),
                to: r.to.clone(),
                downtime_seconds: None,
                finished_at: now_rfc3339(),
                message: Some(why),
            });
            let now = now_rfc3339();
            status.rescale = Some(FlinkRescaleStatus {
                step: FlinkRescaleStep::Requested,
                from: r.to.clone(),
                to: r.from.clone(),
                overrides: r.previous_overrides.clone(),
                previous_overrides: r.previous_overrides.clone(),
                target_generation: None,
                reason: format!("rollback: {}", r.reason),
                rolling_back: true,
                started_at: now.clone(),
                step_started_at: now,
            });
            scope.set(status, "Scaling", true, "RollingBack", &message);
            scope.event(true, "RescaleFailed", message).await;
            Ok(Requeue::requeue(Duration::from_millis(200)))
        }
        Next::GiveUp { why } => {
            let message = format!(
                "the rollback to {} did not complete: {why}; the FlinkScaler stops driving it (check the {} and its job)",
                rescale::fmt_p(&r.to),
                scope.scaler.spec.target_ref.kind.name()
            );
            status.rescale = None;
            status.phase = FlinkScalerPhase::Running;
            if let Some(last) = &mut status.last_rescale {
                last.outcome = "RollbackTimedOut".into();
                last.message = Some(message.clone());
            }
            scope.set(status, "Scaling", false, "RollbackFailed", &message);
            scope.set(status, "Degraded", true, "RollbackFailed", &message);
            scope.event(true, "RollbackFailed", message).await;
            Ok(Requeue::requeue(Duration::from_secs(5)))
        }
    }
}

fn ctx_now(scope: &Scope<'_>) -> f64 {
    scope.ctx.now_s()
}

/// Collects a sample, decides, and records the decision (starting a rescale in mode `auto`).
async fn autoscale_flink(
    scope: &Scope<'_>,
    m: &mut ScalerMemory,
    rest: &FlinkRest,
    job: &JobDetails,
    view: &TargetView,
    status: &mut FlinkScalerStatus,
) -> Result<(), Error> {
    let scaler = scope.scaler;
    let a = &scaler.spec.autoscaler;
    let Some(topo) = m.topology.clone() else {
        return Ok(());
    };
    let now_s = scope.ctx.now_s();
    let settings = guard_settings_of(a);
    // New settings, same job: what was learned carries over.
    m.session.update_settings(settings, now_s);
    m.session
        .set_window_rule(WindowRule::HorizonKeepingTwo(f64::from(
            a.metrics_window_seconds,
        )));
    let mut source = FlinkRestSource {
        collector: &mut m.collector,
        rest,
        job,
        topo: &topo,
        previous: m.session.window().back(),
    };
    let sample = match source.collect(&|| now_s).await {
        Ok(Some(s)) => s,
        Ok(None) => return Ok(()),
        Err(e) => {
            tracing::warn!(scaler = %key(scaler), "cannot read the job's metrics: {e}");
            return Ok(());
        }
    };
    if m.session
        .window()
        .back()
        .is_some_and(|last| same_counters(last, &sample.sample))
    {
        // Flink has not refreshed its metrics since the last scrape.
        return Ok(());
    }
    if m.session
        .window()
        .back()
        .is_some_and(|last| last_parallelism(last) != last_parallelism(&sample.sample))
    {
        // Rescaled from outside (the user, the Flink operator): a new deployment.
        m.session.restarted(now_s);
    }
    ctx_metrics_read(scope);
    m.session.observe(now_s, sample.sample);
    let current = status.current_parallelism.clone();
    // The slots the plan may use: the cluster's free slots plus those the job holds, and its
    // share of a StreamQuota; the tightest caps every vertex.
    let mut caps: Vec<(u32, String)> = Vec::new();
    let cluster = cluster_view(scope, view).await;
    match rest.overview().await {
        Ok(o) => {
            let held = slots::held(&current);
            let max = cluster.slots_max();
            if let Some(limit) = slots::job_limit(
                o.slots_total,
                o.slots_available,
                held,
                cluster.task_managers_on_demand(),
                max,
            ) {
                let what = match max {
                    Some(m) => format!(
                        "the Flink cluster has {} slots, {} free, slotmanager.number-of-slots.max {m}",
                        o.slots_total, o.slots_available
                    ),
                    None => format!(
                        "the Flink cluster has {} slots, {} free",
                        o.slots_total, o.slots_available
                    ),
                };
                caps.push((limit.max(1), what));
            }
        }
        Err(e) => {
            tracing::warn!(scaler = %key(scaler), "cannot read the cluster's slots: {e}");
        }
    }
    let quota = match &a.quota {
        Some(name) => {
            let held = quota::slots_held(&current);
            let demand = status
                .quota
                .as_ref()
                .filter(|q| q.name == *name && !q.demand.is_empty())
                .map_or_else(
                    || {
                        quota::slots_demand(
                            &topo.spec,
                            &quota::demand_from_parallelism(&topo.spec, &current),
                            &current,
                        )
                    },
                    |q| q.demand.clone(),
                );
            let own = quota::Member {
                name: quota::flink_member_name(&scaler.name_any()),
                demand,
                held,
            };
            let ns = scaler.namespace().unwrap_or_else(|| "default".into());
            let q = share_of(scope.ctx, &ns, name, own).await;
            let cap = q.share.as_ref().map_or(held, |s| s.cap).max(1);
            caps.push((
                cap,
                format!(
                    "the share of StreamQuota {name}: {cap} of {} slots",
                    q.subtasks
                ),
            ));
            Some(q)
        }
        None => None,
    };
    let cap = caps.iter().min_by_key(|(c, _)| *c).cloned();
    let mut spec = topo.spec.clone();
    if let Some((c, _)) = &cap {
        slots::cap(&mut spec, *c);
        // Beyond the cap the job holds at it (a Flink job's sources cannot shed).
        spec.autoscaler
            .limits
            .get_or_insert_with(LimitsSpec::default);
    }
    let verdict = m.session.decide(now_s, &spec);
    save_learned(&mut m.session).await;
    let planned = match &verdict {
        Verdict::Rescale(d) => Some(d),
        Verdict::Hold { recommendation, .. } => recommendation.as_ref(),
    };
    if let Some(mut q) = quota {
        if let Some(d) = planned {
            q.demand = quota::slots_demand(
                &topo.spec,
                &quota::demand_from_decision(d, &topo.spec),
                &current,
            );
        }
        report_quota(scaler, scope.ctx, &mut status.quota, q).await;
    }
    let (mut decision, mut rescale, mut held) = match verdict {
        Verdict::Rescale(d) => (d, true, String::new()),
        Verdict::Hold {
            recommendation: Some(d),
            reason,
        } => (d, false, reason),
        Verdict::Hold { reason, .. } => {
            scope
                .ctx
                .metrics
                .decisions
                .with_label_values(&["hold"])
                .inc();
            tracing::debug!(scaler = %key(scaler), "hold: {reason}");
            let d = last_decision::hold(&current, reason, now_rfc3339());
            record_hold(scope.ctx, scaler, &mut status.last_decision, d).await;
            return Ok(());
        }
    };
    // A job holding more slots than its quota share is rescaled down to it, whatever the
    // scale-down guards say (the other members wait for those slots).
    if let Some(q) = &status.quota
        && let Some(target) =
            quota::forced_slots_scale_down(q, &current, &decision.parallelism, rescale)
    {
        decision.parallelism = target;
        decision.reasons.insert(
            0,
            format!(
                "quota {}: {} slots held, the share is {}; rescaling down to it",
                q.name, q.running_subtasks, q.allocated_subtasks
            ),
        );
        rescale = true;
    }
    if let Some((c, what)) = &cap
        && let Some(note) = slots::held_note(&decision, *c, what)
    {
        held = format!("{held}; {note}");
        decision.reasons.push(note);
    }
    let reason = std::iter::once(decision.bottleneck.clone().unwrap_or_default())
        .chain(decision.reasons.iter().cloned())
        .chain(sample.notes.iter().cloned())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    let changed = status.recommended_parallelism != decision.parallelism;
    status.recommended_parallelism = decision.parallelism.clone();
    for v in &mut status.vertices {
        v.recommended = decision.parallelism.get(&v.name).copied();
    }
    if !rescale {
        scope
            .ctx
            .metrics
            .decisions
            .with_label_values(&["hold"])
            .inc();
        let d = last_decision::of_decision(
            &decision,
            &current,
            DecisionAction::Hold,
            held.trim_start_matches("; ").to_string(),
            now_rfc3339(),
        );
        record_hold(scope.ctx, scaler, &mut status.last_decision, d).await;
        return Ok(());
    }
    let auto = a.mode == AutoscalerMode::Auto;
    if auto
        && let Some(b) = &status.backoff
        && b.retry_after
            .parse::<Timestamp>()
            .is_ok_and(|t| t > Timestamp::now())
    {
        let why = format!(
            "rescale to {} held: backing off until {} after {} failed rescale(s)",
            rescale::fmt_p(&decision.parallelism),
            b.retry_after,
            b.failures
        );
        tracing::info!(scaler = %key(scaler), "{why}");
        let d = last_decision::of_decision(
            &decision,
            &current,
            DecisionAction::Hold,
            why,
            now_rfc3339(),
        );
        record_hold(scope.ctx, scaler, &mut status.last_decision, d).await;
        return Ok(());
    }
    let d = last_decision::of_decision(
        &decision,
        &current,
        if auto {
            DecisionAction::Rescale
        } else {
            DecisionAction::Recommend
        },
        reason.clone(),
        now_rfc3339(),
    );
    last_decision::store(&mut status.last_decision, d);
    if !auto {
        scope
            .ctx
            .metrics
            .decisions
            .with_label_values(&["recommend"])
            .inc();
        if changed {
            scope
                .event(
                    false,
                    "Recommendation",
                    format!(
                        "recommended {}: {reason}",
                        rescale::fmt_p(&decision.parallelism)
                    ),
                )
                .await;
        }
        return Ok(());
    }
    scope
        .ctx
        .metrics
        .decisions
        .with_label_values(&["rescale"])
        .inc();
    let from = status.current_parallelism.clone();
    let overrides = topo.overrides(&decision.parallelism);
    let previous = view.overrides().unwrap_or_else(|| topo.overrides(&from));
    let now = now_rfc3339();
    // The step is persisted before the target is written: a restart re-writes it (idempotent).
    status.rescale = Some(FlinkRescaleStatus {
        step: FlinkRescaleStep::Requested,
        from: from.clone(),
        to: decision.parallelism.clone(),
        overrides: overrides.clone(),
        previous_overrides: previous,
        target_generation: None,
        reason: reason.clone(),
        rolling_back: false,
        started_at: now.clone(),
        step_started_at: now,
    });
    status.phase = FlinkScalerPhase::Rescaling;
    scope.set(
        status,
        "Scaling",
        true,
        "Requested",
        &format!("overrides {overrides} written to the target"),
    );
    scope.write_status(status).await?;
    scope
        .event(
            false,
            "RescaleStarted",
            format!(
                "{} -> {}: {reason}",
                rescale::fmt_p(&from),
                rescale::fmt_p(&decision.parallelism)
            ),
        )
        .await;
    let generation = scope.write_overrides(&overrides).await?;
    if let Some(r) = &mut status.rescale {
        r.target_generation = generation;
    }
    m.session.restarted(now_s);
    Ok(())
}

/// The FlinkDeployment that runs the job's cluster: the target itself, or a FlinkSessionJob's
/// session cluster (`spec.deploymentName`; the FlinkSessionJob when it cannot be read, so its
/// slots are taken as started on demand).
async fn cluster_view(scope: &Scope<'_>, view: &TargetView) -> TargetView {
    use crate::flink_scaler_crd::TargetKind;
    if scope.scaler.spec.target_ref.kind != TargetKind::FlinkSessionJob {
        return view.clone();
    }
    let Some(name) = &view.deployment_name else {
        return view.clone();
    };
    let ns = scope.scaler.namespace().unwrap_or_else(|| "default".into());
    let api: Api<DynamicObject> = Api::namespaced_with(
        scope.ctx.client.clone(),
        &ns,
        &flink_target::api_resource(TargetKind::FlinkDeployment),
    );
    match api.get_opt(name).await {
        Ok(Some(d)) => TargetView::from_json(&serde_json::to_value(&d).unwrap_or_default()),
        Ok(None) => view.clone(),
        Err(e) => {
            tracing::debug!(scaler = %key(scope.scaler), "cannot read FlinkDeployment {name}: {e}");
            view.clone()
        }
    }
}

fn ctx_metrics_read(scope: &Scope<'_>) {
    scope
        .ctx
        .metrics
        .metric_reads
        .with_label_values(&["flink"])
        .inc();
}

#[cfg(test)]
mod tests {
    use super::parse_overrides;

    #[test]
    fn overrides_parse_by_vertex_id() {
        let p = parse_overrides("a1:2, b2:3,bad,c3:x");
        assert_eq!(p.len(), 2);
        assert_eq!(p["a1"], 2);
        assert_eq!(p["b2"], 3);
    }
}
