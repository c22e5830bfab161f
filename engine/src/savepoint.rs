//! Savepoints: a versioned, checksummed directory holding keyed state per operator (organized
//! by key group), source positions and counters.
//!
//! Layout of a completed savepoint `DIR/`:
//! - `state-<operator>.bin`: the operator's keyed state, one file per keyed operator: one chunk
//!   per key group in key-group order ([`crate::state::chunk`] for `window` state, then the
//!   event-time operators' per-key-group blobs), so that a restore at any parallelism takes
//!   each subtask's key groups as regions of the file without decoding anything;
//! - `_metadata.json`: [`SavepointMetadata`], written last, listing every file with its size,
//!   CRC-32 and chunk index (key group → offset, length).
//!
//! Writing streams (`writer`): key groups are encoded on several threads at once (one per
//! core) into a few reused buffers and written in key-group order while a background
//! `fdatasync` every 64 MB keeps the device busy, so memory stays at a few key groups and the
//! final `fsync` has little left to do. Files written by earlier versions (one postcard value per operator, no chunk
//! index) are still read.
//!
//! Reading ([`reader`]) verifies each state file in one pass through a bounded buffer and
//! hands its key groups out as regions of the open file, read on demand by the subtasks that
//! own them after the restore: a restore never holds a whole state file in memory.
//!
//! Writing is atomic: everything goes to a hidden temporary directory beside the target, each
//! file is fsynced, then the directory is renamed into place and its parent fsynced. A crash
//! mid-write leaves only the temporary directory, never a directory that looks complete. An
//! existing directory is never overwritten.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::spec::JobSpec;
use crate::state::{KeyGroupData, KeyedState};

/// Version of the savepoint format written by this engine: 3 (`window` entries carry the
/// open pane's min and max, [`crate::state::chunk`]). Version 2 files (48-byte entries) are
/// migrated when read ([`crate::state::chunk::migrate_legacy`]), version 1 files (one postcard
/// value per operator) decoded as they were written.
pub const FORMAT_VERSION: u32 = 3;
/// Oldest savepoint format version this engine reads (version 1 manifests carry no checksum of
/// their own).
pub const OLDEST_FORMAT_VERSION: u32 = 1;
/// Name of the metadata file inside a savepoint directory.
pub const METADATA_FILE: &str = "_metadata.json";

/// Errors reading or writing a savepoint. Each names the file and the reason.
#[derive(Debug, thiserror::Error)]
pub enum SavepointError {
    /// An I/O operation failed.
    #[error("{path}: {action}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The savepoint is incomplete, corrupted or belongs to another job.
    #[error("{path}: {reason}")]
    Invalid {
        /// The offending file.
        path: PathBuf,
        /// Why it cannot be used.
        reason: String,
    },
    /// The target directory already exists.
    #[error("{path}: savepoint directory already exists; refusing to overwrite it")]
    Exists {
        /// The existing directory.
        path: PathBuf,
    },
}

/// Source position: how far a source operator has emitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePosition {
    /// Records emitted in total (the next record's sequence number).
    pub emitted: u64,
    /// Kafka sources: the next offset to read of every partition read so far (partition →
    /// offset). A restored source reads each partition from here, whichever subtask now
    /// owns it; partitions not listed are read from their earliest offset.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kafka_offsets: BTreeMap<i32, i64>,
}

/// Cumulative record counters of one operator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorCounters {
    /// Records received.
    pub records_in: u64,
    /// Records sent downstream.
    pub records_out: u64,
    /// Sinks: source records whose effect reached the sink (sum of window counts).
    pub accounted: u64,
    /// Filters: records removed on purpose.
    pub filtered: u64,
}

/// One data file of a savepoint, with its integrity data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name inside the savepoint directory.
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
    /// CRC-32 (IEEE) of the contents.
    pub crc32: u32,
    /// The chunks of the file, in file order (empty in files of earlier versions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<ChunkEntry>,
}

