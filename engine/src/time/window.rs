//! Keyed event-time windows (tumbling, sliding, session) counting records per key and
//! window, and `windowTop`, which keeps per window the keys with the largest count (Q5).
//!
//! State lives in key groups: key group → key → open windows. A savepoint stores each key
//! group's part separately (postcard, in [`KeyedState::blobs`]), so a restore at another
//! parallelism hands every subtask exactly the windows of the key groups it now owns. The
//! timers (which window fires when) are derived from the state on restore.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::arrivals::WindowArrivals;
use super::{StateCodecError, assign_windows, decode_groups, encode_groups};
use crate::keygroup::key_group;
use crate::nexmark::queries::{BidKey, key_bid_auction, key_bid_bidder, key_window};
use crate::payload::{Payload, Row, Value};
use crate::record::Record;
use crate::state::KeyedState;

/// An event-time window assigner.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum WindowSpec {
    /// Fixed, non-overlapping windows `[k·size, (k+1)·size)` of event time.
    #[serde(rename_all = "camelCase")]
    Tumbling {
        /// Window length, ms of event time. At least 1.
        size_ms: u64,
    },
    /// Overlapping windows of length `sizeMs` starting every `slideMs` (Flink's HOP): each
    /// record falls into `ceil(size/slide)` windows.
    #[serde(rename_all = "camelCase")]
    Sliding {
        /// Window length, ms of event time. At least 1.
        size_ms: u64,
        /// Distance between window starts, ms. Between 1 and `sizeMs`.
        slide_ms: u64,
    },
    /// Per key, records less than `gapMs` apart in event time belong to one session window
    /// `[first, last + gap)`; a gap of `gapMs` or more starts a new session.
    #[serde(rename_all = "camelCase")]
    Session {
        /// Inactivity gap that ends a session, ms of event time. At least 1.
        gap_ms: u64,
    },
}

impl WindowSpec {
    /// The size of a tumbling window (`None` for other assigners).
    pub fn tumbling_size(&self) -> Option<u64> {
        match self {
            WindowSpec::Tumbling { size_ms } => Some(*size_ms),
            _ => None,
        }
    }

    /// Checks the sizes; `at` names the field (e.g. `operators[2] (win).window`).
    ///
    /// # Errors
    /// A message naming the offending field.
    pub fn validate(&self, at: &str) -> Result<(), String> {
        match *self {
            WindowSpec::Tumbling { size_ms: 0 } => {
                Err(format!("{at}.tumbling.sizeMs: must be at least 1 ms"))
            }
            WindowSpec::Sliding { size_ms: 0, .. } => {
                Err(format!("{at}.sliding.sizeMs: must be at least 1 ms"))
            }
            WindowSpec::Sliding { size_ms, slide_ms } if slide_ms == 0 || slide_ms > size_ms => {
                Err(format!(
                    "{at}.sliding.slideMs: {slide_ms} must be between 1 and sizeMs ({size_ms})"
                ))
            }
            WindowSpec::Session { gap_ms: 0 } => {
                Err(format!("{at}.session.gapMs: must be at least 1 ms"))
            }
            _ => Ok(()),
        }
    }
}

/// One open window of one key: `[start, end)` ms of event time and its record count.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pane {
    /// Window start, ms (inclusive).
    pub start: u64,
    /// Window end, ms (exclusive).
    pub end: u64,
    /// Records counted.
    pub count: u64,
}

fn late(window: &Range<u64>, wm: Option<u64>) -> bool {
    wm.is_some_and(|wm| window.end.saturating_sub(1) <= wm)
}

/// A keyed event-time window operator counting records per key and window.
///
/// Output, when the watermark passes a window's end − 1: one row
/// `{<key>: key, count, windowStart, windowEnd}` per key and window, at event time end − 1.
#[derive(Debug)]
pub struct EventWindow {
    key: BidKey,
    spec: WindowSpec,
    max_parallelism: u32,
    groups: BTreeMap<u32, BTreeMap<u64, Vec<Pane>>>,
    timers: BTreeSet<(u64, u32, u64)>,
    arrivals: WindowArrivals,
}

