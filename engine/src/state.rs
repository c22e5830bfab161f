//! Keyed state, organized by key group, behind two state backends.
//!
//! - [`heap::HeapBackend`]: key groups as in-memory ordered maps behind [`Arc`]s. A checkpoint
//!   snapshot copies only the key-group table (one pointer per key group) and the subtask keeps
//!   processing; the first write to a key group after a snapshot copies that key group alone
//!   (copy-on-write through [`Arc::make_mut`]).
//! - [`disk::DiskBackend`]: key groups as sorted segment files ([`segment`], in the savepoint
//!   chunk format) with the keys written since in an embedded on-disk B-tree ([`redb`]) and a
//!   bounded write-back cache, for state larger than memory. A snapshot keeps the current
//!   segments and a read transaction open (MVCC) while the subtask goes on writing; the
//!   checkpoint writer copies a segment's bytes and encodes only the keys written since.
//!
//! Both hand a checkpoint a [`KeyedState`]: key group → [`KeyGroupData`]. The checkpoint writer
//! encodes each key group separately ([`chunk`], in parallel), so a savepoint restores at any
//! parallelism into either backend: a subtask takes the key groups it owns. Restored key groups
//! stay in the savepoint's file ([`KeyGroupData::Stored`], read by positioned reads) until
//! first touched (lazy restore; the disk backend reads them in place as segments): a restore costs O(key groups) before the
//! first record, and a key group that is never touched is written to the next checkpoint as the
//! same bytes.
//!
//! The backend is chosen per job (`state: { backend: heap | disk, dir: ... }`,
//! [`crate::spec::StateSpec`]).

pub mod backend;
pub mod chunk;
pub mod disk;
pub mod heap;
pub mod segment;

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

pub use backend::{StateBackend, StateOwner};

/// State of one key in a keyed window operator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyState {
    /// Records seen for this key since the job started (across restores).
    pub total_count: u64,
    /// Sum of the values of those records.
    pub total_sum: i64,
    /// Records in the currently open window pane.
    pub pane_count: u64,
    /// Sum of values in the open pane.
    pub pane_sum: i64,
    /// Largest delay (µs) from arrival at the source to arrival at the window among the
    /// open pane's records.
    pub pane_max_delay_us: u64,
    /// Smallest value in the open pane (meaningful while `pane_count > 0`).
    pub pane_min: i64,
    /// Largest value in the open pane (meaningful while `pane_count > 0`).
    pub pane_max: i64,
    /// The open pane was restored from a savepoint format without `pane_min`/`pane_max`
    /// (format version 2 or older): its extrema cover only the records added since, so the
    /// pane's `min`/`max` are unknown (written as JSON `null`).
    pub pane_extrema_partial: bool,
}

impl KeyState {
    /// Adds `count` records whose values total `sum` (for one record, `sum` is its value),
    /// `delay_us` after they arrived at the source: to the running totals and the open pane.
    pub fn add(&mut self, count: u64, sum: i64, delay_us: u64) {
        if self.pane_count == 0 {
            self.pane_min = sum;
            self.pane_max = sum;
        } else {
            self.pane_min = self.pane_min.min(sum);
            self.pane_max = self.pane_max.max(sum);
        }
        self.total_count += count;
        self.total_sum += sum;
        self.pane_count += count;
        self.pane_sum += sum;
        self.pane_max_delay_us = self.pane_max_delay_us.max(delay_us);
    }

    /// The open pane's `(min, max)`, or `None` when no pane is open or its extrema are
    /// unknown ([`KeyState::pane_extrema_partial`]).
    pub fn pane_extrema(&self) -> Option<(i64, i64)> {
        (self.pane_count > 0 && !self.pane_extrema_partial)
            .then_some((self.pane_min, self.pane_max))
    }

    /// Closes the open pane (after it fired); the running totals stay.
    pub fn close_pane(&mut self) {
        *self = KeyState {
            total_count: self.total_count,
            total_sum: self.total_sum,
            ..KeyState::default()
        };
    }
}

/// [`KeyState`] as savepoint format versions 1 and 2 held it (no pane extrema): version 1
/// files are postcard values of it, version 2 chunks its fixed-width form
/// ([`chunk::migrate_legacy`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LegacyKeyState {
    /// As [`KeyState::total_count`].
    pub total_count: u64,
    /// As [`KeyState::total_sum`].
    pub total_sum: i64,
    /// As [`KeyState::pane_count`].
    pub pane_count: u64,
    /// As [`KeyState::pane_sum`].
    pub pane_sum: i64,
    /// As [`KeyState::pane_max_delay_us`].
    pub pane_max_delay_us: u64,
}