/// Where one key group's state sits in a state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkEntry {
    /// Key group.
    pub key_group: u32,
    /// Byte offset in the file.
    pub offset: u64,
    /// Length in bytes.
    pub bytes: u64,
    /// An event-time operator's blob (else `window` state in [`crate::state::chunk`] form).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub blob: bool,
    /// Some key has an open window pane.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub open_panes: bool,
}

/// The layout of files written by earlier versions: one postcard value per operator.
#[derive(Deserialize)]
struct LegacyKeyedState {
    groups: BTreeMap<u32, BTreeMap<u64, crate::state::LegacyKeyState>>,
    #[serde(default)]
    blobs: BTreeMap<u32, Vec<u8>>,
}

/// `_metadata.json`: what a savepoint holds and how to check it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavepointMetadata {
    /// Format version ([`FORMAT_VERSION`]).
    pub format_version: u32,
    /// Job name.
    pub job_name: String,
    /// [`JobSpec::fingerprint`] of the job that wrote it.
    pub fingerprint: String,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Parallelism per operator when the savepoint was taken.
    pub parallelism: BTreeMap<String, u32>,
    /// When the job first started (ms since the Unix epoch); sources' rate clocks run from it.
    pub job_started_unix_ms: u64,
    /// When the savepoint was written (ms since the Unix epoch).
    pub created_unix_ms: u64,
    /// Source operator → position.
    pub sources: BTreeMap<String, SourcePosition>,
    /// Operator → cumulative counters.
    pub counters: BTreeMap<String, OperatorCounters>,
    /// Data files with sizes and checksums.
    pub files: Vec<FileEntry>,
    /// Checkpoint id (the barrier's number) when taken by barriers; absent for the final
    /// state of a job that finished by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<u64>,
    /// Keyed operator → key-group range `[start, end)` of each subtask when taken.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub key_groups: BTreeMap<String, Vec<[u32; 2]>>,
    /// Sink operator → the pre-committed transactions this snapshot covers
    /// ([`crate::sink::two_phase`]): committed once it is written, and again (idempotently) on
    /// a restore from it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sinks: BTreeMap<String, Vec<crate::sink::Committable>>,
    /// CRC-32 of the manifest's own bytes ([`manifest`]); set only while encoding and decoding
    /// (`None` in memory). Always the last field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_crc32: Option<String>,
}

impl SavepointMetadata {
    /// The manifest of a savepoint of `spec` at its parallelism, in this engine's format
    /// version, taken at `created_unix_ms` (ms since the Unix epoch) by a job started then
    /// too: no source positions, counters, files, checkpoint id or key-group ranges yet.
    pub fn for_job(spec: &JobSpec, created_unix_ms: u64) -> SavepointMetadata {
        SavepointMetadata {
            format_version: FORMAT_VERSION,
            job_name: spec.name.clone(),
            fingerprint: spec.fingerprint(),
            max_parallelism: spec.max_parallelism,
            parallelism: spec.parallelism(),
            job_started_unix_ms: created_unix_ms,
            created_unix_ms,
            sources: BTreeMap::new(),
            counters: BTreeMap::new(),
            files: Vec::new(),
            checkpoint_id: None,
            key_groups: BTreeMap::new(),
            sinks: BTreeMap::new(),
            manifest_crc32: None,
        }
    }
}

/// A savepoint's full contents, as taken from a stopped job or loaded from disk.
#[derive(Debug, Clone, PartialEq)]
pub struct Savepoint {
    /// Metadata (files are filled in when written).
    pub metadata: SavepointMetadata,
    /// Keyed operator → its whole keyed state (all key groups).
    pub state: BTreeMap<String, KeyedState>,
}

fn io<'a>(
    path: &'a Path,
    action: &'static str,
) -> impl FnOnce(std::io::Error) -> SavepointError + 'a {
    move |source| SavepointError::Io {
        path: path.to_path_buf(),
        action,
        source,
    }
}

fn write_synced(path: &Path, chunks: &[Bytes]) -> Result<(), SavepointError> {
    let mut f = File::create(path).map_err(io(path, "cannot create file"))?;
    for c in chunks {
        f.write_all(c).map_err(io(path, "cannot write file"))?;
    }
    f.sync_all().map_err(io(path, "cannot fsync file"))
}

