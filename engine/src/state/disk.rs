//! The disk state backend: keyed state in an embedded on-disk B-tree, for state larger than
//! memory.
//!
//! # Store
//! [`redb`]: a pure-Rust embedded key-value store (copy-on-write B-trees, ACID transactions,
//! MVCC readers that never block the writer). Chosen over RocksDB (the `rocksdb` crate) because
//! it needs no C++ toolchain, builds in seconds rather than minutes in CI, and its read
//! transactions give exactly the consistent snapshot an asynchronous checkpoint needs.
//!
//! # Layout
//! One database file per subtask, `DIR/<job>-<operator>-<subtask>-<pid>-<n>.redb`, deleted
//! when the subtask's state is dropped (files of processes that no longer exist are removed
//! when the next backend opens in `DIR`). One table maps `key group << 64 | key` (u128, so a
//! key group is one contiguous key range) to the key's [`KeyState`] (40 bytes,
//! [`chunk::encode_value`]). The file is a working copy, not a durable store: recovery always
//! goes through checkpoints, so commits skip fsync except one every 30 s at most (which lets
//! redb reuse freed pages), never at a checkpoint barrier.
//!
//! # Cache
//! Written keys stay in a write-back cache of at most `cacheEntries` keys; when full (and at
//! every snapshot) the cache is committed in one write transaction and emptied.
//!
//! # Snapshots
//! [`KeyedStateBackend::snapshot`] commits the cache and opens a read transaction: a view of
//! the database as of that commit, which the checkpoint writer reads key group by key group
//! ([`GroupView`]) while the subtask keeps writing.
//!
//! # Restore
//! Restored key groups are not loaded into the database: each stays a read-only base layer,
//! its savepoint chunk ([`chunk`] form, checked once at open: whole entries, keys strictly
//! increasing), and the database holds only the keys written since (the delta). A key is read
//! from the cache, else the database, else the chunk (binary search). A snapshot hands the
//! checkpoint a key group without writes as its chunk unchanged, and one with writes as a
//! view that merges the database's keys into the chunk in key order. Open panes in a chunk
//! are listed when the window next fires; firing reads those keys into the cache with their
//! pane closed, which overrides the chunk from then on. Keys are never deleted, so the delta
//! needs no tombstones.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use redb::{Database, Durability, ReadOnlyTable, ReadableDatabase, ReadableTable, TableDefinition};

use super::backend::{KeyedStateBackend, StateOwner};
use super::chunk::{self, ENTRY_BYTES, VALUE_BYTES};
use super::{KeyGroupData, KeyState, KeyedState, StateError};
use crate::spec::StateSpec;

const TABLE: TableDefinition<u128, [u8; VALUE_BYTES]> = TableDefinition::new("keyed");

/// Default size of the write-back cache, in keys.
pub const DEFAULT_CACHE_ENTRIES: usize = 65_536;

/// Least time between durable commits (which let redb reuse pages freed since; they fsync the
/// working file, so never at a checkpoint barrier).
const DURABLE_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

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

