//! Serde helper for `f64` values that may be infinite (an unstable queue's sojourn time).
//!
//! JSON has no infinity; `serde_json` would write `null` and fail to read it back. Finite
//! values are written as numbers, infinities as the strings `"inf"` / `"-inf"`, NaN as `"nan"`.

use serde::{Deserialize, Deserializer, Serializer};

pub(crate) fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.is_finite() {
        s.serialize_f64(*v)
    } else if v.is_nan() {
        s.serialize_str("nan")
    } else if *v > 0.0 {
        s.serialize_str("inf")
    } else {
        s.serialize_str("-inf")
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrStr {
    Num(f64),
    Str(String),
}

pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    match NumOrStr::deserialize(d)? {
        NumOrStr::Num(v) => Ok(v),
        NumOrStr::Str(s) => match s.as_str() {
            "inf" | "infinity" | "Infinity" => Ok(f64::INFINITY),
            "-inf" | "-infinity" | "-Infinity" => Ok(f64::NEG_INFINITY),
            "nan" | "NaN" => Ok(f64::NAN),
            other => Err(serde::de::Error::custom(format!(
                "expected a number or \"inf\", got \"{other}\""
            ))),
        },
    }
}
