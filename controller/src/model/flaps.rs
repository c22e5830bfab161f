//! Spiky traffic, recognised from the job's own rescales: a *flap* is a scale-up of an operator
//! within [`FLAP_GAP_S`] of its previous scale-down (the capacity released was needed again
//! soon, and the pair of rescales bought little). When the last [`MEMORY_S`] hold at least
//! [`SPIKY_FLAPS`] flaps, the job's traffic is taken as spiky and, for the settings the job
//! leaves unset, the guards switch to the profile that serves spikes with fewer rescales
//! (BENCHMARKS.md, "Rescale discipline"): the utilization band's upper end becomes 1.0 (a
//! scale-up needs ρ ≥ 1 or the latency bound over the SLO, not ρ above the target plus 0.1) and
//! the scale-down lookback at least [`SPIKY_LOOKBACK_S`], so that a spike that returns within
//! it finds the capacity still there. The profile ends once the window holds fewer flaps.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use streamscale_engine::spec::AutoscalerSpec;

/// A scale-up within this many seconds of the same operator's last scale-down is a flap.
pub const FLAP_GAP_S: f64 = 2700.0;
/// Flaps are counted over this many seconds (a week: traffic that was spiky on a weekday is
/// taken as spiky through a quiet weekend, so that the first spike after it is not two rescales
/// again).
pub const MEMORY_S: f64 = 7.0 * 86_400.0;
/// Flaps within [`MEMORY_S`] from which the traffic is taken as spiky.
pub const SPIKY_FLAPS: usize = 1;
/// The scale-down lookback of the spiky profile, seconds (at least; a longer one is kept).
pub const SPIKY_LOOKBACK_S: f64 = 2700.0;
/// The utilization band's upper end in the spiky profile.
pub const SPIKY_MAX_UTILIZATION: f64 = 1.0;

/// The job's recent scale-downs and flaps (seconds on the autoscaler's `now_s` clock).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FlapHistory {
    /// Per operator, when its last scale-down was decided.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub scale_down_s: BTreeMap<String, f64>,
    /// When each flap of the last [`MEMORY_S`] happened, oldest first.
    #[serde(default, skip_serializing_if = "VecDeque::is_empty")]
    pub flaps_s: VecDeque<f64>,
}

impl FlapHistory {
    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.scale_down_s.is_empty() && self.flaps_s.is_empty()
    }

    /// The same history on a clock `by` seconds ahead (every time plus `by`): to Unix time and
    /// back when it is saved and restored.
    pub fn shifted(&self, by: f64) -> FlapHistory {
        FlapHistory {
            scale_down_s: self
                .scale_down_s
                .iter()
                .map(|(op, t)| (op.clone(), t + by))
                .collect(),
            flaps_s: self.flaps_s.iter().map(|t| t + by).collect(),
        }
    }

    /// Whether every time is a finite number (a decoded history may hold anything).
    pub fn is_valid(&self) -> bool {
        self.scale_down_s
            .values()
            .chain(&self.flaps_s)
            .all(|t| t.is_finite())
    }

    /// Records a rescale decided at `now_s`: `changes` holds (operator, current, new
    /// parallelism) for every operator (unchanged ones included or not).
    pub fn record<'a>(
        &mut self,
        now_s: f64,
        changes: impl IntoIterator<Item = (&'a str, u32, u32)>,
    ) {
        let mut flapped = false;
        for (op, cur, new) in changes {
            if new < cur {
                self.scale_down_s.insert(op.to_string(), now_s);
            } else if new > cur
                && self
                    .scale_down_s
                    .get(op)
                    .is_some_and(|&t| within(now_s, t, FLAP_GAP_S))
            {
                flapped = true;
            }
        }
        if flapped {
            self.flaps_s.push_back(now_s);
        }
        self.forget(now_s);
    }

    /// Drops what is older than the memory at `now_s`, and what is later than `now_s` (a
    /// hand-edited or foreign learned state), which would otherwise count for ever.
    fn forget(&mut self, now_s: f64) {
        self.flaps_s.retain(|&t| within(now_s, t, MEMORY_S));
        self.scale_down_s
            .retain(|_, t| within(now_s, *t, FLAP_GAP_S));
    }

    /// Flaps within the last [`MEMORY_S`] before `now_s`.
    pub fn recent(&self, now_s: f64) -> usize {
        self.flaps_s
            .iter()
            .filter(|&&t| within(now_s, t, MEMORY_S))
            .count()
    }

    /// Whether the spiky profile applies at `now_s`.
    pub fn spiky(&self, now_s: f64) -> bool {
        self.recent(now_s) >= SPIKY_FLAPS
    }
}

/// Whether `t_s` is at most `span_s` before `now_s` (and not after it).
fn within(now_s: f64, t_s: f64, span_s: f64) -> bool {
    (0.0..=span_s).contains(&(now_s - t_s))
}

