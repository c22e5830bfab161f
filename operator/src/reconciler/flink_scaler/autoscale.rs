//! One autoscaling step of a FlinkScaler's job: collect its counters, decide within its slots
//! and quota share, and record the decision (writing the overrides in mode `auto`).

use super::*;

/// Collects a sample, decides, and records the decision (starting a rescale in mode `auto`).
pub(super) async fn autoscale_flink(
    scope: &Scope<'_>,
    m: &mut ScalerMemory,
    rest: &FlinkRest,
    job: &JobDetails,
    view: &TargetView,
    cluster: &TargetView,
    status: &mut FlinkScalerStatus,
) -> Result<(), Error> {
    let scaler = scope.scaler;
    let a = &scaler.spec.autoscaler;
    let Some(topo) = m.topology.clone() else {
        return Ok(());
    };
    let now_s = scope.ctx.now_s();
    let settings = guard_settings_of(a);
    // New settings, same job: what was learned carries over.
    m.session.update_settings(settings, now_s);
    m.session
        .set_window_rule(WindowRule::HorizonKeepingTwo(f64::from(
            a.metrics_window_seconds,
        )));
    let mut source = FlinkRestSource {
        collector: &mut m.collector,
        rest,
        job,
        topo: &topo,
        previous: m.session.window().back(),
    };
    let sample = match source.collect(&|| now_s).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            m.not_running = true;
            return Ok(());
        }
        Err(e) => {
            tracing::warn!(scaler = %key(scaler), "cannot read the job's metrics: {e}");
            return Ok(());
        }
    };
    if m.session
        .window()
        .back()
        .is_some_and(|last| no_new_measurement(last, &sample.sample))
    {
        // Flink has not refreshed its metrics since the last scrape, or the sample is dated
        // on top of the last one (no time to take rates over).
        return Ok(());
    }
    if std::mem::take(&mut m.not_running)
        || m.session
            .window()
            .back()
            .is_some_and(|last| last_parallelism(last) != last_parallelism(&sample.sample))
    {
        // Restarted (a failover replays from its latest checkpoint: catch-up, not the job's
        // load), or rescaled from outside (the user, the Flink operator): a new deployment.
        m.session.restarted(now_s);
    }
    ctx_metrics_read(scope);
    m.session.observe(now_s, sample.sample);
    let current = status.current_parallelism.clone();
    // The slots the plan may use: the cluster's free slots plus those the job holds, and its
    // share of a StreamQuota; the tightest caps every vertex.
    let mut caps: Vec<(u32, String)> = Vec::new();
    match rest.overview().await {
        Ok(o) => {
            let held = slots::held(&current);
            let max = cluster.slots_max();
            if let Some(limit) = slots::job_limit(
                o.slots_total,
                o.slots_available,
                held,
                cluster.task_managers_on_demand(),
                max,
            ) {
                let what = match max {
                    Some(m) => format!(
                        "the Flink cluster has {} slots, {} free, slotmanager.number-of-slots.max {m}",
                        o.slots_total, o.slots_available
                    ),
                    None => format!(
                        "the Flink cluster has {} slots, {} free",
                        o.slots_total, o.slots_available
                    ),
                };
                caps.push((limit.max(1), what));
            }
        }
        Err(e) => {
            tracing::warn!(scaler = %key(scaler), "cannot read the cluster's slots: {e}");
        }
    }
    let quota = match &a.quota {
        Some(name) => {
            let held = quota::slots_held(&current);
            let demand = status
                .quota
                .as_ref()
                .filter(|q| q.name == *name && !q.demand.is_empty())
                .map_or_else(
                    || {
                        quota::slots_demand(
                            &topo.spec,
                            &quota::demand_from_parallelism(&topo.spec, &current),
                            &current,
                        )
                    },
                    |q| q.demand.clone(),
                );
            let own = quota::Member {
                name: quota::flink_member_name(&scaler.name_any()),
                demand,
                held,
            };
            let ns = scaler.namespace().unwrap_or_else(|| "default".into());
            let q = share_of(scope.ctx, &ns, name, own).await;
            let cap = q.share.as_ref().map_or(held, |s| s.cap).max(1);
            caps.push((
                cap,
                format!(
                    "the share of StreamQuota {name}: {cap} of {} slots",
                    q.subtasks
                ),
            ));
            Some(q)
        }
        None => None,
    };
    let cap = caps.iter().min_by_key(|(c, _)| *c).cloned();
    let mut spec = topo.spec.clone();
    if let Some((c, _)) = &cap {
        slots::cap(&mut spec, *c);
        // Beyond the cap the job holds at it (a Flink job's sources cannot shed).
        spec.autoscaler
            .limits
            .get_or_insert_with(LimitsSpec::default);
    }
    let verdict = m.session.decide(now_s, &spec);
    save_learned(&mut m.session).await;
    let planned = match &verdict {
        Verdict::Rescale(d) => Some(d),
        Verdict::Hold { recommendation, .. } => recommendation.as_ref(),
    };
    if let Some(mut q) = quota {
        if let Some(d) = planned {
            q.demand = quota::slots_demand(
                &topo.spec,
                &quota::demand_from_decision(d, &topo.spec),
                &current,
            );
        }
        report_quota(scaler, scope.ctx, &mut status.quota, q).await;
    }
    let (mut decision, mut rescale, mut held) = match verdict {
        Verdict::Rescale(d) => (d, true, String::new()),
        Verdict::Hold {
            recommendation: Some(d),
            reason,
        } => (d, false, reason),
        Verdict::Hold { reason, .. } => {
            scope
                .ctx
                .metrics
                .decisions
                .with_label_values(&["hold"])
                .inc();
            tracing::debug!(scaler = %key(scaler), "hold: {reason}");
            let d = last_decision::hold(&current, reason, now_rfc3339());
            record_hold(scope.ctx, scaler, &mut status.last_decision, d).await;
            return Ok(());
        }
    };
    // A job holding more slots than its quota share is rescaled down to it, whatever the
    // scale-down guards say (the other members wait for those slots).
    if let Some(q) = &status.quota
        && let Some(target) =
            quota::forced_slots_scale_down(q, &current, &decision.parallelism, rescale)
    {
        decision.parallelism = target;
        decision.reasons.insert(
            0,
            format!(
                "quota {}: {} slots held, the share is {}; rescaling down to it",
                q.name, q.running_subtasks, q.allocated_subtasks
            ),
        );
        rescale = true;
    }
    if let Some((c, what)) = &cap
        && let Some(note) = slots::held_note(&decision, *c, what)
    {
        held = format!("{held}; {note}");
        decision.reasons.push(note);
    }
    let reason = std::iter::once(decision.bottleneck.clone().unwrap_or_default())
        .chain(decision.reasons.iter().cloned())
        .chain(sample.notes.iter().cloned())
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    let changed = status.recommended_parallelism != decision.parallelism;
    status.recommended_parallelism = decision.parallelism.clone();
    for v in &mut status.vertices {
        v.recommended = decision.parallelism.get(&v.name).copied();
    }
    if !rescale {
        scope
            .ctx
            .metrics
            .decisions
            .with_label_values(&["hold"])
            .inc();
        let d = last_decision::of_decision(
            &decision,
            &current,
            DecisionAction::Hold,
            held.trim_start_matches("; ").to_string(),
            now_rfc3339(),
        );
        record_hold(scope.ctx, scaler, &mut status.last_decision, d).await;
        return Ok(());
    }
    let auto = a.mode == AutoscalerMode::Auto;
    // Why a rescale the guards let through is held in mode auto: a backoff after failed
    // rescales, or a target whose upgrade would drop the job's state.
    let held_by = if !auto {
        None
    } else if let Some(b) = status
        .backoff
        .as_ref()
        .filter(|b| b.holds_at(Timestamp::now()))
    {
        Some(format!(
            "backing off until {} after {} failed rescale(s)",
            b.retry_after, b.failures
        ))
    } else {
        view.stateless_upgrade(cluster, job.adaptive_scheduler())
    };
    if let Some(held_by) = held_by {
        let why = format!(
            "rescale to {} held: {held_by}",
            rescale::fmt_p(&decision.parallelism)
        );
        tracing::info!(scaler = %key(scaler), "{why}");
        let d = last_decision::of_decision(
            &decision,
            &current,
            DecisionAction::Hold,
            why,
            now_rfc3339(),
        );
        record_hold(scope.ctx, scaler, &mut status.last_decision, d).await;
        return Ok(());
    }
    let d = last_decision::of_decision(
        &decision,
        &current,
        if auto {
            DecisionAction::Rescale
        } else {
            DecisionAction::Recommend
        },
        reason.clone(),
        now_rfc3339(),
    );
    last_decision::store(&mut status.last_decision, d);
    if !auto {
        scope
            .ctx
            .metrics
            .decisions
            .with_label_values(&["recommend"])
            .inc();
        if changed {
            scope
                .event(
                    false,
                    "Recommendation",
                    format!(
                        "recommended {}: {reason}",
                        rescale::fmt_p(&decision.parallelism)
                    ),
                )
                .await;
        }
        return Ok(());
    }
    scope
        .ctx
        .metrics
        .decisions
        .with_label_values(&["rescale"])
        .inc();
    let from = status.current_parallelism.clone();
    let overrides = topo.overrides(&decision.parallelism);
    let previous = view.overrides().unwrap_or_else(|| topo.overrides(&from));
    let now = now_rfc3339();
    // The step is persisted before the target is written: a restart re-writes it (idempotent).
    status.rescale = Some(FlinkRescaleStatus {
        step: FlinkRescaleStep::Requested,
        from: from.clone(),
        to: decision.parallelism.clone(),
        overrides: overrides.clone(),
        previous_overrides: previous,
        target_generation: None,
        reason: reason.clone(),
        rolling_back: false,
        started_at: now.clone(),
        step_started_at: now,
        job_id: Some(job.jid.clone()),
    });
    status.phase = FlinkScalerPhase::Rescaling;
    scope.set(
        status,
        "Scaling",
        true,
        "Requested",
        &format!("overrides {overrides} written to the target"),
    );
    scope.write_status(status).await?;
    scope
        .event(
            false,
            "RescaleStarted",
            format!(
                "{} -> {}: {reason}",
                rescale::fmt_p(&from),
                rescale::fmt_p(&decision.parallelism)
            ),
        )
        .await;
    let generation = scope.write_overrides(&overrides).await?;
    if let Some(r) = &mut status.rescale {
        r.target_generation = generation;
    }
    m.session.restarted(now_s);
    Ok(())
}