impl EventWindow {
    /// The operator holding `restored`'s key groups.
    ///
    /// # Errors
    /// [`StateCodecError`] when a key group cannot be decoded.
    pub fn restore(
        key: BidKey,
        spec: WindowSpec,
        max_parallelism: u32,
        restored: &KeyedState,
    ) -> Result<EventWindow, StateCodecError> {
        let groups: BTreeMap<u32, BTreeMap<u64, Vec<Pane>>> = decode_groups(restored)?;
        let timers = groups
            .iter()
            .flat_map(|(kg, keys)| {
                keys.iter()
                    .flat_map(move |(k, panes)| panes.iter().map(move |p| (p.end, *kg, *k)))
            })
            .collect();
        Ok(EventWindow {
            key,
            spec,
            max_parallelism,
            groups,
            timers,
            arrivals: WindowArrivals::default(),
        })
    }

    /// The key that partitions this window's input (the same selector the upstream routing
    /// uses: a bid's auction or bidder, else the record's key).
    fn key_of(&self, rec: &Record) -> u64 {
        match self.key {
            BidKey::Auction => key_bid_auction(rec),
            BidKey::Bidder => key_bid_bidder(rec),
            BidKey::Key => rec.key,
        }
    }

    /// The key group `rec`'s state lives in (what [`EventWindow::add_in`] wants).
    pub fn key_group_of(&self, rec: &Record) -> u32 {
        key_group(self.key_of(rec), self.max_parallelism)
    }

    /// Adds a record given the input watermark `wm`. Returns false if it was late for every
    /// window it belongs to (dropped).
    pub fn add(&mut self, rec: &Record, wm: Option<u64>) -> bool {
        self.add_in(rec, self.key_group_of(rec), wm)
    }

    /// [`EventWindow::add`] of a record whose key group `kg` the caller has computed
    /// ([`EventWindow::key_group_of`]; the subtask counts its records per key group with it).
    pub fn add_in(&mut self, rec: &Record, kg: u32, wm: Option<u64>) -> bool {
        debug_assert_eq!(kg, self.key_group_of(rec));
        let Some(ts) = rec.payload.event_time_ms() else {
            return true;
        };
        let key = self.key_of(rec);
        let windows = assign_windows(&self.spec, ts);
        if windows.iter().all(|w| late(w, wm)) {
            return false;
        }
        let panes = self.groups.entry(kg).or_default().entry(key).or_default();
        if let WindowSpec::Session { .. } = self.spec {
            let mut merged = Pane {
                start: windows[0].start,
                end: windows[0].end,
                count: rec.count,
            };
            // Session merging: windows that overlap become one. Windows that only touch
            // (a gap of exactly `gapMs`) stay apart — unlike Flink, which merges them — so the
            // result never depends on whether the watermark fired the first in between.
            panes.retain(|p| {
                if p.start < merged.end && p.end > merged.start {
                    merged.start = merged.start.min(p.start);
                    merged.end = merged.end.max(p.end);
                    merged.count += p.count;
                    self.timers.remove(&(p.end, kg, key));
                    false
                } else {
                    true
                }
            });
            self.timers.insert((merged.end, kg, key));
            panes.push(merged);
            self.arrivals
                .note(session_boundary(ts, self.spec), rec.created_us);
            return true;
        }
        if let Some(first) = windows.iter().find(|w| !late(w, wm)) {
            self.arrivals.note(first.end, rec.created_us);
        }
        for w in windows.into_iter().filter(|w| !late(w, wm)) {
            match panes.iter_mut().find(|p| p.start == w.start) {
                Some(p) => p.count += rec.count,
                None => {
                    panes.push(Pane {
                        start: w.start,
                        end: w.end,
                        count: rec.count,
                    });
                    self.timers.insert((w.end, kg, key));
                }
            }
        }
        true
    }

