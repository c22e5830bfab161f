//! Recent load per key group of one keyed subtask: how much of its input its busiest key group
//! takes (`streamscale_hottest_key_group_share`).
//!
//! The subtask counts its records per owned key group (one integer increment per record, on the
//! key group its operator computes for its state anyway, so no second hash) and, at every
//! metrics flush, reads the busiest group's share of the counts and then decays them by
//! `0.5^(Δt / HALF_LIFE)`, so the figure follows the last few half-lives (an exponentially
//! weighted count: a record `a` seconds old weighs `0.5^(a / 5 s)`).

use std::ops::Range;
use std::time::Duration;

/// Half-life of the decayed counts: a record counts half as much 5 s later.
pub const HALF_LIFE: Duration = Duration::from_secs(5);

/// Decayed record counts per key group of one keyed subtask's key-group range.
#[derive(Debug, Clone)]
pub struct KeyGroupLoad {
    /// First key group of the subtask's range.
    first: u32,
    /// Records per key group of the range since the last flush (index = key group − `first`):
    /// the per-record work is one integer increment; they join `decayed` at the flush.
    fresh: Vec<u64>,
    /// Decayed records per key group of the range up to the last flush (same index).
    decayed: Vec<f64>,
}

impl KeyGroupLoad {
    /// Counts for the subtask that owns key groups `range`.
    pub fn new(range: Range<u32>) -> Self {
        KeyGroupLoad {
            first: range.start,
            fresh: vec![0; range.len()],
            decayed: vec![0.0; range.len()],
        }
    }

    /// Counts one record of key group `key_group` (the operator's
    /// [`crate::keygroup::key_group`] of the record's key; a key group outside the range, which
    /// routing never sends here, is ignored).
    #[inline]
    pub fn count(&mut self, key_group: u32) {
        if let Some(c) = self
            .fresh
            .get_mut(key_group.wrapping_sub(self.first) as usize)
        {
            *c += 1;
        }
    }

    /// The busiest key group's share of the decayed counts, in (0, 1]; `None` before any
    /// record.
    pub fn hottest_share(&self) -> Option<f64> {
        let (sum, max) =
            self.decayed
                .iter()
                .zip(&self.fresh)
                .fold((0.0, 0.0_f64), |(s, m), (&d, &f)| {
                    let c = d + f as f64;
                    (s + c, m.max(c))
                });
        (sum > 0.0).then(|| (max / sum).min(1.0))
    }

    /// [`KeyGroupLoad::hottest_share`], then decays the counts by the `elapsed` time since the
    /// last flush (`0.5^(elapsed / HALF_LIFE)`).
    pub fn flush(&mut self, elapsed: Duration) -> Option<f64> {
        let share = self.hottest_share();
        if share.is_some() {
            let f = 0.5_f64.powf(elapsed.as_secs_f64() / HALF_LIFE.as_secs_f64());
            for (d, c) in self.decayed.iter_mut().zip(&mut self.fresh) {
                *d = (*d + *c as f64) * f;
                *c = 0;
            }
        }
        share
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keygroup::key_group;

    /// Counts a record of key `k` among 128 key groups.
    fn count_key(load: &mut KeyGroupLoad, k: u64) {
        load.count(key_group(k, 128));
    }

    #[test]
    fn one_key_takes_everything_many_keys_little() {
        let mut one = KeyGroupLoad::new(0..128);
        assert_eq!(one.hottest_share(), None);
        for _ in 0..1000 {
            count_key(&mut one, 7);
        }
        assert_eq!(one.flush(Duration::from_millis(100)), Some(1.0));
        let mut many = KeyGroupLoad::new(0..128);
        for k in 0..100_000 {
            count_key(&mut many, k);
        }
        let h = many.flush(Duration::from_millis(100)).unwrap();
        assert!(h > 1.0 / 128.0 && h < 0.02, "{h}");
    }

    #[test]
    fn counts_decay_with_a_five_second_half_life() {
        let mut load = KeyGroupLoad::new(0..128);
        for _ in 0..1000 {
            count_key(&mut load, 1);
        }
        // 5 s later the old key's 1000 records weigh 500: a new key with 500 ties it.
        let _ = load.flush(HALF_LIFE);
        for _ in 0..500 {
            count_key(&mut load, 2);
        }
        let h = load.hottest_share().unwrap();
        assert!((h - 0.5).abs() < 1e-9, "{h}");
        // Another half-life: 250 each; 250 more records of key 1 (counted since that flush)
        // add to its decayed 250: 500 of 750.
        let _ = load.flush(HALF_LIFE);
        for _ in 0..250 {
            count_key(&mut load, 1);
        }
        let h = load.hottest_share().unwrap();
        assert!((h - 500.0 / 750.0).abs() < 1e-9, "{h}");
    }

    #[test]
    fn only_the_subtask_range_is_counted() {
        let kg = key_group(3, 128);
        let mut load = KeyGroupLoad::new(kg..kg + 1);
        let other = (0..).find(|k| key_group(*k, 128) != kg).unwrap();
        count_key(&mut load, other);
        assert_eq!(load.hottest_share(), None);
        count_key(&mut load, 3);
        assert_eq!(load.hottest_share(), Some(1.0));
    }
}
