//! The rescale state machine: Savepointing → Redeploying → Restoring → Running.
//!
//! [`advance`] is pure: from the persisted rescale ([`RescaleState`]) and what its driver
//! observed (engine, savepoint, workload), it returns the next rescale to persist (or the end
//! of the rescale) and one action. The driver ([`super::drive`]) persists the returned state
//! *before* it performs the action, so a driver that dies at any point finds what it was about
//! to do and resumes (actions are idempotent) or rolls back:
//!
//! * a failed savepoint ends the rescale with the job running at the old parallelism;
//! * a restore at the new parallelism that fails or times out redeploys the old parallelism
//!   (`rolling_back`) from the newest completed restore point of the job's lineage: the failed
//!   attempt's latest completed checkpoint when the backend observed one
//!   ([`Observation::newest_restore`]), else the rescale's savepoint. Never from an older one:
//!   the attempt's exactly-once sinks committed what it processed up to its latest checkpoint,
//!   and a restore from the savepoint would commit it a second time;
//! * the savepoint's id is chosen before the request ([`savepoint_id`]) and persisted with the
//!   Savepointing step, so a driver killed right after the request finds the id and polls it
//!   (or, when the engine has exited and restarted since and no longer knows it, learns from
//!   the engine's `409 already exists` that the savepoint is on disk at `DIR/ID`) instead of
//!   rolling back;
//! * a workload at the new parallelism that is not applied within the restore timeout (the
//!   API server refuses it) is rolled back the same way; a roll back is applied until it is;
//! * an engine that stopped without the recorded savepoint (or stays unreachable past the
//!   savepoint timeout) is redeployed at the old parallelism from the savepoint it was
//!   started from.
//!
//! The Kubernetes operator persists [`RescaleState`] as a StreamJob's `status.rescale` (its
//! JSON shape is the CRD's); `streamscale run` keeps it in memory.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Step of a rescale in progress. Each step is written to status before it acts.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum RescaleStep {
    /// Stop-with-savepoint requested (or about to be) at the old parallelism.
    Savepointing,
    /// The workload is being redeployed at the target parallelism from the savepoint.
    Redeploying,
    /// Waiting for the redeployed engine to run the restored job.
    Restoring,
}

/// A rescale in progress.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "RescaleState")]
pub struct RescaleState {
    /// Current step.
    pub step: RescaleStep,
    /// Parallelism per operator before the rescale.
    pub from: BTreeMap<String, u32>,
    /// Parallelism per operator being deployed (equal to `from` while rolling back).
    pub to: BTreeMap<String, u32>,
    /// Why the rescale was decided.
    pub reason: String,
    /// Id of the requested savepoint, once requested.
    #[serde(default)]
    pub savepoint_id: Option<String>,
    /// Path of the completed savepoint, once completed; while rolling back, the restore point
    /// being deployed (that savepoint, the failed attempt's latest completed checkpoint, or the
    /// savepoint the job ran from before).
    #[serde(default)]
    pub savepoint_path: Option<String>,
    /// True when restoring at the new parallelism failed and the job is going back to `from`.
    #[serde(default)]
    pub rolling_back: bool,
    /// When the rescale started (RFC 3339).
    pub started_at: String,
    /// When the current step was entered (RFC 3339).
    pub step_started_at: String,
}

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
    /// Not asked about (no savepoint id, or not in the Savepointing step).
    NotAsked,
    /// The engine answered `404`: it was never asked for this id (or it restarted since).
    NotFound,
    /// Still being written.
    Pending,
    /// Completed at this path.
    Completed(String),
    /// Failed with this reason.
    Failed(String),
    /// The engine could not be asked (it exits after a completed stop-with-savepoint, and a
    /// restarted engine takes a moment to answer).
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
    /// The newest completed restore point of the deployed engine's lineage, observed once
    /// that engine is gone (killed or exited, so that it completes no further checkpoint): its
    /// latest completed checkpoint that verifies, when newer than what it was restored from.
    /// `None` when there is none newer, or when the backend's engine picks it itself on start
    /// (the operator's pods recover from their lineage's checkpoint directory). A restore that
    /// failed is rolled back from it rather than from the older savepoint, since the failed
    /// attempt's exactly-once sinks may have committed output after the savepoint.
    pub newest_restore: Option<String>,
    /// Directory the engine writes savepoints to (a savepoint's path is `DIR/ID`).
    pub savepoint_dir: String,
    /// Seconds a savepoint may stay pending, or the engine unreachable, while savepointing
    /// before the rescale rolls back (`spec.autoscaler.savepointTimeoutSeconds`).
    pub savepoint_timeout_s: f64,
    /// Seconds a redeployed engine may take to run the restored job before the restore counts
    /// as failed and is rolled back, and a workload at the new parallelism may take to be
    /// applied (`spec.autoscaler.restoreTimeoutSeconds`).
    pub restore_timeout_s: f64,
}

