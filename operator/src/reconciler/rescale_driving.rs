//! Driving the rescale machine (`streamscale_controller::rescale`) on the cluster, one turn
//! of [`drive::step`] per reconcile: the engine pod is the backend and the StreamJob's status
//! the persistence.

use streamscale_controller::rescale::drive::{self, RescaleBackend, SavepointRequest};
use streamscale_controller::rescale::machine::Transition;

use super::*;

pub(super) async fn drive_rescale(
    job: &StreamJob,
    ctx: &Context,
    rt: &KubeRuntime,
    status: StreamJobStatus,
    r: RescaleStatus,
) -> Result<Requeue, Error> {
    let mut pod = PodRescale {
        job,
        ctx,
        rt,
        status,
    };
    drive::step(&mut pod, &r).await?;
    Ok(Requeue::requeue(Duration::from_millis(300)))
}

/// Records in `status.backoff` that the rescale to `to` did not complete.
fn record_failure(status: &mut StreamJobStatus, to: &BTreeMap<String, u32>) {
    let (backoff, _) = crate::backoff_status::BackoffStatus::after_failure(
        status.backoff.as_ref(),
        to,
        Timestamp::now(),
    );
    status.backoff = Some(backoff);
}

/// Starts the hold of `status.backoff` from now; returns it as the status says it after a
/// reason (`"; rescales held ..."`), empty without a backoff.
fn hold(status: &mut StreamJobStatus) -> String {
    match &mut status.backoff {
        Some(b) => {
            let wait = b.hold_from(Timestamp::now());
            format!(
                "; rescales held for {wait:.0} s (until {}) after {} failed rescale(s) in a row",
                b.retry_after, b.failures
            )
        }
        None => String::new(),
    }
}

/// The rescale machine's backend for a StreamJob: its engine pod (observed through the
/// engine's REST API and the Deployment's pod template) and its status.
struct PodRescale<'a> {
    job: &'a StreamJob,
    ctx: &'a Context,
    rt: &'a KubeRuntime,
    /// The status as it will be (or was last) written.
    status: StreamJobStatus,
}

