//! The disk state backend: keyed state in sorted per-key-group segment files plus an embedded
//! on-disk B-tree for the keys written since, for state larger than memory.
//!
//! # Layout (a two-level log-structured merge tree)
//! - **Segments** ([`segment`](crate::state::segment)): one immutable file per key group holding its entries in the
//!   savepoint chunk format ([`chunk`]: fixed 72-byte entries in key order), read by point
//!   reads through a sparse index (`pread`, no mmap). A checkpoint or savepoint copies a
//!   segment's bytes as they are: no key is decoded or re-encoded (as Flink's RocksDB native
//!   savepoints copy SST files).
//! - **Delta**: a [`redb`] database (a pure-Rust embedded key-value store: copy-on-write
//!   B-trees, ACID transactions, MVCC readers that never block the writer) holding only the
//!   keys written since their key group's segment was last rewritten. One table maps
//!   `key group << 64 | key` (u128, so a key group is one contiguous key range) to the key's
//!   [`KeyState`] (64 bytes, [`chunk::encode_value`]). Chosen over RocksDB (the `rocksdb`
//!   crate) because it needs no C++ toolchain and its read transactions give exactly the
//!   consistent snapshot an asynchronous checkpoint needs.
//! - **Cache**: written keys stay in a write-back cache of at most `cacheEntries` keys; when
//!   full, the cache is committed to the delta in one write transaction and emptied.
//!
//! A key is read from the cache, else the delta, else the segment. Keys are never deleted, so
//! the delta needs no tombstones.
//!
//! # Compaction
//! Each commit of the cache also merges the delta of a few key groups into new segments (the
//! ones whose delta is largest relative to their segment, at least 1/16 of it, rewriting at
//! most 4 × `cacheEntries` entries per commit), and removes those keys from the database in
//! the same transaction: the delta stays a small share of the state, so a snapshot encodes
//! few keys. This runs on the subtask's thread between records (bounded work per commit), not
//! at a checkpoint barrier.
//!
//! # Files
//! Per subtask, `DIR/<job>-<operator>-<subtask>-<pid>-<n>.redb` and the segment directory
//! `DIR/<same>.seg/` (files `<key group>-<generation>`), all deleted when the subtask's state
//! and the last snapshot reading them are dropped (files of processes that no longer exist are
//! removed when the next backend opens in `DIR`). They are a working copy, not a durable store:
//! recovery always goes through checkpoints, so segments are never fsynced and database commits
//! skip fsync except one every 30 s at most (which lets redb reuse freed pages).
//!
//! # Snapshots
//! [`KeyedStateBackend::snapshot`] commits nothing: it copies the cache (sorted) and keeps the
//! database's read view as of the last commit and the current segments (immutable, shared).
//! A key group with neither cache nor delta keys is its segment's bytes; one with either is a
//! view that merges them into the segment in key order ([`GroupView`]), read by the checkpoint
//! writer on its own threads while the subtask keeps writing.
//!
//! # Restore
//! A key group restored from a savepoint read from disk ([`KeyGroupData::Stored`]) becomes a
//! segment in place: a region of the savepoint's state file, read by the same sparse index and
//! positioned reads as the backend's own segments (its index was built and its key order and
//! checksum checked when the savepoint was read), so a restore copies no state and holds none
//! in memory beyond the sparse index. After the first records these regions are copied into the
//! backend's own segment files (one key group in memory at a time, a few megabytes per commit,
//! as below), so the savepoint file is not needed for long (it stays readable meanwhile even if
//! the checkpoint is deleted: the file is open). Key groups handed over in memory ([`KeyGroupData::Encoded`], from
//! tests and tools) start as chunks in memory and are read through by binary search; nothing is read before the first record (a chunk's key order is checked on its
//! first read, write-out or merge; its length and checksum were checked with the savepoint). After the first records they are written out as segment files, several
//! megabytes per commit, and dropped from memory; a snapshot hands a restored key group without
//! writes to the checkpoint as its chunk unchanged. Open panes in a chunk are listed when the
//! window next fires.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use redb::{Database, Durability, ReadOnlyTable, ReadableDatabase, ReadableTable, TableDefinition};

use super::backend::{KeyedStateBackend, StateOwner};
use super::chunk::{self, ENTRY_BYTES, VALUE_BYTES};
use super::segment::{Segment, SegmentDir};
use super::{KeyGroupData, KeyState, KeyedState, StateError};
use crate::spec::StateSpec;

const TABLE: TableDefinition<u128, [u8; VALUE_BYTES]> = TableDefinition::new("keyed");

/// Default size of the write-back cache, in keys.
pub const DEFAULT_CACHE_ENTRIES: usize = 65_536;

/// Least time between durable commits (which let redb reuse pages freed since; they fsync the
/// working file, so never at a checkpoint barrier).
const DURABLE_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

/// A key group's delta is merged into its segment once it holds at least 1/`COMPACT_RATIO`
/// of the segment's keys (and at least [`COMPACT_MIN_KEYS`]).
const COMPACT_RATIO: u64 = 16;
/// Least delta of a key group worth a segment rewrite (or `cacheEntries`, if smaller).
const COMPACT_MIN_KEYS: u64 = 64;
/// Entries (segment and delta) rewritten per commit, in units of `cacheEntries`.
const COMPACT_BUDGET_CACHES: usize = 4;

static NEXT_FILE: AtomicU64 = AtomicU64::new(0);

fn composite(key_group: u32, key: u64) -> u128 {
    (u128::from(key_group) << 64) | u128::from(key)
}

