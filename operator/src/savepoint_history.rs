//! The StreamJob's savepoint history (`status.savepointHistory`), as the Flink Kubernetes
//! Operator keeps one (`status.jobStatus.savepointInfo.savepointHistory`, bounded by
//! `kubernetes.operator.savepoint.history.max.count`, default 10).
//!
//! Pure decisions only; the reconciler does the I/O:
//! * [`recorded`]: the entry a finished rescale adds: the savepoint the rescale took, once the
//!   job runs from it, or after a roll back to an older one (it may have completed late);
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

/// The entry that the rescale `r`, ended with `outcome`, adds to `history`, stamped with the
/// rescale's start, or `None` when the history already lists it:
/// * the rescale's own savepoint (`r.savepointId` at `r.savepointPath`) when the job now runs
///   from it (at the new parallelism, or at the old one after a roll back from it);
/// * after a roll back to an older savepoint (the rescale's own timed out, or the engine became
///   unreachable or stopped while taking it), the rescale's savepoint at `SAVEPOINT_DIR/ID`:
///   it may have completed after the operator gave up on it and would otherwise stay on disk
///   for ever; should it never have completed, its disposal finds nothing (404) and drops it.
///
/// Nothing for a failed savepoint (the engine removed it), a failed roll back (the savepoint
/// is what a person restores from: never disposed of behind their back), or a rescale that
/// chose no savepoint id.
pub fn recorded(
    history: &[SavepointHistoryEntry],
    r: &RescaleStatus,
    outcome: &Outcome,
    savepoint_dir: &str,
) -> Option<SavepointHistoryEntry> {
    let id = r.savepoint_id.as_deref()?;
    let own = |path: &str| last_component(path) == id;
    let path = match outcome {
        Outcome::Rescaled { savepoint, .. } if own(savepoint) => savepoint.clone(),
        Outcome::RolledBack {
            savepoint: Some(savepoint),
            ..
        } if own(savepoint) => savepoint.clone(),
        Outcome::RolledBack { .. } => format!("{}/{id}", savepoint_dir.trim_end_matches('/')),
        _ => return None,
    };
    if history.iter().any(|e| e.id == id) {
        return None;
    }
    Some(SavepointHistoryEntry {
        id: id.to_string(),
        path,
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
        let e = recorded(&[], &r, &done, "/sp").unwrap();
        assert_eq!(
            e,
            SavepointHistoryEntry {
                id: "rescale-1".into(),
                path: "/sp/rescale-1".into(),
                time: "2026-12-01T10:00:00Z".into(),
            }
        );
        assert_eq!(recorded(&[e], &r, &done, "/sp"), None);
    }

    #[test]
    fn a_roll_back_records_the_savepoint_the_rescale_asked_for() {
        // Rolled back from this rescale's savepoint: the job runs from it.
        let r = rescale("rescale-2", Some("/sp/rescale-2"));
        let back = Outcome::RolledBack {
            parallelism: r.from.clone(),
            savepoint: Some("/sp/rescale-2".into()),
        };
        assert_eq!(
            recorded(&[], &r, &back, "/elsewhere").unwrap().path,
            "/sp/rescale-2"
        );
        // Rolled back to the savepoint of before the rescale, or to a fresh start: its own
        // savepoint may complete after the time-out, in the savepoint directory.
        let r = rescale("rescale-3", Some("/sp/rescale-1"));
        for restored in [Some("/sp/rescale-1".to_string()), None] {
            let back = Outcome::RolledBack {
                parallelism: r.from.clone(),
                savepoint: restored,
            };
            let e = recorded(&[], &r, &back, "/sp/").expect("recorded");
            assert_eq!(
                (e.id.as_str(), e.path.as_str()),
                ("rescale-3", "/sp/rescale-3")
            );
            assert_eq!(recorded(&[e], &r, &back, "/sp"), None, "once");
        }
    }

    #[test]
    fn failed_savepoints_failed_roll_backs_and_rescales_without_an_id_record_nothing() {
        let r = rescale("rescale-4", Some("/sp/rescale-4"));
        for outcome in [
            Outcome::SavepointFailed {
                reason: "disk full".into(),
            },
            Outcome::Failed {
                reason: "no".into(),
            },
        ] {
            assert_eq!(recorded(&[], &r, &outcome, "/sp"), None, "{outcome:?}");
        }
        let mut r = rescale("unused", None);
        r.savepoint_id = None;
        let back = Outcome::RolledBack {
            parallelism: r.from.clone(),
            savepoint: None,
        };
        assert_eq!(recorded(&[], &r, &back, "/sp"), None);
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
