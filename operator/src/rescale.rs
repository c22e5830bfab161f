//! The rescale state machine: Savepointing → Redeploying → Restoring → Running.
//!
//! [`advance`] is pure: from the rescale persisted in status and what the reconciler observed
//! (engine, savepoint, workload), it returns the next persisted rescale (or the end of the
//! rescale) and one action. The reconciler writes the returned status *before* it performs the
//! action, so an operator that dies at any point finds in status what it was about to do and
//! resumes (actions are idempotent) or rolls back:
//!
//! * a failed savepoint ends the rescale with the job running at the old parallelism;
//! * a restore at the new parallelism that fails or times out redeploys the old parallelism
//!   from the same savepoint (`rollingBack`);
//! * an engine that is gone before its savepoint was recorded is redeployed at the old
//!   parallelism from the savepoint it was started from.

use std::collections::BTreeMap;

use crate::crd::{RescaleStatus, RescaleStep};

/// The engine as seen through its REST API.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineObs {
    /// No answer.
    Unreachable,
    /// `GET /v1/job` answered.
    Up {
        /// `running`, `stopping`, `stopped`, `finished` or `failed`.
        state: String,
        /// Parallelism per operator.
        parallelism: BTreeMap<String, u32>,
        /// The savepoint this engine was restored from.
        restored_from: Option<String>,
    },
}

/// The requested savepoint as seen through `GET /v1/savepoints/{id}`.
#[derive(Debug, Clone, PartialEq)]
pub enum SavepointObs {
    /// No savepoint was requested yet, or it was not asked about.
    NotAsked,
    /// Still being written.
    Pending,
    /// Completed at this path.
    Completed(String),
    /// Failed with this reason.
    Failed(String),
    /// The engine could not be asked (it exits after a completed stop-with-savepoint).
    Unknown,
}

/// The engine workload as deployed (from its pod template).
#[derive(Debug, Clone, PartialEq)]
pub struct WorkloadObs {
    /// `--parallelism` of the pod template.
    pub parallelism: BTreeMap<String, u32>,
    /// `--restore` of the pod template.
    pub restore: Option<String>,
}

/// Everything [`advance`] looks at besides the persisted rescale.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// The engine.
    pub engine: EngineObs,
    /// The savepoint named by `savepointId`.
    pub savepoint: SavepointObs,
    /// The deployed workload, if it exists.
    pub workload: Option<WorkloadObs>,
    /// Seconds since the current step was entered.
    pub step_age_s: f64,
    /// The savepoint the job ran from before the rescale (to fall back to).
    pub previous_restore: Option<String>,
    /// Directory the engine writes savepoints to (a savepoint's path is `DIR/ID`).
    pub savepoint_dir: String,
}

/// What the reconciler does after persisting the new status.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Nothing yet: look again shortly.
    Wait,
    /// Request a stop-with-savepoint, then record its id in `savepointId`.
    TriggerSavepoint,
    /// Apply the workload at this parallelism, restored from this savepoint.
    Deploy {
        /// Parallelism per operator.
        parallelism: BTreeMap<String, u32>,
        /// Savepoint to restore from.
        restore: Option<String>,
    },
}

/// How a rescale ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The job runs at the target parallelism, restored from the savepoint.
    Rescaled {
        /// The new parallelism.
        parallelism: BTreeMap<String, u32>,
        /// The savepoint it runs from.
        savepoint: String,
    },
    /// The savepoint failed: the job keeps running at the old parallelism.
    SavepointFailed {
        /// Why.
        reason: String,
    },
    /// The restore failed and the job runs again at the old parallelism from the savepoint.
    RolledBack {
        /// The old parallelism.
        parallelism: BTreeMap<String, u32>,
        /// The savepoint it runs from.
        savepoint: Option<String>,
    },
    /// Not even the old parallelism could be restored; the job needs a person.
    Failed {
        /// Why.
        reason: String,
    },
}

/// The result of one [`advance`].
#[derive(Debug, Clone, PartialEq)]
pub struct Transition {
    /// The rescale to persist; `None` when it ended (see `outcome`).
    pub rescale: Option<RescaleStatus>,
    /// What to do after persisting it.
    pub action: Action,
    /// Set when the rescale ended.
    pub outcome: Option<Outcome>,
    /// A line for the Kubernetes Event of a step change (`None` when nothing changed).
    pub event: Option<String>,
}

/// Seconds a redeployed engine may take to run the restored job before the restore counts as
/// failed (and is rolled back).
pub const RESTORE_TIMEOUT_S: f64 = 120.0;
/// Seconds a savepoint may stay pending or the engine unreachable while savepointing.
pub const SAVEPOINT_TIMEOUT_S: f64 = 120.0;

