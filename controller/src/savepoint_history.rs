//! Savepoint history of `streamscale run`: every rescale and every run's final stop leaves a
//! savepoint in `REPORT/savepoints`; only the newest few are kept, as the Flink Kubernetes
//! Operator keeps its savepoint history to `kubernetes.operator.savepoint.history.max.count`.
//!
//! What counts as a savepoint of the job here: a directory named `sp-…` (the engine's savepoint
//! ids) whose `_metadata.json` exists (the engine writes the metadata last: a completed
//! savepoint) and names the job (`job_name`). Anything else in the directory (an incomplete
//! savepoint, another job's savepoints — one report directory may serve several jobs —, a
//! user's own files, symlinks, unreadable metadata) is never touched, except the temporary
//! directory of a savepoint whose engine was killed while writing it
//! ([`remove_abandoned_in_progress`]). Savepoints are ordered by
//! their metadata's `created_unix_ms` (the modification time of the metadata when absent), the
//! id breaking ties.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use streamscale_engine::savepoint::disposal::{self, DisposeError};

/// Savepoints kept by default (`--keep-savepoints`), the Flink Kubernetes Operator's default
/// `kubernetes.operator.savepoint.history.max.count`.
pub const DEFAULT_KEEP_SAVEPOINTS: u32 = 10;

/// The file whose presence marks a completed savepoint.
const METADATA_FILE: &str = "_metadata.json";

/// Errors while pruning the savepoint history.
#[derive(Debug, thiserror::Error)]
pub enum PruneError {
    /// The savepoint directory could not be listed.
    #[error("cannot list savepoints in {dir}: {source}")]
    List {
        /// The savepoint directory.
        dir: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// An old savepoint could not be removed (the ones removed before it stay removed).
    #[error("cannot remove old savepoint {path}: {source}")]
    Remove {
        /// The savepoint directory that was to be removed.
        path: PathBuf,
        /// Why (the engine's disposal error, naming the path it left behind).
        source: DisposeError,
    },
}

/// A completed savepoint found in the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Completed {
    path: PathBuf,
    completed_at: SystemTime,
}

/// The fields of a savepoint's `_metadata.json` read here (the rest is ignored).
#[derive(serde::Deserialize)]
struct MetadataHead {
    job_name: String,
    #[serde(default)]
    created_unix_ms: Option<u64>,
}

/// When the savepoint whose metadata file is `meta` was created, if it is one of `job`'s.
fn created_by(meta: &Path, job: &str) -> Option<SystemTime> {
    let info = std::fs::symlink_metadata(meta).ok()?;
    if !info.is_file() {
        return None;
    }
    let head: MetadataHead = serde_json::from_slice(&std::fs::read(meta).ok()?).ok()?;
    if head.job_name != job {
        return None;
    }
    Some(match head.created_unix_ms {
        Some(ms) => SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms),
        None => info.modified().unwrap_or(SystemTime::UNIX_EPOCH),
    })
}

/// The completed savepoints of `job` in `dir`, oldest first (an absent `dir` has none).
fn completed_savepoints(dir: &Path, job: &str) -> Result<Vec<Completed>, PruneError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(PruneError::List {
                dir: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut found = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| PruneError::List {
            dir: dir.to_path_buf(),
            source,
        })?;
        let is_savepoint_name = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("sp-"));
        // `file_type` does not follow symlinks: a link to a directory elsewhere is left alone.
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_savepoint_name || !is_dir {
            continue;
        }
        let path = entry.path();
        if let Some(completed_at) = created_by(&path.join(METADATA_FILE), job) {
            found.push(Completed { path, completed_at });
        }
    }
    found.sort_by(|a, b| {
        a.completed_at
            .cmp(&b.completed_at)
            .then_with(|| a.path.cmp(&b.path))
    });
    Ok(found)
}

/// The completed savepoints of the job named `job` in `dir` (a directory `sp-…`, not a
/// symbolic link, whose `_metadata.json` names the job; see the module documentation), newest
/// first. An absent `dir` has none. `streamscale run` takes from here both the savepoints it
/// prunes and, after a second signal killed the engine during its final stop, the candidates
/// for the final savepoint.
///
/// # Errors
/// [`PruneError::List`] when `dir` cannot be read.
pub fn completed(dir: &Path, job: &str) -> Result<Vec<PathBuf>, PruneError> {
    Ok(completed_savepoints(dir, job)?
        .into_iter()
        .rev()
        .map(|c| c.path)
        .collect())
}

