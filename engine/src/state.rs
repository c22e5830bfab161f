//! Keyed state in an in-memory (heap) backend, organized by key group.
//!
//! Each key group's map sits behind an [`Arc`], so a checkpoint snapshot
//! ([`KeyedState::snapshot`]) copies only the key-group table (one pointer per key group) and
//! the subtask keeps processing: the first write to a key group after a snapshot copies that
//! key group alone (copy-on-write through [`Arc::make_mut`]). Serialization and writing happen
//! later on the checkpoint writer's thread.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

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
}

/// The keyed state of one operator subtask (or of a whole operator, when merged): key group →
/// key → state. Ordered maps so that a dump is deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyedState {
    /// Key group → (key → state). Shared with snapshots until written (copy-on-write).
    pub groups: BTreeMap<u32, Arc<BTreeMap<u64, KeyState>>>,
    /// Key group → the encoded state of an event-time operator (windows, joins; see
    /// [`crate::time`]) for that key group. Empty for `window` operators.
    #[serde(default)]
    pub blobs: BTreeMap<u32, Vec<u8>>,
}

impl KeyedState {
    /// State of `key` in `key_group`, created empty on first use.
    pub fn entry(&mut self, key_group: u32, key: u64) -> &mut KeyState {
        Arc::make_mut(self.groups.entry(key_group).or_default())
            .entry(key)
            .or_default()
    }

    /// A point-in-time copy for a checkpoint, in O(key groups): key groups are shared with
    /// `self` until `self` next writes to them.
    pub fn snapshot(&self) -> KeyedState {
        self.clone()
    }

    /// Moves every key group of `other` into `self` (key groups are disjoint across subtasks).
    pub fn merge(&mut self, other: KeyedState) {
        for (kg, keys) in other.groups {
            match self.groups.entry(kg) {
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(keys);
                }
                std::collections::btree_map::Entry::Occupied(mut o) => {
                    let keys = Arc::try_unwrap(keys).unwrap_or_else(|a| (*a).clone());
                    Arc::make_mut(o.get_mut()).extend(keys);
                }
            }
        }
        self.blobs.extend(other.blobs);
    }

    /// The part of this state in the key-group range `range`.
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

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.groups.values().map(|m| m.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Running totals per key `(key → (count, sum))`, independent of key-group layout and of
    /// open panes: what a rescaled run must agree on with an uninterrupted one.
    pub fn totals(&self) -> BTreeMap<u64, (u64, i64)> {
        self.groups
            .values()
            .flat_map(|keys| keys.iter().map(|(k, s)| (*k, (s.total_count, s.total_sum))))
            .collect()
    }
}
