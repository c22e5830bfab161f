//! The Nexmark generator behind a `source` operator with a `nexmark` block.
//!
//! Splitting across subtasks: the source's subtasks claim batches of event indices from one
//! shared counter (the source position a savepoint stores), so every index is emitted by
//! exactly one subtask, the union of what they emit is exactly the prefix `0..emitted` of
//! the generator's single timeline, and a restore at another parallelism continues from the
//! same index. Event `n` is a pure function of `n` and the [`NexmarkSourceSpec`] (the crate
//! seeds each event's random draws with its id), so the events do not depend on which
//! subtask emits them or when.
//!
//! Watermarks (bounded out-of-orderness): after each batch a subtask sends, on every output
//! channel, the largest event time it has emitted minus `maxOutOfOrdernessMs` minus 1 ms.
//! While it has nothing to emit, its future events all have indices at or above the shared
//! counter, so it may advance its watermark to the smallest event time at or after that
//! index (minus the bound and 1 ms) — the idle subtask then does not hold back the
//! downstream minimum. When the source's `count` is reached it sends the final watermark
//! `u64::MAX`.

use std::sync::Arc;

use nexmark::EventGenerator;
use nexmark::event::Event;

use super::NexmarkSourceSpec;
use crate::payload::{Payload, Watermark};
use crate::record::Record;

/// One source subtask's generator and watermark state.
pub struct NexmarkGenerator {
    base: EventGenerator,
    /// A generator positioned right after the last batch, reused when the next batch follows.
    cursor: Option<EventGenerator>,
    group: u64,
    bound_ms: u64,
    channel: u32,
    max_ts: Option<u64>,
    last_watermark: Option<u64>,
}

impl NexmarkGenerator {
    /// A generator for source subtask with job-wide channel number `channel`.
    pub fn new(spec: &NexmarkSourceSpec, channel: u32) -> NexmarkGenerator {
        NexmarkGenerator {
            base: EventGenerator::new(spec.config()),
            cursor: None,
            group: spec.out_of_order_group_size.max(1),
            bound_ms: spec.max_out_of_orderness_ms,
            channel,
            max_ts: None,
            last_watermark: None,
        }
    }

    /// The events with indices `start..start + n`, in index order.
    pub fn batch(&mut self, start: u64, n: u64) -> Vec<Event> {
        let mut generator = match self.cursor.take() {
            Some(g) if g.offset() == start => g,
            _ => self.base.clone().with_offset(start),
        };
        let events: Vec<Event> = (&mut generator).take(n as usize).collect();
        self.cursor = Some(generator);
        events
    }

    /// The record for event `index`, arrived at the source at `created_us` (µs since the
    /// Unix epoch). Key: a bid's auction, an auction's seller, a person's id; value: a bid's
    /// price (else 0).
    pub fn record(&mut self, index: u64, event: Event, created_us: u64) -> Record {
        let ts = event.timestamp();
        self.max_ts = Some(self.max_ts.map_or(ts, |m| m.max(ts)));
        let (key, value) = match &event {
            Event::Person(p) => (p.id as u64, 0),
            Event::Auction(a) => (a.seller as u64, 0),
            Event::Bid(b) => (b.auction as u64, b.price as i64),
        };
        Record {
            seq: index,
            key,
            value,
            count: 1,
            created_us,
            payload: Payload::Event(Arc::new(event)),
        }
    }

    /// The watermark to send after a batch, if it advanced.
    pub fn after_batch(&mut self) -> Option<Record> {
        let wm = self.max_ts?.checked_sub(self.bound_ms + 1)?;
        self.advance(wm)
    }

    /// The watermark to send while idle, given the shared counter `next_index` (every future
    /// event of this subtask has an index ≥ `next_index`), if it advanced.
    pub fn idle(&mut self, next_index: u64) -> Option<Record> {
        let group_start = next_index / self.group * self.group;
        let lower = self.base.clone().with_offset(group_start).timestamp();
        let wm = lower.checked_sub(self.bound_ms + 1)?;
        self.advance(wm)
    }

    /// The final watermark (`u64::MAX`) of a finished bounded source.
    pub fn end(&mut self) -> Option<Record> {
        self.advance(u64::MAX)
    }

    fn advance(&mut self, wm: u64) -> Option<Record> {
        if self.last_watermark.is_some_and(|last| last >= wm) {
            return None;
        }
        self.last_watermark = Some(wm);
        Some(watermark_record(self.channel, wm))
    }
}

/// A record carrying the watermark `ms` of channel `channel`.
pub fn watermark_record(channel: u32, ms: u64) -> Record {
    Record {
        seq: 0,
        key: 0,
        value: 0,
        count: 0,
        created_us: 0,
        payload: Payload::Watermark(Watermark {
            channel,
            ms,
            idle: false,
        }),
    }
}

/// A record saying that channel `channel` is idle ([`Watermark::idle`]).
pub fn idle_record(channel: u32) -> Record {
    Record {
        payload: Payload::Watermark(Watermark {
            channel,
            ms: 0,
            idle: true,
        }),
        ..watermark_record(channel, 0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn batches_are_the_single_timeline_whatever_the_split() {
        let spec = NexmarkSourceSpec::default();
        let whole: Vec<Event> = EventGenerator::new(spec.config()).take(300).collect();
        let mut a = NexmarkGenerator::new(&spec, 0);
        let mut b = NexmarkGenerator::new(&spec, 1);
        let mut split = a.batch(0, 64);
        split.extend(b.batch(64, 100));
        split.extend(a.batch(164, 136));
        assert_eq!(split, whole);
        assert_eq!(whole[0].timestamp(), spec.base_time_ms);
    }

    #[test]
    fn watermarks_trail_the_largest_event_time_by_the_bound() {
        let spec = NexmarkSourceSpec {
            max_out_of_orderness_ms: 5,
            ..Default::default()
        };
        let mut g = NexmarkGenerator::new(&spec, 3);
        let events = g.batch(0, 1000);
        let max = events.iter().map(Event::timestamp).max().unwrap();
        for (i, e) in events.into_iter().enumerate() {
            g.record(i as u64, e, 0);
        }
        let wm = g.after_batch().unwrap();
        assert_eq!(
            wm.payload,
            Payload::Watermark(Watermark {
                channel: 3,
                ms: max - 6,
                idle: false,
            })
        );
        assert!(
            g.after_batch().is_none(),
            "an unchanged watermark is not resent"
        );
        assert!(g.idle(0).is_none(), "idle never moves a watermark back");
        assert!(g.idle(5000).is_some());
    }
}
