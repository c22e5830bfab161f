//! A keyed two-input join of Nexmark persons and auctions on `person.id = auction.seller`.
//!
//! Its input is partitioned by that key (persons by id, auctions by seller), so both sides of
//! a key meet in one subtask; the two sides are told apart by event type, so they may come
//! from two upstream operators (Q3: `q3Persons` and `q3Auctions`) or one.
//!
//! - Without a window (Nexmark Q3, a regular join): both sides are kept in state for ever; a
//!   new person is joined with every stored auction of its id and a new auction with the
//!   stored person(s) of its seller. Output `{name, city, state, id}` (`id` is the auction's)
//!   at event time max(person, auction).
//! - With a tumbling window (Nexmark Q8, "new users who opened an auction"): per key and
//!   window, the distinct persons and whether an auction appeared; when the watermark passes
//!   the window's end − 1, every person of a window that also had an auction of theirs is
//!   emitted as `{id, name, windowStart, windowEnd}`. Late records are dropped and counted.
//!
//! State lives in key groups (key group → key → sides) and is saved per key group.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use nexmark::event::Event;
use serde::{Deserialize, Serialize};

use crate::keygroup::key_group;
use crate::nexmark::queries::key_person;
use crate::payload::{Payload, Row, Value};
use crate::record::Record;
use crate::state::KeyedState;
use crate::time::arrivals::WindowArrivals;
use crate::time::{StateCodecError, decode_groups, encode_groups};

/// How the join bounds its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinWindow {
    /// Tumbling event-time windows of this many ms: only persons and auctions of the same
    /// window join.
    Tumbling(u64),
}

/// A person as the join keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersonSide {
    /// Person id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// City.
    pub city: String,
    /// State (US).
    pub state: String,
    /// Event time, ms.
    pub ts: u64,
}

/// An auction as the regular join keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuctionSide {
    /// Auction id.
    pub id: u64,
    /// Event time, ms.
    pub ts: u64,
}

/// One key's window of the windowed join.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowSides {
    /// Distinct `(id, name)` of the persons in the window.
    pub persons: Vec<(u64, String)>,
    /// Auctions of this key (seller) in the window.
    pub auctions: u64,
}

/// The join state of one key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinKeyState {
    /// Regular join: persons with this id.
    pub persons: Vec<PersonSide>,
    /// Regular join: auctions of this seller.
    pub auctions: Vec<AuctionSide>,
    /// Windowed join: window start (ms) → sides.
    pub windows: BTreeMap<u64, WindowSides>,
}

/// The join operator of one subtask.
#[derive(Debug)]
pub struct Join {
    window: Option<JoinWindow>,
    max_parallelism: u32,
    groups: BTreeMap<u32, BTreeMap<u64, JoinKeyState>>,
    timers: BTreeSet<(u64, u32, u64)>,
    arrivals: WindowArrivals,
}

impl Join {
    /// The join holding `restored`'s key groups.
    ///
    /// # Errors
    /// [`StateCodecError`] when a key group cannot be decoded.
    pub fn restore(
        window: Option<JoinWindow>,
        max_parallelism: u32,
        restored: &KeyedState,
    ) -> Result<Join, StateCodecError> {
        let groups: BTreeMap<u32, BTreeMap<u64, JoinKeyState>> = decode_groups(restored)?;
        let mut timers = BTreeSet::new();
        if let Some(JoinWindow::Tumbling(size)) = window {
            for (kg, keys) in &groups {
                for (k, s) in keys {
                    for start in s.windows.keys() {
                        timers.insert((start + size, *kg, *k));
                    }
                }
            }
        }
        Ok(Join {
            window,
            max_parallelism,
            groups,
            timers,
            arrivals: WindowArrivals::default(),
        })
    }

    /// The key group `rec`'s state lives in (of its person, [`key_person`], the routing's
    /// key; what [`Join::add_in`] wants).
    pub fn key_group_of(&self, rec: &Record) -> u32 {
        key_group(key_person(rec), self.max_parallelism)
    }

    /// Adds a person or auction given the input watermark, appending regular-join results to
    /// `out`. Returns false if the record was late (windowed join only; dropped).
    pub fn add(&mut self, rec: &Record, wm: Option<u64>, out: &mut Vec<Record>) -> bool {
        self.add_in(rec, self.key_group_of(rec), wm, out)
    }

    /// [`Join::add`] of a record whose key group `kg` the caller has computed
    /// ([`Join::key_group_of`]; the subtask counts its records per key group with it).
    pub fn add_in(
        &mut self,
        rec: &Record,
        kg: u32,
        wm: Option<u64>,
        out: &mut Vec<Record>,
    ) -> bool {
        debug_assert_eq!(kg, self.key_group_of(rec));
        let Payload::Event(event) = &rec.payload else {
            return true;
        };
        let key = key_person(rec);
        let ts = event.timestamp();
        match self.window {
            None => {
                let s = self.groups.entry(kg).or_default().entry(key).or_default();
                match event.as_ref() {
                    Event::Person(p) => {
                        let person = PersonSide {
                            id: p.id as u64,
                            name: p.name.clone(),
                            city: p.city.clone(),
                            state: p.state.clone(),
                            ts,
                        };
                        for a in &s.auctions {
                            out.push(q3_row(&person, *a, rec.created_us));
                        }
                        s.persons.push(person);
                    }
                    Event::Auction(a) => {
                        let auction = AuctionSide {
                            id: a.id as u64,
                            ts,
                        };
                        for p in &s.persons {
                            out.push(q3_row(p, auction, rec.created_us));
                        }
                        s.auctions.push(auction);
                    }
                    Event::Bid(_) => {}
                }
                true
            }
            Some(JoinWindow::Tumbling(size)) => {
                let start = ts - ts % size;
                if wm.is_some_and(|wm| start + size - 1 <= wm) {
                    return false;
                }
                let s = self.groups.entry(kg).or_default().entry(key).or_default();
                let w = s.windows.entry(start).or_default();
                match event.as_ref() {
                    Event::Person(p) => {
                        let person = (p.id as u64, p.name.clone());
                        if !w.persons.contains(&person) {
                            w.persons.push(person);
                        }
                    }
                    Event::Auction(_) => w.auctions += 1,
                    Event::Bid(_) => {}
                }
                self.timers.insert((start + size, kg, key));
                self.arrivals.note(start + size, rec.created_us);
                true
            }
        }
    }

