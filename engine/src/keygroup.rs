//! Key groups: the unit of keyed state and of its redistribution on rescale (Flink's scheme).
//!
//! A key belongs to key group `hash(key) mod maxParallelism`; subtask `i` of an operator with
//! parallelism `p` owns the contiguous key-group range `[ceil(i·K/p), ceil((i+1)·K/p))`
//! where `K` is the number of key groups, so rescaling moves whole key groups and each
//! subtask loads only the ranges it now owns.

pub mod load;

use std::ops::Range;

/// 64-bit finalizer of MurmurHash3 (fmix64): a fast, well-mixed, deterministic hash of a key.
pub fn murmur_fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// Key group of `key` among `max_parallelism` key groups.
pub fn key_group(key: u64, max_parallelism: u32) -> u32 {
    (murmur_fmix64(key) % u64::from(max_parallelism.max(1))) as u32
}

/// Subtask index (0-based) that owns `key_group` at `parallelism` (Flink's
/// `computeOperatorIndexForKeyGroup`: `kg · p / K`).
pub fn subtask_for_key_group(key_group: u32, parallelism: u32, max_parallelism: u32) -> usize {
    (u64::from(key_group) * u64::from(parallelism) / u64::from(max_parallelism.max(1))) as usize
}

/// Key groups owned by subtask `index` at `parallelism` (Flink's
/// `computeKeyGroupRangeForOperatorIndex`).
pub fn key_group_range(index: u32, parallelism: u32, max_parallelism: u32) -> Range<u32> {
    let k = u64::from(max_parallelism);
    let p = u64::from(parallelism.max(1));
    let i = u64::from(index);
    let start = (i * k).div_ceil(p);
    let end = ((i + 1) * k).div_ceil(p);
    start as u32..end as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ranges_partition_key_groups_and_agree_with_routing(k in 1u32..512, p_seed in 1u32..512) {
            let p = 1 + p_seed % k;
            let mut next = 0;
            for i in 0..p {
                let r = key_group_range(i, p, k);
                prop_assert_eq!(r.start, next);
                prop_assert!(!r.is_empty());
                for kg in r.clone() {
                    prop_assert_eq!(subtask_for_key_group(kg, p, k), i as usize);
                }
                next = r.end;
            }
            prop_assert_eq!(next, k);
        }
    }

    #[test]
    fn keys_spread_over_key_groups() {
        let mut counts = [0u32; 8];
        for key in 0..8000u64 {
            counts[key_group(key, 8) as usize] += 1;
        }
        assert!(counts.iter().all(|c| (800..1200).contains(c)), "{counts:?}");
    }
}
