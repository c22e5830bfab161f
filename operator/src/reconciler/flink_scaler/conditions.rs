//! A FlinkScaler's phase and conditions when its target is missing, and clearing `Degraded`.

use super::*;

/// Whether `Degraded=True` has reason `reason` now.
pub(super) fn degraded_by(status: &FlinkScalerStatus, reason: &str) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == "Degraded" && c.status == "True" && c.reason == reason)
}

/// `Degraded=False`, unless a rollback failed (that stays until a rescale completes) or the
/// reason is in `keep` (judged again once the job runs): a target that is back, or no longer
/// refused, is no longer degraded.
pub(super) fn clear_degraded(scope: &Scope<'_>, status: &mut FlinkScalerStatus, keep: &[&str]) {
    if !degraded_by(status, "RollbackFailed") && !keep.iter().any(|r| degraded_by(status, r)) {
        scope.set(status, "Degraded", false, "AsExpected", "");
    }
}

pub(super) async fn target_missing(
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