/// The database file; removed when the last user (backend or snapshot view) drops it.
struct DbFile {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for DbFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DbFile").field("path", &self.path).finish()
    }
}

impl Drop for DbFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn disk_err(path: &Path, action: &'static str) -> impl FnOnce(redb::Error) -> StateError + use<> {
    let path = path.to_path_buf();
    move |e| StateError::Disk {
        path,
        action,
        reason: e.to_string(),
    }
}

/// The bottom layer of a key group: a restored chunk still in memory, or a segment file.
#[derive(Debug, Clone)]
enum Layer {
    /// A restored savepoint chunk ([`chunk`] form, checked), and whether it has open panes.
    Restored(Bytes, bool),
    /// A segment file.
    File(Arc<Segment>),
}

impl Layer {
    /// The layer's bytes ([`chunk`] form); a segment is read from its file.
    fn bytes(&self) -> Result<Bytes, StateError> {
        match self {
            Layer::Restored(b, _) => Ok(b.clone()),
            Layer::File(s) => s.read_all(),
        }
    }

    fn find(&self, key: u64) -> Result<Option<KeyState>, StateError> {
        match self {
            Layer::Restored(b, _) => Ok(chunk::find(b, key)),
            Layer::File(s) => s.find(key),
        }
    }

    fn keys(&self) -> usize {
        match self {
            Layer::Restored(b, _) => b.len() / ENTRY_BYTES,
            Layer::File(s) => s.keys(),
        }
    }
}

/// One key group inside a disk backend's snapshot: the cache as of the snapshot over the
/// database's read view over the key group's segment (or restored chunk).
#[derive(Clone)]
pub struct GroupView {
    table: Arc<ReadOnlyTable<u128, [u8; VALUE_BYTES]>>,
    key_group: u32,
    file: Arc<DbFile>,
    /// The bottom layer, if the key group has one.
    base: Option<Layer>,
    /// Whether the read view holds keys of this key group (else it is not read).
    in_db: bool,
    /// The write-back cache as of the snapshot, sorted by composite key (every key group's);
    /// overrides the database.
    overlay: Arc<Vec<(u128, [u8; VALUE_BYTES])>>,
}

impl std::fmt::Debug for GroupView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupView")
            .field("key_group", &self.key_group)
            .field("file", &self.file.path)
            .finish()
    }
}

impl GroupView {
    /// The cache's entries of this key group.
    fn overlay(&self) -> &[(u128, [u8; VALUE_BYTES])] {
        let lo = composite(self.key_group, 0);
        let hi = composite(self.key_group, u64::MAX);
        &self.overlay[self.overlay.partition_point(|(k, _)| *k < lo)
            ..self.overlay.partition_point(|(k, _)| *k <= hi)]
    }

    /// Calls `f(key, value)` for every key of the key group in key order: the cache as of the
    /// snapshot over the database over the segment (the upper layer wins on equal keys).
    fn scan(&self, mut f: impl FnMut(u64, &[u8])) -> Result<(), StateError> {
        let err = |e: redb::StorageError| StateError::Disk {
            path: self.file.path.clone(),
            action: "cannot read a key group of a snapshot",
            reason: e.to_string(),
        };
        let ov = self.overlay();
        let base = match &self.base {
            Some(l) => l.bytes()?,
            None => Bytes::new(),
        };
        let mut oi = 0usize;
        {
            // Database and segment merged arrive here in key order; the cache's keys go in
            // between.
            let mut put = |key: u64, v: &[u8]| {
                while oi < ov.len() && (ov[oi].0 as u64) < key {
                    f(ov[oi].0 as u64, &ov[oi].1);
                    oi += 1;
                }
                if oi < ov.len() && ov[oi].0 as u64 == key {
                    f(key, &ov[oi].1);
                    oi += 1;
                } else {
                    f(key, v);
                }
            };
            let mut at = 0usize;
            if self.in_db {
                let base_key = |at: usize| chunk::entry_key(&base, at);
                let lo = composite(self.key_group, 0);
                let hi = composite(self.key_group, u64::MAX);
                for item in self.table.range(lo..=hi).map_err(err)? {
                    let (k, v) = item.map_err(err)?;
                    let key = k.value() as u64;
                    while at < base.len() && base_key(at) < key {
                        put(base_key(at), &base[at + 8..at + ENTRY_BYTES]);
                        at += ENTRY_BYTES;
                    }
                    if at < base.len() && base_key(at) == key {
                        at += ENTRY_BYTES;
                    }
                    put(key, &v.value());
                }
            }
            chunk::for_each(&base[at..], &mut put);
        }
        for (k, v) in &ov[oi..] {
            f(*k as u64, v);
        }
        Ok(())
    }

    /// The key group's entries in key order.
    ///
    /// # Errors
    /// [`StateError::Disk`] when the read fails.
    pub fn entries(&self) -> Result<Vec<(u64, KeyState)>, StateError> {
        let mut out = Vec::new();
        self.scan(|k, v| out.push((k, chunk::decode_slice(v))))?;
        Ok(out)
    }

    /// The key group in [`chunk`] form and whether a key has an open pane. A key group with
    /// neither cache nor database keys is its segment's bytes as they are (one file read, no
    /// key decoded); otherwise the layers are merged.
    ///
    /// # Errors
    /// [`StateError::Disk`] when the read fails.
    pub fn encode(&self) -> Result<(Bytes, bool), StateError> {
        let mut out = Vec::new();
        match self.encode_into(&mut out)? {
            (Some(bytes), open) => Ok((bytes, open)),
            (None, open) => Ok((Bytes::from(out), open)),
        }
    }

