//! When each open event-time window ended in wall-clock terms, for stamping its results.
//!
//! A sink measures a record's end-to-end latency from its `created_us` (when it arrived at its
//! source). A window result stands for many records; the convention the planner models (and
//! Flink's, where a window result carries the window's end as its timestamp) counts its latency
//! from the window's end. In event time that end is a point of the sources' event-time clock,
//! not of the wall clock, so it is read off the records themselves: the window ended, in wall
//! time, when the last record before its end arrived, i.e. the latest source arrival among the
//! records with an event time before the end (at this subtask). The sink then measures the
//! upstream delay of those last records, the watermark's wait (the out-of-orderness bound and
//! the slowest upstream subtask) and what follows the firing, but not the window's own
//! buffering on purpose (its length). Stamping with the firing time left out everything before it.
//!
//! Kept per subtask and not in savepoints: after a restore only the records since then count,
//! and a window none of them came before is stamped with its firing time, as before.

/// The latest source arrival (`created_us`, µs since the Unix epoch) of a subtask's records,
/// by the first window end after their event time (ms): one entry per window boundary not yet
/// passed by the watermark (a few: size / slide for sliding windows, plus what the
/// out-of-orderness keeps open; for session windows, whose ends differ per key, every 1/64
/// of the gap), sorted, plus the latest arrival of the boundaries already
/// passed. A record in event-time order finds its boundary in the last entry or two, so noting
/// costs a few comparisons per record, whatever the number of windows a record falls into.
#[derive(Debug, Default)]
pub struct WindowArrivals {
    /// (boundary, latest arrival of the records just before it), ascending by boundary.
    latest: Vec<(u64, u64)>,
    /// The latest arrival among the boundaries forgotten (already fired); 0 when none.
    passed: u64,
}

impl WindowArrivals {
    /// Notes a record that arrived at its source at `created_us` whose event time lies before
    /// `boundary`, the end of the earliest window it falls into (still open). A record without
    /// an arrival time (`created_us` 0) is not noted.
    pub fn note(&mut self, boundary: u64, created_us: u64) {
        if created_us == 0 {
            return;
        }
        match self.latest.iter().rposition(|e| e.0 <= boundary) {
            Some(i) if self.latest[i].0 == boundary => {
                self.latest[i].1 = self.latest[i].1.max(created_us);
            }
            Some(i) => self.latest.insert(i + 1, (boundary, created_us)),
            None => self.latest.insert(0, (boundary, created_us)),
        }
    }

    /// The latest arrival of the records noted with a boundary at or before `end`, forgotten
    /// ones included; `None` when there is none.
    pub fn latest_before(&self, end: u64) -> Option<u64> {
        let open = self
            .latest
            .iter()
            .take_while(|e| e.0 <= end)
            .map(|e| e.1)
            .max()
            .unwrap_or(0);
        Some(open.max(self.passed)).filter(|&t| t > 0)
    }

    /// The `created_us` to stamp a result of a window ending at `end` with, fired at `now_us`:
    /// [`WindowArrivals::latest_before`] `end`, never later than `now_us`; `now_us` when
    /// nothing was noted (state restored from a savepoint).
    pub fn stamp(&self, end: u64, now_us: u64) -> u64 {
        self.latest_before(end).map_or(now_us, |t| t.min(now_us))
    }

    /// Forgets the boundaries at or before `end` (the watermark has passed them), keeping
    /// their latest arrival for the windows still open.
    pub fn forget_through(&mut self, end: u64) {
        let fired = self.latest.partition_point(|e| e.0 <= end);
        for (_, t) in self.latest.drain(..fired) {
            self.passed = self.passed.max(t);
        }
    }

    /// Number of boundaries not yet forgotten.
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    /// Whether no boundary is open.
    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_ends_when_the_last_record_before_its_end_arrived() {
        let mut a = WindowArrivals::default();
        a.note(10, 5_000);
        a.note(10, 9_000);
        a.note(10, 7_000);
        a.note(20, 12_000);
        a.note(20, 0);
        // Out of order: an earlier boundary noted last goes before the later one.
        a.note(5, 4_000);
        assert_eq!(a.latest, vec![(5, 4_000), (10, 9_000), (20, 12_000)]);
        assert_eq!(a.stamp(5, 100_000), 4_000);
        assert_eq!(a.stamp(10, 100_000), 9_000);
        assert_eq!(a.stamp(20, 100_000), 12_000);
        // A window ending between boundaries (sliding: every boundary is an end) or after
        // them all: the records before it.
        assert_eq!(a.stamp(15, 100_000), 9_000);
        assert_eq!(a.stamp(30, 100_000), 12_000);
        assert_eq!(a.stamp(20, 11_000), 11_000, "never after the firing");
        // A late record (earlier event time) arriving last counts for the later windows too.
        a.note(5, 15_000);
        assert_eq!(a.stamp(20, 100_000), 15_000);
        // Nothing noted before the end (restored state): the firing time.
        assert_eq!(a.stamp(4, 100_000), 100_000);
    }

    #[test]
    fn fired_boundaries_are_forgotten_but_still_count() {
        let mut a = WindowArrivals::default();
        for end in [10, 20, 30] {
            a.note(end, 40_000 - end * 1_000);
        }
        a.forget_through(20);
        assert_eq!(a.len(), 1);
        // The records before 10 arrived last (30 000): still the window [20, 30)'s end.
        assert_eq!(a.stamp(30, 100_000), 30_000);
        a.forget_through(u64::MAX);
        assert!(a.is_empty());
        assert_eq!(a.stamp(40, 100_000), 30_000);
    }
}
