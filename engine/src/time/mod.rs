//! Event time: watermarks, event-time windows and the glue that runs the event-time
//! operators inside a subtask.
//!
//! Watermarks flow in-band: a source subtask sends `Watermark` records on every output
//! channel (to every subtask of every downstream operator, whatever the partitioning); each
//! downstream subtask keeps the largest watermark per upstream subtask and takes the minimum
//! over all of them ([`watermark::WatermarkTracker`]); when that minimum advances the operator
//! fires what the new watermark completes, then forwards the watermark on its own outputs.
//! A finished input is at `+∞` (Flink's final watermark `Long.MAX_VALUE`, FLIP-147): a
//! finished source sends `u64::MAX` before its end of input, a stage whose inputs all ended
//! fires everything and sends it too, and an input channel's end counts as `u64::MAX` even
//! without it ([`EventTimeStage::end_input`]), so a bounded source that finished never holds
//! back the windows of the sources still running, also after a restore (its restored
//! subtasks claim nothing and send `u64::MAX` and the end at once).
//! Records whose every window has already been fired (window end − 1 ≤ watermark) are late:
//! they are dropped and counted in `streamscale_late_records_dropped_total`.

pub mod arrivals;
pub mod partition_watermarks;
pub mod watermark;
pub mod window;

use std::ops::Range;

use crate::nexmark::queries::SelectQuery;
use crate::operators::join::{Join, JoinWindow};
use crate::payload::Payload;
use crate::record::Record;
use crate::spec::OperatorKind;
use crate::state::KeyedState;
use watermark::WatermarkTracker;
use window::{EventWindow, WindowTop};

/// Errors encoding or decoding event-time operator state.
#[derive(Debug, thiserror::Error)]
pub enum StateCodecError {
    /// A key group's state could not be encoded or decoded.
    #[error("key group {key_group}: cannot {action} state: {source}")]
    Codec {
        /// The key group.
        key_group: u32,
        /// `encode` or `decode`.
        action: &'static str,
        /// The codec's error.
        source: postcard::Error,
    },
}

/// What one input record produced.
#[derive(Debug, Default)]
pub struct StageOutput {
    /// Records (and watermarks) to send downstream, in order.
    pub records: Vec<Record>,
    /// Source records filtered out on purpose (their `count`).
    pub filtered: u64,
    /// Late records dropped.
    pub late: u64,
}

enum Operator {
    Select(SelectQuery),
    Window(EventWindow),
    Top(WindowTop),
    Join(Join),
}

/// An event-time operator subtask: its input watermark and its operator.
pub struct EventTimeStage {
    tracker: WatermarkTracker,
    /// Job-wide channel number (watermark sender) of each input channel, by input index.
    inputs: Vec<u32>,
    channel: u32,
    operator: Operator,
}

impl EventTimeStage {
    /// The stage for `kind` if it is an event-time kind (`select`, `eventWindow`,
    /// `windowTop`, `join`). `inputs` is the number of upstream subtasks, `channel` this
    /// subtask's job-wide channel number, `restored` its key groups' restored state.
    ///
    /// # Errors
    /// [`StateCodecError`] when restored state cannot be decoded.
    pub fn for_kind(
        kind: &OperatorKind,
        inputs: &[u32],
        channel: u32,
        max_parallelism: u32,
        restored: KeyedState,
    ) -> Result<Option<EventTimeStage>, StateCodecError> {
        let operator =
            match kind {
                OperatorKind::Select { query } => Operator::Select(*query),
                OperatorKind::EventWindow { key, window } => Operator::Window(
                    EventWindow::restore(*key, *window, max_parallelism, &restored)?,
                ),
                OperatorKind::WindowTop { key } => {
                    Operator::Top(WindowTop::restore(*key, max_parallelism, &restored)?)
                }
                OperatorKind::Join { window } => Operator::Join(Join::restore(
                    window
                        .as_ref()
                        .and_then(window::WindowSpec::tumbling_size)
                        .map(JoinWindow::Tumbling),
                    max_parallelism,
                    &restored,
                )?),
                _ => return Ok(None),
            };
        Ok(Some(EventTimeStage {
            tracker: WatermarkTracker::new(inputs.len()),
            inputs: inputs.to_vec(),
            channel,
            operator,
        }))
    }