    /// Fires every window with end − 1 ≤ `wm`, in order of window end, appending the rows,
    /// each stamped with the wall-clock time its window ended ([`WindowArrivals::stamp`]).
    pub fn fire(&mut self, wm: u64, out: &mut Vec<Record>) {
        let now = crate::clock::now_unix_us();
        while let Some(&(end, kg, key)) = self.timers.first() {
            if end.saturating_sub(1) > wm {
                break;
            }
            self.timers.pop_first();
            let Some(keys) = self.groups.get_mut(&kg) else {
                continue;
            };
            let Some(panes) = keys.get_mut(&key) else {
                continue;
            };
            let Some(i) = panes.iter().position(|p| p.end == end) else {
                continue;
            };
            let p = panes.swap_remove(i);
            if panes.is_empty() {
                keys.remove(&key);
                if keys.is_empty() {
                    self.groups.remove(&kg);
                }
            }
            out.push(window_row(self.key, key, p, self.arrivals.stamp(end, now)));
        }
        self.arrivals.forget_through(wm.saturating_add(1));
    }

    /// The open windows by key group, for a savepoint.
    ///
    /// # Errors
    /// [`StateCodecError`] when a key group cannot be encoded.
    pub fn snapshot(&self) -> Result<KeyedState, StateCodecError> {
        encode_groups(&self.groups)
    }
}

/// Boundaries per session gap in [`WindowArrivals`] ([`session_boundary`]).
const SESSION_BOUNDARIES: u64 = 64;

/// The boundary a session window's record at event time `ts` (ms) is noted at in
/// [`WindowArrivals`]: the next multiple of 1/[`SESSION_BOUNDARIES`] of the gap above it. A
/// session's end is its last record's time plus the gap, different per key, so arrivals are kept
/// per such step (about that many open boundaries) rather than per end; a session's stamp then
/// leaves out the records less than one step before its end, at most that much event time early.
fn session_boundary(ts: u64, spec: WindowSpec) -> u64 {
    let q = match spec {
        WindowSpec::Session { gap_ms } => (gap_ms / SESSION_BOUNDARIES).max(1),
        _ => 1,
    };
    (ts / q).saturating_add(1).saturating_mul(q)
}

/// A window's result row for `key`, at event time `p.end − 1`, arrived (for the sink's latency)
/// at `created_us`.
fn window_row(key_field: BidKey, key: u64, p: Pane, created_us: u64) -> Record {
    let row = Row::new(
        p.end - 1,
        vec![
            (
                key_field.field(),
                match key_field {
                    // A 64-bit key hash: unsigned in JSON.
                    BidKey::Key => Value::UInt(key),
                    BidKey::Auction | BidKey::Bidder => Value::Int(key as i64),
                },
            ),
            ("count", Value::Int(p.count as i64)),
            ("windowStart", Value::Int(p.start as i64)),
            ("windowEnd", Value::Int(p.end as i64)),
        ],
    );
    Record {
        seq: key,
        key,
        value: p.count as i64,
        count: 1,
        created_us,
        payload: Payload::Row(Arc::new(row)),
    }
}

/// Per window, the keys with the largest count so far.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopPane {
    /// Window start, ms.
    pub start: u64,
    /// Window end, ms.
    pub end: u64,
    /// Largest count seen.
    pub max: u64,
    /// Keys with that count.
    pub keys: Vec<u64>,
}

/// Keeps, per window, the keys whose count is the window's largest (Nexmark Q5's "hot
/// items": `num >= max(num)` per window). Keyed by window (its end − 1); fires a window when
/// the watermark reaches its end − 1, i.e. once every upstream subtask has fired it.
#[derive(Debug)]
pub struct WindowTop {
    key: BidKey,
    max_parallelism: u32,
    groups: BTreeMap<u32, BTreeMap<u64, TopPane>>,
    timers: BTreeSet<(u64, u32)>,
    arrivals: WindowArrivals,
}

impl WindowTop {
    /// The operator holding `restored`'s key groups.
    ///
    /// # Errors
    /// [`StateCodecError`] when a key group cannot be decoded.
    pub fn restore(
        key: BidKey,
        max_parallelism: u32,
        restored: &KeyedState,
    ) -> Result<WindowTop, StateCodecError> {
        let groups: BTreeMap<u32, BTreeMap<u64, TopPane>> = decode_groups(restored)?;
        let timers = groups
            .iter()
            .flat_map(|(kg, ws)| ws.keys().map(move |ts| (*ts, *kg)))
            .collect();
        Ok(WindowTop {
            key,
            max_parallelism,
            groups,
            timers,
            arrivals: WindowArrivals::default(),
        })
    }