/// What the driver does after persisting the new state.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Nothing yet: look again shortly.
    Wait,
    /// Request a stop-with-savepoint under this id (already persisted in `savepointId`). A
    /// `409` saying the id already exists means the savepoint is on disk: persist
    /// [`savepoint_exists`] and look again.
    TriggerSavepoint {
        /// The savepoint id to request.
        id: String,
    },
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
    /// The restore failed and the job runs again at the old parallelism from the newest
    /// restore point: the failed attempt's latest completed checkpoint, else the savepoint.
    RolledBack {
        /// The old parallelism.
        parallelism: BTreeMap<String, u32>,
        /// The savepoint or checkpoint it runs from.
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
    pub rescale: Option<RescaleState>,
    /// What to do after persisting it.
    pub action: Action,
    /// Set when the rescale ended.
    pub outcome: Option<Outcome>,
    /// A line for the Kubernetes Event of a step change (`None` when nothing changed).
    pub event: Option<String>,
}

/// Default seconds a redeployed engine may take to run the restored job before the restore
/// counts as failed (and is rolled back).
pub const RESTORE_TIMEOUT_S: f64 = 120.0;
/// Default seconds a savepoint may stay pending or the engine unreachable while savepointing.
pub const SAVEPOINT_TIMEOUT_S: f64 = 120.0;

/// The savepoint id of a rescale started at `started_at` (RFC 3339): `rescale-` and the time
/// with every character the engine does not accept in an id (`:`, `+`) replaced by `-`.
/// Deterministic, so a restarted operator derives the same id for the same rescale.
pub fn savepoint_id(started_at: &str) -> String {
    let stamp: String = started_at
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(100)
        .collect();
    format!("rescale-{stamp}")
}

/// The rescale to persist when the engine refused the stop-with-savepoint because a savepoint
/// with the recorded id already exists: it was taken before the operator died and the engine
/// has restarted since. Its path is `DIR/ID`; the next [`advance`] redeploys from it.
pub fn savepoint_exists(r: &RescaleState, savepoint_dir: &str) -> RescaleState {
    let mut next = r.clone();
    if let Some(id) = &r.savepoint_id {
        next.savepoint_path = Some(format!("{}/{id}", savepoint_dir.trim_end_matches('/')));
    }
    next
}

fn stay(r: &RescaleState, action: Action) -> Transition {
    Transition {
        rescale: Some(r.clone()),
        action,
        outcome: None,
        event: None,
    }
}

