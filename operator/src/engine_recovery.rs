//! Noticing that a StreamJob's engine recovered from its own checkpoint: the engine pod's
//! container died and was restarted with the same arguments (`--recover`), or a rescale's
//! roll back found the failed attempt's checkpoints in the lineage's directory
//! ([`crate::resources::checkpoint_dir`]), so the engine reports a checkpoint as what it was
//! restored from instead of the savepoint the operator deployed it from
//! (`status.restoredFrom`). [`observe`] and [`apply`] count it in status;
//! [`as_deployed`] keeps a rescale from mistaking it for an engine that did not restore.

use crate::crd::{StreamJob, StreamJobStatus};
use crate::rescale::{EngineObs, WorkloadObs};

/// What the engine's `restoredFrom` says about recoveries, against the status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryObs {
    /// The engine runs from what it was deployed from (or the recovery is already counted).
    Unchanged,
    /// The engine runs from what it was deployed from again (a rescale or a pod replaced by
    /// the operator): `status.recoveredFrom` is stale.
    Cleared,
    /// A recovery not counted yet, from this checkpoint.
    Recovered(String),
}

/// Compares the engine's `restored_from` (from `GET /v1/job`) with `status`: a path that is
/// neither `status.restoredFrom` nor the `status.recoveredFrom` already counted is a new
/// recovery. Two restarts that both recover from the same checkpoint count once.
pub fn observe(status: &StreamJobStatus, engine_restored_from: Option<&str>) -> RecoveryObs {
    let deployed = status.restored_from.as_deref();
    match engine_restored_from {
        Some(from) if Some(from) != deployed => {
            if status.recovered_from.as_deref() == Some(from) {
                RecoveryObs::Unchanged
            } else {
                RecoveryObs::Recovered(from.to_string())
            }
        }
        _ if status.recovered_from.is_some() => RecoveryObs::Cleared,
        _ => RecoveryObs::Unchanged,
    }
}

/// Applies `obs` to `status`; returns the Event message of a new recovery.
pub fn apply(status: &mut StreamJobStatus, obs: RecoveryObs) -> Option<String> {
    match obs {
        RecoveryObs::Unchanged => None,
        RecoveryObs::Cleared => {
            status.recovered_from = None;
            None
        }
        RecoveryObs::Recovered(from) => {
            status.recoveries += 1;
            status.recovered_from = Some(from.clone());
            Some(format!(
                "the engine recovered from the latest completed checkpoint {from} of its lineage (its container died and was restarted, or a rescale rolled back after its new engine had completed checkpoints) (recovery {}); records after that checkpoint are read again from the sources, and exactly-once sinks commit each result once",
                status.recoveries
            ))
        }
    }
}