/// One key group inside a disk backend's snapshot (a read transaction), over the key group's
/// restored chunk when it has one (the database then holds only the keys written since).
#[derive(Clone)]
pub struct GroupView {
    table: Arc<ReadOnlyTable<u128, [u8; VALUE_BYTES]>>,
    key_group: u32,
    file: Arc<DbFile>,
    /// The restored chunk ([`chunk`] form, checked); keys in the database override it.
    base: Option<Bytes>,
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
    /// Calls `f(key, value)` for every key of the key group in key order: the cache as of the
    /// snapshot over the database over the restored chunk (the upper layer wins on equal keys).
    fn scan(&self, mut f: impl FnMut(u64, &[u8])) -> Result<(), StateError> {
        let err = |e: redb::StorageError| StateError::Disk {
            path: self.file.path.clone(),
            action: "cannot read a key group of a snapshot",
            reason: e.to_string(),
        };
        let lo = composite(self.key_group, 0);
        let hi = composite(self.key_group, u64::MAX);
        let ov = &self.overlay[self.overlay.partition_point(|(k, _)| *k < lo)
            ..self.overlay.partition_point(|(k, _)| *k <= hi)];
        let mut oi = 0usize;
        {
            // Database and chunk merged arrive here in key order; the cache's keys go in between.
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
            let base: &[u8] = self.base.as_deref().unwrap_or(&[]);
            let mut at = 0usize;
            let base_key = |at: usize| chunk::entry_key(base, at);
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

    /// The key group in [`chunk`] form and whether a key has an open pane, read straight from
    /// the stored values.
    ///
    /// # Errors
    /// [`StateError::Disk`] when the read fails.
    pub fn encode(&self) -> Result<(Bytes, bool), StateError> {
        let mut out = Vec::with_capacity(self.base.as_ref().map_or(0, Bytes::len));
        let mut open = false;
        self.scan(|k, v| {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(v);
            open |= chunk::value_has_open_pane(v);
        })?;
        Ok((Bytes::from(out), open))
    }
}

/// A restored key group: its savepoint chunk, read through by binary search.
#[derive(Debug, Clone)]
struct Base {
    /// The chunk ([`chunk`] form; checked: whole entries, keys increasing).
    bytes: Bytes,
    /// Some entry of the chunk has an open window pane.
    open_panes: bool,
}

/// Keyed state of one subtask in a redb database file with a write-back cache, over the
/// restored key groups' chunks.
pub struct DiskBackend {
    file: Arc<DbFile>,
    /// Keys written since the last commit (authoritative over the database).
    cache: HashMap<u128, KeyState>,
    limit: usize,
    /// The database as of the last commit (cache misses read it).
    reader: Arc<ReadOnlyTable<u128, [u8; VALUE_BYTES]>>,
    /// Restored key groups: a key not in the cache or the database is read from here.
    base: HashMap<u32, Base>,
    /// Restored key groups with open panes not yet listed in `touched`.
    base_open: Vec<u32>,
    /// Restored key groups still to be loaded into the database, in order; the first one is
    /// loaded up to byte `loaded` of its chunk.
    to_load: std::collections::VecDeque<u32>,
    loaded: usize,
    /// Bytes of restored chunks not loaded yet, and where to report them.
    unloaded: u64,
    unloaded_gauge: Option<prometheus::Gauge>,
    /// Key groups with keys in the database.
    in_db: BTreeSet<u32>,
    /// Keys written since the window last fired (every open pane is among them).
    touched: BTreeSet<u128>,
    last_durable: std::time::Instant,
}

impl std::fmt::Debug for DiskBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskBackend")
            .field("file", &self.file.path)
            .field("cached", &self.cache.len())
            .field("restored", &self.base.len())
            .finish()
    }
}

/// Removes database files in `dir` left by processes that no longer run (a SIGKILL skips the
/// cleanup on drop). Linux only (checks `/proc/<pid>`); elsewhere nothing is removed.
fn remove_stale(dir: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".redb") else {
            continue;
        };
        let mut parts = stem.rsplit('-');
        let _n = parts.next();
        let Some(pid) = parts.next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

impl DiskBackend {
    /// Creates a fresh database file for `owner` in `spec.dir` holding `restored` (loaded
    /// lazily).
    ///
    /// # Errors
    /// [`StateError::Disk`] when the directory or the file cannot be created.
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
        let path = dir.join(format!(
            "{}-{}-{}-{}-{}.redb",
            owner.job,
            owner.operator,
            owner.subtask,
            std::process::id(),
            NEXT_FILE.fetch_add(1, Ordering::Relaxed)
        ));
        let db = Database::builder()
            .create(&path)
            .map_err(|e| disk_err(&path, "cannot create the state database")(e.into()))?;
        let file = Arc::new(DbFile {
            db,
            path: path.clone(),
        });
        // Create the table so that readers can open it.
        let txn = file
            .db
            .begin_write()
            .map_err(|e| disk_err(&path, "cannot write the state database")(e.into()))?;
        txn.open_table(TABLE)
            .map_err(|e| disk_err(&path, "cannot create the state table")(e.into()))?;
        txn.commit()
            .map_err(|e| disk_err(&path, "cannot write the state database")(e.into()))?;
        let reader = Self::read_view(&file)?;
        let mut base = HashMap::with_capacity(restored.groups.len());
        let mut base_open = Vec::new();
        for (kg, data) in restored.groups {
            let bytes = match data {
                KeyGroupData::Encoded { bytes, .. } => bytes,
                other => other.encode()?.0,
            };
            let open_panes = chunk::check(kg, &bytes)?;
            if bytes.is_empty() {
                continue;
            }
            if open_panes {
                base_open.push(kg);
            }
            base.insert(kg, Base { bytes, open_panes });
        }
        let mut to_load: Vec<u32> = base.keys().copied().collect();
        to_load.sort_unstable();
        let unloaded = base.values().map(|b| b.bytes.len() as u64).sum::<u64>();
        if let Some(g) = &owner.unloaded_gauge {
            g.set(unloaded as f64);
        }
        let backend = DiskBackend {
            file,
            cache: HashMap::new(),
            limit: spec.cache_entries.max(1),
            reader,
            base,
            base_open,
            to_load: to_load.into(),
            loaded: 0,
            unloaded,
            unloaded_gauge: owner.unloaded_gauge.clone(),
            in_db: BTreeSet::new(),
            touched: BTreeSet::new(),
            last_durable: std::time::Instant::now(),
        };
        Ok(backend)
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
    fn list_open_panes(&mut self, kg: u32) {
        let Some(i) = self.base_open.iter().position(|g| *g == kg) else {
            return;
        };
        self.base_open.swap_remove(i);
        if let Some(b) = self.base.get(&kg) {
            chunk::for_each(&b.bytes, |key, v| {
                if chunk::value_has_open_pane(v) {
                    self.touched.insert(composite(kg, key));
                }
            });
        }
    }

