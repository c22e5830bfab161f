//! What the autoscaler learns about a job and keeps across restarts, and the one interface
//! through which it is kept ([`StateStore`]): a file ([`file::FileStateStore`]) in the report
//! directory for `streamscale run` and one per Flink job id for `streamscale flink`, a ConfigMap
//! for the Kubernetes operator (in the operator crate). All hold the same JSON ([`LearnedState`]).

use std::collections::BTreeMap;
use std::future::Future;

use serde::{Deserialize, Serialize};

use crate::model::flaps::FlapHistory;
use crate::model::forecast::RateHistory;
use crate::model::learn::{FACTOR_MAX, FACTOR_MIN, ScalabilityTracker};
use crate::model::{Autoscaler, expected_downtime};

pub mod file;

/// Version of the [`LearnedState`] encoding.
pub const STATE_VERSION: u32 = 1;

/// What the autoscaler learned about one job, as stored (JSON, camelCase):
/// `{"version": 1, "job": NAME, "history": RateHistory?, "scalability": ScalabilityTracker,
/// "rescaleDowntimeSeconds": SECONDS?, "rescaleDowntimesSeconds": [SECONDS]}`. The history's
/// times are Unix seconds.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LearnedState {
    /// Encoding version ([`STATE_VERSION`]).
    pub version: u32,
    /// The job's name (a state of another job is not used).
    pub job: String,
    /// Input-rate history of the forecast, times in Unix seconds (absent without forecasting).
    #[serde(default)]
    pub history: Option<RateHistory>,
    /// Scalability factors and ineffective-scaling flags learned from past rescales.
    #[serde(default)]
    pub scalability: ScalabilityTracker,
    /// Expected rescale downtime, seconds ([`crate::model::expected_downtime`] of
    /// `rescale_downtimes_seconds`; absent before the first rescale). A state written before
    /// the measurements were kept has this alone, and it is restored as one measurement.
    #[serde(default)]
    pub rescale_downtime_seconds: Option<f64>,
    /// The last measured rescale downtimes, seconds, oldest first (at most
    /// [`crate::model::DOWNTIMES_KEPT`] are used; absent when empty).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rescale_downtimes_seconds: Vec<f64>,
    /// The recent scale-downs and flaps of the spiky-traffic profile ([`crate::model::flaps`]),
    /// times in Unix seconds (absent when empty), so that a restart does not end the profile.
    #[serde(default, skip_serializing_if = "FlapHistory::is_empty")]
    pub flaps: FlapHistory,
}

/// What of the autoscaler's learning a store keeps beyond the history and the factors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keep {
    /// The last observation per operator (the baseline of the next rescale's comparison):
    /// kept where the job runs on at the same parallelism (the operator), not where the next
    /// run starts at the job's initial parallelism (`streamscale run`).
    pub baseline: bool,
    /// The measured rescale downtimes.
    pub downtime: bool,
}

impl LearnedState {
    /// The state to store from `autoscaler` for job `job`, its history moved to Unix time by
    /// `unix0` (the Unix time of the autoscaler's clock zero, seconds).
    pub fn of(job: &str, autoscaler: &Autoscaler, unix0: f64, keep: Keep) -> LearnedState {
        let h = autoscaler.rate_history();
        let mut scalability = autoscaler.scalability().clone();
        if !keep.baseline {
            scalability.last = BTreeMap::new();
        }
        LearnedState {
            version: STATE_VERSION,
            job: job.to_string(),
            history: (h.bin_seconds > 0.0 && (!h.bins.is_empty() || h.open.is_some()))
                .then(|| h.shifted(unix0)),
            scalability,
            rescale_downtime_seconds: expected_downtime(autoscaler.measured_downtimes())
                .filter(|_| keep.downtime),
            rescale_downtimes_seconds: if keep.downtime {
                autoscaler.measured_downtimes().collect()
            } else {
                Vec::new()
            },
            flaps: {
                let mut flaps = autoscaler.flaps().shifted(unix0);
                // The next run starts at the job's initial parallelism: a scale-up from there
                // is no flap of this run's scale-downs.
                if !keep.baseline {
                    flaps.scale_down_s.clear();
                }
                flaps
            },
        }
    }

    /// Puts this state into `autoscaler`, the history moved to its clock by `unix0` (the Unix
    /// time of its clock zero, seconds).
    pub fn restore_into(&self, autoscaler: &mut Autoscaler, unix0: f64) {
        if let Some(h) = &self.history {
            autoscaler.set_rate_history(h.shifted(-unix0));
        }
        autoscaler.set_scalability(self.scalability.clone());
        autoscaler.set_flaps(self.flaps.shifted(-unix0));
        // A state from before the measurements were kept has the expected value alone.
        let measured = match (
            &self.rescale_downtimes_seconds[..],
            self.rescale_downtime_seconds,
        ) {
            ([], Some(d)) => vec![d],
            (kept, _) => kept.to_vec(),
        };
        for d in measured {
            autoscaler.observe_rescale_downtime(d);
        }
    }

