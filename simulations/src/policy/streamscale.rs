//! The `streamscale` and `streamscale-forecast` policies: the controller's guarded planner as shipped.

use super::*;

/// The controller's planner with its guards, unchanged ([`Autoscaler`]), set up as the
/// Kubernetes operator sets it up with its defaults (`operator/src/reconciler.rs`,
/// `guard_settings`): guard window max(metrics window / 2, 2 × metrics interval), 10 s
/// stabilization, 30 s scale-down delay applying the highest recommendation, no scale-down
/// under backlog, the planner's targets from the job's `autoscaler:`. As `streamscale run`
/// does, each rescale's downtime is reported to it
/// ([`Autoscaler::observe_rescale_downtime`]).
///
/// Two things only save work and change no decision:
/// * the job spec at the running parallelism is built once per deployment, and each snapshot
///   is converted to a [`MetricSample`] once, when a decision first needs it;
/// * a window whose [`Observation::window_key`] (which covers the parallelism) already gave a
///   hold without guard memory (the planner's recommendation was computed and no scale-down is
///   pending after the call) under the same settings is not planned again while no scale-down
///   is pending and the stabilization period is over. Such a hold went through guard branches
///   that neither read nor write the guards' memory; the guarded planner is otherwise a
///   function of the window's rates and gauges (equal for equal keys) and of its settings, so
///   it would hold again.
#[derive(Debug)]
pub struct Streamscale {
    auto: Autoscaler,
    interval_s: f64,
    window_s: f64,
    /// The job spec at the running parallelism.
    spec: Option<(Vec<u32>, JobSpec)>,
    /// Subtask input shares at the running parallelism.
    shares: Vec<Vec<f64>>,
    /// Metric samples of the window's snapshots converted so far, oldest first.
    samples: VecDeque<MetricSample>,
    /// Samples dropped from `samples`, refilled for new snapshots.
    spare: Vec<MetricSample>,
    /// Window keys that held without guard memory under `memo_settings`, with what the call
    /// added to the scale-down lookback ([`Autoscaler::lookback_needs`], in name order).
    memo: HashMap<u64, Vec<u32>>,
    /// The settings `memo` was filled under.
    memo_settings: Option<GuardSettings>,
    /// Whether `memo` is used (off only to test that it changes nothing).
    use_memo: bool,
    /// Calls of [`Autoscaler::decide`] made and skipped (stationary repeats).
    planner_calls: (u64, u64),
}

impl Streamscale {
    /// Decisions every `interval_s` seconds from a metric window of `window_s` seconds, with the
    /// operator's default guards.
    pub fn new(interval_s: f64, window_s: f64) -> Streamscale {
        Streamscale::with_guards(
            interval_s,
            window_s,
            GuardSettings {
                window_seconds: (window_s / 2.0).max(interval_s * 2.0),
                ..GuardSettings::default()
            },
        )
    }

    /// Decisions every `interval_s` seconds from a metric window of `window_s` seconds, with
    /// these guard settings.
    pub fn with_guards(interval_s: f64, window_s: f64, guards: GuardSettings) -> Streamscale {
        Streamscale {
            auto: Autoscaler::new(guards),
            interval_s,
            window_s,
            spec: None,
            shares: Vec::new(),
            samples: VecDeque::new(),
            spare: Vec::new(),
            memo: HashMap::new(),
            memo_settings: None,
            use_memo: true,
            planner_calls: (0, 0),
        }
    }

    /// The same policy calling the planner at every decision (no memo of held windows).
    pub fn without_memo(mut self) -> Streamscale {
        self.use_memo = false;
        self
    }

    /// Brings `self.samples` in line with `window` (same parallelism), converting only the
    /// snapshots not converted yet.
    fn sync_samples(&mut self, model: &JobModel, window: &[Snapshot]) {
        let Some(first) = window.first() else {
            self.samples.clear();
            return;
        };
        while self
            .samples
            .front()
            .is_some_and(|s| s.at_seconds < first.at_s)
        {
            if let Some(old) = self.samples.pop_front() {
                self.spare.push(old);
            }
        }
        if self
            .samples
            .front()
            .is_some_and(|s| s.at_seconds != first.at_s)
        {
            self.spare.extend(self.samples.drain(..));
        }
        let last = self
            .samples
            .back()
            .map_or(f64::NEG_INFINITY, |s| s.at_seconds);
        for snap in window.iter().filter(|s| s.at_s > last) {
            // Samples dropped from the window are refilled (same operators and parallelism:
            // no allocation).
            let sample = match self.spare.pop() {
                Some(mut old) => {
                    metric_sample_into(model, &self.shares, snap, &mut old);
                    old
                }
                None => metric_sample(model, &self.shares, snap),
            };
            self.samples.push_back(sample);
        }
        if self.samples.len() != window.len() {
            self.samples = window
                .iter()
                .map(|s| metric_sample(model, &self.shares, s))
                .collect();
        }
    }
}