/// The guard settings in force: the job's, with the spiky profile's for those it leaves unset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Profile {
    /// Whether the spiky profile applies.
    pub spiky: bool,
    /// Utilization band (lower, upper).
    pub band: (f64, f64),
    /// Scale-down lookback, seconds.
    pub lookback_s: f64,
    /// How far back the recommendations are remembered, seconds: the lookback, or the spiky
    /// profile's when the job leaves the lookback unset (so that the profile, once it starts,
    /// finds the recommendations of the spikes that started it).
    pub memory_s: f64,
}

impl Profile {
    /// The settings of `spec` at an expected rescale downtime of `downtime_s`, spiky or not.
    pub fn of(spec: &AutoscalerSpec, downtime_s: Option<f64>, spiky: bool) -> Profile {
        let (low, high) = spec.utilization_band();
        let lookback = spec.scale_down_lookback(downtime_s);
        let memory_s = match spec.scale_down_lookback_seconds {
            Some(set) => set,
            None => lookback.max(SPIKY_LOOKBACK_S),
        };
        if !spiky {
            return Profile {
                spiky,
                band: (low, high),
                lookback_s: lookback,
                memory_s,
            };
        }
        Profile {
            spiky,
            band: (low, spec.max_utilization.unwrap_or(SPIKY_MAX_UTILIZATION)),
            lookback_s: memory_s,
            memory_s,
        }
    }

    /// The sentence for a decision's reasons when the spiky profile applies.
    pub fn note(&self, flaps: usize) -> String {
        format!(
            "spiky traffic: {flaps} scale-up{} in the last {} days came within {} min of a scale-down, so the utilization band's upper end is {} and the scale-down lookback {} s (settings the job leaves unset)",
            if flaps == 1 { "" } else { "s" },
            MEMORY_S / 86_400.0,
            FLAP_GAP_S / 60.0,
            self.band.1,
            self.lookback_s
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scale_up_soon_after_a_scale_down_is_a_flap() {
        let mut h = FlapHistory::default();
        h.record(0.0, [("a", 2, 1)]);
        h.record(1000.0, [("a", 1, 2)]);
        assert_eq!(h.recent(1000.0), 1);
        // Too long after the scale-down: no flap.
        h.record(2000.0, [("a", 2, 1)]);
        h.record(2000.0 + FLAP_GAP_S + 1.0, [("a", 1, 2)]);
        assert_eq!(h.recent(5000.0), 1);
        // Another operator's scale-down does not count.
        h.record(6000.0, [("b", 3, 2)]);
        h.record(6100.0, [("a", 2, 3)]);
        assert_eq!(h.recent(6100.0), 1);
    }

    #[test]
    fn the_profile_starts_at_the_threshold_and_ends_after_a_week() {
        let mut h = FlapHistory::default();
        for k in 0..SPIKY_FLAPS {
            let t = 1000.0 * k as f64;
            assert!(!h.spiky(t));
            h.record(t, [("a", 2, 1)]);
            h.record(t + 300.0, [("a", 1, 2)]);
        }
        let last = 1000.0 * (SPIKY_FLAPS - 1) as f64 + 300.0;
        assert!(h.spiky(last));
        assert!(h.spiky(300.0 + MEMORY_S - 1.0));
        assert!(!h.spiky(last + MEMORY_S + 1.0));
    }

    #[test]
    fn times_after_now_do_not_count() {
        // A learned state edited by hand (or from a machine whose clock ran ahead).
        let mut h = FlapHistory {
            flaps_s: [1e12; SPIKY_FLAPS].into_iter().collect(),
            scale_down_s: [("a".to_string(), 1e12)].into_iter().collect(),
        };
        assert!(!h.spiky(1000.0));
        h.record(1000.0, [("a", 1, 2)]);
        assert_eq!(h.recent(1000.0), 0, "a scale-up after a future scale-down");
        assert!(h.is_empty(), "{h:?}");
    }

    #[test]
    fn the_profile_fills_only_what_the_job_leaves_unset() {
        let mut spec = AutoscalerSpec::default();
        let calm = Profile::of(&spec, Some(0.6), false);
        assert_eq!(calm.band, spec.utilization_band());
        assert!((calm.lookback_s - 72.0).abs() < 1e-9);
        let spiky = Profile::of(&spec, Some(0.6), true);
        assert_eq!(spiky.band.1, 1.0);
        assert_eq!(spiky.lookback_s, SPIKY_LOOKBACK_S);
        spec.max_utilization = Some(0.9);
        spec.scale_down_lookback_seconds = Some(60.0);
        let set = Profile::of(&spec, Some(0.6), true);
        assert_eq!(set.band.1, 0.9);
        assert_eq!(set.lookback_s, 60.0);
        assert!(
            Profile::of(&AutoscalerSpec::default(), Some(0.6), true)
                .note(3)
                .contains("upper end is 1")
        );
    }
}