    /// As [`GroupView::encode`], into a caller's buffer: appends the chunk to `out` and
    /// returns `(None, open panes)`, or returns `(Some(bytes), open panes)` for a restored
    /// chunk still in memory without writes since (no copy). A segment is read straight into
    /// `out`.
    ///
    /// # Errors
    /// [`StateError::Disk`] when the read fails.
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(Option<Bytes>, bool), StateError> {
        if !self.in_db && self.overlay().is_empty() {
            return match &self.base {
                Some(Layer::Restored(b, open)) => Ok((Some(b.clone()), *open)),
                Some(Layer::File(s)) => {
                    s.read_into(out)?;
                    Ok((None, s.open_panes()))
                }
                None => Ok((None, false)),
            };
        }
        out.reserve(
            self.base.as_ref().map_or(0, Layer::keys) * ENTRY_BYTES
                + self.overlay().len() * ENTRY_BYTES,
        );
        let mut open = false;
        self.scan(|k, v| {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(v);
            open |= chunk::value_has_open_pane(v);
        })?;
        Ok((None, open))
    }
}

/// Keyed state of one subtask: a write-back cache over a redb database (the delta) over
/// per-key-group segment files.
pub struct DiskBackend {
    file: Arc<DbFile>,
    segments: Arc<SegmentDir>,
    /// Keys written since the last commit (authoritative over the database).
    cache: HashMap<u128, KeyState>,
    limit: usize,
    /// The database as of the last commit (cache misses read it).
    reader: Arc<ReadOnlyTable<u128, [u8; VALUE_BYTES]>>,
    /// Key group → its bottom layer (segment, or restored chunk not yet written out).
    base: HashMap<u32, Layer>,
    /// Restored key groups with open panes not yet listed in `touched`.
    base_open: Vec<u32>,
    /// Restored key groups whose chunk has not been checked yet (keys strictly increasing):
    /// checked before their first read, write-out or merge.
    unchecked: BTreeSet<u32>,
    /// Restored key groups still in memory, to be written out as segments, in order.
    to_write: std::collections::VecDeque<u32>,
    /// Bytes of restored chunks not written out yet, and where to report them.
    unloaded: u64,
    unloaded_gauge: Option<prometheus::Gauge>,
    /// Key group → keys it has in the database (its delta).
    delta: HashMap<u32, u64>,
    /// Segment files written so far (names them).
    generation: u64,
    /// Keys written since the window last fired (every open pane is among them).
    touched: BTreeSet<u128>,
    last_durable: std::time::Instant,
}

impl std::fmt::Debug for DiskBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskBackend")
            .field("file", &self.file.path)
            .field("cached", &self.cache.len())
            .field("key_groups", &self.base.len())
            .finish()
    }
}

/// Removes database files and segment directories in `dir` left by processes that no longer
/// run (a SIGKILL skips the cleanup on drop). Linux only (checks `/proc/<pid>`); elsewhere
/// nothing is removed.
fn remove_stale(dir: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let (stem, is_dir) = match (name.strip_suffix(".redb"), name.strip_suffix(".seg")) {
            (Some(stem), _) => (stem, false),
            (None, Some(stem)) => (stem, true),
            _ => continue,
        };
        let mut parts = stem.rsplit('-');
        let _n = parts.next();
        let Some(pid) = parts.next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = if is_dir {
                std::fs::remove_dir_all(e.path())
            } else {
                std::fs::remove_file(e.path())
            };
        }
    }
}

/// Creates the disk backend's directory `spec.dir` (when missing) and checks that files can be
/// created in it, so that a job fails at start, before any subtask runs, rather than when its
/// first keyed subtask opens its state.
///
/// # Errors
/// [`StateError::Disk`] naming the directory when it cannot be created or written.
pub fn prepare_dir(spec: &StateSpec) -> Result<PathBuf, StateError> {
    let dir = spec.dir_or_default();
    let err = |action: &'static str| {
        let dir = dir.clone();
        move |e: std::io::Error| StateError::Disk {
            path: dir,
            action,
            reason: e.to_string(),
        }
    };
    std::fs::create_dir_all(&dir).map_err(err("cannot create the state directory"))?;
    let probe = dir.join(format!(".streamscale-probe-{}", std::process::id()));
    std::fs::File::create(&probe).map_err(err("cannot create files in the state directory"))?;
    let _ = std::fs::remove_file(&probe);
    Ok(dir)
}

