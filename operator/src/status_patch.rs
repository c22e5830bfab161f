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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// RFC 7386's apply, to check a patch against what the API server does with it.
    fn apply(target: &Value, patch: &Value) -> Value {
        match patch {
            Value::Object(p) => {
                let mut t = match target {
                    Value::Object(t) => t.clone(),
                    _ => Map::new(),
                };
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        let merged = apply(t.get(k).unwrap_or(&Value::Null), v);
                        t.insert(k.clone(), merged);
                    }
                }
                Value::Object(t)
            }
            _ => patch.clone(),
        }
    }

    #[test]
    fn removed_keys_are_nulled_at_any_depth() {
        let old = json!({"currentParallelism": {"source": 1, "enrich": 2, "sink": 1},
                         "recoveredFrom": "/chk/41", "conditions": [{"type": "Ready"}]});
        let new = json!({"currentParallelism": {"source": 1, "sink": 2}, "conditions": []});
        let patch = merge_patch(&old, &new);
        assert_eq!(patch["currentParallelism"]["enrich"], Value::Null);
        assert_eq!(patch["recoveredFrom"], Value::Null);
        assert_eq!(apply(&old, &patch), new);
        // Nothing to clear: the patch is the new status.
        assert_eq!(merge_patch(&Value::Null, &new), new);
    }
}
