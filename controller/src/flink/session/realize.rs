//! Realizing a decision: in place (the adaptive scheduler's resource requirements) or by
//! savepoint and resubmission, recorded as a [`RescaleRecord`].

use super::*;

impl JobSession {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn apply(
        &mut self,
        rest: &FlinkRest,
        opts: &FlinkOptions,
        now_s: f64,
        from: &BTreeMap<String, u32>,
        to: &BTreeMap<String, u32>,
        reason: String,
        topo: &FlinkTopology,
        job: &JobDetails,
    ) -> RescaleRecord {
        let jid = topo.job_id.clone();
        let mut record = RescaleRecord {
            at_seconds: now_s,
            from: from.clone(),
            to: to.clone(),
            path: "inPlace".into(),
            outcome: "failed".into(),
            downtime_seconds: None,
            reason,
            savepoint: None,
            error: None,
        };
        let timeout = Duration::from_secs_f64(opts.rescale_timeout_s);
        // `auto` rescales in place unless the job says it runs another scheduler than the
        // adaptive one (FLIP-291's resource requirements need it).
        let in_place = match opts.rescale {
            RescalePath::InPlace => true,
            RescalePath::Savepoint => false,
            RescalePath::Auto => job.adaptive_scheduler() != Some(false),
        };
        if in_place {
            match in_place::rescale(rest, &jid, &topo.by_id(to), &topo.by_id(from), timeout).await {
                Ok(InPlaceOutcome::Rescaled { seconds }) => {
                    record.outcome = "rescaled".into();
                    record.downtime_seconds = Some(seconds);
                    self.handle.parallelism.clone_from(to);
                    return record;
                }
                Ok(InPlaceOutcome::TimedOut {
                    seen,
                    seconds,
                    last_error,
                    put_back_error,
                }) => {
                    record.outcome = "timedOut".into();
                    record.downtime_seconds = Some(seconds);
                    let mut error = format!(
                        "not at the new parallelism within {seconds:.0} s (seen {})",
                        describe_map(&topo.by_name(&seen))
                    );
                    if let Some(e) = last_error {
                        error.push_str(&format!("; the job could not be read: {e}"));
                    }
                    match put_back_error {
                        Some(e) => error.push_str(&format!(
                            "; the previous requirements could not be put back ({e}): the job may still move to the new parallelism"
                        )),
                        None => error.push_str("; the previous requirements were put back"),
                    }
                    record.error = Some(error);
                    return record;
                }
                Ok(InPlaceOutcome::JobEnded { state, seconds }) => {
                    record.outcome = "jobEnded".into();
                    record.downtime_seconds = Some(seconds);
                    record.error = Some(format!("the job ended ({state}) during the rescale"));
                    return record;
                }
                // Refused (an answer 4xx: nothing changed): `auto` goes on by savepoint when it
                // can. Not on a timeout or a 5xx, after which the request may have been applied.
                Err(e)
                    if opts.rescale == RescalePath::Auto
                        && opts.resubmit.is_some()
                        && matches!(
                            e,
                            FlinkError::Status {
                                status: 400..=499,
                                ..
                            }
                        ) =>
                {
                    tracing::warn!(
                        "in-place rescale of job {jid} refused ({e}); rescaling by savepoint + resubmit"
                    );
                    record.reason.push_str(&format!(
                        "; in place refused ({e}), by savepoint + resubmit"
                    ));
                }
                Err(e) => {
                    record.outcome = "refused".into();
                    record.error = Some(e.to_string());
                    return record;
                }
            }
        }
        record.path = "savepoint".into();
        if opts.resubmit.is_none() {
            record.outcome = "notApplied".into();
            record.error = Some(format!(
                "the job runs the {} scheduler, which cannot rescale in place, and no --resubmit-jar/--resubmit-command says how to resubmit it from a savepoint",
                job.scheduler_type.as_deref().unwrap_or("unknown")
            ));
            return record;
        }
        // An uploaded jar a restarted JobManager forgot: the job is not stopped for it.
        if let Some(Resubmit::Jar(jar)) = &opts.resubmit
            && let Ok(ids) = rest.jar_ids().await
            && !ids.contains(&jar.jar_id)
        {
            record.outcome = "notApplied".into();
            record.error = Some(format!(
                "jar {} is no longer on the cluster (a restarted JobManager forgets uploaded jars unless web.upload.dir keeps them); the job was not stopped",
                jar.jar_id
            ));
            return record;
        }
        let executor = Executor::new(&self.runtime, Path::new(""))
            .with_running_timeout(Duration::from_secs(5));
        match executor.rescale(self.handle.clone(), to).await {
            Ok(outcome) => {
                record.downtime_seconds = Some(outcome.downtime_s());
                match outcome {
                    RescaleOutcome::Rescaled {
                        engine, savepoint, ..
                    } => {
                        record.outcome = "rescaled".into();
                        record.savepoint = Some(savepoint.path);
                        self.handle = engine;
                    }
                    RescaleOutcome::SavepointFailed { engine, error, .. } => {
                        record.outcome = "savepointFailed".into();
                        record.error = Some(error);
                        self.handle = engine;
                    }
                    RescaleOutcome::RestoreFailed {
                        engine,
                        savepoint,
                        error,
                        ..
                    } => {
                        record.outcome = "restoreFailed".into();
                        record.error = Some(error);
                        record.savepoint = Some(savepoint.path);
                        self.handle = engine;
                    }
                }
            }
            Err(e) => {
                record.outcome = "failed".into();
                record.error = Some(e.to_string());
            }
        }
        record
    }
}
