//! The aggregates a keyed `window` computes per key and window (`aggregates:` in the job
//! file) and the JSON result row it writes with them.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::payload::{Payload, Row, Value};
use crate::record::Record;
use crate::state::KeyState;

/// One aggregate of a window's values (a Kafka source's `valueField`, a synthetic source's
/// record values).
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Aggregate {
    /// Records in the window.
    Count,
    /// Sum of their values.
    Sum,
    /// Smallest value.
    Min,
    /// Largest value.
    Max,
}

impl Aggregate {
    /// The name in the job file and the result's field name.
    pub fn name(self) -> &'static str {
        match self {
            Aggregate::Count => "count",
            Aggregate::Sum => "sum",
            Aggregate::Min => "min",
            Aggregate::Max => "max",
        }
    }

    /// Whether this aggregate reads the records' values (all but `count`).
    pub fn reads_values(self) -> bool {
        self != Aggregate::Count
    }
}

/// Checks a window's `aggregates` list (`at`: its field, e.g.
/// `operators[1] (counts).aggregates`): not empty, nothing twice.
///
/// # Errors
/// A message naming the field and the offending entry.
pub fn validate(at: &str, list: &[Aggregate]) -> Result<(), String> {
    if list.is_empty() {
        return Err(format!(
            "{at}: must list at least one of count, sum, min, max"
        ));
    }
    for (i, a) in list.iter().enumerate() {
        if list[..i].contains(a) {
            return Err(format!("{at}[{i}]: `{}` is listed twice", a.name()));
        }
    }
    Ok(())
}

/// The result record of `key`'s fired pane `s` with `aggregates`: a row
/// `{"key": K, <aggregate>: value, ...}` (`min`/`max` are `null` when the
/// pane's extrema are unknown, [`KeyState::pane_extrema_partial`]) at event time
/// `window_end_ms − 1`, carrying the pane's count and sum as the record's `count` and `value`
/// (what sinks account), stamped `created_us`.
pub fn result_record(
    aggregates: &[Aggregate],
    key: u64,
    s: &KeyState,
    window_end_ms: u64,
    created_us: u64,
) -> Record {
    let extrema = s.pane_extrema();
    let mut fields = Vec::with_capacity(aggregates.len() + 1);
    fields.push(("key", Value::UInt(key)));
    for a in aggregates {
        let v = match a {
            Aggregate::Count => Value::UInt(s.pane_count),
            Aggregate::Sum => Value::Int(s.pane_sum),
            Aggregate::Min => extrema.map_or(Value::Null, |(min, _)| Value::Int(min)),
            Aggregate::Max => extrema.map_or(Value::Null, |(_, max)| Value::Int(max)),
        };
        fields.push((a.name(), v));
    }
    Record {
        seq: key,
        key,
        value: s.pane_sum,
        count: s.pane_count,
        created_us,
        payload: Payload::Row(Arc::new(Row::new(window_end_ms.saturating_sub(1), fields))),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_row_lists_the_aggregates_in_order_and_unknown_extrema_as_null() {
        let mut s = KeyState::default();
        for v in [7, -2, 30] {
            s.add(1, v, 0);
        }
        let all = [
            Aggregate::Max,
            Aggregate::Count,
            Aggregate::Min,
            Aggregate::Sum,
        ];
        let r = result_record(&all, u64::MAX, &s, 2000, 5);
        assert_eq!(
            (r.count, r.value, r.key, r.created_us),
            (3, 35, u64::MAX, 5)
        );
        assert_eq!(
            r.payload.to_json().unwrap(),
            serde_json::json!({"key": u64::MAX, "max": 30, "count": 3, "min": -2, "sum": 35})
        );
        assert_eq!(r.payload.event_time_ms(), Some(1999));
        s.pane_extrema_partial = true;
        let r = result_record(&[Aggregate::Min, Aggregate::Max], 1, &s, 2000, 5);
        assert_eq!(
            r.payload.to_json().unwrap(),
            serde_json::json!({"key": 1, "min": null, "max": null})
        );
    }

    #[test]
    fn a_list_must_be_non_empty_without_repeats() {
        let at = "operators[1] (w).aggregates";
        assert_eq!(
            validate(at, &[]).unwrap_err(),
            "operators[1] (w).aggregates: must list at least one of count, sum, min, max"
        );
        assert_eq!(
            validate(at, &[Aggregate::Min, Aggregate::Max, Aggregate::Min]).unwrap_err(),
            "operators[1] (w).aggregates[2]: `min` is listed twice"
        );
        assert!(validate(at, &[Aggregate::Count, Aggregate::Max]).is_ok());
    }
}
