//! The tick of `streamscale run`'s loop: wait for the interval (or the deadline, or a signal),
//! scrape the engine (restarting it when it died, [`supervise`](super::supervise)), turn two
//! scrapes into the interval's row and live line, and add the sample to the window. Says when
//! the loop ends.

use super::*;

/// What a tick leaves for the rest of the interval.
pub(super) enum Tick {
    /// A sample was taken at this run second and added to the window: decide on it.
    Sampled(f64),
    /// Nothing to decide on this interval (a scrape failed, the engine was restarted).
    Skip,
    /// The loop ends: a signal, the deadline, the job finished, or `failure` is set.
    End,
}

impl<R: EngineRuntime> Loop<'_, R> {
    /// One interval's collect phase (see the module docs).
    pub(super) async fn tick(
        &mut self,
        st: &mut LoopState,
        print: &mut (dyn FnMut(&str) + Send),
        warn: &mut (dyn FnMut(&str) + Send),
    ) -> Tick {
        tokio::select! {
            _ = st.ticker.tick() => {}
            () = tokio::time::sleep_until(st.deadline), if !st.deadline_seen => {
                st.deadline_seen = true;
            }
            sig = st.signals.recv() => {
                self.interrupted = Some(sig);
                print(&format!("interrupted ({}): stopping with a draining savepoint", sig.name()));
                st.stopping = true;
            }
        }
        // The sample is stamped when the page arrived (the time its figures are of); the
        // loop's own time is read after it, so a slow answer does not skew the rates.
        let started = st.started;
        let clock = || started.elapsed().as_secs_f64();
        let url = format!("{}/metrics", st.engine.base_url);
        // The engine's page is always there to read: never `Ok(None)`.
        let scraped = EngineScrape::new(&self.client, &url)
            .collect(&clock)
            .await
            .map(Option::unwrap_or_default);
        let now_s = clock();
        let mut cur = match scraped {
            Ok(m) => {
                st.scrape_failures = 0;
                m
            }
            Err(e) => {
                if let Some(exit) = self.executor.runtime().exited(&st.engine).await {
                    if st.stopping {
                        st.failure = Some(format!("engine failed at t={now_s:.0}s: {exit}"));
                        return Tick::End;
                    }
                    match self
                        .restart_engine(&st.engine, &exit, now_s, st.started, print, warn)
                        .await
                    {
                        Ok(restarted) => {
                            st.engine = restarted;
                            // Counters went back to the restore point: no interval spans it.
                            st.prev = None;
                            st.engine_changed = true;
                            st.scrape_failures = 0;
                            self.shed_before += self.shed_now;
                            self.shed_now = 0;
                            st.shed_applied = 0.0;
                            st.session.restarted(st.started.elapsed().as_secs_f64());
                            return Tick::Skip;
                        }
                        Err(f) => {
                            st.failure = Some(f);
                            return Tick::End;
                        }
                    }
                }
                if st.stopping {
                    return Tick::End;
                }
                st.scrape_failures += 1;
                tracing::warn!(
                    "scrape failed ({}/{MAX_SCRAPE_FAILURES}): {e}",
                    st.scrape_failures
                );
                if st.scrape_failures >= MAX_SCRAPE_FAILURES {
                    st.failure = Some(format!("engine unresponsive at t={now_s:.0}s: {e}"));
                    return Tick::End;
                }
                return Tick::Skip;
            }
        };
        // Subtasks missing from the scrape: an incomplete sample at the parallelism the
        // engine runs (the planner leaves it out), said when that starts or changes.
        let missing = cur.sample.mark_missing(&st.engine.parallelism);
        if missing != st.last_missing {
            if let Some(line) =
                progress::missing_subtasks_line(now_s, &missing, &st.engine.parallelism)
            {
                warn(&line);
            }
            st.last_missing.clone_from(&missing);
        }
        for src in cur.sources_without_backlog(&self.sources) {
            if !st.no_backlog_said.iter().any(|s| s == src) {
                warn(&progress::no_backlog_metric_line(src));
                st.no_backlog_said.push(src.to_string());
            }
        }
        // An interval with an incomplete end is not counted; the next one spans both.
        if let Some(p) = st.prev.as_ref().filter(|_| missing.is_empty()) {
            // Counters restart with a new engine: an interval spanning a restore says
            // nothing about service rates.
            if !st.engine_changed {
                st.capacity.observe(p, &cur, &self.sources);
            }
            let mut stats = IntervalStats::between(
                p,
                &cur,
                &self.sources,
                &st.engine.parallelism,
                self.job.trace_time(now_s - self.trace_origin_s),
                &st.capacity,
            );
            if st.engine_changed {
                stats.service_rate.clear();
            }
            if (self.slo_percentile - 0.99).abs() > 1e-12 {
                stats.slo_percentile = Some(self.slo_percentile);
                stats.slo_latency_s = cur
                    .latency
                    .quantile_since(Some(&p.latency), self.slo_percentile);
            }
            self.accounting.add_interval(&stats, self.slo_s);
            print(&progress::progress_line(
                &stats,
                &self.order,
                self.slo_s,
                self.job.trace_start(),
            ));
            self.rows.push(stats);
        }
        st.session.observe(now_s, cur.sample.clone());
        if missing.is_empty() {
            st.prev = Some(cur);
            st.engine_changed = false;
        }
        if st.stopping {
            return Tick::End;
        }
        if st.bounded
            && let Ok(job) = self.executor.runtime().job_status(&st.engine).await
            && job.state == "finished"
        {
            print(&progress::job_finished_line(now_s));
            return Tick::End;
        }
        if Instant::now() >= st.deadline {
            st.deadline_seen = true;
            // When the replay window is over, let the sources catch up first so the final
            // state covers the whole window (bounded by DRAIN_GRACE).
            let backlog = self.rows.last().map_or(0.0, |r| r.backlog);
            let trace_over = self
                .job
                .rate
                .as_ref()
                .and_then(RateFunction::wall_end)
                .is_some_and(|end| now_s >= end);
            let grace_left = Instant::now() < st.deadline + DRAIN_GRACE;
            if !(trace_over && backlog >= 1.0 && grace_left) {
                return Tick::End;
            }
            if !st.waiting_for_backlog {
                st.waiting_for_backlog = true;
                print(&format!(
                    "trace window over: waiting for the sources' backlog of {backlog:.0} records to drain"
                ));
            }
        }
        Tick::Sampled(now_s)
    }
}
