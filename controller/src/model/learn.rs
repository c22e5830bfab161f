//! Learned correction of the planner's linear-scaling assumption, and detection of
//! ineffective scaling.
//!
//! The planner assumes that an operator's true processing rate per subtask μ (records/s) does
//! not change with its parallelism (DS2's linear scaling). Shared CPUs, contention or a shared
//! external system break that. After every rescale the [`ScalabilityTracker`] compares the
//! measured μ at the new parallelism with the one the planner predicted for it and keeps a
//! per-operator **scalability factor** f, the multiplier of μ the planner applies when it sizes
//! the operator above its current parallelism:
//!
//! * predicted μ at the new parallelism = μ_before · f (scale-up; the planner's own prediction)
//!   or μ_before (scale-down: the planner does not apply f there);
//! * measured / predicted = μ_after / predicted, and the implied factor of this step is
//!   f_step = μ_after / μ_before for a scale-up, μ_before / μ_after for a scale-down (the same
//!   per-doubling loss, observed in reverse);
//! * f ← clamp((1 − α) · f + α · f_step, [`FACTOR_MIN`], [`FACTOR_MAX`]), α = [`FACTOR_WEIGHT`].
//!
//! This is the fitting factor of Lohrmann et al., "Elastic stream processing with latency
//! guarantees" (ICDCS 2015, §V: measured / modelled, applied to the next prediction) and the
//! measured-vs-predicted correction of DRS (Fu et al., ICDCS 2015), reduced to one factor per
//! operator and smoothed so that one noisy window cannot swing it.
//!
//! The comparison uses the parallelism actually observed after the rescale, so the prediction
//! it is compared with is the one after the scaling bounds, maxParallelism and key-group
//! alignment were applied, not the unclamped DS2 value.
//!
//! **Ineffective scaling**: when after a scale-up the measured capacity is at most
//! [`ineffective_threshold`] (≈ [`INEFFECTIVE_GAIN`]) × the capacity before, more subtasks did
//! not help. The capacity is the input rate at which the busiest subtask saturates,
//! μ / s_max with s_max its share of the input ([`Observed::busiest_share`]; p · μ when the
//! load is even or the shares are unknown): when one hot key carries the input, s_max stays
//! 1 whatever the parallelism, so the first scale-up that does not move it is flagged. The
//! operator is flagged and not scaled up again until its metrics change (its μ per subtask or
//! its input rate moves by more than [`METRICS_CHANGE`] relative to when it was flagged).
//!
//! A flagged operator is planned back down to the parallelism its flat scale-up started from
//! (the smallest measured to give that capacity). When that scale-back keeps the capacity
//! (within [`INEFFECTIVE_GAIN`]) the flag stays, re-measured at the new parallelism; a
//! scale-down that loses capacity lifts it. Across a rescale the flag is never lifted for the
//! change of μ per subtask that the rescale itself causes.
//!
//! Pure: no clock, no I/O. A rescale is detected from a change of an operator's observed
//! parallelism between two observations, so the callers need no new API.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Smallest scalability factor kept (dimensionless).
pub const FACTOR_MIN: f64 = 0.25;
/// Largest scalability factor kept (dimensionless).
pub const FACTOR_MAX: f64 = 1.5;
/// Weight α of the newest observation in the factor's exponentially weighted mean.
pub const FACTOR_WEIGHT: f64 = 0.5;
/// A scale-up is ineffective when the total capacity after it is at most this multiple of the
/// total capacity before it.
pub const INEFFECTIVE_GAIN: f64 = 1.05;
/// Relative change of μ per subtask or of the input rate that lifts an ineffective-scaling flag.
pub const METRICS_CHANGE: f64 = 0.2;

/// One operator's measurements at one observation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Observed {
    /// Observed parallelism (subtasks reporting metrics).
    pub parallelism: u32,
    /// True processing rate per subtask μ, records/s (`None`: unknown in the window).
    pub true_processing_rate: Option<f64>,
    /// Total input rate, records/s.
    pub input_rate: f64,
    /// Share of the input the busiest subtask took (1/p when even, 1 when one subtask took
    /// all of it); `None` when unknown (no input in the window, or an older saved file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busiest_share: Option<f64>,
}

