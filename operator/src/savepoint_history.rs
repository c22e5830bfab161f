//! The StreamJob's savepoint history (`status.savepointHistory`), as the Flink Kubernetes
//! Operator keeps one (`status.jobStatus.savepointInfo.savepointHistory`, bounded by
//! `kubernetes.operator.savepoint.history.max.count`, default 10).
//!
//! Pure decisions only; the reconciler does the I/O:
//! * [`recorded`]: the entry a finished rescale adds: the savepoint the rescale took, once the
//!   job runs from it (at the new parallelism, or at the old one after a roll back from it);
//! * [`to_dispose`]: which entries go while the history is longer than the maximum: the
//!   oldest first, never the savepoint the job (or the running engine) runs from;
//! * [`max_count`]: the checked `spec.savepointHistoryMaxCount`.
//!
//! The reconciler disposes of each chosen entry through the running engine's
//! `DELETE /v1/savepoints/{id}` and drops it from the history on `204` (removed) or `404` (no
//! such savepoint any more); on any other answer it keeps the entry for the next reconcile.

use crate::crd::{RescaleStatus, SavepointHistoryEntry};
use crate::rescale::Outcome;

/// Savepoints kept by default: the Flink Kubernetes Operator's default
/// `kubernetes.operator.savepoint.history.max.count`.
pub const DEFAULT_MAX_COUNT: u32 = 10;

/// `spec.savepointHistoryMaxCount` is below its minimum of 1 (the CRD's schema refuses it; an
/// object stored without that schema can still hold it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "spec.savepointHistoryMaxCount: {0} is invalid (at least 1: the savepoint the job runs from is always kept); no savepoint is disposed of until it is fixed"
)]
pub struct InvalidMaxCount(pub u32);

/// The history's maximum length from `spec.savepointHistoryMaxCount`.
///
/// # Errors
/// [`InvalidMaxCount`] for 0.
pub fn max_count(spec_value: u32) -> Result<usize, InvalidMaxCount> {
    if spec_value == 0 {
        return Err(InvalidMaxCount(spec_value));
    }
    Ok(usize::try_from(spec_value).unwrap_or(usize::MAX))
}

/// The entry that the rescale `r`, ended with `outcome`, adds to `history`: its own savepoint
/// (`r.savepointId` at `r.savepointPath`) when the job now runs from it, stamped with the
/// rescale's start. `None` when the job does not run from a savepoint this rescale took (a
/// failed savepoint, a roll back to the savepoint the job ran from before, a failed roll back)
/// or when the history already lists it.
pub fn recorded(
    history: &[SavepointHistoryEntry],
    r: &RescaleStatus,
    outcome: &Outcome,
) -> Option<SavepointHistoryEntry> {
    let runs_from = match outcome {
        Outcome::Rescaled { savepoint, .. } => savepoint.as_str(),
        Outcome::RolledBack {
            savepoint: Some(savepoint),
            ..
        } => savepoint.as_str(),
        _ => return None,
    };
    let id = r.savepoint_id.as_deref()?;
    let path = r.savepoint_path.as_deref()?;
    // A roll back may run from the savepoint of before the rescale: not this rescale's.
    if path != runs_from || last_component(path) != id {
        return None;
    }
    if history.iter().any(|e| e.id == id) {
        return None;
    }
    Some(SavepointHistoryEntry {
        id: id.to_string(),
        path: path.to_string(),
        time: r.started_at.clone(),
    })
}

/// The entries to dispose of so that at most `max` remain, oldest first: the `len − max`
/// oldest entries that are not `protected` (paths the job or the running engine runs from;
/// they count towards `max`). Fewer when protected entries are among the excess.
pub fn to_dispose<'a>(
    history: &'a [SavepointHistoryEntry],
    max: usize,
    protected: &[&str],
) -> Vec<&'a SavepointHistoryEntry> {
    let excess = history.len().saturating_sub(max);
    history
        .iter()
        .filter(|e| !protected.iter().any(|p| same_savepoint(e, p)))
        .take(excess)
        .collect()
}

/// Whether `path` (as the engine or status names it) is the savepoint `e`.
fn same_savepoint(e: &SavepointHistoryEntry, path: &str) -> bool {
    let trim = |p: &str| p.trim_end_matches('/').to_string();
    trim(&e.path) == trim(path) || last_component(path) == e.id
}

