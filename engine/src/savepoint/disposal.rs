//! Disposal of a completed savepoint (`DELETE /v1/savepoints/{id}`, Flink's savepoint
//! disposal): the Kubernetes operator keeps a savepoint history and disposes the oldest through
//! the running engine, which is the one process that sees the savepoint volume.
//!
//! What may go: `DIR/ID` where `ID` is a valid savepoint id ([`validate_savepoint_id`]), the
//! entry is a real directory (a symlink is never followed, whatever it points to) holding a
//! `_metadata.json` file (the engine writes the metadata last and renames the finished
//! directory into place, so only a completed savepoint has one), and it is not the savepoint
//! the engine was restored from (its state files are read lazily while the job runs).
//!
//! Removal is in two steps so that no half-removed directory ever looks like a savepoint:
//! [`detach`] renames `DIR/ID` to the hidden `DIR/.ID.disposing-PID` (atomic, within the same
//! directory; the coordinator does it under its lock, so a concurrent request for the same id
//! sees either the savepoint or nothing), then [`Detached::remove`] deletes that directory.

use std::path::{Path, PathBuf};

use crate::savepoint::METADATA_FILE;
use crate::server::validate_savepoint_id;

/// Why a savepoint cannot be disposed of.
#[derive(Debug, thiserror::Error)]
pub enum DisposeError {
    /// The id is not a valid savepoint id (HTTP 400).
    #[error("{0}")]
    InvalidId(String),
    /// Nothing named `id` in the savepoint directory (HTTP 404).
    #[error("no savepoint `{id}` in {dir}")]
    NotFound {
        /// The requested id.
        id: String,
        /// The savepoint directory.
        dir: PathBuf,
    },
    /// `DIR/ID` exists but is not a completed savepoint directory: a symlink, a file, or a
    /// directory without `_metadata.json`. It is left in place (HTTP 404: there is no
    /// savepoint to dispose of).
    #[error("{path} is not a completed savepoint ({what}); left in place")]
    NotASavepoint {
        /// The entry.
        path: PathBuf,
        /// What it is instead.
        what: &'static str,
    },
    /// The engine was restored from this savepoint and may still read it (HTTP 409).
    #[error("savepoint `{id}` is the one this engine was restored from ({path}); not disposed")]
    RestoredFrom {
        /// The requested id.
        id: String,
        /// Its directory.
        path: PathBuf,
    },
    /// The savepoint is still being written (HTTP 409).
    #[error("savepoint `{id}` is still pending; not disposed")]
    Pending {
        /// The requested id.
        id: String,
    },
    /// Renaming or removing failed (HTTP 500).
    #[error("{path}: {action}: {source}")]
    Io {
        /// The directory.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A savepoint renamed out of the way by [`detach`], to be removed by [`Detached::remove`].
#[derive(Debug)]
pub struct Detached {
    /// Where the savepoint was (`DIR/ID`).
    pub path: PathBuf,
    /// Where it is now (`DIR/.ID.disposing-PID`).
    pub hidden: PathBuf,
}

impl Detached {
    /// Deletes the detached directory and returns the savepoint's former path.
    ///
    /// # Errors
    /// [`DisposeError::Io`] naming the hidden directory that is left behind.
    pub fn remove(self) -> Result<PathBuf, DisposeError> {
        std::fs::remove_dir_all(&self.hidden).map_err(|source| DisposeError::Io {
            path: self.hidden.clone(),
            action: "cannot remove the disposed savepoint",
            source,
        })?;
        Ok(self.path)
    }
}

/// Whether `a` and `b` name the same directory: compared canonically when both resolve, else
/// literally.
fn same_dir(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// Checks that `dir/id` is a completed savepoint other than `restored_from` (the path the
/// engine was restored from, as given on its command line) and renames it to a hidden name in
/// `dir`.
///
/// # Errors
/// [`DisposeError::InvalidId`], [`DisposeError::NotFound`], [`DisposeError::NotASavepoint`],
/// [`DisposeError::RestoredFrom`], or [`DisposeError::Io`] when the entry cannot be inspected
/// or renamed.
pub fn detach(
    dir: &Path,
    id: &str,
    restored_from: Option<&Path>,
) -> Result<Detached, DisposeError> {
    validate_savepoint_id(id).map_err(DisposeError::InvalidId)?;
    let path = dir.join(id);
    // `symlink_metadata` does not follow a link at `DIR/ID`.
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(DisposeError::NotFound {
                id: id.to_string(),
                dir: dir.to_path_buf(),
            });
        }
        Err(source) => {
            return Err(DisposeError::Io {
                path,
                action: "cannot inspect",
                source,
            });
        }
    };
    let not_a_savepoint = |what| DisposeError::NotASavepoint {
        path: path.clone(),
        what,
    };
    if meta.file_type().is_symlink() {
        return Err(not_a_savepoint("a symbolic link"));
    }
    if !meta.is_dir() {
        return Err(not_a_savepoint("not a directory"));
    }
    let has_metadata =
        std::fs::symlink_metadata(path.join(METADATA_FILE)).is_ok_and(|m| m.is_file());
    if !has_metadata {
        return Err(not_a_savepoint("no _metadata.json"));
    }
    if restored_from.is_some_and(|r| same_dir(&path, r)) {
        return Err(DisposeError::RestoredFrom {
            id: id.to_string(),
            path,
        });
    }
    let hidden = dir.join(format!(".{id}.disposing-{}", std::process::id()));
    if std::fs::symlink_metadata(&hidden).is_ok() {
        // Left by an earlier disposal of the same id whose removal failed.
        std::fs::remove_dir_all(&hidden).map_err(|source| DisposeError::Io {
            path: hidden.clone(),
            action: "cannot remove a stale disposed savepoint",
            source,
        })?;
    }
    std::fs::rename(&path, &hidden).map_err(|source| DisposeError::Io {
        path: path.clone(),
        action: "cannot move the savepoint aside for disposal",
        source,
    })?;
    Ok(Detached { path, hidden })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn savepoint(dir: &Path, id: &str) -> PathBuf {
        let p = dir.join(id);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("state-w.bin"), b"state").unwrap();
        std::fs::write(p.join(METADATA_FILE), b"{}").unwrap();
        p
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_completed_savepoint_is_detached_then_removed() {
        let d = tempfile::tempdir().unwrap();
        let p = savepoint(d.path(), "sp-a");
        savepoint(d.path(), "sp-b");
        let detached = detach(d.path(), "sp-a", None).unwrap();
        assert_eq!(detached.path, p);
        // Gone from its name at once; only the hidden copy is left until removed.
        assert!(!p.exists());
        assert!(detached.hidden.join(METADATA_FILE).is_file());
        assert_eq!(detached.remove().unwrap(), p);
        assert_eq!(entries(d.path()), vec!["sp-b"]);
        assert!(matches!(
            detach(d.path(), "sp-a", None),
            Err(DisposeError::NotFound { .. })
        ));
    }

    #[test]
    fn the_restored_from_savepoint_stays_however_its_path_is_written() {
        let d = tempfile::tempdir().unwrap();
        savepoint(d.path(), "base");
        let written = d.path().join(".").join("base");
        assert!(matches!(
            detach(d.path(), "base", Some(&written)),
            Err(DisposeError::RestoredFrom { .. })
        ));
        assert!(d.path().join("base").join(METADATA_FILE).is_file());
    }

    #[test]
    fn invalid_ids_incomplete_directories_and_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        for bad in ["", "..", "../x", "a/b", ".hidden"] {
            assert!(
                matches!(detach(d.path(), bad, None), Err(DisposeError::InvalidId(_))),
                "{bad:?}"
            );
        }
        std::fs::create_dir(d.path().join("partial")).unwrap();
        std::fs::write(d.path().join("partial").join("state-w.bin"), b"x").unwrap();
        std::fs::write(d.path().join("file"), b"x").unwrap();
        for id in ["partial", "file"] {
            assert!(
                matches!(
                    detach(d.path(), id, None),
                    Err(DisposeError::NotASavepoint { .. })
                ),
                "{id}"
            );
        }
        assert_eq!(entries(d.path()), vec!["file", "partial"]);
    }

    #[cfg(unix)]
    #[test]
    fn a_symlink_is_never_followed() {
        let d = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let target = savepoint(elsewhere.path(), "precious");
        std::os::unix::fs::symlink(&target, d.path().join("link")).unwrap();
        let e = detach(d.path(), "link", None).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(target.join(METADATA_FILE).is_file());
        assert!(d.path().join("link").exists());
    }
}