impl DiskBackend {
    /// Creates a fresh database file and segment directory for `owner` in `spec.dir` holding
    /// `restored` (written out as segments lazily).
    ///
    /// # Errors
    /// [`StateError::Disk`] when the directory or the files cannot be created;
    /// [`StateError::Decode`] when a restored key group is malformed.
    pub fn open(
        spec: &StateSpec,
        owner: &StateOwner,
        restored: KeyedState,
    ) -> Result<DiskBackend, StateError> {
        let dir = spec.dir_or_default();
        std::fs::create_dir_all(&dir).map_err(|e| StateError::Disk {
            path: dir.clone(),
            action: "cannot create the state directory",
            reason: e.to_string(),
        })?;
        remove_stale(&dir);
        let stem = format!(
            "{}-{}-{}-{}-{}",
            owner.job,
            owner.operator,
            owner.subtask,
            std::process::id(),
            NEXT_FILE.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(format!("{stem}.redb"));
        let segments = SegmentDir::create(dir.join(format!("{stem}.seg")))?;
        let db = Database::builder()
            .create(&path)
            .map_err(|e| disk_err(&path, "cannot create the state database")(e.into()))?;
        let file = Arc::new(DbFile {
            db,
            path: path.clone(),
        });
        // Create the table so that readers can open it (no fsync: a working copy).
        let mut txn = file
            .db
            .begin_write()
            .map_err(|e| disk_err(&path, "cannot write the state database")(e.into()))?;
        txn.set_durability(Durability::None)
            .map_err(|e| StateError::Disk {
                path: path.clone(),
                action: "cannot set commit durability",
                reason: e.to_string(),
            })?;
        txn.open_table(TABLE)
            .map_err(|e| disk_err(&path, "cannot create the state table")(e.into()))?;
        txn.commit()
            .map_err(|e| disk_err(&path, "cannot write the state database")(e.into()))?;
        let reader = Self::read_view(&file)?;
        let mut base = HashMap::with_capacity(restored.groups.len());
        let mut base_open = Vec::new();
        let mut unchecked = BTreeSet::new();
        for (kg, data) in restored.groups {
            // A savepoint's chunk (whole entries, as its index says) is checked for key
            // order on its first use, so that a restore reads no state before the first record.
            if let KeyGroupData::Stored(seg) = data {
                // Still in the savepoint file (verified, key order checked): read in place as
                // a segment; compaction rewrites it into this backend's own segments.
                if seg.is_empty() {
                    continue;
                }
                if seg.open_panes() {
                    base_open.push(kg);
                }
                base.insert(kg, Layer::File(seg));
                continue;
            }
            let (bytes, open_panes) = match data {
                KeyGroupData::Encoded { bytes, open_panes }
                    if bytes.len().is_multiple_of(ENTRY_BYTES) =>
                {
                    unchecked.insert(kg);
                    (bytes, open_panes)
                }
                other => {
                    let (bytes, _) = other.encode()?;
                    let open = chunk::check(kg, &bytes)?;
                    (bytes, open)
                }
            };
            if bytes.is_empty() {
                unchecked.remove(&kg);
                continue;
            }
            if open_panes {
                base_open.push(kg);
            }
            base.insert(kg, Layer::Restored(bytes, open_panes));
        }
        let mut to_write: Vec<u32> = base.keys().copied().collect();
        to_write.sort_unstable();
        let unloaded = base
            .values()
            .map(|l| (l.keys() * ENTRY_BYTES) as u64)
            .sum::<u64>();
        if let Some(g) = &owner.unloaded_gauge {
            g.set(unloaded as f64);
        }
        Ok(DiskBackend {
            file,
            segments,
            cache: HashMap::new(),
            limit: spec.cache_entries.max(1),
            reader,
            base,
            base_open,
            unchecked,
            to_write: to_write.into(),
            unloaded,
            unloaded_gauge: owner.unloaded_gauge.clone(),
            delta: HashMap::new(),
            generation: 0,
            touched: BTreeSet::new(),
            last_durable: std::time::Instant::now(),
        })
    }

    fn read_view(
        file: &Arc<DbFile>,
    ) -> Result<Arc<ReadOnlyTable<u128, [u8; VALUE_BYTES]>>, StateError> {
        let path = &file.path;
        let txn = file
            .db
            .begin_read()
            .map_err(|e| disk_err(path, "cannot read the state database")(e.into()))?;
        let table = txn
            .open_table(TABLE)
            .map_err(|e| disk_err(path, "cannot open the state table")(e.into()))?;
        Ok(Arc::new(table))
    }

    /// Lists the open panes of restored key group `kg`'s chunk in `touched`, once.
    fn list_open_panes(&mut self, kg: u32) -> Result<(), StateError> {
        let Some(i) = self.base_open.iter().position(|g| *g == kg) else {
            return Ok(());
        };
        self.base_open.swap_remove(i);
        if let Some(l) = self.base.get(&kg) {
            chunk::for_each(&l.bytes()?, |key, v| {
                if chunk::value_has_open_pane(v) {
                    self.touched.insert(composite(kg, key));
                }
            });
        }
        Ok(())
    }

    /// Checks restored key group `kg`'s chunk on its first use.
    fn ensure_checked(&mut self, kg: u32) -> Result<(), StateError> {
        if self.unchecked.contains(&kg) {
            if let Some(Layer::Restored(bytes, _)) = self.base.get(&kg) {
                chunk::check(kg, bytes)?;
            }
            self.unchecked.remove(&kg);
        }
        Ok(())
    }

    /// A new segment of key group `kg` holding `bytes`.
    fn new_segment(&mut self, kg: u32, bytes: &[u8]) -> Result<Arc<Segment>, StateError> {
        self.generation += 1;
        Ok(Arc::new(Segment::write(
            &self.segments,
            &format!("{kg}-{}", self.generation),
            bytes,
        )?))
    }

    /// Key groups whose delta is to be merged into their segment at this commit: the largest
    /// delta relative to the segment first, while the rewrite budget lasts.
    fn pick_compactions(&self) -> Vec<u32> {
        let min = COMPACT_MIN_KEYS.min(self.limit as u64);
        let mut candidates: Vec<(u32, u64, u64)> = self
            .delta
            .iter()
            .map(|(kg, d)| {
                let seg = self.base.get(kg).map_or(0, |l| l.keys() as u64);
                (*kg, *d, seg)
            })
            .filter(|(_, d, seg)| *d >= min && d * COMPACT_RATIO >= *seg)
            .collect();
        // Largest delta / segment ratio first (compared as d1 / s1 > d2 / s2).
        candidates.sort_unstable_by(|a, b| {
            (u128::from(b.1) * u128::from(a.2 + 1))
                .cmp(&(u128::from(a.1) * u128::from(b.2 + 1)))
                .then(a.0.cmp(&b.0))
        });
        let mut budget = self.limit * COMPACT_BUDGET_CACHES;
        let mut out = Vec::new();
        for (kg, d, seg) in candidates {
            let cost = (d + seg) as usize;
            if !out.is_empty() && cost > budget {
                break;
            }
            budget = budget.saturating_sub(cost);
            out.push(kg);
        }
        out
    }

    /// Writes the cache in one transaction and empties it; in the same transaction merges the
    /// delta of the key groups [`DiskBackend::pick_compactions`] names into new segments and
    /// removes it from the database; then writes out restored chunks as segments (several
    /// megabytes per commit) and refreshes the read view. New segments replace the old ones
    /// only once the transaction has committed. `durable_ok`: this commit may be the periodic
    /// durable one.
    fn commit(&mut self, durable_ok: bool) -> Result<(), StateError> {
        let path = self.file.path.clone();
        let mut txn = self
            .file
            .db
            .begin_write()
            .map_err(|e| disk_err(&path, "cannot write the state database")(e.into()))?;
        let durable = durable_ok && self.last_durable.elapsed() >= DURABLE_EVERY;
        if durable {
            self.last_durable = std::time::Instant::now();
        }
        let durability = if durable {
            Durability::Immediate
        } else {
            Durability::None
        };
        txn.set_durability(durability)
            .map_err(|e| StateError::Disk {
                path: path.clone(),
                action: "cannot set commit durability",
                reason: e.to_string(),
            })?;
        let mut replaced: Vec<(u32, Arc<Segment>)> = Vec::new();
        let mut delta = self.delta.clone();
        {
            let mut table = txn
                .open_table(TABLE)
                .map_err(|e| disk_err(&path, "cannot open the state table")(e.into()))?;
            let mut dirty: Vec<(u128, KeyState)> = self.cache.drain().collect();
            dirty.sort_unstable_by_key(|(k, _)| *k);
            for (k, s) in &dirty {
                let old = table
                    .insert(*k, chunk::encode_value(s))
                    .map_err(|e| disk_err(&path, "cannot write a key")(e.into()))?;
                if old.is_none() {
                    *delta.entry((k >> 64) as u32).or_insert(0) += 1;
                }
            }
            self.delta = delta;
            let read_err = |e: redb::StorageError| disk_err(&path, "cannot read a key")(e.into());
            for kg in self.pick_compactions() {
                self.ensure_checked(kg)?;
                let base = match self.base.get(&kg) {
                    Some(l) => l.bytes()?,
                    None => Bytes::new(),
                };
                let lo = composite(kg, 0);
                let hi = composite(kg, u64::MAX);
                let mut out = Vec::with_capacity(
                    base.len() + self.delta.get(&kg).copied().unwrap_or(0) as usize * ENTRY_BYTES,
                );
                let mut at = 0usize;
                for item in table.range(lo..=hi).map_err(read_err)? {
                    let (k, v) = item.map_err(read_err)?;
                    let key = k.value() as u64;
                    while at < base.len() && chunk::entry_key(&base, at) < key {
                        out.extend_from_slice(&base[at..at + ENTRY_BYTES]);
                        at += ENTRY_BYTES;
                    }
                    if at < base.len() && chunk::entry_key(&base, at) == key {
                        at += ENTRY_BYTES;
                    }
                    out.extend_from_slice(&key.to_le_bytes());
                    out.extend_from_slice(&v.value());
                }
                out.extend_from_slice(&base[at..]);
                replaced.push((kg, self.new_segment(kg, &out)?));
                table
                    .retain_in(lo..=hi, |_, _| false)
                    .map_err(|e| disk_err(&path, "cannot remove merged keys")(e.into()))?;
            }
        }
        if let Err(e) = txn.commit() {
            // The delta counts were raised for keys that are not in the database after all;
            // they only steer compaction.
            return Err(disk_err(&path, "cannot commit to the state database")(
                e.into(),
            ));
        }
        self.reader = Self::read_view(&self.file)?;
        for (kg, seg) in replaced {
            self.delta.remove(&kg);
            match self.base.insert(kg, Layer::File(seg)) {
                Some(Layer::Restored(b, _)) => {
                    self.unloaded = self.unloaded.saturating_sub(b.len() as u64);
                }
                Some(Layer::File(old)) if old.is_region() => {
                    self.unloaded = self.unloaded.saturating_sub(old.len() as u64);
                }
                _ => {}
            }
        }
        // Restored chunks still in memory become segment files, a few cache's worth of
        // entries per commit.
        let mut budget = self.limit * COMPACT_BUDGET_CACHES * ENTRY_BYTES;
        while let Some(&kg) = self.to_write.front() {
            let region = match self.base.get(&kg) {
                Some(Layer::Restored(..)) => None,
                Some(Layer::File(seg)) if seg.is_region() => Some(seg.clone()),
                _ => {
                    self.to_write.pop_front();
                    continue;
                }
            };
            if budget == 0 {
                break;
            }
            self.ensure_checked(kg)?;
            // A region of the savepoint file is read one key group at a time.
            let bytes = match (region, self.base.get(&kg)) {
                (Some(seg), _) => seg.read_all()?,
                (None, Some(Layer::Restored(bytes, _))) => bytes.clone(),
                _ => Bytes::new(),
            };
            budget = budget.saturating_sub(bytes.len());
            let seg = self.new_segment(kg, &bytes)?;
            self.base.insert(kg, Layer::File(seg));
            self.unloaded = self.unloaded.saturating_sub(bytes.len() as u64);
            self.to_write.pop_front();
        }
        if let Some(g) = &self.unloaded_gauge {
            g.set(self.unloaded as f64);
        }
        Ok(())
    }

    fn get_mut(&mut self, k: u128) -> Result<&mut KeyState, StateError> {
        if self.cache.contains_key(&k) {
            return Ok(self.cache.entry(k).or_default());
        }
        let kg = (k >> 64) as u32;
        self.ensure_checked(kg)?;
        let stored = if self.delta.contains_key(&kg) {
            self.reader.get(k).map_err(|e| StateError::Disk {
                path: self.file.path.clone(),
                action: "cannot read a key",
                reason: e.to_string(),
            })?
        } else {
            None
        };
        let s = match stored {
            Some(g) => chunk::decode_value(&g.value()),
            None => match self.base.get(&kg) {
                Some(l) => l.find(k as u64)?.unwrap_or_default(),
                None => KeyState::default(),
            },
        };
        Ok(self.cache.entry(k).or_insert(s))
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.file.path
    }

    /// Directory of the segment files.
    pub fn segment_dir(&self) -> &Path {
        self.segments.path()
    }
}

impl KeyedStateBackend for DiskBackend {
    fn entry(&mut self, key_group: u32, key: u64) -> Result<&mut KeyState, StateError> {
        if self.cache.len() >= self.limit {
            self.commit(true)?;
        }
        let k = composite(key_group, key);
        self.touched.insert(k);
        self.get_mut(k)
    }

