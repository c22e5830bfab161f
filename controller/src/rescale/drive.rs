//! Driving the rescale machine: observe -> [`advance`] -> persist -> act, through a backend.
//!
//! A backend is where the engine runs: a local process (`streamscale run`, see
//! [`super::runtime_backend`]) or a Kubernetes pod (the operator's reconciler). Its methods are
//! the machine's actions plus observing and persisting; [`step`] does one turn (the operator
//! does one per reconcile, its StreamJob status being the persistence), [`run_to_end`] turns
//! until the rescale ends (`streamscale run`, which keeps the state in memory).

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use super::machine::{
    Action, Observation, Outcome, RescaleState, Transition, advance, savepoint_exists,
};

/// The engine's answer to a stop-with-savepoint request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavepointRequest {
    /// Requested (or already taken, for a backend whose request waits for the savepoint).
    Accepted,
    /// A savepoint with this id already exists on disk (`409 already exists`): it was taken
    /// before the driver died, by an engine that has restarted since.
    AlreadyExists,
}

/// Where the engine of a rescale runs. Every method may be called again for the same step
/// after a crash, so each must be idempotent.
pub trait RescaleBackend: Send {
    /// Why an observation, a write or an action failed (the turn stops there; the persisted
    /// state is resumed on the next turn).
    type Error;

    /// Now, as stored in [`RescaleState::step_started_at`] (RFC 3339 for the operator).
    fn now(&self) -> String;

    /// The engine, the savepoint named by `r.savepoint_id`, the deployed workload and the
    /// settings [`advance`] needs, for the rescale `r`.
    fn observe(
        &mut self,
        r: &RescaleState,
    ) -> impl Future<Output = Result<Observation, Self::Error>> + Send;

