//! The wall clock records are stamped on.

use std::time::{SystemTime, UNIX_EPOCH};

/// Microseconds since the Unix epoch (0 for a clock before it): the wall clock that records'
/// creation times and window results' stamps are read on.
pub(crate) fn now_unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_unix_ms() -> u64 {
    now_unix_us() / 1000
}