impl From<LegacyKeyState> for KeyState {
    /// An open pane's extrema are unknown: marked partial.
    fn from(s: LegacyKeyState) -> KeyState {
        KeyState {
            total_count: s.total_count,
            total_sum: s.total_sum,
            pane_count: s.pane_count,
            pane_sum: s.pane_sum,
            pane_max_delay_us: s.pane_max_delay_us,
            pane_min: 0,
            pane_max: 0,
            pane_extrema_partial: s.pane_count > 0,
        }
    }
}

/// Errors of a state backend or of decoding a key group.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// An encoded key group is malformed.
    #[error("key group {key_group}: cannot decode keyed state: {reason}")]
    Decode {
        /// The key group.
        key_group: u32,
        /// Why.
        reason: String,
    },
    /// The disk backend's working directory or database file failed.
    #[error("{path}: {action}: {reason}")]
    Disk {
        /// The database file or directory.
        path: std::path::PathBuf,
        /// What was being done.
        action: &'static str,
        /// The underlying error.
        reason: String,
    },
}

/// The keyed state of one key group, as held by a snapshot or a restored savepoint.
#[derive(Debug, Clone)]
pub enum KeyGroupData {
    /// Decoded, in memory (heap backend); shared copy-on-write with the subtask.
    Map(Arc<BTreeMap<u64, KeyState>>),
    /// Encoded ([`chunk`] format): read from a savepoint and not touched since.
    Encoded {
        /// The key group's entries.
        bytes: Bytes,
        /// Whether some key has an open window pane (those key groups are decoded when the
        /// window next fires).
        open_panes: bool,
    },
    /// In a disk backend's consistent snapshot; read when the checkpoint is written.
    Disk(disk::GroupView),
    /// A restored key group still in the savepoint's state file ([`chunk`] form; length,
    /// checksum and key order verified when the savepoint was read), read on demand by
    /// positioned reads: a restore holds no state file in memory.
    Stored(Arc<segment::Segment>),
    /// A restored chunk ([`chunk`] form, key order checked) with the keys written since over
    /// it (heap backend): a key is read from `delta`, else found in `base` by binary search,
    /// so a restored key group is never decoded as a whole before it has had many writes.
    Layered {
        /// The restored chunk.
        base: Bytes,
        /// Whether some key of `base` not in `delta` may have an open window pane.
        open_panes: bool,
        /// Keys written since the restore (override `base`); shared copy-on-write.
        delta: Arc<BTreeMap<u64, KeyState>>,
    },
}

/// Calls `f(key, value)` for the entries of `base` ([`chunk`] form) and `delta` merged in key
/// order, `delta` winning on equal keys; `value` is `Err(state)` for a key from `delta`,
/// `Ok(encoded value)` for one from `base`.
fn merge_layers(
    base: &[u8],
    delta: &BTreeMap<u64, KeyState>,
    mut f: impl FnMut(u64, Result<&[u8], &KeyState>),
) {
    let mut d = delta.iter().peekable();
    chunk::for_each(base, |key, v| {
        while let Some((dk, ds)) = d.next_if(|(dk, _)| **dk < key) {
            f(*dk, Err(ds));
        }
        match d.next_if(|(dk, _)| **dk == key) {
            Some((_, ds)) => f(key, Err(ds)),
            None => f(key, Ok(v)),
        }
    });
    for (dk, ds) in d {
        f(*dk, Err(ds));
    }
}

impl KeyGroupData {
    /// The key group's entries `(key, state)` in key order.
    ///
    /// # Errors
    /// [`StateError`] when the encoded form is malformed or the disk read fails.
    pub fn entries(&self, key_group: u32) -> Result<Vec<(u64, KeyState)>, StateError> {
        match self {
            KeyGroupData::Map(m) => Ok(m.iter().map(|(k, s)| (*k, *s)).collect()),
            KeyGroupData::Encoded { bytes, .. } => chunk::decode(key_group, bytes),
            KeyGroupData::Disk(view) => view.entries(),
            KeyGroupData::Stored(seg) => chunk::decode(key_group, &seg.read_all()?),
            KeyGroupData::Layered { base, delta, .. } => {
                let mut out = Vec::with_capacity(base.len() / chunk::ENTRY_BYTES + delta.len());
                merge_layers(base, delta, |k, v| {
                    out.push((k, v.map_or_else(|s| *s, chunk::decode_slice)));
                });
                Ok(out)
            }
        }
    }

