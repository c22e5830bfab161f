//! The heap state backend: key groups as in-memory ordered maps, shared copy-on-write with
//! checkpoint snapshots.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::backend::KeyedStateBackend;
use super::{KeyGroupData, KeyState, KeyedState, StateError};

/// Keyed state of one subtask in memory.
///
/// Key groups restored from a savepoint stay encoded until first written (or until the window
/// fires, for those holding open panes); a snapshot shares every key group with the backend
/// (O(key groups)), and the next write to a shared key group copies that key group alone.
#[derive(Debug)]
pub struct HeapBackend {
    groups: BTreeMap<u32, KeyGroupData>,
    /// Bit per key group: written since the window last fired (may hold open panes).
    touched: Vec<u64>,
}

impl HeapBackend {
    /// A backend over `max_parallelism` key groups holding `restored`.
    pub fn new(max_parallelism: u32, restored: KeyedState) -> HeapBackend {
        let mut touched = vec![0u64; (max_parallelism as usize).div_ceil(64)];
        for (kg, data) in &restored.groups {
            let open = match data {
                KeyGroupData::Map(m) => m.values().any(|s| s.pane_count > 0),
                KeyGroupData::Encoded { open_panes, .. } => *open_panes,
                KeyGroupData::Disk(_) => true,
            };
            if open && let Some(w) = touched.get_mut(*kg as usize / 64) {
                *w |= 1 << (kg % 64);
            }
        }
        HeapBackend {
            groups: restored.groups,
            touched,
        }
    }

    fn group(&mut self, key_group: u32) -> Result<&mut BTreeMap<u64, KeyState>, StateError> {
        let slot = self
            .groups
            .entry(key_group)
            .or_insert_with(|| KeyGroupData::Map(Arc::default()));
        if !matches!(slot, KeyGroupData::Map(_)) {
            *slot = KeyGroupData::Map(slot.to_map(key_group)?);
        }
        match slot {
            KeyGroupData::Map(map) => Ok(Arc::make_mut(map)),
            _ => unreachable!("the key group was just made a map"),
        }
    }
}

impl KeyedStateBackend for HeapBackend {
    #[inline]
    fn entry(&mut self, key_group: u32, key: u64) -> Result<&mut KeyState, StateError> {
        if let Some(w) = self.touched.get_mut(key_group as usize / 64) {
            *w |= 1 << (key_group % 64);
        }
        Ok(self.group(key_group)?.entry(key).or_default())
    }

    fn fire_panes(&mut self, emit: &mut dyn FnMut(u64, &KeyState)) -> Result<(), StateError> {
        let mut touched = std::mem::take(&mut self.touched);
        for (w, bits) in touched.iter_mut().enumerate() {
            while *bits != 0 {
                let kg = (w * 64) as u32 + bits.trailing_zeros();
                *bits &= *bits - 1;
                let open = match self.groups.get(&kg) {
                    Some(KeyGroupData::Map(m)) => m.values().any(|s| s.pane_count > 0),
                    Some(_) => true,
                    None => false,
                };
                if !open {
                    continue;
                }
                for (key, s) in self.group(kg)?.iter_mut() {
                    if s.pane_count > 0 {
                        emit(*key, s);
                        s.pane_count = 0;
                        s.pane_sum = 0;
                        s.pane_max_delay_us = 0;
                    }
                }
            }
        }
        self.touched = touched;
        Ok(())
    }

    fn snapshot(&mut self) -> Result<KeyedState, StateError> {
        Ok(KeyedState {
            groups: self.groups.clone(),
            blobs: BTreeMap::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn snapshot_is_not_changed_by_later_writes_and_panes_fire_once() {
        let mut h = HeapBackend::new(8, KeyedState::default());
        for key in 0..20u64 {
            let s = h.entry((key % 8) as u32, key).unwrap();
            s.total_count += 1;
            s.pane_count += 1;
            s.pane_sum += key as i64;
        }
        let snap = h.snapshot().unwrap();
        h.entry(3, 3).unwrap().total_count += 100;
        assert_eq!(snap.totals()[&3], (1, 0));
        let mut fired = Vec::new();
        h.fire_panes(&mut |k, s| fired.push((k, s.pane_sum)))
            .unwrap();
        assert_eq!(fired.len(), 20);
        let mut again = 0;
        h.fire_panes(&mut |_, _| again += 1).unwrap();
        assert_eq!(again, 0);
        assert_eq!(h.snapshot().unwrap().totals()[&3], (101, 0));
        // The snapshot still has the open panes.
        assert_eq!(snap.groups[&3].entries(3).unwrap()[0].1.pane_count, 1);
    }

    #[test]
    fn restored_key_groups_stay_encoded_until_used_and_open_panes_fire() {
        let mut h = HeapBackend::new(8, KeyedState::default());
        for key in 0..40u64 {
            let s = h.entry((key % 8) as u32, key).unwrap();
            s.total_count += 2;
            if key == 9 {
                s.pane_count = 1;
            }
        }
        let snap = h.snapshot().unwrap();
        let encoded = KeyedState {
            groups: snap
                .groups
                .iter()
                .map(|(kg, d)| {
                    let (bytes, open_panes) = d.encode().unwrap();
                    (*kg, KeyGroupData::Encoded { bytes, open_panes })
                })
                .collect(),
            blobs: BTreeMap::new(),
        };
        let mut r = HeapBackend::new(8, encoded);
        assert!(matches!(r.groups[&2], KeyGroupData::Encoded { .. }));
        let mut fired = Vec::new();
        r.fire_panes(&mut |k, _| fired.push(k)).unwrap();
        assert_eq!(fired, vec![9]);
        assert!(
            matches!(r.groups[&1], KeyGroupData::Map(_)),
            "fired group decoded"
        );
        assert!(matches!(r.groups[&2], KeyGroupData::Encoded { .. }));
        r.entry(2, 2).unwrap().total_count += 1;
        assert_eq!(r.snapshot().unwrap().totals()[&2], (3, 0));
        assert_eq!(r.snapshot().unwrap().totals(), {
            let mut t = snap.totals();
            t.insert(2, (3, 0));
            t
        });
    }
}
