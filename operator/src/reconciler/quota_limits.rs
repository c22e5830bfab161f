//! The namespace quota (StreamQuota) and the job's limits: shares, reports and conditions.

use super::*;
use crate::flink_scaler_crd::FlinkScaler;

/// The quota part of one reconcile: the StreamQuota's size, this job's share, and the demand
/// this job reports (its previous one until a new plan replaces it).
pub(super) struct QuotaOutcome {
    pub(super) name: String,
    pub(super) subtasks: u32,
    pub(super) share: Result<quota::Share, String>,
    pub(super) held: u32,
    pub(super) demand: Vec<OperatorDemandStatus>,
}

/// Reads the StreamQuota `name` and its member StreamJobs and FlinkScalers (of this
/// namespace) and computes this job's share (see [`crate::quota`]). `spec` is this job's
/// planning spec, `status` its status as this reconcile has it.
pub(super) async fn quota_share(
    job: &StreamJob,
    ctx: &Context,
    name: &str,
    spec: &JobSpec,
    status: &StreamJobStatus,
) -> QuotaOutcome {
    let held = quota::non_source_total(spec, &status.current_parallelism);
    let demand = status
        .quota
        .as_ref()
        .filter(|q| q.name == name && !q.demand.is_empty())
        .map_or_else(
            || quota::demand_from_parallelism(spec, &status.current_parallelism),
            |q| q.demand.clone(),
        );
    let own = quota::Member {
        name: job.name_any(),
        demand,
        held,
    };
    let ns = job.namespace().unwrap_or_else(|| "default".into());
    share_of(ctx, &ns, name, own).await
}

/// The share of member `own` (its name, demand and what it holds) of the StreamQuota `name`
/// in namespace `ns`, among the StreamJobs and FlinkScalers there that name it. FlinkScalers
/// are left out when they cannot be listed because their CRD is not installed or the
/// operator may not list them (StreamJob quotas work without Flink support).
pub(super) async fn share_of(
    ctx: &Context,
    ns: &str,
    name: &str,
    own: quota::Member,
) -> QuotaOutcome {
    let mut out = QuotaOutcome {
        name: name.to_string(),
        subtasks: 0,
        share: Err(String::new()),
        held: own.held,
        demand: own.demand.clone(),
    };
    let quotas: Api<StreamQuota> = Api::namespaced(ctx.client.clone(), ns);
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
    let own_name = own.name.clone();
    let mut members = vec![own];
    let jobs: Api<StreamJob> = Api::namespaced(ctx.client.clone(), ns);
    let list = match jobs.list(&kube::api::ListParams::default()).await {
        Ok(l) => l,
        Err(e) => {
            out.share = Err(format!("cannot list the StreamJobs of quota {name}: {e}"));
            return out;
        }
    };
    for other in list.items {
        if other.name_any() == own_name || other.spec.autoscaler.quota.as_deref() != Some(name) {
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
    let scalers: Api<FlinkScaler> = Api::namespaced(ctx.client.clone(), ns);
    let list = match scalers.list(&kube::api::ListParams::default()).await {
        Ok(l) => l.items,
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 403 => Vec::new(),
        Err(e) => {
            out.share = Err(format!("cannot list the FlinkScalers of quota {name}: {e}"));
            return out;
        }
    };
    for other in list {
        let member = quota::flink_member_name(&other.name_any());
        if member == own_name || other.spec.autoscaler.quota.as_deref() != Some(name) {
            continue;
        }
        let held = quota::flink_held(&other);
        // Its demand as it last reported it; before that, the slots it holds.
        let demand = other
            .status
            .as_ref()
            .and_then(|s| s.quota.as_ref())
            .filter(|q| q.name == name && !q.demand.is_empty())
            .map_or_else(
                || {
                    let most = other.status.as_ref().map_or(0, |s| {
                        s.vertices
                            .iter()
                            .map(|v| v.max_parallelism)
                            .max()
                            .unwrap_or(0)
                    });
                    vec![OperatorDemandStatus {
                        name: quota::SLOTS.to_string(),
                        need: f64::from(held.max(1)),
                        min: 1,
                        max: most.max(held).max(1),
                    }]
                },
                |q| q.demand.clone(),
            );
        members.push(quota::Member {
            name: member,
            demand,
            held,
        });
    }
    out.share = quota::share(&own_name, &members, q.spec.subtasks).map_err(|e| e.to_string());
    out
}

/// Writes this job's (StreamJob's or FlinkScaler's) quota share to its `status.quota`
/// (`slot`), with an Event when the share changes.
pub(super) async fn report_quota<K: Resource<DynamicType = ()> + ResourceExt>(
    job: &K,
    ctx: &Context,
    slot: &mut Option<QuotaShareStatus>,
    q: QuotaOutcome,
) {
    let old = slot.clone();
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
    *slot = Some(new);
}

/// Writes the limit the last plan ran into to `status.limit` (with an Event when it starts,
/// changes or ends) and, under `onLimit: shed`, applies the plan's shed share at the engine's
/// sources (`POST /v1/shed`; a restarted engine starts at 0, so it is applied again after a
/// rescale).
pub(super) async fn report_limit(
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
    match rt
        .authorized(|api| async move { api.set_shed(wanted).await })
        .await
    {
        Ok(_) => {
            tracing::info!(job = %key(job), share = wanted, "shed share applied");
            let mut memory = ctx.memory.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(m) = memory.get_mut(&key(job)) {
                m.shed_applied = Some(wanted);
            }
        }
        Err(e) => tracing::warn!(job = %key(job), "{e}"),
    }
}