/// The FlinkDeployment that runs the job's cluster: the target itself, or a FlinkSessionJob's
/// session cluster (`spec.deploymentName`; the FlinkSessionJob when it cannot be read, so its
/// slots are taken as started on demand).
pub(super) async fn cluster_view(scope: &Scope<'_>, view: &TargetView) -> TargetView {
    use crate::flink_scaler_crd::TargetKind;
    if scope.scaler.spec.target_ref.kind != TargetKind::FlinkSessionJob {
        return view.clone();
    }
    let Some(name) = &view.deployment_name else {
        return view.clone();
    };
    let ns = scope.scaler.namespace().unwrap_or_else(|| "default".into());
    let api: Api<DynamicObject> = Api::namespaced_with(
        scope.ctx.client.clone(),
        &ns,
        &flink_target::api_resource(TargetKind::FlinkDeployment),
    );
    match api.get_opt(name).await {
        Ok(Some(d)) => TargetView::from_json(&serde_json::to_value(&d).unwrap_or_default()),
        Ok(None) => view.clone(),
        Err(e) => {
            tracing::debug!(scaler = %key(scope.scaler), "cannot read FlinkDeployment {name}: {e}");
            view.clone()
        }
    }
}

fn ctx_metrics_read(scope: &Scope<'_>) {
    scope
        .ctx
        .metrics
        .metric_reads
        .with_label_values(&["flink"])
        .inc();
}
