//! [`Record`]: what flows between operators.

use crate::payload::Payload;

/// A record flowing between operators.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    /// Sequence number at the source (window outputs: the key).
    pub seq: u64,
    /// Key.
    pub key: u64,
    /// Value (window outputs: the pane's sum).
    pub value: i64,
    /// Source records this record stands for (1, or a window pane's count).
    pub count: u64,
    /// Arrival time at the source, µs since the Unix epoch, from which the sink measures
    /// end-to-end latency. Window outputs carry the firing time minus the largest delay any
    /// of their records had on reaching the window, so latency excludes window buffering.
    pub created_us: u64,
    /// A Nexmark event, a query row or a watermark ([`Payload::None`] for plain sources).
    pub payload: Payload,
}