    /// Processes one input record or watermark, appending what it produces to `out`.
    /// Returns the record's key group for a keyed operator (`eventWindow`, `windowTop`,
    /// `join`: the group its state is kept in, of the key the upstream routing partitions by;
    /// computed once, for the state and for the subtask's per-key-group counts), `None` for a
    /// watermark and for `select`.
    pub fn on_record(&mut self, rec: Record, out: &mut StageOutput) -> Option<u32> {
        if let Payload::Watermark(w) = rec.payload {
            let advanced = if w.idle {
                self.tracker.idle(w.channel)
            } else {
                self.tracker.update(w.channel, w.ms)
            };
            if let Some(wm) = advanced {
                self.advance(wm, out);
            }
            return None;
        }
        let wm = self.tracker.current();
        match &mut self.operator {
            Operator::Select(q) => {
                let count = rec.count;
                match q.apply(rec) {
                    Some(r) => out.records.push(r),
                    None => out.filtered += count,
                }
                None
            }
            Operator::Window(w) => {
                let kg = w.key_group_of(&rec);
                if !w.add_in(&rec, kg, wm) {
                    out.late += 1;
                }
                Some(kg)
            }
            Operator::Top(t) => {
                let kg = t.key_group_of(&rec);
                if !t.add_in(&rec, kg, wm) {
                    out.late += 1;
                }
                Some(kg)
            }
            Operator::Join(j) => {
                let kg = j.key_group_of(&rec);
                if !j.add_in(&rec, kg, wm, &mut out.records) {
                    out.late += 1;
                }
                Some(kg)
            }
        }
    }

    /// The end of input channel `input` (its index at this subtask): its watermark counts as
    /// `+∞` from now on ([`WatermarkTracker::end`]), so that its last watermark no longer holds
    /// back the others'; fires what that completes, appending it to `out`.
    pub fn end_input(&mut self, input: u32, out: &mut StageOutput) {
        let Some(&channel) = self.inputs.get(input as usize) else {
            return;
        };
        if let Some(wm) = self.tracker.end(channel) {
            self.advance(wm, out);
        }
    }

    /// End of input (bounded sources finished, or a drain): fires everything as the final
    /// watermark `u64::MAX` would.
    pub fn finish(&mut self, out: &mut StageOutput) {
        if self.tracker.current() != Some(u64::MAX) {
            self.advance(u64::MAX, out);
        }
    }

    fn advance(&mut self, wm: u64, out: &mut StageOutput) {
        match &mut self.operator {
            Operator::Select(_) => {}
            Operator::Window(w) => w.fire(wm, &mut out.records),
            Operator::Top(t) => t.fire(wm, &mut out.records),
            Operator::Join(j) => j.fire(wm, &mut out.records),
        }
        out.records
            .push(crate::nexmark::source::watermark_record(self.channel, wm));
    }

    /// The keyed state by key group (for a savepoint), or `None` for stateless stages.
    ///
    /// # Errors
    /// [`StateCodecError`] when a key group's state cannot be encoded.
    pub fn snapshot(&self) -> Result<Option<KeyedState>, StateCodecError> {
        match &self.operator {
            Operator::Select(_) => Ok(None),
            Operator::Window(w) => w.snapshot().map(Some),
            Operator::Top(t) => t.snapshot().map(Some),
            Operator::Join(j) => j.snapshot().map(Some),
        }
    }
}

/// Encodes per-key-group states into a [`KeyedState`]'s `blobs` (postcard, one per key group).
///
/// # Errors
/// [`StateCodecError`] when a key group cannot be encoded.
pub fn encode_groups<T: serde::Serialize>(
    groups: &std::collections::BTreeMap<u32, T>,
) -> Result<KeyedState, StateCodecError> {
    let mut state = KeyedState::default();
    for (kg, s) in groups {
        let bytes = postcard::to_allocvec(s).map_err(|source| StateCodecError::Codec {
            key_group: *kg,
            action: "encode",
            source,
        })?;
        state.blobs.insert(*kg, bytes);
    }
    Ok(state)
}

