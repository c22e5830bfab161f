//! Recent load per key group of one keyed subtask: how much of its input its busiest key group
//! takes (`streamscale_hottest_key_group_share`), and which key groups are its
//! [`TOP_KEY_GROUPS`] busiest with their shares (`streamscale_key_group_share`, labelled with the
//! key group's index), so that the planner sees where a subtask's load lies, not only how large
//! its largest piece is.
//!
//! The subtask counts its records per owned key group (one integer increment per record, on the
//! key group its operator computes for its state anyway, so no second hash) and, at every
//! metrics flush, reads the busiest groups' shares of the counts and then decays them by
//! `0.5^(Δt / HALF_LIFE)`, so the figures follow the last few half-lives (an exponentially
//! weighted count: a record `a` seconds old weighs `0.5^(a / 5 s)`). All work beyond the
//! increment happens at the flush: one pass over the subtask's key groups, keeping the busiest
//! [`TOP_KEY_GROUPS`] by insertion into a list that short (O(range · TOP_KEY_GROUPS) at worst,
//! O(range) in practice), so the exported series stay bounded (at most [`TOP_KEY_GROUPS`] per
//! subtask) even with 32768 key groups.

use std::ops::Range;
use std::time::Duration;

/// Half-life of the decayed counts: a record counts half as much 5 s later.
pub const HALF_LIFE: Duration = Duration::from_secs(5);

/// Key groups per subtask whose share is exported (`streamscale_key_group_share`): the busiest
/// this many of the subtask's range.
pub const TOP_KEY_GROUPS: usize = 8;

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
    /// The busiest key groups at the last flush as (key group, share of the subtask's decayed
    /// count), busiest first (the lower index first on a tie), at most [`TOP_KEY_GROUPS`]
    /// entries, only groups with a positive count.
    top: Vec<(u32, f64)>,
}