fn stay(r: &RescaleStatus, action: Action) -> Transition {
    Transition {
        rescale: Some(r.clone()),
        action,
        outcome: None,
        event: None,
    }
}

fn enter(
    r: &RescaleStatus,
    step: RescaleStep,
    now: &str,
    action: Action,
    event: String,
) -> Transition {
    let mut next = r.clone();
    next.step = step;
    next.step_started_at = now.to_string();
    Transition {
        rescale: Some(next),
        action,
        outcome: None,
        event: Some(event),
    }
}

fn end(outcome: Outcome, event: String) -> Transition {
    Transition {
        rescale: None,
        action: Action::Wait,
        outcome: Some(outcome),
        event: Some(event),
    }
}

fn roll_back(r: &RescaleStatus, now: &str, restore: Option<String>, why: &str) -> Transition {
    let mut next = r.clone();
    next.to = r.from.clone();
    next.rolling_back = true;
    next.savepoint_path = restore.clone();
    next.step = RescaleStep::Redeploying;
    next.step_started_at = now.to_string();
    Transition {
        rescale: Some(next),
        action: Action::Deploy {
            parallelism: r.from.clone(),
            restore: restore.clone(),
        },
        outcome: None,
        event: Some(format!(
            "{why}; rolling back to the old parallelism from {}",
            restore.as_deref().unwrap_or("a fresh start")
        )),
    }
}

/// The next state of the rescale `r` given `obs`, at time `now` (RFC 3339, stored in status).
pub fn advance(r: &RescaleStatus, obs: &Observation, now: &str) -> Transition {
    match r.step {
        RescaleStep::Savepointing => match (&r.savepoint_id, &obs.savepoint) {
            (None, _) => match &obs.engine {
                EngineObs::Up { state, .. } if state == "running" => {
                    stay(r, Action::TriggerSavepoint)
                }
                _ if obs.step_age_s < SAVEPOINT_TIMEOUT_S
                    && obs.engine == EngineObs::Unreachable =>
                {
                    stay(r, Action::Wait)
                }
                // The engine is stopping or gone but no savepoint id was recorded (the operator
                // died between requesting it and writing the id): fall back to the savepoint
                // the job was running from.
                _ => roll_back(
                    r,
                    now,
                    obs.previous_restore.clone(),
                    "engine stopped without a recorded savepoint",
                ),
            },
            (Some(_), SavepointObs::Pending) if obs.step_age_s < SAVEPOINT_TIMEOUT_S => {
                stay(r, Action::Wait)
            }
            (Some(_), SavepointObs::Pending) => {
                roll_back(r, now, obs.previous_restore.clone(), "savepoint timed out")
            }
            (Some(_), SavepointObs::Completed(path)) => {
                let mut next = r.clone();
                next.savepoint_path = Some(path.clone());
                enter(
                    &next,
                    RescaleStep::Redeploying,
                    now,
                    Action::Deploy {
                        parallelism: r.to.clone(),
                        restore: Some(path.clone()),
                    },
                    format!(
                        "savepoint {path} completed; redeploying at {}",
                        fmt_p(&r.to)
                    ),
                )
            }
            (Some(_), SavepointObs::Failed(reason)) => end(
                Outcome::SavepointFailed {
                    reason: reason.clone(),
                },
                format!(
                    "savepoint failed ({reason}); the job keeps running at {}",
                    fmt_p(&r.from)
                ),
            ),
            // The engine exits after a completed stop-with-savepoint has been read, so it may no
            // longer answer, or a restarted engine may not know the id: the savepoint is then
            // DIR/ID (if it is not complete there, the restore fails and rolls back).
            (Some(id), SavepointObs::Unknown | SavepointObs::NotAsked) => {
                let path = format!("{}/{}", obs.savepoint_dir.trim_end_matches('/'), id);
                let mut next = r.clone();
                next.savepoint_path = Some(path.clone());
                enter(
                    &next,
                    RescaleStep::Redeploying,
                    now,
                    Action::Deploy {
                        parallelism: r.to.clone(),
                        restore: Some(path.clone()),
                    },
                    format!(
                        "engine stopped with savepoint {path}; redeploying at {}",
                        fmt_p(&r.to)
                    ),
                )
            }
        },
        RescaleStep::Redeploying => {
            let want = WorkloadObs {
                parallelism: r.to.clone(),
                restore: r.savepoint_path.clone(),
            };
            if obs.workload.as_ref() == Some(&want) {
                enter(
                    r,
                    RescaleStep::Restoring,
                    now,
                    Action::Wait,
                    format!("workload redeployed at {}; restoring", fmt_p(&r.to)),
                )
            } else {
                stay(
                    r,
                    Action::Deploy {
                        parallelism: want.parallelism,
                        restore: want.restore,
                    },
                )
            }
        }
        RescaleStep::Restoring => {
            let restored = match &obs.engine {
                EngineObs::Up {
                    state,
                    parallelism,
                    restored_from,
                } if state == "running"
                    && *parallelism == r.to
                    && *restored_from == r.savepoint_path =>
                {
                    Some(true)
                }
                EngineObs::Up { state, .. } if state == "failed" => Some(false),
                _ if obs.step_age_s >= RESTORE_TIMEOUT_S => Some(false),
                _ => None,
            };
            match (restored, r.rolling_back) {
                (None, _) => stay(r, Action::Wait),
                (Some(true), false) => end(
                    Outcome::Rescaled {
                        parallelism: r.to.clone(),
                        savepoint: r.savepoint_path.clone().unwrap_or_default(),
                    },
                    format!("rescaled {} -> {}", fmt_p(&r.from), fmt_p(&r.to)),
                ),
                (Some(true), true) => end(
                    Outcome::RolledBack {
                        parallelism: r.from.clone(),
                        savepoint: r.savepoint_path.clone(),
                    },
                    format!("rolled back to {}", fmt_p(&r.from)),
                ),
                (Some(false), false) => roll_back(
                    r,
                    now,
                    r.savepoint_path.clone(),
                    &format!("restore at {} failed", fmt_p(&r.to)),
                ),
                (Some(false), true) => end(
                    Outcome::Failed {
                        reason: format!(
                            "restoring the old parallelism {} from {} failed too",
                            fmt_p(&r.from),
                            r.savepoint_path.as_deref().unwrap_or("a fresh start")
                        ),
                    },
                    "rollback failed; the job needs attention".to_string(),
                ),
            }
        }
    }
}