/// Decodes the per-key-group states of a [`KeyedState`]'s `blobs`.
///
/// # Errors
/// [`StateCodecError`] when a key group cannot be decoded.
pub fn decode_groups<T: serde::de::DeserializeOwned>(
    state: &KeyedState,
) -> Result<std::collections::BTreeMap<u32, T>, StateCodecError> {
    state
        .blobs
        .iter()
        .map(|(kg, bytes)| {
            postcard::from_bytes(bytes)
                .map(|s| (*kg, s))
                .map_err(|source| StateCodecError::Codec {
                    key_group: *kg,
                    action: "decode",
                    source,
                })
        })
        .collect()
}

/// Windows `[start, end)` (ms) that contain event time `ts` under `spec` (sessions: the
/// proto-window `[ts, ts + gap)` before merging).
pub fn assign_windows(spec: &window::WindowSpec, ts: u64) -> Vec<Range<u64>> {
    match *spec {
        window::WindowSpec::Tumbling { size_ms } => {
            let start = ts - ts % size_ms;
            std::iter::once(start..start + size_ms).collect()
        }
        window::WindowSpec::Sliding { size_ms, slide_ms } => {
            let mut out = Vec::new();
            let last_start = ts - ts % slide_ms;
            let mut start = last_start;
            loop {
                if start + size_ms > ts {
                    out.push(start..start + size_ms);
                } else {
                    break;
                }
                if start < slide_ms {
                    break;
                }
                start -= slide_ms;
            }
            out.reverse();
            out
        }
        window::WindowSpec::Session { gap_ms } => {
            std::iter::once(ts..ts.saturating_add(gap_ms)).collect()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::window::WindowSpec;
    use super::*;

    #[test]
    fn sliding_windows_cover_an_event_size_over_slide_times() {
        let spec = WindowSpec::Sliding {
            size_ms: 10,
            slide_ms: 2,
        };
        let w = assign_windows(&spec, 23);
        assert_eq!(w, vec![14..24, 16..26, 18..28, 20..30, 22..32]);
        let t = assign_windows(&WindowSpec::Tumbling { size_ms: 10 }, 23);
        assert_eq!(t, vec![20..30]);
    }

    /// Feeds `records` to a fresh stage of `kind` and checks that every key group it returns
    /// (what the subtask counts for `streamscale_hottest_key_group_share`) is the key group of
    /// the key the upstream routing partitions `kind`'s input by; returns what it emitted.
    fn check_key_groups(kind: &OperatorKind, records: Vec<Record>) -> Vec<Record> {
        let k = 128;
        let route = crate::nexmark::queries::key_selector(kind);
        let mut stage = EventTimeStage::for_kind(kind, &[0], 0, k, KeyedState::default())
            .unwrap()
            .unwrap();
        let mut out = StageOutput::default();
        let mut groups = std::collections::BTreeSet::new();
        for rec in records {
            let routed = crate::keygroup::key_group(route(&rec), k);
            let watermark = rec.payload.is_watermark();
            let kg = stage.on_record(rec, &mut out);
            assert_eq!(kg, (!watermark).then_some(routed), "{kind:?}");
            groups.extend(kg);
        }
        assert!(groups.len() > 10, "{kind:?}: only {groups:?}");
        stage.finish(&mut out);
        out.records
    }

    /// (c) of the finished-sources scenario at one window subtask: an input channel that ends
    /// without sending the final watermark no longer holds back the input watermark, so the
    /// windows the other channel's watermark completes fire at once, each once.
    #[test]
    fn an_ended_input_channels_last_watermark_does_not_hold_back_the_windows() {
        use crate::nexmark::queries::BidKey;
        use crate::nexmark::source::{NexmarkGenerator, watermark_record};
        use crate::payload::Payload;
        let base = crate::nexmark::DEFAULT_BASE_TIME_MS;
        // 3000 events: 0.3 s of event time at the default 10 000 events/s; the bids only.
        let mut generator = NexmarkGenerator::new(&Default::default(), 0);
        let bids: Vec<Record> = generator
            .batch(0, 3000)
            .into_iter()
            .enumerate()
            .map(|(i, e)| generator.record(i as u64, e, 0))
            .filter(|r| matches!(&r.payload, Payload::Event(e) if matches!(**e, nexmark::event::Event::Bid(_))))
            .collect();
        let kind = OperatorKind::EventWindow {
            key: BidKey::Auction,
            window: WindowSpec::Tumbling { size_ms: 100 },
        };
        // Input channels 0 and 1 carry the watermarks of job-wide channels 7 and 9.
        let mut stage = EventTimeStage::for_kind(&kind, &[7, 9], 20, 128, KeyedState::default())
            .unwrap()
            .unwrap();
        let mut out = StageOutput::default();
        for rec in bids.iter().cloned() {
            stage.on_record(rec, &mut out);
        }
        // (window end, count) of the fired rows, and the watermarks forwarded, since last call.
        let drain = |out: &mut StageOutput| {
            let mut rows = Vec::new();
            let mut marks = Vec::new();
            for r in out.records.drain(..) {
                match &r.payload {
                    Payload::Watermark(w) => marks.push((w.channel, w.ms)),
                    Payload::Row(row) => rows.push((row.ts_ms + 1, r.value as u64)),
                    p => panic!("unexpected output {p:?}"),
                }
            }
            (rows, marks)
        };
        stage.on_record(watermark_record(9, base + 50), &mut out);
        stage.on_record(watermark_record(7, base + 150), &mut out);
        stage.on_record(watermark_record(7, base + 250), &mut out);
        let (rows, marks) = drain(&mut out);
        assert!(
            rows.is_empty(),
            "channel 9 holds the windows back: {rows:?}"
        );
        assert_eq!(marks, vec![(20, base + 50)]);
        // Channel 9 (input 1) ends after its last watermark base + 50, without +∞.
        stage.end_input(1, &mut out);
        let (rows, marks) = drain(&mut out);
        assert_eq!(
            marks,
            vec![(20, base + 250)],
            "the input watermark follows channel 7"
        );
        let due = |end: u64| {
            bids.iter()
                .filter(|r| r.payload.event_time_ms().unwrap() < end)
                .count() as u64
        };
        assert!(rows.iter().all(|(end, _)| *end <= base + 200), "{rows:?}");
        assert_eq!(rows.iter().map(|(_, n)| n).sum::<u64>(), due(base + 200));
        assert!(due(base + 200) > 0 && due(base + 200) < bids.len() as u64);
        // The other channel ends too: the rest fires, and every bid was counted once.
        stage.end_input(0, &mut out);
        let (rest, marks) = drain(&mut out);
        assert_eq!(marks, vec![(20, u64::MAX)]);
        assert!(rest.iter().all(|(end, _)| *end > base + 200), "{rest:?}");
        assert_eq!(
            rows.iter().chain(&rest).map(|(_, n)| n).sum::<u64>(),
            bids.len() as u64
        );
        // The end of input after both channels ended fires nothing more.
        stage.finish(&mut out);
        assert!(out.records.is_empty());
    }

    #[test]
    fn keyed_stages_return_the_routing_key_group() {
        use crate::nexmark::queries::BidKey;
        use crate::nexmark::source::NexmarkGenerator;
        let mut generator = NexmarkGenerator::new(&Default::default(), 0);
        let events: Vec<Record> = generator
            .batch(0, 3000)
            .into_iter()
            .enumerate()
            .map(|(i, e)| generator.record(i as u64, e, 0))
            .collect();
        let tumbling = WindowSpec::Tumbling { size_ms: 10 };
        for key in [BidKey::Auction, BidKey::Bidder] {
            let window = OperatorKind::EventWindow {
                key,
                window: tumbling,
            };
            let rows = check_key_groups(&window, events.clone());
            let rows: Vec<Record> = rows
                .into_iter()
                .filter(|r| !r.payload.is_watermark())
                .collect();
            assert!(rows.len() > 10, "{} window rows", rows.len());
            check_key_groups(&OperatorKind::WindowTop { key }, rows);
        }
        for window in [None, Some(tumbling)] {
            check_key_groups(&OperatorKind::Join { window }, events.clone());
        }
    }
}
