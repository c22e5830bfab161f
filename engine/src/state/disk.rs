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
//! Restored key groups are kept encoded and loaded into the database on first use (one write
//! transaction per key group); key groups never touched go to the next snapshot as they came.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use redb::{Database, Durability, ReadOnlyTable, ReadableDatabase, TableDefinition};

use super::backend::{KeyedStateBackend, StateOwner};
use super::chunk::{self, VALUE_BYTES};
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

/// One key group inside a disk backend's snapshot (a read transaction).
#[derive(Clone)]
pub struct GroupView {
    table: Arc<ReadOnlyTable<u128, [u8; VALUE_BYTES]>>,
    key_group: u32,
    file: Arc<DbFile>,
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
    fn scan(&self, mut f: impl FnMut(u64, &[u8; VALUE_BYTES])) -> Result<(), StateError> {
        let err = |e: redb::StorageError| StateError::Disk {
            path: self.file.path.clone(),
            action: "cannot read a key group of a snapshot",
            reason: e.to_string(),
        };
        let lo = composite(self.key_group, 0);
        let hi = composite(self.key_group, u64::MAX);
        for item in self.table.range(lo..=hi).map_err(err)? {
            let (k, v) = item.map_err(err)?;
            f(k.value() as u64, &v.value());
        }
        Ok(())
    }

    /// The key group's entries in key order.
    ///
    /// # Errors
    /// [`StateError::Disk`] when the read fails.
    pub fn entries(&self) -> Result<Vec<(u64, KeyState)>, StateError> {
        let mut out = Vec::new();
        self.scan(|k, v| out.push((k, chunk::decode_value(v))))?;
        Ok(out)
    }

    /// The key group in [`chunk`] form and whether a key has an open pane, read straight from
    /// the stored values.
    ///
    /// # Errors
    /// [`StateError::Disk`] when the read fails.
    pub fn encode(&self) -> Result<(Bytes, bool), StateError> {
        let mut out = Vec::new();
        let mut open = false;
        self.scan(|k, v| {
            out.extend_from_slice(&k.to_le_bytes());
            out.extend_from_slice(v);
            open |= v[16..24] != [0u8; 8];
        })?;
        Ok((Bytes::from(out), open))
    }
}

/// Keyed state of one subtask in a redb database file with a write-back cache.
pub struct DiskBackend {
    file: Arc<DbFile>,
    /// Keys written since the last commit (authoritative over the database).
    cache: HashMap<u128, KeyState>,
    limit: usize,
    /// The database as of the last commit (cache misses read it).
    reader: Arc<ReadOnlyTable<u128, [u8; VALUE_BYTES]>>,
    /// Restored key groups not loaded yet.
    pending: BTreeMap<u32, KeyGroupData>,
    /// Key groups with data in the database or the cache.
    present: BTreeSet<u32>,
    /// Keys written since the window last fired (every open pane is among them).
    touched: BTreeSet<u128>,
    last_durable: std::time::Instant,
}

