//! The heap state backend: key groups as in-memory ordered maps, shared copy-on-write with
//! checkpoint snapshots.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::backend::KeyedStateBackend;
use super::chunk::{self, ENTRY_BYTES};
use super::{KeyGroupData, KeyState, KeyedState, StateError};

/// A restored key group is decoded into a map once its keys written since the restore reach
/// 1/`DECODE_RATIO` of its keys (until then reads go to the chunk by binary search).
const DECODE_RATIO: usize = 8;
/// ... or this many keys, whichever is more.
const DECODE_MIN_KEYS: usize = 64;

/// Keyed state of one subtask in memory.
///
/// Key groups restored from a savepoint stay encoded until first written; then a key group is
/// its chunk (key order checked on that first write) with the keys written since in a small
/// map over it ([`KeyGroupData::Layered`]): a key is read from the map, else from the chunk by
/// binary search, so the first records after a restore decode single keys, not whole key
/// groups. Once the written keys reach 1/8 of the chunk's, the key group is decoded into one
/// map. A snapshot shares every key group with the backend (O(key groups)), and the next write
/// to a shared key group copies that key group's map alone (the chunk is shared, not copied).
#[derive(Debug)]
pub struct HeapBackend {
    /// Key group → its data (`None`: no state yet), indexed by key group and grown on demand.
    groups: Vec<Option<KeyGroupData>>,
    /// Bit per key group: written since the window last fired (may hold open panes).
    touched: Vec<u64>,
}

/// What [`HeapBackend::slot`] hands out: a key group's map, or its restored chunk and the map
/// of keys written since over it.
enum Slot<'a> {
    Map(&'a mut BTreeMap<u64, KeyState>),
    Layered {
        base: &'a [u8],
        open_panes: &'a mut bool,
        delta: &'a mut BTreeMap<u64, KeyState>,
    },
}

/// Key group `kg`'s place in `groups`, growing it (with `None`s) to reach it.
fn group_slot(groups: &mut Vec<Option<KeyGroupData>>, kg: u32) -> &mut Option<KeyGroupData> {
    let i = kg as usize;
    if i >= groups.len() {
        groups.resize_with(i + 1, || None);
    }
    &mut groups[i]
}

impl HeapBackend {
    /// A backend over `max_parallelism` key groups holding `restored`.
    pub fn new(max_parallelism: u32, restored: KeyedState) -> HeapBackend {
        let mut touched = vec![0u64; (max_parallelism as usize).div_ceil(64)];
        for (kg, data) in &restored.groups {
            let open = match data {
                KeyGroupData::Map(m) => m.values().any(|s| s.pane_count > 0),
                KeyGroupData::Encoded { open_panes, .. } => *open_panes,
                KeyGroupData::Stored(seg) => seg.open_panes(),
                KeyGroupData::Disk(_) | KeyGroupData::Layered { .. } => true,
            };
            if open && let Some(w) = touched.get_mut(*kg as usize / 64) {
                *w |= 1 << (kg % 64);
            }
        }
        let mut groups = Vec::new();
        for (kg, data) in restored.groups {
            *group_slot(&mut groups, kg) = Some(data);
        }
        HeapBackend { groups, touched }
    }

    /// The key group ready for writing: a map (a new or decoded key group), or a restored
    /// chunk with its delta (an encoded key group's order is checked on this first use; a
    /// layered one whose delta has grown is decoded into a map).
    fn slot(&mut self, key_group: u32) -> Result<Slot<'_>, StateError> {
        let slot = group_slot(&mut self.groups, key_group)
            .get_or_insert_with(|| KeyGroupData::Map(Arc::default()));
        let replace = match slot {
            KeyGroupData::Map(_) => None,
            KeyGroupData::Encoded { bytes, open_panes } => {
                // Key order, so that binary search finds every key (length and CRC-32 were
                // checked when the savepoint was read).
                chunk::check(key_group, bytes)?;
                Some(KeyGroupData::Layered {
                    base: bytes.clone(),
                    open_panes: *open_panes,
                    delta: Arc::default(),
                })
            }
            KeyGroupData::Stored(seg) => {
                // Read from the savepoint file on first use (length, checksum and key order
                // were checked when the savepoint was read): the restore itself holds nothing.
                Some(KeyGroupData::Layered {
                    base: seg.read_all()?,
                    open_panes: seg.open_panes(),
                    delta: Arc::default(),
                })
            }
            KeyGroupData::Layered { base, delta, .. } => {
                let keys = base.len() / ENTRY_BYTES;
                (delta.len() >= (keys / DECODE_RATIO).max(DECODE_MIN_KEYS))
                    .then(|| slot.to_map(key_group).map(KeyGroupData::Map))
                    .transpose()?
            }
            KeyGroupData::Disk(_) => Some(KeyGroupData::Map(slot.to_map(key_group)?)),
        };
        if let Some(r) = replace {
            *slot = r;
        }
        match slot {
            KeyGroupData::Map(map) => Ok(Slot::Map(Arc::make_mut(map))),
            KeyGroupData::Layered {
                base,
                open_panes,
                delta,
            } => Ok(Slot::Layered {
                base,
                open_panes,
                delta: Arc::make_mut(delta),
            }),
            _ => unreachable!("the key group was just made a map or layered"),
        }
    }
}