    /// Why a decoded state cannot be used, if it cannot: another version, an invalid history,
    /// a factor outside [`FACTOR_MIN`]..=[`FACTOR_MAX`] or a downtime that is not a finite
    /// number >= 0 (the expected one or a measured one).
    ///
    /// # Errors
    /// The problem, naming the field.
    pub fn check(&self) -> Result<(), String> {
        if self.version != STATE_VERSION {
            return Err(format!("version {} is not {STATE_VERSION}", self.version));
        }
        if let Some(h) = &self.history {
            h.validate().map_err(|e| e.to_string())?;
        }
        if !self.flaps.is_valid() {
            return Err("flaps holds a time that is not a finite number".into());
        }
        if let Some((op, v)) = self
            .scalability
            .factors
            .iter()
            .find(|(_, v)| !(FACTOR_MIN..=FACTOR_MAX).contains(*v))
        {
            return Err(format!(
                "factor {v} of `{op}` is outside [{FACTOR_MIN}, {FACTOR_MAX}]"
            ));
        }
        if self
            .rescale_downtime_seconds
            .is_some_and(|d| !(d.is_finite() && d >= 0.0))
        {
            return Err("rescaleDowntimeSeconds is not a finite number >= 0".into());
        }
        if let Some((i, d)) = self
            .rescale_downtimes_seconds
            .iter()
            .enumerate()
            .find(|(_, d)| !(d.is_finite() && **d >= 0.0))
        {
            return Err(format!(
                "rescaleDowntimesSeconds[{i}] = {d} is not a finite number >= 0"
            ));
        }
        Ok(())
    }

    /// Decodes `text` as the state of job `job`: `Ok(None)` for another job's state.
    ///
    /// # Errors
    /// The problem when the text does not parse or [`LearnedState::check`] rejects it.
    pub fn decode(text: &str, job: &str) -> Result<Option<LearnedState>, String> {
        let s: LearnedState = serde_json::from_str(text).map_err(|e| e.to_string())?;
        s.check()?;
        Ok((s.job == job).then_some(s))
    }

    /// Whether there is nothing learned in it.
    pub fn is_empty(&self) -> bool {
        StateFingerprint::of(self).is_empty()
    }
}

/// The parts of a [`LearnedState`] whose change is worth a write: the history's bins (a new
/// bin every `binSeconds`), the learned factors and flags, the downtime, the flaps.
#[derive(Debug, Clone, PartialEq)]
pub struct StateFingerprint {
    bins: usize,
    last_bin: Option<i64>,
    factors: BTreeMap<String, f64>,
    ineffective: Vec<String>,
    downtime: Option<f64>,
    downtimes: Vec<f64>,
    flaps: FlapHistory,
}

impl StateFingerprint {
    /// The fingerprint of `s`.
    pub fn of(s: &LearnedState) -> StateFingerprint {
        let bins = s.history.as_ref().map_or(&[][..], |h| &h.bins[..]);
        StateFingerprint {
            bins: bins.len(),
            last_bin: bins.last().map(|b| b.0),
            factors: s.scalability.factors.clone(),
            ineffective: s.scalability.ineffective.keys().cloned().collect(),
            downtime: s.rescale_downtime_seconds,
            downtimes: s.rescale_downtimes_seconds.clone(),
            flaps: s.flaps.clone(),
        }
    }

    /// Whether it is the fingerprint of a state with nothing learned.
    pub fn is_empty(&self) -> bool {
        self.bins == 0
            && self.factors.is_empty()
            && self.ineffective.is_empty()
            && self.downtime.is_none()
            && self.downtimes.is_empty()
            && self.flaps.is_empty()
    }
}

/// Errors of a [`StateStore`], each naming where the state is kept.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StateStoreError {
    /// The stored state could not be read (I/O, API server).
    #[error("{location}: cannot read the learned state: {problem}")]
    Read {
        /// Where: a file path, or `ConfigMap NS/NAME key state.json`.
        location: String,
        /// What went wrong.
        problem: String,
    },
    /// The stored state is not a valid [`LearnedState`] (or an older format of it); the job
    /// starts with nothing learned.
    #[error("{location}: learned state ignored ({problem}); starting with nothing learned")]
    Invalid {
        /// Where, and what became of it (e.g. `PATH` moved to `PATH.corrupt`).
        location: String,
        /// What is wrong.
        problem: String,
    },
    /// The state could not be written.
    #[error("{location}: cannot write the learned state: {problem}")]
    Write {
        /// Where.
        location: String,
        /// What went wrong.
        problem: String,
    },
}

/// Where one job's [`LearnedState`] is kept between runs or restarts.
pub trait StateStore {
    /// Where the state is kept, for messages (a file path, `ConfigMap NS/NAME`).
    fn location(&self) -> String;

    /// Reads the job's state: `Ok(None)` when there is none (or it belongs to another job).
    ///
    /// # Errors
    /// [`StateStoreError`] naming the location when it cannot be read or used.
    fn load(
        &mut self,
    ) -> impl Future<Output = Result<Option<LearnedState>, StateStoreError>> + Send;

