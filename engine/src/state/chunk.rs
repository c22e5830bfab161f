//! The encoded form of one key group of [`KeyState`]s, as stored in checkpoints and
//! savepoints: entries in key order, each [`ENTRY_BYTES`] bytes, all fields little-endian:
//! `key u64, total_count u64, total_sum i64, pane_count u64, pane_sum i64,
//! pane_max_delay_us u64, pane_min i64, pane_max i64, flags u64` (flags bit 0:
//! [`KeyState::pane_extrema_partial`]).
//!
//! Savepoint format version 2 wrote [`LEGACY_ENTRY_BYTES`]-byte entries (the first six
//! fields); [`migrate_legacy`] turns such a chunk into this form.
//!
//! Fixed width rather than varints: encoding and decoding are plain copies (a few ns per
//! key), which keeps stop-with-savepoint and restore fast; checkpoint bytes are per key
//! exactly [`ENTRY_BYTES`].

use bytes::Bytes;

use super::{KeyState, StateError};

/// Bytes per key in a key-group chunk.
pub const ENTRY_BYTES: usize = 72;
/// Bytes of the value part (everything but the key) of an entry.
pub const VALUE_BYTES: usize = 64;
/// Bytes per key in a key-group chunk of savepoint format version 2 (no pane extrema).
pub const LEGACY_ENTRY_BYTES: usize = 48;

/// Encodes a key's state without the key (the disk backend's stored value).
pub fn encode_value(s: &KeyState) -> [u8; VALUE_BYTES] {
    let mut out = [0u8; VALUE_BYTES];
    out[0..8].copy_from_slice(&s.total_count.to_le_bytes());
    out[8..16].copy_from_slice(&s.total_sum.to_le_bytes());
    out[16..24].copy_from_slice(&s.pane_count.to_le_bytes());
    out[24..32].copy_from_slice(&s.pane_sum.to_le_bytes());
    out[32..40].copy_from_slice(&s.pane_max_delay_us.to_le_bytes());
    out[40..48].copy_from_slice(&s.pane_min.to_le_bytes());
    out[48..56].copy_from_slice(&s.pane_max.to_le_bytes());
    out[56..64].copy_from_slice(&u64::from(s.pane_extrema_partial).to_le_bytes());
    out
}

fn word(b: &[u8], at: usize) -> [u8; 8] {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    w
}

/// Decodes a value written by [`encode_value`] (`b` must be [`VALUE_BYTES`] long).
pub fn decode_value(b: &[u8; VALUE_BYTES]) -> KeyState {
    decode_slice(b)
}

/// Encodes entries (in key order) into a chunk.
pub fn encode(entries: impl ExactSizeIterator<Item = (u64, KeyState)>) -> Bytes {
    let mut out = Vec::new();
    encode_into(&mut out, entries);
    Bytes::from(out)
}

/// Appends entries (in key order) in chunk form to `out` (reserving their size first), so
/// that a checkpoint writer can reuse one buffer for many key groups.
pub fn encode_into(out: &mut Vec<u8>, entries: impl ExactSizeIterator<Item = (u64, KeyState)>) {
    out.reserve(entries.len() * ENTRY_BYTES);
    for (k, s) in entries {
        out.extend_from_slice(&k.to_le_bytes());
        out.extend_from_slice(&encode_value(&s));
    }
}

/// Decodes a chunk of key group `key_group`.
///
/// # Errors
/// [`StateError::Decode`] when the length is not a multiple of [`ENTRY_BYTES`] or keys are
/// not strictly increasing.
pub fn decode(key_group: u32, bytes: &[u8]) -> Result<Vec<(u64, KeyState)>, StateError> {
    let mut out = Vec::with_capacity(bytes.len() / ENTRY_BYTES);
    for_each_entry(key_group, bytes, |key, value| {
        let mut v = [0u8; VALUE_BYTES];
        v.copy_from_slice(value);
        out.push((key, decode_value(&v)));
    })?;
    Ok(out)
}

/// Calls `f(key, encoded value)` for every entry of a chunk of key group `key_group`, in
/// order, after checking that the chunk is a whole number of entries and failing at the first
/// key that is not greater than the one before.
fn for_each_entry(
    key_group: u32,
    bytes: &[u8],
    mut f: impl FnMut(u64, &[u8]),
) -> Result<(), StateError> {
    if !bytes.len().is_multiple_of(ENTRY_BYTES) {
        return Err(StateError::Decode {
            key_group,
            reason: format!(
                "{} bytes is not a whole number of {ENTRY_BYTES}-byte entries",
                bytes.len()
            ),
        });
    }
    let mut last: Option<u64> = None;
    for e in bytes.chunks_exact(ENTRY_BYTES) {
        let key = u64::from_le_bytes(word(e, 0));
        if last.is_some_and(|l| l >= key) {
            return Err(StateError::Decode {
                key_group,
                reason: format!("keys out of order at key {key}"),
            });
        }
        last = Some(key);
        f(key, &e[8..]);
    }
    Ok(())
}