    /// The key group as an ordered map (no copy for [`KeyGroupData::Map`]).
    ///
    /// # Errors
    /// As [`KeyGroupData::entries`].
    pub fn to_map(&self, key_group: u32) -> Result<Arc<BTreeMap<u64, KeyState>>, StateError> {
        match self {
            KeyGroupData::Map(m) => Ok(m.clone()),
            other => Ok(Arc::new(other.entries(key_group)?.into_iter().collect())),
        }
    }

    /// The encoded form ([`chunk`]) and whether a key has an open pane. No work for
    /// [`KeyGroupData::Encoded`].
    ///
    /// # Errors
    /// As [`KeyGroupData::entries`].
    pub fn encode(&self) -> Result<(Bytes, bool), StateError> {
        match self {
            KeyGroupData::Map(m) => Ok((
                chunk::encode(m.iter().map(|(k, s)| (*k, *s))),
                m.values().any(|s| s.pane_count > 0),
            )),
            KeyGroupData::Encoded { bytes, open_panes } => Ok((bytes.clone(), *open_panes)),
            KeyGroupData::Disk(view) => view.encode(),
            KeyGroupData::Stored(seg) => Ok((seg.read_all()?, seg.open_panes())),
            KeyGroupData::Layered { .. } => {
                let mut out = Vec::new();
                let (_, open) = self.encode_into(&mut out)?;
                Ok((Bytes::from(out), open))
            }
        }
    }

    /// As [`KeyGroupData::encode`], but into a caller's buffer (reused across key groups by
    /// the savepoint writer, so that writing a savepoint allocates no memory per byte of
    /// state): appends the chunk to `out` and returns `(None, open panes)`, or returns
    /// `(Some(bytes), open panes)` without touching `out` when the key group is already held
    /// encoded in memory (no copy).
    ///
    /// # Errors
    /// As [`KeyGroupData::entries`].
    pub fn encode_into(&self, out: &mut Vec<u8>) -> Result<(Option<Bytes>, bool), StateError> {
        match self {
            KeyGroupData::Map(m) => {
                chunk::encode_into(out, m.iter().map(|(k, s)| (*k, *s)));
                Ok((None, m.values().any(|s| s.pane_count > 0)))
            }
            KeyGroupData::Encoded { bytes, open_panes } => Ok((Some(bytes.clone()), *open_panes)),
            KeyGroupData::Disk(view) => view.encode_into(out),
            KeyGroupData::Stored(seg) => {
                seg.read_into(out)?;
                Ok((None, seg.open_panes()))
            }
            KeyGroupData::Layered { base, delta, .. } => {
                out.reserve(base.len() + delta.len() * chunk::ENTRY_BYTES);
                let mut open = false;
                merge_layers(base, delta, |k, v| {
                    out.extend_from_slice(&k.to_le_bytes());
                    match v {
                        Ok(v) => {
                            open |= chunk::value_has_open_pane(v);
                            out.extend_from_slice(v);
                        }
                        Err(s) => {
                            open |= s.pane_count > 0;
                            out.extend_from_slice(&chunk::encode_value(s));
                        }
                    }
                });
                Ok((None, open))
            }
        }
    }

    /// Number of keys (decodes or reads the key group when needed).
    ///
    /// # Errors
    /// As [`KeyGroupData::entries`].
    pub fn len(&self, key_group: u32) -> Result<usize, StateError> {
        match self {
            KeyGroupData::Map(m) => Ok(m.len()),
            KeyGroupData::Encoded { bytes, .. } => Ok(bytes.len() / chunk::ENTRY_BYTES),
            KeyGroupData::Disk(_) => Ok(self.entries(key_group)?.len()),
            KeyGroupData::Stored(seg) => Ok(seg.keys()),
            KeyGroupData::Layered { base, delta, .. } => Ok(base.len() / chunk::ENTRY_BYTES
                + delta
                    .keys()
                    .filter(|k| chunk::find(base, **k).is_none())
                    .count()),
        }
    }
}

/// The keyed state of one operator subtask (or of a whole operator, when merged): key group →
/// key → state. This is what a snapshot hands the checkpoint writer and what a savepoint
/// restores from; ordered maps so that a dump is deterministic.
#[derive(Debug, Clone, Default)]
pub struct KeyedState {
    /// Key group → its keyed state ([`KeyState`] per key; `window` operators).
    pub groups: BTreeMap<u32, KeyGroupData>,
    /// Key group → the encoded state of an event-time operator (windows, joins; see
    /// [`crate::time`]) for that key group. Empty for `window` operators.
    pub blobs: BTreeMap<u32, Vec<u8>>,
}