/// The last component of a `/`-separated path (trailing slashes ignored).
fn last_component(path: &str) -> &str {
    path.trim_end_matches('/').rsplit('/').next().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::crd::RescaleStep;

    fn entry(id: &str) -> SavepointHistoryEntry {
        SavepointHistoryEntry {
            id: id.to_string(),
            path: format!("/sp/{id}"),
            time: format!("time-of-{id}"),
        }
    }

    fn ids(v: &[&SavepointHistoryEntry]) -> Vec<String> {
        v.iter().map(|e| e.id.clone()).collect()
    }

    fn rescale(id: &str, path: Option<&str>) -> RescaleStatus {
        RescaleStatus {
            step: RescaleStep::Restoring,
            from: BTreeMap::from([("m".to_string(), 1)]),
            to: BTreeMap::from([("m".to_string(), 2)]),
            reason: "test".into(),
            savepoint_id: Some(id.to_string()),
            savepoint_path: path.map(String::from),
            rolling_back: false,
            started_at: "2026-12-01T10:00:00Z".into(),
            step_started_at: "2026-12-01T10:00:05Z".into(),
        }
    }

    #[test]
    fn the_oldest_beyond_the_maximum_are_chosen_oldest_first() {
        let h: Vec<_> = ["a", "b", "c", "d"].map(entry).into();
        assert_eq!(ids(&to_dispose(&h, 2, &["/sp/d"])), ["a", "b"]);
        assert_eq!(ids(&to_dispose(&h, 1, &["/sp/d"])), ["a", "b", "c"]);
        assert!(to_dispose(&h, 4, &[]).is_empty());
        assert!(to_dispose(&h, 10, &[]).is_empty());
        assert!(to_dispose(&[], 1, &[]).is_empty());
    }

    #[test]
    fn the_savepoint_the_job_runs_from_is_never_chosen() {
        // Should the job run from an older entry, it stays and counts towards the maximum.
        let h: Vec<_> = ["a", "b", "c"].map(entry).into();
        assert_eq!(ids(&to_dispose(&h, 1, &["/sp/a"])), ["b", "c"]);
        assert_eq!(ids(&to_dispose(&h, 2, &["/sp/a"])), ["b"]);
        // Named with a trailing slash, or only by a path ending in its id (the engine's view).
        assert_eq!(ids(&to_dispose(&h, 1, &["/sp/a/"])), ["b", "c"]);
        assert_eq!(ids(&to_dispose(&h, 1, &["/elsewhere/a", "/sp/c"])), ["b"]);
    }

    #[test]
    fn a_completed_rescale_records_its_savepoint_once() {
        let r = rescale("rescale-1", Some("/sp/rescale-1"));
        let done = Outcome::Rescaled {
            parallelism: r.to.clone(),
            savepoint: "/sp/rescale-1".into(),
        };
        let e = recorded(&[], &r, &done).unwrap();
        assert_eq!(
            e,
            SavepointHistoryEntry {
                id: "rescale-1".into(),
                path: "/sp/rescale-1".into(),
                time: "2026-12-01T10:00:00Z".into(),
            }
        );
        assert_eq!(recorded(&[e], &r, &done), None);
    }

    #[test]
    fn only_a_savepoint_this_rescale_took_and_the_job_runs_from_is_recorded() {
        // Rolled back from this rescale's savepoint: the job runs from it.
        let r = rescale("rescale-2", Some("/sp/rescale-2"));
        let back = Outcome::RolledBack {
            parallelism: r.from.clone(),
            savepoint: Some("/sp/rescale-2".into()),
        };
        assert_eq!(recorded(&[], &r, &back).unwrap().id, "rescale-2");
        // Rolled back to the savepoint of before the rescale (its own never completed).
        let r = rescale("rescale-3", Some("/sp/rescale-1"));
        let back = Outcome::RolledBack {
            parallelism: r.from.clone(),
            savepoint: Some("/sp/rescale-1".into()),
        };
        assert_eq!(recorded(&[], &r, &back), None);
        // Rolled back to a fresh start, a failed savepoint, a failed roll back.
        let r = rescale("rescale-4", None);
        for outcome in [
            Outcome::RolledBack {
                parallelism: r.from.clone(),
                savepoint: None,
            },
            Outcome::SavepointFailed {
                reason: "disk full".into(),
            },
            Outcome::Failed {
                reason: "no".into(),
            },
        ] {
            assert_eq!(recorded(&[], &r, &outcome), None, "{outcome:?}");
        }
    }

    #[test]
    fn a_maximum_of_zero_is_refused_with_the_field_named() {
        assert_eq!(max_count(1), Ok(1));
        assert_eq!(max_count(10), Ok(10));
        let e = max_count(0).unwrap_err();
        assert!(
            e.to_string().contains("spec.savepointHistoryMaxCount: 0"),
            "{e}"
        );
    }
}