fn enter(
    r: &RescaleState,
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

fn roll_back(r: &RescaleState, now: &str, restore: Option<String>, why: &str) -> Transition {
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
pub fn advance(r: &RescaleState, obs: &Observation, now: &str) -> Transition {
    match r.step {
        RescaleStep::Savepointing => {
            let running = matches!(&obs.engine, EngineObs::Up { state, .. } if state == "running");
            let timed_out = obs.step_age_s >= obs.savepoint_timeout_s;
            let redeploy = |path: &str, how: &str| {
                let mut next = r.clone();
                next.savepoint_path = Some(path.to_string());
                enter(
                    &next,
                    RescaleStep::Redeploying,
                    now,
                    Action::Deploy {
                        parallelism: r.to.clone(),
                        restore: Some(path.to_string()),
                    },
                    format!("savepoint {path} {how}; redeploying at {}", fmt_p(&r.to)),
                )
            };
            match (&r.savepoint_id, &obs.savepoint) {
                // A status from before ids were chosen by the operator: choose it now (persisted
                // with the request).
                (None, _) if running => {
                    let mut next = r.clone();
                    let id = savepoint_id(&r.started_at);
                    next.savepoint_id = Some(id.clone());
                    stay(&next, Action::TriggerSavepoint { id })
                }
                (None, _) if !timed_out && obs.engine == EngineObs::Unreachable => {
                    stay(r, Action::Wait)
                }
                (None, _) => roll_back(
                    r,
                    now,
                    obs.previous_restore.clone(),
                    "engine stopped without a recorded savepoint",
                ),
                // The engine said the savepoint already exists on disk.
                (Some(_), _) if r.savepoint_path.is_some() => redeploy(
                    r.savepoint_path.as_deref().unwrap_or_default(),
                    "exists on disk",
                ),
                (Some(_), SavepointObs::Completed(path)) => redeploy(path, "completed"),
                (Some(_), SavepointObs::Failed(reason)) => end(
                    Outcome::SavepointFailed {
                        reason: reason.clone(),
                    },
                    format!(
                        "savepoint failed ({reason}); the job keeps running at {}",
                        fmt_p(&r.from)
                    ),
                ),
                (Some(_), SavepointObs::Pending) if !timed_out => stay(r, Action::Wait),
                (Some(_), SavepointObs::Pending) => {
                    roll_back(r, now, obs.previous_restore.clone(), "savepoint timed out")
                }
                // Not requested yet (the operator died between persisting the id and the
                // request), or requested from an engine that has exited and restarted since:
                // request it; the engine answers 409 when it exists on disk.
                (Some(id), SavepointObs::NotFound) if running => {
                    stay(r, Action::TriggerSavepoint { id: id.clone() })
                }
                (Some(_), SavepointObs::NotFound)
                    if !timed_out
                        && matches!(&obs.engine, EngineObs::Up { state, .. } if state == "stopping") =>
                {
                    stay(r, Action::Wait)
                }
                (Some(id), SavepointObs::NotFound) => roll_back(
                    r,
                    now,
                    obs.previous_restore.clone(),
                    &format!("engine stopped without savepoint {id}"),
                ),
                // The engine exits after a completed stop-with-savepoint; wait for it (or its
                // restarted successor) to answer.
                (Some(_), SavepointObs::Unknown | SavepointObs::NotAsked) if !timed_out => {
                    stay(r, Action::Wait)
                }
                (Some(id), SavepointObs::Unknown | SavepointObs::NotAsked) => roll_back(
                    r,
                    now,
                    obs.previous_restore.clone(),
                    &format!("engine unreachable while savepointing {id}"),
                ),
            }
        }
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
            } else if !r.rolling_back && obs.step_age_s >= obs.restore_timeout_s {
                // Never applied (the API server refuses the new workload, a quota, an admission
                // policy): the job goes back to the old parallelism rather than staying stopped.
                // A roll back that is not applied either keeps trying: the workload at the old
                // parallelism from the newest restore point is the only one to run.
                roll_back(
                    r,
                    now,
                    obs.newest_restore
                        .clone()
                        .or_else(|| r.savepoint_path.clone()),
                    &format!(
                        "the workload at {} was not applied within {:.0} s",
                        fmt_p(&r.to),
                        obs.restore_timeout_s
                    ),
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
                _ if obs.step_age_s >= obs.restore_timeout_s => Some(false),
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
                // Never from an older restore point than the failed attempt's newest: what it
                // committed after the savepoint would be committed again.
                (Some(false), false) => roll_back(
                    r,
                    now,
                    obs.newest_restore
                        .clone()
                        .or_else(|| r.savepoint_path.clone()),
                    &format!("restore at {} failed", fmt_p(&r.to)),
                ),
                (Some(false), true) => end(
                    Outcome::Failed {
                        reason: format!(
                            "restoring the old parallelism {} from {} failed too; resume the job from {}",
                            fmt_p(&r.from),
                            r.savepoint_path.as_deref().unwrap_or("a fresh start"),
                            obs.newest_restore
                                .as_deref()
                                .or(r.savepoint_path.as_deref())
                                .unwrap_or("the beginning")
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
    crate::runtime::parallelism_arg(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn rescale() -> RescaleState {
        RescaleState {
            step: RescaleStep::Savepointing,
            from: p(&[("map", 1)]),
            to: p(&[("map", 3)]),
            reason: "test".into(),
            savepoint_id: Some("sp-1".into()),
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
            newest_restore: None,
            savepoint_dir: "/sp".into(),
            savepoint_timeout_s: SAVEPOINT_TIMEOUT_S,
            restore_timeout_s: RESTORE_TIMEOUT_S,
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
                SavepointObs::NotFound,
            ),
            "t1",
        );
        assert_eq!(t.action, Action::TriggerSavepoint { id: "sp-1".into() });
        let r = t.rescale.unwrap();
        assert_eq!(r.savepoint_id.as_deref(), Some("sp-1"));

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
        let r = rescale();
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
    fn a_workload_never_applied_rolls_back_and_its_roll_back_keeps_trying() {
        let mut r = rescale();
        r.step = RescaleStep::Redeploying;
        r.savepoint_path = Some("/sp/sp-1".into());
        let mut o = obs(EngineObs::Unreachable, SavepointObs::NotAsked);
        o.step_age_s = RESTORE_TIMEOUT_S - 1.0;
        assert_eq!(advance(&r, &o, "t").rescale.unwrap(), r);
        o.step_age_s = RESTORE_TIMEOUT_S;
        let t = advance(&r, &o, "t1");
        let back = t.rescale.unwrap();
        assert!(back.rolling_back);
        assert_eq!(
            (back.step, back.step_started_at.as_str()),
            (RescaleStep::Redeploying, "t1")
        );
        assert_eq!(
            t.action,
            Action::Deploy {
                parallelism: p(&[("map", 1)]),
                restore: Some("/sp/sp-1".into())
            }
        );
        assert!(
            t.event.unwrap().contains("not applied within 120 s"),
            "said why"
        );
        // The roll back's workload is refused too: no end, no other restore point.
        o.step_age_s = 10.0 * RESTORE_TIMEOUT_S;
        let t = advance(&back, &o, "t2");
        assert_eq!(t.rescale.as_ref(), Some(&back));
        assert!(t.outcome.is_none());
        assert!(matches!(t.action, Action::Deploy { .. }));
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
    fn a_failed_restore_rolls_back_from_the_newest_restore_point_never_an_older_one() {
        // The attempt at the new parallelism ran from /sp/sp-1, completed checkpoint 12 (its
        // exactly-once sinks committed up to it), then failed.
        let mut r = rescale();
        r.step = RescaleStep::Restoring;
        r.savepoint_path = Some("/sp/sp-1".into());
        let mut o = obs(
            up("failed", p(&[("map", 3)]), Some("/sp/sp-1")),
            SavepointObs::NotAsked,
        );
        o.newest_restore = Some("/chk/chk-12".into());
        let t = advance(&r, &o, "t1");
        let next = t.rescale.expect("rolling back");
        assert!(next.rolling_back);
        assert_eq!(next.to, p(&[("map", 1)]));
        assert_eq!(next.savepoint_path.as_deref(), Some("/chk/chk-12"));
        let deploy = Action::Deploy {
            parallelism: p(&[("map", 1)]),
            restore: Some("/chk/chk-12".into()),
        };
        assert_eq!(t.action, deploy);
        assert!(t.event.is_some_and(|e| e.contains("/chk/chk-12")));
        // A driver that dies now redeploys the same restore point (persisted), whatever it
        // observes next.
        o.newest_restore = None;
        o.engine = EngineObs::Unreachable;
        let t = advance(&next, &o, "t2");
        assert_eq!(t.action, deploy);
        // Rolled back once the old parallelism runs from that checkpoint.
        let mut back = next;
        back.step = RescaleStep::Restoring;
        o.engine = up("running", p(&[("map", 1)]), Some("/chk/chk-12"));
        assert_eq!(
            advance(&back, &o, "t3").outcome,
            Some(Outcome::RolledBack {
                parallelism: p(&[("map", 1)]),
                savepoint: Some("/chk/chk-12".into())
            })
        );
        // Rolling back failed too: the reason names the newest restore point to resume from.
        o.engine = up("failed", p(&[("map", 1)]), Some("/chk/chk-12"));
        o.newest_restore = Some("/chk/chk-15".into());
        let Some(Outcome::Failed { reason }) = advance(&back, &o, "t4").outcome else {
            panic!("expected Failed");
        };
        assert!(
            reason.ends_with("resume the job from /chk/chk-15"),
            "{reason}"
        );
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
    fn killed_after_the_request_resumes_by_polling_the_recorded_id() {
        // The operator died right after requesting the savepoint: status has the id, the
        // engine knows it. The restarted operator waits for it instead of rolling back.
        let r = rescale();
        let t = advance(
            &r,
            &obs(
                up("stopping", p(&[("map", 1)]), None),
                SavepointObs::Pending,
            ),
            "t",
        );
        assert_eq!(t.action, Action::Wait);
        assert_eq!(t.rescale.as_ref(), Some(&r));
        let t = advance(
            &r,
            &obs(
                up("stopped", p(&[("map", 1)]), None),
                SavepointObs::Completed("/sp/sp-1".into()),
            ),
            "t",
        );
        let next = t.rescale.unwrap();
        assert!(!next.rolling_back);
        assert_eq!(next.step, RescaleStep::Redeploying);
        assert_eq!(next.to, p(&[("map", 3)]));
    }

    #[test]
    fn engine_that_exited_and_restarted_is_asked_again_and_its_conflict_means_on_disk() {
        let r = rescale();
        // Exited after completing: not reachable for a while -> wait, no roll back.
        let t = advance(&r, &obs(EngineObs::Unreachable, SavepointObs::Unknown), "t");
        assert_eq!(t.action, Action::Wait);
        assert_eq!(
            t.rescale.as_ref().map(|n| n.step),
            Some(RescaleStep::Savepointing)
        );
        // Restarted from the old savepoint: it does not know the id -> request it again.
        let t = advance(
            &r,
            &obs(
                up("running", p(&[("map", 1)]), None),
                SavepointObs::NotFound,
            ),
            "t",
        );
        assert_eq!(t.action, Action::TriggerSavepoint { id: "sp-1".into() });
        // The engine answers 409 (already exists on disk): redeploy from DIR/ID.
        let known = savepoint_exists(&r, "/sp/");
        assert_eq!(known.savepoint_path.as_deref(), Some("/sp/sp-1"));
        assert_eq!(known.step, RescaleStep::Savepointing);
        let t = advance(
            &known,
            &obs(
                up("running", p(&[("map", 1)]), None),
                SavepointObs::NotFound,
            ),
            "t2",
        );
        let next = t.rescale.unwrap();
        assert_eq!(next.step, RescaleStep::Redeploying);
        assert!(!next.rolling_back);
        assert_eq!(
            t.action,
            Action::Deploy {
                parallelism: p(&[("map", 3)]),
                restore: Some("/sp/sp-1".into())
            }
        );
    }

    #[test]
    fn engine_stopped_without_the_recorded_savepoint_rolls_back() {
        let r = rescale();
        let mut o = obs(
            up("stopped", p(&[("map", 1)]), None),
            SavepointObs::NotFound,
        );
        o.previous_restore = Some("/sp/old".into());
        let next = advance(&r, &o, "t").rescale.unwrap();
        assert!(next.rolling_back);
        assert_eq!(next.savepoint_path.as_deref(), Some("/sp/old"));
        // Stopping (someone else's savepoint in progress): wait until the timeout.
        o.engine = up("stopping", p(&[("map", 1)]), None);
        assert_eq!(advance(&r, &o, "t").action, Action::Wait);
    }

    #[test]
    fn savepoint_ids_are_valid_engine_ids_and_deterministic() {
        let started = "2026-11-30T12:34:56.789123+00:00";
        let id = savepoint_id(started);
        assert_eq!(id, savepoint_id(started));
        assert_ne!(id, savepoint_id("2026-11-30T12:34:57Z"));
        streamscale_engine::server::validate_savepoint_id(&id).unwrap();
        assert!(id.starts_with("rescale-2026-11-30T12-34-56.789123"), "{id}");
    }

    #[test]
    fn a_status_without_an_id_gets_one_persisted_with_the_request() {
        let mut r = rescale();
        r.savepoint_id = None;
        r.started_at = "2026-01-01T00:00:00Z".into();
        let t = advance(
            &r,
            &obs(
                up("running", p(&[("map", 1)]), None),
                SavepointObs::NotAsked,
            ),
            "t",
        );
        let id = savepoint_id("2026-01-01T00:00:00Z");
        assert_eq!(t.action, Action::TriggerSavepoint { id: id.clone() });
        assert_eq!(t.rescale.unwrap().savepoint_id, Some(id));
    }

    #[test]
    fn restore_timeout_is_the_observed_setting() {
        let mut r = rescale();
        r.step = RescaleStep::Restoring;
        r.savepoint_path = Some("/sp/sp-1".into());
        let mut o = obs(EngineObs::Unreachable, SavepointObs::NotAsked);
        o.restore_timeout_s = 3.0;
        o.step_age_s = 2.0;
        assert_eq!(advance(&r, &o, "t").action, Action::Wait);
        o.step_age_s = 3.5;
        assert!(advance(&r, &o, "t").rescale.unwrap().rolling_back);
    }

    #[test]
    fn stopped_engine_without_recorded_savepoint_rolls_back_to_previous_restore() {
        let mut r = rescale();
        r.savepoint_id = None;
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
        let t = advance(&r, &obs(EngineObs::Unreachable, SavepointObs::Unknown), "t");
        assert_eq!(t.action, Action::Wait);
        let mut o = obs(EngineObs::Unreachable, SavepointObs::Unknown);
        o.savepoint_timeout_s = 10.0;
        o.step_age_s = 11.0;
        assert!(advance(&r, &o, "t").rescale.unwrap().rolling_back);
    }
}
