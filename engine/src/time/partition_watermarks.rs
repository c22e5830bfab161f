//! The watermark of a Kafka source subtask from its partitions' Kafka timestamps, as Flink's
//! `KafkaSource` with `WatermarkStrategy.forBoundedOutOfOrderness(bound).withIdleness(timeout)`
//! computes it: each assigned partition's watermark is the largest timestamp read from it
//! minus the bound minus 1 ms; the subtask's is the minimum over its partitions. A partition
//! that has had no record for the idle timeout does not hold that minimum back (until its next
//! record); a subtask all of whose partitions are idle, or that owns none, is idle itself and
//! says so downstream ([`crate::time::watermark::WatermarkTracker::idle`]).
//!
//! Nothing here is checkpointed (neither is it in Flink): after a restore, at any parallelism,
//! a subtask starts from the partitions it now owns and their first records, so no watermark of
//! a partition it no longer owns lingers. Pure logic: times are passed in (ms).

use std::collections::BTreeMap;

/// What a subtask sends downstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatermarkUpdate {
    /// Its watermark (ms since the Unix epoch) advanced to this, or it is active again.
    Watermark(u64),
    /// Every partition it owns is idle (or it owns none): exclude it from the minimum.
    Idle,
}

#[derive(Debug, Clone, Copy)]
struct Partition {
    /// Largest Kafka timestamp read (ms), `None` before the first record with one.
    max_ts: Option<u64>,
    /// When it was assigned or last had a record (ms, the caller's clock).
    active_at: u64,
}

/// Per-partition watermarks of one source subtask.
#[derive(Debug, Clone)]
pub struct PartitionWatermarks {
    bound_ms: u64,
    idle_timeout_ms: Option<u64>,
    partitions: BTreeMap<i32, Partition>,
    /// The last watermark sent (watermarks never go back).
    sent: Option<u64>,
    /// Whether the last update sent was [`WatermarkUpdate::Idle`].
    idle_sent: bool,
}

impl PartitionWatermarks {
    /// Watermarks trailing the largest timestamp by `bound_ms` + 1 ms; partitions without a
    /// record for `idle_timeout_ms` are idle (`None`: never).
    pub fn new(bound_ms: u64, idle_timeout_ms: Option<u64>) -> PartitionWatermarks {
        PartitionWatermarks {
            bound_ms,
            idle_timeout_ms,
            partitions: BTreeMap::new(),
            sent: None,
            idle_sent: false,
        }
    }

    /// Partition `p` is now read by this subtask (at `now_ms`); it holds the watermark back
    /// until its first record, or until it has been idle for the timeout.
    pub fn assign(&mut self, p: i32, now_ms: u64) {
        self.partitions.entry(p).or_insert(Partition {
            max_ts: None,
            active_at: now_ms,
        });
    }

    /// A record of partition `p` with Kafka timestamp `ts_ms` was read at `now_ms`.
    pub fn on_record(&mut self, p: i32, ts_ms: u64, now_ms: u64) {
        let part = self.partitions.entry(p).or_insert(Partition {
            max_ts: None,
            active_at: now_ms,
        });
        part.max_ts = Some(part.max_ts.map_or(ts_ms, |m| m.max(ts_ms)));
        part.active_at = now_ms;
    }

    fn idle(&self, part: &Partition, now_ms: u64) -> bool {
        self.idle_timeout_ms
            .is_some_and(|t| now_ms.saturating_sub(part.active_at) >= t)
    }

    /// The subtask's current watermark: `Ok(Some(ms))`, `Ok(None)` while an active partition
    /// has no record yet (or has one earlier than the bound), `Err(())` when it is idle.
    fn current(&self, now_ms: u64) -> Result<Option<u64>, ()> {
        let mut min: Option<u64> = None;
        let mut active = 0;
        for part in self.partitions.values() {
            if self.idle(part, now_ms) {
                continue;
            }
            active += 1;
            let Some(wm) = part
                .max_ts
                .and_then(|t| t.checked_sub(self.bound_ms.saturating_add(1)))
            else {
                return Ok(None);
            };
            min = Some(min.map_or(wm, |m| m.min(wm)));
        }
        if active == 0 { Err(()) } else { Ok(min) }
    }

