//! The FlinkScaler's rescale steps as a pure function of the persisted step and what the
//! target and the Flink job show now (the reconciler acts on the answer and persists the next
//! step before acting, so that a restart anywhere resumes):
//!
//! `Requested` (the overrides are on the target, or are written again when they are not) ->
//! `Observed` (the Flink operator's `status.observedGeneration` reached the generation written;
//! without one, its `lastReconciledSpec` holds the overrides) -> done when every vertex of the job runs
//! at the new parallelism. Past the timeout (from the start of the rescale, or of the rollback)
//! or when the job fails, the previous overrides are put back (rollback); a rollback that times
//! out too is given up.
//!
//! This is not a backend of the bundled engine's machine
//! ([`streamscale_controller::rescale::machine`]): the FlinkScaler never takes a savepoint nor
//! deploys anything itself. It writes parallelism overrides onto the FlinkDeployment and the
//! Flink Kubernetes Operator does the savepoint and the redeploy, so its steps (overrides
//! written, seen by the Flink operator, job running) have no Savepointing or Redeploying step
//! to share. The backoff between failed attempts is [`crate::backoff_status`].

use std::collections::BTreeMap;

use crate::flink_scaler_crd::{FlinkRescaleStatus, FlinkRescaleStep};
use crate::flink_target::TargetView;

/// What the job shows now (`GET /jobs/:jid`).
#[derive(Debug, Clone, PartialEq)]
pub struct JobObs {
    /// Parallelism by vertex id.
    pub parallelism_by_id: BTreeMap<String, u32>,
    /// Every vertex `RUNNING`.
    pub all_running: bool,
    /// The job state is terminal (`FAILED`, `CANCELED`, `FINISHED`).
    pub ended: Option<String>,
    /// The job's id.
    pub job_id: String,
}

/// Whether the end of `job` fails rescale `r`. The job that ran when the rescale started
/// ([`FlinkRescaleStatus::job_id`]) stops in an upgrade (`FINISHED` after its savepoint,
/// `CANCELED` for `last-state`) before the Flink operator starts the new one, and while rolling
/// back it is the job that failed: its end is left to the timeout. A job failing in place
/// (`FAILED`, the same id, not rolling back) and the end of any later job fail it.
fn ended_fails(r: &FlinkRescaleStatus, job: &JobObs, state: &str) -> bool {
    if r.job_id.as_deref() != Some(job.job_id.as_str()) {
        return true;
    }
    state == "FAILED" && !r.rolling_back
}

/// What to do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Nothing yet; look again shortly.
    Wait,
    /// The target does not hold this step's overrides: write them (again).
    Write,
    /// The Flink operator has observed the overrides: step `Observed`.
    Observed,
    /// Every vertex runs at the asked parallelism, `seconds` after the (rollback's) start.
    Done {
        /// Seconds since `startedAt`.
        seconds: f64,
    },
    /// The new parallelism was not reached (why): put the previous overrides back.
    RollBack {
        /// Why.
        why: String,
    },
    /// The rollback did not get the job back either: stop driving it.
    GiveUp {
        /// Why.
        why: String,
    },
}