impl Observed {
    /// Capacity at true processing rate `mu` (records/s per subtask), records/s: the input
    /// rate at which the busiest subtask saturates, μ / max(s_max, 1/p); p · μ when
    /// [`Self::busiest_share`] is unknown or not in (0, 1].
    pub fn capacity(&self, mu: f64) -> f64 {
        let p = f64::from(self.parallelism.max(1));
        match self.busiest_share {
            Some(s) if s > 0.0 && s <= 1.0 => mu / s.max(1.0 / p),
            _ => p * mu,
        }
    }
}

/// An operator flagged for ineffective scaling.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ineffective {
    /// Parallelism before the scale-up.
    pub from: u32,
    /// Parallelism after it.
    pub to: u32,
    /// Capacity before ([`Observed::capacity`]), records/s.
    pub capacity_before: f64,
    /// Capacity after, records/s.
    pub capacity_after: f64,
    /// μ per subtask when flagged (records/s); the flag lifts when μ moves by > 20%.
    pub mu: f64,
    /// Input rate when flagged (records/s); the flag lifts when it moves by > 20%.
    pub input_rate: f64,
}

/// Per-operator memory of the learned correction (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ScalabilityTracker {
    /// The last observation per operator (the baseline a rescale is compared with).
    pub last: BTreeMap<String, Observed>,
    /// Scalability factor per operator (absent = 1).
    pub factors: BTreeMap<String, f64>,
    /// Operators flagged for ineffective scaling.
    pub ineffective: BTreeMap<String, Ineffective>,
}

/// The capacity ratio (after / before) at or under which a scale-up p0 → p1 counts as
/// ineffective: [`INEFFECTIVE_GAIN`], or half the linear gain 1 + (p1 − p0) / (2 · p0) when that
/// is smaller (so that a small step such as 40 → 41, whose linear gain is only 2.5%, is not
/// flagged when it scales linearly).
pub fn ineffective_threshold(p0: u32, p1: u32) -> f64 {
    let p0f = f64::from(p0.max(1));
    let half_linear = 1.0 + (f64::from(p1) - p0f) / (2.0 * p0f);
    INEFFECTIVE_GAIN.min(half_linear)
}

fn changed_by(new: f64, old: f64, fraction: f64) -> bool {
    let scale = old.abs().max(f64::MIN_POSITIVE);
    ((new - old).abs() / scale) > fraction
}

impl ScalabilityTracker {
    /// The scalability factor of `op` (1 when nothing was learned).
    pub fn factor(&self, op: &str) -> f64 {
        self.factors.get(op).copied().unwrap_or(1.0)
    }

    /// Whether `op` is flagged for ineffective scaling.
    pub fn is_ineffective(&self, op: &str) -> bool {
        self.ineffective.contains_key(op)
    }

    /// Takes one observation per (non-source) operator; where the parallelism changed since
    /// the previous observation (a rescale), updates the factor and the ineffective-scaling
    /// flag. Returns the notes for the decision's reasons. Invalid figures (non-finite or
    /// non-positive μ, input) update only the baseline.
    pub fn observe<'a>(
        &mut self,
        now: impl IntoIterator<Item = (&'a str, Observed)>,
    ) -> Vec<String> {
        let mut notes = Vec::new();
        for (op, cur) in now {
            // Replaced in place when known (no new key string per operator and call).
            let prev = match self.last.get_mut(op) {
                Some(slot) => Some(std::mem::replace(slot, cur)),
                None => self.last.insert(op.to_string(), cur),
            };
            self.learn(op, cur, prev, &mut notes);
        }
        self.flag_notes(&mut notes);
        notes
    }