    /// The key group `rec`'s state lives in (its window, [`key_window`], the routing's key;
    /// what [`WindowTop::add_in`] wants).
    pub fn key_group_of(&self, rec: &Record) -> u32 {
        key_group(key_window(rec), self.max_parallelism)
    }

    /// Adds a window result row given the input watermark; false if it was late (dropped).
    pub fn add(&mut self, rec: &Record, wm: Option<u64>) -> bool {
        self.add_in(rec, self.key_group_of(rec), wm)
    }

    /// [`WindowTop::add`] of a record whose key group `kg` the caller has computed
    /// ([`WindowTop::key_group_of`]).
    pub fn add_in(&mut self, rec: &Record, kg: u32, wm: Option<u64>) -> bool {
        debug_assert_eq!(kg, self.key_group_of(rec));
        let Payload::Row(row) = &rec.payload else {
            return true;
        };
        let ts = row.ts_ms;
        if wm.is_some_and(|wm| ts <= wm) {
            return false;
        }
        let (Some(key), Some(count), Some(start), Some(end)) = (
            row.int(self.key.field()),
            row.int("count"),
            row.int("windowStart"),
            row.int("windowEnd"),
        ) else {
            return true;
        };
        let (key, count) = (key as u64, count as u64);
        let pane = self
            .groups
            .entry(kg)
            .or_default()
            .entry(ts)
            .or_insert_with(|| TopPane {
                start: start as u64,
                end: end as u64,
                max: 0,
                keys: Vec::new(),
            });
        if count > pane.max {
            pane.max = count;
            pane.keys.clear();
        }
        if count == pane.max {
            pane.keys.push(key);
        }
        self.timers.insert((ts, kg));
        self.arrivals.note(ts, rec.created_us);
        true
    }

    /// Fires every window whose end − 1 ≤ `wm`: one row per top key, keys ascending, stamped
    /// with the latest stamp of the window's input rows (when its upstream windows ended).
    pub fn fire(&mut self, wm: u64, out: &mut Vec<Record>) {
        let now = crate::clock::now_unix_us();
        while let Some(&(ts, kg)) = self.timers.first() {
            if ts > wm {
                break;
            }
            self.timers.pop_first();
            let Some(ws) = self.groups.get_mut(&kg) else {
                continue;
            };
            let Some(mut pane) = ws.remove(&ts) else {
                continue;
            };
            if ws.is_empty() {
                self.groups.remove(&kg);
            }
            pane.keys.sort_unstable();
            for key in pane.keys {
                let p = Pane {
                    start: pane.start,
                    end: pane.end,
                    count: pane.max,
                };
                out.push(window_row(self.key, key, p, self.arrivals.stamp(ts, now)));
            }
        }
        self.arrivals.forget_through(wm);
    }