/// The next action for rescale `r` whose `to` is `to_by_id` by vertex id, `elapsed_s` after its
/// `startedAt`, with `timeout_s` to complete.
pub fn advance(
    r: &FlinkRescaleStatus,
    target: &TargetView,
    job: Option<&JobObs>,
    to_by_id: &BTreeMap<String, u32>,
    elapsed_s: f64,
    timeout_s: f64,
) -> Next {
    let at_target = job.is_some_and(|j| {
        j.all_running
            && j.ended.is_none()
            && !to_by_id.is_empty()
            && to_by_id
                .iter()
                .all(|(vid, p)| j.parallelism_by_id.get(vid) == Some(p))
    });
    let held = target.overrides().as_deref() == Some(r.overrides.as_str());
    if held && r.step == FlinkRescaleStep::Observed && at_target {
        return Next::Done { seconds: elapsed_s };
    }
    let failure = if let Some(state) =
        job.and_then(|j| j.ended.clone().filter(|state| ended_fails(r, j, state)))
    {
        Some(format!("the job ended ({state})"))
    } else if elapsed_s > timeout_s {
        Some(format!(
            "not running at {} within {timeout_s:.0} s",
            r.overrides
        ))
    } else {
        None
    };
    if let Some(why) = failure {
        return if r.rolling_back {
            Next::GiveUp { why }
        } else {
            Next::RollBack { why }
        };
    }
    if !held {
        return Next::Write;
    }
    match r.step {
        // A generation not recorded (a restart between the write and its status) is at most
        // the target's generation now, which holds the overrides.
        FlinkRescaleStep::Requested
            if target.observed(&r.overrides, r.target_generation.or(target.generation))
                || at_target =>
        {
            Next::Observed
        }
        _ => Next::Wait,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::flink_scaler_crd::OVERRIDES_KEY;

    fn rescale(step: FlinkRescaleStep, rolling_back: bool) -> FlinkRescaleStatus {
        FlinkRescaleStatus {
            step,
            from: [("a".to_string(), 1)].into(),
            to: [("a".to_string(), 2)].into(),
            overrides: "va:2".into(),
            previous_overrides: "va:1".into(),
            target_generation: Some(5),
            reason: "r".into(),
            rolling_back,
            started_at: "2026-12-04T10:00:00Z".into(),
            step_started_at: "2026-12-04T10:00:00Z".into(),
            job_id: Some("j0".into()),
        }
    }

    fn target(overrides: &str, observed_generation: i64) -> TargetView {
        TargetView::from_json(&json!({
            "metadata": {"generation": 5},
            "spec": {"flinkConfiguration": {OVERRIDES_KEY: overrides}},
            "status": {"observedGeneration": observed_generation},
        }))
    }

    fn job(p: u32, running: bool) -> JobObs {
        JobObs {
            parallelism_by_id: [("va".to_string(), p)].into(),
            all_running: running,
            ended: None,
            job_id: "j0".into(),
        }
    }

    fn to() -> BTreeMap<String, u32> {
        [("va".to_string(), 2)].into()
    }

    #[test]
    fn steps_requested_observed_done() {
        let req = rescale(FlinkRescaleStep::Requested, false);
        assert_eq!(
            advance(
                &req,
                &target("va:1", 4),
                Some(&job(1, true)),
                &to(),
                1.0,
                60.0
            ),
            Next::Write
        );
        assert_eq!(
            advance(
                &req,
                &target("va:2", 4),
                Some(&job(1, true)),
                &to(),
                1.0,
                60.0
            ),
            Next::Wait
        );
        assert_eq!(
            advance(
                &req,
                &target("va:2", 5),
                Some(&job(1, true)),
                &to(),
                1.0,
                60.0
            ),
            Next::Observed
        );
        let obs = rescale(FlinkRescaleStep::Observed, false);
        assert_eq!(
            advance(
                &obs,
                &target("va:2", 5),
                Some(&job(2, false)),
                &to(),
                3.0,
                60.0
            ),
            Next::Wait
        );
        assert_eq!(
            advance(
                &obs,
                &target("va:2", 5),
                Some(&job(2, true)),
                &to(),
                3.5,
                60.0
            ),
            Next::Done { seconds: 3.5 }
        );
        // The REST API unreachable: wait (until the timeout).
        assert_eq!(
            advance(&obs, &target("va:2", 5), None, &to(), 3.5, 60.0),
            Next::Wait
        );
    }

    #[test]
    fn timeout_or_failure_rolls_back_and_a_failed_rollback_gives_up() {
        let obs = rescale(FlinkRescaleStep::Observed, false);
        assert!(matches!(
            advance(
                &obs,
                &target("va:2", 5),
                Some(&job(1, true)),
                &to(),
                61.0,
                60.0
            ),
            Next::RollBack { .. }
        ));
        let mut ended = job(1, false);
        ended.ended = Some("FAILED".into());
        assert!(matches!(
            advance(&obs, &target("va:2", 5), Some(&ended), &to(), 2.0, 60.0),
            Next::RollBack { why } if why.contains("FAILED")
        ));
        let back = rescale(FlinkRescaleStep::Observed, true);
        assert!(matches!(
            advance(
                &back,
                &target("va:2", 5),
                Some(&job(1, true)),
                &to(),
                61.0,
                60.0
            ),
            Next::GiveUp { .. }
        ));
    }

    #[test]
    fn an_upgrade_stopping_the_old_job_is_not_a_failure_but_the_new_job_failing_is() {
        // The Flink operator's upgrade: the job of the rescale's start stops (savepoint or
        // last-state) while the target's jobId still names it.
        let obs = rescale(FlinkRescaleStep::Observed, false);
        for state in ["FINISHED", "CANCELED"] {
            let mut old = job(1, false);
            old.ended = Some(state.into());
            assert_eq!(
                advance(&obs, &target("va:2", 5), Some(&old), &to(), 2.0, 60.0),
                Next::Wait,
                "{state}"
            );
        }
        // ... but not for ever.
        let mut old = job(1, false);
        old.ended = Some("FINISHED".into());
        assert!(matches!(
            advance(&obs, &target("va:2", 5), Some(&old), &to(), 61.0, 60.0),
            Next::RollBack { .. }
        ));
        // The job started at the new parallelism ended: the rescale failed.
        let mut new = job(2, false);
        new.job_id = "j1".into();
        new.ended = Some("CANCELED".into());
        assert!(matches!(
            advance(&obs, &target("va:2", 5), Some(&new), &to(), 2.0, 60.0),
            Next::RollBack { why } if why.contains("CANCELED")
        ));
        // Rolling back from a job that failed: its FAILED state is what is rolled back from.
        let back = rescale(FlinkRescaleStep::Requested, true);
        let mut failed = job(2, false);
        failed.ended = Some("FAILED".into());
        assert_eq!(
            advance(&back, &target("va:1", 5), Some(&failed), &to(), 2.0, 60.0),
            Next::Write
        );
        // A status written before jobId was recorded: any end fails it, as before.
        let mut unknown = rescale(FlinkRescaleStep::Observed, false);
        unknown.job_id = None;
        assert!(matches!(
            advance(&unknown, &target("va:2", 5), Some(&old), &to(), 2.0, 60.0),
            Next::RollBack { .. }
        ));
    }
}
