//! Recent load per key group of one keyed subtask: how much of its input its busiest key group
//! takes (`streamscale_hottest_key_group_share`).
//!
//! The subtask counts its records per owned key group (one array increment per record) and, at
//! every metrics flush, reads the busiest group's share of the counts and then decays them by
//! `0.5^(Δt / HALF_LIFE)`, so the figure follows the last few half-lives (an exponentially
//! weighted count: a record `a` seconds old weighs `0.5^(a / 5 s)`).

use std::ops::Range;
use std::time::Duration;

use crate::keygroup::key_group;

/// Half-life of the decayed counts: a record counts half as much 5 s later.
pub const HALF_LIFE: Duration = Duration::from_secs(5);

/// Decayed record counts per key group of one keyed subtask's key-group range.
#[derive(Debug, Clone)]
pub struct KeyGroupLoad<R> {
    /// The key that picks a record's key group (the same selector the upstream routing uses).
    key_of: fn(&R) -> u64,
    max_parallelism: u32,
    /// First key group of the subtask's range.
    first: u32,
    /// Decayed records per key group of the range (index = key group − `first`).
    counts: Vec<f64>,
}

impl<R> KeyGroupLoad<R> {
    /// Counts for the subtask that owns key groups `range` of `max_parallelism`, keying records
    /// with `key_of`.
    pub fn new(key_of: fn(&R) -> u64, range: Range<u32>, max_parallelism: u32) -> Self {
        KeyGroupLoad {
            key_of,
            max_parallelism,
            first: range.start,
            counts: vec![0.0; range.len()],
        }
    }

    /// Counts one record (a record of a key group outside the range, which routing never
    /// sends here, is ignored).
    #[inline]
    pub fn count(&mut self, rec: &R) {
        let kg = key_group((self.key_of)(rec), self.max_parallelism);
        if let Some(c) = self.counts.get_mut(kg.wrapping_sub(self.first) as usize) {
            *c += 1.0;
        }
    }

    /// The busiest key group's share of the decayed counts, in (0, 1]; `None` before any
    /// record.
    pub fn hottest_share(&self) -> Option<f64> {
        let (sum, max) = self
            .counts
            .iter()
            .fold((0.0, 0.0_f64), |(s, m), &c| (s + c, m.max(c)));
        (sum > 0.0).then(|| (max / sum).min(1.0))
    }

    /// [`KeyGroupLoad::hottest_share`], then decays the counts by the `elapsed` time since the
    /// last flush (`0.5^(elapsed / HALF_LIFE)`).
    pub fn flush(&mut self, elapsed: Duration) -> Option<f64> {
        let share = self.hottest_share();
        if share.is_some() {
            let f = 0.5_f64.powf(elapsed.as_secs_f64() / HALF_LIFE.as_secs_f64());
            for c in &mut self.counts {
                *c *= f;
            }
        }
        share
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &u64) -> u64 {
        *k
    }

    #[test]
    fn one_key_takes_everything_many_keys_little() {
        let mut one = KeyGroupLoad::new(key, 0..128, 128);
        assert_eq!(one.hottest_share(), None);
        for _ in 0..1000 {
            one.count(&7);
        }
        assert_eq!(one.flush(Duration::from_millis(100)), Some(1.0));
        let mut many = KeyGroupLoad::new(key, 0..128, 128);
        for k in 0..100_000 {
            many.count(&k);
        }
        let h = many.flush(Duration::from_millis(100)).unwrap();
        assert!(h > 1.0 / 128.0 && h < 0.02, "{h}");
    }

    #[test]
    fn counts_decay_with_a_five_second_half_life() {
        let mut load = KeyGroupLoad::new(key, 0..128, 128);
        for _ in 0..1000 {
            load.count(&1);
        }
        // 5 s later the old key's 1000 records weigh 500: a new key with 500 ties it.
        let _ = load.flush(HALF_LIFE);
        for _ in 0..500 {
            load.count(&2);
        }
        let h = load.hottest_share().unwrap();
        assert!((h - 0.5).abs() < 1e-9, "{h}");
    }

    #[test]
    fn only_the_subtask_range_is_counted() {
        let kg = key_group(3, 128);
        let mut load = KeyGroupLoad::new(key, kg..kg + 1, 128);
        let other = (0..).find(|k| key_group(*k, 128) != kg).unwrap();
        load.count(&other);
        assert_eq!(load.hottest_share(), None);
        load.count(&3);
        assert_eq!(load.hottest_share(), Some(1.0));
    }
}
