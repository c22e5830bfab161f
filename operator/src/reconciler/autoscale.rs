//! One autoscaling step of a job: collect its metrics, decide, and start a rescale.

use streamscale_controller::collect::{EngineScrape, MetricsSource};

use super::*;
use crate::prometheus::PrometheusSource;

/// Scrapes, decides, and records the decision (starting a rescale in mode `auto`).
pub(super) async fn autoscale(
    job: &StreamJob,
    ctx: &Context,
    rt: &KubeRuntime,
    status: &mut StreamJobStatus,
) {
    let now_s = ctx.now_s();
    let clock = || now_s;
    let (sample, scraped_at, kind) = match &job.spec.autoscaler.prometheus {
        Some(p) => {
            let selector = p
                .selector
                .clone()
                .unwrap_or_else(|| default_prometheus_selector(job));
            let mut source = PrometheusSource {
                client: &ctx.http,
                base_url: &p.url,
                selector: &selector,
            };
            match source.collect(&clock).await {
                Ok(Some(m)) => (m.metrics.sample, Some(m.scraped_at_unix_s), source.kind()),
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(job = %key(job), "metrics from Prometheus: {e}");
                    return;
                }
            }
        }
        None => {
            let url = rt.api().metrics_url();
            let mut source = EngineScrape::new(&ctx.http, &url);
            match source.collect(&clock).await {
                Ok(Some(m)) => (m.sample, None, source.kind()),
                Ok(None) => return,
                Err(e) => {
                    tracing::debug!(job = %key(job), "scrape failed: {e}");
                    return;
                }
            }
        }
    };
    ctx.metrics.metric_reads.with_label_values(&[kind]).inc();
    let mut spec = planning_spec(job, &status.current_parallelism);
    // A shared StreamQuota: this job plans within its share (its planning quota).
    let quota = match &job.spec.autoscaler.quota {
        Some(name) => Some(quota_share(job, ctx, name, &spec, status).await),
        None => None,
    };
    if let Some(q) = &quota {
        let running = quota::non_source_total(&spec, &status.current_parallelism);
        let cap = q.share.as_ref().map_or(running, |s| s.cap).max(1);
        let limits = spec
            .autoscaler
            .limits
            .get_or_insert_with(LimitsSpec::default);
        limits.quota_subtasks = Some(limits.quota_subtasks.map_or(cap, |own| own.min(cap)));
    }
    // The first time this operator process sees the job: what was learned before it started.
    let known = ctx
        .memory
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains_key(&key(job));
    let loaded = if known {
        None
    } else {
        let mut store = ConfigMapStateStore::for_stream_job(ctx.client.clone(), job);
        let state = load_state(job, ctx, &mut store).await;
        Some((store, state))
    };
    let horizon = WindowRule::Horizon(job.spec.autoscaler.metrics_window_seconds as f64);
    let (verdict, limit, shed_applied, to_save) = {
        let mut memory = ctx.memory.lock().unwrap_or_else(|p| p.into_inner());
        let settings = guard_settings(job);
        let m = memory.entry(key(job)).or_insert_with(|| {
            let (store, state) = loaded.unwrap_or_else(|| {
                let store = ConfigMapStateStore::for_stream_job(ctx.client.clone(), job);
                (store, None)
            });
            JobMemory {
                session: new_session(
                    &job.name_any(),
                    settings.clone(),
                    now_s,
                    horizon,
                    store,
                    state.as_ref(),
                    ctx.unix0,
                ),
                last_scrape_unix_s: None,
                shed_applied: None,
            }
        });
        let session = &mut m.session;
        // New settings, same job: what was learned carries over.
        session.update_settings(settings, now_s);
        session.set_window_rule(horizon);
        // A window from another parallelism is not about this deployment.
        if session
            .window()
            .back()
            .is_some_and(|last| last_parallelism(last) != status.current_parallelism)
        {
            session.clear_window();
        }
        if scraped_at.is_none() || scraped_at != m.last_scrape_unix_s {
            session.push(sample);
            m.last_scrape_unix_s = scraped_at;
        }
        session.trim(now_s);
        // After a rescale that did not complete, none before the backoff ends (one that fails
        // again and again would stop the job again and again). The planner is not asked: a
        // decision it makes counts towards its rescale budget and flaps as if applied.
        let backoff = status.backoff.as_ref().filter(|b| {
            job.spec.autoscaler.mode == AutoscalerMode::Auto && b.holds_at(Timestamp::now())
        });
        let verdict = match backoff {
            Some(b) => Verdict::Hold {
                reason: format!(
                    "held: backing off until {} after {} failed rescale(s) in a row",
                    b.retry_after, b.failures
                ),
                recommendation: None,
            },
            None => session.decide(now_s, &spec),
        };
        // Written outside the lock: the store and what to write.
        let to_save = session
            .unsaved()
            .map(|(fp, state)| (session.store().clone(), fp, state));
        (
            verdict,
            session.autoscaler().limit_plan().cloned(),
            m.shed_applied,
            to_save,
        )
    };
    if let Some((mut store, fp, state)) = to_save {
        match store.save(&state).await {
            Ok(()) => {
                let mut memory = ctx.memory.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(m) = memory.get_mut(&key(job)) {
                    m.session.saved(fp);
                }
            }
            Err(e) => tracing::warn!(job = %key(job), "cannot save the autoscaler state: {e}"),
        }
    }
    let planned = match &verdict {
        Verdict::Rescale(d) => Some(d),
        Verdict::Hold { recommendation, .. } => recommendation.as_ref(),
    };
    if let Some(mut q) = quota {
        if let Some(d) = planned {
            q.demand = quota::demand_from_decision(d, &spec);
        }
        report_quota(job, ctx, &mut status.quota, q).await;
    }
    if planned.is_some() {
        report_limit(job, ctx, rt, status, limit.as_ref(), shed_applied).await;
    }
    let (mut decision, mut rescale, held) = match verdict {
        Verdict::Rescale(d) => (d, true, String::new()),
        Verdict::Hold {
            recommendation: Some(d),
            reason,
        } => (d, false, reason),
        Verdict::Hold { reason, .. } => {
            ctx.metrics.decisions.with_label_values(&["hold"]).inc();
            tracing::debug!(job = %key(job), "hold: {reason}");
            let d = last_decision::hold(&status.current_parallelism, reason, now_rfc3339());
            record_hold(ctx, job, &mut status.last_decision, d).await;
            return;
        }
    };
    // A job holding more than its quota share is rescaled down to it, whatever the
    // scale-down guards say (the other members wait for those subtasks).
    if let Some(q) = &status.quota
        && let Some(target) = quota::forced_scale_down(
            &spec,
            q,
            &status.current_parallelism,
            &decision.parallelism,
            rescale,
            limit.as_ref().map(|lp| &lp.parallelism),
        )
    {
        decision.parallelism = target;
        decision.reasons.insert(
            0,
            format!(
                "quota {}: {} subtasks held, the share is {}; rescaling down to it",
                q.name, q.running_subtasks, q.allocated_subtasks
            ),
        );
        rescale = true;
    }
    let auto = job.spec.autoscaler.mode == AutoscalerMode::Auto;
    let reason = std::iter::once(decision.bottleneck.clone().unwrap_or_default())
        .chain(decision.reasons.iter().cloned())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    let changed = status.recommended_parallelism != decision.parallelism;
    status.recommended_parallelism = decision.parallelism.clone();
    if !rescale {
        ctx.metrics.decisions.with_label_values(&["hold"]).inc();
        let d = last_decision::of_decision(
            &decision,
            &status.current_parallelism,
            DecisionAction::Hold,
            held,
            now_rfc3339(),
        );
        record_hold(ctx, job, &mut status.last_decision, d).await;
        return;
    }
    let action = if auto {
        DecisionAction::Rescale
    } else {
        DecisionAction::Recommend
    };
    let d = last_decision::of_decision(
        &decision,
        &status.current_parallelism,
        action,
        reason.clone(),
        now_rfc3339(),
    );
    last_decision::store(&mut status.last_decision, d);
    if auto {
        ctx.metrics.decisions.with_label_values(&["rescale"]).inc();
        let now = now_rfc3339();
        // The savepoint id is chosen here and persisted with the step, before it is requested.
        status.rescale = Some(RescaleStatus {
            step: RescaleStep::Savepointing,
            from: status.current_parallelism.clone(),
            to: decision.parallelism.clone(),
            reason: reason.clone(),
            savepoint_id: Some(rescale::savepoint_id(&now)),
            savepoint_path: None,
            rolling_back: false,
            started_at: now.clone(),
            step_started_at: now,
        });
        status.phase = Phase::Rescaling;
        let old = status.conditions.clone();
        set_condition(
            status,
            condition(
                "Scaling",
                true,
                "Savepointing",
                "rescale started",
                job.metadata.generation,
                &old,
            ),
        );
        publish(
            ctx,
            job,
            false,
            "RescaleStarted",
            format!(
                "{} -> {}: {reason}",
                rescale::fmt_p(&status.current_parallelism),
                rescale::fmt_p(&decision.parallelism)
            ),
        )
        .await;
    } else {
        ctx.metrics
            .decisions
            .with_label_values(&["recommend"])
            .inc();
        if changed {
            publish(
                ctx,
                job,
                false,
                "Recommendation",
                format!(
                    "recommended {}: {reason}",
                    rescale::fmt_p(&decision.parallelism)
                ),
            )
            .await;
        }
    }
}
