//! Stateless Nexmark stages (`kind: select`) and the key selectors of the event-time operators.
//!
//! Queries (Nexmark's definitions as in Flink's `nexmark` benchmark):
//! - `q1` — currency conversion: every bid as `{auction, bidder, price, dateTime}` with
//!   `price = 0.908 · bid.price` (dollars to euros);
//! - `q2` — selection: bids with `auction mod 123 = 0` as `{auction, price}`;
//! - `q3Persons` / `q3Auctions` — Q3's selections before its join: persons in the states
//!   `OR`, `ID` or `CA` (case-insensitive; the generator writes them lower-case), and
//!   auctions of category 10;
//! - `bids`, `persons`, `auctions` — one event type, unchanged.

use std::sync::Arc;

use nexmark::event::Event;
use serde::{Deserialize, Serialize};

use crate::payload::{Payload, Row, Value};
use crate::record::Record;
use crate::spec::OperatorKind;

/// Conversion factor of Nexmark Q1 (dollars to euros).
pub const Q1_EURO_PER_DOLLAR: f64 = 0.908;
/// Nexmark Q2 keeps bids whose auction id is a multiple of this.
pub const Q2_AUCTION_MODULUS: u64 = 123;
/// Nexmark Q3 keeps auctions of this category.
pub const Q3_CATEGORY: u64 = 10;
/// Nexmark Q3 keeps persons from these states.
pub const Q3_STATES: [&str; 3] = ["or", "id", "ca"];

/// A stateless stage over Nexmark events.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SelectQuery {
    /// Bid events only.
    Bids,
    /// Person events only.
    Persons,
    /// Auction events only.
    Auctions,
    /// Nexmark Q1: bids with the price converted to euros.
    Q1,
    /// Nexmark Q2: bids on auctions whose id is a multiple of 123.
    Q2,
    /// Nexmark Q3's person side: persons in OR, ID or CA.
    Q3Persons,
    /// Nexmark Q3's auction side: auctions of category 10.
    Q3Auctions,
}

impl SelectQuery {
    /// The stage's output for `rec`, or `None` when the record is filtered out (records
    /// without a Nexmark event are filtered out too).
    pub fn apply(self, mut rec: Record) -> Option<Record> {
        let Payload::Event(event) = &rec.payload else {
            return None;
        };
        let keep = match (self, event.as_ref()) {
            (SelectQuery::Bids, Event::Bid(_))
            | (SelectQuery::Persons, Event::Person(_))
            | (SelectQuery::Auctions, Event::Auction(_)) => true,
            (SelectQuery::Q3Persons, Event::Person(p)) => {
                Q3_STATES.iter().any(|s| p.state.eq_ignore_ascii_case(s))
            }
            (SelectQuery::Q3Auctions, Event::Auction(a)) => a.category as u64 == Q3_CATEGORY,
            (SelectQuery::Q1, Event::Bid(b)) => {
                let row = Row::new(
                    b.date_time,
                    vec![
                        ("auction", Value::Int(b.auction as i64)),
                        ("bidder", Value::Int(b.bidder as i64)),
                        ("price", Value::Float(Q1_EURO_PER_DOLLAR * b.price as f64)),
                        ("dateTime", Value::Int(b.date_time as i64)),
                    ],
                );
                rec.payload = Payload::Row(Arc::new(row));
                true
            }
            (SelectQuery::Q2, Event::Bid(b))
                if (b.auction as u64).is_multiple_of(Q2_AUCTION_MODULUS) =>
            {
                let row = Row::new(
                    b.date_time,
                    vec![
                        ("auction", Value::Int(b.auction as i64)),
                        ("price", Value::Int(b.price as i64)),
                    ],
                );
                rec.payload = Payload::Row(Arc::new(row));
                true
            }
            _ => false,
        };
        keep.then_some(rec)
    }
}

/// The field a keyed event-time operator partitions Nexmark bids by.
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum BidKey {
    /// `bid.auction` (Q5).
    Auction,
    /// `bid.bidder` (Q11).
    Bidder,
    /// The record's key (a Kafka source's `keyBy` field or Kafka key, hashed).
    Key,
}

impl BidKey {
    /// The field's name in output rows.
    pub fn field(self) -> &'static str {
        match self {
            BidKey::Auction => "auction",
            BidKey::Bidder => "bidder",
            BidKey::Key => "key",
        }
    }
}

/// A bid's auction (or, for other records, the record's key).
pub fn key_bid_auction(rec: &Record) -> u64 {
    match &rec.payload {
        Payload::Event(e) => match e.as_ref() {
            Event::Bid(b) => b.auction as u64,
            _ => rec.key,
        },
        _ => rec.key,
    }
}

/// A bid's bidder (or, for other records, the record's key).
pub fn key_bid_bidder(rec: &Record) -> u64 {
    match &rec.payload {
        Payload::Event(e) => match e.as_ref() {
            Event::Bid(b) => b.bidder as u64,
            _ => rec.key,
        },
        _ => rec.key,
    }
}

/// The person a record is about: a person's id, an auction's seller (the join key of Q3/Q8).
pub fn key_person(rec: &Record) -> u64 {
    match &rec.payload {
        Payload::Event(e) => match e.as_ref() {
            Event::Person(p) => p.id as u64,
            Event::Auction(a) => a.seller as u64,
            Event::Bid(b) => b.bidder as u64,
        },
        _ => rec.key,
    }
}

/// A window result's window (its event time, the window's end − 1): the key of `windowTop`.
pub fn key_window(rec: &Record) -> u64 {
    rec.payload.event_time_ms().unwrap_or(rec.key)
}

/// The record's key as set by its producer.
pub fn key_record(rec: &Record) -> u64 {
    rec.key
}

/// The record's sequence number: spreads records of a non-keyed stage over its subtasks.
pub fn key_rebalance(rec: &Record) -> u64 {
    rec.seq
}

/// The key that partitions the input of an operator of kind `kind` among its subtasks.
pub(crate) fn key_selector(kind: &OperatorKind) -> fn(&Record) -> u64 {
    match kind {
        OperatorKind::EventWindow {
            key: BidKey::Auction,
            ..
        } => key_bid_auction,
        OperatorKind::EventWindow {
            key: BidKey::Bidder,
            ..
        } => key_bid_bidder,
        OperatorKind::EventWindow {
            key: BidKey::Key, ..
        } => key_record,
        OperatorKind::WindowTop { .. } => key_window,
        OperatorKind::Join { .. } => key_person,
        _ => key_record,
    }
}