/// Emits `s` if its pane is open and closes the pane.
fn fire(key: u64, s: &mut KeyState, emit: &mut dyn FnMut(u64, &KeyState)) {
    if s.pane_count > 0 {
        emit(key, s);
        s.close_pane();
    }
}

impl KeyedStateBackend for HeapBackend {
    #[inline]
    fn entry(&mut self, key_group: u32, key: u64) -> Result<&mut KeyState, StateError> {
        if let Some(w) = self.touched.get_mut(key_group as usize / 64) {
            *w |= 1 << (key_group % 64);
        }
        Ok(match self.slot(key_group)? {
            Slot::Map(m) => m.entry(key).or_default(),
            Slot::Layered { base, delta, .. } => delta
                .entry(key)
                .or_insert_with(|| chunk::find(base, key).unwrap_or_default()),
        })
    }

    fn fire_panes(&mut self, emit: &mut dyn FnMut(u64, &KeyState)) -> Result<(), StateError> {
        let mut touched = std::mem::take(&mut self.touched);
        for (w, bits) in touched.iter_mut().enumerate() {
            while *bits != 0 {
                let kg = (w * 64) as u32 + bits.trailing_zeros();
                *bits &= *bits - 1;
                let open = match self.groups.get(kg as usize).and_then(Option::as_ref) {
                    Some(KeyGroupData::Map(m)) => m.values().any(|s| s.pane_count > 0),
                    Some(KeyGroupData::Layered {
                        open_panes, delta, ..
                    }) => *open_panes || delta.values().any(|s| s.pane_count > 0),
                    Some(_) => true,
                    None => false,
                };
                if !open {
                    continue;
                }
                match self.slot(kg)? {
                    Slot::Map(m) => {
                        for (key, s) in m.iter_mut() {
                            fire(*key, s, emit);
                        }
                    }
                    Slot::Layered {
                        base,
                        open_panes,
                        delta,
                    } => {
                        if *open_panes {
                            // The chunk's open panes fire once; the closed states go to the
                            // delta, which overrides the chunk from now on.
                            chunk::for_each(base, |key, v| {
                                if chunk::value_has_open_pane(v) && !delta.contains_key(&key) {
                                    delta.insert(key, chunk::decode_slice(v));
                                }
                            });
                            *open_panes = false;
                        }
                        for (key, s) in delta.iter_mut() {
                            fire(*key, s, emit);
                        }
                    }
                }
            }
        }
        self.touched = touched;
        Ok(())
    }