    /// [`Self::observe`] with the observations `now` (distinct operators) and `by_name`, the
    /// positions of `now` in increasing operator-name order: the previous observations are
    /// found by one merge with [`Self::last`] (also in name order) instead of a lookup per
    /// operator. The same updates and notes in the same (`now`'s) order; a `by_name` out of
    /// order only costs lookups.
    pub fn observe_ordered(&mut self, now: &[(&str, Observed)], by_name: &[usize]) -> Vec<String> {
        let mut prev: Vec<Option<Observed>> = vec![None; now.len()];
        let mut missed = Vec::new();
        let mut last = self.last.iter_mut().peekable();
        for &k in by_name {
            let (op, cur) = now[k];
            while last.next_if(|(name, _)| name.as_str() < op).is_some() {}
            match last.next_if(|(name, _)| name.as_str() == op) {
                Some((_, slot)) => prev[k] = Some(std::mem::replace(slot, cur)),
                None => missed.push(k),
            }
        }
        for k in missed {
            let (op, cur) = now[k];
            prev[k] = match self.last.get_mut(op) {
                Some(slot) => Some(std::mem::replace(slot, cur)),
                None => self.last.insert(op.to_string(), cur),
            };
        }
        let mut notes = Vec::new();
        for (&(op, cur), prev) in now.iter().zip(prev) {
            self.learn(op, cur, prev, &mut notes);
        }
        self.flag_notes(&mut notes);
        notes
    }

    /// One operator's observation `cur` after its baseline was replaced (`prev`: the one it
    /// replaced): lifts its flag when its metrics changed and, after a rescale, updates its
    /// factor and flag, with notes.
    fn learn(&mut self, op: &str, cur: Observed, prev: Option<Observed>, notes: &mut Vec<String>) {
        let rescaled = prev.is_some_and(|p| p.parallelism != cur.parallelism);
        // Lift a flag whose metrics changed (not across a rescale: μ per subtask moves with
        // the parallelism by design there, and the rescale itself is judged below).
        if let (Some(flag), Some(mu)) = (self.ineffective.get(op), cur.true_processing_rate)
            && !rescaled
            && (changed_by(mu, flag.mu, METRICS_CHANGE)
                || changed_by(cur.input_rate, flag.input_rate, METRICS_CHANGE))
        {
            notes.push(format!(
                "{op}: ineffective-scaling flag lifted: μ or input changed by more than {:.0}% since it was flagged",
                METRICS_CHANGE * 100.0
            ));
            self.ineffective.remove(op);
        }
        let Some(prev) = prev else { return };
        if prev.parallelism == cur.parallelism {
            return;
        }
        let (Some(mu0), Some(mu1)) = (prev.true_processing_rate, cur.true_processing_rate) else {
            return;
        };
        if !(mu0.is_finite() && mu1.is_finite() && mu0 > 0.0 && mu1 > 0.0) {
            return;
        }
        let f_old = self.factor(op);
        let up = cur.parallelism > prev.parallelism;
        let predicted = if up { mu0 * f_old } else { mu0 };
        let f_step = if up { mu1 / mu0 } else { mu0 / mu1 };
        let f_new =
            ((1.0 - FACTOR_WEIGHT) * f_old + FACTOR_WEIGHT * f_step).clamp(FACTOR_MIN, FACTOR_MAX);
        self.factors.insert(op.to_string(), f_new);
        notes.push(format!(
            "{op}: after p={}→{} measured μ {:.2} rec/s per subtask vs predicted {:.2} (measured/predicted {:.2}); scalability factor {:.2} → {:.2}",
            prev.parallelism,
            cur.parallelism,
            mu1,
            predicted,
            mu1 / predicted,
            f_old,
            f_new
        ));
        let cap0 = prev.capacity(mu0);
        let cap1 = cur.capacity(mu1);
        if up && cap1 <= ineffective_threshold(prev.parallelism, cur.parallelism) * cap0 {
            self.ineffective.insert(
                op.to_string(),
                Ineffective {
                    from: prev.parallelism,
                    to: cur.parallelism,
                    capacity_before: cap0,
                    capacity_after: cap1,
                    mu: mu1,
                    input_rate: cur.input_rate,
                },
            );
        } else if let Some(flag) = self.ineffective.get_mut(op).filter(|f| {
            !up && cur.parallelism >= f.from && cap1 * INEFFECTIVE_GAIN >= f.capacity_after
        }) {
            // Scaled back down (towards the parallelism the flag started from) without losing
            // capacity: the flat capacity is confirmed, so the flag stays, measured anew here.
            flag.mu = mu1;
            flag.input_rate = cur.input_rate;
            notes.push(format!(
                "{op}: scaled back down p={}→{} at the same capacity ({:.2} rec/s vs {:.2}): still not scaled up",
                prev.parallelism, cur.parallelism, cap1, cap0
            ));
        } else {
            self.ineffective.remove(op);
        }
    }