    /// Windowed join: fires every window with end − 1 ≤ `wm`, its rows stamped with the
    /// wall-clock time the window ended ([`WindowArrivals::stamp`]).
    pub fn fire(&mut self, wm: u64, out: &mut Vec<Record>) {
        let Some(JoinWindow::Tumbling(size)) = self.window else {
            return;
        };
        let now = crate::clock::now_unix_us();
        while let Some(&(end, kg, key)) = self.timers.first() {
            if end - 1 > wm {
                break;
            }
            self.timers.pop_first();
            let Some(keys) = self.groups.get_mut(&kg) else {
                continue;
            };
            let Some(s) = keys.get_mut(&key) else {
                continue;
            };
            let start = end - size;
            if let Some(w) = s.windows.remove(&start)
                && w.auctions > 0
            {
                for (id, name) in w.persons {
                    let row = Row::new(
                        end - 1,
                        vec![
                            ("id", Value::Int(id as i64)),
                            ("name", Value::Str(name)),
                            ("windowStart", Value::Int(start as i64)),
                            ("windowEnd", Value::Int(end as i64)),
                        ],
                    );
                    out.push(Record {
                        seq: id,
                        key: id,
                        value: 0,
                        count: 1,
                        created_us: self.arrivals.stamp(end, now),
                        payload: Payload::Row(Arc::new(row)),
                    });
                }
            }
            if s.windows.is_empty() {
                keys.remove(&key);
                if keys.is_empty() {
                    self.groups.remove(&kg);
                }
            }
        }
        self.arrivals.forget_through(wm.saturating_add(1));
    }

    /// The join state by key group, for a savepoint.
    ///
    /// # Errors
    /// [`StateCodecError`] when a key group cannot be encoded.
    pub fn snapshot(&self) -> Result<KeyedState, StateCodecError> {
        encode_groups(&self.groups)
    }
}

fn q3_row(p: &PersonSide, a: AuctionSide, created_us: u64) -> Record {
    let row = Row::new(
        p.ts.max(a.ts),
        vec![
            ("name", Value::Str(p.name.clone())),
            ("city", Value::Str(p.city.clone())),
            ("state", Value::Str(p.state.clone())),
            ("id", Value::Int(a.id as i64)),
        ],
    );
    Record {
        seq: a.id,
        key: p.id,
        value: 0,
        count: 1,
        created_us,
        payload: Payload::Row(Arc::new(row)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use nexmark::event::{Auction, Person};

    fn person(id: usize, ts: u64, created_us: u64) -> Record {
        let p = Person {
            id,
            name: format!("p{id}"),
            email_address: String::new(),
            credit_card: String::new(),
            city: String::new(),
            state: "OR".into(),
            date_time: ts,
            extra: String::new(),
        };
        Record {
            seq: 0,
            key: id as u64,
            value: 0,
            count: 1,
            created_us,
            payload: Payload::Event(Arc::new(Event::Person(p))),
        }
    }

    fn auction(id: usize, seller: usize, ts: u64, created_us: u64) -> Record {
        let a = Auction {
            id,
            item_name: String::new(),
            description: String::new(),
            initial_bid: 1,
            reserve: 1,
            date_time: ts,
            expires: ts + 1_000,
            seller,
            category: 10,
            extra: String::new(),
        };
        Record {
            seq: 0,
            key: seller as u64,
            value: 0,
            count: 1,
            created_us,
            payload: Payload::Event(Arc::new(Event::Auction(a))),
        }
    }

    #[test]
    fn windowed_join_rows_are_stamped_when_their_window_ended() {
        // The old code stamped them with the firing time.
        let mut j =
            Join::restore(Some(JoinWindow::Tumbling(10)), 8, &KeyedState::default()).unwrap();
        let t0 = 1_700_000_000_000_000;
        let mut out = Vec::new();
        assert!(j.add(&person(7, 1, t0 + 1_000), None, &mut out));
        assert!(j.add(&auction(1, 7, 6, t0 + 6_000), None, &mut out));
        assert!(j.add(&person(8, 4, t0 + 9_000), None, &mut out));
        assert!(
            out.is_empty(),
            "a windowed join emits when the window fires"
        );
        j.fire(9, &mut out);
        let got: Vec<(u64, u64)> = out.iter().map(|r| (r.key, r.created_us)).collect();
        // Person 8 has no auction in the window; person 7's row carries the window's latest
        // arrival (person 8's, the last record of the window at this subtask).
        assert_eq!(got, vec![(7, t0 + 9_000)]);
        assert!(j.arrivals.is_empty());
    }
}
