//! One interval of a job: collect its counters, decide, and hand a rescale to `apply` (realize).

use super::*;

impl JobSession {
    /// Ends the time the job could not be read, if it could not (a line says how long).
    fn readable_again(&mut self, now_s: f64, jid: &str, print: &mut dyn FnMut(&str)) {
        if let Some(since) = self.unreadable_since.take() {
            self.report.unreadable_seconds += now_s - since;
            print(&format!(
                "{}: the cluster answers again, after {:.0} s",
                short(jid),
                now_s - since
            ));
        }
    }

    /// One interval: collect, decide, apply.
    pub(super) async fn tick(
        &mut self,
        rest: &FlinkRest,
        opts: &FlinkOptions,
        now_s: f64,
        slots_available: Option<u32>,
        print: &mut dyn FnMut(&str),
    ) {
        let jid = self.topology.lock().await.job_id.clone();
        let job = match rest.job(&jid).await {
            Ok(job) => job,
            Err(FlinkError::JobNotFound { .. }) => {
                // The cluster answers (it does not know the job): not unreadable any more.
                self.readable_again(now_s, &jid, print);
                self.end(format!("job {jid} is gone from the cluster"), print);
                return;
            }
            Err(e) => {
                // Said once; the next line is when the job can be read again.
                if self.unreadable_since.is_none() {
                    self.unreadable_since = Some(now_s);
                    print(&format!(
                        "{}: cannot read the job: {e} (trying again every {} s; a line says when it answers)",
                        short(&jid),
                        opts.interval_s
                    ));
                }
                return;
            }
        };
        self.readable_again(now_s, &jid, print);
        if matches!(job.state.as_str(), "FINISHED" | "CANCELED" | "FAILED") {
            self.end(format!("job {jid} ended ({})", job.state), print);
            return;
        }
        let mut topo = {
            let mut topo = self.topology.lock().await;
            if !topo.same_graph(&job) {
                match FlinkTopology::from_job(&job, &opts.settings, &opts.bounds) {
                    Ok(t) => {
                        print(&format!(
                            "{}: the job graph changed; reading it again",
                            short(&jid)
                        ));
                        print(&t.describe());
                        self.report.vertices.clone_from(&t.vertices);
                        *topo = t;
                        self.session.clear_window();
                    }
                    Err(e) => {
                        print(&format!("{}: {e}", short(&jid)));
                        return;
                    }
                }
            }
            topo.clone()
        };
        let mut source = FlinkRestSource {
            collector: &mut self.collector,
            rest,
            job: &job,
            topo: &topo,
            previous: self.session.window().back(),
        };
        let sample = match source.collect(&|| now_s).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                // Said once; a line says when every vertex runs again.
                if self.not_running_since.is_none() {
                    print(&format!(
                        "{}: job {} (not every vertex RUNNING): waiting",
                        short(&jid),
                        job.state
                    ));
                    self.not_running_since = Some(now_s);
                }
                return;
            }
            Err(e) => {
                print(&format!("{}: cannot read metrics: {e}", short(&jid)));
                return;
            }
        };
        if self
            .session
            .window()
            .back()
            .is_some_and(|last| metrics::no_new_measurement(last, &sample.sample))
        {
            // Flink has not refreshed its metrics since the last scrape, or the sample is dated
            // on top of the last one (no time to take rates over).
            return;
        }
        let parallelism_changed = self.session.window().back().is_some_and(|last| {
            last.operators
                .iter()
                .any(|(n, s)| sample.sample.operators.get(n).map(Vec::len) != Some(s.len()))
        });
        if let Some(since) = self.not_running_since.take() {
            // A failover (or any restart) replays from the latest checkpoint: its first windows
            // are catch-up, not the job's load. Decided from after the stabilization period.
            print(&format!(
                "{}: every vertex RUNNING again after {:.0} s: a restart; measuring again",
                short(&jid),
                now_s - since
            ));
            self.session.restarted(now_s);
        }
        // What the job runs now (a change made outside streamscale included): a savepoint
        // rescale's rollback goes back to it.
        self.handle.parallelism = topo.by_name(&job.parallelism_by_id());
        if parallelism_changed {
            // Rescaled from outside (the user, Flink's own scheduler): a new deployment.
            print(&format!(
                "{}: parallelism changed outside streamscale; measuring again",
                short(&jid)
            ));
            self.session.restarted(now_s);
        }
        if sample.notes != self.last_notes {
            for n in &sample.notes {
                print(&format!("{}: {n}", short(&jid)));
            }
            // A source whose pendingRecords metric was missing (a source registers it once
            // it runs) and is there now: the earlier line no longer holds.
            for vertex in metrics::sources_reporting_again(&self.last_notes, &sample.notes) {
                print(&format!(
                    "{}: {vertex}: reports pendingRecords now: its backlog is read from it",
                    short(&jid)
                ));
            }
            self.last_notes.clone_from(&sample.notes);
        }
        self.session.observe(now_s, sample.sample);
        self.live_line(now_s, opts.interval_s, &topo, print);
        let limit = slots_available.map(|free| slots::limit(free, &job));
        if let Some(limit) = limit {
            slots::cap(&mut topo.spec, limit);
        }
        let verdict = self.session.decide(now_s, &topo.spec);
        self.save_state().await;
        match verdict {
            Verdict::Hold {
                reason,
                recommendation,
            } => {
                // A plan held at the slot limit says so.
                let note = limit.zip(recommendation.as_ref()).and_then(|(l, d)| {
                    slots::held_note(d, l, "the cluster's free slots plus the job's")
                });
                let reason = match note {
                    Some(n) => format!("{reason}; {n}"),
                    None => reason,
                };
                // Once per guard and set of operators it holds up or down.
                let key = crate::progress::hold_key(&reason, recommendation.as_ref());
                let due_s = self.session.autoscaler().hold_due_s();
                if self.last_hold.news(key, due_s, opts.interval_s.max(1.0)) {
                    print(&format!("{}: HOLD {reason}", short(&jid)));
                }
            }
            Verdict::Rescale(decision) => {
                self.last_hold.clear();
                let from: BTreeMap<String, u32> = decision
                    .current
                    .iter()
                    .map(|(k, v)| (k.to_string(), *v))
                    .collect();
                let to = decision.parallelism.clone();
                let reason = crate::run::rescale_reason(&decision);
                if let Some(left) = self.backoff.wait_at(now_s) {
                    print(&format!(
                        "{}: RESCALE HELD: backing off for {:.0} s more after {} failed attempt(s)",
                        short(&jid),
                        left,
                        self.backoff.failures()
                    ));
                    return;
                }
                let changes = describe(&from, &to);
                let cannot = cannot_apply(opts, &job);
                if opts.mode == Mode::Recommend || cannot.is_some() {
                    print(&format!(
                        "{}: RECOMMEND {changes} ({reason}){}",
                        short(&jid),
                        cannot
                            .as_deref()
                            .map(|c| format!("; not applied: {c}"))
                            .unwrap_or_default()
                    ));
                    self.report.rescales.push(RescaleRecord {
                        at_seconds: now_s,
                        from,
                        to,
                        path: "none".into(),
                        outcome: "recommended".into(),
                        downtime_seconds: None,
                        reason,
                        savepoint: None,
                        error: cannot,
                    });
                    // Recommend mode never changes the job: forget the plan's pending state.
                    self.session.autoscaler_mut().restarted(now_s);
                    return;
                }
                print(&format!("{}: RESCALE {changes} ({reason})", short(&jid)));
                let record = self
                    .apply(rest, opts, now_s, &from, &to, reason, &topo, &job)
                    .await;
                match record.outcome.as_str() {
                    "rescaled" => {
                        self.backoff.succeeded();
                        if let Some(d) = record.downtime_seconds {
                            self.session.autoscaler_mut().observe_rescale_downtime(d);
                        }
                        let now_id = self.topology.lock().await.job_id.clone();
                        print(&format!(
                            "{}: rescaled by {} in {:.1} s{}{}",
                            short(&jid),
                            record.path,
                            record.downtime_seconds.unwrap_or(0.0),
                            record
                                .savepoint
                                .as_ref()
                                .map(|s| format!(" (savepoint {s})"))
                                .unwrap_or_default(),
                            if now_id == jid {
                                String::new()
                            } else {
                                format!("; the job is now {now_id}")
                            }
                        ));
                        self.report.final_parallelism.clone_from(&to);
                    }
                    "jobEnded" => {
                        print(&format!(
                            "{}: RESCALE jobEnded: {}",
                            short(&jid),
                            record.error.clone().unwrap_or_default()
                        ));
                        self.end(
                            record
                                .error
                                .clone()
                                .unwrap_or_else(|| "the job ended during the rescale".into()),
                            print,
                        );
                    }
                    "failed" => {
                        print(&format!(
                            "{}: RESCALE FAILED and the job is not running: {}",
                            short(&jid),
                            record.error.clone().unwrap_or_default()
                        ));
                        self.end("rescale failed; the job is not running".into(), print);
                    }
                    other => {
                        let wait = self.backoff.failed(now_s, &to);
                        print(&format!(
                            "{}: RESCALE {other}: {}; the job stays at the old parallelism; BACKOFF {wait:.0} s",
                            short(&jid),
                            record.error.clone().unwrap_or_default()
                        ));
                    }
                }
                let now = now_s + record.downtime_seconds.unwrap_or(0.0);
                self.session.restarted(now);
                let job_id = self.topology.lock().await.job_id.clone();
                if job_id != self.report.job_id {
                    // Resubmitted from a savepoint: the learned state follows the new id.
                    if let Err(e) = self.session.store_mut().move_to(&flink_state_file(&job_id)) {
                        print(&format!("{}: warning: {e}", short(&job_id)));
                    }
                    self.session.forget_saved();
                }
                self.report.job_id = job_id;
                self.report.rescales.push(record);
            }
        }
    }
}

/// Why a decision for `job` cannot be applied in mode `auto`, when it cannot: the job runs a
/// scheduler that cannot rescale in place and nothing says how to resubmit it from a savepoint.
/// Its decisions are then recommendations (no attempt, no backoff).
pub(super) fn cannot_apply(opts: &FlinkOptions, job: &JobDetails) -> Option<String> {
    (opts.resubmit.is_none()
        && opts.rescale == RescalePath::Auto
        && job.adaptive_scheduler() == Some(false))
    .then(|| {
        format!(
            "the job runs the {} scheduler, which cannot rescale in place, and no --resubmit-jar/--resubmit-command says how to resubmit it from a savepoint",
            job.scheduler_type.as_deref().unwrap_or("unknown")
        )
    })
}
