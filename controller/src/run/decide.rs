//! The decide phase of `streamscale run`'s loop: the job's autoscaling session (window, guarded
//! autoscaler, learned state in the report directory), its verdict on each interval, and the
//! lines that explain it (shedding, SLO unattainable, operators held at a limit, holds,
//! recommendations).

use super::*;

/// A rescale the autoscaler decided, for the apply phase.
pub(super) struct Rescale {
    /// The decision (its `parallelism` differs from the engine's).
    pub(super) decision: crate::model::Decision,
    /// Why ([`rescale_reason`]).
    pub(super) reason: String,
    /// The change as printed ([`progress::format_change`]).
    pub(super) change: String,
}

impl<R: EngineRuntime> Loop<'_, R> {
    /// The job's autoscaling session, with what earlier runs in the report directory learned
    /// about the job (said in a line each; a state that cannot be used is a warning).
    pub(super) async fn open_session(
        &self,
        print: &mut (dyn FnMut(&str) + Send),
        warn: &mut (dyn FnMut(&str) + Send),
    ) -> AutoscaleSession<FileStateStore> {
        // The engine's rates are exact counter deltas from the first second after a restore
        // (no moving averages to refill, unlike Flink's 60 s meters), so a short
        // stabilization and a history of three intervals suffice.
        let settings = GuardSettings {
            window_seconds: self.opts.guard_window_s(),
            stabilization_seconds: self.opts.stabilization_s,
            scale_down_delay_seconds: self.opts.scale_down_delay_s,
            planner: crate::model::PlannerSettings {
                latency_percentile: self.opts.latency_percentile,
                ..crate::model::PlannerSettings::default()
            },
            ..GuardSettings::default()
        };
        // What was learned about the job in earlier runs (the forecast's rate history, the
        // operators' scalability) survives runs: kept in the report directory on the Unix-time
        // clock, moved to this run's clock (seconds since `started`).
        let store = FileStateStore::new(&self.opts.report_dir, &self.job.spec.name);
        // Another job's learned state in a shared report directory is set aside, never
        // overwritten, and this job's own is brought back.
        let (notes, warnings) = store.claim();
        notes.iter().for_each(|n| print(n));
        warnings.iter().for_each(|w| warn(&format!("warning: {w}")));
        // Warm-up metrics are not representative: the first start counts as a restart. The
        // next run starts at the job's initial parallelism: no baseline to keep for it.
        let mut session = AutoscaleSession::new(
            &self.job.spec.name,
            settings,
            0.0,
            WindowRule::Horizon(self.opts.window_s),
            store,
            Keep {
                baseline: false,
                downtime: false,
            },
            unix_now_s(),
        );
        match session.load().await {
            Ok(Some(s)) => {
                let store = session.store();
                let from = |legacy: &str| {
                    store
                        .migrated_from()
                        .iter()
                        .find(|p| p.ends_with(legacy))
                        .map_or_else(|| store.location(), |p| p.display().to_string())
                };
                if crate::model::forecast::ForecastConfig::of(&self.job.spec).is_some()
                    && let Some(h) = &s.history
                {
                    print(&format!(
                        "forecast: {} bins of rate history from {}",
                        h.bins.len(),
                        from(LEGACY_HISTORY_FILE)
                    ));
                }
                if !(s.scalability.factors.is_empty() && s.scalability.ineffective.is_empty()) {
                    print(&format!(
                        "learned: scalability factors of {} operator(s) from {}",
                        s.scalability.factors.len(),
                        from(LEGACY_LEARNED_FILE)
                    ));
                }
                // State read from an earlier version's files is written in the new file.
                if !store.migrated_from().is_empty() {
                    session.forget_saved();
                }
            }
            Ok(None) => {}
            Err(e) => warn(&format!("warning: {e}")),
        }
        session
    }

    /// The verdict on the interval sampled at run second `now_s`, its lines printed; the
    /// rescale to apply, if any (never with `--no-autoscale`: recorded as a recommendation).
    pub(super) async fn decide(
        &mut self,
        st: &mut LoopState,
        now_s: f64,
        print: &mut (dyn FnMut(&str) + Send),
    ) -> Option<Rescale> {
        let spec = self.job.spec.with_parallelism(&st.engine.parallelism);
        let verdict = st.session.decide(now_s, &spec);
        // Load shedding (`autoscaler.limits.onLimit: shed`): the share the last plan wants
        // is applied at the sources (kept while no plan is made, e.g. stabilizing).
        if st.shedding && self.opts.autoscale {
            let planned = matches!(
                verdict,
                Verdict::Rescale(_)
                    | Verdict::Hold {
                        recommendation: Some(_),
                        ..
                    }
            );
            if planned {
                st.shed_wanted = st
                    .session
                    .autoscaler()
                    .limit_plan()
                    .map_or(0.0, |lp| lp.shed_share);
            }
            if (st.shed_wanted - st.shed_applied).abs() > 1e-3 {
                match self.engine_api(&st.engine).set_shed(st.shed_wanted).await {
                    Ok(n) => {
                        let why = st
                            .session
                            .autoscaler()
                            .limit_plan()
                            .map_or("within the limits again".to_string(), |lp| {
                                lp.reason.clone()
                            });
                        print(&progress::shed_line(now_s, 100.0 * st.shed_wanted, &why));
                        st.shed_applied = st.shed_wanted;
                        self.shed_now = n;
                    }
                    Err(e) => tracing::warn!("{e}"),
                }
            } else if st.shed_applied > 0.0
                && let Ok(n) = self.engine_api(&st.engine).shed().await
            {
                self.shed_now = n;
            }
        }
        // Operators held overloaded (at their largest parallelism, or flagged for
        // ineffective scaling): said once when that starts (and when it ends), since no
        // rescale line will explain the growing backlog.
        // With load shedding the SHED line says it instead.
        let plan_now = match &verdict {
            Verdict::Rescale(d) => Some(d),
            Verdict::Hold { recommendation, .. } => recommendation.as_ref(),
        };
        // The latency SLO unattainable: said once when that starts (and when it ends),
        // since a hold prints no rescale line to carry the planner's reason.
        if let Some(d) = plan_now {
            match progress::slo_unattainable_line(now_s, d) {
                Some(line) if !st.unattainable => {
                    print(&line);
                    st.unattainable = true;
                }
                None if st.unattainable => {
                    print(&progress::slo_attainable_line(now_s));
                    st.unattainable = false;
                }
                _ => {}
            }
        }
        if let Some(d) = plan_now.filter(|_| !st.shedding) {
            let learned = st.session.autoscaler().scalability();
            let overloaded = progress::overloaded_held(d, learned);
            if overloaded != st.at_limit {
                if let Some(line) =
                    progress::at_limit_line(now_s, d, learned, &overloaded, self.opts.autoscale)
                {
                    print(&line);
                } else if overloaded.is_empty() {
                    print(&progress::within_limits_line(now_s));
                }
                st.at_limit = overloaded;
            }
        }
        if let Err(e) = st.session.save_if_changed().await {
            tracing::warn!("{e}");
        }
        // A change the guards hold back: said once per guard and per set of operators
        // and directions (the planned values and the reasons' figures move every
        // interval), so a user sees why nothing happens.
        if let Verdict::Hold {
            reason,
            recommendation: Some(d),
        } = &verdict
            && d.parallelism != st.engine.parallelism
        {
            let key = progress::hold_key(reason, Some(d));
            let due_s = st.session.autoscaler().hold_due_s();
            if st.held.news(key, due_s, self.opts.interval_s.max(1.0)) {
                let change =
                    progress::format_change(&st.engine.parallelism, &d.parallelism, &self.order);
                print(&progress::hold_line(now_s, &change, reason));
            }
        } else {
            st.held.clear();
        }
        let Verdict::Rescale(decision) = verdict else {
            return None;
        };
        if decision.parallelism == st.engine.parallelism {
            return None;
        }
        let reason = rescale_reason(&decision);
        let change =
            progress::format_change(&st.engine.parallelism, &decision.parallelism, &self.order);
        if !self.opts.autoscale {
            // Report the decision once per change of the recommendation; run on as is.
            if self.recommendations.last().map(|r| &r.to) != Some(&decision.parallelism) {
                print(&progress::rescale_recommended_line(now_s, &change, &reason));
                self.recommendations.push(RescaleRecord {
                    at_s: now_s,
                    from: st.engine.parallelism.clone(),
                    to: decision.parallelism.clone(),
                    reason,
                    downtime_s: 0.0,
                    outcome: "recommended".into(),
                    error: None,
                    savepoint: None,
                });
            }
            return None;
        }
        Some(Rescale {
            decision,
            reason,
            change,
        })
    }
}