    /// The open windows by key group, for a savepoint.
    ///
    /// # Errors
    /// [`StateCodecError`] when a key group cannot be encoded.
    pub fn snapshot(&self) -> Result<KeyedState, StateCodecError> {
        encode_groups(&self.groups)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use nexmark::event::{Bid, Event};

    fn bid(auction: usize, ts: u64) -> Record {
        let b = Bid {
            auction,
            bidder: 1,
            price: 1,
            channel: String::new(),
            url: String::new(),
            date_time: ts,
            extra: String::new(),
        };
        Record {
            seq: 0,
            key: auction as u64,
            value: 1,
            count: 1,
            created_us: 0,
            payload: Payload::Event(Arc::new(Event::Bid(b))),
        }
    }

    fn rows(out: &[Record]) -> Vec<(i64, i64, i64)> {
        out.iter()
            .map(|r| match &r.payload {
                Payload::Row(row) => (
                    row.int("auction").unwrap(),
                    row.int("count").unwrap(),
                    row.int("windowStart").unwrap(),
                ),
                _ => panic!("not a row"),
            })
            .collect()
    }

    #[test]
    fn tumbling_windows_fire_at_the_watermark_and_drop_late_records() {
        let spec = WindowSpec::Tumbling { size_ms: 10 };
        let mut w = EventWindow::restore(BidKey::Auction, spec, 8, &KeyedState::default()).unwrap();
        assert!(w.add(&bid(1, 3), None));
        assert!(w.add(&bid(1, 12), None));
        assert!(w.add(&bid(2, 9), None));
        let mut out = Vec::new();
        w.fire(8, &mut out);
        assert!(out.is_empty(), "window [0,10) ends at 9 > 8");
        w.fire(9, &mut out);
        let mut got = rows(&out);
        got.sort_unstable();
        assert_eq!(got, vec![(1, 1, 0), (2, 1, 0)]);
        assert!(!w.add(&bid(1, 5), Some(9)), "its window has fired: late");
        assert!(w.add(&bid(1, 15), Some(9)));
        out.clear();
        w.fire(u64::MAX, &mut out);
        assert_eq!(rows(&out), vec![(1, 2, 10)]);
    }

    #[test]
    fn session_windows_merge_and_survive_a_key_group_split() {
        let spec = WindowSpec::Session { gap_ms: 5 };
        let mut w = EventWindow::restore(BidKey::Auction, spec, 8, &KeyedState::default()).unwrap();
        for (a, ts) in [(1, 0), (1, 4), (1, 20), (1, 9), (2, 100), (3, 7)] {
            assert!(w.add(&bid(a, ts), None));
        }
        // Split the state into two key-group ranges and restore each half separately.
        let state = w.snapshot().unwrap();
        let mut out = Vec::new();
        for range in [0..4, 4..8] {
            let mut half =
                EventWindow::restore(BidKey::Auction, spec, 8, &state.slice(range)).unwrap();
            half.fire(u64::MAX, &mut out);
        }
        let mut got: Vec<_> = out
            .iter()
            .map(|r| match &r.payload {
                Payload::Row(row) => (
                    row.int("auction").unwrap(),
                    row.int("count").unwrap(),
                    row.int("windowStart").unwrap(),
                    row.int("windowEnd").unwrap(),
                ),
                _ => panic!(),
            })
            .collect();
        got.sort_unstable();
        assert_eq!(
            got,
            vec![
                (1, 1, 9, 14),
                (1, 1, 20, 25),
                (1, 2, 0, 9),
                (2, 1, 100, 105),
                (3, 1, 7, 12)
            ]
        );
    }

    #[test]
    fn window_top_keeps_every_key_with_the_largest_count() {
        let mut top = WindowTop::restore(BidKey::Auction, 8, &KeyedState::default()).unwrap();
        let mut w = EventWindow::restore(
            BidKey::Auction,
            WindowSpec::Sliding {
                size_ms: 10,
                slide_ms: 5,
            },
            8,
            &KeyedState::default(),
        )
        .unwrap();
        for (a, ts) in [(1, 1), (1, 2), (2, 3), (2, 4), (3, 6)] {
            w.add(&bid(a, ts), None);
        }
        let mut results = Vec::new();
        w.fire(u64::MAX, &mut results);
        for r in &results {
            assert!(top.add(r, None));
        }
        let mut out = Vec::new();
        top.fire(u64::MAX, &mut out);
        let got = rows(&out);
        // Window [0,10): auction 1 → 2 bids, 2 → 2, 3 → 1; window [5,15): 3 → 1.
        assert_eq!(got, vec![(1, 2, 0), (2, 2, 0), (3, 1, 5)]);
    }
    /// `bid(auction, ts)` that arrived at its source at `created_us`.
    fn bid_at(auction: usize, ts: u64, created_us: u64) -> Record {
        Record {
            created_us,
            ..bid(auction, ts)
        }
    }

    /// The stamp of each result row: (auction, windowStart, created_us), sorted.
    fn stamps(out: &[Record]) -> Vec<(i64, i64, u64)> {
        let mut got: Vec<_> = rows(out)
            .into_iter()
            .zip(out)
            .map(|((a, _, start), r)| (a, start, r.created_us))
            .collect();
        got.sort_unstable();
        got
    }

    #[test]
    fn results_are_stamped_when_their_window_ended_not_when_it_fired() {
        // The old code stamped every row with the firing time (now): a sink then measured
        // only what came after the watermark, not the upstream delay nor the watermark's wait.
        let spec = WindowSpec::Tumbling { size_ms: 10 };
        let mut w = EventWindow::restore(BidKey::Auction, spec, 8, &KeyedState::default()).unwrap();
        let t0 = 1_700_000_000_000_000;
        // Window [0,10): auction 1 early, auction 2 last (out of order in event time).
        assert!(w.add(&bid_at(1, 2, t0 + 1_000), None));
        assert!(w.add(&bid_at(2, 9, t0 + 5_000), None));
        assert!(w.add(&bid_at(1, 8, t0 + 7_000), None));
        // Window [10,20).
        assert!(w.add(&bid_at(1, 11, t0 + 12_000), None));
        let mut out = Vec::new();
        w.fire(9, &mut out);
        // Every key's row of [0,10) carries the window's latest arrival (its end in wall time).
        assert_eq!(stamps(&out), vec![(1, 0, t0 + 7_000), (2, 0, t0 + 7_000)]);
        out.clear();
        w.fire(u64::MAX, &mut out);
        assert_eq!(stamps(&out), vec![(1, 10, t0 + 12_000)]);
        assert!(w.arrivals.is_empty(), "fired windows are forgotten");
    }

    #[test]
    fn a_session_ends_when_its_end_passed_at_the_source_and_restored_state_fires_now() {
        // A session's end is event time (last record + gap); it is read off the records that
        // came before it, never by adding the gap's event-time ms to a wall-clock arrival
        // (event time need not run at wall-clock speed).
        let spec = WindowSpec::Session { gap_ms: 5 };
        let mut w = EventWindow::restore(BidKey::Auction, spec, 8, &KeyedState::default()).unwrap();
        let t0 = 1_700_000_000_000_000;
        // Auction 1: one session [0, 9) (the later arrival has the earlier event time).
        assert!(w.add(&bid_at(1, 4, t0 + 1_000), None));
        assert!(w.add(&bid_at(1, 0, t0 + 3_000), None));
        // Auction 2 at 8 (session [8, 13)) arrives before 1's end passed; auction 3 at 9 after.
        assert!(w.add(&bid_at(2, 8, t0 + 6_000), None));
        assert!(w.add(&bid_at(3, 9, t0 + 8_000), None));
        let state = w.snapshot().unwrap();
        let mut out = Vec::new();
        w.fire(u64::MAX, &mut out);
        assert_eq!(
            stamps(&out),
            vec![(1, 0, t0 + 6_000), (2, 8, t0 + 8_000), (3, 9, t0 + 8_000)]
        );
        // From a savepoint nothing was noted: stamped with the firing time.
        let before = crate::clock::now_unix_us();
        let mut restored = EventWindow::restore(BidKey::Auction, spec, 8, &state).unwrap();
        out.clear();
        restored.fire(u64::MAX, &mut out);
        assert_eq!(out.len(), 3);
        assert!(
            out[0].created_us >= before,
            "{} < {before}",
            out[0].created_us
        );
    }

    #[test]
    fn session_boundaries_are_steps_of_a_64th_of_the_gap() {
        let s = WindowSpec::Session { gap_ms: 6_400 };
        assert_eq!(session_boundary(0, s), 100);
        assert_eq!(session_boundary(99, s), 100);
        assert_eq!(session_boundary(100, s), 200);
        assert_eq!(session_boundary(7, WindowSpec::Session { gap_ms: 3 }), 8);
    }

    #[test]
    fn window_top_rows_carry_their_input_rows_latest_stamp() {
        let mut top = WindowTop::restore(BidKey::Auction, 8, &KeyedState::default()).unwrap();
        let spec = WindowSpec::Tumbling { size_ms: 10 };
        let mut w = EventWindow::restore(BidKey::Auction, spec, 8, &KeyedState::default()).unwrap();
        let t0 = 1_700_000_000_000_000;
        for (a, ts, at) in [(1, 1, 1_000), (1, 2, 2_000), (2, 3, 9_000), (2, 4, 4_000)] {
            assert!(w.add(&bid_at(a, ts, t0 + at), None));
        }
        let mut results = Vec::new();
        w.fire(u64::MAX, &mut results);
        for r in &results {
            assert!(top.add(r, None));
        }
        let mut out = Vec::new();
        top.fire(u64::MAX, &mut out);
        assert_eq!(stamps(&out), vec![(1, 0, t0 + 9_000), (2, 0, t0 + 9_000)]);
    }
}