impl KeyGroupLoad {
    /// Counts for the subtask that owns key groups `range`.
    pub fn new(range: Range<u32>) -> Self {
        KeyGroupLoad {
            first: range.start,
            fresh: vec![0; range.len()],
            decayed: vec![0.0; range.len()],
            top: Vec::with_capacity(TOP_KEY_GROUPS),
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

    /// The busiest at most `n` key groups with their shares of the decayed counts (including
    /// the records counted since the last flush), busiest first and the lower index first on a
    /// tie, written into `out` (cleared first); only groups with a positive count. The first
    /// entry's share is [`KeyGroupLoad::hottest_share`]. Returns the total count (0 before any
    /// record, and then `out` is empty).
    pub fn top_shares_into(&self, n: usize, out: &mut Vec<(u32, f64)>) -> f64 {
        out.clear();
        let mut sum = 0.0;
        for (g, (&d, &f)) in (self.first..).zip(self.decayed.iter().zip(&self.fresh)) {
            let c = d + f as f64;
            sum += c;
            // Counts for now; turned into shares below. Kept sorted by count, descending; an
            // equal count goes after the earlier (lower) group.
            if c <= 0.0 || n == 0 || (out.len() == n && c <= out[n - 1].1) {
                continue;
            }
            if out.len() == n {
                out.pop();
            }
            let at = out.partition_point(|&(_, x)| x >= c);
            out.insert(at, (g, c));
        }
        if sum > 0.0 {
            for (_, x) in out.iter_mut() {
                *x = (*x / sum).min(1.0);
            }
        } else {
            out.clear();
        }
        sum
    }

    /// The busiest [`TOP_KEY_GROUPS`] key groups with their shares at the last
    /// [`KeyGroupLoad::flush`] (see [`KeyGroupLoad::top_shares_into`]); empty before any record.
    pub fn top(&self) -> &[(u32, f64)] {
        &self.top
    }

    /// [`KeyGroupLoad::hottest_share`], with the busiest [`TOP_KEY_GROUPS`] groups kept for
    /// [`KeyGroupLoad::top`], then decays the counts by the `elapsed` time since the last flush
    /// (`0.5^(elapsed / HALF_LIFE)`).
    pub fn flush(&mut self, elapsed: Duration) -> Option<f64> {
        let mut top = std::mem::take(&mut self.top);
        self.top_shares_into(TOP_KEY_GROUPS, &mut top);
        self.top = top;
        let share = self.top.first().map(|&(_, h)| h);
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

    #[test]
    fn the_busiest_key_groups_are_listed_with_their_index_and_share() {
        // Key groups 10..74 of 128 (a subtask at p=2 would own 0..64; any range works): group
        // 70 takes 40 records, 12 takes 30, 11 and 13 take 10 each (a tie: 11 first), 40 groups
        // 1 record each (20..60).
        let mut load = KeyGroupLoad::new(10..74);
        let mut add = |g: u32, n: u32| (0..n).for_each(|_| load.count(g));
        add(70, 40);
        add(12, 30);
        add(13, 10);
        add(11, 10);
        (20..60).for_each(|g| add(g, 1));
        let total = 40.0 + 30.0 + 10.0 + 10.0 + 40.0;
        let mut top = Vec::new();
        assert_eq!(load.top_shares_into(TOP_KEY_GROUPS, &mut top), total);
        let want = [
            (70, 40.0),
            (12, 30.0),
            (11, 10.0),
            (13, 10.0),
            (20, 1.0),
            (21, 1.0),
            (22, 1.0),
            (23, 1.0),
        ];
        assert_eq!(top.len(), TOP_KEY_GROUPS);
        for (got, (g, c)) in top.iter().zip(want) {
            assert_eq!(got.0, g, "{top:?}");
            assert!((got.1 - c / total).abs() < 1e-12, "{top:?}");
        }
        // The flush publishes the same list and the hottest share is its first entry.
        assert_eq!(load.flush(Duration::from_millis(100)), Some(40.0 / total));
        assert_eq!(load.top(), &top[..]);
        // Fewer loaded groups than the list's length: only those, and n = 2 keeps the two
        // busiest.
        let mut few = KeyGroupLoad::new(0..128);
        few.count(5);
        few.count(5);
        few.count(100);
        few.top_shares_into(TOP_KEY_GROUPS, &mut top);
        assert_eq!(top, vec![(5, 2.0 / 3.0), (100, 1.0 / 3.0)]);
        few.top_shares_into(1, &mut top);
        assert_eq!(top, vec![(5, 2.0 / 3.0)]);
        few.top_shares_into(0, &mut top);
        assert!(top.is_empty());
    }

    #[test]
    fn a_group_that_cools_down_drops_out_of_the_list() {
        // Nine groups, 100 records each: the list holds the first eight by index (ties).
        let mut load = KeyGroupLoad::new(0..32);
        for g in 0..9 {
            (0..100).for_each(|_| load.count(g));
        }
        let _ = load.flush(Duration::from_millis(100));
        let groups = |l: &KeyGroupLoad| l.top().iter().map(|&(g, _)| g).collect::<Vec<_>>();
        assert_eq!(groups(&load), (0..8).collect::<Vec<_>>());
        // Then only group 8 and a new group 20 get records for a minute (12 half-lives): the
        // old groups decay to 100/4096 and leave the first places; 8 and 20 lead.
        for _ in 0..600 {
            load.count(8);
            load.count(20);
            let _ = load.flush(Duration::from_millis(100));
        }
        let g = groups(&load);
        assert_eq!(&g[..2], &[8, 20], "{:?}", load.top());
        let shares: f64 = load.top().iter().map(|&(_, s)| s).sum();
        assert!(shares <= 1.0 + 1e-12);
        assert!(
            load.top()[0].1 > 0.49 && load.top()[1].1 > 0.49,
            "{:?}",
            load.top()
        );
    }

    #[test]
    fn an_empty_subtask_lists_nothing() {
        let mut load = KeyGroupLoad::new(0..64);
        assert_eq!(load.flush(Duration::from_millis(100)), None);
        assert!(load.top().is_empty());
    }
}