/// The key of entry `i` of a chunk (`bytes` must hold more than `i` entries).
fn key_at(bytes: &[u8], i: usize) -> u64 {
    entry_key(bytes, i * ENTRY_BYTES)
}

/// The key of the entry starting at byte `at` of a chunk (`at + 8 <= bytes.len()`).
pub fn entry_key(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(word(bytes, at))
}

/// Decodes a value from a slice of at least [`VALUE_BYTES`] bytes (as [`decode_value`]).
pub fn decode_slice(v: &[u8]) -> KeyState {
    KeyState {
        total_count: u64::from_le_bytes(word(v, 0)),
        total_sum: i64::from_le_bytes(word(v, 8)),
        pane_count: u64::from_le_bytes(word(v, 16)),
        pane_sum: i64::from_le_bytes(word(v, 24)),
        pane_max_delay_us: u64::from_le_bytes(word(v, 32)),
        pane_min: i64::from_le_bytes(word(v, 40)),
        pane_max: i64::from_le_bytes(word(v, 48)),
        pane_extrema_partial: u64::from_le_bytes(word(v, 56)) & 1 == 1,
    }
}

/// Migrates a chunk of key group `key_group` written by savepoint format version 2
/// ([`LEGACY_ENTRY_BYTES`]-byte entries) to this version's form: each key keeps its totals and
/// open pane, whose extrema are marked unknown ([`crate::state::LegacyKeyState`]). Returns the
/// chunk and whether some key has an open pane.
///
/// # Errors
/// [`StateError::Decode`] when the length is not a whole number of legacy entries or keys are
/// not strictly increasing.
pub fn migrate_legacy(key_group: u32, bytes: &[u8]) -> Result<(Bytes, bool), StateError> {
    if !bytes.len().is_multiple_of(LEGACY_ENTRY_BYTES) {
        return Err(StateError::Decode {
            key_group,
            reason: format!(
                "{} bytes is not a whole number of {LEGACY_ENTRY_BYTES}-byte entries (format version 2)",
                bytes.len()
            ),
        });
    }
    let n = bytes.len() / LEGACY_ENTRY_BYTES;
    let mut out = Vec::with_capacity(n * ENTRY_BYTES);
    let mut last: Option<u64> = None;
    let mut open = false;
    for e in bytes.chunks_exact(LEGACY_ENTRY_BYTES) {
        let key = u64::from_le_bytes(word(e, 0));
        if last.is_some_and(|l| l >= key) {
            return Err(StateError::Decode {
                key_group,
                reason: format!("keys out of order at key {key}"),
            });
        }
        last = Some(key);
        let legacy = crate::state::LegacyKeyState {
            total_count: u64::from_le_bytes(word(e, 8)),
            total_sum: i64::from_le_bytes(word(e, 16)),
            pane_count: u64::from_le_bytes(word(e, 24)),
            pane_sum: i64::from_le_bytes(word(e, 32)),
            pane_max_delay_us: u64::from_le_bytes(word(e, 40)),
        };
        open |= legacy.pane_count > 0;
        out.extend_from_slice(&key.to_le_bytes());
        out.extend_from_slice(&encode_value(&KeyState::from(legacy)));
    }
    Ok((Bytes::from(out), open))
}

/// The state of `key` in a chunk whose keys are strictly increasing (as checked by
/// [`check`]), found by binary search: O(log n) reads of the encoded bytes, nothing decoded
/// but the one entry.
pub fn find(bytes: &[u8], key: u64) -> Option<KeyState> {
    let n = bytes.len() / ENTRY_BYTES;
    let (mut lo, mut hi) = (0usize, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match key_at(bytes, mid).cmp(&key) {
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
            std::cmp::Ordering::Equal => {
                return Some(decode_slice(&bytes[mid * ENTRY_BYTES + 8..]));
            }
        }
    }
    None
}

/// Whether the encoded value `v` (a [`VALUE_BYTES`]-long slice) has an open window pane.
pub fn value_has_open_pane(v: &[u8]) -> bool {
    v[16..24] != [0u8; 8]
}

/// Checks a chunk of key group `key_group` without decoding it: a whole number of entries,
/// keys strictly increasing. Returns whether some key has an open window pane.
///
/// # Errors
/// [`StateError::Decode`] as [`decode`].
pub fn check(key_group: u32, bytes: &[u8]) -> Result<bool, StateError> {
    let mut open = false;
    for_each_entry(key_group, bytes, |_, value| {
        open |= value_has_open_pane(value)
    })?;
    Ok(open)
}