impl PartialEq for KeyedState {
    /// Equal when both hold the same keys with the same states in the same key groups and the
    /// same blobs (whatever form the key groups are in). Undecodable key groups are unequal.
    fn eq(&self, other: &Self) -> bool {
        self.blobs == other.blobs
            && self.groups.len() == other.groups.len()
            && self
                .groups
                .iter()
                .zip(&other.groups)
                .all(|((ka, a), (kb, b))| {
                    ka == kb
                        && match (a.entries(*ka), b.entries(*kb)) {
                            (Ok(x), Ok(y)) => x == y,
                            _ => false,
                        }
                })
    }
}

impl KeyedState {
    /// State of `key` in `key_group`, created empty on first use (decodes the key group if it
    /// is encoded). For building states outside a running job (tests, tools).
    ///
    /// # Errors
    /// [`StateError`] when the key group cannot be decoded.
    pub fn entry(&mut self, key_group: u32, key: u64) -> Result<&mut KeyState, StateError> {
        let slot = self
            .groups
            .entry(key_group)
            .or_insert_with(|| KeyGroupData::Map(Arc::default()));
        if !matches!(slot, KeyGroupData::Map(_)) {
            *slot = KeyGroupData::Map(slot.to_map(key_group)?);
        }
        let KeyGroupData::Map(map) = slot else {
            unreachable!("the key group was just made a map")
        };
        Ok(Arc::make_mut(map).entry(key).or_default())
    }

    /// A point-in-time copy for a checkpoint, in O(key groups): key groups are shared.
    pub fn snapshot(&self) -> KeyedState {
        self.clone()
    }

    /// Moves every key group of `other` into `self`. Key groups are disjoint across subtasks;
    /// should both hold one, their keys are merged (`other` wins per key), and if either cannot
    /// be decoded, `other`'s key group is kept and the conflict logged.
    pub fn merge(&mut self, other: KeyedState) {
        for (kg, data) in other.groups {
            match self.groups.entry(kg) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(data);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    match (o.get().entries(kg), data.entries(kg)) {
                        (Ok(mut a), Ok(b)) => {
                            a.extend(b);
                            let map: BTreeMap<u64, KeyState> = a.into_iter().collect();
                            o.insert(KeyGroupData::Map(Arc::new(map)));
                        }
                        (a, b) => {
                            tracing::error!(key_group = kg, left = ?a.err(), right = ?b.err(), "cannot merge key group; keeping the newer one");
                            o.insert(data);
                        }
                    }
                }
            }
        }
        self.blobs.extend(other.blobs);
    }

    /// The part of this state in the key-group range `range` (shares the key groups).
    pub fn slice(&self, range: Range<u32>) -> KeyedState {
        KeyedState {
            groups: self
                .groups
                .range(range.clone())
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
            blobs: self
                .blobs
                .range(range)
                .map(|(k, v)| (*k, v.clone()))
                .collect(),
        }
    }

    /// Number of keys held (key groups that cannot be read count as empty).
    pub fn len(&self) -> usize {
        self.groups
            .iter()
            .map(|(kg, g)| g.len(*kg).unwrap_or(0))
            .sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Running totals per key `(key → (count, sum))`, independent of key-group layout and of
    /// open panes: what a rescaled run must agree on with an uninterrupted one.
    ///
    /// # Errors
    /// [`StateError`] naming the first key group that cannot be decoded or read.
    pub fn try_totals(&self) -> Result<BTreeMap<u64, (u64, i64)>, StateError> {
        let mut out = BTreeMap::new();
        for (kg, data) in &self.groups {
            for (k, s) in data.entries(*kg)? {
                out.insert(k, (s.total_count, s.total_sum));
            }
        }
        Ok(out)
    }

    /// As [`KeyedState::try_totals`]; a key group that cannot be read is logged and left out
    /// (so a comparison with another run fails rather than passing).
    pub fn totals(&self) -> BTreeMap<u64, (u64, i64)> {
        let mut out = BTreeMap::new();
        for (kg, data) in &self.groups {
            match data.entries(*kg) {
                Ok(entries) => {
                    out.extend(
                        entries
                            .into_iter()
                            .map(|(k, s)| (k, (s.total_count, s.total_sum))),
                    );
                }
                Err(e) => tracing::error!(error = %e, "key group left out of the totals"),
            }
        }
        out
    }
}
