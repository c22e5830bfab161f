//! Checkpoint storage through the `object_store` crate: completed checkpoints `chk-<id>/`
//! under one location, a local directory by default (`object_store`'s `LocalFileSystem`) or
//! an S3-compatible URL (`s3://bucket/prefix`, with the `s3` cargo feature; credentials and
//! endpoint from the usual `AWS_*` environment variables).
//!
//! Writing: the state files first, then the manifest `_metadata.json` (listing every file
//! with its size and CRC-32) last; each object is written to a temporary name and renamed
//! (atomic per object), and on a local filesystem every file and the checkpoint directory
//! are fsynced before the manifest is written, and the manifest after. A checkpoint is
//! complete exactly when its manifest exists, so a crash mid-write never leaves a checkpoint
//! that looks complete. An existing manifest is never overwritten. Retention deletes the
//! manifest of an old checkpoint first, then its files.
//!
//! Reading verifies the manifest and every file in bounded memory ([`CheckpointStorage::read`]); [`CheckpointStorage::latest`]
//! falls back from a damaged newest checkpoint to older ones, logging each refusal.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use crate::savepoint::{METADATA_FILE, Savepoint, SavepointError, SavepointMetadata};
use crate::spec::JobSpec;

/// Size of one part of a state file's multipart upload to an object store (bytes; S3 needs at
/// least 5 MiB per part but the last).
pub const UPLOAD_PART_BYTES: usize = 8 << 20;
/// Parts of one upload in flight at once: with [`UPLOAD_PART_BYTES`], bounds the memory a
/// checkpoint upload holds beyond the key groups being encoded.
pub const UPLOADS_IN_FLIGHT: usize = 4;

/// Prefix of a checkpoint directory's name; the id follows (`chk-42`).
pub const CHECKPOINT_PREFIX: &str = "chk-";

