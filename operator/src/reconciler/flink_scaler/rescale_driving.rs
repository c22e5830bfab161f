//! Driving a FlinkScaler's rescale in status one step per reconcile.

use super::*;

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
pub(super) async fn drive(
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
        job_id: j.jid.clone(),
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
            let (backoff, wait) =
                BackoffStatus::after_failure(status.backoff.as_ref(), &r.to, Timestamp::now());
            status.backoff = Some(backoff);
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
                job_id: job.map(|j| j.jid.clone()),
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