/// A state file's manifest entry built as its key groups are written in file order: size,
/// CRC-32 combined from the key groups' CRCs, chunk index. Shared by every writer (local
/// streaming, object-store multipart).
pub(crate) struct IndexBuilder {
    name: String,
    offset: u64,
    crc: crc32fast::Hasher,
    chunks: Vec<ChunkEntry>,
}

impl IndexBuilder {
    /// An empty file named `name`, expecting about `key_groups` chunks.
    pub(crate) fn new(name: &str, key_groups: usize) -> IndexBuilder {
        IndexBuilder {
            name: name.to_string(),
            offset: 0,
            crc: crc32fast::Hasher::new(),
            chunks: Vec::with_capacity(key_groups),
        }
    }

    /// Appends key group `key_group`'s chunk of `bytes` bytes whose CRC-32 state is `crc`.
    pub(crate) fn push(
        &mut self,
        key_group: u32,
        bytes: u64,
        crc: &crc32fast::Hasher,
        blob: bool,
        open_panes: bool,
    ) {
        self.crc.combine(crc);
        self.chunks.push(ChunkEntry {
            key_group,
            offset: self.offset,
            bytes,
            blob,
            open_panes,
        });
        self.offset += bytes;
    }

    /// The manifest entry.
    pub(crate) fn finish(self) -> FileEntry {
        FileEntry {
            name: self.name,
            bytes: self.offset,
            crc32: self.crc.finalize(),
            chunks: self.chunks,
        }
    }
}

pub mod disposal;
pub mod manifest;
pub mod reader;
mod writer;

use writer::Work;

/// A state file's key groups in file order: `window` state, then event-time blobs.
fn work_items(state: &KeyedState) -> Vec<(u32, Work<'_>)> {
    let mut items: Vec<(u32, Work<'_>)> =
        Vec::with_capacity(state.groups.len() + state.blobs.len());
    items.extend(state.groups.iter().map(|(kg, d)| (*kg, Work::Keys(d))));
    items.extend(state.blobs.iter().map(|(kg, b)| (*kg, Work::Blob(b))));
    items
}

/// An encoded key group: its bytes, CRC-32 state and pane flag.
type Done = Result<(Bytes, crc32fast::Hasher, bool), crate::state::StateError>;

/// Encodes and checksums `items` on up to one thread per core, keeping their order.
fn encode_parallel(items: &[(u32, Work<'_>)]) -> Vec<Done> {
    let one = |(_, w): &(u32, Work<'_>)| -> Done {
        let (bytes, open) = match w {
            Work::Keys(d) => d.encode()?,
            Work::Blob(b) => (Bytes::copy_from_slice(b), false),
        };
        let mut h = crc32fast::Hasher::new();
        h.update(&bytes);
        Ok((bytes, h, open))
    };
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len().max(1));
    if threads <= 1 {
        return items.iter().map(one).collect();
    }
    let per = items.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(per)
            .map(|part| scope.spawn(move || part.iter().map(one).collect::<Vec<_>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join().unwrap_or_else(|_| {
                    vec![Err(crate::state::StateError::Decode {
                        key_group: 0,
                        reason: "an encoding thread panicked".into(),
                    })]
                })
            })
            .collect()
    })
}