    /// A note per flagged operator.
    fn flag_notes(&self, notes: &mut Vec<String>) {
        for (op, flag) in &self.ineffective {
            notes.push(format!(
                "{op}: ineffective scaling: capacity {:.2} rec/s at p={} vs {:.2} rec/s at p={} (≤ {INEFFECTIVE_GAIN}×; the rate at which its busiest subtask saturates); not scaled up again, nor its upstream for it, until its μ or input changes by more than {:.0}%",
                flag.capacity_after,
                flag.to,
                flag.capacity_before,
                flag.from,
                METRICS_CHANGE * 100.0
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn obs(p: u32, mu: f64, input: f64) -> Observed {
        Observed {
            parallelism: p,
            true_processing_rate: Some(mu),
            input_rate: input,
            busiest_share: None,
        }
    }

    fn obs_share(p: u32, mu: f64, input: f64, share: f64) -> Observed {
        Observed {
            busiest_share: Some(share),
            ..obs(p, mu, input)
        }
    }

    #[test]
    fn a_hot_key_that_stays_on_one_subtask_is_flagged() {
        // One key: the one subtask that owns it takes all of the input at p=1 and at p=3, at
        // the same μ. Total p · μ tripled, but the rate it can carry did not move.
        let mut t = ScalabilityTracker::default();
        t.observe([("counts", obs_share(1, 480.0, 800.0, 1.0))]);
        let notes = t.observe([("counts", obs_share(3, 480.0, 800.0, 1.0))]);
        assert!(t.is_ineffective("counts"), "{notes:?}");
        let flag = t.ineffective["counts"];
        assert_eq!((flag.capacity_before, flag.capacity_after), (480.0, 480.0));
        // Without the shares the same figures look linear: not flagged.
        let mut t = ScalabilityTracker::default();
        t.observe([("counts", obs(1, 480.0, 800.0))]);
        t.observe([("counts", obs(3, 480.0, 800.0))]);
        assert!(!t.is_ineffective("counts"));
    }

    #[test]
    fn skew_that_a_scale_up_spreads_is_not_flagged() {
        // The busiest subtask's share fell from 0.6 to 0.3: the capacity doubled.
        let mut t = ScalabilityTracker::default();
        t.observe([("counts", obs_share(2, 100.0, 150.0, 0.6))]);
        t.observe([("counts", obs_share(4, 100.0, 150.0, 0.3))]);
        assert!(!t.is_ineffective("counts"));
        // Even shares give p · μ (a share below 1/p is read as 1/p).
        assert_eq!(obs_share(4, 100.0, 150.0, 0.25).capacity(100.0), 400.0);
        assert_eq!(obs_share(4, 100.0, 150.0, 0.1).capacity(100.0), 400.0);
        assert_eq!(obs_share(4, 100.0, 150.0, f64::NAN).capacity(100.0), 400.0);
    }

    #[test]
    fn linear_scaling_keeps_the_factor_at_one() {
        let mut t = ScalabilityTracker::default();
        t.observe([("map", obs(2, 100.0, 150.0))]);
        let notes = t.observe([("map", obs(4, 100.0, 300.0))]);
        assert_eq!(t.factor("map"), 1.0);
        assert!(!t.is_ineffective("map"));
        assert!(notes[0].contains("measured/predicted 1.00"), "{notes:?}");
    }

    #[test]
    fn sub_linear_scaling_lowers_the_factor() {
        let mut t = ScalabilityTracker::default();
        t.observe([("map", obs(2, 100.0, 150.0))]);
        t.observe([("map", obs(4, 60.0, 200.0))]);
        // (1 − 0.5) · 1 + 0.5 · 0.6 = 0.8; capacity 240 > 1.05 · 200: not ineffective.
        assert!((t.factor("map") - 0.8).abs() < 1e-12);
        assert!(!t.is_ineffective("map"));
    }

    #[test]
    fn flat_capacity_is_flagged_until_metrics_change() {
        let mut t = ScalabilityTracker::default();
        t.observe([("map", obs(2, 100.0, 200.0))]);
        let notes = t.observe([("map", obs(4, 52.0, 200.0))]);
        assert!(t.is_ineffective("map"));
        assert!(notes.iter().any(|n| n.contains("ineffective scaling")));
        // Small changes keep the flag; a 25% change of the input lifts it.
        t.observe([("map", obs(4, 55.0, 220.0))]);
        assert!(t.is_ineffective("map"));
        t.observe([("map", obs(4, 55.0, 250.0))]);
        assert!(!t.is_ineffective("map"));
    }

    #[test]
    fn the_flag_survives_a_scale_back_that_keeps_the_capacity() {
        let mut t = ScalabilityTracker::default();
        t.observe([("map", obs(5, 40.0, 200.0))]);
        t.observe([("map", obs(17, 200.0 / 17.0, 200.0))]);
        assert!(t.is_ineffective("map"));
        // Back to 5: μ per subtask rose 3.4× (the rescale's own doing), capacity unchanged.
        let notes = t.observe([("map", obs(5, 40.0, 200.0))]);
        assert!(t.is_ineffective("map"), "{notes:?}");
        assert_eq!(t.ineffective["map"].mu, 40.0);
        // Down to 2 at half the capacity: the flag lifts.
        t.observe([("map", obs(2, 50.0, 100.0))]);
        assert!(!t.is_ineffective("map"));
    }

    proptest! {
        #[test]
        fn factor_stays_bounded(steps in proptest::collection::vec((1u32..64, 0.1f64..1e4), 1..30)) {
            let mut t = ScalabilityTracker::default();
            for (p, mu) in steps {
                t.observe([("op", obs(p, mu, 100.0))]);
                let f = t.factor("op");
                prop_assert!((FACTOR_MIN..=FACTOR_MAX).contains(&f), "{f}");
            }
        }

        #[test]
        fn constant_mu_never_changes_the_factor(ps in proptest::collection::vec(1u32..64, 1..30), mu in 0.1f64..1e4) {
            let mut t = ScalabilityTracker::default();
            for p in ps {
                t.observe([("op", obs(p, mu, 100.0))]);
                prop_assert_eq!(t.factor("op"), 1.0);
                prop_assert!(!t.is_ineffective("op"));
            }
        }

        /// The merge finds the same baselines as the lookups: the same tracker and notes after
        /// every round, with the name order right, reversed (wrong), or missing operators.
        #[test]
        fn observe_ordered_matches_observe(
            rounds in proptest::collection::vec(
                proptest::collection::vec((0usize..8, 1u32..6, 10.0f64..200.0, 10.0f64..400.0), 1..8),
                1..6,
            ),
            reverse in any::<bool>(),
        ) {
            const NAMES: [&str; 8] = ["a", "b0", "b1", "c", "map", "sink", "x", "z9"];
            let (mut looked, mut merged) = (ScalabilityTracker::default(), ScalabilityTracker::default());
            for round in rounds {
                // Distinct operators, in an order that is not the name order.
                let mut now: Vec<(&str, Observed)> = Vec::new();
                for (k, p, mu, input) in round.into_iter().rev() {
                    if now.iter().all(|(n, _)| *n != NAMES[k]) {
                        let share = 1.0 / f64::from(p);
                        now.push((NAMES[k], obs_share(p, mu, input, share)));
                    }
                }
                let mut by_name: Vec<usize> = (0..now.len()).collect();
                by_name.sort_by_key(|&k| now[k].0);
                if reverse {
                    by_name.reverse();
                }
                let a = looked.observe(now.iter().copied());
                let b = merged.observe_ordered(&now, &by_name);
                prop_assert_eq!(a, b);
                prop_assert_eq!(&looked, &merged);
            }
        }
    }
}
