//! Checks of sources and sinks: Kafka endpoints, security and fields, and generated sources'
//! rates.

use super::*;

/// A Kafka client's `security` that this build can use ([`crate::kafka::security`]).
pub(super) fn validate_kafka_security(
    at: &str,
    security: Option<&crate::kafka::security::KafkaSecurity>,
) -> Result<(), String> {
    match security {
        Some(s) => s
            .validate(
                &format!("{at}.security"),
                &crate::kafka::security::builtin_features(),
            )
            .map_err(|e| e.to_string()),
        None => Ok(()),
    }
}

/// A Kafka `topic` and `bootstrapServers` that can be used: a legal topic name (1 to 249 of
/// letters, digits, `.`, `_`, `-`) and a non-empty `host:port[,host:port...]` list.
pub(super) fn validate_kafka_endpoint(at: &str, topic: &str, servers: &str) -> Result<(), String> {
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if topic.is_empty()
        || topic.len() > 249
        || !topic.chars().all(legal)
        || topic == "."
        || topic == ".."
    {
        return Err(format!(
            "{at}.topic: `{topic}` is not a Kafka topic name (1 to 249 letters, digits, `.`, `_`, `-`)"
        ));
    }
    let bad = servers.split(',').map(str::trim).find(|s| {
        s.rsplit_once(':')
            .is_none_or(|(h, p)| h.is_empty() || p.parse::<u16>().is_err())
    });
    if let Some(b) = bad {
        return Err(format!(
            "{at}.bootstrapServers: `{b}` is not host:port (write e.g. \"127.0.0.1:9092\", several separated by commas)"
        ));
    }
    Ok(())
}

pub(super) fn validate_rate(at: &str, rate: &RateSpec) -> Result<(), String> {
    let ok_rate = |r: f64| r >= 0.0 && r.is_finite();
    match rate {
        RateSpec::Constant(r) if !ok_rate(*r) => Err(format!(
            "{at}.rate.constant: {r} must be a finite, non-negative number of records/s"
        )),
        RateSpec::Steps(steps) => {
            if steps.is_empty() {
                return Err(format!("{at}.rate.steps: needs at least one step"));
            }
            let mut last = f64::NEG_INFINITY;
            for (j, s) in steps.iter().enumerate() {
                if !ok_rate(s.records_per_second) {
                    return Err(format!(
                        "{at}.rate.steps[{j}].recordsPerSecond: {} must be a finite, non-negative number of records/s",
                        s.records_per_second
                    ));
                }
                if !(s.at_seconds.is_finite() && s.at_seconds >= 0.0 && s.at_seconds > last) {
                    return Err(format!(
                        "{at}.rate.steps[{j}].atSeconds: {} must be finite, >= 0 and increasing",
                        s.at_seconds
                    ));
                }
                last = s.at_seconds;
            }
            Ok(())
        }
        RateSpec::Trace(t) => {
            if !(t.scale > 0.0 && t.scale.is_finite()) {
                return Err(format!(
                    "{at}.rate.trace.scale: {} must be a finite, positive number",
                    t.scale
                ));
            }
            if !(t.speedup > 0.0 && t.speedup.is_finite()) {
                return Err(format!(
                    "{at}.rate.trace.speedup: {} must be a finite, positive number",
                    t.speedup
                ));
            }
            if t.scale > crate::spec::MAX_TRACE_SCALE || t.speedup > crate::spec::MAX_TRACE_SPEEDUP
            {
                let (field, v, max) = if t.scale > crate::spec::MAX_TRACE_SCALE {
                    ("scale", t.scale, crate::spec::MAX_TRACE_SCALE)
                } else {
                    ("speedup", t.speedup, crate::spec::MAX_TRACE_SPEEDUP)
                };
                return Err(format!(
                    "{at}.rate.trace.{field}: {v:e} is above the limit {max:e}"
                ));
            }
            if !(t.start_seconds >= 0.0 && t.start_seconds.is_finite()) {
                return Err(format!(
                    "{at}.rate.trace.startSeconds: {} must be a finite, non-negative number of seconds",
                    t.start_seconds
                ));
            }
            if let Some(end) = t.end_seconds
                && end <= t.start_seconds
            {
                return Err(format!(
                    "{at}.rate.trace.endSeconds: {end} must be after startSeconds {}",
                    t.start_seconds
                ));
            }
            if !t.file.is_file() {
                return Err(format!(
                    "{at}.rate.trace.file: trace file {} {}",
                    t.file.display(),
                    if t.file.is_dir() {
                        "is a directory, not a trace CSV"
                    } else {
                        "does not exist"
                    }
                ));
            }
            // A start at or past the trace's last row would replay nothing.
            if let Ok(trace) = crate::trace::Trace::from_file(&t.file)
                && t.start_seconds >= trace.end()
            {
                return Err(format!(
                    "{at}.rate.trace.startSeconds: {} is at or past the end of trace {} ({} s)",
                    t.start_seconds,
                    t.file.display(),
                    trace.end()
                ));
            }
            Ok(())
        }
        RateSpec::Constant(_) => Ok(()),
    }
}

/// A Kafka source's `schema`, `keyBy` and `valueField` (`at`: `operators[i] (name).kafka`):
/// well-formed paths, and with a schema, fields of it (`valueField` numeric).
pub(super) fn validate_kafka_fields(
    at: &str,
    k: &crate::kafka::KafkaSourceSpec,
) -> Result<(), String> {
    use crate::json_field::check_path;
    if let Some(schema) = &k.schema {
        schema.validate().map_err(|e| format!("{at}.schema.{e}"))?;
    }
    if let Some(f) = k.key_field() {
        check_path(f).map_err(|e| format!("{at}.keyBy: {e} (or `kafkaKey`)"))?;
        if let Some(schema) = &k.schema {
            schema.field(f).map_err(|e| format!("{at}.keyBy: {e}"))?;
        }
    }
    if let Some(f) = &k.value_field {
        check_path(f).map_err(|e| format!("{at}.valueField: {e}"))?;
        if let Some(schema) = &k.schema {
            let t = schema
                .field(f)
                .map_err(|e| format!("{at}.valueField: {e}"))?;
            if !t.is_numeric() {
                return Err(format!(
                    "{at}.valueField: field `{f}` is {} in schema `{}`; windows aggregate a numeric (int or float) field",
                    t.name(),
                    schema.name
                ));
            }
        }
    }
    Ok(())
}
