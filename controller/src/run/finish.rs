//! The finish phase of `streamscale run`'s loop: the final stop (the job left to finish when its
//! bounded sources are done, else a draining savepoint; a second signal kills the engine and the
//! savepoint it was taking is verified), then the summary, the report files and the timeline
//! plot.

use super::*;

impl<R: EngineRuntime> Loop<'_, R> {
    /// Stops the engine the loop ended with (see the module docs) and writes the report.
    ///
    /// # Errors
    /// [`RunError`] when the report cannot be written.
    pub(super) async fn stop(
        &mut self,
        mut st: LoopState,
        print: &mut (dyn FnMut(&str) + Send),
        warn: &mut (dyn FnMut(&str) + Send),
    ) -> Result<RunOutcome, RunError> {
        let final_parallelism = st.engine.parallelism.clone();
        if st.shed_applied > 0.0
            && let Ok(n) = self.engine_api(&st.engine).shed().await
        {
            self.shed_now = n;
        }
        if st.failure.is_some() {
            let _ = self.executor.runtime().kill(&st.engine).await;
            return self
                .finish(
                    None,
                    st.started,
                    st.failure,
                    None,
                    &st.initial,
                    &final_parallelism,
                )
                .await;
        }
        // A bounded source may have finished the job already: nothing to stop, read the totals.
        // Once every source reached its record count the engine injects no barrier (the final
        // savepoint would fail and the records in flight go unaccounted): wait for the graph
        // to drain instead (at most DRAIN_GRACE; a signal ends the wait).
        let total_count = total_source_count(&self.job.spec);
        let wait_until = Instant::now() + DRAIN_GRACE;
        let mut said_waiting = false;
        let finished = loop {
            let Ok(job) = self.executor.runtime().job_status(&st.engine).await else {
                break None;
            };
            if job.state == "finished" {
                break Some(job);
            }
            let draining = job.state == "running"
                && total_count.is_some_and(|total| job.records_emitted >= total);
            if !draining || Instant::now() >= wait_until {
                break None;
            }
            if !said_waiting {
                said_waiting = true;
                print(
                    "every source reached its record count: waiting for the job to finish (no savepoint can be taken now)",
                );
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(100)) => {}
                sig = st.signals.recv() => {
                    if self.interrupted.is_none() {
                        self.interrupted = Some(sig);
                        print(&format!("interrupted ({}): stopping with a draining savepoint", sig.name()));
                    }
                    break None;
                }
            }
        };
        if let Some(job) = finished {
            if said_waiting {
                print(&progress::job_finished_line(
                    st.started.elapsed().as_secs_f64(),
                ));
            }
            let _ = self.executor.runtime().kill(&st.engine).await;
            let totals = RecordTotals {
                records_emitted: job.records_emitted,
                records_accounted: job.records_accounted,
                records_filtered: job.records_filtered,
            };
            return self
                .finish(
                    Some(totals),
                    st.started,
                    None,
                    None,
                    &st.initial,
                    &final_parallelism,
                )
                .await;
        }
        // After a signal the `interrupted (…)` line already said so.
        if self.interrupted.is_none() {
            print("stopping with a draining savepoint…");
        }
        // The final savepoint's directory is the engine's to name: the ones there before the
        // stop tell it apart if a second signal kills the engine before it answers (`None`
        // when they cannot be listed: then no savepoint can be told to be the final one).
        let before: Option<Vec<PathBuf>> =
            savepoint_history::completed(&self.savepoints_dir, &self.job.spec.name).ok();
        let stopped = tokio::select! {
            r = self.executor.stop(&st.engine, true) => r,
            sig = st.signals.recv() => {
                print(&format!(
                    "interrupted again ({}): killing the engine during its final savepoint",
                    sig.name()
                ));
                self.interrupted = Some(sig);
                let _ = self.executor.runtime().kill(&st.engine).await;
                // As Flink's stop-with-savepoint: a savepoint that completed is a savepoint,
                // whether or not its stop was acknowledged.
                let (final_savepoint, failure) = match self.completed_after_kill(before.as_deref()).await {
                    FinalAfterKill::Completed(path) => {
                        print(&format!(
                            "final savepoint {path} had completed before the engine was killed (verified): restore from it"
                        ));
                        let failure = format!(
                            "interrupted twice ({}): the engine was killed after its final savepoint {path} completed; the record totals were not read",
                            sig.name()
                        );
                        (Some(path), failure)
                    }
                    FinalAfterKill::Invalid(why) => (None, format!(
                        "interrupted twice ({}): the engine was killed during the final savepoint, which is not usable: {why}{}",
                        sig.name(),
                        restore_hint(before.as_deref())
                    )),
                    FinalAfterKill::None => (None, format!(
                        "interrupted twice ({}): the engine was killed during the final savepoint, before it completed{}",
                        sig.name(),
                        restore_hint(before.as_deref())
                    )),
                };
                for abandoned in savepoint_history::remove_abandoned_in_progress(&self.savepoints_dir) {
                    print(&format!(
                        "removed {}: the killed engine's unfinished savepoint",
                        abandoned.display()
                    ));
                }
                return self
                    .finish(None, st.started, Some(failure), final_savepoint, &st.initial, &final_parallelism)
                    .await;
            }
        };
        match stopped {
            Ok(stop) => {
                let totals = stop.final_job.as_ref().map(|j| RecordTotals {
                    records_emitted: j.records_emitted,
                    records_accounted: j.records_accounted,
                    records_filtered: j.records_filtered,
                });
                if totals.is_none() {
                    st.failure =
                        Some("the engine exited before its final totals could be read".into());
                }
                self.prune_savepoints(&stop.savepoint.path, warn);
                if self.savepoints_removed > 0 {
                    print(&format!(
                        "savepoints: {} older one(s) of job `{}` removed from {}, the newest {} kept (--keep-savepoints)",
                        self.savepoints_removed,
                        self.job.spec.name,
                        self.savepoints_dir.display(),
                        self.opts.keep_savepoints
                    ));
                }
                self.finish(
                    totals,
                    st.started,
                    st.failure,
                    Some(stop.savepoint.path),
                    &st.initial,
                    &final_parallelism,
                )
                .await
            }
            Err(e) => {
                let _ = self.executor.runtime().kill(&st.engine).await;
                st.failure = Some(format!("final stop-with-savepoint failed: {e}"));
                self.finish(
                    None,
                    st.started,
                    st.failure,
                    None,
                    &st.initial,
                    &final_parallelism,
                )
                .await
            }
        }
    }

    /// After the engine was killed during its final stop: the savepoint it was taking, if it
    /// completed. Candidates are the job's completed savepoints
    /// ([`savepoint_history::completed`], newest first) that were not there before the stop
    /// (`before`; none when that could not be listed); each is verified in full as a restore
    /// would ([`streamscale_engine::savepoint::Savepoint::read`]: metadata, fingerprint, every
    /// state file's size and CRC-32), so a directory with `_metadata.json` but damaged state
    /// does not count.
    async fn completed_after_kill(&self, before: Option<&[PathBuf]>) -> FinalAfterKill {
        let candidates: Vec<PathBuf> = match before {
            Some(before) => savepoint_history::completed(&self.savepoints_dir, &self.job.spec.name)
                .unwrap_or_default()
                .into_iter()
                .filter(|path| !before.contains(path))
                .collect(),
            None => Vec::new(),
        };
        let mut invalid = None;
        for dir in candidates {
            let spec = self.job.spec.clone();
            let checked = dir.clone();
            let read = tokio::task::spawn_blocking(move || {
                streamscale_engine::savepoint::Savepoint::read(&checked, &spec).map(drop)
            })
            .await;
            match read {
                Ok(Ok(())) => return FinalAfterKill::Completed(dir.display().to_string()),
                Ok(Err(e)) => invalid = invalid.or(Some(e.to_string())),
                Err(e) => invalid = invalid.or(Some(format!("{}: {e}", dir.display()))),
            }
        }
        invalid.map_or(FinalAfterKill::None, FinalAfterKill::Invalid)
    }

    /// Writes the report files into `dir`, each whole or not at all, `summary.json` last (a
    /// directory with one holds a complete report). A chart that cannot be drawn is a warning.
    fn write_report(&self, dir: &Path, summary: &Summary) -> Result<(), ReportError> {
        report::write_timeline(dir, &self.rows, &self.order)?;
        report::write_service_rates(dir, &self.rows, &self.order)?;
        if let Err(e) = report::replace_file(&dir.join("timeline.png"), |tmp| {
            plot_timeline(tmp, &self.rows, &self.order, self.slo_s)
                .map_err(|e| std::io::Error::other(e.to_string()))
        }) {
            tracing::warn!("{e}");
        }
        report::write_summary(dir, summary)?;
        Ok(())
    }

    /// Writes the report of the run that started at `started` (`summary.json` last) and returns
    /// the outcome. Without a `failure` the time from the last scrape to now counts in the cost
    /// at `final_parallelism`.
    ///
    /// # Errors
    /// [`RunError::ReportAfterFailure`] (naming the failure) or another [`RunError`] when the
    /// report cannot be written.
    pub(super) async fn finish(
        &mut self,
        totals: Option<RecordTotals>,
        started: Instant,
        failure: Option<String>,
        final_savepoint: Option<String>,
        initial: &BTreeMap<String, u32>,
        final_parallelism: &BTreeMap<String, u32>,
    ) -> Result<RunOutcome, RunError> {
        let dir = &self.opts.report_dir;
        let duration_s = started.elapsed().as_secs_f64();
        if failure.is_none() {
            // From the last scrape to the end of the final stop the engine still held its
            // subtasks: counted in the cost (no latency was measured then).
            let last_s = self.rows.last().map_or(0.0, |r| r.t_s);
            self.accounting
                .add_cost(duration_s - last_s, final_parallelism.values().sum());
        }
        let summary = Summary {
            job: self.job.spec.name.clone(),
            job_file: self.job.path.display().to_string(),
            duration_s,
            interval_s: self.opts.interval_s,
            window_s: self.opts.window_s,
            guard_window_s: self.opts.guard_window_s(),
            stabilization_s: self.opts.stabilization_s,
            scale_down_delay_s: self.opts.scale_down_delay_s,
            slo_s: self.slo_s,
            latency_percentile: self.slo_percentile,
            records_emitted: totals.map(|t| t.records_emitted),
            records_accounted: totals.map(|t| t.records_accounted),
            records_filtered: totals.map(|t| t.records_filtered),
            records_lost: totals.map(|t| t.lost()),
            records_shed: self.shed_before + self.shed_now,
            parallelism_seconds: self.accounting.parallelism_seconds,
            mean_parallelism: self.accounting.mean_parallelism(),
            slo_violation_seconds: self.accounting.slo_violation_seconds,
            no_output_seconds: self.accounting.no_output_seconds,
            source_backlog_at_end: self.rows.last().map_or(0.0, |r| r.backlog),
            initial_parallelism: initial.clone(),
            final_parallelism: final_parallelism.clone(),
            downtime_s: self
                .rescales
                .iter()
                .chain(&self.failed_rescales)
                .map(|r| r.downtime_s)
                .fold(0.0, |a, b| a + b),
            restarts: self.restarts.clone(),
            recovery_s: self.restarts.iter().map(|r| r.recovery_s).sum(),
            rescales: self.rescales.clone(),
            failed_rescales: self.failed_rescales.clone(),
            recommendations: self.recommendations.clone(),
            final_savepoint,
            failure,
            interrupted: self.interrupted.is_some(),
        };
        if let Err(source) = self.write_report(dir, &summary) {
            // Do not let the report's error hide why the run failed.
            return Err(match summary.failure {
                Some(failure) => RunError::ReportAfterFailure { failure, source },
                None => source.into(),
            });
        }
        Ok(RunOutcome {
            summary,
            report_dir: dir.clone(),
            interrupted: self.interrupted,
        })
    }
}

/// What became of the final savepoint when a second signal killed the engine during it.
enum FinalAfterKill {
    /// It completed and verifies: its directory.
    Completed(String),
    /// A new savepoint directory is there but does not verify: why.
    Invalid(String),
    /// No new savepoint directory (the engine writes into a hidden temporary one and renames
    /// it into place only once complete).
    None,
}

/// The sum of the sources' record `count`s when every source has one (the job then finishes
/// on its own once its sources emitted that many records in all), else `None`.
fn total_source_count(spec: &JobSpec) -> Option<u64> {
    spec.operators
        .iter()
        .filter_map(|o| match &o.kind {
            OperatorKind::Source { count, .. } => Some(*count),
            _ => None,
        })
        .try_fold(0u64, |sum, count| count.map(|c| sum.saturating_add(c)))
}
