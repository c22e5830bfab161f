//! When each open event-time window ended in wall-clock terms, for stamping its results.
//!
//! A sink measures a record's end-to-end latency from its `created_us` (when it arrived at its
//! source). A window result stands for many records; the convention the planner models (and
//! Flink's, where a window result carries the window's end as its timestamp) counts its latency
//! from the window's end. In event time that end is a point of the sources' event-time clock,
//! not of the wall clock, so it is read off the records themselves: the latest source arrival
//! among the records of windows ending there. The sink then measures the upstream delay of the
//! window's last records, the watermark's wait (the out-of-orderness bound and the slowest
//! upstream subtask) and what follows the firing, but not the window's own buffering on
//! purpose (its length). Stamping with the firing time instead left out everything before it.
//!
//! Kept per subtask and not in savepoints: a window restored from a savepoint has no arrival
//! noted for the records it held before and is stamped with its firing time, as before.

use std::collections::BTreeMap;

/// The latest source arrival (`created_us`, µs since the Unix epoch) of the records in the
/// open windows, by window end (ms of event time). A few entries for tumbling and sliding
/// windows (one per open window end), up to one per open session for session windows.
#[derive(Debug, Default)]
pub struct WindowArrivals {
    latest: BTreeMap<u64, u64>,
}

impl WindowArrivals {
    /// Notes a record that arrived at its source at `created_us` in a window ending at `end`.
    /// A record without an arrival time (`created_us` 0) is not noted.
    pub fn note(&mut self, end: u64, created_us: u64) {
        if created_us == 0 {
            return;
        }
        let latest = self.latest.entry(end).or_insert(created_us);
        *latest = (*latest).max(created_us);
    }

    /// The latest arrival noted for windows ending at `end`, if any.
    pub fn latest(&self, end: u64) -> Option<u64> {
        self.latest.get(&end).copied()
    }

    /// The `created_us` to stamp a result of a window ending at `end` with, fired at `now_us`:
    /// the latest arrival noted for it plus `after_us` (a session's gap: its end lies that long
    /// after its last record), never later than `now_us`; `now_us` when nothing was noted
    /// (state restored from a savepoint).
    pub fn stamp(&self, end: u64, after_us: u64, now_us: u64) -> u64 {
        self.latest(end)
            .map_or(now_us, |t| t.saturating_add(after_us).min(now_us))
    }

    /// Forgets the windows ending at or before `end` (the watermark has fired them).
    pub fn forget_through(&mut self, end: u64) {
        match end.checked_add(1) {
            Some(next) => self.latest = self.latest.split_off(&next),
            None => self.latest.clear(),
        }
    }

    /// Number of window ends with a noted arrival.
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    /// Whether no arrival is noted.
    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_stamped_with_its_latest_arrival() {
        let mut a = WindowArrivals::default();
        a.note(10, 5_000);
        a.note(10, 9_000);
        a.note(10, 7_000);
        a.note(20, 12_000);
        a.note(20, 0);
        assert_eq!(a.stamp(10, 0, 100_000), 9_000);
        assert_eq!(a.stamp(20, 0, 100_000), 12_000);
        // A session's end lies a gap after its last record, and never after the firing.
        assert_eq!(a.stamp(20, 3_000, 100_000), 15_000);
        assert_eq!(a.stamp(20, 500_000, 100_000), 100_000);
        // Nothing noted (restored state): the firing time.
        assert_eq!(a.stamp(30, 0, 100_000), 100_000);
    }

    #[test]
    fn fired_windows_are_forgotten() {
        let mut a = WindowArrivals::default();
        for end in [10, 20, 30] {
            a.note(end, end * 1_000);
        }
        a.forget_through(20);
        assert_eq!(a.len(), 1);
        assert_eq!(a.latest(20), None);
        assert_eq!(a.latest(30), Some(30_000));
        a.forget_through(u64::MAX);
        assert!(a.is_empty());
    }
}
