//! Retiring the checkpoints an engine supersedes (`--retire-checkpoints`).
//!
//! An engine started from a savepoint never needs the checkpoints its predecessors took before
//! that savepoint: the savepoint is newer than all of them. Whoever deploys it (the Kubernetes
//! operator, which keeps one checkpoint directory per savepoint lineage) names those
//! directories, and once this engine has completed a checkpoint of its own (so that it has a
//! restore point newer than the savepoint), they are removed. Until then they stay: an engine
//! that dies before its first checkpoint is restarted from the savepoint, and nothing is lost
//! either way.

use std::sync::Arc;
use std::time::Duration;

use super::storage::{CheckpointStorage, StorageError};

/// The checkpoint locations to remove once `own` holds a completed checkpoint numbered
/// `first_id` or higher (one this process wrote).
pub struct Retirement {
    own: Arc<CheckpointStorage>,
    first_id: u64,
    retired: Vec<CheckpointStorage>,
}

impl Retirement {
    /// Retires `retired` after the first checkpoint of `own` numbered `first_id` or higher.
    pub fn new(
        own: Arc<CheckpointStorage>,
        first_id: u64,
        retired: Vec<CheckpointStorage>,
    ) -> Self {
        Retirement {
            own,
            first_id,
            retired,
        }
    }

    /// Checks once: `Ok(None)` while this engine has completed no checkpoint yet (nothing is
    /// removed), else removes every checkpoint of the retired locations and returns how many
    /// per location.
    ///
    /// # Errors
    /// [`StorageError`] when `own` cannot be listed or a retired checkpoint cannot be removed
    /// (what was removed before stays removed; a later call tries the rest again).
    pub fn try_retire(&self) -> Result<Option<Vec<usize>>, StorageError> {
        let own_done = self
            .own
            .completed_ids()?
            .last()
            .is_some_and(|&id| id >= self.first_id);
        if !own_done {
            return Ok(None);
        }
        let mut removed = Vec::with_capacity(self.retired.len());
        for r in &self.retired {
            removed.push(r.remove_all()?);
        }
        Ok(Some(removed))
    }

    /// Runs [`Self::try_retire`] every `poll` on a thread of its own until it has retired
    /// everything, logging what it removed (and errors, which are tried again).
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn spawn(self, poll: Duration) -> std::io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("checkpoint-retire".into())
            .spawn(move || {
                loop {
                    match self.try_retire() {
                        Ok(Some(removed)) => {
                            for (r, n) in self.retired.iter().zip(removed) {
                                tracing::info!(location = %r.location().display(), checkpoints = n, "removed the checkpoints this engine supersedes");
                            }
                            return;
                        }
                        Ok(None) => {}
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot remove the checkpoints this engine supersedes yet; trying again");
                        }
                    }
                    std::thread::sleep(poll);
                }
            })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::savepoint::METADATA_FILE;

    /// A checkpoint directory `chk-<id>` with one state file, and a manifest when `complete`
    /// (the storage tells complete from incomplete by the manifest's presence).
    fn fake_checkpoint(dir: &std::path::Path, id: u64, complete: bool) {
        let chk = dir.join(format!("chk-{id}"));
        std::fs::create_dir_all(&chk).unwrap();
        std::fs::write(chk.join("state-op.bin"), b"state").unwrap();
        if complete {
            std::fs::write(chk.join(METADATA_FILE), b"{}").unwrap();
        }
    }

    #[test]
    fn superseded_checkpoints_are_removed_only_after_the_engines_own_first_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let own_dir = tmp.path().join("lineage-new");
        let old_dir = tmp.path().join("lineage-old");
        fake_checkpoint(&old_dir, 7, true);
        fake_checkpoint(&old_dir, 8, true);
        fake_checkpoint(&old_dir, 9, false);
        std::fs::write(old_dir.join("notes.txt"), b"not a checkpoint").unwrap();
        // The new lineage holds a checkpoint of an earlier process (id 3): not this engine's.
        fake_checkpoint(&own_dir, 3, true);
        let own = Arc::new(CheckpointStorage::new(&own_dir, 3));
        let r = Retirement::new(own, 4, vec![CheckpointStorage::new(&old_dir, 3)]);

        assert_eq!(r.try_retire().unwrap(), None);
        fake_checkpoint(&own_dir, 4, false);
        assert_eq!(
            r.try_retire().unwrap(),
            None,
            "an incomplete checkpoint is no restore point"
        );
        assert!(old_dir.join("chk-8").join(METADATA_FILE).exists());

        fake_checkpoint(&own_dir, 4, true);
        assert_eq!(r.try_retire().unwrap(), Some(vec![3]));
        for id in 7..=9 {
            assert!(!old_dir.join(format!("chk-{id}")).exists(), "chk-{id}");
        }
        assert!(
            old_dir.join("notes.txt").exists(),
            "anything else is left alone"
        );
        assert!(own_dir.join("chk-3").exists() && own_dir.join("chk-4").exists());
        // Again (a restarted container with the same arguments): nothing left to remove.
        assert_eq!(r.try_retire().unwrap(), Some(vec![0]));
    }
}