    fn fire_panes(&mut self, emit: &mut dyn FnMut(u64, &KeyState)) -> Result<(), StateError> {
        // Open panes of restored chunks: listed once (a key read from a chunk goes into the
        // cache with its pane closed, and the cache overrides the chunk from then on).
        while let Some(&kg) = self.base_open.last() {
            self.list_open_panes(kg)?;
        }
        let touched = std::mem::take(&mut self.touched);
        for k in touched {
            if self.cache.len() >= self.limit {
                self.commit(true)?;
            }
            // Only read, not cache, keys whose pane is already closed.
            let open = match self.cache.get(&k) {
                Some(s) => s.pane_count > 0,
                None => true,
            };
            if !open {
                continue;
            }
            let s = self.get_mut(k)?;
            if s.pane_count > 0 {
                emit(k as u64, s);
                s.close_pane();
            }
        }
        if !self.to_write.is_empty() {
            // Restored state keeps moving to segment files even when few keys are written.
            self.commit(true)?;
        }
        Ok(())
    }

    fn snapshot(&mut self) -> Result<KeyedState, StateError> {
        // No commit at the barrier: the snapshot reads the cache as copied now over the
        // database as of the last commit over the current segments (all consistent with this
        // instant).
        let mut overlay: Vec<(u128, [u8; VALUE_BYTES])> = self
            .cache
            .iter()
            .map(|(k, s)| (*k, chunk::encode_value(s)))
            .collect();
        overlay.sort_unstable_by_key(|(k, _)| *k);
        let cached: BTreeSet<u32> = overlay.iter().map(|(k, _)| (k >> 64) as u32).collect();
        let overlay = Arc::new(overlay);
        let mut groups: BTreeMap<u32, KeyGroupData> = BTreeMap::new();
        let all: BTreeSet<u32> = self
            .base
            .keys()
            .chain(self.delta.keys())
            .chain(cached.iter())
            .copied()
            .collect();
        for kg in all {
            let in_db = self.delta.contains_key(&kg);
            let base = self.base.get(&kg).cloned();
            if !in_db
                && !cached.contains(&kg)
                && let Some(Layer::Restored(bytes, open_panes)) = &base
            {
                // A restored key group neither written nor written out since: its chunk.
                groups.insert(
                    kg,
                    KeyGroupData::Encoded {
                        bytes: bytes.clone(),
                        open_panes: *open_panes,
                    },
                );
                continue;
            }
            groups.insert(
                kg,
                KeyGroupData::Disk(GroupView {
                    table: self.reader.clone(),
                    key_group: kg,
                    file: self.file.clone(),
                    base,
                    in_db,
                    overlay: overlay.clone(),
                }),
            );
        }
        Ok(KeyedState {
            groups,
            blobs: BTreeMap::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::spec::StateBackendKind;

    fn spec(dir: &Path, cache: usize) -> StateSpec {
        StateSpec {
            backend: StateBackendKind::Disk,
            dir: Some(dir.display().to_string()),
            cache_entries: cache,
        }
    }

    fn owner() -> StateOwner {
        StateOwner {
            job: "j".into(),
            operator: "w".into(),
            subtask: 0,
            unloaded_gauge: None,
        }
    }

    #[test]
    fn snapshot_is_consistent_while_writes_go_on_and_file_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut d =
            DiskBackend::open(&spec(dir.path(), 7), &owner(), KeyedState::default()).unwrap();
        let path = d.path().to_path_buf();
        for key in 0..100u64 {
            let s = d.entry((key % 4) as u32, key).unwrap();
            s.total_count += key;
            s.pane_count += 1;
        }
        let snap = d.snapshot().unwrap();
        for key in 0..100u64 {
            d.entry((key % 4) as u32, key).unwrap().total_count += 1000;
        }
        let totals = snap.try_totals().unwrap();
        assert_eq!(totals.len(), 100);
        assert!(totals.iter().all(|(k, (c, _))| c == k));
        let mut fired = 0;
        d.fire_panes(&mut |_, s| {
            assert_eq!(s.pane_count, 1);
            fired += 1;
        })
        .unwrap();
        assert_eq!(fired, 100);
        let later = d.snapshot().unwrap().try_totals().unwrap();
        assert!(later.iter().all(|(k, (c, _))| *c == k + 1000));
        // Encoded through a view equals the heap encoding of the same entries.
        let (bytes, open) = snap.groups[&1].encode().unwrap();
        assert!(open);
        assert_eq!(
            chunk::decode(1, &bytes).unwrap(),
            snap.groups[&1].entries(1).unwrap()
        );
        drop(d);
        assert!(path.exists(), "a live snapshot keeps the file");
        drop(snap);
        assert!(!path.exists());
    }

    fn encoded(state: &KeyedState) -> KeyedState {
        KeyedState {
            groups: state
                .groups
                .iter()
                .map(|(kg, d)| {
                    let (bytes, open_panes) = d.encode().unwrap();
                    (*kg, KeyGroupData::Encoded { bytes, open_panes })
                })
                .collect(),
            blobs: BTreeMap::new(),
        }
    }

    #[test]
    fn restores_lazily_and_passes_untouched_key_groups_through() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = KeyedState::default();
        for key in 0..64u64 {
            let s = state.entry((key % 8) as u32, key).unwrap();
            s.total_count = key + 1;
            s.pane_count = u64::from(key == 5);
        }
        let mut d = DiskBackend::open(&spec(dir.path(), 1000), &owner(), encoded(&state)).unwrap();
        // Nothing is written on restore: a snapshot hands untouched key groups over as they
        // came, a written one as a view.
        assert_eq!(d.to_write.len(), 8);
        assert!(d.delta.is_empty());
        d.entry(2, 2).unwrap().total_count += 10;
        let snap = d.snapshot().unwrap();
        assert!(matches!(snap.groups[&3], KeyGroupData::Encoded { .. }));
        assert!(matches!(snap.groups[&2], KeyGroupData::Disk(_)));
        let mut expected = state.totals();
        expected.insert(2, (13, 0));
        assert_eq!(snap.try_totals().unwrap(), expected);
        // Key 5's open pane fires once, read from the chunk; the firing's commit writes the
        // restored chunks out as segment files.
        let mut fired = Vec::new();
        d.fire_panes(&mut |k, s| fired.push((k, s.pane_count)))
            .unwrap();
        assert_eq!(fired, vec![(5, 1)]);
        let mut again = 0;
        d.fire_panes(&mut |_, _| again += 1).unwrap();
        assert_eq!(again, 0);
        assert!(d.to_write.is_empty() && d.unloaded == 0);
        assert!(d.base.values().all(|l| matches!(l, Layer::File(_))));
        assert_eq!(std::fs::read_dir(d.segment_dir()).unwrap().count(), 8);
        let later = d.snapshot().unwrap();
        assert_eq!(later.try_totals().unwrap(), expected);
        assert_eq!(snap.try_totals().unwrap(), expected);
        // The fired pane stays closed (the database overrides the chunk).
        let five = later.groups[&5].entries(5).unwrap();
        assert_eq!(five.len(), 8);
        assert!(five.iter().all(|(_, s)| s.pane_count == 0));
        let (_, open) = later.groups[&5].encode().unwrap();
        assert!(!open);
        // A segment with no newer keys is handed over as its bytes.
        let (bytes, _) = later.groups[&3].encode().unwrap();
        assert_eq!(bytes, state.groups[&3].encode().unwrap().0);
        let seg_dir = d.segment_dir().to_path_buf();
        drop(d);
        drop(snap);
        assert!(seg_dir.exists(), "a live snapshot keeps the segments");
        drop(later);
        assert!(!seg_dir.exists());
    }

    #[test]
    fn a_restored_chunk_out_of_order_fails_on_first_use_not_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let s = KeyState::default();
        let good = chunk::encode([(1u64, s), (2u64, s)].into_iter());
        let bad = chunk::encode([(9u64, s), (4u64, s)].into_iter());
        let restored = KeyedState {
            groups: BTreeMap::from([
                (
                    0,
                    KeyGroupData::Encoded {
                        bytes: good,
                        open_panes: false,
                    },
                ),
                (
                    1,
                    KeyGroupData::Encoded {
                        bytes: bad,
                        open_panes: false,
                    },
                ),
            ]),
            blobs: BTreeMap::new(),
        };
        let mut d = DiskBackend::open(&spec(dir.path(), 8), &owner(), restored).unwrap();
        d.entry(0, 1).unwrap().total_count += 1;
        let err = d.entry(1, 4).unwrap_err().to_string();
        assert!(
            err.contains("key group 1") && err.contains("out of order"),
            "{err}"
        );
    }