    fn snapshot(&mut self) -> Result<KeyedState, StateError> {
        Ok(KeyedState {
            groups: self
                .groups
                .iter()
                .enumerate()
                .filter_map(|(kg, d)| Some((u32::try_from(kg).ok()?, d.clone()?)))
                .collect(),
            blobs: BTreeMap::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    impl HeapBackend {
        /// Key group `kg`'s data (panics when it has none).
        fn group(&self, kg: u32) -> &KeyGroupData {
            self.groups[kg as usize].as_ref().unwrap()
        }
    }

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
    fn snapshots_hold_the_written_key_groups_alone_in_order() {
        let mut h = HeapBackend::new(128, KeyedState::default());
        for kg in [100u32, 3, 127, 3] {
            h.entry(kg, u64::from(kg)).unwrap().total_count += 1;
        }
        let snap = h.snapshot().unwrap();
        assert_eq!(
            snap.groups.keys().copied().collect::<Vec<_>>(),
            [3, 100, 127]
        );
        assert_eq!(snap.totals()[&3], (2, 0));
        // A backend restored from it holds the same key groups, sparse as they are.
        let mut r = HeapBackend::new(128, snap.clone());
        assert_eq!(r.snapshot().unwrap(), snap);
        r.entry(0, 0).unwrap().total_count += 1;
        assert_eq!(
            r.snapshot()
                .unwrap()
                .groups
                .keys()
                .copied()
                .collect::<Vec<_>>(),
            [0, 3, 100, 127]
        );
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
        assert!(matches!(r.group(2), KeyGroupData::Encoded { .. }));
        let mut fired = Vec::new();
        r.fire_panes(&mut |k, _| fired.push(k)).unwrap();
        assert_eq!(fired, vec![9]);
        assert!(
            matches!(r.group(1), KeyGroupData::Layered { .. }),
            "fired group layered, not decoded"
        );
        assert!(matches!(r.group(2), KeyGroupData::Encoded { .. }));
        r.entry(2, 2).unwrap().total_count += 1;
        assert_eq!(r.snapshot().unwrap().totals()[&2], (3, 0));
        assert_eq!(r.snapshot().unwrap().totals(), {
            let mut t = snap.totals();
            t.insert(2, (3, 0));
            t
        });
    }

    fn restored(entries: &[(u64, KeyState)], kg: u32) -> HeapBackend {
        let bytes = chunk::encode(entries.iter().copied());
        let open_panes = entries.iter().any(|(_, s)| s.pane_count > 0);
        HeapBackend::new(
            8,
            KeyedState {
                groups: BTreeMap::from([(kg, KeyGroupData::Encoded { bytes, open_panes })]),
                blobs: BTreeMap::new(),
            },
        )
    }

    #[test]
    fn a_restored_key_group_is_read_by_key_until_many_writes_then_decoded() {
        let entries: Vec<(u64, KeyState)> = (0..1000u64)
            .map(|k| {
                (
                    2 * k,
                    KeyState {
                        total_count: k + 1,
                        ..KeyState::default()
                    },
                )
            })
            .collect();
        let mut h = restored(&entries, 5);
        // A key of the chunk, a new key between two of its keys.
        h.entry(5, 10).unwrap().total_count += 100;
        h.entry(5, 11).unwrap().total_count += 1;
        let KeyGroupData::Layered { delta, .. } = h.group(5) else {
            panic!("not layered: {:?}", h.group(5));
        };
        assert_eq!(delta.len(), 2, "only the written keys are decoded");
        let snap = h.snapshot().unwrap();
        let totals = snap.totals();
        assert_eq!(totals.len(), 1001);
        assert_eq!(totals[&10], (106, 0));
        assert_eq!(totals[&11], (1, 0));
        assert_eq!(totals[&12], (7, 0));
        assert_eq!(snap.groups[&5].len(5).unwrap(), 1001);
        let (bytes, open) = snap.groups[&5].encode().unwrap();
        assert!(!open);
        assert_eq!(
            chunk::decode(5, &bytes).unwrap(),
            snap.groups[&5].entries(5).unwrap()
        );
        // Writes after the snapshot do not change it.
        h.entry(5, 12).unwrap().total_count = 0;
        assert_eq!(snap.totals()[&12], (7, 0));
        // 1000 / 8 written keys: decoded into one map, same contents.
        for k in 0..125u64 {
            h.entry(5, 4 * k).unwrap().total_sum += 1;
        }
        h.entry(5, 1).unwrap();
        assert!(matches!(h.group(5), KeyGroupData::Map(_)));
        let after = h.snapshot().unwrap().totals();
        assert_eq!(after.len(), 1002);
        assert_eq!(after[&12], (0, 1));
        assert_eq!(after[&10], (106, 0));
        assert_eq!(after[&8], (5, 1));
        assert_eq!(after[&6], (4, 0));
    }

    #[test]
    fn an_unordered_restored_chunk_is_refused_on_first_use() {
        let s = KeyState::default();
        let mut h = restored(&[(9, s), (8, s)], 1);
        let err = h.entry(1, 9).unwrap_err().to_string();
        assert!(
            err.contains("key group 1") && err.contains("out of order"),
            "{err}"
        );
    }

    #[test]
    fn open_panes_of_a_layered_key_group_fire_once_in_key_order() {
        let pane = |k: u64| KeyState {
            total_count: 1,
            pane_count: u64::from(k.is_multiple_of(3)),
            pane_sum: k as i64,
            ..KeyState::default()
        };
        let entries: Vec<(u64, KeyState)> = (1..=30u64).map(|k| (k, pane(k))).collect();
        let mut h = restored(&entries, 2);
        // Key 6 (open in the chunk) is written before the window fires, key 7 opens a pane.
        h.entry(2, 6).unwrap().pane_sum += 1000;
        let s = h.entry(2, 7).unwrap();
        s.pane_count = 1;
        s.pane_sum = 7;
        let mut fired = Vec::new();
        h.fire_panes(&mut |k, s| fired.push((k, s.pane_sum)))
            .unwrap();
        assert_eq!(
            fired,
            vec![
                (3, 3),
                (6, 1006),
                (7, 7),
                (9, 9),
                (12, 12),
                (15, 15),
                (18, 18),
                (21, 21),
                (24, 24),
                (27, 27),
                (30, 30)
            ]
        );
        assert!(matches!(h.group(2), KeyGroupData::Layered { .. }));
        let mut again = 0;
        h.fire_panes(&mut |_, _| again += 1).unwrap();
        assert_eq!(again, 0);
        let (_, open) = h.snapshot().unwrap().groups[&2].encode().unwrap();
        assert!(!open, "every pane closed");
    }
}