    /// Writes the cache in one transaction, empties it and refreshes the read view. The same
    /// transaction first loads up to `cacheEntries` keys of restored chunks into the database
    /// (keys the database already holds are newer and stay), so that restored state moves to
    /// disk a slice at a time after the restore instead of before the first record; a chunk
    /// is dropped from memory once wholly loaded. `durable_ok`: this commit may be the
    /// periodic durable one.
    fn commit(&mut self, durable_ok: bool) -> Result<(), StateError> {
        let loading = self.to_load.front().copied();
        if let Some(kg) = loading
            && self.loaded == 0
        {
            // From now on the database holds some of this key group's keys: the window must
            // know the chunk's open panes before they are copied there.
            self.list_open_panes(kg);
        }
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
        {
            let mut table = txn
                .open_table(TABLE)
                .map_err(|e| disk_err(&path, "cannot open the state table")(e.into()))?;
            let put = |table: &mut redb::Table<u128, [u8; VALUE_BYTES]>, k: u128, s: &KeyState| {
                table
                    .insert(k, chunk::encode_value(s))
                    .map(|_| ())
                    .map_err(|e| disk_err(&path, "cannot write a key")(e.into()))
            };
            if let Some(kg) = loading
                && let Some(b) = self.base.get(&kg)
            {
                let end = (self.loaded + self.limit * ENTRY_BYTES).min(b.bytes.len());
                let read_err =
                    |e: redb::StorageError| disk_err(&path, "cannot read a key")(e.into());
                for e in b.bytes[self.loaded..end].chunks_exact(ENTRY_BYTES) {
                    let k = composite(kg, chunk::entry_key(e, 0));
                    if table.get(k).map_err(read_err)?.is_none() {
                        let mut v = [0u8; VALUE_BYTES];
                        v.copy_from_slice(&e[8..]);
                        table
                            .insert(k, v)
                            .map_err(|e| disk_err(&path, "cannot write a key")(e.into()))?;
                    }
                }
                self.unloaded = self.unloaded.saturating_sub((end - self.loaded) as u64);
                self.loaded = end;
                self.in_db.insert(kg);
            }
            let mut dirty: Vec<(u128, KeyState)> = self.cache.drain().collect();
            dirty.sort_unstable_by_key(|(k, _)| *k);
            let mut last_group = None;
            for (k, s) in &dirty {
                put(&mut table, *k, s)?;
                let kg = (k >> 64) as u32;
                if last_group != Some(kg) {
                    self.in_db.insert(kg);
                    last_group = Some(kg);
                }
            }
        }
        txn.commit()
            .map_err(|e| disk_err(&path, "cannot commit to the state database")(e.into()))?;
        self.reader = Self::read_view(&self.file)?;
        if let Some(kg) = loading {
            if self
                .base
                .get(&kg)
                .is_none_or(|b| self.loaded >= b.bytes.len())
            {
                // Wholly in the database (and visible to the new read view).
                self.base.remove(&kg);
                self.to_load.pop_front();
                self.loaded = 0;
            }
            if let Some(g) = &self.unloaded_gauge {
                g.set(self.unloaded as f64);
            }
        }
        Ok(())
    }