/// Errors of checkpoint storage.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A checkpoint's contents are invalid or cannot be encoded (names the file).
    #[error(transparent)]
    Savepoint(#[from] SavepointError),
    /// An object-store operation failed.
    #[error("{location}: {action}: {source}")]
    Store {
        /// The object or prefix.
        location: String,
        /// What was being done.
        action: &'static str,
        /// The store's error.
        source: object_store::Error,
    },
    /// A local file or directory could not be created or synced to disk.
    #[error("{path}: {action}: {source}")]
    Sync {
        /// The file or directory.
        path: PathBuf,
        /// What was being done (`cannot fsync`, `cannot create the checkpoint directory`).
        action: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The storage location is not usable.
    #[error("{location}: {reason}")]
    Location {
        /// The configured location.
        location: String,
        /// Why.
        reason: String,
    },
    /// The checkpoint already exists.
    #[error("{location}: checkpoint already exists; refusing to overwrite it")]
    Exists {
        /// Its manifest.
        location: String,
    },
    /// Checkpoints exist but none can be restored; each reason names its file.
    #[error("{location}: no usable checkpoint: {reasons}")]
    NoneUsable {
        /// The checkpoint location.
        location: String,
        /// Why each checkpoint was refused, newest first.
        reasons: String,
    },
}

/// Completed checkpoints of one job under one object-store location.
#[derive(Debug)]
pub struct CheckpointStorage {
    store: Arc<dyn ObjectStore>,
    prefix: ObjectPath,
    /// The configured location, for messages and `path_of`.
    location: PathBuf,
    /// The directory when the store is the local filesystem (for fsync).
    local: Option<PathBuf>,
    retain: usize,
    /// A runtime for network stores (`None`: local, driven inline).
    runtime: Option<tokio::runtime::Runtime>,
}

impl CheckpointStorage {
    /// Storage in the local directory `dir` keeping the newest `retain` (at least 1)
    /// completed checkpoints. The directory is created on the first write.
    pub fn new(dir: impl Into<PathBuf>, retain: u32) -> CheckpointStorage {
        let dir: PathBuf = dir.into();
        let absolute = std::path::absolute(&dir).unwrap_or_else(|_| dir.clone());
        let prefix = ObjectPath::from_absolute_path(&absolute).unwrap_or_else(|_| {
            ObjectPath::from(absolute.to_string_lossy().trim_start_matches('/'))
        });
        CheckpointStorage {
            store: Arc::new(object_store::local::LocalFileSystem::new()),
            prefix,
            location: dir,
            local: Some(absolute),
            retain: retain.max(1) as usize,
            runtime: None,
        }
    }

    /// Storage in an object store `store` (for example `object_store`'s `InMemory`) under
    /// `prefix`, keeping the newest `retain` (at least 1) completed checkpoints; objects are
    /// written and read through a runtime of this storage's own, as for S3. `location` names
    /// the checkpoints in messages.
    ///
    /// # Errors
    /// [`StorageError::Location`] when the runtime cannot start.
    pub fn with_store(
        store: Arc<dyn ObjectStore>,
        prefix: &str,
        location: &str,
        retain: u32,
    ) -> Result<CheckpointStorage, StorageError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| StorageError::Location {
                location: location.into(),
                reason: format!("cannot start the storage runtime: {e}"),
            })?;
        Ok(CheckpointStorage {
            store,
            prefix: ObjectPath::from(prefix),
            location: PathBuf::from(location),
            local: None,
            retain: retain.max(1) as usize,
            runtime: Some(runtime),
        })
    }

    /// Storage at `location`: a directory path, `file:///abs/dir`, or `s3://bucket/prefix`.
    ///
    /// # Errors
    /// [`StorageError::Location`] for an unsupported scheme (or `s3://` without the `s3`
    /// feature) or an S3 configuration error.
    pub fn open(location: &str, retain: u32) -> Result<CheckpointStorage, StorageError> {
        if let Some(path) = location.strip_prefix("file://") {
            return Ok(CheckpointStorage::new(path, retain));
        }
        if !location.contains("://") {
            return Ok(CheckpointStorage::new(location, retain));
        }
        if location.starts_with("s3://") {
            return open_s3(location, retain);
        }
        Err(StorageError::Location {
            location: location.into(),
            reason: "unsupported checkpoint storage URL (use a directory, file:// or s3://)".into(),
        })
    }

    /// Where the checkpoints are (directory or URL).
    pub fn location(&self) -> &Path {
        &self.location
    }

    /// Location of checkpoint `id` (a directory for local storage).
    pub fn path_of(&self, id: u64) -> PathBuf {
        self.location.join(format!("{CHECKPOINT_PREFIX}{id}"))
    }

    fn object(&self, id: u64, name: &str) -> ObjectPath {
        self.prefix
            .clone()
            .join(format!("{CHECKPOINT_PREFIX}{id}"))
            .join(name)
    }

    fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        match &self.runtime {
            Some(rt) => rt.block_on(f),
            None => futures::executor::block_on(f),
        }
    }

    fn store_err(
        &self,
        what: &ObjectPath,
        action: &'static str,
    ) -> impl FnOnce(object_store::Error) -> StorageError + use<> {
        let location = match &self.local {
            Some(_) => format!("/{what}"),
            None => format!("{}/{}", self.location.display(), what),
        };
        move |source| StorageError::Store {
            location,
            action,
            source,
        }
    }

    /// `(id, has manifest)` of every checkpoint directory.
    fn scan(&self) -> Result<Vec<(u64, bool)>, StorageError> {
        let listed: Result<Vec<_>, _> =
            self.block_on(self.store.list(Some(&self.prefix)).try_collect());
        let objects = match listed {
            Ok(o) => o,
            Err(object_store::Error::NotFound { .. }) => Vec::new(),
            Err(e) => return Err(self.store_err(&self.prefix, "cannot list checkpoints")(e)),
        };
        let mut found: std::collections::BTreeMap<u64, bool> = Default::default();
        let depth = self.prefix.parts().count();
        for meta in objects {
            let parts: Vec<_> = meta.location.parts().skip(depth).collect();
            let [dir, file] = parts.as_slice() else {
                continue;
            };
            let Some(id) = dir
                .as_ref()
                .strip_prefix(CHECKPOINT_PREFIX)
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            let complete = found.entry(id).or_default();
            *complete |= file.as_ref() == METADATA_FILE;
        }
        Ok(found.into_iter().collect())
    }

    /// Ids of the checkpoints that have a manifest (complete), ascending.
    ///
    /// # Errors
    /// [`StorageError::Store`] when the location cannot be listed.
    pub fn completed_ids(&self) -> Result<Vec<u64>, StorageError> {
        Ok(self
            .scan()?
            .into_iter()
            .filter(|(_, c)| *c)
            .map(|(id, _)| id)
            .collect())
    }

    /// The id the next checkpoint of a (re)started job should take: above every existing one,
    /// complete or not, so that nothing is ever overwritten.
    pub fn next_id(&self) -> u64 {
        let ids = self.scan().unwrap_or_default();
        let from_store = ids.iter().map(|(id, _)| *id).max().unwrap_or(0);
        // Local directories that hold no file yet count too.
        let from_dirs = self
            .local
            .as_ref()
            .and_then(|d| std::fs::read_dir(d).ok())
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
        from_store.max(from_dirs) + 1
    }

    fn fsync(&self, id: u64, name: Option<&str>) -> Result<(), StorageError> {
        let Some(dir) = &self.local else {
            return Ok(());
        };
        let dir = dir.join(format!("{CHECKPOINT_PREFIX}{id}"));
        let path = name.map_or(dir.clone(), |n| dir.join(n));
        std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(|source| StorageError::Sync {
                path,
                action: "cannot fsync",
                source,
            })
    }

    /// Writes checkpoint `id` (state files, then the manifest), then deletes completed
    /// checkpoints beyond the newest `retain` and the directories of failed or crashed attempts
    /// below `id`. Returns its location and manifest.
    ///
    /// # Errors
    /// [`StorageError`] naming the object when writing fails; no manifest is written, so
    /// nothing looks complete, what was written of checkpoint `id` is removed, and earlier
    /// checkpoints are untouched.
    pub fn write_checkpoint(
        &self,
        id: u64,
        snapshot: &Savepoint,
    ) -> Result<(String, SavepointMetadata), StorageError> {
        let written = self.try_write_checkpoint(id, snapshot);
        if let Err(e) = &written
            && !matches!(e, StorageError::Exists { .. })
        {
            self.discard(id);
        }
        written
    }

    /// Removes what a failed attempt wrote of checkpoint `id` (it has no manifest); failures
    /// are logged (a later write removes it again).
    fn discard(&self, id: u64) {
        let dir = self.prefix.clone().join(format!("{CHECKPOINT_PREFIX}{id}"));
        let listed: Result<Vec<_>, _> = self.block_on(self.store.list(Some(&dir)).try_collect());
        for o in listed.unwrap_or_default() {
            if let Err(e) = self.block_on(self.store.delete(&o.location)) {
                tracing::warn!(object = %o.location, error = %e, "cannot remove a file of a failed checkpoint");
            }
        }
        if let Some(local) = &self.local {
            let path = local.join(format!("{CHECKPOINT_PREFIX}{id}"));
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    tracing::info!(checkpoint = %path.display(), "removed the directory of a failed checkpoint")
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(checkpoint = %path.display(), error = %e, "cannot remove the directory of a failed checkpoint")
                }
            }
        }
    }

    fn try_write_checkpoint(
        &self,
        id: u64,
        snapshot: &Savepoint,
    ) -> Result<(String, SavepointMetadata), StorageError> {
        let manifest = self.object(id, METADATA_FILE);
        if self.block_on(self.store.head(&manifest)).is_ok() {
            return Err(StorageError::Exists {
                location: self.path_of(id).join(METADATA_FILE).display().to_string(),
            });
        }
        if let Some(dir) = &self.local {
            // Created first, so that an uncreatable directory is named as such.
            let chk = dir.join(format!("{CHECKPOINT_PREFIX}{id}"));
            std::fs::create_dir_all(&chk).map_err(|source| StorageError::Sync {
                path: chk.clone(),
                action: "cannot create the checkpoint directory",
                source,
            })?;
        }
        if let Some(dir) = &self.local {
            // Local filesystem: stream the state files (bounded memory, synced as they go)
            // rather than encoding the whole checkpoint in memory first.
            let chk = dir.join(format!("{CHECKPOINT_PREFIX}{id}"));
            let metadata = snapshot.write_state_files(&chk)?;
            self.fsync(id, None)?;
            let bytes = crate::savepoint::manifest::encode(&metadata).map_err(|e| {
                crate::savepoint::SavepointError::Invalid {
                    path: self.path_of(id).join(METADATA_FILE),
                    reason: format!("cannot encode metadata: {e}"),
                }
            })?;
            self.block_on(self.store.put(&manifest, PutPayload::from(bytes)))
                .map_err(self.store_err(&manifest, "cannot write checkpoint manifest"))?;
            self.fsync(id, Some(METADATA_FILE))?;
            self.fsync(id, None)?;
            self.apply_retention(id);
            return Ok((self.path_of(id).display().to_string(), metadata));
        }
        // Another store: each state file is streamed as a multipart upload, a few key
        // groups encoded at a time, at most UPLOADS_IN_FLIGHT parts of UPLOAD_PART_BYTES in
        // flight (bounded memory, not the whole checkpoint).
        let mut files = Vec::with_capacity(snapshot.state.len());
        for op in snapshot.state.keys() {
            files.push(self.upload_state_file(id, snapshot, op)?);
        }
        let metadata = snapshot.metadata_with_files(files);
        let bytes =
            crate::savepoint::manifest::encode(&metadata).map_err(|e| SavepointError::Invalid {
                path: self.path_of(id).join(METADATA_FILE),
                reason: format!("cannot encode metadata: {e}"),
            })?;
        self.block_on(self.store.put(&manifest, PutPayload::from(bytes)))
            .map_err(self.store_err(&manifest, "cannot write checkpoint manifest"))?;
        self.apply_retention(id);
        Ok((self.path_of(id).display().to_string(), metadata))
    }

    /// Streams operator `op`'s state file of checkpoint `id` to the store as a multipart
    /// upload (aborted on failure) and returns its manifest entry.
    fn upload_state_file(
        &self,
        id: u64,
        snapshot: &Savepoint,
        op: &str,
    ) -> Result<crate::savepoint::FileEntry, StorageError> {
        let object = self.object(id, &format!("state-{op}.bin"));
        let upload = self
            .block_on(self.store.put_multipart(&object))
            .map_err(self.store_err(&object, "cannot start uploading checkpoint file"))?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, UPLOAD_PART_BYTES);
        let mut failed = None;
        let streamed = snapshot.stream_state_file(op, &self.path_of(id), |bytes| {
            self.block_on(async {
                writer.wait_for_capacity(UPLOADS_IN_FLIGHT).await?;
                writer.put(bytes);
                Ok::<(), object_store::Error>(())
            })
            .map_err(|e| {
                let reason = format!("upload failed: {e}");
                failed = Some(e);
                SavepointError::Invalid {
                    path: self.path_of(id).join(format!("state-{op}.bin")),
                    reason,
                }
            })
        });
        let entry = match (streamed, failed) {
            (Ok(entry), _) => entry,
            (Err(_), Some(e)) => {
                let _ = self.block_on(writer.abort());
                return Err(self.store_err(&object, "cannot write checkpoint file")(e));
            }
            (Err(e), None) => {
                let _ = self.block_on(writer.abort());
                return Err(e.into());
            }
        };
        self.block_on(writer.finish())
            .map_err(self.store_err(&object, "cannot write checkpoint file"))?;
        Ok(entry)
    }

    /// After checkpoint `written` completed: deletes completed checkpoints beyond the newest
    /// `retain`, and checkpoint directories below `written` without a manifest (a failed
    /// attempt, or a process killed mid-write; nothing writes them any more).
    fn apply_retention(&self, written: u64) {
        let Ok(scanned) = self.scan() else {
            return;
        };
        for (id, _) in scanned.iter().filter(|(id, c)| !c && *id < written) {
            self.discard(*id);
        }
        if let Some(local) = &self.local {
            // Directories holding no file (created, then killed before the first file).
            let ids = std::fs::read_dir(local).into_iter().flatten().flatten();
            for e in ids {
                let name = e.file_name().to_string_lossy().into_owned();
                if let Some(id) = name
                    .strip_prefix(CHECKPOINT_PREFIX)
                    .and_then(|s| s.parse::<u64>().ok())
                    .filter(|id| *id < written)
                    && !scanned.iter().any(|(s, _)| *s == id)
                {
                    self.discard(id);
                }
            }
        }
        let ids: Vec<u64> = scanned
            .into_iter()
            .filter(|(_, c)| *c)
            .map(|(id, _)| id)
            .chain(std::iter::once(written))
            .collect::<std::collections::BTreeSet<u64>>()
            .into_iter()
            .collect();
        if ids.len() <= self.retain {
            return;
        }
        for id in &ids[..ids.len() - self.retain] {
            if let Err(e) = self.delete(*id) {
                tracing::warn!(error = %e, "cannot delete old checkpoint");
            }
        }
    }

    /// Removes every checkpoint at this location, completed or not (each completed one
    /// manifest first, as retention does), and the local directory itself when that leaves it
    /// empty. Anything else there is left alone. Returns how many checkpoints were removed.
    ///
    /// # Errors
    /// [`StorageError::Store`] naming the object that could not be listed or deleted; what
    /// was removed before it stays removed.
    pub fn remove_all(&self) -> Result<usize, StorageError> {
        let mut removed = 0;
        for (id, complete) in self.scan()? {
            if complete {
                self.delete(id)?;
            } else {
                self.discard(id);
            }
            removed += 1;
        }
        if let Some(local) = &self.local {
            for e in std::fs::read_dir(local).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if name
                    .strip_prefix(CHECKPOINT_PREFIX)
                    .is_some_and(|s| s.parse::<u64>().is_ok())
                {
                    let _ = std::fs::remove_dir(e.path());
                }
            }
            let _ = std::fs::remove_dir(local);
        }
        Ok(removed)
    }

    /// Deletes checkpoint `id`: its manifest first, so a half-deleted checkpoint never looks
    /// complete, then its files.
    fn delete(&self, id: u64) -> Result<(), StorageError> {
        let manifest = self.object(id, METADATA_FILE);
        self.block_on(self.store.delete(&manifest))
            .map_err(self.store_err(&manifest, "cannot delete checkpoint manifest"))?;
        let dir = self.prefix.clone().join(format!("{CHECKPOINT_PREFIX}{id}"));
        let objects: Vec<_> = self
            .block_on(self.store.list(Some(&dir)).try_collect::<Vec<_>>())
            .map_err(self.store_err(&dir, "cannot list checkpoint"))?;
        for o in objects {
            self.block_on(self.store.delete(&o.location))
                .map_err(self.store_err(&o.location, "cannot delete checkpoint file"))?;
        }
        if let Some(local) = &self.local {
            let _ = std::fs::remove_dir(local.join(format!("{CHECKPOINT_PREFIX}{id}")));
        }
        Ok(())
    }

    /// Reads and verifies checkpoint `id` for `spec` in bounded memory
    /// ([`Savepoint::read_from`]): a local checkpoint's state files are read in place; an
    /// object of another store is first streamed into an unlinked temporary file (in
    /// `std::env::temp_dir()`, removed when the restored state is dropped), never held whole
    /// in memory.
    ///
    /// # Errors
    /// [`SavepointError`] naming the file and reason.
    pub fn read(&self, id: u64, spec: &JobSpec) -> Result<Savepoint, SavepointError> {
        let fetch = |name: &str| -> std::io::Result<Vec<u8>> {
            let object = self.object(id, name);
            self.block_on(async {
                let got = self.store.get(&object).await?;
                got.bytes().await
            })
            .map(|b| b.to_vec())
            .map_err(std::io::Error::other)
        };
        if let Some(dir) = &self.local {
            let chk = dir.join(format!("{CHECKPOINT_PREFIX}{id}"));
            return Savepoint::read_from(
                &self.path_of(id),
                fetch,
                |name| std::fs::File::open(chk.join(name)),
                spec,
            );
        }
        let open = |name: &str| self.spool(&self.object(id, name));
        Savepoint::read_from(&self.path_of(id), fetch, open, spec)
    }

    /// Streams `object` into a new unlinked temporary file and returns it (opened for
    /// reading): memory holds one part of the download at a time.
    fn spool(&self, object: &ObjectPath) -> std::io::Result<std::fs::File> {
        use std::io::Write;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tmp = std::env::temp_dir().join(format!(
            ".streamscale-restore-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let mut file = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        // Unlinked at once: the open handle keeps it until the restored state is dropped.
        let _ = std::fs::remove_file(&tmp);
        self.block_on(async {
            let mut parts = self.store.get(object).await?.into_stream();
            while let Some(part) = parts.try_next().await? {
                file.write_all(&part)
                    .map_err(|e| object_store::Error::Generic {
                        store: "local temporary file",
                        source: Box::new(e),
                    })?;
            }
            Ok::<(), object_store::Error>(())
        })
        .map_err(std::io::Error::other)?;
        Ok(file)
    }

    /// The newest checkpoint that fully verifies against `spec`, falling back to older ones
    /// (each refusal is logged with the file and reason). `Ok(None)` when there is none at all.
    ///
    /// # Errors
    /// [`StorageError::NoneUsable`] when checkpoints exist but none verifies;
    /// [`StorageError::Store`] when the location cannot be listed.
    pub fn latest(&self, spec: &JobSpec) -> Result<Option<(PathBuf, Savepoint)>, StorageError> {
        self.latest_since(spec, 0)
    }

    /// [`Self::latest`] among the checkpoints numbered `first_id` or higher: those a job wrote
    /// since it started, when the directory also holds an earlier run's checkpoints (ids below
    /// [`Self::next_id`] at its start).
    ///
    /// # Errors
    /// As [`Self::latest`].
    pub fn latest_since(
        &self,
        spec: &JobSpec,
        first_id: u64,
    ) -> Result<Option<(PathBuf, Savepoint)>, StorageError> {
        let ids = self.completed_ids()?;
        let mut reasons = Vec::new();
        for id in ids.iter().rev().filter(|&&id| id >= first_id) {
            match self.read(*id, spec) {
                Ok(sp) => {
                    let path = self.path_of(*id);
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
                location: self.location.display().to_string(),
                reasons: reasons.join("; "),
            })
        }
    }
}

#[cfg(feature = "s3")]
fn open_s3(location: &str, retain: u32) -> Result<CheckpointStorage, StorageError> {
    let bad = |reason: String| StorageError::Location {
        location: location.into(),
        reason,
    };
    let store = object_store::aws::AmazonS3Builder::from_env()
        .with_url(location)
        .build()
        .map_err(|e| bad(format!("cannot configure S3: {e}")))?;
    let rest = location.trim_start_matches("s3://");
    let prefix = rest.split_once('/').map_or("", |(_, p)| p);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| bad(format!("cannot start the storage runtime: {e}")))?;
    Ok(CheckpointStorage {
        store: Arc::new(store),
        prefix: ObjectPath::from(prefix),
        location: PathBuf::from(location),
        local: None,
        retain: retain.max(1) as usize,
        runtime: Some(runtime),
    })
}