/// Removes the temporary directories that an engine killed while writing a savepoint left in
/// `dir`: the engine writes a savepoint `sp-…` into `.sp-….inprogress-PID` (PID = its process
/// id) and renames it into place when complete, so such a directory whose process no longer
/// runs (no `/proc/PID`) can never complete and is not a savepoint. A directory of a process
/// that still runs (a savepoint being written), other names and symlinks are left alone; a
/// directory that cannot be removed is skipped. Returns the removed paths.
pub fn remove_abandoned_in_progress(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.starts_with(".sp-"))
            .and_then(|n| n.rsplit_once(".inprogress-"))
            .and_then(|(_, pid)| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let runs = Path::new("/proc").join(pid.to_string()).exists();
        if is_dir && !runs && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed.push(entry.path());
        }
    }
    removed
}

/// Removes the oldest completed savepoints of the job named `job` in `dir` so that at most
/// `keep` (at least 1) of them remain, never removing `running_from` (the savepoint the running
/// engine was restored from, or the run's final savepoint: it counts towards `keep`). Each is
/// removed as the engine disposes of one ([`disposal::detach`]: renamed to a hidden
/// name, then deleted, so a half-removed savepoint never looks complete). Returns the removed
/// savepoints' paths, oldest first.
///
/// # Errors
/// [`PruneError::List`] when `dir` cannot be read; [`PruneError::Remove`] when a savepoint
/// cannot be removed (pruning stops there).
pub fn prune(
    dir: &Path,
    job: &str,
    keep: u32,
    running_from: &Path,
) -> Result<Vec<PathBuf>, PruneError> {
    let keep = usize::try_from(keep.max(1)).unwrap_or(usize::MAX);
    let completed = completed_savepoints(dir, job)?;
    let excess = completed.len().saturating_sub(keep);
    let mut removed = Vec::new();
    for old in &completed {
        if removed.len() == excess {
            break;
        }
        let Some(id) = old.path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let detached = match disposal::detach(dir, id, Some(running_from)) {
            Ok(detached) => detached,
            // The one the job runs from, or gone or changed since it was listed: not removed.
            Err(
                DisposeError::RestoredFrom { .. }
                | DisposeError::NotFound { .. }
                | DisposeError::NotASavepoint { .. }
                | DisposeError::InvalidId(_),
            ) => continue,
            Err(e) => {
                return Err(PruneError::Remove {
                    path: old.path.clone(),
                    source: e,
                });
            }
        };
        detached.remove().map_err(|source| PruneError::Remove {
            path: old.path.clone(),
            source,
        })?;
        removed.push(old.path.clone());
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Creates a completed savepoint `name` of job `job` created `age_s` seconds ago.
    fn savepoint_of(dir: &Path, job: &str, name: &str, age_s: u64) -> PathBuf {
        let path = dir.join(name);
        std::fs::create_dir_all(&path).expect("mkdir");
        std::fs::write(path.join("state-x.bin"), b"state").expect("state");
        let at = SystemTime::now() - Duration::from_secs(age_s);
        let ms = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis();
        let meta = serde_json::json!({"format_version": 1, "job_name": job, "created_unix_ms": ms});
        std::fs::write(path.join(METADATA_FILE), meta.to_string()).expect("metadata");
        path
    }

    /// A completed savepoint `name` of the job `job` (see [`savepoint_of`]).
    fn savepoint(dir: &Path, name: &str, age_s: u64) -> PathBuf {
        savepoint_of(dir, "job", name, age_s)
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn keeps_the_newest_and_removes_the_oldest() {
        let dir = tempfile::tempdir().expect("tempdir");
        // Names sort the other way round from completion times: the metadata time decides.
        let oldest = savepoint(dir.path(), "sp-job-3", 300);
        let middle = savepoint(dir.path(), "sp-job-2", 200);
        savepoint(dir.path(), "sp-job-1", 100);
        let removed = prune(dir.path(), "job", 1, Path::new("none")).expect("prune");
        assert_eq!(removed, vec![oldest, middle]);
        assert_eq!(names(dir.path()), vec!["sp-job-1"]);
        // Within the limit nothing goes.
        assert!(
            prune(dir.path(), "job", 1, Path::new("none"))
                .expect("prune")
                .is_empty()
        );
        assert_eq!(names(dir.path()), vec!["sp-job-1"]);
    }

    #[test]
    fn never_removes_a_protected_incomplete_or_foreign_entry() {
        let dir = tempfile::tempdir().expect("tempdir");
        let restored_from = savepoint(dir.path(), "sp-job-old", 500);
        savepoint(dir.path(), "sp-job-a", 400);
        savepoint(dir.path(), "sp-job-b", 300);
        savepoint(dir.path(), "sp-job-c", 200);
        // No metadata yet: still being written.
        std::fs::create_dir(dir.path().join("sp-job-writing")).expect("mkdir");
        // Not a savepoint id.
        std::fs::create_dir(dir.path().join("mine")).expect("mkdir");
        std::fs::write(dir.path().join("mine").join(METADATA_FILE), b"{}").expect("write");
        // Another job's savepoints (older than all), and metadata that cannot be read.
        savepoint_of(dir.path(), "other", "sp-other-1", 900);
        savepoint_of(dir.path(), "job-2", "sp-job-2-1", 800);
        std::fs::create_dir(dir.path().join("sp-job-garbled")).expect("mkdir");
        std::fs::write(dir.path().join("sp-job-garbled").join(METADATA_FILE), b"{").expect("w");
        std::fs::write(dir.path().join("sp-notes.txt"), b"x").expect("write");
        let removed = prune(dir.path(), "job", 2, &restored_from).expect("prune");
        // 4 completed, keep 2: the two oldest that are not protected.
        assert_eq!(
            removed,
            vec![dir.path().join("sp-job-a"), dir.path().join("sp-job-b")]
        );
        assert_eq!(
            names(dir.path()),
            vec![
                "mine",
                "sp-job-2-1",
                "sp-job-c",
                "sp-job-garbled",
                "sp-job-old",
                "sp-job-writing",
                "sp-notes.txt",
                "sp-other-1"
            ]
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_symlinked_savepoint_is_not_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let elsewhere = tempfile::tempdir().expect("tempdir");
        let target = savepoint(elsewhere.path(), "sp-job-precious", 900);
        std::os::unix::fs::symlink(&target, dir.path().join("sp-job-link")).expect("symlink");
        savepoint(dir.path(), "sp-job-new", 10);
        assert!(
            prune(dir.path(), "job", 1, Path::new("none"))
                .expect("prune")
                .is_empty()
        );
        assert!(target.join(METADATA_FILE).is_file());
    }

    #[test]
    fn completed_lists_only_the_jobs_completed_savepoints_newest_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let old = savepoint(dir.path(), "sp-job-b", 300);
        let new = savepoint(dir.path(), "sp-job-a", 10);
        savepoint_of(dir.path(), "other", "sp-other-1", 5);
        std::fs::create_dir(dir.path().join("sp-job-writing")).expect("mkdir");
        assert_eq!(completed(dir.path(), "job").expect("list"), vec![new, old]);
        assert!(
            completed(&dir.path().join("absent"), "job")
                .expect("absent")
                .is_empty()
        );
    }

    #[test]
    fn only_in_progress_directories_of_ended_processes_are_removed() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path();
        let kept = savepoint(dir, "sp-job-1", 10);
        // u32::MAX is above any pid_max: no such process.
        let ended = dir.join(format!(".sp-job-2.inprogress-{}", u32::MAX));
        let running = dir.join(format!(".sp-job-3.inprogress-{}", std::process::id()));
        let odd = dir.join(".sp-job-4.inprogress-x");
        for d in [&ended, &running, &odd] {
            std::fs::create_dir(d).expect("mkdir");
            std::fs::write(d.join("state-x.bin"), b"part").expect("part");
        }
        std::fs::write(
            dir.join(format!(".sp-job-5.inprogress-{}", u32::MAX)),
            b"file",
        )
        .expect("file");
        assert_eq!(remove_abandoned_in_progress(dir), vec![ended]);
        assert!(kept.join(METADATA_FILE).exists());
        assert_eq!(
            names(dir),
            [
                format!(".sp-job-3.inprogress-{}", std::process::id()),
                ".sp-job-4.inprogress-x".to_string(),
                format!(".sp-job-5.inprogress-{}", u32::MAX),
                "sp-job-1".to_string(),
            ]
        );
        assert!(remove_abandoned_in_progress(&dir.join("absent")).is_empty());
    }

    #[test]
    fn a_missing_directory_has_nothing_to_prune_and_zero_keeps_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(
            prune(&dir.path().join("absent"), "job", 3, Path::new("none"))
                .expect("prune")
                .is_empty()
        );
        savepoint(dir.path(), "sp-job-1", 20);
        savepoint(dir.path(), "sp-job-2", 10);
        assert_eq!(
            prune(dir.path(), "job", 0, Path::new("none"))
                .expect("prune")
                .len(),
            1
        );
        assert_eq!(names(dir.path()), vec!["sp-job-2"]);
    }
}