impl std::fmt::Debug for DiskBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiskBackend")
            .field("file", &self.file.path)
            .field("cached", &self.cache.len())
            .field("pending", &self.pending.len())
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
        let backend = DiskBackend {
            file,
            cache: HashMap::new(),
            limit: spec.cache_entries.max(1),
            reader,
            pending: restored.groups,
            present: BTreeSet::new(),
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

    /// Writes `entries` (and the cache, when `flush_cache`) in one transaction and refreshes
    /// the read view. `durable_ok`: this commit may be the periodic durable one.
    fn commit(
        &mut self,
        entries: &[(u128, KeyState)],
        flush_cache: bool,
        durable_ok: bool,
    ) -> Result<(), StateError> {
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
            for (k, s) in entries {
                put(&mut table, *k, s)?;
            }
            if flush_cache {
                let mut dirty: Vec<(u128, KeyState)> = self.cache.drain().collect();
                dirty.sort_unstable_by_key(|(k, _)| *k);
                for (k, s) in &dirty {
                    put(&mut table, *k, s)?;
                }
            }
        }
        txn.commit()
            .map_err(|e| disk_err(&path, "cannot commit to the state database")(e.into()))?;
        self.reader = Self::read_view(&self.file)?;
        Ok(())
    }

    /// Loads restored key group `kg` into the database, if pending.
    fn load(&mut self, kg: u32) -> Result<(), StateError> {
        let Some(data) = self.pending.remove(&kg) else {
            return Ok(());
        };
        let entries: Vec<(u128, KeyState)> = data
            .entries(kg)?
            .into_iter()
            .map(|(k, s)| (composite(kg, k), s))
            .collect();
        for (k, s) in &entries {
            if s.pane_count > 0 {
                self.touched.insert(*k);
            }
        }
        self.present.insert(kg);
        self.commit(&entries, false, true)
    }

    fn get_mut(&mut self, k: u128) -> Result<&mut KeyState, StateError> {
        use std::collections::hash_map::Entry;
        match self.cache.entry(k) {
            Entry::Occupied(o) => Ok(o.into_mut()),
            Entry::Vacant(v) => {
                let stored = self.reader.get(k).map_err(|e| StateError::Disk {
                    path: self.file.path.clone(),
                    action: "cannot read a key",
                    reason: e.to_string(),
                })?;
                let s = stored
                    .map(|g| chunk::decode_value(&g.value()))
                    .unwrap_or_default();
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
        if !self.pending.is_empty() && self.pending.contains_key(&key_group) {
            self.load(key_group)?;
        }
        if self.cache.len() >= self.limit {
            self.commit(&[], true, true)?;
        }
        self.present.insert(key_group);
        let k = composite(key_group, key);
        self.touched.insert(k);
        self.get_mut(k)
    }

    fn fire_panes(&mut self, emit: &mut dyn FnMut(u64, &KeyState)) -> Result<(), StateError> {
        // Restored key groups not loaded yet that hold open panes: fire those panes in the
        // encoded form (decode, close, encode again), without loading the key group.
        let open: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, d)| match d {
                KeyGroupData::Map(m) => m.values().any(|s| s.pane_count > 0),
                KeyGroupData::Encoded { open_panes, .. } => *open_panes,
                KeyGroupData::Disk(_) => true,
            })
            .map(|(kg, _)| *kg)
            .collect();
        for kg in open {
            let Some(data) = self.pending.get(&kg) else {
                continue;
            };
            let mut entries = data.entries(kg)?;
            for (key, s) in &mut entries {
                if s.pane_count > 0 {
                    emit(*key, s);
                    s.pane_count = 0;
                    s.pane_sum = 0;
                    s.pane_max_delay_us = 0;
                }
            }
            self.pending.insert(
                kg,
                KeyGroupData::Encoded {
                    bytes: chunk::encode(entries.into_iter()),
                    open_panes: false,
                },
            );
        }
        let touched = std::mem::take(&mut self.touched);
        for k in touched {
            if self.cache.len() >= self.limit {
                self.commit(&[], true, true)?;
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
        Ok(())
    }

    fn snapshot(&mut self) -> Result<KeyedState, StateError> {
        self.commit(&[], true, false)?;
        let mut groups: BTreeMap<u32, KeyGroupData> = self.pending.clone();
        for kg in &self.present {
            groups.insert(
                *kg,
                KeyGroupData::Disk(GroupView {
                    table: self.reader.clone(),
                    key_group: *kg,
                    file: self.file.clone(),
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

    #[test]
    fn restores_lazily_and_passes_untouched_key_groups_through() {
        let dir = tempfile::tempdir().unwrap();
        let mut state = KeyedState::default();
        for key in 0..64u64 {
            let s = state.entry((key % 8) as u32, key).unwrap();
            s.total_count = key + 1;
            s.pane_count = u64::from(key == 5);
        }
        let encoded = KeyedState {
            groups: state
                .groups
                .iter()
                .map(|(kg, d)| {
                    let (bytes, open_panes) = d.encode().unwrap();
                    (*kg, KeyGroupData::Encoded { bytes, open_panes })
                })
                .collect(),
            blobs: BTreeMap::new(),
        };
        let mut d = DiskBackend::open(&spec(dir.path(), 1000), &owner(), encoded).unwrap();
        // Nothing is loaded until used; key 5's open pane fires from the encoded form.
        assert_eq!(d.pending.len(), 8);
        let mut fired = Vec::new();
        d.fire_panes(&mut |k, _| fired.push(k)).unwrap();
        assert_eq!(fired, vec![5]);
        let mut again = 0;
        d.fire_panes(&mut |_, _| again += 1).unwrap();
        assert_eq!(again, 0);
        assert_eq!(d.pending.len(), 8);
        d.entry(2, 2).unwrap().total_count += 10;
        assert_eq!(d.pending.len(), 7);
        let snap = d.snapshot().unwrap();
        assert!(matches!(snap.groups[&3], KeyGroupData::Encoded { .. }));
        let mut expected = state.totals();
        expected.insert(2, (13, 0));
        assert_eq!(snap.try_totals().unwrap(), expected);
    }
}
