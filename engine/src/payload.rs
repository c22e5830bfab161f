//! What a [`Record`](crate::record::Record) carries besides its key and counters: a Nexmark
//! event, a query's output row, or a watermark.
//!
//! Payloads are reference-counted so that fanning a record out to several downstream
//! operators copies a pointer, not the event.

use std::sync::Arc;

use nexmark::event::Event;

/// The payload of a record.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Payload {
    /// No payload: the synthetic keyed records of plain `source` operators.
    #[default]
    None,
    /// A Nexmark event (Person, Auction or Bid) from a Nexmark source.
    Event(Arc<Event>),
    /// A query's output row.
    Row(Arc<Row>),
    /// A watermark: no record with event time ≤ `ms` follows on this channel.
    Watermark(Watermark),
    /// A record read from a Kafka topic.
    Kafka(Arc<KafkaRecord>),
}

/// One record of a Kafka topic, as a Kafka source read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    /// The record's key (`None`: no key).
    pub key: Option<Vec<u8>>,
    /// The value bytes (`None`: a tombstone).
    pub value: Option<Vec<u8>>,
    /// The Kafka timestamp, ms since the Unix epoch (`None` when the record has none).
    pub timestamp_ms: Option<i64>,
    /// The partition it was read from.
    pub partition: i32,
    /// Its offset in that partition.
    pub offset: i64,
}

/// A watermark message, sent in-band on every output channel of a subtask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    /// The sending subtask's job-wide channel number (see `runtime`'s subtask numbering);
    /// the receiver keeps the largest watermark per channel and takes the minimum over them.
    pub channel: u32,
    /// Event time in ms since the Unix epoch: every later record on this channel has an
    /// event time greater than `ms`.
    pub ms: u64,
    /// The sender is idle (Flink's `WatermarkStatus.IDLE`; `ms` is unused): receivers leave
    /// the channel out of their minimum until its next watermark.
    pub idle: bool,
}

/// One output row of a query: an event time and named fields.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// Event time of the row, ms since the Unix epoch (window results: the window's end − 1,
    /// as in Flink).
    pub ts_ms: u64,
    /// Named fields, in output order.
    pub fields: Vec<(&'static str, Value)>,
}

/// A field value of a [`Row`].
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// A signed integer.
    Int(i64),
    /// A floating-point number.
    Float(f64),
    /// A string.
    Str(String),
    /// An unsigned integer (a 64-bit key hash).
    UInt(u64),
    /// No value (JSON `null`).
    Null,
}

impl Row {
    /// A row at event time `ts_ms` with `fields`.
    pub fn new(ts_ms: u64, fields: Vec<(&'static str, Value)>) -> Row {
        Row { ts_ms, fields }
    }

    /// The integer field `name`, if present and an integer (an unsigned one as its bits).
    pub fn int(&self, name: &str) -> Option<i64> {
        self.fields.iter().find_map(|(k, v)| match v {
            Value::Int(i) if *k == name => Some(*i),
            Value::UInt(u) if *k == name => Some(*u as i64),
            _ => None,
        })
    }

    /// The row as one JSON object (`{"field": value, ...}`), fields in order.
    pub fn to_json(&self) -> serde_json::Value {
        let map = self
            .fields
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::Int(i) => serde_json::Value::from(*i),
                    Value::Float(f) => serde_json::Value::from(*f),
                    Value::Str(s) => serde_json::Value::from(s.as_str()),
                    Value::UInt(u) => serde_json::Value::from(*u),
                    Value::Null => serde_json::Value::Null,
                };
                (k.to_string(), v)
            })
            .collect();
        serde_json::Value::Object(map)
    }
}

impl Payload {
    /// Whether this is a watermark rather than a data record.
    pub fn is_watermark(&self) -> bool {
        matches!(self, Payload::Watermark(_))
    }

    /// Event time in ms since the Unix epoch, for events and rows.
    pub fn event_time_ms(&self) -> Option<u64> {
        match self {
            Payload::Event(e) => Some(e.timestamp()),
            Payload::Row(r) => Some(r.ts_ms),
            Payload::Kafka(k) => k.timestamp_ms.and_then(|t| u64::try_from(t).ok()),
            Payload::None | Payload::Watermark(_) => None,
        }
    }

    /// One JSON line for a file sink (events as `{"person"|"auction"|"bid": {...}}`, rows as
    /// their fields), or `None` for payloads a sink does not write as JSON.
    pub fn to_json(&self) -> Option<serde_json::Value> {
        match self {
            Payload::Row(r) => Some(r.to_json()),
            Payload::Event(e) => Some(event_json(e)),
            Payload::Kafka(k) => Some(kafka_json(k)),
            Payload::None | Payload::Watermark(_) => None,
        }
    }
}

/// A Kafka record as JSON: its value when that is JSON, else the value as a string, under
/// `value`, with `key`, `partition`, `offset` and `timestamp`.
fn kafka_json(k: &KafkaRecord) -> serde_json::Value {
    let text = |b: &Option<Vec<u8>>| {
        b.as_deref()
            .map(|b| serde_json::Value::from(String::from_utf8_lossy(b).into_owned()))
            .unwrap_or(serde_json::Value::Null)
    };
    let value = k
        .value
        .as_deref()
        .and_then(|v| serde_json::from_slice(v).ok())
        .unwrap_or_else(|| text(&k.value));
    serde_json::json!({"key": text(&k.key), "value": value, "partition": k.partition,
        "offset": k.offset, "timestamp": k.timestamp_ms})
}

fn event_json(e: &Event) -> serde_json::Value {
    match e {
        Event::Person(p) => serde_json::json!({"person": {
            "id": p.id, "name": p.name, "emailAddress": p.email_address,
            "creditCard": p.credit_card, "city": p.city, "state": p.state,
            "dateTime": p.date_time}}),
        Event::Auction(a) => serde_json::json!({"auction": {
            "id": a.id, "itemName": a.item_name, "initialBid": a.initial_bid,
            "reserve": a.reserve, "dateTime": a.date_time, "expires": a.expires,
            "seller": a.seller, "category": a.category}}),
        Event::Bid(b) => serde_json::json!({"bid": {
            "auction": b.auction, "bidder": b.bidder, "price": b.price,
            "channel": b.channel, "url": b.url, "dateTime": b.date_time}}),
    }
}