impl RescaleBackend for PodRescale<'_> {
    type Error = Error;

    fn now(&self) -> String {
        now_rfc3339()
    }

    async fn observe(&mut self, r: &RescaleStatus) -> Result<Observation, Error> {
        let (job, rt) = (self.job, self.rt);
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
        let workload = rt.workload().await?;
        Ok(Observation {
            engine: crate::engine_recovery::as_deployed(job, workload.as_ref(), engine),
            savepoint,
            workload,
            step_age_s: age_s(&r.step_started_at),
            previous_restore: self.status.restored_from.clone(),
            // The pods pick it themselves: a roll back deploys the old parallelism from the
            // same savepoint, whose checkpoint directory it shares with the failed attempt
            // (`resources::checkpoint_dir`), and `--recover` resumes from the newest
            // checkpoint there that verifies, else from the savepoint.
            newest_restore: None,
            savepoint_dir: resources::savepoint_dir(job),
            savepoint_timeout_s: f64::from(a.savepoint_timeout_seconds),
            restore_timeout_s: f64::from(a.restore_timeout_seconds),
        })
    }

    async fn persist(
        &mut self,
        r: &RescaleStatus,
        obs: &Observation,
        t: &Transition,
        now: &str,
    ) -> Result<(), Error> {
        let (job, ctx) = (self.job, self.ctx);
        let status = &mut self.status;
        let generation = job.metadata.generation;
        let old = status.conditions.clone();
        if t.rescale.as_ref().map(|n| n.step) != Some(r.step) {
            ctx.metrics
                .rescale_step_seconds
                .with_label_values(&[&format!("{:?}", r.step)])
                .observe(obs.step_age_s);
        }
        status.rescale = t.rescale.clone();
        // The backoff is about the autoscaler's rescales, not a redeploy at the same
        // parallelism (an edited job, a token migration).
        let autoscaled = r.from != r.to;
        // A rescale that starts rolling back failed at its target: the backoff remembers it
        // (the roll back's own state targets the old parallelism).
        if t.rescale.as_ref().is_some_and(|n| n.rolling_back) && !r.rolling_back && autoscaled {
            record_failure(status, &r.to);
        }
        if let Some(next) = &t.rescale {
            status.phase = Phase::Rescaling;
            set_condition(
                status,
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
                if autoscaled {
                    status.backoff = None;
                }
                status.phase = Phase::Running;
                let note = t.event.as_deref().unwrap_or("");
                let scaling = ("Rescaled", note);
                set_outcome_conditions(
                    status,
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
                if autoscaled {
                    record_failure(status, &r.to);
                }
                let reason = format!("{reason}{}", hold(status));
                let scaling = ("SavepointFailed", reason.as_str());
                let degraded = (true, "SavepointFailed", reason.as_str());
                set_outcome_conditions(status, scaling, degraded, generation, &old);
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
                let why = format!(
                    "the rescale did not complete and the job runs at {} again (the RollingBack Event says why){}",
                    rescale::fmt_p(parallelism),
                    hold(status)
                );
                let degraded = (true, "RescaleRolledBack", why.as_str());
                set_outcome_conditions(status, scaling, degraded, generation, &old);
                "RolledBack".into()
            }
            Some(Outcome::Failed { reason }) => {
                warning = true;
                status.phase = Phase::Failed;
                let scaling = ("RescaleFailed", reason.as_str());
                let degraded = (true, "RescaleFailed", reason.as_str());
                set_outcome_conditions(status, scaling, degraded, generation, &old);
                "RescaleFailed".into()
            }
        };
        if let Some(outcome) = &t.outcome
            && let Some(entry) = savepoint_history::recorded(
                &status.savepoint_history,
                r,
                outcome,
                &obs.savepoint_dir,
            )
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
                Some(Outcome::Rescaled { .. }) => seconds_between(&r.started_at, now),
                _ => None,
            };
            let mut memory = ctx.memory.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(m) = memory.get_mut(&key(job)) {
                m.shed_applied = None;
                m.session.restarted(ctx.now_s());
                if let Some(s) = downtime_s {
                    tracing::info!(job = %key(job), downtime_s = s, "rescale downtime observed");
                    m.session.autoscaler_mut().observe_rescale_downtime(s);
                }
            }
        }
        // Persist first, act second.
        if job.status.as_ref() != Some(&*status) {
            write_status(ctx, job, status).await?;
        }
        if let Some(event) = &t.event {
            publish(ctx, job, warning, &reason, event.clone()).await;
        }
        Ok(())
    }

    async fn request_savepoint(
        &mut self,
        r: &RescaleStatus,
        id: &str,
    ) -> Result<SavepointRequest, Error> {
        let (job, ctx) = (self.job, self.ctx);
        match self
            .rt
            .authorized(|api| async move { api.request_stop_with_savepoint_as(false, id).await })
            .await
        {
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
                Ok(SavepointRequest::Accepted)
            }
            // Taken before an operator restart by an engine that has restarted since.
            Err(streamscale_controller::api::ApiError::Status {
                status: 409, body, ..
            }) if body.contains("already exists") => Ok(SavepointRequest::AlreadyExists),
            Err(e) => Err(Error::Engine(e.to_string())),
        }
    }

    async fn persist_existing_savepoint(&mut self, known: &RescaleStatus) -> Result<(), Error> {
        let (job, ctx) = (self.job, self.ctx);
        if self.status.rescale.is_some() {
            self.status.rescale = Some(known.clone());
        }
        write_status(ctx, job, &self.status).await?;
        let id = known.savepoint_id.as_deref().unwrap_or_default();
        publish(
            ctx,
            job,
            false,
            "Savepointing",
            format!("savepoint {id} already exists; restoring from it"),
        )
        .await;
        Ok(())
    }

    async fn deploy(
        &mut self,
        parallelism: &BTreeMap<String, u32>,
        restore: Option<&str>,
        _obs: &Observation,
    ) -> Result<(), Error> {
        match self
            .rt
            .deploy(parallelism, restore, self.status.restarts)
            .await
        {
            Ok(()) => {
                let said = self.status.conditions.len();
                self.status.conditions.retain(|c| c.reason != APPLY_REFUSED);
                if self.status.conditions.len() != said {
                    write_status(self.ctx, self.job, &self.status).await?;
                }
                Ok(())
            }
            // Said in the status; the rescale stays in its redeploy and applies again.
            Err(e) => {
                if let Some(fault) = e.spec_fault() {
                    say_refused(self.job, self.ctx, &mut self.status, &fault).await?;
                }
                Err(e.into())
            }
        }
    }
}
