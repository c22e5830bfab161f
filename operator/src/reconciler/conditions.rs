//! Status conditions, Events and status writes.

use super::*;

pub(super) fn condition(
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

pub(super) fn set_condition(status: &mut StreamJobStatus, c: Condition) {
    set_condition_in(&mut status.conditions, c);
}

/// Replaces the condition of `c`'s type in `conditions` by `c`.
pub(super) fn set_condition_in(conditions: &mut Vec<Condition>, c: Condition) {
    conditions.retain(|o| o.type_ != c.type_);
    conditions.push(c);
}

/// Sets the two conditions every end of a rescale sets: `Scaling=False` with
/// `scaling = (reason, message)`, and `Degraded` with `degraded = (status, reason, message)`.
pub(super) fn set_outcome_conditions(
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

pub(super) async fn publish<K: Resource<DynamicType = ()> + ResourceExt>(
    ctx: &Context,
    job: &K,
    warning: bool,
    reason: &str,
    note: String,
) {
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

pub(super) async fn write_status(
    ctx: &Context,
    job: &StreamJob,
    status: &StreamJobStatus,
) -> Result<(), Error> {
    let ns = job.namespace().unwrap_or_else(|| "default".into());
    let api: Api<StreamJob> = Api::namespaced(ctx.client.clone(), &ns);
    // What was cleared since the status was read is written as null (a merge patch keeps what
    // it leaves out).
    let patch = crate::status_patch::status_write(job.status.as_ref(), status)
        .map_err(kube::Error::SerdeError)?;
    api.patch_status(
        &job.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Records the hold `d` in `slot` (see [`crate::last_decision::record`]), with an Event `Hold`
/// when it says something new (another reason or recommendation), never at every tick.
pub(super) async fn record_hold<K: Resource<DynamicType = ()> + ResourceExt>(
    ctx: &Context,
    obj: &K,
    slot: &mut Option<DecisionStatus>,
    d: DecisionStatus,
) {
    let note = if d.to == d.from {
        format!("holding at {}: {}", rescale::fmt_p(&d.from), d.reason)
    } else {
        format!(
            "holding at {} (the plan is {}): {}",
            rescale::fmt_p(&d.from),
            rescale::fmt_p(&d.to),
            d.reason
        )
    };
    if crate::last_decision::record(slot, d) {
        publish_distinct(ctx, obj, "Hold", note).await;
    }
}

/// Publishes a Normal Event as a new Event object, never merged into an earlier one: the
/// recorder counts an Event of a reason it published in the last few minutes as a repeat of
/// that one (a series) and keeps the first note, which would hide a hold's new reason.
async fn publish_distinct<K: Resource<DynamicType = ()> + ResourceExt>(
    ctx: &Context,
    obj: &K,
    reason: &str,
    note: String,
) {
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    tracing::info!(job = %key(obj), reason, "{note}");
    let reference = obj.object_ref(&());
    let now = Timestamp::now();
    let ns = reference
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let event = K8sEvent {
        action: Some("Reconcile".into()),
        reason: Some(reason.to_string()),
        note: Some(note.chars().take(1000).collect()),
        event_time: Some(MicroTime(now)),
        metadata: ObjectMeta {
            namespace: Some(ns.clone()),
            name: Some(format!(
                "{}.{:x}",
                reference.name.as_deref().unwrap_or("streamscale"),
                now.as_nanosecond()
            )),
            ..ObjectMeta::default()
        },
        regarding: Some(reference),
        reporting_controller: Some(ctx.reporter.controller.clone()),
        reporting_instance: Some(
            ctx.reporter
                .instance
                .clone()
                .unwrap_or_else(|| ctx.reporter.controller.clone()),
        ),
        type_: Some("Normal".into()),
        ..K8sEvent::default()
    };
    let events: Api<K8sEvent> = Api::namespaced(ctx.client.clone(), &ns);
    if let Err(e) = events
        .create(&kube::api::PostParams::default(), &event)
        .await
    {
        tracing::warn!("cannot publish event: {e}");
    }
}