    /// What to send downstream at `now_ms`, if anything changed since the last update: a
    /// watermark that advanced, the subtask becoming idle, or (after idling) its return with
    /// its watermark (never lower than one sent before).
    pub fn poll(&mut self, now_ms: u64) -> Option<WatermarkUpdate> {
        match self.current(now_ms) {
            Err(()) => {
                if self.idle_sent {
                    return None;
                }
                self.idle_sent = true;
                Some(WatermarkUpdate::Idle)
            }
            Ok(wm) => {
                let wm = match (wm, self.sent) {
                    (Some(w), Some(s)) => Some(w.max(s)),
                    (w, s) => w.or(s).filter(|_| self.idle_sent || w.is_some()),
                };
                let wm = wm?;
                if !self.idle_sent && self.sent.is_some_and(|s| s >= wm) {
                    return None;
                }
                self.idle_sent = false;
                self.sent = Some(wm);
                Some(WatermarkUpdate::Watermark(wm))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WatermarkUpdate::{Idle, Watermark};

    #[test]
    fn the_watermark_is_the_minimum_over_out_of_order_partitions() {
        let mut w = PartitionWatermarks::new(10, None);
        w.assign(0, 0);
        w.assign(1, 0);
        w.on_record(0, 1_000, 1);
        assert_eq!(w.poll(1), None, "partition 1 has no record yet");
        w.on_record(1, 500, 2);
        assert_eq!(w.poll(2), Some(Watermark(489)));
        // Out of order within a partition: an earlier timestamp changes nothing.
        w.on_record(1, 300, 3);
        assert_eq!(w.poll(3), None);
        w.on_record(1, 2_000, 4);
        assert_eq!(
            w.poll(4),
            Some(Watermark(989)),
            "now partition 0 is the slowest"
        );
        w.on_record(0, 1_500, 5);
        assert_eq!(w.poll(5), Some(Watermark(1_489)));
        assert_eq!(w.poll(6), None, "an unchanged watermark is not resent");
    }

    #[test]
    fn an_idle_partition_does_not_hold_the_watermark_back_until_it_has_records_again() {
        let mut w = PartitionWatermarks::new(0, Some(100));
        w.assign(0, 0);
        w.assign(1, 0);
        w.on_record(0, 5_000, 10);
        assert_eq!(w.poll(50), None, "partition 1 not idle yet");
        assert_eq!(
            w.poll(100),
            Some(Watermark(4_999)),
            "partition 1 idle since 0"
        );
        w.on_record(0, 6_000, 150);
        assert_eq!(w.poll(150), Some(Watermark(5_999)));
        // Partition 1 comes back behind: the minimum includes it again, never going back.
        w.on_record(1, 5_500, 160);
        assert_eq!(w.poll(160), None);
        w.on_record(1, 7_000, 170);
        assert_eq!(
            w.poll(170),
            None,
            "partition 0 (5 999) is the minimum again"
        );
        w.on_record(0, 8_000, 180);
        assert_eq!(w.poll(180), Some(Watermark(6_999)));
        // Both idle: the subtask is idle, said once; a record makes it active again.
        assert_eq!(w.poll(300), Some(Idle));
        assert_eq!(w.poll(400), None);
        w.on_record(0, 9_000, 500);
        assert_eq!(w.poll(500), Some(Watermark(8_999)));
    }

    #[test]
    fn a_subtask_without_partitions_is_idle_and_returns_with_its_last_watermark() {
        let mut w = PartitionWatermarks::new(0, None);
        assert_eq!(w.poll(0), Some(Idle), "owns no partition");
        w.assign(3, 10);
        assert_eq!(w.poll(10), None, "its new partition has no record yet");
        w.on_record(3, 1_000, 11);
        assert_eq!(w.poll(11), Some(Watermark(999)));
    }

    #[test]
    fn after_a_restore_at_other_parallelism_no_stale_watermark_remains() {
        // Before: subtask 0 of 2 read partitions 0 and 2, far ahead in event time.
        let mut before = PartitionWatermarks::new(0, None);
        for p in [0, 2] {
            before.assign(p, 0);
            before.on_record(p, 90_000, 1);
        }
        assert_eq!(before.poll(1), Some(Watermark(89_999)));
        // After a restore at parallelism 3 it reads partition 1 only (its old partitions went
        // to other subtasks): watermarks are not restored, so partition 1's own records decide.
        let mut after = PartitionWatermarks::new(0, None);
        after.assign(1, 2);
        assert_eq!(
            after.poll(2),
            None,
            "nothing from the old partitions holds it up"
        );
        after.on_record(1, 1_000, 3);
        assert_eq!(after.poll(3), Some(Watermark(999)));
    }
}
