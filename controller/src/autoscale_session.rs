//! One job under autoscaling: its metric window, the guarded [`Autoscaler`] that decides from
//! it, and where what it learns is kept ([`StateStore`]). Used by `streamscale run`,
//! `streamscale flink` and the operator's StreamJob and FlinkScaler reconcilers, which differ
//! only in the settings, the window's rule and the store they give it. No I/O but the store's.

use std::collections::VecDeque;

use streamscale_engine::spec::JobSpec;

use crate::model::{Autoscaler, GuardSettings, MetricSample, Verdict};
use crate::state_store::{Keep, LearnedState, StateFingerprint, StateStore, StateStoreError};

/// Which samples the window keeps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum WindowRule {
    /// Samples at most this many seconds old.
    Horizon(f64),
    /// Samples at most this many seconds old, and always the newest two (Flink's counters
    /// refresh irregularly: two are needed for a rate).
    HorizonKeepingTwo(f64),
    /// Always the newest two; older ones while the second oldest is less than this many seconds
    /// old (Flink's counters refresh irregularly: the window spans at least this long).
    SpanAtLeast(f64),
}

/// One job's autoscaling session (see the module docs). Times are seconds on the caller's
/// monotonic clock; `unix0` is the Unix time of that clock's zero.
#[derive(Debug)]
pub struct AutoscaleSession<S> {
    job: String,
    settings: GuardSettings,
    autoscaler: Autoscaler,
    window: VecDeque<MetricSample>,
    rule: WindowRule,
    store: S,
    keep: Keep,
    unix0: f64,
    saved: Option<StateFingerprint>,
}

impl<S> AutoscaleSession<S> {
    /// A session of job `job` deciding with `settings`, started (as after a restart: warm-up
    /// metrics are not representative) at `now_s`, its window kept by `rule`, what it learns
    /// (as much as `keep` says) kept in `store`.
    pub fn new(
        job: &str,
        settings: GuardSettings,
        now_s: f64,
        rule: WindowRule,
        store: S,
        keep: Keep,
        unix0: f64,
    ) -> AutoscaleSession<S> {
        let mut autoscaler = Autoscaler::new(settings.clone());
        autoscaler.restarted(now_s);
        AutoscaleSession {
            job: job.to_string(),
            settings,
            autoscaler,
            window: VecDeque::new(),
            rule,
            store,
            keep,
            unix0,
            saved: None,
        }
    }

    /// The autoscaler.
    pub fn autoscaler(&self) -> &Autoscaler {
        &self.autoscaler
    }

    /// The autoscaler, to tell it what happened (a measured rescale downtime, a plan not
    /// applied).
    pub fn autoscaler_mut(&mut self) -> &mut Autoscaler {
        &mut self.autoscaler
    }

