//! What the reconciler remembers of a job between reconciles, and its learned state saved to and restored from the ConfigMap.

use super::*;

/// What the autoscaler remembers about one job between reconciles. The metric window is not
/// persisted (after an operator restart it refills and the guards' stabilization applies);
/// what is learned (rate history, scalability factors, rescale downtime) is, in the job's
/// `NAME-autoscaler` ConfigMap ([`crate::learned_configmap`]).
pub(super) struct JobMemory {
    pub(super) autoscaler: Autoscaler,
    pub(super) window: VecDeque<MetricSample>,
    pub(super) settings: GuardSettings,
    /// Unix seconds of the last Prometheus scrape put into `window` (a query that returns the
    /// same scrape again adds nothing).
    pub(super) last_scrape_unix_s: Option<f64>,
    /// Shed share last applied at the engine's sources (`None`: not since this engine started
    /// or since the operator started).
    pub(super) shed_applied: Option<f64>,
    /// What the state ConfigMap holds (as last loaded or written).
    pub(super) saved: Option<StateFingerprint>,
}

/// What the operator keeps of the autoscaler's learning: all of it (the job runs on at its
/// parallelism across an operator restart, so the last observation is still the baseline).
pub(super) const KEEP: Keep = Keep {
    baseline: true,
    downtime: true,
};

/// The state to persist from `autoscaler` (history moved to Unix time by `unix0`, the Unix
/// time of the operator's clock zero).
pub(super) fn snapshot(name: &str, autoscaler: &Autoscaler, unix0: f64) -> LearnedState {
    LearnedState::of(name, autoscaler, unix0, KEEP)
}

/// Replaces `autoscaler` by one with new `settings` when they differ from `current` (the
/// same job: what was learned carries over; the new one starts a stabilization at `now_s`).
pub(super) fn apply_new_settings(
    name: &str,
    autoscaler: &mut Autoscaler,
    current: &mut GuardSettings,
    settings: GuardSettings,
    now_s: f64,
) {
    if *current == settings {
        return;
    }
    let mut fresh = Autoscaler::new(settings.clone());
    fresh.restarted(now_s);
    snapshot(name, autoscaler, 0.0).restore_into(&mut fresh, 0.0);
    *autoscaler = fresh;
    *current = settings;
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
                    "autoscaler state loaded from {}",
                    store.location()
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

/// Writes `state` to `store` when its fingerprint differs from `saved` (what the store holds)
/// and it is not empty; `saved` follows what was written.
pub(super) async fn save_if_changed(
    store: &mut ConfigMapStateStore,
    state: &LearnedState,
    saved: &mut Option<StateFingerprint>,
) {
    let fp = StateFingerprint::of(state);
    if saved.as_ref() == Some(&fp) || fp.is_empty() {
        return;
    }
    match store.save(state).await {
        Ok(()) => *saved = Some(fp),
        Err(e) => tracing::warn!(job = %state.job, "cannot save the autoscaler state: {e}"),
    }
}