    #[test]
    fn an_unusable_state_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        std::fs::write(&blocker, b"x").unwrap();
        let err = prepare_dir(&spec(&blocker.join("state"), 8))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot create the state directory")
                && err.contains(&blocker.join("state").display().to_string()),
            "{err}"
        );
        assert_eq!(
            prepare_dir(&spec(&dir.path().join("a/b"), 8)).unwrap(),
            dir.path().join("a/b")
        );
    }

    #[test]
    fn compaction_bounds_the_delta_and_keeps_older_snapshots_intact() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = KeyedState::default();
        let mut d =
            DiskBackend::open(&spec(dir.path(), 16), &owner(), KeyedState::default()).unwrap();
        type Totals = BTreeMap<u64, (u64, i64)>;
        let mut old: Vec<(KeyedState, Totals)> = Vec::new();
        for round in 0..40u64 {
            for key in 0..200u64 {
                if (key + round) % 3 == 0 {
                    continue;
                }
                let kg = (key % 5) as u32;
                d.entry(kg, key).unwrap().total_count += round + 1;
                model.entry(kg, key).unwrap().total_count += round + 1;
            }
            if round % 10 == 0 {
                old.push((d.snapshot().unwrap(), model.totals()));
            }
        }
        assert!(
            d.base.values().all(|l| matches!(l, Layer::File(_))) && d.base.len() == 5,
            "every key group has a segment"
        );
        let in_db: u64 = d.delta.values().sum();
        assert!(
            in_db <= 200 / COMPACT_RATIO * 5 + 5 * 16,
            "delta of {in_db} keys"
        );
        let snap = d.snapshot().unwrap();
        assert_eq!(snap, model);
        for (kg, data) in &snap.groups {
            assert_eq!(
                data.encode().unwrap().0,
                model.groups[kg].encode().unwrap().0,
                "key group {kg}"
            );
        }
        // Snapshots taken before later compactions still read their own point in time.
        for (s, totals) in &old {
            assert_eq!(&s.try_totals().unwrap(), totals);
        }
    }

    #[test]
    fn new_writes_merge_with_restored_chunks_in_key_order() {
        let dir = tempfile::tempdir().unwrap();
        // Even keys restored; writes hit restored keys, new keys between, before and after.
        let mut model = KeyedState::default();
        for key in (10..200u64).step_by(2) {
            model.entry((key % 4) as u32, key).unwrap().total_count = key;
        }
        let restored = encoded(&model);
        // A cache of 3 keys: most writes go through the database.
        let mut d = DiskBackend::open(&spec(dir.path(), 3), &owner(), restored).unwrap();
        let writes: Vec<u64> = (0..220u64).filter(|k| k % 3 == 0).collect();
        for (i, key) in writes.iter().enumerate() {
            let kg = (key % 4) as u32;
            d.entry(kg, *key).unwrap().total_sum += i as i64;
            model.entry(kg, *key).unwrap().total_sum += i as i64;
            if i % 17 == 0 {
                // Snapshots taken along the way agree with the model at that point.
                let snap = d.snapshot().unwrap();
                assert_eq!(snap.try_totals().unwrap(), model.totals());
            }
        }
        let snap = d.snapshot().unwrap();
        assert_eq!(snap, model);
        for (kg, data) in &snap.groups {
            let (bytes, _) = data.encode().unwrap();
            assert_eq!(
                bytes,
                model.groups[kg].encode().unwrap().0,
                "key group {kg}"
            );
        }
        // Restoring that snapshot into a second backend gives the same state again.
        let mut e = DiskBackend::open(&spec(dir.path(), 5), &owner(), snap.clone()).unwrap();
        assert_eq!(e.snapshot().unwrap(), model);
    }

    #[test]
    fn restored_chunks_become_segments_in_slices_and_panes_fire_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut model = KeyedState::default();
        for key in 0..100u64 {
            let s = model.entry((key % 3) as u32, key).unwrap();
            s.total_count = key;
            s.pane_count = u64::from(key % 10 == 0);
        }
        let gauge = prometheus::Gauge::new("g", "g").unwrap();
        let mut o = owner();
        o.unloaded_gauge = Some(gauge.clone());
        // Cache of 4 keys: one key group per commit.
        let mut d = DiskBackend::open(&spec(dir.path(), 4), &o, encoded(&model)).unwrap();
        assert_eq!(gauge.get(), (100 * chunk::ENTRY_BYTES) as f64);
        // Writes (and so commits, and so loading) before the window first fires.
        for key in [3u64, 30, 31, 60, 99, 1, 2, 4, 5] {
            d.entry((key % 3) as u32, key).unwrap().total_sum += 7;
            model.entry((key % 3) as u32, key).unwrap().total_sum += 7;
        }
        assert!(gauge.get() < (100 * chunk::ENTRY_BYTES) as f64);
        let mut fired = Vec::new();
        d.fire_panes(&mut |k, _| fired.push(k)).unwrap();
        fired.sort_unstable();
        assert_eq!(fired, (0..100).step_by(10).collect::<Vec<u64>>());
        for _ in 0..100 {
            d.fire_panes(&mut |k, _| panic!("pane of {k} fired twice"))
                .unwrap();
            let snap = d.snapshot().unwrap();
            assert_eq!(snap.try_totals().unwrap(), model.totals());
        }
        assert!(d.to_write.is_empty());
        assert!(d.base.values().all(|l| matches!(l, Layer::File(_))));
        assert_eq!(gauge.get(), 0.0);
        let snap = d.snapshot().unwrap();
        assert!(
            snap.groups
                .values()
                .all(|g| matches!(g, KeyGroupData::Disk(_)))
        );
        for (kg, g) in &snap.groups {
            assert!(
                g.entries(*kg)
                    .unwrap()
                    .iter()
                    .all(|(_, s)| s.pane_count == 0)
            );
        }
    }
}
