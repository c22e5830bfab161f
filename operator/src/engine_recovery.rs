//! Noticing that a StreamJob's engine recovered from its own checkpoint: the engine pod's
//! container died and was restarted with the same arguments (`--recover`), so the engine
//! reports a checkpoint as what it was restored from instead of the savepoint the operator
//! deployed it from (`status.restoredFrom`).

use crate::crd::StreamJobStatus;

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
                "the engine restarted (its container died and was restarted) and recovered from its latest completed checkpoint {from} (recovery {}); records after that checkpoint are read again from the sources, and exactly-once sinks commit each result once",
                status.recoveries
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