#[cfg(not(feature = "s3"))]
fn open_s3(location: &str, _retain: u32) -> Result<CheckpointStorage, StorageError> {
    Err(StorageError::Location {
        location: location.into(),
        reason: "S3 checkpoint storage needs the engine built with the `s3` cargo feature".into(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn locations_and_refusals() {
        let err = CheckpointStorage::open("ftp://host/x", 1)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ftp://host/x") && err.contains("unsupported"),
            "{err}"
        );
        #[cfg(not(feature = "s3"))]
        {
            let err = CheckpointStorage::open("s3://bucket/p", 1)
                .unwrap_err()
                .to_string();
            assert!(err.contains("`s3` cargo feature"), "{err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let url = format!("file://{}", dir.path().join("c").display());
        let storage = CheckpointStorage::open(&url, 1).unwrap();
        assert_eq!(storage.completed_ids().unwrap(), Vec::<u64>::new());
        assert_eq!(storage.next_id(), 1);
        // A directory without a manifest (a crash mid-write) is not complete but takes an id.
        std::fs::create_dir_all(storage.path_of(4)).unwrap();
        std::fs::write(storage.path_of(4).join("state-w.bin"), b"partial").unwrap();
        assert_eq!(storage.completed_ids().unwrap(), Vec::<u64>::new());
        assert_eq!(storage.next_id(), 5);
    }

    /// A job with one keyed window `w`, and its state with `keys` keys (key k counted k + 1
    /// times).
    fn window_job_with_keys(keys: u64) -> (crate::spec::JobSpec, crate::state::KeyedState) {
        let yaml = "name: j\noperators:\n  - { name: src, kind: source, rate: { constant: 1 } }\n  - { name: w, kind: window, sizeMs: 10 }\n  - { name: sink, kind: sink }\nedges:\n  - { from: src, to: w }\n  - { from: w, to: sink }\n";
        let spec = crate::spec::JobSpec::from_yaml(yaml).unwrap();
        spec.validate().unwrap();
        let mut state = crate::state::KeyedState::default();
        for key in 0..keys {
            state
                .entry(crate::keygroup::key_group(key, spec.max_parallelism), key)
                .unwrap()
                .total_count = key + 1;
        }
        (spec, state)
    }

    /// Checkpoint `id` of `spec` holding `state` as the window's.
    fn snapshot_of(
        spec: &crate::spec::JobSpec,
        state: &crate::state::KeyedState,
        id: u64,
    ) -> Savepoint {
        Savepoint {
            metadata: crate::savepoint::SavepointMetadata {
                checkpoint_id: Some(id),
                ..crate::savepoint::SavepointMetadata::for_job(spec, 0)
            },
            state: std::collections::BTreeMap::from([("w".into(), state.clone())]),
        }
    }

    #[test]
    fn a_local_checkpoint_streams_its_files_and_replaces_a_crashed_attempts_file() {
        let (spec, state) = window_job_with_keys(300);
        let snapshot = snapshot_of(&spec, &state, 2);
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::new(dir.path().join("c"), 3);
        std::fs::create_dir_all(storage.path_of(2)).unwrap();
        std::fs::write(storage.path_of(2).join("state-w.bin"), b"partial").unwrap();
        let (_, meta) = storage.write_checkpoint(2, &snapshot).unwrap();
        assert_eq!(storage.completed_ids().unwrap(), vec![2]);
        let file = std::fs::read(storage.path_of(2).join("state-w.bin")).unwrap();
        assert_eq!(meta.files[0].bytes, file.len() as u64);
        assert_eq!(meta.files[0].crc32, crc32fast::hash(&file));
        let back = storage.read(2, &spec).unwrap();
        assert_eq!(back.state, snapshot.state);
        assert_eq!(back.metadata.checkpoint_id, Some(2));
        // A completed checkpoint is never written again.
        assert!(storage.write_checkpoint(2, &snapshot).is_err());
    }

    #[test]
    fn failed_and_crashed_checkpoint_directories_are_removed() {
        let (spec, state) = window_job_with_keys(50);
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::new(dir.path().join("c"), 3);
        // A process killed mid-write left chk-3 with a partial file and chk-4 empty.
        std::fs::create_dir_all(storage.path_of(3)).unwrap();
        std::fs::write(storage.path_of(3).join("state-w.bin"), b"partial").unwrap();
        std::fs::create_dir_all(storage.path_of(4)).unwrap();
        // chk-5 fails: its manifest cannot be written (a directory is in the way).
        std::fs::create_dir_all(storage.path_of(5).join(METADATA_FILE)).unwrap();
        let err = storage
            .write_checkpoint(5, &snapshot_of(&spec, &state, 5))
            .unwrap_err()
            .to_string();
        assert!(err.contains("chk-5"), "{err}");
        assert!(
            !storage.path_of(5).exists(),
            "the failed checkpoint's directory is removed"
        );
        storage
            .write_checkpoint(6, &snapshot_of(&spec, &state, 6))
            .unwrap();
        assert!(!storage.path_of(3).exists() && !storage.path_of(4).exists());
        assert_eq!(storage.completed_ids().unwrap(), vec![6]);
        assert_eq!(storage.next_id(), 7);
    }

    #[test]
    fn an_object_store_checkpoint_streams_as_multipart_and_restores_with_fallback() {
        // 400 000 keys: 19.2 MB, more than two upload parts.
        let (spec, state) = window_job_with_keys(400_000);
        let snapshot = |id| snapshot_of(&spec, &state, id);
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let storage =
            CheckpointStorage::with_store(store.clone(), "jobs/j", "mem://jobs/j", 3).unwrap();
        let (_, meta1) = storage.write_checkpoint(1, &snapshot(1)).unwrap();
        assert!(meta1.files[0].bytes > 2 * UPLOAD_PART_BYTES as u64);
        let object = ObjectPath::from("jobs/j/chk-1/state-w.bin");
        let bytes = futures::executor::block_on(async {
            store.get(&object).await.unwrap().bytes().await.unwrap()
        });
        assert_eq!(bytes.len() as u64, meta1.files[0].bytes);
        assert_eq!(crc32fast::hash(&bytes), meta1.files[0].crc32);
        let back = storage.read(1, &spec).unwrap();
        assert_eq!(back.state, snapshot(1).state);
        // A damaged newer checkpoint: refused naming the file, and the older one restores.
        storage.write_checkpoint(2, &snapshot(2)).unwrap();
        let object = ObjectPath::from("jobs/j/chk-2/state-w.bin");
        let mut damaged = bytes.to_vec();
        damaged[1000] ^= 1;
        futures::executor::block_on(store.put(&object, PutPayload::from(damaged))).unwrap();
        let err = storage.read(2, &spec).unwrap_err().to_string();
        assert!(
            err.contains("chk-2")
                && err.contains("state-w.bin")
                && err.contains("checksum mismatch"),
            "{err}"
        );
        let (path, sp) = storage.latest(&spec).unwrap().unwrap();
        assert!(path.ends_with("chk-1"), "{}", path.display());
        assert_eq!(sp.metadata.checkpoint_id, Some(1));
        assert_eq!(sp.state, snapshot(1).state);
    }

    #[test]
    fn an_uncreatable_directory_is_named_as_such() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"not a directory").unwrap();
        let storage = CheckpointStorage::new(blocker.join("chk"), 1);
        let snapshot = Savepoint {
            metadata: crate::savepoint::SavepointMetadata {
                format_version: crate::savepoint::FORMAT_VERSION,
                job_name: "j".into(),
                fingerprint: "f".into(),
                max_parallelism: 128,
                parallelism: Default::default(),
                job_started_unix_ms: 0,
                created_unix_ms: 0,
                sources: Default::default(),
                counters: Default::default(),
                files: vec![],
                checkpoint_id: Some(1),
                key_groups: Default::default(),
                sinks: Default::default(),
                manifest_crc32: None,
            },
            state: Default::default(),
        };
        let err = storage
            .write_checkpoint(1, &snapshot)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot create the checkpoint directory")
                && err.contains(&blocker.join("chk").join("chk-1").display().to_string()),
            "{err}"
        );
    }
}