    /// Persists the transition `t` computed from `r` and `obs` at `now`, before its action is
    /// taken (`t.rescale` is `None` when the rescale ended with `t.outcome`).
    fn persist(
        &mut self,
        r: &RescaleState,
        obs: &Observation,
        t: &Transition,
        now: &str,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Requests a stop-with-savepoint under `id` from the engine of the rescale `r`.
    fn request_savepoint(
        &mut self,
        r: &RescaleState,
        id: &str,
    ) -> impl Future<Output = Result<SavepointRequest, Self::Error>> + Send;

    /// Persists `known`: the rescale with the savepoint found on disk after
    /// [`SavepointRequest::AlreadyExists`] (the next turn redeploys from it).
    fn persist_existing_savepoint(
        &mut self,
        known: &RescaleState,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;

    /// Deploys the engine at `parallelism`, restored from `restore` (a savepoint path; `None`:
    /// a fresh start), replacing the one deployed. `obs` is the observation of this turn.
    fn deploy(
        &mut self,
        parallelism: &BTreeMap<String, u32>,
        restore: Option<&str>,
        obs: &Observation,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// One turn: observes, advances `r`, persists the transition, then acts. Returns the
/// transition (with the state persisted after the action, which differs from the advanced one
/// only when the savepoint was found on disk).
///
/// # Errors
/// The backend's, from the first method that failed; what was persisted before stays.
pub async fn step<B: RescaleBackend>(
    backend: &mut B,
    r: &RescaleState,
) -> Result<Transition, B::Error> {
    let obs = backend.observe(r).await?;
    let now = backend.now();
    let mut t = advance(r, &obs, &now);
    backend.persist(r, &obs, &t, &now).await?;
    match &t.action {
        Action::Wait => {}
        Action::TriggerSavepoint { id } => {
            if backend.request_savepoint(r, id).await? == SavepointRequest::AlreadyExists
                && let Some(next) = &t.rescale
            {
                let known = savepoint_exists(next, &obs.savepoint_dir);
                backend.persist_existing_savepoint(&known).await?;
                t.rescale = Some(known);
            }
        }
        Action::Deploy {
            parallelism,
            restore,
        } => {
            backend
                .deploy(parallelism, restore.as_deref(), &obs)
                .await?
        }
    }
    Ok(t)
}

/// Turns [`step`] every `poll` until the rescale `r` ends; returns how it ended.
///
/// # Errors
/// The backend's, from the first turn that failed.
pub async fn run_to_end<B: RescaleBackend>(
    backend: &mut B,
    mut r: RescaleState,
    poll: Duration,
) -> Result<Outcome, B::Error> {
    loop {
        let t = step(backend, &r).await?;
        match (t.outcome, t.rescale) {
            (Some(outcome), _) => return Ok(outcome),
            (None, Some(next)) => r = next,
            // `advance` returns either an outcome or the next state.
            (None, None) => unreachable!("a transition without state ends with an outcome"),
        }
        if t.action == Action::Wait {
            tokio::time::sleep(poll).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rescale::machine::{EngineObs, RescaleStep, SavepointObs, WorkloadObs};

    fn p(n: u32) -> BTreeMap<String, u32> {
        [("map".to_string(), n)].into_iter().collect()
    }

    /// A mock backend: answers scripted observations and records every call in order.
    struct Mock {
        engine: EngineObs,
        savepoint: SavepointObs,
        workload: WorkloadObs,
        conflict: bool,
        calls: Vec<String>,
    }

    impl RescaleBackend for Mock {
        type Error = String;

        fn now(&self) -> String {
            "t".into()
        }

        async fn observe(&mut self, _r: &RescaleState) -> Result<Observation, String> {
            Ok(Observation {
                engine: self.engine.clone(),
                savepoint: self.savepoint.clone(),
                workload: Some(self.workload.clone()),
                step_age_s: 0.0,
                previous_restore: None,
                newest_restore: None,
                savepoint_dir: "/sp".into(),
                savepoint_timeout_s: 60.0,
                restore_timeout_s: 60.0,
            })
        }

        async fn persist(
            &mut self,
            _r: &RescaleState,
            _obs: &Observation,
            t: &Transition,
            now: &str,
        ) -> Result<(), String> {
            let step = t.rescale.as_ref().map(|n| n.step);
            self.calls.push(format!("persist {step:?} at {now}"));
            Ok(())
        }

        async fn request_savepoint(
            &mut self,
            _r: &RescaleState,
            id: &str,
        ) -> Result<SavepointRequest, String> {
            self.calls.push(format!("savepoint {id}"));
            Ok(if self.conflict {
                SavepointRequest::AlreadyExists
            } else {
                SavepointRequest::Accepted
            })
        }

        async fn persist_existing_savepoint(&mut self, known: &RescaleState) -> Result<(), String> {
            self.calls
                .push(format!("persist path {:?}", known.savepoint_path));
            Ok(())
        }

        async fn deploy(
            &mut self,
            parallelism: &BTreeMap<String, u32>,
            restore: Option<&str>,
            _obs: &Observation,
        ) -> Result<(), String> {
            self.calls
                .push(format!("deploy {parallelism:?} {restore:?}"));
            self.workload = WorkloadObs {
                parallelism: parallelism.clone(),
                restore: restore.map(String::from),
            };
            self.engine = EngineObs::Up {
                state: "running".into(),
                parallelism: parallelism.clone(),
                restored_from: restore.map(String::from),
            };
            Ok(())
        }
    }

    fn state() -> RescaleState {
        RescaleState {
            step: RescaleStep::Savepointing,
            from: p(1),
            to: p(3),
            reason: "test".into(),
            savepoint_id: Some("sp-1".into()),
            savepoint_path: None,
            rolling_back: false,
            started_at: "t0".into(),
            step_started_at: "t0".into(),
        }
    }

    fn mock(conflict: bool) -> Mock {
        Mock {
            engine: EngineObs::Up {
                state: "running".into(),
                parallelism: p(1),
                restored_from: None,
            },
            savepoint: SavepointObs::NotFound,
            workload: WorkloadObs {
                parallelism: p(1),
                restore: None,
            },
            conflict,
            calls: Vec::new(),
        }
    }

    #[tokio::test]
    async fn each_turn_persists_before_it_acts_and_runs_to_the_rescaled_outcome() {
        let mut b = mock(false);
        let t = step(&mut b, &state()).await.expect("turn");
        assert_eq!(
            b.calls,
            ["persist Some(Savepointing) at t", "savepoint sp-1"]
        );
        b.savepoint = SavepointObs::Completed("/sp/sp-1".into());
        let outcome = run_to_end(&mut b, t.rescale.expect("state"), Duration::ZERO)
            .await
            .expect("ends");
        assert_eq!(
            outcome,
            Outcome::Rescaled {
                parallelism: p(3),
                savepoint: "/sp/sp-1".into()
            }
        );
        assert_eq!(
            b.calls[2..],
            [
                "persist Some(Redeploying) at t",
                "deploy {\"map\": 3} Some(\"/sp/sp-1\")",
                "persist Some(Restoring) at t",
                "persist None at t",
            ]
        );
    }

    #[tokio::test]
    async fn a_savepoint_that_already_exists_is_persisted_with_its_path() {
        let mut b = mock(true);
        let t = step(&mut b, &state()).await.expect("turn");
        let known = t.rescale.expect("state");
        assert_eq!(known.savepoint_path.as_deref(), Some("/sp/sp-1"));
        assert_eq!(known.step, RescaleStep::Savepointing);
        assert_eq!(b.calls[2], "persist path Some(\"/sp/sp-1\")");
        // The next turn redeploys from it.
        let t = step(&mut b, &known).await.expect("turn");
        assert_eq!(t.rescale.map(|n| n.step), Some(RescaleStep::Redeploying));
    }
}