    /// The window, oldest first.
    pub fn window(&self) -> &VecDeque<MetricSample> {
        &self.window
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The store, to change where it keeps the state.
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// Sets the window's rule (the job's settings changed).
    pub fn set_window_rule(&mut self, rule: WindowRule) {
        self.rule = rule;
    }

    /// Adds `sample` and drops what the rule no longer keeps at `now_s`.
    pub fn observe(&mut self, now_s: f64, sample: MetricSample) {
        self.window.push_back(sample);
        self.trim(now_s);
    }

    /// Adds `sample` without trimming (see [`AutoscaleSession::trim`]).
    pub fn push(&mut self, sample: MetricSample) {
        self.window.push_back(sample);
    }

    /// Drops the samples the rule no longer keeps at `now_s`.
    pub fn trim(&mut self, now_s: f64) {
        match self.rule {
            WindowRule::Horizon(s) => {
                while self
                    .window
                    .front()
                    .is_some_and(|f| now_s - f.at_seconds > s)
                {
                    self.window.pop_front();
                }
            }
            WindowRule::HorizonKeepingTwo(s) => {
                while self.window.len() > 2
                    && self
                        .window
                        .front()
                        .is_some_and(|f| now_s - f.at_seconds > s)
                {
                    self.window.pop_front();
                }
            }
            WindowRule::SpanAtLeast(s) => {
                while self.window.len() > 2 && now_s - self.window[1].at_seconds >= s {
                    self.window.pop_front();
                }
            }
        }
    }

    /// Forgets the window (its samples are not about the job as it runs now).
    pub fn clear_window(&mut self) {
        self.window.clear();
    }

    /// The job (re)started at `now_s` (a rescale, a restore, a change from outside): the window
    /// is forgotten and the guards' stabilization starts again.
    pub fn restarted(&mut self, now_s: f64) {
        self.window.clear();
        self.autoscaler.restarted(now_s);
    }

    /// The verdict at `now_s` on the window for the job as `spec` describes it.
    pub fn decide(&mut self, now_s: f64, spec: &JobSpec) -> Verdict {
        let window: Vec<MetricSample> = self.window.iter().cloned().collect();
        self.autoscaler.decide(now_s, &window, spec)
    }

    /// New settings for the same job: when they differ, a fresh autoscaler with them takes
    /// over what was learned and starts a stabilization at `now_s`.
    pub fn update_settings(&mut self, settings: GuardSettings, now_s: f64) {
        if self.settings == settings {
            return;
        }
        let learned = LearnedState::of(&self.job, &self.autoscaler, 0.0, self.keep_all());
        let mut fresh = Autoscaler::new(settings.clone());
        fresh.restarted(now_s);
        learned.restore_into(&mut fresh, 0.0);
        self.autoscaler = fresh;
        self.settings = settings;
    }

    fn keep_all(&self) -> Keep {
        Keep {
            baseline: true,
            downtime: true,
        }
    }

    /// What is learned now, as the store keeps it.
    pub fn state(&self) -> LearnedState {
        LearnedState::of(&self.job, &self.autoscaler, self.unix0, self.keep)
    }

    /// Puts `state` (as read from the store) into the autoscaler; the store is taken to hold
    /// it.
    pub fn restore(&mut self, state: &LearnedState) {
        state.restore_into(&mut self.autoscaler, self.unix0);
        self.saved = Some(StateFingerprint::of(state));
    }

    /// Takes the store to hold nothing of this job's (its state was read from elsewhere, e.g.
    /// an earlier version's files): the next save writes.
    pub fn forget_saved(&mut self) {
        self.saved = None;
    }

    /// What to write when the learned state changed since the store last held it (and is not
    /// empty), with its fingerprint for [`AutoscaleSession::saved`].
    pub fn unsaved(&self) -> Option<(StateFingerprint, LearnedState)> {
        let state = self.state();
        let fp = StateFingerprint::of(&state);
        (self.saved.as_ref() != Some(&fp) && !fp.is_empty()).then_some((fp, state))
    }

    /// The store now holds the state of fingerprint `fp`.
    pub fn saved(&mut self, fp: StateFingerprint) {
        self.saved = Some(fp);
    }
}

impl<S: StateStore> AutoscaleSession<S> {
    /// Reads the store and puts what it holds into the autoscaler; returns it.
    ///
    /// # Errors
    /// [`StateStoreError`] naming the store when it cannot be read or used (nothing learned).
    pub async fn load(&mut self) -> Result<Option<LearnedState>, StateStoreError> {
        let loaded = self.store.load().await?;
        if let Some(s) = &loaded {
            self.restore(s);
        }
        Ok(loaded)
    }