impl Savepoint {
    /// Writes the savepoint atomically to `dir` (which must not exist) and returns the
    /// metadata as written.
    ///
    /// # Errors
    /// [`SavepointError::Exists`] if `dir` exists; [`SavepointError::Io`] when writing fails
    /// (the temporary directory is removed and nothing else is touched).
    pub fn write(&self, dir: &Path) -> Result<SavepointMetadata, SavepointError> {
        if dir.exists() {
            return Err(SavepointError::Exists {
                path: dir.to_path_buf(),
            });
        }
        let parent = dir.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(parent).map_err(io(parent, "cannot create savepoint directory"))?;
        let leaf = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "savepoint".into());
        let tmp = parent.join(format!(".{leaf}.inprogress-{}", std::process::id()));
        if tmp.exists() {
            fs::remove_dir_all(&tmp).map_err(io(&tmp, "cannot remove stale temporary dir"))?;
        }
        fs::create_dir(&tmp).map_err(io(&tmp, "cannot create temporary dir"))?;
        let result = self.write_into(&tmp).and_then(|meta| {
            fs::rename(&tmp, dir).map_err(io(dir, "cannot move savepoint into place"))?;
            File::open(parent)
                .and_then(|d| d.sync_all())
                .map_err(io(parent, "cannot fsync savepoint parent dir"))?;
            Ok(meta)
        });
        if result.is_err() {
            let _ = fs::remove_dir_all(&tmp);
        }
        result
    }

    /// Streams each state file into `tmp` ([`writer`]: key groups encoded on every core into
    /// a few reused buffers, written in order, synced in the background as they go), then
    /// writes the manifest listing them.
    fn write_into(&self, tmp: &Path) -> Result<SavepointMetadata, SavepointError> {
        self.write_streaming(tmp, writer::Streaming::for_this_machine())
    }

    fn write_streaming(
        &self,
        tmp: &Path,
        how: writer::Streaming,
    ) -> Result<SavepointMetadata, SavepointError> {
        let meta = self.write_state_files_with(tmp, how)?;
        let manifest = manifest::encode(&meta).map_err(|e| SavepointError::Invalid {
            path: tmp.join(METADATA_FILE),
            reason: format!("cannot encode metadata: {e}"),
        })?;
        write_synced(&tmp.join(METADATA_FILE), &[Bytes::from(manifest)])?;
        Ok(meta)
    }

    /// Streams the state files (no manifest) into the existing directory `dir`, each fsynced,
    /// as [`Savepoint::write`] does, and returns the manifest to write after them. A file of
    /// the same name left in `dir` by an attempt that crashed is replaced. For checkpoint
    /// storage on the local filesystem.
    ///
    /// # Errors
    /// [`SavepointError::Io`] when a file cannot be removed, created, written or synced;
    /// [`SavepointError::Invalid`] when a key group cannot be encoded.
    pub fn write_state_files(&self, dir: &Path) -> Result<SavepointMetadata, SavepointError> {
        for op in self.state.keys() {
            let path = dir.join(format!("state-{op}.bin"));
            match fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io(&path, "cannot remove a partial file")(e));
                }
                _ => {}
            }
        }
        self.write_state_files_with(dir, writer::Streaming::for_this_machine())
    }

    fn write_state_files_with(
        &self,
        tmp: &Path,
        how: writer::Streaming,
    ) -> Result<SavepointMetadata, SavepointError> {
        let mut meta = self.metadata.clone();
        meta.format_version = FORMAT_VERSION;
        meta.files.clear();
        for (op, state) in &self.state {
            let name = format!("state-{op}.bin");
            let items = work_items(state);
            let started = std::time::Instant::now();
            let entry = writer::write_state_file(&tmp.join(&name), &name, &items, how)?;
            tracing::debug!(file = %name, bytes = entry.bytes, seconds = started.elapsed().as_secs_f64(), "savepoint state file written and synced");
            meta.files.push(entry);
        }
        Ok(meta)
    }

    /// Encodes operator `op`'s state file in file order and hands it to `put` one key group
    /// at a time (encoded a few key groups at once on every core), so that memory holds a few
    /// key groups, not the file; returns its manifest entry (size, CRC-32, chunk index).
    /// `location` only names files in errors. For object stores (streamed as a multipart
    /// upload).
    ///
    /// # Errors
    /// [`SavepointError::Invalid`] when `op` has no state or a key group cannot be encoded;
    /// whatever `put` returns.
    pub fn stream_state_file(
        &self,
        op: &str,
        location: &Path,
        mut put: impl FnMut(Bytes) -> Result<(), SavepointError>,
    ) -> Result<FileEntry, SavepointError> {
        let name = format!("state-{op}.bin");
        let bad = |reason: String| SavepointError::Invalid {
            path: location.join(&name),
            reason,
        };
        let state = self
            .state
            .get(op)
            .ok_or_else(|| bad(format!("no keyed state for operator `{op}`")))?;
        let items = work_items(state);
        let batch = 2 * std::thread::available_parallelism().map_or(1, |n| n.get());
        let mut index = IndexBuilder::new(&name, items.len());
        for part in items.chunks(batch) {
            for ((kg, w), done) in part.iter().zip(encode_parallel(part)) {
                let (bytes, h, open) =
                    done.map_err(|e| bad(format!("cannot encode state: {e}")))?;
                index.push(
                    *kg,
                    bytes.len() as u64,
                    &h,
                    matches!(w, Work::Blob(_)),
                    open,
                );
                put(bytes)?;
            }
        }
        Ok(index.finish())
    }

    /// The manifest of this savepoint with `files` (as returned for its state files by
    /// [`Savepoint::stream_state_file`]), in this engine's format version.
    pub fn metadata_with_files(&self, files: Vec<FileEntry>) -> SavepointMetadata {
        let mut meta = self.metadata.clone();
        meta.format_version = FORMAT_VERSION;
        meta.files = files;
        meta
    }

    /// Reads and fully verifies a savepoint for `spec`: metadata present and parsable, known
    /// format version, same job fingerprint and key-group count, every listed file present
    /// with the right size and checksum, every keyed operator's state present, every chunk's
    /// key order checked.
    ///
    /// Bounded memory ([`reader`]): each state file is read once through one buffer of
    /// [`reader::READ_BUFFER_BYTES`], and its `window` key groups are returned as regions of
    /// the open file ([`KeyGroupData::Stored`]), read on demand by the subtask that owns them
    /// after the restore. Only event-time operators' blobs are loaded into memory.
    ///
    /// # Errors
    /// [`SavepointError`] naming the offending file and the reason. Nothing is partially loaded.
    pub fn read(dir: &Path, spec: &JobSpec) -> Result<Savepoint, SavepointError> {
        if !dir.is_dir() {
            return Err(SavepointError::Invalid {
                path: dir.to_path_buf(),
                reason: "savepoint directory does not exist".into(),
            });
        }
        Savepoint::read_from(
            dir,
            |name| fs::read(dir.join(name)),
            |name| File::open(dir.join(name)),
            spec,
        )
    }

    /// Reads and fully verifies a savepoint as [`Savepoint::read`], with the metadata from
    /// `fetch(name)` and each state file opened by `open(name)` (a local file, or an object
    /// spooled to an unlinked temporary file). `dir` names files in errors.
    ///
    /// # Errors
    /// [`SavepointError`] naming the offending file and the reason. Nothing is partially loaded.
    pub fn read_from(
        dir: &Path,
        fetch: impl FnMut(&str) -> std::io::Result<Vec<u8>>,
        mut open: impl FnMut(&str) -> std::io::Result<File>,
        spec: &JobSpec,
    ) -> Result<Savepoint, SavepointError> {
        Savepoint::decode_with(dir, fetch, spec, |entry, path, version| {
            let file = open(&entry.name).map_err(|e| SavepointError::Invalid {
                path: path.to_path_buf(),
                reason: format!("cannot read state file listed in the metadata: {e}"),
            })?;
            reader::load_state_file(path, entry, file, version)
        })
    }

    /// As [`Savepoint::read_from`], with the metadata from `fetch` and each state file loaded
    /// and verified (size, CRC-32, chunk index) by `load`.
    fn decode_with(
        dir: &Path,
        mut fetch: impl FnMut(&str) -> std::io::Result<Vec<u8>>,
        spec: &JobSpec,
        mut load: impl FnMut(&FileEntry, &Path, u32) -> Result<KeyedState, SavepointError>,
    ) -> Result<Savepoint, SavepointError> {
        let meta_path = dir.join(METADATA_FILE);
        let text = fetch(METADATA_FILE).map_err(|e| SavepointError::Invalid {
            path: meta_path.clone(),
            reason: format!("cannot read savepoint metadata ({e}); the savepoint is incomplete"),
        })?;
        let mut metadata: SavepointMetadata =
            serde_json::from_slice(&text).map_err(|e| SavepointError::Invalid {
                path: meta_path.clone(),
                reason: format!("metadata is truncated or malformed: {e}"),
            })?;
        let bad = |reason: String| SavepointError::Invalid {
            path: meta_path.clone(),
            reason,
        };
        manifest::verify(&meta_path, &text, &mut metadata)?;
        let same_but_key_groups = metadata.max_parallelism != spec.max_parallelism && {
            let mut other = spec.clone();
            other.max_parallelism = metadata.max_parallelism;
            other.fingerprint() == metadata.fingerprint
        };
        if same_but_key_groups {
            // The fingerprint covers maxParallelism too: name the setting that changed rather
            // than calling the savepoint another job's.
            return Err(bad(format!(
                "savepoint was taken with maxParallelism {} but the job declares maxParallelism {}; keyed state is split into maxParallelism key groups, which cannot change across a restore: set `maxParallelism: {}` in the job file to restore it",
                metadata.max_parallelism, spec.max_parallelism, metadata.max_parallelism
            )));
        }
        if metadata.fingerprint != spec.fingerprint() {
            return Err(bad(format!(
                "savepoint belongs to another job (job `{}`, fingerprint {}…), not to `{}` ({}…)",
                metadata.job_name,
                &metadata
                    .fingerprint
                    .get(..12)
                    .unwrap_or(&metadata.fingerprint),
                spec.name,
                &spec.fingerprint()[..12]
            )));
        }
        if metadata.max_parallelism != spec.max_parallelism {
            return Err(bad(format!(
                "savepoint has {} key groups but the job declares maxParallelism {}",
                metadata.max_parallelism, spec.max_parallelism
            )));
        }
        let mut state = BTreeMap::new();
        for entry in &metadata.files {
            let path = dir.join(&entry.name);
            let op = entry
                .name
                .strip_prefix("state-")
                .and_then(|s| s.strip_suffix(".bin"))
                .ok_or_else(|| SavepointError::Invalid {
                    path: path.clone(),
                    reason: "unexpected file name in savepoint".into(),
                })?;
            let keyed = load(entry, &path, metadata.format_version)?;
            state.insert(op.to_string(), keyed);
        }
        for op in spec.operators.iter().filter(|o| o.kind.is_keyed()) {
            if !state.contains_key(&op.name) {
                return Err(bad(format!(
                    "no state file for keyed operator `{}`",
                    op.name
                )));
            }
        }
        Ok(Savepoint { metadata, state })
    }
}

