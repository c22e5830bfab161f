//! Checkpoint storage: completed checkpoints `chk-<id>` under one directory, written atomically
//! (state files, then the manifest `_metadata.json`, in a temporary directory that is fsynced
//! and renamed into place), retention of the newest N, and discovery of the latest usable one
//! with fallback to older ones.

use std::path::{Path, PathBuf};

use crate::savepoint::{METADATA_FILE, Savepoint, SavepointError, SavepointMetadata};
use crate::spec::JobSpec;

/// Prefix of a checkpoint directory's name; the id follows (`chk-42`).
pub const CHECKPOINT_PREFIX: &str = "chk-";

/// Errors of checkpoint storage.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// Writing or reading a checkpoint failed (names the file).
    #[error(transparent)]
    Savepoint(#[from] SavepointError),
    /// The storage location cannot be listed.
    #[error("{path}: cannot list checkpoints: {source}")]
    List {
        /// The checkpoint directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Checkpoints exist but none can be restored; each reason names its file.
    #[error("{path}: no usable checkpoint: {reasons}")]
    NoneUsable {
        /// The checkpoint directory.
        path: PathBuf,
        /// Why each checkpoint was refused, newest first.
        reasons: String,
    },
}

/// Completed checkpoints of one job under a local directory.
#[derive(Debug)]
pub struct CheckpointStorage {
    dir: PathBuf,
    retain: usize,
}

impl CheckpointStorage {
    /// Storage under `dir` keeping the newest `retain` (at least 1) completed checkpoints.
    pub fn new(dir: impl Into<PathBuf>, retain: u32) -> CheckpointStorage {
        CheckpointStorage {
            dir: dir.into(),
            retain: retain.max(1) as usize,
        }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Directory of checkpoint `id`.
    pub fn path_of(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{CHECKPOINT_PREFIX}{id}"))
    }

    /// Ids of the checkpoint directories that have a manifest (complete-looking), ascending.
    ///
    /// # Errors
    /// [`StorageError::List`] when the directory exists but cannot be read.
    pub fn completed_ids(&self) -> Result<Vec<u64>, StorageError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(StorageError::List {
                    path: self.dir.clone(),
                    source,
                });
            }
        };
        let mut ids: Vec<u64> = entries
            .filter_map(Result::ok)
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let id = name.strip_prefix(CHECKPOINT_PREFIX)?.parse().ok()?;
                e.path().join(METADATA_FILE).is_file().then_some(id)
            })
            .collect();
        ids.sort_unstable();
        Ok(ids)
    }

    /// The id the next checkpoint of a (re)started job should take: above every existing one,
    /// so that no checkpoint is ever overwritten.
    pub fn next_id(&self) -> u64 {
        let max_dir = std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .filter_map(Result::ok)
                    .filter_map(|e| {
                        let name = e.file_name().to_string_lossy().into_owned();
                        name.strip_prefix(CHECKPOINT_PREFIX)?.parse::<u64>().ok()
                    })
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        max_dir + 1
    }

    /// Writes checkpoint `id` atomically, then deletes completed checkpoints beyond the
    /// newest `retain`. Returns its location and manifest.
    ///
    /// # Errors
    /// [`StorageError::Savepoint`] naming the file when writing fails; nothing that looks
    /// complete is left and earlier checkpoints are untouched.
    pub fn write_checkpoint(
        &self,
        id: u64,
        snapshot: &Savepoint,
    ) -> Result<(String, SavepointMetadata), StorageError> {
        let path = self.path_of(id);
        let meta = snapshot.write(&path)?;
        self.apply_retention();
        Ok((path.display().to_string(), meta))
    }

    fn apply_retention(&self) {
        let Ok(ids) = self.completed_ids() else {
            return;
        };
        if ids.len() <= self.retain {
            return;
        }
        for id in &ids[..ids.len() - self.retain] {
            let path = self.path_of(*id);
            // The manifest goes first, so a half-deleted checkpoint never looks complete.
            let _ = std::fs::remove_file(path.join(METADATA_FILE));
            if let Err(e) = std::fs::remove_dir_all(&path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot delete old checkpoint");
            }
        }
    }

    /// The newest checkpoint that fully verifies against `spec`, falling back to older ones
    /// (each refusal is logged with the file and reason). `Ok(None)` when there is none at all.
    ///
    /// # Errors
    /// [`StorageError::NoneUsable`] when checkpoints exist but none verifies;
    /// [`StorageError::List`] when the directory cannot be read.
    pub fn latest(&self, spec: &JobSpec) -> Result<Option<(PathBuf, Savepoint)>, StorageError> {
        let ids = self.completed_ids()?;
        let mut reasons = Vec::new();
        for id in ids.iter().rev() {
            let path = self.path_of(*id);
            match Savepoint::read(&path, spec) {
                Ok(sp) => {
                    if !reasons.is_empty() {
                        tracing::warn!(
                            checkpoint = %path.display(),
                            "falling back to an older completed checkpoint"
                        );
                    }
                    return Ok(Some((path, sp)));
                }
                Err(e) => {
                    tracing::error!(error = %e, "checkpoint refused");
                    reasons.push(e.to_string());
                }
            }
        }
        if reasons.is_empty() {
            Ok(None)
        } else {
            Err(StorageError::NoneUsable {
                path: self.dir.clone(),
                reasons: reasons.join("; "),
            })
        }
    }
}