    /// Writes `state` whole (or not at all).
    ///
    /// # Errors
    /// [`StateStoreError::Write`] naming the location.
    fn save(
        &mut self,
        state: &LearnedState,
    ) -> impl Future<Output = Result<(), StateStoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> LearnedState {
        LearnedState {
            version: STATE_VERSION,
            job: "j".into(),
            history: Some(RateHistory {
                bin_seconds: 1.0,
                season_seconds: 1e9,
                bins: vec![(1, 2.0), (2, 3.0)],
                ..RateHistory::default()
            }),
            scalability: ScalabilityTracker {
                factors: [("work".to_string(), 0.8)].into(),
                ..ScalabilityTracker::default()
            },
            rescale_downtime_seconds: Some(1.5),
            rescale_downtimes_seconds: vec![6.0, 1.5],
            flaps: FlapHistory {
                scale_down_s: [("work".to_string(), 1_700_000_000.0)].into(),
                flaps_s: [1_700_000_500.0].into(),
            },
        }
    }

    #[test]
    fn decode_checks_each_field_and_ignores_another_job() {
        let text = serde_json::to_string(&state()).expect("json");
        assert_eq!(LearnedState::decode(&text, "j"), Ok(Some(state())));
        assert_eq!(LearnedState::decode(&text, "other"), Ok(None));
        let bad = |f: &dyn Fn(&mut LearnedState)| {
            let mut s = state();
            f(&mut s);
            LearnedState::decode(&serde_json::to_string(&s).expect("json"), "j")
                .expect_err("rejected")
        };
        assert!(bad(&|s| s.version = 7).contains("version 7"));
        assert!(
            bad(&|s| {
                s.scalability.factors.insert("work".into(), 7.0);
            })
            .contains("factor 7 of `work`")
        );
        assert!(bad(&|s| s.rescale_downtime_seconds = Some(-1.0)).contains("rescaleDowntime"));
        assert!(
            bad(&|s| s.rescale_downtimes_seconds[1] = -2.0)
                .contains("rescaleDowntimesSeconds[1] = -2 is not")
        );
        assert!(
            bad(&|s| s.history.as_mut().expect("h").bins = vec![(2, 1.0), (1, 1.0)])
                .contains("not ascending")
        );
        assert!(LearnedState::decode("{", "j").is_err());
    }

    #[test]
    fn the_snapshot_keeps_what_the_store_keeps_and_restores_it() {
        use crate::model::GuardSettings;
        let mut a = Autoscaler::new(GuardSettings::default());
        let mut s = state();
        s.scalability.last.insert(
            "work".into(),
            crate::model::learn::Observed {
                parallelism: 2,
                true_processing_rate: Some(10.0),
                input_rate: 5.0,
                busiest_share: None,
            },
        );
        s.restore_into(&mut a, 100.0);
        assert_eq!(a.rate_history().bins[0].0, 1 - 100);
        // The flaps on the autoscaler's clock, so that the spiky profile goes on.
        assert_eq!(a.flaps().flaps_s.front(), Some(&(1_700_000_500.0 - 100.0)));
        assert!(a.flaps().spiky(1_700_000_600.0 - 100.0));
        let all = Keep {
            baseline: true,
            downtime: true,
        };
        assert_eq!(LearnedState::of("j", &a, 100.0, all), s);
        let none = LearnedState::of(
            "j",
            &a,
            100.0,
            Keep {
                baseline: false,
                downtime: false,
            },
        );
        assert!(none.scalability.last.is_empty() && none.rescale_downtime_seconds.is_none());
        // The next run starts afresh: no scale-down of this one for a flap, the flaps kept.
        assert!(none.flaps.scale_down_s.is_empty() && !none.flaps.flaps_s.is_empty());
        assert!(none.rescale_downtimes_seconds.is_empty());
        assert!(!none.is_empty());
        assert!(LearnedState::default().is_empty());
    }

    #[test]
    fn a_state_from_before_the_measurements_were_kept_restores_its_downtime() {
        use crate::model::GuardSettings;
        let text = r#"{"version": 1, "job": "j", "rescaleDowntimeSeconds": 3.6}"#;
        let s = LearnedState::decode(text, "j")
            .expect("decodes")
            .expect("job j");
        assert!(s.rescale_downtimes_seconds.is_empty());
        let mut a = Autoscaler::new(GuardSettings::default());
        s.restore_into(&mut a, 0.0);
        assert_eq!(a.settings().planner.rescale_downtime_seconds, Some(3.6));
        assert_eq!(a.measured_downtimes().collect::<Vec<_>>(), [3.6]);
        // The measurements restored decide, not the expected value beside them.
        let mut a = Autoscaler::new(GuardSettings::default());
        state().restore_into(&mut a, 0.0);
        assert_eq!(a.measured_downtimes().collect::<Vec<_>>(), [6.0, 1.5]);
        assert_eq!(a.settings().planner.rescale_downtime_seconds, Some(1.5));
    }
}
