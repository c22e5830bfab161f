//! The apply phase of `streamscale run`'s loop: a decided rescale through the executor (the
//! rescale machine: stop with a savepoint, restore at the new parallelism, roll back from the
//! same savepoint), unless a backoff after failed rescales holds it; its lines and records; the
//! savepoints pruned after it.

use super::*;

/// Whether an engine runs after the apply phase.
pub(super) enum Applied {
    /// An engine runs (the new one, the old one, or one rolled back): the loop goes on.
    Running,
    /// The rescale left no engine running (`failure` says why): nothing left to stop.
    NoEngine,
}

impl<R: EngineRuntime> Loop<'_, R> {
    /// Applies `rescale`, decided at run second `now_s` (see the module docs).
    pub(super) async fn apply(
        &mut self,
        st: &mut LoopState,
        now_s: f64,
        rescale: Rescale,
        print: &mut (dyn FnMut(&str) + Send),
        warn: &mut (dyn FnMut(&str) + Send),
    ) -> Applied {
        let Rescale {
            decision,
            reason,
            change,
        } = rescale;
        if let Some(left) = st.backoff.wait_at(now_s) {
            if !st.backoff_said {
                st.backoff_said = true;
                print(&progress::rescale_backoff_hold_line(
                    now_s,
                    &change,
                    st.backoff.failures_of(&decision.parallelism),
                    st.backoff.failures(),
                    left,
                ));
            }
            return Applied::Running;
        }
        print(&progress::rescale_started_line(now_s, &change, &reason));
        let from = st.engine.parallelism.clone();
        let outcome = match self
            .executor
            .rescale(st.engine.clone(), &decision.parallelism)
            .await
        {
            Ok(o) => o,
            Err(ExecutorError::Unrecoverable { savepoint, error }) => {
                st.failure = Some(format!(
                    "rescale at t={now_s:.0}s left no engine running: {error}{}",
                    savepoint
                        .map(|s| format!(" (last savepoint: {})", s.path))
                        .unwrap_or_default()
                ));
                self.failed_rescales.push(RescaleRecord {
                    at_s: now_s,
                    from,
                    to: decision.parallelism.clone(),
                    reason,
                    downtime_s: st.started.elapsed().as_secs_f64() - now_s,
                    outcome: "unrecoverable".into(),
                    error: st.failure.clone(),
                    savepoint: None,
                });
                return Applied::NoEngine;
            }
            Err(ExecutorError::Runtime(e)) => {
                st.failure = Some(format!("rescale at t={now_s:.0}s failed: {e}"));
                return Applied::NoEngine;
            }
        };
        let done_s = st.started.elapsed().as_secs_f64();
        let downtime_s = outcome.downtime_s();
        let mut record = RescaleRecord {
            at_s: now_s,
            from,
            to: decision.parallelism.clone(),
            reason,
            downtime_s,
            outcome: String::new(),
            error: None,
            savepoint: None,
        };
        match &outcome {
            RescaleOutcome::Rescaled { savepoint, .. } => {
                st.backoff.succeeded();
                print(&progress::rescale_done_line(done_s, &change, downtime_s));
                st.session
                    .autoscaler_mut()
                    .observe_rescale_downtime(downtime_s);
                record.outcome = "rescaled".into();
                record.savepoint = Some(savepoint.path.clone());
                self.rescales.push(record);
                self.prune_savepoints(&savepoint.path, warn);
            }
            RescaleOutcome::SavepointFailed { error, .. } => {
                print(&progress::rescale_failed_line(
                    done_s,
                    &change,
                    "savepoint",
                    error,
                    downtime_s,
                ));
                record.outcome = "savepoint_failed".into();
                record.error = Some(error.clone());
                self.failed_rescales.push(record);
            }
            RescaleOutcome::RestoreFailed {
                savepoint, error, ..
            } => {
                print(&progress::rescale_failed_line(
                    done_s, &change, "restore", error, downtime_s,
                ));
                record.outcome = "restore_failed".into();
                record.error = Some(error.clone());
                record.savepoint = Some(savepoint.path.clone());
                self.failed_rescales.push(record);
                self.prune_savepoints(&savepoint.path, warn);
            }
        }
        if !matches!(outcome, RescaleOutcome::Rescaled { .. }) {
            let wait = st.backoff.failed(done_s, &decision.parallelism);
            st.backoff_said = false;
            print(&progress::rescale_backoff_line(
                done_s,
                &change,
                st.backoff.failures(),
                wait,
            ));
        }
        st.engine = outcome.engine().clone();
        // A new engine starts without shedding; its counter starts at 0.
        self.shed_before += self.shed_now;
        self.shed_now = 0;
        st.shed_applied = 0.0;
        st.engine_changed = true;
        st.session.restarted(done_s);
        Applied::Running
    }

    /// Removes the savepoints beyond the newest [`RunOptions::keep_savepoints`], never
    /// `running_from` (the savepoint the running engine was restored from, or the final one).
    /// A failure is reported as a warning line: the run goes on, nothing else is removed.
    pub(super) fn prune_savepoints(
        &mut self,
        running_from: &str,
        warn: &mut (dyn FnMut(&str) + Send),
    ) {
        match savepoint_history::prune(
            &self.savepoints_dir,
            &self.job.spec.name,
            self.opts.keep_savepoints,
            Path::new(running_from),
        ) {
            Ok(removed) => self.savepoints_removed += removed.len(),
            Err(e) => warn(&format!("warning: {e}")),
        }
    }
}