impl Policy for Streamscale {
    fn name(&self) -> &'static str {
        "streamscale"
    }
    fn uses_window_key(&self) -> bool {
        self.use_memo
    }
    fn interval_s(&self) -> f64 {
        self.interval_s
    }
    fn window_s(&self) -> f64 {
        self.window_s
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let key = obs.window_key.filter(|_| self.use_memo);
        let settled = self.auto.state().pending_scale_downs.is_empty()
            && obs.now_s - obs.started_s >= self.auto.settings().stabilization_seconds;
        if settled
            && let Some(rec) = key.and_then(|k| self.memo.get(&k))
            && let Some((_, spec)) = &self.spec
        {
            // The skipped call's recommendation still counts for the scale-down lookback.
            self.auto.repeat_recommendation(obs.now_s, rec, spec);
            self.planner_calls.1 += 1;
            return None;
        }
        let m = obs.model;
        if self
            .spec
            .as_ref()
            .is_none_or(|(p, _)| p.as_slice() != obs.parallelism)
        {
            let current: BTreeMap<String, u32> = m
                .ops
                .iter()
                .zip(obs.parallelism)
                .map(|(o, p)| (o.name.clone(), *p))
                .collect();
            self.spec = Some((obs.parallelism.to_vec(), m.spec.with_parallelism(&current)));
            self.shares = subtask_shares(m, obs.parallelism);
            self.samples.clear();
        }
        self.sync_samples(m, obs.window);
        let Some((_, spec)) = &self.spec else {
            return None;
        };
        self.planner_calls.0 += 1;
        match self
            .auto
            .decide(obs.now_s, self.samples.make_contiguous(), spec)
        {
            Verdict::Rescale(d) => Some(
                m.ops
                    .iter()
                    .zip(obs.parallelism)
                    .map(|(o, p)| d.parallelism.get(&o.name).copied().unwrap_or(*p))
                    .collect(),
            ),
            Verdict::Hold {
                recommendation: Some(_),
                ..
            } if self.auto.state().pending_scale_downs.is_empty() && !self.auto.used_history() => {
                if let Some(k) = key {
                    self.memo.insert(k, self.auto.lookback_needs().to_vec());
                }
                None
            }
            Verdict::Hold { .. } => None,
        }
    }
    fn restarted(&mut self, now_s: f64) {
        self.auto.restarted(now_s);
        self.samples.clear();
        // Held windows stay valid across deployments (their keys include the parallelism)
        // while the settings are the same (the rescale downtime reported may change them).
        if self.memo_settings.as_ref() != Some(self.auto.settings()) {
            self.memo.clear();
            self.memo_settings = Some(self.auto.settings().clone());
        }
    }
    fn rescaled(&mut self, downtime_s: f64) {
        if downtime_s > 0.0 {
            self.auto.observe_rescale_downtime(downtime_s);
        }
    }
    /// Calls of [`Autoscaler::decide`]: (made, skipped as stationary repeats).
    fn planner_calls(&self) -> Option<(u64, u64)> {
        Some(self.planner_calls)
    }
}

/// [`Streamscale`] with forecasting on: the same guarded planner, deciding from a job spec
/// whose `autoscaler.forecast` is `{mode: on}` (Holt-Winters on the input rate, see
/// `streamscale_controller::model::forecast`). The season is a day of trace time in simulated
/// seconds (86 400 / the first trace source's speedup; 86 400 without a trace) unless the job
/// sets `seasonSeconds`; bins are at least one metrics interval wide (default season / 288) and
/// the horizon is at least half the metric window plus one interval (the lag of a rate measured
/// over the window). Every window is planned (no memo of held windows: the history changes
/// with each one).
#[derive(Debug)]
pub struct StreamscaleForecast {
    inner: Streamscale,
    /// The job with forecasting on.
    model: JobModel,
}

impl StreamscaleForecast {
    /// Wraps `inner` (which loses its memo) for `model`.
    pub fn new(model: &JobModel, inner: Streamscale) -> StreamscaleForecast {
        let (interval_s, window_s) = (inner.interval_s, inner.window_s);
        let mut model = model.clone();
        let speedup = model.spec.operators.iter().find_map(|o| match &o.kind {
            streamscale_engine::spec::OperatorKind::Source {
                rate: streamscale_engine::spec::RateSpec::Trace(t),
                ..
            } => Some(t.speedup),
            _ => None,
        });
        let mut f = model.spec.autoscaler.forecast.clone().unwrap_or_else(|| {
            streamscale_engine::spec::ForecastSpec {
                season_seconds: 86_400.0 / speedup.unwrap_or(1.0),
                ..Default::default()
            }
        });
        f.mode = streamscale_engine::spec::ForecastMode::On;
        let bin = f
            .bin_seconds
            .unwrap_or(f.season_seconds / 288.0)
            .max(interval_s)
            .min(f.season_seconds / 2.0);
        f.bin_seconds = Some(bin);
        f.horizon_seconds = Some(
            f.horizon_seconds
                .unwrap_or((2.0 * bin).max(window_s / 2.0 + interval_s))
                .min(f.season_seconds),
        );
        model.spec.autoscaler.forecast = Some(f);
        StreamscaleForecast {
            inner: inner.without_memo(),
            model,
        }
    }
}

impl Policy for StreamscaleForecast {
    fn name(&self) -> &'static str {
        "streamscale-forecast"
    }
    fn interval_s(&self) -> f64 {
        self.inner.interval_s
    }
    fn window_s(&self) -> f64 {
        self.inner.window_s
    }
    fn decide(&mut self, obs: &Observation) -> Option<Vec<u32>> {
        let obs = Observation {
            now_s: obs.now_s,
            model: &self.model,
            parallelism: obs.parallelism,
            window: obs.window,
            started_s: obs.started_s,
            step_s: obs.step_s,
            next_arrivals: obs.next_arrivals,
            window_key: None,
        };
        self.inner.decide(&obs)
    }
    fn restarted(&mut self, now_s: f64) {
        self.inner.restarted(now_s);
    }
    fn rescaled(&mut self, downtime_s: f64) {
        self.inner.rescaled(downtime_s);
    }
    fn planner_calls(&self) -> Option<(u64, u64)> {
        self.inner.planner_calls()
    }
}