    fn get_mut(&mut self, k: u128) -> Result<&mut KeyState, StateError> {
        use std::collections::hash_map::Entry;
        match self.cache.entry(k) {
            Entry::Occupied(o) => Ok(o.into_mut()),
            Entry::Vacant(v) => {
                let kg = (k >> 64) as u32;
                let stored = if self.in_db.contains(&kg) {
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
                    None => self
                        .base
                        .get(&kg)
                        .and_then(|b| chunk::find(&b.bytes, k as u64))
                        .unwrap_or_default(),
                };
                Ok(v.insert(s))
            }
        }
    }

    /// Path of the database file.
    pub fn path(&self) -> &Path {
        &self.file.path
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
            self.list_open_panes(kg);
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
                s.pane_count = 0;
                s.pane_sum = 0;
                s.pane_max_delay_us = 0;
            }
        }
        if !self.to_load.is_empty() {
            // Restored state keeps moving to disk even when few keys are written.
            self.commit(true)?;
        }
        Ok(())
    }

    fn snapshot(&mut self) -> Result<KeyedState, StateError> {
        // No commit at the barrier: the snapshot reads the cache as copied now over the
        // database as of the last commit (both consistent with this instant).
        let mut overlay: Vec<(u128, [u8; VALUE_BYTES])> = self
            .cache
            .iter()
            .map(|(k, s)| (*k, chunk::encode_value(s)))
            .collect();
        overlay.sort_unstable_by_key(|(k, _)| *k);
        let mut viewed: BTreeSet<u32> = self.in_db.clone();
        viewed.extend(overlay.iter().map(|(k, _)| (k >> 64) as u32));
        let overlay = Arc::new(overlay);
        let mut groups: BTreeMap<u32, KeyGroupData> = BTreeMap::new();
        // Restored key groups neither written nor loaded since: their chunk as it came.
        for (kg, b) in &self.base {
            if !viewed.contains(kg) {
                groups.insert(
                    *kg,
                    KeyGroupData::Encoded {
                        bytes: b.bytes.clone(),
                        open_panes: b.open_panes,
                    },
                );
            }
        }
        for kg in viewed {
            groups.insert(
                kg,
                KeyGroupData::Disk(GroupView {
                    table: self.reader.clone(),
                    key_group: kg,
                    file: self.file.clone(),
                    base: self.base.get(&kg).map(|b| b.bytes.clone()),
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
        // Nothing goes into the database on restore; key 5's open pane fires once, read from
        // the chunk; each firing loads one more key group (a cache's worth of keys).
        assert_eq!(d.base.len(), 8);
        assert!(d.in_db.is_empty());
        let mut fired = Vec::new();
        d.fire_panes(&mut |k, s| fired.push((k, s.pane_count)))
            .unwrap();
        assert_eq!(fired, vec![(5, 1)]);
        let mut again = 0;
        d.fire_panes(&mut |_, _| again += 1).unwrap();
        assert_eq!(again, 0);
        assert_eq!(d.in_db, BTreeSet::from([0, 1, 5]));
        assert_eq!(d.base.len(), 6);
        d.entry(2, 2).unwrap().total_count += 10;
        let snap = d.snapshot().unwrap();
        assert!(matches!(snap.groups[&3], KeyGroupData::Encoded { .. }));
        assert!(matches!(snap.groups[&2], KeyGroupData::Disk(_)));
        let mut expected = state.totals();
        expected.insert(2, (13, 0));
        assert_eq!(snap.try_totals().unwrap(), expected);
        // The fired pane stays closed in the snapshot (the database overrides the chunk).
        let five = snap.groups[&5].entries(5).unwrap();
        assert_eq!(five.len(), 8);
        assert!(five.iter().all(|(_, s)| s.pane_count == 0));
        let (_, open) = snap.groups[&5].encode().unwrap();
        assert!(!open);
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
    fn restored_chunks_move_to_the_database_in_slices_and_panes_fire_once() {
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
        // Cache of 4 keys: slices of 4 keys per commit.
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
        assert!(d.base.is_empty() && d.to_load.is_empty());
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