/// `op=N,op=N`.
pub fn fmt_p(p: &BTreeMap<String, u32>) -> String {
    streamscale_controller::runtime::parallelism_arg(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn rescale() -> RescaleStatus {
        RescaleStatus {
            step: RescaleStep::Savepointing,
            from: p(&[("map", 1)]),
            to: p(&[("map", 3)]),
            reason: "test".into(),
            savepoint_id: None,
            savepoint_path: None,
            rolling_back: false,
            started_at: "t0".into(),
            step_started_at: "t0".into(),
        }
    }

    fn obs(engine: EngineObs, savepoint: SavepointObs) -> Observation {
        Observation {
            engine,
            savepoint,
            workload: Some(WorkloadObs {
                parallelism: p(&[("map", 1)]),
                restore: None,
            }),
            step_age_s: 1.0,
            previous_restore: None,
            savepoint_dir: "/sp".into(),
        }
    }

    fn up(state: &str, par: BTreeMap<String, u32>, from: Option<&str>) -> EngineObs {
        EngineObs::Up {
            state: state.into(),
            parallelism: par,
            restored_from: from.map(String::from),
        }
    }

    #[test]
    fn happy_path_walks_every_step() {
        let r = rescale();
        let t = advance(
            &r,
            &obs(
                up("running", p(&[("map", 1)]), None),
                SavepointObs::NotAsked,
            ),
            "t1",
        );
        assert_eq!(t.action, Action::TriggerSavepoint);
        let mut r = t.rescale.unwrap();
        r.savepoint_id = Some("sp-1".into());

        let t = advance(
            &r,
            &obs(
                up("stopping", p(&[("map", 1)]), None),
                SavepointObs::Pending,
            ),
            "t2",
        );
        assert_eq!(t.action, Action::Wait);

        let t = advance(
            &r,
            &obs(
                up("stopped", p(&[("map", 1)]), None),
                SavepointObs::Completed("/sp/sp-1".into()),
            ),
            "t3",
        );
        let r = t.rescale.unwrap();
        assert_eq!(r.step, RescaleStep::Redeploying);
        assert_eq!(r.step_started_at, "t3");
        assert_eq!(
            t.action,
            Action::Deploy {
                parallelism: p(&[("map", 3)]),
                restore: Some("/sp/sp-1".into())
            }
        );

        let mut o = obs(EngineObs::Unreachable, SavepointObs::NotAsked);
        o.workload = Some(WorkloadObs {
            parallelism: p(&[("map", 3)]),
            restore: Some("/sp/sp-1".into()),
        });
        let t = advance(&r, &o, "t4");
        let r = t.rescale.unwrap();
        assert_eq!(r.step, RescaleStep::Restoring);

        o.engine = up("running", p(&[("map", 3)]), Some("/sp/sp-1"));
        let t = advance(&r, &o, "t5");
        assert!(t.rescale.is_none());
        assert_eq!(
            t.outcome,
            Some(Outcome::Rescaled {
                parallelism: p(&[("map", 3)]),
                savepoint: "/sp/sp-1".into()
            })
        );
    }

    #[test]
    fn failed_savepoint_keeps_old_parallelism() {
        let mut r = rescale();
        r.savepoint_id = Some("sp-1".into());
        let t = advance(
            &r,
            &obs(
                up("running", p(&[("map", 1)]), None),
                SavepointObs::Failed("disk full".into()),
            ),
            "t",
        );
        assert!(t.rescale.is_none());
        assert!(matches!(t.outcome, Some(Outcome::SavepointFailed { .. })));
        assert_eq!(t.action, Action::Wait);
    }

    #[test]
    fn redeploying_is_resumed_until_the_workload_matches() {
        let mut r = rescale();
        r.step = RescaleStep::Redeploying;
        r.savepoint_path = Some("/sp/sp-1".into());
        let t = advance(
            &r,
            &obs(EngineObs::Unreachable, SavepointObs::NotAsked),
            "t",
        );
        assert_eq!(t.rescale.unwrap().step, RescaleStep::Redeploying);
        assert!(matches!(t.action, Action::Deploy { .. }));
        assert!(t.event.is_none());
    }

    #[test]
    fn failed_restore_rolls_back_from_the_same_savepoint() {
        let mut r = rescale();
        r.step = RescaleStep::Restoring;
        r.savepoint_path = Some("/sp/sp-1".into());
        let t = advance(
            &r,
            &obs(
                up("failed", p(&[("map", 3)]), Some("/sp/sp-1")),
                SavepointObs::NotAsked,
            ),
            "t",
        );
        let next = t.rescale.unwrap();
        assert!(next.rolling_back);
        assert_eq!(next.step, RescaleStep::Redeploying);
        assert_eq!(next.to, p(&[("map", 1)]));
        assert_eq!(
            t.action,
            Action::Deploy {
                parallelism: p(&[("map", 1)]),
                restore: Some("/sp/sp-1".into())
            }
        );
        // Restoring the rollback succeeds.
        let mut back = next;
        back.step = RescaleStep::Restoring;
        let t = advance(
            &back,
            &obs(
                up("running", p(&[("map", 1)]), Some("/sp/sp-1")),
                SavepointObs::NotAsked,
            ),
            "t",
        );
        assert!(matches!(t.outcome, Some(Outcome::RolledBack { .. })));
    }

    #[test]
    fn restore_timeout_rolls_back_and_a_failed_rollback_fails() {
        let mut r = rescale();
        r.step = RescaleStep::Restoring;
        r.savepoint_path = Some("/sp/sp-1".into());
        let mut o = obs(EngineObs::Unreachable, SavepointObs::NotAsked);
        o.step_age_s = RESTORE_TIMEOUT_S + 1.0;
        let t = advance(&r, &o, "t");
        assert!(t.rescale.as_ref().unwrap().rolling_back);
        r.rolling_back = true;
        let t = advance(&r, &o, "t");
        assert!(matches!(t.outcome, Some(Outcome::Failed { .. })));
    }

    #[test]
    fn engine_gone_after_savepoint_uses_dir_and_id() {
        let mut r = rescale();
        r.savepoint_id = Some("sp-9".into());
        let t = advance(&r, &obs(EngineObs::Unreachable, SavepointObs::Unknown), "t");
        let next = t.rescale.unwrap();
        assert_eq!(next.step, RescaleStep::Redeploying);
        assert_eq!(next.savepoint_path.as_deref(), Some("/sp/sp-9"));
    }

    #[test]
    fn stopped_engine_without_recorded_savepoint_rolls_back_to_previous_restore() {
        let r = rescale();
        let mut o = obs(
            up("stopped", p(&[("map", 1)]), None),
            SavepointObs::NotAsked,
        );
        o.previous_restore = Some("/sp/old".into());
        let t = advance(&r, &o, "t");
        let next = t.rescale.unwrap();
        assert!(next.rolling_back);
        assert_eq!(next.savepoint_path.as_deref(), Some("/sp/old"));
    }

    #[test]
    fn savepointing_waits_for_an_unreachable_engine_then_rolls_back() {
        let r = rescale();
        let t = advance(
            &r,
            &obs(EngineObs::Unreachable, SavepointObs::NotAsked),
            "t",
        );
        assert_eq!(t.action, Action::Wait);
        let mut o = obs(EngineObs::Unreachable, SavepointObs::NotAsked);
        o.step_age_s = SAVEPOINT_TIMEOUT_S + 1.0;
        assert!(advance(&r, &o, "t").rescale.unwrap().rolling_back);
    }
}
