//! Backoff between rescale attempts while they keep failing (shared by `streamscale run`,
//! `streamscale flink` and the operators).

use std::collections::BTreeMap;

/// First wait after a failed rescale before the next attempt, seconds (Kubernetes'
/// CrashLoopBackOff starts at 10 s too).
pub const BACKOFF_FIRST_S: f64 = 10.0;
/// Longest wait between rescale attempts while they keep failing, seconds.
pub const BACKOFF_MAX_S: f64 = 300.0;

/// Seconds to wait after the `failures`-th failed rescale in a row (0 counts as 1):
/// [`BACKOFF_FIRST_S`]·2ⁿ⁻¹, at most [`BACKOFF_MAX_S`].
pub fn wait_after(failures: u32) -> f64 {
    (BACKOFF_FIRST_S * 2f64.powi(failures.clamp(1, 31) as i32 - 1)).min(BACKOFF_MAX_S)
}

/// Exponential backoff between rescale attempts while they fail: after the n-th failure in a
/// row no rescale is tried for [`BACKOFF_FIRST_S`]·2ⁿ⁻¹ seconds (at most [`BACKOFF_MAX_S`]),
/// whatever parallelism the planner wants next (an engine that cannot start one new
/// parallelism rarely starts another). The parallelisms that failed are remembered so the
/// hold can name them. A completed rescale clears it all. Pure: time comes in as arguments
/// (seconds on one monotonic clock).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RescaleBackoff {
    /// Failures in a row since the last completed rescale.
    failures: u32,
    /// No attempt before this time, seconds.
    until_s: f64,
    /// The parallelisms that failed, oldest first, each once, with how often it failed.
    failed: Vec<(BTreeMap<String, u32>, u32)>,
}

impl RescaleBackoff {
    /// Records a failed attempt at `parallelism` at `now_s`; returns the wait before the next
    /// attempt, seconds.
    pub fn failed(&mut self, now_s: f64, parallelism: &BTreeMap<String, u32>) -> f64 {
        self.failures = self.failures.saturating_add(1);
        let wait = wait_after(self.failures);
        self.until_s = now_s + wait;
        match self.failed.iter_mut().find(|(p, _)| p == parallelism) {
            Some((_, n)) => *n += 1,
            None => self.failed.push((parallelism.clone(), 1)),
        }
        wait
    }

    /// Records a completed rescale: the next failure waits [`BACKOFF_FIRST_S`] again.
    pub fn succeeded(&mut self) {
        *self = RescaleBackoff::default();
    }

    /// Failures in a row since the last completed rescale.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// How many times `parallelism` failed since the last completed rescale.
    pub fn failures_of(&self, parallelism: &BTreeMap<String, u32>) -> u32 {
        self.failed
            .iter()
            .find(|(p, _)| p == parallelism)
            .map_or(0, |(_, n)| *n)
    }

    /// Seconds left before a rescale may be tried at `now_s`; `None` when one may be tried.
    pub fn wait_at(&self, now_s: f64) -> Option<f64> {
        (self.failures > 0 && now_s < self.until_s).then_some(self.until_s - now_s)
    }

    /// When the next attempt may be made, seconds (meaningful while [`Self::failures`] > 0).
    pub fn until_s(&self) -> f64 {
        self.until_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn par(work: u32) -> BTreeMap<String, u32> {
        [("work".to_string(), work)].into_iter().collect()
    }

    #[test]
    fn backoff_doubles_per_failure_in_a_row_and_remembers_the_parallelism() {
        let mut b = RescaleBackoff::default();
        assert_eq!(b.wait_at(0.0), None);
        assert_eq!(b.failed(5.0, &par(4)), 10.0);
        assert_eq!(b.wait_at(6.0), Some(9.0));
        assert_eq!(b.wait_at(15.0), None);
        assert_eq!(b.failed(16.0, &par(4)), 20.0);
        assert_eq!(b.failed(40.0, &par(5)), 40.0);
        assert_eq!((b.failures_of(&par(4)), b.failures_of(&par(5))), (2, 1));
        for _ in 0..40 {
            b.failed(100.0, &par(4));
        }
        assert_eq!(b.wait_at(100.0), Some(BACKOFF_MAX_S));
        b.succeeded();
        assert_eq!(
            (b.failures(), b.failures_of(&par(4)), b.wait_at(100.0)),
            (0, 0, None)
        );
        assert_eq!(b.failed(200.0, &par(4)), BACKOFF_FIRST_S);
    }
}
