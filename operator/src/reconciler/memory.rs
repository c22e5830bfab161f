//! What the reconciler remembers of a job between reconciles, and its learned state saved to and restored from the ConfigMap.

use super::*;

/// What the autoscaler remembers about one job between reconciles. The metric window is not
/// persisted (after an operator restart it refills and the guards' stabilization applies);
/// what is learned (rate history, scalability factors, rescale downtime) is, in the job's
/// `NAME-autoscaler` ConfigMap ([`crate::learned_configmap`]).
pub(super) struct JobMemory {
    /// The window, the autoscaler and the ConfigMap store.
    pub(super) session: AutoscaleSession<ConfigMapStateStore>,
    /// Unix seconds of the last Prometheus scrape put into the window (a query that returns
    /// the same scrape again adds nothing).
    pub(super) last_scrape_unix_s: Option<f64>,
    /// Shed share last applied at the engine's sources (`None`: not since this engine started
    /// or since the operator started).
    pub(super) shed_applied: Option<f64>,
}

/// What the operator keeps of the autoscaler's learning: all of it (the job runs on at its
/// parallelism across an operator restart, so the last observation is still the baseline).
pub(super) const KEEP: Keep = Keep {
    baseline: true,
    downtime: true,
};

/// A session of job `name` with `settings`, started at `now_s` on the operator's clock (whose
/// zero is Unix time `unix0`), its window kept by `rule`, its state in `store`, holding `loaded`
/// (as read from the store).
pub(super) fn new_session(
    name: &str,
    settings: GuardSettings,
    now_s: f64,
    rule: WindowRule,
    store: ConfigMapStateStore,
    loaded: Option<&LearnedState>,
    unix0: f64,
) -> AutoscaleSession<ConfigMapStateStore> {
    let mut session = AutoscaleSession::new(name, settings, now_s, rule, store, KEEP, unix0);
    if let Some(s) = loaded {
        session.restore(s);
    }
    session
}

/// Reads the job's learned state from `store`; `None` when there is none or it cannot be used
/// (a warning Event names the problem; the job starts with nothing learned).
pub(super) async fn load_state<K: Resource<DynamicType = ()> + ResourceExt>(
    job: &K,
    ctx: &Context,
    store: &mut ConfigMapStateStore,
) -> Option<LearnedState> {
    match store.load().await {
        Ok(s) => {
            if let Some(s) = &s {
                tracing::info!(
                    job = %key(job),
                    bins = s.history.as_ref().map_or(0, |h| h.bins.len()),
                    factors = s.scalability.factors.len(),
                    "autoscaler state loaded from ConfigMap {}",
                    learned_configmap::configmap_name(&job.name_any())
                );
            }
            s
        }
        Err(e @ StateStoreError::Invalid { .. }) => {
            publish(
                ctx,
                job,
                true,
                "AutoscalerStateIgnored",
                format!("{e} (it is overwritten)"),
            )
            .await;
            None
        }
        Err(e) => {
            tracing::warn!(job = %key(job), "{e}");
            None
        }
    }
}

/// Writes what `session` learned to its store when it changed (a failure is logged; the next
/// reconcile tries again).
pub(super) async fn save_learned(session: &mut AutoscaleSession<ConfigMapStateStore>) {
    if let Err(e) = session.save_if_changed().await {
        tracing::warn!("cannot save the autoscaler state: {e}");
    }
}