/// The engine as a rescale sees it: an engine that recovered from a checkpoint of the
/// deployed pod template's own checkpoint directory ([`crate::resources::checkpoint_dir`])
/// runs from what that template restores (`workload.restore`), so a restored engine whose
/// container restarted before the operator saw it running still completes the rescale rather
/// than timing out and rolling back to the savepoint (which would replay results its
/// exactly-once sinks already committed).
pub fn as_deployed(
    job: &StreamJob,
    workload: Option<&WorkloadObs>,
    engine: EngineObs,
) -> EngineObs {
    let (
        Some(w),
        EngineObs::Up {
            state,
            parallelism,
            restored_from: Some(from),
        },
    ) = (workload, &engine)
    else {
        return engine;
    };
    let restore = w.restore.as_deref();
    let own = [
        crate::resources::checkpoint_dir(job, restore),
        crate::resources::checkpoint_dir_before_namespaces(job, restore),
    ]
    .into_iter()
    .flatten()
    .any(|dir| {
        from.strip_prefix(&dir)
            .is_some_and(|rest| rest.starts_with('/'))
    });
    if !own {
        return engine;
    }
    EngineObs::Up {
        state: state.clone(),
        parallelism: parallelism.clone(),
        restored_from: w.restore.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recovery_from_the_templates_own_checkpoints_counts_as_its_restore() {
        let yaml = r#"
apiVersion: streamscale.dev/v1alpha1
kind: StreamJob
metadata: {name: demo, namespace: ns, uid: "1234"}
spec:
  job:
    name: demo
    operators:
      - {name: source, kind: source, rate: {constant: 100}}
      - {name: sink, kind: sink}
    edges: [{from: source, to: sink}]
    checkpoint: {intervalSeconds: 1}
"#;
        let job: StreamJob = serde_saphyr::from_str(yaml).expect("StreamJob");
        let w = WorkloadObs {
            parallelism: job.spec.job.parallelism(),
            restore: Some("/sp/sp-2".into()),
        };
        let dir =
            crate::resources::checkpoint_dir(&job, w.restore.as_deref()).expect("checkpointed");
        let up = |from: &str| EngineObs::Up {
            state: "running".into(),
            parallelism: w.parallelism.clone(),
            restored_from: Some(from.into()),
        };
        let restored = |o: EngineObs| match o {
            EngineObs::Up { restored_from, .. } => restored_from,
            EngineObs::Unreachable => None,
        };
        let seen = as_deployed(&job, Some(&w), up(&format!("{dir}/chk-3")));
        assert_eq!(restored(seen).as_deref(), Some("/sp/sp-2"));
        // Another template's checkpoints, or a savepoint, are left as they are.
        let other = as_deployed(&job, Some(&w), up("/sp/checkpoints/0000000000000000/chk-3"));
        assert_eq!(
            restored(other).as_deref(),
            Some("/sp/checkpoints/0000000000000000/chk-3")
        );
        let prefix_only = as_deployed(&job, Some(&w), up(&format!("{dir}x/chk-1")));
        assert_eq!(restored(prefix_only), Some(format!("{dir}x/chk-1")));
        assert_eq!(
            restored(as_deployed(&job, Some(&w), up("/sp/sp-1"))).as_deref(),
            Some("/sp/sp-1")
        );
        assert_eq!(
            as_deployed(&job, Some(&w), EngineObs::Unreachable),
            EngineObs::Unreachable
        );
        // Under a shared `checkpoint.dir`, the directory an older operator named (before it
        // held the namespace and name) is the template's own too.
        let mut shared = job.clone();
        shared.spec.job.checkpoint =
            serde_saphyr::from_str("{intervalSeconds: 1, dir: /shared}").expect("checkpoint");
        let before = crate::resources::checkpoint_dir_before_namespaces(&shared, Some("/sp/sp-2"))
            .expect("shared");
        let seen = as_deployed(&shared, Some(&w), up(&format!("{before}/chk-3")));
        assert_eq!(restored(seen).as_deref(), Some("/sp/sp-2"));
    }

    #[test]
    fn a_checkpoint_other_than_the_deployed_savepoint_counts_once() {
        let mut s = StreamJobStatus {
            restored_from: Some("/sp/sp-1".into()),
            ..StreamJobStatus::default()
        };
        assert_eq!(observe(&s, Some("/sp/sp-1")), RecoveryObs::Unchanged);
        assert_eq!(observe(&s, None), RecoveryObs::Unchanged);
        let obs = observe(&s, Some("/sp/checkpoints/ab/chk-4"));
        let msg = apply(&mut s, obs).expect("a recovery");
        assert!(msg.contains("chk-4") && msg.contains("recovery 1"), "{msg}");
        assert_eq!(s.recoveries, 1);
        // Seen again at the next reconcile: not another one.
        let obs = observe(&s, Some("/sp/checkpoints/ab/chk-4"));
        assert_eq!(apply(&mut s, obs), None);
        let obs = observe(&s, Some("/sp/checkpoints/ab/chk-9"));
        assert!(apply(&mut s, obs).is_some());
        assert_eq!(
            (s.recoveries, s.recovered_from.as_deref()),
            (2, Some("/sp/checkpoints/ab/chk-9"))
        );
        // A rescale deploys from a new savepoint: the recovery is no longer current.
        s.restored_from = Some("/sp/sp-2".into());
        let obs = observe(&s, Some("/sp/sp-2"));
        assert_eq!(obs, RecoveryObs::Cleared);
        apply(&mut s, obs);
        assert_eq!((s.recoveries, s.recovered_from.as_deref()), (2, None));
    }

    #[test]
    fn a_fresh_start_that_recovers_counts() {
        let mut s = StreamJobStatus::default();
        assert_eq!(observe(&s, None), RecoveryObs::Unchanged);
        let obs = observe(&s, Some("/chk/x/chk-1"));
        assert!(apply(&mut s, obs).is_some());
        assert_eq!(s.recoveries, 1);
    }
}