/// One line explaining a decision: the planner's reason for every operator whose parallelism
/// changes (`enrich: ...`), then the sources' rates (every source's reason, at most three),
/// else the first job-wide reason; the bottleneck when no operator changes.
pub fn rescale_reason(decision: &crate::model::Decision) -> String {
    let mut parts: Vec<String> = decision
        .operators
        .iter()
        .filter(|(name, plan)| decision.current.get(*name) != Some(&plan.parallelism))
        .map(|(name, plan)| {
            if plan.reason.is_empty() {
                format!(
                    "{name}: {} → {}",
                    plan.current_parallelism, plan.parallelism
                )
            } else if plan.reason.starts_with(&**name) {
                plan.reason.clone()
            } else {
                format!("{name}: {}", plan.reason)
            }
        })
        .collect();
    if parts.is_empty()
        && let Some(b) = &decision.bottleneck
    {
        parts.push(b.clone());
    }
    // The sources' rates (one reason each, first in the list), so that the source whose rate
    // moved is named whichever it is; at most three, else the job-wide first reason.
    let sources: Vec<&String> = decision
        .reasons
        .iter()
        .take_while(|r| r.starts_with("source "))
        .collect();
    match sources.len() {
        0 => parts.extend(decision.reasons.iter().take(1).cloned()),
        1..=3 => parts.extend(sources.into_iter().cloned()),
        n => {
            parts.extend(sources.iter().take(3).map(|r| (*r).clone()));
            parts.push(format!("and {} more sources", n - 3));
        }
    }
    // An unattainable SLO (and what best effort does about it) explains the latency the
    // rescale leaves.
    if let Some(r) = crate::progress::unattainable_reason(decision)
        && !parts.iter().any(|p| p == r)
    {
        parts.push(r.to_string());
    }
    if parts.is_empty() {
        "planner decision".to_string()
    } else {
        parts.join("; ")
    }
}

/// Seconds since the Unix epoch now (0 when the clock is before it).
fn unix_now_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
