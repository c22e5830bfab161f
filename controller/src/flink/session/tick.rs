//! One interval of a job: collect its counters, decide, and hand a rescale to `apply` (realize).

use super::*;

impl JobSession {
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
        if let Some(since) = self.unreadable_since.take() {
            self.report.unreadable_seconds += now_s - since;
            print(&format!(
                "{}: the job can be read again, after {:.0} s",
                short(&jid),
                now_s - since
            ));
        }
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
                print(&format!(
                    "{}: job {} (not every vertex RUNNING): waiting",
                    short(&jid),
                    job.state
                ));
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
            .is_some_and(|last| metrics::same_counters(last, &sample.sample))
        {
            // Flink has not refreshed its metrics since the last scrape.
            return;
        }
        let parallelism_changed = self.session.window().back().is_some_and(|last| {
            last.operators
                .iter()
                .any(|(n, s)| sample.sample.operators.get(n).map(Vec::len) != Some(s.len()))
        });
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
                if opts.mode == Mode::Recommend {
                    print(&format!("{}: RECOMMEND {changes} ({reason})", short(&jid)));
                    self.report.rescales.push(RescaleRecord {
                        at_seconds: now_s,
                        from,
                        to,
                        path: "none".into(),
                        outcome: "recommended".into(),
                        downtime_seconds: None,
                        reason,
                        savepoint: None,
                        error: None,
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
                        print(&format!(
                            "{}: rescaled by {} in {:.1} s{}",
                            short(&jid),
                            record.path,
                            record.downtime_seconds.unwrap_or(0.0),
                            record
                                .savepoint
                                .as_ref()
                                .map(|s| format!(" (savepoint {s})"))
                                .unwrap_or_default()
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
                            "{}: RESCALE {other}: {}; the job runs at the old parallelism; BACKOFF {wait:.0} s",
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