    /// Writes the learned state when it changed since the store last held it (and is not
    /// empty); returns whether it wrote.
    ///
    /// # Errors
    /// [`StateStoreError::Write`] naming the store.
    pub async fn save_if_changed(&mut self) -> Result<bool, StateStoreError> {
        let Some((fp, state)) = self.unsaved() else {
            return Ok(false);
        };
        self.store.save(&state).await?;
        self.saved = Some(fp);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SubtaskSample;

    /// A store in memory (a mock for these tests).
    #[derive(Default)]
    struct MockStore {
        held: Option<LearnedState>,
        writes: usize,
    }

    impl StateStore for MockStore {
        fn location(&self) -> String {
            "mock".into()
        }
        async fn load(&mut self) -> Result<Option<LearnedState>, StateStoreError> {
            Ok(self.held.clone())
        }
        async fn save(&mut self, state: &LearnedState) -> Result<(), StateStoreError> {
            self.held = Some(state.clone());
            self.writes += 1;
            Ok(())
        }
    }

    fn sample(at: f64) -> MetricSample {
        MetricSample {
            at_seconds: at,
            operators: [("a".to_string(), vec![SubtaskSample::default()])].into(),
        }
    }

    fn block<T>(f: impl std::future::Future<Output = T>) -> T {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(f)
    }

    fn session(rule: WindowRule, store: MockStore) -> AutoscaleSession<MockStore> {
        let keep = Keep {
            baseline: true,
            downtime: true,
        };
        AutoscaleSession::new("j", GuardSettings::default(), 0.0, rule, store, keep, 1e9)
    }

    #[test]
    fn the_window_follows_its_rule() {
        let mut s = session(WindowRule::Horizon(10.0), MockStore::default());
        for t in [0.0, 5.0, 10.0, 15.0] {
            s.observe(t, sample(t));
        }
        let at: Vec<f64> = s.window().iter().map(|x| x.at_seconds).collect();
        assert_eq!(at, [5.0, 10.0, 15.0]);
        let mut s = session(WindowRule::SpanAtLeast(10.0), MockStore::default());
        for t in [0.0, 5.0, 10.0, 15.0, 100.0] {
            s.observe(t, sample(t));
        }
        let at: Vec<f64> = s.window().iter().map(|x| x.at_seconds).collect();
        assert_eq!(at, [15.0, 100.0], "the newest two always stay");
        let mut s = session(WindowRule::HorizonKeepingTwo(10.0), MockStore::default());
        for t in [0.0, 5.0, 10.0, 15.0] {
            s.observe(t, sample(t));
        }
        let at: Vec<f64> = s.window().iter().map(|x| x.at_seconds).collect();
        assert_eq!(at, [5.0, 10.0, 15.0]);
        s.observe(100.0, sample(100.0));
        let at: Vec<f64> = s.window().iter().map(|x| x.at_seconds).collect();
        assert_eq!(at, [15.0, 100.0], "the newest two always stay");
        s.restarted(100.0);
        assert!(s.window().is_empty());
    }

    #[test]
    fn learned_state_is_loaded_and_written_only_when_it_changed() {
        let mut s = session(WindowRule::Horizon(10.0), MockStore::default());
        assert_eq!(block(s.load()), Ok(None));
        assert_eq!(block(s.save_if_changed()), Ok(false), "nothing learned");
        s.autoscaler_mut().observe_rescale_downtime(2.0);
        assert_eq!(block(s.save_if_changed()), Ok(true));
        assert_eq!(block(s.save_if_changed()), Ok(false), "unchanged");
        assert_eq!(s.store().writes, 1);
        let held = s.store().held.clone().expect("written");
        assert_eq!(held.rescale_downtime_seconds, Some(2.0));
        // A new session reads it back and does not write it again.
        let mut t = session(
            WindowRule::Horizon(10.0),
            MockStore {
                held: Some(held.clone()),
                writes: 0,
            },
        );
        assert_eq!(block(t.load()), Ok(Some(held)));
        assert_eq!(
            t.autoscaler().settings().planner.rescale_downtime_seconds,
            Some(2.0)
        );
        assert_eq!(block(t.save_if_changed()), Ok(false));
        // New settings carry what was learned over.
        let settings = GuardSettings {
            stabilization_seconds: 1.0,
            ..GuardSettings::default()
        };
        t.update_settings(settings.clone(), 5.0);
        assert_eq!(t.autoscaler().settings().stabilization_seconds, 1.0);
        assert_eq!(
            t.autoscaler().settings().planner.rescale_downtime_seconds,
            Some(2.0)
        );
        t.forget_saved();
        assert_eq!(block(t.save_if_changed()), Ok(true));
    }
}