/// Calls `f(key, value)` for every entry of a chunk, in chunk order.
pub fn for_each(bytes: &[u8], mut f: impl FnMut(u64, &[u8])) {
    for e in bytes.chunks_exact(ENTRY_BYTES) {
        f(u64::from_le_bytes(word(e, 0)), &e[8..]);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trips(keys in proptest::collection::btree_set(any::<u64>(), 0..50), v in any::<(u64, i64, u64, i64, u64)>(), e in any::<(i64, i64, bool)>()) {
            let entries: Vec<(u64, KeyState)> = keys.iter().map(|k| (*k, KeyState {
                total_count: v.0 ^ k, total_sum: v.1, pane_count: v.2, pane_sum: v.3, pane_max_delay_us: v.4,
                pane_min: e.0, pane_max: e.1, pane_extrema_partial: e.2,
            })).collect();
            let bytes = encode(entries.clone().into_iter());
            prop_assert_eq!(bytes.len(), entries.len() * ENTRY_BYTES);
            prop_assert_eq!(decode(3, &bytes).unwrap(), entries);
        }
    }

    #[test]
    fn refuses_truncated_and_unordered_chunks() {
        let s = KeyState::default();
        let bytes = encode([(2u64, s), (1u64, s)].into_iter());
        let err = decode(7, &bytes).unwrap_err().to_string();
        assert!(
            err.contains("key group 7") && err.contains("out of order"),
            "{err}"
        );
        let err = decode(7, &bytes[..50]).unwrap_err().to_string();
        assert!(err.contains("50 bytes"), "{err}");
        let err = check(7, &bytes).unwrap_err().to_string();
        assert!(err.contains("out of order"), "{err}");
        assert!(check(7, &bytes[..50]).is_err());
    }

    proptest! {
        #[test]
        fn finds_every_key_and_no_other(keys in proptest::collection::btree_set(0u64..1000, 0..60), probe in 0u64..1000) {
            let entries: Vec<(u64, KeyState)> = keys.iter().map(|k| (*k, KeyState {
                total_count: k + 1, pane_count: k % 3, ..KeyState::default()
            })).collect();
            let bytes = encode(entries.clone().into_iter());
            prop_assert_eq!(check(1, &bytes).unwrap(), entries.iter().any(|(_, s)| s.pane_count > 0));
            for (k, s) in &entries {
                prop_assert_eq!(find(&bytes, *k), Some(*s));
            }
            prop_assert_eq!(find(&bytes, probe), entries.iter().find(|(k, _)| *k == probe).map(|(_, s)| *s));
        }
    }

    /// A chunk in the 48-byte form of savepoint format version 2, as that version encoded it.
    fn legacy_chunk(entries: &[(u64, [u64; 5])]) -> Vec<u8> {
        let mut out = Vec::new();
        for (k, words) in entries {
            out.extend_from_slice(&k.to_le_bytes());
            for w in words {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        out
    }

    #[test]
    fn version_2_chunks_migrate_with_open_panes_marked_partial() {
        let sum = (-5i64) as u64;
        let bytes = legacy_chunk(&[(3, [10, 40, 0, 0, 0]), (9, [7, sum, 2, sum, 1500])]);
        assert_eq!(bytes.len(), 2 * LEGACY_ENTRY_BYTES);
        let (migrated, open) = migrate_legacy(4, &bytes).unwrap();
        assert!(open);
        assert!(check(4, &migrated).unwrap());
        let got = decode(4, &migrated).unwrap();
        assert_eq!(
            got,
            vec![
                (
                    3,
                    KeyState {
                        total_count: 10,
                        total_sum: 40,
                        ..KeyState::default()
                    }
                ),
                (
                    9,
                    KeyState {
                        total_count: 7,
                        total_sum: -5,
                        pane_count: 2,
                        pane_sum: -5,
                        pane_max_delay_us: 1500,
                        pane_extrema_partial: true,
                        ..KeyState::default()
                    }
                ),
            ]
        );
        assert_eq!(
            got[1].1.pane_extrema(),
            None,
            "unknown extrema are not made up"
        );
        let err = migrate_legacy(4, &bytes[..50]).unwrap_err().to_string();
        assert!(
            err.contains("key group 4") && err.contains("50 bytes"),
            "{err}"
        );
        let unordered = legacy_chunk(&[(9, [0; 5]), (3, [0; 5])]);
        let err = migrate_legacy(4, &unordered).unwrap_err().to_string();
        assert!(err.contains("out of order"), "{err}");
    }

    #[test]
    fn a_pane_tracks_min_and_max_until_it_closes() {
        let mut s = KeyState::default();
        for v in [5, -3, 12, 0] {
            s.add(1, v, 0);
        }
        assert_eq!(s.pane_extrema(), Some((-3, 12)));
        assert_eq!((s.pane_count, s.pane_sum), (4, 14));
        s.close_pane();
        assert_eq!(s.pane_extrema(), None);
        s.add(1, 100, 0);
        assert_eq!(
            s.pane_extrema(),
            Some((100, 100)),
            "a new pane starts from its first value"
        );
        assert_eq!((s.total_count, s.total_sum), (5, 114));
        // A pane migrated from format version 2 stays partial until it closes.
        let mut m = KeyState::from(crate::state::LegacyKeyState {
            pane_count: 2,
            pane_sum: 9,
            ..Default::default()
        });
        m.add(1, 4, 0);
        assert_eq!((m.pane_count, m.pane_sum, m.pane_extrema()), (3, 13, None));
        m.close_pane();
        m.add(1, 4, 0);
        assert_eq!(m.pane_extrema(), Some((4, 4)));
    }
}
