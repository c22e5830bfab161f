//! What the reconciler remembers of a job between reconciles, and its learned state saved to and restored from the ConfigMap.

use super::*;

/// What the autoscaler remembers about one job between reconciles. The metric window is not
/// persisted (after an operator restart it refills and the guards' stabilization applies);
/// what is learned (rate history, scalability factors, rescale downtime) is, in the job's
/// `NAME-autoscaler` ConfigMap ([`crate::state`]).
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

/// The parts of the persisted state whose change is worth a write: the history's bins (a new
/// bin every `binSeconds`), the learned factors and flags, the downtime.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StateFingerprint {
    pub(super) bins: usize,
    pub(super) last_bin: Option<i64>,
    pub(super) factors: BTreeMap<String, f64>,
    pub(super) ineffective: Vec<String>,
    pub(super) downtime: Option<f64>,
}

impl StateFingerprint {
    pub(super) fn of(s: &SavedState) -> StateFingerprint {
        let bins = s.history.as_ref().map_or(&[][..], |h| &h.bins[..]);
        StateFingerprint {
            bins: bins.len(),
            last_bin: bins.last().map(|b| b.0),
            factors: s.scalability.factors.clone(),
            ineffective: s.scalability.ineffective.keys().cloned().collect(),
            downtime: s.rescale_downtime_seconds,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.bins == 0
            && self.factors.is_empty()
            && self.ineffective.is_empty()
            && self.downtime.is_none()
    }
}

/// The state to persist from `autoscaler` (history moved to Unix time by `unix0`, the Unix
/// time of the operator's clock zero).
pub(super) fn snapshot(name: &str, autoscaler: &Autoscaler, unix0: f64) -> SavedState {
    let h = autoscaler.rate_history();
    SavedState {
        version: learned_configmap::VERSION,
        job: name.to_string(),
        history: (h.bin_seconds > 0.0 && (!h.bins.is_empty() || h.open.is_some()))
            .then(|| h.shifted(unix0)),
        scalability: autoscaler.scalability().clone(),
        rescale_downtime_seconds: autoscaler.settings().planner.rescale_downtime_seconds,
    }
}

/// Puts a persisted state into a fresh `autoscaler`.
pub(super) fn restore(autoscaler: &mut Autoscaler, s: &SavedState, unix0: f64) {
    if let Some(h) = &s.history {
        autoscaler.set_rate_history(h.shifted(-unix0));
    }
    autoscaler.set_scalability(s.scalability.clone());
    if let Some(d) = s.rescale_downtime_seconds {
        autoscaler.observe_rescale_downtime(d);
    }
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
    restore(&mut fresh, &snapshot(name, autoscaler, 0.0), 0.0);
    *autoscaler = fresh;
    *current = settings;
}

/// Reads the job's state ConfigMap; `None` when there is none or it cannot be used (a
/// warning Event names the problem; the job starts with nothing learned).
pub(super) async fn load_state<K: Resource<DynamicType = ()> + ResourceExt>(
    job: &K,
    ctx: &Context,
) -> Option<SavedState> {
    let ns = job.namespace().unwrap_or_else(|| "default".into());
    let name = learned_configmap::configmap_name(&job.name_any());
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ns);
    let cm = match cms.get_opt(&name).await {
        Ok(cm) => cm?,
        Err(e) => {
            tracing::warn!(job = %key(job), "cannot read ConfigMap {name}: {e}");
            return None;
        }
    };
    let text = cm
        .data
        .and_then(|mut d| d.remove(learned_configmap::STATE_KEY))?;
    match learned_configmap::decode(&name, &text, &job.name_any()) {
        Ok(s) => {
            if let Some(s) = &s {
                tracing::info!(
                    job = %key(job),
                    bins = s.history.as_ref().map_or(0, |h| h.bins.len()),
                    factors = s.scalability.factors.len(),
                    "autoscaler state loaded from ConfigMap {name}"
                );
            }
            s
        }
        Err(e) => {
            publish(
                ctx,
                job,
                true,
                "AutoscalerStateIgnored",
                format!("{e}; starting with nothing learned (it is overwritten)"),
            )
            .await;
            None
        }
    }
}

/// Writes a state ConfigMap (server-side apply; `cm` names its owner).
pub(super) async fn save_state(ctx: &Context, cm: ConfigMap) -> Result<(), String> {
    let ns = cm
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| "default".into());
    let name = cm.metadata.name.clone().unwrap_or_default();
    Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&cm),
        )
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}
