//! The backoff after failed rescales as a resource's status keeps it (`status.backoff` of a
//! StreamJob or a FlinkScaler), so that an operator restart does not forget it. The waits are
//! the shared [`streamscale_controller::rescale::backoff::wait_after`] formula: 10 s after the
//! first failure in a row, doubling, at most 300 s. Pure: time comes in as an argument.

use std::collections::BTreeMap;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A parallelism that failed, with how often.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedParallelism {
    /// Parallelism per operator (per vertex name for a FlinkScaler).
    pub parallelism: BTreeMap<String, u32>,
    /// Failed attempts since the last completed rescale.
    pub failures: u32,
}

/// The backoff after failed rescales (cleared by a completed one).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackoffStatus {
    /// Failed rescales in a row.
    pub failures: u32,
    /// No rescale before this time (RFC 3339).
    pub retry_after: String,
    /// The parallelisms that failed.
    #[serde(default)]
    pub failed: Vec<FailedParallelism>,
}

impl BackoffStatus {
    /// The backoff after a rescale to `parallelism` failed at `now`, following `previous`;
    /// returns it with the wait in seconds.
    pub fn after_failure(
        previous: Option<&BackoffStatus>,
        parallelism: &BTreeMap<String, u32>,
        now: Timestamp,
    ) -> (BackoffStatus, f64) {
        let failures = previous.map_or(0, |b| b.failures).saturating_add(1);
        let wait = streamscale_controller::rescale::backoff::wait_after(failures);
        let mut failed = previous.map(|b| b.failed.clone()).unwrap_or_default();
        match failed.iter_mut().find(|f| &f.parallelism == parallelism) {
            Some(f) => f.failures = f.failures.saturating_add(1),
            None => failed.push(FailedParallelism {
                parallelism: parallelism.clone(),
                failures: 1,
            }),
        }
        let retry = now
            .checked_add(SignedDuration::from_secs_f64(wait))
            .unwrap_or(now);
        (
            BackoffStatus {
                failures,
                retry_after: retry.to_string(),
                failed,
            },
            wait,
        )
    }

    /// Holds rescales for the wait of its failures again, from `now` (the failure was recorded
    /// when the rescale started rolling back; the wait counts from the job running again).
    /// Returns the wait in seconds.
    pub fn hold_from(&mut self, now: Timestamp) -> f64 {
        let wait = streamscale_controller::rescale::backoff::wait_after(self.failures);
        self.retry_after = now
            .checked_add(SignedDuration::from_secs_f64(wait))
            .unwrap_or(now)
            .to_string();
        wait
    }

    /// Whether it still holds rescales at `now` (an unreadable `retryAfter` does not).
    pub fn holds_at(&self, now: Timestamp) -> bool {
        self.retry_after.parse::<Timestamp>().is_ok_and(|t| t > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(n: u32) -> BTreeMap<String, u32> {
        [("work".to_string(), n)].into_iter().collect()
    }

    #[test]
    fn waits_double_and_each_parallelism_is_counted() {
        let t0: Timestamp = "2026-12-06T00:00:00Z".parse().expect("time");
        let (b1, w1) = BackoffStatus::after_failure(None, &p(3), t0);
        assert_eq!((b1.failures, w1), (1, 10.0));
        assert_eq!(b1.retry_after, "2026-12-06T00:00:10Z");
        assert!(b1.holds_at(t0));
        assert!(!b1.holds_at("2026-12-06T00:00:10Z".parse().expect("time")));
        let (b2, w2) = BackoffStatus::after_failure(Some(&b1), &p(3), t0);
        let (b3, w3) = BackoffStatus::after_failure(Some(&b2), &p(2), t0);
        assert_eq!((w2, w3), (20.0, 40.0));
        assert_eq!(
            b3.failed,
            vec![
                FailedParallelism {
                    parallelism: p(3),
                    failures: 2
                },
                FailedParallelism {
                    parallelism: p(2),
                    failures: 1
                }
            ]
        );
        let mut again = b3.clone();
        let later: Timestamp = "2026-12-06T00:01:00Z".parse().expect("time");
        assert_eq!(again.hold_from(later), 40.0);
        assert_eq!(again.retry_after, "2026-12-06T00:01:40Z");
        let garbled = BackoffStatus {
            retry_after: "soon".into(),
            ..b3
        };
        assert!(!garbled.holds_at(t0));
    }
}
