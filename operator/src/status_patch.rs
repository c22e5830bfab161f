//! The status written as a JSON merge patch (RFC 7386) that says what was cleared: a merge
//! patch keeps every field and map key it leaves out, so a field set to `None` or a map key
//! removed (an operator an edited job no longer has) must be written as `null`. Pure.

use serde_json::{Map, Value};

/// A merge patch that turns `old` (the status as last read) into `new`: `new`, with `null`
/// for every object key of `old` that `new` lacks, at any depth. Arrays are replaced whole,
/// as a merge patch replaces them.
pub fn merge_patch(old: &Value, new: &Value) -> Value {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = Map::new();
            for (k, nv) in n {
                let v = match o.get(k) {
                    Some(ov) => merge_patch(ov, nv),
                    None => nv.clone(),
                };
                patch.insert(k.clone(), v);
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

/// The body of a status write that turns `read` (the status as last read, `None` without one)
/// into `new`: `{"status": merge_patch(read, new)}`.
///
/// # Errors
/// When `new` cannot be serialized.
pub fn status_write<S: serde::Serialize>(
    read: Option<&S>,
    new: &S,
) -> Result<Value, serde_json::Error> {
    let new = serde_json::to_value(new)?;
    let read = read.map_or(Ok(Value::Null), serde_json::to_value)?;
    Ok(serde_json::json!({ "status": merge_patch(&read, &new) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn removed_keys_are_nulled_at_any_depth() {
        let old = json!({"currentParallelism": {"source": 1, "enrich": 2, "sink": 1},
                         "recoveredFrom": "/chk/41", "conditions": [{"type": "Ready"}]});
        let new = json!({"currentParallelism": {"source": 1, "sink": 2}, "conditions": []});
        let patch = merge_patch(&old, &new);
        assert_eq!(patch["currentParallelism"]["enrich"], Value::Null);
        assert_eq!(patch["recoveredFrom"], Value::Null);
        // What the API server makes of it (RFC 7386's apply).
        let mut applied = old.clone();
        json_patch::merge(&mut applied, &patch);
        assert_eq!(applied, new);
        // Nothing to clear: the patch is the new status.
        assert_eq!(merge_patch(&Value::Null, &new), new);
    }
}