/// Checks a whole state file's size and CRC-32 against its manifest entry.
fn verify_file(path: &Path, entry: &FileEntry, bytes: &[u8]) -> Result<(), SavepointError> {
    if bytes.len() as u64 != entry.bytes {
        return Err(SavepointError::Invalid {
            path: path.to_path_buf(),
            reason: format!(
                "truncated: {} bytes, metadata says {}",
                bytes.len(),
                entry.bytes
            ),
        });
    }
    let crc = crc32_parallel(bytes);
    if crc != entry.crc32 {
        return Err(SavepointError::Invalid {
            path: path.to_path_buf(),
            reason: format!(
                "checksum mismatch: CRC-32 {crc:08x}, metadata says {:08x}",
                entry.crc32
            ),
        });
    }
    Ok(())
}

/// CRC-32 of `bytes`, computed in parts on up to one thread per core and combined.
fn crc32_parallel(bytes: &[u8]) -> u32 {
    const PART: usize = 8 << 20;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    if threads <= 1 || bytes.len() <= PART {
        return crc32fast::hash(bytes);
    }
    let per = bytes.len().div_ceil(threads);
    let parts: Vec<crc32fast::Hasher> = std::thread::scope(|scope| {
        let handles: Vec<_> = bytes
            .chunks(per)
            .map(|part| {
                scope.spawn(move || {
                    let mut h = crc32fast::Hasher::new();
                    h.update(part);
                    h
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let mut all = crc32fast::Hasher::new();
    for p in &parts {
        all.combine(p);
    }
    if parts.len() == bytes.chunks(per).len() {
        all.finalize()
    } else {
        crc32fast::hash(bytes)
    }
}

/// Decodes a verified state file of an earlier version (one postcard value, no chunk index).
fn decode_state_file(
    path: &Path,
    entry: &FileEntry,
    bytes: Bytes,
) -> Result<KeyedState, SavepointError> {
    let bad = |reason: String| SavepointError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    if entry.chunks.is_empty() {
        if bytes.is_empty() {
            return Ok(KeyedState::default());
        }
        let legacy: LegacyKeyedState =
            postcard::from_bytes(&bytes).map_err(|e| bad(format!("cannot decode state: {e}")))?;
        return Ok(KeyedState {
            groups: legacy
                .groups
                .into_iter()
                .map(|(kg, m)| {
                    let m = m.into_iter().map(|(k, s)| (k, s.into())).collect();
                    (kg, KeyGroupData::Map(std::sync::Arc::new(m)))
                })
                .collect(),
            blobs: legacy.blobs,
        });
    }
    Err(bad(
        "a chunked state file reached the whole-file decoder (a bug in the reader)".into(),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::state::KeyState;

    fn spec(name: &str) -> JobSpec {
        let yaml = format!(
            "name: {name}\noperators:\n  - {{ name: src, kind: source, rate: {{ constant: 1 }} }}\n  - {{ name: w, kind: window, sizeMs: 10 }}\n  - {{ name: sink, kind: sink }}\nedges:\n  - {{ from: src, to: w }}\n  - {{ from: w, to: sink }}\n"
        );
        let s = JobSpec::from_yaml(&yaml).unwrap();
        s.validate().unwrap();
        s
    }

    fn savepoint(spec: &JobSpec) -> Savepoint {
        let mut state = KeyedState::default();
        for key in 0..50u64 {
            let s = state
                .entry(crate::keygroup::key_group(key, 128), key)
                .unwrap();
            *s = KeyState {
                total_count: key,
                total_sum: 2 * key as i64,
                ..KeyState::default()
            };
        }
        Savepoint {
            metadata: SavepointMetadata {
                job_started_unix_ms: 1,
                sources: BTreeMap::from([(
                    "src".into(),
                    SourcePosition {
                        emitted: 1225,
                        kafka_offsets: BTreeMap::from([(0, 7), (3, 12)]),
                    },
                )]),
                ..SavepointMetadata::for_job(spec, 2)
            },
            state: BTreeMap::from([("w".into(), state)]),
        }
    }

    #[test]
    fn round_trip_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec("a");
        let sp = savepoint(&spec);
        let target = dir.path().join("sp-1");
        sp.write(&target).unwrap();
        let back = Savepoint::read(&target, &spec).unwrap();
        assert_eq!(back.state, sp.state);
        assert_eq!(back.metadata.sources, sp.metadata.sources);
        // Never overwrite.
        let err = sp.write(&target).unwrap_err();
        assert!(matches!(err, SavepointError::Exists { .. }), "{err}");
        // Another job.
        let err = Savepoint::read(&target, &self::spec("b"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("belongs to another job"), "{err}");
        // Truncated state file.
        let copy = dir.path().join("sp-2");
        sp.write(&copy).unwrap();
        let file = copy.join("state-w.bin");
        let bytes = std::fs::read(&file).unwrap();
        std::fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
        let err = Savepoint::read(&copy, &spec).unwrap_err().to_string();
        assert!(
            err.contains("state-w.bin") && err.contains("truncated"),
            "{err}"
        );
        // Missing metadata: incomplete.
        let copy = dir.path().join("sp-3");
        sp.write(&copy).unwrap();
        std::fs::remove_file(copy.join(METADATA_FILE)).unwrap();
        let err = Savepoint::read(&copy, &spec).unwrap_err().to_string();
        assert!(
            err.contains("_metadata.json") && err.contains("incomplete"),
            "{err}"
        );
        // Unknown version.
        let copy = dir.path().join("sp-4");
        sp.write(&copy).unwrap();
        let meta = std::fs::read_to_string(copy.join(METADATA_FILE)).unwrap();
        std::fs::write(
            copy.join(METADATA_FILE),
            meta.replace("\"format_version\": 3", "\"format_version\": 9"),
        )
        .unwrap();
        let err = Savepoint::read(&copy, &spec).unwrap_err().to_string();
        assert!(err.contains("unknown savepoint format version 9"), "{err}");
        // No temporary directories left behind.
        let hidden = std::fs::read_dir(dir.path())
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.')
            })
            .count();
        assert_eq!(hidden, 0);
    }

    #[test]
    fn restore_reads_key_groups_in_place_and_names_damaged_files() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec("a");
        let sp = savepoint(&spec);
        let target = dir.path().join("sp");
        sp.write(&target).unwrap();
        reader::reset_read_buffer_peak();
        let back = Savepoint::read(&target, &spec).unwrap();
        assert!(reader::read_buffer_peak() <= reader::READ_BUFFER_BYTES);
        assert!(
            back.state["w"]
                .groups
                .values()
                .all(|g| matches!(g, KeyGroupData::Stored(_))),
            "restored key groups stay in the file"
        );
        assert_eq!(back.state, sp.state);
        // A flipped byte in the middle: checksum mismatch naming the file.
        let copy = dir.path().join("sp-flip");
        sp.write(&copy).unwrap();
        let file = copy.join("state-w.bin");
        let mut bytes = std::fs::read(&file).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        std::fs::write(&file, &bytes).unwrap();
        let err = Savepoint::read(&copy, &spec).unwrap_err().to_string();
        assert!(
            err.contains("state-w.bin") && err.contains("checksum mismatch"),
            "{err}"
        );
        // A missing state file.
        std::fs::remove_file(&file).unwrap();
        let err = Savepoint::read(&copy, &spec).unwrap_err().to_string();
        assert!(
            err.contains("state-w.bin") && err.contains("cannot read state file"),
            "{err}"
        );
        // A chunk whose keys are out of order (checksum right): refused at read, not later.
        let mut unordered = sp.clone();
        let entries = [(5u64, KeyState::default()), (3, KeyState::default())];
        unordered.state.get_mut("w").unwrap().groups.insert(
            7,
            KeyGroupData::Encoded {
                bytes: crate::state::chunk::encode(entries.into_iter()),
                open_panes: false,
            },
        );
        let copy = dir.path().join("sp-order");
        unordered.write(&copy).unwrap();
        let err = Savepoint::read(&copy, &spec).unwrap_err().to_string();
        assert!(
            err.contains("state-w.bin")
                && err.contains("key group 7")
                && err.contains("out of order"),
            "{err}"
        );
    }

    #[test]
    fn a_changed_max_parallelism_is_named_with_both_values() {
        let dir = tempfile::tempdir().unwrap();
        let spec = spec("a");
        let sp_dir = dir.path().join("sp");
        savepoint(&spec).write(&sp_dir).unwrap();
        let mut changed = spec.clone();
        changed.max_parallelism = 256;
        let err = Savepoint::read(&sp_dir, &changed).unwrap_err().to_string();
        assert!(
            err.contains("taken with maxParallelism 128")
                && err.contains("the job declares maxParallelism 256"),
            "{err}"
        );
        // Another job keeps its own message.
        let err = Savepoint::read(&sp_dir, &super::tests::spec("b"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("another job"), "{err}");
    }

    #[test]
    fn slices_by_key_group_range_recombine() {
        let spec = spec("a");
        let sp = savepoint(&spec);
        let whole = &sp.state["w"];
        let mut merged = KeyedState::default();
        for i in 0..5 {
            merged.merge(whole.slice(crate::keygroup::key_group_range(i, 5, 128)));
        }
        assert_eq!(&merged, whole);
        assert_eq!(merged.len(), 50);
    }
}
